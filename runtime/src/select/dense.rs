//! [`DenseSelector`]: no sparse layer. Every layer's MLP is held and computed dense: a native
//! preparation's own blocks (`dense_mlp.safetensors`, the GGUF's bytes), else rebuilt from the
//! records. `--strategy auto` runs it where the whole model fits the budget: there the 4-bit
//! GGUF's own MLP is better than any subset of rows, and faster than summing held down rows.

use super::{Footprint, SetSelector, SlotRow};

pub struct DenseSelector {
    pub n_layers: usize,
}

impl SetSelector for DenseSelector {
    fn rule(&self) -> String {
        "dense".into()
    }

    fn slot_row(&self) -> SlotRow {
        SlotRow::GateUpDown
    }

    fn every_held_row_counts(&self) -> bool {
        true
    }

    /// Nothing beyond the dense layers, which the plan counts as its prefix (every layer).
    fn footprint(&self, _first_layer: usize) -> Footprint {
        Footprint {
            predictor_bytes: 0,
            centroid_bytes: 0,
            ranking_rows_bytes: 0,
            full_sets: Vec::new(),
            set_unit: "n_ff",
            min_set_scale: 1.0,
            fit_tries_prefixes: false,
        }
    }

    fn keep_layers_from(&mut self, first_layer: usize) {
        debug_assert_eq!(first_layer, self.n_layers, "a dense run has no sparse layer");
    }
}
