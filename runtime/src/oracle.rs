//! Oracle-mask sparsity: each sparse layer keeps only the neurons whose true activation reaches
//! the layer's threshold (perfect prediction). The quality this costs is the floor under any
//! predictor's, and it is how the mask kind and sparsity are chosen before a predictor exists.

use crate::model::MlpHook;
use formats::thresholds::Thresholds;

pub struct OracleSparsity {
    pub thresholds: Thresholds,
    /// Layers below this stay dense.
    pub dense_prefix: usize,
    /// Active and total neurons seen in the sparse layers.
    pub active: u64,
    pub total: u64,
}

impl OracleSparsity {
    pub fn new(thresholds: Thresholds, dense_prefix: usize) -> Self {
        OracleSparsity { thresholds, dense_prefix, active: 0, total: 0 }
    }
    /// Share of sparse-layer neurons kept.
    pub fn density(&self) -> f64 {
        self.active as f64 / self.total.max(1) as f64
    }
}

impl MlpHook for OracleSparsity {
    fn observe(&mut self, _layer: usize, _gate_silu: &[f32], _up: &[f32]) {}

    fn sparsify(&mut self, layer: usize, gate_silu: &mut [f32], up: &[f32]) {
        if layer < self.dense_prefix {
            return;
        }
        for (g, &u) in gate_silu.iter_mut().zip(up) {
            if self.thresholds.active(layer, *g, u) {
                self.active += 1;
            } else {
                *g = 0.0;
            }
        }
        self.total += up.len() as u64;
    }
}
