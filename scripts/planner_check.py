#!/usr/bin/env python3
"""The planner's llama.cpp predictions against every llama.cpp run the frontier has measured.

For each frontier JSON (bench/results/frontier-*.json by default) and each llama.cpp setting in
it without a read throttle: the measured median decode tok/s and disk bytes re-read per token,
beside what `runtime plan --gguf` predicts today from --device, or from the device file the
run measured in its own hour (bench-frontier --probe) when it has one (with llama.cpp's compute calibrated
on the JSON's own unconfined runs when it has them, and its page-fault rate on its own run that
re-reads every per-token byte, as bench-frontier does; that run is listed, not counted) and the
prediction stored in the JSON when it was measured. A GGUF the JSON names but this checkout lacks
is made as bench-frontier makes it (llama-quantize --allow-requantize from the shipped file).

Re-read bytes per token: the run's disk reads less one whole read of the file (llama.cpp's load)
and the binary, over the decoded tokens plus the prompt pass.

Writes bench/results/planner-llama-cpp.{json,md}.
"""
import argparse, glob, json, statistics, sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_frontier as fr  # noqa: E402

ROOT = fr.ROOT
BINARY_BYTES = 21.1e6  # what an unconfined llama.cpp run reads beyond the GGUF (binary, libraries)


def manifest_of(model, named):
    """The JSON's preparation, or (gone since) any preparation of the same model: llama.cpp's
    prediction takes only the model's shape (its KV cache) from it."""
    if named.exists():
        return named
    for m in sorted(ROOT.glob("artifacts/*/manifest.toml")):
        if f'model_name = "{model}"' in m.read_text():
            return m
    sys.exit(f"planner-check: {named} is gone and no artifacts/*/manifest.toml prepares {model}")


def check(path, device):
    res = json.loads(Path(path).read_text())
    probed = ROOT / res.get("device_file", "")
    if res.get("device_probed") and probed.is_file():
        device = str(probed)  # measured in the run's own hour (bench-frontier --probe)
    model, manifest = res["model"], manifest_of(res["model"], ROOT / res["manifest"])
    ggufs = {q: fr.gguf_of(model, q) for q in res["ggufs"]}
    p = fr.plan_json(manifest, None, list(ggufs.values()), device, ctx=fr.edge.LLAMA_CTX)
    if p is None:
        sys.exit(f"planner-check: runtime plan failed on {manifest}")
    per_token = {Path(x["gguf"]).name: x["prediction"]["per_token_bytes"] for x in p["llama_cpp"]}
    files = {Path(x["gguf"]).name: x["prediction"]["file_bytes"] for x in p["llama_cpp"]}
    res["ggufs"] = {q: str(g) for q, g in ggufs.items()}
    cal = fr.llama_calibration(res, per_token)
    fault, fault_at = fr.llama_fault_calibration(res, manifest, device, cal)
    devf = fr.derived_device(device, None, cal, fault)
    rows = []
    for q, g in ggufs.items():
        for f in sorted({r["budget_fraction"] for r in res["runs"] if r["system"] == "llama.cpp" and r["quant"] == q}, key=lambda f: -(f or 9)):
            rs = fr.llama_runs(res, q, f)
            if not rs:
                continue
            limit = int(res["f16_bytes"] * f) if f else None
            pred = fr.plan_json(manifest, limit, [g], devf, ctx=fr.edge.LLAMA_CTX)["llama_cpp"][0]["prediction"]
            measured = statistics.median(r["decode_tok_per_s"] for r in rs)
            rereads = [max(r["disk_bytes_read"] - files[g.name] - BINARY_BYTES, 0) / (r["eval_runs"] + 1) for r in rs if r.get("disk_bytes_read") is not None and r.get("eval_runs")]
            old = rs[0].get("predicted_tok_per_s")
            rows.append({"frontier": Path(path).name, "model": model, "quant": q, "budget_fraction": f, "limit_bytes": limit, "reps": len(rs),
                         "decode_tok_per_s": measured, "reread_bytes_per_token": statistics.median(rereads) if rereads else None,
                         "predicted_tok_per_s": pred["predicted_tok_per_s"], "predicted_reread_bytes_per_token": pred["reread_bytes_per_token"],
                         "error": pred["predicted_tok_per_s"] / measured - 1, "stored_prediction": old, "stored_error": old / measured - 1 if old else None,
                         "llama_cpp_token_overhead_s": cal[0], "llama_cpp_decode_bytes_per_s": cal[1], "per_token_bytes": per_token[g.name], "room_bytes": pred["room_bytes"],
                         "device_file": str(Path(device).relative_to(ROOT)) if Path(device).is_relative_to(ROOT) else device,
                         "same_hour_device": bool(res.get("device_probed")), "llama_cpp_fault_read_bytes_per_s": fault,
                         "calibration": bool(fault_at and (fault_at["quant"], fault_at["budget_fraction"]) == (q, f))})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("frontiers", nargs="*", help="frontier JSONs (default: bench/results/frontier-*.json)")
    ap.add_argument("--device", default=str(ROOT / "devices/this-machine.toml"))
    ap.add_argument("--out", default=str(ROOT / "bench/results/planner-llama-cpp.json"))
    a = ap.parse_args()
    paths = a.frontiers or sorted(glob.glob(str(ROOT / "bench/results/frontier-*.json")))
    all_rows = [r for p in paths for r in check(p, a.device)]
    rows = [r for r in all_rows if not r["calibration"]]  # a calibration point predicts itself
    paging = [r for r in rows if r["predicted_reread_bytes_per_token"]]
    fits = [r for r in rows if not r["predicted_reread_bytes_per_token"]]
    within = lambda rs, k: sum(abs(r[k]) <= 0.15 for r in rs if r[k] is not None)  # noqa: E731
    med = lambda rs, k: statistics.median(abs(r[k]) for r in rs if r[k] is not None) if any(r[k] is not None for r in rs) else None  # noqa: E731
    summary = {"settings": len(rows), "device_file": str(Path(a.device).relative_to(ROOT)) if Path(a.device).is_relative_to(ROOT) else a.device}
    for name, rs in (("paging", paging), ("fits", fits)):
        summary[name] = {"settings": len(rs), "within_15_percent": within(rs, "error"), "median_abs_error": med(rs, "error"),
                         "stored_within_15_percent": within(rs, "stored_error"), "stored_median_abs_error": med(rs, "stored_error")}
    same = [r for r in rows if r["same_hour_device"]]
    summary["same_hour_device"] = {"settings": len(same), "within_15_percent": within(same, "error"), "median_abs_error": med(same, "error")}
    rr = [r["predicted_reread_bytes_per_token"] / r["reread_bytes_per_token"] - 1 for r in paging if r["reread_bytes_per_token"]]
    summary["paging"]["reread_median_abs_error"] = statistics.median(abs(x) for x in rr) if rr else None
    out = Path(a.out)
    out.write_text(json.dumps({"summary": summary, "rows": all_rows}, indent=1))
    lines = [f"llama.cpp: measured decode tok/s against the planner's prediction ({summary['device_file']}), per frontier JSON and setting (no throttle).",
             f"Paging settings: {summary['paging']['within_15_percent']}/{len(paging)} within 15% (median |error| {summary['paging']['median_abs_error'] or 0:.0%}; "
             f"re-read bytes {summary['paging']['reread_median_abs_error'] or 0:.0%}); as stored when measured: {summary['paging']['stored_within_15_percent']}/{len(paging)} "
             f"({summary['paging']['stored_median_abs_error'] or 0:.0%}). Settings that fit: {summary['fits']['within_15_percent']}/{len(fits)} "
             f"({summary['fits']['median_abs_error'] or 0:.0%}); stored {summary['fits']['stored_within_15_percent']}/{len(fits)}."
             + (f" With the device probed in the run's own hour (bench-frontier --probe): {summary['same_hour_device']['within_15_percent']}/{len(same)} "
                f"({summary['same_hour_device']['median_abs_error'] or 0:.0%})." if same else ""), "",
             "Each JSON's llama.cpp page-fault rate is calibrated on its own run that re-reads every per-token byte (marked 'calibration', not counted).", "",
             "| frontier | model | GGUF | budget | reps | measured tok/s | re-read MB/token | predicted tok/s (error) | predicted re-read MB | stored prediction (error) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in all_rows:
        budget = f"{r['budget_fraction']:.0%}" if r["budget_fraction"] else "none"
        reread = "" if r["reread_bytes_per_token"] is None else f"{r['reread_bytes_per_token'] / 1e6:.0f}"
        stored = f"{r['stored_prediction']:.2f} ({r['stored_error']:+.0%})" if r["stored_prediction"] else ""
        lines.append(f"| {r['frontier']} | {r['model']} | {r['quant']} | {budget} | {r['reps']} | {r['decode_tok_per_s']:.2f} | {reread} | "
                     f"{r['predicted_tok_per_s']:.2f} ({r['error']:+.0%}){' calibration' if r['calibration'] else ''} | {r['predicted_reread_bytes_per_token'] / 1e6:.0f} | {stored} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:2]))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
