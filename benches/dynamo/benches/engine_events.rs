//! Precise mode against NVIDIA Dynamo's KV router (`dynamo-kv-router`): the
//! same engine events, the same questions, in one run. The groups are
//! those of our own `engine_events` bench (`prefix_benches::engine_events`,
//! the same workload and row names), with Dynamo's rows added to each:
//!
//! - `ingest/…`: Dynamo's `RadixTree::apply_event`, or from the same vLLM
//!   batches through its own decoder and normalizer (`zmq_wire`); its
//!   `ConcurrentRadixTreeCompressed` through `ThreadPoolIndexer` (its only
//!   public way in: one producer thread, `workers` applying threads), timed
//!   to the end of `flush`.
//! - `lookup/…`: the concurrent tree on 1 and 2 threads, `RadixTree` on 1
//!   (it is single-threaded).
//! - `lookup_while_streaming/…`: the concurrent tree read-only and while
//!   its thread pool applies the events that follow the trace.
//! - `memory/dynamo-…` lines, after ours.
//!
//! Before the groups it checks that ours, `RadixTree` (fed the events, and
//! fed the same msgpack bytes through Dynamo's decoder) and the concurrent
//! tree give every trace request the same answer.
//!
//! `cargo bench --manifest-path benches/dynamo/Cargo.toml --bench
//! engine_events`; see `docs/benchmarks.md`, "Precise mode".

use std::hint::black_box;
use std::time::Instant;

use counting_alloc::Counting;
use criterion::BenchmarkId;
use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::protocols::{
    compute_block_hash_for_seq, BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent,
    KvCacheEventData, KvCacheRemoveData, KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash,
    PlacementEvent, RouterEvent, WorkerWithDpRank,
};
use dynamo_kv_router::zmq_wire::{decode_event_batch, ZmqEventNormalizer};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, RadixTree};
use engine_sim::{request_tokens, Step, BLOCK_TOKENS as ENGINE_BLOCK};
use prefix_benches::engine_events::{
    heap_of, parallel, run, runs, stream, while_writing, Group, Peer, Workload, MODEL, NOW, PODS,
};
use prefix_events::Event;
use prefix_index::Index;

/// mimalloc (the server's allocator), counting live bytes for the memory figures.
#[global_allocator]
static GLOBAL: Counting<mimalloc::MiMalloc> = Counting::new(mimalloc::MiMalloc);

type Crtc = ThreadPoolIndexer<ConcurrentRadixTreeCompressed>;

/// Appends `step`'s events in Dynamo's form; `ids` numbers each pod's.
fn router_events(step: &Step, ids: &mut [u64], out: &mut Vec<RouterEvent>) {
    let mut event = |data| {
        let event_id = ids[step.pod];
        ids[step.pod] += 1;
        RouterEvent::new(
            step.pod as u64,
            KvCacheEvent {
                event_id,
                data,
                dp_rank: 0,
            },
        )
    };
    for e in &step.events {
        let data = match e {
            Event::Removed(r) => KvCacheEventData::Removed(KvCacheRemoveData {
                block_hashes: r
                    .hashes
                    .iter()
                    .map(|&h| ExternalSequenceBlockHash(h))
                    .collect(),
            }),
            Event::Stored(s) => {
                let local = compute_block_hash_for_seq(
                    &s.tokens,
                    ENGINE_BLOCK as u32,
                    BlockHashOptions::default(),
                );
                let blocks = s
                    .hashes
                    .iter()
                    .zip(local)
                    .map(|(&h, tokens_hash)| KvCacheStoredBlockData {
                        block_hash: ExternalSequenceBlockHash(h),
                        tokens_hash,
                        mm_extra_info: None,
                    })
                    .collect();
                KvCacheEventData::Stored(KvCacheStoreData {
                    parent_hash: s.parent.map(ExternalSequenceBlockHash),
                    start_position: None,
                    blocks,
                })
            }
            Event::Cleared => KvCacheEventData::Cleared,
        };
        out.push(event(data));
    }
}

/// Decodes vLLM batches with Dynamo's decoder and normalizer (one per pod,
/// as each engine's listener has) and hands each event to `apply`, which
/// says whether it was applied; events refused.
fn their_decode_apply(
    payloads: &[(usize, Vec<u8>)],
    mut apply: impl FnMut(RouterEvent) -> bool,
) -> u64 {
    let mut normalizers: Vec<_> = (0..PODS)
        .map(|_| ZmqEventNormalizer::new(ENGINE_BLOCK as u32))
        .collect();
    let mut ids = [0u64; PODS];
    let mut refused = 0;
    for (pod, bytes) in payloads {
        let batch = decode_event_batch(bytes).expect("the batches are well formed");
        let worker = WorkerWithDpRank::new(*pod as u64, 0);
        for raw in batch.events {
            ids[*pod] += 1;
            let event = normalizers[*pod]
                .normalize(raw, ids[*pod], worker)
                .and_then(PlacementEvent::into_router_event);
            if !event.is_some_and(&mut apply) {
                refused += 1;
            }
        }
    }
    refused
}

/// Dynamo's concurrent tree behind its thread pool of `workers` threads.
fn crtc(workers: usize) -> Crtc {
    ThreadPoolIndexer::new(
        ConcurrentRadixTreeCompressed::new(),
        workers,
        ENGINE_BLOCK as u32,
    )
}

/// Hands every event to `crtc`'s threads and waits until they applied them.
fn crtc_apply(rt: &tokio::runtime::Runtime, crtc: &Crtc, events: Vec<RouterEvent>) {
    for e in events {
        crtc.enqueue_event(e).expect("the indexer runs");
    }
    rt.block_on(crtc.flush());
}

/// Each pod's matched blocks, by pod number, sorted.
type Answer = Vec<(u64, u32)>;

fn our_answer(index: &Index, key: &[u64]) -> Answer {
    let reader = index.reader();
    let mut a: Answer = reader
        .lookup(MODEL, key, None, NOW)
        .matches
        .iter()
        .filter_map(|m| {
            let name = reader.pod_name(m.pod)?;
            Some((name.strip_prefix("pod-")?.parse().ok()?, m.blocks))
        })
        .collect();
    a.sort_unstable();
    a
}

fn their_answer(scores: dynamo_kv_router::OverlapScores) -> Answer {
    let mut a: Answer = scores
        .scores
        .iter()
        .filter(|(_, &s)| s > 0)
        .map(|(w, &s)| (w.worker_id, s))
        .collect();
    a.sort_unstable();
    a
}

/// Dynamo's side: the workload's events and keys in its form, and its
/// indexes once `prepare` built them.
struct Dynamo {
    rt: tokio::runtime::Runtime,
    /// The same events in Dynamo's form (one `BlockRemoved` per block).
    router: Vec<RouterEvent>,
    /// Each request's key: Dynamo's hashes of its blocks' tokens.
    keys: Vec<Vec<LocalBlockHash>>,
    radix: Option<RadixTree>,
    crtc: Option<Crtc>,
}

impl Dynamo {
    fn new(w: &Workload) -> Self {
        let mut ids = [0u64; PODS];
        let mut router = Vec::new();
        for s in &w.steps {
            router_events(s, &mut ids, &mut router);
        }
        assert_eq!(router.len() as u64, w.events, "an event for each of ours");
        let keys = w
            .requests
            .iter()
            .map(|r| {
                compute_block_hash_for_seq(
                    &request_tokens(r),
                    ENGINE_BLOCK as u32,
                    BlockHashOptions::default(),
                )
            })
            .collect();
        Dynamo {
            rt: tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a current-thread runtime"),
            router,
            keys,
            radix: None,
            crtc: None,
        }
    }

    fn radix(&self) -> &RadixTree {
        self.radix.as_ref().expect("prepared")
    }

    fn crtc(&self) -> &Crtc {
        self.crtc.as_ref().expect("prepared")
    }

    /// Checks that the three indexes give every trace request the same
    /// answer: the comparison means something only if they hold the same
    /// thing.
    fn same_answers(&self, w: &Workload, ours: &Index, radix: &RadixTree) {
        let crtc = self.crtc().backend();
        let mut differ = 0;
        let mut pods_named = 0;
        for (k, (ok, tk)) in w.our_keys.iter().zip(&self.keys).enumerate() {
            let a = our_answer(ours, ok);
            let b = their_answer(radix.find_matches(tk.clone(), false));
            let c = their_answer(crtc.find_matches(tk, false));
            pods_named += a.len();
            if a != b || a != c {
                if differ == 0 {
                    eprintln!("request {k}: ours {a:?}, RadixTree {b:?}, concurrent {c:?}");
                }
                differ += 1;
            }
        }
        eprintln!(
            "answers: {} requests, {differ} differ; {:.2} pods named per answer",
            w.our_keys.len(),
            pods_named as f64 / w.our_keys.len() as f64
        );
        assert_eq!(differ, 0, "the indexes disagree");
    }
}

impl Peer for Dynamo {
    fn memory(&mut self, w: &Workload, live: fn() -> isize) {
        let pairs = w.pods.held() as f64;
        // Events are cloned one at a time and consumed: what stays is the tree's.
        let (radix, heap) = heap_of(live, || {
            let mut tree = RadixTree::new();
            for e in &self.router {
                let _ = tree.apply_event(e.clone());
            }
            tree
        });
        eprintln!(
            "memory/dynamo-radix: {heap} B = {:.1} B per (pod, block)",
            heap as f64 / pairs
        );
        drop(radix);
        let (crtc, heap) = heap_of(live, || {
            let crtc = crtc(1);
            for e in &self.router {
                crtc.enqueue_event(e.clone()).expect("the indexer runs");
            }
            self.rt.block_on(crtc.flush());
            crtc
        });
        eprintln!(
            "memory/dynamo-concurrent (with its worker thread's lookup tables): {heap} B = {:.1} B per (pod, block)",
            heap as f64 / pairs
        );
        drop(crtc);
    }

    fn prepare(&mut self, w: &Workload, ours: &Index, plain: &Index) {
        let mut radix = RadixTree::new();
        let refused = self
            .router
            .iter()
            .filter(|e| radix.apply_event((*e).clone()).is_err())
            .count();
        let mut decoded = RadixTree::new();
        let refused_decoded = their_decode_apply(&w.payloads, |e| decoded.apply_event(e).is_ok());
        eprintln!("dynamo refused: {refused} events; from the batches {refused_decoded}");
        let crtc = crtc(1);
        crtc_apply(&self.rt, &crtc, self.router.clone());
        self.crtc = Some(crtc);
        self.same_answers(w, ours, &radix);
        self.same_answers(w, ours, &decoded);
        self.same_answers(w, plain, &radix);
        self.radix = Some(radix);
    }

    fn ingest(&mut self, g: &mut Group<'_>, w: &Workload) {
        let rt = &self.rt;
        let router = &self.router;
        g.bench_function(
            BenchmarkId::new("dynamo-radix/apply_event", "threads=1"),
            |b| {
                b.iter_custom(|iters| {
                    runs(iters, || {
                        let events = router.clone();
                        let mut tree = RadixTree::new();
                        let start = Instant::now();
                        for e in events {
                            black_box(tree.apply_event(e).is_ok());
                        }
                        start.elapsed()
                    })
                })
            },
        );
        g.bench_function(
            BenchmarkId::new("dynamo-radix/decode+apply_event", "threads=1"),
            |b| {
                b.iter_custom(|iters| {
                    runs(iters, || {
                        let mut tree = RadixTree::new();
                        let start = Instant::now();
                        black_box(their_decode_apply(&w.payloads, |e| {
                            tree.apply_event(e).is_ok()
                        }));
                        start.elapsed()
                    })
                })
            },
        );
        for workers in [1usize, 2] {
            g.bench_function(
                BenchmarkId::new(
                    "dynamo-concurrent/enqueue+flush",
                    format!("workers={workers}"),
                ),
                |b| {
                    b.iter_custom(|iters| {
                        runs(iters, || {
                            let (events, crtc) = (router.clone(), crtc(workers));
                            let start = Instant::now();
                            crtc_apply(rt, &crtc, events);
                            start.elapsed()
                        })
                    })
                },
            );
        }
        g.bench_function(
            BenchmarkId::new("dynamo-concurrent/decode+enqueue+flush", "workers=1"),
            |b| {
                b.iter_custom(|iters| {
                    runs(iters, || {
                        let crtc = crtc(1);
                        let start = Instant::now();
                        black_box(their_decode_apply(&w.payloads, |e| {
                            crtc.enqueue_event(e).is_ok()
                        }));
                        rt.block_on(crtc.flush());
                        start.elapsed()
                    })
                })
            },
        );
    }

    fn lookups(&mut self, g: &mut Group<'_>, _w: &Workload, threads: usize) {
        let id = |name: &str| BenchmarkId::new(name, format!("threads={threads}"));
        let (keys, crtc) = (&self.keys, self.crtc());
        g.bench_function(id("dynamo-concurrent"), |b| {
            b.iter_custom(|iters| {
                parallel(threads, |_| {
                    for _ in 0..iters {
                        for k in keys {
                            black_box(crtc.backend().find_matches(k, false));
                        }
                    }
                })
            })
        });
        if threads == 1 {
            // `RadixTree` is `!Sync` (reference-counted cells): one thread.
            let radix = self.radix();
            g.bench_function(id("dynamo-radix"), |b| {
                b.iter(|| {
                    for k in keys {
                        black_box(radix.find_matches(k.clone(), false));
                    }
                })
            });
        }
    }

    fn while_streaming(&mut self, g: &mut Group<'_>, w: &Workload, stream_id: &str) {
        // `RadixTree` has no rows here; free it before the stream.
        self.radix = None;
        let (keys, crtc) = (&self.keys, self.crtc());
        let their_lookups = || {
            for k in keys {
                black_box(crtc.backend().find_matches(k, false));
            }
        };
        g.bench_function(BenchmarkId::new("dynamo-concurrent", "read_only"), |b| {
            b.iter(their_lookups)
        });
        let mut ids = [1u64 << 40; PODS];
        while_writing(g, "dynamo-concurrent", stream_id, their_lookups, |stop| {
            let mut events = Vec::new();
            stream(w, stop, |s| {
                router_events(s, &mut ids, &mut events);
                for e in events.drain(..) {
                    crtc.enqueue_event(e).expect("the indexer runs");
                }
            })
        });
    }
}

fn main() {
    run(Dynamo::new, || GLOBAL.live());
}
