#!/usr/bin/env bash
# Builds here (no GPU or CUDA install needed) what scripts/gpu_run.sh runs on the GPU
# machine: the `peregrine` binary and the GPU test binary, both with the `cuda` feature,
# stripped and gzipped into target/gpu-carry/ (carry that folder to the GPU machine).
# With --fault, also `peregrine-fault`: the binary with the draft-KV fault hook
# (`fault-hooks`), which the soak's fault run serves with.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/gpu-carry
rm -rf "$out"
mkdir -p "$out"
cargo build --release --features cuda --bin peregrine
tests=$(cargo test --release --features cuda --test cuda --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cuda" and m.get("executable"):
        print(m["executable"])')
strip -o "$out/peregrine" target/release/peregrine
strip -o "$out/cuda-tests" "$tests"
gzip -9 "$out/peregrine" "$out/cuda-tests"
if [ "${1:-}" = --fault ]; then
    cargo build --release --features cuda,fault-hooks --bin peregrine
    strip -o "$out/peregrine-fault" target/release/peregrine
    gzip -9 "$out/peregrine-fault"
    # The plain binary again, so that target/release holds the one the carry's names.
    cargo build --release --features cuda --bin peregrine
fi
ls -la "$out"
