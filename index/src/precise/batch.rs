//! A batch of one pod's engine events: where events enter, and where held
//! removals go to the tree.

use super::store::Store;
use super::{Applied, Engine, EngineOp, Ratio, Run};
use crate::error::EngineError;
use crate::index::Index;
use crate::precise::groups::{lower_lane, Group, Rule, MAX_LOWER_TIERS};

/// Engine events of one pod being applied, as [`Index::batch`] starts it.
///
/// Tail-first removals are held (as one run) until the batch ends or an
/// event that is not one of them comes: lookups meanwhile still see those
/// blocks, for as long as the batch takes. Dropping the batch ends it, as
/// [`EngineBatch::finish`] does.
pub struct EngineBatch<'a> {
    index: &'a Index,
    engine: &'a mut Engine,
    pod: &'a str,
}

impl EngineBatch<'_> {
    /// Applies one engine event to the pod's blocks under `model`
    /// (removals, which name no model, find their hashes under any). Bad
    /// events (wrong token counts) are refused whole, before anything
    /// changes. Removals held for the end of the batch count as
    /// [`Applied::released`] when they go to the tree.
    pub fn apply(&mut self, model: &str, op: EngineOp<'_>) -> Result<Applied, EngineError> {
        self.apply_group(Group::PLAIN, model, op)
    }

    /// Applies one engine event of KV-cache group `group` (see
    /// [`GroupKind`](crate::GroupKind)): a store's group says its kind,
    /// learnt for the pod's lookups; a removal's only its index (its kind
    /// is not read); "cleared" empties every group. Group 0 of full
    /// attention is what [`EngineBatch::apply`] applies. A store may name
    /// fewer blocks than its token ids fill when its group skipped blocks
    /// (a sliding window's), if another group records them.
    pub fn apply_group(
        &mut self,
        group: Group,
        model: &str,
        op: EngineOp<'_>,
    ) -> Result<Applied, EngineError> {
        let mut done = Applied::default();
        let (index, engine, pod) = (self.index, &mut *self.engine, self.pod);
        if engine.closed {
            return Ok(done);
        }
        let max = index.sh.cfg.max_engine_groups.min(64);
        if group.idx >= max {
            return Err(EngineError::Group {
                idx: group.idx,
                max,
            });
        }
        if let EngineOp::Stored { hashes, .. } = op {
            if engine.learn(group) {
                // Before any of the group's blocks are placed, so that no
                // lookup reads them by another rule.
                index.publish_groups(pod, engine);
            }
            if engine.ruled() && engine.rule(group.idx) == Rule::Never {
                // Not read at all (its blocks may be of another size).
                done.unmodelled += hashes.len() as u64;
                return Ok(done);
            }
        }
        match op {
            EngineOp::Cleared => {
                // The pod gets a new id: the run's entries go with the old.
                engine.run.key.clear();
                engine.pending.clear();
                index.budget().uncount(engine);
                index.unalias(engine);
                engine.models.clear();
                engine.chain = None;
                index.clear_engine_pod(pod, engine.align())?;
                done.cleared = 1;
            }
            EngineOp::Stored {
                parent,
                hashes,
                tokens,
                seeds,
                alias,
            } => {
                let per = engine.spec.engine_block as usize;
                // A ruled engine's group may skip blocks: fewer hashes
                // than its tokens fill, never more.
                let skipping = engine.ruled()
                    && tokens.len() % per.max(1) == 0
                    && tokens.len() > hashes.len().saturating_mul(per);
                engine.check_store(hashes, tokens, seeds, skipping)?;
                // A store may hold again what the run removed, so the run
                // goes first; the store's records change even if it fails.
                let settled = index.settle(engine, pod);
                let store = Store {
                    parent,
                    hashes,
                    tokens,
                    seeds,
                    alias,
                };
                let stored = match engine.ruled() {
                    false => index.store(engine, pod, model, store, &mut done),
                    true => index.group_store(engine, pod, model, group.idx, store, &mut done),
                };
                done.released += settled?;
                stored?;
            }
            EngineOp::Removed { hashes } if engine.ruled() => {
                done.released += index.settle(engine, pod)?;
                index.group_remove(engine, pod, model, group.idx, hashes, &mut done)?;
            }
            EngineOp::Removed { hashes } if group.idx == 0 => {
                index.remove(engine, pod, model, hashes, &mut done)?;
            }
            // A group a plain engine never stored in holds none of them.
            EngineOp::Removed { hashes } => done.unknown += hashes.len() as u64,
        }
        Ok(done)
    }

    /// Applies one event of lower cache tier `tier` (0-based, in the
    /// subscription's order, below [`MAX_LOWER_TIERS`]) that the
    /// subscription follows (CPU memory, storage): its blocks' copies are
    /// held apart from the GPU's and from the other tiers', each block
    /// alone, and detailed lookups count the run of them after a pod's
    /// match (`crate::detail`). A store may name blocks
    /// without their token ids (vLLM's placeholders for blocks it offloaded
    /// before it saw their metadata): they are found among the records by
    /// hash, as a sliding window's skipped blocks are. A hybrid pod's lower
    /// tiers are not modelled: their blocks are counted in
    /// [`Applied::unmodelled`]. "Cleared" is the GPU's, as in
    /// [`EngineBatch::apply`].
    pub fn apply_lower(
        &mut self,
        tier: u32,
        model: &str,
        op: EngineOp<'_>,
    ) -> Result<Applied, EngineError> {
        if let EngineOp::Cleared = op {
            return self.apply(model, op);
        }
        if tier >= MAX_LOWER_TIERS {
            return Err(EngineError::Tier {
                tier,
                max: MAX_LOWER_TIERS,
            });
        }
        let lane = lower_lane(tier);
        let mut done = Applied::default();
        let (index, engine, pod) = (self.index, &mut *self.engine, self.pod);
        if engine.closed {
            return Ok(done);
        }
        match op {
            EngineOp::Cleared => {}
            EngineOp::Stored { hashes, .. } if engine.ruled() => {
                done.unmodelled += hashes.len() as u64;
            }
            EngineOp::Stored {
                parent,
                hashes,
                tokens,
                seeds,
                alias,
            } => {
                // Placeholders name hashes alone.
                engine.check_store(hashes, tokens, seeds, tokens.is_empty())?;
                let settled = index.settle(engine, pod);
                index.set_tiered(pod, tier);
                let store = Store {
                    parent,
                    hashes,
                    tokens,
                    seeds,
                    alias,
                };
                let stored = index.group_store(engine, pod, model, lane, store, &mut done);
                done.released += settled?;
                stored?;
            }
            EngineOp::Removed { hashes } if engine.ruled() => {
                // Never held (see above).
                done.unknown += hashes.len() as u64;
            }
            EngineOp::Removed { hashes } => {
                done.released += index.settle(engine, pod)?;
                index.group_remove(engine, pod, model, lane, hashes, &mut done)?;
            }
        }
        Ok(done)
    }

    /// Ends the batch: held removals go to the tree. Returns what that
    /// released.
    pub fn finish(mut self) -> Result<Applied, EngineError> {
        self.end()
    }

    fn end(&mut self) -> Result<Applied, EngineError> {
        let unresolved = self.index.settle_pending(self.engine, self.pod);
        Ok(Applied {
            released: self.index.settle(self.engine, self.pod)?,
            unresolved: unresolved?,
            ..Applied::default()
        })
    }
}

impl Drop for EngineBatch<'_> {
    fn drop(&mut self) {
        // Only naming the pod can fail (its id table is full), and the
        // pod's next event meets the same error and reports it.
        let _ = self.end();
    }
}

impl Engine {
    /// Checks a store's counts: token ids filling its blocks (or, where
    /// `by_hash`, blocks to be found by hash), and a seed per block of ours
    /// or none.
    fn check_store(
        &self,
        hashes: &[u64],
        tokens: &[u32],
        seeds: &[u64],
        by_hash: bool,
    ) -> Result<(), EngineError> {
        let per = self.spec.engine_block as usize;
        if tokens.len() != hashes.len().saturating_mul(per) && !by_hash {
            return Err(EngineError::TokenCount {
                tokens: tokens.len(),
                blocks: hashes.len(),
                block: self.spec.engine_block,
            });
        }
        let expected = hashes.len().saturating_mul(self.ratio.seeds_per_block());
        if !seeds.is_empty() && seeds.len() != expected {
            return Err(EngineError::SeedCount {
                seeds: seeds.len(),
                blocks: hashes.len(),
                expected,
            });
        }
        Ok(())
    }
}

impl Index {
    /// Starts applying a batch of `pod`'s engine events. `engine` is the
    /// pod's state ([`Index::engine`]); hold its lock for the batch.
    pub fn batch<'a>(&'a self, engine: &'a mut Engine, pod: &'a str) -> EngineBatch<'a> {
        EngineBatch {
            index: self,
            engine,
            pod,
        }
    }

    /// Applies one engine event to `pod`'s blocks under `model`: a batch of
    /// one ([`EngineBatch::apply`]).
    pub fn apply(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        op: EngineOp<'_>,
    ) -> Result<Applied, EngineError> {
        let mut batch = self.batch(engine, pod);
        let mut done = batch.apply(model, op)?;
        done.add(&batch.finish()?);
        Ok(done)
    }

    /// Takes `engine`'s held removals off the tree; returns the (pod,
    /// block) pairs released.
    pub(super) fn settle(&self, engine: &mut Engine, pod: &str) -> Result<u64, EngineError> {
        // A closed engine's pod is gone: naming it would register it again.
        if engine.closed {
            engine.run.key.clear();
        }
        self.release_run(&mut engine.run, pod, engine.ratio)
    }

    /// Takes `run` off the tree (if any) and empties it; returns the (pod,
    /// block) pairs released.
    pub(super) fn release_run(
        &self,
        run: &mut Run,
        pod: &str,
        ratio: Ratio,
    ) -> Result<u64, EngineError> {
        if run.key.is_empty() {
            return Ok(0);
        }
        let id = self.precise_id(pod, ratio.align())?;
        let released = self.release_at(&run.model, &run.key, run.from, id);
        run.key.clear();
        Ok(released)
    }
}
