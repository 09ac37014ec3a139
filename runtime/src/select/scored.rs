//! The resident 4-bit gate/up scorer as a [`SetSelector`]: at each sparse layer, every
//! neuron's `h = silu(gate4 . xn) x (up4 . xn)` from the layer's own input
//! (`crate::scorer::score_and_plan`); the `k` of largest `|h| x ||down||` must be in memory,
//! slots evict the coolest rows, and every row a layer holds counts with its `h`. Slots hold
//! downT rows only, read one 512-aligned span each and checked against the scorer's CRC32C.

use super::{Footprint, LayerChoice, SetSelector, SlotRow};
use crate::error::Result;
use crate::scorer::{score_and_plan, GateUpScorer, LayerScoring};
use crate::stream::slots::{Load, SlotMap, EMPTY};
use formats::manifest::Manifest;
use std::path::Path;
use std::sync::Arc;

pub struct ScoredSelector {
    pub scorer: GateUpScorer,
    /// Per sparse layer from the scorer's first, the heat of each neuron.
    scoring: Vec<LayerScoring>,
    /// A neuron whose row is held counts this many times its score (`GateUpScorer::keep`).
    resident_bonus: f32,
}

impl ScoredSelector {
    pub fn load(manifest_path: &Path, m: &Manifest, resident_bonus: f32) -> Result<Self> {
        let scorer = GateUpScorer::load(manifest_path, m)?;
        let scoring = (0..scorer.file.n_layers).map(|_| LayerScoring::new(scorer.file.n_ff)).collect();
        Ok(ScoredSelector { scorer, scoring, resident_bonus })
    }

}

impl SetSelector for ScoredSelector {
    fn rule(&self) -> String {
        "scorer".into()
    }

    fn slot_row(&self) -> SlotRow {
        SlotRow::Down
    }

    fn every_held_row_counts(&self) -> bool {
        true
    }

    fn down_row_crc32c(&self) -> Option<Arc<Vec<u32>>> {
        Some(Arc::new(self.scorer.file.down_crc32c.clone()))
    }

    fn footprint(&self, first_layer: usize) -> Footprint {
        let f = &self.scorer.file;
        let first = first_layer.max(f.first_layer);
        Footprint::per_layer(first, f.first_layer + f.n_layers, f.n_ff, (f.n_bytes() / f.n_layers.max(1)) as u64, super::HeldAs::Scorer)
    }

    fn keep_layers_from(&mut self, first_layer: usize) {
        let drop = first_layer.saturating_sub(self.scorer.file.first_layer).min(self.scoring.len());
        self.scorer.drop_layers_before(first_layer);
        self.scoring.drain(..drop);
    }

    fn prefetch_at_layer(&mut self, si: usize, layer: usize, xn_guess: &[f32], _k: usize, share: f64, max_loads: usize, map: &mut SlotMap, tick: u64) -> Option<Vec<Load>> {
        // only the missing rows are guessed: those scoring above the last token's threshold
        let missing: Vec<u32> = (0..map.slot_of.len() as u32).filter(|&j| map.slot_of[j as usize] == EMPTY).collect();
        let mut h = vec![0f32; missing.len()];
        self.scorer.activations_at(layer, xn_guess, &missing, &mut h);
        let norm = self.scorer.file.layer_down_norm(layer);
        let threshold = self.scoring[si].threshold;
        let mut wanted: Vec<(f32, u32)> = missing.iter().zip(&h).map(|(&j, hj)| (hj.abs() * norm[j as usize], j)).filter(|&(s, _)| s >= threshold).collect();
        wanted.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        wanted.truncate(((share * wanted.len() as f64).ceil() as usize).min(max_loads));
        let rows: Vec<u32> = wanted.iter().map(|&(_, j)| j).collect();
        Some(map.prefetch(&rows, &rows, tick, &self.scoring[si].heat))
    }

    fn choose_at_layer(&mut self, si: usize, layer: usize, xn: &[f32], k: usize, map: &mut SlotMap, tick: u64, h: &mut [f32]) -> Option<LayerChoice> {
        let (set, loads) = score_and_plan(&self.scorer, layer, xn, k, self.resident_bonus, map, &mut self.scoring[si], tick, h);
        Some(LayerChoice { set, loads })
    }
}
