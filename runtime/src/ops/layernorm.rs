//! LayerNorm: `out = (x - mean(x)) / sqrt(var(x) + eps) * weight + bias`, row by row.
//! x, out: `[n_rows, d]`; weight, bias: `[d]`. Used by the activation predictor.

pub fn layernorm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
    let d = weight.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let mean = xr.iter().sum::<f32>() / d as f32;
        let var = xr.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
        let inv = 1.0 / (var + eps).sqrt();
        for (((o, &v), &g), &b) in or.iter_mut().zip(xr).zip(weight).zip(bias) {
            *o = (v - mean) * inv * g + b;
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn zero_mean_unit_variance() {
        let x = [1.0f32, 2.0, 3.0, 4.0];
        let mut out = [0f32; 4];
        super::layernorm(&x, &[1.0; 4], &[0.5; 4], 0.0, &mut out);
        let mean: f32 = out.iter().map(|v| v - 0.5).sum::<f32>() / 4.0;
        let var: f32 = out.iter().map(|v| (v - 0.5) * (v - 0.5)).sum::<f32>() / 4.0;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5, "{mean} {var}");
    }
}
