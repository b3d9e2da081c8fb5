//! One followed engine between its messages: its follower (what sequence
//! numbers mean), the replay it wants, and the batches it applies. No
//! sockets: its shard (`shard`) receives a subscription's messages and
//! sends its replay requests, the central collector (`central`) receives
//! the messages of the pods it meets, and each hands a message to the
//! session it belongs to. Both doors take the same steps from there.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use prefix_events::follow::{digest, Action, Applied, Follower, Resync};
use prefix_events::{decode_batch, parse_live, parse_replay, ReplayItem};
use prefix_index::{EngineHandle, EngineOp, Index};
use tokio_util::sync::CancellationToken;

use super::apply::apply_batch;
use super::stats::{Problem, SubStats};
use super::view::Pending;
use super::{EngineConfig, Subscription};

/// What every session of a shard reads: the index and the settings.
pub(super) struct Env {
    pub(super) index: Arc<Index>,
    pub(super) cfg: Arc<EngineConfig>,
}

/// One engine subscription's state.
pub(super) struct Session {
    pub(super) sub: Subscription,
    engine: EngineHandle,
    pub(super) stats: Arc<SubStats>,
    follower: Follower<Vec<u8>>,
    /// The start of a replay the follower asked for that its shard has
    /// not sent yet.
    ask: Option<u64>,
    /// When the replay sent must have ended.
    deadline: Option<Instant>,
    /// Cancelled when the subscription ends (or the server stops).
    pub(super) stop: CancellationToken,
    /// Dropped with the session: a subscription replacing this one waits
    /// for that before it reads where to resume. None for a pod met by the
    /// central collector, which nothing replaces in place.
    _alive: Option<std::sync::mpsc::Sender<()>>,
}

impl Session {
    /// A session resuming from the pod's last batch (restored from a
    /// snapshot, or left by the subscription this one replaces), if any.
    pub(super) fn new(
        cfg: &EngineConfig,
        sub: Subscription,
        engine: EngineHandle,
        stats: Arc<SubStats>,
        stop: CancellationToken,
        alive: std::sync::mpsc::Sender<()>,
    ) -> Session {
        let resume = engine
            .lock()
            .last_batch()
            .map(|(seq, digest)| Applied { seq, digest });
        stats.following(resume.map(|a| a.seq));
        let follower = Follower::new(sub.replay.is_some(), cfg.held_limit(), resume);
        Session {
            sub,
            engine,
            stats,
            follower,
            ask: None,
            deadline: None,
            stop,
            _alive: Some(alive),
        }
    }

    /// A session for a pod the central collector meets: no replay endpoint
    /// (a gap or a restart resyncs the pod), and no resuming from a
    /// snapshot's last batch, since the topic names no engine instance a
    /// batch number could be trusted from.
    pub(super) fn met(
        sub: Subscription,
        engine: EngineHandle,
        stats: Arc<SubStats>,
        stop: CancellationToken,
    ) -> Session {
        stats.following(None);
        let held = prefix_events::HeldLimit {
            batches: 0,
            bytes: 0,
        };
        Session {
            sub,
            engine,
            stats,
            follower: Follower::new(false, held, None),
            ask: None,
            deadline: None,
            stop,
            _alive: None,
        }
    }

    /// The connection to the engine came up or went down.
    pub(super) fn connected(&mut self, env: &Env, up: bool) {
        self.stats.set_connected(up);
        if up {
            // A restarted engine and the same one after a blip look alike;
            // the replay endpoint tells them apart.
            let mut actions = Vec::new();
            self.follower.connected(&mut actions);
            self.act(env, actions);
        }
    }

    /// A message from the session's own socket, which libzmq filters by
    /// topic prefix.
    pub(super) fn own_message(&mut self, env: &Env, frames: &[Vec<u8>]) {
        match parse_live(frames) {
            // SUB filters by prefix: `kv` lets `kv2` through.
            Ok(m) if !self.sub.topic.is_empty() && m.topic != self.sub.topic.as_bytes() => {
                let topic = String::from_utf8_lossy(m.topic);
                self.bad_message(&format!("message for another topic ({topic:?})"));
            }
            Ok(m) => self.live(env, m.seq, m.payload.to_vec()),
            Err(e) => self.bad_message(&format!("live message: {e}")),
        }
    }

    /// Batch `seq` of the live stream.
    pub(super) fn live(&mut self, env: &Env, seq: u64, payload: Vec<u8>) {
        let mut actions = Vec::new();
        self.follower.live(seq, payload, &mut actions);
        self.act(env, actions);
    }

    /// A message answering the replay request sent.
    pub(super) fn reply(&mut self, env: &Env, frames: &[Vec<u8>]) {
        let mut actions = Vec::new();
        match parse_replay(frames) {
            Ok(ReplayItem::Batch(m)) => {
                self.follower
                    .replayed(m.seq, m.payload.to_vec(), &mut actions)
            }
            Ok(ReplayItem::End) => {
                self.deadline = None;
                self.follower.replay_ended(&mut actions);
            }
            Err(e) => self.bad_message(&format!("replay message: {e}")),
        }
        self.act(env, actions);
    }

    /// The replay request was sent now.
    pub(super) fn sent(&mut self, env: &Env) {
        self.deadline = Some(Instant::now() + env.cfg.replay_timeout);
    }

    /// Whether the replay sent is past its deadline at `now`.
    pub(super) fn overdue(&self, now: Instant) -> bool {
        self.deadline.is_some_and(|d| now >= d)
    }

    /// Whether a replay was sent and has not ended.
    pub(super) fn awaiting(&self) -> bool {
        self.deadline.is_some()
    }

    /// The replay sent took too long.
    pub(super) fn timed_out(&mut self, env: &Env) {
        self.deadline = None;
        let mut actions = Vec::new();
        self.follower.replay_timed_out(&mut actions);
        self.act(env, actions);
    }

    /// Whether a replay is under way (asked for, sent or answering).
    pub(super) fn replaying(&self) -> bool {
        self.follower.replaying()
    }

    /// The start of the replay to send, if one is wanted and not sent.
    pub(super) fn take_ask(&mut self) -> Option<u64> {
        self.ask.take()
    }

    /// Whether a replay is wanted and not sent yet.
    pub(super) fn asks(&self) -> bool {
        self.ask.is_some()
    }

    /// Clears the pod if gateways' receipts doubted it since the last look
    /// (see [`SubStats::doubt`]); its receipts start again with the clear.
    /// A doubt met while a replay runs waits for the next look. Returns
    /// whether it cleared.
    pub(super) fn heed(&mut self, env: &Env) -> bool {
        if !self.stats.take_doubt() {
            return false;
        }
        let mut actions = Vec::new();
        if !self.follower.doubted(&mut actions) {
            self.stats.doubt_again();
            return false;
        }
        self.act(env, actions);
        env.index.restart_receipts(&self.sub.pod);
        true
    }

    /// Notes the pod's view in `views` if it changed.
    pub(super) fn publish(&self, env: &Env, views: &mut Pending) {
        self.stats.set_replaying(self.follower.replaying());
        let period = env.cfg.learning_period;
        views.note(&self.sub.pod, &self.stats, period, &self.stop);
    }

    /// Counts and logs (rate-limited) a message that was skipped.
    pub(super) fn bad_message(&self, what: &str) {
        self.stats.decode_error();
        if self.stats.problem(Problem::Decode, what) {
            tracing::warn!(pod = %self.sub.pod, "skipped an engine message: {what}");
        }
    }

    /// Carries out the follower's decisions, in order.
    fn act(&mut self, env: &Env, actions: Vec<Action<Vec<u8>>>) {
        let mut queue: VecDeque<_> = actions.into();
        let mut more = Vec::new();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Apply { seq, payload } => {
                    if self.apply(env, seq, &payload) {
                        self.follower.orphaned(&mut more);
                        queue.extend(more.drain(..));
                    }
                }
                Action::Clear(why) => self.clear(env, why),
                Action::Gap { from, seq } => self.stats.gap(from, seq),
                Action::Replay { from } => {
                    self.stats.replay_asked();
                    self.ask = Some(from);
                }
            }
        }
        if !self.follower.replaying() {
            // Ended, or abandoned (too much held back, a hole in the
            // answer): nothing is awaited any more.
            self.ask = None;
            self.deadline = None;
        }
    }

    /// Decodes and applies one batch; returns whether a store was orphaned.
    fn apply(&self, env: &Env, seq: u64, payload: &[u8]) -> bool {
        let batch = match decode_batch(payload, &env.cfg.decode) {
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
        let out = apply_batch(
            &env.index,
            &self.sub,
            &self.engine,
            &batch,
            env.cfg.block_aliases,
        );
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

    fn clear(&self, env: &Env, why: Resync) {
        self.stats.resynced(why);
        let what = format!("resync: {why}");
        if self.stats.problem(Problem::Resync, &what) {
            tracing::warn!(pod = %self.sub.pod, "{what}; the pod is cleared and learnt again");
        }
        let mut engine = self.engine.lock();
        if let Err(e) = env.index.apply(
            &mut engine,
            &self.sub.pod,
            &self.sub.model,
            EngineOp::Cleared,
        ) {
            tracing::warn!(pod = %self.sub.pod, "clearing failed: {e}");
        }
    }
}
