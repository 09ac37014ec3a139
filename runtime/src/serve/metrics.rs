//! Counters of `runtime serve`, rendered as Prometheus text at `GET /metrics`.

use crate::stream::StreamStats;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

#[derive(Default)]
pub struct Metrics {
    pub requests_ok: [AtomicU64; 2],
    pub requests_failed: [AtomicU64; 2],
    pub requests_cancelled: [AtomicU64; 2],
    /// Refused at the door: queue full (503).
    pub requests_rejected: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub prompt_tokens_cached: AtomicU64,
    pub generated_tokens: AtomicU64,
    /// Waiting in the queue now (the one being answered is not counted).
    pub queued: AtomicU64,
    pub busy_us: AtomicU64,
    /// The streaming engine's counters, published by the worker after each request.
    pub engine: Mutex<Option<StreamStats>>,
}

fn counter(out: &mut String, name: &str, help: &str, kind: &str, rows: &[(&str, String)]) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    for (labels, v) in rows {
        let _ = writeln!(out, "{name}{labels} {v}");
    }
}

impl Metrics {
    pub fn render(&self, queue_capacity: usize, rss_bytes: u64, peak_rss_bytes: u64) -> String {
        let mut s = String::new();
        let mut rows = Vec::new();
        for ep in super::api::Endpoint::ALL {
            let i = ep.index();
            for (outcome, c) in [
                ("ok", &self.requests_ok[i]),
                ("error", &self.requests_failed[i]),
                ("cancelled", &self.requests_cancelled[i]),
            ] {
                rows.push((
                    format!("{{endpoint=\"{}\",outcome=\"{outcome}\"}}", ep.name()),
                    c.load(Relaxed).to_string(),
                ));
            }
        }
        let rows: Vec<(&str, String)> = rows.iter().map(|(l, v)| (l.as_str(), v.clone())).collect();
        counter(&mut s, "np_requests_total", "Requests answered, by endpoint and outcome.", "counter", &rows);
        let one = |v: String| vec![("", v)];
        counter(
            &mut s,
            "np_requests_rejected_total",
            "Requests refused with 503 because the queue was full.",
            "counter",
            &one(self.requests_rejected.load(Relaxed).to_string()),
        );
        counter(
            &mut s,
            "np_prompt_tokens_total",
            "Prompt tokens of answered requests.",
            "counter",
            &one(self.prompt_tokens.load(Relaxed).to_string()),
        );
        counter(
            &mut s,
            "np_prompt_tokens_cached_total",
            "Prompt tokens whose keys and values came from the KV cache.",
            "counter",
            &one(self.prompt_tokens_cached.load(Relaxed).to_string()),
        );
        counter(
            &mut s,
            "np_generated_tokens_total",
            "Tokens generated.",
            "counter",
            &one(self.generated_tokens.load(Relaxed).to_string()),
        );
        counter(
            &mut s,
            "np_queue_depth",
            "Requests waiting for the engine.",
            "gauge",
            &one(self.queued.load(Relaxed).to_string()),
        );
        counter(
            &mut s,
            "np_queue_capacity",
            "Waiting requests accepted before 503.",
            "gauge",
            &one(queue_capacity.to_string()),
        );
        counter(
            &mut s,
            "np_engine_busy_seconds_total",
            "Seconds the engine spent answering requests.",
            "counter",
            &one(format!("{:.6}", self.busy_us.load(Relaxed) as f64 / 1e6)),
        );
        counter(&mut s, "process_resident_memory_bytes", "Resident set size.", "gauge", &one(rss_bytes.to_string()));
        counter(
            &mut s,
            "np_peak_resident_memory_bytes",
            "Peak resident set size (VmHWM).",
            "gauge",
            &one(peak_rss_bytes.to_string()),
        );
        if let Some(e) = self.engine.lock().ok().and_then(|g| g.clone()) {
            counter(
                &mut s,
                "np_stream_tokens_total",
                "Tokens through the streaming engine.",
                "counter",
                &one(e.tokens.to_string()),
            );
            counter(
                &mut s,
                "np_stream_bytes_read_total",
                "Bytes read from records.bin.",
                "counter",
                &one(e.bytes_read.to_string()),
            );
            counter(
                &mut s,
                "np_stream_read_requests_total",
                "Read requests issued to storage.",
                "counter",
                &one(e.read_requests.to_string()),
            );
            counter(
                &mut s,
                "np_stream_rows_needed_total",
                "Rows the sparse layers needed.",
                "counter",
                &one(e.rows_needed.to_string()),
            );
            counter(
                &mut s,
                "np_stream_rows_loaded_total",
                "Rows read because they were not resident.",
                "counter",
                &one(e.rows_loaded.to_string()),
            );
            let reuse = e.reuse_ratio();
            counter(
                &mut s,
                "np_stream_reuse_ratio",
                "Share of needed rows already resident.",
                "gauge",
                &one(format!("{reuse:.6}")),
            );
            counter(
                &mut s,
                "np_stream_io_wait_seconds_total",
                "Seconds compute waited for reads.",
                "counter",
                &one(format!("{:.6}", e.io_wait_ms / 1e3)),
            );
        }
        s
    }
}
