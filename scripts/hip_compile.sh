#!/usr/bin/env bash
# Compiles every GPU kernel module as HIP for an AMD GPU (device code only), to keep the
# kernels portable: there is no HIP backend yet, but kernels/cuda/ is written to compile as
# HIP through the CUDA-to-HIP branch of kernels/cuda/common.cuh. Each module is one
# translation unit exactly as the runtime hands it to NVRTC (kernels/src/cuda/mod.rs
# MODULES, runtime/src/cuda/compiler.rs): common.cuh, a newline, then the module's .cu
# files in order. Prints each module's name and stops at the first that fails. The code
# objects go to a temporary folder that is removed afterwards.
#
#   scripts/hip_compile.sh
# Env: HIPCC (the compiler; default hipcc on PATH, else /usr/bin/hipcc, Debian's `hipcc`
# package, ROCm 5.2), HIP_ARCH (default gfx90a, the MI200 series: 64-lane wavefronts).
set -euo pipefail
cd "$(dirname "$0")/.."

hipcc=${HIPCC:-$(command -v hipcc || echo /usr/bin/hipcc)}
if [ ! -x "$hipcc" ]; then
  echo "hip_compile: no hipcc found (not on PATH, no /usr/bin/hipcc); install Debian's" \
    "hipcc package (apt-get install hipcc) or set HIPCC" >&2
  exit 1
fi
arch=${HIP_ARCH:-gfx90a}

# The modules of MODULES, one a line: the name, then its files under kernels/cuda/.
modules=$(awk '
  /^pub const MODULES/ { on = 1; next }
  on && /^\];/ { on = 0 }
  on && match($0, /name: "[^"]+"/) {
    if (line != "") print line
    line = substr($0, RSTART + 7, RLENGTH - 8)
  }
  on && match($0, /"\.\.\/\.\.\/cuda\/[^"]+"/) { line = line " " substr($0, RSTART + 12, RLENGTH - 13) }
  END { if (line != "") print line }
' kernels/src/cuda/mod.rs)
if [ -z "$modules" ]; then
  echo "hip_compile: found no modules in kernels/src/cuda/mod.rs (MODULES)" >&2
  exit 1
fi
# Every kernel source belongs to a module (else neither NVRTC nor this would compile it).
for path in kernels/cuda/*.cu; do
  if ! grep -qwF -- "$(basename "$path")" <<<"$modules"; then
    echo "hip_compile: $path is in no module of kernels/src/cuda/mod.rs (MODULES)" >&2
    exit 1
  fi
done

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
while read -r name files; do
  echo "hip_compile: $name ($arch)"
  # #line markers make errors name the real file and line; they go only where a line
  # starts anyway, so the text the compiler sees is otherwise NVRTC's.
  {
    printf '#line 1 "kernels/cuda/common.cuh"\n'
    cat kernels/cuda/common.cuh
    printf '\n'
    prev=kernels/cuda/common.cuh
    for file in $files; do
      if [ -z "$(tail -c 1 "$prev")" ]; then printf '#line 1 "kernels/cuda/%s"\n' "$file"; fi
      cat "kernels/cuda/$file"
      prev=kernels/cuda/$file
    done
  } >"$tmp/$name.hip"
  "$hipcc" -x hip -std=c++17 --offload-arch="$arch" --cuda-device-only --no-gpu-bundle-output \
    -c "$tmp/$name.hip" -o "$tmp/$name.co" </dev/null
done <<<"$modules"
echo "hip_compile: every module compiled for $arch"
