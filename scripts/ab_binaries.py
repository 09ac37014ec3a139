#!/usr/bin/env python3
"""Before/after of a change: two runtime binaries, each with its own mode flags (the CLI may
differ between them), run `runtime bench` alternately under one cgroup memory limit (and an
optional read throttle), the page cache dropped before every run. Prints the medians of the
prompt's tok/s, decode tok/s and a chat turn's time (the prompt, then -n tokens) and their
ratios b/a, and writes bench/results/ab-<tag>.json. With --llama GGUF, llama.cpp as it ships
(bench_edge.run_llama: its default threads, -nr where repacking cannot fit the limit) runs on
that file as a third side each rep, in the same group, and the ratios against it are printed
too. Reuses bench_edge.py's cgroup v1/v2 handling, page-cache drop and cleanup (root).

  python3 scripts/ab_binaries.py --manifest artifacts/qwen2.5-coder-1.5b/manifest.toml \\
      --limit-mib 1698 --tag issue15 \\
      --a "/tmp/runtime-old --set-rule scorer --set-scale 0.25 --head-q8 --dense-from fit" \\
      --b "target/release/runtime --strategy scorer"
"""
import argparse, atexit, json, os, shlex, signal, statistics, subprocess, sys, time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_edge as be  # noqa: E402

ROOT = be.ROOT


def run(g, side, manifest, budget, n, prompt_file, threads, timeout):
    binary, *flags = shlex.split(side)
    cmd = [binary, "bench", manifest, "--mem-budget", str(budget), "-n", str(n), "--prompt-file", prompt_file, "--threads", str(threads), *flags, "--json"]
    be.drop_caches()
    t0 = time.time()
    try:
        out = subprocess.run(g.wrap(cmd), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"timed_out": True, "decode_tok_per_s": None}
    faults, rss = be.parse_time(out.stderr)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed:\n{out.stderr[-2000:]}")
    j = json.loads(out.stdout.strip().splitlines()[-1])
    keep = ["prompt_tokens", "prefill_tok_per_s", "decode_tok_per_s", "bytes_read_per_token", "rows_read_per_token", "reuse_ratio", "io_wait_ms_per_token", "choose_ms_per_token",
            "sparse_mlp_ms_per_token", "set_rule", "set_scale", "head_q8", "peak_rss_bytes"]
    r = {k: j.get(k) for k in keep}
    r.update({"dense_prefix": j.get("dense_prefix", j.get("dense_from")), "major_faults": faults, "time_peak_rss_bytes": rss,
              "seconds": time.time() - t0, "text": j.get("text"),
              "chat_turn_s": j["prompt_tokens"] / j["prefill_tok_per_s"] + n / j["decode_tok_per_s"]})
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--manifest", required=True)
    ap.add_argument("--limit-mib", type=int, required=True, help="the cgroup memory limit; both sides get --mem-budget 90%% of it")
    ap.add_argument("--throttle", type=int, default=None, help="read throttle in MiB/s (default none)")
    ap.add_argument("--a", required=True, help="'BINARY FLAGS...': the baseline side")
    ap.add_argument("--b", required=True, help="'BINARY FLAGS...': the changed side")
    ap.add_argument("--llama", default=None, help="a GGUF: llama.cpp as it ships runs on it as a third side")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--prompt-chars", type=int, default=200)
    ap.add_argument("--prompt-file", default=None, help="the prompt (default: --prompt-chars of LAMBADA)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--tag", required=True)
    a = ap.parse_args()
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, be.on_signal)
    atexit.register(be.cleanup)
    prompt_file = a.prompt_file or str(ROOT / f"target/ab-prompt-{os.getpid()}.txt")
    if not a.prompt_file:
        Path(prompt_file).write_text(open(ROOT / "data/text/lambada-500.txt").read()[:a.prompt_chars])
        atexit.register(lambda: Path(prompt_file).unlink(missing_ok=True))
    limit = a.limit_mib << 20
    dev = be.device_of(Path(a.manifest).resolve().parent)
    g = be.Groups(f"np-ab-{os.getpid()}", limit, a.throttle << 20 if a.throttle else None, dev)
    runs = {"a": [], "b": []} | ({"llama": []} if a.llama else {})
    for rep in range(a.reps):
        for side in runs:
            if side == "llama":
                be.drop_caches()
                r = be.run_llama(g, a.llama, prompt_file, a.n, a.threads, a.timeout, limit=limit)
                if r.get("failed") or r.get("timed_out"):
                    sys.exit(f"llama.cpp on {a.llama} did not finish: {r}")
                r["prefill_tok_per_s"] = r["prompt_tok_per_s"]
                r["rep"] = rep
                runs[side].append(r)
                print(f"rep {rep + 1} llama.cpp{'' if r['repack'] else ' -nr'}: prompt {r['prompt_tokens']} tokens {r['prefill_tok_per_s']:.1f} tok/s, "
                      f"chat turn {r['chat_turn_s']:.1f} s, decode {r['decode_tok_per_s']:.2f} tok/s, peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
                continue
            r = run(g, getattr(a, side), a.manifest, int(limit * 0.9), a.n, prompt_file, a.threads, a.timeout)
            r["rep"] = rep
            runs[side].append(r)
            print(f"rep {rep + 1} {side}: prompt {r['prompt_tokens']} tokens {r['prefill_tok_per_s']:.1f} tok/s, chat turn {r['chat_turn_s']:.1f} s, "
                  f"decode {r['decode_tok_per_s']:.2f} tok/s, {r['bytes_read_per_token'] / 2**20:.2f} MiB read/token, "
                  f"reuse {r['reuse_ratio']:.3f}, peak RSS {r['peak_rss_bytes'] / 2**20:.0f} MiB", flush=True)
    medians = {k: {side: statistics.median(r[k] for r in rs) for side, rs in runs.items()}
               for k in ("prefill_tok_per_s", "decode_tok_per_s", "chat_turn_s")}
    med = medians["decode_tok_per_s"]
    ratio = med["b"] / med["a"]
    for k, v in medians.items():
        print(f"median {k}: a {v['a']:.2f}, b {v['b']:.2f}: b/a = {v['b'] / v['a']:.2f}x")
        if a.llama:
            # a chat turn: llama.cpp's time over ours (> 1: ours is faster); the rates: ours over its
            versus = {s: (v["llama"] / v[s] if k == "chat_turn_s" else v[s] / v["llama"]) for s in ("a", "b")}
            print(f"  llama.cpp {v['llama']:.2f}: a {versus['a']:.2f}x, b {versus['b']:.2f}x of it")
    print(f"(limit {a.limit_mib} MiB, budget 90% of it, throttle {a.throttle or 'none'}, {a.reps} reps alternated)")
    out = ROOT / f"bench/results/ab-{a.tag}.json"
    out.write_text(json.dumps({"manifest": a.manifest, "limit_mib": a.limit_mib, "throttle_mib_per_s": a.throttle, "n": a.n,
                               "prompt_chars": a.prompt_chars, "prompt_file": a.prompt_file, "threads": a.threads, "a": a.a, "b": a.b, "llama_gguf": a.llama,
                               "runs": runs, "medians": medians, "median_decode_tok_per_s": med, "ratio_b_over_a": ratio}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
