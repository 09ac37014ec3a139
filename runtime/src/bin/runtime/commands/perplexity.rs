//! `runtime perplexity`: llama-perplexity's protocol over a text file.

use crate::mode::{open, ModeArgs};
use crate::report::{print_sparsity, sparsity_json};
use anyhow::Result;
use runtime::stream::DensePrefix;
use std::path::PathBuf;

/// The flags of `runtime perplexity`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory, or a prepared model's manifest.toml (streamed by default).
    pub model: PathBuf,
    #[arg(long)]
    pub text: PathBuf,
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// Score only the first N chunks.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub chunks: Option<usize>,
    #[command(flatten)]
    pub mode: ModeArgs,
    #[arg(long)]
    pub threads: Option<usize>,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let Args { model, text, ctx, chunks, threads: _, mode, json } = args;
    let mode = ModeArgs { perplexity: true, ..mode };
    let (mut opened, x) = open(&model, &mode, ctx)?;
    let n_ff = opened.model.config.intermediate_size;
    let mut oracle = match &x.oracle_thresholds {
        Some(p) => {
            if opened.engine.is_some() {
                anyhow::bail!("--experiment oracle-thresholds masks a dense model's activations: use it with a model directory or --strategy dense");
            }
            let t = formats::thresholds::Thresholds::load(p)?;
            if t.n_layers() != opened.model.config.num_hidden_layers {
                anyhow::bail!(
                    "{}: thresholds for {} layers, the model has {}",
                    p.display(),
                    t.n_layers(),
                    opened.model.config.num_hidden_layers
                );
            }
            let prefix = match mode.dense_prefix {
                None => 0,
                Some(DensePrefix::Layer(l)) => l,
                Some(d) => anyhow::bail!("--dense-prefix {d:?}: oracle masks take a layer number"),
            };
            Some(runtime::oracle::OracleSparsity::new(t, prefix))
        }
        None => None,
    };
    let (mut runner, tokenizer) = opened.runner_and_tokenizer();
    if let Some(o) = oracle.as_mut() {
        runner = runtime::Runner::with_hook(runner.model, o);
    }
    let r = runtime::perplexity::perplexity(&mut runner, tokenizer, &text, ctx, chunks, |i, n, ppl| {
        if !json {
            eprint!("\r[{i}/{n}] perplexity so far {ppl:.4}");
        }
    })?;
    let oracle_json = oracle.as_ref().map(|o| {
        serde_json::json!({"mask_kind": o.thresholds.mask_kind, "alpha": o.thresholds.alpha,
            "dense_prefix": o.dense_prefix, "sparse_layer_density": o.density()})
    });
    if let Some(e) = opened.engine() {
        e.refresh_io_stats();
    }
    if json {
        let mut v = serde_json::to_value(&r)?;
        v["oracle_sparsity"] = oracle_json.unwrap_or(serde_json::Value::Null);
        v["sparsity"] = sparsity_json(opened.engine.as_deref(), n_ff);
        v["peak_rss_bytes"] = runtime::bench::peak_rss_bytes().into();
        println!("{v}");
    } else {
        eprintln!();
        if let Some(o) = &oracle {
            println!("oracle sparsity: {:.3} of sparse-layer neurons kept (layers >= {})", o.density(), o.dense_prefix);
        }
        print_sparsity(opened.engine(), n_ff);
        println!(
            "perplexity {:.4} over {} chunks of {} ({} tokens scored, {} in the text), {:.1} tok/s",
            r.perplexity, r.chunks, r.ctx, r.tokens_scored, r.tokens, r.tokens_per_s
        );
    }
    Ok(())
}
