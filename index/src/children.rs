//! A node's child table: an open-addressing hash table of child pointers, keyed
//! by each child's first block, read without locks and grown copy-on-write.
//!
//! - **Lookup** (readers): one `Acquire` load of the table pointer, then linear
//!   probing until a null slot. A slot holds the child pointer and a copy of its
//!   key, so probing past other keys never touches their nodes (a probe that
//!   dereferenced every neighbour cost two cache misses each). A key match is
//!   confirmed against the child itself, which also guards against a slot
//!   reused for another key between the two loads. Tombstones (a dangling,
//!   never-allocated address) are skipped. Nothing is stored; nothing retried.
//! - **Writes** (insert, replace, remove) hold the owning node's writer lock. A
//!   new child is fully built, its key stored, and then one `Release` store of
//!   the pointer publishes it; a replacement (an edge split) swaps the pointer
//!   the same way; removal stores a tombstone.
//! - **Growth**: when live children plus tombstones would pass 3/4 of the slots,
//!   the writer builds a table twice the live count (rounded up to a power of
//!   two), copies the live pointers, publishes it with one `Release` store and
//!   retires the old table through the caller's epoch. Growth is geometric, so a
//!   node with 100,000 children has copied about 200,000 pointers in all, never a
//!   whole table per insert. A reader still on the old table sees a consistent,
//!   possibly stale, set of children.
//!
//! Keys are block hashes chosen by clients, so slots are picked by a seeded
//! 64-bit mix: a client cannot aim every key at one probe chain without knowing
//! the seed, and structured keys (sequential trace ids) spread evenly.

use crate::sync::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Something stored in a child table: it knows its own key.
pub(crate) trait Keyed {
    /// The first block of the child's edge.
    fn key(&self) -> u64;
}

struct Slot<T> {
    key: AtomicU64,
    ptr: AtomicPtr<T>,
}

/// Source of table identities (see [`Children::shape`]); never reused, unlike
/// addresses, which the allocator may hand out again after a table is freed.
static TABLE_IDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);

struct Table<T> {
    /// This table's identity.
    id: usize,
    shift: u32,
    live: AtomicUsize,
    used: AtomicUsize,
    slots: Box<[Slot<T>]>,
}

impl<T> Table<T> {
    fn new(capacity: usize) -> Box<Self> {
        debug_assert!(capacity.is_power_of_two() && capacity >= 2);
        Box::new(Table {
            // Relaxed: a unique number is all we need.
            id: TABLE_IDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            shift: 64 - capacity.trailing_zeros(),
            live: AtomicUsize::new(0),
            used: AtomicUsize::new(0),
            slots: (0..capacity)
                .map(|_| Slot {
                    key: AtomicU64::new(0),
                    ptr: AtomicPtr::new(std::ptr::null_mut()),
                })
                .collect(),
        })
    }

    fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.slots.len() * std::mem::size_of::<Slot<T>>()
    }

    fn home(&self, key: u64, seed: u64) -> usize {
        // A full 64-bit mix (the murmur3 finaliser) of the seeded key; the top
        // bits index the table. A bare multiply clusters structured keys such
        // as the sequential ids of traces (measured: probe chains dominated
        // insert time).
        let mut h = key ^ seed;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        h ^= h >> 33;
        (h >> self.shift) as usize
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }
}

/// The tombstone marker: a dangling, aligned address that no allocation of `T`
/// can have, so it never equals a child pointer.
fn tombstone<T>() -> *mut T {
    std::ptr::NonNull::dangling().as_ptr()
}

/// A node's children. Freeing the children themselves is the tree's job; this
/// type frees only its table, in [`Children::free_table`].
pub(crate) struct Children<T> {
    table: AtomicPtr<Table<T>>,
}

/// An old table the caller must retire once no reader can hold it.
pub(crate) struct RetiredTable<T>(*mut Table<T>);

// SAFETY: a retired table is only dropped, by whichever thread reclaims it; its
// contents are atomics and raw pointers that it does not dereference.
unsafe impl<T> Send for RetiredTable<T> {}

impl<T> RetiredTable<T> {
    /// Frees the table; returns its size in bytes.
    ///
    /// # Safety
    /// No thread may still read the table: the caller waited for an epoch grace
    /// period after unpublishing it.
    pub(crate) unsafe fn free(self) -> usize {
        // The table came from `Box::into_raw` and was unpublished once.
        // SAFETY: the caller guarantees no reader remains.
        let table = unsafe { Box::from_raw(self.0) };
        table.bytes()
    }
}

impl<T: Keyed> Children<T> {
    /// No children; allocates nothing.
    pub(crate) fn new() -> Self {
        Children {
            table: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// Children that share `other`'s table (an edge split moves the table to the
    /// node's lower half); exactly one of the two may free it.
    pub(crate) fn share(other: &Self) -> Self {
        Children {
            // Relaxed: the caller holds the writer lock of `other`'s node, and the
            // new node is published later with a Release store.
            table: AtomicPtr::new(other.table.load(Ordering::Relaxed)),
        }
    }

    /// The child whose key is `key`, or null.
    ///
    /// # Safety
    /// Every child pointer ever stored in this table must still be valid: the
    /// caller is pinned in the epoch through which children are retired.
    #[inline]
    pub(crate) unsafe fn get(&self, key: u64, seed: u64) -> *mut T {
        // Acquire: pairs with the Release store that published the table.
        let table = self.table.load(Ordering::Acquire);
        if table.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: tables are retired through the caller's epoch (see above).
        let table = unsafe { &*table };
        let mask = table.mask();
        let mut i = table.home(key, seed);
        loop {
            let slot = &table.slots[i];
            // Acquire: pairs with the Release store that published the child, so
            // the child and the slot's key are initialised before we read them.
            let p = slot.ptr.load(Ordering::Acquire);
            if p.is_null() {
                return p;
            }
            // Relaxed: ordered by the Acquire above; a newer key (slot reused)
            // is caught by the check against the child itself.
            if p != tombstone()
                && slot.key.load(Ordering::Relaxed) == key
                // SAFETY: non-null, non-tombstone slots hold live children.
                && unsafe { (*p).key() } == key
            {
                return p;
            }
            i = (i + 1) & mask;
        }
    }

    /// Number of live children (exact for a holder of the writer lock).
    pub(crate) fn len(&self) -> usize {
        // Acquire: pairs with the Release store that published the table.
        let table = self.table.load(Ordering::Acquire);
        if table.is_null() {
            return 0;
        }
        // SAFETY: the table is live while its node is reachable by the caller.
        unsafe { (*table).live.load(Ordering::Relaxed) }
    }

    /// Number of slots in the current table, and an identity for it: the sweep
    /// uses both to resume an iteration and to notice that the table changed.
    pub(crate) fn shape(&self) -> (usize, usize) {
        // Acquire: as in `len`.
        let table = self.table.load(Ordering::Acquire);
        if table.is_null() {
            return (0, 0);
        }
        // SAFETY: as in `len`.
        let table = unsafe { &*table };
        (table.slots.len(), table.id)
    }

    /// The child in slot `i` of the current table, or null (empty or tombstone).
    ///
    /// # Safety
    /// As for [`Children::get`].
    pub(crate) unsafe fn slot(&self, i: usize) -> *mut T {
        // Acquire: as in `get`.
        let table = self.table.load(Ordering::Acquire);
        if table.is_null() {
            return std::ptr::null_mut();
        }
        // SAFETY: as in `get`.
        let table = unsafe { &*table };
        match table.slots.get(i) {
            // Acquire: as in `get`.
            Some(s) => {
                let p = s.ptr.load(Ordering::Acquire);
                if p == tombstone() {
                    std::ptr::null_mut()
                } else {
                    p
                }
            }
            None => std::ptr::null_mut(),
        }
    }

    /// Appends every child of the current table to `out`, all read from that
    /// one table: a table replaced meanwhile (it grew, or was rebuilt) stays
    /// valid under the caller's guard, so a walk sees each child that table
    /// held once, never a mix of two tables' slots.
    ///
    /// # Safety
    /// As for [`Children::get`].
    pub(crate) unsafe fn collect(&self, out: &mut Vec<*mut T>) {
        // Acquire: as in `get`.
        let table = self.table.load(Ordering::Acquire);
        if table.is_null() {
            return;
        }
        // SAFETY: as in `get`.
        let table = unsafe { &*table };
        for slot in table.slots.iter() {
            // Acquire: as in `get`.
            let p = slot.ptr.load(Ordering::Acquire);
            if !p.is_null() && p != tombstone() {
                out.push(p);
            }
        }
    }

    /// Adds `child`, whose key is not in the table. Returns the bytes of a new
    /// table if it allocated one, and the old table to retire in that case.
    ///
    /// # Safety
    /// The caller holds the owning node's writer lock, `child` is a valid, fully
    /// initialised pointer, and the children already stored are valid.
    pub(crate) unsafe fn insert(
        &self,
        child: *mut T,
        seed: u64,
    ) -> (isize, Option<RetiredTable<T>>) {
        // SAFETY: the caller passes a valid child.
        let key = unsafe { (*child).key() };
        // Relaxed: only lock holders store the table pointer.
        let old = self.table.load(Ordering::Relaxed);
        if !old.is_null() {
            // SAFETY: lock holders see the current, live table.
            let table = unsafe { &*old };
            let used = table.used.load(Ordering::Relaxed);
            if (used + 1) * 4 <= table.slots.len() * 3 {
                let mut i = table.home(key, seed);
                loop {
                    let slot = &table.slots[i];
                    // Relaxed: slots are only stored under the lock we hold.
                    let p = slot.ptr.load(Ordering::Relaxed);
                    if p.is_null() || p == tombstone() {
                        if p.is_null() {
                            table.used.fetch_add(1, Ordering::Relaxed);
                        }
                        table.live.fetch_add(1, Ordering::Relaxed);
                        // Relaxed: published by the Release store below.
                        slot.key.store(key, Ordering::Relaxed);
                        // Release: publishes the initialised child to readers.
                        slot.ptr.store(child, Ordering::Release);
                        return (0, None);
                    }
                    i = (i + 1) & table.mask();
                }
            }
        }
        // Grow (or rebuild away tombstones) into a fresh table.
        let live = if old.is_null() {
            0
        } else {
            // SAFETY: `old` is the live table (we hold the lock).
            unsafe { (*old).live.load(Ordering::Relaxed) }
        };
        let capacity = ((live + 1) * 2).next_power_of_two().max(2);
        let fresh = Table::new(capacity);
        let bytes = fresh.bytes() as isize;
        if !old.is_null() {
            // SAFETY: as above.
            for s in unsafe { (*old).slots.iter() } {
                // Relaxed: slots are only stored under the lock we hold.
                let p = s.ptr.load(Ordering::Relaxed);
                if !p.is_null() && p != tombstone() {
                    // SAFETY: live slots hold valid children (caller's contract).
                    unsafe { place(&fresh, p, s.key.load(Ordering::Relaxed), seed) };
                }
            }
        }
        // SAFETY: the caller passes a valid child.
        unsafe { place(&fresh, child, key, seed) };
        // Release: readers' Acquire load of the table sees its filled slots.
        self.table.store(Box::into_raw(fresh), Ordering::Release);
        // The old table's bytes are returned when it is freed (`RetiredTable`).
        (bytes, (!old.is_null()).then_some(RetiredTable(old)))
    }

    /// Puts `new` in the slot of `old`; both have the same key.
    ///
    /// # Safety
    /// As for [`Children::insert`]; `old` is in the table.
    pub(crate) unsafe fn replace(&self, old: *mut T, new: *mut T, seed: u64) -> bool {
        // SAFETY: forwarded contract.
        match unsafe { self.find_slot(old, seed) } {
            Some(s) => {
                // Release: publishes the initialised replacement to readers.
                s.ptr.store(new, Ordering::Release);
                true
            }
            None => false,
        }
    }

    /// Removes `child` (leaves a tombstone).
    ///
    /// # Safety
    /// As for [`Children::insert`]; `child` is in the table.
    pub(crate) unsafe fn remove(&self, child: *mut T, seed: u64) -> bool {
        // SAFETY: forwarded contract.
        match unsafe { self.find_slot(child, seed) } {
            Some(s) => {
                // Release: a reader that sees the tombstone skips the slot.
                s.ptr.store(tombstone(), Ordering::Release);
                // Relaxed: the table pointer and counts only change under the lock.
                let table = self.table.load(Ordering::Relaxed);
                // SAFETY: `find_slot` found a slot, so the table is live.
                unsafe { (*table).live.fetch_sub(1, Ordering::Relaxed) };
                true
            }
            None => false,
        }
    }

    /// # Safety
    /// As for [`Children::insert`].
    unsafe fn find_slot(&self, child: *mut T, seed: u64) -> Option<&Slot<T>> {
        // Relaxed: only lock holders store the table pointer, and we hold it.
        let table = self.table.load(Ordering::Relaxed);
        if table.is_null() {
            return None;
        }
        // SAFETY: lock holders see the live table; `child` is valid.
        let (table, key) = unsafe { (&*table, (*child).key()) };
        let mut i = table.home(key, seed);
        loop {
            let s = &table.slots[i];
            // Relaxed: slots are only stored under the lock we hold.
            let p = s.ptr.load(Ordering::Relaxed);
            if p.is_null() {
                return None;
            }
            if p == child {
                return Some(s);
            }
            i = (i + 1) & table.mask();
        }
    }

    /// All live children (for freeing a whole tree).
    ///
    /// # Safety
    /// The caller has exclusive access to the tree.
    pub(crate) unsafe fn drain(&self) -> Vec<*mut T> {
        // Relaxed: exclusive access.
        let table = self.table.load(Ordering::Relaxed);
        if table.is_null() {
            return Vec::new();
        }
        // SAFETY: exclusive access to a live table.
        unsafe { &*table }
            .slots
            .iter()
            .map(|s| s.ptr.load(Ordering::Relaxed))
            .filter(|p| !p.is_null() && *p != tombstone())
            .collect()
    }

    /// Frees the current table (not the children); returns the bytes freed.
    ///
    /// # Safety
    /// No reader or writer can reach this table any more, and no other
    /// `Children` sharing it will free it.
    pub(crate) unsafe fn free_table(&self) -> usize {
        // Relaxed: exclusive access, per the contract.
        let table = self.table.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if table.is_null() {
            return 0;
        }
        // SAFETY: per the contract, ours to free.
        unsafe { RetiredTable(table).free() }
    }
}

/// Writes `child` into the first free slot of its probe chain in a table no
/// reader can see yet.
///
/// # Safety
/// `child` is valid and the table is not yet published.
unsafe fn place<T>(table: &Table<T>, child: *mut T, key: u64, seed: u64) {
    let mut i = table.home(key, seed);
    // Relaxed: the table is private until the Release store that publishes it.
    while !table.slots[i].ptr.load(Ordering::Relaxed).is_null() {
        i = (i + 1) & table.mask();
    }
    table.slots[i].key.store(key, Ordering::Relaxed);
    table.slots[i].ptr.store(child, Ordering::Relaxed);
    table.used.fetch_add(1, Ordering::Relaxed);
    table.live.fetch_add(1, Ordering::Relaxed);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    struct Leaf(u64);
    impl Keyed for Leaf {
        fn key(&self) -> u64 {
            self.0
        }
    }

    fn leak(k: u64) -> *mut Leaf {
        Box::into_raw(Box::new(Leaf(k)))
    }

    #[test]
    fn grows_to_a_hundred_thousand_children_and_finds_each() {
        let c = Children::<Leaf>::new();
        let mut leaves = Vec::new();
        let mut retired = 0;
        for k in 0..100_000u64 {
            let p = leak(k.wrapping_mul(0x1234_5678_9ABC_DEF1));
            // SAFETY: single-threaded test: we are the only writer; leaves live.
            let (_, old) = unsafe { c.insert(p, 42) };
            if let Some(old) = old {
                retired += 1;
                // SAFETY: no reader in this test.
                unsafe { old.free() };
            }
            leaves.push(p);
        }
        // Geometric growth: about log2(100,000) tables, not one per insert.
        assert!(retired < 20, "{retired} tables");
        assert_eq!(c.len(), 100_000);
        for &p in &leaves {
            // SAFETY: leaves are alive.
            let k = unsafe { (*p).0 };
            // SAFETY: every stored leaf is alive.
            assert_eq!(unsafe { c.get(k, 42) }, p);
        }
        // SAFETY: as above.
        assert!(unsafe { c.get(7, 42) }.is_null());
        // SAFETY: exclusive access; then free what we leaked.
        unsafe {
            assert_eq!(c.drain().len(), 100_000);
            c.free_table();
            for p in leaves {
                drop(Box::from_raw(p));
            }
        }
    }

    #[test]
    fn remove_leaves_tombstones_that_probes_skip_and_inserts_reuse() {
        let c = Children::<Leaf>::new();
        // Same seed and colliding keys would be ideal; many keys in a small table
        // give long chains instead.
        let leaves: Vec<_> = (0..6).map(leak).collect();
        for &p in &leaves {
            // SAFETY: single writer, live leaves; growth frees the old table.
            if let (_, Some(old)) = unsafe { c.insert(p, 0) } {
                // SAFETY: no reader in this test.
                unsafe { old.free() };
            }
        }
        // SAFETY: as above.
        unsafe {
            assert!(c.remove(leaves[2], 0));
            assert!(!c.remove(leaves[2], 0));
            assert!(c.get(2, 0).is_null());
            for k in [0, 1, 3, 4, 5] {
                assert_eq!(c.get(k, 0), leaves[k as usize]);
            }
            assert_eq!(c.len(), 5);
            let again = leak(2);
            if let (_, Some(old)) = c.insert(again, 0) {
                old.free();
            }
            assert_eq!(c.get(2, 0), again);
            let other = leak(3);
            assert!(c.replace(leaves[3], other, 0));
            assert_eq!(c.get(3, 0), other);
            c.free_table();
            for p in leaves.into_iter().chain([again, other]) {
                drop(Box::from_raw(p));
            }
        }
    }
}
