//! The chain cache and the run of removals: what an engine's last events
//! walked, kept so that the next event (most often the same sequence,
//! extended or freed tail first) needs no walk to the root.

use super::{Engine, Parent, Ratio, Records};

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
pub(super) struct Run {
    pub(super) model: Box<str>,
    /// The path of the run's deepest block, or empty (no run).
    pub(super) key: Vec<u64>,
    pub(super) from: usize,
}

impl Run {
    /// Whether releasing the last block of `path` under `model` extends
    /// the run (the block is the one just above it).
    pub(super) fn extended_by(&self, model: &str, path: &[u64]) -> bool {
        !path.is_empty()
            && path.len() == self.from
            && *self.model == *model
            && self.key.get(..path.len()) == Some(path)
    }
}

/// A chain of records from the root, as [`Engine::path`] walks it.
#[derive(Debug, Default)]
pub(super) struct Chain {
    pub(super) model: Box<str>,
    /// Engine hashes, root first.
    pub(super) engine: Vec<u64>,
    /// Our hashes, root first (`r` per engine block).
    pub(super) ours: Vec<u64>,
}

/// The chain cache after the record of `hash` was dropped (`dropped` is how
/// many records went: past the tip, the chain names records that are no
/// more, and the cache goes).
pub(super) fn chain_popped(chain: &mut Option<Chain>, ratio: Ratio, hash: u64, dropped: usize) {
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
pub(super) fn extend_chain(
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
pub(super) fn chain_path<'c>(
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
pub(super) enum Placed {
    Orphan,
    TooDeep,
}

impl Placed {
    /// Counts a store left out of the tree for this reason.
    pub(super) fn count(self, done: &mut super::Applied) {
        match self {
            Placed::Orphan => done.orphaned += 1,
            Placed::TooDeep => done.too_deep += 1,
        }
    }
}
