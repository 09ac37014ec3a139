//! SwiGLU: `h = silu(gate) * up`, where `silu(g) = g / (1 + e^-g)`. gate, up, h: `[n_tokens, n_ff]`.

#[inline]
pub fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

/// `gate[i] <- silu(gate[i]) * up[i]` in place.
pub fn swiglu_in_place(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}
