//! `out[t, o] = sum_i x[t, i] * w[o, i]` — activations times a transposed weight matrix, f16
//! here, GGML blocks in `ops::qmatmul` ([`matmul`] and [`matvec_many`] take either).
//!
//! x: `[n_tokens, in]` f32, w: `[out, in]` f16, out: `[n_tokens, out]` f32.
//! One token (decode): a matrix-vector product, rows split across the rayon pool.
//! Several tokens (prefill): each weight row is widened to f32 once and dotted with four
//! token rows at a time, so every weight byte is read once per call, not once per token.

use crate::ops::qmatmul::{self, activation_type, ActivationType, QActivation};
use crate::ops::simd;
use crate::tensor::{F16Matrix, Matrix, QMatrix};
use rayon::prelude::*;

/// `out` `[n_tokens, w.rows]` = `x` `[n_tokens, w.cols]` times `w` transposed.
pub fn matmul(x: &[f32], n_tokens: usize, w: &Matrix, out: &mut [f32]) {
    match w {
        Matrix::F16(w) => matmul_f16(x, n_tokens, w, out),
        Matrix::Quant(w) => {
            check_sizes(x, n_tokens, w.rows, w.cols, out);
            let at = activation_of(w);
            if n_tokens == 1 {
                qmatmul::qmatvec(w, &QActivation::quantize(at, x), out);
            } else if n_tokens > 1 {
                qmatmul::qmatmul(&qmatmul::quantize_rows(at, x, w.cols), w, out);
            }
        }
    }
}

/// [`matmul`] of the same `x` `[n_tokens, in]` by several matrices (q, k and v; gate and up):
/// `outs[m]` `[n_tokens, ws[m].rows]`. Quantized matrices of one activation type share one
/// quantization of `x` and, in the integer product, one parallel pass
/// ([`qmatmul::qmatmul_many`]); one token is [`matvec_many`].
pub fn matmul_many(x: &[f32], n_tokens: usize, ws: &[&Matrix], outs: &mut [&mut [f32]]) {
    if n_tokens == 1 {
        return matvec_many(x, ws, outs);
    }
    let quants: Option<Vec<&QMatrix>> =
        ws.iter().map(|w| if let Matrix::Quant(q) = w { Some(q) } else { None }).collect();
    match quants {
        Some(qs) if n_tokens > 1 && qs.iter().all(|q| activation_of(q) == activation_of(qs[0])) => {
            for (q, out) in qs.iter().zip(outs.iter()) {
                check_sizes(x, n_tokens, q.rows, q.cols, out);
            }
            qmatmul::qmatmul_many(&qmatmul::quantize_rows(activation_of(qs[0]), x, qs[0].cols), &qs, outs);
        }
        _ => ws.iter().zip(outs.iter_mut()).for_each(|(w, o)| matmul(x, n_tokens, w, o)),
    }
}

fn activation_of(w: &QMatrix) -> ActivationType {
    activation_type(w.ty).unwrap_or_else(|| panic!("no block kernel for {} (the loader refuses it)", w.ty.name()))
}

fn check_sizes(x: &[f32], n_tokens: usize, n_out: usize, n_in: usize, out: &[f32]) {
    assert_eq!(x.len(), n_tokens * n_in, "matmul: x has {} values, expected {n_tokens} x {n_in}", x.len());
    assert_eq!(out.len(), n_tokens * n_out, "matmul: out has {} values, expected {n_tokens} x {n_out}", out.len());
}

/// Several matrix-vector products of the same `x` as one parallel pass: `outs[m][o] = ws[m][o, :] . x`.
/// Quantized matrices share one quantized `x` per activation type.
pub fn matvec_many(x: &[f32], ws: &[&Matrix], outs: &mut [&mut [f32]]) {
    if let Some(f16s) = ws.iter().map(|w| w.as_f16()).collect::<Option<Vec<_>>>() {
        return matvec_many_f16(x, &f16s, outs);
    }
    let quants: Option<Vec<&QMatrix>> =
        ws.iter().map(|w| if let Matrix::Quant(q) = w { Some(q) } else { None }).collect();
    match quants {
        Some(qs) => {
            let mut acts: Vec<(ActivationType, QActivation)> = Vec::new();
            for q in &qs {
                let at = activation_of(q);
                if !acts.iter().any(|(a, _)| *a == at) {
                    acts.push((at, QActivation::quantize(at, x)));
                }
            }
            let xs: Vec<&QActivation> =
                qs.iter().map(|q| &acts.iter().find(|(a, _)| *a == activation_of(q)).unwrap().1).collect();
            qmatmul::qmatvec_many(&qs, &xs, outs);
        }
        None => ws.iter().zip(outs.iter_mut()).for_each(|(w, o)| matmul(x, 1, w, o)),
    }
}

/// Rows of `w` per rayon task.
const ROWS_PER_TASK: usize = 32;
/// Rows of `w` per rayon task in the one-token (decode) path.
const DECODE_ROWS_PER_TASK: usize = 128;

pub fn matmul_f16(x: &[f32], n_tokens: usize, w: &F16Matrix, out: &mut [f32]) {
    let (n_out, n_in) = (w.rows, w.cols);
    check_sizes(x, n_tokens, n_out, n_in, out);
    if n_tokens == 0 {
        return;
    }
    if n_tokens == 1 {
        matvec(x, w, out);
        return;
    }
    // Independent blocks of ROWS_PER_TASK weight rows. A block widens its rows to f32 once,
    // walks the tokens four at a time with a 2-row x 4-token kernel, and fills its own
    // `[n_tokens, rows in block]` tile; the tiles are then copied into `out` row by row.
    let n_blocks = n_out.div_ceil(ROWS_PER_TASK);
    let tiles: Vec<Vec<f32>> = (0..n_blocks)
        .into_par_iter()
        .map(|block| {
            let r0 = block * ROWS_PER_TASK;
            let n_rows = ROWS_PER_TASK.min(n_out - r0);
            let mut w_f32 = vec![0f32; n_rows * n_in]; // [n_rows, n_in]
            for (r, buf) in w_f32.chunks_exact_mut(n_in).enumerate() {
                half::slice::HalfFloatSliceExt::convert_to_f32_slice(w.row(r0 + r), buf);
            }
            let mut tile = vec![0f32; n_tokens * n_rows]; // [n_tokens, n_rows]
            let wrow = |r: usize| &w_f32[r * n_in..(r + 1) * n_in];
            let xrow = |t: usize| &x[t * n_in..(t + 1) * n_in];
            let mut t = 0;
            while t + 4 <= n_tokens {
                let xs = [xrow(t), xrow(t + 1), xrow(t + 2), xrow(t + 3)];
                let mut r = 0;
                while r + 2 <= n_rows {
                    let d = simd::dot_2x4_f32(wrow(r), wrow(r + 1), xs);
                    for i in 0..4 {
                        tile[(t + i) * n_rows + r] = d[0][i];
                        tile[(t + i) * n_rows + r + 1] = d[1][i];
                    }
                    r += 2;
                }
                if r < n_rows {
                    let d = simd::dot4_f32(wrow(r), xs[0], xs[1], xs[2], xs[3]);
                    for i in 0..4 {
                        tile[(t + i) * n_rows + r] = d[i];
                    }
                }
                t += 4;
            }
            for t in t..n_tokens {
                for r in 0..n_rows {
                    tile[t * n_rows + r] = simd::dot_f32(wrow(r), xrow(t));
                }
            }
            tile
        })
        .collect();
    out.par_chunks_mut(n_out).enumerate().for_each(|(t, row)| {
        for (block, tile) in tiles.iter().enumerate() {
            let r0 = block * ROWS_PER_TASK;
            let n_rows = tile.len() / n_tokens;
            row[r0..r0 + n_rows].copy_from_slice(&tile[t * n_rows..(t + 1) * n_rows]);
        }
    });
}

/// Several matrix-vector products of the same `x` as one parallel pass (one fork-join instead
/// of one per matrix): `outs[m][o] = ws[m][o, :] . x`. Used for q/k/v and gate/up in decode.
pub fn matvec_many_f16(x: &[f32], ws: &[&F16Matrix], outs: &mut [&mut [f32]]) {
    let tasks = row_block_tasks(outs, |m| ws[m].rows, DECODE_ROWS_PER_TASK);
    tasks.into_par_iter().for_each(|(m, dst, r0)| matvec_rows(x, ws[m], r0, dst));
}

/// Several matrix-vector products as one list of tasks: (matrix, block of its output, the
/// block's first row), `rows_per_task` rows each; `rows(m)` is matrix m's row count, which its
/// output must have.
pub(crate) fn row_block_tasks<'a>(
    outs: &'a mut [&mut [f32]],
    rows: impl Fn(usize) -> usize,
    rows_per_task: usize,
) -> Vec<(usize, &'a mut [f32], usize)> {
    let mut tasks = Vec::new();
    for (m, out) in outs.iter_mut().enumerate() {
        assert_eq!(out.len(), rows(m));
        for (b, chunk) in out.chunks_mut(rows_per_task).enumerate() {
            tasks.push((m, chunk, b * rows_per_task));
        }
    }
    tasks
}

/// `dst[i] = w[r0 + i, :] . x`: 8 rows a pass, a last group of fewer one row at a time.
fn matvec_rows(x: &[f32], w: &F16Matrix, r0: usize, dst: &mut [f32]) {
    let done = dst.len() / 8 * 8;
    for (g, out) in dst[..done].chunks_exact_mut(8).enumerate() {
        let r = r0 + 8 * g;
        out.copy_from_slice(&simd::dot8_f16_f32(&w.as_slice()[r * w.cols..(r + 8) * w.cols], x));
    }
    for (i, o) in dst[done..].iter_mut().enumerate() {
        *o = simd::dot_f16_f32(w.row(r0 + done + i), x);
    }
}

/// `out[o] = w[o, :] . x` for one token.
pub fn matvec(x: &[f32], w: &F16Matrix, out: &mut [f32]) {
    out.par_chunks_mut(DECODE_ROWS_PER_TASK)
        .enumerate()
        .for_each(|(block, dst)| matvec_rows(x, w, block * DECODE_ROWS_PER_TASK, dst));
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn matmul_matches_naive_for_any_token_count() {
        let (n_out, n_in) = (70, 45);
        let w: Vec<f16> = (0..n_out * n_in).map(|i| f16::from_f32(((i * 31 % 19) as f32 - 9.0) / 10.0)).collect();
        let wm = Matrix::F16(F16Matrix::owned(n_out, n_in, w.clone()));
        for n_tokens in [1usize, 2, 5, 9] {
            let x: Vec<f32> = (0..n_tokens * n_in).map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0).collect();
            let mut out = vec![0f32; n_tokens * n_out];
            matmul(&x, n_tokens, &wm, &mut out);
            if n_tokens == 1 {
                let (mut a, mut b) = (vec![0f32; n_out], vec![0f32; n_out]);
                matvec_many(&x, &[&wm, &wm], &mut [&mut a, &mut b]);
                assert_eq!(a, out);
                assert_eq!(b, out);
            }
            for t in 0..n_tokens {
                for o in 0..n_out {
                    let want: f32 = (0..n_in).map(|i| w[o * n_in + i].to_f32() * x[t * n_in + i]).sum();
                    assert!((out[t * n_out + o] - want).abs() < 1e-3, "t={t} o={o}");
                }
            }
        }
    }
}
