//! Engine-fed pods applied from threads of their own, while gateway writers
//! split and refresh the same nodes and readers look up: each pod's final
//! state depends on its own events only, so every lookup must then agree
//! with an index that applied the same batches one pod after another, with
//! no other traffic.
//!
//! The batches store prompts that share prefixes (so pods share nodes and
//! split each other's edges) and remove their tails deepest first, in runs
//! of several blocks (released as one when the batch ends).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::fnv::{hash, seeded};
use prefix_index::{EngineOp, EngineSpec, Index, IndexConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const OURS: usize = 4;
const PROMPTS: u32 = 16;
/// Our blocks per prompt (engine blocks are ours).
const LEN: usize = 24;
const ENGINES: [&str; 3] = ["e0", "e1", "e2"];
const BATCHES: usize = 20_000;
const NOW: u64 = 1_700_000_000_000;

/// Prompt `p`'s tokens: every prompt shares its first 8 blocks, each group
/// of four its next 8.
fn tokens(p: u32) -> Vec<u32> {
    (0..LEN as u32)
        .flat_map(|i| {
            let owner = match i {
                0..=7 => 0,
                8..=15 => 100 + p / 4,
                _ => 200 + p,
            };
            [owner, i, 7, 7]
        })
        .collect()
}

fn our_key(p: u32) -> Vec<u64> {
    tokens(p).chunks(OURS).map(hash).collect()
}

/// The engine's chained hashes of prompt `p`.
fn engine_hashes(p: u32) -> Vec<u64> {
    let mut parent = 0x9e37_79b9_7f4a_7c15u64;
    tokens(p)
        .chunks(OURS)
        .map(|c| {
            parent = hash(c) ^ parent.rotate_left(17).wrapping_mul(31);
            parent
        })
        .collect()
}

/// One batch of one engine: an optional store of prompt `p`'s blocks
/// `from..to`, then a removal run of prompt `q`'s blocks `to_q..from_q`,
/// deepest first (one event each).
#[derive(Clone)]
struct Batch {
    store: Option<(u32, usize, usize)>,
    remove: Option<(u32, usize, usize)>,
}

/// Each engine's batches, from a seed: every engine's cache keeps, per
/// prompt, a held prefix, which stores extend and removals cut.
fn batches(seed: u64) -> Vec<Batch> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut held = [0usize; PROMPTS as usize];
    (0..BATCHES)
        .map(|_| {
            let p = rng.random_range(0..PROMPTS);
            let h = held[p as usize];
            let store = (h < LEN).then(|| {
                let to = rng.random_range(h + 1..=LEN);
                held[p as usize] = to;
                (p, h, to)
            });
            let q = rng.random_range(0..PROMPTS);
            let hq = held[q as usize];
            let remove = (hq > 0 && rng.random_bool(0.7)).then(|| {
                let n = rng.random_range(1..=hq.min(6));
                held[q as usize] = hq - n;
                (q, hq - n, hq)
            });
            Batch { store, remove }
        })
        .collect()
}

fn spec() -> EngineSpec {
    EngineSpec {
        engine_block: OURS as u32,
        our_block: OURS as u32,
        hash: seeded,
    }
}

fn index() -> Index {
    Index::new(IndexConfig {
        ttl: Duration::from_secs(3_600),
        ..IndexConfig::default()
    })
}

/// Applies `batches` as engine `pod`'s.
fn apply(index: &Index, pod: &str, batches: &[Batch]) {
    let engine = index.engine(pod, spec()).unwrap();
    let all_tokens: Vec<Vec<u32>> = (0..PROMPTS).map(tokens).collect();
    let all_hashes: Vec<Vec<u64>> = (0..PROMPTS).map(engine_hashes).collect();
    for b in batches {
        let mut e = engine.lock();
        let mut batch = index.batch(&mut e, pod);
        if let Some((p, from, to)) = b.store {
            let hs = &all_hashes[p as usize];
            let op = EngineOp::Stored {
                parent: from.checked_sub(1).map(|j| hs[j]),
                hashes: &hs[from..to],
                tokens: &all_tokens[p as usize][from * OURS..to * OURS],
                seeds: &[],
                alias: prefix_index::Alias::None,
            };
            batch.apply("m", op).unwrap();
        }
        if let Some((q, to, from)) = b.remove {
            for j in (to..from).rev() {
                let hashes = std::slice::from_ref(&all_hashes[q as usize][j]);
                batch.apply("m", EngineOp::Removed { hashes }).unwrap();
            }
        }
        batch.finish().unwrap();
    }
}

/// Every prefix of every prompt, answered for the engine-fed pods only.
fn answers(index: &Index) -> Vec<Vec<(String, u32)>> {
    let mut out = Vec::new();
    for p in 0..PROMPTS {
        let key = our_key(p);
        for len in 1..=LEN {
            let mut got = index.lookup("m", &key[..len], None, NOW);
            got.retain(|(pod, _)| ENGINES.contains(&pod.as_str()));
            got.sort();
            out.push(got);
        }
    }
    out
}

#[test]
fn engines_applied_concurrently_with_gateways_end_as_applied_alone() {
    for round in 0..3 {
        concurrent_round(round * ENGINES.len() as u64);
    }
}

fn concurrent_round(seed: u64) {
    let streams: Vec<Vec<Batch>> = (seed..seed + ENGINES.len() as u64).map(batches).collect();

    let alone = index();
    for (pod, stream) in ENGINES.iter().zip(&streams) {
        apply(&alone, pod, stream);
    }

    let shared = index();
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let engines: Vec<_> = ENGINES
            .iter()
            .zip(&streams)
            .map(|(pod, stream)| {
                let shared = &shared;
                s.spawn(move || apply(shared, pod, stream))
            })
            .collect();
        // Gateways insert prefixes of the same prompts for pods of their
        // own (splitting the engines' edges), and look up.
        s.spawn(|| {
            let mut rng = StdRng::seed_from_u64(99);
            let keys: Vec<Vec<u64>> = (0..PROMPTS).map(our_key).collect();
            while !done.load(Ordering::Relaxed) {
                let key = &keys[rng.random_range(0..PROMPTS as usize)];
                let len = rng.random_range(1..=LEN);
                let pod = ["g0", "g1"][rng.random_range(0..2)];
                shared.insert("m", &key[..len], pod, NOW).unwrap();
                shared.lookup("m", &key[..rng.random_range(1..=LEN)], None, NOW);
            }
        });
        for e in engines {
            e.join().unwrap();
        }
        done.store(true, Ordering::Relaxed);
    });

    let want = answers(&alone);
    assert!(
        want.iter().filter(|a| !a.is_empty()).count() > 50,
        "the engines end holding something"
    );
    assert_eq!(answers(&shared), want);
    // A sweep (the server's maintenance) changes nothing for them.
    shared.sweep(NOW, usize::MAX);
    assert_eq!(answers(&shared), want);
}
