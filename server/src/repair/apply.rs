//! What a round of repair changes here: the entries a peer held and this
//! server lacked, copied at the peer's write times, and the pods a peer
//! removed, removed here.

use std::collections::HashMap;

use prefix_index::digest::Window;
use prefix_index::{Index, Through};
use prefix_proto::{DigestEntry, Eviction, Tombstone};

use crate::repair::compare::SETTLE;
use crate::replica::removals::Removals;

/// How far the sweep here evicted each pod's entries for a capacity, and
/// every pod's for the global bound (see [`Index::evicted`]).
pub type Evicted = (HashMap<String, Through>, Option<Through>);

/// Copies `entries` of `model` into `index` at their write times (none
/// later than the window's `now`: a peer's clock ahead of this one's does
/// not date entries in the future here), except an entry:
/// - of a pod removed here after it was written (the peer missed the
///   removal);
/// - written when or before the sweep here evicted that pod's entries for
///   its capacity or the global bound (`evicted`): capacity eviction and
///   repair agree, and repair never restores what the sweep took;
/// - written at or before the start of the round's window `w` (near its
///   TTL).
///
/// Returns the entries copied.
pub fn copy(
    index: &Index,
    removals: &Removals,
    evicted: &Evicted,
    model: &str,
    entries: &[DigestEntry],
    w: Window,
) -> u64 {
    let (per_pod, global) = evicted;
    let mut copied = 0;
    for e in entries {
        let at = e.at.min(w.now);
        let swept = per_pod
            .get(&e.pod)
            .into_iter()
            .chain(global)
            .any(|t| t.covers(at));
        if at <= w.low || swept || removals.after(&e.pod, at) {
            continue;
        }
        if index.insert(model, &e.key, &e.pod, at).is_ok() {
            copied += 1;
        }
    }
    copied
}

/// Evicts here what a peer's sweep evicted for capacities and the global
/// bound (an eviction without a pod), where this server's sweep did not
/// evict as far: the next sweep pass evicts them, so that the two hold the
/// same entries rather than differ in them, round after round, until
/// their TTL. Eviction is by last use, oldest first, on both, to the same
/// depth: the one that evicted further decides. An eviction of entries
/// written in the last [`SETTLE`] at `now` is passed over: a sweep evicts
/// the least recently used, so only a peer's clock ahead of this one's
/// says so, and it would take this server's newest entries.
pub fn evict(index: &Index, evictions: &[Eviction], now: u64) {
    let newest = now.saturating_sub(SETTLE.as_millis() as u64);
    for e in evictions.iter().filter(|e| e.through <= newest) {
        let through = Through {
            time: e.through,
            depth: e.depth,
        };
        let pod = (!e.pod.is_empty()).then_some(e.pod.as_str());
        index.evict_through(pod, through);
    }
}

/// Applies a peer's removals: a gateway-fed pod it removed at `at` (at
/// `now` at the latest) is removed here too, unless this server removed
/// it since or holds an entry of it written after (the pod came back).
/// Each is kept with this server's own removals, so that repair copies
/// none of the pod's older entries back, the next peer learns it from
/// here, and it is weighed once. An engine-fed pod here is its engine's
/// to keep or drop. Returns the pods removed.
pub fn bury(index: &Index, removals: &Removals, tombstones: &[Tombstone], now: u64) -> u64 {
    let mut removed = 0;
    for t in tombstones {
        let at = t.at.min(now);
        if removals.at_or_after(&t.pod, at) {
            continue;
        }
        let reader = index.reader();
        if reader.is_engine_fed(&t.pod) {
            continue;
        }
        let back = reader.written_since(&t.pod, at, now);
        drop(reader);
        removals.learn(&t.pod, at);
        if !back && index.remove_pod(&t.pod) {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prefix_index::IndexConfig;

    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn index() -> Index {
        Index::new(IndexConfig {
            ttl: Duration::from_secs(60),
            ..IndexConfig::default()
        })
    }

    fn window(low: u64) -> Window {
        Window {
            low,
            high: NOW - 2_000,
            now: NOW,
        }
    }

    fn entry(pod: &str, key: &[u64], at: u64) -> DigestEntry {
        DigestEntry {
            pod: pod.into(),
            key: key.to_vec(),
            at,
        }
    }

    #[test]
    fn entries_are_copied_at_the_peers_time() {
        let index = index();
        let done = copy(
            &index,
            &Removals::default(),
            &Evicted::default(),
            "m",
            // The second dated by a clock ahead: copied as of now.
            &[
                entry("a", &[1, 2, 3], NOW - 10_000),
                entry("b", &[1], NOW + 60_000),
            ],
            window(NOW - 50_000),
        );
        assert_eq!(done, 2);
        let mut found = index.lookup("m", &[1, 2, 3], None, NOW);
        found.sort();
        assert_eq!(found, [("a".to_string(), 3), ("b".to_string(), 1)]);
        // Written 10 s before: it expires 50 s from now, with the peer's.
        assert_eq!(
            index.lookup("m", &[1, 2, 3], None, NOW + 50_001),
            [("b".to_string(), 1)]
        );
    }

    #[test]
    fn what_was_removed_evicted_or_nearly_expired_is_not_copied() {
        let index = index();
        let removals = Removals::default();
        removals.record("gone", NOW - 1_000);
        let through = |time| Through { time, depth: 0 };
        let evicted: Evicted = (
            [("full".to_string(), through(NOW - 5_000))].into(),
            Some(through(NOW - 20_000)),
        );
        let entries = [
            entry("gone", &[1], NOW - 2_000),
            entry("full", &[2], NOW - 5_000),
            entry("any", &[3], NOW - 20_000),
            entry("old", &[4], NOW - 40_000),
            // Written after the removal: the pod came back.
            entry("gone", &[5], NOW - 500),
            entry("full", &[6], NOW - 4_999),
        ];
        let done = copy(
            &index,
            &removals,
            &evicted,
            "m",
            &entries,
            window(NOW - 40_000),
        );
        assert_eq!(done, 2);
        for (key, pod) in [
            (1, None),
            (2, None),
            (3, None),
            (4, None),
            (5, Some("gone")),
            (6, Some("full")),
        ] {
            let found = index.lookup("m", &[key], None, NOW);
            assert_eq!(found.first().map(|(p, _)| p.as_str()), pod, "{key}");
        }
    }

    #[test]
    fn what_a_peer_evicted_for_a_capacity_is_evicted_here_by_the_next_sweep() {
        let index = index();
        index.insert("m", &[1], "full", NOW - 5_000).unwrap();
        index.insert("m", &[2], "full", NOW - 1_000).unwrap();
        index.insert("m", &[3], "other", NOW - 5_000).unwrap();
        let evictions = [Eviction {
            pod: "full".into(),
            through: NOW - 2_000,
            depth: 0,
        }];
        evict(&index, &evictions, NOW);
        index.sweep(NOW, usize::MAX);
        assert!(index.lookup("m", &[1], None, NOW).is_empty());
        assert_eq!(index.lookup("m", &[2], None, NOW).len(), 1);
        assert_eq!(index.lookup("m", &[3], None, NOW).len(), 1);
        // The global bound's: every pod's.
        let every = Eviction {
            pod: String::new(),
            through: NOW - 4_000,
            depth: 0,
        };
        // One of a clock ahead, which would take the newest: passed over.
        let ahead = Eviction {
            pod: "full".into(),
            through: NOW - 500,
            depth: 0,
        };
        evict(&index, &[every, ahead], NOW);
        index.sweep(NOW, usize::MAX);
        assert!(index.lookup("m", &[3], None, NOW).is_empty());
        assert_eq!(index.lookup("m", &[2], None, NOW).len(), 1);
    }

    #[test]
    fn a_peers_removal_removes_the_pod_unless_it_was_written_since() {
        let index = index();
        index.insert("m", &[1], "old", NOW - 5_000).unwrap();
        index.insert("m", &[2], "back", NOW - 500).unwrap();
        let removals = Removals::default();
        let tombstones = [
            Tombstone {
                pod: "old".into(),
                at: NOW - 1_000,
            },
            Tombstone {
                pod: "back".into(),
                at: NOW - 1_000,
            },
            Tombstone {
                pod: "never-here".into(),
                at: NOW - 1_000,
            },
        ];
        assert_eq!(bury(&index, &removals, &tombstones, NOW), 1);
        assert!(index.lookup("m", &[1], None, NOW).is_empty());
        assert_eq!(index.lookup("m", &[2], None, NOW).len(), 1);
        // Kept: repair copies none of its older entries back, and peers
        // asking this server learn it.
        assert!(removals.after("old", NOW - 1_001));
        assert!(removals.after("never-here", NOW - 1_001));
        // Learnt once, the pod that came back too: a second round changes
        // nothing, and walks nothing.
        assert!(removals.after("back", NOW - 1_001));
        index.insert("m", &[1], "old", NOW - 900).unwrap();
        assert_eq!(bury(&index, &removals, &tombstones, NOW), 0);
        assert_eq!(index.lookup("m", &[1], None, NOW).len(), 1);
    }
}
