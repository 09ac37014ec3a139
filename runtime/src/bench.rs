//! `runtime bench`: decode speed of a prepared model on the streaming engine, with the paper's
//! breakdown (bytes and rows read per token, reuse, I/O wait, compute, predictor, bandwidth,
//! peak RSS). Greedy decoding of `n` tokens after the prompt, end-of-sequence ignored.

use crate::error::{Result, RuntimeError};
use crate::sampler::argmax;
use crate::stream::{StreamStats, StreamingEngine};
use crate::{Model, Tokenizer};
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_tok_per_s: f64,
    pub decode_tok_per_s: f64,
    pub bytes_read_per_token: f64,
    pub rows_read_per_token: f64,
    pub rows_needed_per_token: f64,
    pub reuse_ratio: f64,
    pub io_wait_ms_per_token: f64,
    pub compute_ms_per_token: f64,
    pub choose_ms_per_token: f64,
    /// Of compute: the sparse layers' MLPs over their slots.
    pub sparse_mlp_ms_per_token: f64,
    /// Wall time the I/O thread spent reading, checking and scattering (overlapped with compute).
    pub io_busy_ms_per_token: f64,
    pub read_bandwidth_bytes_per_s: f64,
    pub requests_per_token: f64,
    /// Prompt tokens computed in batches, how many at most at once (beside full slots:
    /// `prompt_batch_min`), and what staging their streamed layers read and waited.
    pub prompt_batched_tokens: u64,
    pub prompt_batch: usize,
    pub prompt_batch_min: usize,
    pub prompt_bytes_read: u64,
    pub prompt_wait_ms: f64,
    /// Rows read into slots after the prompt (warm slots), and their bytes: at the first decode
    /// token, so in decode's time but not in its per-token reads, requests and waits above.
    pub warmed_rows: u64,
    pub warm_bytes_read: u64,
    /// Time the warm slots' reads took (in decode's time).
    pub warm_ms: f64,
    pub peak_rss_bytes: u64,
    pub mem_budget_bytes: Option<u64>,
    pub planned_bytes: u64,
    /// The smallest budget at this dense prefix.
    pub minimum_budget_bytes: u64,
    /// Layers `dense_prefix..` ran sparse (after `--dense-prefix`, `fit` resolved).
    pub dense_prefix: usize,
    /// Neurons kept per sparse layer as a share of K_max (after `--set-scale`, `fit` resolved).
    pub set_scale: f64,
    /// How cut sets ranked neurons: "importance" or "membership".
    /// How cut sets were ranked (null with the scorer, which ranks by its own score).
    pub neuron_rank: Option<crate::predictor::NeuronRank>,
    /// How sets were chosen (softN, scorer, sketch, layers, oracle, dense).
    pub set_rule: String,
    /// What `set_scale` is a share of ("n_ff", "K_max").
    pub set_unit: &'static str,
    /// Logits from the Q8_0 head (`-X head=q8`).
    pub head_q8: bool,
    /// The head the logits came from: resident, q8 or compact.
    pub head: crate::model::HeadChoice,
    /// With the scorer: rows added per token (every row held, needed or not).
    pub computed_rows_per_token: f64,
    /// With the scorer: the weight of rows already in memory (1 for the predictor).
    pub resident_bonus: f32,
    pub set_size_per_layer: Vec<usize>,
    pub slots_per_layer: Vec<usize>,
    /// Reuse per sparse layer during decode.
    pub reuse_per_layer: Vec<f64>,
    pub io_path: String,
    pub text: String,
}

/// Peak resident set size of this process (VmHWM), bytes.
pub fn peak_rss_bytes() -> u64 {
    proc_status_bytes("VmHWM:")
}

/// Resident set size of this process now (VmRSS), bytes.
pub fn rss_bytes() -> u64 {
    proc_status_bytes("VmRSS:")
}

/// A `kB` line of /proc/self/status, in bytes (0 where there is none).
fn proc_status_bytes(key: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with(key)).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

fn diff(a: &StreamStats, b: &StreamStats) -> StreamStats {
    StreamStats {
        tokens: a.tokens - b.tokens,
        rows_needed: a.rows_needed - b.rows_needed,
        rows_loaded: a.rows_loaded - b.rows_loaded,
        bytes_read: a.bytes_read - b.bytes_read,
        read_requests: a.read_requests - b.read_requests,
        io_wait_ms: a.io_wait_ms - b.io_wait_ms,
        choose_ms: a.choose_ms - b.choose_ms,
        sparse_compute_ms: a.sparse_compute_ms - b.sparse_compute_ms,
        io_busy_ms: a.io_busy_ms - b.io_busy_ms,
        computed_rows: a.computed_rows - b.computed_rows,
        prompt_tokens: a.prompt_tokens - b.prompt_tokens,
        prompt_bytes_read: a.prompt_bytes_read - b.prompt_bytes_read,
        prompt_wait_ms: a.prompt_wait_ms - b.prompt_wait_ms,
        warmed_rows: a.warmed_rows - b.warmed_rows,
        warm_ms: a.warm_ms - b.warm_ms,
        warm_bytes_read: a.warm_bytes_read - b.warm_bytes_read,
        warm_requests: a.warm_requests - b.warm_requests,
        warm_io_wait_ms: a.warm_io_wait_ms - b.warm_io_wait_ms,
        layers: a
            .layers
            .iter()
            .zip(&b.layers)
            .map(|(x, y)| crate::stream::engine::LayerStreamStats {
                layer: x.layer,
                capacity: x.capacity,
                tokens: x.tokens - y.tokens,
                rows_needed: x.rows_needed - y.rows_needed,
                rows_loaded: x.rows_loaded - y.rows_loaded,
            })
            .collect(),
    }
}

pub fn bench(
    model: &Model,
    tok: &Tokenizer,
    engine: &mut StreamingEngine,
    prompt: &str,
    n: usize,
) -> Result<BenchReport> {
    let ids = tok.encode(prompt, true)?;
    if ids.is_empty() {
        return Err(RuntimeError::Input("the prompt is empty".into()));
    }
    let mut cache = model.new_cache(ids.len() + n)?;
    let t0 = std::time::Instant::now();
    // the whole prompt in batches (each streamed layer staged whole), the last token's logits
    // from the last batch; the warm slots fill at the first decode token
    let m = ids.len() - 1;
    let mut logits = crate::Runner::streamed(model, engine).forward(&ids, &mut cache, m)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    engine.refresh_io_stats();
    let before = engine.stats.clone();
    let mut out_ids = Vec::new();
    let t1 = std::time::Instant::now();
    let mut next = argmax(&logits) as u32;
    for _ in 0..n {
        out_ids.push(next);
        logits = model.decode_step(next, &mut cache, engine)?;
        next = argmax(&logits) as u32;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    engine.refresh_io_stats();
    let d = diff(&engine.stats, &before);
    let per = |v: f64| v / n.max(1) as f64;
    Ok(BenchReport {
        prompt_tokens: ids.len(),
        generated_tokens: n,
        prefill_tok_per_s: ids.len() as f64 / prefill_s,
        decode_tok_per_s: n as f64 / decode_s,
        bytes_read_per_token: per((d.bytes_read - d.warm_bytes_read) as f64),
        rows_read_per_token: per(d.rows_loaded as f64),
        rows_needed_per_token: per(d.rows_needed as f64),
        reuse_ratio: d.reuse_ratio(),
        io_wait_ms_per_token: per(d.io_wait_ms - d.warm_io_wait_ms),
        compute_ms_per_token: per(decode_s * 1e3 - d.warm_ms - (d.io_wait_ms - d.warm_io_wait_ms) - d.choose_ms),
        choose_ms_per_token: per(d.choose_ms),
        sparse_mlp_ms_per_token: per(d.sparse_compute_ms),
        io_busy_ms_per_token: per(d.io_busy_ms),
        read_bandwidth_bytes_per_s: if d.io_busy_ms > 0.0 { d.bytes_read as f64 / (d.io_busy_ms / 1e3) } else { 0.0 },
        requests_per_token: per((d.read_requests - d.warm_requests) as f64),
        prompt_batched_tokens: before.prompt_tokens,
        prompt_batch: engine.plan.prompt_batch,
        prompt_batch_min: engine.plan.prompt_batch_min,
        prompt_bytes_read: before.prompt_bytes_read,
        prompt_wait_ms: before.prompt_wait_ms,
        warmed_rows: engine.stats.warmed_rows,
        warm_bytes_read: engine.stats.warm_bytes_read,
        warm_ms: engine.stats.warm_ms,
        peak_rss_bytes: peak_rss_bytes(),
        mem_budget_bytes: engine.plan.budget_bytes,
        planned_bytes: engine.plan.total_bytes,
        minimum_budget_bytes: engine.plan.minimum_bytes,
        dense_prefix: engine.plan.dense_prefix,
        set_scale: engine.plan.set_scale,
        neuron_rank: engine.neuron_rank(),
        set_rule: engine.rule(),
        set_unit: engine.choice.set_unit(),
        head_q8: model.weights.head == crate::model::HeadChoice::Q8,
        head: model.weights.head,
        computed_rows_per_token: per(d.computed_rows as f64),
        resident_bonus: engine.choice.resident_bonus(),
        set_size_per_layer: engine.plan.set_sizes.clone(),
        slots_per_layer: engine.plan.capacity.clone(),
        reuse_per_layer: d.layers.iter().map(|l| 1.0 - l.rows_loaded as f64 / l.rows_needed.max(1) as f64).collect(),
        io_path: engine
            .fallback
            .clone()
            .map(|f| format!("pread ({f})"))
            .unwrap_or_else(|| "io_uring + O_DIRECT".into()),
        text: tok.decode(&out_ids)?,
    })
}
