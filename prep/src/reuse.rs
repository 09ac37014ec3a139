//! The `reuse` stage of `prep prepare`: the scorer's reuse table (`scorer/reuse.json`, layout
//! `formats::reuse_table`), which `runtime plan` reads to predict how many of a token's needed
//! rows are already held at a budget's set and slot sizes. Simulated
//! (`runtime::scorer::ReuseSimulation`) over a dense forward pass of calibration sequences: the
//! sets are the exact h's, the slots evict as a streamed run's do.

use crate::capture::{corpus_sequences, expand_corpus};
use anyhow::{bail, Context, Result};
use formats::reuse_table::{ReuseTable, REUSE_TABLE_FORMAT};
use runtime::scorer::{GateUpScorer, ReuseSimulation};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReuseSettings {
    /// Calibration sequences (capture's corpus and sequence length), each a fresh run.
    #[serde(default = "default_sequences")]
    pub sequences: usize,
    /// Tokens at the start of each sequence that fill the slots and are not counted (a
    /// streamed run's prompt).
    #[serde(default = "default_warmup")]
    pub warmup_tokens: usize,
    #[serde(default = "default_set_shares")]
    pub set_shares: Vec<f64>,
    #[serde(default = "default_slot_shares")]
    pub slot_shares: Vec<f64>,
}

fn default_sequences() -> usize {
    2
}
fn default_warmup() -> usize {
    64
}
fn default_set_shares() -> Vec<f64> {
    vec![0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4]
}
fn default_slot_shares() -> Vec<f64> {
    vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
}

impl Default for ReuseSettings {
    fn default() -> Self {
        ReuseSettings { sequences: default_sequences(), warmup_tokens: default_warmup(), set_shares: default_set_shares(), slot_shares: default_slot_shares() }
    }
}

/// Simulates the table for the scorer at `scorer_path` (sparse layers `first_layer..`) on the
/// model in `model_dir` and writes it to `out`.
pub fn reuse(model_dir: &Path, scorer_path: &Path, first_layer: usize, corpus: &[PathBuf], seq_len: usize, s: &ReuseSettings, out: &Path) -> Result<ReuseTable> {
    // (a short calibration sequence, as in a CI-sized recipe, counts its second half)
    let warmup = s.warmup_tokens.min(seq_len / 2);
    let (model, tok) = runtime::open_model(model_dir)?;
    let c = &model.config;
    let file = formats::scorer::GateUpScorerFile::load(scorer_path, first_layer, c.num_hidden_layers - first_layer, c.intermediate_size, c.hidden_size)?;
    let scorer = GateUpScorer { file };
    let seqs = corpus_sequences(&tok, &expand_corpus(corpus)?, seq_len, s.sequences)?;
    if seqs.is_empty() {
        bail!("reuse: the corpus gives no sequence of {seq_len} tokens");
    }
    let mut sim = ReuseSimulation::new(&scorer, &s.set_shares, &s.slot_shares, warmup);
    for seq in &seqs {
        sim.new_sequence();
        let mut cache = model.new_cache(seq.len())?;
        model.forward_observed(seq, &mut cache, seq.len(), Some(&mut sim))?;
    }
    let table = ReuseTable {
        format: REUSE_TABLE_FORMAT.into(),
        n_ff: c.intermediate_size,
        first_layer,
        n_layers: c.num_hidden_layers,
        tokens: sim.tokens_counted as usize,
        warmup_tokens: warmup,
        text: format!("{} sequences of {seq_len} tokens of the calibration corpus ({} files, first {})", seqs.len(), corpus.len(), corpus.first().map(|p| p.display().to_string()).unwrap_or_default()),
        set_shares: s.set_shares.clone(),
        slot_shares: s.slot_shares.clone(),
        reuse: sim.reuse(),
    };
    table.check().map_err(|what| anyhow::anyhow!("reuse: {what}"))?;
    let json = serde_json::to_vec_pretty(&table)?;
    formats::safetensors_io::write_atomic(&formats::safetensors_io::tmp_path(out), out, &json).with_context(|| format!("{}: writing the reuse table", out.display()))?;
    Ok(table)
}
