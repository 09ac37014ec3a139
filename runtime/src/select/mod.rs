//! How a token's neurons are chosen in a streamed run: the [`SetSelector`] trait, one
//! implementation per module.
//!
//! - [`predicted::PredictedSelector`]: the shared predictor (NeuroPrefetcher): after layer 0 it
//!   picks every sparse layer's set at once, so the engine reads all their missing records
//!   while the layers before each one compute. Slots hold whole records (gate, up, downT); only
//!   the set counts.
//! - [`scored::ScoredSelector`]: the resident 4-bit gate/up scorer: each sparse layer scores
//!   every neuron from its own input and keeps the largest; slots hold downT rows only, and
//!   every row a layer holds counts.
//! - [`layered::LayeredSelector`]: whole records ranked before they are read, by per-layer
//!   predictors (LLM in a flash), the resident 2-bit gate/up sketch or the resident gate rows:
//!   each sparse layer ranks its
//!   neurons from its own input, reads the missing records of its set, and every row it holds
//!   counts.
//! - [`dense::DenseSelector`]: no sparse layer: every MLP held and computed dense (where the
//!   whole model fits the budget).
//!
//! A selector says when it chooses (after layer 0, or at each layer), what a slot holds, and
//! which held rows count; the engine (`stream::engine`) does the slots, the reads and the sums.

pub mod dense;
pub mod layered;
pub mod predicted;
pub mod scored;

use crate::slots::{Load, SlotMap};

/// `fit` cuts the shared predictor's sets to no less than this share of K_max (K_max is ~1.5x
/// a layer's mean active count: below a quarter of it most active neurons are dropped).
pub const MIN_SET_SCALE: f64 = 0.25;

/// `fit` keeps no less than this share of a layer's neurons with the strategies that rank every
/// neuron from the layer's own input (their sets are a share of n_ff).
pub const MIN_SCORER_SHARE: f64 = 0.10;

/// What one slot of a sparse layer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotRow {
    /// A neuron's whole record payload: gate, up and downT rows (f16, `3 x d_model`). The
    /// neuron's coefficient `silu(gate . x) x (up . x)` is computed exactly from the slot.
    GateUpDown,
    /// The neuron's downT row alone (f16, `d_model`); the coefficient comes from the selector.
    Down,
}

impl SlotRow {
    /// Bytes of one slot for version-1 (f16) records.
    pub fn bytes(self, d_model: usize) -> usize {
        self.bytes_in(d_model, None)
    }

    /// Bytes of one slot for records of `shape` (None: version 1, f16): a version-2 down row is
    /// its Q8_0 blocks, a whole record's payload its gate and up blocks and that down row.
    pub fn bytes_in(self, d_model: usize, shape: Option<formats::records::RecordShape>) -> usize {
        match (self, shape) {
            (SlotRow::GateUpDown, None) => 3 * d_model * 2,
            (SlotRow::Down, None) => d_model * 2,
            (SlotRow::GateUpDown, Some(s)) => 2 * s.gate_up_row_bytes() + s.down_row_bytes(),
            (SlotRow::Down, Some(s)) => s.down_row_bytes(),
        }
    }
}

/// What a selector costs the memory plan, with sparse layers from a given first layer.
#[derive(Debug, Clone)]
pub struct Footprint {
    pub predictor_bytes: u64,
    pub centroid_bytes: u64,
    pub ranking_rows_bytes: u64,
    /// Per sparse layer, the set `--set-scale` is a share of (K_max, or n_ff).
    pub full_sets: Vec<usize>,
    /// "K_max" or "n_ff": how set sizes are named in messages.
    pub set_unit: &'static str,
    /// `--dense-prefix fit` lowers the set scale no further than this.
    pub min_set_scale: f64,
    /// `fit` first tries dense prefixes from the manifest's default down (the predictor), or
    /// goes straight to every layer after the prepared prefix sparse (the scorer, whose held
    /// rows all count, so memory is worth more as slots).
    pub fit_tries_prefixes: bool,
}

/// Where a strategy that ranks every neuron counts what it holds for a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeldAs {
    /// Gate/up rows that rank (the scorer's 4-bit, the sketch's 2-bit, the oracle's
    /// records): `ranking_rows_bytes`.
    RankingRows,
    /// Small networks (the per-layer predictors): `predictor_bytes`.
    Networks,
}

impl Footprint {
    /// A strategy that ranks every neuron of each sparse layer from its own input (its sets are
    /// shares of n_ff; the scorer, the sketch, the per-layer predictors) and holds
    /// `per_layer_bytes` for each sparse layer `first..n_layers`: one sizing for the loaded
    /// selectors and for `--strategy auto`, which sizes them from their files' headers.
    pub fn per_layer(first: usize, n_layers: usize, n_ff: usize, per_layer_bytes: u64, held_as: HeldAs) -> Footprint {
        let sparse = n_layers.saturating_sub(first);
        let held = sparse as u64 * per_layer_bytes;
        Footprint {
            predictor_bytes: if held_as == HeldAs::Networks { held } else { 0 },
            centroid_bytes: 0,
            ranking_rows_bytes: if held_as == HeldAs::RankingRows { held } else { 0 },
            full_sets: vec![n_ff; sparse],
            set_unit: "n_ff",
            min_set_scale: MIN_SCORER_SHARE,
            fit_tries_prefixes: false,
        }
    }
}

/// One sparse layer's set, chosen from the layer's own input.
pub struct LayerChoice {
    /// The neurons needed (ascending).
    pub set: Vec<u32>,
    /// Their missing rows and the slots they go to (planned in the layer's `SlotMap`).
    pub loads: Vec<Load>,
}

pub trait SetSelector: Send {
    /// The set rule, as reports name it ("soft8", "scorer").
    fn rule(&self) -> String;

    /// What a slot holds.
    fn slot_row(&self) -> SlotRow;

    /// Every row a layer holds counts (true), or only the set (false).
    fn every_held_row_counts(&self) -> bool;

    /// How cut sets rank neurons (None: the selector ranks by its own score).
    fn neuron_rank(&self) -> Option<crate::predictor::NeuronRank> {
        None
    }

    /// With [`SlotRow::Down`]: the CRC32C of every downT row, `[sparse layers from the prepared
    /// prefix, n_ff]`, which a read of that row alone is checked against.
    fn down_row_crc32c(&self) -> Option<std::sync::Arc<Vec<u32>>> {
        None
    }

    /// What the plan holds for this selector with sparse layers `first_layer..`.
    fn footprint(&self, first_layer: usize) -> Footprint;

    /// Drops what layers below `first_layer` would need (called once, with the plan's).
    fn keep_layers_from(&mut self, first_layer: usize);

    /// A new sequence starts: forget whatever was learned from earlier ones.
    fn begin_sequence(&mut self) {}

    /// Layer 0 ran dense: `gate_silu` and `up` `[n_ff]` are its activations.
    fn observe_first_layer(&mut self, _gate_silu: &[f32], _up: &[f32]) {}

    /// The residual stream after layer 0, `[d_model]`. A selector that predicts every sparse
    /// layer's set from it returns them (ascending, `set_sizes[i]` neurons for sparse layer i).
    fn sets_after_first_layer(&mut self, _hidden: &[f32], _set_sizes: &[usize]) -> Option<Vec<Vec<u32>>> {
        None
    }

    /// A selector that chooses each sparse layer's set from the layer's own input says how
    /// (None: the sets were chosen after layer 0).
    fn per_layer(&self) -> Option<&dyn LayerChooser> {
        None
    }
}

/// How a selector chooses one sparse layer's set from the layer's own input, token by token.
/// What it carries from token to token is the layer's [`SlotMap`] (its rows and their heat), so
/// one chooser serves one map per layer (the streaming engine) or many (the reuse simulation,
/// one per set and slot size, scored once a token).
pub trait LayerChooser: Sync {
    /// Scores every neuron of model layer `layer` from its normed input `xn` `[d_model]` into
    /// `scores` `[n_ff]`. With [`SlotRow::Down`] a score is the neuron's coefficient, which its
    /// held row is summed with.
    fn score(&self, layer: usize, xn: &[f32], scores: &mut [f32]);

    /// The `k` neurons the layer needs by `scores` and what `map` holds (ascending), with their
    /// missing rows planned into `map`'s slots.
    fn choose(&self, layer: usize, scores: &[f32], k: usize, map: &mut SlotMap, tick: u64) -> LayerChoice;

    /// With [`SlotRow::GateUpDown`]: the layer summed the rows `map` holds for `neurons` with
    /// their exact coefficients `h` (the same order).
    fn observe_coefficients(&self, _map: &mut SlotMap, _neurons: &[u32], _h: &[f32]) {}
}
