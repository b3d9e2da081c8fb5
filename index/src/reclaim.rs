//! Epoch-based reclamation for one index: pins, retirement, and the values
//! readers reach through one pointer that writers replace copy-on-write.
//!
//! Each [`crate::Index`] owns one private crossbeam-epoch collector, in an
//! [`Epoch`]. Every object that readers can reach without a lock (tree nodes,
//! child tables, the model and pod-name maps, rank tables, pod names) is
//! freed only through [`Epoch::retire`], so it stays allocated while any
//! [`Pin`] taken before it was unlinked lives. That is the one invariant the
//! lifetime-carrying references of this crate (`NodeRef<'g>`, and `&'g T`
//! from [`Published::get`]) stand on: `'g` is the life of a pin of the index
//! whose objects they point to.
//!
//! crossbeam-epoch runs deferred functions in whichever thread happens to
//! collect, which may be a reader. Our deferred functions therefore only push
//! the retired object onto a lock-free queue; the maintenance thread (or the
//! sweep) drains it in [`Epoch::reclaim_ready`] and pays for the frees, so the
//! cost of dropping a big subtree never lands on a lookup.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::sync::Arc;

use crossbeam_queue::SegQueue;
use thread_local::ThreadLocal;

use crate::sync::epoch::{Collector, Guard, LocalHandle};
use crate::sync::{AtomicBool, AtomicPtr, Ordering};

type Job = Box<dyn FnOnce() -> usize + Send>;

/// One index's collector, its threads' handles, and the queue of objects
/// whose grace period has passed.
pub(crate) struct Epoch {
    collector: ManuallyDrop<Collector>,
    handles: ThreadLocal<Handle>,
    ready: Arc<SegQueue<Job>>,
}

/// A `LocalHandle` of an index's collector, kept per thread.
struct Handle(LocalHandle);

// SAFETY: a handle is used only by the thread that registered it (through
// `ThreadLocal::get_or`); it crosses threads only when the epoch is dropped,
// which needs `&mut Epoch`, so no thread is pinned through it at that time.
unsafe impl Send for Handle {}

/// A pin of one index's collector: while it lives, nothing that index
/// retires after the pin began is freed. References read under it borrow it
/// (`NodeRef<'g>` from `&'g Pin`), so they cannot outlive it. Only
/// [`Epoch::pin`] (and, in loom models, a registered participant) makes one,
/// and a pin is only used on the index whose epoch made it: each `Index`
/// passes its own pins down (checked in debug builds by [`Epoch::retire`]).
pub(crate) struct Pin {
    guard: Guard,
}

impl Pin {
    /// Lets the collector advance the epoch and queue what is due.
    pub(crate) fn flush(&self) {
        self.guard.flush();
    }
}

impl Default for Epoch {
    fn default() -> Self {
        Epoch {
            collector: ManuallyDrop::new(Collector::new()),
            handles: ThreadLocal::new(),
            ready: Arc::default(),
        }
    }
}

/// An object just unlinked from the structure that published it: threads
/// pinned now may still read it, threads pinned later cannot reach it. The
/// only way to free it is to hand it to [`Epoch::retire`], which waits out
/// their pins.
pub(crate) struct Unlinked<T>(NonNull<T>);

// SAFETY: an `Unlinked` is the one handle on an object that no shared
// structure links any more: moving it to the reclaiming thread moves the
// object's ownership there, which is sound when the object itself is `Send`.
// It never gives out references, so it need not be `Sync` to be sent.
unsafe impl<T: Send> Send for Unlinked<T> {}

impl<T> Unlinked<T> {
    /// # Safety
    /// `ptr` came from `Box::into_raw`, the structure that published it has
    /// just dropped its last link to it (readers pinned from now on cannot
    /// reach it), and no other `Unlinked` is made for it.
    pub(crate) unsafe fn new(ptr: *mut T) -> Self {
        debug_assert!(!ptr.is_null());
        // SAFETY: `ptr` came from `Box::into_raw` (the caller's contract),
        // which never returns null.
        Unlinked(unsafe { NonNull::new_unchecked(ptr) })
    }

    /// Takes the object back as a box, to free it.
    ///
    /// # Safety
    /// No thread can still read the object: a grace period passed since it
    /// was unlinked (or no other thread ever saw it).
    pub(crate) unsafe fn into_box(self) -> Box<T> {
        // SAFETY: from `Box::into_raw` (see `new`), and unreachable by any
        // other thread (this function's contract).
        unsafe { Box::from_raw(self.0.as_ptr()) }
    }
}

impl Epoch {
    /// Pins the calling thread (registering it with this collector on first use).
    pub(crate) fn pin(&self) -> Pin {
        let handle = self.handles.get_or(|| Handle(self.collector.register()));
        Pin {
            guard: handle.0.pin(),
        }
    }

    /// Frees `garbage` with `free` once no thread pinned now can still read
    /// it; `free` returns the bytes it released, for the memory statistics.
    /// The one way anything readers may hold is freed.
    pub(crate) fn retire<T: Send + 'static>(
        &self,
        pin: &Pin,
        garbage: Unlinked<T>,
        free: impl FnOnce(Box<T>) -> usize + Send + 'static,
    ) {
        #[cfg(not(loom))]
        debug_assert!(
            pin.guard.collector() == Some(&*self.collector),
            "a pin of another index"
        );
        let ready = Arc::clone(&self.ready);
        let job: Job = Box::new(move || {
            // SAFETY: this runs after a grace period of the collector that
            // `pin` belongs to; every thread that could read the object was
            // pinned when it was unlinked, so all of them have unpinned.
            free(unsafe { garbage.into_box() })
        });
        pin.guard.defer(move || ready.push(job));
    }

    /// A flag that becomes true one grace period from now: once it reads true
    /// (`Acquire`), every thread pinned now has unpinned, and what they did
    /// before unpinning is visible.
    pub(crate) fn grace_flag(&self, pin: &Pin) -> Arc<AtomicBool> {
        let flag = Arc::new(AtomicBool::new(false));
        let set = Arc::clone(&flag);
        // Release: pairs with the Acquire load of whoever waits on the flag.
        pin.guard.defer(move || set.store(true, Ordering::Release));
        flag
    }

    /// Runs every queued free; returns how many objects and bytes it released.
    pub(crate) fn reclaim_ready(&self) -> (usize, usize) {
        let (mut jobs, mut bytes) = (0, 0);
        while let Some(job) = self.ready.pop() {
            jobs += 1;
            bytes += job();
        }
        (jobs, bytes)
    }

    /// A participant of this collector for one loom thread: loom runs its
    /// threads on one OS thread, so the per-thread handles of [`Epoch::pin`]
    /// cannot tell them apart.
    #[cfg(all(test, loom))]
    pub(crate) fn register(&self) -> Participant {
        Participant(self.collector.register())
    }
}

/// One registered thread of an [`Epoch`] (loom models only).
#[cfg(all(test, loom))]
pub(crate) struct Participant(LocalHandle);

#[cfg(all(test, loom))]
impl Participant {
    pub(crate) fn pin(&self) -> Pin {
        Pin {
            guard: self.0.pin(),
        }
    }
}

impl Drop for Epoch {
    fn drop(&mut self) {
        // Unregister every thread's handle, then drop the collector: that runs
        // every deferred function, which queues the retired objects.
        self.handles.clear();
        // SAFETY: dropped exactly once, here; nothing uses it afterwards.
        unsafe { ManuallyDrop::drop(&mut self.collector) };
        self.reclaim_ready();
    }
}

/// The `free` for [`Epoch::retire`] of what the memory statistics do not
/// count (maps, names, rank tables): drops it, reports 0 bytes.
pub(crate) fn free_uncounted<T>(value: Box<T>) -> usize {
    drop(value);
    0
}

/// A value that readers reach through one pointer and writers replace whole
/// (copy-on-write): the model map, the pod-name map, the rank table. Readers
/// get `&'g T` for the life of their pin; a replaced value is retired.
pub(crate) struct Published<T: Send + Sync + 'static> {
    ptr: AtomicPtr<T>,
}

impl<T: Send + Sync + 'static> Published<T> {
    pub(crate) fn new(value: Box<T>) -> Self {
        Published {
            ptr: AtomicPtr::new(Box::into_raw(value)),
        }
    }

    /// The current value. `pin` must be of the epoch that `replace` is given.
    #[inline]
    pub(crate) fn get<'g>(&'g self, _pin: &'g Pin) -> &'g T {
        // Acquire: pairs with the Release half of the swap in `replace`, so
        // the value is initialised before we read it.
        let ptr = self.ptr.load(Ordering::Acquire);
        // SAFETY: never null (set from a box in `new` and `replace`); a
        // replaced value is freed only through `Epoch::retire`, after every
        // pin taken before the replacement ends, and we hold such a pin for
        // 'g; the current value is freed only by `drop`, which needs `&mut`.
        unsafe { &*ptr }
    }

    /// Publishes `value` and retires the value it replaces.
    pub(crate) fn replace(&self, value: Box<T>, epoch: &Epoch, pin: &Pin) {
        // AcqRel: Release publishes the new value to the Acquire load in
        // `get`; Acquire pairs with the Release of the previous `replace`, so
        // the old value is ours (initialised) when it is freed.
        let old = self.ptr.swap(Box::into_raw(value), Ordering::AcqRel);
        // SAFETY: `old` came from `Box::into_raw`; the swap removed the only
        // link to it, and only this swap saw it as the old value.
        let old = unsafe { Unlinked::new(old) };
        epoch.retire(pin, old, free_uncounted);
        // A replaced value is a whole copy (every pod's name, every pod's
        // state): hand it to the collector now rather than leave it in this
        // thread's bag, which fills only after dozens more retirements and
        // which a thread that writes rarely may never fill.
        pin.flush();
    }
}

impl<T: Send + Sync + 'static> Drop for Published<T> {
    fn drop(&mut self) {
        // Relaxed: pairs with nothing; `&mut self` means no other thread can
        // load or replace the pointer any more.
        let ptr = self.ptr.load(Ordering::Relaxed);
        // SAFETY: from `Box::into_raw`, still published (so never retired),
        // and unreachable by anyone else (`&mut self`).
        drop(unsafe { Box::from_raw(ptr) });
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::sync::AtomicUsize;

    /// Counts its drops in the counter it holds.
    struct Counted(Arc<AtomicUsize>);

    impl Drop for Counted {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Flushes the way `Index::reclaim` does; returns the objects freed.
    fn collect(epoch: &Epoch) -> usize {
        let mut freed = 0;
        for _ in 0..8 {
            epoch.pin().flush();
            freed += epoch.reclaim_ready().0;
        }
        freed
    }

    fn unlinked(value: Counted) -> Unlinked<Counted> {
        // SAFETY: a fresh box, linked from nowhere, made into one `Unlinked`.
        unsafe { Unlinked::new(Box::into_raw(Box::new(value))) }
    }

    #[test]
    fn a_retired_object_outlives_every_pin_taken_before_its_retirement() {
        let epoch = Epoch::default();
        let drops = Arc::new(AtomicUsize::new(0));
        let held = epoch.pin();
        epoch.retire(&held, unlinked(Counted(drops.clone())), |b| {
            drop(b);
            7
        });
        // Another thread pinned before the retirement holds it back.
        let (pinned, release) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            s.spawn(|| {
                let _other = epoch.pin();
                pinned.wait();
                release.wait();
            });
            pinned.wait();
            drop(held);
            assert_eq!(collect(&epoch), 0);
            assert_eq!(drops.load(Ordering::Relaxed), 0);
            release.wait();
        });
        assert_eq!(collect(&epoch), 1);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn a_grace_flag_is_set_once_every_earlier_pin_is_gone() {
        let epoch = Epoch::default();
        let held = epoch.pin();
        let flag = epoch.grace_flag(&held);
        collect(&epoch);
        assert!(!flag.load(Ordering::Acquire));
        drop(held);
        collect(&epoch);
        assert!(flag.load(Ordering::Acquire));
    }

    #[test]
    fn a_published_value_is_replaced_whole_and_the_old_one_retired() {
        let epoch = Epoch::default();
        let drops = Arc::new(AtomicUsize::new(0));
        let value = Published::new(Box::new(Counted(drops.clone())));
        let pin = epoch.pin();
        let old = value.get(&pin);
        value.replace(Box::new(Counted(drops.clone())), &epoch, &pin);
        // The reader's reference stays valid while its pin lives.
        assert!(Arc::ptr_eq(&old.0, &drops));
        assert!(!std::ptr::eq(old, value.get(&pin)));
        drop(pin);
        assert_eq!(collect(&epoch), 1);
        assert_eq!(drops.load(Ordering::Relaxed), 1);
        drop(value);
        assert_eq!(drops.load(Ordering::Relaxed), 2);
    }

    /// A replaced value (a whole map) does not wait in the writer's bag for
    /// dozens more retirements: another thread's collection frees it.
    #[test]
    fn a_replaced_value_is_freed_by_another_thread_without_the_writer_retiring_more() {
        let epoch = Epoch::default();
        let drops = Arc::new(AtomicUsize::new(0));
        let value = Published::new(Box::new(Counted(drops.clone())));
        let (replaced, checked) = (std::sync::Barrier::new(2), std::sync::Barrier::new(2));
        std::thread::scope(|s| {
            // The writer lives on (a thread's exit hands its bag over).
            s.spawn(|| {
                let pin = epoch.pin();
                value.replace(Box::new(Counted(drops.clone())), &epoch, &pin);
                drop(pin);
                replaced.wait();
                checked.wait();
            });
            replaced.wait();
            let freed = collect(&epoch);
            checked.wait();
            assert_eq!(freed, 1);
        });
        assert_eq!(drops.load(Ordering::Relaxed), 1);
    }
}
