//! The engine's side of aliases (`crate::aliases`): which name a store
//! gives its blocks in another indexer's hashes, registered when a record
//! is made and released when it goes.

use super::{Engine, EngineSpec, Forgotten, Ratio, Records};
use crate::aliases::continued;
use crate::index::Index;

/// How a store's blocks are named in another indexer's hashes, besides
/// ours (see `crate::aliases`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Alias {
    /// Not named otherwise.
    #[default]
    None,
    /// Each engine block's token ids hashed whole by the engine's rule
    /// ([`EngineSpec::hash`]) with `seed`: NVIDIA Dynamo's local block
    /// hashes, whose seed carries a LoRA adapter and a salt. A block's
    /// children use the seed it used when their store names no salt of its
    /// own (`salted` false), since an engine names a request's salt on its
    /// first block only.
    Tokens {
        /// The seed of the store's blocks.
        seed: u64,
        /// Whether the seed carries a salt the store itself names.
        salted: bool,
    },
    /// The engine's own hash of each block (SGLang's chained hashes, which
    /// its router computes from the prompt).
    EngineHash,
}

impl Index {
    /// Names the new record at `at` (engine hash `hash`, tokens `toks`,
    /// under the record at `up`, if any) by `alias`, in the aliases of
    /// `model`. Pages smaller than our blocks are not named: a name of a
    /// page would not be one of our blocks.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn name_record(
        &self,
        model: &str,
        records: &mut Records,
        spec: EngineSpec,
        ratio: Ratio,
        at: u32,
        hash: u64,
        up: Option<u32>,
        toks: &[u32],
        alias: Alias,
    ) {
        if matches!(ratio, Ratio::Pages(_)) || records.alias(at).is_some() {
            return;
        }
        let name = match alias {
            Alias::None => return,
            Alias::EngineHash => hash,
            Alias::Tokens { seed, salted } => {
                let inherited = up.filter(|_| !salted).and_then(|p| records.alias_seed(p));
                let seed = inherited.unwrap_or(seed);
                if salted || inherited.is_some() {
                    records.set_alias_seed(at, seed);
                }
                (spec.hash)(toks, seed)
            }
        };
        // 0 marks a record without one (`Records::alias`).
        if name == 0 {
            return;
        }
        let pin = self.pin();
        let Ok(tree) = self.tree_or_create(model, &pin) else {
            // The store's placing meets the same refusal and reports it.
            return;
        };
        records.set_alias(at, name);
        let ours = records.ours(at);
        let width = ours.len() as u32;
        for (k, &h) in ours.iter().enumerate() {
            let key = continued(name, k as u32);
            let w = if k == 0 { width } else { 0 };
            tree.aliases.add(key, h, w, &self.sh.epoch, &pin);
        }
    }

    /// Accounts for a record dropped from `model`'s records: its bytes
    /// uncounted, its alias released.
    pub(super) fn forgotten(&self, model: &str, f: Forgotten) {
        self.budget().count(-(f.bytes as i64), -1);
        if let Some((name, width)) = f.alias {
            self.release_alias(model, name, width);
        }
    }

    fn release_alias(&self, model: &str, name: u64, width: u32) {
        let pin = self.pin();
        if let Some(tree) = self.models(&pin).get(model) {
            for k in 0..width.max(1) {
                tree.aliases.release(continued(name, k), &pin);
            }
        }
    }

    /// Releases the alias of every record of `engine` (which the caller
    /// then clears).
    pub(crate) fn unalias(&self, engine: &Engine) {
        for (model, records) in &engine.models {
            for (_, name, width) in records.aliased() {
                self.release_alias(model, name, width);
            }
        }
    }
}

impl Index {
    /// Names `engine`'s blocks under `model` as a snapshot wrote them:
    /// (engine hash, alias, inherited alias seed or 0), after its records
    /// were restored.
    pub(crate) fn restore_aliases(
        &self,
        engine: &mut Engine,
        model: &str,
        named: &[(u64, u64, u64)],
    ) -> Result<(), crate::EngineError> {
        if named.is_empty() {
            return Ok(());
        }
        let Some(records) = engine.models.get_mut(model) else {
            return Err(crate::EngineError::Record {
                hash: named[0].0,
                why: "an alias names a block not recorded",
            });
        };
        let pin = self.pin();
        let tree = self.tree_or_create(model, &pin)?;
        for &(hash, name, seed) in named {
            let Some(at) = records.find(hash) else {
                return Err(crate::EngineError::Record {
                    hash,
                    why: "an alias names a block not recorded",
                });
            };
            if name == 0 || records.alias(at).is_some() {
                continue;
            }
            if seed != 0 {
                records.set_alias_seed(at, seed);
            }
            records.set_alias(at, name);
            let ours = records.ours(at);
            let width = ours.len() as u32;
            for (k, &h) in ours.iter().enumerate() {
                let w = if k == 0 { width } else { 0 };
                tree.aliases
                    .add(continued(name, k as u32), h, w, &self.sh.epoch, &pin);
            }
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
