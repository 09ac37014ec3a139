//! The resident 4-bit gate/up scorer (`prep scorer`, layout `formats::scorer`) and
//! [`ScoredSparsity`], the in-memory hook that runs every sparse layer on the neurons it keeps.
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
//! from 4-bit weights. The streaming engine runs the same computation with downT rows read on
//! demand (`select::scored::ScoredSelector`); both plan through [`score_and_plan`] and add up
//! through `ops::down_sum`.

use crate::error::{Result, RuntimeError};
use crate::model::MlpHook;
use crate::ops::down_sum::{down_sum, down_sum_blocks};
use crate::ops::qmatvec::{matvec_q4, Q8Vector};
use crate::ops::swiglu::silu;
use crate::slots::{Load, SlotMap};
use formats::manifest::Manifest;
use formats::scorer::GateUpScorerFile;
use half::f16;
use rayon::prelude::*;
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

/// Every record's down row (`row(layer, neuron)`), concatenated per layer in neuron order; the
/// layers are read in parallel.
fn down_rows_per_layer<T: Clone + Send>(
    layers: std::ops::Range<usize>,
    n_ff: usize,
    row: impl Fn(usize, usize) -> Result<Vec<T>> + Sync,
) -> Result<Vec<Vec<T>>> {
    layers.into_par_iter().map(|l| Ok((0..n_ff).map(|j| row(l, j)).collect::<Result<Vec<_>>>()?.concat())).collect()
}

/// The scorer's default resident bonus: a held row counts twice its score, so a missing row is
/// read only when it beats the held one it would replace by a factor 2. At 25% of
/// Qwen2.5-Coder-1.5B's F16 size (sets 0.25, slots 0.433 of n_ff, LAMBADA in memory) against 1:
/// 53% fewer rows read for +6.3% perplexity on 8 chunks, 1.136x of F16 on 16 chunks (the 25%
/// goal's bound is 1.15x); 1.5 reads 33% fewer for +3.1%, 3 75% fewer for +14%
/// (docs/RESULTS.md, "Issue #17" parts 7-9). `-X resident-bonus=1` restores the exact top set.
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

/// What [`score_and_plan`] carries from token to token for one sparse layer: `[n_ff]` moving
/// average of each neuron's score ([`update_heat`]); slots evict the coolest.
pub struct LayerScoring {
    pub heat: Vec<f32>,
}

impl LayerScoring {
    pub fn new(n_ff: usize) -> Self {
        LayerScoring { heat: vec![0.0; n_ff] }
    }
}

/// One token of one sparse layer, planned the same way by the streaming engine and by
/// [`ScoredSparsity`] (so their slots, reads and sums match): score every neuron into `h`, keep
/// the `k` largest ([`GateUpScorer::keep`]), update the heat, and give the kept rows still
/// missing slots (those of the coolest rows). Returns the kept neurons (ascending) and their
/// loads (sorted by neuron).
#[allow(clippy::too_many_arguments)]
pub fn score_and_plan(
    scorer: &GateUpScorer,
    layer: usize,
    xn: &[f32],
    k: usize,
    resident_bonus: f32,
    map: &mut SlotMap,
    state: &mut LayerScoring,
    tick: u64,
    h: &mut [f32],
) -> (Vec<u32>, Vec<Load>) {
    let norm = scorer.file.layer_down_norm(layer);
    scorer.activations(layer, xn, h);
    let kept = scorer.keep(layer, h, k, &map.slot_of, resident_bonus);
    update_heat(&mut state.heat, h, norm);
    let loads = map.plan_by_heat(&kept, tick, &state.heat);
    (kept, loads)
}

/// Runs layers `first_layer..` on the scorer's kept neurons with every downT row in memory (the
/// quality of `--strategy scorer` without storage).
enum DownRows {
    F16(Vec<Vec<f16>>),
    /// Version 2: the records' down blocks, laid out as `shape` says.
    Blocks(formats::records::RecordShape, Vec<Vec<u8>>),
}

pub struct ScoredSparsity {
    pub scorer: GateUpScorer,
    /// Per layer from the scorer's first: the downT rows (from records.bin), `[n_ff, d]` f16
    /// (version 1) or `[n_ff, d / block]` blocks of the records' down type (version 2).
    down_t: DownRows,
    pub dense_prefix: usize,
    /// Neurons kept per sparse layer and token.
    pub keep: usize,
    /// See [`GateUpScorer::keep`]; the rows held are simulated with one [`SlotMap`] per layer
    /// of `slots` rows (the streaming engine's), so the sets match.
    pub resident_bonus: f32,
    /// Rows each layer holds (>= keep; `--slot-share`, default keep: the smallest budget).
    pub slots: usize,
    resident: Vec<SlotMap>,
    /// Per layer, the heat ([`score_and_plan`]).
    scoring: Vec<LayerScoring>,
    /// Per layer, tokens seen (each layer's SlotMap needs its own increasing tick: a batched
    /// forward pass runs all tokens through one layer before the next).
    ticks: Vec<u64>,
    pub tokens: u64,
    pub kept: u64,
    /// Rows a streaming run would have read (needed and not resident).
    pub loaded: u64,
    /// Rows needed (the k top-scored), summed over layers and tokens.
    pub needed: u64,
    /// Run the forward pass a token at a time, as the streaming engine does. Batched prefill
    /// (the default, faster) sums in another order, so a marginal neuron can flip; with a
    /// resident bonus that changes what is resident and the sets drift apart from a streaming
    /// run's (statistically alike, not equal).
    pub single_token: bool,
}

impl ScoredSparsity {
    /// Reads every sparse layer's downT rows from records.bin (checked records).
    pub fn new(manifest_path: &Path, m: &Manifest) -> Result<Self> {
        let scorer = GateUpScorer::load(manifest_path, m)?;
        let c = &m.model;
        let records = m.artifact_path_of(manifest_path, "records")?;
        let rf = crate::model::records_file(manifest_path, m, &records)?;
        let shape = rf.shape;
        let layers = m.records.first_layer..c.num_hidden_layers;
        let n = layers.len();
        let down_t = match shape {
            None => DownRows::F16(down_rows_per_layer(layers, c.intermediate_size, |l, j| Ok(rf.read(l, j)?.down_t))?),
            Some(sh) => DownRows::Blocks(
                sh,
                down_rows_per_layer(layers, c.intermediate_size, |l, j| Ok(rf.read_blocks(l, j)?.down))?,
            ),
        };
        let mut s = ScoredSparsity {
            scorer,
            down_t,
            dense_prefix: m.sparsity.default_dense_from(),
            keep: 0,
            resident_bonus: SCORER_RESIDENT_BONUS,
            slots: 0,
            resident: Vec::with_capacity(n),
            scoring: Vec::new(),
            ticks: vec![0; n],
            tokens: 0,
            kept: 0,
            loaded: 0,
            needed: 0,
            single_token: false,
        };
        s.set_keep_share(1.0);
        Ok(s)
    }

    /// Needs `share` (0 < share <= 1) of a layer's neurons per token; slots: as many.
    pub fn set_keep_share(&mut self, share: f64) {
        let f = &self.scorer.file;
        self.keep = ((f.n_ff as f64 * share).round() as usize).clamp(1, f.n_ff);
        self.set_slots(self.keep);
    }

    /// Each layer holds `slots` rows (clamped to keep..=n_ff); empties them.
    pub fn set_slots(&mut self, slots: usize) {
        let f = &self.scorer.file;
        self.slots = slots.clamp(self.keep, f.n_ff);
        self.resident = (0..f.n_layers).map(|_| SlotMap::new(f.n_ff, self.slots)).collect();
        self.scoring = (0..f.n_layers).map(|_| LayerScoring::new(f.n_ff)).collect();
    }

    /// Share of needed rows that were already resident.
    pub fn reuse_ratio(&self) -> f64 {
        1.0 - self.loaded as f64 / self.needed.max(1) as f64
    }

    /// Share of the sparse layers' neurons computed (every row held).
    pub fn density(&self) -> f64 {
        self.kept as f64 / (self.tokens.max(1) as f64 * self.scorer.file.n_ff as f64)
    }
}

impl MlpHook for ScoredSparsity {
    fn observe(&mut self, _layer: usize, _gate_silu: &[f32], _up: &[f32]) {}

    fn replaces_mlp(&self, layer: usize) -> bool {
        layer >= self.dense_prefix
    }

    fn single_token(&self) -> bool {
        self.single_token
    }

    fn mlp(&mut self, layer: usize, xn: &[f32], out: &mut [f32]) -> Result<()> {
        let f = &self.scorer.file;
        let (d, n_ff) = (f.d_model, f.n_ff);
        let li = layer - f.first_layer;
        let mut h = vec![0f32; n_ff];
        for (x, o) in xn.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            self.ticks[li] += 1;
            let (needed, loads) = score_and_plan(
                &self.scorer,
                layer,
                x,
                self.keep,
                self.resident_bonus,
                &mut self.resident[li],
                &mut self.scoring[li],
                self.ticks[li],
                &mut h,
            );
            self.loaded += loads.len() as u64;
            self.needed += needed.len() as u64;
            // every row in memory counts: those held before (slot order), then the loaded ones
            // (neuron order), the streaming engine's order of summation
            let map = &self.resident[li];
            let held: Vec<u32> = map.held_slots(&loads).iter().map(|&s| map.neuron_of[s as usize]).collect();
            let loaded: Vec<u32> = loads.iter().map(|l| l.neuron).collect();
            let mut part = vec![0f32; d];
            match &self.down_t {
                DownRows::F16(rows) => {
                    let rows = &rows[li];
                    let row = |j: u32| &rows[j as usize * d..(j as usize + 1) * d];
                    down_sum(&held, |_, j| h[j as usize], row, o);
                    down_sum(&loaded, |_, j| h[j as usize], row, &mut part);
                }
                DownRows::Blocks(shape, rows) => {
                    let (rows, rb) = (&rows[li], shape.down_row_bytes());
                    let row = |j: u32| &rows[j as usize * rb..(j as usize + 1) * rb];
                    down_sum_blocks(shape.down, &held, |_, j| h[j as usize], row, o);
                    down_sum_blocks(shape.down, &loaded, |_, j| h[j as usize], row, &mut part);
                }
            }
            o.iter_mut().zip(&part).for_each(|(a, b)| *a += b);
            self.tokens += 1;
            self.kept += (held.len() + loaded.len()) as u64;
        }
        Ok(())
    }
}
