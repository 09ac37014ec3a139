//! SwiGLU: `h = silu(gate) * up`, where `silu(g) = g / (1 + e^-g)`. gate, up, h: `[n_tokens, n_ff]`.
//! Done in two steps so activation capture can see silu(gate) and up before they are multiplied.

#[inline]
pub fn silu(g: f32) -> f32 {
    g / (1.0 + (-g).exp())
}

use rayon::prelude::*;

/// Values from which an element-wise op splits across the rayon pool (a prompt batch's
/// `[n_tokens, n_ff]`; one token's row stays on its thread).
const PARALLEL_FROM: usize = 1 << 16;
/// Values per rayon task of a split element-wise op.
const CHUNK: usize = 1 << 14;

/// `gate[i] <- silu(gate[i])` in place.
pub fn silu_in_place(gate: &mut [f32]) {
    let run = |c: &mut [f32]| c.iter_mut().for_each(|g| *g = silu(*g));
    if gate.len() >= PARALLEL_FROM {
        gate.par_chunks_mut(CHUNK).for_each(run);
    } else {
        run(gate);
    }
}

/// `a[i] <- a[i] * b[i]`.
pub fn mul_in_place(a: &mut [f32], b: &[f32]) {
    assert_eq!(a.len(), b.len());
    let run = |(x, y): (&mut [f32], &[f32])| x.iter_mut().zip(y).for_each(|(x, &y)| *x *= y);
    if a.len() >= PARALLEL_FROM {
        a.par_chunks_mut(CHUNK).zip(b.par_chunks(CHUNK)).for_each(run);
    } else {
        run((a, b));
    }
}
