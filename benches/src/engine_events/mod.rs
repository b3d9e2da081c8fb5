//! The precise-mode benchmark (`benches/engine_events.rs`): our index fed
//! engine KV-cache events, with room for another index's rows beside ours
//! in the same groups ([`Peer`]).
//!
//! The Mooncake trace is replayed once, outside timing, through 8 simulated
//! pods (requests round-robin, an LRU cache of 16,384 blocks each, or of
//! `ENGINE_EVENTS_CAPACITY`; `engine_sim`'s [`Pods`], releasing tail first
//! as vLLM does) into engine events: per request, the blocks it evicts and
//! one store of the blocks it adds, and vLLM's msgpack of them (every field
//! its GPU block pool sets).
//! The groups:
//!
//! - `ingest/…`: every event into a fresh index, through
//!   `EngineBatch::apply`, a batch per request, or from vLLM's msgpack
//!   batches through `prefix_events::decode_batch` and the server's
//!   `apply_batch` (and through `decode_batch` alone, for its share); and
//!   decoded and applied with identities (`,salted`: a tenant's salt on
//!   each sequence's first block; `,mm`: an item on every block too).
//! - `lookup/…`: every trace request as a key after the ingest, 1 and 2
//!   threads.
//! - `lookup_while_streaming/…`: the same lookups while another thread
//!   applies the events that follow the trace at 100,000 block operations a
//!   second, against the read-only rate in the same group, before the
//!   stream and on the index it left; and `…,alternated`, the same rates
//!   taken in turn within each sample with the writer still, streaming into
//!   the index read, and streaming into a copy nobody reads (what a writer
//!   costs on this machine apart from sharing the index), printed as ratios.
//! - `memory/…` lines (printed): heap per (pod, block) after the ingest,
//!   counted by the global allocator, beside the floor of any layout keyed
//!   by engine hashes (a table of one word per held engine block).
//!
//! [`run`] runs them all; `benches/engine_events.rs` runs ours alone, and
//! the workspace in `benches/dynamo/` runs NVIDIA Dynamo's KV router beside
//! them as a [`Peer`].

mod ingest;
mod lookup;
mod memory;
mod streaming;

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion};
use engine_sim::{request_tokens, Pods, Release, Step, BLOCK_TOKENS as ENGINE_BLOCK};
use prefix_events::encode::Layout;
use prefix_events::{decode_batch, DecodeLimits, Event, RawExtraKey, Removed, Stored};
use prefix_index::{Applied, EngineHandle, EngineOp, Index, IndexConfig, Match};
use prefix_proto::key::token_key;
use prefix_server::Subscription;
use prefix_server::{apply_batch, BlockAliases};

use crate::{mooncake, mooncake_path};

pub use memory::heap_of;
pub use streaming::{stream, while_writing};

/// Simulated pods (engines).
pub const PODS: usize = 8;
/// Blocks each pod caches: about half of the ~31,000 distinct blocks each
/// pod is sent, so a third of the block operations are evictions.
/// `ENGINE_EVENTS_CAPACITY` sets another, such as one whose index fits the
/// processor's caches, to tell what missing them costs.
const CAPACITY: usize = 16_384;

/// The blocks each pod caches in this run.
fn capacity() -> usize {
    match std::env::var("ENGINE_EVENTS_CAPACITY") {
        Ok(v) => v.parse().ok().filter(|&c| c > 0).unwrap_or_else(|| {
            panic!("ENGINE_EVENTS_CAPACITY={v}: not a positive count of blocks")
        }),
        Err(_) => CAPACITY,
    }
}

/// Block operations a second applied while lookups run.
pub const STREAM_RATE: u64 = 100_000;
/// The model every pod serves.
pub const MODEL: &str = "kimi";
/// The clock of every insert and lookup, in ms.
pub const NOW: u64 = 1_700_000_000_000;

/// A criterion group of this benchmark.
pub type Group<'a> = BenchmarkGroup<'a, WallTime>;

/// vLLM msgpack batches, each with its pod.
pub type Payloads = Vec<(usize, Vec<u8>)>;

/// Everything the groups feed the indexes, made once.
pub struct Workload {
    /// Blocks each pod caches.
    pub capacity: usize,
    /// Each request's trace block ids.
    pub requests: Vec<Vec<u64>>,
    /// Each request as the step its pod publishes for it (request `i` on
    /// pod `i % PODS`).
    pub steps: Vec<Step>,
    /// The pods after the replay: where the streamed events go on.
    pub pods: Pods,
    /// Blocks stored plus blocks removed.
    pub ops: u64,
    /// Events: one per block removed, one per store.
    pub events: u64,
    /// Each step as vLLM's msgpack batch, with its pod.
    pub payloads: Vec<(usize, Vec<u8>)>,
    /// The same batches with identities, as (name, batches): `salted`,
    /// every request's first block salted with one of 64 tenants' salts;
    /// `mm`, every block holding a multimodal item too (an image of the
    /// request's own, at its first token), so every block's hash is seeded;
    /// `hybrid`, a hybrid model's engine: every store and removal once for
    /// a full-attention group and once for a sliding-window group of 128
    /// tokens (twice the events, each group's blocks held apart).
    pub identity_payloads: Vec<(&'static str, Payloads)>,
    /// The pods' names, `pod-0` to `pod-7`.
    pub names: Vec<String>,
    /// Each request's token key, as gateways look it up.
    pub our_keys: Vec<Vec<u64>>,
}

impl Workload {
    /// The trace's `requests` through [`PODS`] pods of `capacity()` blocks.
    pub fn new(requests: Vec<Vec<u64>>) -> Self {
        let capacity = capacity();
        let mut pods = Pods::new(PODS, capacity, Release::TailFirst);
        let steps: Vec<Step> = requests
            .iter()
            .enumerate()
            .map(|(r, key)| pods.serve(r % PODS, key))
            .collect();
        let ops = steps.iter().map(Step::block_ops).sum();
        let events = steps.iter().map(|s| s.events.len() as u64).sum();
        let payloads = steps
            .iter()
            .enumerate()
            .map(|(i, s)| (s.pod, gpu_batch(i, s)))
            .collect();
        let identity_payloads = ["salted", "mm", "hybrid"]
            .into_iter()
            .map(|name| {
                let batches = steps
                    .iter()
                    .enumerate()
                    .map(|(i, s)| {
                        let step = match name {
                            "hybrid" => as_hybrid(s),
                            _ => with_identity(s, i, name == "mm"),
                        };
                        (s.pod, gpu_batch(i, &step))
                    })
                    .collect();
                (name, batches)
            })
            .collect();
        let our_keys = requests
            .iter()
            .map(|r| token_key(&request_tokens(r), ENGINE_BLOCK))
            .collect();
        Workload {
            capacity,
            requests,
            steps,
            pods,
            ops,
            events,
            payloads,
            identity_payloads,
            names: (0..PODS).map(|p| format!("pod-{p}")).collect(),
            our_keys,
        }
    }
}

/// Step `i` as vLLM publishes it from the GPU pool, dated a millisecond
/// after step `i - 1`.
fn gpu_batch(i: usize, step: &Step) -> Vec<u8> {
    let mut bytes = Vec::new();
    step.encode(
        1_796_049_997.0 + i as f64 * 1e-3,
        Layout::GpuPool,
        &mut bytes,
    );
    bytes
}

/// Step `i`'s events with extra keys as vLLM publishes them: the request's
/// salt (one of 64 tenants) on a sequence's first block, and with `mm` an
/// item on every block, which started at the request's first token.
fn with_identity(step: &Step, i: usize, mm: bool) -> Step {
    let events = step
        .events
        .iter()
        .map(|e| match e {
            Event::Stored(s) => {
                let extra_keys = (0..s.hashes.len())
                    .map(|b| {
                        let mut keys = Vec::new();
                        if mm {
                            keys.push(RawExtraKey::Mm {
                                identifier: format!("image-{i}").into_bytes().into(),
                                offset: -((b * ENGINE_BLOCK) as i64),
                            });
                        }
                        if b == 0 && s.parent.is_none() {
                            keys.push(RawExtraKey::Text(format!("tenant-{}", i % 64).into()));
                        }
                        (!keys.is_empty()).then(|| keys.into_boxed_slice())
                    })
                    .collect();
                Event::Stored(Stored {
                    extra_keys,
                    ..s.clone()
                })
            }
            other => other.clone(),
        })
        .collect();
    Step {
        pod: step.pod,
        events,
    }
}

/// Step `step`'s events as a hybrid model's engine publishes them: each
/// store and removal for group 0 (full attention), then for group 1 (a
/// sliding window of 128 tokens).
fn as_hybrid(step: &Step) -> Step {
    let events = step
        .events
        .iter()
        .flat_map(|e| match e {
            Event::Stored(s) => [0, 1]
                .map(|g| {
                    Event::Stored(Stored {
                        group: Some(g),
                        group_kind: Some(["full_attention", "sliding_window"][g as usize].into()),
                        sliding_window: (g == 1).then_some(128),
                        ..s.clone()
                    })
                })
                .to_vec(),
            Event::Removed(r) => [0, 1]
                .map(|g| {
                    Event::Removed(Removed {
                        group: Some(g),
                        ..r.clone()
                    })
                })
                .to_vec(),
            other => vec![other.clone()],
        })
        .collect();
    Step {
        pod: step.pod,
        events,
    }
}

/// Our index with every pod registered as engine-fed (vLLM's 16-token
/// blocks over the gateways' 16-token token keys).
pub struct Ours {
    /// The index.
    pub index: Index,
    engines: Vec<EngineHandle>,
    /// What each stored block is also named by.
    alias: prefix_index::Alias,
}

impl Ours {
    /// An empty index with the pods `names` registered, naming each stored
    /// block also by `alias` (as `--block-aliases` has the server do).
    pub fn aliased(names: &[String], alias: prefix_index::Alias) -> Self {
        Ours {
            alias,
            ..Ours::new(names)
        }
    }

    /// An empty index with the pods `names` registered.
    pub fn new(names: &[String]) -> Self {
        let index = Index::new(IndexConfig::default());
        let spec = prefix_server::engine_spec(ENGINE_BLOCK as u32, ENGINE_BLOCK as u32);
        let engines = names
            .iter()
            .map(|n| {
                index
                    .engine(n, spec)
                    .expect("16-token blocks on both sides")
            })
            .collect();
        Ours {
            index,
            engines,
            alias: prefix_index::Alias::None,
        }
    }

    /// Sweeps everything and frees what the sweep unlinked: the state the
    /// server's maintenance thread leaves.
    pub fn swept(self) -> Self {
        self.index.sweep(NOW, usize::MAX);
        self.index.reclaim();
        self
    }

    /// Applies each step's events as one batch (one vLLM batch is one
    /// step), as the server does.
    pub fn apply<'a>(
        &self,
        names: &[String],
        steps: impl IntoIterator<Item = &'a Step>,
    ) -> Applied {
        let mut done = Applied::default();
        for s in steps {
            let mut engine = self.engines[s.pod].lock();
            let mut batch = self.index.batch(&mut engine, &names[s.pod]);
            for e in &s.events {
                let op = match e {
                    Event::Stored(st) => EngineOp::Stored {
                        parent: st.parent,
                        hashes: &st.hashes,
                        tokens: &st.tokens,
                        seeds: &[],
                        alias: self.alias,
                    },
                    Event::Removed(r) => EngineOp::Removed { hashes: &r.hashes },
                    Event::Cleared => EngineOp::Cleared,
                };
                let applied = batch.apply(MODEL, op);
                done.add(&applied.expect("the events are well formed"));
            }
            done.add(&batch.finish().expect("the events are well formed"));
        }
        done
    }

    /// Decodes and applies vLLM batches as the server does; events applied.
    pub fn decode_apply(&self, subs: &[Subscription], payloads: &[(usize, Vec<u8>)]) -> u64 {
        let limits = DecodeLimits::default();
        let mut events = 0;
        for (pod, bytes) in payloads {
            let batch = decode_batch(bytes, &limits).expect("the batches are well formed");
            let (engine, aliases) = (&self.engines[*pod], BlockAliases::None);
            events += apply_batch(&self.index, &subs[*pod], engine, &batch, aliases).events;
        }
        events
    }

    /// Looks every key up; pods named in all.
    pub fn lookups(&self, keys: &[Vec<u64>], out: &mut Vec<Match>) -> usize {
        let mut n = 0;
        for k in keys {
            out.clear();
            self.index.reader().lookup_into(MODEL, k, None, NOW, out);
            n += out.len();
        }
        n
    }
}

/// The server's subscriptions of the pods `names` (what `apply_batch` reads).
pub fn subscriptions(names: &[String]) -> Vec<Subscription> {
    names
        .iter()
        .map(|n| {
            format!("pod={n},model={MODEL},endpoint=tcp://127.0.0.1:1,block-size={ENGINE_BLOCK}")
                .parse()
                .expect("a valid subscription")
        })
        .collect()
}

/// The time of `iters` calls of `run`, each timing its own part (fresh
/// indexes are built and dropped outside it).
pub fn runs(iters: u64, mut run: impl FnMut() -> Duration) -> Duration {
    (0..iters).map(|_| run()).sum()
}

/// Runs `f(thread)` on the calling thread and `threads - 1` helpers at
/// once; wall time.
pub fn parallel(threads: usize, f: impl Fn(usize) + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for t in 1..threads {
            let f = &f;
            s.spawn(move || f(t));
        }
        f(0);
    });
    start.elapsed()
}

/// Our index holding the same (pod, block) pairs as after the ingest, as
/// gateways insert them: the tree alone, no engine records. Each held path
/// is inserted once, whole (inserts of its prefixes after it would leave a
/// node per block).
pub fn gateway_copy(w: &Workload) -> Index {
    // Where each block first appears: a request and its place there.
    let mut first_seen = HashMap::<u64, (usize, usize), ahash::RandomState>::default();
    for (r, key) in w.requests.iter().enumerate() {
        for (i, &id) in key.iter().enumerate() {
            first_seen.entry(id).or_insert((r, i));
        }
    }
    let index = Index::new(IndexConfig::default());
    for (pod, name) in w.names.iter().enumerate() {
        let cache = w.pods.cache(pod);
        let parents: HashSet<u64, ahash::RandomState> = cache
            .blocks()
            .filter_map(|id| {
                let (r, i) = first_seen[&id];
                i.checked_sub(1).map(|p| w.requests[r][p])
            })
            .collect();
        // Each held block with no held child ends a path the pod holds.
        for id in cache.blocks().filter(|id| !parents.contains(id)) {
            let (r, i) = first_seen[&id];
            let key = &w.our_keys[r][..=i];
            index
                .insert(MODEL, key, name, NOW)
                .expect("within the index's bounds");
        }
    }
    index.reclaim();
    index
}

/// Another index run beside ours on the same workload: each method adds
/// its rows or lines where ours are. Every method does nothing by default.
pub trait Peer {
    /// Prints its `memory/…` lines, after ours; `live` reads the heap's
    /// live bytes.
    fn memory(&mut self, _w: &Workload, _live: fn() -> isize) {}

    /// Builds its indexes from the workload and checks them against ours
    /// (`ours` fed the events and swept; `plain`, the same pairs as
    /// gateways insert them), before any group runs.
    fn prepare(&mut self, _w: &Workload, _ours: &Index, _plain: &Index) {}

    /// Adds its rows to the `ingest/…` group, after ours.
    fn ingest(&mut self, _g: &mut Group<'_>, _w: &Workload) {}

    /// Adds its rows to the `lookup/…` group with `threads` threads, after
    /// ours (the group's throughput is set for them).
    fn lookups(&mut self, _g: &mut Group<'_>, _w: &Workload, _threads: usize) {}

    /// Adds its rows to the `lookup_while_streaming/…` group, after ours;
    /// `stream_id` names the streaming rows' parameter.
    fn while_streaming(&mut self, _g: &mut Group<'_>, _w: &Workload, _stream_id: &str) {}
}

/// No peer: our rows alone.
pub struct Alone;

impl Peer for Alone {}

/// Runs the whole benchmark with the rows of the peer `peer` makes from the
/// workload beside ours; `live` reads the heap's live bytes (the bench's
/// counting allocator).
pub fn run<P: Peer>(peer: impl FnOnce(&Workload) -> P, live: fn() -> isize) {
    let mut c = Criterion::default().configure_from_args();
    let Ok(trace) = mooncake(&mooncake_path()) else {
        eprintln!(
            "mooncake trace not found at {}: nothing to run",
            mooncake_path().display()
        );
        return;
    };
    let w = Workload::new(trace.into_iter().map(|r| r.key).collect());
    let stored: u64 = w.steps.iter().map(Step::stored_blocks).sum();
    eprintln!(
        "events: {} requests on {PODS} pods of {} blocks: {} blocks stored, {} removed, {} block operations in {} events ({} msgpack bytes); {} (pod, block) pairs held at the end",
        w.requests.len(),
        w.capacity,
        stored,
        w.ops - stored,
        w.ops,
        w.events,
        w.payloads.iter().map(|(_, p)| p.len()).sum::<usize>(),
        w.pods.held(),
    );
    let peer = &mut peer(&w);
    memory::memory(&w, live, peer);

    let ours = Ours::new(&w.names);
    let done = ours.apply(&w.names, &w.steps);
    eprintln!("ours applied: {done:?}");
    // The server's maintenance thread sweeps; this is the state it leaves.
    let ours = ours.swept();
    let checked = Ours::new(&w.names);
    let events = checked.decode_apply(&subscriptions(&w.names), &w.payloads);
    assert_eq!(events, w.events, "every decoded event applies");
    drop(checked);
    let plain = gateway_copy(&w);
    peer.prepare(&w, &ours.index, &plain);

    ingest::ingest(&mut c, &w, peer);
    let unswept = Ours::new(&w.names);
    unswept.apply(&w.names, &w.steps);
    let hybrid = Ours::new(&w.names);
    let (_, payloads) = w
        .identity_payloads
        .iter()
        .find(|(name, _)| *name == "hybrid")
        .expect("the hybrid payloads");
    hybrid.decode_apply(&subscriptions(&w.names), payloads);
    let hybrid = hybrid.swept();
    // Both groups hold the same blocks: the hybrid rules find the same hits.
    let (mut a, mut b) = (Vec::new(), Vec::new());
    assert_eq!(
        ours.lookups(&w.our_keys, &mut a),
        hybrid.lookups(&w.our_keys, &mut b),
        "a hybrid engine whose groups hold the same blocks answers as a plain one"
    );
    let indexes = [&ours.index, &unswept.index, &plain, &hybrid.index];
    lookup::lookups(&mut c, &w, indexes, peer);
    drop((unswept, plain, hybrid));
    streaming::lookups_while_streaming(&mut c, &w, &ours, peer);
    c.final_summary();
}
