//! `StreamingEngine`: the sparse layers' MLP rows live in `records.bin`; each sparse layer has
//! a buffer of row slots (at least its set size; the memory plan spreads what the budget
//! leaves). A [`SetSelector`] chooses each token's neurons, after layer 0 for every sparse layer
//! (the shared predictor) or at each layer from its own input (the 4-bit scorer); the layer's
//! [`SlotMap`] gives the missing rows; the one I/O thread ([`IoThread`]) reads them while the
//! engine adds up the rows the layer already holds; then the read rows go to their slots and
//! are added too. `Model::decode_step` calls [`StreamingEngine::mlp`] for each streamed layer.

use super::aligned::AlignedBuf;
use super::budget::MemoryPlan;
use super::io::{IoThread, LayerReads, RowSpan};
use super::prompt::{PromptStager, StageSource};
use super::reader::{ReaderOptions, RecordReader};
use crate::error::{Result, RuntimeError};
use crate::ops::down_sum::{down_sum, down_sum_blocks};
use crate::ops::record_sum::RecordRows;
use crate::predictor::{NeuronRank, SetRule};
use crate::select::{predicted::PredictedSelector, scored::ScoredSelector, SetSelector, SlotRow};
use crate::slots::{Load, SlotMap};
use half::f16;
use rayon::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// One sparse layer's slots: which neuron each holds, and their rows.
struct LayerSlots {
    map: SlotMap,
    /// `[capacity, slot row]` f16: a neuron's gate, up and downT rows, or its downT row alone
    /// ([`SlotRow`]).
    buf: AlignedBuf,
}

impl LayerSlots {
    fn rows(&self) -> &[f16] {
        bytemuck::cast_slice(self.buf.as_slice())
    }
}

/// Per sparse layer counters.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LayerStreamStats {
    pub layer: usize,
    pub capacity: usize,
    pub tokens: u64,
    pub rows_needed: u64,
    pub rows_loaded: u64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct StreamStats {
    pub tokens: u64,
    pub rows_needed: u64,
    pub rows_loaded: u64,
    pub bytes_read: u64,
    pub read_requests: u64,
    pub io_wait_ms: f64,
    /// Choosing sets: the predictor after layer 0, or the scorer or a ranker at each layer.
    pub choose_ms: f64,
    /// Adding up the sparse layers' rows (overlapped with their reads, then the read rows).
    pub sparse_compute_ms: f64,
    /// Wall time the I/O thread spent reading and checking.
    pub io_busy_ms: f64,
    /// Rows whose product was added, over tokens and layers.
    pub computed_rows: u64,
    /// Prompt tokens computed in batches, each streamed layer's whole MLP staged.
    pub prompt_tokens: u64,
    /// Bytes those batches staged from storage.
    pub prompt_bytes_read: u64,
    /// Time the prompt batches waited for a staged layer.
    pub prompt_wait_ms: f64,
    /// Rows read into slots after a prompt (warm slots), over layers, and the time that took;
    /// the bytes, requests and waits of those reads (also in `bytes_read`, `read_requests` and
    /// `io_wait_ms`, which count every read).
    pub warmed_rows: u64,
    pub warm_ms: f64,
    pub warm_bytes_read: u64,
    pub warm_requests: u64,
    pub warm_io_wait_ms: f64,
    pub layers: Vec<LayerStreamStats>,
}

impl StreamStats {
    /// One token of sparse layer `si`: `needed` rows, of which `loaded` were read.
    fn count_layer(&mut self, si: usize, needed: usize, loaded: usize) {
        let st = &mut self.layers[si];
        st.tokens += 1;
        st.rows_needed += needed as u64;
        st.rows_loaded += loaded as u64;
        self.rows_needed += needed as u64;
        self.rows_loaded += loaded as u64;
    }

    /// Share of needed rows that were already resident.
    pub fn reuse_ratio(&self) -> f64 {
        1.0 - self.rows_loaded as f64 / self.rows_needed.max(1) as f64
    }
}

/// Which [`SetSelector`] a streamed run uses.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SelectorChoice {
    /// The shared predictor with a set rule (soft8 by default).
    Predictor { rule: SetRule },
    /// The resident 4-bit gate/up scorer; a held row counts `resident_bonus` (>= 1) times.
    Scorer { resident_bonus: f32 },
    /// The per-layer predictors (`prep layers`), whole records streamed.
    Layers,
    /// The resident few-bit gate/up sketch ranks, whole records streamed; a held record
    /// ranks at `resident_bonus` (>= 1) times its score.
    Sketch { resident_bonus: f32 },
    /// Each token's exact `|h|` ranks, from every record held in memory (the ceiling at a set
    /// size; whole records, as the sketch).
    Oracle,
    /// No sparse layer: every MLP held and computed dense (`select::dense`).
    Dense,
}

impl SelectorChoice {
    /// Chooses each sparse layer's set from that layer's own input once the layer is reached
    /// (the scorer and the rankers: Budgeting Bytes' class A2), rather than every set after
    /// layer 0 (the shared predictor: A1).
    pub fn chooses_at_layer(self) -> bool {
        match self {
            SelectorChoice::Scorer { .. }
            | SelectorChoice::Layers
            | SelectorChoice::Sketch { .. }
            | SelectorChoice::Oracle => true,
            SelectorChoice::Predictor { .. } | SelectorChoice::Dense => false,
        }
    }

    /// Every record a layer holds is summed, each with its exact h from its own gate and up
    /// rows (the whole-record strategies); otherwise the rows summed are the set's (the
    /// predictor) or down rows alone (the scorer).
    pub fn sums_held_records(self) -> bool {
        self.ranker_kind().is_some()
    }

    /// What a set scale is a share of: each layer's K_max (the predictor) or n_ff.
    pub fn set_unit(self) -> &'static str {
        match self {
            SelectorChoice::Predictor { .. } => "K_max",
            _ => "n_ff",
        }
    }

    /// How many times its score a held row ranks at (1: every row alike).
    pub fn resident_bonus(self) -> f32 {
        match self {
            SelectorChoice::Scorer { resident_bonus } | SelectorChoice::Sketch { resident_bonus } => resident_bonus,
            SelectorChoice::Predictor { .. }
            | SelectorChoice::Layers
            | SelectorChoice::Oracle
            | SelectorChoice::Dense => 1.0,
        }
    }

    /// What ranks a whole-record strategy's neurons (None: the predictor and the scorer).
    pub fn ranker_kind(self) -> Option<crate::layer_predictor::RankerKind> {
        use crate::layer_predictor::RankerKind;
        match self {
            SelectorChoice::Layers => Some(RankerKind::Predictors),
            SelectorChoice::Sketch { .. } => Some(RankerKind::Sketch),
            SelectorChoice::Oracle => Some(RankerKind::Exact),
            SelectorChoice::Predictor { .. } | SelectorChoice::Scorer { .. } | SelectorChoice::Dense => None,
        }
    }
}

impl Default for SelectorChoice {
    fn default() -> Self {
        SelectorChoice::Predictor { rule: SetRule::default() }
    }
}

/// How the reader thread reads: research knobs with measured defaults.
#[derive(Debug, Clone)]
pub struct IoSettings {
    pub queue_depth: usize,
    pub staging_bytes: usize,
    /// Longest coalesced read of whole records.
    pub max_run_bytes: usize,
    /// Bytes between two needed rows that one of the warm slots' reads takes in rather than
    /// ask a second read (they need about a third of a layer's rows; decode's few rows a token
    /// read each alone).
    pub warm_gap_bytes: usize,
    pub force_pread: bool,
    /// Hold records.bin in memory and copy each read from there: every row in memory, for
    /// quality runs that compute exactly what a streamed run computes (no budget).
    pub hold_records_in_memory: bool,
}

impl Default for IoSettings {
    fn default() -> Self {
        IoSettings {
            queue_depth: 256,
            staging_bytes: 8 << 20,
            max_run_bytes: 1 << 20,
            warm_gap_bytes: 8 << 10,
            force_pread: false,
            hold_records_in_memory: false,
        }
    }
}

/// Everything a streamed run is built from; checked once by [`StreamSettings::validate`].
#[derive(Debug, Clone)]
pub struct StreamSettings {
    pub mem_budget_bytes: Option<u64>,
    /// KV cache positions the plan holds.
    pub ctx: usize,
    /// Which layers run sparse (`--dense-prefix`).
    pub dense_prefix: DensePrefix,
    /// Neurons kept per sparse layer, as a share of K_max (`--set-scale`, 0 < s <= 1; of n_ff
    /// with the scorer). With `DensePrefix::Fit`, the largest scale up to this one that fits once
    /// every layer after the prepared prefix is sparse.
    pub set_scale: f64,
    pub selector: SelectorChoice,
    /// The head the logits come from: the plan holds the Q8_0 or 4-bit one instead of the
    /// resident one.
    pub head: crate::model::HeadChoice,
    /// Without a budget: rows each sparse layer holds, as a share of n_ff (at least its set;
    /// None: every row). A budget sizes the slots itself.
    pub slot_share: Option<f64>,
    pub io: IoSettings,
    /// Keep every token's sets in `StreamingEngine::history` (tests, analysis).
    pub record_sets: bool,
    /// Memory the program around the engine holds for its own input, counted in the plan
    /// beside the process allowance: the server's requests (`crate::serve::held_bytes`); 0
    /// for a single run.
    pub host_bytes: u64,
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            mem_budget_bytes: None,
            ctx: 2048,
            dense_prefix: DensePrefix::Default,
            set_scale: 1.0,
            selector: SelectorChoice::default(),
            head: crate::model::HeadChoice::Resident,
            slot_share: None,
            io: IoSettings::default(),
            record_sets: false,
            host_bytes: 0,
        }
    }
}

impl StreamSettings {
    /// Refuses values no run can use, naming the setting.
    pub fn validate(&self) -> Result<()> {
        let bad = |what: String| Err(RuntimeError::Input(what));
        check_share(crate::error::Setting::SetScale, self.set_scale)?;
        if let Some(c) = self.slot_share {
            check_share(crate::error::Setting::SlotShare, c)?;
            if self.mem_budget_bytes.is_some() {
                return bad(format!(
                    "slot share {c}: a memory budget sizes the slots itself (a slot share sizes them without one)"
                ));
            }
        }
        if self.io.hold_records_in_memory && self.mem_budget_bytes.is_some() {
            return bad("records held in memory are every row: not within a memory budget".into());
        }
        if self.ctx == 0 {
            return Err(RuntimeError::Setting {
                setting: crate::error::Setting::Context,
                value: "0".into(),
                why: "the KV cache needs at least one position".into(),
            });
        }
        if let SelectorChoice::Scorer { resident_bonus } = self.selector {
            if !(resident_bonus.is_finite() && resident_bonus >= 1.0) {
                return bad(format!("resident bonus {resident_bonus}: expected a factor >= 1"));
            }
        }
        if self.io.queue_depth == 0 || self.io.queue_depth > 4096 {
            return bad(format!("queue depth {}: expected 1..=4096", self.io.queue_depth));
        }
        if self.io.max_run_bytes == 0 || self.io.staging_bytes == 0 {
            return bad("the staging buffer and the longest read must be at least one byte".into());
        }
        Ok(())
    }
}

/// A share of a layer's neurons (set scale, slot share) must lie in (0, 1].
pub fn check_share(setting: crate::error::Setting, v: f64) -> Result<()> {
    if v > 0.0 && v <= 1.0 {
        return Ok(());
    }
    Err(RuntimeError::Setting { setting, value: v.to_string(), why: "expected a share in (0, 1]".into() })
}

/// Where the sparse layers start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DensePrefix {
    /// The manifest's `default_dense_from`.
    #[default]
    Default,
    /// Layers `L..` sparse (`dense_prefix <= L <= n_layers`).
    Layer(usize),
    /// The largest `L <= default_dense_from` whose memory plan fits the budget.
    Fit,
}

impl std::str::FromStr for DensePrefix {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "fit" => Ok(DensePrefix::Fit),
            "default" => Ok(DensePrefix::Default),
            n => n
                .parse()
                .map(DensePrefix::Layer)
                .map_err(|_| format!("'{s}': expected a layer number, 'fit' or 'default'")),
        }
    }
}

/// The prompt's last tokens (at most this many) choose what each streamed layer's slots hold
/// when decode starts (warm slots). A run that reuses a cached prefix computes at least these
/// again ([`crate::generate::Generator`]), so a reply never depends on what the cache held.
pub const WARM_WINDOW_TOKENS: usize = 256;

pub struct StreamingEngine {
    pub plan: MemoryPlan,
    /// Bytes one needed row's read takes from records.bin (a whole record, or its down row).
    pub read_span_bytes: usize,
    /// The selector this run was built with.
    pub choice: SelectorChoice,
    selector: Box<dyn SetSelector>,
    layers: Vec<LayerSlots>,
    io: IoThread,
    /// Per sparse layer, the current token's loads sent to the reader and not yet landed.
    in_flight: Vec<Vec<Load>>,
    /// The current token's set per sparse layer (ascending).
    sets: Vec<Vec<u32>>,
    /// `[n_ff]` coefficients from a selector that scores at the layer.
    h: Vec<f32>,
    /// Layers below this run dense, the rest sparse (`--dense-prefix`, resolved).
    pub dense_prefix: usize,
    d_model: usize,
    tick: u64,
    pub stats: StreamStats,
    /// Why reads go through pread instead of io_uring + O_DIRECT (None: the fast path).
    pub fallback: Option<String>,
    /// Things the user should know about this run (a missing optional artifact).
    pub notes: Vec<String>,
    pub records_path: PathBuf,
    /// With `record_sets`: every token's sets, `[tokens][sparse layers][neurons]`.
    pub history: Vec<Vec<Vec<u32>>>,
    record_sets: bool,
    /// The decode step's buffers, allocated once (`Model::decode_step`).
    pub(crate) scratch: Option<crate::model::DecodeState>,
    /// How a record's payload is laid out in a slot: a whole record ([`SlotRow::GateUpDown`]),
    /// or its down row alone ([`SlotRow::Down`]: f16, or version 2's down blocks).
    records: RecordRows,
    /// Stages a prompt batch's streamed layers whole.
    stager: PromptStager,
    n_layers: usize,
    /// Per sparse layer `[n_ff]`: each neuron's |coefficient| summed over the sequence's prompt
    /// tokens so far.
    prompt_use: Vec<Vec<f32>>,
    /// The batch's rows from this one on count in `prompt_use`.
    prompt_count_from: usize,
    /// records.bin is held in memory ([`IoSettings::hold_records_in_memory`]).
    records_in_memory: bool,
    /// [`IoSettings::warm_gap_bytes`].
    warm_gap_bytes: usize,
    /// A prompt's batches ended and the warm slots are not filled yet: the next token fills
    /// them first ([`StreamingEngine::warm_after_prompt`]).
    warm_pending: bool,
}

impl StreamingEngine {
    /// Sizes the run (refusing a budget it cannot meet) before anything large is loaded, then
    /// allocates the slots and starts the reader thread.
    pub fn new(
        manifest_path: &Path,
        manifest: &formats::manifest::Manifest,
        settings: &StreamSettings,
    ) -> Result<Self> {
        settings.validate()?;
        crate::map_large_allocations();
        let records_path = manifest.artifact_path_of(manifest_path, "records")?;
        let c = &manifest.model;
        let d0 = manifest.sparsity.dense_prefix;
        let mut notes = Vec::new();
        let mut selector: Box<dyn SetSelector> = match settings.selector {
            SelectorChoice::Predictor { rule } => {
                let (p, note) = PredictedSelector::load(manifest_path, manifest, rule)?;
                notes.extend(note);
                Box::new(p)
            }
            SelectorChoice::Scorer { resident_bonus } => {
                Box::new(ScoredSelector::load(manifest_path, manifest, resident_bonus)?)
            }
            SelectorChoice::Layers | SelectorChoice::Sketch { .. } | SelectorChoice::Oracle => {
                let kind = settings.selector.ranker_kind().expect("the whole-record strategies rank");
                let bonus = settings.selector.resident_bonus();
                Box::new(crate::select::layered::LayeredSelector::load(manifest_path, manifest, kind, bonus)?)
            }
            SelectorChoice::Dense => Box::new(crate::select::dense::DenseSelector { n_layers: c.num_hidden_layers }),
        };
        let plan = {
            let inputs = super::budget::PlanInputs::of(manifest_path, manifest)?;
            let footprint = super::budget::Sizing::of(selector.as_ref());
            let sizing = super::budget::Sizing { footprint: &footprint, slot_row: selector.slot_row() };
            MemoryPlan::for_settings(&inputs, &sizing, settings)?
        };
        let first = plan.dense_prefix;
        let rb = manifest.records.record_bytes;
        let len = std::fs::metadata(&records_path)
            .map_err(|source| RuntimeError::Io { path: records_path.clone(), offset: None, source })?
            .len();
        let want = (manifest.records.count * rb) as u64;
        if len < want {
            return Err(formats::FormatError::Truncated {
                path: records_path.clone(),
                offset: len,
                what: format!("{} records of {rb} bytes", manifest.records.count),
                needed: want,
                file_bytes: len,
            }
            .into());
        }
        if len > want {
            return Err(RuntimeError::Corrupt { path: records_path.clone(), offset: want, what: format!("{} bytes after the {} records of {rb} bytes the manifest describes (not this preparation's records.bin?)", len - want, manifest.records.count) });
        }
        let shape = crate::model::records_shape(manifest_path, manifest)?;
        let span = match (selector.slot_row(), shape) {
            (SlotRow::GateUpDown, Some(shape)) => RowSpan::RecordV2 { shape },
            (SlotRow::Down, Some(shape)) => RowSpan::DownSection { shape },
            (SlotRow::GateUpDown, None) => RowSpan::Record,
            (SlotRow::Down, None) => {
                let crc32c = selector.down_row_crc32c().ok_or_else(|| {
                    RuntimeError::Input(format!(
                        "set rule {}: slots of downT rows need per-row checksums",
                        selector.rule()
                    ))
                })?;
                RowSpan::DownRow { crc32c, first_layer: d0, n_ff: c.intermediate_size }
            }
        };
        selector.keep_layers_from(first);
        let read_span_bytes = super::io::read_span_bytes(selector.slot_row(), shape, rb, c.hidden_size);
        let layers = plan
            .capacity
            .iter()
            .map(|&cap| LayerSlots {
                map: SlotMap::new(c.intermediate_size, cap),
                buf: AlignedBuf::new(cap * plan.slot_row_bytes),
            })
            .collect();
        let reader = RecordReader::open(
            &records_path,
            &ReaderOptions {
                queue_depth: settings.io.queue_depth,
                force_pread: settings.io.force_pread,
                staging_bytes: plan.staging_bytes,
                register_staging: true,
                hold_in_memory: settings.io.hold_records_in_memory,
            },
        )?;
        let records_in_memory = reader.holds_file();
        if records_in_memory {
            notes.push(format!("{}: held in memory ({:.1} MiB)", records_path.display(), len as f64 / 1048576.0));
        }
        let mut fallback = reader.fallback.clone();
        let stage_source = StageSource::of(manifest_path, manifest, &records_path)?;
        let stager = PromptStager::start(stage_source)?;
        if let (None, Some(f)) = (&fallback, &stager.fallback) {
            fallback = Some(format!("prompts: {f}"));
        }
        let n_sparse = c.num_hidden_layers - first;
        let io = IoThread::start(
            reader,
            manifest.records.clone(),
            c.hidden_size,
            span,
            settings.io.max_run_bytes,
            n_sparse,
        )?;
        let stats = StreamStats {
            layers: plan
                .capacity
                .iter()
                .enumerate()
                .map(|(i, &cap)| LayerStreamStats { layer: first + i, capacity: cap, ..Default::default() })
                .collect(),
            ..Default::default()
        };
        Ok(StreamingEngine {
            read_span_bytes,
            records: RecordRows::of(c.hidden_size, shape),
            plan,
            choice: settings.selector,
            selector,
            layers,
            io,
            in_flight: vec![Vec::new(); n_sparse],
            sets: vec![Vec::new(); n_sparse],
            h: vec![0.0; c.intermediate_size],
            dense_prefix: first,
            d_model: c.hidden_size,
            tick: 0,
            stats,
            fallback,
            notes,
            records_path,
            history: Vec::new(),
            record_sets: settings.record_sets,
            scratch: None,
            stager,
            n_layers: c.num_hidden_layers,
            prompt_use: vec![vec![0.0; c.intermediate_size]; n_sparse],
            prompt_count_from: 0,
            records_in_memory,
            // copies from memory gain nothing from reading between rows
            warm_gap_bytes: if records_in_memory { 0 } else { settings.io.warm_gap_bytes },
            warm_pending: false,
        })
    }

    /// A new sequence starts (a request, a perplexity chunk): every slot is emptied and the
    /// selector forgets what it saw, so what a sequence computes depends on its own tokens only,
    /// never on what ran before it.
    pub fn begin_sequence(&mut self) {
        self.warm_pending = false;
        self.empty_slots();
        self.layers.iter_mut().for_each(|l| l.map.heat.fill(0.0));
        self.prompt_use.iter_mut().for_each(|u| u.fill(0.0));
        self.selector.begin_sequence();
    }

    /// Every slot emptied (their heat kept); their memory goes to a prompt's batches until rows
    /// land again.
    fn empty_slots(&mut self) {
        for layer in self.layers.iter_mut() {
            layer.map.empty();
            layer.buf.release_pages();
        }
        for loads in &mut self.in_flight {
            loads.clear();
        }
    }

    /// A prompt's batches start: the slots are emptied, so the batches may use their memory
    /// ([`MemoryPlan::prompt_batches`]); [`StreamingEngine::warm_slots`] fills them after.
    pub fn begin_prompt_batches(&mut self) {
        self.warm_pending = false;
        self.empty_slots();
    }

    /// A prompt batch starts (its rows `count_from..` are in the window that chooses the warm
    /// slots): the first streamed layer's MLP is asked of the stager.
    pub fn begin_prompt(&mut self, count_from: usize) -> Result<()> {
        self.prompt_count_from = count_from;
        self.stager.drain();
        if self.dense_prefix < self.n_layers {
            self.stager.ask(self.dense_prefix)?;
        }
        Ok(())
    }

    /// Streamed layer `layer`'s whole MLP for the prompt batch: the next streamed layer's read
    /// is asked for first, so it overlaps this layer's compute.
    pub fn staged_mlp(&mut self, layer: usize) -> Result<crate::model::DenseMlp> {
        if !self.stager.is_next(layer) {
            return Err(RuntimeError::Internal(format!("layer {layer}'s MLP was not asked of the prompt stager")));
        }
        if self.plan.prompt_staged_layers > 1 && layer + 1 < self.n_layers {
            self.stager.ask(layer + 1)?;
        }
        let t0 = Instant::now();
        let (_, mlp) = self.stager.take()?;
        self.stats.prompt_wait_ms += t0.elapsed().as_secs_f64() * 1e3;
        Ok(mlp)
    }

    /// The batch went through streamed layer `layer`'s staged MLP with coefficients `h`
    /// `[n, n_ff]`: each neuron's use in the window is added up (what the warm slots hold).
    pub fn staged_mlp_done(&mut self, layer: usize, mlp: crate::model::DenseMlp, h: &[f32]) -> Result<()> {
        let use_ = &mut self.prompt_use[layer - self.dense_prefix];
        let n_ff = use_.len();
        let rows = &h[(self.prompt_count_from * n_ff).min(h.len())..];
        // each neuron's sum in token order; neurons in chunks across the pool
        use_.par_chunks_mut(1024).enumerate().for_each(|(c, u)| {
            for row in rows.chunks_exact(n_ff) {
                u.iter_mut().zip(&row[c * 1024..]).for_each(|(u, v)| *u += v.abs());
            }
        });
        drop(mlp);
        // one staged layer at a time: the next one's read starts now that this one is gone
        // (overlapping the next layer's attention)
        if self.plan.prompt_staged_layers == 1 && layer + 1 < self.n_layers {
            self.stager.ask(layer + 1)?;
        }
        Ok(())
    }

    /// A prompt's batches ended: the warm slots fill when the next token starts
    /// ([`StreamingEngine::begin_token`]), so the batches' last logits (a reply's first token)
    /// are out before their reads, and a reply of one token reads none.
    pub fn warm_after_prompt(&mut self) {
        self.warm_pending = true;
    }

    /// Fills the warm slots now if a prompt left them to fill ([`StreamingEngine::warm_after_prompt`]):
    /// each streamed layer's slots hold the rows of the neurons the prompt used most (decode
    /// starts with the prompt's working set), read from records.bin as decode reads rows, one
    /// layer's reads ahead of the one landing. Their reads, requests and waits are counted
    /// apart from decode's (`warm_*` in [`StreamStats`]).
    pub fn warm_slots(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.warm_pending) {
            return Ok(());
        }
        let t0 = Instant::now();
        let (io_before, wait_before) = (self.io.counters(), self.stats.io_wait_ms);
        let r = self.warm_slots_now();
        let io_after = self.io.counters();
        self.stats.warm_bytes_read += io_after.bytes_read - io_before.bytes_read;
        self.stats.warm_requests += io_after.requests - io_before.requests;
        self.stats.warm_io_wait_ms += self.stats.io_wait_ms - wait_before;
        self.stats.warm_ms += t0.elapsed().as_secs_f64() * 1e3;
        r
    }

    fn warm_slots_now(&mut self) -> Result<()> {
        self.tick += 1;
        let n = self.layers.len();
        let mut planned: Vec<Vec<Load>> = Vec::with_capacity(n);
        for si in 0..n {
            let use_ = &self.prompt_use[si];
            let cap = self.layers[si].map.capacity();
            // the most used (ties: the lower neuron), never one the window did not use
            let mut neurons = crate::layer_predictor::top_k(use_, cap);
            neurons.retain(|&j| use_[j as usize] > 0.0);
            let slots = &mut self.layers[si];
            slots.map.empty();
            planned.push(slots.map.plan(&neurons, self.tick));
        }
        let submit = |engine: &mut Self, si: usize, loads: &[Load]| -> Result<()> {
            if loads.is_empty() {
                return Ok(());
            }
            let layer = engine.dense_prefix + si;
            let max_gap_bytes = engine.warm_gap_bytes;
            engine.io.submit(engine.tick, vec![LayerReads { si, layer, loads: loads.to_vec(), max_gap_bytes }])
        };
        let result = (|| -> Result<()> {
            if let Some(first) = planned.first() {
                submit(self, 0, first)?;
            }
            for si in 0..n {
                if si + 1 < n {
                    submit(self, si + 1, &planned[si + 1])?;
                }
                if !planned[si].is_empty() {
                    self.land(si, &planned[si])?;
                    self.stats.warmed_rows += planned[si].len() as u64;
                }
            }
            Ok(())
        })();
        if result.is_err() {
            // rows that did not land must not be summed: the slots start empty instead
            self.empty_slots();
        }
        result
    }

    /// Waits for sparse layer `si`'s `loads` from the reader and copies each row into its slot.
    fn land(&mut self, si: usize, loads: &[Load]) -> Result<()> {
        let slots = &mut self.layers[si];
        let tw = Instant::now();
        let landed = self.io.wait(self.tick, si)?;
        self.stats.io_wait_ms += tw.elapsed().as_secs_f64() * 1e3;
        if let Err(e) = landed.result {
            landed.loads.iter().for_each(|l| slots.map.invalidate(l.slot));
            self.io.recycle(landed.rows);
            return Err(e);
        }
        let rb = self.plan.slot_row_bytes;
        if landed.rows.len() != landed.loads.len() * rb || landed.loads.len() != loads.len() {
            landed.loads.iter().for_each(|l| slots.map.invalidate(l.slot));
            let what = format!(
                "layer {}: the reader landed {} bytes for {} rows of {rb} bytes ({} planned)",
                self.dense_prefix + si,
                landed.rows.len(),
                landed.loads.len(),
                loads.len()
            );
            self.io.recycle(landed.rows);
            return Err(RuntimeError::Internal(what));
        }
        let buf = slots.buf.as_mut_slice();
        for (k, l) in landed.loads.iter().enumerate() {
            let s = l.slot as usize;
            buf[s * rb..(s + 1) * rb].copy_from_slice(&landed.rows[k * rb..(k + 1) * rb]);
        }
        self.io.recycle(landed.rows);
        Ok(())
    }

    /// What sparse layer `si`'s slots hold: (neuron, slot row) for every filled slot.
    pub fn held_rows(&self, si: usize) -> Vec<(u32, &[u8])> {
        let (slots, rb) = (&self.layers[si], self.plan.slot_row_bytes);
        let bytes = slots.buf.as_slice();
        (0..slots.map.capacity())
            .filter(|&s| slots.map.neuron_of[s] != crate::slots::EMPTY)
            .map(|s| (slots.map.neuron_of[s], &bytes[s * rb..(s + 1) * rb]))
            .collect()
    }

    /// Prompt tokens `n` went through in a batch.
    pub fn count_prompt(&mut self, n: usize) {
        self.stats.prompt_tokens += n as u64;
    }

    /// Whether records.bin is held in memory (every row; reads are copies).
    pub fn holds_records(&self) -> bool {
        self.records_in_memory
    }

    /// The set rule ("soft8", "scorer").
    pub fn rule(&self) -> String {
        self.selector.rule()
    }

    /// How cut sets are ranked (None: the scorer, which ranks by its own score).
    pub fn neuron_rank(&self) -> Option<NeuronRank> {
        self.selector.neuron_rank()
    }

    /// Bytes read and requests so far (from the I/O thread).
    pub fn refresh_io_stats(&mut self) {
        let c = self.io.counters();
        self.stats.bytes_read = c.bytes_read;
        self.stats.read_requests = c.requests;
        self.stats.io_busy_ms = c.busy_ms;
        self.stats.prompt_bytes_read = self.stager.bytes_read();
    }

    /// The current token failed part-way (a read, a check, a non-finite value): the slots planned
    /// for rows that have not landed are forgotten, so a later token reads them again instead of
    /// computing from whatever the slot held. The reader's late results for this token are
    /// dropped by [`IoThread::wait`] (their tick is stale).
    pub fn abandon_token(&mut self) {
        for (si, loads) in self.in_flight.iter_mut().enumerate() {
            for l in loads.drain(..) {
                self.layers[si].map.invalidate(l.slot);
            }
        }
    }

    /// A new token starts: the warm slots a prompt left to fill first.
    pub fn begin_token(&mut self) -> Result<()> {
        self.warm_slots()?;
        self.tick += 1;
        self.stats.tokens += 1;
        Ok(())
    }

    /// Layer 0 ran dense: its activations `[n_ff]` (the predictor's layer-0 centroid).
    pub fn observe_first_layer(&mut self, gate_silu: &[f32], up: &[f32]) {
        self.selector.observe_first_layer(gate_silu, up);
    }

    /// The residual stream after layer 0 `[d_model]`: a selector that predicts every sparse
    /// layer's set now has them; their missing rows go to the reader at once, in layer order.
    pub fn after_first_layer(&mut self, hidden: &[f32]) -> Result<()> {
        let t0 = Instant::now();
        let Some(sets) = self.selector.sets_after_first_layer(hidden, &self.plan.set_sizes) else { return Ok(()) };
        self.stats.choose_ms += t0.elapsed().as_secs_f64() * 1e3;
        let mut reads = Vec::new();
        for (si, set) in sets.iter().enumerate() {
            let loads = self.layers[si].map.plan(set, self.tick);
            self.stats.count_layer(si, set.len(), loads.len());
            if !loads.is_empty() {
                reads.push(LayerReads { si, layer: self.dense_prefix + si, loads: loads.clone(), max_gap_bytes: 0 });
            }
            self.in_flight[si] = loads;
        }
        self.sets = sets;
        if !reads.is_empty() {
            self.io.submit(self.tick, reads)?;
        }
        Ok(())
    }

    /// The MLP of sparse layer `layer` for one token's normed input `xn` `[d_model]`, into
    /// `out` `[d_model]`: `sum_j c_j downT_j` over the rows that count (the set, or every row
    /// held), `c_j = silu(gate_j . xn) (up_j . xn)` from the slot or the selector's score.
    pub fn mlp(&mut self, layer: usize, xn: &[f32], out: &mut [f32]) -> Result<()> {
        let si = layer - self.dense_prefix;
        let t0 = Instant::now();
        if let Some(chooser) = self.selector.per_layer() {
            chooser.score(layer, xn, &mut self.h);
            let choice = chooser.choose(layer, &self.h, self.plan.set_sizes[si], &mut self.layers[si].map, self.tick);
            self.stats.choose_ms += t0.elapsed().as_secs_f64() * 1e3;
            self.stats.count_layer(si, choice.set.len(), choice.loads.len());
            if !choice.loads.is_empty() {
                self.io
                    .submit(self.tick, vec![LayerReads { si, layer, loads: choice.loads.clone(), max_gap_bytes: 0 }])?;
            }
            self.in_flight[si] = choice.loads;
            self.sets[si] = choice.set;
        }
        let t1 = Instant::now();
        let loads = std::mem::take(&mut self.in_flight[si]);
        let (d, slot_row, h) = (self.d_model, self.selector.slot_row(), &self.h);
        // 1. the rows already held, added up while the missing ones are read
        let slots = &mut self.layers[si];
        let held = if self.selector.every_held_row_counts() {
            slots.map.held_slots(&loads)
        } else {
            slots.map.held_slots_of(&self.sets[si], &loads)
        };
        let records = self.records;
        if let Some(c) = sum_slots(slots, slot_row, records, d, xn, h, &held, out) {
            if let Some(chooser) = self.selector.per_layer() {
                let neurons: Vec<u32> = held.iter().map(|&s| slots.map.neuron_of[s as usize]).collect();
                chooser.observe_coefficients(&mut slots.map, &neurons, &c);
            }
        }
        let mut compute_ms = t1.elapsed().as_secs_f64() * 1e3;
        // 2. the read rows, into their slots, then added (in neuron order)
        if !loads.is_empty() {
            self.land(si, &loads)?;
            let t2 = Instant::now();
            let (slots, h) = (&mut self.layers[si], &self.h);
            let loaded: Vec<u32> = loads.iter().map(|l| l.slot).collect();
            let mut part = vec![0f32; d];
            if let Some(c) = sum_slots(slots, slot_row, records, d, xn, h, &loaded, &mut part) {
                if let Some(chooser) = self.selector.per_layer() {
                    let neurons: Vec<u32> = loads.iter().map(|l| l.neuron).collect();
                    chooser.observe_coefficients(&mut slots.map, &neurons, &c);
                }
            }
            out.iter_mut().zip(&part).for_each(|(o, p)| *o += p);
            compute_ms += t2.elapsed().as_secs_f64() * 1e3;
        }
        self.stats.sparse_compute_ms += compute_ms;
        self.stats.computed_rows += (held.len() + loads.len()) as u64;
        if self.record_sets && si + 1 == self.sets.len() {
            self.history.push(self.sets.clone());
        }
        Ok(())
    }
}

/// `out` = the sum over `slots` of each row's coefficient times its down row: from the slot's
/// own gate and up rows ([`SlotRow::GateUpDown`], laid out as `records`) or the selector's `h`
/// ([`SlotRow::Down`]: f16, or the down blocks of version-2 `records`). Whole records also give
/// each slot's exact coefficient (in `slots`' order).
#[allow(clippy::too_many_arguments)]
fn sum_slots(
    layer: &LayerSlots,
    slot_row: SlotRow,
    records: RecordRows,
    d: usize,
    xn: &[f32],
    h: &[f32],
    slots: &[u32],
    out: &mut [f32],
) -> Option<Vec<f32>> {
    let neuron_of = &layer.map.neuron_of;
    match (slot_row, records) {
        (SlotRow::GateUpDown, _) => {
            let (bytes, rb) = (layer.buf.as_slice(), records.row_bytes());
            return Some(records.sum(slots, |s| &bytes[s as usize * rb..(s as usize + 1) * rb], xn, out));
        }
        (SlotRow::Down, RecordRows::Blocks { shape }) => {
            let (bytes, rb) = (layer.buf.as_slice(), shape.down_row_bytes());
            down_sum_blocks(
                shape.down,
                slots,
                |_, s| h[neuron_of[s as usize] as usize],
                |s| &bytes[s as usize * rb..(s as usize + 1) * rb],
                out,
            );
        }
        (SlotRow::Down, RecordRows::F16 { .. }) => {
            let rows = layer.rows();
            down_sum(
                slots,
                |_, s| h[neuron_of[s as usize] as usize],
                |s| &rows[s as usize * d..(s as usize + 1) * d],
                out,
            );
        }
    }
    None
}

impl crate::model::StreamedMlp for StreamingEngine {
    fn begin_token(&mut self) -> Result<()> {
        StreamingEngine::begin_token(self)
    }
    fn observe_first_layer(&mut self, gate_silu: &[f32], up: &[f32]) {
        StreamingEngine::observe_first_layer(self, gate_silu, up)
    }
    fn after_first_layer(&mut self, hidden: &[f32]) -> Result<()> {
        StreamingEngine::after_first_layer(self, hidden)
    }
    fn mlp(&mut self, layer: usize, xn: &[f32], out: &mut [f32]) -> Result<()> {
        StreamingEngine::mlp(self, layer, xn, out)
    }
    fn abandon_token(&mut self) {
        StreamingEngine::abandon_token(self)
    }
    fn scratch(&mut self) -> &mut Option<crate::model::DecodeState> {
        &mut self.scratch
    }
    fn begin_prompt(&mut self, count_from: usize) -> Result<()> {
        StreamingEngine::begin_prompt(self, count_from)
    }
    fn staged_mlp_done(&mut self, layer: usize, mlp: crate::model::DenseMlp, h: &[f32]) -> Result<()> {
        StreamingEngine::staged_mlp_done(self, layer, mlp, h)
    }
    fn staged_mlp(&mut self, layer: usize) -> Result<crate::model::DenseMlp> {
        StreamingEngine::staged_mlp(self, layer)
    }
    fn abandon_prompt(&mut self) {
        self.stager.drain()
    }
}
