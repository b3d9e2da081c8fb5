//! This server as a replica of a model's set: the gate that holds writes
//! and refuses lookups while it fills itself from a peer (`gate`), the one
//! snapshot it may be sending to a peer (`sender`), the writes it keeps for
//! peers that filled from it (`tail`), and how the last fill went. Filling
//! itself is `bootstrap.rs`; repair, `repair.rs`.

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
}

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

    /// What to answer `op` instead of applying it, while filling: writes are
    /// held (answered `Done`, or refused once the queue is full), lookups
    /// refused; `None` means apply it now.
    pub fn admit(&self, op: &Op, metrics: &Metrics) -> Option<Reply> {
        self.gate.admit(op, metrics)
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
        assert!(refused(gate.admit(&lookup, &m)));
        assert!(refused(gate.admit(&detail, &m)));
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
