//! Key/value cache: for every layer, keys and values of positions `0..len`, stored in f16 as
//! llama.cpp stores them (its default cache type): half the bytes of f32, and the memory plan
//! counts 2 bytes a value. Attention converts each row back to f32 and sums in f32.

use half::f16;

/// `k[layer]`, `v[layer]`: `[max_seq, n_kv_heads * head_dim]` f16.
pub struct KvCache {
    pub k: Vec<Vec<f16>>,
    pub v: Vec<Vec<f16>>,
    pub kv_dim: usize,
    pub max_seq: usize,
    /// Positions filled so far.
    pub len: usize,
}

/// Bytes of one cached value.
pub const KV_VALUE_BYTES: usize = 2;

impl KvCache {
    pub fn new(n_layers: usize, kv_dim: usize, max_seq: usize) -> Self {
        KvCache {
            k: (0..n_layers).map(|_| vec![f16::ZERO; max_seq * kv_dim]).collect(),
            v: (0..n_layers).map(|_| vec![f16::ZERO; max_seq * kv_dim]).collect(),
            kv_dim,
            max_seq,
            len: 0,
        }
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn n_bytes(&self) -> usize {
        2 * self.k.len() * self.max_seq * self.kv_dim * KV_VALUE_BYTES
    }

    /// Stores rows `[n, kv_dim]` of keys and values at positions `pos0..pos0 + n` of `layer`
    /// (rounded to f16).
    pub fn store(&mut self, layer: usize, pos0: usize, k: &[f32], v: &[f32]) {
        use half::slice::HalfFloatSliceExt;
        let range = pos0 * self.kv_dim..pos0 * self.kv_dim + k.len();
        self.k[layer][range.clone()].convert_from_f32_slice(k);
        self.v[layer][range].convert_from_f32_slice(v);
    }
}
