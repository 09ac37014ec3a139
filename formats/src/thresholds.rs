//! `thresholds.json`: per-layer activation-magnitude thresholds written by `prep capture`.
//! A neuron of layer l is active for a token when its magnitude reaches the layer's threshold:
//! `product`: |silu(g) * u| >= product[l]; `gate-up`: |silu(g)| >= gate[l] and |u| >= up[l].

use crate::error::{FormatError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum MaskKind {
    Product,
    GateUp,
}

impl std::str::FromStr for MaskKind {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "product" => Ok(MaskKind::Product),
            "gate-up" => Ok(MaskKind::GateUp),
            other => Err(format!("mask kind '{other}': expected product or gate-up")),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Thresholds {
    pub mask_kind: MaskKind,
    pub alpha: f64,
    pub tokens_sampled: usize,
    /// `product`: t_l on |silu(g) * u|. Empty for `gate-up`.
    pub product: Vec<f32>,
    /// `gate-up`: t_l on |silu(g)| and on |u|. Empty for `product`.
    pub gate: Vec<f32>,
    pub up: Vec<f32>,
}

impl Thresholds {
    pub fn n_layers(&self) -> usize {
        match self.mask_kind {
            MaskKind::Product => self.product.len(),
            MaskKind::GateUp => self.gate.len(),
        }
    }

    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| FormatError::io(path, e))?;
        let t: Thresholds =
            serde_json::from_str(&text).map_err(|source| FormatError::Json { path: path.to_path_buf(), source })?;
        if t.mask_kind == MaskKind::GateUp && t.gate.len() != t.up.len() {
            return Err(FormatError::invalid(path, "gate and up threshold lists differ in length"));
        }
        Ok(t)
    }

    /// Is neuron (g, u) of `layer` active?
    #[inline]
    pub fn active(&self, layer: usize, gate_silu: f32, up: f32) -> bool {
        match self.mask_kind {
            MaskKind::Product => (gate_silu * up).abs() >= self.product[layer],
            MaskKind::GateUp => gate_silu.abs() >= self.gate[layer] && up.abs() >= self.up[layer],
        }
    }
}
