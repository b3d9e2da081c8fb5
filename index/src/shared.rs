//! The state every tree of one index shares: configuration, pods, counters
//! and the epoch. Below `tree`, `sweep` and `index` in the module order, so
//! they all use it and it uses none of them.

use std::collections::HashMap;

use crate::config::IndexConfig;
use crate::groups::GroupTable;
use crate::pods::Pods;
use crate::reclaim::{Epoch, Pin, Published};
use crate::states::StateMap;
use crate::stats::Counters;
use crate::sync::Mutex;

/// Hybrid pods' group tables, by pod name.
pub(crate) type GroupMap = HashMap<Box<str>, GroupTable, ahash::RandomState>;

/// Takes `pods` out of `map`, a map by pod name published copy-on-write
/// under `writer`: one copy for all of them, none when it holds none.
pub(crate) fn forget_pods<V: Clone + Send + Sync + 'static>(
    map: &Published<HashMap<Box<str>, V, ahash::RandomState>>,
    writer: &Mutex<()>,
    pods: &[&str],
    epoch: &Epoch,
    pin: &Pin,
) {
    let _w = writer.lock();
    let current = map.get(pin);
    if pods.iter().any(|pod| current.contains_key(*pod)) {
        let mut next = current.clone();
        for pod in pods {
            next.remove(*pod);
        }
        map.replace(Box::new(next), epoch, pin);
    }
}

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
    /// The group tables of hybrid engine-fed pods (`crate::groups`),
    /// replaced copy-on-write under `groups_writer` when an engine names a
    /// new group (control-plane rate), read by lookups under a pin.
    pub(crate) groups: Published<GroupMap>,
    pub(crate) groups_writer: Mutex<()>,
    /// Engine-fed pods' views and lower tiers (`crate::detail`), replaced
    /// copy-on-write under `states_writer` when one changes, read by
    /// detailed lookups under a pin.
    pub(crate) states: Published<StateMap>,
    pub(crate) states_writer: Mutex<()>,
}

impl Shared {
    pub(crate) fn new(cfg: IndexConfig) -> Self {
        Shared {
            ttl_ms: cfg.ttl_ms(),
            seed: ahash::RandomState::new().hash_one(0x5eed_u64),
            pods: Pods::new(cfg.max_pods, cfg.pod_capacity),
            counters: Counters::default(),
            epoch: Epoch::default(),
            groups: Published::new(Box::default()),
            groups_writer: Mutex::new(()),
            states: Published::new(Box::default()),
            states_writer: Mutex::new(()),
            cfg,
        }
    }

    /// The entry count the global eviction aims for.
    pub(crate) fn global_target(&self) -> u64 {
        (self.cfg.max_blocks as f64 * self.cfg.evict_to.clamp(0.0, 1.0)) as u64
    }
}
