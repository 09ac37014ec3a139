//! `PromptStager`: a prompt's streamed layers, each whole MLP staged from storage for a batch
//! of prompt tokens. A thread of its own reads layer by layer with O_DIRECT into aligned
//! buffers, one layer ahead of the layer being computed (double buffering: the engine asks for
//! layer l+1 as it starts computing layer l), so the reads overlap the batched matmuls.
//!
//! What a layer is staged from:
//! - `dense_mlp.safetensors` (a native preparation): the GGUF's own blocks, each tensor read
//!   into the buffer the layer's matrices then borrow: the prompt is computed exactly as the
//!   dense model computes it.
//! - otherwise `records.bin`: the layer's records, one sequential read, each record checked
//!   (header, CRC32C) and the MLP rebuilt as a dense layer from records is
//!   (`model::mlp_from_layer_records`).

use super::aligned::{AlignedBuf, DIRECT_ALIGN_BYTES};
use crate::error::{Result, RuntimeError};
use crate::model::DenseMlp;
use crate::tensor::{F16Matrix, Matrix, QMatrix, SharedBytes};
use formats::records::RecordShape;
use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{mpsc, Arc};

/// One stored MLP tensor of `dense_mlp.safetensors`: `[rows, cols]`, GGML blocks or f16, at
/// `offset..offset + bytes` of the file.
#[derive(Debug, Clone)]
pub struct StoredTensor {
    rows: usize,
    cols: usize,
    ggml: Option<formats::ggml_quants::GgmlType>,
    offset: u64,
    bytes: usize,
}

/// Where a layer's whole MLP is read from.
#[derive(Debug, Clone)]
pub enum StageSource {
    /// `dense_mlp.safetensors`: per layer from `first_layer`, its gate, up and down tensors.
    DenseMlp { path: PathBuf, first_layer: usize, layers: Vec<[StoredTensor; 3]> },
    /// `records.bin`: a layer's `n_ff` records of `record_bytes`, layer-major from `first_layer`.
    Records {
        path: PathBuf,
        first_layer: usize,
        d_model: usize,
        n_ff: usize,
        record_bytes: usize,
        shape: Option<RecordShape>,
    },
}

impl StageSource {
    /// The preparation's `dense_mlp.safetensors` when it has one (a native preparation), else
    /// its `records.bin`.
    pub fn of(manifest_path: &Path, m: &formats::manifest::Manifest, records_path: &Path) -> Result<Self> {
        let c = &m.model;
        let first_layer = m.records.first_layer;
        let Some(a) = m.artifacts.iter().find(|a| a.role == formats::dense_mlp::ARTIFACT_ROLE) else {
            return Ok(StageSource::Records {
                path: records_path.to_path_buf(),
                first_layer,
                d_model: c.hidden_size,
                n_ff: c.intermediate_size,
                record_bytes: m.records.record_bytes,
                shape: crate::model::records_shape(manifest_path, m)?,
            });
        };
        let path = m.artifact_path(manifest_path, a);
        let f = formats::safetensors_io::MappedSafetensors::open(&path)?;
        let (d, ff) = (c.hidden_size, c.intermediate_size);
        let mut layers = Vec::new();
        for l in first_layer..c.num_hidden_layers {
            let n = formats::model_dir::layer_tensor_names(l);
            let tensor = |name: &str, rows: usize, cols: usize| -> Result<StoredTensor> {
                let e = f
                    .tensors
                    .get(name)
                    .ok_or_else(|| formats::FormatError::MissingTensor { path: path.clone(), tensor: name.into() })?;
                if e.logical_shape() != [rows, cols] {
                    return Err(formats::FormatError::ShapeMismatch {
                        path: path.clone(),
                        tensor: name.into(),
                        expected: vec![rows, cols],
                        actual: e.logical_shape(),
                    }
                    .into());
                }
                let supported = match e.ggml {
                    Some(ty) => crate::ops::qmatmul::activation_type(ty).is_some(),
                    None => e.dtype == safetensors::Dtype::F16,
                };
                if !supported {
                    let type_name = e.ggml.map_or(format!("{:?}", e.dtype), |t| t.name().to_string());
                    return Err(formats::FormatError::UnsupportedStoredType {
                        path: path.clone(),
                        tensor: name.into(),
                        type_name,
                    }
                    .into());
                }
                Ok(StoredTensor {
                    rows,
                    cols,
                    ggml: e.ggml,
                    offset: e.byte_range.start as u64,
                    bytes: e.byte_range.len(),
                })
            };
            layers.push([tensor(&n.gate_proj, ff, d)?, tensor(&n.up_proj, ff, d)?, tensor(&n.down_proj, d, ff)?]);
        }
        Ok(StageSource::DenseMlp { path, first_layer, layers })
    }

    /// Bytes of the buffer any of its layers is read into (the largest layer's aligned reads).
    fn buffer_bytes(&self) -> usize {
        match self {
            StageSource::DenseMlp { first_layer, layers, .. } => {
                (0..layers.len()).map(|i| self.layer_read_bytes(first_layer + i)).max().unwrap_or(0) as usize
            }
            StageSource::Records { n_ff, record_bytes, .. } => n_ff * record_bytes + DIRECT_ALIGN_BYTES,
        }
    }

    /// The file staging reads.
    pub fn path(&self) -> &Path {
        match self {
            StageSource::DenseMlp { path, .. } | StageSource::Records { path, .. } => path,
        }
    }

    /// Bytes read to stage layer `layer`.
    pub fn layer_read_bytes(&self, layer: usize) -> u64 {
        match self {
            StageSource::DenseMlp { first_layer, layers, .. } => {
                layers[layer - first_layer].iter().map(|t| aligned_span(t.offset, t.bytes).1 as u64).sum()
            }
            StageSource::Records { n_ff, record_bytes, .. } => (n_ff * record_bytes) as u64,
        }
    }

    /// Layer `layer`'s MLP, read from `file` (opened on [`StageSource::path`]) into a buffer of
    /// `pool` that no staged layer borrows any more: a GGUF layer's matrices borrow it (two
    /// suffice: the layer computed and the one read); records are rebuilt from it.
    fn stage(
        &self,
        file: &File,
        layer: usize,
        pool: &mut Vec<Arc<AlignedBuf>>,
        buffer_bytes: usize,
    ) -> Result<DenseMlp> {
        match self {
            StageSource::DenseMlp { path, first_layer, layers } => {
                let tensors = &layers[layer - first_layer];
                // each tensor at its own aligned place in one buffer
                let spans: Vec<(u64, usize)> = tensors.iter().map(|t| aligned_span(t.offset, t.bytes)).collect();
                let slot = free_buffer(pool, buffer_bytes);
                let buf = Arc::get_mut(slot).expect("no staged layer borrows it");
                let mut at = 0;
                for (t, &(start, len)) in tensors.iter().zip(&spans) {
                    let need = (t.offset - start) as usize + t.bytes;
                    read_direct(file, path, start, &mut buf.as_mut_slice()[at..at + len], need)?;
                    at += len;
                }
                let shared: SharedBytes = slot.clone();
                let mut at = 0;
                let mut m = tensors.iter().zip(&spans).map(|(t, &(start, len))| {
                    let off = at + (t.offset - start) as usize;
                    at += len;
                    match t.ggml {
                        Some(ty) => Matrix::Quant(QMatrix::mapped(ty, t.rows, t.cols, shared.clone(), off)),
                        None => Matrix::F16(F16Matrix::mapped(t.rows, t.cols, shared.clone(), off)),
                    }
                });
                let (w_gate, w_up, w_down) = (m.next().unwrap(), m.next().unwrap(), m.next().unwrap());
                Ok(DenseMlp { w_gate, w_up, w_down })
            }
            StageSource::Records { path, first_layer, d_model, n_ff, record_bytes, shape } => {
                let bytes = n_ff * record_bytes;
                let offset = ((layer - first_layer) * bytes) as u64;
                let (start, len) = aligned_span(offset, bytes);
                let buf = Arc::get_mut(free_buffer(pool, buffer_bytes)).expect("a free buffer");
                read_direct(file, path, start, &mut buf.as_mut_slice()[..len], (offset - start) as usize + bytes)?;
                let at = (offset - start) as usize;
                crate::model::mlp_from_layer_records(
                    &buf.as_slice()[at..at + bytes],
                    path,
                    offset,
                    layer,
                    *d_model,
                    *n_ff,
                    *shape,
                )
            }
        }
    }
}

/// A buffer of `pool` no staged layer borrows (of `len_bytes`: every staging of a source asks
/// [`StageSource::buffer_bytes`]), allocated the first time: staging allocates nothing per layer.
fn free_buffer(pool: &mut Vec<Arc<AlignedBuf>>, len_bytes: usize) -> &mut Arc<AlignedBuf> {
    let free = match pool.iter_mut().position(|b| b.len() >= len_bytes && Arc::get_mut(b).is_some()) {
        Some(i) => i,
        None => {
            pool.push(Arc::new(AlignedBuf::new(len_bytes)));
            pool.len() - 1
        }
    };
    &mut pool[free]
}

/// The aligned read covering `bytes` at `offset`: (its start, its length).
fn aligned_span(offset: u64, bytes: usize) -> (u64, usize) {
    let a = DIRECT_ALIGN_BYTES as u64;
    let start = offset / a * a;
    let end = (offset + bytes as u64).div_ceil(a) * a;
    (start, (end - start) as usize)
}

/// Reads into `buf` from `offset` until at least `need` bytes have landed (the aligned tail may
/// run past the end of the file).
fn read_direct(file: &File, path: &Path, offset: u64, buf: &mut [u8], need: usize) -> Result<()> {
    let mut done = 0;
    while done < need {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(formats::FormatError::Truncated {
                    path: path.to_path_buf(),
                    offset: offset + done as u64,
                    what: "a prompt's staged MLP".into(),
                    needed: offset + need as u64,
                    file_bytes: offset + done as u64,
                }
                .into())
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(source) => {
                return Err(RuntimeError::Io { path: path.to_path_buf(), offset: Some(offset + done as u64), source })
            }
        }
    }
    Ok(())
}

/// The staging thread and the layers asked of it, in order.
pub struct PromptStager {
    ask: Option<mpsc::Sender<usize>>,
    staged: mpsc::Receiver<(usize, Result<DenseMlp>)>,
    /// Layers asked for and not yet taken, in the order asked.
    in_flight: VecDeque<usize>,
    thread: Option<std::thread::JoinHandle<()>>,
    bytes_read: Arc<AtomicU64>,
    /// Why reads go through the page cache instead of O_DIRECT (None: O_DIRECT).
    pub fallback: Option<String>,
}

impl PromptStager {
    /// Opens `source`'s file (O_DIRECT where the file system has it) and starts the thread.
    pub fn start(source: StageSource) -> Result<Self> {
        let path = source.path().to_path_buf();
        let io = |source| RuntimeError::Io { path: path.clone(), offset: None, source };
        let (file, fallback) = match std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path) {
            Ok(f) => (f, None),
            Err(e) => (File::open(&path).map_err(io)?, Some(format!("O_DIRECT unavailable ({e})"))),
        };
        let (ask, asked) = mpsc::channel::<usize>();
        let (done, staged) = mpsc::channel();
        let bytes_read = Arc::new(AtomicU64::new(0));
        let counter = bytes_read.clone();
        let thread = std::thread::Builder::new()
            .name("prompt-stager".into())
            .spawn(move || {
                let mut pool = Vec::new();
                let buffer_bytes = source.buffer_bytes();
                for layer in asked {
                    let r = source.stage(&file, layer, &mut pool, buffer_bytes);
                    if r.is_ok() {
                        counter.fetch_add(source.layer_read_bytes(layer), Relaxed);
                    }
                    if done.send((layer, r)).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| RuntimeError::Io { path: path.clone(), offset: None, source: e })?;
        Ok(PromptStager {
            ask: Some(ask),
            staged,
            in_flight: VecDeque::new(),
            thread: Some(thread),
            bytes_read,
            fallback,
        })
    }

    /// Starts reading `layer` after the layers already asked for.
    pub fn ask(&mut self, layer: usize) -> Result<()> {
        let sent = self.ask.as_ref().is_some_and(|a| a.send(layer).is_ok());
        if !sent {
            return Err(RuntimeError::Internal("the prompt staging thread has stopped".into()));
        }
        self.in_flight.push_back(layer);
        Ok(())
    }

    /// Whether `layer` is the next one asked for and not taken.
    pub fn is_next(&self, layer: usize) -> bool {
        self.in_flight.front() == Some(&layer)
    }

    /// Layers asked for and not yet taken.
    pub fn pending(&self) -> usize {
        self.in_flight.len()
    }

    /// The next layer asked for, staged (waits for its read).
    pub fn take(&mut self) -> Result<(usize, DenseMlp)> {
        let want = self
            .in_flight
            .pop_front()
            .ok_or_else(|| RuntimeError::Internal("a staged layer was taken that was never asked for".into()))?;
        let (layer, r) =
            self.staged.recv().map_err(|_| RuntimeError::Internal("the prompt staging thread has stopped".into()))?;
        if layer != want {
            return Err(RuntimeError::Internal(format!("staged layer {layer} arrived where layer {want} was due")));
        }
        Ok((layer, r?))
    }

    /// Waits out and drops every layer asked for and not taken (a prompt that failed part-way).
    pub fn drain(&mut self) {
        while !self.in_flight.is_empty() {
            let _ = self.take();
        }
    }

    /// Bytes read by staging so far.
    pub fn bytes_read(&self) -> u64 {
        self.bytes_read.load(Relaxed)
    }
}

impl Drop for PromptStager {
    fn drop(&mut self) {
        self.ask.take();
        self.drain();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
