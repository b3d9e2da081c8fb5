//! The state every tree of one index shares: configuration, pods, counters
//! and the epoch. Below `tree`, `sweep` and `index` in the module order, so
//! they all use it and it uses none of them.

use crate::config::IndexConfig;
use crate::pods::Pods;
use crate::reclaim::Epoch;
use crate::stats::Counters;

/// State shared by every tree of one index.
pub(crate) struct Shared {
    pub(crate) cfg: IndexConfig,
    pub(crate) ttl_ms: u64,
    /// Seed of the child tables' slot hash (random per index).
    pub(crate) seed: u64,
    pub(crate) pods: Pods,
    pub(crate) counters: Counters,
    /// The index's collector: every pin its trees are walked under, and
    /// every retirement, goes through it.
    pub(crate) epoch: Epoch,
}

impl Shared {
    pub(crate) fn new(cfg: IndexConfig) -> Self {
        Shared {
            ttl_ms: cfg.ttl_ms(),
            seed: ahash::RandomState::new().hash_one(0x5eed_u64),
            pods: Pods::new(cfg.max_pods, cfg.pod_capacity),
            counters: Counters::default(),
            epoch: Epoch::default(),
            cfg,
        }
    }

    /// The entry count the global eviction aims for.
    pub(crate) fn global_target(&self) -> u64 {
        (self.cfg.max_blocks as f64 * self.cfg.evict_to.clamp(0.0, 1.0)) as u64
    }
}
