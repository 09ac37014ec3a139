//! Key/value cache: for every layer, keys and values of positions `0..len`.

/// `k[layer]`, `v[layer]`: `[max_seq, n_kv_heads * head_dim]` f32.
pub struct KvCache {
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    pub kv_dim: usize,
    pub max_seq: usize,
    /// Positions filled so far.
    pub len: usize,
}

impl KvCache {
    pub fn new(n_layers: usize, kv_dim: usize, max_seq: usize) -> Self {
        KvCache {
            k: (0..n_layers).map(|_| vec![0f32; max_seq * kv_dim]).collect(),
            v: (0..n_layers).map(|_| vec![0f32; max_seq * kv_dim]).collect(),
            kv_dim,
            max_seq,
            len: 0,
        }
    }

    pub fn clear(&mut self) {
        self.len = 0;
    }

    pub fn n_bytes(&self) -> usize {
        2 * self.k.len() * self.max_seq * self.kv_dim * 4
    }
}
