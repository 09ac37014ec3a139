//! Text generation: batched prefill of the prompt, then one token at a time.
//!
//! A [`Session`] keeps its KV cache and the tokens in it between calls, so a conversation's next
//! turn (or a request that repeats an earlier prompt) only computes the tokens after the longest
//! prefix it shares with what the cache holds.

use crate::error::{Result, RuntimeError};
use crate::kv_cache::KvCache;
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;
use crate::{Model, Runner};
use serde::Serialize;
use std::ops::ControlFlow;

#[derive(Debug, Clone, Serialize)]
pub struct GenerationReport {
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from the session's cache (not recomputed).
    pub reused_prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_tok_per_s: f64,
    pub decode_tok_per_s: f64,
    pub text: String,
    pub token_ids: Vec<u32>,
    /// Per step, the logit of the chosen-most-likely token minus the runner-up's: a small
    /// margin marks a near tie, where another implementation may rightly pick differently.
    pub top2_logit_margins: Vec<f32>,
    pub finish_reason: FinishReason,
    /// Seconds from the call to the first piece of text handed to `on_text`.
    pub first_text_s: Option<f64>,
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-generation token or a stop sequence.
    Stop,
    /// `max_new_tokens` reached.
    Length,
    /// `on_text` asked to stop (a client went away).
    Cancelled,
}

impl FinishReason {
    /// OpenAI's `finish_reason` ("stop", "length"; a cancelled request has no reader).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Cancelled => "cancelled",
        }
    }
}

pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// KV cache size; the prompt plus the new tokens must fit.
    pub ctx: usize,
    /// Stop at an end-of-sequence token (not included in the text); otherwise such tokens are
    /// masked out, as llama.cpp's `--ignore-eos` does.
    pub stop_at_eos: bool,
    /// Encode the prompt with the tokenizer's special tokens (BOS where it adds one); false for
    /// a rendered chat template, which carries its own.
    pub add_special: bool,
}

/// What one call of [`Session::generate`] continues with.
pub struct Continuation<'a> {
    /// The whole sequence so far (a prefix of it may already be in the cache).
    pub prompt_ids: &'a [u32],
    pub max_new_tokens: usize,
    /// Tokens that end generation (not part of the text); empty: never stop early, and, as
    /// llama.cpp's --ignore-eos, `mask` tokens are never chosen.
    pub end_ids: &'a [u32],
    pub mask: &'a [u32],
    /// Stop sequences: generation ends where the text first contains one, which is cut off.
    pub stop: &'a [String],
}

/// A KV cache and the tokens it holds, kept across calls.
pub struct Session {
    cache: KvCache,
    tokens: Vec<u32>,
}

impl Session {
    pub fn new(model: &Model, ctx: usize) -> Result<Self> {
        Ok(Session { cache: model.new_cache(ctx)?, tokens: Vec::new() })
    }

    /// Positions the cache holds.
    pub fn ctx(&self) -> usize {
        self.cache.max_seq
    }

    /// The tokens whose keys and values the cache holds.
    pub fn cached_tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Forgets everything cached.
    pub fn reset(&mut self) {
        self.tokens.clear();
        self.cache.clear();
    }

    /// Generates after `c.prompt_ids`; `on_text` receives each new piece of text as it is
    /// decoded and may break to cancel. The longest prefix of the prompt that the cache holds is
    /// reused (all but the prompt's last token at most: its logits are needed).
    pub fn generate(
        &mut self,
        runner: &mut Runner,
        tok: &Tokenizer,
        c: &Continuation,
        sampler: &mut Sampler,
        on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenerationReport> {
        let r = self.generate_inner(runner, tok, c, sampler, on_text);
        if r.is_err() {
            // a failed forward pass leaves the cache in an unknown state
            self.reset();
        }
        r
    }

    fn generate_inner(
        &mut self,
        runner: &mut Runner,
        tok: &Tokenizer,
        c: &Continuation,
        sampler: &mut Sampler,
        mut on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<GenerationReport> {
        let t_call = std::time::Instant::now();
        let prompt = c.prompt_ids;
        if prompt.is_empty() {
            return Err(RuntimeError::Input("the prompt is empty".into()));
        }
        let needed = prompt.len().saturating_add(c.max_new_tokens);
        if needed > self.ctx() {
            return Err(RuntimeError::ContextOverflow { needed, ctx: self.ctx(), prompt_tokens: prompt.len() });
        }
        // a request's reply depends on its own tokens only: the engine's slots start empty, and
        // the prompt's last tokens that choose the warm slots are computed again
        let mut reusable = prompt.len() - 1;
        if let Some(e) = runner.engine() {
            e.begin_sequence();
            reusable = reusable.min(prompt.len().saturating_sub(crate::stream::engine::WARM_WINDOW_TOKENS));
        }
        let shared = self.tokens.iter().zip(prompt).take_while(|(a, b)| a == b).count();
        let reused = shared.min(reusable);
        self.tokens.truncate(reused);
        self.cache.len = reused;
        let t0 = std::time::Instant::now();
        let new = &prompt[reused..];
        let mut logits = runner.forward(new, &mut self.cache, new.len() - 1)?;
        self.tokens.extend_from_slice(new);
        let prefill_s = t0.elapsed().as_secs_f64();
        let mut out: Vec<u32> = Vec::with_capacity(c.max_new_tokens);
        let mut text = String::new();
        let mut printed = 0usize;
        let mut first_text_s = None;
        let mut finish = FinishReason::Length;
        let t1 = std::time::Instant::now();
        let mut margins = Vec::with_capacity(c.max_new_tokens);
        let mut emit = |piece: &str, first: &mut Option<f64>| {
            if piece.is_empty() {
                return ControlFlow::Continue(());
            }
            first.get_or_insert_with(|| t_call.elapsed().as_secs_f64());
            on_text(piece)
        };
        for step in 0..c.max_new_tokens {
            for &e in c.mask {
                if let Some(l) = logits.get_mut(e as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
            margins.push(top2_margin(&logits));
            let next = sampler.sample(&logits);
            if c.end_ids.contains(&next) {
                finish = FinishReason::Stop;
                break;
            }
            out.push(next);
            text = tok.decode(&out)?;
            if let Some(at) = find_stop(&text, printed, c.stop) {
                text.truncate(at);
                let _ = emit(&text[printed.min(at)..], &mut first_text_s);
                printed = at;
                finish = FinishReason::Stop;
                break;
            }
            let safe = safe_prefix_len(&text, c.stop).max(printed);
            if emit(&text[printed..safe], &mut first_text_s).is_break() {
                printed = safe;
                finish = FinishReason::Cancelled;
                break;
            }
            printed = safe;
            if step + 1 == c.max_new_tokens {
                break;
            }
            logits = runner.forward(&[next], &mut self.cache, 0)?;
            self.tokens.push(next);
        }
        if finish == FinishReason::Length {
            // a reply cut by max_new_tokens inside a character's bytes ends before that character
            // (the bytes decode to U+FFFD), never in a broken one
            let whole = text.trim_end_matches('\u{FFFD}').len().max(printed);
            text.truncate(whole);
        }
        if finish != FinishReason::Cancelled && printed < text.len() {
            let _ = emit(&text[printed..], &mut first_text_s);
        }
        let decode_s = t1.elapsed().as_secs_f64();
        // Decode speed counts the forward passes after the first sampled token.
        let decode_steps = out.len().saturating_sub(1).max(1);
        Ok(GenerationReport {
            prompt_tokens: prompt.len(),
            reused_prompt_tokens: reused,
            generated_tokens: out.len(),
            prefill_tok_per_s: new.len() as f64 / prefill_s,
            decode_tok_per_s: decode_steps as f64 / decode_s,
            text,
            token_ids: out,
            top2_logit_margins: margins,
            finish_reason: finish,
            first_text_s,
        })
    }
}

/// Generates after `prompt` (a fresh cache); `on_text` receives each new piece of text.
pub fn generate(
    runner: &mut Runner,
    tok: &Tokenizer,
    prompt: &str,
    opts: &GenerateOptions,
    sampler: &mut Sampler,
    mut on_text: impl FnMut(&str),
) -> Result<GenerationReport> {
    // (bounded: a prompt that cannot fit is refused before it is tokenized whole)
    let prompt_ids = match tok.encode_at_most(prompt, opts.add_special, opts.ctx)? {
        crate::tokenizer::Bounded::Whole(ids) => ids,
        crate::tokenizer::Bounded::MoreThan(n) => {
            return Err(RuntimeError::PromptTooLong { max_tokens: n, ctx: opts.ctx });
        }
    };
    // (the session refuses an empty prompt, or one that does not fit opts.ctx with the new tokens)
    let eos = runner.model.config.eos_token_ids();
    let (end_ids, mask): (&[u32], &[u32]) = if opts.stop_at_eos { (&eos, &[]) } else { (&[], &eos) };
    let mut session = Session::new(runner.model, opts.ctx)?;
    let c = Continuation { prompt_ids: &prompt_ids, max_new_tokens: opts.max_new_tokens, end_ids, mask, stop: &[] };
    session.generate(runner, tok, &c, sampler, |piece| {
        on_text(piece);
        ControlFlow::Continue(())
    })
}

/// Where the first stop sequence begins in `text`, searching only where one could end after
/// byte `printed` (text before it was already checked).
fn find_stop(text: &str, printed: usize, stop: &[String]) -> Option<usize> {
    stop.iter()
        .filter(|s| !s.is_empty())
        .filter_map(|s| {
            let mut from = printed.saturating_sub(s.len());
            while !text.is_char_boundary(from) {
                from -= 1;
            }
            text[from..].find(s.as_str()).map(|i| from + i)
        })
        .min()
}

/// How much of `text` can be shown: all but a tail that may still grow into a stop sequence
/// (a proper prefix of one) or an incomplete UTF-8 character (decoded as U+FFFD).
fn safe_prefix_len(text: &str, stop: &[String]) -> usize {
    let mut safe = text.len();
    for s in stop {
        for (i, _) in s.char_indices().skip(1) {
            if text.ends_with(&s[..i]) {
                safe = safe.min(text.len() - i);
            }
        }
    }
    let t = text[..safe].trim_end_matches('\u{FFFD}');
    t.len()
}

/// Largest logit minus the second largest.
fn top2_margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in logits {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_sequences_are_found_and_held_back() {
        let stop = vec!["\n\n".to_string(), "END".to_string()];
        assert_eq!(find_stop("abc\n\nd", 0, &stop), Some(3));
        assert_eq!(find_stop("xEND then\n\n", 2, &stop), Some(1));
        assert_eq!(find_stop("abc", 0, &stop), None);
        // a tail that may become a stop sequence is not shown yet
        assert_eq!(safe_prefix_len("abc\n", &stop), 3);
        assert_eq!(safe_prefix_len("abcEN", &stop), 3);
        assert_eq!(safe_prefix_len("abcE", &stop), 3);
        assert_eq!(safe_prefix_len("abcX", &stop), 4);
        // an incomplete character is not shown either
        assert_eq!(safe_prefix_len("ab\u{FFFD}", &[]), 2);
        // multi-byte characters in a stop sequence cut at character boundaries
        assert_eq!(safe_prefix_len("aé", &["éb".to_string()]), 1);
    }
}
