//! The runtime library: the one forward pass of the project (also used by `prep` for
//! activation capture), tokenizer, sampling, generation and perplexity.

pub mod error;
pub mod generate;
pub mod kv_cache;
pub mod model;
pub mod ops;
pub mod oracle;
pub mod perplexity;
pub mod sampler;
pub mod tensor;
pub mod tokenizer;

pub use error::{Result, RuntimeError};
pub use model::Model;
pub use tokenizer::Tokenizer;

use std::path::Path;

/// Opens what the CLI is given: a canonical model directory (a `manifest.toml` of a prepared
/// model is accepted once `prep pack` exists).
pub fn open_model(path: &Path) -> Result<(Model, Tokenizer)> {
    if !path.exists() {
        return Err(RuntimeError::Input(format!("{}: no such file or directory", path.display())));
    }
    if path.is_file() {
        return Err(RuntimeError::Input(format!(
            "{}: expected a model directory (config.json, tokenizer.json, *.safetensors); prepared manifests are not supported yet",
            path.display()
        )));
    }
    let model = Model::load(path)?;
    let tok = Tokenizer::load(&path.join(formats::model_dir::TOKENIZER_FILE), model.vocab_size(), model.config.bos_token_id)?;
    Ok((model, tok))
}
