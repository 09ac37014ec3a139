//! `F16Matrix`: a row-major f16 matrix, borrowed from a memory-mapped file or owned.

use half::f16;
use memmap2::Mmap;
use std::sync::Arc;

enum F16Data {
    /// Bytes `byte_offset .. byte_offset + rows*cols*2` of a mapped file (2-byte aligned).
    Mapped { map: Arc<Mmap>, byte_offset: usize },
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

    /// Borrows from a map when the bytes are 2-byte aligned; copies otherwise.
    pub fn mapped(rows: usize, cols: usize, map: Arc<Mmap>, byte_offset: usize) -> Self {
        let n_bytes = rows * cols * 2;
        assert!(byte_offset + n_bytes <= map.len());
        if (map.as_ptr() as usize + byte_offset).is_multiple_of(std::mem::align_of::<f16>()) {
            F16Matrix { rows, cols, data: F16Data::Mapped { map, byte_offset } }
        } else {
            let bytes = &map[byte_offset..byte_offset + n_bytes];
            let v = bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect();
            F16Matrix::owned(rows, cols, v)
        }
    }

    pub fn as_slice(&self) -> &[f16] {
        match &self.data {
            F16Data::Mapped { map, byte_offset } => {
                bytemuck::cast_slice(&map[*byte_offset..*byte_offset + self.rows * self.cols * 2])
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
