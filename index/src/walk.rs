//! Walking a tree under a pin, in safe code only: along one key, or through
//! every node depth-first.
//!
//! - [`step`] is one move down a key: the child the key continues into and how
//!   many blocks of its edge the key matches. [`Path`] repeats it from the root
//!   (a lookup's descent); an insert calls it between its writes.
//! - [`Walk`] visits every node depth-first, each child table in slot order,
//!   and tells the caller when it enters a node (pre-order: the snapshot) and
//!   lets it leave one (post-order: the sweep). Each level iterates the child
//!   table its node had when the walk reached it: a table that grows meanwhile
//!   is not followed (its new children are the next walk's), so a walk under
//!   one pin meets each child of that table at most once. Children replaced or
//!   removed in that table are seen replaced or removed.
//! - [`descend`] goes from a node down to a leaf, choosing each child by a
//!   caller's function: with a random one, it samples the tree's keys.
//! - A walk's position outlives its pin as [`Mark`]s (first block, next slot,
//!   table identity per level): [`Walk::resume`] descends by those keys under
//!   a new pin and restarts a level whose table changed, as the sweep does
//!   between calls.

use crate::children::Keyed;
use crate::node::common_prefix;
use crate::node_ref::{ChildTable, NodeRef};

/// The child of `node` that `rest` continues into, and how many blocks of
/// that child's edge `rest` matches (at least one; all of them if the key goes
/// on below it). `None` when no child starts with `rest[0]`, or `rest` is empty.
///
/// Always inlined: it is the lookup's whole per-level work, and with a plain
/// `#[inline]` the compiler kept it out of line (a call per level).
#[inline(always)]
pub(crate) fn step<'g>(node: NodeRef<'g>, rest: &[u64], seed: u64) -> Option<(NodeRef<'g>, usize)> {
    let child = node.child(*rest.first()?, seed)?;
    Some((child, common_prefix(&child.edge, rest)))
}

/// The blocks from `node` down to a leaf (a node without children), at most
/// `max` of them: at each level (0 below `node`), child number
/// `pick(level)` modulo the children's count, in slot order. A random
/// `pick` makes it a random descent (sampling the keys a tree holds), each
/// child equally likely, wherever it sits in its table: replicas comparing
/// or repairing each other reach every key.
pub(crate) fn descend(
    mut node: NodeRef<'_>,
    max: usize,
    mut pick: impl FnMut(usize) -> usize,
) -> Vec<u64> {
    let mut key = Vec::new();
    let mut level = 0;
    while key.len() < max {
        let table = node.children();
        let slots = table.slots();
        if slots == 0 {
            break;
        }
        // One pass: a child removed meanwhile is not picked from a count
        // that still held it.
        let children: Vec<NodeRef<'_>> = (0..slots).filter_map(|i| table.slot(i)).collect();
        if children.is_empty() {
            break;
        }
        let child = children[pick(level) % children.len()];
        let take = child.edge.len().min(max - key.len());
        key.extend_from_slice(&child.edge[..take]);
        node = child;
        level += 1;
    }
    key
}

/// The nodes along a key, from the root's child down: each with the key's
/// depth at the end of its match. The last one may match only part of its
/// edge (the key diverges or ends inside it).
pub(crate) struct Path<'g, 'k> {
    /// The node the key goes on from; `None` once it diverged inside an edge.
    node: Option<NodeRef<'g>>,
    key: &'k [u64],
    depth: usize,
    seed: u64,
}

impl<'g, 'k> Path<'g, 'k> {
    #[inline]
    pub(crate) fn new(root: NodeRef<'g>, key: &'k [u64], seed: u64) -> Self {
        Path {
            node: Some(root),
            key,
            depth: 0,
            seed,
        }
    }
}

impl<'g> Iterator for Path<'g, '_> {
    type Item = (NodeRef<'g>, usize);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let node = self.node?;
        // `depth` never passes the key's end: a step matches at most `rest`.
        let rest = self.key.get(self.depth..)?;
        let (child, m) = step(node, rest, self.seed)?;
        self.depth += m;
        // Diverged inside the edge: nothing below can match.
        self.node = (m == child.edge.len()).then_some(child);
        Some((child, self.depth))
    }
}

/// One level of a [`Walk`].
struct Frame<'g, T> {
    node: NodeRef<'g>,
    /// Depth at the end of the node's edge.
    depth: usize,
    table: ChildTable<'g>,
    /// Next slot of `table` to look at.
    next: usize,
    data: T,
}

/// A depth-first walk of one tree under a pin, carrying a `T` per level
/// (the snapshot's record number, the sweep's "dirty" flag). The root's level
/// is never left.
pub(crate) struct Walk<'g, T> {
    frames: Vec<Frame<'g, T>>,
}

/// A node the walk has just left (post-order: its children are done).
pub(crate) struct Left<'g, T> {
    pub(crate) node: NodeRef<'g>,
    pub(crate) parent: NodeRef<'g>,
    /// Depth at the start of the node's edge.
    pub(crate) d0: usize,
    /// Depth at the end of the node's edge.
    pub(crate) d1: usize,
    pub(crate) data: T,
}

/// A walk's position at one level, kept across pins.
#[derive(Clone, Copy)]
pub(crate) struct Mark<T> {
    /// The node's first block (unused for the root).
    key: u64,
    next: usize,
    /// Identity of the child table `next` refers to.
    table: usize,
    data: T,
}

impl<'g, T> Walk<'g, T> {
    /// A walk at the root, before its first child.
    pub(crate) fn new(root: NodeRef<'g>, data: T) -> Self {
        Walk {
            frames: vec![Frame {
                node: root,
                depth: 0,
                table: root.children(),
                next: 0,
                data,
            }],
        }
    }

    /// The next child of the deepest node entered and not left, in its
    /// table's slot order; `None` once that node has no more.
    pub(crate) fn next_child(&mut self) -> Option<NodeRef<'g>> {
        let top = self.frames.last_mut()?;
        while top.next < top.table.slots() {
            let slot = top.table.slot(top.next);
            top.next += 1;
            if slot.is_some() {
                return slot;
            }
        }
        None
    }

    /// Goes down into `child`, a child just returned by [`Walk::next_child`].
    pub(crate) fn enter(&mut self, child: NodeRef<'g>, data: T) {
        let depth = self.frames.last().map_or(0, |f| f.depth) + child.edge.len();
        self.frames.push(Frame {
            node: child,
            depth,
            table: child.children(),
            next: 0,
            data,
        });
    }

    /// Leaves the deepest node entered; `None` at the root.
    pub(crate) fn leave(&mut self) -> Option<Left<'g, T>> {
        if self.frames.len() < 2 {
            return None;
        }
        let f = self.frames.pop()?;
        let parent = self.frames.last()?.node;
        Some(Left {
            node: f.node,
            parent,
            d0: f.depth - f.node.edge.len(),
            d1: f.depth,
            data: f.data,
        })
    }

    /// Whether the walk is at the root (nothing entered, or all left).
    pub(crate) fn at_root(&self) -> bool {
        self.frames.len() < 2
    }

    /// The data of the deepest node entered (the root's at the root).
    pub(crate) fn data(&self) -> &T {
        // Never out of bounds: `leave` keeps the root's level.
        &self.frames[self.frames.len() - 1].data
    }
}

impl<'g, T: Copy> Walk<'g, T> {
    /// Sets the data of every level, the root's included.
    pub(crate) fn set_all(&mut self, data: T) {
        for f in &mut self.frames {
            f.data = data;
        }
    }

    /// The position, to resume under a later pin.
    pub(crate) fn marks(&self) -> Vec<Mark<T>> {
        self.frames
            .iter()
            .map(|f| Mark {
                key: f.node.key(),
                next: f.next,
                table: f.table.id(),
                data: f.data,
            })
            .collect()
    }

    /// Resumes a walk of the tree under `root` at `marks` (a fresh walk with
    /// `data` at the root if there are none): descends by each level's first
    /// block, and restarts a level whose table is not the one marked. Returns
    /// the walk and whether a marked node was gone (replaced or unlinked
    /// meanwhile), in which case the walk resumes at its parent.
    pub(crate) fn resume(root: NodeRef<'g>, marks: &[Mark<T>], data: T, seed: u64) -> (Self, bool) {
        let mut walk = Walk::new(root, marks.first().map_or(data, |m| m.data));
        let mut lost = false;
        for (level, mark) in marks.iter().enumerate() {
            if level > 0 {
                let parent = walk.frames[level - 1].node;
                let Some(child) = parent.child(mark.key, seed) else {
                    lost = true;
                    break;
                };
                walk.enter(child, mark.data);
            }
            let f = &mut walk.frames[level];
            if f.table.id() == mark.table {
                f.next = mark.next;
            }
        }
        (walk, lost)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::{Index, IndexConfig};

    const T0: u64 = 1_000_000;

    fn index_of(keys: &[&[u64]]) -> Index {
        let index = Index::new(IndexConfig::default());
        for key in keys {
            index.insert("m", key, "p", T0).unwrap();
        }
        index
    }

    /// The edges and end depths along `key`.
    fn path(index: &Index, key: &[u64]) -> Vec<(Vec<u64>, usize)> {
        let pin = index.pin();
        let root = index.models(&pin)["m"].root(&pin);
        Path::new(root, key, index.sh.seed)
            .map(|(n, d)| (n.edge.to_vec(), d))
            .collect()
    }

    #[test]
    fn a_path_follows_its_key_and_stops_inside_a_diverging_edge() {
        let index = index_of(&[&[1, 2, 3, 4], &[1, 2, 9]]);
        let (top, left) = (vec![1, 2], vec![3, 4]);
        assert_eq!(
            path(&index, &[1, 2, 3, 4, 5]),
            [(top.clone(), 2), (left.clone(), 4)]
        );
        // Diverges after one block of [3, 4]: that node is the last.
        assert_eq!(
            path(&index, &[1, 2, 3, 7, 4]),
            [(top.clone(), 2), (left, 3)]
        );
        // Ends inside the first edge.
        assert_eq!(path(&index, &[1]), [(top, 1)]);
        assert!(path(&index, &[5, 1]).is_empty());
        assert!(path(&index, &[]).is_empty());
    }

    /// Every node's edge, keyed by its address, from a full walk: entered
    /// once each (pre-order, parents first), left once each after all its
    /// children (post-order), with depths that add up.
    fn walk_all(index: &Index) -> usize {
        let pin = index.pin();
        let Some(tree) = index.models(&pin).get("m") else {
            return 0;
        };
        let root = tree.root(&pin);
        let id = |n: NodeRef<'_>| std::ptr::from_ref::<crate::node::Node>(&n) as usize;
        let mut entered: HashMap<usize, usize> = HashMap::new();
        let mut left: HashMap<usize, usize> = HashMap::new();
        let mut walk = Walk::new(root, 0usize);
        let mut step = 0;
        loop {
            step += 1;
            if let Some(child) = walk.next_child() {
                // The parent was entered before.
                assert!(walk.at_root() || entered.contains_key(walk.data()));
                assert!(entered.insert(id(child), step).is_none(), "entered twice");
                walk.enter(child, id(child));
                continue;
            }
            let Some(l) = walk.leave() else { break };
            assert_eq!(l.d1 - l.d0, l.node.edge.len());
            assert_eq!(l.data, id(l.node));
            assert!(left.insert(id(l.node), step).is_none(), "left twice");
            // Post-order: every child of `l.node` was left already.
            let children = l.node.children();
            for i in 0..children.slots() {
                if let Some(c) = children.slot(i) {
                    assert!(left[&id(c)] < step);
                }
            }
            assert!(l.parent.ptr_eq(root) || entered[&id(l.parent)] < entered[&id(l.node)]);
        }
        assert_eq!(entered.len(), left.len());
        left.len()
    }

    #[test]
    fn a_walk_enters_and_leaves_every_node_once() {
        let mut keys: Vec<Vec<u64>> = Vec::new();
        for i in 0..300u64 {
            keys.push(vec![i % 3, i % 7, i % 11, i]);
        }
        let refs: Vec<&[u64]> = keys.iter().map(Vec::as_slice).collect();
        let index = index_of(&refs);
        assert_eq!(walk_all(&index) as u64, index.stats().nodes);
        // A tree with only its root.
        let index = index_of(&[&[1]]);
        index.remove_pod("p");
        index.sweep(T0, usize::MAX);
        assert_eq!(index.stats().nodes, 0);
        assert_eq!(walk_all(&index), 0);
    }

    /// Leaves `n` nodes (post-order), then returns the marks.
    fn leave_some(index: &Index, marks: &[Mark<bool>], n: usize) -> (Vec<Mark<bool>>, usize, bool) {
        let pin = index.pin();
        let root = index.models(&pin)["m"].root(&pin);
        let (mut walk, lost) = Walk::resume(root, marks, false, index.sh.seed);
        let mut left = 0;
        while left < n {
            if let Some(child) = walk.next_child() {
                walk.enter(child, false);
            } else if walk.leave().is_some() {
                left += 1;
            } else {
                return (Vec::new(), left, lost);
            }
        }
        (walk.marks(), left, lost)
    }

    #[test]
    fn a_walk_resumes_from_its_marks_under_a_new_pin() {
        let keys: Vec<Vec<u64>> = (0..50u64).map(|i| vec![i % 5, i]).collect();
        let refs: Vec<&[u64]> = keys.iter().map(Vec::as_slice).collect();
        let index = index_of(&refs);
        let nodes = index.stats().nodes as usize;
        // In steps of 7 nodes, nothing changing: every node once.
        let (mut marks, mut total) = (Vec::new(), 0);
        loop {
            let (next, left, lost) = leave_some(&index, &marks, 7);
            assert!(!lost);
            total += left;
            if next.is_empty() {
                break;
            }
            marks = next;
        }
        assert_eq!(total, nodes);
        // A table that changed restarts its level; a node that is gone is
        // reported, and the walk goes on at its parent.
        let (marks, _, _) = leave_some(&index, &[], 3);
        assert_eq!(marks.len(), 2, "inside the first child of the root");
        for i in 100..200u64 {
            index.insert("m", &[i], "p", T0).unwrap();
        }
        let (_, left, lost) = leave_some(&index, &marks, usize::MAX);
        assert!(!lost);
        assert!(left >= nodes + 100, "{left}");
        let mut marks = Vec::new();
        while marks.len() < 2 {
            // Root-level leaves are left with only the root's mark standing.
            marks = leave_some(&index, &marks, 1).0;
        }
        index.remove_pod("p");
        index.sweep(T0, usize::MAX);
        assert_eq!(index.stats().nodes, 0);
        let (_, _, lost) = leave_some(&index, &marks, usize::MAX);
        assert!(lost);
    }
}
