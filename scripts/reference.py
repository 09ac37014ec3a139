"""Checks the runtime's dense path against llama.cpp (the independent reference).

1. Perplexity (llama-perplexity protocol, ctx 512) on a Shakespeare play and on LAMBADA passages:
   ours on models/smollm2-135m vs llama-perplexity on the F16 GGUF of the same weights, plus
   token counts (ours vs llama-tokenize).
   llama-perplexity runs twice: as it defaults (`-fa auto`: its CPU flash attention, whose running
   sum of values is f16) and with `-fa off` (an f16 KV cache and f32 sums, as ours).
2. Greedy 32-token continuations of 3 fixed prompts: ours vs llama-completion at temperature 0.
   Where they differ, the first differing step and our top-2 logit margin there.

Writes bench/results/reference-<model>.json and prints a table.
Usage: python3 scripts/reference.py [--model smollm2-135m|qwen2.5-coder-1.5b|qwen2.5-coder-0.5b] [--chunks N] [--threads T]
       [--gguf G --model-dir D]   (another pair: e.g. a `prep import --dtype native` directory and
                                   the GGUF it was imported from, so both compute on the same blocks)
(the Qwen models need `make setup-large`; their F16 GGUF is made with llama-quantize on first use)
"""
import argparse, json, os, re, subprocess, sys, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.chdir(ROOT)
ap = argparse.ArgumentParser()
ap.add_argument("--chunks", type=int, default=40, help="chunks of 512 tokens per text (both tools)")
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--model", default="smollm2-135m")
ap.add_argument("--gguf", help="the reference GGUF (default: baseline/<model>-f16.gguf)")
ap.add_argument("--model-dir", help="our model directory (default: models/<model>)")
ap.add_argument("--tolerance", type=float, default=0.01, help="largest relative perplexity difference that passes (1%%; 0.1%% for the same blocks)")
args = ap.parse_args()

GGUF = args.gguf or f"baseline/{args.model}-f16.gguf"
MODEL = args.model_dir or f"models/{args.model}"
if not args.gguf and not os.path.exists(GGUF) and os.path.exists(f"data/downloads/{args.model}.gguf"):
    subprocess.run(["baseline/bin/llama-quantize", "--allow-requantize", f"data/downloads/{args.model}.gguf", GGUF, "F16"],
                   capture_output=True, check=True)
RUNTIME = "target/release/runtime"
TEXTS = {"hamlet": "data/text/hamlet.txt", "lambada-500": "data/text/lambada-500.txt"}
PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "To be, or not to be, that is the question:",
]
for p in [GGUF, MODEL, RUNTIME]:
    if not os.path.exists(p):
        sys.exit(f"reference: {p} is missing: run `make setup && make baseline` first")

def run(cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=True)

def llama_ppl(path, fa):
    ll = run(["baseline/bin/llama-perplexity", "-m", GGUF, "-f", path, "-c", "512", "-t", str(args.threads), "--chunks", str(args.chunks), "-fa", fa])
    return float(re.search(r"Final estimate: PPL = ([0-9.]+)", ll.stdout + ll.stderr).group(1))

report = {"model": MODEL, "reference_gguf": GGUF, "threads": args.threads, "ctx": 512, "perplexity": [], "greedy": []}
for name, path in TEXTS.items():
    # both of llama.cpp's attention paths (the module docstring); the seconds are their mean
    t0 = time.time()
    ll_ppl, ll_ppl_fa_off = (llama_ppl(path, fa) for fa in ("auto", "off"))
    ll_s = (time.time() - t0) / 2
    ids = run(["baseline/bin/llama-tokenize", "-m", GGUF, "-f", path, "--ids", "--log-disable"]).stdout
    ll_tokens = len(re.findall(r"\d+", ids))
    t0 = time.time()
    ours = json.loads(run([RUNTIME, "perplexity", MODEL, "--text", path, "--ctx", "512", "--chunks", str(args.chunks),
                           "--threads", str(args.threads), "--json"]).stdout)
    ours_s = time.time() - t0
    rel = ours["perplexity"] / ll_ppl - 1
    rel_fa_off = ours["perplexity"] / ll_ppl_fa_off - 1
    row = {"text": path, "chunks": ours["chunks"], "llama_cpp_ppl": ll_ppl, "runtime_ppl": ours["perplexity"],
           "relative_difference": rel, "llama_cpp_ppl_flash_attn_off": ll_ppl_fa_off, "relative_difference_flash_attn_off": rel_fa_off,
           "llama_cpp_tokens": ll_tokens, "runtime_tokens": ours["tokens"],
           "tokens_equal": ll_tokens == ours["tokens"], "tolerance": args.tolerance, "within_tolerance": abs(rel) < args.tolerance, "within_tolerance_flash_attn_off": abs(rel_fa_off) < args.tolerance,
           "llama_cpp_seconds": ll_s, "runtime_seconds": ours_s}
    report["perplexity"].append(row)
    print(f"{name:12s} ppl llama.cpp {ll_ppl:.4f} (-fa off {ll_ppl_fa_off:.4f})  runtime {ours['perplexity']:.4f}  "
          f"diff {100*rel:+.4f}% (-fa off {100*rel_fa_off:+.4f}%)  tokens {ll_tokens} vs {ours['tokens']}")

for prompt in PROMPTS:
    ll = run(["baseline/bin/llama-completion", "-m", GGUF, "-p", prompt, "-n", "32", "--temp", "0", "--ignore-eos",
              "-no-cnv", "--no-display-prompt", "--simple-io", "-t", str(args.threads), "--no-warmup"]).stdout
    ll_text = ll[:-2] if ll.endswith("\n\n") else ll  # llama-completion ends its output with a blank line
    ours = json.loads(run([RUNTIME, "run", MODEL, "--prompt", prompt, "-n", "32", "--ignore-eos", "--json",
                           "--threads", str(args.threads)]).stdout)
    row = {"prompt": prompt, "llama_cpp": ll_text, "runtime": ours["text"], "identical": ll_text == ours["text"]}
    if not row["identical"]:
        # first differing character -> the step that produced it, and our margin there
        i = next((k for k, (a, b) in enumerate(zip(ll_text, ours["text"])) if a != b), min(len(ll_text), len(ours["text"])))
        row["first_difference_char"] = i
        row["min_top2_logit_margin"] = min(ours["top2_logit_margins"])
        row["top2_logit_margins"] = ours["top2_logit_margins"]
    report["greedy"].append(row)
    print(f"greedy {'identical' if row['identical'] else 'DIFFERENT'}: {prompt!r} -> {ours['text']!r}")
    if not row["identical"]:
        print(f"   llama.cpp: {ll_text!r}; smallest top-2 margin {row['min_top2_logit_margin']:.4f}")

os.makedirs("bench/results", exist_ok=True)
TAG = os.path.basename(MODEL.rstrip("/")) if args.model_dir else args.model
with open(f"bench/results/reference-{TAG}.json", "w") as f:
    json.dump(report, f, indent=2)
# llama.cpp's two attention paths differ by 0.11-0.15% on Qwen's Q4_K_M file (docs/RESULTS.md,
# #16 part 5), more than the 0.1% bar: a text passes within the tolerance of either
ok = all((r["within_tolerance"] or r["within_tolerance_flash_attn_off"]) and r["tokens_equal"] for r in report["perplexity"])
print("reference:", "PASS" if ok else "FAIL", f"-> bench/results/reference-{TAG}.json")
sys.exit(0 if ok else 1)
