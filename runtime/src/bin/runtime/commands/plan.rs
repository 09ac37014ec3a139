//! `runtime plan`: the operating point a budget gets and its predicted decode rate.

use crate::mode::{parse_share, ModeArgs, Strategy, SCORER_SET_SCALE};
use crate::report::operating_point;
use anyhow::Result;
use runtime::stream::{DensePrefix, SelectorChoice, StreamSettings};
use runtime::PreparedMode;
use std::path::{Path, PathBuf};

/// The flags of `runtime plan`.
#[derive(clap::Args)]
pub struct Args {
    /// A prepared model's manifest.toml (or --shape).
    pub manifest: Option<PathBuf>,
    /// A public model shape instead of a preparation (mistral-7b, llama-3-8b), sized as a
    /// native preparation of its Q4_K_M GGUF would be; without --mem-budget, the frontier
    /// over 15-100% of its F16 size against llama.cpp's GGUFs.
    #[arg(long, conflicts_with = "manifest")]
    pub shape: Option<String>,
    /// A device file (runtime probe-storage writes one; devices/ ships some). Default:
    /// devices/this-machine.toml.
    #[arg(long)]
    pub device: Option<PathBuf>,
    /// The share of needed rows already held, as `runtime bench` measures it (default: every
    /// row held when the budget holds them all, else held / n_ff, a floor).
    #[arg(long, value_parser = parse_share)]
    pub reuse: Option<f64>,
    /// GGUF files to predict llama.cpp's rate on at the same budget.
    #[arg(long)]
    pub gguf: Vec<PathBuf>,
    /// KV cache positions (counted in the budget).
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    #[command(flatten)]
    pub mode: ModeArgs,
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> Result<()> {
    let Args { manifest, shape, device, reuse, gguf, ctx, mode, json } = args;
    match (manifest, shape) {
        (Some(m), None) => plan(&m, device, reuse, &gguf, ctx, &mode, json),
        (None, Some(s)) => plan_shape(&s, device, reuse, ctx, &mode, json),
        _ => anyhow::bail!("runtime plan needs a manifest.toml or --shape {}", runtime::plan::KNOWN_SHAPES.join("|")),
    }
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
            Ok((p, choice, rule, span, embed_row)) => Ok(runtime::plan::predict_plan(
                &p,
                choice,
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
                            cand.choice,
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
        operating_point(&p.selector, p.set_unit, p.dense_prefix, p.set_scale),
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
