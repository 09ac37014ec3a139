#!/usr/bin/env python3
"""make bench-serve: `runtime serve` against `runtime run` on the same model and memory budget.

1. Time to first token: `runtime run --json` on the chat-rendered prompt gives prefill and
   decode tok/s; one prefill plus one decode step is the bound. The server's streamed reply is
   timed by a raw HTTP client from request to the first content chunk, fresh prompts each time
   (no KV-cache reuse).
2. Throughput: the same requests from 1 client one after another, then from 8 clients at once;
   generated tokens per second of wall time, ratio 8-client / 1-client.
Writes bench/results/serve-<name>.json. Compare ratios within one run only.
"""
import argparse, http.client, json, os, pathlib, statistics, subprocess, sys, threading, time

ROOT = pathlib.Path(__file__).resolve().parent.parent
BIN = ROOT / "target/release/runtime"

ap = argparse.ArgumentParser()
ap.add_argument("--model", default=str(ROOT / "models/smollm2-135m-native"), help="model dir or manifest.toml")
ap.add_argument("--name", default=None)
ap.add_argument("--mem-budget", default=None)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--tokens", type=int, default=32, help="max_tokens per request")
ap.add_argument("--requests", type=int, default=8)
ap.add_argument("--reps", type=int, default=3)
args = ap.parse_args()
name = args.name or pathlib.Path(args.model).parent.name if args.model.endswith(".toml") else pathlib.Path(args.model).name
budget = ["--mem-budget", args.mem_budget] if args.mem_budget else []
common = ["--threads", str(args.threads)] + budget

QUESTIONS = ["Tell me about the moon.", "What is a prime number?", "Describe a cat.", "How do trains work?",
             "What is rain?", "Why do birds sing?", "What is a violin?", "Explain gravity briefly.",
             "What is bread made of?", "Name a famous river.", "What is chess?", "How do plants grow?"]

server = subprocess.Popen([str(BIN), "serve", args.model, "--port", "0", "--ctx", "1024"] + common,
                          stderr=subprocess.PIPE, text=True)
addr = None
for line in server.stderr:
    if line.startswith("listening on http://"):
        addr = line.split("http://")[1].split()[0]
        break
if addr is None:
    sys.exit("runtime serve did not start")
threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()
host, port = addr.split(":")

def request(content, stream):
    """(seconds to the first content, total seconds, completion tokens, prompt tokens). The
    system message leads with the request's serial, so no prompt shares more than the template's
    first tokens with another (the server reuses a shared prefix's KV cache)."""
    c = http.client.HTTPConnection(host, int(port), timeout=600)
    serial, question = content
    messages = [{"role": "system", "content": f"Request {serial}. You are a helpful assistant."}, {"role": "user", "content": question}]
    body = json.dumps({"messages": messages, "max_tokens": args.tokens,
                       "temperature": 0, "stream": stream, "stream_options": {"include_usage": True} if stream else None})
    t0 = time.perf_counter()
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.read()
    if not stream:
        v = json.loads(r.read())
        t = time.perf_counter() - t0
        return t, t, v["usage"]["completion_tokens"], v["usage"]["prompt_tokens"]
    first, tokens, prompt = None, 0, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        v = json.loads(line[6:])
        if v.get("usage"):
            tokens, prompt = v["usage"]["completion_tokens"], v["usage"]["prompt_tokens"]
        if first is None and any(ch["delta"].get("content") for ch in v["choices"]):
            first = time.perf_counter() - t0
    return first, time.perf_counter() - t0, tokens, prompt

serial = 0
def fresh(q):
    global serial
    serial += 1
    return (serial, q)

try:
    request(fresh("warm up"), False)
    # 1. first token vs runtime run's prefill + one decode step, on the same prompts
    ttft, bound, server_prompt = [], [], []
    for i in range(args.reps):
        q = fresh(QUESTIONS[i % len(QUESTIONS)])
        first, _, _, p = request(q, True)
        ttft.append(first)
        server_prompt.append(p)
    # runtime run --chat renders the same message through the same template: its own process,
    # same flags (the server holds its model meanwhile; the budget is per process)
    for i in range(args.reps):
        q = QUESTIONS[i % len(QUESTIONS)]
        out = subprocess.run([str(BIN), "run", args.model, "--json", "-n", "2", "--ignore-eos", "--chat", "-p", q] + common,
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(out.stderr)
        v = json.loads(out.stdout)
        # at the server's prompt length (runtime run --chat has the template's default system)
        bound.append(server_prompt[i] / v["prefill_tok_per_s"] + 1.0 / v["decode_tok_per_s"])
    # 2. throughput, 1 client then 8 clients, same number of requests
    qs = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.requests)]
    t0 = time.perf_counter()
    one = [request(fresh(q), i % 2 == 0) for i, q in enumerate(qs)]
    one_s = time.perf_counter() - t0
    results = [None] * len(qs)
    prompts = [fresh(q) for q in qs]
    def worker(i):
        results[i] = request(prompts[i], i % 2 == 0)
    t0 = time.perf_counter()
    ths = [threading.Thread(target=worker, args=(i,)) for i in range(len(qs))]
    [t.start() for t in ths]
    [t.join() for t in ths]
    many_s = time.perf_counter() - t0
finally:
    server.terminate()
one_tps = sum(r[2] for r in one) / one_s
many_tps = sum(r[2] for r in results) / many_s
out = {
    "model": args.model, "mem_budget": args.mem_budget, "threads": args.threads, "max_tokens": args.tokens,
    "first_token_s": ttft, "server_prompt_tokens": server_prompt, "run_prefill_plus_one_decode_s": bound,
    "first_token_over_bound": statistics.median(ttft) / statistics.median(bound),
    "one_client_tok_per_s": one_tps, "eight_clients_tok_per_s": many_tps,
    "eight_over_one": many_tps / one_tps,
    "eight_clients_first_token_s": sorted(r[0] for r in results if r[0] is not None),
}
res = ROOT / "bench/results" / f"serve-{name}.json"
res.write_text(json.dumps(out, indent=1) + "\n")
print(f"first token: median {statistics.median(ttft)*1e3:.0f} ms vs runtime run prefill + one decode step {statistics.median(bound)*1e3:.0f} ms "
      f"(ratio {out['first_token_over_bound']:.2f}; <= 1 meets the goal)")
print(f"throughput: 1 client {one_tps:.1f} tok/s, 8 clients {many_tps:.1f} tok/s (ratio {out['eight_over_one']:.2f}; >= 1 is no collapse)")
print(f"wrote {res}")
