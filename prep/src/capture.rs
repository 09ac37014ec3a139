//! `prep capture`: run the dense model (the runtime's batched forward pass) over a calibration
//! corpus in sequences of T tokens and record, without ever holding the raw activations:
//!
//! 1. per-layer magnitude thresholds at sparsity `alpha`, from a streaming log-histogram over
//!    the first `threshold_sequences` sequences (`thresholds.json`);
//! 2. for every token and layer, the bit-packed mask of active neurons, plus the hidden state
//!    after layer 0 (the predictor's input), as Arrow IPC shards (`masks-<i>-of-<n>.arrow`).
//!
//! Mask kinds: `product` — active where |silu(g) * u| >= t_l (one threshold per layer);
//! `gate-up` — the paper's: separate thresholds on |silu(g)| and |u|, a gate mask and an up mask
//! (the active set is their intersection).

use anyhow::{bail, Context, Result};
use arrow_array::builder::{FixedSizeBinaryBuilder, FixedSizeListBuilder, Float16Builder, UInt32Builder};
use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{DataType, Field, Schema};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use runtime::model::MlpHook;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use formats::thresholds::{MaskKind, Thresholds};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CaptureSettings {
    pub mask_kind: MaskKind,
    pub alpha: f64,
    pub seq_len: usize,
    pub sequences: usize,
    pub threshold_sequences: usize,
    pub corpus: Vec<String>,
    pub shard_index: usize,
    pub shard_count: usize,
    /// Use these thresholds (e.g. the calibration run's, for a held-out capture) instead of
    /// computing them.
    #[serde(default)]
    pub thresholds_from: Option<String>,
}

/// A streaming histogram of magnitudes on a log-linear grid: the bin of |v| is the top 16 bits
/// of its f32 pattern (8 exponent bits, 7 mantissa bits), 128 bins per octave, so a bin is at
/// most 2^-7 = 0.78% wide relative to its lower edge and a quantile read from it is within
/// 0.78% of the exact one (it is the upper edge of the bin holding the exact quantile, so at
/// least the asked-for fraction lies below it).
#[derive(Clone)]
pub struct MagnitudeHistogram {
    counts: Vec<u64>,
    total: u64,
}

impl Default for MagnitudeHistogram {
    fn default() -> Self {
        MagnitudeHistogram { counts: vec![0; 1 << 15], total: 0 }
    }
}

impl MagnitudeHistogram {
    #[inline]
    pub fn add(&mut self, v: f32) {
        self.counts[((v.to_bits() & 0x7fff_ffff) >> 16) as usize] += 1;
        self.total += 1;
    }
    /// The smallest bin edge `t` with at least `q` of the values below it.
    pub fn quantile(&self, q: f64) -> f32 {
        let target = (q * self.total as f64).ceil() as u64;
        let mut cum = 0u64;
        for (bin, &c) in self.counts.iter().enumerate() {
            if cum >= target {
                return f32::from_bits((bin as u32) << 16);
            }
            cum += c;
        }
        f32::MAX
    }
}

/// Fills one histogram per layer (and per projection for gate-up).
struct HistogramObserver {
    kind: MaskKind,
    product: Vec<MagnitudeHistogram>,
    gate: Vec<MagnitudeHistogram>,
    up: Vec<MagnitudeHistogram>,
}

impl MlpHook for HistogramObserver {
    fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
        match self.kind {
            MaskKind::Product => {
                let h = &mut self.product[layer];
                gate_silu.iter().zip(up).for_each(|(g, u)| h.add(g * u));
            }
            MaskKind::GateUp => {
                gate_silu.iter().for_each(|&g| self.gate[layer].add(g));
                up.iter().for_each(|&u| self.up[layer].add(u));
            }
        }
    }
}

/// Collects one sequence's masks and layer-0 hidden states.
struct MaskObserver<'a> {
    th: &'a Thresholds,
    n_ff: usize,
    /// `[layer][token * mask_bytes ..]`; for gate-up, layers 0..L are gate masks, L..2L up masks.
    masks: Vec<Vec<u8>>,
    hidden0: Vec<f32>,
    /// Active neurons counted per layer (for the achieved density).
    active: Vec<u64>,
}

fn pack_bits(active: impl Iterator<Item = bool>, n_ff: usize, out: &mut Vec<u8>) -> u64 {
    let start = out.len();
    out.resize(start + n_ff.div_ceil(8), 0);
    let mut count = 0;
    for (i, a) in active.enumerate() {
        if a {
            out[start + i / 8] |= 1 << (i % 8);
            count += 1;
        }
    }
    count
}

impl MlpHook for MaskObserver<'_> {
    fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
        let n_layers = self.active.len();
        let ff = self.n_ff;
        for (g, u) in gate_silu.chunks_exact(ff).zip(up.chunks_exact(ff)) {
            match self.th.mask_kind {
                MaskKind::Product => {
                    let t = self.th.product[layer];
                    self.active[layer] +=
                        pack_bits(g.iter().zip(u).map(|(a, b)| (a * b).abs() >= t), ff, &mut self.masks[layer]);
                }
                MaskKind::GateUp => {
                    let (tg, tu) = (self.th.gate[layer], self.th.up[layer]);
                    pack_bits(g.iter().map(|a| a.abs() >= tg), ff, &mut self.masks[layer]);
                    pack_bits(u.iter().map(|b| b.abs() >= tu), ff, &mut self.masks[n_layers + layer]);
                    self.active[layer] +=
                        g.iter().zip(u).filter(|(a, b)| a.abs() >= tg && b.abs() >= tu).count() as u64;
                }
            }
        }
    }
    fn after_layer(&mut self, layer: usize, hidden: &[f32]) {
        if layer == 0 {
            self.hidden0.extend_from_slice(hidden);
        }
    }
}

/// Per-layer thresholds from the first `threshold_sequences` sequences (the same in every shard).
fn thresholds(
    model: &runtime::Model,
    seqs: &[Vec<u32>],
    s: &CaptureSettings,
    cache: &mut runtime::kv_cache::KvCache,
    show_progress: bool,
) -> Result<Thresholds> {
    let n_layers = model.config.num_hidden_layers;
    // 1. thresholds, from the first threshold_sequences sequences (the same in every shard)
    let n_th = s.threshold_sequences.max(1);
    let mut hist = HistogramObserver {
        kind: s.mask_kind,
        product: vec![MagnitudeHistogram::default(); if s.mask_kind == MaskKind::Product { n_layers } else { 0 }],
        gate: vec![MagnitudeHistogram::default(); if s.mask_kind == MaskKind::GateUp { n_layers } else { 0 }],
        up: vec![MagnitudeHistogram::default(); if s.mask_kind == MaskKind::GateUp { n_layers } else { 0 }],
    };
    let pb = if show_progress { ProgressBar::new(n_th as u64) } else { ProgressBar::hidden() };
    pb.set_style(ProgressStyle::with_template("thresholds [{bar:40}] {pos}/{len} sequences ({elapsed})").unwrap());
    for seq in &seqs[..n_th] {
        cache.clear();
        model.forward_observed(seq, cache, seq.len(), Some(&mut hist))?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    Ok(Thresholds {
        mask_kind: s.mask_kind,
        alpha: s.alpha,
        tokens_sampled: n_th * s.seq_len,
        product: hist.product.iter().map(|h| h.quantile(s.alpha)).collect(),
        gate: hist.gate.iter().map(|h| h.quantile(s.alpha)).collect(),
        up: hist.up.iter().map(|h| h.quantile(s.alpha)).collect(),
    })
}

#[derive(Debug, Serialize, Deserialize)]
pub struct CaptureSummary {
    pub settings: CaptureSettings,
    pub model: String,
    pub shard_path: String,
    pub sequences_captured: usize,
    pub tokens_captured: usize,
    /// Fraction of neurons active per layer on the captured tokens (1 - achieved sparsity).
    pub density_per_layer: Vec<f64>,
    pub thresholds_path: String,
    pub seconds: f64,
}

/// Corpus entries: files, or directories whose *.txt files (sorted) are all used.
pub fn expand_corpus(entries: &[PathBuf]) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for p in entries {
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(p)
                .with_context(|| format!("{}: cannot read corpus directory", p.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|f| f.extension().is_some_and(|x| x == "txt"))
                .collect();
            v.sort();
            if v.is_empty() {
                bail!("{}: corpus directory has no .txt file", p.display());
            }
            out.extend(v);
        } else {
            out.push(p.clone());
        }
    }
    Ok(out)
}

/// Sequences of `seq_len` tokens, taken round-robin from the corpus files so a cut keeps a mix.
pub(crate) fn corpus_sequences(
    tok: &runtime::Tokenizer,
    corpus: &[PathBuf],
    seq_len: usize,
    limit: usize,
) -> Result<Vec<Vec<u32>>> {
    let mut per_file = Vec::new();
    for p in corpus {
        let text = std::fs::read_to_string(p).with_context(|| format!("{}: cannot read corpus file", p.display()))?;
        let ids = tok.encode(&text, true)?;
        per_file.push(ids.chunks_exact(seq_len).map(|c| c.to_vec()).collect::<Vec<_>>());
    }
    let mut out = Vec::new();
    let longest = per_file.iter().map(|f| f.len()).max().unwrap_or(0);
    'outer: for i in 0..longest {
        for f in &per_file {
            if let Some(s) = f.get(i) {
                out.push(s.clone());
                if out.len() == limit {
                    break 'outer;
                }
            }
        }
    }
    Ok(out)
}

pub fn capture(model_dir: &Path, out: &Path, s: &CaptureSettings, show_progress: bool) -> Result<CaptureSummary> {
    if s.corpus.is_empty() {
        bail!("no corpus: give at least one --corpus FILE");
    }
    if !(0.0..1.0).contains(&s.alpha) {
        bail!("--alpha {} must be in [0, 1)", s.alpha);
    }
    if s.shard_count == 0 || s.shard_index >= s.shard_count {
        bail!("--shard {}/{}: the index must be below the count", s.shard_index, s.shard_count);
    }
    let (model, tok) = runtime::open_model(model_dir, runtime::DecodeLayout::Mapped)?;
    let c = &model.config;
    let (n_layers, ff, d) = (c.num_hidden_layers, c.intermediate_size, c.hidden_size);
    if s.seq_len == 0 || s.seq_len > model.max_context() {
        bail!("--seq-len {} must be in 1..={}", s.seq_len, model.max_context());
    }
    let corpus = expand_corpus(&s.corpus.iter().map(PathBuf::from).collect::<Vec<_>>())?;
    let seqs = corpus_sequences(&tok, &corpus, s.seq_len, s.sequences)?;
    if seqs.is_empty() || (s.thresholds_from.is_none() && seqs.len() < s.threshold_sequences.max(1)) {
        bail!(
            "the corpus gives {} sequences of {} tokens; {} are needed for the thresholds",
            seqs.len(),
            s.seq_len,
            s.threshold_sequences.max(1)
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("{}: cannot create", out.display()))?;
    let t0 = std::time::Instant::now();
    let bar = |n: usize, what: &'static str| {
        let pb = if show_progress { ProgressBar::new(n as u64) } else { ProgressBar::hidden() };
        pb.set_style(
            ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} sequences ({elapsed}, eta {eta})").unwrap(),
        );
        pb.set_message(what);
        pb
    };

    let mut cache = model.new_cache(s.seq_len)?;
    let th = match &s.thresholds_from {
        Some(p) => {
            let t = Thresholds::load(Path::new(p))?;
            let n = t.n_layers();
            if t.mask_kind != s.mask_kind || n != n_layers {
                bail!(
                    "{p}: thresholds for {:?} masks of {n} layers; this capture is {:?} on {n_layers} layers",
                    t.mask_kind,
                    s.mask_kind
                );
            }
            t
        }
        None => thresholds(&model, &seqs, s, &mut cache, show_progress)?,
    };
    let th_path = out.join("thresholds.json");
    let th_text = serde_json::to_string_pretty(&th)?;
    formats::safetensors_io::write_atomic(&formats::safetensors_io::tmp_path(&th_path), &th_path, th_text.as_bytes())?;

    // 2. masks of this shard's sequences
    let mask_bytes = ff.div_ceil(8);
    let mut fields = vec![
        Field::new("sequence", DataType::UInt32, false),
        Field::new("position", DataType::UInt32, false),
        Field::new("token", DataType::UInt32, false),
        Field::new(
            "hidden_after_layer0",
            DataType::FixedSizeList(Arc::new(Field::new("item", DataType::Float16, false)), d as i32),
            false,
        ),
    ];
    let mask_names: Vec<String> = match s.mask_kind {
        MaskKind::Product => (0..n_layers).map(|l| format!("mask_l{l:02}")).collect(),
        MaskKind::GateUp => (0..n_layers)
            .map(|l| format!("gate_mask_l{l:02}"))
            .chain((0..n_layers).map(|l| format!("up_mask_l{l:02}")))
            .collect(),
    };
    fields.extend(mask_names.iter().map(|n| Field::new(n, DataType::FixedSizeBinary(mask_bytes as i32), false)));
    let schema = Arc::new(Schema::new(fields).with_metadata(std::collections::HashMap::<String, String>::from([
        ("mask_kind".to_string(), serde_json::to_value(s.mask_kind)?.as_str().unwrap_or_default().to_string()),
        ("bit_order".to_string(), "neuron n is bit n % 8 of byte n / 8".to_string()),
        ("alpha".to_string(), s.alpha.to_string()),
        ("intermediate_size".to_string(), ff.to_string()),
    ])));
    let shard_path = out.join(format!("masks-{:03}-of-{:03}.arrow", s.shard_index, s.shard_count));
    let tmp = formats::safetensors_io::tmp_path(&shard_path);
    let file = std::fs::File::create(&tmp).with_context(|| format!("{}: cannot create", tmp.display()))?;
    let mut writer = arrow_ipc::writer::FileWriter::try_new(std::io::BufWriter::new(file), &schema)?;
    let mine: Vec<(usize, &Vec<u32>)> =
        seqs.iter().enumerate().filter(|(i, _)| i % s.shard_count == s.shard_index).collect();
    let mut active_total = vec![0u64; n_layers];
    let pb = bar(mine.len(), "masks");
    for &(seq_idx, seq) in &mine {
        let mut obs = MaskObserver {
            th: &th,
            n_ff: ff,
            masks: vec![Vec::with_capacity(seq.len() * mask_bytes); mask_names.len()],
            hidden0: Vec::with_capacity(seq.len() * d),
            active: vec![0; n_layers],
        };
        cache.clear();
        model.forward_observed(seq, &mut cache, seq.len(), Some(&mut obs))?;
        let n = seq.len();
        let mut cols: Vec<ArrayRef> = Vec::with_capacity(4 + mask_names.len());
        let u32col = |f: &dyn Fn(usize) -> u32| {
            let mut b = UInt32Builder::with_capacity(n);
            (0..n).for_each(|i| b.append_value(f(i)));
            Arc::new(b.finish()) as ArrayRef
        };
        cols.push(u32col(&|_| seq_idx as u32));
        cols.push(u32col(&|i| i as u32));
        cols.push(u32col(&|i| seq[i]));
        let mut hb = FixedSizeListBuilder::with_capacity(Float16Builder::with_capacity(n * d), d as i32, n)
            .with_field(Arc::new(Field::new("item", DataType::Float16, false)));
        for row in obs.hidden0.chunks_exact(d) {
            row.iter().for_each(|&v| hb.values().append_value(f16::from_f32(v)));
            hb.append(true);
        }
        cols.push(Arc::new(hb.finish()));
        for m in &obs.masks {
            let mut b = FixedSizeBinaryBuilder::with_capacity(n, mask_bytes as i32);
            for row in m.chunks_exact(mask_bytes) {
                b.append_value(row)?;
            }
            cols.push(Arc::new(b.finish()));
        }
        writer.write(&RecordBatch::try_new(schema.clone(), cols)?)?;
        active_total.iter_mut().zip(&obs.active).for_each(|(a, b)| *a += b);
        pb.inc(1);
    }
    writer.finish()?;
    let f = writer.into_inner()?.into_inner().map_err(|e| anyhow::anyhow!("{}: {}", tmp.display(), e.error()))?;
    f.sync_all()?;
    std::fs::rename(&tmp, &shard_path)?;
    pb.finish_and_clear();
    let tokens = mine.iter().map(|(_, s)| s.len()).sum::<usize>();
    let summary = CaptureSummary {
        settings: s.clone(),
        model: model_dir.display().to_string(),
        shard_path: shard_path.display().to_string(),
        sequences_captured: mine.len(),
        tokens_captured: tokens,
        density_per_layer: active_total.iter().map(|&a| a as f64 / (tokens * ff).max(1) as f64).collect(),
        thresholds_path: th_path.display().to_string(),
        seconds: t0.elapsed().as_secs_f64(),
    };
    let sum_path = out.join(format!("capture-{:03}-of-{:03}.json", s.shard_index, s.shard_count));
    formats::safetensors_io::write_atomic(
        &formats::safetensors_io::tmp_path(&sum_path),
        &sum_path,
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_quantile_is_within_a_bin() {
        let mut h = MagnitudeHistogram::default();
        let vals: Vec<f32> = (1..=100_000).map(|i| i as f32 * 1e-4).collect();
        vals.iter().for_each(|&v| h.add(-v)); // sign is ignored
        for q in [0.1, 0.5, 0.62, 0.9] {
            let exact = vals[(q * vals.len() as f64) as usize - 1];
            let got = h.quantile(q);
            assert!(got >= exact && got / exact - 1.0 <= 1.0 / 128.0, "q={q}: {got} vs {exact}");
        }
    }

    #[test]
    fn bits_are_packed_lsb_first() {
        let mut out = vec![];
        let n = pack_bits([true, false, false, true, false, false, false, false, true].into_iter(), 9, &mut out);
        assert_eq!((out, n), (vec![0b0000_1001, 0b0000_0001], 3));
    }
}
