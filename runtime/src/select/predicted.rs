//! The shared predictor as a [`SetSelector`]: after layer 0, the layer-0 centroid that best
//! covers the token's active neurons and the hidden state go through the predictor
//! (`crate::predictor::Predictor`), whose per-layer heads rank that layer's centroids; the set
//! rule turns each head into a set (`crate::predictor::predicted_set`). Slots hold whole
//! records and only the set counts, so a streamed run computes what `--in-memory` does.

use super::{Footprint, SetSelector, SlotRow};
use crate::error::Result;
use crate::predictor::{predicted_set, product_mask, NeuronPrior, NeuronRank, Predictor, PredictorArtifacts, SetRule};
use formats::centroids::CentroidSet;
use formats::manifest::Manifest;
use formats::thresholds::Thresholds;
use std::path::Path;

pub struct PredictedSelector {
    predictor: Predictor,
    /// Layer-0 centroids (the c0 feature).
    layer0: CentroidSet,
    /// Per sparse layer from `first_layer`: its centroid sets and how its neurons rank.
    sets: Vec<CentroidSet>,
    priors: Vec<NeuronPrior>,
    /// K_max per sparse layer from `first_layer`.
    k_max: Vec<usize>,
    first_layer: usize,
    thresholds: Thresholds,
    rule: SetRule,
    centroid_bytes: u64,
    /// The current token's layer-0 centroid.
    c0: u32,
}

impl PredictedSelector {
    /// The preparation's predictor, centroids, thresholds and importance. Returns a note when
    /// the preparation has no importance artifact (cut sets then rank by membership).
    pub fn load(manifest_path: &Path, m: &Manifest, rule: SetRule) -> Result<(Self, Option<String>)> {
        let c = &m.model;
        let d0 = m.sparsity.dense_prefix;
        let (PredictorArtifacts { predictor, centroids, thresholds, importance }, note) =
            PredictorArtifacts::load(manifest_path, m)?;
        let sets = (d0..c.num_hidden_layers).map(|l| Ok(centroids.layer(l)?.clone())).collect::<Result<Vec<_>>>()?;
        let priors = NeuronPrior::for_layers(&sets, d0, importance.as_ref());
        // the sets, plus per neuron its membership count (u16) and importance (f32)
        let centroid_bytes =
            centroids.columns.values().map(|c| c.bits.len() as u64 + c.k as u64 * 64 + c.width as u64 * 8 * 6).sum();
        let selector = PredictedSelector {
            layer0: centroids.layer(0)?.clone(),
            predictor,
            sets,
            priors,
            k_max: m.sparsity.k_max.clone(),
            first_layer: d0,
            thresholds,
            rule,
            centroid_bytes,
            c0: 0,
        };
        Ok((selector, note))
    }
}

impl SetSelector for PredictedSelector {
    fn rule(&self) -> String {
        self.rule.to_string()
    }

    fn slot_row(&self) -> SlotRow {
        SlotRow::GateUpDown
    }

    fn neuron_rank(&self) -> Option<NeuronRank> {
        Some(crate::predictor::effective_neuron_rank(&self.priors))
    }

    fn every_held_row_counts(&self) -> bool {
        false
    }

    fn footprint(&self, first_layer: usize) -> Footprint {
        Footprint {
            predictor_bytes: self.predictor.n_bytes() as u64,
            centroid_bytes: self.centroid_bytes,
            ranking_rows_bytes: 0,
            full_sets: self.k_max[first_layer.saturating_sub(self.first_layer).min(self.k_max.len())..].to_vec(),
            set_unit: "K_max",
            min_set_scale: super::MIN_SET_SCALE,
            fit_tries_prefixes: true,
        }
    }

    fn keep_layers_from(&mut self, first_layer: usize) {
        let drop = first_layer.saturating_sub(self.first_layer).min(self.sets.len());
        // the per-token logits then cover only the heads this run uses
        self.predictor.drop_heads_before(self.first_layer + drop);
        self.sets.drain(..drop);
        self.priors.drain(..drop);
        self.k_max.drain(..drop);
        self.first_layer += drop;
    }

    fn observe_first_layer(&mut self, gate_silu: &[f32], up: &[f32]) {
        let mut mask = vec![0u8; self.layer0.width];
        product_mask(&self.thresholds, 0, gate_silu, up, &mut mask);
        self.c0 = self.layer0.best_cover(&mask);
    }

    fn sets_after_first_layer(&mut self, hidden: &[f32], set_sizes: &[usize]) -> Option<Vec<Vec<u32>>> {
        let logits = self.predictor.logits(hidden, &[self.c0]);
        let k = self.predictor.spec.k;
        let sets = logits
            .chunks_exact(k)
            .enumerate()
            .map(|(si, head)| {
                let (_, bits) = predicted_set(head, &self.sets[si], &self.priors[si], set_sizes[si], self.rule);
                CentroidSet { k: 1, width: bits.len(), bits }.neurons(0)
            })
            .collect();
        Some(sets)
    }
}
