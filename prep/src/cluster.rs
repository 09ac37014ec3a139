//! `prep cluster`: per layer (and projection, for gate-up masks), k-means of the captured binary
//! masks into K sparse centroids, each pruned to its K_max most frequent neurons; writes the
//! centroid bitsets, the label of every captured token (the pruned set that covers most of its
//! active neurons), and per-layer recall.
//!
//! Lloyd's algorithm with distances by matrix multiply (the runtime's f16 matmul kernel:
//! ||x - c||^2 = |x| - 2 x.c + ||c||^2, and |x| does not change the argmin). linfa-clustering
//! was measured at 18x slower per iteration at K = 512 and its k-means++ init at ~44 min
//! (../shared/MEASURED.md), so it is not used. Initial centroids: K distinct captured masks
//! drawn with a fixed seed; an emptied cluster is re-seeded with the token farthest from its
//! centroid.

use crate::shards::layer_of;
use anyhow::{bail, Result};
use formats::safetensors_io::{write_raw_safetensors, RawTensor};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{seq::SliceRandom, SeedableRng};
use rayon::prelude::*;
use runtime::tensor::F16Matrix;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Clone, Serialize)]
pub struct LayerCluster {
    /// Mask column clustered (e.g. `mask_l05`, `gate_mask_l05`).
    pub column: String,
    pub k: usize,
    pub k_max: usize,
    pub iterations: usize,
    pub mean_active: f64,
    /// Share of the truly active neurons (summed over tokens) inside the pruned set of the
    /// token's centroid.
    pub recall: f64,
    pub seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct ClusterSummary {
    pub tokens: usize,
    pub layers: Vec<LayerCluster>,
    pub centroids_path: String,
    pub labels_path: String,
}

pub struct ClusterSettings {
    pub k: usize,
    /// K_max = round(factor x mean active count of the layer), capped at n_ff; or fixed.
    pub k_max_factor: f64,
    pub k_max: Option<usize>,
    pub max_iterations: usize,
    /// Only layers inside one of these `a..b` ranges; None: every layer.
    pub layers: Option<Vec<(usize, usize)>>,
    pub seed: u64,
}

/// Lloyd's k-means of `n` bitsets (`bits`, `width` bytes each, `n_ff` neurons).
/// Returns (centroids `[k, n_ff]` f32, labels `[n]`, iterations).
fn kmeans(
    bits: &[u8],
    n: usize,
    width: usize,
    n_ff: usize,
    k: usize,
    max_iter: usize,
    seed: u64,
) -> (Vec<f32>, Vec<u32>, usize) {
    // x: [n, n_ff] 0/1
    let mut x = vec![0f32; n * n_ff];
    x.par_chunks_mut(n_ff).zip(bits.par_chunks(width)).for_each(|(row, b)| {
        for (j, v) in row.iter_mut().enumerate() {
            *v = (b[j / 8] >> (j % 8) & 1) as f32;
        }
    });
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rng);
    let mut cent = vec![0f32; k * n_ff];
    for (c, &i) in order.iter().take(k).enumerate() {
        cent[c * n_ff..(c + 1) * n_ff].copy_from_slice(&x[i * n_ff..(i + 1) * n_ff]);
    }
    let mut labels = vec![u32::MAX; n];
    let mut iterations = 0;
    let mut dots = vec![0f32; n * k];
    for it in 0..max_iter {
        iterations = it + 1;
        let cm = F16Matrix::owned(k, n_ff, cent.iter().map(|&v| f16::from_f32(v)).collect());
        let norms: Vec<f32> = cent.chunks_exact(n_ff).map(|c| c.iter().map(|v| v * v).sum()).collect();
        runtime::ops::matmul::matmul_f16(&x, n, &cm, &mut dots); // dots[i, c] = x_i . c
        let assign: Vec<(u32, f32)> = dots
            .par_chunks(k)
            .map(|d| {
                let mut best = (0u32, f32::INFINITY);
                for (c, (&dot, &nrm)) in d.iter().zip(&norms).enumerate() {
                    let dist = nrm - 2.0 * dot;
                    if dist < best.1 {
                        best = (c as u32, dist);
                    }
                }
                best
            })
            .collect();
        let changed = assign.iter().zip(&labels).filter(|((a, _), b)| a != *b).count();
        labels.iter_mut().zip(&assign).for_each(|(l, (a, _))| *l = *a);
        // update: mean of members
        let mut sums = vec![0f32; k * n_ff];
        let mut counts = vec![0usize; k];
        for (i, &l) in labels.iter().enumerate() {
            counts[l as usize] += 1;
            let row = &x[i * n_ff..(i + 1) * n_ff];
            sums[l as usize * n_ff..(l as usize + 1) * n_ff].iter_mut().zip(row).for_each(|(s, v)| *s += v);
        }
        // empty clusters take the tokens farthest from their centroids (sorted only when needed)
        let mut far: Vec<usize> = Vec::new();
        if counts.contains(&0) {
            far = (0..n).collect();
            far.sort_unstable_by(|&a, &b| assign[b].1.total_cmp(&assign[a].1));
        }
        let mut next_far = 0;
        for c in 0..k {
            if counts[c] == 0 {
                let i = far[next_far];
                next_far += 1;
                cent[c * n_ff..(c + 1) * n_ff].copy_from_slice(&x[i * n_ff..(i + 1) * n_ff]);
            } else {
                let inv = 1.0 / counts[c] as f32;
                for (dst, s) in cent[c * n_ff..(c + 1) * n_ff].iter_mut().zip(&sums[c * n_ff..(c + 1) * n_ff]) {
                    *dst = s * inv;
                }
            }
        }
        if it > 0 && changed * 1000 <= n {
            break;
        }
    }
    (cent, labels, iterations)
}

/// Indices of the `k_max` largest values of a centroid, as a bitset of `n_ff` bits.
fn prune_to_bitset(c: &[f32], k_max: usize) -> Vec<u8> {
    let mut idx: Vec<usize> = (0..c.len()).collect();
    idx.select_nth_unstable_by(k_max.min(c.len()) - 1, |&a, &b| c[b].total_cmp(&c[a]));
    let mut bits = vec![0u8; c.len().div_ceil(8)];
    for &i in &idx[..k_max.min(c.len())] {
        bits[i / 8] |= 1 << (i % 8);
    }
    bits
}

pub fn cluster(captures: &Path, out: &Path, s: &ClusterSettings, show_progress: bool) -> Result<ClusterSummary> {
    let masks = crate::shards::read_masks(captures)?;
    let (names, cols, width, n, n_ff) = (&masks.names, &masks.cols, masks.width, masks.rows(), masks.n_ff);
    if s.k == 0 || s.k > n {
        bail!("K = {} centroids but only {n} captured tokens (K must be in 1..={n})", s.k);
    }
    if let Some(k) = s.k_max.filter(|&k| k == 0 || k > n_ff) {
        bail!("K_max = {k} is impossible: it must be in 1..={n_ff} (the model's intermediate size)");
    }
    if s.k_max_factor.is_nan() || s.k_max_factor <= 0.0 {
        bail!("k_max_factor = {} must be positive", s.k_max_factor);
    }
    let selected: Vec<usize> = (0..names.len())
        .filter(|&i| s.layers.as_ref().is_none_or(|rs| rs.iter().any(|&(a, b)| (a..b).contains(&layer_of(&names[i])))))
        .collect();
    std::fs::create_dir_all(out)?;
    let pb = if show_progress { ProgressBar::new(selected.len() as u64) } else { ProgressBar::hidden() };
    pb.set_style(
        ProgressStyle::with_template("k-means [{bar:40}] {pos}/{len} mask columns ({elapsed}, eta {eta})").unwrap(),
    );
    let mut centroids = Vec::new();
    let mut labels = Vec::new();
    let mut layers = Vec::new();
    for &ci in &selected {
        let t0 = std::time::Instant::now();
        let bits = &cols[ci];
        let active: usize = bits.iter().map(|b| b.count_ones() as usize).sum();
        let mean_active = active as f64 / n as f64;
        let k_max = s.k_max.unwrap_or(((s.k_max_factor * mean_active).round() as usize).max(1)).min(n_ff);
        let (cent, _, iterations) = kmeans(bits, n, width, n_ff, s.k, s.max_iterations, s.seed);
        let pruned: Vec<Vec<u8>> = cent.chunks_exact(n_ff).map(|c| prune_to_bitset(c, k_max)).collect();
        // label = the pruned set that covers most of the token's active neurons (the predictor's
        // target and the runtime's layer-0 feature: the same rule on both sides)
        let table = formats::centroids::CentroidSet { k: s.k, width, bits: pruned.concat() };
        let lab: Vec<u32> = bits.par_chunks(width).map(|m| table.best_cover(m)).collect();
        let covered: u64 =
            (0..n).map(|i| crate::shards::overlap(&bits[i * width..(i + 1) * width], &pruned[lab[i] as usize])).sum();
        centroids.push(RawTensor {
            name: names[ci].replace("mask", "centroids"),
            dtype: safetensors::Dtype::U8,
            shape: vec![s.k, width],
            bytes: pruned.concat(),
        });
        labels.push(RawTensor {
            name: names[ci].replace("mask", "labels"),
            dtype: safetensors::Dtype::U16,
            shape: vec![n],
            bytes: lab.iter().flat_map(|&l| (l as u16).to_le_bytes()).collect(),
        });
        layers.push(LayerCluster {
            column: names[ci].clone(),
            k: s.k,
            k_max,
            iterations,
            mean_active,
            recall: covered as f64 / active.max(1) as f64,
            seconds: t0.elapsed().as_secs_f64(),
        });
        pb.inc(1);
    }
    pb.finish_and_clear();
    let cpath = out.join("centroids.safetensors");
    let lpath = out.join("labels.safetensors");
    write_raw_safetensors(&cpath, &centroids, None)?;
    write_raw_safetensors(&lpath, &labels, None)?;
    let summary = ClusterSummary {
        tokens: n,
        layers,
        centroids_path: cpath.display().to_string(),
        labels_path: lpath.display().to_string(),
    };
    let spath = out.join("cluster.json");
    formats::safetensors_io::write_atomic(
        &formats::safetensors_io::tmp_path(&spath),
        &spath,
        serde_json::to_string_pretty(&summary)?.as_bytes(),
    )?;
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kmeans_separates_two_obvious_groups_and_prunes() {
        // 40 tokens over 16 neurons: group A uses neurons 0..4, group B neurons 8..12.
        let n_ff = 16;
        let mut bits = Vec::new();
        for i in 0..40 {
            let mut b = [0u8; 2];
            if i % 2 == 0 {
                b[0] = 0b0000_1111
            } else {
                b[1] = 0b0000_1111
            }
            bits.extend(b);
        }
        let (cent, lab, _) = kmeans(&bits, 40, 2, n_ff, 2, 10, 1);
        assert!(lab.iter().step_by(2).all(|&l| l == lab[0]) && lab.iter().skip(1).step_by(2).all(|&l| l == lab[1]));
        assert_ne!(lab[0], lab[1]);
        let p = prune_to_bitset(&cent[lab[0] as usize * n_ff..(lab[0] as usize + 1) * n_ff], 4);
        assert_eq!(p, vec![0b0000_1111, 0]);
    }
}
