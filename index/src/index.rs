//! The public face: models, pods, readers, writers and the sweep.

use std::collections::HashMap;
use std::sync::Arc;

use prefix_proto::{Receipt, WireStats};
use smallvec::SmallVec;

use crate::config::IndexConfig;
use crate::error::{InsertError, PodError};
use crate::pods::PodId;
use crate::precise::Registry;
use crate::receipts::{ReceiptRefusal, Recorded, Standing};
use crate::reclaim::{Pin, Published};
use crate::shared::Shared;
use crate::stats::{Counters, Stats};
use crate::sweep::Through;
use crate::sweep::{SweepReport, Sweeper};
use crate::sync::Mutex;
use crate::tree::{Match, Tree};
use crate::walk;

pub(crate) type ModelMap = HashMap<Box<str>, Arc<Tree>, ahash::RandomState>;

/// A shared prefix index: one radix tree per model over block-hash keys, with
/// several pods per node, TTLs, capacities and a bounded sweep.
///
/// Lookups never lock, never wait and store nothing shared; writers lock single
/// nodes briefly; the sweep is called by one maintenance thread. Time is always
/// an argument: milliseconds on any clock the caller keeps monotonic (the
/// server uses Unix-epoch milliseconds, so snapshots keep their ages).
pub struct Index {
    pub(crate) sh: Shared,
    models: Published<ModelMap>,
    model_writer: Mutex<()>,
    sweeper: Mutex<Sweeper>,
    /// Engine-fed pods and their engine state (`precise` module).
    pub(crate) engines: Registry,
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
    pin: Pin,
}

impl Index {
    /// An empty index.
    pub fn new(cfg: IndexConfig) -> Self {
        Index {
            sh: Shared::new(cfg),
            models: Published::new(Box::default()),
            model_writer: Mutex::new(()),
            sweeper: Mutex::new(Sweeper::default()),
            engines: Registry::default(),
        }
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &IndexConfig {
        &self.sh.cfg
    }

    /// Pins the calling thread to this index's collector.
    pub(crate) fn pin(&self) -> Pin {
        self.sh.epoch.pin()
    }

    /// A pinned reader for lookups.
    pub fn reader(&self) -> Reader<'_> {
        Reader {
            index: self,
            pin: self.pin(),
        }
    }

    pub(crate) fn models<'g>(&'g self, pin: &'g Pin) -> &'g ModelMap {
        self.models.get(pin)
    }

    pub(crate) fn tree_or_create<'g>(
        &'g self,
        model: &str,
        pin: &'g Pin,
    ) -> Result<&'g Tree, InsertError> {
        if let Some(t) = self.models(pin).get(model) {
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
        let current = self.models(pin);
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
        // The old map's trees live on in the new one (shared `Arc`s).
        self.models.replace(Box::new(next), &self.sh.epoch, pin);
        // Cannot panic: we inserted `model` into the map we just published,
        // and only holders of the writer lock (which we hold) replace it.
        Ok(&self.models(pin)[model])
    }

    pub(crate) fn cut<'k>(&self, key: &'k [u64]) -> &'k [u64] {
        &key[..key.len().min(self.sh.cfg.max_key_blocks)]
    }

    /// Records that `pod` now holds every prefix of `key` under `model`, last
    /// used at `now` (ms). An empty key records nothing. On error, the pod may
    /// hold a prefix of the key.
    ///
    /// For a pod fed by its engine's events the insert is *speculative*:
    /// visible at once, gone after `speculative_ttl` unless the engine
    /// stores the blocks meanwhile.
    pub fn insert(&self, model: &str, key: &[u64], pod: &str, now: u64) -> Result<(), InsertError> {
        let key = self.cut(key);
        if key.is_empty() {
            return Ok(());
        }
        let pin = self.pin();
        let tree = self.tree_or_create(model, &pin)?;
        let id = self
            .sh
            .pods
            .intern(pod, self.sh.cfg.max_name_len, &self.sh.epoch, &pin)?;
        // Dated back so that the lookups' one TTL check ends it early.
        let time = match self.sh.pods.is_precise(id.0) {
            true => now.saturating_sub(self.sh.cfg.speculative_age()),
            false => now,
        };
        tree.insert(&self.sh, key, id.0, time, &pin)
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
    /// entries (and its KV-cache groups', for a hybrid engine-fed pod).
    /// Returns whether it existed.
    pub fn remove_pod(&self, pod: &str) -> bool {
        if pod.contains(crate::precise::groups::HIDDEN_MARK) {
            return false;
        }
        self.remove_hidden(pod);
        let pin = self.pin();
        self.sh.pods.remove(pod, &self.sh.epoch, &pin)
    }

    /// Sets a pod's capacity in blocks (creating the pod if needed). The sweep
    /// evicts its least recently used blocks past it.
    pub fn set_pod_capacity(&self, pod: &str, blocks: u64) -> Result<(), PodError> {
        let pin = self.pin();
        let id = self
            .sh
            .pods
            .intern(pod, self.sh.cfg.max_name_len, &self.sh.epoch, &pin)?;
        self.sh.pods.set_capacity(id, blocks);
        Ok(())
    }

    /// Registers `pods` (those not registered yet) in one step: one rank
    /// table and one copy of the pod-name map for all of them, where
    /// registering each on its own (an insert, [`Index::engine`]) copies
    /// every name registered so far, so thousands one at a time cost their
    /// square in time and in memory awaiting reclamation. A server
    /// following thousands of engines registers their pods so at start.
    /// Stops at the first name refused (reserved, too long, no slot left);
    /// those before it are registered.
    pub fn register_pods<'a>(
        &self,
        pods: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), PodError> {
        let pin = self.pin();
        self.sh
            .pods
            .intern_many(pods, self.sh.cfg.max_name_len, &self.sh.epoch, &pin)
    }

    /// Blocks currently stored for a pod (0 if unknown).
    pub fn pod_blocks(&self, pod: &str) -> u64 {
        let pin = self.pin();
        self.sh
            .pods
            .id(pod, &pin)
            .map_or(0, |id| self.sh.pods.blocks(id.0))
    }

    /// Sizes and sweep totals.
    pub fn stats(&self) -> Stats {
        let pin = self.pin();
        let c = &self.sh.counters;
        let trees = self.models(&pin).values();
        let (aliases, alias_bytes) = trees.fold((0, 0), |(n, b), tree| {
            (
                n + tree.aliases.len() as u64,
                b + tree.aliases.bytes(&pin) as u64,
            )
        });
        Stats {
            aliases,
            alias_bytes,
            size: WireStats {
                models: self.models(&pin).len() as u64,
                pods: self.sh.pods.live_count(&pin) as u64,
                nodes: Counters::get(&c.nodes),
                tree_blocks: Counters::get(&c.tree_blocks),
                entries: Counters::get(&c.entries),
                bytes: Counters::get(&c.bytes),
            },
            sweep_passes: Counters::total(&c.sweep_passes),
            expired: Counters::total(&c.expired),
            evicted: Counters::total(&c.evicted),
            purged: Counters::total(&c.purged),
            engine_blocks: Counters::get(&c.engine_records),
            engine_bytes: Counters::get(&c.engine_bytes),
        }
    }

    /// Sweeps at most `budget` nodes at time `now` (see the `sweep` module), then
    /// frees what earlier grace periods released. Call it from one maintenance
    /// thread; concurrent calls queue on a lock that readers never touch.
    pub fn sweep(&self, now: u64, budget: usize) -> SweepReport {
        let mut sweeper = self.sweeper.lock();
        let mut report = {
            let pin = self.pin();
            let trees = || {
                let pin = self.pin();
                self.models(&pin).values().cloned().collect()
            };
            sweeper.sweep(&self.sh, trees, now, budget, &pin)
        };
        let c = &self.sh.counters;
        Counters::bump(&c.expired, report.expired);
        Counters::bump(&c.evicted, report.evicted);
        Counters::bump(&c.purged, report.purged);
        report.reclaimed_bytes = self.reclaim() as u64;
        report
    }

    /// Per gateway-fed pod, how far the sweep evicted its entries for its
    /// capacity, and how far it evicted every pod's for the global bound
    /// (`max_blocks`): entries of that pod last used then or before are
    /// not to be copied back from a replica that kept them (repair). Pods
    /// never evicted from, and engine-fed ones (their engines say what
    /// they hold), are absent. Waits for a sweep call under way.
    pub fn evicted(&self) -> (HashMap<String, Through>, Option<Through>) {
        let sweeper = self.sweeper.lock();
        let pin = self.pin();
        let (per_pod, global) = sweeper.evicted();
        let named = per_pod
            .iter()
            .filter(|(&id, _)| self.sh.pods.is_gateway(id))
            .filter_map(|(&id, &t)| Some((self.sh.pods.name(PodId(id), &pin)?.to_owned(), t)))
            .collect();
        (named, global)
    }

    /// Makes the sweep evict the entries of gateway-fed `pod` (of every
    /// gateway-fed pod with `None`) that `through` covers, as it would for
    /// a capacity: what a replica does where a peer evicted further (see
    /// [`Index::evicted`]), so that the two hold the same entries. Nothing
    /// happens where the sweep here evicted that far already, for a pod
    /// unknown here, or for an engine-fed one.
    pub fn evict_through(&self, pod: Option<&str>, through: Through) {
        let pin = self.pin();
        let ids: Vec<u32> = match pod {
            Some(name) => self
                .sh
                .pods
                .id(name, &pin)
                .map(|id| id.0)
                .into_iter()
                .collect(),
            None => self.sh.pods.ids_in_use().collect(),
        };
        let mut sweeper = self.sweeper.lock();
        for id in ids.into_iter().filter(|&id| self.sh.pods.is_gateway(id)) {
            sweeper.evict_through(id, through);
        }
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
    /// has passed; returns the bytes freed. The sweep calls it, and a
    /// maintenance loop between sweeps (writers retire whole copies of the
    /// pod names and views even when nothing is due to be swept); tests and
    /// shutdown may too.
    pub fn reclaim(&self) -> usize {
        // Each flush advances the epoch if it can and hands over at most a few
        // bags of deferred functions, so keep flushing until several rounds in
        // a row free nothing (an object needs two epoch advances).
        let (mut bytes, mut idle) = (0, 0);
        for _ in 0..100_000 {
            self.pin().flush();
            match self.sh.epoch.reclaim_ready() {
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

impl<'a> Reader<'a> {
    /// The index read.
    pub(crate) fn index(&self) -> &'a Index {
        self.index
    }

    /// The pin the reader holds.
    pub(crate) fn pin(&self) -> &Pin {
        &self.pin
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
        self.lookup_model_into(model, key, candidates, now, out).0
    }

    /// As [`Reader::lookup_into`], also saying whether `model` has a tree
    /// (some pod was given a block of it): what a caller that counts
    /// lookups per model needs, without a second look at the models.
    pub fn lookup_model_into(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
        now: u64,
        out: &mut Vec<Match>,
    ) -> (u32, bool) {
        let index = self.index;
        let key = index.cut(key);
        // `max_key_blocks` is far below 2^32 in any sane config; saturate anyway.
        let key_blocks = u32::try_from(key.len()).unwrap_or(u32::MAX);
        let Some(tree) = index.models(&self.pin).get(model) else {
            return (key_blocks, false);
        };
        let ids: Option<SmallVec<[u32; 16]>> = candidates.map(|names| {
            let mut ids: SmallVec<[u32; 16]> = names
                .iter()
                .filter_map(|n| index.sh.pods.id(n, &self.pin))
                .map(PodId::get)
                .collect();
            // Sorted and without repeats: the tree counts them and searches them.
            ids.sort_unstable();
            ids.dedup();
            ids
        });
        tree.lookup(
            &index.sh,
            key,
            ids.as_deref(),
            now,
            &self.pin,
            out,
            &index.engines,
        );
        (key_blocks, true)
    }

    /// Up to `count` keys the index holds, each with its model: the blocks
    /// from a tree's root down to a leaf (at most `max_key_blocks`), by a
    /// descent that picks the model and each child at random, `seed`
    /// deciding (the same seed on the same trees gives the same keys). What
    /// a tool comparing replicas looks up on each. Empty for an empty index.
    pub fn sample_keys(&self, count: usize, seed: u64) -> Vec<(&str, Vec<u64>)> {
        let mut trees: Vec<(&str, &Tree)> = self
            .index
            .models(&self.pin)
            .iter()
            .map(|(model, tree)| (&**model, &**tree))
            .collect();
        if trees.is_empty() {
            return Vec::new();
        }
        // A fixed order, so that the seed alone decides.
        trees.sort_unstable_by_key(|(model, _)| *model);
        let random = ahash::RandomState::with_seeds(seed, 0x9e37_79b9_7f4a_7c15, 1, 2);
        let max = self.index.sh.cfg.max_key_blocks;
        (0..count)
            .filter_map(|i| {
                let which = random.hash_one((i, usize::MAX)) % trees.len() as u64;
                let (model, tree) = trees[which as usize];
                let pick = |level: usize| random.hash_one((i, level)) as usize;
                let key = walk::descend(tree.root(&self.pin), max, pick);
                (!key.is_empty()).then_some((model, key))
            })
            .collect()
    }

    /// The name of a pod id from a lookup made through this reader.
    pub fn pod_name(&self, pod: PodId) -> Option<&str> {
        self.index.sh.pods.name(pod, &self.pin)
    }
}

impl Index {
    /// Counts `receipt` for its pod at `now`, the engine's reuse read in
    /// blocks of `block_tokens` tokens (the server's token block) and whole
    /// engine blocks of the pod.
    pub fn record_receipt(
        &self,
        receipt: &Receipt,
        block_tokens: u32,
        now: u64,
    ) -> Result<Recorded, ReceiptRefusal> {
        let (sh, pin) = (&self.sh, self.pin());
        receipt.check()?;
        let id = sh
            .pods
            .id(&receipt.pod, &pin)
            .filter(|id| sh.pods.is_match(id.0))
            .ok_or_else(|| ReceiptRefusal::UnknownPod {
                pod: receipt.pod.clone(),
            })?;
        let rule = &sh.cfg.receipts;
        let align = sh.pods.align(id.0);
        let judged = receipt.judge(block_tokens, align, rule.tolerance)?;
        let (change, counts) = sh.pods.receipts(id.0).record(judged.outcome, rule, now);
        Ok(Recorded {
            judged,
            counts,
            change,
        })
    }

    /// Forgets `pod`'s recent receipts (not its totals): what they said is
    /// answered (its engine was learnt anew). Returns whether the pod is in
    /// the index.
    pub fn restart_receipts(&self, pod: &str) -> bool {
        let (sh, pin) = (&self.sh, self.pin());
        let Some(id) = sh.pods.id(pod, &pin).filter(|id| sh.pods.is_match(id.0)) else {
            return false;
        };
        sh.pods.receipts(id.0).restart();
        true
    }

    /// Each live pod's receipts since it was named, by outcome
    /// ([`prefix_proto::ReceiptOutcome::ALL`] order), for pods with any, by name.
    pub fn receipt_totals(&self) -> Vec<(String, [u64; 3])> {
        let (sh, pin) = (&self.sh, self.pin());
        let mut all: Vec<(String, [u64; 3])> = sh
            .pods
            .live(&pin)
            .filter(|&(_, id)| !sh.pods.is_hidden(id))
            .map(|(name, id)| (name.to_owned(), sh.pods.receipts(id).totals()))
            .filter(|(_, t)| t.iter().any(|&n| n > 0))
            .collect();
        all.sort_unstable();
        all
    }
}

impl Reader<'_> {
    /// `pod`'s recent receipts and whether they make it suspect at `now`.
    pub fn receipts(&self, pod: PodId, now: u64) -> Standing {
        let sh = &self.index().sh;
        sh.pods.receipts(pod.0).standing(&sh.cfg.receipts, now)
    }

    /// As [`Reader::receipts`], by name: none for a pod not in the index.
    pub fn receipts_of(&self, pod: &str, now: u64) -> Option<Standing> {
        let sh = &self.index().sh;
        let id = sh.pods.id(pod, self.pin())?;
        sh.pods.is_match(id.0).then(|| self.receipts(id, now))
    }
}
