//! Precise mode: the index follows the KV-cache events that inference
//! engines (vLLM, SGLang) publish over ZeroMQ.
//!
//! Each [`Subscription`] names a pod, its model, the engine's PUB endpoint,
//! its optional replay (ROUTER) endpoint and its block size. The server
//! subscribes once; every gateway reads the same exact view. Subscriptions
//! come from the configuration and, at run time, from the `subscribe` and
//! `unsubscribe` ops of writer clients. [`Engines`] hands each subscription
//! to one of a few threads (`shard`), each following many engines through
//! shared sockets, with a `session` per engine; and it runs, optionally,
//! the central collector: one bound SUB socket that engines connect to,
//! the topic `kv@<pod>@<model>` naming the pod (`central`). Both take their
//! sockets from one libzmq context sized for `max-engines` (`sockets`).
//!
//! Layering: `prefix-events` decodes frames and payloads, and its `follow`
//! decides what sequence numbers mean (apply, replay, resync); [`apply`]
//! turns a batch into index operations, with [`identity`] folding each
//! stored block's identity into its seeds; only `shard` and `central`
//! touch sockets.

mod admission;
pub mod alias;
pub mod apply;
pub mod catalog;
mod central;
mod config;
pub mod dns;
mod groups;
mod identity;
pub mod kept;
pub mod metrics;
#[cfg(test)]
mod model_tests;
mod seats;
mod session;
mod shard;
mod sockets;
mod stats;
mod view;
pub(crate) mod wire;

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
pub use prefix_index::Ratio;
use prefix_index::{EngineError, EngineSpec, Index};
use prefix_proto::key::hash_token_block_seeded;
use thiserror::Error;
use tokio_util::sync::CancellationToken;

pub use admission::{EngineAllow, EngineRefusal};
pub use config::{BlockAliases, EngineConfig, EngineSettings};
pub use seats::OutOfDescriptors;
pub(crate) use sockets::descriptors_per_socket;
pub use sockets::ENGINE_ZMQ_THREADS;
pub use stats::SubStats;

/// Why a subscription is refused as written (its text form, its fields).
pub use prefix_proto::SubscriptionError;
/// What a subscription's follower has seen, for `list-engines` (read from
/// a `SubStats`), and one engine to follow: the protocol's, the one
/// description of each (their wire, JSON and text forms, `--engine`
/// included, are the protocol crate's).
pub use prefix_proto::{EngineStatus, Subscription};

/// The index's description of an engine of `engine_block` tokens a block
/// whose blocks are hashed into the gateways' blocks of `our_block` tokens
/// by the gateways' rule: how the server, and the benches and the load
/// tester that play it, describe every engine to the index.
pub fn engine_spec(engine_block: u32, our_block: u32) -> EngineSpec {
    EngineSpec {
        engine_block,
        our_block,
        hash: hash_token_block_seeded,
    }
}

/// Why a subscription is not followed.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SubscribeError {
    /// The subscription is refused as written.
    #[error(transparent)]
    Refused(#[from] SubscriptionError),
    /// The index refuses the pod (block sizes, name).
    #[error("engine subscription for {pod}: {source}")]
    Index {
        /// The pod.
        pod: String,
        /// The index's reason.
        source: EngineError,
    },
    /// More subscriptions than `max-engines`.
    #[error("too many engine subscriptions (max-engines = {max})")]
    TooMany {
        /// The configured bound.
        max: usize,
    },
    /// The open-file limit leaves no room for the engine's sockets.
    #[error(transparent)]
    Descriptors(#[from] OutOfDescriptors),
    /// The engine threads could not start.
    #[error("cannot start an engine thread: {0}")]
    Thread(String),
}

/// The engine subscriptions of one server: their threads and their state.
pub struct Engines {
    index: Arc<Index>,
    cfg: Arc<EngineConfig>,
    ctx: sockets::Context,
    /// The threads following subscriptions, started with the first one.
    shards: Mutex<Vec<shard::Handle>>,
    /// Replays under way, over all shards.
    replays: Arc<shard::Replays>,
    running: Mutex<BTreeMap<String, Running>>,
    /// Each subscription's sockets and their descriptors. Locked after
    /// `running`.
    seats: Mutex<seats::Seats>,
    /// Slots of `max-engines` held for the new pods of a batch of
    /// subscriptions while it runs ([`Engines::subscribe_all`] registers
    /// their pods first): the central collector counts them as taken, so
    /// none of those pods is registered and then refused for want of room.
    /// Read and written under `running`'s lock.
    reserved: AtomicUsize,
    /// Pods taken out of `running` whose engine state is being dropped:
    /// the central collector does not meet them again meanwhile (it would
    /// register on the state about to go). Locked after `running`.
    leaving: Mutex<std::collections::BTreeSet<String>>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
    shutdown: CancellationToken,
    /// The central collector's bound endpoint, once bound.
    central: Mutex<Option<String>>,
    /// Messages the central collector could not place: not a live message,
    /// a topic naming no pod, or a pod past `max-engines`.
    strays: std::sync::atomic::AtomicU64,
    /// When a stray was last logged (at most once per `LOG_EVERY`).
    stray_logged: Mutex<Option<std::time::Instant>>,
    /// Connections and messages the central collector refused.
    refusals: admission::Refusals,
    /// The followed set as answers read it, without `running`'s lock.
    catalog: catalog::Published,
    /// The run-time subscriptions, kept in a file when snapshots are on.
    /// Its lock is held through each run-time op (`subscribe`,
    /// `unsubscribe`), taken before `running`: ops on one pod are applied
    /// one at a time, so the file and the running set agree.
    keeper: Mutex<kept::Keeper>,
    /// Whether [`Engines::start`] has run: engines found through DNS are
    /// followed only from then on.
    started: tokio::sync::watch::Sender<bool>,
    /// The counters of each `--engine-dns` source, in order.
    dns: Box<[dns::SourceStats]>,
}

/// Slots of `max-engines` held in [`Engines::reserved`] for a batch of
/// subscriptions, until dropped. While the batch runs, its pods already
/// followed count twice (held and running): the collector leaves more room
/// than needed, never less.
struct Reservation<'a> {
    engines: &'a Engines,
}

impl<'a> Reservation<'a> {
    /// Holds `slots`; `running` is the engines' running set, locked.
    fn hold(
        engines: &'a Engines,
        _running: &MutexGuard<'_, BTreeMap<String, Running>>,
        slots: usize,
    ) -> Self {
        // Relaxed: under `running`'s lock, which the guard proves held.
        engines.reserved.store(slots, Ordering::Relaxed);
        Reservation { engines }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        let _running = self.engines.running.lock();
        // Relaxed: under `running`'s lock.
        self.engines.reserved.store(0, Ordering::Relaxed);
    }
}

/// A pod in [`Engines::leaving`], until dropped.
struct Leaving<'a> {
    engines: &'a Engines,
    pod: &'a str,
}

impl Drop for Leaving<'_> {
    fn drop(&mut self) {
        self.engines.leaving.lock().remove(self.pod);
    }
}

struct Running {
    sub: Subscription,
    stats: Arc<SubStats>,
    stop: CancellationToken,
    /// Disconnects when the subscription's session has been dropped by its
    /// shard (its sender goes with it); none for the central collector's
    /// pods, which have no session.
    exited: Option<std::sync::mpsc::Receiver<()>>,
}

/// The shard of `pod`'s subscription, of `shards`: the same one for a pod
/// always.
fn shard_index(pod: &str, shards: usize) -> usize {
    (xxhash_rust::xxh3::xxh3_64(pod.as_bytes()) % shards.max(1) as u64) as usize
}

/// Stack of an engine thread: it decodes and applies one batch at a time,
/// with no deep recursion anywhere.
const STACK_BYTES: usize = 512 << 10;

impl Engines {
    /// No subscriptions yet; threads stop when `shutdown` is cancelled.
    /// Run-time subscriptions are kept in the file `kept`, if given
    /// (`kept`), and followed again by [`Engines::start`]. Engines' own
    /// sockets get what the open-file limit leaves beyond `held`
    /// descriptors, the most the rest of the server may hold
    /// ([`crate::descriptors::held`]).
    pub fn new(
        index: Arc<Index>,
        cfg: EngineConfig,
        shutdown: CancellationToken,
        kept: Option<PathBuf>,
        held: u64,
    ) -> Result<Arc<Engines>, StartError> {
        let configured = cfg.subscriptions.iter().map(|s| s.pod.clone()).collect();
        let ctx = sockets::Context::new(sockets::max_sockets(&cfg))
            .map_err(|e| StartError::Context(e.to_string()))?;
        let cfg_dns_stats = cfg.dns.sources.iter().map(|_| Default::default()).collect();
        let per_watched = crate::descriptors::per_watched();
        let seats = Mutex::new(seats::Seats::new(cfg.threads, held, per_watched));
        Ok(Arc::new(Engines {
            index,
            cfg: Arc::new(cfg),
            ctx,
            shards: Mutex::default(),
            replays: Arc::default(),
            running: Mutex::new(BTreeMap::new()),
            seats,
            reserved: AtomicUsize::new(0),
            leaving: Mutex::default(),
            threads: Mutex::new(Vec::new()),
            shutdown,
            central: Mutex::new(None),
            strays: Default::default(),
            stray_logged: Mutex::new(None),
            refusals: Default::default(),
            catalog: Default::default(),
            keeper: Mutex::new(kept::Keeper::new(kept, configured)),
            started: tokio::sync::watch::Sender::new(false),
            dns: cfg_dns_stats,
        }))
    }

    fn spawn(&self, name: String, f: impl FnOnce() + Send + 'static) -> std::io::Result<()> {
        let handle = std::thread::Builder::new()
            .name(name)
            .stack_size(STACK_BYTES)
            .spawn(f)?;
        let mut threads = self.threads.lock();
        threads.retain(|t| !t.is_finished());
        threads.push(handle);
        Ok(())
    }

    /// The index the engines feed.
    pub fn index(&self) -> &Arc<Index> {
        &self.index
    }

    /// The settings.
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// The index's description of an engine of `block_size` tokens a block.
    pub fn spec(&self, block_size: u32) -> EngineSpec {
        engine_spec(block_size, self.cfg.token_block)
    }

    /// Starts following `sub` (replacing a subscription of the same pod):
    /// the `subscribe` op. The subscription is kept across restarts when
    /// snapshots are on.
    pub fn subscribe(self: &Arc<Self>, sub: Subscription) -> Result<(), SubscribeError> {
        let mut results = self.subscribe_all(vec![sub]);
        results.pop().unwrap_or(Ok(()))
    }

    /// Starts following each of `subs`, in order, as [`Engines::subscribe`]
    /// would one by one; one result each. Their pods are registered with
    /// the index in one step and the kept subscriptions written once, so a
    /// batch of thousands costs each engine its own work only, where one
    /// by one each would also copy the registry of every pod subscribed
    /// before it.
    pub fn subscribe_all(
        self: &Arc<Self>,
        subs: Vec<Subscription>,
    ) -> Vec<Result<(), SubscribeError>> {
        let mut keeper = self.keeper.lock();
        let results = self.subscribe_batch(&subs);
        let mut followed = subs
            .iter()
            .zip(&results)
            .filter(|(_, r)| r.is_ok())
            .peekable();
        if followed.peek().is_some() {
            keeper.subscribed(crate::clock::now_ms(), followed.map(|(sub, _)| sub));
        }
        results
    }

    /// Follows each of `subs` as [`Engines::subscribe_all`] does, without
    /// keeping them: call it under the keeper's lock.
    fn subscribe_batch(self: &Arc<Self>, subs: &[Subscription]) -> Vec<Result<(), SubscribeError>> {
        let reserved = (subs.len() > 1).then(|| {
            // As many new pods as `max_engines` leaves room for, their
            // slots held until the batch ends: a pod registered here and
            // then refused would stay behind, empty.
            let mut pods = Vec::new();
            let reservation = {
                let running = self.running.lock();
                let mut room = self.cfg.max_engines.saturating_sub(running.len());
                let mut seen = HashSet::new();
                // Seated as they will be, in order (replacements
                // included): one the open-file limit has no room for is
                // not registered either.
                let mut seats = self.seats.lock().clone();
                let limit = crate::descriptors::soft_limit();
                for sub in subs {
                    let shard = shard_index(&sub.pod, self.cfg.threads);
                    let seated = seats
                        .take(&sub.pod, shard, &sub.endpoint, &sub.topic, limit)
                        .is_ok();
                    // A followed pod is registered already.
                    if running.contains_key(&sub.pod) || !seen.insert(&*sub.pod) || !seated {
                        continue;
                    }
                    if room == 0 {
                        break;
                    }
                    room -= 1;
                    pods.push((&*sub.pod, self.spec(sub.block_size)));
                }
                Reservation::hold(self, &running, pods.len())
            };
            // A pod refused here is refused again, with its reason, below.
            let _ = self.index.register_engine_pods(pods);
            reservation
        });
        let results: Vec<_> = subs.iter().map(|sub| self.follow(sub.clone())).collect();
        drop(reserved);
        results
    }

    /// Starts following `sub`, replacing a subscription of the same pod.
    fn follow(self: &Arc<Self>, sub: Subscription) -> Result<(), SubscribeError> {
        let pod = sub.pod.clone();
        let central = self
            .running
            .lock()
            .get(&pod)
            .is_some_and(|r| r.exited.is_none());
        // Fed by the central collector until now: its records carry no
        // batch number a subscription could resume from, so the pod is
        // learnt anew from its engine (and kept out of the collector's
        // reach until the subscription holds it).
        let _leaving = if central { self.take_out(&pod) } else { None };
        self.start_following(sub)
    }

    /// Hands `sub` to its shard, replacing a subscription of the same pod.
    fn start_following(self: &Arc<Self>, sub: Subscription) -> Result<(), SubscribeError> {
        let mut running = self.running.lock();
        if !running.contains_key(&sub.pod) && running.len() >= self.cfg.max_engines {
            return Err(SubscribeError::TooMany {
                max: self.cfg.max_engines,
            });
        }
        // Seated before the pod is registered: one refused leaves nothing
        // behind.
        let shard = shard_index(&sub.pod, self.cfg.threads);
        let seated = self.seats.lock().take(
            &sub.pod,
            shard,
            &sub.endpoint,
            &sub.topic,
            crate::descriptors::soft_limit(),
        )?;
        let seat = seated.seat;
        let engine = match self.index.engine(&sub.pod, self.spec(sub.block_size)) {
            Ok(engine) => engine,
            Err(source) => {
                self.seats.lock().undo(&sub.pod, seated);
                return Err(SubscribeError::Index {
                    pod: sub.pod.clone(),
                    source,
                });
            }
        };
        self.catalog.changed();
        if let Some(old) = running.remove(&sub.pod) {
            // The old session applies to the same engine state: it must be
            // gone before the new one reads where to resume, or a batch in
            // its hands would be applied twice.
            old.stop.cancel();
            if let Some(exited) = old.exited {
                let removed = self.shard_of(&sub.pod, |s| {
                    s.send(shard::Command::Remove(sub.pod.clone()))
                });
                if let Err(e) = removed {
                    self.seats.lock().release(&sub.pod);
                    return Err(e);
                }
                let _ = exited.recv_timeout(std::time::Duration::from_secs(5));
            }
        }
        let stats = Arc::new(SubStats::default());
        let stop = self.shutdown.child_token();
        let (alive, exited) = std::sync::mpsc::channel::<()>();
        let session = session::Session::new(
            &self.cfg,
            sub.clone(),
            engine,
            stats.clone(),
            stop.clone(),
            alive,
        );
        let pod = sub.pod.clone();
        let added = self.shard_of(&pod, |s| {
            s.send(shard::Command::Add(Box::new(session), seat))
        });
        if let Err(e) = added {
            self.seats.lock().release(&pod);
            return Err(e);
        }
        running.insert(
            pod,
            Running {
                sub,
                stats,
                stop,
                exited: Some(exited),
            },
        );
        Ok(())
    }

    /// Runs `f` on the shard that follows `pod` (the same one for a pod
    /// always), starting the shards first if none runs yet.
    fn shard_of(
        &self,
        pod: &str,
        f: impl FnOnce(&shard::Handle) -> bool,
    ) -> Result<(), SubscribeError> {
        let mut shards = self.shards.lock();
        if shards.is_empty() {
            // All of them or none: the seats number the shards as
            // `threads` of them. The threads of a start that failed part
            // way idle until shutdown.
            let mut started = Vec::with_capacity(self.cfg.threads);
            for i in 0..self.cfg.threads {
                let env = session::Env {
                    index: self.index.clone(),
                    cfg: self.cfg.clone(),
                };
                let (shard, handle) =
                    shard::Shard::new(env, self.ctx.clone(), self.replays.clone())
                        .map_err(|e| SubscribeError::Thread(e.to_string()))?;
                let stop = self.shutdown.clone();
                self.spawn(format!("engine-shard-{i}"), move || shard.run(stop))
                    .map_err(|e| SubscribeError::Thread(e.to_string()))?;
                started.push(handle);
            }
            *shards = started;
        }
        match f(&shards[shard_index(pod, self.cfg.threads)]) {
            true => Ok(()),
            false => Err(SubscribeError::Thread(
                "the engine threads have stopped".into(),
            )),
        }
    }

    /// Stops following `pod`'s engine and drops what it knew (the pod is
    /// removed; gateway inserts register it again as a plain pod): the
    /// `unsubscribe` op, kept across restarts like `subscribe`. Returns
    /// whether it was followed.
    pub fn unsubscribe(&self, pod: &str) -> bool {
        self.unsubscribe_all(&[pod]).pop().unwrap_or(false)
    }

    /// Stops following each of `pods`, in order, as [`Engines::unsubscribe`]
    /// would one by one; whether each was followed. The kept subscriptions
    /// are written once for all of them and their pods leave the index in
    /// one step, where one by one each would write and sync the file of
    /// every subscription left and copy the registry of every pod left.
    pub fn unsubscribe_all(&self, pods: &[&str]) -> Vec<bool> {
        if pods.is_empty() {
            return Vec::new();
        }
        let mut keeper = self.keeper.lock();
        keeper.unsubscribed(crate::clock::now_ms(), pods.iter().copied());
        let taken = self.take_out_all(pods);
        taken.iter().map(Option::is_some).collect()
    }

    /// Takes `pod` out of the followed set and drops its engine state; the
    /// pod stays in `leaving` while the answer lives. `None` when it was
    /// not followed.
    fn take_out<'a>(&'a self, pod: &'a str) -> Option<Leaving<'a>> {
        self.take_out_all(&[pod]).pop().flatten()
    }

    /// Takes each of `pods` out of the followed set, as
    /// [`Engines::take_out`] would one by one, and drops their engine
    /// states in one step ([`Index::drop_engine_pods`]).
    fn take_out_all<'a>(&'a self, pods: &[&'a str]) -> Vec<Option<Leaving<'a>>> {
        let mut olds = Vec::new();
        let taken = {
            let mut running = self.running.lock();
            let mut leaving = self.leaving.lock();
            self.catalog.changed();
            pods.iter()
                .map(|&pod| {
                    let old = running.remove(pod)?;
                    leaving.insert(pod.into());
                    olds.push((pod, old));
                    Some(Leaving { engines: self, pod })
                })
                .collect()
        };
        for (pod, old) in &olds {
            old.stop.cancel();
            if old.exited.is_some() {
                // Its shard drops it now rather than at its next look; its
                // seat is given up after, so that a subscription seated in
                // its place reaches the shard after the drop.
                let _ = self.shard_of(pod, |s| s.send(shard::Command::Remove((*pod).into())));
                self.seats.lock().release(pod);
            }
        }
        // Waits for batches being applied, or a snapshot reading the
        // engines, to end; `running` is free meanwhile, for lists and
        // metrics.
        let names: Vec<&str> = olds.iter().map(|&(pod, _)| pod).collect();
        self.index.drop_engine_pods(&names);
        taken
    }

    /// The followed subscriptions by pod, as of the last change: read
    /// without waiting for subscriptions under way.
    pub fn catalog(&self) -> Arc<catalog::Catalog> {
        self.catalog.get(|| {
            let running = self.running.lock();
            let subs = running.values().map(|r| r.sub.clone()).collect();
            (self.catalog.generation(), subs)
        })
    }

    /// Every subscription and its state, by pod name.
    pub fn list(&self) -> Vec<(Subscription, EngineStatus)> {
        self.running
            .lock()
            .values()
            .map(|r| (r.sub.clone(), r.stats.state()))
            .collect()
    }

    /// How the followed engines stand, naming up to `named` of those not
    /// connected.
    pub fn standing(&self, named: usize) -> Standing {
        use std::sync::atomic::Ordering::Relaxed;
        let mut st = Standing::default();
        for (pod, r) in self.running.lock().iter() {
            st.followed += 1;
            // Relaxed (both): statistics.
            if r.stats.unfollowed.load(Relaxed) {
                st.failing += 1;
            } else if r.stats.connected.load(Relaxed) {
                st.connected += 1;
                continue;
            }
            if st.down.len() < named {
                st.down.push((pod.clone(), r.stats.state().last_error));
            }
        }
        st
    }

    /// Replays under way now, over all subscriptions.
    pub fn replays_running(&self) -> usize {
        self.replays.running()
    }

    /// Asks `pod`'s follower to clear the pod and learn it again (its
    /// engine's whole buffer where a replay endpoint has it): gateways'
    /// receipts doubt it. Not within `--receipt-quiet` of the last time
    /// receipts did. Returns whether it asked.
    pub fn doubt(&self, pod: &str) -> bool {
        let running = self.running.lock();
        let Some(r) = running.get(pod) else {
            return false;
        };
        let hold = self.index.config().receipts.quiet.as_millis();
        let hold = u64::try_from(hold).unwrap_or(u64::MAX);
        r.stats.doubt(crate::clock::now_ms(), hold)
    }

    /// Every subscription's counters, for metrics.
    pub fn stats(&self) -> Vec<(String, Arc<SubStats>)> {
        self.running
            .lock()
            .iter()
            .map(|(pod, r)| (pod.clone(), r.stats.clone()))
            .collect()
    }

    /// Starts the configured subscriptions, then the kept run-time ones,
    /// and the central collector. Engine-fed pods restored from a snapshot
    /// that none of them follows are dropped, since nothing would ever
    /// update them (unless the central collector runs: it may meet them).
    pub fn start(self: &Arc<Self>) -> Result<(), StartError> {
        let kept = self.keeper.lock().kept(crate::clock::now_ms()).clone();
        // Their pods in one step: one at a time, a fleet of thousands
        // would copy the pod registry thousands of times. A pod refused
        // here is refused again, with its subscription named, below.
        let pods = self.cfg.subscriptions.iter().map(|s| &*s.pod);
        let pods = pods.filter(|p| !kept.unsubscribed.contains(*p));
        let _ = self
            .index
            .register_pods(pods.chain(kept.subscribed.keys().map(|p| &**p)));
        for sub in self.cfg.subscriptions.clone() {
            // A configured pod unsubscribed at run time stays unfollowed.
            if kept.unsubscribed.contains(&sub.pod) {
                continue;
            }
            let pod = sub.pod.clone();
            match self.follow(sub) {
                // The others are followed: the limit may be raised and the
                // engine subscribed at run time.
                Err(e @ SubscribeError::Descriptors(_)) => {
                    tracing::error!(%pod, "a configured engine is not followed: {e}");
                }
                r => r?,
            }
        }
        self.follow_kept(&kept);
        // Even where the central collector keeps unfollowed pods, a
        // configured one unsubscribed at run time keeps nothing of the
        // snapshot: nothing would update it.
        let gone: Vec<&str> = {
            let running = self.running.lock();
            let pods = kept.unsubscribed.iter().map(String::as_str);
            pods.filter(|pod| !running.contains_key(*pod)).collect()
        };
        self.drop_pods(
            &gone,
            "an engine-fed pod of the snapshot was unsubscribed at run time: dropped",
        );
        // Engines found through DNS may follow them again: their first
        // round drops what none follows (`dns`).
        if self.cfg.listen.is_none() && self.cfg.dns.sources.is_empty() {
            self.drop_unfollowed();
        }
        if let Some(listen) = self.cfg.listen.clone() {
            let collector = central::Collector::bind(self.clone(), &listen)?;
            *self.central.lock() = collector.last_endpoint();
            let stop = self.shutdown.clone();
            self.spawn("engine-collector".into(), move || collector.run(stop))
                .map_err(|e| SubscribeError::Thread(e.to_string()))?;
        }
        self.started.send_replace(true);
        Ok(())
    }

    /// Follows the subscriptions kept from before the restart (replacing a
    /// configured one of the same pod). One refused now (the token block
    /// changed, say) is logged and left out; the file keeps it until the
    /// next op.
    fn follow_kept(self: &Arc<Self>, kept: &kept::Kept) {
        for sub in kept.subscribed.values() {
            let followed = sub
                .check_endpoints()
                .map_err(SubscribeError::from)
                .and_then(|()| self.follow(sub.clone()));
            match followed {
                Ok(()) => {
                    tracing::info!(pod = %sub.pod, "following the engine subscribed at run time before the restart")
                }
                Err(e) => {
                    tracing::error!(pod = %sub.pod, "an engine subscribed at run time is not followed again: {e}")
                }
            }
        }
    }

    /// Drops the engine-fed pods that no subscription follows.
    fn drop_unfollowed(&self) {
        let running = self.running.lock();
        let engines = self.index.engines();
        let gone: Vec<&str> = engines
            .iter()
            .map(|(pod, _)| pod.as_str())
            .filter(|pod| !running.contains_key(*pod))
            .collect();
        self.drop_pods(
            &gone,
            "an engine-fed pod of the snapshot is followed by no subscription any more: dropped",
        );
    }

    /// Drops the engine-fed pods of `pods` in one step, logging `why` for
    /// each that was engine-fed.
    fn drop_pods(&self, pods: &[&str], why: &str) {
        for (pod, dropped) in pods.iter().zip(self.index.drop_engine_pods(pods)) {
            if dropped {
                tracing::info!(%pod, "{why}");
            }
        }
    }

    /// Counts a message the central collector could not place, and logs
    /// why (the first, then at most once per 10 s).
    fn stray(&self, why: impl FnOnce() -> String) {
        // Relaxed: a statistic.
        let n = 1 + self
            .strays
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if !stats::log_due(&mut self.stray_logged.lock()) {
            return;
        }
        tracing::warn!(strays = n, "engine collector: skipped a message: {}", why());
    }

    /// Messages the central collector could not place.
    pub fn strays(&self) -> u64 {
        // Relaxed: a statistic.
        self.strays.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Connections and messages the central collector refused for `why`.
    pub fn refused(&self, why: EngineRefusal) -> u64 {
        self.refusals.count(why)
    }

    /// Where the central collector is bound (`tcp://host:port`), if it is.
    pub fn central_endpoint(&self) -> Option<String> {
        self.central.lock().clone()
    }

    /// A stats slot for a pod met by the central collector.
    fn central_pod(
        &self,
        pod: &str,
        model: &str,
    ) -> Option<(
        Arc<SubStats>,
        Subscription,
        prefix_index::EngineHandle,
        CancellationToken,
    )> {
        let mut running = self.running.lock();
        if running.contains_key(pod) || self.leaving.lock().contains(pod) {
            // A pod followed otherwise (a configured subscription, say) is
            // not fed from two sources.
            return None;
        }
        // Relaxed: written under `running`'s lock, which we hold.
        let reserved = self.reserved.load(Ordering::Relaxed);
        if running.len() + reserved >= self.cfg.max_engines {
            return None;
        }
        let sub = Subscription {
            pod: pod.into(),
            model: model.into(),
            endpoint: self.cfg.listen.clone().unwrap_or_default(),
            replay: None,
            block_size: self.cfg.central_block_size,
            topic: format!("kv@{pod}@{model}"),
            media: vec!["GPU".into()],
        };
        // Registered only if the index takes it (a name it refuses must not
        // hold a slot of `max-engines`).
        let engine = self.index.engine(pod, self.spec(sub.block_size)).ok()?;
        let stats = Arc::new(SubStats::default());
        let gone = self.shutdown.child_token();
        self.catalog.changed();
        running.insert(
            pod.into(),
            Running {
                sub: sub.clone(),
                stats: stats.clone(),
                stop: gone.clone(),
                exited: None,
            },
        );
        Some((stats, sub, engine, gone))
    }

    /// Waits for every thread to end (call after cancelling `shutdown`;
    /// each notices within its poll period).
    pub fn join(&self) {
        let threads = std::mem::take(&mut *self.threads.lock());
        for t in threads {
            let _ = t.join();
        }
    }
}

/// How the followed engines stand (see [`Engines::standing`]).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Standing {
    /// Subscriptions, of every kind.
    pub followed: usize,
    /// Of which connected to their engine.
    pub connected: usize,
    /// Of which not followed at all: their socket could not be opened or
    /// connected, and is tried again every second.
    pub failing: usize,
    /// Some of those not connected, by pod, with their last problem.
    pub down: Vec<(String, Option<String>)>,
}

impl std::fmt::Display for Standing {
    /// One line of counts, then a line per pod named.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let down = self.followed - self.connected;
        write!(
            f,
            "engines: {} followed, {} connected, {} not ({} of them failing to open their socket)",
            self.followed, self.connected, down, self.failing
        )?;
        for (pod, why) in &self.down {
            let why = why.as_deref().unwrap_or("not connected yet");
            write!(f, "\n  {pod}: {why}")?;
        }
        if down > self.down.len() {
            write!(
                f,
                "\n  ... and {} more (list-engines)",
                down - self.down.len()
            )?;
        }
        Ok(())
    }
}

/// Why precise mode could not start.
#[derive(Debug, Error)]
pub enum StartError {
    /// A configured subscription was refused.
    #[error(transparent)]
    Subscription(#[from] SubscribeError),
    /// libzmq's context could not be made.
    #[error("engine sockets: {0}")]
    Context(String),
    /// The central collector could not bind.
    #[error("engine-listen {endpoint}: {why}")]
    Bind {
        /// The endpoint.
        endpoint: String,
        /// The socket's error.
        why: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Engines with `cfg` (`kept`: their file of run-time subscriptions) on
    /// a new index, with that index and the token that stops them.
    fn engines(
        cfg: EngineConfig,
        kept: Option<PathBuf>,
    ) -> (Arc<Engines>, Arc<Index>, CancellationToken) {
        let index = Arc::new(Index::new(prefix_index::IndexConfig::default()));
        let stop = CancellationToken::new();
        let engines = Engines::new(index.clone(), cfg, stop.clone(), kept, 0).unwrap();
        (engines, index, stop)
    }

    /// A subscribe and an unsubscribe of one pod at once, many times: after
    /// each pair the kept file, the followed set and the index's engine-fed
    /// pods say the same of the pod (whichever op came last).
    #[test]
    fn ops_on_one_pod_at_once_leave_the_file_and_the_followed_set_agreeing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(kept::FILE);
        let (engines, index, stop) = engines(EngineConfig::default(), Some(path.clone()));
        engines.start().unwrap();
        // Nothing listens there: the subscription connects in the background.
        let sub: Subscription = "pod=p,model=m,endpoint=tcp://127.0.0.1:1".parse().unwrap();
        for _ in 0..40 {
            let barrier = std::sync::Barrier::new(2);
            std::thread::scope(|s| {
                s.spawn(|| {
                    barrier.wait();
                    engines.subscribe(sub.clone()).unwrap();
                });
                s.spawn(|| {
                    barrier.wait();
                    engines.unsubscribe("p");
                });
            });
            let followed = engines.list().iter().any(|(s, _)| s.pod == "p");
            let kept = kept::Kept::load(&path).unwrap();
            let fed = index.engines().iter().any(|(pod, _)| pod == "p");
            assert_eq!(
                (kept.subscribed.contains_key("p"), fed),
                (followed, followed)
            );
        }
        stop.cancel();
        engines.join();
    }

    /// While a batch of subscriptions holds slots of `max-engines` for the
    /// pods it registered, the central collector meets new pods only in
    /// the room left beside them, and in all of it once the batch ends.
    #[test]
    fn the_collector_leaves_a_batch_the_slots_it_holds() {
        let cfg = EngineConfig {
            max_engines: 2,
            ..EngineConfig::default()
        };
        let (engines, _, stop) = engines(cfg, None);
        let held = Reservation::hold(&engines, &engines.running.lock(), 1);
        assert!(engines.central_pod("x", "m").is_some());
        assert!(engines.central_pod("y", "m").is_none());
        drop(held);
        assert!(engines.central_pod("y", "m").is_some());
        assert!(engines.central_pod("z", "m").is_none());
        stop.cancel();
        engines.join();
    }

    /// A subscription resuming from a restored last batch lists it as its
    /// `last_seq` before any batch comes (nothing listens at its endpoint,
    /// so none ever does).
    #[test]
    fn a_resumed_subscription_lists_its_last_batch() {
        let sub: Subscription = "pod=p,model=m,endpoint=tcp://127.0.0.1:1".parse().unwrap();
        let cfg = EngineConfig {
            subscriptions: vec![sub.clone()],
            ..EngineConfig::default()
        };
        let (engines, index, stop) = engines(cfg, None);
        // As a snapshot restores it, before `start`.
        index
            .engine("p", engines.spec(sub.block_size))
            .unwrap()
            .lock()
            .set_last_batch(Some((41, 7)));
        engines.start().unwrap();
        // Its session sets it as the subscription is handed to a shard.
        let mut last = None;
        for _ in 0..500 {
            last = engines.list()[0].1.last_seq;
            if last.is_some() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(last, Some(41));
        stop.cancel();
        engines.join();
    }
}
