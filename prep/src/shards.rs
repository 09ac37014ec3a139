//! Reading back the Arrow IPC mask shards written by `prep capture` (used by cluster and report).

use anyhow::{bail, Context, Result};
use arrow_array::{Array, FixedSizeBinaryArray, FixedSizeListArray, Float16Array, UInt32Array};
use std::path::{Path, PathBuf};

/// Every mask column of a capture, concatenated across shards in file order.
pub struct CapturedMasks {
    /// Column names (`mask_l05`, or `gate_mask_l05` / `up_mask_l05`).
    pub names: Vec<String>,
    /// Per column: `rows x width` bytes of bit-packed masks.
    pub cols: Vec<Vec<u8>>,
    /// Bytes per mask.
    pub width: usize,
    /// Neurons per mask (the model's intermediate size).
    pub n_ff: usize,
    /// Sequence index of every row.
    pub sequence: Vec<u32>,
}

impl CapturedMasks {
    pub fn rows(&self) -> usize {
        self.sequence.len()
    }
}

pub use formats::centroids::overlap;

/// The layer a mask column belongs to (`mask_l05` -> 5).
pub fn layer_of(column: &str) -> usize {
    column.rsplit("_l").next().and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The masks-*.arrow shards of a capture directory, in the order every reader concatenates them.
pub fn shard_paths(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut shards: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("{}: cannot read the capture directory", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("masks-") && n.ends_with(".arrow"))
        })
        .collect();
    shards.sort();
    if shards.is_empty() {
        bail!("{}: no masks-*.arrow shard (run `prep capture` first)", dir.display());
    }
    Ok(shards)
}

/// The hidden state after layer 0 of every captured token, `[rows, d]` as f32, and d.
pub fn read_hidden0(dir: &Path) -> Result<(Vec<f32>, usize)> {
    let mut out = Vec::new();
    let mut d = 0;
    for shard in shard_paths(dir)? {
        let f = std::fs::File::open(&shard).with_context(|| format!("{}: cannot open", shard.display()))?;
        let reader = arrow_ipc::reader::FileReader::try_new(f, None)
            .with_context(|| format!("{}: not an Arrow IPC file", shard.display()))?;
        for batch in reader {
            let batch = batch.with_context(|| format!("{}: corrupt record batch", shard.display()))?;
            let col = batch
                .column_by_name("hidden_after_layer0")
                .with_context(|| format!("{}: no hidden_after_layer0 column", shard.display()))?;
            let list = col
                .as_any()
                .downcast_ref::<FixedSizeListArray>()
                .context("hidden_after_layer0 is not a FixedSizeList")?;
            d = list.value_length() as usize;
            let values = list
                .values()
                .as_any()
                .downcast_ref::<Float16Array>()
                .context("hidden_after_layer0 items are not Float16")?;
            out.extend(values.values().iter().map(|v| v.to_f32()));
        }
    }
    Ok((out, d))
}

pub fn read_masks(dir: &Path) -> Result<CapturedMasks> {
    let shards = shard_paths(dir)?;
    let mut m = CapturedMasks { names: vec![], cols: vec![], width: 0, n_ff: 0, sequence: vec![] };
    for shard in &shards {
        let f = std::fs::File::open(shard).with_context(|| format!("{}: cannot open", shard.display()))?;
        let reader = arrow_ipc::reader::FileReader::try_new(f, None)
            .with_context(|| format!("{}: not an Arrow IPC file", shard.display()))?;
        let schema = reader.schema();
        m.n_ff = schema
            .metadata()
            .get("intermediate_size")
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("{}: no intermediate_size in the schema metadata", shard.display()))?;
        let these: Vec<String> =
            schema.fields().iter().map(|f| f.name().clone()).filter(|n| n.contains("mask_l")).collect();
        if m.names.is_empty() {
            m.cols = vec![Vec::new(); these.len()];
            m.names = these;
        } else if these != m.names {
            bail!("{}: mask columns differ from the other shards' (mixed captures?)", shard.display());
        }
        for batch in reader {
            let batch = batch.with_context(|| format!("{}: corrupt record batch", shard.display()))?;
            let seq = batch.column_by_name("sequence").context("no sequence column")?;
            m.sequence
                .extend(seq.as_any().downcast_ref::<UInt32Array>().context("sequence is not UInt32")?.values().iter());
            for (i, n) in m.names.iter().enumerate() {
                let a = batch
                    .column_by_name(n)
                    .unwrap()
                    .as_any()
                    .downcast_ref::<FixedSizeBinaryArray>()
                    .context("mask column is not FixedSizeBinary")?;
                m.width = a.value_length() as usize;
                m.cols[i].extend_from_slice(a.value_data());
            }
        }
    }
    if m.width != m.n_ff.div_ceil(8) {
        bail!("{}: masks are {} bytes wide but hold {} neurons", dir.display(), m.width, m.n_ff);
    }
    Ok(m)
}
