//! SwiGLU: `h = silu(gate) * up`, where `silu(g) = g / (1 + e^-g)`. gate, up, h: `[n_tokens, n_ff]`.
//! Done in two steps so activation capture can see silu(gate) and up before they are multiplied.

#[inline]
pub fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// `gate[i] <- silu(gate[i])` in place.
pub fn silu_in_place(gate: &mut [f32]) {
    for g in gate.iter_mut() {
        *g = silu(*g);
    }
}

/// `a[i] <- a[i] * b[i]`.
pub fn mul_in_place(a: &mut [f32], b: &[f32]) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x *= y;
    }
}
