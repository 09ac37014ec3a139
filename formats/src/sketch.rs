//! `sketch.safetensors`: the gate and up rows of the sparse layers at a few bits per weight,
//! resident, so that `--strategy sketch` ranks every neuron of a layer by
//! `|silu(g~ . x)(u~ . x)| x ||W_down[:, j]||` before any of its record is read (the gate rows
//! alone, at 4 bits and the same bytes, rank far worse: they miss what `u` does).
//!
//! A row of `d` weights (`d` a multiple of 32) is blocks of 32 weights, each with one f16 scale
//! `s`: weight = `(q - c) s`, `q` in `0..2^bits`, `c = (2^bits - 1) / 2` (symmetric levels, no
//! zero point). The bits lie in groups of `8 / bits` blocks, 32 bytes a group: bits
//! `[bits j, bits j + bits)` of byte `i` hold weight `i` of the group's block `j`, so shifting a
//! group's bytes by `bits j` and masking gives block `j`'s 32 weights in order. A last, partial
//! group still takes 32 bytes, its unused bits zero.
//!
//! Tensors (layers `first_layer..first_layer + n_layers`, `n_ff` neurons, width `d_model`):
//! ```text
//! gate_up_bits   U8  [n_layers, n_ff, 2, sketch_row_bytes(d_model, bits)]  gate row, then up row
//! gate_up_scale  F16 [n_layers, n_ff, 2, d_model / 32]
//! down_norm      F32 [n_layers, n_ff]     ||W_down[:, j]||
//! ```
//! Metadata: `first_layer`, `bits` (1, 2 or 4), `block` (= 32).

use crate::error::{FormatError, Result};
use crate::safetensors_io::{write_raw_safetensors, MappedSafetensors, RawTensor};
use half::f16;
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Weights per block (one scale).
pub const SKETCH_BLOCK: usize = 32;
/// Bytes of one group of `8 / bits` blocks.
pub const SKETCH_GROUP_BYTES: usize = 32;
/// The widths a sketch may have.
pub const SKETCH_BITS: [u32; 3] = [1, 2, 4];

/// Bytes of one row of `d` weights at `bits` per weight (the scales apart).
pub fn sketch_row_bytes(d: usize, bits: u32) -> usize {
    (d / SKETCH_BLOCK).div_ceil(8 / bits as usize) * SKETCH_GROUP_BYTES
}

/// Quantizes `row` (`d`, a multiple of 32) into `packed` ([`sketch_row_bytes`]) and `scales`
/// (`d / 32`): per block, of 29 candidate scales (`amax / c x 0.30..=1.0`), each refitted by
/// least squares to the levels it rounds to, the one of least squared error, each weight's
/// error counted `importance[i]` times (the mean square of the input it multiplies, as
/// llama.cpp's importance matrix; empty: uniform).
pub fn quantize_sketch_row(row: &[f32], importance: &[f32], bits: u32, packed: &mut [u8], scales: &mut [f16]) {
    let d = row.len();
    assert!(SKETCH_BITS.contains(&bits) && d.is_multiple_of(SKETCH_BLOCK));
    assert!(importance.is_empty() || importance.len() == d);
    assert!(packed.len() == sketch_row_bytes(d, bits) && scales.len() == d / SKETCH_BLOCK);
    let top = ((1u32 << bits) - 1) as f32;
    let c = top / 2.0;
    let per_group = 8 / bits as usize;
    packed.fill(0);
    for (b, (w, s_out)) in row.chunks_exact(SKETCH_BLOCK).zip(scales.iter_mut()).enumerate() {
        let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        // (a floor keeps a block whose inputs were never seen from a zero denominator)
        let mut imp = [1f32; SKETCH_BLOCK];
        if !importance.is_empty() {
            let part = &importance[b * SKETCH_BLOCK..(b + 1) * SKETCH_BLOCK];
            let floor = 1e-3 * part.iter().sum::<f32>() / SKETCH_BLOCK as f32 + f32::MIN_POSITIVE;
            imp.iter_mut().zip(part).for_each(|(o, &v)| *o = v.max(0.0) + floor);
        }
        let mut q = [0u8; SKETCH_BLOCK];
        let mut best_s = 0f32;
        if amax > 0.0 {
            let mut best_err = f32::INFINITY;
            let mut qt = [0u8; SKETCH_BLOCK];
            for step in 0..29 {
                let inv = c / (amax * (0.30 + 0.025 * step as f32));
                let (mut num, mut den) = (0f32, 0f32);
                for ((o, &v), &m) in qt.iter_mut().zip(w).zip(&imp) {
                    *o = (v * inv + c).round().clamp(0.0, top) as u8;
                    let l = *o as f32 - c;
                    num += m * v * l;
                    den += m * l * l;
                }
                let s = num / den; // den > 0: every level is at least 1/2 from c
                let err: f32 =
                    qt.iter().zip(w).zip(&imp).map(|((&o, &v), &m)| m * (v - (o as f32 - c) * s).powi(2)).sum();
                if err < best_err {
                    (best_err, best_s, q) = (err, s, qt);
                }
            }
        }
        *s_out = f16::from_f32(best_s);
        let (g, j) = (b / per_group, b % per_group);
        for (byte, &v) in packed[g * SKETCH_GROUP_BYTES..(g + 1) * SKETCH_GROUP_BYTES].iter_mut().zip(&q) {
            *byte |= v << (bits as usize * j);
        }
    }
}

/// The weights of one sketch row (the inverse of [`quantize_sketch_row`], up to rounding).
pub fn dequantize_sketch_row(packed: &[u8], scales: &[f16], bits: u32, out: &mut [f32]) {
    let mask = (1u8 << bits) - 1;
    let c = mask as f32 / 2.0;
    let per_group = 8 / bits as usize;
    for (b, (o, s)) in out.chunks_exact_mut(SKETCH_BLOCK).zip(scales).enumerate() {
        let (g, j) = (b / per_group, b % per_group);
        for (v, &byte) in o.iter_mut().zip(&packed[g * SKETCH_GROUP_BYTES..(g + 1) * SKETCH_GROUP_BYTES]) {
            *v = (((byte >> (bits as usize * j)) & mask) as f32 - c) * s.to_f32();
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SketchFile {
    pub path: PathBuf,
    pub first_layer: usize,
    pub n_layers: usize,
    pub n_ff: usize,
    pub d_model: usize,
    pub bits: u32,
    /// `[n_layers, n_ff, 2, row_bytes]`.
    pub packed: Vec<u8>,
    /// `[n_layers, n_ff, 2, d_model / 32]`.
    pub scales: Vec<f16>,
    /// `[n_layers, n_ff]`.
    pub down_norm: Vec<f32>,
}

impl SketchFile {
    /// Bytes of one gate or up row's bits.
    pub fn row_bytes(&self) -> usize {
        sketch_row_bytes(self.d_model, self.bits)
    }

    /// Bytes held for one layer (bits, scales, norms).
    pub fn layer_bytes(&self) -> usize {
        layer_bytes(self.n_ff, self.d_model, self.bits)
    }

    /// Reads the file and checks it covers layers `first_layer..first_layer + n_layers` of a
    /// model of width `d_model` and `n_ff` neurons per layer, with finite scales and norms.
    pub fn load(path: &Path, first_layer: usize, n_layers: usize, n_ff: usize, d_model: usize) -> Result<Self> {
        let (f, bits) = open_sketch(path, first_layer, d_model)?;
        let packed =
            f.checked_bytes("gate_up_bits", Dtype::U8, &[n_layers, n_ff, 2, sketch_row_bytes(d_model, bits)])?.to_vec();
        let sb = d_model / SKETCH_BLOCK;
        let scales: Vec<f16> = f
            .checked_bytes("gate_up_scale", Dtype::F16, &[n_layers, n_ff, 2, sb])?
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]))
            .collect();
        if let Some(i) = scales.iter().position(|s| !s.is_finite()) {
            return Err(FormatError::Corrupt {
                path: path.to_path_buf(),
                offset: f.tensors["gate_up_scale"].byte_range.start as u64 + 2 * i as u64,
                what: format!(
                    "scale of layer {} neuron {} is {}",
                    first_layer + i / (n_ff * 2 * sb),
                    i % (n_ff * 2 * sb) / (2 * sb),
                    scales[i]
                ),
            });
        }
        let down_norm: Vec<f32> = f
            .checked_bytes("down_norm", Dtype::F32, &[n_layers, n_ff])?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        if let Some(i) = down_norm.iter().position(|v| !v.is_finite() || *v < 0.0) {
            return Err(FormatError::Corrupt {
                path: path.to_path_buf(),
                offset: f.tensors["down_norm"].byte_range.start as u64 + 4 * i as u64,
                what: format!(
                    "down norm of layer {} neuron {} is {} (expected finite, >= 0)",
                    first_layer + i / n_ff,
                    i % n_ff,
                    down_norm[i]
                ),
            });
        }
        Ok(SketchFile {
            path: path.to_path_buf(),
            first_layer,
            n_layers,
            n_ff,
            d_model,
            bits,
            packed,
            scales,
            down_norm,
        })
    }

    pub fn save(&self) -> Result<()> {
        let (l, f, d) = (self.n_layers, self.n_ff, self.d_model);
        let tensors = vec![
            RawTensor {
                name: "gate_up_bits".into(),
                dtype: Dtype::U8,
                shape: vec![l, f, 2, self.row_bytes()],
                bytes: self.packed.clone(),
            },
            RawTensor {
                name: "gate_up_scale".into(),
                dtype: Dtype::F16,
                shape: vec![l, f, 2, d / SKETCH_BLOCK],
                bytes: self.scales.iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
            RawTensor {
                name: "down_norm".into(),
                dtype: Dtype::F32,
                shape: vec![l, f],
                bytes: self.down_norm.iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
        ];
        let meta = HashMap::from([
            ("first_layer".to_string(), self.first_layer.to_string()),
            ("bits".to_string(), self.bits.to_string()),
            ("block".to_string(), SKETCH_BLOCK.to_string()),
        ]);
        write_raw_safetensors(&self.path, &tensors, Some(meta))
    }
}

/// Bytes a sketch of `bits` holds for one layer.
pub fn layer_bytes(n_ff: usize, d_model: usize, bits: u32) -> usize {
    n_ff * (2 * (sketch_row_bytes(d_model, bits) + 2 * (d_model / SKETCH_BLOCK)) + 4)
}

/// Bytes per layer the sketch at `path` holds, from its header alone (shapes checked, nothing
/// copied): what `--strategy auto` sizes its plan from before loading it.
pub fn held_bytes_per_layer(
    path: &Path,
    first_layer: usize,
    n_layers: usize,
    n_ff: usize,
    d_model: usize,
) -> Result<usize> {
    let (f, bits) = open_sketch(path, first_layer, d_model)?;
    f.checked_bytes("gate_up_bits", Dtype::U8, &[n_layers, n_ff, 2, sketch_row_bytes(d_model, bits)])?;
    f.checked_bytes("gate_up_scale", Dtype::F16, &[n_layers, n_ff, 2, d_model / SKETCH_BLOCK])?;
    f.checked_bytes("down_norm", Dtype::F32, &[n_layers, n_ff])?;
    Ok(layer_bytes(n_ff, d_model, bits))
}

/// Opens a sketch and checks its width, first layer and bits.
fn open_sketch(path: &Path, first_layer: usize, d_model: usize) -> Result<(MappedSafetensors, u32)> {
    if !d_model.is_multiple_of(SKETCH_BLOCK) {
        return Err(FormatError::invalid(path, format!("width {d_model} is not a multiple of {SKETCH_BLOCK}")));
    }
    let f = MappedSafetensors::open(path)?;
    let meta = |k: &str| f.metadata.as_ref().and_then(|m| m.get(k)).cloned();
    let meta_first = meta("first_layer").and_then(|v| v.parse::<usize>().ok());
    if meta_first != Some(first_layer) {
        return Err(FormatError::invalid(
            path,
            format!("covers layers from {meta_first:?}, the manifest's sparse layers start at {first_layer}"),
        ));
    }
    let bits =
        meta("bits").and_then(|v| v.parse::<u32>().ok()).filter(|b| SKETCH_BITS.contains(b)).ok_or_else(|| {
            FormatError::invalid(path, format!("bits {:?}: expected one of {SKETCH_BITS:?}", meta("bits")))
        })?;
    if meta("block").as_deref() != Some("32") {
        return Err(FormatError::invalid(path, format!("block {:?}: expected 32", meta("block"))));
    }
    Ok((f, bits))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcg(seed: &mut u64) -> f32 {
        *seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        ((*seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    }

    #[test]
    fn round_trip_error_falls_with_bits() {
        let mut seed = 7u64;
        let d = 576; // 18 blocks: a partial last group at every width
        let row: Vec<f32> = (0..d).map(|_| lcg(&mut seed)).collect();
        let mut last = f32::INFINITY;
        for bits in SKETCH_BITS {
            let mut packed = vec![0u8; sketch_row_bytes(d, bits)];
            let mut scales = vec![f16::ZERO; d / SKETCH_BLOCK];
            quantize_sketch_row(&row, &[], bits, &mut packed, &mut scales);
            let mut back = vec![0f32; d];
            dequantize_sketch_row(&packed, &scales, bits, &mut back);
            let err = row.iter().zip(&back).map(|(a, b)| (a - b).powi(2)).sum::<f32>()
                / row.iter().map(|a| a * a).sum::<f32>();
            // uniform weights: 1 bit keeps the sign (relative error 1/4), each further bit
            // quarters it, rounding to the grid's ends aside
            let bound = [0.3, 0.08, 0.01][SKETCH_BITS.iter().position(|&b| b == bits).unwrap()];
            assert!(err < bound && err < last, "{bits} bits: relative error {err}");
            last = err;
        }
        // an all-zero block stays zero
        let mut packed = vec![0u8; 32];
        let mut scales = vec![f16::ONE; 1];
        quantize_sketch_row(&[0.0; 32], &[], 2, &mut packed, &mut scales);
        let mut back = vec![1f32; 32];
        dequantize_sketch_row(&packed, &scales, 2, &mut back);
        assert!(back.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn file_round_trip_and_checks() {
        let dir = std::env::temp_dir().join(format!("sketch-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sketch.safetensors");
        let (l, f, d, bits) = (2, 3, 64, 2);
        let s = SketchFile {
            path: path.clone(),
            first_layer: 1,
            n_layers: l,
            n_ff: f,
            d_model: d,
            bits,
            packed: (0..l * f * 2 * sketch_row_bytes(d, bits)).map(|i| i as u8).collect(),
            scales: (0..l * f * 2 * d / 32).map(|i| f16::from_f32(i as f32 * 0.5)).collect(),
            down_norm: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
        };
        s.save().unwrap();
        assert_eq!(SketchFile::load(&path, 1, l, f, d).unwrap(), s);
        assert_eq!(held_bytes_per_layer(&path, 1, l, f, d).unwrap(), s.layer_bytes());
        let e = SketchFile::load(&path, 0, l, f, d).unwrap_err().to_string();
        assert!(e.contains("sketch.safetensors") && e.contains("start at 0"), "{e}");
        let e = SketchFile::load(&path, 1, l, 4, d).unwrap_err().to_string();
        assert!(e.contains("gate_up_bits") && e.contains("[2, 4, 2, 32]"), "{e}");
        SketchFile { down_norm: vec![1.0, 2.0, 3.0, f32::NAN, 5.0, 6.0], ..s.clone() }.save().unwrap();
        let e = SketchFile::load(&path, 1, l, f, d).unwrap_err().to_string();
        assert!(e.contains("layer 2 neuron 0") && e.contains("byte offset"), "{e}");
        let mut scales = s.scales.clone();
        scales[5] = f16::INFINITY;
        SketchFile { scales, ..s.clone() }.save().unwrap();
        let e = SketchFile::load(&path, 1, l, f, d).unwrap_err().to_string();
        assert!(e.contains("scale of layer 1 neuron 1"), "{e}");
        SketchFile { bits: 3, packed: vec![0; l * f * 2 * sketch_row_bytes(d, 3)], ..s }.save().unwrap();
        let e = SketchFile::load(&path, 1, l, f, d).unwrap_err().to_string();
        assert!(e.contains("bits") && e.contains("[1, 2, 4]"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
