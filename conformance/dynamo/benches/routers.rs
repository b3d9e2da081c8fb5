//! Lookups per second through Dynamo's routes, in one run: prefix-server's
//! `/query` and `/query_by_hash` beside its own `/v1/lookup` and
//! `/v1/lookup-tiers` on the same prompts (what the adapter costs), and
//! beside NVIDIA Dynamo's standalone indexer (`dynamo-kv-router` 1.6.1)
//! asked the same bodies. Both servers run as processes of their own, are
//! registered the same engines with `/register` and follow the same ZMQ
//! publishers; the client is this process (one thread, HTTP/1.1 with
//! kept-alive connections, one per request in flight, opened before each
//! timed run: [`Conn`]), and every answer is checked to be a 200 with a
//! body.
//!
//! The workload: 8 workers (one rank each) with 16-token blocks; 64
//! documents of 32 blocks, the first 8 a system prompt they share, each
//! document cached by one worker. Each request is a document followed by 4
//! blocks of new tokens (576 tokens), so every answer names all 8 workers
//! (the system prompt) and one of them with the whole document.
//!
//! Dynamo's service runs as this binary started again (`Dynamo::start`):
//! a 2-thread Tokio runtime (prefix-server's default on this machine) and 2
//! indexer threads.
//!
//! After each row it prints each server's CPU time per request (from
//! `/proc/<pid>/stat`, over the row's warm-up and measurement).
//!
//!     PREFIX_SERVER=target/release/prefix-server \
//!       cargo bench --manifest-path conformance/dynamo/Cargo.toml --bench routers

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use prefix_conformance_dynamo::{
    cpu_time, local_hashes, post, serve_dynamo_if_asked, stored, wait_for_health, Conn, Dynamo,
    Ours, Publisher,
};
use serde_json::{json, Value};

const BLOCK: u32 = 16;
const WORKERS: u64 = 8;
const DOCS: usize = 64;
const DOC_BLOCKS: usize = 32;
const SYSTEM_BLOCKS: usize = 8;
const NEW_BLOCKS: usize = 4;
const PROMPTS: usize = 256;
const MODEL: &str = "m";
/// Dynamo's indexer threads.
const DYNAMO_THREADS: usize = 2;

fn main() {
    serve_dynamo_if_asked();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let setup = rt.block_on(Setup::start());
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    let mut g = c.benchmark_group("routers");
    g.throughput(Throughput::Elements(1));
    let sent = Arc::new(AtomicU64::new(0));
    for in_flight in [1, 16] {
        for row in setup.rows() {
            let before = (cpu_time(setup.ours.pid()), cpu_time(setup.dynamo.pid()));
            let n0 = sent.load(Ordering::Relaxed);
            g.bench_function(BenchmarkId::new(row.name, in_flight), |b| {
                b.iter_custom(|iters| rt.block_on(drive(&row, iters, in_flight, &sent)))
            });
            let n = sent.load(Ordering::Relaxed) - n0;
            let pid = if row.name.starts_with("dynamo") {
                (setup.dynamo.pid(), before.1)
            } else {
                (setup.ours.pid(), before.0)
            };
            let cpu = cpu_time(pid.0) - pid.1;
            eprintln!(
                "cpu/{}/{in_flight}: {:.1} µs of the server's CPU per request ({n} requests)",
                row.name,
                cpu.as_secs_f64() * 1e6 / n as f64
            );
        }
    }
    g.finish();
    c.final_summary();
}

/// Both servers, fed the same engines, and the prompts.
struct Setup {
    ours: Ours,
    dynamo: Dynamo,
    prompts: Vec<Vec<u32>>,
    _publishers: Vec<Publisher>,
}

/// A document's token ids: the system prompt's, then its own.
fn document(d: usize) -> Vec<u32> {
    let own = |i: usize| (1_000_000 + d * 10_000 + i) as u32;
    (0..DOC_BLOCKS * BLOCK as usize)
        .map(|i| {
            if i < SYSTEM_BLOCKS * BLOCK as usize {
                i as u32 + 1
            } else {
                own(i)
            }
        })
        .collect()
}

/// vLLM's hash of a document's block: the system prompt's blocks are
/// the same in every document.
fn engine_hash(d: usize, b: usize) -> u64 {
    if b < SYSTEM_BLOCKS {
        b as u64 + 1
    } else {
        (d as u64 + 1) * 1_000 + b as u64
    }
}

impl Setup {
    async fn start() -> Setup {
        let ours = Ours::start(BLOCK).await;
        let dynamo = Dynamo::start(DYNAMO_THREADS);
        wait_for_health(&dynamo.base).await;
        let ctx = zmq::Context::new();
        let mut publishers: Vec<Publisher> = (0..WORKERS).map(|_| Publisher::bind(&ctx)).collect();
        for (w, p) in publishers.iter().enumerate() {
            let body = json!({"instance_id": w + 1, "endpoint": p.endpoint, "model_name": MODEL,
                              "block_size": BLOCK, "dp_rank": 0});
            for base in [&ours.base, &dynamo.base] {
                let (s, v) = post(base, "/register", &body).await;
                assert_eq!(s, 201, "{base}: {v}");
            }
        }
        for p in &publishers {
            p.subscribed(2);
        }
        // Each worker caches the documents d with d % WORKERS == its index:
        // the first whole, the others after the system prompt it holds.
        for d in 0..DOCS {
            let w = d % WORKERS as usize;
            let tokens = document(d);
            let hashes: Vec<u64> = (0..DOC_BLOCKS).map(|b| engine_hash(d, b)).collect();
            let event = if d < WORKERS as usize {
                stored(&hashes, None, &tokens, BLOCK, "GPU", None)
            } else {
                let from = SYSTEM_BLOCKS;
                let parent = Some(hashes[from - 1]);
                let tail = &tokens[from * BLOCK as usize..];
                stored(&hashes[from..], parent, tail, BLOCK, "GPU", None)
            };
            publishers[w].publish(event);
        }
        // Both have taken every document.
        let whole = (DOC_BLOCKS * BLOCK as usize) as u64;
        for d in 0..DOCS {
            let id = (d % WORKERS as usize + 1).to_string();
            let body = json!({"token_ids": document(d), "model_name": MODEL});
            for base in [&ours.base, &dynamo.base] {
                let mut tries = 0;
                loop {
                    let (_, v) = post(base, "/query", &body).await;
                    if v["instances"][&id]["gpu"] == whole {
                        break;
                    }
                    tries += 1;
                    assert!(tries < 500, "{base} never took document {d}: {v}");
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        }
        let prompts: Vec<Vec<u32>> = (0..PROMPTS)
            .map(|i| {
                let mut p = document(i * 7 % DOCS);
                let new = NEW_BLOCKS * BLOCK as usize;
                p.extend((0..new).map(|j| (50_000_000 + i * new + j) as u32));
                p
            })
            .collect();
        let setup = Setup {
            ours,
            dynamo,
            prompts,
            _publishers: publishers,
        };
        setup.check_answers().await;
        setup
    }

    /// Every row's first answer names all workers, one with the document.
    async fn check_answers(&self) {
        let whole = (DOC_BLOCKS * BLOCK as usize) as u64;
        let system = (SYSTEM_BLOCKS * BLOCK as usize) as u64;
        for row in self.rows() {
            let body: Value = serde_json::from_slice(&row.bodies[0]).unwrap();
            let (s, v) = post(&row.base, row.path, &body).await;
            assert_eq!(s, 200, "{}: {v}", row.name);
            let mut reach: Vec<u64> = if row.path.starts_with("/v1/") {
                let blocks = v["matches"].as_array().unwrap().iter();
                blocks
                    .map(|m| m["blocks"].as_u64().unwrap() * u64::from(BLOCK))
                    .collect()
            } else {
                let instances = v["instances"].as_object().unwrap().values();
                instances.map(|i| i["gpu"].as_u64().unwrap()).collect()
            };
            reach.sort_unstable();
            let mut want = vec![system; WORKERS as usize - 1];
            want.push(whole);
            assert_eq!(reach, want, "{}: {v}", row.name);
        }
    }

    fn rows(&self) -> Vec<Row> {
        let bodies = |f: &dyn Fn(&[u32]) -> Value| -> Arc<Vec<bytes::Bytes>> {
            Arc::new(
                self.prompts
                    .iter()
                    .map(|p| serde_json::to_vec(&f(p)).unwrap().into())
                    .collect(),
            )
        };
        let query = bodies(&|p| json!({"token_ids": p, "model_name": MODEL}));
        let by_hash =
            bodies(&|p| json!({"block_hashes": local_hashes(p, BLOCK, None), "model_name": MODEL}));
        let ours = bodies(&|p| json!({"model": MODEL, "tokens": p}));
        let row = |name, base: &String, path, bodies: &Arc<Vec<bytes::Bytes>>| Row {
            name,
            base: base.clone(),
            path,
            bodies: bodies.clone(),
        };
        let (o, d) = (&self.ours.base, &self.dynamo.base);
        vec![
            row("ours /query", o, "/query", &query),
            row("dynamo /query", d, "/query", &query),
            row("ours /v1/lookup", o, "/v1/lookup", &ours),
            row("ours /v1/lookup-tiers", o, "/v1/lookup-tiers", &ours),
            row("ours /query_by_hash", o, "/query_by_hash", &by_hash),
            row("dynamo /query_by_hash", d, "/query_by_hash", &by_hash),
        ]
    }
}

/// One benchmark row: a server's route and the bodies sent to it.
struct Row {
    name: &'static str,
    base: String,
    path: &'static str,
    bodies: Arc<Vec<bytes::Bytes>>,
}

/// Sends `iters` requests of `row`, `in_flight` at a time; how long they
/// took.
async fn drive(row: &Row, iters: u64, in_flight: u64, sent: &Arc<AtomicU64>) -> Duration {
    let next = Arc::new(AtomicU64::new(0));
    let mut conns = Vec::new();
    for _ in 0..in_flight {
        conns.push(Conn::open(&row.base).await);
    }
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for mut conn in conns {
        let (path, bodies) = (row.path, row.bodies.clone());
        let (next, sent) = (next.clone(), sent.clone());
        tasks.spawn(async move {
            // Relaxed: a counter of requests handed out and sent; no other
            // memory is published through them.
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= iters {
                    break;
                }
                conn.ask(path, bodies[i as usize % bodies.len()].clone())
                    .await;
                sent.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    start.elapsed()
}
