#!/usr/bin/env python3
"""`make bench-selectors MODEL=<name>`: how well each way of choosing a token's neurons does at
a set size, side by side (issue #17): perplexity on held-out text (`runtime perplexity
--in-memory`: the streaming engine over records.bin held in memory, slots of the set's size,
the first half of each chunk a dense prompt and the second half scored token by token, as a
streamed run computes it) at s = 15, 20, 25, 30% of n_ff, for

  layers   the per-layer predictors (nothing of the MLP resident but them)
  sketch   the resident gate and up rows at 2 bits a weight (about a third of the 4-bit MLP)
  scorer   the resident gate and up rows (two thirds of it; only down rows streamed)
  soft8    the shared predictor (NeuroPrefetcher's, after layer 0), sets cut to s x n_ff
  oracle   each token's exact largest |h| (the ceiling at that size)

and, with --hellaswag N, HellaSwag accuracy on N items at --hellaswag-share. Beside each
method, the bytes it keeps resident for the sparse layers. Dense first, as the reference.

Writes bench/results/selectors-<model>[-<tag>].json and .png.
"""
import argparse, json, os, subprocess, sys, tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RT = Path(os.environ.get("RUNTIME_BIN", ROOT / "target/release/runtime"))
METHODS = ["layers", "sketch", "scorer", "soft8", "oracle"]


def run(args):
    out = subprocess.run([str(RT), *args, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"runtime {' '.join(args)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def mode(method, share, k_max_mean, n_ff, prefix):
    if method == "soft8":
        # the shared predictor's sets are shares of K_max: cut them to share x n_ff on average
        return ["--strategy", "predictor", "--dense-prefix", str(prefix), "--set-scale", f"{min(1.0, share * n_ff / k_max_mean):.4f}"]
    if method == "oracle":
        return ["--strategy", "layers", "-X", "set-rule=oracle", "--dense-prefix", str(prefix), "--set-scale", str(share)]
    if method == "scorer":
        # the ranker itself (each token's top set), as the measurements in docs/RESULTS.md #17
        # part 1; the runtime's default also prefers the rows it holds (resident bonus 1.5)
        return ["--strategy", "scorer", "-X", "resident-bonus=1", "--dense-prefix", str(prefix), "--set-scale", str(share)]
    return ["--strategy", method, "--dense-prefix", str(prefix), "--set-scale", str(share)]


def plot(res, out):
    """Perplexity ratio and recall against set size, one line per method -> <out>.png."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for method in sorted({p['method'] for p in res['points']}, key=METHODS.index):
            pts = [p for p in res["points"] if p["method"] == method]
            axes[0].plot([p["share"] for p in pts], [p["perplexity_ratio"] for p in pts], marker="o", label=method)
            if pts and pts[0]["recall"] is not None:
                axes[1].plot([p["share"] for p in pts], [p["recall"] for p in pts], marker="o", label=method)
        axes[0].set(xlabel="set size (share of n_ff)", ylabel="perplexity / dense", title=f"{res['model']}: quality at a set size", yscale="log")
        axes[1].set(xlabel="set size (share of n_ff)", ylabel="recall of the oracle's set", title="recall")
        for ax in axes:
            ax.legend()
            ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=110)
    except ImportError:
        print("matplotlib missing: no PNG", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--shares", default="0.15,0.2,0.25,0.3")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--chunks", type=int, default=2, help="perplexity chunks of 512")
    ap.add_argument("--text", default=str(ROOT / "data/text/lambada-500.txt"))
    ap.add_argument("--dense-prefix", type=int, default=None, help="sparse layers from here (default: the preparation's dense prefix)")
    ap.add_argument("--hellaswag", type=int, default=0, help="HellaSwag items (0: none)")
    ap.add_argument("--hellaswag-share", type=float, default=0.25)
    ap.add_argument("--tag", default="", help="write selectors-<model>-<tag>.* (a separate grid)")
    ap.add_argument("--from-json", action="store_true", help="no runs: redraw the PNG from the JSON")
    a = ap.parse_args()
    if a.from_json:
        out = ROOT / f"bench/results/selectors-{a.model}{'-' + a.tag if a.tag else ''}.json"
        plot(json.loads(out.read_text()), out)
        return
    manifest = ROOT / f"artifacts/{a.model}/manifest.toml"
    m = tomllib.loads(manifest.read_text())
    n_ff = m["model"]["intermediate_size"]
    prefix = a.dense_prefix if a.dense_prefix is not None else m["sparsity"]["dense_prefix"]
    k_max = m["sparsity"]["k_max"][prefix - m["sparsity"]["dense_prefix"]:]
    k_max_mean = sum(k_max) / len(k_max)
    arts = {x["role"]: x for x in m["artifacts"]}
    n_sparse = m["model"]["num_hidden_layers"] - prefix
    n_prepared = m["model"]["num_hidden_layers"] - m["sparsity"]["dense_prefix"]
    # the papers' predictors exist only where the recipe has their [train] / [layers] sections
    needs = {"layers": "layer_predictors", "soft8": "predictor"}
    missing = [f"{x} (no {needs[x]} artifact)" for x in a.methods.split(",") if x in needs and needs[x] not in arts]
    if missing:
        sys.exit(f"{manifest}: cannot compare {', '.join(missing)}: add the recipe's [train] and [layers] sections, "
                 "rerun make prepare, or leave them out of --methods")
    per_layer = lambda role: arts[role]["bytes"] * n_sparse / n_prepared if role in arts else None
    resident = {  # bytes the method holds for the sparse layers (besides slots)
        "layers": per_layer("layer_predictors"),
        "sketch": per_layer("sketch"),
        "scorer": per_layer("scorer"),
        "soft8": arts["predictor"]["bytes"] + arts["centroids"]["bytes"] if "predictor" in arts else None,
        "oracle": None,
    }
    out = ROOT / f"bench/results/selectors-{a.model}{'-' + a.tag if a.tag else ''}.json"
    dense = run(["perplexity", str(manifest), "--text", a.text, "--chunks", str(a.chunks), "--strategy", "dense"])
    res = {"model": a.model, "text": os.path.relpath(a.text, ROOT), "chunks": a.chunks, "dense_prefix": prefix, "n_ff": n_ff,
           "dense_perplexity": dense["perplexity"], "resident_bytes": resident, "points": []}
    print(f"dense: perplexity {dense['perplexity']:.3f}", flush=True)
    if a.hellaswag:
        h = run(["eval", str(manifest), "--task", "hellaswag", "--limit", str(a.hellaswag), "--strategy", "dense"])
        res["dense_hellaswag"] = h["accuracy"]
        print(f"dense: HellaSwag {h['accuracy']:.3f} ({a.hellaswag} items)", flush=True)
    for share in [float(s) for s in a.shares.split(",")]:
        for method in a.methods.split(","):
            flags = ["--in-memory", *mode(method, share, k_max_mean, n_ff, prefix)]
            j = run(["perplexity", str(manifest), "--text", a.text, "--chunks", str(a.chunks), *flags])
            sp = j["sparsity"] or {}
            p = {"method": method, "share": share, "perplexity": j["perplexity"], "perplexity_ratio": j["perplexity"] / dense["perplexity"],
                 "recall": sp.get("recall") if method != "soft8" else None, "density": sp.get("sparse_layer_density"), "flags": flags}
            if a.hellaswag and abs(share - a.hellaswag_share) < 1e-9:
                h = run(["eval", str(manifest), "--task", "hellaswag", "--limit", str(a.hellaswag), *flags])
                p["hellaswag"] = h["accuracy"]
                p["hellaswag_ratio"] = h["accuracy"] / res["dense_hellaswag"]
            res["points"].append(p)
            rec = f", recall {p['recall']:.3f}" if p["recall"] is not None else ""
            hs = f", HellaSwag {p['hellaswag']:.3f} ({p['hellaswag_ratio']:.3f}x)" if "hellaswag" in p else ""
            print(f"s={share:.2f} {method:>7}: perplexity {p['perplexity']:.3f} ({p['perplexity_ratio']:.3f}x){rec}, density {p['density']:.3f}{hs}", flush=True)
            out.write_text(json.dumps(res, indent=2))
    plot(res, out)
    print(f"-> {out}")


if __name__ == "__main__":
    main()
