//! [`Cluster`]: several servers, each model placed on `R` of them (its
//! replica set) by rendezvous (highest-random-weight) hashing of the model
//! name.
//!
//! Every gateway computes the same placement from the same server list, with
//! no coordination: a model's replicas are the `R` servers whose
//! `xxh3(name ‖ 0 ‖ model)` are highest. Adding or removing one server moves
//! only the replicas it wins or held (about `R/n` of the models lose or gain
//! one replica). The index is soft state, so a moved replica simply starts
//! cold (or, in precise mode, follows its engines).
//!
//! With `R > 1` there is no single point of failure and no consensus:
//! replicas that see the same writes converge on their own.
//! - **Writes** (insert) go to every replica through a bounded queue per
//!   server, drained by one writer task that batches what has queued up; a
//!   call returns with the first replica's answer, never waiting for the
//!   slowest. A full queue drops that replica's copy of the write (counted
//!   in [`ReplicaStats::dropped`]): a replica that misses writes only routes
//!   a little worse. Pod removals and capacities go to every server.
//! - **Lookups** go to one replica: this gateway's preferred one (the replica
//!   set rotated by a per-gateway seed, so the reads of many gateways divide
//!   evenly), failing over at once to the next when it is disconnected, and
//!   hedged to the next when it has not answered within the hedge delay, all
//!   within the call's deadline.
//!
//! With `R = 1` this is sharding by model: the placement above, a server
//! down fails the calls for its models.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use xxhash_rust::xxh3::xxh3_64;

use crate::client::{Client, ClientConfig, ServerAddr};
use crate::error::{ClientError, ConnectError};
use crate::index::{Index, Route};
use crate::wire::{ErrorCode, Op, OpKind, Reply, MAX_SAMPLE};

mod answers;
mod health;
mod placement;
mod writer;

use answers::{joined, merge, sample};
use health::{as_reply, fails_over, mark_suspect, millis_since};
pub use placement::{place, replicas};
use writer::{writer, Write};

/// How a cluster replicates models.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replication {
    /// Servers per model (`R`). Default 1 (sharding, no replicas); at most
    /// the number of servers.
    pub replicas: usize,
    /// Writes waiting per server; past it a server's copy of a write is
    /// dropped and counted. Default 4,096.
    pub queue: usize,
    /// This gateway's seed for its preferred replica of each model: gateways
    /// with different seeds spread their reads over the replica set.
    /// Default: random per process.
    pub seed: u64,
    /// How long a lookup waits for its preferred replica before asking the
    /// next one too (a hedged request). Default: half the call's deadline.
    pub hedge_after: Option<Duration>,
    /// How long a replica that failed or was outrun by a hedge is read
    /// last. Default 1 s: a dead replica costs one hedge delay per second
    /// (it is suspect for every model it holds), not one per lookup.
    pub suspect_for: Duration,
    /// How long a writer's batch may take before it counts as failed.
    /// Default 1 s: writes are off the gateway's request path, and a batch
    /// of long keys runs on the server's blocking pool.
    pub write_deadline: Duration,
}

impl Default for Replication {
    fn default() -> Self {
        Replication {
            replicas: 1,
            queue: 4096,
            seed: random_seed(),
            hedge_after: None,
            suspect_for: Duration::from_secs(1),
            write_deadline: Duration::from_secs(1),
        }
    }
}

/// A seed that differs between processes and between calls.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // std's RandomState is seeded from the OS once per process, then
    // incremented per instance.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(u64::from(std::process::id()));
    h.finish()
}

/// One server's replication counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicaStats {
    /// The server's name.
    pub name: String,
    /// Whether its connection is up.
    pub connected: bool,
    /// Writes queued for it so far.
    pub queued: u64,
    /// Writes it answered (an error answer included).
    pub applied: u64,
    /// Writes dropped because its queue was full.
    pub dropped: u64,
    /// Writes whose batch failed as a whole (timeout, disconnection, a
    /// refusal of the whole batch, a writer gone).
    pub failed: u64,
}

#[derive(Debug, Default)]
struct Counters {
    queued: AtomicU64,
    applied: AtomicU64,
    dropped: AtomicU64,
    failed: AtomicU64,
    /// Until when (milliseconds since the cluster's epoch) the server is
    /// read last.
    suspect_until: AtomicU64,
}

#[derive(Debug)]
struct Member {
    name: String,
    client: Client,
    writes: mpsc::Sender<Write>,
    counters: Arc<Counters>,
}

/// A set of servers sharing the models between them, each model on its
/// replica set. Its operations (`lookup`, `insert`, ...) are [`Index`]'s;
/// where each goes is [`ReplicaSets`]'.
pub type Cluster = Index<ReplicaSets>;

/// A [`Cluster`]'s route: each operation to the servers it concerns.
///
/// - `lookup`: one replica of the model, failing over (the module's docs).
/// - `insert`: every replica of the model, through the write queues.
/// - `subscribe_engine`: every replica of the subscription's model, each
///   following the engine itself.
/// - `remove_pod`, `set_pod_capacity`, `unsubscribe_engine`: every server
///   (a pod may hold blocks of several models); removed if any removed.
/// - `ping`: every server. `stats`: summed over every server (pods counted
///   once per server, a model once per replica).
/// - `list_engines`: every server's engines, in the servers' order (an
///   engine followed by each replica of its model is listed once per
///   replica; call it on [`Cluster::servers`]' clients to tell them apart).
/// - `sample_keys`: up to `count` (at most [`MAX_SAMPLE`]) distinct keys,
///   taken from every server's sample in turn.
///
/// A call to several servers asks them at once and fails with the first
/// failure (the others have still applied it).
#[derive(Clone)]
pub struct ReplicaSets {
    servers: Arc<Vec<Member>>,
    names: Arc<Vec<String>>,
    replication: Replication,
    /// What suspicion times count from.
    epoch: Instant,
}

impl std::fmt::Debug for ReplicaSets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("servers", &self.servers)
            .field("replication", &self.replication)
            .finish()
    }
}

impl Cluster {
    /// Starts a client per server, sharding models (`R = 1`). `servers`
    /// pairs a stable name (the placement key, e.g. a StatefulSet pod's DNS
    /// name) with its address: a `std::net::SocketAddr`, or a `host:port` name
    /// (anything into [`ServerAddr`]) resolved again before every
    /// reconnection, so a pod restarted at a new IP is found. Connections are
    /// made in the background, so a server that is down at start only fails
    /// the calls for its models.
    pub fn start<A: Into<ServerAddr> + Clone>(
        servers: &[(String, A)],
        cfg: ClientConfig,
    ) -> Result<Cluster, ConnectError> {
        Cluster::start_replicated(servers, Replication::default(), cfg)
    }

    /// As [`Cluster::start`], each model on `replication.replicas` servers.
    pub fn start_replicated<A: Into<ServerAddr> + Clone>(
        servers: &[(String, A)],
        replication: Replication,
        cfg: ClientConfig,
    ) -> Result<Cluster, ConnectError> {
        let clients = servers
            .iter()
            .map(|(name, addr)| Ok((name.clone(), Client::start(addr.clone(), cfg.clone())?)))
            .collect::<Result<Vec<_>, ConnectError>>()?;
        Cluster::assemble(clients, replication)
    }

    /// As [`Cluster::start`], then waits (up to `connect_timeout`) until every
    /// server is connected; fails with the first server that is not.
    pub async fn connect<A: Into<ServerAddr> + Clone>(
        servers: &[(String, A)],
        cfg: ClientConfig,
    ) -> Result<Cluster, ConnectError> {
        Cluster::connect_replicated(servers, Replication::default(), cfg).await
    }

    /// As [`Cluster::start_replicated`], waiting until every server is
    /// connected.
    pub async fn connect_replicated<A: Into<ServerAddr> + Clone>(
        servers: &[(String, A)],
        replication: Replication,
        cfg: ClientConfig,
    ) -> Result<Cluster, ConnectError> {
        let mut clients = Vec::with_capacity(servers.len());
        for (name, addr) in servers {
            clients.push((
                name.clone(),
                Client::connect(addr.clone(), cfg.clone()).await?,
            ));
        }
        Cluster::assemble(clients, replication)
    }

    fn assemble(
        clients: Vec<(String, Client)>,
        replication: Replication,
    ) -> Result<Cluster, ConnectError> {
        if clients.is_empty() {
            return Err(ConnectError::NoServers);
        }
        if replication.replicas == 0 || replication.replicas > clients.len() {
            return Err(ConnectError::Replicas {
                replicas: replication.replicas,
                servers: clients.len(),
            });
        }
        let names = clients.iter().map(|(n, _)| n.clone()).collect();
        let epoch = Instant::now();
        let suspect_for = replication.suspect_for;
        let servers = clients
            .into_iter()
            .map(|(name, client)| {
                let (tx, rx) = mpsc::channel(replication.queue.max(1));
                let counters = Arc::<Counters>::default();
                let suspect = move |c: &Counters| mark_suspect(c, epoch, suspect_for);
                let writes = client.with_deadline(replication.write_deadline);
                tokio::spawn(writer(writes, rx, counters.clone(), suspect));
                Member {
                    name,
                    client,
                    writes: tx,
                    counters,
                }
            })
            .collect();
        Ok(Index::new(ReplicaSets {
            servers: Arc::new(servers),
            names: Arc::new(names),
            replication,
            epoch,
        }))
    }

    /// The client of the server that holds `model` (its first replica).
    pub fn server_for(&self, model: &str) -> &Client {
        let r = &self.route;
        // `assemble` keeps the list non-empty: `replicas` finds one.
        &r.servers[r.replica_set(model)[0]].client
    }

    /// The names of `model`'s replicas, highest ranked first.
    pub fn replicas_of(&self, model: &str) -> Vec<&str> {
        self.route.names_of(self.route.replica_set(model))
    }

    /// The names of `model`'s replicas in this gateway's order for reads:
    /// its preferred one first (the set rotated by its seed), replicas
    /// suspected of being down last.
    pub fn read_order_of(&self, model: &str) -> Vec<&str> {
        self.route.names_of(self.route.read_order(model))
    }

    /// The servers, by name.
    pub fn servers(&self) -> impl Iterator<Item = (&str, &Client)> {
        let r = &self.route;
        r.servers.iter().map(|s| (s.name.as_str(), &s.client))
    }

    /// Each server's replication counters.
    pub fn replica_stats(&self) -> Vec<ReplicaStats> {
        // Relaxed: counters, read for reports only.
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        self.route
            .servers
            .iter()
            .map(|s| ReplicaStats {
                name: s.name.clone(),
                connected: s.client.is_connected(),
                queued: get(&s.counters.queued),
                applied: get(&s.counters.applied),
                dropped: get(&s.counters.dropped),
                failed: get(&s.counters.failed),
            })
            .collect()
    }

    /// Every server's snapshot ([`Client::snapshot`]), by name, taken at
    /// once within `timeout`: a snapshot is one server's whole index, so a
    /// cluster's is one per server. Fails with the first server that fails.
    pub async fn snapshot(
        &self,
        max_bytes: u64,
        timeout: Duration,
    ) -> Result<Vec<(String, Vec<u8>)>, ClientError> {
        let mut calls = tokio::task::JoinSet::new();
        for (i, s) in self.route.servers.iter().enumerate() {
            let client = s.client.clone();
            calls.spawn(async move { (i, client.snapshot(max_bytes, timeout).await) });
        }
        let got = joined(calls, self.route.servers.len()).await?;
        let names = self.route.names.iter().cloned();
        Ok(names.zip(got).collect())
    }
}

impl ReplicaSets {
    fn suspect(&self, server: usize) {
        mark_suspect(
            &self.servers[server].counters,
            self.epoch,
            self.replication.suspect_for,
        );
    }

    fn is_suspect(&self, server: usize) -> bool {
        // Relaxed: a hint for ordering reads; a stale value costs at most
        // one hedge delay.
        let until = self.servers[server]
            .counters
            .suspect_until
            .load(Ordering::Relaxed);
        until > millis_since(self.epoch)
    }

    /// The names of the servers at `indexes` of the server list, in order.
    fn names_of(&self, indexes: Vec<usize>) -> Vec<&str> {
        indexes
            .into_iter()
            .map(|i| self.names[i].as_str())
            .collect()
    }

    /// The replica set of `model`: indexes into the server list, highest
    /// ranked first.
    fn replica_set(&self, model: &str) -> Vec<usize> {
        replicas(model, &self.names, self.replication.replicas)
    }

    /// The replica set in this gateway's order of preference for reads:
    /// rotated by the seed, suspect replicas last.
    fn read_order(&self, model: &str) -> Vec<usize> {
        let mut set = self.replica_set(model);
        let mut buf = self.replication.seed.to_le_bytes().to_vec();
        buf.extend_from_slice(model.as_bytes());
        let first = (xxh3_64(&buf) % set.len().max(1) as u64) as usize;
        set.rotate_left(first);
        // Stable: the healthy keep their order, then the suspect theirs
        // (each read once: the clock moves during the sort).
        set.sort_by_cached_key(|&s| self.is_suspect(s));
        set
    }

    /// A lookup on one of the model's replicas: this gateway's preferred
    /// one, or the next when it is down or slow, within the call's deadline.
    async fn read(&self, op: Op) -> Result<Reply, ClientError> {
        let Some(lookup) = op.as_lookup() else {
            return Err(ClientError::Protocol(format!("{op:?} is not a lookup")));
        };
        let order = self.read_order(lookup.model);
        let deadline = self.servers[order[0]].client.deadline();
        let started = Instant::now();
        let hedge = self.replication.hedge_after.unwrap_or(deadline / 2);
        let left = || deadline.saturating_sub(started.elapsed());
        let mut last = None;
        let mut i = 0;
        while i < order.len() {
            let client = &self.servers[order[i]].client;
            if left().is_zero() {
                break;
            }
            // A disconnected replica fails at once: no reason to wait.
            let first = client.with_deadline(left());
            let attempt = first.route().one(op.clone());
            let Some(&next) = order.get(i + 1) else {
                let r = attempt.await;
                if let Err(e) = &r {
                    if fails_over(e) {
                        self.suspect(order[i]);
                    }
                }
                return r;
            };
            tokio::pin!(attempt);
            let outcome = tokio::select! {
                r = &mut attempt => Some(r),
                _ = tokio::time::sleep(hedge) => None,
            };
            match outcome {
                Some(Ok(r)) => return Ok(r),
                Some(Err(e)) if fails_over(&e) => {
                    self.suspect(order[i]);
                    last = Some(e);
                    i += 1;
                }
                Some(Err(e)) => return Err(e),
                // Slow, and no time left to ask another: wait for it.
                None if left().is_zero() => return attempt.await,
                // Slow: ask the next replica too; the first answer wins.
                None => {
                    let second = self.servers[next].client.with_deadline(left());
                    let hedged = second.route().one(op.clone());
                    tokio::pin!(hedged);
                    let (r, other) = tokio::select! {
                        r = &mut attempt => (r, 0),
                        r = &mut hedged => (r, 1),
                    };
                    let (first_server, other_server) = if other == 0 {
                        (order[i], next)
                    } else {
                        (next, order[i])
                    };
                    match r {
                        Ok(found) => {
                            if other == 1 {
                                // Outrun by the hedge: read it last a while.
                                self.suspect(order[i]);
                            }
                            return Ok(found);
                        }
                        Err(e) if !fails_over(&e) => return Err(e),
                        Err(_) => {
                            self.suspect(first_server);
                            // The other one's answer (or failure) decides.
                            let r = if other == 0 {
                                hedged.await
                            } else {
                                attempt.await
                            };
                            match r {
                                Ok(found) => return Ok(found),
                                Err(e) if !fails_over(&e) => return Err(e),
                                Err(e) => {
                                    self.suspect(other_server);
                                    last = Some(e);
                                }
                            }
                            i += 2;
                        }
                    }
                }
            }
        }
        Err(last.unwrap_or(ClientError::Timeout(deadline)))
    }

    /// Queues `op` (which names a model) for each of its replicas and waits,
    /// within the deadline, for the first answer that is not a transport
    /// failure.
    async fn write(&self, op: Op) -> Result<Reply, ClientError> {
        let model = match &op {
            Op::Insert { model, .. } | Op::Lookup { model, .. } => model.clone(),
            Op::Subscribe(sub) => sub.model.clone(),
            Op::Receipt(r) => r.model.clone(),
            other => return Err(ClientError::Protocol(format!("{other:?} names no model"))),
        };
        let set = self.replica_set(&model);
        let deadline = self.servers[set[0]].client.deadline();
        self.servers[set[0]].client.check(&op)?;
        let (tx, mut rx) = mpsc::channel(set.len());
        let mut sent = 0;
        for &s in &set {
            let server = &self.servers[s];
            let write = Write {
                op: op.clone(),
                answer: tx.clone(),
            };
            // Relaxed: counters, read for reports only.
            match server.writes.try_send(write) {
                Ok(()) => {
                    server.counters.queued.fetch_add(1, Ordering::Relaxed);
                    sent += 1;
                }
                Err(mpsc::error::TrySendError::Full(_)) => {
                    server.counters.dropped.fetch_add(1, Ordering::Relaxed);
                }
                // The writer is gone (it only ends with the cluster, or
                // if it panicked): nothing will reach this server.
                Err(mpsc::error::TrySendError::Closed(_)) => {
                    server.counters.failed.fetch_add(1, Ordering::Relaxed);
                    self.suspect(s);
                }
            }
        }
        drop(tx);
        if sent == 0 {
            return Err(ClientError::Server {
                code: ErrorCode::Unavailable as u16,
                message: "every replica's write queue is full".into(),
            });
        }
        let mut last = None;
        let wait = async {
            while let Some(r) = rx.recv().await {
                match r {
                    Ok(reply) => return Ok(reply),
                    Err(e) => last = Some(e),
                }
            }
            Err(())
        };
        // A queue that is slow to drain is not waited for past twice the
        // call's deadline; the write stays queued and may still be applied.
        match tokio::time::timeout(deadline.saturating_mul(2), wait).await {
            Ok(Ok(reply)) => Ok(reply),
            Ok(Err(())) => Err(last.unwrap_or(ClientError::Timeout(deadline))),
            Err(_) => Err(ClientError::Timeout(deadline)),
        }
    }

    /// Follows an engine on every replica of its model (precise mode: each
    /// replica subscribes to the engine itself), one after the other; the
    /// first failure, once all were asked.
    async fn subscribe(&self, op: Op) -> Result<Reply, ClientError> {
        let Op::Subscribe(sub) = &op else {
            return Err(ClientError::Protocol(format!("{op:?} is not a subscribe")));
        };
        let mut first_err = None;
        for s in self.replica_set(&sub.model) {
            if let Err(e) = self.servers[s].client.route().one(op.clone()).await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(Reply::Done), Err)
    }

    /// `op` on every server at once; their replies in the servers' order,
    /// or the first failure (the others have still applied it).
    async fn everywhere(&self, op: &Op) -> Result<Vec<Reply>, ClientError> {
        let mut calls = tokio::task::JoinSet::new();
        for (i, s) in self.servers.iter().enumerate() {
            let (client, op) = (s.client.clone(), op.clone());
            calls.spawn(async move { (i, client.route().one(op).await) });
        }
        joined(calls, self.servers.len()).await
    }

    /// Lookups, inserts and receipts in one call, answered in the order of
    /// `ops`: lookups grouped into one batch per preferred replica (a group
    /// whose replica is down or slow is asked again one lookup at a time,
    /// with a lookup's failover), inserts and receipts written to every
    /// replica as an insert is. An op that fails gets its error in its
    /// place. Ops run concurrently, not in order: a lookup does not see an
    /// insert of the same batch. Ops without a model (pod removal,
    /// capacity, stats, ping) are refused here: they concern every server,
    /// so use the dedicated calls.
    async fn grouped(&self, ops: Vec<Op>) -> Result<Vec<Reply>, ClientError> {
        let mut groups: Vec<(Vec<usize>, Vec<Op>)> = vec![Default::default(); self.servers.len()];
        let mut calls = tokio::task::JoinSet::new();
        let total = ops.len();
        let mut inserts = Vec::new();
        for (i, op) in ops.into_iter().enumerate() {
            match &op {
                Op::Lookup { model, .. }
                | Op::LookupDetail { model, .. }
                | Op::LookupTiers { model, .. } => {
                    let s = self.read_order(model)[0];
                    groups[s].0.push(i);
                    groups[s].1.push(op);
                }
                Op::Insert { .. } | Op::Receipt(_) => inserts.push((i, op)),
                other => {
                    return Err(ClientError::Protocol(format!(
                        "a cluster batch carries only lookups, inserts and receipts, not {other:?}"
                    )))
                }
            }
        }
        for (i, op) in inserts {
            let me = self.clone();
            calls.spawn(async move {
                let reply = me.write(op).await.unwrap_or_else(|e| as_reply(&e));
                vec![(i, reply)]
            });
        }
        for (s, (slots, ops)) in groups.into_iter().enumerate() {
            if slots.is_empty() {
                continue;
            }
            let me = self.clone();
            calls.spawn(async move {
                let client = me.servers[s].client.clone();
                match client.batch(ops.clone()).await {
                    Ok(replies) => slots.into_iter().zip(replies).collect(),
                    Err(e) if fails_over(&e) => {
                        me.suspect(s);
                        let mut out = Vec::with_capacity(slots.len());
                        for (slot, op) in slots.into_iter().zip(ops) {
                            let reply = me.read(op).await.unwrap_or_else(|e| as_reply(&e));
                            out.push((slot, reply));
                        }
                        out
                    }
                    Err(e) => {
                        let reply = as_reply(&e);
                        slots
                            .into_iter()
                            .map(|slot| (slot, reply.clone()))
                            .collect()
                    }
                }
            });
        }
        // Every task runs to its end: a failure is a reply in its place.
        let mut replies: Vec<Option<Reply>> = vec![None; total];
        while let Some(joined) = calls.join_next().await {
            let done =
                joined.map_err(|e| ClientError::Protocol(format!("batch task failed: {e}")))?;
            for (slot, reply) in done {
                replies[slot] = Some(reply);
            }
        }
        replies
            .into_iter()
            .map(|r| r.ok_or_else(|| ClientError::Protocol("missing batch reply".into())))
            .collect()
    }
}

impl Route for ReplicaSets {
    /// `op` to the servers it concerns (see the type's docs).
    async fn one(&self, op: Op) -> Result<Reply, ClientError> {
        match op.kind() {
            OpKind::Lookup | OpKind::LookupDetail | OpKind::LookupTiers => self.read(op).await,
            // A receipt goes where the model's inserts go: each replica of
            // its set judges the pod from the same evidence.
            OpKind::Insert | OpKind::Receipt => match self.write(op).await? {
                Reply::Error { code, message } => Err(ClientError::Server { code, message }),
                reply => Ok(reply),
            },
            OpKind::Subscribe => self.subscribe(op).await,
            OpKind::SampleKeys => {
                let Op::SampleKeys { count, .. } = op else {
                    unreachable!("the kind is SampleKeys")
                };
                let replies = self.everywhere(&op).await?;
                Ok(Reply::Keys(sample(
                    replies,
                    count.min(MAX_SAMPLE) as usize,
                )?))
            }
            // Positions in one server's writes: nothing to merge.
            OpKind::Tail => Ok(crate::wire::ErrorCode::Unsupported
                .reply("a tail's positions are one server's: ask that server's own client")),
            // Digests are one server's content, compared server by server.
            OpKind::Digest => Ok(crate::wire::ErrorCode::Unsupported
                .reply("a digest is one server's: ask that server's own client")),
            OpKind::RemovePod
            | OpKind::SetPodCapacity
            | OpKind::Unsubscribe
            | OpKind::Stats
            | OpKind::Ping
            | OpKind::ListEngines => {
                let mut replies = self.everywhere(&op).await?.into_iter();
                // `assemble` keeps the list non-empty.
                let first = replies.next().unwrap_or(Reply::Pong);
                Ok(replies.fold(first, merge))
            }
        }
    }

    /// Lookups, inserts and receipts only: lookups grouped into one batch
    /// per preferred replica (a group whose replica is down or slow is
    /// asked again one lookup at a time, with a lookup's failover), inserts
    /// and receipts written to every replica as an insert is. An op that fails gets its
    /// error in its place. Ops run concurrently, not in order: a lookup does
    /// not see an insert of the same batch. Ops without a model (pod
    /// removal, capacity, stats, ping, ...) are refused: they concern every
    /// server, so use their own calls.
    async fn batch(&self, ops: Vec<Op>) -> Result<Vec<Reply>, ClientError> {
        self.grouped(ops).await
    }
}

#[cfg(test)]
mod tests;
