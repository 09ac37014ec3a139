//! `RecordReader`: reads runs of consecutive records of `records.bin` into an aligned staging
//! buffer with io_uring and O_DIRECT (no page cache), queue depth up to 256. Where io_uring or
//! O_DIRECT is unavailable (tmpfs, seccomp, old kernels) it falls back to pread on the rayon
//! pool and says why once.

use super::aligned::AlignedBuf;
use crate::error::{Result, RuntimeError};
use formats::FormatError;
use io_uring::{opcode, types, IoUring};
use rayon::prelude::*;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// `records` consecutive records starting at file `offset`, read to `staging_offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub offset: u64,
    pub bytes: usize,
    pub staging_offset: usize,
}

pub struct RecordReader {
    pub path: PathBuf,
    file: File,
    ring: Option<IoUring>,
    pub queue_depth: usize,
    /// Why the fast path is off (None: io_uring + O_DIRECT).
    pub fallback: Option<String>,
    pub bytes_read: u64,
    pub requests: u64,
    /// The staging buffer is registered with the ring (reads use IORING_OP_READ_FIXED).
    registered: bool,
}

impl RecordReader {
    /// Opens `path` for O_DIRECT io_uring reads; `force_pread` skips the fast path.
    pub fn open(path: &Path, queue_depth: usize, force_pread: bool) -> Result<Self> {
        let io = |e| RuntimeError::Format(FormatError::io(path, e));
        let direct = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path);
        let (file, mut fallback) = match direct {
            Ok(f) => (f, None),
            Err(e) => (File::open(path).map_err(io)?, Some(format!("O_DIRECT unavailable ({e})"))),
        };
        let ring = if force_pread {
            fallback.get_or_insert("pread requested".into());
            None
        } else if fallback.is_some() {
            None
        } else {
            match IoUring::new(queue_depth.next_power_of_two() as u32) {
                Ok(r) => Some(r),
                Err(e) => {
                    fallback = Some(format!("io_uring unavailable ({e})"));
                    None
                }
            }
        };
        if let Some(why) = &fallback {
            eprintln!("runtime: {}: {why}; reading records with pread on the thread pool", path.display());
        }
        Ok(RecordReader { path: path.to_path_buf(), file, ring, queue_depth, fallback, bytes_read: 0, requests: 0, registered: false })
    }

    /// Registers `staging` with the ring so reads skip per-request page pinning. The buffer
    /// must be the one passed to every later `read_runs` and must outlive this reader.
    pub fn register(&mut self, staging: &mut AlignedBuf) -> Result<()> {
        if let Some(ring) = self.ring.as_mut() {
            let iov = libc::iovec { iov_base: staging.as_mut_slice().as_mut_ptr() as *mut libc::c_void, iov_len: staging.len() };
            // SAFETY: the iovec covers exactly the staging allocation, which the caller keeps
            // alive (and passes to every read) for as long as this ring exists.
            unsafe { ring.submitter().register_buffers(&[iov]) }.map_err(|e| RuntimeError::Format(FormatError::io(&self.path, e)))?;
            self.registered = true;
        }
        Ok(())
    }

    /// Reads every run into `staging` (runs must not overlap there).
    pub fn read_runs(&mut self, runs: &[Run], staging: &mut AlignedBuf) -> Result<()> {
        self.requests += runs.len() as u64;
        self.bytes_read += runs.iter().map(|r| r.bytes as u64).sum::<u64>();
        match self.ring.as_mut() {
            Some(ring) => read_uring(ring, &self.file, &self.path, self.queue_depth, self.registered, runs, staging),
            None => read_pread(&self.file, &self.path, runs, staging),
        }
    }
}

fn read_uring(ring: &mut IoUring, file: &File, path: &Path, qd: usize, registered: bool, runs: &[Run], staging: &mut AlignedBuf) -> Result<()> {
    let fd = types::Fd(file.as_raw_fd());
    let base = staging.as_mut_slice().as_mut_ptr();
    let cap = staging.len();
    // done[i]: bytes of run i read so far
    let mut done = vec![0usize; runs.len()];
    let mut next = 0usize;
    let mut in_flight = 0usize;
    let mut remaining = runs.len();
    let mut retry: Vec<usize> = Vec::new();
    while remaining > 0 {
        // fill the queue: retries (short reads) first, then new runs
        while in_flight < qd && (!retry.is_empty() || next < runs.len()) {
            let i = retry.pop().unwrap_or_else(|| {
                next += 1;
                next - 1
            });
            let r = runs[i];
            assert!(r.staging_offset + r.bytes <= cap, "run outside the staging buffer");
            let (ptr, len, off) = (base.wrapping_add(r.staging_offset + done[i]), (r.bytes - done[i]) as u32, r.offset + done[i] as u64);
            let entry = if registered {
                opcode::ReadFixed::new(fd, ptr, len, 0).offset(off).build().user_data(i as u64)
            } else {
                opcode::Read::new(fd, ptr, len).offset(off).build().user_data(i as u64)
            };
            // SAFETY: the target range lies inside `staging` (asserted), which outlives this call
            // and is borrowed mutably here, so nothing else touches it until every read completes
            // (we wait for all in-flight entries before returning, also on error paths below).
            if unsafe { ring.submission().push(&entry) }.is_err() {
                retry.push(i);
                break;
            }
            in_flight += 1;
        }
        ring.submit_and_wait(1).map_err(|e| RuntimeError::Format(FormatError::io(path, e)))?;
        let mut failure = None;
        let cqes: Vec<(usize, i32)> = ring.completion().map(|c| (c.user_data() as usize, c.result())).collect();
        for (i, res) in cqes {
            in_flight -= 1;
            let r = runs[i];
            if res < 0 {
                failure.get_or_insert(RuntimeError::Format(FormatError::io(path, std::io::Error::from_raw_os_error(-res))).to_string_at(r.offset));
            } else if res == 0 {
                failure.get_or_insert(format!("{}: unexpected end of file at byte offset {}", path.display(), r.offset + done[i] as u64));
            } else {
                done[i] += res as usize;
                if done[i] < r.bytes {
                    retry.push(i);
                } else {
                    remaining -= 1;
                }
            }
        }
        if let Some(msg) = failure {
            // drain what is still in flight before the buffer can be reused
            while in_flight > 0 {
                let _ = ring.submit_and_wait(1);
                in_flight -= ring.completion().count();
            }
            return Err(RuntimeError::Input(msg));
        }
    }
    Ok(())
}

trait AtOffset {
    fn to_string_at(self, offset: u64) -> String;
}

impl AtOffset for RuntimeError {
    fn to_string_at(self, offset: u64) -> String {
        format!("{self} (reading at byte offset {offset})")
    }
}

fn read_pread(file: &File, path: &Path, runs: &[Run], staging: &mut AlignedBuf) -> Result<()> {
    // split the staging buffer into the runs' disjoint ranges
    let mut order: Vec<usize> = (0..runs.len()).collect();
    order.sort_by_key(|&i| runs[i].staging_offset);
    let mut rest = staging.as_mut_slice();
    let mut pos = 0;
    let mut parts = Vec::with_capacity(runs.len());
    for &i in &order {
        let r = runs[i];
        let (_, tail) = rest.split_at_mut(r.staging_offset - pos);
        let (mine, tail) = tail.split_at_mut(r.bytes);
        parts.push((r.offset, mine));
        rest = tail;
        pos = r.staging_offset + r.bytes;
    }
    parts.into_par_iter().try_for_each(|(off, buf)| {
        file.read_exact_at(buf, off).map_err(|e| RuntimeError::Input(format!("{}: {e} (reading {} bytes at byte offset {off})", path.display(), buf.len())))
    })
}
