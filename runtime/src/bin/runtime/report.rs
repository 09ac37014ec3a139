//! What the commands print: a run's sparsity (human and JSON) and its operating point.

use anyhow::Result;
use runtime::stream::StreamingEngine;
use std::path::Path;

/// The sparsity figures as JSON (null for a dense run).
pub fn sparsity_json(e: Option<&StreamingEngine>, n_ff: usize) -> serde_json::Value {
    let Some(e) = e else { return serde_json::Value::Null };
    let st = &e.stats;
    serde_json::json!({
        "mode": if e.holds_records() { "in-memory" } else { "stream" },
        "set_rule": e.rule(),
        "dense_prefix": e.dense_prefix,
        "set_scale": e.plan.set_scale,
        "neuron_rank": e.neuron_rank(),
        "tokens": st.tokens,
        "reuse_ratio": st.reuse_ratio(),
        "sparse_layer_density": sparse_layer_density(e, n_ff),
        "rows_loaded": st.rows_loaded,
        "bytes_read": st.bytes_read,
        "plan": e.plan,
    })
}

/// Rows summed over rows in the sparse layers, over the tokens decoded.
fn sparse_layer_density(e: &StreamingEngine, n_ff: usize) -> f64 {
    let rows = e.stats.tokens as f64 * e.plan.capacity.len() as f64 * n_ff as f64;
    e.stats.computed_rows as f64 / rows.max(1.0)
}

pub fn print_sparsity(e: Option<&mut StreamingEngine>, n_ff: usize) {
    let Some(e) = e else { return };
    e.refresh_io_stats();
    let st = &e.stats;
    println!(
        "{}: {} tokens, {}, {:.3} of sparse-layer rows summed, reuse {:.3}, {:.1} KiB read per token ({:.1} MiB into warm slots), {:.0} slots per layer (budget {})",
        if e.holds_records() { "records in memory" } else { "streamed" },
        st.tokens,
        operating_point(&e.rule(), e.choice.set_unit(), e.dense_prefix, e.plan.set_scale),
        sparse_layer_density(e, n_ff),
        st.reuse_ratio(),
        (st.bytes_read - st.warm_bytes_read) as f64 / 1024.0 / st.tokens.max(1) as f64,
        st.warm_bytes_read as f64 / 1048576.0,
        e.plan.capacity.iter().sum::<usize>() as f64 / e.plan.capacity.len().max(1) as f64,
        e.plan.budget_bytes.map(|b| format!("{:.1} MiB", b as f64 / 1048576.0)).unwrap_or_else(|| "unlimited".into())
    );
}

/// A streamed run's operating point in words: "every layer dense", or "layers 1.. sparse,
/// scorer sets of 0.25 x n_ff".
pub fn operating_point(rule: &str, set_unit: &str, dense_prefix: usize, set_scale: f64) -> String {
    match rule {
        "dense" => "every layer dense".into(),
        _ => format!("layers {dense_prefix}.. sparse, {rule} sets of {set_scale:.2} x {set_unit}"),
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
