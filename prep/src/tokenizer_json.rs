//! Rebuilds a Hugging Face `tokenizer.json` from a GGUF file's vocabulary, merges, token
//! types, special-token ids and pre-tokenizer type (byte-level BPE models: `tokenizer.ggml.model`
//! = "gpt2").

use anyhow::{bail, Context, Result};
use formats::gguf::GgufFile;
use serde_json::{json, Value};

/// The pre-tokenizer split regexes of llama.cpp's `tokenizer.ggml.pre` types (applied in order,
/// each isolating its matches), as in the models' original tokenizer.json files.
fn pre_tokenizer_regexes(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
    // (regexes, ignore_merges)
    Some(match pre {
        "gpt2" | "default" => (vec![GPT2], false),
        "smollm" => (vec![r"\p{N}", GPT2], false),
        "qwen2" => (
            vec![
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            false,
        ),
        "llama-bpe" | "llama3" => (
            vec![
                r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
            ],
            true,
        ),
        _ => return None,
    })
}

/// Token types in GGUF (`tokenizer.ggml.token_type`).
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;

pub fn tokenizer_json_from_gguf(g: &GgufFile) -> Result<Value> {
    let path = g.path.display();
    let model = g.require_str("tokenizer.ggml.model")?;
    if model != "gpt2" {
        bail!("{path}: tokenizer model '{model}' is not supported for GGUF import (byte-level BPE 'gpt2' is); import the Hugging Face directory instead");
    }
    let pre = g.get("tokenizer.ggml.pre").and_then(|v| v.as_str()).unwrap_or("default");
    let (regexes, ignore_merges) = pre_tokenizer_regexes(pre).with_context(|| {
        format!("{path}: pre-tokenizer type '{pre}' is not supported (gpt2, smollm, qwen2, llama-bpe are)")
    })?;
    let tokens = g.require_str_array("tokenizer.ggml.tokens")?;
    let merges = g.require_str_array("tokenizer.ggml.merges")?;
    let types: Vec<i64> = match g.get("tokenizer.ggml.token_type").and_then(|v| v.as_array()) {
        Some(a) => a
            .iter()
            .map(|v| match *v {
                formats::gguf::GgufValue::I32(x) => x as i64,
                ref other => other.as_u64().map(|x| x as i64).unwrap_or(1),
            })
            .collect(),
        None => vec![1; tokens.len()],
    };
    if types.len() != tokens.len() {
        bail!("{path}: {} token types for {} tokens", types.len(), tokens.len());
    }
    let mut vocab = serde_json::Map::with_capacity(tokens.len());
    let mut added = Vec::new();
    for (id, (tok, &ty)) in tokens.iter().zip(&types).enumerate() {
        vocab.insert(tok.to_string(), json!(id));
        if ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED {
            added.push(json!({
                "id": id, "content": tok, "single_word": false, "lstrip": false, "rstrip": false,
                "normalized": false, "special": ty == TOKEN_TYPE_CONTROL,
            }));
        }
    }
    if vocab.len() != tokens.len() {
        bail!("{path}: the vocabulary has duplicate tokens ({} distinct of {})", vocab.len(), tokens.len());
    }
    let mut pretokenizers: Vec<Value> = regexes
        .iter()
        .map(|r| json!({"type": "Split", "pattern": {"Regex": r}, "behavior": "Isolated", "invert": false}))
        .collect();
    pretokenizers
        .push(json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}));

    let add_bos = g.get("tokenizer.ggml.add_bos_token").and_then(|v| v.as_bool()).unwrap_or(false);
    let post_processor = if add_bos {
        let bos_id = g.require_u64("tokenizer.ggml.bos_token_id")? as usize;
        let bos =
            tokens.get(bos_id).with_context(|| format!("{path}: bos_token_id {bos_id} outside the vocabulary"))?;
        json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos.to_string(): {"id": bos, "ids": [bos_id], "tokens": [bos]}},
        })
    } else {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false})
    };
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": if pre == "qwen2" { json!({"type": "NFC"}) } else { Value::Null },
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": pretokenizers},
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": ignore_merges,
            "vocab": vocab, "merges": merges,
        },
    }))
}
