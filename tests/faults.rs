//! I/O faults while streaming, injected for real: the synthetic preparation is served through
//! scripts/faultfs.py, a FUSE file system that fails chosen reads of records.bin with EIO or
//! answers them short (root, libfuse2 and fusepy: `make setup` installs them). A failed read is
//! one error naming the file and the byte offset, never a token; a short read is retried (or,
//! where the kernel misreports it, refused by the record's CRC32C), never computed from. Also:
//! the records file vanishing.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::OnceLock;
use std::time::{Duration, Instant};
use tests::*;

fn prepared() -> &'static PathBuf {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| prepare_synthetic(&scratch("faults-synthetic")))
}

/// A faultfs mount of the preparation's folder; unmounted when dropped.
struct FaultMount {
    dir: PathBuf,
    child: Child,
}

impl FaultMount {
    fn new(name: &str, fault: &str) -> Self {
        let src = prepared().parent().unwrap();
        let dir = scratch(name).join("mnt");
        std::fs::create_dir_all(&dir).unwrap();
        let child = Command::new("python3")
            .args([
                repo_root().join("scripts/faultfs.py").to_str().unwrap(),
                src.to_str().unwrap(),
                dir.to_str().unwrap(),
                "--file",
                "records.bin",
                "--fault",
                fault,
            ])
            .spawn()
            .expect("python3 scripts/faultfs.py (make setup installs libfuse2 and fusepy)");
        let t0 = Instant::now();
        while !dir.join("manifest.toml").exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "faultfs did not mount {} (needs root, libfuse2 and fusepy: make setup)",
                dir.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        FaultMount { dir, child }
    }

    fn manifest(&self) -> PathBuf {
        self.dir.join("manifest.toml")
    }
}

impl Drop for FaultMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = self.child.wait();
    }
}

fn run(manifest: &Path, extra: &[&str]) -> (bool, String, String) {
    let mut args =
        vec!["run", manifest.to_str().unwrap(), "-p", "the hat is in the tent", "-n", "6", "--ignore-eos", "--json"];
    args.extend(extra);
    runtime_cli(&args)
}

/// The record of (layer, neuron) in the synthetic preparation: (byte offset, bytes).
fn record(layer: usize, neuron: usize) -> (u64, u64) {
    let m = formats::manifest::Manifest::load(prepared()).unwrap();
    (m.records.offset(layer, neuron), m.records.record_bytes as u64)
}

#[test]
fn eio_on_a_record_is_one_error_naming_file_and_offset() {
    // every neuron of the second sparse layer: whatever the sets, a read hits the fault
    let layer = formats::manifest::Manifest::load(prepared()).unwrap().records.first_layer + 1;
    let (start, _) = record(layer, 0);
    let (end, rb) = record(layer, SYNTH_FF - 1);
    let mount = FaultMount::new("faults-eio", &format!("eio:{start}-{}", end + rb));
    // verified at load (the sha256 reads every byte), then while streaming, for both selectors
    let (ok, _, err) = run(&mount.manifest(), &[]);
    assert!(
        !ok && err.contains("records.bin") && err.contains("Input/output error") && err.contains("byte offset"),
        "at load: {err}"
    );
    for strategy in ["predictor", "scorer"] {
        let (ok, out, err) = run(&mount.manifest(), &["--strategy", strategy, "--set-scale", "1", "--no-verify"]);
        assert!(!ok && out.trim().is_empty(), "{strategy}: a failed read produced output: {out}");
        let offset: u64 = err
            .split("byte offset ")
            .nth(1)
            .and_then(|s| s.trim_end_matches(|c: char| !c.is_ascii_digit()).split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{strategy}: no offset in {err}"));
        assert!(err.contains("records.bin") && err.contains("Input/output error"), "{strategy}: {err}");
        assert!(
            offset + 4096 >= start && offset < end + rb,
            "{strategy}: offset {offset} outside the failing range {start}..{}",
            end + rb
        );
    }
}

/// Short reads. Through pread (`-X pread`) they are retried and the run computes exactly what it
/// computes without the fault. Through io_uring this kernel reports a short FUSE reply as a full
/// read (its async direct-I/O accounting: a 1,024-byte read answered with 512 bytes completes as
/// 1,024), leaving stale bytes in the buffer: the record's CRC32C must then refuse them, naming the
/// record; the run may never compute from them.
#[test]
fn short_reads_are_retried_or_refused_never_computed_from() {
    let mount = FaultMount::new("faults-short", "short");
    let pick = |s: &str| {
        let v: serde_json::Value = serde_json::from_str(s.trim().lines().last().unwrap()).unwrap();
        (v["token_ids"].clone(), v["top2_logit_margins"].clone(), v["sparsity"]["rows_loaded"].clone())
    };
    for strategy in ["predictor", "scorer"] {
        let (ok, direct, err) = run(prepared(), &["--strategy", strategy, "--no-verify"]);
        assert!(ok, "{err}");
        let (ok, faulted, err) = run(&mount.manifest(), &["--strategy", strategy, "--no-verify", "-X", "pread"]);
        assert!(ok, "{strategy} over short reads, pread: {err}");
        assert_eq!(pick(&faulted), pick(&direct), "{strategy}: short reads changed the result");
        let (ok, faulted, err) = run(&mount.manifest(), &["--strategy", strategy, "--no-verify"]);
        if ok {
            assert_eq!(pick(&faulted), pick(&direct), "{strategy}: short reads through io_uring changed the result");
        } else {
            assert!(
                err.contains("records.bin") && err.contains("CRC32C mismatch") && faulted.trim().is_empty(),
                "{strategy}: {err}"
            );
        }
    }
}

#[test]
fn a_vanished_records_file_is_an_error_naming_it() {
    let dir = scratch("faults-vanished");
    link_all_but(prepared().parent().unwrap(), &dir, "records.bin");
    let (ok, _, err) = run(&dir.join("manifest.toml"), &["--no-verify"]);
    assert!(!ok && err.contains("records.bin") && err.contains("No such file"), "{err}");
}

/// The reader itself over short reads (pread): every run's bytes equal the file's.
#[test]
fn the_record_reader_reassembles_short_reads() {
    use runtime::stream::reader::{ReaderOptions, RecordReader, Run};
    let mount = FaultMount::new("faults-reader", "short");
    let want = std::fs::read(prepared().parent().unwrap().join("records.bin")).unwrap();
    let o = ReaderOptions {
        queue_depth: 8,
        force_pread: true,
        staging_bytes: 1 << 20,
        register_staging: false,
        hold_in_memory: false,
    };
    let mut r = RecordReader::open(&mount.dir.join("records.bin"), &o).unwrap();
    let runs = [
        Run { offset: 0, bytes: 1024, staging_offset: 0 },
        Run { offset: 8192, bytes: 3072, staging_offset: 4096 },
        Run { offset: 65536, bytes: 131072, staging_offset: 16384 },
    ];
    r.read_runs(&runs).unwrap();
    for run in runs {
        let got = &r.staging()[run.staging_offset..run.staging_offset + run.bytes];
        assert!(got == &want[run.offset as usize..run.offset as usize + run.bytes], "run at {} differs", run.offset);
    }
}
