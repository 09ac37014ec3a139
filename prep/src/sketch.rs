//! `prep sketch`: the gate and up rows of the sparse layers at a few bits per weight (layout
//! and quantizer: `formats::sketch`), which `--strategy sketch` keeps resident to rank every
//! neuron before any of its record is read. Per neuron it also stores the down column's norm
//! (the ranking's weight, as the gate ranker's). The rows are quantized to keep the products
//! with the layer's inputs right, not the weights: each weight's error counts by the mean
//! square of the input channel it multiplies, measured on calibration text (llama.cpp's
//! importance matrix, which its 2- and 3-bit types need for the same reason).

use anyhow::{bail, Result};
use formats::sketch::{quantize_sketch_row, sketch_row_bytes, SketchFile, SKETCH_BITS, SKETCH_BLOCK};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Serialize)]
pub struct SketchSummary {
    pub path: String,
    pub first_layer: usize,
    pub layers: usize,
    pub bits: u32,
    pub bytes: usize,
    /// Mean relative L2 error of the sketched gate and up rows against the model's.
    pub relative_error: f64,
    /// Calibration tokens the input importance was measured on (0: unweighted).
    pub calibration_tokens: usize,
    pub seconds: f64,
}

/// Per layer from `first_layer`, the mean square of each channel of the MLP's normed input.
struct InputSquares {
    first_layer: usize,
    sums: Vec<Vec<f64>>,
    tokens: Vec<u64>,
}

impl runtime::model::MlpHook for InputSquares {
    fn observe(&mut self, _layer: usize, _gate_silu: &[f32], _up: &[f32]) {}

    fn observe_input(&mut self, layer: usize, xn: &[f32]) {
        if layer < self.first_layer {
            return;
        }
        let li = layer - self.first_layer;
        let d = self.sums[li].len();
        for row in xn.chunks_exact(d) {
            self.sums[li].iter_mut().zip(row).for_each(|(a, &v)| *a += (v as f64) * (v as f64));
            self.tokens[li] += 1;
        }
    }
}

/// Where a sketch's input importance is measured: `sequences` of `seq_len` tokens of `corpus`
/// (none: unweighted).
#[derive(Debug, Clone)]
pub struct Calibration {
    pub corpus: Vec<PathBuf>,
    pub seq_len: usize,
    pub sequences: usize,
}

/// Sketches layers `dense_prefix..` of the model in `model_dir` at `bits` into `out`, each
/// weight's error weighted by its input's mean square over `calibration`.
pub fn sketch(
    model_dir: &Path,
    dense_prefix: usize,
    bits: u32,
    calibration: &Calibration,
    out: &Path,
    show_progress: bool,
) -> Result<SketchSummary> {
    let t0 = std::time::Instant::now();
    if !SKETCH_BITS.contains(&bits) {
        bail!("sketch bits {bits}: expected one of {SKETCH_BITS:?}");
    }
    let (model, tok) = runtime::open_model(model_dir, runtime::DecodeLayout::Mapped)?;
    let c = &model.config;
    let (n_layers, n_ff, d) = (c.num_hidden_layers, c.intermediate_size, c.hidden_size);
    if dense_prefix > n_layers {
        bail!("dense prefix {dense_prefix} > {n_layers} layers");
    }
    if !d.is_multiple_of(SKETCH_BLOCK) {
        bail!("hidden size {d} is not a multiple of {SKETCH_BLOCK}: the sketch needs whole blocks");
    }
    let n_sparse = n_layers - dense_prefix;
    let mut squares =
        InputSquares { first_layer: dense_prefix, sums: vec![vec![0f64; d]; n_sparse], tokens: vec![0; n_sparse] };
    let calibration = match calibration.sequences {
        0 => Vec::new(),
        n => crate::capture::corpus_sequences(&tok, &calibration.corpus, calibration.seq_len, n)?,
    };
    for seq in &calibration {
        let mut cache = model.new_cache(seq.len())?;
        model.forward_observed(seq, &mut cache, seq.len(), Some(&mut squares))?;
    }
    let (rb, sb) = (sketch_row_bytes(d, bits), d / SKETCH_BLOCK);
    let mut packed = vec![0u8; n_sparse * n_ff * 2 * rb];
    let mut scales = vec![f16::ZERO; n_sparse * n_ff * 2 * sb];
    let mut down_norm = vec![0f32; n_sparse * n_ff];
    let (mut err_sum, mut err_n) = (0f64, 0u64);
    let pb = if show_progress { ProgressBar::new(n_sparse as u64) } else { ProgressBar::hidden() };
    pb.set_style(ProgressStyle::with_template("sketch [{bar:40}] {pos}/{len} layers ({elapsed}, eta {eta})").unwrap());
    for (si, l) in (dense_prefix..n_layers).enumerate() {
        let lw = model.weights.layers[l].mlp.resident(l)?;
        let importance: Vec<f32> = match squares.tokens[si] {
            0 => Vec::new(),
            n => squares.sums[si].iter().map(|v| (v / n as f64) as f32).collect(),
        };
        let p = &mut packed[si * n_ff * 2 * rb..(si + 1) * n_ff * 2 * rb];
        let s = &mut scales[si * n_ff * 2 * sb..(si + 1) * n_ff * 2 * sb];
        let errs: Vec<f64> =
            p.par_chunks_mut(2 * rb)
                .zip(s.par_chunks_mut(2 * sb))
                .enumerate()
                .map(|(j, (pj, sj))| {
                    let mut e = 0.0;
                    let (mut row, mut back) = (vec![0f32; d], vec![0f32; d]);
                    for (part, w) in [&lw.w_gate, &lw.w_up].into_iter().enumerate() {
                        w.row_f32(j, &mut row);
                        let (pp, sp) = (&mut pj[part * rb..(part + 1) * rb], &mut sj[part * sb..(part + 1) * sb]);
                        quantize_sketch_row(&row, &importance, bits, pp, sp);
                        formats::sketch::dequantize_sketch_row(pp, sp, bits, &mut back);
                        let (num, den) = row.iter().zip(&back).fold((0f64, 0f64), |(n, dd), (a, b)| {
                            (n + ((a - b) as f64).powi(2), dd + (*a as f64).powi(2))
                        });
                        e += (num / den.max(1e-30)).sqrt();
                    }
                    e
                })
                .collect();
        err_sum += errs.iter().sum::<f64>();
        err_n += 2 * n_ff as u64;
        // ||W_down[:, j]||: W_down is [d, n_ff]
        let mut sq = vec![0f64; n_ff];
        let mut row = vec![0f32; n_ff];
        for r in 0..d {
            lw.w_down.row_f32(r, &mut row);
            sq.iter_mut().zip(&row).for_each(|(a, v)| *a += (*v as f64).powi(2));
        }
        down_norm[si * n_ff..(si + 1) * n_ff].iter_mut().zip(&sq).for_each(|(n, v)| *n = v.sqrt() as f32);
        pb.inc(1);
    }
    pb.finish_and_clear();
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let f = SketchFile {
        path: out.to_path_buf(),
        first_layer: dense_prefix,
        n_layers: n_sparse,
        n_ff,
        d_model: d,
        bits,
        packed,
        scales,
        down_norm,
    };
    f.save()?;
    Ok(SketchSummary {
        path: out.display().to_string(),
        first_layer: dense_prefix,
        layers: n_sparse,
        bits,
        bytes: n_sparse * f.layer_bytes(),
        relative_error: err_sum / err_n.max(1) as f64,
        calibration_tokens: calibration.iter().map(Vec::len).sum(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}
