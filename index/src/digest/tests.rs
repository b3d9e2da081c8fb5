use std::collections::HashSet;
use std::time::Duration;

use prefix_proto::message::{cell_of, CELLS};

use super::*;
use crate::{Index, IndexConfig};

const T: u64 = 1_700_000_000_000;

fn index() -> Index {
    Index::new(IndexConfig {
        ttl: Duration::from_secs(600),
        ..IndexConfig::default()
    })
}

fn window(low: u64, high: u64) -> Window {
    Window {
        low,
        high,
        now: high,
    }
}

fn cells(index: &Index, w: Window) -> Vec<u64> {
    index.reader().digest_cells("m", w).unwrap()
}

#[test]
fn the_same_entries_digest_alike_whatever_the_trees_shape() {
    let whole = index();
    whole.insert("m", &[1, 2, 3, 4], "p", T).unwrap();
    // The same entry, its edge split by a pod since removed and swept.
    let split = index();
    split.insert("m", &[1, 2, 3, 4], "p", T).unwrap();
    split.insert("m", &[1, 2, 9], "gone", T).unwrap();
    split.remove_pod("gone");
    split.sweep(T, usize::MAX);
    assert!(split.stats().size.nodes > whole.stats().size.nodes, "split");
    let w = window(T - 1, T);
    assert_eq!(cells(&whole, w), cells(&split, w));
    assert_ne!(cells(&whole, w), vec![0; CELLS], "an entry shows");
}

#[test]
fn only_entries_written_inside_the_window_count() {
    let index = index();
    index.insert("m", &[1, 2], "p", T).unwrap();
    let empty = vec![0; CELLS];
    assert_ne!(cells(&index, window(T - 1, T)), empty);
    assert_eq!(
        cells(&index, window(T, T + 5)),
        empty,
        "written at the start"
    );
    assert_eq!(
        cells(&index, window(T - 5, T - 1)),
        empty,
        "written after the end"
    );
    // Expired at `now`.
    let late = Window {
        low: T - 1,
        high: T,
        now: T + 600_001,
    };
    assert_eq!(cells(&index, late), empty);
    assert!(index
        .reader()
        .digest_cells("other", window(T - 1, T))
        .is_none());
}

#[test]
fn a_difference_shows_in_its_items_and_their_entries_carry_it() {
    let ahead = index();
    ahead.insert("m", &[1, 2, 3, 4], "p", T).unwrap();
    ahead.insert("m", &[1, 2], "q", T + 1).unwrap();
    let behind = index();
    behind.insert("m", &[1, 2], "p", T).unwrap();
    behind.insert("m", &[1, 2], "q", T + 1).unwrap();
    let w = window(T - 1, T + 1);
    let (a, b) = (cells(&ahead, w), cells(&behind, w));
    let differ: Vec<bool> = a.iter().zip(&b).map(|(x, y)| x != y).collect();
    // p's blocks 3 and 4: at most two cells.
    let n = differ.iter().filter(|d| **d).count();
    assert!((1..=2).contains(&n), "{n}");
    let (theirs, more) = ahead.reader().digest_items("m", w, &differ, usize::MAX);
    let (mine, _) = behind.reader().digest_items("m", w, &differ, usize::MAX);
    assert!(!more);
    let mine: HashSet<u64> = mine.into_iter().collect();
    let wanted: HashSet<u64> = theirs.into_iter().filter(|i| !mine.contains(i)).collect();
    assert_eq!(wanted.len(), 2);
    assert!(wanted.iter().all(|&i| differ[cell_of(i)]));
    let reader = ahead.reader();
    let (found, more) = reader.digest_entries("m", w, &wanted, usize::MAX);
    assert!(!more);
    assert_eq!(
        found,
        [Found {
            pod: "p",
            key: vec![1, 2, 3, 4],
            at: T
        }]
    );
    // Copied, the two digest alike.
    behind.insert("m", &found[0].key, "p", found[0].at).unwrap();
    assert_eq!(cells(&ahead, w), cells(&behind, w));
    // Bounded: the entry's four blocks do not fit in three.
    let (none, more) = reader.digest_entries("m", w, &wanted, 3);
    assert!(none.is_empty() && more);
}

#[test]
fn items_stop_at_their_bound() {
    let index = index();
    for k in 0..100u64 {
        index.insert("m", &[k, k + 1000], "p", T).unwrap();
    }
    let all = vec![true; CELLS];
    let w = window(T - 1, T);
    let (items, more) = index.reader().digest_items("m", w, &all, usize::MAX);
    assert_eq!((items.len(), more), (200, false));
    assert!(items.windows(2).all(|p| p[0] < p[1]), "ascending");
    let (some, more) = index.reader().digest_items("m", w, &all, 50);
    assert!(
        more && !some.is_empty() && some.len() <= 50,
        "{}",
        some.len()
    );
    // Whole cells: every item of the cells given is there.
    let last = cell_of(*some.last().unwrap());
    let whole = items.iter().filter(|&&i| cell_of(i) <= last).count();
    assert_eq!(some.len(), whole);
    assert_eq!(some[..], items[..whole]);
}

#[test]
fn a_pod_written_since_a_time_is_told() {
    let index = index();
    index.insert("m", &[1, 2], "p", T).unwrap();
    index.insert("n", &[7], "q", T + 5).unwrap();
    let r = index.reader();
    assert!(r.written_since("p", T - 1, T));
    assert!(!r.written_since("p", T, T));
    assert!(r.written_since("q", T + 4, T + 5));
    assert!(!r.written_since("nobody", 0, T));
}

#[test]
fn engine_fed_pods_are_left_out() {
    let index = index();
    index.insert("m", &[1, 2], "engine", T).unwrap();
    let w = window(T - 1, T);
    assert_ne!(cells(&index, w), vec![0; CELLS]);
    let pin = index.pin();
    let id = index.sh.pods.id("engine", &pin).unwrap();
    index.sh.pods.set_precise(id, true);
    assert_eq!(
        cells(&index, w),
        vec![0; CELLS],
        "each replica follows its engines"
    );
}

#[test]
fn removed_pods_are_left_out() {
    let two = index();
    two.insert("m", &[1, 2], "p", T).unwrap();
    two.insert("m", &[1, 2], "q", T).unwrap();
    let w = window(T - 1, T);
    let both = cells(&two, w);
    two.remove_pod("q");
    let one = index();
    one.insert("m", &[1, 2], "p", T).unwrap();
    assert_ne!(cells(&two, w), both);
    assert_eq!(cells(&two, w), cells(&one, w));
}

#[test]
fn the_sweep_says_up_to_when_it_evicted_a_pods_entries() {
    let index = index();
    index.set_pod_capacity("p", 2).unwrap();
    index.insert("m", &[1, 2], "p", T).unwrap();
    index.insert("m", &[3, 4], "p", T + 10).unwrap();
    index.insert("m", &[5, 6], "q", T).unwrap();
    assert_eq!(index.evicted(), (Default::default(), None));
    index.sweep(T + 20, usize::MAX);
    let (per_pod, global) = index.evicted();
    assert_eq!(global, None);
    let t = per_pod["p"];
    assert!(t.covers(T) && !t.covers(T + 10), "{t:?}");
    assert!(!per_pod.contains_key("q"));
    assert_eq!(index.lookup("m", &[1, 2], None, T + 20), []);
}

#[test]
fn a_replica_evicts_as_far_as_a_peer_did_to_the_depth() {
    // Blocks last used at the same time: a cutoff from a depth on takes
    // the deeper ones only, on both replicas alike.
    let index = index();
    index.insert("m", &[1, 2, 3, 4], "p", T).unwrap();
    index.evict_through(Some("p"), crate::Through { time: T, depth: 2 });
    index.sweep(T + 20, usize::MAX);
    assert_eq!(
        index.lookup("m", &[1, 2, 3, 4], None, T + 20),
        [("p".to_string(), 2)]
    );
}

#[test]
fn a_replica_evicts_as_far_as_a_peer_did() {
    let index = index();
    index.insert("m", &[1, 2], "p", T).unwrap();
    index.insert("m", &[3, 4], "p", T + 10).unwrap();
    index.insert("m", &[5], "q", T).unwrap();
    let through = |time| crate::Through { time, depth: 0 };
    index.evict_through(Some("p"), through(T));
    index.evict_through(Some("nobody"), through(T));
    index.sweep(T + 20, usize::MAX);
    assert_eq!(index.lookup("m", &[1, 2], None, T + 20), []);
    assert_eq!(
        index.lookup("m", &[3, 4], None, T + 20),
        [("p".to_string(), 2)]
    );
    assert_eq!(
        index.lookup("m", &[5], None, T + 20),
        [("q".to_string(), 1)]
    );
    assert_eq!(index.evicted().0["p"], through(T), "as far as the peer");
    // Every gateway-fed pod's, as for the global bound.
    index.evict_through(None, through(T + 10));
    index.sweep(T + 20, usize::MAX);
    assert_eq!(index.stats().size.entries, 0);
    assert_eq!(index.evicted().0["q"], through(T + 10));
}
