//! The public face: models, pods, readers, writers and the sweep.

use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

use crossbeam_epoch::{Collector, Guard, LocalHandle};
use parking_lot::Mutex;
use smallvec::SmallVec;
use thread_local::ThreadLocal;

use crate::config::IndexConfig;
use crate::error::{InsertError, PodError};
use crate::pods::{PodId, Pods, SendBox};
use crate::reclaim::Reclaimer;
use crate::stats::{Counters, Stats};
use crate::sweep::{SweepReport, Sweeper};
use crate::tree::{Match, Tree};

/// State shared by every tree of one index.
pub(crate) struct Shared {
    pub(crate) cfg: IndexConfig,
    pub(crate) ttl_ms: u64,
    /// Seed of the child tables' slot hash (random per index).
    pub(crate) seed: u64,
    pub(crate) pods: Pods,
    pub(crate) counters: Counters,
    pub(crate) rec: Reclaimer,
}

impl Shared {
    /// The entry count the global eviction aims for.
    pub(crate) fn global_target(&self) -> u64 {
        (self.cfg.max_blocks as f64 * self.cfg.evict_to.clamp(0.0, 1.0)) as u64
    }
}

pub(crate) type ModelMap = HashMap<Box<str>, Arc<Tree>, ahash::RandomState>;

/// A `LocalHandle` of our private collector, kept per thread.
struct Handle(LocalHandle);

// SAFETY: a handle is used only by the thread that registered it (through
// `ThreadLocal::get_or`); it crosses threads only when the index is dropped,
// which needs `&mut Index`, so no thread is pinned through it at that time.
unsafe impl Send for Handle {}

/// A shared prefix index: one radix tree per model over block-hash keys, with
/// several pods per node, TTLs, capacities and a bounded sweep.
///
/// Lookups never lock, never wait and store nothing shared; writers lock single
/// nodes briefly; the sweep is called by one maintenance thread. Time is always
/// an argument: milliseconds on any clock the caller keeps monotonic (the
/// server uses Unix-epoch milliseconds, so snapshots keep their ages).
pub struct Index {
    pub(crate) sh: Shared,
    models: AtomicPtr<ModelMap>,
    model_writer: Mutex<()>,
    sweeper: Mutex<Sweeper>,
    collector: ManuallyDrop<Collector>,
    handles: ThreadLocal<Handle>,
}

/// The answer to a lookup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lookup {
    /// Blocks in the key (after cutting at `max_key_blocks`).
    pub key_blocks: u32,
    /// Every pod with at least one block, by blocks descending then pod name.
    pub matches: Vec<Match>,
}

/// A pinned view of the index for one or more lookups (one epoch pin). Keep it
/// short-lived: while it exists, retired memory cannot be freed. Never hold it
/// across an `.await`.
pub struct Reader<'a> {
    index: &'a Index,
    guard: Guard,
}

impl Index {
    /// An empty index.
    pub fn new(cfg: IndexConfig) -> Self {
        let seed = ahash::RandomState::new().hash_one(0x5eed_u64);
        let sh = Shared {
            ttl_ms: cfg.ttl_ms(),
            seed,
            pods: Pods::new(cfg.max_pods, cfg.pod_capacity),
            counters: Counters::default(),
            rec: Reclaimer::default(),
            cfg,
        };
        Index {
            sh,
            models: AtomicPtr::new(Box::into_raw(Box::default())),
            model_writer: Mutex::new(()),
            sweeper: Mutex::new(Sweeper::default()),
            collector: ManuallyDrop::new(Collector::new()),
            handles: ThreadLocal::new(),
        }
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &IndexConfig {
        &self.sh.cfg
    }

    pub(crate) fn pin(&self) -> Guard {
        self.handles
            .get_or(|| Handle(self.collector.register()))
            .0
            .pin()
    }

    /// A pinned reader for lookups.
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            index: self,
            guard: self.pin(),
        }
    }

    pub(crate) fn models<'g>(&self, _guard: &'g Guard) -> &'g ModelMap {
        // Acquire: pairs with the Release swap that published the map.
        let map = self.models.load(Ordering::Acquire);
        // SAFETY: maps are retired through the epoch; never null.
        unsafe { &*map }
    }

    fn tree_or_create<'g>(&self, model: &str, guard: &'g Guard) -> Result<&'g Tree, InsertError> {
        if let Some(t) = self.models(guard).get(model) {
            return Ok(t);
        }
        let max = self.sh.cfg.max_name_len;
        if model.is_empty() || model.len() > max {
            return Err(InsertError::BadModel {
                len: model.len(),
                max,
            });
        }
        let _w = self.model_writer.lock();
        let current = self.models(guard);
        if let Some(t) = current.get(model) {
            return Ok(t);
        }
        if current.len() >= self.sh.cfg.max_models {
            return Err(InsertError::TooManyModels {
                max: self.sh.cfg.max_models,
            });
        }
        let mut next = current.clone();
        next.insert(model.into(), Arc::new(Tree::new()));
        let next = Box::into_raw(Box::new(next));
        // AcqRel: Release publishes the new map; Acquire owns the old one.
        let old = self.models.swap(next, Ordering::AcqRel);
        self.sh.rec.retire(guard, SendBox(old), |m| {
            // Its trees live on in the new map (shared `Arc`s).
            // SAFETY: the old map is unpublished and a grace period has passed.
            drop(unsafe { Box::from_raw(m.0) });
            0
        });
        // SAFETY: the new map is published and retired only through the epoch.
        let map = unsafe { &*next };
        // Cannot panic: we inserted `model` into this map under the writer lock.
        Ok(&map[model])
    }

    fn cut<'k>(&self, key: &'k [u64]) -> &'k [u64] {
        &key[..key.len().min(self.sh.cfg.max_key_blocks)]
    }

    /// Records that `pod` now holds every prefix of `key` under `model`, last
    /// used at `now` (ms). An empty key records nothing. On error, the pod may
    /// hold a prefix of the key.
    pub fn insert(&self, model: &str, key: &[u64], pod: &str, now: u64) -> Result<(), InsertError> {
        let key = self.cut(key);
        if key.is_empty() {
            return Ok(());
        }
        let guard = self.pin();
        let tree = self.tree_or_create(model, &guard)?;
        let id = self
            .sh
            .pods
            .intern(pod, self.sh.cfg.max_name_len, &self.sh.rec, &guard)?;
        tree.insert(&self.sh, key, id.0, now, &guard)
    }

    /// Convenience: one lookup, answered with owned pod names.
    pub fn lookup(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
        now: u64,
    ) -> Vec<(String, u32)> {
        let r = self.reader();
        let res = r.lookup(model, key, candidates, now);
        res.matches
            .iter()
            .filter_map(|m| Some((r.pod_name(m.pod)?.to_owned(), m.blocks)))
            .collect()
    }

    /// Removes a pod: it vanishes from every lookup at once; the sweep frees its
    /// entries. Returns whether it existed.
    pub fn remove_pod(&self, pod: &str) -> bool {
        let guard = self.pin();
        self.sh.pods.remove(pod, &self.sh.rec, &guard)
    }

    /// Sets a pod's capacity in blocks (creating the pod if needed). The sweep
    /// evicts its least recently used blocks past it.
    pub fn set_pod_capacity(&self, pod: &str, blocks: u64) -> Result<(), PodError> {
        let guard = self.pin();
        let id = self
            .sh
            .pods
            .intern(pod, self.sh.cfg.max_name_len, &self.sh.rec, &guard)?;
        self.sh.pods.set_capacity(id, blocks);
        Ok(())
    }

    /// Blocks currently stored for a pod (0 if unknown).
    pub fn pod_blocks(&self, pod: &str) -> u64 {
        let guard = self.pin();
        self.sh
            .pods
            .id(pod, &guard)
            .map_or(0, |id| self.sh.pods.blocks(id.0))
    }

    /// Sizes and sweep totals.
    pub fn stats(&self) -> Stats {
        let guard = self.pin();
        let c = &self.sh.counters;
        Stats {
            models: self.models(&guard).len() as u64,
            pods: self.sh.pods.live_count(&guard) as u64,
            nodes: Counters::get(&c.nodes),
            tree_blocks: Counters::get(&c.tree_blocks),
            entries: Counters::get(&c.entries),
            bytes: Counters::get(&c.bytes),
            sweep_passes: c.sweep_passes.load(Ordering::Relaxed),
            expired: c.expired.load(Ordering::Relaxed),
            evicted: c.evicted.load(Ordering::Relaxed),
            purged: c.purged.load(Ordering::Relaxed),
        }
    }

    /// Sweeps at most `budget` nodes at time `now` (see the `sweep` module), then
    /// frees what earlier grace periods released. Call it from one maintenance
    /// thread; concurrent calls queue on a lock that readers never touch.
    pub fn sweep(&self, now: u64, budget: usize) -> SweepReport {
        let mut sweeper = self.sweeper.lock();
        let mut report = {
            let guard = self.pin();
            let trees = || {
                let g = self.pin();
                self.models(&g).values().cloned().collect()
            };
            sweeper.sweep(&self.sh, trees, now, budget, &guard)
        };
        let c = &self.sh.counters;
        c.expired.fetch_add(report.expired, Ordering::Relaxed);
        c.evicted.fetch_add(report.evicted, Ordering::Relaxed);
        c.purged.fetch_add(report.purged, Ordering::Relaxed);
        report.reclaimed_bytes = self.reclaim() as u64;
        report
    }

    /// Whether [`Index::sweep`] has work at time `now`, cheaply (a look at
    /// each pod's counters, no tree walk). It has when a pass is under way or
    /// has cutoffs pending, a live pod holds more blocks than its capacity,
    /// stored entries exceed `max_blocks × evict_to`, a removed pod still
    /// awaits purging, or `ttl / 8` has passed since the last pass began while
    /// anything is stored. Expired entries are invisible to lookups at once;
    /// the periodic pass only frees their memory, so it need not run often.
    /// A maintenance loop can tick often and sweep only when this says so:
    /// a full pass costs time in proportion to the whole index.
    pub fn sweep_due(&self, now: u64) -> bool {
        self.sweeper.lock().due(&self.sh, now)
    }

    /// Advances the epoch and frees every retired object whose grace period
    /// has passed; returns the bytes freed. The sweep calls it; tests and
    /// shutdown may too.
    pub fn reclaim(&self) -> usize {
        // Each flush advances the epoch if it can and hands over at most a few
        // bags of deferred functions, so keep flushing until several rounds in
        // a row free nothing (an object needs two epoch advances).
        let (mut bytes, mut idle) = (0, 0);
        for _ in 0..100_000 {
            self.pin().flush();
            match self.sh.rec.reclaim() {
                (0, _) => idle += 1,
                (_, n) => {
                    bytes += n;
                    idle = 0;
                }
            }
            if idle >= 4 {
                break;
            }
        }
        Counters::add(&self.sh.counters.bytes, -(bytes as i64));
        bytes
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        // Unregister every thread's handle, then drop the collector: that runs
        // every deferred function, which queues the retired objects.
        self.handles.clear();
        // SAFETY: dropped exactly once, here; nothing uses it afterwards.
        unsafe { ManuallyDrop::drop(&mut self.collector) };
        let _ = self.sh.rec.reclaim();
        let map = *self.models.get_mut();
        // Dropping the map drops the trees, which free their nodes.
        // SAFETY: exclusive access; the map came from Box::into_raw.
        drop(unsafe { Box::from_raw(map) });
    }
}

impl Reader<'_> {
    /// For every live pod (or only `candidates`) holding at least one block of
    /// `key` under `model`, its matched leading blocks. Unknown models and
    /// candidate names match nothing.
    pub fn lookup(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
        now: u64,
    ) -> Lookup {
        let mut matches = Vec::new();
        let key_blocks = self.lookup_into(model, key, candidates, now, &mut matches);
        Lookup {
            key_blocks,
            matches,
        }
    }

    /// As [`Reader::lookup`], appending to `out` (reuse it to avoid allocating);
    /// returns the key's block count.
    pub fn lookup_into(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
        now: u64,
        out: &mut Vec<Match>,
    ) -> u32 {
        let index = self.index;
        let key = index.cut(key);
        // `max_key_blocks` is far below 2^32 in any sane config; saturate anyway.
        let key_blocks = u32::try_from(key.len()).unwrap_or(u32::MAX);
        let Some(tree) = index.models(&self.guard).get(model) else {
            return key_blocks;
        };
        let ids: Option<SmallVec<[u32; 16]>> = candidates.map(|names| {
            let mut ids: SmallVec<[u32; 16]> = names
                .iter()
                .filter_map(|n| index.sh.pods.id(n, &self.guard))
                .map(PodId::get)
                .collect();
            // Sorted and without repeats: the tree counts them and searches them.
            ids.sort_unstable();
            ids.dedup();
            ids
        });
        tree.lookup(&index.sh, key, ids.as_deref(), now, &self.guard, out);
        key_blocks
    }

    /// The name of a pod id from a lookup made through this reader.
    pub fn pod_name(&self, pod: PodId) -> Option<&str> {
        self.index.sh.pods.name(pod, &self.guard)
    }
}
