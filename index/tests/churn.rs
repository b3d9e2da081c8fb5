//! Churn: insert, let expire, sweep, repeat. The index's own accounting and the
//! allocator's live bytes must come back to their baseline every round (a public
//! peer leaked 20 GB/h from edge splits that were never undone).

use std::alloc::System;
use std::time::Duration;

use counting_alloc::Counting;
use prefix_index::{Index, IndexConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Counts live heap bytes of this test binary.
#[global_allocator]
static ALLOC: Counting<System> = Counting::new(System);

#[test]
fn memory_returns_to_baseline_after_each_round() {
    const TTL: u64 = 1_000;
    let index = Index::new(IndexConfig {
        ttl: Duration::from_millis(TTL),
        ..IndexConfig::default()
    });
    let pods: Vec<String> = (0..16).map(|i| format!("pod-{i}")).collect();
    let mut rng = StdRng::seed_from_u64(3);
    let mut now = 1_000_000u64;
    let mut baseline = None;
    let mut peak = 0;
    for round in 0..8 {
        let (live0, bytes0) = (ALLOC.live(), index.stats().bytes);
        for i in 0..20_000u64 {
            // Shared prompts, diverging at random depths: many edge splits.
            let system = rng.random_range(0..20u64);
            let mut key: Vec<u64> = (0..16).map(|b| system * 100 + b).collect();
            let split = rng.random_range(0..16);
            key.truncate(split + 1);
            key.extend((0..rng.random_range(1..12)).map(|_| rng.random::<u64>()));
            index
                .insert("m", &key, &pods[(i % 16) as usize], now)
                .unwrap();
        }
        if round % 3 == 2 {
            // Some rounds also remove and re-add pods.
            index.remove_pod(&pods[round]);
        }
        peak = peak.max(index.stats().nodes);
        // The index's own memory accounting agrees with the allocator's (the
        // test's own allocations here are a few key vectors).
        index.reclaim();
        let grown = (ALLOC.live() - live0) as f64;
        let accounted = index.stats().bytes as f64 - bytes0 as f64;
        assert!(
            (accounted / grown - 1.0).abs() < 0.2,
            "round {round}: index accounts {accounted} bytes, allocator saw {grown}"
        );
        now += TTL + 1;
        // Sweep in small budgets, as the server does.
        while index.stats().nodes > 0 {
            index.sweep(now, 5_000);
        }
        for _ in 0..4 {
            index.sweep(now, 5_000);
        }
        let s = index.stats();
        assert_eq!(
            (s.nodes, s.entries, s.tree_blocks),
            (0, 0, 0),
            "round {round}: {s:?}"
        );
        let live = ALLOC.live();
        // Everything retired has been freed: only the roots' tables remain.
        assert!(
            s.bytes < 64 * 1024,
            "round {round}: {} bytes still accounted",
            s.bytes
        );
        match baseline {
            None => baseline = Some(live),
            Some(b) => assert!(
                live - b < 512 * 1024,
                "round {round}: live heap grew by {} bytes",
                live - b
            ),
        }
    }
    assert!(peak > 10_000, "the rounds built real trees ({peak} nodes)");
}
