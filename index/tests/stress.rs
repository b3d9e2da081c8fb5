//! Multi-thread stress: writers and readers on overlapping, self-similar keys.
//!
//! While it runs, every reader checks two things against the writers' published
//! progress: no lookup reports a prefix that its pod had not begun to insert,
//! and a lookup that starts after an insert returned sees all of it. After the
//! join, every lookup must equal the sequential model's answer.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Model;
use prefix_index::{Index, IndexConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const NOW: u64 = 1_000_000;

/// Keys with shared system prompts, shared conversation openings (so writers
/// split each other's edges) and per-writer growing turns.
fn keys_for(writer: usize, count: usize) -> Vec<Vec<u64>> {
    let mut rng = StdRng::seed_from_u64(writer as u64);
    let mut convs: HashMap<u64, Vec<u64>> = HashMap::new();
    (0..count)
        .map(|_| {
            let conv = rng.random_range(0..64u64);
            let key = convs.entry(conv).or_insert_with(|| {
                let system = conv % 4;
                let mut k: Vec<u64> = (0..8 * (system + 1)).map(|b| system * 1000 + b).collect();
                // Shared across writers: the same conversation id opens alike.
                k.extend((0..3).map(|b| 100_000 + conv * 10 + b));
                k
            });
            // Conversations end and start again from their opening.
            if key.len() > 64 {
                key.truncate(8 * (conv as usize % 4 + 1) + 3);
            }
            // This writer's own turn, sometimes a short one that ends mid-edge.
            let turn = rng.random_range(1..6);
            key.extend(
                (0..turn).map(|_| rng.random_range(0..4u64) + 1_000_000 * (writer as u64 + 1)),
            );
            if rng.random_bool(0.2) {
                let cut = rng.random_range(1..key.len());
                key[..cut].to_vec()
            } else {
                key.clone()
            }
        })
        .collect()
}

/// For each prefix of each key: the index of the first key that contains it.
fn first_seen(keys: &[Vec<u64>]) -> HashMap<Vec<u64>, usize> {
    let mut first = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        for len in 1..=k.len() {
            first.entry(k[..len].to_vec()).or_insert(i);
        }
    }
    first
}

fn run(writers: usize, readers: usize, keys_per_writer: usize) {
    let index = Arc::new(Index::new(IndexConfig::default()));
    let keys: Arc<Vec<Vec<Vec<u64>>>> =
        Arc::new((0..writers).map(|w| keys_for(w, keys_per_writer)).collect());
    let first: Arc<Vec<_>> = Arc::new(keys.iter().map(|k| first_seen(k)).collect());
    let progress: Arc<Vec<AtomicUsize>> =
        Arc::new((0..writers).map(|_| AtomicUsize::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));
    let pods: Vec<String> = (0..writers).map(|w| format!("pod-{w}")).collect();

    let mut handles = Vec::new();
    for w in 0..writers {
        let (index, keys, progress, pod) = (
            index.clone(),
            keys.clone(),
            progress.clone(),
            pods[w].clone(),
        );
        handles.push(std::thread::spawn(move || {
            for (i, k) in keys[w].iter().enumerate() {
                index.insert("m", k, &pod, NOW).unwrap();
                // Release: a reader that sees i + 1 sees that insert returned.
                progress[w].store(i + 1, Ordering::Release);
            }
        }));
    }
    let mut checkers = Vec::new();
    for r in 0..readers {
        let (index, keys, first, progress, done, pods) = (
            index.clone(),
            keys.clone(),
            first.clone(),
            progress.clone(),
            done.clone(),
            pods.clone(),
        );
        checkers.push(std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(1000 + r as u64);
            let mut checked = 0u64;
            while !done.load(Ordering::Acquire) || checked == 0 {
                let w = rng.random_range(0..keys.len());
                // Acquire: pairs with the writer's Release store.
                let before = progress[w].load(Ordering::Acquire);
                let probe = if before > 0 { &keys[w][before - 1] } else { &keys[w][0] };
                let reader = index.reader();
                let found = reader.lookup("m", probe, None, NOW);
                let named: Vec<(usize, u32)> = found
                    .matches
                    .iter()
                    .map(|m| {
                        let name = reader.pod_name(m.pod).expect("a matched pod has a name");
                        (pods.iter().position(|p| p == name).expect("known pod"), m.blocks)
                    })
                    .collect();
                drop(reader);
                for &(p, blocks) in &named {
                    let after = progress[p].load(Ordering::Acquire);
                    let prefix = &probe[..blocks as usize];
                    let seen = first[p].get(prefix).copied();
                    // The pod's first key holding this prefix must have started.
                    assert!(
                        seen.is_some_and(|i| i <= after),
                        "pod-{p} reported {blocks} blocks it was never given (first {seen:?}, progress {after})"
                    );
                }
                if before > 0 {
                    let own = named.iter().find(|(p, _)| *p == w).map_or(0, |x| x.1);
                    assert_eq!(own as usize, probe.len(), "pod-{w} lost a finished insert");
                }
                checked += 1;
            }
            checked
        }));
    }
    for h in handles {
        h.join().unwrap();
    }
    done.store(true, Ordering::Release);
    let checked: u64 = checkers.into_iter().map(|h| h.join().unwrap()).sum();
    assert!(checked > 0);

    let mut model = Model::new(u64::MAX, u64::MAX);
    for (w, ks) in keys.iter().enumerate() {
        for k in ks {
            model.insert("m", k, &pods[w], NOW);
        }
    }
    for ks in keys.iter() {
        for k in ks {
            assert_eq!(
                index.lookup("m", k, None, NOW),
                model.lookup("m", k, None, NOW)
            );
        }
    }
    let s = index.stats();
    assert_eq!(s.entries, model.entries());
    assert_eq!(s.tree_blocks, model.tree_blocks());
}

#[test]
fn writers_and_readers_agree_with_the_model() {
    run(3, 3, 20_000);
}

#[test]
#[ignore = "slow: run with --ignored"]
fn writers_and_readers_agree_with_the_model_long() {
    run(6, 6, 50_000);
}

/// Writers, readers, a sweeper with advancing time, and pod removals: no reader
/// ever sees a block its pod was not given, and at the end the index, swept,
/// holds exactly what the model holds.
#[test]
fn sweeps_and_removals_during_traffic() {
    const TTL: u64 = 200;
    let index = Arc::new(Index::new(IndexConfig {
        ttl: Duration::from_millis(TTL),
        ..IndexConfig::default()
    }));
    let clock = Arc::new(AtomicUsize::new(NOW as usize));
    let done = Arc::new(AtomicBool::new(false));
    let writers = 3;
    let keys: Arc<Vec<Vec<Vec<u64>>>> =
        Arc::new((0..writers).map(|w| keys_for(w, 3_000)).collect());
    let first: Arc<Vec<_>> = Arc::new(keys.iter().map(|k| first_seen(k)).collect());
    let mut handles = Vec::new();
    for w in 0..writers {
        let (index, keys, clock) = (index.clone(), keys.clone(), clock.clone());
        handles.push(std::thread::spawn(move || {
            let mut log = Vec::new();
            for (i, k) in keys[w].iter().enumerate() {
                let now = clock.load(Ordering::Acquire) as u64;
                // Every 500 keys this writer's pod is removed and comes back.
                let pod = format!("pod-{w}-{}", i / 500);
                index.insert("m", k, &pod, now).unwrap();
                log.push((pod, k.clone(), now));
                if i % 500 == 499 {
                    index.remove_pod(&format!("pod-{w}-{}", i / 500));
                }
            }
            log
        }));
    }
    let sweeper = {
        let (index, clock, done) = (index.clone(), clock.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Acquire) {
                let now = clock.fetch_add(1, Ordering::AcqRel) as u64 + 1;
                index.sweep(now, 500);
            }
        })
    };
    let reader = {
        let (index, keys, first, clock, done) = (
            index.clone(),
            keys.clone(),
            first.clone(),
            clock.clone(),
            done.clone(),
        );
        std::thread::spawn(move || {
            let mut rng = StdRng::seed_from_u64(7);
            while !done.load(Ordering::Acquire) {
                let w = rng.random_range(0..keys.len());
                let probe = &keys[w][rng.random_range(0..keys[w].len())];
                let now = clock.load(Ordering::Acquire) as u64;
                let r = index.reader();
                for m in r.lookup("m", probe, None, now).matches {
                    let name = r.pod_name(m.pod).expect("named");
                    let owner: usize = name[4..5].parse().expect("pod-W-N");
                    assert!(
                        first[owner].contains_key(&probe[..m.blocks as usize]),
                        "{name} reported {} blocks of a key it never inserted",
                        m.blocks
                    );
                }
            }
        })
    };
    let logs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    done.store(true, Ordering::Release);
    sweeper.join().unwrap();
    reader.join().unwrap();

    let now = clock.load(Ordering::Acquire) as u64;
    let mut model = Model::new(TTL, u64::MAX);
    for log in &logs {
        for (i, (pod, k, t)) in log.iter().enumerate() {
            model.insert("m", k, pod, *t);
            if i % 500 == 499 {
                model.remove_pod(pod);
            }
        }
    }
    index.sweep(now, usize::MAX);
    model.sweep(now);
    for log in &logs {
        for (_, k, _) in log {
            assert_eq!(
                index.lookup("m", k, None, now),
                model.lookup("m", k, None, now)
            );
        }
    }
    assert_eq!(index.stats().entries, model.entries());
    assert_eq!(index.stats().tree_blocks, model.tree_blocks());
}
