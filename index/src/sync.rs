//! The atomics, locks and epoch collector every lock-free building block
//! uses, in one place.
//!
//! Under `--cfg loom` the atomics and locks are loom's model-checked ones and
//! the collector is [`epoch`]'s small model of crossbeam-epoch, so the
//! protocols of `slots`, `children` and `pods` are explored by the models in
//! `loom_tests.rs` exactly as they are compiled for production (the same
//! arrangement as crossbeam-epoch's `primitive` module).

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
};
#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize,
};

pub(crate) use std::sync::atomic::Ordering;

#[cfg(not(loom))]
pub(crate) use parking_lot::{Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom_mutex::{Mutex, MutexGuard};

/// A fresh number, never handed out before in this process: identities that,
/// unlike addresses, the allocator cannot hand out again.
///
/// Not modelled under loom: the counter orders nothing, it only has to count.
pub(crate) fn unique_id() -> usize {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
    // Relaxed: pairs with nothing; every caller gets a distinct value from
    // the counter's modification order alone.
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// loom's mutex with `parking_lot`'s signature (no poisoning).
#[cfg(loom)]
mod loom_mutex {
    pub(crate) use loom::sync::MutexGuard;

    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Mutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            // A poisoned lock means a model already failed: take the data anyway
            // and let that failure be the one reported.
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }
}

/// The epoch collector: crossbeam-epoch's, or under loom a model of it.
#[cfg(not(loom))]
pub(crate) mod epoch {
    pub(crate) use crossbeam_epoch::{Collector, Guard, LocalHandle};
}

/// A model of crossbeam-epoch for loom, with the one guarantee the index
/// relies on: a function deferred while a thread is pinned runs only after
/// every thread pinned at that moment has unpinned, and everything those
/// threads did before unpinning happens before it.
///
/// It is crossbeam's algorithm (a global epoch that advances only when every
/// pinned participant has seen it; a deferred function runs once the epoch has
/// advanced twice past the one it was deferred in) with its state behind one
/// loom mutex, so loom sees the synchronisation that crossbeam gets from its
/// `SeqCst` fences. Like crossbeam, it collects only when asked
/// ([`Guard::flush`]); unlike crossbeam, pinning never collects on its own.
#[cfg(loom)]
pub(crate) mod epoch {
    use std::sync::Arc;

    use super::Mutex;

    type Deferred = Box<dyn FnOnce() + Send>;

    #[derive(Default)]
    struct State {
        epoch: usize,
        /// Per participant: how many guards it holds, and the epoch it pinned.
        pinned: Vec<(usize, usize)>,
        deferred: Vec<(usize, Deferred)>,
    }

    struct Global {
        state: Mutex<State>,
    }

    impl Drop for Global {
        fn drop(&mut self) {
            // As crossbeam's: whatever is still deferred runs when the
            // collector goes away.
            let deferred = std::mem::take(&mut self.state.lock().deferred);
            for (_, f) in deferred {
                f();
            }
        }
    }

    #[derive(Clone)]
    pub(crate) struct Collector {
        global: Arc<Global>,
    }

    pub(crate) struct LocalHandle {
        global: Arc<Global>,
        id: usize,
    }

    pub(crate) struct Guard {
        global: Arc<Global>,
        id: usize,
    }

    impl Collector {
        pub(crate) fn new() -> Self {
            Collector {
                global: Arc::new(Global {
                    state: Mutex::new(State::default()),
                }),
            }
        }

        pub(crate) fn register(&self) -> LocalHandle {
            let mut state = self.global.state.lock();
            state.pinned.push((0, 0));
            LocalHandle {
                global: Arc::clone(&self.global),
                id: state.pinned.len() - 1,
            }
        }
    }

    impl LocalHandle {
        pub(crate) fn pin(&self) -> Guard {
            let mut state = self.global.state.lock();
            let epoch = state.epoch;
            let (guards, pinned) = &mut state.pinned[self.id];
            if *guards == 0 {
                *pinned = epoch;
            }
            *guards += 1;
            Guard {
                global: Arc::clone(&self.global),
                id: self.id,
            }
        }
    }

    impl Guard {
        pub(crate) fn defer<F: FnOnce() + Send + 'static>(&self, f: F) {
            let mut state = self.global.state.lock();
            let epoch = state.epoch;
            state.deferred.push((epoch, Box::new(f)));
        }

        /// Advances the epoch if every pinned participant has seen it, then
        /// runs what has waited two advances.
        pub(crate) fn flush(&self) {
            let ready: Vec<Deferred> = {
                let mut state = self.global.state.lock();
                let epoch = state.epoch;
                if state
                    .pinned
                    .iter()
                    .all(|&(guards, pinned)| guards == 0 || pinned == epoch)
                {
                    state.epoch += 1;
                }
                let now = state.epoch;
                let (ready, waiting) = std::mem::take(&mut state.deferred)
                    .into_iter()
                    .partition(|&(at, _)| at + 2 <= now);
                state.deferred = waiting;
                ready.into_iter().map(|(_, f)| f).collect()
            };
            for f in ready {
                f();
            }
        }
    }

    impl Drop for Guard {
        fn drop(&mut self) {
            self.global.state.lock().pinned[self.id].0 -= 1;
        }
    }
}
