//! Precise mode's part of a lookup (`tree::Finish`): the matches of
//! engine-fed pods whose entries alone do not give them. A gappy pod's is
//! cut at the first node of the path, top-down, where it is not visible; a
//! hybrid pod's is found by its groups' rules; every engine-fed pod's is
//! rounded down to whole engine blocks.

use smallvec::SmallVec;

use super::registry::Registry;
use crate::named::Named;
use crate::node_ref::NodeRef;
use crate::pods::PodId;
use crate::precise::groups::{GroupTable, Rule};
use crate::reclaim::Pin;
use crate::shared::Shared;
use crate::slots::MAX_TIME;
use crate::tree::{Finish, Match, Walked};

impl Finish for Registry {
    fn finish(&self, sh: &Shared, path: &Walked<'_>, now: u64, found: &mut [Match], pin: &Pin) {
        for m in found.iter_mut() {
            let align = sh.pods.align(m.pod.0);
            let (hybrid, gappy) = sh.pods.hybrid_gappy(m.pod.0);
            if hybrid {
                m.blocks = group_hit(sh, &self.groups, path, now, m.pod.0, m.blocks, pin);
                continue;
            }
            m.blocks -= m.blocks % align;
            if !gappy {
                continue;
            }
            let mut above = 0;
            for &(node, depth) in path {
                if above >= m.blocks {
                    break;
                }
                let visible = node
                    .pods
                    .find(m.pod.0)
                    .is_some_and(|time| now.saturating_sub(time) <= sh.ttl_ms);
                if !visible {
                    m.blocks = above - above % align;
                    break;
                }
                above = depth;
            }
        }
    }
}

/// A hybrid pod's match, at most `found` blocks (the deepest node where its
/// own entries are visible): the longest hit its KV-cache groups allow
/// together (`crate::precise::groups::hit`), each group's blocks being its entries
/// (the first group's) or a hidden pod's. A speculative entry of the pod (a
/// gateway's insert, not pinned) stands for every group: the engine is
/// computing that prefix.
///
/// Kept out of line: plain pods' lookups (the hot path) never call it.
#[inline(never)]
fn group_hit(
    sh: &Shared,
    groups: &Named<GroupTable>,
    path: &Walked<'_>,
    now: u64,
    pod: u32,
    found: u32,
    pin: &Pin,
) -> u32 {
    let align = sh.pods.align(pod).max(1);
    let table = sh
        .pods
        .name(PodId(pod), pin)
        .and_then(|name| groups.get(pin).get(name));
    let Some(table) = table else {
        // No longer hybrid (its engine dropped meanwhile): as a plain pod.
        return found - found % align;
    };
    let ids: SmallVec<[Option<u32>; 8]> = table
        .groups
        .iter()
        .map(|(hidden, _)| match hidden {
            None => Some(pod),
            Some(name) => sh.pods.id(name, pin).map(PodId::get),
        })
        .collect();
    let rules: SmallVec<[Rule; 8]> = table.groups.iter().map(|g| g.1).collect();
    let visible = |node: NodeRef<'_>, id: u32| {
        node.pods
            .find(id)
            .is_some_and(|time| now.saturating_sub(time) <= sh.ttl_ms)
    };
    // Which groups hold each node of the path down to the match, as bits.
    let depth = path.partition_point(|&(_, d)| d < found) + 1;
    let masks: SmallVec<[u64; 16]> = path[..depth.min(path.len())]
        .iter()
        .map(|&(node, _)| match node.pods.find(pod) {
            Some(t) if t < MAX_TIME && now.saturating_sub(t) <= sh.ttl_ms => u64::MAX,
            _ => ids.iter().enumerate().fold(0, |mask, (g, id)| {
                mask | u64::from(id.is_some_and(|id| visible(node, id))) << g
            }),
        })
        .collect();
    // Unit `j` is held where its last block of ours is: block
    // `(j + 1) * align - 1`, on the first node whose edge ends past it.
    let held = |g: usize, j: u32| {
        let block = (j + 1) * align - 1;
        let k = path.partition_point(|&(_, d)| d <= block);
        masks.get(k).is_some_and(|m| m >> g & 1 != 0)
    };
    crate::precise::groups::hit(&rules, found / align, held) * align
}
