//! `prefix-load http`: the HTTP/JSON API beside QUIC, in one run against one
//! in-process server. The same lookups (keys of `key_blocks` hashes, every
//! answer naming every pod) go over QUIC (the client library), HTTP/1.1
//! (a pool of kept-alive connections) and HTTP/2 (one multiplexed
//! connection), at each number in flight, in alternating order over
//! several rounds; each cell reports lookups/s, p50/p99 and the server's
//! CPU time per lookup.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use prefix_client::{Client, ClientConfig};
use serde::Serialize;

use crate::cpu::{CpuUse, Probe};
use crate::embedded;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Pods, each holding every key.
    pub pods: usize,
    /// Distinct keys looked up.
    pub keys: usize,
    /// Blocks per key.
    pub key_blocks: usize,
    /// Requests in flight, one cell each.
    pub in_flight: Vec<usize>,
    /// Length of one cell.
    pub duration: Duration,
    /// Times every cell is measured, in alternating transport order.
    pub rounds: usize,
    /// The in-process server's worker threads.
    pub server_threads: usize,
    /// Load this server (QUIC address, CA) instead of one in this process:
    /// QUIC only, and no server CPU (the Python package's benchmark
    /// compares itself with the Rust client this way).
    pub external: Option<(SocketAddr, std::path::PathBuf)>,
}

/// One way to the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Transport {
    /// QUIC, through `prefix-client`.
    Quic,
    /// HTTP/1.1 with keep-alive.
    Http1,
    /// HTTP/2.
    Http2,
}

/// One measured cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The round.
    pub round: usize,
    /// The transport.
    pub transport: Transport,
    /// Requests in flight.
    pub in_flight: usize,
    /// Lookups answered per second.
    pub lookups_per_s: f64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
    /// The server's CPU time per lookup, microseconds.
    pub server_cpu_us: Option<f64>,
    /// This process's CPU time per lookup (the gateway's side),
    /// microseconds.
    pub client_cpu_us: Option<f64>,
}

/// A lookup sender of one transport.
#[derive(Clone)]
enum Sender {
    Quic(Client),
    Http(reqwest::Client, String),
}

impl Sender {
    /// Looks `key` up and checks the answer names `pods` pods.
    async fn lookup(&self, key: &[u64], pods: usize) -> anyhow::Result<()> {
        let found = match self {
            Sender::Quic(c) => c.lookup("m", key, None).await?.matches.len(),
            Sender::Http(c, url) => {
                let body = serde_json::to_vec(&serde_json::json!({"model": "m", "hashes": key}))?;
                let resp = c.post(url).body(body).send().await?;
                let status = resp.status();
                let bytes = resp.bytes().await?;
                if !status.is_success() {
                    bail!("HTTP {status}: {}", String::from_utf8_lossy(&bytes));
                }
                let v: serde_json::Value = serde_json::from_slice(&bytes)?;
                v["matches"].as_array().map_or(0, Vec::len)
            }
        };
        if found != pods {
            bail!("an answer named {found} pods, not {pods}");
        }
        Ok(())
    }
}

fn http_client(ca: &std::path::Path, http1: bool) -> anyhow::Result<reqwest::Client> {
    let root = reqwest::Certificate::from_pem(&std::fs::read(ca)?)?;
    let mut b = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(root)
        .pool_max_idle_per_host(64)
        .no_proxy();
    b = if http1 {
        b.http1_only()
    } else {
        b.http2_prior_knowledge()
    };
    Ok(b.build()?)
}

/// Key `k` of the benchmarks' key set: `blocks` hashes no other key shares
/// (`client/python/bench.py` builds the same ones).
pub fn key(k: u64, blocks: usize) -> Vec<u64> {
    (0..blocks as u64).map(|b| k << 20 | b).collect()
}

/// The keys every run looks up: `keys` of `key_blocks` distinct hashes.
fn keys(plan: &Plan) -> Vec<Vec<u64>> {
    (0..plan.keys as u64)
        .map(|k| key(k, plan.key_blocks))
        .collect()
}

/// Runs the plan and returns every cell.
pub async fn run(plan: &Plan) -> anyhow::Result<Vec<Cell>> {
    let mut embedded = None;
    let (addr, tls, ca, api) = match &plan.external {
        Some((addr, ca)) => (
            *addr,
            prefix_client::TlsConfig::from_files(ca, None, None)?,
            ca.clone(),
            None,
        ),
        None => {
            let server = embedded::server(plan.server_threads, |cfg| {
                cfg.transport.http_listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
                cfg.index.max_key_blocks = cfg.index.max_key_blocks.max(plan.key_blocks);
                // Every pod holds every key, whatever the default capacity.
                cfg.index.pod_capacity = (plan.keys * plan.key_blocks) as u64;
            })
            .await?;
            let api = server
                .api
                .context("the in-process server has no HTTP API")?;
            let found = (server.addr, server.tls.clone(), server.ca_path(), Some(api));
            embedded = Some(server);
            found
        }
    };
    let cfg = ClientConfig {
        tls,
        deadline: Duration::from_secs(5),
        ..ClientConfig::default()
    };
    let quic = Client::connect(addr, cfg).await?;
    let keys = keys(plan);
    for pod in 0..plan.pods {
        for chunk in keys.chunks(512) {
            let ops = chunk
                .iter()
                .map(|key| prefix_client::wire::Op::Insert {
                    model: "m".into(),
                    key: key.clone(),
                    pod: format!("pod-{pod}"),
                })
                .collect();
            for reply in quic.batch(ops).await? {
                if let prefix_client::wire::Reply::Error { message, .. } = reply {
                    bail!("filling the index: {message}");
                }
            }
        }
    }
    let mut senders = vec![(Transport::Quic, Sender::Quic(quic.clone()))];
    if let Some(api) = api {
        let url = format!("https://localhost:{}/v1/lookup", api.port());
        senders.push((
            Transport::Http1,
            Sender::Http(http_client(&ca, true)?, url.clone()),
        ));
        senders.push((
            Transport::Http2,
            Sender::Http(http_client(&ca, false)?, url),
        ));
    }
    let keys = Arc::new(keys);
    let probe = Arc::new(if embedded.is_some() {
        Probe::InProcess
    } else {
        Probe::LoadOnly
    });
    let mut cells = Vec::new();
    for round in 0..plan.rounds {
        for &in_flight in &plan.in_flight {
            // Alternate the order, so drift over a round falls on each
            // transport in turn.
            let mut order: Vec<usize> = (0..senders.len()).collect();
            order.rotate_left(round % senders.len());
            for i in order {
                let (transport, sender) = &senders[i];
                // Warm the connections (and the pool up to `in_flight`).
                measure(
                    sender,
                    &keys,
                    plan.pods,
                    in_flight,
                    Duration::from_millis(300),
                    &probe,
                )
                .await?;
                let (lookups_per_s, h, cpu) =
                    measure(sender, &keys, plan.pods, in_flight, plan.duration, &probe).await?;
                cells.push(Cell {
                    round,
                    transport: *transport,
                    in_flight,
                    lookups_per_s,
                    p50_us: h.value_at_quantile(0.5),
                    p99_us: h.value_at_quantile(0.99),
                    server_cpu_us: cpu.server_cpu_us_per_op,
                    client_cpu_us: cpu.load_cpu_us_per_op,
                });
            }
        }
    }
    quic.close().await;
    drop(embedded);
    Ok(cells)
}

/// Closed loop: `in_flight` tasks each sending lookups back to back for
/// `duration`.
async fn measure(
    sender: &Sender,
    keys: &Arc<Vec<Vec<u64>>>,
    pods: usize,
    in_flight: usize,
    duration: Duration,
    probe: &Arc<Probe>,
) -> anyhow::Result<(f64, Histogram<u64>, CpuUse)> {
    let p = probe.clone();
    let before = tokio::task::spawn_blocking(move || p.read()).await?;
    let start = Instant::now();
    let tasks: Vec<_> = (0..in_flight)
        .map(|t| {
            let (sender, keys) = (sender.clone(), keys.clone());
            tokio::spawn(async move {
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
                let mut i = t * 7919;
                while start.elapsed() < duration {
                    let key = &keys[i % keys.len()];
                    i += 1;
                    let t0 = Instant::now();
                    sender.lookup(key, pods).await?;
                    h.saturating_record(t0.elapsed().as_micros() as u64);
                }
                anyhow::Ok(h)
            })
        })
        .collect();
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for t in tasks {
        all.add(t.await??)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let p = probe.clone();
    let after = tokio::task::spawn_blocking(move || p.read()).await?;
    let cpu = CpuUse::between(before, after, seconds, all.len());
    Ok((all.len() as f64 / seconds, all, cpu))
}

/// Prints the cells, and per round and depth each transport's throughput
/// and CPU against QUIC's.
pub fn print(cells: &[Cell]) {
    println!(
        "{:>5} {:>6} {:>9} {:>12} {:>8} {:>8} {:>14} {:>14} {:>10}",
        "round",
        "in",
        "transport",
        "lookups/s",
        "p50 µs",
        "p99 µs",
        "server µs/op",
        "client µs/op",
        "vs QUIC"
    );
    for c in cells {
        let quic = cells.iter().find(|q| {
            q.round == c.round && q.in_flight == c.in_flight && q.transport == Transport::Quic
        });
        let ratio = quic.map_or(String::new(), |q| {
            format!("{:.2}×", c.lookups_per_s / q.lookups_per_s)
        });
        let us = |u: Option<f64>| u.map_or("?".into(), |u| format!("{u:.1}"));
        println!(
            "{:>5} {:>6} {:>9} {:>12.0} {:>8} {:>8} {:>14} {:>14} {:>10}",
            c.round,
            c.in_flight,
            format!("{:?}", c.transport),
            c.lookups_per_s,
            c.p50_us,
            c.p99_us,
            us(c.server_cpu_us),
            us(c.client_cpu_us),
            ratio
        );
    }
}
