//! `runtime`: run, score and stream a model on the device.

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use runtime::generate::{generate, GenerateOptions};
use runtime::predictor::{NeuronRank, SetRule};
use runtime::sampler::Sampler;
use runtime::stream::{DensePrefix, SelectorChoice, StreamSettings};
use runtime::{PreparedMode, Sparsity};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(name = "runtime", version, about = "Run a model whose weights live on storage")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// How a prepared model (manifest.toml) runs. A model directory runs dense, in memory.
#[derive(Args, Clone, Default)]
struct ModeArgs {
    /// Memory budget of a streamed run (e.g. 155MiB, 1.5GiB): refused with the minimum when
    /// too small; what it leaves beyond each layer's set becomes extra row slots.
    #[arg(long)]
    mem_budget: Option<String>,
    /// auto (default): with --mem-budget, the best-quality strategy whose plan fits it: dense
    /// (the whole model), the
    /// scorer (with its default head, then with the 4-bit head when that keeps larger sets),
    /// else sketch, gate, layers (`runtime plan` lists each); a preparation with none of them
    /// runs the predictor. scorer: each sparse layer
    /// scores its neurons from its own input with resident 4-bit gate/up rows (the GGUF's own in
    /// a native preparation) and streams only the down rows it needs. predictor: the shared
    /// predictor picks every sparse layer's set after layer 0 and streams whole records.
    /// layers: each sparse layer's own small predictor picks its set from the layer's input,
    /// whole records are streamed and every held row counts (nothing of the MLP resident).
    /// gate: as layers, ranked by the resident gate rows (|silu(gate . x)| x ||down||).
    /// sketch: as layers, ranked by the resident gate and up rows at 2 bits per weight.
    /// dense: every layer dense, every row in memory (the reference; the GGUF's own MLP blocks
    /// in a native preparation); with --mem-budget, refused below the whole model's size, and
    /// `auto`'s first choice wherever it fits.
    #[arg(long, value_enum, default_value_t = Strategy::Auto)]
    strategy: Strategy,
    /// The same sets with every row in memory and batched prefill (quality figures).
    #[arg(long, conflicts_with = "mem_budget")]
    in_memory: bool,
    /// Layers below L run dense, L.. sparse (the prepared dense prefix <= L <= n_layers), or
    /// `fit`: as many dense layers as --mem-budget allows, then smaller sets. Default: fit with
    /// the scorer, the manifest's default_dense_from with the predictor.
    #[arg(long, alias = "dense-from")]
    dense_prefix: Option<DensePrefix>,
    /// Share of each sparse layer's neurons needed per token: of n_ff with the scorer (default
    /// 0.25), of K_max with the predictor (default 1). With `fit`, the largest share up to this
    /// that fits --mem-budget.
    #[arg(long, value_parser = parse_set_scale)]
    set_scale: Option<f64>,
    /// Research knobs, KEY=VALUE (repeatable; `-X help` lists them): set-rule, neuron-rank,
    /// resident-bonus, slot-share, head, single-token, pread, max-run-bytes, queue-depth,
    /// oracle-thresholds.
    #[arg(long = "experiment", short = 'X', value_name = "KEY=VALUE")]
    experiment: Vec<String>,
    /// Skip the sha256 check of a preparation's artifacts (done once per artifact set and
    /// cached beside the manifest); sizes and every record's CRC32C are still checked.
    #[arg(long)]
    no_verify: bool,
    /// `--strategy dense` through the streaming engine even without --mem-budget (runtime bench,
    /// plan and probe-storage measure an engine's run); else it runs in memory, batched.
    #[arg(skip)]
    engine: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
enum Strategy {
    #[default]
    Auto,
    Dense,
    Predictor,
    Scorer,
    Layers,
    Gate,
    Sketch,
}

const EXPERIMENT_HELP: &str = "research knobs (-X KEY=VALUE):
  set-rule=soft8|softN|top1|static|oracle  the predictor's set rule (oracle: --in-memory only;
                                           with --strategy layers, sketch or gate: oracle ranking in memory)
  neuron-rank=importance|membership        how the predictor's cut sets rank neurons
  resident-bonus=F                         scorer: a held row counts F (>= 1) times its score (default 2)
  slot-share=C                             --in-memory scorer, sketch, gate, layers: rows each layer holds, share of n_ff
  single-token                             --in-memory scorer, sketch, gate, layers: tokens one at a time, as streamed
  head=q8|compact|resident                 the output head (default: compact with sketch, gate and
                                           layers; q8 with the scorer on an f16 preparation)
  pread                                    read records with pread instead of io_uring
  max-run-bytes=N                          longest coalesced read (default 1048576)
  queue-depth=N                            io_uring queue depth (default 256)
  oracle-thresholds=FILE                   perplexity, model directory: oracle masks (thresholds.json)
                                           in layers >= --dense-prefix";

/// The research knobs of `--experiment`, parsed and checked.
#[derive(Default)]
struct Experiment {
    set_rule: Option<SetRule>,
    neuron_rank: Option<NeuronRank>,
    resident_bonus: Option<f32>,
    slot_share: Option<f64>,
    single_token: bool,
    head: Option<runtime::HeadChoice>,
    pread: bool,
    max_run_bytes: Option<usize>,
    queue_depth: Option<usize>,
    oracle_thresholds: Option<PathBuf>,
}

impl Experiment {
    fn parse(items: &[String]) -> Result<Self> {
        let mut e = Experiment::default();
        let mut seen = std::collections::HashSet::new();
        for item in items {
            let (key, value) = item.split_once('=').unwrap_or((item.as_str(), ""));
            if !seen.insert(key.to_string()) {
                anyhow::bail!("--experiment {key} given twice");
            }
            let bad = |what: &str| anyhow::anyhow!("--experiment {item}: expected {what}");
            let positive = |what: &str| -> Result<usize> {
                value.parse::<usize>().ok().filter(|&v| v > 0).ok_or_else(|| bad(what))
            };
            match key {
                "set-rule" => {
                    e.set_rule = Some(value.parse().map_err(|m: String| anyhow::anyhow!("--experiment {item}: {m}"))?)
                }
                "neuron-rank" => {
                    e.neuron_rank = Some(
                        <NeuronRank as clap::ValueEnum>::from_str(value, false)
                            .map_err(|_| bad("importance or membership"))?,
                    )
                }
                "resident-bonus" => {
                    e.resident_bonus = Some(
                        value
                            .parse::<f32>()
                            .ok()
                            .filter(|v| v.is_finite() && *v >= 1.0)
                            .ok_or_else(|| bad("a factor >= 1"))?,
                    )
                }
                "slot-share" => {
                    e.slot_share = Some(
                        value
                            .parse::<f64>()
                            .ok()
                            .filter(|v| *v > 0.0 && *v <= 1.0)
                            .ok_or_else(|| bad("a share of n_ff in (0, 1]"))?,
                    )
                }
                "single-token" if value.is_empty() => e.single_token = true,
                "head" => {
                    e.head = Some(match value {
                        "q8" => runtime::HeadChoice::Q8,
                        "compact" => runtime::HeadChoice::Compact,
                        "resident" | "f16" => runtime::HeadChoice::Resident,
                        _ => return Err(bad("q8, compact or resident")),
                    })
                }
                "pread" if value.is_empty() => e.pread = true,
                "max-run-bytes" => e.max_run_bytes = Some(positive("a positive byte count")?),
                "queue-depth" => e.queue_depth = Some(positive("a depth in 1..=4096")?),
                "oracle-thresholds" if !value.is_empty() => e.oracle_thresholds = Some(PathBuf::from(value)),
                _ => anyhow::bail!("--experiment {item}: unknown knob\n{EXPERIMENT_HELP}"),
            }
        }
        Ok(e)
    }
}

fn parse_share(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        _ => Err(format!("'{s}': expected a share in [0, 1]")),
    }
}

fn parse_set_scale(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("'{s}': expected a share in (0, 1], e.g. 0.25")),
    }
}

/// The set scale the scorer needs by default: 0.25 x n_ff per layer (Qwen2.5-Coder-1.5B at
/// 50% of its F16 size: HellaSwag 0.98x and 1.075x perplexity of dense; docs/RESULTS.md).
const SCORER_SET_SCALE: f64 = 0.25;

impl ModeArgs {
    /// The run a model path and these flags ask for, and notes for the user. `ctx`: the KV
    /// cache positions a streamed run's plan holds.
    fn mode(&self, model: &Path, ctx: usize) -> Result<(PreparedMode, Experiment, Vec<String>)> {
        let x = Experiment::parse(&self.experiment)?;
        let mut notes = Vec::new();
        if !model.is_file() {
            // a model directory runs dense in memory: a streaming flag would silently do nothing
            // (--dense-prefix also says where oracle masks start)
            let prefix = self.dense_prefix.is_some() && x.oracle_thresholds.is_none();
            let streaming = self.mem_budget.is_some()
                || self.in_memory
                || prefix
                || self.set_scale.is_some()
                || matches!(
                    self.strategy,
                    Strategy::Predictor | Strategy::Scorer | Strategy::Layers | Strategy::Gate | Strategy::Sketch
                );
            if streaming && model.is_dir() {
                anyhow::bail!("{}: a model directory runs dense, in memory; --mem-budget, --in-memory, --strategy, --dense-prefix and --set-scale need a prepared model's manifest.toml (make prepare)", model.display());
            }
            return Ok((PreparedMode::Dense { head: runtime::HeadChoice::Resident }, x, notes));
        }
        let manifest = formats::manifest::Manifest::load(model)?;
        let has = |role: &str| manifest.artifacts.iter().any(|a| a.role == role);
        // auto: with a budget, the best-quality strategy whose plan fits it (runtime::stream::auto,
        // decided below once the settings are known); without one, the scorer (every row held:
        // the dense MLP). The scorer, gate and layers share their defaults (head, sets of
        // 0.25 x n_ff, fit), so the provisional choice sizes the settings of whichever runs.
        let strategy = match self.strategy {
            Strategy::Auto if has("scorer") => Strategy::Scorer,
            Strategy::Auto if has(runtime::layer_predictor::ARTIFACT_ROLE) => Strategy::Layers,
            Strategy::Auto => {
                notes.push(format!("{} has no scorer or layer_predictors artifact: the auto strategy runs the shared predictor (rerun make prepare to add them)", model.display()));
                Strategy::Predictor
            }
            s => s,
        };
        if strategy == Strategy::Dense {
            if self.in_memory || self.dense_prefix.is_some() || self.set_scale.is_some() {
                anyhow::bail!("--strategy dense runs every layer dense with every row held: it takes no --in-memory, --dense-prefix or --set-scale");
            }
            if x.set_rule.is_some()
                || x.neuron_rank.is_some()
                || x.resident_bonus.is_some()
                || x.slot_share.is_some()
                || x.single_token
                || x.oracle_thresholds.is_some()
            {
                anyhow::bail!("--experiment set-rule, neuron-rank, resident-bonus, slot-share, single-token and oracle-thresholds choose sparse sets: --strategy dense has none");
            }
            if self.mem_budget.is_none() && !self.engine {
                return Ok((PreparedMode::Dense { head: x.head.unwrap_or_default() }, x, notes));
            }
        }
        let scorer = strategy == Strategy::Scorer;
        let layers = matches!(strategy, Strategy::Layers | Strategy::Gate | Strategy::Sketch);
        // the whole-record strategies take set-rule=oracle only (their in-memory ceiling)
        let layer_oracle = layers && x.set_rule == Some(SetRule::Oracle);
        if (scorer || layers) && ((x.set_rule.is_some() && !layer_oracle) || x.neuron_rank.is_some()) {
            anyhow::bail!("--experiment set-rule and neuron-rank are the predictor's: use them with --strategy predictor (--strategy layers, sketch and gate take set-rule=oracle, in memory)");
        }
        if !(scorer || layers) && (x.slot_share.is_some() || x.single_token) {
            anyhow::bail!("--experiment slot-share and single-token simulate a streamed run's slots: use them with --strategy scorer, sketch, gate or layers");
        }
        if !scorer && x.resident_bonus.is_some() {
            anyhow::bail!("--experiment resident-bonus is the scorer's: use it with --strategy scorer");
        }
        let selector = if scorer {
            SelectorChoice::Scorer {
                resident_bonus: x.resident_bonus.unwrap_or(runtime::scorer::SCORER_RESIDENT_BONUS),
            }
        } else if strategy == Strategy::Gate {
            SelectorChoice::Gate
        } else if strategy == Strategy::Sketch {
            SelectorChoice::Sketch
        } else if strategy == Strategy::Dense {
            SelectorChoice::Dense
        } else if layers {
            SelectorChoice::Layers
        } else {
            SelectorChoice::Predictor {
                rule: x.set_rule.unwrap_or_default(),
                neuron_rank: x.neuron_rank.unwrap_or_default(),
            }
        };
        let set_scale = self.set_scale.unwrap_or(if scorer || layers { SCORER_SET_SCALE } else { 1.0 });
        // each strategy's default head (runtime::stream::auto::default_head), unless -X head= says
        let head = match x.head {
            Some(h) => h,
            None => runtime::stream::auto::default_head(model, &manifest, selector)?,
        };
        if self.in_memory {
            if x.pread || x.max_run_bytes.is_some() || x.queue_depth.is_some() {
                anyhow::bail!("--experiment pread, max-run-bytes and queue-depth tune a streamed run's reads: not with --in-memory");
            }
            // the scorer's streamed default (fit) puts every layer after the prepared prefix sparse
            let dense_prefix = self.dense_prefix.unwrap_or(if scorer || layers {
                DensePrefix::Layer(manifest.sparsity.dense_prefix)
            } else {
                DensePrefix::Default
            });
            let s = runtime::InMemorySettings {
                selector,
                dense_prefix,
                set_scale,
                slot_share: x.slot_share,
                head,
                single_token: x.single_token,
                oracle_ranking: layer_oracle,
            };
            return Ok((PreparedMode::InMemory(s), x, notes));
        }
        if x.set_rule == Some(SetRule::Oracle) {
            anyhow::bail!("--experiment set-rule=oracle ranks neurons by their true activations, which needs every row: use it with --in-memory");
        }
        if x.slot_share.is_some() || x.single_token {
            anyhow::bail!("--experiment slot-share and single-token simulate a streamed run's slots with --in-memory; a streamed run's slots come from --mem-budget");
        }
        let mem_budget_bytes = match &self.mem_budget {
            Some(b) => Some(runtime::stream::parse_bytes(b).map_err(|e| anyhow::anyhow!("--mem-budget {e}"))?),
            None => None,
        };
        let mut io = runtime::stream::IoSettings { force_pread: x.pread, ..Default::default() };
        if let Some(m) = x.max_run_bytes {
            io.max_run_bytes = m;
        }
        if let Some(q) = x.queue_depth {
            io.queue_depth = q;
        }
        let dense_prefix =
            self.dense_prefix.unwrap_or(if scorer || layers { DensePrefix::Fit } else { DensePrefix::Default });
        let mut s =
            StreamSettings { mem_budget_bytes, ctx, dense_prefix, set_scale, selector, head, io, record_sets: false };
        if self.strategy == Strategy::Auto && mem_budget_bytes.is_some() && (scorer || layers) {
            if let Some((choice, head, note)) = runtime::stream::auto::choose(model, &manifest, &s, x.head)? {
                s.selector = match choice {
                    SelectorChoice::Scorer { .. } => selector,
                    _ if x.resident_bonus.is_some() => {
                        anyhow::bail!("--experiment resident-bonus is the scorer's, and {}", note.unwrap_or_default())
                    }
                    c => c,
                };
                s.head = head;
                notes.extend(note);
            }
        }
        Ok((PreparedMode::Stream(s), x, notes))
    }
}

/// Opens `model` as the flags ask and prints the notes of the run on stderr.
fn open(model: &Path, mode: &ModeArgs, ctx: usize) -> Result<(runtime::Opened, Experiment)> {
    let (m, x, notes) = mode.mode(model, ctx)?;
    let opened = runtime::open_with(model, &m, !mode.no_verify)?;
    for n in notes.iter().chain(&opened.notes) {
        eprintln!("note: {n}");
    }
    Ok((opened, x))
}

#[derive(Subcommand)]
enum Command {
    /// Generate text after a prompt; prints prefill and decode tok/s.
    Run {
        /// Model directory, or a prepared model's manifest.toml (streamed by default).
        model: PathBuf,
        /// The prompt, raw text (tokenized with the model's BOS where it adds one).
        #[arg(long, short = 'p')]
        prompt: String,
        /// Tokens to generate.
        #[arg(short = 'n', long = "n-predict", default_value_t = 128)]
        n: usize,
        /// Sampling temperature; 0 = greedy.
        #[arg(long, default_value_t = 0.0)]
        temp: f32,
        #[arg(long, default_value_t = 0.95)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Worker threads (default: all cores).
        #[arg(long)]
        threads: Option<usize>,
        /// KV cache positions (default: the prompt's tokens + n; a streamed run's plan holds them).
        #[arg(long)]
        ctx: Option<usize>,
        /// Never choose an end-of-sequence token (as llama.cpp's --ignore-eos): always generate n.
        #[arg(long)]
        ignore_eos: bool,
        /// The prompt is one user message: render it through the model's chat template.
        #[arg(long)]
        chat: bool,
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
        /// KV cache positions (a streamed run's plan holds them); an item longer than this is
        /// refused. HellaSwag's longest items take about 200.
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        #[command(flatten)]
        mode: ModeArgs,
        #[arg(long)]
        threads: Option<usize>,
        #[arg(long)]
        json: bool,
    },
    /// Chat in the terminal through the model's chat template: one line per message, the KV
    /// cache of earlier turns kept; /reset starts over, Ctrl-D (or /quit) ends.
    Chat {
        /// Model directory, or a prepared model's manifest.toml (streamed by default).
        model: PathBuf,
        /// A system message that opens the conversation (default: the template's own, if any).
        #[arg(long)]
        system: Option<String>,
        /// Most tokens per reply.
        #[arg(short = 'n', long = "n-predict", default_value_t = 512)]
        n: usize,
        /// Sampling temperature; 0 = greedy.
        #[arg(long, default_value_t = 0.7)]
        temp: f32,
        #[arg(long, default_value_t = 0.95)]
        top_p: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// KV cache positions: the whole conversation must fit (a streamed run's plan holds them).
        #[arg(long, default_value_t = 1024)]
        ctx: usize,
        #[command(flatten)]
        mode: ModeArgs,
        #[arg(long)]
        threads: Option<usize>,
    },
    /// An OpenAI-compatible HTTP server: POST /v1/chat/completions and /v1/completions (stream
    /// or not), GET /v1/models, /health and /metrics. One engine answers requests in order.
    Serve {
        /// Model directory, or a prepared model's manifest.toml (streamed by default).
        model: PathBuf,
        /// Address to listen on: loopback unless another is asked for (e.g. 0.0.0.0).
        #[arg(long, default_value = "127.0.0.1")]
        host: std::net::IpAddr,
        /// Port (0: any free one; the address is printed).
        #[arg(long, default_value_t = 8080)]
        port: u16,
        /// Require `Authorization: Bearer <KEY>` on every request.
        #[arg(long)]
        api_key: Option<String>,
        /// Requests that may wait for the engine; past that, 503 with Retry-After.
        #[arg(long, default_value_t = 16)]
        queue: usize,
        /// KV cache positions: a request's prompt plus max_tokens must fit (a streamed run's plan
        /// holds them).
        #[arg(long, default_value_t = 1024)]
        ctx: usize,
        #[command(flatten)]
        mode: ModeArgs,
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Measure this machine into a device file for the planner: random O_DIRECT reads (io_uring)
    /// at each block size and queue depth, memory bandwidth, and the dense decode rate of a model.
    ProbeStorage {
        /// File to read (on the disk the artifacts live on; default: a 1 GiB scratch file made
        /// here, removed after).
        #[arg(long)]
        file: Option<PathBuf>,
        /// A model directory whose dense decode gives decode_bytes_per_s (default: the memory
        /// bandwidth x 0.5, marked as an estimate in `source`).
        #[arg(long)]
        model: Option<PathBuf>,
        /// Prepared models whose streamed compute to measure (every row held, 24 tokens): the
        /// planner then uses it for them (repeatable).
        #[arg(long)]
        manifest: Vec<PathBuf>,
        /// Block sizes in bytes (multiples of 512), e.g. a record size and 128 KiB.
        #[arg(long, value_delimiter = ',', default_value = "2048,2560,4096,4608,131072")]
        block_bytes: Vec<u64>,
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64,256")]
        queue_depths: Vec<u32>,
        /// Seconds per (size, depth) point.
        #[arg(long, default_value_t = 0.3)]
        seconds: f64,
        /// Where to write the device file.
        #[arg(long, default_value = "device.toml")]
        out: PathBuf,
        #[arg(long)]
        name: Option<String>,
        #[arg(long)]
        threads: Option<usize>,
    },
    /// The operating point --mem-budget gets and the decode rate the windowed roofline predicts
    /// for it on a device (Budgeting Bytes), with its parts; llama.cpp's on each --gguf too.
    Plan {
        /// A prepared model's manifest.toml (or --shape).
        manifest: Option<PathBuf>,
        /// A public model shape instead of a preparation (mistral-7b, llama-3-8b), sized as a
        /// native preparation of its Q4_K_M GGUF would be; without --mem-budget, the frontier
        /// over 15-100% of its F16 size against llama.cpp's GGUFs.
        #[arg(long, conflicts_with = "manifest")]
        shape: Option<String>,
        /// A device file (runtime probe-storage writes one; devices/ ships some). Default:
        /// devices/this-machine.toml.
        #[arg(long)]
        device: Option<PathBuf>,
        /// The share of needed rows already held, as `runtime bench` measures it (default: every
        /// row held when the budget holds them all, else held / n_ff, a floor).
        #[arg(long, value_parser = parse_share)]
        reuse: Option<f64>,
        /// GGUF files to predict llama.cpp's rate on at the same budget.
        #[arg(long)]
        gguf: Vec<PathBuf>,
        /// KV cache positions (counted in the budget).
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        #[command(flatten)]
        mode: ModeArgs,
        #[arg(long)]
        json: bool,
    },
    /// Decode speed of a streamed run and where the time and bytes go.
    Bench {
        /// A prepared model's manifest.toml.
        manifest: PathBuf,
        /// Prompt text file (default: a fixed sentence).
        #[arg(long)]
        prompt_file: Option<PathBuf>,
        /// Tokens to generate.
        #[arg(short = 'n', default_value_t = 256)]
        n: usize,
        /// KV cache positions (counted in the budget); prompt + n must fit.
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        #[command(flatten)]
        mode: ModeArgs,
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
            "set_rule": s.rule.to_string(),
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
            "dense_prefix": s.dense_prefix,
            "keep_share": s.keep as f64 / n_ff as f64,
            "slot_share": s.slots as f64 / n_ff as f64,
            "resident_bonus": s.resident_bonus,
            "reuse_ratio": s.reuse_ratio(),
            "sparse_layer_density": s.density(),
        }),
        Some(Sparsity::Layers(s)) => serde_json::json!({
            "mode": "in-memory",
            "set_rule": if s.oracle { "oracle".to_string() } else { s.ranker.name().to_string() },
            "dense_prefix": s.dense_prefix,
            "keep_share": s.keep as f64 / n_ff as f64,
            "reuse_ratio": s.reuse_ratio(),
            "recall": s.recall(),
            "sparse_layer_density": s.density(),
        }),
        Some(Sparsity::Stream(e)) => {
            let st = &e.stats;
            serde_json::json!({
                "mode": "stream",
                "set_rule": e.rule(),
                "dense_prefix": e.dense_prefix,
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
            "scored sparsity: {:.3} of sparse-layer neurons kept (layers >= {}, 4-bit gate/up scorer, {:.2} x n_ff needed, {:.2} held), reuse {:.3}",
            p.density(), p.dense_prefix, p.keep as f64 / n_ff as f64, p.slots as f64 / n_ff as f64, p.reuse_ratio()
        ),
        Some(Sparsity::Layers(p)) => println!(
            "{} sparsity: {:.3} of sparse-layer neurons summed (layers >= {}, sets of {:.2} x n_ff), recall of the oracle's set {:.3}, reuse {:.3}",
            if p.oracle { "oracle" } else { p.ranker.name() }, p.density(), p.dense_prefix, p.keep as f64 / n_ff as f64, p.recall(), p.reuse_ratio()
        ),
        Some(Sparsity::Stream(e)) => {
            e.refresh_io_stats();
            let st = &e.stats;
            println!(
                "streamed: {} tokens, {}, reuse {:.3}, {:.1} KiB read per token, {:.0} slots per layer (budget {})",
                st.tokens,
                operating_point(&e.rule(), e.dense_prefix, e.plan.set_scale),
                st.reuse_ratio(),
                st.bytes_read as f64 / 1024.0 / st.tokens.max(1) as f64,
                e.plan.capacity.iter().sum::<usize>() as f64 / e.plan.capacity.len().max(1) as f64,
                e.plan.budget_bytes.map(|b| format!("{:.1} MiB", b as f64 / 1048576.0)).unwrap_or_else(|| "unlimited".into())
            );
        }
        None => {}
    }
}

/// Threads for the pool: 1..=4 x the cores (default: all cores).
fn pool_threads(threads: Option<usize>) -> std::result::Result<usize, String> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    match threads {
        None => Ok(0),
        Some(0) => Err("--threads 0: expected at least 1".into()),
        Some(t) if t > 4 * cores => {
            Err(format!("--threads {t}: this machine has {cores} cores (at most {} threads)", 4 * cores))
        }
        Some(t) => Ok(t),
    }
}

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve { .. }) {
        // a closed stdout (`runtime plan ... | head`) ends the process quietly, as other Unix
        // tools do; the server keeps Rust's default (ignored), so a client that goes away is an
        // EPIPE on its socket, not the end of the server
        // SAFETY: resetting one signal's disposition before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let no_experiment = Vec::new();
    let experiment = match &cli.command {
        Command::Run { mode, .. }
        | Command::Perplexity { mode, .. }
        | Command::Eval { mode, .. }
        | Command::Bench { mode, .. }
        | Command::Chat { mode, .. }
        | Command::Serve { mode, .. }
        | Command::Plan { mode, .. } => &mode.experiment,
        Command::ProbeStorage { .. } => &no_experiment,
    };
    if experiment.iter().any(|x| x == "help") {
        println!("{EXPERIMENT_HELP}");
        return;
    }
    let threads = match &cli.command {
        Command::Run { threads, .. }
        | Command::Perplexity { threads, .. }
        | Command::Eval { threads, .. }
        | Command::Bench { threads, .. }
        | Command::Chat { threads, .. }
        | Command::Serve { threads, .. }
        | Command::ProbeStorage { threads, .. } => *threads,
        Command::Plan { .. } => None,
    };
    let n = match pool_threads(threads) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("runtime: error: {e}");
            std::process::exit(1);
        }
    };
    // The whole command runs inside the pool, so every parallel op forks from a worker thread
    // (cheap) instead of being injected from outside and waking a sleeping worker (~10s of us,
    // hundreds of times per decoded token).
    let pool = match rayon::ThreadPoolBuilder::new().num_threads(n).build() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("runtime: error: cannot start {n} threads: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = pool.install(|| run(cli)) {
        eprintln!("runtime: error: {}", formats::error::display_chain(e.as_ref()));
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Run { model, prompt, n, temp, top_p, seed, threads: _, ctx, ignore_eos, chat, mode, json } => {
            check_sampling(temp, top_p)?;
            if n == 0 {
                anyhow::bail!("-n 0: nothing to generate");
            }
            Experiment::parse(&mode.experiment)?;
            // the KV cache holds the prompt and the new tokens unless --ctx says otherwise
            let prompt = match chat {
                false => prompt,
                true => {
                    let t =
                        runtime::chat_template_at(&model)?.ok_or_else(|| anyhow::anyhow!("{}", no_template(&model)))?;
                    t.render(&[runtime::chat::ChatMessage::new("user", &prompt)], true)?
                }
            };
            let ctx = match ctx {
                Some(c) => c,
                None => runtime::prompt_tokens(&model, &prompt, !chat)? + n,
            };
            let (mut opened, _) = open(&model, &mode, ctx)?;
            let opts = GenerateOptions { max_new_tokens: n, ctx, stop_at_eos: !ignore_eos, add_special: !chat };
            let mut sampler = Sampler::new(temp, top_p, seed);
            let mut stdout = std::io::stdout();
            let (mut runner, tokenizer) = opened.runner_and_tokenizer();
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
        Command::Perplexity { model, text, ctx, chunks, threads: _, mode, json } => {
            let (mut opened, x) = open(&model, &mode, ctx)?;
            let n_ff = opened.model.config.intermediate_size;
            let mut oracle = match &x.oracle_thresholds {
                Some(p) => {
                    if opened.sparsity.is_some() {
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
                v["sparsity"] = sparsity_json(opened.sparsity.as_ref(), n_ff);
                println!("{v}");
            } else {
                eprintln!();
                if let Some(o) = &oracle {
                    println!(
                        "oracle sparsity: {:.3} of sparse-layer neurons kept (layers >= {})",
                        o.density(),
                        o.dense_prefix
                    );
                }
                print_sparsity(opened.sparsity.as_mut(), n_ff);
                println!(
                    "perplexity {:.4} over {} chunks of {} ({} tokens scored, {} in the text), {:.1} tok/s",
                    r.perplexity, r.chunks, r.ctx, r.tokens_scored, r.tokens, r.tokens_per_s
                );
            }
        }
        Command::Eval { model, task, data, limit, ctx, mode, threads: _, json } => {
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
                v["sparsity"] = sparsity_json(opened.sparsity.as_ref(), n_ff);
                println!("{v}");
            } else {
                eprintln!();
                print_sparsity(opened.sparsity.as_mut(), n_ff);
                println!(
                    "{}: acc_norm {:.4} (acc {:.4}) over {} items, {:.1} s",
                    r.task, r.accuracy, r.accuracy_unnormalized, r.items, r.seconds
                );
            }
        }
        Command::Chat { model, system, n, temp, top_p, seed, ctx, mode, threads: _ } => {
            check_sampling(temp, top_p)?;
            if n == 0 {
                anyhow::bail!("-n 0: nothing to generate");
            }
            let (mut opened, _) = open(&model, &mode, ctx)?;
            let template =
                runtime::chat_template(&model, &opened)?.ok_or_else(|| anyhow::anyhow!("{}", no_template(&model)))?;
            chat(&mut opened, &template, system, n, ctx, Sampler::new(temp, top_p, seed))?;
        }
        Command::Serve { model, host, port, api_key, queue, ctx, mode, threads: _ } => {
            if queue == 0 {
                anyhow::bail!("--queue 0: at least one request must be able to wait");
            }
            if api_key.as_deref() == Some("") {
                anyhow::bail!("--api-key is empty");
            }
            let (opened, _) = open(&model, &mode, ctx)?;
            let template = runtime::chat_template(&model, &opened)?;
            if template.is_none() {
                eprintln!("note: {}: /v1/chat/completions will answer 400", no_template(&model));
            }
            if !host.is_loopback() && api_key.is_none() {
                eprintln!("note: listening on {host}, not loopback: anyone who can reach this machine can use the model (--api-key KEY to require a key)");
            }
            let model_name = match &opened.manifest {
                Some(m) => m.model_name.clone(),
                None => model.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_else(|| "model".into()),
            };
            let config = runtime::serve::ServeConfig {
                addr: std::net::SocketAddr::new(host, port),
                queue_capacity: queue,
                api_key,
                model_name,
            };
            runtime::serve::serve(opened, template, no_template(&model), ctx, config, |addr| {
                eprintln!(
                    "listening on http://{addr} (OpenAI API at http://{addr}/v1; context {ctx} tokens, queue {queue})"
                );
            })?;
        }
        Command::Plan { manifest, shape, device, reuse, gguf, ctx, mode, json } => match (manifest, shape) {
            (Some(m), None) => plan(&m, device, reuse, &gguf, ctx, &mode, json)?,
            (None, Some(s)) => plan_shape(&s, device, reuse, ctx, &mode, json)?,
            _ => {
                anyhow::bail!("runtime plan needs a manifest.toml or --shape {}", runtime::plan::KNOWN_SHAPES.join("|"))
            }
        },
        Command::ProbeStorage { file, model, manifest, block_bytes, queue_depths, seconds, out, name, threads: _ } => {
            probe_storage(file, model, &manifest, &block_bytes, &queue_depths, seconds, &out, name)?;
        }
        Command::Bench { manifest, prompt_file, n, ctx, mode, threads: _, json } => {
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
            let prompt_tokens = opened.tokenizer.encode(prompt.trim_end(), true)?.len();
            if prompt_tokens + n > ctx {
                return Err(
                    runtime::RuntimeError::ContextOverflow { needed: prompt_tokens + n, ctx, prompt_tokens }.into()
                );
            }
            let runtime::Opened { model, tokenizer, sparsity, .. } = &mut opened;
            let Some(Sparsity::Stream(engine)) = sparsity.as_mut() else { unreachable!("a streamed mode") };
            let r = runtime::bench::bench(model, tokenizer, engine, prompt.trim_end(), n)?;
            if json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "decode {:.2} tok/s ({} tokens after a {}-token prompt; prefill {:.1} tok/s)",
                    r.decode_tok_per_s, r.generated_tokens, r.prompt_tokens, r.prefill_tok_per_s
                );
                println!(
                    "per token: {:.1} KiB read in {:.1} requests, {:.0} of {:.0} rows read (reuse {:.3}); I/O wait {:.2} ms, compute {:.2} ms, predictor {:.2} ms",
                    r.bytes_read_per_token / 1024.0, r.requests_per_token, r.rows_read_per_token, r.rows_needed_per_token, r.reuse_ratio,
                    r.io_wait_ms_per_token, r.compute_ms_per_token, r.predictor_ms_per_token
                );
                println!(
                    "read bandwidth {:.1} MiB/s ({}); peak RSS {:.1} MiB; plan {:.1} MiB (minimum {:.1} MiB); {}",
                    r.read_bandwidth_bytes_per_s / 1048576.0,
                    r.io_path,
                    r.peak_rss_bytes as f64 / 1048576.0,
                    r.planned_bytes as f64 / 1048576.0,
                    r.minimum_budget_bytes as f64 / 1048576.0,
                    operating_point(&r.set_rule, r.dense_prefix, r.set_scale)
                );
            }
        }
    }
    Ok(())
}

/// A streamed run's operating point in words: "every layer dense", or "layers 1.. sparse,
/// scorer sets of 0.25 x n_ff".
fn operating_point(rule: &str, dense_prefix: usize, set_scale: f64) -> String {
    match rule {
        "dense" => "every layer dense".into(),
        _ => format!(
            "layers {dense_prefix}.. sparse, {rule} sets of {set_scale:.2} x {}",
            if matches!(rule, "scorer" | "sketch" | "gate" | "layers") { "n_ff" } else { "K_max" }
        ),
    }
}

fn check_sampling(temp: f32, top_p: f32) -> Result<()> {
    if !(temp.is_finite() && temp >= 0.0) {
        anyhow::bail!("--temp {temp}: expected a finite temperature >= 0 (0 = greedy)");
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        anyhow::bail!("--top-p {top_p}: expected a probability in (0, 1]");
    }
    Ok(())
}

fn no_template(model: &Path) -> String {
    format!("{}: the model has no chat template (chat_template.jinja, kept from the GGUF's tokenizer.chat_template by prep import; rerun make setup or make prepare)", model.display())
}

/// The terminal chat: one line per user message; the session keeps the conversation's KV cache,
/// so each turn computes only its new tokens.
fn chat(
    opened: &mut runtime::Opened,
    template: &runtime::chat::ChatTemplate,
    system: Option<String>,
    n: usize,
    ctx: usize,
    mut sampler: Sampler,
) -> Result<()> {
    use runtime::chat::ChatMessage;
    use runtime::generate::{Continuation, Session};
    use std::io::{BufRead, IsTerminal};
    let interactive = std::io::stdin().is_terminal();
    let opening: Vec<ChatMessage> = system.iter().map(|s| ChatMessage::new("system", s)).collect();
    let mut messages = opening.clone();
    let mut session = Session::new(&opened.model, ctx)?;
    let end_ids = runtime::chat::end_of_turn_ids(&opened.model.config, &opened.tokenizer);
    if interactive {
        eprintln!("chat: one line per message; /reset starts over, Ctrl-D or /quit ends");
    }
    let mut lines = std::io::stdin().lock().lines();
    loop {
        if interactive {
            eprint!("> ");
        }
        let Some(line) = lines.next() else { break };
        let line = line?;
        let text = line.trim();
        match text {
            "" => continue,
            "/quit" | "/exit" => break,
            "/reset" => {
                messages = opening.clone();
                session.reset();
                eprintln!("(conversation reset)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", text));
        let prompt = template.render(&messages, true)?;
        let (mut runner, tok) = opened.runner_and_tokenizer();
        let ids = tok.encode(&prompt, false)?;
        if ids.len() >= ctx {
            messages.pop();
            eprintln!(
                "the conversation is {} tokens and the context holds {ctx} (--ctx): /reset to start over",
                ids.len()
            );
            continue;
        }
        let c = Continuation {
            prompt_ids: &ids,
            max_new_tokens: n.min(ctx - ids.len()),
            end_ids: &end_ids,
            mask: &[],
            stop: &[],
        };
        let mut stdout = std::io::stdout();
        let r = session.generate(&mut runner, tok, &c, &mut sampler, |piece| {
            let _ = stdout.write_all(piece.as_bytes());
            let _ = stdout.flush();
            std::ops::ControlFlow::Continue(())
        })?;
        println!();
        eprintln!(
            "[prompt {} tokens, {} from earlier turns; {} generated at {:.1} tok/s{}]",
            r.prompt_tokens,
            r.reused_prompt_tokens,
            r.generated_tokens,
            r.decode_tok_per_s,
            if r.finish_reason == runtime::generate::FinishReason::Length { ", cut at -n" } else { "" }
        );
        messages.push(ChatMessage::new("assistant", &r.text));
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn probe_storage(
    file: Option<PathBuf>,
    model: Option<PathBuf>,
    manifests: &[PathBuf],
    block_bytes: &[u64],
    depths: &[u32],
    seconds: f64,
    out: &Path,
    name: Option<String>,
) -> Result<()> {
    use formats::device::{DeviceFile, ReadRate};
    if !(seconds > 0.0 && seconds.is_finite()) {
        anyhow::bail!("--seconds {seconds}: expected a positive duration");
    }
    if let Some(&q) = depths.iter().find(|&&q| q == 0 || q > 4096) {
        anyhow::bail!("--queue-depths: {q} is outside 1..=4096");
    }
    // a scratch file of random bytes, unless one is given
    let scratch = file.is_none();
    let path = file.unwrap_or_else(|| PathBuf::from("probe-storage.bin"));
    if scratch {
        eprintln!("writing a 1 GiB scratch file {} ...", path.display());
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
        );
        let mut x = 0x2545f4914f6cdd1du64;
        let mut chunk = vec![0u8; 1 << 20];
        for _ in 0..1024 {
            for w in chunk.chunks_exact_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                w.copy_from_slice(&x.to_le_bytes());
            }
            f.write_all(&chunk)?;
        }
        f.flush()?;
        f.get_ref().sync_all()?;
    }
    let mut reads = Vec::new();
    let result = (|| -> Result<()> {
        let warmed = runtime::probe::warm(&path, 4 << 30)?;
        eprintln!(
            "read {:.0} MiB of {} once first (a virtual disk serves what its host has cached faster)",
            warmed as f64 / 1048576.0,
            path.display()
        );
        for &b in block_bytes {
            for &q in depths {
                let iops = runtime::probe::read_iops(&path, b, q, seconds, b ^ q as u64)?;
                eprintln!(
                    "reads of {b} B at queue depth {q}: {iops:.0} IOPS, {:.1} MiB/s",
                    iops * b as f64 / 1048576.0
                );
                reads.push(ReadRate { block_bytes: b, queue_depth: q, iops: iops.round() });
            }
        }
        Ok(())
    })();
    if scratch {
        let _ = std::fs::remove_file(&path);
    }
    result?;
    let bw = runtime::probe::memory_bandwidth_bytes_per_s(512 << 20);
    eprintln!("memory read bandwidth: {:.1} GB/s", bw / 1e9);
    let (decode, how) = match &model {
        Some(m) => {
            let (bytes_per_s, tok_per_s) = runtime::probe::decode_bytes_per_s(m, 16)?;
            eprintln!(
                "dense decode of {}: {tok_per_s:.1} tok/s, {:.1} GB/s of weights",
                m.display(),
                bytes_per_s / 1e9
            );
            (bytes_per_s, format!("decode_bytes_per_s from the dense decode of {} ({tok_per_s:.1} tok/s)", m.display()))
        }
        None => (bw * 0.5, "decode_bytes_per_s estimated as half the memory bandwidth (no --model given)".to_string()),
    };
    let mut models = Vec::new();
    for m in manifests {
        let mf = formats::manifest::Manifest::load(m)?;
        let has = |role: &str| mf.artifacts.iter().any(|a| a.role == role);
        // each strategy --strategy auto may run: its compute differs (the whole-record ones
        // compute every held row's h from its record)
        // (dense first: every preparation runs it, auto's choice where the whole model fits)
        let strategies: Vec<Strategy> = [
            (Strategy::Dense, "records"),
            (Strategy::Scorer, "scorer"),
            (Strategy::Sketch, runtime::layer_predictor::SKETCH_ROLE),
            (Strategy::Gate, "scorer"),
            (Strategy::Layers, runtime::layer_predictor::ARTIFACT_ROLE),
        ]
        .into_iter()
        .filter(|(_, role)| has(role))
        .map(|(s, _)| s)
        .collect();
        for strategy in if strategies.len() == 1 { vec![Strategy::Dense, Strategy::Predictor] } else { strategies } {
            // every row held (compute alone), then at 5% over the minimum (what each row read
            // costs the compute thread: landing it in its slot, beyond the read itself)
            let bench_at = |budget: Option<u64>| -> Result<(runtime::bench::BenchReport, u64, f64, String)> {
                let mode = ModeArgs {
                    mem_budget: budget.map(|b| b.to_string()),
                    strategy,
                    engine: true,
                    ..Default::default()
                };
                let (pm, _, _) = mode.mode(m, 512)?;
                let mut opened = runtime::open_with(m, &pm, false)?;
                let runtime::Opened { model, tokenizer, sparsity, .. } = &mut opened;
                let Some(Sparsity::Stream(engine)) = sparsity.as_mut() else {
                    unreachable!("a manifest streams by default")
                };
                let r = runtime::bench::bench(
                    model,
                    tokenizer,
                    engine,
                    "The history of the printing press begins in the fifteenth century, when",
                    24,
                )?;
                Ok((
                    r,
                    engine.plan.minimum_bytes,
                    runtime::plan::memory_bytes_per_token(&engine.plan, &engine.rule()) as f64,
                    engine.rule().to_string(),
                ))
            };
            let (all, minimum, memory_bytes, selector) = bench_at(None)?;
            let compute_s = (1.0 / all.decode_tok_per_s - all.io_wait_ms_per_token / 1e3).max(1e-6);
            // (a dense run reads no row)
            let (tight, ..) = if strategy == Strategy::Dense {
                (all.clone(), 0, 0.0, String::new())
            } else {
                bench_at(Some(minimum + minimum / 20))?
            };
            let tight_compute_s = 1.0 / tight.decode_tok_per_s - tight.io_wait_ms_per_token / 1e3;
            let landed_row_s = ((tight_compute_s - compute_s) / tight.rows_read_per_token.max(1.0)).max(0.0);
            eprintln!(
                "{} ({selector}): every row held {:.1} tok/s, compute {:.1} ms per token; at {:.0} MiB {:.2} tok/s, {:.0} rows read per token, {:.2} us of compute each",
                m.display(),
                all.decode_tok_per_s,
                compute_s * 1e3,
                (minimum + minimum / 20) as f64 / 1048576.0,
                tight.decode_tok_per_s,
                tight.rows_read_per_token,
                landed_row_s * 1e6
            );
            models.push(formats::device::ModelCompute {
                model: mf.model_name.clone(),
                selector,
                compute_s_per_token: compute_s,
                memory_bytes_per_token: memory_bytes,
                landed_row_s,
            });
        }
    }
    let d = DeviceFile {
        name: name.unwrap_or_else(|| "this machine".into()),
        source: format!(
            "measured by runtime probe-storage on {} with {} pool threads; reads from {}; {how}",
            std::env::consts::ARCH,
            rayon::current_num_threads(),
            path.display()
        ),
        threads: rayon::current_num_threads(),
        memory_bandwidth_bytes_per_s: bw.round(),
        decode_bytes_per_s: decode.round(),
        reads,
        models,
        ..Default::default() // llama.cpp's calibrations: bench-frontier's, not the probe's
    };
    d.save(out)?;
    println!("wrote {}", out.display());
    Ok(())
}

fn load_device(device: Option<PathBuf>) -> Result<(PathBuf, formats::device::DeviceFile)> {
    let device_path = device.unwrap_or_else(|| PathBuf::from("devices/this-machine.toml"));
    if !device_path.is_file() {
        anyhow::bail!(
            "{}: no device file (runtime probe-storage measures this machine into one; devices/ ships some)",
            device_path.display()
        );
    }
    let dev = formats::device::DeviceFile::load(&device_path)?;
    Ok((device_path, dev))
}

/// A known shape on a device: one budget, or the frontier over fractions of its F16 size.
fn plan_shape(
    name: &str,
    device: Option<PathBuf>,
    reuse: Option<f64>,
    ctx: usize,
    mode: &ModeArgs,
    json: bool,
) -> Result<()> {
    let k = runtime::plan::known_shape(name)
        .ok_or_else(|| anyhow::anyhow!("--shape {name}: expected one of {}", runtime::plan::KNOWN_SHAPES.join(", ")))?;
    if mode.in_memory
        || mode.dense_prefix.is_some()
        || mode.set_scale.is_some()
        || !matches!(mode.strategy, Strategy::Auto | Strategy::Scorer)
        || !mode.experiment.is_empty()
    {
        anyhow::bail!("--shape plans what auto runs (dense where the model fits, else the scorer at --dense-prefix fit with sets of 0.25 x n_ff): it takes only --mem-budget");
    }
    let (device_path, dev) = load_device(device)?;
    let f16 = k.ggufs.iter().find(|g| g.0 == "F16").map_or(0, |g| g.1);
    let budgets: Vec<Option<u64>> = match &mode.mem_budget {
        Some(b) => vec![Some(runtime::stream::parse_bytes(b).map_err(|e| anyhow::anyhow!("--mem-budget {e}"))?)],
        None => [0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0].iter().map(|f| Some((f * f16 as f64) as u64)).collect(),
    };
    let kv = runtime::stream::budget::kv_cache_bytes(&k.config, ctx);
    let mut rows = Vec::new();
    for b in budgets {
        let settings = StreamSettings {
            mem_budget_bytes: b,
            ctx,
            dense_prefix: DensePrefix::Fit,
            set_scale: SCORER_SET_SCALE,
            selector: SelectorChoice::Scorer { resident_bonus: runtime::scorer::SCORER_RESIDENT_BONUS },
            ..Default::default()
        };
        let ours = match runtime::plan::shape_plan(&k, &settings) {
            Ok((p, rule, span, embed_row)) => Ok(runtime::plan::predict_plan(
                &p,
                rule,
                span,
                k.name,
                k.config.intermediate_size,
                embed_row,
                &dev,
                reuse.map_or(runtime::plan::Reuse::Assumed, runtime::plan::Reuse::Given),
            )),
            Err(runtime::RuntimeError::BudgetTooSmall { minimum, .. }) => Err(minimum),
            Err(e) => return Err(e.into()),
        };
        let llama: Vec<(&str, runtime::plan::LlamaCppPrediction)> = k
            .ggufs
            .iter()
            .map(|(q, bytes)| {
                (
                    *q,
                    runtime::plan::predict_llama_cpp(
                        &runtime::plan::LlamaCppFile::of_shape(&k.config, q, *bytes),
                        kv,
                        b,
                        &dev,
                    ),
                )
            })
            .collect();
        rows.push((b, ours, llama));
    }
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(b, ours, llama)| {
                serde_json::json!({
                    "budget_bytes": b, "budget_fraction": b.map(|b| b as f64 / f16 as f64),
                    "ours": match ours { Ok(p) => serde_json::to_value(p).unwrap_or_default(), Err(m) => serde_json::json!({"refused_minimum_bytes": m}) },
                    "llama_cpp": llama.iter().map(|(q, l)| serde_json::json!({"quant": q, "prediction": l})).collect::<Vec<_>>(),
                })
            })
            .collect();
        println!("{}", serde_json::json!({"shape": k.name, "device": dev.name, "rows": v}));
        return Ok(());
    }
    println!("{} on {} ({}), predicted decode tok/s; ctx {ctx}; ours: auto on a native Q4_K_M preparation (dense where it fits, else the scorer)", k.name, dev.name, device_path.display());
    let quants: Vec<&str> = k.ggufs.iter().map(|g| g.0).collect();
    println!(
        "{:>18} | {:>22} | {}",
        "budget",
        "ours",
        quants.iter().map(|q| format!("{q:>14}")).collect::<Vec<_>>().join(" ")
    );
    for (b, ours, llama) in &rows {
        let b = b.unwrap_or(0);
        let ours = match ours {
            Ok(p) if p.selector == "dense" => format!("{:.2} (dense)", p.predicted_tok_per_s),
            Ok(p) => format!("{:.2} (reuse {:.2})", p.predicted_tok_per_s, p.reuse),
            Err(m) => format!("needs {:.1} GB", *m as f64 / 1e9),
        };
        let ll: Vec<String> = llama
            .iter()
            .map(|(_, l)| format!("{:>13.2}{}", l.predicted_tok_per_s, if l.fits { " " } else { "*" }))
            .collect();
        println!(
            "{:>8.2} GB ({:>3.0}%) | {ours:>22} | {}",
            b as f64 / 1e9,
            100.0 * b as f64 / f16 as f64,
            ll.join(" ")
        );
    }
    println!("(* the GGUF does not fit: llama.cpp re-reads what the page cache cannot hold. Reuse is the floor held / n_ff unless --reuse is given.)");
    Ok(())
}

fn plan(
    manifest: &Path,
    device: Option<PathBuf>,
    reuse: Option<f64>,
    ggufs: &[PathBuf],
    ctx: usize,
    mode: &ModeArgs,
    json: bool,
) -> Result<()> {
    if !manifest.is_file() {
        anyhow::bail!("{}: runtime plan needs a prepared model's manifest.toml", manifest.display());
    }
    let (device_path, dev) = load_device(device)?;
    let mf = formats::manifest::Manifest::load(manifest)?;
    // llama.cpp's rate on each GGUF at the budget, whether or not ours fits it
    let budget = match &mode.mem_budget {
        Some(b) => Some(runtime::stream::parse_bytes(b).map_err(|e| anyhow::anyhow!("--mem-budget {e}"))?),
        None => None,
    };
    let mut llama = Vec::new();
    for g in ggufs {
        let file = runtime::plan::LlamaCppFile::open(g)?;
        llama.push((
            g.display().to_string(),
            runtime::plan::predict_llama_cpp(
                &file,
                runtime::stream::budget::kv_cache_bytes(&mf.model, ctx),
                budget,
                &dev,
            ),
        ));
    }
    let llama_json = || llama.iter().map(|(g, l)| serde_json::json!({"gguf": g, "prediction": l})).collect::<Vec<_>>();
    let mib = |b: u64| b as f64 / 1048576.0;
    let print_llama = || {
        for (g, l) in &llama {
            println!(
                "llama.cpp on {g} ({:.0} MiB): {} -> predicted {:.2} tok/s",
                mib(l.file_bytes),
                if l.fits {
                    "fits".to_string()
                } else {
                    format!("re-reads {:.0} MiB per token", mib(l.reread_bytes_per_token))
                },
                l.predicted_tok_per_s
            );
        }
    };
    let mode = ModeArgs { engine: true, ..mode.clone() };
    let opened = mode.mode(manifest, ctx).and_then(|(m, x, notes)| {
        let PreparedMode::Stream(settings) = m else {
            anyhow::bail!("runtime plan predicts a streamed run: no --in-memory");
        };
        let engine = runtime::stream::StreamingEngine::new(manifest, &mf, &settings)?;
        Ok((settings, notes, engine, x.head))
    });
    let (settings, notes, engine, head_asked) = match opened {
        Ok(o) => o,
        // below our minimum, llama.cpp's predictions are still the answer asked for
        Err(e)
            if !llama.is_empty()
                && matches!(
                    e.downcast_ref::<runtime::RuntimeError>(),
                    Some(runtime::RuntimeError::BudgetTooSmall { .. })
                ) =>
        {
            let why = formats::error::display_chain(e.as_ref());
            if json {
                println!(
                    "{}",
                    serde_json::json!({"device": dev.name, "ours": null, "ours_refused": why, "llama_cpp": llama_json()})
                );
            } else {
                println!("device: {} ({})\nours: refused: {why}", dev.name, device_path.display());
                print_llama();
            }
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    for n in &notes {
        eprintln!("note: {n}");
    }
    let c = &mf.model;
    let rh = runtime::stream::budget::ResidentHead::of(manifest, &mf)?;
    let embed_row_bytes = rh.embed_bytes / c.vocab_size as u64;
    // a measured reuse is this mode's; the other auto candidates get the preparation's table
    let table = formats::reuse_table::ReuseTable::of_manifest(manifest, &mf)?;
    let prepared = table.as_ref().map_or(runtime::plan::Reuse::Assumed, runtime::plan::Reuse::Table);
    let known = reuse.map_or(prepared, runtime::plan::Reuse::Given);
    let p = runtime::plan::predict(&engine, &mf.model_name, c.intermediate_size, embed_row_bytes, &dev, known);
    // --strategy auto: every candidate at this budget, with its predicted rate
    let candidates: Vec<(String, bool, std::result::Result<runtime::plan::Prediction, String>)> =
        if mode.strategy == Strategy::Auto && settings.mem_budget_bytes.is_some() {
            let cands = runtime::stream::auto::candidates(manifest, &mf, &settings, head_asked)?;
            let runs = runtime::stream::auto::chosen(&cands);
            cands
                .into_iter()
                .enumerate()
                .map(|(i, cand)| {
                    let r = match &cand.plan {
                        Ok(plan) => Ok(runtime::plan::predict_plan(
                            plan,
                            cand.name,
                            cand.read_span_bytes,
                            &mf.model_name,
                            c.intermediate_size,
                            embed_row_bytes,
                            &dev,
                            prepared,
                        )),
                        Err(runtime::RuntimeError::BudgetTooSmall { minimum, .. }) => {
                            Err(format!("needs {:.1} MiB", *minimum as f64 / 1048576.0))
                        }
                        Err(e) => Err(e.to_string()),
                    };
                    (cand.label(), runs == Some(i), r)
                })
                .collect()
        } else {
            Vec::new()
        };
    if json {
        let cands: Vec<serde_json::Value> = candidates
            .iter()
            .map(|(name, runs, r)| match r {
                Ok(p) => serde_json::json!({"strategy": name, "fits": true, "runs": runs, "prediction": p}),
                Err(why) => serde_json::json!({"strategy": name, "fits": false, "runs": false, "refused": why}),
            })
            .collect();
        let v = serde_json::json!({"device": dev.name, "ours": p, "auto_candidates": cands, "llama_cpp": llama_json()});
        println!("{v}");
        return Ok(());
    }
    println!("device: {} ({})", dev.name, device_path.display());
    println!(
        "operating point: {} ({:.0} rows per set, {:.0} slots per layer); plan {:.1} MiB of {} (minimum {:.1} MiB)",
        operating_point(&p.selector, p.dense_prefix, p.set_scale),
        p.mean_set_rows,
        p.mean_slots,
        mib(p.planned_bytes),
        p.budget_bytes.map(|b| format!("{:.1} MiB", mib(b))).unwrap_or_else(|| "no budget".into()),
        mib(p.minimum_bytes)
    );
    let b = &p.bytes_per_token;
    println!(
        "bytes per token: A0 {} B (embedding row, memory), A1 {:.2} MiB and A2 {:.2} MiB (storage), A3 {:.1} MiB (memory)",
        b.a0_memory,
        mib(b.a1_storage),
        mib(b.a2_storage),
        mib(b.a3_memory)
    );
    println!(
        "reuse {:.3} ({}); {:.0} requests of {} B per token at queue depth <= {}, {:.1} us each",
        p.reuse,
        p.reuse_source,
        p.requests_per_token,
        p.read_bytes,
        p.queue_depth,
        p.request_s * 1e6
    );
    println!(
        "per token: compute {:.2} ms ({}), I/O {:.2} ms of which exposed {:.2} ms (windowed roofline) -> predicted {:.2} tok/s",
        p.compute_s_per_token * 1e3,
        p.compute_source,
        p.io_s_per_token * 1e3,
        p.exposed_io_s_per_token * 1e3,
        p.predicted_tok_per_s
    );
    for (name, runs, r) in &candidates {
        let chosen = if *runs { "  <- runs (the best quality that fits)" } else { "" };
        match r {
            Ok(c) => println!(
                "auto candidate {name}: plan {:.1} MiB (minimum {:.1} MiB), predicted {:.2} tok/s{chosen}",
                mib(c.planned_bytes),
                mib(c.minimum_bytes),
                c.predicted_tok_per_s
            ),
            Err(why) => println!("auto candidate {name}: {why}"),
        }
    }
    print_llama();
    Ok(())
}
