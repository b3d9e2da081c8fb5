//! Engine blocks named in another indexer's hashes: registered with their
//! records, released with them, inherited along salted sequences, and kept
//! by snapshots.

use crate::precise::tests::{index, seeded};
use crate::precise::{Alias, EngineOp, EngineSpec};
use crate::{EngineHandle, Index, Snapshot};

const T0: u64 = 1_700_000_000_000;

const OURS: u32 = 4;

fn engine(index: &Index, pod: &str, engine_block: u32) -> EngineHandle {
    let spec = EngineSpec {
        engine_block,
        our_block: OURS,
        hash: seeded,
    };
    index.engine(pod, spec).unwrap()
}

/// An index with one engine-fed pod, "a", of engine blocks of
/// `engine_block` tokens.
fn engine_a(engine_block: u32) -> (Index, EngineHandle) {
    let index = index();
    let e = engine(&index, "a", engine_block);
    (index, e)
}

/// [`engine_a`] of our block size, having stored the first two of prompt
/// `p`'s four blocks (hashes 1 and 2) under a salted `seed`, which the
/// sequence's later stores inherit; and prompt `p`'s tokens.
fn salted_start(p: u32, seed: u64) -> (Index, EngineHandle, Vec<u32>) {
    let (index, e) = engine_a(OURS);
    let toks = tokens(p, 4, OURS);
    let salted = Alias::Tokens { seed, salted: true };
    store(&index, &e, "a", None, &[1, 2], &toks[..8], salted);
    (index, e, toks)
}

/// Prompt `p`'s tokens: `blocks` blocks of `per` tokens.
fn tokens(p: u32, blocks: u32, per: u32) -> Vec<u32> {
    (0..blocks * per).map(|i| p * 1000 + i).collect()
}

/// Our key of those tokens (plain blocks).
fn key(toks: &[u32]) -> Vec<u64> {
    toks.chunks(OURS as usize).map(|c| seeded(c, 0)).collect()
}

/// The aliases of those tokens in engine blocks of `per` under `seed`.
fn names(toks: &[u32], per: u32, seed: u64) -> Vec<u64> {
    toks.chunks(per as usize).map(|c| seeded(c, seed)).collect()
}

fn store(
    index: &Index,
    e: &EngineHandle,
    pod: &str,
    parent: Option<u64>,
    hashes: &[u64],
    toks: &[u32],
    alias: Alias,
) {
    let op = EngineOp::Stored {
        parent,
        hashes,
        tokens: toks,
        seeds: &[],
        alias,
    };
    index.apply(&mut e.lock(), pod, "m", op).unwrap();
}

fn matched(index: &Index, names: &[u64]) -> (Vec<u64>, Vec<(String, u32)>) {
    let reader = index.reader();
    let key = reader.translate("m", names);
    let found = reader.lookup("m", &key, None, T0);
    let pods = found
        .matches
        .iter()
        .map(|m| (reader.pod_name(m.pod).unwrap().to_string(), m.blocks))
        .collect();
    (key, pods)
}

const DYN: Alias = Alias::Tokens {
    seed: 1337,
    salted: false,
};

#[test]
fn a_key_of_aliases_finds_the_pods_holding_its_blocks_until_they_go() {
    let (index, e) = engine_a(OURS);
    let toks = tokens(1, 5, OURS);
    let hashes: Vec<u64> = (1..=5).collect();
    store(&index, &e, "a", None, &hashes, &toks, DYN);
    let n = names(&toks, OURS, 1337);
    let (key_got, pods) = matched(&index, &n);
    assert_eq!(key_got, key(&toks));
    assert_eq!(pods, [("a".to_string(), 5)]);
    assert_eq!(index.stats().aliases, 5);
    // An alias not known ends the translation there.
    let mut other = n.clone();
    other[2] ^= 1;
    assert_eq!(matched(&index, &other).0, key(&toks)[..2]);
    // The last two blocks go: their names with them.
    index
        .apply(
            &mut e.lock(),
            "a",
            "m",
            EngineOp::Removed { hashes: &[5, 4] },
        )
        .unwrap();
    assert_eq!(
        matched(&index, &n),
        (key(&toks)[..3].to_vec(), vec![("a".into(), 3)])
    );
    assert_eq!(index.stats().aliases, 3);
    // A store without a name leaves the blocks unnamed.
    store(&index, &e, "a", Some(3), &[4, 5], &toks[12..], Alias::None);
    assert_eq!(matched(&index, &n).0.len(), 3);
    assert_eq!(index.stats().aliases, 3);
}

#[test]
fn shared_blocks_are_named_while_any_engine_records_them() {
    let index = index();
    let (a, b) = (engine(&index, "a", OURS), engine(&index, "b", OURS));
    let toks = tokens(2, 4, OURS);
    store(&index, &a, "a", None, &[1, 2, 3, 4], &toks, DYN);
    store(&index, &b, "b", None, &[11, 12], &toks[..8], DYN);
    assert_eq!(index.stats().aliases, 4);
    let n = names(&toks, OURS, 1337);
    let (_, pods) = matched(&index, &n);
    assert_eq!(pods, [("a".to_string(), 4), ("b".to_string(), 2)]);
    // "a" clears: "b" still names its two.
    index
        .apply(&mut a.lock(), "a", "m", EngineOp::Cleared)
        .unwrap();
    assert_eq!(index.stats().aliases, 2);
    assert_eq!(matched(&index, &n).1, [("b".to_string(), 2)]);
    // "b" is dropped: nothing is named.
    assert!(index.drop_engine_pod("b"));
    assert_eq!(index.stats().aliases, 0);
    assert!(matched(&index, &n).0.is_empty());
}

#[test]
fn a_salted_sequence_passes_its_seed_on_to_later_stores() {
    // The request's first store names the salt; the next one does not.
    let (index, e, toks) = salted_start(3, 99);
    store(&index, &e, "a", Some(2), &[3, 4], &toks[8..], DYN);
    let n = names(&toks, OURS, 99);
    assert_eq!(matched(&index, &n).1, [("a".to_string(), 4)]);
    // Unsalted names of the same tokens find nothing.
    assert!(matched(&index, &names(&toks, OURS, 1337)).0.is_empty());
    // A store under an unsalted parent keeps its own seed.
    store(&index, &e, "a", None, &[21], &toks[..4], Alias::EngineHash);
    store(&index, &e, "a", Some(21), &[22], &toks[4..8], DYN);
    assert_eq!(matched(&index, &[21]).0, key(&toks[..4]));
    assert!(
        index
            .reader()
            .translate("m", &names(&toks[4..8], OURS, 1337))
            == key(&toks[4..8])
    );
}

#[test]
fn an_engine_block_of_several_of_ours_translates_to_all_of_them() {
    let (index, e) = engine_a(3 * OURS);
    let toks = tokens(4, 3, 3 * OURS);
    store(&index, &e, "a", None, &[1, 2, 3], &toks, DYN);
    let n = names(&toks, 3 * OURS, 1337);
    let (k, pods) = matched(&index, &n);
    assert_eq!(k, key(&toks));
    assert_eq!(pods, [("a".to_string(), 9)]);
    assert_eq!(index.stats().aliases, 9);
    // Its ours' entries go with the record.
    index
        .apply(&mut e.lock(), "a", "m", EngineOp::Removed { hashes: &[3] })
        .unwrap();
    assert_eq!(index.stats().aliases, 6);
    assert_eq!(matched(&index, &n).0, key(&toks)[..6]);
}

#[test]
fn pages_smaller_than_our_blocks_are_not_named() {
    let (index, e) = engine_a(1);
    let toks = tokens(5, 8, 1);
    let hashes: Vec<u64> = (1..=8).collect();
    let mut parent = None;
    for (h, t) in hashes.iter().zip(&toks) {
        store(&index, &e, "a", parent, &[*h], std::slice::from_ref(t), DYN);
        parent = Some(*h);
    }
    assert_eq!(index.stats().aliases, 0);
}

#[test]
fn a_snapshot_keeps_the_names_and_the_seeds_children_inherit() {
    let (index, _e, toks) = salted_start(6, 7);
    let mut bytes = Vec::new();
    index.write_snapshot(&mut bytes, T0).unwrap();
    let restored = self::index();
    Snapshot::parse(&bytes).unwrap().restore(&restored, T0);
    assert_eq!(restored.stats().aliases, 2);
    // The subscription registers the engine again, records kept.
    let e2 = engine(&restored, "a", OURS);
    // A later store inherits the restored seed.
    store(&restored, &e2, "a", Some(2), &[3, 4], &toks[8..], DYN);
    let n = names(&toks, OURS, 7);
    assert_eq!(matched(&restored, &n).1, [("a".to_string(), 4)]);
}

#[test]
fn the_model_of_a_key_of_aliases_is_found_by_its_first_name() {
    let (index, e) = engine_a(OURS);
    let toks = tokens(7, 2, OURS);
    let op = EngineOp::Stored {
        parent: None,
        hashes: &[1, 2],
        tokens: &toks,
        seeds: &[],
        alias: Alias::EngineHash,
    };
    index.apply(&mut e.lock(), "a", "adapter", op).unwrap();
    let reader = index.reader();
    assert_eq!(reader.alias_models(1), ["adapter"]);
    assert!(reader.alias_models(3).is_empty());
    assert_eq!(reader.translate("adapter", &[1, 2]), key(&toks));
    assert!(reader.translate("m", &[1, 2]).is_empty());
}
