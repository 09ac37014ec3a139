//! `--strategy auto`: which strategy a budget runs, decided before anything large is loaded.
//!
//! The candidates, best quality first at equal memory (docs/RESULTS.md, "Strategies"):
//! 0. `dense`: where the whole model fits, every MLP held and computed dense from the GGUF's own
//!    blocks (a native preparation's dense_mlp.safetensors): the source file's quality, and
//!    faster than the scorer summing every held down row;
//! 1. `scorer`: resident 4-bit gate/up rows rank every neuron, the down rows stream (a budget
//!    that holds every row computes the dense MLP);
//! 2. `sketch`: the resident 2-bit gate/up sketch ranks, whole records stream.
//!
//! The papers' predictors (the shared one, `predictor`, and the per-layer ones, `layers`) run
//! when named and are compared in `make bench-selectors`, but `auto` never picks them.
//!
//! Each candidate's plan is sized from its files' headers with the same [`MemoryPlan`] the run
//! uses (`Footprint::per_layer`), and the first that fits the budget runs; `runtime plan
//! --strategy auto` prints every candidate with the windowed roofline's predicted tok/s.

use super::budget::{PlanInputs, Sizing};
use super::{MemoryPlan, SelectorChoice, StreamSettings};
use crate::error::{Result, RuntimeError};
use crate::model::HeadChoice;
use crate::select::{Footprint, HeldAs, SlotRow};
use formats::manifest::Manifest;
use std::path::Path;

/// The head a strategy's logits come from unless `-X head=` says otherwise:
/// - the whole-record strategies (sketch, layers) run below the 4-bit model, where every
///   MiB buys row slots: the 4-bit head (`head_compact`), whose freed MiB as slots gain more
///   perplexity than its own rounding costs (docs/RESULTS.md, "Issue #18 (part 3)");
/// - the scorer, near the 4-bit model's size: the resident head when it is already GGML blocks,
///   else the Q8_0 one (`head_q8`);
/// - the shared predictor: the resident head.
///
/// A preparation without the artifact falls back to the next (the resident head last).
pub fn default_head(manifest_path: &Path, m: &Manifest, choice: SelectorChoice) -> Result<HeadChoice> {
    let has = |role: &str| m.artifacts.iter().any(|a| a.role == role);
    if choice.ranker_kind().is_some() && has(formats::head_compact::ARTIFACT_ROLE) {
        return Ok(HeadChoice::Compact);
    }
    if matches!(choice, SelectorChoice::Predictor { .. } | SelectorChoice::Dense)
        || super::budget::ResidentHead::of(manifest_path, m)?.head_quantized
        || !has("head_q8")
    {
        return Ok(HeadChoice::Resident);
    }
    Ok(HeadChoice::Q8)
}

/// One strategy `auto` considered.
pub struct Candidate {
    pub name: &'static str,
    pub choice: SelectorChoice,
    /// The head it runs with (its default, or the one asked for).
    pub head: HeadChoice,
    /// Its plan at the budget, or why not (the budget is below its minimum).
    pub plan: Result<MemoryPlan>,
    /// Bytes one needed row's read takes.
    pub read_span_bytes: usize,
}

/// What one candidate holds per sparse layer, from its artifact's header; None without the
/// artifact, or for a strategy `auto` does not choose.
fn sizing_of(
    manifest_path: &Path,
    m: &Manifest,
    choice: SelectorChoice,
) -> Result<Option<(usize, u64, HeldAs, SlotRow)>> {
    let c = &m.model;
    let d0 = m.sparsity.dense_prefix;
    // the resident ranking rows' bytes per layer from the artifact of `role`'s header (the
    // scorer's 4-bit gate/up, the sketch's): None without the artifact
    let ranking_rows = |role: &str, held: fn(&Path, usize, usize, usize, usize) -> formats::error::Result<usize>| {
        m.artifacts
            .iter()
            .find(|a| a.role == role)
            .map(|a| {
                held(
                    &m.artifact_path(manifest_path, a),
                    d0,
                    c.num_hidden_layers - d0,
                    c.intermediate_size,
                    c.hidden_size,
                )
            })
            .transpose()
    };
    Ok(match choice {
        SelectorChoice::Scorer { .. } => ranking_rows("scorer", formats::scorer::held_bytes_per_layer)?
            .map(|per_layer| (d0, per_layer as u64, HeldAs::RankingRows, SlotRow::Down)),
        SelectorChoice::Sketch { .. } => {
            ranking_rows(crate::layer_predictor::SKETCH_ROLE, formats::sketch::held_bytes_per_layer)?
                .map(|per_layer| (m.records.first_layer, per_layer as u64, HeldAs::RankingRows, SlotRow::GateUpDown))
        }
        SelectorChoice::Layers => match m.artifacts.iter().find(|a| a.role == crate::layer_predictor::ARTIFACT_ROLE) {
            None => None,
            Some(a) => {
                let spec = formats::layer_predictors::read_spec(&m.artifact_path(manifest_path, a))?;
                Some((m.records.first_layer, spec.layer_parameters() as u64 * 2, HeldAs::Networks, SlotRow::GateUpDown))
            }
        },
        SelectorChoice::Predictor { .. } | SelectorChoice::Oracle | SelectorChoice::Dense => None,
    })
}

/// The footprint a strategy would have (the scorer, the sketch or the per-layer predictors)
/// from its files' headers, and the rows its slots hold; None when the preparation lacks its
/// artifact.
pub fn footprint_of(
    manifest_path: &Path,
    m: &Manifest,
    choice: SelectorChoice,
) -> Result<Option<(impl Fn(usize) -> Footprint, SlotRow)>> {
    let (n_layers, n_ff) = (m.model.num_hidden_layers, m.model.intermediate_size);
    Ok(sizing_of(manifest_path, m, choice)?.map(|(first, per_layer, held_as, slot_row)| {
        (move |l: usize| Footprint::per_layer(l.max(first), n_layers, n_ff, per_layer, held_as), slot_row)
    }))
}

/// Every candidate the preparation has, in `auto`'s order, planned at `s`'s budget (its
/// selector is ignored) with `head`, or each one's [`default_head`] when None.
pub fn candidates(
    manifest_path: &Path,
    m: &Manifest,
    s: &StreamSettings,
    head: Option<HeadChoice>,
) -> Result<Vec<Candidate>> {
    let inputs = PlanInputs::of(manifest_path, m)?;
    let has_compact = m.artifacts.iter().any(|a| a.role == formats::head_compact::ARTIFACT_ROLE);
    let mut out = Vec::new();
    // every layer dense, with the resident head (the GGUF's own) unless another is asked for;
    // not also with the 4-bit head, as the scorer is: where dense with it would fit, the
    // scorer holding every row does better (docs/RESULTS.md "Issue #18 (part 9)")
    {
        let dense = crate::select::dense::DenseSelector { n_layers: m.model.num_hidden_layers };
        let footprint = Sizing::of(&dense);
        let sizing = Sizing { footprint: &footprint, slot_row: crate::select::SetSelector::slot_row(&dense) };
        let head = head.unwrap_or(HeadChoice::Resident);
        let plan = only_refused(
            manifest_path,
            "dense",
            MemoryPlan::for_settings(
                &inputs,
                &sizing,
                &StreamSettings { selector: SelectorChoice::Dense, head, ..s.clone() },
            ),
        )?;
        let read_span_bytes =
            super::io::read_span_bytes(sizing.slot_row, inputs.shape, inputs.record_bytes, m.model.hidden_size);
        out.push(Candidate { name: "dense", choice: SelectorChoice::Dense, head, plan, read_span_bytes });
    }
    for (name, choice) in [
        ("scorer", SelectorChoice::Scorer { resident_bonus: crate::scorer::SCORER_RESIDENT_BONUS }),
        ("sketch", SelectorChoice::Sketch { resident_bonus: crate::select::layered::SKETCH_RESIDENT_BONUS }),
    ] {
        let Some((footprint, slot_row)) = footprint_of(manifest_path, m, choice)? else { continue };
        let sizing = Sizing { footprint: &footprint, slot_row };
        let heads = match head {
            Some(h) => vec![h],
            None => {
                let h = default_head(manifest_path, m, choice)?;
                // the scorer again with the 4-bit head: the MiB it frees keep the scorer
                // running below its own minimum, where it beats the sketch (docs/RESULTS.md
                // "Issue #17 (part 3)")
                if matches!(choice, SelectorChoice::Scorer { .. }) && h != HeadChoice::Compact && has_compact {
                    vec![h, HeadChoice::Compact]
                } else {
                    vec![h]
                }
            }
        };
        let read_span_bytes =
            super::io::read_span_bytes(slot_row, inputs.shape, inputs.record_bytes, m.model.hidden_size);
        for head in heads {
            let settings = StreamSettings { selector: choice, head, ..s.clone() };
            let plan = only_refused(manifest_path, name, MemoryPlan::for_settings(&inputs, &sizing, &settings))?;
            let c = Candidate { name, choice, head, plan, read_span_bytes };
            // a second head is a candidate only where it needs less memory than the first
            if let Some(prev) = out.last().filter(|p: &&Candidate| p.name == name) {
                if c.minimum_bytes() >= prev.minimum_bytes() {
                    continue;
                }
            }
            out.push(c);
        }
    }
    Ok(out)
}

/// A candidate's plan, or its budget refusal; any other error (a bad artifact) is the caller's,
/// naming the strategy.
fn only_refused(manifest_path: &Path, name: &str, plan: Result<MemoryPlan>) -> Result<Result<MemoryPlan>> {
    match plan {
        Err(e) if !matches!(e, RuntimeError::BudgetTooSmall { .. }) => {
            Err(RuntimeError::Input(format!("{}: sizing the {name} strategy: {e}", manifest_path.display())))
        }
        plan => Ok(plan),
    }
}

impl Candidate {
    /// The smallest budget it runs at.
    pub fn minimum_bytes(&self) -> u64 {
        match &self.plan {
            Ok(p) => p.minimum_bytes,
            Err(RuntimeError::BudgetTooSmall { minimum, .. }) => *minimum,
            Err(_) => unreachable!("candidates keeps only refusals"),
        }
    }

    /// Its plan's set scale (0 when it does not fit).
    fn set_scale(&self) -> f64 {
        self.plan.as_ref().map_or(0.0, |p| p.set_scale)
    }

    /// What messages call it: the strategy, and its head where the strategy has two candidates.
    pub fn label(&self) -> String {
        match (self.choice, self.head) {
            (SelectorChoice::Scorer { .. }, HeadChoice::Compact) => {
                format!("{} with the {} head", self.name, self.head.label().0)
            }
            _ => self.name.to_string(),
        }
    }
}

/// Which candidate runs: the first whose plan fits, except that of one strategy's head variants
/// (the scorer with its default head, then with the 4-bit one) a later one runs when its plan
/// keeps larger sets (`fit` cuts a set before it gives up a candidate: a 4-bit head at full sets
/// beats the resident one at cut sets).
pub fn chosen(cands: &[Candidate]) -> Option<usize> {
    let first = cands.iter().position(|c| c.plan.is_ok())?;
    let mut best = first;
    for (i, c) in cands.iter().enumerate().skip(first + 1) {
        if c.name != cands[first].name {
            break;
        }
        if c.set_scale() > cands[best].set_scale() + 1e-9 {
            best = i;
        }
    }
    Some(best)
}

/// The strategy `auto` runs at `s`'s budget, and its head (`head`, or its default): the first
/// candidate whose plan fits, with a note naming the better ones that did not (None when the
/// first fits); None when the preparation has none of them.
/// Refused when the budget is below every candidate's minimum.
pub fn choose(
    manifest_path: &Path,
    m: &Manifest,
    s: &StreamSettings,
    head: Option<HeadChoice>,
) -> Result<Option<(SelectorChoice, HeadChoice, Option<String>)>> {
    let cands = candidates(manifest_path, m, s, head)?;
    if cands.is_empty() {
        return Ok(None);
    }
    let skipped: Vec<String> = cands
        .iter()
        .take_while(|c| c.plan.is_err())
        .map(|c| format!("{} needs {:.0} MiB", c.label(), c.minimum_bytes() as f64 / 1048576.0))
        .collect();
    match chosen(&cands) {
        Some(i) => {
            let c = &cands[i];
            let note = match (i, cands.iter().position(|c| c.plan.is_ok())) {
                (i, Some(first)) if i != first => {
                    let f = &cands[first];
                    let also = if skipped.is_empty() { String::new() } else { format!("; {}", skipped.join(", ")) };
                    Some(format!("auto runs {} with sets of {:.2} (with its default head, {} fits only with sets of {:.2}{also})", c.label(), c.set_scale(), f.name, f.set_scale()))
                }
                _ => (!skipped.is_empty()).then(|| {
                    format!(
                        "auto runs {}, the best-quality strategy that fits the memory budget ({})",
                        c.label(),
                        skipped.join(", ")
                    )
                }),
            };
            Ok(Some((c.choice, c.head, note)))
        }
        None => {
            let smallest = cands.iter().min_by_key(|c| c.minimum_bytes()).expect("not empty");
            let Err(RuntimeError::BudgetTooSmall { budget, minimum, breakdown }) = &smallest.plan else {
                unreachable!("every candidate was refused")
            };
            Err(RuntimeError::BudgetTooSmall {
                budget: *budget,
                minimum: *minimum,
                breakdown: format!(
                    "no strategy fits ({}); the smallest, the {} strategy: {breakdown}",
                    skipped.join(", "),
                    smallest.name
                ),
            })
        }
    }
}
