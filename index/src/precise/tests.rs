use std::time::Duration;

use super::*;
use crate::{EngineHandle, Index, IndexConfig};

const T0: u64 = 1_700_000_000_000;

/// The default bound on block size ratios.
const MAX_RATIO: u32 = 1024;

/// A stand-in for the gateways' rule, shared with the integration tests
/// (and the tests of `alias`).
#[path = "../../tests/common/fnv.rs"]
mod fnv;
pub(super) use fnv::{hash, seeded};

fn spec(engine_block: u32) -> EngineSpec {
    EngineSpec {
        engine_block,
        our_block: 4,
        hash: seeded,
    }
}

/// An index of the default configuration but for what `set` changes: the
/// bound or two a test exercises.
fn configured(set: impl FnOnce(&mut IndexConfig)) -> Index {
    let mut config = IndexConfig::default();
    set(&mut config);
    Index::new(config)
}

/// An index whose gateway entries live a minute (the tests of `lanes` and
/// `alias` use it too).
pub(super) fn index() -> Index {
    configured(|c| c.ttl = Duration::from_secs(60))
}

/// An index with one engine-fed pod, "pod", of engine blocks of
/// `engine_block` tokens.
fn engine_fed(engine_block: u32) -> (Index, EngineHandle) {
    let index = index();
    let e = index.engine("pod", spec(engine_block)).unwrap();
    (index, e)
}

/// The answer that names "pod" alone, matching `blocks` blocks.
fn pod(blocks: u32) -> Vec<(String, u32)> {
    vec![("pod".to_string(), blocks)]
}

/// `blocks` blocks of 4 tokens, block `i` of prompt `p` being `[p, i, i, i]`.
fn tokens(p: u32, blocks: u32) -> Vec<u32> {
    (0..blocks).flat_map(|i| [p, i, i, i]).collect()
}

fn key(p: u32, blocks: u32) -> Vec<u64> {
    tokens(p, blocks).chunks(4).map(hash).collect()
}

fn matched(index: &Index, key: &[u64], now: u64) -> Vec<(String, u32)> {
    index.lookup("m", key, None, now)
}

/// A store of plain blocks: no seeds, named in no other indexer's hashes
/// (the tests of `lanes` and `alias` use it too).
pub(super) fn stored_op<'a>(
    parent: Option<u64>,
    hashes: &'a [u64],
    toks: &'a [u32],
) -> EngineOp<'a> {
    seeded_op(parent, hashes, toks, &[])
}

/// A store of blocks with identity seeds, named in no other indexer's
/// hashes.
fn seeded_op<'a>(
    parent: Option<u64>,
    hashes: &'a [u64],
    toks: &'a [u32],
    seeds: &'a [u64],
) -> EngineOp<'a> {
    EngineOp::Stored {
        parent,
        hashes,
        tokens: toks,
        seeds,
        alias: crate::Alias::None,
    }
}

fn store(
    index: &Index,
    e: &EngineHandle,
    parent: Option<u64>,
    hashes: &[u64],
    toks: &[u32],
) -> Applied {
    let op = stored_op(parent, hashes, toks);
    index.apply(&mut e.lock(), "pod", "m", op).unwrap()
}

fn remove(index: &Index, e: &EngineHandle, hashes: &[u64]) -> Applied {
    index
        .apply(&mut e.lock(), "pod", "m", EngineOp::Removed { hashes })
        .unwrap()
}

#[test]
fn ratios_follow_the_block_sizes_or_are_refused() {
    assert_eq!(Ratio::new(64, 16, MAX_RATIO), Ok(Ratio::Whole(4)));
    assert_eq!(Ratio::new(16, 16, MAX_RATIO), Ok(Ratio::Whole(1)));
    assert_eq!(Ratio::new(1, 16, MAX_RATIO), Ok(Ratio::Pages(16)));
    assert!(matches!(
        Ratio::new(24, 16, MAX_RATIO),
        Err(EngineError::BlockSizes { .. })
    ));
    assert!(matches!(
        Ratio::new(0, 16, MAX_RATIO),
        Err(EngineError::BlockSizes { .. })
    ));
    assert_eq!(
        Ratio::new(16 * MAX_RATIO, 16, MAX_RATIO),
        Ok(Ratio::Whole(MAX_RATIO))
    );
    assert_eq!(
        Ratio::new(1, MAX_RATIO, MAX_RATIO),
        Ok(Ratio::Pages(MAX_RATIO))
    );
    for (engine, ours) in [(32 * MAX_RATIO, 16), (1, 2 * MAX_RATIO)] {
        assert!(matches!(
            Ratio::new(engine, ours, MAX_RATIO),
            Err(EngineError::BlockSizes { .. })
        ));
    }
}

#[test]
fn the_ratio_bound_is_the_index_configuration() {
    let index = configured(|c| c.max_block_ratio = 4);
    assert!(index.engine("pod", spec(16)).is_ok());
    assert!(matches!(
        index.engine("other", spec(32)),
        Err(EngineError::BlockSizes {
            engine: 32,
            ours: 4
        })
    ));
}

/// Engine pods registered in one step are those whose engines the index
/// would take, and registering each engine then finds its pod named.
#[test]
fn engine_pods_registered_at_once_leave_out_the_refused() {
    let index = configured(|c| c.max_block_ratio = 4);
    index
        .register_engine_pods([("a", spec(16)), ("b", spec(32)), ("c", spec(4))])
        .unwrap();
    assert_eq!(index.stats().pods, 2);
    for pod in ["a", "c"] {
        index.engine(pod, spec(16)).unwrap();
    }
    assert!(index.engine("b", spec(32)).is_err());
    assert_eq!(index.stats().pods, 2);
    assert_eq!(index.engines().len(), 2);
}

/// Engine-fed pods dropped in one step go as they would one by one: each
/// answered whether it was engine-fed, their entries and views gone, the
/// others untouched; registered again, a pod starts from nothing.
#[test]
fn engine_pods_dropped_at_once_go_as_one_by_one() {
    let index = index();
    let mut handles = Vec::new();
    let stored = |e: &EngineHandle, pod: &str, p: u32| {
        let toks = tokens(p, 2);
        let hashes = [10 * u64::from(p) + 1, 10 * u64::from(p) + 2];
        let op = stored_op(None, &hashes, &toks);
        index.apply(&mut e.lock(), pod, "m", op).unwrap();
    };
    for (p, pod) in (0..).zip(["a", "b", "c"]) {
        let e = index.engine(pod, spec(4)).unwrap();
        stored(&e, pod, p);
        // Not the view a pod starts with.
        index.set_view(pod, prefix_proto::PodView::Learning);
        handles.push(e);
    }
    assert_eq!(
        index.drop_engine_pods(&["a", "x", "c", "a"]),
        [true, false, true, false]
    );
    assert!(matched(&index, &key(0, 2), T0).is_empty());
    assert!(matched(&index, &key(2, 2), T0).is_empty());
    assert_eq!(matched(&index, &key(1, 2), T0), [("b".to_string(), 2)]);
    let engines: Vec<String> = index.engines().into_iter().map(|(p, _)| p).collect();
    assert_eq!(engines, ["b"]);
    assert_eq!(index.stats().pods, 1);
    // A dropped engine's late batch changes nothing.
    let late = EngineOp::Removed { hashes: &[1] };
    index.apply(&mut handles[0].lock(), "a", "m", late).unwrap();
    assert_eq!(index.stats().pods, 1);
    // Registered again: the view it had is forgotten, b's kept.
    let e = index.engine("a", spec(4)).unwrap();
    stored(&e, "a", 0);
    let r = index.reader();
    let view = |p: u32| {
        let found = r.lookup_detail("m", &key(p, 2), None, T0).matches;
        found.iter().map(|m| (m.blocks, m.view)).collect::<Vec<_>>()
    };
    assert_eq!(view(0), [(2, prefix_proto::PodView::Exact)]);
    assert_eq!(view(1), [(2, prefix_proto::PodView::Learning)]);
}

#[test]
fn a_model_has_records_only_while_it_holds_one() {
    let (index, e) = engine_fed(4);
    let models = |e: &EngineHandle| e.lock().models.len();
    // Empty stores under ever new adapter names record nothing.
    for i in 0..100 {
        let op = stored_op(None, &[], &[]);
        let adapter = format!("adapter-{i}");
        let done = index.apply(&mut e.lock(), "pod", &adapter, op).unwrap();
        assert_eq!(done.stored, 0);
    }
    assert_eq!(models(&e), 0);
    store(&index, &e, None, &[1, 2], &tokens(1, 2));
    assert_eq!(models(&e), 1);
    remove(&index, &e, &[2]);
    assert_eq!(models(&e), 1);
    remove(&index, &e, &[1]);
    assert_eq!(models(&e), 0);
    assert_eq!(index.stats().engine_blocks, 0);
    // And the model comes back with its next store.
    store(&index, &e, None, &[1], &tokens(1, 1));
    assert_eq!(matched(&index, &key(1, 2), T0), pod(1));
}

#[test]
fn stored_blocks_match_by_token_key_and_never_expire() {
    let (index, e) = engine_fed(4);
    let a = store(&index, &e, None, &[100, 101, 102], &tokens(7, 3));
    assert_eq!(a.stored, 3);
    let k = key(7, 5);
    assert_eq!(matched(&index, &k, T0), pod(3));
    // Far past every TTL: the engine, not a clock, says when it goes.
    assert_eq!(matched(&index, &k, T0 + 3_600_000), pod(3));
    index.sweep(T0 + 3_600_000, usize::MAX);
    assert_eq!(matched(&index, &k, T0 + 3_600_000), pod(3));
    // A child of a known block extends the match.
    store(&index, &e, Some(102), &[103], &tokens(7, 4)[12..]);
    assert_eq!(matched(&index, &k, T0), pod(4));
}

#[test]
fn a_block_stays_held_while_a_copy_remains() {
    let (index, e) = engine_fed(4);
    store(&index, &e, None, &[1, 2], &tokens(1, 2));
    store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
    let k = key(1, 2);
    assert_eq!(remove(&index, &e, &[2]).released, 0);
    assert_eq!(matched(&index, &k, T0), pod(2));
    assert!(remove(&index, &e, &[2]).released > 0);
    assert_eq!(matched(&index, &k, T0), pod(1));
    let again = remove(&index, &e, &[2, 99]);
    assert_eq!((again.removed, again.unknown), (0, 2));
}

#[test]
fn a_removed_middle_block_cuts_the_match_until_stored_again() {
    let (index, e) = engine_fed(4);
    store(&index, &e, None, &[1, 2, 3, 4], &tokens(1, 4));
    let k = key(1, 4);
    remove(&index, &e, &[2]);
    assert_eq!(matched(&index, &k, T0), pod(1));
    // Blocks 3 and 4 are still cached: storing 2 again brings them back.
    store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
    assert_eq!(matched(&index, &k, T0), pod(4));
    // Removing the first block ends every match through it.
    remove(&index, &e, &[1]);
    assert!(matched(&index, &k, T0).is_empty());
}

#[test]
fn a_batch_releases_a_tail_first_run_at_its_end_and_keeps_branches_below() {
    let (index, e) = engine_fed(4);
    // Prompt 1 is blocks 1..=4; prompt 2 shares its first two blocks
    // and goes on with block 5 (its tokens differ from there).
    store(&index, &e, None, &[1, 2, 3, 4], &tokens(1, 4));
    let k2: Vec<u64> = key(1, 2)
        .into_iter()
        .chain(key(2, 3)[2..].to_vec())
        .collect();
    let mut t5 = tokens(1, 2);
    t5.extend_from_slice(&tokens(2, 3)[8..]);
    store(&index, &e, Some(2), &[5], &t5[8..]);
    assert_eq!(matched(&index, &k2, T0), pod(3));
    let k1 = key(1, 4);
    let before = index.stats().nodes;
    let mut engine = e.lock();
    let mut batch = index.batch(&mut engine, "pod");
    for h in [4, 3, 2] {
        let got = batch
            .apply("m", EngineOp::Removed { hashes: &[h] })
            .unwrap();
        // Held, not yet released: lookups still see the run.
        assert_eq!((got.removed, got.released), (1, 0));
    }
    assert_eq!(matched(&index, &k1, T0), pod(4));
    assert_eq!(batch.finish().unwrap().released, 3);
    drop(engine);
    assert_eq!(matched(&index, &k1, T0), pod(1));
    // Block 5 is still cached below the removed block 2: a gap, so the
    // pod's match on prompt 2 ends before it.
    assert_eq!(matched(&index, &k2, T0), pod(1));
    // The run's emptied nodes went at once.
    assert!(index.stats().nodes <= before);
    store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
    assert_eq!(matched(&index, &k2, T0), pod(3));
}

#[test]
fn cleared_pods_hold_nothing_and_stay_registered() {
    let (index, e) = engine_fed(4);
    store(&index, &e, None, &[1, 2], &tokens(1, 2));
    let a = index
        .apply(&mut e.lock(), "pod", "m", EngineOp::Cleared)
        .unwrap();
    assert_eq!(a.cleared, 1);
    assert!(matched(&index, &key(1, 2), T0).is_empty());
    assert_eq!(e.lock().blocks(), 0);
    assert_eq!(index.stats().engine_blocks, 0);
    store(&index, &e, None, &[1], &tokens(1, 1));
    assert_eq!(matched(&index, &key(1, 2), T0), pod(1));
}

#[test]
fn gateway_inserts_for_engine_fed_pods_are_speculative() {
    let (index, e) = engine_fed(4);
    store(&index, &e, None, &[1], &tokens(1, 1));
    let k = key(1, 3);
    index.insert("m", &k, "pod", T0).unwrap();
    index.insert("m", &k, "plain", T0).unwrap();
    let both = |now| matched(&index, &k, now);
    assert_eq!(
        both(T0 + 2_000),
        [("plain".to_string(), 3), ("pod".to_string(), 3)]
    );
    // Past the speculative TTL: only what the engine stored is left.
    assert_eq!(
        both(T0 + 2_001),
        [("plain".to_string(), 3), ("pod".to_string(), 1)]
    );
    // An engine store confirms a speculative block.
    index.insert("m", &k, "pod", T0 + 5_000).unwrap();
    store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
    assert_eq!(both(T0 + 60_000)[1], ("pod".to_string(), 2));
}

#[test]
fn wide_engine_blocks_are_several_of_ours() {
    let (index, e) = engine_fed(8);
    store(&index, &e, None, &[1, 2], &tokens(1, 4));
    let k = key(1, 4);
    assert_eq!(matched(&index, &k, T0), pod(4));
    remove(&index, &e, &[2]);
    assert_eq!(matched(&index, &k, T0), pod(2));
    // Token counts that do not fill the blocks are refused whole.
    let bad = stored_op(None, &[5], &[1, 2, 3]);
    assert!(matches!(
        index.apply(&mut e.lock(), "pod", "m", bad),
        Err(EngineError::TokenCount { .. })
    ));
}

#[test]
fn pages_make_one_block_when_all_are_held() {
    let (index, e) = engine_fed(1);
    let toks = tokens(3, 2);
    let hashes: Vec<u64> = (10..18).collect();
    // Seven pages: one whole block of ours.
    store(&index, &e, None, &hashes[..7], &toks[..7]);
    let k = key(3, 2);
    assert_eq!(matched(&index, &k, T0), pod(1));
    store(&index, &e, Some(16), &hashes[7..], &toks[7..]);
    assert_eq!(matched(&index, &k, T0), pod(2));
    // Any page of a block gone: the block is gone.
    remove(&index, &e, &[13]);
    assert!(matched(&index, &k, T0).is_empty());
}

#[test]
fn stores_under_unknown_parents_are_counted_not_placed() {
    let (index, e) = engine_fed(4);
    let a = store(&index, &e, Some(77), &[1], &tokens(1, 1));
    assert_eq!(a.orphaned, 1);
    assert!(matched(&index, &key(1, 1), T0).is_empty());
    // Its removal is known, not "unknown".
    assert_eq!(remove(&index, &e, &[1]).unknown, 0);
}

#[test]
fn a_parent_stored_after_its_child_keeps_it() {
    let (index, e) = engine_fed(4);
    // The child first (an orphan), then its parent, then a grandchild.
    store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
    store(&index, &e, None, &[1], &tokens(1, 1));
    store(&index, &e, Some(2), &[3], &tokens(1, 3)[8..]);
    assert_eq!(matched(&index, &key(1, 3), T0), pod(3));
    // The parent goes; its record stays, so the grandchild's removal
    // still finds its path.
    remove(&index, &e, &[1]);
    assert!(matched(&index, &key(1, 3), T0).is_empty());
    assert!(remove(&index, &e, &[3]).released > 0);
    store(&index, &e, None, &[1], &tokens(1, 1));
    assert_eq!(matched(&index, &key(1, 3), T0), pod(2));
}

#[test]
fn a_block_stored_again_under_another_parent_is_placed_where_it_was_recorded() {
    let (index, e) = engine_fed(4);
    let (a, x, y) = (1, 2, 3);
    store(&index, &e, None, &[a], &tokens(1, 1));
    store(&index, &e, Some(a), &[x, y], &tokens(1, 3)[4..]);
    // `x` goes; its record stays (it has a child).
    remove(&index, &e, &[x]);
    // The last chain walked ends at `b`.
    let b = 4;
    store(&index, &e, Some(a), &[b], &[2, 1, 1, 1]);
    // An engine names `x` again, under `b`: a record keeps the parent
    // it was first stored under, so `x` is held again under `a`, not
    // under the chain that ends at `b`.
    store(&index, &e, Some(b), &[x], &tokens(1, 2)[4..]);
    assert_eq!(matched(&index, &key(1, 3), T0), pod(3));
    let through_b = [key(1, 1)[0], hash(&[2, 1, 1, 1]), key(1, 2)[1]];
    assert_eq!(matched(&index, &through_b, T0), pod(2));
}

#[test]
fn a_block_named_after_a_new_one_in_its_event_is_placed_where_it_was_recorded() {
    let (index, e) = engine_fed(4);
    let (a, x, y, b, c) = (1, 2, 3, 4, 5);
    store(&index, &e, None, &[a], &tokens(1, 1));
    store(&index, &e, Some(a), &[x, y], &tokens(1, 3)[4..]);
    remove(&index, &e, &[x]);
    // The last chain walked ends at `a`: `c` stored under it, then gone.
    store(&index, &e, Some(a), &[c], &[3, 1, 1, 1]);
    remove(&index, &e, &[c]);
    // One event names `b`, new, under `a`, then `x` under `b`: `x`
    // keeps its place under `a`.
    let mut toks = vec![2, 1, 1, 1];
    toks.extend_from_slice(&tokens(1, 2)[4..]);
    store(&index, &e, Some(a), &[b, x], &toks);
    assert_eq!(matched(&index, &key(1, 3), T0), pod(3));
}

#[test]
fn parent_cycles_are_refused_as_too_deep() {
    let index = configured(|c| c.max_key_blocks = 8);
    let e = index.engine("pod", spec(4)).unwrap();
    store(&index, &e, Some(2), &[1], &tokens(1, 1));
    let a = store(&index, &e, Some(1), &[2], &tokens(1, 1));
    assert_eq!(a.too_deep, 1);
}

#[test]
fn a_store_that_extends_the_last_chain_past_the_key_limit_is_too_deep() {
    let index = configured(|c| c.max_key_blocks = 3);
    let e = index.engine("pod", spec(4)).unwrap();
    store(&index, &e, None, &[1, 2], &tokens(1, 2));
    // Extends the chain just walked, to 4 blocks: not placed, not cut.
    let a = store(&index, &e, Some(2), &[3, 4], &tokens(1, 4)[8..]);
    assert_eq!((a.stored, a.too_deep), (2, 1));
    assert_eq!(matched(&index, &key(1, 3), T0), pod(2));
}

#[test]
fn a_run_that_could_not_be_released_dies_with_its_engine() {
    let index = configured(|c| {
        c.max_pods = 1;
        c.ttl = Duration::from_secs(60);
    });
    let e = index.engine("pod", spec(4)).unwrap();
    store(&index, &e, None, &[1, 2], &tokens(1, 2));
    // Removed from outside: its id is free only after a sweep, so the
    // pod cannot be named again until then.
    assert!(index.remove_pod("pod"));
    {
        let mut engine = e.lock();
        let mut batch = index.batch(&mut engine, "pod");
        batch
            .apply("m", EngineOp::Removed { hashes: &[2] })
            .unwrap();
        // The run goes first and fails; the store is still recorded.
        let toks = tokens(2, 2);
        let op = stored_op(Some(1), &[3], &toks[4..]);
        assert!(batch.apply("m", op).is_err());
        assert!(batch.finish().is_err());
    }
    assert_eq!(e.lock().blocks(), 2);
    assert!(index.drop_engine_pod("pod"));
    index.sweep(T0, usize::MAX);
    // A subscription still running ends one more batch: the run it
    // left names no pod again.
    let mut engine = e.lock();
    let late = index.batch(&mut engine, "pod").finish().unwrap();
    drop(engine);
    assert_eq!(late, Applied::default());
    assert_eq!(index.stats().pods, 0);
}

#[test]
fn snapshots_keep_engine_records_and_their_gaps() {
    let (index, e) = engine_fed(4);
    store(&index, &e, None, &[1, 2, 3, 4], &tokens(1, 4));
    let branch = [tokens(1, 2), vec![9; 4]].concat();
    store(&index, &e, Some(2), &[5], &branch[8..]);
    remove(&index, &e, &[2]);
    index.insert("m", &key(2, 2), "plain", T0).unwrap();
    let mut bytes = Vec::new();
    let sum = index.write_snapshot(&mut bytes, T0).unwrap();
    assert_eq!(sum.engine_blocks, 5);
    let restored = super::tests::index();
    let got = crate::Snapshot::parse(&bytes)
        .unwrap()
        .restore(&restored, T0 + 10);
    assert_eq!((got.engine_blocks, got.refused), (5, 0));
    let branch_key: Vec<u64> = branch.chunks(4).map(hash).collect();
    for k in [key(1, 4), key(2, 2), branch_key.clone()] {
        assert_eq!(
            matched(&restored, &k, T0 + 10),
            matched(&index, &k, T0 + 10)
        );
    }
    assert_eq!(matched(&restored, &key(1, 4), T0), pod(1));
    // Events after the restart find their parents.
    let e = restored.engine("pod", spec(4)).unwrap();
    store(&restored, &e, Some(1), &[2], &tokens(1, 2)[4..]);
    assert_eq!(matched(&restored, &key(1, 4), T0), pod(4));
    assert_eq!(matched(&restored, &branch_key, T0), pod(3));
}

/// A restore that refuses one model's records (a lower limit now) leaves
/// none of the pod's: it is learnt again from its engine's stream, from
/// no batch applied.
#[test]
fn a_pod_whose_restore_is_refused_in_part_is_learnt_again() {
    let (index, e) = engine_fed(4);
    store(&index, &e, None, &[1], &tokens(1, 1));
    let toks = tokens(3, 3);
    let op = stored_op(None, &[7, 8, 9], &toks);
    index.apply(&mut e.lock(), "pod", "n", op).unwrap();
    e.lock().set_last_batch(Some((41, 5)));
    let mut bytes = Vec::new();
    index.write_snapshot(&mut bytes, T0).unwrap();
    let restored = configured(|c| c.max_engine_blocks_per_pod = 2);
    let got = crate::Snapshot::parse(&bytes)
        .unwrap()
        .restore(&restored, T0);
    assert_eq!((got.engine_blocks, got.refused), (0, 1));
    let e = restored.engine("pod", spec(4)).unwrap();
    let engine = e.lock();
    assert_eq!((engine.blocks(), engine.last_batch()), (0, None));
    drop(engine);
    assert_eq!(restored.stats().engine_blocks, 0);
    assert!(matched(&restored, &key(1, 1), T0).is_empty());
    // An empty model's records restore nothing, and make no record set.
    restored
        .restore_engine(&mut e.lock(), "pod", "m", Vec::new())
        .unwrap();
    assert!(e.lock().models.is_empty());
}

#[test]
fn snapshot_records_that_do_not_fit_the_block_sizes_are_refused() {
    let (index, e) = engine_fed(4);
    // Engine blocks of our size hold one hash of ours each: a record
    // with many (a damaged or forged snapshot) is refused whole.
    for data in [
        Data::Extra(Extra::Many(vec![7; 1 << 16].into())),
        Data::Extra(Extra::Page(Page {
            depth: 0,
            tokens: vec![1; 4].into(),
            group: None,
            seed: 0,
        })),
    ] {
        let blocks = vec![
            (1, Record::new(None, 1, Data::One(11))),
            (2, Record::new(Some(2), 0, data)),
        ];
        let got = index.restore_engine(&mut e.lock(), "pod", "m", blocks);
        assert!(
            matches!(got, Err(EngineError::Record { hash: 2, .. })),
            "{got:?}"
        );
    }
    assert_eq!(index.stats().engine_blocks, 0);
    // A record that is its own parent fits, and its walk ends.
    let blocks = vec![(3, Record::new(Some(3), 0, Data::One(33)))];
    index
        .restore_engine(&mut e.lock(), "pod", "m", blocks)
        .unwrap();
    assert!(matched(&index, &[33], T0).is_empty());
}

#[test]
fn a_dropped_engine_changes_nothing_any_more() {
    let (index, e) = engine_fed(4);
    store(&index, &e, None, &[1], &tokens(1, 1));
    assert!(index.drop_engine_pod("pod"));
    // A subscription thread still running applies one more batch.
    let late = store(&index, &e, Some(1), &[2], &tokens(1, 2)[4..]);
    assert_eq!(late, Applied::default());
    assert!(matched(&index, &key(1, 2), T0).is_empty());
    assert_eq!(index.stats().engine_blocks, 0);
    assert_eq!(index.stats().pods, 0);
}

#[test]
fn engine_records_are_bounded() {
    let index = configured(|c| c.max_engine_blocks = 2);
    let e = index.engine("pod", spec(4)).unwrap();
    let toks = tokens(1, 3);
    let op = stored_op(None, &[1, 2, 3], &toks);
    assert!(matches!(
        index.apply(&mut e.lock(), "pod", "m", op),
        Err(EngineError::Full { max: 2 })
    ));
    assert_eq!(index.stats().engine_blocks, 2);
    // The two recorded are held, and matched.
    assert_eq!(matched(&index, &key(1, 3), T0), pod(2));
}

/// Room a store or a restore takes and does not use (a hash named
/// twice, a refusal partway, a record restored twice) goes back: the
/// count is the records held after each, and a later store fits.
#[test]
fn room_taken_and_not_used_goes_back() {
    let index = configured(|c| {
        c.max_engine_blocks = 6;
        c.max_engine_blocks_per_pod = 4;
    });
    let store = |pod: &str, parent, hashes: &[u64], tokens: &[u32]| {
        let e = index.engine(pod, spec(4)).unwrap();
        let op = stored_op(parent, hashes, tokens);
        let got = index.apply(&mut e.lock(), pod, "m", op).map(drop);
        let held = e.lock().blocks() as u64;
        (got, index.stats().engine_blocks, held)
    };
    // Hash 2 named twice: two copies of one record.
    let twice = [tokens(1, 2), tokens(1, 2)[4..].to_vec()].concat();
    assert_eq!(store("a", None, &[1, 2, 2], &twice), (Ok(()), 2, 2));
    let a = index.engine("a", spec(4)).unwrap();
    {
        let engine = a.lock();
        let records = &engine.models["m"];
        assert_eq!(records.copies(records.find(2).unwrap()), 2);
    }
    // Refused by the pod's bound after two more.
    let refused = Err(EngineError::PodFull { max: 4 });
    assert_eq!(
        store("a", None, &[11, 12, 13], &tokens(2, 3)),
        (refused, 4, 4)
    );
    // A restore naming a record twice counts it once; the two left
    // under the global bound still fit.
    let b = index.engine("b", spec(4)).unwrap();
    let blocks = vec![
        (21, Record::new(None, 1, Data::One(121))),
        (21, Record::new(None, 1, Data::One(121))),
    ];
    index
        .restore_engine(&mut b.lock(), "b", "m", blocks)
        .unwrap();
    assert_eq!((index.stats().engine_blocks, b.lock().blocks()), (5, 1));
    assert_eq!(store("b", Some(21), &[22], &tokens(3, 1)), (Ok(()), 6, 2));
    // Full now, but a store of held blocks only still adds copies.
    let full = Err(EngineError::Full { max: 6 });
    assert_eq!(store("b", Some(21), &[22, 23], &tokens(3, 2)), (full, 6, 2));
    assert_eq!(store("b", Some(21), &[22], &tokens(3, 1)), (Ok(()), 6, 2));
}

#[test]
fn pods_storing_at_once_never_pass_the_bound_together() {
    const MAX: u64 = 64;
    for round in 0..200u64 {
        let index = configured(|c| c.max_engine_blocks = MAX);
        let start = std::sync::Barrier::new(2);
        std::thread::scope(|s| {
            for p in 0..2u64 {
                let (index, start) = (&index, &start);
                s.spawn(move || {
                    let pod = format!("pod-{p}");
                    let e = index.engine(&pod, spec(4)).unwrap();
                    start.wait();
                    // Events of 16 new blocks, each pod its own hashes,
                    // until the bound refuses one.
                    for event in 0u64.. {
                        let first = (round << 32) | (p << 24) | (event << 8);
                        let hashes: Vec<u64> = (first..first + 16).collect();
                        let toks = tokens(event as u32, 16);
                        let op = stored_op(None, &hashes, &toks);
                        if index.apply(&mut e.lock(), &pod, "m", op).is_err() {
                            break;
                        }
                    }
                });
            }
        });
        // The count is the records there are, and never past the bound.
        let held: usize = ["pod-0", "pod-1"]
            .iter()
            .map(|p| index.engine(p, spec(4)).unwrap().lock().blocks())
            .sum();
        assert_eq!(index.stats().engine_blocks, held as u64);
        assert_eq!(held as u64, MAX, "round {round}");
    }
}

#[test]
fn one_engine_cannot_take_the_others_room() {
    let index = configured(|c| c.max_engine_blocks_per_pod = 2);
    let greedy = index.engine("greedy", spec(4)).unwrap();
    let other = index.engine("other", spec(4)).unwrap();
    let toks = tokens(1, 3);
    let op = stored_op(None, &[1, 2, 3], &toks);
    assert!(matches!(
        index.apply(&mut greedy.lock(), "greedy", "m", op),
        Err(EngineError::PodFull { max: 2 })
    ));
    // A model of its own does not get round the bound.
    assert!(matches!(
        index.apply(&mut greedy.lock(), "greedy", "adapter", op),
        Err(EngineError::PodFull { max: 2 })
    ));
    assert_eq!(greedy.lock().blocks(), 2);
    assert_eq!(greedy.lock().models.len(), 1);
    let toks = tokens(2, 2);
    let op = stored_op(None, &[7, 8], &toks);
    index.apply(&mut other.lock(), "other", "m", op).unwrap();
    assert_eq!(index.stats().engine_blocks, 4);
}

fn store_seeded(
    index: &Index,
    e: &EngineHandle,
    parent: Option<u64>,
    hashes: &[u64],
    toks: &[u32],
    seeds: &[u64],
) -> Result<Applied, EngineError> {
    index.apply(
        &mut e.lock(),
        "pod",
        "m",
        seeded_op(parent, hashes, toks, seeds),
    )
}

/// The key of prompt `p` with block `i` seeded by `seeds[i]` (0 past it).
fn seeded_key(p: u32, blocks: u32, seeds: &[u64]) -> Vec<u64> {
    tokens(p, blocks)
        .chunks(4)
        .enumerate()
        .map(|(i, b)| seeded(b, seeds.get(i).copied().unwrap_or(0)))
        .collect()
}

#[test]
fn seeded_blocks_match_only_keys_with_their_seeds() {
    let (index, e) = engine_fed(4);
    // A salt on the first block, an item on the third.
    let seeds = [7, 0, 9, 0];
    store_seeded(&index, &e, None, &[1, 2, 3, 4], &tokens(1, 4), &seeds).unwrap();
    assert_eq!(matched(&index, &seeded_key(1, 4, &seeds), T0), pod(4));
    assert!(matched(&index, &key(1, 4), T0).is_empty());
    // Another item on the third block: the blocks before it.
    assert_eq!(
        matched(&index, &seeded_key(1, 4, &[7, 0, 8, 0]), T0),
        pod(2)
    );
    // Seeds of the wrong count are refused whole.
    let refused = store_seeded(&index, &e, None, &[5], &tokens(2, 1), &[1, 2]);
    assert!(matches!(
        refused,
        Err(EngineError::SeedCount {
            seeds: 2,
            blocks: 1,
            expected: 1
        })
    ));
    // Engine blocks of two of ours: a seed per block of ours.
    let wide = index.engine("wide", spec(8)).unwrap();
    let toks = tokens(3, 4);
    let op = seeded_op(None, &[11, 12], &toks, &[5, 0, 0, 6]);
    index.apply(&mut wide.lock(), "wide", "m", op).unwrap();
    assert_eq!(
        index.lookup("m", &seeded_key(3, 4, &[5, 0, 0, 6]), None, T0),
        [("wide".to_string(), 4)]
    );
    assert_eq!(
        index.lookup("m", &seeded_key(3, 4, &[5]), None, T0),
        [("wide".to_string(), 2)]
    );
}

#[test]
fn a_group_of_pages_takes_its_first_pages_seed_and_keeps_it_in_snapshots() {
    let (index, e) = engine_fed(1);
    let toks = tokens(4, 3);
    let hashes: Vec<u64> = (20..32).collect();
    // The sequence's first page is salted; a page of the third block holds
    // an item, which a page cannot place in our block.
    let mut seeds = vec![0; 12];
    seeds[0] = 7;
    seeds[9] = 9;
    store_seeded(&index, &e, None, &hashes, &toks, &seeds).unwrap();
    let salted = seeded_key(4, 3, &[7]);
    assert_eq!(matched(&index, &salted, T0), pod(2));
    assert!(matched(&index, &key(4, 3), T0).is_empty());
    // The third group matches no key: not the plain one, not one with the
    // page's seed.
    assert_eq!(matched(&index, &seeded_key(4, 3, &[7, 0, 9]), T0), pod(2));
    let mut bytes = Vec::new();
    index.write_snapshot(&mut bytes, T0).unwrap();
    let restored = super::tests::index();
    let got = crate::Snapshot::parse(&bytes)
        .unwrap()
        .restore(&restored, T0);
    assert_eq!(got.refused, 0);
    assert_eq!(matched(&restored, &salted, T0), pod(2));
    // The restored pages' seeds hold for groups closed after the restart.
    let e = restored.engine("pod", spec(1)).unwrap();
    let more = tokens(4, 4);
    let more_hashes: Vec<u64> = (32..36).collect();
    store_seeded(&restored, &e, Some(31), &more_hashes, &more[12..], &[]).unwrap();
    assert_eq!(matched(&restored, &seeded_key(4, 4, &[7]), T0), pod(2));
    assert!(matched(&restored, &key(4, 4), T0).is_empty());
}

/// A 1,000,000-token prompt (62,500 blocks of 16), stored by its engine 512
/// blocks an event, is held and found whole under the default key limit.
#[test]
fn a_million_token_prompt_is_held_and_found_whole_by_default() {
    const BLOCKS: usize = 62_500;
    let index = Index::new(IndexConfig::default());
    let spec = EngineSpec {
        engine_block: 16,
        our_block: 16,
        hash: seeded,
    };
    let e = index.engine("pod", spec).unwrap();
    let toks: Vec<u32> = (0..(BLOCKS * 16) as u32).collect();
    let hashes: Vec<u64> = (1..=BLOCKS as u64).collect();
    for start in (0..BLOCKS).step_by(512) {
        let end = (start + 512).min(BLOCKS);
        let parent = start.checked_sub(1).map(|i| hashes[i]);
        let done = store_seeded(
            &index,
            &e,
            parent,
            &hashes[start..end],
            &toks[start * 16..end * 16],
            &[],
        )
        .unwrap();
        assert_eq!((done.orphaned, done.too_deep), (0, 0));
    }
    let key: Vec<u64> = toks.chunks(16).map(hash).collect();
    assert_eq!(
        index.lookup("m", &key, None, T0),
        [("pod".to_string(), BLOCKS as u32)]
    );
}
