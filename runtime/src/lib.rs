//! The runtime library: the one forward pass of the project (also used by `prep` for
//! activation capture), tokenizer, sampling, generation and perplexity.

pub mod bench;
pub mod chat;
pub mod error;
pub mod eval;
pub mod generate;
pub mod kv_cache;
pub mod layer_predictor;
pub mod model;
pub mod ops;
pub mod oracle;
pub mod perplexity;
pub mod plan;
pub mod predictor;
pub mod probe;
pub mod reuse;
pub mod roofline;
pub mod sampler;
pub mod scorer;
pub mod select;
pub mod serve;
pub mod slots;
pub mod stream;
pub mod tensor;
pub mod tokenizer;

pub use error::{Result, RuntimeError};
pub use model::{DecodeLayout, HeadChoice, Model};
pub use tokenizer::Tokenizer;

use std::path::Path;

/// How a prepared model (a manifest) runs.
#[derive(Debug, Clone)]
pub enum PreparedMode {
    /// Every layer dense, every row in memory (the reference for the sparse figures), logits
    /// from `head`.
    Dense { head: HeadChoice },
    /// Sparse layers through the streaming engine: rows read from records.bin within a memory
    /// budget, or from records.bin held in memory (`IoSettings::hold_records_in_memory`: the
    /// same computation with every row in memory, for quality figures).
    Stream(stream::StreamSettings),
}

/// What the CLI opened: a model directory (dense), or a prepared `manifest.toml`.
pub struct Opened {
    pub model: Model,
    pub tokenizer: Tokenizer,
    pub manifest: Option<formats::manifest::Manifest>,
    /// The streaming engine of a run with sparse layers (None: every layer dense in memory).
    pub engine: Option<Box<stream::StreamingEngine>>,
    /// Things the user should know about this run (printed by the CLI, not the library).
    pub notes: Vec<String>,
}

impl Opened {
    /// Tokens to logits through whatever this model runs with.
    pub fn runner(&mut self) -> Runner<'_> {
        self.runner_and_tokenizer().0
    }

    /// [`Opened::runner`] and the tokenizer, borrowed together.
    pub fn runner_and_tokenizer(&mut self) -> (Runner<'_>, &Tokenizer) {
        let model = &self.model;
        let runner = match self.engine.as_mut() {
            None => Runner::dense(model),
            Some(e) => Runner::streamed(model, e.as_mut()),
        };
        (runner, &self.tokenizer)
    }

    /// The streaming engine, when this run has sparse layers.
    pub fn engine(&mut self) -> Option<&mut stream::StreamingEngine> {
        self.engine.as_deref_mut()
    }
}

/// Turns tokens into logits: the model's batched forward pass (dense, or with an in-memory
/// hook), or through the streaming engine. The tokens before the first whose logits are wanted
/// (a prompt, the first half of a perplexity chunk) are computed dense: by the streaming engine
/// in batches, each streamed layer's whole MLP staged ([`Model::prompt_batch`]); the rest with
/// the run's sets, token by token when streamed ([`Model::decode_step`]).
pub struct Runner<'a> {
    pub model: &'a Model,
    mlp: RunnerMlp<'a>,
    /// Told (tokens done, tokens in all) after each batch of a streamed prompt.
    prompt_progress: Option<&'a mut dyn FnMut(usize, usize)>,
}

enum RunnerMlp<'a> {
    Resident(Option<&'a mut dyn model::MlpHook>),
    Streamed(&'a mut stream::StreamingEngine),
}

impl<'a> Runner<'a> {
    pub fn dense(model: &'a Model) -> Self {
        Runner { model, mlp: RunnerMlp::Resident(None), prompt_progress: None }
    }

    pub fn with_hook(model: &'a Model, hook: &'a mut dyn model::MlpHook) -> Self {
        Runner { model, mlp: RunnerMlp::Resident(Some(hook)), prompt_progress: None }
    }

    pub fn streamed(model: &'a Model, engine: &'a mut stream::StreamingEngine) -> Self {
        Runner { model, mlp: RunnerMlp::Streamed(engine), prompt_progress: None }
    }

    /// Tells `f` (tokens done, tokens in all) after each batch of a streamed prompt (a progress
    /// bar, a server's log).
    pub fn with_prompt_progress(mut self, f: &'a mut dyn FnMut(usize, usize)) -> Self {
        self.prompt_progress = Some(f);
        self
    }

    /// Runs `tokens` at positions `cache.len ..` and returns the logits of tokens
    /// `logits_from..` as `[n_tokens - logits_from, vocab]`.
    pub fn forward(&mut self, tokens: &[u32], cache: &mut kv_cache::KvCache, logits_from: usize) -> Result<Vec<f32>> {
        let mut logits = Vec::new();
        self.forward_each(tokens, cache, logits_from, &mut |row| logits.extend_from_slice(row))?;
        Ok(logits)
    }

    /// [`Runner::forward`], each wanted token's logits `[vocab]` handed to `each` in order
    /// instead of collected: a streamed run then holds one row of logits at a time, whatever
    /// the number of tokens scored (a perplexity chunk's half).
    pub fn forward_each(
        &mut self,
        tokens: &[u32],
        cache: &mut kv_cache::KvCache,
        logits_from: usize,
        each: &mut dyn FnMut(&[f32]),
    ) -> Result<()> {
        let vocab = self.model.vocab_size();
        let mut rows = |logits: Vec<f32>| logits.chunks_exact(vocab).for_each(&mut *each);
        match &mut self.mlp {
            RunnerMlp::Resident(None) => rows(self.model.forward(tokens, cache, logits_from)?),
            RunnerMlp::Resident(Some(hook)) => {
                // as a streamed run computes them: the tokens before the first whose logits are
                // wanted dense, the rest with the hook's sets
                let split = logits_from.min(tokens.len());
                if split < 2 {
                    rows(self.model.forward_observed(tokens, cache, logits_from, Some(&mut **hook))?);
                } else {
                    self.model.forward(&tokens[..split], cache, split)?;
                    rows(self.model.forward_observed(&tokens[split..], cache, 0, Some(&mut **hook))?);
                }
            }
            RunnerMlp::Streamed(engine) => {
                let fresh = cache.len == 0;
                if fresh {
                    engine.begin_sequence();
                }
                // the tokens whose logits are not wanted (a prompt, the first half of a
                // perplexity chunk) go through in batches, each streamed layer's whole MLP
                // staged (exact); so does a prompt's last token when its logits alone are wanted
                // (a reply's first token: they come from the last batch, dense, as llama.cpp's
                // do); the other scored tokens token by token, as generated tokens are
                let (prompt, scored) = tokens.split_at(logits_from.min(tokens.len()));
                let batched = match (prompt.len(), scored.len()) {
                    (p, 1) if p >= 1 => tokens.len(),
                    (p, _) if p >= 2 => p,
                    _ => 0,
                };
                if batched > 0 {
                    // the batches use the emptied slots' memory; the slots fill after them
                    engine.begin_prompt_batches();
                    // the window of the batched tokens' last ones that chooses the warm slots
                    let window_from = batched.saturating_sub(stream::engine::WARM_WINDOW_TOKENS);
                    let mut start = 0;
                    for len in engine.plan.prompt_batches(batched) {
                        let batch = &tokens[start..start + len];
                        let count_from = window_from.saturating_sub(start).min(len);
                        let wanted_from = prompt.len().saturating_sub(start).min(len);
                        let logits = self.model.prompt_batch(batch, cache, *engine, count_from, wanted_from)?;
                        logits.chunks_exact(vocab).for_each(&mut *each);
                        engine.count_prompt(len);
                        start += len;
                        if let Some(f) = self.prompt_progress.as_mut() {
                            f(start, batched);
                        }
                    }
                    // the batches' freed activations go back before the slots fill, at the
                    // next token (the batches' logits are out first)
                    release_freed_heap();
                    engine.warm_after_prompt();
                } else {
                    for &tok in prompt {
                        self.model.decode_step(tok, cache, *engine)?;
                    }
                }
                for &tok in &tokens[batched.max(prompt.len())..] {
                    each(&self.model.decode_step(tok, cache, *engine)?);
                }
            }
        }
        Ok(())
    }

    /// The streaming engine, when this runner streams.
    pub fn engine(&mut self) -> Option<&mut stream::StreamingEngine> {
        match &mut self.mlp {
            RunnerMlp::Streamed(e) => Some(e),
            RunnerMlp::Resident(_) => None,
        }
    }
}

/// Hands the heap's free pages back to the kernel: glibc keeps freed heap pages resident until
/// it is asked to trim, and the memory plan counts what is held, not what was freed (a parsed
/// tokenizer.json, a prompt's larger batches).
pub(crate) fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap memory to the kernel; it touches no live
    // allocation and is thread-safe in glibc.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Allocations of 1 MiB and more get pages of their own, handed back when freed: glibc's
/// threshold for that otherwise rises to the largest block freed (up to 32 MiB), after which
/// freed blocks of a prompt batch's size stay resident in whichever thread's heap held them, and
/// what a streamed run holds would depend on which thread ran which task.
pub(crate) fn map_large_allocations() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes the allocator's policy for later allocations; it is
    // thread-safe in glibc.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// The preparation's per-neuron importance (`prep importance`); None, with a note, for a
/// preparation made before it existed (cut sets are then ranked by membership).
pub fn load_importance(
    manifest_path: &Path,
    manifest: &formats::manifest::Manifest,
) -> Result<(Option<formats::importance::NeuronImportance>, Option<String>)> {
    let Some(a) = manifest.artifacts.iter().find(|a| a.role == "importance") else {
        let note = format!(
            "{} has no importance artifact: cut sets are ranked by membership (rerun make prepare to add it)",
            manifest_path.display()
        );
        return Ok((None, Some(note)));
    };
    let p = manifest.artifact_path(manifest_path, a);
    Ok((
        Some(formats::importance::NeuronImportance::load(
            &p,
            manifest.model.num_hidden_layers,
            manifest.model.intermediate_size,
        )?),
        None,
    ))
}

/// Opens a model directory (dense; `mode` is ignored) or a prepared model's `manifest.toml`,
/// whose artifacts' sha256 are checked on first use ([`open_with`]).
pub fn open(path: &Path, mode: &PreparedMode) -> Result<Opened> {
    open_with(path, mode, true)
}

/// [`open`]; `verify`: check every artifact's sha256 against the manifest once per artifact set
/// (cached by a stamp beside the manifest; false: `--no-verify`, sizes only).
pub fn open_with(path: &Path, mode: &PreparedMode, verify: bool) -> Result<Opened> {
    if !path.exists() {
        return Err(RuntimeError::Input(format!("{}: no such file or directory", path.display())));
    }
    if path.is_dir() {
        let (model, tokenizer) = open_model(path, DecodeLayout::Interleaved)?;
        return Ok(Opened { model, tokenizer, manifest: None, engine: None, notes: Vec::new() });
    }
    let manifest = formats::manifest::Manifest::load(path)?;
    let tok_path = manifest.artifact_path_of(path, "tokenizer")?;
    let mut notes = Vec::new();
    if verify {
        match manifest.verify_checksums_cached(path)? {
            formats::manifest::Verification::Cached => {}
            formats::manifest::Verification::Verified { bytes, seconds, stamp_written } => notes.push(format!(
                "verified the sha256 of {} artifacts ({:.1} MiB) in {seconds:.1} s{}",
                manifest.artifacts.len(),
                bytes as f64 / 1048576.0,
                if stamp_written {
                    "; later runs skip this while they are unchanged"
                } else {
                    "; the folder is not writable, so every run verifies (--no-verify skips it)"
                }
            )),
        }
    }
    let (model, engine) = match mode {
        PreparedMode::Stream(settings) => {
            // size and check the budget before loading anything
            let mut engine = stream::StreamingEngine::new(path, &manifest, settings)?;
            notes.append(&mut engine.notes);
            if let Some(f) = &engine.fallback {
                notes.push(format!(
                    "{}: {f}; reading records with pread on the thread pool",
                    engine.records_path.display()
                ));
            }
            let model = Model::load_streaming(path, &manifest, engine.dense_prefix, settings.head)?;
            (model, Some(Box::new(engine)))
        }
        PreparedMode::Dense { head } => {
            let n_layers = manifest.model.num_hidden_layers;
            (Model::load_prepared(path, &manifest, n_layers, DecodeLayout::Interleaved, *head)?, None)
        }
    };
    let tokenizer = Tokenizer::load(&tok_path, model.vocab_size(), model.config.bos_token_id)?;
    Ok(Opened { model, tokenizer, manifest: Some(manifest), engine, notes })
}

/// Tokens of `prompt` as a run of `path` (a model directory or a manifest) sees them, with BOS:
/// what sizes a run's KV cache before the model is loaded. A prompt longer than the model's
/// context is refused before it is tokenized whole.
pub fn prompt_tokens(path: &Path, prompt: &str, add_special: bool) -> Result<usize> {
    let (tokenizer, max) = load_tokenizer(path)?;
    match tokenizer.encode_at_most(prompt, add_special, max)? {
        tokenizer::Bounded::Whole(ids) => Ok(ids.len()),
        tokenizer::Bounded::MoreThan(n) => Err(RuntimeError::PromptTooLong { max_tokens: n, ctx: max }),
    }
}

/// The tokenizer of `path` (a model directory or a manifest) without its model, and the
/// model's context.
pub fn load_tokenizer(path: &Path) -> Result<(Tokenizer, usize)> {
    if !path.exists() {
        return Err(RuntimeError::Input(format!("{}: no such file or directory", path.display())));
    }
    let (tok_path, config) = if path.is_file() {
        let m = formats::manifest::Manifest::load(path)?;
        (m.artifact_path_of(path, "tokenizer")?, m.model)
    } else {
        not_a_prepared_folder(path)?;
        (path.join(formats::model_dir::TOKENIZER_FILE), formats::model_dir::ModelConfig::load(path)?)
    };
    let t = Tokenizer::load(&tok_path, config.vocab_size, config.bos_token_id)?;
    Ok((t, config.max_position_embeddings))
}

/// A prepared model's folder is not a model directory: point at its manifest.
fn not_a_prepared_folder(dir: &Path) -> Result<()> {
    if dir.join("manifest.toml").is_file() && !dir.join(formats::model_dir::CONFIG_FILE).is_file() {
        return Err(RuntimeError::Input(format!(
            "{}: a prepared model's folder, not a model directory: pass {}",
            dir.display(),
            dir.join("manifest.toml").display()
        )));
    }
    Ok(())
}

/// Opens a canonical model directory, its matrices laid out as `layout` says.
pub fn open_model(path: &Path, layout: DecodeLayout) -> Result<(Model, Tokenizer)> {
    if !path.exists() {
        return Err(RuntimeError::Input(format!("{}: no such file or directory", path.display())));
    }
    if path.is_file() {
        return Err(RuntimeError::Input(format!(
            "{}: expected a model directory (config.json, tokenizer.json, *.safetensors)",
            path.display()
        )));
    }
    not_a_prepared_folder(path)?;
    let model = Model::load(path, layout)?;
    let tok =
        Tokenizer::load(&path.join(formats::model_dir::TOKENIZER_FILE), model.vocab_size(), model.config.bos_token_id)?;
    Ok((model, tok))
}

/// Where the chat template of a model directory or a prepared model (its `chat_template`
/// artifact) lies; None when the model ships none.
fn chat_template_file(path: &Path, manifest: Option<&formats::manifest::Manifest>) -> Option<std::path::PathBuf> {
    let file = match manifest {
        Some(m) => m.artifact_path(path, m.artifacts.iter().find(|a| a.role == "chat_template")?),
        None => path.join(formats::model_dir::CHAT_TEMPLATE_FILE),
    };
    file.is_file().then_some(file)
}

/// The chat template of an opened model, with its tokenizer's special tokens; None when the
/// model ships none.
pub fn chat_template(path: &Path, opened: &Opened) -> Result<Option<chat::ChatTemplate>> {
    match chat_template_file(path, opened.manifest.as_ref()) {
        Some(f) => Ok(Some(chat::ChatTemplate::for_tokenizer(&f, &opened.tokenizer, &opened.model.config)?)),
        None => Ok(None),
    }
}

/// [`chat_template`] before the model is loaded (a run sizes its KV cache from the rendered
/// prompt): reads the tokenizer and config only.
pub fn chat_template_at(path: &Path) -> Result<Option<chat::ChatTemplate>> {
    let (manifest, tok_path, config) = if path.is_file() {
        let m = formats::manifest::Manifest::load(path)?;
        let t = m.artifact_path_of(path, "tokenizer")?;
        let c = m.model.clone();
        (Some(m), t, c)
    } else {
        not_a_prepared_folder(path)?;
        (None, path.join(formats::model_dir::TOKENIZER_FILE), formats::model_dir::ModelConfig::load(path)?)
    };
    let Some(f) = chat_template_file(path, manifest.as_ref()) else { return Ok(None) };
    let tok = Tokenizer::load(&tok_path, config.vocab_size, config.bos_token_id)?;
    Ok(Some(chat::ChatTemplate::for_tokenizer(&f, &tok, &config)?))
}
