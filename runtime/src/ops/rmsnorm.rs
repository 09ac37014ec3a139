//! RMSNorm: `out = x / sqrt(mean(x^2) + eps) * weight`, row by row.
//! x, out: `[n_tokens, d]`; weight: `[d]`.

pub fn rmsnorm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    use rayon::prelude::*;
    let d = weight.len();
    let row = |(xr, or): (&[f32], &mut [f32])| {
        let ms: f32 = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * g;
        }
    };
    // a prompt batch's rows across the pool, 16 a task; one token's row on its thread
    if x.len() > d {
        x.par_chunks(16 * d).zip(out.par_chunks_mut(16 * d)).for_each(|(xs, os)| {
            xs.chunks_exact(d).zip(os.chunks_exact_mut(d)).for_each(row);
        });
    } else {
        x.chunks_exact(d).zip(out.chunks_exact_mut(d)).for_each(row);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn unit_rms() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut out = [0f32; 4];
        super::rmsnorm(&x, &[1.0, 2.0, 1.0, 1.0], 0.0, &mut out);
        let rms = (25.0f32 / 4.0).sqrt();
        assert!((out[0] - 3.0 / rms).abs() < 1e-6 && (out[1] - 8.0 / rms).abs() < 1e-6);
    }
}
