//! The benchmark harness (scripts/bench_frontier.py, through bench_edge's groups): interrupted
//! while a run is inside its cgroup, it leaves no group, no throttle, no run and no prompt
//! file behind. Needs root and cgroup v1 (as CI has); no llama.cpp (`--systems ours`).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};
use tests::*;

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !f() {
        assert!(t0.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_interrupted_frontier_leaves_nothing_behind() {
    let (mem, blkio) = (Path::new("/sys/fs/cgroup/memory"), Path::new("/sys/fs/cgroup/blkio"));
    assert!(
        mem.join("memory.limit_in_bytes").exists() && blkio.is_dir(),
        "cgroup v1 memory and blkio controllers not mounted under /sys/fs/cgroup"
    );
    let dir = scratch("harness");
    let manifest = prepare_synthetic(&dir);
    let out_dir = dir.join("results");
    for (sig, num) in [("INT", 2), ("TERM", 15)] {
        // a 1 MiB/s read throttle with the page cache dropped: the run pages its binary in for
        // seconds, so it is inside the group when the signal comes
        let mut child = Command::new("python3")
            .arg(repo_root().join("scripts/bench_frontier.py"))
            .args([
                "--model",
                "synthetic",
                "--systems",
                "ours",
                "--fractions",
                "1.0",
                "--throttles",
                "1",
                "--reps",
                "1",
                "-n",
                "8",
                "--no-quality",
            ])
            .args([
                "--manifest",
                manifest.to_str().unwrap(),
                "--f16-file",
                dir.join("synthetic.gguf").to_str().unwrap(),
                "--out-dir",
                out_dir.to_str().unwrap(),
            ])
            .spawn()
            .expect("python3");
        let name = format!("np-frontier-{}", child.id());
        let procs = mem.join(&name).join("cgroup.procs");
        let mut inside = Vec::new();
        wait_for("a run inside the harness's group", Duration::from_secs(120), || {
            inside = std::fs::read_to_string(&procs).unwrap_or_default().split_whitespace().map(String::from).collect();
            !inside.is_empty()
        });
        assert!(
            std::fs::read_to_string(blkio.join(&name).join("blkio.throttle.read_bps_device"))
                .unwrap()
                .contains("1048576"),
            "the throttle is set"
        );
        assert_eq!(send_signal(child.id(), sig), 0);
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(128 + num), "SIG{sig}: the harness exits 128 + the signal");
        for g in [mem.join(&name), blkio.join(&name)] {
            assert!(!g.exists(), "SIG{sig}: {} left behind", g.display());
        }
        // the run inside was killed (its pid gone, or a zombie about to be reaped)
        for pid in &inside {
            wait_for("the run to be gone", Duration::from_secs(10), || {
                std::fs::read_to_string(format!("/proc/{pid}/stat"))
                    .map_or(true, |s| s.split_whitespace().nth(2) == Some("Z"))
            });
        }
        let prompt = repo_root().join(format!("target/bench-frontier-prompt-{}.txt", child.id()));
        assert!(!prompt.exists(), "SIG{sig}: {} left behind", prompt.display());
        // what was measured before the signal is kept, marked partial (a rerun with --no-quality
        // picks it up); never a finished table
        if let Ok(text) = std::fs::read_to_string(out_dir.join("frontier-synthetic.json")) {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(v["partial"] == true && v.get("settings").is_none(), "SIG{sig}: an interrupted grid wrote {v}");
        }
    }
}

/// `kill -SIG pid` (the tests crate links no libc).
fn send_signal(pid: u32, sig: &str) -> i32 {
    Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status().unwrap().code().unwrap_or(-1)
}

/// A group without a read throttle still counts the bytes its run reads from the disk (the
/// frontier's `disk_bytes_read`, from which the planner's llama.cpp re-read law is checked):
/// blk-throttle accounts a group's reads only where some rule is set on the queue, so
/// bench_edge's Groups sets one no disk reaches. (Once any rule was set, the kernel keeps
/// counting on that queue until reboot, so without the fix this fails on a fresh machine, as
/// CI's, and can pass on one that ran a throttled benchmark.)
#[test]
fn an_unthrottled_group_counts_its_disk_reads() {
    let dir = scratch("harness-reads");
    let file = dir.join("cold.bin");
    let size_bytes = 8usize << 20;
    std::fs::write(&file, vec![7u8; size_bytes]).unwrap();
    let script = r#"
import os, subprocess, sys
sys.path.insert(0, sys.argv[1])
import bench_edge as edge
g = edge.Groups(f"np-reads-{os.getpid()}", None, None, edge.device_of(sys.argv[2]))
try:
    subprocess.run(g.wrap(["dd", f"if={sys.argv[2]}", "of=/dev/null", "bs=1M", "iflag=direct"]), capture_output=True, check=True)
    print(g.bytes_read())
finally:
    edge.cleanup()
"#;
    let out = Command::new("python3")
        .args(["-c", script, repo_root().join("scripts").to_str().unwrap(), file.to_str().unwrap()])
        .output()
        .expect("python3");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let read = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let bytes: u64 =
        read.parse().unwrap_or_else(|_| panic!("bytes_read() gave {read:?}: the group's reads were not counted"));
    assert!(bytes >= size_bytes as u64, "the group counted {bytes} bytes of an {size_bytes}-byte O_DIRECT read");
}
