//! The streaming engine: sparse-layer MLP rows read from `records.bin` on demand into bounded
//! per-layer slot buffers (see `engine`), within a memory budget (`budget`).

pub mod aligned;
pub mod auto;
pub mod budget;
pub mod engine;
pub mod io;
pub mod prompt;
pub mod reader;

pub use budget::{parse_bytes, MemoryPlan};
pub use engine::{DensePrefix, IoSettings, SelectorChoice, StreamSettings, StreamStats, StreamingEngine};
