//! The sketch's row products (rows of 1, 2 or 4 bits per weight, layout `formats::sketch`)
//! against the activation quantized to int8 per block of 32 (`ops::qmatvec::Q8Vector`):
//! integer sums per block, f32 across blocks.

use formats::sketch::{SKETCH_BLOCK, SKETCH_GROUP_BYTES};
use half::f16;

/// One sketch row against `xq` (int8 `[d]`) with block scales `xs` `[d / 32]` and block sums
/// `xsum` `[d / 32]` (the sum of each block's `xq`).
#[inline]
pub fn dot_sketch_q8(packed: &[u8], scales: &[f16], bits: u32, xq: &[i8], xs: &[f32], xsum: &[i32]) -> f32 {
    let mask = (1u8 << bits) - 1;
    let c2 = mask as i32; // 2c
    let per_group = 8 / bits as usize;
    let mut sum = 0f32;
    for (b, ((&s, x), (&sx, &xs_b))) in
        scales.iter().zip(xq.chunks_exact(SKETCH_BLOCK)).zip(xs.iter().zip(xsum)).enumerate()
    {
        let (g, j) = (b / per_group, b % per_group);
        let bytes: &[u8; SKETCH_GROUP_BYTES] =
            packed[g * SKETCH_GROUP_BYTES..(g + 1) * SKETCH_GROUP_BYTES].try_into().unwrap();
        let shift = bits as usize * j;
        let mut acc = 0i32;
        for i in 0..SKETCH_BLOCK {
            acc += ((bytes[i] >> shift) & mask) as i32 * x[i] as i32;
        }
        // sum (q - c) x = acc - c sum x, in halves to stay integer
        sum += (2 * acc - c2 * xs_b) as f32 * 0.5 * s.to_f32() * sx;
    }
    sum
}

/// Two rows (a neuron's gate and up) against one activation: the x86-64-v3 kernel for 2 bits,
/// else [`dot_sketch_q8`] twice.
#[inline]
#[allow(clippy::too_many_arguments)]
pub fn dot2_sketch_q8(
    p0: &[u8],
    s0: &[f16],
    p1: &[u8],
    s1: &[f16],
    bits: u32,
    xq: &[i8],
    xs: &[f32],
    xsum: &[i32],
) -> (f32, f32) {
    (bits == 2)
        .then(|| crate::ops::simd::dot2_sketch2_q8(p0, s0, p1, s1, xq, xs, xsum))
        .flatten()
        .unwrap_or_else(|| (dot_sketch_q8(p0, s0, bits, xq, xs, xsum), dot_sketch_q8(p1, s1, bits, xq, xs, xsum)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use formats::sketch::{dequantize_sketch_row, quantize_sketch_row, sketch_row_bytes};

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    }

    #[test]
    fn dot_matches_the_dequantized_row() {
        let mut seed = 7u64;
        let d = 576; // 18 blocks: a partial last group at every width
        let row: Vec<f32> = (0..d).map(|_| lcg(&mut seed)).collect();
        let x: Vec<f32> = (0..d).map(|_| lcg(&mut seed) * 3.0).collect();
        let xq_v = crate::ops::qmatvec::Q8Vector::quantize(&x);
        let xsum: Vec<i32> = xq_v.xq.chunks_exact(SKETCH_BLOCK).map(|b| b.iter().map(|&v| v as i32).sum()).collect();
        for bits in [1u32, 2, 4] {
            let mut packed = vec![0u8; sketch_row_bytes(d, bits)];
            let mut scales = vec![f16::ZERO; d / SKETCH_BLOCK];
            quantize_sketch_row(&row, &[], bits, &mut packed, &mut scales);
            let mut back = vec![0f32; d];
            dequantize_sketch_row(&packed, &scales, bits, &mut back);
            // the integer kernel equals the dequantized row against the dequantized activation
            let xd: Vec<f64> =
                xq_v.xq.iter().enumerate().map(|(i, &q)| q as f64 * xq_v.xs[i / SKETCH_BLOCK] as f64).collect();
            let want: f64 = back.iter().zip(&xd).map(|(&w, &v)| w as f64 * v).sum();
            let got = dot_sketch_q8(&packed, &scales, bits, &xq_v.xq, &xq_v.xs, &xsum) as f64;
            let bound = 1e-5 * back.iter().zip(&xd).map(|(&w, &v)| (w as f64 * v).abs()).sum::<f64>();
            assert!((got - want).abs() <= bound, "{bits} bits: {got} vs {want}");
            // the two-row kernel (x86-64-v3 for 2 bits) gives the same, for each row
            let (a, b) = dot2_sketch_q8(&packed, &scales, &packed, &scales, bits, &xq_v.xq, &xq_v.xs, &xsum);
            assert!((a as f64 - want).abs() <= bound && a == b, "{bits} bits, two rows: {a} {b} vs {want}");
        }
    }
}
