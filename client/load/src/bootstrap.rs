//! `prefix-load bootstrap`: how long a replica takes from its start to
//! ready when it fills itself from a live peer, against a start from its own
//! snapshot of the same index.
//!
//! Per size, an index of that many entries is built in this process (keys of
//! 16 distinct blocks over 512 pods, the flood's shape in
//! `docs/benchmarks.md`) and saved as a snapshot; a peer `prefix-server` (the
//! binary beside this one) starts from it. Then, alternating within each
//! round, a server starts from a copy of the file in its own data directory
//! ("own"), and a server with an empty data directory and `--peer` fills from
//! the peer ("peer"). Time is from spawn to `/readyz` answering 200; each new
//! server's entries are checked against the peer's before it counts.

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use prefix_client::{Client, ClientConfig, TlsConfig};
use prefix_index::{Index, IndexConfig};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Index sizes, in entries ((pod, block) pairs).
    pub sizes: Vec<u64>,
    /// Rounds (each measures "own" and "peer" once per size, alternating
    /// which goes first).
    pub rounds: usize,
}

/// One start.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// The round.
    pub round: usize,
    /// Entries in the index.
    pub entries: u64,
    /// Bytes of its snapshot.
    pub snapshot_bytes: u64,
    /// `own` (from its own snapshot file) or `peer` (filled from the peer).
    pub start: &'static str,
    /// From spawn to `/readyz` 200, milliseconds.
    pub ready_ms: f64,
    /// The new server's resident memory once ready, MiB (Linux).
    pub resident_mib: Option<f64>,
}

const PODS: u64 = 512;
const KEY_BLOCKS: u64 = 16;

/// A server process, killed when dropped.
struct Proc {
    child: Child,
    addr: SocketAddr,
    http: SocketAddr,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_ports() -> anyhow::Result<(SocketAddr, SocketAddr)> {
    let udp = UdpSocket::bind("127.0.0.1:0")?.local_addr()?;
    let tcp = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    Ok((udp, tcp))
}

/// Starts `prefix-server` on fresh ports with `dir` and `flags`.
fn spawn(dir: &Path, flags: &[&str]) -> anyhow::Result<Proc> {
    let bin = std::env::current_exe()?.with_file_name("prefix-server");
    if !bin.exists() {
        bail!(
            "{} not found: build it (cargo build --release)",
            bin.display()
        );
    }
    let (addr, http) = free_ports()?;
    let child = Command::new(&bin)
        .args(["--listen", &addr.to_string()])
        .args(["--metrics-listen", &http.to_string()])
        .arg("--data-dir")
        .arg(dir)
        .args(flags)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting prefix-server")?;
    Ok(Proc { child, addr, http })
}

/// The status line of `GET path`, if the server answers.
async fn status(http: SocketAddr, path: &str) -> Option<String> {
    let mut s = tokio::net::TcpStream::connect(http).await.ok()?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).await.ok()?;
    out.lines().next().map(str::to_owned)
}

/// Waits until `p` says it is ready; the time since `started`.
async fn ready(p: &Proc, started: Instant) -> anyhow::Result<Duration> {
    loop {
        if status(p.http, "/readyz")
            .await
            .is_some_and(|l| l.contains(" 200 "))
        {
            return Ok(started.elapsed());
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!("a server was not ready within 300 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// An index of about `entries` entries: keys of [`KEY_BLOCKS`] distinct
/// blocks, one pod each, round-robin over [`PODS`] pods.
fn build(entries: u64, now: u64) -> anyhow::Result<Index> {
    let index = Index::new(IndexConfig {
        max_blocks: entries.max(1 << 20) * 2,
        ..IndexConfig::default()
    });
    for k in 0..entries / KEY_BLOCKS {
        let key = crate::door::key(k, KEY_BLOCKS as usize);
        index.insert("m", &key, &format!("pod-{}", k % PODS), now)?;
    }
    Ok(index)
}

/// Entries the server at `addr` holds.
async fn entries(addr: SocketAddr, ca: &Path) -> anyhow::Result<u64> {
    let cfg = ClientConfig {
        tls: TlsConfig::from_files(ca, None, None)?,
        deadline: Duration::from_secs(10),
        ..ClientConfig::default()
    };
    let c = Client::connect(addr, cfg).await?;
    let n = c.stats().await?.entries;
    c.close().await;
    Ok(n)
}

/// Runs the plan and returns every start.
pub async fn run(plan: &Plan) -> anyhow::Result<Vec<Cell>> {
    let mut cells = Vec::new();
    for &size in &plan.sizes {
        let now = prefix_server::now_ms();
        let peer_dir = tempfile::tempdir()?;
        let index = build(size, now)?;
        let summary = prefix_server::snapshot::save(&index, peer_dir.path(), now)?;
        drop(index);
        let file = peer_dir.path().join(prefix_server::snapshot::FILE);
        let snapshot_bytes = std::fs::metadata(&file)?.len();
        // Every server of this size: pods capacity for all, the bound above
        // the size, its own snapshot never too old to start from.
        let room = [
            "--pod-capacity".to_string(),
            (size / PODS * 2 + 1024).to_string(),
            "--max-blocks".to_string(),
            (size.max(1 << 20) * 2).to_string(),
            "--bootstrap-max-age".to_string(),
            "1h".to_string(),
        ];
        let room: Vec<&str> = room.iter().map(String::as_str).collect();
        let peer = spawn(peer_dir.path(), &room)?;
        ready(&peer, Instant::now()).await?;
        let (cert, key) = (
            peer_dir.path().join("cert.pem"),
            peer_dir.path().join("key.pem"),
        );
        let want = entries(peer.addr, &cert).await?;
        eprintln!(
            "{size} entries asked: {want} served, {} (pod, node) records in a snapshot of {snapshot_bytes} bytes",
            summary.entries
        );
        let peer_addr = peer.addr.to_string();
        for round in 0..plan.rounds {
            let order: [&'static str; 2] = if round % 2 == 0 {
                ["own", "peer"]
            } else {
                ["peer", "own"]
            };
            for start in order {
                let dir = tempfile::tempdir()?;
                let mut flags = room.clone();
                flags.extend(["--snapshot-interval", "0s"]);
                let (c, k) = (cert.to_string_lossy(), key.to_string_lossy());
                if start == "own" {
                    std::fs::copy(&file, dir.path().join(prefix_server::snapshot::FILE))?;
                    // Snapshots on, so that it reads its own (never written:
                    // the process is killed).
                    flags.retain(|f| *f != "--snapshot-interval" && *f != "0s");
                } else {
                    flags.extend(["--peer", &peer_addr]);
                }
                flags.extend(["--cert", &c, "--key", &k]);
                let started = Instant::now();
                let p = spawn(dir.path(), &flags)?;
                let took = ready(&p, started).await?;
                let got = entries(p.addr, &cert).await?;
                if got != want {
                    bail!("a {start} start serves {got} entries, the peer {want}");
                }
                let resident_mib = crate::cpu::resident(p.child.id())
                    .ok()
                    .map(|b| b as f64 / (1 << 20) as f64);
                cells.push(Cell {
                    round,
                    entries: want,
                    snapshot_bytes,
                    start,
                    ready_ms: took.as_secs_f64() * 1e3,
                    resident_mib,
                });
            }
        }
    }
    Ok(cells)
}

/// Prints the starts, per size: each round's two times and their ratio.
pub fn print(cells: &[Cell]) {
    println!(
        "{:>12} {:>12} {:>6} {:>10} {:>10} {:>8} {:>10} {:>10}",
        "entries", "snapshot B", "round", "own ms", "peer ms", "peer/own", "own MiB", "peer MiB"
    );
    let mut sizes: Vec<u64> = cells.iter().map(|c| c.entries).collect();
    sizes.dedup();
    for size in sizes {
        let rounds = cells
            .iter()
            .filter(|c| c.entries == size)
            .map(|c| c.round)
            .max()
            .unwrap_or(0);
        for round in 0..=rounds {
            let get = |start| {
                cells
                    .iter()
                    .find(|c| c.entries == size && c.round == round && c.start == start)
            };
            if let (Some(own), Some(peer)) = (get("own"), get("peer")) {
                let mib = |c: &Cell| c.resident_mib.map_or("-".into(), |m| format!("{m:.0}"));
                println!(
                    "{:>12} {:>12} {:>6} {:>10.0} {:>10.0} {:>8.2} {:>10} {:>10}",
                    size,
                    own.snapshot_bytes,
                    round,
                    own.ready_ms,
                    peer.ready_ms,
                    peer.ready_ms / own.ready_ms,
                    mib(own),
                    mib(peer)
                );
            }
        }
    }
}
