//! Reuse simulated without storage (`prep`'s reuse stage, read by `runtime plan`): over a
//! dense forward pass, each sparse layer chooses its set as a streamed run of a strategy would,
//! and plans it into one [`SlotMap`] per slot share, evicting as that strategy does; the share
//! of needed rows already held is counted per (set share, slot share).
//!
//! - scorer: the `k` largest `|h_j| x ||down_j||` from the exact `h`, a held row's counting the
//!   resident bonus times (per slot map: what a map holds changes its set); evicts by the heat of
//!   every neuron's score ([`crate::scorer`]).
//! - sketch, gate, layers: the `k` best of the [`Ranker`]'s scores from the layer's normed input;
//!   evicts by [`HeldHeat`], fed the exact `h` of every row the slots hold.
//!
//! The inputs are the dense model's, not the sparse run's, and each sequence starts with empty
//! slots; its first `warmup_tokens` fill them and are not counted.

use crate::layer_predictor::{top_k, HeldHeat, Ranker};
use crate::model::MlpHook;
use crate::scorer::{update_heat, GateUpScorer, LayerScoring};
use crate::slots::{SlotMap, EMPTY};

/// How a strategy chooses its set.
pub enum Chooser<'a> {
    /// The scorer, with its resident bonus (`crate::scorer::SCORER_RESIDENT_BONUS` is the run's
    /// default).
    Scorer(&'a GateUpScorer, f32),
    Ranked(&'a Ranker),
}

impl Chooser<'_> {
    pub fn rule(&self) -> &'static str {
        match self {
            Chooser::Scorer(..) => "scorer",
            Chooser::Ranked(r) => r.name(),
        }
    }
}

/// What a layer evicts by: the scorer's heat of every neuron's score, one for all its maps; or
/// per `[set][slot]` map, the heat of the rows that map holds (the rankers').
enum Eviction {
    Scored(LayerScoring),
    Held(Vec<Vec<HeldHeat>>),
}

/// One sparse layer: its `[set][slot]` slot maps, their eviction state, tokens seen.
struct LayerSim {
    maps: Vec<Vec<SlotMap>>,
    eviction: Eviction,
    tick: u64,
}

pub struct ReuseSimulation<'a> {
    chooser: Chooser<'a>,
    /// The scorer's down norms' source (every chooser's sets are of its layers).
    scorer: &'a GateUpScorer,
    set_sizes: Vec<usize>,
    /// `[set][slot]` rows held per layer (at least the set).
    capacities: Vec<Vec<usize>>,
    layers: Vec<LayerSim>,
    /// The current layer's normed input `[n, d]` (the rankers score from it).
    xn: Vec<f32>,
    warmup_tokens: u64,
    /// `[set][slot]` (rows needed, rows missing) over the counted tokens.
    counts: Vec<Vec<(u64, u64)>>,
    pub tokens_counted: u64,
}

impl<'a> ReuseSimulation<'a> {
    pub fn rule(&self) -> &'static str {
        self.chooser.rule()
    }

    /// `scorer`: the preparation's scorer file, whose layers (`first_layer..`) are simulated.
    pub fn new(
        chooser: Chooser<'a>,
        scorer: &'a GateUpScorer,
        set_shares: &[f64],
        slot_shares: &[f64],
        warmup_tokens: usize,
    ) -> Self {
        let n_ff = scorer.file.n_ff;
        let rows = |share: f64| ((n_ff as f64 * share).round() as usize).clamp(1, n_ff);
        let set_sizes: Vec<usize> = set_shares.iter().map(|&s| rows(s)).collect();
        let capacities = set_sizes.iter().map(|&k| slot_shares.iter().map(|&c| rows(c).max(k)).collect()).collect();
        let counts = vec![vec![(0, 0); slot_shares.len()]; set_shares.len()];
        let mut sim = ReuseSimulation {
            chooser,
            scorer,
            set_sizes,
            capacities,
            layers: Vec::new(),
            xn: Vec::new(),
            warmup_tokens: warmup_tokens as u64,
            counts,
            tokens_counted: 0,
        };
        sim.new_sequence();
        sim
    }

    /// Empty slots and heat, as a fresh run's.
    pub fn new_sequence(&mut self) {
        let f = &self.scorer.file;
        self.layers = (0..f.n_layers)
            .map(|_| LayerSim {
                maps: self
                    .capacities
                    .iter()
                    .map(|caps| caps.iter().map(|&c| SlotMap::new(f.n_ff, c)).collect())
                    .collect(),
                eviction: match self.chooser {
                    Chooser::Scorer(..) => Eviction::Scored(LayerScoring::new(f.n_ff)),
                    Chooser::Ranked(_) => Eviction::Held(
                        self.capacities
                            .iter()
                            .map(|caps| caps.iter().map(|_| HeldHeat::new(f.n_ff)).collect())
                            .collect(),
                    ),
                },
                tick: 0,
            })
            .collect();
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
        if layer >= self.scorer.file.first_layer {
            self.xn.clear();
            self.xn.extend_from_slice(xn);
        }
    }

    fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]) {
        let f = &self.scorer.file;
        if layer < f.first_layer {
            return;
        }
        let (norm, n_ff, d) = (f.layer_down_norm(layer), f.n_ff, f.d_model);
        let sim = &mut self.layers[layer - f.first_layer];
        let (mut h, mut scores) = (vec![0f32; n_ff], vec![0f32; n_ff]);
        // (the rankers' held rows and their h, one buffer for every map)
        let (mut held, mut hs): (Vec<u32>, Vec<f32>) = (Vec::with_capacity(n_ff), Vec::with_capacity(n_ff));
        for (t, (g, u)) in gate_silu.chunks_exact(n_ff).zip(up.chunks_exact(n_ff)).enumerate() {
            h.iter_mut().zip(g.iter().zip(u)).for_each(|(hj, (a, b))| *hj = a * b);
            sim.tick += 1;
            let tick = sim.tick;
            // one set per set size where no map's holdings change it (a bonus of 1, the rankers);
            // None: each map chooses its own, below
            let shared_sets: Option<Vec<Vec<u32>>> = match &self.chooser {
                Chooser::Scorer(_, bonus) if *bonus != 1.0 => None,
                Chooser::Scorer(s, _) => {
                    Some(self.set_sizes.iter().map(|&k| s.keep(layer, &h, k, &sim.maps[0][0].slot_of, 1.0)).collect())
                }
                Chooser::Ranked(r) => {
                    r.scores(layer, &self.xn[t * d..(t + 1) * d], 1, &mut scores);
                    Some(self.set_sizes.iter().map(|&k| top_k(&scores, k)).collect())
                }
            };
            if let Eviction::Scored(state) = &mut sim.eviction {
                update_heat(&mut state.heat, &h, norm);
            }
            let counted = tick > self.warmup_tokens;
            for (si, &k) in self.set_sizes.iter().enumerate() {
                for (ci, map) in sim.maps[si].iter_mut().enumerate() {
                    let own;
                    let set = match (&shared_sets, &self.chooser) {
                        (Some(sets), _) => &sets[si],
                        (None, Chooser::Scorer(s, bonus)) => {
                            own = s.keep(layer, &h, k, &map.slot_of, *bonus);
                            &own
                        }
                        (None, Chooser::Ranked(_)) => unreachable!("a ranker's sets are shared"),
                    };
                    let missing = match &mut sim.eviction {
                        Eviction::Scored(state) => map.plan_by_heat(set, tick, &state.heat).len(),
                        Eviction::Held(heats) => {
                            let heat = &mut heats[si][ci];
                            let n = heat.plan(map, set, tick).len();
                            // every held row counts, with its exact h
                            held.clear();
                            held.extend(map.neuron_of.iter().copied().filter(|&j| j != EMPTY));
                            hs.clear();
                            hs.extend(held.iter().map(|&j| h[j as usize]));
                            heat.update(&held, &hs);
                            n
                        }
                    };
                    if counted {
                        let c = &mut self.counts[si][ci];
                        c.0 += set.len() as u64;
                        c.1 += missing as u64;
                    }
                }
            }
            if counted && layer == f.first_layer {
                self.tokens_counted += 1;
            }
        }
    }
}
