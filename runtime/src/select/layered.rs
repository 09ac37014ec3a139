//! Whole records ranked before they are read, as a [`SetSelector`] (`crate::layer_predictor`):
//! at each sparse layer a [`Ranker`] (the layer's own small predictor network, or the resident
//! gate/up sketch) ranks every neuron from the layer's normed input, the `k` best are the set,
//! and its missing records are read into the slots of the held rows not in the set that
//! contributed least lately (the slot map's heat: a moving average of each summed row's exact
//! `|h|`, so a row that just mattered stays, whatever the ranker thinks of it now). A held
//! record ranks at a resident bonus times its score (the sketch's: [`SKETCH_RESIDENT_BONUS`]),
//! so a missing one is read only where it clearly beats what is held. Slots hold
//! whole records (gate, up and down rows), so every held row counts with its exact coefficient.
//! Nothing of the MLP stays resident but the ranker: the predictors (<= 5% of the 4-bit MLP's
//! bytes) or the 2-bit sketch (about a third of it), which is what lets a budget fall below the
//! 4-bit model.

use super::{Footprint, LayerChoice, LayerChooser, SetSelector, SlotRow};
use crate::error::Result;
use crate::layer_predictor::{top_k, Ranker, RankerKind};
use crate::scorer::HEAT_DECAY;
use crate::slots::SlotMap;
use formats::manifest::Manifest;
use std::path::Path;

/// The sketch's default resident bonus: a held record ranks at twice its score, so a missing
/// one is read only where it beats the held one it replaces by a factor 2. At 25% of
/// Qwen2.5-Coder-1.5B's F16 size a third fewer bytes read a token for about 4% of perplexity
/// (docs/RESULTS.md, "Issue #40 (third measurement)"); `-X resident-bonus=1` ranks by score alone.
pub const SKETCH_RESIDENT_BONUS: f32 = 2.0;

pub struct LayeredSelector {
    pub ranker: Ranker,
    first_layer: usize,
    n_layers: usize,
    n_ff: usize,
    /// A held record ranks at this many times its score (1: by score alone).
    resident_bonus: f32,
}

impl LayeredSelector {
    pub fn load(manifest_path: &Path, m: &Manifest, kind: RankerKind, resident_bonus: f32) -> Result<Self> {
        let ranker = Ranker::of_manifest(manifest_path, m, kind)?;
        let c = &m.model;
        Ok(Self::new(ranker, m.records.first_layer, c.num_hidden_layers, c.intermediate_size, resident_bonus))
    }

    /// `ranker` ranks sparse layers `first_layer..n_layers` of `n_ff` neurons, a held record at
    /// `resident_bonus` (>= 1) times its score.
    pub fn new(ranker: Ranker, first_layer: usize, n_layers: usize, n_ff: usize, resident_bonus: f32) -> Self {
        LayeredSelector { ranker, first_layer, n_layers, n_ff, resident_bonus }
    }
}

impl SetSelector for LayeredSelector {
    fn rule(&self) -> String {
        self.ranker.name().into()
    }

    fn slot_row(&self) -> SlotRow {
        SlotRow::GateUpDown
    }

    fn every_held_row_counts(&self) -> bool {
        true
    }

    fn footprint(&self, first_layer: usize) -> Footprint {
        let first = first_layer.max(self.first_layer);
        let held_as = match self.ranker {
            Ranker::Sketch(_) | Ranker::Exact(_) => super::HeldAs::RankingRows,
            Ranker::Predictors(_) => super::HeldAs::Networks,
        };
        Footprint::per_layer(first, self.n_layers, self.n_ff, self.ranker.layer_bytes(), held_as)
    }

    fn keep_layers_from(&mut self, first_layer: usize) {
        self.ranker.drop_layers_before(first_layer);
        self.first_layer = first_layer.max(self.first_layer);
    }

    fn per_layer(&self) -> Option<&dyn LayerChooser> {
        Some(self)
    }
}

impl LayerChooser for LayeredSelector {
    fn score(&self, layer: usize, xn: &[f32], scores: &mut [f32]) {
        self.ranker.scores(layer, xn, 1, scores);
    }

    fn choose(&self, _layer: usize, scores: &[f32], k: usize, map: &mut SlotMap, tick: u64) -> LayerChoice {
        let set = match self.resident_bonus {
            1.0 => top_k(scores, k),
            bonus => top_k(&held_boosted(scores, &map.slot_of, bonus), k),
        };
        let loads = map.plan_by_heat(&set, tick);
        LayerChoice { set, loads }
    }

    fn observe_coefficients(&self, map: &mut SlotMap, neurons: &[u32], h: &[f32]) {
        for (&j, v) in neurons.iter().zip(h) {
            let t = &mut map.heat[j as usize];
            *t = HEAT_DECAY * *t + (1.0 - HEAT_DECAY) * v.abs();
        }
    }
}

/// `scores` with each held neuron's (`slot_of[j]` not empty) multiplied by `bonus`.
fn held_boosted(scores: &[f32], slot_of: &[u32], bonus: f32) -> Vec<f32> {
    scores.iter().zip(slot_of).map(|(&v, &s)| if s != crate::slots::EMPTY { v * bonus } else { v }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::EMPTY;

    /// A held record outranks a missing one whose score is less than `bonus` times its own,
    /// and only then; with a bonus of 1 the scores alone rank.
    #[test]
    fn a_held_record_ranks_at_its_bonus() {
        let (scores, slot_of) = ([1.0f32, 0.6, 0.3, 0.45], [EMPTY, 7, EMPTY, 2]);
        assert_eq!(top_k(&held_boosted(&scores, &slot_of, 2.0), 1), vec![1]);
        assert_eq!(top_k(&held_boosted(&scores, &slot_of, 2.0), 2), vec![0, 1]);
        assert_eq!(top_k(&held_boosted(&scores, &slot_of, 1.5), 1), vec![0]);
        assert_eq!(top_k(&held_boosted(&scores, &slot_of, 1.0), 3), top_k(&scores, 3));
    }
}
