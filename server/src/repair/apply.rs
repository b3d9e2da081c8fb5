//! What a round of repair changes here: the entries a peer held and this
//! server lacked, copied at the peer's write times, and the pods a peer
//! removed, removed here.

use std::collections::HashMap;

use prefix_index::{Index, Through};
use prefix_proto::{DigestEntry, Eviction, Tombstone};

use crate::replica::removals::Removals;

/// How far the sweep here evicted each pod's entries for a capacity, and
/// every pod's for the global bound (see [`Index::evicted`]).
pub type Evicted = (HashMap<String, Through>, Option<Through>);

/// Copies `entries` of `model` into `index` at their write times, except
/// an entry:
/// - of a pod removed here after it was written (the peer missed the
///   removal);
/// - written when or before the sweep here evicted that pod's entries for
///   its capacity or the global bound (`evicted`): capacity eviction and
///   repair agree, and repair never restores what the sweep took;
/// - written at or before `low`, the start of the round's window (near
///   its TTL).
///
/// Returns the entries copied.
pub fn copy(
    index: &Index,
    removals: &Removals,
    evicted: &Evicted,
    model: &str,
    entries: &[DigestEntry],
    low: u64,
) -> u64 {
    let (per_pod, global) = evicted;
    let mut copied = 0;
    for e in entries {
        let swept = per_pod
            .get(&e.pod)
            .into_iter()
            .chain(global)
            .any(|t| t.covers(e.at));
        if e.at <= low || swept || removals.after(&e.pod, e.at) {
            continue;
        }
        if index.insert(model, &e.key, &e.pod, e.at).is_ok() {
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
/// depth: the one that evicted further decides.
pub fn evict(index: &Index, evictions: &[Eviction]) {
    for e in evictions {
        let through = Through {
            time: e.through,
            depth: e.depth,
        };
        let pod = (!e.pod.is_empty()).then_some(e.pod.as_str());
        index.evict_through(pod, through);
    }
}

/// Applies a peer's removals: a pod it removed at `at` is removed here
/// too, unless this server removed it since or holds an entry of it
/// written after (the pod came back). Each is kept with this server's
/// own removals, so that repair copies none of its older entries back
/// and the next peer learns it from here. Returns the pods removed.
pub fn bury(index: &Index, removals: &Removals, tombstones: &[Tombstone], now: u64) -> u64 {
    let mut removed = 0;
    for t in tombstones {
        if removals.at_or_after(&t.pod, t.at) {
            continue;
        }
        if index.reader().written_since(&t.pod, t.at, now) {
            continue;
        }
        removals.learn(&t.pod, t.at);
        if index.remove_pod(&t.pod) {
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
            &[entry("a", &[1, 2, 3], NOW - 10_000), entry("b", &[1], NOW)],
            NOW - 50_000,
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
        let done = copy(&index, &removals, &evicted, "m", &entries, NOW - 40_000);
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
        evict(&index, &evictions);
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
        evict(&index, &[every]);
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
        // Learnt once: a second round changes nothing.
        index.insert("m", &[1], "old", NOW - 900).unwrap();
        assert_eq!(bury(&index, &removals, &tombstones, NOW), 0);
        assert_eq!(index.lookup("m", &[1], None, NOW).len(), 1);
    }
}
