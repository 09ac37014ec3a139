//! `prep prepare <recipe.toml>` (what `make prepare MODEL=<name>` runs): the offline pipeline
//! of `pipelines/<name>.toml` — import, capture, cluster, pack — ending in
//! `<out>/manifest.toml`. Each stage records a stamp (its settings and the size and mtime of its
//! inputs) after it succeeds; a stage whose stamp matches and whose outputs exist is skipped.
//! Every output is written under a temporary name and renamed, so an interrupted stage leaves
//! no file that a later run could take for a good one.

use crate::{capture, cluster, import, importance, layers, pack, scorer, train};
use anyhow::{bail, Context, Result};
use formats::manifest::{
    sha256_file, Artifact, Manifest, Provenance, RecordsLayout, SparsitySettings, MANIFEST_FORMAT_VERSION,
};
use formats::model_dir::ModelConfig;
use formats::records::record_bytes;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    pub name: String,
    /// GGUF file or Hugging Face directory; `--source` (make's SOURCE=) overrides it.
    #[serde(default)]
    pub source: Option<String>,
    /// Where the imported model directory goes.
    pub model_dir: String,
    /// Where the artifacts and manifest.toml go.
    pub out: String,
    pub capture: CaptureRecipe,
    pub cluster: ClusterRecipe,
    pub pack: PackRecipe,
    /// The shared predictor (NeuroPrefetcher's, `--strategy predictor`): trained only when the
    /// recipe has a `[train]` section (every field has a default). `auto` never runs it.
    #[serde(default)]
    pub train: Option<train::TrainSettings>,
    /// Per-neuron importance (the ranking of cut sets); every field has a default.
    #[serde(default)]
    pub importance: ImportanceRecipe,
    /// The per-layer predictors (LLM in a flash's, `--strategy layers`): trained only when the
    /// recipe has a `[layers]` section (every field has a default). `auto` never runs them.
    #[serde(default)]
    pub layers: Option<layers::LayersSettings>,
    /// The resident gate/up sketch (`--strategy sketch`); every field has a default.
    #[serde(default)]
    pub sketch: SketchRecipe,
    /// The reuse table of the scorer, sketch and layers strategies (`runtime plan`);
    /// every field has a default.
    #[serde(default)]
    pub reuse: crate::reuse::ReuseSettings,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SketchRecipe {
    /// Bits per weight of the gate and up rows: 1, 2 or 4.
    #[serde(default = "default_sketch_bits")]
    pub bits: u32,
    /// Calibration sequences (capture's corpus and length) whose MLP inputs weight each
    /// weight's error; 0: unweighted.
    #[serde(default = "default_sketch_sequences")]
    pub sequences: usize,
}

fn default_sketch_bits() -> u32 {
    2
}
fn default_sketch_sequences() -> usize {
    4
}

impl Default for SketchRecipe {
    fn default() -> Self {
        SketchRecipe { bits: default_sketch_bits(), sequences: default_sketch_sequences() }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportanceRecipe {
    /// Calibration sequences (the first of capture's, `capture.seq_len` tokens each).
    pub sequences: usize,
}

impl Default for ImportanceRecipe {
    fn default() -> Self {
        ImportanceRecipe { sequences: 8 }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureRecipe {
    /// Text files, or directories whose *.txt files are all used.
    pub corpus: Vec<String>,
    pub mask_kind: capture::MaskKind,
    pub alpha: f64,
    pub seq_len: usize,
    pub sequences: usize,
    pub threshold_sequences: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterRecipe {
    pub k: usize,
    pub k_max_factor: f64,
    pub max_iterations: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PackRecipe {
    /// Layers 0..dense_prefix stay dense and resident; records, centroids and predictor heads
    /// cover dense_prefix..n_layers.
    pub dense_prefix: usize,
    /// The runtime's default operating point (manifest `default_dense_from`): layers below it
    /// also run dense. Lets one preparation serve budgets from "default quality" down to
    /// "every layer after dense_prefix sparse" (`runtime --dense-from fit`).
    #[serde(default)]
    pub default_dense_from: Option<usize>,
    /// What the shipped weights are: "f16", or "native": a GGUF source's own blocks, imported
    /// a second time into `<model_dir>-native`, from which pack writes resident.safetensors
    /// as stored and version-2 records, and the scorer stage takes the gate/up blocks (the
    /// calibration stages read the f16 model either way).
    #[serde(default)]
    pub weights: Weights,
    /// Version-2 records: the type of the W_down columns, requantized along d_model: "Q8_0"
    /// (the default), "Q5_0" or "Q4_K" (d_model a multiple of 256).
    #[serde(default)]
    pub down: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Weights {
    #[default]
    F16,
    Native,
}

#[derive(Debug, Serialize)]
pub struct StageReport {
    pub stage: String,
    pub skipped: bool,
    pub seconds: f64,
}

#[derive(Debug, Serialize)]
pub struct PrepareReport {
    pub recipe: String,
    pub manifest: String,
    pub stages: Vec<StageReport>,
    pub seconds: f64,
}

/// (path, bytes, mtime) of every file under the given paths: what a stage's result depends on.
fn file_fingerprint(paths: &[PathBuf]) -> Result<Vec<(String, u64, u64)>> {
    let mut out = Vec::new();
    for p in paths {
        let files: Vec<PathBuf> = if p.is_dir() {
            let mut v: Vec<PathBuf> =
                std::fs::read_dir(p)?.filter_map(|e| e.ok().map(|e| e.path())).filter(|f| f.is_file()).collect();
            v.sort();
            v
        } else {
            vec![p.clone()]
        };
        for f in files {
            let m = std::fs::metadata(&f).with_context(|| format!("{}: missing input", f.display()))?;
            let mtime = m
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
                .unwrap_or(0);
            out.push((f.display().to_string(), m.len(), mtime));
        }
    }
    Ok(out)
}

struct Stage<'a> {
    out: &'a Path,
    reports: Vec<StageReport>,
}

impl Stage<'_> {
    /// Runs `f` unless the stamp of `name` matches `key` and every output exists.
    fn run(
        &mut self,
        name: &str,
        key: &serde_json::Value,
        outputs: &[PathBuf],
        f: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let stamp = self.out.join(format!(".stamp-{name}.json"));
        // paths inside the output folder are kept relative to it ("<out>/..."), so a copied
        // folder (another recipe's starting point) stays up to date where its inputs are
        let out_prefix = format!("{}/", self.out.display());
        let relative = |t: &str| t.replace(&out_prefix, "<out>/");
        let key_text = relative(&key.to_string());
        let parsed = |t: &str| serde_json::from_str::<serde_json::Value>(t).ok();
        let fresh = std::fs::read_to_string(&stamp)
            .ok()
            .and_then(|t| parsed(&relative(&t)))
            .is_some_and(|v| Some(v) == parsed(&key_text))
            && outputs.iter().all(|o| o.exists());
        let t0 = std::time::Instant::now();
        if fresh {
            eprintln!("prepare: {name}: up to date, skipped");
        } else {
            let _ = std::fs::remove_file(&stamp);
            f().with_context(|| format!("stage {name}"))?;
            formats::safetensors_io::write_atomic(
                &formats::safetensors_io::tmp_path(&stamp),
                &stamp,
                key_text.as_bytes(),
            )?;
            eprintln!("prepare: {name}: {:.1} s", t0.elapsed().as_secs_f64());
        }
        self.reports.push(StageReport { stage: name.to_string(), skipped: fresh, seconds: t0.elapsed().as_secs_f64() });
        Ok(())
    }
}

pub fn prepare(recipe_path: &Path, source_override: Option<&Path>, show_progress: bool) -> Result<PrepareReport> {
    let text = std::fs::read_to_string(recipe_path)
        .with_context(|| format!("{}: cannot read recipe", recipe_path.display()))?;
    let r: Recipe =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: invalid recipe: {e}", recipe_path.display()))?;
    let t_all = std::time::Instant::now();
    let model_dir = PathBuf::from(&r.model_dir);
    let native_dir = PathBuf::from(format!("{}-native", r.model_dir.trim_end_matches('/')));
    // the directory whose tensors are shipped (resident.safetensors)
    let weights_dir = if r.pack.weights == Weights::Native { native_dir.clone() } else { model_dir.clone() };
    let out = PathBuf::from(&r.out);
    std::fs::create_dir_all(&out).with_context(|| format!("{}: cannot create", out.display()))?;
    let mut st = Stage { out: &out, reports: vec![] };

    // import
    let source = source_override.map(Path::to_path_buf).or(r.source.as_ref().map(PathBuf::from));
    let model_files =
        [model_dir.join("config.json"), model_dir.join("tokenizer.json"), model_dir.join("model.safetensors")];
    match &source {
        Some(src) => {
            let key =
                serde_json::json!({"source": file_fingerprint(std::slice::from_ref(src))?, "model_dir": r.model_dir});
            st.run("import", &key, &model_files, || {
                import::import(src, &model_dir, import::ImportDtype::F16, show_progress).map(|_| ())
            })?;
            if r.pack.weights == Weights::Native {
                let native_files = [
                    native_dir.join("config.json"),
                    native_dir.join("tokenizer.json"),
                    native_dir.join("model.safetensors"),
                ];
                let key = serde_json::json!({"source": file_fingerprint(std::slice::from_ref(src))?, "model_dir": native_dir, "dtype": "native"});
                st.run("import-native", &key, &native_files, || {
                    import::import(src, &native_dir, import::ImportDtype::Native, show_progress).map(|_| ())
                })?;
            }
            // the chat template: cheap, so kept current without rerunning the import stage (a
            // directory imported before templates were kept gets it here)
            let template = import::chat_template_of(src)?;
            import::write_chat_template(&model_dir, template.as_deref())?;
            if r.pack.weights == Weights::Native {
                import::write_chat_template(&native_dir, template.as_deref())?;
            }
        }
        None if model_files.iter().all(|p| p.exists()) => {}
        None => bail!(
            "{}: no source to import and no model in {} (give SOURCE=<gguf or hf dir>)",
            recipe_path.display(),
            r.model_dir
        ),
    }
    let cfg = ModelConfig::load(&model_dir)?;
    let n_layers = cfg.num_hidden_layers;
    // checked before any stage runs: a typo must not cost the capture first
    let down = pack::down_type(r.pack.down.as_deref().unwrap_or("Q8_0"))
        .with_context(|| format!("{}: pack.down", recipe_path.display()))?;
    let d = r.pack.dense_prefix;
    if d > n_layers {
        bail!("{}: pack.dense_prefix {d} exceeds the model's {n_layers} layers", recipe_path.display());
    }
    if let Some(l) = r.pack.default_dense_from {
        if l < d || l > n_layers {
            bail!(
                "{}: pack.default_dense_from {l} is outside dense_prefix..=n_layers ({d}..={n_layers})",
                recipe_path.display()
            );
        }
    }
    if r.pack.weights != Weights::Native && r.pack.down.is_some() {
        bail!(
            "{}: pack.down applies to version-2 records (pack.weights = \"native\"); f16 records hold f16 down rows",
            recipe_path.display()
        );
    }
    // the sparse layers' record shape (gate/up type, down type and d_model agree), before any
    // stage runs; the manifest says it
    let record_shape = pack::record_shape_of(&weights_dir, d.min(n_layers.saturating_sub(1)), down)
        .with_context(|| format!("{}: pack.down = \"{}\"", recipe_path.display(), down.name()))?;
    let model_fp = file_fingerprint(&model_files)?;

    // capture
    let cap_dir = out.join("capture");
    let corpus = capture::expand_corpus(&r.capture.corpus.iter().map(PathBuf::from).collect::<Vec<_>>())?;
    let cs = capture::CaptureSettings {
        mask_kind: r.capture.mask_kind,
        alpha: r.capture.alpha,
        seq_len: r.capture.seq_len,
        sequences: r.capture.sequences,
        threshold_sequences: r.capture.threshold_sequences,
        corpus: corpus.iter().map(|p| p.display().to_string()).collect(),
        shard_index: 0,
        shard_count: 1,
        thresholds_from: None,
    };
    let key = serde_json::json!({"model": model_fp, "settings": cs, "corpus": file_fingerprint(&corpus)?});
    st.run("capture", &key, &[cap_dir.join("masks-000-of-001.arrow"), cap_dir.join("thresholds.json")], || {
        capture::capture(&model_dir, &cap_dir, &cs, show_progress).map(|_| ())
    })?;

    // importance: per-neuron mean contribution, on the first of capture's sequences
    let imp_path = out.join("importance/importance.safetensors");
    let key = serde_json::json!({"model": model_fp, "seq_len": r.capture.seq_len, "settings": r.importance, "corpus": file_fingerprint(&corpus)?});
    st.run("importance", &key, std::slice::from_ref(&imp_path), || {
        importance::importance(&model_dir, &corpus, r.capture.seq_len, r.importance.sequences, &imp_path, show_progress)
            .map(|_| ())
    })?;

    // cluster: layer 0 (the predictor's input) and the sparse layers
    let cl_dir = out.join("cluster");
    let cls = cluster::ClusterSettings {
        k: r.cluster.k,
        k_max_factor: r.cluster.k_max_factor,
        k_max: None,
        max_iterations: r.cluster.max_iterations,
        layers: Some(vec![(0, 1), (d.max(1), n_layers)]),
        seed: 0,
    };
    let key = serde_json::json!({"capture": file_fingerprint(&[cap_dir.join("masks-000-of-001.arrow")])?, "k": cls.k,
        "k_max_factor": cls.k_max_factor, "max_iterations": cls.max_iterations, "dense_prefix": d, "labels": "best-cover"});
    let cluster_json = cl_dir.join("cluster.json");
    st.run(
        "cluster",
        &key,
        &[cl_dir.join("centroids.safetensors"), cl_dir.join("labels.safetensors"), cluster_json.clone()],
        || cluster::cluster(&cap_dir, &cl_dir, &cls, show_progress).map(|_| ()),
    )?;

    // train: the shared predictor, when the recipe asks for it
    let tr_dir = out.join("predictor");
    let predictor_path = tr_dir.join("predictor.safetensors");
    if let Some(settings) = &r.train {
        let key = serde_json::json!({"capture": file_fingerprint(&[cap_dir.join("masks-000-of-001.arrow")])?,
            "cluster": file_fingerprint(&[cl_dir.join("labels.safetensors"), cl_dir.join("centroids.safetensors")])?,
            "dense_prefix": d, "settings": settings});
        st.run("train", &key, &[predictor_path.clone(), tr_dir.join("train.json")], || {
            train::train(&model_dir, &cap_dir, &cl_dir, d, &tr_dir, settings, show_progress).map(|_| ())
        })?;
    }

    // layers: the per-layer predictors of the sparse layers, when the recipe asks for them
    let lp_dir = out.join("layers");
    let lp_path = lp_dir.join("layer_predictors.safetensors");
    if let Some(settings) = &r.layers {
        let key = serde_json::json!({"model": model_fp, "seq_len": r.capture.seq_len, "first_layer": d, "settings": settings, "corpus": file_fingerprint(&corpus)?});
        st.run("layers", &key, &[lp_path.clone(), lp_dir.join("layers.json")], || {
            layers::train_layers(&model_dir, &corpus, r.capture.seq_len, d, &lp_dir, settings, show_progress)
                .map(|_| ())
        })?;
    }
    let predictors = r.layers.is_some().then_some(lp_path.as_path());

    // pack
    let weights_fp = if weights_dir == model_dir {
        model_fp.clone()
    } else {
        file_fingerprint(&[weights_dir.join("config.json"), weights_dir.join("model.safetensors")]).with_context(
            || {
                format!(
                    "{}: pack.weights = \"native\" needs the GGUF's own blocks there (give a GGUF source)",
                    weights_dir.display()
                )
            },
        )?
    };
    let mut key = serde_json::json!({"model": weights_fp, "dense_prefix": d});
    if weights_dir != model_dir {
        key["records_version"] = serde_json::json!(2);
        // (named only when not the default, so preparations made before `down` existed stay
        // up to date)
        if down != formats::ggml_quants::GgmlType::Q8_0 {
            key["down"] = serde_json::json!(down.name());
        }
    }
    st.run("pack", &key, &[out.join("records.bin"), out.join("resident.safetensors")], || {
        pack::pack(&weights_dir, d, down, &out, show_progress).map(|_| ())
    })?;

    // dense_mlp: a native preparation's MLPs in the GGUF's own blocks, for the layers a run
    // computes dense (an f16 preparation's records rebuild them exactly)
    let dense_mlp_path = out.join("dense_mlp.safetensors");
    let native = weights_dir != model_dir;
    if native {
        let key = serde_json::json!({"model": weights_fp, "dense_prefix": d});
        st.run("dense_mlp", &key, std::slice::from_ref(&dense_mlp_path), || {
            pack::dense_mlp(&weights_dir, d, &dense_mlp_path).map(|_| ())
        })?;
    } else if dense_mlp_path.exists() {
        std::fs::remove_file(&dense_mlp_path)?;
    }

    // scorer: the resident 4-bit gate/up rows of the sparse layers (`--strategy scorer`),
    // the output head in Q8_0 (`-X head=q8`) and in 4 bits (the whole-record strategies' head)
    let scorer_path = out.join("scorer/scorer.safetensors");
    let head_path = out.join("scorer/head_q8.safetensors");
    let head_compact_path = out.join("scorer/head_compact.safetensors");
    // (a native preparation: the scorer is the model's own gate/up blocks)
    let key = if weights_dir == model_dir {
        serde_json::json!({"model": model_fp, "dense_prefix": d, "quant": "q4_0", "head": "q8_0", "head_compact": "q4_k"})
    } else {
        serde_json::json!({"model": weights_fp, "dense_prefix": d, "quant": "native", "head": "q8_0", "head_compact": "q4_k"})
    };
    st.run("scorer", &key, &[scorer_path.clone(), head_path.clone(), head_compact_path.clone()], || {
        scorer::scorer(&weights_dir, d, &scorer_path, show_progress)?;
        scorer::heads(&weights_dir, &head_path, &head_compact_path)
    })?;

    // sketch: the resident few-bit gate/up rows of the sparse layers (`--strategy sketch`),
    // weighted by the calibration inputs
    let sketch_path = out.join("sketch/sketch.safetensors");
    let calibration = crate::sketch::Calibration {
        corpus: corpus.clone(),
        seq_len: r.capture.seq_len,
        sequences: r.sketch.sequences,
    };
    let key = serde_json::json!({"model": weights_fp, "dense_prefix": d, "settings": r.sketch, "seq_len": r.capture.seq_len, "corpus": file_fingerprint(&corpus)?});
    st.run("sketch", &key, std::slice::from_ref(&sketch_path), || {
        crate::sketch::sketch(&weights_dir, d, r.sketch.bits, &calibration, &sketch_path, show_progress).map(|_| ())
    })?;

    // reuse: the reuse table of the scorer, sketch and layers strategies, which runtime
    // plan reads
    let reuse_path = out.join("scorer/reuse.json");
    let predictors_fp = match predictors {
        Some(p) => serde_json::json!(file_fingerprint(&[p.to_path_buf()])?),
        None => serde_json::Value::Null,
    };
    let key = serde_json::json!({"model": weights_fp, "scorer": file_fingerprint(std::slice::from_ref(&scorer_path))?, "sketch": file_fingerprint(std::slice::from_ref(&sketch_path))?, "predictors": predictors_fp, "seq_len": r.capture.seq_len, "settings": r.reuse, "scorer_resident_bonus": runtime::scorer::SCORER_RESIDENT_BONUS, "sketch_resident_bonus": runtime::select::layered::SKETCH_RESIDENT_BONUS, "corpus": file_fingerprint(&corpus)?});
    st.run("reuse", &key, std::slice::from_ref(&reuse_path), || {
        crate::reuse::reuse(
            &weights_dir,
            &scorer_path,
            &sketch_path,
            predictors,
            d,
            &corpus,
            r.capture.seq_len,
            &r.reuse,
            &reuse_path,
        )
        .map(|_| ())
    })?;

    // manifest
    let cl: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&cluster_json)?)?;
    let mut k_max = vec![0usize; n_layers - d];
    for l in cl["layers"].as_array().context("cluster.json: no layers")? {
        let layer = crate::shards::layer_of(l["column"].as_str().unwrap_or(""));
        if layer >= d {
            // gate-up has a gate and an up column per layer: the buffer must hold the larger set
            k_max[layer - d] = k_max[layer - d].max(l["k_max"].as_u64().unwrap_or(0) as usize);
        }
    }
    // the tokenizer travels with the artifacts: the folder alone is what goes to the device
    let tok_path = out.join("tokenizer.json");
    let tok_bytes = std::fs::read(model_dir.join("tokenizer.json"))?;
    if std::fs::read(&tok_path).ok().as_deref() != Some(&tok_bytes[..]) {
        formats::safetensors_io::write_atomic(&formats::safetensors_io::tmp_path(&tok_path), &tok_path, &tok_bytes)?;
    }
    // the chat template travels too (runtime chat / serve), when the model has one
    let template_path = out.join(formats::model_dir::CHAT_TEMPLATE_FILE);
    let template = std::fs::read(model_dir.join(formats::model_dir::CHAT_TEMPLATE_FILE)).ok();
    match &template {
        Some(t) if std::fs::read(&template_path).ok().as_ref() != Some(t) => formats::safetensors_io::write_atomic(
            &formats::safetensors_io::tmp_path(&template_path),
            &template_path,
            t,
        )?,
        Some(_) => {}
        None if template_path.exists() => std::fs::remove_file(&template_path)?,
        None => {}
    }
    let mut artifacts = Vec::new();
    let chat_template = template.is_some().then(|| ("chat_template", template_path.clone()));
    let dense_mlp = native.then(|| (formats::dense_mlp::ARTIFACT_ROLE, dense_mlp_path.clone()));
    for (role, path) in [
        ("records", out.join("records.bin")),
        ("resident", out.join("resident.safetensors")),
        ("centroids", cl_dir.join("centroids.safetensors")),
        ("thresholds", cap_dir.join("thresholds.json")),
        ("importance", imp_path.clone()),
        ("scorer", scorer_path.clone()),
        (runtime::layer_predictor::SKETCH_ROLE, sketch_path.clone()),
        ("head_q8", head_path.clone()),
        (formats::head_compact::ARTIFACT_ROLE, head_compact_path.clone()),
        (formats::reuse_table::ARTIFACT_ROLE, reuse_path.clone()),
        ("tokenizer", tok_path.clone()),
    ]
    .into_iter()
    .chain(r.train.is_some().then(|| ("predictor", predictor_path.clone())))
    .chain(r.layers.is_some().then(|| (runtime::layer_predictor::ARTIFACT_ROLE, lp_path.clone())))
    .chain(dense_mlp)
    .chain(chat_template)
    {
        let rel = pathdiff(&path, &out);
        artifacts.push(Artifact {
            role: role.into(),
            path: rel,
            bytes: std::fs::metadata(&path)?.len(),
            sha256: sha256_file(&path)?,
        });
    }
    let mut settings = BTreeMap::new();
    settings.insert("recipe".to_string(), text.clone());
    let manifest = Manifest {
        format_version: MANIFEST_FORMAT_VERSION,
        model_name: r.name.clone(),
        model: cfg.clone(),
        sparsity: SparsitySettings {
            mask_kind: serde_json::to_value(r.capture.mask_kind)?.as_str().unwrap_or("").to_string(),
            alpha: r.capture.alpha,
            dense_prefix: d,
            default_dense_from: r.pack.default_dense_from,
            centroids: r.cluster.k,
            k_max,
        },
        records: RecordsLayout {
            path: "records.bin".into(),
            record_bytes: record_shape.map_or(record_bytes(cfg.hidden_size), |s| s.record_bytes()),
            gate_up_type: record_shape.map(|s| s.gate_up.name().to_string()),
            down_type: record_shape.map(|s| s.down.name().to_string()),
            first_layer: d,
            neurons_per_layer: cfg.intermediate_size,
            count: (n_layers - d) * cfg.intermediate_size,
        },
        artifacts,
        provenance: Provenance {
            prep_version: env!("CARGO_PKG_VERSION").into(),
            source: source.as_ref().map(|s| s.display().to_string()).unwrap_or_else(|| r.model_dir.clone()),
            source_sha256: match &source {
                Some(s) if s.is_file() => sha256_file(s)?,
                _ => String::new(),
            },
            created_unix_s: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            settings,
        },
    };
    let manifest_path = out.join("manifest.toml");
    // unchanged but for its creation time: keep the file, so the runtime's sha256 stamp of the
    // artifact set (keyed by the manifest's bytes) stays valid
    let unchanged = Manifest::load(&manifest_path).ok().is_some_and(|old| {
        let mut old = old;
        old.provenance.created_unix_s = manifest.provenance.created_unix_s;
        old == manifest
    });
    if !unchanged {
        manifest.save(&manifest_path)?;
    }
    Ok(PrepareReport {
        recipe: recipe_path.display().to_string(),
        manifest: manifest_path.display().to_string(),
        stages: st.reports,
        seconds: t_all.elapsed().as_secs_f64(),
    })
}

/// `path` relative to `base` when it lies below it, else absolute.
fn pathdiff(path: &Path, base: &Path) -> String {
    match path.strip_prefix(base) {
        Ok(rel) => rel.display().to_string(),
        Err(_) => std::fs::canonicalize(path).unwrap_or(path.to_path_buf()).display().to_string(),
    }
}
