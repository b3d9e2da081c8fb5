//! One model's radix tree: insert, lookup, and the two structural changes
//! (edge split, unlink of an empty node) that writers and the sweep share.
//!
//! See the crate docs for the algorithm; this file is its code. It walks and
//! changes nodes only through `node_ref` (pinned references, locks) and
//! `walk` (descents), so all of it is safe code.

use smallvec::SmallVec;

use crate::aliases::Aliases;
use crate::children::Children;
use crate::error::InsertError;
use crate::node::Node;
use crate::node_ref::{NodeRef, Root};
use crate::pods::{PodId, NOT_LIVE, UNRANKED};
use crate::reclaim::Pin;
use crate::shared::Shared;
use crate::slots::{Entries, Refresh};
use crate::stats::Counters;
use crate::walk::{self, Path};

/// One pod's answer to a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Match {
    /// The pod.
    pub pod: PodId,
    /// How many leading blocks of the key it holds (at least 1).
    pub blocks: u32,
}

/// The tree of one model. The root has an empty edge and never holds pods.
pub(crate) struct Tree {
    root: Root,
    /// The model's engine blocks' names in other indexers' hashes.
    pub(crate) aliases: Aliases,
}

/// What an insert does after one step.
enum Step<'g> {
    /// Continue below this node, at this depth.
    Descend(NodeRef<'g>, usize),
    /// Read the same level again (another writer changed it first).
    Again,
    /// Start over from the root (a node on the way was sealed).
    Restart,
}

impl Tree {
    pub(crate) fn new() -> Self {
        Tree {
            root: Root::new(),
            aliases: Aliases::default(),
        }
    }

    /// The root, under `pin` (of the index that owns this tree).
    #[inline]
    pub(crate) fn root<'g>(&'g self, pin: &'g Pin) -> NodeRef<'g> {
        self.root.get(pin)
    }

    /// Records that `pod` holds every prefix of `key`, last used at `now`.
    pub(crate) fn insert(
        &self,
        sh: &Shared,
        key: &[u64],
        pod: u32,
        now: u64,
        pin: &Pin,
    ) -> Result<(), InsertError> {
        self.insert_from(sh, key, 0, pod, now, pin)
    }

    /// Records that `pod` holds blocks `from..key.len()` of `key`'s path,
    /// last used at `now`, and nothing above them: the path's nodes above
    /// `from` are made (without entries) or cut at `from` as needed, and
    /// keep their entries. A KV-cache group of a hybrid model holds blocks
    /// without their ancestors (a sliding window frees the blocks it has
    /// moved past).
    pub(crate) fn insert_from(
        &self,
        sh: &Shared,
        key: &[u64],
        from: usize,
        pod: u32,
        now: u64,
        pin: &Pin,
    ) -> Result<(), InsertError> {
        'restart: loop {
            let mut node = self.root(pin);
            let mut depth = 0;
            while depth < key.len() {
                let rest = &key[depth..];
                let step = match walk::step(node, rest, sh.seed) {
                    None if depth < from => bare_leaf(sh, node, &key[depth..from], depth, pin),
                    None => add_leaf(sh, node, rest, pod, now, pin)?,
                    // Above the range: the key's nodes there keep their
                    // entries; one it leaves, or that runs into the range,
                    // is cut where it does (the halves keep the entries).
                    Some((c, m)) if depth < from => {
                        let cut = m.min(from - depth);
                        if cut == c.edge.len() {
                            Step::Descend(c, depth + cut)
                        } else {
                            match split(sh, node, c, cut, |_| Ok::<(), ()>(()), |_, _| {}, pin) {
                                Ok(Some(_)) => Step::Again,
                                _ => Step::Restart,
                            }
                        }
                    }
                    Some((c, m)) if m == c.edge.len() => match c.pods.refresh(pod, now) {
                        Refresh::Done => Step::Descend(c, depth + m),
                        Refresh::Sealed => Step::Restart,
                        Refresh::Missing => add_pod(sh, c, pod, now, depth + m)?,
                    },
                    Some((c, m)) => split_for_insert(sh, node, c, m, pod, now, depth, pin)?,
                };
                match step {
                    Step::Descend(next, d) => {
                        node = next;
                        depth = d;
                    }
                    Step::Again => {}
                    Step::Restart => continue 'restart,
                }
            }
            return Ok(());
        }
    }

    /// Takes `pod` off blocks `from..key.len()` of `key`'s path, splitting
    /// edges at both ends so that blocks outside that range keep their
    /// entries (a precise pod's engine removed those blocks and nothing
    /// else). Returns the (pod, block) pairs removed, and whether the pod
    /// still has an entry below the range (the range is then a gap): on a
    /// child of its last node, or on a branch leaving the path inside it.
    ///
    /// One call for a run of blocks ends as a call per block, deepest
    /// first, would: nodes of the range left with no pod and no child are
    /// unlinked, deepest first, at once (an engine evicts one block at a
    /// time, and lookups would otherwise walk through the empty nodes until
    /// the next sweep).
    pub(crate) fn release(
        &self,
        sh: &Shared,
        key: &[u64],
        from: usize,
        pod: u32,
        pin: &Pin,
    ) -> (u64, bool) {
        let mut released = 0;
        // Whether a child of `node` other than the one starting with
        // `next` (the path's) holds the pod.
        let below = |node: NodeRef<'_>, next: Option<u64>| {
            let table = node.children();
            (0..table.slots())
                .filter_map(|i| table.slot(i))
                .filter(|c| Some(c.edge.first().copied().unwrap_or(0)) != next)
                .any(|c| c.pods.find(pod).is_some())
        };
        // The nodes the pod left, with their parents, top-down (kept over
        // restarts: the pod is gone from them, and a walk again would not
        // find it there).
        let mut left: SmallVec<[(NodeRef<'_>, NodeRef<'_>); 8]> = SmallVec::new();
        let mut gap;
        'restart: loop {
            gap = false;
            let mut node = self.root(pin);
            let mut depth = 0;
            while depth < key.len() {
                let Some((c, m)) = walk::step(node, &key[depth..], sh.seed) else {
                    break;
                };
                let whole = m == c.edge.len();
                if depth + m <= from {
                    if !whole {
                        // The key leaves the tree before the range starts.
                        break;
                    }
                    node = c;
                    depth += m;
                    continue;
                }
                if c.pods.find(pod).is_some() {
                    // Cut the node down to the range first: the halves keep
                    // the entries, so splits change no count.
                    let cut = if depth < from {
                        Some(from - depth)
                    } else if !whole {
                        Some(m)
                    } else {
                        None
                    };
                    if let Some(at) = cut {
                        match split(sh, node, c, at, |_| Ok::<(), ()>(()), |_, _| {}, pin) {
                            Ok(Some(_)) => continue,
                            _ => continue 'restart,
                        }
                    }
                    {
                        let Some(locked) = c.lock() else {
                            continue 'restart;
                        };
                        if locked.pods.remove_if(pod, |_| true).is_some() {
                            let len = c.edge.len() as i64;
                            sh.pods.add_blocks(pod, -len);
                            Counters::add(&sh.counters.entries, -len);
                            released += len as u64;
                        }
                    }
                    left.push((node, c));
                }
                if !whole {
                    break;
                }
                depth += m;
                gap |= below(c, key.get(depth).copied());
                node = c;
            }
            break;
        }
        // Deepest first, so that each node's only child is gone when it is
        // tried. `unlink` checks again under the locks, and refuses a node
        // another writer replaced or unlinked meanwhile.
        for &(parent, c) in left.iter().rev() {
            if c.pods.is_empty() && c.children().len() == 0 {
                unlink(sh, parent, c, pin);
            }
        }
        (released, gap)
    }

    /// The first blocks of every continuation of `prefix` in the tree: the
    /// children of the node where it ends, or the next block of the edge it
    /// ends inside. Empty when the tree does not hold `prefix`.
    pub(crate) fn continuations(&self, sh: &Shared, prefix: &[u64], pin: &Pin) -> Vec<u64> {
        let mut node = self.root(pin);
        let mut depth = 0;
        while depth < prefix.len() {
            let Some((c, m)) = walk::step(node, &prefix[depth..], sh.seed) else {
                return Vec::new();
            };
            if m < c.edge.len() {
                return match depth + m == prefix.len() {
                    true => vec![c.edge[m]],
                    false => Vec::new(),
                };
            }
            node = c;
            depth += m;
        }
        let table = node.children();
        (0..table.slots())
            .filter_map(|i| table.slot(i))
            .map(|c| c.edge[0])
            .collect()
    }

    /// The nodes on `key`'s path, each with the depth its edge ends at.
    pub(crate) fn path<'g>(
        &'g self,
        sh: &Shared,
        key: &[u64],
        pin: &'g Pin,
    ) -> SmallVec<[(NodeRef<'g>, u32); 16]> {
        let mut path = SmallVec::new();
        self.path_into(sh, key, pin, &mut path);
        path
    }

    /// [`Tree::path`] into `path` (a lookup's own: a path returned by
    /// value is copied, about 3% of a lookup).
    #[inline]
    fn path_into<'g>(
        &'g self,
        sh: &Shared,
        key: &[u64],
        pin: &'g Pin,
        path: &mut SmallVec<[(NodeRef<'g>, u32); 16]>,
    ) {
        for (node, depth) in Path::new(self.root(pin), key, sh.seed) {
            // Keys are cut to `max_key_blocks` (< 2^32) before they get here.
            path.push((node, depth as u32));
        }
    }

    /// Appends to `out` every live pod (or candidate) holding a prefix of `key`,
    /// with its matched length, sorted by length descending then pod name.
    /// One walk; no store to shared memory; no lock; no retry. `candidates`
    /// are pod ids, sorted, without repeats. The matches of pods whose
    /// entries alone do not give them (`Pods::needs_pass`) are `layer`'s to
    /// finish.
    // The query (key, candidates, time), what it reads (the shared state
    // under `pin`), where it answers and the layer above: a struct of them
    // would be built per lookup for this one call.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lookup(
        &self,
        sh: &Shared,
        key: &[u64],
        candidates: Option<&[u32]>,
        now: u64,
        pin: &Pin,
        out: &mut Vec<Match>,
        layer: &impl Finish,
    ) {
        let first_match = out.len();
        let mut path = SmallVec::new();
        self.path_into(sh, key, pin, &mut path);
        // Deepest first: a pod's answer is the deepest node where it is visible,
        // so answers come out by blocks descending, one node's pods at a time.
        // Within a node they are ordered by name rank through a bitmap: no
        // comparison sort on the hot path.
        let ranks = sh.pods.ranks(pin);
        // Ranked pods (live in this table, of any model) not found yet. Once
        // it reaches zero the shallower nodes can add nothing, so their pod
        // words (often chunks of their own, one cache miss each) are never
        // read: with every pod on every node, only the deepest node's pods
        // are. A pod the table does not rank (or ranks as not live) was
        // named after the table was published (`Pods::intern` ranks before
        // it names), so its inserts are concurrent with this lookup, which
        // may miss them (see the crate docs).
        let mut wanted = match candidates {
            None => ranks.len(),
            Some(c) => {
                debug_assert!(c.windows(2).all(|w| w[0] < w[1]), "sorted, no repeats");
                c.iter().filter(|&&id| ranks.rank(id) < NOT_LIVE).count()
            }
        };
        let mut seen = Seen::default();
        // Built on first need: fleets of 64 pods or fewer never touch it.
        let mut group: Option<Box<RankGroup>> = None;
        for &(n, blocks) in path.iter().rev() {
            if wanted == 0 {
                break;
            }
            let mut first = 0u64;
            for (pod, time) in n.pods.entries() {
                if seen.contains(pod) || now.saturating_sub(time) > sh.ttl_ms {
                    continue;
                }
                let rank = ranks.rank(pod);
                if rank == NOT_LIVE
                    || (rank == UNRANKED && !sh.pods.is_match(pod))
                    || candidates.is_some_and(|c| c.binary_search(&pod).is_err())
                {
                    continue;
                }
                seen.insert(pod);
                if rank != UNRANKED {
                    // Each ranked pod passes here once (`seen`), and only
                    // those counted in `wanted` pass the filters above.
                    debug_assert!(wanted > 0);
                    wanted -= 1;
                }
                // Ranks below 64 (fleets of up to 64 pods) stay in a register.
                if rank < 64 {
                    first |= 1 << rank;
                } else {
                    group.get_or_insert_default().add(rank, pod);
                }
                if wanted == 0 {
                    break;
                }
            }
            while first != 0 {
                out.push(Match {
                    pod: PodId(ranks.id(first.trailing_zeros())),
                    blocks,
                });
                first &= first - 1;
            }
            if let Some(g) = group.as_mut() {
                g.drain(ranks, |pod| {
                    out.push(Match {
                        pod: PodId(pod),
                        blocks,
                    })
                });
            }
        }
        if !sh.pods.any_precise() {
            return;
        }
        let found = &mut out[first_match..];
        if found.iter().any(|m| sh.pods.needs_pass(m.pod.0)) {
            layer.finish(sh, &path, now, found, pin);
            found.sort_by_key(|m| (std::cmp::Reverse(m.blocks), ranks.rank(m.pod.0)));
            out.retain(|m| m.blocks > 0);
        }
    }
}

/// What a lookup leaves to the layer above the tree (precise mode). The
/// tree answers each pod with the deepest node of the key's path where the
/// pod is visible, which is its match when it holds every node above: true
/// of a pod fed by gateways alone. For an engine-fed pod it may not be (a
/// gap its engine evicted, KV-cache groups, engine blocks larger than
/// ours), and only the layer knows why: given the path walked (each node
/// with the depth its edge ends at) and the lookup's matches (`found`, all
/// of them; it is called only when one is such a pod's), `finish` cuts each
/// engine-fed pod's to what the pod holds and leaves the others as they
/// are. The tree then restores the answer's order and drops the matches
/// cut to nothing.
pub(crate) trait Finish {
    fn finish(&self, sh: &Shared, path: &Walked<'_>, now: u64, found: &mut [Match], pin: &Pin);
}

/// The path a lookup walked: each node with the depth its edge ends at.
pub(crate) type Walked<'g> = [(NodeRef<'g>, u32)];

/// The pods of rank 64 and up found at one node, ordered by rank when drained.
struct RankGroup {
    /// Ranks below `64 * RANK_WORDS`, as bits.
    bits: [u64; RANK_WORDS],
    /// Which words of `bits` are in use.
    used: u64,
    /// Pods with larger (or unknown) ranks: (rank, id), sorted when drained.
    rest: SmallVec<[(u32, u32); 4]>,
}

/// 64 words of 64 bits: one `u64` says which words are in use.
const RANK_WORDS: usize = 64;

impl Default for RankGroup {
    fn default() -> Self {
        RankGroup {
            bits: [0; RANK_WORDS],
            used: 0,
            rest: SmallVec::new(),
        }
    }
}

impl RankGroup {
    #[inline]
    fn add(&mut self, rank: u32, pod: u32) {
        let w = (rank / 64) as usize;
        if w < RANK_WORDS {
            self.bits[w] |= 1 << (rank % 64);
            self.used |= 1 << w;
        } else {
            self.rest.push((rank, pod));
        }
    }

    #[inline]
    fn drain(&mut self, ranks: &crate::pods::Ranks, mut emit: impl FnMut(u32)) {
        let mut used = std::mem::take(&mut self.used);
        while used != 0 {
            let w = used.trailing_zeros();
            used &= used - 1;
            let mut x = std::mem::take(&mut self.bits[w as usize]);
            while x != 0 {
                // w < 64 and the bit index < 64: the rank fits in u32.
                emit(ranks.id(w * 64 + x.trailing_zeros()));
                x &= x - 1;
            }
        }
        if !self.rest.is_empty() {
            self.rest.sort_unstable();
            self.rest.drain(..).for_each(|(_, pod)| emit(pod));
        }
    }
}

/// Pods already answered in one lookup: a bitmap for small ids, a list beyond.
#[derive(Default)]
struct Seen {
    low: [u64; 4],
    high: SmallVec<[u32; 8]>,
}

impl Seen {
    #[inline]
    fn contains(&self, pod: u32) -> bool {
        match self.low.get((pod / 64) as usize) {
            Some(word) => *word & (1u64 << (pod % 64)) != 0,
            None => self.high.contains(&pod),
        }
    }

    /// Adds a pod not yet in the set.
    #[inline]
    fn insert(&mut self, pod: u32) {
        match self.low.get_mut((pod / 64) as usize) {
            Some(word) => *word |= 1u64 << (pod % 64),
            None => self.high.push(pod),
        }
    }
}

/// Counts `n` more (pod, block) pairs for `pod`, unless that passes `max_blocks`.
fn reserve(sh: &Shared, pod: u32, n: usize) -> Result<(), InsertError> {
    let n = n as i64;
    let max = sh.cfg.max_blocks;
    if !Counters::add_within(&sh.counters.entries, n, max) {
        return Err(InsertError::Full { max });
    }
    sh.pods.add_blocks(pod, n);
    Ok(())
}

/// Hangs a new leaf of `edge` without entries under `parent`, to go on
/// below it (an insert whose range starts past it); `depth` is where the
/// edge starts.
fn bare_leaf<'g>(
    sh: &Shared,
    parent: NodeRef<'g>,
    edge: &[u64],
    depth: usize,
    pin: &'g Pin,
) -> Step<'g> {
    let Some(parent) = parent.lock() else {
        return Step::Restart;
    };
    if parent.child(edge[0], sh.seed).is_some() {
        return Step::Again;
    }
    let leaf = Node::new(edge, &[], Children::new());
    let leaf_bytes = leaf.bytes() as i64;
    let (leaf, table_bytes) = parent.add_child(leaf, sh.seed, &sh.epoch, pin);
    Counters::add(&sh.counters.nodes, 1);
    Counters::add(&sh.counters.tree_blocks, edge.len() as i64);
    Counters::add(&sh.counters.bytes, leaf_bytes + table_bytes as i64);
    Step::Descend(leaf, depth + edge.len())
}

/// Hangs a new leaf holding `rest` under `parent`.
fn add_leaf<'g>(
    sh: &Shared,
    parent: NodeRef<'g>,
    rest: &[u64],
    pod: u32,
    now: u64,
    pin: &'g Pin,
) -> Result<Step<'g>, InsertError> {
    let Some(parent) = parent.lock() else {
        return Ok(Step::Restart);
    };
    if parent.child(rest[0], sh.seed).is_some() {
        return Ok(Step::Again);
    }
    reserve(sh, pod, rest.len())?;
    let leaf = Node::new(rest, &[(pod, now)], Children::new());
    // Counted before publishing: afterwards writers may grow it (and count that).
    let leaf_bytes = leaf.bytes() as i64;
    let (leaf, table_bytes) = parent.add_child(leaf, sh.seed, &sh.epoch, pin);
    Counters::add(&sh.counters.nodes, 1);
    Counters::add(&sh.counters.tree_blocks, rest.len() as i64);
    Counters::add(&sh.counters.bytes, leaf_bytes + table_bytes as i64);
    // The key ends in the new leaf: nothing is left below it.
    Ok(Step::Descend(leaf, usize::MAX))
}

/// Gives `pod` an entry on `node`, whose whole edge the key covers.
fn add_pod<'g>(
    sh: &Shared,
    node: NodeRef<'g>,
    pod: u32,
    now: u64,
    depth: usize,
) -> Result<Step<'g>, InsertError> {
    let Some(locked) = node.lock() else {
        return Ok(Step::Restart);
    };
    // Another writer may have added it while we waited for the lock.
    match locked.pods.refresh(pod, now) {
        Refresh::Done => return Ok(Step::Descend(node, depth)),
        Refresh::Sealed => return Ok(Step::Restart),
        Refresh::Missing => {}
    }
    reserve(sh, pod, node.edge.len())?;
    let bytes = locked.pods.add(pod, now);
    Counters::add(&sh.counters.bytes, bytes as i64);
    Ok(Step::Descend(node, depth))
}

/// Splits `child` (under `parent`) after `m` blocks because the key diverges or
/// ends there, and gives `pod` the upper half.
#[allow(clippy::too_many_arguments)]
fn split_for_insert<'g>(
    sh: &Shared,
    parent: NodeRef<'g>,
    child: NodeRef<'g>,
    m: usize,
    pod: u32,
    now: u64,
    depth: usize,
    pin: &'g Pin,
) -> Result<Step<'g>, InsertError> {
    let upper = split(
        sh,
        parent,
        child,
        m,
        |c| match c.pods.find(pod) {
            Some(_) => Ok(()),
            None => reserve(sh, pod, m),
        },
        |upper, _| match upper.iter_mut().find(|e| e.0 == pod) {
            Some(e) => e.1 = e.1.max(now.min(crate::slots::MAX_TIME)),
            None => upper.push((pod, now)),
        },
        pin,
    )?;
    Ok(match upper {
        Some(u) => Step::Descend(u, depth + m),
        None => Step::Restart,
    })
}

/// Replaces `node` (a child of `parent`) by an upper node holding its first `m`
/// blocks and a lower one holding the rest and its children. `check` runs under
/// both locks before anything changes and may refuse; `edit` adjusts the
/// entries of the upper and lower halves (both start as the sealed node's).
/// Returns the upper node, or `None` if a concurrent change got there first.
pub(crate) fn split<'g, E>(
    sh: &Shared,
    parent: NodeRef<'g>,
    node: NodeRef<'g>,
    m: usize,
    check: impl FnOnce(&Node) -> Result<(), E>,
    edit: impl FnOnce(&mut Entries, &mut Entries),
    pin: &'g Pin,
) -> Result<Option<NodeRef<'g>>, E> {
    let Some(parent) = parent.lock() else {
        return Ok(None);
    };
    let Some(node) = parent.lock_child(node, sh.seed) else {
        return Ok(None);
    };
    check(&node)?;
    let (upper, grown) = node.split(m, edit, sh.seed, &sh.epoch, pin);
    Counters::add(&sh.counters.nodes, 1);
    Counters::add(&sh.counters.bytes, grown as i64);
    Ok(Some(upper))
}

/// Unlinks `node` from `parent` if it holds no pod and no child.
pub(crate) fn unlink<'g>(
    sh: &Shared,
    parent: NodeRef<'g>,
    node: NodeRef<'g>,
    pin: &'g Pin,
) -> bool {
    let Some(parent) = parent.lock() else {
        return false;
    };
    let Some(child) = parent.lock_child(node, sh.seed) else {
        return false;
    };
    if !child.unlink(sh.seed, &sh.epoch, pin) {
        return false;
    }
    Counters::add(&sh.counters.nodes, -1);
    Counters::add(&sh.counters.tree_blocks, -(node.edge.len() as i64));
    true
}

/// Entries as a plain list, for tests and the sweep.
pub(crate) fn entries_of(node: &Node) -> Entries {
    let mut out = Entries::new();
    node.pods.for_each(|p, t| out.push((p, t)));
    out
}

#[cfg(all(test, not(loom)))]
mod tests;
