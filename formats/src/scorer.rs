//! `scorer.safetensors`: a 4-bit copy of the gate and up rows of the sparse layers, small enough
//! to stay resident, so that each sparse layer can score all of its neurons from its own input
//! and stream only the down-projection rows of the ones it keeps.
//!
//! Tensors (layers `first_layer..first_layer + n_layers`, `n_ff` neurons, width `d_model`):
//! ```text
//! gate_up_q4     U8  [n_layers, n_ff, 2, d_model / 2]   per neuron its gate row then its up row,
//!                                                      Q4_0-style blocks of 32 weights: byte k of a
//!                                                      block holds weight k (low nibble) and weight
//!                                                      k + 16 (high nibble), each stored as q + 8
//! gate_up_scale  F16 [n_layers, n_ff, 2, d_model / 32]  per block its scale: w = (q - 8) * scale
//! down_norm      F32 [n_layers, n_ff]                   ||W_down[:, j]|| (the f16 column's L2 norm)
//! down_crc32c    U32 [n_layers, n_ff]                   CRC32C of the f16 little-endian bytes of
//!                                                      W_down[:, j], the downT row of record j:
//!                                                      checks a read of that row alone
//! ```
//! Metadata: `first_layer`, `block` (= 32), `quant` (= "q4_0").
//!
//! A native preparation (the model's gate/up already in 4-bit GGML blocks) scores from those
//! blocks themselves, exactly: `gate_up_blocks` U8 `[n_layers, n_ff, 2, row_bytes]` (each
//! neuron's gate row then up row, byte-equal to the GGUF's), no scales, `quant` = the GGML type
//! ("Q4_K"), and `down_crc32c` is that of the record's Q8_0 down row (version-2 records).

use crate::error::{FormatError, Result};
use crate::ggml_quants::GgmlType;
use crate::safetensors_io::{write_raw_safetensors, MappedSafetensors, RawTensor};
use half::f16;
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Weights per quantization block.
pub const Q4_BLOCK: usize = 32;
/// Bytes of one packed block.
pub const Q4_BLOCK_BYTES: usize = Q4_BLOCK / 2;

/// Quantizes one row (`len` a multiple of [`Q4_BLOCK`]) into `packed` (`len / 2` bytes) and
/// `scales` (`len / 32`), like GGML's Q4_0: per block the weight of largest magnitude maps to
/// -8, the scale is its value / -8, the others round to the nearest of the 16 levels.
pub fn quantize_q4_row(row: &[f32], packed: &mut [u8], scales: &mut [f16]) {
    assert!(
        row.len().is_multiple_of(Q4_BLOCK) && packed.len() == row.len() / 2 && scales.len() == row.len() / Q4_BLOCK
    );
    for ((block, out), scale) in
        row.chunks_exact(Q4_BLOCK).zip(packed.chunks_exact_mut(Q4_BLOCK_BYTES)).zip(scales.iter_mut())
    {
        let max = block.iter().copied().fold(0f32, |m, v| if v.abs() > m.abs() { v } else { m });
        let d = max / -8.0;
        let inv = if d != 0.0 { 1.0 / d } else { 0.0 };
        *scale = f16::from_f32(d);
        let q = |v: f32| ((v * inv + 8.5) as i32).clamp(0, 15) as u8;
        for k in 0..Q4_BLOCK_BYTES {
            out[k] = q(block[k]) | (q(block[k + Q4_BLOCK_BYTES]) << 4);
        }
    }
}

/// The weights of one quantized row (the inverse of [`quantize_q4_row`], up to rounding).
pub fn dequantize_q4_row(packed: &[u8], scales: &[f16]) -> Vec<f32> {
    let mut out = Vec::with_capacity(packed.len() * 2);
    for (block, s) in packed.chunks_exact(Q4_BLOCK_BYTES).zip(scales) {
        let d = s.to_f32();
        let mut vals = [0f32; Q4_BLOCK];
        for k in 0..Q4_BLOCK_BYTES {
            vals[k] = ((block[k] & 0x0F) as f32 - 8.0) * d;
            vals[k + Q4_BLOCK_BYTES] = ((block[k] >> 4) as f32 - 8.0) * d;
        }
        out.extend_from_slice(&vals);
    }
    out
}

/// CRC32C of a row of f16 values as stored in a record (little-endian).
pub fn f16_row_crc32c(row: &[f16]) -> u32 {
    let bytes: Vec<u8> = row.iter().flat_map(|v| v.to_le_bytes()).collect();
    crc32c::crc32c(&bytes)
}

/// Checks a downT row read alone from `records.bin` (its f16 bytes, at `file_offset` of
/// `path`) against the CRC32C the scorer file holds for it.
pub fn check_down_row(
    bytes: &[u8],
    expected_crc32c: u32,
    path: &Path,
    file_offset: u64,
    layer: usize,
    neuron: u32,
) -> Result<()> {
    let crc = crc32c::crc32c(bytes);
    if crc != expected_crc32c {
        return Err(FormatError::Corrupt {
            path: path.to_path_buf(),
            offset: file_offset,
            what: format!("downT row of layer {layer}, neuron {neuron}: CRC32C mismatch (computed {crc:08x}, the scorer file says {expected_crc32c:08x})"),
        });
    }
    Ok(())
}

#[derive(Debug, Clone, PartialEq)]
pub struct GateUpScorerFile {
    pub path: PathBuf,
    pub first_layer: usize,
    pub n_layers: usize,
    pub n_ff: usize,
    pub d_model: usize,
    /// `[n_layers, n_ff, 2, d_model / 2]`, or with `blocks` `[n_layers, n_ff, 2, row_bytes]`.
    pub q4: Vec<u8>,
    /// The GGML type of `q4`'s rows (a native preparation; `scales` is then empty); None: the
    /// Q4_0-style copy.
    pub blocks: Option<GgmlType>,
    /// `[n_layers, n_ff, 2, d_model / 32]`.
    pub scales: Vec<f16>,
    /// `[n_layers, n_ff]`.
    pub down_norm: Vec<f32>,
    /// `[n_layers, n_ff]`.
    pub down_crc32c: Vec<u32>,
}

impl GateUpScorerFile {
    /// Bytes the scorer holds in memory.
    pub fn n_bytes(&self) -> usize {
        self.q4.len() + self.scales.len() * 2 + self.down_norm.len() * 4 + self.down_crc32c.len() * 4
    }

    /// Bytes of one gate or up row.
    pub fn row_bytes(&self) -> usize {
        match self.blocks {
            Some(t) => self.d_model / t.block_elements() * t.block_bytes(),
            None => self.d_model / 2,
        }
    }

    /// Packed rows of sparse layer `layer` (absolute index): `[n_ff, 2, row_bytes]`.
    pub fn layer_q4(&self, layer: usize) -> &[u8] {
        let n = self.n_ff * 2 * self.row_bytes();
        let i = layer - self.first_layer;
        &self.q4[i * n..(i + 1) * n]
    }

    pub fn layer_scales(&self, layer: usize) -> &[f16] {
        let n = self.n_ff * 2 * self.d_model / Q4_BLOCK;
        let i = layer - self.first_layer;
        &self.scales[i * n..(i + 1) * n]
    }

    pub fn layer_down_norm(&self, layer: usize) -> &[f32] {
        let i = layer - self.first_layer;
        &self.down_norm[i * self.n_ff..(i + 1) * self.n_ff]
    }

    pub fn layer_down_crc32c(&self, layer: usize) -> &[u32] {
        let i = layer - self.first_layer;
        &self.down_crc32c[i * self.n_ff..(i + 1) * self.n_ff]
    }

    /// Reads the file and checks it covers layers `first_layer..first_layer + n_layers` of a
    /// model of width `d_model` and `n_ff` neurons per layer, with finite scales and norms.
    pub fn load(path: &Path, first_layer: usize, n_layers: usize, n_ff: usize, d_model: usize) -> Result<Self> {
        let (f, blocks) = open_scorer(path, first_layer, d_model)?;
        // the gate/up rows first (their shape names a wrong n_ff or width), then the down columns
        let (q4, scales) = match blocks {
            Some(t) => (
                f.checked_bytes(
                    "gate_up_blocks",
                    Dtype::U8,
                    &[n_layers, n_ff, 2, d_model / t.block_elements() * t.block_bytes()],
                )?
                .to_vec(),
                Vec::new(),
            ),
            None => {
                let q4 = f.checked_bytes("gate_up_q4", Dtype::U8, &[n_layers, n_ff, 2, d_model / 2])?.to_vec();
                let scale_bytes =
                    f.checked_bytes("gate_up_scale", Dtype::F16, &[n_layers, n_ff, 2, d_model / Q4_BLOCK])?;
                (q4, scale_bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect::<Vec<f16>>())
            }
        };
        let down_norm = read_down_norm(&f, path, first_layer, n_layers, n_ff)?;
        let down_crc32c: Vec<u32> = f
            .checked_bytes("down_crc32c", Dtype::U32, &[n_layers, n_ff])?
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let start_of = |name: &str| f.tensors[name].byte_range.start as u64;
        if let Some(i) = scales.iter().position(|s| !s.is_finite()) {
            let per_layer = n_ff * 2 * d_model / Q4_BLOCK;
            return Err(FormatError::Corrupt {
                path: path.to_path_buf(),
                offset: start_of("gate_up_scale") + 2 * i as u64,
                what: format!(
                    "scale of layer {} neuron {} is {}",
                    first_layer + i / per_layer,
                    i % per_layer / (2 * d_model / Q4_BLOCK),
                    scales[i]
                ),
            });
        }
        Ok(GateUpScorerFile {
            path: path.to_path_buf(),
            first_layer,
            n_layers,
            n_ff,
            d_model,
            q4,
            blocks,
            scales,
            down_norm,
            down_crc32c,
        })
    }

    pub fn save(&self) -> Result<()> {
        let (l, f, d) = (self.n_layers, self.n_ff, self.d_model);
        let mut tensors = match self.blocks {
            None => vec![
                RawTensor {
                    name: "gate_up_q4".into(),
                    dtype: Dtype::U8,
                    shape: vec![l, f, 2, d / 2],
                    bytes: self.q4.clone(),
                },
                RawTensor {
                    name: "gate_up_scale".into(),
                    dtype: Dtype::F16,
                    shape: vec![l, f, 2, d / Q4_BLOCK],
                    bytes: self.scales.iter().flat_map(|v| v.to_le_bytes()).collect(),
                },
            ],
            Some(_) => vec![RawTensor {
                name: "gate_up_blocks".into(),
                dtype: Dtype::U8,
                shape: vec![l, f, 2, self.row_bytes()],
                bytes: self.q4.clone(),
            }],
        };
        tensors.extend([
            RawTensor {
                name: "down_norm".into(),
                dtype: Dtype::F32,
                shape: vec![l, f],
                bytes: self.down_norm.iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
            RawTensor {
                name: "down_crc32c".into(),
                dtype: Dtype::U32,
                shape: vec![l, f],
                bytes: self.down_crc32c.iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
        ]);
        let meta = HashMap::from([
            ("first_layer".to_string(), self.first_layer.to_string()),
            ("block".to_string(), Q4_BLOCK.to_string()),
            ("quant".to_string(), self.blocks.map_or("q4_0", |t| t.name()).to_string()),
        ]);
        write_raw_safetensors(&self.path, &tensors, Some(meta))
    }
}

/// Opens a scorer file and checks what both readers need: the width is whole Q4 blocks, the
/// file's first layer is the manifest's, and its rows' type is computed here.
fn open_scorer(path: &Path, first_layer: usize, d_model: usize) -> Result<(MappedSafetensors, Option<GgmlType>)> {
    if !d_model.is_multiple_of(Q4_BLOCK) {
        return Err(FormatError::invalid(path, format!("width {d_model} is not a multiple of {Q4_BLOCK}")));
    }
    let f = MappedSafetensors::open(path)?;
    let meta_first = f.metadata.as_ref().and_then(|m| m.get("first_layer")).and_then(|v| v.parse::<usize>().ok());
    if meta_first != Some(first_layer) {
        return Err(FormatError::invalid(
            path,
            format!("covers layers from {meta_first:?}, the manifest's sparse layers start at {first_layer}"),
        ));
    }
    let quant = f.metadata.as_ref().and_then(|m| m.get("quant")).cloned().unwrap_or_default();
    let blocks = match quant.as_str() {
        "q4_0" => None,
        name => Some(
            GgmlType::from_name(name)
                .filter(|t| t.is_block_quantized() && t.is_supported() && d_model.is_multiple_of(t.block_elements()))
                .ok_or_else(|| {
                    FormatError::invalid(
                        path,
                        format!(
                            "gate/up rows of '{name}': expected q4_0 or a GGML block type that divides width {d_model}"
                        ),
                    )
                })?,
        ),
    };
    Ok((f, blocks))
}

/// Bytes per layer a [`GateUpScorerFile`] holds, from its header alone (shapes checked,
/// nothing copied): what `--strategy auto` sizes its plans from before it loads the file.
pub fn held_bytes_per_layer(
    path: &Path,
    first_layer: usize,
    n_layers: usize,
    n_ff: usize,
    d_model: usize,
) -> Result<usize> {
    let (f, blocks) = open_scorer(path, first_layer, d_model)?;
    let (row, scale_row) = match blocks {
        Some(t) => {
            let rb = d_model / t.block_elements() * t.block_bytes();
            f.checked_bytes("gate_up_blocks", Dtype::U8, &[n_layers, n_ff, 2, rb])?;
            (rb, 0)
        }
        None => {
            f.checked_bytes("gate_up_q4", Dtype::U8, &[n_layers, n_ff, 2, d_model / 2])?;
            f.checked_bytes("gate_up_scale", Dtype::F16, &[n_layers, n_ff, 2, d_model / Q4_BLOCK])?;
            (d_model / 2, d_model / Q4_BLOCK * 2)
        }
    };
    f.checked_bytes("down_norm", Dtype::F32, &[n_layers, n_ff])?;
    f.checked_bytes("down_crc32c", Dtype::U32, &[n_layers, n_ff])?;
    // gate and up rows (and scales), a down norm and a checksum per neuron
    Ok(n_ff * (2 * (row + scale_row) + 8))
}

/// The `down_norm` tensor `[n_layers, n_ff]`, each norm checked finite and >= 0.
fn read_down_norm(
    f: &MappedSafetensors,
    path: &Path,
    first_layer: usize,
    n_layers: usize,
    n_ff: usize,
) -> Result<Vec<f32>> {
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
    Ok(down_norm)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_round_trip_error_is_within_a_step() {
        let row: Vec<f32> = (0..64).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.013).collect();
        let mut packed = vec![0u8; 32];
        let mut scales = vec![f16::ZERO; 2];
        quantize_q4_row(&row, &mut packed, &mut scales);
        let back = dequantize_q4_row(&packed, &scales);
        for (b, (block, s)) in back.chunks(32).zip(row.chunks(32).zip(&scales)) {
            let step = s.to_f32().abs();
            // half a step, except a value of the opposite sign to the largest one beyond +7 steps
            // (clamped there, as in Q4_0)
            for (x, y) in b.iter().zip(block) {
                let bound = if (y / step).abs() > 7.0 { step } else { step * 0.5 };
                assert!((x - y).abs() <= bound * 1.01, "{x} vs {y} (step {step})");
            }
            // the first value of largest magnitude is exact (level -8) up to the f16 scale
            let i = (0..32).fold(0, |m, k| if block[k].abs() > block[m].abs() { k } else { m });
            assert!((b[i] - block[i]).abs() < 1e-3 * block[i].abs());
        }
        // an all-zero block stays zero
        let mut packed = vec![0u8; 16];
        let mut scales = vec![f16::ONE; 1];
        quantize_q4_row(&[0.0; 32], &mut packed, &mut scales);
        assert!(dequantize_q4_row(&packed, &scales).iter().all(|&v| v == 0.0));
    }

    #[test]
    fn file_round_trip_and_checks() {
        let dir = std::env::temp_dir().join(format!("scorer-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("scorer.safetensors");
        let (l, f, d) = (2, 3, 64);
        let s = GateUpScorerFile {
            path: path.clone(),
            first_layer: 1,
            n_layers: l,
            n_ff: f,
            d_model: d,
            q4: (0..l * f * d).map(|i| i as u8).collect(),
            blocks: None,
            scales: (0..l * f * 2 * d / 32).map(|i| f16::from_f32(i as f32 * 0.5)).collect(),
            down_norm: vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            down_crc32c: vec![9, 8, 7, 6, 5, 4],
        };
        s.save().unwrap();
        let back = GateUpScorerFile::load(&path, 1, l, f, d).unwrap();
        assert_eq!(back, s);
        assert_eq!(back.layer_down_norm(2), &[4.0, 5.0, 6.0]);
        assert_eq!(back.layer_q4(2).len(), f * d);
        let e = GateUpScorerFile::load(&path, 0, l, f, d).unwrap_err().to_string();
        assert!(e.contains("scorer.safetensors") && e.contains("start at 0"), "{e}");
        let e = GateUpScorerFile::load(&path, 1, l, 4, d).unwrap_err().to_string();
        assert!(e.contains("gate_up_q4") && e.contains("[2, 4, 2, 32]"), "{e}");
        GateUpScorerFile { down_norm: vec![1.0, 2.0, 3.0, f32::NAN, 5.0, 6.0], ..s }.save().unwrap();
        let e = GateUpScorerFile::load(&path, 1, l, f, d).unwrap_err().to_string();
        assert!(e.contains("layer 2 neuron 0") && e.contains("byte offset"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
