//! Removals: a copy less of each block, and the tree's entries of the
//! blocks left with none.

use super::chain::{chain_path, chain_popped};
use super::{Applied, DataRef, Engine, Placed, Ratio, Records};
use crate::error::EngineError;
use crate::index::Index;
use indexmap::IndexMap;

/// Where the block a removal names is recorded: the position of its model
/// and the record's. Removals name no model (no LoRA adapter): the event's
/// model first, then whichever holds the hash.
#[inline]
pub(super) fn removed_block(
    models: &IndexMap<Box<str>, Records, ahash::RandomState>,
    model: &str,
    h: u64,
) -> Option<(usize, u32)> {
    models
        .get_index_of(model)
        .and_then(|i| Some((i, models[i].find(h)?)))
        .or_else(|| {
            models
                .values()
                .enumerate()
                .find_map(|(i, r)| Some((i, r.find(h)?)))
        })
}

/// Counts a removal by the copies it left (`None`: the block held none);
/// returns whether it took the last copy, so the block leaves the tree.
#[inline]
pub(super) fn released(left: Option<u32>, done: &mut Applied) -> bool {
    match left {
        None => {
            done.unknown += 1;
            false
        }
        Some(left) => {
            done.removed += 1;
            left == 0
        }
    }
}

impl Index {
    pub(super) fn remove(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        hashes: &[u64],
        done: &mut Applied,
    ) -> Result<(), EngineError> {
        let ratio = engine.ratio;
        let max_key = self.sh.cfg.max_key_blocks;
        let mut failed = None;
        let Engine {
            models,
            chain,
            scratch,
            run,
            ..
        } = &mut *engine;
        for &h in hashes {
            let Some((i, at)) = removed_block(models, model, h) else {
                done.unknown += 1;
                continue;
            };
            let Some((name, records)) = models.get_index_mut(i) else {
                continue;
            };
            let model: &str = name;
            if !released(records.take_copy(at), done) {
                continue;
            }
            let path = chain_path(chain, scratch, records, ratio, model, h, max_key);
            match (ratio, path) {
                // The last of our blocks only (see `release_block`), held
                // in the run.
                (Ratio::Whole(_), Ok(path)) if run.extended_by(model, path) => {
                    run.from = path.len() - 1;
                }
                (Ratio::Whole(_), Ok(path)) => {
                    match self.release_run(run, pod, ratio) {
                        Ok(n) => done.released += n,
                        Err(e) => {
                            // The run's pod has no id to take it off with:
                            // the run goes, the new one starts as usual.
                            run.key.clear();
                            failed.get_or_insert(e);
                        }
                    }
                    if *run.model != *model {
                        run.model = model.into();
                    }
                    run.key.extend_from_slice(path);
                    run.from = path.len().saturating_sub(1);
                }
                (_, path) => match self
                    .precise_id(pod, ratio.align())
                    .map_err(EngineError::from)
                    .and_then(|id| self.release_block(records, ratio, id, model, at, path))
                {
                    Ok(n) => done.released += n,
                    Err(e) => {
                        failed.get_or_insert(e);
                    }
                },
            }
            let dropped = records.forget(at, |f| self.forgotten(model, f));
            if records.len() == 0 {
                // Its last record went: the model's records go too, so that
                // adapters an engine has dropped cost nothing.
                models.swap_remove_index(i);
                *chain = None;
            } else {
                chain_popped(chain, ratio, h, dropped);
            }
        }
        // Every hash was applied to the records, whatever the tree said.
        failed.map_or(Ok(()), Err)
    }

    /// Takes pod `id` off the tree's blocks of the engine block at `at` (no
    /// copy left), whose path is `path`.
    pub(super) fn release_block(
        &self,
        records: &Records,
        ratio: Ratio,
        id: u32,
        model: &str,
        at: u32,
        path: Result<&[u64], Placed>,
    ) -> Result<u64, EngineError> {
        // Placed nowhere (an orphan, or too deep): nothing to take off.
        let Ok(path) = path else {
            return Ok(0);
        };
        let released = match (ratio, records.data(at)) {
            // The last of our blocks only: another engine block under the
            // same parent may share the ones before it (the same first
            // tokens), never the last (it would be the same block), and a
            // match ending inside an engine block rounds down to its start.
            (Ratio::Whole(_), _) => self.release_at(model, path, path.len().saturating_sub(1), id),
            (Ratio::Pages(_), DataRef::Page(p)) if p.group.is_some() => {
                self.release_at(model, path, path.len().saturating_sub(1), id)
            }
            // A page inside a group: that group, on every branch below the
            // groups before it (which of them it belongs to is not known).
            (Ratio::Pages(_), _) => self.release_branches(model, path, id),
        };
        Ok(released)
    }
}
