//! The resident 4-bit gate/up scorer as a [`SetSelector`]: at each sparse layer, every
//! neuron's `h = silu(gate4 . xn) x (up4 . xn)` from the layer's own input
//! ([`GateUpScorer::activations`]); the `k` of largest `|h| x ||down||` must be in memory
//! ([`GateUpScorer::keep`], a held row counting the resident bonus times), slots evict the rows
//! of lowest heat (a moving average of every neuron's score, [`update_heat`]), and every row a
//! layer holds counts with its `h`. Slots hold downT rows only, read one 512-aligned span each
//! and checked against the scorer's CRC32C.

use super::{Footprint, LayerChoice, LayerChooser, SetSelector, SlotRow};
use crate::error::Result;
use crate::scorer::{update_heat, GateUpScorer};
use crate::slots::SlotMap;
use formats::manifest::Manifest;
use std::path::Path;
use std::sync::Arc;

pub struct ScoredSelector {
    pub scorer: GateUpScorer,
    /// A neuron whose row is held counts this many times its score (`GateUpScorer::keep`).
    resident_bonus: f32,
}

impl ScoredSelector {
    pub fn load(manifest_path: &Path, m: &Manifest, resident_bonus: f32) -> Result<Self> {
        Ok(Self::new(GateUpScorer::load(manifest_path, m)?, resident_bonus))
    }

    pub fn new(scorer: GateUpScorer, resident_bonus: f32) -> Self {
        ScoredSelector { scorer, resident_bonus }
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
        Footprint::per_layer(
            first,
            f.first_layer + f.n_layers,
            f.n_ff,
            (f.n_bytes() / f.n_layers.max(1)) as u64,
            super::HeldAs::RankingRows,
        )
    }

    fn keep_layers_from(&mut self, first_layer: usize) {
        self.scorer.drop_layers_before(first_layer);
    }

    fn per_layer(&self) -> Option<&dyn LayerChooser> {
        Some(self)
    }
}

impl LayerChooser for ScoredSelector {
    fn score(&self, layer: usize, xn: &[f32], scores: &mut [f32]) {
        self.scorer.activations(layer, xn, scores);
    }

    /// The kept neurons ([`GateUpScorer::keep`]), the heat updated with every neuron's score,
    /// and the kept rows still missing given the slots of the coolest rows.
    fn choose(&self, layer: usize, h: &[f32], k: usize, map: &mut SlotMap, tick: u64) -> LayerChoice {
        let set = self.scorer.keep(layer, h, k, &map.slot_of, self.resident_bonus);
        update_heat(&mut map.heat, h, self.scorer.file.layer_down_norm(layer));
        let loads = map.plan_by_heat(&set, tick);
        LayerChoice { set, loads }
    }
}
