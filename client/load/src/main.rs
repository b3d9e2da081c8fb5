//! `prefix-load`: load tester, trace replay and routing simulation for the
//! prefix-index service.
//!
//! `prefix-load --embedded` starts a server in this process on a free loopback
//! port and loads it (a one-command demo); `--echo` starts a bare quinn echo
//! server instead (the transport baseline); otherwise it loads `--server`.
//! Either in-process server runs on a runtime of its own, as in its own
//! process, and the summary splits the CPU time between it and the load
//! generator.
//! `prefix-load simulate` replays a trace through the index as G gateways
//! routing to P pods and reports hit ratios per routing policy (approximate
//! mode with capacity models, precise mode fed by the pods' cache events,
//! and an oracle that reads the caches).
//! `prefix-load events` replays the trace as engine KV-cache events through
//! libzmq PUB sockets into a server and reports its ingest rate end to end.
//! `prefix-load stalls` measures how long the machine itself keeps threads
//! from running, the floor under any latency measured on it.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use prefix_client::{Client, ClientConfig, TlsConfig};

mod bootstrap;
mod cpu;
mod door;
mod embedded;
mod ingest;
mod load;
mod replicas;
mod simulate;
mod stalls;
mod workload;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(version, about = "Load tester and routing simulator for prefix-index")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    load: LoadArgs,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Replay a trace through the index as G gateways routing to P pods, and
    /// report block hit ratio, load imbalance and the index's accuracy per
    /// routing policy.
    Simulate(SimArgs),
    /// Replay a trace as engine KV-cache events (vLLM's format) from N
    /// engines publishing through libzmq PUB sockets into a server, and
    /// report the blocks per second it applies end to end and where the
    /// time goes.
    Events(EventsArgs),
    /// Measure how long the machine itself keeps threads from running (the
    /// floor under any latency measured here), then exit.
    Stalls(StallArgs),
    /// The HTTP/JSON API beside QUIC against one in-process server: the
    /// same lookups over QUIC, HTTP/1.1 and HTTP/2, lookups/s, p50/p99 and
    /// the server's CPU per lookup at each depth, in alternating rounds.
    Http(HttpArgs),
    /// Read throughput of one model served by 1, 2, … replicas: a
    /// `prefix-server` process each (the binary beside this one), gateways
    /// as replicated `Cluster`s, and each replica's CPU per lookup.
    Replicas(ReplicasArgs),
    /// Time from a replica's start to ready, filled from a live peer's
    /// snapshot, against a start from its own snapshot of the same index,
    /// per index size: `prefix-server` processes (the binary beside this
    /// one), alternating in each round.
    Bootstrap(BootstrapArgs),
}

#[derive(Debug, clap::Args)]
struct BootstrapArgs {
    /// Index sizes in entries (comma-separated); 14,500,000 is the flood's
    /// last snapshot in docs/benchmarks.md.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000,14500000")]
    sizes: Vec<u64>,
    /// Rounds: each starts one server of each kind per size.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Print the starts as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct ReplicasArgs {
    /// Replica counts to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    counts: Vec<usize>,
    /// Gateways, each a Cluster with its own seed.
    #[arg(long, default_value_t = 6)]
    gateways: usize,
    /// Lookups in flight per gateway.
    #[arg(long, default_value_t = 8)]
    in_flight: usize,
    /// Length of each cell.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Rounds, the counts' order rotating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Worker threads of each server process.
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    /// Print the cells as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct HttpArgs {
    /// Pods, each holding every key (each answer names them all).
    #[arg(long, default_value_t = 16)]
    pods: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 1024)]
    keys: usize,
    /// Blocks per key.
    #[arg(long, default_value_t = 32)]
    key_blocks: usize,
    /// Requests in flight, one cell each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    in_flight: Vec<usize>,
    /// Length of each cell.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Rounds, each transport's turn rotating.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// The in-process server's worker threads.
    #[arg(long, default_value_t = 1)]
    server_threads: usize,
    /// Load this server's QUIC address instead of one in this process
    /// (QUIC only; the index must take the inserts of every key for every
    /// pod).
    #[arg(long, requires = "ca")]
    server: Option<SocketAddr>,
    /// CA certificate of --server.
    #[arg(long)]
    ca: Option<PathBuf>,
    /// Print the cells as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct EventsArgs {
    /// Trace file [default: ../shared/traces/mooncake_conversation.jsonl].
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Engines publishing in parallel, each with its own socket and thread.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    engines: u16,
    /// Each engine's KV cache in blocks (its evictions are the removals).
    #[arg(long, default_value_t = 4096)]
    capacity: usize,
    /// Times the trace is replayed, each time with fresh block ids.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    rounds: u16,
    /// The order in which each engine's cache releases a request's blocks:
    /// tail-first as vLLM and SGLang do, or in-order, the costliest order
    /// of removals for the server to follow.
    #[arg(long, value_enum, default_value_t = simulate::Release::TailFirst)]
    release: simulate::Release,
    /// Give up waiting for the server after this long.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Subscribe this server (on this machine: the engines bind on
    /// 127.0.0.1) instead of starting one in this process.
    #[arg(long)]
    server: Option<SocketAddr>,
    /// CA certificate of --server.
    #[arg(long, default_value = "prefix-index-data/cert.pem")]
    ca: PathBuf,
    /// Client certificate for --server (a writer identity, when the server
    /// has roles).
    #[arg(long, requires = "key")]
    cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, requires = "cert")]
    key: Option<PathBuf>,
    /// --server's metrics listener, for its CPU time.
    #[arg(long, requires = "server")]
    metrics: Option<SocketAddr>,
    /// Print the result as one JSON object.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct StallArgs {
    /// Probing threads [default: one per core].
    #[arg(long)]
    threads: Option<usize>,
    /// How long to probe.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Print the result as one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
struct SimArgs {
    /// Trace file [default: ../shared/traces/mooncake_conversation.jsonl].
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Gateway counts to simulate.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    gateways: Vec<usize>,
    /// Policies to simulate.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = simulate::Policy::ALL)]
    policies: Vec<simulate::Policy>,
    /// Pods.
    #[arg(long, default_value_t = 16)]
    pods: usize,
    /// Each pod's KV cache in blocks (Mooncake blocks are 512 tokens).
    #[arg(long, default_value_t = 4096)]
    capacity: usize,
    /// Requests that define a pod's current load.
    #[arg(long, default_value_t = 64)]
    window: usize,
    /// Weight of load against prefix match (see the formula in the docs).
    #[arg(long, default_value_t = 0.5)]
    balance: f64,
    /// prefix-shared and prefix-local: the capacity the index is told each
    /// pod has, as a multiple of --capacity (1: right; 0.5: half; 2:
    /// double). Each value given is simulated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    capacity_model: Vec<f64>,
    /// precise: from a change of a pod's cache to the index applying the
    /// engine's event: about one scheduler step, since vLLM publishes a
    /// step's events when it schedules the step.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    event_delay: Duration,
    /// precise: how long a gateway's insert for an engine-fed pod stays
    /// visible unless the engine's events confirm it; 0s: gateways do not
    /// insert for engine-fed pods.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    speculative_ttl: Duration,
    /// The order in which each pod's cache releases a request's blocks:
    /// tail-first as vLLM and SGLang do, or in-order.
    #[arg(long, value_enum, default_value_t = simulate::Release::TailFirst)]
    release: simulate::Release,
    /// Use the server at this address instead of an in-process index (not
    /// with the precise policy).
    #[arg(long)]
    server: Option<SocketAddr>,
    /// CA certificate of --server.
    #[arg(long, default_value = "prefix-index-data/cert.pem")]
    ca: PathBuf,
    /// Write an SVG plot of hit ratio against gateways here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Print the results as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WorkloadKind {
    /// Synthetic chat sessions (text keys hashed by the client library).
    Chat,
    /// A Mooncake JSON Lines trace (`hash_ids` are the keys).
    Trace,
}

#[derive(Debug, clap::Args)]
struct LoadArgs {
    /// Server to load.
    #[arg(long, default_value = "127.0.0.1:7070")]
    server: SocketAddr,
    /// CA certificate of --server.
    #[arg(long, default_value = "prefix-index-data/cert.pem")]
    ca: PathBuf,
    /// --server's metrics listener (its --metrics-listen): the summary then
    /// gives the server's CPU time per op, from its
    /// `prefix_index_process_cpu_seconds_total` (each read of the page may
    /// take up to 5 s).
    #[arg(long, conflicts_with_all = ["embedded", "echo"])]
    metrics: Option<SocketAddr>,
    /// Start a server in this process on a free loopback port and load it.
    #[arg(long)]
    embedded: bool,
    /// Start a bare quinn echo server (same framing, canned answers, no
    /// index) in this process and load it: the transport baseline.
    #[arg(long, conflicts_with = "embedded")]
    echo: bool,
    /// --embedded or --echo: the in-process server's worker threads
    /// [default: half the cores, at least 1].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    server_threads: Option<u16>,
    /// The load generator's worker threads [default: with --embedded or
    /// --echo, the cores the server does not take (at least 1); otherwise
    /// one per core].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    load_threads: Option<u16>,
    /// --embedded: the server's pod capacity in blocks.
    #[arg(long, default_value_t = 31_250)]
    pod_capacity: u64,
    /// --embedded: the server's sweep interval.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    sweep_interval: Duration,
    /// Busy polling: the generator's workers poll instead of sleeping and
    /// pace --rate on a worker, and an in-process server gets
    /// `--busy-poll 1s`. Every worker core then runs at 100%; see
    /// docs/operations.md.
    #[arg(long)]
    busy_poll: bool,
    /// Workload.
    #[arg(long, value_enum, default_value_t = WorkloadKind::Chat)]
    workload: WorkloadKind,
    /// Trace file for --workload trace [default: ../shared/traces/mooncake_conversation.jsonl].
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Trace clock scale: 2 replays twice as fast; 0 replays as fast as the
    /// closed loop allows.
    #[arg(long, default_value_t = 0.0)]
    speed: f64,
    /// Chat: shared system prompts.
    #[arg(long, default_value_t = 32)]
    systems: usize,
    /// Chat: sessions.
    #[arg(long, default_value_t = 2000)]
    sessions: usize,
    /// Chat: requests prepared before the run (sent in a cycle).
    #[arg(long, default_value_t = 50_000)]
    requests: usize,
    /// Chat: longest prompt in 64-byte blocks (a session starts over past it).
    #[arg(long, default_value_t = 512)]
    max_blocks: usize,
    /// Chat: Zipf exponent of session popularity.
    #[arg(long, default_value_t = 1.1)]
    zipf: f64,
    /// Gateway identities (each with its own connections and sessions).
    #[arg(long, default_value_t = 1)]
    gateways: usize,
    /// Connections per gateway.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Closed loop: requests in flight per connection.
    #[arg(long, default_value_t = 32)]
    in_flight: usize,
    /// Open loop: frames per second over all connections (latency counted
    /// from each frame's scheduled time).
    #[arg(long)]
    rate: Option<f64>,
    /// Ops per frame.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Fraction of ops that are lookups (the rest are inserts).
    #[arg(long, default_value_t = 0.9)]
    mix: f64,
    /// Pods that inserts name (and that the echo server's answers list).
    #[arg(long, default_value_t = 16)]
    pods: usize,
    /// Before the run, insert every prepared request for every pod, so that
    /// lookups find --pods pods each (as the echo server's answers list).
    #[arg(long)]
    prefill: bool,
    /// Make every op's key new (a flood of distinct keys, inserts spread over
    /// --pods pods): for memory bounds, with --mix 0.
    #[arg(long)]
    unique: bool,
    /// Measured time.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// Unmeasured time before it.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    warmup: Duration,
    /// Per-request deadline (the library's default is a gateway's 2 ms).
    #[arg(long, default_value = "2ms", value_parser = humantime::parse_duration)]
    deadline: Duration,
    /// Print the summary as one JSON object.
    #[arg(long)]
    json: bool,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cli.load.split().1)
        .enable_all()
        .build()?;
    match cli.command {
        None => rt.block_on(load_main(cli.load)),
        Some(Command::Simulate(a)) => rt.block_on(simulate_main(a)),
        Some(Command::Events(a)) => rt.block_on(events_main(a)),
        Some(Command::Replicas(a)) => {
            let plan = replicas::Plan {
                counts: a.counts,
                gateways: a.gateways,
                in_flight: a.in_flight,
                duration: a.duration,
                rounds: a.rounds,
                server_threads: a.server_threads,
            };
            let cells = rt.block_on(replicas::run(&plan))?;
            report(cells.as_slice(), a.json, replicas::print)
        }
        Some(Command::Bootstrap(a)) => {
            let plan = bootstrap::Plan {
                sizes: a.sizes,
                rounds: a.rounds,
            };
            let cells = rt.block_on(bootstrap::run(&plan))?;
            report(cells.as_slice(), a.json, bootstrap::print)
        }
        Some(Command::Http(a)) => {
            let plan = door::Plan {
                pods: a.pods,
                keys: a.keys,
                key_blocks: a.key_blocks,
                in_flight: a.in_flight,
                duration: a.duration,
                rounds: a.rounds,
                server_threads: a.server_threads,
                external: a.server.zip(a.ca),
            };
            let cells = rt.block_on(door::run(&plan))?;
            report(cells.as_slice(), a.json, door::print)
        }
        Some(Command::Stalls(a)) => {
            let threads = a.threads.unwrap_or_else(cores);
            let stalled = stalls::run(threads, a.duration)?;
            report(&stalled, a.json, stalls::print)
        }
    }
}

/// Prints what a subcommand measured: as JSON, or as its table.
fn report<T: serde::Serialize + ?Sized>(
    measured: &T,
    json: bool,
    table: impl FnOnce(&T),
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(measured)?);
    } else {
        table(measured);
    }
    Ok(())
}

impl LoadArgs {
    /// Worker threads of the in-process server and of the load generator.
    /// With a server in this process they split the machine by default, as
    /// two processes given cores of their own would: on a 2-core machine one
    /// each. Two full pools on the same cores do worse in both throughput
    /// and tail (4 workers on 2 cores switch more; `docs/benchmarks.md`).
    /// Against a remote server the generator takes every core.
    fn split(&self) -> (usize, usize) {
        let here = self.embedded || self.echo;
        let server = self.server_threads.map_or(cores() / 2, usize::from).max(1);
        let rest = if here {
            cores().saturating_sub(server)
        } else {
            cores()
        };
        (server, self.load_threads.map_or(rest, usize::from).max(1))
    }
}

async fn load_main(a: LoadArgs) -> anyhow::Result<()> {
    if a.server_threads.is_some() && !(a.embedded || a.echo) {
        anyhow::bail!("--server-threads needs --embedded or --echo (the server runs elsewhere)");
    }
    let threads = a.split().0;
    let (addr, tls, _server) = if a.embedded {
        let (interval, capacity, busy) = (a.sweep_interval, a.pod_capacity, a.busy_poll);
        let s = embedded::server(threads, |c| {
            c.upkeep.sweep_interval = interval;
            c.index.pod_capacity = capacity;
            c.transport.busy_poll = busy.then_some(embedded::BUSY_POLL_WINDOW);
        })
        .await?;
        (s.addr, s.tls.clone(), Some(s))
    } else if a.echo {
        let busy = a.busy_poll.then_some(embedded::BUSY_POLL_WINDOW);
        let s = embedded::echo(threads, a.pods, busy).await?;
        (s.addr, s.tls.clone(), Some(s))
    } else {
        let tls = TlsConfig::from_files(&a.ca, None, None)
            .with_context(|| format!("loading --ca {}", a.ca.display()))?;
        (a.server, tls, None)
    };
    let requests = match a.workload {
        WorkloadKind::Chat => {
            let mut chat = workload::Chat::new(1, a.systems, a.sessions, a.zipf, a.max_blocks);
            (0..a.requests).map(|_| chat.next()).collect()
        }
        WorkloadKind::Trace => {
            let path = a.trace.clone().unwrap_or_else(workload::default_trace);
            workload::load_trace(&path)?
        }
    };
    let source = load::Source {
        unique: a.unique,
        requests: Arc::new(requests),
        speed: if a.workload == WorkloadKind::Trace {
            a.speed
        } else {
            0.0
        },
    };
    let cfg = ClientConfig {
        tls,
        deadline: a.deadline,
        limits: prefix_proto::Limits {
            max_frame_bytes: prefix_proto::MAX_FRAME_CEILING,
            max_batch: 4096,
            ..Default::default()
        },
        ..ClientConfig::default()
    };
    let cpu = if a.embedded || a.echo {
        cpu::Probe::InProcess
    } else if let Some(m) = a.metrics {
        let url = format!("http://{m}/metrics");
        // Fail before any load rather than print a summary without the
        // figure asked for.
        let scraped = url.clone();
        tokio::task::spawn_blocking(move || cpu::scrape(&scraped))
            .await?
            .context("--metrics")?;
        cpu::Probe::Metrics(url)
    } else {
        cpu::Probe::LoadOnly
    };
    let mut clients = Vec::new();
    for g in 0..a.gateways.max(1) {
        for _ in 0..a.connections.max(1) {
            let c = Client::connect(addr, cfg.clone())
                .await
                .with_context(|| format!("connecting to {addr}"))?;
            clients.push((g, c));
        }
    }
    if a.prefill && !a.echo {
        prefill(&clients[0].1, &source.requests, a.pods).await?;
    }
    let plan = load::Plan {
        gateways: a.gateways.max(1),
        connections: a.connections.max(1),
        in_flight: a.in_flight,
        rate: a.rate,
        batch: a.batch.max(1),
        lookups: a.mix.clamp(0.0, 1.0),
        pods: a.pods.max(1),
        model: MODEL.into(),
        duration: a.duration,
        warmup: a.warmup,
        cpu,
        busy_poll: a.busy_poll,
    };
    let total = plan.warmup + plan.duration;
    let bar = if std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new(total.as_millis() as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:40} {elapsed}/{duration} {msg}")
                .expect("valid template"),
        );
        Some(bar)
    } else {
        None
    };
    let b2 = bar.clone();
    let mut last = (Duration::ZERO, 0u64);
    let summary = load::run(plan.clone(), source, clients, move |t, ops| {
        if let Some(b) = &b2 {
            let rate = (ops - last.1) as f64 / (t - last.0).as_secs_f64().max(1e-3);
            last = (t, ops);
            b.set_position(t.as_millis() as u64);
            b.set_message(format!("{:.0} ops/s", rate));
        }
    })
    .await;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    if a.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        print_table(&a, &plan, &summary);
    }
    Ok(())
}

/// Inserts every request's key for every pod, in batches.
async fn prefill(
    client: &Client,
    requests: &[workload::Request],
    pods: usize,
) -> anyhow::Result<()> {
    let client = client.with_deadline(Duration::from_secs(30));
    let ops: Vec<prefix_proto::Op> = requests
        .iter()
        .flat_map(|r| {
            (0..pods).map(|p| prefix_proto::Op::Insert {
                model: MODEL.into(),
                key: r.key.clone(),
                pod: format!("pod-{p}"),
            })
        })
        .collect();
    for chunk in ops.chunks(1024) {
        for reply in client.batch(chunk.to_vec()).await? {
            if let prefix_proto::Reply::Error { message, .. } = reply {
                anyhow::bail!("prefill failed: {message}");
            }
        }
    }
    Ok(())
}

/// This machine's cores (1 if unknown).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The model every load-test op names.
const MODEL: &str = "llama-3-8b";

async fn simulate_main(a: SimArgs) -> anyhow::Result<()> {
    if a.server.is_some() && a.policies.contains(&simulate::Policy::Precise) {
        anyhow::bail!(
            "the precise policy needs the in-process index (the simulated engines' events are applied in this process): drop --server or the policy"
        );
    }
    let path = a.trace.clone().unwrap_or_else(workload::default_trace);
    let trace = workload::load_trace(&path)?;
    let backend = match a.server {
        None => simulate::Backend::Embedded,
        Some(addr) => {
            let cfg = ClientConfig {
                tls: TlsConfig::from_files(&a.ca, None, None)?,
                deadline: Duration::from_secs(5),
                ..ClientConfig::default()
            };
            simulate::Backend::Remote(Client::connect(addr, cfg).await?)
        }
    };
    if a.capacity_model
        .iter()
        .any(|m| !(m.is_finite() && *m > 0.0))
    {
        anyhow::bail!("--capacity-model takes positive multiples of --capacity");
    }
    let cfg = simulate::SimConfig {
        pods: a.pods.max(1),
        capacity: a.capacity.max(1),
        capacity_model: 1.0,
        window: a.window.max(1),
        balance: a.balance,
        seed: 7,
        event_delay: a.event_delay,
        speculative_ttl: a.speculative_ttl,
        release: a.release,
    };
    let bound = simulate::upper_bound(&trace);
    // Distinct names per run keep runs apart on a shared server.
    let run_id = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as usize % 100_000);
    let mut results = Vec::new();
    for &policy in &a.policies {
        let models = match policy.models_capacity() {
            true => &a.capacity_model[..],
            false => &[1.0][..],
        };
        for &capacity_model in models {
            let cfg = simulate::SimConfig {
                capacity_model,
                ..cfg.clone()
            };
            for &g in &a.gateways {
                let id = run_id * 1000 + results.len();
                results.push(simulate::simulate(&trace, g, policy, &cfg, &backend, id).await?);
            }
        }
    }
    if let Some(p) = &a.plot {
        simulate::plot(&results, bound, p)?;
    }
    if a.json {
        let out = serde_json::json!({ "upper_bound": bound, "results": results });
        println!("{out}");
        return Ok(());
    }
    println!(
        "{} requests, {} pods x {} blocks, load window {}, balance {}; precise: event delay {:?}, speculative TTL {:?}; upper bound (one unbounded cache) {:.3}",
        trace.len(),
        cfg.pods,
        cfg.capacity,
        cfg.window,
        cfg.balance,
        cfg.event_delay,
        cfg.speculative_ttl,
        bound
    );
    println!("| policy | gateways | hit ratio | of 1-gateway | of bound | imbalance (max/mean) | accuracy | recall |");
    println!("|---|---|---|---|---|---|---|---|");
    let share = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
    for r in &results {
        let one = results
            .iter()
            .find(|o| o.label() == r.label() && o.gateways == 1)
            .map_or(f64::NAN, |o| r.hit_ratio / o.hit_ratio);
        println!(
            "| {} | {} | {:.3} | {:.2} | {:.2} | {:.2} | {} | {} |",
            r.label(),
            r.gateways,
            r.hit_ratio,
            one,
            r.hit_ratio / bound,
            r.imbalance,
            share(r.accuracy),
            share(r.recall),
        );
    }
    Ok(())
}

async fn events_main(a: EventsArgs) -> anyhow::Result<()> {
    let path = a.trace.clone().unwrap_or_else(workload::default_trace);
    let trace = workload::load_trace(&path)?;
    let cfg = ingest::IngestConfig {
        engines: a.engines.into(),
        capacity: a.capacity.max(1),
        rounds: a.rounds.into(),
        timeout: a.timeout,
        release: a.release,
    };
    let (target, name) = match a.server {
        None => (
            ingest::Target::Embedded,
            "server in this process (its own runtime, one thread per subscription)".to_string(),
        ),
        Some(addr) => {
            let cfg = ClientConfig {
                tls: TlsConfig::from_files(&a.ca, a.cert.as_deref(), a.key.as_deref())
                    .with_context(|| format!("loading --ca {}", a.ca.display()))?,
                deadline: Duration::from_secs(5),
                ..ClientConfig::default()
            };
            let client = Client::connect(addr, cfg)
                .await
                .with_context(|| format!("connecting to {addr}"))?;
            let metrics = a.metrics.map(|m| format!("http://{m}/metrics"));
            (ingest::Target::Remote { client, metrics }, addr.to_string())
        }
    };
    let report = ingest::run(&trace, &cfg, target).await?;
    if a.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        ingest::print(&report, &cfg, trace.len(), &name);
    }
    if !report.complete {
        anyhow::bail!(
            "the server had not applied every batch after {:?}",
            a.timeout
        );
    }
    Ok(())
}

fn print_table(a: &LoadArgs, p: &load::Plan, s: &load::Summary) {
    let target = if a.embedded {
        "embedded server".to_string()
    } else if a.echo {
        "embedded echo server (no index)".to_string()
    } else {
        a.server.to_string()
    };
    let mode = match p.rate {
        Some(r) => format!("open loop, {r:.0} frames/s"),
        None => format!("closed loop, {} in flight per connection", p.in_flight),
    };
    println!("target        {target}");
    println!(
        "load          {:?} workload, {} gateway(s) x {} connection(s), {mode}, {} op(s)/frame, {:.0}% lookups",
        a.workload,
        p.gateways,
        p.connections,
        p.batch,
        p.lookups * 100.0
    );
    println!(
        "measured      {:.1} s after {:?} warm-up",
        s.seconds, p.warmup
    );
    println!("ops/s         {:.0}", s.ops_per_sec);
    println!(
        "latency (µs)  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
        s.p50_us, s.p90_us, s.p99_us, s.p999_us, s.max_us
    );
    println!(
        "errors        {}   timeouts {} (deadline {:?})",
        s.errors, s.timeouts, a.deadline
    );
    if let Some(c) = &s.cpu {
        if let (Some(cores), Some(per_op)) = (c.server_cpu_cores, c.server_cpu_us_per_op) {
            println!("server CPU    {cores:.2} cores, {per_op:.2} µs per op");
        }
        if let (Some(cores), Some(per_op)) = (c.load_cpu_cores, c.load_cpu_us_per_op) {
            println!(
                "load CPU      {cores:.2} cores, {per_op:.2} µs per op (generator and client library)"
            );
        }
        if let Some(cores) = c.steal_cores {
            println!("steal         {cores:.3} cores taken by the hypervisor (whole machine)");
        }
    }
}
