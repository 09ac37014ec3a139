//! The sparse MLP over whole records: for each neuron held, `h = silu(gate . x) x (up . x)`
//! from its own gate and up rows, then `out += h x down`. One implementation for a streamed
//! run's slots and an in-memory run's rows, so both add the same terms in the same order
//! (`down_sum`'s chunk order).

use crate::ops::down_sum::{down_sum, down_sum_blocks};
use crate::ops::qmatmul::{activation_type, dot_row, QActivation};
use crate::ops::simd::dot2_f16_f32;
use crate::ops::swiglu::silu;
use formats::records::RecordShape;
use half::f16;

/// How a record's payload (a slot of [`crate::select::SlotRow::GateUpDown`]) is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordRows {
    /// Version 1: gate, up and downT rows, f16, `3 x d_model`.
    F16 { d_model: usize },
    /// Version 2: gate and up rows in the model's blocks, then the Q8_0 down row.
    Blocks { shape: RecordShape },
}

impl RecordRows {
    pub fn of(d_model: usize, shape: Option<RecordShape>) -> Self {
        match shape {
            None => RecordRows::F16 { d_model },
            Some(shape) => RecordRows::Blocks { shape },
        }
    }

    pub fn d_model(&self) -> usize {
        match self {
            RecordRows::F16 { d_model } => *d_model,
            RecordRows::Blocks { shape } => shape.d_model,
        }
    }

    /// Bytes of one neuron's rows.
    pub fn row_bytes(&self) -> usize {
        match self {
            RecordRows::F16 { d_model } => 3 * d_model * 2,
            RecordRows::Blocks { shape } => 2 * shape.gate_up_row_bytes() + shape.down_row_bytes(),
        }
    }

    /// What computes a row's coefficient `silu(gate . xn)(up . xn)`: block rows take `xn`
    /// quantized once, as llama.cpp does for their type (the dense path's activations).
    pub fn coefficients<'x>(&self, xn: &'x [f32]) -> Coefficients<'x> {
        match *self {
            RecordRows::F16 { d_model } => Coefficients::F16 { d_model, xn },
            RecordRows::Blocks { shape } => Coefficients::Blocks {
                shape,
                x: QActivation::quantize(
                    activation_type(shape.gate_up).expect("record shapes are checked to have a block kernel"),
                    xn,
                ),
            },
        }
    }

    /// `out` `[d]` = `sum_i silu(gate_i . xn) (up_i . xn) down_i` over `ids`, `row(id)` the
    /// id's [`RecordRows::row_bytes`] bytes; returns each id's coefficient (in `ids`' order).
    pub fn sum<'a>(&self, ids: &[u32], row: impl Fn(u32) -> &'a [u8] + Sync, xn: &[f32], out: &mut [f32]) -> Vec<f32> {
        use rayon::prelude::*;
        let c = self.coefficients(xn);
        let coefs: Vec<f32> = ids.par_iter().with_min_len(64).map(|&id| c.of(row(id))).collect();
        self.down_sum(ids, &coefs, row, out);
        coefs
    }

    /// `out` `[d]` = `sum_i coefs[i] down_i` over `ids` (coefficients already computed, in
    /// `ids`' order): the down half of [`RecordRows::sum`], in the same order.
    pub fn down_sum<'a>(&self, ids: &[u32], coefs: &[f32], row: impl Fn(u32) -> &'a [u8] + Sync, out: &mut [f32]) {
        let coef = |k: usize, _| coefs[k];
        match *self {
            RecordRows::F16 { d_model: d } => {
                down_sum(ids, coef, |id| &bytemuck::cast_slice::<u8, f16>(row(id))[2 * d..], out)
            }
            RecordRows::Blocks { shape } => {
                down_sum_blocks(shape.down, ids, coef, |id| &row(id)[2 * shape.gate_up_row_bytes()..], out)
            }
        }
    }
}

/// [`RecordRows::coefficients`]: one token's input, ready for either layout.
pub enum Coefficients<'x> {
    F16 { d_model: usize, xn: &'x [f32] },
    Blocks { shape: RecordShape, x: QActivation },
}

impl Coefficients<'_> {
    /// `silu(gate . xn)(up . xn)` of one record payload.
    #[inline]
    pub fn of(&self, row: &[u8]) -> f32 {
        match self {
            Coefficients::F16 { d_model: d, xn } => {
                let r: &[f16] = bytemuck::cast_slice(row);
                let (g, u) = dot2_f16_f32(&r[..*d], &r[*d..2 * d], xn);
                silu(g) * u
            }
            Coefficients::Blocks { shape, x } => {
                let (gb, d) = (shape.gate_up_row_bytes(), shape.d_model);
                silu(dot_row(shape.gate_up, &row[..gb], d, x)) * dot_row(shape.gate_up, &row[gb..2 * gb], d, x)
            }
        }
    }
}
