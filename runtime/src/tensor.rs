//! `F16Matrix`: a row-major f16 matrix, borrowed from a memory-mapped file or owned;
//! `QMatrix`: rows of GGML blocks; `Matrix`: either.

use formats::ggml_quants::GgmlType;
use half::f16;
use std::sync::Arc;

/// Bytes a matrix may borrow for its whole life: a mapped file (`memmap2::Mmap`), or an MLP
/// staged from storage for a prompt (`stream::aligned::AlignedBuf`).
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

enum F16Data {
    /// Bytes `byte_offset .. byte_offset + rows*cols*2` of a mapped file or a staged buffer
    /// (2-byte aligned).
    Mapped {
        map: SharedBytes,
        byte_offset: usize,
    },
    Owned(Vec<f16>),
}

/// `[rows, cols]` f16, row-major.
pub struct F16Matrix {
    pub rows: usize,
    pub cols: usize,
    data: F16Data,
}

impl F16Matrix {
    pub fn owned(rows: usize, cols: usize, data: Vec<f16>) -> Self {
        assert_eq!(data.len(), rows * cols);
        F16Matrix { rows, cols, data: F16Data::Owned(data) }
    }

    /// Borrows from a map (or a staged buffer) when the bytes are 2-byte aligned; copies
    /// otherwise.
    pub fn mapped(rows: usize, cols: usize, map: SharedBytes, byte_offset: usize) -> Self {
        let n_bytes = rows * cols * 2;
        let all = (*map).as_ref();
        assert!(byte_offset + n_bytes <= all.len());
        if (all.as_ptr() as usize + byte_offset).is_multiple_of(std::mem::align_of::<f16>()) {
            F16Matrix { rows, cols, data: F16Data::Mapped { map, byte_offset } }
        } else {
            let bytes = &all[byte_offset..byte_offset + n_bytes];
            let v = bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect();
            F16Matrix::owned(rows, cols, v)
        }
    }

    pub fn as_slice(&self) -> &[f16] {
        match &self.data {
            F16Data::Mapped { map, byte_offset } => {
                bytemuck::cast_slice(&(**map).as_ref()[*byte_offset..*byte_offset + self.rows * self.cols * 2])
            }
            F16Data::Owned(v) => v,
        }
    }

    #[inline]
    pub fn row(&self, r: usize) -> &[f16] {
        &self.as_slice()[r * self.cols..(r + 1) * self.cols]
    }

    pub fn n_bytes(&self) -> usize {
        self.rows * self.cols * 2
    }
}

/// Where a [`QMatrix`]'s blocks are.
enum BlockData {
    /// Bytes `byte_offset .. byte_offset + rows * row_bytes` of a mapped file (2-byte aligned,
    /// as every GGML block type's fields are).
    Mapped { map: SharedBytes, byte_offset: usize },
    /// A copy, in u16s so that it is 2-byte aligned too.
    Owned(Vec<u16>),
    /// Rows interleaved by eight for the decode kernel (`ops::interleaved`'s layout).
    Interleaved(Vec<u8>),
}

/// A [`QMatrix`]'s blocks as its kernels read them.
pub enum BlockLayout<'a> {
    /// Row after row, each `row_bytes`, as the GGUF stores them.
    RowMajor(&'a [u8]),
    /// Rows interleaved by eight (`ops::interleaved`'s layout).
    Interleaved(&'a [u8]),
}

/// `[rows, cols]` of GGML blocks, row-major: each row is `cols / block_elements` blocks of
/// `ty` (`row_bytes` bytes), byte-equal to the GGUF's (`formats::safetensors_io`).
pub struct QMatrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    pub row_bytes: usize,
    data: BlockData,
}

impl QMatrix {
    /// Borrows from a map (or a staged buffer) when the bytes are 2-byte aligned; copies
    /// otherwise.
    pub fn mapped(ty: GgmlType, rows: usize, cols: usize, map: SharedBytes, byte_offset: usize) -> Self {
        assert!(ty.is_block_quantized() && cols.is_multiple_of(ty.block_elements()));
        let row_bytes = cols / ty.block_elements() * ty.block_bytes();
        let n_bytes = rows * row_bytes;
        let all = (*map).as_ref();
        assert!(byte_offset + n_bytes <= all.len());
        let data = if (all.as_ptr() as usize + byte_offset).is_multiple_of(2) {
            BlockData::Mapped { map, byte_offset }
        } else {
            BlockData::Owned(
                all[byte_offset..byte_offset + n_bytes]
                    .chunks_exact(2)
                    .map(|b| u16::from_ne_bytes([b[0], b[1]]))
                    .collect(),
            )
        };
        QMatrix { ty, rows, cols, row_bytes, data }
    }

    /// Owns `bytes` (`rows` rows of whole blocks).
    pub fn owned(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Self {
        assert!(ty.is_block_quantized() && cols.is_multiple_of(ty.block_elements()));
        let row_bytes = cols / ty.block_elements() * ty.block_bytes();
        assert_eq!(bytes.len(), rows * row_bytes);
        let data = BlockData::Owned(bytes.chunks_exact(2).map(|b| u16::from_ne_bytes([b[0], b[1]])).collect());
        QMatrix { ty, rows, cols, row_bytes, data }
    }

    /// Where the blocks are, in which order.
    pub fn layout(&self) -> BlockLayout<'_> {
        match &self.data {
            BlockData::Mapped { map, byte_offset } => {
                BlockLayout::RowMajor(&(**map).as_ref()[*byte_offset..*byte_offset + self.rows * self.row_bytes])
            }
            BlockData::Owned(v) => BlockLayout::RowMajor(bytemuck::cast_slice(v)),
            BlockData::Interleaved(v) => BlockLayout::Interleaved(v),
        }
    }

    /// Row `r`'s blocks as the GGUF stores them.
    #[inline]
    pub fn row(&self, r: usize) -> std::borrow::Cow<'_, [u8]> {
        match self.layout() {
            BlockLayout::RowMajor(b) => std::borrow::Cow::Borrowed(&b[r * self.row_bytes..(r + 1) * self.row_bytes]),
            BlockLayout::Interleaved(v) => {
                std::borrow::Cow::Owned(crate::ops::interleaved::row(self.ty, v, self.cols, r))
            }
        }
    }

    /// `rows` rows of `ty` blocks (`bytes`, row after row) interleaved by eight for the decode
    /// kernel (`ops::interleaved`); None where the CPU has no kernel for `ty` or `rows` is not
    /// whole groups of rows.
    pub fn interleaved(ty: GgmlType, rows: usize, cols: usize, bytes: &[u8]) -> Option<QMatrix> {
        use crate::ops::interleaved;
        if !interleaved::supports(ty) || !rows.is_multiple_of(interleaved::ROWS) {
            return None;
        }
        Some(QMatrix::from_interleaved(ty, rows, cols, interleaved::interleave(ty, bytes, rows, cols)))
    }

    /// `rows` rows of `ty` blocks already interleaved by eight (`ops::interleaved`, whose kernel
    /// the CPU has for `ty`).
    pub fn from_interleaved(ty: GgmlType, rows: usize, cols: usize, data: Vec<u8>) -> QMatrix {
        use crate::ops::interleaved;
        assert!(
            interleaved::supports(ty) && data.len() == rows / interleaved::ROWS * interleaved::group_bytes(ty, cols)
        );
        let row_bytes = cols / ty.block_elements() * ty.block_bytes();
        QMatrix { ty, rows, cols, row_bytes, data: BlockData::Interleaved(data) }
    }

    /// Bytes the blocks take (interleaved: with their unpacked scales).
    pub fn n_bytes(&self) -> usize {
        match self.layout() {
            BlockLayout::RowMajor(b) => b.len(),
            BlockLayout::Interleaved(v) => v.len(),
        }
    }
}

/// A weight matrix `[rows, cols]`: f16, or a GGUF's own blocks.
pub enum Matrix {
    F16(F16Matrix),
    Quant(QMatrix),
}

impl Matrix {
    pub fn rows(&self) -> usize {
        match self {
            Matrix::F16(m) => m.rows,
            Matrix::Quant(m) => m.rows,
        }
    }

    pub fn cols(&self) -> usize {
        match self {
            Matrix::F16(m) => m.cols,
            Matrix::Quant(m) => m.cols,
        }
    }

    pub fn n_bytes(&self) -> usize {
        match self {
            Matrix::F16(m) => m.n_bytes(),
            Matrix::Quant(m) => m.n_bytes(),
        }
    }

    /// "F16", "Q4_K", ...
    pub fn type_name(&self) -> &'static str {
        match self {
            Matrix::F16(_) => "F16",
            Matrix::Quant(m) => m.ty.name(),
        }
    }

    /// Row `r` as f32 into `out` `[cols]` (a quantized row dequantized).
    pub fn row_f32(&self, r: usize, out: &mut [f32]) {
        match self {
            Matrix::F16(m) => half::slice::HalfFloatSliceExt::convert_to_f32_slice(m.row(r), out),
            Matrix::Quant(m) => formats::ggml_quants::dequantize(m.ty, &m.row(r), out),
        }
    }

    /// A row of this matrix's type given as its stored bytes (`n_bytes / rows`, read from its
    /// file) as f32 into `out` `[cols]`.
    pub fn decode_row(&self, bytes: &[u8], out: &mut [f32]) {
        let ty = match self {
            Matrix::F16(_) => formats::ggml_quants::GgmlType::F16,
            Matrix::Quant(m) => m.ty,
        };
        formats::ggml_quants::dequantize(ty, bytes, out)
    }

    /// Row `r` as f16 (a quantized row dequantized).
    pub fn row_f16(&self, r: usize) -> std::borrow::Cow<'_, [f16]> {
        match self {
            Matrix::F16(m) => std::borrow::Cow::Borrowed(m.row(r)),
            Matrix::Quant(_) => {
                let mut v = vec![0f32; self.cols()];
                self.row_f32(r, &mut v);
                std::borrow::Cow::Owned(v.into_iter().map(f16::from_f32).collect())
            }
        }
    }

    /// The f16 matrix, when this is one.
    pub fn as_f16(&self) -> Option<&F16Matrix> {
        match self {
            Matrix::F16(m) => Some(m),
            Matrix::Quant(_) => None,
        }
    }
}
