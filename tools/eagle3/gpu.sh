#!/usr/bin/env bash
# The EAGLE-3 recipe's GPU stages for SmolLM2-135M-Instruct, run on the GPU machine by
# scripts/gpu_run.sh (which unpacks the peregrine binary and converts the default model's
# GGUF to /tmp/smollm2 first):
#   tools/eagle3/gpu.sh data BIN   serve the target with Peregrine on the GPU; have it write
#                                  prompts from the seeds (self_prompts.py, up to
#                                  $EAGLE3_SELF_COUNT in $EAGLE3_SELF_DEADLINE s); build the
#                                  sets with the registry collections' prompts carried in
#                                  $EAGLE3_PROMPTS (target/eagle3-prompts/; build_sets.py: train, the
#                                  held-back slice, the unseen evaluation set); collect the
#                                  target's answers to each (generate.py; the training set's
#                                  until $EAGLE3_DEADLINE s): /tmp/eagle3/*.jsonl, gzipped
#                                  into $OUT in parts under 15 MB, with each stage's time
#   tools/eagle3/gpu.sh train BIN  train the head (train.py, $EAGLE3_MINUTES minutes, 7.6 by
#                                  default, continuing from $EAGLE3_INIT if set) on
#                                  /tmp/eagle3, print its offline acceptance on the unseen
#                                  set and on the held-back slice side by side, write it to
#                                  $OUT/head, then run `bench spec` with it on the GPU
#                                  against no speculation (unless EAGLE3_BENCH=0)
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
    url=http://127.0.0.1:$port log="$OUT/generate.log"
    timed() { # STAGE COMMAND...: runs it, then logs its time
        local start=$(date +%s)
        "${@:2}" 2>&1 | tee -a "$log"
        echo "$1: $(($(date +%s) - start)) s" | tee -a "$log"
    }
    timed "self-written prompts" python3 self_prompts.py "$work/self.jsonl" --url $url \
        --count "${EAGLE3_SELF_COUNT:-30000}" --concurrency 256 \
        --deadline "${EAGLE3_SELF_DEADLINE:-150}"
    prompts=${EAGLE3_PROMPTS:-../../target/eagle3-prompts}
    timed "sets" python3 build_sets.py --out "$work/sets" --self "$work/self.jsonl" \
        --collections "$prompts/collections-train.jsonl.gz" \
        --unseen "$prompts/collections-eval.jsonl.gz" --templated prompts/train.jsonl
    cp "$work/sets/sources.json" "$OUT/"
    for set in unseen heldback; do
        timed "$set answers" python3 generate.py "$work/sets/$set.jsonl" "$work/$set.jsonl" \
            --url $url --variants greedy,sampled --concurrency 256
    done
    timed "training answers" python3 generate.py "$work/sets/train.jsonl" "$work/train.jsonl" \
        --url $url --variants greedy,sampled --concurrency 256 \
        --deadline "${EAGLE3_DEADLINE:-300}"
    kill $server
    wait $server
    tail -5 "$work/serve.log" >"$OUT/serve-tail.log"
    (cd "$work" && tar czf - self.jsonl sets unseen.jsonl heldback.jsonl train.jsonl) |
        split -b 15M -d - "$OUT/eagle3-data.tar.gz.part"
    ;;
train)
    # The answers: from the data stage on this machine, or carried back in its parts
    # (stashed by `scripts/gpu_run.sh stash` in /tmp/eagle3-data-parts, or in the tree).
    if [ ! -s "$work/train.jsonl" ]; then
        parts=(/tmp/eagle3-data-parts/eagle3-data.tar.gz.part*)
        [ -e "${parts[0]}" ] || parts=(../../target/eagle3-data*/eagle3-data.tar.gz.part*)
        cat "${parts[@]}" | tar xzf - -C "$work" || exit 1
    fi
    python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, torch.cuda.get_device_name())' | tee "$OUT/train.log"
    init=()
    [ -n "${EAGLE3_INIT:-}" ] && init=(--init "$EAGLE3_INIT")
    python3 train.py --target /tmp/smollm2 --data "$work/train.jsonl" --heldout "$work/unseen.jsonl" \
        --out "$work/head" --minutes "${EAGLE3_MINUTES:-7.6}" "${init[@]}" 2>&1 | tee -a "$OUT/train.log"
    mkdir -p "$OUT/head"
    cp "$work"/head/* "$OUT/head/"
    for set in unseen heldback; do
        echo "== offline acceptance, $set" | tee -a "$OUT/train.log"
        python3 evaluate.py --target /tmp/smollm2 --head "$work/head" --data "$work/$set.jsonl" \
            2>&1 | tee -a "$OUT/train.log"
    done
    # The held-out prompts as Peregrine's bench spec dataset (the chat template applied).
    python3 - "$work/unseen.jsonl" "$work/heldout_bench.jsonl" <<'PY'
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
