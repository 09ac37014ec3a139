//! `bench-io` (`make bench-io`): the streaming engine's I/O path alone at Mistral-7B shape,
//! against fio on the same file with the same request size and queue depth.
//!
//! The file: 32 layers x 14,336 neurons x 25,088-byte records of random rows (made here once,
//! valid headers and CRCs). The workload: per layer a synthetic active set of K_max = 5,500
//! neurons that keeps 83% of the previous token's set; every layer has a K_max-slot buffer
//! (the paper's sizing), so each token reads its delta. The path measured is the engine's:
//! SlotMap plan -> coalesced runs -> io_uring O_DIRECT reads into the staging buffer -> CRC
//! check -> copy into slots. The page cache is dropped first.

use anyhow::{bail, Context, Result};
use clap::Parser;
use formats::records::{check_record, encode_record, record_bytes, record_offset};
use half::f16;
use rand::{seq::SliceRandom, Rng, SeedableRng};
use runtime::slots::{Load, SlotMap};
use runtime::stream::aligned::AlignedBuf;
use runtime::stream::reader::{ReaderOptions, RecordReader, Run};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Parser)]
#[command(name = "bench-io", about = "The record I/O path at Mistral-7B shape vs fio")]
struct Cli {
    #[arg(long, default_value = "target/bench-io/records-mistral7b.bin")]
    file: PathBuf,
    #[arg(long, default_value_t = 32)]
    layers: usize,
    #[arg(long, default_value_t = 14336)]
    neurons: usize,
    #[arg(long, default_value_t = 4096)]
    d_model: usize,
    #[arg(long, default_value_t = 5500)]
    k_max: usize,
    #[arg(long, default_value_t = 0.83)]
    reuse: f64,
    /// Tokens after the first (cold) one.
    #[arg(long, default_value_t = 12)]
    tokens: usize,
    #[arg(long, default_value_t = 256)]
    queue_depth: usize,
    #[arg(long, default_value_t = 64)]
    staging_mib: usize,
    /// Seconds of fio per run.
    #[arg(long, default_value_t = 10)]
    fio_seconds: u32,
    #[arg(long, default_value = "bench/results/bench-io.json")]
    out: PathBuf,
}

/// One grouped read: records first..first+count, and which loads they serve.
struct Group {
    first: u32,
    count: usize,
    loads: Vec<Load>,
}

/// Groups sorted loads into reads; a gap of up to `max_gap` unneeded records is read through.
fn group(loads: &[Load], max_records: usize, max_gap: usize) -> Vec<Group> {
    let mut out: Vec<Group> = Vec::new();
    for &l in loads {
        if let Some(g) = out.last_mut() {
            let end = g.first as usize + g.count;
            if (l.neuron as usize) < end + 1 + max_gap && l.neuron as usize + 1 - g.first as usize <= max_records {
                g.count = l.neuron as usize + 1 - g.first as usize;
                g.loads.push(l);
                continue;
            }
        }
        out.push(Group { first: l.neuron, count: 1, loads: vec![l] });
    }
    out
}

fn make_file(c: &Cli) -> Result<()> {
    let rb = record_bytes(c.d_model);
    let want = (c.layers * c.neurons * rb) as u64;
    if std::fs::metadata(&c.file).map(|m| m.len() == want).unwrap_or(false) {
        return Ok(());
    }
    std::fs::create_dir_all(c.file.parent().unwrap())?;
    eprintln!("bench-io: writing {} ({:.1} GB of random records)...", c.file.display(), want as f64 / 1e9);
    let tmp = c.file.with_extension("tmp");
    let mut w = std::io::BufWriter::with_capacity(8 << 20, std::fs::File::create(&tmp)?);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let pool: Vec<f16> = (0..c.d_model * 64).map(|_| f16::from_f32(rng.gen_range(-0.1..0.1))).collect();
    let mut rec = vec![0u8; rb];
    let pb = indicatif::ProgressBar::new(c.layers as u64);
    for layer in 0..c.layers {
        for n in 0..c.neurons {
            let o = rng.gen_range(0..61) * c.d_model;
            let rows = &pool[o..o + 3 * c.d_model];
            encode_record(
                layer as u32,
                n as u32,
                &rows[..c.d_model],
                &rows[c.d_model..2 * c.d_model],
                &rows[2 * c.d_model..],
                &mut rec,
            );
            w.write_all(&rec)?;
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    w.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    std::fs::rename(&tmp, &c.file)?;
    Ok(())
}

fn drop_caches() -> bool {
    std::process::Command::new("sh")
        .arg("-c")
        .arg("sync; echo 3 > /proc/sys/vm/drop_caches")
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Per layer, per token: the active set (K_max neurons, `reuse` of them kept from the last token).
fn workload(c: &Cli) -> Vec<Vec<Vec<u32>>> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let all: Vec<u32> = (0..c.neurons as u32).collect();
    let keep = (c.reuse * c.k_max as f64).round() as usize;
    (0..=c.tokens)
        .scan(vec![Vec::<u32>::new(); c.layers], |prev, t| {
            let sets: Vec<Vec<u32>> = (0..c.layers)
                .map(|l| {
                    if t == 0 {
                        all.choose_multiple(&mut rng, c.k_max).copied().collect()
                    } else {
                        let mut s: Vec<u32> = prev[l].choose_multiple(&mut rng, keep).copied().collect();
                        let inside: std::collections::HashSet<u32> = prev[l].iter().copied().collect();
                        while s.len() < c.k_max {
                            let j = rng.gen_range(0..c.neurons as u32);
                            if !inside.contains(&j) && !s.contains(&j) {
                                s.push(j);
                            }
                        }
                        s
                    }
                })
                .collect();
            *prev = sets.clone();
            Some(sets)
        })
        .collect()
}

#[derive(serde::Serialize, Clone)]
struct EngineRun {
    variant: String,
    max_gap_records: usize,
    registered_buffers: bool,
    queue_depth: usize,
    steady_tokens: usize,
    bytes_needed_per_token: f64,
    bytes_read_per_token: f64,
    requests_per_token: f64,
    mean_request_bytes: f64,
    io_ms_per_token: f64,
    /// Needed bytes per second of the whole path (read + CRC + scatter).
    effective_gb_per_s: f64,
    /// Bytes read per second.
    read_gb_per_s: f64,
    first_token_ms: f64,
}

fn run_engine(
    c: &Cli,
    sets: &[Vec<Vec<u32>>],
    max_gap: usize,
    registered: bool,
    qd: usize,
    variant: &str,
) -> Result<EngineRun> {
    let rb = record_bytes(c.d_model);
    let mut reader = RecordReader::open(
        &c.file,
        &ReaderOptions {
            queue_depth: qd,
            force_pread: false,
            staging_bytes: c.staging_mib << 20,
            register_staging: registered,
            hold_in_memory: false,
        },
    )?;
    if let Some(f) = &reader.fallback {
        bail!("{}: {f}: the benchmark needs io_uring and O_DIRECT", c.file.display());
    }
    let mut maps: Vec<SlotMap> = (0..c.layers).map(|_| SlotMap::new(c.neurons, c.k_max)).collect();
    // one slot buffer per layer would be 4.4 GB: the scatter target is one layer-sized buffer
    // reused by every layer (the copy costs the same; the contents are not read back)
    let mut slots = AlignedBuf::new(c.k_max * rb);
    let max_records = (1 << 20) / rb;
    let (mut steady_ms, mut steady_bytes, mut steady_needed, mut steady_req, mut first_ms) =
        (0.0, 0u64, 0u64, 0u64, 0.0);
    drop_caches();
    for (t, token) in sets.iter().enumerate() {
        let t0 = Instant::now();
        let (before_b, before_r) = (reader.bytes_read, reader.requests);
        let mut needed = 0u64;
        for (l, active) in token.iter().enumerate() {
            let loads = maps[l].plan(active, t as u64 + 1);
            needed += (loads.len() * rb) as u64;
            let groups = group(&loads, max_records, max_gap);
            let mut g = 0;
            while g < groups.len() {
                let mut batch = Vec::new();
                let mut used = 0;
                while g < groups.len() && used + groups[g].count * rb <= reader.staging_len() {
                    batch.push((
                        g,
                        Run {
                            offset: record_offset(0, c.neurons, rb, l, groups[g].first as usize),
                            bytes: groups[g].count * rb,
                            staging_offset: used,
                        },
                    ));
                    used += groups[g].count * rb;
                    g += 1;
                }
                let runs: Vec<Run> = batch.iter().map(|b| b.1).collect();
                reader.read_runs(&runs)?;
                let staging = reader.staging();
                for (gi, run) in &batch {
                    for load in &groups[*gi].loads {
                        let k = (load.neuron - groups[*gi].first) as usize;
                        let src = &staging[run.staging_offset + k * rb..run.staging_offset + (k + 1) * rb];
                        check_record(src, &c.file, run.offset + (k * rb) as u64, l as u32, load.neuron, c.d_model)?;
                        let s = load.slot as usize;
                        slots.as_mut_slice()[s * rb..(s + 1) * rb].copy_from_slice(src);
                    }
                }
            }
        }
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if t == 0 {
            first_ms = ms;
        } else {
            steady_ms += ms;
            steady_bytes += reader.bytes_read - before_b;
            steady_req += reader.requests - before_r;
            steady_needed += needed;
        }
    }
    let n = c.tokens.max(1) as f64;
    Ok(EngineRun {
        variant: variant.into(),
        max_gap_records: max_gap,
        registered_buffers: registered,
        queue_depth: qd,
        steady_tokens: c.tokens,
        bytes_needed_per_token: steady_needed as f64 / n,
        bytes_read_per_token: steady_bytes as f64 / n,
        requests_per_token: steady_req as f64 / n,
        mean_request_bytes: steady_bytes as f64 / steady_req.max(1) as f64,
        io_ms_per_token: steady_ms / n,
        effective_gb_per_s: steady_needed as f64 / (steady_ms / 1e3) / 1e9,
        read_gb_per_s: steady_bytes as f64 / (steady_ms / 1e3) / 1e9,
        first_token_ms: first_ms,
    })
}

#[derive(serde::Serialize)]
struct FioRun {
    block_bytes: usize,
    queue_depth: usize,
    read_gb_per_s: f64,
    iops: f64,
}

fn run_fio(c: &Cli, bs: usize, qd: usize) -> Result<FioRun> {
    drop_caches();
    let out = std::process::Command::new("fio")
        .args([
            "--name=bench-io",
            &format!("--filename={}", c.file.display()),
            "--rw=randread",
            &format!("--bs={bs}"),
            "--direct=1",
            "--ioengine=io_uring",
            &format!("--iodepth={qd}"),
            &format!("--runtime={}", c.fio_seconds),
            "--time_based",
            "--output-format=json",
            "--numjobs=1",
            "--norandommap",
            "--randrepeat=0",
        ])
        .output()
        .context("running fio (Debian package fio; `make bench-io` installs it)")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("fio's JSON output")?;
    let r = &v["jobs"][0]["read"];
    Ok(FioRun {
        block_bytes: bs,
        queue_depth: qd,
        read_gb_per_s: r["bw_bytes"].as_f64().unwrap_or(0.0) / 1e9,
        iops: r["iops"].as_f64().unwrap_or(0.0),
    })
}

fn main() -> Result<()> {
    let c = Cli::parse();
    make_file(&c)?;
    let sets = workload(&c);
    let rb = record_bytes(c.d_model);
    let fio = run_fio(&c, rb, c.queue_depth)?;
    let fio_large = run_fio(&c, 1 << 20, 64)?;
    let mut runs = Vec::new();
    for (variant, gap, reg, qd) in [
        ("engine: adjacent records coalesced", 0, false, c.queue_depth),
        ("engine + registered buffers", 0, true, c.queue_depth),
        ("engine + reads through gaps of <= 2 records", 2, false, c.queue_depth),
        ("engine + reads through gaps of <= 8 records", 8, false, c.queue_depth),
        ("engine, queue depth 64", 0, false, 64),
    ] {
        let r = run_engine(&c, &sets, gap, reg, qd, variant)?;
        eprintln!(
            "{variant:<46} {:>6.2} GB/s needed ({:>5.2} GB/s read), {:>7.1} ms/token, {:>6.0} requests/token of {:>6.0} B",
            r.effective_gb_per_s, r.read_gb_per_s, r.io_ms_per_token, r.requests_per_token, r.mean_request_bytes
        );
        runs.push(r);
    }
    let base = &runs[0];
    let fio_ms = base.bytes_needed_per_token / (fio.read_gb_per_s * 1e9) * 1e3;
    println!(
        "fio randread {} B, QD {}: {:.2} GB/s ({:.0} IOPS); 1 MiB QD 64: {:.2} GB/s",
        rb, c.queue_depth, fio.read_gb_per_s, fio.iops, fio_large.read_gb_per_s
    );
    println!("{:<46} {:>9} {:>9} {:>12} {:>10}", "path", "GB/s", "x fio", "ms/token", "x fio ms");
    for r in &runs {
        println!(
            "{:<46} {:>9.2} {:>9.2} {:>12.1} {:>10.2}",
            r.variant,
            r.effective_gb_per_s,
            r.effective_gb_per_s / fio.read_gb_per_s,
            r.io_ms_per_token,
            fio_ms / r.io_ms_per_token
        );
    }
    println!(
        "fio at the same request size would move one token's delta ({:.1} MB) in {fio_ms:.1} ms",
        base.bytes_needed_per_token / 1e6
    );
    let json = serde_json::json!({
        "shape": {"layers": c.layers, "neurons": c.neurons, "d_model": c.d_model, "record_bytes": rb, "file_bytes": c.layers * c.neurons * rb},
        "workload": {"k_max": c.k_max, "reuse": c.reuse, "tokens": c.tokens, "slots_per_layer": c.k_max},
        "fio": fio, "fio_1mib_qd64": fio_large,
        "engine": runs,
        "ratio_vs_fio": base.effective_gb_per_s / fio.read_gb_per_s,
        "fio_ms_per_token": fio_ms,
    });
    std::fs::create_dir_all(c.out.parent().unwrap_or(std::path::Path::new(".")))?;
    std::fs::write(&c.out, serde_json::to_string_pretty(&json)?)?;
    println!("-> {}", c.out.display());
    Ok(())
}
