//! Perplexity with llama.cpp's `llama-perplexity` protocol, so the figures compare directly:
//! tokenize the whole text (with BOS where the tokenizer adds it); split into chunks of `ctx`
//! tokens (the tail that does not fill a chunk is dropped); where the model adds BOS the first
//! token of each chunk is replaced by BOS; score tokens `ctx/2 + 1 .. ctx` of each chunk from the
//! logits at positions `ctx/2 .. ctx - 1`.

use crate::error::{Result, RuntimeError};
use crate::ops::softmax::log_sum_exp;
use crate::tokenizer::Tokenizer;
use crate::Runner;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Clone, Serialize)]
pub struct PerplexityReport {
    pub perplexity: f64,
    /// Tokens of the whole text.
    pub tokens: usize,
    pub tokens_scored: usize,
    pub chunks: usize,
    pub ctx: usize,
    pub seconds: f64,
    pub tokens_per_s: f64,
}

pub fn perplexity(
    runner: &mut Runner,
    tok: &Tokenizer,
    text_path: &Path,
    ctx: usize,
    max_chunks: Option<usize>,
    mut on_chunk: impl FnMut(usize, usize, f64),
) -> Result<PerplexityReport> {
    let model = runner.model;
    let text = std::fs::read_to_string(text_path).map_err(|source| RuntimeError::Io {
        path: text_path.to_path_buf(),
        offset: None,
        source,
    })?;
    let tokens = tok.encode(&text, true)?;
    if ctx < 4 {
        return Err(RuntimeError::Setting {
            setting: crate::error::Setting::Context,
            value: ctx.to_string(),
            why: "too small to score (at least 4 positions)".into(),
        });
    }
    if tokens.len() < 2 * ctx {
        return Err(RuntimeError::TextTooShort {
            path: text_path.to_path_buf(),
            tokens: tokens.len(),
            needed: 2 * ctx,
        });
    }
    let n_chunks = (tokens.len() / ctx).min(max_chunks.unwrap_or(usize::MAX));
    let first = ctx / 2;
    let mut cache = model.new_cache(ctx)?;
    let (mut nll, mut count) = (0f64, 0usize);
    let t0 = std::time::Instant::now();
    for i in 0..n_chunks {
        let mut chunk = tokens[i * ctx..(i + 1) * ctx].to_vec();
        if tok.adds_bos {
            chunk[0] = tok.bos_id.expect("adds_bos implies a bos id");
        }
        cache.clear();
        // the logits of positions first..ctx, a row at a time; the last predicts past the chunk
        let mut j = first;
        runner.forward_each(&chunk, &mut cache, first, &mut |row| {
            if j + 1 < ctx {
                let target = tokens[i * ctx + j + 1] as usize;
                nll += log_sum_exp(row) - row[target] as f64;
                count += 1;
            }
            j += 1;
        })?;
        on_chunk(i + 1, n_chunks, (nll / count as f64).exp());
    }
    let seconds = t0.elapsed().as_secs_f64();
    Ok(PerplexityReport {
        perplexity: (nll / count as f64).exp(),
        tokens: tokens.len(),
        tokens_scored: count,
        chunks: n_chunks,
        ctx,
        seconds,
        tokens_per_s: (n_chunks * ctx) as f64 / seconds,
    })
}
