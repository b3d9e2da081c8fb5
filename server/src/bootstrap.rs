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
//! A filling peer that holds nothing of its own (no snapshot, however old)
//! refuses with `Cold`. A round in which every peer says `Cold` ends the
//! asking at once: the whole set is new (a StatefulSet's pods started in
//! parallel), no peer will ever have more than this server, and waiting for
//! `--bootstrap-timeout` would only delay the set. A cold server among warm
//! ones still fills from them; a peer that falls back on its own old
//! snapshot says `Unavailable`, so the set waits for it to serve.
//!
//! Before the snapshot, the server asks the peer where its tail is, and
//! reads the tail from there (`follow`) while the snapshot comes and for
//! `--tail-window` after it turns ready: every write the peer applied after
//! that point is in the snapshot, in the tail, or both.
//!
//! While it fills, the server serves, through its [`Replica`](crate::replica::Replica) gate: pings,
//! stats and engine listings answer; lookups are refused `Unavailable`, which
//! a gateway's replica set takes as "ask another replica"; writes are held
//! (at most `--bootstrap-queue`, then refused `Unavailable`) and applied in
//! order right after the restore, before any write that comes later (held
//! writes are answered as accepted: `Done`, or `Removed(true)` for a
//! removal, whose outcome is not known yet). Engine
//! subscriptions start once the restore is done (their events find their
//! parents in the restored records), and only then does `/readyz` say ready.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prefix_client::{Client, ClientConfig, TlsConfig};
use prefix_index::Snapshot;
use prefix_proto::MAX_TAIL;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clock::now_ms;
use crate::engines::Engines;
use crate::handler::Handler;
use crate::metrics::Metrics;
use crate::replica::config::{split_peer, ReplicaConfig};
use crate::replica::{FillReport, Refusal};

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

impl FillError {
    /// Whether the peer said it is cold: filling itself, with nothing of
    /// its own to give.
    fn is_cold(&self) -> bool {
        matches!(self, FillError::Transfer(e) if e.code() == Some(prefix_proto::ErrorCode::Cold))
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
    /// Where the tail's follower runs: the server's tasks, which shutdown
    /// waits for.
    pub tasks: TaskTracker,
}

/// Fills the index from a peer (or, failing that, from the fallback), starts
/// the engines, applies the held writes and reports ready.
pub async fn fill(filling: Filling, target: Target, shutdown: CancellationToken) {
    let started = Instant::now();
    let deadline = tokio::time::Instant::now() + filling.cfg.timeout;
    target.metrics.bootstrapping.set(1);
    let Filling { cfg, tls, fallback } = filling;
    let mut refused = Vec::new();
    let mut restored = None;
    let mut all_cold = false;
    'rounds: for round in 0.. {
        if round > 0 && tokio::time::Instant::now() + cfg.retry >= deadline {
            break;
        }
        if round > 0 {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(cfg.retry) => {}
            }
        }
        let mut cold = 0;
        for peer in &cfg.peers {
            let attempt = tokio::select! {
                _ = shutdown.cancelled() => return,
                a = take(peer, &cfg, &tls, &target, deadline, &shutdown) => a,
            };
            match attempt {
                Ok(done) => {
                    restored = Some((peer.clone(), done));
                    break 'rounds;
                }
                Err(why) => {
                    cold += usize::from(why.is_cold());
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
        if cold == cfg.peers.len() {
            // Every peer is as new as this server: nothing to wait for.
            all_cold = true;
            break;
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
            match all_cold {
                true => tracing::info!(
                    peers = cfg.peers.len(),
                    restored_own = inserts,
                    "every peer is filling itself and holds nothing: the set is new; serving \
                     from this server's own snapshot, or empty"
                ),
                false => tracing::error!(
                    peers = cfg.peers.len(),
                    timeout = ?cfg.timeout,
                    restored_own = inserts,
                    "no peer gave a snapshot in time: serving from this server's own snapshot, \
                     or empty"
                ),
            }
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
        new_set: all_cold,
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
    target.handler.replica.set_report(report);
}

/// Takes `peer`'s snapshot (by `deadline`) and restores it: the entries
/// restored and the bytes taken, or why not (nothing is restored then). The
/// restore, once begun, runs to its end whatever the time: half of one would
/// leave the index neither empty nor the peer's.
///
/// Before the snapshot, it asks where the peer's tail is, and follows it
/// from there (`follow`) while the snapshot comes and for `--tail-window`
/// after this server turns ready; a peer that does not keep a tail (an
/// older version) is filled from all the same.
async fn take(
    peer: &str,
    cfg: &ReplicaConfig,
    tls: &TlsConfig,
    target: &Target,
    deadline: tokio::time::Instant,
    shutdown: &CancellationToken,
) -> Result<(u64, u64), FillError> {
    let handler = &target.handler;
    // Stopped whenever this attempt fails, wherever it fails: the next
    // peer's tail replaces it.
    let mut follower = Follower(None);
    let fetch = async {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let client = connect(peer, cfg, tls, left).await?;
        match client.tail(None, 0).await {
            Ok(w) => {
                let run = follow(
                    client.clone(),
                    w.next,
                    handler.clone(),
                    cfg.tail_window,
                    shutdown.clone(),
                );
                follower.0 = Some(target.tasks.spawn(run));
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "the peer keeps no tail: filling from its snapshot alone");
            }
        }
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let taken = client.snapshot(cfg.max_snapshot_bytes, left).await;
        // Closing waits for the peer to acknowledge (a few round trips):
        // not on the way to ready. The follower holds its own clone.
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
    // Restored: the follower goes on.
    follower.0 = None;
    Ok((inserts, size))
}

/// The task following a peer's tail for one attempt to fill from it:
/// aborted when dropped still holding it (the attempt failed).
struct Follower(Option<tokio::task::JoinHandle<()>>);

impl Drop for Follower {
    fn drop(&mut self) {
        if let Some(task) = self.0.take() {
            task.abort();
        }
    }
}

/// A client of `peer`, connected within `within` (and `--peer-connect-timeout`),
/// whose calls wait at most `--peer-connect-timeout` (a read of a tail or a
/// batch of lookups may carry thousands of entries).
pub(crate) async fn connect(
    peer: &str,
    cfg: &ReplicaConfig,
    tls: &TlsConfig,
    within: Duration,
) -> Result<Client, FillError> {
    let (host, port) =
        split_peer(peer).ok_or_else(|| FillError::Resolve("not host:port".into()))?;
    let addr: SocketAddr = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| FillError::Resolve(e.to_string()))?
        .next()
        .ok_or_else(|| FillError::Resolve("no address".into()))?;
    let client_cfg = ClientConfig {
        tls: tls.clone(),
        server_name: cfg.peer_server_name.as_deref().unwrap_or(host).into(),
        connect_timeout: within.min(cfg.connect_timeout),
        deadline: cfg.connect_timeout,
        ..ClientConfig::default()
    };
    Ok(Client::connect(addr, client_cfg).await?)
}

/// Pause between reads of a peer's tail that found it read to its end.
const TAIL_POLL: Duration = Duration::from_millis(100);

/// Follows a peer's tail from position `from`: each read's writes applied
/// through `handler` (held with the gateways' while this server fills),
/// until `window` after the server turns ready, or shutdown.
async fn follow(
    client: Client,
    mut from: u64,
    handler: Arc<Handler>,
    window: Duration,
    shutdown: CancellationToken,
) {
    let metrics = handler.metrics.clone();
    let mut opened = None;
    loop {
        let now = tokio::time::Instant::now();
        if opened.is_none() && !handler.replica.is_filling() {
            opened = Some(now);
        }
        if opened.is_some_and(|t| now >= t + window) {
            break;
        }
        let mut full = false;
        match client.tail(Some(from), MAX_TAIL).await {
            Ok(w) => {
                metrics.tail_lost.inc_by(w.from.saturating_sub(from));
                from = w.next;
                let n = w.ops.len() as u64;
                full = n == u64::from(MAX_TAIL);
                if n > 0 {
                    let h = handler.clone();
                    let refused = tokio::task::spawn_blocking(move || h.apply_tail(&w.ops))
                        .await
                        .unwrap_or(n);
                    metrics.tail_writes.inc_by(n - refused);
                    metrics.tail_lost.inc_by(refused);
                }
            }
            Err(e) => tracing::debug!(error = %e, "a read of the peer's tail failed; asking again"),
        }
        if !full {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(TAIL_POLL) => {}
            }
        }
    }
    client.close().await;
}
