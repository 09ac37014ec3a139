//! `runtime bench`: decode speed of a streamed run and where the time and bytes go.

use crate::mode::{open, ModeArgs};
use crate::report::operating_point;
use anyhow::Result;
use std::path::PathBuf;

/// The flags of `runtime bench`.
#[derive(clap::Args)]
pub struct Args {
    /// A prepared model's manifest.toml.
    pub manifest: PathBuf,
    /// Prompt text file (default: a fixed sentence).
    #[arg(long)]
    pub prompt_file: Option<PathBuf>,
    /// Tokens to generate.
    #[arg(short = 'n', default_value_t = 256)]
    pub n: usize,
    /// KV cache positions (counted in the budget); prompt + n must fit.
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    #[command(flatten)]
    pub mode: ModeArgs,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let Args { manifest, prompt_file, n, ctx, mode, threads: _, json } = args;
    if !manifest.is_file() {
        anyhow::bail!("{}: runtime bench needs a prepared model's manifest.toml", manifest.display());
    }
    if mode.in_memory {
        anyhow::bail!("runtime bench measures a streamed run: no --in-memory");
    }
    let mode = ModeArgs { engine: true, ..mode };
    if n == 0 {
        anyhow::bail!("-n 0: nothing to decode");
    }
    let prompt = match &prompt_file {
        Some(p) => std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
        None => "The history of the printing press begins in the fifteenth century, when".to_string(),
    };
    let (mut opened, _) = open(&manifest, &mode, ctx)?;
    // bounded: a prompt that cannot fit is refused before it is tokenized whole
    let prompt_tokens = match opened.tokenizer.encode_at_most(prompt.trim_end(), true, ctx)? {
        runtime::tokenizer::Bounded::Whole(ids) => ids.len(),
        runtime::tokenizer::Bounded::MoreThan(m) => {
            return Err(runtime::RuntimeError::PromptTooLong { max_tokens: m, ctx }.into());
        }
    };
    if prompt_tokens.saturating_add(n) > ctx {
        return Err(runtime::RuntimeError::ContextOverflow { needed: prompt_tokens + n, ctx, prompt_tokens }.into());
    }
    let runtime::Opened { model, tokenizer, engine, .. } = &mut opened;
    let Some(engine) = engine.as_deref_mut() else { unreachable!("a streamed mode") };
    let r = runtime::bench::bench(model, tokenizer, engine, prompt.trim_end(), n)?;
    if json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "decode {:.2} tok/s ({} tokens after a {}-token prompt; prefill {:.1} tok/s)",
            r.decode_tok_per_s, r.generated_tokens, r.prompt_tokens, r.prefill_tok_per_s
        );
        println!(
            "per token: {:.1} KiB read in {:.1} requests, {:.0} of {:.0} rows read (reuse {:.3}); I/O wait {:.2} ms, compute {:.2} ms, choosing sets {:.2} ms",
            r.bytes_read_per_token / 1024.0, r.requests_per_token, r.rows_read_per_token, r.rows_needed_per_token, r.reuse_ratio,
            r.io_wait_ms_per_token, r.compute_ms_per_token, r.choose_ms_per_token
        );
        println!(
            "read bandwidth {:.1} MiB/s ({}); peak RSS {:.1} MiB; plan {:.1} MiB (minimum {:.1} MiB); {}",
            r.read_bandwidth_bytes_per_s / 1048576.0,
            r.io_path,
            r.peak_rss_bytes as f64 / 1048576.0,
            r.planned_bytes as f64 / 1048576.0,
            r.minimum_budget_bytes as f64 / 1048576.0,
            operating_point(&r.set_rule, r.set_unit, r.dense_prefix, r.set_scale)
        );
    }
    Ok(())
}
