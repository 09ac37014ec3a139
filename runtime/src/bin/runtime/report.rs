//! What the commands print: a run's sparsity (human and JSON) and its operating point.

use anyhow::Result;
use runtime::Sparsity;
use std::path::Path;

/// The sparsity figures as JSON (null for a dense run).
pub fn sparsity_json(s: Option<&Sparsity>, n_ff: usize) -> serde_json::Value {
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

pub fn print_sparsity(s: Option<&mut Sparsity>, n_ff: usize) {
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

/// A streamed run's operating point in words: "every layer dense", or "layers 1.. sparse,
/// scorer sets of 0.25 x n_ff".
pub fn operating_point(rule: &str, dense_prefix: usize, set_scale: f64) -> String {
    match rule {
        "dense" => "every layer dense".into(),
        _ => format!(
            "layers {dense_prefix}.. sparse, {rule} sets of {set_scale:.2} x {}",
            if matches!(rule, "scorer" | "sketch" | "layers") { "n_ff" } else { "K_max" }
        ),
    }
}

pub fn check_sampling(temp: f32, top_p: f32) -> Result<()> {
    if !(temp.is_finite() && temp >= 0.0) {
        anyhow::bail!("--temp {temp}: expected a finite temperature >= 0 (0 = greedy)");
    }
    if !(top_p > 0.0 && top_p <= 1.0) {
        anyhow::bail!("--top-p {top_p}: expected a probability in (0, 1]");
    }
    Ok(())
}

pub fn no_template(model: &Path) -> String {
    format!("{}: the model has no chat template (chat_template.jinja, kept from the GGUF's tokenizer.chat_template by prep import; rerun make setup or make prepare)", model.display())
}

/// An error as this command line words it: the library names settings, this names their flags.
pub fn describe(e: &anyhow::Error) -> String {
    use runtime::error::Setting;
    use runtime::RuntimeError;
    let chain = formats::error::display_chain(e.as_ref());
    let flag = |s: Setting| match s {
        Setting::Context => "--ctx",
        Setting::MemoryBudget => "--mem-budget",
        Setting::DensePrefix => "--dense-prefix",
        Setting::SetScale => "--set-scale",
        Setting::SlotShare => "-X slot-share",
        Setting::Task => "--task",
        Setting::BlockBytes => "--block-bytes",
    };
    match e.downcast_ref::<RuntimeError>() {
        Some(RuntimeError::Setting { setting, value, why }) => format!("{} {value}: {why}", flag(*setting)),
        Some(RuntimeError::BudgetTooSmall { .. }) => {
            format!("--mem-budget: {chain} (--ctx, --set-scale and --dense-prefix fit size the plan)")
        }
        Some(
            RuntimeError::ContextOverflow { .. }
            | RuntimeError::CtxTooLarge { .. }
            | RuntimeError::PromptTooLong { .. },
        ) => {
            format!("--ctx: {chain}")
        }
        _ => chain,
    }
}
