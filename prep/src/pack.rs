//! `prep pack`: split a model into what stays resident and what streams from storage.
//!
//! - `records.bin`: layers `dense_prefix..n_layers`, layer-major, one record per intermediate
//!   neuron (gate row, up row, row of W_down^T; `formats::records`), written to a temporary
//!   name and renamed.
//! - `resident.safetensors`: embeddings, every layer's attention and norms, the MLPs of the
//!   dense prefix, the final norm and the output head (Hugging Face names), each in the model
//!   directory's own type: f16, or a GGUF's blocks when it was imported `--dtype native`
//!   (`formats::safetensors_io`'s `ggml_types`), copied byte for byte.
//! - `dense_mlp.safetensors` ([`dense_mlp`], a native preparation's own stage): the records'
//!   layers' MLPs in the GGUF's own blocks (`formats::dense_mlp`), which the layers a run
//!   computes dense map instead of rebuilding W_down from the records' requantized columns.

use anyhow::{bail, Context, Result};
use formats::ggml_quants::{self, GgmlType};
use formats::model_dir::{self, ModelConfig};
use formats::records::{encode_record, encode_record_v2, record_bytes, RecordShape};
use formats::safetensors_io::{self, MappedSafetensors, RawTensor};
use half::f16;
use indicatif::{ProgressBar, ProgressStyle};
use rayon::prelude::*;
use serde::Serialize;
use std::io::Write;
use std::path::Path;

#[derive(Debug, Serialize)]
pub struct PackSummary {
    pub records_path: String,
    pub record_bytes: usize,
    pub records: usize,
    pub records_file_bytes: u64,
    pub resident_path: String,
    pub resident_file_bytes: u64,
    pub dense_prefix: usize,
    pub sparse_layers: usize,
}

/// All tensors of a model directory by name (mapped, converted to f16 on access).
struct Tensors {
    files: Vec<MappedSafetensors>,
}

impl Tensors {
    fn open(model: &Path) -> Result<Self> {
        Ok(Tensors {
            files: model_dir::safetensors_files(model)?
                .into_iter()
                .map(MappedSafetensors::open)
                .collect::<Result<_, _>>()?,
        })
    }

    /// The file holding tensor `name`, and its entry.
    fn entry(&self, name: &str) -> Result<(&MappedSafetensors, &formats::safetensors_io::TensorEntry)> {
        self.files
            .iter()
            .find_map(|f| f.tensors.get(name).map(|e| (f, e)))
            .with_context(|| format!("missing tensor '{name}' in the model directory"))
    }

    fn get(&self, name: &str) -> Result<(Vec<usize>, Vec<f16>)> {
        let (f, e) = self.entry(name)?;
        Ok((e.logical_shape(), f.f16_values(name, e)?))
    }

    /// Tensor `name` as f32 (blocks dequantized exactly).
    fn f32(&self, name: &str) -> Result<Vec<f32>> {
        let (f, e) = self.entry(name)?;
        let mut out = vec![0f32; e.logical_shape().iter().product()];
        match e.ggml {
            Some(t) => ggml_quants::dequantize(t, f.bytes(e), &mut out),
            None => out.iter_mut().zip(f.f16_values(name, e)?).for_each(|(o, v)| *o = v.to_f32()),
        }
        Ok(out)
    }

    /// Tensor `name` as stored: its bytes, dtype and stored shape, and its GGML type when it
    /// is blocks.
    fn raw(&self, name: &str) -> Result<(RawTensor, Option<GgmlType>)> {
        let (f, e) = self.entry(name)?;
        Ok((
            RawTensor { name: name.to_string(), dtype: e.dtype, shape: e.shape.clone(), bytes: f.bytes(e).to_vec() },
            e.ggml,
        ))
    }

    /// The records layer `layer` packs into: version 2 (its gate/up blocks, down requantized
    /// to `down`) when its gate and up are GGML blocks of one type, else version 1 (f16).
    fn record_shape(&self, model: &Path, d_model: usize, layer: usize, down: GgmlType) -> Result<Option<RecordShape>> {
        let n = model_dir::layer_tensor_names(layer);
        let (gate, up) = (self.entry(&n.gate_proj)?.1.ggml, self.entry(&n.up_proj)?.1.ggml);
        match (gate, up) {
            (None, _) => Ok(None),
            (Some(g), Some(u)) if g == u => {
                let shape = RecordShape { d_model, gate_up: g, down };
                shape.check().map_err(|e| {
                    anyhow::anyhow!("{}: records v2 with {} down rows: {e}", model.display(), down.name())
                })?;
                Ok(Some(shape))
            }
            (g, u) => bail!(
                "{}: layer {layer}'s gate ({}) and up ({}) differ in type: version-2 records hold one type",
                model.display(),
                g.map_or("f16", |t| t.name()),
                u.map_or("f16", |t| t.name())
            ),
        }
    }
}

/// The records a model directory packs into, judged by layer `layer` (see `Tensors::record_shape`).
pub fn record_shape_of(model: &Path, layer: usize, down: GgmlType) -> Result<Option<RecordShape>> {
    Tensors::open(model)?.record_shape(model, ModelConfig::load(model)?.hidden_size, layer, down)
}

/// The down-row type named `name` (`[pack] down`, `prep pack --down`): one that
/// `ggml_quants::quantize` writes.
pub fn down_type(name: &str) -> Result<GgmlType> {
    let names: Vec<&str> = ggml_quants::QUANTIZABLE.iter().map(|t| t.name()).collect();
    ggml_quants::GgmlType::from_name(name)
        .filter(|t| ggml_quants::QUANTIZABLE.contains(t))
        .with_context(|| format!("down rows of type '{name}': records hold {}", names.join(", ")))
}

/// `down`: the type version-2 records requantize W_down's columns to (ignored for f16 records).
pub fn pack(model: &Path, dense_prefix: usize, down: GgmlType, out: &Path, show_progress: bool) -> Result<PackSummary> {
    let cfg = ModelConfig::load(model)?;
    let (n_layers, d, ff) = (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size);
    if dense_prefix > n_layers {
        bail!("--dense-prefix {dense_prefix} exceeds the model's {n_layers} layers ({})", model.display());
    }
    let t = Tensors::open(model)?;
    std::fs::create_dir_all(out).with_context(|| format!("{}: cannot create", out.display()))?;

    // records.bin
    let shapes: Vec<Option<RecordShape>> =
        (dense_prefix..n_layers).map(|l| t.record_shape(model, d, l, down)).collect::<Result<_>>()?;
    let shape = shapes.first().copied().flatten();
    if shapes.iter().any(|s| *s != shape) {
        bail!(
            "{}: the sparse layers' gate/up types differ from layer to layer: version-2 records hold one type",
            model.display()
        );
    }
    let rec_bytes = shape.map_or(record_bytes(d), |s| s.record_bytes());
    let records_path = out.join("records.bin");
    let tmp = safetensors_io::tmp_path(&records_path);
    let pb = if show_progress { ProgressBar::new((n_layers - dense_prefix) as u64) } else { ProgressBar::hidden() };
    pb.set_style(ProgressStyle::with_template("packing records [{bar:40}] {pos}/{len} layers ({elapsed})").unwrap());
    let written = (|| -> Result<()> {
        let mut w = std::io::BufWriter::with_capacity(
            8 << 20,
            std::fs::File::create(&tmp).with_context(|| format!("{}: cannot create", tmp.display()))?,
        );
        for layer in dense_prefix..n_layers {
            let n = model_dir::layer_tensor_names(layer);
            let mut layer_buf = vec![0u8; ff * rec_bytes];
            match shape {
                None => {
                    let (_, gate) = t.get(&n.gate_proj)?; // [ff, d]
                    let (_, up) = t.get(&n.up_proj)?; // [ff, d]
                    let (_, down) = t.get(&n.down_proj)?; // [d, ff]
                    layer_buf.par_chunks_mut(rec_bytes).enumerate().for_each(|(neuron, rec)| {
                        let down_t: Vec<f16> = (0..d).map(|i| down[i * ff + neuron]).collect(); // column `neuron` of W_down
                        encode_record(
                            layer as u32,
                            neuron as u32,
                            &gate[neuron * d..(neuron + 1) * d],
                            &up[neuron * d..(neuron + 1) * d],
                            &down_t,
                            rec,
                        );
                    });
                }
                Some(sh) => {
                    // gate/up: row `neuron` is that neuron's blocks, copied; down: its column,
                    // exact from the blocks, requantized to `down` along d_model
                    let (gate, _) = t.raw(&n.gate_proj)?; // [ff, row_bytes]
                    let (up, _) = t.raw(&n.up_proj)?;
                    let down = t.f32(&n.down_proj)?; // [d, ff]
                    let gb = sh.gate_up_row_bytes();
                    layer_buf.par_chunks_mut(rec_bytes).enumerate().for_each(|(neuron, rec)| {
                        let col: Vec<f32> = (0..d).map(|i| down[i * ff + neuron]).collect();
                        let down_blocks =
                            ggml_quants::quantize(sh.down, &col).expect("down_type admits only quantizable types");
                        encode_record_v2(
                            &sh,
                            layer as u32,
                            neuron as u32,
                            &gate.bytes[neuron * gb..(neuron + 1) * gb],
                            &up.bytes[neuron * gb..(neuron + 1) * gb],
                            &down_blocks,
                            rec,
                        );
                    });
                }
            }
            w.write_all(&layer_buf).with_context(|| format!("{}: write failed", tmp.display()))?;
            pb.inc(1);
        }
        let f = w.into_inner().map_err(|e| anyhow::anyhow!("{}: {}", tmp.display(), e.error()))?;
        f.sync_all().with_context(|| format!("{}: sync failed", tmp.display()))?;
        Ok(())
    })();
    if let Err(e) = written {
        // a full disk or any other failure: give the space back, leave no partial file
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, &records_path)?;
    pb.finish_and_clear();

    // resident.safetensors
    let mut names = vec![model_dir::EMBED_TOKENS.to_string(), model_dir::FINAL_NORM.to_string()];
    if t.files.iter().any(|f| f.tensors.contains_key(model_dir::LM_HEAD)) {
        names.push(model_dir::LM_HEAD.to_string());
    }
    for layer in 0..n_layers {
        let n = model_dir::layer_tensor_names(layer);
        names.extend([n.attn_norm, n.q_proj, n.k_proj, n.v_proj, n.o_proj, n.mlp_norm]);
        for bias in [n.q_bias, n.k_bias, n.v_bias] {
            if t.files.iter().any(|f| f.tensors.contains_key(&bias)) {
                names.push(bias);
            }
        }
        if layer < dense_prefix {
            names.extend([n.gate_proj, n.up_proj, n.down_proj]);
        }
    }
    let tensors: Vec<(RawTensor, Option<GgmlType>)> = names.iter().map(|name| t.raw(name)).collect::<Result<_>>()?;
    let metadata =
        safetensors_io::ggml_types_metadata(tensors.iter().filter_map(|(r, g)| g.map(|g| (r.name.as_str(), g))));
    let tensors: Vec<RawTensor> = tensors.into_iter().map(|(r, _)| r).collect();
    let resident_path = out.join("resident.safetensors");
    safetensors_io::write_raw_safetensors(&resident_path, &tensors, metadata)?;
    Ok(PackSummary {
        records_path: records_path.display().to_string(),
        record_bytes: rec_bytes,
        records: (n_layers - dense_prefix) * ff,
        records_file_bytes: std::fs::metadata(&records_path)?.len(),
        resident_path: resident_path.display().to_string(),
        resident_file_bytes: std::fs::metadata(&resident_path)?.len(),
        dense_prefix,
        sparse_layers: n_layers - dense_prefix,
    })
}

/// Writes the MLPs of layers `dense_prefix..n_layers` as the model directory stores them
/// (`formats::dense_mlp`), byte for byte, atomically; returns the file's size.
pub fn dense_mlp(model: &Path, dense_prefix: usize, out: &Path) -> Result<u64> {
    let cfg = ModelConfig::load(model)?;
    let t = Tensors::open(model)?;
    let mut tensors = Vec::new();
    for layer in dense_prefix..cfg.num_hidden_layers {
        let n = model_dir::layer_tensor_names(layer);
        for name in [n.gate_proj, n.up_proj, n.down_proj] {
            tensors.push(t.raw(&name)?);
        }
    }
    let metadata =
        safetensors_io::ggml_types_metadata(tensors.iter().filter_map(|(r, g)| g.map(|g| (r.name.as_str(), g))));
    let tensors: Vec<RawTensor> = tensors.into_iter().map(|(r, _)| r).collect();
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    }
    safetensors_io::write_raw_safetensors(out, &tensors, metadata)?;
    // the header the runtime sizes plans from reads back
    let stored = |e: &formats::safetensors_io::TensorEntry| e.byte_range.len() as u64;
    let (n_layers, n_ff, d) = (cfg.num_hidden_layers, cfg.intermediate_size, cfg.hidden_size);
    formats::dense_mlp::layer_bytes(out, dense_prefix, n_layers, n_ff, d, stored)?;
    Ok(std::fs::metadata(out)?.len())
}
