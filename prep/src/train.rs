//! `prep train`: the shared activation predictor (NeuroPrefetcher §3; layout in
//! `formats::predictor`). Inputs per captured token: the hidden state after layer 0 and the
//! layer-0 centroid id (its label from `prep cluster`); targets: the label of every sparse
//! layer. Cross-entropy summed over the heads, AdamW, held-out split by sequence (the last
//! tenth), early stopping on the held-out loss, best epoch kept. candle-nn does the training
//! (autograd, AdamW); the runtime runs the saved network with its own kernels, and this stage
//! reloads the saved file through the runtime to check both agree.

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Module, Tensor};
use candle_nn::{Embedding, LayerNorm, Linear, Optimizer, VarBuilder, VarMap};
use formats::centroids::{overlap, CentroidTable};
use formats::predictor::{PredictorSpec, LAYER_NORM_EPS, SPEC_KEY};
use formats::safetensors_io::{write_raw_safetensors, MappedSafetensors, RawTensor};
use indicatif::{ProgressBar, ProgressStyle};
use rand::{seq::SliceRandom, SeedableRng};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainSettings {
    /// Width of the residual trunk; None: the largest multiple of 64 (at most 1,024) that keeps
    /// the predictor within `max_param_share` of the base model.
    #[serde(default)]
    pub hidden: Option<usize>,
    #[serde(default = "default_blocks")]
    pub blocks: usize,
    #[serde(default = "default_c0_dim")]
    pub c0_embedding_dim: usize,
    #[serde(default = "default_epochs")]
    pub max_epochs: usize,
    #[serde(default = "default_batch")]
    pub batch: usize,
    #[serde(default = "default_lr")]
    pub learning_rate: f64,
    #[serde(default = "default_wd")]
    pub weight_decay: f64,
    /// Stop after this many epochs without a better held-out loss.
    #[serde(default = "default_patience")]
    pub patience: usize,
    /// The predictor may hold at most this share of the base model's parameters (issue: 3%).
    #[serde(default = "default_share")]
    pub max_param_share: f64,
    #[serde(default)]
    pub seed: u64,
}

fn default_blocks() -> usize {
    4
}
fn default_c0_dim() -> usize {
    64
}
fn default_epochs() -> usize {
    40
}
fn default_batch() -> usize {
    256
}
fn default_lr() -> f64 {
    1e-3
}
fn default_wd() -> f64 {
    0.01
}
fn default_patience() -> usize {
    4
}
fn default_share() -> f64 {
    0.03
}

impl Default for TrainSettings {
    fn default() -> Self {
        toml::from_str("").expect("defaults")
    }
}

#[derive(Debug, Serialize)]
pub struct LayerHeldOut {
    pub layer: usize,
    pub top1_accuracy: f64,
    /// Share of the truly active neurons inside the predicted centroid's set.
    pub recall: f64,
    /// The same with the best possible centroid (the label): the ceiling set by clustering.
    pub label_recall: f64,
    pub predicted_set_size: f64,
}

#[derive(Debug, Serialize)]
pub struct TrainSummary {
    pub spec: PredictorSpec,
    pub parameters: usize,
    pub base_model_parameters: usize,
    pub param_share: f64,
    pub train_tokens: usize,
    pub heldout_tokens: usize,
    pub epochs_run: usize,
    pub best_epoch: usize,
    pub heldout_loss: f64,
    /// Loss of always predicting the most frequent training label, per head (a floor to beat).
    pub heldout_loss_majority: f64,
    pub heldout_top1: f64,
    pub heldout_top1_majority: f64,
    pub heldout_recall: f64,
    pub layers: Vec<LayerHeldOut>,
    /// The saved f16 file reloaded by the runtime vs candle on the same f16 weights.
    pub reload_max_abs_logit_diff: f32,
    pub reload_top1_agreement: f64,
    pub predictor_path: String,
    pub seconds: f64,
}

/// Parameters of the base model (sum over its safetensors files).
pub fn base_model_parameters(model_dir: &Path) -> Result<usize> {
    let mut n = 0;
    for f in formats::model_dir::safetensors_files(model_dir)? {
        let st = MappedSafetensors::open(&f)?;
        n += st.tensors.values().map(|e| e.shape.iter().product::<usize>()).sum::<usize>();
    }
    Ok(n)
}

struct Net {
    c0_embedding: Embedding,
    input: Linear,
    blocks: Vec<(LayerNorm, Linear, Linear)>,
    norm: LayerNorm,
    heads: Linear,
}

impl Net {
    fn new(s: &PredictorSpec, vb: VarBuilder) -> candle_core::Result<Self> {
        let (h, e) = (s.hidden, s.c0_embedding_dim);
        let blocks = (0..s.blocks)
            .map(|i| {
                let b = vb.pp(format!("blocks.{i}"));
                Ok((
                    candle_nn::layer_norm(h, LAYER_NORM_EPS, b.pp("norm"))?,
                    candle_nn::linear(h, h, b.pp("fc1"))?,
                    candle_nn::linear(h, h, b.pp("fc2"))?,
                ))
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Net {
            c0_embedding: candle_nn::embedding(s.k_layer0, e, vb.pp("c0_embedding"))?,
            input: candle_nn::linear(s.d_model + e, h, vb.pp("input"))?,
            blocks,
            norm: candle_nn::layer_norm(h, LAYER_NORM_EPS, vb.pp("norm"))?,
            heads: candle_nn::linear(h, s.n_sparse_layers * s.k, vb.pp("heads"))?,
        })
    }

    /// h0 `[b, d]`, c0 `[b]` u32 -> logits `[b, S * K]`; the network of `formats::predictor`.
    fn forward(&self, h0: &Tensor, c0: &Tensor) -> candle_core::Result<Tensor> {
        let rms = h0.sqr()?.mean_keepdim(1)?.affine(1.0, 1e-6)?.sqrt()?;
        let x = Tensor::cat(&[&h0.broadcast_div(&rms)?, &self.c0_embedding.forward(c0)?], 1)?;
        let mut z = self.input.forward(&x)?;
        for (norm, fc1, fc2) in &self.blocks {
            z = (&z + fc2.forward(&fc1.forward(&norm.forward(&z)?)?.silu()?)?)?;
        }
        self.heads.forward(&self.norm.forward(&z)?)
    }
}

/// Largest multiple of 64 (<= 1,024) whose predictor fits `max_params`.
fn auto_hidden(mut spec: PredictorSpec, max_params: usize) -> usize {
    let mut best = 64;
    for h in (64..=1024).step_by(64) {
        spec.hidden = h;
        if spec.parameter_count() <= max_params {
            best = h;
        }
    }
    best
}

struct Data {
    h0: Vec<f32>,      // [n, d]
    c0: Vec<u32>,      // [n]
    targets: Vec<u32>, // [n, S]
}

impl Data {
    fn batch(&self, idx: &[usize], d: usize, s: usize, dev: &Device) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
        let mut h = Vec::with_capacity(idx.len() * d);
        let mut c = Vec::with_capacity(idx.len());
        let mut t = Vec::with_capacity(idx.len() * s);
        for &i in idx {
            h.extend_from_slice(&self.h0[i * d..(i + 1) * d]);
            c.push(self.c0[i]);
            t.extend_from_slice(&self.targets[i * s..(i + 1) * s]);
        }
        Ok((
            Tensor::from_vec(h, (idx.len(), d), dev)?,
            Tensor::from_vec(c, idx.len(), dev)?,
            Tensor::from_vec(t, idx.len() * s, dev)?,
        ))
    }
}

fn read_labels(path: &Path, layer: usize, n: usize) -> Result<Vec<u32>> {
    let st = MappedSafetensors::open(path)?;
    let name = format!("labels_l{layer:02}");
    let e = st
        .tensors
        .get(&name)
        .with_context(|| format!("{}: no tensor {name} (was layer {layer} clustered?)", path.display()))?;
    let v: Vec<u32> = st.bytes(e).chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as u32).collect();
    if v.len() != n {
        bail!(
            "{}: {name} has {} labels but the capture has {n} tokens (a cluster of another capture?)",
            path.display(),
            v.len()
        );
    }
    Ok(v)
}

#[allow(clippy::too_many_arguments)]
pub fn train(
    model_dir: &Path,
    capture: &Path,
    cluster: &Path,
    dense_prefix: usize,
    out: &Path,
    settings: &TrainSettings,
    show_progress: bool,
) -> Result<TrainSummary> {
    let t0 = std::time::Instant::now();
    let cfg = formats::model_dir::ModelConfig::load(model_dir)?;
    let n_layers = cfg.num_hidden_layers;
    if dense_prefix == 0 || dense_prefix >= n_layers {
        bail!("dense prefix {dense_prefix}: the predictor needs 1 <= d < {n_layers} (it runs after layer 0 and predicts layers d..{n_layers})");
    }
    let masks = crate::shards::read_masks(capture)?;
    if masks.names.iter().any(|n| n.starts_with("gate_")) {
        bail!("{}: gate-up masks; the predictor is built for product masks (the recipes' default)", capture.display());
    }
    let (h0, d) = crate::shards::read_hidden0(capture)?;
    let n = masks.rows();
    if d != cfg.hidden_size || h0.len() != n * d {
        bail!(
            "{}: hidden states are {d} wide for {} tokens; the model has hidden size {} ({n} tokens masked)",
            capture.display(),
            h0.len() / d.max(1),
            cfg.hidden_size
        );
    }
    let labels_path = cluster.join("labels.safetensors");
    let centroids = CentroidTable::load(&cluster.join("centroids.safetensors"))?;
    let s_layers = n_layers - dense_prefix;
    let c0 = read_labels(&labels_path, 0, n)?;
    let mut per_layer = Vec::new();
    for l in dense_prefix..n_layers {
        per_layer.push(read_labels(&labels_path, l, n)?);
    }
    let mut targets = vec![0u32; n * s_layers];
    for (si, lab) in per_layer.iter().enumerate() {
        for i in 0..n {
            targets[i * s_layers + si] = lab[i];
        }
    }
    let k = centroids.layer(dense_prefix)?.k;
    let k_layer0 = centroids.layer(0)?.k;
    let base = base_model_parameters(model_dir)?;
    let mut spec = PredictorSpec {
        d_model: d,
        first_layer: dense_prefix,
        n_sparse_layers: s_layers,
        k,
        k_layer0,
        c0_embedding_dim: settings.c0_embedding_dim,
        hidden: 0,
        blocks: settings.blocks,
    };
    let max_params = (settings.max_param_share * base as f64) as usize;
    spec.hidden = settings.hidden.unwrap_or_else(|| auto_hidden(spec.clone(), max_params));
    if spec.parameter_count() > max_params {
        bail!(
            "predictor of hidden {} has {} parameters, over {:.1}% of the model's {base} ({max_params})",
            spec.hidden,
            spec.parameter_count(),
            settings.max_param_share * 100.0
        );
    }

    // held-out split: the last tenth of the sequences (at least one)
    let mut seqs: Vec<u32> = masks.sequence.clone();
    seqs.sort_unstable();
    seqs.dedup();
    if seqs.len() < 2 {
        bail!(
            "{}: {} captured sequence(s); training needs at least 2 (one is held out)",
            capture.display(),
            seqs.len()
        );
    }
    let n_held = (seqs.len() / 10).max(1);
    let held: std::collections::HashSet<u32> = seqs[seqs.len() - n_held..].iter().copied().collect();
    let (mut train_idx, held_idx): (Vec<usize>, Vec<usize>) = (0..n).partition(|&i| !held.contains(&masks.sequence[i]));
    let data = Data { h0, c0, targets };

    let dev = Device::Cpu;
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let net = Net::new(&spec, vb)?;
    // candle's CPU generator cannot be seeded: initialise every weight from our seeded one, so
    // a run is reproducible (PyTorch's defaults: U(+-1/sqrt(fan_in)) for linear layers, unit
    // variance for the embedding, LayerNorm at 1 and 0)
    let mut init_rng = rand::rngs::StdRng::seed_from_u64(settings.seed ^ 0x5eed);
    {
        let mut varmap = varmap.clone();
        for (name, shape) in spec.tensors() {
            let fan_in = if name.starts_with("c0_embedding") {
                0
            } else if shape.len() == 2 {
                shape[1]
            } else {
                spec.tensors()
                    .iter()
                    .find(|(n, _)| *n == name.replace(".bias", ".weight"))
                    .map(|(_, s)| s.get(1).copied().unwrap_or(0))
                    .unwrap_or(0)
            };
            let n: usize = shape.iter().product();
            let values: Vec<f32> = if name.contains("norm.weight") {
                vec![1.0; n]
            } else if name.contains("norm.bias") {
                vec![0.0; n]
            } else {
                let bound = if fan_in == 0 { 3f32.sqrt() } else { 1.0 / (fan_in as f32).sqrt() };
                (0..n).map(|_| rand::Rng::gen_range(&mut init_rng, -bound..bound)).collect()
            };
            varmap.set_one(&name, Tensor::from_vec(values, shape.as_slice(), &dev)?)?;
        }
    }
    let mut opt = candle_nn::AdamW::new(
        varmap.all_vars(),
        candle_nn::ParamsAdamW {
            lr: settings.learning_rate,
            weight_decay: settings.weight_decay,
            ..Default::default()
        },
    )?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(settings.seed);

    let evaluate = |net: &Net| -> Result<(f64, Vec<u32>)> {
        let mut loss_sum = 0.0;
        let mut pred = Vec::with_capacity(held_idx.len() * s_layers);
        for chunk in held_idx.chunks(1024) {
            let (h, c, t) = data.batch(chunk, d, s_layers, &dev)?;
            let logits = net.forward(&h, &c)?.reshape((chunk.len() * s_layers, k))?;
            loss_sum += candle_nn::loss::cross_entropy(&logits, &t)?.to_scalar::<f32>()? as f64 * chunk.len() as f64;
            pred.extend(logits.argmax(1)?.to_vec1::<u32>()?);
        }
        Ok((loss_sum / held_idx.len() as f64, pred))
    };

    let pb = if show_progress { ProgressBar::new(settings.max_epochs as u64) } else { ProgressBar::hidden() };
    pb.set_style(ProgressStyle::with_template("train [{bar:40}] epoch {pos}/{len} {msg} ({elapsed})").unwrap());
    // (held-out loss, epoch, weights, predictions) of the best epoch so far
    type Best = (f64, usize, HashMap<String, Tensor>, Vec<u32>);
    let mut best: Option<Best> = None;
    let mut epochs_run = 0;
    for epoch in 0..settings.max_epochs {
        epochs_run = epoch + 1;
        train_idx.shuffle(&mut rng);
        for chunk in train_idx.chunks(settings.batch) {
            let (h, c, t) = data.batch(chunk, d, s_layers, &dev)?;
            let logits = net.forward(&h, &c)?.reshape((chunk.len() * s_layers, k))?;
            let loss = candle_nn::loss::cross_entropy(&logits, &t)?;
            opt.backward_step(&loss)?;
        }
        let (loss, pred) = evaluate(&net)?;
        pb.set_message(format!("held-out loss {loss:.3}"));
        pb.inc(1);
        if best.as_ref().is_none_or(|b| loss < b.0) {
            let snapshot = varmap
                .data()
                .lock()
                .unwrap()
                .iter()
                .map(|(k, v)| Ok((k.clone(), v.as_tensor().copy()?)))
                .collect::<candle_core::Result<HashMap<_, _>>>()?;
            best = Some((loss, epoch + 1, snapshot, pred));
        } else if epoch + 1 - best.as_ref().unwrap().1 >= settings.patience {
            break;
        }
    }
    pb.finish_and_clear();
    let (heldout_loss, best_epoch, weights, pred) = best.context("no epoch ran (max_epochs = 0?)")?;

    // majority-label baseline (per head, from the training split)
    let mut majority = vec![0u32; s_layers];
    let mut maj_loss = 0.0;
    let mut maj_hits = 0usize;
    for si in 0..s_layers {
        let mut counts = vec![0usize; k];
        train_idx.iter().for_each(|&i| counts[data.targets[i * s_layers + si] as usize] += 1);
        majority[si] = (0..k).max_by_key(|&c| counts[c]).unwrap_or(0) as u32;
        // smoothed frequency model: -log p(label)
        let total = train_idx.len() as f64 + k as f64;
        for &i in &held_idx {
            let lab = data.targets[i * s_layers + si] as usize;
            maj_loss += -((counts[lab] as f64 + 1.0) / total).ln();
            maj_hits += (lab as u32 == majority[si]) as usize;
        }
    }
    let heldout_n = held_idx.len() * s_layers;

    // per-layer held-out accuracy and recall
    let mut layers = Vec::new();
    let (mut all_active, mut all_covered) = (0u64, 0u64);
    for si in 0..s_layers {
        let layer = dense_prefix + si;
        let set = centroids.layer(layer)?;
        let col = masks
            .names
            .iter()
            .position(|c| c == &format!("mask_l{layer:02}"))
            .with_context(|| format!("no mask_l{layer:02} in the capture"))?;
        let bits = &masks.cols[col];
        let (mut hits, mut active, mut covered, mut label_covered, mut size) = (0usize, 0u64, 0u64, 0u64, 0u64);
        for (j, &i) in held_idx.iter().enumerate() {
            let m = &bits[i * masks.width..(i + 1) * masks.width];
            let p = pred[j * s_layers + si] as usize;
            let lab = data.targets[i * s_layers + si] as usize;
            hits += (p == lab) as usize;
            active += m.iter().map(|b| b.count_ones() as u64).sum::<u64>();
            covered += overlap(m, set.row(p));
            label_covered += overlap(m, set.row(lab));
            size += set.row(p).iter().map(|b| b.count_ones() as u64).sum::<u64>();
        }
        all_active += active;
        all_covered += covered;
        let nh = held_idx.len().max(1) as f64;
        layers.push(LayerHeldOut {
            layer,
            top1_accuracy: hits as f64 / nh,
            recall: covered as f64 / active.max(1) as f64,
            label_recall: label_covered as f64 / active.max(1) as f64,
            predicted_set_size: size as f64 / nh,
        });
    }

    // save f16, with the spec in the metadata
    std::fs::create_dir_all(out)?;
    let path = out.join("predictor.safetensors");
    let mut tensors = Vec::new();
    for (name, shape) in spec.tensors() {
        let t = weights.get(&name).with_context(|| format!("trained network has no tensor {name}"))?;
        if t.dims() != shape.as_slice() {
            bail!("trained tensor {name} has shape {:?}, layout says {shape:?}", t.dims());
        }
        let v = t.flatten_all()?.to_vec1::<f32>()?;
        tensors.push(RawTensor {
            name,
            dtype: safetensors::Dtype::F16,
            shape,
            bytes: v.iter().flat_map(|x| half::f16::from_f32(*x).to_le_bytes()).collect(),
        });
    }
    let meta = HashMap::from([(SPEC_KEY.to_string(), serde_json::to_string(&spec)?)]);
    write_raw_safetensors(&path, &tensors, Some(meta))?;

    // reload: the runtime's forward pass vs candle on the same (f16-rounded) weights
    let rt = runtime::predictor::Predictor::load(&path)?;
    let reloaded = candle_core::safetensors::load(&path, &dev)?
        .into_iter()
        .map(|(k, v)| Ok((k, v.to_dtype(DType::F32)?)))
        .collect::<candle_core::Result<HashMap<_, _>>>()?;
    let net16 = Net::new(&spec, VarBuilder::from_tensors(reloaded, DType::F32, &dev))?;
    let check: Vec<usize> = held_idx.iter().copied().take(256).collect();
    let (h, c, _) = data.batch(&check, d, s_layers, &dev)?;
    let cand = net16.forward(&h, &c)?.flatten_all()?.to_vec1::<f32>()?;
    let h_rows: Vec<f32> = check.iter().flat_map(|&i| data.h0[i * d..(i + 1) * d].iter().copied()).collect();
    let c_rows: Vec<u32> = check.iter().map(|&i| data.c0[i]).collect();
    let ours = rt.logits(&h_rows, &c_rows);
    let max_diff = cand.iter().zip(&ours).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    let argmax = runtime::sampler::argmax;
    let agree = cand.chunks_exact(k).zip(ours.chunks_exact(k)).filter(|(a, b)| argmax(a) == argmax(b)).count();

    let summary = TrainSummary {
        parameters: spec.parameter_count(),
        base_model_parameters: base,
        param_share: spec.parameter_count() as f64 / base as f64,
        spec,
        train_tokens: train_idx.len(),
        heldout_tokens: held_idx.len(),
        epochs_run,
        best_epoch,
        heldout_loss,
        heldout_loss_majority: maj_loss / heldout_n as f64,
        heldout_top1: layers.iter().map(|l| l.top1_accuracy).sum::<f64>() / s_layers as f64,
        heldout_top1_majority: maj_hits as f64 / heldout_n as f64,
        heldout_recall: all_covered as f64 / all_active.max(1) as f64,
        layers,
        reload_max_abs_logit_diff: max_diff,
        reload_top1_agreement: agree as f64 / (check.len() * s_layers).max(1) as f64,
        predictor_path: path.display().to_string(),
        seconds: t0.elapsed().as_secs_f64(),
    };
    let jpath: PathBuf = out.join("train.json");
    formats::safetensors_io::write_atomic(
        &formats::safetensors_io::tmp_path(&jpath),
        &jpath,
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    Ok(summary)
}
