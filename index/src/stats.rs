//! Counters kept by writers and the sweep; readers never touch them.

use prefix_proto::WireStats;

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

    /// Adds `n` unless that takes the count past `max`; returns whether it
    /// did. A compare-and-swap rather than add-then-undo, so the count never
    /// passes `max` even for a moment: what `stats()` reports and the sweep
    /// reads stays within the bound.
    pub(crate) fn add_within(c: &AtomicI64, n: i64, max: u64) -> bool {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let fits = |before: i64| before.checked_add(n).filter(|after| *after <= max);
        // Relaxed: pairs with nothing (see the type's docs).
        c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, fits)
            .is_ok()
    }

    /// Adds as much of `n` as fits under `max` and returns how much that was
    /// (from 0 to `n`), in one compare-and-swap loop, as `add_within`.
    pub(crate) fn add_upto(c: &AtomicI64, n: u64, max: u64) -> u64 {
        let max = i64::try_from(max).unwrap_or(i64::MAX);
        let n = i64::try_from(n).unwrap_or(i64::MAX);
        let room = |before: i64| max.saturating_sub(before).clamp(0, n);
        // Relaxed: pairs with nothing (see the type's docs).
        match c.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |before| {
            Some(before.saturating_add(room(before)))
        }) {
            Ok(before) | Err(before) => room(before) as u64,
        }
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

/// A snapshot of an index's size and the sweep's work so far. The size is
/// the protocol's [`WireStats`], as a `Stats` reply carries it; its
/// figures read through this type (`stats.entries`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Models, live pods, nodes, tree blocks, (pod, block) entries and heap
    /// bytes (nodes, edges, pod chunks and child tables, retired objects
    /// included until reclaimed).
    pub size: WireStats,
    /// Completed sweep passes over every model.
    pub sweep_passes: u64,
    /// (pod, block) pairs removed because their TTL passed.
    pub expired: u64,
    /// (pod, block) pairs evicted for a pod's capacity or `max_blocks`.
    pub evicted: u64,
    /// (pod, block) pairs removed because their pod was removed.
    pub purged: u64,
    /// Engine block records of engine-fed pods (see the `precise` module),
    /// and the room a store in progress has taken for the new records of
    /// its event: what `max_engine_blocks` bounds.
    pub engine_blocks: u64,
    /// Heap bytes those records take (map slots included).
    pub engine_bytes: u64,
    /// Engine blocks' names in other indexers' hashes (`Alias`), one per
    /// block of ours named, over every model.
    pub aliases: u64,
    /// Heap bytes of the tables that hold them.
    pub alias_bytes: u64,
}

impl std::ops::Deref for Stats {
    type Target = WireStats;

    fn deref(&self) -> &WireStats {
        &self.size
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn adding_within_a_bound_refuses_past_it_and_leaves_the_count_alone() {
        let c = AtomicI64::new(0);
        assert!(Counters::add_within(&c, 6, 10));
        assert!(
            Counters::add_within(&c, 4, 10),
            "reaching the bound is allowed"
        );
        assert!(!Counters::add_within(&c, 1, 10));
        assert_eq!(Counters::get(&c), 10);
        Counters::add(&c, -3);
        assert!(!Counters::add_within(&c, 4, 10));
        assert!(Counters::add_within(&c, 3, 10));
        assert!(!Counters::add_within(&c, i64::MAX, u64::MAX), "no overflow");
        assert_eq!(Counters::get(&c), 10);
    }

    #[test]
    fn adding_up_to_a_bound_takes_what_fits() {
        let c = AtomicI64::new(0);
        assert_eq!(Counters::add_upto(&c, 6, 10), 6);
        assert_eq!(Counters::add_upto(&c, 6, 10), 4);
        assert_eq!(Counters::add_upto(&c, 6, 10), 0);
        assert_eq!(Counters::get(&c), 10);
        Counters::add(&c, -10);
        assert_eq!(Counters::add_upto(&c, u64::MAX, u64::MAX), i64::MAX as u64);
        assert_eq!(Counters::add_upto(&c, 1, u64::MAX), 0);
    }
}
