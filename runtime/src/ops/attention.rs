//! Causal grouped-query attention over the KV cache.
//!
//! q: `[n_tokens, n_heads * head_dim]` (already rotated). The cache holds keys and values of
//! positions `0..pos0 + n_tokens` for this layer: `[max_seq, n_kv_heads * head_dim]` each, in
//! f16 (`crate::kv_cache`); scores, softmax and the weighted sum are f32.
//! out: `[n_tokens, n_heads * head_dim]` (n_tokens = q.len() / q_dim). Query head `h` reads kv
//! head `h / (n_heads / n_kv_heads)`.
//!
//! Work is split into (kv head, block of 4 consecutive tokens): the block's queries of every
//! head that reads that kv head (4 x the group) share each key row's load and conversion
//! (dot products 4 queries at a time) and each value row's. A decoded token is one block: its
//! group of heads shares the whole cache's reads.

use crate::ops::{simd, softmax::softmax};
use half::f16;
use half::slice::HalfFloatSliceExt;
use rayon::prelude::*;

pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

const TOKENS_PER_TASK: usize = 4;
/// Value rows converted to f32 at a time.
const KEYS_PER_CHUNK: usize = 16;

/// `out += sum_k weights[k] values[k]` (`values` rows of `hd`), each element's sum in key order
/// with one fused multiply-add per key (the bits of one `axpy` per key), 64 elements at a time
/// in registers.
fn weighted_sum(weights: &[f32], values: &[f32], hd: usize, out: &mut [f32]) {
    const W: usize = 64;
    let whole = hd / W * W;
    for c in (0..whole).step_by(W) {
        let mut acc = [0f32; W];
        acc.copy_from_slice(&out[c..c + W]);
        for (k, &w) in weights.iter().enumerate() {
            let v = &values[k * hd + c..k * hd + c + W];
            acc.iter_mut().zip(v).for_each(|(a, &x)| *a = w.mul_add(x, *a));
        }
        out[c..c + W].copy_from_slice(&acc);
    }
    for (k, &w) in weights.iter().enumerate() {
        simd::axpy(w, &values[k * hd + whole..(k + 1) * hd], &mut out[whole..]);
    }
}

pub fn attention(q: &[f32], k_cache: &[f16], v_cache: &[f16], pos0: usize, s: &AttentionShape, out: &mut [f32]) {
    let (hd, q_dim, kv_dim) = (s.head_dim, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let n_tokens = q.len() / q_dim;
    let group = s.n_heads / s.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let n_blocks = n_tokens.div_ceil(TOKENS_PER_TASK);
    // Each task returns the outputs `[queries, head_dim]` of its queries, (token, head) in
    // order, token-major; they are scattered after.
    let results: Vec<Vec<f32>> = (0..s.n_kv_heads * n_blocks)
        .into_par_iter()
        .map(|task| {
            let (kvh, b) = (task % s.n_kv_heads, task / s.n_kv_heads);
            let t0 = b * TOKENS_PER_TASK;
            let nt = TOKENS_PER_TASK.min(n_tokens - t0);
            // query i: token t0 + i / group, head kvh * group + i % group
            let nq = nt * group;
            // query i: its row of q and the keys it sees (causal: 0..=its own position)
            let queries: Vec<&[f32]> = (0..nq)
                .map(|i| {
                    let (t, h) = (t0 + i / group, kvh * group + i % group);
                    &q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd]
                })
                .collect();
            let visible: Vec<usize> = (0..nq).map(|i| pos0 + t0 + i / group + 1).collect();
            // keys visible to the block's last token
            let n_keys = pos0 + t0 + nt;
            // scores `[nq, n_keys]`: the key rows converted KEYS_PER_CHUNK at a time (rows past
            // the last key zero), each query's scores 8 keys a pass; a chunk starts at a multiple
            // of KEYS_PER_CHUNK whatever the block, so a (query, key) score has the same bits in
            // any block
            let mut scores = vec![0f32; nq * n_keys];
            let mut keys = vec![0f32; KEYS_PER_CHUNK * hd];
            for p0 in (0..n_keys).step_by(KEYS_PER_CHUNK) {
                let n = KEYS_PER_CHUNK.min(n_keys - p0);
                for (k, row) in keys.chunks_exact_mut(hd).enumerate() {
                    if k < n {
                        let p = p0 + k;
                        k_cache[p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd].convert_to_f32_slice(row);
                    } else {
                        row.fill(0.0);
                    }
                }
                for (i, qi) in queries.iter().enumerate() {
                    for (g, rows) in keys.chunks_exact(8 * hd).enumerate().take(n.div_ceil(8)) {
                        let d = simd::dot8_f32(rows, qi);
                        let first = p0 + 8 * g;
                        let dst = &mut scores[i * n_keys + first..i * n_keys + (first + 8).min(n_keys)];
                        dst.iter_mut().zip(d).for_each(|(s, v)| *s = v * scale);
                    }
                }
            }
            for (i, &seen) in visible.iter().enumerate() {
                softmax(&mut scores[i * n_keys..i * n_keys + seen]);
            }
            // o_i = sum_p score_ip v_p, each element a fused multiply-add per key in key order;
            // the value rows converted KEYS_PER_CHUNK at a time, each query's output held in
            // registers over a chunk instead of loaded and stored once per key
            let mut o = vec![0f32; nq * hd];
            let mut values = vec![0f32; KEYS_PER_CHUNK * hd];
            for p0 in (0..n_keys).step_by(KEYS_PER_CHUNK) {
                let keys = KEYS_PER_CHUNK.min(n_keys - p0);
                for (k, v) in values.chunks_exact_mut(hd).take(keys).enumerate() {
                    let p = p0 + k;
                    v_cache[p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd].convert_to_f32_slice(v);
                }
                for (i, oi) in o.chunks_exact_mut(hd).enumerate() {
                    let seen = visible[i].saturating_sub(p0).min(keys);
                    let weights = &scores[i * n_keys + p0..i * n_keys + p0 + seen];
                    weighted_sum(weights, &values, hd, oi);
                }
            }
            o
        })
        .collect();
    for (task, o) in results.iter().enumerate() {
        let (kvh, b) = (task % s.n_kv_heads, task / s.n_kv_heads);
        for (i, oi) in o.chunks_exact(hd).enumerate() {
            let (t, h) = (b * TOKENS_PER_TASK + i / group, kvh * group + i % group);
            out[t * q_dim + h * hd..t * q_dim + (h + 1) * hd].copy_from_slice(oi);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Straightforward per-(token, head) attention to check the blocked version against.
    fn naive(q: &[f32], k: &[f16], v: &[f16], pos0: usize, s: &AttentionShape) -> Vec<f32> {
        let (hd, q_dim, kv_dim) = (s.head_dim, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
        let n = q.len() / q_dim;
        let mut out = vec![0f32; n * q_dim];
        for t in 0..n {
            for h in 0..s.n_heads {
                let kvh = h / (s.n_heads / s.n_kv_heads);
                let qh = &q[t * q_dim + h * hd..][..hd];
                let mut sc: Vec<f32> = (0..=pos0 + t)
                    .map(|p| {
                        qh.iter().zip(&k[p * kv_dim + kvh * hd..][..hd]).map(|(a, b)| a * b.to_f32()).sum::<f32>()
                            / (hd as f32).sqrt()
                    })
                    .collect();
                softmax(&mut sc);
                for (p, w) in sc.iter().enumerate() {
                    for j in 0..hd {
                        out[t * q_dim + h * hd + j] += w * v[p * kv_dim + kvh * hd + j].to_f32();
                    }
                }
            }
        }
        out
    }

    #[test]
    fn weighted_sum_gives_one_axpy_per_key_bit_for_bit() {
        for hd in [40, 64, 128] {
            let keys = 13;
            let values: Vec<f32> = (0..keys * hd).map(|i| ((i * 31 % 97) as f32 - 48.0) / 7.0).collect();
            let weights: Vec<f32> = (0..keys).map(|k| ((k * 17 % 11) as f32 + 0.3) / 9.0).collect();
            let start: Vec<f32> = (0..hd).map(|i| (i as f32).sin()).collect();
            let mut want = start.clone();
            for (k, &w) in weights.iter().enumerate() {
                simd::axpy(w, &values[k * hd..(k + 1) * hd], &mut want);
            }
            let mut got = start.clone();
            weighted_sum(&weights, &values, hd, &mut got);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "hd {hd}"
            );
        }
    }

    #[test]
    fn blocked_matches_naive() {
        for (n_heads, n_kv_heads) in [(4, 2), (4, 4), (9, 3), (12, 2)] {
            check(AttentionShape { n_heads, n_kv_heads, head_dim: 40 });
        }
    }

    fn check(s: AttentionShape) {
        let (q_dim, kv_dim) = (s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
        for (pos0, n) in [(0usize, 1usize), (0, 7), (5, 6), (9, 1), (300, 1), (30, 9)] {
            let total = pos0 + n;
            let q: Vec<f32> = (0..n * q_dim).map(|i| ((i * 37 % 23) as f32 - 11.0) / 10.0).collect();
            let k: Vec<f16> = (0..total * kv_dim).map(|i| f16::from_f32(((i * 13 % 19) as f32 - 9.0) / 10.0)).collect();
            let v: Vec<f16> = (0..total * kv_dim).map(|i| f16::from_f32(((i * 7 % 17) as f32 - 8.0) / 10.0)).collect();
            let mut out = vec![0f32; n * q_dim];
            attention(&q, &k, &v, pos0, &s, &mut out);
            let want = naive(&q, &k, &v, pos0, &s);
            for (a, b) in out.iter().zip(&want) {
                assert!((a - b).abs() < 1e-4, "pos0={pos0} n={n}: {a} vs {b}");
            }
        }
    }
}
