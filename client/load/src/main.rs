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
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;
use prefix_client::{Client, ClientConfig, TlsConfig};

mod args;
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

use args::*;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
        Some(Command::PublishEngines(a)) => ingest::child_main(a),
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
        receipts: a.receipts,
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

/// Inserts every request's key for every pod, in batches that each fit a
/// server with the default limits (the client's own are lifted for the
/// load): as many ops as `max_batch` allows while the frame stays within
/// `max_frame_bytes`.
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
    let limits = prefix_proto::Limits::default();
    // A batch's frame is its ops' encodings and a few bytes of framing.
    let room = (limits.max_frame_bytes as usize).saturating_sub(16);
    let mut encoded = Vec::new();
    let mut chunk = Vec::new();
    let mut size = 0;
    for op in ops {
        encoded.clear();
        prefix_proto::encode_request(0, &prefix_proto::Request::One(op.clone()), &mut encoded);
        let len = encoded.len();
        if !chunk.is_empty() && (size + len > room || chunk.len() == limits.max_batch) {
            send_prefill(&client, std::mem::take(&mut chunk)).await?;
            size = 0;
        }
        size += len;
        chunk.push(op);
    }
    if !chunk.is_empty() {
        send_prefill(&client, chunk).await?;
    }
    Ok(())
}

async fn send_prefill(client: &Client, ops: Vec<prefix_proto::Op>) -> anyhow::Result<()> {
    for reply in client.batch(ops).await? {
        if let prefix_proto::Reply::Error { message, .. } = reply {
            anyhow::bail!("prefill failed: {message}");
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
        silence: a.lose_evictions.or(a.silence),
    };
    if let Some(s) = cfg.silence.filter(|s| s.pod >= cfg.pods) {
        anyhow::bail!("pod {} of {} cannot lose its events", s.pod, cfg.pods);
    }
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
    println!("| policy | gateways | hit ratio | of 1-gateway | of bound | imbalance (max/mean) | accuracy | recall | receipts exact / over / under |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let share = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.3}"));
    let receipts = |r: &simulate::SimResult| {
        r.receipts.map_or("-".to_string(), |s| {
            format!("{:.3} / {:.3} / {:.3}", s.exact, s.over, s.under)
        })
    };
    for r in &results {
        let one = results
            .iter()
            .find(|o| o.label() == r.label() && o.gateways == 1)
            .map_or(f64::NAN, |o| r.hit_ratio / o.hit_ratio);
        println!(
            "| {} | {} | {:.3} | {:.2} | {:.2} | {:.2} | {} | {} | {} |",
            r.label(),
            r.gateways,
            r.hit_ratio,
            one,
            r.hit_ratio / bound,
            r.imbalance,
            share(r.accuracy),
            share(r.recall),
            receipts(r),
        );
    }
    if let Some(s) = cfg.silence {
        for r in results.iter().filter(|r| r.silenced.is_some()) {
            let Some(q) = &r.silenced else { continue };
            let found = match (q.suspect_after, q.over_by_then) {
                (Some(n), Some(o)) => {
                    format!("at its request {n}, its over-predicted receipt {o}")
                }
                _ => "never".to_string(),
            };
            println!(
                "precise, {} gateways: pod {}'s {} were lost from {:?} on; {} requests went to it after, {} of them over-predicted; its receipts made it suspect {found}; other pods were made suspect {} times",
                r.gateways,
                s.pod,
                s.lost.name(),
                Duration::from_millis(s.from_ms),
                q.requests,
                q.over,
                q.others_suspect,
            );
        }
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
        publisher_processes: a.publisher_processes.into(),
        subscribe_batch: a.subscribe_batch.into(),
        trace: path.clone(),
    };
    let (target, name) = match a.server {
        None => (
            ingest::Target::Embedded,
            "server in this process (its own runtime and engine threads)".to_string(),
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
    if report.lookups_right < report.lookups_checked {
        anyhow::bail!(
            "the server matched {} of {} sampled engines' caches",
            report.lookups_right,
            report.lookups_checked
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
