use crate::{Index, IndexConfig};

const T0: u64 = 1_000_000;

fn idx() -> Index {
    Index::new(IndexConfig::default())
}

fn named(index: &Index, key: &[u64], now: u64) -> Vec<(String, u32)> {
    index.lookup("m", key, None, now)
}

#[test]
fn splits_at_every_position_keep_every_answer() {
    let base: Vec<u64> = (100..116).collect();
    for at in 1..base.len() {
        let index = idx();
        index.insert("m", &base, "long", T0).unwrap();
        let mut branch = base[..at].to_vec();
        branch.push(7);
        index.insert("m", &branch, "branch", T0 + 1).unwrap();
        // Ends inside the (now upper) edge: a third split point.
        index
            .insert("m", &base[..at.div_ceil(2)], "short", T0 + 2)
            .unwrap();
        let n = base.len() as u32;
        assert_eq!(
            named(&index, &base, T0 + 3),
            vec![
                ("long".into(), n),
                ("branch".into(), at as u32),
                ("short".into(), at.div_ceil(2) as u32)
            ],
            "split at {at}"
        );
        assert_eq!(
            named(&index, &branch, T0 + 3)[0],
            ("branch".into(), at as u32 + 1)
        );
        let s = index.stats();
        assert_eq!(s.tree_blocks, n as u64 + 1);
        assert_eq!(s.entries, n as u64 + at as u64 + 1 + at.div_ceil(2) as u64);
    }
}

#[test]
fn fan_out_of_a_hundred_thousand_conversations() {
    let index = idx();
    let system: Vec<u64> = (0..32).collect();
    for conv in 0..100_000u64 {
        let mut key = system.clone();
        key.extend([1_000_000 + conv, conv * 7]);
        index
            .insert("m", &key, &format!("pod-{}", conv % 16), T0)
            .unwrap();
    }
    let mut key = system.clone();
    key.extend([1_000_000 + 4242, 4242 * 7]);
    let got = named(&index, &key, T0);
    assert_eq!(got.len(), 16);
    assert_eq!(got[0], ("pod-2".into(), 34));
    assert!(got[1..].iter().all(|(_, b)| *b == 32));
    let s = index.stats();
    assert_eq!(s.nodes, 100_001);
    assert_eq!(s.tree_blocks, 32 + 200_000);
}

#[test]
fn one_node_holds_many_pods_sorted_by_name_on_ties() {
    let index = idx();
    let key = [1, 2, 3];
    for p in [
        "zeta",
        "alpha",
        "pod-10",
        "pod-9",
        "alphabet-soup-long-name",
    ] {
        index.insert("m", &key, p, T0).unwrap();
    }
    let got: Vec<_> = named(&index, &key, T0)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    assert_eq!(
        got,
        [
            "alpha",
            "alphabet-soup-long-name",
            "pod-10",
            "pod-9",
            "zeta"
        ]
    );
    let cands = index.lookup("m", &key, Some(&["zeta", "nobody", "pod-9"]), T0);
    assert_eq!(cands, vec![("pod-9".into(), 3), ("zeta".into(), 3)]);
    assert!(index.lookup("m", &key, Some(&[]), T0).is_empty());
    assert!(index.lookup("other", &key, None, T0).is_empty());
}

/// A lookup stops reading shallower nodes once it has found every pod it
/// can answer: not before (a pod found only higher up still counts), with
/// candidates given twice, unknown or removed counted once or not at all.
#[test]
fn lookups_stop_early_only_once_every_answerable_pod_is_found() {
    let index = idx();
    let key = [1, 2, 3, 4, 5, 6];
    index.insert("m", &key, "deep", T0).unwrap();
    index.insert("m", &key[..4], "middle", T0).unwrap();
    index.insert("m", &key[..1], "shallow", T0).unwrap();
    index.insert("m", &key[..2], "gone", T0).unwrap();
    // Expired at the deepest node, fresh higher up: found higher up.
    index.insert("m", &key, "stale", T0 - 1_000_000).unwrap();
    index.insert("m", &key[..3], "stale", T0).unwrap();
    assert!(index.remove_pod("gone"));
    let all = vec![
        ("deep".into(), 6),
        ("middle".into(), 4),
        ("stale".into(), 3),
        ("shallow".into(), 1),
    ];
    assert_eq!(named(&index, &key, T0), all);
    let some = index.lookup(
        "m",
        &key,
        Some(&["shallow", "deep", "deep", "gone", "nobody", "shallow"]),
        T0,
    );
    assert_eq!(some, vec![("deep".into(), 6), ("shallow".into(), 1)]);
    // Every pod on the deepest node: nothing higher up is needed.
    for p in ["middle", "stale", "shallow"] {
        index.insert("m", &key, p, T0).unwrap();
    }
    let deepest: Vec<_> = all.iter().map(|(p, _)| (p.clone(), 6)).collect();
    let mut got = named(&index, &key, T0);
    got.sort();
    let mut want = deepest;
    want.sort();
    assert_eq!(got, want);
    // Past 64 pods (ranks kept apart from the bitmap): 70 more on the
    // deepest node, one more only on the first block.
    for i in 0..70 {
        index.insert("m", &key, &format!("p{i:02}"), T0).unwrap();
    }
    index.insert("m", &key[..1], "top", T0).unwrap();
    let got = named(&index, &key, T0);
    assert_eq!(got.len(), 75);
    assert_eq!(got.last(), Some(&("top".into(), 1)));
    assert!(got[..74].iter().all(|(_, blocks)| *blocks == 6));
    // By name, across the bitmap's 64 ranks and those past it.
    assert!(got[..74].windows(2).all(|w| w[0].0 < w[1].0), "{got:?}");
}

#[test]
fn ttl_hides_at_once_and_the_sweep_reclaims() {
    let index = idx();
    let ttl = index.config().ttl.as_millis() as u64;
    index.insert("m", &[1, 2, 3, 4], "a", T0).unwrap();
    index.insert("m", &[1, 2], "a", T0 + 10).unwrap();
    assert_eq!(
        named(&index, &[1, 2, 3, 4], T0 + ttl),
        vec![("a".into(), 4)]
    );
    // The deeper part expires first: the shorter refresh keeps [1, 2].
    assert_eq!(
        named(&index, &[1, 2, 3, 4], T0 + ttl + 1),
        vec![("a".into(), 2)]
    );
    index.sweep(T0 + ttl + 1, usize::MAX);
    assert_eq!(index.stats().tree_blocks, 2);
    assert_eq!(index.stats().entries, 2);
    assert!(named(&index, &[1, 2], T0 + ttl + 11).is_empty());
    index.sweep(T0 + ttl + 11, usize::MAX);
    let s = index.stats();
    assert_eq!((s.nodes, s.entries, s.tree_blocks), (0, 0, 0));
}

#[test]
fn removed_pod_vanishes_at_once_and_its_name_comes_back_fresh() {
    let index = idx();
    index.insert("m", &[1, 2, 3], "a", T0).unwrap();
    index.insert("m", &[1, 2], "b", T0).unwrap();
    assert!(index.remove_pod("a"));
    assert!(!index.remove_pod("a"));
    assert_eq!(named(&index, &[1, 2, 3], T0), vec![("b".into(), 2)]);
    index.insert("m", &[1], "a", T0 + 1).unwrap();
    assert_eq!(
        named(&index, &[1, 2, 3], T0 + 1),
        vec![("b".into(), 2), ("a".into(), 1)]
    );
    let r = index.sweep(T0 + 1, usize::MAX);
    assert_eq!(r.purged, 3);
    assert_eq!(index.stats().entries, 3);
}

#[test]
fn capacity_evicts_least_recent_deepest_first_inside_an_edge() {
    let index = idx();
    index.set_pod_capacity("a", 5).unwrap();
    index
        .insert("m", &[1, 2, 3, 4, 5, 6, 7, 8], "a", T0)
        .unwrap();
    index.insert("m", &[9, 9], "a", T0 + 1).unwrap();
    index
        .insert("m", &[1, 2, 3, 4, 5, 6, 7, 8], "b", T0 + 2)
        .unwrap();
    index.sweep(T0 + 3, usize::MAX);
    // 10 blocks, capacity 5: the five oldest blocks go, deepest first.
    assert_eq!(index.pod_blocks("a"), 5);
    let got = index.lookup("m", &[1, 2, 3, 4, 5, 6, 7, 8], Some(&["a"]), T0 + 3);
    assert_eq!(got, vec![("a".into(), 3)]);
    assert_eq!(
        index.lookup("m", &[9, 9], None, T0 + 3),
        vec![("a".into(), 2)]
    );
    // b keeps all of its blocks.
    assert_eq!(
        index.lookup("m", &[1, 2, 3, 4, 5, 6, 7, 8], Some(&["b"]), T0 + 3)[0].1,
        8
    );
}

#[test]
fn sweep_due_says_when_a_pass_has_work() {
    let index = Index::new(IndexConfig {
        ttl: std::time::Duration::from_secs(80),
        ..IndexConfig::default()
    });
    assert!(!index.sweep_due(T0), "an empty index has nothing to sweep");
    index.insert("m", &[1, 2, 3], "a", T0).unwrap();
    // Nothing swept yet: one pass to start the expiry clock.
    assert!(index.sweep_due(T0));
    index.sweep(T0, usize::MAX);
    assert!(!index.sweep_due(T0 + 1), "under capacity, nothing removed");
    // ttl / 8 = 10 s later, a pass frees what expired meanwhile.
    assert!(!index.sweep_due(T0 + 9_999));
    assert!(index.sweep_due(T0 + 10_000));
    index.sweep(T0 + 10_000, usize::MAX);
    assert!(!index.sweep_due(T0 + 10_001));
    // Over capacity: due until the sweep has evicted down to it.
    index.set_pod_capacity("a", 1).unwrap();
    assert!(index.sweep_due(T0 + 10_001));
    index.sweep(T0 + 10_001, usize::MAX);
    assert_eq!(index.pod_blocks("a"), 1);
    assert!(!index.sweep_due(T0 + 10_002));
    // A removed pod: due until its entries are purged and its id freed.
    index.remove_pod("a");
    assert!(index.sweep_due(T0 + 10_002));
    for t in 0..8 {
        index.sweep(T0 + 10_003 + t, usize::MAX);
    }
    assert!(!index.sweep_due(T0 + 10_020));
    // A budget too small to finish: still due after the call.
    for i in 0..50u64 {
        index.insert("m", &[i, i + 100], "b", T0 + 10_020).unwrap();
    }
    index.sweep(T0 + 10_021, usize::MAX);
    index.set_pod_capacity("b", 10).unwrap();
    index.sweep(T0 + 10_022, 3);
    assert!(index.sweep_due(T0 + 10_022));
}

#[test]
fn max_blocks_refuses_inserts_and_the_sweep_makes_room() {
    let index = Index::new(IndexConfig {
        max_blocks: 100,
        ..IndexConfig::default()
    });
    let mut refused = 0;
    for i in 0..30u64 {
        if index
            .insert(
                "m",
                &[i, i + 1000, i + 2000, i + 3000, i + 4000],
                "p",
                T0 + i,
            )
            .is_err()
        {
            refused += 1;
        }
    }
    assert_eq!(refused, 10);
    assert_eq!(index.stats().entries, 100);
    index.sweep(T0 + 30, usize::MAX);
    let s = index.stats();
    assert!(s.entries <= 90, "{s:?}");
    // The oldest keys went first.
    assert!(index.lookup("m", &[0, 1000], None, T0 + 30).is_empty());
    assert_eq!(
        index.lookup("m", &[19, 1019], None, T0 + 30),
        vec![("p".into(), 2)]
    );
    index.insert("m", &[77, 78], "p", T0 + 31).unwrap();
}

#[test]
fn keys_are_cut_and_empty_keys_record_nothing() {
    let index = Index::new(IndexConfig {
        max_key_blocks: 4,
        ..IndexConfig::default()
    });
    index.insert("m", &[1, 2, 3, 4, 5, 6], "a", T0).unwrap();
    index.insert("m", &[], "b", T0).unwrap();
    let r = index.reader();
    let got = r.lookup("m", &[1, 2, 3, 4, 5, 6], None, T0);
    assert_eq!(got.key_blocks, 4);
    assert_eq!(got.matches.len(), 1);
    assert_eq!(got.matches[0].blocks, 4);
    assert_eq!(index.stats().pods, 1);
}

#[test]
fn limits_give_typed_errors() {
    use crate::{InsertError, PodError};
    let index = Index::new(IndexConfig {
        max_pods: 2,
        max_models: 1,
        max_name_len: 8,
        ..IndexConfig::default()
    });
    assert!(matches!(
        index.insert("", &[1], "a", T0),
        Err(InsertError::BadModel { .. })
    ));
    index.insert("m", &[1], "a", T0).unwrap();
    assert!(matches!(
        index.insert("m2", &[1], "a", T0),
        Err(InsertError::TooManyModels { max: 1 })
    ));
    assert!(matches!(
        index.insert("m", &[1], "123456789", T0),
        Err(InsertError::Pod(PodError::BadName { .. }))
    ));
    index.insert("m", &[1], "b", T0).unwrap();
    assert!(matches!(
        index.insert("m", &[1], "c", T0),
        Err(InsertError::Pod(PodError::TooManyPods { max: 2 }))
    ));
    // A removed pod's id comes back once its blocks are gone and two grace
    // periods passed (sweeps reclaim between them).
    assert!(index.remove_pod("a"));
    for _ in 0..4 {
        index.sweep(T0, usize::MAX);
    }
    index.insert("m", &[1], "c", T0).unwrap();
}

/// The entries of pod `id` along `key`, per block: which blocks it holds.
fn holds(index: &Index, key: &[u64], id: u32) -> Vec<bool> {
    let pin = index.pin();
    let tree = &index.models(&pin)["m"];
    let mut out = vec![false; key.len()];
    let mut from = 0;
    for (node, depth) in crate::walk::Path::new(tree.root(&pin), key, index.sh.seed) {
        let held = node.pods.find(id).is_some();
        out[from..depth].iter_mut().for_each(|b| *b = held);
        from = depth;
    }
    out
}

#[test]
fn an_insert_from_a_depth_holds_those_blocks_alone_and_keeps_the_others() {
    let index = idx();
    let key: Vec<u64> = (100..110).collect();
    let pin = index.pin();
    let tree = index.tree_or_create("m", &pin).unwrap();
    let [a, b] = ["a", "b"].map(|pod| {
        let id = index.sh.pods.intern(pod, 64, &index.sh.epoch, &pin);
        id.unwrap().0
    });
    // Into an empty tree: the blocks above are made without entries.
    tree.insert_from(&index.sh, &key[..6], 4, a, T0, &pin)
        .unwrap();
    let a_at = |k: &[u64]| holds(&index, k, a);
    assert_eq!(a_at(&key[..6]), [false, false, false, false, true, true]);
    // Through existing edges: cut where the range starts and where the
    // key leaves them; the other pod keeps every block it had.
    tree.insert(&index.sh, &key, b, T0, &pin).unwrap();
    tree.insert_from(&index.sh, &key, 8, a, T0, &pin).unwrap();
    let mut branch = key[..3].to_vec();
    branch.extend([7, 8]);
    tree.insert_from(&index.sh, &branch, 4, a, T0, &pin)
        .unwrap();
    assert_eq!(
        a_at(&key),
        [false, false, false, false, true, true, false, false, true, true]
    );
    assert_eq!(holds(&index, &key, b), [true; 10]);
    assert_eq!(a_at(&branch), [false, false, false, false, true]);
    let s = index.stats();
    assert_eq!(s.entries, 10 + 2 + 2 + 1);
    // The pod's entries count as its blocks, no more.
    assert_eq!(index.sh.pods.blocks(a), 5);
}

/// Pods registered in one step are what registering each makes: each
/// named and ranked (lookups name them, in name order), the repeated ones
/// once; past the last slot the step stops with the error, keeping those
/// before it.
#[test]
fn pods_registered_at_once_are_as_if_registered_each() {
    use crate::error::PodError;
    let index = Index::new(IndexConfig {
        max_pods: 3,
        ..IndexConfig::default()
    });
    index.register_pods(["c", "a", "c"]).unwrap();
    index.register_pods(["a"]).unwrap();
    assert_eq!(index.stats().pods, 2);
    for pod in ["c", "a"] {
        index.insert("m", &[1, 2], pod, T0).unwrap();
    }
    let got = index.lookup("m", &[1, 2], None, T0);
    assert_eq!(got, [("a".to_string(), 2), ("c".to_string(), 2)]);
    assert!(matches!(
        index.register_pods(["b", "d", "e"]),
        Err(PodError::TooManyPods { max: 3 })
    ));
    assert_eq!(index.stats().pods, 3);
    index.insert("m", &[1], "b", T0).unwrap();
    assert!(matches!(
        index.register_pods(["x\0y"]),
        Err(PodError::Reserved)
    ));
}
