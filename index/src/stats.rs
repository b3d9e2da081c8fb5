//! Counters kept by writers and the sweep; readers never touch them.

use crate::sync::{AtomicI64, AtomicU64, Ordering};

/// Live counters. Every update is `Relaxed`: they are statistics and triggers,
/// never used to order access to data.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) nodes: AtomicI64,
    pub(crate) tree_blocks: AtomicI64,
    pub(crate) entries: AtomicI64,
    pub(crate) bytes: AtomicI64,
    pub(crate) sweep_passes: AtomicU64,
    pub(crate) expired: AtomicU64,
    pub(crate) evicted: AtomicU64,
    pub(crate) purged: AtomicU64,
    pub(crate) engine_records: AtomicI64,
    pub(crate) engine_bytes: AtomicI64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicI64, n: i64) {
        // Relaxed: pairs with nothing (see the type's docs).
        c.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn get(c: &AtomicI64) -> u64 {
        // Relaxed: pairs with nothing (see the type's docs).
        c.load(Ordering::Relaxed).max(0) as u64
    }

    /// Adds to one of the `u64` totals.
    pub(crate) fn bump(c: &AtomicU64, n: u64) {
        // Relaxed: pairs with nothing (see the type's docs).
        c.fetch_add(n, Ordering::Relaxed);
    }

    /// Reads one of the `u64` totals.
    pub(crate) fn total(c: &AtomicU64) -> u64 {
        // Relaxed: pairs with nothing (see the type's docs).
        c.load(Ordering::Relaxed)
    }
}

/// A snapshot of an index's size and the sweep's work so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Models (one tree each).
    pub models: u64,
    /// Live pods (removed ones excluded).
    pub pods: u64,
    /// Tree nodes, roots excluded.
    pub nodes: u64,
    /// Distinct blocks stored in edges.
    pub tree_blocks: u64,
    /// Stored (pod, block) pairs: what `max_blocks` and capacities bound.
    pub entries: u64,
    /// Heap bytes held by nodes, edges, pod chunks and child tables (retired
    /// objects included until reclaimed).
    pub bytes: u64,
    /// Completed sweep passes over every model.
    pub sweep_passes: u64,
    /// (pod, block) pairs removed because their TTL passed.
    pub expired: u64,
    /// (pod, block) pairs evicted for a pod's capacity or `max_blocks`.
    pub evicted: u64,
    /// (pod, block) pairs removed because their pod was removed.
    pub purged: u64,
    /// Engine block records of engine-fed pods (see the `engine` module).
    pub engine_blocks: u64,
    /// Heap bytes those records take (map slots included).
    pub engine_bytes: u64,
}
