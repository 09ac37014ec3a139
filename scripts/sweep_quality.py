#!/usr/bin/env python3
"""Quality of predicted-set sparsity against dense (issue #4's sweep), with the runtime itself.

For a prepared model (manifest.toml): dense, then the predictor's sets at every dense prefix d
in --d (d >= the prepared prefix: layers below d run dense, the same predictor serves the
rest); `d@s` also cuts every set to s x K_max (`--set-scale s`, what `--dense-prefix fit` picks
under the smallest budgets). Each point: HellaSwag acc_norm (`runtime eval`) and LAMBADA perplexity
(`runtime perplexity`), both `--in-memory` (the streaming engine over records.bin held in
memory: the same computation as a streamed run, tests check the same bits). Writes bench/results/quality-<name>.json and .png.
"""
import argparse, json, os, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RT = Path(os.environ.get("RUNTIME_BIN", ROOT / "target/release/runtime"))


def run(args):
    out = subprocess.run([str(RT), *args, "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"runtime {' '.join(args)} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def point(manifest, mode, limit, chunks, text):
    t0 = time.time()
    ev = run(["eval", manifest, "--task", "hellaswag", "--limit", str(limit), *mode])
    pp = run(["perplexity", manifest, "--text", text, "--chunks", str(chunks), *mode])
    sp = ev.get("sparsity") or {}
    return {"hellaswag_acc_norm": ev["accuracy"], "hellaswag_acc": ev["accuracy_unnormalized"], "items": ev["items"],
            "perplexity": pp["perplexity"], "sparse_layer_density": sp.get("sparse_layer_density"),
            "recall": sp.get("recall"), "top1": sp.get("top1_accuracy"), "neuron_rank": sp.get("neuron_rank"),
            "reuse_ratio": sp.get("reuse_ratio"), "slot_share": sp.get("slot_share"), "seconds": time.time() - t0}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--name", required=True)
    ap.add_argument("--d", default="", help="comma-separated dense prefixes, each optionally @set-scale and :set-rule, "
                    "and for the scorer /resident-bonus, e.g. 4,13,1@0.46,1@0.27:scorer,1@0.27:scorer/4 (default: the prepared one, soft8)")
    ap.add_argument("--limit", type=int, default=200, help="HellaSwag items")
    ap.add_argument("--chunks", type=int, default=4, help="perplexity chunks of 512")
    ap.add_argument("--text", default=str(ROOT / "data/text/lambada-500.txt"))
    ap.add_argument("--keep", action="store_true",
                    help="reuse the dense point and keep the other dense prefixes' rows of an existing quality-<name>.json "
                         "measured with the same items, chunks and manifest (the dense model does not change with the predictor)")
    ap.add_argument("--scorer-args", default="",
                    help="extra runtime flags for scorer points, e.g. '-X slot-share=0.5696' (the slots a 50%% budget gives)")
    a = ap.parse_args()
    out = ROOT / f"bench/results/quality-{a.name}.json"
    old = json.loads(out.read_text()) if a.keep and out.exists() else None
    if old and (old["hellaswag_items"], old["perplexity_chunks"]) != (a.limit, a.chunks):
        sys.exit(f"--keep: {out} was measured with {old['hellaswag_items']} items / {old['perplexity_chunks']} chunks, not {a.limit} / {a.chunks}")
    m = open(a.manifest).read()
    n_layers = int(next(l.split("=")[1] for l in m.splitlines() if l.startswith("num_hidden_layers")))
    d0 = int(next(l.split("=")[1] for l in m.splitlines() if l.startswith("dense_prefix")))
    def parse_point(x):
        x, _, rule = x.partition(":")
        rule, _, bonus = rule.partition("/")
        d, _, sc = x.partition("@")
        return int(d), float(sc) if sc else 1.0, rule or "soft8", float(bonus) if bonus else 1.0
    ds = [parse_point(x) for x in a.d.split(",") if x] or [(d0, 1.0, "soft8", 1.0)]
    dense = old["dense"] if old else point(a.manifest, ["--strategy", "dense"], a.limit, a.chunks, a.text)
    print(f"dense: acc_norm {dense['hellaswag_acc_norm']:.4f}, ppl {dense['perplexity']:.3f}", flush=True)
    import hashlib
    manifest_sha = hashlib.sha256(open(a.manifest, "rb").read()).hexdigest()
    # rows of other points stay (each carries the manifest it was measured with)
    rows = [r for r in (old or {}).get("sparse", [])
            if (r["dense_prefix"], r.get("set_scale", 1.0), r.get("set_rule", "soft8"), r.get("resident_bonus", 1.0)) not in ds
            or r.get("scorer_args", "") != a.scorer_args]
    for d, sc, rule, bonus in ds:
        mode = ["--in-memory", "--dense-prefix", str(d), "--set-scale", str(sc)]
        if rule == "scorer":
            # the scorer computes the logits from the Q8_0 head unless the args say -X head=f16
            mode += ["--strategy", "scorer", "-X", f"resident-bonus={bonus}", *a.scorer_args.split()]
        else:
            mode += ["--strategy", "predictor", "-X", f"set-rule={rule}"]
        p = point(a.manifest, mode, a.limit, a.chunks, a.text)
        p["dense_prefix"] = d
        p["set_scale"] = sc
        p["set_rule"] = rule
        if rule == "scorer":
            p["resident_bonus"] = bonus
            p["scorer_args"] = a.scorer_args
        p["manifest_sha256"] = manifest_sha
        p["sparse_layers"] = n_layers - d
        p["acc_ratio"] = p["hellaswag_acc_norm"] / dense["hellaswag_acc_norm"]
        p["ppl_ratio"] = p["perplexity"] / dense["perplexity"]
        # share of all MLP neurons skipped across the whole model
        p["model_mlp_sparsity"] = (n_layers - d) / n_layers * (1 - (p["sparse_layer_density"] or 1))
        rows.append(p)
        unit = f"n_ff (bonus {bonus})" if rule == "scorer" else "K_max"
        recall = f", recall {p['recall']:.3f}" if p["recall"] is not None else ""
        print(f"d={d} {rule} sets {sc:.2f} x {unit}: acc_norm {p['hellaswag_acc_norm']:.4f} ({p['acc_ratio']:.3f}x), ppl {p['perplexity']:.3f} "
              f"({p['ppl_ratio']:.3f}x), density {p['sparse_layer_density']:.3f}{recall}", flush=True)
    rows.sort(key=lambda r: (r.get("set_rule", "soft8"), r["dense_prefix"], -r.get("set_scale", 1.0)))
    res = {"model": a.name, "manifest": a.manifest, "hellaswag_items": a.limit, "perplexity_text": a.text,
           "perplexity_chunks": a.chunks, "dense": dense, "sparse": rows}
    out.write_text(json.dumps(res, indent=2))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        xs = [r["model_mlp_sparsity"] * 100 for r in rows]
        ax[0].plot(xs, [r["acc_ratio"] for r in rows], "o")
        ax[0].axhline(0.95, ls="--", c="gray")
        ax[0].set_xlabel("MLP neurons skipped, whole model (%)"); ax[0].set_ylabel("HellaSwag acc_norm / dense")
        ax[1].plot(xs, [r["ppl_ratio"] for r in rows], "o")
        ax[1].set_xlabel("MLP neurons skipped, whole model (%)"); ax[1].set_ylabel("perplexity / dense (LAMBADA)")
        for r, x in zip(rows, xs):
            lab = f"d={r['dense_prefix']}" + (f"@{r['set_scale']:.2f}" if r.get("set_scale", 1.0) != 1.0 else "") + (f":scorer/{r.get('resident_bonus', 1.0):g}" if r.get("set_rule") == "scorer" else "")
            ax[0].annotate(lab, (x, r["acc_ratio"])); ax[1].annotate(lab, (x, r["ppl_ratio"]))
        fig.suptitle(f"{a.name}: predicted sparsity vs dense ({a.limit} HellaSwag items)")
        fig.tight_layout(); fig.savefig(out.with_suffix(".png"), dpi=100)
    except ImportError:
        print("matplotlib missing: no PNG (pip install matplotlib)")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
