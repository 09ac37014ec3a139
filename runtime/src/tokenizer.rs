//! Text <-> token ids through the Hugging Face `tokenizers` crate.

use crate::error::{Result, RuntimeError};
use std::path::{Path, PathBuf};

pub struct Tokenizer {
    pub path: PathBuf,
    inner: tokenizers::Tokenizer,
    /// Whether encoding with special tokens prepends a BOS token (as llama.cpp's add_bos).
    pub adds_bos: bool,
    pub bos_id: Option<u32>,
}

impl Tokenizer {
    /// Loads `tokenizer.json` and checks every token id fits in `model_vocab` embedding rows.
    pub fn load(path: &Path, model_vocab: usize, bos_id: Option<u32>) -> Result<Self> {
        if !path.exists() {
            return Err(RuntimeError::Tokenizer { path: path.to_path_buf(), message: "file not found".into() });
        }
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| RuntimeError::Tokenizer { path: path.to_path_buf(), message: e.to_string() })?;
        let n = inner.get_vocab_size(true);
        let max_id = inner.get_vocab(true).values().copied().max().unwrap_or(0) as usize;
        if n > model_vocab || max_id >= model_vocab {
            return Err(RuntimeError::VocabMismatch {
                path: path.to_path_buf(),
                tokenizer_vocab: n.max(max_id + 1),
                model_vocab,
            });
        }
        let probe = inner
            .encode("a", true)
            .map_err(|e| RuntimeError::Tokenizer { path: path.to_path_buf(), message: e.to_string() })?;
        let adds_bos = match (bos_id, probe.get_ids().first()) {
            (Some(b), Some(&first)) => first == b && probe.get_ids().len() > 1,
            _ => false,
        };
        Ok(Tokenizer { path: path.to_path_buf(), inner, adds_bos, bos_id })
    }

    /// Encodes `text`; with `add_special`, adds what the tokenizer adds (BOS for Llama/Mistral).
    /// Special-token text inside `text` is not parsed as special (as llama.cpp's tools do).
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, add_special)
            .map_err(|e| RuntimeError::Tokenizer { path: self.path.clone(), message: e.to_string() })?;
        Ok(enc.get_ids().to_vec())
    }

    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| RuntimeError::Tokenizer { path: self.path.clone(), message: e.to_string() })
    }

    /// The id of a special added token (`<|im_end|>`, `</s>`), None when the vocabulary has no
    /// such special token.
    pub fn special_token_id(&self, text: &str) -> Option<u32> {
        self.inner
            .get_added_tokens_decoder()
            .into_iter()
            .find(|(_, t)| t.special && t.content == text)
            .map(|(id, _)| id)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }
}
