#!/usr/bin/env bash
# Makes here (with PyPI reachable) the llama.cpp source that `scripts/gpu_run.sh llamacpp`
# builds on the GPU machine, which reaches no registry: the llama.cpp tree vendored in the
# newest llama-cpp-python sdist (or LLAMACPP_PYTHON_VERSION's), stripped of what building
# llama-bench and llama-batched-bench (tools/) with CUDA and converting a Hugging Face
# checkpoint (convert_hf_to_gguf.py, conversion/, gguf-py/) do not need: docs, media, the
# vocab files under models/, tests, examples, the server and its web UI, the other GGML
# backends, CI files. Writes target/llamacpp/llama.cpp.tar.gz (a few MB; target/ is
# ignored by git): carry target/llamacpp with the call. The tree's CMake is configured
# with tests, examples, the server and the app off (gpu_run.sh does), so their folders
# are not needed; SOURCE.txt in the tree names the sdist it came from.
#
#   scripts/llamacpp_source.sh [--check]
#
# --check: also configure the stripped tree here (CPU only, with gpu_run.sh's options
# less CUDA's) and build llama-bench and llama-batched-bench with it, a check of the
# stripping (about 10 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/llamacpp
# The sdist, the unpacked tree and the --check build, beside $out, which travels whole.
work=target/llamacpp-work
rm -rf "$work"
mkdir -p "$work/sdist" "$out"
# A binary pack a GPU call sent back belongs to the tree it replaces.
rm -f "$out/llama.cpp.tar.gz" "$out/llamacpp-bin.tar.gz"
spec=llama-cpp-python${LLAMACPP_PYTHON_VERSION:+==$LLAMACPP_PYTHON_VERSION}
python3 -m pip download --no-binary :all: --no-deps "$spec" -d "$work/sdist"
sdist=$(ls "$work"/sdist/llama_cpp_python-*.tar.gz)
tar -xzf "$sdist" -C "$work" --wildcards '*/vendor/llama.cpp/*'
tree=$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp)
mv "$tree" "$work/llama.cpp"
tree=$work/llama.cpp
(
    cd "$tree"
    # Not part of any build or conversion.
    rm -rf docs media tests examples pocs app benches ci skills scripts grammars \
        .devops .github .gemini .pi .git .gitmodules .gitignore .dockerignore .clang-* .ecrc \
        .editorconfig .flake8 .pre-commit-config.yaml flake.nix build-xcframework.sh \
        AGENTS.md CLAUDE.md CODEOWNERS CONTRIBUTING.md SECURITY.md AUTHORS \
        convert_hf_to_gguf_update.py convert_llama_ggml_to_gguf.py convert_lora_to_gguf.py
    # The vocab GGUF files and their test inputs (tests only); the folder stays.
    [ -d models ] && find models -mindepth 1 -delete
    # The server, its web UI and CLI (built only with LLAMA_BUILD_SERVER, off here).
    rm -rf tools/server tools/ui tools/cli
    # GGML backends other than CPU and CUDA (each added only when its GGML_<NAME> is on).
    for b in cann et hexagon metal musa opencl openvino sycl virtgpu vulkan webgpu zdnn zendnn; do
        rm -rf "ggml/src/ggml-$b"
    done
    find . -name '*.swift' -delete
    find . -name '__pycache__' -type d -prune -exec rm -rf {} +
)
echo "llama.cpp from $(basename "$sdist") (vendor/llama.cpp)," \
    "stripped by scripts/llamacpp_source.sh" >"$tree/SOURCE.txt"
tar -C "$work" -czf "$out/llama.cpp.tar.gz" llama.cpp
ls -la "$out/llama.cpp.tar.gz"
if [ "${1:-}" = --check ]; then
    cmake -S "$tree" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DGGML_NATIVE=ON -DGGML_CCACHE=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
    cmake --build "$work/build" -j"$(nproc)" --target llama-bench llama-batched-bench
    "$work/build/bin/llama-bench" --help | head -3
fi
