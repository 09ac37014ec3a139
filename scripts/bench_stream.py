#!/usr/bin/env python3
"""`make bench-stream`: the streaming engine at several memory budgets, beside the same
prepared model run dense with every row in memory (`runtime run --strategy dense`), in one command.

Budgets: the engine's minimum (every sparse layer holds exactly K_max rows, the paper's
sizing), then 25/50/75% of the way to every row resident, then unlimited. Per budget: decode tok/s, bytes and rows read
per token, reuse, I/O wait / compute / predictor ms per token, peak RSS (`runtime bench`).
Writes bench/results/stream-<model>.json and .png.
"""
import argparse, json, re, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RT = str(ROOT / "target/release/runtime")
PROMPT = "The history of the printing press begins in the fifteenth century, when"


def sh(args):
    out = subprocess.run(args, capture_output=True, text=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    manifest = str(ROOT / f"artifacts/{a.model}/manifest.toml")
    probe = sh([RT, "bench", manifest, "--mem-budget", "1MiB", "-n", "1"])
    m = re.search(r"at least (\d+) bytes", probe.stderr)
    if not m:
        sys.exit(f"could not read the minimum budget: {probe.stderr}")
    minimum = int(m.group(1))
    # the plan with every row resident (no budget) bounds the useful range
    full = json.loads(sh([RT, "bench", manifest, "-n", "1", "--json"]).stdout)["planned_bytes"]
    budgets = [int(minimum + f * (full - minimum)) for f in (0.0, 0.25, 0.5, 0.75)] + [None]
    rows = []
    dense = []
    for rep in range(a.reps):
        d = sh([RT, "run", manifest, "--strategy", "dense", "-p", PROMPT, "-n", str(a.n), "--ignore-eos", "--threads", str(a.threads), "--ctx", "512", "--json"])
        if d.returncode != 0:
            sys.exit(d.stderr)
        dense.append(json.loads(d.stdout)["decode_tok_per_s"])
        for b in budgets:
            args = [RT, "bench", manifest, "-n", str(a.n), "--threads", str(a.threads), "--json"] + (["--mem-budget", str(b)] if b else [])
            r = sh(args)
            if r.returncode != 0:
                sys.exit(r.stderr)
            j = json.loads(r.stdout)
            j["budget"] = b
            j["rep"] = rep
            rows.append(j)
    med = lambda v: sorted(v)[len(v) // 2]
    dense_tps = med(dense)
    summary = []
    for b in budgets:
        rs = [r for r in rows if r["budget"] == b]
        s = {k: med([r[k] for r in rs]) for k in ["decode_tok_per_s", "bytes_read_per_token", "rows_read_per_token", "reuse_ratio",
                                                  "io_wait_ms_per_token", "compute_ms_per_token", "choose_ms_per_token", "peak_rss_bytes",
                                                  "read_bandwidth_bytes_per_s"]}
        s["budget_bytes"] = b
        s["planned_bytes"] = rs[0]["planned_bytes"]
        s["slots_per_layer_mean"] = sum(rs[0]["slots_per_layer"]) / len(rs[0]["slots_per_layer"])
        s["x_dense_in_memory"] = s["decode_tok_per_s"] / dense_tps
        summary.append(s)
        print(f"budget {('%.1f MiB' % (b / 2**20)) if b else 'unlimited':>12}: {s['decode_tok_per_s']:6.2f} tok/s ({s['x_dense_in_memory']:.2f}x dense), "
              f"{s['bytes_read_per_token']/1024:8.1f} KiB/token, reuse {s['reuse_ratio']:.3f}, I/O wait {s['io_wait_ms_per_token']:.2f} ms, "
              f"compute {s['compute_ms_per_token']:.2f} ms, choosing sets {s['choose_ms_per_token']:.2f} ms, peak RSS {s['peak_rss_bytes']/2**20:.0f} MiB")
    print(f"dense, every row in memory: {dense_tps:.2f} tok/s")
    res = {"model": a.model, "generated_tokens": a.n, "threads": a.threads, "reps": a.reps, "minimum_budget_bytes": minimum,
           "dense_in_memory_decode_tok_per_s": dense_tps, "budgets": summary, "runs": rows}
    out = ROOT / f"bench/results/stream-{a.model}.json"
    out.write_text(json.dumps(res, indent=2))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        xs = [(s["budget_bytes"] or s["planned_bytes"]) / 2**20 for s in summary]
        fig, ax = plt.subplots(1, 2, figsize=(10, 4))
        ax[0].plot(xs, [s["decode_tok_per_s"] for s in summary], "o-", label="streamed")
        ax[0].axhline(dense_tps, ls="--", c="gray", label="dense, all in memory")
        ax[0].set_xlabel("memory budget (MiB; last point: unlimited, at its plan)"); ax[0].set_ylabel("decode tok/s"); ax[0].legend()
        ax[1].plot(xs, [s["reuse_ratio"] for s in summary], "o-")
        ax[1].set_xlabel("memory budget (MiB)"); ax[1].set_ylabel("rows reused (hit rate)")
        fig.suptitle(f"{a.model}: streaming engine vs budget"); fig.tight_layout(); fig.savefig(out.with_suffix(".png"), dpi=100)
    except ImportError:
        pass
    print(f"-> {out}")


if __name__ == "__main__":
    main()
