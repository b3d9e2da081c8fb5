//! The `memory/…` lines: heap per (pod, block) after the ingest.

use std::collections::HashMap;

use super::{gateway_copy, Ours, Peer, Workload, NOW, PODS};

/// Heap bytes that `build` leaves allocated, as `live` (the global
/// allocator's count of live bytes) tells.
pub fn heap_of<T>(live: fn() -> isize, build: impl FnOnce() -> T) -> (T, isize) {
    let before = live();
    let t = build();
    (t, live() - before)
}

/// Prints ours before and after the sweep, the same pairs inserted by
/// gateways, `peer`'s lines, and the floors.
pub(super) fn memory(w: &Workload, live: fn() -> isize, peer: &mut impl Peer) {
    let pairs = w.pods.held() as f64;
    let before = live();
    let ours = Ours::new(&w.names);
    ours.apply(&w.names, &w.steps);
    // Nodes that removals left without pods wait for the sweep (the
    // server's maintenance thread) to be unlinked: both states.
    for when in ["before the sweep", "after the sweep"] {
        if when == "after the sweep" {
            ours.index.sweep(NOW, usize::MAX);
        }
        ours.index.reclaim();
        let heap = live() - before;
        let s = ours.index.stats();
        eprintln!(
            "memory/ours, {when}: {heap} B for {pairs} (pod, block) pairs = {:.1} B each; the index's accounting: tree {:.1} B ({} entries, {} tree blocks, {} nodes), engine records {:.1} B ({} records)",
            heap as f64 / pairs,
            s.bytes as f64 / pairs,
            s.entries,
            s.tree_blocks,
            s.nodes,
            s.engine_bytes as f64 / pairs,
            s.engine_blocks,
        );
    }
    drop(ours);
    // Each stored block also named by Dynamo's block hash of its tokens
    // (`--block-aliases dynamo`, which `/query_by_hash` needs).
    let (aliased, heap) = heap_of(live, || {
        let seed = prefix_server::dynamo_seed(None, None);
        let o = Ours::aliased(
            &w.names,
            prefix_index::Alias::Tokens {
                seed,
                salted: false,
            },
        );
        o.apply(&w.names, &w.steps);
        o.swept()
    });
    let s = aliased.index.stats();
    eprintln!(
        "memory/ours-dynamo-aliases, after the sweep: {heap} B = {:.1} B per (pod, block) pair; the index's accounting: tree {:.1} B, engine records {:.1} B, aliases {:.1} B ({} aliases)",
        heap as f64 / pairs,
        s.bytes as f64 / pairs,
        s.engine_bytes as f64 / pairs,
        s.alias_bytes as f64 / pairs,
        s.aliases,
    );
    drop(aliased);
    // A hybrid model's engines: each pair held by two KV-cache groups.
    if let Some((_, payloads)) = w.identity_payloads.iter().find(|(n, _)| *n == "hybrid") {
        let (hybrid, heap) = heap_of(live, || {
            let o = Ours::new(&w.names);
            o.decode_apply(&super::subscriptions(&w.names), payloads);
            o.swept()
        });
        let s = hybrid.index.stats();
        eprintln!(
            "memory/ours-hybrid, two groups (full attention, a 128-token window) each holding every pair, after the sweep: {heap} B = {:.1} B per (pod, block) pair; the index's accounting: tree {:.1} B ({} entries), engine records {:.1} B",
            heap as f64 / pairs,
            s.bytes as f64 / pairs,
            s.entries,
            s.engine_bytes as f64 / pairs,
        );
        drop(hybrid);
    }
    // The same pairs as gateways insert them: the tree alone.
    let (plain, heap) = heap_of(live, || gateway_copy(w));
    let s = plain.stats();
    eprintln!(
        "memory/ours, the same pairs inserted by a gateway (no engine records): {heap} B = {:.1} B each (the index's accounting {:.1} B; {} entries, {} tree blocks, {} nodes)",
        heap as f64 / pairs,
        s.bytes as f64 / pairs,
        s.entries,
        s.tree_blocks,
        s.nodes,
    );
    drop(plain);
    peer.memory(w, live);
    // The least any engine-hash mapping costs here: a table from each held
    // engine block to one word, shared by the pods (no copy counts, no
    // parent links, no per-pod state), and one such table per pod.
    let (shared, heap) = heap_of(live, || {
        let mut t = HashMap::<u64, u64, ahash::RandomState>::default();
        for (_, h) in w.pods.held_blocks() {
            t.insert(h, h);
        }
        t
    });
    eprintln!(
        "memory/floor: one table of the {} distinct held engine blocks to one word each, shared by the pods: {heap} B = {:.1} B per (pod, block)",
        shared.len(),
        heap as f64 / pairs
    );
    drop(shared);
    let (per_pod, heap) = heap_of(live, || {
        let mut t = vec![HashMap::<u64, u64, ahash::RandomState>::default(); PODS];
        for (pod, h) in w.pods.held_blocks() {
            t[pod].insert(h, h);
        }
        t
    });
    eprintln!(
        "memory/floor: the same, one table per pod: {heap} B = {:.1} B per (pod, block)",
        heap as f64 / pairs
    );
    drop(per_pod);
}
