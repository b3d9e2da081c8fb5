//! Detailed answers: lower tiers held apart and counted after the GPU's
//! match, and each pod's view.

use std::time::Duration;

use prefix_proto::PodView;

use crate::precise::{EngineOp, EngineSpec};
use crate::{DetailMatch, EngineHandle, Index, IndexConfig, Snapshot};

/// Engine blocks and ours: 4 tokens.
const BLOCK: u32 = 4;
const T0: u64 = 1_700_000_000_000;
const N: usize = 10;

fn hash(tokens: &[u32], seed: u64) -> u64 {
    let h = tokens.iter().fold(0xcbf2_9ce4_8422_2325, |h, &t| {
        (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3)
    });
    h ^ seed
}

fn spec() -> EngineSpec {
    EngineSpec {
        engine_block: BLOCK,
        our_block: BLOCK,
        hash,
    }
}

fn tokens() -> Vec<u32> {
    (0..N as u32 * BLOCK).collect()
}

/// The engine's hash of block `i`.
fn engine_hash(i: usize) -> u64 {
    1 << 40 | i as u64
}

/// Our key of the prompt.
fn key() -> Vec<u64> {
    tokens()
        .chunks(BLOCK as usize)
        .map(|c| hash(c, 0))
        .collect()
}

fn setup() -> (Index, EngineHandle) {
    let index = Index::new(IndexConfig {
        ttl: Duration::from_secs(60),
        ..IndexConfig::default()
    });
    let e = index.engine("pod", spec()).unwrap();
    (index, e)
}

#[derive(Clone, Copy)]
enum Tier {
    Gpu,
    /// A lower tier, by its index among the pod's.
    Lower(u32),
}

/// Stores blocks `from..to` (their tokens, or none: a placeholder).
fn store(index: &Index, e: &EngineHandle, tier: Tier, from: usize, to: usize, with_tokens: bool) {
    let hashes: Vec<u64> = (from..to).map(engine_hash).collect();
    let all = tokens();
    let toks = match with_tokens {
        true => &all[from * BLOCK as usize..to * BLOCK as usize],
        false => &[][..],
    };
    let op = EngineOp::Stored {
        parent: from.checked_sub(1).map(engine_hash),
        hashes: &hashes,
        tokens: toks,
        seeds: &[],
        alias: crate::Alias::None,
    };
    let mut engine = e.lock();
    let mut batch = index.batch(&mut engine, "pod");
    match tier {
        Tier::Gpu => batch.apply("m", op).unwrap(),
        Tier::Lower(t) => batch.apply_lower(t, "m", op).unwrap(),
    };
    batch.finish().unwrap();
}

fn remove(index: &Index, e: &EngineHandle, tier: Tier, blocks: &[usize]) {
    let mut engine = e.lock();
    let mut batch = index.batch(&mut engine, "pod");
    for &i in blocks {
        let op = EngineOp::Removed {
            hashes: &[engine_hash(i)],
        };
        match tier {
            Tier::Gpu => batch.apply("m", op).unwrap(),
            Tier::Lower(t) => batch.apply_lower(t, "m", op).unwrap(),
        };
    }
    batch.finish().unwrap();
}

/// The detailed answer as (pod, blocks, lower, view).
fn detail(index: &Index) -> Vec<(String, u32, u32, PodView)> {
    let r = index.reader();
    r.lookup_detail("m", &key(), None, T0)
        .matches
        .iter()
        .map(
            |&DetailMatch {
                 pod,
                 blocks,
                 lower,
                 view,
                 ..
             }| { (r.pod_name(pod).unwrap().to_string(), blocks, lower, view) },
        )
        .collect()
}

fn row(pod: &str, blocks: u32, lower: u32, view: PodView) -> (String, u32, u32, PodView) {
    (pod.to_string(), blocks, lower, view)
}

#[test]
fn a_lower_tier_is_counted_after_the_gpus_match_and_apart_from_it() {
    let (index, e) = setup();
    store(&index, &e, Tier::Gpu, 0, N, true);
    store(&index, &e, Tier::Lower(0), 0, N, true);
    assert_eq!(detail(&index), [row("pod", 10, 0, PodView::Exact)]);
    // The GPU evicts the tail; the CPU still holds it.
    remove(&index, &e, Tier::Gpu, &[9, 8, 7, 6]);
    assert_eq!(
        index.lookup("m", &key(), None, T0),
        [("pod".to_string(), 6)]
    );
    assert_eq!(detail(&index), [row("pod", 6, 4, PodView::Exact)]);
    // The lower run ends where the lower tier lacks a block.
    remove(&index, &e, Tier::Lower(0), &[8]);
    assert_eq!(detail(&index), [row("pod", 6, 2, PodView::Exact)]);
    // The GPU loses everything: the pod is answered by its lower tier
    // alone, and the plain answer has nothing.
    remove(&index, &e, Tier::Gpu, &[5, 4, 3, 2, 1, 0]);
    assert!(index.lookup("m", &key(), None, T0).is_empty());
    assert_eq!(detail(&index), [row("pod", 0, 8, PodView::Exact)]);
    // Candidates that leave it out leave it out.
    let r = index.reader();
    assert!(r
        .lookup_detail("m", &key(), Some(&["other"]), T0)
        .matches
        .is_empty());
}

/// The tiered answer as (pod, blocks, reach).
fn tiers(index: &Index) -> Vec<(String, u32, Vec<u32>)> {
    let r = index.reader();
    r.lookup_tiers("m", &key(), None, T0)
        .matches
        .iter()
        .map(|m| {
            let name = r.pod_name(m.pod).unwrap().to_string();
            (name, m.blocks, m.reach.to_vec())
        })
        .collect()
}

#[test]
fn each_lower_tier_reaches_as_far_as_it_and_the_tiers_before_it_hold() {
    let (index, e) = setup();
    store(&index, &e, Tier::Gpu, 0, N, true);
    store(&index, &e, Tier::Lower(0), 0, N, true);
    store(&index, &e, Tier::Lower(1), 0, N, true);
    remove(&index, &e, Tier::Gpu, &[9, 8, 7, 6, 5, 4]);
    // The CPU (tier 0) lacks 6, 7 and 9; the disk (tier 1) lacks 4, 5, 8.
    remove(&index, &e, Tier::Lower(0), &[6, 7, 9]);
    remove(&index, &e, Tier::Lower(1), &[4, 5, 8]);
    assert_eq!(tiers(&index), [("pod".to_string(), 4, vec![6, 10])]);
    // The detailed answer counts the run any lower tier holds.
    assert_eq!(detail(&index), [row("pod", 4, 6, PodView::Exact)]);
    // The disk loses block 6: the CPU still reaches 6, the disk 6 too.
    remove(&index, &e, Tier::Lower(1), &[6]);
    assert_eq!(tiers(&index), [("pod".to_string(), 4, vec![6, 6])]);
    // A snapshot keeps both tiers apart.
    let mut bytes = Vec::new();
    index.write_snapshot(&mut bytes, T0).unwrap();
    let fresh = Index::new(IndexConfig {
        ttl: Duration::from_secs(60),
        ..IndexConfig::default()
    });
    assert_eq!(
        Snapshot::parse(&bytes).unwrap().restore(&fresh, T0).refused,
        0
    );
    assert_eq!(tiers(&fresh), tiers(&index));
    // A pod without lower tiers answers no reach; a tier past the most a
    // pod may have is refused.
    index.insert("m", &key(), "gw", T0).unwrap();
    assert_eq!(tiers(&index)[0], ("gw".to_string(), 10, vec![]));
    let mut engine = e.lock();
    let mut batch = index.batch(&mut engine, "pod");
    let op = EngineOp::Removed { hashes: &[1] };
    assert!(batch.apply_lower(crate::MAX_LOWER_TIERS, "m", op).is_err());
}

#[test]
fn a_lower_tiers_placeholders_are_found_by_hash() {
    let (index, e) = setup();
    store(&index, &e, Tier::Gpu, 0, N, true);
    // vLLM's placeholders: hashes without tokens.
    store(&index, &e, Tier::Lower(0), 4, N, false);
    remove(&index, &e, Tier::Gpu, &[9, 8, 7, 6, 5, 4]);
    assert_eq!(detail(&index), [row("pod", 4, 6, PodView::Exact)]);
}

#[test]
fn a_clear_and_a_dropped_engine_take_the_lower_tier_too() {
    let (index, e) = setup();
    store(&index, &e, Tier::Gpu, 0, N, true);
    store(&index, &e, Tier::Lower(0), 0, N, true);
    {
        let mut engine = e.lock();
        index
            .apply(&mut engine, "pod", "m", EngineOp::Cleared)
            .unwrap();
    }
    assert!(detail(&index).is_empty());
    store(&index, &e, Tier::Lower(0), 0, N, true);
    assert_eq!(detail(&index), [row("pod", 0, 10, PodView::Exact)]);
    assert!(index.drop_engine_pod("pod"));
    assert!(detail(&index).is_empty());
}

#[test]
fn a_snapshot_keeps_the_lower_tier() {
    let (index, e) = setup();
    store(&index, &e, Tier::Gpu, 0, N, true);
    store(&index, &e, Tier::Lower(0), 0, N, true);
    remove(&index, &e, Tier::Gpu, &[9, 8, 7]);
    let mut bytes = Vec::new();
    index.write_snapshot(&mut bytes, T0).unwrap();
    let fresh = Index::new(IndexConfig {
        ttl: Duration::from_secs(60),
        ..IndexConfig::default()
    });
    let sum = Snapshot::parse(&bytes).unwrap().restore(&fresh, T0);
    assert_eq!(sum.refused, 0);
    assert_eq!(detail(&fresh), [row("pod", 7, 3, PodView::Exact)]);
}

#[test]
fn views_say_how_far_each_answer_holds() {
    let (index, e) = setup();
    store(&index, &e, Tier::Gpu, 0, 6, true);
    index.insert("m", &key(), "gw", T0).unwrap();
    assert_eq!(
        detail(&index),
        [
            row("gw", 10, 0, PodView::Gateway),
            row("pod", 6, 0, PodView::Exact)
        ]
    );
    index.set_view("pod", PodView::Learning);
    assert_eq!(detail(&index)[1], row("pod", 6, 0, PodView::Learning));
    index.set_view("pod", PodView::Disconnected);
    assert_eq!(detail(&index)[1], row("pod", 6, 0, PodView::Disconnected));
    // Set with others in one step, the last of a pod's views holds.
    index.set_views([
        ("pod", PodView::Replaying),
        ("other", PodView::Learning),
        ("pod", PodView::Learning),
    ]);
    assert_eq!(detail(&index)[1], row("pod", 6, 0, PodView::Learning));
    index.set_view("pod", PodView::Exact);
    // A gateway's insert past the engine's blocks: speculative until the
    // engine confirms it.
    index.insert("m", &key(), "pod", T0).unwrap();
    assert_eq!(detail(&index)[1], row("pod", 10, 0, PodView::Speculative));
    store(&index, &e, Tier::Gpu, 6, N, true);
    assert_eq!(detail(&index)[1], row("pod", 10, 0, PodView::Exact));
}

#[test]
fn a_gateway_pods_answer_says_how_long_ago_its_last_block_was_written() {
    let (index, e) = setup();
    store(&index, &e, Tier::Gpu, 0, N, true);
    let k = key();
    index.insert("m", &k[..4], "gw", T0 - 5_000).unwrap();
    index.insert("m", &k[..2], "gw", T0 - 1_000).unwrap();
    let r = index.reader();
    let found = r.lookup_detail("m", &k, None, T0).matches;
    let age = |name: &str| {
        let m = found
            .iter()
            .find(|m| r.pod_name(m.pod) == Some(name))
            .unwrap();
        (m.view, m.blocks, m.age)
    };
    // The fourth block was last written 5 s ago (the second, 1 s ago).
    assert_eq!(age("gw"), (PodView::Gateway, 4, 5_000));
    assert_eq!(age("pod"), (PodView::Exact, 10, 0));
}
