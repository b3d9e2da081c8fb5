//! The pods of one node and their last-used times: packed `(pod, time)` words.
//!
//! Each entry is one `AtomicU64`: the pod id plus one in the top [`POD_BITS`] bits
//! (zero means "free slot"), a *sealed* bit, and the last-used time in
//! milliseconds in the low [`TIME_BITS`] bits, so a reader sees a pod and its
//! time in one load. Two slots live inline in the node (most nodes hold one or
//! two pods); more go to chunks linked from `overflow`. A slot never moves while
//! its node is live: membership changes happen in place, so a lock-free refresh
//! can never be lost to a copy.
//!
//! Protocols (checked by the loom models in `loom_tests.rs`):
//! - **seal** (under the node's writer lock) sets the sealed bit of every word
//!   with `fetch_or` and keeps what it read: the snapshot the node's
//!   replacement is built from. After it, no word changes.
//! - **refresh** (lock-free, writers) CASes the pod's word to a newer time. The
//!   CAS and the seal's `fetch_or` are read-modify-writes of the same word, so
//!   one is ordered first: either the snapshot holds the refresh, or the
//!   refresher sees the sealed bit and redoes its insert on the replacement.
//!   (A refresh that finds the time already new enough read a word the seal
//!   had not reached, so the seal reads that time or a newer one.) This needs
//!   no `SeqCst` store-load ordering, only the per-word modification order.
//! - **add / remove** run under the writer lock, so at most one slot ever holds
//!   a given pod, and never race with a seal. `remove` is a CAS from the exact
//!   word it judged, so a refresh that lands in between wins and the entry stays.
//! - **read**: `Acquire` loads of the words and of the chunk links (pairing with
//!   the `Release` stores that published them); no stores, no retries.

use smallvec::SmallVec;

use crate::sync::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

/// Bits of a word that hold the time, in milliseconds: 2^43 ms is 278 years,
/// enough for Unix-epoch milliseconds until the year 2248.
pub(crate) const TIME_BITS: u32 = 43;
/// The sealed bit, just above the time.
const SEALED: u64 = 1 << TIME_BITS;
/// Where `pod id + 1` starts.
const POD_SHIFT: u32 = TIME_BITS + 1;
/// Bits that hold `pod id + 1`.
pub(crate) const POD_BITS: u32 = 64 - POD_SHIFT;
/// The largest time a word can hold; later times are clamped to it.
pub(crate) const MAX_TIME: u64 = (1 << TIME_BITS) - 1;
/// The largest pod id a word can hold (`id + 1` must fit in [`POD_BITS`]).
pub(crate) const MAX_POD_ID: u32 = (1 << POD_BITS) - 2;

const INLINE: usize = 2;
const CHUNK: usize = 6;

/// A `(pod, last-used ms)` pair as stored in a node.
pub(crate) type Entry = (u32, u64);
/// Entries copied out of a node, inline for the common small case.
pub(crate) type Entries = SmallVec<[Entry; 4]>;

fn pack(pod: u32, time: u64) -> u64 {
    debug_assert!(pod <= MAX_POD_ID);
    ((u64::from(pod) + 1) << POD_SHIFT) | time.min(MAX_TIME)
}

/// The entry in a word, ignoring its sealed bit.
fn unpack(word: u64) -> Option<Entry> {
    let pod = word >> POD_SHIFT;
    // The pod field of a non-zero word is at least 1, and at most 2^20 - 1: the
    // subtraction cannot underflow and the cast cannot truncate.
    (pod != 0).then(|| ((pod - 1) as u32, word & MAX_TIME))
}

struct Chunk {
    words: [AtomicU64; CHUNK],
    next: AtomicPtr<Chunk>,
}

/// Outcome of a lock-free [`PodSlots::refresh`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refresh {
    /// The pod's time is now at least the requested one.
    Done,
    /// The pod has no slot here: the caller must lock the node and `add` it.
    Missing,
    /// The node was sealed (replaced); the caller must redo its work from the root.
    Sealed,
}

/// The pod entries of one node.
pub(crate) struct PodSlots {
    inline: [AtomicU64; INLINE],
    overflow: AtomicPtr<Chunk>,
    sealed: AtomicBool,
}

impl PodSlots {
    /// Slots holding `entries`. Plain stores suffice: the node is published
    /// afterwards with a `Release` store that orders them.
    pub(crate) fn new(entries: &[Entry]) -> Self {
        let slots = PodSlots {
            inline: std::array::from_fn(|_| AtomicU64::new(0)),
            overflow: AtomicPtr::new(std::ptr::null_mut()),
            sealed: AtomicBool::new(false),
        };
        for &(pod, time) in entries {
            slots.add(pod, time);
        }
        slots
    }

    /// Calls `f` for every word slot, inline first, then along the chunks.
    #[inline]
    fn for_each_word(&self, mut f: impl FnMut(&AtomicU64) -> bool) {
        for w in &self.inline {
            if !f(w) {
                return;
            }
        }
        // Acquire: pairs with the Release store that linked the chunk in
        // `add`, so the chunk's initial words are visible.
        let mut chunk = self.overflow.load(Ordering::Acquire);
        while !chunk.is_null() {
            // Chunks are freed only in `Drop`, which needs `&mut self`.
            // SAFETY: while we hold `&self` every linked chunk is live.
            let c = unsafe { &*chunk };
            for w in &c.words {
                if !f(w) {
                    return;
                }
            }
            // Acquire: pairs with the Release link of the next chunk.
            chunk = c.next.load(Ordering::Acquire);
        }
    }

    /// Every entry, as a reader sees it: no stores, no retries.
    #[inline]
    pub(crate) fn for_each(&self, mut f: impl FnMut(u32, u64)) {
        for (pod, time) in self.entries() {
            f(pod, time);
        }
    }

    /// Every entry, as a reader sees it, as an iterator (the lookup's loop).
    #[inline]
    pub(crate) fn entries(&self) -> EntryIter<'_> {
        EntryIter {
            words: self.inline.iter(),
            // Acquire: pairs with the Release store that linked the chunk.
            next: self.overflow.load(Ordering::Acquire),
            _slots: std::marker::PhantomData,
        }
    }

    /// The last-used time of `pod` here, if it has a slot.
    pub(crate) fn find(&self, pod: u32) -> Option<u64> {
        let mut found = None;
        self.for_each_word(|w| {
            // Acquire: pairs with the Release stores of `add` and the refresh
            // CAS that wrote the word.
            match unpack(w.load(Ordering::Acquire)) {
                Some((p, t)) if p == pod => {
                    found = Some(t);
                    false
                }
                _ => true,
            }
        });
        found
    }

    /// Whether no pod has a slot here.
    pub(crate) fn is_empty(&self) -> bool {
        let mut empty = true;
        self.for_each_word(|w| {
            // Acquire: pairs with the Release stores of `add` and the refresh
            // CAS that wrote the word.
            empty = unpack(w.load(Ordering::Acquire)).is_none();
            empty
        });
        empty
    }

    /// Whether the node has been sealed (it is, or is about to be, replaced).
    /// Exact for holders of the node's lock; a hint for anyone else.
    pub(crate) fn is_sealed(&self) -> bool {
        // Acquire: pairs with the Release store in `seal`.
        self.sealed.load(Ordering::Acquire)
    }

    /// Lock-free: raises `pod`'s last-used time to at least `time`.
    pub(crate) fn refresh(&self, pod: u32, time: u64) -> Refresh {
        let want = time.min(MAX_TIME);
        let mut outcome = Refresh::Missing;
        self.for_each_word(|w| {
            // Acquire: pairs with the Release stores that published the word;
            // the CAS below revalidates it against the word's latest value.
            let mut cur = w.load(Ordering::Acquire);
            loop {
                match unpack(cur) {
                    Some((p, t)) if p == pod => {
                        if cur & SEALED != 0 {
                            outcome = Refresh::Sealed;
                        } else if t >= want {
                            outcome = Refresh::Done;
                        } else {
                            // AcqRel: ordered in the word's modification order
                            // against the seal's fetch_or and the sweep's CAS.
                            match w.compare_exchange_weak(
                                cur,
                                pack(pod, want),
                                Ordering::AcqRel,
                                Ordering::Acquire,
                            ) {
                                Ok(_) => outcome = Refresh::Done,
                                Err(now) => {
                                    cur = now;
                                    continue;
                                }
                            }
                        }
                        return false;
                    }
                    // Not this pod's slot (or it was just freed: then the pod has
                    // no slot any more, since a pod holds at most one).
                    _ => return true,
                }
            }
        });
        if outcome == Refresh::Missing && self.is_sealed() {
            return Refresh::Sealed;
        }
        outcome
    }

    /// Gives `pod` a slot with time `time`; returns the bytes newly allocated.
    /// The caller holds the node's writer lock, has checked the node is not
    /// sealed, and knows `pod` has no slot here.
    pub(crate) fn add(&self, pod: u32, time: u64) -> usize {
        let word = pack(pod, time);
        let mut placed = false;
        self.for_each_word(|w| {
            // Relaxed: pairs with nothing; only writers holding the lock store
            // a zero or claim a free slot, so this load cannot race with
            // another claim.
            if w.load(Ordering::Relaxed) == 0 {
                // Release: pairs with readers' Acquire loads of the word
                // (`entries`, `find`): publishes the entry.
                w.store(word, Ordering::Release);
                placed = true;
                return false;
            }
            true
        });
        if placed {
            return 0;
        }
        let chunk = Box::into_raw(Box::new(Chunk {
            words: std::array::from_fn(|i| AtomicU64::new(if i == 0 { word } else { 0 })),
            next: AtomicPtr::new(std::ptr::null_mut()),
        }));
        let mut link = &self.overflow;
        loop {
            // Relaxed: pairs with nothing; links are written only under the
            // lock we hold.
            let next = link.load(Ordering::Relaxed);
            if next.is_null() {
                break;
            }
            // SAFETY: linked chunks live as long as `self` (see `for_each_word`).
            link = unsafe { &(*next).next };
        }
        // Release: pairs with readers' Acquire loads of the link
        // (`for_each_word`, `entries`): they see the initialised chunk.
        link.store(chunk, Ordering::Release);
        std::mem::size_of::<Chunk>()
    }

    /// Frees `pod`'s slot if `judge(time)` says so, judging the value it frees.
    /// Returns the time it freed. The caller holds the node's writer lock.
    pub(crate) fn remove_if(&self, pod: u32, judge: impl Fn(u64) -> bool) -> Option<u64> {
        let mut removed = None;
        self.for_each_word(|w| {
            // Acquire: the CAS below races only with refresh CASes (seals need
            // the lock we hold); it fails if a refresh landed after this load.
            let mut cur = w.load(Ordering::Acquire);
            loop {
                match unpack(cur) {
                    Some((p, t)) if p == pod => {
                        if !judge(t) {
                            return false;
                        }
                        // AcqRel: pairs with the refresh CASes of the word
                        // (AcqRel), which it is ordered against in the word's
                        // modification order.
                        match w.compare_exchange(cur, 0, Ordering::AcqRel, Ordering::Acquire) {
                            Ok(_) => {
                                removed = Some(t);
                                return false;
                            }
                            Err(now) => cur = now,
                        }
                    }
                    _ => return true,
                }
            }
        });
        removed
    }

    /// Seals the node and returns its entries as of the seal. Every refresh not
    /// in the result sees the seal and is redone by its writer. The caller holds
    /// the node's writer lock.
    pub(crate) fn seal(&self) -> Entries {
        // Release: pairs with the Acquire load in `is_sealed` (lock holders
        // and early checks); the words carry the handshake with lock-free
        // refreshes.
        self.sealed.store(true, Ordering::Release);
        let mut out = Entries::new();
        self.for_each_word(|w| {
            // AcqRel: pairs with every refresh CAS of the word (AcqRel): the
            // read-modify-write that orders this seal against them; it reads
            // the word's latest time.
            if let Some(e) = unpack(w.fetch_or(SEALED, Ordering::AcqRel)) {
                out.push(e);
            }
            true
        });
        out
    }

    /// Heap bytes held by overflow chunks.
    pub(crate) fn heap_bytes(&self) -> usize {
        let mut bytes = 0;
        // Relaxed (here and below): pairs with nothing; called by the owner
        // when it is being freed, under its lock, or before it is published:
        // no link changes concurrently.
        let mut chunk = self.overflow.load(Ordering::Relaxed);
        while !chunk.is_null() {
            bytes += std::mem::size_of::<Chunk>();
            // SAFETY: chunks are freed only in `Drop`, which needs `&mut self`;
            // while we hold `&self` every linked chunk is live.
            chunk = unsafe { (*chunk).next.load(Ordering::Relaxed) };
        }
        bytes
    }
}

/// Iterator over a node's entries; see [`PodSlots::entries`].
pub(crate) struct EntryIter<'a> {
    words: std::slice::Iter<'a, AtomicU64>,
    next: *mut Chunk,
    _slots: std::marker::PhantomData<&'a PodSlots>,
}

impl Iterator for EntryIter<'_> {
    type Item = Entry;

    #[inline]
    fn next(&mut self) -> Option<Entry> {
        loop {
            for w in self.words.by_ref() {
                // Acquire: pairs with the Release stores of add and the refresh CAS.
                if let Some(e) = unpack(w.load(Ordering::Acquire)) {
                    return Some(e);
                }
            }
            if self.next.is_null() {
                return None;
            }
            // SAFETY: linked chunks live as long as the `PodSlots` we borrow.
            let chunk = unsafe { &*self.next };
            self.words = chunk.words.iter();
            // Acquire: pairs with the Release link of the next chunk.
            self.next = chunk.next.load(Ordering::Acquire);
        }
    }
}

impl Drop for PodSlots {
    fn drop(&mut self) {
        // Relaxed (here and below): pairs with nothing; `&mut self` means no
        // other thread can see these slots now.
        let mut chunk = self.overflow.load(Ordering::Relaxed);
        while !chunk.is_null() {
            // Every chunk was made by `Box::into_raw` in `add`, linked once.
            // SAFETY: `&mut self` means no reader can reach it.
            let c = unsafe { Box::from_raw(chunk) };
            chunk = c.next.load(Ordering::Relaxed);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn sorted(s: &PodSlots) -> Vec<Entry> {
        let mut v = Vec::new();
        s.for_each(|p, t| v.push((p, t)));
        v.sort_unstable();
        v
    }

    #[test]
    fn pack_round_trips_at_the_limits() {
        for (pod, time) in [(0, 0), (MAX_POD_ID, MAX_TIME), (7, 1_700_000_000_000)] {
            assert_eq!(unpack(pack(pod, time)), Some((pod, time)));
            assert_eq!(unpack(pack(pod, time) | SEALED), Some((pod, time)));
        }
        assert_eq!(unpack(SEALED), None);
        assert_eq!(unpack(0), None);
        assert_eq!(unpack(pack(3, u64::MAX)), Some((3, MAX_TIME)));
    }

    #[test]
    fn add_spills_into_chunks_and_remove_frees_slots() {
        let s = PodSlots::new(&[]);
        let mut bytes = 0;
        for pod in 0..20 {
            bytes += s.add(pod, u64::from(pod) * 10);
        }
        assert_eq!(bytes, s.heap_bytes());
        assert_eq!(bytes, 3 * std::mem::size_of::<Chunk>());
        assert_eq!(sorted(&s).len(), 20);
        assert_eq!(s.find(13), Some(130));
        assert_eq!(s.remove_if(13, |t| t < 100), None);
        assert_eq!(s.remove_if(13, |t| t == 130), Some(130));
        assert_eq!(s.find(13), None);
        // The freed slot is reused before a new chunk is allocated.
        assert_eq!(s.add(99, 1), 0);
        assert_eq!(s.find(99), Some(1));
        for pod in (0..20).filter(|p| *p != 13) {
            assert!(s.remove_if(pod, |_| true).is_some());
        }
        assert!(s.remove_if(99, |_| true).is_some());
        assert!(s.is_empty());
    }

    #[test]
    fn refresh_only_moves_time_forward() {
        let s = PodSlots::new(&[(1, 100), (2, 50)]);
        assert_eq!(s.refresh(1, 90), Refresh::Done);
        assert_eq!(s.find(1), Some(100));
        assert_eq!(s.refresh(2, 70), Refresh::Done);
        assert_eq!(s.find(2), Some(70));
        assert_eq!(s.refresh(3, 70), Refresh::Missing);
    }

    #[test]
    fn seal_snapshots_and_turns_refreshes_away() {
        let s = PodSlots::new(&[(1, 100), (2, 50)]);
        assert!(!s.is_sealed());
        let mut snap = s.seal().into_vec();
        snap.sort_unstable();
        assert_eq!(snap, vec![(1, 100), (2, 50)]);
        assert!(s.is_sealed());
        assert_eq!(s.refresh(1, 200), Refresh::Sealed);
        assert_eq!(s.refresh(1, 10), Refresh::Sealed);
        assert_eq!(s.refresh(9, 10), Refresh::Sealed);
    }
}
