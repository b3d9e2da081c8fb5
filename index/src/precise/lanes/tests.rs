//! Hybrid models: the index's answers against a plain transcription of
//! vLLM's hit rules, and the pieces around them (hidden pods, clears,
//! snapshots, skipping stores).

use std::collections::HashMap;

use proptest::prelude::*;

use crate::precise::groups::{Group, GroupKind};
use crate::precise::tests::{hash, index, seeded, stored_op};
use crate::precise::{Applied, EngineOp, EngineSpec};
use crate::{EngineHandle, Index, PodError, Snapshot};

/// Our block: 4 tokens.
const OURS: u32 = 4;
const T0: u64 = 1_700_000_000_000;

/// Two prompts of `n` engine blocks of `r` of ours each: prompt 1 shares
/// its first `shared` blocks with prompt 0. Block `i`'s tokens and engine
/// hash, per prompt.
struct Prompts {
    r: u32,
    n: usize,
    shared: usize,
}

impl Prompts {
    fn source(&self, p: usize, i: usize) -> usize {
        if i < self.shared {
            0
        } else {
            p
        }
    }

    fn tokens(&self, p: usize, i: usize) -> Vec<u32> {
        let src = self.source(p, i) as u32;
        (0..self.r * OURS)
            .map(|t| src * 10_000 + i as u32 * 100 + t)
            .collect()
    }

    fn engine_hash(&self, p: usize, i: usize) -> u64 {
        (self.source(p, i) as u64 + 1) << 32 | i as u64
    }

    /// Our key of the prompt's first `blocks` of ours.
    fn key(&self, p: usize, blocks: usize) -> Vec<u64> {
        (0..self.n)
            .flat_map(|i| self.tokens(p, i))
            .collect::<Vec<_>>()
            .chunks(OURS as usize)
            .take(blocks)
            .map(hash)
            .collect()
    }
}

fn apply(index: &Index, e: &EngineHandle, group: Group, op: EngineOp<'_>) -> Applied {
    let mut engine = e.lock();
    let mut batch = index.batch(&mut engine, "pod");
    let mut done = batch.apply_group(group, "m", op).unwrap();
    done.add(&batch.finish().unwrap());
    done
}

/// vLLM's hit, transcribed plainly from `HybridKVCacheCoordinator` and the
/// managers of `single_type_kv_cache_manager.py` (no EAGLE, one block size,
/// alignment to it): groups of one spec checked together, full attention
/// first, a fixed point (one pass for one full group beside one other).
fn vllm_hit(
    groups: &[(GroupKind, HashMap<u64, u32>)],
    hashes: &[u64],
    block_size: u32,
    max_blocks: usize,
) -> usize {
    if groups.iter().any(|g| g.0 == GroupKind::Unmodelled) {
        return 0;
    }
    let cached = |ids: &[usize], h: u64| {
        ids.iter()
            .all(|&g| groups[g].1.get(&h).is_some_and(|&c| c > 0))
    };
    // attention_groups: same spec together, full attention first.
    let mut specs: Vec<(GroupKind, Vec<usize>)> = Vec::new();
    for (g, (kind, _)) in groups.iter().enumerate() {
        match specs.iter_mut().find(|s| s.0 == *kind) {
            Some(s) => s.1.push(g),
            None => specs.push((*kind, vec![g])),
        }
    }
    specs.sort_by_key(|s| s.0 != GroupKind::Full);
    let find = |kind: GroupKind, ids: &[usize], max_length: usize| -> usize {
        let max_num_blocks = max_length.min(hashes.len());
        match kind {
            GroupKind::Full => (0..max_num_blocks)
                .take_while(|&i| cached(ids, hashes[i]))
                .count(),
            GroupKind::Window(window) => {
                let contiguous = (window as usize)
                    .saturating_sub(1)
                    .div_ceil(block_size as usize);
                let mut num_contiguous = 0;
                for i in (0..max_num_blocks).rev() {
                    if cached(ids, hashes[i]) {
                        num_contiguous += 1;
                        if num_contiguous >= contiguous {
                            return i + num_contiguous;
                        }
                    } else {
                        num_contiguous = 0;
                    }
                }
                num_contiguous
            }
            GroupKind::Mamba => (0..max_num_blocks)
                .rev()
                .find(|&i| cached(ids, hashes[i]))
                .map_or(0, |i| i + 1),
            GroupKind::Unmodelled => 0,
        }
    };
    let simple = specs.len() == 2 && specs[0].0 == GroupKind::Full;
    let mut hit_length = max_blocks;
    let mut full_hit: Option<usize> = None;
    loop {
        let mut curr = hit_length;
        for (kind, ids) in &specs {
            if *kind == GroupKind::Full {
                if let Some(f) = full_hit {
                    curr = curr.min(f);
                    continue;
                }
            }
            curr = find(*kind, ids, curr);
            if *kind == GroupKind::Full {
                full_hit = Some(curr);
            }
        }
        if curr >= hit_length {
            break;
        }
        hit_length = curr;
        if simple {
            break;
        }
    }
    hit_length
}

/// What an engine does, step by step.
#[derive(Debug, Clone)]
enum Step {
    /// A request computes the first `len` blocks of prompt `p`: each group
    /// stores them, skipping those it does not keep.
    Request { p: usize, len: usize },
    /// Group `g` evicts one copy of block `i` of prompt `p`, if it holds one.
    Evict { g: usize, p: usize, i: usize },
    /// The engine's cache is emptied.
    Clear,
}

fn kind() -> impl Strategy<Value = GroupKind> {
    prop_oneof![
        3 => Just(GroupKind::Full),
        3 => (1u32..40).prop_map(GroupKind::Window),
        2 => Just(GroupKind::Mamba),
        1 => Just(GroupKind::Unmodelled),
    ]
}

/// The blocks of `0..len` a group of `kind` keeps after computing them
/// (vLLM nulls what a sliding window moved past; Mamba keeps its state at
/// the end).
fn kept(kind: GroupKind, len: usize, block_size: u32) -> std::ops::Range<usize> {
    match kind {
        GroupKind::Full | GroupKind::Unmodelled => 0..len,
        GroupKind::Window(w) => {
            let need = (w as usize)
                .saturating_sub(1)
                .div_ceil(block_size as usize)
                .max(1);
            len.saturating_sub(need)..len
        }
        GroupKind::Mamba => len.saturating_sub(1)..len,
    }
}

fn run(
    kinds: Vec<GroupKind>,
    r: u32,
    shared: usize,
    steps: Vec<Step>,
) -> Result<(), TestCaseError> {
    let prompts = Prompts { r, n: 8, shared };
    let block_size = r * OURS;
    let index = index();
    let e = index
        .engine(
            "pod",
            EngineSpec {
                engine_block: block_size,
                our_block: OURS,
                hash: seeded,
            },
        )
        .unwrap();
    let mut groups: Vec<(GroupKind, HashMap<u64, u32>)> =
        kinds.iter().map(|&k| (k, HashMap::new())).collect();
    for step in steps {
        match step {
            Step::Request { p, len } => {
                let len = len.min(prompts.n);
                let tokens: Vec<u32> = (0..len).flat_map(|i| prompts.tokens(p, i)).collect();
                // One scheduler step: one batch, the groups in order.
                let mut engine = e.lock();
                let mut batch = index.batch(&mut engine, "pod");
                for (g, (kind, held)) in groups.iter_mut().enumerate() {
                    let keep = kept(*kind, len, block_size);
                    let hashes: Vec<u64> =
                        keep.clone().map(|i| prompts.engine_hash(p, i)).collect();
                    let op = stored_op(None, &hashes, &tokens);
                    let group = Group {
                        idx: g as u32,
                        kind: *kind,
                    };
                    batch.apply_group(group, "m", op).unwrap();
                    for h in hashes {
                        *held.entry(h).or_default() += 1;
                    }
                }
                batch.finish().unwrap();
            }
            Step::Evict { g, p, i } => {
                let g = g % groups.len();
                let h = prompts.engine_hash(p, i);
                let held = &mut groups[g].1;
                if let Some(c) = held.get_mut(&h).filter(|c| **c > 0) {
                    *c -= 1;
                    let group = Group {
                        idx: g as u32,
                        kind: groups[g].0,
                    };
                    apply(&index, &e, group, EngineOp::Removed { hashes: &[h] });
                }
            }
            Step::Clear => {
                apply(&index, &e, Group::PLAIN, EngineOp::Cleared);
                for (_, held) in &mut groups {
                    held.clear();
                }
            }
        }
        for p in 0..2 {
            let hashes: Vec<u64> = (0..prompts.n).map(|i| prompts.engine_hash(p, i)).collect();
            for ours in 0..=prompts.n * r as usize {
                let want = vllm_hit(&groups, &hashes, block_size, ours / r as usize) * r as usize;
                let got = index.lookup("m", &prompts.key(p, ours), None, T0);
                let got = got.first().map_or(0, |m| m.1 as usize);
                prop_assert_eq!(
                    got,
                    want,
                    "prompt {} key of {} blocks, groups {:?}",
                    p,
                    ours,
                    kinds
                );
            }
        }
    }
    Ok(())
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => (0usize..2, 1usize..=8).prop_map(|(p, len)| Step::Request { p, len }),
        6 => (0usize..4, 0usize..2, 0usize..8).prop_map(|(g, p, i)| Step::Evict { g, p, i }),
        1 => Just(Step::Clear),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    /// Random groups (at least one of full attention, in any place), random
    /// requests, evictions and clears: every prefix of both prompts answers
    /// as vLLM's coordinator finds the hit.
    #[test]
    fn hybrid_pods_answer_as_vllm_finds_the_hit(
        mut kinds in prop::collection::vec(kind(), 1..4),
        full_at in 0usize..4,
        r in 1u32..3,
        shared in 0usize..8,
        steps in prop::collection::vec(step(), 1..24),
    ) {
        let at = full_at % (kinds.len() + 1);
        kinds.insert(at, GroupKind::Full);
        run(kinds, r, shared, steps)?;
    }
}

/// The engine-fed pod "pod", engine blocks of 4 tokens.
fn engine(index: &Index) -> EngineHandle {
    let spec = EngineSpec {
        engine_block: 4,
        our_block: OURS,
        hash: seeded,
    };
    index.engine("pod", spec).unwrap()
}

/// One full group and one sliding window of 32 tokens over blocks of 16
/// (two blocks): the case.
fn hybrid() -> (Index, EngineHandle, Prompts) {
    let index = index();
    let e = engine(&index);
    (
        index,
        e,
        Prompts {
            r: 1,
            n: 10,
            shared: 0,
        },
    )
}

/// [`hybrid`], the full group holding all ten blocks and the window those
/// of `window`.
fn hybrid_stored(window: std::ops::Range<usize>) -> (Index, EngineHandle, Prompts) {
    let (index, e, p) = hybrid();
    store_all(&index, &e, &p, FULL, 0..10);
    store_all(&index, &e, &p, WINDOW, window);
    (index, e, p)
}

/// The pod's groups are gone: a gateway's insert under its name makes it a
/// plain pod again, which answers as any once its engine's handle is
/// dropped.
fn assert_a_plain_pod_again(index: &Index, e: EngineHandle, p: &Prompts) {
    index.insert("m", &p.key(0, 4), "pod", T0).unwrap();
    drop(e);
    assert_eq!(answer(index, p), [("pod".to_string(), 4)]);
}

const FULL: Group = Group {
    idx: 0,
    kind: GroupKind::Full,
};
/// A window of 8 tokens over blocks of 4: `cdiv(7, 4)` = 2 blocks.
const WINDOW: Group = Group {
    idx: 1,
    kind: GroupKind::Window(8),
};

fn store_all(
    index: &Index,
    e: &EngineHandle,
    p: &Prompts,
    group: Group,
    keep: std::ops::Range<usize>,
) -> Applied {
    let tokens: Vec<u32> = (0..p.n).flat_map(|i| p.tokens(0, i)).collect();
    let hashes: Vec<u64> = keep.map(|i| p.engine_hash(0, i)).collect();
    apply(index, e, group, stored_op(None, &hashes, &tokens))
}

fn answer(index: &Index, p: &Prompts) -> Vec<(String, u32)> {
    index.lookup("m", &p.key(0, p.n), None, T0)
}

#[test]
fn a_window_that_lost_the_last_blocks_cuts_the_hit_where_it_still_covers() {
    let (index, e, p) = hybrid_stored(0..10);
    assert_eq!(answer(&index, &p), [("pod".to_string(), 10)]);
    let evict = |i: usize| {
        let h = p.engine_hash(0, i);
        apply(&index, &e, WINDOW, EngineOp::Removed { hashes: &[h] })
    };
    evict(9);
    evict(8);
    assert_eq!(answer(&index, &p), [("pod".to_string(), 8)]);
    // Blocks far behind the window do not matter.
    evict(0);
    evict(1);
    evict(2);
    assert_eq!(answer(&index, &p), [("pod".to_string(), 8)]);
    // One of the window's two blocks before 8 gone: the next run of two
    // (5 and 6) ends the hit at 7.
    evict(7);
    assert_eq!(answer(&index, &p), [("pod".to_string(), 7)]);
}

#[test]
fn a_window_first_whose_store_skips_blocks_is_found_through_the_full_group() {
    let (index, e, p) = hybrid();
    let window_first = Group {
        idx: 0,
        kind: GroupKind::Window(8),
    };
    let full_second = Group {
        idx: 1,
        kind: GroupKind::Full,
    };
    // One batch, the window's store first: it names blocks 8 and 9 only,
    // under tokens of all ten, before any record of them exists.
    let tokens: Vec<u32> = (0..p.n).flat_map(|i| p.tokens(0, i)).collect();
    let all: Vec<u64> = (0..10).map(|i| p.engine_hash(0, i)).collect();
    let mut engine = e.lock();
    let mut batch = index.batch(&mut engine, "pod");
    let op = |hashes| stored_op(None, hashes, &tokens);
    let a = batch.apply_group(window_first, "m", op(&all[8..])).unwrap();
    assert_eq!(a.stored, 0);
    let b = batch.apply_group(full_second, "m", op(&all)).unwrap();
    assert_eq!(
        b.stored, 12,
        "ten of the full group's and the window's two, found now"
    );
    let end = batch.finish().unwrap();
    assert_eq!(end.unresolved, 0);
    drop(engine);
    assert_eq!(answer(&index, &p), [("pod".to_string(), 10)]);
    // A skipping store whose blocks no group records is not held.
    let other: Vec<u64> = vec![77, 78];
    let done = apply(&index, &e, window_first, op(&other));
    assert_eq!((done.stored, done.unresolved), (0, 2));
}

#[test]
fn groups_live_in_hidden_pods_no_caller_can_name() {
    let (index, e, p) = hybrid_stored(8..10);
    assert_eq!(index.stats().pods, 1);
    let hidden = "pod\u{0}1";
    assert_eq!(
        index.insert("m", &p.key(0, 3), hidden, T0),
        Err(PodError::Reserved.into())
    );
    assert_eq!(index.set_pod_capacity(hidden, 1), Err(PodError::Reserved));
    assert!(!index.remove_pod(hidden));
    // Named as a candidate, it is no match.
    let got = index.lookup("m", &p.key(0, 10), Some(&[hidden, "pod"]), T0);
    assert_eq!(got, [("pod".to_string(), 10)]);
    // Removing the pod removes its groups: a pod of that name is then a
    // gateway's plain pod again.
    assert!(index.remove_pod("pod"));
    assert_a_plain_pod_again(&index, e, &p);
}

/// A hybrid engine-fed pod dropped (its engine unsubscribed) takes its
/// groups' hidden pods and its group table with it: a pod of that name is
/// then a gateway's plain pod again.
#[test]
fn a_dropped_hybrid_pod_takes_its_groups() {
    let (index, e, p) = hybrid_stored(8..10);
    let hidden = "pod\u{0}1";
    assert!(index.is_grouped("pod"));
    assert!(index.sh.pods.id(hidden, &index.pin()).is_some());
    assert_eq!(index.drop_engine_pods(&["pod"]), [true]);
    assert!(!index.is_grouped("pod"));
    assert!(index.sh.pods.id(hidden, &index.pin()).is_none());
    assert!(answer(&index, &p).is_empty());
    assert_a_plain_pod_again(&index, e, &p);
}

#[test]
fn a_clear_empties_every_group_and_the_kinds_stay_known() {
    let (index, e, p) = hybrid_stored(8..10);
    apply(&index, &e, FULL, EngineOp::Cleared);
    assert!(answer(&index, &p).is_empty());
    // The full group alone stores again: the window holds nothing, so
    // nothing is a hit (as vLLM finds it).
    store_all(&index, &e, &p, FULL, 0..10);
    assert!(answer(&index, &p).is_empty());
    store_all(&index, &e, &p, WINDOW, 4..6);
    assert_eq!(answer(&index, &p), [("pod".to_string(), 6)]);
}

#[test]
fn an_unmodelled_group_makes_the_pod_match_nothing() {
    let (index, e, p) = hybrid();
    store_all(&index, &e, &p, FULL, 0..10);
    assert_eq!(answer(&index, &p), [("pod".to_string(), 10)]);
    let odd = Group {
        idx: 2,
        kind: GroupKind::Unmodelled,
    };
    let done = store_all(&index, &e, &p, odd, 0..10);
    assert_eq!(done.unmodelled, 10);
    assert!(answer(&index, &p).is_empty());
}

#[test]
fn groups_past_the_bound_are_refused() {
    let (index, e, p) = hybrid();
    let far = Group {
        idx: 32,
        kind: GroupKind::Full,
    };
    let tokens: Vec<u32> = p.tokens(0, 0);
    let mut engine = e.lock();
    let err = index
        .batch(&mut engine, "pod")
        .apply_group(far, "m", stored_op(None, &[1], &tokens))
        .unwrap_err();
    assert_eq!(err, crate::EngineError::Group { idx: 32, max: 32 });
}

#[test]
fn a_snapshot_keeps_each_groups_blocks() {
    let (index, e, p) = hybrid_stored(0..10);
    for i in [9, 8, 2] {
        let h = p.engine_hash(0, i);
        apply(&index, &e, WINDOW, EngineOp::Removed { hashes: &[h] });
    }
    assert_eq!(answer(&index, &p), [("pod".to_string(), 8)]);
    let mut bytes = Vec::new();
    index.write_snapshot(&mut bytes, T0).unwrap();
    let fresh = self::index();
    let sum = Snapshot::parse(&bytes).unwrap().restore(&fresh, T0);
    assert_eq!(sum.refused, 0);
    assert_eq!(answer(&fresh, &p), [("pod".to_string(), 8)]);
    // The window's blocks are the window's again: losing 7 cuts to 7.
    let e2 = engine(&fresh);
    let h = p.engine_hash(0, 7);
    apply(&fresh, &e2, WINDOW, EngineOp::Removed { hashes: &[h] });
    assert_eq!(answer(&fresh, &p), [("pod".to_string(), 7)]);
}
