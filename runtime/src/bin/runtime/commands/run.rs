//! `runtime run`: generate text after a prompt.

use crate::mode::{open, Experiment, ModeArgs};
use crate::report::{check_sampling, no_template, print_sparsity, sparsity_json};
use anyhow::Result;
use runtime::generate::{generate, GenerateOptions};
use runtime::sampler::Sampler;
use std::io::Write;
use std::path::PathBuf;

/// The flags of `runtime run`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory, or a prepared model's manifest.toml (streamed by default).
    pub model: PathBuf,
    /// The prompt, raw text (tokenized with the model's BOS where it adds one).
    #[arg(long, short = 'p')]
    pub prompt: String,
    /// Tokens to generate.
    #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
    pub n: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temp: f32,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Worker threads (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    /// KV cache positions (default: the prompt's tokens + n; a streamed run's plan holds them).
    #[arg(long)]
    pub ctx: Option<usize>,
    /// Never choose an end-of-sequence token (as llama.cpp's --ignore-eos): always generate n.
    #[arg(long)]
    pub ignore_eos: bool,
    /// The prompt is one user message: render it through the model's chat template.
    #[arg(long)]
    pub chat: bool,
    #[command(flatten)]
    pub mode: ModeArgs,
    /// Print one JSON object at the end instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let Args { model, prompt, n, temp, top_p, seed, threads: _, ctx, ignore_eos, chat, mode, json } = args;
    check_sampling(temp, top_p)?;
    if n == 0 {
        anyhow::bail!("-n 0: nothing to generate");
    }
    Experiment::parse(&mode.experiment)?;
    // the KV cache holds the prompt and the new tokens unless --ctx says otherwise
    let prompt = match chat {
        false => prompt,
        true => {
            let t = runtime::chat_template_at(&model)?.ok_or_else(|| anyhow::anyhow!("{}", no_template(&model)))?;
            t.render(&[runtime::chat::ChatMessage::new("user", &prompt)], true)?
        }
    };
    let ctx = match ctx {
        Some(c) => c,
        None => runtime::prompt_tokens(&model, &prompt, !chat)?
            .checked_add(n)
            .ok_or_else(|| anyhow::anyhow!("-n {n}: more tokens than any context holds"))?,
    };
    let (mut opened, _) = open(&model, &mode, ctx)?;
    let opts = GenerateOptions { max_new_tokens: n, ctx, stop_at_eos: !ignore_eos, add_special: !chat };
    let mut sampler = Sampler::new(temp, top_p, seed);
    let mut stdout = std::io::stdout();
    // a streamed prompt of more than one batch shows a bar on a terminal
    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("prompt {pos}/{len} tokens {wide_bar} {per_sec}")
            .expect("a valid template"),
    );
    let mut show = |done: usize, total: usize| {
        if done < total || bar.position() > 0 {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        }
        if done == total {
            bar.finish_and_clear();
        }
    };
    let (runner, tokenizer) = opened.runner_and_tokenizer();
    let mut runner = runner.with_prompt_progress(&mut show);
    let r = generate(&mut runner, tokenizer, &prompt, &opts, &mut sampler, |piece| {
        if !json {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
        }
    })?;
    let n_ff = opened.model.config.intermediate_size;
    if let Some(e) = opened.engine() {
        e.refresh_io_stats();
    }
    if json {
        let mut v = serde_json::to_value(&r)?;
        v["sparsity"] = sparsity_json(opened.engine.as_deref(), n_ff);
        v["peak_rss_bytes"] = runtime::bench::peak_rss_bytes().into();
        println!("{v}");
    } else {
        println!();
        eprintln!(
            "prompt {} tokens, prefill {:.1} tok/s; generated {} tokens, decode {:.1} tok/s",
            r.prompt_tokens, r.prefill_tok_per_s, r.generated_tokens, r.decode_tok_per_s
        );
        print_sparsity(opened.engine(), n_ff);
    }
    Ok(())
}
