//! Text generation: batched prefill of the prompt, then one token at a time.

use crate::error::{Result, RuntimeError};
use crate::Runner;
use crate::sampler::Sampler;
use crate::tokenizer::Tokenizer;
use serde::Serialize;

#[derive(Debug, Clone, Serialize)]
pub struct GenerationReport {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_tok_per_s: f64,
    pub decode_tok_per_s: f64,
    pub text: String,
    pub token_ids: Vec<u32>,
    /// Per step, the logit of the chosen-most-likely token minus the runner-up's: a small
    /// margin marks a near tie, where another implementation may rightly pick differently.
    pub top2_logit_margins: Vec<f32>,
}

pub struct GenerateOptions {
    pub max_new_tokens: usize,
    /// KV cache size; the prompt plus the new tokens must fit.
    pub ctx: usize,
    /// Stop at an end-of-sequence token (not included in the text); otherwise such tokens are
    /// masked out, as llama.cpp's `--ignore-eos` does.
    pub stop_at_eos: bool,
}

/// Generates after `prompt`; `on_text` receives each new piece of text as it is decoded.
pub fn generate(runner: &mut Runner, tok: &Tokenizer, prompt: &str, opts: &GenerateOptions, sampler: &mut Sampler, mut on_text: impl FnMut(&str)) -> Result<GenerationReport> {
    let model = runner.model;
    let prompt_ids = tok.encode(prompt, true)?;
    if prompt_ids.is_empty() {
        return Err(RuntimeError::Input("the prompt is empty".into()));
    }
    let needed = prompt_ids.len() + opts.max_new_tokens;
    if needed > opts.ctx {
        return Err(RuntimeError::ContextOverflow { needed, ctx: opts.ctx, prompt_tokens: prompt_ids.len() });
    }
    let mut cache = model.new_cache(opts.ctx)?;
    let eos = model.config.eos_token_ids();
    let t0 = std::time::Instant::now();
    let mut logits = runner.forward(&prompt_ids, &mut cache, prompt_ids.len() - 1)?;
    let prefill_s = t0.elapsed().as_secs_f64();
    let mut out: Vec<u32> = Vec::with_capacity(opts.max_new_tokens);
    let mut printed = String::new();
    let t1 = std::time::Instant::now();
    let mut margins = Vec::with_capacity(opts.max_new_tokens);
    for step in 0..opts.max_new_tokens {
        if !opts.stop_at_eos {
            // As llama.cpp's --ignore-eos: end-of-sequence tokens can never be chosen.
            for &e in &eos {
                if let Some(l) = logits.get_mut(e as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        margins.push(top2_margin(&logits));
        let next = sampler.sample(&logits);
        if opts.stop_at_eos && eos.contains(&next) {
            break;
        }
        out.push(next);
        let text = tok.decode(&out)?;
        if text.len() > printed.len() && text.is_char_boundary(printed.len()) {
            on_text(&text[printed.len()..]);
            printed = text;
        }
        if step + 1 == opts.max_new_tokens {
            break;
        }
        logits = runner.forward(&[next], &mut cache, 0)?;
    }
    let decode_s = t1.elapsed().as_secs_f64();
    // Decode speed counts the forward passes after the first sampled token.
    let decode_steps = out.len().saturating_sub(1).max(1);
    Ok(GenerationReport {
        prompt_tokens: prompt_ids.len(),
        generated_tokens: out.len(),
        prefill_tok_per_s: prompt_ids.len() as f64 / prefill_s,
        decode_tok_per_s: decode_steps as f64 / decode_s,
        text: tok.decode(&out)?,
        token_ids: out,
        top2_logit_margins: margins,
    })
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
