//! `runtime plan`: the operating point a budget gets and the decode rate the windowed roofline
//! ([`crate::roofline`]) predicts for it on a device ([`formats::device::DeviceFile`]), with the
//! prediction's parts; and the rate it predicts for llama.cpp on a GGUF at the same budget.
//!
//! Bytes per token by Budgeting Bytes' address classes, for our runtime:
//! - A0, known at sampling: the token's embedding row (resident: read from memory).
//! - A1, known after an early layer: the shared predictor's sets (known after layer 0), read
//!   from storage when not held; their window reaches from layer 1 to the layer's use.
//! - A2, known inside their layer: the scorer's down rows, or the whole records the sketch
//!   and the per-layer predictors choose (known once the layer has ranked its neurons from its
//!   input), read when not held; their window is the sum over the rows already held.
//! - A3, always read: everything resident (attention, norms, the head, the scorer's gate/up,
//!   dense layers, held rows): read from memory, which is the compute time.
//!
//! Compute time is bytes touched over the device's `decode_bytes_per_s`, spread evenly over
//! the layers. A missing row is one request (neighbours that coalesce make fewer), served at the
//! device's rate for its size at the queue depth a layer's batch reaches. The share of needed
//! rows already held (reuse) depends on the text: give a measured one (`runtime bench` prints
//! it); else the preparation's reuse table for the plan's strategy (simulated on calibration
//! text at prepare, `runtime::reuse`) at the plan's set and slot sizes; else the planner assumes
//! the needed set is independent of what is held (reuse = held / n_ff, a floor: sets of
//! consecutive tokens overlap more).

use crate::roofline::{exposed_with_stalls_s, Transfer};
use crate::stream::StreamingEngine;
use formats::device::DeviceFile;
use serde::Serialize;

/// Bytes per token by address class.
#[derive(Debug, Clone, Serialize)]
pub struct ClassBytes {
    /// The token's embedding row (from memory).
    pub a0_memory: u64,
    /// Rows known after layer 0 (the shared predictor's), read from storage.
    pub a1_storage: u64,
    /// Rows known inside their layer (the scorer's, the sketch's and the per-layer predictors'), read
    /// from storage.
    pub a2_storage: u64,
    /// Read from memory every token.
    pub a3_memory: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Prediction {
    pub budget_bytes: Option<u64>,
    pub planned_bytes: u64,
    pub minimum_bytes: u64,
    pub selector: String,
    /// What `set_scale` is a share of ("n_ff", "K_max").
    pub set_unit: &'static str,
    pub dense_prefix: usize,
    pub set_scale: f64,
    pub mean_set_rows: f64,
    pub mean_slots: f64,
    pub reuse: f64,
    /// "given" or "assumed: held / n_ff" or "every row held".
    pub reuse_source: String,
    pub bytes_per_token: ClassBytes,
    pub requests_per_token: f64,
    pub read_bytes: usize,
    pub queue_depth: u32,
    /// Device time per request at that size and depth.
    pub request_s: f64,
    pub compute_s_per_token: f64,
    pub compute_source: String,
    pub io_s_per_token: f64,
    /// The roofline's exposed I/O: the largest window deficit (Theorem 1) for reads known
    /// early (A1); for reads known inside their layer (A2) each layer's deficit, added up.
    pub exposed_io_s_per_token: f64,
    pub predicted_tok_per_s: f64,
}

/// Class A3, the bytes a token reads from memory: everything planned but the slots, the KV
/// cache, staging and the process, plus the rows each token sums (held or just read): its sets,
/// or with the whole-record strategies every held record, whose gate and up rows give each its
/// exact h. (The scorer's held down rows are left out: its compute is calibrated by
/// probe-storage's measurement with this count.)
pub fn memory_bytes_per_token(p: &crate::stream::MemoryPlan, choice: crate::stream::SelectorChoice) -> u64 {
    let summed = if choice.sums_held_records() { &p.capacity } else { &p.set_sizes };
    let rows_summed: u64 = summed.iter().map(|&k| (k * p.slot_row_bytes) as u64).sum();
    p.resident_bytes
        + p.head_artifact_bytes
        + p.prefix_records_bytes
        + p.predictor_bytes
        + p.ranking_rows_bytes
        + rows_summed
}

/// The prediction for a streamed run whose engine (plan, slots, selector) is `e`;
/// `embed_row_bytes`: one row of the stored embedding. `reuse`: the measured share of needed
/// rows already held, if known.
pub fn predict(
    e: &StreamingEngine,
    model_name: &str,
    n_ff: usize,
    embed_row_bytes: u64,
    device: &DeviceFile,
    reuse: Reuse,
) -> Prediction {
    predict_plan(&e.plan, e.choice, &e.rule(), e.read_span_bytes, model_name, n_ff, embed_row_bytes, device, reuse)
}

/// What the planner knows of the share of needed rows already held.
#[derive(Clone, Copy)]
pub enum Reuse<'a> {
    /// Measured (`runtime bench` prints it).
    Given(f64),
    /// The preparation's table (`prep`'s reuse stage), for the strategies it simulated.
    Table(&'a formats::reuse_table::ReuseTable),
    /// Needed sets independent of what is held: held / n_ff, a floor.
    Assumed,
}

/// [`predict`] from a memory plan (a preparation's, or a shape's), its strategy and its rule's
/// name (the reuse table's and the device file's key).
#[allow(clippy::too_many_arguments)]
pub fn predict_plan(
    p: &crate::stream::MemoryPlan,
    choice: crate::stream::SelectorChoice,
    rule: &str,
    read_span_bytes: usize,
    model_name: &str,
    n_ff: usize,
    embed_row_bytes: u64,
    device: &DeviceFile,
    reuse: Reuse,
) -> Prediction {
    // reads known at their layer (A2), or after layer 0 (A1)
    let in_layer = choice.chooses_at_layer();
    let n_sparse = p.set_sizes.len();
    // the sparse layers run to the last
    let n_layers = p.dense_prefix + n_sparse;
    let held_all = p.capacity.iter().all(|&c| c >= n_ff);
    let mean_slots = p.capacity.iter().sum::<usize>() as f64 / n_sparse.max(1) as f64;
    let mean_set = p.set_sizes.iter().sum::<usize>() as f64 / n_sparse.max(1) as f64;
    let (set_share, slot_share) = (mean_set / n_ff as f64, mean_slots / n_ff as f64);
    let tabled = match reuse {
        Reuse::Table(t) => t.at(rule, set_share, slot_share).map(|r| {
            (
                r,
                t.tokens,
                match choice {
                    crate::stream::SelectorChoice::Scorer { .. } => {
                        format!(", resident bonus {}", t.scorer_resident_bonus)
                    }
                    _ => String::new(),
                },
            )
        }),
        _ => None,
    };
    let (reuse, reuse_source) = match (reuse, tabled) {
        (Reuse::Given(r), _) => (r, "given".to_string()),
        _ if held_all => (1.0, "every row held (after the first tokens)".to_string()),
        (_, Some((r, tokens, bonus))) => (r, format!("the preparation's reuse table at sets {set_share:.3} and slots {slot_share:.3} of n_ff ({tokens} tokens simulated{bonus})")),
        _ => (slot_share, "assumed: held / n_ff (needed sets independent of held rows; a floor)".to_string()),
    };
    let a3 = memory_bytes_per_token(p, choice);
    // measured on this device for this model (probe-storage --manifest), scaled by the bytes
    // this plan touches; else the bytes over the device's decode rate
    let measured = device.models.iter().find(|m| m.model == model_name && m.selector == rule);
    let (compute_s, compute_source) = match measured {
        Some(m) => (
            m.compute_s_per_token * a3 as f64 / m.memory_bytes_per_token,
            "measured on the device (probe-storage --manifest)",
        ),
        None => (a3 as f64 / device.decode_bytes_per_s, "A3 bytes / decode_bytes_per_s"),
    };
    let per_layer_s = compute_s / n_layers as f64;
    let mut transfers = Vec::with_capacity(n_sparse);
    let (mut requests, mut storage_bytes, mut io_s) = (0f64, 0f64, 0f64);
    let mut qd_max = 1u32;
    let mut request_s = 0f64;
    for (i, &k) in p.set_sizes.iter().enumerate() {
        let layer = p.dense_prefix + i;
        let missing = k as f64 * (1.0 - reuse);
        let qd = (missing.ceil() as u32).clamp(1, 256);
        let rs = device.request_s(read_span_bytes as u64, qd);
        qd_max = qd_max.max(qd);
        request_s = rs;
        let service = missing * rs;
        requests += missing;
        storage_bytes += missing * read_span_bytes as f64;
        io_s += service;
        // the layer's MLP is its second half; the held rows' sum is the window an A2 read has
        let mlp_start = (layer as f64 + 0.5) * per_layer_s;
        let held_sum_s = k as f64 * reuse * p.slot_row_bytes as f64 / device.decode_bytes_per_s;
        let (release, deadline) =
            if in_layer { (mlp_start, mlp_start + held_sum_s) } else { (per_layer_s, mlp_start + held_sum_s) };
        transfers.push(Transfer { release_s: release, deadline_s: deadline, service_s: service });
    }
    let exposed = exposed_with_stalls_s(&transfers);
    // landing the rows read is compute-thread work (measured per row where the device has it)
    let compute_s = compute_s + requests * measured.map_or(0.0, |m| m.landed_row_s);
    Prediction {
        budget_bytes: p.budget_bytes,
        planned_bytes: p.total_bytes,
        minimum_bytes: p.minimum_bytes,
        selector: rule.to_string(),
        set_unit: choice.set_unit(),
        dense_prefix: p.dense_prefix,
        set_scale: p.set_scale,
        mean_set_rows: mean_set,
        mean_slots,
        reuse,
        reuse_source,
        bytes_per_token: ClassBytes {
            a0_memory: embed_row_bytes,
            a1_storage: if in_layer { 0 } else { storage_bytes.round() as u64 },
            a2_storage: if in_layer { storage_bytes.round() as u64 } else { 0 },
            a3_memory: a3,
        },
        requests_per_token: requests,
        read_bytes: read_span_bytes,
        queue_depth: qd_max,
        request_s,
        compute_s_per_token: compute_s,
        compute_source: compute_source.to_string(),
        io_s_per_token: io_s,
        exposed_io_s_per_token: exposed,
        predicted_tok_per_s: 1.0 / (compute_s + exposed),
    }
}

/// A GGUF as llama.cpp reads it per token.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct LlamaCppFile {
    pub file_bytes: u64,
    /// The bytes one decoded token reads: the file, less an untied token embedding (llama.cpp
    /// fetches one row of it a token; tied, it is the head and read whole).
    pub per_token_bytes: u64,
    pub n_vocab: u64,
}

impl LlamaCppFile {
    /// From a GGUF's header and tensor table.
    pub fn open(path: &std::path::Path) -> crate::Result<Self> {
        let g = formats::gguf::GgufFile::open(path)?;
        let file_bytes = std::fs::metadata(path)
            .map_err(|e| crate::RuntimeError::Io { path: path.to_path_buf(), offset: None, source: e })?
            .len();
        let embed = g.tensor("token_embd.weight").ok_or_else(|| {
            crate::RuntimeError::Input(format!(
                "{}: no token_embd.weight: not a llama.cpp language model",
                path.display()
            ))
        })?;
        let n_vocab = embed.ne.get(1).copied().unwrap_or(0);
        Ok(Self::new(file_bytes, embed.n_bytes, g.tensor("output.weight").is_some(), n_vocab))
    }

    /// A token reads the whole file but an untied token embedding (one row of it); tied, the
    /// embedding is the head and read whole.
    fn new(file_bytes: u64, embedding_bytes: u64, untied: bool, n_vocab: u64) -> Self {
        LlamaCppFile { file_bytes, per_token_bytes: file_bytes - if untied { embedding_bytes } else { 0 }, n_vocab }
    }

    /// A published GGUF of a known shape: its token embedding at the type's bits per weight
    /// (a K-quant mix keeps the embedding at its base type).
    pub fn of_shape(config: &formats::model_dir::ModelConfig, quant: &str, file_bytes: u64) -> Self {
        let bits_per_weight = match quant {
            "F16" => 16.0,
            "Q8_0" => 8.5,
            "Q6_K" => 6.5625,
            "Q5_K_M" | "Q5_K_S" => 5.5,
            "Q4_K_M" | "Q4_K_S" => 4.5,
            "Q3_K_M" | "Q3_K_S" | "Q3_K_L" => 3.4375,
            _ => 2.625,
        };
        let embed = (config.vocab_size * config.hidden_size) as f64 * bits_per_weight / 8.0;
        Self::new(file_bytes, embed as u64, !config.tie_word_embeddings, config.vocab_size as u64)
    }

    /// llama.cpp's memory beside the file's pages and the KV cache: its binary, heap and compute
    /// buffers, and the tokenizer's tables (vocabulary and merges). Measured here as peak RSS
    /// less the file in unconfined runs (`bench/results/frontier-*.json`): Qwen2.5-Coder-1.5B
    /// (151,936 tokens) 68 MB, SmolLM2-135M (49,152) 33.5 MB; a line through the two.
    pub fn process_bytes(&self) -> u64 {
        LLAMA_CPP_PROCESS_BASE_BYTES + LLAMA_CPP_PROCESS_BYTES_PER_TOKEN * self.n_vocab
    }
}

pub const LLAMA_CPP_PROCESS_BASE_BYTES: u64 = 17_000_000;
pub const LLAMA_CPP_PROCESS_BYTES_PER_TOKEN: u64 = 336;

/// The share of a token's bytes llama.cpp re-reads when they exceed the page cache's room by
/// `excess` (a share of them): c sqrt(excess), at most all of them. A cyclic walk through an
/// LRU cache that is short by any amount would re-read everything; the kernel's active list
/// keeps part of the file from token to token, less as the excess grows. Fitted to the measured
/// disk reads of llama.cpp's confined runs on this machine (Linux 6, cgroup v1; Qwen2.5-Coder-1.5B
/// F16..Q2_K at 15-75% of F16, 146 runs): median error 8% of the bytes re-read (RESULTS #18
/// part 6).
pub const LLAMA_CPP_REREAD_COEFFICIENT: f64 = 1.6;

/// llama.cpp on a GGUF under a budget: bandwidth-bound (its per-token bytes over its decode
/// rate, `llama_cpp_decode_bytes_per_s` else ours, plus its per-token overhead) when they fit beside its KV cache
/// and process; otherwise each token re-reads a share of them (LLAMA_CPP_REREAD_COEFFICIENT)
/// at the rate page faults read (`DeviceFile::fault_read_bytes_per_s`).
#[derive(Debug, Clone, Serialize)]
pub struct LlamaCppPrediction {
    pub file_bytes: u64,
    pub per_token_bytes: u64,
    /// The budget less the KV cache and llama.cpp's process (None: no budget).
    pub room_bytes: Option<u64>,
    pub fits: bool,
    pub reread_bytes_per_token: u64,
    pub fault_read_bytes_per_s: f64,
    pub predicted_tok_per_s: f64,
}

pub fn predict_llama_cpp(
    file: &LlamaCppFile,
    kv_cache_bytes: u64,
    budget_bytes: Option<u64>,
    device: &DeviceFile,
) -> LlamaCppPrediction {
    let w = file.per_token_bytes;
    let room = budget_bytes.map(|b| b.saturating_sub(kv_cache_bytes + file.process_bytes()));
    let excess = room.map_or(0, |r| w.saturating_sub(r));
    let reread = if excess == 0 {
        0
    } else {
        (w as f64 * (LLAMA_CPP_REREAD_COEFFICIENT * (excess as f64 / w as f64).sqrt()).min(1.0)).round() as u64
    };
    let compute = w as f64 / device.llama_cpp_decode_bytes_per_s.unwrap_or(device.decode_bytes_per_s)
        + device.llama_cpp_token_overhead_s;
    let rate = device.fault_read_bytes_per_s();
    let io = reread as f64 / rate;
    LlamaCppPrediction {
        file_bytes: file.file_bytes,
        per_token_bytes: w,
        room_bytes: room,
        fits: excess == 0,
        reread_bytes_per_token: reread,
        fault_read_bytes_per_s: rate,
        predicted_tok_per_s: 1.0 / (compute + io),
    }
}

/// A public model shape the planner can size without its weights: as a native preparation of
/// its Q4_K_M GGUF would hold it (Q4_K attention, gate/up and embedding, Q6_K head, records of
/// Q4_K gate/up rows and a Q8_0 down row, layer 0 dense), with the published sizes of its GGUFs.
pub struct KnownShape {
    pub name: &'static str,
    pub config: formats::model_dir::ModelConfig,
    pub tokenizer_bytes: u64,
    /// (llama.cpp type, file bytes) as published (TheBloke's and QuantFactory's GGUFs).
    pub ggufs: Vec<(&'static str, u64)>,
}

pub const KNOWN_SHAPES: [&str; 2] = ["mistral-7b", "llama-3-8b"];

pub fn known_shape(name: &str) -> Option<KnownShape> {
    let cfg = |vocab: usize, rope_theta: f64, max_pos: usize| formats::model_dir::ModelConfig {
        model_type: "llama".into(),
        architectures: vec!["LlamaForCausalLM".into()],
        hidden_size: 4096,
        intermediate_size: 14336,
        num_hidden_layers: 32,
        num_attention_heads: 32,
        num_key_value_heads: Some(8),
        head_dim: None,
        rms_norm_eps: 1e-5,
        rope_theta,
        vocab_size: vocab,
        max_position_embeddings: max_pos,
        tie_word_embeddings: false,
        bos_token_id: Some(1),
        eos_token_id: None,
        rope_scaling: None,
        torch_dtype: None,
    };
    let gb = |x: f64| (x * 1e9) as u64;
    match name {
        "mistral-7b" => Some(KnownShape {
            name: "mistral-7b",
            config: cfg(32000, 10000.0, 32768),
            tokenizer_bytes: 1_800_000,
            ggufs: vec![
                ("F16", gb(14.48)),
                ("Q8_0", gb(7.70)),
                ("Q4_K_M", gb(4.37)),
                ("Q3_K_M", gb(3.52)),
                ("Q2_K", gb(3.08)),
            ],
        }),
        "llama-3-8b" => Some(KnownShape {
            name: "llama-3-8b",
            config: cfg(128256, 500000.0, 8192),
            tokenizer_bytes: 9_100_000,
            ggufs: vec![
                ("F16", gb(16.07)),
                ("Q8_0", gb(8.54)),
                ("Q4_K_M", gb(4.92)),
                ("Q3_K_M", gb(4.02)),
                ("Q2_K", gb(3.18)),
            ],
        }),
        _ => None,
    }
}

/// The plan of a known shape under `settings` as `--strategy auto` would run it: every layer
/// dense where the whole model fits (the rule "dense"), else the scorer (every layer after
/// layer 0 sparse, as `fit` sizes it); the bytes one read takes, and an embedding row's.
pub fn shape_plan(
    k: &KnownShape,
    settings: &crate::stream::StreamSettings,
) -> crate::Result<(crate::stream::MemoryPlan, crate::stream::SelectorChoice, &'static str, usize, u64)> {
    use formats::ggml_quants::GgmlType;
    let c = &k.config;
    let (d, n_ff, layers, vocab) = (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size);
    let kv = c.n_kv_heads() * c.head_dim();
    let q4k = |n: usize| (n / 256 * 144) as u64;
    let q6k = |n: usize| (n / 256 * 210) as u64;
    // what Q4_K rows interleaved for decode add (`model::decode_held_bytes`): 32 bytes of
    // unpacked scales a group of 8 rows x 256 columns
    let q4k_layout =
        |n: usize| if crate::ops::interleaved::supports(GgmlType::Q4K) { (n / 2048 * 32) as u64 } else { 0 };
    let embed = q4k(vocab * d);
    let head = q6k(vocab * d);
    let attention_per_layer = q4k(2 * d * d + 2 * kv * d) + 2 * (d as u64) * 4;
    let d0 = 1;
    let dense_mlp = d0 as u64 * q4k(3 * d * n_ff);
    let shape = formats::records::RecordShape { d_model: d, gate_up: GgmlType::Q4K, down: GgmlType::Q8_0 };
    let inputs = crate::stream::budget::PlanInputs {
        label: k.name.to_string(),
        config: c.clone(),
        d0,
        default_dense_from: d0,
        resident_file_bytes: embed + head + layers as u64 * attention_per_layer + dense_mlp + d as u64 * 4,
        resident_layout_bytes: layers as u64 * q4k_layout(2 * d * d + 2 * kv * d)
            + d0 as u64 * q4k_layout(3 * d * n_ff),
        head: crate::stream::budget::ResidentHead {
            embed_bytes: embed,
            head_bytes: head,
            head_layout_bytes: 0,
            head_quantized: true,
        },
        tokenizer_bytes: k.tokenizer_bytes,
        record_bytes: shape.record_bytes(),
        shape: Some(shape),
        // the Q4_K_M file's own MLPs: gate/up Q4_K, down Q6_K in llama.cpp's `use_more_bits`
        // layers (the first and last eighth, and every third between), else Q4_K
        dense_mlp_layer_bytes: Some(
            (d0..layers)
                .map(|l| {
                    let more_bits = l < layers / 8 || l >= 7 * layers / 8 || (l - layers / 8) % 3 == 2;
                    2 * (q4k(d * n_ff) + q4k_layout(d * n_ff))
                        + if more_bits { q6k(d * n_ff) } else { q4k(d * n_ff) + q4k_layout(d * n_ff) }
                })
                .collect(),
        ),
    };
    let dense_settings = crate::stream::StreamSettings {
        selector: crate::stream::SelectorChoice::Dense,
        head: crate::model::HeadChoice::Resident,
        ..settings.clone()
    };
    let dense = crate::select::dense::DenseSelector { n_layers: layers };
    let dense_footprint = crate::stream::budget::Sizing::of(&dense);
    let dense_sizing = crate::stream::budget::Sizing {
        footprint: &dense_footprint,
        slot_row: crate::select::SetSelector::slot_row(&dense),
    };
    match crate::stream::MemoryPlan::for_settings(&inputs, &dense_sizing, &dense_settings) {
        Ok(plan) if settings.mem_budget_bytes.is_some() => {
            return Ok((
                plan,
                crate::stream::SelectorChoice::Dense,
                "dense",
                shape.record_bytes(),
                embed / vocab as u64,
            ))
        }
        Ok(_) | Err(crate::RuntimeError::BudgetTooSmall { .. }) => {}
        Err(e) => return Err(e),
    }
    let gate_up_row = shape.gate_up_row_bytes() as u64;
    let footprint = move |first: usize| crate::select::Footprint {
        predictor_bytes: 0,
        centroid_bytes: 0,
        ranking_rows_bytes: (layers - first.max(d0)) as u64 * n_ff as u64 * 2 * gate_up_row,
        full_sets: vec![n_ff; layers - first.max(d0)],
        set_unit: "n_ff",
        min_set_scale: crate::select::MIN_SCORER_SHARE,
        fit_tries_prefixes: false,
    };
    let sizing = crate::stream::budget::Sizing { footprint: &footprint, slot_row: crate::select::SlotRow::Down };
    let plan = crate::stream::MemoryPlan::fit(&inputs, &sizing, settings)?;
    let scorer = crate::stream::SelectorChoice::Scorer { resident_bonus: crate::scorer::SCORER_RESIDENT_BONUS };
    Ok((plan, scorer, "scorer", shape.down_section_bytes(), embed / vocab as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use formats::device::ReadRate;
    use formats::gguf::{write_gguf, GgufTensorData, GgufValue};

    fn device() -> DeviceFile {
        DeviceFile {
            name: "t".into(),
            source: "test".into(),
            threads: 2,
            memory_bandwidth_bytes_per_s: 1e10,
            decode_bytes_per_s: 1e9,
            // page faults: 128 KiB at depth 4 (2 threads), 0.5 GB/s
            reads: vec![
                ReadRate { block_bytes: 131072, queue_depth: 1, iops: 1000.0 },
                ReadRate { block_bytes: 131072, queue_depth: 4, iops: 5e8 / 131072.0 },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn llama_cpp_rereads_a_share_that_grows_as_the_square_root_of_the_excess() {
        let w = 1_000_000_000u64;
        let file = LlamaCppFile { file_bytes: w + 5_000, per_token_bytes: w, n_vocab: 0 };
        let process = LLAMA_CPP_PROCESS_BASE_BYTES;
        let d = device();
        // no budget, and a budget the bytes just fit: bandwidth-bound, 1 s a token
        for budget in [None, Some(w + process)] {
            let p = predict_llama_cpp(&file, 0, budget, &d);
            assert!(p.fits && p.reread_bytes_per_token == 0 && (p.predicted_tok_per_s - 1.0).abs() < 1e-12, "{p:?}");
        }
        // 1% short: 1.6 x sqrt(0.01) = 16% of the bytes re-read at 0.5 GB/s: 1 + 0.32 s
        let p = predict_llama_cpp(&file, 0, Some(w + process - w / 100), &d);
        assert_eq!(p.reread_bytes_per_token, 160_000_000, "{p:?}");
        assert!(!p.fits && (p.predicted_tok_per_s - 1.0 / 1.32).abs() < 1e-9, "{p:?}");
        // the KV cache takes room too
        let q = predict_llama_cpp(&file, w / 100, Some(w + process), &d);
        assert_eq!(q.reread_bytes_per_token, p.reread_bytes_per_token);
        // 40% short and beyond: every byte, once (1 + 2 s)
        for short in [w * 2 / 5, w, 10 * w] {
            let p = predict_llama_cpp(&file, 0, Some((w + process).saturating_sub(short)), &d);
            assert_eq!(p.reread_bytes_per_token, w);
            assert!((p.predicted_tok_per_s - 1.0 / 3.0).abs() < 1e-9, "{p:?}");
        }
        // llama.cpp's own decode rate, when calibrated, replaces ours
        let mut d = device();
        d.llama_cpp_decode_bytes_per_s = Some(2e9);
        assert!((predict_llama_cpp(&file, 0, None, &d).predicted_tok_per_s - 2.0).abs() < 1e-9);
    }

    #[test]
    fn a_ggufs_untied_embedding_is_not_read_per_token() {
        let dir = std::env::temp_dir().join(format!("np-plan-gguf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f32_tensor = |name: &str, ne: Vec<u64>| {
            let n: u64 = ne.iter().product();
            GgufTensorData { name: name.into(), ne, ggml_type_id: 0, bytes: vec![0u8; n as usize * 4] }
        };
        let md = vec![("general.architecture".to_string(), GgufValue::String("llama".into()))];
        let tied = dir.join("tied.gguf");
        write_gguf(
            &tied,
            &md,
            &[f32_tensor("token_embd.weight", vec![32, 8]), f32_tensor("blk.0.ffn_up.weight", vec![32, 64])],
        )
        .unwrap();
        let untied = dir.join("untied.gguf");
        write_gguf(
            &untied,
            &md,
            &[
                f32_tensor("token_embd.weight", vec![32, 8]),
                f32_tensor("blk.0.ffn_up.weight", vec![32, 64]),
                f32_tensor("output.weight", vec![32, 8]),
            ],
        )
        .unwrap();
        let t = LlamaCppFile::open(&tied).unwrap();
        assert_eq!((t.per_token_bytes, t.n_vocab), (t.file_bytes, 8), "tied: the embedding is the head, read whole");
        let u = LlamaCppFile::open(&untied).unwrap();
        assert_eq!(u.per_token_bytes, u.file_bytes - 32 * 8 * 4);
        let none = dir.join("none.gguf");
        write_gguf(&none, &md, &[f32_tensor("blk.0.ffn_up.weight", vec![32, 64])]).unwrap();
        let e = LlamaCppFile::open(&none).unwrap_err().to_string();
        assert!(e.contains("none.gguf") && e.contains("token_embd"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
