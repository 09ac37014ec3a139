//! The dense model: weights loaded from a canonical model directory, and the one forward pass
//! (batched prefill and single-token decode share it).

use crate::error::{Result, RuntimeError};
use crate::kv_cache::KvCache;
use crate::ops::attention::{attention, AttentionShape};
use crate::ops::matmul::{matmul, matmul_many};
use crate::ops::rmsnorm::rmsnorm;
use crate::ops::rope::RopeTable;
use crate::ops::swiglu::{mul_in_place, silu_in_place};
use crate::tensor::{F16Matrix, Matrix, QMatrix};
use formats::model_dir::{self, Architecture, ModelConfig};
use formats::safetensors_io::{self, MappedSafetensors};
use formats::FormatError;
use rayon::prelude::*;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

/// One decoder layer. d = hidden_size, q_dim = n_heads*head_dim, kv_dim = n_kv_heads*head_dim,
/// ff = intermediate_size.
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,  // [d]
    pub wq: Matrix,           // [q_dim, d]
    pub wk: Matrix,           // [kv_dim, d]
    pub wv: Matrix,           // [kv_dim, d]
    pub bq: Option<Vec<f32>>, // [q_dim]  (qwen2)
    pub bk: Option<Vec<f32>>, // [kv_dim] (qwen2)
    pub bv: Option<Vec<f32>>, // [kv_dim] (qwen2)
    pub wo: Matrix,           // [d, q_dim]
    pub mlp_norm: Vec<f32>,   // [d]
    pub mlp: Mlp,
}

/// Where a layer's MLP weights are.
pub enum Mlp {
    /// In memory (mapped from the model directory or resident.safetensors, or rebuilt from
    /// records.bin): the layer runs dense.
    Resident(DenseMlp),
    /// On storage, in records.bin: the streaming engine reads the rows each token needs
    /// ([`StreamedMlp::mlp`]).
    Streamed,
}

pub struct DenseMlp {
    pub w_gate: Matrix, // [ff, d]
    pub w_up: Matrix,   // [ff, d]
    pub w_down: Matrix, // [d, ff]
}

impl Mlp {
    /// The weights of a resident MLP; an error naming the layer for a streamed one.
    pub fn resident(&self, layer: usize) -> Result<&DenseMlp> {
        match self {
            Mlp::Resident(w) => Ok(w),
            Mlp::Streamed => Err(RuntimeError::Internal(format!(
                "layer {layer}'s MLP is on storage (records.bin): only the streaming engine runs it"
            ))),
        }
    }
}

/// Which output head a prepared model's logits come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum HeadChoice {
    /// resident.safetensors' own (f16, or the GGUF's blocks: Q6_K for Qwen's Q4_K_M).
    #[default]
    Resident,
    /// The preparation's Q8_0 head (role `head_q8`, `formats::head_q8`): the scorer's default on
    /// an f16 preparation.
    Q8,
    /// The preparation's 4-bit head (role `head_compact`, `formats::head_compact`): the
    /// whole-record strategies' default, for budgets below the 4-bit model.
    Compact,
}

impl HeadChoice {
    /// The manifest role of its artifact (None: the resident head).
    pub fn artifact_role(self) -> Option<&'static str> {
        match self {
            HeadChoice::Resident => None,
            HeadChoice::Q8 => Some("head_q8"),
            HeadChoice::Compact => Some(formats::head_compact::ARTIFACT_ROLE),
        }
    }

    /// What messages call it, and its `-X head=` value.
    pub fn label(self) -> (&'static str, &'static str) {
        match self {
            HeadChoice::Resident => ("resident", "resident"),
            HeadChoice::Q8 => ("Q8_0", "q8"),
            HeadChoice::Compact => ("4-bit", "compact"),
        }
    }
}

pub struct ModelWeights {
    pub embed: Matrix, // [vocab, d]
    pub layers: Vec<LayerWeights>,
    pub final_norm: Vec<f32>, // [d]
    /// `[vocab, d]`; None when tied to `embed`.
    pub lm_head: Option<Matrix>,
    /// `-X head=q8` (the scorer's default on an f16 preparation): the head in Q8_0 blocks
    /// (`formats::head_q8`); the logits come from it and the resident head is never read.
    pub head_q8: Option<formats::head_q8::Q8Head>,
    /// Which head the logits come from ([`Model::use_head`]).
    pub head: HeadChoice,
    /// Some in a streamed run whose embedding is not its head: the lookup reads each token's
    /// row from the file (`embed`'s pages are never touched, so they are never held).
    pub embed_rows: Option<formats::safetensors_io::TensorRows>,
}

/// Sees (and may sparsify) the MLP activations of every layer during a batched forward pass
/// ([`Model::forward_observed`]): `prep`'s stages (activation capture, importance, reuse) and
/// oracle-mask sparsity. Sparse runs do not use a hook: [`Model::decode_step`] calls the
/// streaming engine directly (records streamed, or held in memory for quality figures).
pub trait MlpHook {
    /// `gate_silu` = silu(x W_gate^T) and `up` = x W_up^T, both `[n_tokens, intermediate_size]`;
    /// the SwiGLU product is their elementwise product.
    fn observe(&mut self, layer: usize, gate_silu: &[f32], up: &[f32]);

    /// The normed input of layer `layer`'s MLP, `[n_tokens, hidden_size]` (before
    /// [`MlpHook::observe`] or [`MlpHook::mlp`]).
    fn observe_input(&mut self, _layer: usize, _xn: &[f32]) {}

    /// The residual stream after layer `layer` (its output), `[n_tokens, hidden_size]`.
    fn after_layer(&mut self, _layer: usize, _hidden: &[f32]) {}

    /// Called after `observe`: zero entries of `gate_silu` to drop those neurons (their
    /// product, and so their down-projection, becomes 0).
    fn sparsify(&mut self, _layer: usize, _gate_silu: &mut [f32], _up: &[f32]) {}
}

/// What computes the MLPs of the layers a model leaves on storage ([`Mlp::Streamed`]), one
/// token at a time ([`Model::decode_step`]): the streaming engine (`crate::stream`). The model
/// calls it at one place per layer and knows nothing of slots, reads or selectors.
pub trait StreamedMlp {
    /// A new token starts.
    fn begin_token(&mut self) -> Result<()>;
    /// Layer 0 ran dense: `gate_silu` and `up` `[n_ff]` are its activations.
    fn observe_first_layer(&mut self, gate_silu: &[f32], up: &[f32]);
    /// The residual stream after layer 0, `[d_model]`.
    fn after_first_layer(&mut self, hidden: &[f32]) -> Result<()>;
    /// Layer `layer`'s MLP output for the normed input `xn` `[d_model]`, into `out` `[d_model]`.
    fn mlp(&mut self, layer: usize, xn: &[f32], out: &mut [f32]) -> Result<()>;
    /// The token failed part-way: nothing it planned may outlive it.
    fn abandon_token(&mut self);
    /// A batch of prompt tokens starts (none of their logits is wanted): each streamed layer's
    /// whole MLP is staged for it ([`StreamedMlp::staged_mlp`]), the first one's read now.
    /// Rows `count_from..` of the batch are in the window that chooses what the slots hold
    /// after the prompt.
    fn begin_prompt(&mut self, count_from: usize) -> Result<()>;
    /// Streamed layer `layer`'s whole MLP, staged from storage for the batch (the next streamed
    /// layer's read starts).
    fn staged_mlp(&mut self, layer: usize) -> Result<DenseMlp>;
    /// The batch's tokens went through the staged MLP of `layer`: `h` `[n, n_ff]` are their
    /// coefficients `silu(gate . x) (up . x)` (the engine counts each neuron's use).
    fn staged_mlp_done(&mut self, layer: usize, mlp: DenseMlp, h: &[f32]) -> Result<()>;
    /// The batch failed part-way: what was asked of storage for it is dropped.
    fn abandon_prompt(&mut self);
    /// The decode step's buffers, kept between tokens (None before the first).
    fn scratch(&mut self) -> &mut Option<DecodeState>;
}

pub struct Model {
    pub dir: PathBuf,
    pub config: ModelConfig,
    pub arch: Architecture,
    pub weights: ModelWeights,
    rope: RopeTable,
}

/// How a loaded model holds the matrices every token reads (attention, resident MLPs, the
/// head); the embedding, read a row per token, stays mapped either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeLayout {
    /// The GGUF's rows, mapped from the file (pages read on first use): what `prep` and the
    /// in-memory quality runs load.
    Mapped,
    /// Where the CPU has the kernel (`ops::interleaved`: Q4_K and Q6_K with AVX-512 VNNI or SDOT), rows
    /// interleaved by eight for decode, read from the file into memory (never through the map,
    /// so no page is held twice); mapped otherwise. What runs load, under a memory budget too
    /// (`MemoryPlan` counts the interleaved bytes: [`decode_held_bytes`]).
    Interleaved,
}

/// Whether [`DecodeLayout::Interleaved`] interleaves a matrix of `rows` rows of `ty` blocks.
fn interleaves(ty: formats::ggml_quants::GgmlType, rows: usize) -> bool {
    crate::ops::interleaved::supports(ty) && rows.is_multiple_of(crate::ops::interleaved::ROWS)
}

/// Bytes a matrix every token reads holds once loaded as [`DecodeLayout::Interleaved`] lays it
/// out: its interleaved groups (Q4_K's with their unpacked scales) where it is interleaved, else
/// its stored bytes. What `MemoryPlan` counts for it.
pub fn decode_held_bytes(e: &safetensors_io::TensorEntry) -> u64 {
    match (e.ggml, e.logical_shape().as_slice()) {
        (Some(ty), &[rows, cols]) if interleaves(ty, rows) => {
            (rows / crate::ops::interleaved::ROWS * crate::ops::interleaved::group_bytes(ty, cols)) as u64
        }
        _ => e.byte_range.len() as u64,
    }
}

/// Finds tensors across the safetensors files of a directory and checks their shapes.
struct TensorSource {
    files: Vec<MappedSafetensors>,
    layout: DecodeLayout,
    /// The head the run reads: another than [`HeadChoice::Resident`] leaves the resident one
    /// mapped and never touched.
    head: HeadChoice,
}

impl TensorSource {
    fn find(&self, name: &str) -> Option<(&MappedSafetensors, &safetensors_io::TensorEntry)> {
        self.files.iter().find_map(|f| f.tensors.get(name).map(|e| (f, e)))
    }

    fn check_shape(&self, f: &MappedSafetensors, name: &str, actual: &[usize], expected: &[usize]) -> Result<()> {
        if actual != expected {
            return Err(FormatError::ShapeMismatch {
                path: f.path.clone(),
                tensor: name.to_string(),
                expected: expected.to_vec(),
                actual: actual.to_vec(),
            }
            .into());
        }
        Ok(())
    }

    fn missing(&self, name: &str) -> RuntimeError {
        let path = self.files.first().map(|f| f.path.clone()).unwrap_or_default();
        FormatError::MissingTensor { path, tensor: name.to_string() }.into()
    }

    /// A weight matrix: f16 mapped in place, GGML blocks mapped in place (a type with a
    /// kernel in `ops::qmatmul`), or BF16/F32 converted to f16.
    fn matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        let (f, e) = self.find(name).ok_or_else(|| self.missing(name))?;
        self.check_shape(f, name, &e.logical_shape(), &[rows, cols])?;
        if let Some(ty) = e.ggml {
            if crate::ops::qmatmul::activation_type(ty).is_none() {
                return Err(FormatError::UnsupportedStoredType {
                    path: f.path.clone(),
                    tensor: name.into(),
                    type_name: ty.name().into(),
                }
                .into());
            }
            return Ok(Matrix::Quant(QMatrix::mapped(ty, rows, cols, f.mmap.clone(), e.byte_range.start)));
        }
        Ok(Matrix::F16(match e.dtype {
            Dtype::F16 => F16Matrix::mapped(rows, cols, f.mmap.clone(), e.byte_range.start),
            _ => F16Matrix::owned(rows, cols, f.f16_values(name, e)?),
        }))
    }

    /// A matrix every token reads, laid out as `self.layout` says.
    fn decode_matrix(&self, name: &str, rows: usize, cols: usize) -> Result<Matrix> {
        use std::os::unix::fs::FileExt;
        let Some((f, e)) = self.find(name) else { return Err(self.missing(name)) };
        match e.ggml {
            Some(ty) if self.layout == DecodeLayout::Interleaved && interleaves(ty, rows) => {
                self.check_shape(f, name, &e.logical_shape(), &[rows, cols])?;
                use crate::ops::interleaved;
                // read and interleave a few groups at a time: no second copy of the matrix
                const ROWS_PER_READ: usize = 8 * interleaved::ROWS;
                let row_bytes = cols / ty.block_elements() * ty.block_bytes();
                let group_bytes = interleaved::group_bytes(ty, cols);
                if e.byte_range.len() != rows * row_bytes {
                    let what =
                        format!("tensor '{name}' holds {} bytes, not {rows} rows of {row_bytes}", e.byte_range.len());
                    return Err(FormatError::invalid(&f.path, what).into());
                }
                let mut data = vec![0u8; rows / interleaved::ROWS * group_bytes];
                let mut chunk = vec![0u8; ROWS_PER_READ * row_bytes];
                let file = std::fs::File::open(&f.path).map_err(|err| FormatError::io(&f.path, err))?;
                for (k, out) in data.chunks_mut(ROWS_PER_READ / interleaved::ROWS * group_bytes).enumerate() {
                    let n = out.len() / group_bytes * interleaved::ROWS;
                    let at = e.byte_range.start + k * ROWS_PER_READ * row_bytes;
                    file.read_exact_at(&mut chunk[..n * row_bytes], at as u64)
                        .map_err(|err| FormatError::io(&f.path, err))?;
                    interleaved::interleave_into(ty, &chunk[..n * row_bytes], cols, out);
                }
                Ok(Matrix::Quant(QMatrix::from_interleaved(ty, rows, cols, data)))
            }
            _ => self.matrix(name, rows, cols),
        }
    }

    fn vector(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let (f, e) = self.find(name).ok_or_else(|| self.missing(name))?;
        self.check_shape(f, name, &e.logical_shape(), &[len])?;
        if e.ggml.is_some() {
            return Err(FormatError::Safetensors {
                path: f.path.clone(),
                reason: format!("tensor '{name}' is a vector; vectors are stored as F32/F16, not quantized"),
            }
            .into());
        }
        Ok(safetensors_io::to_f16_vec(&f.path, name, e.dtype, f.bytes(e))?.iter().map(|v| v.to_f32()).collect())
    }
}

/// Where the MLP weights of the sparse layers come from.
#[derive(Clone, Copy)]
enum SparseMlps<'a> {
    /// From the model's tensors (a model directory).
    Resident,
    /// A preparation: layers `records.first_layer..streamed_from` in memory, those below
    /// `native_below` mapped from dense_mlp.safetensors when the preparation has it (the GGUF's
    /// blocks), the others rebuilt from records.bin; layers `>= streamed_from` not loaded
    /// (computed by the streaming engine).
    Prepared { records: &'a formats::records::RecordFile, native_below: usize, streamed_from: usize },
}

/// The preparation's dense_mlp.safetensors, mapped; None without the artifact.
fn dense_mlp_file(manifest_path: &Path, manifest: &formats::manifest::Manifest) -> Result<Option<MappedSafetensors>> {
    match manifest.artifacts.iter().find(|a| a.role == formats::dense_mlp::ARTIFACT_ROLE) {
        Some(a) => Ok(Some(MappedSafetensors::open(manifest.artifact_path(manifest_path, a))?)),
        None => Ok(None),
    }
}

/// (gate `[ff, d]`, up `[ff, d]`, down `[d, ff]`) of layer `l`, from its records.
fn mlp_from_records(rf: &formats::records::RecordFile, l: usize, d: usize, ff: usize) -> Result<Mlp> {
    let bytes = rf.read_layer_bytes(l)?;
    Ok(Mlp::Resident(mlp_from_layer_records(&bytes, &rf.path, rf.offset(l, 0), l, d, ff, rf.shape)?))
}

/// Layer `l`'s MLP from `bytes`, its `ff` records as read from `path` at `file_offset`, each
/// checked (header, CRC32C). Version 2: gate and up are the records' blocks; down `[d, ff]` is
/// rebuilt in f16 from the Q8_0 columns (its rows run across neurons, so the columns cannot stay
/// blocks). Version 1: f16 rows, down transposed back.
pub(crate) fn mlp_from_layer_records(
    bytes: &[u8],
    path: &Path,
    file_offset: u64,
    l: usize,
    d: usize,
    ff: usize,
    shape: Option<formats::records::RecordShape>,
) -> Result<DenseMlp> {
    let rb = shape.map_or(formats::records::record_bytes(d), |s| s.record_bytes());
    if bytes.len() != ff * rb {
        return Err(RuntimeError::Internal(format!(
            "{}: layer {l}'s records are {} bytes, read {}",
            path.display(),
            ff * rb,
            bytes.len()
        )));
    }
    let record = |j: usize| (&bytes[j * rb..(j + 1) * rb], file_offset + (j * rb) as u64);
    let mut down = vec![half::f16::ZERO; d * ff];
    if let Some(shape) = shape {
        let (mut gate, mut up) =
            (Vec::with_capacity(ff * shape.gate_up_row_bytes()), Vec::with_capacity(ff * shape.gate_up_row_bytes()));
        let mut col = vec![0f32; d];
        for j in 0..ff {
            let (r, off) = record(j);
            let (g, u, dn) = formats::records::check_record_v2(r, path, off, l as u32, j as u32, &shape)?;
            gate.extend_from_slice(g);
            up.extend_from_slice(u);
            formats::ggml_quants::dequantize(shape.down, dn, &mut col);
            for (i, &v) in col.iter().enumerate() {
                down[i * ff + j] = half::f16::from_f32(v);
            }
        }
        return Ok(DenseMlp {
            w_gate: Matrix::Quant(QMatrix::owned(shape.gate_up, ff, d, &gate)),
            w_up: Matrix::Quant(QMatrix::owned(shape.gate_up, ff, d, &up)),
            w_down: Matrix::F16(F16Matrix::owned(d, ff, down)),
        });
    }
    let mut gate = vec![half::f16::ZERO; ff * d];
    let mut up = vec![half::f16::ZERO; ff * d];
    let f16_at = |b: &[u8], i: usize| half::f16::from_le_bytes([b[2 * i], b[2 * i + 1]]);
    for j in 0..ff {
        let (r, off) = record(j);
        formats::records::check_record(r, path, off, l as u32, j as u32, d)?;
        let payload = &r[formats::records::RECORD_HEADER_BYTES..];
        for i in 0..d {
            gate[j * d + i] = f16_at(payload, i);
            up[j * d + i] = f16_at(payload, d + i);
            // record j holds column j of down ([d, ff]) as a row
            down[i * ff + j] = f16_at(payload, 2 * d + i);
        }
    }
    Ok(DenseMlp {
        w_gate: Matrix::F16(F16Matrix::owned(ff, d, gate)),
        w_up: Matrix::F16(F16Matrix::owned(ff, d, up)),
        w_down: Matrix::F16(F16Matrix::owned(d, ff, down)),
    })
}

/// The layout of the manifest's version-2 records (None: version 1), an unknown type an error
/// naming the manifest.
pub(crate) fn records_shape(
    manifest_path: &Path,
    manifest: &formats::manifest::Manifest,
) -> Result<Option<formats::records::RecordShape>> {
    manifest
        .records
        .shape(manifest.model.hidden_size)
        .map_err(|e| RuntimeError::Input(format!("{}: {e}", manifest_path.display())))
}

/// The manifest's records.bin (its `records` artifact), opened with its version and layout.
pub fn records_file_of(
    manifest_path: &Path,
    manifest: &formats::manifest::Manifest,
) -> Result<formats::records::RecordFile> {
    records_file(manifest_path, manifest, &manifest.artifact_path_of(manifest_path, "records")?)
}

/// The manifest's records.bin, opened with its version and layout.
pub(crate) fn records_file(
    manifest_path: &Path,
    manifest: &formats::manifest::Manifest,
    records_path: &Path,
) -> Result<formats::records::RecordFile> {
    let c = &manifest.model;
    let shape = records_shape(manifest_path, manifest)?;
    Ok(formats::records::RecordFile::open_v(
        records_path,
        c.hidden_size,
        manifest.records.first_layer,
        c.num_hidden_layers,
        c.intermediate_size,
        shape,
    )?)
}

/// Positions a run may reach at most (the model's max_position_embeddings otherwise).
pub const ROPE_MAX_POSITIONS: usize = 1 << 16;

impl Model {
    /// Loads a canonical model directory (see `formats::model_dir`). Weights stay memory-mapped.
    pub fn load(dir: &Path, layout: DecodeLayout) -> Result<Self> {
        let config = ModelConfig::load(dir)?;
        let files = model_dir::safetensors_files(dir)?
            .into_iter()
            .map(MappedSafetensors::open)
            .collect::<std::result::Result<Vec<_>, _>>()?;
        Self::assemble(
            dir,
            &dir.join(model_dir::CONFIG_FILE),
            config,
            TensorSource { files, layout, head: HeadChoice::Resident },
            SparseMlps::Resident,
        )
    }

    /// Loads a prepared model (`prep prepare`'s manifest.toml) with every row in memory:
    /// resident.safetensors, the MLPs of layers below `dense_below` mapped from the GGUF's own
    /// blocks (dense_mlp.safetensors) when the preparation has them, and the other sparse
    /// layers' MLPs rebuilt from records.bin (every record's header and CRC checked), whose rows
    /// the streaming engine reads on demand.
    pub fn load_prepared(
        manifest_path: &Path,
        manifest: &formats::manifest::Manifest,
        dense_below: usize,
        layout: DecodeLayout,
        head: HeadChoice,
    ) -> Result<Self> {
        let resident = manifest.artifact_path_of(manifest_path, "resident")?;
        let records_path = manifest.artifact_path_of(manifest_path, "records")?;
        let rf = records_file(manifest_path, manifest, &records_path)?;
        let mut files = vec![MappedSafetensors::open(&resident)?];
        files.extend(dense_mlp_file(manifest_path, manifest)?);
        let dir = manifest_path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let sparse = SparseMlps::Prepared {
            records: &rf,
            native_below: dense_below,
            streamed_from: manifest.model.num_hidden_layers,
        };
        let mut model =
            Self::assemble(&dir, manifest_path, manifest.model.clone(), TensorSource { files, layout, head }, sparse)?;
        model.use_head(manifest_path, manifest, head)?;
        Ok(model)
    }

    /// Loads a prepared model for streaming: resident.safetensors, and the MLPs of layers
    /// from the prepared prefix to `dense_prefix` from dense_mlp.safetensors (the GGUF's
    /// blocks), or without it rebuilt once from records.bin, the matrices every token reads
    /// interleaved for decode ([`DecodeLayout::Interleaved`]); the MLP weights of
    /// layers `dense_prefix..` stay on storage (a [`StreamedMlp`], the streaming engine, computes those MLPs).
    /// `head`: with the Q8_0 or 4-bit head, a tied embedding is only read a row per token too.
    pub fn load_streaming(
        manifest_path: &Path,
        manifest: &formats::manifest::Manifest,
        dense_prefix: usize,
        head: HeadChoice,
    ) -> Result<Self> {
        let resident = manifest.artifact_path_of(manifest_path, "resident")?;
        let records_path = manifest.artifact_path_of(manifest_path, "records")?;
        let c = &manifest.model;
        let rf = records_file(manifest_path, manifest, &records_path)?;
        let mapped = MappedSafetensors::open(&resident)?;
        // the input embedding is read one row per token (MemoryPlan does not hold it) unless
        // it is the head
        let embed_rows = if !c.tie_word_embeddings || head != HeadChoice::Resident {
            mapped.advise_random(model_dir::EMBED_TOKENS)?;
            Some(mapped.rows_of(model_dir::EMBED_TOKENS)?)
        } else {
            None
        };
        let mut files = vec![mapped];
        files.extend(dense_mlp_file(manifest_path, manifest)?);
        let dir = manifest_path.parent().unwrap_or(Path::new(".")).to_path_buf();
        let sparse = SparseMlps::Prepared { records: &rf, native_below: dense_prefix, streamed_from: dense_prefix };
        let src = TensorSource { files, layout: DecodeLayout::Interleaved, head };
        let mut model = Self::assemble(&dir, manifest_path, manifest.model.clone(), src, sparse)?;
        model.use_head(manifest_path, manifest, head)?;
        // (the same tensor entry as `embed`, whose shape `assemble` checked)
        model.weights.embed_rows = embed_rows;
        Ok(model)
    }

    /// `sparse`: where the MLPs of the sparse layers come from.
    fn assemble(
        dir: &Path,
        config_path: &Path,
        config: ModelConfig,
        src: TensorSource,
        sparse: SparseMlps,
    ) -> Result<Self> {
        let arch = config.validate(config_path)?;
        let c = &config;
        let (d, ff, hd) = (c.hidden_size, c.intermediate_size, c.head_dim());
        let (q_dim, kv_dim) = (c.num_attention_heads * hd, c.n_kv_heads() * hd);
        let layers = (0..c.num_hidden_layers)
            .into_par_iter()
            .map(|l| {
                let n = model_dir::layer_tensor_names(l);
                let bias = |name: &str, len| -> Result<Option<Vec<f32>>> {
                    match arch {
                        Architecture::Qwen2 => Ok(Some(src.vector(name, len)?)),
                        Architecture::Llama => Ok(None),
                    }
                };
                let mlp = match sparse {
                    SparseMlps::Prepared { streamed_from, .. } if l >= streamed_from => Mlp::Streamed,
                    SparseMlps::Prepared { records, native_below, .. }
                        if l >= records.first_layer && !(l < native_below && src.find(&n.gate_proj).is_some()) =>
                    {
                        mlp_from_records(records, l, d, ff)?
                    }
                    _ => Mlp::Resident(DenseMlp {
                        w_gate: src.decode_matrix(&n.gate_proj, ff, d)?,
                        w_up: src.decode_matrix(&n.up_proj, ff, d)?,
                        w_down: src.decode_matrix(&n.down_proj, d, ff)?,
                    }),
                };
                Ok(LayerWeights {
                    attn_norm: src.vector(&n.attn_norm, d)?,
                    wq: src.decode_matrix(&n.q_proj, q_dim, d)?,
                    wk: src.decode_matrix(&n.k_proj, kv_dim, d)?,
                    wv: src.decode_matrix(&n.v_proj, kv_dim, d)?,
                    bq: bias(&n.q_bias, q_dim)?,
                    bk: bias(&n.k_bias, kv_dim)?,
                    bv: bias(&n.v_bias, kv_dim)?,
                    wo: src.decode_matrix(&n.o_proj, d, q_dim)?,
                    mlp_norm: src.vector(&n.mlp_norm, d)?,
                    mlp,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let lm_head = if c.tie_word_embeddings && src.find(model_dir::LM_HEAD).is_none() {
            None
        } else if src.head == HeadChoice::Resident {
            Some(src.decode_matrix(model_dir::LM_HEAD, c.vocab_size, d)?)
        } else {
            Some(src.matrix(model_dir::LM_HEAD, c.vocab_size, d)?)
        };
        let weights = ModelWeights {
            embed: src.matrix(model_dir::EMBED_TOKENS, c.vocab_size, d)?,
            layers,
            final_norm: src.vector(model_dir::FINAL_NORM, d)?,
            lm_head,
            head_q8: None,
            head: HeadChoice::Resident,
            embed_rows: None,
        };
        let rope = RopeTable::new(hd, c.rope_theta, c.max_position_embeddings.min(ROPE_MAX_POSITIONS));
        Ok(Model { dir: dir.to_path_buf(), config, arch, weights, rope })
    }

    pub fn vocab_size(&self) -> usize {
        self.config.vocab_size
    }

    /// Logits from `head` from now on: the preparation's Q8_0 head (role `head_q8`) or 4-bit
    /// head (role `head_compact`), mapped; the resident one is then never read.
    pub fn use_head(
        &mut self,
        manifest_path: &Path,
        manifest: &formats::manifest::Manifest,
        head: HeadChoice,
    ) -> Result<()> {
        let Some(role) = head.artifact_role() else { return Ok(()) };
        let Some(a) = manifest.artifacts.iter().find(|a| a.role == role) else {
            let (what, knob) = head.label();
            return Err(RuntimeError::Input(format!(
                "{}: this preparation has no {role} artifact (the {what} output head, `{knob}`): rerun make prepare",
                manifest_path.display()
            )));
        };
        let c = &self.config;
        let path = manifest.artifact_path(manifest_path, a);
        match head {
            HeadChoice::Q8 => {
                self.weights.head_q8 = Some(formats::head_q8::Q8Head::load(&path, c.vocab_size, c.hidden_size)?)
            }
            HeadChoice::Compact => {
                let (f, ty) = formats::head_compact::open(&path, c.vocab_size, c.hidden_size)?;
                let e = &f.tensors[model_dir::LM_HEAD];
                self.weights.lm_head = Some(Matrix::Quant(QMatrix::mapped(
                    ty,
                    c.vocab_size,
                    c.hidden_size,
                    f.mmap.clone(),
                    e.byte_range.start,
                )));
            }
            HeadChoice::Resident => unreachable!("no artifact"),
        }
        self.weights.head = head;
        Ok(())
    }

    pub fn max_context(&self) -> usize {
        self.rope.max_positions()
    }

    /// A KV cache for `max_seq` positions.
    pub fn new_cache(&self, max_seq: usize) -> Result<KvCache> {
        if max_seq > self.max_context() {
            return Err(RuntimeError::CtxTooLarge { ctx: max_seq, max: self.max_context() });
        }
        let c = &self.config;
        Ok(KvCache::new(c.num_hidden_layers, c.n_kv_heads() * c.head_dim(), max_seq))
    }

    /// Runs `tokens` at positions `cache.len ..`, appends their keys and values to the cache,
    /// and returns the logits of tokens `logits_from..` as `[n_tokens - logits_from, vocab]`.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache, logits_from: usize) -> Result<Vec<f32>> {
        self.forward_observed(tokens, cache, logits_from, None)
    }

    /// [`Model::forward`], showing each layer's MLP activations to `observer`. Every layer's MLP
    /// must be resident (a streamed run goes through [`Model::decode_step`]).
    pub fn forward_observed(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        logits_from: usize,
        observer: Option<&mut dyn MlpHook>,
    ) -> Result<Vec<f32>> {
        self.check_tokens(tokens, cache)?;
        self.forward_batch(tokens, cache, logits_from, observer, None)
    }

    /// A batch of prompt tokens through a streamed model: the batched forward pass of
    /// [`Model::forward`], each streamed layer's whole MLP staged from storage by `engine`
    /// ([`StreamedMlp::staged_mlp`]), so the prompt is computed exactly as the dense model
    /// computes it. Appends the tokens' keys and values to the cache and returns the logits of
    /// tokens `logits_from..` (none when `logits_from` is the batch's length).
    /// `count_from` as [`StreamedMlp::begin_prompt`] takes it.
    pub fn prompt_batch(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        engine: &mut dyn StreamedMlp,
        count_from: usize,
        logits_from: usize,
    ) -> Result<Vec<f32>> {
        self.check_tokens(tokens, cache)?;
        let pos0 = cache.len;
        engine.begin_prompt(count_from)?;
        let r = self.forward_batch(tokens, cache, logits_from, None, Some(&mut *engine));
        if r.is_err() {
            engine.abandon_prompt();
            cache.len = pos0;
        }
        r
    }

    /// The batched forward pass: every layer's attention for all `tokens`, then its MLP,
    /// resident (observed by `observer`) or staged whole by `streamed`.
    fn forward_batch(
        &self,
        tokens: &[u32],
        cache: &mut KvCache,
        logits_from: usize,
        mut observer: Option<&mut dyn MlpHook>,
        mut streamed: Option<&mut dyn StreamedMlp>,
    ) -> Result<Vec<f32>> {
        let c = &self.config;
        let n = tokens.len();
        let pos0 = cache.len;
        let mut s = DecodeState::new(c, n);
        self.embed(tokens, &mut s.x)?;
        for (l, lw) in self.weights.layers.iter().enumerate() {
            self.attention_block(l, lw, n, pos0, cache, &mut s);
            // --- MLP block: down(silu(gate(xn)) * up(xn)) ---
            rmsnorm(&s.x, &lw.mlp_norm, c.rms_norm_eps as f32, &mut s.xn);
            if let Some(obs) = observer.as_mut() {
                obs.observe_input(l, &s.xn);
            }
            let staged = match (&lw.mlp, streamed.as_mut()) {
                (Mlp::Streamed, Some(engine)) => Some(engine.staged_mlp(l)?),
                _ => None,
            };
            let w = match &staged {
                Some(w) => w,
                None => lw.mlp.resident(l)?,
            };
            dense_gate_up(w, n, &s.xn, &mut s.gate, &mut s.up);
            if let Some(obs) = observer.as_mut() {
                obs.observe(l, &s.gate, &s.up);
                obs.sparsify(l, &mut s.gate, &s.up);
            }
            mul_in_place(&mut s.gate, &s.up); // gate now holds silu(gate) * up
            matmul(&s.gate, n, &w.w_down, &mut s.proj);
            if let (Some(w), Some(engine)) = (staged, streamed.as_mut()) {
                engine.staged_mlp_done(l, w, &s.gate)?;
            }
            s.x.iter_mut().zip(&s.proj).for_each(|(a, b)| *a += b);
            check_finite(&s.x, "the hidden state", Some(l))?;
            if let Some(obs) = observer.as_mut() {
                obs.after_layer(l, &s.x);
            }
        }
        cache.len = pos0 + n;
        if logits_from >= n {
            return Ok(Vec::new());
        }
        let logits = self.head(&s.x[logits_from * c.hidden_size..], n - logits_from);
        check_finite(&logits, "the logits", None)?;
        Ok(logits)
    }

    /// One token through the streaming engine, from token to logits `[vocab]`: the per-token
    /// path of a streamed run. Every layer: attention (resident weights, KV cache), then the MLP,
    /// resident (dense) or streamed ([`StreamedMlp::mlp`]: the streaming engine's set, the rows
    /// the layer's slots hold, the missing ones read from records.bin). Layer 0's activations
    /// and output go to the engine, whose selector may choose every sparse layer's set from them.
    pub fn decode_step(&self, token: u32, cache: &mut KvCache, engine: &mut dyn StreamedMlp) -> Result<Vec<f32>> {
        let c = &self.config;
        self.check_tokens(&[token], cache)?;
        let pos = cache.len;
        let mut s = engine.scratch().take().unwrap_or_else(|| DecodeState::new(c, 1));
        engine.begin_token()?;
        self.embed(&[token], &mut s.x)?;
        let logits = (|| -> Result<Vec<f32>> {
            for (l, lw) in self.weights.layers.iter().enumerate() {
                self.attention_block(l, lw, 1, pos, cache, &mut s);
                rmsnorm(&s.x, &lw.mlp_norm, c.rms_norm_eps as f32, &mut s.xn);
                match &lw.mlp {
                    Mlp::Resident(w) => {
                        dense_gate_up(w, 1, &s.xn, &mut s.gate, &mut s.up);
                        if l == 0 {
                            engine.observe_first_layer(&s.gate, &s.up);
                        }
                        mul_in_place(&mut s.gate, &s.up);
                        matmul(&s.gate, 1, &w.w_down, &mut s.proj);
                    }
                    Mlp::Streamed => engine.mlp(l, &s.xn, &mut s.proj)?,
                }
                s.x.iter_mut().zip(&s.proj).for_each(|(a, b)| *a += b);
                check_finite(&s.x, "the hidden state", Some(l))?;
                if l == 0 {
                    engine.after_first_layer(&s.x)?;
                }
            }
            let logits = self.head(&s.x, 1);
            check_finite(&logits, "the logits", None)?;
            Ok(logits)
        })();
        *engine.scratch() = Some(s);
        if logits.is_err() {
            engine.abandon_token();
            return logits;
        }
        cache.len = pos + 1;
        logits
    }

    fn check_tokens(&self, tokens: &[u32], cache: &KvCache) -> Result<()> {
        let (n, pos0) = (tokens.len(), cache.len);
        if pos0 + n > cache.max_seq {
            return Err(RuntimeError::ContextOverflow { needed: pos0 + n, ctx: cache.max_seq, prompt_tokens: n });
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(RuntimeError::TokenOutOfRange { token: bad, vocab: self.config.vocab_size });
        }
        Ok(())
    }

    /// `x` `[n, d]` = the embedding rows of `tokens` (read from the file in a streamed run).
    fn embed(&self, tokens: &[u32], x: &mut [f32]) -> Result<()> {
        let d = self.config.hidden_size;
        let e = &self.weights.embed;
        match &self.weights.embed_rows {
            None => {
                for (t, &tok) in tokens.iter().enumerate() {
                    e.row_f32(tok as usize, &mut x[t * d..(t + 1) * d]);
                }
            }
            Some(rows) => {
                let mut row = vec![0u8; rows.row_bytes];
                for (t, &tok) in tokens.iter().enumerate() {
                    rows.read_row(tok as usize, &mut row)?;
                    e.decode_row(&row, &mut x[t * d..(t + 1) * d]);
                }
            }
        }
        Ok(())
    }

    /// Layer `l`'s attention block for `n` tokens at positions `pos0..`: `s.x += o_proj(GQA
    /// attention over the cache of RoPE(q), RoPE(k), v)` of the normed input; appends the
    /// tokens' keys and values to the cache.
    fn attention_block(
        &self,
        l: usize,
        lw: &LayerWeights,
        n: usize,
        pos0: usize,
        cache: &mut KvCache,
        s: &mut DecodeState,
    ) {
        let c = &self.config;
        let hd = c.head_dim();
        let (q_dim, kv_dim) = (c.num_attention_heads * hd, c.n_kv_heads() * hd);
        let shape = AttentionShape { n_heads: c.num_attention_heads, n_kv_heads: c.n_kv_heads(), head_dim: hd };
        rmsnorm(&s.x, &lw.attn_norm, c.rms_norm_eps as f32, &mut s.xn);
        matmul_many(&s.xn, n, &[&lw.wq, &lw.wk, &lw.wv], &mut [&mut s.q, &mut s.k, &mut s.v]);
        for (buf, bias) in [(&mut s.q, &lw.bq), (&mut s.k, &lw.bk), (&mut s.v, &lw.bv)] {
            if let Some(b) = bias {
                for row in buf.chunks_exact_mut(b.len()) {
                    row.iter_mut().zip(b).for_each(|(r, bi)| *r += bi);
                }
            }
        }
        for t in 0..n {
            self.rope.apply_pair(
                &mut s.q[t * q_dim..(t + 1) * q_dim],
                &mut s.k[t * kv_dim..(t + 1) * kv_dim],
                pos0 + t,
            );
        }
        cache.store(l, pos0, &s.k[..n * kv_dim], &s.v[..n * kv_dim]);
        attention(&s.q, &cache.k[l], &cache.v[l], pos0, &shape, &mut s.att);
        matmul(&s.att, n, &lw.wo, &mut s.proj);
        s.x.iter_mut().zip(&s.proj).for_each(|(a, b)| *a += b);
    }

    /// Logits `[n_out, vocab]` of the last `n_out` rows of the residual stream `x`: final norm,
    /// then the output head (Q8_0 with `-X head=q8` (the scorer's default), else f16; the embedding when tied).
    fn head(&self, x: &[f32], n_out: usize) -> Vec<f32> {
        let (c, w) = (&self.config, &self.weights);
        let d = c.hidden_size;
        let mut xf = vec![0f32; n_out * d];
        rmsnorm(&x[x.len() - n_out * d..], &w.final_norm, c.rms_norm_eps as f32, &mut xf);
        let mut logits = vec![0f32; n_out * c.vocab_size];
        if let Some(h) = &w.head_q8 {
            for (xr, lr) in xf.chunks_exact(d).zip(logits.chunks_exact_mut(c.vocab_size)) {
                crate::ops::qmatvec::matvec_q8(&h.q, &h.scales, d, &crate::ops::qmatvec::Q8Vector::quantize(xr), lr);
            }
            return logits;
        }
        let head = w.lm_head.as_ref().unwrap_or(&w.embed);
        matmul(&xf, n_out, head, &mut logits);
        logits
    }
}

/// One finite check per layer output (and on the logits): a NaN or infinity is an error naming
/// where it appeared (a layer, or None: the output head), never a sampled token.
fn check_finite(v: &[f32], what: &'static str, layer: Option<usize>) -> Result<()> {
    if v.iter().all(|x| x.is_finite()) {
        return Ok(());
    }
    Err(RuntimeError::NonFinite { what, place: layer.map_or("the output head".into(), |l| format!("layer {l}")) })
}

/// `gate` = silu(xn W_gate^T), `up` = xn W_up^T, both `[n, ff]`.
fn dense_gate_up(w: &DenseMlp, n: usize, xn: &[f32], gate: &mut [f32], up: &mut [f32]) {
    matmul_many(xn, n, &[&w.w_gate, &w.w_up], &mut [gate, up]);
    silu_in_place(gate);
}

/// The forward pass's activations for `n` tokens, allocated once per pass (once per run for
/// [`Model::decode_step`], which keeps them in the engine). d = hidden_size, ff =
/// intermediate_size.
pub struct DecodeState {
    x: Vec<f32>,    // [n, d] residual stream
    xn: Vec<f32>,   // [n, d] normed input of a block
    q: Vec<f32>,    // [n, q_dim]
    k: Vec<f32>,    // [n, kv_dim]
    v: Vec<f32>,    // [n, kv_dim]
    att: Vec<f32>,  // [n, q_dim]
    proj: Vec<f32>, // [n, d] output of o_proj / the MLP
    gate: Vec<f32>, // [n, ff]
    up: Vec<f32>,   // [n, ff]
}

impl DecodeState {
    pub fn new(c: &ModelConfig, n: usize) -> Self {
        let hd = c.head_dim();
        let (d, ff, q_dim, kv_dim) =
            (c.hidden_size, c.intermediate_size, c.num_attention_heads * hd, c.n_kv_heads() * hd);
        DecodeState {
            x: vec![0.0; n * d],
            xn: vec![0.0; n * d],
            q: vec![0.0; n * q_dim],
            k: vec![0.0; n * kv_dim],
            v: vec![0.0; n * kv_dim],
            att: vec![0.0; n * q_dim],
            proj: vec![0.0; n * d],
            gate: vec![0.0; n * ff],
            up: vec![0.0; n * ff],
        }
    }
}
