//! The fast tier (`make test-fast`): the whole pipeline on a tiny synthetic model that the test
//! writes itself (`tests::write_synthetic_gguf`: 6 layers, d_model 64, n_ff 256, random
//! weights). No download, no root: import, prepare, then the streamed runtime against the
//! dense model and against itself with records.bin held in memory, the rows it reads, the
//! plans it makes, and the CLI's refusals.

use runtime::stream::{DensePrefix, SelectorChoice, StreamSettings};
use runtime::PreparedMode;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tests::*;

/// Imported and prepared once per test binary.
fn prepared() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| prepare_synthetic(&scratch("synthetic")))
}

fn model_dir() -> PathBuf {
    prepared().parent().unwrap().parent().unwrap().join("model")
}

fn stream(settings: StreamSettings) -> runtime::Opened {
    runtime::open(prepared(), &PreparedMode::Stream(StreamSettings { ctx: 128, ..settings })).unwrap()
}

fn logits(o: &mut runtime::Opened, text: &str) -> Vec<f32> {
    let ids = o.tokenizer.encode(text, true).unwrap();
    let mut cache = o.model.new_cache(128).unwrap();
    o.runner().forward(&ids, &mut cache, 0).unwrap()
}

const TEXT: &str = "the hat is in the tent then the ant is on the net";

fn engine(o: &mut runtime::Opened) -> &mut runtime::stream::StreamingEngine {
    o.engine().expect("a streamed run")
}

#[test]
fn prepared_dense_equals_the_model_directory() {
    let (model, tok) = runtime::open_model(&model_dir(), runtime::DecodeLayout::Mapped).unwrap();
    let ids = tok.encode(TEXT, true).unwrap();
    let want = model.forward(&ids, &mut model.new_cache(128).unwrap(), 0).unwrap();
    let mut dense = runtime::open(prepared(), &PreparedMode::Dense { head: runtime::HeadChoice::Resident }).unwrap();
    let got = logits(&mut dense, TEXT);
    let diff = max_abs_diff(&want, &got);
    assert!(diff < 1e-4, "the prepared model (records rebuilt) differs from its directory by {diff}");
    assert!(want.iter().all(|v| v.is_finite()));
    // every neuron kept and held: the engine's sparse layers (every record's exact h from its
    // own gate and up rows, its down row added) compute the dense model up to the order of sums
    let mut all = stream(StreamSettings {
        selector: SelectorChoice::Sketch { resident_bonus: 1.0 },
        set_scale: 1.0,
        dense_prefix: DensePrefix::Layer(formats::manifest::Manifest::load(prepared()).unwrap().sparsity.dense_prefix),
        head: runtime::HeadChoice::Resident,
        ..Default::default()
    });
    let sparse = logits(&mut all, TEXT);
    let rel = (sparse.iter().zip(&want).map(|(x, y)| ((x - y) as f64).powi(2)).sum::<f64>()
        / want.iter().map(|y| (*y as f64).powi(2)).sum::<f64>())
    .sqrt();
    eprintln!("every neuron through the engine vs dense: relative L2 {rel}");
    assert!(
        engine(&mut all).stats.rows_loaded > 0 && rel < 1e-3,
        "every neuron through the engine vs dense: relative L2 {rel}"
    );
}

#[test]
fn streamed_predictor_equals_its_records_in_memory_and_reads_the_deltas() {
    let mut mem = stream(StreamSettings {
        io: runtime::stream::IoSettings { hold_records_in_memory: true, ..Default::default() },
        ..Default::default()
    });
    assert!(engine(&mut mem).holds_records());
    let want = logits(&mut mem, TEXT);
    // unlimited: nothing is evicted, so a row is read exactly once
    let mut s = stream(StreamSettings { record_sets: true, ..Default::default() });
    assert!(!engine(&mut s).holds_records());
    let got = logits(&mut s, TEXT);
    assert_eq!(want, got, "streamed predictor sets differ from the records held in memory");
    let e = engine(&mut s);
    e.refresh_io_stats();
    assert_eq!(e.rule(), "soft8");
    let first = e.dense_prefix;
    let mut expected = 0u64;
    for si in 0..SYNTH_LAYERS - first {
        let mut resident = HashSet::new();
        let loaded: u64 = e.history.iter().flat_map(|sets| sets[si].iter()).map(|&j| resident.insert(j) as u64).sum();
        assert_eq!(e.stats.layers[si].rows_loaded, loaded, "layer {}", first + si);
        expected += loaded;
    }
    assert!(expected > 0);
    let rb = formats::manifest::Manifest::load(prepared()).unwrap().records.record_bytes as u64;
    assert_eq!(e.stats.bytes_read, expected * rb, "bytes read = rows x record size");
    assert!(
        e.stats.read_requests < expected,
        "adjacent records coalesce: {} requests for {expected} rows",
        e.stats.read_requests
    );
}

#[test]
fn streamed_scorer_equals_its_records_in_memory_at_any_slot_count() {
    let selector = SelectorChoice::Scorer { resident_bonus: 1.0 };
    let share = 0.25;
    let minimum = stream(StreamSettings { selector, set_scale: share, ..Default::default() })
        .engine()
        .unwrap()
        .plan
        .minimum_bytes;
    for extra in [0u64, 64 << 10] {
        let mut s = stream(StreamSettings {
            selector,
            set_scale: share,
            mem_budget_bytes: Some(minimum + extra),
            ..Default::default()
        });
        let (slots, first) = {
            let e = engine(&mut s);
            assert_eq!(e.plan.slot_row_bytes, SYNTH_D * 2, "slots hold downT rows only");
            if extra == 0 {
                assert_eq!(e.plan.capacity, e.plan.set_sizes, "the smallest budget holds exactly the sets");
            } else {
                assert!(e.plan.capacity.iter().zip(&e.plan.set_sizes).all(|(c, k)| c > k));
            }
            (e.plan.capacity[0], e.dense_prefix)
        };
        let mem_mode = in_memory(selector, first, share, slots as f64 / SYNTH_FF as f64, runtime::HeadChoice::Resident);
        let mut mem = runtime::open(prepared(), &mem_mode).unwrap();
        assert_eq!(
            engine(&mut mem).plan.capacity,
            engine(&mut s).plan.capacity,
            "the slot share gives the budget's slots"
        );
        let want = logits(&mut mem, TEXT);
        let got = logits(&mut s, TEXT);
        assert_eq!(want, got, "slots {slots}: streamed scorer differs from its records in memory");
        let m = engine(&mut mem);
        m.refresh_io_stats();
        let (m_loaded, m_computed) = (m.stats.rows_loaded, m.stats.computed_rows);
        let e = engine(&mut s);
        e.refresh_io_stats();
        assert_eq!(e.stats.rows_loaded, m_loaded, "the same rows read");
        assert_eq!(e.stats.computed_rows, m_computed, "every held row counted, in both");
        assert_eq!(e.stats.read_requests, e.stats.rows_loaded, "one read per downT row");
    }
}

#[test]
fn fit_trades_set_size_for_memory_and_refuses_below_its_floor() {
    let selector = SelectorChoice::Scorer { resident_bonus: 1.0 };
    let minimum = |scale: f64| {
        stream(StreamSettings { selector, set_scale: scale, dense_prefix: DensePrefix::Fit, ..Default::default() })
            .engine()
            .unwrap()
            .plan
            .minimum_bytes
    };
    let (at_025, at_015, at_010) = (minimum(0.25), minimum(0.15), minimum(0.10));
    assert!(at_010 < at_015 && at_015 < at_025, "{at_010} {at_015} {at_025}");
    let budget = (at_015 + at_025) / 2;
    let mut s = stream(StreamSettings {
        selector,
        set_scale: 0.25,
        dense_prefix: DensePrefix::Fit,
        mem_budget_bytes: Some(budget),
        ..Default::default()
    });
    let p = engine(&mut s).plan.clone();
    assert!(
        p.set_scale >= 0.15 && p.set_scale < 0.25 && p.total_bytes <= budget,
        "fit chose {} for {budget}",
        p.set_scale
    );
    let err = runtime::open(
        prepared(),
        &PreparedMode::Stream(StreamSettings {
            selector,
            set_scale: 0.25,
            dense_prefix: DensePrefix::Fit,
            mem_budget_bytes: Some(at_010 - 1),
            ctx: 128,
            ..Default::default()
        }),
    )
    .err()
    .expect("below the floor")
    .to_string();
    assert!(err.contains(&at_010.to_string()) && err.contains("0.10 x n_ff") && err.contains("a context of"), "{err}");
}

#[test]
fn settings_are_checked_when_built() {
    for (settings, what) in [
        (StreamSettings { set_scale: 0.0, ..Default::default() }, "set scale"),
        (
            StreamSettings { selector: SelectorChoice::Scorer { resident_bonus: f32::NAN }, ..Default::default() },
            "resident bonus",
        ),
        (StreamSettings { ctx: 0, ..Default::default() }, "context 0"),
    ] {
        let e = runtime::open(prepared(), &PreparedMode::Stream(settings)).err().expect("refused").to_string();
        assert!(e.contains(what), "{e}");
    }
}

#[test]
fn cli_strategies() {
    let m = prepared().to_str().unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["run", m, "-p", "the hat", "-n", "4", "--ignore-eos", "--json"];
        args.extend(extra);
        let (ok, out, err) = runtime_cli(&args);
        assert!(ok, "{extra:?}: {err}");
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()
    };
    // auto without a budget: every layer dense, in memory
    let auto = run(&[]);
    assert!(auto["sparsity"].is_null(), "{auto}");
    assert_eq!(auto["generated_tokens"], 4);
    assert_eq!(run(&["--strategy", "predictor"])["sparsity"]["set_rule"], "soft8");
    assert_eq!(run(&["--strategy", "predictor", "-X", "set-rule=soft4"])["sparsity"]["set_rule"], "soft4");
    assert!(run(&["--strategy", "dense"])["sparsity"].is_null());
    // auto with --in-memory: the scorer's sets (and its Q8_0 head) where the preparation has them
    let in_memory = run(&["--in-memory"]);
    assert!(
        in_memory["sparsity"]["mode"] == "in-memory" && in_memory["sparsity"]["set_rule"] == "scorer",
        "{in_memory}"
    );
    let (ok, out, _) = runtime_cli(&["run", m, "-p", "x", "-X", "help"]);
    assert!(ok && out.contains("set-rule=") && out.contains("slot-share="), "{out}");
    // bench reports the strategy it ran: dense through the engine without a budget, the scorer
    // (and its Q8_0 head) when named
    let (ok, out, err) = runtime_cli(&["bench", m, "-n", "4", "--ctx", "128", "--json"]);
    assert!(ok, "{err}");
    let b: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(b["set_rule"] == "dense" && b["decode_tok_per_s"].as_f64().unwrap() > 0.0, "{b}");
    let (ok, out, err) = runtime_cli(&["bench", m, "-n", "4", "--ctx", "128", "--strategy", "scorer", "--json"]);
    assert!(ok, "{err}");
    let b: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert!(b["set_rule"] == "scorer" && b["head_q8"] == true && b["decode_tok_per_s"].as_f64().unwrap() > 0.0, "{b}");
}

#[test]
fn cli_refusals_name_the_flag() {
    let m = prepared().to_str().unwrap();
    let dir = prepared().parent().unwrap().to_str().unwrap().to_string();
    let model = model_dir();
    let heldout = prepared().parent().unwrap().parent().unwrap().join("heldout.txt").to_str().unwrap().to_string();
    // 10 MB of prompt: refused before it is tokenized whole
    let huge_path = scratch("synthetic-huge-prompt").join("prompt.txt");
    std::fs::write(&huge_path, "the hat sat on the mat ".repeat(10 << 20 >> 4)).unwrap();
    let huge = huge_path.to_str().unwrap().to_string();
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["run", m, "-p", "hat", "--mem-budget", "1MiB"], vec!["--mem-budget", "at least", "--ctx"]),
        (vec!["run", m, "-p", "hat", "-X", "warp=9"], vec!["unknown knob", "set-rule"]),
        (vec!["run", m, "-p", "hat", "-X", "resident-bonus=0.5"], vec!["resident-bonus=0.5", ">= 1"]),
        (vec!["run", m, "-p", "hat", "--strategy", "predictor", "-X", "resident-bonus=2"], vec!["the scorer's"]),
        (vec!["run", m, "-p", "hat", "-X", "set-rule=oracle", "--strategy", "predictor"], vec!["--in-memory"]),
        (vec!["run", m, "-p", "hat", "--strategy", "predictor", "-X", "set-rule=top1"], vec!["set-rule=top1", "softN"]),
        (vec!["run", m, "-p", "hat", "-X", "neuron-rank=membership"], vec!["unknown knob"]),
        (vec!["run", m, "-p", "hat", "--strategy", "gate"], vec!["gate"]),
        (vec!["run", m, "-p", "hat", "--set-scale", "0.5"], vec!["--set-scale", "--mem-budget"]),
        (vec!["run", m, "-p", "hat", "--set-scale", "1e-9", "--mem-budget", "1GiB"], vec!["--set-scale", "neurons"]),
        (vec!["run", m, "-p", "hat", "--mem-budget", "18446744073709551616"], vec!["--mem-budget", "more bytes"]),
        (vec!["run", m, "-p", "hat", "-n", "18446744073709551615"], vec!["-n 18446744073709551615"]),
        (
            vec!["run", m, "-p", "hat", "-X", "oracle-thresholds=/nonexistent"],
            vec!["oracle-thresholds", "runtime perplexity"],
        ),
        (vec!["perplexity", m, "--text", &heldout, "--chunks", "0"], vec!["--chunks"]),
        (
            vec!["perplexity", model.to_str().unwrap(), "--text", &heldout, "-X", "oracle-thresholds=/nonexistent"],
            vec!["/nonexistent"],
        ),
        (vec!["eval", m, "--limit", "0"], vec!["--limit"]),
        (vec!["bench", m, "--prompt-file", &huge, "-n", "2"], vec!["the prompt is more than"]),
        (vec!["run", m, "-p", "hat", "--temp", "NaN"], vec!["--temp"]),
        (vec!["run", m, "-p", "hat", "--top-p", "1.5"], vec!["--top-p"]),
        (vec!["run", m, "-p", "hat", "-n", "0"], vec!["-n 0"]),
        (vec!["run", m, "-p", "hat", "--threads", "1000"], vec!["--threads 1000"]),
        (vec!["run", m, "-p", "hat", "--in-memory", "--dense-prefix", "fit"], vec!["fit", "--mem-budget"]),
        (vec!["run", &dir, "-p", "hat"], vec!["manifest.toml"]),
        (
            vec!["run", model.to_str().unwrap(), "-p", "hat", "--mem-budget", "10MiB"],
            vec!["model directory", "manifest.toml"],
        ),
    ];
    for (args, needles) in cases {
        let (ok, _, err) = runtime_cli(&args);
        assert!(!ok, "{args:?} succeeded");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        for n in needles {
            assert!(err.contains(n), "{args:?}: stderr lacks {n:?}: {err}");
        }
    }
}

#[test]
fn perplexity_streamed_equals_in_memory() {
    let m = prepared().to_str().unwrap();
    let text = prepared().parent().unwrap().parent().unwrap().join("heldout.txt");
    let ppl = |extra: &[&str]| {
        let mut args =
            vec!["perplexity", m, "--text", text.to_str().unwrap(), "--ctx", "64", "--chunks", "3", "--json"];
        args.extend(extra);
        let (ok, out, err) = runtime_cli(&args);
        assert!(ok, "{extra:?}: {err}");
        serde_json::from_str::<serde_json::Value>(out.trim().lines().last().unwrap()).unwrap()["perplexity"]
            .as_f64()
            .unwrap()
    };
    let (streamed, in_memory, dense) = (
        ppl(&["--strategy", "predictor"]),
        ppl(&["--strategy", "predictor", "--in-memory"]),
        ppl(&["--strategy", "dense"]),
    );
    // the same engine, its reads from storage or copied from records held in memory
    assert_eq!(streamed, in_memory, "streamed {streamed} vs in-memory {in_memory}");
    assert!(dense.is_finite() && dense > 1.0, "dense {dense}");
}

/// The records the streaming engine reads are checked: a flipped byte is an error naming the
/// file, never a wrong token; at load by the artifacts' sha256, and at every read by the record's
/// (or the downT row's) CRC32C.
#[test]
fn a_flipped_record_byte_is_an_error() {
    let src = prepared().parent().unwrap();
    let dir = scratch("synthetic-crc");
    link_all_but(src, &dir, "records.bin");
    std::fs::copy(src.join("records.bin"), dir.join("records.bin")).unwrap();
    let manifest = formats::manifest::Manifest::load(prepared()).unwrap();
    let layer = manifest.records.first_layer + 1;
    let mut bytes = std::fs::read(dir.join("records.bin")).unwrap();
    // every record's gate row (the predictor reads whole records) and downT row (the scorer's)
    for j in 0..SYNTH_FF {
        let off = manifest.records.offset(layer, j) as usize + 512;
        bytes[off + 3] ^= 0x40;
        bytes[off + 2 * 2 * SYNTH_D + 5] ^= 0x40;
    }
    std::fs::write(dir.join("records.bin"), bytes).unwrap();
    let m = dir.join("manifest.toml");
    let (ok, _, err) = runtime_cli(&["run", m.to_str().unwrap(), "-p", "the hat", "-n", "2"]);
    assert!(
        !ok && err.contains("records.bin") && err.contains("sha256") && err.contains("differs"),
        "checked at load: {err}"
    );
    for strategy in ["predictor", "scorer"] {
        let (ok, _, err) = runtime_cli(&[
            "run",
            m.to_str().unwrap(),
            "-p",
            "the hat",
            "-n",
            "2",
            "--strategy",
            strategy,
            "--no-verify",
        ]);
        assert!(!ok, "{strategy}: a corrupt record ran");
        assert!(
            err.contains("records.bin") && err.contains("CRC") && err.contains(&format!("layer {layer}")),
            "{strategy}: {err}"
        );
    }
}

/// A NaN weight is an error naming the layer where the hidden state stopped being finite, never
/// a sampled token (before this check argmax fell to token 0 and the run exited 0).
#[test]
fn a_nan_weight_is_an_error_naming_the_layer() {
    let d = scratch("synthetic-nan");
    write_synthetic_gguf_with_nan(&d.join("nan.gguf"), Some("blk.3.ffn_down.weight"));
    let out =
        run_bin("prep", &["import", d.join("nan.gguf").to_str().unwrap(), "--out", d.join("m").to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (ok, _, err) = runtime_cli(&["run", d.join("m").to_str().unwrap(), "-p", "the hat", "-n", "3"]);
    assert!(!ok && err.contains("not finite") && err.contains("after layer 3"), "{err}");
}

#[test]
fn bad_sizes_are_refused() {
    let m = prepared().to_str().unwrap();
    for bad in ["-5", "NaN", "lots", "5XB"] {
        let (ok, _, err) = runtime_cli(&["run", m, "-p", "hat", &format!("--mem-budget={bad}")]);
        assert!(!ok && err.contains("--mem-budget") && err.contains(bad), "{bad}: {err}");
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let p = entry.unwrap().path();
        let dest = to.join(p.file_name().unwrap());
        if p.is_dir() {
            copy_dir(&p, &dest);
        } else {
            std::fs::copy(&p, &dest).unwrap();
        }
    }
}

/// The user's workflow: prepare on a workstation, copy the artifacts folder to the device, run
/// it there. Every artifact (the tokenizer too) lives in the folder, under a relative path.
#[test]
fn the_artifacts_folder_runs_where_it_is_copied() {
    let manifest = formats::manifest::Manifest::load(prepared()).unwrap();
    assert!(
        manifest.artifacts.iter().all(|a| !Path::new(&a.path).is_absolute() && !a.path.contains("..")),
        "{:?}",
        manifest.artifacts
    );
    let device = scratch("synthetic-device").join("copied");
    copy_dir(prepared().parent().unwrap(), &device);
    let m = device.join("manifest.toml");
    let run = |m: &Path| {
        let (ok, out, err) =
            runtime_cli(&["run", m.to_str().unwrap(), "-p", "the hat", "-n", "4", "--ignore-eos", "--json"]);
        assert!(ok, "{err}");
        serde_json::from_str::<serde_json::Value>(out.trim()).unwrap()["token_ids"].clone()
    };
    assert_eq!(run(&m), run(prepared()), "the copy generates what the original does");
}

/// Integrity at load: every artifact's sha256 is checked on first use and the result cached, so
/// a flipped byte in resident.safetensors (which no record CRC covers) is refused, not run.
#[test]
fn artifacts_are_verified_once_and_a_flipped_byte_is_refused() {
    let device = scratch("synthetic-verify").join("copied");
    copy_dir(prepared().parent().unwrap(), &device);
    let m = device.join("manifest.toml");
    let run = |extra: &[&str]| {
        let mut args = vec!["run", m.to_str().unwrap(), "-p", "the hat", "-n", "2"];
        args.extend(extra);
        runtime_cli(&args)
    };
    let (ok, _, err) = run(&[]);
    assert!(ok && err.contains("verified the sha256"), "first use verifies: {err}");
    let (ok, _, err) = run(&[]);
    assert!(ok && !err.contains("verified the sha256"), "the second run is cached: {err}");
    let resident = device.join("resident.safetensors");
    let mut bytes = std::fs::read(&resident).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 0x01;
    std::fs::write(&resident, bytes).unwrap();
    let (ok, _, err) = run(&[]);
    assert!(!ok && err.contains("resident.safetensors") && err.contains("sha256") && err.contains("differs"), "{err}");
    let (ok, _, err) = run(&["--no-verify"]);
    assert!(ok, "--no-verify skips the check: {err}");
}

/// A non-finite predictor weight is refused at load, naming the file and the tensor (past the
/// artifacts' sha256, which `--no-verify` skips, a changed file must still not rank sets).
#[test]
fn a_nan_predictor_weight_is_refused() {
    let device = scratch("synthetic-nan-predictor").join("copied");
    copy_dir(prepared().parent().unwrap(), &device);
    let p = device.join("predictor/predictor.safetensors");
    let mut bytes = std::fs::read(&p).unwrap();
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&bytes[8..8 + header_len]).unwrap();
    let start = header["heads.weight"]["data_offsets"][0].as_u64().unwrap() as usize + 8 + header_len;
    bytes[start..start + 2].copy_from_slice(&half::f16::NAN.to_le_bytes());
    std::fs::write(&p, bytes).unwrap();
    let (ok, _, err) = runtime_cli(&[
        "run",
        device.join("manifest.toml").to_str().unwrap(),
        "-p",
        "the hat",
        "-n",
        "2",
        "--strategy",
        "predictor",
        "--no-verify",
    ]);
    assert!(
        !ok && err.contains("predictor.safetensors") && err.contains("heads.weight") && err.contains("not finite"),
        "{err}"
    );
}

/// A records.bin longer than the manifest says is another file, not a truncated one.
#[test]
fn a_longer_records_file_is_not_called_truncated() {
    let device = scratch("synthetic-long-records").join("copied");
    copy_dir(prepared().parent().unwrap(), &device);
    let mut f = std::fs::OpenOptions::new().append(true).open(device.join("records.bin")).unwrap();
    std::io::Write::write_all(&mut f, &[0u8; 4096]).unwrap();
    drop(f);
    // the manifest's size check names it at load; past it (a manifest edited to match), the
    // engine's own check says what is wrong
    let (ok, _, err) = runtime_cli(&["run", device.join("manifest.toml").to_str().unwrap(), "-p", "hat", "-n", "1"]);
    assert!(!ok && err.contains("records.bin") && !err.contains("truncated"), "{err}");
    let m = device.join("manifest.toml");
    let text = std::fs::read_to_string(&m).unwrap();
    let len = std::fs::metadata(device.join("records.bin")).unwrap().len();
    let old = formats::manifest::Manifest::load(prepared())
        .unwrap()
        .artifacts
        .iter()
        .find(|a| a.role == "records")
        .unwrap()
        .bytes;
    std::fs::write(&m, text.replace(&format!("bytes = {old}\n"), &format!("bytes = {len}\n"))).unwrap();
    let (ok, _, err) = runtime_cli(&["run", m.to_str().unwrap(), "-p", "hat", "-n", "1", "--no-verify"]);
    assert!(
        !ok && err.contains("records.bin") && err.contains("4096 bytes after") && !err.contains("truncated"),
        "{err}"
    );
}

/// A token that fails part-way leaves no stale rows behind: the later layers' slots planned
/// for rows that never landed are forgotten, so once the file is good again the same engine
/// computes what a fresh one does (a server answers the next request on it).
#[test]
fn a_failed_token_leaves_no_stale_rows() {
    let src = prepared().parent().unwrap();
    let dir = scratch("synthetic-abandon");
    link_all_but(src, &dir, "records.bin");
    let good = std::fs::read(src.join("records.bin")).unwrap();
    let manifest = formats::manifest::Manifest::load(prepared()).unwrap();
    // every record of the first sparse layer fails its CRC, so the token fails there while the
    // later layers' reads are planned and in flight
    let mut bad = good.clone();
    for j in 0..SYNTH_FF {
        bad[manifest.records.offset(manifest.records.first_layer, j) as usize + 600] ^= 0x08;
    }
    std::fs::write(dir.join("records.bin"), &bad).unwrap();
    let m = dir.join("manifest.toml");
    let settings = PreparedMode::Stream(StreamSettings {
        ctx: 128,
        dense_prefix: DensePrefix::Layer(manifest.records.first_layer),
        ..Default::default()
    });
    let mut s = runtime::open_with(&m, &settings, false).unwrap();
    let ids = s.tokenizer.encode(TEXT, true).unwrap();
    let mut cache = s.model.new_cache(128).unwrap();
    let e = s.runner().forward(&ids, &mut cache, 0).expect_err("the corrupt layer fails the token").to_string();
    assert!(e.contains("CRC32C mismatch"), "{e}");
    std::fs::write(dir.join("records.bin"), &good).unwrap();
    let mut cache = s.model.new_cache(128).unwrap();
    let again = s.runner().forward(&ids, &mut cache, 0).unwrap();
    let mut fresh = runtime::open_with(&m, &settings, false).unwrap();
    let mut cache = fresh.model.new_cache(128).unwrap();
    let want = fresh.runner().forward(&ids, &mut cache, 0).unwrap();
    let diff = max_abs_diff(&want, &again);
    assert!(diff < 2e-3, "after a failed token the engine differs from a fresh one by {diff}");
}

/// The synthetic generator itself: deterministic, and a real byte-level vocabulary.
#[test]
fn synthetic_model_is_deterministic() {
    let d = scratch("synthetic-det");
    write_synthetic_gguf(&d.join("a.gguf"));
    write_synthetic_gguf(&d.join("b.gguf"));
    assert_eq!(std::fs::read(d.join("a.gguf")).unwrap(), std::fs::read(d.join("b.gguf")).unwrap());
    assert_eq!(byte_level_chars().iter().collect::<HashSet<_>>().len(), 256);
    let _ = Path::new(&d);
}

/// `runtime serve` on the synthetic model: the OpenAI routes, streamed replies equal to plain
/// ones, stop sequences, usage counts, and every kind of bad request answered 4xx with an
/// OpenAI error object while the server keeps serving.
#[test]
fn serve_answers_the_openai_api() {
    use serde_json::json;
    let dir = model_dir();
    assert_eq!(
        std::fs::read_to_string(dir.join("chat_template.jinja")).unwrap(),
        SYNTH_CHAT_TEMPLATE,
        "prep import keeps the GGUF's chat template"
    );
    let mut s = Server::start(&[dir.to_str().unwrap(), "--ctx", "256", "--threads", "1"], None);
    let h = s.get("/health");
    assert_eq!((h.status, h.json()["status"].as_str()), (200, Some("ok")));
    assert_eq!(s.get("/v1/models").json()["data"][0]["id"], "model");
    let chat = json!({"model": "model", "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the hat is"}], "max_tokens": 24, "temperature": 0});
    let plain = s.post("/v1/chat/completions", &chat);
    assert_eq!(plain.status, 200, "{}", plain.body);
    let v = plain.json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let u = &v["usage"];
    assert!(u["prompt_tokens"].as_u64().unwrap() > 10 && u["completion_tokens"].as_u64().unwrap() <= 24);
    assert_eq!(
        u["total_tokens"].as_u64(),
        Some(u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap())
    );
    assert_eq!(v["object"], "chat.completion");
    // streamed: the deltas join to the same text, a finish chunk, the usage chunk, [DONE]
    let mut sc = chat.clone();
    sc["stream"] = json!(true);
    sc["stream_options"] = json!({"include_usage": true});
    let st = s.post("/v1/chat/completions", &sc);
    assert!(st.status == 200 && st.headers.contains("text/event-stream"), "{}", st.headers);
    let data = st.sse_data();
    assert_eq!(data.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<serde_json::Value> =
        data[..data.len() - 1].iter().map(|d| serde_json::from_str(d).unwrap()).collect();
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(streamed, text, "streamed and plain replies differ at temperature 0");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(chunks[chunks.len() - 2]["choices"][0]["finish_reason"], v["choices"][0]["finish_reason"]);
    let su = &chunks.last().unwrap()["usage"];
    assert_eq!(
        (&su["prompt_tokens"], &su["completion_tokens"], &su["total_tokens"]),
        (&u["prompt_tokens"], &u["completion_tokens"], &u["total_tokens"])
    );
    // the same prompt again: all but its last token come from the KV cache
    assert_eq!(su["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(u["prompt_tokens"].as_u64().unwrap() - 1));
    // completions, plain and streamed
    let comp = json!({"prompt": "the ant is on", "max_tokens": 16, "temperature": 0});
    let c1 = s.post("/v1/completions", &comp).json();
    let full = c1["choices"][0]["text"].as_str().unwrap().to_string();
    let mut cs = comp.clone();
    cs["stream"] = json!(true);
    let joined: String = s
        .post("/v1/completions", &cs)
        .sse_data()
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            serde_json::from_str::<serde_json::Value>(d).unwrap()["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(joined, full);
    // a stop sequence taken from the middle of that text ends the reply where it first occurs
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 6, "the synthetic model generated too little to test stop: {full:?}");
    let stop: String = chars[3..5].iter().collect();
    let mut cstop = comp.clone();
    cstop["stop"] = json!([stop]);
    let r = s.post("/v1/completions", &cstop).json();
    assert_eq!(r["choices"][0]["text"].as_str().unwrap(), &full[..full.find(&stop).unwrap()]);
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    cstop["stream"] = json!(true);
    let joined: String = s
        .post("/v1/completions", &cstop)
        .sse_data()
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| {
            serde_json::from_str::<serde_json::Value>(d).unwrap()["choices"][0]["text"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(joined, r["choices"][0]["text"].as_str().unwrap(), "a streamed reply never shows the stop sequence");
    // bad requests: 4xx, an OpenAI error object, and the server goes on
    let long_prompt = "the hat ".repeat(200);
    let bad: Vec<(&str, Vec<u8>, u16, &str)> = vec![
        ("/v1/chat/completions", b"{\"messages\": [".to_vec(), 400, "not valid JSON"),
        ("/v1/chat/completions", json!({"messages": []}).to_string().into_bytes(), 400, "empty"),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}).to_string().into_bytes(),
            400,
            "must be an integer",
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": 5}]}).to_string().into_bytes(),
            400,
            "content",
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 1000}).to_string().into_bytes(),
            400,
            "no room for a prompt",
        ),
        (
            "/v1/completions",
            json!({"prompt": "the hat ".repeat(25), "max_tokens": 100}).to_string().into_bytes(),
            400,
            "exceed the context",
        ),
        ("/v1/completions", json!({"prompt": long_prompt}).to_string().into_bytes(), 400, "the context holds 256"),
        ("/v1/completions", vec![b' '; (1 << 20) + 10], 413, "exceeds"),
        ("/v1/nowhere", b"{}".to_vec(), 404, "no such endpoint"),
    ];
    for (path, body, status, needle) in bad {
        let r = http(&s.addr, "POST", path, &[("Content-Type", "application/json")], &body);
        assert_eq!(r.status, status, "{path}: {}", r.body);
        let e = r.json();
        assert!(e["error"]["message"].as_str().unwrap().contains(needle), "{path}: {}", r.body);
        assert!(e["error"]["type"].is_string(), "{}", r.body);
    }
    let big = json!({"prompt": long_prompt});
    assert_eq!(s.post("/v1/completions", &big).json()["error"]["code"], "context_length_exceeded");
    assert!(s.alive());
    assert_eq!(
        s.post("/v1/completions", &comp).json()["choices"][0]["text"].as_str().unwrap(),
        full,
        "the same answer after the errors"
    );
    let m = s.get("/metrics").body;
    assert!(
        m.contains("np_requests_total{endpoint=\"completion\",outcome=\"ok\"} 5")
            && m.contains("np_generated_tokens_total"),
        "{m}"
    );
    assert!(s.log().contains("request 1 chat: prompt"), "one log line per request: {}", s.log());
}

/// --api-key is checked on every route; a full queue answers 503 with Retry-After; a client
/// that disconnects mid-stream cancels its generation.
#[test]
fn serve_checks_keys_bounds_its_queue_and_cancels_on_disconnect() {
    use serde_json::json;
    use std::io::{Read, Write};
    let dir = model_dir();
    let s = Server::start(
        &[dir.to_str().unwrap(), "--ctx", "1024", "--threads", "1", "--api-key", "sekret", "--queue", "1"],
        None,
    );
    for path in ["/v1/models", "/metrics"] {
        let r = s.get(path);
        assert_eq!(r.status, 401, "{path}");
        assert_eq!(r.json()["error"]["code"], "invalid_api_key");
        assert_eq!(http(&s.addr, "GET", path, &[("Authorization", "Bearer wrong")], b"").status, 401);
        assert_eq!(http(&s.addr, "GET", path, &[("Authorization", "Bearer sekret")], b"").status, 200);
        // the scheme is case-insensitive (RFC 9110), the key is not
        assert_eq!(http(&s.addr, "GET", path, &[("Authorization", "BEARER sekret")], b"").status, 200);
        assert_eq!(http(&s.addr, "GET", path, &[("Authorization", "bearer SEKRET")], b"").status, 401);
    }
    // a load balancer's probe carries no key
    assert_eq!(s.get("/health").status, 200);
    let auth = [("Authorization", "Bearer sekret"), ("Content-Type", "application/json")];
    // one answered, one waiting, the rest refused
    let long = json!({"prompt": "the tent", "max_tokens": 1000, "temperature": 0}).to_string();
    let replies: Vec<HttpReply> = std::thread::scope(|sc| {
        let hs: Vec<_> =
            (0..6).map(|_| sc.spawn(|| http(&s.addr, "POST", "/v1/completions", &auth, long.as_bytes()))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let busy: Vec<&HttpReply> = replies.iter().filter(|r| r.status == 503).collect();
    assert!(
        !busy.is_empty() && replies.iter().all(|r| r.status == 200 || r.status == 503),
        "{:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(busy[0].headers.contains("retry-after: "), "{}", busy[0].headers);
    assert_eq!(busy[0].json()["error"]["code"], "queue_full");
    // a stream read for one chunk, then dropped
    let mut stream = std::net::TcpStream::connect(&s.addr).unwrap();
    let body = json!({"prompt": "the net", "max_tokens": 1000, "temperature": 0, "stream": true}).to_string();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sekret\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut buf = [0u8; 512];
    let n = stream.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    drop(stream);
    let t = std::time::Instant::now();
    loop {
        let m = http(&s.addr, "GET", "/metrics", &auth, b"").body;
        // the metric, and the request's log line (written just after it)
        if m.contains("np_requests_total{endpoint=\"completion\",outcome=\"cancelled\"} 1")
            && s.log().contains("cancelled: the client went away")
        {
            break;
        }
        assert!(t.elapsed().as_secs() < 20, "the dropped stream was not cancelled: {m}\n{}", s.log());
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let log = s.log();
    let line = log.lines().find(|l| l.contains("cancelled: the client went away")).unwrap();
    let generated: usize = line.split(" generated").next().unwrap().rsplit(' ').next().unwrap().parse().unwrap();
    assert!(generated < 1000, "{line}");
}

/// `runtime plan --shape`: a public model sized from its shape alone on a shipped device file,
/// the frontier over 15-100% of its F16 size against llama.cpp's GGUFs.
#[test]
fn plan_sizes_a_shape_without_its_weights() {
    let device = repo_root().join("devices/jetson-agx-orin-32gb-990pro.toml");
    let (ok, out, err) =
        runtime_cli(&["plan", "--shape", "mistral-7b", "--device", device.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 8);
    // 15% of 14.5 GB is below what the scorer holds (its Q4_K gate/up alone are 2.1 GB)
    assert!(rows[0]["ours"]["refused_minimum_bytes"].as_u64().unwrap() > rows[0]["budget_bytes"].as_u64().unwrap());
    let full = &rows[7];
    assert!(full["ours"]["predicted_tok_per_s"].as_f64().unwrap() > 0.0);
    // at 100% the F16 file fits only because its untied embedding (262 MB) is read a row a token
    let f16 = &full["llama_cpp"].as_array().unwrap().iter().find(|q| q["quant"] == "F16").unwrap()["prediction"];
    assert_eq!(f16["fits"], true, "{f16}");
    assert_eq!(
        f16["file_bytes"].as_u64().unwrap() - f16["per_token_bytes"].as_u64().unwrap(),
        32000 * 4096 * 2,
        "{f16}"
    );
    let f16_75 = &rows[6]["llama_cpp"].as_array().unwrap().iter().find(|q| q["quant"] == "F16").unwrap()["prediction"];
    assert!(f16_75["fits"] == false && f16_75["reread_bytes_per_token"].as_u64().unwrap() > 0, "{f16_75}");
    let q2 = full["llama_cpp"].as_array().unwrap().iter().find(|q| q["quant"] == "Q2_K").unwrap();
    assert_eq!(q2["prediction"]["fits"], true);
    let (ok, _, err) = runtime_cli(&["plan", "--shape", "gpt-5", "--device", device.to_str().unwrap()]);
    assert!(!ok && err.contains("mistral-7b"), "{err}");
}

/// The papers' predictors are trained only when the recipe asks (`[train]`, `[layers]`): a
/// recipe without those sections prepares no predictor artifacts, auto still runs, and naming
/// either strategy is refused with the section it needs.
#[test]
fn a_recipe_without_predictor_sections_trains_none() {
    let dir = scratch("synthetic-no-predictors");
    let recipe = synthetic_recipe(&dir);
    let text = std::fs::read_to_string(&recipe).unwrap();
    let cut = text.replace("[train]\nhidden = 16\nmax_epochs = 3\n[layers]\n", "");
    assert_ne!(cut, text, "the synthetic recipe's predictor sections");
    std::fs::write(&recipe, cut).unwrap();
    let out = run_bin("prep", &["prepare", recipe.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "prep prepare: {}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let stages: Vec<&str> = report["stages"].as_array().unwrap().iter().map(|s| s["stage"].as_str().unwrap()).collect();
    assert!(!stages.contains(&"train") && !stages.contains(&"layers") && stages.contains(&"reuse"), "{stages:?}");
    let manifest = dir.join("artifacts/manifest.toml");
    let m = formats::manifest::Manifest::load(&manifest).unwrap();
    assert!(!m.artifacts.iter().any(|a| a.role == "predictor" || a.role == "layer_predictors"), "{:?}", m.artifacts);
    let reuse = formats::reuse_table::ReuseTable::load(&dir.join("artifacts/scorer/reuse.json")).unwrap();
    assert_eq!(reuse.rules.keys().collect::<Vec<_>>(), ["scorer", "sketch"]);
    let mp = manifest.to_str().unwrap();
    let (ok, _, err) = runtime_cli(&["run", mp, "-p", "the hat", "-n", "2"]);
    assert!(ok, "{err}");
    for (strategy, section) in [("predictor", "[train]"), ("layers", "[layers]")] {
        let (ok, _, err) =
            runtime_cli(&["run", mp, "-p", "the hat", "-n", "2", "--strategy", strategy, "--mem-budget", "1GiB"]);
        assert!(!ok && err.contains("manifest.toml") && err.contains(section), "{strategy}: {err}");
    }
}
