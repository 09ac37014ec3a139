//! `centroids.safetensors` (written by `prep cluster`): per mask column (`centroids_lNN`, or
//! `gate_centroids_lNN` / `up_centroids_lNN` for gate-up masks) a U8 tensor `[K, ceil(n_ff/8)]`:
//! K bitsets, bit j of a row set when neuron j belongs to that centroid's pruned set
//! (exactly K_max bits per row; LSB-first within a byte).

use crate::error::{FormatError, Result};
use crate::safetensors_io::MappedSafetensors;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The K bitsets of one mask column.
#[derive(Debug, Clone)]
pub struct CentroidSet {
    pub k: usize,
    /// Bytes per bitset.
    pub width: usize,
    /// `[k, width]`
    pub bits: Vec<u8>,
}

impl CentroidSet {
    pub fn row(&self, c: usize) -> &[u8] {
        &self.bits[c * self.width..(c + 1) * self.width]
    }

    /// The centroid whose set covers most of `mask` (ties: lowest index). With every set of the
    /// same size K_max this is also the set nearest in Hamming distance.
    pub fn best_cover(&self, mask: &[u8]) -> u32 {
        let mut best = (0u32, 0u64);
        for c in 0..self.k {
            let ov = overlap(self.row(c), mask);
            if ov > best.1 {
                best = (c as u32, ov);
            }
        }
        best.0
    }

    /// Neuron indices of centroid `c`, ascending.
    pub fn neurons(&self, c: usize) -> Vec<u32> {
        let mut v = Vec::new();
        for (i, &b) in self.row(c).iter().enumerate() {
            let mut b = b;
            while b != 0 {
                let j = b.trailing_zeros();
                v.push(i as u32 * 8 + j);
                b &= b - 1;
            }
        }
        v
    }
}

/// Number of neurons in both bit-packed sets (8 bytes at a time).
pub fn overlap(a: &[u8], b: &[u8]) -> u64 {
    let (ac, bc) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: u64 = ac.remainder().iter().zip(bc.remainder()).map(|(x, y)| (x & y).count_ones() as u64).sum();
    ac.zip(bc)
        .map(|(x, y)| {
            (u64::from_le_bytes(x.try_into().unwrap()) & u64::from_le_bytes(y.try_into().unwrap())).count_ones() as u64
        })
        .sum::<u64>()
        + tail
}

#[derive(Debug, Clone)]
pub struct CentroidTable {
    pub path: PathBuf,
    /// Column name (`centroids_l05`) -> its set.
    pub columns: BTreeMap<String, CentroidSet>,
}

impl CentroidTable {
    pub fn load(path: &Path) -> Result<Self> {
        let f = MappedSafetensors::open(path)?;
        let mut columns = BTreeMap::new();
        for (name, e) in &f.tensors {
            if e.dtype != Dtype::U8 || e.shape.len() != 2 {
                return Err(FormatError::DtypeMismatch {
                    path: path.to_path_buf(),
                    tensor: name.clone(),
                    dtype: format!("{:?} {:?}", e.dtype, e.shape),
                    expected: "U8 [K, width]",
                });
            }
            columns.insert(name.clone(), CentroidSet { k: e.shape[0], width: e.shape[1], bits: f.bytes(e).to_vec() });
        }
        Ok(CentroidTable { path: path.to_path_buf(), columns })
    }

    /// The product-mask centroids of `layer`.
    pub fn layer(&self, layer: usize) -> Result<&CentroidSet> {
        let name = format!("centroids_l{layer:02}");
        self.columns.get(&name).ok_or_else(|| FormatError::MissingTensor { path: self.path.clone(), tensor: name })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_and_best_cover() {
        let a: Vec<u8> = (0..19).map(|i| i as u8 * 37).collect();
        let b: Vec<u8> = (0..19).map(|i| 255 - i as u8 * 11).collect();
        let slow: u64 = a.iter().zip(&b).map(|(x, y)| (x & y).count_ones() as u64).sum();
        assert_eq!(overlap(&a, &b), slow);
        let set = CentroidSet { k: 2, width: 2, bits: vec![0b0000_1111, 0, 0, 0b1111_0000] };
        assert_eq!(set.best_cover(&[0, 0b0011_0000]), 1);
        assert_eq!(set.best_cover(&[0b0000_0011, 0]), 0);
        assert_eq!(set.neurons(1), vec![12, 13, 14, 15]);
    }
}
