use std::time::Duration;

use std::io::Write;

use xxhash_rust::xxh3::Xxh3;

use super::write::Hashing;
use super::*;
use crate::{Index, IndexConfig};

const T0: u64 = 1_700_000_000_000;

fn cfg() -> IndexConfig {
    IndexConfig {
        ttl: Duration::from_secs(60),
        ..IndexConfig::default()
    }
}

fn snapshot(index: &Index, now: u64) -> Vec<u8> {
    let mut bytes = Vec::new();
    let sum = index.write_snapshot(&mut bytes, now).unwrap();
    assert_eq!(sum.bytes, bytes.len() as u64);
    bytes
}

/// A small index with shared prefixes, several pods per node, two
/// models, differing times and an explicit capacity.
fn sample() -> (Index, Vec<(&'static str, Vec<u64>)>) {
    let index = Index::new(cfg());
    let keys = vec![
        ("m1", vec![1, 2, 3, 4]),
        ("m1", vec![1, 2, 3, 9, 9]),
        ("m1", vec![1, 2]),
        ("m1", vec![7]),
        ("m2", vec![1, 2, 3, 4]),
    ];
    index.insert("m1", &keys[0].1, "pod-a", T0).unwrap();
    index.insert("m1", &keys[1].1, "pod-b", T0 + 10).unwrap();
    index.insert("m1", &keys[2].1, "pod-a", T0 + 20).unwrap();
    index.insert("m1", &keys[2].1, "pod-c", T0 + 5).unwrap();
    index.insert("m1", &keys[3].1, "pod-b", T0 + 1).unwrap();
    index.insert("m2", &keys[4].1, "pod-c", T0 + 3).unwrap();
    index.set_pod_capacity("pod-b", 77).unwrap();
    index.set_pod_capacity("idle", 5).unwrap();
    (index, keys)
}

#[test]
fn a_restored_index_answers_every_lookup_the_same() {
    let (index, keys) = sample();
    let bytes = snapshot(&index, T0 + 30);
    let restored = Index::new(cfg());
    let snap = Snapshot::parse(&bytes).unwrap();
    assert_eq!(snap.written_at, T0 + 30);
    let sum = snap.restore(&restored, T0 + 40);
    assert_eq!(sum.refused, 0);
    assert_eq!(sum.expired, 0);
    for (model, key) in &keys {
        for at in [T0 + 40, T0 + 60_004, T0 + 60_015, T0 + 60_025] {
            for cut in 1..=key.len() {
                assert_eq!(
                    restored.lookup(model, &key[..cut], None, at),
                    index.lookup(model, &key[..cut], None, at),
                    "{model} {:?} at {at}",
                    &key[..cut]
                );
            }
        }
    }
    for pod in ["pod-a", "pod-b", "pod-c"] {
        assert_eq!(restored.pod_blocks(pod), index.pod_blocks(pod), "{pod}");
    }
    assert_eq!(restored.stats().entries, index.stats().entries);
    assert_eq!(restored.stats().tree_blocks, index.stats().tree_blocks);
    // Explicit capacities come back, even for a pod with no entries.
    let again = snapshot(&restored, T0 + 40);
    let sum = Snapshot::parse(&again)
        .unwrap()
        .restore(&Index::new(cfg()), T0 + 40);
    assert_eq!(sum.pods, 4);
    assert_eq!(restored.stats().pods, 4);
}

#[test]
fn ages_survive_a_restart() {
    let index = Index::new(cfg());
    index.insert("m", &[1, 2], "p", T0).unwrap();
    let bytes = snapshot(&index, T0 + 1_000);
    // Restored 30 s later: 29 s of TTL left, not 60.
    let later = Index::new(cfg());
    Snapshot::parse(&bytes)
        .unwrap()
        .restore(&later, T0 + 31_000);
    assert_eq!(
        later.lookup("m", &[1, 2], None, T0 + 59_000),
        vec![("p".into(), 2)]
    );
    assert!(later.lookup("m", &[1, 2], None, T0 + 60_001).is_empty());
    // Restored after the TTL: nothing comes back.
    let late = Index::new(cfg());
    let sum = Snapshot::parse(&bytes).unwrap().restore(&late, T0 + 60_001);
    assert_eq!((sum.inserts, sum.expired), (0, 1));
    assert_eq!(late.stats().entries, 0);
}

#[test]
fn removed_pods_and_expired_entries_are_not_written() {
    let index = Index::new(cfg());
    index.insert("m", &[1, 2], "gone", T0).unwrap();
    index.insert("m", &[1, 3], "old", T0).unwrap();
    index.insert("m", &[1, 4], "kept", T0 + 50_000).unwrap();
    index.remove_pod("gone");
    let snap = Snapshot::parse(&snapshot(&index, T0 + 60_500)).unwrap();
    let names: Vec<&str> = snap.pods.iter().map(|p| p.0.as_str()).collect();
    assert_eq!(names, ["kept", "old"], "a removed pod is not written");
    let restored = Index::new(cfg());
    let sum = snap.restore(&restored, T0 + 60_500);
    assert_eq!(sum.inserts, 1);
    assert_eq!(restored.stats().entries, 2);
}

#[test]
fn every_truncation_and_every_flipped_byte_is_refused() {
    let (index, _) = sample();
    let bytes = snapshot(&index, T0 + 30);
    for len in 0..bytes.len() {
        assert!(
            Snapshot::parse(&bytes[..len]).is_err(),
            "truncated to {len}"
        );
    }
    for i in 0..bytes.len() {
        let mut bad = bytes.clone();
        bad[i] ^= 0x40;
        assert!(Snapshot::parse(&bad).is_err(), "byte {i} flipped");
    }
}

/// Signs arbitrary records the way a writer would, to reach the checks
/// behind the checksum.
fn signed(records: &[Record<'_>]) -> Vec<u8> {
    let mut w = Hashing {
        inner: Vec::new(),
        hash: Xxh3::new(),
        bytes: 0,
    };
    w.write_all(&MAGIC).unwrap();
    for r in records {
        w.record(r).unwrap();
    }
    let digest = w.hash.digest();
    let mut bytes = w.inner;
    bytes.extend_from_slice(&digest.to_le_bytes());
    bytes
}

#[test]
fn well_signed_nonsense_is_refused_with_a_reason() {
    let header = || Record::Header {
        version: VERSION,
        written_at: T0,
        default_capacity: 1,
    };
    let pod = || Record::Pod {
        name: Stored::of("p"),
        capacity: 1,
    };
    let model = || Record::Model {
        name: Stored::of("m"),
    };
    let node = |parent, entries| Record::Node {
        parent,
        edge: Stored::of(&[1, 2]),
        entries: Stored::of(entries),
    };
    let end = |nodes| Record::End {
        pods: 1,
        models: 1,
        nodes,
    };
    let good = [(0, T0)];
    let cases: Vec<(Vec<Record<'_>>, &str)> = vec![
        (vec![pod(), end(0)], "no header"),
        (
            vec![
                Record::Header {
                    version: 9,
                    written_at: 0,
                    default_capacity: 0,
                },
                end(0),
            ],
            "version 9",
        ),
        (
            vec![header(), pod(), model(), node(ROOT, &good)],
            "no end record",
        ),
        (
            vec![header(), pod(), model(), node(ROOT, &[(5, T0)]), end(1)],
            "unknown pod",
        ),
        (
            vec![
                header(),
                pod(),
                model(),
                node(ROOT, &good),
                node(3, &good),
                end(2),
            ],
            "not in pre-order",
        ),
        (
            vec![header(), pod(), model(), node(ROOT, &good), end(7)],
            "counts differ",
        ),
        (
            vec![header(), pod(), node(ROOT, &good), end(1)],
            "before any model",
        ),
    ];
    for (records, why) in cases {
        let err = Snapshot::parse(&signed(&records)).unwrap_err();
        assert!(err.to_string().contains(why), "{why}: got {err}");
    }
    let engines = |engines, blocks| Record::Engines { engines, blocks };
    let engine = || Record::Engine {
        pod: Stored::of("e"),
        engine_block: 16,
        our_block: 16,
        last_batch: None,
    };
    let more: Vec<(Vec<Record<'_>>, &str)> = vec![
        (vec![header(), pod(), model(), end(0)], "no engine count"),
        (
            vec![header(), pod(), model(), engines(1, 0), end(0)],
            "engine counts differ",
        ),
        (
            vec![
                header(),
                pod(),
                model(),
                engine(),
                engine(),
                engines(2, 0),
                end(0),
            ],
            "an engine-fed pod twice",
        ),
    ];
    for (records, why) in more {
        let err = Snapshot::parse(&signed(&records)).unwrap_err();
        assert!(err.to_string().contains(why), "{why}: got {err}");
    }
    // Version 1 had no engines and no engine count.
    let v1 = || Record::Header {
        version: 1,
        written_at: T0,
        default_capacity: 31_250,
    };
    assert!(Snapshot::parse(&signed(&[v1(), pod(), model(), end(0)])).is_ok());
    let fine = signed(&[
        header(),
        pod(),
        model(),
        node(ROOT, &good),
        node(0, &good),
        engines(0, 0),
        end(2),
    ]);
    let index = Index::new(cfg());
    let sum = Snapshot::parse(&fine).unwrap().restore(&index, T0);
    assert_eq!(
        sum.inserts, 1,
        "the parent's entry is covered by its child's"
    );
    assert_eq!(
        index.lookup("m", &[1, 2, 1, 2], None, T0),
        vec![("p".into(), 4)]
    );
}

#[test]
fn a_snapshot_taken_under_concurrent_writes_holds_everything_written_before() {
    let index = Index::new(cfg());
    for i in 0..2_000u64 {
        index.insert("m", &[i % 7, i, i + 1], "early", T0).unwrap();
    }
    let bytes = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            for i in 0..20_000u64 {
                let pod = ["w0", "w1", "w2"][i as usize % 3];
                index
                    .insert("m", &[i % 7, i % 300, i], pod, T0 + i)
                    .unwrap();
            }
        });
        let mut last = Vec::new();
        while !writer.is_finished() {
            last = snapshot(&index, T0 + 30_000);
            Snapshot::parse(&last).expect("a snapshot under writes parses");
        }
        last
    });
    let restored = Index::new(cfg());
    Snapshot::parse(&bytes)
        .unwrap()
        .restore(&restored, T0 + 30_000);
    for i in 0..2_000u64 {
        assert!(
            restored
                .lookup("m", &[i % 7, i, i + 1], Some(&["early"]), T0 + 30_000)
                .iter()
                .any(|(_, b)| *b == 3),
            "key {i}"
        );
    }
}
