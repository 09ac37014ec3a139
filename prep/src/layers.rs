//! `prep layers`: the per-layer predictors (layout: `formats::layer_predictors`; at inference:
//! `runtime::layer_predictor`). For each sparse layer, a low-rank network `w2 relu(w1 x + b1) +
//! b2` from the layer's own normed MLP input to a score per neuron, trained (candle, AdamW) to
//! mark each token's largest `|silu(g) * u|`: weighted binary cross-entropy on the top
//! `label_share` of n_ff, positives weighted `(1 - s) / s` so a miss costs as much as all the
//! false alarms it trades against (recall of the top set is what quality needs).
//!
//! 1. Capture: the dense model (the runtime's forward pass, `MlpHook::observe_input`) over
//!    calibration sequences; per layer, the inputs (f16) and each token's top set (bits) are
//!    appended to files in `<out>/work/`, so only one layer's data is ever in memory. Held-out
//!    sequences also keep the exact `|h|` (f16) for the recall figures.
//! 2. Train each layer, keeping the epoch of best held-out recall.
//! 3. Save f16, reload through the runtime, check both rank alike, and report the held-out
//!    recall of the oracle's top set at 15, 20, 25 and 30% of n_ff (and, with
//!    `compare_previous`, of predictors that read the previous layer's input instead).
//!
//! The rank: the largest whose predictors together cost at most `max_mlp_share` (5%) of the
//! sparse layers' MLP at 4.5 bits per weight (Q4_K), in f16.

use crate::capture::{corpus_sequences, expand_corpus};
use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor, Var};
use formats::layer_predictors::{LayerPredictorFile, LayerPredictorSpec, LayerPredictorWeights, PredictorInput};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{seq::SliceRandom, Rng, SeedableRng};
use runtime::layer_predictor::{oracle_hits, top_k, LayerPredictors};
use runtime::model::MlpHook;
use serde::{Deserialize, Serialize};
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LayersSettings {
    /// Calibration sequences for training (capture's corpus and sequence length).
    #[serde(default = "default_sequences")]
    pub sequences: usize,
    /// Further sequences held out for the recall figures and the choice of epoch.
    #[serde(default = "default_heldout")]
    pub heldout_sequences: usize,
    /// The training labels: each token's largest |h|, this share of n_ff.
    #[serde(default = "default_label_share")]
    pub label_share: f64,
    /// All predictors together cost at most this share of the sparse layers' 4-bit MLP.
    #[serde(default = "default_mlp_share")]
    pub max_mlp_share: f64,
    /// Overrides the rank the share gives.
    #[serde(default)]
    pub rank: Option<usize>,
    #[serde(default = "default_epochs")]
    pub epochs: usize,
    #[serde(default = "default_batch")]
    pub batch: usize,
    #[serde(default = "default_lr")]
    pub learning_rate: f64,
    /// Also train predictors on the previous layer's input and report their recall (not
    /// shipped).
    #[serde(default)]
    pub compare_previous: bool,
    #[serde(default)]
    pub seed: u64,
}

fn default_sequences() -> usize {
    24
}
fn default_heldout() -> usize {
    2
}
fn default_label_share() -> f64 {
    0.25
}
fn default_mlp_share() -> f64 {
    0.05
}
fn default_epochs() -> usize {
    6
}
fn default_batch() -> usize {
    256
}
fn default_lr() -> f64 {
    5e-3
}

impl Default for LayersSettings {
    fn default() -> Self {
        toml::from_str("").expect("defaults")
    }
}

/// The set sizes recall is reported at (shares of n_ff).
pub const RECALL_SHARES: [f64; 4] = [0.15, 0.20, 0.25, 0.30];

#[derive(Debug, Serialize)]
pub struct LayerRecall {
    pub layer: usize,
    pub best_epoch: usize,
    /// At each of [`RECALL_SHARES`]: the share of the oracle's top set inside the predicted one.
    pub recall: Vec<f64>,
    /// The same for predictors of the previous layer's input (`compare_previous`).
    pub recall_previous: Option<Vec<f64>>,
    /// The same for the static set: the neurons most often in the training top sets.
    pub recall_static: Vec<f64>,
}

#[derive(Debug, Serialize)]
pub struct LayersSummary {
    pub spec: LayerPredictorSpec,
    pub predictor_bytes: u64,
    /// The sparse layers' MLP at 4.5 bits per weight, and the predictors' share of it.
    pub mlp_4bit_bytes: u64,
    pub mlp_share: f64,
    pub train_tokens: usize,
    pub heldout_tokens: usize,
    pub recall_shares: Vec<f64>,
    /// Means over layers, at each share.
    pub recall: Vec<f64>,
    pub recall_previous: Option<Vec<f64>>,
    pub recall_static: Vec<f64>,
    pub layers: Vec<LayerRecall>,
    /// The saved f16 file reloaded by the runtime vs candle on the same weights.
    pub reload_max_abs_score_diff: f32,
    pub reload_top_set_agreement: f64,
    pub path: String,
    pub seconds: f64,
}

/// The largest rank whose f16 predictors for `layers` layers fit `share` of their 4-bit MLP.
pub fn rank_for_share(d: usize, n_ff: usize, share: f64) -> usize {
    let mlp_4bit = 3.0 * d as f64 * n_ff as f64 * 4.5 / 8.0;
    let per_rank = 2.0 * (d + 1 + n_ff) as f64;
    (((share * mlp_4bit - 2.0 * n_ff as f64) / per_rank).floor() as usize).max(1)
}

/// Appends each layer's inputs, top-set bits and (held out) exact |h| to files.
struct Capture {
    n_ff: usize,
    /// Layers whose inputs are written (from the first predicted one, or the one before).
    inputs_from: usize,
    first: usize,
    keep: usize,
    heldout: bool,
    xn: Vec<BufWriter<std::fs::File>>,
    xn_heldout: Vec<BufWriter<std::fs::File>>,
    top: Vec<BufWriter<std::fs::File>>,
    top_counts: Vec<Vec<u64>>,
    h_heldout: Vec<BufWriter<std::fs::File>>,
    error: Option<std::io::Error>,
}

fn f16_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| f16::from_f32(*x).to_le_bytes()).collect()
}

#[derive(Clone, Copy)]
enum Stream {
    Inputs,
    HeldOutInputs,
    TopBits,
    HeldOutH,
}

impl Capture {
    /// Appends to layer `i`'s file of `stream` (the first write error is kept and reported).
    fn write(&mut self, stream: Stream, i: usize, bytes: &[u8]) {
        let files = match stream {
            Stream::Inputs => &mut self.xn,
            Stream::HeldOutInputs => &mut self.xn_heldout,
            Stream::TopBits => &mut self.top,
            Stream::HeldOutH => &mut self.h_heldout,
        };
        if let Err(e) = files[i].write_all(bytes) {
            self.error.get_or_insert(e);
        }
    }
}

impl MlpHook for Capture {
    fn observe_input(&mut self, layer: usize, xn: &[f32]) {
        if layer >= self.inputs_from {
            let stream = if self.heldout { Stream::HeldOutInputs } else { Stream::Inputs };
            self.write(stream, layer - self.inputs_from, &f16_bytes(xn));
        }
    }

    fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
        if layer < self.first {
            return;
        }
        let li = layer - self.first;
        let n_ff = self.n_ff;
        for (g, u) in gate_silu.chunks_exact(n_ff).zip(up.chunks_exact(n_ff)) {
            let h: Vec<f32> = g.iter().zip(u).map(|(a, b)| (a * b).abs()).collect();
            if self.heldout {
                self.write(Stream::HeldOutH, li, &f16_bytes(&h));
            } else {
                let mut bits = vec![0u8; n_ff.div_ceil(8)];
                for j in top_k(&h, self.keep) {
                    bits[j as usize / 8] |= 1 << (j % 8);
                    self.top_counts[li][j as usize] += 1;
                }
                self.write(Stream::TopBits, li, &bits);
            }
        }
    }
}

fn read_f16_file(path: &Path) -> Result<Vec<f32>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut bytes))
        .with_context(|| format!("{}: cannot read", path.display()))?;
    Ok(bytes.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32()).collect())
}

/// One layer's predictor under training.
struct Trainee {
    w1: Var, // [rank, d]
    b1: Var, // [rank]
    w2: Var, // [n_ff, rank]
    b2: Var, // [n_ff]
}

impl Trainee {
    fn new(
        d: usize,
        n_ff: usize,
        rank: usize,
        label_share: f64,
        rng: &mut impl Rng,
        dev: &Device,
    ) -> candle_core::Result<Self> {
        // PyTorch's linear init, U(+-1/sqrt(fan_in)), from our seeded generator; the output bias
        // starts at the labels' prior log-odds
        let mut uniform = |n: usize, fan_in: usize| -> Vec<f32> {
            let b = 1.0 / (fan_in as f32).sqrt();
            (0..n).map(|_| rng.gen_range(-b..b)).collect()
        };
        let prior = (label_share / (1.0 - label_share)).ln() as f32;
        Ok(Trainee {
            w1: Var::from_tensor(&Tensor::from_vec(uniform(rank * d, d), (rank, d), dev)?)?,
            b1: Var::from_tensor(&Tensor::zeros(rank, DType::F32, dev)?)?,
            w2: Var::from_tensor(&Tensor::from_vec(uniform(n_ff * rank, rank), (n_ff, rank), dev)?)?,
            b2: Var::from_tensor(&Tensor::full(prior, n_ff, dev)?)?,
        })
    }

    /// Scores `[b, n_ff]` for inputs `[b, d]`.
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        let z = x.matmul(&self.w1.as_tensor().t()?)?.broadcast_add(self.b1.as_tensor())?.relu()?;
        z.matmul(&self.w2.as_tensor().t()?)?.broadcast_add(self.b2.as_tensor())
    }

    fn vars(&self) -> Vec<Var> {
        vec![self.w1.clone(), self.b1.clone(), self.w2.clone(), self.b2.clone()]
    }

    fn to_f16(&self) -> candle_core::Result<LayerPredictorWeights> {
        let v = |t: &Var| -> candle_core::Result<Vec<f16>> {
            Ok(t.as_tensor().flatten_all()?.to_vec1::<f32>()?.into_iter().map(f16::from_f32).collect())
        };
        Ok(LayerPredictorWeights { w1: v(&self.w1)?, b1: v(&self.b1)?, w2: v(&self.w2)?, b2: v(&self.b2)? })
    }
}

/// Mean weighted binary cross-entropy of scores `z` against 0/1 labels `y`, positives weighted
/// `w_pos`: `(1 - y) softplus(z) + w_pos y softplus(-z)`.
fn weighted_bce(z: &Tensor, y: &Tensor, w_pos: f64) -> candle_core::Result<Tensor> {
    // softplus(z) = relu(z) + ln(1 + exp(-|z|)); softplus(-z) = softplus(z) - z
    let sp = (z.relu()? + z.abs()?.neg()?.exp()?.affine(1.0, 1.0)?.log()?)?;
    let neg = ((1.0 - y)? * &sp)?;
    let pos = (y * (sp - z)?)?.affine(w_pos, 0.0)?;
    (neg + pos)?.mean_all()
}

/// Recall of the oracle's top set at each share: `scores`, `h` `[n, n_ff]`.
fn recall_at(scores: &[f32], h: &[f32], n_ff: usize, shares: &[f64]) -> Vec<f64> {
    shares
        .iter()
        .map(|&s| {
            let k = ((n_ff as f64 * s).round() as usize).max(1);
            let hits: usize = scores
                .chunks_exact(n_ff)
                .zip(h.chunks_exact(n_ff))
                .map(|(sc, hh)| oracle_hits(hh, &top_k(sc, k)))
                .sum();
            hits as f64 / (k * (h.len() / n_ff)).max(1) as f64
        })
        .collect()
}

fn candle_scores(t: &Trainee, x: &[f32], d: usize, dev: &Device) -> Result<Vec<f32>> {
    let mut out = Vec::new();
    for chunk in x.chunks(1024 * d) {
        let xt = Tensor::from_vec(chunk.to_vec(), (chunk.len() / d, d), dev)?;
        out.extend(t.forward(&xt)?.flatten_all()?.to_vec1::<f32>()?);
    }
    Ok(out)
}

struct Trained {
    weights: LayerPredictorWeights,
    best_epoch: usize,
    recall: Vec<f64>,
    heldout_scores: Vec<f32>,
}

#[allow(clippy::too_many_arguments)]
fn train_layer(
    x: &[f32],
    bits: &[u8],
    x_val: &[f32],
    h_val: &[f32],
    d: usize,
    n_ff: usize,
    rank: usize,
    s: &LayersSettings,
    seed: u64,
) -> Result<Trained> {
    let dev = Device::Cpu;
    let n = x.len() / d;
    let row_bits = n_ff.div_ceil(8);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let t = Trainee::new(d, n_ff, rank, s.label_share, &mut rng, &dev)?;
    let mut opt = candle_nn::AdamW::new(
        t.vars(),
        candle_nn::ParamsAdamW { lr: s.learning_rate, weight_decay: 0.0, ..Default::default() },
    )?;
    use candle_nn::Optimizer;
    let w_pos = (1.0 - s.label_share) / s.label_share;
    let mut order: Vec<usize> = (0..n).collect();
    let mut best: Option<Trained> = None;
    for epoch in 0..s.epochs {
        order.shuffle(&mut rng);
        for chunk in order.chunks(s.batch) {
            let mut xb = Vec::with_capacity(chunk.len() * d);
            let mut yb = vec![0f32; chunk.len() * n_ff];
            for (r, &i) in chunk.iter().enumerate() {
                xb.extend_from_slice(&x[i * d..(i + 1) * d]);
                let b = &bits[i * row_bits..(i + 1) * row_bits];
                for (j, y) in yb[r * n_ff..(r + 1) * n_ff].iter_mut().enumerate() {
                    *y = (b[j / 8] >> (j % 8) & 1) as f32;
                }
            }
            let xt = Tensor::from_vec(xb, (chunk.len(), d), &dev)?;
            let yt = Tensor::from_vec(yb, (chunk.len(), n_ff), &dev)?;
            let loss = weighted_bce(&t.forward(&xt)?, &yt, w_pos)?;
            opt.backward_step(&loss)?;
        }
        let scores = candle_scores(&t, x_val, d, &dev)?;
        let recall = recall_at(&scores, h_val, n_ff, &[s.label_share])[0];
        if best.as_ref().is_none_or(|b| recall > b.recall[0]) {
            best = Some(Trained {
                weights: t.to_f16()?,
                best_epoch: epoch + 1,
                recall: vec![recall],
                heldout_scores: scores,
            });
        }
    }
    best.context("no epoch ran (epochs = 0?)")
}

#[allow(clippy::too_many_arguments)]
pub fn train_layers(
    model_dir: &Path,
    corpus: &[PathBuf],
    seq_len: usize,
    first_layer: usize,
    out: &Path,
    s: &LayersSettings,
    show_progress: bool,
) -> Result<LayersSummary> {
    let t0 = std::time::Instant::now();
    if !(s.label_share > 0.0 && s.label_share < 1.0) || s.batch == 0 || s.sequences == 0 || s.heldout_sequences == 0 {
        bail!("layers: label_share must be in (0, 1) and batch, sequences and heldout_sequences positive");
    }
    let (model, tok) = runtime::open_model(model_dir, runtime::DecodeLayout::Mapped)?;
    let c = &model.config;
    let (n_layers, n_ff, d) = (c.num_hidden_layers, c.intermediate_size, c.hidden_size);
    if first_layer == 0 && s.compare_previous {
        bail!("layers: compare_previous needs the first predicted layer >= 1 (a previous layer)");
    }
    if first_layer >= n_layers {
        bail!("layers: first layer {first_layer} is not below the model's {n_layers} layers");
    }
    let rank = s.rank.unwrap_or_else(|| rank_for_share(d, n_ff, s.max_mlp_share));
    let seqs = corpus_sequences(&tok, &expand_corpus(corpus)?, seq_len, s.sequences + s.heldout_sequences)?;
    if seqs.len() <= s.heldout_sequences {
        bail!(
            "layers: the corpus gives {} sequences of {seq_len} tokens; {} are held out and training needs more",
            seqs.len(),
            s.heldout_sequences
        );
    }
    let (train_seqs, held_seqs) = seqs.split_at(seqs.len() - s.heldout_sequences);
    let work = out.join("work");
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).with_context(|| format!("{}: cannot create", work.display()))?;
    let inputs_from = if s.compare_previous { first_layer - 1 } else { first_layer };
    let files = |name: &str, from: usize| -> Result<Vec<BufWriter<std::fs::File>>> {
        (from..n_layers)
            .map(|l| Ok(BufWriter::new(std::fs::File::create(work.join(format!("{name}-{l:02}")))?)))
            .collect()
    };
    let keep = ((n_ff as f64 * s.label_share).round() as usize).max(1);
    let mut cap = Capture {
        n_ff,
        inputs_from,
        first: first_layer,
        keep,
        heldout: false,
        xn: files("xn", inputs_from)?,
        xn_heldout: files("xn-heldout", inputs_from)?,
        top: files("top", first_layer)?,
        top_counts: vec![vec![0; n_ff]; n_layers - first_layer],
        h_heldout: files("h-heldout", first_layer)?,
        error: None,
    };
    let pb = if show_progress { ProgressBar::new(seqs.len() as u64) } else { ProgressBar::hidden() };
    pb.set_style(
        ProgressStyle::with_template("layers: capture [{bar:40}] {pos}/{len} sequences ({elapsed}, eta {eta})")
            .unwrap(),
    );
    let mut cache = model.new_cache(seq_len)?;
    for (heldout, part) in [(false, train_seqs), (true, held_seqs)] {
        cap.heldout = heldout;
        for seq in part {
            cache.clear();
            model.forward_observed(seq, &mut cache, seq.len(), Some(&mut cap))?;
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    if let Some(e) = cap.error.take() {
        return Err(e).with_context(|| format!("{}: writing the captured activations", work.display()));
    }
    for w in
        cap.xn.iter_mut().chain(cap.xn_heldout.iter_mut()).chain(cap.top.iter_mut()).chain(cap.h_heldout.iter_mut())
    {
        w.flush().with_context(|| format!("{}: writing the captured activations", work.display()))?;
    }
    let top_counts = std::mem::take(&mut cap.top_counts);
    drop(cap);
    drop(model);

    let spec = LayerPredictorSpec {
        d_model: d,
        n_ff,
        n_layers,
        first_layer,
        rank,
        input: PredictorInput::Own,
        label_share: s.label_share,
    };
    let pb = if show_progress { ProgressBar::new((n_layers - first_layer) as u64) } else { ProgressBar::hidden() };
    pb.set_style(
        ProgressStyle::with_template("layers: train [{bar:40}] {pos}/{len} layers {msg} ({elapsed}, eta {eta})")
            .unwrap(),
    );
    let mut weights = Vec::new();
    let mut layers = Vec::new();
    let mut heldout_checks = Vec::new();
    let (mut train_tokens, mut heldout_tokens) = (0, 0);
    for l in first_layer..n_layers {
        let li = l - first_layer;
        let x = read_f16_file(&work.join(format!("xn-{l:02}")))?;
        let x_val = read_f16_file(&work.join(format!("xn-heldout-{l:02}")))?;
        let h_val = read_f16_file(&work.join(format!("h-heldout-{l:02}")))?;
        let bits = std::fs::read(work.join(format!("top-{l:02}")))?;
        train_tokens = x.len() / d;
        heldout_tokens = x_val.len() / d;
        if bits.len() != train_tokens * n_ff.div_ceil(8) || h_val.len() != heldout_tokens * n_ff {
            bail!("{}: the captured files of layer {l} disagree in token count", work.display());
        }
        let own = train_layer(&x, &bits, &x_val, &h_val, d, n_ff, rank, s, s.seed ^ (l as u64) << 8)?;
        let recall = recall_at(&own.heldout_scores, &h_val, n_ff, &RECALL_SHARES);
        let recall_previous = if s.compare_previous {
            let xp = read_f16_file(&work.join(format!("xn-{:02}", l - 1)))?;
            let xp_val = read_f16_file(&work.join(format!("xn-heldout-{:02}", l - 1)))?;
            let prev = train_layer(&xp, &bits, &xp_val, &h_val, d, n_ff, rank, s, s.seed ^ (l as u64) << 8 ^ 1)?;
            Some(recall_at(&prev.heldout_scores, &h_val, n_ff, &RECALL_SHARES))
        } else {
            None
        };
        // the static set: the neurons most often in the training top sets, every token
        let counts: Vec<f32> = top_counts[li].iter().map(|&c| c as f32).collect();
        let static_scores: Vec<f32> = (0..heldout_tokens).flat_map(|_| counts.iter().copied()).collect();
        let recall_static = recall_at(&static_scores, &h_val, n_ff, &RECALL_SHARES);
        pb.set_message(format!("layer {l}: recall {:.3} at {:.0}%", recall[2], RECALL_SHARES[2] * 100.0));
        pb.inc(1);
        heldout_checks.push(x_val.iter().take(64 * d).copied().collect::<Vec<f32>>());
        layers.push(LayerRecall { layer: l, best_epoch: own.best_epoch, recall, recall_previous, recall_static });
        weights.push(own.weights);
    }
    pb.finish_and_clear();
    let _ = std::fs::remove_dir_all(&work);

    std::fs::create_dir_all(out)?;
    let path = out.join("layer_predictors.safetensors");
    LayerPredictorFile::save(&path, &spec, &weights)?;
    // reload: the runtime's scores vs candle's on the same f16 weights (candle's held-out
    // scores came from the f32 weights of the best epoch, so compare against the f16 ones)
    let rt = LayerPredictors::load(&path, d, n_ff, n_layers)?;
    let dev = Device::Cpu;
    let (mut max_diff, mut agree, mut total) = (0f32, 0usize, 0usize);
    for (li, xv) in heldout_checks.iter().enumerate() {
        let w = &weights[li];
        let f = |v: &[f16]| v.iter().map(|x| x.to_f32()).collect::<Vec<f32>>();
        let t16 = Trainee {
            w1: Var::from_tensor(&Tensor::from_vec(f(&w.w1), (rank, d), &dev)?)?,
            b1: Var::from_tensor(&Tensor::from_vec(f(&w.b1), rank, &dev)?)?,
            w2: Var::from_tensor(&Tensor::from_vec(f(&w.w2), (n_ff, rank), &dev)?)?,
            b2: Var::from_tensor(&Tensor::from_vec(f(&w.b2), n_ff, &dev)?)?,
        };
        let cand = candle_scores(&t16, xv, d, &dev)?;
        let n = xv.len() / d;
        let mut ours = vec![0f32; n * n_ff];
        rt.scores(first_layer + li, xv, n, &mut ours);
        max_diff = cand.iter().zip(&ours).map(|(a, b)| (a - b).abs()).fold(max_diff, f32::max);
        for (a, b) in cand.chunks_exact(n_ff).zip(ours.chunks_exact(n_ff)) {
            let (ta, tb) = (top_k(a, keep), top_k(b, keep));
            agree += ta.iter().filter(|j| tb.binary_search(j).is_ok()).count();
            total += keep;
        }
    }
    let mean = |f: &dyn Fn(&LayerRecall) -> Option<Vec<f64>>| -> Option<Vec<f64>> {
        let per: Vec<Vec<f64>> = layers.iter().filter_map(f).collect();
        (per.len() == layers.len()).then(|| {
            (0..RECALL_SHARES.len()).map(|i| per.iter().map(|r| r[i]).sum::<f64>() / per.len() as f64).collect()
        })
    };
    let mlp_4bit_bytes = ((n_layers - first_layer) as f64 * 3.0 * d as f64 * n_ff as f64 * 4.5 / 8.0) as u64;
    let predictor_bytes = spec.bytes_from(first_layer);
    let summary = LayersSummary {
        predictor_bytes,
        mlp_4bit_bytes,
        mlp_share: predictor_bytes as f64 / mlp_4bit_bytes as f64,
        train_tokens,
        heldout_tokens,
        recall_shares: RECALL_SHARES.to_vec(),
        recall: mean(&|l| Some(l.recall.clone())).unwrap_or_default(),
        recall_previous: mean(&|l| l.recall_previous.clone()),
        recall_static: mean(&|l| Some(l.recall_static.clone())).unwrap_or_default(),
        layers,
        reload_max_abs_score_diff: max_diff,
        reload_top_set_agreement: agree as f64 / total.max(1) as f64,
        spec,
        path: path.display().to_string(),
        seconds: t0.elapsed().as_secs_f64(),
    };
    let jpath = out.join("layers.json");
    formats::safetensors_io::write_atomic(
        &formats::safetensors_io::tmp_path(&jpath),
        &jpath,
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    Ok(summary)
}
