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
use std::sync::Arc;

use parking_lot::Mutex;
use prefix_proto::{Op, Reply, ANSWER_ROOM, MAX_TAIL};

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

/// What a kept write costs beside its key and names, in key blocks (8
/// bytes each): the op, its allocations' headers and its place in the
/// list, about 128 bytes.
pub const OP_OVERHEAD: usize = 16;

/// The weight a kept write counts for, in key blocks: its key, its names
/// (8 bytes a block) and [`OP_OVERHEAD`], so that `--tail-queue` bounds
/// the memory of a queue of one-block inserts with long names too.
fn kept(op: &Op) -> usize {
    let names = match op {
        Op::Insert { model, pod, .. } => model.len() + pod.len(),
        Op::RemovePod { pod } | Op::SetPodCapacity { pod, .. } => pod.len(),
        _ => 0,
    };
    op.weight() + names.div_ceil(8) + OP_OVERHEAD
}

#[derive(Debug, Default)]
struct Log {
    /// The position of `ops[0]`.
    first: u64,
    /// Shared with the answers that copy them out (outside the lock).
    ops: VecDeque<Arc<Op>>,
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
        let (op, weight) = (Arc::new(op.clone()), kept(op));
        let mut log = self.log.lock();
        log.weight += weight;
        log.ops.push_back(op);
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
            // Nobody asked for a whole window: what was kept is dropped,
            // and writes went unkept since. Positions go on one past where
            // they were, so that an asker from before sees a gap (at least
            // one write lost) rather than nothing.
            let next = log.next() + 1;
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
        let start = asked.max(log.first).min(log.next());
        let skip = (start - log.first) as usize;
        // Within the answer's room: a write takes about 10 bytes a block of
        // its key, and its names.
        let mut room = ANSWER_ROOM;
        let shared: Vec<Arc<Op>> = log
            .ops
            .iter()
            .skip(skip)
            .take(max.clamp(1, MAX_TAIL) as usize)
            .take_while(|op| {
                room = room.saturating_sub(kept(op) * 10);
                room > 0
            })
            .cloned()
            .collect();
        drop(log);
        let next = start + shared.len() as u64;
        Reply::Writes {
            from: start,
            next,
            ops: shared.iter().map(|op| Op::clone(op)).collect(),
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
        assert_eq!((from, next, ops.len()), (1, 1, 0), "nothing kept before");
        for k in 1..=3 {
            t.record(&insert(k), 20);
        }
        let (from, next, ops) = writes(t.answer(Some(1), 2, 30));
        assert_eq!((from, next), (1, 3));
        assert_eq!(ops, vec![insert(1), insert(2)]);
        let (from, next, ops) = writes(t.answer(Some(next), 10, 40));
        assert_eq!((from, next, ops), (3, 4, vec![insert(3)]));
    }

    #[test]
    fn past_its_bound_the_oldest_are_dropped_and_reported_lost() {
        let t = Tail::new(3 * kept(&insert(0)), 1000);
        let (_, start, _) = writes(t.answer(None, 1, 0));
        for k in 0..5 {
            t.record(&insert(k), 1);
        }
        let (from, next, ops) = writes(t.answer(Some(start), 10, 2));
        assert_eq!((from, next), (start + 2, start + 5), "two lost");
        assert_eq!(ops, vec![insert(2), insert(3), insert(4)]);
    }

    #[test]
    fn writes_stop_being_kept_a_window_after_the_last_ask() {
        let t = Tail::new(100, 1000);
        let (_, start, _) = writes(t.answer(None, 1, 0));
        t.record(&insert(1), 500);
        t.record(&insert(2), 1500);
        let (from, next, ops) = writes(t.answer(Some(start), 10, 1600));
        // The window lapsed: what was kept is dropped (insert 1), insert 2
        // went unkept, and the asker is told it lost writes.
        assert!(from > start + 1, "{from} {start}");
        assert_eq!((next, ops.len()), (from, 0));
    }
}
