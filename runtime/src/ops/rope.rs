//! Rotary position embedding in the Hugging Face layout ("rotate half"): within each head the
//! pair (i, i + head_dim/2) is rotated by `pos * theta^(-2i/head_dim)`.

/// The rotation frequencies of a head, `theta^(-2i/head_dim)` for `i < head_dim/2`; each
/// position's cos/sin are computed when a token is rotated (in f64, as a table would be), so no
/// `[positions, head_dim/2]` table is held: at Qwen's 32K positions that table was 16 MiB of a
/// budget that buys row slots.
pub struct RopeTable {
    pub half_dim: usize,
    inv_freq: Vec<f64>, // [head_dim/2]
    max_positions: usize,
}

impl RopeTable {
    pub fn new(head_dim: usize, theta: f64, max_positions: usize) -> Self {
        let half_dim = head_dim / 2;
        let inv_freq = (0..half_dim).map(|i| theta.powf(-2.0 * i as f64 / head_dim as f64)).collect();
        RopeTable { half_dim, inv_freq, max_positions }
    }

    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// Rotates every head of one token's query `q: [n_heads * head_dim]` and key
    /// `k: [n_kv_heads * head_dim]` at position `pos`.
    pub fn apply_pair(&self, q: &mut [f32], k: &mut [f32], pos: usize) {
        debug_assert!(pos < self.max_positions);
        let h = self.half_dim;
        let mut cos = [0f32; 256];
        let mut sin = [0f32; 256];
        assert!(h <= cos.len(), "head_dim {} > 512", 2 * h);
        for (i, f) in self.inv_freq.iter().enumerate() {
            let (s, c) = (pos as f64 * f).sin_cos();
            cos[i] = c as f32;
            sin[i] = s as f32;
        }
        for x in [q, k] {
            for head in x.chunks_exact_mut(2 * h) {
                let (a, b) = head.split_at_mut(h);
                for i in 0..h {
                    let (x0, x1) = (a[i], b[i]);
                    a[i] = x0 * cos[i] - x1 * sin[i];
                    b[i] = x0 * sin[i] + x1 * cos[i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let t = super::RopeTable::new(4, 10000.0, 8);
        let (mut x, mut k) = ([1.0f32, 2.0, 3.0, 4.0], [0.5f32, -1.0, 2.0, 0.25]);
        t.apply_pair(&mut x, &mut k, 0);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(k, [0.5, -1.0, 2.0, 0.25]);
        t.apply_pair(&mut x, &mut k, 5);
        let n: f32 = x.iter().map(|v| v * v).sum();
        assert!((n - 30.0).abs() < 1e-4);
        // pair 0 turns by 5 rad, pair 1 by 5 * 10000^-0.5
        let (c, s) = (5f64.cos() as f32, 5f64.sin() as f32);
        assert!((k[0] - (0.5 * c - 2.0 * s)).abs() < 1e-6 && (k[2] - (0.5 * s + 2.0 * c)).abs() < 1e-6);
        let a = 5.0 * 10000f64.powf(-0.5);
        let (c, s) = (a.cos() as f32, a.sin() as f32);
        assert!((k[1] - (-c - 0.25 * s)).abs() < 1e-6 && (k[3] - (-s + 0.25 * c)).abs() < 1e-6);
    }
}
