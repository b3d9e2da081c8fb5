//! Hit counts (`MatchExternalKv` with `count_as_hit`,
//! `GetExternalKvHitCounts`): how many counting matches found each hash
//! held by some worker. A count lives while its hash is held: the last
//! revocation drops it, and one whose hash a clear took is dropped when
//! next read.

use std::collections::HashMap;

use prefix_index::Index;

use super::pb::HitCountEntry;
use super::SET_MODEL;

/// The counts, by hash.
#[derive(Default)]
pub struct Hits {
    counts: parking_lot::Mutex<HashMap<i64, u64>>,
}

/// Whether any worker's set holds `hash`.
pub fn held(index: &Index, hash: i64) -> bool {
    let reader = index.reader();
    let mut out = Vec::new();
    reader.set_holders(SET_MODEL, hash as u64, &mut out);
    !out.is_empty()
}

impl Hits {
    /// One hit more on each of `hashes` (each held).
    pub fn count(&self, hashes: &[i64]) {
        if hashes.is_empty() {
            return;
        }
        let mut counts = self.counts.lock();
        for &h in hashes {
            let c = counts.entry(h).or_insert(0);
            *c = c.saturating_add(1);
        }
    }

    /// Drops the counts of `hashes` no worker holds any more.
    pub fn forget_unheld(&self, index: &Index, hashes: &[i64]) {
        let mut counts = self.counts.lock();
        if counts.is_empty() {
            return;
        }
        for h in hashes {
            if counts.contains_key(h) && !held(index, *h) {
                counts.remove(h);
            }
        }
    }

    /// The counts of `hashes` (each once, in order) that have one and are
    /// held; counts of hashes no longer held are dropped.
    pub fn counts(&self, index: &Index, hashes: &[i64]) -> Vec<HitCountEntry> {
        let mut counts = self.counts.lock();
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for &h in hashes {
            if !seen.insert(h) {
                continue;
            }
            let Some(&n) = counts.get(&h) else {
                continue;
            };
            if held(index, h) {
                out.push(HitCountEntry {
                    hash: h,
                    hit_count_total: n,
                });
            } else {
                counts.remove(&h);
            }
        }
        out
    }
}
