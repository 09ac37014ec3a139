//! Quantized matrix-vector products: the resident 4-bit gate/up scorer (`formats::scorer`: rows
//! of Q4_0 blocks, 32 weights and one f16 scale; `packed` `[rows, d / 2]`, `scales` `[rows, d /
//! 32]`) and the int8 output head (`formats::head_q8`: Q8_0 blocks; `q` `[rows, d]`). Both
//! against an activation vector quantized to int8 per block of 32 (one f32 scale): integer dot
//! products per block, f32 across blocks.

use crate::ops::simd::{dot2_q4_q8, dot2_q4_q8_pairs, dot_q8_q8};
use formats::scorer::{Q4_BLOCK, Q4_BLOCK_BYTES};
use half::f16;
use rayon::prelude::*;

/// `x` `[d]` as int8 per block of 32: `x ~= xq * xs[block]`.
pub struct Q8Vector {
    pub xq: Vec<i8>,  // [d]
    pub xs: Vec<f32>, // [d / 32]
    /// `xq` in pair layout for [`dot2_q4_q8_pairs`] (empty for an odd block count): per pair
    /// of blocks (b, b + 1), `[xq_b[..16], xq_b+1[..16], xq_b[16..], xq_b+1[16..]]` — what the
    /// low and the high nibbles of the two blocks' 32 packed bytes multiply.
    pub xp: Vec<i8>,
    /// `[d / 32]` 8 x the sum of each block's `xq` (the Q4 offset's share).
    pub xsum8: Vec<f32>,
}

impl Q8Vector {
    pub fn quantize(x: &[f32]) -> Self {
        assert!(x.len().is_multiple_of(Q4_BLOCK));
        let mut xq = vec![0i8; x.len()];
        let mut xs = vec![0f32; x.len() / Q4_BLOCK];
        for ((block, q), s) in x.chunks_exact(Q4_BLOCK).zip(xq.chunks_exact_mut(Q4_BLOCK)).zip(xs.iter_mut()) {
            let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
            *s = amax / 127.0;
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            q.iter_mut().zip(block).for_each(|(o, v)| *o = (v * inv).round() as i8);
        }
        let xsum8 = xq.chunks_exact(Q4_BLOCK).map(|q| 8.0 * q.iter().map(|&v| v as i32).sum::<i32>() as f32).collect();
        let mut xp = Vec::new();
        if xs.len().is_multiple_of(2) {
            xp.reserve(xq.len());
            for pair in xq.chunks_exact(2 * Q4_BLOCK) {
                let half = Q4_BLOCK / 2;
                for part in
                    [&pair[..half], &pair[Q4_BLOCK..Q4_BLOCK + half], &pair[half..Q4_BLOCK], &pair[Q4_BLOCK + half..]]
                {
                    xp.extend_from_slice(part);
                }
            }
        }
        Q8Vector { xq, xs, xp, xsum8 }
    }
}

/// One packed row `[d / 2]` with its block scales `[d / 32]` against `x`.
#[inline]
pub fn dot_q4_q8(packed: &[u8], scales: &[f16], x: &Q8Vector) -> f32 {
    let mut sum = 0f32;
    for (((p, &s), xq), &xs) in
        packed.chunks_exact(Q4_BLOCK_BYTES).zip(scales).zip(x.xq.chunks_exact(Q4_BLOCK)).zip(&x.xs)
    {
        let p: &[u8; Q4_BLOCK_BYTES] = p.try_into().unwrap();
        let xq: &[i8; Q4_BLOCK] = xq.try_into().unwrap();
        let mut acc = 0i32;
        for k in 0..Q4_BLOCK_BYTES {
            let lo = (p[k] & 0x0F) as i32 - 8;
            let hi = (p[k] >> 4) as i32 - 8;
            acc += lo * xq[k] as i32 + hi * xq[k + Q4_BLOCK_BYTES] as i32;
        }
        sum += acc as f32 * s.to_f32() * xs;
    }
    sum
}

/// `out[r] = row_r . x` for `out.len()` (even) rows of width `d` (rayon over pairs of rows;
/// the AVX2 kernel of `ops::simd` where compiled, else [`dot_q4_q8`]).
pub fn matvec_q4(packed: &[u8], scales: &[f16], d: usize, x: &Q8Vector, out: &mut [f32]) {
    let (rb, sb) = (d / 2, d / Q4_BLOCK);
    assert!(
        packed.len() == out.len() * rb
            && scales.len() == out.len() * sb
            && x.xq.len() == d
            && out.len().is_multiple_of(2)
    );
    out.par_chunks_mut(256).enumerate().for_each(|(c, o)| {
        for (i, v) in o.chunks_exact_mut(2).enumerate() {
            let r = c * 256 + 2 * i;
            let (p0, p1) = (&packed[r * rb..(r + 1) * rb], &packed[(r + 1) * rb..(r + 2) * rb]);
            let (s0, s1) = (&scales[r * sb..(r + 1) * sb], &scales[(r + 1) * sb..(r + 2) * sb]);
            let (a, b) = dot2_q4_q8_pairs(p0, s0, p1, s1, &x.xp, &x.xs, &x.xsum8)
                .or_else(|| dot2_q4_q8(p0, s0, p1, s1, &x.xq, &x.xs))
                .unwrap_or_else(|| (dot_q4_q8(p0, s0, x), dot_q4_q8(p1, s1, x)));
            v[0] = a;
            v[1] = b;
        }
    });
}

/// One Q8_0 row `q` `[d]` with its block scales `[d / 32]` against `x` (portable).
#[inline]
pub fn dot_q8_q8_portable(q: &[i8], scales: &[f16], x: &Q8Vector) -> f32 {
    let mut sum = 0f32;
    for ((w, &s), (xq, &xs)) in q.chunks_exact(Q4_BLOCK).zip(scales).zip(x.xq.chunks_exact(Q4_BLOCK).zip(&x.xs)) {
        let acc: i32 = w.iter().zip(xq).map(|(&a, &b)| a as i32 * b as i32).sum();
        sum += acc as f32 * s.to_f32() * xs;
    }
    sum
}

/// `out[r] = row_r . x` for the Q8_0 rows of width `d` (rayon over rows).
pub fn matvec_q8(q: &[i8], scales: &[f16], d: usize, x: &Q8Vector, out: &mut [f32]) {
    let sb = d / Q4_BLOCK;
    assert!(q.len() == out.len() * d && scales.len() == out.len() * sb && x.xq.len() == d);
    out.par_chunks_mut(512).enumerate().for_each(|(c, o)| {
        for (i, v) in o.iter_mut().enumerate() {
            let r = c * 512 + i;
            let (w, s) = (&q[r * d..(r + 1) * d], &scales[r * sb..(r + 1) * sb]);
            *v = dot_q8_q8(w, s, &x.xq, &x.xs).unwrap_or_else(|| dot_q8_q8_portable(w, s, x));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use formats::scorer::{dequantize_q4_row, quantize_q4_row};

    #[test]
    fn q8_rows_match_the_dequantized_product() {
        let (rows, d) = (3, 64);
        let w: Vec<f32> = (0..rows * d).map(|i| ((i * 613 % 97) as f32 - 48.0) / 50.0).collect();
        let x: Vec<f32> = (0..d).map(|i| ((i * 29 % 13) as f32 - 6.0) / 3.0).collect();
        let mut q = vec![0i8; rows * d];
        let mut s = vec![f16::ZERO; rows * d / 32];
        for r in 0..rows {
            formats::head_q8::quantize_q8_row(
                &w[r * d..(r + 1) * d],
                &mut q[r * d..(r + 1) * d],
                &mut s[r * 2..(r + 1) * 2],
            );
        }
        let xq = Q8Vector::quantize(&x);
        let mut out = vec![0f32; rows];
        matvec_q8(&q, &s, d, &xq, &mut out);
        for r in 0..rows {
            let portable = dot_q8_q8_portable(&q[r * d..(r + 1) * d], &s[r * 2..(r + 1) * 2], &xq);
            assert!((out[r] - portable).abs() <= 1e-4 * portable.abs().max(1.0));
            let exact: f32 = w[r * d..(r + 1) * d].iter().zip(&x).map(|(a, b)| a * b).sum();
            let norm: f32 = w[r * d..(r + 1) * d].iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            assert!((out[r] - exact).abs() <= 0.02 * norm, "row {r}: {} vs {exact}", out[r]);
        }
    }

    #[test]
    fn matches_the_dequantized_f32_product() {
        // 3 blocks (odd: the block-at-a-time kernel), 10 (pairs, a group of 8 and a tail of 2),
        // 48 (Qwen's width: six groups of 8)
        for d in [96, 320, 1536] {
            product_case(6, d);
        }
    }

    fn product_case(rows: usize, d: usize) {
        let w: Vec<f32> = (0..rows * d).map(|i| ((i * 7919 % 211) as f32 - 105.0) / 300.0).collect();
        let x: Vec<f32> = (0..d).map(|i| ((i * 31 % 17) as f32 - 8.0) / 5.0).collect();
        let mut packed = vec![0u8; rows * d / 2];
        let mut scales = vec![f16::ZERO; rows * d / 32];
        for r in 0..rows {
            quantize_q4_row(
                &w[r * d..(r + 1) * d],
                &mut packed[r * d / 2..(r + 1) * d / 2],
                &mut scales[r * d / 32..(r + 1) * d / 32],
            );
        }
        let mut out = vec![0f32; rows];
        let xq = Q8Vector::quantize(&x);
        // the AVX2 kernel (where compiled) agrees with the portable loop
        for r in 0..rows {
            let (p, s) = (&packed[r * d / 2..(r + 1) * d / 2], &scales[r * d / 32..(r + 1) * d / 32]);
            let portable = dot_q4_q8(p, s, &xq);
            if let Some((a, b)) = dot2_q4_q8(p, s, p, s, &xq.xq, &xq.xs) {
                assert!((a - portable).abs() <= 1e-4 * portable.abs().max(1.0) && a == b, "{a} {b} {portable}");
            }
            let (r1, s1) = (
                &packed[(rows - 1 - r) * d / 2..(rows - r) * d / 2],
                &scales[(rows - 1 - r) * d / 32..(rows - r) * d / 32],
            );
            match dot2_q4_q8_pairs(p, s, r1, s1, &xq.xp, &xq.xs, &xq.xsum8) {
                Some((a, b)) => {
                    let other = dot_q4_q8(r1, s1, &xq);
                    assert!((a - portable).abs() <= 1e-4 * portable.abs().max(1.0), "d {d}: {a} vs {portable}");
                    assert!((b - other).abs() <= 1e-4 * other.abs().max(1.0), "d {d}: {b} vs {other}");
                }
                None => {
                    assert!(d / 32 % 2 == 1 || cfg!(not(target_feature = "avx2")), "d {d}: the pair kernel should run")
                }
            }
        }
        matvec_q4(&packed, &scales, d, &Q8Vector::quantize(&x), &mut out);
        for r in 0..rows {
            let deq = dequantize_q4_row(&packed[r * d / 2..(r + 1) * d / 2], &scales[r * d / 32..(r + 1) * d / 32]);
            let exact: f32 = deq.iter().zip(&x).map(|(a, b)| a * b).sum();
            let norm: f32 = deq.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            // only x's int8 rounding separates them: < 1% of the terms' magnitude
            assert!((out[r] - exact).abs() <= 0.01 * norm, "row {r}: {} vs {exact}", out[r]);
        }
    }
}
