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
//! Its records are laid out in `engine/records.rs`.

use indexmap::IndexMap;
use smallvec::SmallVec;

use crate::error::EngineError;
use crate::index::Index;
use crate::slots::MAX_TIME;

mod records;

pub(crate) use records::{Data, DataRef, Extra, Page, Parent, Records};

/// The time of an entry an engine confirmed: it never expires (TTLs and
/// speculative TTLs measure age from an entry's time, and no clock reaches
/// it), and it outranks every gateway refresh (refreshes only raise times).
pub const PINNED: u64 = MAX_TIME;

/// The largest ratio of block sizes either way: an engine block of 1,024
/// of ours, or 1,024 engine pages to one of our blocks. Real ones are 64
/// or less (SGLang's one-token pages under 64-token blocks); the bound
/// keeps a chain's walk within `max_key_blocks` times it.
pub const MAX_RATIO: u32 = 1024;

/// How engine blocks map to ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ratio {
    /// An engine block is this many of ours (its size is a multiple of ours).
    Whole(u32),
    /// This many engine pages make one of our blocks.
    Pages(u32),
}

impl Ratio {
    /// Our blocks per engine block: an engine reuses whole blocks only, so
    /// an engine-fed pod's matches round down to a multiple of this.
    pub fn align(self) -> u32 {
        match self {
            Ratio::Whole(r) => r,
            Ratio::Pages(_) => 1,
        }
    }

    /// The mapping between an engine's block size and ours, in tokens;
    /// refused when neither divides the other, or the ratio passes
    /// [`MAX_RATIO`].
    pub fn new(engine_block: u32, our_block: u32) -> Result<Ratio, EngineError> {
        let bad = || EngineError::BlockSizes {
            engine: engine_block,
            ours: our_block,
        };
        if engine_block == 0 || our_block == 0 {
            return Err(bad());
        }
        let ratio = if engine_block % our_block == 0 {
            Ratio::Whole(engine_block / our_block)
        } else if our_block % engine_block == 0 {
            Ratio::Pages(our_block / engine_block)
        } else {
            return Err(bad());
        };
        match ratio {
            Ratio::Whole(r) | Ratio::Pages(r) if r > MAX_RATIO => Err(bad()),
            _ => Ok(ratio),
        }
    }
}

/// How an engine's blocks become ours.
#[derive(Debug, Clone, Copy)]
pub struct EngineSpec {
    /// Tokens in one engine block (vLLM: `--block-size`, 16 by default;
    /// SGLang: `--page-size`, 1 by default).
    pub engine_block: u32,
    /// Tokens in one of our blocks: the gateways' token block size.
    pub our_block: u32,
    /// Our hash of one block of `our_block` token ids: the gateways' rule.
    pub hash: fn(&[u32]) -> u64,
}

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
}

/// A run of removals not yet taken off the tree: the pod no longer holds
/// blocks `from..key.len()` of `key` under `model`.
///
/// An engine frees a sequence's blocks tail first, and reports each with
/// its own removal; the run grows while each removal is of the block just
/// above it, and goes to the tree in one [`Tree::release`] when the run
/// ends, where a release per block would split an edge and unlink a node
/// for every one.
///
/// [`Tree::release`]: crate::tree::Tree::release
#[derive(Debug, Default)]
struct Run {
    model: Box<str>,
    /// The path of the run's deepest block, or empty (no run).
    key: Vec<u64>,
    from: usize,
}

impl Run {
    /// Whether releasing the last block of `path` under `model` extends
    /// the run (the block is the one just above it).
    fn extended_by(&self, model: &str, path: &[u64]) -> bool {
        !path.is_empty()
            && path.len() == self.from
            && *self.model == *model
            && self.key.get(..path.len()) == Some(path)
    }
}

/// A chain of records from the root, as [`Engine::path`] walks it.
#[derive(Debug, Default)]
struct Chain {
    model: Box<str>,
    /// Engine hashes, root first.
    engine: Vec<u64>,
    /// Our hashes, root first (`r` per engine block).
    ours: Vec<u64>,
}

impl Engine {
    pub(crate) fn new(spec: EngineSpec) -> Result<Self, EngineError> {
        Ok(Engine {
            ratio: Ratio::new(spec.engine_block, spec.our_block)?,
            spec,
            models: IndexMap::default(),
            last_batch: None,
            closed: false,
            chain: None,
            scratch: Vec::new(),
            run: Run::default(),
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

/// The chain cache after the record of `hash` was dropped (`dropped` is how
/// many records went: past the tip, the chain names records that are no
/// more, and the cache goes).
fn chain_popped(chain: &mut Option<Chain>, ratio: Ratio, hash: u64, dropped: usize) {
    let r = ratio.align() as usize;
    match chain {
        Some(c) if dropped == 1 && c.engine.last() == Some(&hash) => {
            c.engine.pop();
            c.ours.truncate(c.ours.len().saturating_sub(r));
        }
        Some(_) if dropped > 0 => *chain = None,
        _ => {}
    }
}

/// Extends the chain cache by a store of the records at `at` (in the
/// event's order) under `parent`, if it ended at `parent`: it is then the
/// stored blocks' path, found without a walk. Whether it did.
fn extend_chain(
    chain: &mut Option<Chain>,
    records: &Records,
    ratio: Ratio,
    model: &str,
    parent: Option<u64>,
    at: &[u32],
    max_blocks: usize,
) -> bool {
    if !matches!(ratio, Ratio::Whole(_)) || parent.is_none() {
        return false;
    }
    let Some(c) = chain.as_mut().filter(|c| &*c.model == model) else {
        return false;
    };
    if c.engine.last() != parent.as_ref() {
        return false;
    }
    // Only records that hang where the store says (a record keeps the
    // parent it was first stored under): the first under `parent`, each
    // other under the one before it.
    let Some((&first, rest)) = at.split_first() else {
        return false;
    };
    let hangs = records.parent_hash(first) == parent
        && rest
            .iter()
            .zip(at)
            .all(|(&child, &up)| records.parent(child) == Parent::At(up));
    let ours: usize = at.iter().map(|&a| records.ours(a).len()).sum();
    // Too deep to place: a walk finds that and counts it.
    if !hangs || c.ours.len() + ours > max_blocks {
        return false;
    }
    for &a in at {
        c.ours.extend_from_slice(records.ours(a));
        c.engine.push(records.hash(a));
    }
    true
}

/// `hash`'s path under `model`, from `chain` when `hash` ends it, else
/// walked to the root into `chain`'s buffers (no allocation once they have
/// grown). Engine pages are not cached.
fn chain_path<'c>(
    chain: &'c mut Option<Chain>,
    scratch: &'c mut Vec<u64>,
    records: &Records,
    ratio: Ratio,
    model: &str,
    hash: u64,
    max_blocks: usize,
) -> Result<&'c [u64], Placed> {
    if !matches!(ratio, Ratio::Whole(_)) {
        Engine::walk(records, ratio, hash, max_blocks, scratch, None)?;
        return Ok(scratch);
    }
    let hit = chain
        .as_ref()
        .is_some_and(|c| &*c.model == model && c.engine.last() == Some(&hash));
    if !hit {
        let mut c = chain.take().unwrap_or_default();
        Engine::walk(
            records,
            ratio,
            hash,
            max_blocks,
            &mut c.ours,
            Some(&mut c.engine),
        )?;
        if *c.model != *model {
            c.model = model.into();
        }
        *chain = Some(c);
    }
    Ok(chain.as_ref().map_or(&[][..], |c| &c.ours[..]))
}

/// Why a chain has no place in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placed {
    Orphan,
    TooDeep,
}

/// Engine events of one pod being applied, as [`Index::batch`] starts it.
///
/// Tail-first removals are held (as one run) until the batch ends or an
/// event that is not one of them comes: lookups meanwhile still see those
/// blocks, for as long as the batch takes. Dropping the batch ends it, as
/// [`EngineBatch::finish`] does.
pub struct EngineBatch<'a> {
    index: &'a Index,
    engine: &'a mut Engine,
    pod: &'a str,
}

impl EngineBatch<'_> {
    /// Applies one engine event to the pod's blocks under `model`
    /// (removals, which name no model, find their hashes under any). Bad
    /// events (wrong token counts) are refused whole, before anything
    /// changes. Removals held for the end of the batch count as
    /// [`Applied::released`] when they go to the tree.
    pub fn apply(&mut self, model: &str, op: EngineOp<'_>) -> Result<Applied, EngineError> {
        let mut done = Applied::default();
        let (index, engine, pod) = (self.index, &mut *self.engine, self.pod);
        if engine.closed {
            return Ok(done);
        }
        match op {
            EngineOp::Cleared => {
                // The pod gets a new id: the run's entries go with the old.
                engine.run.key.clear();
                index.drop_engine(engine);
                engine.models.clear();
                engine.chain = None;
                index.clear_engine_pod(pod, engine.align())?;
                done.cleared = 1;
            }
            EngineOp::Stored {
                parent,
                hashes,
                tokens,
            } => {
                let per = engine.spec.engine_block as usize;
                if tokens.len() != hashes.len().saturating_mul(per) {
                    return Err(EngineError::TokenCount {
                        tokens: tokens.len(),
                        blocks: hashes.len(),
                        block: engine.spec.engine_block,
                    });
                }
                // A store may hold again what the run removed, so the run
                // goes first; the store's records change even if it fails.
                let settled = index.settle(engine, pod);
                let stored = index.store(engine, pod, model, parent, hashes, tokens, &mut done);
                done.released += settled?;
                stored?;
            }
            EngineOp::Removed { hashes } => {
                index.remove(engine, pod, model, hashes, &mut done)?;
            }
        }
        Ok(done)
    }

    /// Ends the batch: held removals go to the tree. Returns what that
    /// released.
    pub fn finish(mut self) -> Result<Applied, EngineError> {
        self.end()
    }

    fn end(&mut self) -> Result<Applied, EngineError> {
        Ok(Applied {
            released: self.index.settle(self.engine, self.pod)?,
            ..Applied::default()
        })
    }
}

impl Drop for EngineBatch<'_> {
    fn drop(&mut self) {
        // Only naming the pod can fail (its id table is full), and the
        // pod's next event meets the same error and reports it.
        let _ = self.end();
    }
}

impl Index {
    /// Starts applying a batch of `pod`'s engine events. `engine` is the
    /// pod's state ([`Index::engine`]); hold its lock for the batch.
    pub fn batch<'a>(&'a self, engine: &'a mut Engine, pod: &'a str) -> EngineBatch<'a> {
        EngineBatch {
            index: self,
            engine,
            pod,
        }
    }

    /// Applies one engine event to `pod`'s blocks under `model`: a batch of
    /// one ([`EngineBatch::apply`]).
    pub fn apply(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        op: EngineOp<'_>,
    ) -> Result<Applied, EngineError> {
        let mut batch = self.batch(engine, pod);
        let mut done = batch.apply(model, op)?;
        done.add(&batch.finish()?);
        Ok(done)
    }

    /// Takes `engine`'s held removals off the tree; returns the (pod,
    /// block) pairs released.
    fn settle(&self, engine: &mut Engine, pod: &str) -> Result<u64, EngineError> {
        // A closed engine's pod is gone: naming it would register it again.
        if engine.closed {
            engine.run.key.clear();
        }
        self.release_run(&mut engine.run, pod, engine.ratio)
    }

    /// Takes `run` off the tree (if any) and empties it; returns the (pod,
    /// block) pairs released.
    fn release_run(&self, run: &mut Run, pod: &str, ratio: Ratio) -> Result<u64, EngineError> {
        if run.key.is_empty() {
            return Ok(0);
        }
        let id = self.precise_id(pod, ratio.align())?;
        let released = self.release_at(&run.model, &run.key, run.from, id);
        run.key.clear();
        Ok(released)
    }

    #[allow(clippy::too_many_arguments)]
    fn store(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        parent: Option<u64>,
        hashes: &[u64],
        tokens: &[u32],
        done: &mut Applied,
    ) -> Result<(), EngineError> {
        let (spec, ratio, align) = (engine.spec, engine.ratio, engine.align());
        let max_records = self.sh.cfg.max_engine_blocks;
        let max_key = self.sh.cfg.max_key_blocks;
        // A model's records exist while it has one: an empty store names a
        // model (an adapter, say) and records nothing.
        if hashes.is_empty() {
            return Ok(());
        }
        let max_own = self.sh.cfg.max_engine_blocks_per_pod;
        let own = engine.blocks() as u64;
        let Engine {
            models,
            chain,
            scratch,
            ..
        } = &mut *engine;
        let i = match models.get_index_of(model) {
            Some(i) => i,
            None => models.insert_full(model.into(), Records::default()).0,
        };
        let records = &mut models[i];
        let per = spec.engine_block as usize;
        // Whether a block became held: the event's path is then placed in
        // the tree once, to its last block (held blocks refresh as no-ops).
        let mut newly_held = false;
        let mut up = parent;
        // Each hash's record, looked up before anything is recorded, so the
        // new records are counted first and room is taken for exactly them.
        let found: SmallVec<[Option<u32>; 32]> = hashes.iter().map(|&h| records.find(h)).collect();
        let new = found.iter().filter(|at| at.is_none()).count() as u64;
        // The positions of the blocks recorded, in the event's order.
        let mut recorded_at: SmallVec<[u32; 32]> = SmallVec::with_capacity(hashes.len());
        // Room under `max_engine_blocks` for the new records the pod's own
        // bound lets in, taken in one read-modify-write of the shared count
        // (each waits for the stores before it) and no more than can be
        // used, so a pod storing beside this one is never refused room this
        // one leaves unused. What goes unused (a hash the event names twice,
        // a refusal partway) goes back at the end, with the records' bytes.
        let room = self.reserve_records(new.min(max_own.saturating_sub(own)) as usize);
        let (mut added, mut added_bytes) = (0u64, 0usize);
        let recorded: Result<(), EngineError> = 'records: {
            for (k, (&h, toks)) in hashes.iter().zip(tokens.chunks_exact(per)).enumerate() {
                // A hash not recorded before the event may have been by it
                // (named twice): looked up again once the event has added.
                let at = match found[k] {
                    None if added > 0 => records.find(h),
                    at => at,
                };
                let (at, became_held) = match at {
                    Some(at) => (at, records.add_copy(at)),
                    None => {
                        let full = EngineError::Full { max: max_records };
                        if own.saturating_add(added) >= max_own {
                            break 'records Err(EngineError::PodFull { max: max_own });
                        }
                        if added == room {
                            break 'records Err(full);
                        }
                        let data = match ratio {
                            Ratio::Whole(1) => Data::One((spec.hash)(toks)),
                            Ratio::Whole(_) => Data::whole(
                                toks.chunks_exact(spec.our_block as usize)
                                    .map(spec.hash)
                                    .collect(),
                            ),
                            Ratio::Pages(n) => {
                                let depth = match up.and_then(|p| records.find(p)) {
                                    Some(at) => match records.data(at) {
                                        DataRef::Page(p) => p.depth.saturating_add(1),
                                        _ => 0,
                                    },
                                    None => 0,
                                };
                                let group = (depth % n == n - 1)
                                    .then(|| group_hash(records, up, toks, n, spec))
                                    .flatten();
                                Data::Extra(Extra::Page(Page {
                                    depth,
                                    tokens: toks.into(),
                                    group,
                                }))
                            }
                        };
                        let Some(at) = records.insert(h, up, 1, data) else {
                            break 'records Err(full);
                        };
                        added += 1;
                        added_bytes += records.record_bytes(at);
                        (at, true)
                    }
                };
                recorded_at.push(at);
                done.stored += 1;
                newly_held |= became_held;
                up = Some(h);
            }
            Ok(())
        };
        // The records were counted as `room`; what went unused goes back.
        self.count_record(added_bytes as i64, added as i64 - room as i64);
        // Refused before its first record: the model keeps no empty record
        // set (names an engine sends would pile up otherwise). Nothing was
        // recorded, so nothing is placed.
        if records.len() == 0 {
            models.swap_remove_index(i);
            return recorded;
        }
        let records = &*records;
        // Records full partway: the blocks recorded before are held, and
        // are placed like any others before the error is returned.
        let full = recorded.err();
        let placed = 'place: {
            let Some(last) = up.filter(|_| newly_held) else {
                break 'place Ok(());
            };
            let extended =
                extend_chain(chain, records, ratio, model, parent, &recorded_at, max_key);
            let path = if extended {
                Ok(chain.as_ref().map_or(&[][..], |c| &c.ours[..]))
            } else {
                chain_path(chain, scratch, records, ratio, model, last, max_key)
            };
            // Pages: our blocks are whole groups, held only while every page of
            // the group is; a path through a group missing a page stops before it.
            let key = match path {
                Ok(key) => key,
                Err(Placed::Orphan) => {
                    done.orphaned += 1;
                    break 'place Ok(());
                }
                Err(Placed::TooDeep) => {
                    done.too_deep += 1;
                    break 'place Ok(());
                }
            };
            let held;
            let key = match ratio {
                Ratio::Whole(_) => key,
                Ratio::Pages(n) => {
                    held = held_groups(records, last, n, key.to_vec());
                    &held[..]
                }
            };
            if key.is_empty() {
                break 'place Ok(());
            }
            self.insert_at(model, key, pod, align, PINNED)
                .map_err(EngineError::Insert)
        };
        match full {
            Some(e) => Err(e),
            None => placed,
        }
    }

    fn remove(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        hashes: &[u64],
        done: &mut Applied,
    ) -> Result<(), EngineError> {
        let ratio = engine.ratio;
        let max_key = self.sh.cfg.max_key_blocks;
        let mut failed = None;
        let Engine {
            models,
            chain,
            scratch,
            run,
            ..
        } = &mut *engine;
        for &h in hashes {
            // Removals name no model (no LoRA adapter): the event's model
            // first, then whichever holds the hash.
            let found = models
                .get_index_of(model)
                .and_then(|i| Some((i, models[i].find(h)?)))
                .or_else(|| {
                    models
                        .values()
                        .enumerate()
                        .find_map(|(i, r)| Some((i, r.find(h)?)))
                });
            let Some((i, at)) = found else {
                done.unknown += 1;
                continue;
            };
            let Some((name, records)) = models.get_index_mut(i) else {
                continue;
            };
            let model: &str = name;
            match records.take_copy(at) {
                None => {
                    done.unknown += 1;
                    continue;
                }
                Some(left) => {
                    done.removed += 1;
                    if left > 0 {
                        continue;
                    }
                }
            }
            let path = chain_path(chain, scratch, records, ratio, model, h, max_key);
            match (ratio, path) {
                // The last of our blocks only (see `release_block`), held
                // in the run.
                (Ratio::Whole(_), Ok(path)) if run.extended_by(model, path) => {
                    run.from = path.len() - 1;
                }
                (Ratio::Whole(_), Ok(path)) => {
                    match self.release_run(run, pod, ratio) {
                        Ok(n) => done.released += n,
                        Err(e) => {
                            // The run's pod has no id to take it off with:
                            // the run goes, the new one starts as usual.
                            run.key.clear();
                            failed.get_or_insert(e);
                        }
                    }
                    if *run.model != *model {
                        run.model = model.into();
                    }
                    run.key.extend_from_slice(path);
                    run.from = path.len().saturating_sub(1);
                }
                (_, path) => match self.release_block(records, ratio, pod, model, at, path) {
                    Ok(n) => done.released += n,
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                },
            }
            let dropped = records.forget(at, |bytes| self.count_record(-(bytes as i64), -1));
            if records.len() == 0 {
                // Its last record went: the model's records go too, so that
                // adapters an engine has dropped cost nothing.
                models.swap_remove_index(i);
                *chain = None;
            } else {
                chain_popped(chain, ratio, h, dropped);
            }
        }
        // Every hash was applied to the records, whatever the tree said.
        failed.map_or(Ok(()), Err)
    }

    /// Takes `pod` off the tree's blocks of the engine block at `at` (no
    /// copy left), whose path is `path`.
    fn release_block(
        &self,
        records: &Records,
        ratio: Ratio,
        pod: &str,
        model: &str,
        at: u32,
        path: Result<&[u64], Placed>,
    ) -> Result<u64, EngineError> {
        // Placed nowhere (an orphan, or too deep): nothing to take off.
        let Ok(path) = path else {
            return Ok(0);
        };
        let id = self.precise_id(pod, ratio.align())?;
        let released = match (ratio, records.data(at)) {
            // The last of our blocks only: another engine block under the
            // same parent may share the ones before it (the same first
            // tokens), never the last (it would be the same block), and a
            // match ending inside an engine block rounds down to its start.
            (Ratio::Whole(_), _) => self.release_at(model, path, path.len().saturating_sub(1), id),
            (Ratio::Pages(_), DataRef::Page(p)) if p.group.is_some() => {
                self.release_at(model, path, path.len().saturating_sub(1), id)
            }
            // A page inside a group: that group, on every branch below the
            // groups before it (which of them it belongs to is not known).
            (Ratio::Pages(_), _) => self.release_branches(model, path, id),
        };
        Ok(released)
    }

    /// Loads `pod`'s records under `model` from a snapshot and rebuilds its
    /// entries: every held block's path, less the blocks with no copy left
    /// under held ones. A block named twice keeps its first record.
    pub(crate) fn restore_engine(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        blocks: Vec<(u64, Record)>,
    ) -> Result<(), EngineError> {
        let max = self.sh.cfg.max_engine_blocks;
        let max_own = self.sh.cfg.max_engine_blocks_per_pod;
        if (engine.blocks() as u64).saturating_add(blocks.len() as u64) > max_own {
            return Err(EngineError::PodFull { max: max_own });
        }
        let (ratio, align) = (engine.ratio, engine.align());
        let engine_block = engine.spec.engine_block as usize;
        if let Some((h, _)) = blocks
            .iter()
            .find(|(_, r)| !r.data.fits(ratio, engine_block))
        {
            return Err(EngineError::Record {
                hash: *h,
                why: "its data does not fit the engine's block sizes",
            });
        }
        if blocks.is_empty() {
            return Ok(());
        }
        // Room for every record at once (counted now, so a restore running
        // beside stores never passes the bound with them); what duplicates
        // leave unused goes back.
        let room = self.reserve_records(blocks.len());
        if room < blocks.len() as u64 {
            self.count_record(0, -(room as i64));
            return Err(EngineError::Full { max });
        }
        let max_key = self.sh.cfg.max_key_blocks;
        let records = engine.models.entry(model.into()).or_default();
        let (mut unused, mut bytes, mut full) = (blocks.len() as i64, 0, false);
        for (h, r) in blocks {
            if records.find(h).is_some() {
                continue;
            }
            let Some(at) = records.insert(h, r.parent, r.copies, r.data) else {
                full = true;
                break;
            };
            unused -= 1;
            bytes += records.record_bytes(at) as i64;
        }
        self.count_record(bytes, -unused);
        if full {
            return Err(EngineError::Full { max });
        }
        let records = &*records;
        // Held blocks with no held child: their paths cover every held one.
        let mut held_parent = vec![false; records.span()];
        for at in records.positions() {
            if let (true, Parent::At(p)) = (records.copies(at) > 0, records.parent(at)) {
                held_parent[p as usize] = true;
            }
        }
        for at in records.positions() {
            if records.copies(at) == 0 || held_parent[at as usize] {
                continue;
            }
            let h = records.hash(at);
            let Ok(key) = Engine::path(records, ratio, h, max_key) else {
                continue;
            };
            let key = match ratio {
                Ratio::Whole(_) => key,
                Ratio::Pages(n) => held_groups(records, h, n, key),
            };
            if !key.is_empty() {
                self.insert_at(model, &key, pod, align, PINNED)?;
            }
        }
        for at in records.positions() {
            if records.copies(at) == 0 && records.children(at) > 0 {
                let path = Engine::path(records, ratio, records.hash(at), max_key);
                let path = path.as_deref().map_err(|e| *e);
                self.release_block(records, ratio, pod, model, at, path)?;
            }
        }
        Ok(())
    }
}

/// The hash rule of an engine restored from a snapshot until its
/// subscription registers it again ([`crate::Index::engine`] replaces it).
/// Blocks stored meanwhile hash to 0 and match no gateway key.
pub(crate) fn unset_hash(_: &[u32]) -> u64 {
    0
}

/// Our hash of the group that the page with `toks` closes, under `parent`:
/// the tokens of its `n - 1` ancestors and its own. `None` if an ancestor
/// is unknown.
fn group_hash(
    records: &Records,
    parent: Option<u64>,
    toks: &[u32],
    n: u32,
    spec: EngineSpec,
) -> Option<u64> {
    let mut pages: Vec<&[u32]> = vec![toks];
    let mut at = parent.and_then(|p| records.find(p));
    for _ in 1..n {
        let a = at?;
        match records.data(a) {
            DataRef::Page(p) => pages.push(&p.tokens),
            DataRef::One(_) | DataRef::Many(_) => return None,
        }
        at = match records.parent(a) {
            Parent::At(p) => Some(p),
            Parent::Root | Parent::Unknown(_) => None,
        };
    }
    let tokens: Vec<u32> = pages.iter().rev().flat_map(|p| p.iter().copied()).collect();
    (tokens.len() == spec.our_block as usize).then(|| (spec.hash)(&tokens))
}

/// Cuts `key` (the groups on `last`'s path) at the first group with a page
/// not held, walking up from `last`.
fn held_groups(records: &Records, last: u64, n: u32, mut key: Vec<u64>) -> Vec<u64> {
    // Groups from the root: `key[k]` is closed by the page at depth
    // `k * n + n - 1`. A page's depth says its group.
    let mut at = records.find(last);
    let mut first_missing: Option<usize> = None;
    while let Some(a) = at {
        if let DataRef::Page(p) = records.data(a) {
            if records.copies(a) == 0 {
                first_missing = Some((p.depth / n) as usize);
            }
        }
        at = match records.parent(a) {
            Parent::At(p) => Some(p),
            Parent::Root | Parent::Unknown(_) => None,
        };
    }
    // Incomplete trailing group: `last` may not close one.
    if let Some(k) = first_missing {
        key.truncate(k);
    }
    key
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{EngineHandle, IndexConfig};

    const T0: u64 = 1_700_000_000_000;

    /// A stand-in for the gateways' rule: any fixed function of the tokens.
    fn hash(tokens: &[u32]) -> u64 {
        tokens.iter().fold(0xcbf2_9ce4_8422_2325, |h, &t| {
            (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3)
        })
    }

    fn spec(engine_block: u32) -> EngineSpec {
        EngineSpec {
            engine_block,
            our_block: 4,
            hash,
        }
    }

    fn index() -> Index {
        Index::new(IndexConfig {
            ttl: Duration::from_secs(60),
            ..IndexConfig::default()
        })
    }

    /// `blocks` blocks of 4 tokens, block `i` of prompt `p` being `[p, i, i, i]`.
    fn tokens(p: u32, blocks: u32) -> Vec<u32> {
        (0..blocks).flat_map(|i| [p, i, i, i]).collect()
    }

    fn key(p: u32, blocks: u32) -> Vec<u64> {
        tokens(p, blocks).chunks(4).map(hash).collect()
    }

    fn matched(index: &Index, key: &[u64], now: u64) -> Vec<(String, u32)> {
        index.lookup("m", key, None, now)
    }

    fn store(
        index: &Index,
        e: &EngineHandle,
        parent: Option<u64>,
        hashes: &[u64],
        toks: &[u32],
    ) -> Applied {
        let op = EngineOp::Stored {
            parent,
            hashes,
            tokens: toks,
        };
        index.apply(&mut e.lock(), "pod", "m", op).unwrap()
    }

    fn remove(index: &Index, e: &EngineHandle, hashes: &[u64]) -> Applied {
        index
            .apply(&mut e.lock(), "pod", "m", EngineOp::Removed { hashes })
            .unwrap()
    }

    #[test]
    fn ratios_follow_the_block_sizes_or_are_refused() {
        assert_eq!(Ratio::new(64, 16), Ok(Ratio::Whole(4)));
        assert_eq!(Ratio::new(16, 16), Ok(Ratio::Whole(1)));
        assert_eq!(Ratio::new(1, 16), Ok(Ratio::Pages(16)));
        assert!(matches!(
            Ratio::new(24, 16),
            Err(EngineError::BlockSizes { .. })
        ));
        assert!(matches!(
            Ratio::new(0, 16),
            Err(EngineError::BlockSizes { .. })
        ));
        assert_eq!(Ratio::new(16 * MAX_RATIO, 16), Ok(Ratio::Whole(MAX_RATIO)));
        assert_eq!(Ratio::new(1, MAX_RATIO), Ok(Ratio::Pages(MAX_RATIO)));
        for (engine, ours) in [(32 * MAX_RATIO, 16), (1, 2 * MAX_RATIO)] {
            assert!(matches!(
                Ratio::new(engine, ours),
                Err(EngineError::BlockSizes { .. })
            ));
        }
    }

    #[test]
    fn a_model_has_records_only_while_it_holds_one() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        let models = |e: &EngineHandle| e.lock().models.len();
        // Empty stores under ever new adapter names record nothing.
        for i in 0..100 {
            let op = EngineOp::Stored {
                parent: None,
                hashes: &[],
                tokens: &[],
            };
            let adapter = format!("adapter-{i}");
            let done = index.apply(&mut e.lock(), "pod", &adapter, op).unwrap();
            assert_eq!(done.stored, 0);
        }
        assert_eq!(models(&e), 0);
        store(&index, &e, None, &[1, 2], &tokens(1, 2));
        assert_eq!(models(&e), 1);
        remove(&index, &e, &[2]);
        assert_eq!(models(&e), 1);
        remove(&index, &e, &[1]);
        assert_eq!(models(&e), 0);
        assert_eq!(index.stats().engine_blocks, 0);
        // And the model comes back with its next store.
        store(&index, &e, None, &[1], &tokens(1, 1));
        assert_eq!(matched(&index, &key(1, 2), T0), [("pod".to_string(), 1)]);
    }

    #[test]
    fn stored_blocks_match_by_token_key_and_never_expire() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        let a = store(&index, &e, None, &[100, 101, 102], &tokens(7, 3));
        assert_eq!(a.stored, 3);
        let k = key(7, 5);
        assert_eq!(matched(&index, &k, T0), [("pod".to_string(), 3)]);
        // Far past every TTL: the engine, not a clock, says when it goes.
        assert_eq!(
            matched(&index, &k, T0 + 3_600_000),
            [("pod".to_string(), 3)]
        );
        index.sweep(T0 + 3_600_000, usize::MAX);
        assert_eq!(
            matched(&index, &k, T0 + 3_600_000),
            [("pod".to_string(), 3)]
        );
        // A child of a known block extends the match.
        store(&index, &e, Some(102), &[103], &tokens(7, 4)[12..]);
        assert_eq!(matched(&index, &k, T0), [("pod".to_string(), 4)]);
    }

    #[test]
    fn a_block_stays_held_while_a_copy_remains() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        store(&index, &e, None, &[1, 2], &tokens(1, 2));
        store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
        let k = key(1, 2);
        assert_eq!(remove(&index, &e, &[2]).released, 0);
        assert_eq!(matched(&index, &k, T0), [("pod".to_string(), 2)]);
        assert!(remove(&index, &e, &[2]).released > 0);
        assert_eq!(matched(&index, &k, T0), [("pod".to_string(), 1)]);
        let again = remove(&index, &e, &[2, 99]);
        assert_eq!((again.removed, again.unknown), (0, 2));
    }

    #[test]
    fn a_removed_middle_block_cuts_the_match_until_stored_again() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        store(&index, &e, None, &[1, 2, 3, 4], &tokens(1, 4));
        let k = key(1, 4);
        remove(&index, &e, &[2]);
        assert_eq!(matched(&index, &k, T0), [("pod".to_string(), 1)]);
        // Blocks 3 and 4 are still cached: storing 2 again brings them back.
        store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
        assert_eq!(matched(&index, &k, T0), [("pod".to_string(), 4)]);
        // Removing the first block ends every match through it.
        remove(&index, &e, &[1]);
        assert!(matched(&index, &k, T0).is_empty());
    }

    #[test]
    fn a_batch_releases_a_tail_first_run_at_its_end_and_keeps_branches_below() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        // Prompt 1 is blocks 1..=4; prompt 2 shares its first two blocks
        // and goes on with block 5 (its tokens differ from there).
        store(&index, &e, None, &[1, 2, 3, 4], &tokens(1, 4));
        let k2: Vec<u64> = key(1, 2)
            .into_iter()
            .chain(key(2, 3)[2..].to_vec())
            .collect();
        let mut t5 = tokens(1, 2);
        t5.extend_from_slice(&tokens(2, 3)[8..]);
        store(&index, &e, Some(2), &[5], &t5[8..]);
        assert_eq!(matched(&index, &k2, T0), [("pod".to_string(), 3)]);
        let k1 = key(1, 4);
        let before = index.stats().nodes;
        let mut engine = e.lock();
        let mut batch = index.batch(&mut engine, "pod");
        for h in [4, 3, 2] {
            let got = batch
                .apply("m", EngineOp::Removed { hashes: &[h] })
                .unwrap();
            // Held, not yet released: lookups still see the run.
            assert_eq!((got.removed, got.released), (1, 0));
        }
        assert_eq!(matched(&index, &k1, T0), [("pod".to_string(), 4)]);
        assert_eq!(batch.finish().unwrap().released, 3);
        drop(engine);
        assert_eq!(matched(&index, &k1, T0), [("pod".to_string(), 1)]);
        // Block 5 is still cached below the removed block 2: a gap, so the
        // pod's match on prompt 2 ends before it.
        assert_eq!(matched(&index, &k2, T0), [("pod".to_string(), 1)]);
        // The run's emptied nodes went at once.
        assert!(index.stats().nodes <= before);
        store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
        assert_eq!(matched(&index, &k2, T0), [("pod".to_string(), 3)]);
    }

    #[test]
    fn cleared_pods_hold_nothing_and_stay_registered() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        store(&index, &e, None, &[1, 2], &tokens(1, 2));
        let a = index
            .apply(&mut e.lock(), "pod", "m", EngineOp::Cleared)
            .unwrap();
        assert_eq!(a.cleared, 1);
        assert!(matched(&index, &key(1, 2), T0).is_empty());
        assert_eq!(e.lock().blocks(), 0);
        assert_eq!(index.stats().engine_blocks, 0);
        store(&index, &e, None, &[1], &tokens(1, 1));
        assert_eq!(matched(&index, &key(1, 2), T0), [("pod".to_string(), 1)]);
    }

    #[test]
    fn gateway_inserts_for_engine_fed_pods_are_speculative() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        store(&index, &e, None, &[1], &tokens(1, 1));
        let k = key(1, 3);
        index.insert("m", &k, "pod", T0).unwrap();
        index.insert("m", &k, "plain", T0).unwrap();
        let both = |now| matched(&index, &k, now);
        assert_eq!(
            both(T0 + 2_000),
            [("plain".to_string(), 3), ("pod".to_string(), 3)]
        );
        // Past the speculative TTL: only what the engine stored is left.
        assert_eq!(
            both(T0 + 2_001),
            [("plain".to_string(), 3), ("pod".to_string(), 1)]
        );
        // An engine store confirms a speculative block.
        index.insert("m", &k, "pod", T0 + 5_000).unwrap();
        store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
        assert_eq!(both(T0 + 60_000)[1], ("pod".to_string(), 2));
    }

    #[test]
    fn wide_engine_blocks_are_several_of_ours() {
        let index = index();
        let e = index.engine("pod", spec(8)).unwrap();
        store(&index, &e, None, &[1, 2], &tokens(1, 4));
        let k = key(1, 4);
        assert_eq!(matched(&index, &k, T0), [("pod".to_string(), 4)]);
        remove(&index, &e, &[2]);
        assert_eq!(matched(&index, &k, T0), [("pod".to_string(), 2)]);
        // Token counts that do not fill the blocks are refused whole.
        let bad = EngineOp::Stored {
            parent: None,
            hashes: &[5],
            tokens: &[1, 2, 3],
        };
        assert!(matches!(
            index.apply(&mut e.lock(), "pod", "m", bad),
            Err(EngineError::TokenCount { .. })
        ));
    }

    #[test]
    fn pages_make_one_block_when_all_are_held() {
        let index = index();
        let e = index.engine("pod", spec(1)).unwrap();
        let toks = tokens(3, 2);
        let hashes: Vec<u64> = (10..18).collect();
        // Seven pages: one whole block of ours.
        store(&index, &e, None, &hashes[..7], &toks[..7]);
        let k = key(3, 2);
        assert_eq!(matched(&index, &k, T0), [("pod".to_string(), 1)]);
        store(&index, &e, Some(16), &hashes[7..], &toks[7..]);
        assert_eq!(matched(&index, &k, T0), [("pod".to_string(), 2)]);
        // Any page of a block gone: the block is gone.
        remove(&index, &e, &[13]);
        assert!(matched(&index, &k, T0).is_empty());
    }

    #[test]
    fn stores_under_unknown_parents_are_counted_not_placed() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        let a = store(&index, &e, Some(77), &[1], &tokens(1, 1));
        assert_eq!(a.orphaned, 1);
        assert!(matched(&index, &key(1, 1), T0).is_empty());
        // Its removal is known, not "unknown".
        assert_eq!(remove(&index, &e, &[1]).unknown, 0);
    }

    #[test]
    fn a_parent_stored_after_its_child_keeps_it() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        // The child first (an orphan), then its parent, then a grandchild.
        store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
        store(&index, &e, None, &[1], &tokens(1, 1));
        store(&index, &e, Some(2), &[3], &tokens(1, 3)[8..]);
        assert_eq!(matched(&index, &key(1, 3), T0), [("pod".to_string(), 3)]);
        // The parent goes; its record stays, so the grandchild's removal
        // still finds its path.
        remove(&index, &e, &[1]);
        assert!(matched(&index, &key(1, 3), T0).is_empty());
        assert!(remove(&index, &e, &[3]).released > 0);
        store(&index, &e, None, &[1], &tokens(1, 1));
        assert_eq!(matched(&index, &key(1, 3), T0), [("pod".to_string(), 2)]);
    }

    #[test]
    fn a_block_stored_again_under_another_parent_is_placed_where_it_was_recorded() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        let (a, x, y) = (1, 2, 3);
        store(&index, &e, None, &[a], &tokens(1, 1));
        store(&index, &e, Some(a), &[x, y], &tokens(1, 3)[4..]);
        // `x` goes; its record stays (it has a child).
        remove(&index, &e, &[x]);
        // The last chain walked ends at `b`.
        let b = 4;
        store(&index, &e, Some(a), &[b], &[2, 1, 1, 1]);
        // An engine names `x` again, under `b`: a record keeps the parent
        // it was first stored under, so `x` is held again under `a`, not
        // under the chain that ends at `b`.
        store(&index, &e, Some(b), &[x], &tokens(1, 2)[4..]);
        assert_eq!(matched(&index, &key(1, 3), T0), [("pod".to_string(), 3)]);
        let through_b = [key(1, 1)[0], hash(&[2, 1, 1, 1]), key(1, 2)[1]];
        assert_eq!(matched(&index, &through_b, T0), [("pod".to_string(), 2)]);
    }

    #[test]
    fn a_block_named_after_a_new_one_in_its_event_is_placed_where_it_was_recorded() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        let (a, x, y, b, c) = (1, 2, 3, 4, 5);
        store(&index, &e, None, &[a], &tokens(1, 1));
        store(&index, &e, Some(a), &[x, y], &tokens(1, 3)[4..]);
        remove(&index, &e, &[x]);
        // The last chain walked ends at `a`: `c` stored under it, then gone.
        store(&index, &e, Some(a), &[c], &[3, 1, 1, 1]);
        remove(&index, &e, &[c]);
        // One event names `b`, new, under `a`, then `x` under `b`: `x`
        // keeps its place under `a`.
        let mut toks = vec![2, 1, 1, 1];
        toks.extend_from_slice(&tokens(1, 2)[4..]);
        store(&index, &e, Some(a), &[b, x], &toks);
        assert_eq!(matched(&index, &key(1, 3), T0), [("pod".to_string(), 3)]);
    }

    #[test]
    fn parent_cycles_are_refused_as_too_deep() {
        let index = Index::new(IndexConfig {
            max_key_blocks: 8,
            ..IndexConfig::default()
        });
        let e = index.engine("pod", spec(4)).unwrap();
        store(&index, &e, Some(2), &[1], &tokens(1, 1));
        let a = store(&index, &e, Some(1), &[2], &tokens(1, 1));
        assert_eq!(a.too_deep, 1);
    }

    #[test]
    fn a_store_that_extends_the_last_chain_past_the_key_limit_is_too_deep() {
        let index = Index::new(IndexConfig {
            max_key_blocks: 3,
            ..IndexConfig::default()
        });
        let e = index.engine("pod", spec(4)).unwrap();
        store(&index, &e, None, &[1, 2], &tokens(1, 2));
        // Extends the chain just walked, to 4 blocks: not placed, not cut.
        let a = store(&index, &e, Some(2), &[3, 4], &tokens(1, 4)[8..]);
        assert_eq!((a.stored, a.too_deep), (2, 1));
        assert_eq!(matched(&index, &key(1, 3), T0), [("pod".to_string(), 2)]);
    }

    #[test]
    fn a_run_that_could_not_be_released_dies_with_its_engine() {
        let index = Index::new(IndexConfig {
            max_pods: 1,
            ttl: Duration::from_secs(60),
            ..IndexConfig::default()
        });
        let e = index.engine("pod", spec(4)).unwrap();
        store(&index, &e, None, &[1, 2], &tokens(1, 2));
        // Removed from outside: its id is free only after a sweep, so the
        // pod cannot be named again until then.
        assert!(index.remove_pod("pod"));
        {
            let mut engine = e.lock();
            let mut batch = index.batch(&mut engine, "pod");
            batch
                .apply("m", EngineOp::Removed { hashes: &[2] })
                .unwrap();
            // The run goes first and fails; the store is still recorded.
            let op = EngineOp::Stored {
                parent: Some(1),
                hashes: &[3],
                tokens: &tokens(2, 2)[4..],
            };
            assert!(batch.apply("m", op).is_err());
            assert!(batch.finish().is_err());
        }
        assert_eq!(e.lock().blocks(), 2);
        assert!(index.drop_engine_pod("pod"));
        index.sweep(T0, usize::MAX);
        // A subscription still running ends one more batch: the run it
        // left names no pod again.
        let mut engine = e.lock();
        let late = index.batch(&mut engine, "pod").finish().unwrap();
        drop(engine);
        assert_eq!(late, Applied::default());
        assert_eq!(index.stats().pods, 0);
    }

    #[test]
    fn snapshots_keep_engine_records_and_their_gaps() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        store(&index, &e, None, &[1, 2, 3, 4], &tokens(1, 4));
        let branch = [tokens(1, 2), vec![9; 4]].concat();
        store(&index, &e, Some(2), &[5], &branch[8..]);
        remove(&index, &e, &[2]);
        index.insert("m", &key(2, 2), "plain", T0).unwrap();
        let mut bytes = Vec::new();
        let sum = index.write_snapshot(&mut bytes, T0).unwrap();
        assert_eq!(sum.engine_blocks, 5);
        let restored = super::tests::index();
        let got = crate::Snapshot::parse(&bytes)
            .unwrap()
            .restore(&restored, T0 + 10);
        assert_eq!((got.engine_blocks, got.refused), (5, 0));
        let branch_key: Vec<u64> = branch.chunks(4).map(hash).collect();
        for k in [key(1, 4), key(2, 2), branch_key.clone()] {
            assert_eq!(
                matched(&restored, &k, T0 + 10),
                matched(&index, &k, T0 + 10)
            );
        }
        assert_eq!(matched(&restored, &key(1, 4), T0), [("pod".to_string(), 1)]);
        // Events after the restart find their parents.
        let e = restored.engine("pod", spec(4)).unwrap();
        store(&restored, &e, Some(1), &[2], &tokens(1, 2)[4..]);
        assert_eq!(matched(&restored, &key(1, 4), T0), [("pod".to_string(), 4)]);
        assert_eq!(
            matched(&restored, &branch_key, T0),
            [("pod".to_string(), 3)]
        );
    }

    /// A restore that refuses one model's records (a lower limit now) leaves
    /// none of the pod's: it is learnt again from its engine's stream, from
    /// no batch applied.
    #[test]
    fn a_pod_whose_restore_is_refused_in_part_is_learnt_again() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        store(&index, &e, None, &[1], &tokens(1, 1));
        let op = EngineOp::Stored {
            parent: None,
            hashes: &[7, 8, 9],
            tokens: &tokens(3, 3),
        };
        index.apply(&mut e.lock(), "pod", "n", op).unwrap();
        e.lock().set_last_batch(Some((41, 5)));
        let mut bytes = Vec::new();
        index.write_snapshot(&mut bytes, T0).unwrap();
        let restored = Index::new(IndexConfig {
            max_engine_blocks_per_pod: 2,
            ..IndexConfig::default()
        });
        let got = crate::Snapshot::parse(&bytes)
            .unwrap()
            .restore(&restored, T0);
        assert_eq!((got.engine_blocks, got.refused), (0, 1));
        let e = restored.engine("pod", spec(4)).unwrap();
        let engine = e.lock();
        assert_eq!((engine.blocks(), engine.last_batch()), (0, None));
        drop(engine);
        assert_eq!(restored.stats().engine_blocks, 0);
        assert!(matched(&restored, &key(1, 1), T0).is_empty());
        // An empty model's records restore nothing, and make no record set.
        restored
            .restore_engine(&mut e.lock(), "pod", "m", Vec::new())
            .unwrap();
        assert!(e.lock().models.is_empty());
    }

    #[test]
    fn snapshot_records_that_do_not_fit_the_block_sizes_are_refused() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        // Engine blocks of our size hold one hash of ours each: a record
        // with many (a damaged or forged snapshot) is refused whole.
        for data in [
            Data::Extra(Extra::Many(vec![7; 1 << 16].into())),
            Data::Extra(Extra::Page(Page {
                depth: 0,
                tokens: vec![1; 4].into(),
                group: None,
            })),
        ] {
            let blocks = vec![
                (1, Record::new(None, 1, Data::One(11))),
                (2, Record::new(Some(2), 0, data)),
            ];
            let got = index.restore_engine(&mut e.lock(), "pod", "m", blocks);
            assert!(
                matches!(got, Err(EngineError::Record { hash: 2, .. })),
                "{got:?}"
            );
        }
        assert_eq!(index.stats().engine_blocks, 0);
        // A record that is its own parent fits, and its walk ends.
        let blocks = vec![(3, Record::new(Some(3), 0, Data::One(33)))];
        index
            .restore_engine(&mut e.lock(), "pod", "m", blocks)
            .unwrap();
        assert!(matched(&index, &[33], T0).is_empty());
    }

    #[test]
    fn a_dropped_engine_changes_nothing_any_more() {
        let index = index();
        let e = index.engine("pod", spec(4)).unwrap();
        store(&index, &e, None, &[1], &tokens(1, 1));
        assert!(index.drop_engine_pod("pod"));
        // A subscription thread still running applies one more batch.
        let late = store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
        assert_eq!(late, Applied::default());
        assert!(matched(&index, &key(1, 2), T0).is_empty());
        assert_eq!(index.stats().engine_blocks, 0);
        assert_eq!(index.stats().pods, 0);
    }

    #[test]
    fn engine_records_are_bounded() {
        let index = Index::new(IndexConfig {
            max_engine_blocks: 2,
            ..IndexConfig::default()
        });
        let e = index.engine("pod", spec(4)).unwrap();
        let op = EngineOp::Stored {
            parent: None,
            hashes: &[1, 2, 3],
            tokens: &tokens(1, 3),
        };
        assert!(matches!(
            index.apply(&mut e.lock(), "pod", "m", op),
            Err(EngineError::Full { max: 2 })
        ));
        assert_eq!(index.stats().engine_blocks, 2);
        // The two recorded are held, and matched.
        assert_eq!(matched(&index, &key(1, 3), T0), [("pod".to_string(), 2)]);
    }

    /// Room a store or a restore takes and does not use (a hash named
    /// twice, a refusal partway, a record restored twice) goes back: the
    /// count is the records held after each, and a later store fits.
    #[test]
    fn room_taken_and_not_used_goes_back() {
        let index = Index::new(IndexConfig {
            max_engine_blocks: 6,
            max_engine_blocks_per_pod: 4,
            ..IndexConfig::default()
        });
        let store = |pod: &str, parent, hashes: &[u64], tokens: &[u32]| {
            let e = index.engine(pod, spec(4)).unwrap();
            let op = EngineOp::Stored {
                parent,
                hashes,
                tokens,
            };
            let got = index.apply(&mut e.lock(), pod, "m", op).map(drop);
            let held = e.lock().blocks() as u64;
            (got, index.stats().engine_blocks, held)
        };
        // Hash 2 named twice: two copies of one record.
        let twice = [tokens(1, 2), tokens(1, 2)[4..].to_vec()].concat();
        assert_eq!(store("a", None, &[1, 2, 2], &twice), (Ok(()), 2, 2));
        let a = index.engine("a", spec(4)).unwrap();
        {
            let engine = a.lock();
            let records = &engine.models["m"];
            assert_eq!(records.copies(records.find(2).unwrap()), 2);
        }
        // Refused by the pod's bound after two more.
        let refused = Err(EngineError::PodFull { max: 4 });
        assert_eq!(
            store("a", None, &[11, 12, 13], &tokens(2, 3)),
            (refused, 4, 4)
        );
        // A restore naming a record twice counts it once; the two left
        // under the global bound still fit.
        let b = index.engine("b", spec(4)).unwrap();
        let blocks = vec![
            (21, Record::new(None, 1, Data::One(121))),
            (21, Record::new(None, 1, Data::One(121))),
        ];
        index
            .restore_engine(&mut b.lock(), "b", "m", blocks)
            .unwrap();
        assert_eq!((index.stats().engine_blocks, b.lock().blocks()), (5, 1));
        assert_eq!(store("b", Some(21), &[22], &tokens(3, 1)), (Ok(()), 6, 2));
        // Full now, but a store of held blocks only still adds copies.
        let full = Err(EngineError::Full { max: 6 });
        assert_eq!(store("b", Some(21), &[22, 23], &tokens(3, 2)), (full, 6, 2));
        assert_eq!(store("b", Some(21), &[22], &tokens(3, 1)), (Ok(()), 6, 2));
    }

    #[test]
    fn pods_storing_at_once_never_pass_the_bound_together() {
        const MAX: u64 = 64;
        for round in 0..200u64 {
            let index = Index::new(IndexConfig {
                max_engine_blocks: MAX,
                ..IndexConfig::default()
            });
            let start = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                for p in 0..2u64 {
                    let (index, start) = (&index, &start);
                    s.spawn(move || {
                        let pod = format!("pod-{p}");
                        let e = index.engine(&pod, spec(4)).unwrap();
                        start.wait();
                        // Events of 16 new blocks, each pod its own hashes,
                        // until the bound refuses one.
                        for event in 0u64.. {
                            let first = (round << 32) | (p << 24) | (event << 8);
                            let hashes: Vec<u64> = (first..first + 16).collect();
                            let op = EngineOp::Stored {
                                parent: None,
                                hashes: &hashes,
                                tokens: &tokens(event as u32, 16),
                            };
                            if index.apply(&mut e.lock(), &pod, "m", op).is_err() {
                                break;
                            }
                        }
                    });
                }
            });
            // The count is the records there are, and never past the bound.
            let held: usize = ["pod-0", "pod-1"]
                .iter()
                .map(|p| index.engine(p, spec(4)).unwrap().lock().blocks())
                .sum();
            assert_eq!(index.stats().engine_blocks, held as u64);
            assert_eq!(held as u64, MAX, "round {round}");
        }
    }

    #[test]
    fn one_engine_cannot_take_the_others_room() {
        let index = Index::new(IndexConfig {
            max_engine_blocks_per_pod: 2,
            ..IndexConfig::default()
        });
        let greedy = index.engine("greedy", spec(4)).unwrap();
        let other = index.engine("other", spec(4)).unwrap();
        let op = EngineOp::Stored {
            parent: None,
            hashes: &[1, 2, 3],
            tokens: &tokens(1, 3),
        };
        assert!(matches!(
            index.apply(&mut greedy.lock(), "greedy", "m", op),
            Err(EngineError::PodFull { max: 2 })
        ));
        // A model of its own does not get round the bound.
        assert!(matches!(
            index.apply(&mut greedy.lock(), "greedy", "adapter", op),
            Err(EngineError::PodFull { max: 2 })
        ));
        assert_eq!(greedy.lock().blocks(), 2);
        assert_eq!(greedy.lock().models.len(), 1);
        let op = EngineOp::Stored {
            parent: None,
            hashes: &[7, 8],
            tokens: &tokens(2, 2),
        };
        index.apply(&mut other.lock(), "other", "m", op).unwrap();
        assert_eq!(index.stats().engine_blocks, 4);
    }
}
