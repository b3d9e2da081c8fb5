//! Precise mode against NVIDIA Dynamo's KV router (`dynamo-kv-router`): the
//! same engine events, the same questions, in one run.
//!
//! The Mooncake trace is replayed once, outside timing, through 8 simulated
//! pods (requests round-robin, an LRU cache of 16,384 blocks each, or of
//! `ENGINE_EVENTS_CAPACITY`; `prefix_benches::precise`) into engine events:
//! per request, the blocks it evicts and one store of the blocks it adds.
//! The groups:
//!
//! - `ingest/…`: every event into a fresh index. Ours through
//!   `EngineBatch::apply`, a batch per request, or from vLLM's msgpack batches through
//!   `prefix_events::decode_batch` and the server's `apply_batch` (and
//!   through `decode_batch` alone, for its share); Dynamo's
//!   `RadixTree::apply_event`, or from the same batches through its own
//!   decoder and normalizer (`zmq_wire`); its `ConcurrentRadixTreeCompressed`
//!   through `ThreadPoolIndexer` (its only public way in: one producer
//!   thread, `workers` applying threads), timed to the end of `flush`.
//! - `lookup/…`: every trace request as a key after the ingest, 1 and 2
//!   threads (`RadixTree` is single-threaded: 1 only).
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
//! `cargo bench -p prefix-benches --bench engine_events`; see
//! `docs/benchmarks.md`, "Precise mode".

use std::collections::HashMap;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use counting_alloc::Counting;
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use dynamo_kv_router::indexer::{SyncIndexer, ThreadPoolIndexer};
use dynamo_kv_router::protocols::{
    compute_block_hash_for_seq, BlockHashOptions, ExternalSequenceBlockHash, KvCacheEvent,
    KvCacheEventData, KvCacheRemoveData, KvCacheStoreData, KvCacheStoredBlockData, LocalBlockHash,
    PlacementEvent, RouterEvent, WorkerWithDpRank,
};
use dynamo_kv_router::zmq_wire::{decode_event_batch, ZmqEventNormalizer};
use dynamo_kv_router::{ConcurrentRadixTreeCompressed, RadixTree};
use prefix_benches::precise::{
    encode_vllm_batch, replay, request_tokens, EngineTrace, PodCaches, Step, ENGINE_BLOCK,
};
use prefix_benches::{mooncake, mooncake_path};
use prefix_events::{decode_batch, DecodeLimits};
use prefix_index::{Applied, EngineHandle, EngineOp, EngineSpec, Index, IndexConfig, Match};
use prefix_proto::key::{hash_token_block, token_key};
use prefix_server::engines::apply::apply_batch;
use prefix_server::engines::Subscription;

/// mimalloc (the server's allocator), counting live bytes for the memory figures.
#[global_allocator]
static GLOBAL: Counting<mimalloc::MiMalloc> = Counting::new(mimalloc::MiMalloc);

/// Simulated pods (engines).
const PODS: usize = 8;
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
const STREAM_RATE: u64 = 100_000;
const MODEL: &str = "kimi";
const NOW: u64 = 1_700_000_000_000;

type Crtc = ThreadPoolIndexer<ConcurrentRadixTreeCompressed>;

/// Everything the groups feed the indexes, made once.
struct Workload {
    /// Blocks each pod caches.
    capacity: usize,
    trace: EngineTrace,
    steps: Vec<Step>,
    /// The pods' caches after the replay: where the streamed events go on.
    caches: PodCaches,
    /// Blocks stored plus blocks removed.
    ops: u64,
    /// Each step as vLLM's msgpack batch, with its pod.
    payloads: Vec<(usize, Vec<u8>)>,
    /// The same events in Dynamo's form (one `BlockRemoved` per block).
    router: Vec<RouterEvent>,
    names: Vec<String>,
    our_keys: Vec<Vec<u64>>,
    their_keys: Vec<Vec<LocalBlockHash>>,
}

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
    for &h in &step.removed {
        out.push(event(KvCacheEventData::Removed(KvCacheRemoveData {
            block_hashes: vec![ExternalSequenceBlockHash(h)],
        })));
    }
    if let Some(s) = &step.stored {
        let local =
            compute_block_hash_for_seq(&s.tokens, ENGINE_BLOCK as u32, BlockHashOptions::default());
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
        out.push(event(KvCacheEventData::Stored(KvCacheStoreData {
            parent_hash: s.parent.map(ExternalSequenceBlockHash),
            start_position: None,
            blocks,
        })));
    }
}

impl Workload {
    fn new(requests: Vec<Vec<u64>>) -> Self {
        let capacity = capacity();
        let trace = EngineTrace::new(requests);
        let (steps, caches) = replay(&trace, PODS, capacity);
        let ops = steps.iter().map(Step::block_ops).sum();
        let payloads = steps
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let mut bytes = Vec::new();
                encode_vllm_batch(s, 1_796_049_997.0 + i as f64 * 1e-3, &mut bytes);
                (s.pod, bytes)
            })
            .collect();
        let mut ids = [0u64; PODS];
        let mut router = Vec::new();
        for s in &steps {
            router_events(s, &mut ids, &mut router);
        }
        let (mut our_keys, mut their_keys) = (Vec::new(), Vec::new());
        for r in &trace.requests {
            let tokens = request_tokens(r);
            our_keys.push(token_key(&tokens, ENGINE_BLOCK));
            their_keys.push(compute_block_hash_for_seq(
                &tokens,
                ENGINE_BLOCK as u32,
                BlockHashOptions::default(),
            ));
        }
        Workload {
            capacity,
            trace,
            steps,
            caches,
            ops,
            payloads,
            router,
            names: (0..PODS).map(|p| format!("pod-{p}")).collect(),
            our_keys,
            their_keys,
        }
    }
}

/// Our index with every pod registered as engine-fed (vLLM's 16-token
/// blocks over the gateways' 16-token token keys).
struct Ours {
    index: Index,
    engines: Vec<EngineHandle>,
}

impl Ours {
    fn new(names: &[String]) -> Self {
        let index = Index::new(IndexConfig::default());
        let spec = EngineSpec {
            engine_block: ENGINE_BLOCK as u32,
            our_block: ENGINE_BLOCK as u32,
            hash: hash_token_block,
        };
        let engines = names
            .iter()
            .map(|n| {
                index
                    .engine(n, spec)
                    .expect("16-token blocks on both sides")
            })
            .collect();
        Ours { index, engines }
    }

    /// Applies each step's events as one batch (one vLLM batch is one
    /// step), as the server does.
    fn apply<'a>(&self, names: &[String], steps: impl IntoIterator<Item = &'a Step>) -> Applied {
        let mut done = Applied::default();
        for s in steps {
            let mut engine = self.engines[s.pod].lock();
            let mut batch = self.index.batch(&mut engine, &names[s.pod]);
            let mut op = |op| {
                let applied = batch.apply(MODEL, op);
                done.add(&applied.expect("the events are well formed"));
            };
            for h in &s.removed {
                op(EngineOp::Removed {
                    hashes: std::slice::from_ref(h),
                });
            }
            if let Some(st) = &s.stored {
                op(EngineOp::Stored {
                    parent: st.parent,
                    hashes: &st.hashes,
                    tokens: &st.tokens,
                });
            }
            done.add(&batch.finish().expect("the events are well formed"));
        }
        done
    }

    /// Decodes and applies vLLM batches as the server does; events applied.
    fn decode_apply(&self, subs: &[Subscription], payloads: &[(usize, Vec<u8>)]) -> u64 {
        let limits = DecodeLimits::default();
        let mut events = 0;
        for (pod, bytes) in payloads {
            let batch = decode_batch(bytes, &limits).expect("the batches are well formed");
            events += apply_batch(&self.index, &subs[*pod], &self.engines[*pod], &batch).events;
        }
        events
    }

    fn lookups(&self, keys: &[Vec<u64>], out: &mut Vec<Match>) -> usize {
        let mut n = 0;
        for k in keys {
            out.clear();
            self.index.reader().lookup_into(MODEL, k, None, NOW, out);
            n += out.len();
        }
        n
    }
}

fn subscriptions(names: &[String]) -> Vec<Subscription> {
    names
        .iter()
        .map(|n| {
            format!("pod={n},model={MODEL},endpoint=tcp://127.0.0.1:1,block-size={ENGINE_BLOCK}")
                .parse()
                .expect("a valid subscription")
        })
        .collect()
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

/// The time of `iters` calls of `run`, each timing its own part (fresh
/// indexes are built and dropped outside it).
fn runs(iters: u64, mut run: impl FnMut() -> Duration) -> Duration {
    (0..iters).map(|_| run()).sum()
}

/// Runs `f(thread)` on the calling thread and `threads - 1` helpers at
/// once; wall time.
fn parallel(threads: usize, f: impl Fn(usize) + Sync) -> Duration {
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

/// Checks that the three indexes give every trace request the same answer:
/// the comparison means something only if they hold the same thing.
fn same_answers(
    w: &Workload,
    ours: &Index,
    radix: &RadixTree,
    crtc: &ConcurrentRadixTreeCompressed,
) {
    let mut differ = 0;
    let mut pods_named = 0;
    for (k, (ok, tk)) in w.our_keys.iter().zip(&w.their_keys).enumerate() {
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

fn ingest(c: &mut Criterion, w: &Workload, rt: &tokio::runtime::Runtime) {
    let subs = subscriptions(&w.names);
    let by_thread: [Vec<&Step>; 2] =
        [0, 1].map(|t| w.steps.iter().filter(|s| s.pod % 2 == t).collect());
    let mut g = c.benchmark_group(format!("ingest/mooncake_{PODS}pods_{}blocks", w.capacity));
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.throughput(Throughput::Elements(w.ops));
    for threads in [1usize, 2] {
        g.bench_function(
            BenchmarkId::new("ours/apply", format!("threads={threads}")),
            |b| {
                b.iter_custom(|iters| {
                    runs(iters, || {
                        let o = Ours::new(&w.names);
                        let t = if threads == 1 {
                            let start = Instant::now();
                            black_box(o.apply(&w.names, &w.steps));
                            start.elapsed()
                        } else {
                            parallel(2, |t| {
                                black_box(o.apply(&w.names, by_thread[t].iter().copied()));
                            })
                        };
                        drop(o);
                        t
                    })
                })
            },
        );
    }
    // Decoding alone, to tell its share of decode+apply.
    g.bench_function(BenchmarkId::new("ours/decode", "threads=1"), |b| {
        let limits = DecodeLimits::default();
        b.iter(|| {
            let mut events = 0;
            for (_, bytes) in &w.payloads {
                let batch = decode_batch(bytes, &limits).expect("the batches are well formed");
                events += batch.events.len();
            }
            black_box(events)
        })
    });
    g.bench_function(BenchmarkId::new("ours/decode+apply", "threads=1"), |b| {
        b.iter_custom(|iters| {
            runs(iters, || {
                let o = Ours::new(&w.names);
                let start = Instant::now();
                black_box(o.decode_apply(&subs, &w.payloads));
                start.elapsed()
            })
        })
    });
    g.bench_function(
        BenchmarkId::new("dynamo-radix/apply_event", "threads=1"),
        |b| {
            b.iter_custom(|iters| {
                runs(iters, || {
                    let events = w.router.clone();
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
                        let (events, crtc) = (w.router.clone(), crtc(workers));
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
    g.finish();
}

fn lookups(c: &mut Criterion, w: &Workload, ours: [&Index; 3], radix: &RadixTree, crtc: &Crtc) {
    let n = w.our_keys.len() as u64;
    let mut g = c.benchmark_group(format!("lookup/mooncake_{n}_requests"));
    g.sample_size(20);
    for threads in [1usize, 2] {
        g.throughput(Throughput::Elements(n * threads as u64));
        let id = |name: &str| BenchmarkId::new(name, format!("threads={threads}"));
        // After the sweep (the server's maintenance); before it; the same
        // pairs inserted by gateways (the tree without engine feeding).
        for (name, index) in ["ours", "ours-unswept", "ours-gateway-fed"]
            .iter()
            .zip(ours)
        {
            g.bench_function(id(name), |b| {
                b.iter_custom(|iters| {
                    parallel(threads, |_| {
                        let mut out = Vec::new();
                        for _ in 0..iters {
                            for k in &w.our_keys {
                                out.clear();
                                index.reader().lookup_into(MODEL, k, None, NOW, &mut out);
                                black_box(&out);
                            }
                        }
                    })
                })
            });
        }
        g.bench_function(id("dynamo-concurrent"), |b| {
            b.iter_custom(|iters| {
                parallel(threads, |_| {
                    for _ in 0..iters {
                        for k in &w.their_keys {
                            black_box(crtc.backend().find_matches(k, false));
                        }
                    }
                })
            })
        });
        if threads == 1 {
            // `RadixTree` is `!Sync` (reference-counted cells): one thread.
            g.bench_function(id("dynamo-radix"), |b| {
                b.iter(|| {
                    for k in &w.their_keys {
                        black_box(radix.find_matches(k.clone(), false));
                    }
                })
            });
        }
    }
    g.finish();
}

/// The requests after the replay (the trace again, round-robin going on),
/// served to pods whose caches start as the replay left them.
struct Requests {
    caches: PodCaches,
    next: usize,
}

impl Requests {
    fn new(w: &Workload) -> Self {
        Requests {
            caches: w.caches.clone(),
            next: w.trace.requests.len(),
        }
    }

    /// The next request's step.
    fn step(&mut self, w: &Workload) -> Step {
        let g = self.next;
        self.next += 1;
        self.caches
            .serve(&w.trace, g % w.trace.requests.len(), g % PODS)
    }
}

/// Keeps `STREAM_RATE` block operations a second from `start`: sleeps
/// while `ops` are ahead of it.
fn keep_rate(start: Instant, ops: u64) {
    while ops as f64 > start.elapsed().as_secs_f64() * STREAM_RATE as f64 {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Serves the requests after the replay and hands each step to `apply`,
/// at `STREAM_RATE` block operations a second, until `stop`; block
/// operations applied and the time taken.
fn stream(w: &Workload, stop: &AtomicBool, mut apply: impl FnMut(&Step)) -> (u64, Duration) {
    let mut requests = Requests::new(w);
    let start = Instant::now();
    let mut ops = 0u64;
    // Relaxed: a flag polled between steps, ordering nothing else.
    while !stop.load(Ordering::Relaxed) {
        keep_rate(start, ops);
        let step = requests.step(w);
        apply(&step);
        ops += step.block_ops();
    }
    (ops, start.elapsed())
}

/// Measures `lookups` while `writer` streams events in (it runs from
/// before the function's warm-up to after its last sample).
fn while_writing(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    parameter: &str,
    lookups: impl Fn(),
    writer: impl FnOnce(&AtomicBool) -> (u64, Duration) + Send,
) {
    let id = BenchmarkId::new(name, parameter);
    let stop = AtomicBool::new(false);
    let (ops, took) = std::thread::scope(|s| {
        let writer = s.spawn(|| writer(&stop));
        g.bench_function(id, |b| b.iter(&lookups));
        // Relaxed: see `stream`.
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("the writer thread")
    });
    if ops > 0 {
        eprintln!(
            "lookup_while_streaming/{name}/{parameter}: the writer applied {ops} block operations in {:.1} s ({:.0}/s)",
            took.as_secs_f64(),
            ops as f64 / took.as_secs_f64()
        );
    }
}

/// Applies streamed steps to our index and runs the server's maintenance
/// loop (`server/src/maintenance.rs`) on the writer's clock: every second,
/// a full sweep pass in calls of 65,536 nodes (the defaults), if
/// `Index::sweep_due` says one is due, or always with `every_second`.
fn our_writer<'a>(w: &'a Workload, o: &'a Ours, every_second: bool) -> impl FnMut(&Step) + 'a {
    let start = Instant::now();
    let mut tick = start;
    let (mut passes, mut swept, mut seconds) = (0u32, Duration::ZERO, 0u32);
    move |s| {
        black_box(o.apply(&w.names, [s]));
        if tick.elapsed() < Duration::from_secs(1) {
            return;
        }
        tick = Instant::now();
        seconds += 1;
        let now = NOW + start.elapsed().as_millis() as u64;
        if every_second || o.index.sweep_due(now) {
            loop {
                let r = o.index.sweep(now, 65_536);
                if r.passes > 0 || r.visited < 65_536 {
                    break;
                }
            }
            passes += 1;
            swept += tick.elapsed();
        }
        if seconds % 5 == 0 {
            let st = o.index.stats();
            eprintln!(
                "  writer at {seconds} s: {passes} sweep passes ({:.0} ms); {} nodes, {} tree blocks, {} entries",
                swept.as_secs_f64() * 1e3,
                st.nodes,
                st.tree_blocks,
                st.entries
            );
        }
    }
}

/// What the writer of `alternated` does.
const STILL: u8 = 0;
/// Streams into the index the lookups read.
const INTO_READ: u8 = 1;
/// Streams into a copy of it that nobody reads.
const INTO_COPY: u8 = 2;

/// Lookups on `read` in three states taken in turn, each criterion sample
/// one round: the writer still, streaming into `read` at `STREAM_RATE`, and
/// streaming at the same rate into `copy`, an index nobody reads. Criterion
/// times the second; the printed line gives each round's rates over the
/// still one taken beside it. The third state has every cost of a writer
/// on this machine (a core's share, the shared cache, memory bandwidth)
/// and none of sharing the index, so what the second loses beyond it is
/// what our index's writers cost its readers. Rounds rotate the order of
/// the states, so a drift of the machine's speed falls on all three alike.
fn alternated(
    g: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    w: &Workload,
    read: &Ours,
    copy: &Ours,
) {
    let mode = AtomicU8::new(STILL);
    let stop = AtomicBool::new(false);
    // Lookups a second in each state, one row per round.
    let rounds = std::cell::RefCell::new(Vec::<[f64; 3]>::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut writers = [our_writer(w, read, false), our_writer(w, copy, false)];
            let mut requests = [Requests::new(w), Requests::new(w)];
            let (mut was, mut start, mut ops) = (STILL, Instant::now(), 0u64);
            // Relaxed: flags polled between steps, ordering nothing else.
            while !stop.load(Ordering::Relaxed) {
                let now = mode.load(Ordering::Relaxed);
                if now != was {
                    (was, start, ops) = (now, Instant::now(), 0);
                }
                let i = match now {
                    INTO_READ => 0,
                    INTO_COPY => 1,
                    _ => {
                        std::thread::sleep(Duration::from_micros(200));
                        continue;
                    }
                };
                keep_rate(start, ops);
                let step = requests[i].step(w);
                writers[i](&step);
                ops += step.block_ops();
            }
        });
        let id = BenchmarkId::new(
            "ours",
            format!("streaming_{}k_blocks_per_s,alternated", STREAM_RATE / 1000),
        );
        g.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let mut took = [Duration::ZERO; 3];
                let round = rounds.borrow().len();
                for k in 0..3 {
                    let state = (round + k) % 3;
                    // Relaxed: see the writer.
                    mode.store(state as u8, Ordering::Relaxed);
                    // The writer's next step starts the state's stream.
                    std::thread::sleep(Duration::from_millis(5));
                    let start = Instant::now();
                    let mut out = Vec::new();
                    for _ in 0..iters {
                        black_box(read.lookups(&w.our_keys, &mut out));
                    }
                    took[state] = start.elapsed();
                }
                mode.store(STILL, Ordering::Relaxed);
                let rate = |t: Duration| (iters * w.our_keys.len() as u64) as f64 / t.as_secs_f64();
                rounds.borrow_mut().push(took.map(rate));
                took[INTO_READ as usize]
            })
        });
        // Relaxed: see the writer.
        stop.store(true, Ordering::Relaxed);
    });
    let rounds = rounds.into_inner();
    // None when a filter left the benchmark out.
    if rounds.is_empty() {
        return;
    }
    let ratios = |state: u8| {
        let mut r: Vec<f64> = rounds
            .iter()
            .map(|x| x[state as usize] / x[STILL as usize])
            .collect();
        r.sort_by(f64::total_cmp);
        format!(
            "median {:.2}× (range {:.2}–{:.2}×)",
            r[r.len() / 2],
            r[0],
            r[r.len() - 1]
        )
    };
    let mut still: Vec<f64> = rounds.iter().map(|x| x[STILL as usize]).collect();
    still.sort_by(f64::total_cmp);
    eprintln!(
        "lookup_while_streaming/ours/alternated, {} rounds (still: median {:.2} M lookups/s): streaming into the index read, over still: {}; streaming into a copy nobody reads, over still: {}",
        rounds.len(),
        still[still.len() / 2] / 1e6,
        ratios(INTO_READ),
        ratios(INTO_COPY),
    );
}

fn lookups_while_streaming(c: &mut Criterion, w: &Workload, ours: &Ours, crtc: &Crtc) {
    let mut g = c.benchmark_group(format!(
        "lookup_while_streaming/mooncake_{}_requests",
        w.our_keys.len()
    ));
    g.sample_size(20);
    g.throughput(Throughput::Elements(w.our_keys.len() as u64));
    let stream_id = format!("streaming_{}k_blocks_per_s", STREAM_RATE / 1000);
    let our_lookups = |o: &Ours| {
        let mut out = Vec::new();
        black_box(o.lookups(&w.our_keys, &mut out));
    };
    g.bench_function(BenchmarkId::new("ours", "read_only"), |b| {
        b.iter(|| our_lookups(ours))
    });
    while_writing(
        &mut g,
        "ours",
        &stream_id,
        || our_lookups(ours),
        |stop| stream(w, stop, our_writer(w, ours, false)),
    );
    // Read-only again, on what the stream left: the events change what
    // lookups find (pods' caches churn, removals mark gaps the lookups
    // then round around), so this row tells that from the writer's
    // interference.
    g.bench_function(BenchmarkId::new("ours", "read_only_after_streaming"), |b| {
        b.iter(|| our_lookups(ours))
    });
    // The same from the same start, sweeping every second whether due or not.
    let fresh = || {
        let o = Ours::new(&w.names);
        o.apply(&w.names, &w.steps);
        o.index.sweep(NOW, usize::MAX);
        o.index.reclaim();
        o
    };
    let swept = fresh();
    while_writing(
        &mut g,
        "ours",
        &format!("{stream_id}+sweep_every_1s"),
        || our_lookups(&swept),
        |stop| stream(w, stop, our_writer(w, &swept, true)),
    );
    drop(swept);
    alternated(&mut g, w, &fresh(), &fresh());
    let their_lookups = || {
        for k in &w.their_keys {
            black_box(crtc.backend().find_matches(k, false));
        }
    };
    g.bench_function(BenchmarkId::new("dynamo-concurrent", "read_only"), |b| {
        b.iter(their_lookups)
    });
    let mut ids = [1u64 << 40; PODS];
    while_writing(
        &mut g,
        "dynamo-concurrent",
        &stream_id,
        their_lookups,
        |stop| {
            let mut events = Vec::new();
            stream(w, stop, |s| {
                router_events(s, &mut ids, &mut events);
                for e in events.drain(..) {
                    crtc.enqueue_event(e).expect("the indexer runs");
                }
            })
        },
    );
    g.finish();
}

/// Our index holding the same (pod, block) pairs as after the ingest, as
/// gateways insert them: the tree alone, no engine records. Each held path
/// is inserted once, whole (inserts of its prefixes after it would leave a
/// node per block).
fn gateway_copy(w: &Workload) -> Index {
    let index = Index::new(IndexConfig::default());
    for (paths, name) in w.caches.held_paths(&w.trace).iter().zip(&w.names) {
        for &(r, i) in paths {
            let key = &w.our_keys[r][..=i];
            index
                .insert(MODEL, key, name, NOW)
                .expect("within the index's bounds");
        }
    }
    index.reclaim();
    index
}

/// Heap bytes that `build` leaves allocated.
fn heap_of<T>(build: impl FnOnce() -> T) -> (T, isize) {
    let before = GLOBAL.live();
    let t = build();
    (t, GLOBAL.live() - before)
}

fn memory(w: &Workload, rt: &tokio::runtime::Runtime) {
    let pairs = w.caches.held() as f64;
    let before = GLOBAL.live();
    let ours = Ours::new(&w.names);
    ours.apply(&w.names, &w.steps);
    // Nodes that removals left without pods wait for the sweep (the
    // server's maintenance thread) to be unlinked: both states.
    for when in ["before the sweep", "after the sweep"] {
        if when == "after the sweep" {
            ours.index.sweep(NOW, usize::MAX);
        }
        ours.index.reclaim();
        let heap = GLOBAL.live() - before;
        let s = ours.index.stats();
        eprintln!(
            "memory/ours, {when}: {heap} B for {pairs} (pod, block) pairs = {:.1} B each; the index's accounting: tree {:.1} B ({} entries, {} tree blocks, {} nodes), engine records {:.1} B ({} records)",
            heap as f64 / pairs,
            s.bytes as f64 / pairs,
            s.entries,
            s.tree_blocks,
            s.nodes,
            s.engine_bytes as f64 / pairs,
            s.engine_blocks,
        );
    }
    drop(ours);
    // The same pairs as gateways insert them: the tree alone.
    let (plain, heap) = heap_of(|| gateway_copy(w));
    let s = plain.stats();
    eprintln!(
        "memory/ours, the same pairs inserted by a gateway (no engine records): {heap} B = {:.1} B each (the index's accounting {:.1} B; {} entries, {} tree blocks, {} nodes)",
        heap as f64 / pairs,
        s.bytes as f64 / pairs,
        s.entries,
        s.tree_blocks,
        s.nodes,
    );
    drop(plain);
    // Events are cloned one at a time and consumed: what stays is the tree's.
    let (radix, heap) = heap_of(|| {
        let mut tree = RadixTree::new();
        for e in &w.router {
            let _ = tree.apply_event(e.clone());
        }
        tree
    });
    eprintln!(
        "memory/dynamo-radix: {heap} B = {:.1} B per (pod, block)",
        heap as f64 / pairs
    );
    drop(radix);
    let (crtc, heap) = heap_of(|| {
        let crtc = crtc(1);
        for e in &w.router {
            crtc.enqueue_event(e.clone()).expect("the indexer runs");
        }
        rt.block_on(crtc.flush());
        crtc
    });
    eprintln!(
        "memory/dynamo-concurrent (with its worker thread's lookup tables): {heap} B = {:.1} B per (pod, block)",
        heap as f64 / pairs
    );
    drop(crtc);
    // The least any engine-hash mapping costs here: a table from each held
    // engine block to one word, shared by the pods (no copy counts, no
    // parent links, no per-pod state), and one such table per pod.
    let (shared, heap) = heap_of(|| {
        let mut t = HashMap::<u64, u64, ahash::RandomState>::default();
        for (_, h) in w.caches.held_blocks() {
            t.insert(h, h);
        }
        t
    });
    eprintln!(
        "memory/floor: one table of the {} distinct held engine blocks to one word each, shared by the pods: {heap} B = {:.1} B per (pod, block)",
        shared.len(),
        heap as f64 / pairs
    );
    drop(shared);
    let (per_pod, heap) = heap_of(|| {
        let mut t = vec![HashMap::<u64, u64, ahash::RandomState>::default(); PODS];
        for (pod, h) in w.caches.held_blocks() {
            t[pod].insert(h, h);
        }
        t
    });
    eprintln!(
        "memory/floor: the same, one table per pod: {heap} B = {:.1} B per (pod, block)",
        heap as f64 / pairs
    );
    drop(per_pod);
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let Ok(trace) = mooncake(&mooncake_path()) else {
        eprintln!(
            "mooncake trace not found at {}: nothing to run",
            mooncake_path().display()
        );
        return;
    };
    let w = Workload::new(trace.into_iter().map(|r| r.key).collect());
    let stored: usize = w
        .steps
        .iter()
        .filter_map(|s| s.stored.as_ref())
        .map(|s| s.hashes.len())
        .sum();
    eprintln!(
        "events: {} requests on {PODS} pods of {} blocks: {} blocks stored, {} removed, {} block operations in {} events ({} msgpack bytes); {} (pod, block) pairs held at the end",
        w.trace.requests.len(),
        w.capacity,
        stored,
        w.ops as usize - stored,
        w.ops,
        w.router.len(),
        w.payloads.iter().map(|(_, p)| p.len()).sum::<usize>(),
        w.caches.held(),
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    memory(&w, &rt);

    let ours = Ours::new(&w.names);
    let done = ours.apply(&w.names, &w.steps);
    eprintln!("ours applied: {done:?}");
    // The server's maintenance thread sweeps; this is the state it leaves.
    ours.index.sweep(NOW, usize::MAX);
    ours.index.reclaim();
    let checked = Ours::new(&w.names);
    let events = checked.decode_apply(&subscriptions(&w.names), &w.payloads);
    assert_eq!(events, w.router.len() as u64, "every decoded event applies");
    drop(checked);
    let mut radix = RadixTree::new();
    let refused = w
        .router
        .iter()
        .filter(|e| radix.apply_event((*e).clone()).is_err())
        .count();
    let mut decoded = RadixTree::new();
    let refused_decoded = their_decode_apply(&w.payloads, |e| decoded.apply_event(e).is_ok());
    eprintln!("dynamo refused: {refused} events; from the batches {refused_decoded}");
    let crtc = crtc(1);
    crtc_apply(&rt, &crtc, w.router.clone());
    let plain = gateway_copy(&w);
    same_answers(&w, &ours.index, &radix, crtc.backend());
    same_answers(&w, &ours.index, &decoded, crtc.backend());
    same_answers(&w, &plain, &radix, crtc.backend());
    drop(decoded);

    ingest(&mut c, &w, &rt);
    let unswept = Ours::new(&w.names);
    unswept.apply(&w.names, &w.steps);
    lookups(
        &mut c,
        &w,
        [&ours.index, &unswept.index, &plain],
        &radix,
        &crtc,
    );
    drop((unswept, plain));
    drop(radix);
    lookups_while_streaming(&mut c, &w, &ours, &crtc);
    c.final_summary();
}
