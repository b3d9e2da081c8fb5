//! Block sets: blocks a client knows by hash alone, each held as a key of
//! one block at the root of a model's tree.
//!
//! SGLang's KV-indexer bridge reports each store and eviction of an engine
//! as bare block hashes, with neither parents nor tokens; they cannot be
//! placed on a path of ours. They are chained hashes, though (each names
//! its whole prefix, the way SGLang's router hashes a prompt), so whether a
//! pod holds a prompt's first `n` blocks is whether it holds each of the
//! first `n` hashes. A pod's **set** (a cache tier, say) holds each hash as
//! a key of its own, through a hidden pod of its own, `{pod}\0{SET_BASE +
//! set}`, whose entries never expire and count against no capacity (the
//! client says what it evicts); the global `max_blocks` bound still holds.
//! [`Reader::set_holders`] reads which sets hold a hash: one probe of the
//! root's child table, without locks, as any lookup.
//!
//! Snapshots keep sets (`crate::snapshot`, `SetBlocks`).

use crate::error::InsertError;
use crate::index::{Index, Reader};
use crate::pods::PodId;
use crate::precise::groups::{hidden_name, HIDDEN_MARK};
use crate::precise::PINNED;

/// The most sets one pod may have.
pub const MAX_SETS: u32 = 16;

/// The hidden-pod index of set 0: past every group and lower tier.
const SET_BASE: u32 = 128;

/// Why a set could not hold blocks.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    /// The set's index is past [`MAX_SETS`].
    #[error("set {set} is past the {max} a pod may have")]
    Set {
        /// The set asked for.
        set: u32,
        /// [`MAX_SETS`].
        max: u32,
    },
    /// Its pod or model could not be named, or the index is full.
    #[error(transparent)]
    Insert(#[from] InsertError),
}

impl Index {
    fn set_name(pod: &str, set: u32) -> Result<String, SetError> {
        if set >= MAX_SETS {
            return Err(SetError::Set { set, max: MAX_SETS });
        }
        Ok(hidden_name(pod, SET_BASE + set))
    }

    /// Set `set` of `pod` holds each of `hashes` under `model` (holding a
    /// hash it holds already changes nothing). On error, it may hold some
    /// of them.
    pub fn set_hold(
        &self,
        model: &str,
        pod: &str,
        set: u32,
        hashes: &[u64],
    ) -> Result<(), SetError> {
        let name = Self::set_name(pod, set)?;
        if hashes.is_empty() {
            return Ok(());
        }
        let pin = self.pin();
        let tree = self.tree_or_create(model, &pin)?;
        let id = self
            .sh
            .pods
            .intern_hidden(
                &name,
                self.sh.cfg.max_name_len.saturating_add(11),
                &self.sh.epoch,
                &pin,
            )
            .map_err(InsertError::from)?;
        self.mark_precise(id, 1, false);
        for &h in hashes {
            tree.insert(&self.sh, &[h], id.0, PINNED, &pin)?;
        }
        Ok(())
    }

    /// Set `set` of `pod` no longer holds `hashes` under `model` (a hash
    /// it does not hold is skipped); returns how many it held.
    pub fn set_release(&self, model: &str, pod: &str, set: u32, hashes: &[u64]) -> u64 {
        let Ok(name) = Self::set_name(pod, set) else {
            return 0;
        };
        let pin = self.pin();
        let Some(id) = self.sh.pods.id(&name, &pin) else {
            return 0;
        };
        hashes
            .iter()
            .map(|&h| self.release_at(model, &[h], 0, id.0))
            .sum()
    }

    /// Empties set `set` of `pod` under every model; returns whether it
    /// held anything.
    pub fn set_clear(&self, pod: &str, set: u32) -> bool {
        let Ok(name) = Self::set_name(pod, set) else {
            return false;
        };
        let pin = self.pin();
        self.sh.pods.remove(&name, &self.sh.epoch, &pin)
    }
}

impl Reader<'_> {
    /// Appends to `out` each set holding `hash` under `model`, as (pod,
    /// set): names borrowed from the reader's pin.
    pub fn set_holders<'s>(&'s self, model: &str, hash: u64, out: &mut Vec<(&'s str, u32)>) {
        let index = self.index();
        let (sh, pin) = (&index.sh, self.pin());
        let Some(tree) = index.models(pin).get(model) else {
            return;
        };
        let Some(node) = tree.root(pin).child(hash, sh.seed) else {
            return;
        };
        node.pods.for_each(|id, _| {
            if !sh.pods.is_live(id) || !sh.pods.is_hidden(id) {
                return;
            }
            if let Some((pod, set)) = sh.pods.name(PodId(id), pin).and_then(split_set) {
                out.push((pod, set));
            }
        });
    }
}

/// The pod and set of a set's hidden pod name.
pub(crate) fn split_set(name: &str) -> Option<(&str, u32)> {
    let (pod, idx) = name.rsplit_once(HIDDEN_MARK)?;
    let idx: u32 = idx.parse().ok()?;
    let set = idx.checked_sub(SET_BASE).filter(|&s| s < MAX_SETS)?;
    Some((pod, set))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use crate::{Index, IndexConfig, Snapshot};

    const T0: u64 = 1_700_000_000_000;

    fn index() -> Index {
        Index::new(IndexConfig {
            ttl: Duration::from_secs(1),
            ..IndexConfig::default()
        })
    }

    fn holders(index: &Index, hash: u64) -> Vec<(String, u32)> {
        let r = index.reader();
        let mut out = Vec::new();
        r.set_holders("m", hash, &mut out);
        let mut out: Vec<(String, u32)> = out.into_iter().map(|(p, s)| (p.into(), s)).collect();
        out.sort();
        out
    }

    #[test]
    fn sets_hold_hashes_until_released_or_cleared_and_never_expire() {
        let index = index();
        index.set_hold("m", "w0", 0, &[1, 2, 3]).unwrap();
        index.set_hold("m", "w0", 1, &[3]).unwrap();
        index.set_hold("m", "w1", 0, &[3, 3]).unwrap();
        assert_eq!(holders(&index, 1), [("w0".into(), 0)]);
        assert_eq!(
            holders(&index, 3),
            [("w0".into(), 0), ("w0".into(), 1), ("w1".into(), 0)]
        );
        assert!(holders(&index, 4).is_empty());
        // Sets are hidden from plain lookups, and no TTL or sweep takes
        // their entries.
        assert!(index.lookup("m", &[1], None, T0).is_empty());
        index.sweep(T0 + 3_600_000, usize::MAX);
        assert_eq!(holders(&index, 2), [("w0".into(), 0)]);
        assert_eq!(index.set_release("m", "w0", 0, &[2, 9]), 1);
        assert!(holders(&index, 2).is_empty());
        assert_eq!(index.set_release("m", "nobody", 0, &[1]), 0);
        assert!(index.set_clear("w0", 0));
        assert_eq!(holders(&index, 3), [("w0".into(), 1), ("w1".into(), 0)]);
        assert!(!index.set_clear("w0", 0));
        assert!(index.set_hold("m", "w0", crate::MAX_SETS, &[1]).is_err());
    }

    #[test]
    fn a_snapshot_keeps_sets() {
        let index = index();
        index.set_hold("m", "w0", 0, &[1, 2]).unwrap();
        index.set_hold("m", "w0", 2, &[2]).unwrap();
        index.set_hold("other", "w1", 0, &[5]).unwrap();
        let mut bytes = Vec::new();
        index.write_snapshot(&mut bytes, T0).unwrap();
        let fresh = self::index();
        let sum = Snapshot::parse(&bytes).unwrap().restore(&fresh, T0);
        assert_eq!((sum.set_blocks, sum.refused), (4, 0));
        for h in [1, 2, 5] {
            assert_eq!(holders(&fresh, h), holders(&index, h));
        }
        let r = fresh.reader();
        let mut out = Vec::new();
        r.set_holders("other", 5, &mut out);
        assert_eq!(out, [("w1", 0)]);
    }
}
