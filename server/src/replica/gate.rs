//! The gate of a filling replica: writes held in order (a bounded queue)
//! and lookups refused until the restore is done and the held writes are
//! applied.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use prefix_proto::{ErrorCode, Op, OpKind, Reply};

use crate::metrics::Metrics;

/// Closed while the replica fills; open (the default) once the held writes
/// are applied.
#[derive(Debug, Default)]
pub(super) struct Gate {
    /// Set while filling; cleared once the held writes are applied.
    filling: AtomicBool,
    held: Mutex<Held>,
    /// Most weight held (see `ReplicaConfig::queue`).
    max_held: usize,
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
pub(super) const LAST_ROUND: usize = 1024;

impl Gate {
    /// A closed gate, holding writes up to a weight of `max_held`.
    pub(super) fn closed(max_held: usize) -> Gate {
        Gate {
            filling: AtomicBool::new(true),
            max_held,
            ..Gate::default()
        }
    }

    /// Whether it is still closed (the replica filling).
    pub(super) fn is_closed(&self) -> bool {
        // Acquire: pairs with the Release in `open`; a request that sees the
        // gate open also sees every held write applied.
        self.filling.load(Ordering::Acquire)
    }

    pub(super) fn admit(&self, op: &Op, metrics: &Metrics) -> Option<Reply> {
        if !self.is_closed() {
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
        } else if kind.looks_up() || kind == OpKind::Digest {
            // A digest of a partial index: a peer comparing with it would
            // take its gaps for the truth.
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
    pub(super) fn open(&self, mut apply: impl FnMut(Vec<Op>)) -> u64 {
        let mut applied = 0;
        loop {
            let mut held = self.held.lock();
            let batch = std::mem::take(&mut *held).ops;
            applied += batch.len() as u64;
            if batch.len() <= LAST_ROUND {
                if !batch.is_empty() {
                    apply(batch);
                }
                // Release: see `is_closed`. Under the lock, so `admit`
                // never holds a write after the last round.
                self.filling.store(false, Ordering::Release);
                return applied;
            }
            drop(held);
            apply(batch);
        }
    }
}
