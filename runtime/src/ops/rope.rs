//! Rotary position embedding in the Hugging Face layout ("rotate half"): within each head the
//! pair (i, i + head_dim/2) is rotated by `pos * theta^(-2i/head_dim)`.

/// cos/sin for positions `0..max_positions`: `[max_positions, head_dim/2]` each.
pub struct RopeTable {
    pub half_dim: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl RopeTable {
    pub fn new(head_dim: usize, theta: f64, max_positions: usize) -> Self {
        let half_dim = head_dim / 2;
        let mut cos = Vec::with_capacity(max_positions * half_dim);
        let mut sin = Vec::with_capacity(max_positions * half_dim);
        for pos in 0..max_positions {
            for i in 0..half_dim {
                let inv_freq = theta.powf(-2.0 * i as f64 / head_dim as f64);
                let angle = pos as f64 * inv_freq;
                cos.push(angle.cos() as f32);
                sin.push(angle.sin() as f32);
            }
        }
        RopeTable { half_dim, cos, sin }
    }

    pub fn max_positions(&self) -> usize {
        self.cos.len() / self.half_dim.max(1)
    }

    /// Rotates every head of one token's vector `x: [n_heads * head_dim]` at position `pos`.
    pub fn apply(&self, x: &mut [f32], pos: usize) {
        let h = self.half_dim;
        let cos = &self.cos[pos * h..(pos + 1) * h];
        let sin = &self.sin[pos * h..(pos + 1) * h];
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

#[cfg(test)]
mod tests {
    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let t = super::RopeTable::new(4, 10000.0, 8);
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        t.apply(&mut x, 0);
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
        t.apply(&mut x, 5);
        let n: f32 = x.iter().map(|v| v * v).sum();
        assert!((n - 30.0).abs() < 1e-4);
    }
}
