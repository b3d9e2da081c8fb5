//! A cold replica filled from a live one.
//!
//! A server given `--peer`s that starts cold (no snapshot of its own, one it
//! cannot read, or one older than `--bootstrap-max-age`) asks its peers, in
//! the order given, for their snapshot: a snapshot request on the peer's QUIC
//! endpoint, presenting this server's own certificate, which the peer lists
//! under `--peer-identity` when it has roles. What comes back is the snapshot
//! file's format, so its checks (magic, version, checksum, references, end
//! counts) refuse a damaged or truncated transfer before anything is applied;
//! the server says why and asks the next peer. Rounds of asking repeat, a
//! second apart, for `--bootstrap-timeout`; after that the server starts from
//! its own snapshot, however old, or empty: replicas that all start at once
//! must not wait on each other forever.
//!
//! While it fills, the server serves, through its [`Replica`] gate: pings,
//! stats and engine listings answer; lookups are refused `Unavailable`, which
//! a gateway's replica set takes as "ask another replica"; writes are held
//! (at most `--bootstrap-queue`, then refused `Unavailable`) and applied in
//! order right after the restore, before any write that comes later (held
//! writes are answered as accepted: `Done`, or `Removed(true)` for a
//! removal, whose outcome is not known yet). Engine
//! subscriptions start once the restore is done (their events find their
//! parents in the restored records), and only then does `/readyz` say ready.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prefix_client::{Client, ClientConfig, TlsConfig};
use prefix_index::Snapshot;
use prefix_proto::{ErrorCode, Op, OpKind, Reply};
use tokio_util::sync::CancellationToken;

use crate::engines::Engines;
use crate::handler::{now_ms, Handler};
use crate::metrics::Metrics;

/// The other replicas, and how a cold start fills itself from them.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaConfig {
    /// The peers' QUIC addresses (`host:port`), asked in this order. Default
    /// none: the server never fills itself from another.
    pub peers: Vec<String>,
    /// CA the peers' certificates are checked against; none: `client_ca`,
    /// else the server's own certificate (replicas sharing one certificate).
    pub peer_ca: Option<PathBuf>,
    /// Name the peers' certificates must carry; none: each peer's host.
    pub peer_server_name: Option<String>,
    /// A snapshot of its own older than this is not started from while a
    /// peer can give a fresher one. Default 1 minute: two snapshot periods,
    /// so a server that merely restarted keeps its own, and one that was down
    /// longer than that fills from a peer that saw the writes it missed.
    pub max_age: Duration,
    /// How long filling may take in all: every connection, transfer and
    /// restore, over every peer asked. Default 60 s: long enough for a peer
    /// that restarts alongside to come up and for a transfer of the default
    /// bound's snapshot (about 150 MB, 1 to 2 s on loopback), short enough
    /// that a whole set restarting at once serves (from its own snapshots)
    /// within about a minute.
    pub timeout: Duration,
    /// Largest snapshot accepted from a peer. Default 4 GiB: the default
    /// index's bound (16.8 M entries) makes snapshots of about 150 MB.
    pub max_snapshot_bytes: u64,
    /// Writes held while filling, counted by weight (key blocks; 1,024 for
    /// a pod-table change, as `Op::weight`). Default 4,194,304: 32 MiB of
    /// block hashes, about ten seconds of a busy gateway fleet's inserts.
    pub queue: usize,
    /// How long sending one snapshot to a peer may take before the transfer
    /// is cut: it pins the index's memory (nothing retired meanwhile is
    /// freed) and holds the one transfer slot. Default 2 minutes: a 4 GiB
    /// snapshot at 150 MB/s takes half that.
    pub send_timeout: Duration,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            peers: Vec::new(),
            peer_ca: None,
            peer_server_name: None,
            max_age: Duration::from_secs(60),
            timeout: Duration::from_secs(60),
            max_snapshot_bytes: 4 << 30,
            queue: 4 << 20,
            send_timeout: Duration::from_secs(120),
        }
    }
}

/// The host and port of a `host:port` peer (`[v6]:port` too), if it is one.
pub fn split_peer(peer: &str) -> Option<(&str, u16)> {
    let (host, port) = peer.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = port.parse().ok()?;
    (!host.is_empty()).then_some((host, port))
}

/// Why a peer's snapshot was not restored.
#[derive(Debug, thiserror::Error)]
pub enum FillError {
    /// The peer's address does not resolve.
    #[error("cannot resolve: {0}")]
    Resolve(String),
    /// No connection.
    #[error(transparent)]
    Connect(#[from] prefix_client::ConnectError),
    /// The transfer failed or was refused by the peer.
    #[error(transparent)]
    Transfer(#[from] prefix_client::ClientError),
    /// What arrived is not a snapshot this build restores (damaged,
    /// truncated, another version).
    #[error("refused its snapshot: {0}")]
    Refused(#[from] prefix_index::SnapshotError),
    /// The restore's task failed.
    #[error("the restore failed: {0}")]
    Restore(String),
    /// `--bootstrap-timeout` ran out during this attempt.
    #[error("--bootstrap-timeout ran out")]
    OutOfTime,
}

/// A peer whose snapshot was not restored, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The peer, as configured.
    pub peer: String,
    /// What went wrong (a [`FillError`], in words).
    pub why: String,
}

/// How the server came to be filled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FillReport {
    /// The peer whose snapshot was restored; none when no peer gave one in
    /// time and the server started from its own snapshot or empty.
    pub from: Option<String>,
    /// Entries restored.
    pub inserts: u64,
    /// Bytes transferred from the peer.
    pub bytes: u64,
    /// From the start of filling to open.
    pub took: Duration,
    /// Every refused or failed attempt, in order.
    pub refused: Vec<Refusal>,
    /// Writes held meanwhile, then applied.
    pub held: u64,
}

/// This server as a replica: whether it is still filling from a peer (then
/// writes are held and lookups refused), and the one snapshot it may be
/// sending to a peer.
#[derive(Debug, Default)]
pub struct Replica {
    /// Set while filling; cleared once the held writes are applied.
    filling: AtomicBool,
    held: Mutex<Held>,
    /// Most weight held (see [`ReplicaConfig::queue`]).
    max_held: usize,
    /// Whether a snapshot is being sent.
    sending: AtomicBool,
    report: Mutex<Option<FillReport>>,
}

/// Writes held while filling.
#[derive(Debug, Default)]
struct Held {
    ops: Vec<Op>,
    /// Their weight (`Op::weight`), what `max_held` bounds.
    weight: usize,
}

/// Held writes applied in a round of their own while new ones may still
/// arrive; a round this small is applied with the gate's lock held, so no
/// new write can come after it and opening always ends.
const LAST_ROUND: usize = 1024;

/// Held while a snapshot is being sent: the next request is refused.
pub struct Sending(Arc<Replica>);

impl Drop for Sending {
    fn drop(&mut self) {
        // Release: pairs with the Acquire swap in `Replica::send`.
        self.0.sending.store(false, Ordering::Release);
    }
}

impl Replica {
    /// A replica that serves at once.
    pub fn serving() -> Arc<Replica> {
        Arc::default()
    }

    /// A replica that fills itself first, holding writes up to a weight of
    /// `max_held`.
    pub fn filling(max_held: usize) -> Arc<Replica> {
        Arc::new(Replica {
            filling: AtomicBool::new(true),
            max_held,
            ..Replica::default()
        })
    }

    /// Whether it is still filling.
    pub fn is_filling(&self) -> bool {
        // Acquire: pairs with the Release in `open`; a request that sees the
        // gate open also sees every held write applied.
        self.filling.load(Ordering::Acquire)
    }

    /// How the last fill went, once it is over.
    pub fn report(&self) -> Option<FillReport> {
        self.report.lock().clone()
    }

    /// What to answer `op` instead of applying it, while filling: writes are
    /// held (answered `Done`, or refused once the queue is full), lookups
    /// refused; `None` means apply it now.
    pub fn admit(&self, op: &Op, metrics: &Metrics) -> Option<Reply> {
        if !self.is_filling() {
            return None;
        }
        let kind = op.kind();
        if kind.writes() {
            let mut held = self.held.lock();
            // Relaxed: `open` clears the flag under this lock.
            if !self.filling.load(Ordering::Relaxed) {
                return None;
            }
            let weight = op.weight();
            if held.weight + weight > self.max_held {
                return Some(ErrorCode::Unavailable.reply(format!(
                    "this replica is filling itself from a peer and holds writes of weight {} \
                     already (--bootstrap-queue {})",
                    held.weight, self.max_held
                )));
            }
            held.weight += weight;
            held.ops.push(op.clone());
            metrics.bootstrap_held.inc();
            // Accepted, not yet applied: a removal cannot tell yet whether
            // the pod was there, and says it was.
            Some(match kind {
                OpKind::RemovePod | OpKind::Unsubscribe => Reply::Removed(true),
                _ => Reply::Done,
            })
        } else if kind == OpKind::Lookup {
            Some(
                ErrorCode::Unavailable
                    .reply("this replica is filling itself from a peer: ask another replica"),
            )
        } else {
            None
        }
    }

    /// Applies the held writes with `apply`, oldest first, then opens the
    /// gate; returns how many there were. Writes that arrive meanwhile are
    /// held too and applied in a later round, so they keep their order; the
    /// last round, at most [`LAST_ROUND`] writes, is applied under the lock,
    /// so a steady stream of writes cannot keep the gate closed.
    pub fn open(&self, mut apply: impl FnMut(Vec<Op>)) -> u64 {
        let mut applied = 0;
        loop {
            let mut held = self.held.lock();
            let batch = std::mem::take(&mut *held).ops;
            applied += batch.len() as u64;
            if batch.len() <= LAST_ROUND {
                if !batch.is_empty() {
                    apply(batch);
                }
                // Release: see `is_filling`. Under the lock, so `admit`
                // never holds a write after the last round.
                self.filling.store(false, Ordering::Release);
                return applied;
            }
            drop(held);
            apply(batch);
        }
    }

    /// Starts sending a snapshot, unless one is being sent or the server is
    /// still filling (it has none to give yet): the refusal then.
    pub fn send(self: &Arc<Self>) -> Result<Sending, Reply> {
        if self.is_filling() {
            return Err(ErrorCode::Unavailable.reply(
                "this replica is filling itself from a peer: it has no snapshot to give yet",
            ));
        }
        // Acquire: pairs with the Release in `Sending::drop`.
        if self.sending.swap(true, Ordering::Acquire) {
            return Err(ErrorCode::Unavailable.reply(
                "this replica is sending its snapshot to another peer: ask again, or ask another",
            ));
        }
        Ok(Sending(self.clone()))
    }
}

/// What a cold start has to fill itself.
pub struct Filling {
    /// The peers and limits.
    pub cfg: ReplicaConfig,
    /// What to trust in the peers and present to them.
    pub tls: TlsConfig,
    /// The server's own snapshot, too old to start from while a peer can
    /// give a fresher one; restored if none can.
    pub fallback: Option<Snapshot>,
}

/// What filling works on.
pub struct Target {
    /// Applies the held writes (and holds the index and the gate).
    pub handler: Arc<Handler>,
    /// Started once the index is filled.
    pub engines: Arc<Engines>,
    /// Where failures are counted.
    pub metrics: Arc<Metrics>,
    /// Set once the gate is open (and the server not shutting down).
    pub ready: Arc<AtomicBool>,
}

/// Pause between rounds of asking every peer.
const ROUND_PAUSE: Duration = Duration::from_secs(1);

/// Most time one connection attempt to a peer may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Fills the index from a peer (or, failing that, from the fallback), starts
/// the engines, applies the held writes and reports ready.
pub async fn fill(filling: Filling, target: Target, shutdown: CancellationToken) {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + filling.cfg.timeout;
    target.metrics.bootstrapping.set(1);
    let Filling { cfg, tls, fallback } = filling;
    let mut refused = Vec::new();
    let mut restored = None;
    'rounds: for round in 0.. {
        if round > 0 && tokio::time::Instant::now() + ROUND_PAUSE >= deadline {
            break;
        }
        if round > 0 {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(ROUND_PAUSE) => {}
            }
        }
        for peer in &cfg.peers {
            let attempt = tokio::select! {
                _ = shutdown.cancelled() => return,
                a = take(peer, &cfg, &tls, &target.handler, deadline) => a,
            };
            match attempt {
                Ok(done) => {
                    restored = Some((peer.clone(), done));
                    break 'rounds;
                }
                Err(why) => {
                    target.metrics.bootstrap_failures.inc();
                    tracing::warn!(%peer, %why, "no snapshot from this peer; asking the next");
                    refused.push(Refusal {
                        peer: peer.clone(),
                        why: why.to_string(),
                    });
                }
            }
            if tokio::time::Instant::now() >= deadline {
                break 'rounds;
            }
        }
    }
    let (from, inserts, bytes) = match restored {
        Some((peer, (inserts, bytes))) => {
            tracing::info!(%peer, inserts, bytes, "restored a peer's snapshot");
            (Some(peer), inserts, bytes)
        }
        None => {
            let inserts = match fallback {
                Some(snap) => {
                    let index = target.handler.index.clone();
                    let restore = move || snap.restore(&index, now_ms()).inserts;
                    tokio::task::spawn_blocking(restore).await.unwrap_or(0)
                }
                None => 0,
            };
            tracing::error!(
                peers = cfg.peers.len(),
                timeout = ?cfg.timeout,
                restored_own = inserts,
                "no peer gave a snapshot in time: serving from this server's own snapshot, or empty"
            );
            (None, inserts, 0)
        }
    };
    // Engines before the held writes: their subscriptions may be among
    // them, and their events need the restored records.
    let engines = target.engines.start();
    let handler = target.handler.clone();
    let held = tokio::task::spawn_blocking(move || {
        let gate = handler.replica.clone();
        gate.open(|ops| handler.apply_held(ops))
    })
    .await
    .unwrap_or(0);
    let report = FillReport {
        from,
        inserts,
        bytes,
        took: started.elapsed(),
        refused,
        held,
    };
    target.metrics.bootstrapping.set(0);
    match engines {
        Ok(()) => {
            tracing::info!(held, took = ?report.took, "filled; ready");
            // Relaxed: see `http::readyz` (which also says not ready once
            // shutdown has begun).
            target.ready.store(true, Ordering::Relaxed);
        }
        // As at a start without peers, where this stops the server: the
        // index serves, but the server never says it is ready.
        Err(e) => tracing::error!(
            error = %e,
            "the engine subscriptions could not start: serving, but not ready"
        ),
    }
    *target.handler.replica.report.lock() = Some(report);
}

/// Takes `peer`'s snapshot (by `deadline`) and restores it: the entries
/// restored and the bytes taken, or why not (nothing is restored then). The
/// restore, once begun, runs to its end whatever the time: half of one would
/// leave the index neither empty nor the peer's.
async fn take(
    peer: &str,
    cfg: &ReplicaConfig,
    tls: &TlsConfig,
    handler: &Arc<Handler>,
    deadline: tokio::time::Instant,
) -> Result<(u64, u64), FillError> {
    let fetch = async {
        let (host, port) =
            split_peer(peer).ok_or_else(|| FillError::Resolve("not host:port".into()))?;
        let addr: SocketAddr = tokio::net::lookup_host((host, port))
            .await
            .map_err(|e| FillError::Resolve(e.to_string()))?
            .next()
            .ok_or_else(|| FillError::Resolve("no address".into()))?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let client_cfg = ClientConfig {
            tls: tls.clone(),
            server_name: cfg.peer_server_name.as_deref().unwrap_or(host).into(),
            connect_timeout: left.min(CONNECT_TIMEOUT),
            ..ClientConfig::default()
        };
        let client = Client::connect(addr, client_cfg).await?;
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let taken = client.snapshot(cfg.max_snapshot_bytes, left).await;
        // Closing waits for the peer to acknowledge (a few round trips): not
        // on the way to ready.
        tokio::spawn(async move { client.close().await });
        Ok::<_, FillError>(taken?)
    };
    let bytes = tokio::time::timeout_at(deadline, fetch)
        .await
        .map_err(|_| FillError::OutOfTime)??;
    let size = bytes.len() as u64;
    let index = handler.index.clone();
    let restore = move || {
        // Checked whole before anything is applied: a damaged transfer
        // leaves the index as it was.
        let snap = Snapshot::parse(&bytes)?;
        drop(bytes);
        Ok::<_, FillError>(snap.restore(&index, now_ms()).inserts)
    };
    let inserts = tokio::task::spawn_blocking(restore)
        .await
        .map_err(|e| FillError::Restore(e.to_string()))??;
    Ok((inserts, size))
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_proto::message::POD_TABLE_WEIGHT;

    fn insert(n: u64) -> Op {
        Op::Insert {
            model: "m".into(),
            key: vec![n],
            pod: "p".into(),
        }
    }

    #[test]
    fn peers_are_host_and_port() {
        assert_eq!(
            split_peer("index-1.index:7070"),
            Some(("index-1.index", 7070))
        );
        assert_eq!(split_peer("[::1]:7070"), Some(("::1", 7070)));
        for bad in ["index-1", ":7070", "h:port", "h:70700"] {
            assert_eq!(split_peer(bad), None, "{bad}");
        }
    }

    #[test]
    fn while_filling_writes_are_held_in_order_and_lookups_refused() {
        let m = Metrics::default();
        let n = LAST_ROUND as u64 + 100;
        // Room for `n` one-block inserts and one pod-table change.
        let gate = Replica::filling(n as usize + POD_TABLE_WEIGHT);
        let lookup = Op::Lookup {
            model: "m".into(),
            key: vec![1],
            candidates: None,
        };
        let refused = |r: Option<Reply>| matches!(r, Some(Reply::Error { code, .. }) if code == ErrorCode::Unavailable as u16);
        assert!(refused(gate.admit(&lookup, &m)));
        assert_eq!(gate.admit(&Op::Ping, &m), None);
        for k in 0..n {
            assert_eq!(gate.admit(&insert(k), &m), Some(Reply::Done));
        }
        let remove = Op::RemovePod { pod: "p".into() };
        assert_eq!(gate.admit(&remove, &m), Some(Reply::Removed(true)));
        // The queue is full by weight: one more block is refused, not held.
        assert!(refused(gate.admit(&insert(n), &m)));
        assert!(refused(gate.send().err()));
        let mut rounds = Vec::new();
        let applied = gate.open(|ops| {
            // A write that arrives while a round is applied (outside the
            // lock: the round is large) is held and applied after it.
            if rounds.is_empty() {
                assert_eq!(gate.admit(&insert(n + 1), &m), Some(Reply::Done));
            }
            rounds.push(ops);
        });
        let mut want: Vec<Op> = (0..n).map(insert).collect();
        want.push(remove);
        assert_eq!(rounds[0], want);
        assert_eq!(rounds[1..], [vec![insert(n + 1)]]);
        assert_eq!(applied, n + 2);
        assert!(!gate.is_filling());
        assert_eq!(gate.admit(&insert(5), &m), None);
        assert_eq!(gate.admit(&lookup, &m), None);
    }

    #[test]
    fn one_snapshot_is_sent_at_a_time() {
        let gate = Replica::serving();
        let sending = gate.send().unwrap();
        assert!(gate.send().is_err());
        drop(sending);
        assert!(gate.send().is_ok());
    }
}
