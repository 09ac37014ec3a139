//! `AlignedBuf`: a zeroed heap buffer whose start is aligned for O_DIRECT (4096 bytes).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

pub const DIRECT_ALIGN_BYTES: usize = 4096;

pub struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is plain owned memory (like Vec<u8>); access goes through &self / &mut self.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub fn new(len_bytes: usize) -> Self {
        let layout = Layout::from_size_align(len_bytes.max(DIRECT_ALIGN_BYTES), DIRECT_ALIGN_BYTES)
            .expect("buffer size overflows");
        // SAFETY: the layout has a non-zero size; a null result is handled below.
        let p = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }

    pub fn len(&self) -> usize {
        self.layout.size()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for layout.size() initialised (zeroed) bytes for the life of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.layout.size()) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.layout.size()) }
    }
}

impl AlignedBuf {
    /// Hands the buffer's whole pages back to the kernel (a later touch maps zeroed pages):
    /// what an emptied buffer holds then stops counting in the process's memory (Linux; a
    /// no-op elsewhere).
    pub fn release_pages(&mut self) {
        let whole = self.layout.size() / DIRECT_ALIGN_BYTES * DIRECT_ALIGN_BYTES;
        #[cfg(target_os = "linux")]
        // SAFETY: [ptr, ptr + whole) lies inside this allocation, starts on a page boundary (the
        // layout's alignment) and covers whole pages only, so no allocator metadata is touched;
        // MADV_DONTNEED on private anonymous memory leaves it valid, reading as zeros, which
        // keeps the buffer's "initialised" invariant. &mut self: no reference into it is live.
        unsafe {
            libc::madvise(self.ptr.as_ptr().cast(), whole, libc::MADV_DONTNEED);
        }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with exactly this layout and is freed once.
        unsafe { dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl AsRef<[u8]> for AlignedBuf {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}
