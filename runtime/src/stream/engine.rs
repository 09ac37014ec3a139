//! `StreamingEngine`: the sparse layers' MLP rows live in `records.bin`; each sparse layer has
//! a buffer of C >= K_max row slots. Per token: layer 0 runs, the predictor picks every sparse
//! layer's centroid, the slot maps give the delta (rows not resident), and a background I/O
//! thread reads the delta (io_uring, O_DIRECT, coalesced runs) while the dense prefix computes;
//! each sparse layer waits only for its own rows, then computes its MLP from the active slots.

use super::aligned::AlignedBuf;
use super::budget::{MemoryPlan, SetSource};
use super::reader::{RecordReader, Run};
use super::slots::{Load, SlotMap, EMPTY};
use crate::error::{Result, RuntimeError};
use crate::model::MlpHook;
use crate::ops::simd::{axpy_f16, dot2_f16_f32};
use crate::ops::swiglu::silu;
use crate::predictor::Predictor;
use formats::centroids::{CentroidSet, CentroidTable};
use crate::scorer::{GateUpScorer, LayerScoring};
use formats::records::{check_record, RECORD_ALIGN_BYTES, RECORD_HEADER_BYTES};
use formats::thresholds::Thresholds;
use half::f16;
use rayon::prelude::*;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

struct LayerStore {
    map: SlotMap,
    /// `[capacity, 3 * d_model]` f16: each slot holds one neuron's gate, up and downT rows (the
    /// record's payload; its header and padding are checked and dropped).
    buf: AlignedBuf,
}

#[derive(Default)]
struct Progress {
    tick: u64,
    layers_done: usize,
    error: Option<String>,
}

struct Shared {
    layers: Vec<Mutex<LayerStore>>,
    progress: Mutex<Progress>,
    cv: Condvar,
}

struct IoJob {
    tick: u64,
    /// Per sparse layer, the rows to load (sorted by neuron).
    loads: Vec<Vec<Load>>,
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
    pub predictor_ms: f64,
    pub sparse_compute_ms: f64,
    /// Wall time the I/O thread spent reading and scattering.
    pub io_busy_ms: f64,
    /// With the scorer: rows read before their layer was fully scored (part of rows_loaded).
    pub rows_loaded_early: u64,
    /// With the scorer: rows whose product was added (every row held), over tokens and layers.
    pub computed_rows: u64,
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

pub struct StreamingEngine {
    pub plan: MemoryPlan,
    shared: Arc<Shared>,
    /// How the sets are chosen, and who reads the rows.
    selector: Selector,
    pub rule: crate::predictor::SetRule,
    /// With the scorer: how much a resident row's score counts (see `GateUpScorer::keep`).
    pub resident_bonus: f32,
    /// The current token's active neurons per sparse layer (ascending).
    active: Vec<Vec<u32>>,
    /// The first sparse layer (`--dense-from`, resolved).
    pub first_layer: usize,
    d_model: usize,
    tick: u64,
    pub stats: StreamStats,
    /// The first error of the current token (reported at the next sparse layer).
    error: Option<RuntimeError>,
    pub fallback: Option<String>,
    pub records_path: PathBuf,
    /// With `record_history`: every token's active sets, `[tokens][sparse layers][neurons]`.
    pub history: Vec<Vec<Vec<u32>>>,
    pub record_history: bool,
}

/// NeuroPrefetcher's way: after layer 0 the shared predictor picks every sparse layer's set, and
/// a background I/O thread reads the deltas (whole records) while the layers before compute.
struct PredictedSets {
    tx: Option<Sender<IoJob>>,
    worker: Option<std::thread::JoinHandle<()>>,
    io_stats: Arc<Mutex<(u64, u64, f64)>>, // bytes, requests, busy ms
    predictor: Predictor,
    layer0: CentroidSet,
    /// Per sparse layer: its centroid sets and how its neurons rank (importance, membership);
    /// its set size is the plan's.
    sets: Vec<CentroidSet>,
    priors: Vec<crate::predictor::NeuronPrior>,
    thresholds: Thresholds,
    c0: u32,
}

/// `--set-rule scorer`: each sparse layer scores its neurons from its own input with the
/// resident 4-bit gate/up copy, then reads the missing downT rows itself (only the row, not
/// the record) and checks each against the scorer's CRC32C.
struct ScoredReads {
    scorer: GateUpScorer,
    reader: RecordReader,
    staging: AlignedBuf,
    /// Per sparse layer, heat and threshold (`scorer::score_and_plan`).
    scoring: Vec<LayerScoring>,
    /// Read the rows that clear the last threshold while the layer is still being scored.
    early_reads: bool,
    layout: formats::manifest::RecordsLayout,
    /// Rows read for the layer at hand, checked, before they go to their slots.
    landing: Vec<u8>,
    /// Where a record's downT row starts, and the 512-aligned span read around it.
    down_offset: usize,
    span_offset: usize,
    span_bytes: usize,
    io_busy_ms: f64,
}

enum Selector {
    Predicted(Box<PredictedSets>),
    Scored(Box<ScoredReads>),
}

#[derive(Debug, Clone)]
pub struct StreamSettings {
    pub mem_budget_bytes: Option<u64>,
    pub ctx: usize,
    pub queue_depth: usize,
    pub staging_bytes: usize,
    /// Longest coalesced read.
    pub max_run_bytes: usize,
    pub force_pread: bool,
    /// Which layers run sparse (`--dense-from`).
    pub dense_from: DenseFrom,
    /// Neurons kept per sparse layer, as a share of K_max (`--set-scale`, 0 < s <= 1; of n_ff
    /// with `scorer`). With `DenseFrom::Fit`, the largest scale up to this one that fits once
    /// every layer after the dense prefix is sparse.
    pub set_scale: f64,
    /// Choose sets with the 4-bit gate/up scorer (`--set-rule scorer`) instead of the predictor.
    pub scorer: bool,
    /// Logits from the Q8_0 head (`--head-q8`): the plan holds it instead of the f16 head.
    pub head_q8: bool,
    /// With the scorer: read the rows that clear a layer's last threshold while the rest of
    /// the layer is scored (`scorer::score_and_plan`, `--early-reads`). Off by default: on 2
    /// cores it read ~25% more rows and the reads' completions slowed the scoring as much as
    /// the overlap saved.
    pub early_reads: bool,
}

/// Where the sparse layers start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DenseFrom {
    /// The manifest's `default_dense_from`.
    #[default]
    Default,
    /// Layers `L..` sparse (`dense_prefix <= L <= n_layers`).
    Layer(usize),
    /// The largest `L <= default_dense_from` whose memory plan fits the budget.
    Fit,
}

impl std::str::FromStr for DenseFrom {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "fit" => Ok(DenseFrom::Fit),
            "default" => Ok(DenseFrom::Default),
            n => n.parse().map(DenseFrom::Layer).map_err(|_| format!("'{s}': expected a layer number, 'fit' or 'default'")),
        }
    }
}

impl Default for StreamSettings {
    fn default() -> Self {
        StreamSettings {
            mem_budget_bytes: None,
            ctx: 2048,
            queue_depth: 256,
            staging_bytes: 8 << 20,
            max_run_bytes: 1 << 20,
            force_pread: false,
            dense_from: DenseFrom::Default,
            set_scale: 1.0,
            scorer: false,
            head_q8: false,
            early_reads: false,
        }
    }
}

fn wait_for(shared: &Shared, tick: u64, layer_index: usize) -> std::result::Result<(), String> {
    let mut p = shared.progress.lock().unwrap();
    loop {
        if let Some(e) = &p.error {
            return Err(e.clone());
        }
        if p.tick == tick && p.layers_done > layer_index {
            return Ok(());
        }
        p = shared.cv.wait(p).unwrap();
    }
}

/// Groups sorted loads into runs of consecutive neurons (<= max_records each).
fn runs_of(loads: &[Load], max_records: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=loads.len() {
        if i == loads.len() || loads[i].neuron != loads[i - 1].neuron + 1 || i - start >= max_records {
            out.push(start..i);
            start = i;
        }
    }
    out
}

#[allow(clippy::too_many_arguments)]
fn io_worker(
    rx: std::sync::mpsc::Receiver<IoJob>,
    shared: Arc<Shared>,
    mut reader: RecordReader,
    mut staging: AlignedBuf,
    layout: formats::manifest::RecordsLayout,
    first_sparse_layer: usize,
    d_model: usize,
    max_run_bytes: usize,
    io_stats: Arc<Mutex<(u64, u64, f64)>>,
) {
    let rb = layout.record_bytes;
    let max_records = (max_run_bytes / rb).max(1).min(staging.len() / rb);
    while let Ok(job) = rx.recv() {
        let t0 = Instant::now();
        for (si, loads) in job.loads.iter().enumerate() {
            let layer = first_sparse_layer + si;
            let result = (|| -> std::result::Result<(), String> {
                let runs = runs_of(loads, max_records);
                let mut r = 0;
                while r < runs.len() {
                    // fill the staging buffer with whole runs
                    let mut batch = Vec::new();
                    let mut used = 0usize;
                    while r < runs.len() && used + runs[r].len() * rb <= staging.len() {
                        let first = &loads[runs[r].start];
                        batch.push((runs[r].clone(), Run { offset: layout.offset(layer, first.neuron as usize), bytes: runs[r].len() * rb, staging_offset: used }));
                        used += runs[r].len() * rb;
                        r += 1;
                    }
                    let plain: Vec<Run> = batch.iter().map(|b| b.1).collect();
                    reader.read_runs(&plain, &mut staging).map_err(|e| e.to_string())?;
                    let mut store = shared.layers[si].lock().unwrap();
                    for (range, run) in &batch {
                        for (k, load) in loads[range.clone()].iter().enumerate() {
                            let src = &staging.as_slice()[run.staging_offset + k * rb..run.staging_offset + (k + 1) * rb];
                            let off = run.offset + (k * rb) as u64;
                            if let Err(e) = check_record(src, &reader.path, off, layer as u32, load.neuron, d_model) {
                                for l in loads {
                                    store.map.invalidate(l.slot);
                                }
                                return Err(e.to_string());
                            }
                            let (s, pb) = (load.slot as usize, 3 * d_model * 2);
                            store.buf.as_mut_slice()[s * pb..(s + 1) * pb].copy_from_slice(&src[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + pb]);
                        }
                    }
                }
                Ok(())
            })();
            let mut p = shared.progress.lock().unwrap();
            if p.tick == job.tick {
                if let Err(e) = result {
                    p.error.get_or_insert(e);
                }
                p.layers_done = si + 1;
            }
            drop(p);
            shared.cv.notify_all();
        }
        let mut s = io_stats.lock().unwrap();
        *s = (reader.bytes_read, reader.requests, s.2 + t0.elapsed().as_secs_f64() * 1e3);
    }
}

impl StreamingEngine {
    /// `--neuron-rank` (see [`crate::predictor::apply_neuron_rank`]; the scorer ranks by score).
    pub fn set_neuron_rank(&mut self, rank: crate::predictor::NeuronRank) {
        if let Selector::Predicted(p) = &mut self.selector {
            crate::predictor::apply_neuron_rank(&mut p.priors, rank);
        }
    }

    /// How cut sets are ranked in this run (None: the scorer, which ranks by its own score).
    pub fn neuron_rank(&self) -> Option<crate::predictor::NeuronRank> {
        match &self.selector {
            Selector::Predicted(p) => Some(crate::predictor::effective_neuron_rank(&p.priors)),
            Selector::Scored(_) => None,
        }
    }

    /// Whether the scorer reads rows while a layer is still being scored (false for the predictor).
    pub fn early_reads(&self) -> bool {
        matches!(&self.selector, Selector::Scored(r) if r.early_reads)
    }

    pub fn new(manifest_path: &Path, manifest: &formats::manifest::Manifest, settings: &StreamSettings) -> Result<Self> {
        let records_path = manifest.artifact_path_of(manifest_path, "records")?;
        let c = &manifest.model;
        let d0 = manifest.sparsity.dense_prefix;
        let default = manifest.sparsity.default_dense_from();
        // what chooses the sets; the plan counts it
        enum Loaded {
            Predictor(Predictor, CentroidTable),
            Scorer(GateUpScorer),
        }
        let loaded = if settings.scorer {
            Loaded::Scorer(GateUpScorer::load(manifest_path, manifest)?)
        } else {
            let predictor = Predictor::load(&manifest.artifact_path_of(manifest_path, "predictor")?)?;
            let centroids = CentroidTable::load(&manifest.artifact_path_of(manifest_path, "centroids")?)?;
            if predictor.spec.first_layer != d0 || predictor.spec.n_sparse_layers != c.num_hidden_layers - d0 {
                return Err(RuntimeError::Input(format!("{}: the predictor covers layers {}.. ({}), the manifest's sparse layers are {d0}..{}", manifest_path.display(), predictor.spec.first_layer, predictor.spec.n_sparse_layers, c.num_hidden_layers)));
            }
            Loaded::Predictor(predictor, centroids)
        };
        let src = match &loaded {
            Loaded::Predictor(predictor, centroids) => SetSource::Predictor { predictor, centroids },
            Loaded::Scorer(sc) => SetSource::Scorer(sc),
        };
        let plan = match settings.dense_from {
            DenseFrom::Fit => MemoryPlan::fit(manifest_path, manifest, src, settings)?,
            DenseFrom::Layer(l) => MemoryPlan::new(manifest_path, manifest, src, settings, l, settings.set_scale)?,
            DenseFrom::Default => MemoryPlan::new(manifest_path, manifest, src, settings, default, settings.set_scale).map_err(|e| match e {
                RuntimeError::BudgetTooSmall { budget, minimum, breakdown } if default > d0 => RuntimeError::BudgetTooSmall {
                    budget,
                    minimum,
                    breakdown: format!("{breakdown} (at the default dense prefix {default}; `--dense-from fit` runs more layers sparse, down to layer {d0})"),
                },
                e => e,
            })?,
        };
        let first = plan.dense_from;
        let rb = manifest.records.record_bytes;
        let len = std::fs::metadata(&records_path).map_err(|e| formats::FormatError::io(&records_path, e))?.len();
        if len != (manifest.records.count * rb) as u64 {
            return Err(formats::FormatError::Truncated { path: records_path.clone(), offset: len, what: format!("{} records of {rb} bytes", manifest.records.count), needed: (manifest.records.count * rb) as u64, file_bytes: len }.into());
        }
        let layers = plan.capacity.iter().map(|&cap| Mutex::new(LayerStore { map: SlotMap::new(c.intermediate_size, cap), buf: AlignedBuf::new(cap * plan.slot_row_bytes) })).collect();
        let shared = Arc::new(Shared { layers, progress: Mutex::new(Progress::default()), cv: Condvar::new() });
        let reader = RecordReader::open(&records_path, settings.queue_depth, settings.force_pread)?;
        let fallback = reader.fallback.clone();
        let staging = AlignedBuf::new(plan.staging_bytes);
        let selector = match loaded {
            Loaded::Predictor(predictor, centroids) => {
                // the sparse layers are first..n_layers: keep only their heads
                let predictor = predictor.without_heads_before(first);
                let (tx, rx) = channel();
                let io_stats = Arc::new(Mutex::new((0, 0, 0.0)));
                let worker = {
                    let (shared, layout, d, mrb, ios) = (shared.clone(), manifest.records.clone(), c.hidden_size, settings.max_run_bytes, io_stats.clone());
                    std::thread::Builder::new().name("record-io".into()).spawn(move || io_worker(rx, shared, reader, staging, layout, first, d, mrb, ios)).map_err(|e| RuntimeError::Input(format!("cannot start the I/O thread: {e}")))?
                };
                let sets = (first..c.num_hidden_layers).map(|l| Ok(centroids.layer(l)?.clone())).collect::<Result<Vec<_>>>()?;
                let importance = crate::load_importance(manifest_path, manifest)?;
                let priors = crate::predictor::NeuronPrior::for_layers(&sets, first, importance.as_ref());
                let thresholds = Thresholds::load(&manifest.artifact_path_of(manifest_path, "thresholds")?)?;
                Selector::Predicted(Box::new(PredictedSets { tx: Some(tx), worker: Some(worker), io_stats, predictor, layer0: centroids.layer(0)?.clone(), sets, priors, thresholds, c0: 0 }))
            }
            Loaded::Scorer(scorer) => {
                let d = c.hidden_size;
                let down_offset = RECORD_HEADER_BYTES + 2 * d * 2;
                let span_offset = down_offset / RECORD_ALIGN_BYTES * RECORD_ALIGN_BYTES;
                let span_bytes = (down_offset + d * 2).div_ceil(RECORD_ALIGN_BYTES) * RECORD_ALIGN_BYTES - span_offset;
                // one reader: a second ring on the other core read no faster here (~80K reads/s of
                // 3 KiB either way) and slowed the compute sharing that core
                let mut reader = reader;
                let mut staging = staging;
                reader.register(&mut staging)?;
                Selector::Scored(Box::new(ScoredReads { scoring: (first..c.num_hidden_layers).map(|_| LayerScoring::new(c.intermediate_size)).collect(), early_reads: settings.early_reads, scorer: scorer.without_layers_before(first), reader, staging, landing: Vec::new(), layout: manifest.records.clone(), down_offset, span_offset, span_bytes, io_busy_ms: 0.0 }))
            }
        };
        let stats = StreamStats {
            layers: plan.capacity.iter().enumerate().map(|(i, &cap)| LayerStreamStats { layer: first + i, capacity: cap, ..Default::default() }).collect(),
            ..Default::default()
        };
        Ok(StreamingEngine {
            plan,
            shared,
            selector,
            rule: if settings.scorer { crate::predictor::SetRule::Scorer } else { crate::predictor::SetRule::default() },
            resident_bonus: 1.0,
            active: vec![vec![]; c.num_hidden_layers - first],
            first_layer: first,
            d_model: c.hidden_size,
            tick: 0,
            stats,
            error: None,
            fallback,
            records_path,
            history: Vec::new(),
            record_history: false,
        })
    }

    /// Bytes read and requests so far (from the I/O thread).
    pub fn refresh_io_stats(&mut self) {
        let s = match &self.selector {
            Selector::Predicted(p) => *p.io_stats.lock().unwrap(),
            Selector::Scored(r) => (r.reader.bytes_read, r.reader.requests, r.io_busy_ms),
        };
        self.stats.bytes_read = s.0;
        self.stats.read_requests = s.1;
        self.stats.io_busy_ms = s.2;
    }

    /// Plans every sparse layer's delta for the predicted ids and hands it to the I/O thread.
    fn dispatch(&mut self) {
        self.tick += 1;
        let mut loads = Vec::with_capacity(self.active.len());
        for (si, active) in self.active.iter().enumerate() {
            let l = self.shared.layers[si].lock().unwrap().map.plan(active, self.tick);
            self.stats.count_layer(si, active.len(), l.len());
            loads.push(l);
        }
        {
            let mut p = self.shared.progress.lock().unwrap();
            *p = Progress { tick: self.tick, layers_done: 0, error: None };
        }
        let tx = match &self.selector {
            Selector::Predicted(p) => p.tx.as_ref(),
            Selector::Scored(_) => None,
        };
        if tx.is_none_or(|tx| tx.send(IoJob { tick: self.tick, loads }).is_err()) {
            self.error = Some(RuntimeError::Input("the record I/O thread has stopped".into()));
        }
        self.stats.tokens += 1;
    }

    /// The MLP of sparse layer `si` for one token: `out = sum_j silu(g_j) u_j downT_j` over the
    /// active neurons j, `g_j = gate_j . xn`, `u_j = up_j . xn`.
    fn sparse_mlp_one(&self, si: usize, xn: &[f32], out: &mut [f32]) {
        let store = self.shared.layers[si].lock().unwrap();
        let active = &self.active[si];
        let d = self.d_model;
        let pb = 3 * d * 2;
        let buf = store.buf.as_slice();
        let row = |slot: usize, part: usize| -> &[f16] {
            let start = slot * pb + part * d * 2;
            bytemuck::cast_slice(&buf[start..start + d * 2])
        };
        let partial = active
            .par_chunks(64)
            .map(|chunk| {
                let mut acc = vec![0f32; d];
                for &j in chunk {
                    let s = store.map.slot_of[j as usize];
                    debug_assert_ne!(s, EMPTY);
                    let s = s as usize;
                    let (g, u) = dot2_f16_f32(row(s, 0), row(s, 1), xn);
                    axpy_f16(silu(g) * u, row(s, 2), &mut acc);
                }
                acc
            })
            .reduce(|| vec![0f32; d], |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                a
            });
        out.copy_from_slice(&partial);
    }
}

impl Drop for StreamingEngine {
    fn drop(&mut self) {
        if let Selector::Predicted(p) = &mut self.selector {
            p.tx.take();
            if let Some(w) = p.worker.take() {
                let _ = w.join();
            }
        }
    }
}

impl MlpHook for StreamingEngine {
    fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
        if let (0, Selector::Predicted(p)) = (layer, &mut self.selector) {
            let mut mask = vec![0u8; p.layer0.width];
            crate::predictor::product_mask(&p.thresholds, 0, gate_silu, up, &mut mask);
            p.c0 = p.layer0.best_cover(&mask);
        }
    }

    fn after_layer(&mut self, layer: usize, hidden: &[f32]) {
        let Selector::Predicted(p) = &mut self.selector else { return };
        if layer == 0 {
            let t0 = Instant::now();
            let logits = p.predictor.logits(hidden, &[p.c0]);
            let k = p.predictor.spec.k;
            let rule = self.rule;
            self.active = logits
                .chunks_exact(k)
                .enumerate()
                .map(|(si, head)| {
                    let (_, bits) = crate::predictor::predicted_set(head, &p.sets[si], &p.priors[si], self.plan.set_sizes[si], rule);
                    CentroidSet { k: 1, width: bits.len(), bits }.neurons(0)
                })
                .collect();
            if self.record_history {
                self.history.push(self.active.clone());
            }
            self.stats.predictor_ms += t0.elapsed().as_secs_f64() * 1e3;
            self.dispatch();
        }
    }

    fn single_token(&self) -> bool {
        true
    }

    fn replaces_mlp(&self, layer: usize) -> bool {
        layer >= self.first_layer
    }

    fn mlp(&mut self, layer: usize, xn: &[f32], out: &mut [f32]) -> Result<()> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let si = layer - self.first_layer;
        if matches!(self.selector, Selector::Scored(_)) {
            return self.scored_mlp(si, layer, xn, out);
        }
        let t0 = Instant::now();
        wait_for(&self.shared, self.tick, si).map_err(RuntimeError::Input)?;
        let t1 = Instant::now();
        self.stats.io_wait_ms += (t1 - t0).as_secs_f64() * 1e3;
        self.sparse_mlp_one(si, xn, out);
        self.stats.sparse_compute_ms += t1.elapsed().as_secs_f64() * 1e3;
        Ok(())
    }
}

impl StreamingEngine {
    /// `--set-rule scorer`: score layer `layer`'s neurons from `xn` (one token), keep the
    /// plan's set size, read the missing downT rows (io_uring, O_DIRECT, one 512-aligned span
    /// per row, checked against the scorer's CRC32C), then `out = sum_kept h_j downT_j`.
    fn scored_mlp(&mut self, si: usize, layer: usize, xn: &[f32], out: &mut [f32]) -> Result<()> {
        let Selector::Scored(r) = &mut self.selector else { unreachable!() };
        if si == 0 {
            self.tick += 1;
            self.stats.tokens += 1;
        }
        let d = self.d_model;
        let t0 = Instant::now();
        let mut h = vec![0f32; r.scorer.file.n_ff];
        let mut store = self.shared.layers[si].lock().unwrap();
        let store = &mut *store;
        let per_batch = (r.staging.len() / r.span_bytes).max(1);
        let skip = r.down_offset - r.span_offset;
        let ScoredReads { scorer, reader, staging, scoring, layout, span_offset, span_bytes, early_reads, landing, .. } = &mut **r;
        // reused from token to token: a fresh allocation each layer costs its page faults
        let mut landing = std::mem::take(landing);
        landing.clear();
        let crcs = scorer.file.layer_down_crc32c(layer);
        let (span_offset, span_bytes) = (*span_offset as u64, *span_bytes);
        let records_path = &self.records_path;
        // The I/O thread reads each batch of rows as it arrives (checked, into `landing` in
        // arrival order) while this thread scores the rest of the layer and then adds up the
        // rows already held; then the read rows are copied into their slots and added.
        let (tx, rx) = std::sync::mpsc::channel::<Vec<Load>>();
        let read_missing = move |mut landing: Vec<u8>| -> Result<Vec<u8>> {
            while let Ok(mut batch) = rx.recv() {
                while let Ok(more) = rx.try_recv() {
                    batch.extend(more);
                }
                for part in batch.chunks(per_batch) {
                    let runs: Vec<Run> = part
                        .iter()
                        .enumerate()
                        .map(|(k, l)| Run { offset: layout.offset(layer, l.neuron as usize) + span_offset, bytes: span_bytes, staging_offset: k * span_bytes })
                        .collect();
                    reader.read_runs(&runs, staging)?;
                    for (k, l) in part.iter().enumerate() {
                        let row = &staging.as_slice()[k * span_bytes + skip..k * span_bytes + skip + 2 * d];
                        formats::scorer::check_down_row(row, crcs[l.neuron as usize], records_path, runs[k].offset + skip as u64, layer, l.neuron)?;
                        landing.extend_from_slice(row);
                    }
                }
            }
            Ok(landing)
        };
        let (k, bonus, tick) = (self.plan.set_sizes[si], self.resident_bonus, self.tick);
        let (mut sent, mut early, mut first_send) = (Vec::new(), 0usize, None);
        let map = &mut store.map;
        let buf = store.buf.as_slice();
        // the I/O thread starts with the first batch: a layer whose rows are all held spawns none
        let (mut read_missing, mut landing) = (Some(read_missing), Some(landing));
        let (kept, held_before, read, t1, t_sum) = std::thread::scope(|sc| {
            let mut io = None;
            let kept = crate::scorer::score_and_plan(scorer, layer, xn, k, bonus, *early_reads, map, &mut scoring[si], tick, &mut h, |loads, is_early| {
                early += if is_early { loads.len() } else { 0 };
                first_send.get_or_insert_with(Instant::now);
                if io.is_none() {
                    let (mut f, buf) = (read_missing.take().expect("spawned once"), landing.take().expect("spawned once"));
                    io = Some(sc.spawn(move || f(buf)));
                }
                sent.extend_from_slice(&loads);
                // a send fails only when the I/O thread stopped on an error, which join returns
                let _ = tx.send(loads);
            });
            drop(tx);
            let t1 = Instant::now();
            let mut loading = vec![false; map.capacity()];
            sent.iter().for_each(|l| loading[l.slot as usize] = true);
            let held_before: Vec<u32> = (0..map.capacity() as u32).filter(|&s| map.neuron_of[s as usize] != EMPTY && !loading[s as usize]).collect();
            let hs: Vec<f32> = held_before.iter().map(|&s| h[map.neuron_of[s as usize] as usize]).collect();
            crate::scorer::down_sum(&held_before, &hs, |s| bytemuck::cast_slice(&buf[s as usize * 2 * d..(s as usize + 1) * 2 * d]), out);
            let t_sum = t1.elapsed().as_secs_f64() * 1e3;
            let read = match io {
                Some(j) => j.join().expect("the read thread panicked"),
                None => Ok(landing.take().expect("not spawned")),
            };
            (kept, held_before, read, t1, t_sum)
        });
        self.stats.predictor_ms += (t1 - t0).as_secs_f64() * 1e3;
        self.stats.count_layer(si, kept.len(), sent.len());
        self.stats.rows_loaded_early += early as u64;
        let t2 = Instant::now();
        self.stats.io_wait_ms += ((t2 - t1).as_secs_f64() * 1e3 - t_sum).max(0.0);
        r.io_busy_ms += first_send.map_or(0.0, |t| (t2 - t).as_secs_f64() * 1e3);
        let landing = match read {
            Err(e) => {
                sent.iter().for_each(|l| store.map.invalidate(l.slot));
                return Err(e);
            }
            Ok(v) => v,
        };
        let Selector::Scored(r) = &mut self.selector else { unreachable!() };
        for (k, l) in sent.iter().enumerate() {
            let s = l.slot as usize;
            store.buf.as_mut_slice()[s * 2 * d..(s + 1) * 2 * d].copy_from_slice(&landing[k * 2 * d..(k + 1) * 2 * d]);
        }
        r.landing = landing;
        // the loaded rows' share (in neuron order, as `ScoredSparsity` adds them), added to the
        // held rows' sum
        let mut loads = sent;
        loads.sort_unstable();
        let mut part = vec![0f32; d];
        let load_slots: Vec<u32> = loads.iter().map(|l| l.slot).collect();
        let hl: Vec<f32> = loads.iter().map(|l| h[l.neuron as usize]).collect();
        let buf = store.buf.as_slice();
        crate::scorer::down_sum(&load_slots, &hl, |s| bytemuck::cast_slice(&buf[s as usize * 2 * d..(s as usize + 1) * 2 * d]), &mut part);
        out.iter_mut().zip(&part).for_each(|(o, p)| *o += p);
        let held_len = held_before.len() + loads.len();
        self.stats.computed_rows += held_len as u64;
        self.stats.sparse_compute_ms += t_sum;
        self.stats.sparse_compute_ms += t2.elapsed().as_secs_f64() * 1e3;
        if self.record_history {
            if si == 0 {
                self.history.push(vec![vec![]; self.active.len()]);
            }
            self.history.last_mut().unwrap()[si] = kept.clone();
        }
        self.active[si] = kept;
        Ok(())
    }
}
