//! `layout.safetensors`: the order of each sparse layer's records in `records.bin`. Record
//! position `p` of layer `l` holds neuron `neuron_at[l][p]` (its header names that neuron), so
//! neurons that are often active together can sit side by side and a token's missing rows
//! coalesce into fewer, longer reads. Only where a record lies changes: a neuron's rows, and so
//! the model's function, are the same whatever the order.
//!
//! One tensor, `neuron_at` (U32 `[n_sparse_layers, n_ff]`, each row a permutation of
//! `0..n_ff`), and the first layer it covers in the metadata (`first_layer`). Without the file
//! records lie in neuron order.

use crate::error::{FormatError, Result};
use crate::safetensors_io::{write_raw_safetensors, MappedSafetensors, RawTensor};
use std::path::Path;

/// The artifact role of `layout.safetensors` in a manifest.
pub const ARTIFACT_ROLE: &str = "layout";

/// Where each neuron's record lies, per sparse layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NeuronOrder {
    pub first_layer: usize,
    pub n_ff: usize,
    /// `[layers, n_ff]` the neuron at each position.
    neuron_at: Vec<u32>,
    /// `[layers, n_ff]` the position of each neuron.
    position: Vec<u32>,
}

impl NeuronOrder {
    /// From `neuron_at` `[layers, n_ff]`, checked: each layer's row a permutation of `0..n_ff`.
    pub fn new(path: &Path, first_layer: usize, n_ff: usize, neuron_at: Vec<u32>) -> Result<Self> {
        if n_ff == 0 || !neuron_at.len().is_multiple_of(n_ff) {
            return Err(FormatError::invalid(path, format!("{} positions are not whole layers of {n_ff}", neuron_at.len())));
        }
        let mut position = vec![u32::MAX; neuron_at.len()];
        for (l, row) in neuron_at.chunks_exact(n_ff).enumerate() {
            for (p, &j) in row.iter().enumerate() {
                let slot = position.get_mut(l * n_ff + j as usize).filter(|_| (j as usize) < n_ff);
                match slot {
                    Some(s) if *s == u32::MAX => *s = p as u32,
                    _ => {
                        return Err(FormatError::invalid(path, format!("layer {}: position {p} names neuron {j}, which is out of range or placed twice (not a permutation of 0..{n_ff})", first_layer + l)));
                    }
                }
            }
        }
        Ok(NeuronOrder { first_layer, n_ff, neuron_at, position })
    }

    pub fn n_layers(&self) -> usize {
        self.neuron_at.len() / self.n_ff
    }

    /// Where neuron `neuron` of `layer` lies among its layer's records.
    #[inline]
    pub fn position(&self, layer: usize, neuron: usize) -> usize {
        self.position[(layer - self.first_layer) * self.n_ff + neuron] as usize
    }

    /// The neuron whose record lies at `position` of `layer`.
    #[inline]
    pub fn neuron_at(&self, layer: usize, position: usize) -> usize {
        self.neuron_at[(layer - self.first_layer) * self.n_ff + position] as usize
    }

    /// Reads `path`, checking it covers layers `first_layer..first_layer + n_layers` of `n_ff`.
    pub fn load(path: &Path, first_layer: usize, n_layers: usize, n_ff: usize) -> Result<Self> {
        let f = MappedSafetensors::open(path)?;
        let meta_first = f.metadata.as_ref().and_then(|m| m.get("first_layer")).and_then(|v| v.parse::<usize>().ok());
        if meta_first != Some(first_layer) {
            return Err(FormatError::invalid(path, format!("orders layers from {meta_first:?}, the records start at layer {first_layer}")));
        }
        let bytes = f.checked_bytes("neuron_at", safetensors::Dtype::U32, &[n_layers, n_ff])?;
        let neuron_at = bytes.chunks_exact(4).map(|b| u32::from_le_bytes(b.try_into().unwrap())).collect();
        Self::new(path, first_layer, n_ff, neuron_at)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let t = RawTensor { name: "neuron_at".into(), dtype: safetensors::Dtype::U32, shape: vec![self.n_layers(), self.n_ff], bytes: self.neuron_at.iter().flat_map(|v| v.to_le_bytes()).collect() };
        write_raw_safetensors(path, &[t], Some([("first_layer".to_string(), self.first_layer.to_string())].into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_invert_the_order_and_bad_orders_are_refused() {
        let p = Path::new("/x/layout.safetensors");
        let o = NeuronOrder::new(p, 3, 4, vec![2, 0, 3, 1, 0, 1, 2, 3]).unwrap();
        assert_eq!((o.position(3, 2), o.position(3, 1), o.neuron_at(3, 2), o.position(4, 3)), (0, 3, 3, 3));
        let e = NeuronOrder::new(p, 3, 4, vec![2, 0, 2, 1]).unwrap_err().to_string();
        assert!(e.contains("layer 3") && e.contains("neuron 2") && e.contains("layout.safetensors"), "{e}");
        assert!(NeuronOrder::new(p, 3, 4, vec![0, 1, 2, 4]).is_err());
        assert!(NeuronOrder::new(p, 3, 4, vec![0, 1, 2]).is_err());
        let dir = std::env::temp_dir().join(format!("layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        o.save(&dir.join("l.safetensors")).unwrap();
        assert_eq!(NeuronOrder::load(&dir.join("l.safetensors"), 3, 2, 4).unwrap(), o);
        assert!(NeuronOrder::load(&dir.join("l.safetensors"), 2, 2, 4).unwrap_err().to_string().contains("from Some(3)"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
