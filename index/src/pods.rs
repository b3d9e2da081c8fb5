//! Pod names interned to dense ids, and each pod's live state.
//!
//! Ids index a fixed array sized by `max_pods`, so per-pod counters never move
//! and readers reach them with one load. The name→id map is a small hash map
//! replaced copy-on-write under `writer` (pods are added and removed at control
//! plane rate, not per request) and read lock-free under a pin.
//!
//! A removed pod's id is **dead**: entries that carry it are invisible at once
//! and the sweep frees them. The id is reused only when (1) every insert that
//! could still write it has finished (an epoch grace period after the removal),
//! (2) the sweep has freed all its blocks, and (3) a second grace period has let
//! go every reader that could still see an old copy of its entries. The loom
//! models in `loom_tests.rs` run `recycle` with an insert in flight and with
//! such a reader, and fail if either grace period is skipped.

use std::sync::Arc;

use crate::error::PodError;
use crate::precise::groups::HIDDEN_MARK;
use crate::receipts::PodReceipts;
use crate::reclaim::{free_uncounted, Epoch, Pin, Published, Unlinked};
use crate::sync::{
    AtomicBool, AtomicI64, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Mutex, Ordering,
};

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
    /// [`PRECISE`], [`GAPPY`], [`HIDDEN`] and [`HYBRID`]; zero for a pod
    /// fed only by gateways.
    flags: AtomicU8,
    /// Our blocks per engine block of an engine-fed pod (1 otherwise):
    /// the engine reuses whole blocks only, so matches round down to it.
    align: AtomicU32,
    /// What engines reused against what the index predicted.
    receipts: PodReceipts,
}

/// The pod's blocks come from its engine's events (`crate::precise`): its
/// gateway inserts are speculative and it has no capacity of its own.
const PRECISE: u8 = 1;
/// The pod may hold a node below one it does not hold (an engine removed a
/// block whose children it still caches): lookups check its path top-down.
const GAPPY: u8 = 2;
/// The pod holds one KV-cache group of a hybrid model's engine-fed pod
/// (`crate::precise::groups`): its entries count for that pod, never as a match of
/// their own. Its name is the pod's with [`HIDDEN_MARK`] and the group, a
/// name no caller may use; it is not listed.
const HIDDEN: u8 = 4;
/// The pod's engine has KV-cache groups with rules other than full
/// attention's: lookups find its match by `crate::precise::groups::hit`.
const HYBRID: u8 = 8;

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
    names: Published<NameMap>,
    /// Ids in name order and back, rebuilt copy-on-write when a pod is added,
    /// so lookups order pods by name without comparing strings.
    ranks: Published<Ranks>,
    writer: Mutex<Writer>,
    default_capacity: AtomicU64,
    /// Set once any pod is engine-fed, never cleared: until then lookups
    /// skip the engine-fed pods' pass over their answers.
    any_precise: AtomicBool,
}

/// Refuses an empty name or one longer than `max` bytes.
fn check_name(name: &str, max: usize) -> Result<(), PodError> {
    if name.is_empty() || name.len() > max {
        return Err(PodError::BadName {
            len: name.len(),
            max,
        });
    }
    Ok(())
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
                    flags: AtomicU8::new(0),
                    align: AtomicU32::new(1),
                    receipts: PodReceipts::new(),
                })
                .collect(),
            names: Published::new(Box::default()),
            ranks: Published::new(Box::default()),
            writer: Mutex::new(Writer {
                free: Vec::new(),
                next: 0,
                dead: Vec::new(),
            }),
            default_capacity: AtomicU64::new(default_capacity),
            any_precise: AtomicBool::new(false),
        }
    }

    fn map<'g>(&'g self, pin: &'g Pin) -> &'g NameMap {
        self.names.get(pin)
    }

    /// The live id of `name`, if any. Lock-free.
    pub(crate) fn id(&self, name: &str, pin: &Pin) -> Option<PodId> {
        self.map(pin).get(name).map(|&i| PodId(i))
    }

    /// The id of `name`, interning it if new. Names holding
    /// [`HIDDEN_MARK`] are refused: they are hidden pods'.
    pub(crate) fn intern(
        &self,
        name: &str,
        max_name_len: usize,
        epoch: &Epoch,
        pin: &Pin,
    ) -> Result<PodId, PodError> {
        if name.contains(HIDDEN_MARK) {
            return Err(PodError::Reserved);
        }
        self.intern_as(name, max_name_len, 0, epoch, pin)
    }

    /// The id of hidden pod `name` (see [`HIDDEN`]), interning it if new.
    pub(crate) fn intern_hidden(
        &self,
        name: &str,
        max_name_len: usize,
        epoch: &Epoch,
        pin: &Pin,
    ) -> Result<PodId, PodError> {
        debug_assert!(name.contains(HIDDEN_MARK));
        self.intern_as(name, max_name_len, HIDDEN, epoch, pin)
    }

    /// The id of `name`, interned with `flags` if new.
    fn intern_as(
        &self,
        name: &str,
        max_name_len: usize,
        flags: u8,
        epoch: &Epoch,
        pin: &Pin,
    ) -> Result<PodId, PodError> {
        if let Some(id) = self.id(name, pin) {
            return Ok(id);
        }
        check_name(name, max_name_len)?;
        let mut w = self.writer.lock();
        if let Some(id) = self.id(name, pin) {
            return Ok(id);
        }
        let id = self.claim(&mut w, name, flags, epoch, pin)?;
        // Ranked before named: whoever finds the id through the name map
        // (an insert of the same name on the lock-free path, a lookup's
        // candidates) can only then write or ask for it, and every rank table
        // loaded after that ranks it. A lookup may thus treat a pod missing
        // from its table as added concurrently (see `Tree::lookup`).
        self.rank(w.next, epoch, pin);
        self.publish(
            |m| {
                m.insert(name.into(), id);
            },
            epoch,
            pin,
        );
        Ok(PodId(id))
    }

    /// Interns every name of `names` not interned yet, in one step: one
    /// rank table and one copy of the name map for all of them, where
    /// [`Pods::intern`] makes one of each per name (a copy of every name
    /// interned so far, so registering thousands one at a time costs their
    /// square). Stops at the first name refused; the names before it are
    /// interned.
    pub(crate) fn intern_many<'a>(
        &self,
        names: impl IntoIterator<Item = &'a str>,
        max_name_len: usize,
        epoch: &Epoch,
        pin: &Pin,
    ) -> Result<(), PodError> {
        let mut w = self.writer.lock();
        let mut fresh: Vec<(&str, u32)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut refused = Ok(());
        for name in names {
            if self.id(name, pin).is_some() || !seen.insert(name) {
                continue;
            }
            if name.contains(HIDDEN_MARK) {
                refused = Err(PodError::Reserved);
                break;
            }
            let claimed = check_name(name, max_name_len)
                .and_then(|()| self.claim(&mut w, name, 0, epoch, pin));
            match claimed {
                Ok(id) => fresh.push((name, id)),
                Err(e) => {
                    refused = Err(e);
                    break;
                }
            }
        }
        if !fresh.is_empty() {
            // Ranked before named, as in `intern_as`.
            self.rank(w.next, epoch, pin);
            self.publish(
                |m| {
                    for (name, id) in fresh {
                        m.insert(name.into(), id);
                    }
                },
                epoch,
                pin,
            );
        }
        refused
    }

    /// Takes a free id for `name` and makes its slot live (ranked and named
    /// by the caller). Called under `writer`.
    fn claim(
        &self,
        w: &mut Writer,
        name: &str,
        flags: u8,
        epoch: &Epoch,
        pin: &Pin,
    ) -> Result<u32, PodError> {
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
        // Release: pairs with the Acquire load in `name`, so a reader that
        // sees the new pointer sees the text. The old pointer was stored
        // under `writer`, which we hold, so reading it needs no Acquire.
        let old = slot.name.swap(fresh, Ordering::Release);
        if !old.is_null() {
            // SAFETY: `old` came from `Box::into_raw` above (an earlier
            // intern of this id); the swap removed its one link, and only
            // this swap (under `writer`) saw it.
            let old = unsafe { Unlinked::new(old) };
            epoch.retire(pin, old, free_uncounted);
        }
        // Relaxed: pairs with nothing itself; ordered before the Release
        // store of LIVE below, which readers' Acquire loads pair with.
        slot.blocks.store(0, Ordering::Relaxed);
        // Relaxed (both): pairs with nothing itself; ordered before the
        // Release store of LIVE below; the default is a setting.
        slot.capacity.store(
            self.default_capacity.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
        // Relaxed: as for the capacity; lookups that find the id unranked
        // read `HIDDEN` after their Acquire load of LIVE (`is_live`).
        slot.flags.store(flags, Ordering::Relaxed);
        // Relaxed: as for the capacity.
        slot.align.store(1, Ordering::Relaxed);
        // Relaxed inside: as for the capacity.
        slot.receipts.reset();
        // Release: pairs with the Acquire load in `is_live`.
        slot.state.store(LIVE, Ordering::Release);
        Ok(id)
    }

    /// Rebuilds the rank table over ids `0..next`. Called under `writer`.
    fn rank(&self, next: u32, epoch: &Epoch, pin: &Pin) {
        let mut order: Vec<(&str, u32)> = (0..next)
            // Relaxed: pairs with nothing; we hold `writer`, under which every
            // state change happens.
            .filter(|&id| self.slots[id as usize].state.load(Ordering::Relaxed) == LIVE)
            // Hidden pods are never a match: ranked as not live.
            .filter(|&id| !self.is_hidden(id))
            .filter_map(|id| Some((self.name(PodId(id), pin)?, id)))
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
        self.ranks.replace(Box::new(ranks), epoch, pin);
    }

    /// The current rank table.
    #[inline]
    pub(crate) fn ranks<'g>(&'g self, pin: &'g Pin) -> &'g Ranks {
        self.ranks.get(pin)
    }

    /// Replaces the name map with an edited copy. Called under `writer`.
    fn publish(&self, edit: impl FnOnce(&mut NameMap), epoch: &Epoch, pin: &Pin) {
        let mut next = self.map(pin).clone();
        edit(&mut next);
        self.names.replace(Box::new(next), epoch, pin);
    }

    /// Marks `name` removed: its entries vanish from lookups at once.
    pub(crate) fn remove(&self, name: &str, epoch: &Epoch, pin: &Pin) -> bool {
        self.remove_many(&[name], epoch, pin)[0]
    }

    /// Marks each of `names` removed, as [`Pods::remove`] would one by one,
    /// with one copy of the name map and one rank table for all of them;
    /// whether each existed.
    pub(crate) fn remove_many(&self, names: &[&str], epoch: &Epoch, pin: &Pin) -> Vec<bool> {
        let mut w = self.writer.lock();
        let mut gone = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let found = names
            .iter()
            .map(|&name| {
                let Some(PodId(id)) = self.id(name, pin) else {
                    return false;
                };
                if !seen.insert(id) {
                    // Named twice: removed by its first mention.
                    return false;
                }
                // Release: pairs with the Acquire load in `is_live`; a
                // reader that sees DEAD stops counting this pod's entries.
                self.slots[id as usize].state.store(DEAD, Ordering::Release);
                gone.push((name, id));
                true
            })
            .collect();
        if gone.is_empty() {
            return found;
        }
        self.publish(
            |m| {
                for (name, _) in &gone {
                    m.remove(*name);
                }
            },
            epoch,
            pin,
        );
        // Lookups read liveness from the rank table: republish it before
        // returning, so a lookup that starts after this call skips the pods.
        self.rank(w.next, epoch, pin);
        w.dead.extend(gone.into_iter().map(|(_, id)| Dead {
            id,
            quiet: None,
            draining: false,
        }));
        found
    }

    /// Frees the ids of removed pods whose blocks are all gone (see module
    /// docs); returns how many. The sweep calls it once per pass, after the
    /// pass's purges.
    pub(crate) fn recycle(&self, epoch: &Epoch, pin: &Pin) -> usize {
        let mut w = self.writer.lock();
        let mut freed = Vec::new();
        w.dead.retain_mut(|d| {
            let Some(quiet) = &d.quiet else {
                // Grace period (1): every insert that may still write the id.
                d.quiet = Some(epoch.grace_flag(pin));
                return true;
            };
            // Acquire: pairs with the Release store of the flag (in
            // `Epoch::grace_flag`), made after every thread pinned when the
            // grace period began had unpinned: their stores are visible now.
            if !quiet.load(Ordering::Acquire) {
                return true;
            }
            if !d.draining {
                // Relaxed: pairs with nothing itself; the count is exact once
                // no insert can write this id, and the Acquire load of the
                // flag above ordered every earlier insert's count before it.
                if self.slots[d.id as usize].blocks.load(Ordering::Relaxed) != 0 {
                    return true;
                }
                // Grace period (2): every reader that may still hold an old
                // copy of the id's entries (in a node the sweep cannot purge:
                // sealed, or read before the purge).
                d.draining = true;
                d.quiet = Some(epoch.grace_flag(pin));
                return true;
            }
            freed.push(d.id);
            false
        });
        for &id in &freed {
            // Relaxed: pairs with nothing; nothing reads a FREE slot's state
            // for meaning until a new LIVE store (Release) republishes it.
            self.slots[id as usize].state.store(FREE, Ordering::Relaxed);
        }
        let n = freed.len();
        w.free.extend(freed);
        n
    }

    /// Whether entries with this id count.
    #[inline]
    pub(crate) fn is_live(&self, id: u32) -> bool {
        // Acquire: pairs with the Release stores of LIVE (`intern`) and DEAD
        // (`remove`).
        self.slots[id as usize].state.load(Ordering::Acquire) == LIVE
    }

    /// Whether entries with this id are a match of their own: live and not
    /// hidden.
    #[inline]
    pub(crate) fn is_match(&self, id: u32) -> bool {
        self.is_live(id) && !self.is_hidden(id)
    }

    /// Whether the id is a hidden pod's (see [`HIDDEN`]).
    #[inline]
    pub(crate) fn is_hidden(&self, id: u32) -> bool {
        // Relaxed: set before the id's Release store of LIVE, which every
        // reader of an id loads first (`is_live`, or the rank table).
        self.slots[id as usize].flags.load(Ordering::Relaxed) & HIDDEN != 0
    }

    /// The name of a live or dead id.
    pub(crate) fn name<'g>(&'g self, id: PodId, _pin: &'g Pin) -> Option<&'g str> {
        // Acquire: pairs with the Release half of the swap in `intern` that
        // published the name.
        let p = self.slots.get(id.0 as usize)?.name.load(Ordering::Acquire);
        // SAFETY: null or a published name; a replaced name is freed only
        // through `Epoch::retire`, after every pin taken before it was
        // replaced (we hold one for 'g); the current one only in `drop`.
        (!p.is_null()).then(|| unsafe { &*(*p).text })
    }

    pub(crate) fn add_blocks(&self, id: u32, n: i64) {
        // Relaxed: pairs with nothing; a statistic and the capacity trigger.
        // `recycle` reads it exactly after a grace period (see there).
        self.slots[id as usize]
            .blocks
            .fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn blocks(&self, id: u32) -> u64 {
        // Relaxed: pairs with nothing, as in `add_blocks`.
        self.slots[id as usize]
            .blocks
            .load(Ordering::Relaxed)
            .max(0) as u64
    }

    pub(crate) fn capacity(&self, id: u32) -> u64 {
        // Relaxed: pairs with nothing; a setting read by the sweep, no data
        // depends on it.
        self.slots[id as usize].capacity.load(Ordering::Relaxed)
    }

    pub(crate) fn set_capacity(&self, id: PodId, blocks: u64) {
        // Relaxed: pairs with nothing, as in `capacity`.
        self.slots[id.0 as usize]
            .capacity
            .store(blocks, Ordering::Relaxed);
    }

    /// Marks a pod as fed by engine events (or not).
    pub(crate) fn set_precise(&self, id: PodId, on: bool) {
        let flags = &self.slots[id.0 as usize].flags;
        // Relaxed: pairs with nothing; a setting read by inserts and the
        // engine applier, which take no decision about memory from it.
        if on {
            // SeqCst: set before the pod's first engine entry is written,
            // and ordered before the SeqCst fence of every later pin (see
            // `mark_gappy`), so a lookup that can see such an entry sees it.
            self.any_precise.store(true, Ordering::SeqCst);
            flags.fetch_or(PRECISE, Ordering::Relaxed);
        } else {
            flags.fetch_and(!PRECISE, Ordering::Relaxed);
        }
    }

    /// Sets the block multiple a pod's matches round down to.
    pub(crate) fn set_align(&self, id: PodId, blocks: u32) {
        // Relaxed: pairs with nothing; a setting, like the capacity.
        self.slots[id.0 as usize]
            .align
            .store(blocks.max(1), Ordering::Relaxed);
    }

    /// The receipts of the pod with id `id`.
    pub(crate) fn receipts(&self, id: u32) -> &PodReceipts {
        &self.slots[id as usize].receipts
    }

    /// The block multiple a pod's matches round down to (1: none).
    #[inline]
    pub(crate) fn align(&self, id: u32) -> u32 {
        // Relaxed: as in `set_align`.
        self.slots[id as usize].align.load(Ordering::Relaxed)
    }

    /// Whether any pod has ever been engine-fed.
    #[inline]
    pub(crate) fn any_precise(&self) -> bool {
        // Relaxed: the pin's SeqCst fence orders it (see `set_precise`).
        self.any_precise.load(Ordering::Relaxed)
    }

    /// Whether a pod is fed by engine events.
    #[inline]
    pub(crate) fn is_precise(&self, id: u32) -> bool {
        // Relaxed: as in `set_precise`.
        self.slots[id as usize].flags.load(Ordering::Relaxed) & PRECISE != 0
    }

    /// Whether `id` is a live gateway-fed pod (not engine-fed, not a hidden
    /// lane of one).
    pub(crate) fn is_gateway(&self, id: u32) -> bool {
        self.is_live(id) && !self.is_precise(id) && !self.is_hidden(id)
    }

    /// Records that a pod may hold nodes below one it does not (see [`GAPPY`]).
    pub(crate) fn mark_gappy(&self, id: u32) {
        // SeqCst: ordered before the SeqCst fence with which every later
        // pin begins (crossbeam-epoch's `pin`), so a lookup pinned after the
        // removal that made the gap returned reads the flag. One concurrent
        // with the removal may answer as if it had not happened yet, as the
        // crate docs allow.
        self.slots[id as usize]
            .flags
            .fetch_or(GAPPY, Ordering::SeqCst);
    }

    /// Whether a pod is hybrid and whether lookups must check its path
    /// for gaps, from one load of its flags (a lookup's pass over
    /// engine-fed pods asks both).
    #[inline]
    pub(crate) fn hybrid_gappy(&self, id: u32) -> (bool, bool) {
        // Relaxed: the pin's SeqCst fence orders them (see `mark_gappy`
        // and `set_hybrid`).
        let flags = self.slots[id as usize].flags.load(Ordering::Relaxed);
        (flags & HYBRID != 0, flags & GAPPY != 0)
    }

    /// Marks a pod hybrid (see [`HYBRID`]), or not.
    pub(crate) fn set_hybrid(&self, id: u32, on: bool) {
        let flags = &self.slots[id as usize].flags;
        // SeqCst: as in `mark_gappy`, so that a lookup pinned after the
        // call reads it.
        if on {
            flags.fetch_or(HYBRID, Ordering::SeqCst);
        } else {
            flags.fetch_and(!HYBRID, Ordering::SeqCst);
        }
    }

    /// Whether a pod's match is found by its groups' rules.
    #[inline]
    pub(crate) fn is_hybrid(&self, id: u32) -> bool {
        // Relaxed: the pin's SeqCst fence orders it (see `set_hybrid`).
        self.slots[id as usize].flags.load(Ordering::Relaxed) & HYBRID != 0
    }

    /// Whether a lookup's match of this pod needs the engine-fed pods'
    /// pass (gaps, whole engine blocks, groups): one load of the flags.
    #[inline]
    pub(crate) fn needs_pass(&self, id: u32) -> bool {
        let slot = &self.slots[id as usize];
        // Relaxed: as in `hybrid_gappy` and `align`.
        slot.flags.load(Ordering::Relaxed) & (GAPPY | HYBRID) != 0
            || slot.align.load(Ordering::Relaxed) > 1
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

    /// Every live pod's name and id (a snapshot writes them), hidden
    /// ones aside.
    pub(crate) fn live<'g>(&'g self, pin: &'g Pin) -> impl Iterator<Item = (&'g str, u32)> {
        self.map(pin)
            .iter()
            .filter(|(name, _)| !name.contains(HIDDEN_MARK))
            .map(|(name, &id)| (&**name, id))
    }

    /// The capacity new pods start with.
    pub(crate) fn default_capacity(&self) -> u64 {
        // Relaxed: pairs with nothing; a setting.
        self.default_capacity.load(Ordering::Relaxed)
    }

    pub(crate) fn live_count(&self, pin: &Pin) -> usize {
        self.live(pin).count()
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        // The maps free themselves (`Published`); free every slot's name.
        for s in self.slots.iter() {
            // Relaxed: pairs with nothing; `&mut self`, no other thread.
            let p = s.name.load(Ordering::Relaxed);
            if !p.is_null() {
                // SAFETY: the slot's current name, from `Box::into_raw`, never
                // retired; no one else can reach it (`&mut self`).
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
