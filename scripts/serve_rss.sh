#!/usr/bin/env bash
# Resident memory of `peregrine serve` with the default model: idle once it answers
# /health, then after a load of `bench serve` (16 prompts of 128 tokens, 64 out, 8 at a
# time). Extra arguments go to `serve`, e.g. `scripts/serve_rss.sh --kv-cache-memory 1GiB`.
# Needs a release build (target/release/peregrine) and the default model (fetched on first
# use).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/peregrine
port=${PORT:-18123}
log=$(mktemp)
"$bin" serve --port "$port" "$@" >"$log" 2>&1 &
pid=$!
trap 'kill $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 300); do
    curl -sf "localhost:$port/health" >/dev/null && break
    kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
    sleep 1
done
sleep 2
grep -m1 "KV pool" "$log" || true
echo "serve $*: idle $(grep VmRSS /proc/$pid/status)"
"$bin" bench serve --url "http://localhost:$port" --num-prompts 16 --concurrency 8 \
    --input-len 128 --output-len 64 >/dev/null
echo "serve $*: after the load $(grep -E 'VmRSS|VmHWM' /proc/$pid/status | tr -s '\t\n' '  ')"
