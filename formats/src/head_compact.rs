//! `head_compact.safetensors`: the output head (`lm_head`, or the tied embedding) in 4-bit GGML
//! blocks: Q4_K (4.5 bits a weight), or Q5_0 (5.5) where d_model is not a multiple of Q4_K's
//! 256 (llama.cpp's own fallback for such rows). The whole-record strategies compute the logits
//! from it: below the 4-bit model's size every MiB buys row slots, and this head is smaller
//! than a GGUF's Q6_K one at a small cost in perplexity (docs/RESULTS.md).
//!
//! One tensor, `lm_head.weight`: U8 `[vocab, row_bytes]` with its type in the `ggml_types`
//! metadata, as `resident.safetensors` stores the GGUF's blocks (`safetensors_io`).

use crate::error::{FormatError, Result};
use crate::ggml_quants::GgmlType;
use crate::model_dir::LM_HEAD;
use crate::safetensors_io::{ggml_types_metadata, write_raw_safetensors, MappedSafetensors, RawTensor};
use safetensors::Dtype;
use std::path::Path;

/// The manifest role of the file.
pub const ARTIFACT_ROLE: &str = "head_compact";

/// The block type of a head whose rows have `d` values: Q4_K, Q5_0 when `d` is not a multiple of
/// 256; None when `d` is not a multiple of 32 either.
pub fn type_for(d: usize) -> Option<GgmlType> {
    if d.is_multiple_of(GgmlType::Q4K.block_elements()) {
        Some(GgmlType::Q4K)
    } else if d.is_multiple_of(GgmlType::Q5_0.block_elements()) {
        Some(GgmlType::Q5_0)
    } else {
        None
    }
}

/// Writes `bytes` (`rows` rows of `d / block_elements` blocks of `ty`) atomically.
pub fn save(path: &Path, ty: GgmlType, rows: usize, d: usize, bytes: Vec<u8>) -> Result<()> {
    let row_bytes = d / ty.block_elements() * ty.block_bytes();
    assert_eq!(bytes.len(), rows * row_bytes);
    let t = RawTensor { name: LM_HEAD.into(), dtype: Dtype::U8, shape: vec![rows, row_bytes], bytes };
    write_raw_safetensors(path, &[t], ggml_types_metadata([(LM_HEAD, ty)]))
}

/// Opens the head file and checks it holds `lm_head.weight` as `type_for(d)` blocks of
/// `[vocab, d]` values (errors name the file and the tensor).
pub fn open(path: &Path, vocab: usize, d: usize) -> Result<(MappedSafetensors, GgmlType)> {
    let f = MappedSafetensors::open(path)?;
    let bad = |reason: String| FormatError::Safetensors {
        path: path.to_path_buf(),
        reason: format!("tensor '{LM_HEAD}': {reason}"),
    };
    let e = f
        .tensors
        .get(LM_HEAD)
        .ok_or_else(|| FormatError::MissingTensor { path: path.to_path_buf(), tensor: LM_HEAD.into() })?;
    let expected = type_for(d).ok_or_else(|| bad(format!("d_model {d} is not a multiple of 32: no 4-bit head")))?;
    match e.ggml {
        Some(t) if t == expected => {}
        Some(t) => return Err(bad(format!("{} blocks, expected {} for d_model {d}", t.name(), expected.name()))),
        None => return Err(bad(format!("{:?}, expected {} blocks", e.dtype, expected.name()))),
    }
    if e.logical_shape() != [vocab, d] {
        return Err(FormatError::ShapeMismatch {
            path: path.to_path_buf(),
            tensor: LM_HEAD.into(),
            expected: vec![vocab, d],
            actual: e.logical_shape(),
        });
    }
    Ok((f, expected))
}

/// The file's tensor bytes for a `[vocab, d]` head.
pub fn bytes_for(vocab: usize, d: usize) -> Option<u64> {
    type_for(d).map(|t| (vocab * (d / t.block_elements()) * t.block_bytes()) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_refusals() {
        let dir = std::env::temp_dir().join(format!("head-compact-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (vocab, d) = (3, 512);
        let values: Vec<f32> = (0..vocab * d).map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0).collect();
        let bytes: Vec<u8> = values.chunks(d).flat_map(crate::ggml_quants::quantize_q4_k).collect();
        let p = dir.join("head.safetensors");
        save(&p, GgmlType::Q4K, vocab, d, bytes.clone()).unwrap();
        let (f, t) = open(&p, vocab, d).unwrap();
        assert_eq!(t, GgmlType::Q4K);
        assert_eq!(f.bytes(&f.tensors[LM_HEAD]), &bytes[..]);
        assert_eq!(bytes_for(vocab, d), Some(bytes.len() as u64));
        // another vocabulary, another width, a Q5_0 file where Q4_K belongs
        assert!(open(&p, vocab + 1, d).err().unwrap().to_string().contains("lm_head.weight"));
        let e = open(&p, vocab, 256 + 32).err().unwrap().to_string();
        assert!(e.contains("head.safetensors") && e.contains("Q5_0"), "{e}");
        assert_eq!(type_for(576), Some(GgmlType::Q5_0));
        assert_eq!(type_for(100), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
