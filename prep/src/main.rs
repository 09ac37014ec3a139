//! `prep`: the offline stages that turn a model into what the runtime streams.
//! One module per stage; this file only parses the command line.

mod import;
mod pack;
mod tokenizer_json;

use anyhow::Result;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "prep", version, about = "Offline preparation of a model for the streaming runtime")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Import a GGUF file or a Hugging Face directory into a canonical model directory
    /// (config.json, tokenizer.json, f16 model.safetensors with Hugging Face names).
    Import {
        /// A .gguf file, or a directory with config.json, tokenizer.json and *.safetensors.
        input: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// Print one JSON object with the summary.
        #[arg(long)]
        json: bool,
    },
    /// Split an imported model into records.bin (the sparse layers' MLP rows, one record per
    /// neuron) and resident.safetensors (everything else).
    Pack {
        /// Canonical model directory (from `prep import`).
        model: PathBuf,
        /// Layers 0..D stay dense and resident; D..n_layers go to records.bin.
        #[arg(long)]
        dense_prefix: usize,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("prep: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Import { input, out, json } => {
            let t0 = std::time::Instant::now();
            let s = import::import(&input, &out, !json)?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "imported {} ({}): {} tensors, {:.1} M parameters, {:.1} MiB f16 -> {} in {:.1} s",
                    s.source,
                    s.architecture,
                    s.tensors,
                    s.parameters as f64 / 1e6,
                    s.safetensors_bytes as f64 / (1 << 20) as f64,
                    s.out,
                    t0.elapsed().as_secs_f64()
                );
            }
        }
        Command::Pack { model, dense_prefix, out, json } => {
            let t0 = std::time::Instant::now();
            let s = pack::pack(&model, dense_prefix, &out, !json)?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "packed {} records of {} bytes ({} sparse layers, {:.1} MiB) and {:.1} MiB resident in {:.1} s",
                    s.records,
                    s.record_bytes,
                    s.sparse_layers,
                    s.records_file_bytes as f64 / (1 << 20) as f64,
                    s.resident_file_bytes as f64 / (1 << 20) as f64,
                    t0.elapsed().as_secs_f64()
                );
            }
        }
    }
    Ok(())
}
