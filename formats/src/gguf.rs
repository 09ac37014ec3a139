//! GGUF, llama.cpp's model container (versions 2 and 3).
//!
//! Layout (little-endian):
//! ```text
//! "GGUF" | version u32 | n_tensors u64 | n_kv u64
//! n_kv x  (key: string, value_type u32, value)
//! n_tensors x (name: string, n_dims u32, ne[n_dims] u64, ggml_type u32, offset u64)
//! padding to `general.alignment` (default 32)
//! tensor data; each tensor at data_start + offset
//! ```
//! A string is `len u64` + UTF-8 bytes. `ne[0]` is the contiguous (fastest) dimension, so a
//! Hugging Face matrix `[out, in]` appears as `ne = [in, out]`.

use crate::error::{FormatError, Result};
use crate::ggml_quants::GgmlType;
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) if v >= 0 => Some(v as u64),
            GgufValue::I16(v) if v >= 0 => Some(v as u64),
            GgufValue::I32(v) if v >= 0 => Some(v as u64),
            GgufValue::I64(v) if v >= 0 => Some(v as u64),
            _ => None,
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of the tensor table.
#[derive(Debug, Clone)]
pub struct GgufTensorInfo {
    pub name: String,
    /// GGML order: `ne[0]` is the contiguous dimension.
    pub ne: Vec<u64>,
    pub ggml_type_id: u32,
    /// Absolute byte offset of the tensor's data in the file.
    pub file_offset: u64,
    pub n_bytes: u64,
}

impl GgufTensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.ne.iter().product()
    }
    /// Shape in row-major (Hugging Face) order: the reverse of `ne`.
    pub fn shape_row_major(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A memory-mapped, validated GGUF file.
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, GgufValue>,
    pub tensors: Vec<GgufTensorInfo>,
    mmap: Mmap,
}

struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: &'a Path,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(FormatError::Truncated {
                path: self.path.to_path_buf(),
                offset: self.pos as u64,
                what: what.to_string(),
                needed: n as u64,
                file_bytes: self.bytes.len() as u64,
            }),
        }
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4, what)?.try_into().unwrap()))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8, what)?.try_into().unwrap()))
    }
    fn corrupt(&self, what: String) -> FormatError {
        FormatError::Corrupt { path: self.path.to_path_buf(), offset: self.pos as u64, what }
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        if len > self.bytes.len() as u64 {
            return Err(self.corrupt(format!("{what}: string length {len} exceeds the file size")));
        }
        let start = self.pos;
        let raw = self.take(len as usize, what)?;
        String::from_utf8(raw.to_vec()).map_err(|_| FormatError::Corrupt {
            path: self.path.to_path_buf(),
            offset: start as u64,
            what: format!("{what}: not valid UTF-8"),
        })
    }
    fn value(&mut self, type_id: u32, key: &str, depth: u32) -> Result<GgufValue> {
        Ok(match type_id {
            0 => GgufValue::U8(self.take(1, key)?[0]),
            1 => GgufValue::I8(self.take(1, key)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.take(2, key)?.try_into().unwrap())),
            3 => GgufValue::I16(i16::from_le_bytes(self.take(2, key)?.try_into().unwrap())),
            4 => GgufValue::U32(self.u32(key)?),
            5 => GgufValue::I32(self.u32(key)? as i32),
            6 => GgufValue::F32(f32::from_bits(self.u32(key)?)),
            7 => GgufValue::Bool(self.take(1, key)?[0] != 0),
            8 => GgufValue::String(self.string(key)?),
            9 => {
                if depth > 2 {
                    return Err(self.corrupt(format!("{key}: arrays nested too deeply")));
                }
                let elem_type = self.u32(key)?;
                let n = self.u64(key)?;
                if n > self.bytes.len() as u64 {
                    return Err(self.corrupt(format!("{key}: array length {n} exceeds the file size")));
                }
                let mut items = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    items.push(self.value(elem_type, key, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64(key)?),
            11 => GgufValue::I64(self.u64(key)? as i64),
            12 => GgufValue::F64(f64::from_bits(self.u64(key)?)),
            other => return Err(self.corrupt(format!("{key}: unknown metadata value type {other}"))),
        })
    }
}

impl GgufFile {
    /// Opens, maps and validates a GGUF file: header, metadata, tensor table, and that every
    /// tensor's bytes lie inside the file.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
        // SAFETY: the file is opened read-only; we never hand out a mutable view, and a
        // concurrent truncation by another process is outside what any reader can defend against.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| FormatError::io(path, e))?;
        let mut c = Cursor { bytes: &mmap, pos: 0, path };
        let magic: [u8; 4] = c.take(4, "magic")?.try_into().unwrap();
        if &magic != b"GGUF" {
            return Err(FormatError::NotGguf { path: path.to_path_buf(), magic });
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(FormatError::GgufVersion { path: path.to_path_buf(), version });
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        if n_tensors > 1 << 24 || n_kv > 1 << 24 {
            return Err(c.corrupt(format!("implausible counts: {n_tensors} tensors, {n_kv} metadata keys")));
        }
        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            // (a key is printed in messages: control characters, a terminal's escapes among
            // them, are refused here, shown escaped)
            if key.chars().any(char::is_control) {
                return Err(c.corrupt(format!("metadata key {:?} holds control characters", key)));
            }
            let type_id = c.u32(&key)?;
            let v = c.value(type_id, &key, 0)?;
            metadata.insert(key, v);
        }
        let mut raw = Vec::with_capacity(n_tensors as usize);
        for _ in 0..n_tensors {
            let name = c.string("tensor name")?;
            if name.chars().any(char::is_control) {
                return Err(c.corrupt(format!("tensor name {:?} holds control characters", name)));
            }
            let n_dims = c.u32(&name)?;
            if n_dims == 0 || n_dims > 4 {
                return Err(c.corrupt(format!("tensor '{name}': {n_dims} dimensions")));
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for _ in 0..n_dims {
                ne.push(c.u64(&name)?);
            }
            let ggml_type_id = c.u32(&name)?;
            let offset = c.u64(&name)?;
            raw.push((name, ne, ggml_type_id, offset));
        }
        let alignment = metadata.get("general.alignment").and_then(|v| v.as_u64()).unwrap_or(32);
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(c.corrupt(format!("general.alignment {alignment} is not a power of two")));
        }
        let data_start = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_bytes = mmap.len() as u64;
        let mut tensors = Vec::with_capacity(raw.len());
        let mut names = std::collections::HashSet::new();
        for (name, ne, ggml_type_id, offset) in raw {
            let corrupt = |what: String| FormatError::Corrupt {
                path: path.to_path_buf(),
                offset: data_start.saturating_add(offset),
                what: format!("tensor '{name}': {what}"),
            };
            if !names.insert(name.clone()) {
                return Err(corrupt("appears twice in the tensor table".into()));
            }
            if ne.contains(&0) {
                return Err(corrupt(format!("a dimension of 0 in {ne:?}")));
            }
            let n_elements = ne
                .iter()
                .try_fold(1u64, |a, &b| a.checked_mul(b))
                .filter(|&n| n <= 1 << 40)
                .ok_or_else(|| corrupt(format!("implausible shape {ne:?}")))?;
            if offset % alignment != 0 {
                return Err(corrupt(format!("data offset {offset} is not a multiple of the alignment {alignment}")));
            }
            // Unknown types are kept in the table (a model may carry tensors we never read);
            // reading one reports UnsupportedTensorType.
            let n_bytes = match GgmlType::from_id(ggml_type_id) {
                Some(t) => {
                    // as llama.cpp: a row (ne[0]) is a whole number of blocks
                    if !ne[0].is_multiple_of(t.block_elements() as u64) {
                        return Err(corrupt(format!(
                            "rows of {} elements are not a whole number of {} blocks of {}",
                            ne[0],
                            crate::ggml_quants::type_name(ggml_type_id),
                            t.block_elements()
                        )));
                    }
                    n_elements / t.block_elements() as u64 * t.block_bytes() as u64
                }
                None => 0,
            };
            let file_offset =
                data_start.checked_add(offset).ok_or_else(|| corrupt(format!("data offset {offset} overflows")))?;
            if file_offset.checked_add(n_bytes).is_none_or(|end| end > file_bytes) {
                return Err(FormatError::Truncated {
                    path: path.to_path_buf(),
                    offset: file_offset,
                    what: format!("tensor '{name}'"),
                    needed: n_bytes,
                    file_bytes,
                });
            }
            tensors.push(GgufTensorInfo { name, ne, ggml_type_id, file_offset, n_bytes });
        }
        // no two tensors share bytes
        let mut by_offset: Vec<&GgufTensorInfo> = tensors.iter().filter(|t| t.n_bytes > 0).collect();
        by_offset.sort_by_key(|t| t.file_offset);
        for w in by_offset.windows(2) {
            if w[0].file_offset + w[0].n_bytes > w[1].file_offset {
                return Err(FormatError::Corrupt {
                    path: path.to_path_buf(),
                    offset: w[1].file_offset,
                    what: format!("tensors '{}' and '{}' overlap", w[0].name, w[1].name),
                });
            }
        }
        // laid out as llama.cpp's writer lays them out: in the table's order, each at the end of
        // the one before rounded up to the alignment, the first at the data region's start; so
        // two tensors whose offsets were swapped (same sizes, other shapes) are refused, not
        // computed. (Checked where every type's size is known.)
        if tensors.iter().all(|t| GgmlType::from_id(t.ggml_type_id).is_some()) {
            let mut expect = data_start;
            for t in &tensors {
                if t.file_offset != expect {
                    return Err(FormatError::Corrupt {
                        path: path.to_path_buf(),
                        offset: t.file_offset,
                        what: format!(
                            "tensor '{}' starts at byte {} of the data region, where the table's order puts it at {}",
                            t.name,
                            t.file_offset - data_start,
                            expect - data_start
                        ),
                    });
                }
                expect = (t.file_offset + t.n_bytes).div_ceil(alignment) * alignment;
            }
        }
        Ok(GgufFile { path: path.to_path_buf(), version, metadata, tensors, mmap })
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn require(&self, key: &str) -> Result<&GgufValue> {
        self.metadata.get(key).ok_or_else(|| FormatError::MissingKey { path: self.path.clone(), key: key.to_string() })
    }

    pub fn require_u64(&self, key: &str) -> Result<u64> {
        self.require(key)?.as_u64().ok_or_else(|| FormatError::WrongKeyType {
            path: self.path.clone(),
            key: key.to_string(),
            expected: "unsigned integer",
        })
    }

    pub fn require_f64(&self, key: &str) -> Result<f64> {
        self.require(key)?.as_f64().ok_or_else(|| FormatError::WrongKeyType {
            path: self.path.clone(),
            key: key.to_string(),
            expected: "number",
        })
    }

    /// An optional key that must be an unsigned integer where present: None when absent, an
    /// error naming the key when it holds another type (never silently dropped).
    pub fn optional_u64(&self, key: &str) -> Result<Option<u64>> {
        self.get(key).map(|_| self.require_u64(key)).transpose()
    }

    /// [`GgufFile::optional_u64`] for a number.
    pub fn optional_f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key).map(|_| self.require_f64(key)).transpose()
    }

    pub fn require_str(&self, key: &str) -> Result<&str> {
        self.require(key)?.as_str().ok_or_else(|| FormatError::WrongKeyType {
            path: self.path.clone(),
            key: key.to_string(),
            expected: "string",
        })
    }

    /// A string array (e.g. `tokenizer.ggml.tokens`).
    pub fn require_str_array(&self, key: &str) -> Result<Vec<&str>> {
        let wrong = || FormatError::WrongKeyType {
            path: self.path.clone(),
            key: key.to_string(),
            expected: "array of strings",
        };
        let arr = self.require(key)?.as_array().ok_or_else(wrong)?;
        arr.iter().map(|v| v.as_str().ok_or_else(wrong)).collect()
    }

    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of a tensor (bounds were checked by `open`).
    pub fn tensor_bytes(&self, info: &GgufTensorInfo) -> &[u8] {
        &self.mmap[info.file_offset as usize..(info.file_offset + info.n_bytes) as usize]
    }

    /// Dequantizes a tensor to f32, in row-major order (`ne[0]` contiguous).
    pub fn dequantize_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self
            .tensor(name)
            .ok_or_else(|| FormatError::MissingTensor { path: self.path.clone(), tensor: name.to_string() })?;
        let t = GgmlType::from_id(info.ggml_type_id).filter(|t| t.is_supported()).ok_or_else(|| {
            FormatError::UnsupportedTensorType {
                path: self.path.clone(),
                tensor: name.to_string(),
                type_id: info.ggml_type_id,
                type_name: crate::ggml_quants::type_name(info.ggml_type_id).to_string(),
            }
        })?;
        let mut out = vec![0f32; info.n_elements() as usize];
        crate::ggml_quants::dequantize(t, self.tensor_bytes(info), &mut out);
        Ok(out)
    }
}

/// One tensor to write: raw bytes already in `ggml_type_id`'s block layout.
#[derive(Debug, Clone)]
pub struct GgufTensorData {
    pub name: String,
    pub ne: Vec<u64>,
    pub ggml_type_id: u32,
    pub bytes: Vec<u8>,
}

/// Writes a GGUF v3 file (alignment 32) atomically. The counterpart of [`GgufFile::open`];
/// used to build test inputs and by tools that emit GGUF.
pub fn write_gguf(path: &Path, metadata: &[(String, GgufValue)], tensors: &[GgufTensorData]) -> Result<()> {
    fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    fn type_id(v: &GgufValue) -> u32 {
        match v {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::String(_) => 8,
            GgufValue::Array(_) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }
    fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
        match v {
            GgufValue::U8(x) => out.push(*x),
            GgufValue::I8(x) => out.push(*x as u8),
            GgufValue::U16(x) => out.extend(x.to_le_bytes()),
            GgufValue::I16(x) => out.extend(x.to_le_bytes()),
            GgufValue::U32(x) => out.extend(x.to_le_bytes()),
            GgufValue::I32(x) => out.extend(x.to_le_bytes()),
            GgufValue::F32(x) => out.extend(x.to_le_bytes()),
            GgufValue::Bool(x) => out.push(*x as u8),
            GgufValue::String(s) => put_str(out, s),
            GgufValue::Array(items) => {
                out.extend(items.first().map(type_id).unwrap_or(4).to_le_bytes());
                out.extend((items.len() as u64).to_le_bytes());
                items.iter().for_each(|i| put_value(out, i));
            }
            GgufValue::U64(x) => out.extend(x.to_le_bytes()),
            GgufValue::I64(x) => out.extend(x.to_le_bytes()),
            GgufValue::F64(x) => out.extend(x.to_le_bytes()),
        }
    }
    const ALIGN: usize = 32;
    let mut out = Vec::new();
    out.extend(b"GGUF");
    out.extend(3u32.to_le_bytes());
    out.extend((tensors.len() as u64).to_le_bytes());
    out.extend((metadata.len() as u64).to_le_bytes());
    for (k, v) in metadata {
        put_str(&mut out, k);
        out.extend(type_id(v).to_le_bytes());
        put_value(&mut out, v);
    }
    let mut offset = 0usize;
    for t in tensors {
        put_str(&mut out, &t.name);
        out.extend((t.ne.len() as u32).to_le_bytes());
        t.ne.iter().for_each(|d| out.extend(d.to_le_bytes()));
        out.extend(t.ggml_type_id.to_le_bytes());
        out.extend((offset as u64).to_le_bytes());
        offset += t.bytes.len().div_ceil(ALIGN) * ALIGN;
    }
    out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
    for t in tensors {
        out.extend(&t.bytes);
        out.resize(out.len().div_ceil(ALIGN) * ALIGN, 0);
    }
    crate::safetensors_io::write_atomic(&crate::safetensors_io::tmp_path(path), path, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file path in a directory removed when the guard drops.
    fn tmp(name: &str) -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::Builder::new().prefix("formats-gguf-").tempdir().unwrap();
        let p = d.path().join(name);
        (d, p)
    }

    /// Two tensors of the same size whose table offsets were swapped would import as each
    /// other's weights: the reader refuses a table out of the writer's order.
    #[test]
    fn swapped_tensor_offsets_are_refused() {
        let (_d, p) = tmp("swapped.gguf");
        let t =
            |name: &str, ne: Vec<u64>| GgufTensorData { name: name.into(), ne, ggml_type_id: 0, bytes: vec![0; 64] };
        write_gguf(&p, &[], &[t("first", vec![8, 2]), t("second", vec![16])]).unwrap();
        assert!(GgufFile::open(&p).is_ok());
        let mut b = std::fs::read(&p).unwrap();
        // each offset field: after the name, n_dims (4), the dims (8 each) and the type (4)
        let field = |b: &[u8], name: &str, dims: usize| {
            let at = b.windows(name.len()).position(|w| w == name.as_bytes()).unwrap() + name.len();
            at + 4 + 8 * dims + 4
        };
        let (fa, fb) = (field(&b, "first", 2), field(&b, "second", 1));
        let (va, vb) = (b[fa..fa + 8].to_vec(), b[fb..fb + 8].to_vec());
        b[fa..fa + 8].copy_from_slice(&vb);
        b[fb..fb + 8].copy_from_slice(&va);
        std::fs::write(&p, &b).unwrap();
        let e = GgufFile::open(&p).err().expect("refused").to_string();
        assert!(e.contains("tensor 'first'") && e.contains("the table's order puts it at 0"), "{e}");
    }

    #[test]
    fn write_then_read_round_trip() {
        let (_dir, p) = tmp("rt.gguf");
        let md = vec![
            ("general.architecture".to_string(), GgufValue::String("llama".into())),
            ("llama.block_count".to_string(), GgufValue::U32(2)),
            ("list".to_string(), GgufValue::Array(vec![GgufValue::String("a".into()), GgufValue::String("b".into())])),
        ];
        let bytes: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        write_gguf(&p, &md, &[GgufTensorData { name: "t".into(), ne: vec![3, 2], ggml_type_id: 0, bytes }]).unwrap();
        let g = GgufFile::open(&p).unwrap();
        assert_eq!(g.require_str("general.architecture").unwrap(), "llama");
        assert_eq!(g.require_u64("llama.block_count").unwrap(), 2);
        assert_eq!(g.require_str_array("list").unwrap(), vec!["a", "b"]);
        assert_eq!(g.tensor("t").unwrap().shape_row_major(), vec![2, 3]);
        assert_eq!(g.dequantize_f32("t").unwrap(), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    }

    #[test]
    fn truncated_and_garbage_files_are_reported_with_offsets() {
        let (_dir, p) = tmp("trunc.gguf");
        let bytes: Vec<u8> = vec![0u8; 64];
        write_gguf(&p, &[], &[GgufTensorData { name: "w".into(), ne: vec![16], ggml_type_id: 0, bytes }]).unwrap();
        let full = std::fs::read(&p).unwrap();
        std::fs::write(&p, &full[..full.len() - 10]).unwrap();
        let e = GgufFile::open(&p).err().unwrap().to_string();
        assert!(e.contains("truncated") && e.contains("tensor 'w'") && e.contains("trunc.gguf"), "{e}");
        std::fs::write(&p, &full[..20]).unwrap();
        let e = GgufFile::open(&p).err().unwrap().to_string();
        assert!(e.contains("truncated at byte offset"), "{e}");
        std::fs::write(&p, b"this is not a model file at all").unwrap();
        let e = GgufFile::open(&p).err().unwrap().to_string();
        assert!(e.contains("not a GGUF file"), "{e}");
    }

    #[test]
    fn unsupported_type_is_named() {
        let (_dir, p) = tmp("q2k.gguf");
        write_gguf(
            &p,
            &[],
            &[GgufTensorData { name: "w".into(), ne: vec![256], ggml_type_id: 10, bytes: vec![0; 84] }],
        )
        .unwrap();
        let g = GgufFile::open(&p).unwrap();
        let e = g.dequantize_f32("w").err().unwrap().to_string();
        assert!(e.contains("Q2_K") && e.contains("'w'"), "{e}");
    }
}
