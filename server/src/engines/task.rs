//! One engine subscription's thread: the SUB socket (live batches), the
//! DEALER socket (replays) and the socket monitor (connected or not).
//!
//! libzmq sockets are blocking and belong to one thread; each subscription
//! has its own, so a slow or dead engine never stalls another, and the
//! thread polls its sockets with a short timeout to see the stop signal.
//! libzmq reconnects by itself; `ZMQ_MAXMSGSIZE` makes it drop a peer that
//! sends a larger message instead of buffering it (the gap that follows is
//! replayed or resynced like any other).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use prefix_events::{decode_batch, parse_live, parse_replay, replay_request, ReplayItem};
use prefix_index::{EngineHandle, EngineOp, Index};
use tokio_util::sync::CancellationToken;

use super::apply::apply_batch;
use super::stats::{Problem, SubStats};
use super::{EngineConfig, Subscription};
use prefix_events::follow::{digest, Action, Applied, Follower, Resync};

/// Messages taken from one socket before the others get a turn.
pub(super) const BURST: usize = 256;

/// Names the monitor endpoints of sockets apart.
static MONITORS: AtomicUsize = AtomicUsize::new(0);

/// Everything one subscription's thread needs.
pub(super) struct Task {
    pub(super) index: Arc<Index>,
    pub(super) sub: Subscription,
    pub(super) engine: EngineHandle,
    pub(super) stats: Arc<SubStats>,
    pub(super) cfg: EngineConfig,
    pub(super) ctx: zmq::Context,
}

/// A socket and its monitor (whose events say connected or not).
struct Watched {
    socket: zmq::Socket,
    monitor: zmq::Socket,
}

impl Task {
    /// Runs until `stop` is cancelled; socket errors restart the session
    /// after a pause.
    pub(super) fn run(self, stop: CancellationToken) {
        // A pod restored from a snapshot resumes from its last batch.
        let resume = self.engine.lock().last_batch().map(|(seq, _)| seq);
        self.stats.following(resume);
        self.stats
            .publish_view(&self.index, &self.sub.pod, self.cfg.learning_period);
        while !stop.is_cancelled() {
            if let Err(e) = self.session(&stop) {
                let what = format!("engine socket error: {e}");
                if self.stats.problem(Problem::Socket, &what) {
                    tracing::warn!(pod = %self.sub.pod, endpoint = %self.sub.endpoint, "{what}");
                }
                self.stats.set_connected(false);
                // A pause before the next session, cut short by the stop.
                for _ in 0..10 {
                    if stop.is_cancelled() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        self.stats.set_connected(false);
    }

    /// A socket connected to `endpoint` with a monitor (set up first, so
    /// that the first connection is seen too).
    fn socket(&self, kind: zmq::SocketType, endpoint: &str) -> Result<Watched, zmq::Error> {
        let socket = self.configured(kind)?;
        // Relaxed: a name counter; only its uniqueness matters.
        let n = MONITORS.fetch_add(1, Ordering::Relaxed);
        let addr = format!("inproc://engine-monitor-{n}");
        socket.monitor(
            &addr,
            (zmq::SocketEvent::CONNECTED as u16 | zmq::SocketEvent::DISCONNECTED as u16) as i32,
        )?;
        let monitor = self.ctx.socket(zmq::PAIR)?;
        monitor.connect(&addr)?;
        socket.connect(endpoint)?;
        Ok(Watched { socket, monitor })
    }

    /// A socket with the subscription's bounds, not yet connected.
    fn configured(&self, kind: zmq::SocketType) -> Result<zmq::Socket, zmq::Error> {
        let socket = bounded(&self.ctx, kind, &self.cfg)?;
        socket.set_reconnect_ivl(100)?;
        socket.set_reconnect_ivl_max(5_000)?;
        if kind == zmq::SUB {
            socket.set_subscribe(self.sub.topic.as_bytes())?;
        }
        Ok(socket)
    }

    fn dealer(&self) -> Result<Option<zmq::Socket>, zmq::Error> {
        self.sub
            .replay
            .as_deref()
            .map(|r| {
                let socket = self.configured(zmq::DEALER)?;
                socket.connect(r)?;
                Ok(socket)
            })
            .transpose()
    }

    fn session(&self, stop: &CancellationToken) -> Result<(), zmq::Error> {
        let sub = self.socket(zmq::SUB, &self.sub.endpoint)?;
        let mut dealer = self.dealer()?;
        let resume = self
            .engine
            .lock()
            .last_batch()
            .map(|(seq, digest)| Applied { seq, digest });
        let mut follower = Follower::new(dealer.is_some(), self.cfg.held_limit(), resume);
        let mut deadline: Option<Instant> = None;
        let mut actions = Vec::new();
        while !stop.is_cancelled() {
            let (live, events, replies) = {
                let mut items = vec![
                    sub.socket.as_poll_item(zmq::POLLIN),
                    sub.monitor.as_poll_item(zmq::POLLIN),
                ];
                if let Some(d) = &dealer {
                    items.push(d.as_poll_item(zmq::POLLIN));
                }
                zmq::poll(&mut items, self.cfg.poll_ms())?;
                (
                    items[0].is_readable(),
                    items[1].is_readable(),
                    items.get(2).is_some_and(|i| i.is_readable()),
                )
            };
            if events {
                while let Ok(frames) = sub.monitor.recv_multipart(zmq::DONTWAIT) {
                    let Some(up) = monitor_event(&frames) else {
                        continue;
                    };
                    self.stats.set_connected(up);
                    if up {
                        // A restarted engine and the same one after a blip
                        // look alike; the replay endpoint tells them apart.
                        follower.connected(&mut actions);
                        self.act(&mut follower, &mut actions, dealer.as_ref(), &mut deadline);
                    }
                }
            }
            if live {
                for _ in 0..BURST {
                    let Ok(frames) = sub.socket.recv_multipart(zmq::DONTWAIT) else {
                        break;
                    };
                    let was = follower.replaying();
                    match parse_live(&frames) {
                        // SUB filters by prefix: `kv` lets `kv2` through.
                        Ok(m)
                            if !self.sub.topic.is_empty()
                                && m.topic != self.sub.topic.as_bytes() =>
                        {
                            let topic = String::from_utf8_lossy(m.topic);
                            self.bad_message(&format!("message for another topic ({topic:?})"));
                        }
                        Ok(m) => follower.live(m.seq, m.payload.to_vec(), &mut actions),
                        Err(e) => self.bad_message(&format!("live message: {e}")),
                    }
                    if was && !follower.replaying() {
                        // Abandoned (too much held back): its answers must
                        // not pass for the next request's.
                        deadline = None;
                        dealer = self.dealer()?;
                    }
                    self.act(&mut follower, &mut actions, dealer.as_ref(), &mut deadline);
                }
            }
            if replies {
                for _ in 0..BURST {
                    let Some(Ok(frames)) = dealer.as_ref().map(|d| d.recv_multipart(zmq::DONTWAIT))
                    else {
                        break;
                    };
                    let was = follower.replaying();
                    let mut ended = false;
                    match parse_replay(&frames) {
                        Ok(ReplayItem::Batch(m)) => {
                            follower.replayed(m.seq, m.payload.to_vec(), &mut actions)
                        }
                        Ok(ReplayItem::End) => {
                            ended = true;
                            deadline = None;
                            follower.replay_ended(&mut actions);
                        }
                        Err(e) => self.bad_message(&format!("replay message: {e}")),
                    }
                    if was && !follower.replaying() && !ended {
                        // Abandoned (a hole in the answer): the rest of it
                        // must not pass for the next request's answer.
                        deadline = None;
                        dealer = self.dealer()?;
                    }
                    self.act(&mut follower, &mut actions, dealer.as_ref(), &mut deadline);
                }
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                deadline = None;
                follower.replay_timed_out(&mut actions);
                // A new socket: late answers to the old request must not
                // pass for answers to the next.
                dealer = self.dealer()?;
                self.act(&mut follower, &mut actions, dealer.as_ref(), &mut deadline);
            }
            self.stats.set_replaying(follower.replaying());
            self.stats
                .publish_view(&self.index, &self.sub.pod, self.cfg.learning_period);
        }
        Ok(())
    }

    fn bad_message(&self, what: &str) {
        self.stats.decode_error();
        if self.stats.problem(Problem::Decode, what) {
            tracing::warn!(pod = %self.sub.pod, "skipped an engine message: {what}");
        }
    }

    /// Carries out the follower's decisions, in order.
    fn act(
        &self,
        follower: &mut Follower<Vec<u8>>,
        actions: &mut Vec<Action<Vec<u8>>>,
        dealer: Option<&zmq::Socket>,
        deadline: &mut Option<Instant>,
    ) {
        let mut queue: VecDeque<_> = actions.drain(..).collect();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Apply { seq, payload } => {
                    if self.apply(seq, &payload) {
                        follower.orphaned(actions);
                        queue.extend(actions.drain(..));
                    }
                }
                Action::Clear(why) => self.clear(why),
                Action::Gap { from, seq } => self.stats.gap(from, seq),
                Action::Replay { from } => {
                    self.stats.replay_asked();
                    if let Some(d) = dealer {
                        if let Err(e) = d.send_multipart(replay_request(from), zmq::DONTWAIT) {
                            self.bad_message(&format!("replay request: {e}"));
                        }
                        *deadline = Some(Instant::now() + self.cfg.replay_timeout);
                    }
                }
            }
        }
    }

    /// Decodes and applies one batch; returns whether a store was orphaned.
    fn apply(&self, seq: u64, payload: &[u8]) -> bool {
        let batch = match decode_batch(payload, &self.cfg.decode) {
            Ok(b) => b,
            Err(e) => {
                // Skipped, not lost to the sequence: the next batch follows.
                self.engine
                    .lock()
                    .set_last_batch(Some((seq, digest(&payload))));
                self.bad_message(&format!("batch {seq}: {e}"));
                return false;
            }
        };
        if let Some(what) = batch
            .bad
            .as_ref()
            .and_then(|b| self.stats.bad_events(seq, b))
        {
            tracing::warn!(pod = %self.sub.pod, "{what}");
        }
        let out = apply_batch(&self.index, &self.sub, &self.engine, &batch);
        self.engine
            .lock()
            .set_last_batch(Some((seq, digest(&payload))));
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        let lag_ms = ((now - batch.ts) * 1000.0) as i64;
        self.stats.applied(seq, &out, lag_ms);
        if let Some(why) = &out.first_refusal {
            let what = format!("batch {seq}: {} event(s) refused: {why}", out.refused);
            if self.stats.problem(Problem::Refused, &what) {
                tracing::warn!(pod = %self.sub.pod, "{what}");
            }
        }
        out.applied.orphaned > 0
    }

    fn clear(&self, why: Resync) {
        self.stats.resynced(why);
        let what = format!("resync: {why}");
        if self.stats.problem(Problem::Resync, &what) {
            tracing::warn!(pod = %self.sub.pod, "{what}; the pod is cleared and learnt again");
        }
        let mut engine = self.engine.lock();
        if let Err(e) = self.index.apply(
            &mut engine,
            &self.sub.pod,
            &self.sub.model,
            EngineOp::Cleared,
        ) {
            tracing::warn!(pod = %self.sub.pod, "clearing failed: {e}");
        }
    }
}

/// A socket of `kind` with the engine bounds of `cfg`: the largest message
/// (larger ones drop the connection) and the messages queued while its
/// thread is busy.
pub(super) fn bounded(
    ctx: &zmq::Context,
    kind: zmq::SocketType,
    cfg: &EngineConfig,
) -> Result<zmq::Socket, zmq::Error> {
    let socket = ctx.socket(kind)?;
    socket.set_maxmsgsize(i64::try_from(cfg.max_message_bytes).unwrap_or(i64::MAX))?;
    // Closing drops unsent requests at once: nothing here must outlive
    // its socket.
    socket.set_linger(0)?;
    socket.set_rcvhwm(i32::try_from(cfg.max_queued_messages).unwrap_or(i32::MAX))?;
    Ok(socket)
}

/// A libzmq monitor message's event: `Some(true)` connected, `Some(false)`
/// disconnected. Its first frame is the event number (u16, native order)
/// and a value (u32).
fn monitor_event(frames: &[Vec<u8>]) -> Option<bool> {
    let head = frames.first()?;
    let event = u16::from_ne_bytes([*head.first()?, *head.get(1)?]);
    if event == zmq::SocketEvent::CONNECTED as u16 {
        Some(true)
    } else if event == zmq::SocketEvent::DISCONNECTED as u16 {
        Some(false)
    } else {
        None
    }
}
