//! The streaming engine on prepared fixtures: with every neuron kept it equals the dense
//! model; the rows it reads are exactly the deltas of the predicted sets; a flipped byte in
//! records.bin is a CRC error naming layer, neuron and offset; a too-small budget is refused
//! with the minimum (or, with `--dense-prefix fit`, met by a later dense prefix, then by smaller
//! sets); and it runs inside a cgroup v1 memory limit of budget + 10%.

use runtime::PreparedMode;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use tests::*;

/// Prepares the fixture once per (K_max factor) into target/test-scratch/stream-<name>.
fn prepared(name: &str, k_max_factor: f64) -> PathBuf {
    let dir = repo_root().join("target/test-scratch").join(format!("stream-{name}"));
    let recipe = fixture_recipe(&dir, &format!("stream-{name}"), 26, k_max_factor, 4);
    let out = run_bin("prep", &["prepare", recipe.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir.join("artifacts/manifest.toml")
}

fn all_neurons() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| prepared("all", 100.0))
}

fn default_sparse() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| prepared("sparse", 1.5))
}

fn stream(manifest: &Path, budget: Option<u64>) -> runtime::Opened {
    stream_with(manifest, budget, false)
}

fn stream_with(manifest: &Path, budget: Option<u64>, record_sets: bool) -> runtime::Opened {
    let s = runtime::stream::StreamSettings { mem_budget_bytes: budget, ctx: 256, record_sets, ..Default::default() };
    runtime::open(manifest, &PreparedMode::Stream(s)).unwrap()
}

/// The streamed run's defaults with records.bin held in memory (`--in-memory`).
fn records_in_memory(manifest: &Path, set_scale: f64) -> runtime::Opened {
    let s = runtime::stream::StreamSettings {
        ctx: 256,
        set_scale,
        io: runtime::stream::IoSettings { hold_records_in_memory: true, ..Default::default() },
        ..Default::default()
    };
    runtime::open(manifest, &PreparedMode::Stream(s)).unwrap()
}

/// Logits of `ids` (every position, from an empty 64-position cache) through what the opened
/// model runs with (dense, or the streaming engine).
fn forward_logits(o: &mut runtime::Opened, ids: &[u32]) -> Vec<f32> {
    let mut cache = o.model.new_cache(64).unwrap();
    o.runner().forward(ids, &mut cache, 0).unwrap()
}

#[test]
fn every_neuron_kept_equals_dense() {
    let m = all_neurons();
    let manifest = formats::manifest::Manifest::load(m).unwrap();
    assert!(manifest.sparsity.k_max.iter().all(|&k| k == 1536), "{:?}", manifest.sparsity.k_max);
    let (dense, tok) = runtime::open_model(&fixture_model(), runtime::DecodeLayout::Mapped).unwrap();
    let ids = tok.encode("The quick brown fox jumps over the lazy dog, and then", true).unwrap();
    let mut cache = dense.new_cache(64).unwrap();
    let want = dense.forward(&ids, &mut cache, 0).unwrap();
    let mut s = stream(m, None);
    let got = forward_logits(&mut s, &ids);
    assert_eq!(want.len(), got.len());
    let max_diff = max_abs_diff(&want, &got);
    assert!(max_diff < BATCHED_VS_TOKEN_BY_TOKEN, "streamed logits differ from dense by {max_diff}");
}

#[test]
fn rows_read_are_exactly_the_deltas() {
    let m = default_sparse();
    let mut s = stream_with(m, None, true); // unlimited: nothing is evicted, a row is read once
    let ids = s.tokenizer.encode("Once upon a time there was a small village by the sea where", true).unwrap();
    let mut cache = s.model.new_cache(64).unwrap();
    // every token through the decode path (logits wanted from the first): a prompt's batches
    // stage whole layers instead
    s.runner().forward(&ids, &mut cache, 0).unwrap();
    let e = s.engine().expect("streaming");
    e.refresh_io_stats();
    let manifest = formats::manifest::Manifest::load(m).unwrap();
    // replay the active sets: each layer reads what is new to the union of earlier sets
    let mut expected = 0u64;
    for (si, layer) in (26..30).enumerate() {
        let mut resident = HashSet::new();
        let mut loaded = 0u64;
        for sets in &e.history {
            assert_eq!(sets[si].len(), manifest.sparsity.k_max[si], "every set holds K_max neurons");
            for &j in &sets[si] {
                loaded += resident.insert(j) as u64;
            }
        }
        assert_eq!(e.stats.layers[si].rows_loaded, loaded, "layer {layer}");
        expected += loaded;
    }
    assert_eq!(e.history.len(), ids.len());
    assert_eq!(e.stats.rows_loaded, expected);
    assert_eq!(e.stats.bytes_read, expected * manifest.records.record_bytes as u64, "bytes read = rows x record size");
    assert!(
        e.stats.read_requests < expected,
        "adjacent records are coalesced ({} requests for {expected} rows)",
        e.stats.read_requests
    );
}

/// A scratch folder `name` holding a copy of the preparation's files (records.bin among them, to
/// be corrupted) and links to its artifact folders (referenced relative to the manifest).
fn copy_with_own_records(manifest: &Path, name: &str) -> PathBuf {
    let src = manifest.parent().unwrap();
    let dir = scratch(name);
    for f in ["manifest.toml", "records.bin", "resident.safetensors", "tokenizer.json", "chat_template.jinja"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    for d in ["cluster", "predictor", "capture", "importance", "scorer", "sketch", "layers"] {
        std::os::unix::fs::symlink(src.join(d), dir.join(d)).unwrap();
    }
    dir
}

#[test]
fn flipped_byte_is_a_crc_error() {
    let m = all_neurons();
    let dir = copy_with_own_records(m, "stream-crc");
    let manifest = formats::manifest::Manifest::load(m).unwrap();
    // every artifact, the tokenizer too, lies inside the folder (it is what goes to a device)
    let tok_rel = &manifest.artifacts.iter().find(|a| a.role == "tokenizer").unwrap().path;
    assert_eq!(tok_rel, "tokenizer.json", "tokenizer path {tok_rel}");
    // flip one payload byte of layer 27, neuron 100 (every neuron is read: K_max = n_ff)
    let off = manifest.records.offset(27, 100) + 512 + 77;
    let mut bytes = std::fs::read(dir.join("records.bin")).unwrap();
    bytes[off as usize] ^= 0x10;
    std::fs::write(dir.join("records.bin"), bytes).unwrap();
    let mpath = dir.join("manifest.toml");
    // at load the artifacts' sha256 catches it, naming the file
    let out = run_bin(
        "runtime",
        &["run", mpath.to_str().unwrap(), "-p", "Hello", "-n", "2", "--ctx", "64", "--strategy", "predictor"],
    );
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("records.bin") && e.contains("sha256") && e.contains("differs"), "{e}");
    // unverified (--no-verify, or a record changed after the check), each record's CRC catches it
    let out = run_bin(
        "runtime",
        &[
            "run",
            mpath.to_str().unwrap(),
            "-p",
            "Hello",
            "-n",
            "2",
            "--ctx",
            "64",
            "--strategy",
            "predictor",
            "--no-verify",
        ],
    );
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    let record_off = manifest.records.offset(27, 100);
    assert!(
        e.contains("records.bin")
            && e.contains("CRC")
            && e.contains(&record_off.to_string())
            && e.contains("27")
            && e.contains("100"),
        "{e}"
    );

    // the scorer reads downT rows alone: a flipped byte there is caught by the scorer file's
    // CRC of that row (the gate byte flipped above is never read)
    let row_off = manifest.records.offset(28, 200) + 512 + 2 * 576 * 2;
    let mut bytes = std::fs::read(dir.join("records.bin")).unwrap();
    bytes[row_off as usize + 10] ^= 0x01;
    std::fs::write(dir.join("records.bin"), bytes).unwrap();
    let out = run_bin(
        "runtime",
        &[
            "run",
            mpath.to_str().unwrap(),
            "-p",
            "Hello",
            "-n",
            "2",
            "--ctx",
            "64",
            "--strategy",
            "scorer",
            "--set-scale",
            "1",
            "--no-verify",
        ],
    );
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("records.bin")
            && e.contains("downT row of layer 28, neuron 200")
            && e.contains("CRC32C mismatch")
            && e.contains(&row_off.to_string()),
        "{e}"
    );
}

/// `--strategy scorer`: the quality figures come from `--in-memory` (the engine over records.bin
/// held in memory, slots as a budget gives them); streaming at its smallest budget (slots = set
/// size) and above keeps the same sets, computes the same logits, and reads only the kept
/// neurons' downT rows (one 512-aligned span each).
#[test]
fn scorer_streaming_equals_in_memory() {
    let m = default_sparse();
    let manifest = formats::manifest::Manifest::load(m).unwrap();
    let (share, bonus) = (0.3, 2.0);
    let selector = runtime::stream::SelectorChoice::Scorer { resident_bonus: bonus };
    let settings = |budget| runtime::stream::StreamSettings {
        mem_budget_bytes: budget,
        ctx: 256,
        selector,
        set_scale: share,
        ..Default::default()
    };
    let minimum =
        runtime::open(m, &PreparedMode::Stream(settings(None))).unwrap().engine.expect("streaming").plan.minimum_bytes;
    // the smallest budget (slots = the needed set), then 1 MiB more (every layer holds more
    // rows than it needs, and all of them count)
    for extra in [0u64, 1 << 20] {
        let mut s = runtime::open(m, &PreparedMode::Stream(settings(Some(minimum + extra)))).unwrap();
        let e = s.engine().expect("streaming");
        assert_eq!(e.plan.slot_row_bytes, 576 * 2, "slots hold downT rows only");
        assert!(e.plan.predictor_bytes == 0 && e.plan.ranking_rows_bytes > 0);
        if extra == 0 {
            assert_eq!(e.plan.capacity, e.plan.set_sizes, "the smallest budget holds exactly the sets");
        } else {
            assert!(
                e.plan.capacity.iter().zip(&e.plan.set_sizes).all(|(c, k)| c > k),
                "{:?} {:?}",
                e.plan.capacity,
                e.plan.set_sizes
            );
        }
        let (slots, first) = (e.plan.capacity[0], e.dense_prefix);
        let n_ff = manifest.model.intermediate_size;
        let mem_mode = in_memory(selector, first, share, slots as f64 / n_ff as f64, runtime::HeadChoice::Resident);
        let mut mem = runtime::open(m, &mem_mode).unwrap();
        let ids = mem
            .tokenizer
            .encode("It was the best of times, it was the worst of times, it was the age of", true)
            .unwrap();
        let want = forward_logits(&mut mem, &ids);
        let got = forward_logits(&mut s, &ids);
        assert_eq!(want, got, "extra {extra}: streamed logits differ from the records held in memory");
        let p = mem.engine().expect("streaming");
        p.refresh_io_stats();
        let (p_loaded, p_computed, p_reuse) = (p.stats.rows_loaded, p.stats.computed_rows, p.stats.reuse_ratio());
        let e = s.engine().expect("streaming");
        e.refresh_io_stats();
        assert_eq!(e.stats.rows_loaded, p_loaded, "the same rows read as with records in memory");
        assert_eq!(e.stats.computed_rows, p_computed, "every held row counted, in both");
        let density = p_computed as f64 / (e.stats.tokens * e.plan.capacity.len() as u64 * n_ff as u64) as f64;
        let held = slots as f64 / n_ff as f64;
        assert!((density - held).abs() < 0.02, "density {density} vs slots {held}");
        assert!(p_reuse > 0.0 && p_reuse < 1.0, "reuse {p_reuse}");
        // one span of 1536 bytes (3 x 512 around the 1152-byte row) per row read
        assert_eq!(e.stats.bytes_read, e.stats.rows_loaded * 1536);
        assert_eq!(e.stats.read_requests, e.stats.rows_loaded);
    }
}

#[test]
fn too_small_budget_gives_the_minimum() {
    let m = default_sparse();
    let out = run_bin("runtime", &["run", m.to_str().unwrap(), "-p", "Hello", "-n", "2", "--mem-budget", "50MiB"]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("--mem-budget") && e.contains("at least") && e.contains("resident"), "{e}");
}

/// Runs `runtime bench` in a fresh cgroup v1 memory group limited to budget + 10%: with the
/// predictor, and with the 4-bit scorer and the Q8_0 head (whose f16 head, and the tied
/// embedding, must then stay out of memory); then `runtime perplexity`. Each peak RSS inside
/// its budget.
#[test]
fn runs_within_a_cgroup_memory_limit() {
    let m = default_sparse();
    // a 511-token prompt: its batches stage whole layers inside the same plan
    let prompt = repo_root().join("bench/prompt-512.txt");
    let p = prompt.to_str().unwrap();
    for (i, extra) in [
        vec!["--strategy", "predictor", "--prompt-file", p, "--ctx", "640"],
        vec!["--strategy", "scorer", "--set-scale", "0.3", "--prompt-file", p, "--ctx", "640"],
    ]
    .into_iter()
    .enumerate()
    {
        let budget = minimum_budget(m, &extra) + (4 << 20);
        let limit = budget + budget / 10;
        let (out, failcnt) = bench_in_memory_cgroup(&i.to_string(), m, budget, limit, &extra);
        let (r, rss) = within_budget(&format!("bench {extra:?}"), &out, budget, limit);
        assert!(
            r["bytes_read_per_token"].as_f64().unwrap() >= 0.0 && r["decode_tok_per_s"].as_f64().unwrap() > 0.0,
            "{r}"
        );
        if i == 1 {
            assert!(r["head_q8"].as_bool().unwrap() && r["set_rule"] == "scorer", "{r}");
        }
        assert!(r["prompt_tokens"].as_u64().unwrap() > 500, "{r}");
        assert_eq!(r["prompt_batched_tokens"], r["prompt_tokens"], "{r}");
        eprintln!(
            "{extra:?}: budget {budget}, limit {limit}, peak RSS {rss} ({:.3} of the budget), prompt batches of up to {} (beside full slots {}), failcnt {failcnt}",
            rss as f64 / budget as f64,
            r["prompt_batch"],
            r["prompt_batch_min"]
        );
    }
    // perplexity scores half of every chunk: its logits are taken a row at a time, so scoring
    // 256 positions holds what scoring one does
    let text = repo_root().join("data/text/lambada-500.txt");
    let budget = minimum_budget(m, &["--strategy", "scorer", "--ctx", "512"]) + (4 << 20);
    let limit = budget + budget / 10;
    let b = budget.to_string();
    let (out, failcnt) = runtime_in_memory_cgroup(
        "perplexity",
        limit,
        &[
            "perplexity",
            m.to_str().unwrap(),
            "--strategy",
            "scorer",
            "--mem-budget",
            &b,
            "--ctx",
            "512",
            "--chunks",
            "1",
            "--text",
            text.to_str().unwrap(),
            "--json",
        ],
    );
    let (r, rss) = within_budget("perplexity", &out, budget, limit);
    assert!(r["tokens_scored"] == 255 && r["perplexity"].as_f64().unwrap().is_finite(), "{r}");
    eprintln!(
        "perplexity: budget {budget}, peak RSS {rss} ({:.3} of the budget), failcnt {failcnt}",
        rss as f64 / budget as f64
    );
}

/// A run under a `limit`-byte cgroup succeeded and its JSON's peak RSS is inside `budget`:
/// the JSON and that peak.
fn within_budget(what: &str, out: &std::process::Output, budget: u64, limit: u64) -> (serde_json::Value, u64) {
    assert!(out.status.success(), "{what} under a {limit}-byte limit failed: {}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rss = r["peak_rss_bytes"].as_u64().unwrap();
    assert!(rss <= budget, "{what}: peak RSS {rss} over the budget {budget}");
    (r, rss)
}

/// The quality figures come from `--in-memory` (records.bin held in memory); streaming from
/// storage computes the same bits.
#[test]
fn streaming_equals_in_memory_predicted_sets() {
    let m = default_sparse();
    let mut mem = records_in_memory(m, 1.0);
    let ids =
        mem.tokenizer.encode("It was the best of times, it was the worst of times, it was the age of", true).unwrap();
    let want = forward_logits(&mut mem, &ids);
    let mut s = stream(m, None);
    let got = forward_logits(&mut s, &ids);
    assert_eq!(want, got, "streamed logits differ from the records held in memory");
    let e = s.engine().expect("streaming");
    let density = e.stats.computed_rows as f64 / (e.stats.tokens * e.plan.capacity.len() as u64 * 1536) as f64;
    assert!(density < 0.9, "sets are sparse: density {density}");
}

/// One preparation, several operating points: the manifest's default_dense_from runs layers
/// dense_prefix..default dense from records (same logits as --in-memory at that prefix), and
/// `--dense-prefix fit` lowers it to the largest prefix whose plan fits the budget.
#[test]
fn dense_from_moves_with_the_budget() {
    use runtime::stream::DensePrefix;
    let m = default_sparse();
    let mut manifest = formats::manifest::Manifest::load(m).unwrap();
    assert_eq!(manifest.sparsity.dense_prefix, 26);
    manifest.sparsity.default_dense_from = Some(28);
    let variant = m.with_file_name("manifest-default28.toml");
    manifest.save(&variant).unwrap();
    let open = |dense_prefix: DensePrefix, budget: Option<u64>| {
        let s =
            runtime::stream::StreamSettings { mem_budget_bytes: budget, ctx: 256, dense_prefix, ..Default::default() };
        runtime::open(&variant, &PreparedMode::Stream(s))
    };
    // the default prefix: layers 26 and 27 dense from records, 28.. streamed
    let mut mem = records_in_memory(&variant, 1.0);
    let ids = mem.tokenizer.encode("In the beginning the universe was created. This has made a lot of", true).unwrap();
    let want = forward_logits(&mut mem, &ids);
    let mut s = open(DensePrefix::Default, None).unwrap();
    let e = s.engine.as_deref().expect("streaming");
    assert_eq!((e.dense_prefix, e.plan.capacity.len()), (28, 2));
    let got = forward_logits(&mut s, &ids);
    assert_eq!(want, got, "streamed at dense prefix 28 differs from the records held in memory");
    // minimums per prefix: each dense layer costs n_ff slots more than its K_max
    let minimum = |l: usize| open(DensePrefix::Layer(l), None).unwrap().engine.expect("streaming").plan.minimum_bytes;
    let (m26, m27, m28) = (minimum(26), minimum(27), minimum(28));
    assert!(m26 < m27 && m27 < m28, "{m26} {m27} {m28}");
    let budget = (m27 + m28) / 2;
    let e = open(DensePrefix::Default, Some(budget)).err().expect("the default prefix does not fit").to_string();
    assert!(e.contains("at least") && e.contains("a fit dense prefix"), "{e}");
    let s = open(DensePrefix::Fit, Some(budget)).unwrap();
    let e = s.engine.as_deref().expect("streaming");
    assert_eq!(e.dense_prefix, 27, "the largest prefix within the budget");
    assert!(e.plan.total_bytes <= budget);
    let e = open(DensePrefix::Layer(25), None).err().expect("no heads below 26").to_string();
    assert!(e.contains("dense prefix 25") && e.contains("26..30"), "{e}");
}

/// Below the all-sparse minimum `fit` keeps every layer after the prefix sparse and cuts the
/// sets to the largest share of K_max that fits; a set scale streams the same logits as
/// `--in-memory` with that scale (the quality figures), and each layer reads at most its set.
#[test]
fn sets_shrink_below_the_all_sparse_minimum() {
    use runtime::stream::{DensePrefix, StreamSettings};
    let m = default_sparse();
    let open = |dense_prefix: DensePrefix, budget: Option<u64>, set_scale: f64| {
        let s = StreamSettings {
            mem_budget_bytes: budget,
            ctx: 256,
            dense_prefix,
            set_scale,
            record_sets: true,
            ..Default::default()
        };
        runtime::open(m, &PreparedMode::Stream(s))
    };
    let plan = |o: &runtime::Opened| o.engine.as_deref().expect("streaming").plan.clone();
    let minimum = |scale: f64| plan(&open(DensePrefix::Layer(26), None, scale).unwrap()).minimum_bytes;
    let k_max = formats::manifest::Manifest::load(m).unwrap().sparsity.k_max;
    let (full, half, sixty, quarter) = (minimum(1.0), minimum(0.5), minimum(0.6), minimum(0.25));
    assert!(quarter < half && half < sixty && sixty < full, "{quarter} {half} {sixty} {full}");
    // between the minimums at 0.5 and 0.6 of K_max: fit picks a scale in [0.5, 0.6)
    let budget = (half + sixty) / 2;
    let p = plan(&open(DensePrefix::Fit, Some(budget), 1.0).unwrap());
    assert_eq!(p.dense_prefix, 26);
    assert!(p.set_scale >= 0.5 && p.set_scale < 0.6, "set scale {}", p.set_scale);
    assert!(
        p.total_bytes <= budget && minimum(p.set_scale + 0.01) > budget,
        "the largest scale that fits: {}",
        p.set_scale
    );
    assert_eq!(p.set_sizes, runtime::predictor::scaled_set_sizes(&k_max, p.set_scale));
    assert!(p.capacity.iter().zip(&p.set_sizes).all(|(c, s)| c >= s));
    // below the minimum at the smallest scale fit tries: refused, naming that minimum and the full one
    let e = open(DensePrefix::Fit, Some(quarter - 1), 1.0).err().expect("nothing fits").to_string();
    assert!(
        e.contains(&quarter.to_string()) && e.contains("0.25 x K_max") && e.contains(&format!("{} MiB", full >> 20)),
        "{e}"
    );
    // a fixed scale streams what --in-memory computes at that scale
    let mut mem = records_in_memory(m, 0.5);
    let ids =
        mem.tokenizer.encode("Call me Ishmael. Some years ago, never mind how long precisely, having", true).unwrap();
    let want = forward_logits(&mut mem, &ids);
    let mut s = open(DensePrefix::Layer(26), None, 0.5).unwrap();
    let got = forward_logits(&mut s, &ids);
    assert_eq!(want, got, "streamed at set scale 0.5 differs from the records held in memory");
    let e = s.engine.as_deref().expect("streaming");
    let sizes = runtime::predictor::scaled_set_sizes(&k_max, 0.5);
    assert_eq!(e.history.len(), ids.len());
    for token in &e.history {
        for (set, &size) in token.iter().zip(&sizes) {
            // soft8 ranks the union of 8 candidate sets, each of K_max >= size neurons
            assert_eq!(set.len(), size, "a set of {} neurons for a size of {size}", set.len());
        }
    }
    let full_density = k_max.iter().sum::<usize>() as f64 / (k_max.len() * 1536) as f64;
    let needed = e.stats.rows_needed as f64 / (e.stats.tokens * k_max.len() as u64 * 1536) as f64;
    assert!(needed < 0.51 * full_density, "sets of {needed} of the neurons, K_max is {full_density}");
}

/// A preparation made before `prep scorer` has no scorer or Q8_0 head: asking for them is a
/// clear error naming the manifest and what to do.
#[test]
fn scorer_and_head_q8_missing_are_clear_errors() {
    let m = default_sparse();
    let src = m.parent().unwrap();
    let dir = scratch("stream-no-scorer");
    let text = std::fs::read_to_string(m).unwrap();
    // drop their [[artifacts]] blocks (and those of the stages after them)
    let kept: Vec<&str> = text
        .split("[[artifacts]]")
        .filter(|b| {
            !["scorer", "head_q8", "head_compact", "sketch", "reuse"]
                .iter()
                .any(|r| b.contains(&format!("role = \"{r}\"")))
        })
        .collect();
    std::fs::write(dir.join("manifest.toml"), kept.join("[[artifacts]]")).unwrap();
    for f in [
        "records.bin",
        "resident.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
        "cluster",
        "predictor",
        "capture",
        "importance",
        "layers",
    ] {
        std::os::unix::fs::symlink(src.join(f), dir.join(f)).unwrap();
    }
    let mpath = dir.join("manifest.toml");
    for (flags, what) in [
        (vec!["--strategy", "scorer"], "no scorer artifact"),
        (vec!["--strategy", "predictor", "-X", "head=q8"], "no head_q8 artifact"),
        (vec!["--strategy", "layers", "-X", "head=compact"], "no head_compact artifact"),
        (vec!["--in-memory", "--strategy", "scorer"], "no scorer artifact"),
    ] {
        let mut args = vec!["run", mpath.to_str().unwrap(), "-p", "Hello", "-n", "2", "--ctx", "64"];
        args.extend(&flags);
        let out = run_bin("runtime", &args);
        assert_eq!(out.status.code(), Some(1), "{flags:?}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(e.contains("manifest.toml") && e.contains(what) && e.contains("make prepare"), "{flags:?}: {e}");
    }
}

/// `runtime plan`: the operating point and the roofline's prediction for a budget on a device
/// file, llama.cpp's on a GGUF beside it; a budget below the minimum and a broken device file
/// are refused, naming the minimum and the field.
#[test]
fn plan_predicts_from_a_device_file_and_refuses_what_it_cannot() {
    let m = default_sparse();
    let device = repo_root().join("devices/this-machine.toml");
    let min = minimum_budget(m, &[]);
    let budget = (min + (4 << 20)).to_string();
    let (ok, out, err) = runtime_cli(&[
        "plan",
        m.to_str().unwrap(),
        "--mem-budget",
        &budget,
        "--device",
        device.to_str().unwrap(),
        "--gguf",
        fixture_gguf().to_str().unwrap(),
        "--json",
        "--no-verify",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ours = &v["ours"];
    assert!(
        ours["predicted_tok_per_s"].as_f64().unwrap() > 0.0 && ours["compute_s_per_token"].as_f64().unwrap() > 0.0,
        "{v}"
    );
    assert!(
        ours["bytes_per_token"]["a3_memory"].as_u64().unwrap() > 0
            && ours["bytes_per_token"]["a0_memory"].as_u64().unwrap() > 0,
        "{v}"
    );
    // at the minimum a layer holds only its set: the reads it needs are counted
    let reads = ours["bytes_per_token"]["a1_storage"].as_u64().unwrap()
        + ours["bytes_per_token"]["a2_storage"].as_u64().unwrap();
    assert!(
        reads > 0 && ours["exposed_io_s_per_token"].as_f64().unwrap() <= ours["io_s_per_token"].as_f64().unwrap(),
        "{v}"
    );
    let llama = &v["llama_cpp"][0]["prediction"];
    assert!(llama["predicted_tok_per_s"].as_f64().unwrap() > 0.0, "{v}");
    // the same strategy with every row held (no budget; auto would plan dense): no reads,
    // nothing exposed. (Not necessarily faster: a whole-record strategy that holds every row
    // sums every row, where the minimum sums its few slots.)
    let (ok, out, err) = runtime_cli(&[
        "plan",
        m.to_str().unwrap(),
        "--strategy",
        ours["selector"].as_str().unwrap(),
        "--device",
        device.to_str().unwrap(),
        "--json",
        "--no-verify",
    ]);
    assert!(ok, "{err}");
    let all: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(all["ours"]["exposed_io_s_per_token"].as_f64(), Some(0.0));
    let b = &all["ours"]["bytes_per_token"];
    assert_eq!((b["a1_storage"].as_u64(), b["a2_storage"].as_u64()), (Some(0), Some(0)), "{all}");
    assert!(all["ours"]["predicted_tok_per_s"].as_f64().unwrap() > 0.0, "{all}");
    let (ok, _, err) = runtime_cli(&[
        "plan",
        m.to_str().unwrap(),
        "--mem-budget",
        "1MiB",
        "--device",
        device.to_str().unwrap(),
        "--no-verify",
    ]);
    assert!(!ok && err.contains("at least"), "{err}");
    // below our minimum, llama.cpp's prediction is still answered, beside our refusal
    let (ok, out, err) = runtime_cli(&[
        "plan",
        m.to_str().unwrap(),
        "--mem-budget",
        "1MiB",
        "--device",
        device.to_str().unwrap(),
        "--gguf",
        fixture_gguf().to_str().unwrap(),
        "--json",
        "--no-verify",
    ]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert!(v["ours"].is_null() && v["ours_refused"].as_str().unwrap().contains("at least"), "{v}");
    let l = &v["llama_cpp"][0]["prediction"];
    assert!(!l["fits"].as_bool().unwrap() && l["predicted_tok_per_s"].as_f64().unwrap() > 0.0, "{v}");
    let dir = scratch("plan-device");
    let bad = dir.join("device.toml");
    std::fs::write(&bad, std::fs::read_to_string(&device).unwrap().replacen("threads = ", "threads = 0\n# was ", 1))
        .unwrap();
    let (ok, _, err) = runtime_cli(&["plan", m.to_str().unwrap(), "--device", bad.to_str().unwrap(), "--no-verify"]);
    assert!(!ok && err.contains("device.toml") && err.contains("threads"), "{err}");
    std::fs::write(
        &bad,
        std::fs::read_to_string(&device).unwrap().replacen(
            "threads = ",
            "llama_cpp_token_overhead_s = -0.01\nthreads = ",
            1,
        ),
    )
    .unwrap();
    let (ok, _, err) = runtime_cli(&["plan", m.to_str().unwrap(), "--device", bad.to_str().unwrap(), "--no-verify"]);
    assert!(!ok && err.contains("device.toml") && err.contains("llama_cpp_token_overhead_s"), "{err}");
}

/// The preparation's reuse table (prep's reuse stage) for the scorer, sketch and layers: shares
/// in [0, 1], more slots never hold less; `runtime plan` of the scorer reads it at the plan's set
/// and slot shares instead of the floor held / n_ff; a broken table is refused, naming it.
#[test]
fn plan_reads_the_preparations_reuse_table() {
    let m = default_sparse();
    let path = m.parent().unwrap().join("scorer/reuse.json");
    let t = formats::reuse_table::ReuseTable::load(&path).unwrap();
    assert_eq!(t.rules.keys().collect::<Vec<_>>(), ["layers", "scorer", "sketch"]);
    assert!(t.tokens > 0 && t.rules.values().flatten().flatten().all(|r| (0.0..=1.0).contains(r)), "{t:?}");
    for row in t.rules.values().flatten() {
        assert!(row.windows(2).all(|w| w[1] >= w[0] - 0.02), "more slots hold less: {row:?}");
        // (every row held still misses a row's first use: the CI recipe's sequences are short)
        assert!(row.iter().all(|r| r <= row.last().unwrap()) && row[0] < *row.last().unwrap(), "{row:?}");
    }
    let device = repo_root().join("devices/this-machine.toml");
    let min = minimum_budget(m, &["--strategy", "scorer"]);
    let budget = (min + (2 << 20)).to_string();
    let args = |manifest: &Path| {
        vec![
            "plan".to_string(),
            manifest.display().to_string(),
            "--strategy".into(),
            "scorer".into(),
            "--mem-budget".into(),
            budget.clone(),
            "--device".into(),
            device.display().to_string(),
            "--json".into(),
            "--no-verify".into(),
        ]
    };
    let run = |manifest: &Path| {
        let a = args(manifest);
        runtime_cli(&a.iter().map(|s| s.as_str()).collect::<Vec<_>>())
    };
    let (ok, out, err) = run(m);
    assert!(ok, "{err}");
    let ours = serde_json::from_str::<serde_json::Value>(&out).unwrap()["ours"].clone();
    let n_ff = 1536.0;
    let (set, slots) = (ours["mean_set_rows"].as_f64().unwrap() / n_ff, ours["mean_slots"].as_f64().unwrap() / n_ff);
    assert!(slots < 1.0 && ours["reuse_source"].as_str().unwrap().contains("reuse table"), "{ours}");
    let want = t.at("scorer", set, slots).unwrap();
    assert!(
        (ours["reuse"].as_f64().unwrap() - want).abs() < 1e-9 && want > slots,
        "the table, above the floor: {ours}"
    );
    // a copy whose table has a share above 1: refused, naming the file
    let dir = scratch("plan-bad-reuse");
    let src = m.parent().unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let e = e.unwrap();
        if e.file_name() != "scorer" {
            std::os::unix::fs::symlink(e.path(), dir.join(e.file_name())).unwrap();
        }
    }
    std::fs::create_dir_all(dir.join("scorer")).unwrap();
    for f in ["scorer.safetensors", "head_q8.safetensors", "head_compact.safetensors"] {
        std::os::unix::fs::symlink(src.join("scorer").join(f), dir.join("scorer").join(f)).unwrap();
    }
    let mut bad = t.clone();
    bad.rules.get_mut("sketch").unwrap()[0][0] = 1.5;
    // (as long as the original, which the manifest's size check would refuse first)
    let mut text = serde_json::to_string(&bad).unwrap();
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    assert!(text.len() <= len);
    text.extend(std::iter::repeat_n(' ', len - text.len()));
    std::fs::write(dir.join("scorer/reuse.json"), text).unwrap();
    let (ok, out, err) = run(&dir.join("manifest.toml"));
    assert!(!ok && out.is_empty() && err.contains("reuse.json") && err.contains("sketch: reuse[0][0] = 1.5"), "{err}");
}

/// Every device file shipped in devices/ loads and passes its checks.
#[test]
fn shipped_device_files_load() {
    let dir = repo_root().join("devices");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let d = formats::device::DeviceFile::load(&p).unwrap_or_else(|e| panic!("{e}"));
            assert!(d.request_s(4096, 32) > 0.0);
            n += 1;
        }
    }
    assert!(n >= 3, "devices/ holds this machine, a Jetson and a Pi 5");
}

/// The reuse simulation runs the scorer with its resident bonus, as a streamed run does: a held
/// row's counting more keeps more of each token's set in the slots, so the simulated reuse rises
/// with the bonus; the table prep writes records the run's default.
#[test]
fn the_reuse_simulation_counts_the_resident_bonus() {
    use runtime::reuse::ReuseSimulation;
    use runtime::scorer::SCORER_RESIDENT_BONUS;
    use runtime::select::{scored::ScoredSelector, LayerChooser};
    let m = default_sparse();
    let mf = formats::manifest::Manifest::load(m).unwrap();
    let (model, tok) = runtime::open_model(&fixture_model(), runtime::DecodeLayout::Mapped).unwrap();
    let text = std::fs::read_to_string(data_text("hamlet.txt")).unwrap();
    let ids: Vec<u32> = tok.encode(&text[..4000], true).unwrap().into_iter().take(160).collect();
    let reuse = |bonus: f32| {
        let scorer = ScoredSelector::load(m, &mf, bonus).unwrap();
        let f = &scorer.scorer.file;
        let (first, n_layers, n_ff) = (f.first_layer, f.first_layer + f.n_layers, f.n_ff);
        let chooser: &dyn LayerChooser = &scorer;
        let mut sim =
            ReuseSimulation::new("scorer".into(), chooser, first, n_layers, n_ff, &[0.1, 0.25], &[0.3, 0.5], 16);
        let mut cache = model.new_cache(ids.len()).unwrap();
        model.forward_observed(&ids, &mut cache, ids.len(), Some(&mut sim)).unwrap();
        sim.reuse()
    };
    let (one, more) = (reuse(1.0), reuse(SCORER_RESIDENT_BONUS));
    let mean = |r: &Vec<Vec<f64>>| r.iter().flatten().sum::<f64>() / 4.0;
    for (a, b) in one.iter().flatten().zip(more.iter().flatten()) {
        assert!(*b >= a - 0.02, "bonus {SCORER_RESIDENT_BONUS} held less: {more:?} against {one:?}");
    }
    assert!(mean(&more) > mean(&one) + 0.02, "the bonus changed nothing: {more:?} against {one:?}");
    let t = formats::reuse_table::ReuseTable::load(&m.parent().unwrap().join("scorer/reuse.json")).unwrap();
    assert_eq!(t.scorer_resident_bonus, SCORER_RESIDENT_BONUS as f64);
}

/// The largest difference between two KV caches' filled positions, over every layer.
fn kv_diff(a: &runtime::kv_cache::KvCache, b: &runtime::kv_cache::KvCache) -> f32 {
    assert_eq!(a.len, b.len, "caches of different lengths");
    let n = a.len * a.kv_dim;
    let mut worst = 0f32;
    for (x, y) in a.k.iter().zip(&b.k).chain(a.v.iter().zip(&b.v)) {
        for (p, q) in x[..n].iter().zip(&y[..n]) {
            worst = worst.max((p.to_f32() - q.to_f32()).abs());
        }
    }
    worst
}

/// A prompt through the streaming engine goes in batches, each streamed layer's whole MLP
/// staged from storage: its KV cache is the dense model's batched one, at the minimum budget
/// too, whether staged from dense_mlp.safetensors (the native preparation: the GGUF's blocks)
/// or from records.bin (f16); with every neuron kept, the logits of the token after it are the
/// dense model's; a prompt longer than one batch goes in several; what goes through the
/// slots' reader after it is the warm slots' rows, once each.
#[test]
fn a_batched_prompt_streams_exactly() {
    let native = fixture_gguf_preparation(&scratch("stream-batched-native"), "native").join("manifest.toml");
    let text = "The quick brown fox jumps over the lazy dog, and then it runs into the forest where the trees are tall and the air is cold. ".repeat(6);
    for (manifest, budget) in [
        (all_neurons().clone(), None),
        (
            default_sparse().clone(),
            Some(minimum_budget(default_sparse(), &["--ctx", "256", "--strategy", "predictor"])),
        ),
        (native.clone(), Some(minimum_budget(&native, &["--ctx", "256", "--strategy", "predictor"]))),
    ] {
        // the reference: every layer dense, every row in memory, one batch
        let mut dense = runtime::open(&manifest, &PreparedMode::Dense { head: runtime::HeadChoice::Resident }).unwrap();
        let ids = dense.tokenizer.encode(&text, true).unwrap();
        assert!(ids.len() > 64, "{} tokens", ids.len());
        let m = ids.len() - 1;
        let mut want_cache = dense.model.new_cache(256).unwrap();
        let want = dense.runner().forward(&ids, &mut want_cache, m).unwrap();
        let mut want_prompt = dense.model.new_cache(256).unwrap();
        dense.runner().forward(&ids[..m], &mut want_prompt, m).unwrap();

        let mut s = stream(&manifest, budget);
        let batches = s.engine().unwrap().plan.prompt_batches(m);
        let mut cache = s.model.new_cache(256).unwrap();
        let got = s.runner().forward(&ids[..m], &mut cache, m).unwrap();
        assert!(got.is_empty(), "no logits of a prompt");
        let n_layers = s.model.config.num_hidden_layers;
        let e = s.engine().unwrap();
        e.refresh_io_stats();
        assert_eq!(e.stats.prompt_tokens, m as u64, "{}: every prompt token in a batch", manifest.display());
        assert_eq!(e.stats.tokens, 0, "no token through the slots");
        // the warm slots fill at the next token, after the batches' logits are out
        assert_eq!(e.stats.warmed_rows, 0, "{}: warm slots filled before the first token", manifest.display());
        e.warm_slots().unwrap();
        e.refresh_io_stats();
        assert!(e.stats.warmed_rows > 0, "{}: no slot warmed", manifest.display());
        assert_eq!(e.stats.read_requests, e.stats.warm_requests, "{}", manifest.display());
        // each warm row read once: alone, or in a read that takes in the small gaps around it
        assert!(e.stats.read_requests <= e.stats.warmed_rows, "{}", manifest.display());
        assert!(e.stats.bytes_read >= e.stats.warmed_rows * e.read_span_bytes as u64, "{}", manifest.display());
        let (batch, batches) = (batches[0], batches.len() as u64);
        let sparse_layers = (e.dense_prefix..n_layers).count() as u64;
        assert!(e.stats.prompt_bytes_read > 0 && sparse_layers > 0, "{}", manifest.display());
        let per_layer = e.stats.prompt_bytes_read / (batches * sparse_layers);
        eprintln!(
            "{}: {m} prompt tokens in {batches} batches (the first of {batch}), {sparse_layers} streamed layers staged, {:.1} MiB per layer",
            manifest.display(),
            per_layer as f64 / 1048576.0
        );
        let d = kv_diff(&cache, &want_prompt);
        assert!(d <= 1e-2, "{}: the streamed prompt's KV cache differs by {d}", manifest.display());
        if budget.is_none() {
            // every neuron kept: the next token's logits are the dense model's
            let last = s.runner().forward(&ids[m..], &mut cache, 0).unwrap();
            let vocab = s.model.vocab_size();
            let diff = max_abs_diff(&last, &want[..vocab]);
            assert!(diff < BATCHED_VS_TOKEN_BY_TOKEN, "{}: logits differ by {diff}", manifest.display());
        }
        // the whole prompt, its last token's logits wanted: they come from the last batch, the
        // dense model's at any budget, and no token goes through the slots
        let mut s = stream(&manifest, budget);
        let mut cache = s.model.new_cache(256).unwrap();
        let last = s.runner().forward(&ids, &mut cache, m).unwrap();
        let diff = max_abs_diff(&last, &want);
        assert!(diff < BATCHED_VS_TOKEN_BY_TOKEN, "{}: the last batch's logits differ by {diff}", manifest.display());
        let e = s.engine().unwrap();
        assert_eq!((e.stats.prompt_tokens, e.stats.tokens), (ids.len() as u64, 0), "{}", manifest.display());
        assert!(kv_diff(&cache, &want_cache) <= 1e-2, "{}", manifest.display());
    }
}

/// A record that fails its check while a prompt batch stages its layer fails the prompt with the
/// record's layer, neuron and offset, leaves the cache where it was, and the same prompt fails
/// the same way again (nothing of the failed batch is kept).
#[test]
fn a_corrupt_record_fails_the_prompt_batch() {
    let m = default_sparse();
    let dir = copy_with_own_records(m, "stream-batched-crc");
    let manifest = formats::manifest::Manifest::load(m).unwrap();
    let off = manifest.records.offset(28, 7) + 512 + 5;
    let mut bytes = std::fs::read(dir.join("records.bin")).unwrap();
    bytes[off as usize] ^= 0x10;
    std::fs::write(dir.join("records.bin"), &bytes).unwrap();
    let s = runtime::stream::StreamSettings { ctx: 256, ..Default::default() };
    let mut o = runtime::open_with(&dir.join("manifest.toml"), &PreparedMode::Stream(s), false).unwrap();
    let ids = o.tokenizer.encode("One two three four five six seven eight nine ten", true).unwrap();
    let mut cache = o.model.new_cache(256).unwrap();
    for _ in 0..2 {
        let e = o.runner().forward(&ids, &mut cache, ids.len()).expect_err("a corrupt record").to_string();
        assert!(e.contains("layer 28, neuron 7") && e.contains("CRC32C"), "{e}");
        assert_eq!(cache.len, 0, "a failed batch leaves nothing in the cache");
    }
}

/// After a prompt, each streamed layer's slots hold the rows of the neurons the prompt used
/// most (warm slots), read from records.bin: whole version-2 records and their down rows
/// alone, whole f16 records. The first decode token then reads fewer rows than from empty
/// slots.
#[test]
fn warm_slots_hold_the_records_rows() {
    let native = fixture_gguf_preparation(&scratch("stream-warm-native"), "native").join("manifest.toml");
    let text = "In the morning the baker opens his shop, lights the ovens and sets out the bread. ".repeat(4);
    for (manifest, strategy, name) in [
        (native.clone(), runtime::stream::SelectorChoice::Scorer { resident_bonus: 2.0 }, "scorer"),
        (native.clone(), runtime::stream::SelectorChoice::default(), "predictor"),
        (default_sparse().clone(), runtime::stream::SelectorChoice::default(), "predictor"),
    ] {
        let m = formats::manifest::Manifest::load(&manifest).unwrap();
        let rf = runtime::model::records_file_of(&manifest, &m).unwrap();
        // slots for a little more than the sets: the prompt's working set cannot be all of it
        let mut settings =
            runtime::stream::StreamSettings { ctx: 256, selector: strategy, set_scale: 0.5, ..Default::default() };
        settings.mem_budget_bytes = Some(1);
        let minimum = match runtime::open(&manifest, &PreparedMode::Stream(settings.clone())) {
            Err(runtime::RuntimeError::BudgetTooSmall { minimum, .. }) => minimum,
            _ => panic!("{name}: a budget of one byte runs"),
        };
        settings.mem_budget_bytes = Some(minimum + (1 << 20));
        let mut o = runtime::open(&manifest, &PreparedMode::Stream(settings.clone())).unwrap();
        let ids = o.tokenizer.encode(&text, true).unwrap();
        let mut cache = o.model.new_cache(256).unwrap();
        o.runner().forward(&ids[..ids.len() - 1], &mut cache, ids.len() - 1).unwrap();
        let e = o.engine().unwrap();
        e.warm_slots().unwrap();
        assert!(e.stats.warmed_rows > 0, "{}: no slot warmed", manifest.display());
        let n_sparse = e.plan.capacity.len();
        for si in 0..n_sparse {
            let layer = e.dense_prefix + si;
            let held = e.held_rows(si);
            assert!(!held.is_empty(), "layer {layer} holds nothing");
            for (j, row) in held {
                let want: Vec<u8> = match (rf.shape, row.len()) {
                    (Some(_), n) => {
                        let b = rf.read_blocks(layer, j as usize).unwrap();
                        if n == b.down.len() {
                            b.down
                        } else {
                            [b.gate, b.up, b.down].concat()
                        }
                    }
                    (None, _) => {
                        let r = rf.read(layer, j as usize).unwrap();
                        r.gate.iter().chain(&r.up).chain(&r.down_t).flat_map(|v| v.to_le_bytes()).collect()
                    }
                };
                assert!(
                    row == want.as_slice(),
                    "{}: layer {layer}, neuron {j}: a warm slot differs from its record",
                    manifest.display()
                );
            }
        }
        // the next token reads only what the prompt's working set lacks
        let warm_read = {
            o.runner().forward(&ids[ids.len() - 1..], &mut cache, 0).unwrap();
            let e = o.engine().unwrap();
            e.stats.rows_loaded
        };
        // the same prompt, then its slots emptied before the token
        let mut cold = runtime::open(&manifest, &PreparedMode::Stream(settings)).unwrap();
        let mut cache = cold.model.new_cache(256).unwrap();
        cold.runner().forward(&ids[..ids.len() - 1], &mut cache, ids.len() - 1).unwrap();
        cold.engine().unwrap().begin_sequence();
        cold.runner().forward(&ids[ids.len() - 1..], &mut cache, 0).unwrap();
        let cold_read = cold.engine().unwrap().stats.rows_loaded;
        eprintln!("{} ({strategy:?}): first decode token reads {warm_read} rows after the prompt's warm slots, {cold_read} from empty slots", manifest.display());
        assert!(warm_read < cold_read, "{warm_read} rows read after warm slots, {cold_read} cold");
    }
}
