//! `MemoryPlan`: sizes everything from the manifest and `--mem-budget` before anything is
//! loaded, and refuses a budget it cannot meet with the minimum it would need.
//!
//! Counted: resident.safetensors (mapped and all of it touched: embeddings, attention, norms,
//! head, dense-prefix MLPs), the MLPs of the layers `dense_prefix..dense_from` that run dense
//! from rows loaded once out of records.bin, the predictor (f16) and the centroid table, the KV
//! cache for `--ctx`, the staging buffer, a fixed allowance for the process (code, tokenizer,
//! activations), and the slot buffers. Each sparse layer needs at least K_max slots; what the
//! budget leaves beyond that is spread evenly (in bytes) over the sparse layers, up to every
//! neuron. [`MemoryPlan::fit`] picks the largest `dense_from` (up to the manifest's default)
//! whose plan fits the budget.

use super::engine::StreamSettings;
use crate::error::{Result, RuntimeError};
use crate::predictor::Predictor;
use formats::centroids::CentroidTable;
use formats::manifest::Manifest;
use serde::Serialize;
use std::path::Path;

/// Process allowance: code, allocator, activations, the tokenizer's tables (plus 4x the size of
/// tokenizer.json and the RoPE table). Measured with `runtime bench` on SmolLM2 and Qwen2.5: see
/// README.
pub const PROCESS_BASE_BYTES: u64 = 40 << 20;

#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    pub budget_bytes: Option<u64>,
    pub resident_bytes: u64,
    /// Layers `dense_from..` are sparse; `dense_prefix..dense_from` run dense from records.
    pub dense_from: usize,
    /// MLP weights of the layers `dense_prefix..dense_from`, loaded from records.bin.
    pub dense_from_records_bytes: u64,
    pub predictor_bytes: u64,
    pub centroid_bytes: u64,
    pub kv_cache_bytes: u64,
    pub staging_bytes: usize,
    pub process_bytes: u64,
    pub record_bytes: usize,
    /// Bytes of one slot: a neuron's gate, up and downT rows (f16).
    pub slot_row_bytes: usize,
    /// Slots per sparse layer.
    pub capacity: Vec<usize>,
    pub slot_bytes: u64,
    /// The smallest budget that runs (every buffer at K_max).
    pub minimum_bytes: u64,
    pub total_bytes: u64,
}

impl MemoryPlan {
    /// The plan with the manifest's default dense prefix lowered as far as the budget needs
    /// (never below its `dense_prefix`); without a budget, the default.
    pub fn fit(manifest_path: &Path, m: &Manifest, predictor: &Predictor, centroids: &CentroidTable, s: &StreamSettings) -> Result<Self> {
        let (d0, default) = (m.sparsity.dense_prefix, m.sparsity.default_dense_from());
        let mut minimum_at_default = None;
        for l in (d0..=default).rev() {
            match Self::new(manifest_path, m, predictor, centroids, s, l) {
                Ok(p) => return Ok(p),
                Err(RuntimeError::BudgetTooSmall { minimum, .. }) if l > d0 => {
                    minimum_at_default.get_or_insert(minimum);
                }
                // even every layer after dense_prefix sparse does not fit: say both minimums
                Err(RuntimeError::BudgetTooSmall { budget, minimum, breakdown }) => {
                    let breakdown = match minimum_at_default {
                        Some(md) => format!("{breakdown}; with every layer from {d0} sparse (at the default dense prefix {default}: {} MiB)", md >> 20),
                        None => breakdown,
                    };
                    return Err(RuntimeError::BudgetTooSmall { budget, minimum, breakdown });
                }
                Err(e) => return Err(e),
            }
        }
        unreachable!("the loop ends at dense_prefix with Ok or Err")
    }

    /// The plan with layers `dense_from..` sparse (`dense_prefix <= dense_from <= n_layers`).
    pub fn new(manifest_path: &Path, m: &Manifest, predictor: &Predictor, centroids: &CentroidTable, s: &StreamSettings, dense_from: usize) -> Result<Self> {
        let size = |role: &str| -> Result<u64> {
            let p = m.artifact_path_of(manifest_path, role)?;
            Ok(std::fs::metadata(&p).map_err(|e| formats::FormatError::io(&p, e))?.len())
        };
        let c = &m.model;
        let rb = m.records.record_bytes;
        // An untied input embedding is only read a row per token (its address is known once the
        // token is sampled: Budgeting Bytes' class A0): its rows fault in from the mapped file on
        // use and are not held, so it is not counted. A tied one is the output head: all of it.
        let embed_bytes = (c.vocab_size * c.hidden_size * 2) as u64;
        let untied_embedding_bytes = if c.tie_word_embeddings { 0 } else { embed_bytes };
        let resident_bytes = size("resident")? - untied_embedding_bytes + if c.tie_word_embeddings { 0 } else { 4 << 20 };
        let predictor_bytes = predictor.n_bytes() as u64;
        let centroid_bytes: u64 = centroids.columns.values().map(|c| c.bits.len() as u64 + c.k as u64 * 64).sum();
        let kv_cache_bytes = (2 * c.num_hidden_layers * s.ctx * c.n_kv_heads() * c.head_dim() * 4) as u64;
        let staging_bytes = s.staging_bytes.max(rb).div_ceil(4096) * 4096;
        // the process: code, activations, the tokenizer's tables, and the RoPE cos/sin table
        // (f32, every position the model supports: Model::load builds it whole)
        let rope_bytes = (2 * c.max_position_embeddings.min(crate::model::ROPE_MAX_POSITIONS) * (c.head_dim() / 2) * 4) as u64;
        let process_bytes = PROCESS_BASE_BYTES + 4 * size("tokenizer")? + rope_bytes;
        let (d0, n_layers) = (m.sparsity.dense_prefix, c.num_hidden_layers);
        if dense_from < d0 || dense_from > n_layers {
            return Err(RuntimeError::Input(format!(
                "{}: dense prefix {dense_from}: this preparation has records and predictor heads for layers {d0}..{n_layers}, so it can run layers {d0}..={n_layers} sparse from",
                manifest_path.display()
            )));
        }
        let srb = 3 * c.hidden_size * 2;
        let dense_from_records_bytes = ((dense_from - d0) * c.intermediate_size * srb) as u64;
        let fixed = resident_bytes + dense_from_records_bytes + predictor_bytes + centroid_bytes + kv_cache_bytes + staging_bytes as u64 + process_bytes;
        let k_max = &m.sparsity.k_max[dense_from - d0..];
        let min_slots: u64 = k_max.iter().map(|&k| (k * srb) as u64).sum();
        let minimum_bytes = fixed + min_slots;
        let n_ff = c.intermediate_size;
        let capacity: Vec<usize> = match s.mem_budget_bytes {
            None => vec![n_ff; k_max.len()],
            Some(b) if b < minimum_bytes => {
                return Err(RuntimeError::BudgetTooSmall {
                    budget: b,
                    minimum: minimum_bytes,
                    breakdown: format!(
                        "resident {} MiB, dense layers {d0}..{dense_from} from records {} MiB, predictor {:.1} MiB, centroids {:.1} MiB, KV cache for ctx {} {:.1} MiB, staging {:.1} MiB, process {} MiB, K_max slots {:.1} MiB",
                        resident_bytes >> 20, dense_from_records_bytes >> 20, predictor_bytes as f64 / 1048576.0, centroid_bytes as f64 / 1048576.0, s.ctx, kv_cache_bytes as f64 / 1048576.0,
                        staging_bytes as f64 / 1048576.0, process_bytes >> 20, min_slots as f64 / 1048576.0
                    ),
                });
            }
            Some(b) => {
                let extra_rows_per_layer = ((b - minimum_bytes) / k_max.len().max(1) as u64 / srb as u64) as usize;
                k_max.iter().map(|&k| (k + extra_rows_per_layer).min(n_ff)).collect()
            }
        };
        let slot_bytes: u64 = capacity.iter().map(|&c| (c * srb) as u64).sum();
        Ok(MemoryPlan {
            budget_bytes: s.mem_budget_bytes,
            resident_bytes,
            dense_from,
            dense_from_records_bytes,
            predictor_bytes,
            centroid_bytes,
            kv_cache_bytes,
            staging_bytes,
            process_bytes,
            record_bytes: rb,
            slot_row_bytes: srb,
            capacity,
            slot_bytes,
            minimum_bytes,
            total_bytes: fixed + slot_bytes,
        })
    }
}

/// Parses a size: `155MiB`, `1.5GiB`, `500MB`, `4096` (bytes).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.trim().parse().map_err(|_| format!("'{s}': expected a size like 155MiB, 1.5GiB or 500MB"))?;
    let mult: f64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1.0,
        "k" | "kib" => 1024.0,
        "kb" => 1e3,
        "m" | "mib" => 1048576.0,
        "mb" => 1e6,
        "g" | "gib" => 1073741824.0,
        "gb" => 1e9,
        other => return Err(format!("'{s}': unknown unit '{other}' (B, KiB, MiB, GiB, KB, MB, GB)")),
    };
    Ok((v * mult) as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes() {
        assert_eq!(super::parse_bytes("155MiB").unwrap(), 155 << 20);
        assert_eq!(super::parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(super::parse_bytes("500MB").unwrap(), 500_000_000);
        assert!(super::parse_bytes("lots").is_err());
    }
}
