//! `prep layout`: a co-activation order of each sparse layer's records (`formats::layout`),
//! so that the neurons a token needs lie in fewer, longer runs of records.
//!
//! Spectral seriation of the captured masks (`prep capture`; the calibration tokens' active
//! sets): with `C` the neurons' co-activation counts (`C_ij` = tokens where both are active)
//! and `D` its row sums, neurons are sorted by the second eigenvector of `D^-1/2 C D^-1/2`
//! (scaled by `D^-1/2`: the Fiedler vector of the normalized Laplacian), which places neurons
//! that fire together close together. `C` is never formed: a power iteration multiplies by the
//! token x neuron mask and its transpose, and the first eigenvector is known (`sqrt(D)`).
//!
//! The figure of merit is the number of runs of consecutive records a token's active set
//! falls into (what coalesced reads of those rows would issue), in neuron order and in the new
//! order, on every captured token.

use anyhow::{bail, Context, Result};
use formats::layout::NeuronOrder;
use rayon::prelude::*;
use serde::Serialize;
use std::path::Path;

/// Power iterations for the second eigenvector.
const ITERATIONS: usize = 60;
/// At most this many captured tokens per layer (evenly spaced) shape the order.
const MAX_TOKENS: usize = 8192;

#[derive(Debug, Serialize)]
pub struct LayerLayout {
    pub layer: usize,
    /// Mean runs of consecutive records per token's active set: neuron order, then the new one.
    pub runs_neuron_order: f64,
    pub runs_coactivation: f64,
    pub active_per_token: f64,
}

#[derive(Debug, Serialize)]
pub struct LayoutSummary {
    pub path: String,
    pub tokens: usize,
    pub runs_neuron_order: f64,
    pub runs_coactivation: f64,
    pub layers: Vec<LayerLayout>,
    pub seconds: f64,
}

/// The active neurons of each token of one layer's mask column (`[n, width]` bits).
fn active_lists(bits: &[u8], width: usize, n_ff: usize) -> Vec<Vec<u32>> {
    bits.chunks_exact(width)
        .map(|row| (0..n_ff as u32).filter(|&j| row[j as usize / 8] >> (j % 8) & 1 == 1).collect())
        .collect()
}

/// Mean number of runs of consecutive positions per token.
fn mean_runs(tokens: &[Vec<u32>], position: impl Fn(u32) -> u32) -> f64 {
    let total: usize = tokens
        .iter()
        .map(|t| {
            let mut p: Vec<u32> = t.iter().map(|&j| position(j)).collect();
            p.sort_unstable();
            p.windows(2).filter(|w| w[1] != w[0] + 1).count() + usize::from(!p.is_empty())
        })
        .sum();
    total as f64 / tokens.len().max(1) as f64
}

/// The co-activation order of one layer: `neuron_at` `[n_ff]`.
fn order_layer(tokens: &[Vec<u32>], n_ff: usize) -> Vec<u32> {
    // row sums of C: r_j = sum over the tokens with j active of the token's active count
    let mut r = vec![0f64; n_ff];
    for t in tokens {
        for &j in t {
            r[j as usize] += t.len() as f64;
        }
    }
    let w: Vec<f64> = r.iter().map(|&v| if v > 0.0 { 1.0 / v.sqrt() } else { 0.0 }).collect();
    let mut v1: Vec<f64> = r.iter().map(|v| v.sqrt()).collect();
    normalize(&mut v1);
    // M x = W C W x = W A^T (A (W x)); x starts from a fixed pseudo-random vector
    let mut x: Vec<f64> = (0..n_ff).map(|j| (j as f64 * 0.618_033_988_7).fract() - 0.5).collect();
    for _ in 0..ITERATIONS {
        deflate(&mut x, &v1);
        normalize(&mut x);
        let u: Vec<f64> = tokens.iter().map(|t| t.iter().map(|&j| w[j as usize] * x[j as usize]).sum()).collect();
        let mut y = vec![0f64; n_ff];
        for (t, ut) in tokens.iter().zip(&u) {
            for &j in t {
                y[j as usize] += ut;
            }
        }
        y.iter_mut().zip(&w).for_each(|(v, wj)| *v *= wj);
        // shift by +1 so the iteration favours the largest eigenvalue, not the largest magnitude
        y.iter_mut().zip(&x).for_each(|(v, xj)| *v += xj);
        x = y;
    }
    deflate(&mut x, &v1);
    let mut key: Vec<f64> = x.iter().zip(&w).map(|(v, wj)| v * wj).collect();
    if std::env::var("LAYOUT_FREQ").is_ok() {
        let mut c = vec![0f64; n_ff];
        tokens.iter().for_each(|t| t.iter().for_each(|&j| c[j as usize] -= 1.0));
        key = c;
    }
    let mut order: Vec<u32> = (0..n_ff as u32).collect();
    // neurons never active go last, in neuron order
    order.sort_by(|&a, &b| (r[a as usize] == 0.0).cmp(&(r[b as usize] == 0.0)).then(key[a as usize].total_cmp(&key[b as usize])).then(a.cmp(&b)));
    order
}

fn normalize(x: &mut [f64]) {
    let n = x.iter().map(|v| v * v).sum::<f64>().sqrt();
    if n > 0.0 {
        x.iter_mut().for_each(|v| *v /= n);
    }
}

fn deflate(x: &mut [f64], v: &[f64]) {
    let d: f64 = x.iter().zip(v).map(|(a, b)| a * b).sum();
    x.iter_mut().zip(v).for_each(|(a, b)| *a -= d * b);
}

/// Orders layers `first_layer..` from the capture in `capture`, writes `out` (layout.safetensors)
/// and `layout.json` beside it.
pub fn layout(capture: &Path, first_layer: usize, n_layers: usize, out: &Path) -> Result<LayoutSummary> {
    let t0 = std::time::Instant::now();
    let masks = crate::shards::read_masks(capture)?;
    if masks.names.iter().any(|n| n.starts_with("gate_")) {
        bail!("{}: gate-up masks; the layout is built from product masks (the recipes' default)", capture.display());
    }
    let n_ff = masks.n_ff;
    let n = masks.rows();
    let stride = n.div_ceil(MAX_TOKENS).max(1);
    let per_layer: Vec<(Vec<u32>, LayerLayout)> = (first_layer..n_layers)
        .into_par_iter()
        .map(|l| {
            let col = masks.names.iter().position(|c| c == &format!("mask_l{l:02}")).with_context(|| format!("{}: no mask_l{l:02} in the capture", capture.display()))?;
            let bits = &masks.cols[col];
            let all = active_lists(bits, masks.width, n_ff);
            let sample: Vec<Vec<u32>> = all.iter().step_by(stride).cloned().collect();
            let order = order_layer(&sample, n_ff);
            let mut position = vec![0u32; n_ff];
            order.iter().enumerate().for_each(|(p, &j)| position[j as usize] = p as u32);
            let stats = LayerLayout {
                layer: l,
                runs_neuron_order: mean_runs(&all, |j| j),
                runs_coactivation: mean_runs(&all, |j| position[j as usize]),
                active_per_token: all.iter().map(|t| t.len()).sum::<usize>() as f64 / all.len().max(1) as f64,
            };
            Ok((order, stats))
        })
        .collect::<Result<_>>()?;
    let neuron_at: Vec<u32> = per_layer.iter().flat_map(|(o, _)| o.iter().copied()).collect();
    let order = NeuronOrder::new(out, first_layer, n_ff, neuron_at)?;
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent)?;
    }
    order.save(out)?;
    let layers: Vec<LayerLayout> = per_layer.into_iter().map(|(_, s)| s).collect();
    let mean = |f: fn(&LayerLayout) -> f64| layers.iter().map(f).sum::<f64>() / layers.len().max(1) as f64;
    let summary = LayoutSummary {
        path: out.display().to_string(),
        tokens: n,
        runs_neuron_order: mean(|l| l.runs_neuron_order),
        runs_coactivation: mean(|l| l.runs_coactivation),
        layers,
        seconds: t0.elapsed().as_secs_f64(),
    };
    let jpath = out.with_file_name("layout.json");
    formats::safetensors_io::write_atomic(&formats::safetensors_io::tmp_path(&jpath), &jpath, serde_json::to_string_pretty(&summary)?.as_bytes())?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn co_active_neurons_end_up_adjacent() {
        // 12 neurons in 3 groups that fire together, interleaved in neuron order
        let groups = [vec![0u32, 3, 6, 9], vec![1, 4, 7, 10], vec![2, 5, 8, 11]];
        let tokens: Vec<Vec<u32>> = (0..60).map(|t| groups[t % 3].clone()).collect();
        let order = order_layer(&tokens, 12);
        let mut position = vec![0u32; 12];
        order.iter().enumerate().for_each(|(p, &j)| position[j as usize] = p as u32);
        assert_eq!(mean_runs(&tokens, |j| j), 4.0);
        assert_eq!(mean_runs(&tokens, |j| position[j as usize]), 1.0, "order {order:?}");
    }
}
