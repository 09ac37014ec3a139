//! The resident 4-bit gate/up scorer as a [`SetSelector`]: at each sparse layer, every
//! neuron's `h = silu(gate4 . xn) x (up4 . xn)` from the layer's own input
//! (`crate::scorer::score_and_plan`); the `k` of largest `|h| x ||down||` must be in memory,
//! slots evict the coolest rows, and every row a layer holds counts with its `h`. Slots hold
//! downT rows only, read one 512-aligned span each and checked against the scorer's CRC32C.

use super::{Footprint, LayerChoice, SetSelector, SlotRow};
use crate::error::Result;
use crate::scorer::{score_and_plan, GateUpScorer, LayerScoring};
use crate::slots::SlotMap;
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
    fn begin_sequence(&mut self) {
        self.scoring.iter_mut().for_each(|l| l.heat.fill(0.0));
    }

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
        Footprint::per_layer(
            first,
            f.first_layer + f.n_layers,
            f.n_ff,
            (f.n_bytes() / f.n_layers.max(1)) as u64,
            super::HeldAs::RankingRows,
        )
    }

    fn keep_layers_from(&mut self, first_layer: usize) {
        let drop = first_layer.saturating_sub(self.scorer.file.first_layer).min(self.scoring.len());
        self.scorer.drop_layers_before(first_layer);
        self.scoring.drain(..drop);
    }

    fn choose_at_layer(
        &mut self,
        si: usize,
        layer: usize,
        xn: &[f32],
        k: usize,
        map: &mut SlotMap,
        tick: u64,
        h: &mut [f32],
    ) -> Option<LayerChoice> {
        let (set, loads) =
            score_and_plan(&self.scorer, layer, xn, k, self.resident_bonus, map, &mut self.scoring[si], tick, h);
        Some(LayerChoice { set, loads })
    }
}
