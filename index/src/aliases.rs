//! A model's **aliases**: second names of engine blocks, each mapped to our
//! hash of the block, so that a key written in another indexer's hashes
//! finds the engine-fed pods that hold it.
//!
//! Routers written for other indexers send keys in those indexers' hashes:
//! NVIDIA Dynamo's local block hashes (xxh3-64 of each block's token ids
//! under a seed of its own), or the engine's own chained block hashes
//! (SGLang's router hashes prompts the way SGLang's engine does). Neither
//! can be turned into ours without the tokens, which such a key does not
//! carry; the engine's events do. So each engine block recorded with an
//! alias registers it here, mapped to our hash (one entry per block of
//! ours in it: the alias itself for the first, [`continued`] for the
//! others), and a key of aliases is translated entry by entry
//! ([`Aliases::get`]) into our key.
//!
//! An alias is a function of the block's content alone (its tokens and
//! identity, or the engine's hash of its chain), so every engine that holds
//! the block registers the same entry: entries count their **references**
//! (one per engine record), and the last one to go takes the entry away.
//!
//! The table is split in [`SHARDS`] shards by the alias's hash. Each shard
//! is an open-addressing table of inline slots, read without locks and
//! written under the shard's writer lock:
//! - **Lookup** (readers): one `Acquire` load of the table, then linear
//!   probing from the key's slot until an empty one. A slot's state is
//!   loaded with `Acquire`; a live slot's key and value were written before
//!   it was published and never change while it lives.
//! - **Insert**: the writer fills an empty slot's key and value, then
//!   publishes it with one `Release` store of its state. A dead slot
//!   (tombstone) is never filled again: a reader that loaded a slot live
//!   reads the key and value it was published with.
//! - **Removal** (the last reference gone) stores the tombstone state.
//! - **Growth**: when live and dead slots would pass 3/4 of the table, the
//!   writer copies the live ones into a table twice their count (a power of
//!   two, at least [`MIN_SLOTS`]), publishes it and retires the old one
//!   through the index's epoch. A reader still on the old table may
//!   translate an alias removed since: the key it makes then matches what
//!   the tree holds now, as any key does.
//!
//! References are only read and written under the writer lock (`Relaxed`).

use crate::reclaim::{Epoch, Pin, Published};
use crate::sync::{AtomicU32, AtomicU64, Mutex, Ordering};

/// Shards of one model's aliases: writers of different shards never wait
/// for each other.
pub(crate) const SHARDS: usize = 16;
/// The smallest table a shard grows to.
const MIN_SLOTS: usize = 64;

/// A slot never used: probing stops here.
const EMPTY: u32 = 0;
/// A slot holding an entry.
const LIVE: u32 = 1;
/// A slot whose entry was removed: probing goes past it.
const DEAD: u32 = 2;

/// The key of block `k` (from 0) of ours in an engine block named
/// `alias`: the alias itself for the first, a mix of both for the others.
pub(crate) fn continued(alias: u64, k: u32) -> u64 {
    if k == 0 {
        return alias;
    }
    xxhash_rust::xxh3::xxh3_64_with_seed(&alias.to_le_bytes(), u64::from(k))
}

/// One entry's place: 24 bytes.
struct Slot {
    key: AtomicU64,
    /// Our hash of the block.
    ours: AtomicU64,
    /// The slot's state ([`EMPTY`], [`LIVE`], [`DEAD`]) in the low
    /// [`STATE_BITS`] bits, and above them the width: for the first block
    /// of an engine block, how many of ours it has (the entries of the
    /// others follow with [`continued`] keys); 0 for those others.
    meta: AtomicU32,
    /// References (engine records); read and written by writers only.
    refs: AtomicU32,
}

/// Bits of [`Slot::meta`] that hold the state.
const STATE_BITS: u32 = 2;
const STATE_MASK: u32 = (1 << STATE_BITS) - 1;

fn meta(state: u32, width: u32) -> u32 {
    state | width << STATE_BITS
}

// The size the module's figures assume (loom's atomics are larger).
#[cfg(all(target_pointer_width = "64", not(loom)))]
const _: () = assert!(std::mem::size_of::<Slot>() == 24);

/// One generation of a shard's table.
struct Table {
    slots: Box<[Slot]>,
}

impl Table {
    fn with_slots(n: usize) -> Table {
        let slots = (0..n)
            .map(|_| Slot {
                key: AtomicU64::new(0),
                ours: AtomicU64::new(0),
                meta: AtomicU32::new(EMPTY),
                refs: AtomicU32::new(0),
            })
            .collect();
        Table { slots }
    }

    /// The slots to probe for a key hashed `h`, in order.
    fn probe(&self, h: u64) -> impl Iterator<Item = &Slot> {
        let n = self.slots.len();
        let start = if n == 0 { 0 } else { (h as usize) & (n - 1) };
        (0..n).map(move |i| &self.slots[(start + i) & (n - 1)])
    }
}

/// What a shard's writer counts.
#[derive(Default)]
struct Counts {
    live: usize,
    dead: usize,
}

struct Shard {
    table: Published<Table>,
    writer: Mutex<Counts>,
}

/// One model's aliases (see the module docs).
pub(crate) struct Aliases {
    shards: Box<[Shard]>,
    hasher: ahash::RandomState,
}

/// An alias translated: our hash of the first block of ours in the engine
/// block, and how many of ours the engine block has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found {
    pub(crate) ours: u64,
    pub(crate) width: u32,
}

impl Default for Aliases {
    fn default() -> Self {
        Aliases {
            shards: (0..SHARDS)
                .map(|_| Shard {
                    table: Published::new(Box::new(Table::with_slots(0))),
                    writer: Mutex::new(Counts::default()),
                })
                .collect(),
            hasher: ahash::RandomState::new(),
        }
    }
}

impl Aliases {
    fn place(&self, key: u64) -> (&Shard, u64) {
        let h = self.hasher.hash_one(key);
        // The top bits pick the shard, the low ones the slot.
        (&self.shards[(h >> 60) as usize % SHARDS], h)
    }

    /// The entry of `key`, if any (a reader's lookup; no lock).
    pub(crate) fn get(&self, key: u64, pin: &Pin) -> Option<Found> {
        let (shard, h) = self.place(key);
        let table = shard.table.get(pin);
        for slot in table.probe(h) {
            // Acquire: pairs with the Release store that published the
            // slot, so its key and value are the ones written before it.
            let m = slot.meta.load(Ordering::Acquire);
            match m & STATE_MASK {
                EMPTY => return None,
                // Relaxed: written before the Release that published the
                // slot, which the Acquire above read.
                LIVE if slot.key.load(Ordering::Relaxed) == key => {
                    return Some(Found {
                        ours: slot.ours.load(Ordering::Relaxed),
                        width: m >> STATE_BITS,
                    });
                }
                _ => {}
            }
        }
        None
    }

    /// Takes one reference more on `key` (an engine record of the block),
    /// entering it mapped to `ours` with `width` if it is new. An entry
    /// already there keeps its value (the same block's, unless two blocks'
    /// aliases collide).
    pub(crate) fn add(&self, key: u64, ours: u64, width: u32, epoch: &Epoch, pin: &Pin) {
        let (shard, h) = self.place(key);
        let mut counts = shard.writer.lock();
        let table = shard.table.get(pin);
        if let Some(slot) = live_slot(table, h, key) {
            // Relaxed: references are the writers', under the lock.
            let refs = slot.refs.load(Ordering::Relaxed);
            slot.refs.store(refs.saturating_add(1), Ordering::Relaxed);
            return;
        }
        let table = if (counts.live + counts.dead + 1) * 4 > table.slots.len() * 3 {
            let grown = grow(table, counts.live + 1, &self.hasher);
            counts.dead = 0;
            shard.table.replace(Box::new(grown), epoch, pin);
            shard.table.get(pin)
        } else {
            table
        };
        for slot in table.probe(h) {
            // Relaxed: only writers change states, under the lock we hold.
            if slot.meta.load(Ordering::Relaxed) & STATE_MASK == EMPTY {
                slot.key.store(key, Ordering::Relaxed);
                slot.ours.store(ours, Ordering::Relaxed);
                slot.refs.store(1, Ordering::Relaxed);
                // Release: publishes the fields above to the Acquire load
                // of readers (`get`).
                slot.meta.store(meta(LIVE, width), Ordering::Release);
                counts.live += 1;
                return;
            }
        }
    }

    /// Gives back one reference on `key`; the last one removes its entry.
    /// A key not entered is ignored.
    pub(crate) fn release(&self, key: u64, pin: &Pin) {
        let (shard, h) = self.place(key);
        let mut counts = shard.writer.lock();
        let table = shard.table.get(pin);
        let Some(slot) = live_slot(table, h, key) else {
            return;
        };
        // Relaxed: references are the writers', under the lock.
        let refs = slot.refs.load(Ordering::Relaxed);
        if refs > 1 {
            slot.refs.store(refs - 1, Ordering::Relaxed);
            return;
        }
        // Release: orders nothing a reader needs (the slot's key and value
        // do not change); a reader that still sees it live reads its old
        // entry.
        slot.meta.store(DEAD, Ordering::Release);
        counts.live -= 1;
        counts.dead += 1;
    }

    /// Entries held, over every shard.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.writer.lock().live).sum()
    }

    /// Bytes of the tables' slots, over every shard.
    pub(crate) fn bytes(&self, pin: &Pin) -> usize {
        let per = std::mem::size_of::<Slot>();
        self.shards
            .iter()
            .map(|s| s.table.get(pin).slots.len() * per)
            .sum()
    }
}

/// The live slot of `key` in `table`, if any (the writer's view).
fn live_slot(table: &Table, h: u64, key: u64) -> Option<&Slot> {
    for slot in table.probe(h) {
        // Relaxed: only writers change states and keys, under the lock the
        // caller holds.
        match slot.meta.load(Ordering::Relaxed) & STATE_MASK {
            EMPTY => return None,
            LIVE if slot.key.load(Ordering::Relaxed) == key => return Some(slot),
            _ => {}
        }
    }
    None
}

/// A table of twice `live` slots (at least [`MIN_SLOTS`]) holding the live
/// entries of `table`.
fn grow(table: &Table, live: usize, hasher: &ahash::RandomState) -> Table {
    let n = (live * 2).max(MIN_SLOTS).next_power_of_two();
    let next = Table::with_slots(n);
    for old in table.slots.iter() {
        // Relaxed: writers only, under the shard's lock.
        let m = old.meta.load(Ordering::Relaxed);
        if m & STATE_MASK != LIVE {
            continue;
        }
        let key = old.key.load(Ordering::Relaxed);
        for slot in next.probe(hasher.hash_one(key)) {
            if slot.meta.load(Ordering::Relaxed) & STATE_MASK == EMPTY {
                slot.key.store(key, Ordering::Relaxed);
                slot.ours
                    .store(old.ours.load(Ordering::Relaxed), Ordering::Relaxed);
                slot.refs
                    .store(old.refs.load(Ordering::Relaxed), Ordering::Relaxed);
                // Relaxed: the new table is published whole, by the
                // Release of `Published::replace`.
                slot.meta.store(m, Ordering::Relaxed);
                break;
            }
        }
    }
    next
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn entries_count_their_references_and_go_with_the_last() {
        let epoch = Epoch::default();
        let pin = epoch.pin();
        let a = Aliases::default();
        assert_eq!(a.get(7, &pin), None);
        a.add(7, 70, 1, &epoch, &pin);
        a.add(7, 71, 1, &epoch, &pin);
        // The first value stays; the second add is a reference.
        assert_eq!(a.get(7, &pin), Some(Found { ours: 70, width: 1 }));
        assert_eq!(a.len(), 1);
        a.release(7, &pin);
        assert_eq!(a.get(7, &pin), Some(Found { ours: 70, width: 1 }));
        a.release(7, &pin);
        assert_eq!(a.get(7, &pin), None);
        assert_eq!(a.len(), 0);
        // Releasing what is not there changes nothing.
        a.release(7, &pin);
        a.release(8, &pin);
        assert_eq!(a.len(), 0);
    }

    #[test]
    fn growth_and_removals_keep_every_live_entry_reachable() {
        let epoch = Epoch::default();
        let a = Aliases::default();
        let n = 20_000u64;
        for round in 0..3 {
            let pin = epoch.pin();
            for k in 0..n {
                a.add(k * 3 + round, k, 2, &epoch, &pin);
            }
            // Half of this round's go again: their slots die, and later
            // growth drops them.
            for k in (0..n).step_by(2) {
                a.release(k * 3 + round, &pin);
            }
            drop(pin);
            epoch.pin().flush();
            epoch.reclaim_ready();
        }
        let pin = epoch.pin();
        assert_eq!(a.len(), 3 * n as usize / 2);
        for round in 0..3 {
            for k in 0..n {
                let want = (k % 2 == 1).then_some(Found { ours: k, width: 2 });
                assert_eq!(a.get(k * 3 + round, &pin), want, "{round} {k}");
            }
        }
        // Tables stay within four times the live entries' slots.
        assert!(a.bytes(&pin) <= 8 * a.len() * std::mem::size_of::<Slot>());
    }

    #[test]
    fn continued_keys_differ_from_the_alias_and_from_each_other() {
        let keys: Vec<u64> = (0..8).map(|k| continued(42, k)).collect();
        assert_eq!(keys[0], 42);
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len());
    }

    /// Readers on other threads see each entry whole while a writer adds,
    /// grows and removes.
    #[test]
    fn readers_never_see_a_torn_entry() {
        let epoch = Epoch::default();
        let a = Aliases::default();
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    while !stop.load(Ordering::Relaxed) {
                        let pin = epoch.pin();
                        for k in 0..5_000u64 {
                            if let Some(f) = a.get(k, &pin) {
                                assert_eq!(
                                    f,
                                    Found {
                                        ours: k ^ 0xabc,
                                        width: (k % 4) as u32 + 1
                                    }
                                );
                            }
                        }
                    }
                });
            }
            for _ in 0..20 {
                let pin = epoch.pin();
                for k in 0..5_000u64 {
                    a.add(k, k ^ 0xabc, (k % 4) as u32 + 1, &epoch, &pin);
                }
                for k in 0..5_000u64 {
                    a.release(k, &pin);
                }
                drop(pin);
                epoch.pin().flush();
                epoch.reclaim_ready();
            }
            stop.store(true, Ordering::Relaxed);
        });
    }
}
