//! Ranking a sparse layer's neurons before their rows are in memory, for the strategies that
//! stream whole records ([`Ranker`]): the per-layer predictors (layout
//! `formats::layer_predictors`, training `prep layers`: `w2 relu(w1 x + b1) + b2`), the
//! resident gate/up sketch (`|silu(g~ . x)(u~ . x)| x ||W_down[:, j]||` from rows of 2 bits a
//! weight, `formats::sketch`); and each token's exact `|h|` from every record in memory
//! ([`ExactRanker`], the oracle).
//!
//! At each sparse layer the layer's own normed input ranks every neuron, the `k` best are the
//! set, the set's missing records are planned into the layer's slots (the held rows not in the
//! set that contributed least lately make room: `select::layered`), and every row the layer then
//! holds counts with its exact `h = silu(gate . x)(up . x)`, from its own record.

use crate::error::{Result, RuntimeError};
use crate::ops::matmul::matmul_f16;
use crate::ops::record_sum::RecordRows;
use crate::tensor::F16Matrix;
use formats::layer_predictors::{LayerPredictorFile, LayerPredictorSpec};
use formats::manifest::Manifest;
use std::path::Path;

/// The artifact role of `layer_predictors.safetensors` in a manifest.
pub const ARTIFACT_ROLE: &str = "layer_predictors";

struct Net {
    w1: F16Matrix, // [rank, d]
    b1: Vec<f32>,  // [rank]
    w2: F16Matrix, // [n_ff, rank]
    b2: Vec<f32>,  // [n_ff]
}

pub struct LayerPredictors {
    pub spec: LayerPredictorSpec,
    /// Layers `spec.first_layer..spec.n_layers`.
    nets: Vec<Net>,
}

impl LayerPredictors {
    pub fn from_file(f: LayerPredictorFile) -> Self {
        let s = f.spec;
        let f32s = |v: &[half::f16]| v.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
        let nets = f
            .layers
            .into_iter()
            .map(|w| Net {
                b1: f32s(&w.b1),
                b2: f32s(&w.b2),
                w1: F16Matrix::owned(s.rank, s.d_model, w.w1),
                w2: F16Matrix::owned(s.n_ff, s.rank, w.w2),
            })
            .collect();
        LayerPredictors { spec: s, nets }
    }

    /// The file at `path`, checked against a model of this shape.
    pub fn load(path: &Path, d_model: usize, n_ff: usize, n_layers: usize) -> Result<Self> {
        Ok(Self::from_file(LayerPredictorFile::load(path, d_model, n_ff, n_layers)?))
    }

    /// The preparation's predictors (artifact `layer_predictors`), covering its sparse layers.
    pub fn of_manifest(manifest_path: &Path, m: &Manifest) -> Result<Self> {
        let path = m.artifact_path_of(manifest_path, ARTIFACT_ROLE).map_err(|_| {
            RuntimeError::Input(format!(
                "{}: no {ARTIFACT_ROLE} artifact (the per-layer predictors are trained when the recipe has a [layers] section)",
                manifest_path.display()
            ))
        })?;
        let c = &m.model;
        let p = Self::load(&path, c.hidden_size, c.intermediate_size, c.num_hidden_layers)?;
        if p.spec.first_layer > m.records.first_layer {
            return Err(RuntimeError::Input(format!(
                "{}: predictors start at layer {}, but the records at layer {}",
                path.display(),
                p.spec.first_layer,
                m.records.first_layer
            )));
        }
        Ok(p)
    }

    /// Drops the predictors of layers below `from`.
    pub fn drop_layers_before(&mut self, from: usize) {
        let drop = from.saturating_sub(self.spec.first_layer).min(self.nets.len());
        self.nets.drain(..drop);
        self.spec.first_layer += drop;
    }

    /// `out` `[n, n_ff]` = each neuron's score for the `n` inputs `x` `[n, d]` of `layer`.
    pub fn scores(&self, layer: usize, x: &[f32], n: usize, out: &mut [f32]) {
        let net = &self.nets[layer - self.spec.first_layer];
        let mut z = vec![0f32; n * self.spec.rank];
        matmul_f16(x, n, &net.w1, &mut z);
        for row in z.chunks_exact_mut(self.spec.rank) {
            row.iter_mut().zip(&net.b1).for_each(|(v, b)| *v = (*v + b).max(0.0));
        }
        matmul_f16(&z, n, &net.w2, out);
        for row in out.chunks_exact_mut(self.spec.n_ff) {
            row.iter_mut().zip(&net.b2).for_each(|(v, b)| *v += b);
        }
    }
}

/// Which ranking a whole-record strategy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankerKind {
    /// The per-layer predictors (`--strategy layers`).
    Predictors,
    /// The resident few-bit gate/up sketch (`--strategy sketch`).
    Sketch,
    /// Each token's exact `|h|` from every record in memory (the oracle).
    Exact,
}

/// The artifact role of `sketch.safetensors` in a manifest.
pub const SKETCH_ROLE: &str = "sketch";

/// The gate and up rows of the sparse layers at a few bits per weight
/// (`formats::sketch::SketchFile`): `|silu(g~ . x)(u~ . x)| x ||W_down[:, j]||`.
pub struct SketchRanker {
    pub file: formats::sketch::SketchFile,
}

impl SketchRanker {
    fn scores(&self, layer: usize, xn: &[f32], out: &mut [f32]) {
        use crate::ops::sketch_dot::dot2_sketch_q8;
        use formats::sketch::SKETCH_BLOCK;
        use rayon::prelude::*;
        let f = &self.file;
        let li = layer - f.first_layer;
        let (rb, sb, n_ff) = (f.row_bytes(), f.d_model / SKETCH_BLOCK, f.n_ff);
        let x = crate::ops::qmatvec::Q8Vector::quantize(xn);
        let xsum: Vec<i32> = x.xq.chunks_exact(SKETCH_BLOCK).map(|b| b.iter().map(|&v| v as i32).sum()).collect();
        let packed = &f.packed[li * n_ff * 2 * rb..(li + 1) * n_ff * 2 * rb];
        let scales = &f.scales[li * n_ff * 2 * sb..(li + 1) * n_ff * 2 * sb];
        let norm = &f.down_norm[li * n_ff..(li + 1) * n_ff];
        out.par_iter_mut().enumerate().with_min_len(256).for_each(|(j, o)| {
            let (g, u) = dot2_sketch_q8(
                &packed[2 * j * rb..(2 * j + 1) * rb],
                &scales[2 * j * sb..(2 * j + 1) * sb],
                &packed[(2 * j + 1) * rb..(2 * j + 2) * rb],
                &scales[(2 * j + 1) * sb..(2 * j + 2) * sb],
                f.bits,
                &x.xq,
                &x.xs,
                &xsum,
            );
            *o = (crate::ops::swiglu::silu(g) * u).abs() * norm[j];
        });
    }

    fn drop_layers_before(&mut self, from: usize) {
        let f = &mut self.file;
        let drop = from.clamp(f.first_layer, f.first_layer + f.n_layers) - f.first_layer;
        let (rb, sb) = (f.row_bytes(), f.d_model / formats::sketch::SKETCH_BLOCK);
        f.packed.drain(..drop * f.n_ff * 2 * rb);
        f.scales.drain(..drop * f.n_ff * 2 * sb);
        f.down_norm.drain(..drop * f.n_ff);
        f.first_layer += drop;
        f.n_layers -= drop;
    }
}

/// What ranks a layer's neurons from its own input, before any of their rows are read.
pub enum Ranker {
    Predictors(LayerPredictors),
    Sketch(SketchRanker),
    Exact(ExactRanker),
}

impl Ranker {
    /// The preparation's per-layer predictors, or its sketch.
    pub fn of_manifest(manifest_path: &Path, m: &Manifest, kind: RankerKind) -> Result<Self> {
        match kind {
            RankerKind::Predictors => Ok(Ranker::Predictors(LayerPredictors::of_manifest(manifest_path, m)?)),
            RankerKind::Sketch => {
                let path = m.artifact_path_of(manifest_path, SKETCH_ROLE).map_err(|_| {
                    RuntimeError::Input(format!(
                        "{}: no {SKETCH_ROLE} artifact, which the sketch strategy ranks with (rerun make prepare)",
                        manifest_path.display()
                    ))
                })?;
                let c = &m.model;
                let d0 = m.sparsity.dense_prefix;
                let file = formats::sketch::SketchFile::load(
                    &path,
                    d0,
                    c.num_hidden_layers - d0,
                    c.intermediate_size,
                    c.hidden_size,
                )?;
                Ok(Ranker::Sketch(SketchRanker { file }))
            }
            RankerKind::Exact => Ok(Ranker::Exact(ExactRanker::load(manifest_path, m)?)),
        }
    }

    /// The rule as reports name it.
    pub fn name(&self) -> &'static str {
        match self {
            Ranker::Predictors(_) => "layers",
            Ranker::Sketch(_) => "sketch",
            Ranker::Exact(_) => "oracle",
        }
    }

    /// Bytes held for each sparse layer.
    pub fn layer_bytes(&self) -> u64 {
        match self {
            Ranker::Predictors(p) => p.spec.layer_parameters() as u64 * 2,
            Ranker::Sketch(s) => s.file.layer_bytes() as u64,
            Ranker::Exact(e) => (e.n_ff * e.records.row_bytes()) as u64,
        }
    }

    pub fn drop_layers_before(&mut self, from: usize) {
        match self {
            Ranker::Predictors(p) => p.drop_layers_before(from),
            Ranker::Sketch(s) => s.drop_layers_before(from),
            Ranker::Exact(e) => e.drop_layers_before(from),
        }
    }

    /// `out` `[n, n_ff]`: each neuron's score for the `n` inputs `x` `[n, d]` of `layer`.
    pub fn scores(&self, layer: usize, x: &[f32], n: usize, out: &mut [f32]) {
        match self {
            Ranker::Predictors(p) => p.scores(layer, x, n, out),
            Ranker::Sketch(s) => {
                for (xr, o) in x.chunks_exact(s.file.d_model).zip(out.chunks_exact_mut(s.file.n_ff)) {
                    s.scores(layer, xr, o);
                }
            }
            Ranker::Exact(e) => {
                for (xr, o) in x.chunks_exact(e.records.d_model()).zip(out.chunks_exact_mut(e.n_ff)) {
                    e.scores(layer, xr, o);
                }
            }
        }
    }
}

/// The `k` largest of `scores` (ties: the lower index), ascending.
pub fn top_k(scores: &[f32], k: usize) -> Vec<u32> {
    let mut idx: Vec<u32> = (0..scores.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    let better = |a: &u32, b: &u32| scores[*b as usize].total_cmp(&scores[*a as usize]).then(a.cmp(b));
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, better);
        idx.truncate(k);
    }
    idx.sort_unstable();
    idx
}

/// How many of `set` (ascending) are among the `set.len()` largest `|h|`: the recall of the
/// oracle's set of that size.
pub fn oracle_hits(h: &[f32], set: &[u32]) -> usize {
    let abs: Vec<f32> = h.iter().map(|v| v.abs()).collect();
    let oracle = top_k(&abs, set.len());
    let (mut i, mut j, mut hits) = (0, 0, 0);
    while i < set.len() && j < oracle.len() {
        match set[i].cmp(&oracle[j]) {
            std::cmp::Ordering::Equal => {
                hits += 1;
                i += 1;
                j += 1;
            }
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
        }
    }
    hits
}

/// The ceiling no ranker passes: each token's exact `|h| = |silu(gate . x)(up . x)|` for every
/// neuron, from every sparse layer's records held in memory (`-X set-rule=oracle`, a run with
/// every row in memory). What perfect ranking would give at a set size.
pub struct ExactRanker {
    records: RecordRows,
    /// Per sparse layer from `first_layer`: `[n_ff, record payload bytes]`.
    rows: Vec<Vec<u8>>,
    first_layer: usize,
    n_ff: usize,
}

impl ExactRanker {
    /// Reads every sparse layer's records (checked) into memory.
    fn load(manifest_path: &Path, m: &Manifest) -> Result<Self> {
        let c = &m.model;
        let records_path = m.artifact_path_of(manifest_path, "records")?;
        let rf = crate::model::records_file(manifest_path, m, &records_path)?;
        let records = RecordRows::of(c.hidden_size, rf.shape);
        let first = m.records.first_layer;
        let (d, n_ff) = (c.hidden_size, c.intermediate_size);
        let rows = (first..c.num_hidden_layers)
            .map(|l| {
                let mut buf = Vec::with_capacity(n_ff * records.row_bytes());
                for j in 0..n_ff {
                    match rf.shape {
                        None => {
                            let r = rf.read(l, j)?;
                            for v in [&r.gate, &r.up, &r.down_t] {
                                buf.extend_from_slice(bytemuck::cast_slice(&v[..d]));
                            }
                        }
                        Some(_) => {
                            let r = rf.read_blocks(l, j)?;
                            buf.extend_from_slice(&r.gate);
                            buf.extend_from_slice(&r.up);
                            buf.extend_from_slice(&r.down);
                        }
                    }
                }
                Ok(buf)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ExactRanker { records, rows, first_layer: first, n_ff })
    }

    /// `out` `[n_ff]`: every neuron's exact `|h|` for `xn` `[d]`, as `RecordRows::sum` computes
    /// the coefficients.
    fn scores(&self, layer: usize, xn: &[f32], out: &mut [f32]) {
        use rayon::prelude::*;
        let (rb, rows) = (self.records.row_bytes(), &self.rows[layer - self.first_layer]);
        let coef = self.records.coefficients(xn);
        out.par_iter_mut()
            .enumerate()
            .with_min_len(256)
            .for_each(|(j, o)| *o = coef.of(&rows[j * rb..(j + 1) * rb]).abs());
    }

    fn drop_layers_before(&mut self, from: usize) {
        let drop = from.saturating_sub(self.first_layer).min(self.rows.len());
        self.rows.drain(..drop);
        self.first_layer += drop;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_and_oracle_hits() {
        let s = [0.5f32, 3.0, -1.0, 3.0, 2.0];
        assert_eq!(top_k(&s, 2), vec![1, 3]);
        assert_eq!(top_k(&s, 3), vec![1, 3, 4]);
        assert_eq!(top_k(&s, 9), vec![0, 1, 2, 3, 4]);
        // |h| ranks: 1 (4.0), 2 (-3.0), 4
        let h = [0.1f32, 4.0, -3.0, 0.2, 1.0];
        assert_eq!(oracle_hits(&h, &[1, 2]), 2);
        assert_eq!(oracle_hits(&h, &[0, 1]), 1);
        assert_eq!(oracle_hits(&h, &[0, 3, 4]), 1);
    }
}
