//! `prep importance`: per layer and neuron, the mean contribution `|silu(g_j) * u_j| *
//! ||W_down[:, j]||` over calibration tokens (layout: `formats::importance`). The runtime ranks
//! neurons by it when a set is cut below K_max (`--set-scale`): K = 512 binary centroids say
//! which neurons may fire, not which matter, and a cut set ranked by membership alone loses
//! most of the quality this ranking keeps (docs/RESULTS.md).

use crate::capture::{corpus_sequences, expand_corpus};
use anyhow::{bail, Result};
use formats::importance::NeuronImportance;
use indicatif::{ProgressBar, ProgressStyle};
use runtime::model::MlpHook;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Sums `|silu(g) * u|` per layer and neuron over every token it sees.
struct MagnitudeSums {
    n_ff: usize,
    sums: Vec<f64>, // [n_layers, n_ff]
    tokens: u64,
}

impl MlpHook for MagnitudeSums {
    fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
        let row = &mut self.sums[layer * self.n_ff..(layer + 1) * self.n_ff];
        for (g, u) in gate_silu.chunks_exact(self.n_ff).zip(up.chunks_exact(self.n_ff)) {
            row.iter_mut().zip(g.iter().zip(u)).for_each(|(s, (gj, uj))| *s += (gj * uj).abs() as f64);
        }
        if layer == 0 {
            self.tokens += (up.len() / self.n_ff) as u64;
        }
    }
}

#[derive(Debug, Serialize)]
pub struct ImportanceSummary {
    pub path: String,
    pub tokens: u64,
    pub sequences: usize,
    pub seconds: f64,
}

/// Runs the dense model over the first `sequences` calibration sequences of `seq_len` tokens
/// (the same round-robin cut as `prep capture`) and writes `out`.
pub fn importance(
    model_dir: &Path,
    corpus: &[PathBuf],
    seq_len: usize,
    sequences: usize,
    out: &Path,
    show_progress: bool,
) -> Result<ImportanceSummary> {
    let t0 = std::time::Instant::now();
    let (model, tok) = runtime::open_model(model_dir, runtime::DecodeLayout::Mapped)?;
    let c = &model.config;
    let (n_layers, n_ff, d) = (c.num_hidden_layers, c.intermediate_size, c.hidden_size);
    if seq_len == 0 || seq_len > model.max_context() {
        bail!("seq_len {seq_len} must be in 1..={}", model.max_context());
    }
    let seqs = corpus_sequences(&tok, &expand_corpus(corpus)?, seq_len, sequences)?;
    if seqs.is_empty() {
        bail!("the corpus gives no sequence of {seq_len} tokens");
    }
    let pb = if show_progress { ProgressBar::new(seqs.len() as u64) } else { ProgressBar::hidden() };
    pb.set_style(
        ProgressStyle::with_template("importance [{bar:40}] {pos}/{len} sequences ({elapsed}, eta {eta})").unwrap(),
    );
    let mut sums = MagnitudeSums { n_ff, sums: vec![0.0; n_layers * n_ff], tokens: 0 };
    let mut cache = model.new_cache(seq_len)?;
    for seq in &seqs {
        cache.clear();
        model.forward_observed(seq, &mut cache, seq.len(), Some(&mut sums))?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    // ||W_down[:, j]||: W_down is [d, n_ff]
    let mut values = vec![0f32; n_layers * n_ff];
    for (l, lw) in model.weights.layers.iter().enumerate() {
        let mut norm_sq = vec![0f64; n_ff];
        let w = lw.mlp.resident(l)?;
        for r in 0..d {
            norm_sq.iter_mut().zip(w.w_down.row_f16(r).iter()).for_each(|(s, w)| *s += (w.to_f32() as f64).powi(2));
        }
        for j in 0..n_ff {
            values[l * n_ff + j] = (sums.sums[l * n_ff + j] / sums.tokens as f64 * norm_sq[j].sqrt()) as f32;
        }
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    NeuronImportance { path: out.to_path_buf(), n_layers, n_ff, values, tokens: sums.tokens }.save()?;
    Ok(ImportanceSummary {
        path: out.display().to_string(),
        tokens: sums.tokens,
        sequences: seqs.len(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}
