//! `prep`: the offline stages that turn a model into what the runtime streams.
//! One module per stage; this file only parses the command line.

mod capture;
mod cluster;
mod import;
mod importance;
mod layers;
mod pack;
mod prepare;
mod report;
mod reuse;
mod scorer;
mod shards;
mod sketch;
mod tokenizer_json;
mod train;

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
    /// (config.json, tokenizer.json, model.safetensors with Hugging Face names).
    Import {
        /// A .gguf file, or a directory with config.json, tokenizer.json and *.safetensors.
        input: PathBuf,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        /// f16: every tensor dequantized to f16 (what the preparation stages read today);
        /// native: a GGUF's own blocks (Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K), byte-equal.
        #[arg(long, value_enum, default_value = "f16")]
        dtype: import::ImportDtype,
        /// Requantize every weight matrix to Q8_0 or Q4_K (from an f16/bf16 Hugging Face
        /// directory, or a GGUF dequantized exactly); norms and biases stay F32.
        #[arg(long, value_enum)]
        quantize: Option<import::QuantizeTo>,
        /// Import into a folder that holds other files (its config.json, tokenizer.json and
        /// model.safetensors are overwritten); without it such a folder is refused, unless an
        /// earlier `prep import` made it.
        #[arg(long)]
        force: bool,
        /// Print one JSON object with the summary.
        #[arg(long)]
        json: bool,
    },
    /// Run the whole offline pipeline of a recipe (pipelines/<name>.toml) up to manifest.toml.
    Prepare {
        recipe: PathBuf,
        /// GGUF file or Hugging Face directory to import (overrides the recipe's `source`).
        #[arg(long)]
        source: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Capture activation masks and per-layer thresholds over a calibration corpus.
    Capture {
        /// Canonical model directory (from `prep import`).
        model: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Calibration text files or directories of .txt files (repeat the flag); sequences are
        /// taken round-robin from the files.
        #[arg(long, required = true)]
        corpus: Vec<PathBuf>,
        /// product or gate-up.
        #[arg(long, default_value = "product")]
        mask_kind: capture::MaskKind,
        /// Sparsity: the fraction of neurons below the per-layer threshold.
        #[arg(long, default_value_t = 0.62)]
        alpha: f64,
        /// Tokens per calibration sequence (T).
        #[arg(long, default_value_t = 512)]
        seq_len: usize,
        /// Sequences to capture in all (across shards).
        #[arg(long, default_value_t = 40)]
        sequences: usize,
        /// Leading sequences whose activations set the thresholds.
        #[arg(long, default_value_t = 8)]
        threshold_sequences: usize,
        /// This machine's part of the corpus, "i/n" (sequences i, i+n, i+2n, ...).
        #[arg(long, default_value = "0/1")]
        shard: String,
        /// Use this thresholds.json (e.g. the calibration capture's, for held-out text).
        #[arg(long)]
        thresholds: Option<PathBuf>,
        #[arg(long)]
        json: bool,
    },
    /// Density and windowed reuse per layer (exact masks and centroid sets) of a capture.
    Report {
        /// Directory with masks-*.arrow shards.
        capture: PathBuf,
        /// `prep cluster` output, for the centroid sets.
        #[arg(long)]
        cluster: Option<PathBuf>,
        /// Also write the report as JSON to this file.
        #[arg(long)]
        out: Option<PathBuf>,
        /// And plot reuse per layer to this PNG.
        #[arg(long)]
        png: Option<PathBuf>,
        /// Measure the centroids' activation-mass coverage with this model over --mass-text.
        #[arg(long, requires_all = ["cluster", "mass_text"])]
        mass_model: Option<PathBuf>,
        #[arg(long)]
        mass_text: Option<PathBuf>,
        #[arg(long, default_value_t = 4096)]
        mass_tokens: usize,
        /// Add the predictor's top-1 accuracy, recall and set size per layer (its
        /// predictor.safetensors; needs --cluster).
        #[arg(long, requires = "cluster")]
        predictor: Option<PathBuf>,
        /// How the predictor's logits become a set (top1 or softN), as `runtime --set-rule`.
        #[arg(long, default_value = "soft8")]
        set_rule: runtime::predictor::SetRule,
        #[arg(long)]
        json: bool,
    },
    /// k-means of the captured masks into K sparse centroids per layer, pruned to K_max.
    Cluster {
        /// Directory with the masks-*.arrow shards of `prep capture`.
        captures: PathBuf,
        #[arg(long)]
        out: PathBuf,
        /// Centroids per layer (and projection).
        #[arg(long, default_value_t = 512)]
        k: usize,
        /// K_max = factor x the layer's mean active count (paper: about 1.0).
        #[arg(long, default_value_t = 1.0)]
        k_max_factor: f64,
        /// A fixed K_max for every layer instead.
        #[arg(long)]
        k_max: Option<usize>,
        #[arg(long, default_value_t = 15)]
        max_iterations: usize,
        /// Only layers a..b (end exclusive), e.g. 20..30.
        #[arg(long)]
        layers: Option<String>,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        #[arg(long)]
        json: bool,
    },
    /// Train the shared activation predictor on a capture and its clustering.
    Train {
        /// Canonical model directory (for its size and shape).
        model: PathBuf,
        /// `prep capture` output.
        #[arg(long)]
        capture: PathBuf,
        /// `prep cluster` output (labels and centroids of layer 0 and the sparse layers).
        #[arg(long)]
        cluster: PathBuf,
        /// Layers 0..D stay dense; the predictor has a head for every layer D..n_layers.
        #[arg(long)]
        dense_prefix: usize,
        #[arg(long)]
        out: PathBuf,
        /// Trunk width (default: the largest multiple of 64, at most 1,024, within 3% of the model).
        #[arg(long)]
        hidden: Option<usize>,
        #[arg(long, default_value_t = 40)]
        max_epochs: usize,
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
        /// Version-2 records (a model of GGML blocks): the type W_down's columns are
        /// requantized to along d_model (Q8_0, Q5_0, Q4_K).
        #[arg(long, default_value = "Q8_0")]
        down: String,
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Per-neuron importance (mean |silu(g) * u| x ||down column||) over calibration text: how
    /// the runtime ranks neurons when it cuts a set below K_max.
    Importance {
        /// Canonical model directory (from `prep import`).
        model: PathBuf,
        /// Calibration text files or directories of .txt files (repeat the flag).
        #[arg(long, required = true)]
        corpus: Vec<PathBuf>,
        #[arg(long, default_value_t = 512)]
        seq_len: usize,
        #[arg(long, default_value_t = 8)]
        sequences: usize,
        /// Output file (importance.safetensors).
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Per-layer predictors (layer_predictors.safetensors + layers.json): for each layer from
    /// --first-layer, a low-rank network from the layer's MLP input to a score per neuron,
    /// trained to mark each token's largest |silu(g) * u| (`--strategy layers`).
    Layers {
        /// Canonical model directory (from `prep import`).
        model: PathBuf,
        /// Calibration text files or directories of .txt files (repeat the flag).
        #[arg(long, required = true)]
        corpus: Vec<PathBuf>,
        #[arg(long, default_value_t = 512)]
        seq_len: usize,
        /// First layer with a predictor (the preparation's dense prefix).
        #[arg(long)]
        first_layer: usize,
        /// Settings as TOML (the recipe's [layers] table), e.g. 'epochs = 4'.
        #[arg(long, default_value = "")]
        settings: String,
        /// Output directory.
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// The resident 4-bit gate/up copy of layers D.. (scorer.safetensors): lets `--strategy
    /// scorer` pick each layer's neurons from its own input and stream only down rows.
    Scorer {
        /// Canonical model directory (from `prep import`).
        model: PathBuf,
        /// Layers 0..D stay dense (the preparation's dense prefix).
        #[arg(long)]
        dense_prefix: usize,
        /// Output file (scorer.safetensors).
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// The resident few-bit gate/up sketch of layers D.. (sketch.safetensors): lets `--strategy
    /// sketch` rank each layer's neurons from its own input and stream whole records.
    Sketch {
        /// Canonical model directory (from `prep import`).
        model: PathBuf,
        /// Layers 0..D stay dense (the preparation's dense prefix).
        #[arg(long)]
        dense_prefix: usize,
        /// Bits per weight: 1, 2 or 4.
        #[arg(long, default_value_t = 2)]
        bits: u32,
        /// Calibration text files (or directories of them) whose MLP inputs weight each
        /// weight's error; none: unweighted.
        #[arg(long, num_args = 1..)]
        corpus: Vec<PathBuf>,
        #[arg(long, default_value_t = 512)]
        seq_len: usize,
        #[arg(long, default_value_t = 4)]
        sequences: usize,
        /// Output file (sketch.safetensors).
        #[arg(long)]
        out: PathBuf,
        #[arg(long)]
        json: bool,
    },
}

fn main() {
    if let Err(e) = run(Cli::parse()) {
        eprintln!("prep: error: {}", formats::error::display_chain(e.as_ref()));
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Import { input, out, dtype, quantize, force, json } => {
            let t0 = std::time::Instant::now();
            let s = import::import_as(&input, &out, dtype, quantize, force, !json)?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "imported {} ({}): {} tensors, {:.1} M parameters, {:.1} MiB -> {} in {:.1} s",
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
        Command::Prepare { recipe, source, json } => {
            let r = prepare::prepare(&recipe, source.as_deref(), !json)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                for s in &r.stages {
                    println!("{:<8} {:>8.1} s{}", s.stage, s.seconds, if s.skipped { " (up to date)" } else { "" });
                }
                println!("manifest: {} ({:.1} s in all)", r.manifest, r.seconds);
            }
        }
        Command::Report {
            capture,
            cluster,
            out,
            png,
            mass_model,
            mass_text,
            mass_tokens,
            predictor,
            set_rule,
            json,
        } => {
            let mut r = report::report(&capture, cluster.as_deref())?;
            if let (Some(p), Some(c)) = (&predictor, &cluster) {
                report::add_predictor(&mut r, &capture, c, p, set_rule)?;
            }
            if let (Some(m), Some(t), Some(c)) = (&mass_model, &mass_text, &cluster) {
                report::add_mass_coverage(&mut r, &capture, c, m, t, mass_tokens)?;
            }
            if let Some(p) = &png {
                report::plot_png(&r, &format!("Activation reuse per layer: {}", capture.display()), p)?;
            }
            let text = serde_json::to_string_pretty(&r)?;
            if let Some(p) = out {
                formats::safetensors_io::write_atomic(&formats::safetensors_io::tmp_path(&p), &p, text.as_bytes())?;
            }
            if json {
                println!("{text}");
            } else {
                println!("{} tokens; reuse = share of token t+1's set active within the last k tokens", r.tokens);
                println!(
                    "{:<14} {:>7} {:>22} {:>22} {:>7} {:>7} {:>7} {:>7} {:>7}",
                    "column",
                    "density",
                    "exact k=1/2/4",
                    "centroid k=1/2/4",
                    "recall",
                    "mass",
                    "p.top1",
                    "p.rec",
                    "p.size"
                );
                let f = |v: &[f64]| v.iter().map(|x| format!("{x:.2}")).collect::<Vec<_>>().join(" / ");
                for l in &r.layers {
                    println!(
                        "{:<14} {:>7.3} {:>22} {:>22} {:>7} {:>7} {:>7} {:>7} {:>7}",
                        l.column,
                        l.density,
                        f(&l.reuse_exact),
                        l.reuse_centroid.as_deref().map(f).unwrap_or_default(),
                        l.centroid_recall.map(|x| format!("{x:.3}")).unwrap_or_default(),
                        l.centroid_mass_coverage.map(|x| format!("{x:.3}")).unwrap_or_default(),
                        l.predictor_top1.map(|x| format!("{x:.3}")).unwrap_or_default(),
                        l.predictor_recall.map(|x| format!("{x:.3}")).unwrap_or_default(),
                        l.predictor_set_size.map(|x| format!("{x:.0}")).unwrap_or_default()
                    );
                }
            }
        }
        Command::Capture {
            model,
            out,
            corpus,
            mask_kind,
            alpha,
            seq_len,
            sequences,
            threshold_sequences,
            shard,
            thresholds,
            json,
        } => {
            let (i, n) = shard
                .split_once('/')
                .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
                .ok_or_else(|| anyhow::anyhow!("--shard {shard:?}: expected i/n, e.g. 0/4"))?;
            let settings = capture::CaptureSettings {
                mask_kind,
                alpha,
                seq_len,
                sequences,
                threshold_sequences,
                corpus: corpus.iter().map(|p| p.display().to_string()).collect(),
                shard_index: i,
                shard_count: n,
                thresholds_from: thresholds.map(|p| p.display().to_string()),
            };
            let s = capture::capture(&model, &out, &settings, !json)?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                let mean = s.density_per_layer.iter().sum::<f64>() / s.density_per_layer.len().max(1) as f64;
                println!(
                    "captured {} tokens ({} sequences) -> {}; mean density {:.3} (target {:.3}); {:.1} s",
                    s.tokens_captured,
                    s.sequences_captured,
                    s.shard_path,
                    mean,
                    1.0 - alpha,
                    s.seconds
                );
            }
        }
        Command::Cluster { captures, out, k, k_max_factor, k_max, max_iterations, layers, seed, json } => {
            let layers = match layers {
                None => None,
                Some(r) => Some(
                    r.split_once("..")
                        .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
                        .filter(|(a, b)| a < b)
                        .map(|r| vec![r])
                        .ok_or_else(|| anyhow::anyhow!("--layers {r:?}: expected a..b with a < b, e.g. 20..30"))?,
                ),
            };
            let settings = cluster::ClusterSettings { k, k_max_factor, k_max, max_iterations, layers, seed };
            let s = cluster::cluster(&captures, &out, &settings, !json)?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!("{:<16} {:>6} {:>8} {:>6} {:>7} {:>6}", "column", "K_max", "active", "iters", "recall", "s");
                for l in &s.layers {
                    println!(
                        "{:<16} {:>6} {:>8.1} {:>6} {:>7.3} {:>6.1}",
                        l.column, l.k_max, l.mean_active, l.iterations, l.recall, l.seconds
                    );
                }
                println!("{} tokens -> {} and {}", s.tokens, s.centroids_path, s.labels_path);
            }
        }
        Command::Train { model, capture, cluster, dense_prefix, out, hidden, max_epochs, json } => {
            let settings = train::TrainSettings { hidden, max_epochs, ..Default::default() };
            let s = train::train(&model, &capture, &cluster, dense_prefix, &out, &settings, !json)?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "predictor: hidden {} x {} blocks, {:.2} M parameters ({:.2}% of the model); {} train / {} held-out tokens; best epoch {} of {}",
                    s.spec.hidden, s.spec.blocks, s.parameters as f64 / 1e6, s.param_share * 100.0, s.train_tokens, s.heldout_tokens, s.best_epoch, s.epochs_run
                );
                println!(
                    "held-out: loss {:.3} (label frequencies {:.3}), top-1 {:.3} (majority {:.3}), recall {:.3}",
                    s.heldout_loss, s.heldout_loss_majority, s.heldout_top1, s.heldout_top1_majority, s.heldout_recall
                );
                println!("{:>6} {:>7} {:>7} {:>12} {:>9}", "layer", "top-1", "recall", "label recall", "set size");
                for l in &s.layers {
                    println!(
                        "{:>6} {:>7.3} {:>7.3} {:>12.3} {:>9.0}",
                        l.layer, l.top1_accuracy, l.recall, l.label_recall, l.predicted_set_size
                    );
                }
                println!("-> {} ({:.1} s)", s.predictor_path, s.seconds);
            }
        }
        Command::Importance { model, corpus, seq_len, sequences, out, json } => {
            let s = importance::importance(&model, &corpus, seq_len, sequences, &out, !json)?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "importance over {} tokens ({} sequences) -> {} in {:.1} s",
                    s.tokens, s.sequences, s.path, s.seconds
                );
            }
        }
        Command::Layers { model, corpus, seq_len, first_layer, settings, out, json } => {
            let settings: layers::LayersSettings =
                toml::from_str(&settings).map_err(|e| anyhow::anyhow!("--settings: {e}"))?;
            let s = layers::train_layers(&model, &corpus, seq_len, first_layer, &out, &settings, !json)?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "per-layer predictors of rank {} for layers {}..{}: {:.2} MiB, {:.1}% of the 4-bit MLP; {} training and {} held-out tokens",
                    s.spec.rank, s.spec.first_layer, s.spec.n_layers, s.predictor_bytes as f64 / 1048576.0, s.mlp_share * 100.0, s.train_tokens, s.heldout_tokens
                );
                let row = |name: &str, r: &[f64]| {
                    println!("{name:>22} {}", r.iter().map(|v| format!("{v:>7.3}")).collect::<String>())
                };
                row("held-out recall at", &s.recall_shares);
                row("per-layer predictor", &s.recall);
                if let Some(p) = &s.recall_previous {
                    row("previous layer's input", p);
                }
                row("static set", &s.recall_static);
                println!(
                    "reload: max |score diff| {:.2e}, top-set agreement {:.4}; -> {} ({:.1} s)",
                    s.reload_max_abs_score_diff, s.reload_top_set_agreement, s.path, s.seconds
                );
            }
        }
        Command::Scorer { model, dense_prefix, out, json } => {
            let s = scorer::scorer(&model, dense_prefix, &out, !json)?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "4-bit gate/up of {} layers from {} ({:.1} MiB, mean relative row error {:.4}) -> {} in {:.1} s",
                    s.layers,
                    s.first_layer,
                    s.bytes as f64 / 1048576.0,
                    s.relative_error,
                    s.path,
                    s.seconds
                );
            }
        }
        Command::Sketch { model, dense_prefix, bits, corpus, seq_len, sequences, out, json } => {
            let calibration = sketch::Calibration {
                corpus: capture::expand_corpus(&corpus)?,
                seq_len,
                sequences: if corpus.is_empty() { 0 } else { sequences },
            };
            let s = sketch::sketch(&model, dense_prefix, bits, &calibration, &out, !json)?;
            if json {
                println!("{}", serde_json::to_string(&s)?);
            } else {
                println!(
                    "{}-bit gate/up sketch of {} layers from {} ({:.1} MiB, mean relative row error {:.4}) -> {} in {:.1} s",
                    s.bits, s.layers, s.first_layer, s.bytes as f64 / 1048576.0, s.relative_error, s.path, s.seconds
                );
            }
        }
        Command::Pack { model, dense_prefix, down, out, json } => {
            let t0 = std::time::Instant::now();
            let s = pack::pack(&model, dense_prefix, pack::down_type(&down)?, &out, !json)?;
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
