//! Pod names interned to dense ids, and each pod's live state.
//!
//! Ids index a fixed array sized by `max_pods`, so per-pod counters never move
//! and readers reach them with one load. The name→id map is a small hash map
//! replaced copy-on-write under `writer` (pods are added and removed at control
//! plane rate, not per request) and read lock-free under an epoch guard.
//!
//! A removed pod's id is **dead**: entries that carry it are invisible at once
//! and the sweep frees them. The id is reused only when (1) every insert that
//! could still write it has finished (an epoch grace period after the removal),
//! (2) the sweep has freed all its blocks, and (3) a second grace period has let
//! go every reader that could still see an old copy of its entries.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicPtr, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

use crossbeam_epoch::Guard;
use parking_lot::Mutex;

use crate::error::PodError;
use crate::reclaim::Reclaimer;

/// A pod's dense id inside one [`crate::Index`]. Ids of removed pods are reused,
/// so an id is only meaningful next to the index that gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodId(pub(crate) u32);

impl PodId {
    /// The id as a plain integer (for dense per-pod arrays kept by callers).
    pub fn get(self) -> u32 {
        self.0
    }
}

const FREE: u8 = 0;
const LIVE: u8 = 1;
const DEAD: u8 = 2;

struct Name {
    text: Box<str>,
}

struct Slot {
    state: AtomicU8,
    name: AtomicPtr<Name>,
    blocks: AtomicI64,
    capacity: AtomicU64,
}

type NameMap = std::collections::HashMap<Box<str>, u32, ahash::RandomState>;

struct Writer {
    free: Vec<u32>,
    next: u32,
    dead: Vec<Dead>,
}

struct Dead {
    id: u32,
    /// Set by the collector one grace period after the latest phase began.
    /// Created by the sweep (`recycle`), not by `remove`: the sweep's thread
    /// flushes its deferred work every call, while the thread that removed the
    /// pod may never defer anything again (its bag would hold the flag back).
    /// Starting the grace period later is still safe: it waits for every insert
    /// pinned before it, which includes every insert pinned before the removal.
    quiet: Option<Arc<AtomicBool>>,
    /// Whether the blocks already reached zero and the second grace period runs.
    draining: bool,
}

/// The pod registry of one index.
pub(crate) struct Pods {
    slots: Box<[Slot]>,
    names: AtomicPtr<NameMap>,
    /// Ids in name order and back, rebuilt copy-on-write when a pod is added,
    /// so lookups order pods by name without comparing strings.
    ranks: AtomicPtr<Ranks>,
    writer: Mutex<Writer>,
    default_capacity: AtomicU64,
}

impl Pods {
    pub(crate) fn new(max_pods: u32, default_capacity: u64) -> Self {
        let max = max_pods.min(crate::slots::MAX_POD_ID + 1);
        Pods {
            slots: (0..max)
                .map(|_| Slot {
                    state: AtomicU8::new(FREE),
                    name: AtomicPtr::new(std::ptr::null_mut()),
                    blocks: AtomicI64::new(0),
                    capacity: AtomicU64::new(default_capacity),
                })
                .collect(),
            names: AtomicPtr::new(Box::into_raw(Box::default())),
            ranks: AtomicPtr::new(Box::into_raw(Box::default())),
            writer: Mutex::new(Writer {
                free: Vec::new(),
                next: 0,
                dead: Vec::new(),
            }),
            default_capacity: AtomicU64::new(default_capacity),
        }
    }

    fn map<'g>(&self, _guard: &'g Guard) -> &'g NameMap {
        // Acquire: pairs with the Release store that published the map.
        let map = self.names.load(Ordering::Acquire);
        // Maps are retired through the epoch after being replaced; never null.
        // SAFETY: the guard keeps this one alive.
        unsafe { &*map }
    }

    /// The live id of `name`, if any. Lock-free.
    pub(crate) fn id(&self, name: &str, guard: &Guard) -> Option<PodId> {
        self.map(guard).get(name).map(|&i| PodId(i))
    }

    /// The id of `name`, interning it if new.
    pub(crate) fn intern(
        &self,
        name: &str,
        max_name_len: usize,
        rec: &Reclaimer,
        guard: &Guard,
    ) -> Result<PodId, PodError> {
        if let Some(id) = self.id(name, guard) {
            return Ok(id);
        }
        if name.is_empty() || name.len() > max_name_len {
            return Err(PodError::BadName {
                len: name.len(),
                max: max_name_len,
            });
        }
        let mut w = self.writer.lock();
        if let Some(id) = self.id(name, guard) {
            return Ok(id);
        }
        let id = match w.free.pop() {
            Some(id) => id,
            None if (w.next as usize) < self.slots.len() => {
                w.next += 1;
                w.next - 1
            }
            None => {
                return Err(PodError::TooManyPods {
                    max: self.slots.len(),
                })
            }
        };
        let slot = &self.slots[id as usize];
        let fresh = Box::into_raw(Box::new(Name { text: name.into() }));
        // Release: readers that see the LIVE state below (Acquire) see the name.
        let old = slot.name.swap(fresh, Ordering::Release);
        if !old.is_null() {
            rec.retire(guard, SendBox(old), |b| {
                // SAFETY: `old` came from Box::into_raw and was unpublished above.
                drop(unsafe { Box::from_raw(b.0) });
                0
            });
        }
        slot.blocks.store(0, Ordering::Relaxed);
        // Relaxed: ordered before publication by the Release stores below.
        slot.capacity.store(
            self.default_capacity.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        // Release: pairs with readers' Acquire load of the state.
        slot.state.store(LIVE, Ordering::Release);
        // Ranked before named: whoever finds the id through the name map
        // (an insert of the same name on the lock-free path, a lookup's
        // candidates) can only then write or ask for it, and every rank table
        // loaded after that ranks it. A lookup may thus treat a pod missing
        // from its table as added concurrently (see `Tree::lookup`).
        self.rank(w.next, guard, rec);
        self.publish(
            |m| {
                m.insert(name.into(), id);
            },
            rec,
            guard,
        );
        Ok(PodId(id))
    }

    /// Rebuilds the rank table over ids `0..next`. Called under `writer`.
    fn rank(&self, next: u32, guard: &Guard, rec: &Reclaimer) {
        let mut order: Vec<(&str, u32)> = (0..next)
            // Relaxed: we hold `writer`, under which every state change happens.
            .filter(|&id| self.slots[id as usize].state.load(Ordering::Relaxed) == LIVE)
            .filter_map(|id| Some((self.name(PodId(id), guard)?, id)))
            .collect();
        order.sort_unstable();
        let mut ranks = Ranks {
            rank: vec![NOT_LIVE; next as usize],
            by_rank: Vec::new(),
        };
        for (rank, (_, id)) in order.into_iter().enumerate() {
            // At most `max_pods` (< 2^20) entries: the cast cannot truncate.
            ranks.rank[id as usize] = rank as u32;
            ranks.by_rank.push(id);
        }
        // AcqRel: Release publishes the table; Acquire owns the old one.
        let old = self
            .ranks
            .swap(Box::into_raw(Box::new(ranks)), Ordering::AcqRel);
        rec.retire(guard, SendBox(old), |b| {
            // SAFETY: the old table came from Box::into_raw and is unpublished.
            drop(unsafe { Box::from_raw(b.0) });
            0
        });
    }

    /// The current rank table.
    #[inline]
    pub(crate) fn ranks<'g>(&self, _guard: &'g Guard) -> &'g Ranks {
        // Acquire: pairs with the Release swap in `rank`.
        let ranks = self.ranks.load(Ordering::Acquire);
        // SAFETY: retired through the epoch; the guard keeps it; never null.
        unsafe { &*ranks }
    }

    /// Replaces the name map with an edited copy. Called under `writer`.
    fn publish(&self, edit: impl FnOnce(&mut NameMap), rec: &Reclaimer, guard: &Guard) {
        let mut next = self.map(guard).clone();
        edit(&mut next);
        // AcqRel: Release publishes the new map; Acquire takes ownership of the old.
        let old = self
            .names
            .swap(Box::into_raw(Box::new(next)), Ordering::AcqRel);
        rec.retire(guard, SendBox(old), |b| {
            // SAFETY: the old map came from Box::into_raw and is unpublished.
            drop(unsafe { Box::from_raw(b.0) });
            0
        });
    }

    /// Marks `name` removed: its entries vanish from lookups at once.
    pub(crate) fn remove(&self, name: &str, rec: &Reclaimer, guard: &Guard) -> bool {
        let mut w = self.writer.lock();
        let Some(PodId(id)) = self.id(name, guard) else {
            return false;
        };
        // Release: a reader that sees DEAD stops counting this pod's entries.
        self.slots[id as usize].state.store(DEAD, Ordering::Release);
        self.publish(
            |m| {
                m.remove(name);
            },
            rec,
            guard,
        );
        // Lookups read liveness from the rank table: republish it before
        // returning, so a lookup that starts after this call skips the pod.
        self.rank(w.next, guard, rec);
        w.dead.push(Dead {
            id,
            quiet: None,
            draining: false,
        });
        true
    }

    /// Frees the ids of removed pods whose blocks are all gone (see module docs).
    pub(crate) fn recycle(&self, rec: &Reclaimer, guard: &Guard) -> usize {
        let mut w = self.writer.lock();
        let mut freed = Vec::new();
        w.dead.retain_mut(|d| {
            let Some(quiet) = &d.quiet else {
                d.quiet = Some(rec.grace_flag(guard));
                return true;
            };
            // Acquire: pairs with the collector's Release store of the flag.
            if !quiet.load(Ordering::Acquire) {
                return true;
            }
            if !d.draining {
                // Relaxed: the count is exact once no insert can write this id.
                if self.slots[d.id as usize].blocks.load(Ordering::Relaxed) != 0 {
                    return true;
                }
                d.draining = true;
                d.quiet = Some(rec.grace_flag(guard));
                return true;
            }
            freed.push(d.id);
            false
        });
        for &id in &freed {
            // Relaxed: nothing reads a FREE slot's state for meaning until a new
            // LIVE store (Release) republishes it.
            self.slots[id as usize].state.store(FREE, Ordering::Relaxed);
        }
        let n = freed.len();
        w.free.extend(freed);
        n
    }

    /// Whether entries with this id count.
    #[inline]
    pub(crate) fn is_live(&self, id: u32) -> bool {
        // Acquire: pairs with the Release stores of LIVE and DEAD.
        self.slots[id as usize].state.load(Ordering::Acquire) == LIVE
    }

    /// The name of a live or dead id.
    pub(crate) fn name<'g>(&self, id: PodId, _guard: &'g Guard) -> Option<&'g str> {
        // Acquire: pairs with the Release swap that published the name.
        let p = self.slots.get(id.0 as usize)?.name.load(Ordering::Acquire);
        // SAFETY: names are retired through the epoch; the guard keeps it alive.
        (!p.is_null()).then(|| unsafe { &*(*p).text })
    }

    pub(crate) fn add_blocks(&self, id: u32, n: i64) {
        // Relaxed: a statistic and the capacity trigger; nothing is ordered by it.
        self.slots[id as usize]
            .blocks
            .fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn blocks(&self, id: u32) -> u64 {
        // Relaxed: as in `add_blocks`.
        self.slots[id as usize]
            .blocks
            .load(Ordering::Relaxed)
            .max(0) as u64
    }

    pub(crate) fn capacity(&self, id: u32) -> u64 {
        // Relaxed: a setting read by the sweep; no data depends on it.
        self.slots[id as usize].capacity.load(Ordering::Relaxed)
    }

    pub(crate) fn set_capacity(&self, id: PodId, blocks: u64) {
        // Relaxed: as in `capacity`.
        self.slots[id.0 as usize]
            .capacity
            .store(blocks, Ordering::Relaxed);
    }

    /// Whether a removed pod's id still waits to be freed (its entries purged
    /// and grace periods passed), which takes sweep passes.
    pub(crate) fn removals_pending(&self) -> bool {
        !self.writer.lock().dead.is_empty()
    }

    /// Ids in use (live or dead and not yet freed), for the sweep's capacity pass.
    pub(crate) fn ids_in_use(&self) -> std::ops::Range<u32> {
        0..self.writer.lock().next
    }

    /// Every live pod's name and id (a snapshot writes them).
    pub(crate) fn live<'g>(&self, guard: &'g Guard) -> impl Iterator<Item = (&'g str, u32)> {
        self.map(guard).iter().map(|(name, &id)| (&**name, id))
    }

    /// The capacity new pods start with.
    pub(crate) fn default_capacity(&self) -> u64 {
        // Relaxed: a setting; nothing is ordered by it.
        self.default_capacity.load(Ordering::Relaxed)
    }

    pub(crate) fn live_count(&self, guard: &Guard) -> usize {
        self.map(guard).len()
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        // Exclusive access: free the map and every name.
        let map = *self.names.get_mut();
        let ranks = *self.ranks.get_mut();
        // SAFETY: both came from Box::into_raw; no one else can reach them.
        drop(unsafe { (Box::from_raw(map), Box::from_raw(ranks)) });
        for s in self.slots.iter_mut() {
            let p = *s.name.get_mut();
            if !p.is_null() {
                // SAFETY: as above, for the slot's current name.
                drop(unsafe { Box::from_raw(p) });
            }
        }
    }
}

/// `Ranks::rank` of an id that is not live (removed, or free).
pub(crate) const NOT_LIVE: u32 = u32::MAX - 1;
/// `Ranks::rank` of an id newer than the table: check its state instead.
pub(crate) const UNRANKED: u32 = u32::MAX;

/// Live pod ids in name order: `rank[id]` is the id's position (or
/// [`NOT_LIVE`]), `by_rank` the ids. One load answers both "is it live?" and
/// "where does it sort?" on the lookup path.
#[derive(Default)]
pub(crate) struct Ranks {
    rank: Vec<u32>,
    by_rank: Vec<u32>,
}

impl Ranks {
    /// The id's position in name order; [`NOT_LIVE`]; or [`UNRANKED`] for an
    /// id newer than this table (it then sorts after every ranked pod).
    #[inline]
    pub(crate) fn rank(&self, id: u32) -> u32 {
        self.rank.get(id as usize).copied().unwrap_or(UNRANKED)
    }

    /// The id at a position returned by [`Ranks::rank`].
    #[inline]
    pub(crate) fn id(&self, rank: u32) -> u32 {
        self.by_rank[rank as usize]
    }

    /// How many pods the table ranks (the live ones when it was built).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.by_rank.len()
    }
}

/// A raw box pointer moved to the reclaiming thread.
pub(crate) struct SendBox<T>(pub(crate) *mut T);
// SAFETY: the pointee is only freed, by one thread, after a grace period; the
// types sent this way (`Name`, `NameMap`, rank tables) are themselves `Send`.
unsafe impl<T> Send for SendBox<T> {}
