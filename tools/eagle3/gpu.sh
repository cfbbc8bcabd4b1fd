#!/usr/bin/env bash
# The EAGLE-3 recipe's GPU stages for SmolLM2-135M-Instruct, run on the GPU machine by
# scripts/gpu_run.sh (which unpacks the peregrine binary and converts the default model's
# GGUF to /tmp/smollm2 first):
#   tools/eagle3/gpu.sh data BIN   serve the target with Peregrine on the GPU and collect its
#                                  answers to the held-out and training prompts
#                                  (generate.py): /tmp/eagle3/*.jsonl, gzipped into $OUT
#   tools/eagle3/gpu.sh train BIN  train the head (train.py, $EAGLE3_MINUTES minutes, 7.6 by
#                                  default) on /tmp/eagle3 (or on the answers carried in
#                                  target/eagle3-data/), print its offline acceptance on the
#                                  held-out answers, write it to $OUT/head, then run
#                                  `bench spec` with it on the GPU against no speculation
#                                  (unless EAGLE3_BENCH=0)
# Each stage's log goes to $OUT as it runs.
set -uo pipefail
cd "$(dirname "$0")"
stage=$1 bin=$2
OUT=${OUT:-/tmp/eagle3-out}
work=/tmp/eagle3
mkdir -p "$work" "$OUT"
export PYTHONUNBUFFERED=1
case "$stage" in
data)
    port=8200
    "$bin" serve --model /tmp/smollm2 --served-model-name smollm2-135m --device cuda \
        --port $port --max-num-seqs 256 --max-num-batched-tokens 8192 --max-model-len 2048 \
        >"$work/serve.log" 2>&1 &
    server=$!
    for _ in $(seq 1 360); do
        (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
        sleep 0.5
    done
    start=$(date +%s)
    python3 generate.py prompts/heldout.jsonl "$work/heldout.jsonl" --url http://127.0.0.1:$port \
        --concurrency 200 2>&1 | tee "$OUT/generate.log"
    python3 generate.py prompts/train.jsonl "$work/train.jsonl" --url http://127.0.0.1:$port \
        --variants greedy,sampled,hot --concurrency 256 --deadline "${EAGLE3_DEADLINE:-330}" 2>&1 | tee -a "$OUT/generate.log"
    echo "data stage: $(($(date +%s) - start)) s" | tee -a "$OUT/generate.log"
    kill $server
    wait $server
    tail -5 "$work/serve.log" >"$OUT/serve-tail.log"
    gzip -c "$work/heldout.jsonl" >"$OUT/heldout.jsonl.gz"
    gzip -c "$work/train.jsonl" >"$OUT/train.jsonl.gz"
    ;;
train)
    for f in heldout train; do
        if [ ! -s "$work/$f.jsonl" ] && [ -f "../../target/eagle3-data/$f.jsonl.gz" ]; then
            gunzip -c "../../target/eagle3-data/$f.jsonl.gz" >"$work/$f.jsonl"
        fi
    done
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())' | tee "$OUT/train.log"
    python3 train.py --target /tmp/smollm2 --data "$work/train.jsonl" --heldout "$work/heldout.jsonl" \
        --out "$work/head" --minutes "${EAGLE3_MINUTES:-7.6}" 2>&1 | tee -a "$OUT/train.log"
    mkdir -p "$OUT/head"
    cp "$work"/head/* "$OUT/head/"
    # The held-out prompts as Peregrine's bench spec dataset (the chat template applied).
    python3 - "$work/heldout.jsonl" "$work/heldout_bench.jsonl" <<'PY'
import json, sys
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained("/tmp/smollm2")
with open(sys.argv[2], "w") as f:
    for line in open(sys.argv[1]):
        r = json.loads(line)
        if r["variant"] == "greedy":
            f.write(json.dumps({"prompt": tok.decode(r["prompt_ids"]), "max_tokens": 256}) + "\n")
PY
    [ "${EAGLE3_BENCH:-1}" = 0 ] && exit 0
    for c in 1 8; do
        "$bin" bench spec --model /tmp/smollm2 --device cuda --speculative-method eagle3 \
            --draft-model "$work/head" --dataset "$work/heldout_bench.jsonl" \
            --num-prompts $((c == 1 ? 40 : 200)) --concurrency $c --output-len 256 2>&1 |
            tee -a "$OUT/bench_spec.log"
    done
    ;;
*)
    echo "unknown stage $stage" >&2
    exit 2
    ;;
esac
