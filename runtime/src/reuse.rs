//! Reuse simulated without storage (`prep`'s reuse stage, read by `runtime plan`): over a
//! dense forward pass, each sparse layer's set is chosen by the strategy's own
//! [`LayerChooser`], as a streamed run of it chooses, once per set size and slot size: one
//! [`SlotMap`] each, scored once a token. The share of needed rows already held is counted per
//! (set share, slot share).
//!
//! Every row a map holds is summed in a streamed run, so each is reported with its exact
//! coefficient (`LayerChooser::observe_coefficients`). The inputs are the dense model's, not
//! the sparse run's, and each sequence starts with empty slots; its first `warmup_tokens` fill
//! them and are not counted.

use crate::model::MlpHook;
use crate::select::LayerChooser;
use crate::slots::{SlotMap, EMPTY};

/// One sparse layer: its `[set][slot]` slot maps and the tokens it has seen.
struct LayerSim {
    maps: Vec<Vec<SlotMap>>,
    tick: u64,
}

pub struct ReuseSimulation<'a> {
    rule: String,
    chooser: &'a dyn LayerChooser,
    /// The first sparse layer (the layers below it are not simulated).
    first_layer: usize,
    n_ff: usize,
    set_sizes: Vec<usize>,
    /// `[set][slot]` rows held per layer (at least the set).
    capacities: Vec<Vec<usize>>,
    layers: Vec<LayerSim>,
    /// The current layer's normed input `[n, d]` (the chooser scores from it).
    xn: Vec<f32>,
    warmup_tokens: u64,
    /// `[set][slot]` (rows needed, rows missing) over the counted tokens.
    counts: Vec<Vec<(u64, u64)>>,
    pub tokens_counted: u64,
}

impl<'a> ReuseSimulation<'a> {
    /// The strategy named `rule` choosing with `chooser` for sparse layers
    /// `first_layer..n_layers` of `n_ff` neurons.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        rule: String,
        chooser: &'a dyn LayerChooser,
        first_layer: usize,
        n_layers: usize,
        n_ff: usize,
        set_shares: &[f64],
        slot_shares: &[f64],
        warmup_tokens: usize,
    ) -> Self {
        let rows = |share: f64| ((n_ff as f64 * share).round() as usize).clamp(1, n_ff);
        let set_sizes: Vec<usize> = set_shares.iter().map(|&s| rows(s)).collect();
        let capacities = set_sizes.iter().map(|&k| slot_shares.iter().map(|&c| rows(c).max(k)).collect()).collect();
        let counts = vec![vec![(0, 0); slot_shares.len()]; set_shares.len()];
        let mut sim = ReuseSimulation {
            rule,
            chooser,
            first_layer,
            n_ff,
            set_sizes,
            capacities,
            layers: (first_layer..n_layers).map(|_| LayerSim { maps: Vec::new(), tick: 0 }).collect(),
            xn: Vec::new(),
            warmup_tokens: warmup_tokens as u64,
            counts,
            tokens_counted: 0,
        };
        sim.new_sequence();
        sim
    }

    pub fn rule(&self) -> &str {
        &self.rule
    }

    /// Empty slots and heat, as a fresh run's.
    pub fn new_sequence(&mut self) {
        for l in &mut self.layers {
            l.maps =
                self.capacities.iter().map(|caps| caps.iter().map(|&c| SlotMap::new(self.n_ff, c)).collect()).collect();
            l.tick = 0;
        }
    }

    /// `[set][slot]` share of the needed rows already held.
    pub fn reuse(&self) -> Vec<Vec<f64>> {
        self.counts
            .iter()
            .map(|r| r.iter().map(|&(needed, missing)| 1.0 - missing as f64 / needed.max(1) as f64).collect())
            .collect()
    }
}

impl MlpHook for ReuseSimulation<'_> {
    fn observe_input(&mut self, layer: usize, xn: &[f32]) {
        if layer >= self.first_layer {
            self.xn.clear();
            self.xn.extend_from_slice(xn);
        }
    }

    fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
        if layer < self.first_layer {
            return;
        }
        let n_ff = self.n_ff;
        let n = gate_silu.len() / n_ff;
        let d = self.xn.len() / n.max(1);
        let sim = &mut self.layers[layer - self.first_layer];
        let (mut h, mut scores) = (vec![0f32; n_ff], vec![0f32; n_ff]);
        // (the held rows and their exact h, one buffer for every map)
        let (mut held, mut hs): (Vec<u32>, Vec<f32>) = (Vec::with_capacity(n_ff), Vec::with_capacity(n_ff));
        for (t, (g, u)) in gate_silu.chunks_exact(n_ff).zip(up.chunks_exact(n_ff)).enumerate() {
            h.iter_mut().zip(g.iter().zip(u)).for_each(|(hj, (a, b))| *hj = a * b);
            sim.tick += 1;
            self.chooser.score(layer, &self.xn[t * d..(t + 1) * d], &mut scores);
            let counted = sim.tick > self.warmup_tokens;
            for (si, &k) in self.set_sizes.iter().enumerate() {
                for (ci, map) in sim.maps[si].iter_mut().enumerate() {
                    let choice = self.chooser.choose(layer, &scores, k, map, sim.tick);
                    held.clear();
                    held.extend(map.neuron_of.iter().copied().filter(|&j| j != EMPTY));
                    hs.clear();
                    hs.extend(held.iter().map(|&j| h[j as usize]));
                    self.chooser.observe_coefficients(map, &held, &hs);
                    if counted {
                        let c = &mut self.counts[si][ci];
                        c.0 += choice.set.len() as u64;
                        c.1 += choice.loads.len() as u64;
                    }
                }
            }
            if counted && layer == self.first_layer {
                self.tokens_counted += 1;
            }
        }
    }
}
