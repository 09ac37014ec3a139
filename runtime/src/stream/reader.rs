//! `RecordReader`: reads runs of `records.bin` into its own aligned staging buffer with
//! io_uring and O_DIRECT (no page cache), queue depth up to 256. Where io_uring or O_DIRECT is
//! unavailable (tmpfs, seccomp, old kernels) it falls back to pread on the rayon pool and says
//! why in [`RecordReader::fallback`]. Held in memory ([`ReaderOptions::hold_in_memory`]: a run
//! with every row in memory, for quality), the whole file is read once and a run is a copy, so
//! the engine computes exactly what it computes from storage.
//!
//! The reader owns the staging buffer, so the buffer it registers with the ring (reads then
//! use IORING_OP_READ_FIXED) lives exactly as long as the ring and is only written by reads.

use super::aligned::AlignedBuf;
use crate::error::{Result, RuntimeError};
use io_uring::{opcode, types, IoUring};
use rayon::prelude::*;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// `bytes` at file `offset`, read to `staging_offset` of the staging buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    pub offset: u64,
    pub bytes: usize,
    pub staging_offset: usize,
}

#[derive(Debug, Clone)]
pub struct ReaderOptions {
    pub queue_depth: usize,
    /// Skip io_uring and O_DIRECT: pread on the rayon pool.
    pub force_pread: bool,
    /// Size of the staging buffer every read lands in (rounded up to 4096).
    pub staging_bytes: usize,
    /// Register the staging buffer with the ring (no per-request page pinning).
    pub register_staging: bool,
    /// Read the whole file into memory once; runs are then copied from there.
    pub hold_in_memory: bool,
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            queue_depth: 256,
            force_pread: false,
            staging_bytes: 8 << 20,
            register_staging: true,
            hold_in_memory: false,
        }
    }
}

pub struct RecordReader {
    pub path: PathBuf,
    file: File,
    ring: Option<IoUring>,
    staging: AlignedBuf,
    pub queue_depth: usize,
    /// Why the fast path is off (None: io_uring + O_DIRECT).
    pub fallback: Option<String>,
    pub bytes_read: u64,
    pub requests: u64,
    /// The staging buffer is registered with the ring.
    registered: bool,
    /// The whole file, with [`ReaderOptions::hold_in_memory`].
    held: Option<Vec<u8>>,
}

impl RecordReader {
    /// Opens `path` for O_DIRECT io_uring reads into a staging buffer of its own.
    pub fn open(path: &Path, o: &ReaderOptions) -> Result<Self> {
        let io = |source| RuntimeError::Io { path: path.to_path_buf(), offset: None, source };
        if o.hold_in_memory {
            return Ok(RecordReader {
                path: path.to_path_buf(),
                held: Some(std::fs::read(path).map_err(io)?),
                file: File::open(path).map_err(io)?,
                ring: None,
                staging: AlignedBuf::new(o.staging_bytes.div_ceil(4096) * 4096),
                queue_depth: o.queue_depth,
                fallback: None,
                bytes_read: 0,
                requests: 0,
                registered: false,
            });
        }
        let direct = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(path);
        let (file, mut fallback) = match direct {
            Ok(f) => (f, None),
            Err(e) => (File::open(path).map_err(io)?, Some(format!("O_DIRECT unavailable ({e})"))),
        };
        let mut ring = if o.force_pread {
            fallback.get_or_insert("pread requested".into());
            None
        } else if fallback.is_some() {
            None
        } else {
            match IoUring::new(o.queue_depth.next_power_of_two() as u32) {
                Ok(r) => Some(r),
                Err(e) => {
                    fallback = Some(format!("io_uring unavailable ({e})"));
                    None
                }
            }
        };
        let mut staging = AlignedBuf::new(o.staging_bytes.div_ceil(4096) * 4096);
        let mut registered = false;
        if let (Some(r), true) = (ring.as_mut(), o.register_staging) {
            let iov = libc::iovec {
                iov_base: staging.as_mut_slice().as_mut_ptr() as *mut libc::c_void,
                iov_len: staging.len(),
            };
            // SAFETY: the iovec covers exactly the staging allocation, which this reader owns and
            // drops after the ring (field order: `ring` before `staging`), and which only reads
            // through this ring write to while `read_runs` holds `&mut self`.
            unsafe { r.submitter().register_buffers(&[iov]) }.map_err(io)?;
            registered = true;
        }
        Ok(RecordReader {
            path: path.to_path_buf(),
            file,
            ring,
            staging,
            queue_depth: o.queue_depth,
            fallback,
            bytes_read: 0,
            requests: 0,
            registered,
            held: None,
        })
    }

    /// The staging buffer: where the last `read_runs` put its runs.
    pub fn staging(&self) -> &[u8] {
        self.staging.as_slice()
    }

    pub fn staging_len(&self) -> usize {
        self.staging.len()
    }

    /// Reads every run into the staging buffer (runs must not overlap there).
    pub fn read_runs(&mut self, runs: &[Run]) -> Result<()> {
        let cap = self.staging.len();
        if let Some(r) = runs.iter().find(|r| r.staging_offset + r.bytes > cap) {
            return Err(RuntimeError::Input(format!(
                "a read of {} bytes at staging offset {} is outside the {cap}-byte staging buffer",
                r.bytes, r.staging_offset
            )));
        }
        self.requests += runs.len() as u64;
        self.bytes_read += runs.iter().map(|r| r.bytes as u64).sum::<u64>();
        match (self.held.as_ref(), self.ring.as_mut()) {
            (Some(held), _) => copy_held(held, &self.path, runs, &mut self.staging),
            (None, Some(ring)) => {
                read_uring(ring, &self.file, &self.path, self.queue_depth, self.registered, runs, &mut self.staging)
            }
            (None, None) => read_pread(&self.file, &self.path, runs, &mut self.staging),
        }
    }

    /// Whether the file is held in memory ([`ReaderOptions::hold_in_memory`]).
    pub fn holds_file(&self) -> bool {
        self.held.is_some()
    }
}

fn read_uring(
    ring: &mut IoUring,
    file: &File,
    path: &Path,
    qd: usize,
    registered: bool,
    runs: &[Run],
    staging: &mut AlignedBuf,
) -> Result<()> {
    let fd = types::Fd(file.as_raw_fd());
    let base = staging.as_mut_slice().as_mut_ptr();
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
            let (ptr, len, off) =
                (base.wrapping_add(r.staging_offset + done[i]), (r.bytes - done[i]) as u32, r.offset + done[i] as u64);
            let entry = if registered {
                opcode::ReadFixed::new(fd, ptr, len, 0).offset(off).build().user_data(i as u64)
            } else {
                opcode::Read::new(fd, ptr, len).offset(off).build().user_data(i as u64)
            };
            // SAFETY: the target range lies inside `staging` (checked by `read_runs`), which is
            // borrowed mutably for this whole call, so nothing else touches it until every read
            // completes (we wait for all in-flight entries before returning, also on errors).
            if unsafe { ring.submission().push(&entry) }.is_err() {
                retry.push(i);
                break;
            }
            in_flight += 1;
        }
        ring.submit_and_wait(1).map_err(|source| RuntimeError::Io {
            path: path.to_path_buf(),
            offset: None,
            source,
        })?;
        let mut failure = None;
        let cqes: Vec<(usize, i32)> = ring.completion().map(|c| (c.user_data() as usize, c.result())).collect();
        for (i, res) in cqes {
            in_flight -= 1;
            let r = runs[i];
            let at = r.offset + done[i] as u64;
            if res < 0 {
                failure.get_or_insert(RuntimeError::Io {
                    path: path.to_path_buf(),
                    offset: Some(at),
                    source: std::io::Error::from_raw_os_error(-res),
                });
            } else if res == 0 {
                failure.get_or_insert(RuntimeError::Corrupt {
                    path: path.to_path_buf(),
                    offset: at,
                    what: format!("unexpected end of file ({} more bytes expected)", r.bytes - done[i]),
                });
            } else {
                done[i] += res as usize;
                if done[i] < r.bytes {
                    retry.push(i);
                } else {
                    remaining -= 1;
                }
            }
        }
        if let Some(e) = failure {
            // drain what is still in flight before the buffer can be reused
            while in_flight > 0 {
                let _ = ring.submit_and_wait(1);
                in_flight -= ring.completion().count();
            }
            return Err(e);
        }
    }
    Ok(())
}

/// Each run copied from the file held in memory (a run past its end is refused as a read
/// would be).
fn copy_held(held: &[u8], path: &Path, runs: &[Run], staging: &mut AlignedBuf) -> Result<()> {
    let staging = staging.as_mut_slice();
    for r in runs {
        let from = usize::try_from(r.offset).unwrap_or(usize::MAX);
        let Some(src) = held.get(from..from.saturating_add(r.bytes)) else {
            return Err(RuntimeError::Corrupt {
                path: path.to_path_buf(),
                offset: r.offset,
                what: format!("unexpected end of file (reading {} bytes of a {}-byte file)", r.bytes, held.len()),
            });
        };
        staging[r.staging_offset..r.staging_offset + r.bytes].copy_from_slice(src);
    }
    Ok(())
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
        if r.staging_offset < pos {
            return Err(RuntimeError::Input(format!(
                "reads overlap in the staging buffer at offset {}",
                r.staging_offset
            )));
        }
        let (_, tail) = rest.split_at_mut(r.staging_offset - pos);
        let (mine, tail) = tail.split_at_mut(r.bytes);
        parts.push((r.offset, mine));
        rest = tail;
        pos = r.staging_offset + r.bytes;
    }
    parts.into_par_iter().try_for_each(|(off, buf)| {
        file.read_exact_at(buf, off).map_err(|source| match source.kind() {
            std::io::ErrorKind::UnexpectedEof => RuntimeError::Corrupt {
                path: path.to_path_buf(),
                offset: off,
                what: format!("unexpected end of file (reading {} bytes)", buf.len()),
            },
            _ => RuntimeError::Io { path: path.to_path_buf(), offset: Some(off), source },
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file held in memory gives the runs pread gives, byte for byte, and a run past its end
    /// is the same kind of error, naming the file and the offset.
    #[test]
    fn held_in_memory_reads_what_pread_reads() {
        let path = std::env::temp_dir().join(format!("reader-held-{}.bin", std::process::id()));
        let bytes: Vec<u8> = (0..3 * 4096u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &bytes).unwrap();
        let runs = [
            Run { offset: 4096, bytes: 4096, staging_offset: 0 },
            Run { offset: 0, bytes: 512, staging_offset: 8192 },
            Run { offset: 8192 + 512, bytes: 1024, staging_offset: 4096 },
        ];
        let open = |hold_in_memory| {
            let o = ReaderOptions { force_pread: true, staging_bytes: 3 * 4096, hold_in_memory, ..Default::default() };
            RecordReader::open(&path, &o).unwrap()
        };
        let (mut held, mut pread) = (open(true), open(false));
        assert!(held.holds_file() && !pread.holds_file());
        held.read_runs(&runs).unwrap();
        pread.read_runs(&runs).unwrap();
        assert_eq!(held.staging(), pread.staging());
        assert_eq!(&held.staging()[8192..8192 + 512], &bytes[..512]);
        assert_eq!((held.bytes_read, held.requests), (pread.bytes_read, pread.requests));
        // (O_DIRECT where the file system has it: runs of whole 512-byte sectors)
        let past = [Run { offset: 3 * 4096 - 512, bytes: 1024, staging_offset: 0 }];
        let e = held.read_runs(&past).unwrap_err().to_string();
        assert!(e.contains("reader-held") && e.contains(&(3 * 4096 - 512).to_string()), "{e}");
        assert!(pread.read_runs(&past).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
