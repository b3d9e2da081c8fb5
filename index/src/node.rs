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

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, MutexGuard};

use crate::children::{Children, Keyed};
use crate::slots::{Entry, PodSlots};

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

    pub(crate) fn lock(&self) -> MutexGuard<'_, ()> {
        self.lock.lock()
    }

    /// Marks the child table as moved to another node. Called under the lock.
    pub(crate) fn mark_moved(&self) {
        // Relaxed: read only when the node is freed, after a grace period whose
        // synchronisation orders this store before the read.
        self.moved.store(true, Ordering::Relaxed);
    }

    /// Frees a retired node (and its table unless moved); returns bytes freed.
    ///
    /// # Safety
    /// `node` came from `Box::into_raw`, is unlinked, and no thread can reach it.
    pub(crate) unsafe fn free(node: *mut Node) -> usize {
        // SAFETY: per the contract we own the node.
        let node = unsafe { Box::from_raw(node) };
        let mut bytes = node.bytes();
        if !node.moved.load(Ordering::Relaxed) {
            // SAFETY: the table is ours (not moved) and unreachable with the node.
            bytes += unsafe { node.children.free_table() };
        }
        bytes
    }

    /// Frees `root` and everything below it; iterative, so depth is no risk.
    ///
    /// # Safety
    /// The caller has exclusive access to the whole subtree.
    pub(crate) unsafe fn free_subtree(root: *mut Node) -> usize {
        let mut bytes = 0;
        let mut stack = vec![root];
        while let Some(n) = stack.pop() {
            // SAFETY: exclusive access to the subtree (contract).
            stack.extend(unsafe { (*n).children.drain() });
            // SAFETY: as above; each node is reached once, through its parent.
            bytes += unsafe { Node::free(n) };
        }
        bytes
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

/// A raw node pointer moved to the reclaiming thread.
pub(crate) struct NodePtr(pub(crate) *mut Node);
// SAFETY: a retired node is touched only by the one thread that frees it, after
// a grace period; its fields are atomics, boxes and a mutex, all `Send`.
unsafe impl Send for NodePtr {}
