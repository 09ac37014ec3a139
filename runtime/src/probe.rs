//! `runtime probe-storage`: measures this machine into a device file (formats::device): random
//! O_DIRECT reads through the engine's own io_uring reader at each block size and queue depth,
//! the memory read bandwidth, and (given a model directory) the rate the decode kernels stream
//! resident weights.

use crate::error::{Result, RuntimeError};
use crate::stream::reader::{ReaderOptions, RecordReader, Run};
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use std::path::Path;
use std::time::Instant;

/// Requests per second of `block_bytes` random reads at `queue_depth` from `file` (batches of
/// `queue_depth` requests in flight, for about `seconds`). Offsets are multiples of 4096.
pub fn read_iops(file: &Path, block_bytes: u64, queue_depth: u32, seconds: f64, seed: u64) -> Result<f64> {
    let len = std::fs::metadata(file)
        .map_err(|e| RuntimeError::Io { path: file.to_path_buf(), offset: None, source: e })?
        .len();
    if len < block_bytes + 4096 {
        return Err(RuntimeError::Input(format!(
            "{}: {len} bytes, too small to probe {block_bytes}-byte reads",
            file.display()
        )));
    }
    if !block_bytes.is_multiple_of(512) {
        return Err(RuntimeError::Setting {
            setting: crate::error::Setting::BlockBytes,
            value: block_bytes.to_string(),
            why: "O_DIRECT reads need a multiple of 512".into(),
        });
    }
    let qd = queue_depth as usize;
    let slot = (block_bytes as usize).div_ceil(4096) * 4096;
    let opts = ReaderOptions { queue_depth: qd, staging_bytes: qd * slot, ..Default::default() };
    let mut reader = RecordReader::open(file, &opts)?;
    if let Some(f) = &reader.fallback {
        return Err(RuntimeError::Input(format!(
            "{}: {f}: the probe measures io_uring O_DIRECT reads",
            file.display()
        )));
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let pages = (len - block_bytes) / 4096;
    let (mut requests, t0) = (0u64, Instant::now());
    while t0.elapsed().as_secs_f64() < seconds || requests == 0 {
        let runs: Vec<Run> = (0..qd)
            .map(|i| Run {
                offset: rng.gen_range(0..pages) * 4096,
                bytes: block_bytes as usize,
                staging_offset: i * slot,
            })
            .collect();
        reader.read_runs(&runs)?;
        requests += qd as u64;
    }
    Ok(requests as f64 / t0.elapsed().as_secs_f64())
}

/// Reads the first `max_bytes` of `file` once, sequentially (1 MiB O_DIRECT reads, 16 in
/// flight), before the random reads are timed. A virtual disk (this project's machines) serves
/// data its host has cached many times faster than data it has not: the engine's records.bin,
/// read every run, is in the first state, so the probe measures there too.
pub fn warm(file: &Path, max_bytes: u64) -> Result<u64> {
    let len = std::fs::metadata(file)
        .map_err(|e| RuntimeError::Io { path: file.to_path_buf(), offset: None, source: e })?
        .len()
        .min(max_bytes);
    let chunk = 1usize << 20;
    let mut reader =
        RecordReader::open(file, &ReaderOptions { queue_depth: 16, staging_bytes: 16 * chunk, ..Default::default() })?;
    let mut offset = 0u64;
    while offset + chunk as u64 <= len {
        let runs: Vec<Run> = (0..16)
            .map(|i| offset + (i * chunk) as u64)
            .take_while(|&o| o + chunk as u64 <= len)
            .enumerate()
            .map(|(i, o)| Run { offset: o, bytes: chunk, staging_offset: i * chunk })
            .collect();
        offset += (runs.len() * chunk) as u64;
        reader.read_runs(&runs)?;
    }
    Ok(offset)
}

/// Bytes per second summed from a `bytes`-long buffer by every pool thread.
pub fn memory_bandwidth_bytes_per_s(bytes: usize) -> f64 {
    let v: Vec<u64> = (0..bytes / 8).map(|i| i as u64).collect();
    let mut best = 0f64;
    for _ in 0..3 {
        let t = Instant::now();
        let s: u64 = v
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(s);
        best = best.max(bytes as f64 / t.elapsed().as_secs_f64());
    }
    best
}

/// The dense decode rate of a model directory times the weight bytes each token reads (every
/// matrix once; the embedding table only as the tied head): resident bytes per second.
pub fn decode_bytes_per_s(model_dir: &Path, tokens: usize) -> Result<(f64, f64)> {
    let (model, tok) = crate::open_model(model_dir, crate::DecodeLayout::Interleaved)?;
    let ids = tok.encode("The history of the printing press begins in the fifteenth century, when", true)?;
    let mut cache = model.new_cache(ids.len() + tokens + 1)?;
    let mut runner = crate::Runner::dense(&model);
    let mut logits = runner.forward(&ids, &mut cache, ids.len() - 1)?;
    let t = Instant::now();
    for _ in 0..tokens {
        let next = crate::sampler::argmax(&logits) as u32;
        logits = runner.forward(&[next], &mut cache, 0)?;
    }
    let tok_per_s = tokens as f64 / t.elapsed().as_secs_f64();
    let bytes: u64 = formats::model_dir::safetensors_files(model_dir)?
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .sum();
    // an untied embedding is read one row per token, not whole
    let embed = if model.config.tie_word_embeddings { 0 } else { model.weights.embed.n_bytes() as u64 };
    Ok((tok_per_s * (bytes - embed) as f64, tok_per_s))
}
