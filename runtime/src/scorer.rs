//! The resident 4-bit gate/up scorer (`prep scorer`, layout `formats::scorer`): how it scores
//! a sparse layer's neurons (`select::scored` chooses and plans their rows from the scores).
//!
//! Per sparse layer and token, from the layer's own normed input `xn`:
//! `h_j = silu(gate4_j . xn) * (up4_j . xn)` for every neuron j (4-bit rows, int8 `xn`); the `k`
//! neurons of largest `|h_j| * ||W_down[:, j]||` must be in memory (their missing downT rows are
//! read; slots evict the rows of lowest heat, a moving average of their scores), and
//! `out = sum_j h_j * downT_j` over every row in memory — the k needed ones and whatever else
//! the layer's slots still hold from earlier tokens, which costs compute but no reads. So
//! `--set-scale` bounds the reads and the memory budget (the slots) sets how many neurons count.
//! Unlike the predictor (one guess after layer 0 for every later layer), this sees the layer's
//! real input; the price is a 4-bit copy of gate and up in memory (0.56 bytes a weight) and h
//! from 4-bit weights. The streaming engine runs it with downT rows read on demand
//! (`select::scored::ScoredSelector`), from storage or from records held in memory.

use crate::error::{Result, RuntimeError};
use crate::ops::qmatvec::{matvec_q4, Q8Vector};
use crate::ops::swiglu::silu;
use formats::manifest::Manifest;
use formats::scorer::GateUpScorerFile;
use std::path::Path;

pub struct GateUpScorer {
    pub file: GateUpScorerFile,
}

impl GateUpScorer {
    /// The preparation's scorer (role `scorer`), checked against the manifest.
    pub fn load(manifest_path: &Path, m: &Manifest) -> Result<Self> {
        let Some(a) = m.artifacts.iter().find(|a| a.role == "scorer") else {
            return Err(RuntimeError::Input(format!(
                "{}: this preparation has no scorer artifact (4-bit gate/up, `prep scorer`), which the scorer strategy needs: rerun make prepare",
                manifest_path.display()
            )));
        };
        let c = &m.model;
        let d0 = m.sparsity.dense_prefix;
        let file = GateUpScorerFile::load(
            &m.artifact_path(manifest_path, a),
            d0,
            c.num_hidden_layers - d0,
            c.intermediate_size,
            c.hidden_size,
        )?;
        Ok(GateUpScorer { file })
    }

    /// Drops the layers below `from` (a run whose sparse layers start there).
    pub fn drop_layers_before(&mut self, from: usize) {
        let f = &mut self.file;
        let drop = from.clamp(f.first_layer, f.first_layer + f.n_layers) - f.first_layer;
        let rows = f.n_ff * 2 * f.row_bytes();
        let blocks = if f.blocks.is_some() { 0 } else { f.n_ff * 2 * f.d_model / formats::scorer::Q4_BLOCK };
        // split_off: the kept tail gets its own allocation, the dropped layers' is freed
        f.q4 = f.q4.split_off(drop * rows);
        f.scales = f.scales.split_off(drop * blocks);
        f.down_norm = f.down_norm.split_off(drop * f.n_ff);
        f.down_crc32c = f.down_crc32c.split_off(drop * f.n_ff);
        f.first_layer += drop;
        f.n_layers -= drop;
    }

    /// `h` `[n_ff]` = silu(gate . xn) * (up . xn) of every neuron of sparse layer `layer` for
    /// one token's normed input `xn` `[d]`: from the Q4_0 copy (int8 `xn`), or exactly from the
    /// model's own blocks (a native preparation: `xn` quantized as for any matmul of that type).
    pub fn activations(&self, layer: usize, xn: &[f32], h: &mut [f32]) {
        let f = &self.file;
        match f.blocks {
            None => self.activations_of(layer, &Q8Vector::quantize(xn), 0, h),
            Some(ty) => {
                let at = crate::ops::qmatmul::activation_type(ty).expect("the loader accepts computed types only");
                let xa = crate::ops::qmatmul::QActivation::quantize(at, xn);
                let mut gu = vec![0f32; 2 * h.len()]; // [n_ff, 2]: gate_j, up_j
                crate::ops::qmatmul::qmatvec_bytes(ty, f.layer_q4(layer), f.d_model, &xa, &mut gu);
                swiglu_pairs(&gu, h);
            }
        }
    }

    /// `h` `[n]` = silu(gate4 . x) * (up4 . x) of neurons `from..from + n` of sparse layer
    /// `layer` for one token (the Q4_0 copy).
    pub fn activations_of(&self, layer: usize, x: &Q8Vector, from: usize, h: &mut [f32]) {
        let f = &self.file;
        let (rb, sb) = (f.d_model / 2, f.d_model / formats::scorer::Q4_BLOCK);
        let rows = 2 * from..2 * (from + h.len()); // gate_j, up_j per neuron
        let mut gu = vec![0f32; 2 * h.len()]; // [n, 2]
        matvec_q4(
            &f.layer_q4(layer)[rows.start * rb..rows.end * rb],
            &f.layer_scales(layer)[rows.start * sb..rows.end * sb],
            f.d_model,
            x,
            &mut gu,
        );
        swiglu_pairs(&gu, h);
    }

    /// The `k` neurons of largest `|h_j| * ||W_down[:, j]||` (ascending ids), where a neuron
    /// whose row is resident (`slot_of[j] != EMPTY`) counts `resident_bonus` times its score: a
    /// row already in memory is kept unless a missing one is clearly larger, so marginal
    /// neurons do not swap in and out every token.
    pub fn keep(&self, layer: usize, h: &[f32], k: usize, slot_of: &[u32], resident_bonus: f32) -> Vec<u32> {
        let norm = self.file.layer_down_norm(layer);
        let score: Vec<f32> = h
            .iter()
            .zip(norm)
            .zip(slot_of)
            .map(|((a, b), &s)| a.abs() * b * if s != crate::slots::EMPTY { resident_bonus } else { 1.0 })
            .collect();
        let mut idx: Vec<u32> = (0..h.len() as u32).collect();
        let k = k.min(idx.len());
        if k < idx.len() && k > 0 {
            idx.select_nth_unstable_by(k - 1, |&a, &b| score[b as usize].total_cmp(&score[a as usize]));
        }
        idx.truncate(k);
        idx.sort_unstable();
        idx
    }
}

/// `h[j] = silu(gu[2j]) x gu[2j + 1]`: each neuron's gate and up products to its coefficient.
fn swiglu_pairs(gu: &[f32], h: &mut [f32]) {
    h.iter_mut().zip(gu.chunks_exact(2)).for_each(|(hj, p)| *hj = silu(p[0]) * p[1]);
}

/// The scorer's default resident bonus: a held row counts twice its score, so a missing row is
/// read only when it beats the held one it would replace by a factor 2: about half the reads
/// for a few percent of perplexity, the best trade of those measured (docs/RESULTS.md, "Issue
/// #17" parts 7-9). `-X resident-bonus=1` restores the exact top set.
pub const SCORER_RESIDENT_BONUS: f32 = 2.0;

/// How fast a neuron's heat follows its score: heat <- HEAT_DECAY x heat + (1 - HEAT_DECAY) x
/// score each token. Slots evict the coolest rows first.
pub const HEAT_DECAY: f32 = 0.8;

/// Per sparse layer, a moving average of each neuron's score `|h_j| x ||down_j||`.
pub fn update_heat(heat: &mut [f32], h: &[f32], down_norm: &[f32]) {
    heat.iter_mut()
        .zip(h.iter().zip(down_norm))
        .for_each(|(t, (a, b))| *t = HEAT_DECAY * *t + (1.0 - HEAT_DECAY) * a.abs() * b);
}
