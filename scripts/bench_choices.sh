#!/usr/bin/env bash
# `n` choices against as many separate requests: the same prompts served twice, each time by
# a fresh server, once as requests asking for N choices each (`bench serve --n N`) and once
# as N separate requests per prompt sent together (the dataset lists each prompt N times in
# a row). Prints output tokens/s and the prompt tokens the server computed (from its
# /metrics: prompt tokens less prefix-cache hits) for both.
#
#   scripts/bench_choices.sh [extra serve flags...]
# Env: PEREGRINE (binary, default target/release/peregrine), CHOICES (N, default 4),
# PROMPTS (distinct prompts, default 8), WORDS (words per prompt, default 400), OUTPUT
# (tokens per choice, default 64), CHOICES_BENCH_OUT (results, default
# target/choices-bench).
set -euo pipefail
cd "$(dirname "$0")/.."
peregrine=${PEREGRINE:-target/release/peregrine}
n=${CHOICES:-4}
prompts=${PROMPTS:-8}
out=${CHOICES_BENCH_OUT:-target/choices-bench}
mkdir -p "$out"
python3 - "$out" "$n" "$prompts" "${WORDS:-400}" "${OUTPUT:-64}" <<'PY'
import json, random, sys
out, n, prompts, words, output = sys.argv[1], *map(int, sys.argv[2:])
rng = random.Random(0)
vocab = ("river stone cloud market engine letter garden window paper signal orange "
         "winter harbor silver theory camera planet violin desert ladder").split()
lines = [{"prompt": " ".join(rng.choice(vocab) for _ in range(words)), "max_tokens": output,
          "ignore_eos": True, "temperature": 0.8} for _ in range(prompts)]
with open(f"{out}/once.jsonl", "w") as f:
    f.writelines(json.dumps(line) + "\n" for line in lines)
with open(f"{out}/repeated.jsonl", "w") as f:
    f.writelines(json.dumps(line) + "\n" for line in lines for _ in range(n))
PY
port=8132
url="http://127.0.0.1:$port"
# Serves, runs `bench serve` with the arguments given, stops the server.
run() { # name bench-args...
  local name=$1
  shift
  "$peregrine" serve --port "$port" "${SERVE_FLAGS[@]}" >"$out/serve-$name.log" 2>&1 &
  local server=$!
  for _ in $(seq 120); do curl -sf "$url/health" >/dev/null && break; sleep 1; done
  "$peregrine" bench serve --url "$url" "$@" --result-file "$out/$name.json" >"$out/$name.txt"
  kill $server
  wait $server 2>/dev/null || true
  printf '%-10s %s; %s\n' "$name" \
    "$(grep 'Output token throughput' "$out/$name.txt" | tr -s ' ')" \
    "$(grep 'Prompt tokens computed' "$out/$name.txt" | tr -s ' ')"
}
SERVE_FLAGS=("$@")
run "n$n" --dataset "$out/once.jsonl" --num-prompts "$prompts" --concurrency "$prompts" --n "$n"
run separate --dataset "$out/repeated.jsonl" --num-prompts $((prompts * n)) \
  --concurrency $((prompts * n))
