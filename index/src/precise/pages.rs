//! Engine pages smaller than our blocks: a group of `n` pages is one of
//! our blocks, held while every page of it is.

use super::{DataRef, EngineSpec, Parent, Records};

/// Our hash of the group that the page with `toks` and `seed` closes,
/// under `parent`: the tokens of its `n - 1` ancestors and its own, with
/// the group's seed. `None` if an ancestor is unknown.
///
/// The group's seed is its first page's (a salt is on a sequence's first
/// page, and so on its first group's). A seed on a later page (a
/// multimodal item, say, whose place in our block a page cannot tell) gives
/// the group a seed no gateway key has, so it matches none.
pub(super) fn group_hash(
    records: &Records,
    parent: Option<u64>,
    toks: &[u32],
    seed: u64,
    n: u32,
    spec: EngineSpec,
) -> Option<u64> {
    let mut pages: Vec<&[u32]> = vec![toks];
    let mut seeds: Vec<u64> = vec![seed];
    let mut at = parent.and_then(|p| records.find(p));
    for _ in 1..n {
        let a = at?;
        match records.data(a) {
            DataRef::Page(p) => {
                pages.push(&p.tokens);
                seeds.push(p.seed);
            }
            DataRef::One(_) | DataRef::Many(_) => return None,
        }
        at = match records.parent(a) {
            Parent::At(p) => Some(p),
            Parent::Root | Parent::Unknown(_) => None,
        };
    }
    let tokens: Vec<u32> = pages.iter().rev().flat_map(|p| p.iter().copied()).collect();
    // `seeds` is leaf first: the group's first page is last.
    let (first, later) = seeds.split_last().map_or((0, &[][..]), |(f, l)| (*f, l));
    let seed = match later.iter().any(|&s| s != 0) {
        false => first,
        // Mixed so that no single seed, and so no gateway key, gives it.
        true => later.iter().fold(first ^ UNTOLD, |acc, &s| {
            acc.rotate_left(17) ^ s.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        }),
    };
    (tokens.len() == spec.our_block as usize).then(|| (spec.hash)(&tokens, seed))
}

/// Mixed into the seed of a group whose later pages carry seeds.
const UNTOLD: u64 = 0x756e_746f_6c64_2121;

/// Cuts `key` (the groups on `last`'s path) at the first group with a page
/// not held, walking up from `last`.
pub(super) fn held_groups(records: &Records, last: u64, n: u32, mut key: Vec<u64>) -> Vec<u64> {
    // Groups from the root: `key[k]` is closed by the page at depth
    // `k * n + n - 1`. A page's depth says its group.
    let mut at = records.find(last);
    let mut first_missing: Option<usize> = None;
    while let Some(a) = at {
        if let DataRef::Page(p) = records.data(a) {
            if records.copies(a) == 0 {
                first_missing = Some((p.depth / n) as usize);
            }
        }
        at = match records.parent(a) {
            Parent::At(p) => Some(p),
            Parent::Root | Parent::Unknown(_) => None,
        };
    }
    // Incomplete trailing group: `last` may not close one.
    if let Some(k) = first_missing {
        key.truncate(k);
    }
    key
}
