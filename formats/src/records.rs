//! `records.bin`: one fixed-size record per intermediate neuron of a sparse layer, so that
//! any run of consecutive records can be read with O_DIRECT (every record is a multiple of
//! 512 bytes and starts at a multiple of 512).
//!
//! ```text
//! offset  size  field
//!      0     8  magic "NPRECv1\0"
//!      8     4  format version (u32, = RECORD_FORMAT_VERSION)
//!     12     4  layer (u32)
//!     16     4  neuron (u32)
//!     20     4  dtype (u32: 1 = f16)
//!     24     4  d_model (u32)
//!     28     4  CRC32C of the payload (u32)
//!     32     8  payload bytes (u64) = 3 * d_model * dtype size
//!     40   472  zero
//!    512     -  payload: gate row [d_model], up row [d_model], row of W_down^T [d_model]
//!           -   zero padding to a multiple of 512
//! ```
//! For Mistral-7B at f16 (d_model 4096) a record is 512 + 3 * 4096 * 2 = 25,088 bytes (24.5 KiB).
//!
//! Version 2 (a preparation that ships a GGUF's own blocks): the gate and up rows in the
//! model's block type, byte-equal to its rows (a GGUF gate/up row is one neuron's blocks), and
//! the W_down column requantized along d_model (Q8_0 by default; `[pack] down` picks Q5_0
//! or Q4_K, the header names it). The down row comes first, in a section of
//! its own that checks itself, so the scorer reads it alone with one 512-aligned O_DIRECT read:
//!
//! ```text
//! offset        size  field
//!      0           8  magic "NPRECv2\0"
//!      8           4  format version (u32, = 2)
//!     12           4  layer (u32)
//!     16           4  neuron (u32)
//!     20           4  gate/up GGML type id (u32)
//!     24           4  d_model (u32)
//!     28           4  CRC32C of the gate and up rows (u32)
//!     32           4  down GGML type id (u32: 8 = Q8_0, 6 = Q5_0, 12 = Q4_K)
//!     36         476  zero
//!    512          16  down section: layer (u32), neuron (u32), CRC32C of the down row (u32), zero
//!    528           -  down row: W_down[:, neuron] as blocks of the down type, zero padding to a multiple of 512
//!      G           -  gate row, up row (blocks), zero padding to a multiple of 512
//! ```
//! Qwen2.5-1.5B (d 1536, Q4_K): 512 + 2,048 + 2,048 = 4,608 bytes (v1: 9,728), with Q4_K down
//! rows 512 + 1,024 + 2,048 = 3,584; Mistral-7B (d 4096, Q4_K): 512 + 4,608 + 4,608 = 9,728
//! (v1: 25,088), with Q4_K down rows 512 + 2,560 + 4,608 = 7,680.

use crate::error::{FormatError, Result};
use crate::ggml_quants::GgmlType;
use half::f16;
use std::path::Path;

pub const RECORD_MAGIC_V2: [u8; 8] = *b"NPRECv2\0";
/// The down section's own header: layer, neuron, CRC32C, zero.
pub const DOWN_PREFIX_BYTES: usize = 16;

/// The layout of a version-2 record: the model width and the block types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordShape {
    pub d_model: usize,
    pub gate_up: GgmlType,
    pub down: GgmlType,
}

impl RecordShape {
    pub fn gate_up_row_bytes(&self) -> usize {
        self.d_model / self.gate_up.block_elements() * self.gate_up.block_bytes()
    }
    pub fn down_row_bytes(&self) -> usize {
        self.d_model / self.down.block_elements() * self.down.block_bytes()
    }
    /// The down section (prefix + row, padded): what the scorer reads, at offset 512.
    pub fn down_section_bytes(&self) -> usize {
        (DOWN_PREFIX_BYTES + self.down_row_bytes()).div_ceil(RECORD_ALIGN_BYTES) * RECORD_ALIGN_BYTES
    }
    pub fn gate_offset(&self) -> usize {
        RECORD_HEADER_BYTES + self.down_section_bytes()
    }
    pub fn record_bytes(&self) -> usize {
        self.gate_offset() + (2 * self.gate_up_row_bytes()).div_ceil(RECORD_ALIGN_BYTES) * RECORD_ALIGN_BYTES
    }
    /// d_model is whole blocks of both types, and the down type is one records hold
    /// ([`crate::ggml_quants::QUANTIZABLE`]).
    pub fn check(&self) -> std::result::Result<(), String> {
        if !crate::ggml_quants::QUANTIZABLE.contains(&self.down) {
            let names: Vec<&str> = crate::ggml_quants::QUANTIZABLE.iter().map(|t| t.name()).collect();
            return Err(format!("down rows of {}: records hold {}", self.down.name(), names.join(", ")));
        }
        for t in [self.gate_up, self.down] {
            if !t.is_block_quantized() || !self.d_model.is_multiple_of(t.block_elements()) {
                return Err(format!("d_model {} is not whole {} blocks", self.d_model, t.name()));
            }
        }
        Ok(())
    }
}

/// Encodes one neuron's version-2 record into `out` (`shape.record_bytes()` long): `gate`,
/// `up` the model's blocks, `down` the Q8_0 blocks of its W_down column.
pub fn encode_record_v2(
    shape: &RecordShape,
    layer: u32,
    neuron: u32,
    gate: &[u8],
    up: &[u8],
    down: &[u8],
    out: &mut [u8],
) {
    let (gb, db) = (shape.gate_up_row_bytes(), shape.down_row_bytes());
    assert!(gate.len() == gb && up.len() == gb && down.len() == db && out.len() == shape.record_bytes());
    out.fill(0);
    let g = shape.gate_offset();
    out[g..g + gb].copy_from_slice(gate);
    out[g + gb..g + 2 * gb].copy_from_slice(up);
    let gate_up_crc = crc32c::crc32c(&out[g..g + 2 * gb]);
    let ds = RECORD_HEADER_BYTES;
    out[ds + DOWN_PREFIX_BYTES..ds + DOWN_PREFIX_BYTES + db].copy_from_slice(down);
    out[ds..ds + 4].copy_from_slice(&layer.to_le_bytes());
    out[ds + 4..ds + 8].copy_from_slice(&neuron.to_le_bytes());
    out[ds + 8..ds + 12].copy_from_slice(&crc32c::crc32c(down).to_le_bytes());
    out[0..8].copy_from_slice(&RECORD_MAGIC_V2);
    out[8..12].copy_from_slice(&2u32.to_le_bytes());
    out[12..16].copy_from_slice(&layer.to_le_bytes());
    out[16..20].copy_from_slice(&neuron.to_le_bytes());
    out[20..24].copy_from_slice(&shape.gate_up.id().to_le_bytes());
    out[24..28].copy_from_slice(&(shape.d_model as u32).to_le_bytes());
    out[28..32].copy_from_slice(&gate_up_crc.to_le_bytes());
    out[32..36].copy_from_slice(&shape.down.id().to_le_bytes());
}

/// Checks a version-2 down section read from `path` at `file_offset` (`shape.down_section_bytes()`):
/// the layer and neuron it names and its CRC32C. Returns the down row's blocks.
pub fn check_down_section<'a>(
    section: &'a [u8],
    path: &Path,
    file_offset: u64,
    layer: u32,
    neuron: u32,
    shape: &RecordShape,
) -> Result<&'a [u8]> {
    let corrupt = |what: String| FormatError::Corrupt {
        path: path.to_path_buf(),
        offset: file_offset,
        what: format!("down row of layer {layer}, neuron {neuron}: {what}"),
    };
    if section.len() < DOWN_PREFIX_BYTES + shape.down_row_bytes() {
        return Err(corrupt(format!(
            "{} bytes, expected {}",
            section.len(),
            DOWN_PREFIX_BYTES + shape.down_row_bytes()
        )));
    }
    let u32_at = |o: usize| u32::from_le_bytes(section[o..o + 4].try_into().unwrap());
    if u32_at(0) != layer || u32_at(4) != neuron {
        return Err(corrupt(format!("the section says layer {}, neuron {}", u32_at(0), u32_at(4))));
    }
    let row = &section[DOWN_PREFIX_BYTES..DOWN_PREFIX_BYTES + shape.down_row_bytes()];
    let crc = crc32c::crc32c(row);
    if crc != u32_at(8) {
        return Err(corrupt(format!("CRC32C mismatch (stored {:08x}, computed {crc:08x})", u32_at(8))));
    }
    Ok(row)
}

/// Checks a whole version-2 record: header, types, the gate/up CRC32C and the down section.
/// Returns (gate, up, down) blocks.
pub fn check_record_v2<'a>(
    bytes: &'a [u8],
    path: &Path,
    file_offset: u64,
    layer: u32,
    neuron: u32,
    shape: &RecordShape,
) -> Result<(&'a [u8], &'a [u8], &'a [u8])> {
    let corrupt = |what: String| FormatError::Corrupt {
        path: path.to_path_buf(),
        offset: file_offset,
        what: format!("record of layer {layer}, neuron {neuron}: {what}"),
    };
    if bytes.len() != shape.record_bytes() {
        return Err(corrupt(format!("{} bytes, expected {}", bytes.len(), shape.record_bytes())));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    if bytes[0..8] != RECORD_MAGIC_V2 {
        return Err(corrupt(if bytes[0..8] == RECORD_MAGIC {
            "a version-1 (f16) record where the manifest says version 2".into()
        } else {
            "bad magic".into()
        }));
    }
    if u32_at(8) != 2 {
        return Err(corrupt(format!("format version {}, expected 2", u32_at(8))));
    }
    let name = |id: u32| GgmlType::from_id(id).map(|t| t.name()).unwrap_or("unknown");
    if u32_at(20) != shape.gate_up.id() || u32_at(32) != shape.down.id() {
        return Err(corrupt(format!(
            "rows of {} (down {}), the manifest says {} (down {})",
            name(u32_at(20)),
            name(u32_at(32)),
            shape.gate_up.name(),
            shape.down.name()
        )));
    }
    if u32_at(12) != layer || u32_at(16) != neuron || u32_at(24) as usize != shape.d_model {
        return Err(corrupt(format!(
            "header says layer {}, neuron {}, d_model {}",
            u32_at(12),
            u32_at(16),
            u32_at(24)
        )));
    }
    let (g, gb) = (shape.gate_offset(), shape.gate_up_row_bytes());
    let crc = crc32c::crc32c(&bytes[g..g + 2 * gb]);
    if crc != u32_at(28) {
        return Err(corrupt(format!("CRC32C mismatch (stored {:08x}, computed {crc:08x})", u32_at(28))));
    }
    let down = check_down_section(
        &bytes[RECORD_HEADER_BYTES..g],
        path,
        file_offset + RECORD_HEADER_BYTES as u64,
        layer,
        neuron,
        shape,
    )?;
    Ok((&bytes[g..g + gb], &bytes[g + gb..g + 2 * gb], down))
}

pub const RECORD_MAGIC: [u8; 8] = *b"NPRECv1\0";
pub const RECORD_FORMAT_VERSION: u32 = 1;
pub const RECORD_HEADER_BYTES: usize = 512;
/// O_DIRECT granularity every record size and offset is a multiple of.
pub const RECORD_ALIGN_BYTES: usize = 512;
pub const DTYPE_F16: u32 = 1;

/// Byte offset in `records.bin` of the record of (`layer`, `neuron`): layer-major from
/// `first_layer`, `neurons_per_layer` records of `record_bytes` each.
pub fn record_offset(
    first_layer: usize,
    neurons_per_layer: usize,
    record_bytes: usize,
    layer: usize,
    neuron: usize,
) -> u64 {
    (((layer - first_layer) * neurons_per_layer + neuron) * record_bytes) as u64
}

/// Size of one record for a model width, in bytes (header + payload, padded).
pub fn record_bytes(d_model: usize) -> usize {
    (RECORD_HEADER_BYTES + 3 * d_model * 2).div_ceil(RECORD_ALIGN_BYTES) * RECORD_ALIGN_BYTES
}

/// Header fields of one record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub layer: u32,
    pub neuron: u32,
    pub d_model: u32,
    pub crc32c: u32,
    pub payload_bytes: u64,
}

/// Encodes one neuron's rows into `out` (`record_bytes(d_model)` long).
pub fn encode_record(layer: u32, neuron: u32, gate: &[f16], up: &[f16], down_t: &[f16], out: &mut [u8]) {
    let d = gate.len();
    assert!(up.len() == d && down_t.len() == d, "gate, up and down^T rows must have the same length");
    assert_eq!(out.len(), record_bytes(d));
    out.fill(0);
    let payload_bytes = 3 * d * 2;
    {
        let payload = &mut out[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + payload_bytes];
        for (dst, v) in payload.chunks_exact_mut(2).zip(gate.iter().chain(up).chain(down_t)) {
            dst.copy_from_slice(&v.to_le_bytes());
        }
    }
    let crc = crc32c::crc32c(&out[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + payload_bytes]);
    out[0..8].copy_from_slice(&RECORD_MAGIC);
    out[8..12].copy_from_slice(&RECORD_FORMAT_VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&layer.to_le_bytes());
    out[16..20].copy_from_slice(&neuron.to_le_bytes());
    out[20..24].copy_from_slice(&DTYPE_F16.to_le_bytes());
    out[24..28].copy_from_slice(&(d as u32).to_le_bytes());
    out[28..32].copy_from_slice(&crc.to_le_bytes());
    out[32..40].copy_from_slice(&(payload_bytes as u64).to_le_bytes());
}

/// Checks one record read from `path` at `file_offset`: magic, version, the expected layer,
/// neuron and width, and the payload CRC. Returns the header; the payload is
/// `bytes[RECORD_HEADER_BYTES..][..payload_bytes]`.
pub fn check_record(
    bytes: &[u8],
    path: &Path,
    file_offset: u64,
    layer: u32,
    neuron: u32,
    d_model: usize,
) -> Result<RecordHeader> {
    let corrupt = |what: String| FormatError::Corrupt {
        path: path.to_path_buf(),
        offset: file_offset,
        what: format!("record of layer {layer}, neuron {neuron}: {what}"),
    };
    if bytes.len() != record_bytes(d_model) {
        return Err(corrupt(format!("{} bytes, expected {}", bytes.len(), record_bytes(d_model))));
    }
    let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().unwrap());
    if bytes[0..8] != RECORD_MAGIC {
        return Err(corrupt("bad magic".into()));
    }
    if u32_at(8) != RECORD_FORMAT_VERSION {
        return Err(corrupt(format!("format version {}, expected {RECORD_FORMAT_VERSION}", u32_at(8))));
    }
    let h = RecordHeader {
        layer: u32_at(12),
        neuron: u32_at(16),
        d_model: u32_at(24),
        crc32c: u32_at(28),
        payload_bytes: u64::from_le_bytes(bytes[32..40].try_into().unwrap()),
    };
    if h.layer != layer || h.neuron != neuron || h.d_model as usize != d_model || u32_at(20) != DTYPE_F16 {
        return Err(corrupt(format!(
            "header says layer {}, neuron {}, d_model {}, dtype {}",
            h.layer,
            h.neuron,
            h.d_model,
            u32_at(20)
        )));
    }
    if h.payload_bytes as usize != 3 * d_model * 2 {
        return Err(corrupt(format!("payload of {} bytes, expected {}", h.payload_bytes, 3 * d_model * 2)));
    }
    let crc = crc32c::crc32c(&bytes[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + h.payload_bytes as usize]);
    if crc != h.crc32c {
        return Err(corrupt(format!("CRC32C mismatch (stored {:08x}, computed {crc:08x})", h.crc32c)));
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mistral_7b_record_is_24_5_kib() {
        // Mistral-7B: hidden_size 4096, f16.
        assert_eq!(record_bytes(4096), 25_088);
        assert_eq!(record_bytes(4096) % RECORD_ALIGN_BYTES, 0);
        // SmolLM2-135M (576) and Qwen2.5-1.5B (1536)
        assert_eq!(record_bytes(576), 4096);
        assert_eq!(record_bytes(1536), 9728);
    }

    #[test]
    fn v2_round_trip_sizes_and_checks() {
        let shape = RecordShape { d_model: 1536, gate_up: GgmlType::Q4K, down: GgmlType::Q8_0 };
        assert_eq!(shape.record_bytes(), 4608);
        assert_eq!(RecordShape { d_model: 4096, ..shape }.record_bytes(), 9728);
        assert_eq!(RecordShape { d_model: 576, gate_up: GgmlType::Q4_1, down: GgmlType::Q8_0 }.record_bytes(), 2560);
        // fewer-bit down rows: one 512-byte sector less per down section where it pays
        let q4k = RecordShape { down: GgmlType::Q4K, ..shape };
        assert_eq!((q4k.down_section_bytes(), q4k.record_bytes()), (1024, 3584));
        assert_eq!(RecordShape { d_model: 4096, ..q4k }.record_bytes(), 7680);
        let smol = RecordShape { d_model: 576, gate_up: GgmlType::Q4_1, down: GgmlType::Q5_0 };
        assert_eq!((smol.down_section_bytes(), smol.record_bytes()), (512, 2048));
        assert!(RecordShape { down: GgmlType::Q4K, ..smol }
            .check()
            .unwrap_err()
            .contains("576 is not whole Q4_K blocks"));
        assert!(RecordShape { down: GgmlType::Q6K, ..shape }
            .check()
            .unwrap_err()
            .contains("down rows of Q6_K: records hold Q8_0, Q5_0, Q4_K"));
        let (gb, db) = (shape.gate_up_row_bytes(), shape.down_row_bytes());
        let gate: Vec<u8> = (0..gb).map(|i| i as u8).collect();
        let up: Vec<u8> = (0..gb).map(|i| (i * 7) as u8).collect();
        let down: Vec<u8> = (0..db).map(|i| (i * 3) as u8).collect();
        let mut rec = vec![0u8; shape.record_bytes()];
        encode_record_v2(&shape, 4, 99, &gate, &up, &down, &mut rec);
        let p = Path::new("records.bin");
        let (g, u, d) = check_record_v2(&rec, p, 0, 4, 99, &shape).unwrap();
        assert_eq!((g, u, d), (&gate[..], &up[..], &down[..]));
        // the down section alone, as the scorer reads it
        let sec = &rec[RECORD_HEADER_BYTES..shape.gate_offset()];
        assert_eq!(check_down_section(sec, p, 512, 4, 99, &shape).unwrap(), &down[..]);
        let e = check_down_section(sec, p, 512, 4, 98, &shape).unwrap_err().to_string();
        assert!(e.contains("the section says layer 4, neuron 99"), "{e}");
        for at in [shape.gate_offset() + 5, RECORD_HEADER_BYTES + DOWN_PREFIX_BYTES + 100] {
            let mut bad = rec.clone();
            bad[at] ^= 0x10;
            let e = check_record_v2(&bad, p, 0, 4, 99, &shape).unwrap_err().to_string();
            assert!(e.contains("CRC32C mismatch"), "{e}");
        }
        // another type than the manifest says: both names
        let e = check_record_v2(&rec, p, 0, 4, 99, &RecordShape { gate_up: GgmlType::Q6K, ..shape })
            .unwrap_err()
            .to_string();
        assert!(e.contains("bytes, expected") || (e.contains("Q4_K") && e.contains("Q6_K")), "{e}");
        let q6 = RecordShape { gate_up: GgmlType::Q6K, ..shape };
        let mut rec6 = vec![0u8; q6.record_bytes()];
        encode_record_v2(
            &q6,
            4,
            99,
            &vec![0; q6.gate_up_row_bytes()],
            &vec![0; q6.gate_up_row_bytes()],
            &down,
            &mut rec6,
        );
        let e = check_record_v2(&rec6[..shape.record_bytes()], p, 0, 4, 99, &shape);
        let e = e.unwrap_err().to_string();
        assert!(e.contains("rows of Q6_K") && e.contains("the manifest says Q4_K"), "{e}");
        // a v1 record where v2 is expected
        let mut v1 = vec![0u8; shape.record_bytes()];
        v1[..8].copy_from_slice(&RECORD_MAGIC);
        assert!(check_record_v2(&v1, p, 0, 4, 99, &shape).unwrap_err().to_string().contains("version-1"));
    }

    #[test]
    fn round_trip_and_crc_catches_a_flipped_bit() {
        let d = 576;
        let row = |k: f32| (0..d).map(|i| f16::from_f32(k * i as f32 / d as f32)).collect::<Vec<_>>();
        let (g, u, dt) = (row(1.0), row(-2.0), row(0.5));
        let mut rec = vec![0u8; record_bytes(d)];
        encode_record(7, 123, &g, &u, &dt, &mut rec);
        let p = Path::new("records.bin");
        let h = check_record(&rec, p, 4096, 7, 123, d).unwrap();
        assert_eq!((h.layer, h.neuron, h.payload_bytes), (7, 123, 3 * 576 * 2));
        let payload = &rec[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + 3 * d * 2];
        let decoded: Vec<f16> = payload.chunks_exact(2).map(|b| f16::from_le_bytes([b[0], b[1]])).collect();
        assert_eq!(&decoded[..d], &g[..]);
        assert_eq!(&decoded[d..2 * d], &u[..]);
        assert_eq!(&decoded[2 * d..], &dt[..]);
        for bit in [0usize, 7, 1000 * 8 + 3] {
            let mut bad = rec.clone();
            bad[RECORD_HEADER_BYTES + bit / 8] ^= 1 << (bit % 8);
            let e = check_record(&bad, p, 4096, 7, 123, d).unwrap_err().to_string();
            assert!(
                e.contains("CRC32C mismatch") && e.contains("layer 7, neuron 123") && e.contains("offset 4096"),
                "{e}"
            );
        }
        let e = check_record(&rec, p, 0, 7, 124, d).unwrap_err().to_string();
        assert!(e.contains("header says layer 7, neuron 123"), "{e}");
    }
}

/// One neuron's rows, read back from `records.bin`.
#[derive(Debug, Clone, PartialEq)]
pub struct NeuronRows {
    pub gate: Vec<f16>,
    pub up: Vec<f16>,
    pub down_t: Vec<f16>,
}

/// Positional reader of `records.bin` (buffered I/O; the streaming engine reads the same
/// layout with O_DIRECT). Every record read is checked: header and CRC32C.
pub struct RecordFile {
    pub path: std::path::PathBuf,
    file: std::fs::File,
    pub d_model: usize,
    pub first_layer: usize,
    pub neurons_per_layer: usize,
    pub n_layers: usize,
    /// Version-2 records; None: version 1 (f16).
    pub shape: Option<RecordShape>,
}

/// One neuron's version-2 rows: gate and up in the model's blocks, down in Q8_0.
#[derive(Debug, Clone, PartialEq)]
pub struct NeuronBlocks {
    pub gate: Vec<u8>,
    pub up: Vec<u8>,
    pub down: Vec<u8>,
}

impl RecordFile {
    pub fn open(
        path: &Path,
        d_model: usize,
        first_layer: usize,
        n_layers: usize,
        neurons_per_layer: usize,
    ) -> Result<Self> {
        Self::open_v(path, d_model, first_layer, n_layers, neurons_per_layer, None)
    }

    /// `shape`: version-2 records of that layout (None: version 1).
    pub fn open_v(
        path: &Path,
        d_model: usize,
        first_layer: usize,
        n_layers: usize,
        neurons_per_layer: usize,
        shape: Option<RecordShape>,
    ) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
        let len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
        let rb = shape.map_or(record_bytes(d_model), |s| s.record_bytes());
        let want = ((n_layers - first_layer) * neurons_per_layer * rb) as u64;
        let what = format!("records of layers {first_layer}..{n_layers} x {neurons_per_layer} neurons");
        if len < want {
            return Err(FormatError::Truncated {
                path: path.to_path_buf(),
                offset: len,
                what,
                needed: want,
                file_bytes: len,
            });
        }
        if len > want {
            return Err(FormatError::Corrupt {
                path: path.to_path_buf(),
                offset: want,
                what: format!(
                    "{} bytes after the {what} of {rb} bytes each (not this preparation's records?)",
                    len - want
                ),
            });
        }
        Ok(RecordFile { path: path.to_path_buf(), file, d_model, first_layer, neurons_per_layer, n_layers, shape })
    }

    pub fn record_bytes(&self) -> usize {
        self.shape.map_or(record_bytes(self.d_model), |s| s.record_bytes())
    }

    pub fn offset(&self, layer: usize, neuron: usize) -> u64 {
        record_offset(self.first_layer, self.neurons_per_layer, self.record_bytes(), layer, neuron)
    }

    /// Every record of `layer`, unchecked (`n_ff x record_bytes` bytes from [`RecordFile::offset`]
    /// of its neuron 0): a caller checks each record as it uses it.
    pub fn read_layer_bytes(&self, layer: usize) -> Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        assert!(layer >= self.first_layer && layer < self.n_layers);
        let mut buf = vec![0u8; self.neurons_per_layer * self.record_bytes()];
        self.file.read_exact_at(&mut buf, self.offset(layer, 0)).map_err(|e| FormatError::io(&self.path, e))?;
        Ok(buf)
    }

    /// A version-2 record's blocks, checked (header, types, both CRC32Cs).
    pub fn read_blocks(&self, layer: usize, neuron: usize) -> Result<NeuronBlocks> {
        use std::os::unix::fs::FileExt;
        let shape =
            self.shape.ok_or_else(|| FormatError::invalid(&self.path, "version-1 (f16) records have no blocks"))?;
        assert!(layer >= self.first_layer && layer < self.n_layers && neuron < self.neurons_per_layer);
        let off = self.offset(layer, neuron);
        let mut buf = vec![0u8; shape.record_bytes()];
        self.file.read_exact_at(&mut buf, off).map_err(|e| FormatError::io(&self.path, e))?;
        let (g, u, d) = check_record_v2(&buf, &self.path, off, layer as u32, neuron as u32, &shape)?;
        Ok(NeuronBlocks { gate: g.to_vec(), up: u.to_vec(), down: d.to_vec() })
    }

    /// A version-1 record's f16 rows, checked (header and CRC32C).
    pub fn read(&self, layer: usize, neuron: usize) -> Result<NeuronRows> {
        use std::os::unix::fs::FileExt;
        if self.shape.is_some() {
            return Err(FormatError::invalid(&self.path, "version-2 records hold blocks: read_blocks"));
        }
        assert!(layer >= self.first_layer && layer < self.n_layers && neuron < self.neurons_per_layer);
        let off = self.offset(layer, neuron);
        let mut buf = vec![0u8; record_bytes(self.d_model)];
        self.file.read_exact_at(&mut buf, off).map_err(|e| FormatError::io(&self.path, e))?;
        check_record(&buf, &self.path, off, layer as u32, neuron as u32, self.d_model)?;
        let d = self.d_model;
        let vals: Vec<f16> = buf[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + 3 * d * 2]
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]))
            .collect();
        Ok(NeuronRows { gate: vals[..d].to_vec(), up: vals[d..2 * d].to_vec(), down_t: vals[2 * d..].to_vec() })
    }
}
