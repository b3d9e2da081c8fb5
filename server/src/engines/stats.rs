//! Counters of one engine subscription: written by its thread, read by
//! metrics scrapes and `list-engines` (as the protocol's [`EngineStatus`]).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prefix_index::Applied;
use prefix_proto::EngineStatus;
use prefix_proto::PodView;

use super::apply::Outcome;
use super::view::ViewTracker;
use prefix_events::follow::Resync;

/// One subscription's counters. Every access is `Relaxed`: they are
/// statistics, read independently, never used to order other memory.
#[derive(Debug)]
pub struct SubStats {
    /// Whether the PUB socket is connected (the central collector: whether
    /// the pod's last message came within the idle period).
    pub connected: AtomicBool,
    /// Whether its socket could not be opened or connected (a bad
    /// endpoint, the process out of sockets or descriptors): nothing of the
    /// engine arrives until a retry succeeds.
    pub unfollowed: AtomicBool,
    /// Batches applied.
    pub batches: AtomicU64,
    /// Events applied.
    pub events: AtomicU64,
    /// Engine block copies stored.
    pub blocks_stored: AtomicU64,
    /// Engine block copies removed.
    pub blocks_removed: AtomicU64,
    /// Removals of blocks not held (ignored).
    pub unknown_removed: AtomicU64,
    /// Stores under an unknown parent.
    pub orphaned: AtomicU64,
    /// Stores past `max-key-blocks` or in a parent cycle.
    pub too_deep: AtomicU64,
    /// Events refused (wrong block size, token counts, record bound).
    pub refused: AtomicU64,
    /// Events of a tier not routed on.
    pub other_medium: AtomicU64,
    /// Events of an unknown type.
    pub unknown_events: AtomicU64,
    /// Engine blocks stored with an identity (salt, items, embeddings).
    pub identity_blocks: AtomicU64,
    /// Engine blocks whose identity could not be told (they match no key).
    pub untold_blocks: AtomicU64,
    /// Engine blocks stored in KV-cache groups the index does not model.
    pub unmodelled_blocks: AtomicU64,
    /// Engine blocks of skipping stores whose place could not be told.
    pub unresolved_blocks: AtomicU64,
    /// Messages that did not decode (framing or payload), and oversized ones.
    pub decode_errors: AtomicU64,
    /// Gaps in the live stream's sequence numbers (runs of lost batches),
    /// as the follower reports them.
    pub gaps: AtomicU64,
    /// Batches those gaps skipped (a replay may have brought them back).
    pub lost: AtomicU64,
    /// Replays asked for, whatever for.
    pub replays: AtomicU64,
    /// Resyncs, by [`Resync::LABELS`] order.
    pub resyncs: [AtomicU64; Resync::LABELS.len()],
    /// The last sequence number applied, plus one (0: none yet).
    pub last_seq: AtomicU64,
    /// Milliseconds between the last batch's `ts` and its arrival.
    pub lag_ms: AtomicI64,
    /// The latest problem, in words.
    last_error: Mutex<Option<String>>,
    /// How far the pod's answers can be trusted (`super::view`).
    view: Mutex<ViewTracker>,
    /// When each kind of problem was last logged.
    logged: Mutex<[Option<Instant>; 4]>,
    /// Gateways' receipts doubt the pod: its follower clears it at its
    /// next look (`--receipt-resync`).
    doubted: AtomicBool,
    /// When receipts last doubted it (ms since the Unix epoch; 0: never).
    doubted_at: AtomicU64,
}

impl Default for SubStats {
    fn default() -> Self {
        SubStats {
            connected: AtomicBool::default(),
            unfollowed: AtomicBool::default(),
            batches: AtomicU64::default(),
            events: AtomicU64::default(),
            blocks_stored: AtomicU64::default(),
            blocks_removed: AtomicU64::default(),
            unknown_removed: AtomicU64::default(),
            orphaned: AtomicU64::default(),
            too_deep: AtomicU64::default(),
            refused: AtomicU64::default(),
            other_medium: AtomicU64::default(),
            unknown_events: AtomicU64::default(),
            identity_blocks: AtomicU64::default(),
            untold_blocks: AtomicU64::default(),
            unmodelled_blocks: AtomicU64::default(),
            unresolved_blocks: AtomicU64::default(),
            decode_errors: AtomicU64::default(),
            gaps: AtomicU64::default(),
            lost: AtomicU64::default(),
            replays: AtomicU64::default(),
            resyncs: Default::default(),
            last_seq: AtomicU64::default(),
            lag_ms: AtomicI64::default(),
            last_error: Mutex::default(),
            view: Mutex::new(ViewTracker::new(Instant::now(), false)),
            logged: Mutex::default(),
            doubted: AtomicBool::default(),
            doubted_at: AtomicU64::default(),
        }
    }
}

impl SubStats {
    /// Asks the pod's follower to clear it and learn it again, unless
    /// receipts did within `hold` ms before `now` (the receipts of requests
    /// routed before that clear still arrive, and say nothing of the pod
    /// since). Returns whether it asked.
    pub fn doubt(&self, now: u64, hold: u64) -> bool {
        // Relaxed (both): a request the follower's thread reads at its
        // next look; no data travels with it. The swap makes one of two
        // receipts racing past the hold the one that asks.
        let last = self.doubted_at.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) < hold {
            return false;
        }
        if self.doubted_at.swap(now, Ordering::Relaxed) != last {
            return false;
        }
        self.doubted.store(true, Ordering::Relaxed);
        true
    }

    /// Asks again for a doubt its follower could not act on yet.
    pub(super) fn doubt_again(&self) {
        // Relaxed: as in `doubt`.
        self.doubted.store(true, Ordering::Relaxed);
    }

    /// Whether the pod was doubted since the last call.
    pub(super) fn take_doubt(&self) -> bool {
        // Relaxed: as in `doubt`.
        self.doubted.swap(false, Ordering::Relaxed)
    }
}

/// Kinds of problems whose logs are rate-limited apart.
#[derive(Debug, Clone, Copy)]
pub enum Problem {
    /// A message did not decode.
    Decode = 0,
    /// An event was refused.
    Refused = 1,
    /// A resync.
    Resync = 2,
    /// The socket (connect, receive).
    Socket = 3,
}

fn add(c: &AtomicU64, n: u64) {
    // Relaxed: a statistic (see the type's docs).
    c.fetch_add(n, Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    // Relaxed: a statistic (see the type's docs).
    c.load(Ordering::Relaxed)
}

/// Logs of one kind at most this often per subscription.
pub(super) const LOG_EVERY: Duration = Duration::from_secs(10);

/// Whether a log whose last one of its kind went out at `last` is due now
/// (the first always is, then one per [`LOG_EVERY`]); if so, marks it sent.
pub(super) fn log_due(last: &mut Option<Instant>) -> bool {
    let now = Instant::now();
    if last.is_some_and(|t| now.duration_since(t) < LOG_EVERY) {
        return false;
    }
    *last = Some(now);
    true
}

impl SubStats {
    /// Counts one applied batch.
    pub fn applied(&self, seq: u64, out: &Outcome, lag_ms: i64) {
        let a: &Applied = &out.applied;
        add(&self.batches, 1);
        add(&self.events, out.events);
        add(&self.blocks_stored, a.stored);
        add(&self.blocks_removed, a.removed);
        add(&self.unknown_removed, a.unknown);
        add(&self.orphaned, a.orphaned);
        add(&self.too_deep, a.too_deep);
        add(&self.refused, out.refused);
        add(&self.other_medium, out.other_medium);
        add(&self.unknown_events, out.unknown_events);
        add(&self.identity_blocks, out.identity.blocks);
        add(&self.untold_blocks, out.identity.untold);
        add(&self.unmodelled_blocks, a.unmodelled);
        add(&self.unresolved_blocks, a.unresolved);
        self.view.lock().applied(seq, a.cleared > 0, Instant::now());
        // Relaxed: statistics.
        self.last_seq
            .store(seq.saturating_add(1), Ordering::Relaxed);
        self.lag_ms.store(lag_ms, Ordering::Relaxed);
    }

    /// Counts a resync.
    pub fn resynced(&self, why: Resync) {
        self.view.lock().resynced(Instant::now());
        if let Some(i) = Resync::LABELS.iter().position(|l| *l == why.label()) {
            add(&self.resyncs[i], 1);
        }
    }

    /// Counts a gap in the live stream: batches `from..seq` never came.
    /// Only the follower tells a gap (`Action::Gap`): a replay may be asked
    /// for no gap at all, and a resync may follow a gap counted already.
    pub fn gap(&self, from: u64, seq: u64) {
        add(&self.gaps, 1);
        add(&self.lost, seq.saturating_sub(from));
    }

    /// Counts a replay request, whatever it is for: a gap, the check after
    /// a (re)connection, or the engine's whole buffer.
    pub fn replay_asked(&self) {
        add(&self.replays, 1);
    }

    /// Counts a message that did not decode.
    pub fn decode_error(&self) {
        add(&self.decode_errors, 1);
    }

    /// Counts the events of a batch that did not decode (skipped alone)
    /// and records why the first did not; returns whether to log it now.
    pub fn bad_events(&self, seq: u64, bad: &prefix_events::BadEvents) -> Option<String> {
        add(&self.decode_errors, u64::from(bad.count));
        let what = format!(
            "batch {seq}: {} event(s) that did not decode skipped: {}",
            bad.count, bad.first
        );
        self.problem(Problem::Decode, &what).then_some(what)
    }

    /// Records a problem; returns whether to log it now (the first of its
    /// kind, then at most once per 10 s, so a bad engine cannot flood logs).
    pub fn problem(&self, kind: Problem, what: &str) -> bool {
        *self.last_error.lock() = Some(what.to_string());
        log_due(&mut self.logged.lock()[kind as usize])
    }

    /// Sets the connection state.
    pub fn set_connected(&self, up: bool) {
        // Relaxed: a statistic.
        self.connected.store(up, Ordering::Relaxed);
        self.view.lock().set_connected(up);
    }

    /// Sets whether the engine's socket failed (`unfollowed`).
    pub fn set_unfollowed(&self, failed: bool) {
        // Relaxed: a statistic.
        self.unfollowed.store(failed, Ordering::Relaxed);
    }

    /// Starts following from `resume`, the last batch the pod's records
    /// hold (restored from a snapshot, or left by the subscription this one
    /// replaces), if any: the follower resumes from it, so `list-engines`
    /// shows it as `last_seq` until the next batch is applied.
    pub fn following(&self, resume: Option<u64>) {
        *self.view.lock() = ViewTracker::new(Instant::now(), resume.is_some());
        if let Some(seq) = resume {
            // Relaxed: a statistic.
            self.last_seq
                .store(seq.saturating_add(1), Ordering::Relaxed);
        }
    }

    /// Sets whether a replay runs.
    pub fn set_replaying(&self, on: bool) {
        self.view.lock().set_replaying(on);
    }

    /// The pod's view if it changed since it was last taken (learning
    /// lasting at most `period`); taken so (see `view::Pending`).
    pub fn changed_view(&self, period: Duration) -> Option<PodView> {
        self.view.lock().changed(Instant::now(), period)
    }

    /// The view last taken for the index (it reaches lookups within
    /// `view::Pending::EVERY`).
    pub fn view(&self) -> Option<PodView> {
        self.view.lock().published()
    }

    /// What the follower has seen, for listing.
    pub fn state(&self) -> EngineStatus {
        // Relaxed (all loads): statistics.
        let last = self.last_seq.load(Ordering::Relaxed);
        EngineStatus {
            connected: self.connected.load(Ordering::Relaxed),
            last_seq: last.checked_sub(1),
            events: get(&self.events),
            blocks_stored: get(&self.blocks_stored),
            blocks_removed: get(&self.blocks_removed),
            resyncs: self.resyncs.iter().map(get).sum(),
            replays: get(&self.replays),
            orphaned: get(&self.orphaned),
            decode_errors: get(&self.decode_errors),
            lag_ms: self.lag_ms.load(Ordering::Relaxed),
            last_error: self.last_error.lock().clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gaps and lost batches come from the follower's reports alone:
    /// replays asked (for a gap, a reconnection's check or the whole
    /// buffer) and resyncs (a replay hole after a gap counted, say) add
    /// none.
    #[test]
    fn gaps_are_counted_apart_from_replays_and_resyncs() {
        let s = SubStats::default();
        s.gap(2, 4);
        for _ in 0..3 {
            s.replay_asked();
        }
        s.resynced(Resync::ReplayHole { from: 2, seq: 3 });
        assert_eq!((get(&s.gaps), get(&s.lost), get(&s.replays)), (1, 2, 3));
        let state = s.state();
        assert_eq!((state.replays, state.resyncs), (3, 1));
    }

    /// Each reason is counted in its own series, at its place in
    /// `Resync::LABELS`.
    #[test]
    fn resyncs_are_counted_by_reason() {
        let s = SubStats::default();
        s.resynced(Resync::ReplayTooShort { last: 4, first: 7 });
        let at = |label: &str| Resync::LABELS.iter().position(|l| *l == label).unwrap();
        assert_eq!(get(&s.resyncs[at("replay_too_short")]), 1);
        assert_eq!(get(&s.resyncs[at("restart")]), 0);
    }

    /// A subscription resuming from a last batch lists it before any batch
    /// comes; one with nothing to resume from lists none.
    #[test]
    fn a_resumed_subscription_lists_the_batch_it_resumes_from() {
        let s = SubStats::default();
        s.following(None);
        assert_eq!(s.state().last_seq, None);
        s.following(Some(41));
        assert_eq!(s.state().last_seq, Some(41));
    }
}
