#!/usr/bin/env python3
"""How the set rule and the set size trade quality: LAMBADA perplexity (`runtime perplexity
--in-memory`, the streaming engine's sets) for each (dense prefix, set scale, set rule) point,
beside dense and the `static` baseline that ignores the predictor (the neurons most centroids
hold, the same every token) and the `oracle` ceiling (the truly largest |silu(g) * u| of each
token: what perfect ranking gives at that set size). A point's optional 4th field is the neuron
rank: importance (default: the preparation's per-neuron importance) or membership. Recall is
the share of truly active neurons (threshold masks) inside the kept set; density the share of a
sparse layer's neurons kept.

  python3 scripts/sweep_set_rules.py --manifest artifacts/qwen2.5-coder-1.5b/manifest.toml \
      --name qwen2.5-coder-1.5b --points 1@1.0:soft8,1@1.0:static,1@0.46:soft8,1@0.46:soft8:membership,1@0.46:oracle

Writes bench/results/set-rules-<name>.json.
"""
import argparse, json, os, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RT = Path(os.environ.get("RUNTIME_BIN", ROOT / "target/release/runtime"))


def ppl(manifest, text, chunks, mode):
    out = subprocess.run([str(RT), "perplexity", manifest, "--text", text, "--chunks", str(chunks), *mode, "--json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"runtime perplexity {' '.join(mode)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--points", required=True, help="comma-separated d@scale:rule[:rank], e.g. 1@0.46:soft8,1@0.46:soft8:membership,1@0.46:oracle")
    ap.add_argument("--chunks", type=int, default=2, help="perplexity chunks of 512")
    ap.add_argument("--text", default=str(ROOT / "data/text/lambada-500.txt"))
    a = ap.parse_args()
    dense = ppl(a.manifest, a.text, a.chunks, ["--strategy", "dense"])
    print(f"dense: perplexity {dense['perplexity']:.2f}", flush=True)
    rows = []
    out = ROOT / f"bench/results/set-rules-{a.name}.json"
    for p in a.points.split(","):
        d, rest = p.split("@")
        scale, rule, *rank = rest.split(":")
        rank = rank[0] if rank else "importance"
        j = ppl(a.manifest, a.text, a.chunks, ["--in-memory", "--strategy", "predictor", "--dense-prefix", d, "--set-scale", scale, "-X", f"set-rule={rule}", "-X", f"neuron-rank={rank}"])
        sp = j["sparsity"]
        row = {"dense_prefix": int(d), "set_scale": float(scale), "set_rule": rule, "neuron_rank": sp["neuron_rank"], "perplexity": j["perplexity"],
               "ppl_ratio": j["perplexity"] / dense["perplexity"], "sparse_layer_density": sp["sparse_layer_density"],
               "recall": sp["recall"], "top1": sp["top1_accuracy"], "seconds": j["seconds"]}
        rows.append(row)
        print(f"d={d} sets {float(scale):.2f} x K_max {rule:>7} by {row['neuron_rank']:>10}: perplexity {row['perplexity']:.2f} ({row['ppl_ratio']:.2f}x), "
              f"density {row['sparse_layer_density']:.3f}, recall {row['recall']:.3f}", flush=True)
        # written after every point, so an interrupted sweep keeps what it measured
        out.write_text(json.dumps({"model": a.name, "manifest": a.manifest, "perplexity_text": a.text, "perplexity_chunks": a.chunks,
                                   "dense_perplexity": dense["perplexity"], "points": rows}, indent=2))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
