//! `runtime eval`: zero-shot multiple-choice accuracy.

use crate::mode::{open, ModeArgs};
use crate::report::{print_sparsity, sparsity_json};
use anyhow::Result;
use std::path::PathBuf;

/// The flags of `runtime eval`.
#[derive(clap::Args)]
pub struct Args {
    /// Model directory, or a prepared model's manifest.toml (streamed by default).
    pub model: PathBuf,
    /// hellaswag
    #[arg(long, default_value = "hellaswag")]
    pub task: String,
    /// The task's Arrow file or its directory.
    #[arg(long, default_value = "data/eval/hellaswag/none/validation")]
    pub data: PathBuf,
    /// Score only the first N items.
    #[arg(long, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub limit: Option<usize>,
    /// KV cache positions (a streamed run's plan holds them); an item longer than this is
    /// refused. HellaSwag's longest items take about 200.
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
    let Args { model, task, data, limit, ctx, mode, threads: _, json } = args;
    let (mut opened, _) = open(&model, &mode, ctx)?;
    let n_ff = opened.model.config.intermediate_size;
    let (mut runner, tokenizer) = opened.runner_and_tokenizer();
    let r = runtime::eval::evaluate(&mut runner, tokenizer, &task, &data, limit, ctx, |i, n, acc| {
        if !json {
            eprint!("\r[{i}/{n}] accuracy so far {acc:.4}");
        }
    })?;
    if let Some(e) = opened.engine() {
        e.refresh_io_stats();
    }
    if json {
        let mut v = serde_json::to_value(&r)?;
        v["sparsity"] = sparsity_json(opened.engine.as_deref(), n_ff);
        println!("{v}");
    } else {
        eprintln!();
        print_sparsity(opened.engine(), n_ff);
        println!(
            "{}: acc_norm {:.4} (acc {:.4}) over {} items, {:.1} s",
            r.task, r.accuracy, r.accuracy_unnormalized, r.items, r.seconds
        );
    }
    Ok(())
}
