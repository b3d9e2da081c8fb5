//! How far an engine-fed pod's answers can be trusted, from what its
//! follower sees, without I/O: the [`PodView`] detailed lookups report.
//!
//! - **Exact** once the follower has seen the engine's cache from a known
//!   state: a batch numbered 0 (an engine instance from its start, its
//!   cache empty, live or replayed), an `AllBlocksCleared`, or, for a pod
//!   restored from a snapshot, the first batch after the snapshot's last
//!   (the follower applies only the next number, or resyncs first).
//! - **Learning** from the start until then, and after every resync (a
//!   gap without replay, a restart seen late, a replay that failed): the
//!   engine may hold blocks the index never heard of. Their number shrinks
//!   as the engine evicts them; after `--learning-period` the pod counts
//!   as exact again, the period being the operator's estimate of how long
//!   the engine's cache takes to turn over.
//! - **Replaying** while a replay runs, **Disconnected** while the socket
//!   is not connected: they override the two above.

use std::time::{Duration, Instant};

use prefix_proto::PodView;
use tokio_util::sync::CancellationToken;

/// What the follower has proven about the pod's blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Base {
    /// They are the engine's cache.
    Exact,
    /// They may lack blocks the engine holds, since `since`; `first` until
    /// any batch is applied.
    Learning { since: Instant, first: bool },
}

/// One subscription's view (see the module docs).
#[derive(Debug, Clone)]
pub struct ViewTracker {
    base: Base,
    /// The pod's blocks came from a snapshot that holds its last batch.
    restored: bool,
    replaying: bool,
    connected: bool,
    /// The view last given to the index.
    published: Option<PodView>,
}

impl ViewTracker {
    /// A pod followed from `now`, its blocks restored from a snapshot that
    /// holds its last batch or not.
    pub fn new(now: Instant, restored: bool) -> Self {
        ViewTracker {
            base: Base::Learning {
                since: now,
                first: true,
            },
            restored,
            replaying: false,
            // A socket connects after its thread starts: not connected
            // until its monitor says so.
            connected: false,
            published: None,
        }
    }

    /// A batch numbered `seq` was applied; `cleared` if it held an
    /// `AllBlocksCleared`.
    pub fn applied(&mut self, seq: u64, cleared: bool, now: Instant) {
        self.base = match self.base {
            Base::Exact => Base::Exact,
            _ if seq == 0 || cleared => Base::Exact,
            Base::Learning { first: true, .. } if self.restored => Base::Exact,
            Base::Learning { since, .. } => Base::Learning {
                since: since.min(now),
                first: false,
            },
        };
    }

    /// The pod was cleared to be learnt again.
    pub fn resynced(&mut self, now: Instant) {
        self.base = Base::Learning {
            since: now,
            first: false,
        };
    }

    /// Whether a replay runs.
    pub fn set_replaying(&mut self, on: bool) {
        self.replaying = on;
    }

    /// Whether the engine's socket is connected.
    pub fn set_connected(&mut self, up: bool) {
        self.connected = up;
    }

    /// The view at `now`, learning lasting at most `period`.
    pub fn view(&self, now: Instant, period: Duration) -> PodView {
        if !self.connected {
            return PodView::Disconnected;
        }
        if self.replaying {
            return PodView::Replaying;
        }
        match self.base {
            Base::Exact => PodView::Exact,
            Base::Learning { since, .. } if now.duration_since(since) >= period => PodView::Exact,
            Base::Learning { .. } => PodView::Learning,
        }
    }

    /// The view last published.
    pub fn published(&self) -> Option<PodView> {
        self.published
    }

    /// The view at `now` if it differs from the one last published, which
    /// it becomes.
    pub fn changed(&mut self, now: Instant, period: Duration) -> Option<PodView> {
        let view = self.view(now, period);
        (self.published != Some(view)).then(|| {
            self.published = Some(view);
            view
        })
    }
}

/// Views that changed and are not yet given to the index, given in one
/// step ([`prefix_index::Index::set_views`]) at most once per
/// [`Pending::EVERY`]: the pods' views are one map the index copies on
/// each change, so engines changing together (a fleet connecting) cost
/// one copy, not one each.
/// A view noted is given only if its subscription is still on then (its
/// token not cancelled): one that ended meanwhile has had its pod's state
/// dropped, or handed to the subscription that replaced it.
#[derive(Debug, Default)]
pub struct Pending {
    views: Vec<(String, PodView, CancellationToken)>,
    /// When views were last given.
    last: Option<Instant>,
}

impl Pending {
    /// The shortest time between two flushes: a view reaches lookups at
    /// most this late, and the copies of a fleet of thousands changing one
    /// by one stay a few per second.
    pub const EVERY: Duration = Duration::from_millis(20);

    /// Notes `pod`'s view if it changed (learning lasting at most
    /// `period`); `ended` is cancelled when its subscription ends.
    pub fn note(
        &mut self,
        pod: &str,
        stats: &super::SubStats,
        period: Duration,
        ended: &CancellationToken,
    ) {
        if let Some(view) = stats.changed_view(period) {
            self.views.push((pod.into(), view, ended.clone()));
        }
    }

    /// How long a thread that waits at most `poll_ms` for its sockets
    /// waits at `now`: less when the views noted fall due sooner.
    pub fn wait_ms(&self, now: Instant, poll_ms: i64) -> i64 {
        // Rounded up: a wait rounded down to 0 ms would spin until due.
        self.due_in(now).map_or(poll_ms, |d| {
            let ms = d.as_micros().div_ceil(1_000);
            poll_ms.min(i64::try_from(ms).unwrap_or(i64::MAX))
        })
    }

    /// How long until the views noted are due (zero if they are); none
    /// if none is noted.
    fn due_in(&self, now: Instant) -> Option<Duration> {
        if self.views.is_empty() {
            return None;
        }
        Some(self.last.map_or(Duration::ZERO, |last| {
            (last + Self::EVERY).saturating_duration_since(now)
        }))
    }

    /// Gives the views noted to `index` if they are due at `now`.
    pub fn flush(&mut self, index: &prefix_index::Index, now: Instant) {
        if self.due_in(now) == Some(Duration::ZERO) {
            let on = self
                .views
                .iter()
                .filter(|(_, _, ended)| !ended.is_cancelled());
            index.set_views(on.map(|(pod, view, _)| (&**pod, *view)));
            self.views.clear();
            self.last = Some(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PERIOD: Duration = Duration::from_secs(300);

    fn connected(restored: bool, t0: Instant) -> ViewTracker {
        let mut v = ViewTracker::new(t0, restored);
        v.set_connected(true);
        v
    }

    /// Views reach the index at most once per `EVERY`, a waiting thread is
    /// woken when the noted ones fall due, and the view of a subscription
    /// that ended meanwhile is dropped.
    #[test]
    fn views_are_given_at_most_once_per_interval_and_only_while_on() {
        let index = prefix_index::Index::new(prefix_index::IndexConfig::default());
        let now = 1_700_000_000_000;
        let view = |pod: &str| {
            let found = index.reader().lookup_detail("m", &[1], None, now);
            let names: Vec<_> = found
                .matches
                .iter()
                .map(|m| (index.reader().pod_name(m.pod).unwrap().to_string(), m.view))
                .collect();
            names.into_iter().find(|(p, _)| p == pod).map(|(_, v)| v)
        };
        let spec = crate::engines::engine_spec(16, 16);
        for pod in ["a", "b"] {
            index.engine(pod, spec).unwrap();
            // A gateway's insert: speculative while the view is exact.
            index.insert("m", &[1], pod, now).unwrap();
        }
        assert_eq!(view("a"), Some(PodView::Speculative));
        let (on, ended) = (CancellationToken::new(), CancellationToken::new());
        ended.cancel();
        let (a, b) = (
            crate::engines::SubStats::default(),
            crate::engines::SubStats::default(),
        );
        let t0 = Instant::now();
        let mut pending = Pending::default();
        assert_eq!(pending.wait_ms(t0, 100), 100);
        // Not connected yet: disconnected.
        pending.note("a", &a, PERIOD, &on);
        pending.note("b", &b, PERIOD, &ended);
        assert_eq!(pending.wait_ms(t0, 100), 0);
        pending.flush(&index, t0);
        assert!(pending.views.is_empty());
        assert_eq!(view("a"), Some(PodView::Disconnected));
        assert_eq!(view("b"), Some(PodView::Speculative));
        // The next change waits out the interval.
        a.set_connected(true);
        pending.note("a", &a, PERIOD, &on);
        let soon = t0 + Pending::EVERY / 4;
        pending.flush(&index, soon);
        assert_eq!(view("a"), Some(PodView::Disconnected));
        let wait = pending.wait_ms(soon, 100);
        assert!(
            wait > 0 && wait <= Pending::EVERY.as_millis() as i64,
            "{wait}"
        );
        assert_eq!(
            pending.wait_ms(t0 + Pending::EVERY - Duration::from_micros(100), 100),
            1
        );
        pending.flush(&index, t0 + Pending::EVERY);
        assert_eq!(view("a"), Some(PodView::Speculative));
    }

    #[test]
    fn a_pod_is_exact_once_its_engine_is_seen_from_a_known_state() {
        let t0 = Instant::now();
        // From batch 0: the engine's whole life.
        let mut v = connected(false, t0);
        assert_eq!(v.view(t0, PERIOD), PodView::Learning);
        v.applied(0, false, t0);
        assert_eq!(v.view(t0, PERIOD), PodView::Exact);
        // Joined late: learning, until a clear or the period.
        let mut v = connected(false, t0);
        v.applied(41, false, t0);
        assert_eq!(v.view(t0, PERIOD), PodView::Learning);
        v.applied(42, true, t0);
        assert_eq!(v.view(t0, PERIOD), PodView::Exact);
        let mut v = connected(false, t0);
        v.applied(41, false, t0);
        assert_eq!(v.view(t0 + PERIOD, PERIOD), PodView::Exact);
        // Restored from a snapshot: its next batch continues it.
        let mut v = connected(true, t0);
        v.applied(41, false, t0);
        assert_eq!(v.view(t0, PERIOD), PodView::Exact);
    }

    #[test]
    fn a_resync_makes_it_learn_and_replays_and_disconnections_show_first() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(10);
        let mut v = connected(false, t0);
        v.applied(0, false, t0);
        v.resynced(t1);
        assert_eq!(v.view(t1, PERIOD), PodView::Learning);
        assert_eq!(v.view(t1 + PERIOD, PERIOD), PodView::Exact);
        // A restart's replay from 0 proves it again.
        v.set_replaying(true);
        assert_eq!(v.view(t1, PERIOD), PodView::Replaying);
        v.applied(0, false, t1);
        v.set_replaying(false);
        assert_eq!(v.view(t1, PERIOD), PodView::Exact);
        v.set_connected(false);
        assert_eq!(v.view(t1, PERIOD), PodView::Disconnected);
        // Published once per change.
        assert_eq!(v.changed(t1, PERIOD), Some(PodView::Disconnected));
        assert_eq!(v.changed(t1, PERIOD), None);
        v.set_connected(true);
        assert_eq!(v.changed(t1, PERIOD), Some(PodView::Exact));
    }
}
