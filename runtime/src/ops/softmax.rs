//! Numerically stable softmax in place, and log-sum-exp.

pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum = crate::ops::simd::exp_shifted_sum(x, max);
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `log(sum(exp(x)))`, accumulated in f64.
pub fn log_sum_exp(x: &[f32]) -> f64 {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = x.iter().map(|&v| (v as f64 - max).exp()).sum();
    max + sum.ln()
}

#[cfg(test)]
mod tests {
    #[test]
    fn sums_to_one() {
        let mut x = [1.0f32, 2.0, 3.0];
        super::softmax(&mut x);
        assert!((x.iter().sum::<f32>() - 1.0).abs() < 1e-6 && x[2] > x[1]);
        assert!((super::log_sum_exp(&[0.0, 0.0]) - 2f64.ln()).abs() < 1e-12);
    }
}
