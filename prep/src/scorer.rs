//! `prep scorer`: the resident 4-bit gate/up copy of the sparse layers (layout:
//! `formats::scorer`). With it a sparse layer scores every neuron from its own input
//! (`--strategy scorer`) and streams only the down-projection rows it keeps: 4-bit gate and up
//! rows are 0.56 bytes a weight, a third of the f16 record they stand for. Per neuron it also
//! stores the down column's norm (the score's weight) and the CRC32C of its downT row (reads of
//! that row alone are checked against it).

use anyhow::{bail, Result};
use formats::scorer::{f16_row_crc32c, quantize_q4_row, GateUpScorerFile, Q4_BLOCK};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct ScorerSummary {
    pub path: String,
    pub first_layer: usize,
    pub layers: usize,
    pub bytes: usize,
    /// Mean relative L2 error of the 4-bit gate and up rows.
    pub relative_error: f64,
    pub seconds: f64,
}

/// The output head (lm_head, or the tied embedding), from one load of the model, in Q8_0 blocks
/// (`formats::head_q8`: `-X head=q8`, the scorer's head on an f16 preparation) into `q8_out`, and
/// in 4-bit blocks (`formats::head_compact`: the whole-record strategies' head, below the 4-bit
/// model's size) into `compact_out`.
pub fn heads(model_dir: &Path, q8_out: &Path, compact_out: &Path) -> Result<()> {
    let (model, _) = runtime::open_model(model_dir, runtime::DecodeLayout::Mapped)?;
    let w = &model.weights;
    let head = w.lm_head.as_ref().unwrap_or(&w.embed);
    for out in [q8_out, compact_out] {
        if let Some(parent) = out.parent() {
            std::fs::create_dir_all(parent)?;
        }
    }
    head_q8(head, q8_out)?;
    head_compact(head, compact_out)
}

fn head_q8(head: &runtime::tensor::Matrix, out: &Path) -> Result<()> {
    let (rows, d) = (head.rows(), head.cols());
    if !d.is_multiple_of(formats::head_q8::Q8_BLOCK) {
        bail!("hidden size {d} is not a multiple of {}", formats::head_q8::Q8_BLOCK);
    }
    let mut q = vec![0i8; rows * d];
    let mut scales = vec![f16::ZERO; rows * d / formats::head_q8::Q8_BLOCK];
    q.par_chunks_mut(d).zip(scales.par_chunks_mut(d / formats::head_q8::Q8_BLOCK)).enumerate().for_each(
        |(r, (qr, sr))| {
            let mut row = vec![0f32; d];
            head.row_f32(r, &mut row);
            formats::head_q8::quantize_q8_row(&row, qr, sr);
        },
    );
    formats::head_q8::Q8Head { path: out.to_path_buf(), rows, cols: d, q, scales }.save()?;
    Ok(())
}

fn head_compact(head: &runtime::tensor::Matrix, out: &Path) -> Result<()> {
    let (rows, d) = (head.rows(), head.cols());
    let ty = formats::head_compact::type_for(d)
        .ok_or_else(|| anyhow::anyhow!("hidden size {d} is not a multiple of 32: no 4-bit head"))?;
    let row_bytes = d / ty.block_elements() * ty.block_bytes();
    let mut bytes = vec![0u8; rows * row_bytes];
    bytes.par_chunks_mut(row_bytes).enumerate().for_each(|(r, dst)| {
        let mut row = vec![0f32; d];
        head.row_f32(r, &mut row);
        dst.copy_from_slice(&formats::ggml_quants::quantize(ty, &row).expect("type_for returns a quantizable type"));
    });
    formats::head_compact::save(out, ty, rows, d, bytes)?;
    Ok(())
}

/// The scorer of a native model: layers `dense_prefix..`'s gate and up rows as they are (`ty`
/// blocks), W_down's column norms, and the CRC32C of each column as version-2 records hold it
/// (Q8_0).
fn native_scorer(
    model: &runtime::Model,
    ty: formats::ggml_quants::GgmlType,
    dense_prefix: usize,
    out: &Path,
    t0: std::time::Instant,
) -> Result<ScorerSummary> {
    let c = &model.config;
    let (n_layers, n_ff, d) = (c.num_hidden_layers, c.intermediate_size, c.hidden_size);
    let n_sparse = n_layers - dense_prefix;
    let rb = d / ty.block_elements() * ty.block_bytes();
    let mut rows = vec![0u8; n_sparse * n_ff * 2 * rb];
    let mut down_norm = vec![0f32; n_sparse * n_ff];
    let mut down_crc32c = vec![0u32; n_sparse * n_ff];
    for (si, l) in (dense_prefix..n_layers).enumerate() {
        let lw = model.weights.layers[l].mlp.resident(l)?;
        let (runtime::tensor::Matrix::Quant(g), runtime::tensor::Matrix::Quant(u)) = (&lw.w_gate, &lw.w_up) else {
            bail!(
                "layer {l}: gate and up are not both GGML blocks (a native scorer needs them as the records hold them)"
            );
        };
        if g.ty != ty || u.ty != ty {
            bail!(
                "layer {l}: gate {} and up {} are not the {} of layer {dense_prefix}: version-2 records hold one type",
                g.ty.name(),
                u.ty.name(),
                ty.name()
            );
        }
        let dst = &mut rows[si * n_ff * 2 * rb..(si + 1) * n_ff * 2 * rb];
        dst.par_chunks_mut(2 * rb).enumerate().for_each(|(j, r)| {
            r[..rb].copy_from_slice(&g.row(j));
            r[rb..].copy_from_slice(&u.row(j));
        });
        let mut down = vec![0f32; d * n_ff]; // [d, n_ff]
        down.par_chunks_mut(n_ff).enumerate().for_each(|(r, row)| lw.w_down.row_f32(r, row));
        let cols: Vec<(f32, u32)> = (0..n_ff)
            .into_par_iter()
            .map(|j| {
                let col: Vec<f32> = (0..d).map(|i| down[i * n_ff + j]).collect();
                let norm = col.iter().map(|v| (*v as f64).powi(2)).sum::<f64>().sqrt() as f32;
                (norm, crc32c::crc32c(&formats::ggml_quants::quantize_q8_0(&col)))
            })
            .collect();
        for (j, (n, crc)) in cols.into_iter().enumerate() {
            down_norm[si * n_ff + j] = n;
            down_crc32c[si * n_ff + j] = crc;
        }
    }
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let f = GateUpScorerFile {
        path: out.to_path_buf(),
        first_layer: dense_prefix,
        n_layers: n_sparse,
        n_ff,
        d_model: d,
        q4: rows,
        blocks: Some(ty),
        scales: Vec::new(),
        down_norm,
        down_crc32c,
    };
    f.save()?;
    Ok(ScorerSummary {
        path: out.display().to_string(),
        first_layer: dense_prefix,
        layers: n_sparse,
        bytes: f.n_bytes(),
        relative_error: 0.0,
        seconds: t0.elapsed().as_secs_f64(),
    })
}

/// Quantizes layers `dense_prefix..` of the model in `model_dir` into `out`.
pub fn scorer(model_dir: &Path, dense_prefix: usize, out: &Path, show_progress: bool) -> Result<ScorerSummary> {
    let t0 = std::time::Instant::now();
    let (model, _) = runtime::open_model(model_dir, runtime::DecodeLayout::Mapped)?;
    let c = &model.config;
    let (n_layers, n_ff, d) = (c.num_hidden_layers, c.intermediate_size, c.hidden_size);
    if dense_prefix > n_layers {
        bail!("dense prefix {dense_prefix} > {n_layers} layers");
    }
    if !d.is_multiple_of(Q4_BLOCK) {
        bail!("hidden size {d} is not a multiple of {Q4_BLOCK}: the 4-bit scorer needs whole blocks");
    }
    // a native model: score from its own gate/up blocks (no second copy, exact scores)
    if dense_prefix < n_layers {
        if let runtime::tensor::Matrix::Quant(q) =
            &model.weights.layers[dense_prefix].mlp.resident(dense_prefix)?.w_gate
        {
            return native_scorer(&model, q.ty, dense_prefix, out, t0);
        }
    }
    let n_sparse = n_layers - dense_prefix;
    let (rb, sb) = (d / 2, d / Q4_BLOCK);
    let mut q4 = vec![0u8; n_sparse * n_ff * 2 * rb];
    let mut scales = vec![f16::ZERO; n_sparse * n_ff * 2 * sb];
    let mut down_norm = vec![0f32; n_sparse * n_ff];
    let mut down_crc32c = vec![0u32; n_sparse * n_ff];
    let (mut err_sum, mut err_n) = (0f64, 0u64);
    let pb = if show_progress { ProgressBar::new(n_sparse as u64) } else { ProgressBar::hidden() };
    pb.set_style(ProgressStyle::with_template("scorer [{bar:40}] {pos}/{len} layers ({elapsed}, eta {eta})").unwrap());
    for (si, l) in (dense_prefix..n_layers).enumerate() {
        let lw = model.weights.layers[l].mlp.resident(l)?;
        // W_down [d, n_ff] -> downT [n_ff, d]
        let mut down_t = vec![f16::ZERO; n_ff * d];
        for r in 0..d {
            for (j, &v) in lw.w_down.row_f16(r).iter().enumerate() {
                down_t[j * d + r] = v;
            }
        }
        let q = &mut q4[si * n_ff * 2 * rb..(si + 1) * n_ff * 2 * rb];
        let s = &mut scales[si * n_ff * 2 * sb..(si + 1) * n_ff * 2 * sb];
        let errs: Vec<f64> =
            q.par_chunks_mut(2 * rb)
                .zip(s.par_chunks_mut(2 * sb))
                .enumerate()
                .map(|(j, (qj, sj))| {
                    let mut e = 0.0;
                    for (part, w) in [&lw.w_gate, &lw.w_up].into_iter().enumerate() {
                        let mut row = vec![0f32; w.cols()];
                        w.row_f32(j, &mut row);
                        let (qp, sp) = (&mut qj[part * rb..(part + 1) * rb], &mut sj[part * sb..(part + 1) * sb]);
                        quantize_q4_row(&row, qp, sp);
                        let back = formats::scorer::dequantize_q4_row(qp, sp);
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
        for j in 0..n_ff {
            let row = &down_t[j * d..(j + 1) * d];
            down_norm[si * n_ff + j] = row.iter().map(|v| (v.to_f32() as f64).powi(2)).sum::<f64>().sqrt() as f32;
            down_crc32c[si * n_ff + j] = f16_row_crc32c(row);
        }
        pb.inc(1);
    }
    pb.finish_and_clear();
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let f = GateUpScorerFile {
        path: out.to_path_buf(),
        first_layer: dense_prefix,
        n_layers: n_sparse,
        n_ff,
        d_model: d,
        q4,
        blocks: None,
        scales,
        down_norm,
        down_crc32c,
    };
    f.save()?;
    Ok(ScorerSummary {
        path: out.display().to_string(),
        first_layer: dense_prefix,
        layers: n_sparse,
        bytes: f.n_bytes(),
        relative_error: err_sum / err_n.max(1) as f64,
        seconds: t0.elapsed().as_secs_f64(),
    })
}
