//! `head_q8.safetensors`: the output head (`lm_head`, or the tied embedding) in Q8_0 blocks —
//! per row blocks of 32 int8 weights with one f16 scale (w = q x scale, q in -127..=127; 1.06
//! bytes a weight, half the f16 head). `--head-q8` computes the logits from it, which frees
//! half of the head's memory for MLP row slots (Qwen2.5-Coder-1.5B: 445 -> 236 MiB).
//!
//! Tensors: `head_q8` I8 `[vocab, d_model]`, `head_scale` F16 `[vocab, d_model / 32]`.

use crate::error::{FormatError, Result};
use crate::safetensors_io::{write_raw_safetensors, MappedSafetensors, RawTensor};
use half::f16;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

pub const Q8_BLOCK: usize = 32;

/// Quantizes one row (`len` a multiple of 32) into `q` and `scales` (`len / 32`): per block
/// scale = max |w| / 127, q = round(w / scale).
pub fn quantize_q8_row(row: &[f32], q: &mut [i8], scales: &mut [f16]) {
    assert!(row.len().is_multiple_of(Q8_BLOCK) && q.len() == row.len() && scales.len() == row.len() / Q8_BLOCK);
    for ((block, qb), s) in row.chunks_exact(Q8_BLOCK).zip(q.chunks_exact_mut(Q8_BLOCK)).zip(scales.iter_mut()) {
        let amax = block.iter().fold(0f32, |m, v| m.max(v.abs()));
        let d = f16::from_f32(amax / 127.0);
        *s = d;
        let inv = if d.to_f32() > 0.0 { 1.0 / d.to_f32() } else { 0.0 };
        qb.iter_mut().zip(block).for_each(|(o, v)| *o = (v * inv).round().clamp(-127.0, 127.0) as i8);
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Q8Head {
    pub path: PathBuf,
    pub rows: usize,
    pub cols: usize,
    /// `[rows, cols]`.
    pub q: Vec<i8>,
    /// `[rows, cols / 32]`.
    pub scales: Vec<f16>,
}

impl Q8Head {
    pub fn n_bytes(&self) -> usize {
        self.q.len() + self.scales.len() * 2
    }

    /// Bytes of a `[rows, cols]` head in this layout.
    pub fn bytes_for(rows: usize, cols: usize) -> u64 {
        (rows * cols + rows * cols / Q8_BLOCK * 2) as u64
    }

    pub fn load(path: &Path, rows: usize, cols: usize) -> Result<Self> {
        let f = MappedSafetensors::open(path)?;
        let q: Vec<i8> = f.checked_bytes("head_q8", Dtype::I8, &[rows, cols])?.iter().map(|&b| b as i8).collect();
        let scales: Vec<f16> = f
            .checked_bytes("head_scale", Dtype::F16, &[rows, cols / Q8_BLOCK])?
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]))
            .collect();
        if let Some(i) = scales.iter().position(|s| !s.is_finite()) {
            let offset = f.tensors["head_scale"].byte_range.start as u64 + 2 * i as u64;
            return Err(FormatError::Corrupt {
                path: path.to_path_buf(),
                offset,
                what: format!("scale of row {} is {}", i / (cols / Q8_BLOCK), scales[i]),
            });
        }
        Ok(Q8Head { path: path.to_path_buf(), rows, cols, q, scales })
    }

    pub fn save(&self) -> Result<()> {
        let t = [
            RawTensor {
                name: "head_q8".into(),
                dtype: Dtype::I8,
                shape: vec![self.rows, self.cols],
                bytes: self.q.iter().map(|&v| v as u8).collect(),
            },
            RawTensor {
                name: "head_scale".into(),
                dtype: Dtype::F16,
                shape: vec![self.rows, self.cols / Q8_BLOCK],
                bytes: self.scales.iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
        ];
        write_raw_safetensors(&self.path, &t, None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_within_half_a_step() {
        let row: Vec<f32> = (0..64).map(|i| ((i * 53 % 41) as f32 - 20.0) * 0.01).collect();
        let mut q = vec![0i8; 64];
        let mut s = vec![f16::ZERO; 2];
        quantize_q8_row(&row, &mut q, &mut s);
        for (k, (&w, &qi)) in row.iter().zip(&q).enumerate() {
            let d = s[k / 32].to_f32();
            assert!((qi as f32 * d - w).abs() <= 0.5 * d + 1e-6, "{w} vs {}", qi as f32 * d);
        }
        let dir = std::env::temp_dir().join(format!("headq8-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let h = Q8Head { path: dir.join("head_q8.safetensors"), rows: 2, cols: 32, q: q.clone(), scales: s.clone() };
        h.save().unwrap();
        assert_eq!(Q8Head::load(&h.path, 2, 32).unwrap(), h);
        let e = Q8Head::load(&h.path, 2, 64).unwrap_err().to_string();
        assert!(e.contains("head_q8.safetensors") && e.contains("[2, 64]"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
