//! `formats` owns every byte layout of the project and nothing else: it depends on neither
//! `prep` nor `runtime`, and both read and write files only through it.
//!
//! - [`gguf`]: the GGUF container (llama.cpp's model file) — header, metadata, tensor table.
//! - [`ggml_quants`]: block layouts of GGML tensor types and their dequantizers.
//! - [`model_dir`]: the canonical model directory (`config.json`, `tokenizer.json`,
//!   f16 `*.safetensors` with Hugging Face tensor names) and its config.
//! - [`safetensors_io`]: memory-mapped reading and writing of safetensors files.

pub mod centroids;
pub mod dense_mlp;
pub mod device;
pub mod error;
pub mod ggml_quants;
pub mod gguf;
pub mod head_compact;
pub mod head_q8;
pub mod importance;
pub mod layer_predictors;
pub mod manifest;
pub mod model_dir;
pub mod predictor;
pub mod records;
pub mod reuse_table;
pub mod safetensors_io;
pub mod scorer;
pub mod sketch;
pub mod thresholds;

pub use error::FormatError;
