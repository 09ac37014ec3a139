//! How a prepared model runs, from the flags every model command shares: `--mem-budget`,
//! `--strategy`, `--in-memory`, `--dense-prefix`, `--set-scale` and the research knobs of `-X`.

use anyhow::Result;
use clap::Args;
use runtime::predictor::SetRule;
use runtime::stream::{DensePrefix, SelectorChoice, StreamSettings};
use runtime::PreparedMode;
use std::path::{Path, PathBuf};

/// How a prepared model (manifest.toml) runs. A model directory runs dense, in memory.
#[derive(Args, Clone, Default)]
pub struct ModeArgs {
    /// Memory budget of a streamed run (e.g. 155MiB, 1.5GiB): refused with the minimum when
    /// too small; what it leaves beyond each layer's set becomes extra row slots.
    #[arg(long)]
    pub mem_budget: Option<String>,
    /// auto (default): with --mem-budget, the best-quality strategy whose plan fits it: dense
    /// (the whole model), the scorer (with its default head, then with the 4-bit head when that
    /// keeps larger sets), else the sketch (`runtime plan` lists each); without --mem-budget,
    /// dense in memory. scorer: each sparse layer scores its neurons from its own input with
    /// resident 4-bit gate/up rows (the GGUF's own in a native preparation) and streams only the
    /// down rows it needs. sketch: as layers, ranked by the resident gate and up rows at 2 bits
    /// per weight. predictor (NeuroPrefetcher): the shared predictor picks every sparse layer's
    /// set after layer 0 and streams whole records. layers (LLM in a flash): each sparse layer's
    /// own small predictor picks its set from the layer's input, whole records are streamed and
    /// every held row counts.
    /// dense: every layer dense, every row in memory (the reference; the GGUF's own MLP blocks
    /// in a native preparation); with --mem-budget, refused below the whole model's size, and
    /// `auto`'s first choice wherever it fits.
    #[arg(long, value_enum, default_value_t = Strategy::Auto)]
    pub strategy: Strategy,
    /// The same run with records.bin held in memory instead of within a budget: every row in
    /// memory, each read a copy (quality figures; slots as -X slot-share says).
    #[arg(long, conflicts_with = "mem_budget")]
    pub in_memory: bool,
    /// Layers below L run dense, L.. sparse (the prepared dense prefix <= L <= n_layers), or
    /// `fit`: as many dense layers as --mem-budget allows, then smaller sets. Default: fit with
    /// the scorer, the manifest's default_dense_from with the predictor.
    #[arg(long)]
    pub dense_prefix: Option<DensePrefix>,
    /// Share of each sparse layer's neurons needed per token: of n_ff with the scorer (default
    /// 0.25), of K_max with the predictor (default 1). With `fit`, the largest share up to this
    /// that fits --mem-budget.
    #[arg(long, value_parser = parse_set_scale)]
    pub set_scale: Option<f64>,
    /// Research knobs, KEY=VALUE (repeatable; `-X help` lists them): set-rule, resident-bonus, slot-share, head, pread, max-run-bytes, warm-gap-bytes, queue-depth,
    /// oracle-thresholds.
    #[arg(long = "experiment", short = 'X', value_name = "KEY=VALUE")]
    pub experiment: Vec<String>,
    /// Skip the sha256 check of a preparation's artifacts (done once per artifact set and
    /// cached beside the manifest); sizes and every record's CRC32C are still checked.
    #[arg(long)]
    pub no_verify: bool,
    /// `--strategy dense` through the streaming engine even without --mem-budget (runtime bench,
    /// plan and probe-storage measure an engine's run); else it runs in memory, batched.
    #[arg(skip)]
    pub engine: bool,
    /// Set by `runtime perplexity`, the one command that takes `-X oracle-thresholds`.
    #[arg(skip)]
    pub perplexity: bool,
    /// Set by `runtime serve`: what its requests hold, counted in a streamed run's plan.
    #[arg(skip)]
    pub host_bytes: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Strategy {
    #[default]
    Auto,
    Dense,
    Predictor,
    Scorer,
    Layers,
    Sketch,
}

pub const EXPERIMENT_HELP: &str = "research knobs (-X KEY=VALUE):
  set-rule=soft8|softN                     the predictor's set rule
  set-rule=oracle                          --in-memory, with --strategy layers or sketch: each token's
                                           exact |h| ranks (the ceiling at a set size)
  resident-bonus=F                         scorer, sketch: a held row ranks at F (>= 1) times its score (default 2)
  slot-share=C                             --in-memory: rows each sparse layer holds, share of n_ff
                                           (default: the set, as the smallest budget holds)
  head=q8|compact|resident                 the output head (default: compact with sketch and layers;
                                           q8 with the scorer on an f16 preparation)
  pread                                    read records with pread instead of io_uring
  max-run-bytes=N                          longest coalesced read (default 1048576)
  warm-gap-bytes=N                         bytes between two needed rows one of the warm slots'
                                           reads takes in rather than ask a second read (default 8192)
  queue-depth=N                            io_uring queue depth (default 256)
  oracle-thresholds=FILE                   perplexity, model directory: oracle masks (thresholds.json)
                                           in layers >= --dense-prefix";

/// The research knobs of `--experiment`, parsed and checked.
#[derive(Default)]
pub struct Experiment {
    pub set_rule: Option<SetRule>,
    pub resident_bonus: Option<f32>,
    pub slot_share: Option<f64>,
    /// `set-rule=oracle`: each token's exact |h| ranks (whole records, in memory).
    pub oracle: bool,
    pub head: Option<runtime::HeadChoice>,
    pub pread: bool,
    pub max_run_bytes: Option<usize>,
    pub warm_gap_bytes: Option<usize>,
    pub queue_depth: Option<usize>,
    pub oracle_thresholds: Option<PathBuf>,
}

impl Experiment {
    pub fn parse(items: &[String]) -> Result<Self> {
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
                "set-rule" if value == "oracle" => e.oracle = true,
                "set-rule" => {
                    e.set_rule = Some(value.parse().map_err(|m: String| anyhow::anyhow!("--experiment {item}: {m}"))?)
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
                "warm-gap-bytes" => {
                    e.warm_gap_bytes = Some(value.parse().map_err(|_| bad("a byte count"))?);
                }
                "queue-depth" => e.queue_depth = Some(positive("a depth in 1..=4096")?),
                "oracle-thresholds" if !value.is_empty() => e.oracle_thresholds = Some(PathBuf::from(value)),
                _ => anyhow::bail!("--experiment {item}: unknown knob\n{EXPERIMENT_HELP}"),
            }
        }
        Ok(e)
    }
}

pub fn parse_share(s: &str) -> std::result::Result<f64, String> {
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

/// The set scale the scorer and the rankers use by default: 0.25 x n_ff per layer, the
/// smallest set whose quality stays near dense (docs/RESULTS.md, "Strategies").
pub const SCORER_SET_SCALE: f64 = 0.25;

impl ModeArgs {
    /// The run a model path and these flags ask for, and notes for the user. `ctx`: the KV
    /// cache positions a streamed run's plan holds.
    pub fn mode(&self, model: &Path, ctx: usize) -> Result<(PreparedMode, Experiment, Vec<String>)> {
        let x = Experiment::parse(&self.experiment)?;
        if x.oracle_thresholds.is_some() && !self.perplexity {
            anyhow::bail!("--experiment oracle-thresholds masks the activations of a perplexity run: use it with runtime perplexity");
        }
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
                    Strategy::Predictor | Strategy::Scorer | Strategy::Layers | Strategy::Sketch
                );
            if streaming && model.is_dir() {
                anyhow::bail!("{}: a model directory runs dense, in memory; --mem-budget, --in-memory, --strategy, --dense-prefix and --set-scale need a prepared model's manifest.toml (make prepare)", model.display());
            }
            return Ok((PreparedMode::Dense { head: runtime::HeadChoice::Resident }, x, notes));
        }
        let manifest = formats::manifest::Manifest::load(model)?;
        let has = |role: &str| manifest.artifacts.iter().any(|a| a.role == role);
        // auto: with a budget (or --in-memory), the best-quality strategy whose plan fits it
        // (runtime::stream::auto, decided below once the settings are known); without one,
        // dense. The scorer and the sketch share their defaults (head, sets of 0.25 x n_ff, fit),
        // so the provisional choice sizes the settings of whichever runs.
        let strategy = match self.strategy {
            Strategy::Auto if self.mem_budget.is_none() && !self.in_memory => {
                if self.dense_prefix.is_some() || self.set_scale.is_some() {
                    anyhow::bail!("--dense-prefix and --set-scale size a sparse run: give --mem-budget (or --in-memory, or name a --strategy); without them auto runs every layer dense");
                }
                Strategy::Dense
            }
            Strategy::Auto if has("scorer") => Strategy::Scorer,
            Strategy::Auto if has(runtime::layer_predictor::SKETCH_ROLE) => Strategy::Sketch,
            Strategy::Auto => anyhow::bail!("{}: no scorer or sketch artifact, which --strategy auto chooses from below the whole model's size (rerun make prepare, or name --strategy dense, predictor or layers)", model.display()),
            s => s,
        };
        if strategy == Strategy::Dense {
            if self.in_memory || self.dense_prefix.is_some() || self.set_scale.is_some() {
                anyhow::bail!("--strategy dense runs every layer dense with every row held: it takes no --in-memory, --dense-prefix or --set-scale");
            }
            if x.set_rule.is_some()
                || x.oracle
                || x.resident_bonus.is_some()
                || x.slot_share.is_some()
                || x.oracle_thresholds.is_some()
            {
                anyhow::bail!("--experiment set-rule, resident-bonus, slot-share and oracle-thresholds choose sparse sets: --strategy dense has none");
            }
            if self.mem_budget.is_none() && !self.engine {
                return Ok((PreparedMode::Dense { head: x.head.unwrap_or_default() }, x, notes));
            }
        }
        let scorer = strategy == Strategy::Scorer;
        let layers = matches!(strategy, Strategy::Layers | Strategy::Sketch);
        if (scorer || layers) && x.set_rule.is_some() {
            anyhow::bail!("--experiment set-rule is the predictor's: use it with --strategy predictor (--strategy layers and sketch take set-rule=oracle, in memory)");
        }
        if x.oracle && !layers {
            anyhow::bail!("--experiment set-rule=oracle ranks whole records by their exact |h|: use it with --strategy layers or sketch and --in-memory");
        }
        if x.oracle && !self.in_memory {
            anyhow::bail!("--experiment set-rule=oracle ranks neurons by their true activations, which needs every row: use it with --in-memory");
        }
        if x.slot_share.is_some() && !self.in_memory {
            anyhow::bail!("--experiment slot-share sizes the slots of a run with every row in memory (--in-memory); a streamed run's slots come from --mem-budget");
        }
        if !scorer && strategy != Strategy::Sketch && x.resident_bonus.is_some() {
            anyhow::bail!(
                "--experiment resident-bonus is the scorer's and the sketch's: use it with --strategy scorer or sketch"
            );
        }
        let selector = if scorer {
            SelectorChoice::Scorer {
                resident_bonus: x.resident_bonus.unwrap_or(runtime::scorer::SCORER_RESIDENT_BONUS),
            }
        } else if x.oracle {
            SelectorChoice::Oracle
        } else if strategy == Strategy::Sketch {
            SelectorChoice::Sketch {
                resident_bonus: x.resident_bonus.unwrap_or(runtime::select::layered::SKETCH_RESIDENT_BONUS),
            }
        } else if strategy == Strategy::Dense {
            SelectorChoice::Dense
        } else if layers {
            SelectorChoice::Layers
        } else {
            SelectorChoice::Predictor { rule: x.set_rule.unwrap_or_default() }
        };
        let set_scale = self.set_scale.unwrap_or(if scorer || layers { SCORER_SET_SCALE } else { 1.0 });
        // a set must hold at least one neuron: the scorer's, sketch's and layers' are shares of
        // n_ff, the predictor's of each layer's K_max
        let (unit, full) = match scorer || layers {
            true => ("n_ff", manifest.model.intermediate_size),
            false => ("K_max", manifest.sparsity.k_max.iter().copied().min().unwrap_or(0)),
        };
        if strategy != Strategy::Dense && set_scale * (full as f64) < 1.0 {
            anyhow::bail!(
                "--set-scale {set_scale}: sets of {:.3} neurons ({unit} is {full}); at least {:.2e} keeps one",
                set_scale * full as f64,
                1.0 / full.max(1) as f64
            );
        }
        // each strategy's default head (runtime::stream::auto::default_head), unless -X head= says
        let head = match x.head {
            Some(h) => h,
            None => runtime::stream::auto::default_head(model, &manifest, selector)?,
        };
        if self.in_memory {
            if x.pread || x.max_run_bytes.is_some() || x.warm_gap_bytes.is_some() || x.queue_depth.is_some() {
                anyhow::bail!("--experiment pread, max-run-bytes, warm-gap-bytes and queue-depth tune a streamed run's reads: not with --in-memory");
            }
            if self.dense_prefix == Some(DensePrefix::Fit) {
                anyhow::bail!(
                    "--dense-prefix fit sizes a streamed run's memory plan: it needs --mem-budget, not --in-memory"
                );
            }
        }
        let mem_budget_bytes = match &self.mem_budget {
            Some(b) => Some(runtime::stream::parse_bytes(b).map_err(|e| anyhow::anyhow!("--mem-budget {e}"))?),
            None => None,
        };
        let mut io = runtime::stream::IoSettings {
            force_pread: x.pread,
            hold_records_in_memory: self.in_memory,
            ..Default::default()
        };
        if let Some(m) = x.max_run_bytes {
            io.max_run_bytes = m;
        }
        if let Some(g) = x.warm_gap_bytes {
            io.warm_gap_bytes = g;
        }
        if let Some(q) = x.queue_depth {
            io.queue_depth = q;
        }
        // the strategies whose sets are shares of n_ff put every layer after the prepared prefix
        // sparse (streamed: as the budget fits)
        let dense_prefix = self.dense_prefix.unwrap_or(match (scorer || layers, self.in_memory) {
            (true, true) => DensePrefix::Layer(manifest.sparsity.dense_prefix),
            (true, false) => DensePrefix::Fit,
            (false, _) => DensePrefix::Default,
        });
        // in memory, the slots of the smallest budget (the set) unless a slot share says more;
        // the predictor's held rows do not count, so its slots change nothing computed
        // (the plan holds at least each layer's set)
        let slot_share = match self.in_memory && (scorer || layers) {
            true => x.slot_share.or(Some(set_scale)),
            false => x.slot_share,
        };
        let mut s = StreamSettings {
            mem_budget_bytes,
            ctx,
            dense_prefix,
            set_scale,
            selector,
            head,
            slot_share,
            io,
            record_sets: false,
            host_bytes: self.host_bytes,
        };
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
pub fn open(model: &Path, mode: &ModeArgs, ctx: usize) -> Result<(runtime::Opened, Experiment)> {
    let (m, x, notes) = mode.mode(model, ctx)?;
    let opened = runtime::open_with(model, &m, !mode.no_verify)?;
    for n in notes.iter().chain(&opened.notes) {
        eprintln!("note: {n}");
    }
    Ok((opened, x))
}
