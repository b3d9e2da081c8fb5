//! Criterion benchmarks of the index, each group with its baseline in the same
//! run. `cargo bench -p prefix-benches`; see `docs/benchmarks.md`.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use counting_alloc::Counting;
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};
use prefix_benches::{mooncake, mooncake_path, pod_names, ChatWorkload, RwLockIndex, PODS};
use prefix_index::{Index, IndexConfig, Match};
use prefix_proto::key;

/// mimalloc (the server's allocator), counting live bytes for the memory figure.
#[global_allocator]
static GLOBAL: Counting<mimalloc::MiMalloc> = Counting::new(mimalloc::MiMalloc);

const NOW: u64 = 1_700_000_000_000;
const MODEL: &str = "llama";

fn build(w: &ChatWorkload, pods: &[String]) -> Index {
    let index = Index::new(IndexConfig {
        max_blocks: 1 << 28,
        ..IndexConfig::default()
    });
    for p in &w.prompts {
        index
            .insert(MODEL, &p.key, &pods[p.pod], NOW)
            .expect("insert");
    }
    index
}

fn lookup_all(index: &Index, keys: &[Vec<u64>], out: &mut Vec<Match>) -> usize {
    let mut n = 0;
    for k in keys {
        out.clear();
        let r = index.reader();
        r.lookup_into(MODEL, k, None, NOW, out);
        n += out.len();
    }
    n
}

/// Runs `f` for `iters` rounds on the calling thread and on `threads - 1`
/// helper threads at once; wall time. With one thread nothing is spawned, so
/// the one- and two-thread figures differ only by the second thread.
fn parallel(threads: usize, iters: u64, f: impl Fn() + Sync) -> Duration {
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(|| {
                for _ in 0..iters {
                    f();
                }
            });
        }
        for _ in 0..iters {
            f();
        }
    });
    start.elapsed()
}

/// `iters` rounds of lookups over `keys`; their wall time.
fn lookup_rounds(index: &Index, keys: &[Vec<u64>], iters: u64) -> Duration {
    let mut out = Vec::new();
    let start = Instant::now();
    for _ in 0..iters {
        black_box(lookup_all(index, keys, &mut out));
    }
    start.elapsed()
}

/// Benchmarks `f` run for each iteration on `threads` threads at once (see
/// [`parallel`]).
fn bench_parallel(
    g: &mut BenchmarkGroup<'_, WallTime>,
    id: BenchmarkId,
    threads: usize,
    f: impl Fn() + Sync,
) {
    g.bench_function(id, |b| b.iter_custom(|iters| parallel(threads, iters, &f)));
}

/// Runs `measure` while a neighbour thread (started by `spawn`, told to stop
/// through the flag) runs beside it; returns what `measure` returns.
fn beside<T>(
    spawn: impl FnOnce(Arc<AtomicBool>) -> std::thread::JoinHandle<()>,
    measure: impl FnOnce() -> T,
) -> T {
    let stop = Arc::new(AtomicBool::new(false));
    let neighbour = spawn(stop.clone());
    std::thread::sleep(Duration::from_millis(2));
    let t = measure();
    stop.store(true, Ordering::Relaxed);
    neighbour.join().expect("neighbour thread");
    t
}

/// Benchmarks `routine` in `g` alone (`read_only`), then as `name` while a
/// thread of its own runs `pass` over and over; returns the sum of what the
/// passes returned (the work they completed, for the report beside the
/// timing).
fn bench_alone_then_beside_repeating<T>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    pass: impl Fn() -> u64 + Send + 'static,
    mut routine: impl FnMut() -> T,
) -> u64 {
    g.bench_function("read_only", |b| b.iter(&mut routine));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let neighbour = {
        let (stop, done) = (stop.clone(), done.clone());
        // Relaxed throughout: a flag and a counter read for their own
        // values (the join orders the last count before its load).
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                done.fetch_add(pass(), Ordering::Relaxed);
            }
        })
    };
    g.bench_function(name, |b| b.iter(&mut routine));
    stop.store(true, Ordering::Relaxed);
    neighbour.join().expect("neighbour thread");
    done.load(Ordering::Relaxed)
}

/// What two threads gain on this machine for work that shares nothing: a
/// register-only loop, random reads of a private 64 MiB array, and 32-block
/// lookups where each thread has its own copy of the index. Read next to
/// `lookup_prehashed/index/threads=2/32`, which shares one index.
fn scaling_controls(c: &mut Criterion, w: &ChatWorkload, index: &Index, pods: &[String]) {
    let keys = w.keys_of_len(32, 1024);
    let copy = build(w, pods);
    let indexes = [index, &copy];
    let mut g = c.benchmark_group("scaling_controls");
    for threads in [1usize, 2] {
        g.throughput(Throughput::Elements(threads as u64 * 1024));
        bench_parallel(
            &mut g,
            BenchmarkId::new("compute", threads),
            threads,
            || {
                let mut x = 1u64;
                for i in 0..1024u64 * 64 {
                    x = x.rotate_left(7) ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
                }
                black_box(x);
            },
        );
        let arrays: Vec<Vec<u64>> = (0..threads).map(|_| vec![1u64; 8 << 20]).collect();
        let next = AtomicU64::new(0);
        g.bench_function(BenchmarkId::new("random_reads_64MiB", threads), |b| {
            b.iter_custom(|iters| {
                next.store(0, Ordering::Relaxed);
                parallel(threads, iters, || {
                    let mine = &arrays[next.fetch_add(1, Ordering::Relaxed) as usize % threads];
                    let mut x = 0x2545_F491_4F6C_DD1Du64;
                    let mut sum = 0u64;
                    for _ in 0..1024 * 16 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        sum = sum.wrapping_add(mine[(x as usize) & (mine.len() - 1)]);
                    }
                    black_box(sum);
                })
            })
        });
        g.bench_function(
            BenchmarkId::new("lookup_32_private_index_copies", threads),
            |b| {
                b.iter_custom(|iters| {
                    next.store(0, Ordering::Relaxed);
                    parallel(threads, iters, || {
                        let mine = indexes[next.fetch_add(1, Ordering::Relaxed) as usize % threads];
                        let mut out = Vec::with_capacity(PODS);
                        black_box(lookup_all(mine, &keys, &mut out));
                    })
                })
            },
        );
    }
    g.finish();
}

fn lookups(c: &mut Criterion, w: &ChatWorkload, index: &Index, baseline: &RwLockIndex) {
    let mut g = c.benchmark_group("lookup_prehashed");
    for blocks in [32, 256] {
        let keys = w.keys_of_len(blocks, 1024);
        assert_eq!(
            keys.len(),
            1024,
            "workload has enough {blocks}-block prompts"
        );
        for threads in [1, 2] {
            g.throughput(Throughput::Elements((keys.len() * threads) as u64));
            let id = |name: &str| BenchmarkId::new(format!("{name}/threads={threads}"), blocks);
            bench_parallel(&mut g, id("index"), threads, || {
                let mut out = Vec::with_capacity(PODS);
                black_box(lookup_all(index, &keys, &mut out));
            });
            // The same lookups, one epoch pin per 16 (as a server answering a
            // batch frame does): shows what pinning itself costs.
            bench_parallel(&mut g, id("index-pin-per-16"), threads, || {
                let mut out = Vec::with_capacity(PODS);
                for chunk in keys.chunks(16) {
                    let r = index.reader();
                    for k in chunk {
                        out.clear();
                        r.lookup_into(MODEL, k, None, NOW, &mut out);
                        black_box(&out);
                    }
                }
            });
            bench_parallel(&mut g, id("rwlock"), threads, || {
                for k in &keys {
                    black_box(baseline.lookup(k));
                }
            });
        }
    }
    g.finish();
}

fn text_lookups(c: &mut Criterion) {
    // kv-index stores text per character, so this group uses its own, smaller
    // tree: 10,000 conversations, the same texts in all three structures.
    let w = ChatWorkload::new(10_000, 2, true);
    let pods = pod_names();
    let index = build(&w, &pods);
    let baseline = RwLockIndex::default();
    let kv = kv_index::StringTree::new();
    for p in &w.prompts {
        baseline.insert(&p.key, p.pod as u16);
        kv.insert_text(&p.text, &pods[p.pod]);
    }
    // ~2 KB prompts: the first 2,048 bytes of prompts at least that long.
    let texts: Vec<&str> = w
        .prompts
        .iter()
        .filter(|p| p.text.len() >= 2048)
        .map(|p| &p.text[..2048])
        .take(256)
        .collect();
    let mut g = c.benchmark_group("lookup_text_2k_16pods");
    g.throughput(Throughput::Elements(texts.len() as u64));
    g.bench_function("index/hash+lookup", |b| {
        let mut key = Vec::new();
        let mut out = Vec::new();
        b.iter(|| {
            for t in &texts {
                key.clear();
                key::text_key_into(t.as_bytes(), key::TEXT_BLOCK_BYTES, &mut key);
                out.clear();
                index.reader().lookup_into(MODEL, &key, None, NOW, &mut out);
                black_box(&out);
            }
        })
    });
    g.bench_function("rwlock/hash+lookup", |b| {
        b.iter(|| {
            for t in &texts {
                black_box(baseline.lookup(&key::text_key(t, key::TEXT_BLOCK_BYTES)));
            }
        })
    });
    g.bench_function("kv-index/16x prefix_match_tenant", |b| {
        b.iter(|| {
            for t in &texts {
                for p in &pods {
                    black_box(kv.prefix_match_tenant(t, p).len());
                }
            }
        })
    });
    g.finish();
}

fn inserts(c: &mut Criterion, w: &ChatWorkload, pods: &[String]) {
    let index = build(w, pods);
    let mut g = c.benchmark_group("insert");
    let batch: Vec<_> = w.prompts.iter().step_by(97).take(1024).collect();
    g.throughput(Throughput::Elements(batch.len() as u64));
    let fresh = AtomicU64::new(1);
    g.bench_function("new_turn", |b| {
        // Each insert adds one new block after a known prompt: a new leaf.
        let mut key = Vec::new();
        b.iter(|| {
            for p in &batch {
                key.clear();
                key.extend_from_slice(&p.key);
                key.push(fresh.fetch_add(1, Ordering::Relaxed));
                index
                    .insert(MODEL, &key, &pods[p.pod], NOW)
                    .expect("insert");
            }
        })
    });
    g.bench_function("refresh_existing", |b| {
        b.iter(|| {
            for p in &batch {
                index
                    .insert(MODEL, &p.key, &pods[p.pod], NOW)
                    .expect("insert");
            }
        })
    });
    g.finish();
}

fn lookups_during_inserts(c: &mut Criterion, w: &ChatWorkload, pods: &[String]) {
    let index = Arc::new(build(w, pods));
    let keys = w.keys_of_len(32, 1024);
    let mut g = c.benchmark_group("lookup_32_while_inserting");
    g.throughput(Throughput::Elements(keys.len() as u64));
    g.bench_function("read_only", |b| {
        let mut out = Vec::new();
        b.iter(|| black_box(lookup_all(&index, &keys, &mut out)))
    });
    g.bench_function("one_memory_hog", |b| {
        // Control: a thread that shares nothing with the index but competes for
        // the same core resources, cache and memory bandwidth as an inserter.
        b.iter_custom(|iters| {
            beside(
                |stop| {
                    std::thread::spawn(move || {
                        let mut buf = vec![0u64; 32 << 20];
                        let mut x = 0x9E37_79B9_7F4A_7C15u64;
                        while !stop.load(Ordering::Relaxed) {
                            for _ in 0..1024 {
                                x ^= x << 13;
                                x ^= x >> 7;
                                x ^= x << 17;
                                let i = (x as usize) & (buf.len() - 1);
                                buf[i] = buf[i].wrapping_add(x);
                            }
                        }
                        black_box(buf[0]);
                    })
                },
                || lookup_rounds(&index, &keys, iters),
            )
        })
    });
    g.bench_function("one_inserter", |b| {
        b.iter_custom(|iters| {
            let prompts: Vec<(Vec<u64>, usize)> = w
                .prompts
                .iter()
                .step_by(7)
                .map(|p| (p.key.clone(), p.pod))
                .collect();
            let (index2, pods) = (index.clone(), pods.to_vec());
            beside(
                move |stop| {
                    std::thread::spawn(move || {
                        let mut key = Vec::new();
                        for n in 0u64.. {
                            if stop.load(Ordering::Relaxed) {
                                break;
                            }
                            let (k, pod) = &prompts[(n as usize) % prompts.len()];
                            key.clear();
                            key.extend_from_slice(k);
                            key.push(n ^ 0xabcd_ef01);
                            let _ = index2.insert(MODEL, &key, &pods[*pod], NOW);
                        }
                    })
                },
                || lookup_rounds(&index, &keys, iters),
            )
        })
    });
    g.finish();
}

fn sweep(c: &mut Criterion) {
    // ~1M (pod, block) entries: 16 pods over 40,000 conversations' turns.
    let w = ChatWorkload::new(4_000, 3, false);
    let pods = pod_names();
    let ttl = IndexConfig::default().ttl.as_millis() as u64;
    let keys = w.keys_of_len(32, 1024);
    let build = |pod_capacity: u64| {
        let index = Arc::new(Index::new(IndexConfig {
            max_blocks: 1 << 28,
            pod_capacity,
            ..IndexConfig::default()
        }));
        let mut n = 0u64;
        'fill: for round in 0..64u64 {
            for p in &w.prompts {
                let mut key = p.key.clone();
                key.push(round);
                index
                    .insert(MODEL, &key, &pods[(p.pod + round as usize) % PODS], NOW)
                    .expect("insert");
                n += 1;
                if index.stats().entries >= 1_000_000 && n % 64 == 0 {
                    break 'fill;
                }
            }
        }
        index
    };
    // Capacities large enough that only TTLs act, unless a case says otherwise.
    let build_1m = || build(u64::MAX / 2);
    let probe = build_1m();
    let entries = probe.stats().entries;
    drop(probe);
    // One full sweep call over ~1M (pod, block) entries: all of them expired
    // (everything is freed); none (every node is visited and locked); or none
    // expired but every pod at 2x its default capacity of 31,250 blocks (a
    // measuring pass, then an evicting one).
    let mut g = c.benchmark_group("sweep_1m_entries");
    g.sample_size(10);
    g.throughput(Throughput::Elements(entries));
    let cases = [
        ("all_expired", NOW + ttl + 1, u64::MAX / 2),
        ("none_expired", NOW + 1, u64::MAX / 2),
        (
            "capacity_halves_each_pod",
            NOW + 1,
            IndexConfig::default().pod_capacity,
        ),
    ];
    for (name, now, capacity) in cases {
        g.bench_function(name, |b| {
            b.iter_batched(
                || build(capacity),
                |index| {
                    black_box(index.sweep(now, usize::MAX));
                    index
                },
                criterion::BatchSize::PerIteration,
            )
        });
    }
    g.finish();

    // Lookups while a maintenance thread sweeps the same 1M-entry index over
    // and over (nothing expires, so every pass visits and locks every node).
    let index = build_1m();
    let mut g = c.benchmark_group("lookup_32_while_sweeping_1m");
    g.throughput(Throughput::Elements(keys.len() as u64));
    let mut out = Vec::new();
    let sweeper = index.clone();
    let passes = bench_alone_then_beside_repeating(
        &mut g,
        "sweeping",
        move || sweeper.sweep(NOW + 1, usize::MAX).passes,
        || black_box(lookup_all(&index, &keys, &mut out)),
    );
    g.finish();
    eprintln!("lookup_32_while_sweeping_1m: the sweeper completed {passes} full passes meanwhile");

    // What repair's digests cost on the same index: one model's cell
    // digests (a walk hashing every item); then lookups while a thread
    // digests over and over, beside lookups alone.
    let window = prefix_index::digest::Window {
        low: NOW - 1,
        high: NOW,
        now: NOW,
    };
    let mut g = c.benchmark_group("digest_1m_entries");
    g.sample_size(10);
    g.throughput(Throughput::Elements(entries));
    g.bench_function("digest_cells", |b| {
        b.iter(|| black_box(index.reader().digest_cells(MODEL, window)))
    });
    g.finish();
    let mut g = c.benchmark_group("lookup_32_while_digesting_1m");
    g.throughput(Throughput::Elements(keys.len() as u64));
    let digester = index.clone();
    let digests = bench_alone_then_beside_repeating(
        &mut g,
        "digesting",
        move || {
            black_box(digester.reader().digest_cells(MODEL, window));
            1 // one digest a pass
        },
        || black_box(lookup_all(&index, &keys, &mut out)),
    );
    g.finish();
    eprintln!("lookup_32_while_digesting_1m: the digester completed {digests} digests meanwhile");
}

fn mooncake_group(c: &mut Criterion) {
    let Ok(trace) = mooncake(&mooncake_path()) else {
        eprintln!(
            "mooncake trace not found at {}: skipped",
            mooncake_path().display()
        );
        return;
    };
    let pods = pod_names();
    let before = GLOBAL.live();
    let index = Index::new(IndexConfig::default());
    for (i, r) in trace.iter().enumerate() {
        index
            .insert("kimi", &r.key, &pods[i % PODS], NOW + r.timestamp)
            .expect("insert");
    }
    index.reclaim();
    let heap = GLOBAL.live() - before;
    let s = index.stats();
    eprintln!(
        "mooncake: {} requests, 16 pods round-robin: {} nodes, {} tree blocks, {} (pod, block) entries; heap {} B = {:.2} B/entry (index accounting {:.2} B/entry)",
        trace.len(), s.nodes, s.tree_blocks, s.entries, heap, heap as f64 / s.entries as f64, s.bytes as f64 / s.entries as f64
    );
    let some: Vec<&[u64]> = trace
        .iter()
        .step_by(11)
        .take(1024)
        .map(|r| &r.key[..])
        .collect();
    // Every key of the trace, in its order: the paths of the 1,024 keys
    // stay in this machine's caches between iterations, the whole tree's do
    // not, much as under a server's load (each walk's cache misses show here).
    let every: Vec<&[u64]> = trace.iter().map(|r| &r.key[..]).collect();
    let mut g = c.benchmark_group("mooncake");
    for (name, keys) in [
        ("lookup_trace_keys", &some),
        ("lookup_every_trace_key", &every),
    ] {
        g.throughput(Throughput::Elements(keys.len() as u64));
        g.bench_function(name, |b| {
            let mut out = Vec::new();
            b.iter(|| {
                for k in keys {
                    out.clear();
                    index
                        .reader()
                        .lookup_into("kimi", k, None, NOW + 3_600_000, &mut out);
                    black_box(&out);
                }
            })
        });
    }
    g.finish();
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let w = ChatWorkload::new(100_000, 1, false);
    let pods = pod_names();
    eprintln!(
        "chat workload: {} prompts over 100,000 conversations",
        w.prompts.len()
    );
    let index = build(&w, &pods);
    let baseline = RwLockIndex::default();
    for p in &w.prompts {
        baseline.insert(&p.key, p.pod as u16);
    }
    let s = index.stats();
    eprintln!(
        "chat index: {} nodes, {} tree blocks, {} entries, {:.2} B/entry",
        s.nodes,
        s.tree_blocks,
        s.entries,
        s.bytes as f64 / s.entries as f64
    );
    lookups(&mut c, &w, &index, &baseline);
    drop(baseline);
    scaling_controls(&mut c, &w, &index, &pods);
    drop(index);
    lookups_during_inserts(&mut c, &w, &pods);
    inserts(&mut c, &w, &pods);
    text_lookups(&mut c);
    sweep(&mut c);
    mooncake_group(&mut c);
    c.final_summary();
}
