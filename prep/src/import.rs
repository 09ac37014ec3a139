//! `prep import`: a GGUF file or a Hugging Face directory -> the canonical model directory
//! (`config.json`, `tokenizer.json`, `model.safetensors` with Hugging Face tensor names).
//!
//! `--dtype f16` (the default today) dequantizes every tensor to f16: the reference the
//! preparation stages read. `--dtype native` keeps a GGUF's own blocks (Q4_0, Q4_1, Q5_0, Q8_0,
//! Q4_K, Q6_K) byte for byte, as U8 rows named in the `ggml_types` metadata
//! (`formats::safetensors_io`), and its F32/F16 tensors as they are: no f16 copy.

use anyhow::{bail, Context, Result};
use formats::ggml_quants::GgmlType;
use formats::gguf::{GgufFile, GgufTensorInfo};
use formats::model_dir::{self, Architecture, ModelConfig};
use formats::safetensors_io::{self, MappedSafetensors, RawTensor};
use formats::FormatError;
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use safetensors::Dtype;
use serde::Serialize;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct ImportSummary {
    pub source: String,
    pub out: String,
    pub architecture: String,
    pub tensors: usize,
    pub parameters: u64,
    pub safetensors_bytes: u64,
}

/// What the imported weights are stored as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImportDtype {
    /// Every tensor dequantized to f16.
    F16,
    /// A GGUF's own types, blocks byte-equal to the file's.
    Native,
}

/// `--quantize`: the block type every weight matrix is requantized to (from f16/bf16, or a
/// GGUF's blocks dequantized exactly).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
pub enum QuantizeTo {
    /// llama.cpp's quantize_row_q8_0_ref: per 32 values d = max|x| / 127, q = round(x / d).
    #[value(name = "Q8_0")]
    Q8_0,
    /// llama.cpp's quantize_row_q4_K_ref (no importance matrix): weighted make_qkx2 search for
    /// each 32 values' scale and minimum, 6-bit requantized per 256.
    #[value(name = "Q4_K")]
    Q4K,
}

impl QuantizeTo {
    fn ggml(self) -> GgmlType {
        match self {
            QuantizeTo::Q8_0 => GgmlType::Q8_0,
            QuantizeTo::Q4K => GgmlType::Q4K,
        }
    }

    /// `w` `[rows, cols]` as rows of blocks.
    fn quantize(self, w: &[f32]) -> Vec<u8> {
        match self {
            QuantizeTo::Q8_0 => formats::ggml_quants::quantize_q8_0(w),
            QuantizeTo::Q4K => formats::ggml_quants::quantize_q4_k(w),
        }
    }
}

/// A weight matrix `[rows, cols]` of f32 values quantized to `q` (its rows must be whole blocks).
fn quantized_tensor(path: &Path, name: String, shape: Vec<usize>, values: &[f32], q: QuantizeTo) -> Result<Imported1> {
    let t = q.ggml();
    let cols = shape[1];
    if !cols.is_multiple_of(t.block_elements()) {
        bail!(
            "{}: tensor '{name}' has rows of {cols} values, not whole {} blocks of {}: --quantize {} cannot hold it",
            path.display(),
            t.name(),
            t.block_elements(),
            t.name()
        );
    }
    let bytes = q.quantize(values);
    let row_bytes = bytes.len() / shape[0];
    Ok(Imported1 {
        raw: RawTensor { name, dtype: Dtype::U8, shape: vec![shape[0], row_bytes], bytes },
        shape,
        ggml: Some(t),
    })
}

/// One imported tensor: its bytes as stored, its logical shape, and its GGML block type when
/// quantized (then `raw` is U8 `[rows, row_bytes]`).
struct Imported1 {
    raw: RawTensor,
    shape: Vec<usize>,
    ggml: Option<GgmlType>,
}

impl Imported1 {
    fn f16(name: String, shape: Vec<usize>, data: &[f16]) -> Self {
        Imported1 {
            raw: RawTensor {
                name,
                dtype: Dtype::F16,
                shape: shape.clone(),
                bytes: bytemuck::cast_slice(data).to_vec(),
            },
            shape,
            ggml: None,
        }
    }
}

pub fn import(input: &Path, out: &Path, dtype: ImportDtype, show_progress: bool) -> Result<ImportSummary> {
    import_as(input, out, dtype, None, false, show_progress)
}

/// The file an import writes first into its output folder: what marks a folder as an earlier
/// `prep import`'s (which a later import may overwrite), as opposed to someone else's.
pub const IMPORT_MARKER: &str = ".prep-import";

/// Refuses to import into a folder that holds files and is not an earlier import's output
/// (unless `overwrite`): a Hugging Face folder's own config.json and weights would be lost.
fn check_output_folder(out: &Path, overwrite: bool) -> Result<()> {
    let Ok(entries) = std::fs::read_dir(out) else { return Ok(()) };
    let names: Vec<String> =
        entries.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    if names.is_empty() || overwrite || names.iter().any(|n| n == IMPORT_MARKER) {
        return Ok(());
    }
    let mut shown: Vec<&str> = names.iter().map(String::as_str).take(3).collect();
    shown.sort_unstable();
    bail!(
        "{}: not empty ({} entries: {}{}) and not an earlier prep import's output: importing would overwrite its config.json, tokenizer.json and model.safetensors; import into an empty folder (or overwrite it on purpose with --force)",
        out.display(),
        names.len(),
        shown.join(", "),
        if names.len() > 3 { ", ..." } else { "" }
    )
}

/// `quantize`: every weight matrix requantized to that type (norms and biases stay F32).
pub fn import_as(
    input: &Path,
    out: &Path,
    dtype: ImportDtype,
    quantize: Option<QuantizeTo>,
    overwrite: bool,
    show_progress: bool,
) -> Result<ImportSummary> {
    if !input.exists() {
        bail!("{}: no such file or directory", input.display());
    }
    check_output_folder(out, overwrite)?;
    std::fs::create_dir_all(out).with_context(|| format!("{}: cannot create output directory", out.display()))?;
    let (config, tokenizer, tensors) = if input.is_dir() {
        if dtype == ImportDtype::Native && quantize.is_none() {
            bail!("{}: --dtype native keeps a GGUF's own blocks; a Hugging Face directory is imported as f16 (--dtype f16) or quantized (--quantize Q8_0|Q4_K)", input.display());
        }
        import_hf_dir(input, quantize, show_progress)?
    } else {
        import_gguf(input, dtype, quantize, show_progress)?
    };
    // before the first output file, so that an import cut short (killed, a full disk) leaves a folder a rerun may take
    let marker = out.join(IMPORT_MARKER);
    std::fs::write(&marker, format!("{{\"source\": {:?}}}\n", input.display().to_string()))
        .with_context(|| format!("{}: cannot write", marker.display()))?;
    // The tokenizer must cover the embedding rows the model has.
    let tok_path = out.join(model_dir::TOKENIZER_FILE);
    let parameters: u64 = tensors.iter().map(|t| t.shape.iter().product::<usize>() as u64).sum();
    let st_path = out.join("model.safetensors");
    let metadata =
        safetensors_io::ggml_types_metadata(tensors.iter().filter_map(|t| t.ggml.map(|g| (t.raw.name.as_str(), g))));
    let raws: Vec<RawTensor> = tensors.into_iter().map(|t| t.raw).collect();
    let n_tensors = raws.len();
    safetensors_io::write_raw_safetensors(&st_path, &raws, metadata)?;
    safetensors_io::write_atomic(&safetensors_io::tmp_path(&tok_path), &tok_path, tokenizer.as_bytes())?;
    write_chat_template(out, chat_template_of(input)?.as_deref())?;
    let cfg_path = out.join(model_dir::CONFIG_FILE);
    let cfg_text = serde_json::to_string_pretty(&config)?;
    safetensors_io::write_atomic(&safetensors_io::tmp_path(&cfg_path), &cfg_path, cfg_text.as_bytes())?;
    Ok(ImportSummary {
        source: input.display().to_string(),
        out: out.display().to_string(),
        architecture: config.model_type.clone(),
        tensors: n_tensors,
        parameters,
        safetensors_bytes: std::fs::metadata(&st_path)?.len(),
    })
}

/// The chat template a source ships: a GGUF's `tokenizer.chat_template`, or a Hugging Face
/// directory's `chat_template.jinja` or `tokenizer_config.json` `chat_template` (a string, or
/// named templates of which "default" is the one `apply_chat_template` uses). None when it has none.
pub fn chat_template_of(input: &Path) -> Result<Option<String>> {
    if input.is_file() {
        let g = GgufFile::open(input)?;
        return match g.get("tokenizer.chat_template") {
            None => Ok(None),
            Some(v) => Ok(Some(
                v.as_str()
                    .with_context(|| format!("{}: tokenizer.chat_template is not a string", input.display()))?
                    .to_string(),
            )),
        };
    }
    let jinja = input.join(model_dir::CHAT_TEMPLATE_FILE);
    if jinja.is_file() {
        return Ok(Some(std::fs::read_to_string(&jinja).with_context(|| format!("{}: cannot read", jinja.display()))?));
    }
    let cfg_path = input.join("tokenizer_config.json");
    if !cfg_path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&cfg_path).with_context(|| format!("{}: cannot read", cfg_path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{}: not JSON", cfg_path.display()))?;
    match &v["chat_template"] {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(t) => Ok(Some(t.clone())),
        serde_json::Value::Array(named) => named
            .iter()
            .find(|t| t["name"] == "default")
            .and_then(|t| t["template"].as_str())
            .map(|t| Some(t.to_string()))
            .with_context(|| {
                format!("{}: chat_template lists named templates but none is \"default\"", cfg_path.display())
            }),
        _ => bail!("{}: chat_template is neither a string nor a list of named templates", cfg_path.display()),
    }
}

/// Writes `<dir>/chat_template.jinja`, or removes a stale one when the source has no template.
pub fn write_chat_template(dir: &Path, template: Option<&str>) -> Result<()> {
    let path = dir.join(model_dir::CHAT_TEMPLATE_FILE);
    match template {
        Some(t) if std::fs::read_to_string(&path).ok().as_deref() != Some(t) => {
            safetensors_io::write_atomic(&safetensors_io::tmp_path(&path), &path, t.as_bytes())?
        }
        Some(_) => {}
        None if path.exists() => {
            std::fs::remove_file(&path).with_context(|| format!("{}: cannot remove", path.display()))?
        }
        None => {}
    }
    Ok(())
}

fn progress(n: usize, show: bool, msg: &'static str) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(n as u64);
    pb.set_style(ProgressStyle::with_template("{msg} [{bar:40}] {pos}/{len} tensors ({elapsed})").unwrap());
    pb.set_message(msg);
    pb
}

/// llama.cpp's converter permutes the rows of q_proj/k_proj of llama-family models so that
/// RoPE rotates adjacent pairs; Hugging Face layout rotates the two halves of each head.
/// This undoes it: GGUF row (h, b, a) holds HF row (h, a, b), with a in {0,1}, b < head_dim/2.
/// `w` is `rows` rows (of f32 values, or of a GGUF's block bytes: whole rows move).
fn unpermute_rope_rows<T: Copy + Default>(w: &[T], n_heads: usize, rows: usize) -> Vec<T> {
    let cols = w.len() / rows;
    let head_dim = rows / n_heads;
    let half = head_dim / 2;
    let mut out = vec![T::default(); w.len()];
    for h in 0..n_heads {
        for a in 0..2 {
            for b in 0..half {
                let hf_row = h * head_dim + a * half + b;
                let gguf_row = h * head_dim + b * 2 + a;
                out[hf_row * cols..(hf_row + 1) * cols].copy_from_slice(&w[gguf_row * cols..(gguf_row + 1) * cols]);
            }
        }
    }
    out
}

/// GGUF tensor name -> Hugging Face name.
fn hf_name(gguf_name: &str) -> Option<String> {
    Some(match gguf_name {
        "token_embd.weight" => model_dir::EMBED_TOKENS.to_string(),
        "output_norm.weight" => model_dir::FINAL_NORM.to_string(),
        "output.weight" => model_dir::LM_HEAD.to_string(),
        _ => {
            let rest = gguf_name.strip_prefix("blk.")?;
            let (layer, suffix) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let n = model_dir::layer_tensor_names(layer);
            match suffix {
                "attn_norm.weight" => n.attn_norm,
                "attn_q.weight" => n.q_proj,
                "attn_k.weight" => n.k_proj,
                "attn_v.weight" => n.v_proj,
                "attn_output.weight" => n.o_proj,
                "attn_q.bias" => n.q_bias,
                "attn_k.bias" => n.k_bias,
                "attn_v.bias" => n.v_bias,
                "ffn_norm.weight" => n.mlp_norm,
                "ffn_gate.weight" => n.gate_proj,
                "ffn_up.weight" => n.up_proj,
                "ffn_down.weight" => n.down_proj,
                _ => return None,
            }
        }
    })
}

fn gguf_config(g: &GgufFile) -> Result<(ModelConfig, Architecture)> {
    let arch_name = g.require_str("general.architecture")?;
    let arch = Architecture::from_model_type(arch_name)
        .ok_or_else(|| FormatError::UnsupportedArchitecture { path: g.path.clone(), arch: arch_name.to_string() })?;
    let k = |s: &str| format!("{arch_name}.{s}");
    let n_vocab = g.require_str_array("tokenizer.ggml.tokens")?.len();
    let head_count = g.require_u64(&k("attention.head_count"))? as usize;
    let hidden = g.require_u64(&k("embedding_length"))? as usize;
    // optional keys: absent is a default, present with another type is an error
    let head_dim = g.optional_u64(&k("attention.key_length"))?.map(|v| v as usize);
    let eos = g.optional_u64("tokenizer.ggml.eos_token_id")?;
    let vocab = g.optional_u64(&k("vocab_size"))?.map(|v| v as usize);
    // the rotary dimension: llama.cpp rotates rope.dimension_count dimensions of each head; we
    // rotate the whole head, so any other value would compute another model
    let head_dim_of = head_dim.unwrap_or(hidden / head_count.max(1));
    if let Some(d) = g.optional_u64(&k("rope.dimension_count"))?.filter(|&d| d as usize != head_dim_of) {
        return Err(FormatError::invalid(
            &g.path,
            format!("{arch_name}.rope.dimension_count is {d}; only the whole head ({head_dim_of}) is rotated here"),
        )
        .into());
    }
    let cfg = ModelConfig {
        model_type: arch_name.to_string(),
        architectures: vec![match arch {
            Architecture::Llama => "LlamaForCausalLM".into(),
            Architecture::Qwen2 => "Qwen2ForCausalLM".into(),
        }],
        hidden_size: hidden,
        intermediate_size: g.require_u64(&k("feed_forward_length"))? as usize,
        num_hidden_layers: g.require_u64(&k("block_count"))? as usize,
        num_attention_heads: head_count,
        num_key_value_heads: Some(g.optional_u64(&k("attention.head_count_kv"))?.unwrap_or(head_count as u64) as usize),
        head_dim: head_dim.filter(|&d| d != hidden / head_count),
        rms_norm_eps: g.require_f64(&k("attention.layer_norm_rms_epsilon"))?,
        rope_theta: g.optional_f64(&k("rope.freq_base"))?.unwrap_or(10000.0),
        vocab_size: vocab.unwrap_or(n_vocab),
        max_position_embeddings: g.optional_u64(&k("context_length"))?.unwrap_or(2048) as usize,
        tie_word_embeddings: g.tensor("output.weight").is_none(),
        bos_token_id: g.optional_u64("tokenizer.ggml.bos_token_id")?.map(|v| v as u32),
        eos_token_id: eos.map(|v| serde_json::json!(v)),
        rope_scaling: None,
        torch_dtype: Some("float16".into()),
    };
    cfg.validate(&g.path)?;
    Ok((cfg, arch))
}

type Imported = (ModelConfig, String, Vec<Imported1>);

fn import_gguf(path: &Path, dtype: ImportDtype, quantize: Option<QuantizeTo>, show_progress: bool) -> Result<Imported> {
    let g = GgufFile::open(path)?;
    let (mut cfg, arch) = gguf_config(&g)?;
    if dtype == ImportDtype::Native || quantize.is_some() {
        cfg.torch_dtype = None;
    }
    let tokenizer = crate::tokenizer_json::tokenizer_json_from_gguf(&g)?;
    // the vocabulary must make a tokenizer now, not at the first run, and fit the embedding
    let parsed: tokenizers::Tokenizer = tokenizer
        .to_string()
        .parse()
        .map_err(|e| anyhow::anyhow!("{}: the GGUF's vocabulary does not make a tokenizer: {e}", path.display()))?;
    let pb = progress(
        g.tensors.len(),
        show_progress,
        match (dtype, quantize) {
            (_, Some(_)) => "quantizing",
            (ImportDtype::F16, None) => "dequantizing",
            (ImportDtype::Native, None) => "copying",
        },
    );
    // norms and biases are F32 (or F16) in every GGUF llama.cpp writes: another type there is
    // a damaged file that would import and run as garbage
    for t in &g.tensors {
        if (t.name.ends_with("norm.weight") || t.name.ends_with(".bias")) && !matches!(t.ggml_type_id, 0 | 1) {
            bail!(
                "{}: tensor '{}' is {}: a norm or bias must be F32 or F16",
                path.display(),
                t.name,
                formats::ggml_quants::type_name(t.ggml_type_id)
            );
        }
    }
    let tensors: Vec<Imported1> = g
        .tensors
        .par_iter()
        .map(|info| {
            let name = hf_name(&info.name).with_context(|| {
                format!(
                    "{}: tensor '{}' has no Hugging Face counterpart in a {} model",
                    path.display(),
                    info.name,
                    cfg.model_type
                )
            })?;
            let shape = info.shape_row_major();
            let rope_heads = (arch == Architecture::Llama
                && (info.name.ends_with("attn_q.weight") || info.name.ends_with("attn_k.weight")))
            .then(|| if info.name.ends_with("attn_q.weight") { cfg.num_attention_heads } else { cfg.n_kv_heads() });
            let t = match (dtype, quantize) {
                (ImportDtype::Native, None) => native_tensor(path, &g, info, name, shape, rope_heads)?,
                _ => {
                    let mut values = g.dequantize_f32(&info.name)?;
                    if let Some(n_heads) = rope_heads {
                        values = unpermute_rope_rows(&values, n_heads, shape[0]);
                    }
                    match quantize {
                        Some(q) if shape.len() == 2 => quantized_tensor(path, name, shape, &values, q)?,
                        Some(_) => Imported1 {
                            raw: RawTensor {
                                name,
                                dtype: Dtype::F32,
                                shape: shape.clone(),
                                bytes: bytemuck::cast_slice(&values).to_vec(),
                            },
                            shape,
                            ggml: None,
                        },
                        None => {
                            Imported1::f16(name, shape, &values.iter().map(|&x| f16::from_f32(x)).collect::<Vec<_>>())
                        }
                    }
                }
            };
            pb.inc(1);
            Ok(t)
        })
        .collect::<Result<_>>()?;
    pb.finish_and_clear();
    check_tensor_set(path, &cfg, arch, &tensors)?;
    let rows = g.tensor("token_embd.weight").and_then(|t| t.ne.get(1).copied()).unwrap_or(0) as usize;
    let ids = parsed.get_vocab_size(true);
    if rows > 0 && ids > rows {
        bail!("{}: the vocabulary has {ids} tokens, but token_embd.weight has {rows} rows", path.display());
    }
    Ok((cfg, serde_json::to_string(&tokenizer)?, tensors))
}

/// A GGUF tensor as it is: blocks (rows un-permuted for RoPE where llama.cpp permuted them),
/// or its F32/F16/BF16 values.
fn native_tensor(
    path: &Path,
    g: &GgufFile,
    info: &GgufTensorInfo,
    name: String,
    shape: Vec<usize>,
    rope_heads: Option<usize>,
) -> Result<Imported1> {
    let ty = GgmlType::from_id(info.ggml_type_id).filter(|t| t.is_supported()).ok_or_else(|| {
        FormatError::UnsupportedTensorType {
            path: path.to_path_buf(),
            tensor: info.name.clone(),
            type_id: info.ggml_type_id,
            type_name: formats::ggml_quants::type_name(info.ggml_type_id).into(),
        }
    })?;
    let bytes = g.tensor_bytes(info);
    let rows = if shape.len() == 2 { shape[0] } else { 1 };
    let bytes = match rope_heads {
        Some(n_heads) => unpermute_rope_rows(bytes, n_heads, rows),
        None => bytes.to_vec(),
    };
    Ok(match ty {
        GgmlType::F32 => {
            Imported1 { raw: RawTensor { name, dtype: Dtype::F32, shape: shape.clone(), bytes }, shape, ggml: None }
        }
        GgmlType::F16 => {
            Imported1 { raw: RawTensor { name, dtype: Dtype::F16, shape: shape.clone(), bytes }, shape, ggml: None }
        }
        GgmlType::BF16 => {
            Imported1 { raw: RawTensor { name, dtype: Dtype::BF16, shape: shape.clone(), bytes }, shape, ggml: None }
        }
        t => {
            if shape.len() != 2 {
                bail!(
                    "{}: tensor '{}' is {} with shape {shape:?}: only matrices are kept quantized",
                    path.display(),
                    info.name,
                    t.name()
                );
            }
            let row_bytes = bytes.len() / rows;
            Imported1 {
                raw: RawTensor { name, dtype: Dtype::U8, shape: vec![rows, row_bytes], bytes },
                shape,
                ggml: Some(t),
            }
        }
    })
}

fn import_hf_dir(dir: &Path, quantize: Option<QuantizeTo>, show_progress: bool) -> Result<Imported> {
    let cfg = ModelConfig::load(dir)?;
    let arch = cfg.validate(&dir.join(model_dir::CONFIG_FILE))?;
    let tok_path = dir.join(model_dir::TOKENIZER_FILE);
    let tokenizer =
        std::fs::read_to_string(&tok_path).with_context(|| format!("{}: cannot read", tok_path.display()))?;
    let mut tensors = Vec::new();
    for file in model_dir::safetensors_files(dir)? {
        let st = MappedSafetensors::open(&file)?;
        let pb = progress(st.tensors.len(), show_progress, "converting");
        let mut names: Vec<&String> = st.tensors.keys().collect();
        names.sort();
        for name in names {
            let e = &st.tensors[name];
            if name.ends_with("rotary_emb.inv_freq") {
                continue;
            }
            let shape = e.logical_shape();
            tensors.push(match quantize {
                Some(q) if shape.len() == 2 => {
                    let values: Vec<f32> = st.f16_values(name, e)?.iter().map(|v| v.to_f32()).collect();
                    quantized_tensor(dir, name.clone(), shape, &values, q)?
                }
                _ => Imported1::f16(name.clone(), shape, &st.f16_values(name, e)?),
            });
            pb.inc(1);
        }
        pb.finish_and_clear();
    }
    check_tensor_set(dir, &cfg, arch, &tensors)?;
    Ok((cfg, tokenizer, tensors))
}

/// Every tensor the runtime needs is present with the shape the config implies.
fn check_tensor_set(path: &Path, cfg: &ModelConfig, arch: Architecture, tensors: &[Imported1]) -> Result<()> {
    let find = |name: &str| tensors.iter().find(|t| t.raw.name == name);
    let expected = std::cell::RefCell::new(std::collections::HashSet::new());
    let expect = |name: &str, shape: Vec<usize>| -> Result<()> {
        expected.borrow_mut().insert(name.to_string());
        let t = find(name)
            .ok_or_else(|| FormatError::MissingTensor { path: path.to_path_buf(), tensor: name.to_string() })?;
        if t.shape != shape {
            return Err(FormatError::ShapeMismatch {
                path: path.to_path_buf(),
                tensor: name.to_string(),
                expected: shape,
                actual: t.shape.clone(),
            }
            .into());
        }
        Ok(())
    };
    let (d, ff, hd) = (cfg.hidden_size, cfg.intermediate_size, cfg.head_dim());
    let (q_dim, kv_dim) = (cfg.num_attention_heads * hd, cfg.n_kv_heads() * hd);
    expect(model_dir::EMBED_TOKENS, vec![cfg.vocab_size, d])?;
    expect(model_dir::FINAL_NORM, vec![d])?;
    if !cfg.tie_word_embeddings {
        expect(model_dir::LM_HEAD, vec![cfg.vocab_size, d])?;
    } else if find(model_dir::LM_HEAD).is_some() {
        // some tied Hugging Face checkpoints also ship the (equal) head
        expect(model_dir::LM_HEAD, vec![cfg.vocab_size, d])?;
    }
    for l in 0..cfg.num_hidden_layers {
        let n = model_dir::layer_tensor_names(l);
        expect(&n.attn_norm, vec![d])?;
        expect(&n.q_proj, vec![q_dim, d])?;
        expect(&n.k_proj, vec![kv_dim, d])?;
        expect(&n.v_proj, vec![kv_dim, d])?;
        expect(&n.o_proj, vec![d, q_dim])?;
        if arch == Architecture::Qwen2 {
            expect(&n.q_bias, vec![q_dim])?;
            expect(&n.k_bias, vec![kv_dim])?;
            expect(&n.v_bias, vec![kv_dim])?;
        }
        expect(&n.mlp_norm, vec![d])?;
        expect(&n.gate_proj, vec![ff, d])?;
        expect(&n.up_proj, vec![ff, d])?;
        expect(&n.down_proj, vec![d, ff])?;
    }
    // a tensor the config does not account for (e.g. layers past block_count): the model would be
    // imported truncated
    if let Some(t) = tensors.iter().find(|t| !expected.borrow().contains(&t.raw.name)) {
        bail!("{}: tensor '{}' is not part of a {}-layer {} model as configured (block_count / num_hidden_layers too small?)", path.display(), t.raw.name, cfg.num_hidden_layers, cfg.model_type);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpermute_inverts_llama_cpp_permutation() {
        // llama.cpp: w.reshape(n_head, 2, hd/2, cols).swapaxes(1, 2)
        let (n_heads, hd, cols) = (2, 4, 3);
        let rows = n_heads * hd;
        let hf: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
        let mut gguf = vec![0f32; hf.len()];
        for h in 0..n_heads {
            for a in 0..2 {
                for b in 0..hd / 2 {
                    let src = h * hd + a * (hd / 2) + b;
                    let dst = h * hd + b * 2 + a;
                    gguf[dst * cols..(dst + 1) * cols].copy_from_slice(&hf[src * cols..(src + 1) * cols]);
                }
            }
        }
        assert_eq!(unpermute_rope_rows(&gguf, n_heads, rows), hf);
    }

    #[test]
    fn gguf_names_map_to_hf() {
        assert_eq!(hf_name("blk.3.ffn_gate.weight").unwrap(), "model.layers.3.mlp.gate_proj.weight");
        assert_eq!(hf_name("token_embd.weight").unwrap(), "model.embed_tokens.weight");
        assert!(hf_name("blk.3.something_else").is_none());
    }
}
