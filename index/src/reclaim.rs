//! Deferred reclamation that never runs destructors inside a reader's pin.
//!
//! crossbeam-epoch runs deferred functions in whichever thread happens to
//! collect, which may be a reader. Our deferred functions therefore only push
//! the retired object onto a lock-free queue; the maintenance thread (or the
//! sweep) drains it in [`Reclaimer::reclaim`] and pays for the frees, so the
//! cost of dropping a big subtree never lands on a lookup.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crossbeam_epoch::Guard;
use crossbeam_queue::SegQueue;

type Job = Box<dyn FnOnce() -> usize + Send>;

/// The queue of objects whose grace period has passed.
#[derive(Default)]
pub(crate) struct Reclaimer {
    ready: Arc<SegQueue<Job>>,
}

impl Reclaimer {
    /// Frees `value` with `free` once no thread pinned now can still see it.
    /// `free` returns the bytes it released, for the memory statistics.
    pub(crate) fn retire<T: Send + 'static>(
        &self,
        guard: &Guard,
        value: T,
        free: impl FnOnce(T) -> usize + Send + 'static,
    ) {
        let ready = Arc::clone(&self.ready);
        let job: Job = Box::new(move || free(value));
        guard.defer(move || ready.push(job));
    }

    /// A flag that becomes true one grace period from now.
    pub(crate) fn grace_flag(&self, guard: &Guard) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        let set = Arc::clone(&flag);
        // Release: pairs with the Acquire load of whoever waits on the flag.
        guard.defer(move || set.store(true, Ordering::Release));
        flag
    }

    /// Runs every ready free; returns how many objects and bytes it released.
    pub(crate) fn reclaim(&self) -> (usize, usize) {
        let (mut jobs, mut bytes) = (0, 0);
        while let Some(job) = self.ready.pop() {
            jobs += 1;
            bytes += job();
        }
        (jobs, bytes)
    }
}
