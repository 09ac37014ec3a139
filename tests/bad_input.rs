//! Bad input gives one clear error naming the file and the problem, a non-zero exit, no panic.

use formats::gguf::{write_gguf, GgufTensorData, GgufValue};
use formats::safetensors_io::{write_f16_safetensors, F16Tensor};
use half::f16;
use std::path::Path;
use tests::*;

/// Asserts a failed run whose stderr names `file` and contains every `needle`; never a panic.
fn assert_clean_error(out: &std::process::Output, needles: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "expected failure, got success; stderr: {stderr}");
    assert_eq!(out.status.code(), Some(1), "expected exit code 1; stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panic instead of an error: {stderr}");
    for n in needles {
        assert!(stderr.contains(n), "stderr lacks {n:?}: {stderr}");
    }
}

/// A tiny llama-shaped GGUF (d=32, ff=64, 1 layer, 8-token byte-level vocab).
fn tiny_gguf(path: &Path, arch: &str, embed_type: u32) {
    let s = |v: &str| GgufValue::String(v.into());
    let tokens = ["a", "b", "c", "d", "ab", "cd", "<s>", "</s>"];
    let md = vec![
        ("general.architecture".to_string(), s(arch)),
        (format!("{arch}.block_count"), GgufValue::U32(1)),
        (format!("{arch}.embedding_length"), GgufValue::U32(32)),
        (format!("{arch}.feed_forward_length"), GgufValue::U32(64)),
        (format!("{arch}.attention.head_count"), GgufValue::U32(2)),
        (format!("{arch}.attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-5)),
        ("tokenizer.ggml.model".to_string(), s("gpt2")),
        ("tokenizer.ggml.pre".to_string(), s("smollm")),
        ("tokenizer.ggml.tokens".to_string(), GgufValue::Array(tokens.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.merges".to_string(), GgufValue::Array(vec![s("a b"), s("c d")])),
    ];
    let f32_tensor = |name: &str, ne: Vec<u64>| {
        let n: u64 = ne.iter().product();
        GgufTensorData { name: name.into(), ne, ggml_type_id: 0, bytes: vec![0u8; n as usize * 4] }
    };
    let embed = if embed_type == 10 {
        // Q2_K: 84 bytes per block of 256 values; a row must be whole blocks (llama.cpp's rule,
        // checked when the file is opened), so one row of 256: valid GGUF, a type we do not compute
        GgufTensorData { name: "token_embd.weight".into(), ne: vec![256, 1], ggml_type_id: 10, bytes: vec![0u8; 84] }
    } else {
        f32_tensor("token_embd.weight", vec![32, 8])
    };
    let tensors = vec![
        embed,
        f32_tensor("output_norm.weight", vec![32]),
        f32_tensor("blk.0.attn_norm.weight", vec![32]),
        f32_tensor("blk.0.attn_q.weight", vec![32, 32]),
        f32_tensor("blk.0.attn_k.weight", vec![32, 32]),
        f32_tensor("blk.0.attn_v.weight", vec![32, 32]),
        f32_tensor("blk.0.attn_output.weight", vec![32, 32]),
        f32_tensor("blk.0.ffn_norm.weight", vec![32]),
        f32_tensor("blk.0.ffn_gate.weight", vec![32, 64]),
        f32_tensor("blk.0.ffn_up.weight", vec![32, 64]),
        f32_tensor("blk.0.ffn_down.weight", vec![64, 32]),
    ];
    write_gguf(path, &md, &tensors).unwrap();
}

#[test]
fn tiny_gguf_imports_and_runs() {
    // The positive control for the error cases below: the same builder, valid inputs.
    let d = scratch("tiny-ok");
    tiny_gguf(&d.join("tiny.gguf"), "llama", 0);
    let out =
        run_bin("prep", &["import", d.join("tiny.gguf").to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = run_bin("runtime", &["run", d.join("m").to_str().unwrap(), "--prompt", "abcd", "-n", "3", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn missing_gguf() {
    let out = run_bin("prep", &["import", "/nonexistent/model.gguf", "--out", "/tmp/never"]);
    assert_clean_error(&out, &["/nonexistent/model.gguf", "no such file"]);
}

#[test]
fn truncated_gguf() {
    let d = scratch("trunc-gguf");
    let src = std::fs::read(fixture_gguf()).unwrap();
    let p = d.join("truncated.gguf");
    std::fs::write(&p, &src[..src.len() / 2]).unwrap();
    let out = run_bin("prep", &["import", p.to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]);
    assert_clean_error(&out, &["truncated.gguf", "truncated at byte offset"]);
    assert!(!d.join("m/model.safetensors").exists(), "no output may be written for a bad input");
}

#[test]
fn garbage_gguf() {
    let d = scratch("garbage-gguf");
    let p = d.join("garbage.gguf");
    std::fs::write(&p, (0..4096u32).map(|i| (i * 7919 % 251) as u8).collect::<Vec<_>>()).unwrap();
    let out = run_bin("prep", &["import", p.to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]);
    assert_clean_error(&out, &["garbage.gguf", "not a GGUF file"]);
}

#[test]
fn unsupported_tensor_type() {
    let d = scratch("q2k");
    tiny_gguf(&d.join("q2k.gguf"), "llama", 10);
    let out =
        run_bin("prep", &["import", d.join("q2k.gguf").to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]);
    assert_clean_error(&out, &["q2k.gguf", "token_embd.weight", "Q2_K", "not supported"]);
}

#[test]
fn unsupported_architecture_gguf() {
    let d = scratch("arch");
    tiny_gguf(&d.join("falcon.gguf"), "falcon", 0);
    let out =
        run_bin("prep", &["import", d.join("falcon.gguf").to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]);
    assert_clean_error(&out, &["falcon.gguf", "architecture 'falcon' is not supported"]);
}

/// A model directory copied from the fixture (config + tokenizer), with `edit` applied.
fn fixture_copy(name: &str) -> std::path::PathBuf {
    let d = scratch(name);
    let m = fixture_model();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(m.join(f), d.join(f)).unwrap();
    }
    d
}

#[test]
fn unsupported_architecture_model_dir() {
    let d = fixture_copy("arch-dir");
    let cfg = std::fs::read_to_string(d.join("config.json")).unwrap().replace("\"llama\"", "\"gpt_neox\"");
    std::fs::write(d.join("config.json"), cfg).unwrap();
    let out = run_bin("runtime", &["run", d.to_str().unwrap(), "--prompt", "hi", "-n", "1"]);
    assert_clean_error(&out, &["config.json", "architecture 'gpt_neox' is not supported"]);
}

#[test]
fn truncated_safetensors() {
    let d = fixture_copy("trunc-st");
    let p = d.join("model.safetensors");
    let len = std::fs::metadata(&p).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(len - 1000).unwrap();
    let out = run_bin("runtime", &["run", d.to_str().unwrap(), "--prompt", "hi", "-n", "1"]);
    assert_clean_error(&out, &["model.safetensors", "invalid safetensors"]);
}

#[test]
fn garbage_safetensors() {
    let d = fixture_copy("garbage-st");
    std::fs::write(d.join("model.safetensors"), b"\xff\xff\xff\xff\xff\xff\xff\x7fnot json").unwrap();
    let out = run_bin("runtime", &["run", d.to_str().unwrap(), "--prompt", "hi", "-n", "1"]);
    assert_clean_error(&out, &["model.safetensors", "invalid safetensors"]);
}

#[test]
fn tokenizer_larger_than_vocabulary() {
    // A 16-row model with the fixture's 49,152-token tokenizer.
    let d = scratch("vocab");
    let cfg = serde_json::json!({
        "model_type": "llama", "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "rms_norm_eps": 1e-5, "vocab_size": 16, "tie_word_embeddings": true,
    });
    std::fs::write(d.join("config.json"), cfg.to_string()).unwrap();
    std::fs::copy(fixture_model().join("tokenizer.json"), d.join("tokenizer.json")).unwrap();
    let t = |name: &str, shape: Vec<usize>| F16Tensor {
        name: name.into(),
        data: vec![f16::ZERO; shape.iter().product()],
        shape,
    };
    let tensors = vec![
        t("model.embed_tokens.weight", vec![16, 32]),
        t("model.norm.weight", vec![32]),
        t("model.layers.0.input_layernorm.weight", vec![32]),
        t("model.layers.0.self_attn.q_proj.weight", vec![32, 32]),
        t("model.layers.0.self_attn.k_proj.weight", vec![32, 32]),
        t("model.layers.0.self_attn.v_proj.weight", vec![32, 32]),
        t("model.layers.0.self_attn.o_proj.weight", vec![32, 32]),
        t("model.layers.0.post_attention_layernorm.weight", vec![32]),
        t("model.layers.0.mlp.gate_proj.weight", vec![64, 32]),
        t("model.layers.0.mlp.up_proj.weight", vec![64, 32]),
        t("model.layers.0.mlp.down_proj.weight", vec![32, 64]),
    ];
    write_f16_safetensors(&d.join("model.safetensors"), &tensors, None).unwrap();
    let out = run_bin("runtime", &["run", d.to_str().unwrap(), "--prompt", "hi", "-n", "1"]);
    assert_clean_error(&out, &["tokenizer.json", "49152 tokens", "only 16 rows"]);
}

#[test]
fn prompt_longer_than_context() {
    let m = fixture_model();
    let prompt = "word ".repeat(100);
    let out = run_bin("runtime", &["run", m.to_str().unwrap(), "--prompt", &prompt, "-n", "4", "--ctx", "64"]);
    assert_clean_error(&out, &["needs 105 positions but the context holds 64", "prompt of 101 tokens"]);
}

#[test]
fn ctx_beyond_the_model() {
    let m = fixture_model();
    let out = run_bin("runtime", &["run", m.to_str().unwrap(), "--prompt", "hi", "-n", "4", "--ctx", "100000"]);
    assert_clean_error(
        &out,
        &["--ctx", "a context of 100000 positions exceeds the model's max_position_embeddings 8192"],
    );
}

#[test]
fn perplexity_text_too_short() {
    let d = scratch("short-text");
    let p = d.join("short.txt");
    std::fs::write(&p, "Too short to score.").unwrap();
    let out = run_bin("runtime", &["perplexity", fixture_model().to_str().unwrap(), "--text", p.to_str().unwrap()]);
    assert_clean_error(&out, &["short.txt", "at least 1024 (2 x ctx) are needed"]);
}

#[test]
fn manifest_garbage_or_missing_artifact() {
    let d = scratch("bad-manifest");
    let p = d.join("manifest.toml");
    std::fs::write(&p, "this is not a manifest").unwrap();
    let out = run_bin("runtime", &["run", p.to_str().unwrap(), "--prompt", "hi", "-n", "1"]);
    assert_clean_error(&out, &["manifest.toml"]);
    let out = run_bin("runtime", &["eval", d.join("missing.toml").to_str().unwrap(), "--limit", "1"]);
    assert_clean_error(&out, &["missing.toml", "no such file"]);
}

#[test]
fn eval_unknown_task_and_missing_data() {
    let m = fixture_model();
    let out = run_bin("runtime", &["eval", m.to_str().unwrap(), "--task", "mmlu", "--limit", "1"]);
    assert_clean_error(&out, &["--task mmlu: unknown task"]);
    let d = scratch("no-eval-data");
    let out = run_bin("runtime", &["eval", m.to_str().unwrap(), "--data", d.to_str().unwrap(), "--limit", "1"]);
    assert_clean_error(&out, &["no .arrow file"]);
}

/// A disk that fills mid-stage: `prep pack` into an 8 MiB tmpfs (the records need 25 MiB)
/// fails with one clear error and leaves neither records.bin nor its temporary file.
#[test]
fn disk_full_mid_pack() {
    let d = scratch("disk-full");
    let mnt = d.join("small-disk");
    std::fs::create_dir_all(&mnt).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs", mnt.to_str().unwrap()])
        .status()
        .unwrap();
    assert!(ok.success(), "cannot mount a tmpfs (the test needs root)");
    let out = run_bin(
        "prep",
        &["pack", fixture_model().to_str().unwrap(), "--dense-prefix", "26", "--out", mnt.to_str().unwrap()],
    );
    let left: Vec<String> =
        std::fs::read_dir(&mnt).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let _ = std::process::Command::new("umount").arg(&mnt).status();
    assert_clean_error(&out, &["records.bin", "No space left on device"]);
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// Byte offset, in a GGUF file, of tensor `name`'s table entry fields after its name:
/// (n_dims, offset of ne[0], offset of the type id, offset of the data offset).
fn tensor_entry(bytes: &[u8], name: &str) -> (u32, usize, usize, usize) {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes.windows(key.len()).position(|w| w == key).expect("tensor in the table") + key.len();
    let n_dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
    let ne = at + 4;
    let ty = ne + 8 * n_dims as usize;
    (n_dims, ne, ty, ty + 4)
}

/// Writes the tiny GGUF with `patch` applied to its bytes, imports it, and returns the result.
fn import_patched(name: &str, patch: impl FnOnce(&mut Vec<u8>)) -> (std::process::Output, std::path::PathBuf) {
    let d = scratch(name);
    let g = d.join("bad.gguf");
    tiny_gguf(&g, "llama", 0);
    let mut bytes = std::fs::read(&g).unwrap();
    patch(&mut bytes);
    std::fs::write(&g, bytes).unwrap();
    (run_bin("prep", &["import", g.to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]), g)
}

#[test]
fn gguf_tensor_table_is_checked() {
    // a data offset that overflows data_start + offset (imported garbage before)
    let (out, g) = import_patched("gguf-overflow", |b| {
        let (_, _, _, off) = tensor_entry(b, "blk.0.attn_q.weight");
        b[off..off + 8].copy_from_slice(&(u64::MAX - 31).to_le_bytes());
    });
    assert_clean_error(&out, &[g.to_str().unwrap(), "blk.0.attn_q.weight", "overflows"]);
    // two tensors at the same bytes
    let (out, g) = import_patched("gguf-overlap", |b| {
        let (_, _, _, q) = tensor_entry(b, "blk.0.attn_q.weight");
        let (_, _, _, k) = tensor_entry(b, "blk.0.attn_k.weight");
        let q_off: [u8; 8] = b[q..q + 8].try_into().unwrap();
        b[k..k + 8].copy_from_slice(&q_off);
    });
    assert_clean_error(&out, &[g.to_str().unwrap(), "overlap", "blk.0.attn_k.weight"]);
    // Q4_0 rows of 16 elements (the tensor's 1,024 elements are a whole number of blocks of 32,
    // its rows are not): llama.cpp refuses it, and so do we
    let (out, g) = import_patched("gguf-rows", |b| {
        let (_, ne, ty, _) = tensor_entry(b, "blk.0.attn_q.weight");
        b[ne..ne + 8].copy_from_slice(&16u64.to_le_bytes());
        b[ne + 8..ne + 16].copy_from_slice(&64u64.to_le_bytes());
        b[ty..ty + 4].copy_from_slice(&2u32.to_le_bytes());
    });
    assert_clean_error(&out, &[g.to_str().unwrap(), "blk.0.attn_q.weight", "not a whole number of Q4_0 blocks"]);
    // a misaligned data offset
    let (out, _) = import_patched("gguf-misaligned", |b| {
        let (_, _, _, off) = tensor_entry(b, "blk.0.ffn_norm.weight");
        let v = u64::from_le_bytes(b[off..off + 8].try_into().unwrap()) + 4;
        b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    });
    assert_clean_error(&out, &["blk.0.ffn_norm.weight", "not a multiple of the alignment"]);
}

/// Rewrites the GGUF at `path` after `edit` changes its metadata and tensors.
fn rewrite_gguf(path: &Path, edit: impl FnOnce(&mut Vec<(String, GgufValue)>, &mut Vec<GgufTensorData>)) {
    let f = formats::gguf::GgufFile::open(path).unwrap();
    let mut md: Vec<(String, GgufValue)> = f.metadata.clone().into_iter().collect();
    let mut tensors: Vec<GgufTensorData> = f
        .tensors
        .iter()
        .map(|t| GgufTensorData {
            name: t.name.clone(),
            ne: t.ne.clone(),
            ggml_type_id: t.ggml_type_id,
            bytes: f.tensor_bytes(t).to_vec(),
        })
        .collect();
    drop(f);
    edit(&mut md, &mut tensors);
    write_gguf(path, &md, &tensors).unwrap();
}

/// Hyperparameters no model can have are refused on import, naming the key; nothing is written.
#[test]
fn impossible_hyperparameters_are_refused_on_import() {
    let cases: [(&str, f32, &str); 5] = [
        ("llama.rope.freq_base", f32::NAN, "rope_theta NaN"),
        ("llama.attention.layer_norm_rms_epsilon", 0.0, "rms_norm_eps 0"),
        ("llama.attention.layer_norm_rms_epsilon", -1e-5, "rms_norm_eps -0.00000999"),
        ("llama.rope.freq_base", f32::INFINITY, "rope_theta inf"),
        ("llama.attention.layer_norm_rms_epsilon", 1e30, "rms_norm_eps 1000000015047466"),
    ];
    for (i, (key, value, needle)) in cases.into_iter().enumerate() {
        let d = scratch(&format!("hyper-{i}"));
        let g = d.join("bad.gguf");
        tiny_gguf(&g, "llama", 0);
        rewrite_gguf(&g, |md, _| {
            md.retain(|(k, _)| k != key);
            md.push((key.to_string(), GgufValue::F32(value)));
        });
        let out = run_bin("prep", &["import", g.to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]);
        assert_clean_error(&out, &[needle]);
        assert!(!d.join("m/config.json").exists(), "{needle}: a config was written");
    }
    // block_count smaller than the layers present: the model would be imported truncated
    let d = scratch("hyper-blocks");
    let g = d.join("bad.gguf");
    tiny_gguf(&g, "llama", 0);
    rewrite_gguf(&g, |md, tensors| {
        let layer1: Vec<GgufTensorData> = tensors
            .iter()
            .filter(|t| t.name.starts_with("blk.0."))
            .map(|t| GgufTensorData {
                name: t.name.replace("blk.0.", "blk.1."),
                ne: t.ne.clone(),
                ggml_type_id: t.ggml_type_id,
                bytes: t.bytes.clone(),
            })
            .collect();
        tensors.extend(layer1);
        md.retain(|(k, _)| k != "llama.block_count");
        md.push(("llama.block_count".into(), GgufValue::U32(1)));
    });
    let out = run_bin("prep", &["import", g.to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]);
    assert_clean_error(&out, &["model.layers.1.", "not part of a 1-layer"]);
}

#[test]
fn a_gguf_passed_as_a_manifest_says_what_to_do() {
    let d = scratch("gguf-as-manifest");
    tiny_gguf(&d.join("tiny.gguf"), "llama", 0);
    let out = run_bin("runtime", &["run", d.join("tiny.gguf").to_str().unwrap(), "-p", "ab", "-n", "1"]);
    assert_clean_error(&out, &["tiny.gguf", "a GGUF model file", "prep import"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("UTF-8"));
}

/// The OS's and the JSON parser's words appear once in a message (the chain used to repeat them).
#[test]
fn error_causes_are_printed_once() {
    let d = scratch("chain-once");
    std::fs::write(d.join("config.json"), "{}").unwrap();
    std::fs::write(d.join("model.safetensors"), "x").unwrap();
    let out = run_bin("prep", &["import", d.to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]);
    assert_clean_error(&out, &["config.json", "missing field"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).matches("missing field").count(),
        1,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_bin("runtime", &["perplexity", fixture_model().to_str().unwrap(), "--text", "/nonexistent/text.txt"]);
    assert_clean_error(&out, &["/nonexistent/text.txt"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).matches("No such file").count(),
        1,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The importer trusts nothing it reads: an optional key of the wrong type, a norm in a quantized
/// type, a partial rotary dimension or a key with terminal escapes is refused, naming it; and
/// it never overwrites a folder it did not make.
#[test]
fn the_importer_refuses_what_would_import_as_garbage() {
    let s = |v: &str| GgufValue::String(v.into());
    type Edit = Box<dyn Fn(&mut Vec<(String, GgufValue)>, &mut Vec<GgufTensorData>)>;
    let set = |key: &'static str, v: GgufValue| -> Edit {
        Box::new(move |md, _| {
            md.retain(|(k, _)| k != key);
            md.push((key.to_string(), v.clone()));
        })
    };
    let cases: Vec<(Edit, &[&str])> = vec![
        (set("tokenizer.ggml.eos_token_id", GgufValue::F32(7.0)), &["tokenizer.ggml.eos_token_id", "unsigned integer"]),
        (set("tokenizer.ggml.bos_token_id", s("6")), &["tokenizer.ggml.bos_token_id"]),
        (set("llama.context_length", GgufValue::F32(2048.0)), &["llama.context_length"]),
        (set("llama.rope.dimension_count", GgufValue::U32(0)), &["rope.dimension_count is 0"]),
        (set("llama.rope.dimension_count", GgufValue::U32(65)), &["rope.dimension_count is 65"]),
        (set("general.\u{1b}[31mname", s("x")), &["control characters", "\\u{1b}"]),
        (
            Box::new(|_, tensors| {
                let t = tensors.iter_mut().find(|t| t.name == "blk.0.ffn_norm.weight").unwrap();
                // 32 values as one Q8_0 block: a valid tensor of a type a norm never has
                (t.ggml_type_id, t.bytes) = (8, vec![0u8; 34]);
            }),
            &["blk.0.ffn_norm.weight", "Q8_0", "F32 or F16"],
        ),
    ];
    for (i, (edit, needles)) in cases.into_iter().enumerate() {
        let d = scratch(&format!("importer-{i}"));
        let g = d.join("bad.gguf");
        tiny_gguf(&g, "llama", 0);
        rewrite_gguf(&g, |md, tensors| edit(md, tensors));
        let out = run_bin("prep", &["import", g.to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]);
        assert_clean_error(&out, needles);
        assert!(!d.join("m/config.json").exists(), "{needles:?}: a config was written");
        assert!(!String::from_utf8_lossy(&out.stderr).contains('\u{1b}'), "an escape reached the terminal");
    }
    // a Hugging Face folder's own files are never overwritten; an earlier import's are
    let d = scratch("importer-folder");
    tiny_gguf(&d.join("tiny.gguf"), "llama", 0);
    let theirs = d.join("hf");
    std::fs::create_dir_all(&theirs).unwrap();
    std::fs::write(theirs.join("config.json"), "{\"theirs\": true}").unwrap();
    let g = d.join("tiny.gguf");
    let out = run_bin("prep", &["import", g.to_str().unwrap(), "--out", theirs.to_str().unwrap()]);
    assert_clean_error(&out, &["hf", "not empty", "--force"]);
    assert_eq!(std::fs::read_to_string(theirs.join("config.json")).unwrap(), "{\"theirs\": true}");
    let ours = d.join("ours");
    for _ in 0..2 {
        let out = run_bin("prep", &["import", g.to_str().unwrap(), "--out", ours.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    let out = run_bin("prep", &["import", g.to_str().unwrap(), "--out", theirs.to_str().unwrap(), "--force"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}
