#!/usr/bin/env python3
"""Drives `runtime serve` with the `openai` PyPI client (tests/serve.rs starts the server).

usage: serve_openai.py BASE_URL MODEL
Checks: plain and streaming chat, a stop sequence, completions, 8 concurrent requests all
answered with each stream's text equal to the non-streamed reply at temperature 0, and the
client's error classes for bad requests. Prints one JSON line of figures; exits non-zero on
any failure.
"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
import openai

base, model = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=600)
PROMPTS = ["What is the capital of France?", "Name three colours.", "Write a haiku about rain.",
           "What is 2 + 2?", "Say hello in Spanish.", "What do bees make?", "Why is the sky blue?",
           "List two fruits."]

def chat(content, stream, **kw):
    args = dict(model=model, messages=[{"role": "system", "content": "You are a helpful assistant."},
                                       {"role": "user", "content": content}],
                max_tokens=24, temperature=0, **kw)
    if not stream:
        r = client.chat.completions.create(**args)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage
    text, finish, usage = "", None, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            finish = c.finish_reason or finish
    return text, finish, usage

figures = {}
models = client.models.list()
assert [m.id for m in models.data] == [model], models
assert client.models.retrieve(model).id == model

# plain and streamed chat, equal at temperature 0
t0 = time.time()
plain, finish, usage = chat(PROMPTS[0], False)
figures["plain_s"] = time.time() - t0
assert plain and finish in ("stop", "length"), (plain, finish)
assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens and usage.completion_tokens <= 24, usage
streamed, sfinish, susage = chat(PROMPTS[0], True)
assert streamed == plain and sfinish == finish, (streamed, plain)
assert susage.completion_tokens == usage.completion_tokens, (susage, usage)

# a stop sequence taken from the reply ends it before its first occurrence
words = plain.split()
assert len(words) >= 3, plain
stop = " " + words[2]
cut, cfinish, _ = chat(PROMPTS[0], False, stop=[stop])
assert cut == plain[: plain.index(stop)] and cfinish == "stop", (cut, plain, stop)
scut, _, _ = chat(PROMPTS[0], True, stop=[stop])
assert scut == cut, (scut, cut)

# completions
c = client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
assert c.choices[0].text and c.usage.completion_tokens <= 8, c
sc = "".join(ch.choices[0].text for ch in client.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0, stream=True) if ch.choices)
assert sc == c.choices[0].text, (sc, c.choices[0].text)

# 8 concurrent clients, streamed and plain of each prompt: every one answered, streams equal
t0 = time.time()
with ThreadPoolExecutor(16) as pool:
    futures = [(p, pool.submit(chat, p, True), pool.submit(chat, p, False)) for p in PROMPTS]
    results = [(p, s.result(), n.result()) for p, s, n in futures]
figures["concurrent_16_requests_s"] = time.time() - t0
tokens = 0
for p, (st, sf, su), (nt, nf, nu) in results:
    assert st == nt and sf == nf, (p, st, nt)
    tokens += nu.completion_tokens + su.completion_tokens
figures["concurrent_tokens"] = tokens

# the client's error classes for bad requests
def refused(exc, **kw):
    try:
        client.chat.completions.create(model=model, **kw)
    except exc as e:
        return e
    raise AssertionError(f"not refused: {kw}")

e = refused(openai.BadRequestError, messages=[])
assert "empty" in e.message, e.message
e = refused(openai.BadRequestError, messages=[{"role": "user", "content": "hi"}], max_tokens=100000)
assert e.code == "context_length_exceeded", e
e = refused(openai.BadRequestError, messages=[{"role": "user", "content": "hi"}], n=2)
assert "not supported" in e.message, e.message
# and the server still answers
again, _, _ = chat(PROMPTS[0], False)
assert again == plain, (again, plain)
print(json.dumps(figures))
