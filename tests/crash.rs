//! Crash safety of `prep prepare`: killed with SIGKILL at random points of its stages (many
//! seeds, one to three kills each), then run again to the end, a preparation's artifacts equal a
//! clean run's byte for byte (the manifest but for its provenance: time and the recipe's paths),
//! and nothing half-written is ever taken for good (every file is
//! written to a temporary name and renamed; a stage's stamp is written after its outputs).
//! On the synthetic model (tests::synthetic_recipe): a clean prepare takes about a second.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tests::*;

/// Every file under `dir` (relative path -> bytes), without the stamps and the verification cache.
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                if !name.starts_with(".stamp-") && !name.ends_with(".verified.json") {
                    out.push((p.strip_prefix(dir).unwrap().to_path_buf(), std::fs::read(&p).unwrap()));
                }
            }
        }
    }
    out.sort();
    out
}

/// What must match a clean run: artifacts byte for byte; the reports (timings) and the
/// manifest (its creation time) with their times removed.
fn comparable(rel: &Path, bytes: &[u8]) -> Vec<u8> {
    let name = rel.to_string_lossy();
    if name == "manifest.toml" {
        // everything but the provenance (its time, and the recipe's paths, which name each run's folder)
        let mut v: toml::Value = toml::from_str(&String::from_utf8_lossy(bytes))
            .unwrap_or_else(|e| panic!("manifest.toml after a crash: {e}"));
        v.as_table_mut().unwrap().remove("provenance");
        return toml::to_string(&v).unwrap().into_bytes();
    }
    if name.ends_with(".json") && !name.ends_with("thresholds.json") {
        // reports: they must parse; their figures include seconds
        let v: serde_json::Value =
            serde_json::from_slice(bytes).unwrap_or_else(|e| panic!("{name}: not JSON after a crash: {e}"));
        return format!("report with {} keys", v.as_object().map_or(0, |o| o.len())).into_bytes();
    }
    bytes.to_vec()
}

#[test]
fn sigkill_at_random_points_then_rerun_equals_a_clean_run() {
    let clean_dir = scratch("crash-clean");
    let recipe = synthetic_recipe(&clean_dir);
    let t0 = Instant::now();
    let out = run_bin("prep", &["prepare", recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let clean_ms = t0.elapsed().as_millis() as u64;
    let clean = files(&clean_dir.join("artifacts"));
    let bin = repo_root().join("target/release/prep");
    let seeds: u64 = std::env::var("CRASH_SEEDS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let mut kills = 0;
    for seed in 0..seeds {
        let dir = scratch(&format!("crash-{seed}"));
        let recipe = synthetic_recipe(&dir);
        let mut rng = Xorshift(0xdead_0000 + seed);
        for _ in 0..1 + rng.next_u64() % 3 {
            let mut child = std::process::Command::new(&bin)
                .args(["prepare", recipe.to_str().unwrap()])
                .stderr(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap();
            std::thread::sleep(Duration::from_millis(rng.next_u64() % clean_ms.max(1)));
            // SAFETY-free: a plain kill(2) through the shell's kill; the child may have finished
            let _ = std::process::Command::new("kill").args(["-KILL", &child.id().to_string()]).status();
            let _ = child.wait();
            kills += 1;
        }
        let out = run_bin("prep", &["prepare", recipe.to_str().unwrap()]);
        assert!(out.status.success(), "seed {seed}: the rerun failed: {}", String::from_utf8_lossy(&out.stderr));
        let got = files(&dir.join("artifacts"));
        let names = |v: &[(PathBuf, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
        assert_eq!(names(&got), names(&clean), "seed {seed}: other files (a leftover .tmp?)");
        for ((rel, a), (_, b)) in got.iter().zip(&clean) {
            assert!(
                comparable(rel, a) == comparable(rel, b),
                "seed {seed}: {} differs from a clean run",
                rel.display()
            );
        }
        // and the preparation verifies and runs
        let m = dir.join("artifacts/manifest.toml");
        formats::manifest::Manifest::load(&m).unwrap().verify_checksums(&m).unwrap();
    }
    eprintln!("{seeds} seeds, {kills} SIGKILLs within a {clean_ms} ms prepare: every rerun equals the clean run");
}

/// The disk filling up in any stage of `prep prepare` is one clear error (exit 1, the file and
/// "No space left on device", no panic) and leaves nothing taken for good: once there is room,
/// the rerun equals a clean run. The artifacts folder is a small tmpfs (root), swept through
/// sizes that run out in different stages.
#[test]
fn disk_full_in_each_stage_is_one_clear_error_and_the_rerun_recovers() {
    let clean_dir = scratch("enospc-clean");
    let recipe = synthetic_recipe(&clean_dir);
    let out = run_bin("prep", &["prepare", recipe.to_str().unwrap()]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let clean = files(&clean_dir.join("artifacts"));
    let mut stages = std::collections::BTreeSet::new();
    // the sizes where the synthetic preparation runs out in each stage, its stamps, the tokenizer
    // copy and the manifest (found by a sweep; tmpfs counts whole pages)
    for size_kb in [48, 200, 360, 364, 368, 372, 380, 400, 440, 800, 1500, 1800, 1820, 1824, 1900, 1928, 1932, 1936] {
        let dir = scratch(&format!("enospc-{size_kb}"));
        let recipe = synthetic_recipe(&dir);
        let mnt = dir.join("artifacts");
        std::fs::create_dir_all(&mnt).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size_kb}k"), "tmpfs", mnt.to_str().unwrap()])
            .status()
            .unwrap();
        assert!(mounted.success(), "cannot mount a tmpfs (the test needs root)");
        let out = run_bin("prep", &["prepare", recipe.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let grow = std::process::Command::new("mount")
            .args(["-o", "remount,size=16m", mnt.to_str().unwrap()])
            .status()
            .unwrap();
        let rerun = run_bin("prep", &["prepare", recipe.to_str().unwrap()]);
        let got = files(&mnt);
        let _ = std::process::Command::new("umount").arg(&mnt).status();
        if !out.status.success() {
            assert_eq!(out.status.code(), Some(1), "{size_kb} KiB: {err}");
            assert!(err.contains("No space left on device") && !err.contains("panicked"), "{size_kb} KiB: {err}");
            if let Some(stage) = err.split("stage ").nth(1).and_then(|s| s.split(':').next()) {
                stages.insert(stage.to_string());
            } else if err.contains("manifest.toml.tmp") || err.contains("tokenizer.json.tmp") {
                stages.insert("manifest".into());
            } else if err.contains(".stamp-") {
                stages.insert("stamp".into());
            }
        }
        assert!(
            grow.success() && rerun.status.success(),
            "{size_kb} KiB: the rerun failed: {}",
            String::from_utf8_lossy(&rerun.stderr)
        );
        let names = |v: &[(PathBuf, Vec<u8>)]| v.iter().map(|f| f.0.clone()).collect::<Vec<_>>();
        assert_eq!(names(&got), names(&clean), "{size_kb} KiB: other files after the rerun");
        for ((rel, a), (_, b)) in got.iter().zip(&clean) {
            assert!(
                comparable(rel, a) == comparable(rel, b),
                "{size_kb} KiB: {} differs from a clean run",
                rel.display()
            );
        }
    }
    eprintln!("disk full in stages {stages:?}: each one clear error, each rerun equal to a clean run");
    assert!(stages.len() >= 6, "the sweep should run out of space in several stages, got {stages:?}");
}
