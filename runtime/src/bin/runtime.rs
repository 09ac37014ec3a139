//! `runtime`: run, score and (later) stream a model on the device.

use anyhow::Result;
use clap::{Parser, Subcommand};
use runtime::generate::{generate, GenerateOptions};
use runtime::sampler::Sampler;
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "runtime", version, about = "Run a model whose weights live on storage")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text after a prompt; prints prefill and decode tok/s.
    Run {
        /// Model directory (or, later, a prepared manifest.toml).
        model: PathBuf,
        #[arg(long, short = 'p')]
        prompt: String,
        /// Tokens to generate.
        #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
        n: usize,
        /// 0 = greedy.
        #[arg(long, default_value_t = 0.0)]
        temp: f32,
        #[arg(long, default_value_t = 0.95)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Worker threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// KV cache positions (default: prompt + n).
        #[arg(long)]
        ctx: Option<usize>,
        /// Never choose an end-of-sequence token (as llama.cpp's --ignore-eos): always generate n.
        #[arg(long)]
        ignore_eos: bool,
        /// Print one JSON object at the end instead of streaming text.
        #[arg(long)]
        json: bool,
    },
    /// Perplexity of a text file with llama-perplexity's protocol.
    Perplexity {
        model: PathBuf,
        #[arg(long)]
        text: PathBuf,
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        /// Score only the first N chunks.
        #[arg(long)]
        chunks: Option<usize>,
        /// Oracle-mask sparsity: keep only the neurons whose true activation reaches these
        /// thresholds (a `prep capture` thresholds.json) in layers >= --dense-prefix.
        #[arg(long)]
        oracle_thresholds: Option<PathBuf>,
        #[arg(long, default_value_t = 0)]
        dense_prefix: usize,
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    let cli = Cli::parse();
    let threads = match &cli.command {
        Command::Run { threads, .. } | Command::Perplexity { threads, .. } => *threads,
    };
    // The whole command runs inside the pool, so every parallel op forks from a worker thread
    // (cheap) instead of being injected from outside and waking a sleeping worker (~10s of us,
    // hundreds of times per decoded token).
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(threads.unwrap_or(0)).build() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("runtime: error: cannot start {threads:?} threads: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = pool.install(|| run(cli)) {
        eprintln!("runtime: error: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run { model, prompt, n, temp, top_p, seed, threads: _, ctx, ignore_eos, json } => {
            let (model, tok) = runtime::open_model(&model)?;
            let prompt_len = tok.encode(&prompt, true)?.len();
            let opts = GenerateOptions { max_new_tokens: n, ctx: ctx.unwrap_or(prompt_len + n), stop_at_eos: !ignore_eos };
            let mut sampler = Sampler::new(temp, top_p, seed);
            let mut stdout = std::io::stdout();
            let r = generate(&model, &tok, &prompt, &opts, &mut sampler, |piece| {
                if !json {
                    let _ = stdout.write_all(piece.as_bytes());
                    let _ = stdout.flush();
                }
            })?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!();
                eprintln!(
                    "prompt {} tokens, prefill {:.1} tok/s; generated {} tokens, decode {:.1} tok/s",
                    r.prompt_tokens, r.prefill_tok_per_s, r.generated_tokens, r.decode_tok_per_s
                );
            }
        }
        Command::Perplexity { model, text, ctx, chunks, threads: _, oracle_thresholds, dense_prefix, json } => {
            let (model, tok) = runtime::open_model(&model)?;
            let mut oracle = match &oracle_thresholds {
                Some(p) => {
                    let t = formats::thresholds::Thresholds::load(p)?;
                    if t.n_layers() != model.config.num_hidden_layers {
                        anyhow::bail!("{}: thresholds for {} layers, the model has {}", p.display(), t.n_layers(), model.config.num_hidden_layers);
                    }
                    Some(runtime::oracle::OracleSparsity::new(t, dense_prefix))
                }
                None => None,
            };
            let hook = oracle.as_mut().map(|o| o as &mut dyn runtime::model::MlpHook);
            let r = runtime::perplexity::perplexity(&model, &tok, &text, ctx, chunks, hook, |i, n, ppl| {
                if !json {
                    eprint!("\r[{i}/{n}] perplexity so far {ppl:.4}");
                }
            })?;
            let oracle_json = oracle.as_ref().map(|o| {
                serde_json::json!({"mask_kind": o.thresholds.mask_kind, "alpha": o.thresholds.alpha,
                    "dense_prefix": o.dense_prefix, "sparse_layer_density": o.density()})
            });
            if json {
                let mut v = serde_json::to_value(&r)?;
                v["oracle_sparsity"] = oracle_json.unwrap_or(serde_json::Value::Null);
                println!("{v}");
            } else {
                eprintln!();
                if let Some(o) = &oracle {
                    println!("oracle sparsity: {:.3} of sparse-layer neurons kept (layers >= {})", o.density(), o.dense_prefix);
                }
                println!(
                    "perplexity {:.4} over {} chunks of {} ({} tokens scored, {} in the text), {:.1} tok/s",
                    r.perplexity, r.chunks, r.ctx, r.tokens_scored, r.tokens, r.tokens_per_s
                );
            }
        }
    }
    Ok(())
}
