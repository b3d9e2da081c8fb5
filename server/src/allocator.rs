//! The server binary's global allocator: mimalloc, with a large zeroed
//! block's whole pages left to the kernel to zero.
//!
//! mimalloc zeroes a block by hand unless its memory has never been
//! written since the process mapped it. quinn allocates its endpoint's
//! receive buffer zeroed at bind (2.9 MiB with Linux's receive offload, see
//! `quinn` 0.11's `RecvState::new`), and whether mimalloc places it in
//! memory that startup used and freed depends on startup's exact
//! allocations: where it does, mimalloc's zeroing makes the whole buffer
//! resident before the server's first packet, 3 MB of a server at rest
//! (`docs/benchmarks.md`, "Where the QUIC receive buffer lands").
//!
//! [`Allocator`] takes a zeroed block of [`LAZY_ZEROED`] bytes or more from
//! mimalloc unzeroed, zeroes the partial pages at its two ends and asks the
//! kernel to drop the whole pages between them (`MADV_DONTNEED`). A dropped
//! page of a private anonymous mapping, which is what mimalloc maps on
//! Linux, reads as zeros and takes memory again only when written. Where the
//! kernel refuses, the block is zeroed by hand as before. Smaller blocks, and
//! every other call, are mimalloc's own.

use std::alloc::{GlobalAlloc, Layout};

use mimalloc::MiMalloc;

/// The size from which a zeroed block's pages are dropped instead of
/// written: well above anything allocated zeroed on a request's path, so
/// the extra system call is paid only by rare, large buffers.
pub const LAZY_ZEROED: usize = 1 << 20;

/// mimalloc, zeroing blocks of [`LAZY_ZEROED`] or more through the kernel.
#[derive(Debug, Default)]
pub struct Allocator;

// SAFETY: every method hands mimalloc's own blocks through unchanged, and
// `alloc_zeroed` returns mimalloc's block for the same layout with every
// byte zero (written here, or read as zero from pages the kernel dropped).
unsafe impl GlobalAlloc for Allocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract for `alloc` is passed on as is.
        unsafe { MiMalloc.alloc(layout) }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: every block this allocator hands out is mimalloc's, with
        // the layout it was asked for.
        unsafe { MiMalloc.dealloc(ptr, layout) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as in `dealloc`; the caller's contract for `new_size`
        // is passed on as is.
        unsafe { MiMalloc.realloc(ptr, layout, new_size) }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if layout.size() < LAZY_ZEROED {
            // SAFETY: the caller's contract for `alloc_zeroed` is passed on.
            return unsafe { MiMalloc.alloc_zeroed(layout) };
        }
        // SAFETY: the layout has a non-zero size (at least LAZY_ZEROED).
        let block = unsafe { MiMalloc.alloc(layout) };
        if !block.is_null() {
            // SAFETY: `block` is a fresh block of `layout.size()` bytes that
            // nothing else refers to yet.
            unsafe { zero(block, layout.size()) };
        }
        block
    }
}

/// Zeroes the `len` bytes at `start`: the partial pages at both ends by
/// hand, the whole pages between them by dropping them.
///
/// # Safety
/// `start..start + len` is one block of mimalloc's, writable, and nothing
/// else reads or writes it during the call.
unsafe fn zero(start: *mut u8, len: usize) {
    let page = page_size();
    let addr = start as usize;
    let first = addr.next_multiple_of(page);
    let end = (addr + len) & !(page - 1);
    if first >= end {
        // SAFETY: the block is writable and ours (the function's contract).
        unsafe { start.write_bytes(0, len) };
        return;
    }
    // SAFETY: the head and the tail lie inside the block: `addr <= first <
    // end <= addr + len`.
    let inner = unsafe {
        start.write_bytes(0, first - addr);
        start.add(end - addr).write_bytes(0, addr + len - end);
        start.add(first - addr)
    };
    // SAFETY: `first..end` is whole pages of the block, which only this call
    // may touch; dropping them changes no byte that any other code may
    // observe except to make them read as zero, which is the point.
    let dropped = unsafe { libc::madvise(inner.cast(), end - first, libc::MADV_DONTNEED) };
    if dropped != 0 {
        // SAFETY: as for the ends; the pages are still the block's.
        unsafe { inner.write_bytes(0, end - first) };
    }
}

/// The system's page size, a power of two.
fn page_size() -> usize {
    // SAFETY: `sysconf` takes no pointer and has no precondition.
    match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        size if size > 0 && (size as usize).is_power_of_two() => size as usize,
        _ => 4096,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a pattern over a freed large block, then asks for it zeroed
    /// again: every byte reads zero, at the ends and between them, for
    /// sizes on and off page boundaries and with a larger alignment.
    #[test]
    fn large_zeroed_blocks_read_zero_after_reuse() {
        for (size, align) in [
            (LAZY_ZEROED, 8),
            (LAZY_ZEROED + 1, 8),
            (3 * LAZY_ZEROED - 17, 64),
            (LAZY_ZEROED + 4096 * 3 + 5, 4096),
        ] {
            let layout = Layout::from_size_align(size, align).unwrap();
            // SAFETY: a non-zero layout; each block is freed with it once.
            unsafe {
                let dirty = Allocator.alloc(layout);
                assert!(!dirty.is_null());
                dirty.write_bytes(0xa5, size);
                Allocator.dealloc(dirty, layout);
                let block = Allocator.alloc_zeroed(layout);
                assert!(!block.is_null());
                assert_eq!(block as usize % align, 0);
                let bytes = std::slice::from_raw_parts(block, size);
                assert!(bytes.iter().all(|&b| b == 0), "size {size}");
                Allocator.dealloc(block, layout);
            }
        }
    }

    /// A block below the threshold is mimalloc's zeroed block.
    #[test]
    fn small_zeroed_blocks_read_zero() {
        let layout = Layout::from_size_align(4096, 8).unwrap();
        // SAFETY: a non-zero layout, freed once with it.
        unsafe {
            let block = Allocator.alloc_zeroed(layout);
            assert!(std::slice::from_raw_parts(block, 4096)
                .iter()
                .all(|&b| b == 0));
            Allocator.dealloc(block, layout);
        }
    }

    /// The whole pages of a large zeroed block are not resident until
    /// written, where a hand-zeroed block's would be: measured with
    /// `mincore` on the block's inner pages.
    #[test]
    fn large_zeroed_blocks_take_no_memory_until_written() {
        let size = 4 * LAZY_ZEROED;
        let layout = Layout::from_size_align(size, 8).unwrap();
        let page = page_size();
        // SAFETY: a non-zero layout, each block freed once with it; `mincore`
        // gets whole pages inside the block and a vector of one byte per
        // page.
        unsafe {
            let dirty = Allocator.alloc(layout);
            dirty.write_bytes(0xa5, size);
            Allocator.dealloc(dirty, layout);
            let block = Allocator.alloc_zeroed(layout);
            let first = (block as usize).next_multiple_of(page);
            let pages = (block as usize + size - first) / page - 1;
            let mut resident = vec![0u8; pages];
            let rc = libc::mincore(first as *mut _, pages * page, resident.as_mut_ptr());
            assert_eq!(rc, 0);
            let held = resident.iter().filter(|&&r| r & 1 == 1).count();
            assert_eq!(held, 0, "{held} of {pages} pages resident");
            Allocator.dealloc(block, layout);
        }
    }
}
