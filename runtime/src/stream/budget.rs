//! `MemoryPlan`: sizes everything from the manifest and `--mem-budget` before anything is
//! loaded, and refuses a budget it cannot meet with the minimum it would need.
//!
//! Counted: resident.safetensors (all of it touched: embeddings, attention, norms, head,
//! dense-prefix MLPs; each tensor at its stored size, f16 or GGML blocks, plus what laying a
//! matrix out for decode adds: `model::decode_held_bytes`), the MLPs of the layers `d0..dense_prefix` (d0: the prepared prefix) that run dense
//! from rows loaded once out of records.bin, the predictor (f16) and the centroid table, the KV
//! cache for `--ctx`, the staging buffer, a fixed allowance for the process (code, tokenizer,
//! activations), and the slot buffers. Each sparse layer needs at least as many slots as its
//! set size (K_max, or K_max x `--set-scale`); what the budget leaves beyond that is spread
//! evenly (in bytes) over the sparse layers, up to every neuron. [`MemoryPlan::fit`] picks the
//! largest `dense_prefix` (up to the manifest's default) whose plan fits the budget, and when even
//! every layer after the dense prefix sparse does not fit, the largest set scale (down to
//! [`crate::select::MIN_SET_SCALE`]) that does.

use super::engine::{DensePrefix, StreamSettings};
use crate::error::{Result, RuntimeError};
use crate::select::SetSelector;
use formats::manifest::Manifest;
use serde::Serialize;
use std::path::Path;

/// Process allowance: code, allocator, activations (RoPE holds no table, ops::rope); the
/// tokenizer's tables come on top ([`TOKENIZER_BYTES_PER_FILE_BYTE`]). Measured with `runtime
/// bench` on SmolLM2 and Qwen2.5 (docs/RESULTS.md, the planner).
pub const PROCESS_BASE_BYTES: u64 = 40 << 20;

/// Resident bytes of a loaded tokenizer per byte of its tokenizer.json (the HF tokenizers
/// crate's vocabulary and merge tables, after the parse's freed pages are trimmed): 10.0 for
/// Qwen2.5's, 11.9 for SmolLM2's, rounded up.
pub const TOKENIZER_BYTES_PER_FILE_BYTE: u64 = 12;

/// The input embedding and the output head as resident.safetensors stores them (f16, or a
/// GGUF's own blocks: Q4_K, Q6_K, ...).
#[derive(Debug, Clone, Copy)]
pub struct ResidentHead {
    pub embed_bytes: u64,
    /// The output head: `lm_head`, or the embedding when tied.
    pub head_bytes: u64,
    /// What laying an untied head out for decode adds to its stored bytes (a tied one stays
    /// mapped: it is also the embedding).
    pub head_layout_bytes: u64,
    /// The head is GGML blocks (so no larger than the Q8_0 head: the scorer keeps it).
    pub head_quantized: bool,
}

impl ResidentHead {
    pub fn of(manifest_path: &Path, m: &Manifest) -> Result<Self> {
        let p = m.artifact_path_of(manifest_path, "resident")?;
        let f = formats::safetensors_io::MappedSafetensors::open(&p)?;
        let entry = |name: &str| f.tensors.get(name);
        let embed = entry(formats::model_dir::EMBED_TOKENS).ok_or_else(|| formats::FormatError::MissingTensor {
            path: p.clone(),
            tensor: formats::model_dir::EMBED_TOKENS.into(),
        })?;
        let head = entry(formats::model_dir::LM_HEAD).unwrap_or(embed);
        let head_layout_bytes = match entry(formats::model_dir::LM_HEAD) {
            Some(h) => crate::model::decode_held_bytes(h) - h.byte_range.len() as u64,
            None => 0,
        };
        Ok(ResidentHead {
            embed_bytes: embed.byte_range.len() as u64,
            head_bytes: head.byte_range.len() as u64,
            head_layout_bytes,
            head_quantized: head.ggml.is_some(),
        })
    }
}

/// What a plan is sized from: a preparation's files ([`PlanInputs::of`]), or a model's shape
/// alone (`runtime plan --shape`, [`crate::plan::shape_inputs`]).
#[derive(Debug, Clone)]
pub struct PlanInputs {
    /// Names the preparation in messages.
    pub label: String,
    pub config: formats::model_dir::ModelConfig,
    /// The prepared dense prefix, and the default first sparse layer.
    pub d0: usize,
    pub default_dense_from: usize,
    pub resident_file_bytes: u64,
    /// What laying resident.safetensors' matrices out for decode adds to their stored bytes,
    /// the embedding and the head aside (`model::decode_held_bytes`).
    pub resident_layout_bytes: u64,
    pub head: ResidentHead,
    pub tokenizer_bytes: u64,
    pub record_bytes: usize,
    /// Version-2 records' layout (None: version 1, f16).
    pub shape: Option<formats::records::RecordShape>,
    /// Layers `d0..n_layers`: the bytes each one's MLP from `dense_mlp.safetensors` (the
    /// GGUF's blocks) holds when the layer runs dense, laid out for decode; None without that
    /// artifact (a dense layer is rebuilt from its records).
    pub dense_mlp_layer_bytes: Option<Vec<u64>>,
}

impl PlanInputs {
    pub fn of(manifest_path: &Path, m: &Manifest) -> Result<Self> {
        let size = |role: &str| -> Result<u64> {
            let p = m.artifact_path_of(manifest_path, role)?;
            Ok(std::fs::metadata(&p).map_err(|e| formats::FormatError::io(&p, e))?.len())
        };
        Ok(PlanInputs {
            label: manifest_path.display().to_string(),
            config: m.model.clone(),
            d0: m.sparsity.dense_prefix,
            default_dense_from: m.sparsity.default_dense_from(),
            resident_file_bytes: size("resident")?,
            resident_layout_bytes: resident_layout_bytes(&m.artifact_path_of(manifest_path, "resident")?)?,
            head: ResidentHead::of(manifest_path, m)?,
            tokenizer_bytes: size("tokenizer")?,
            record_bytes: m.records.record_bytes,
            shape: crate::model::records_shape(manifest_path, m)?,
            dense_mlp_layer_bytes: match m.artifacts.iter().find(|a| a.role == formats::dense_mlp::ARTIFACT_ROLE) {
                Some(a) => {
                    let c = &m.model;
                    Some(formats::dense_mlp::layer_bytes(
                        &m.artifact_path(manifest_path, a),
                        m.sparsity.dense_prefix,
                        c.num_hidden_layers,
                        c.intermediate_size,
                        c.hidden_size,
                        crate::model::decode_held_bytes,
                    )?)
                }
                None => None,
            },
        })
    }
}

/// What laying the matrices of resident.safetensors (`path`) out for decode adds to their stored
/// bytes, the embedding and the head aside ([`ResidentHead`] counts those).
fn resident_layout_bytes(path: &Path) -> Result<u64> {
    let f = formats::safetensors_io::MappedSafetensors::open(path)?;
    Ok(f.tensors
        .iter()
        .filter(|(name, _)| ![formats::model_dir::EMBED_TOKENS, formats::model_dir::LM_HEAD].contains(&name.as_str()))
        .map(|(_, e)| crate::model::decode_held_bytes(e) - e.byte_range.len() as u64)
        .sum())
}

/// What a plan needs of a set selector: its footprint from a first sparse layer on, and what
/// one slot holds.
pub struct Sizing<'a> {
    pub footprint: &'a dyn Fn(usize) -> crate::select::Footprint,
    pub slot_row: crate::select::SlotRow,
}

impl<'a> Sizing<'a> {
    pub fn of(sel: &'a dyn SetSelector) -> impl Fn(usize) -> crate::select::Footprint + 'a {
        move |d| sel.footprint(d)
    }
}

/// The fewest prompt tokens a streamed run computes at once (the minimum budget holds their
/// activations), and the most.
pub const PROMPT_BATCH_MIN: usize = 16;
pub const PROMPT_BATCH_MAX: usize = 512;

/// Activations of a batch of `n` prompt tokens: the forward pass's buffers (`model::DecodeState`),
/// attention's output copy, and the activations quantized for the weights' kernels.
pub fn prompt_activation_bytes(c: &formats::model_dir::ModelConfig, n: usize) -> u64 {
    let hd = c.head_dim();
    let (d, ff, q, kv) = (c.hidden_size, c.intermediate_size, c.num_attention_heads * hd, c.n_kv_heads() * hd);
    (n * ((3 * d + 3 * q + 2 * kv + 2 * ff) * 4 + 2 * (d + ff))) as u64
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryPlan {
    pub budget_bytes: Option<u64>,
    /// resident.safetensors as held (without its head when the logits come from another).
    pub resident_bytes: u64,
    /// The Q8_0 or 4-bit output head the logits come from (0: the resident one).
    pub head_artifact_bytes: u64,
    /// Layers `dense_prefix..` are sparse; `d0..dense_prefix` (d0: the prepared prefix) run
    /// dense from records.
    pub dense_prefix: usize,
    /// MLP weights of the layers `d0..dense_prefix`: mapped from dense_mlp.safetensors (the
    /// GGUF's blocks), or rebuilt from records.bin without it.
    pub prefix_records_bytes: u64,
    pub predictor_bytes: u64,
    pub centroid_bytes: u64,
    /// The resident gate/up rows that rank the sparse layers' neurons (the scorer's, the sketch's; else 0).
    pub ranking_rows_bytes: u64,
    pub kv_cache_bytes: u64,
    pub staging_bytes: usize,
    /// Prompt tokens a batch computes beside full slots: what `prompt_bytes` holds (the plan's
    /// share of the budget for prompts).
    pub prompt_batch_min: usize,
    /// Prompt tokens a batch computes (a streamed layer's whole MLP is read once per batch):
    /// the slots are emptied while a prompt runs and filled after it
    /// (`StreamingEngine::begin_prompt_batches`, `warm_slots`), so the batches also have the
    /// slots' whole pages ([`MemoryPlan::prompt_batches`]).
    pub prompt_batch: usize,
    /// Streamed layers' MLPs a prompt batch holds staged at once: 1, or 2 (the next one's read
    /// overlaps the compute of the one before).
    pub prompt_staged_layers: usize,
    /// A prompt batch of `prompt_batch_min` tokens: its staged MLPs and its activations (after
    /// the batches, the warm slots' reads land in these bytes, two layers' rows at a time).
    pub prompt_bytes: u64,
    pub process_bytes: u64,
    /// What the program around the engine holds for its input (the server's requests).
    pub host_bytes: u64,
    pub record_bytes: usize,
    /// Bytes of one slot: a neuron's gate, up and downT rows (f16), or its downT row alone
    /// with the scorer.
    pub slot_row_bytes: usize,
    /// Neurons kept per sparse layer, as a share of K_max (of n_ff with the scorer), and the
    /// resulting set sizes.
    pub set_scale: f64,
    pub set_sizes: Vec<usize>,
    /// Slots per sparse layer (>= its set size).
    pub capacity: Vec<usize>,
    pub slot_bytes: u64,
    /// The smallest budget that runs at this prefix and set scale (every buffer at its set size).
    pub minimum_bytes: u64,
    pub total_bytes: u64,
}

impl MemoryPlan {
    /// The batches a prompt of `len` tokens runs in: as few as [`Self::prompt_batch`] allows,
    /// of even sizes (every batch reads each streamed layer's MLP once).
    pub fn prompt_batches(&self, len: usize) -> Vec<usize> {
        split_prompt(len, self.prompt_batch)
    }

    /// The plan `s.dense_prefix` asks for: [`MemoryPlan::fit`], a given layer, or the
    /// manifest's default dense prefix.
    pub fn for_settings(inputs: &PlanInputs, sel: &Sizing, s: &StreamSettings) -> Result<Self> {
        let (d0, default) = (inputs.d0, inputs.default_dense_from);
        if s.selector == super::SelectorChoice::Dense {
            // no sparse layer: every layer dense (its sets and prefix are not the user's to set)
            return Self::new(inputs, sel, s, inputs.config.num_hidden_layers, 1.0);
        }
        match s.dense_prefix {
            DensePrefix::Fit => Self::fit(inputs, sel, s),
            DensePrefix::Layer(l) => Self::new(inputs, sel, s, l, s.set_scale),
            DensePrefix::Default => Self::new(inputs, sel, s, default, s.set_scale).map_err(|e| match e {
                RuntimeError::BudgetTooSmall { budget, minimum, breakdown } if default > d0 => RuntimeError::BudgetTooSmall {
                    budget,
                    minimum,
                    breakdown: format!("{breakdown} (at the default dense prefix {default}; a fit dense prefix runs more layers sparse, down to layer {d0})"),
                },
                e => e,
            }),
        }
    }

    /// The plan with the manifest's default dense prefix lowered as far as the budget needs
    /// (never below its `dense_prefix`), then, with every layer after it sparse, the set scale
    /// lowered (from `s.set_scale`, in steps of 0.01, never below [`crate::select::MIN_SET_SCALE`]); without a
    /// budget, the default.
    pub fn fit(inputs: &PlanInputs, sel: &Sizing, s: &StreamSettings) -> Result<Self> {
        let (d0, default) = (inputs.d0, inputs.default_dense_from);
        let mut minimum_at_default = None;
        let mut refusal = None;
        let fp = (sel.footprint)(d0);
        // a selector whose held rows all count (the scorer) gets more from memory as slots of
        // sparse layers than as dense layers: it goes straight to every layer from d0 sparse
        let prefixes = if fp.fit_tries_prefixes { d0..=default } else { d0..=d0 };
        for l in prefixes.rev() {
            match Self::new(inputs, sel, s, l, s.set_scale) {
                Ok(p) => return Ok(p),
                Err(RuntimeError::BudgetTooSmall { budget, minimum, breakdown }) => {
                    minimum_at_default.get_or_insert(minimum);
                    refusal = Some((budget, minimum, breakdown, s.set_scale));
                }
                Err(e) => return Err(e),
            }
        }
        // every layer after dense_prefix sparse does not fit: smaller sets, in steps of 0.01
        let minimum_all_sparse = refusal.as_ref().map_or(0, |r| r.1);
        let (floor, unit) = (fp.min_set_scale, fp.set_unit);
        let floor_pct = (floor * 100.0).round() as u32;
        for pct in (floor_pct..(s.set_scale * 100.0).round() as u32).rev() {
            let scale = pct as f64 / 100.0;
            match Self::new(inputs, sel, s, d0, scale) {
                Ok(p) => return Ok(p),
                Err(RuntimeError::BudgetTooSmall { budget, minimum, breakdown }) => {
                    refusal = Some((budget, minimum, breakdown, scale))
                }
                Err(e) => return Err(e),
            }
        }
        let (budget, minimum, breakdown, scale) = refusal.expect("the prefix loop runs at least once");
        let mut also = format!(
            "every layer from {d0} sparse with sets of {scale:.2} x {unit} (the smallest a fit dense prefix tries)"
        );
        if scale < s.set_scale {
            also += &format!("; at {:.2} x {unit}: {} MiB", s.set_scale, minimum_all_sparse >> 20);
        }
        if let Some(md) = minimum_at_default.filter(|_| default > d0 && fp.fit_tries_prefixes) {
            also += &format!("; at the default dense prefix {default}: {} MiB", md >> 20);
        }
        Err(RuntimeError::BudgetTooSmall { budget, minimum, breakdown: format!("{breakdown}; {also}") })
    }

    /// The plan with layers `dense_prefix..` sparse (the prepared prefix <= dense_prefix <= n_layers).
    /// Each sparse layer keeps `set_scale` (0 < s <= 1) of its K_max neurons per token.
    pub fn new(
        inputs: &PlanInputs,
        sel: &Sizing,
        s: &StreamSettings,
        dense_prefix: usize,
        set_scale: f64,
    ) -> Result<Self> {
        let fp = (sel.footprint)(dense_prefix.min(inputs.config.num_hidden_layers));
        let unit = fp.set_unit;
        if !(set_scale > 0.0 && set_scale <= 1.0) {
            return Err(RuntimeError::Input(format!("set scale {set_scale}: expected a share of {unit} in (0, 1]")));
        }
        let rh = &inputs.head;
        let c = &inputs.config;
        let rb = inputs.record_bytes;
        // An untied input embedding is only read a row per token (its address is known once the
        // token is sampled: Budgeting Bytes' class A0): its rows fault in from the mapped file on
        // use and are not held, so it is not counted. A tied one is the output head: all of it.
        let untied_embedding_bytes = if c.tie_word_embeddings { 0 } else { rh.embed_bytes };
        // With the Q8_0 or 4-bit head the resident head is never read (a tied embedding is then
        // read a row per token, as an untied one): that head takes its place.
        let own_head = s.head != crate::model::HeadChoice::Resident;
        let resident_head_bytes = if own_head { rh.head_bytes } else { 0 };
        // (a row-read embedding's rows are read into a buffer of one row, `Model::embed`)
        let resident_bytes = inputs.resident_file_bytes - untied_embedding_bytes - resident_head_bytes
            + inputs.resident_layout_bytes
            + if own_head { 0 } else { rh.head_layout_bytes };
        let head_artifact_bytes = match s.head {
            crate::model::HeadChoice::Resident => 0,
            crate::model::HeadChoice::Q8 => formats::head_q8::Q8Head::bytes_for(c.vocab_size, c.hidden_size),
            crate::model::HeadChoice::Compact => formats::head_compact::bytes_for(c.vocab_size, c.hidden_size)
                .ok_or_else(|| {
                    RuntimeError::Input(format!("{}: d_model {} has no 4-bit head", inputs.label, c.hidden_size))
                })?,
        };
        let (predictor_bytes, centroid_bytes, ranking_rows_bytes) =
            (fp.predictor_bytes, fp.centroid_bytes, fp.ranking_rows_bytes);
        let kv_cache_bytes = kv_cache_bytes(c, s.ctx);
        let staging_bytes = s.io.staging_bytes.max(rb).div_ceil(4096) * 4096;
        // the process: code, activations and the tokenizer's tables
        let process_bytes = PROCESS_BASE_BYTES + TOKENIZER_BYTES_PER_FILE_BYTE * inputs.tokenizer_bytes;
        let (d0, n_layers) = (inputs.d0, c.num_hidden_layers);
        if dense_prefix < d0 || dense_prefix > n_layers {
            return Err(RuntimeError::Input(format!(
                "{}: dense prefix {dense_prefix}: this preparation has records and predictor heads for layers {d0}..{n_layers}, so it can run layers {d0}..={n_layers} sparse from",
                inputs.label
            )));
        }
        let shape = inputs.shape;
        // a layer run dense from records: f16 rows (version 1), or its gate/up blocks and an f16
        // down matrix rebuilt from the Q8_0 columns (version 2)
        let full_row_bytes = match shape {
            None => crate::select::SlotRow::GateUpDown.bytes(c.hidden_size),
            Some(s) => 2 * s.gate_up_row_bytes() + 2 * c.hidden_size,
        };
        let srb = sel.slot_row.bytes_in(c.hidden_size, shape);
        let prefix_records_bytes = match &inputs.dense_mlp_layer_bytes {
            Some(per_layer) => per_layer[..dense_prefix - d0].iter().sum(),
            None => ((dense_prefix - d0) * c.intermediate_size * full_row_bytes) as u64,
        };
        let prefix_from = if inputs.dense_mlp_layer_bytes.is_some() { "the GGUF's blocks" } else { "records" };
        // a prompt batch stages streamed layers' whole MLPs, the GGUF's blocks or records read
        // and rebuilt: one at a time, or two (the one computed and the next one read)
        let (stage_first, stage_second) = if dense_prefix == n_layers {
            (0, 0)
        } else {
            match &inputs.dense_mlp_layer_bytes {
                Some(per_layer) => {
                    let layer = per_layer[dense_prefix - d0..].iter().max().copied().unwrap_or(0) + 3 * 4096;
                    (layer, layer)
                }
                None => {
                    let built = (c.intermediate_size * full_row_bytes) as u64;
                    (built + (c.intermediate_size * rb + 4096) as u64, built)
                }
            }
        };
        let prompt_bytes_at =
            |n: usize, staged: u64| stage_first + (staged - 1) * stage_second + prompt_activation_bytes(c, n);
        let fixed = resident_bytes
            + head_artifact_bytes
            + prefix_records_bytes
            + predictor_bytes
            + centroid_bytes
            + ranking_rows_bytes
            + kv_cache_bytes
            + staging_bytes as u64
            + prompt_bytes_at(PROMPT_BATCH_MIN, 1)
            + process_bytes
            + s.host_bytes;
        let set_sizes = crate::predictor::scaled_set_sizes(&fp.full_sets, set_scale);
        let min_slots: u64 = set_sizes.iter().map(|&k| (k * srb) as u64).sum();
        let minimum_bytes = fixed + min_slots;
        let n_ff = c.intermediate_size;
        // a prompt takes up to an eighth of what the budget leaves beyond the minimum (the rest
        // goes to slots): first a second staged layer (its read overlaps the compute of the one
        // before), then larger batches (every streamed MLP is read once per batch)
        let (prompt_staged_layers, prompt_batch_min) = match s.mem_budget_bytes {
            None => (2, PROMPT_BATCH_MAX),
            Some(b) => {
                let spare = b.saturating_sub(minimum_bytes) / 8;
                let base = prompt_bytes_at(PROMPT_BATCH_MIN, 1);
                let staged = if prompt_bytes_at(PROMPT_BATCH_MIN, 2) - base <= spare { 2 } else { 1 };
                let mut n = PROMPT_BATCH_MIN;
                while n < PROMPT_BATCH_MAX && prompt_bytes_at(2 * n, staged) - base <= spare {
                    n *= 2;
                }
                (staged as usize, n)
            }
        };
        let prompt_bytes = prompt_bytes_at(prompt_batch_min, prompt_staged_layers as u64);
        let fixed = fixed - prompt_bytes_at(PROMPT_BATCH_MIN, 1) + prompt_bytes;
        let capacity: Vec<usize> = match s.mem_budget_bytes {
            None => match s.slot_share {
                None => vec![n_ff; set_sizes.len()],
                Some(c) => {
                    let rows = (c * n_ff as f64).round() as usize;
                    set_sizes.iter().map(|&k| rows.clamp(k, n_ff)).collect()
                }
            },
            Some(b) if b < minimum_bytes => {
                return Err(RuntimeError::BudgetTooSmall {
                    budget: b,
                    minimum: minimum_bytes,
                    breakdown: format!(
                        "resident {} MiB{}, dense layers {d0}..{dense_prefix} from {prefix_from} {} MiB, {}, KV cache for a context of {} {:.1} MiB, staging {:.1} MiB, prompt batches of {PROMPT_BATCH_MIN} tokens {:.1} MiB, process {} MiB{}, slots for sets of {:.2} x {unit} {:.1} MiB",
                        resident_bytes >> 20,
                        if own_head { format!(" + {} head {} MiB", s.head.label().0, head_artifact_bytes >> 20) } else { String::new() },
                        prefix_records_bytes >> 20,
                        if ranking_rows_bytes > 0 {
                            format!("resident ranking rows (scorer or sketch) {:.1} MiB", ranking_rows_bytes as f64 / 1048576.0)
                        } else {
                            format!("predictor {:.1} MiB, centroids {:.1} MiB", predictor_bytes as f64 / 1048576.0, centroid_bytes as f64 / 1048576.0)
                        },
                        s.ctx, kv_cache_bytes as f64 / 1048576.0,
                        staging_bytes as f64 / 1048576.0, prompt_bytes_at(PROMPT_BATCH_MIN, 1) as f64 / 1048576.0, process_bytes >> 20,
                        if s.host_bytes > 0 { format!(", the server's requests {:.1} MiB", s.host_bytes as f64 / 1048576.0) } else { String::new() },
                        set_scale, min_slots as f64 / 1048576.0
                    ),
                });
            }
            Some(b) => {
                let extra_rows_per_layer =
                    ((b - fixed - min_slots) / set_sizes.len().max(1) as u64 / srb as u64) as usize;
                set_sizes.iter().map(|&k| (k + extra_rows_per_layer).min(n_ff)).collect()
            }
        };
        let slot_bytes: u64 = capacity.iter().map(|&c| (c * srb) as u64).sum();
        // a sequence's prompt runs before any slot is filled: the slots' whole pages go to the
        // batches before its last (which warms the slots)
        let page = super::aligned::DIRECT_ALIGN_BYTES;
        let slot_pages_bytes: u64 = capacity.iter().map(|&c| (c * srb / page * page) as u64).sum();
        // the largest batch (in steps of the smallest) the prompt's bytes and the emptied
        // slots' pages hold
        let mut prompt_batch = prompt_batch_min;
        while prompt_batch + PROMPT_BATCH_MIN <= PROMPT_BATCH_MAX
            && prompt_bytes_at(prompt_batch + PROMPT_BATCH_MIN, prompt_staged_layers as u64)
                <= prompt_bytes + slot_pages_bytes
        {
            prompt_batch += PROMPT_BATCH_MIN;
        }
        Ok(MemoryPlan {
            budget_bytes: s.mem_budget_bytes,
            resident_bytes,
            head_artifact_bytes,
            dense_prefix,
            prefix_records_bytes,
            predictor_bytes,
            centroid_bytes,
            ranking_rows_bytes,
            kv_cache_bytes,
            staging_bytes,
            prompt_batch_min,
            prompt_batch,
            prompt_staged_layers,
            prompt_bytes,
            process_bytes,
            host_bytes: s.host_bytes,
            record_bytes: rb,
            slot_row_bytes: srb,
            set_scale,
            set_sizes,
            capacity,
            slot_bytes,
            minimum_bytes,
            total_bytes: fixed + slot_bytes,
        })
    }
}

/// `len` prompt tokens in as few batches of at most `max` as there can be, their sizes within
/// one token of each other.
fn split_prompt(len: usize, max: usize) -> Vec<usize> {
    let n = len.div_ceil(max.max(1));
    (0..n).map(|i| len / n + usize::from(i < len % n)).collect()
}

/// The KV cache of `ctx` positions (f16 keys and values of every layer, [`crate::kv_cache`]).
pub fn kv_cache_bytes(c: &formats::model_dir::ModelConfig, ctx: usize) -> u64 {
    (2 * c.num_hidden_layers * ctx * c.n_kv_heads() * c.head_dim() * crate::kv_cache::KV_VALUE_BYTES) as u64
}

/// Parses a size: `155MiB`, `1.5GiB`, `500MB`, `4096` (bytes).
pub fn parse_bytes(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num
        .trim()
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| format!("'{s}': expected a size like 155MiB, 1.5GiB or 500MB"))?;
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
    // (a size past what a u64 holds is a typo, not a budget: never clamped)
    let bytes = v * mult;
    if bytes >= u64::MAX as f64 {
        return Err(format!("'{s}': more bytes than any machine has"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    #[test]
    fn prompt_batches() {
        use super::split_prompt;
        assert_eq!(split_prompt(100, 32), vec![25, 25, 25, 25]);
        assert_eq!(split_prompt(96, 32), vec![32, 32, 32]);
        assert_eq!(split_prompt(396, 432), vec![396]);
        assert_eq!(split_prompt(511, 432), vec![256, 255]);
        assert_eq!(split_prompt(1100, 512), vec![367, 367, 366]);
        assert_eq!(split_prompt(17, 16), vec![9, 8]);
        assert!(split_prompt(0, 16).is_empty());
        for (len, max) in [(511, 256), (1000, 64), (33, 32), (1, 16)] {
            let b = split_prompt(len, max);
            assert_eq!((b.iter().sum::<usize>(), b.len()), (len, len.div_ceil(max)));
            assert!(b.iter().all(|&n| n > 0 && n <= max) && b[0] - b[b.len() - 1] <= 1);
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(super::parse_bytes("155MiB").unwrap(), 155 << 20);
        assert_eq!(super::parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(super::parse_bytes("500MB").unwrap(), 500_000_000);
        assert!(super::parse_bytes("lots").is_err());
        assert!(super::parse_bytes("18446744073709551616").unwrap_err().contains("more bytes"));
        assert!(super::parse_bytes("1e30GiB").is_err());
        for bad in ["-5", "-1MiB", "NaN", "inf", "1e400GiB"] {
            assert!(super::parse_bytes(bad).is_err(), "{bad}");
        }
    }
}
