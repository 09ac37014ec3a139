//! `IoThread`: the streaming engine's one reader thread, started once per run. The engine
//! hands it a token's reads (per sparse layer, the missing rows and the slots they go to); it
//! reads them with the [`RecordReader`] (io_uring, O_DIRECT), checks every row, and lands each
//! layer's rows, in load order, in a buffer the engine collects with [`IoThread::wait`] and
//! copies into the layer's slots. Whole records (header and payload CRC32C) or the downT row
//! alone (one 512-aligned span inside its record, checked against the scorer's per-row CRC32C):
//! [`RowSpan`].

use super::reader::{RecordReader, Run};
use crate::error::{Result, RuntimeError};
use crate::slots::Load;
use formats::manifest::RecordsLayout;
use formats::records::{check_record, RECORD_ALIGN_BYTES, RECORD_HEADER_BYTES};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// What of a record a slot holds, so what is read and how it is checked.
#[derive(Clone)]
pub enum RowSpan {
    /// Whole records, coalesced into runs of consecutive neurons; each record's header and
    /// payload CRC32C checked. A landed row is the payload: gate, up and downT rows (f16).
    Record,
    /// The downT row alone: one 512-aligned span per row, checked against `crc32c[(layer -
    /// first_layer) * n_ff + neuron]` (the scorer file's). A landed row is the downT row (f16).
    DownRow { crc32c: Arc<Vec<u32>>, first_layer: usize, n_ff: usize },
    /// Version-2 records: the down section alone (one 512-aligned span after the header, which
    /// names its layer and neuron and carries its CRC32C). A landed row is the Q8_0 blocks.
    DownSection { shape: formats::records::RecordShape },
    /// Whole version-2 records, coalesced as [`RowSpan::Record`]; each checked (header, types,
    /// gate/up CRC32C, down section). A landed row is the gate and up blocks, then the Q8_0 down
    /// row (`ops::record_sum::RecordRows::Blocks`).
    RecordV2 { shape: formats::records::RecordShape },
}

/// Where a version-1 record's downT row lies: (512-aligned span offset, span bytes, the row's
/// offset inside the span).
fn down_row_span(d_model: usize) -> (usize, usize, usize) {
    let down_offset = RECORD_HEADER_BYTES + 2 * d_model * 2;
    let span_offset = down_offset / RECORD_ALIGN_BYTES * RECORD_ALIGN_BYTES;
    let span_bytes = (down_offset + d_model * 2).div_ceil(RECORD_ALIGN_BYTES) * RECORD_ALIGN_BYTES - span_offset;
    (span_offset, span_bytes, down_offset - span_offset)
}

/// Bytes one needed row's read takes from records.bin (before runs of neighbours coalesce) for
/// slots of `slot_row` over records of `shape` (None: version 1).
pub fn read_span_bytes(
    slot_row: crate::select::SlotRow,
    shape: Option<formats::records::RecordShape>,
    record_bytes: usize,
    d_model: usize,
) -> usize {
    use crate::select::SlotRow;
    match (slot_row, shape) {
        (SlotRow::GateUpDown, _) => record_bytes,
        (SlotRow::Down, None) => down_row_span(d_model).1,
        (SlotRow::Down, Some(s)) => s.down_section_bytes(),
    }
}

/// One sparse layer's share of a token's reads.
pub struct LayerReads {
    /// Index among the sparse layers, and the model layer.
    pub si: usize,
    pub layer: usize,
    /// Sorted by neuron.
    pub loads: Vec<Load>,
    /// Bytes between two needed rows that one read takes in rather than ask a second read (a
    /// request can cost as much as reading that many bytes); 0: only adjacent records join.
    pub max_gap_bytes: usize,
}

/// A layer's reads, done: `rows` `[loads.len(), row_bytes]` in load order. When `result` is an
/// error the rows are incomplete and every load's slot must be forgotten.
pub struct Landed {
    pub loads: Vec<Load>,
    pub rows: Vec<u8>,
    pub result: Result<()>,
}

/// Bytes and requests read so far, and the wall time the thread spent on jobs.
#[derive(Debug, Clone, Copy, Default)]
pub struct IoCounters {
    pub bytes_read: u64,
    pub requests: u64,
    pub busy_ms: f64,
}

struct Job {
    tick: u64,
    layers: Vec<LayerReads>,
}

#[derive(Default)]
struct Mailbox {
    /// Per sparse layer, the rows of the last job that covered it (tick, rows).
    landed: Vec<Option<(u64, Landed)>>,
    /// Landing buffers handed back by the engine, reused so a layer's reads do not fault in
    /// fresh pages every token.
    free: Vec<Vec<u8>>,
    counters: IoCounters,
    /// The thread has ended (its receiver closed, or it panicked).
    stopped: bool,
}

impl Mailbox {
    /// A landing buffer back on the free list, emptied: the thread appends a layer's rows to it,
    /// so whatever it held would come first.
    fn give_back(&mut self, mut rows: Vec<u8>) {
        rows.clear();
        self.free.push(rows);
    }
}

struct Shared {
    mailbox: Mutex<Mailbox>,
    cv: Condvar,
}

/// Sets `stopped` when the thread ends, also by a panic, so no `wait` blocks forever.
struct StopGuard(Arc<Shared>);

impl Drop for StopGuard {
    fn drop(&mut self) {
        if let Ok(mut m) = self.0.mailbox.lock() {
            m.stopped = true;
        }
        self.0.cv.notify_all();
    }
}

pub struct IoThread {
    tx: Option<Sender<Job>>,
    worker: Option<std::thread::JoinHandle<()>>,
    shared: Arc<Shared>,
}

/// How the thread reads: the file's layout and what a row is.
struct ReadPlan {
    layout: RecordsLayout,
    d_model: usize,
    span: RowSpan,
    /// Bytes of one read at most (a coalesced run of records or spans).
    max_read_bytes: usize,
}

impl IoThread {
    /// Starts the thread over `reader` for `n_sparse` sparse layers. `max_run_bytes` bounds a
    /// coalesced read.
    pub fn start(
        reader: RecordReader,
        layout: RecordsLayout,
        d_model: usize,
        span: RowSpan,
        max_run_bytes: usize,
        n_sparse: usize,
    ) -> Result<Self> {
        let rb = layout.record_bytes;
        let max_records = (max_run_bytes / rb).max(1).min(reader.staging_len() / rb);
        if max_records == 0 {
            return Err(RuntimeError::Input(format!(
                "the staging buffer ({} bytes) is smaller than one record ({rb} bytes)",
                reader.staging_len()
            )));
        }
        let shared = Arc::new(Shared {
            mailbox: Mutex::new(Mailbox { landed: (0..n_sparse).map(|_| None).collect(), ..Default::default() }),
            cv: Condvar::new(),
        });
        let (tx, rx) = channel();
        let plan = ReadPlan { layout, d_model, span, max_read_bytes: max_records * rb };
        let worker = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("record-io".into())
                .spawn(move || {
                    let _guard = StopGuard(shared.clone());
                    serve(rx, reader, plan, &shared);
                })
                .map_err(|e| RuntimeError::Input(format!("cannot start the record I/O thread: {e}")))?
        };
        Ok(IoThread { tx: Some(tx), worker: Some(worker), shared })
    }

    /// Queues a token's reads (`tick` numbers the token); they are read in order.
    pub fn submit(&self, tick: u64, layers: Vec<LayerReads>) -> Result<()> {
        let stopped = || RuntimeError::Input("the record I/O thread has stopped".into());
        self.tx.as_ref().ok_or_else(stopped)?.send(Job { tick, layers }).map_err(|_| stopped())
    }

    /// Blocks until sparse layer `si`'s reads of token `tick` have landed.
    pub fn wait(&self, tick: u64, si: usize) -> Result<Landed> {
        let mut m =
            self.shared.mailbox.lock().map_err(|_| RuntimeError::Input("the record I/O thread panicked".into()))?;
        loop {
            match m.landed[si].take() {
                Some((t, landed)) if t == tick => return Ok(landed),
                // rows of an earlier token nobody collected (its forward pass failed): drop them
                Some((_, stale)) => m.give_back(stale.rows),
                None if m.stopped => return Err(RuntimeError::Input("the record I/O thread has stopped".into())),
                None => {
                    m = self
                        .shared
                        .cv
                        .wait(m)
                        .map_err(|_| RuntimeError::Input("the record I/O thread panicked".into()))?
                }
            }
        }
    }

    /// Hands a landing buffer back for reuse.
    pub fn recycle(&self, rows: Vec<u8>) {
        if let Ok(mut m) = self.shared.mailbox.lock() {
            m.give_back(rows);
        }
    }

    pub fn counters(&self) -> IoCounters {
        self.shared.mailbox.lock().map(|m| m.counters).unwrap_or_default()
    }
}

impl Drop for IoThread {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

fn serve(rx: Receiver<Job>, mut reader: RecordReader, plan: ReadPlan, shared: &Shared) {
    while let Ok(job) = rx.recv() {
        let t0 = Instant::now();
        for lr in job.layers {
            let mut rows = shared.mailbox.lock().ok().and_then(|mut m| m.free.pop()).unwrap_or_default();
            let result = match &plan.span {
                RowSpan::Record => {
                    read_records(&mut reader, &plan, &lr, &mut rows, |src, path, offset, neuron, rows| {
                        check_record(src, path, offset, lr.layer as u32, neuron, plan.d_model)?;
                        rows.extend_from_slice(&src[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + 3 * plan.d_model * 2]);
                        Ok(())
                    })
                }
                RowSpan::RecordV2 { shape } => {
                    read_records(&mut reader, &plan, &lr, &mut rows, |src, path, offset, neuron, rows| {
                        let (g, u, d) =
                            formats::records::check_record_v2(src, path, offset, lr.layer as u32, neuron, shape)?;
                        rows.extend_from_slice(g);
                        rows.extend_from_slice(u);
                        rows.extend_from_slice(d);
                        Ok(())
                    })
                }
                RowSpan::DownRow { crc32c, first_layer, n_ff } => read_down_rows(
                    &mut reader,
                    &plan,
                    &lr,
                    &crc32c[(lr.layer - first_layer) * n_ff..(lr.layer - first_layer + 1) * n_ff],
                    &mut rows,
                ),
                RowSpan::DownSection { shape } => read_down_sections(&mut reader, &plan, shape, &lr, &mut rows),
            };
            let Ok(mut m) = shared.mailbox.lock() else { return };
            m.counters.bytes_read = reader.bytes_read;
            m.counters.requests = reader.requests;
            if let Some((_, uncollected)) =
                m.landed[lr.si].replace((job.tick, Landed { loads: lr.loads, rows, result }))
            {
                m.give_back(uncollected.rows);
            }
            drop(m);
            shared.cv.notify_all();
        }
        if let Ok(mut m) = shared.mailbox.lock() {
            m.counters.busy_ms += t0.elapsed().as_secs_f64() * 1e3;
        }
    }
}

/// Groups loads sorted by neuron into reads of one span each: a load joins the read before it
/// when at most `max_gap_bytes` lie between its span and the last one's and the read stays within
/// `max_read_bytes` (a span `span_bytes` long at the same place in every record of `rb` bytes;
/// whole records when `span_bytes == rb`).
fn group_reads(
    loads: &[Load],
    rb: usize,
    span_bytes: usize,
    max_gap_bytes: usize,
    max_read_bytes: usize,
) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=loads.len() {
        let joins = i < loads.len() && {
            let (prev, first, this) = (loads[i - 1].neuron, loads[start].neuron, loads[i].neuron);
            let gap = ((this - prev) as usize * rb).saturating_sub(span_bytes);
            gap <= max_gap_bytes && (this - first) as usize * rb + span_bytes <= max_read_bytes.max(span_bytes)
        };
        if !joins {
            out.push(start..i);
            start = i;
        }
    }
    out
}

/// The span of `span_bytes` at `offset_in_record` of each load's record of `layer`: reads
/// grouped by [`group_reads`], batched to fill the staging buffer; `land(span, its file offset,
/// neuron, rows)` checks a span and appends its row to `rows`, in load order.
#[allow(clippy::too_many_arguments)]
fn read_spans(
    reader: &mut RecordReader,
    plan: &ReadPlan,
    reads: &LayerReads,
    offset_in_record: usize,
    span_bytes: usize,
    rows: &mut Vec<u8>,
    land: impl Fn(&[u8], &std::path::Path, u64, u32, &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    let (layer, loads, max_gap_bytes) = (reads.layer, &reads.loads[..], reads.max_gap_bytes);
    let rb = plan.layout.record_bytes;
    let max_read = plan.max_read_bytes.min(reader.staging_len());
    let groups = group_reads(loads, rb, span_bytes, max_gap_bytes, max_read);
    let read_bytes =
        |g: &std::ops::Range<usize>| (loads[g.end - 1].neuron - loads[g.start].neuron) as usize * rb + span_bytes;
    let mut r = 0;
    while r < groups.len() {
        let mut batch = Vec::new();
        let mut used = 0usize;
        while r < groups.len() && (batch.is_empty() || used + read_bytes(&groups[r]) <= reader.staging_len()) {
            let first = loads[groups[r].start].neuron as usize;
            let run = Run {
                offset: plan.layout.offset(layer, first) + offset_in_record as u64,
                bytes: read_bytes(&groups[r]),
                staging_offset: used,
            };
            used += run.bytes;
            batch.push((groups[r].clone(), run));
            r += 1;
        }
        let plain: Vec<Run> = batch.iter().map(|b| b.1).collect();
        reader.read_runs(&plain)?;
        let staging = reader.staging();
        for (range, run) in &batch {
            let first = loads[range.start].neuron;
            for load in &loads[range.clone()] {
                let at = (load.neuron - first) as usize * rb;
                let src = &staging[run.staging_offset + at..run.staging_offset + at + span_bytes];
                land(src, &reader.path, run.offset + at as u64, load.neuron, rows)?;
            }
        }
    }
    Ok(())
}

/// Whole records of `layer` ([`read_spans`] of the whole record): `land(record, its file
/// offset, neuron, rows)` checks each record and appends its payload to `rows`, in load order.
fn read_records(
    reader: &mut RecordReader,
    plan: &ReadPlan,
    reads: &LayerReads,
    rows: &mut Vec<u8>,
    land: impl Fn(&[u8], &std::path::Path, u64, u32, &mut Vec<u8>) -> Result<()>,
) -> Result<()> {
    read_spans(reader, plan, reads, 0, plan.layout.record_bytes, rows, land)
}

/// The version-2 down rows of `layer`: each record's down section (512-aligned, after the
/// header), checked by its own layer, neuron and CRC32C; the Q8_0 blocks appended to `rows` in
/// load order.
fn read_down_sections(
    reader: &mut RecordReader,
    plan: &ReadPlan,
    shape: &formats::records::RecordShape,
    reads: &LayerReads,
    rows: &mut Vec<u8>,
) -> Result<()> {
    let layer = reads.layer;
    read_spans(
        reader,
        plan,
        reads,
        RECORD_HEADER_BYTES,
        shape.down_section_bytes(),
        rows,
        |span, path, offset, neuron, rows| {
            rows.extend_from_slice(formats::records::check_down_section(
                span,
                path,
                offset,
                layer as u32,
                neuron,
                shape,
            )?);
            Ok(())
        },
    )
}

/// The downT rows of `layer`: one 512-aligned span around each, checked against `crcs`
/// (`[n_ff]`); rows appended to `rows` in load order.
fn read_down_rows(
    reader: &mut RecordReader,
    plan: &ReadPlan,
    reads: &LayerReads,
    crcs: &[u32],
    rows: &mut Vec<u8>,
) -> Result<()> {
    let (d, layer) = (plan.d_model, reads.layer);
    let (span_offset, span_bytes, skip) = down_row_span(d);
    read_spans(reader, plan, reads, span_offset, span_bytes, rows, |span, path, offset, neuron, rows| {
        let row = &span[skip..skip + 2 * d];
        formats::scorer::check_down_row(row, crcs[neuron as usize], path, offset + skip as u64, layer, neuron)?;
        rows.extend_from_slice(row);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stream::reader::ReaderOptions;
    use formats::records::{encode_record, record_bytes};
    use half::f16;

    const D: usize = 64;
    const N_FF: usize = 8;

    /// A real records.bin of one layer (layer 1): neuron j's rows are all `j`.
    fn records_file(dir: &std::path::Path) -> (std::path::PathBuf, RecordsLayout) {
        let rb = record_bytes(D);
        let mut bytes = vec![0u8; rb * N_FF];
        for j in 0..N_FF {
            let row = vec![f16::from_f32(j as f32); D];
            encode_record(1, j as u32, &row, &row, &row, &mut bytes[j * rb..(j + 1) * rb]);
        }
        let path = dir.join("records.bin");
        std::fs::write(&path, &bytes).unwrap();
        (
            path.clone(),
            RecordsLayout {
                path: "records.bin".into(),
                record_bytes: rb,
                first_layer: 1,
                neurons_per_layer: N_FF,
                count: N_FF,
                gate_up_type: None,
                down_type: None,
            },
        )
    }

    fn loads(neurons: &[u32]) -> Vec<Load> {
        neurons.iter().enumerate().map(|(k, &n)| Load { neuron: n, slot: k as u32 }).collect()
    }

    fn payload_neurons(rows: &[u8]) -> Vec<u32> {
        rows.chunks(3 * D * 2).map(|r| f16::from_le_bytes([r[0], r[1]]).to_f32() as u32).collect()
    }

    /// Rows of a token nobody collected (its forward pass failed) never leak into a later
    /// token's landing buffer: not when `wait` drops them, not when the next job replaces them.
    #[test]
    fn uncollected_rows_do_not_leak_into_the_next_token() {
        let dir = std::env::temp_dir().join(format!("io-thread-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (path, layout) = records_file(&dir);
        let reader =
            RecordReader::open(&path, &ReaderOptions { staging_bytes: 1 << 16, ..Default::default() }).unwrap();
        let io = IoThread::start(reader, layout, D, RowSpan::Record, 1 << 20, 1).unwrap();
        let reads = |neurons: &[u32]| vec![LayerReads { si: 0, layer: 1, loads: loads(neurons), max_gap_bytes: 0 }];
        // token 1 lands and is never collected; token 2 is submitted while `wait` holds the stale rows
        io.submit(1, reads(&[0, 1, 2])).unwrap();
        while io.counters().requests == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        let landed = std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(50));
                io.submit(2, reads(&[5, 6])).unwrap();
            });
            io.wait(2, 0).unwrap()
        });
        landed.result.unwrap();
        assert_eq!(payload_neurons(&landed.rows), vec![5, 6]);
        io.recycle(landed.rows);
        // tokens 3 and 4 queued back to back: 4's rows replace 3's uncollected ones
        io.submit(3, reads(&[1, 2, 3, 4])).unwrap();
        io.submit(4, reads(&[7])).unwrap();
        let landed = io.wait(4, 0).unwrap();
        assert_eq!(payload_neurons(&landed.rows), vec![7]);
        io.recycle(landed.rows);
        io.submit(5, reads(&[3])).unwrap();
        assert_eq!(payload_neurons(&io.wait(5, 0).unwrap().rows), vec![3]);
        drop(io);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Loads a gap apart join one read when the gap is within `max_gap_bytes`: each row lands
    /// once, in load order, checked; the requests are the groups.
    #[test]
    fn reads_take_in_small_gaps() {
        let rb = record_bytes(D);
        let l = loads(&[0, 2, 3, 7]);
        assert_eq!(group_reads(&l, rb, rb, 0, 1 << 20), vec![0..1, 1..3, 3..4]);
        assert_eq!(group_reads(&l, rb, rb, rb, 1 << 20), vec![0..3, 3..4]);
        assert_eq!(group_reads(&l, rb, rb, 3 * rb, 1 << 20), vec![0..4]);
        assert_eq!(group_reads(&l, rb, rb, 3 * rb, 4 * rb), vec![0..3, 3..4], "a read stays within its bound");
        // spans of 512 bytes: the gap is the rest of each record between them
        assert_eq!(group_reads(&l, rb, 512, rb - 512, 1 << 20), vec![0..1, 1..3, 3..4]);
        let dir = std::env::temp_dir().join(format!("io-gap-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (path, layout) = records_file(&dir);
        for (gap, requests) in [(0, 3), (rb, 2), (3 * rb, 1)] {
            let reader =
                RecordReader::open(&path, &ReaderOptions { staging_bytes: 1 << 16, ..Default::default() }).unwrap();
            let io = IoThread::start(reader, layout.clone(), D, RowSpan::Record, 1 << 20, 1).unwrap();
            io.submit(1, vec![LayerReads { si: 0, layer: 1, loads: l.clone(), max_gap_bytes: gap }]).unwrap();
            let landed = io.wait(1, 0).unwrap();
            landed.result.unwrap();
            assert_eq!(payload_neurons(&landed.rows), vec![0, 2, 3, 7], "gap {gap}");
            assert_eq!(io.counters().requests, requests, "gap {gap}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
