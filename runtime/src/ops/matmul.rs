//! `out[t, o] = sum_i x[t, i] * w[o, i]` — activations times a transposed f16 weight matrix.
//!
//! x: `[n_tokens, in]` f32, w: `[out, in]` f16, out: `[n_tokens, out]` f32.
//! One token (decode): a matrix-vector product, rows split across the rayon pool.
//! Several tokens (prefill): each weight row is widened to f32 once and dotted with four
//! token rows at a time, so every weight byte is read once per call, not once per token.

use crate::ops::simd;
use crate::tensor::F16Matrix;
use rayon::prelude::*;

/// Rows of `w` per rayon task.
const ROWS_PER_TASK: usize = 32;

pub fn matmul(x: &[f32], n_tokens: usize, w: &F16Matrix, out: &mut [f32]) {
    let (n_out, n_in) = (w.rows, w.cols);
    assert_eq!(x.len(), n_tokens * n_in, "matmul: x has {} values, expected {n_tokens} x {n_in}", x.len());
    assert_eq!(out.len(), n_tokens * n_out, "matmul: out has {} values, expected {n_tokens} x {n_out}", out.len());
    if n_tokens == 0 {
        return;
    }
    if n_tokens == 1 {
        matvec(x, w, out);
        return;
    }
    // out_t: [out, n_tokens], filled by independent row blocks, then transposed.
    let mut out_t = vec![0f32; n_out * n_tokens];
    out_t.par_chunks_mut(ROWS_PER_TASK * n_tokens).enumerate().for_each(|(block, dst)| {
        let mut w_row = vec![0f32; n_in];
        let r0 = block * ROWS_PER_TASK;
        for (ri, dst_row) in dst.chunks_mut(n_tokens).enumerate() {
            half::slice::HalfFloatSliceExt::convert_to_f32_slice(w.row(r0 + ri), &mut w_row);
            let mut t = 0;
            while t + 4 <= n_tokens {
                let d = simd::dot4_f32(
                    &w_row,
                    &x[t * n_in..(t + 1) * n_in],
                    &x[(t + 1) * n_in..(t + 2) * n_in],
                    &x[(t + 2) * n_in..(t + 3) * n_in],
                    &x[(t + 3) * n_in..(t + 4) * n_in],
                );
                dst_row[t..t + 4].copy_from_slice(&d);
                t += 4;
            }
            while t < n_tokens {
                dst_row[t] = simd::dot_f32(&w_row, &x[t * n_in..(t + 1) * n_in]);
                t += 1;
            }
        }
    });
    out.par_chunks_mut(n_out).enumerate().for_each(|(t, row)| {
        for (o, v) in row.iter_mut().enumerate() {
            *v = out_t[o * n_tokens + t];
        }
    });
}

/// `out[o] = w[o, :] . x` for one token.
pub fn matvec(x: &[f32], w: &F16Matrix, out: &mut [f32]) {
    out.par_chunks_mut(ROWS_PER_TASK).enumerate().for_each(|(block, dst)| {
        let r0 = block * ROWS_PER_TASK;
        let mut i = 0;
        while i + 2 <= dst.len() {
            let (a, b) = simd::dot2_f16_f32(w.row(r0 + i), w.row(r0 + i + 1), x);
            dst[i] = a;
            dst[i + 1] = b;
            i += 2;
        }
        if i < dst.len() {
            dst[i] = simd::dot_f16_f32(w.row(r0 + i), x);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use half::f16;

    #[test]
    fn matmul_matches_naive_for_any_token_count() {
        let (n_out, n_in) = (70, 45);
        let w: Vec<f16> = (0..n_out * n_in).map(|i| f16::from_f32(((i * 31 % 19) as f32 - 9.0) / 10.0)).collect();
        let wm = F16Matrix::owned(n_out, n_in, w.clone());
        for n_tokens in [1usize, 2, 5, 9] {
            let x: Vec<f32> = (0..n_tokens * n_in).map(|i| ((i * 13 % 29) as f32 - 14.0) / 7.0).collect();
            let mut out = vec![0f32; n_tokens * n_out];
            matmul(&x, n_tokens, &wm, &mut out);
            for t in 0..n_tokens {
                for o in 0..n_out {
                    let want: f32 = (0..n_in).map(|i| w[o * n_in + i].to_f32() * x[t * n_in + i]).sum();
                    assert!((out[t * n_out + o] - want).abs() < 1e-3, "t={t} o={o}");
                }
            }
        }
    }
}
