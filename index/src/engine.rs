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
//! What the tree holds for an engine-fed pod, after every event:
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

use std::collections::HashMap;

use crate::error::EngineError;
use crate::index::Index;
use crate::slots::MAX_TIME;

/// The time of an entry an engine confirmed: it never expires (TTLs and
/// speculative TTLs measure age from an entry's time, and no clock reaches
/// it), and it outranks every gateway refresh (refreshes only raise times).
pub const PINNED: u64 = MAX_TIME;

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
    /// refused when neither divides the other.
    pub fn new(engine_block: u32, our_block: u32) -> Result<Ratio, EngineError> {
        let bad = || EngineError::BlockSizes {
            engine: engine_block,
            ours: our_block,
        };
        if engine_block == 0 || our_block == 0 {
            return Err(bad());
        }
        if engine_block % our_block == 0 {
            Ok(Ratio::Whole(engine_block / our_block))
        } else if our_block % engine_block == 0 {
            Ok(Ratio::Pages(our_block / engine_block))
        } else {
            Err(bad())
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

/// One engine block as recorded: 32 bytes, a map slot of 40 (the common
/// case, an engine block of our size, keeps its one hash inline).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Record {
    /// The parent's engine hash, if [`HAS_PARENT`] is set.
    parent: u64,
    /// Copies the engine holds (stores minus removes, never below zero).
    pub(crate) copies: u32,
    /// Records whose parent is this one (a record is dropped when it has
    /// neither copies nor children, so chains below a held block stay
    /// whole), and [`HAS_PARENT`].
    links: u32,
    pub(crate) data: Data,
}

// The size the record's doc states, and the memory figures assume.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<Record>() == 32);

/// `Record::links`' flag: the block has a parent.
const HAS_PARENT: u32 = 1 << 31;

impl Record {
    pub(crate) fn new(parent: Option<u64>, copies: u32, data: Data) -> Record {
        Record {
            parent: parent.unwrap_or(0),
            copies,
            links: if parent.is_some() { HAS_PARENT } else { 0 },
            data,
        }
    }

    /// The parent's engine hash.
    pub(crate) fn parent(&self) -> Option<u64> {
        (self.links & HAS_PARENT != 0).then_some(self.parent)
    }

    /// Records whose parent is this one.
    pub(crate) fn children(&self) -> u32 {
        self.links & !HAS_PARENT
    }

    fn add_child(&mut self) {
        if self.children() < !HAS_PARENT {
            self.links += 1;
        }
    }

    fn drop_child(&mut self) {
        if self.children() > 0 {
            self.links -= 1;
        }
    }

    /// Our hashes of the block (for pages: of the group it closes, if any).
    fn ours(&self) -> &[u64] {
        match &self.data {
            Data::One(h) => std::slice::from_ref(h),
            Data::Many(hs) => &hs.0,
            Data::Page(p) => p.group.as_slice(),
        }
    }
}

/// Our side of an engine block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Data {
    /// Our hash of its one block (`Ratio::Whole(1)`).
    One(u64),
    /// Our hashes of its `r` blocks (`Ratio::Whole(r)`, `r > 1`), behind a
    /// thin pointer: a boxed slice's length would widen every record by 8
    /// bytes, and `One`, the common case, would pay for it.
    Many(Box<Many>),
    /// A page (`Ratio::Pages`).
    Page(Box<Page>),
}

/// Our hashes of an engine block of several of ours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Many(pub(crate) Box<[u64]>);

/// A page smaller than our block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Page {
    /// Its depth in pages from the root.
    pub(crate) depth: u32,
    /// Its token ids.
    pub(crate) tokens: Box<[u32]>,
    /// On a group's last page, our hash of the group.
    pub(crate) group: Option<u64>,
}

impl Data {
    /// Our hashes of a whole engine block.
    pub(crate) fn whole(ours: Vec<u64>) -> Data {
        match ours[..] {
            [one] => Data::One(one),
            _ => Data::Many(Box::new(Many(ours.into()))),
        }
    }
}

type Records = HashMap<u64, Record, ahash::RandomState>;

/// One pod's engine state: its records per model.
pub struct Engine {
    pub(crate) spec: EngineSpec,
    pub(crate) ratio: Ratio,
    pub(crate) models: HashMap<Box<str>, Records, ahash::RandomState>,
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
    /// Records per parent hash not recorded (yet): an orphan's parent,
    /// stored later, starts with these as its children, so that it is not
    /// dropped while they still hang from it.
    waiting: HashMap<u64, u32, ahash::RandomState>,
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

/// Bytes one record costs, as counted in `Stats::engine_bytes`: the map's
/// slot (key, record, control byte) and the heap behind the record.
pub(crate) fn record_bytes(r: &Record) -> usize {
    let heap = match &r.data {
        Data::One(_) => 0,
        Data::Many(h) => std::mem::size_of::<Many>() + h.0.len() * 8,
        Data::Page(p) => std::mem::size_of::<Page>() + p.tokens.len() * 4,
    };
    8 + std::mem::size_of::<Record>() + 1 + heap
}

impl Engine {
    pub(crate) fn new(spec: EngineSpec) -> Result<Self, EngineError> {
        Ok(Engine {
            ratio: Ratio::new(spec.engine_block, spec.our_block)?,
            spec,
            models: HashMap::default(),
            last_batch: None,
            closed: false,
            chain: None,
            scratch: Vec::new(),
            waiting: HashMap::default(),
        })
    }

    /// Engine blocks recorded, over every model.
    pub fn blocks(&self) -> usize {
        self.models.values().map(HashMap::len).sum()
    }

    /// Engine blocks held (with at least one copy), over every model.
    pub fn held(&self) -> usize {
        self.models
            .values()
            .flat_map(|m| m.values())
            .filter(|r| r.copies > 0)
            .count()
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
        Engine::walk(records, ratio, hash, max_blocks, None)
    }

    /// As [`Engine::path`], also filling `engine` with the engine hashes of
    /// the chain, root first.
    fn walk(
        records: &Records,
        ratio: Ratio,
        hash: u64,
        max_blocks: usize,
        mut engine: Option<&mut Vec<u64>>,
    ) -> Result<Vec<u64>, Placed> {
        let mut rev: Vec<u64> = Vec::new();
        let mut at = Some(hash);
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
        while let Some(h) = at {
            let Some(r) = records.get(&h) else {
                return Err(Placed::Orphan);
            };
            steps += 1;
            if steps > limit {
                return Err(Placed::TooDeep);
            }
            rev.extend(r.ours().iter().rev());
            if let Some(e) = engine.as_deref_mut() {
                e.push(h);
            }
            at = r.parent();
        }
        rev.reverse();
        if let Some(e) = engine {
            e.reverse();
        }
        if rev.len() > max_blocks {
            return Err(Placed::TooDeep);
        }
        Ok(rev)
    }

    /// Forgets the chain cache and the waiting children (the records are
    /// gone).
    pub(crate) fn clear_chain(&mut self) {
        self.chain = None;
        self.waiting.clear();
    }

    /// The chain cache after its tip's record was dropped (`dropped` is how
    /// many records went: past the tip, the chain names records that are no
    /// more, and the cache goes).
    fn chain_popped(&mut self, hash: u64, dropped: usize) {
        let r = self.ratio.align() as usize;
        match &mut self.chain {
            Some(c) if dropped == 1 && c.engine.last() == Some(&hash) => {
                c.engine.pop();
                c.ours.truncate(c.ours.len().saturating_sub(r));
            }
            Some(_) if dropped > 0 => self.chain = None,
            _ => {}
        }
    }

    /// The chain cache extended by a store of `hashes` under `parent`, if it
    /// ended at `parent`: it is then the stored blocks' path, found without
    /// a walk.
    fn chain_extended(
        &mut self,
        model: &str,
        parent: Option<u64>,
        hashes: &[u64],
        max_blocks: usize,
    ) -> Option<()> {
        if !matches!(self.ratio, Ratio::Whole(_)) {
            return None;
        }
        let records = self.models.get(model)?;
        let c = self.chain.as_mut().filter(|c| &*c.model == model)?;
        if parent.is_none() || c.engine.last() != parent.as_ref() {
            return None;
        }
        // Only records that hang where the store says (a record keeps the
        // parent it was first stored under).
        let mut more = Vec::new();
        let mut up = parent;
        for h in hashes {
            let r = records.get(h).filter(|r| r.parent() == up)?;
            more.extend_from_slice(r.ours());
            up = Some(*h);
        }
        c.engine.extend_from_slice(hashes);
        c.ours.extend(more);
        (c.ours.len() <= max_blocks).then_some(())
    }
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
        *scratch = Engine::path(records, ratio, hash, max_blocks)?;
        return Ok(scratch);
    }
    let hit = chain
        .as_ref()
        .is_some_and(|c| &*c.model == model && c.engine.last() == Some(&hash));
    if !hit {
        let mut c = chain.take().unwrap_or_default();
        c.ours = Engine::walk(records, ratio, hash, max_blocks, Some(&mut c.engine))?;
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

impl Index {
    /// Applies one engine event to `pod`'s blocks under `model` (removals,
    /// which name no model, find their hashes under any). `engine` is the
    /// pod's state ([`Index::engine`]); hold its lock for the call. Bad
    /// events (wrong token counts) are refused whole, before anything
    /// changes.
    pub fn apply(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        op: EngineOp<'_>,
    ) -> Result<Applied, EngineError> {
        let mut done = Applied::default();
        if engine.closed {
            return Ok(done);
        }
        match op {
            EngineOp::Cleared => {
                self.drop_engine(engine);
                engine.models.clear();
                engine.chain = None;
                engine.waiting.clear();
                self.clear_engine_pod(pod, engine.align())?;
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
                self.store(engine, pod, model, parent, hashes, tokens, &mut done)?;
            }
            EngineOp::Removed { hashes } => {
                self.remove(engine, pod, model, hashes, &mut done)?;
            }
        }
        Ok(done)
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
        let (spec, ratio) = (engine.spec, engine.ratio);
        let max_records = self.sh.cfg.max_engine_blocks;
        let max_key = self.sh.cfg.max_key_blocks;
        if !engine.models.contains_key(model) {
            engine.models.insert(model.into(), Records::default());
        }
        let Engine {
            models, waiting, ..
        } = &mut *engine;
        let Some(records) = models.get_mut(model) else {
            return Ok(());
        };
        // Whether a block became held: the event's path is then placed in
        // the tree once, to its last block (held blocks refresh as no-ops).
        let mut newly_held = false;
        let mut up = parent;
        for (i, &h) in hashes.iter().enumerate() {
            let toks = &tokens[i * spec.engine_block as usize..][..spec.engine_block as usize];
            let became_held = match records.get_mut(&h) {
                Some(r) => {
                    r.copies = r.copies.saturating_add(1);
                    r.copies == 1
                }
                None => {
                    if self.engine_records() >= max_records {
                        return Err(EngineError::Full { max: max_records });
                    }
                    let data = match ratio {
                        Ratio::Whole(_) => Data::whole(
                            toks.chunks_exact(spec.our_block as usize)
                                .map(spec.hash)
                                .collect(),
                        ),
                        Ratio::Pages(n) => {
                            let depth = match up.and_then(|p| records.get(&p)).map(|r| &r.data) {
                                Some(Data::Page(p)) => p.depth.saturating_add(1),
                                _ => 0,
                            };
                            let group = (depth % n == n - 1)
                                .then(|| group_hash(records, up, toks, n, spec))
                                .flatten();
                            Data::Page(Box::new(Page {
                                depth,
                                tokens: toks.into(),
                                group,
                            }))
                        }
                    };
                    let mut r = Record::new(up, 1, data);
                    for _ in 0..waiting.remove(&h).unwrap_or(0) {
                        r.add_child();
                    }
                    self.count_record(record_bytes(&r) as i64, 1);
                    records.insert(h, r);
                    match up.and_then(|p| records.get_mut(&p)) {
                        Some(p) => p.add_child(),
                        None => {
                            if let Some(p) = up {
                                *waiting.entry(p).or_default() += 1;
                            }
                        }
                    }
                    true
                }
            };
            done.stored += 1;
            newly_held |= became_held;
            up = Some(h);
        }
        let Some(last) = up.filter(|_| newly_held) else {
            return Ok(());
        };
        let extended = engine.chain_extended(model, parent, hashes, max_key);
        let align = engine.align();
        let Engine {
            models,
            chain,
            scratch,
            ..
        } = &mut *engine;
        let Some(records) = models.get(model) else {
            return Ok(());
        };
        let path = match extended {
            Some(()) => Ok(chain.as_ref().map_or(&[][..], |c| &c.ours[..])),
            None => chain_path(chain, scratch, records, ratio, model, last, max_key),
        };
        // Pages: our blocks are whole groups, held only while every page of
        // the group is; a path through a group missing a page stops before it.
        let key = match path {
            Ok(key) => key,
            Err(Placed::Orphan) => {
                done.orphaned += 1;
                return Ok(());
            }
            Err(Placed::TooDeep) => {
                done.too_deep += 1;
                return Ok(());
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
            return Ok(());
        }
        self.insert_at(model, key, pod, align, PINNED)
            .map_err(EngineError::Insert)
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
        for &h in hashes {
            // Removals name no model (no LoRA adapter): the event's model
            // first, then whichever holds the hash.
            let found = match engine.models.get(model).is_some_and(|r| r.contains_key(&h)) {
                true => Some(model),
                false => engine
                    .models
                    .iter()
                    .find(|(_, r)| r.contains_key(&h))
                    .map(|(m, _)| &**m),
            };
            let Some(found) = found.map(Box::<str>::from) else {
                done.unknown += 1;
                continue;
            };
            let model = &*found;
            {
                let Some(r) = engine.models.get_mut(model).and_then(|m| m.get_mut(&h)) else {
                    continue;
                };
                if r.copies == 0 {
                    done.unknown += 1;
                    continue;
                }
                r.copies -= 1;
                done.removed += 1;
                if r.copies > 0 {
                    continue;
                }
            }
            let Engine {
                models,
                chain,
                scratch,
                waiting,
                ..
            } = &mut *engine;
            let Some(records) = models.get_mut(model) else {
                continue;
            };
            let path = chain_path(chain, scratch, records, ratio, model, h, max_key);
            done.released += self.release_block(records, ratio, pod, model, h, path)?;
            let dropped = forget(records, waiting, h, |bytes| self.count_record(-bytes, -1));
            engine.chain_popped(h, dropped);
        }
        Ok(())
    }

    /// Takes `pod` off the tree's blocks of engine block `h` (no copy left).
    fn release_block(
        &self,
        records: &Records,
        ratio: Ratio,
        pod: &str,
        model: &str,
        h: u64,
        path: Result<&[u64], Placed>,
    ) -> Result<u64, EngineError> {
        let Some(r) = records.get(&h) else {
            return Ok(0);
        };
        // Placed nowhere (an orphan, or too deep): nothing to take off.
        let Ok(path) = path else {
            return Ok(0);
        };
        let id = self.precise_id(pod, ratio.align())?;
        let released = match (ratio, &r.data) {
            // The last of our blocks only: another engine block under the
            // same parent may share the ones before it (the same first
            // tokens), never the last (it would be the same block), and a
            // match ending inside an engine block rounds down to its start.
            (Ratio::Whole(_), _) => self.release_at(model, path, path.len().saturating_sub(1), id),
            (Ratio::Pages(_), Data::Page(p)) if p.group.is_some() => {
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
    /// under held ones.
    pub(crate) fn restore_engine(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        blocks: Vec<(u64, Record)>,
    ) -> Result<(), EngineError> {
        let max = self.sh.cfg.max_engine_blocks;
        if self.engine_records().saturating_add(blocks.len() as u64) > max {
            return Err(EngineError::Full { max });
        }
        let (ratio, align) = (engine.ratio, engine.align());
        let max_key = self.sh.cfg.max_key_blocks;
        let Engine {
            models, waiting, ..
        } = &mut *engine;
        let records = models.entry(model.into()).or_default();
        let mut parents = std::collections::HashSet::<u64, ahash::RandomState>::default();
        for (h, r) in blocks {
            if let Some(p) = r.parent() {
                parents.insert(p);
            }
            self.count_record(record_bytes(&r) as i64, 1);
            if let Some(old) = records.insert(h, r) {
                self.count_record(-(record_bytes(&old) as i64), -1);
            }
        }
        let child_counts: Vec<u64> = records.values().filter_map(Record::parent).collect();
        for p in child_counts {
            match records.get_mut(&p) {
                Some(r) => r.add_child(),
                None => *waiting.entry(p).or_default() += 1,
            }
        }
        let records = &*records;
        // Held blocks with no held child: their paths cover every held one.
        let held_parents: std::collections::HashSet<u64, ahash::RandomState> = records
            .values()
            .filter(|r| r.copies > 0)
            .filter_map(Record::parent)
            .collect();
        for (&h, r) in records {
            if r.copies == 0 || held_parents.contains(&h) {
                continue;
            }
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
        for (&h, r) in records {
            if r.copies == 0 && parents.contains(&h) {
                let path = Engine::path(records, ratio, h, max_key);
                self.release_block(
                    records,
                    ratio,
                    pod,
                    model,
                    h,
                    path.as_deref().map_err(|e| *e),
                )?;
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
    let mut at = parent;
    for _ in 1..n {
        let r = records.get(&at?)?;
        match &r.data {
            Data::Page(p) => pages.push(&p.tokens),
            Data::One(_) | Data::Many(_) => return None,
        }
        at = r.parent();
    }
    let tokens: Vec<u32> = pages.iter().rev().flat_map(|p| p.iter().copied()).collect();
    (tokens.len() == spec.our_block as usize).then(|| (spec.hash)(&tokens))
}

/// Cuts `key` (the groups on `last`'s path) at the first group with a page
/// not held, walking up from `last`.
fn held_groups(records: &Records, last: u64, n: u32, mut key: Vec<u64>) -> Vec<u64> {
    // Groups from the root: `key[k]` is closed by the page at depth
    // `k * n + n - 1`. A page's depth says its group.
    let mut at = Some(last);
    let mut first_missing: Option<usize> = None;
    while let Some(h) = at {
        let Some(r) = records.get(&h) else { break };
        if let Data::Page(p) = &r.data {
            if r.copies == 0 {
                first_missing = Some((p.depth / n) as usize);
            }
        }
        at = r.parent();
    }
    // Incomplete trailing group: `last` may not close one.
    if let Some(k) = first_missing {
        key.truncate(k);
    }
    key
}

/// Drops `h`'s record if it has neither copies nor children, and then any
/// parent left in that state; returns how many records went.
fn forget(
    records: &mut Records,
    waiting: &mut HashMap<u64, u32, ahash::RandomState>,
    mut h: u64,
    mut counted: impl FnMut(i64),
) -> usize {
    let mut dropped = 0;
    loop {
        let Some(r) = records.get(&h) else {
            return dropped;
        };
        if r.copies > 0 || r.children() > 0 {
            return dropped;
        }
        let Some(r) = records.remove(&h) else {
            return dropped;
        };
        dropped += 1;
        counted(record_bytes(&r) as i64);
        let Some(p) = r.parent() else {
            return dropped;
        };
        let Some(pr) = records.get_mut(&p) else {
            // It waited for its parent: one waiting child less.
            if let Some(n) = waiting.get_mut(&p) {
                *n -= 1;
                if *n == 0 {
                    waiting.remove(&p);
                }
            }
            return dropped;
        };
        pr.drop_child();
        h = p;
    }
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
    }
}
