//! Property test: random operation sequences against the sequential model,
//! comparing every lookup exactly, and the index's counters after each sweep.

mod common;

use std::time::Duration;

use common::Model;
use prefix_index::{Index, IndexConfig, Snapshot};
use proptest::prelude::*;

const TTL: u64 = 50;
const PODS: [&str; 4] = ["a", "b", "pod-c", "pod-d"];
/// More pods than fit the lookup's 64-bit rank word.
static MANY: std::sync::LazyLock<Vec<String>> =
    std::sync::LazyLock::new(|| (0..70).map(|i| format!("pod-{i:02}")).collect());
const MODELS: [&str; 2] = ["m1", "m2"];

#[derive(Debug, Clone)]
enum Op {
    Insert {
        model: usize,
        key: Vec<u64>,
        pod: usize,
    },
    Lookup {
        model: usize,
        key: Vec<u64>,
        cands: Option<Vec<usize>>,
    },
    RemovePod(usize),
    SetCapacity {
        pod: usize,
        blocks: u64,
    },
    Sweep,
    /// A sweep with a small budget: only TTL and removal work may happen in it,
    /// none visible to lookups (so it is only generated without capacities).
    PartialSweep(usize),
    Advance(u64),
    /// Snapshot the index, restore it into a fresh one, and go on with that.
    Restart,
    /// A jump far past the TTL (every entry expires at once).
    Jump,
}

fn key() -> impl Strategy<Value = Vec<u64>> {
    // A tiny alphabet and short keys: many shared prefixes, many splits.
    prop::collection::vec(0u64..3, 0..9)
}

fn op(with_capacity: bool) -> impl Strategy<Value = Op> {
    op_with(with_capacity, PODS.len(), false)
}

fn op_with(with_capacity: bool, pods: usize, restarts: bool) -> impl Strategy<Value = Op> {
    let cap_weight = if with_capacity { 2 } else { 0 };
    let partial_weight = if with_capacity { 0 } else { 2 };
    let restart_weight = if restarts { 2 } else { 0 };
    prop_oneof![
        8 => (0..MODELS.len(), key(), 0..pods).prop_map(|(model, key, pod)| Op::Insert { model, key, pod }),
        6 => (0..MODELS.len(), key(), prop::option::of(prop::collection::vec(0..pods, 0..3)))
            .prop_map(|(model, key, cands)| Op::Lookup { model, key, cands }),
        1 => (0..pods).prop_map(Op::RemovePod),
        cap_weight => (0..pods, 0u64..12).prop_map(|(pod, blocks)| Op::SetCapacity { pod, blocks }),
        2 => Just(Op::Sweep),
        partial_weight => (1usize..4).prop_map(Op::PartialSweep),
        2 => (0..2 * TTL).prop_map(Op::Advance),
        restart_weight => Just(Op::Restart),
        (restart_weight / 2) => Just(Op::Jump),
    ]
}

fn run(ops: Vec<Op>, default_capacity: u64) -> Result<(), TestCaseError> {
    run_with(ops, default_capacity, &PODS)
}

fn run_with(ops: Vec<Op>, default_capacity: u64, pods: &[&str]) -> Result<(), TestCaseError> {
    let cfg = IndexConfig {
        ttl: Duration::from_millis(TTL),
        pod_capacity: default_capacity,
        ..IndexConfig::default()
    };
    let mut index = Index::new(cfg.clone());
    let mut model = Model::new(TTL, default_capacity);
    // Every op moves time on, so no two inserts share a timestamp.
    let mut now = 1_000;
    for op in ops {
        now += 1;
        match op {
            Op::Insert { model: m, key, pod } => {
                index.insert(MODELS[m], &key, pods[pod], now).unwrap();
                model.insert(MODELS[m], &key, pods[pod], now);
            }
            Op::Lookup {
                model: m,
                key,
                cands,
            } => {
                let names: Option<Vec<&str>> =
                    cands.map(|c| c.into_iter().map(|i| pods[i]).collect());
                let got = index.lookup(MODELS[m], &key, names.as_deref(), now);
                let want = model.lookup(MODELS[m], &key, names.as_deref(), now);
                prop_assert_eq!(got, want, "lookup {:?} {:?} at {}", MODELS[m], key, now);
            }
            Op::RemovePod(p) => {
                index.remove_pod(pods[p]);
                model.remove_pod(pods[p]);
            }
            Op::SetCapacity { pod, blocks } => {
                index.set_pod_capacity(pods[pod], blocks).unwrap();
                model.set_capacity(pods[pod], blocks);
            }
            Op::Sweep => {
                index.sweep(now, usize::MAX);
                model.sweep(now);
                let s = index.stats();
                prop_assert_eq!(s.entries, model.entries(), "entries after sweep");
                prop_assert_eq!(
                    s.tree_blocks,
                    model.tree_blocks(),
                    "tree blocks after sweep"
                );
                for &p in pods {
                    let want: u64 = model
                        .prefixes
                        .values()
                        .flat_map(|t| t.values())
                        .filter(|pods| pods.contains_key(p))
                        .count() as u64;
                    prop_assert_eq!(index.pod_blocks(p), want, "blocks of {}", p);
                }
            }
            Op::PartialSweep(budget) => {
                index.sweep(now, budget);
            }
            Op::Advance(ms) => now += ms,
            Op::Jump => now += 10 * TTL,
            Op::Restart => {
                let mut bytes = Vec::new();
                index.write_snapshot(&mut bytes, now).unwrap();
                let fresh = Index::new(cfg.clone());
                Snapshot::parse(&bytes).unwrap().restore(&fresh, now);
                index = fresh;
            }
        }
        // Every lookup of every stored prefix agrees, not only the sampled ones.
        for (m, tree) in &model.prefixes {
            for prefix in tree.keys() {
                prop_assert_eq!(
                    index.lookup(m, prefix, None, now),
                    model.lookup(m, prefix, None, now)
                );
            }
        }
    }
    Ok(())
}

proptest! {
    // 256 cases in CI; PROPTEST_CASES=20000 for a long run.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256),
        ..ProptestConfig::default()
    })]

    #[test]
    fn matches_the_model_with_capacities(ops in prop::collection::vec(op(true), 1..80)) {
        run(ops, 10)?;
    }

    #[test]
    fn matches_the_model_across_restarts_and_jumps(ops in prop::collection::vec(op_with(true, 70, true), 1..120)) {
        let pods: Vec<&str> = MANY.iter().map(String::as_str).collect();
        run_with(ops, 10, &pods)?;
    }

    #[test]
    fn matches_the_model_with_partial_sweeps(ops in prop::collection::vec(op(false), 1..80)) {
        run(ops, 1 << 40)?;
    }
}
