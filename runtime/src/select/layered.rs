//! Whole records ranked before they are read, as a [`SetSelector`] (`crate::layer_predictor`):
//! at each sparse layer a [`Ranker`] (the layer's own small predictor network, or the resident
//! gate/up sketch) ranks every neuron from the layer's normed input, the `k` best are the set,
//! and its missing records are read into the slots of the held rows not in the set that
//! contributed least lately (`HeldHeat`). Slots hold whole records (gate, up and down rows), so
//! every held row counts with its exact coefficient. Nothing of the MLP stays resident but the
//! ranker: the predictors (<= 5% of the 4-bit MLP's bytes) or the 2-bit sketch (about a third
//! of it), which is what lets a budget fall below the 4-bit model.

use super::{Footprint, LayerChoice, SetSelector, SlotRow};
use crate::error::Result;
use crate::layer_predictor::{top_k, HeldHeat, Ranker, RankerKind};
use crate::slots::SlotMap;
use formats::manifest::Manifest;
use std::path::Path;

pub struct LayeredSelector {
    pub ranker: Ranker,
    first_layer: usize,
    n_layers: usize,
    n_ff: usize,
    /// `[n_ff]` the current layer's scores.
    scores: Vec<f32>,
    /// Per sparse layer from `first_layer`, what its held rows just contributed.
    heat: Vec<HeldHeat>,
}

impl LayeredSelector {
    pub fn load(manifest_path: &Path, m: &Manifest, kind: RankerKind) -> Result<Self> {
        let ranker = Ranker::of_manifest(manifest_path, m, kind)?;
        let c = &m.model;
        let first = m.records.first_layer;
        let heat = (first..c.num_hidden_layers).map(|_| HeldHeat::new(c.intermediate_size)).collect();
        Ok(LayeredSelector {
            ranker,
            first_layer: first,
            n_layers: c.num_hidden_layers,
            n_ff: c.intermediate_size,
            scores: vec![0.0; c.intermediate_size],
            heat,
        })
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
        let drop = first_layer.saturating_sub(self.first_layer).min(self.heat.len());
        self.heat.drain(..drop);
        self.first_layer = first_layer.max(self.first_layer);
    }

    fn choose_at_layer(
        &mut self,
        si: usize,
        layer: usize,
        xn: &[f32],
        k: usize,
        map: &mut SlotMap,
        tick: u64,
        _h: &mut [f32],
    ) -> Option<LayerChoice> {
        self.ranker.scores(layer, xn, 1, &mut self.scores);
        let set = top_k(&self.scores, k);
        let loads = self.heat[si].plan(map, &set, tick);
        Some(LayerChoice { set, loads })
    }

    fn begin_sequence(&mut self) {
        self.heat.iter_mut().for_each(|h| h.heat.fill(0.0));
    }

    fn observe_coefficients(&mut self, si: usize, neurons: &[u32], h: &[f32]) {
        self.heat[si].update(neurons, h);
    }
}
