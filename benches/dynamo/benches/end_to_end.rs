//! prefix-server end to end beside NVIDIA Dynamo's standalone indexer
//! service (`dynamo-kv-router` 1.6.1, feature `standalone-indexer`, the
//! router its `run_server` serves), in turn, each a fresh process, fed the
//! same vLLM events by the same engines.
//!
//! The engines: 16 libzmq XPUB sockets in this process, each registered
//! with the service through Dynamo's `POST /register` (which prefix-server
//! serves too), publishing vLLM's msgpack batches for the Mooncake trace
//! (`engine_sim::Pods`: requests round-robin over the engines, each an LRU
//! cache of 65,536 engine blocks of 16 tokens that frees a request's
//! blocks tail first; each trace block is 4 engine blocks), in the trace's
//! order from one thread, then one last block each. The run waits until
//! the service answers that block for every engine: both apply an engine's
//! events in order, so every batch before it is applied. The batches go
//! out at 4,000 a second over all engines (250 each, several times a busy
//! vLLM's scheduler steps), fewer than either service applies, so no
//! backlog builds: each takes the 3.0 s the pace takes
//! (`END_TO_END_PACE`, batches a second; 0 publishes them all at once, a
//! backlog that both services then hold memory for).
//!
//! **Memory.** Per service it reads `VmRSS` of `/proc/<pid>/status` (and
//! its anonymous and file-backed parts) three times, each 3 s after the
//! step before settled: idle (started, nothing registered), registered (16
//! engines subscribed, nothing published) and loaded (every batch
//! applied). From these: idle, per engine ((registered − idle) / 16, the
//! threads and libzmq state the first engine starts included) and per
//! (pod, block) ((loaded − registered) / the pairs the engines hold at the
//! end). Dynamo's service is this executable started again, so it
//! allocates with glibc's `malloc` (no global allocator is set here), as in
//! the Python process `python -m dynamo.indexer` runs it in; prefix-server
//! allocates with mimalloc.
//!
//! **Lookups**, loaded, through Dynamo's `POST /query` (which prefix-server
//! serves too) over plain HTTP/1.1 with kept-alive connections, from this
//! process (a Tokio runtime of 2 threads, hyper's connections without a
//! pool: [`Conn`], so that the client takes little of the cores it shares
//! with the service), each answer checked to be a 200:
//! - a prompt of 1,000,000 tokens that matches nothing (7.0 MB of JSON),
//!   five times one after another: the median; to prefix-server also
//!   through the client library over QUIC (the tokens hashed in this
//!   process into 62,500 block hashes, 0.5 MB on the wire), five times on
//!   one connection;
//! - the first 2,000 requests of the trace as prompts (their tokens, 1,746
//!   on average, 10.7 KB of JSON), 1, 8 and 64 in flight on as many
//!   connections, for 5 s each after 1 s of warm-up: lookups per second,
//!   and the service's CPU time per lookup and this process's, the client's
//!   (`/proc/<pid>/stat`): the two share the machine's cores.
//!
//! The services, in a rotating order each round: prefix-server with its
//! defaults (`--http-plaintext`), the same with `--block-aliases dynamo`
//! (what its `/query_by_hash` needs, and Dynamo's service keeps for its
//! own), and Dynamo's service with 2 indexer threads on a 2-thread
//! runtime.
//!
//!     cargo build --profile ci -p prefix-server
//!     PREFIX_SERVER=target/ci/prefix-server \
//!       cargo bench --manifest-path benches/dynamo/Cargo.toml --bench end_to_end
//!
//! `END_TO_END_ROUNDS` (3) sets the rounds; `END_TO_END_HOLD` (seconds)
//! holds each service loaded that long, with its pid printed, to look at
//! its memory; `END_TO_END_CLIENT_THREADS` (2) sets the client's threads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine_sim::{request_tokens, Pods, Release};
use prefix_benches::{mooncake, mooncake_path};
use prefix_client::key::token_key;
use prefix_client::{Client, ClientConfig, TlsConfig};
use prefix_conformance_dynamo::{
    cpu_time, post, serve_dynamo_if_asked, stored, Conn, Dynamo, Ours, Publisher,
};
use prefix_events::encode::Layout;
use serde_json::json;

/// Engines publishing.
const ENGINES: usize = 16;
/// Engine blocks each engine's cache holds.
const CAPACITY: usize = 65_536;
/// Engine blocks per trace block.
const SPLIT: u64 = 4;
/// Tokens per engine block.
const BLOCK: u32 = engine_sim::BLOCK_TOKENS as u32;
/// The model the engines are registered under.
const MODEL: &str = "m";
/// Dynamo's indexer threads.
const DYNAMO_THREADS: usize = 2;
/// Batches published a second, over all engines, unless
/// `END_TO_END_PACE` says otherwise.
const PACE: f64 = 4_000.0;
/// How long a process is left to settle before its memory is read.
const SETTLE: Duration = Duration::from_secs(3);
/// Tokens of the giant prompt.
const GIANT_TOKENS: u32 = 1_000_000;
/// Times the giant prompt is asked.
const GIANT_TIMES: usize = 5;
/// Trace requests asked as prompts.
const PROMPTS: usize = 2_000;
/// Lookups in flight, one connection each.
const IN_FLIGHT: [usize; 3] = [1, 8, 64];
/// The client's threads, unless `END_TO_END_CLIENT_THREADS` says
/// otherwise: the machine's 2 cores, so that a service is not left waiting
/// on one client thread while a core is free.
const CLIENT_THREADS: usize = 2;
/// Warm-up and measurement of each lookup row.
const WARM_UP: Duration = Duration::from_secs(1);
const MEASURE: Duration = Duration::from_secs(5);

fn main() {
    serve_dynamo_if_asked();
    let rounds: usize = setting("END_TO_END_ROUNDS").unwrap_or(3);
    let load = Load::new();
    println!(
        "events: {} batches, {} bytes of msgpack; {} (pod, block) pairs held at the end; \
         prompts of {:.0} bytes on average",
        load.batches.len(),
        load.batches.iter().map(|(_, b)| b.len()).sum::<usize>(),
        load.pairs,
        load.prompts.iter().map(|p| p.len()).sum::<usize>() as f64 / load.prompts.len() as f64,
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(setting("END_TO_END_CLIENT_THREADS").unwrap_or(CLIENT_THREADS))
        .enable_all()
        .build()
        .unwrap();
    let sides = [Side::Ours, Side::OursAliases, Side::Dynamo];
    let mut figures: Vec<(Side, Figures)> = Vec::new();
    for round in 0..rounds {
        for i in 0..sides.len() {
            let side = sides[(round + i) % sides.len()];
            let f = rt.block_on(run(side, &load));
            println!("round {round}: {}", f.line(side, load.pairs));
            figures.push((side, f));
        }
    }
    println!("\nranges over {rounds} rounds:");
    for side in sides {
        let of = |f: &dyn Fn(&Figures) -> f64| {
            let v: Vec<f64> = figures
                .iter()
                .filter(|(s, _)| *s == side)
                .map(|(_, x)| f(x))
                .collect();
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), &x| (l.min(x), h.max(x)));
            format!("{lo:.1}–{hi:.1}")
        };
        println!(
            "  {:<22} idle {} MB, per engine {} KB, per (pod, block) {} B",
            side.name(),
            of(&|f| f.idle.rss as f64 / 1e6),
            of(&|f| f.per_engine() / 1e3),
            of(&|f| f.per_pair(load.pairs)),
        );
        let mut giant = of(&|f| f.giant.as_secs_f64() * 1e3);
        if side != Side::Dynamo {
            giant += &format!(
                " (QUIC {})",
                of(&|f| f.giant_quic.unwrap().as_secs_f64() * 1e3)
            );
        }
        let rates: Vec<String> = (0..IN_FLIGHT.len())
            .map(|i| {
                format!(
                    "{} in flight {}/s ({} µs CPU, the client's {})",
                    IN_FLIGHT[i],
                    of(&|f| f.lookups[i].per_second),
                    of(&|f| f.lookups[i].server_cpu),
                    of(&|f| f.lookups[i].client_cpu)
                )
            })
            .collect();
        println!("  {:<22} giant prompt {giant} ms; {}", "", rates.join("; "));
    }
    // Each round's ratios of ours to Dynamo's.
    let ratio = |side: Side, what: &str, f: &dyn Fn(&Figures) -> f64| {
        let ratios: Vec<String> = (0..rounds)
            .map(|r| {
                let of = |s: Side| {
                    let f = &figures[r * sides.len()..(r + 1) * sides.len()];
                    f.iter().find(|(x, _)| *x == s).map(|(_, x)| x)
                };
                format!("{:.2}", f(of(side).unwrap()) / f(of(Side::Dynamo).unwrap()))
            })
            .collect();
        println!(
            "  {} / dynamo, {what}, per round: {}",
            side.name(),
            ratios.join(", ")
        );
    };
    for side in [Side::Ours, Side::OursAliases] {
        ratio(side, "memory per (pod, block)", &|f| f.per_pair(load.pairs));
        ratio(side, "idle memory", &|f| f.idle.rss as f64);
        ratio(side, "memory per engine", &|f| f.per_engine());
        ratio(side, "giant prompt's time", &|f| f.giant.as_secs_f64());
        ratio(side, "giant prompt's time, ours over QUIC", &|f| {
            f.giant_quic.unwrap_or(f.giant).as_secs_f64()
        });
        for (i, n) in IN_FLIGHT.iter().enumerate() {
            ratio(side, &format!("lookups per second, {n} in flight"), &|f| {
                f.lookups[i].per_second
            });
            ratio(side, &format!("CPU per lookup, {n} in flight"), &|f| {
                f.lookups[i].server_cpu
            });
        }
    }
}

/// A service under test.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Side {
    /// prefix-server with its defaults.
    Ours,
    /// prefix-server with `--block-aliases dynamo`.
    OursAliases,
    /// Dynamo's standalone service.
    Dynamo,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Ours => "ours",
            Side::OursAliases => "ours --block-aliases",
            Side::Dynamo => "dynamo",
        }
    }
}

/// The batches every run publishes, made once.
struct Load {
    /// (engine, vLLM msgpack batch), in the trace's order.
    batches: Vec<(usize, Vec<u8>)>,
    /// (pod, block) pairs the engines hold after the batches and their
    /// last blocks.
    pairs: usize,
    /// `/query` bodies of the trace's first requests.
    prompts: Arc<Vec<bytes::Bytes>>,
    /// The giant prompt's tokens, and its `/query` body.
    giant_tokens: Vec<u32>,
    giant: bytes::Bytes,
}

impl Load {
    fn new() -> Load {
        let trace = mooncake(&mooncake_path()).expect("the Mooncake trace (../shared/traces/)");
        let mut pods = Pods::new(ENGINES, CAPACITY, Release::TailFirst);
        let mut batches = Vec::new();
        for (i, r) in trace.iter().enumerate() {
            let key = engine_key(&r.key);
            let pod = i % ENGINES;
            let step = pods.serve(pod, &key);
            if step.events.is_empty() {
                continue;
            }
            let mut bytes = Vec::new();
            step.encode(r.timestamp as f64 / 1e3, Layout::Required, &mut bytes);
            batches.push((pod, bytes));
        }
        let body = |tokens: &[u32]| -> bytes::Bytes {
            serde_json::to_vec(&json!({"token_ids": tokens, "model_name": MODEL}))
                .unwrap()
                .into()
        };
        let prompts = trace[..PROMPTS]
            .iter()
            .map(|r| body(&request_tokens(&engine_key(&r.key))))
            .collect();
        // Token ids the trace's blocks never start with: no match.
        let giant: Vec<u32> = (0..GIANT_TOKENS).map(|i| 200_000 + i % 50_000).collect();
        Load {
            batches,
            pairs: pods.held() + ENGINES,
            prompts: Arc::new(prompts),
            giant: body(&giant),
            giant_tokens: giant,
        }
    }
}

/// A process's resident memory, from `/proc/<pid>/status`.
#[derive(Clone, Copy, Debug)]
struct Rss {
    rss: u64,
    anon: u64,
    file: u64,
}

impl Rss {
    fn of(pid: u32) -> Rss {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let kb = |field: &str| {
            let line = status.lines().find(|l| l.starts_with(field)).unwrap();
            line[field.len()..]
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .unwrap()
                * 1024
        };
        Rss {
            rss: kb("VmRSS:"),
            anon: kb("RssAnon:"),
            file: kb("RssFile:"),
        }
    }
}

/// One service's memory at the three points, and how long the load took.
struct Figures {
    idle: Rss,
    registered: Rss,
    loaded: Rss,
    ingest: Duration,
    /// prefix-server's own count at the end (`/v1/stats`): heap bytes of
    /// its index, entries and tree nodes.
    counted: Option<(u64, u64, u64)>,
    /// The giant prompt's median time, over HTTP, and for prefix-server
    /// over QUIC.
    giant: Duration,
    giant_quic: Option<Duration>,
    /// Per row of [`IN_FLIGHT`].
    lookups: Vec<Rate>,
}

impl Figures {
    fn per_engine(&self) -> f64 {
        (self.registered.rss as f64 - self.idle.rss as f64) / ENGINES as f64
    }

    fn per_pair(&self, pairs: usize) -> f64 {
        (self.loaded.rss as f64 - self.registered.rss as f64) / pairs as f64
    }

    fn line(&self, side: Side, pairs: usize) -> String {
        let mb = |b: u64| b as f64 / 1e6;
        let counted = match self.counted {
            Some((bytes, entries, nodes)) => format!(
                "; the index's own count: {:.1} B per (pod, block), {entries} entries, {nodes} nodes",
                bytes as f64 / pairs as f64
            ),
            None => String::new(),
        };
        let quic = match self.giant_quic {
            Some(t) => format!(", over QUIC {:.1} ms", t.as_secs_f64() * 1e3),
            None => String::new(),
        };
        let lookups: Vec<String> = IN_FLIGHT
            .iter()
            .zip(&self.lookups)
            .map(|(n, r)| {
                format!(
                    "{n} in flight {:.0}/s, {:.1} µs CPU (the client's {:.1})",
                    r.per_second, r.server_cpu, r.client_cpu
                )
            })
            .collect();
        format!(
            "{:<22} idle {:.1} MB (anon {:.1}, file {:.1}); per engine {:.1} KB; \
             per (pod, block) {:.1} B (loaded {:.1} MB, anon {:.1}); every batch applied in {:.2} s{counted}\n  \
             giant prompt {:.1} ms (median of {GIANT_TIMES}){quic}; lookups: {}",
            side.name(),
            mb(self.idle.rss),
            mb(self.idle.anon),
            mb(self.idle.file),
            self.per_engine() / 1e3,
            self.per_pair(pairs),
            mb(self.loaded.rss),
            mb(self.loaded.anon),
            self.ingest.as_secs_f64(),
            self.giant.as_secs_f64() * 1e3,
            lookups.join("; "),
        )
    }
}

/// The service `side` in a fresh process, through idle, registered and
/// loaded.
async fn run(side: Side, load: &Load) -> Figures {
    enum Process {
        Ours(Ours),
        Dynamo(Dynamo),
    }
    let process = match side {
        Side::Ours => Process::Ours(Ours::start_with(BLOCK, &[]).await),
        Side::OursAliases => {
            Process::Ours(Ours::start_with(BLOCK, &["--block-aliases", "dynamo"]).await)
        }
        Side::Dynamo => {
            let d = Dynamo::start(DYNAMO_THREADS);
            prefix_conformance_dynamo::wait_for_health(&d.base).await;
            Process::Dynamo(d)
        }
    };
    let (pid, base) = match &process {
        Process::Ours(o) => (o.pid(), o.base.clone()),
        Process::Dynamo(d) => (d.pid(), d.base.clone()),
    };
    tokio::time::sleep(SETTLE).await;
    let idle = Rss::of(pid);

    let ctx = zmq::Context::new();
    let mut engines: Vec<Publisher> = (0..ENGINES).map(|_| Publisher::bind(&ctx)).collect();
    for (w, e) in engines.iter().enumerate() {
        let body = json!({"instance_id": w + 1, "endpoint": e.endpoint, "model_name": MODEL,
                          "block_size": BLOCK, "dp_rank": 0});
        let (status, answer) = post(&base, "/register", &body).await;
        assert_eq!(status, 201, "{}: {answer}", side.name());
    }
    for e in &engines {
        e.subscribed(1);
    }
    tokio::time::sleep(SETTLE).await;
    let registered = Rss::of(pid);

    let pace: f64 = setting("END_TO_END_PACE").unwrap_or(PACE);
    let start = Instant::now();
    tokio::task::block_in_place(|| {
        for (i, (engine, batch)) in load.batches.iter().enumerate() {
            if pace > 0.0 {
                let due = start + Duration::from_secs_f64(i as f64 / pace);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            engines[*engine].publish_payload(batch);
        }
        for (w, e) in engines.iter_mut().enumerate() {
            let (hash, tokens) = last_block(w);
            e.publish(stored(&[hash], None, &tokens, BLOCK, "GPU", None));
        }
    });
    for w in 0..ENGINES {
        let body = json!({"token_ids": last_block(w).1, "model_name": MODEL});
        let id = (w + 1).to_string();
        loop {
            let (_, v) = post(&base, "/query", &body).await;
            if v["instances"][&id]["gpu"] == u64::from(BLOCK) {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(600),
                "{}: engine {w} never applied",
                side.name()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let ingest = start.elapsed();
    tokio::time::sleep(SETTLE).await;
    let loaded = Rss::of(pid);
    if let Some(hold) = setting("END_TO_END_HOLD") {
        println!("{} (pid {pid}) loaded; held {hold} s", side.name());
        tokio::time::sleep(Duration::from_secs(hold)).await;
    }
    let counted = match side {
        Side::Dynamo => None,
        Side::Ours | Side::OursAliases => {
            let stats: serde_json::Value = reqwest::get(format!("{base}/v1/stats"))
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            Some((
                stats["bytes"].as_u64().unwrap(),
                stats["entries"].as_u64().unwrap(),
                stats["nodes"].as_u64().unwrap(),
            ))
        }
    };
    let mut conn = Conn::open(&base).await;
    let mut times = Vec::new();
    for _ in 0..GIANT_TIMES {
        let start = Instant::now();
        conn.ask("/query", load.giant.clone()).await;
        times.push(start.elapsed());
    }
    let giant_quic = match &process {
        Process::Ours(ours) => Some(giant_over_quic(ours, &load.giant_tokens).await),
        Process::Dynamo(_) => None,
    };
    let mut lookups = Vec::new();
    for n in IN_FLIGHT {
        lookups.push(drive(&base, &load.prompts, n, pid).await);
    }
    drop(engines);
    drop(process);
    Figures {
        idle,
        registered,
        loaded,
        ingest,
        counted,
        giant: median(times),
        giant_quic,
        lookups,
    }
}

/// The giant prompt asked [`GIANT_TIMES`] times through the client
/// library on one QUIC connection, its tokens hashed each time as a
/// gateway does: the median time.
async fn giant_over_quic(ours: &Ours, tokens: &[u32]) -> Duration {
    let tls = TlsConfig::from_files(&ours.cert(), None, None).unwrap();
    let cfg = ClientConfig {
        tls,
        deadline: Duration::from_secs(10),
        ..ClientConfig::default()
    };
    let client = Client::connect(ours.quic, cfg).await.unwrap();
    let mut times = Vec::new();
    for _ in 0..GIANT_TIMES {
        let start = Instant::now();
        let key = token_key(tokens, BLOCK as usize);
        let answer = client.lookup(MODEL, &key, None).await.unwrap();
        assert!(answer.matches.is_empty(), "the giant prompt matched");
        times.push(start.elapsed());
    }
    median(times)
}

/// The environment variable `name`, parsed; `None` if unset or unparsed.
fn setting<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The middle of `times`.
fn median(mut times: Vec<Duration>) -> Duration {
    times.sort_unstable();
    times[times.len() / 2]
}

/// `in_flight` connections asking `prompts` in turn, through a warm-up
/// and a measurement: lookups per second, and the service's and this
/// process's CPU per lookup, over the measurement.
async fn drive(base: &str, prompts: &Arc<Vec<bytes::Bytes>>, in_flight: usize, pid: u32) -> Rate {
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for t in 0..in_flight {
        let mut conn = Conn::open(base).await;
        let prompts = prompts.clone();
        let (stop, done) = (stop.clone(), done.clone());
        tasks.spawn(async move {
            let mut i = t;
            // Relaxed: a flag read for its own value; no other memory is
            // published through it.
            while !stop.load(Ordering::Relaxed) {
                conn.ask("/query", prompts[i % prompts.len()].clone()).await;
                // Relaxed: a counter read for its own value.
                done.fetch_add(1, Ordering::Relaxed);
                i += in_flight;
            }
        });
    }
    tokio::time::sleep(WARM_UP).await;
    // Relaxed (the counter's loads, the flag's store): values read and set
    // for themselves, as above.
    let me = std::process::id();
    let (n0, t0) = (done.load(Ordering::Relaxed), Instant::now());
    let (server0, client0) = (cpu_time(pid), cpu_time(me));
    tokio::time::sleep(MEASURE).await;
    let (n, elapsed) = (done.load(Ordering::Relaxed) - n0, t0.elapsed());
    let (server, client) = (cpu_time(pid) - server0, cpu_time(me) - client0);
    stop.store(true, Ordering::Relaxed);
    while let Some(t) = tasks.join_next().await {
        t.unwrap();
    }
    let per_lookup = |cpu: Duration| cpu.as_secs_f64() * 1e6 / n as f64;
    Rate {
        per_second: n as f64 / elapsed.as_secs_f64(),
        server_cpu: per_lookup(server),
        client_cpu: per_lookup(client),
    }
}

/// Lookups at one concurrency.
struct Rate {
    per_second: f64,
    /// The service's CPU per lookup, µs.
    server_cpu: f64,
    /// This process's (the client's: its engines are quiet by then), µs.
    client_cpu: f64,
}

/// The engine blocks of a trace key: [`SPLIT`] for each trace block.
fn engine_key(trace_key: &[u64]) -> Vec<u64> {
    trace_key
        .iter()
        .flat_map(|&id| (0..SPLIT).map(move |j| id * SPLIT + j))
        .collect()
}

/// Engine `w`'s last block: an engine hash and tokens no batch uses.
fn last_block(w: usize) -> (u64, Vec<u32>) {
    let tokens = (0..BLOCK)
        .map(|i| u32::MAX - (w as u32) * BLOCK - i)
        .collect();
    (u64::MAX - w as u64, tokens)
}
