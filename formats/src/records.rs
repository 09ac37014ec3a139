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

use crate::error::{FormatError, Result};
use half::f16;
use std::path::Path;

pub const RECORD_MAGIC: [u8; 8] = *b"NPRECv1\0";
pub const RECORD_FORMAT_VERSION: u32 = 1;
pub const RECORD_HEADER_BYTES: usize = 512;
/// O_DIRECT granularity every record size and offset is a multiple of.
pub const RECORD_ALIGN_BYTES: usize = 512;
pub const DTYPE_F16: u32 = 1;

/// Byte offset in `records.bin` of the record of (`layer`, `neuron`): layer-major from
/// `first_layer`, `neurons_per_layer` records of `record_bytes` each.
pub fn record_offset(first_layer: usize, neurons_per_layer: usize, record_bytes: usize, layer: usize, neuron: usize) -> u64 {
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
pub fn check_record(bytes: &[u8], path: &Path, file_offset: u64, layer: u32, neuron: u32, d_model: usize) -> Result<RecordHeader> {
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
            assert!(e.contains("CRC32C mismatch") && e.contains("layer 7, neuron 123") && e.contains("offset 4096"), "{e}");
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
}

impl RecordFile {
    pub fn open(path: &Path, d_model: usize, first_layer: usize, n_layers: usize, neurons_per_layer: usize) -> Result<Self> {
        let file = std::fs::File::open(path).map_err(|e| FormatError::io(path, e))?;
        let len = file.metadata().map_err(|e| FormatError::io(path, e))?.len();
        let want = ((n_layers - first_layer) * neurons_per_layer * record_bytes(d_model)) as u64;
        if len != want {
            return Err(FormatError::Truncated {
                path: path.to_path_buf(),
                offset: len.min(want),
                what: format!("records of layers {first_layer}..{n_layers} x {neurons_per_layer} neurons"),
                needed: want,
                file_bytes: len,
            });
        }
        Ok(RecordFile { path: path.to_path_buf(), file, d_model, first_layer, neurons_per_layer, n_layers })
    }

    pub fn offset(&self, layer: usize, neuron: usize) -> u64 {
        record_offset(self.first_layer, self.neurons_per_layer, record_bytes(self.d_model), layer, neuron)
    }

    pub fn read(&self, layer: usize, neuron: usize) -> Result<NeuronRows> {
        use std::os::unix::fs::FileExt;
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
