//! Warm slots: the slot rows of chosen neurons, built from a layer's MLP as a prompt batch
//! staged it, byte-equal to what the reader would land from `records.bin` for them (the
//! records' own layout: `select::SlotRow`, `ops::record_sum::RecordRows`).
//!
//! Gate and up rows are the staged matrices' rows as stored (the GGUF's blocks, or f16). A down
//! row is column j of W_down `[d, n_ff]`: f16 as stored (version 1), or requantized along
//! d_model to the records' down type from the exact values, block by block, as `prep pack`
//! writes it (version 2). Down is read a block of d_model rows at a time, so what this holds
//! beyond the rows it returns is one block's rows (`block x n_ff` f32).

use crate::error::{Result, RuntimeError};
use crate::model::DenseMlp;
use crate::ops::record_sum::RecordRows;
use crate::select::SlotRow;
use crate::slots::Load;
use crate::tensor::Matrix;
use rayon::prelude::*;

/// Writes each load's neuron's slot row (`SlotRow::bytes_in` bytes) from `mlp` into its slot
/// of `slots` (the layer's slot buffer).
pub fn write_slot_rows(
    mlp: &DenseMlp,
    slot_row: SlotRow,
    records: RecordRows,
    loads: &[Load],
    slots: &mut [u8],
) -> Result<()> {
    let (d, n_ff) = (mlp.w_down.rows(), mlp.w_down.cols());
    let shape = match records {
        RecordRows::F16 { .. } => None,
        RecordRows::Blocks { shape } => Some(shape),
    };
    let rb = slot_row.bytes_in(d, shape);
    let neurons: Vec<u32> = loads.iter().map(|l| l.neuron).collect();
    let slot_of = |k: usize| loads[k].slot as usize;
    let mismatch = |what: &str| {
        RuntimeError::Internal(format!("warm slots: the staged {what} is not stored as the records hold it"))
    };
    // gate and up rows
    let down_at = if slot_row == SlotRow::GateUpDown {
        let gu = match (shape, &mlp.w_gate, &mlp.w_up) {
            (Some(sh), Matrix::Quant(g), Matrix::Quant(u)) if g.ty == sh.gate_up && u.ty == sh.gate_up => {
                for (k, &j) in neurons.iter().enumerate() {
                    let row = &mut slots[slot_of(k) * rb..(slot_of(k) + 1) * rb];
                    let gb = g.row_bytes;
                    row[..gb].copy_from_slice(&g.row(j as usize));
                    row[gb..2 * gb].copy_from_slice(&u.row(j as usize));
                }
                2 * g.row_bytes
            }
            (None, Matrix::F16(g), Matrix::F16(u)) => {
                for (k, &j) in neurons.iter().enumerate() {
                    let row = &mut slots[slot_of(k) * rb..(slot_of(k) + 1) * rb];
                    row[..2 * d].copy_from_slice(bytemuck::cast_slice(g.row(j as usize)));
                    row[2 * d..4 * d].copy_from_slice(bytemuck::cast_slice(u.row(j as usize)));
                }
                4 * d
            }
            _ => return Err(mismatch("gate and up")),
        };
        debug_assert!(gu <= rb);
        gu
    } else {
        0
    };
    // down columns, a block of rows at a time
    let block = shape.map_or(32, |s| s.down.block_elements());
    if !d.is_multiple_of(block) {
        return Err(mismatch("down"));
    }
    let mut rows = vec![0f32; block * n_ff]; // [block, n_ff]
    let mut col = vec![0f32; block];
    for i0 in (0..d).step_by(block) {
        for (r, dst) in rows.chunks_exact_mut(n_ff).enumerate() {
            match &mlp.w_down {
                Matrix::Quant(q) => formats::ggml_quants::dequantize(q.ty, &q.row(i0 + r), dst),
                Matrix::F16(f) => f.row(i0 + r).iter().zip(dst.iter_mut()).for_each(|(v, o)| *o = v.to_f32()),
            }
        }
        match shape {
            Some(sh) => {
                // the requantization is most of the work (the reference quantizer's search for
                // each sub-block's scale): the columns are quantized on every thread, each the
                // same bytes as alone, then written in order
                let bb = sh.down.block_bytes();
                let blocks: Vec<u8> = neurons
                    .par_iter()
                    .map(|&j| {
                        let col: Vec<f32> = (0..block).map(|r| rows[r * n_ff + j as usize]).collect();
                        formats::ggml_quants::quantize(sh.down, &col).filter(|b| b.len() == bb)
                    })
                    .collect::<Option<Vec<Vec<u8>>>>()
                    .ok_or_else(|| mismatch("down"))?
                    .concat();
                let at = i0 / block * bb;
                for (k, b) in blocks.chunks_exact(bb).enumerate() {
                    slots[slot_of(k) * rb + down_at + at..][..bb].copy_from_slice(b);
                }
            }
            None => {
                for (k, &j) in neurons.iter().enumerate() {
                    col.iter_mut().enumerate().for_each(|(r, c)| *c = rows[r * n_ff + j as usize]);
                    let row = &mut slots[slot_of(k) * rb + down_at..(slot_of(k) + 1) * rb];
                    for (r, &v) in col.iter().enumerate() {
                        let at = 2 * (i0 + r);
                        row[at..at + 2].copy_from_slice(&half::f16::from_f32(v).to_le_bytes());
                    }
                }
            }
        }
    }
    Ok(())
}
