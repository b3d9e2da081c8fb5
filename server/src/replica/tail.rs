//! The writes a server keeps for peers that filled themselves from its
//! snapshot: its **tail**, each write at a position, in the order applied.
//!
//! A filling replica asks for the tail's next position before it asks for
//! the snapshot (`Op::Tail` without `from`), so every write applied after
//! that point is either in the snapshot or in the tail, or both (inserts
//! and pod removals are idempotent: applying one twice is harmless). It
//! then reads the tail from that position until its window ends.
//!
//! Nothing is kept while nobody asks: a write costs one atomic load then.
//! Each ask keeps writes for `--tail-window` more; at most `--tail-queue`
//! of weight is kept (each write's key blocks and [`OP_OVERHEAD`]), the
//! oldest dropped first, and an asker behind them is
//! answered from the oldest kept (its `from` past the one asked: those are
//! lost to it).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use prefix_proto::{Op, Reply, MAX_FRAME_CEILING, MAX_TAIL};

/// A server's kept writes.
#[derive(Debug)]
pub struct Tail {
    /// Until when (ms since the epoch) writes are kept; 0: not kept.
    keep_until: AtomicU64,
    log: Mutex<Log>,
    /// Most weight kept (`--tail-queue`).
    max_weight: usize,
    /// How long each ask keeps writes (`--tail-window`), in ms.
    window_ms: u64,
}

/// What a kept write costs beside its own weight, in key blocks (8 bytes
/// each): its names and the list around it, about 128 bytes. A queue of
/// one-block inserts is bounded by its memory, not by its hashes alone.
pub const OP_OVERHEAD: usize = 16;

/// The weight a kept write counts for.
fn kept(op: &Op) -> usize {
    op.weight() + OP_OVERHEAD
}

#[derive(Debug, Default)]
struct Log {
    /// The position of `ops[0]`.
    first: u64,
    ops: VecDeque<Op>,
    /// Their weight ([`kept`]), what `max_weight` bounds.
    weight: usize,
}

impl Log {
    fn next(&self) -> u64 {
        self.first + self.ops.len() as u64
    }
}

impl Default for Tail {
    /// As `ReplicaConfig::default` sets it.
    fn default() -> Tail {
        let d = super::config::ReplicaConfig::default();
        Tail::new(d.tail_queue, d.tail_window.as_millis() as u64)
    }
}

impl Tail {
    /// A tail keeping up to `max_weight`, for `window_ms` after each ask.
    pub fn new(max_weight: usize, window_ms: u64) -> Tail {
        Tail {
            keep_until: AtomicU64::new(0),
            log: Mutex::default(),
            max_weight,
            window_ms,
        }
    }

    /// Keeps `op` (an applied write) if a peer follows the tail at `now`.
    pub fn record(&self, op: &Op, now: u64) {
        // Relaxed: a write that races the first ask may or may not be
        // kept; the asker takes the snapshot after its ask, so such a
        // write is in the snapshot either way.
        if now >= self.keep_until.load(Ordering::Relaxed) {
            return;
        }
        let mut log = self.log.lock();
        log.weight += kept(op);
        log.ops.push_back(op.clone());
        while log.weight > self.max_weight {
            let Some(old) = log.ops.pop_front() else {
                break;
            };
            log.weight -= kept(&old);
            log.first += 1;
        }
    }

    /// Answers `Op::Tail { from, max }` at `now`, and keeps writes for the
    /// window from now on.
    pub fn answer(&self, from: Option<u64>, max: u32, now: u64) -> Reply {
        let mut log = self.log.lock();
        let until = now.saturating_add(self.window_ms);
        // Under the lock, so that `record` never keeps a write into a log
        // this call is about to clear. Relaxed: the lock orders it.
        let was = self.keep_until.swap(until, Ordering::Relaxed);
        if now >= was {
            // Nobody asked for a whole window: what was kept is stale, and
            // positions go on from where they were.
            let next = log.next();
            *log = Log {
                first: next,
                ..Log::default()
            };
        }
        let Some(asked) = from else {
            let next = log.next();
            return Reply::Writes {
                from: next,
                next,
                ops: Vec::new(),
            };
        };
        let start = asked.max(log.first);
        let skip = (start - log.first) as usize;
        // Within a quarter of the largest answer, as `SampleKeys`: a write
        // of the longest key takes about 10 bytes a block.
        let mut room = MAX_FRAME_CEILING as usize / 4;
        let ops: Vec<Op> = log
            .ops
            .iter()
            .skip(skip)
            .take(max.clamp(1, MAX_TAIL) as usize)
            .take_while(|op| {
                room = room.saturating_sub(op.weight() * 10 + 64);
                room > 0
            })
            .cloned()
            .collect();
        Reply::Writes {
            from: start.min(log.next()),
            next: start.min(log.next()) + ops.len() as u64,
            ops,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn insert(k: u64) -> Op {
        Op::Insert {
            model: "m".into(),
            key: vec![k],
            pod: "p".into(),
        }
    }

    fn writes(r: Reply) -> (u64, u64, Vec<Op>) {
        match r {
            Reply::Writes { from, next, ops } => (from, next, ops),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn writes_after_the_first_ask_are_kept_in_order() {
        let t = Tail::new(100, 1000);
        t.record(&insert(0), 5);
        let (from, next, ops) = writes(t.answer(None, 10, 10));
        assert_eq!((from, next, ops.len()), (0, 0, 0), "nothing kept before");
        for k in 1..=3 {
            t.record(&insert(k), 20);
        }
        let (from, next, ops) = writes(t.answer(Some(0), 2, 30));
        assert_eq!((from, next), (0, 2));
        assert_eq!(ops, vec![insert(1), insert(2)]);
        let (from, next, ops) = writes(t.answer(Some(next), 10, 40));
        assert_eq!((from, next, ops), (2, 3, vec![insert(3)]));
    }

    #[test]
    fn past_its_bound_the_oldest_are_dropped_and_reported_lost() {
        let t = Tail::new(3 * (1 + OP_OVERHEAD), 1000);
        t.answer(None, 1, 0);
        for k in 0..5 {
            t.record(&insert(k), 1);
        }
        let (from, next, ops) = writes(t.answer(Some(0), 10, 2));
        assert_eq!((from, next), (2, 5), "positions 0 and 1 lost");
        assert_eq!(ops, vec![insert(2), insert(3), insert(4)]);
    }

    #[test]
    fn writes_stop_being_kept_a_window_after_the_last_ask() {
        let t = Tail::new(100, 1000);
        t.answer(None, 1, 0);
        t.record(&insert(1), 500);
        t.record(&insert(2), 1500);
        let (from, next, ops) = writes(t.answer(Some(0), 10, 1600));
        // The window lapsed: what was kept is dropped, and the asker is
        // told it starts past it.
        assert_eq!((from, next, ops.len()), (1, 1, 0));
    }
}
