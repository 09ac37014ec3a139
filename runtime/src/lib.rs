//! The runtime library: the one forward pass of the project (also used by `prep` for
//! activation capture), tokenizer, sampling, generation and perplexity.

pub mod error;
pub mod bench;
pub mod eval;
pub mod generate;
pub mod kv_cache;
pub mod model;
pub mod ops;
pub mod oracle;
pub mod perplexity;
pub mod predictor;
pub mod sampler;
pub mod scorer;
pub mod stream;
pub mod tensor;
pub mod tokenizer;

pub use error::{Result, RuntimeError};
pub use model::Model;
pub use tokenizer::Tokenizer;

use std::path::Path;

/// How a prepared model (a manifest) runs.
#[derive(Debug, Clone)]
pub enum PreparedMode {
    /// Every layer dense, every row in memory (the reference for the sparse figures).
    Dense,
    /// Predicted sets, every row in memory, batched prefill; also measures top-1 and recall.
    InMemory,
    /// Predicted sets streamed from records.bin within a memory budget (the engine).
    Stream(stream::StreamSettings),
}

/// The MLP hook a prepared model runs with.
pub enum Sparsity {
    InMemory(Box<predictor::PredictedSparsity>),
    /// `--set-rule scorer --in-memory`: the 4-bit scorer's sets, every downT row in memory.
    Scored(Box<scorer::ScoredSparsity>),
    Stream(Box<stream::StreamingEngine>),
}

impl Sparsity {
    pub fn as_hook(&mut self) -> &mut dyn model::MlpHook {
        match self {
            Sparsity::InMemory(p) => p.as_mut(),
            Sparsity::Scored(p) => p.as_mut(),
            Sparsity::Stream(e) => &mut **e,
        }
    }
}

/// What the CLI opened: a model directory (dense), or a prepared `manifest.toml`.
pub struct Opened {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub manifest: Option<formats::manifest::Manifest>,
    pub sparsity: Option<Sparsity>,
}

impl Opened {
    pub fn hook(&mut self) -> Option<&mut dyn model::MlpHook> {
        self.sparsity.as_mut().map(|s| s.as_hook())
    }
}

/// The preparation's per-neuron importance (`prep importance`); None, with a note on stderr,
/// for a preparation made before it existed (cut sets are then ranked by membership).
pub fn load_importance(manifest_path: &Path, manifest: &formats::manifest::Manifest) -> Result<Option<formats::importance::NeuronImportance>> {
    let Some(a) = manifest.artifacts.iter().find(|a| a.role == "importance") else {
        eprintln!("note: {} has no importance artifact: cut sets are ranked by membership (rerun make prepare to add it)", manifest_path.display());
        return Ok(None);
    };
    let p = manifest.artifact_path(manifest_path, a);
    Ok(Some(formats::importance::NeuronImportance::load(&p, manifest.model.num_hidden_layers, manifest.model.intermediate_size)?))
}

/// Opens a model directory (dense; `mode` is ignored) or a prepared model's `manifest.toml`.
pub fn open(path: &Path, mode: &PreparedMode) -> Result<Opened> {
    if !path.exists() {
        return Err(RuntimeError::Input(format!("{}: no such file or directory", path.display())));
    }
    if path.is_dir() {
        let (model, tokenizer) = open_model(path)?;
        return Ok(Opened { model, tokenizer, manifest: None, sparsity: None });
    }
    let manifest = formats::manifest::Manifest::load(path)?;
    let tok_path = manifest.artifact_path_of(path, "tokenizer")?;
    let (model, sparsity) = match mode {
        PreparedMode::Stream(settings) => {
            // size and check the budget before loading anything
            let engine = stream::StreamingEngine::new(path, &manifest, settings)?;
            let model = Model::load_streaming(path, &manifest, engine.first_layer, settings.head_q8)?;
            (model, Some(Sparsity::Stream(Box::new(engine))))
        }
        PreparedMode::InMemory | PreparedMode::Dense => {
            let model = Model::load_prepared(path, &manifest)?;
            let sparsity = if matches!(mode, PreparedMode::InMemory) {
                let predictor = predictor::Predictor::load(&manifest.artifact_path_of(path, "predictor")?)?;
                let centroids = formats::centroids::CentroidTable::load(&manifest.artifact_path_of(path, "centroids")?)?;
                let thresholds = formats::thresholds::Thresholds::load(&manifest.artifact_path_of(path, "thresholds")?)?;
                if predictor.spec.first_layer != manifest.sparsity.dense_prefix || predictor.spec.d_model != manifest.model.hidden_size {
                    return Err(RuntimeError::Input(format!(
                        "{}: the predictor is for dense prefix {} and width {}, the manifest says {} and {}",
                        path.display(), predictor.spec.first_layer, predictor.spec.d_model, manifest.sparsity.dense_prefix, manifest.model.hidden_size
                    )));
                }
                let importance = load_importance(path, &manifest)?;
                let mut p = predictor::PredictedSparsity::new(predictor, &centroids, thresholds, importance.as_ref())?;
                p.dense_prefix = manifest.sparsity.default_dense_from();
                Some(Sparsity::InMemory(Box::new(p)))
            } else {
                None
            };
            (model, sparsity)
        }
    };
    let tokenizer = Tokenizer::load(&tok_path, model.vocab_size(), model.config.bos_token_id)?;
    Ok(Opened { model, tokenizer, manifest: Some(manifest), sparsity })
}

/// Opens a canonical model directory.
pub fn open_model(path: &Path) -> Result<(Model, Tokenizer)> {
    if !path.exists() {
        return Err(RuntimeError::Input(format!("{}: no such file or directory", path.display())));
    }
    if path.is_file() {
        return Err(RuntimeError::Input(format!("{}: expected a model directory (config.json, tokenizer.json, *.safetensors)", path.display())));
    }
    let model = Model::load(path)?;
    let tok = Tokenizer::load(&path.join(formats::model_dir::TOKENIZER_FILE), model.vocab_size(), model.config.bos_token_id)?;
    Ok((model, tok))
}
