#!/usr/bin/env bash
# Runs on the GPU machine, from the repository root, what scripts/gpu_build.sh built:
#   scripts/gpu_run.sh tests [FILTER...]
#                                 the GPU tests (every op against the CPU, the >4 GiB pool,
#                                 the whole model, EAGLE-3 heads, NCCL from PyTorch's wheel;
#                                 SmolLM2 too if /tmp/smollm2 exists), those whose names
#                                 hold a FILTER if any
#   scripts/gpu_run.sh bench      bench latency on the Llama-3.2-1B and Llama-3-8B shapes
#                                 (random weights): eager (--enforce-eager) and through CUDA
#                                 graphs, with and without --deterministic
#   scripts/gpu_run.sh graphs     bench latency eager and through CUDA graphs: SmolLM2-135M
#                                 (after smollm2) and the Llama-3.2-1B shape
#   scripts/gpu_run.sh pdl        bench latency on the Llama-3.2-1B shape, eager and through
#                                 graphs, each with and without programmatic dependent launch
#   scripts/gpu_run.sh hf         the same shapes through Hugging Face transformers (eager)
#   scripts/gpu_run.sh attnprof   decode attention at batch 64 after 128 tokens and batch 1 / 8
#                                 after 32,000 (Llama-3.2-1B shape): bench latency, then
#                                 Nsight Compute's sections of the split and combine kernels
#   scripts/gpu_run.sh splitbench scripts/split_attention_bench.cu (built here with nvcc): the
#                                 decode attention's split kernel and combine alone, each
#                                 bucket, at the 1B and 8B shapes' batch 64 and 128 after
#                                 128 tokens, 1 and 16 after 4,000, 1 and 8 after 32,000;
#                                 one build per register budget of SPLIT_VARIANTS (sets of
#                                 -D flags separated by `;`, the first "" the defaults)
#   scripts/gpu_run.sh profile    Nsight Compute kernel times of batch-1 decode steps on the
#                                 Llama-3.2-1B shape (cuBLAS and the GEMV kernel), summed
#                                 per step by scripts/ncu_step_summary.py
#   scripts/gpu_run.sh spec       bench spec (n-gram speculation against none) on SmolLM2-135M
#                                 (after smollm2), default and --deterministic; and the
#                                 draft_model method with the draft on the GPU
#   scripts/gpu_run.sh eagle3     bench spec with a random EAGLE-3 head for SmolLM2-135M (after
#                                 smollm2; scripts/random_eagle3_head.py) drafting beside it
#                                 on the GPU: the path and its cost, since its drafts are
#                                 random; through graphs and eagerly, and --deterministic
#   scripts/gpu_run.sh ab         bench latency of a base build (scripts/gpu_build.sh at the
#                                 base commit, its target/gpu-carry/peregrine.gz moved to
#                                 target/gpu-carry-base/) and of this one, in turns on the
#                                 same machine: the Llama-3.2-1B shape and SmolLM2-135M
#                                 (after smollm2, else its shape with random weights),
#                                 eager and through graphs; AB_ROUNDS rounds (default 2);
#                                 AB_BASES names other base folders (default
#                                 target/gpu-carry-base), AB_RUNS "graphs", "eager" or both
#                                 (the default)
#   scripts/gpu_run.sh headcost   a drafting round's parts (the head's steps traced) with the
#                                 shipped EAGLE-3 head beside a random SmolLM2-135M shape,
#                                 batch 1 and 8, K = 3 (carry target/tokenizer);
#                                 HEADCOST_ROUNDS rounds (default 2)
#   scripts/gpu_run.sh verify     the cost of a verification step (4 rows a sequence: K = 3)
#                                 against a decode step, `bench latency --verify-rows 4` at
#                                 batch 1 and 8 on the SmolLM2-135M and Llama-3.2-1B shapes
#                                 (random weights), products by cuBLAS from 2 rows and by
#                                 the GEMV kernel up to 8; with a base build (as in `ab`)
#                                 first where one is carried; then Nsight Compute's kernel
#                                 times of one decode and one verification step (SmolLM2
#                                 shape, GEMV up to 8 rows), per kernel
#   scripts/gpu_run.sh soak       (after smollm2) the soak of the speculation issue: SmolLM2
#                                 with the shipped EAGLE-3 head, `bench soak` (25 waves of
#                                 64, then one alone) over two layouts: blocks of 4 tokens
#                                 and a shared prompt (each wave's 64 x 256 generated tokens
#                                 take 4,096 never-used blocks, so ids pass 65,535 from wave
#                                 16), and blocks of 16, prefix caching off and a prompt of
#                                 about 3,600 tokens at 0.95 of the device (the waves sweep
#                                 the pool past the draft layer's 2^31-byte offset); then,
#                                 where `scripts/gpu_build.sh --fault` built peregrine-fault,
#                                 the first layout with the head's KV zeroed above block
#                                 65,535 (PEREGRINE_FAULT_DRAFT_KV_ABOVE); SOAK_RUNS names
#                                 some of ids, offsets and fault. Each run's verifications,
#                                 as the band alarm counted them, come back in
#                                 verifications-RUN.txt.gz
#   scripts/gpu_run.sh limits     step limits past the device refused at start-up, named
#   scripts/gpu_run.sh abserve    SmolLM2-135M (after smollm2) served by the base build (as in
#                                 `ab`) and by this one, in turns, two rounds: `bench serve` at
#                                 concurrency 1 and 8 and the engine's time per step, as in
#                                 `serve`
#   scripts/gpu_run.sh chain      scripts/decode_chain_bench.cu (built here with nvcc): the
#                                 kernel chain of batch-1 decode layers replayed as a graph,
#                                 unfused against fused norms and at several GEMV grid caps,
#                                 and the persistent prototype (gemv_program_probe.cuh), on
#                                 the Llama-3.2-1B and SmolLM2-135M shapes; where
#                                 scripts/gemm_base.cu (ignored by git: carry it) holds an
#                                 earlier gemm.cu (git show REV:kernels/cuda/gemm.cu), a
#                                 build over it first
#   scripts/gpu_run.sh serve      SmolLM2-135M (after smollm2) served on the GPU: `bench serve`
#                                 at concurrency 1 and 8 (TPOT: the serving loop's step),
#                                 then `bench latency` of the same model at batch 1 and 8
#   scripts/gpu_run.sh async      async scheduling on and off in turns: SmolLM2-135M (after
#                                 smollm2) served as in `serve`, then bench latency (its
#                                 ahead_ms/step) on the Llama-3.2-1B shape and SmolLM2
#   scripts/gpu_run.sh serve1b    the Llama-3.2-1B shape with random weights
#                                 (scripts/random_checkpoint.py) served as in `async`
#   scripts/gpu_run.sh opcosts    scripts/stream_op_costs.py: the device time of the copies
#                                 and events that may stand between two decode graphs
#   scripts/gpu_run.sh stash      copies the GGUF parts carried in target/gguf-parts*/ to
#                                 /tmp/gguf-parts/, and the EAGLE-3 answers' parts carried
#                                 in target/eagle3-data*/ to /tmp/eagle3-data-parts/, which
#                                 outlive the call while the machine stays warm (a file over
#                                 one call's 64 MiB travels in parts: `split -n 4 -d
#                                 MODEL.gguf`, one part per call, since the tree with the
#                                 shipped EAGLE-3 head takes about 29 MB)
#   scripts/gpu_run.sh smollm2    joins /tmp/gguf-parts/* and converts it to /tmp/smollm2
#   scripts/gpu_run.sh eagle3data (after smollm2) the EAGLE-3 recipe's data stage:
#                                 tools/eagle3/gpu.sh data (the registry collections'
#                                 prompts in $EAGLE3_PROMPTS or target/eagle3-prompts/)
#   scripts/gpu_run.sh eagle3train the EAGLE-3 recipe's training stage: tools/eagle3/gpu.sh
#                                 train
#   scripts/gpu_run.sh eagle3time  (after smollm2) where a served step's time goes, with the
#                                 shipped EAGLE-3 head and without speculation: a fresh
#                                 server per concurrency (1 and 64) and per setting, bench
#                                 serve on the held-out prompts, then its step-time and
#                                 head-step series from /metrics; each binary of
#                                 EAGLE3TIME_BINARIES (default peregrine) in turns
#   scripts/gpu_run.sh draftcost  (after smollm2) what adaptive drafting sees and decides: a
#                                 fresh server per setting (adaptive, always 1, 2 and 3
#                                 drafts, no speculation) at concurrency 64 and 32
#                                 (DRAFTCOST_CONCURRENCY), DRAFTCOST_ROUNDS rounds (1),
#                                 bench serve on the held-out prompts; each step's trace,
#                                 the head's steps and the cuBLASLt plans made come back
#                                 in steps.tar (steps-rROUND-cC-SETTING.txt.gz)
#   scripts/gpu_run.sh adaptive   (after smollm2) adaptive drafting against fixed k = 3 on
#                                 ordinary chat prompts (target/chat40.jsonl, carried:
#                                 scripts/chatml_dataset.py's): bench spec at batch 1, 8 and
#                                 64 (or ADAPTIVE_BATCHES), each against its run without drafts, ADAPTIVE_ROUNDS
#                                 rounds (2); the adaptive runs' plans counted by k from
#                                 the scheduler's trace, and how the steps queued ahead
#                                 served; ADAPTIVE_BINARIES="peregrine peregrine-base" runs
#                                 each setting with each binary carried in target/gpu-carry.
#                                 Without smollm2, SmolLM2's shape with random weights
#                                 (carry target/tokenizer): every draft is rejected, so it
#                                 shows what plain steps cost beside the head
#   scripts/gpu_run.sh eagle3serve (after smollm2) the shipped EAGLE-3 head on the GPU, on
#                                 the held-out prompts (target/eagle3-bench/heldout_bench.jsonl
#                                 if carried, else tools/eagle3/bench_dataset.py's): bench
#                                 spec at batch 1, 8, 32 and 64 (adaptive drafting, and with
#                                 EAGLE3_FIXED=1 at 1 and 64 always drafting too), then
#                                 served with and without the head, in turns: bench serve at
#                                 concurrency 1, 8 and 64
#   scripts/gpu_run.sh structured structured output on the GPU, the SmolLM2-135M and Llama-3.2-1B
#                                 shapes with random weights and SmolLM2's tokenizer (carried
#                                 in target/tokenizer/): scripts/structured/device_check.py's
#                                 constrained requests checked, served under --deterministic
#                                 plainly and with n-gram speculation, whose greedy answers
#                                 must be the plain ones; then scripts/structured/bench_constrained.sh,
#                                 constrained against free output tokens/s at concurrency 1
#                                 and 8 and the mask time per row
#   scripts/gpu_run.sh deterministic
#                                 the cost of --deterministic on the Llama-3.2-1B shape
#                                 (random weights, through graphs): bench latency with and
#                                 without it, in turns, of decode at batch 1, 8 and 64 after
#                                 128 tokens and at batch 1 and 16 after 4,000, and of the
#                                 prefill of 4,000 tokens at batch 1
#   scripts/gpu_run.sh mla        latent attention's prefill on tensor cores against the split
#                                 kernel it replaced (--no-tensor-cores cuts prompts into
#                                 one-row sequences; it also moves the experts to CUDA cores):
#                                 bench latency of the DeepSeek-V2-Lite shape (random
#                                 weights), prefill of 512 and 4,000 tokens at batch 1, then
#                                 Nsight Compute's times of the mla_ kernels in one prefill
#                                 of 4,000 tokens each way
#   scripts/gpu_run.sh llamacpp   llama.cpp (CUDA, flash attention on) against Peregrine on one
#                                 random-weight bf16 checkpoint of the Llama-3.2-1B shape
#                                 (scripts/random_checkpoint.py with SmolLM2's tokenizer in
#                                 target/tokenizer/, converted to GGUF by the tree's
#                                 convert_hf_to_gguf.py): carry target/gpu-carry,
#                                 target/tokenizer and target/llamacpp (the stripped source,
#                                 scripts/llamacpp_source.sh). Builds llama-bench and
#                                 llama-batched-bench in /tmp/llama.cpp (kept while the machine
#                                 stays warm), then llama-bench: prefill of 512 and 4,000
#                                 tokens at ubatch 512 and 4,096, and batch-1 decode of 128
#                                 tokens at depths 0, 128 and 4,000; llama-batched-bench: 128
#                                 steps of 1 and 16 sequences after 4,000-token prompts, and of
#                                 1, 8 and 64 after 128; then bench latency of the same shapes.
#                                 Each command under `timeout`; tables in llamacpp.log, the
#                                 tools' full output in llamacpp-detail.log and the build's in
#                                 llamacpp-build.log. The build's binaries come back in
#                                 llamacpp-bin.tar.gz where under 16 MiB: copied to
#                                 target/llamacpp/, a later call runs them, unbuilt
#   scripts/gpu_run.sh tiers      issue 50's time to first token of a 3,770-token prefix on
#                                 the GPU, as on the CPU (docs/performance.md): SmolLM2-135M
#                                 (/tmp/smollm2, else a random SmolLM2-shaped checkpoint with
#                                 the tokenizer carried in target/tokenizer/) under a pool of
#                                 --kv-cache-memory 140MB (about 6,000 tokens, which two other
#                                 prompts of that length push the prefix out of), a fresh
#                                 server each: no tier, --kv-host-memory 1GiB, --kv-cache-dir
#                                 under a fresh directory, then a restart over that directory
#                                 (--once): scripts/bench_kv_tiers.py --words 1300 (with
#                                 --beside 1000: a request decoding meanwhile); then the
#                                 agent workload (scripts/agent_dataset.py, bench serve, 16
#                                 prompts) without a tier and with the disk tier; the tiers'
#                                 /metrics after each and the servers' tier lines, all in
#                                 tiers.log (the servers' own logs stay in /tmp).
#                                 TIERS_CASES="host disk" runs only the cases it names (none
#                                 host disk restart agent-none agent-disk)
#   scripts/gpu_run.sh parting    (after smollm2) whether greedy outputs with drafts keep
#                                 the bits of those without under --deterministic (it found
#                                 the prefill attention's fused rescale): bench spec with
#                                 ngram on the chat prompts (target/chat40.jsonl) at 1, 8
#                                 and 16 requests, two rounds, --outputs of each, then per
#                                 request the first position where a run differs from the
#                                 run without drafts at 1 request, in parting.log
# Results go to $OUT (one log per mode) as they are produced.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/peregrine-out}
mkdir -p "$OUT"
bin=/tmp/peregrine-bin
mkdir -p "$bin"
for f in target/gpu-carry/*.gz; do
    [ -e "$f" ] && gunzip -c "$f" >"$bin/$(basename "$f" .gz)" && chmod +x "$bin/$(basename "$f" .gz)"
done
export CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export PEREGRINE_CACHE=/tmp/peregrine-cache
export RUST_BACKTRACE=1
# Waits up to two minutes for a server to listen on port $1.
wait_for_port() {
    for _ in $(seq 1 240); do
        (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return
        sleep 0.5
    done
}
# Prints the KV tiers' and the prefix cache's lines of the /metrics of the server on port $1.
tier_metrics() {
    timeout 30 python3 -c 'import sys, urllib.request
for line in urllib.request.urlopen(sys.argv[1]).read().decode().splitlines():
    if line.startswith(("peregrine:kv_", "peregrine:prefix_cache_")):
        print(line)' "http://127.0.0.1:$1/metrics" 2>&1
}
# Serves the model in $3 (SmolLM2-135M: /tmp/smollm2) with binary $1, logging to $2, with
# the serve flags after them; runs `bench serve` at concurrency 1 and 8 against it, stops
# it, and prints the engine's time per step from its log (serve_steps.py: each request's
# time from queued to finished, over the requests that ran alone).
serve_bench() {
    local serve_bin=$1 log=$2 model=$3 port=8123
    shift 3
    "$serve_bin" serve --model "$model" --device cuda --port $port "$@" >"$log" 2>&1 &
    local server=$!
    wait_for_port $port
    for c in 1 8; do
        "$bin/peregrine" bench serve --url http://127.0.0.1:$port --num-prompts $((8 * c)) \
            --concurrency $c --input-len 128 --output-len 128
    done
    kill $server
    wait $server
    python3 scripts/serve_steps.py "$log" 128
}
# Serves the model in $1 with async scheduling on and off, in turns, two rounds
# (serve_bench each, the server logs under /tmp).
serve_async_on_off() {
    local round flags
    for round in 1 2; do
        for flags in "" "--no-async-scheduling"; do
            echo "== round $round serve $flags"
            # shellcheck disable=SC2086
            serve_bench "$bin/peregrine" "/tmp/serve-$round${flags:+-off}.log" "$1" $flags
        done
    done
}
# Prints the path of the held-out prompts as a bench dataset (after smollm2): the carried
# target/eagle3-bench/heldout_bench.jsonl if there is one, else one built from
# tools/eagle3/prompts/heldout.jsonl with the target's chat template.
heldout_bench() {
    local carried=target/eagle3-bench/heldout_bench.jsonl built=/tmp/eagle3-bench/heldout_bench.jsonl
    if [ -f $carried ]; then
        echo $carried
        return
    fi
    mkdir -p /tmp/eagle3-bench
    [ -s $built ] || python3 tools/eagle3/bench_dataset.py /tmp/smollm2 \
        tools/eagle3/prompts/heldout.jsonl $built >&2
    echo $built
}
# Puts a libnccl.so link to the NCCL that PyTorch's wheel installs (libnccl.so.2 alone,
# which cudarc does not look for) on LD_LIBRARY_PATH, and requires the NCCL tests to find it.
nccl_on_path() {
    local lib
    lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null) || return 0
    [ -f "$lib/libnccl.so.2" ] || return 0
    mkdir -p /tmp/nccl-lib && ln -sf "$lib/libnccl.so.2" /tmp/nccl-lib/libnccl.so
    export LD_LIBRARY_PATH=/tmp/nccl-lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    export PEREGRINE_REQUIRE_NCCL=1
}
mode=${1:-tests}
case "$mode" in
tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
    [ -d /tmp/smollm2 ] && export PEREGRINE_SMOLLM2_DIR=/tmp/smollm2
    nccl_on_path
    "$bin/cuda-tests" --test-threads=1 --nocapture "${@:2}" 2>&1 | tee "$OUT/tests.log"
    ;;
bench)
    # Eager and through CUDA graphs (the default), each with and without --deterministic.
    one_b="bench latency --device cuda --random-weights scripts/configs/llama-3.2-1b.json"
    for flags in "--enforce-eager" "" "--deterministic --enforce-eager" "--deterministic"; do
        "$bin/peregrine" $one_b --batch-sizes 1,2,4,8,64 --input-len 128 --output-len 128 $flags 2>&1 |
            tee -a "$OUT/bench.log"
    done
    eight_b="bench latency --device cuda --random-weights scripts/configs/llama-3-8b.json"
    for flags in "--enforce-eager" ""; do
        "$bin/peregrine" $eight_b --batch-sizes 1,64 --input-len 128 --output-len 64 $flags 2>&1 |
            tee -a "$OUT/bench.log"
    done
    ;;
graphs)
    # Batch-1 (and 8, 64) decode eager and through CUDA graphs: SmolLM2-135M (after
    # smollm2) and the Llama-3.2-1B shape.
    common="bench latency --device cuda --batch-sizes 1,8,64 --input-len 128 --output-len 128"
    for flags in "--enforce-eager" ""; do
        [ -d /tmp/smollm2 ] && "$bin/peregrine" $common --model /tmp/smollm2 $flags 2>&1 |
            tee -a "$OUT/graphs.log"
        "$bin/peregrine" $common --random-weights scripts/configs/llama-3.2-1b.json $flags 2>&1 |
            tee -a "$OUT/graphs.log"
    done
    ;;
pdl)
    one_b="bench latency --device cuda --random-weights scripts/configs/llama-3.2-1b.json"
    for flags in "--enforce-eager --no-programmatic-launch" "--enforce-eager" \
        "--no-programmatic-launch" ""; do
        "$bin/peregrine" $one_b --batch-sizes 1,8,64 --input-len 128 --output-len 128 $flags 2>&1 |
            tee -a "$OUT/pdl.log"
    done
    ;;
deterministic)
    one_b="bench latency --device cuda --random-weights scripts/configs/llama-3.2-1b.json"
    for run in "--batch-sizes 1,8,64 --input-len 128 --output-len 128" \
        "--batch-sizes 1,16 --input-len 4000 --output-len 64" \
        "--batch-sizes 1 --input-len 4000 --output-len 2"; do
        for flags in "" "--deterministic"; do
            echo "== $run $flags" | tee -a "$OUT/deterministic.log"
            # shellcheck disable=SC2086
            "$bin/peregrine" $one_b $run $flags 2>&1 | grep -v "^20" | tee -a "$OUT/deterministic.log"
        done
    done
    ;;
mla)
    lite="bench latency --device cuda --random-weights tests/fixtures/deepseek/published/deepseek-v2-lite.json"
    for len in 512 4000; do
        for flags in "" "--no-tensor-cores"; do
            echo "== prefill of $len $flags" | tee -a "$OUT/mla.log"
            # shellcheck disable=SC2086
            "$bin/peregrine" $lite --batch-sizes 1 --input-len $len --output-len 8 $flags 2>&1 |
                grep -v "^20" | tee -a "$OUT/mla.log"
        done
    done
    for flags in "" "--no-tensor-cores"; do
        csv="/tmp/mla-ncu${flags:+-cuda-cores}.csv"
        # shellcheck disable=SC2086
        ncu --clock-control none -k 'regex:mla_' --metrics gpu__time_duration.sum --csv \
            "$bin/peregrine" $lite --enforce-eager --batch-sizes 1 --input-len 4000 \
            --output-len 1 $flags >"$csv" 2>/dev/null
        echo "== Nsight Compute, prefill of 4,000 $flags: the mla_ kernels" | tee -a "$OUT/mla.log"
        python3 scripts/ncu_step_summary.py "$csv" 0 | tee -a "$OUT/mla.log"
    done
    ;;
attnprof)
    # Where decode attention's time goes: bench latency (graphs) of the Llama-3.2-1B shape at
    # batch 64 after 128 tokens and at batch 1 and 8 after 32,000, then Nsight Compute's
    # sections of the split and combine kernels in two eager decode steps of each.
    one_b="bench latency --device cuda --random-weights scripts/configs/llama-3.2-1b.json"
    for run in "64 128" "1,8 32000"; do
        read -r sizes len <<<"$run"
        echo "== batch $sizes after $len tokens" | tee -a "$OUT/attnprof.log"
        # shellcheck disable=SC2086
        "$bin/peregrine" $one_b --batch-sizes "$sizes" --input-len "$len" --output-len 32 2>&1 |
            grep -v "^20" | tee -a "$OUT/attnprof.log"
    done
    for run in "64 128" "8 32000"; do
        read -r sizes len <<<"$run"
        # shellcheck disable=SC2086
        ncu --clock-control none -k 'regex:paged_attention_(split|combine)' --launch-skip 16 \
            --launch-count 3 --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section WarpStateStats --section MemoryWorkloadAnalysis \
            "$bin/peregrine" $one_b --enforce-eager --batch-sizes "$sizes" --input-len "$len" \
            --output-len 4 >"$OUT/ncu-attn-b$sizes-$len.txt" 2>&1
    done
    ;;
splitbench)
    # One build of the split-kernel bench per register budget, compiled side by side, then
    # each run in turn.
    IFS=';' read -r -a variants <<<"${SPLIT_VARIANTS:-;-DPA_UNROLL=8 -DPA_SPLIT_MIN_BLOCKS=1;-DPA_SPLIT_MIN_BLOCKS=5;-DPA_SPLIT_THREADS=128 -DPA_SPLIT_MIN_BLOCKS=8}"
    for i in "${!variants[@]}"; do
        # shellcheck disable=SC2086
        nvcc -O3 -std=c++17 -arch=sm_90 -include kernels/cuda/common.cuh ${variants[$i]} \
            scripts/split_attention_bench.cu -o "/tmp/split_bench_$i" >"/tmp/split_bench_$i.log" 2>&1 &
    done
    wait
    for i in "${!variants[@]}"; do
        echo "== variant $i: ${variants[$i]:-defaults}" | tee -a "$OUT/splitbench.log"
        grep -i error "/tmp/split_bench_$i.log" | tee -a "$OUT/splitbench.log"
        timeout 120 "/tmp/split_bench_$i" 2>&1 | tee -a "$OUT/splitbench.log"
    done
    ;;
hf)
    for cfg in llama-3.2-1b llama-3-8b; do
        PYTHONUNBUFFERED=1 python3 scripts/bench_hf_transformers.py --config "scripts/configs/$cfg.json" \
            --batch-sizes 1,64 --input-len 128 --output-len 32 2>&1 | tee -a "$OUT/hf.log"
    done
    ;;
profile)
    one_b="bench latency --device cuda --random-weights scripts/configs/llama-3.2-1b.json"
    for rows in 0 8; do
        ncu --clock-control none --metrics gpu__time_duration.sum --csv \
            "$bin/peregrine" $one_b --batch-sizes 1 --input-len 128 --output-len 6 \
            --gemv-max-rows $rows >"$OUT/ncu-gemv$rows.csv" 2>"$OUT/ncu-gemv$rows.err"
        echo "== --gemv-max-rows $rows" | tee -a "$OUT/profile.log"
        python3 scripts/ncu_step_summary.py "$OUT/ncu-gemv$rows.csv" 3 2>&1 | tee -a "$OUT/profile.log"
    done
    ;;
spec)
    spec="bench spec --model /tmp/smollm2 --device cuda --gpu-memory-utilization 0.3"
    for flags in "" "--deterministic"; do
        for run in "--dataset scripts/spec_prompts.jsonl --num-prompts 8 --concurrency 1" \
            "--dataset scripts/spec_prompts.jsonl --num-prompts 8 --concurrency 8" \
            "--num-prompts 4 --concurrency 1 --input-len 64 --output-len 64"; do
            "$bin/peregrine" $spec $run $flags 2>&1 | grep -v "^20" | tee -a "$OUT/spec.log"
        done
    done
    # The draft model on the GPU beside the target (SmolLM2 as its own draft: the path, not
    # a speedup).
    "$bin/peregrine" $spec --dataset scripts/spec_prompts.jsonl --num-prompts 8 --concurrency 8 \
        --speculative-method draft_model --draft-model /tmp/smollm2 2>&1 | grep -v "^20" |
        tee -a "$OUT/spec.log"
    ;;
eagle3)
    python3 scripts/random_eagle3_head.py /tmp/smollm2 /tmp/eagle3-random | tee -a "$OUT/eagle3.log"
    spec="bench spec --model /tmp/smollm2 --device cuda --gpu-memory-utilization 0.3 \
        --speculative-method eagle3 --draft-model /tmp/eagle3-random \
        --dataset scripts/spec_prompts.jsonl --num-prompts 8"
    for flags in "--concurrency 1" "--concurrency 8" "--concurrency 1 --enforce-eager" \
        "--concurrency 8 --deterministic"; do
        "$bin/peregrine" $spec $flags 2>&1 | grep -v "^20" | tee -a "$OUT/eagle3.log"
    done
    ;;
ab)
    builds=""
    for base in ${AB_BASES:-target/gpu-carry-base}; do
        name="peregrine-$(basename "$base")"
        gunzip -c "$base/peregrine.gz" >"$bin/$name" && chmod +x "$bin/$name"
        builds="$builds $name"
    done
    builds="$builds peregrine"
    common="bench latency --device cuda --batch-sizes 1,8,64 --input-len 128 --output-len 128"
    models="--random-weights=scripts/configs/llama-3.2-1b.json"
    if [ -d /tmp/smollm2 ]; then
        models="$models --model=/tmp/smollm2"
    else
        models="$models --random-weights=scripts/configs/smollm2-135m.json"
    fi
    for round in $(seq 1 "${AB_ROUNDS:-2}"); do
        for model in $models; do
            for run in ${AB_RUNS:-graphs eager}; do
                flags=""
                [ "$run" = eager ] && flags="--enforce-eager"
                for build in $builds; do
                    echo "== round $round $build $model $flags" | tee -a "$OUT/ab.log"
                    "$bin/$build" $common "$model" $flags 2>&1 | grep -v "^20" | tee -a "$OUT/ab.log"
                done
            done
        done
    done
    ;;
verify)
    builds=peregrine
    if [ -f target/gpu-carry-base/peregrine.gz ]; then
        gunzip -c target/gpu-carry-base/peregrine.gz >"$bin/peregrine-base" && chmod +x "$bin/peregrine-base"
        builds="peregrine-base peregrine"
    fi
    common="bench latency --device cuda --batch-sizes 1,2,4,8 --input-len 128 --output-len 64 --verify-rows 4"
    for cfg in smollm2-135m llama-3.2-1b; do
        for rows in 1 4 8; do
            for build in $builds; do
                echo "== $build $cfg --gemv-max-rows $rows" | tee -a "$OUT/verify.log"
                "$bin/$build" $common --random-weights "scripts/configs/$cfg.json" --gemv-max-rows $rows 2>&1 |
                    grep -v "^20" | tee -a "$OUT/verify.log"
            done
        done
    done
    small="bench latency --device cuda --random-weights scripts/configs/smollm2-135m.json --batch-sizes 1 \
        --input-len 128 --output-len 6 --gemv-max-rows 8"
    for rows in 1 4; do
        ncu --clock-control none --metrics gpu__time_duration.sum --csv "$bin/peregrine" $small \
            --verify-rows $rows >"$OUT/ncu-verify$rows.csv" 2>"$OUT/ncu-verify$rows.err"
        echo "== ncu: the last steps of --verify-rows $rows" | tee -a "$OUT/verify.log"
        python3 scripts/ncu_step_summary.py "$OUT/ncu-verify$rows.csv" 3 2>&1 | tee -a "$OUT/verify.log"
    done
    ;;
soak)
    # Two layouts. ids: blocks of 4 tokens with the prompt shared through the prefix cache,
    # so only generated tokens take fresh blocks and ids pass 65,535 from wave 16. offsets:
    # blocks of 16, prefix caching off and a prompt of about 3,600 tokens, so each wave
    # takes about 15,000 fresh blocks and the 25 waves sweep the whole pool, past the block
    # where the draft layer's K (or V) tensor passes 2^31 bytes (0.95 of the device puts
    # that tensor just over 2 GiB). The fault run is the ids layout with the head's KV
    # zeroed above block 65,535. Every step drafts (no adaptive drafting), so that every
    # wave verifies drafts read from wherever its KV lies. The long prompt is a user turn in
    # SmolLM2's chat template (the head was trained on its answers to such turns): raw, the
    # target's first token after it was the end of text, and every draft after it was one
    # of text past the end.
    port=8125
    long_prompt=$(python3 -c 'winds = ["north", "east", "south", "west"]
print("<|im_start|>user\nHere is the keeper log of the lighthouse. " + " ".join(
    f"Day {d}: the lamp was lit at {18 + d % 3}:{d % 60:02d}, wind {d * 7 % 40} knots from "
    f"the {winds[d % 4]}, {d * 13 % 9} ships passed." for d in range(1, 161))
    + " Summarise the log, then write a story about the keeper.<|im_end|>\n"
    + "<|im_start|>assistant\n")')
    runs="ids offsets"
    [ -f target/gpu-carry/peregrine-fault.gz ] && runs="ids offsets fault"
    runs=${SOAK_RUNS:-$runs}
    for run in $runs; do
        serve_bin="$bin/peregrine" fault=() prompt=()
        layout=(--block-size 4 --gpu-memory-utilization 0.9)
        case $run in
        fault)
            serve_bin="$bin/peregrine-fault" fault=(env PEREGRINE_FAULT_DRAFT_KV_ABOVE=65535) ;;
        offsets)
            layout=(--block-size 16 --gpu-memory-utilization 0.95 --no-prefix-caching)
            prompt=(--prompt "$long_prompt") ;;
        esac
        echo "== soak, $run: ${layout[*]}" | tee -a "$OUT/soak.log"
        "${fault[@]}" "$serve_bin" serve --model /tmp/smollm2 --device cuda --port $port \
            --max-num-seqs 64 "${layout[@]}" --no-speculative-adaptive \
            --speculative-method eagle3 --draft-model heads/smollm2-135m-eagle3 \
            --log-level info,peregrine_actors::scheduler::spec::stats=trace \
            >"/tmp/serve-soak-$run.log" 2>&1 &
        server=$!
        wait_for_port $port
        grep -E "blocks|bytes_per_layer|audit|fault" "/tmp/serve-soak-$run.log" | head -6 |
            tee -a "$OUT/soak.log"
        "$bin/peregrine" bench soak --url http://127.0.0.1:$port --waves 25 --concurrency 64 \
            --max-tokens 256 "${prompt[@]}" 2>&1 | tee -a "$OUT/soak.log"
        kill $server
        wait $server
        grep -E "WARN|ERROR|alarm" "/tmp/serve-soak-$run.log" | tail -20 >>"$OUT/soak.log"
        # Every verification the band alarm counted, for replaying it offline.
        grep -E " verification band=" "/tmp/serve-soak-$run.log" | sed -E 's/^.* verification //' |
            gzip -9 >"$OUT/verifications-$run.txt.gz"
    done
    ;;
abserve)
    gunzip -c target/gpu-carry-base/peregrine.gz >"$bin/peregrine-base" && chmod +x "$bin/peregrine-base"
    for round in 1 2; do
        for build in peregrine-base peregrine; do
            echo "== round $round $build" | tee -a "$OUT/abserve.log"
            serve_bench "$bin/$build" "/tmp/abserve-$round-$build.log" /tmp/smollm2 2>&1 |
                grep -v "^20" | tee -a "$OUT/abserve.log"
        done
    done
    ;;
chain)
    build="nvcc -O3 -std=c++17 -arch=sm_90 -include kernels/cuda/common.cuh scripts/decode_chain_bench.cu"
    $build -o /tmp/decode_chain_bench 2>&1 | grep -i error
    benches=/tmp/decode_chain_bench
    if [ -f scripts/gemm_base.cu ]; then
        $build -DGEMM_BASE -o /tmp/decode_chain_bench_base 2>&1 | grep -i error
        benches="/tmp/decode_chain_bench_base /tmp/decode_chain_bench"
    fi
    for shape in "" "576 960 1536 30"; do
        for bench in $benches; do
            echo "== $bench $shape" | tee -a "$OUT/chain.log"
            $bench $shape 2>&1 | tee -a "$OUT/chain.log"
        done
    done
    ;;
serve)
    # The engine's step against the model's own (after smollm2): SmolLM2-135M served on the
    # GPU, `bench serve` at concurrency 1 and 8 (its TPOT is the serving loop's time per
    # step: scheduling, messages, staging and the step), then `bench latency` at batch
    # sizes 1 and 8 (the step with the host loop alone, and the device's part).
    # SERVE_BIN names another build's binary to serve (an A/B in turns) and SERVE_ARGS
    # more serve flags (speculation: --speculative-method ngram).
    # shellcheck disable=SC2086
    serve_bench "${SERVE_BIN:-$bin/peregrine}" "$OUT/serve.log" /tmp/smollm2 ${SERVE_ARGS:-} 2>&1 |
        tee -a "$OUT/serve_bench.log"
    "$bin/peregrine" bench latency --device cuda --model /tmp/smollm2 --batch-sizes 1,8 \
        --input-len 128 --output-len 128 2>&1 | tee -a "$OUT/serve_bench.log"
    ;;
async)
    # Async scheduling on and off, in turns (after smollm2): SmolLM2-135M served as in
    # `serve`, then `bench latency` (its ahead_ms/step column) of the Llama-3.2-1B shape
    # and SmolLM2 at batch sizes 1 and 8.
    serve_async_on_off /tmp/smollm2 2>&1 | tee -a "$OUT/async.log"
    common="bench latency --device cuda --batch-sizes 1,8 --input-len 128 --output-len 128"
    for round in 1 2; do
        for model in --random-weights=scripts/configs/llama-3.2-1b.json --model=/tmp/smollm2; do
            "$bin/peregrine" $common "$model" 2>&1 | grep -v "^20" | tee -a "$OUT/async.log"
        done
    done
    ;;
serve1b)
    # The Llama-3.2-1B shape served with random weights (scripts/random_checkpoint.py, with
    # the tokenizer files carried in target/tokenizer/, e.g. SmolLM2's), async scheduling
    # on and off in turns: `bench serve` and the engine's time per step, as in `async`.
    python3 scripts/random_checkpoint.py scripts/configs/llama-3.2-1b.json target/tokenizer \
        /tmp/llama1b 2>&1 | tee -a "$OUT/serve1b.log"
    serve_async_on_off /tmp/llama1b 2>&1 | tee -a "$OUT/serve1b.log"
    ;;
limits)
    # Step limits past the device (the Llama-3.2-1B shape, random weights, as in serve1b):
    # refused at start-up with the limits named, no panic; then a server within them
    # answers a request through the bounded front door.
    python3 scripts/random_checkpoint.py scripts/configs/llama-3.2-1b.json target/tokenizer \
        /tmp/llama1b 2>&1 | tee -a "$OUT/limits.log"
    for flags in "--max-num-seqs 100000 --max-num-batched-tokens 100000000" \
        "--max-num-batched-tokens 4000000"; do
        echo "== serve $flags" | tee -a "$OUT/limits.log"
        # shellcheck disable=SC2086
        timeout 300 "$bin/peregrine" serve --device cuda --model /tmp/llama1b --port 0 $flags \
            2>&1 | grep -v " INFO " | tail -5 | tee -a "$OUT/limits.log"
        echo "exit ${PIPESTATUS[0]}" | tee -a "$OUT/limits.log"
    done
    ;;
opcosts)
    # What the small operations between two decode graphs cost the stream (PyTorch).
    python3 scripts/stream_op_costs.py 2>&1 | tee "$OUT/opcosts.log"
    ;;
structured)
    for shape in smollm2-135m llama-3.2-1b; do
        python3 scripts/random_checkpoint.py scripts/configs/$shape.json target/tokenizer \
            /tmp/random-$shape 2>&1 | tee -a "$OUT/structured.log"
    done
    for shape in smollm2-135m llama-3.2-1b; do
        for flags in "" "--speculative-method ngram --num-speculative-tokens 3"; do
            echo "== check $shape --deterministic $flags" | tee -a "$OUT/structured.log"
            greedy=(--record "$OUT/greedy-$shape.json")
            [ -n "$flags" ] && greedy=(--compare "$OUT/greedy-$shape.json")
            # shellcheck disable=SC2086
            "$bin/peregrine" serve --model /tmp/random-$shape --device cuda --port 8123 \
                --served-model-name random --deterministic $flags \
                >"$OUT/serve-check-$shape${flags:+-ngram}.log" 2>&1 &
            server=$!
            wait_for_port 8123
            python3 scripts/structured/device_check.py --url http://127.0.0.1:8123 --model random \
                "${greedy[@]}" 2>&1 | tee -a "$OUT/structured.log"
            kill $server
            wait $server
        done
        echo "== bench $shape" | tee -a "$OUT/structured.log"
        PEREGRINE="$bin/peregrine" STRUCTURED_BENCH_OUT="$OUT/bench-$shape" \
            scripts/structured/bench_constrained.sh --model /tmp/random-$shape --device cuda \
            2>&1 | tee -a "$OUT/structured.log"
    done
    ;;
stash)
    if ls target/gguf-parts*/* >/dev/null 2>&1; then
        mkdir -p /tmp/gguf-parts && cp target/gguf-parts*/* /tmp/gguf-parts/ && ls -la /tmp/gguf-parts
    fi
    if ls target/eagle3-data*/eagle3-data.tar.gz.part* >/dev/null 2>&1; then
        mkdir -p /tmp/eagle3-data-parts &&
            cp target/eagle3-data*/eagle3-data.tar.gz.part* /tmp/eagle3-data-parts/ &&
            ls -la /tmp/eagle3-data-parts
    fi
    ;;
smollm2)
    cat /tmp/gguf-parts/* >/tmp/smollm2.gguf
    sha256sum /tmp/smollm2.gguf | tee "$OUT/smollm2.sha256"
    "$bin/peregrine" convert /tmp/smollm2.gguf /tmp/smollm2 2>&1 | tee "$OUT/convert.log"
    ;;
eagle3data)
    tools/eagle3/gpu.sh data "$bin/peregrine"
    ;;
eagle3train)
    tools/eagle3/gpu.sh train "$bin/peregrine"
    ;;
eagle3time)
    head=heads/smollm2-135m-eagle3 data=$(heldout_bench) port=8125
    for c in 1 64; do
        for flags in "--speculative-method eagle3 --draft-model $head" \
            "--speculative-method eagle3 --draft-model $head --no-speculative-adaptive" ""; do
          for binary in ${EAGLE3TIME_BINARIES:-peregrine}; do
            echo "== concurrency $c serve ${flags:-without speculation} ($binary)" | tee -a "$OUT/eagle3_time.log"
            # shellcheck disable=SC2086
            "$bin/$binary" serve --model /tmp/smollm2 --device cuda --port $port \
                --max-num-seqs 64 $flags >/tmp/serve-time.log 2>&1 &
            server=$!
            wait_for_port $port
            "$bin/peregrine" bench serve --url http://127.0.0.1:$port --dataset $data \
                --num-prompts $((c == 1 ? 24 : 192)) --concurrency $c 2>&1 |
                grep -E "Output token throughput|Mean TPOT|Benchmark duration" | tee -a "$OUT/eagle3_time.log"
            python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$port/metrics').read().decode())" |
                grep -E "engine_step_seconds_(sum|count)|spec_decode_head_seconds_(sum|count)|planned_steps_total|num_drafts_total|mean_tokens_per_forward|generation_tokens_total" |
                tee -a "$OUT/eagle3_time.log"
            kill $server
            wait $server
          done
        done
    done
    ;;
headcost)
    # A drafting round's parts at batch 1 and 8 with the shipped EAGLE-3 head beside a
    # random-weight SmolLM2-135M shape (scripts/random_checkpoint.py, SmolLM2's tokenizer
    # carried in target/tokenizer/): its drafts are rejected, so each round is K = 3 head
    # steps, a 4-row verification and the host; `bench spec --no-speculative-adaptive`
    # with the head's steps traced (`head step` lines: path and microseconds), this build
    # and, where HEADCOST_BASE names a folder holding another's peregrine.gz, that one
    # (`peregrine-before`) in turns.
    [ -d /tmp/smol-rand ] || python3 scripts/random_checkpoint.py scripts/configs/smollm2-135m.json \
        target/tokenizer /tmp/smol-rand >/dev/null 2>&1
    builds=peregrine
    if [ -n "${HEADCOST_BASE:-}" ]; then
        gunzip -c "$HEADCOST_BASE/peregrine.gz" >"$bin/peregrine-before" && chmod +x "$bin/peregrine-before"
        builds="peregrine-before peregrine"
    fi
    trace=warn,peregrine_actors::draft::cuda_head=trace
    for round in $(seq 1 "${HEADCOST_ROUNDS:-2}"); do
        for c in 1 8; do
            for build in $builds; do
                echo "== round $round concurrency $c $build" | tee -a "$OUT/headcost.log"
                "$bin/$build" bench spec --model /tmp/smol-rand --device cuda \
                    --speculative-method eagle3 --draft-model heads/smollm2-135m-eagle3 \
                    --no-speculative-adaptive --num-prompts $((c * 4)) --concurrency $c \
                    --input-len 64 --output-len 128 --log-level $trace >/tmp/headcost.txt 2>&1
                grep -v "head step" /tmp/headcost.txt | grep -v "^20" | tee -a "$OUT/headcost.log"
                # Mean microseconds a head step took, by path, over the run with drafts.
                grep "head step" /tmp/headcost.txt | sed 's/\x1b\[[0-9;]*m//g' |
                    awk '{p="";u=0;for(i=1;i<=NF;i++){if($i~/^path=/)p=$i;if($i~/^us=/){sub("us=","",$i);u=$i}}
                         n[p]++;t[p]+=u} END{for(p in n) printf "  %s steps %d mean %.1f us\n",p,n[p],t[p]/n[p]}' |
                    tee -a "$OUT/headcost.log"
            done
        done
    done
    ;;
draftcost)
    head=heads/smollm2-135m-eagle3 data=$(heldout_bench) port=8126
    trace=info,peregrine_actors::scheduler=trace,peregrine_actors::draft::cuda_head=trace,peregrine_kernels::cuda::gemm_lt=debug
    for round in $(seq 1 "${DRAFTCOST_ROUNDS:-1}"); do
        for c in ${DRAFTCOST_CONCURRENCY:-64 32}; do
            for setting in adaptive k1 k2 k3 off; do
                case $setting in
                adaptive) flags="--speculative-method eagle3 --draft-model $head" ;;
                k?) flags="--speculative-method eagle3 --draft-model $head --no-speculative-adaptive
                        --num-speculative-tokens ${setting#k}" ;;
                off) flags="" ;;
                esac
                echo "== round $round concurrency $c $setting" | tee -a "$OUT/draftcost.log"
                # shellcheck disable=SC2086
                "$bin/peregrine" serve --model /tmp/smollm2 --device cuda --port $port \
                    --max-num-seqs 64 --log-level $trace $flags >/tmp/serve-cost.log 2>&1 &
                server=$!
                wait_for_port $port
                "$bin/peregrine" bench serve --url http://127.0.0.1:$port --dataset $data \
                    --num-prompts $((3 * c)) --concurrency $c 2>&1 |
                    grep -E "Output token throughput|Mean TPOT|Benchmark duration" | tee -a "$OUT/draftcost.log"
                kill $server
                wait $server
                grep -E "TRACE|DEBUG" /tmp/serve-cost.log | gzip -c >"/tmp/steps-r$round-c$c-$setting.txt.gz"
            done
        done
    done
    (cd /tmp && tar cf "$OUT/steps.tar" steps-r*-c*-*.txt.gz)
    ;;
adaptive)
    head=heads/smollm2-135m-eagle3 log="$OUT/adaptive.log"
    model=/tmp/smollm2
    if [ ! -d "$model" ]; then
        model=/tmp/smol-rand
        [ -d "$model" ] || timeout 300 python3 scripts/random_checkpoint.py \
            scripts/configs/smollm2-135m.json target/tokenizer "$model" 2>&1 | tee -a "$log"
    fi
    echo "== model $model" | tee -a "$log"
    for c in ${ADAPTIVE_BATCHES:-1 8 64}; do
        for flags in "" "--no-speculative-adaptive"; do
          for binary in ${ADAPTIVE_BINARIES:-peregrine}; do
            echo "== bench spec batch $c ${flags:-adaptive} ($binary)" | tee -a "$log"
            # shellcheck disable=SC2086
            timeout 300 "$bin/$binary" bench spec --model "$model" --device cuda \
                --speculative-method eagle3 --draft-model $head --dataset target/chat40.jsonl \
                --num-prompts $((c == 1 ? 24 : c * 2)) --concurrency $c --output-len 256 \
                --rounds "${ADAPTIVE_ROUNDS:-2}" $flags \
                --log-level warn,peregrine_actors::scheduler=trace >/tmp/adaptive.txt 2>&1
            grep -v "^20" /tmp/adaptive.txt | sed 's/\x1b\[[0-9;]*m//g' | grep -v TRACE | tee -a "$log"
            # Steps by drafts planned: count and mean microseconds (the step's, and the
            # proposal's wait within it), at each batch size seen.
            sed 's/\x1b\[[0-9;]*m//g' /tmp/adaptive.txt | grep " step " | grep "only_decodes=true" |
                awk '{r="";p="";t=0;w=0;for(i=1;i<=NF;i++){if($i~/^requests=/)r=$i;if($i~/^planned=/)p=$i;
                     if($i~/^propose_us=/){sub("propose_us=","",$i);w=$i}
                     if($i~/^total_us=/){sub("total_us=","",$i);t=$i}} k=r" "p; n[k]++; s[k]+=t; q[k]+=w}
                     END{for(k in n) if(n[k]>4) printf "  %s steps %d mean %.0f us (proposal %.0f)\n",k,n[k],s[k]/n[k],q[k]/n[k]}' |
                sort -V | tee -a "$log"
            # How the steps queued ahead served the steps after them.
            sed 's/\x1b\[[0-9;]*m//g' /tmp/adaptive.txt | grep " step " | grep -o "ahead=[A-Za-z]*" |
                sort | uniq -c | tee -a "$log"
          done
        done
    done
    ;;
eagle3serve)
    head=heads/smollm2-135m-eagle3 data=$(heldout_bench)
    for c in 1 8 32 64; do
        for flags in "" ${EAGLE3_FIXED:+"--no-speculative-adaptive"}; do
            [ -n "$flags" ] && [ $c != 1 ] && [ $c != 64 ] && continue
            echo "== bench spec batch $c $flags" | tee -a "$OUT/eagle3_spec.log"
            # shellcheck disable=SC2086
            "$bin/peregrine" bench spec --model /tmp/smollm2 --device cuda \
                --speculative-method eagle3 --draft-model $head --dataset $data \
                --num-prompts $((c == 1 ? 30 : c * 2 < 64 ? 64 : c * 2)) --concurrency $c \
                --output-len 256 $flags 2>&1 | grep -v "^20" | tee -a "$OUT/eagle3_spec.log"
        done
    done
    port=8124
    for flags in "--speculative-method eagle3 --draft-model $head" ""; do
        echo "== serve ${flags:-without speculation}" | tee -a "$OUT/eagle3_serve.log"
        # shellcheck disable=SC2086
        "$bin/peregrine" serve --model /tmp/smollm2 --device cuda --port $port \
            --max-num-seqs 64 $flags >"/tmp/serve-eagle3${flags:+-on}.log" 2>&1 &
        server=$!
        wait_for_port $port
        for c in 1 8 64; do
            "$bin/peregrine" bench serve --url http://127.0.0.1:$port --dataset $data \
                --num-prompts $((c == 1 ? 16 : c * 2)) --concurrency $c 2>&1 |
                tee -a "$OUT/eagle3_serve.log"
        done
        python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$port/metrics').read().decode())" |
            grep -E "spec_decode_(planned|num_drafts|mean)" |
            tee -a "$OUT/eagle3_serve.log"
        kill $server
        wait $server
        grep -E "WARN|ERROR|spec:" "/tmp/serve-eagle3${flags:+-on}.log" | tail -20 >>"$OUT/eagle3_serve.log"
    done
    ;;
llamacpp)
    # llama.cpp against Peregrine on one checkpoint (see the header). llama.cpp's decode
    # rows are llama-bench's tg128 at a depth (batch 1) and llama-batched-bench's S_TG (128
    # steps of B sequences after B prompts of PP tokens); Peregrine's are bench latency's
    # decode_tok/s after --input-len tokens. Build first and Peregrine last, so that no
    # build shares the host with a timed run.
    lcpp=/tmp/llama.cpp gguf=/tmp/llama1b.gguf binpack=target/llamacpp/llamacpp-bin.tar.gz
    log="$OUT/llamacpp.log" detail="$OUT/llamacpp-detail.log"
    command -v nvcc >/dev/null || export PATH=$CUDA_HOME/bin:$PATH
    # Prints a command, runs it for at most $1 seconds (its output appended to file $3
    # after -o as $2), and prints and returns its exit status.
    timed() {
        local limit=$1 start=$SECONDS rc out=
        shift
        [ "$1" = -o ] && out=$2 && shift 2
        echo "== $*"
        if [ -n "$out" ]; then
            timeout "$limit" "$@" >>"$out" 2>&1
        else
            timeout "$limit" "$@"
        fi
        rc=$?
        local what="$*"
        echo "== exit $rc after $((SECONDS - start)) s: ${what:0:72}"
        return $rc
    }
    # The tables of a llama.cpp tool's output; all of it goes to $detail.
    tables() {
        tee -a "$detail" |
            grep -E '^(==|\||llama_batched_bench:|build:|ggml_cuda_init|  Device)|error|failed|Error'
    }
    {
        nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
        [ -f /tmp/llama1b/config.json ] ||
            timed 240 python3 scripts/random_checkpoint.py scripts/configs/llama-3.2-1b.json \
                target/tokenizer /tmp/llama1b
        if [ ! -x $lcpp/build/bin/llama-bench ]; then
            rm -rf $lcpp
            tar -xzf target/llamacpp/llama.cpp.tar.gz -C /tmp && cat $lcpp/SOURCE.txt
            # The binaries an earlier call built and sent back, where carried.
            [ -f $binpack ] && tar -xzf $binpack -C /tmp && echo "llama.cpp binaries from $binpack"
        fi
        if [ ! -x $lcpp/build/bin/llama-bench ]; then
            nvcc --version | tail -2
            # Hopper only; flash attention's vector kernels for the f16 KV cache alone (the
            # default cache type); no tests, examples, server or app (their folders are
            # stripped); no NCCL, curl or OpenSSL.
            timed 120 -o "$OUT/llamacpp-build.log" cmake -S $lcpp -B $lcpp/build -DGGML_CUDA=ON \
                -DCMAKE_CUDA_ARCHITECTURES=90 -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON \
                -DCMAKE_BUILD_TYPE=Release -DGGML_CCACHE=OFF -DGGML_CUDA_NCCL=OFF \
                -DGGML_CUDA_FA_QUANTS=f16-f16 -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
                -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
        fi
        # The conversion (CPU) beside the build: nothing is timed yet.
        if [ ! -s $gguf ]; then
            (timed 300 -o /tmp/llamacpp-convert.log env PYTHONPATH=$lcpp/gguf-py python3 \
                $lcpp/convert_hf_to_gguf.py /tmp/llama1b --outtype bf16 --outfile $gguf.part &&
                mv $gguf.part $gguf) &
            convert=$!
        fi
        if [ ! -x $lcpp/build/bin/llama-bench ]; then
            if timed 400 -o "$OUT/llamacpp-build.log" cmake --build $lcpp/build -j16 \
                --target llama-bench llama-batched-bench; then
                # Sent back for a later call to carry, if small enough to come back.
                (cd /tmp && tar -czf "$OUT/llamacpp-bin.tar.gz" llama.cpp/build/bin/llama-bench \
                    llama.cpp/build/bin/llama-batched-bench llama.cpp/build/bin/lib*.so*)
                ls -la "$OUT/llamacpp-bin.tar.gz"
                [ "$(stat -c %s "$OUT/llamacpp-bin.tar.gz")" -lt $((16 << 20)) ] ||
                    rm "$OUT/llamacpp-bin.tar.gz"
            else
                grep -E "error|Error" "$OUT/llamacpp-build.log" | head -20
                tail -3 "$OUT/llamacpp-build.log"
            fi
        fi
        if [ -n "${convert:-}" ]; then
            wait "$convert"
            tail -5 /tmp/llamacpp-convert.log
            cat /tmp/llamacpp-convert.log >>"$detail"
        fi
        ls -la $gguf
        bench=$lcpp/build/bin/llama-bench batched=$lcpp/build/bin/llama-batched-bench
        # Prefill at batch 1 (ubatch 512, the default, and the whole 4,000-token prompt).
        timed 150 $bench -m $gguf -ngl 99 -fa 1 -p 512,4000 -n 0 -b 4096 -ub 512,4096 -r 3 2>&1 | tables
        # Batch-1 decode of 128 tokens after 0, 128 and 4,000 tokens of context.
        timed 150 $bench -m $gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0,128,4000 -r 3 2>&1 | tables
        # 128 decode steps of B sequences, each after its own prompt of PP tokens.
        timed 180 $batched -m $gguf -ngl 99 -fa on -c 69632 -npp 4000 -ntg 128 -npl 1,16 2>&1 | tables
        timed 120 $batched -m $gguf -ngl 99 -fa on -c 20480 -npp 128 -ntg 128 -npl 1,8,64 2>&1 | tables
        # The longest contexts first, should the call run short of time.
        # The last run is the baseline of the tensor-core prefill attention: its CUDA-core
        # kernel.
        for run in "1,16 4000" "1,8,64 128" "1 4000" "1 512" "1 4000 --no-tensor-cores"; do
            read -r sizes len flags <<<"$run"
            timed 180 "$bin/peregrine" bench latency --device cuda --model /tmp/llama1b \
                --batch-sizes "$sizes" --input-len "$len" --output-len 128 $flags 2>&1 |
                grep -v "^20"
        done
    } 2>&1 | tee -a "$log"
    ;;
tiers)
    # Issue 50's TTFT of a long shared prefix cold, from the pool and from each tier below
    # it (scripts/bench_kv_tiers.py as on the CPU, docs/performance.md), a fresh server a
    # case, every command under `timeout`.
    log="$OUT/tiers.log"
    model=/tmp/smollm2
    if [ ! -d "$model" ]; then
        model=/tmp/smol-rand
        timeout 300 python3 scripts/random_checkpoint.py scripts/configs/smollm2-135m.json \
            target/tokenizer "$model" 2>&1 | tee -a "$log"
    fi
    echo "== model $model" | tee -a "$log"
    port=8123
    rm -rf /tmp/kv-tiers /tmp/kv-agent
    python3 scripts/agent_dataset.py >/tmp/agent.jsonl
    # One log in $OUT (a call brings back only so many files): each server's own log stays
    # in /tmp, its tier lines and errors copied.
    for run in "none" "host --kv-host-memory 1GiB" "disk --kv-cache-dir /tmp/kv-tiers" \
        "restart --kv-cache-dir /tmp/kv-tiers" "agent-none" \
        "agent-disk --kv-cache-dir /tmp/kv-agent"; do
        read -r name flags <<<"$run"
        [ -n "${TIERS_CASES:-}" ] && [[ " $TIERS_CASES " != *" $name "* ]] && continue
        echo "== $name: serve --kv-cache-memory 140MB $flags" | tee -a "$log"
        # shellcheck disable=SC2086
        "$bin/peregrine" serve --model "$model" --device cuda --port $port \
            --kv-cache-memory 140MB $flags >"/tmp/serve-tiers-$name.log" 2>&1 &
        server=$!
        wait_for_port $port
        case $name in
        none) bench=(--tier "nothing (computed again)" --beside 1000) ;;
        host) bench=(--tier "host memory" --beside 1000) ;;
        disk) bench=(--tier disk --beside 1000) ;;
        restart) bench=(--once) ;;
        agent-*) bench=() ;;
        esac
        if [ ${#bench[@]} -gt 0 ]; then
            timeout 600 python3 scripts/bench_kv_tiers.py --base http://127.0.0.1:$port \
                --words 1300 "${bench[@]}" 2>&1 | tee -a "$log"
        else
            # The agent workload (scripts/agent_dataset.py).
            timeout 300 "$bin/peregrine" bench serve --url http://127.0.0.1:$port \
                --dataset /tmp/agent.jsonl --num-prompts 16 --concurrency 1 2>&1 |
                grep -v "^20" | tee -a "$log"
        fi
        tier_metrics $port | tee -a "$log"
        kill $server
        wait $server
        grep -E "KV (disk|host) tier|ERROR|panicked" "/tmp/serve-tiers-$name.log" | tee -a "$log"
    done
    ;;
parting)
    log="$OUT/parting.log"
    for c in 1 8 16; do
        echo "== $c requests" | tee -a "$log"
        timeout 200 "$bin/peregrine" bench spec --model /tmp/smollm2 --device cuda \
            --speculative-method ngram --dataset target/chat40.jsonl --num-prompts 16 \
            --concurrency $c --output-len 256 --deterministic --no-speculative-adaptive \
            --rounds 2 --outputs "$OUT/outputs-$c.jsonl" 2>&1 | grep -E "speedup|identical" | tee -a "$log"
    done
    # Each run's tokens against the run without drafts at one request: the first position
    # where they part, with the tokens around it.
    python3 - "$OUT" <<'PY' 2>&1 | tee -a "$log"
import json, sys
runs = {}
for c in (1, 8, 16):
    for line in open(f"{sys.argv[1]}/outputs-{c}.jsonl"):
        r = json.loads(line)
        runs[(c, r["run"], r["round"], r["request"])] = r["tokens"]
for (c, run, round_, request), tokens in sorted(runs.items()):
    want = runs[(1, "without", 0, request)]
    at = next((i for i, (a, b) in enumerate(zip(tokens, want)) if a != b), None)
    if at is None and len(tokens) != len(want):
        at = min(len(tokens), len(want))
    if at is not None:
        print(f"request {request}, {c} requests, {run} drafts, round {round_}: parts at {at} of "
              f"{len(tokens)} / {len(want)}: {tokens[max(0, at - 3):at + 3]} against "
              f"{want[max(0, at - 3):at + 3]}")
PY
    ;;
*)
    echo "unknown mode $mode" >&2
    exit 2
    ;;
esac
