#!/usr/bin/env python3
"""`make bench-edge MODEL=<name>`: the paper's main experiment on an emulated edge device.

llama.cpp (`make baseline`, computing from its mmap) and our streaming runtime run side by
side, each confined the same way: a memory limit (cgroup v1 memory.limit_in_bytes, or v2
memory.max) and a read-bandwidth throttle on the disk holding the files (v1
blkio.throttle.read_bps_device, or v2 io.max). Page cache dropped before every run; systems
interleaved; medians over --reps. 128 tokens generated after a held-out (LAMBADA) prompt
(--n-confined: fewer in the confined settings, for both systems, where llama.cpp needs
seconds to minutes per token). Ours runs with `--dense-prefix fit`: the most dense layers the
budget (90% of the limit) allows, below the all-sparse minimum the largest share of K_max per
set that fits, and beside each setting its quality at that prefix and set scale (from
bench/results/quality-<model>.json; `make bench-quality D=<prefix>@<scale>` when missing),
bytes read per token, reuse and the latency breakdown; llama.cpp's major page faults per token
(/usr/bin/time -v). Every group and throttle is removed afterwards, also on Ctrl-C or SIGTERM.

Writes bench/results/edge-<model>.json, .png and .md (the README table).
"""
import argparse, tomllib, atexit, json, os, re, signal, statistics, subprocess, sys, time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RT = str(ROOT / "target/release/runtime")
LLAMA = str(ROOT / "baseline/bin/llama-completion")
LLAMA_CTX = 1024  # llama.cpp's -c in every confined run (its KV cache; the planner is told the same)
CREATED = []  # group directories to remove


def cleanup(*_):
    for d in reversed(CREATED):
        for _ in range(50):
            try:
                # a run still inside (the harness was interrupted): kill it, then remove the
                # group (a group's throttle goes with it)
                procs = Path(d, "cgroup.procs")
                if procs.exists():
                    for pid in procs.read_text().split():
                        try:
                            os.kill(int(pid), signal.SIGKILL)
                        except (OSError, ValueError):
                            pass
                os.rmdir(d)
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)
    CREATED.clear()


def on_signal(sig, _frame):
    cleanup()
    sys.exit(128 + sig)


ACCOUNTING_ONLY_BPS = 1 << 50  # 1 PiB/s: a read rule that never throttles (Groups, v1)


class Groups:
    """A memory group and an I/O group (v1), or one v2 group with both controllers."""

    def __init__(self, name, mem_bytes, read_bps, dev):
        self.v2 = not Path("/sys/fs/cgroup/memory").is_dir() and Path("/sys/fs/cgroup/cgroup.controllers").exists()
        if self.v2:
            g = Path("/sys/fs/cgroup") / name
            g.mkdir(); CREATED.append(str(g))
            (g / "memory.max").write_text(str(mem_bytes) if mem_bytes else "max")
            if read_bps:
                (g / "io.max").write_text(f"{dev} rbps={read_bps}")
            self.procs = [g / "cgroup.procs"]
            self.mem_dir = g
        else:
            m = Path("/sys/fs/cgroup/memory") / name
            b = Path("/sys/fs/cgroup/blkio") / name
            m.mkdir(); CREATED.append(str(m))
            b.mkdir(); CREATED.append(str(b))
            if mem_bytes:
                (m / "memory.limit_in_bytes").write_text(str(mem_bytes))
                sw = m / "memory.memsw.limit_in_bytes"
                if sw.exists():
                    sw.write_text(str(mem_bytes))
            # without a throttle, a rule no disk reaches: blk-throttle counts a group's reads
            # (blkio.throttle.io_service_bytes) only on a queue where some rule is set, so an
            # unthrottled run would read 0 bytes (seen on kernel 6.18)
            (b / "blkio.throttle.read_bps_device").write_text(f"{dev} {read_bps or ACCOUNTING_ONLY_BPS}")
            self.procs = [m / "cgroup.procs", b / "cgroup.procs"]
            self.mem_dir = m
            self.io_dir = b
        self.dev = dev

    def bytes_read(self):
        """Bytes the group read from the throttled disk (v1 blkio.throttle.io_service_bytes, v2 io.stat)."""
        try:
            if self.v2:
                for line in (self.mem_dir / "io.stat").read_text().splitlines():
                    if line.startswith(self.dev + " "):
                        return int(re.search(r"rbytes=(\d+)", line).group(1))
                return 0
            for line in (self.io_dir / "blkio.throttle.io_service_bytes").read_text().splitlines():
                if line.startswith(self.dev + " Read "):
                    return int(line.split()[2])
            return None  # not accounted: no line for the device
        except (OSError, AttributeError):
            return None

    def wrap(self, cmd):
        joins = "; ".join(f"echo $$ > {p}" for p in self.procs)
        return ["sh", "-c", f'{joins}; exec "$@"', "sh", "/usr/bin/time", "-v", *cmd]


def prerequisites(gguf, manifest, llama=True):
    errors = []
    if os.geteuid() != 0:
        errors.append("run as root (cgroups and drop_caches)")
    if not (Path("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() or Path("/sys/fs/cgroup/cgroup.controllers").exists()):
        errors.append("no cgroup v1 memory controller at /sys/fs/cgroup/memory and no cgroup v2 at /sys/fs/cgroup")
    if Path("/sys/fs/cgroup/memory").is_dir() and not Path("/sys/fs/cgroup/blkio").is_dir():
        errors.append("no cgroup v1 blkio controller at /sys/fs/cgroup/blkio")
    needs = [(RT, "make build"), (manifest, "make prepare"), ("/usr/bin/time", "apt-get install time")]
    if llama:
        needs += [(LLAMA, "make baseline"), (gguf, "make baseline (F16 GGUF)")]
    for p, why in needs:
        if not Path(p).exists():
            errors.append(f"{p} missing ({why})")
    if errors:
        sys.exit(f"{Path(sys.argv[0]).stem.replace('_', '-')}: prerequisites missing:\n  " + "\n  ".join(errors))


def device_of(path):
    src = subprocess.run(["df", "--output=source", str(path)], capture_output=True, text=True).stdout.split()[-1]
    name = Path(src).name
    for cand in [name, re.sub(r"p?\d+$", "", name)]:
        dev = Path("/sys/block") / cand / "dev"
        if dev.exists():
            return dev.read_text().strip()
    sys.exit(f"bench-edge: cannot find the block device of {path} ({src})")


def drop_caches():
    subprocess.run(["sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"], check=False)


def parse_time(stderr):
    faults = re.search(r"Major \(requiring I/O\) page faults: (\d+)", stderr)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", stderr)
    return (int(faults.group(1)) if faults else None, int(rss.group(1)) * 1024 if rss else None)


def repacks(gguf, limit):
    """Whether llama.cpp as it ships runs with its weight repacking (its default) under `limit`:
    repacking copies the weights it repacks into anonymous memory, so below the file's size (plus
    a KV cache and compute buffers) it cannot fit and llama.cpp runs `-nr`, as a user would."""
    return limit is None or limit >= Path(gguf).stat().st_size + (64 << 20)


def run_llama(g, gguf, prompt_file, n, threads, timeout, limit=None):
    """llama.cpp as it ships (baseline/bin), its default OpenMP threads; `-nr` where repacking's
    copy of the weights cannot fit `limit`."""
    cmd = [LLAMA, "-m", gguf, "-f", prompt_file, "-n", str(n), "--temp", "0", "--ignore-eos", "-no-cnv", "--simple-io",
           "-t", str(threads), "-c", str(LLAMA_CTX), "--no-warmup"] + ([] if repacks(gguf, limit) else ["-nr"])
    t0 = time.time()
    try:
        out = subprocess.run(g.wrap(cmd), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"timed_out": True, "seconds": timeout, "decode_tok_per_s": None}
    p = re.search(r"prompt eval time =\s*([\d.]+) ms /\s*(\d+) tokens", out.stderr)
    m = re.search(r"\seval time =\s*([\d.]+) ms /\s*(\d+) runs.*?([\d.]+) tokens per second", out.stderr)
    faults, rss = parse_time(out.stderr)
    if out.returncode != 0 or not m:
        return {"failed": True, "returncode": out.returncode, "stderr_tail": out.stderr[-600:], "seconds": time.time() - t0}
    runs = int(m.group(2))
    # from the eval time and run count: llama.cpp prints tokens per second to 2 decimals only
    # (0.02 tok/s at 50 MiB/s would be +-25%)
    prompt_ms, prompt_tokens = (float(p.group(1)), int(p.group(2))) if p else (None, None)
    return {"decode_tok_per_s": runs / (float(m.group(1)) / 1000) if float(m.group(1)) > 0 else float(m.group(3)),
            "prompt_tok_per_s": prompt_tokens / (prompt_ms / 1000) if prompt_ms else None, "prompt_tokens": prompt_tokens,
            # a chat turn: the prompt, then the reply
            "chat_turn_s": (prompt_ms + float(m.group(1))) / 1000 if prompt_ms is not None else None,
            "repack": "-nr" not in cmd, "eval_ms": float(m.group(1)), "eval_runs": runs, "major_faults": faults, "major_faults_per_token": faults / max(runs, 1) if faults is not None else None,
            "peak_rss_bytes": rss, "seconds": time.time() - t0}


def mode_flags(set_rule, resident_bonus, head_q8):
    """runtime's flags for a set rule: --strategy, and the -X research knobs it needs."""
    if set_rule == "scorer":
        flags = ["--strategy", "scorer"] + ([] if head_q8 else ["-X", "head=f16"])
        # (always given: the runtime's default changed from 1 to 1.5, and the rows record it)
        return flags + ["-X", f"resident-bonus={resident_bonus}"]
    if set_rule in ("layers", "sketch"):
        # the whole-record strategies (issue #17): their sets are shares of n_ff, as the scorer's;
        # their default head is the 4-bit one (head_compact)
        return ["--strategy", set_rule] + (["-X", "head=q8"] if head_q8 else [])
    return ["--strategy", "predictor"] + (["-X", f"set-rule={set_rule}"] if set_rule != "soft8" else []) + (["-X", "head=q8"] if head_q8 else [])


def uses_head_q8(args, rule):
    """Whether a quality row's runtime flags computed the logits from the Q8_0 head (old rows:
    --head-q8; newer: the scorer's default unless -X head=f16, or -X head=q8)."""
    if "--head-q8" in args or "head=q8" in args:
        return True
    return rule == "scorer" and "--strategy" in args and "head=f16" not in args


def slot_share_of(args):
    """The --in-memory slot share a quality row simulated (old: --slot-share C; newer: -X slot-share=C)."""
    if "--slot-share" in args:
        return float(args[args.index("--slot-share") + 1])
    return next((float(x.split("=", 1)[1]) for x in args if x.startswith("slot-share=")), None)


def run_bench(g, cmd, timeout):
    """One `runtime bench ... --json` inside group `g`: its JSON (without the text) with the
    major faults, peak RSS (/usr/bin/time) and seconds; or why there is none (timed out,
    refused below the plan's minimum, failed)."""
    t0 = time.time()
    try:
        out = subprocess.run(g.wrap(cmd), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"timed_out": True, "seconds": timeout, "decode_tok_per_s": None}
    faults, rss = parse_time(out.stderr)
    if out.returncode != 0:
        m = re.search(r"at least (\d+) bytes", out.stderr)
        return {"refused" if m else "failed": True, "minimum_budget_bytes": int(m.group(1)) if m else None,
                "stderr_tail": out.stderr[-600:], "decode_tok_per_s": None, "seconds": time.time() - t0}
    j = json.loads(out.stdout.strip().splitlines()[-1])
    j.pop("text", None)
    j.update({"major_faults": faults, "peak_rss_bytes_time": rss, "seconds": time.time() - t0})
    return j


def chat_turn_s(j):
    """A chat turn's time from `runtime bench --json`: its prompt, then its reply."""
    if not (j.get("prefill_tok_per_s") and j.get("decode_tok_per_s")):
        return None
    return j["prompt_tokens"] / j["prefill_tok_per_s"] + j["generated_tokens"] / j["decode_tok_per_s"]


def prompt_file_for(a, name):
    """The prompt of every run: --prompt-file (default bench/prompt-512.txt, 511 tokens of prose:
    a chat turn's prompt), or the first --prompt-chars characters of the held-out LAMBADA text,
    written to a file of this invocation's own."""
    if not a.prompt_chars:
        return str(ROOT / a.prompt_file)
    path = ROOT / f"target/{name}-prompt-{os.getpid()}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(open(ROOT / "data/text/lambada-500.txt").read()[:a.prompt_chars])
    atexit.register(lambda: path.unlink(missing_ok=True))
    return str(path)


def run_ours(g, manifest, budget, prompt_file, n, threads, timeout, set_rule, resident_bonus, set_scale, head_q8):
    cmd = [RT, "bench", manifest, "--mem-budget", str(budget), "--dense-prefix", "fit", "-n", str(n), "--prompt-file", prompt_file,
           "--ctx", str(LLAMA_CTX), "--threads", str(threads), *mode_flags(set_rule, resident_bonus, head_q8), "--set-scale", str(set_scale), "--json"]
    j = run_bench(g, cmd, timeout)
    if j.get("decode_tok_per_s") is None:
        return j
    # runtime bench calls it dense_prefix since issue #15; this script's rows keep dense_from
    j.setdefault("dense_from", j.get("dense_prefix"))
    j["prompt_tok_per_s"], j["chat_turn_s"] = j.get("prefill_tok_per_s"), chat_turn_s(j)
    j["major_faults_per_token"] = j["major_faults"] / max(j["generated_tokens"] + j["prompt_tokens"], 1) if j["major_faults"] is not None else None
    return j


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--fractions", default="0.4,0.5,0.6,0.75,none", help="memory limits as fractions of the F16 model size")
    ap.add_argument("--throttles", default="none,200,50", help="read throttles in MiB/s")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--n-confined", default=None,
                    help="tokens to generate (both systems) where a memory limit or a throttle applies (default: -n); "
                         "'16,50:4' = 16, but 4 at the 50 MiB/s throttle")
    ap.add_argument("--prompt-file", default="bench/prompt-512.txt", help="the prompt of every run (default: 511 tokens, a chat turn's)")
    ap.add_argument("--prompt-chars", type=int, default=None, help="instead: this many characters of the held-out LAMBADA text")
    ap.add_argument("--from-json", action="store_true",
                    help="no runs: rebuild the table, PNG and markdown from the runs in edge-<model>.json (e.g. after bench-quality)")
    ap.add_argument("--tag", default="", help="write edge-<model>-<tag>.* instead of edge-<model>.* (a separate grid, e.g. one throttle)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--set-rule", default="soft8", help="ours: how sets are chosen (soft8: the predictor; scorer: the 4-bit gate/up scorer; layers: the per-layer predictors; sketch: the resident 2-bit gate/up sketch)")
    ap.add_argument("--resident-bonus", type=float, default=1.5, help="ours, with --set-rule scorer: the weight of rows already in memory (the runtime's default, 1.5)")
    ap.add_argument("--set-scale", type=float, default=1.0, help="ours: the largest set scale fit may pick (with the scorer: the share "
                    "of n_ff each layer must hold per token; the rest of the budget becomes slots that also count)")
    ap.add_argument("--head-q8", action="store_true", help="ours: logits from the Q8_0 head (half the f16 head's memory goes to slots)")
    ap.add_argument("--gguf", default=None,
                    help="llama.cpp's GGUF (default baseline/<model>-f16.gguf), e.g. the shipped 4-bit one; limits stay fractions of the F16 size")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per run before it counts as timed out")
    a = ap.parse_args()
    f16_gguf = str(ROOT / f"baseline/{a.model}-f16.gguf")
    gguf = a.gguf or f16_gguf
    manifest = str(ROOT / f"artifacts/{a.model}/manifest.toml")
    prerequisites(f16_gguf, manifest)
    if not Path(gguf).exists():
        sys.exit(f"bench-edge: {gguf} missing")
    n_ff = tomllib.loads(Path(manifest).read_text())["model"]["intermediate_size"]
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)
    atexit.register(cleanup)
    model_bytes = Path(f16_gguf).stat().st_size
    dev = device_of(ROOT / "artifacts")
    if device_of(gguf) != dev:
        print(f"note: the GGUF and the records are on different devices; throttling {dev} and {device_of(gguf)}")
    # one prompt file per invocation: a second bench-edge (or --from-json) must not rewrite the
    # prompt under a running grid
    prompt_file = None if a.from_json else prompt_file_for(a, "bench-edge")
    fractions = [None if f == "none" else float(f) for f in a.fractions.split(",")]
    throttles = [None if t == "none" else int(t) for t in a.throttles.split(",")]
    qpath = ROOT / f"bench/results/quality-{a.model}.json"
    qrows = json.loads(qpath.read_text()) if qpath.exists() else {"sparse": [], "hellaswag_items": None}

    def quality_at(d, scale, rank, rule, bonus, slot_share=None):
        # rows measured before `prep importance` carry no neuron_rank: they ranked by membership;
        # rows without a set_rule are soft8; scorer rows carry their resident bonus and the slots
        # they simulated (`--slot-share`, else as many as the set), which must match the run's
        def same(r):
            if r["dense_prefix"] != d or abs(r.get("set_scale", 1.0) - scale) >= 0.005 or r.get("set_rule", "soft8") != rule:
                return False
            if rule == "scorer":
                args = r.get("scorer_args", "").split()
                held = slot_share_of(args) or r.get("set_scale", 1.0)
                return (abs(r.get("resident_bonus", 1.0) - bonus) < 1e-6 and uses_head_q8(args, rule) == a.head_q8
                        and r.get("eviction", "heat") == "heat"  # the runtime's eviction (rows measured with LRU are kept for the record)
                        and (slot_share is None or abs(min(held, 1.0) - min(slot_share, 1.0)) < 0.01))
            return (r.get("neuron_rank") or "membership") == rank
        row = next((r for r in qrows["sparse"] if same(r)), None)
        if row is None:
            return None
        return {"dense_prefix": d, "set_scale": scale, "set_rule": rule, "resident_bonus": bonus if rule == "scorer" else None,
                "neuron_rank": rank, "ppl_ratio": row["ppl_ratio"], "hellaswag_acc_ratio": row["acc_ratio"],
                "hellaswag_items": qrows["hellaswag_items"], "model_mlp_sparsity": row.get("model_mlp_sparsity")}
    n_default, n_by_throttle = a.n, {}
    for part in (a.n_confined or "").split(","):
        if ":" in part:
            t, v = part.split(":")
            n_by_throttle[int(t)] = int(v)
        elif part:
            n_default = int(part)
    runs = []
    out = ROOT / f"bench/results/edge-{a.model}{'-' + a.tag if a.tag else ''}.json"
    if a.from_json:
        prev = json.loads(out.read_text())
        runs = prev["runs"]
        fractions = sorted({r["memory_fraction"] for r in runs}, key=lambda f: f or 9)
        throttles = sorted({r["throttle_mib_s"] for r in runs}, key=lambda t: -(t or 1e9))
        a.reps, a.n, a.n_confined, a.threads = prev["reps"], prev["generated_tokens"], prev.get("generated_tokens_confined"), prev["threads"]
        a.set_rule, a.resident_bonus = prev.get("set_rule", "soft8"), prev.get("resident_bonus", 1.0)
        a.set_scale, a.head_q8 = prev.get("set_scale", 1.0), prev.get("head_q8", False)
    for rep in range(0 if a.from_json else a.reps):
        for th in throttles:
            for fr in fractions:
                limit = int(model_bytes * fr) if fr else None
                n = n_by_throttle.get(th, n_default) if (fr or th) else a.n
                for system in ("llama.cpp", "runtime"):
                    name = f"np-edge-{os.getpid()}"
                    g = Groups(name, limit, th * 2**20 if th else None, dev)
                    drop_caches()
                    try:
                        if system == "llama.cpp":
                            r = run_llama(g, gguf, prompt_file, n, a.threads, a.timeout, limit)
                        else:
                            budget = int(limit * 0.9) if limit else 64 * 2**30
                            r = run_ours(g, manifest, budget, prompt_file, n, a.threads, a.timeout, a.set_rule, a.resident_bonus, a.set_scale, a.head_q8)
                            r["budget_bytes"] = budget
                        r["disk_bytes_read"] = g.bytes_read()
                        if r["disk_bytes_read"] is not None and r.get("decode_tok_per_s"):
                            r["disk_bytes_read_per_generated_token"] = r["disk_bytes_read"] / n
                    finally:
                        cleanup()
                    r.update({"system": system, "memory_fraction": fr, "memory_limit_bytes": limit, "throttle_mib_s": th, "rep": rep, "tokens_asked": n})
                    runs.append(r)
                    tps = r.get("decode_tok_per_s")
                    status = (f"{tps:.2f} tok/s" + (f" (layers {r['dense_from']}.. sparse, sets {r.get('set_scale', 1.0):.2f} x {'n_ff' if a.set_rule == 'scorer' else 'K_max'})" if "dense_from" in r else "")) if tps else ("refused: needs %.0f MiB" % (r["minimum_budget_bytes"] / 2**20) if r.get("refused") else
                                                           "timed out" if r.get("timed_out") else "failed")
                    print(f"rep {rep} throttle {th or '-':>4} limit {('%.2f' % fr) if fr else 'none':>5} {system:<10} {status}", flush=True)
    # medians per setting
    table = []
    for th in throttles:
        for fr in fractions:
            row = {"memory_fraction": fr, "memory_limit_bytes": int(model_bytes * fr) if fr else None, "throttle_mib_s": th}
            for system in ("llama.cpp", "runtime"):
                rs = [r for r in runs if r["system"] == system and r["memory_fraction"] == fr and r["throttle_mib_s"] == th]
                ok = [r["decode_tok_per_s"] for r in rs if r.get("decode_tok_per_s")]
                key = "llama_cpp" if system == "llama.cpp" else "runtime"
                row[key] = statistics.median(ok) if ok else None
                for k in ("prompt_tok_per_s", "chat_turn_s"):
                    v = [r[k] for r in rs if r.get(k)]
                    row[f"{key}_{k}"] = statistics.median(v) if v else None
                for k in ("disk_bytes_read", "disk_bytes_read_per_generated_token"):
                    v = [r[k] for r in rs if r.get(k) is not None and r.get("decode_tok_per_s")]
                    row[f"{key}_{k}"] = statistics.median(v) if v else None
                if system == "llama.cpp":
                    mf = [r["major_faults_per_token"] for r in rs if r.get("major_faults_per_token") is not None]
                    row["llama_cpp_major_faults_per_token"] = statistics.median(mf) if mf else None
                else:
                    for k in ("bytes_read_per_token", "reuse_ratio", "io_wait_ms_per_token", "compute_ms_per_token", "choose_ms_per_token",
                              "sparse_mlp_ms_per_token", "io_busy_ms_per_token", "major_faults_per_token", "peak_rss_bytes", "dense_from", "set_scale",
                              "computed_rows_per_token", "requests_per_token"):
                        v = [r[k] for r in rs if r.get(k) is not None]
                        row[f"runtime_{k}"] = statistics.median(v) if v else None
                    ref = [r for r in rs if r.get("refused")]
                    row["runtime_refused_minimum_bytes"] = ref[0]["minimum_budget_bytes"] if ref else None
                    ranks = [r.get("neuron_rank") or ("membership" if "set_rule" not in r else None) for r in rs if r.get("dense_from") is not None]
                    row["runtime_neuron_rank"] = ranks[0] if ranks else None
                    row["runtime_set_rule"] = a.set_rule
                    row["runtime_resident_bonus"] = a.resident_bonus if a.set_rule == "scorer" else None
                    shares = [r["slots_per_layer"][0] / n_ff for r in rs if r.get("slots_per_layer")]
                    row["runtime_slot_share"] = statistics.median(shares) if shares else None
                    row["runtime_quality"] = (quality_at(int(row["runtime_dense_from"]), row.get("runtime_set_scale") or 1.0, row["runtime_neuron_rank"],
                                                         a.set_rule, a.resident_bonus, row["runtime_slot_share"] if a.set_rule == "scorer" else None)
                                              if row["runtime_dense_from"] is not None else None)
            row["speedup"] = row["runtime"] / row["llama_cpp"] if row["runtime"] and row["llama_cpp"] else None
            table.append(row)
    for row in table:
        row["where_the_time_goes"] = explain(row)
    res = {"model": a.model, "f16_model_bytes": model_bytes, "device": dev, "generated_tokens": a.n, "generated_tokens_confined": a.n_confined or a.n,
           "llama_cpp_gguf": os.path.relpath(gguf, ROOT), "threads": a.threads, "reps": a.reps, "set_rule": a.set_rule, "resident_bonus": a.resident_bonus, "set_scale": a.set_scale, "head_q8": a.head_q8,
           "goal": goal(table), "settings": table, "runs": runs}
    out.write_text(json.dumps(res, indent=2))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 5))
        for th in throttles:
            for key, style in (("llama_cpp", "--"), ("runtime", "-")):
                pts = [(r["memory_fraction"] or 1.25, r[key]) for r in table if r["throttle_mib_s"] == th and r[key]]
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", label=f"{key} {'%d MiB/s' % th if th else 'unthrottled'}")
            for r in table:
                if r["throttle_mib_s"] == th and r["speedup"]:
                    q = r.get("runtime_quality")
                    lab = f"{r['speedup']:.1f}x" + (f" (HS {q['hellaswag_acc_ratio']:.2f}x)" if q and th is None else "")
                    ax.annotate(lab, (r["memory_fraction"] or 1.25, r["runtime"]), fontsize=8)
        ax.set_yscale("log"); ax.set_xlabel("memory limit / F16 model size (1.25 = unlimited)"); ax.set_ylabel("decode tok/s (ours annotated: speedup, HellaSwag x dense)")
        ax.legend(fontsize=8); ax.set_title(f"{a.model}: decode under memory limits and read throttles")
        fig.tight_layout(); fig.savefig(out.with_suffix(".png"), dpi=100)
    except ImportError:
        pass
    md = markdown(res)
    out.with_suffix(".md").write_text(md)
    print(md)
    print(f"-> {out}")


def goal(table):
    """Issue #6's goal: at 50% of the F16 size, >= 12x llama.cpp's decode with HellaSwag >= 95% of dense."""
    pts = []
    for r in table:
        if r["memory_fraction"] == 0.5:
            q = r.get("runtime_quality") or {}
            acc = q.get("hellaswag_acc_ratio")
            pts.append({"throttle_mib_s": r["throttle_mib_s"], "speedup": r["speedup"], "hellaswag_acc_ratio": acc,
                        "speed_met": bool(r["speedup"] and r["speedup"] >= 12), "quality_met": bool(acc and acc >= 0.95)})
    return {"memory_fraction": 0.5, "speedup_needed": 12.0, "hellaswag_acc_ratio_needed": 0.95, "at_50_percent": pts,
            "met": any(p["speed_met"] and p["quality_met"] for p in pts) if pts else None}


def explain(row):
    """One line: where a setting's time goes, and what stops ours where it does not run."""
    if row["runtime"] is None:
        m = row.get("runtime_refused_minimum_bytes")
        if m:
            return (f"ours refused: even with every layer after the prepared dense prefix sparse and sets cut to 0.25 x K_max it needs "
                    f"{m / 2**20:.0f} MiB (resident embeddings/head/attention + slots + process) > {0.9 * (row['memory_limit_bytes'] or 0) / 2**20:.0f} MiB budget")
        return "ours did not finish"
    ms = 1000 / row["runtime"]
    io, comp, pred = (row.get(f"runtime_{k}_ms_per_token") or 0 for k in ("io_wait", "compute", "predictor"))
    parts = [f"ours {ms:.0f} ms/token: compute {comp:.0f} (sparse MLPs {row.get('runtime_sparse_mlp_ms_per_token') or 0:.0f}), "
             f"waiting for rows {io:.0f}, predictor {pred:.1f}; {(row.get('runtime_bytes_read_per_token') or 0) / 2**20:.1f} MiB read per token, "
             f"reuse {row.get('runtime_reuse_ratio') or 0:.2f}, layers {row.get('runtime_dense_from')}.. sparse, sets {row.get('runtime_set_scale') or 1.0:.2f} x "
             + ("n_ff (4-bit scorer; 'predictor' = scoring)" if row.get("runtime_set_rule") == "scorer" else "K_max")]
    if row["llama_cpp"]:
        parts.append(f"llama.cpp {1000 / row['llama_cpp']:.0f} ms/token, {row.get('llama_cpp_major_faults_per_token') or 0:.0f} major faults per token, "
                     f"{(row.get('llama_cpp_disk_bytes_read') or 0) / 2**20:.0f} MiB read from disk in the whole run")
    return "; ".join(parts)


def tps(v):
    """tok/s with 3 significant digits below 0.1 (llama.cpp at 50 MiB/s: 0.0173)."""
    return f"{v:.2f}" if v >= 0.1 else f"{v:.3g}"


def markdown(res):
    lines = [f"| limit (of {res['f16_model_bytes'] / 2**20:.0f} MiB F16) | read throttle | llama.cpp tok/s on {Path(res.get('llama_cpp_gguf', 'the F16 GGUF')).name} (major faults/token; MiB read in the run) | ours tok/s | speedup | prompt tok/s and a chat turn's s: llama.cpp / ours | "
             f"ours: layers sparse from (set size x {'n_ff' if res.get('set_rule') == 'scorer' else 'K_max'}), MiB read/token, reuse, I/O wait ms/token | ours quality: perplexity / HellaSwag vs dense |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["settings"]:
        lim = f"{r['memory_fraction'] * 100:.0f}% ({r['memory_limit_bytes'] / 2**20:.0f} MiB)" if r["memory_fraction"] else "none"
        th = f"{r['throttle_mib_s']} MiB/s" if r["throttle_mib_s"] else "none"
        ll = (f"{tps(r['llama_cpp'])} ({r['llama_cpp_major_faults_per_token'] or 0:.0f}; {(r.get('llama_cpp_disk_bytes_read') or 0) / 2**20:,.0f})"
              if r["llama_cpp"] else "did not finish")
        if r["runtime"]:
            ours = tps(r["runtime"])
            det = (f"{r['runtime_dense_from']} ({r.get('runtime_set_scale') or 1.0:.2f}), {(r['runtime_bytes_read_per_token'] or 0) / 2**20:.1f}, {r['runtime_reuse_ratio'] or 0:.2f}, "
                   f"{r['runtime_io_wait_ms_per_token'] or 0:.0f}")
            q = r.get("runtime_quality")
            qual = f"{q['ppl_ratio']:.2f}x / {q['hellaswag_acc_ratio']:.2f}x" if q else "not measured"
        else:
            m = r.get("runtime_refused_minimum_bytes")
            ours, det, qual = (f"refused (needs {m / 2**20:.0f} MiB)" if m else "failed"), "", ""
        sp = f"{r['speedup']:.1f}x" if r["speedup"] else ""
        axis = lambda k, f: f.format(r[k]) if r.get(k) else "?"  # noqa: E731
        turn = (f"{axis('llama_cpp_prompt_tok_per_s', '{:.1f}')} / {axis('runtime_prompt_tok_per_s', '{:.1f}')} tok/s; "
                f"{axis('llama_cpp_chat_turn_s', '{:.1f}')} / {axis('runtime_chat_turn_s', '{:.1f}')} s")
        lines.append(f"| {lim} | {th} | {ll} | {ours} | {sp} | {turn} | {det} | {qual} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
