//! `importance.safetensors`: per layer and neuron, how much the neuron contributes to the
//! layer's output on calibration text — the mean over tokens of `|silu(g_j) * u_j|` times the
//! L2 norm of its down-projection column `||W_down[:, j]||`. One F32 tensor `importance`
//! `[n_layers, intermediate_size]`; metadata `tokens` (how many calibration tokens the means
//! are over). The runtime ranks neurons with it when a set must be cut below K_max: the
//! centroids say which neurons may fire, this says which of them matter.

use crate::error::{FormatError, Result};
use crate::safetensors_io::{write_raw_safetensors, MappedSafetensors, RawTensor};
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

pub const IMPORTANCE_TENSOR: &str = "importance";

#[derive(Debug, Clone, PartialEq)]
pub struct NeuronImportance {
    pub path: PathBuf,
    pub n_layers: usize,
    pub n_ff: usize,
    /// `[n_layers * n_ff]`, layer-major.
    pub values: Vec<f32>,
    /// Calibration tokens the means are over.
    pub tokens: u64,
}

impl NeuronImportance {
    /// The `[n_ff]` importances of `layer`.
    pub fn layer(&self, layer: usize) -> &[f32] {
        &self.values[layer * self.n_ff..(layer + 1) * self.n_ff]
    }

    /// Reads the file and checks it covers `n_layers` x `n_ff` with finite, non-negative values.
    pub fn load(path: &Path, n_layers: usize, n_ff: usize) -> Result<Self> {
        let f = MappedSafetensors::open(path)?;
        let bytes = f.checked_bytes(IMPORTANCE_TENSOR, Dtype::F32, &[n_layers, n_ff])?;
        let start = f.tensors[IMPORTANCE_TENSOR].byte_range.start as u64;
        let values: Vec<f32> = bytes.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        if let Some(i) = values.iter().position(|v| !v.is_finite() || *v < 0.0) {
            let offset = start + 4 * i as u64;
            return Err(FormatError::Corrupt {
                path: path.to_path_buf(),
                offset,
                what: format!(
                    "importance of layer {} neuron {} is {} (expected finite, >= 0)",
                    i / n_ff,
                    i % n_ff,
                    values[i]
                ),
            });
        }
        let tokens = f.metadata.as_ref().and_then(|m| m.get("tokens")).and_then(|t| t.parse().ok()).unwrap_or(0);
        Ok(NeuronImportance { path: path.to_path_buf(), n_layers, n_ff, values, tokens })
    }

    pub fn save(&self) -> Result<()> {
        let bytes = self.values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = RawTensor {
            name: IMPORTANCE_TENSOR.into(),
            dtype: Dtype::F32,
            shape: vec![self.n_layers, self.n_ff],
            bytes,
        };
        write_raw_safetensors(&self.path, &[t], Some(HashMap::from([("tokens".to_string(), self.tokens.to_string())])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_bad_values() {
        let dir = std::env::temp_dir().join(format!("importance-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("importance.safetensors");
        let imp = NeuronImportance {
            path: path.clone(),
            n_layers: 2,
            n_ff: 3,
            values: vec![0.5, 0.0, 2.0, 1.0, 3.0, 0.25],
            tokens: 7,
        };
        imp.save().unwrap();
        let back = NeuronImportance::load(&path, 2, 3).unwrap();
        assert_eq!(back, imp);
        assert_eq!(back.layer(1), &[1.0, 3.0, 0.25]);
        let err = NeuronImportance::load(&path, 3, 3).unwrap_err().to_string();
        assert!(err.contains("importance.safetensors") && err.contains("[3, 3]"), "{err}");
        NeuronImportance { values: vec![0.5, 0.0, f32::NAN, 1.0, 3.0, 0.25], ..imp }.save().unwrap();
        let err = NeuronImportance::load(&path, 2, 3).unwrap_err().to_string();
        assert!(err.contains("layer 0 neuron 2") && err.contains("byte offset"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
