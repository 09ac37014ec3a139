#!/usr/bin/env bash
# A K_max variant of a prepared model for the sparsity sweep: reuses the capture of
# artifacts/<model>/ (copied with its stamp, so prepare skips it), reclusters with another
# k_max_factor, retrains the predictor, packs, and measures quality at the recipe's d.
# Usage: scripts/kmax_variant.sh <model> <k_max_factor> [hellaswag items] [ppl chunks]
set -euo pipefail
model=$1; f=$2; limit=${3:-150}; chunks=${4:-4}
src=artifacts/$model; out=artifacts/$model-kmax$f
mkdir -p $out
[ -d $out/capture ] || cp -r $src/capture $out/capture
for s in import capture; do [ -f $out/.stamp-$s.json ] || cp $src/.stamp-$s.json $out/.stamp-$s.json; done
sed -e "s|^out = .*|out = \"$out\"|" -e "s|^k_max_factor = .*|k_max_factor = $f|" -e "s|^name = .*|name = \"$model-kmax$f\"|" \
  pipelines/$model.toml > $out/recipe.toml
target/release/prep prepare $out/recipe.toml
python3 scripts/sweep_quality.py --manifest $out/manifest.toml --name $model-kmax$f --limit $limit --chunks $chunks
