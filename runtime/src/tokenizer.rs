//! Text <-> token ids through the Hugging Face `tokenizers` crate.

use crate::error::{Result, RuntimeError};
use std::path::{Path, PathBuf};

pub struct Tokenizer {
    pub path: PathBuf,
    inner: tokenizers::Tokenizer,
    /// Whether encoding with special tokens prepends a BOS token (as llama.cpp's add_bos).
    pub adds_bos: bool,
    pub bos_id: Option<u32>,
    /// The most bytes of text one token stands for (its vocabulary string's length, which is
    /// at least the bytes it decodes to): no text of more than `n x max_token_bytes` bytes is
    /// `n` tokens or fewer.
    pub max_token_bytes: usize,
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
        // (one copy of the vocabulary, dropped here: 151K strings for Qwen)
        let (max_id, max_token_bytes) = {
            let vocab = inner.get_vocab(true);
            let max_id = vocab.values().copied().max().unwrap_or(0) as usize;
            (max_id, vocab.keys().map(String::len).max().unwrap_or(1).max(1))
        };
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
        // parsing tokenizer.json frees about as much as the tokenizer then holds (30 of 77
        // MiB for Qwen2.5's): the plan counts what it holds
        crate::release_freed_heap();
        Ok(Tokenizer { path: path.to_path_buf(), inner, adds_bos, bos_id, max_token_bytes })
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

    /// [`Tokenizer::encode`], bounded: the tokens of `text`, or [`Bounded::MoreThan`] as soon
    /// as more than `max_tokens` are certain, without tokenizing the rest. Prefixes of growing
    /// length (cut where a word starts, which the pre-tokenizer splits anyway) are tokenized
    /// until one passes `max_tokens` or the whole text is, so time and memory stay proportional
    /// to what the context can hold, whatever the input's size. Once the whole text is
    /// tokenized its tokens are returned, however many (the caller words the exact overflow).
    pub fn encode_at_most(&self, text: &str, add_special: bool, max_tokens: usize) -> Result<Bounded> {
        let mut take = max_tokens.saturating_mul(8).max(4096);
        loop {
            let cut = prefix_at_word(text, take);
            let ids = self.encode(&text[..cut], add_special)?;
            if cut == text.len() {
                return Ok(Bounded::Whole(ids));
            }
            if ids.len() > max_tokens {
                return Ok(Bounded::MoreThan(max_tokens));
            }
            take = take.saturating_mul(2);
        }
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

/// What [`Tokenizer::encode_at_most`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bounded {
    /// The whole text's tokens (more than the bound only when that was found out by
    /// tokenizing all of it).
    Whole(Vec<u32>),
    /// More tokens than the bound (the rest was not tokenized).
    MoreThan(usize),
}

/// The longest prefix of `text` of at most `bytes` bytes that ends where a word starts (before
/// whitespace that follows a non-space), or at a char boundary when there is no such place;
/// the whole text when it is shorter.
fn prefix_at_word(text: &str, bytes: usize) -> usize {
    if text.len() <= bytes {
        return text.len();
    }
    let mut end = bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let head = &text[..end];
    let at_word = head
        .char_indices()
        .rev()
        .find(|&(i, c)| c.is_whitespace() && head[..i].chars().next_back().is_some_and(|p| !p.is_whitespace()));
    match at_word {
        Some((i, _)) if i > 0 => i,
        _ => end.max(1).min(text.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::prefix_at_word;

    #[test]
    fn prefixes_end_where_a_word_starts() {
        let text = "one two  three ".repeat(1000);
        let cut = prefix_at_word(&text, 4096);
        assert!(cut <= 4096 && cut > 4000, "{cut}");
        assert!(text[cut..].starts_with(' ') && !text[..cut].ends_with(' '), "{:?}", &text[cut - 5..cut + 5]);
        assert_eq!(prefix_at_word("short", 4096), 5);
        // no space at all: a char boundary
        let wide = "é".repeat(5000);
        let cut = prefix_at_word(&wide, 4097);
        assert!(wide.is_char_boundary(cut) && cut == 4096, "{cut}");
    }
}
