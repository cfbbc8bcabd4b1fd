#!/usr/bin/env bash
# Constrained against unconstrained output tokens/s through `bench serve`, at concurrency 1
# and 8, on one server: the same chat prompts constrained to a JSON schema (each runs until
# its JSON is complete: `list`, whose keys and punctuation the grammar forces, and `prose`,
# one long string masked at every token) and free (as many tokens as the constrained ones
# averaged, past end-of-sequence). Also the mask time per row from /metrics.
#
#   scripts/structured/bench_constrained.sh [extra serve flags...]
# Needs target/release/peregrine (cargo build --release; PEREGRINE names another binary) and
# the default model (or --model among the flags). Results go to target/structured-bench
# (STRUCTURED_BENCH_OUT names another folder).
set -euo pipefail
cd "$(dirname "$0")/../.."
peregrine=${PEREGRINE:-target/release/peregrine}
out=${STRUCTURED_BENCH_OUT:-target/structured-bench}
mkdir -p "$out"
python3 scripts/structured/make_bench_datasets.py --out "$out" >/dev/null
port=8131
"$peregrine" serve --port "$port" "$@" >"$out/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
url="http://127.0.0.1:$port"
bench() { # name concurrency dataset
  "$peregrine" bench serve --url "$url" --num-prompts 40 --concurrency "$2" \
    --dataset "$3" --result-file "$out/$1-c$2.json" >"$out/$1-c$2.txt"
}
# Warm the grammar cache and the model once.
bench warmup 8 "$out/list.jsonl"
bench warmup 8 "$out/prose.jsonl"
for schema in list prose; do
  for c in 1 8; do
    bench "$schema" "$c" "$out/$schema.jsonl"
    mean=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(round(r['total_output_tokens']/r['completed']))" "$out/$schema-c$c.json")
    python3 scripts/structured/make_bench_datasets.py --out "$out/free-$schema-$c" --max-tokens "$mean" >/dev/null
    bench "free-$schema" "$c" "$out/free-$schema-$c/free.jsonl"
    for run in "$schema" "free-$schema"; do
      printf '%-12s c=%s  %s\n' "$run" "$c" "$(grep 'Output token throughput' "$out/$run-c$c.txt")"
    done
  done
done
curl -s "$url/metrics" | grep -E '^peregrine:grammar_(mask_seconds|forced|cache)' >"$out/metrics.txt"
python3 - "$out/metrics.txt" <<'PY'
import re, sys
buckets, count = [], 0
for line in open(sys.argv[1]):
    m = re.match(r'peregrine:grammar_mask_seconds_bucket\{le="([^"]+)"\} (\d+)', line)
    if m and m.group(1) != "+Inf":
        buckets.append((float(m.group(1)), int(m.group(2))))
    m = re.match(r'peregrine:grammar_mask_seconds_count (\d+)', line)
    if m:
        count = int(m.group(1))
def quantile(q):
    want, low, seen = q * count, 0.0, 0
    for le, cum in buckets:
        if cum >= want:
            inside = (want - seen) / max(cum - seen, 1)
            return low + inside * (le - low)
        low, seen = le, cum
    return float("inf")
print("masks: %d; p50 %.0f us, p99 %.0f us (interpolated within histogram buckets)"
      % (count, quantile(0.5) * 1e6, quantile(0.99) * 1e6))
for line in open(sys.argv[1]):
    if line.startswith(("peregrine:grammar_forced", "peregrine:grammar_cache")):
        print(line.strip())
PY
