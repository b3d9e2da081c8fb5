//! One radix-tree node: an edge of block hashes, its pods, its children.
//!
//! States: a node is **live** while reachable from its parent's child table,
//! **sealed** once a writer holding its lock has decided to replace or unlink
//! it (see `slots`), and **retired** once unlinked: it is then freed
//! after an epoch grace period by `reclaim`. Nothing is ever mutated
//! in a sealed node, so readers that still hold one see a consistent old state.
//!
//! Writers lock a node (a one-byte `parking_lot` mutex) only to change its
//! membership or its children; they always lock top-down (parent before child),
//! and depth strictly grows along any parent→child link, so locks cannot cycle.
//!
//! A node owns its child table, except after an edge split has moved the table
//! to its lower half (`moved`); it never owns its children, whose life the
//! tree manages: freeing a node (dropping its box) frees its edge, its pod
//! chunks and, unless moved, its table.

use crate::children::{Children, Keyed};
use crate::slots::{Entry, PodSlots};
use crate::sync::{AtomicBool, Mutex, MutexGuard, Ordering};

pub(crate) struct Node {
    /// The blocks on the edge into this node; empty only for a tree's root.
    pub(crate) edge: Box<[u64]>,
    pub(crate) pods: PodSlots,
    pub(crate) children: Children<Node>,
    lock: Mutex<()>,
    /// Set when an edge split moved `children`'s table to the lower half; the
    /// table is then not ours to free.
    moved: AtomicBool,
}

impl Keyed for Node {
    #[inline]
    fn key(&self) -> u64 {
        // Only non-root nodes sit in child tables, and their edges are non-empty.
        self.edge.first().copied().unwrap_or(0)
    }
}

impl Node {
    pub(crate) fn new(edge: &[u64], entries: &[Entry], children: Children<Node>) -> Box<Node> {
        Box::new(Node {
            edge: edge.into(),
            pods: PodSlots::new(entries),
            children,
            lock: Mutex::new(()),
            moved: AtomicBool::new(false),
        })
    }

    /// Bytes this node holds, excluding its child table (counted on its own).
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of::<Node>() + self.edge.len() * 8 + self.pods.heap_bytes()
    }

    /// Takes the writer lock. `node_ref::Locked` is the way in for writers.
    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock()
    }

    /// The upper and lower halves of this node split after `m` blocks: the
    /// upper holds the first `m` blocks and `upper` entries, and the lower,
    /// its only child, holds the rest, `lower` entries and this node's child
    /// table (from now on the lower half's). Returns the upper half and the
    /// bytes the two allocated.
    ///
    /// # Safety
    /// The caller holds this node's lock and has sealed it, and the upper
    /// half replaces it in its parent (unlinking it) with the store that
    /// publishes the upper half: [`Children::share`]'s contract.
    pub(crate) unsafe fn split_off(
        &self,
        m: usize,
        upper: &[Entry],
        lower: &[Entry],
        seed: u64,
    ) -> (Box<Node>, isize) {
        // SAFETY: sealed, and unlinked when the upper half is published
        // (this function's contract); a sealed node never writes its table.
        let shared = unsafe { Children::share(&self.children) };
        let lower = Node::new(&self.edge[m..], lower, shared);
        // Relaxed: pairs with nothing; read only when this node is freed,
        // after a grace period whose synchronisation orders this store first.
        self.moved.store(true, Ordering::Relaxed);
        let lower_bytes = lower.bytes() as isize;
        let (children, table_bytes) = Children::with_child(lower, seed);
        let upper = Node::new(&self.edge[..m], upper, children);
        let bytes = upper.bytes() as isize + lower_bytes + table_bytes;
        (upper, bytes)
    }

    /// Frees a node unlinked from its tree; returns the bytes freed, as
    /// counted in `Stats::bytes`. The `free` given to `Epoch::retire`.
    pub(crate) fn free(node: Box<Node>) -> usize {
        let table = if node.owns_table() {
            // SAFETY: we own the node (the box), and its table is its own.
            unsafe { node.children.table_bytes() }
        } else {
            0
        };
        let bytes = node.bytes() + table;
        drop(node);
        bytes
    }

    fn owns_table(&self) -> bool {
        // Relaxed: pairs with nothing of its own: whoever frees the node
        // holds it exclusively, after the synchronisation of a grace period
        // (or of dropping the tree) that follows `split_off`'s store.
        !self.moved.load(Ordering::Relaxed)
    }

    /// Frees every node below `root` (not `root` itself); iterative, so depth
    /// is no risk.
    ///
    /// # Safety
    /// The caller has exclusive access to the whole subtree.
    pub(crate) unsafe fn free_below(root: &Node) -> usize {
        let mut bytes = 0;
        // SAFETY: exclusive access (contract); a live node owns its table.
        let mut stack = unsafe { root.children.drain() };
        while let Some(n) = stack.pop() {
            // SAFETY: each child pointer came from `Box::into_raw` and is
            // reached once, through its one parent; exclusive access.
            let node = unsafe { Box::from_raw(n) };
            // SAFETY: exclusive access (contract), and a node reached through
            // its parent's table is live, so it owns its table.
            stack.extend(unsafe { node.children.drain() });
            bytes += Node::free(node);
        }
        bytes
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.owns_table() {
            // SAFETY: `&mut self`: no thread can reach this node, and its
            // table is its own (not moved to a lower half), so nothing else
            // frees it or reads it.
            unsafe { self.children.free_table() };
        }
    }
}

/// Length of the common prefix of two block slices.
#[inline]
pub(crate) fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    let n = a.len().min(b.len());
    // Most edges match whole: one vectorised comparison settles it.
    if a[..n] == b[..n] {
        return n;
    }
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
