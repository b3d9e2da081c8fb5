//! Precise mode: a pod's blocks as its inference engine reports them.
//!
//! An engine (vLLM, SGLang) publishes "stored", "removed" and "cleared"
//! events for its KV-cache blocks. Its block hashes are chained (each
//! depends on its parent's), so they are opaque here: an [`Engine`] keeps,
//! per model, a record of every engine block it has heard of with its
//! parent's engine hash, our block hashes for its tokens and its **copy
//! count** (an engine can cache the same block twice and removes each copy
//! with its own event). Our key of a block is the chain of our hashes from
//! the root, found by following parents.
//!
//! What the tree holds for an engine-fed pod, after every batch of events
//! ([`EngineBatch`], which may hold a run of removals until it ends):
//! - a block is **held** while its copy count is above zero;
//! - the pod has an entry on the nodes of every held block's path, with the
//!   time [`PINNED`], which never expires;
//! - a removed block takes the pod off that block only: its match on that
//!   path ends before it, and blocks below it that the engine still caches
//!   count again when the block is stored again (the pod is then marked
//!   *gappy*, and lookups check its path top-down);
//! - "cleared" takes the pod off everything; the pod stays registered.
//!
//! A store whose parent is unknown (its chain cannot be placed) is counted
//! as an orphan and kept as a record, so that its copies and its children
//! stay consistent; it reaches the tree once its chain is known.
//!
//! Engine blocks map to ours by the ratio of their sizes ([`Ratio`]): an
//! engine block of `r` times our size is `r` of our blocks, held together;
//! its removal takes the pod off the last of them (the others may belong to
//! a sibling engine block too), and an engine-fed pod's matches round down
//! to whole engine blocks, since an engine reuses nothing less. `n` engine
//! pages of `1/n` our size make one of our blocks, held from the store of
//! its last page while all `n` are held.
//!
//! One [`Engine`] is written by one subscription at a time (a mutex, never
//! touched by lookups); the tree it writes is the shared lock-free one.
//!
//! The rooms of this module:
//! - `records`: an engine's records of one model, and their layout;
//! - `batch`: where events enter ([`EngineBatch`]); `store`, `remove` and
//!   `restore` apply them (or a snapshot's records) to the records, then to
//!   the tree, through `place` (an engine-fed pod's entries);
//! - `chain`: the chain cache and the run of removals; `pages`: engine
//!   pages smaller than our blocks; `alias`: blocks' names in other
//!   indexers' hashes;
//! - `spec`: block sizes and their ratio; `registry`: the engine-fed pods,
//!   with what lookups read of them beside the tree: `groups` (each hybrid
//!   pod's group table and the groups' hit rules) and `states` (each pod's
//!   view and lower tiers); `budget`: the records' count against
//!   `max_engine_blocks`;
//! - `lanes`: a hybrid model's KV-cache groups (`groups`), each holding its
//!   own copies of the shared records, placed in the tree one block at a
//!   time;
//! - `finish`: a lookup's pass over the engine-fed pods' matches that the
//!   tree leaves to this layer (`crate::tree::Finish`).

use indexmap::IndexMap;

use crate::error::EngineError;
use crate::precise::groups::GroupKind;
use crate::slots::MAX_TIME;

mod alias;
mod batch;
mod budget;
mod chain;
mod finish;
pub(crate) mod groups;
mod lanes;
mod pages;
mod place;
mod records;
mod registry;
mod remove;
mod restore;
mod spec;
pub(crate) mod states;
mod store;
#[cfg(all(test, not(loom)))]
mod tests;

pub use alias::Alias;
pub use batch::EngineBatch;
use chain::{Chain, Placed, Run};
pub(crate) use records::{Data, DataRef, Extra, Forgotten, Lane, Page, Parent, Records};
pub use registry::EngineHandle;
pub(crate) use registry::Registry;
pub use spec::{EngineSpec, Ratio};

/// The time of an entry an engine confirmed: it never expires (TTLs and
/// speculative TTLs measure age from an entry's time, and no clock reaches
/// it), and it outranks every gateway refresh (refreshes only raise times).
pub const PINNED: u64 = MAX_TIME;

/// One engine event, as the index applies it.
#[derive(Debug, Clone, Copy)]
pub enum EngineOp<'a> {
    /// New copies of blocks, each the child of the one before; the first
    /// is the child of `parent` (`None`: the first block of a sequence).
    Stored {
        /// The engine's hash of the block before the first.
        parent: Option<u64>,
        /// The engine's hashes of the stored blocks, in order.
        hashes: &'a [u64],
        /// Their token ids, `engine_block` per hash.
        tokens: &'a [u32],
        /// The identity seed of each of our blocks in the store (engine
        /// blocks of one or more of ours), or of each engine page (pages
        /// smaller than ours), in order, that [`EngineSpec::hash`] hashes
        /// its tokens with: what besides tokens tells the block (a cache
        /// salt, multimodal items). Empty when every block is plain (seed
        /// 0). A group of pages takes its first page's seed; a seed on any
        /// later page makes the group match no gateway key.
        seeds: &'a [u64],
        /// How the blocks are named in another indexer's hashes, if they
        /// are (`crate::aliases`).
        alias: Alias,
    },
    /// One copy less of each block.
    Removed {
        /// The engine's hashes of the removed blocks.
        hashes: &'a [u64],
    },
    /// The engine holds nothing any more.
    Cleared,
}

/// What applying events did, summed over calls by the caller.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Engine block copies stored.
    pub stored: u64,
    /// Engine block copies removed.
    pub removed: u64,
    /// Removals of blocks not held (unknown hashes, or no copy left).
    pub unknown: u64,
    /// Stores whose parent is unknown: kept, not placed in the tree.
    pub orphaned: u64,
    /// Stores past `max_key_blocks` (or in a parent cycle): not placed.
    pub too_deep: u64,
    /// (pod, block) pairs taken off the tree.
    pub released: u64,
    /// Clears applied.
    pub cleared: u64,
    /// Blocks stored in KV-cache groups the index does not model
    /// ([`GroupKind::Unmodelled`]): not
    /// recorded; the pod matches nothing while it has such a group.
    pub unmodelled: u64,
    /// Blocks of a store that skips blocks (a sliding window's, whose
    /// token ids cover blocks it did not keep) that no group of the pod
    /// recorded by the end of the batch: their place in the sequence is
    /// not known, so they are not held.
    pub unresolved: u64,
}

impl Applied {
    /// Adds another call's counts.
    pub fn add(&mut self, o: &Applied) {
        self.stored += o.stored;
        self.removed += o.removed;
        self.unknown += o.unknown;
        self.orphaned += o.orphaned;
        self.too_deep += o.too_deep;
        self.released += o.released;
        self.cleared += o.cleared;
        self.unmodelled += o.unmodelled;
        self.unresolved += o.unresolved;
    }
}

/// An engine block as a snapshot carries it, to be recorded again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The parent's engine hash.
    pub(crate) parent: Option<u64>,
    /// Copies the engine holds.
    pub(crate) copies: u32,
    /// Our side of the block.
    pub(crate) data: Data,
}

impl Record {
    pub(crate) fn new(parent: Option<u64>, copies: u32, data: Data) -> Record {
        Record {
            parent,
            copies,
            data,
        }
    }
}

/// One pod's engine state: its records per model.
pub struct Engine {
    pub(crate) spec: EngineSpec,
    pub(crate) ratio: Ratio,
    pub(crate) models: IndexMap<Box<str>, Records, ahash::RandomState>,
    /// The last event batch applied, as (sequence number, digest of its
    /// payload): kept in snapshots, so that a restarted server asks the
    /// engine only for what it missed, and can tell a restarted engine.
    last_batch: Option<(u64, u64)>,
    /// Set when the pod stops being engine-fed: a subscription still
    /// running then changes nothing.
    pub(crate) closed: bool,
    /// The last chain walked, while engine blocks are whole blocks of ours:
    /// engines evict a sequence tail first and extend the one they just
    /// stored, so the next event's chain is mostly this one, found without
    /// walking the records to the root again.
    chain: Option<Chain>,
    /// The path of engine pages (not cached), reused between events.
    scratch: Vec<u64>,
    /// Removals an [`EngineBatch`] has not taken off the tree yet; empty
    /// outside one.
    run: Run,
    /// The kind of each KV-cache group its stores named, by the group's
    /// index (`None`: not named yet). Empty while every store is of group
    /// 0 of full attention, which holds its blocks as described above.
    pub(crate) groups: Vec<Option<GroupKind>>,
    /// Blocks of stores that skip blocks, not recorded yet: (model, group,
    /// engine hash), tried again after each store of the batch.
    pending: Vec<(Box<str>, u32, u64)>,
}

impl Engine {
    pub(crate) fn new(spec: EngineSpec, max_ratio: u32) -> Result<Self, EngineError> {
        Ok(Engine {
            ratio: Ratio::new(spec.engine_block, spec.our_block, max_ratio)?,
            spec,
            models: IndexMap::default(),
            last_batch: None,
            closed: false,
            chain: None,
            scratch: Vec::new(),
            run: Run::default(),
            groups: Vec::new(),
            pending: Vec::new(),
        })
    }

    /// Engine blocks recorded, over every model.
    pub fn blocks(&self) -> usize {
        self.models.values().map(Records::len).sum()
    }

    /// Engine blocks held (with at least one copy), over every model.
    pub fn held(&self) -> usize {
        self.models
            .values()
            .map(|m| m.positions().filter(|&at| m.copies(at) > 0).count())
            .sum()
    }

    /// Our blocks per engine block: what matches round down to.
    pub(crate) fn align(&self) -> u32 {
        self.ratio.align()
    }

    /// The last event batch applied (sequence number, payload digest), as
    /// set by the caller.
    pub fn last_batch(&self) -> Option<(u64, u64)> {
        self.last_batch
    }

    /// Records the last event batch applied.
    pub fn set_last_batch(&mut self, batch: Option<(u64, u64)>) {
        self.last_batch = batch;
    }

    /// How its blocks map to ours.
    pub fn ratio(&self) -> Ratio {
        self.ratio
    }

    /// The spec this engine was registered with.
    pub fn spec(&self) -> EngineSpec {
        self.spec
    }

    /// The chain of our hashes from the root to the end of `hash`'s block
    /// (`None` if a parent is unknown, the chain passes `max_key_blocks`
    /// or loops). For pages, only whole groups count.
    fn path(
        records: &Records,
        ratio: Ratio,
        hash: u64,
        max_blocks: usize,
    ) -> Result<Vec<u64>, Placed> {
        let mut ours = Vec::new();
        Engine::walk(records, ratio, hash, max_blocks, &mut ours, None)?;
        Ok(ours)
    }

    /// As [`Engine::path`], into `ours` (reused: no allocation once it has
    /// grown), also filling `engine` with the engine hashes of the chain,
    /// root first. On error the buffers hold a partial chain.
    fn walk(
        records: &Records,
        ratio: Ratio,
        hash: u64,
        max_blocks: usize,
        ours: &mut Vec<u64>,
        mut engine: Option<&mut Vec<u64>>,
    ) -> Result<(), Placed> {
        // Filled leaf first, then turned around.
        ours.clear();
        // A chain longer than this (in records) passes `max_key_blocks`, or
        // loops; either way it cannot be placed.
        let per = match ratio {
            Ratio::Whole(_) => 1,
            Ratio::Pages(n) => n as usize,
        };
        let limit = max_blocks.saturating_add(1).saturating_mul(per);
        let mut steps = 0;
        if let Some(e) = engine.as_deref_mut() {
            e.clear();
        }
        let mut at = records.find(hash).ok_or(Placed::Orphan)?;
        loop {
            steps += 1;
            if steps > limit {
                return Err(Placed::TooDeep);
            }
            ours.extend(records.ours(at).iter().rev());
            // Checked as it grows, so a loop through records of many of
            // our blocks each (from a damaged snapshot) stops early.
            if ours.len() > max_blocks {
                return Err(Placed::TooDeep);
            }
            if let Some(e) = engine.as_deref_mut() {
                e.push(records.hash(at));
            }
            match records.parent(at) {
                Parent::Root => break,
                Parent::At(p) => at = p,
                Parent::Unknown(_) => return Err(Placed::Orphan),
            }
        }
        ours.reverse();
        if let Some(e) = engine {
            e.reverse();
        }
        Ok(())
    }

    /// Forgets the chain cache and any run of removals not yet released
    /// (the records are gone).
    pub(crate) fn clear_chain(&mut self) {
        self.chain = None;
        self.run.key.clear();
    }
}

/// The hash rule of an engine restored from a snapshot until its
/// subscription registers it again ([`crate::Index::engine`] replaces it).
/// Blocks stored meanwhile hash to 0 and match no gateway key.
pub(crate) fn unset_hash(_: &[u32], _: u64) -> u64 {
    0
}
