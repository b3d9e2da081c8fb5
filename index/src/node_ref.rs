//! Tree nodes as the rest of the crate sees them: references whose lifetime
//! is a pin of the index's collector, and locks that carry what writing a
//! child table requires. Everything unsafe about walking and changing the
//! tree is here and in the modules below it (`children`, `node`, `reclaim`).
//!
//! - [`NodeRef<'g>`] is a node reached under `&'g Pin` (in the manner of
//!   crossbeam-epoch's `Shared<'g, T>`). Nodes and child tables are freed
//!   only through `Epoch::retire` (see `reclaim`), so a node reached under a
//!   pin, its table and every child in it stay allocated for the pin's life;
//!   hence [`NodeRef::child`] and [`NodeRef::children`] are safe and give out
//!   `NodeRef<'g>` again.
//! - [`Locked<'g>`] is a `NodeRef` whose writer lock is held and which is not
//!   sealed: exactly the state in which its child table may be written. It
//!   publishes children ([`Locked::add_child`]).
//! - [`LockedChild`] is a child locked under its locked parent after checking
//!   that the parent still links it: the state in which it may be replaced
//!   ([`LockedChild::split`]) or unlinked ([`LockedChild::unlink`]). Both seal
//!   it first and retire it through the epoch after unlinking it.
//! - [`Root`] owns a tree's root node, which is never retired.
//!
//! Raw node pointers exist only here and in `children` and `node`.

use std::ops::Deref;

use crate::children::{Children, Keyed, Loaded, Table};
use crate::node::Node;
use crate::reclaim::{Epoch, Pin};
use crate::slots::Entries;
use crate::sync::MutexGuard;

/// A node reached under a pin: valid, with its child table and children,
/// for `'g`. Copy, one pointer wide, and free to dereference to [`Node`].
#[derive(Clone, Copy)]
pub(crate) struct NodeRef<'g> {
    node: &'g Node,
}

impl Deref for NodeRef<'_> {
    type Target = Node;

    #[inline]
    fn deref(&self) -> &Node {
        self.node
    }
}

impl<'g> NodeRef<'g> {
    /// The child whose first block is `key`.
    #[inline]
    pub(crate) fn child(self, key: u64, seed: u64) -> Option<NodeRef<'g>> {
        self.children().get(key, seed)
    }

    /// The child table as of now, for walking (see [`Loaded`]).
    #[inline]
    pub(crate) fn children(self) -> ChildTable<'g> {
        // SAFETY: `self` is valid for 'g under a pin of the index's
        // collector, and the index retires tables and children only through
        // that collector (`Epoch::retire`), so the table loaded now and every
        // child ever stored in it stay allocated for 'g.
        ChildTable(unsafe { self.node.children.load() })
    }

    /// Whether both refer to the same node.
    #[inline]
    pub(crate) fn ptr_eq(self, other: NodeRef<'_>) -> bool {
        std::ptr::eq(self.node, other.node)
    }

    /// The node's address, as its parent's table stores it.
    fn as_ptr(self) -> *const Node {
        self.node
    }

    /// Takes the node's writer lock; `None` if the node is sealed (it is
    /// being replaced or unlinked: the caller's work belongs elsewhere).
    pub(crate) fn lock(self) -> Option<Locked<'g>> {
        let guard = self.node.lock();
        if self.node.pods.is_sealed() {
            return None;
        }
        Some(Locked {
            node: self,
            _guard: guard,
        })
    }
}

/// A node's child table as loaded under a pin, handing out `NodeRef<'g>`.
#[derive(Clone, Copy)]
pub(crate) struct ChildTable<'g>(Loaded<'g, Node>);

impl<'g> ChildTable<'g> {
    #[inline]
    pub(crate) fn get(self, key: u64, seed: u64) -> Option<NodeRef<'g>> {
        self.0.get(key, seed).map(|node| NodeRef { node })
    }

    /// The child in slot `i` (`0..slots()`), if the slot holds one.
    #[inline]
    pub(crate) fn slot(self, i: usize) -> Option<NodeRef<'g>> {
        self.0.slot(i).map(|node| NodeRef { node })
    }

    #[inline]
    pub(crate) fn slots(self) -> usize {
        self.0.slots()
    }

    /// The table's identity, never reused (0 for none).
    pub(crate) fn id(self) -> usize {
        self.0.id()
    }

    /// Live children (exact for a holder of the node's lock).
    pub(crate) fn len(self) -> usize {
        self.0.len()
    }
}

/// A tree's root: empty edge, never sealed, never retired. Dropping it frees
/// the whole tree, which the caller guarantees nobody can reach any more.
pub(crate) struct Root(Box<Node>);

impl Root {
    pub(crate) fn new() -> Self {
        Root(Node::new(&[], &[], Children::new()))
    }

    /// The root, under `pin`.
    #[inline]
    pub(crate) fn get<'g>(&'g self, _pin: &'g Pin) -> NodeRef<'g> {
        NodeRef { node: &self.0 }
    }
}

impl Drop for Root {
    fn drop(&mut self) {
        // A tree is dropped with the last `Arc` of it (model maps and the
        // sweep hold them; readers reach it only through a map they hold
        // under a pin), so no thread can reach any of its nodes now.
        // SAFETY: `&mut self` and the above: exclusive access to the subtree.
        unsafe { Node::free_below(&self.0) };
    }
}

/// A node with its writer lock held, not sealed: its child table may be
/// written (only through here).
pub(crate) struct Locked<'g> {
    node: NodeRef<'g>,
    _guard: MutexGuard<'g, ()>,
}

impl<'g> Deref for Locked<'g> {
    type Target = NodeRef<'g>;

    fn deref(&self) -> &NodeRef<'g> {
        &self.node
    }
}

impl<'g> Locked<'g> {
    /// Publishes `child` (whose first block no child of this node has) and
    /// returns it with the bytes of the table it grew into, if it grew; an
    /// outgrown table is retired through `epoch`.
    pub(crate) fn add_child(
        &self,
        child: Box<Node>,
        seed: u64,
        epoch: &Epoch,
        pin: &'g Pin,
    ) -> (NodeRef<'g>, isize) {
        let child = Box::into_raw(child);
        // SAFETY: we hold the node's lock and it is not sealed, so it still
        // writes its own table; `child` is a fresh, initialised box handed
        // to the table; stored children are valid (the table's invariant).
        let (bytes, outgrown) = unsafe { self.node.children.insert(child, seed) };
        if let Some(old) = outgrown {
            epoch.retire(pin, old, Table::free);
        }
        // SAFETY: published in this node's table, so freed only through the
        // epoch, after `pin` ends.
        let node = unsafe { &*child };
        (NodeRef { node }, bytes)
    }

    /// Locks `child` if this node still links it and it is not sealed.
    /// Parent before child: the order every writer locks in.
    pub(crate) fn lock_child<'p>(
        &'p self,
        child: NodeRef<'g>,
        seed: u64,
    ) -> Option<LockedChild<'p, 'g>> {
        let linked = self.child(child.key(), seed)?;
        if !linked.ptr_eq(child) {
            return None;
        }
        Some(LockedChild {
            parent: self,
            node: child.lock()?,
        })
    }
}

/// A locked, unsealed child of a locked, unsealed node that links it: the
/// state in which it may be replaced or unlinked.
pub(crate) struct LockedChild<'p, 'g> {
    parent: &'p Locked<'g>,
    node: Locked<'g>,
}

impl<'g> Deref for LockedChild<'_, 'g> {
    type Target = NodeRef<'g>;

    fn deref(&self) -> &NodeRef<'g> {
        &self.node.node
    }
}

impl<'g> LockedChild<'_, 'g> {
    /// Replaces this node by an upper node holding its first `m` blocks and a
    /// lower one holding the rest and its children. `edit` adjusts the
    /// entries of the two halves, which start as this node's as of its seal.
    /// Returns the upper half (published) and the bytes allocated; this node
    /// is retired.
    pub(crate) fn split(
        self,
        m: usize,
        edit: impl FnOnce(&mut Entries, &mut Entries),
        seed: u64,
        epoch: &Epoch,
        pin: &'g Pin,
    ) -> (NodeRef<'g>, isize) {
        debug_assert!(m > 0 && m < self.edge.len());
        let mut upper_entries = self.pods.seal();
        let mut lower_entries = upper_entries.clone();
        edit(&mut upper_entries, &mut lower_entries);
        // SAFETY: we hold the node's lock and just sealed it; the replace
        // below unlinks it with the store that publishes the upper half.
        let (upper, bytes) = unsafe { self.split_off(m, &upper_entries, &lower_entries, seed) };
        let upper = Box::into_raw(upper);
        // SAFETY: we hold the parent's lock and it is not sealed; `upper` is
        // a fresh, initialised box with this node's key, handed to the table.
        let old = unsafe { self.parent.children.replace(self.as_ptr(), upper, seed) };
        // `lock_child` found the link under the parent's lock, still held.
        debug_assert!(old.is_some(), "a locked child left its locked parent");
        if let Some(old) = old {
            epoch.retire(pin, old, Node::free);
        }
        // SAFETY: published in the parent's table, so freed only through
        // the epoch, after `pin` ends.
        let node = unsafe { &*upper };
        (NodeRef { node }, bytes)
    }

    /// Seals and unlinks this node and retires it, if it holds no pod and no
    /// child; returns whether it did.
    pub(crate) fn unlink(self, seed: u64, epoch: &Epoch, pin: &'g Pin) -> bool {
        if !self.pods.is_empty() || self.children().len() != 0 {
            return false;
        }
        self.pods.seal();
        // SAFETY: we hold the parent's lock and it is not sealed.
        let old = unsafe { self.parent.children.remove(self.as_ptr(), seed) };
        // As in `split`: the link is there.
        debug_assert!(old.is_some(), "a locked child left its locked parent");
        if let Some(old) = old {
            epoch.retire(pin, old, Node::free);
        }
        true
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use crate::{Index, IndexConfig};

    const T0: u64 = 1_000_000;

    #[test]
    fn only_a_linked_unsealed_child_can_be_locked_for_a_change() {
        let index = Index::new(IndexConfig::default());
        index.insert("m", &[1, 2, 3], "a", T0).unwrap();
        index.insert("m", &[1, 2, 3, 4], "a", T0).unwrap();
        let seed = index.sh.seed;
        let pin = index.pin();
        let root = index.models(&pin)["m"].root(&pin);
        let top = root.child(1, seed).unwrap();
        let below = top.child(4, seed).unwrap();
        let locked = root.lock().unwrap();
        // Not the root's child: refused.
        assert!(locked.lock_child(below, seed).is_none());
        // Not empty (a pod, a child): not unlinked.
        let child = locked.lock_child(top, seed).unwrap();
        assert!(!child.unlink(seed, &index.sh.epoch, &pin));
        // Split after one block: the root links the upper half, which links
        // the lower one; the old node is sealed and no longer linked.
        let child = locked.lock_child(top, seed).unwrap();
        let (upper, bytes) = child.split(1, |_, _| {}, seed, &index.sh.epoch, &pin);
        assert!(bytes > 0);
        assert!(root.child(1, seed).unwrap().ptr_eq(upper));
        assert_eq!(&*upper.edge, &[1]);
        let lower = upper.child(2, seed).unwrap();
        assert_eq!(&*lower.edge, &[2, 3]);
        assert!(lower.child(4, seed).unwrap().ptr_eq(below));
        assert!(top.lock().is_none(), "sealed");
        assert!(locked.lock_child(top, seed).is_none(), "unlinked");
        drop(locked);
        // Readers that held the old node still read it whole.
        assert_eq!(&*top.edge, &[1, 2, 3]);
        assert!(top.child(4, seed).unwrap().ptr_eq(below));
        let upper_at = std::ptr::from_ref::<crate::node::Node>(&upper);
        drop(pin);
        // The old node is freed once the pin is gone (its table is the
        // lower half's now, so only the node itself).
        assert!(index.reclaim() > 0);
        let pin = index.pin();
        let root = index.models(&pin)["m"].root(&pin);
        assert!(std::ptr::eq(&*root.child(1, seed).unwrap(), upper_at));
    }

    #[test]
    fn an_empty_leaf_is_unlinked_and_retired() {
        let index = Index::new(IndexConfig::default());
        index.insert("m", &[1, 2], "a", T0).unwrap();
        let seed = index.sh.seed;
        let pin = index.pin();
        let root = index.models(&pin)["m"].root(&pin);
        let leaf = root.child(1, seed).unwrap();
        {
            let locked = root.lock().unwrap();
            let child = locked.lock_child(leaf, seed).unwrap();
            assert!(child.pods.remove_if(0, |_| true).is_some());
            assert!(child.unlink(seed, &index.sh.epoch, &pin));
        }
        assert!(root.child(1, seed).is_none());
        assert_eq!(root.children().len(), 0);
        assert!(leaf.lock().is_none(), "sealed");
        drop(pin);
        assert!(index.reclaim() > 0);
    }
}
