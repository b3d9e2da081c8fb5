//! `prefix-load`'s command line: its subcommands and their flags.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};

use crate::simulate;

#[derive(Debug, Parser)]
#[command(version, about = "Load tester and routing simulator for prefix-index")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Option<Command>,
    #[command(flatten)]
    pub(crate) load: LoadArgs,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Replay a trace through the index as G gateways routing to P pods, and
    /// report block hit ratio, load imbalance and the index's accuracy per
    /// routing policy.
    Simulate(SimArgs),
    /// Replay a trace as engine KV-cache events (vLLM's format) from N
    /// engines publishing through libzmq PUB sockets into a server, and
    /// report the blocks per second it applies end to end and where the
    /// time goes.
    Events(EventsArgs),
    /// One of `events --publisher-processes`' children (not for people).
    #[command(hide = true)]
    PublishEngines(crate::ingest::ChildArgs),
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
pub(crate) struct BootstrapArgs {
    /// Index sizes in entries (comma-separated); 14,500,000 is the flood's
    /// last snapshot in docs/benchmarks.md.
    #[arg(long, value_delimiter = ',', default_value = "100000,1000000,14500000")]
    pub(crate) sizes: Vec<u64>,
    /// Rounds: each starts one server of each kind per size.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Print the starts as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct ReplicasArgs {
    /// Replica counts to measure (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3")]
    pub(crate) counts: Vec<usize>,
    /// Gateways, each a Cluster with its own seed.
    #[arg(long, default_value_t = 6)]
    pub(crate) gateways: usize,
    /// Lookups in flight per gateway.
    #[arg(long, default_value_t = 8)]
    pub(crate) in_flight: usize,
    /// Length of each cell.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Rounds, the counts' order rotating.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// Worker threads of each server process.
    #[arg(long, default_value_t = 1)]
    pub(crate) server_threads: usize,
    /// Print the cells as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct HttpArgs {
    /// Pods, each holding every key (each answer names them all).
    #[arg(long, default_value_t = 16)]
    pub(crate) pods: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 1024)]
    pub(crate) keys: usize,
    /// Blocks per key.
    #[arg(long, default_value_t = 32)]
    pub(crate) key_blocks: usize,
    /// Requests in flight, one cell each (comma-separated).
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    pub(crate) in_flight: Vec<usize>,
    /// Length of each cell.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Rounds, each transport's turn rotating.
    #[arg(long, default_value_t = 3)]
    pub(crate) rounds: usize,
    /// The in-process server's worker threads.
    #[arg(long, default_value_t = 1)]
    pub(crate) server_threads: usize,
    /// Load this server's QUIC address instead of one in this process
    /// (QUIC only; the index must take the inserts of every key for every
    /// pod).
    #[arg(long, requires = "ca")]
    pub(crate) server: Option<SocketAddr>,
    /// CA certificate of --server.
    #[arg(long)]
    pub(crate) ca: Option<PathBuf>,
    /// Print the cells as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct EventsArgs {
    /// Trace file [default: ../shared/traces/mooncake_conversation.jsonl].
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Engines publishing in parallel, each with its own sockets and topic
    /// (a thread each up to 8, then threads for groups of them).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) engines: u16,
    /// Each engine's KV cache in blocks (its evictions are the removals).
    #[arg(long, default_value_t = 4096)]
    pub(crate) capacity: usize,
    /// Times the trace is replayed, each time with fresh block ids.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) rounds: u16,
    /// The order in which each engine's cache releases a request's blocks:
    /// tail-first as vLLM and SGLang do, or in-order, the costliest order
    /// of removals for the server to follow.
    #[arg(long, value_enum, default_value_t = simulate::Release::TailFirst)]
    pub(crate) release: simulate::Release,
    /// Give up waiting for the server after this long.
    #[arg(long, default_value = "120s", value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,
    /// Processes the engines publish from: each engine's sockets hold five
    /// open files, so a fleet of thousands needs more than one process's
    /// limit (1 publishes from this process).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub(crate) publisher_processes: u16,
    /// Subscriptions sent to --server per request (a batch of `subscribe`
    /// ops, which the server makes in one step), and unsubscriptions at
    /// the end likewise; 1 sends one op at a time.
    #[arg(long, default_value_t = 512, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub(crate) subscribe_batch: u16,
    /// Subscribe this server (on this machine: the engines bind on
    /// 127.0.0.1) instead of starting one in this process.
    #[arg(long)]
    pub(crate) server: Option<SocketAddr>,
    /// CA certificate of --server.
    #[arg(long, default_value = "prefix-index-data/cert.pem")]
    pub(crate) ca: PathBuf,
    /// Client certificate for --server (a writer identity, when the server
    /// has roles).
    #[arg(long, requires = "key")]
    pub(crate) cert: Option<PathBuf>,
    /// Its private key.
    #[arg(long, requires = "cert")]
    pub(crate) key: Option<PathBuf>,
    /// --server's metrics listener, for its CPU time.
    #[arg(long, requires = "server")]
    pub(crate) metrics: Option<SocketAddr>,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct StallArgs {
    /// Probing threads [default: one per core].
    #[arg(long)]
    pub(crate) threads: Option<usize>,
    /// How long to probe.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Print the result as one JSON object instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, clap::Args)]
pub(crate) struct SimArgs {
    /// Trace file [default: ../shared/traces/mooncake_conversation.jsonl].
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Gateway counts to simulate.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub(crate) gateways: Vec<usize>,
    /// Policies to simulate.
    #[arg(long, value_enum, value_delimiter = ',', default_values_t = simulate::Policy::ALL)]
    pub(crate) policies: Vec<simulate::Policy>,
    /// Pods.
    #[arg(long, default_value_t = 16)]
    pub(crate) pods: usize,
    /// Each pod's KV cache in blocks (Mooncake blocks are 512 tokens).
    #[arg(long, default_value_t = 4096)]
    pub(crate) capacity: usize,
    /// Requests that define a pod's current load.
    #[arg(long, default_value_t = 64)]
    pub(crate) window: usize,
    /// Weight of load against prefix match (see the formula in the docs).
    #[arg(long, default_value_t = 0.5)]
    pub(crate) balance: f64,
    /// prefix-shared and prefix-local: the capacity the index is told each
    /// pod has, as a multiple of --capacity (1: right; 0.5: half; 2:
    /// double). Each value given is simulated.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub(crate) capacity_model: Vec<f64>,
    /// precise: from a change of a pod's cache to the index applying the
    /// engine's event: about one scheduler step, since vLLM publishes a
    /// step's events when it schedules the step.
    #[arg(long, default_value = "100ms", value_parser = humantime::parse_duration)]
    pub(crate) event_delay: Duration,
    /// precise: how long a gateway's insert for an engine-fed pod stays
    /// visible unless the engine's events confirm it; 0s: gateways do not
    /// insert for engine-fed pods.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub(crate) speculative_ttl: Duration,
    /// The order in which each pod's cache releases a request's blocks:
    /// tail-first as vLLM and SGLang do, or in-order.
    #[arg(long, value_enum, default_value_t = simulate::Release::TailFirst)]
    pub(crate) release: simulate::Release,
    /// precise: pod N's eviction events are lost from trace time T on, its
    /// stores still arriving (`N@T`, e.g. `3@10m`): how soon its receipts
    /// find it suspect.
    #[arg(long, value_parser = evictions_lost, conflicts_with = "silence")]
    pub(crate) lose_evictions: Option<simulate::Silence>,
    /// precise: every event of pod N is lost from trace time T on (`N@T`):
    /// whether its receipts find it suspect.
    #[arg(long, value_parser = events_lost)]
    pub(crate) silence: Option<simulate::Silence>,
    /// Use the server at this address instead of an in-process index (not
    /// with the precise policy).
    #[arg(long)]
    pub(crate) server: Option<SocketAddr>,
    /// CA certificate of --server.
    #[arg(long, default_value = "prefix-index-data/cert.pem")]
    pub(crate) ca: PathBuf,
    /// Write an SVG plot of hit ratio against gateways here.
    #[arg(long)]
    pub(crate) plot: Option<PathBuf>,
    /// Print the results as JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum WorkloadKind {
    /// Synthetic chat sessions (text keys hashed by the client library).
    Chat,
    /// A Mooncake JSON Lines trace (`hash_ids` are the keys).
    Trace,
}

#[derive(Debug, clap::Args)]
pub(crate) struct LoadArgs {
    /// Server to load.
    #[arg(long, default_value = "127.0.0.1:7070")]
    pub(crate) server: SocketAddr,
    /// CA certificate of --server.
    #[arg(long, default_value = "prefix-index-data/cert.pem")]
    pub(crate) ca: PathBuf,
    /// --server's metrics listener (its --metrics-listen): the summary then
    /// gives the server's CPU time per op, from its
    /// `prefix_index_process_cpu_seconds_total` (each read of the page may
    /// take up to 5 s).
    #[arg(long, conflicts_with_all = ["embedded", "echo"])]
    pub(crate) metrics: Option<SocketAddr>,
    /// Start a server in this process on a free loopback port and load it.
    #[arg(long)]
    pub(crate) embedded: bool,
    /// Start a bare quinn echo server (same framing, canned answers, no
    /// index) in this process and load it: the transport baseline.
    #[arg(long, conflicts_with = "embedded")]
    pub(crate) echo: bool,
    /// --embedded or --echo: the in-process server's worker threads
    /// [default: half the cores, at least 1].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) server_threads: Option<u16>,
    /// The load generator's worker threads [default: with --embedded or
    /// --echo, the cores the server does not take (at least 1); otherwise
    /// one per core].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub(crate) load_threads: Option<u16>,
    /// --embedded: the server's pod capacity in blocks.
    #[arg(long, default_value_t = 31_250)]
    pub(crate) pod_capacity: u64,
    /// --embedded: the server's sweep interval.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
    pub(crate) sweep_interval: Duration,
    /// Busy polling: the generator's workers poll instead of sleeping and
    /// pace --rate on a worker, and an in-process server gets
    /// `--busy-poll 1s`. Every worker core then runs at 100%; see
    /// docs/operations.md.
    #[arg(long)]
    pub(crate) busy_poll: bool,
    /// Workload.
    #[arg(long, value_enum, default_value_t = WorkloadKind::Chat)]
    pub(crate) workload: WorkloadKind,
    /// Trace file for --workload trace [default: ../shared/traces/mooncake_conversation.jsonl].
    #[arg(long)]
    pub(crate) trace: Option<PathBuf>,
    /// Trace clock scale: 2 replays twice as fast; 0 replays as fast as the
    /// closed loop allows.
    #[arg(long, default_value_t = 0.0)]
    pub(crate) speed: f64,
    /// Chat: shared system prompts.
    #[arg(long, default_value_t = 32)]
    pub(crate) systems: usize,
    /// Chat: sessions.
    #[arg(long, default_value_t = 2000)]
    pub(crate) sessions: usize,
    /// Chat: requests prepared before the run (sent in a cycle).
    #[arg(long, default_value_t = 50_000)]
    pub(crate) requests: usize,
    /// Chat: longest prompt in 64-byte blocks (a session starts over past it).
    #[arg(long, default_value_t = 512)]
    pub(crate) max_blocks: usize,
    /// Chat: Zipf exponent of session popularity.
    #[arg(long, default_value_t = 1.1)]
    pub(crate) zipf: f64,
    /// Gateway identities (each with its own connections and sessions).
    #[arg(long, default_value_t = 1)]
    pub(crate) gateways: usize,
    /// Connections per gateway.
    #[arg(long, default_value_t = 1)]
    pub(crate) connections: usize,
    /// Closed loop: requests in flight per connection.
    #[arg(long, default_value_t = 32)]
    pub(crate) in_flight: usize,
    /// Open loop: frames per second over all connections (latency counted
    /// from each frame's scheduled time).
    #[arg(long)]
    pub(crate) rate: Option<f64>,
    /// Ops per frame.
    #[arg(long, default_value_t = 1)]
    pub(crate) batch: usize,
    /// Fraction of ops that are lookups (the rest are inserts).
    #[arg(long, default_value_t = 0.9)]
    pub(crate) mix: f64,
    /// Pods that inserts name (and that the echo server's answers list).
    #[arg(long, default_value_t = 16)]
    pub(crate) pods: usize,
    /// The ops that are not lookups are receipts, not inserts: each for the
    /// pod its session sticks to, reporting that the engine reused the
    /// whole key (with --prefill, as predicted). What sending a receipt per
    /// request costs, beside --mix 1.
    #[arg(long)]
    pub(crate) receipts: bool,
    /// Before the run, insert every prepared request for every pod, so that
    /// lookups find --pods pods each (as the echo server's answers list).
    #[arg(long)]
    pub(crate) prefill: bool,
    /// Make every op's key new (a flood of distinct keys, inserts spread over
    /// --pods pods): for memory bounds, with --mix 0.
    #[arg(long)]
    pub(crate) unique: bool,
    /// Measured time.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub(crate) duration: Duration,
    /// Unmeasured time before it.
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub(crate) warmup: Duration,
    /// Per-request deadline (the library's default is a gateway's 2 ms).
    #[arg(long, default_value = "2ms", value_parser = humantime::parse_duration)]
    pub(crate) deadline: Duration,
    /// Print the summary as one JSON object.
    #[arg(long)]
    pub(crate) json: bool,
}

/// `N@T` of `--lose-evictions`.
fn evictions_lost(s: &str) -> Result<simulate::Silence, String> {
    parse_silence(s, simulate::Lost::Evictions)
}

/// `N@T` of `--silence`.
fn events_lost(s: &str) -> Result<simulate::Silence, String> {
    parse_silence(s, simulate::Lost::All)
}

/// `N@T`: pod N, from trace time T (a duration: `10m`, `600s`).
fn parse_silence(s: &str, lost: simulate::Lost) -> Result<simulate::Silence, String> {
    let (pod, at) = s
        .split_once('@')
        .ok_or_else(|| format!("{s:?}: give POD@TIME, e.g. 3@10m"))?;
    let pod = pod
        .parse()
        .map_err(|e| format!("{pod:?}: a pod's number: {e}"))?;
    let at = humantime::parse_duration(at).map_err(|e| format!("{at:?}: {e}"))?;
    Ok(simulate::Silence {
        pod,
        from_ms: u64::try_from(at.as_millis()).unwrap_or(u64::MAX),
        lost,
    })
}
