//! `prefix-load events`: the trace replayed as engine KV-cache events
//! through real libzmq sockets into a real server, and the server's ingest
//! rate measured end to end.
//!
//! **Events.** The trace's requests go round-robin to N simulated engines,
//! each with an LRU cache of `capacity` blocks (`engine_sim::Pods`, the
//! routing simulation's engines). Each request is one batch (one scheduler
//! step) of its engine's events: a `BlockRemoved` per block evicted to make
//! room, then a `BlockStored` per run of blocks that entered the cache, 16
//! tokens a block. `rounds` replays the trace with fresh block ids each
//! time, so every round stores as much as the first. Every batch is encoded
//! before the clock starts ([`plan`](mod@plan): vLLM's msgpack, its required fields).
//!
//! **Path.** Each engine publishes on a socket of its own (an XPUB: a PUB
//! that also reports its subscriptions) under a
//! topic of its own, from a thread of its own up to 8 engines, and from a
//! thread per group of engines in a larger fleet ([`publish`]); the server
//! (in this process, or a `--server` told to subscribe) follows each
//! engine as it follows vLLM: its libzmq I/O thread reads the sockets, and
//! its engine threads decode and apply. The clock runs from the moment every publisher
//! starts to the first moment the server's counters show every batch
//! applied: stored blocks per second, end to end.
//!
//! **Where the time goes.** CPU time over the same window, by thread: the
//! server's engine threads and its libzmq threads; the publishing threads
//! and the engines' libzmq I/O threads (each group of engines has a
//! context, as a process, of its own). Then the same batches are decoded
//! (`prefix_events::decode_batch`) and applied
//! (`prefix_server::apply_batch`) on one thread of this
//! process with no socket in between: the rate the server's own work
//! allows one core.
//!
//! **Checks.** The server's counters must show every batch applied, and
//! after the run lookups of a sample of engines' last requests must match
//! each engine's own cache. Against a `--server` with `--metrics`, the
//! server's resident memory before the engines are subscribed and once it
//! follows them, and its CPU time while nothing is published, say what a
//! followed engine costs it.

mod children;
mod plan;
mod publish;
mod server;

pub use children::{child_main, ChildArgs};

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::Context;
use engine_sim::BLOCK_TOKENS;
use prefix_client::Client;
use prefix_events::{decode_batch, DecodeLimits};
use prefix_index::{Index, IndexConfig};
use prefix_proto::{Op, Reply, Subscription};
use prefix_server::{apply_batch, BlockAliases};
use serde::Serialize;

use crate::cpu;
use crate::simulate::Release;
use crate::workload::Request;
use plan::{plan, Plan};
use publish::{layout, Group};
use server::{split, thread_ids, Progress, Server, Split};

/// The model every engine serves.
const MODEL: &str = "mooncake";

/// The benchmark's knobs.
#[derive(Debug, Clone)]
pub struct IngestConfig {
    /// Engines publishing in parallel.
    pub engines: usize,
    /// Each engine's KV cache, in blocks.
    pub capacity: usize,
    /// Times the trace is replayed, each with fresh block ids.
    pub rounds: usize,
    /// How long to wait for the server to apply everything.
    pub timeout: Duration,
    /// The order in which each engine's cache releases a request's blocks
    /// (the order of its removals).
    pub release: Release,
    /// Processes the engines publish from: this one (1), or that many
    /// children ([`children`]).
    pub publisher_processes: usize,
    /// Subscriptions per request to a remote server.
    pub subscribe_batch: usize,
    /// The trace's file, for the children to read.
    pub trace: std::path::PathBuf,
}

/// The topic engine `pod` publishes under (llm-d's convention).
fn topic(pod: &str) -> String {
    format!("kv@{pod}@{MODEL}")
}

/// Where the engines publish from.
enum Publishers {
    /// Groups in this process.
    Here(Vec<Group>),
    /// Child processes, and the groups they make.
    Children(Vec<children::Publisher>, usize),
}

impl Publishers {
    /// Binds every engine's sockets, here or in children; returns each
    /// engine's ends by index, and the groups they make.
    fn bind(
        plan: &Plan,
        cfg: &IngestConfig,
        prefix: &str,
    ) -> anyhow::Result<(Publishers, Vec<publish::Ends>)> {
        let n = plan.batches.len();
        let mut ends = vec![None; n];
        let publishers = if cfg.publisher_processes <= 1 {
            let groups = layout(n);
            let mut bound = Vec::with_capacity(groups);
            for g in 0..groups {
                let members: Vec<usize> = (g..n).step_by(groups).collect();
                let topics = members
                    .iter()
                    .map(|&e| topic(&format!("{prefix}{e}")))
                    .collect();
                let batches = members.iter().map(|&e| plan.batches[e].clone()).collect();
                let (group, got) = Group::bind(g, members.clone(), topics, batches)?;
                for (e, end) in members.into_iter().zip(got) {
                    ends[e] = Some(end);
                }
                bound.push(group);
            }
            Publishers::Here(bound)
        } else {
            let per = n.div_ceil(cfg.publisher_processes);
            let mut children = Vec::new();
            let mut groups = 0;
            for from in (0..n).step_by(per.max(1)) {
                let to = (from + per).min(n);
                let (child, got) = children::Publisher::spawn(cfg, from, to, prefix)?;
                for (e, end) in got {
                    *ends.get_mut(e).context("an engine out of range")? = Some(end);
                }
                groups += layout(to - from);
                children.push(child);
            }
            Publishers::Children(children, groups)
        };
        let ends = ends
            .into_iter()
            .map(|e| e.context("an engine no publisher bound"))
            .collect::<anyhow::Result<_>>()?;
        Ok((publishers, ends))
    }

    /// The groups the engines make (a thread and a context each).
    fn groups(&self) -> usize {
        match self {
            Publishers::Here(groups) => groups.len(),
            Publishers::Children(_, groups) => *groups,
        }
    }

    /// Waits until `until` for every engine to have answered a replay.
    fn answered(&mut self, until: Instant) {
        match self {
            Publishers::Here(groups) => {
                while groups.iter().any(|g| g.unanswered().next().is_some())
                    && Instant::now() < until
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
            Publishers::Children(children, _) => {
                for c in children {
                    c.answered(until);
                }
            }
        }
    }

    /// The children's CPU time so far (none for publishers in this
    /// process, whose threads are read with the server's).
    fn children_cpu(&self) -> Option<Duration> {
        match self {
            Publishers::Here(_) => None,
            Publishers::Children(children, _) => children
                .iter()
                .map(|c| cpu::process(c.pid()).ok())
                .sum::<Option<Duration>>(),
        }
    }
}

/// Where the events go.
pub enum Target {
    /// A server started in this process.
    Embedded,
    /// A server elsewhere on this machine, told to subscribe through
    /// `client` (a writer); `metrics` is its metrics page, for its CPU time.
    Remote {
        /// A client allowed to subscribe engines.
        client: Client,
        /// `http://host:port/metrics`, if known.
        metrics: Option<String>,
    },
}

/// What one run measured (the `--json` output).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Engines that published.
    pub engines: usize,
    /// Batches published, over all engines.
    pub batches: u64,
    /// Events in them.
    pub events: u64,
    /// Engine blocks stored by those events.
    pub blocks_stored: u64,
    /// Engine blocks removed by those events.
    pub blocks_removed: u64,
    /// Bytes of msgpack payload.
    pub payload_bytes: u64,
    /// Whether the server applied every batch before the timeout.
    pub complete: bool,
    /// From the publishers' start to the last batch applied.
    pub seconds: f64,
    /// From the publishers' start to the last batch queued in libzmq.
    pub publish_seconds: f64,
    /// Stored blocks applied per second, end to end.
    pub stored_blocks_per_sec: f64,
    /// Stored and removed blocks applied per second, end to end.
    pub block_events_per_sec: f64,
    /// Blocks stored, as the server counted them.
    pub applied_stored: u64,
    /// Blocks removed, as the server counted them.
    pub applied_removed: u64,
    /// Replays the server asked for during the run (0 unless it missed
    /// batches; the one it asks for on connecting is not counted).
    pub replays: u64,
    /// Times the server cleared a pod to learn it again.
    pub resyncs: u64,
    /// Stores whose parent the server did not know.
    pub orphaned: u64,
    /// Messages the server could not decode.
    pub decode_errors: u64,
    /// Cores the server kept busy on average (the whole process for a
    /// remote server; in this process its subscription, libzmq and runtime
    /// threads).
    pub server_cpu_cores: Option<f64>,
    /// Of which the subscription threads (receive, decode, apply).
    pub subscription_cpu_cores: Option<f64>,
    /// Of which the server's libzmq threads.
    pub server_zmq_cpu_cores: Option<f64>,
    /// Of which the server's runtime (its sweep, its QUIC endpoint).
    pub server_runtime_cpu_cores: Option<f64>,
    /// The server's CPU time per stored block, in microseconds.
    pub server_cpu_us_per_block: Option<f64>,
    /// Cores the publishers kept busy (their threads and libzmq I/O).
    pub publisher_cpu_cores: Option<f64>,
    /// The publishers' CPU time per stored block, in microseconds.
    pub publisher_cpu_us_per_block: Option<f64>,
    /// Time spent encoding the batches (before the run, not in the
    /// publishers' CPU time) per stored block, in microseconds.
    pub encode_us_per_block: f64,
    /// CPUs of this machine its hypervisor took away on average.
    pub steal_cores: Option<f64>,
    /// The same batches decoded and applied on one thread, no sockets.
    pub in_process: InProcess,
    /// Groups the engines were spread over (a thread and a libzmq context
    /// each on the engines' side).
    pub publisher_groups: usize,
    /// Lookups of sampled engines' last requests after the run.
    pub lookups_checked: usize,
    /// Of which the server matched exactly what the engine's cache holds.
    pub lookups_right: usize,
    /// The server following the engines with nothing published (a
    /// `--server` with `--metrics` only).
    pub idle: Option<Idle>,
}

/// What following the engines costs the server while they publish
/// nothing.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Idle {
    /// The server's resident memory before the engines were subscribed.
    pub resident_before_bytes: u64,
    /// Once it followed every engine (connected, first replays done).
    pub resident_following_bytes: u64,
    /// The difference, per engine.
    pub resident_per_engine_bytes: f64,
    /// How long the CPU time below was measured.
    pub seconds: f64,
    /// Cores the server kept busy meanwhile.
    pub cpu_cores: f64,
}

/// Decode and apply alone, on one thread.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct InProcess {
    /// `decode_batch` time per stored block, in microseconds.
    pub decode_us_per_block: f64,
    /// `apply_batch` time per stored block, in microseconds.
    pub apply_us_per_block: f64,
    /// Stored blocks decoded and applied per second.
    pub stored_blocks_per_sec: f64,
}

/// Runs the benchmark on `trace` against `target`.
pub async fn run(trace: &[Request], cfg: &IngestConfig, target: Target) -> anyhow::Result<Report> {
    let plan = plan(trace, cfg);
    let n = plan.batches.len();
    // Each engine's publisher and replay sockets, the server's connection
    // to each: more than a default soft limit of 1,024 allows a fleet.
    prefix_server::raise_open_files(8 * n as u64 + 1_024)?;
    let before = thread_ids();
    let remote = matches!(target, Target::Remote { .. });
    let prefix = match remote {
        true => format!("ingest-{}-e", std::process::id()),
        false => "e".into(),
    };
    let pods: Vec<String> = (0..n).map(|i| format!("{prefix}{i}")).collect();
    let (mut engines, ends) = Publishers::bind(&plan, cfg, &prefix)?;
    // The engines' libzmq threads exist now (a context starts them with
    // its first socket); the server's come later.
    let engine_threads: HashSet<i32> = thread_ids().difference(&before).copied().collect();
    let subs: Vec<Subscription> = ends
        .into_iter()
        .zip(&pods)
        .map(|(e, pod)| {
            Ok(Subscription {
                pod: pod.clone(),
                model: MODEL.into(),
                endpoint: e.endpoint,
                replay: Some(e.replay),
                block_size: BLOCK_TOKENS as u32,
                topic: e.topic,
                media: vec!["GPU".into()],
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let resident_before = match &target {
        Target::Remote {
            metrics: Some(url), ..
        } => {
            let url = url.clone();
            tokio::task::spawn_blocking(move || {
                cpu::scrape_value(&url, cpu::RESIDENT_METRIC)
                    .ok()
                    .map(|b| b as u64)
            })
            .await?
        }
        _ => None,
    };
    let (server, metrics) = match target {
        Target::Embedded => {
            let subscriptions = subs.clone();
            let s = crate::embedded::server(1, move |c| {
                c.engines.max_engines = c.engines.max_engines.max(subscriptions.len());
                c.engines.subscriptions = subscriptions;
            })
            .await?;
            (Server::Embedded(Box::new(s)), None)
        }
        Target::Remote { client, metrics } => {
            let subs: Vec<Subscription> = subs
                .iter()
                .map(|s| Subscription {
                    pod: s.pod.clone(),
                    model: s.model.clone(),
                    endpoint: s.endpoint.clone(),
                    replay: s.replay.clone(),
                    block_size: s.block_size,
                    topic: s.topic.clone(),
                    media: s.media.clone(),
                })
                .collect();
            for chunk in subs.chunks(cfg.subscribe_batch.max(1)) {
                if let [sub] = chunk {
                    client
                        .subscribe_engine(sub.clone())
                        .await
                        .with_context(|| format!("subscribing {}", sub.pod))?;
                    continue;
                }
                let ops = chunk.iter().cloned().map(Op::Subscribe).collect();
                let replies = client.batch(ops).await?;
                for (sub, reply) in chunk.iter().zip(replies) {
                    if let Reply::Error { code, message } = reply {
                        anyhow::bail!("subscribing {}: {code:?}: {message}", sub.pod);
                    }
                }
            }
            (Server::Remote(client), metrics)
        }
    };
    let result = measure(
        &plan,
        &mut engines,
        &server,
        &pods,
        &engine_threads,
        Watch {
            metrics,
            resident_before,
        },
        cfg,
    )
    .await;
    server.unsubscribe(&pods, cfg.subscribe_batch).await;
    drop(server);
    // The publishing sockets close before their contexts (dropping a
    // context waits for its sockets).
    let mut report = result.map(|(report, _published)| report);
    drop(engines);
    if let Ok(r) = &mut report {
        r.in_process = in_process(&plan, &subs)?;
    }
    report
}

/// What is read of a `--server` elsewhere: its metrics page, and its
/// resident memory before the engines were subscribed.
struct Watch {
    metrics: Option<String>,
    resident_before: Option<u64>,
}

/// Publishes everything and waits for the server to apply it.
async fn measure(
    plan: &Plan,
    engines: &mut Publishers,
    server: &Server,
    pods: &[String],
    engine_threads: &HashSet<i32>,
    watch: Watch,
    cfg: &IngestConfig,
) -> anyhow::Result<(Report, Vec<publish::Published>)> {
    let Watch {
        metrics,
        resident_before,
    } = watch;
    // Connecting takes longer the more engines there are.
    let allowed = Duration::from_secs(10) + Duration::from_millis(pods.len() as u64);
    let until = Instant::now() + allowed;
    while !server.progress(pods).await?.iter().all(|p| p.connected) {
        if Instant::now() > until {
            anyhow::bail!("the server did not connect to every engine within {allowed:?}");
        }
        // As below: a fleet's list is looked at less often.
        tokio::time::sleep(
            Duration::from_millis(20).max(Duration::from_micros(20 * pods.len() as u64)),
        )
        .await;
    }
    // A server that can replay asks for the engine's recent past when it
    // connects (nothing yet): let that end before the run, as it would
    // long before an engine's busy hour.
    let until = Instant::now() + Duration::from_secs(2) + Duration::from_millis(pods.len() as u64);
    tokio::task::block_in_place(|| engines.answered(until));
    // A subscription reaches the publisher just after the connection, and
    // the end of the replay the server just after it is sent: batches
    // published before would be lost to the server (and then replayed,
    // which the report would show).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle = match (&metrics, resident_before) {
        (Some(url), Some(before)) => idle(url, before, pods.len()).await,
        _ => None,
    };
    let base = server.progress(pods).await?;
    let release = Arc::new(AtomicBool::new(false));
    let (start, threads) = match engines {
        Publishers::Here(groups) => {
            let start = Arc::new(Barrier::new(groups.len() + 1));
            let threads = groups
                .iter_mut()
                .enumerate()
                .map(|(i, e)| e.start(i, start.clone(), release.clone()))
                .collect::<anyhow::Result<Vec<_>>>()?;
            (Some(start), threads)
        }
        Publishers::Children(..) => (None, Vec::new()),
    };
    let scrape = |url: Option<String>| async move {
        match url {
            Some(u) => tokio::task::spawn_blocking(move || cpu::scrape(&u).ok())
                .await
                .ok()
                .flatten(),
            None => None,
        }
    };
    let server_before = scrape(metrics.clone()).await;
    let (before, steal_before) = (cpu::threads(), cpu::steal());
    let children_before = engines.children_cpu();
    match (&start, &mut *engines) {
        (Some(start), _) => {
            tokio::task::block_in_place(|| start.wait());
        }
        (None, Publishers::Children(children, _)) => {
            for c in children.iter_mut() {
                c.start()?;
            }
        }
        (None, Publishers::Here(_)) => {}
    }
    let t0 = Instant::now();
    let want: Vec<u64> = plan.batches.iter().map(|b| b.len() as u64).collect();
    // Each look lists every engine: a fleet's list is looked at less often,
    // or the looking would be what the server spends its time on.
    let poll = match server {
        Server::Embedded(_) => Duration::from_millis(1),
        Server::Remote(_) => Duration::from_millis(10),
    }
    .max(Duration::from_micros(20 * pods.len() as u64));
    let mut last;
    let complete = loop {
        last = server.progress(pods).await?;
        if last.iter().zip(&want).all(|(p, w)| p.next_seq >= *w) {
            break true;
        }
        if t0.elapsed() > cfg.timeout {
            break false;
        }
        tokio::time::sleep(poll).await;
    };
    let seconds = t0.elapsed().as_secs_f64();
    let (after, steal_after) = (cpu::threads(), cpu::steal());
    let children_after = engines.children_cpu();
    let server_after = scrape(metrics.clone()).await;
    // Relaxed: a release flag; the joins below order the rest.
    release.store(true, Ordering::Relaxed);
    let published = tokio::task::block_in_place(|| {
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .map_err(|_| anyhow::anyhow!("a publishing thread panicked"))?
            })
            .collect::<anyhow::Result<Vec<_>>>()
    })?;
    let mut publish_seconds = published
        .iter()
        .map(|p| p.done.saturating_duration_since(t0).as_secs_f64())
        .fold(0.0, f64::max);
    if let Publishers::Children(children, _) = engines {
        for c in children.iter_mut() {
            let left = cfg.timeout.saturating_sub(t0.elapsed()) + Duration::from_secs(5);
            publish_seconds = publish_seconds.max(c.published(left)?);
        }
    }
    let children_cpu = match (children_before, children_after) {
        (Some(b), Some(a)) => Some(a.saturating_sub(b)),
        _ => None,
    };
    // Counts of the run alone (the server's replay on connecting is not).
    let sum = |f: fn(&Progress) -> u64| {
        let total = |p: &[Progress]| p.iter().map(f).sum::<u64>();
        total(&last).saturating_sub(total(&base))
    };
    let cores = |d: Duration| d.as_secs_f64() / seconds.max(1e-9);
    let per_block = |d: Duration| d.as_secs_f64() * 1e6 / plan.stored.max(1) as f64;
    let used = match (before, after) {
        (Some(b), Some(a)) => {
            let (b, a) = (split(&b, engine_threads), split(&a, engine_threads));
            Some(Split {
                subscriptions: a.subscriptions.saturating_sub(b.subscriptions),
                server_zmq: a.server_zmq.saturating_sub(b.server_zmq),
                server_runtime: a.server_runtime.saturating_sub(b.server_runtime),
                publishers: a.publishers.saturating_sub(b.publishers),
            })
        }
        _ => None,
    };
    let in_here = matches!(server, Server::Embedded(_));
    let server_cpu = match (in_here, used, server_before, server_after) {
        (true, Some(u), _, _) => Some(u.subscriptions + u.server_zmq + u.server_runtime),
        (false, _, Some(b), Some(a)) => Some(a.saturating_sub(b)),
        _ => None,
    };
    let own = |f: fn(&Split) -> Duration| used.filter(|_| in_here).map(|u| cores(f(&u)));
    let (lookups_checked, lookups_right) = server.check(&plan.checks, pods).await?;
    let report = Report {
        engines: pods.len(),
        publisher_groups: engines.groups(),
        lookups_checked,
        lookups_right,
        idle,
        batches: want.iter().sum(),
        events: plan.events,
        blocks_stored: plan.stored,
        blocks_removed: plan.removed,
        payload_bytes: plan.bytes,
        complete,
        seconds,
        publish_seconds,
        stored_blocks_per_sec: sum(|p| p.stored) as f64 / seconds.max(1e-9),
        block_events_per_sec: (sum(|p| p.stored) + sum(|p| p.removed)) as f64 / seconds.max(1e-9),
        applied_stored: sum(|p| p.stored),
        applied_removed: sum(|p| p.removed),
        replays: sum(|p| p.replays),
        resyncs: sum(|p| p.resyncs),
        orphaned: sum(|p| p.orphaned),
        decode_errors: sum(|p| p.decode_errors),
        server_cpu_cores: server_cpu.map(cores),
        subscription_cpu_cores: own(|u| u.subscriptions),
        server_zmq_cpu_cores: own(|u| u.server_zmq),
        server_runtime_cpu_cores: own(|u| u.server_runtime),
        server_cpu_us_per_block: server_cpu.map(per_block),
        publisher_cpu_cores: children_cpu.or(used.map(|u| u.publishers)).map(cores),
        publisher_cpu_us_per_block: children_cpu.or(used.map(|u| u.publishers)).map(per_block),
        encode_us_per_block: per_block(plan.encoding),
        steal_cores: match (steal_before, steal_after) {
            (Some(b), Some(a)) => Some(cores(a.saturating_sub(b))),
            _ => None,
        },
        // Measured after the server is gone.
        in_process: InProcess::default(),
    };
    Ok((report, published))
}

/// How long the server is watched following engines that publish nothing.
const IDLE: Duration = Duration::from_secs(5);

/// The server's memory now against `before`, and its CPU time over
/// [`IDLE`], while it follows `engines` that publish nothing.
async fn idle(url: &str, before: u64, engines: usize) -> Option<Idle> {
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        let resident = cpu::scrape_value(&url, cpu::RESIDENT_METRIC).ok()? as u64;
        let (cpu0, t0) = (cpu::scrape(&url).ok()?, Instant::now());
        std::thread::sleep(IDLE);
        let (cpu1, seconds) = (cpu::scrape(&url).ok()?, t0.elapsed().as_secs_f64());
        Some(Idle {
            resident_before_bytes: before,
            resident_following_bytes: resident,
            resident_per_engine_bytes: resident.saturating_sub(before) as f64
                / engines.max(1) as f64,
            seconds,
            cpu_cores: cpu1.saturating_sub(cpu0).as_secs_f64() / seconds,
        })
    })
    .await
    .ok()
    .flatten()
}

/// Decodes and applies every batch on this thread, into a fresh index
/// configured as the server's, in the order the engines published them
/// (round-robin over engines).
fn in_process(plan: &Plan, subs: &[Subscription]) -> anyhow::Result<InProcess> {
    let index = Index::new(IndexConfig {
        max_pods: u32::try_from(subs.len())?.max(IndexConfig::default().max_pods),
        ..IndexConfig::default()
    });
    let spec = prefix_server::engine_spec(BLOCK_TOKENS as u32, BLOCK_TOKENS as u32);
    let handles = subs
        .iter()
        .map(|s| index.engine(&s.pod, spec))
        .collect::<Result<Vec<_>, _>>()?;
    let limits = DecodeLimits::default();
    let (mut decode, mut apply, mut stored) = (Duration::ZERO, Duration::ZERO, 0u64);
    let longest = plan.batches.iter().map(|b| b.len()).max().unwrap_or(0);
    for i in 0..longest {
        for (e, batches) in plan.batches.iter().enumerate() {
            let Some(payload) = batches.get(i) else {
                continue;
            };
            let t0 = Instant::now();
            let batch = decode_batch(payload, &limits)?;
            let t1 = Instant::now();
            let out = apply_batch(&index, &subs[e], &handles[e], &batch, BlockAliases::None);
            apply += t1.elapsed();
            decode += t1 - t0;
            stored += out.applied.stored;
        }
    }
    let per_block = |d: Duration| d.as_secs_f64() * 1e6 / stored.max(1) as f64;
    Ok(InProcess {
        decode_us_per_block: per_block(decode),
        apply_us_per_block: per_block(apply),
        stored_blocks_per_sec: stored as f64 / (decode + apply).as_secs_f64().max(1e-9),
    })
}

/// Prints a report for people.
pub fn print(r: &Report, cfg: &IngestConfig, trace_len: usize, target: &str) {
    let opt = |x: Option<f64>, digits: usize| x.map_or("?".into(), |x| format!("{x:.digits$}"));
    println!("target        {target}");
    println!(
        "events        {} requests x {} round(s), round-robin over {} engines with LRU caches of {} blocks: {} batches, {} events, {} blocks stored, {} removed, {:.1} MB of msgpack",
        trace_len,
        cfg.rounds,
        r.engines,
        cfg.capacity,
        r.batches,
        r.events,
        r.blocks_stored,
        r.blocks_removed,
        r.payload_bytes as f64 / 1e6
    );
    println!(
        "end to end    {:.3} s{}: {:.0} stored blocks/s ({:.0} stored + removed/s); publishers done after {:.3} s",
        r.seconds,
        if r.complete { "" } else { " (timed out: incomplete)" },
        r.stored_blocks_per_sec,
        r.block_events_per_sec,
        r.publish_seconds
    );
    println!(
        "server CPU    {} cores (engine threads {}, libzmq {}, runtime {}), {} µs per stored block",
        opt(r.server_cpu_cores, 2),
        opt(r.subscription_cpu_cores, 2),
        opt(r.server_zmq_cpu_cores, 2),
        opt(r.server_runtime_cpu_cores, 2),
        opt(r.server_cpu_us_per_block, 2)
    );
    println!(
        "engines CPU   {} cores (publishing threads and their libzmq I/O), {} µs per stored block; encoding beforehand {:.2} µs per stored block",
        opt(r.publisher_cpu_cores, 2),
        opt(r.publisher_cpu_us_per_block, 2),
        r.encode_us_per_block
    );
    println!(
        "in process    decode {:.2} + apply {:.2} µs per stored block on one thread: {:.0} stored blocks/s",
        r.in_process.decode_us_per_block, r.in_process.apply_us_per_block, r.in_process.stored_blocks_per_sec
    );
    if let Some(i) = &r.idle {
        println!(
            "idle          resident {:.1} MB before the engines, {:.1} MB following them: {:.1} KB per engine; {:.3} cores over {:.1} s with nothing published",
            i.resident_before_bytes as f64 / 1e6,
            i.resident_following_bytes as f64 / 1e6,
            i.resident_per_engine_bytes / 1e3,
            i.cpu_cores,
            i.seconds
        );
    }
    println!(
        "lookups       {} of {} sampled engines' last requests matched their caches; engines in {} publishing groups",
        r.lookups_right, r.lookups_checked, r.publisher_groups
    );
    println!(
        "checks        server counted {} stored, {} removed; replays {}, resyncs {}, orphaned {}, decode errors {}; steal {} cores",
        r.applied_stored,
        r.applied_removed,
        r.replays,
        r.resyncs,
        r.orphaned,
        r.decode_errors,
        opt(r.steal_cores, 3)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_process_apply_stores_every_block_with_no_orphans() {
        let cfg = IngestConfig {
            engines: 2,
            capacity: 30,
            rounds: 1,
            timeout: Duration::from_secs(1),
            release: Release::TailFirst,
            publisher_processes: 1,
            subscribe_batch: 1,
            trace: Default::default(),
        };
        let p = plan(&plan::tests::trace(), &cfg);
        let subs: Vec<Subscription> = (0..2)
            .map(|i| Subscription {
                pod: format!("e{i}"),
                model: MODEL.into(),
                endpoint: "tcp://127.0.0.1:1".into(),
                replay: None,
                block_size: BLOCK_TOKENS as u32,
                topic: "kv".into(),
                media: vec!["GPU".into()],
            })
            .collect();
        let r = in_process(&p, &subs).unwrap();
        assert!(r.stored_blocks_per_sec > 0.0, "{r:?}");
    }

    /// End to end on loopback through libzmq: a server in this process
    /// follows twelve engines (in eight publishing groups) and applies
    /// every batch, with no replay, resync or orphan; lookups match the
    /// engines' caches.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_server_in_this_process_applies_every_published_batch() {
        let cfg = IngestConfig {
            engines: 12,
            capacity: 40,
            rounds: 2,
            timeout: Duration::from_secs(60),
            release: Release::InOrder,
            publisher_processes: 1,
            subscribe_batch: 1,
            trace: Default::default(),
        };
        let r = run(&plan::tests::trace(), &cfg, Target::Embedded)
            .await
            .unwrap();
        assert!(r.complete, "{r:?}");
        assert_eq!(r.applied_stored, r.blocks_stored, "{r:?}");
        assert_eq!(r.applied_removed, r.blocks_removed, "{r:?}");
        assert_eq!(
            (r.replays, r.resyncs, r.orphaned, r.decode_errors),
            (0, 0, 0, 0),
            "{r:?}"
        );
        assert!(r.stored_blocks_per_sec > 0.0);
        assert_eq!(r.publisher_groups, 8);
        assert!(r.lookups_checked >= 12, "{r:?}");
        assert_eq!(r.lookups_right, r.lookups_checked, "{r:?}");
    }
}
