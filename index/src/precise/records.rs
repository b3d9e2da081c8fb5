//! One pod's engine block records under one model: a dense array of 24-byte
//! records linked to their parents by position, and a table of positions
//! keyed by engine hash.
//!
//! Records are most of precise mode's memory (one per block an engine-fed
//! pod caches), and every event walks them parent by parent. A map from
//! engine hash to record would keep the key beside each record in slots of
//! 40 bytes, up to half of them free (it doubles at 7/8 full), and a walk
//! would hash every parent's engine hash. Here the table's slots are 4-byte
//! positions (a probe compares the engine hash stored in the record the
//! position names), and a walk follows positions through the array.
//!
//! A record whose parent is not recorded (an **orphan**) keeps its parent's
//! engine hash on the side, and is adopted when that parent is recorded.
//!
//! A hybrid model's KV-cache groups (`crate::precise::groups`) share the records:
//! the same blocks under the same hashes. The first group's copies are
//! counted in the record; each other group's on the side, by position
//! (a **lane**), and a record a lane holds counts that as a reference among
//! its children, so that it stays while any group holds it.

use std::collections::HashMap;

use hashbrown::HashTable;
use smallvec::SmallVec;

use super::Ratio;

/// No position: the end of a parent chain or of the free list.
const NONE: u32 = u32::MAX;

/// `Slot::meta` flag: the block has a parent (recorded or not).
const HAS_PARENT: u32 = 1 << 31;
/// `Slot::meta` flag: `Slot::ours` is a position in `Records::extras`.
const EXTRA: u32 = 1 << 30;
/// `Slot::meta` flag: the slot holds no record (it is on the free list).
const VACANT: u32 = 1 << 29;
/// Where `Slot::meta`'s copy count starts.
const COPY_SHIFT: u32 = 17;
/// The most copies counted: a count that reaches it stays there, so the
/// block stays held until its pod is cleared (an engine makes a handful of
/// copies of a block, one per request computing it at once).
pub(crate) const MAX_COPIES: u32 = (1 << 12) - 1;
/// `Slot::meta` bits counting the copies the engine holds.
const COPIES: u32 = MAX_COPIES << COPY_SHIFT;
/// `Slot::meta` bits counting the records whose parent is this one; a
/// count that reaches its ceiling stays there (the record is then never
/// dropped, as it no longer knows when its last child goes).
const CHILDREN: u32 = (1 << COPY_SHIFT) - 1;

// The three fields of `Slot::meta` do not overlap.
const _: () = assert!((HAS_PARENT | EXTRA | VACANT) & (COPIES | CHILDREN) == 0);
const _: () = assert!(COPIES & CHILDREN == 0 && (COPIES | CHILDREN) == VACANT - 1);

/// One engine block as recorded.
#[derive(Debug)]
struct Slot {
    /// The engine's hash of the block.
    hash: u64,
    /// Our hash of the block (an engine block of our size, the common
    /// case), or with [`EXTRA`] the position of its [`Extra`].
    ours: u64,
    /// The parent's position: [`NONE`] for the first block of a sequence
    /// and for an orphan; in a vacant slot, the next vacant one.
    parent: u32,
    /// Flags, the copies the engine holds (stores minus removes, never
    /// below zero) and the count of records whose parent is this one.
    meta: u32,
}

// The size the module's doc states, and the memory figures assume.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Slot>() == 24);

/// Our side of an engine block that is not one of our blocks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Extra {
    /// Our hashes of its `r` blocks (`Ratio::Whole(r)`, `r > 1`).
    Many(Box<[u64]>),
    /// A page smaller than our block (`Ratio::Pages`).
    Page(Page),
}

/// A page smaller than our block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    /// Its depth in pages from the root.
    pub(crate) depth: u32,
    /// Its token ids.
    pub(crate) tokens: Box<[u32]>,
    /// On a group's last page, our hash of the group.
    pub(crate) group: Option<u64>,
    /// Its identity seed (0 for a plain page): see [`EngineOp::Stored`](super::EngineOp::Stored).
    pub(crate) seed: u64,
}

/// Our side of an engine block, owned (to record one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Data {
    /// Our hash of its one block (`Ratio::Whole(1)`).
    One(u64),
    /// Anything else.
    Extra(Extra),
}

impl Data {
    /// Our hashes of a whole engine block.
    pub(crate) fn whole(ours: Vec<u64>) -> Data {
        match ours[..] {
            [one] => Data::One(one),
            _ => Data::Extra(Extra::Many(ours.into())),
        }
    }

    /// Whether this is the data an engine of `ratio` records for a block
    /// of `engine_block` tokens (a snapshot's records are checked by it).
    pub(crate) fn fits(&self, ratio: Ratio, engine_block: usize) -> bool {
        match (ratio, self) {
            (Ratio::Whole(1), Data::One(_)) => true,
            (Ratio::Whole(r), Data::Extra(Extra::Many(hs))) => r > 1 && hs.len() == r as usize,
            (Ratio::Pages(_), Data::Extra(Extra::Page(p))) => p.tokens.len() == engine_block,
            _ => false,
        }
    }
}

/// Our side of a recorded engine block, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DataRef<'a> {
    /// Our hash of its one block.
    One(u64),
    /// Our hashes of its blocks.
    Many(&'a [u64]),
    /// A page.
    Page(&'a Page),
}

/// Where a record hangs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Parent {
    /// It starts a sequence.
    Root,
    /// Under the record at this position.
    At(u32),
    /// Under a block not recorded, by its engine hash.
    Unknown(u64),
}

/// One pod's records under one model.
#[derive(Debug, Default)]
pub(crate) struct Records {
    /// Positions of the records in `slots`, hashed by their engine hash.
    table: HashTable<u32>,
    slots: Vec<Slot>,
    /// The first vacant slot; each names the next in its `parent`
    /// ([`NONE`] after the last).
    free: Option<u32>,
    /// The data of records that are not one of our blocks.
    extras: slab::Slab<Extra>,
    /// Each orphan's parent engine hash, by the orphan's position.
    orphans: HashMap<u32, u64, ahash::RandomState>,
    /// Orphans by the parent engine hash they wait for.
    waiting: HashMap<u64, SmallVec<[u32; 2]>, ahash::RandomState>,
    /// The copies of groups after the first, lane `l` for group `l + 1`,
    /// by position: empty for a model of one group.
    lanes: Vec<HashMap<u32, u32, ahash::RandomState>>,
    /// Each record's alias (`crate::aliases`), by position: empty until a
    /// record has one, then as long as `slots`, 0 where a record has none.
    aliases: Vec<u64>,
    /// The alias seeds of the records of salted sequences, by position:
    /// their children inherit them (an engine names a request's salt on
    /// its first block only).
    alias_seeds: HashMap<u32, u64, ahash::RandomState>,
    hasher: ahash::RandomState,
}

/// A record dropped by [`Records::forget`], as its caller accounts for it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Forgotten {
    /// Its bytes, as [`Records::record_bytes`] counted them.
    pub(crate) bytes: usize,
    /// Its alias, with the count of our blocks in it, if it had one.
    pub(crate) alias: Option<(u64, u32)>,
}

/// Which group's copies: the first's ([`Lane::FIRST`], in the record) or
/// another's (on the side).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lane(pub(crate) u32);

impl Lane {
    /// The first group's copies.
    pub(crate) const FIRST: Lane = Lane(0);
}

impl Records {
    /// Records held.
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// The position of the record of engine hash `hash`.
    #[inline]
    pub(crate) fn find(&self, hash: u64) -> Option<u32> {
        let slots = &self.slots;
        self.table
            .find(self.hasher.hash_one(hash), |&at| {
                slots[at as usize].hash == hash
            })
            .copied()
    }

    #[inline]
    fn slot(&self, at: u32) -> &Slot {
        &self.slots[at as usize]
    }

    /// The engine hash of the record at `at`.
    pub(crate) fn hash(&self, at: u32) -> u64 {
        self.slot(at).hash
    }

    /// Copies of the block at `at` the engine holds.
    #[inline]
    pub(crate) fn copies(&self, at: u32) -> u32 {
        (self.slot(at).meta & COPIES) >> COPY_SHIFT
    }

    /// One copy more; returns whether the block became held.
    pub(crate) fn add_copy(&mut self, at: u32) -> bool {
        let copies = self.copies(at);
        if copies < MAX_COPIES {
            self.slots[at as usize].meta += 1 << COPY_SHIFT;
        }
        copies == 0
    }

    /// One copy more in `lane`; returns whether the block became held by
    /// its group.
    pub(crate) fn add_copy_in(&mut self, lane: Lane, at: u32) -> bool {
        let l = match lane.0 {
            0 => return self.add_copy(at),
            l => l as usize - 1,
        };
        if self.lanes.len() <= l {
            self.lanes.resize_with(l + 1, HashMap::default);
        }
        let copies = self.lanes[l].entry(at).or_insert(0);
        let first = *copies == 0;
        *copies = (*copies + 1).min(MAX_COPIES);
        if first {
            // The lane's reference keeps the record (see the module docs).
            self.add_child(at);
        }
        first
    }

    /// One copy less in `lane`, as [`Records::take_copy`]; the record
    /// loses the lane's reference with its last copy there (call
    /// [`Records::forget`] then).
    pub(crate) fn take_copy_in(&mut self, lane: Lane, at: u32) -> Option<u32> {
        let l = match lane.0 {
            0 => return self.take_copy(at),
            l => l as usize - 1,
        };
        let copies = self.lanes.get_mut(l)?.get_mut(&at)?;
        if *copies == MAX_COPIES {
            return Some(MAX_COPIES);
        }
        *copies -= 1;
        let left = *copies;
        if left == 0 {
            self.lanes[l].remove(&at);
            self.drop_child(at);
        }
        Some(left)
    }

    /// Each lane's held records, as (lane, position, copies).
    pub(crate) fn lane_copies(&self) -> impl Iterator<Item = (Lane, u32, u32)> + '_ {
        self.lanes.iter().enumerate().flat_map(|(l, m)| {
            m.iter()
                .map(move |(&at, &copies)| (Lane(l as u32 + 1), at, copies))
        })
    }

    /// One copy less, if any is left; returns the copies remaining, or
    /// `None` when there was none. A count at [`MAX_COPIES`] stays there.
    pub(crate) fn take_copy(&mut self, at: u32) -> Option<u32> {
        match self.copies(at) {
            0 => None,
            MAX_COPIES => Some(MAX_COPIES),
            n => {
                self.slots[at as usize].meta -= 1 << COPY_SHIFT;
                Some(n - 1)
            }
        }
    }

    /// Records whose parent is the one at `at`.
    pub(crate) fn children(&self, at: u32) -> u32 {
        self.slot(at).meta & CHILDREN
    }

    /// Where the record at `at` hangs.
    #[inline]
    pub(crate) fn parent(&self, at: u32) -> Parent {
        let s = self.slot(at);
        if s.meta & HAS_PARENT == 0 {
            Parent::Root
        } else if s.parent != NONE {
            Parent::At(s.parent)
        } else {
            // Every orphan has its parent's hash on the side (`insert`); a
            // missing one would be a bug here, and reads as a root.
            self.orphans
                .get(&at)
                .map_or(Parent::Root, |&h| Parent::Unknown(h))
        }
    }

    /// The parent's engine hash of the record at `at`.
    pub(crate) fn parent_hash(&self, at: u32) -> Option<u64> {
        match self.parent(at) {
            Parent::Root => None,
            Parent::At(p) => Some(self.hash(p)),
            Parent::Unknown(h) => Some(h),
        }
    }

    /// Our side of the block at `at`.
    #[inline]
    pub(crate) fn data(&self, at: u32) -> DataRef<'_> {
        let s = self.slot(at);
        if s.meta & EXTRA == 0 {
            return DataRef::One(s.ours);
        }
        match self.extras.get(s.ours as usize) {
            Some(Extra::Many(hs)) => DataRef::Many(hs),
            Some(Extra::Page(p)) => DataRef::Page(p),
            // Every EXTRA record's data is in `extras` (`insert`).
            None => DataRef::Many(&[]),
        }
    }

    /// Our hashes of the block at `at` (for pages: of the group it closes,
    /// if any).
    #[inline]
    pub(crate) fn ours(&self, at: u32) -> &[u64] {
        let s = self.slot(at);
        if s.meta & EXTRA == 0 {
            return std::slice::from_ref(&s.ours);
        }
        match self.extras.get(s.ours as usize) {
            Some(Extra::Many(hs)) => hs,
            Some(Extra::Page(p)) => p.group.as_slice(),
            None => &[],
        }
    }

    /// The alias of the record at `at`, if it has one.
    pub(crate) fn alias(&self, at: u32) -> Option<u64> {
        self.aliases.get(at as usize).copied().filter(|&a| a != 0)
    }

    /// Gives the record at `at` its alias (0: none).
    pub(crate) fn set_alias(&mut self, at: u32, alias: u64) {
        if self.aliases.len() < self.slots.len() {
            self.aliases.resize(self.slots.len(), 0);
        }
        self.aliases[at as usize] = alias;
    }

    /// The alias seed the record at `at` passes on to its children, if its
    /// sequence is salted.
    pub(crate) fn alias_seed(&self, at: u32) -> Option<u64> {
        self.alias_seeds.get(&at).copied()
    }

    /// Records that the record at `at` passes `seed` on to its children.
    pub(crate) fn set_alias_seed(&mut self, at: u32, seed: u64) {
        self.alias_seeds.insert(at, seed);
    }

    /// Every record with an alias: (position, alias, our blocks in it).
    pub(crate) fn aliased(&self) -> impl Iterator<Item = (u32, u64, u32)> + '_ {
        self.positions()
            .filter_map(|at| Some((at, self.alias(at)?, self.ours(at).len() as u32)))
    }

    /// Bytes the record at `at` costs, as counted in `Stats::engine_bytes`:
    /// its table slot (position and control byte), its array slot and its
    /// data on the side.
    pub(crate) fn record_bytes(&self, at: u32) -> usize {
        let extra = match self.data(at) {
            DataRef::One(_) => 0,
            DataRef::Many(hs) => std::mem::size_of::<Extra>() + hs.len() * 8,
            DataRef::Page(p) => std::mem::size_of::<Extra>() + p.tokens.len() * 4,
        };
        4 + 1 + std::mem::size_of::<Slot>() + extra
    }

    /// One past the highest position ever used: positions index arrays of
    /// this length.
    pub(crate) fn span(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of every record, as [`Records::record_bytes`] counts them.
    pub(crate) fn total_bytes(&self) -> usize {
        self.positions().map(|at| self.record_bytes(at)).sum()
    }

    /// Positions of every record.
    pub(crate) fn positions(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.meta & VACANT == 0)
            .map(|(at, _)| at as u32)
    }

    /// Records engine block `hash` (not recorded yet) under `parent`, and
    /// adopts the orphans waiting for it; returns its position, or `None`
    /// when every position is taken.
    pub(crate) fn insert(
        &mut self,
        hash: u64,
        parent: Option<u64>,
        copies: u32,
        data: Data,
    ) -> Option<u32> {
        let at = match self.free {
            None => {
                let at = u32::try_from(self.slots.len())
                    .ok()
                    .filter(|&at| at < NONE)?;
                self.slots.push(Slot {
                    hash: 0,
                    ours: 0,
                    parent: NONE,
                    meta: VACANT,
                });
                if !self.aliases.is_empty() {
                    self.aliases.push(0);
                }
                at
            }
            Some(at) => {
                let next = self.slot(at).parent;
                self.free = (next != NONE).then_some(next);
                at
            }
        };
        let (ours, mut meta) = match data {
            Data::One(h) => (h, 0),
            Data::Extra(e) => (self.extras.insert(e) as u64, EXTRA),
        };
        let mut up = NONE;
        if let Some(p) = parent {
            meta |= HAS_PARENT;
            match self.find(p) {
                Some(pp) => {
                    up = pp;
                    self.add_child(pp);
                }
                None => {
                    self.orphans.insert(at, p);
                    self.waiting.entry(p).or_default().push(at);
                }
            }
        }
        self.slots[at as usize] = Slot {
            hash,
            ours,
            parent: up,
            meta: meta | copies.min(MAX_COPIES) << COPY_SHIFT,
        };
        let (slots, hasher) = (&self.slots, &self.hasher);
        self.table.insert_unique(hasher.hash_one(hash), at, |&i| {
            hasher.hash_one(slots[i as usize].hash)
        });
        for child in self.waiting.remove(&hash).unwrap_or_default() {
            self.orphans.remove(&child);
            self.slots[child as usize].parent = at;
            self.add_child(at);
        }
        Some(at)
    }

    fn add_child(&mut self, at: u32) {
        let s = &mut self.slots[at as usize];
        if s.meta & CHILDREN < CHILDREN {
            s.meta += 1;
        }
    }

    fn drop_child(&mut self, at: u32) {
        let s = &mut self.slots[at as usize];
        // A count that reached its ceiling stays there: it no longer knows
        // how many children there are, so the record is never dropped
        // (which would leave children naming a freed position).
        let n = s.meta & CHILDREN;
        if n > 0 && n < CHILDREN {
            s.meta -= 1;
        }
    }

    /// Drops the record at `at` if it has neither copies nor children, and
    /// then any parent left in that state (so that chains below a held
    /// block stay whole); calls `dropped` with what each one held, and
    /// returns how many went.
    pub(crate) fn forget(&mut self, mut at: u32, mut dropped: impl FnMut(Forgotten)) -> usize {
        let mut n = 0;
        loop {
            let s = self.slot(at);
            if s.meta & VACANT != 0 || s.meta & (COPIES | CHILDREN) != 0 {
                return n;
            }
            let parent = self.parent(at);
            dropped(Forgotten {
                bytes: self.record_bytes(at),
                alias: self.alias(at).map(|a| (a, self.ours(at).len() as u32)),
            });
            self.vacate(at, parent);
            n += 1;
            match parent {
                Parent::At(p) => {
                    self.drop_child(p);
                    at = p;
                }
                Parent::Root | Parent::Unknown(_) => return n,
            }
        }
    }

    /// Takes the record at `at` out of the table and its orphan lists, and
    /// puts its slot on the free list.
    fn vacate(&mut self, at: u32, parent: Parent) {
        let hash = self.hash(at);
        if let Ok(e) = self
            .table
            .find_entry(self.hasher.hash_one(hash), |&i| i == at)
        {
            e.remove();
        }
        if let Parent::Unknown(p) = parent {
            self.orphans.remove(&at);
            if let Some(w) = self.waiting.get_mut(&p) {
                w.retain(|c| *c != at);
                if w.is_empty() {
                    self.waiting.remove(&p);
                }
            }
        }
        if self.slot(at).meta & EXTRA != 0 {
            let e = self.slot(at).ours as usize;
            if self.extras.contains(e) {
                self.extras.remove(e);
            }
        }
        if let Some(a) = self.aliases.get_mut(at as usize) {
            *a = 0;
        }
        if !self.alias_seeds.is_empty() {
            self.alias_seeds.remove(&at);
        }
        self.slots[at as usize] = Slot {
            hash: 0,
            ours: 0,
            parent: self.free.unwrap_or(NONE),
            meta: VACANT,
        };
        self.free = Some(at);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn chain(r: &Records, mut at: u32) -> Vec<u64> {
        let mut out = vec![r.hash(at)];
        while let Parent::At(p) = r.parent(at) {
            out.push(r.hash(p));
            at = p;
        }
        out
    }

    #[test]
    fn records_link_to_parents_and_orphans_are_adopted() {
        let mut r = Records::default();
        let c = r.insert(3, Some(2), 1, Data::One(30)).unwrap();
        assert_eq!(r.parent(c), Parent::Unknown(2));
        assert_eq!(r.parent_hash(c), Some(2));
        let a = r.insert(1, None, 1, Data::One(10)).unwrap();
        let b = r.insert(2, Some(1), 0, Data::One(20)).unwrap();
        assert_eq!(r.parent(c), Parent::At(b));
        assert_eq!(chain(&r, c), [3, 2, 1]);
        assert_eq!((r.children(a), r.children(b)), (1, 1));
        assert_eq!(r.find(2), Some(b));
        assert_eq!(r.ours(b), [20]);
        assert_eq!(r.len(), 3);
    }

    #[test]
    fn forgetting_drops_unheld_chains_up_to_a_held_block() {
        let mut r = Records::default();
        let a = r.insert(1, None, 1, Data::One(10)).unwrap();
        let b = r.insert(2, Some(1), 1, Data::One(20)).unwrap();
        let c = r.insert(3, Some(2), 1, Data::One(30)).unwrap();
        // B has no copy left but a child: it stays.
        assert_eq!(r.take_copy(b), Some(0));
        assert_eq!(r.forget(b, |_| {}), 0);
        assert_eq!(r.take_copy(c), Some(0));
        let mut bytes = 0;
        assert_eq!(r.forget(c, |f| bytes += f.bytes), 2);
        assert_eq!(bytes, 2 * r.record_bytes(a));
        assert_eq!((r.len(), r.find(2), r.find(3)), (1, None, None));
        assert_eq!(r.children(a), 0);
        assert_eq!(r.take_copy(a), Some(0));
        assert_eq!(r.take_copy(a), None);
        // Freed slots are reused.
        let d = r.insert(4, Some(1), 1, Data::One(40)).unwrap();
        assert!(d == b || d == c);
        assert_eq!(r.positions().count(), 2);
    }

    #[test]
    fn a_forgotten_orphan_stops_waiting_for_its_parent() {
        let mut r = Records::default();
        let o = r.insert(5, Some(9), 1, Data::One(50)).unwrap();
        r.take_copy(o);
        assert_eq!(r.forget(o, |_| {}), 1);
        let p = r.insert(9, None, 1, Data::One(90)).unwrap();
        assert_eq!(r.children(p), 0);
        assert!(r.orphans.is_empty() && r.waiting.is_empty());
    }

    #[test]
    fn extra_data_lives_on_the_side_and_goes_with_its_record() {
        let mut r = Records::default();
        let a = r.insert(1, None, 1, Data::whole(vec![10, 11, 12])).unwrap();
        assert_eq!(r.ours(a), [10, 11, 12]);
        assert_eq!(r.data(a), DataRef::Many(&[10, 11, 12]));
        let page = Page {
            depth: 0,
            tokens: vec![1, 2].into(),
            group: None,
            seed: 0,
        };
        let b = r
            .insert(2, Some(1), 1, Data::Extra(Extra::Page(page.clone())))
            .unwrap();
        assert_eq!(r.data(b), DataRef::Page(&page));
        assert!(r.ours(b).is_empty());
        r.take_copy(b);
        r.forget(b, |_| {});
        assert_eq!(r.extras.len(), 1);
        r.take_copy(a);
        r.forget(a, |_| {});
        assert!(r.extras.is_empty() && r.len() == 0);
    }

    #[test]
    fn copy_and_child_counts_stay_at_their_ceilings() {
        let mut r = Records::default();
        let a = r.insert(1, None, u32::MAX, Data::One(10)).unwrap();
        assert_eq!(r.copies(a), MAX_COPIES);
        assert!(!r.add_copy(a));
        assert_eq!(r.take_copy(a), Some(MAX_COPIES));
        let b = r.insert(2, None, MAX_COPIES - 1, Data::One(20)).unwrap();
        assert!(!r.add_copy(b));
        assert_eq!(r.take_copy(b), Some(MAX_COPIES));
        // Below the ceiling, copies count both ways and touch nothing else.
        let c = r.insert(3, None, 0, Data::One(30)).unwrap();
        assert!(r.add_copy(c));
        assert_eq!((r.copies(c), r.children(c)), (1, 0));
        for i in 0..CHILDREN {
            r.insert(100 + u64::from(i), Some(3), 0, Data::One(0))
                .unwrap();
        }
        assert_eq!((r.children(c), r.copies(c)), (CHILDREN, 1));
        assert_eq!(r.parent(c), Parent::Root);
        // A saturated child count no longer knows when its last child
        // goes: the record stays.
        let first = r.find(100).unwrap();
        r.forget(first, |_| {});
        assert_eq!(r.children(c), CHILDREN);
        assert_eq!(r.take_copy(c), Some(0));
        assert_eq!(r.forget(c, |_| {}), 0);
        assert_eq!(r.find(3), Some(c));
    }
}
