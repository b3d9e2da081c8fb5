//! Digests of the gateway-fed entries, for replicas that repair each other
//! by comparing them ([`prefix_proto::DigestAsk`] defines the items, cells
//! and groups, and the hashes).
//!
//! Each question is one walk of a model's tree under one pin, in safe code:
//! every node whose gateway-fed pods hold an entry last written inside the
//! window gives, per such pod and per block of its edge, one item: the
//! hash of the block's position (the chain of the key's blocks down to it)
//! with the pod's name. The shape of the tree does not show: a split edge
//! gives the same items. A node none of whose gateway-fed entries is newer
//! than the window's start is not entered: a pod's entry on a child is
//! never newer than its parent's (the tree keeps `pods(parent) ⊇
//! pods(child)`, a parent refreshed with each of its children).
//!
//! Engine-fed pods are left out (each replica follows its engines itself),
//! as are removed pods and expired entries (a lookup does not see them).

use std::collections::HashSet;

use prefix_proto::message::{cell_of, item, path_root, path_step, pod_hash, CELLS};

use crate::index::Reader;
use crate::node_ref::NodeRef;
use crate::pods::PodId;
use crate::shared::Shared;
use crate::walk::Walk;

/// The entries a digest covers: gateway-fed, last written after `low` and
/// at or before `high` (ms since the Unix epoch), and not expired at `now`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Exclusive start.
    pub low: u64,
    /// Inclusive end.
    pub high: u64,
    /// The time expiry is judged at.
    pub now: u64,
}

impl Window {
    fn holds(&self, sh: &Shared, time: u64) -> bool {
        time > self.low && time <= self.high && self.now.saturating_sub(time) <= sh.ttl_ms
    }
}

/// An entry holding asked items ([`Reader::digest_entries`]): `pod` holds
/// every prefix of `key`, last written at `at`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found<'r> {
    /// The pod.
    pub pod: &'r str,
    /// From the root to the deepest asked block of the entry's node.
    pub key: Vec<u64>,
    /// The entry's last write.
    pub at: u64,
}

/// One gateway-fed entry of the window met by a walk: the node, the depth
/// its edge starts at, and the items of each of its blocks.
struct Met<'w> {
    pod: u32,
    time: u64,
    /// The key down to the node's end.
    key: &'w [u64],
    /// Each block's position hash, along the node's edge.
    paths: &'w [u64],
    /// The pod's name hash.
    pod_hash: u64,
}

impl Reader<'_> {
    /// The cell digests ([`CELLS`] of them) of `model`'s gateway-fed
    /// entries in `w`; `None` for a model the index does not hold.
    pub fn digest_cells(&self, model: &str, w: Window) -> Option<Vec<u64>> {
        let mut cells = vec![0u64; CELLS];
        self.each_entry(model, w, |m| {
            for &p in m.paths {
                let i = item(p, m.pod_hash);
                cells[cell_of(i)] ^= i;
            }
            true
        })?;
        Some(cells)
    }

    /// The models the index holds, by name.
    pub fn model_names(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self
            .index()
            .models(self.pin())
            .keys()
            .map(|m| &**m)
            .collect();
        names.sort_unstable();
        names
    }

    /// The items of `model`'s gateway-fed entries in `w` that fall in a
    /// cell of `cells` (`cells[c]` for cell `c`), ascending, whole cells
    /// only: past `max` items the answer stops after the last whole cell
    /// that fits (the first one at least), and the flag says so. The cells
    /// up to the last item's are then complete; the others are not given.
    pub fn digest_items(
        &self,
        model: &str,
        w: Window,
        cells: &[bool],
        max: usize,
    ) -> (Vec<u64>, bool) {
        // First each cell's count, then the items of the cells that fit:
        // memory stays within the answer, whatever was asked.
        let mut counts = vec![0usize; CELLS];
        self.each_entry(model, w, |m| {
            for &p in m.paths {
                let c = cell_of(item(p, m.pod_hash));
                if cells.get(c).copied().unwrap_or(false) {
                    counts[c] += 1;
                }
            }
            true
        });
        let (mut taken, mut n) = (vec![false; CELLS], 0usize);
        let mut more = false;
        for (c, &k) in counts.iter().enumerate().filter(|(_, &k)| k > 0) {
            // Whole cells, the first one whatever its size.
            if n > 0 && n + k > max {
                more = true;
                break;
            }
            taken[c] = true;
            n += k;
        }
        let mut items = Vec::with_capacity(n);
        if n > 0 {
            self.each_entry(model, w, |m| {
                for &p in m.paths {
                    let i = item(p, m.pod_hash);
                    if taken[cell_of(i)] {
                        items.push(i);
                    }
                }
                true
            });
        }
        items.sort_unstable();
        (items, more)
    }

    /// Whether `pod` is a live engine-fed pod (its engine, not a peer,
    /// says what it holds).
    pub fn is_engine_fed(&self, pod: &str) -> bool {
        let sh = &self.index().sh;
        sh.pods
            .id(pod, self.pin())
            .is_some_and(|id| sh.pods.is_live(id.0) && !sh.pods.is_gateway(id.0))
    }

    /// Whether `pod` holds a gateway-fed entry of any model last written
    /// after `t` and not expired at `now`.
    pub fn written_since(&self, pod: &str, t: u64, now: u64) -> bool {
        let Some(id) = self.index().sh.pods.id(pod, self.pin()) else {
            return false;
        };
        let w = Window {
            low: t,
            high: u64::MAX,
            now,
        };
        self.model_names().into_iter().any(|model| {
            let mut found = false;
            self.each_entry(model, w, |m| {
                found = m.pod == id.0;
                !found
            });
            found
        })
    }

    /// The entries of `model` in `w` holding items of `wanted`: per node
    /// and pod, one entry with the key down to the deepest wanted block of
    /// the node's edge. Stops before the keys' blocks pass `max_blocks`,
    /// counting each entry's pod name as blocks too (one per 8 bytes, and
    /// two for the entry itself: about what it takes on the wire); the
    /// flag says whether some were left out.
    pub fn digest_entries(
        &self,
        model: &str,
        w: Window,
        wanted: &HashSet<u64>,
        max_blocks: usize,
    ) -> (Vec<Found<'_>>, bool) {
        let (sh, pin) = (&self.index().sh, self.pin());
        let mut found = Vec::new();
        let (mut blocks, mut more) = (0usize, false);
        self.each_entry(model, w, |m| {
            let Some(deepest) = m
                .paths
                .iter()
                .rposition(|&p| wanted.contains(&item(p, m.pod_hash)))
            else {
                return true;
            };
            let depth = m.key.len() - m.paths.len() + deepest + 1;
            let Some(pod) = sh.pods.name(PodId(m.pod), pin) else {
                return true;
            };
            let cost = depth + pod.len().div_ceil(8) + 2;
            if blocks + cost > max_blocks {
                more = true;
                return false;
            }
            blocks += cost;
            found.push(Found {
                pod,
                key: m.key[..depth].to_vec(),
                at: m.time,
            });
            true
        });
        (found, more)
    }

    /// Calls `f` with every gateway-fed entry of `model` in `w`, parents
    /// before children, until it returns false; `None` for a model the
    /// index does not hold.
    fn each_entry(
        &self,
        model: &str,
        w: Window,
        mut f: impl FnMut(&Met<'_>) -> bool,
    ) -> Option<()> {
        let (sh, pin) = (&self.index().sh, self.pin());
        let tree = self.index().models(pin).get(model)?.clone();
        // Each pod's name hash, by id, as first met.
        let mut pod_hashes: Vec<Option<u64>> = Vec::new();
        let mut key: Vec<u64> = Vec::new();
        let mut paths: Vec<u64> = Vec::new();
        // Each level carries the key's length at its node's end; the
        // position hash there is `paths[len - 1]`.
        let mut walk = Walk::new(tree.root(pin), 0usize);
        loop {
            let Some(node) = walk.next_child() else {
                if walk.leave().is_none() {
                    break;
                }
                let len = *walk.data();
                key.truncate(len);
                paths.truncate(len);
                continue;
            };
            if !gateway_entry_after(sh, node, w) {
                continue;
            }
            let start = key.len();
            let mut at = paths.last().copied().unwrap_or(path_root());
            for &b in node.edge.iter() {
                at = path_step(at, b);
                key.push(b);
                paths.push(at);
            }
            for (pod, time) in node.pods.entries() {
                if !sh.pods.is_gateway(pod) || !w.holds(sh, time) {
                    continue;
                }
                let slot = pod as usize;
                if pod_hashes.len() <= slot {
                    pod_hashes.resize(slot + 1, None);
                }
                let hash = match pod_hashes[slot] {
                    Some(h) => h,
                    None => {
                        let Some(name) = sh.pods.name(PodId(pod), pin) else {
                            continue;
                        };
                        *pod_hashes[slot].insert(pod_hash(name))
                    }
                };
                let met = Met {
                    pod,
                    time,
                    key: &key,
                    paths: &paths[start..],
                    pod_hash: hash,
                };
                if !f(&met) {
                    return Some(());
                }
            }
            walk.enter(node, key.len());
        }
        Some(())
    }
}

/// Whether `node` holds a gateway-fed entry written after the window's
/// start and not expired: else nothing below it is in the window.
fn gateway_entry_after(sh: &Shared, node: NodeRef<'_>, w: Window) -> bool {
    node.pods.entries().any(|(pod, time)| {
        sh.pods.is_gateway(pod) && time > w.low && w.now.saturating_sub(time) <= sh.ttl_ms
    })
}

#[cfg(test)]
mod tests;
