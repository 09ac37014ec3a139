//! Whole records ranked before they are read, as a [`SetSelector`] (`crate::layer_predictor`):
//! at each sparse layer a [`Ranker`] (the layer's own small predictor network, or the resident
//! gate/up sketch) ranks every neuron from the layer's normed input, the `k` best are the set,
//! and its missing records are read into the slots of the held rows not in the set that
//! contributed least lately (the slot map's heat: a moving average of each summed row's exact
//! `|h|`, so a row that just mattered stays, whatever the ranker thinks of it now). Slots hold
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

pub struct LayeredSelector {
    pub ranker: Ranker,
    first_layer: usize,
    n_layers: usize,
    n_ff: usize,
}

impl LayeredSelector {
    pub fn load(manifest_path: &Path, m: &Manifest, kind: RankerKind) -> Result<Self> {
        let ranker = Ranker::of_manifest(manifest_path, m, kind)?;
        let c = &m.model;
        Ok(Self::new(ranker, m.records.first_layer, c.num_hidden_layers, c.intermediate_size))
    }

    /// `ranker` ranks sparse layers `first_layer..n_layers` of `n_ff` neurons.
    pub fn new(ranker: Ranker, first_layer: usize, n_layers: usize, n_ff: usize) -> Self {
        LayeredSelector { ranker, first_layer, n_layers, n_ff }
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
        let set = top_k(scores, k);
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
