//! The sweep: bounded, resumable passes that reclaim expired and removed
//! entries, enforce pod capacities and the global bound, and unlink empty nodes.
//!
//! A **pass** visits every node of every model in post-order (children before
//! their parent), spread over as many [`crate::Index::sweep`] calls as its
//! budget needs. It is a `Walk` (see the `walk` module), left at each
//! node in post-order. Between calls its position is kept as `Mark`s
//! (first block, next child slot, table identity per level); a call
//! re-descends by those keys, and restarts a level whose table changed
//! (revisiting is harmless, every step is idempotent).
//!
//! At each node, under its lock, the sweep removes entries whose pod was
//! removed, whose TTL passed, or that fall under an eviction cutoff, then
//! unlinks the node if it is left with no pod and no child. Post-order keeps
//! the invariant `pods(parent) ⊇ pods(child)`: a parent's entry for a pod is
//! never older than its children's, so whatever rule removes it has already
//! removed theirs.
//!
//! **Capacity.** A pod's blocks are ordered by (last used, deeper first): the
//! order in which its own KV cache evicts them. A pass *measures* each pod over
//! capacity (keeping, in a bounded heap, its oldest entries that cover the
//! excess) and ends with a cutoff `(time, depth)`; the next pass evicts every
//! block of that pod at or below the cutoff, splitting an edge when the cutoff
//! falls inside it. With an unlimited budget one call runs both passes, so a
//! single-threaded caller sees exactly the model's LRU order. The global
//! `max_blocks` bound works the same way over all pods, on whole entries.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use smallvec::SmallVec;

use crate::node::Node;
use crate::node_ref::NodeRef;
use crate::reclaim::Pin;
use crate::shared::Shared;
use crate::stats::Counters;
use crate::tree::{self, Tree};
use crate::walk::{Mark, Walk};

/// What one [`crate::Index::sweep`] call did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// Nodes visited (the budget counts these).
    pub visited: u64,
    /// (pod, block) pairs removed because their TTL passed.
    pub expired: u64,
    /// (pod, block) pairs evicted for a capacity or the global bound.
    pub evicted: u64,
    /// (pod, block) pairs of removed pods freed.
    pub purged: u64,
    /// Nodes unlinked.
    pub unlinked: u64,
    /// Passes completed during this call.
    pub passes: u64,
    /// Bytes returned to the allocator by this call's reclamation.
    pub reclaimed_bytes: u64,
}

/// How far a sweep evicted entries: every block last used before `time`,
/// and those last used at `time` from depth `depth` on (the blocks a
/// cutoff takes, in the order a pod's own cache evicts them). Ordered by
/// how far that is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Through {
    /// The newest last use evicted (ms).
    pub time: u64,
    /// From this depth on, at `time`.
    pub depth: u32,
}

impl Through {
    fn of(time: u64, depth: usize) -> Through {
        Through {
            time,
            depth: u32::try_from(depth).unwrap_or(u32::MAX),
        }
    }

    /// Whether an entry last used at `time` may have been evicted: never
    /// copied back from a replica that kept it.
    pub fn covers(&self, time: u64) -> bool {
        time <= self.time
    }
}

impl Ord for Through {
    fn cmp(&self, other: &Through) -> std::cmp::Ordering {
        (self.time, Reverse(self.depth)).cmp(&(other.time, Reverse(other.depth)))
    }
}

impl PartialOrd for Through {
    fn partial_cmp(&self, other: &Through) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A pod's eviction cutoff: every block with (time, −depth) ≤ (time, −depth).
#[derive(Debug, Clone, Copy)]
struct Cutoff {
    time: u64,
    depth: usize,
}

enum Verdict {
    Keep,
    Evict,
    /// Evict the blocks from this offset into the edge on.
    EvictFrom(usize),
}

impl Cutoff {
    /// Whichever of two cutoffs evicts more (a later time, or a shallower
    /// depth at the same time).
    fn max(self, other: Cutoff) -> Cutoff {
        if (other.time, Reverse(other.depth)) > (self.time, Reverse(self.depth)) {
            other
        } else {
            self
        }
    }

    fn judge(&self, time: u64, d0: usize, d1: usize) -> Verdict {
        if time < self.time || (time == self.time && d0 >= self.depth) {
            Verdict::Evict
        } else if time > self.time || d1 <= self.depth {
            Verdict::Keep
        } else {
            Verdict::EvictFrom(self.depth - d0)
        }
    }
}

/// The oldest entries seen so far that cover `bound` blocks.
#[derive(Default)]
struct Measure {
    bound: u64,
    sum: u64,
    /// Max-heap of (time, Reverse(start depth), end depth): newest on top.
    heap: BinaryHeap<(u64, Reverse<usize>, usize)>,
}

impl Measure {
    fn new(bound: u64) -> Self {
        Measure {
            bound,
            ..Measure::default()
        }
    }

    fn push(&mut self, time: u64, d0: usize, d1: usize) {
        self.heap.push((time, Reverse(d0), d1));
        self.sum += (d1 - d0) as u64;
        self.trim(self.bound);
    }

    fn trim(&mut self, need: u64) {
        while let Some(&(_, Reverse(d0), d1)) = self.heap.peek() {
            let len = (d1 - d0) as u64;
            if self.sum - len < need {
                break;
            }
            self.heap.pop();
            self.sum -= len;
        }
    }

    /// The key of the newest whole entry to evict so that at least `excess`
    /// blocks go (the global bound evicts whole entries).
    fn entry_cutoff(mut self, excess: u64) -> Option<(u64, Reverse<usize>)> {
        if excess == 0 {
            return None;
        }
        self.trim(excess);
        self.heap.peek().map(|&(time, d0, _)| (time, d0))
    }

    /// The cutoff that evicts `excess` blocks (all it saw, if it saw fewer).
    fn cutoff(mut self, excess: u64) -> Option<Cutoff> {
        if excess == 0 {
            return None;
        }
        self.trim(excess);
        let &(time, Reverse(d0), d1) = self.heap.peek()?;
        let len = (d1 - d0) as u64;
        let take = excess.saturating_sub(self.sum - len).min(len) as usize;
        Some(Cutoff {
            time,
            depth: d1 - take,
        })
    }
}

/// Where a node sits, and whether capacity and global evictions may act on it.
#[derive(Clone, Copy)]
struct Span {
    /// Depth at the start of its edge.
    d0: usize,
    /// Depth at the end of its edge.
    d1: usize,
    /// False when part of its subtree went unswept in this pass.
    evict: bool,
}

/// What sweeping one node did.
enum Visited<'g> {
    Done,
    /// It (or its parent) was replaced by a writer: not swept in this pass.
    Sealed,
    /// A partial eviction split it; both halves still need sweeping.
    Split {
        upper: NodeRef<'g>,
        lower: NodeRef<'g>,
        k: usize,
    },
}

/// Sweep progress, kept between calls. Only the maintenance caller touches it.
#[derive(Default)]
pub(crate) struct Sweeper {
    in_pass: bool,
    /// When the last pass began (the `now` of that call).
    last_pass: Option<u64>,
    trees: Vec<Arc<Tree>>,
    tree: usize,
    /// Where the walk of `trees[tree]` stopped. Each level carries a "dirty"
    /// flag: part of that node's subtree was replaced while the pass walked
    /// it, so some descendants may not have been swept, and evicting from the
    /// node could leave a descendant holding a pod its parent no longer holds.
    marks: Vec<Mark<bool>>,
    cutoffs: HashMap<u32, Cutoff>,
    global_cutoff: Option<(u64, Reverse<usize>)>,
    measures: HashMap<u32, Measure>,
    global: Option<Measure>,
    next_cutoffs: HashMap<u32, Cutoff>,
    next_global: Option<(u64, Reverse<usize>)>,
    /// Per live pod, the newest time up to which a pass evicted its entries
    /// for its capacity; and the same for the global bound, over all pods:
    /// what repair must not copy back.
    evicted: HashMap<u32, Through>,
    global_evicted: Option<Through>,
}

/// At most this many passes in one call (the end of a resumed pass, a full
/// pass that measures, one that evicts, one to spare), so a call with an
/// unlimited budget ends even while writers keep pods over capacity.
const MAX_PASSES_PER_CALL: u64 = 4;

impl Sweeper {
    pub(crate) fn sweep(
        &mut self,
        sh: &Shared,
        trees: impl Fn() -> Vec<Arc<Tree>>,
        now: u64,
        mut budget: usize,
        pin: &Pin,
    ) -> SweepReport {
        let mut report = SweepReport::default();
        // A pass resumed from an earlier call may predate models or entries
        // added since; only a pass begun in this call lets it stop early.
        let mut fresh = false;
        loop {
            if !self.in_pass {
                self.begin_pass(sh, trees());
                self.last_pass = Some(now);
                fresh = true;
            }
            if !self.walk(sh, now, &mut budget, pin, &mut report) {
                break;
            }
            let more = self.end_pass(sh, pin);
            report.passes += 1;
            if (fresh && !more) || budget == 0 || report.passes >= MAX_PASSES_PER_CALL {
                break;
            }
        }
        report
    }

    /// Makes the next pass evict the entries of pod `id` that `through`
    /// covers, unless a pass evicted as far already (for its capacity or
    /// the global bound).
    pub(crate) fn evict_through(&mut self, id: u32, through: Through) {
        let done = self.evicted.get(&id).copied().max(self.global_evicted);
        if done.is_some_and(|t| t >= through) {
            return;
        }
        let c = Cutoff {
            time: through.time,
            depth: through.depth as usize,
        };
        let next = self.next_cutoffs.entry(id).or_insert(c);
        *next = next.max(c);
    }

    /// Up to when each pod's entries were evicted (see `evicted`), by id,
    /// and the global bound's.
    pub(crate) fn evicted(&self) -> (&HashMap<u32, Through>, Option<Through>) {
        (&self.evicted, self.global_evicted)
    }

    /// Whether a call would have work: see `Index::sweep_due`.
    pub(crate) fn due(&self, sh: &Shared, now: u64) -> bool {
        if self.in_pass || !self.next_cutoffs.is_empty() || self.next_global.is_some() {
            return true;
        }
        if Counters::get(&sh.counters.entries) > sh.global_target() || sh.pods.removals_pending() {
            return true;
        }
        let over = sh
            .pods
            .ids_in_use()
            .any(|id| sh.pods.is_live(id) && sh.pods.blocks(id) > sh.pods.capacity(id));
        if over {
            return true;
        }
        let stored =
            Counters::get(&sh.counters.entries) > 0 || Counters::get(&sh.counters.nodes) > 0;
        let expiry_period = (sh.ttl_ms / 8).max(1);
        stored
            && self
                .last_pass
                .is_none_or(|t| now.saturating_sub(t) >= expiry_period)
    }

    fn begin_pass(&mut self, sh: &Shared, trees: Vec<Arc<Tree>>) {
        self.in_pass = true;
        self.trees = trees;
        self.tree = 0;
        self.marks.clear();
        self.cutoffs = std::mem::take(&mut self.next_cutoffs);
        self.global_cutoff = self.next_global.take();
        self.evicted.retain(|&id, _| sh.pods.is_live(id));
        for (&id, c) in &self.cutoffs {
            let through = Through::of(c.time, c.depth);
            let t = self.evicted.entry(id).or_insert(through);
            *t = (*t).max(through);
        }
        if let Some((time, Reverse(depth))) = self.global_cutoff {
            let through = Through::of(time, depth);
            self.global_evicted = self.global_evicted.max(Some(through));
        }
        self.measures.clear();
        for id in sh.pods.ids_in_use() {
            let (blocks, cap) = (sh.pods.blocks(id), sh.pods.capacity(id));
            if sh.pods.is_live(id) && blocks > cap {
                self.measures.insert(id, Measure::new(blocks - cap));
            }
        }
        let entries = Counters::get(&sh.counters.entries);
        let target = sh.global_target();
        self.global = (entries > target).then(|| Measure::new(entries - target));
    }

    /// Ends a pass: turns measures into the next pass's cutoffs, frees the ids
    /// of drained removed pods. Returns whether another pass has work to do.
    fn end_pass(&mut self, sh: &Shared, pin: &Pin) -> bool {
        self.in_pass = false;
        self.trees.clear();
        for (id, m) in self.measures.drain() {
            let excess = sh.pods.blocks(id).saturating_sub(sh.pods.capacity(id));
            if let Some(c) = m.cutoff(excess) {
                let next = self.next_cutoffs.entry(id).or_insert(c);
                *next = next.max(c);
            }
        }
        if let Some(m) = self.global.take() {
            let excess = Counters::get(&sh.counters.entries).saturating_sub(sh.global_target());
            self.next_global = self.next_global.max(m.entry_cutoff(excess));
        }
        sh.pods.recycle(&sh.epoch, pin);
        // A freed id's evictions are not its next pod's.
        self.evicted.retain(|&id, _| sh.pods.is_live(id));
        Counters::bump(&sh.counters.sweep_passes, 1);
        !self.next_cutoffs.is_empty() || self.next_global.is_some()
    }

    /// Walks on from the saved position. Returns true when the pass is done.
    fn walk(
        &mut self,
        sh: &Shared,
        now: u64,
        budget: &mut usize,
        pin: &Pin,
        report: &mut SweepReport,
    ) -> bool {
        while let Some(tree) = self.trees.get(self.tree).cloned() {
            // Re-descend to where the last call stopped.
            let (mut walk, lost) = Walk::resume(tree.root(pin), &self.marks, false, sh.seed);
            if lost {
                // The node we were in was replaced or unlinked meanwhile.
                walk.set_all(true);
            }
            loop {
                if let Some(child) = walk.next_child() {
                    walk.enter(child, false);
                    continue;
                }
                if *budget == 0 && !walk.at_root() {
                    self.marks = walk.marks();
                    return false;
                }
                // Post-order: every child of the deepest node is done.
                let Some(left) = walk.leave() else {
                    // The root: this model is done.
                    break;
                };
                *budget -= 1;
                let at = Span {
                    d0: left.d0,
                    d1: left.d1,
                    evict: !left.data,
                };
                if self.visit(sh, left.parent, left.node, at, now, pin, report) {
                    // Its ancestors: every level still on the walk.
                    walk.set_all(true);
                }
            }
            self.marks.clear();
            self.tree += 1;
        }
        true
    }

    /// Sweeps one node (post-order: its children are done). A partial eviction
    /// splits the node; the two halves are then swept in turn, the lower one
    /// (now the upper's child) first, so every pod's cutoff applies to each.
    /// Returns whether it found a node replaced by a writer (so the caller's
    /// ancestors must not evict in this pass).
    #[allow(clippy::too_many_arguments)]
    fn visit<'g>(
        &mut self,
        sh: &Shared,
        parent: NodeRef<'g>,
        node: NodeRef<'g>,
        at: Span,
        now: u64,
        pin: &'g Pin,
        report: &mut SweepReport,
    ) -> bool {
        let mut work: SmallVec<[(NodeRef<'g>, NodeRef<'g>, Span); 4]> = SmallVec::new();
        work.push((parent, node, at));
        let mut replaced = false;
        while let Some((parent, node, at)) = work.pop() {
            match self.visit_one(sh, parent, node, at, now, pin, report) {
                Visited::Done => {}
                Visited::Sealed => replaced = true,
                Visited::Split { upper, lower, k } => {
                    let (d0, d1) = (at.d0, at.d1);
                    work.push((
                        parent,
                        upper,
                        Span {
                            d0,
                            d1: d0 + k,
                            ..at
                        },
                    ));
                    work.push((
                        upper,
                        lower,
                        Span {
                            d0: d0 + k,
                            d1,
                            ..at
                        },
                    ));
                }
            }
        }
        replaced
    }

    /// Sweeps one node.
    #[allow(clippy::too_many_arguments)]
    fn visit_one<'g>(
        &mut self,
        sh: &Shared,
        parent: NodeRef<'g>,
        node: NodeRef<'g>,
        at: Span,
        now: u64,
        pin: &'g Pin,
        report: &mut SweepReport,
    ) -> Visited<'g> {
        let Span { d0, d1, evict } = at;
        report.visited += 1;
        let len = (d1 - d0) as i64;
        let mut partial = None;
        {
            // Entries are removed under the node's lock (`PodSlots::remove_if`).
            let Some(locked) = node.lock() else {
                return Visited::Sealed;
            };
            for (pod, time) in tree::entries_of(&locked) {
                let freed = if !sh.pods.is_live(pod) {
                    locked
                        .pods
                        .remove_if(pod, |_| true)
                        .map(|_| &mut report.purged)
                } else if now.saturating_sub(time) > sh.ttl_ms {
                    locked
                        .pods
                        .remove_if(pod, |t| now.saturating_sub(t) > sh.ttl_ms)
                        .map(|_| &mut report.expired)
                } else if !evict {
                    None
                } else {
                    let verdict = match self.cutoffs.get(&pod) {
                        Some(c) => c.judge(time, d0, d1),
                        None => Verdict::Keep,
                    };
                    let global = self.global_cutoff.is_some_and(|g| (time, Reverse(d0)) <= g);
                    match verdict {
                        _ if global => {
                            // The global bound ignores engines: it may cut an
                            // engine-fed pod's path above blocks it keeps.
                            if sh.pods.is_precise(pod) {
                                sh.pods.mark_gappy(pod);
                            }
                            locked.pods.remove_if(pod, |t| t == time)
                        }
                        Verdict::Evict => locked.pods.remove_if(pod, |t| t == time),
                        Verdict::EvictFrom(k) => {
                            // One split per visit; the halves are visited next.
                            partial.get_or_insert((pod, time, k));
                            None
                        }
                        Verdict::Keep => None,
                    }
                    .map(|_| &mut report.evicted)
                };
                if let Some(counter) = freed {
                    *counter += len as u64;
                    sh.pods.add_blocks(pod, -len);
                    Counters::add(&sh.counters.entries, -len);
                }
            }
        }
        if let Some((pod, time, k)) = partial {
            let evicted = std::cell::Cell::new(false);
            let split = tree::split(
                sh,
                parent,
                node,
                k,
                |_| Ok::<(), ()>(()),
                |_, lower| {
                    // Evict only if the pod was not refreshed since we judged it.
                    if let Some(i) = lower.iter().position(|e| *e == (pod, time)) {
                        lower.swap_remove(i);
                        evicted.set(true);
                    }
                },
                pin,
            );
            let Ok(Some(upper)) = split else {
                return Visited::Sealed;
            };
            if evicted.get() {
                let gone = (d1 - d0 - k) as i64;
                report.evicted += gone as u64;
                sh.pods.add_blocks(pod, -gone);
                Counters::add(&sh.counters.entries, -gone);
            }
            // The upper half's only child is the new lower half (unless a writer
            // changed it already: then a later pass sweeps them).
            let Some(lower) = upper.child(node.edge[k], sh.seed) else {
                return Visited::Sealed;
            };
            return Visited::Split { upper, lower, k };
        }
        self.measure(&node, d0, d1);
        if node.pods.is_empty() && node.children().len() == 0 && tree::unlink(sh, parent, node, pin)
        {
            report.unlinked += 1;
        }
        Visited::Done
    }

    fn measure(&mut self, node: &Node, d0: usize, d1: usize) {
        if self.measures.is_empty() && self.global.is_none() {
            return;
        }
        node.pods.for_each(|pod, time| {
            if let Some(m) = self.measures.get_mut(&pod) {
                m.push(time, d0, d1);
            }
            if let Some(g) = self.global.as_mut() {
                g.push(time, d0, d1);
            }
        });
    }
}
