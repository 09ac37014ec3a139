//! Next-token choice: greedy at temperature 0, otherwise temperature + top-p with a seeded RNG.

use crate::ops::softmax::softmax;
use rand::{rngs::StdRng, Rng, SeedableRng};

pub struct Sampler {
    pub temperature: f32,
    pub top_p: f32,
    rng: StdRng,
}

impl Sampler {
    pub fn new(temperature: f32, top_p: f32, seed: u64) -> Self {
        Sampler { temperature, top_p, rng: StdRng::seed_from_u64(seed) }
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.temperature <= 0.0 {
            return argmax(logits) as u32;
        }
        let mut p: Vec<f32> = logits.iter().map(|&l| l / self.temperature).collect();
        softmax(&mut p);
        let mut idx: Vec<usize> = (0..p.len()).collect();
        idx.sort_unstable_by(|&a, &b| p[b].total_cmp(&p[a]));
        // Smallest prefix whose mass reaches top_p.
        let mut mass = 0f32;
        let mut cut = idx.len();
        for (i, &j) in idx.iter().enumerate() {
            mass += p[j];
            if mass >= self.top_p {
                cut = i + 1;
                break;
            }
        }
        let r: f32 = self.rng.gen::<f32>() * mass;
        let mut acc = 0f32;
        for &j in &idx[..cut] {
            acc += p[j];
            if acc >= r {
                return j as u32;
            }
        }
        idx[cut - 1] as u32
    }
}

/// Index of the largest value (the first on ties).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_and_seeded() {
        let logits = [0.1f32, 3.0, 2.9, -1.0];
        assert_eq!(Sampler::new(0.0, 1.0, 0).sample(&logits), 1);
        let a: Vec<u32> = {
            let mut s = Sampler::new(1.0, 0.9, 42);
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(1.0, 0.9, 42);
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        assert!(a.iter().all(|&t| t == 1 || t == 2), "top-p 0.9 keeps only the two likely tokens: {a:?}");
    }
}
