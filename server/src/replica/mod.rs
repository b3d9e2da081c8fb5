//! This server as a replica of a model's set: the gate that holds writes
//! and refuses lookups while it fills itself from a peer (`gate`), the one
//! snapshot it may be sending to a peer (`sender`), the writes it keeps for
//! peers that filled from it (`tail`), and how the last fill went. Filling
//! itself is `bootstrap.rs`; repair, `repair/`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prefix_proto::{Op, Reply};

use crate::metrics::Metrics;

pub mod config;
mod gate;
pub mod removals;
mod sender;
pub mod tail;

use gate::Gate;
use removals::Removals;
use sender::Sender;
pub use sender::Sending;
use tail::Tail;

/// A peer whose snapshot was not restored, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// The peer, as configured.
    pub peer: String,
    /// What went wrong (a `FillError` of `bootstrap.rs`, in words).
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
    /// Whether asking ended because every peer said it was cold (a new
    /// set), rather than with a snapshot or at `--bootstrap-timeout`.
    pub new_set: bool,
}

/// This server as a replica: whether it is still filling from a peer (then
/// writes are held and lookups refused), and the one snapshot it may be
/// sending to a peer.
#[derive(Debug, Default)]
pub struct Replica {
    gate: Gate,
    sender: Sender,
    report: Mutex<Option<FillReport>>,
    /// While filling: whether it keeps a snapshot of its own (too old to
    /// start from), which it serves if no peer gives a fresher one.
    holds_own: bool,
    /// The writes kept for peers that filled from this one.
    tail: Tail,
    /// The pods removed lately (what repair must not copy back).
    pub removals: Removals,
    /// Whether it is catching up with its peers: 0 when not, else since
    /// when (ms since the epoch); see [`Replica::behind`].
    catching_up: AtomicU64,
    /// When the repair task last ticked (0 before it runs): a pause shows
    /// as a gap.
    last_tick: AtomicU64,
    /// Per peer, since when its rounds of repair fail (ms since the
    /// epoch); none while they answer.
    failing: Mutex<Vec<Option<u64>>>,
}

/// A gap between the repair task's ticks (every 100 ms) longer than this
/// is a pause of the server (stopped, stalled, its VM paused): it may have
/// missed writes, and catches up. Two seconds: a busy server's timers lag
/// far less, and writes missed in a shorter pause reach it by the next
/// rounds of repair, 2 to 3 s later.
pub const PAUSED: Duration = Duration::from_secs(2);

/// The least a catch-up lasts: the gateways' clients reconnect to a
/// server back from a pause or partition within two seconds (their
/// backoff), and the writes they sent it meanwhile may be lost; a round
/// that starts this long (and [`SETTLE`](crate::repair::compare::SETTLE),
/// what a round leaves out) after the catch-up began copies them too.
pub const CATCH_UP: Duration = Duration::from_secs(3);

impl Replica {
    /// A replica that serves at once.
    pub fn serving() -> Arc<Replica> {
        Arc::default()
    }

    /// A replica as `cfg` says, of an index configured as `index`: filling
    /// itself first if `filling` (with a snapshot of its own to fall back
    /// on or not), keeping its writes for peers as `cfg`'s tail settings
    /// say.
    pub fn new(
        cfg: &config::ReplicaConfig,
        index: &prefix_index::IndexConfig,
        filling: Option<bool>,
    ) -> Arc<Replica> {
        Arc::new(Replica {
            gate: match filling {
                Some(_) => Gate::closed(cfg.queue),
                None => Gate::default(),
            },
            holds_own: filling == Some(true),
            tail: Tail::new(cfg.tail_queue, cfg.tail_window.as_millis() as u64),
            removals: Removals::for_index(index),
            ..Replica::default()
        })
    }

    /// Keeps an applied write (answered `reply`) for the peers following
    /// the tail, and the removal of a pod that was there for repair.
    pub fn record(&self, op: &Op, reply: &Reply, now: u64) {
        self.tail.record(op, now);
        if let (Op::RemovePod { pod }, Reply::Removed(true)) = (op, reply) {
            self.removals.record(pod, now);
        }
    }

    /// Answers `Op::Tail`.
    pub fn tail(&self, from: Option<u64>, max: u32, now: u64) -> Reply {
        self.tail.answer(from, max, now)
    }

    /// A replica that fills itself first, holding writes up to a weight of
    /// `max_held` (`--bootstrap-queue`), with a snapshot of its own to fall
    /// back on or not (`holds_own`).
    pub fn filling(max_held: usize, holds_own: bool) -> Arc<Replica> {
        Arc::new(Replica {
            gate: Gate::closed(max_held),
            holds_own,
            ..Replica::default()
        })
    }

    /// Whether it is still filling.
    pub fn is_filling(&self) -> bool {
        self.gate.is_closed()
    }

    /// How the last fill went, once it is over.
    pub fn report(&self) -> Option<FillReport> {
        self.report.lock().clone()
    }

    /// Keeps how the fill went, for [`Replica::report`].
    pub(crate) fn set_report(&self, report: FillReport) {
        *self.report.lock() = Some(report);
    }

    /// What to answer `op` at `now` instead of applying it: while filling,
    /// writes are held (answered `Done`, or refused once the queue is
    /// full), lookups and digest questions refused; while
    /// [`Replica::behind`], lookups refused; `None` means apply it now.
    pub fn admit(&self, op: &Op, metrics: &Metrics, now: u64) -> Option<Reply> {
        let held = self.gate.admit(op, metrics);
        if held.is_some() || !op.kind().looks_up() {
            return held;
        }
        self.behind(now).then(|| {
            prefix_proto::ErrorCode::Unavailable.reply(
                "this replica is catching up with its peers after a time without them (a \
                 partition, a pause): ask another replica",
            )
        })
    }

    /// Whether this server is behind its peers at `now`: back from a
    /// pause (a gap of more than [`PAUSED`] since the repair task last
    /// ticked, seen at once by the lookups themselves) or from a time cut
    /// off from every peer (of two or more), and not yet caught up: a
    /// round of repair that began at least [`CATCH_UP`] and
    /// [`SETTLE`](crate::repair::compare::SETTLE) later has compared
    /// everything with a peer. Lookups are then refused, as while filling.
    /// A server whose every peer has failed its rounds for [`PAUSED`]
    /// answers what it holds (a catch-up under way ends: nothing is
    /// better than its own index then), and one whose repair is off never
    /// counts itself behind.
    pub fn behind(&self, now: u64) -> bool {
        // Relaxed, both: a hint; the lookups it gates read the index as
        // it is.
        let tick = self.last_tick.load(Ordering::Relaxed);
        self.catching_up.load(Ordering::Relaxed) != 0
            || (tick != 0 && now.saturating_sub(tick) > PAUSED.as_millis() as u64)
    }

    /// The repair task ticks at `now`; after a pause, the server catches
    /// up.
    pub fn tick(&self, now: u64) {
        // Relaxed: see `behind`.
        let last = self.last_tick.swap(now, Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) > PAUSED.as_millis() as u64 {
            self.begin_catch_up(now);
        }
    }

    /// Peer `peer` (of `peers`) answered a round of repair at `now`, or
    /// did not. A server whose every peer has failed for [`PAUSED`] is cut
    /// off: it stops any catch-up and answers what it holds; reaching a
    /// peer again then starts a catch-up, if it has two peers or more
    /// (with one, either side may have been the one cut off, and the
    /// rounds that follow copy what differs anyway).
    pub fn answered(&self, peer: usize, peers: usize, ok: bool, now: u64) {
        let mut failing = self.failing.lock();
        if failing.len() != peers {
            // Until told otherwise, every peer is taken as reachable: a
            // server starting is not back from anything.
            *failing = vec![None; peers];
        }
        let paused = PAUSED.as_millis() as u64;
        let cut_off = |f: &[Option<u64>]| {
            f.iter()
                .all(|since| since.is_some_and(|t| now.saturating_sub(t) > paused))
        };
        let was_cut_off = cut_off(&failing);
        match ok {
            true => failing[peer] = None,
            false => {
                failing[peer].get_or_insert(now);
            }
        }
        if ok && was_cut_off && peers >= 2 {
            self.begin_catch_up(now);
        } else if !ok && cut_off(&failing) {
            // Relaxed: see `behind`.
            self.catching_up.store(0, Ordering::Relaxed);
        }
    }

    fn begin_catch_up(&self, now: u64) {
        // Relaxed: see `behind`. A catch-up under way starts again from
        // now: what it began to compare may predate what was missed since.
        if self.catching_up.swap(now.max(1), Ordering::Relaxed) == 0 {
            tracing::info!("back from a pause or from a time without peers: catching up with them before answering lookups");
        }
    }

    /// A round of repair that began at `started` compared everything with
    /// a peer: the catch-up ends if the round began [`CATCH_UP`] and
    /// [`SETTLE`](crate::repair::compare::SETTLE) after it (its window
    /// then holds every write the gateways may have lost).
    pub fn caught_up(&self, started: u64) {
        // Relaxed: see `behind`.
        let since = self.catching_up.load(Ordering::Relaxed);
        let least = (CATCH_UP + crate::repair::compare::SETTLE).as_millis() as u64;
        if since != 0 && started >= since + least {
            // Relaxed: see `behind`. It fails when a catch-up began since
            // (a new pause): that one must run its own course.
            let _ =
                self.catching_up
                    .compare_exchange(since, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }

    /// Whether it is catching up.
    pub fn is_catching_up(&self) -> bool {
        // Relaxed: see `behind`.
        self.catching_up.load(Ordering::Relaxed) != 0
    }

    /// Applies the held writes with `apply`, oldest first, then opens the
    /// gate; returns how many there were.
    pub fn open(&self, apply: impl FnMut(Vec<Op>)) -> u64 {
        self.gate.open(apply)
    }

    /// Starts sending a snapshot, unless one is being sent or the server is
    /// still filling (it has none to give yet): the refusal then, `Cold`
    /// when it holds nothing at all (see `bootstrap.rs`).
    pub fn send(self: &Arc<Self>) -> Result<Sending, Reply> {
        if self.is_filling() {
            return Err(match self.holds_own {
                true => prefix_proto::ErrorCode::Unavailable.reply(
                    "this replica is filling itself from a peer: it has no snapshot to give yet",
                ),
                false => prefix_proto::ErrorCode::Cold.reply(
                    "this replica is filling itself from its peers and holds nothing of its own",
                ),
            });
        }
        self.sender.start(self.clone())
    }
}

#[cfg(test)]
mod tests {
    use prefix_proto::message::POD_TABLE_WEIGHT;
    use prefix_proto::ErrorCode;

    use super::gate::LAST_ROUND;
    use super::*;

    fn insert(n: u64) -> Op {
        Op::Insert {
            model: "m".into(),
            key: vec![n],
            pod: "p".into(),
        }
    }

    #[test]
    fn a_replica_back_from_a_pause_or_partition_refuses_lookups_until_caught_up() {
        let m = Metrics::default();
        let r = Replica::default();
        let lookup = Op::LookupTiers {
            model: "m".into(),
            key: vec![1],
            candidates: None,
        };
        let refused = |r: &Replica| matches!(r.admit(&lookup, &m, crate::clock::now_ms()), Some(Reply::Error { code, .. }) if code == ErrorCode::Unavailable as u16);
        assert!(!refused(&r), "no tick yet: repair may be off");
        let now = crate::clock::now_ms();
        let least = (CATCH_UP + crate::repair::compare::SETTLE).as_millis() as u64;
        // Paused: the lookups see the gap before the task ticks again.
        r.tick(now - 5_000);
        assert!(refused(&r), "paused for 5 s");
        assert_eq!(r.admit(&insert(1), &m, now), None, "writes are applied");
        // The tick a moment ago: not paused.
        let fresh = Replica::default();
        fresh.tick(now - 1_000);
        assert!(!refused(&fresh));
        r.tick(now);
        assert!(refused(&r) && r.is_catching_up(), "catching up");
        // A round begun before the catch-up's least time does not end it.
        r.caught_up(now + least - 1);
        assert!(refused(&r));
        r.caught_up(now + least);
        assert!(!refused(&r), "caught up");
        // Peers failing for a moment (a restart, a blip): nothing changes.
        r.answered(0, 2, false, now);
        r.answered(1, 2, false, now);
        r.answered(1, 2, true, now + 100);
        assert!(!refused(&r));
        // Cut off from both for longer, then one answers: catching up.
        let later = now + 10_000;
        r.answered(0, 2, false, later);
        r.answered(1, 2, false, later);
        r.answered(0, 2, false, later + 3_000);
        assert!(
            !refused(&r),
            "cut off from every peer: it answers what it has"
        );
        r.answered(1, 2, true, later + 3_010);
        assert!(refused(&r), "back: catching up");
        r.caught_up(later + 3_010 + least);
        assert!(!refused(&r));
        // A catch-up under way ends when every peer fails for long.
        r.tick(later + 20_000);
        r.tick(later + 30_000);
        assert!(r.is_catching_up());
        r.answered(0, 2, false, later + 30_000);
        r.answered(1, 2, false, later + 30_000);
        r.answered(0, 2, false, later + 33_000);
        assert!(!r.is_catching_up(), "no peer to catch up with");
        // With one peer, reaching it again does not count.
        let pair = Replica::default();
        pair.answered(0, 1, false, now);
        pair.answered(0, 1, false, now + 3_000);
        pair.answered(0, 1, true, now + 3_010);
        assert!(!pair.is_catching_up());
    }

    #[test]
    fn while_filling_writes_are_held_in_order_and_lookups_refused() {
        let m = Metrics::default();
        let n = LAST_ROUND as u64 + 100;
        // Room for `n` one-block inserts and one pod-table change.
        let gate = Replica::filling(n as usize + POD_TABLE_WEIGHT, true);
        let lookup = Op::Lookup {
            model: "m".into(),
            key: vec![1],
            candidates: None,
        };
        let refused = |r: Option<Reply>| matches!(r, Some(Reply::Error { code, .. }) if code == ErrorCode::Unavailable as u16);
        let detail = Op::LookupDetail {
            model: "m".into(),
            key: vec![1],
            candidates: None,
        };
        assert!(refused(gate.admit(&lookup, &m, 0)));
        assert!(refused(gate.admit(&detail, &m, 0)));
        assert_eq!(gate.admit(&Op::Ping, &m, 0), None);
        for k in 0..n {
            assert_eq!(gate.admit(&insert(k), &m, 0), Some(Reply::Done));
        }
        let remove = Op::RemovePod { pod: "p".into() };
        assert_eq!(gate.admit(&remove, &m, 0), Some(Reply::Removed(true)));
        // The queue is full by weight: one more block is refused, not held.
        assert!(refused(gate.admit(&insert(n), &m, 0)));
        assert!(refused(gate.send().err()));
        let mut rounds = Vec::new();
        let applied = gate.open(|ops| {
            // A write that arrives while a round is applied (outside the
            // lock: the round is large) is held and applied after it.
            if rounds.is_empty() {
                assert_eq!(gate.admit(&insert(n + 1), &m, 0), Some(Reply::Done));
            }
            rounds.push(ops);
        });
        let mut want: Vec<Op> = (0..n).map(insert).collect();
        want.push(remove);
        assert_eq!(rounds[0], want);
        assert_eq!(rounds[1..], [vec![insert(n + 1)]]);
        assert_eq!(applied, n + 2);
        assert!(!gate.is_filling());
        assert_eq!(gate.admit(&insert(5), &m, 0), None);
        assert_eq!(gate.admit(&lookup, &m, 0), None);
    }

    #[test]
    fn a_filling_replica_with_nothing_of_its_own_says_it_is_cold() {
        let code = |r: &Arc<Replica>| match r.send() {
            Err(Reply::Error { code, .. }) => ErrorCode::from_u16(code),
            _ => None,
        };
        assert_eq!(code(&Replica::filling(1, false)), Some(ErrorCode::Cold));
        assert_eq!(
            code(&Replica::filling(1, true)),
            Some(ErrorCode::Unavailable)
        );
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
