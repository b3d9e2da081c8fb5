//! `prefix-load replicas`: read throughput of one model served by 1, 2, …
//! replicas. Each replica is a `prefix-server` process of its own (the
//! binary beside this one), every model on all of them (`R` = their count);
//! gateways (`Cluster`s with different seeds) look keys up closed-loop and
//! their reads divide over the replicas. Per count: lookups/s, p50/p99 and
//! each replica's CPU time per lookup it answered.

use std::net::{SocketAddr, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use hdrhistogram::Histogram;
use prefix_client::wire::Op;
use prefix_client::{ClientConfig, Cluster, Replication, TlsConfig};
use serde::Serialize;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Replica counts, one cell each per round.
    pub counts: Vec<usize>,
    /// Gateways (each a `Cluster` with its own seed).
    pub gateways: usize,
    /// Lookups in flight per gateway.
    pub in_flight: usize,
    /// Length of one cell.
    pub duration: Duration,
    /// Rounds, the counts' order rotating.
    pub rounds: usize,
    /// Worker threads of each server.
    pub server_threads: usize,
}

/// One measured cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The round.
    pub round: usize,
    /// Replicas serving the model.
    pub replicas: usize,
    /// Lookups answered per second, over every gateway.
    pub lookups_per_s: f64,
    /// Median latency, microseconds.
    pub p50_us: u64,
    /// 99th percentile, microseconds.
    pub p99_us: u64,
    /// Each replica's CPU time over the lookups the cluster answered in the
    /// cell, divided by the lookups it took (an even share), microseconds.
    pub cpu_us_per_lookup: Vec<f64>,
}

const PODS: usize = 16;
const KEYS: u64 = 1024;
const KEY_BLOCKS: u64 = 32;

struct Proc {
    child: Child,
    addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> anyhow::Result<SocketAddr> {
    Ok(UdpSocket::bind("127.0.0.1:0")?.local_addr()?)
}

/// Starts `n` servers sharing the first one's certificate.
async fn start(n: usize, threads: usize) -> anyhow::Result<(Vec<Proc>, PathBuf)> {
    let bin = std::env::current_exe()?.with_file_name("prefix-server");
    if !bin.exists() {
        bail!(
            "{} not found: build it (cargo build --release)",
            bin.display()
        );
    }
    let mut procs: Vec<Proc> = Vec::new();
    let mut cert: Option<(PathBuf, PathBuf)> = None;
    for _ in 0..n {
        let dir = tempfile::tempdir()?;
        let addr = free_port()?;
        let mut cmd = Command::new(&bin);
        cmd.args(["--listen", &addr.to_string(), "--metrics-listen", "off"])
            .args(["--snapshot-interval", "0s", "--pod-capacity"])
            .arg((KEYS * KEY_BLOCKS).to_string())
            .arg("--data-dir")
            .arg(dir.path())
            .env("TOKIO_WORKER_THREADS", threads.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some((c, k)) = &cert {
            cmd.arg("--cert").arg(c).arg("--key").arg(k);
        }
        let child = cmd.spawn().context("starting prefix-server")?;
        if cert.is_none() {
            let (c, k) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
            let started = Instant::now();
            while !(c.exists() && k.exists()) {
                if started.elapsed() > Duration::from_secs(30) {
                    bail!("the first server wrote no certificate");
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            cert = Some((c, k));
        }
        procs.push(Proc {
            child,
            addr,
            _dir: dir,
        });
    }
    let ca = cert.map(|(c, _)| c).context("no server")?;
    Ok((procs, ca))
}

async fn connect(procs: &[Proc], ca: &Path, seed: u64) -> anyhow::Result<Cluster> {
    let list: Vec<(String, SocketAddr)> = procs
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("index-{i}"), p.addr))
        .collect();
    let cfg = ClientConfig {
        tls: TlsConfig::from_files(ca, None, None)?,
        deadline: Duration::from_secs(2),
        connect_timeout: Duration::from_secs(10),
        ..ClientConfig::default()
    };
    let replication = Replication {
        replicas: procs.len(),
        seed,
        ..Replication::default()
    };
    let started = Instant::now();
    loop {
        match Cluster::connect_replicated(&list, replication.clone(), cfg.clone()).await {
            Ok(c) => return Ok(c),
            Err(_) if started.elapsed() < Duration::from_secs(30) => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn key(k: u64) -> Vec<u64> {
    crate::door::key(k, KEY_BLOCKS as usize)
}

/// One cell: `n` fresh replicas, filled, then read.
async fn cell(plan: &Plan, n: usize, round: usize) -> anyhow::Result<Cell> {
    let (procs, ca) = start(n, plan.server_threads).await?;
    let filler = connect(&procs, &ca, 0).await?;
    for pod in 0..PODS {
        for chunk in (0..KEYS).collect::<Vec<_>>().chunks(256) {
            let ops = chunk
                .iter()
                .map(|&k| Op::Insert {
                    model: "m".into(),
                    key: key(k),
                    pod: format!("pod-{pod}"),
                })
                .collect();
            filler.batch(ops).await?;
        }
    }
    // Every replica holds every key before reading starts.
    for (_, c) in filler.servers() {
        let started = Instant::now();
        while c.lookup("m", &key(KEYS - 1), None).await?.matches.len() < PODS {
            if started.elapsed() > Duration::from_secs(30) {
                bail!("a replica never got every write");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let mut gateways = Vec::new();
    for g in 0..plan.gateways {
        gateways.push(connect(&procs, &ca, 1 + g as u64 * 7919).await?);
    }
    let cpu_before: Vec<Duration> = procs
        .iter()
        .map(|p| Ok(crate::cpu::process(p.child.id())?))
        .collect::<anyhow::Result<_>>()?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (g, gw) in gateways.iter().enumerate() {
        for t in 0..plan.in_flight {
            let gw = gw.clone();
            let duration = plan.duration;
            tasks.push(tokio::spawn(async move {
                let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
                let mut i = (g * 1000 + t) as u64 * 7919;
                while start.elapsed() < duration {
                    let k = key(i % KEYS);
                    i += 1;
                    let t0 = Instant::now();
                    let r = gw.lookup("m", &k, None).await?;
                    if r.matches.len() != PODS {
                        bail!("an answer named {} pods, not {PODS}", r.matches.len());
                    }
                    h.saturating_record(t0.elapsed().as_micros() as u64);
                }
                anyhow::Ok(h)
            }));
        }
    }
    let mut all = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for t in tasks {
        all.add(t.await??)?;
    }
    let seconds = start.elapsed().as_secs_f64();
    let cpu_after: Vec<Duration> = procs
        .iter()
        .map(|p| Ok(crate::cpu::process(p.child.id())?))
        .collect::<anyhow::Result<_>>()?;
    let per_replica = all.len() as f64 / n as f64;
    Ok(Cell {
        round,
        replicas: n,
        lookups_per_s: all.len() as f64 / seconds,
        p50_us: all.value_at_quantile(0.5),
        p99_us: all.value_at_quantile(0.99),
        cpu_us_per_lookup: cpu_after
            .iter()
            .zip(&cpu_before)
            .map(|(a, b)| a.saturating_sub(*b).as_secs_f64() * 1e6 / per_replica.max(1.0))
            .collect(),
    })
}

/// Runs the plan and returns every cell.
pub async fn run(plan: &Plan) -> anyhow::Result<Vec<Cell>> {
    let mut cells = Vec::new();
    for round in 0..plan.rounds {
        let mut counts = plan.counts.clone();
        let by = round % counts.len().max(1);
        counts.rotate_left(by);
        for n in counts {
            cells.push(cell(plan, n, round).await?);
        }
    }
    Ok(cells)
}

/// Prints the cells.
pub fn print(cells: &[Cell]) {
    println!(
        "{:>5} {:>8} {:>12} {:>8} {:>8}  CPU µs per lookup, each replica",
        "round", "replicas", "lookups/s", "p50 µs", "p99 µs"
    );
    for c in cells {
        let cpu: Vec<String> = c
            .cpu_us_per_lookup
            .iter()
            .map(|u| format!("{u:.1}"))
            .collect();
        println!(
            "{:>5} {:>8} {:>12.0} {:>8} {:>8}  {}",
            c.round,
            c.replicas,
            c.lookups_per_s,
            c.p50_us,
            c.p99_us,
            cpu.join(" ")
        );
    }
}
