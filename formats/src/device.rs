//! A device description: what the planner needs to know about the machine a model runs on.
//! `runtime probe-storage` measures one; `devices/*.toml` ship some from published figures.
//!
//! ```toml
//! name = "Jetson AGX Orin 32 GB + Samsung 990 PRO"
//! source = "published: ..."            # or "measured by runtime probe-storage on <date>"
//! threads = 8
//! memory_bandwidth_bytes_per_s = 204.8e9
//! decode_bytes_per_s = 60e9            # resident weight bytes the decode kernels stream per s
//! [[reads]]                            # random O_DIRECT reads: one row per (size, depth)
//! block_bytes = 4096
//! queue_depth = 32
//! iops = 1.4e6
//! ```

use crate::error::{FormatError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReadRate {
    pub block_bytes: u64,
    pub queue_depth: u32,
    /// Requests completed per second at this size and depth.
    pub iops: f64,
}

/// A streamed run's compute measured on this device (`probe-storage --manifest`): every row
/// held, so the time per token is compute alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCompute {
    /// The manifest's model_name.
    pub model: String,
    pub selector: String,
    pub compute_s_per_token: f64,
    /// The bytes the planner counts as read from memory per token at that operating point
    /// (class A3): a plan touching other bytes scales the time by the ratio.
    pub memory_bytes_per_token: f64,
    /// Compute-thread time per row read from storage (landing it in its slot), measured at a
    /// tight budget.
    #[serde(default)]
    pub landed_row_s: f64,
}

/// `Default` is empty and fails `validate`: it is there so code that builds one names the
/// required fields and leaves the optional calibrations to `..Default::default()`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeviceFile {
    pub name: String,
    /// Where the figures come from: "measured by ..." or "published: ...".
    pub source: String,
    pub threads: usize,
    pub memory_bandwidth_bytes_per_s: f64,
    /// Resident weight bytes the decode kernels stream per second (dense decode rate x bytes
    /// per token): compute time per layer is its resident bytes over this.
    pub decode_bytes_per_s: f64,
    pub reads: Vec<ReadRate>,
    /// llama.cpp's fixed cost per decoded token beyond streaming its weights (thread wake-ups
    /// and synchronisation, per op; optional, default 0): `make bench-frontier` calibrates it
    /// from llama.cpp's unconfined runs (1 / tok/s - file bytes / decode_bytes_per_s).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub llama_cpp_token_overhead_s: f64,
    /// The weight bytes per second llama.cpp's decode streams from memory (optional, default
    /// decode_bytes_per_s: ours): `make bench-frontier` fits it with the overhead to llama.cpp's
    /// unconfined runs (1 / tok/s = overhead + per-token bytes / rate, least squares over GGUFs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama_cpp_decode_bytes_per_s: Option<f64>,
    /// The rate llama.cpp's page faults read its re-read bytes (optional; default
    /// [`DeviceFile::fault_read_bytes_per_s`] from the O_DIRECT rows, which do not track the
    /// page-fault path from hour to hour): `make bench-frontier` calibrates it from a llama.cpp
    /// run that re-reads its whole per-token bytes (F16 at the grid's smallest budget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llama_cpp_fault_read_bytes_per_s: Option<f64>,
    /// Measured compute of prepared models (optional; without it compute is bytes over
    /// decode_bytes_per_s).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<ModelCompute>,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

impl DeviceFile {
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| FormatError::io(path, e))?;
        let d: DeviceFile = toml::from_str(&text)
            .map_err(|e| FormatError::invalid(path, format!("not a device file: {}", e.message())))?;
        d.validate().map_err(|m| FormatError::invalid(path, m))?;
        Ok(d)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        self.validate().map_err(|m| FormatError::invalid(path, m))?;
        let text = toml::to_string(self).map_err(|e| FormatError::invalid(path, e.to_string()))?;
        crate::safetensors_io::write_atomic(&crate::safetensors_io::tmp_path(path), path, text.as_bytes())
    }

    /// Every field present and positive, naming the first that is not.
    pub fn validate(&self) -> std::result::Result<(), String> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("{name} is {v}: expected a positive number"))
            }
        };
        if self.threads == 0 {
            return Err("threads is 0: expected at least 1".into());
        }
        positive("memory_bandwidth_bytes_per_s", self.memory_bandwidth_bytes_per_s)?;
        positive("decode_bytes_per_s", self.decode_bytes_per_s)?;
        if !(self.llama_cpp_token_overhead_s.is_finite() && self.llama_cpp_token_overhead_s >= 0.0) {
            return Err(format!(
                "llama_cpp_token_overhead_s is {}: expected a time >= 0",
                self.llama_cpp_token_overhead_s
            ));
        }
        if let Some(v) = self.llama_cpp_decode_bytes_per_s {
            positive("llama_cpp_decode_bytes_per_s", v)?;
        }
        if let Some(v) = self.llama_cpp_fault_read_bytes_per_s {
            positive("llama_cpp_fault_read_bytes_per_s", v)?;
        }
        if self.reads.is_empty() {
            return Err("no [[reads]] rows: the read rate at some block size and queue depth is needed".into());
        }
        for (i, r) in self.reads.iter().enumerate() {
            if r.block_bytes == 0 || r.queue_depth == 0 {
                return Err(format!("reads[{i}]: block_bytes and queue_depth must be positive"));
            }
            positive(&format!("reads[{i}].iops"), r.iops)?;
        }
        for (i, m) in self.models.iter().enumerate() {
            positive(&format!("models[{i}].compute_s_per_token"), m.compute_s_per_token)?;
            positive(&format!("models[{i}].memory_bytes_per_token"), m.memory_bytes_per_token)?;
            if !(m.landed_row_s.is_finite() && m.landed_row_s >= 0.0) {
                return Err(format!("models[{i}].landed_row_s is {}: expected a time >= 0", m.landed_row_s));
            }
        }
        Ok(())
    }

    /// Bytes per second llama.cpp's page faults read a GGUF it maps: the largest measured block
    /// size at queue depth 2 x threads (each thread waits on one fault read while the kernel's
    /// readahead has the next in flight). Checked against llama.cpp's disk reads and rates in
    /// `scripts/planner_check.py` (RESULTS #18 part 6).
    pub fn fault_read_bytes_per_s(&self) -> f64 {
        if let Some(v) = self.llama_cpp_fault_read_bytes_per_s {
            return v;
        }
        let largest = self.reads.iter().map(|r| r.block_bytes).max().unwrap_or(131072);
        largest as f64 / self.request_s(largest, 2 * self.threads as u32)
    }

    /// Seconds of I/O-machine time per request of `block_bytes` at `queue_depth`: measured rows
    /// at the deepest measured depth <= the one asked (the shallowest if none is), interpolated
    /// linearly in size between the two nearest measured sizes (a latency plus bytes over a
    /// bandwidth), and beyond the largest size at that size's bandwidth.
    pub fn request_s(&self, block_bytes: u64, queue_depth: u32) -> f64 {
        let depths: Vec<u32> = self.reads.iter().map(|r| r.queue_depth).collect();
        let depth = depths
            .iter()
            .copied()
            .filter(|&q| q <= queue_depth)
            .max()
            .unwrap_or_else(|| depths.iter().copied().min().unwrap_or(1));
        let mut rows: Vec<(f64, f64)> = self
            .reads
            .iter()
            .filter(|r| r.queue_depth == depth)
            .map(|r| (r.block_bytes as f64, 1.0 / r.iops))
            .collect();
        rows.sort_by(|a, b| a.0.total_cmp(&b.0));
        let b = block_bytes as f64;
        let (first, last) = (rows[0], rows[rows.len() - 1]);
        if b <= first.0 {
            return first.1;
        }
        if b >= last.0 {
            return last.1 * b / last.0;
        }
        let k = rows.windows(2).position(|w| b <= w[1].0).unwrap_or(0);
        let (lo, hi) = (rows[k], rows[k + 1]);
        lo.1 + (hi.1 - lo.1) * (b - lo.0) / (hi.0 - lo.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device() -> DeviceFile {
        DeviceFile {
            name: "t".into(),
            source: "test".into(),
            threads: 2,
            memory_bandwidth_bytes_per_s: 1e10,
            decode_bytes_per_s: 5e9,
            reads: vec![
                ReadRate { block_bytes: 4096, queue_depth: 1, iops: 10_000.0 },
                ReadRate { block_bytes: 131072, queue_depth: 1, iops: 2_000.0 },
                ReadRate { block_bytes: 4096, queue_depth: 32, iops: 200_000.0 },
                ReadRate { block_bytes: 131072, queue_depth: 32, iops: 10_000.0 },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn request_time_interpolates_size_and_picks_the_depth() {
        let d = device();
        assert_eq!(d.request_s(4096, 1), 1e-4);
        assert_eq!(d.request_s(512, 1), 1e-4);
        assert_eq!(d.request_s(4096, 8), 1e-4, "depth 8 uses the depth-1 rows");
        assert_eq!(d.request_s(4096, 256), 5e-6);
        let mid = d.request_s((4096 + 131072) / 2, 32);
        assert!((mid - (5e-6 + 1e-4) / 2.0).abs() < 1e-12, "{mid}");
        assert!((d.request_s(262144, 32) - 2e-4).abs() < 1e-12, "beyond the largest size: its bandwidth");
    }

    #[test]
    fn page_faults_read_the_largest_blocks_at_twice_the_threads_depth() {
        let mut d = device();
        assert_eq!(d.fault_read_bytes_per_s(), 2_000.0 * 131072.0, "2 threads: depth 4, measured at 1");
        d.threads = 16;
        assert_eq!(d.fault_read_bytes_per_s(), 10_000.0 * 131072.0, "16 threads: depth 32");
        // a rate calibrated on llama.cpp's own paging run replaces the O_DIRECT rows'
        d.llama_cpp_fault_read_bytes_per_s = Some(9.3e8);
        assert_eq!(d.fault_read_bytes_per_s(), 9.3e8);
    }

    #[test]
    fn missing_or_non_positive_fields_are_named() {
        let dir = std::env::temp_dir().join(format!("np-device-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("d.toml");
        device().save(&p).unwrap();
        assert_eq!(DeviceFile::load(&p).unwrap(), device());
        let text = std::fs::read_to_string(&p).unwrap();
        std::fs::write(&p, text.replace("decode_bytes_per_s = 5000000000.0\n", "")).unwrap();
        let e = DeviceFile::load(&p).unwrap_err().to_string();
        assert!(e.contains("d.toml") && e.contains("decode_bytes_per_s"), "{e}");
        std::fs::write(&p, text.replace("iops = 2000.0", "iops = -1.0")).unwrap();
        let e = DeviceFile::load(&p).unwrap_err().to_string();
        assert!(e.contains("reads[1].iops") && e.contains("positive"), "{e}");
        std::fs::write(&p, text.replace("threads = 2", "threads = 2\nllama_cpp_fault_read_bytes_per_s = 0.0")).unwrap();
        let e = DeviceFile::load(&p).unwrap_err().to_string();
        assert!(e.contains("llama_cpp_fault_read_bytes_per_s is 0") && e.contains("positive"), "{e}");
        std::fs::write(&p, text.replace("threads = 2", "threads = 2\nspeed = 3")).unwrap();
        assert!(DeviceFile::load(&p).unwrap_err().to_string().contains("speed"));
        assert!(DeviceFile::default().validate().is_err(), "the empty default is not a device");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
