//! `counting-alloc`: a global allocator that wraps another and counts.
//!
//! The tests and benchmarks that make claims about memory use it: the
//! index's churn test (live bytes come back to their baseline), the
//! protocol's fuzz test (no input makes the decoder reserve memory out of
//! proportion to its length) and the index benchmark (heap bytes per entry).
//! It counts live bytes and the largest single request since the last reset,
//! by every thread and by the calling thread alone (a test harness's own
//! threads allocate while a test measures); it changes nothing else, so the wrapped allocator's speed is what a
//! benchmark measures, plus two relaxed atomic adds.
//!
//! ```
//! use counting_alloc::Counting;
//! use std::alloc::System;
//!
//! #[global_allocator]
//! static ALLOC: Counting<System> = Counting::new(System);
//!
//! let before = ALLOC.live();
//! let v = vec![0u8; 1 << 20];
//! assert!(ALLOC.live() - before >= 1 << 20);
//! assert!(ALLOC.largest() >= 1 << 20);
//! assert!(ALLOC.largest_here() >= 1 << 20);
//! drop(v);
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering};

thread_local! {
    /// The largest single allocation of this thread since its last reset.
    /// Const-initialized and without a destructor, so the allocator can
    /// touch it at any point of a thread's life without allocating.
    static LARGEST_HERE: Cell<usize> = const { Cell::new(0) };
}

/// `A`, counting. Use it as the `#[global_allocator]` of a test or bench
/// binary.
pub struct Counting<A> {
    inner: A,
    live: AtomicIsize,
    largest: AtomicUsize,
}

impl<A> Counting<A> {
    /// Wraps `inner`.
    pub const fn new(inner: A) -> Self {
        Counting {
            inner,
            live: AtomicIsize::new(0),
            largest: AtomicUsize::new(0),
        }
    }

    /// Bytes allocated and not yet freed, by every thread.
    pub fn live(&self) -> isize {
        // Relaxed: a statistic; callers read it between their own
        // allocations, which are ordered by their thread.
        self.live.load(Ordering::Relaxed)
    }

    /// The largest single allocation (or reallocation) since the last
    /// [`Counting::reset_largest`], by any thread.
    pub fn largest(&self) -> usize {
        // Relaxed: as in `live`.
        self.largest.load(Ordering::Relaxed)
    }

    /// Starts a new window for [`Counting::largest`].
    pub fn reset_largest(&self) {
        // Relaxed: as in `live`.
        self.largest.store(0, Ordering::Relaxed);
    }

    /// The largest single allocation (or reallocation) the calling thread
    /// made since its last [`Counting::reset_largest_here`]: what one
    /// thread's work reserved, whatever other threads do meanwhile.
    pub fn largest_here(&self) -> usize {
        LARGEST_HERE.try_with(Cell::get).unwrap_or(0)
    }

    /// Starts a new window for [`Counting::largest_here`].
    pub fn reset_largest_here(&self) {
        let _ = LARGEST_HERE.try_with(|l| l.set(0));
    }

    fn record(&self, grown: isize, size: usize) {
        // Relaxed: counters only; nothing is published through them.
        self.live.fetch_add(grown, Ordering::Relaxed);
        self.largest.fetch_max(size, Ordering::Relaxed);
        let _ = LARGEST_HERE.try_with(|l| l.set(l.get().max(size)));
    }
}

/// Sizes of allocations fit in `isize` (a `Layout` guarantees it).
fn signed(size: usize) -> isize {
    isize::try_from(size).unwrap_or(isize::MAX)
}

// SAFETY: every call is forwarded to `inner` with the same arguments, and its
// result returned unchanged; only counters are updated besides.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.record(signed(layout.size()), layout.size());
        // SAFETY: the caller's contract for `alloc` is `inner.alloc`'s.
        unsafe { self.inner.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.record(signed(layout.size()), layout.size());
        // SAFETY: the caller's contract for `alloc_zeroed` is `inner`'s.
        unsafe { self.inner.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        self.record(-signed(layout.size()), 0);
        // SAFETY: `ptr` came from `inner` (every allocation here goes to it)
        // with this layout, as the caller guarantees.
        unsafe { self.inner.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.record(signed(new_size) - signed(layout.size()), new_size);
        // SAFETY: as in `dealloc`, and the caller's contract for `new_size`
        // is `inner.realloc`'s.
        unsafe { self.inner.realloc(ptr, layout, new_size) }
    }
}
