//! The `reuse` stage of `prep prepare`: the reuse table (`scorer/reuse.json`, layout
//! `formats::reuse_table`) of the scorer, sketch and layers strategies, which `runtime plan` reads
//! to predict how many of a token's needed rows are already held at a budget's set and slot
//! sizes. Simulated (`runtime::reuse`) over one dense forward pass of calibration sequences:
//! each strategy's own selector (`runtime::select`) chooses its sets and evicts as in its
//! streamed run.

use crate::capture::{corpus_sequences, expand_corpus};
use anyhow::{bail, Context, Result};
use formats::reuse_table::{ReuseTable, REUSE_TABLE_FORMAT};
use runtime::layer_predictor::{LayerPredictors, Ranker, SketchRanker};
use runtime::model::MlpHook;
use runtime::reuse::ReuseSimulation;
use runtime::scorer::{GateUpScorer, SCORER_RESIDENT_BONUS};
use runtime::select::layered::{LayeredSelector, SKETCH_RESIDENT_BONUS};
use runtime::select::{scored::ScoredSelector, SetSelector};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
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
    vec![0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
}
fn default_slot_shares() -> Vec<f64> {
    vec![0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0]
}

impl Default for ReuseSettings {
    fn default() -> Self {
        ReuseSettings {
            sequences: default_sequences(),
            warmup_tokens: default_warmup(),
            set_shares: default_set_shares(),
            slot_shares: default_slot_shares(),
        }
    }
}

/// Every strategy's simulation on one forward pass.
struct AllStrategies<'a>(Vec<ReuseSimulation<'a>>);

impl MlpHook for AllStrategies<'_> {
    fn observe_input(&mut self, layer: usize, xn: &[f32]) {
        self.0.iter_mut().for_each(|s| s.observe_input(layer, xn));
    }
    fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
        // (the strategies are independent: one each on the pool's threads)
        rayon::scope(|sc| {
            for s in self.0.iter_mut() {
                sc.spawn(move |_| s.observe(layer, gate_silu, up));
            }
        });
    }
}

/// Simulates the table on the model in `model_dir` for the scorer at `scorer_path` (sparse
/// layers `first_layer..`), the sketch at `sketch_path` and the per-layer
/// predictors at `predictors_path` (when the recipe trained them), and writes it to `out`.
#[allow(clippy::too_many_arguments)]
pub fn reuse(
    model_dir: &Path,
    scorer_path: &Path,
    sketch_path: &Path,
    predictors_path: Option<&Path>,
    first_layer: usize,
    corpus: &[PathBuf],
    seq_len: usize,
    s: &ReuseSettings,
    out: &Path,
) -> Result<ReuseTable> {
    // (a short calibration sequence, as in a CI-sized recipe, counts its second half)
    let warmup = s.warmup_tokens.min(seq_len / 2);
    let (model, tok) = runtime::open_model(model_dir, runtime::DecodeLayout::Mapped)?;
    let c = &model.config;
    let (n_sparse, n_ff, d) = (c.num_hidden_layers - first_layer, c.intermediate_size, c.hidden_size);
    let n_layers = c.num_hidden_layers;
    let scorer = ScoredSelector::new(
        GateUpScorer { file: formats::scorer::GateUpScorerFile::load(scorer_path, first_layer, n_sparse, n_ff, d)? },
        SCORER_RESIDENT_BONUS,
    );
    let sketch = LayeredSelector::new(
        Ranker::Sketch(SketchRanker {
            file: formats::sketch::SketchFile::load(sketch_path, first_layer, n_sparse, n_ff, d)?,
        }),
        first_layer,
        n_layers,
        n_ff,
        SKETCH_RESIDENT_BONUS,
    );
    let predictors = match predictors_path {
        Some(path) => {
            let mut p = LayerPredictors::load(path, d, n_ff, n_layers)?;
            if p.spec.first_layer > first_layer {
                bail!(
                    "{}: predictors start at layer {}, the sparse layers at {first_layer}",
                    path.display(),
                    p.spec.first_layer
                );
            }
            p.drop_layers_before(first_layer);
            Some(LayeredSelector::new(Ranker::Predictors(p), first_layer, n_layers, n_ff, 1.0))
        }
        None => None,
    };
    let seqs = corpus_sequences(&tok, &expand_corpus(corpus)?, seq_len, s.sequences)?;
    if seqs.is_empty() {
        bail!("reuse: the corpus gives no sequence of {seq_len} tokens");
    }
    let selectors: Vec<&dyn SetSelector> =
        [Some(&scorer as &dyn SetSelector), Some(&sketch as &dyn SetSelector), predictors.as_ref().map(|p| p as _)]
            .into_iter()
            .flatten()
            .collect();
    let mut all = AllStrategies(
        selectors
            .iter()
            .map(|sel| {
                let chooser = sel.per_layer().expect("the simulated strategies choose at each layer");
                ReuseSimulation::new(
                    sel.rule(),
                    chooser,
                    first_layer,
                    n_layers,
                    n_ff,
                    &s.set_shares,
                    &s.slot_shares,
                    warmup,
                )
            })
            .collect(),
    );
    for seq in &seqs {
        all.0.iter_mut().for_each(|s| s.new_sequence());
        let mut cache = model.new_cache(seq.len())?;
        model.forward_observed(seq, &mut cache, seq.len(), Some(&mut all))?;
    }
    let table = ReuseTable {
        format: REUSE_TABLE_FORMAT.into(),
        n_ff,
        first_layer,
        n_layers: c.num_hidden_layers,
        tokens: all.0[0].tokens_counted as usize,
        warmup_tokens: warmup,
        // (no paths: the table, like every artifact, must not depend on where it was made)
        text: format!(
            "{} sequences of {seq_len} tokens of the calibration corpus ({} files)",
            seqs.len(),
            corpus.len()
        ),
        set_shares: s.set_shares.clone(),
        slot_shares: s.slot_shares.clone(),
        scorer_resident_bonus: SCORER_RESIDENT_BONUS as f64,
        rules: all.0.iter().map(|s| (s.rule().to_string(), s.reuse())).collect::<BTreeMap<_, _>>(),
    };
    table.check().map_err(|what| anyhow::anyhow!("reuse: {what}"))?;
    let json = serde_json::to_vec_pretty(&table)?;
    formats::safetensors_io::write_atomic(&formats::safetensors_io::tmp_path(out), out, &json)
        .with_context(|| format!("{}: writing the reuse table", out.display()))?;
    Ok(table)
}
