//! How far an engine-fed pod's answers can be trusted, from what its
//! follower sees, without I/O: the [`View`] detailed lookups report.
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

use prefix_index::View;

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
    published: Option<View>,
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
    pub fn view(&self, now: Instant, period: Duration) -> View {
        if !self.connected {
            return View::Disconnected;
        }
        if self.replaying {
            return View::Replaying;
        }
        match self.base {
            Base::Exact => View::Exact,
            Base::Learning { since, .. } if now.duration_since(since) >= period => View::Exact,
            Base::Learning { .. } => View::Learning,
        }
    }

    /// The view last published.
    pub fn published(&self) -> Option<View> {
        self.published
    }

    /// The view at `now` if it differs from the one last published, which
    /// it becomes.
    pub fn changed(&mut self, now: Instant, period: Duration) -> Option<View> {
        let view = self.view(now, period);
        (self.published != Some(view)).then(|| {
            self.published = Some(view);
            view
        })
    }
}

/// Views that changed and are not yet given to the index, given in one
/// step ([`prefix_index::Index::set_views`]): the pods' views are one map
/// the index copies on each change, so engines changing together (a fleet
/// connecting) cost one copy, not one each.
#[derive(Debug, Default)]
pub struct Pending(Vec<(String, View)>);

impl Pending {
    /// Notes `pod`'s view if it changed (learning lasting at most
    /// `period`).
    pub fn note(&mut self, pod: &str, stats: &super::SubStats, period: Duration) {
        if let Some(view) = stats.changed_view(period) {
            self.0.push((pod.into(), view));
        }
    }

    /// Gives the views noted to `index`.
    pub fn flush(&mut self, index: &prefix_index::Index) {
        if !self.0.is_empty() {
            index.set_views(self.0.iter().map(|(pod, view)| (&**pod, *view)));
            self.0.clear();
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

    #[test]
    fn a_pod_is_exact_once_its_engine_is_seen_from_a_known_state() {
        let t0 = Instant::now();
        // From batch 0: the engine's whole life.
        let mut v = connected(false, t0);
        assert_eq!(v.view(t0, PERIOD), View::Learning);
        v.applied(0, false, t0);
        assert_eq!(v.view(t0, PERIOD), View::Exact);
        // Joined late: learning, until a clear or the period.
        let mut v = connected(false, t0);
        v.applied(41, false, t0);
        assert_eq!(v.view(t0, PERIOD), View::Learning);
        v.applied(42, true, t0);
        assert_eq!(v.view(t0, PERIOD), View::Exact);
        let mut v = connected(false, t0);
        v.applied(41, false, t0);
        assert_eq!(v.view(t0 + PERIOD, PERIOD), View::Exact);
        // Restored from a snapshot: its next batch continues it.
        let mut v = connected(true, t0);
        v.applied(41, false, t0);
        assert_eq!(v.view(t0, PERIOD), View::Exact);
    }

    #[test]
    fn a_resync_makes_it_learn_and_replays_and_disconnections_show_first() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(10);
        let mut v = connected(false, t0);
        v.applied(0, false, t0);
        v.resynced(t1);
        assert_eq!(v.view(t1, PERIOD), View::Learning);
        assert_eq!(v.view(t1 + PERIOD, PERIOD), View::Exact);
        // A restart's replay from 0 proves it again.
        v.set_replaying(true);
        assert_eq!(v.view(t1, PERIOD), View::Replaying);
        v.applied(0, false, t1);
        v.set_replaying(false);
        assert_eq!(v.view(t1, PERIOD), View::Exact);
        v.set_connected(false);
        assert_eq!(v.view(t1, PERIOD), View::Disconnected);
        // Published once per change.
        assert_eq!(v.changed(t1, PERIOD), Some(View::Disconnected));
        assert_eq!(v.changed(t1, PERIOD), None);
        v.set_connected(true);
        assert_eq!(v.changed(t1, PERIOD), Some(View::Exact));
    }
}
