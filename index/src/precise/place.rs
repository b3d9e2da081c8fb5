//! The tree's side of precise mode: an engine-fed pod's id, and its
//! entries placed and taken off at the paths its engine's chains give.

use crate::error::{InsertError, PodError};
use crate::index::Index;

impl Index {
    /// Inserts with the given entry time and no speculation (engine stores).
    pub(crate) fn insert_at(
        &self,
        model: &str,
        key: &[u64],
        pod: &str,
        align: u32,
        time: u64,
    ) -> Result<(), InsertError> {
        let key = self.cut(key);
        if key.is_empty() {
            return Ok(());
        }
        let pin = self.pin();
        let tree = self.tree_or_create(model, &pin)?;
        let id = self.precise_id(pod, align)?;
        tree.insert(&self.sh, key, id, time, &pin)
    }

    /// The id of an engine-fed pod, interning it (and marking it engine-fed)
    /// if a clear or a restart left it unnamed.
    pub(crate) fn precise_id(&self, pod: &str, align: u32) -> Result<u32, PodError> {
        let pin = self.pin();
        let id = self
            .sh
            .pods
            .intern(pod, self.sh.cfg.max_name_len, &self.sh.epoch, &pin)?;
        self.mark_precise(id, align, self.is_grouped(pod));
        Ok(id.0)
    }

    /// Takes an engine-fed pod off blocks `from..key.len()` of `key`; marks
    /// it gappy if it keeps entries below them.
    pub(crate) fn release_at(&self, model: &str, key: &[u64], from: usize, pod: u32) -> u64 {
        let key = self.cut(key);
        let pin = self.pin();
        let Some(tree) = self.models(&pin).get(model).filter(|_| from < key.len()) else {
            return 0;
        };
        let (released, below) = tree.release(&self.sh, key, from, pod, &pin);
        if below {
            self.sh.pods.mark_gappy(pod);
        }
        released
    }

    /// Takes an engine-fed pod off the block after `prefix` on every branch.
    pub(crate) fn release_branches(&self, model: &str, prefix: &[u64], pod: u32) -> u64 {
        if prefix.len() >= self.sh.cfg.max_key_blocks {
            return 0;
        }
        let pin = self.pin();
        let Some(tree) = self.models(&pin).get(model) else {
            return 0;
        };
        let mut key = prefix.to_vec();
        let mut released = 0;
        for next in tree.continuations(&self.sh, prefix, &pin) {
            key.truncate(prefix.len());
            key.push(next);
            let (n, below) = tree.release(&self.sh, &key, prefix.len(), pod, &pin);
            if below {
                self.sh.pods.mark_gappy(pod);
            }
            released += n;
        }
        released
    }

    /// Takes an engine-fed pod off everything (its groups' hidden pods
    /// too); it stays registered.
    pub(crate) fn clear_engine_pod(&self, pod: &str, align: u32) -> Result<(), PodError> {
        // A new id: the old one's entries vanish at once and the sweep
        // frees them, as for a removed pod.
        self.remove_pod(pod);
        self.precise_id(pod, align).map(drop)
    }
}
