//! A hybrid model's KV-cache groups (see `crate::precise::groups`): each group's
//! copies of the shared records, and its blocks in the tree.
//!
//! An engine whose stores name a group besides the first, or a first group
//! that is not full attention, is **ruled**: each of its stores and
//! removals goes by its group. The first group's blocks are the pod's own
//! entries; group `g`'s are a hidden pod's (`{pod}\0{g}`). A group of full
//! attention holds a block's whole path, as a plain engine's one group
//! does (a block is stored while the request holds every block before it);
//! any other kind holds each block alone ([`Tree::insert_from`]), since a
//! sliding window frees the blocks it has moved past and Mamba keeps its
//! state at some blocks only. Lookups find the pod's match by the groups'
//! rules (`crate::precise::groups::hit`).
//!
//! A sliding window's store skips the blocks it did not keep: its token ids
//! cover every block of the step, its hashes only the kept ones, so the
//! hashes cannot be placed by their tokens. They are found among the
//! records the other groups' stores made (the same blocks under the same
//! hashes), at once or after a later store of the batch; a block that none
//! of them recorded by the end of the batch is not held
//! ([`Applied::unresolved`]).
//!
//! [`Tree::insert_from`]: crate::tree::Tree::insert_from

use super::remove::{released, removed_block};
use super::store::Store;
use super::{Applied, Engine, Lane, Ratio, PINNED};
use crate::error::{EngineError, InsertError, PodError};
use crate::index::Index;
use crate::pods::PodId;
use crate::precise::groups::{
    hidden_name, is_lower_lane, lower_lane, Group, GroupKind, GroupTable, Rule,
};

/// Where blocks became held: the position of their model among the
/// engine's, and the group.
#[derive(Clone, Copy)]
struct InGroup {
    model: usize,
    idx: u32,
}

impl Engine {
    /// The kind of group `idx` as this engine can follow it: with engine
    /// pages smaller than our blocks only one group of full attention is
    /// modelled.
    fn followed(&self, group: Group) -> GroupKind {
        match self.ratio {
            Ratio::Pages(_) if group != Group::PLAIN => GroupKind::Unmodelled,
            _ => group.kind,
        }
    }

    /// Records the kind of `group` from one of its stores; returns whether
    /// the engine's groups changed.
    pub(super) fn learn(&mut self, group: Group) -> bool {
        let kind = self.followed(group);
        let idx = group.idx as usize;
        if self.groups.is_empty() && group == Group::PLAIN {
            // A plain engine stays plain (no table, no rules).
            return false;
        }
        if self.groups.is_empty() && !self.models.is_empty() {
            // Every store so far was of group 0 of full attention.
            self.groups.push(Some(GroupKind::Full));
        }
        if self.groups.len() <= idx {
            self.groups.resize(idx + 1, None);
        }
        let changed = self.groups[idx] != Some(kind);
        self.groups[idx] = Some(kind);
        changed
    }

    /// Whether stores and removals go by group (see the module docs).
    pub(crate) fn ruled(&self) -> bool {
        !self.groups.is_empty()
    }

    /// The tokens of one unit of the groups' rules: an engine block, or one
    /// of ours when engine pages are smaller.
    fn unit_tokens(&self) -> u32 {
        self.spec.engine_block.max(self.spec.our_block)
    }

    /// The rule of group `idx` (a group never named allows no hit).
    pub(super) fn rule(&self, idx: u32) -> Rule {
        match self.groups.get(idx as usize).copied().flatten() {
            Some(kind) => Rule::of(kind, self.unit_tokens()),
            None => Rule::Never,
        }
    }

    /// What lookups need of the pod's groups, if it is ruled.
    pub(crate) fn group_table(&self, pod: &str) -> Option<GroupTable> {
        if !self.ruled() {
            return None;
        }
        let groups = self
            .groups
            .iter()
            .enumerate()
            .filter_map(|(idx, kind)| {
                let kind = (*kind)?;
                let name = (idx > 0).then(|| hidden_name(pod, idx as u32).into_boxed_str());
                Some((name, Rule::of(kind, self.unit_tokens())))
            })
            .collect();
        Some(GroupTable { groups })
    }
}

impl Index {
    /// The tree id of group `idx` of `pod`: the pod's own for the first
    /// group, its hidden pod's for the others.
    pub(super) fn group_id(&self, pod: &str, idx: u32, align: u32) -> Result<u32, PodError> {
        if idx == 0 {
            return self.precise_id(pod, align);
        }
        let pin = self.pin();
        let id = self.sh.pods.intern_hidden(
            &hidden_name(pod, idx),
            self.sh.cfg.max_name_len.saturating_add(11),
            &self.sh.epoch,
            &pin,
        )?;
        self.mark_precise(id, align, false);
        Ok(id.0)
    }

    /// Publishes `pod`'s group table for lookups (or withdraws it, for a
    /// plain engine), and marks the pod hybrid or not.
    pub(crate) fn publish_groups(&self, pod: &str, engine: &Engine) {
        let table = engine.group_table(pod);
        let pin = self.pin();
        let hybrid = table.is_some();
        if !self.engines.groups.set(pod, table, &self.sh.epoch, &pin) {
            return;
        }
        if let Some(id) = self.sh.pods.id(pod, &pin) {
            self.sh.pods.set_hybrid(id.0, hybrid);
        }
    }

    /// Whether `pod` has a group table (lookups find its match by it).
    pub(crate) fn is_grouped(&self, pod: &str) -> bool {
        let pin = self.pin();
        let map = self.engines.groups.get(&pin);
        !map.is_empty() && map.contains_key(pod)
    }

    /// Removes the hidden pods of `pod`'s groups and lower tiers (their
    /// entries go, as a removed pod's do); their next stores name them
    /// again.
    pub(crate) fn remove_hidden(&self, pod: &str) {
        let names = self.hidden_names(pod);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let pin = self.pin();
        self.sh.pods.remove_many(&names, &self.sh.epoch, &pin);
    }

    /// The names `pod`'s hidden pods have or would have: its lower tiers'
    /// and its groups'.
    pub(crate) fn hidden_names(&self, pod: &str) -> Vec<String> {
        let pin = self.pin();
        let tiers = self.lower_tiers(pod, &pin);
        let mut names: Vec<String> = (0..tiers)
            .map(|t| hidden_name(pod, lower_lane(t)))
            .collect();
        if let Some(table) = self.engines.groups.get(&pin).get(pod) {
            let groups = table.groups.iter().filter_map(|(name, _)| name.as_deref());
            names.extend(groups.map(String::from));
        }
        names
    }

    /// Forgets the group tables of `pods` (their engines are dropped), with
    /// one copy of the tables for all of them.
    pub(crate) fn forget_group_tables(&self, pods: &[&str]) {
        let pin = self.pin();
        self.engines.groups.forget(pods, &self.sh.epoch, &pin);
    }

    /// Forgets `pod`'s groups: its hidden pods and its table.
    pub(crate) fn forget_groups(&self, pod: &str, engine: &mut Engine) {
        self.remove_hidden(pod);
        engine.groups.clear();
        engine.pending.clear();
        self.publish_groups(pod, engine);
    }

    /// Applies a store of `group` to a ruled engine: its blocks' copies in
    /// the group's lane, and the blocks that became held placed.
    pub(super) fn group_store(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        idx: u32,
        store: Store<'_>,
        done: &mut Applied,
    ) -> Result<(), EngineError> {
        if store.hashes.is_empty() {
            return Ok(());
        }
        let lane = Lane(idx);
        let per = engine.spec.engine_block as usize;
        let result = if store.tokens.len() == store.hashes.len().saturating_mul(per) {
            let recorded = self.record_blocks(engine, model, store, lane, true, done)?;
            let placed = self.place_in_group(
                engine,
                pod,
                InGroup {
                    model: recorded.model,
                    idx,
                },
                &recorded.held,
                true,
                done,
            );
            match recorded.refused {
                Some(e) => Err(e),
                None => placed,
            }
        } else {
            // Blocks skipped: the hashes are found among the records.
            let (mut held, mut at_model) = (Vec::new(), None);
            if let Some(i) = engine.models.get_index_of(model) {
                let records = &mut engine.models[i];
                for &h in store.hashes {
                    match records.find(h) {
                        Some(at) => {
                            done.stored += 1;
                            if records.add_copy_in(lane, at) {
                                held.push(at);
                            }
                        }
                        None => engine.pending.push((model.into(), idx, h)),
                    }
                }
                at_model = Some(i);
            } else {
                let pending = store.hashes.iter().map(|&h| (model.into(), idx, h));
                engine.pending.extend(pending);
            }
            match at_model {
                Some(i) => {
                    self.place_in_group(engine, pod, InGroup { model: i, idx }, &held, false, done)
                }
                None => Ok(()),
            }
        };
        let retried = self.retry_pending(engine, pod, done);
        result.and(retried)
    }

    /// Tries the pending blocks again (another group's store may have
    /// recorded them).
    fn retry_pending(
        &self,
        engine: &mut Engine,
        pod: &str,
        done: &mut Applied,
    ) -> Result<(), EngineError> {
        if engine.pending.is_empty() {
            return Ok(());
        }
        let mut failed = None;
        let pending = std::mem::take(&mut engine.pending);
        for (model, idx, h) in pending {
            let found = engine
                .models
                .get_index_of(&*model)
                .and_then(|i| Some((i, engine.models[i].find(h)?)));
            let Some((i, at)) = found else {
                engine.pending.push((model, idx, h));
                continue;
            };
            done.stored += 1;
            if engine.models[i].add_copy_in(Lane(idx), at) {
                let at_group = InGroup { model: i, idx };
                if let Err(e) = self.place_in_group(engine, pod, at_group, &[at], false, done) {
                    failed.get_or_insert(e);
                }
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Ends a batch for the pending blocks: those still not recorded are
    /// not held.
    pub(super) fn settle_pending(
        &self,
        engine: &mut Engine,
        pod: &str,
    ) -> Result<u64, EngineError> {
        let mut done = Applied::default();
        self.retry_pending(engine, pod, &mut done)?;
        let unresolved = engine.pending.len() as u64;
        engine.pending.clear();
        Ok(unresolved)
    }

    /// Places the blocks at `held` (positions in the records of the model
    /// at `model`, one sequence's, in its order, which became held by group
    /// `idx`): a group of full attention on the last one's whole path (a
    /// store: the request holds every block before it) when `paths`, else
    /// each block alone.
    fn place_in_group(
        &self,
        engine: &Engine,
        pod: &str,
        InGroup { model, idx }: InGroup,
        held: &[u32],
        paths: bool,
        done: &mut Applied,
    ) -> Result<(), EngineError> {
        let Some(&last) = held.last() else {
            return Ok(());
        };
        let (ratio, align) = (engine.ratio, engine.align());
        let Some((model, records)) = engine.models.get_index(model) else {
            return Ok(());
        };
        let max_key = self.sh.cfg.max_key_blocks;
        let (mut ours, mut chain) = (Vec::new(), Vec::new());
        let walked = Engine::walk(
            records,
            ratio,
            records.hash(last),
            max_key,
            &mut ours,
            Some(&mut chain),
        );
        if let Err(why) = walked {
            why.count(done);
            return Ok(());
        }
        let id = self.group_id(pod, idx, align)?;
        let insert = |key: &[u64], from: usize| -> Result<(), InsertError> {
            let pin = self.pin();
            let tree = self.tree_or_create(model, &pin)?;
            tree.insert_from(&self.sh, key, from, id, PINNED, &pin)
        };
        if paths && engine.rule(idx).is_prefix() {
            insert(&ours, 0)?;
            return Ok(());
        }
        let align = align as usize;
        // The blocks' places on the last one's chain (a store's blocks are
        // one sequence, in its order: each is found before the next), held
        // as runs: one insert per run of consecutive blocks, so the group's
        // entries cut the tree only where its runs end.
        let mut places = Vec::with_capacity(held.len());
        let mut before = chain.len();
        for &at in held.iter().rev() {
            let h = records.hash(at);
            if let Some(i) = chain[..before].iter().rposition(|&c| c == h) {
                places.push(i);
                before = i;
            }
        }
        places.reverse();
        let mut rest = &places[..];
        while let Some(&start) = rest.first() {
            let run = rest.windows(2).take_while(|w| w[1] == w[0] + 1).count() + 1;
            let end = (rest[run - 1] + 1) * align;
            insert(&ours[..end], start * align)?;
            rest = &rest[run..];
        }
        Ok(())
    }

    /// Applies a removal of `group` to a ruled engine: a copy less of each
    /// block in its lane, and the blocks left with none taken off the
    /// group's entries.
    pub(super) fn group_remove(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        idx: u32,
        hashes: &[u64],
        done: &mut Applied,
    ) -> Result<(), EngineError> {
        let (ratio, align) = (engine.ratio, engine.align());
        let max_key = self.sh.cfg.max_key_blocks;
        let lane = Lane(idx);
        let mut failed = None;
        for &h in hashes {
            // A store of the batch not recorded yet goes with its removal.
            if let Some(p) = engine.pending.iter().position(|p| p.1 == idx && p.2 == h) {
                engine.pending.swap_remove(p);
                done.removed += 1;
                continue;
            }
            let models = &mut engine.models;
            let Some((i, at)) = removed_block(models, model, h) else {
                done.unknown += 1;
                continue;
            };
            let Some((name, records)) = models.get_index_mut(i) else {
                continue;
            };
            if !released(records.take_copy_in(lane, at), done) {
                continue;
            }
            let path = Engine::path(records, ratio, h, max_key);
            let released = self
                .group_id(pod, idx, align)
                .map_err(EngineError::from)
                .and_then(|id| {
                    let path = path.as_deref().map_err(|e| *e);
                    self.release_block(records, ratio, id, name, at, path)
                });
            match released {
                Ok(n) => done.released += n,
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
            let dropped = records.forget(at, |f| self.forgotten(name, f));
            if dropped > 0 {
                engine.chain = None;
            }
            if records.len() == 0 {
                models.swap_remove_index(i);
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// Learns an engine's groups from a snapshot, and publishes them.
    pub(crate) fn restore_groups(
        &self,
        engine: &mut Engine,
        pod: &str,
        groups: &[(u32, GroupKind)],
    ) -> Result<(), EngineError> {
        let max = self.sh.cfg.max_engine_groups.min(64);
        for &(idx, kind) in groups {
            if idx >= max {
                return Err(EngineError::Group { idx, max });
            }
            engine.learn(Group { idx, kind });
        }
        self.publish_groups(pod, engine);
        Ok(())
    }

    /// Loads the copies of `pod`'s groups after the first (and its lower
    /// tiers') under `model` from a snapshot (its records restored first) and places them.
    pub(crate) fn restore_lanes(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        lanes: Vec<(u32, Vec<(u64, u32)>)>,
    ) -> Result<(), EngineError> {
        let max = self.sh.cfg.max_engine_groups.min(64);
        for (idx, blocks) in lanes {
            let known = match idx {
                _ if is_lower_lane(idx) => true,
                0 => false,
                _ => idx < max && engine.groups.get(idx as usize).copied().flatten().is_some(),
            };
            if !known {
                return Err(EngineError::Group { idx, max });
            }
            if is_lower_lane(idx) {
                self.set_tiered(pod, idx - lower_lane(0));
            }
            let Some(records) = engine.models.get_mut(model) else {
                return match blocks.first() {
                    Some(&(hash, _)) => Err(EngineError::Record {
                        hash,
                        why: "a group's copies name a block not recorded",
                    }),
                    None => Ok(()),
                };
            };
            for (hash, copies) in blocks {
                let Some(at) = records.find(hash) else {
                    return Err(EngineError::Record {
                        hash,
                        why: "a group's copies name a block not recorded",
                    });
                };
                for _ in 0..copies.min(super::records::MAX_COPIES) {
                    records.add_copy_in(Lane(idx), at);
                }
            }
            self.place_lane(engine, pod, model, idx)?;
        }
        Ok(())
    }

    /// Places every block group `idx` holds under `model`, one at a time
    /// (a restore).
    pub(super) fn place_lane(
        &self,
        engine: &Engine,
        pod: &str,
        model: &str,
        idx: u32,
    ) -> Result<(), EngineError> {
        let Some(i) = engine.models.get_index_of(model) else {
            return Ok(());
        };
        let records = &engine.models[i];
        let held: Vec<u32> = match idx {
            0 => records
                .positions()
                .filter(|&at| records.copies(at) > 0)
                .collect(),
            _ => records
                .lane_copies()
                .filter(|&(lane, _, _)| lane == Lane(idx))
                .map(|(_, at, _)| at)
                .collect(),
        };
        let mut done = Applied::default();
        for at in held {
            self.place_in_group(
                engine,
                pod,
                InGroup { model: i, idx },
                &[at],
                false,
                &mut done,
            )?;
        }
        Ok(())
    }

    /// Marks `id` engine-fed with matches rounding to `align`, and hybrid
    /// or not, if it is not already.
    pub(crate) fn mark_precise(&self, id: PodId, align: u32, hybrid: bool) {
        let pods = &self.sh.pods;
        if !pods.is_precise(id.0) || pods.align(id.0) != align || pods.is_hybrid(id.0) != hybrid {
            pods.set_hybrid(id.0, hybrid);
            pods.set_precise(id, true);
            pods.set_capacity(id, u64::MAX);
            pods.set_align(id, align);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
