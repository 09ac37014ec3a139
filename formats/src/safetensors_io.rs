//! Memory-mapped safetensors reading (validated up front) and atomic f16 writing.
//!
//! GGML-quantized tensors (a model directory that keeps a GGUF's own blocks, `prep import
//! --dtype native`) are stored as U8 `[rows, row_bytes]`, each row the blocks of one matrix
//! row exactly as the GGUF holds them, with their type named in the header's metadata:
//! `"ggml_types": {"<tensor name>": "Q4_K", ...}` ([`GGML_TYPES_KEY`]). safetensors has no
//! quantized dtypes; this keeps the file readable by any safetensors reader and the blocks
//! byte-equal to llama.cpp's, so its kernels' results carry over.

use crate::error::{FormatError, Result};
use crate::ggml_quants::{self, GgmlType};
use half::f16;
use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};
use std::collections::HashMap;
use std::io::Write;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The metadata key naming the GGML type of each quantized tensor (a JSON object).
pub const GGML_TYPES_KEY: &str = "ggml_types";

/// Where one tensor lives inside a mapped file.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub dtype: Dtype,
    /// The stored shape (`[rows, row_bytes]` for a quantized tensor).
    pub shape: Vec<usize>,
    pub byte_range: Range<usize>,
    /// The GGML block type of a quantized tensor (U8 rows of blocks); None for a plain dtype.
    pub ggml: Option<GgmlType>,
}

impl TensorEntry {
    /// The tensor's shape in elements: `[rows, cols]` for a quantized one.
    pub fn logical_shape(&self) -> Vec<usize> {
        match self.ggml {
            Some(t) => vec![self.shape[0], self.shape[1] / t.block_bytes() * t.block_elements()],
            None => self.shape.clone(),
        }
    }
}

/// A safetensors file mapped into memory; tensor bytes are borrowed from the map.
pub struct MappedSafetensors {
    pub path: PathBuf,
    pub mmap: Arc<Mmap>,
    pub tensors: HashMap<String, TensorEntry>,
    /// The header's `__metadata__`.
    pub metadata: Option<HashMap<String, String>>,
}

impl MappedSafetensors {
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
        // SAFETY: read-only map of a file we do not modify; see GgufFile::open.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))?;
        let st = SafeTensors::deserialize(&mmap)
            .map_err(|e| FormatError::Safetensors { path: path.to_path_buf(), reason: e.to_string() })?;
        let (_, header) = SafeTensors::read_metadata(&mmap)
            .map_err(|e| FormatError::Safetensors { path: path.to_path_buf(), reason: e.to_string() })?;
        let metadata = header.metadata().clone();
        let ggml_types = ggml_types_of(path, metadata.as_ref())?;
        let base = mmap.as_ptr() as usize;
        let mut tensors = HashMap::new();
        for (name, view) in st.tensors() {
            let start = view.data().as_ptr() as usize - base;
            let ggml = ggml_types.get(&name).copied();
            let e = TensorEntry {
                dtype: view.dtype(),
                shape: view.shape().to_vec(),
                byte_range: start..start + view.data().len(),
                ggml,
            };
            if let Some(t) = ggml {
                check_quantized(path, &name, &e, t)?;
            }
            tensors.insert(name, e);
        }
        if let Some(name) = ggml_types.keys().find(|n| !tensors.contains_key(*n)) {
            return Err(FormatError::Safetensors {
                path: path.to_path_buf(),
                reason: format!("metadata '{GGML_TYPES_KEY}' names tensor '{name}', which the file does not hold"),
            });
        }
        drop(st);
        Ok(MappedSafetensors { path: path.to_path_buf(), mmap: Arc::new(mmap), tensors, metadata })
    }

    /// Tensor `name`'s values as f16 (F16, BF16, F32, or GGML blocks dequantized), with its
    /// logical shape.
    pub fn f16_values(&self, name: &str, e: &TensorEntry) -> Result<Vec<f16>> {
        match e.ggml {
            Some(t) => {
                let mut out = vec![0f32; e.logical_shape().iter().product()];
                ggml_quants::dequantize(t, self.bytes(e), &mut out);
                Ok(out.into_iter().map(f16::from_f32).collect())
            }
            None => to_f16_vec(&self.path, name, e.dtype, self.bytes(e)),
        }
    }

    pub fn bytes(&self, e: &TensorEntry) -> &[u8] {
        &self.mmap[e.byte_range.clone()]
    }

    /// The bytes of tensor `name`, checked to have `dtype` and `shape` (the error names the
    /// file and the tensor).
    pub fn checked_bytes(&self, name: &str, dtype: Dtype, shape: &[usize]) -> Result<&[u8]> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor { path: self.path.clone(), tensor: name.into() })?;
        if e.dtype != dtype {
            return Err(FormatError::DtypeMismatch {
                path: self.path.clone(),
                tensor: name.into(),
                dtype: format!("{:?}", e.dtype),
                expected: dtype_name(dtype),
            });
        }
        if e.shape != shape {
            return Err(FormatError::ShapeMismatch {
                path: self.path.clone(),
                tensor: name.into(),
                expected: shape.to_vec(),
                actual: e.shape.clone(),
            });
        }
        Ok(self.bytes(e))
    }

    /// Tells the kernel that `name` is read a row at a time at random (MADV_RANDOM): a fault
    /// in a neighbouring tensor then reads its own page, not a read-ahead window reaching into
    /// this one.
    pub fn advise_random(&self, name: &str) -> Result<()> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor { path: self.path.clone(), tensor: name.to_string() })?;
        self.mmap
            .advise_range(memmap2::Advice::Random, e.byte_range.start, e.byte_range.len())
            .map_err(|err| FormatError::io(&self.path, err))
    }

    /// Tensor `name`'s rows, read on demand with `pread` instead of through the map: a table
    /// read a row at a time whose pages must not stay in the process (the input embedding of
    /// a streamed run). A mapped row faults in its neighbours too (the kernel maps the cached
    /// pages around a fault), so a map read a row per token ends up holding the whole table.
    pub fn rows_of(&self, name: &str) -> Result<TensorRows> {
        let e = self
            .tensors
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor { path: self.path.clone(), tensor: name.to_string() })?;
        let rows = e.shape.first().copied().unwrap_or(0);
        let row_bytes = e.byte_range.len().checked_div(rows).unwrap_or(0);
        let file = std::fs::File::open(&self.path).map_err(|err| FormatError::io(&self.path, err))?;
        Ok(TensorRows {
            file,
            path: self.path.clone(),
            tensor: name.to_string(),
            offset: e.byte_range.start as u64,
            rows,
            row_bytes,
        })
    }
}

/// The rows of one tensor of a safetensors file, each read when asked for
/// ([`MappedSafetensors::rows_of`]); nothing is held between reads.
pub struct TensorRows {
    file: std::fs::File,
    path: PathBuf,
    tensor: String,
    /// Byte offset of row 0 in the file.
    offset: u64,
    pub rows: usize,
    /// Stored bytes of one row (f16 values, or one row of GGML blocks).
    pub row_bytes: usize,
}

impl TensorRows {
    /// Row `r`'s stored bytes into `out` `[row_bytes]`.
    pub fn read_row(&self, r: usize, out: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        assert!(r < self.rows && out.len() == self.row_bytes, "row {r} of {} rows", self.rows);
        let at = self.offset + (r * self.row_bytes) as u64;
        self.file.read_exact_at(out, at).map_err(|e| FormatError::Corrupt {
            path: self.path.clone(),
            offset: at,
            what: format!("reading row {r} of tensor '{}': {e}", self.tensor),
        })
    }
}

/// The header metadata naming each quantized tensor's type (`ggml_types`), or None when no
/// tensor is quantized.
pub fn ggml_types_metadata<'a>(
    types: impl IntoIterator<Item = (&'a str, GgmlType)>,
) -> Option<HashMap<String, String>> {
    let names: std::collections::BTreeMap<&str, &str> = types.into_iter().map(|(n, t)| (n, t.name())).collect();
    (!names.is_empty()).then(|| {
        HashMap::from([(
            GGML_TYPES_KEY.to_string(),
            serde_json::to_string(&names).expect("a map of strings serializes"),
        )])
    })
}

/// The `ggml_types` metadata: tensor name -> type (an unknown or uncomputed type is an error
/// naming the tensor).
fn ggml_types_of(path: &Path, metadata: Option<&HashMap<String, String>>) -> Result<HashMap<String, GgmlType>> {
    let bad = |reason: String| FormatError::Safetensors { path: path.to_path_buf(), reason };
    let Some(text) = metadata.and_then(|m| m.get(GGML_TYPES_KEY)) else { return Ok(HashMap::new()) };
    let names: HashMap<String, String> = serde_json::from_str(text)
        .map_err(|e| bad(format!("metadata '{GGML_TYPES_KEY}' is not a JSON object of type names: {e}")))?;
    names
        .into_iter()
        .map(|(tensor, ty)| match GgmlType::from_name(&ty) {
            Some(t) if t.is_block_quantized() && t.is_supported() => Ok((tensor, t)),
            _ => Err(FormatError::UnsupportedStoredType { path: path.to_path_buf(), tensor, type_name: ty }),
        })
        .collect()
}

/// A quantized tensor is U8 `[rows, row_bytes]` with whole blocks per row.
fn check_quantized(path: &Path, name: &str, e: &TensorEntry, t: GgmlType) -> Result<()> {
    let bad = |reason: String| FormatError::Safetensors {
        path: path.to_path_buf(),
        reason: format!("tensor '{name}' ({}): {reason}", t.name()),
    };
    if e.dtype != Dtype::U8 || e.shape.len() != 2 {
        return Err(bad(format!("a quantized tensor is U8 [rows, row_bytes], not {:?} {:?}", e.dtype, e.shape)));
    }
    if e.shape[1] == 0 || !e.shape[1].is_multiple_of(t.block_bytes()) {
        return Err(bad(format!(
            "a row of {} bytes is not a whole number of {}-byte blocks",
            e.shape[1],
            t.block_bytes()
        )));
    }
    Ok(())
}

/// A dtype's name as safetensors spells it.
pub fn dtype_name(d: Dtype) -> &'static str {
    match d {
        Dtype::BOOL => "BOOL",
        Dtype::U8 => "U8",
        Dtype::I8 => "I8",
        Dtype::U16 => "U16",
        Dtype::I16 => "I16",
        Dtype::F16 => "F16",
        Dtype::BF16 => "BF16",
        Dtype::U32 => "U32",
        Dtype::I32 => "I32",
        Dtype::F32 => "F32",
        Dtype::U64 => "U64",
        Dtype::I64 => "I64",
        Dtype::F64 => "F64",
        _ => "other",
    }
}

/// Converts a tensor's bytes (F16, BF16 or F32) to f16 values.
pub fn to_f16_vec(path: &Path, name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f16>> {
    Ok(match dtype {
        Dtype::F16 => bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect(),
        Dtype::BF16 => {
            bytes.chunks_exact(2).map(|b| f16::from_f32(half::bf16::from_le_bytes([b[0], b[1]]).to_f32())).collect()
        }
        Dtype::F32 => {
            bytes.chunks_exact(4).map(|b| f16::from_f32(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))).collect()
        }
        other => {
            return Err(FormatError::DtypeMismatch {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                dtype: format!("{other:?}"),
                expected: "F16, BF16 or F32",
            })
        }
    })
}

/// One f16 tensor to write.
pub struct F16Tensor {
    pub name: String,
    pub shape: Vec<usize>,
    pub data: Vec<f16>,
}

/// Writes f16 tensors to `path` atomically (a temporary file renamed into place), so a
/// half-written file is never taken for a good one.
pub fn write_f16_safetensors(
    path: &Path,
    tensors: &[F16Tensor],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let bytes: &[u8] = bytemuck::cast_slice(&t.data);
            let view = safetensors::tensor::TensorView::new(Dtype::F16, t.shape.clone(), bytes).map_err(|e| {
                FormatError::Safetensors { path: path.to_path_buf(), reason: format!("tensor '{}': {e}", t.name) }
            })?;
            Ok((t.name.clone(), view))
        })
        .collect::<Result<_>>()?;
    write_views(path, views, metadata)
}

fn write_views(
    path: &Path,
    views: Vec<(String, safetensors::tensor::TensorView<'_>)>,
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let mut bytes = safetensors::serialize(views, metadata)
        .map_err(|e| FormatError::Safetensors { path: path.to_path_buf(), reason: e.to_string() })?;
    canonical_header(path, &mut bytes)?;
    write_atomic(&tmp_path(path), path, &bytes)
}

/// Rewrites the JSON header of a serialized safetensors file with its keys (tensor names, and
/// those of `__metadata__`) sorted, padded with spaces to the same length: the serializer walks
/// HashMaps, so the same tensors gave different bytes from run to run, and a preparation could
/// not be compared with another byte for byte.
fn canonical_header(path: &Path, bytes: &mut [u8]) -> Result<()> {
    let bad = |reason: String| FormatError::Safetensors { path: path.to_path_buf(), reason };
    let n = u64::from_le_bytes(bytes[..8].try_into().map_err(|_| bad("no header".into()))?) as usize;
    let header: std::collections::BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..8 + n]).map_err(|e| bad(e.to_string()))?;
    let sorted: std::collections::BTreeMap<&String, serde_json::Value> = header
        .iter()
        .map(|(k, v)| {
            let v = match (k.as_str(), v) {
                ("__metadata__", serde_json::Value::Object(m)) => {
                    serde_json::to_value(m.iter().collect::<std::collections::BTreeMap<_, _>>())
                        .unwrap_or_else(|_| v.clone())
                }
                _ => v.clone(),
            };
            (k, v)
        })
        .collect();
    let text = serde_json::to_string(&sorted).map_err(|e| bad(e.to_string()))?;
    if text.len() > n {
        return Err(bad(format!("canonical header of {} bytes exceeds the serialized {n}", text.len())));
    }
    bytes[8..8 + text.len()].copy_from_slice(text.as_bytes());
    bytes[8 + text.len()..8 + n].fill(b' ');
    Ok(())
}

/// `<path>.tmp` beside the destination.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(".tmp");
    PathBuf::from(s)
}

/// Writes `bytes` to `tmp`, fsyncs, and renames it to `path`.
/// On failure (a full disk, ...) the temporary file is removed.
pub fn write_atomic(tmp: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
    let written = (|| {
        let mut f = std::fs::File::create(tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(tmp);
        return Err(FormatError::io(tmp, e));
    }
    std::fs::rename(tmp, path).map_err(|e| FormatError::io(path, e))
}

/// One tensor of any safetensors dtype, as little-endian bytes.
pub struct RawTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// Writes tensors of any dtype (U8 bitsets, U16 labels, ...) atomically.
pub fn write_raw_safetensors(
    path: &Path,
    tensors: &[RawTensor],
    metadata: Option<HashMap<String, String>>,
) -> Result<()> {
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .map(|t| {
            let view = safetensors::tensor::TensorView::new(t.dtype, t.shape.clone(), &t.bytes).map_err(|e| {
                FormatError::Safetensors { path: path.to_path_buf(), reason: format!("tensor '{}': {e}", t.name) }
            })?;
            Ok((t.name.clone(), view))
        })
        .collect::<Result<_>>()?;
    write_views(path, views, metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows read with `pread` equal the mapped rows, and a file cut short is an error naming it
    /// and the offset.
    #[test]
    fn rows_read_from_the_file_equal_the_mapped_ones() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.safetensors");
        let data: Vec<f16> = (0..7 * 5).map(|i| f16::from_f32(i as f32 * 0.25 - 3.0)).collect();
        let other = F16Tensor { name: "b".into(), shape: vec![3], data: vec![f16::ONE; 3] };
        let t = F16Tensor { name: "a".into(), shape: vec![7, 5], data };
        write_f16_safetensors(&path, &[t, other], None).unwrap();
        let m = MappedSafetensors::open(&path).unwrap();
        let rows = m.rows_of("a").unwrap();
        assert_eq!((rows.rows, rows.row_bytes), (7, 10));
        let mapped = m.bytes(&m.tensors["a"]);
        let mut row = vec![0u8; 10];
        for r in [0, 3, 6] {
            rows.read_row(r, &mut row).unwrap();
            assert_eq!(row, mapped[r * 10..(r + 1) * 10]);
        }
        assert!(matches!(m.rows_of("c"), Err(FormatError::MissingTensor { .. })));
        let end = m.tensors["a"].byte_range.end as u64;
        drop(m);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(end - 4).unwrap();
        let e = rows.read_row(6, &mut row).unwrap_err().to_string();
        assert!(e.contains("t.safetensors") && e.contains("row 6 of tensor 'a'"), "{e}");
    }
}
