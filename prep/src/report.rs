//! `prep report`: what the captured masks say about streaming, per layer — achieved density
//! and reuse: the share of token t+1's active set that was already active within the last
//! k = 1, 2, 4 tokens of the same sequence (LLM in a flash's windowing; k = 1 is the plain
//! t -> t+1 reuse), for the exact masks and for the nearest pruned centroid's set.
//!
//! On calibration captures the centroid of a token is its label from `prep cluster`; on a
//! held-out capture (made with the same thresholds, `prep capture --thresholds`) it is the
//! pruned centroid with the largest overlap (all pruned sets have K_max neurons, so that is
//! also the nearest in Hamming distance).

use crate::shards::overlap;
use anyhow::{Context, Result};
use formats::safetensors_io::MappedSafetensors;
use rayon::prelude::*;
use serde::Serialize;
use std::path::Path;

pub const WINDOWS: [usize; 3] = [1, 2, 4];

#[derive(Debug, Clone, Serialize)]
pub struct LayerReport {
    pub column: String,
    pub density: f64,
    /// reuse[i]: coverage of token t+1's set by the union of the last WINDOWS[i] sets.
    pub reuse_exact: Vec<f64>,
    /// The same for the centroid sets; None where the layer was not clustered.
    pub reuse_centroid: Option<Vec<f64>>,
    /// Share of the exact active set inside the token's centroid set.
    pub centroid_recall: Option<f64>,
    /// Share of the active neurons' activation mass (sum of |silu(g) * u|) inside the token's
    /// nearest centroid set, measured on `--mass-text` (product masks only).
    pub centroid_mass_coverage: Option<f64>,
    /// With `--predictor`: the predictor's top-1 accuracy (its argmax is the best-covering
    /// centroid), the recall of the true active set by the predicted set, and the set's size.
    pub predictor_top1: Option<f64>,
    pub predictor_recall: Option<f64>,
    pub predictor_set_size: Option<f64>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub capture: String,
    pub tokens: usize,
    pub windows: Vec<usize>,
    pub layers: Vec<LayerReport>,
}

/// Coverage of each token's set by the union of the previous `k` sets (same sequence only).
fn windowed_reuse(sets: &[&[u8]], sequence: &[u32], width: usize) -> Vec<f64> {
    WINDOWS
        .iter()
        .map(|&k| {
            let (hit, need) = (k..sets.len())
                .into_par_iter()
                .filter(|&t| (1..=k).all(|j| sequence[t - j] == sequence[t]))
                .map(|t| {
                    let mut union = vec![0u8; width];
                    for j in 1..=k {
                        union.iter_mut().zip(sets[t - j]).for_each(|(u, s)| *u |= s);
                    }
                    (overlap(&union, sets[t]), sets[t].iter().map(|b| b.count_ones() as u64).sum::<u64>())
                })
                .reduce(|| (0, 0), |a, b| (a.0 + b.0, a.1 + b.1));
            hit as f64 / need.max(1) as f64
        })
        .collect()
}

pub fn report(capture: &Path, cluster: Option<&Path>) -> Result<Report> {
    let c = crate::shards::read_masks(capture)?;
    let n = c.sequence.len();
    let (cent, labels) = match cluster {
        Some(dir) => (
            Some(MappedSafetensors::open(dir.join("centroids.safetensors"))?),
            MappedSafetensors::open(dir.join("labels.safetensors")).ok(),
        ),
        None => (None, None),
    };
    // Labels apply only to the capture they were made from (same token count).
    let labels = labels.filter(|l| l.tensors.values().all(|e| e.shape == vec![n]));
    let mut layers = Vec::new();
    for (name, col) in c.names.iter().zip(&c.cols) {
        let exact: Vec<&[u8]> = col.chunks_exact(c.width).collect();
        let active: u64 = col.iter().map(|b| b.count_ones() as u64).sum();
        let density = active as f64 / (n * c.width * 8) as f64;
        let cname = name.replace("mask", "centroids");
        let (reuse_centroid, centroid_recall) = match cent.as_ref().and_then(|m| m.tensors.get(&cname).map(|e| (m, e)))
        {
            Some((m, e)) => {
                let table: Vec<&[u8]> = m.bytes(e).chunks_exact(c.width).collect();
                let lab: Vec<usize> = match labels
                    .as_ref()
                    .and_then(|l| l.tensors.get(&name.replace("mask", "labels")).map(|e| (l, e)))
                {
                    Some((l, e)) => {
                        l.bytes(e).chunks_exact(2).map(|b| u16::from_le_bytes([b[0], b[1]]) as usize).collect()
                    }
                    None => exact
                        .par_iter()
                        .map(|x| (0..table.len()).max_by_key(|&k| overlap(x, table[k])).unwrap_or(0))
                        .collect(),
                };
                let sets: Vec<&[u8]> = lab.iter().map(|&k| table[k]).collect();
                let covered: u64 = exact.iter().zip(&sets).map(|(x, s)| overlap(x, s)).sum();
                (Some(windowed_reuse(&sets, &c.sequence, c.width)), Some(covered as f64 / active.max(1) as f64))
            }
            None => (None, None),
        };
        layers.push(LayerReport {
            column: name.clone(),
            density,
            reuse_exact: windowed_reuse(&exact, &c.sequence, c.width),
            reuse_centroid,
            centroid_recall,
            centroid_mass_coverage: None,
            predictor_top1: None,
            predictor_recall: None,
            predictor_set_size: None,
        });
    }
    Ok(Report { capture: capture.display().to_string(), tokens: n, windows: WINDOWS.to_vec(), layers })
}

/// Fonts tried for plot text (Debian's fonts-dejavu-core, present on most Linux systems).
const FONT_PATHS: [&str; 2] =
    ["/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf", "/usr/share/fonts/TTF/DejaVuSans.ttf"];

/// Reuse per layer as a PNG: one line per window k, solid for exact masks, lighter with
/// markers for the centroid sets.
pub fn plot_png(r: &Report, title: &str, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let font = FONT_PATHS.iter().find_map(|p| std::fs::read(p).ok()).with_context(|| {
        format!(
            "no TrueType font for the plot text (looked for {}; apt-get install fonts-dejavu-core)",
            FONT_PATHS.join(", ")
        )
    })?;
    // plotters keeps the font for the process; leaking the bytes gives it the 'static it needs.
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("cannot load the plot font"))?;
    let layers: Vec<(usize, &LayerReport)> = r.layers.iter().map(|l| (crate::shards::layer_of(&l.column), l)).collect();
    let n_layers = layers.iter().map(|(l, _)| l + 1).max().unwrap_or(1);
    let tmp = path.with_extension("tmp.png"); // the encoder picks the format from the extension
    {
        let root = BitMapBackend::new(&tmp, (1000, 600)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(55)
            .build_cartesian_2d(-0.5f64..(n_layers as f64 - 0.5), 0f64..1f64)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("layer")
            .y_desc("share of token t+1's active set already active")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let colors = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44)];
        for (wi, &k) in WINDOWS.iter().enumerate() {
            let c = colors[wi];
            let exact: Vec<(f64, f64)> = layers.iter().map(|(l, r)| (*l as f64, r.reuse_exact[wi])).collect();
            chart
                .draw_series(LineSeries::new(exact, c.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(format!("exact masks, last {k} token{}", if k > 1 { "s" } else { "" }))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c.stroke_width(2)));
            let cent: Vec<(f64, f64)> =
                layers.iter().filter_map(|(l, r)| r.reuse_centroid.as_ref().map(|v| (*l as f64, v[wi]))).collect();
            if !cent.is_empty() {
                let light = c.mix(0.6);
                chart
                    .draw_series(cent.iter().map(|&p| Circle::new(p, 4, light.filled())))
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .label(format!("centroid sets, last {k}"))
                    .legend(move |(x, y)| Circle::new((x + 10, y), 4, light.filled()));
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    }
    std::fs::rename(&tmp, path).with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(())
}

/// Measures, over a text, how much activation mass the nearest pruned centroid keeps.
struct MassHook<'a> {
    th: &'a formats::thresholds::Thresholds,
    /// Per layer: the pruned centroid bitsets, where the layer was clustered.
    tables: Vec<Option<Vec<Vec<u8>>>>,
    n_ff: usize,
    covered: Vec<f64>,
    total: Vec<f64>,
}

impl runtime::model::MlpHook for MassHook<'_> {
    fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
        let Some(table) = &self.tables[layer] else { return };
        for (g, u) in gate_silu.chunks_exact(self.n_ff).zip(up.chunks_exact(self.n_ff)) {
            let mut bits = vec![0u8; self.n_ff.div_ceil(8)];
            let mut mass = vec![0f32; g.len()];
            for (i, (a, b)) in g.iter().zip(u).enumerate() {
                if self.th.active(layer, *a, *b) {
                    bits[i / 8] |= 1 << (i % 8);
                    mass[i] = (a * b).abs();
                }
            }
            let best = (0..table.len()).max_by_key(|&k| overlap(&bits, &table[k])).unwrap_or(0);
            let c = &table[best];
            self.total[layer] += mass.iter().map(|&m| m as f64).sum::<f64>();
            self.covered[layer] += mass
                .iter()
                .enumerate()
                .filter(|(i, _)| c[i / 8] >> (i % 8) & 1 == 1)
                .map(|(_, &m)| m as f64)
                .sum::<f64>();
        }
    }
}

/// Fills `centroid_mass_coverage` by running the model over `text` (sequences of 512 tokens,
/// up to `max_tokens`), with the capture's thresholds and the cluster's centroids.
pub fn add_mass_coverage(
    r: &mut Report,
    capture: &Path,
    cluster: &Path,
    model_dir: &Path,
    text: &Path,
    max_tokens: usize,
) -> Result<()> {
    let th = formats::thresholds::Thresholds::load(&capture.join("thresholds.json"))?;
    if th.mask_kind != formats::thresholds::MaskKind::Product {
        anyhow::bail!("mass coverage is measured for product masks only");
    }
    let (model, tok) = runtime::open_model(model_dir, runtime::DecodeLayout::Mapped)?;
    let n_layers = model.config.num_hidden_layers;
    let n_ff = model.config.intermediate_size;
    let cent = MappedSafetensors::open(cluster.join("centroids.safetensors"))?;
    let tables: Vec<Option<Vec<Vec<u8>>>> = (0..n_layers)
        .map(|l| {
            cent.tensors
                .get(&format!("centroids_l{l:02}"))
                .map(|e| cent.bytes(e).chunks_exact(n_ff.div_ceil(8)).map(|c| c.to_vec()).collect())
        })
        .collect();
    let mut hook = MassHook { th: &th, tables, n_ff, covered: vec![0.0; n_layers], total: vec![0.0; n_layers] };
    let ids =
        tok.encode(&std::fs::read_to_string(text).with_context(|| format!("{}: cannot read", text.display()))?, true)?;
    let seq = 512.min(max_tokens.max(1));
    let mut cache = model.new_cache(seq)?;
    for chunk in ids.chunks_exact(seq).take(max_tokens.div_ceil(seq)) {
        cache.clear();
        model.forward_observed(chunk, &mut cache, seq, Some(&mut hook))?;
    }
    for l in &mut r.layers {
        let layer = crate::shards::layer_of(&l.column);
        if hook.tables[layer].is_some() && hook.total[layer] > 0.0 {
            l.centroid_mass_coverage = Some(hook.covered[layer] / hook.total[layer]);
        }
    }
    Ok(())
}

/// Adds the predictor's per-layer top-1 accuracy, recall and set size on this capture (its
/// hidden states after layer 0 and its masks; no model run needed).
pub fn add_predictor(
    r: &mut Report,
    capture: &Path,
    cluster: &Path,
    predictor: &Path,
    rule: runtime::predictor::SetRule,
) -> Result<()> {
    let p = runtime::predictor::Predictor::load(predictor)?;
    let centroids = formats::centroids::CentroidTable::load(&cluster.join("centroids.safetensors"))?;
    let masks = crate::shards::read_masks(capture)?;
    let (h0, d) = crate::shards::read_hidden0(capture)?;
    if d != p.spec.d_model {
        anyhow::bail!("{}: hidden states are {d} wide, the predictor expects {}", capture.display(), p.spec.d_model);
    }
    let n = masks.rows();
    let w = masks.width;
    let col = |layer: usize| {
        masks
            .names
            .iter()
            .position(|c| c == &format!("mask_l{layer:02}"))
            .with_context(|| format!("no mask_l{layer:02} in {}", capture.display()))
    };
    let l0 = centroids.layer(0)?;
    let m0 = &masks.cols[col(0)?];
    let c0: Vec<u32> = (0..n).into_par_iter().map(|i| l0.best_cover(&m0[i * w..(i + 1) * w])).collect();
    let (k, s_layers) = (p.spec.k, p.spec.n_sparse_layers);
    let logits: Vec<f32> = (0..n)
        .collect::<Vec<_>>()
        .par_chunks(256)
        .flat_map_iter(|ch| p.logits(&h0[ch[0] * d..(ch[ch.len() - 1] + 1) * d], &c0[ch[0]..ch[ch.len() - 1] + 1]))
        .collect();
    for si in 0..s_layers {
        let layer = p.spec.first_layer + si;
        let set = centroids.layer(layer)?;
        let k_max: usize = set.row(0).iter().map(|b| b.count_ones() as usize).sum();
        // ranked by membership: the report measures the predictor and centroids alone
        let prior = runtime::predictor::NeuronPrior::new(set, None);
        let bits = &masks.cols[col(layer)?];
        let (hits, active, covered, size) = (0..n)
            .into_par_iter()
            .map(|i| {
                let m = &bits[i * w..(i + 1) * w];
                let head = &logits[(i * s_layers + si) * k..(i * s_layers + si + 1) * k];
                let (id, pred) = runtime::predictor::predicted_set(head, set, &prior, k_max, rule);
                let a: u64 = m.iter().map(|b| b.count_ones() as u64).sum();
                (
                    (set.best_cover(m) == id) as u64,
                    a,
                    overlap(m, &pred),
                    pred.iter().map(|b| b.count_ones() as u64).sum::<u64>(),
                )
            })
            .reduce(|| (0, 0, 0, 0), |a, b| (a.0 + b.0, a.1 + b.1, a.2 + b.2, a.3 + b.3));
        if let Some(lr) = r.layers.iter_mut().find(|l| l.column == format!("mask_l{layer:02}")) {
            lr.predictor_top1 = Some(hits as f64 / n as f64);
            lr.predictor_recall = Some(covered as f64 / active.max(1) as f64);
            lr.predictor_set_size = Some(size as f64 / n as f64);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn reuse_counts_only_within_a_sequence() {
        // 1-byte masks: seq 0 = {0,1}, {1,2}; seq 1 = {7}
        let sets: Vec<&[u8]> = vec![&[0b011], &[0b110], &[0b1000_0000]];
        let r = super::windowed_reuse(&sets, &[0, 0, 1], 1);
        assert_eq!(r[0], 0.5); // token 1: {1} of {1,2} was active at token 0; token 2 starts a sequence
    }
}
