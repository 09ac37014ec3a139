//! `runtime probe-storage`: measure this machine into a device file for the planner.

use crate::mode::{ModeArgs, Strategy};
use anyhow::Result;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The flags of `runtime probe-storage`.
#[derive(clap::Args)]
pub struct Args {
    /// File to read (on the disk the artifacts live on; default: a 1 GiB scratch file made
    /// here, removed after).
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// A model directory whose dense decode gives decode_bytes_per_s (default: the memory
    /// bandwidth x 0.5, marked as an estimate in `source`).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Prepared models whose streamed compute to measure (every row held, 24 tokens): the
    /// planner then uses it for them (repeatable).
    #[arg(long)]
    pub manifest: Vec<PathBuf>,
    /// Block sizes in bytes (multiples of 512), e.g. a record size and 128 KiB.
    #[arg(long, value_delimiter = ',', default_value = "2048,2560,4096,4608,131072")]
    pub block_bytes: Vec<u64>,
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
    pub queue_depths: Vec<u32>,
    /// Seconds per (size, depth) point.
    #[arg(long, default_value_t = 0.3)]
    pub seconds: f64,
    /// Where to write the device file.
    #[arg(long, default_value = "device.toml")]
    pub out: PathBuf,
    #[arg(long)]
    pub name: Option<String>,
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(args: Args) -> Result<()> {
    let Args { file, model, manifest, block_bytes, queue_depths, seconds, out, name, threads: _ } = args;
    probe_storage(file, model, &manifest, &block_bytes, &queue_depths, seconds, &out, name)?;
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn probe_storage(
    file: Option<PathBuf>,
    model: Option<PathBuf>,
    manifests: &[PathBuf],
    block_bytes: &[u64],
    depths: &[u32],
    seconds: f64,
    out: &Path,
    name: Option<String>,
) -> Result<()> {
    use formats::device::{DeviceFile, ReadRate};
    if !(seconds > 0.0 && seconds.is_finite()) {
        anyhow::bail!("--seconds {seconds}: expected a positive duration");
    }
    if let Some(&q) = depths.iter().find(|&&q| q == 0 || q > 4096) {
        anyhow::bail!("--queue-depths: {q} is outside 1..=4096");
    }
    // a scratch file of random bytes, unless one is given
    let scratch = file.is_none();
    let path = file.unwrap_or_else(|| PathBuf::from("probe-storage.bin"));
    if scratch {
        eprintln!("writing a 1 GiB scratch file {} ...", path.display());
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
        );
        let mut x = 0x2545f4914f6cdd1du64;
        let mut chunk = vec![0u8; 1 << 20];
        for _ in 0..1024 {
            for w in chunk.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
            f.write_all(&chunk)?;
        }
        f.flush()?;
        f.get_ref().sync_all()?;
    }
    let mut reads = Vec::new();
    let result = (|| -> Result<()> {
        let warmed = runtime::probe::warm(&path, 4 << 30)?;
        eprintln!(
            "read {:.0} MiB of {} once first (a virtual disk serves what its host has cached faster)",
            warmed as f64 / 1048576.0,
            path.display()
        );
        for &b in block_bytes {
            for &q in depths {
                let iops = runtime::probe::read_iops(&path, b, q, seconds, b ^ q as u64)?;
                eprintln!(
                    "reads of {b} B at queue depth {q}: {iops:.0} IOPS, {:.1} MiB/s",
                    iops * b as f64 / 1048576.0
                );
                reads.push(ReadRate { block_bytes: b, queue_depth: q, iops: iops.round() });
            }
        }
        Ok(())
    })();
    if scratch {
        let _ = std::fs::remove_file(&path);
    }
    result?;
    let bw = runtime::probe::memory_bandwidth_bytes_per_s(512 << 20);
    eprintln!("memory read bandwidth: {:.1} GB/s", bw / 1e9);
    let (decode, how) = match &model {
        Some(m) => {
            let (bytes_per_s, tok_per_s) = runtime::probe::decode_bytes_per_s(m, 16)?;
            eprintln!(
                "dense decode of {}: {tok_per_s:.1} tok/s, {:.1} GB/s of weights",
                m.display(),
                bytes_per_s / 1e9
            );
            (bytes_per_s, format!("decode_bytes_per_s from the dense decode of {} ({tok_per_s:.1} tok/s)", m.display()))
        }
        None => (bw * 0.5, "decode_bytes_per_s estimated as half the memory bandwidth (no --model given)".to_string()),
    };
    let mut models = Vec::new();
    for m in manifests {
        let mf = formats::manifest::Manifest::load(m)?;
        let has = |role: &str| mf.artifacts.iter().any(|a| a.role == role);
        // each strategy the preparation can run: its compute differs (the whole-record ones
        // compute every held row's h from its record); dense first, which every preparation runs
        let strategies: Vec<Strategy> = [
            (Strategy::Dense, "records"),
            (Strategy::Scorer, "scorer"),
            (Strategy::Sketch, runtime::layer_predictor::SKETCH_ROLE),
            (Strategy::Layers, runtime::layer_predictor::ARTIFACT_ROLE),
            (Strategy::Predictor, "predictor"),
        ]
        .into_iter()
        .filter(|(_, role)| has(role))
        .map(|(s, _)| s)
        .collect();
        for strategy in strategies {
            // every row held (compute alone), then at 5% over the minimum (what each row read
            // costs the compute thread: landing it in its slot, beyond the read itself)
            let bench_at = |budget: Option<u64>| -> Result<(runtime::bench::BenchReport, u64, f64, String)> {
                let mode = ModeArgs {
                    mem_budget: budget.map(|b| b.to_string()),
                    strategy,
                    engine: true,
                    ..Default::default()
                };
                let (pm, _, _) = mode.mode(m, 512)?;
                let mut opened = runtime::open_with(m, &pm, false)?;
                let runtime::Opened { model, tokenizer, engine, .. } = &mut opened;
                let Some(engine) = engine.as_deref_mut() else { unreachable!("a manifest streams by default") };
                let r = runtime::bench::bench(
                    model,
                    tokenizer,
                    engine,
                    "The history of the printing press begins in the fifteenth century, when",
                    24,
                )?;
                Ok((
                    r,
                    engine.plan.minimum_bytes,
                    runtime::plan::memory_bytes_per_token(&engine.plan, engine.choice) as f64,
                    engine.rule().to_string(),
                ))
            };
            let (all, minimum, memory_bytes, selector) = bench_at(None)?;
            let compute_s = (1.0 / all.decode_tok_per_s - all.io_wait_ms_per_token / 1e3).max(1e-6);
            // (a dense run reads no row)
            let (tight, ..) = if strategy == Strategy::Dense {
                (all.clone(), 0, 0.0, String::new())
            } else {
                bench_at(Some(minimum + minimum / 20))?
            };
            let tight_compute_s = 1.0 / tight.decode_tok_per_s - tight.io_wait_ms_per_token / 1e3;
            let landed_row_s = ((tight_compute_s - compute_s) / tight.rows_read_per_token.max(1.0)).max(0.0);
            eprintln!(
                "{} ({selector}): every row held {:.1} tok/s, compute {:.1} ms per token; at {:.0} MiB {:.2} tok/s, {:.0} rows read per token, {:.2} us of compute each",
                m.display(),
                all.decode_tok_per_s,
                compute_s * 1e3,
                (minimum + minimum / 20) as f64 / 1048576.0,
                tight.decode_tok_per_s,
                tight.rows_read_per_token,
                landed_row_s * 1e6
            );
            models.push(formats::device::ModelCompute {
                model: mf.model_name.clone(),
                selector,
                compute_s_per_token: compute_s,
                memory_bytes_per_token: memory_bytes,
                landed_row_s,
            });
        }
    }
    let d = DeviceFile {
        name: name.unwrap_or_else(|| "this machine".into()),
        source: format!(
            "measured by runtime probe-storage on {} with {} pool threads; reads from {}; {how}",
            std::env::consts::ARCH,
            rayon::current_num_threads(),
            path.display()
        ),
        threads: rayon::current_num_threads(),
        memory_bandwidth_bytes_per_s: bw.round(),
        decode_bytes_per_s: decode.round(),
        reads,
        models,
        ..Default::default() // llama.cpp's calibrations: bench-frontier's, not the probe's
    };
    d.save(out)?;
    println!("wrote {}", out.display());
    Ok(())
}
