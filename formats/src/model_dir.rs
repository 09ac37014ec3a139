//! The canonical model directory that `prep import` writes and the runtime reads:
//!
//! ```text
//! <dir>/config.json        Hugging Face config (names as in transformers)
//! <dir>/tokenizer.json     Hugging Face `tokenizers` format
//! <dir>/chat_template.jinja the chat template (Jinja, as transformers saves it), when the
//!                          source has one (a GGUF's tokenizer.chat_template)
//! <dir>/*.safetensors      weights with Hugging Face tensor names (f16 when written by `prep import`)
//! ```
//! A Hugging Face checkpoint directory (Mistral-7B, Llama-3-8B, Qwen2.5) already has this shape.

use crate::error::{FormatError, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const CONFIG_FILE: &str = "config.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";

/// The decoder-only transformer families the runtime implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    /// Llama, Mistral, SmolLM2: no biases.
    Llama,
    /// Qwen2 / Qwen2.5: bias on the q, k and v projections.
    Qwen2,
}

impl Architecture {
    /// Maps a Hugging Face `model_type` (or GGUF `general.architecture`) to a family.
    pub fn from_model_type(model_type: &str) -> Option<Self> {
        match model_type {
            "llama" | "mistral" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            _ => None,
        }
    }
}

/// `config.json`, with the fields the runtime needs (Hugging Face names).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ModelConfig {
    pub model_type: String,
    #[serde(default)]
    pub architectures: Vec<String>,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    #[serde(default)]
    pub head_dim: Option<usize>,
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    pub vocab_size: usize,
    #[serde(default = "default_max_pos")]
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    #[serde(default)]
    pub bos_token_id: Option<u32>,
    #[serde(default)]
    pub eos_token_id: Option<serde_json::Value>,
    #[serde(default)]
    pub rope_scaling: Option<serde_json::Value>,
    #[serde(default)]
    pub torch_dtype: Option<String>,
}

fn default_rope_theta() -> f64 {
    10000.0
}
fn default_max_pos() -> usize {
    2048
}

impl ModelConfig {
    pub fn architecture(&self) -> Option<Architecture> {
        Architecture::from_model_type(&self.model_type)
    }
    pub fn n_kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }
    pub fn head_dim(&self) -> usize {
        self.head_dim.unwrap_or(self.hidden_size / self.num_attention_heads)
    }
    /// End-of-sequence ids (`eos_token_id` may be a number or a list).
    pub fn eos_token_ids(&self) -> Vec<u32> {
        match &self.eos_token_id {
            Some(serde_json::Value::Number(n)) => n.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
            Some(serde_json::Value::Array(a)) => a.iter().filter_map(|v| v.as_u64()).map(|v| v as u32).collect(),
            _ => vec![],
        }
    }

    /// Checks the config describes a model the runtime can run; `path` is for the message.
    pub fn validate(&self, path: &Path) -> Result<Architecture> {
        let arch = self.architecture().ok_or_else(|| FormatError::UnsupportedArchitecture {
            path: path.to_path_buf(),
            arch: self.model_type.clone(),
        })?;
        let bad = |what: String| Err(FormatError::invalid(path, what));
        if self.hidden_size == 0
            || self.intermediate_size == 0
            || self.num_attention_heads == 0
            || self.n_kv_heads() == 0
            || self.num_hidden_layers == 0
            || self.vocab_size == 0
        {
            return bad("hidden_size, intermediate_size, num_attention_heads, num_key_value_heads, num_hidden_layers and vocab_size must be positive".into());
        }
        if self.head_dim() == 0 || self.max_position_embeddings == 0 {
            return bad(format!(
                "head_dim {} and max_position_embeddings {} must be positive",
                self.head_dim(),
                self.max_position_embeddings
            ));
        }
        // (published models use 1e-6..1e-5; an epsilon near the activations' mean square
        // flattens every norm's output, a garbage model that would still run)
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps > 0.0 && self.rms_norm_eps <= 1e-2) {
            return bad(format!("rms_norm_eps {} must be in (0, 0.01]", self.rms_norm_eps));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!("rope_theta {} must be finite and positive", self.rope_theta));
        }
        let ids = self.bos_token_id.into_iter().chain(self.eos_token_ids());
        if let Some(id) = ids.into_iter().find(|&id| id as usize >= self.vocab_size) {
            return bad(format!("special token id {id} is outside the vocabulary of {}", self.vocab_size));
        }
        if !self.num_attention_heads.is_multiple_of(self.n_kv_heads()) {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.n_kv_heads()
            ));
        }
        if !self.head_dim().is_multiple_of(2) {
            return bad(format!("head_dim {} must be even for RoPE", self.head_dim()));
        }
        if let Some(s) = &self.rope_scaling {
            if !s.is_null() {
                return bad(format!("rope_scaling {s} is not supported (only plain RoPE)"));
            }
        }
        Ok(arch)
    }

    pub fn load(dir: &Path) -> Result<Self> {
        let path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| FormatError::io(&path, e))?;
        let cfg: ModelConfig =
            serde_json::from_str(&text).map_err(|source| FormatError::Json { path: path.clone(), source })?;
        cfg.validate(&path)?;
        Ok(cfg)
    }
}

/// Hugging Face tensor names of one decoder layer.
pub struct LayerTensorNames {
    pub attn_norm: String,
    pub q_proj: String,
    pub k_proj: String,
    pub v_proj: String,
    pub o_proj: String,
    pub q_bias: String,
    pub k_bias: String,
    pub v_bias: String,
    pub mlp_norm: String,
    pub gate_proj: String,
    pub up_proj: String,
    pub down_proj: String,
}

pub fn layer_tensor_names(layer: usize) -> LayerTensorNames {
    let p = format!("model.layers.{layer}");
    LayerTensorNames {
        attn_norm: format!("{p}.input_layernorm.weight"),
        q_proj: format!("{p}.self_attn.q_proj.weight"),
        k_proj: format!("{p}.self_attn.k_proj.weight"),
        v_proj: format!("{p}.self_attn.v_proj.weight"),
        o_proj: format!("{p}.self_attn.o_proj.weight"),
        q_bias: format!("{p}.self_attn.q_proj.bias"),
        k_bias: format!("{p}.self_attn.k_proj.bias"),
        v_bias: format!("{p}.self_attn.v_proj.bias"),
        mlp_norm: format!("{p}.post_attention_layernorm.weight"),
        gate_proj: format!("{p}.mlp.gate_proj.weight"),
        up_proj: format!("{p}.mlp.up_proj.weight"),
        down_proj: format!("{p}.mlp.down_proj.weight"),
    }
}

pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
pub const FINAL_NORM: &str = "model.norm.weight";
pub const LM_HEAD: &str = "lm_head.weight";

/// The safetensors files of a model directory, sorted by name.
pub fn safetensors_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = std::fs::read_dir(dir).map_err(|e| FormatError::io(dir, e))?;
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(FormatError::invalid(dir, "no *.safetensors file in the model directory"));
    }
    Ok(files)
}
