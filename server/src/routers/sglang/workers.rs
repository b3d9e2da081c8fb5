//! What each bridge says of its worker besides its blocks: the address
//! the router knows it by, its cache spec and its block size, from its
//! latest batch. Read by every query without a lock (a copy replaced
//! whole, only when a batch changes it).

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::pb::{ApplyExternalKvBatchRequest, WorkerCacheSpec};

/// One worker, as its bridge last described it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Worker {
    /// The router's URL of it; empty: it is not routed to.
    pub address: String,
    /// Its cache spec; none: whole blocks (the legacy rule).
    pub spec: Option<WorkerCacheSpec>,
    /// Its blocks' size in tokens, from a report that gave one; 0: not
    /// known.
    pub block_size: u32,
}

/// Workers by id.
pub type WorkerMap = HashMap<String, Worker>;

/// The workers, replaced copy-on-write.
#[derive(Default)]
pub struct Workers {
    map: ArcSwap<WorkerMap>,
    writer: parking_lot::Mutex<()>,
}

impl Workers {
    /// The workers now.
    pub fn get(&self) -> Arc<WorkerMap> {
        self.map.load_full()
    }

    /// Takes a batch's description of its worker: its address and spec as
    /// given (every batch carries them; an absent spec is none), and the
    /// block size of its reports, when they give one.
    pub fn update(&self, batch: &ApplyExternalKvBatchRequest) {
        let size = batch
            .actions
            .iter()
            .flat_map(|a| a.block_sizes.iter())
            .copied()
            .rfind(|&s| s > 0);
        let _w = self.writer.lock();
        let current = self.map.load();
        let old = current.get(&batch.worker_id);
        let next = Worker {
            address: batch.worker_address.clone(),
            spec: batch.cache_spec,
            block_size: size.or(old.map(|w| w.block_size)).unwrap_or(0),
        };
        if old == Some(&next) {
            return;
        }
        let mut map = (**current).clone();
        map.insert(batch.worker_id.clone(), next);
        self.map.store(Arc::new(map));
    }
}
