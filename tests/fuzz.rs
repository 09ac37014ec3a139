//! Fixed-seed mutation fuzzing of every reader of untrusted bytes: the GGUF reader (and the
//! dequantizers it feeds), the safetensors header reader, the manifest, the record checker, and
//! the scorer, predictor, centroid, threshold, importance and Q8_0-head loaders, and `prep import`
//! on structured inputs (metadata of other types, tensor tables reordered). Each input is a
//! real seed file (a small GGUF with quantized tensors, a record, the synthetic preparation's
//! artifacts) mutated by bit flips, random bytes, extreme integers, truncation, insertion and
//! deletion. A reader must return a value or an error: never panic, never hang (a call over
//! `HANG_S` fails). An input that breaks a reader is saved under target/fuzz-crashes/.
//!
//! Iterations per target: `FUZZ_ITERS` (default 300, the pass `make test` runs); `make fuzz`
//! runs 1,000,000 per target. The same seed gives the same inputs. The corpus lives in
//! tests/fuzz-corpus/<target>/: replayed first, then mutated with the generated seed.
//! Why not cargo-fuzz: it needs a nightly toolchain, and this project builds with the one stable
//! toolchain the machines have. Stable coverage-guided options fall back to this same random
//! mutation without nightly, so a dependency would add nothing.

use formats::gguf::{write_gguf, GgufTensorData, GgufValue};
use half::f16;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tests::*;

const HANG_S: f64 = 2.0;

fn iterations() -> u64 {
    std::env::var("FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(300)
}

/// One mutation of `seed` (a few edits of one kind or another).
fn mutate(seed: &[u8], rng: &mut Xorshift) -> Vec<u8> {
    let mut b = seed.to_vec();
    let edits = 1 + rng.next_u64() % 4;
    for _ in 0..edits {
        let len = b.len().max(1) as u64;
        let at = (rng.next_u64() % len) as usize;
        match rng.next_u64() % 7 {
            0 => {
                if let Some(x) = b.get_mut(at) {
                    *x ^= 1 << (rng.next_u64() % 8);
                }
            }
            1 => {
                if let Some(x) = b.get_mut(at) {
                    *x = rng.next_u64() as u8;
                }
            }
            2 => {
                // an extreme integer over 4 or 8 bytes (counts, lengths, offsets)
                const EXTREMES: [u64; 8] = [0, 1, 0x7fff_ffff, 0xffff_ffff, 1 << 32, 1 << 40, u64::MAX, u64::MAX - 31];
                let v = EXTREMES[(rng.next_u64() % 8) as usize].to_le_bytes();
                let w = if rng.next_u64().is_multiple_of(2) { 4 } else { 8 };
                for (k, x) in v.iter().take(w).enumerate() {
                    if let Some(y) = b.get_mut(at + k) {
                        *y = *x;
                    }
                }
            }
            3 => b.truncate(at),
            4 => {
                let n = (rng.next_u64() % 64) as usize;
                let chunk: Vec<u8> = b[at.min(b.len())..(at + n).min(b.len())].to_vec();
                let pos = (rng.next_u64() % len) as usize;
                b.splice(pos.min(b.len())..pos.min(b.len()), chunk);
            }
            5 => {
                let n = (rng.next_u64() % 64) as usize;
                let end = (at + n).min(b.len());
                b.drain(at.min(end)..end);
            }
            _ => {
                // a printable character: keeps text (TOML, JSON) mostly text
                if let Some(x) = b.get_mut(at) {
                    const PRINTABLE: &[u8] = b" =[]{}\"'.,0123456789abcdefz\n-";
                    *x = PRINTABLE[(rng.next_u64() % PRINTABLE.len() as u64) as usize];
                }
            }
        }
    }
    b
}

/// The corpus kept in the repo for `target`: tests/fuzz-corpus/<target>/* (the seeds, written
/// by `FUZZ_SAVE_SEEDS=1`, and any input that once broke a reader, kept as a regression).
fn corpus(target: &str, generated: &[u8]) -> Vec<Vec<u8>> {
    let dir = repo_root().join("tests/fuzz-corpus").join(target);
    if std::env::var_os("FUZZ_SAVE_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("seed"), generated).unwrap();
    }
    let mut inputs: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| std::fs::read(e.ok()?.path()).ok()).collect())
        .unwrap_or_default();
    if !inputs.iter().any(|i| i == generated) {
        inputs.push(generated.to_vec());
    }
    inputs
}

/// Replays the corpus, then mutates its inputs `iterations()` times into `file`, calling `read`
/// on each.
fn fuzz(target: &str, seed: &[u8], file: &Path, read: impl Fn(&Path)) {
    let mut rng = Xorshift(0x00f0_220d ^ target.bytes().fold(0u64, |h, c| h.wrapping_mul(31).wrapping_add(c as u64)));
    let n = iterations();
    let t0 = Instant::now();
    let mut slowest = Duration::ZERO;
    let seeds = corpus(target, seed);
    for s in &seeds {
        std::fs::write(file, s).unwrap();
        read(file);
    }
    for i in 0..n {
        let input = mutate(&seeds[(rng.next_u64() % seeds.len() as u64) as usize], &mut rng);
        std::fs::write(file, &input).unwrap();
        let t = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| read(file)));
        let took = t.elapsed();
        slowest = slowest.max(took);
        if outcome.is_err() || took.as_secs_f64() > HANG_S {
            let dir = repo_root().join("target/fuzz-crashes");
            std::fs::create_dir_all(&dir).unwrap();
            let saved = dir.join(format!("{target}-{i}.bin"));
            std::fs::write(&saved, &input).unwrap();
            panic!(
                "{target}: input {i} {} (saved to {})",
                if outcome.is_err() { "panicked" } else { "hung" },
                saved.display()
            );
        }
    }
    let _ = std::fs::remove_file(file);
    if file.starts_with("/dev/shm") {
        let _ = std::fs::remove_dir_all(file.parent().unwrap());
    }
    eprintln!(
        "{target}: {} corpus inputs and {n} mutations in {:.1} s, no panic, slowest {:.1} ms",
        seeds.len(),
        t0.elapsed().as_secs_f64(),
        slowest.as_secs_f64() * 1e3
    );
}

/// Where the mutated inputs are written: a tmpfs when there is one (each input is a file).
fn work(name: &str) -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        let d = shm.join(format!("np-fuzz-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        return d;
    }
    scratch(&format!("fuzz-{name}"))
}

/// A small GGUF with f32, f16, Q8_0, Q4_0, Q4_K and Q6_K tensors: the seed of the GGUF target.
fn seed_gguf(path: &Path) {
    let s = |v: &str| GgufValue::String(v.into());
    let md = vec![
        ("general.architecture".to_string(), s("llama")),
        ("llama.block_count".to_string(), GgufValue::U32(1)),
        ("llama.embedding_length".to_string(), GgufValue::U32(256)),
        ("tokenizer.ggml.tokens".to_string(), GgufValue::Array(vec![s("a"), s("b")])),
        ("nested".to_string(), GgufValue::Array(vec![GgufValue::Array(vec![GgufValue::F64(1.5)])])),
    ];
    let mut rng = Xorshift(7);
    let mut bytes = |n: usize| (0..n).map(|_| rng.next_u64() as u8).collect::<Vec<u8>>();
    // (type id, bytes per block of 256 values... as each type lays them out, for a 256 x 2 tensor)
    let tensors = vec![
        GgufTensorData { name: "f32".into(), ne: vec![8, 2], ggml_type_id: 0, bytes: vec![0; 64] },
        GgufTensorData { name: "f16".into(), ne: vec![8, 2], ggml_type_id: 1, bytes: vec![0; 32] },
        GgufTensorData { name: "q8_0".into(), ne: vec![32, 2], ggml_type_id: 8, bytes: bytes(2 * 34) },
        GgufTensorData { name: "q4_0".into(), ne: vec![32, 2], ggml_type_id: 2, bytes: bytes(2 * 18) },
        GgufTensorData { name: "q4_k".into(), ne: vec![256, 1], ggml_type_id: 12, bytes: bytes(144) },
        GgufTensorData { name: "q6_k".into(), ne: vec![256, 1], ggml_type_id: 14, bytes: bytes(210) },
    ];
    write_gguf(path, &md, &tensors).unwrap();
}

#[test]
fn fuzz_gguf_reader_and_dequantizers() {
    let d = work("gguf");
    seed_gguf(&d.join("seed.gguf"));
    let seed = std::fs::read(d.join("seed.gguf")).unwrap();
    fuzz("gguf", &seed, &d.join("input.gguf"), |p| {
        if let Ok(g) = formats::gguf::GgufFile::open(p) {
            for t in &g.tensors {
                let _ = g.dequantize_f32(&t.name);
            }
        }
    });
}

#[test]
fn fuzz_record_checker() {
    let d = 64;
    let row = |k: usize| (0..d).map(|i| f16::from_f32(((i * 7 + k) % 13) as f32 - 6.0)).collect::<Vec<_>>();
    let mut seed = vec![0u8; formats::records::record_bytes(d)];
    formats::records::encode_record(3, 17, &row(0), &row(1), &row(2), &mut seed);
    let dir = work("record");
    fuzz("record", &seed, &dir.join("record.bin"), |p| {
        let bytes = std::fs::read(p).unwrap();
        let _ = formats::records::check_record(&bytes, p, 0, 3, 17, d);
    });
}

#[test]
fn fuzz_record_v2_checker() {
    use formats::ggml_quants::GgmlType;
    let shape = formats::records::RecordShape { d_model: 256, gate_up: GgmlType::Q4K, down: GgmlType::Q8_0 };
    let bytes = |n: usize, k: usize| (0..n).map(|i| ((i * 31 + k) % 251) as u8).collect::<Vec<_>>();
    let mut seed = vec![0u8; shape.record_bytes()];
    formats::records::encode_record_v2(
        &shape,
        3,
        17,
        &bytes(shape.gate_up_row_bytes(), 1),
        &bytes(shape.gate_up_row_bytes(), 2),
        &bytes(shape.down_row_bytes(), 3),
        &mut seed,
    );
    let dir = work("record-v2");
    fuzz("record-v2", &seed, &dir.join("record.bin"), |p| {
        let b = std::fs::read(p).unwrap();
        let _ = formats::records::check_record_v2(&b, p, 0, 3, 17, &shape);
        let _ = formats::records::check_down_section(&b[b.len().min(512)..], p, 512, 3, 17, &shape);
    });
}

/// The synthetic preparation's artifacts: real seeds for the loaders the runtime opens.
fn synthetic() -> PathBuf {
    static P: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    P.get_or_init(|| prepare_synthetic(&scratch("fuzz-synthetic"))).parent().unwrap().to_path_buf()
}

#[test]
fn fuzz_manifest() {
    let dir = synthetic();
    let seed = std::fs::read(dir.join("manifest.toml")).unwrap();
    // the mutated manifest sits beside the artifacts it names, so a valid one loads fully
    fuzz("manifest", &seed, &dir.join("fuzz-manifest.toml"), |p| {
        let _ = formats::manifest::Manifest::load(p);
    });
}

/// The synthetic preparation's shape, for the loaders that check it.
fn shape() -> (usize, usize, usize, usize, usize) {
    let m = formats::manifest::Manifest::load(&synthetic().join("manifest.toml")).unwrap();
    let c = &m.model;
    (
        m.sparsity.dense_prefix,
        c.num_hidden_layers - m.sparsity.dense_prefix,
        c.intermediate_size,
        c.hidden_size,
        c.vocab_size,
    )
}

fn seed_of(rel: &str) -> Vec<u8> {
    std::fs::read(synthetic().join(rel)).unwrap()
}

#[test]
fn fuzz_safetensors_header() {
    fuzz(
        "safetensors-header",
        &seed_of("importance/importance.safetensors"),
        &work("st").join("st.safetensors"),
        |p| {
            if let Ok(f) = formats::safetensors_io::MappedSafetensors::open(p) {
                for e in f.tensors.values() {
                    let _ = f.bytes(e).len();
                }
            }
        },
    );
}

#[test]
fn fuzz_importance() {
    let (d0, n_sparse, n_ff, _, _) = shape();
    fuzz(
        "importance",
        &seed_of("importance/importance.safetensors"),
        &work("importance").join("importance.safetensors"),
        |p| {
            let _ = formats::importance::NeuronImportance::load(p, d0 + n_sparse, n_ff);
        },
    );
}

#[test]
fn fuzz_scorer() {
    let (d0, n_sparse, n_ff, d, _) = shape();
    fuzz("scorer", &seed_of("scorer/scorer.safetensors"), &work("scorer").join("scorer.safetensors"), |p| {
        let _ = formats::scorer::GateUpScorerFile::load(p, d0, n_sparse, n_ff, d);
    });
}

#[test]
fn fuzz_sketch() {
    let (d0, n_sparse, n_ff, d, _) = shape();
    fuzz("sketch", &seed_of("sketch/sketch.safetensors"), &work("sketch").join("sketch.safetensors"), |p| {
        let _ = formats::sketch::SketchFile::load(p, d0, n_sparse, n_ff, d);
        let _ = formats::sketch::held_bytes_per_layer(p, d0, n_sparse, n_ff, d);
    });
}

#[test]
fn fuzz_head_q8() {
    let (_, _, _, d, vocab) = shape();
    fuzz("head-q8", &seed_of("scorer/head_q8.safetensors"), &work("head-q8").join("head_q8.safetensors"), |p| {
        let _ = formats::head_q8::Q8Head::load(p, vocab, d);
    });
}

#[test]
fn fuzz_head_compact() {
    let (_, _, _, d, vocab) = shape();
    fuzz(
        "head-compact",
        &seed_of("scorer/head_compact.safetensors"),
        &work("head-compact").join("head_compact.safetensors"),
        |p| {
            if let Ok((f, _)) = formats::head_compact::open(p, vocab, d) {
                let _ = f.bytes(&f.tensors[formats::model_dir::LM_HEAD]).len();
            }
        },
    );
}

#[test]
fn fuzz_predictor() {
    fuzz(
        "predictor",
        &seed_of("predictor/predictor.safetensors"),
        &work("predictor").join("predictor.safetensors"),
        |p| {
            let _ = runtime::predictor::Predictor::load(p);
        },
    );
}

#[test]
fn fuzz_layer_predictors() {
    let (d0, n_sparse, n_ff, d, _) = shape();
    fuzz(
        "layer-predictors",
        &seed_of("layers/layer_predictors.safetensors"),
        &work("layer-predictors").join("layer_predictors.safetensors"),
        |p| {
            let _ = formats::layer_predictors::LayerPredictorFile::load(p, d, n_ff, d0 + n_sparse);
        },
    );
}

#[test]
fn fuzz_centroids() {
    fuzz(
        "centroids",
        &seed_of("cluster/centroids.safetensors"),
        &work("centroids").join("centroids.safetensors"),
        |p| {
            let _ = formats::centroids::CentroidTable::load(p);
        },
    );
}

#[test]
fn fuzz_thresholds() {
    fuzz("thresholds", &seed_of("capture/thresholds.json"), &work("thresholds").join("thresholds.json"), |p| {
        let _ = formats::thresholds::Thresholds::load(p);
    });
}

/// A tiny llama GGUF that imports and runs (d=32, ff=64, 1 layer, 8-token vocabulary): the seed
/// of the importer's target.
fn importable_gguf() -> (Vec<(String, GgufValue)>, Vec<GgufTensorData>) {
    let s = |v: &str| GgufValue::String(v.into());
    let tokens = ["a", "b", "c", "d", "ab", "cd", "<s>", "</s>"];
    let md = vec![
        ("general.architecture".to_string(), s("llama")),
        ("llama.block_count".to_string(), GgufValue::U32(1)),
        ("llama.context_length".to_string(), GgufValue::U32(256)),
        ("llama.embedding_length".to_string(), GgufValue::U32(32)),
        ("llama.feed_forward_length".to_string(), GgufValue::U32(64)),
        ("llama.attention.head_count".to_string(), GgufValue::U32(2)),
        ("llama.attention.head_count_kv".to_string(), GgufValue::U32(2)),
        ("llama.rope.dimension_count".to_string(), GgufValue::U32(16)),
        ("llama.rope.freq_base".to_string(), GgufValue::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon".to_string(), GgufValue::F32(1e-5)),
        ("tokenizer.ggml.model".to_string(), s("gpt2")),
        ("tokenizer.ggml.pre".to_string(), s("smollm")),
        ("tokenizer.ggml.tokens".to_string(), GgufValue::Array(tokens.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.merges".to_string(), GgufValue::Array(vec![s("a b"), s("c d")])),
        ("tokenizer.ggml.bos_token_id".to_string(), GgufValue::U32(6)),
        ("tokenizer.ggml.eos_token_id".to_string(), GgufValue::U32(7)),
    ];
    let t = |name: &str, ne: Vec<u64>| {
        let n: u64 = ne.iter().product();
        let bytes = (0..n).flat_map(|i| (((i * 37 % 101) as f32 - 50.0) / 500.0).to_le_bytes()).collect();
        GgufTensorData { name: name.into(), ne, ggml_type_id: 0, bytes }
    };
    let norm = |name: &str| GgufTensorData {
        name: name.into(),
        ne: vec![32],
        ggml_type_id: 0,
        bytes: 1f32.to_le_bytes().repeat(32),
    };
    let tensors = vec![
        t("token_embd.weight", vec![32, 8]),
        norm("output_norm.weight"),
        norm("blk.0.attn_norm.weight"),
        t("blk.0.attn_q.weight", vec![32, 32]),
        t("blk.0.attn_k.weight", vec![32, 32]),
        t("blk.0.attn_v.weight", vec![32, 32]),
        t("blk.0.attn_output.weight", vec![32, 32]),
        norm("blk.0.ffn_norm.weight"),
        t("blk.0.ffn_gate.weight", vec![32, 64]),
        t("blk.0.ffn_up.weight", vec![32, 64]),
        t("blk.0.ffn_down.weight", vec![64, 32]),
    ];
    (md, tensors)
}

/// One value of another GGUF type than `v`'s (the importer's metadata must be the right type).
fn other_value(v: &GgufValue, rng: &mut Xorshift) -> GgufValue {
    let pick = rng.next_u64();
    let n = (pick >> 8) % 5000;
    let candidates = [
        GgufValue::F32(n as f32 + 0.5),
        GgufValue::I32(-(n as i32)),
        GgufValue::U64(n),
        GgufValue::U8((n % 256) as u8),
        GgufValue::Bool(n.is_multiple_of(2)),
        GgufValue::String(format!("{n}")),
        GgufValue::F64(f64::NAN),
        GgufValue::Array(vec![GgufValue::U32(n as u32)]),
        GgufValue::U32(0),
        GgufValue::U32(u32::MAX),
    ];
    let c = candidates[(pick % candidates.len() as u64) as usize].clone();
    if std::mem::discriminant(&c) == std::mem::discriminant(v) {
        GgufValue::String("x".into())
    } else {
        c
    }
}

/// The importer, structure-aware: each input is the seed with a metadata value of another type,
/// a key dropped, a tensor of another type, shape or place in the table, or two tensors'
/// bytes swapped, written as a valid GGUF; `prep import` must import it or refuse it with one
/// error (exit 1), never panic, and what it imports must run or be refused.
#[test]
fn fuzz_importer_metadata_types_and_tensor_tables() {
    let n = iterations().min(1000);
    let d = work("import");
    let mut rng = Xorshift(0x1a2b_3c4d);
    let (md0, tensors0) = importable_gguf();
    let (mut imported, mut refused) = (0, 0);
    for i in 0..n {
        let (mut md, mut tensors) = (md0.clone(), tensors0.clone());
        let edits = 1 + rng.next_u64() % 2;
        for _ in 0..edits {
            match rng.next_u64() % 6 {
                0 | 1 => {
                    let k = (rng.next_u64() % md.len() as u64) as usize;
                    md[k].1 = other_value(&md[k].1, &mut rng);
                }
                2 => {
                    let k = (rng.next_u64() % md.len() as u64) as usize;
                    md.remove(k);
                }
                3 => {
                    // another type for a tensor, with that type's bytes for its shape
                    let k = (rng.next_u64() % tensors.len() as u64) as usize;
                    let (id, block_elems, block_bytes) =
                        [(1, 1, 2), (8, 32, 34), (2, 32, 18), (3, 32, 20)][(rng.next_u64() % 4) as usize];
                    let t = &mut tensors[k];
                    if t.ne[0].is_multiple_of(block_elems) {
                        let n: u64 = t.ne.iter().product();
                        t.ggml_type_id = id;
                        t.bytes = vec![0x11; (n / block_elems * block_bytes) as usize];
                    }
                }
                4 => {
                    // two tensors change places in the table (their offsets follow them)
                    let (a, b) = (
                        (rng.next_u64() % tensors.len() as u64) as usize,
                        (rng.next_u64() % tensors.len() as u64) as usize,
                    );
                    tensors.swap(a, b);
                }
                _ => {
                    // a tensor's shape transposed or cut
                    let k = (rng.next_u64() % tensors.len() as u64) as usize;
                    let t = &mut tensors[k];
                    t.ne.reverse();
                    if rng.next_u64().is_multiple_of(2) && t.ne[0] > 1 {
                        t.ne[0] /= 2;
                        t.bytes.truncate(t.bytes.len() / 2);
                    }
                }
            }
        }
        let g = d.join("input.gguf");
        write_gguf(&g, &md, &tensors).unwrap();
        let out_dir = d.join(format!("m{}", i % 4));
        let _ = std::fs::remove_dir_all(&out_dir);
        let out = run_bin("prep", &["import", g.to_str().unwrap(), "--out", out_dir.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr);
        let code = out.status.code();
        if code == Some(0) {
            imported += 1;
            let r = run_bin("runtime", &["run", out_dir.to_str().unwrap(), "-p", "abcd", "-n", "2", "--json"]);
            let rerr = String::from_utf8_lossy(&r.stderr);
            assert!(
                matches!(r.status.code(), Some(0) | Some(1)) && !rerr.contains("panicked"),
                "input {i}: imported, then runtime run: {:?}\n{rerr}",
                r.status
            );
        } else {
            refused += 1;
            let saved = repo_root().join("target/fuzz-crashes").join(format!("import-{i}.gguf"));
            if code != Some(1) || err.contains("panicked") || err.lines().filter(|l| l.contains("error:")).count() != 1
            {
                std::fs::create_dir_all(saved.parent().unwrap()).unwrap();
                std::fs::copy(&g, &saved).unwrap();
                panic!("input {i}: prep import exited {:?} (saved to {}):\n{err}", out.status, saved.display());
            }
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    eprintln!("import: {n} structured inputs, {imported} imported (and run), {refused} refused with one error");
    assert!(refused > 0 && imported > 0, "the mutations must reach both outcomes");
}
