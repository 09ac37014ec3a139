//! `layer_predictors.safetensors`: one small network per sparse layer that ranks the layer's
//! neurons from the layer's own normed MLP input before any of their rows are in memory (LLM in
//! a flash §3.1, Deja Vu): a low-rank bottleneck with a ReLU,
//!
//! ```text
//! x      = the layer's normed MLP input                                           [d_model]
//! z      = relu(w1 x + b1)                                                          [rank]
//! score  = w2 z + b2                                                                [n_ff]
//! ```
//!
//! A larger score means the neuron is more likely among the layer's largest `|silu(g) * u|`.
//! Tensors, all f16, for every layer `l` in `first_layer..n_layers`: `layers.{l}.w1` `[rank,
//! d_model]`, `layers.{l}.b1` `[rank]`, `layers.{l}.w2` `[n_ff, rank]`, `layers.{l}.b2`
//! `[n_ff]`. The spec (JSON, metadata key `layer_predictors_spec`) names the model's shape, so
//! a file for another model or layer count is refused before it ranks anything.

use crate::error::{FormatError, Result};
use crate::safetensors_io::{self, MappedSafetensors};
use half::f16;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub const SPEC_KEY: &str = "layer_predictors_spec";

/// What a layer's predictor reads: the layer's own normed MLP input, known after the layer's
/// attention (the one input a run computes; a file naming another is refused when read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PredictorInput {
    Own,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayerPredictorSpec {
    pub d_model: usize,
    pub n_ff: usize,
    /// The model's layer count.
    pub n_layers: usize,
    /// First layer with a predictor; the file covers `first_layer..n_layers`.
    pub first_layer: usize,
    pub rank: usize,
    pub input: PredictorInput,
    /// The share of n_ff the training labels marked (each token's largest |h|).
    pub label_share: f64,
}

impl LayerPredictorSpec {
    /// Every tensor of layer `l`: (name, shape).
    pub fn layer_tensors(&self, l: usize) -> [(String, Vec<usize>); 4] {
        [
            (format!("layers.{l}.w1"), vec![self.rank, self.d_model]),
            (format!("layers.{l}.b1"), vec![self.rank]),
            (format!("layers.{l}.w2"), vec![self.n_ff, self.rank]),
            (format!("layers.{l}.b2"), vec![self.n_ff]),
        ]
    }

    /// Parameters of one layer's predictor.
    pub fn layer_parameters(&self) -> usize {
        self.rank * (self.d_model + 1) + self.n_ff * (self.rank + 1)
    }

    /// Bytes (f16) of the predictors of layers `from..n_layers`.
    pub fn bytes_from(&self, from: usize) -> u64 {
        (self.n_layers - from.max(self.first_layer).min(self.n_layers)) as u64 * self.layer_parameters() as u64 * 2
    }

    pub fn metadata(&self) -> std::collections::HashMap<String, String> {
        [(SPEC_KEY.to_string(), serde_json::to_string(self).expect("spec serializes"))].into()
    }

    fn check(&self, path: &Path) -> Result<()> {
        let bad = |what: String| Err(FormatError::invalid(path, what));
        if self.rank == 0 || self.d_model == 0 || self.n_ff == 0 {
            return bad(format!(
                "{SPEC_KEY}: rank, d_model and n_ff must be positive (rank {}, d_model {}, n_ff {})",
                self.rank, self.d_model, self.n_ff
            ));
        }
        if self.first_layer >= self.n_layers {
            return bad(format!(
                "{SPEC_KEY}: first_layer {} is not below n_layers {}",
                self.first_layer, self.n_layers
            ));
        }
        if !(self.label_share > 0.0 && self.label_share < 1.0) {
            return bad(format!("{SPEC_KEY}: label_share {} is not in (0, 1)", self.label_share));
        }
        Ok(())
    }
}

/// One layer's weights (f16, the shapes of [`LayerPredictorSpec::layer_tensors`]).
pub struct LayerPredictorWeights {
    pub w1: Vec<f16>,
    pub b1: Vec<f16>,
    pub w2: Vec<f16>,
    pub b2: Vec<f16>,
}

/// A whole file, checked: shapes from the spec, every value finite.
pub struct LayerPredictorFile {
    pub spec: LayerPredictorSpec,
    /// Layers `spec.first_layer..spec.n_layers`.
    pub layers: Vec<LayerPredictorWeights>,
}

/// The spec of the file at `path`, checked, from its header alone (the weights are neither
/// read nor checked: what `--strategy auto` sizes a plan from).
pub fn read_spec(path: &Path) -> Result<LayerPredictorSpec> {
    Ok(open_checked_spec(path)?.1)
}

fn open_checked_spec(path: &Path) -> Result<(MappedSafetensors, LayerPredictorSpec)> {
    let f = MappedSafetensors::open(path)?;
    let text = f.metadata.as_ref().and_then(|m| m.get(SPEC_KEY)).ok_or_else(|| {
        FormatError::invalid(path, format!("no '{SPEC_KEY}' in the safetensors metadata (not a layer predictor file?)"))
    })?;
    let spec: LayerPredictorSpec =
        serde_json::from_str(text).map_err(|source| FormatError::Json { path: path.to_path_buf(), source })?;
    spec.check(path)?;
    Ok((f, spec))
}

impl LayerPredictorFile {
    /// Reads `path`, checking it was made for a model of `d_model`, `n_ff` and `n_layers`.
    pub fn load(path: &Path, d_model: usize, n_ff: usize, n_layers: usize) -> Result<Self> {
        let (f, spec) = open_checked_spec(path)?;
        if (spec.d_model, spec.n_ff, spec.n_layers) != (d_model, n_ff, n_layers) {
            return Err(FormatError::invalid(
                path,
                format!(
                    "predictors for a model of d_model {}, n_ff {} and {} layers, but this model has d_model {d_model}, n_ff {n_ff} and {n_layers} layers (a file of another model?)",
                    spec.d_model, spec.n_ff, spec.n_layers
                ),
            ));
        }
        let mut layers = Vec::with_capacity(spec.n_layers - spec.first_layer);
        for l in spec.first_layer..spec.n_layers {
            let [w1, b1, w2, b2] = spec.layer_tensors(l).map(|(name, shape)| {
                let e = f
                    .tensors
                    .get(&name)
                    .ok_or_else(|| FormatError::MissingTensor { path: path.to_path_buf(), tensor: name.clone() })?;
                if e.shape != shape {
                    return Err(FormatError::ShapeMismatch {
                        path: path.to_path_buf(),
                        tensor: name.clone(),
                        expected: shape,
                        actual: e.shape.clone(),
                    });
                }
                let v = safetensors_io::to_f16_vec(path, &name, e.dtype, f.bytes(e))?;
                if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                    let width = f.bytes(e).len() / v.len().max(1);
                    return Err(FormatError::Corrupt {
                        path: path.to_path_buf(),
                        offset: (e.byte_range.start + i * width) as u64,
                        what: format!("layer {l}, tensor '{name}': value {} at index {i} is not finite", v[i]),
                    });
                }
                Ok(v)
            });
            layers.push(LayerPredictorWeights { w1: w1?, b1: b1?, w2: w2?, b2: b2? });
        }
        Ok(LayerPredictorFile { spec, layers })
    }

    /// Writes `layers` (for `spec.first_layer..spec.n_layers`) to `path` atomically.
    pub fn save(path: &Path, spec: &LayerPredictorSpec, layers: &[LayerPredictorWeights]) -> Result<()> {
        spec.check(path)?;
        if layers.len() != spec.n_layers - spec.first_layer {
            return Err(FormatError::invalid(
                path,
                format!("{} layers of predictors for layers {}..{}", layers.len(), spec.first_layer, spec.n_layers),
            ));
        }
        let mut tensors = Vec::new();
        for (i, w) in layers.iter().enumerate() {
            let names = spec.layer_tensors(spec.first_layer + i);
            for ((name, shape), data) in names.into_iter().zip([&w.w1, &w.b1, &w.w2, &w.b2]) {
                if data.len() != shape.iter().product::<usize>() {
                    return Err(FormatError::invalid(
                        path,
                        format!("tensor '{name}': {} values for shape {shape:?}", data.len()),
                    ));
                }
                tensors.push(safetensors_io::F16Tensor { name, shape, data: data.clone() });
            }
        }
        safetensors_io::write_f16_safetensors(path, &tensors, Some(spec.metadata()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> LayerPredictorSpec {
        LayerPredictorSpec {
            d_model: 8,
            n_ff: 16,
            n_layers: 3,
            first_layer: 1,
            rank: 2,
            input: PredictorInput::Own,
            label_share: 0.25,
        }
    }

    fn weights(s: &LayerPredictorSpec, v: f32) -> LayerPredictorWeights {
        let f = |n: usize| (0..n).map(|i| f16::from_f32(v + i as f32 * 0.01)).collect();
        LayerPredictorWeights { w1: f(s.rank * s.d_model), b1: f(s.rank), w2: f(s.n_ff * s.rank), b2: f(s.n_ff) }
    }

    #[test]
    fn round_trip_and_refusals() {
        let dir = std::env::temp_dir().join(format!("layer-pred-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("lp.safetensors");
        let s = spec();
        LayerPredictorFile::save(&p, &s, &[weights(&s, 0.5), weights(&s, -0.25)]).unwrap();
        let f = LayerPredictorFile::load(&p, 8, 16, 3).unwrap();
        assert_eq!(f.spec, s);
        assert_eq!(f.layers[1].w2, weights(&s, -0.25).w2);
        assert_eq!(s.bytes_from(0), 2 * s.layer_parameters() as u64 * 2);
        assert_eq!(s.bytes_from(2), s.layer_parameters() as u64 * 2);
        // another model's shape: refused with both
        let e = LayerPredictorFile::load(&p, 8, 16, 4).err().unwrap().to_string();
        assert!(e.contains("3 layers") && e.contains("4 layers") && e.contains("lp.safetensors"), "{e}");
        // a NaN: refused naming layer and tensor
        let mut bad = weights(&s, 0.5);
        bad.b2[3] = f16::NAN;
        LayerPredictorFile::save(&p, &s, &[weights(&s, 0.5), bad]).unwrap();
        let e = LayerPredictorFile::load(&p, 8, 16, 3).err().unwrap().to_string();
        assert!(e.contains("layer 2") && e.contains("layers.2.b2") && e.contains("not finite"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
