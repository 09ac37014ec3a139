//! The shared activation predictor at inference (layout: `formats::predictor`) and how its
//! heads become sets (`crate::select::predicted` drives it in a run). Training is `prep train`; this file only runs the trained network, with the runtime's own
//! kernels (f16 weights, f32 math).

use crate::error::Result;
use crate::ops::layernorm::layernorm;
use crate::ops::matmul::matmul_f16;
use crate::ops::swiglu::silu_in_place;
use crate::tensor::F16Matrix;
use formats::centroids::{CentroidSet, CentroidTable};
use formats::predictor::{PredictorSpec, LAYER_NORM_EPS};
use formats::safetensors_io::{self, MappedSafetensors};
use formats::thresholds::Thresholds;
use formats::FormatError;
use std::path::Path;

struct Block {
    norm_w: Vec<f32>, // [h]
    norm_b: Vec<f32>, // [h]
    fc1: F16Matrix,   // [h, h]
    fc1_b: Vec<f32>,  // [h]
    fc2: F16Matrix,   // [h, h]
    fc2_b: Vec<f32>,  // [h]
}

pub struct Predictor {
    pub spec: PredictorSpec,
    c0_embedding: Vec<f32>, // [k_layer0, e]
    input: F16Matrix,       // [h, d + e]
    input_b: Vec<f32>,      // [h]
    blocks: Vec<Block>,
    norm_w: Vec<f32>,  // [h]
    norm_b: Vec<f32>,  // [h]
    heads: F16Matrix,  // [S * K, h]
    heads_b: Vec<f32>, // [S * K]
}

fn add_bias(x: &mut [f32], b: &[f32]) {
    for row in x.chunks_exact_mut(b.len()) {
        row.iter_mut().zip(b).for_each(|(v, bi)| *v += bi);
    }
}

impl Predictor {
    pub fn load(path: &Path) -> Result<Self> {
        let f = MappedSafetensors::open(path)?;
        let spec = PredictorSpec::from_metadata(path, f.metadata.as_ref())?;
        let shapes: std::collections::HashMap<String, Vec<usize>> = spec.tensors().into_iter().collect();
        let get = |name: &str| -> Result<Vec<half::f16>> {
            let e = f
                .tensors
                .get(name)
                .ok_or_else(|| FormatError::MissingTensor { path: path.to_path_buf(), tensor: name.into() })?;
            if e.shape != shapes[name] {
                return Err(FormatError::ShapeMismatch {
                    path: path.to_path_buf(),
                    tensor: name.into(),
                    expected: shapes[name].clone(),
                    actual: e.shape.clone(),
                }
                .into());
            }
            let v = safetensors_io::to_f16_vec(path, name, e.dtype, f.bytes(e))?;
            // a NaN or infinite weight poisons every set it ranks: refused, naming where it is
            if let Some(i) = v.iter().position(|x| !x.is_finite()) {
                return Err(FormatError::Corrupt {
                    path: path.to_path_buf(),
                    offset: (e.byte_range.start + i * (f.bytes(e).len() / v.len())) as u64,
                    what: format!("tensor '{name}': value {} at index {i} is not finite", v[i]),
                }
                .into());
            }
            Ok(v)
        };
        let vecf = |name: &str| -> Result<Vec<f32>> { Ok(get(name)?.iter().map(|v| v.to_f32()).collect()) };
        let mat = |name: &str| -> Result<F16Matrix> {
            let s = &shapes[name];
            Ok(F16Matrix::owned(s[0], s[1], get(name)?))
        };
        let blocks = (0..spec.blocks)
            .map(|i| {
                Ok(Block {
                    norm_w: vecf(&format!("blocks.{i}.norm.weight"))?,
                    norm_b: vecf(&format!("blocks.{i}.norm.bias"))?,
                    fc1: mat(&format!("blocks.{i}.fc1.weight"))?,
                    fc1_b: vecf(&format!("blocks.{i}.fc1.bias"))?,
                    fc2: mat(&format!("blocks.{i}.fc2.weight"))?,
                    fc2_b: vecf(&format!("blocks.{i}.fc2.bias"))?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Predictor {
            c0_embedding: vecf("c0_embedding.weight")?,
            input: mat("input.weight")?,
            input_b: vecf("input.bias")?,
            blocks,
            norm_w: vecf("norm.weight")?,
            norm_b: vecf("norm.bias")?,
            heads: mat("heads.weight")?,
            heads_b: vecf("heads.bias")?,
            spec,
        })
    }

    /// Drops the heads of layers below `layer` (`first_layer <= layer <=
    /// first_layer + n_sparse_layers`): for a run whose sparse layers start at `layer`, so the
    /// per-token logits cover only the heads it uses.
    pub fn drop_heads_before(&mut self, layer: usize) {
        let s = &mut self.spec;
        assert!(
            layer >= s.first_layer && layer <= s.first_layer + s.n_sparse_layers,
            "layer {layer} outside the predictor's heads"
        );
        let skip_rows = (layer - s.first_layer) * s.k;
        let h = self.heads.cols;
        self.heads = F16Matrix::owned(self.heads.rows - skip_rows, h, self.heads.as_slice()[skip_rows * h..].to_vec());
        self.heads_b.drain(..skip_rows);
        s.n_sparse_layers -= layer - s.first_layer;
        s.first_layer = layer;
    }

    /// Weights in bytes (f16).
    pub fn n_bytes(&self) -> usize {
        self.spec.parameter_count() * 2
    }

    /// Logits `[n, S * K]` for `n` tokens: `h0` `[n, d_model]` the hidden state after layer 0,
    /// `c0` `[n]` the layer-0 centroid ids.
    pub fn logits(&self, h0: &[f32], c0: &[u32]) -> Vec<f32> {
        let s = &self.spec;
        let (n, d, e, h) = (c0.len(), s.d_model, s.c0_embedding_dim, s.hidden);
        // x = concat(h0 / rms(h0), emb[c0])   [n, d + e]
        let mut x = vec![0f32; n * (d + e)];
        for t in 0..n {
            let hr = &h0[t * d..(t + 1) * d];
            let inv = 1.0 / (hr.iter().map(|v| v * v).sum::<f32>() / d as f32 + 1e-6).sqrt();
            let xr = &mut x[t * (d + e)..(t + 1) * (d + e)];
            xr[..d].iter_mut().zip(hr).for_each(|(o, v)| *o = v * inv);
            let c = (c0[t] as usize).min(s.k_layer0 - 1);
            xr[d..].copy_from_slice(&self.c0_embedding[c * e..(c + 1) * e]);
        }
        let mut z = vec![0f32; n * h];
        matmul_f16(&x, n, &self.input, &mut z);
        add_bias(&mut z, &self.input_b);
        let (mut zn, mut a, mut b) = (vec![0f32; n * h], vec![0f32; n * h], vec![0f32; n * h]);
        for blk in &self.blocks {
            layernorm(&z, &blk.norm_w, &blk.norm_b, LAYER_NORM_EPS as f32, &mut zn);
            matmul_f16(&zn, n, &blk.fc1, &mut a);
            add_bias(&mut a, &blk.fc1_b);
            silu_in_place(&mut a);
            matmul_f16(&a, n, &blk.fc2, &mut b);
            add_bias(&mut b, &blk.fc2_b);
            z.iter_mut().zip(&b).for_each(|(zi, bi)| *zi += bi);
        }
        layernorm(&z, &self.norm_w, &self.norm_b, LAYER_NORM_EPS as f32, &mut zn);
        let mut out = vec![0f32; n * s.n_sparse_layers * s.k];
        matmul_f16(&zn, n, &self.heads, &mut out);
        add_bias(&mut out, &self.heads_b);
        out
    }
}

/// The preparation's shared predictor and what it works with (the centroid sets, the activation
/// thresholds, and the per-neuron importance where the preparation has it), checked against the
/// manifest: what a streamed run (`select::predicted`) and an in-memory run both load.
pub struct PredictorArtifacts {
    pub predictor: Predictor,
    pub centroids: CentroidTable,
    pub thresholds: Thresholds,
    pub importance: Option<formats::importance::NeuronImportance>,
}

impl PredictorArtifacts {
    /// Returns a note when the preparation has no importance artifact (cut sets then rank by
    /// membership).
    pub fn load(manifest_path: &Path, m: &formats::manifest::Manifest) -> Result<(Self, Option<String>)> {
        let c = &m.model;
        let d0 = m.sparsity.dense_prefix;
        let path = m.artifact_path_of(manifest_path, "predictor").map_err(|_| {
            crate::RuntimeError::Input(format!(
                "{}: no predictor artifact (the shared predictor is trained when the recipe has a [train] section)",
                manifest_path.display()
            ))
        })?;
        let predictor = Predictor::load(&path)?;
        let s = &predictor.spec;
        if s.first_layer != d0 || s.n_sparse_layers != c.num_hidden_layers - d0 || s.d_model != c.hidden_size {
            return Err(crate::RuntimeError::Input(format!(
                "{}: the predictor covers layers {}.. ({}, width {}), the manifest's sparse layers are {d0}..{} (width {})",
                manifest_path.display(),
                s.first_layer,
                s.n_sparse_layers,
                s.d_model,
                c.num_hidden_layers,
                c.hidden_size
            )));
        }
        let centroids = CentroidTable::load(&m.artifact_path_of(manifest_path, "centroids")?)?;
        let thresholds = Thresholds::load(&m.artifact_path_of(manifest_path, "thresholds")?)?;
        let (importance, note) = crate::load_importance(manifest_path, m)?;
        Ok((PredictorArtifacts { predictor, centroids, thresholds, importance }, note))
    }
}

/// How a head's K logits become a layer's set of K_max neurons.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SetRule {
    /// The K_max neurons of largest expected membership `sum_c p_c [j in set_c]` over the
    /// `candidates` most likely centroids (p = softmax of the head). Same size, fewer misses.
    Soft { candidates: usize },
}

impl Default for SetRule {
    fn default() -> Self {
        SetRule::Soft { candidates: 8 }
    }
}

impl std::str::FromStr for SetRule {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        s.strip_prefix("soft")
            .and_then(|n| if n.is_empty() { Some(8) } else { n.parse().ok() })
            .map(|candidates| SetRule::Soft { candidates })
            .ok_or_else(|| format!("set rule '{s}': expected soft or softN (N candidates)"))
    }
}

impl std::fmt::Display for SetRule {
    /// The `-X set-rule=` spelling.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SetRule::Soft { candidates } => write!(f, "soft{candidates}"),
        }
    }
}

/// Calls `f` with every neuron (set bit) of a bit-packed row, ascending.
fn for_each_neuron(row: &[u8], mut f: impl FnMut(usize)) {
    for (i, &b) in row.iter().enumerate() {
        let mut b = b;
        while b != 0 {
            f(i * 8 + b.trailing_zeros() as usize);
            b &= b - 1;
        }
    }
}

/// The `size` best of `candidates` (all of them when there are no more), best first by
/// `better`, as a bitset of `width` bytes.
fn best_as_bitset(
    mut candidates: Vec<usize>,
    size: usize,
    width: usize,
    mut better: impl FnMut(&usize, &usize) -> std::cmp::Ordering,
) -> Vec<u8> {
    if candidates.len() > size {
        candidates.select_nth_unstable_by(size - 1, &mut better);
        candidates.truncate(size);
    }
    let mut bits = vec![0u8; width];
    for j in candidates {
        bits[j / 8] |= 1 << (j % 8);
    }
    bits
}

/// Per neuron, how many of the layer's K centroid sets hold it: how often the clustering saw
/// it fire, the soft rule's tie-break (neurons of equal expected membership keep the more
/// common one, not the lower index), which matters once `--set-scale` cuts sets below K_max.
pub fn membership_counts(set: &CentroidSet) -> Vec<u16> {
    let mut counts = vec![0u16; set.width * 8];
    for c in 0..set.k {
        for_each_neuron(set.row(c), |j| counts[j] += 1);
    }
    counts
}

/// How a sparse layer ranks its neurons when a set must be cut (`--set-scale` below 1) and weighs the soft rule's expected membership: by importance (mean
/// |silu(g) * u| x ||down column|| on calibration text, `prep importance`) where the
/// preparation has it, then by membership count, then by index.
#[derive(Debug, Clone)]
pub struct NeuronPrior {
    pub membership: Vec<u16>,
    /// `[n_ff]`; None: rank by membership alone (a preparation without the importance
    /// artifact).
    pub importance: Option<Vec<f32>>,
}

impl NeuronPrior {
    pub fn new(set: &CentroidSet, importance: Option<&[f32]>) -> Self {
        NeuronPrior { membership: membership_counts(set), importance: importance.map(<[f32]>::to_vec) }
    }

    /// `a` before `b`: more important, then more common, then lower index.
    fn better(&self, a: &usize, b: &usize) -> std::cmp::Ordering {
        let by_importance = match &self.importance {
            Some(w) => w[*b].total_cmp(&w[*a]),
            None => std::cmp::Ordering::Equal,
        };
        by_importance.then(self.membership[*b].cmp(&self.membership[*a])).then(a.cmp(b))
    }

    fn weight(&self, j: usize) -> f32 {
        self.importance.as_ref().map_or(1.0, |w| w[j])
    }

    /// One prior per sparse layer: `sets[i]` is layer `first + i`'s centroid sets.
    pub fn for_layers(
        sets: &[CentroidSet],
        first: usize,
        importance: Option<&formats::importance::NeuronImportance>,
    ) -> Vec<Self> {
        sets.iter().enumerate().map(|(i, set)| NeuronPrior::new(set, importance.map(|w| w.layer(first + i)))).collect()
    }
}

/// The ranking the priors actually use: importance only when every layer has it.
pub fn effective_neuron_rank(priors: &[NeuronPrior]) -> NeuronRank {
    if priors.iter().all(|p| p.importance.is_some()) {
        NeuronRank::Importance
    } else {
        NeuronRank::Membership
    }
}

/// How a run's cut sets rank neurons, as reports name it.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum NeuronRank {
    /// By calibration importance (`prep importance`).
    Importance,
    /// By how many centroids hold the neuron (a preparation without the importance artifact).
    Membership,
}

/// Set size per sparse layer at `scale` of K_max (`0 < scale <= 1`), at least one neuron.
pub fn scaled_set_sizes(k_max: &[usize], scale: f64) -> Vec<usize> {
    k_max.iter().map(|&k| ((k as f64 * scale).round() as usize).clamp(1, k)).collect()
}

/// (argmax centroid, bitset of the predicted set of at most `size` neurons) for one head's
/// logits `[K]`; `prior` weighs the soft rule's expected membership and breaks its ties.
pub fn predicted_set(
    head: &[f32],
    set: &CentroidSet,
    prior: &NeuronPrior,
    size: usize,
    rule: SetRule,
) -> (u32, Vec<u8>) {
    let argmax = crate::sampler::argmax(head);
    let better = |a: &usize, b: &usize| prior.better(a, b);
    let bits = match rule {
        SetRule::Soft { candidates } => {
            let mut order: Vec<usize> = (0..head.len()).collect();
            let m = candidates.clamp(1, head.len());
            order.select_nth_unstable_by(m - 1, |&a, &b| head[b].total_cmp(&head[a]));
            let max = head[argmax];
            let z: f32 = head.iter().map(|&v| (v - max).exp()).sum();
            let mut score = vec![0f32; set.width * 8];
            for &c in &order[..m] {
                let p = (head[c] - max).exp() / z;
                for_each_neuron(set.row(c), |j| score[j] += p);
            }
            // expected membership x importance: likely to fire, and large when it does
            let idx: Vec<usize> = (0..score.len()).filter(|&j| score[j] > 0.0).collect();
            score.iter_mut().enumerate().for_each(|(j, s)| *s *= prior.weight(j));
            best_as_bitset(idx, size, set.width, |a, b| score[*b].total_cmp(&score[*a]).then_with(|| better(a, b)))
        }
    };
    (argmax as u32, bits)
}

/// Bit-packed product mask of one token's activations.
pub(crate) fn product_mask(th: &Thresholds, layer: usize, g: &[f32], u: &[f32], out: &mut [u8]) {
    out.fill(0);
    for (j, (&gj, &uj)) in g.iter().zip(u).enumerate() {
        if th.active(layer, gj, uj) {
            out[j / 8] |= 1 << (j % 8);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_rules_give_k_max_neurons() {
        // 3 centroids over 16 neurons, 4 each
        let set = CentroidSet { k: 3, width: 2, bits: vec![0b0000_1111, 0, 0b1111_0000, 0, 0, 0b0000_1111] };
        let head = [0.1f32, 2.0, 1.9];
        let m = NeuronPrior::new(&set, None);
        // one candidate: the most likely centroid's set
        let (id, bits) = predicted_set(&head, &set, &m, 4, SetRule::Soft { candidates: 1 });
        assert_eq!((id, bits), (1, vec![0b1111_0000, 0]));
        let (_, bits) = predicted_set(&head, &set, &m, 4, SetRule::Soft { candidates: 3 });
        assert_eq!(bits.iter().map(|b| b.count_ones()).sum::<u32>(), 4);
        // centroids 1 and 2 are nearly tied: their neurons outrank centroid 0's
        assert_eq!(bits[0] & 0b0000_1111, 0);
        assert_eq!("soft16".parse::<SetRule>().unwrap(), SetRule::Soft { candidates: 16 });
    }

    #[test]
    fn smaller_sets_keep_the_most_common_neurons() {
        // 3 centroids of 4 neurons over 16; neuron 2 is in all three, 1 and 3 in two, 0 in one
        let set = CentroidSet {
            k: 3,
            width: 2,
            bits: vec![0b0000_1111, 0, 0b0000_0110, 0b1000_0001, 0b0000_1100, 0b0000_1010],
        };
        let m = NeuronPrior::new(&set, None);
        assert_eq!(&m.membership[..4], &[1, 2, 3, 2]);
        assert_eq!(scaled_set_sizes(&[4, 10, 1], 0.5), vec![2, 5, 1]);
        // one candidate (centroid 0 = neurons 0..4) cut to 2: neuron 2, then the lower of the
        // tied 1 and 3
        let (id, bits) = predicted_set(&[3.0, 0.0, 0.0], &set, &m, 2, SetRule::Soft { candidates: 1 });
        assert_eq!((id, bits), (0, vec![0b0000_0110, 0]));
        // soft over one candidate: every neuron of the set scores the same; membership decides
        let (_, bits) = predicted_set(&[3.0, 0.0, 0.0], &set, &m, 3, SetRule::Soft { candidates: 1 });
        assert_eq!(bits, vec![0b0000_1110, 0]);
        assert!("top1".parse::<SetRule>().is_err() && "static".parse::<SetRule>().is_err());
    }

    #[test]
    fn importance_ranks_cut_sets_and_weighs_the_soft_rule() {
        // centroid 0 = neurons 0..4, centroid 1 = neurons 4..8; neuron 5 matters most, then 1
        let set = CentroidSet { k: 2, width: 1, bits: vec![0b0000_1111, 0b1111_0000] };
        let mut w = vec![0.1f32; 8];
        (w[5], w[1]) = (4.0, 2.0);
        let p = NeuronPrior::new(&set, Some(&w));
        // one candidate's set cut to one keeps its most important neuron
        assert_eq!(predicted_set(&[9.0, 0.0], &set, &p, 1, SetRule::Soft { candidates: 1 }).1, vec![0b0000_0010]);
        // soft: centroid 0 is 3x likelier, but neuron 5 is 40x more important than 0, 2 and 3
        let head = [(3.0f32).ln(), 0.0];
        assert_eq!(predicted_set(&head, &set, &p, 2, SetRule::Soft { candidates: 2 }).1, vec![0b0010_0010]);
        // without importance the likelier centroid's neurons win (ties to the lower index)
        let plain = NeuronPrior::new(&set, None);
        assert_eq!(predicted_set(&head, &set, &plain, 2, SetRule::Soft { candidates: 2 }).1, vec![0b0000_0011]);
        assert!("oracle".parse::<SetRule>().is_err());
    }
}
