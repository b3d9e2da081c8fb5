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
//! - **Sharing**: an edge split gives the node's lower half the old node's
//!   table ([`Children::share`]). The old node is sealed and unlinked before
//!   the lower half is published, so from then on the table has one writer
//!   and one way in for new readers, and the lower half alone frees it.
//!
//! Readers get a [`Loaded`] view from the unsafe [`Children::load`], whose
//! contract is the reader's pin: tables and children are retired through the
//! owner's epoch, so the view and every child it hands out live for `'g`.
//! Writers' methods are unsafe for the writer lock they need; `node_ref`
//! wraps both behind pinned, lock-carrying types.
//!
//! Keys are block hashes chosen by clients, so slots are picked by a seeded
//! 64-bit mix: a client cannot aim every key at one probe chain without knowing
//! the seed, and structured keys (sequential trace ids) spread evenly.

use crate::reclaim::Unlinked;
use crate::sync::{unique_id, AtomicPtr, AtomicU64, AtomicUsize, Ordering};

/// Something stored in a child table: it knows its own key.
pub(crate) trait Keyed {
    /// The first block of the child's edge.
    fn key(&self) -> u64;
}

struct Slot<T> {
    key: AtomicU64,
    ptr: AtomicPtr<T>,
}

/// One generation of a child table. Retired whole when it grows.
pub(crate) struct Table<T> {
    /// This table's identity (see [`Loaded::id`]).
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
            id: unique_id(),
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

    /// Frees a table (not its children); returns its size in bytes. The
    /// `free` function given to `Epoch::retire` for an outgrown table.
    pub(crate) fn free(table: Box<Self>) -> usize {
        let bytes = table.bytes();
        drop(table);
        bytes
    }

    #[inline]
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

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }
}

/// The tombstone marker: a dangling, aligned address that no allocation of `T`
/// can have, so it never equals a child pointer.
#[inline]
fn tombstone<T>() -> *mut T {
    std::ptr::NonNull::dangling().as_ptr()
}

/// A node's children. Freeing the children themselves is the tree's job; this
/// type frees only its table, in [`Children::free_table`].
pub(crate) struct Children<T> {
    table: AtomicPtr<Table<T>>,
}

/// A child table as one reader loaded it (one `Acquire` load): valid, with
/// every child it ever held, for `'g` (see [`Children::load`]). Slots are read
/// live, so a child replaced or removed in this table after the load is seen
/// replaced or removed; a table that grew since stays as it was.
pub(crate) struct Loaded<'g, T> {
    table: Option<&'g Table<T>>,
}

impl<T> Clone for Loaded<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Loaded<'_, T> {}

impl<'g, T: Keyed> Loaded<'g, T> {
    /// The child whose key is `key`.
    #[inline]
    pub(crate) fn get(self, key: u64, seed: u64) -> Option<&'g T> {
        let table = self.table?;
        let mask = table.mask();
        let mut i = table.home(key, seed);
        loop {
            let slot = &table.slots[i];
            // Acquire: pairs with the Release store that published the child, so
            // the child and the slot's key are initialised before we read them.
            let p = slot.ptr.load(Ordering::Acquire);
            if p.is_null() {
                return None;
            }
            // Relaxed: pairs with nothing, ordered by the Acquire above; a newer
            // key (slot reused) is caught by the check against the child itself.
            if p != tombstone() && slot.key.load(Ordering::Relaxed) == key {
                // SAFETY: a non-null, non-tombstone slot holds a child stored
                // in this table, which stays allocated for 'g (`load`'s contract).
                let child = unsafe { &*p };
                if child.key() == key {
                    return Some(child);
                }
            }
            i = (i + 1) & mask;
        }
    }

    /// The child in slot `i`, if the slot holds one (not empty, no tombstone).
    #[inline]
    pub(crate) fn slot(self, i: usize) -> Option<&'g T> {
        let slot = self.table?.slots.get(i)?;
        // Acquire: pairs with the Release store that published the child.
        let p = slot.ptr.load(Ordering::Acquire);
        if p.is_null() || p == tombstone() {
            return None;
        }
        // SAFETY: a child stored in this table: allocated for 'g (`load`).
        Some(unsafe { &*p })
    }

    /// Number of slots: [`Loaded::slot`] takes `0..slots()`.
    pub(crate) fn slots(self) -> usize {
        self.table.map_or(0, |t| t.slots.len())
    }

    /// An identity of this table, never reused (0 for no table): the sweep
    /// keeps it across pins to notice that a node's table changed.
    pub(crate) fn id(self) -> usize {
        self.table.map_or(0, |t| t.id)
    }

    /// Number of live children (exact for a holder of the owner's writer lock).
    pub(crate) fn len(self) -> usize {
        // Relaxed: pairs with nothing; a count, written only under the lock.
        self.table.map_or(0, |t| t.live.load(Ordering::Relaxed))
    }
}

impl<T: Keyed> Children<T> {
    /// No children; allocates nothing.
    pub(crate) fn new() -> Self {
        Children {
            table: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// A table holding only `child` (for a node not yet published), and its
    /// size in bytes.
    pub(crate) fn with_child(child: Box<T>, seed: u64) -> (Self, isize) {
        let c = Children::new();
        // SAFETY: `c` is private to this call, so no reader or other writer
        // exists (the writer lock's purpose); the child is a fresh box.
        let (bytes, outgrown) = unsafe { c.insert(Box::into_raw(child), seed) };
        // An empty table has nothing to outgrow.
        debug_assert!(outgrown.is_none());
        (c, bytes)
    }

    /// Children that share `other`'s table (an edge split moves the table to
    /// the node's lower half); exactly one of the two may free it.
    ///
    /// # Safety
    /// `other`'s node is sealed and unlinked before the new one is published,
    /// and never writes to the table again: from then on only the new
    /// `Children` writes the table, and readers pinned later reach it only
    /// through the new one (what [`Children::insert`] relies on to retire it).
    pub(crate) unsafe fn share(other: &Self) -> Self {
        Children {
            // Relaxed: pairs with nothing; the caller holds the writer lock of
            // `other`'s node, and the new node is published later with a
            // Release store that orders this.
            table: AtomicPtr::new(other.table.load(Ordering::Relaxed)),
        }
    }

    /// The current table, for reading.
    ///
    /// # Safety
    /// For all of `'g`, the current table and every child ever stored in it
    /// stay allocated: the caller is pinned for `'g` in the epoch through
    /// which this table's owner retires tables and children, or has
    /// exclusive access.
    #[inline]
    pub(crate) unsafe fn load<'g>(&self) -> Loaded<'g, T> {
        // Acquire: pairs with the Release store that published the table
        // (`insert`), so its slots are initialised before we probe them.
        let table = self.table.load(Ordering::Acquire);
        Loaded {
            // SAFETY: a non-null table pointer is a live table, allocated for
            // 'g (the caller's contract).
            table: unsafe { table.as_ref() },
        }
    }

    /// Adds `child`, whose key is not in the table. Returns the bytes of a new
    /// table if it allocated one, and the outgrown table to retire.
    ///
    /// # Safety
    /// - The caller holds the writer lock of the node that owns this
    ///   `Children`, and that node still writes its table (it is not a node
    ///   whose table was shared away, see [`Children::share`]);
    /// - `child` came from `Box::into_raw`, is fully initialised, and from now
    ///   on is linked only by this table (which owns it until it is replaced
    ///   or removed);
    /// - every child already stored is valid.
    pub(crate) unsafe fn insert(
        &self,
        child: *mut T,
        seed: u64,
    ) -> (isize, Option<Unlinked<Table<T>>>) {
        // SAFETY: the caller passes a valid child.
        let key = unsafe { (*child).key() };
        // Relaxed: pairs with nothing; only lock holders store the table
        // pointer, and we hold the lock.
        let old = self.table.load(Ordering::Relaxed);
        // SAFETY: a lock holder's table is current, so not retired: live.
        if let Some(table) = unsafe { old.as_ref() } {
            // Relaxed: pairs with nothing; written only under the lock.
            let used = table.used.load(Ordering::Relaxed);
            if (used + 1) * 4 <= table.slots.len() * 3 {
                let mut i = table.home(key, seed);
                loop {
                    let slot = &table.slots[i];
                    // Relaxed: pairs with nothing; slots are only stored under
                    // the lock we hold.
                    let p = slot.ptr.load(Ordering::Relaxed);
                    if p.is_null() || p == tombstone() {
                        if p.is_null() {
                            // Relaxed: a count written only under the lock.
                            table.used.fetch_add(1, Ordering::Relaxed);
                        }
                        // Relaxed: a count written only under the lock.
                        table.live.fetch_add(1, Ordering::Relaxed);
                        // Relaxed: published by the Release store below, which
                        // readers' Acquire load of the pointer pairs with.
                        slot.key.store(key, Ordering::Relaxed);
                        // Release: pairs with readers' Acquire load of the slot
                        // (`Loaded::get`, `Loaded::slot`): publishes the child.
                        slot.ptr.store(child, Ordering::Release);
                        return (0, None);
                    }
                    i = (i + 1) & table.mask();
                }
            }
        }
        // Grow (or rebuild away tombstones) into a fresh table.
        // SAFETY: `old` is the current table, loaded under the lock we hold:
        // only lock holders retire a table, so it is live.
        let old_table = unsafe { old.as_ref() };
        // Relaxed: a count written only under the lock we hold.
        let live = old_table.map_or(0, |t| t.live.load(Ordering::Relaxed));
        let capacity = ((live + 1) * 2).next_power_of_two().max(2);
        let fresh = Table::new(capacity);
        let bytes = fresh.bytes() as isize;
        for s in old_table.iter().flat_map(|t| t.slots.iter()) {
            // Relaxed: pairs with nothing; slots are only stored under the
            // lock we hold.
            let p = s.ptr.load(Ordering::Relaxed);
            if !p.is_null() && p != tombstone() {
                // Relaxed: pairs with nothing; stored under the lock, like `ptr`.
                place(&fresh, p, s.key.load(Ordering::Relaxed), seed);
            }
        }
        place(&fresh, child, key, seed);
        // Release: pairs with readers' Acquire load in `load`: they see the
        // filled slots of the table they load.
        self.table.store(Box::into_raw(fresh), Ordering::Release);
        // SAFETY: `old` came from `Box::into_raw` (a growth like this one);
        // the store above removed the last link to it that readers pinned
        // from now on can follow (a node that shared it was unlinked before
        // ours was published: `share`'s contract); only this lock holder saw
        // it replaced. Its bytes are returned when it is freed (`Table::free`).
        let outgrown = (!old.is_null()).then(|| unsafe { Unlinked::new(old) });
        (bytes, outgrown)
    }

    /// Puts `new` in the slot of `old` (both have the same key) and returns
    /// `old`, now unlinked; `None` (and `new` not published) if `old` is not
    /// in the table.
    ///
    /// # Safety
    /// As for [`Children::insert`], with `new` in the place of `child`.
    pub(crate) unsafe fn replace(
        &self,
        old: *const T,
        new: *mut T,
        seed: u64,
    ) -> Option<Unlinked<T>> {
        // SAFETY: `find_slot` needs the lock and a valid `old`: our caller
        // holds the lock, and `old` is a child of this table, valid while it
        // is linked (this function's contract is `insert`'s).
        let slot = unsafe { self.find_slot(old, seed) }?;
        // Release: pairs with readers' Acquire load of the slot: publishes the
        // initialised replacement.
        slot.ptr.store(new, Ordering::Release);
        // SAFETY: `old` was stored by `insert` or `replace` (from
        // `Box::into_raw`), this slot was its one link, and only this lock
        // holder overwrote it.
        Some(unsafe { Unlinked::new(old.cast_mut()) })
    }

    /// Removes `child` (leaves a tombstone) and returns it, now unlinked.
    ///
    /// # Safety
    /// As for [`Children::insert`] (`child` need not be in the table).
    pub(crate) unsafe fn remove(&self, child: *const T, seed: u64) -> Option<Unlinked<T>> {
        // SAFETY: `find_slot` needs the lock, which our caller holds, and a
        // valid `child`, which our caller passes (`insert`'s contract).
        let slot = unsafe { self.find_slot(child, seed) }?;
        // Release: pairs with readers' Acquire load of the slot; one that sees
        // the tombstone skips the slot.
        slot.ptr.store(tombstone(), Ordering::Release);
        // Relaxed: pairs with nothing; the table pointer only changes under
        // the lock we hold.
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: `find_slot` found a slot in it, so it is the live table.
        let table = unsafe { &*table };
        // Relaxed: a count written only under the lock.
        table.live.fetch_sub(1, Ordering::Relaxed);
        // SAFETY: `child` was stored by `insert` or `replace` (from
        // `Box::into_raw`), this slot was its one link, and only this lock
        // holder overwrote it.
        Some(unsafe { Unlinked::new(child.cast_mut()) })
    }

    /// # Safety
    /// As for [`Children::insert`].
    unsafe fn find_slot(&self, child: *const T, seed: u64) -> Option<&Slot<T>> {
        // Relaxed: pairs with nothing; only lock holders store the table
        // pointer, and we hold the lock.
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: a lock holder's table is current, so live.
        let table = unsafe { table.as_ref() }?;
        // SAFETY: the caller passes a valid child.
        let key = unsafe { (*child).key() };
        let mut i = table.home(key, seed);
        loop {
            let s = &table.slots[i];
            // Relaxed: pairs with nothing; slots are only stored under the lock.
            let p = s.ptr.load(Ordering::Relaxed);
            if p.is_null() {
                return None;
            }
            if std::ptr::eq(p, child) {
                return Some(s);
            }
            i = (i + 1) & table.mask();
        }
    }

    /// All live children (for freeing a whole tree).
    ///
    /// # Safety
    /// The caller has exclusive access to the tree, and this table is this
    /// `Children`'s own (not shared away).
    pub(crate) unsafe fn drain(&self) -> Vec<*mut T> {
        // Relaxed: pairs with nothing; exclusive access.
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: exclusive access to a table that is ours, so live.
        let Some(table) = (unsafe { table.as_ref() }) else {
            return Vec::new();
        };
        table
            .slots
            .iter()
            // Relaxed: exclusive access.
            .map(|s| s.ptr.load(Ordering::Relaxed))
            .filter(|p| !p.is_null() && *p != tombstone())
            .collect()
    }

    /// Bytes of the current table (0 if none).
    ///
    /// # Safety
    /// As for [`Children::free_table`].
    pub(crate) unsafe fn table_bytes(&self) -> usize {
        // Relaxed: pairs with nothing; exclusive access, per the contract.
        let table = self.table.load(Ordering::Relaxed);
        // SAFETY: the table is ours and not freed yet (contract).
        unsafe { table.as_ref() }.map_or(0, Table::bytes)
    }

    /// Frees the current table (not the children); returns the bytes freed.
    ///
    /// # Safety
    /// No reader or writer can reach this table any more, and no other
    /// `Children` sharing it will free it.
    pub(crate) unsafe fn free_table(&self) -> usize {
        // Relaxed: pairs with nothing; exclusive access, per the contract.
        let table = self.table.swap(std::ptr::null_mut(), Ordering::Relaxed);
        if table.is_null() {
            return 0;
        }
        // SAFETY: from `Box::into_raw` in `insert`; ours to free (contract).
        Table::free(unsafe { Box::from_raw(table) })
    }
}

/// Writes `child` into the first free slot of its probe chain in a table no
/// reader can see yet.
fn place<T>(table: &Table<T>, child: *mut T, key: u64, seed: u64) {
    let mut i = table.home(key, seed);
    // Relaxed (here and below): pairs with nothing; the table is private until
    // the Release store that publishes it.
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

    /// The child `c` holds for `key`, as a pointer to compare with.
    fn find(c: &Children<Leaf>, key: u64, seed: u64) -> *const Leaf {
        // SAFETY: single-threaded tests: every leaf stays allocated until the
        // test frees it at its end, after its last lookup.
        let found = unsafe { c.load() }.get(key, seed);
        found.map_or(std::ptr::null(), std::ptr::from_ref)
    }

    fn retire_now(old: Option<Unlinked<Table<Leaf>>>) {
        if let Some(old) = old {
            // SAFETY: no reader in these single-threaded tests.
            Table::free(unsafe { old.into_box() });
        }
    }

    #[test]
    fn grows_to_a_hundred_thousand_children_and_finds_each() {
        let c = Children::<Leaf>::new();
        let mut leaves = Vec::new();
        let mut retired = 0;
        for k in 0..100_000u64 {
            let p = leak(k.wrapping_mul(0x1234_5678_9ABC_DEF1));
            // SAFETY: single-threaded: we are the only writer (as if locked);
            // `p` is a fresh box; the stored leaves are alive.
            let (_, old) = unsafe { c.insert(p, 42) };
            retired += usize::from(old.is_some());
            retire_now(old);
            leaves.push(p);
        }
        // Geometric growth: about log2(100,000) tables, not one per insert.
        assert!(retired < 20, "{retired} tables");
        // SAFETY: the leaves are alive (see `find`).
        assert_eq!(unsafe { c.load() }.len(), 100_000);
        for &p in &leaves {
            // SAFETY: the leaves are alive until the end of the test.
            let k = unsafe { (*p).0 };
            assert_eq!(find(&c, k, 42), p.cast_const());
        }
        assert!(find(&c, 7, 42).is_null());
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
            // SAFETY: single writer, fresh boxes, live leaves.
            retire_now(unsafe { c.insert(p, 0) }.1);
        }
        // SAFETY: single writer; every pointer passed is a live leaf.
        unsafe {
            assert!(c.remove(leaves[2], 0).is_some());
            assert!(c.remove(leaves[2], 0).is_none());
        }
        assert!(find(&c, 2, 0).is_null());
        for k in [0, 1, 3, 4, 5] {
            assert_eq!(find(&c, k, 0), leaves[k as usize].cast_const());
        }
        // SAFETY: the leaves are alive.
        assert_eq!(unsafe { c.load() }.len(), 5);
        let again = leak(2);
        // SAFETY: single writer; `again` is a fresh box; stored leaves live.
        retire_now(unsafe { c.insert(again, 0) }.1);
        assert_eq!(find(&c, 2, 0), again.cast_const());
        let other = leak(3);
        // SAFETY: single writer; `other` is a fresh box with key 3 and
        // `leaves[3]` a live leaf in the table.
        assert!(unsafe { c.replace(leaves[3], other, 0) }.is_some());
        assert_eq!(find(&c, 3, 0), other.cast_const());
        // SAFETY: exclusive access; every leaf is freed once, table last used.
        unsafe {
            c.free_table();
            for p in leaves.into_iter().chain([again, other]) {
                drop(Box::from_raw(p));
            }
        }
    }
}
