//! `dense_mlp.safetensors`: the MLPs of the records' layers as the source model stores them, for
//! the layers a run computes dense (`--strategy dense`, and `auto` where the whole model fits).
//!
//! records.bin holds W_down by columns (one row per neuron), which a native preparation
//! requantizes along d_model; a layer run dense from its records rebuilds W_down in f16 from
//! them (larger, and twice quantized). This file keeps a native preparation's own blocks
//! instead: the GGUF's bytes, computed as llama.cpp computes that file.
//!
//! Tensors, for each layer `first_layer..n_layers`, under the model directory's names
//! (`model_dir::layer_tensor_names`), each as `resident.safetensors` stores blocks (U8
//! `[rows, row_bytes]` with its type in the `ggml_types` metadata, or f16):
//! ```text
//! model.layers.{l}.mlp.gate_proj.weight   [n_ff, d_model]
//! model.layers.{l}.mlp.up_proj.weight     [n_ff, d_model]
//! model.layers.{l}.mlp.down_proj.weight   [d_model, n_ff]
//! ```

use crate::error::{FormatError, Result};
use crate::model_dir::layer_tensor_names;
use crate::safetensors_io::{MappedSafetensors, TensorEntry};
use std::path::Path;

/// The manifest role of the file.
pub const ARTIFACT_ROLE: &str = "dense_mlp";

/// The bytes of each layer's three MLP tensors, layers `first_layer..n_layers`, from the
/// file's header, each tensor counted by `held` (its stored bytes, or what a reader lays it out
/// in); a missing tensor or a wrong logical shape is an error naming the file and the tensor.
pub fn layer_bytes(
    path: &Path,
    first_layer: usize,
    n_layers: usize,
    n_ff: usize,
    d_model: usize,
    held: impl Fn(&TensorEntry) -> u64,
) -> Result<Vec<u64>> {
    let f = MappedSafetensors::open(path)?;
    (first_layer..n_layers)
        .map(|l| {
            let n = layer_tensor_names(l);
            let mut bytes = 0u64;
            for (name, shape) in
                [(&n.gate_proj, [n_ff, d_model]), (&n.up_proj, [n_ff, d_model]), (&n.down_proj, [d_model, n_ff])]
            {
                let e = f
                    .tensors
                    .get(name.as_str())
                    .ok_or_else(|| FormatError::MissingTensor { path: path.to_path_buf(), tensor: name.clone() })?;
                if e.logical_shape() != shape {
                    return Err(FormatError::ShapeMismatch {
                        path: path.to_path_buf(),
                        tensor: name.clone(),
                        expected: shape.to_vec(),
                        actual: e.logical_shape(),
                    });
                }
                bytes += held(e);
            }
            Ok(bytes)
        })
        .collect()
}
