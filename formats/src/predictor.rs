//! `predictor.safetensors`: the shared activation predictor (NeuroPrefetcher §3). After layer 0
//! it reads the hidden state and the layer-0 centroid id and gives, for every sparse layer,
//! K logits over that layer's centroids.
//!
//! Network (h = `hidden`, e = `c0_embedding_dim`, d = model hidden size, S = sparse layers):
//! ```text
//! x   = concat(h0 / rms(h0), c0_embedding[c0])        [d + e]
//! z   = input(x)                                       [h]
//! z  += fc2(silu(fc1(layer_norm_i(z))))   for i in 0..blocks
//! out = heads(layer_norm(z))                           [S * K]  (layer d + s: out[s*K .. (s+1)*K])
//! ```
//! Tensor names and shapes are below; all f16. The spec is stored in the safetensors metadata
//! (key `predictor_spec`, JSON), so a reader checks every shape against it.

use crate::error::{FormatError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const SPEC_KEY: &str = "predictor_spec";
/// Epsilon of every layer norm in the predictor.
pub const LAYER_NORM_EPS: f64 = 1e-5;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PredictorSpec {
    /// The model's hidden size (input features).
    pub d_model: usize,
    /// First sparse layer (the dense prefix d); heads cover layers first_layer..n_layers.
    pub first_layer: usize,
    pub n_sparse_layers: usize,
    /// Centroids per layer (classes per head).
    pub k: usize,
    /// Centroids of layer 0 (vocabulary of the c0 embedding).
    pub k_layer0: usize,
    pub c0_embedding_dim: usize,
    pub hidden: usize,
    pub blocks: usize,
}

impl PredictorSpec {
    /// Every tensor: (name, shape).
    pub fn tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (h, e) = (self.hidden, self.c0_embedding_dim);
        let mut v = vec![
            ("c0_embedding.weight".to_string(), vec![self.k_layer0, e]),
            ("input.weight".to_string(), vec![h, self.d_model + e]),
            ("input.bias".to_string(), vec![h]),
        ];
        for i in 0..self.blocks {
            for (n, s) in [
                ("norm.weight", vec![h]),
                ("norm.bias", vec![h]),
                ("fc1.weight", vec![h, h]),
                ("fc1.bias", vec![h]),
                ("fc2.weight", vec![h, h]),
                ("fc2.bias", vec![h]),
            ] {
                v.push((format!("blocks.{i}.{n}"), s));
            }
        }
        v.push(("norm.weight".to_string(), vec![h]));
        v.push(("norm.bias".to_string(), vec![h]));
        v.push(("heads.weight".to_string(), vec![self.n_sparse_layers * self.k, h]));
        v.push(("heads.bias".to_string(), vec![self.n_sparse_layers * self.k]));
        v
    }

    pub fn parameter_count(&self) -> usize {
        self.tensors().iter().map(|(_, s)| s.iter().product::<usize>()).sum()
    }

    pub fn from_metadata(path: &Path, metadata: Option<&std::collections::HashMap<String, String>>) -> Result<Self> {
        let text = metadata.and_then(|m| m.get(SPEC_KEY)).ok_or_else(|| {
            FormatError::invalid(path, format!("no '{SPEC_KEY}' in the safetensors metadata (not a predictor file?)"))
        })?;
        serde_json::from_str(text).map_err(|source| FormatError::Json { path: path.to_path_buf(), source })
    }
}
