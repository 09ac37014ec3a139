"""Chooses the mask kind by measurement: perplexity on held-out LAMBADA with oracle masks
(perfect prediction) of both kinds at the recipe's alpha, with no dense prefix and with the
recipe's dense prefix, against dense, all with `runtime perplexity -X oracle-thresholds=FILE`.
Thresholds come from `prep capture` on the calibration corpus (BoolQ + Shakespeare).
Writes bench/results/mask-kinds-<model>.json.
Usage: python3 scripts/mask_kinds.py [--model smollm2-135m] [--alpha 0.62] [--dense-prefix 19] [--chunks 16]
"""
import argparse, json, os, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
ap = argparse.ArgumentParser()
ap.add_argument("--model", default="smollm2-135m")
ap.add_argument("--alpha", type=float, default=0.62)
ap.add_argument("--dense-prefix", type=int, default=19)
ap.add_argument("--chunks", type=int, default=16)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
model = f"models/{args.model}"
work = f"artifacts/{args.model}/mask-kinds"
text = "data/text/lambada-500.txt"

def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

def ppl(extra):
    out = run(["target/release/runtime", "perplexity", model, "--text", text, "--ctx", "512", "--chunks", str(args.chunks),
               "--threads", str(args.threads), "--json"] + extra)
    return json.loads(out)

rows = []
dense = ppl([])
print(f"dense: {dense['perplexity']:.4f}", flush=True)
for kind in ["product", "gate-up"]:
    th_dir = f"{work}/{kind}"
    if not os.path.exists(f"{th_dir}/thresholds.json"):
        run(["target/release/prep", "capture", model, "--out", th_dir, "--corpus", "data/text/boolq.txt", "--corpus",
             "data/text/shakespeare", "--mask-kind", kind, "--alpha", str(args.alpha), "--sequences", "8",
             "--threshold-sequences", "8", "--json"])
    for d in [0, args.dense_prefix]:
        r = ppl(["-X", f"oracle-thresholds={th_dir}/thresholds.json", "--dense-prefix", str(d)])
        row = {"mask_kind": kind, "alpha": args.alpha, "dense_prefix": d, "perplexity": r["perplexity"],
               "ratio_to_dense": r["perplexity"] / dense["perplexity"],
               "sparse_layer_density": r["oracle_sparsity"]["sparse_layer_density"]}
        rows.append(row)
        print(f"{kind:8s} d={d:2d}: ppl {r['perplexity']:.4f} = {row['ratio_to_dense']:.3f}x dense, "
              f"density kept {row['sparse_layer_density']:.3f}", flush=True)
os.makedirs("bench/results", exist_ok=True)
res = {"model": args.model, "text": text, "chunks": args.chunks, "ctx": 512, "dense_perplexity": dense["perplexity"],
       "tokens_scored": dense["tokens_scored"], "oracle": rows}
with open(f"bench/results/mask-kinds-{args.model}.json", "w") as f:
    json.dump(res, f, indent=2)
print(f"-> bench/results/mask-kinds-{args.model}.json")
