//! Causal grouped-query attention over the KV cache.
//!
//! q: `[n_tokens, n_heads * head_dim]` (already rotated), the cache holds keys and values of
//! positions `0..pos0 + n_tokens` for this layer: `[max_seq, n_kv_heads * head_dim]` each.
//! out: `[n_tokens, n_heads * head_dim]` (n_tokens = q.len() / q_dim). Query head `h` reads kv head `h / (n_heads / n_kv_heads)`.

use crate::ops::{simd, softmax::softmax};
use rayon::prelude::*;

pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

pub fn attention(q: &[f32], k_cache: &[f32], v_cache: &[f32], pos0: usize, s: &AttentionShape, out: &mut [f32]) {
    let (hd, q_dim, kv_dim) = (s.head_dim, s.n_heads * s.head_dim, s.n_kv_heads * s.head_dim);
    let group = s.n_heads / s.n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    // One task per (token, head): out is split into head_dim-wide pieces in the same order.
    out.par_chunks_mut(hd).enumerate().for_each(|(idx, o)| {
        let (t, h) = (idx / s.n_heads, idx % s.n_heads);
        let n_keys = pos0 + t + 1;
        let kvh = h / group;
        let qh = &q[t * q_dim + h * hd..t * q_dim + (h + 1) * hd];
        let mut scores: Vec<f32> = (0..n_keys)
            .map(|p| simd::dot_f32(qh, &k_cache[p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd]) * scale)
            .collect();
        softmax(&mut scores);
        o.fill(0.0);
        for (p, &w) in scores.iter().enumerate() {
            simd::axpy(w, &v_cache[p * kv_dim + kvh * hd..p * kv_dim + (kvh + 1) * hd], o);
        }
    });
}
