//! `runtime`: run, score and stream a model on the device.

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use runtime::generate::{generate, GenerateOptions};
use runtime::sampler::Sampler;
use runtime::{PreparedMode, Sparsity};
use std::io::Write;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "runtime", version, about = "Run a model whose weights live on storage")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How a prepared model (manifest.toml) runs; ignored for a model directory.
#[derive(Args, Clone)]
struct ModeArgs {
    /// Memory budget for the streaming engine (e.g. 155MiB, 1.5GiB): refused with the minimum
    /// when too small; what it leaves beyond K_max rows per layer becomes extra row slots.
    #[arg(long)]
    mem_budget: Option<String>,
    /// Predicted sets with every row in memory and batched prefill (same sets as streaming;
    /// also measures predictor top-1 and recall).
    #[arg(long, conflicts_with_all = ["mem_budget", "dense"])]
    in_memory: bool,
    /// Every layer dense (the reference for the sparse figures).
    #[arg(long, conflicts_with = "mem_budget")]
    dense: bool,
    /// Read records with pread on the thread pool instead of io_uring.
    #[arg(long)]
    pread: bool,
    /// Bytes per coalesced read at most (default: 1 MiB).
    #[arg(long)]
    max_run_bytes: Option<usize>,
    /// Layers below L run dense, L.. sparse (dense_prefix <= L <= n_layers; default: the
    /// manifest's default_dense_from). `fit` (streaming): the largest L up to that default whose
    /// memory plan fits --mem-budget, so a smaller budget trades quality for memory.
    #[arg(long)]
    dense_from: Option<runtime::stream::DenseFrom>,
    /// How a head's logits become the layer's K_max neurons: top1 (the most likely centroid's
    /// set, the paper's), softN (largest expected membership over the N most likely
    /// centroids; default soft8) or static (no predictor: the neurons most centroids hold, the
    /// baseline the predictor must beat); oracle (--in-memory: each token's true largest);
    /// scorer (no predictor: each layer scores every neuron from its own input with the
    /// resident 4-bit gate/up copy and streams only the kept neurons' downT rows; sets are
    /// --set-scale x n_ff).
    #[arg(long, default_value = "soft8")]
    set_rule: runtime::predictor::SetRule,
    /// Keep this share of K_max neurons per sparse layer and token (0 < s <= 1; of all n_ff
    /// neurons with --set-rule scorer): the most likely ones by the set rule, ties to the
    /// neurons most centroids hold. With `--dense-from fit`, the largest share up to this one
    /// that fits --mem-budget once every layer after the dense prefix is sparse (never below
    /// 0.25; 0.10 with the scorer).
    #[arg(long, default_value_t = 1.0, value_parser = parse_set_scale)]
    set_scale: f64,
    /// How cut sets rank neurons and the soft rule weighs them: importance (the preparation's
    /// per-neuron mean contribution; falls back to membership when it has none) or membership
    /// (how many centroids hold the neuron).
    #[arg(long, value_enum, default_value_t = runtime::predictor::NeuronRank::Importance)]
    neuron_rank: runtime::predictor::NeuronRank,
    /// With --set-rule scorer: a neuron whose row is already in memory counts this many times
    /// its score (>= 1), so marginal neurons stay instead of being swapped every token.
    #[arg(long, default_value_t = 1.0, value_parser = parse_resident_bonus)]
    resident_bonus: f32,
    /// With --set-rule scorer --in-memory: each layer holds this share of its neurons (>=
    /// --set-scale; default: as many as --set-scale, the smallest budget's slots), so the
    /// figures match a streaming run whose budget gives that many slots.
    #[arg(long)]
    slot_share: Option<f64>,
    /// Compute the logits from the preparation's Q8_0 copy of the output head (half the f16
    /// head's memory, which streaming gives to MLP row slots) instead of the f16 head.
    #[arg(long)]
    head_q8: bool,
    /// With --set-rule scorer: read the rows that clear a layer's last threshold (the smallest
    /// score it kept at the last token) while the rest of the layer is still being scored,
    /// instead of after. Not faster on 2 cores (more rows read, and their completions slow
    /// the scoring), so off by default.
    #[arg(long)]
    early_reads: bool,
}

fn parse_resident_bonus(s: &str) -> std::result::Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() && v >= 1.0 => Ok(v),
        _ => Err(format!("'{s}': expected a factor >= 1 (1 = no preference for resident rows)")),
    }
}

fn parse_set_scale(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("'{s}': expected a share of K_max in (0, 1], e.g. 0.6")),
    }
}

/// Applies --dense-from and --set-rule to an opened prepared model.
fn apply_mode(opened: &mut runtime::Opened, manifest_path: &std::path::Path, mode: &ModeArgs) -> Result<()> {
    if mode.head_q8 && opened.model.weights.head_q8.is_none() {
        // streaming loaded it with its plan; in memory (and --dense) it is loaded here
        let Some(m) = opened.manifest.as_ref() else { anyhow::bail!("--head-q8 needs a prepared model (manifest.toml)") };
        opened.model.use_head_q8(manifest_path, m)?;
    }
    if mode.set_rule == runtime::predictor::SetRule::Scorer && matches!(opened.sparsity, Some(Sparsity::InMemory(_))) {
        // the scorer replaces the predictor: its own hook, every downT row in memory
        let m = opened.manifest.as_ref().expect("a prepared model has a manifest");
        let mut p = runtime::scorer::ScoredSparsity::new(manifest_path, m)?;
        p.set_keep_share(mode.set_scale);
        if let Some(c) = mode.slot_share {
            p.set_slots((c * m.model.intermediate_size as f64).round() as usize);
        }
        p.resident_bonus = mode.resident_bonus;
        p.early_reads = mode.early_reads;
        if let Some(d) = mode.dense_from {
            use runtime::stream::DenseFrom;
            p.first_layer = match d {
                DenseFrom::Layer(l) if l >= m.sparsity.dense_prefix && l <= m.model.num_hidden_layers => l,
                DenseFrom::Layer(l) => anyhow::bail!("--dense-from {l}: the scorer covers layers {}..{}", m.sparsity.dense_prefix, m.model.num_hidden_layers),
                DenseFrom::Default => p.first_layer,
                DenseFrom::Fit => anyhow::bail!("--dense-from fit sizes the streaming engine's memory plan: it needs --mem-budget, not --in-memory"),
            };
        }
        opened.sparsity = Some(Sparsity::Scored(Box::new(p)));
        return Ok(());
    }
    match opened.sparsity.as_mut() {
        Some(Sparsity::InMemory(p)) => {
            p.rule = mode.set_rule;
            p.set_set_scale(mode.set_scale);
            p.set_neuron_rank(mode.neuron_rank);
        }
        Some(Sparsity::Stream(e)) => {
            if mode.set_rule == runtime::predictor::SetRule::Oracle {
                anyhow::bail!("--set-rule oracle ranks neurons by their true activations, which needs every row: use it with --in-memory");
            }
            e.rule = mode.set_rule;
            e.resident_bonus = mode.resident_bonus;
            e.set_neuron_rank(mode.neuron_rank);
        }
        Some(Sparsity::Scored(_)) | None => {}
    }
    if let (Some(d), Some(Sparsity::InMemory(p))) = (mode.dense_from, opened.sparsity.as_mut()) {
        use runtime::stream::DenseFrom;
        let n_layers = opened.model.config.num_hidden_layers;
        let l = match d {
            DenseFrom::Layer(l) => l,
            DenseFrom::Default => p.dense_prefix,
            DenseFrom::Fit => anyhow::bail!("--dense-from fit sizes the streaming engine's memory plan: it needs --mem-budget, not --in-memory"),
        };
        if l < p.predictor.spec.first_layer || l > n_layers {
            anyhow::bail!("--dense-from {l}: the predictor covers layers {}..{n_layers} (the prepared dense prefix on)", p.predictor.spec.first_layer);
        }
        p.dense_prefix = l;
    }
    Ok(())
}

impl ModeArgs {
    fn mode(&self, ctx: usize) -> Result<PreparedMode> {
        if self.dense {
            return Ok(PreparedMode::Dense);
        }
        if self.in_memory {
            return Ok(PreparedMode::InMemory);
        }
        let scorer = self.set_rule == runtime::predictor::SetRule::Scorer;
        let mut s = runtime::stream::StreamSettings { ctx, force_pread: self.pread, dense_from: self.dense_from.unwrap_or_default(), set_scale: self.set_scale, scorer, head_q8: self.head_q8, early_reads: self.early_reads, ..Default::default() };
        if let Some(b) = &self.mem_budget {
            s.mem_budget_bytes = Some(runtime::stream::parse_bytes(b).map_err(|e| anyhow::anyhow!("--mem-budget {e}"))?);
        }
        if let Some(m) = self.max_run_bytes {
            s.max_run_bytes = m;
        }
        Ok(PreparedMode::Stream(s))
    }
}

#[derive(Subcommand)]
enum Command {
    /// Generate text after a prompt; prints prefill and decode tok/s.
    Run {
        /// Model directory, or a prepared model's manifest.toml (streamed by default).
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
        /// KV cache positions (default: prompt + n; a streamed model's budget counts 2048).
        #[arg(long)]
        ctx: Option<usize>,
        /// Never choose an end-of-sequence token (as llama.cpp's --ignore-eos): always generate n.
        #[arg(long)]
        ignore_eos: bool,
        #[command(flatten)]
        mode: ModeArgs,
        /// Print one JSON object at the end instead of streaming text.
        #[arg(long)]
        json: bool,
    },
    /// Perplexity of a text file with llama-perplexity's protocol.
    Perplexity {
        /// Model directory, or a prepared model's manifest.toml (streamed by default).
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
        #[command(flatten)]
        mode: ModeArgs,
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Zero-shot multiple-choice accuracy (lm-evaluation-harness's acc_norm).
    Eval {
        /// Model directory, or a prepared model's manifest.toml (streamed by default).
        model: PathBuf,
        /// hellaswag
        #[arg(long, default_value = "hellaswag")]
        task: String,
        /// The task's Arrow file or its directory.
        #[arg(long, default_value = "data/eval/hellaswag/none/validation")]
        data: PathBuf,
        /// Score only the first N items.
        #[arg(long)]
        limit: Option<usize>,
        #[command(flatten)]
        mode: ModeArgs,
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Decode speed on the streaming engine and where the time and bytes go.
    Bench {
        /// A prepared model's manifest.toml.
        manifest: PathBuf,
        #[arg(long)]
        mem_budget: Option<String>,
        /// Prompt text file (default: a fixed sentence).
        #[arg(long)]
        prompt_file: Option<PathBuf>,
        /// Tokens to generate.
        #[arg(short = 'n', default_value_t = 256)]
        n: usize,
        /// KV cache positions (counted in the budget); prompt + n must fit.
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        #[arg(long)]
        pread: bool,
        #[arg(long)]
        max_run_bytes: Option<usize>,
        #[arg(long, default_value = "soft8")]
        set_rule: runtime::predictor::SetRule,
        /// Layers below L dense, L.. sparse; `fit`: as many dense as --mem-budget allows (up to
        /// the manifest's default), then sets smaller than K_max if even that does not fit.
        #[arg(long)]
        dense_from: Option<runtime::stream::DenseFrom>,
        /// Share of K_max neurons kept per sparse layer (see `runtime run --help`).
        #[arg(long, default_value_t = 1.0, value_parser = parse_set_scale)]
        set_scale: f64,
        /// importance or membership (see `runtime run --help`).
        #[arg(long, value_enum, default_value_t = runtime::predictor::NeuronRank::Importance)]
        neuron_rank: runtime::predictor::NeuronRank,
        /// See `runtime run --help`.
        #[arg(long, default_value_t = 1.0, value_parser = parse_resident_bonus)]
        resident_bonus: f32,
        /// See `runtime run --help`.
        #[arg(long)]
        head_q8: bool,
        /// See `runtime run --help`.
        #[arg(long)]
        early_reads: bool,
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long)]
        json: bool,
    },
}

/// The sparsity figures as JSON (null for a dense run).
fn sparsity_json(s: Option<&Sparsity>, n_ff: usize) -> serde_json::Value {
    match s {
        None => serde_json::Value::Null,
        Some(Sparsity::InMemory(s)) => serde_json::json!({
            "mode": "in-memory",
            "dense_prefix": s.dense_prefix,
            "set_scale": s.set_scale,
            "neuron_rank": s.neuron_rank(),
            "sparse_layer_density": s.density(n_ff),
            "top1_accuracy": s.overall_top1(),
            "recall": s.overall_recall(),
            "layers": s.stats.iter().map(|l| serde_json::json!({"layer": l.layer, "top1_accuracy": l.top1_accuracy(),
                "recall": l.recall(), "mean_set_size": l.mean_set_size()})).collect::<Vec<_>>(),
        }),
        Some(Sparsity::Scored(s)) => serde_json::json!({
            "mode": "in-memory",
            "set_rule": "scorer",
            "dense_prefix": s.first_layer,
            "keep_share": s.keep as f64 / n_ff as f64,
            "slot_share": s.slots as f64 / n_ff as f64,
            "resident_bonus": s.resident_bonus,
            "early_reads": s.early_reads,
            "reuse_ratio": s.reuse_ratio(),
            "rows_loaded_early_share": s.loaded_early as f64 / s.loaded.max(1) as f64,
            "sparse_layer_density": s.density(),
        }),
        Some(Sparsity::Stream(e)) => {
            let st = &e.stats;
            serde_json::json!({
                "mode": "stream",
                "set_rule": e.rule.to_string(),
                "dense_prefix": e.first_layer,
                "set_scale": e.plan.set_scale,
                "neuron_rank": e.neuron_rank(),
                "tokens": st.tokens,
                "reuse_ratio": st.reuse_ratio(),
                "rows_loaded": st.rows_loaded,
                "bytes_read": st.bytes_read,
                "plan": e.plan,
            })
        }
    }
}

fn print_sparsity(s: Option<&mut Sparsity>, n_ff: usize) {
    match s {
        Some(Sparsity::InMemory(p)) => println!(
            "predicted sparsity: {:.3} of sparse-layer neurons kept (layers >= {}, sets of {:.2} x K_max); top-1 {:.3}, recall {:.3}",
            p.density(n_ff), p.dense_prefix, p.set_scale, p.overall_top1(), p.overall_recall()
        ),
        Some(Sparsity::Scored(p)) => println!(
            "scored sparsity: {:.3} of sparse-layer neurons kept (layers >= {}, 4-bit gate/up scorer, resident bonus {}), reuse {:.3}",
            p.density(), p.first_layer, p.resident_bonus, p.reuse_ratio()
        ),
        Some(Sparsity::Stream(e)) => {
            e.refresh_io_stats();
            let st = &e.stats;
            println!(
                "streamed: {} tokens, layers {}.. sparse ({} sets of {:.2} x {}), reuse {:.3}, {:.1} KiB read per token, {:.0} slots per layer (budget {})",
                st.tokens,
                e.first_layer,
                e.rule,
                e.plan.set_scale,
                if e.rule == runtime::predictor::SetRule::Scorer { "n_ff" } else { "K_max" },
                st.reuse_ratio(),
                st.bytes_read as f64 / 1024.0 / st.tokens.max(1) as f64,
                e.plan.capacity.iter().sum::<usize>() as f64 / e.plan.capacity.len().max(1) as f64,
                e.plan.budget_bytes.map(|b| format!("{:.1} MiB", b as f64 / 1048576.0)).unwrap_or_else(|| "unlimited".into())
            );
        }
        None => {}
    }
}

fn main() {
    let cli = Cli::parse();
    let threads = match &cli.command {
        Command::Run { threads, .. } | Command::Perplexity { threads, .. } | Command::Eval { threads, .. } | Command::Bench { threads, .. } => *threads,
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
        Command::Run { model, prompt, n, temp, top_p, seed, threads: _, ctx, ignore_eos, mode, json } => {
            // the streaming plan counts a KV cache of --ctx positions (2048 when not given)
            let mut opened = runtime::open(&model, &mode.mode(ctx.unwrap_or(2048))?)?;
            apply_mode(&mut opened, &model, &mode)?;
            let prompt_len = opened.tokenizer.encode(&prompt, true)?.len();
            let opts = GenerateOptions { max_new_tokens: n, ctx: ctx.unwrap_or(prompt_len + n), stop_at_eos: !ignore_eos };
            let mut sampler = Sampler::new(temp, top_p, seed);
            let mut stdout = std::io::stdout();
            let hook = opened.sparsity.as_mut().map(|s| s.as_hook());
            let r = generate(&opened.model, &opened.tokenizer, &prompt, &opts, &mut sampler, hook, |piece| {
                if !json {
                    let _ = stdout.write_all(piece.as_bytes());
                    let _ = stdout.flush();
                }
            })?;
            let n_ff = opened.model.config.intermediate_size;
            if json {
                let mut v = serde_json::to_value(&r)?;
                if let Some(Sparsity::Stream(e)) = opened.sparsity.as_mut() {
                    e.refresh_io_stats();
                }
                v["sparsity"] = sparsity_json(opened.sparsity.as_ref(), n_ff);
                v["peak_rss_bytes"] = runtime::bench::peak_rss_bytes().into();
                println!("{v}");
            } else {
                println!();
                eprintln!(
                    "prompt {} tokens, prefill {:.1} tok/s; generated {} tokens, decode {:.1} tok/s",
                    r.prompt_tokens, r.prefill_tok_per_s, r.generated_tokens, r.decode_tok_per_s
                );
                print_sparsity(opened.sparsity.as_mut(), n_ff);
            }
        }
        Command::Perplexity { model, text, ctx, chunks, threads: _, oracle_thresholds, dense_prefix, mode, json } => {
            let mode_args = mode;
            let mode = if oracle_thresholds.is_some() { PreparedMode::Dense } else { mode_args.mode(ctx)? };
            let mut opened = runtime::open(&model, &mode)?;
            apply_mode(&mut opened, &model, &mode_args)?;
            let n_ff = opened.model.config.intermediate_size;
            let mut oracle = match &oracle_thresholds {
                Some(p) => {
                    let t = formats::thresholds::Thresholds::load(p)?;
                    if t.n_layers() != opened.model.config.num_hidden_layers {
                        anyhow::bail!("{}: thresholds for {} layers, the model has {}", p.display(), t.n_layers(), opened.model.config.num_hidden_layers);
                    }
                    Some(runtime::oracle::OracleSparsity::new(t, dense_prefix))
                }
                None => None,
            };
            let hook = match oracle.as_mut() {
                Some(o) => Some(o as &mut dyn runtime::model::MlpHook),
                None => opened.sparsity.as_mut().map(|s| s.as_hook()),
            };
            let r = runtime::perplexity::perplexity(&opened.model, &opened.tokenizer, &text, ctx, chunks, hook, |i, n, ppl| {
                if !json {
                    eprint!("\r[{i}/{n}] perplexity so far {ppl:.4}");
                }
            })?;
            let oracle_json = oracle.as_ref().map(|o| {
                serde_json::json!({"mask_kind": o.thresholds.mask_kind, "alpha": o.thresholds.alpha,
                    "dense_prefix": o.dense_prefix, "sparse_layer_density": o.density()})
            });
            if let Some(Sparsity::Stream(e)) = opened.sparsity.as_mut() {
                e.refresh_io_stats();
            }
            if json {
                let mut v = serde_json::to_value(&r)?;
                v["oracle_sparsity"] = oracle_json.unwrap_or(serde_json::Value::Null);
                v["sparsity"] = sparsity_json(opened.sparsity.as_ref(), n_ff);
                println!("{v}");
            } else {
                eprintln!();
                if let Some(o) = &oracle {
                    println!("oracle sparsity: {:.3} of sparse-layer neurons kept (layers >= {})", o.density(), o.dense_prefix);
                }
                print_sparsity(opened.sparsity.as_mut(), n_ff);
                println!(
                    "perplexity {:.4} over {} chunks of {} ({} tokens scored, {} in the text), {:.1} tok/s",
                    r.perplexity, r.chunks, r.ctx, r.tokens_scored, r.tokens, r.tokens_per_s
                );
            }
        }
        Command::Eval { model, task, data, limit, mode, threads: _, json } => {
            let mut opened = runtime::open(&model, &mode.mode(2048)?)?;
            apply_mode(&mut opened, &model, &mode)?;
            let n_ff = opened.model.config.intermediate_size;
            let hook = opened.sparsity.as_mut().map(|s| s.as_hook());
            let r = runtime::eval::evaluate(&opened.model, &opened.tokenizer, &task, &data, limit, hook, |i, n, acc| {
                if !json {
                    eprint!("\r[{i}/{n}] accuracy so far {acc:.4}");
                }
            })?;
            if let Some(Sparsity::Stream(e)) = opened.sparsity.as_mut() {
                e.refresh_io_stats();
            }
            if json {
                let mut v = serde_json::to_value(&r)?;
                v["sparsity"] = sparsity_json(opened.sparsity.as_ref(), n_ff);
                println!("{v}");
            } else {
                eprintln!();
                print_sparsity(opened.sparsity.as_mut(), n_ff);
                println!("{}: acc_norm {:.4} (acc {:.4}) over {} items, {:.1} s", r.task, r.accuracy, r.accuracy_unnormalized, r.items, r.seconds);
            }
        }
        Command::Bench { manifest, mem_budget, prompt_file, n, ctx, pread, max_run_bytes, set_rule, dense_from, set_scale, neuron_rank, resident_bonus, head_q8, early_reads, threads: _, json } => {
            if !manifest.is_file() {
                anyhow::bail!("{}: runtime bench needs a prepared model's manifest.toml", manifest.display());
            }
            let prompt = match &prompt_file {
                Some(p) => std::fs::read_to_string(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?,
                None => "The history of the printing press begins in the fifteenth century, when".to_string(),
            };
            let mode = ModeArgs { mem_budget, in_memory: false, dense: false, pread, max_run_bytes, dense_from, set_rule, set_scale, neuron_rank, resident_bonus, slot_share: None, head_q8, early_reads };
            let mut opened = runtime::open(&manifest, &mode.mode(ctx)?)?;
            apply_mode(&mut opened, &manifest, &mode)?;
            let prompt_tokens = opened.tokenizer.encode(prompt.trim_end(), true)?.len();
            if prompt_tokens + n > ctx {
                return Err(runtime::RuntimeError::ContextOverflow { needed: prompt_tokens + n, ctx, prompt_tokens }.into());
            }
            let Some(Sparsity::Stream(engine)) = opened.sparsity.as_mut() else { unreachable!("stream mode") };
            let r = runtime::bench::bench(&opened.model, &opened.tokenizer, engine, prompt.trim_end(), n)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!("decode {:.2} tok/s ({} tokens after a {}-token prompt; prefill {:.1} tok/s)", r.decode_tok_per_s, r.generated_tokens, r.prompt_tokens, r.prefill_tok_per_s);
                println!(
                    "per token: {:.1} KiB read in {:.1} requests, {:.0} of {:.0} rows read (reuse {:.3}); I/O wait {:.2} ms, compute {:.2} ms, predictor {:.2} ms",
                    r.bytes_read_per_token / 1024.0, r.requests_per_token, r.rows_read_per_token, r.rows_needed_per_token, r.reuse_ratio,
                    r.io_wait_ms_per_token, r.compute_ms_per_token, r.predictor_ms_per_token
                );
                println!(
                    "read bandwidth {:.1} MiB/s ({}); peak RSS {:.1} MiB; plan {:.1} MiB (minimum {:.1} MiB); layers {}.. sparse, sets of {:.2} x {}",
                    r.read_bandwidth_bytes_per_s / 1048576.0, r.io_path, r.peak_rss_bytes as f64 / 1048576.0,
                    r.planned_bytes as f64 / 1048576.0, r.minimum_budget_bytes as f64 / 1048576.0, r.dense_from, r.set_scale,
                    if r.set_rule == "scorer" { "n_ff" } else { "K_max" }
                );
            }
        }
    }
    Ok(())
}
