//! Stores: an event's blocks recorded ([`Index::record_blocks`]), then the
//! chain of those that became held placed in the tree
//! ([`Index::place_chain`]).

use smallvec::SmallVec;

use super::chain::{chain_path, extend_chain};
use super::pages::{group_hash, held_groups};
use super::{
    Alias, Applied, Data, DataRef, Engine, EngineSpec, Extra, Lane, Page, Ratio, Records, PINNED,
};
use crate::error::EngineError;
use crate::index::Index;

/// A store event's blocks, as [`EngineOp::Stored`](super::EngineOp::Stored)
/// carries them (counts checked).
#[derive(Clone, Copy)]
pub(super) struct Store<'a> {
    pub(super) parent: Option<u64>,
    pub(super) hashes: &'a [u64],
    pub(super) tokens: &'a [u32],
    /// Empty, or [`Ratio::seeds_per_block`] per hash.
    pub(super) seeds: &'a [u64],
    /// How the blocks are named in another indexer's hashes.
    pub(super) alias: Alias,
}

/// What recording a store's blocks leaves for placing them.
pub(super) struct Recorded {
    /// The position of the model's records in the engine's map.
    pub(super) model: usize,
    /// The positions of the blocks recorded, in the event's order.
    pub(super) at: SmallVec<[u32; 32]>,
    /// The positions of the blocks that became held, in the event's order,
    /// when asked for (a group's placing needs them; a plain store places
    /// its path to the last block).
    pub(super) held: SmallVec<[u32; 32]>,
    /// The engine hash of the last block recorded, when some block became
    /// held: the event's path is then placed in the tree once, to that
    /// block (held blocks refresh as no-ops).
    last: Option<u64>,
    /// Why recording stopped partway (the records are full): the blocks
    /// recorded before are held, and are placed like any others before the
    /// error is returned.
    pub(super) refused: Option<EngineError>,
}

impl Index {
    /// Applies `store` to `pod`'s records under `model` and to the tree.
    pub(super) fn store(
        &self,
        engine: &mut Engine,
        pod: &str,
        model: &str,
        store: Store<'_>,
        done: &mut Applied,
    ) -> Result<(), EngineError> {
        // A model's records exist while it has one: an empty store names a
        // model (an adapter, say) and records nothing.
        if store.hashes.is_empty() {
            return Ok(());
        }
        let parent = store.parent;
        let recorded = self.record_blocks(engine, model, store, Lane::FIRST, false, done)?;
        let placed = match recorded.last {
            Some(last) => self.place_chain(
                engine,
                recorded.model,
                pod,
                parent,
                &recorded.at,
                last,
                done,
            ),
            None => Ok(()),
        };
        match recorded.refused {
            Some(e) => Err(e),
            None => placed,
        }
    }

    /// Records a copy more of each block of a store in `lane`, each the
    /// child of the one before, in `engine`'s records under `model`, and
    /// lists the blocks that became held when `list_held`.
    /// Refused before its first record (the model then keeps no empty
    /// record set, or names an engine sends would pile up), it returns the
    /// error and nothing is to be placed.
    pub(super) fn record_blocks(
        &self,
        engine: &mut Engine,
        model: &str,
        store: Store<'_>,
        lane: Lane,
        list_held: bool,
        done: &mut Applied,
    ) -> Result<Recorded, EngineError> {
        let Store {
            parent,
            hashes,
            tokens,
            seeds,
            alias,
        } = store;
        let (spec, ratio) = (engine.spec, engine.ratio);
        let seeds_per = ratio.seeds_per_block();
        let max_records = self.sh.cfg.max_engine_blocks;
        let max_own = self.sh.cfg.max_engine_blocks_per_pod;
        let own = engine.blocks() as u64;
        let models = &mut engine.models;
        let i = match models.get_index_of(model) {
            Some(i) => i,
            None => models.insert_full(model.into(), Records::default()).0,
        };
        let records = &mut models[i];
        let per = spec.engine_block as usize;
        let mut newly_held = false;
        let mut up = parent;
        // The position of `up`'s record, for the alias seed its child
        // inherits.
        let mut up_at = match (alias, parent) {
            (Alias::Tokens { salted: false, .. }, Some(p)) => records.find(p),
            _ => None,
        };
        // Each hash's record, looked up before anything is recorded, so the
        // new records are counted first and room is taken for exactly them.
        let found: SmallVec<[Option<u32>; 32]> = hashes.iter().map(|&h| records.find(h)).collect();
        let new = found.iter().filter(|at| at.is_none()).count() as u64;
        let mut recorded_at: SmallVec<[u32; 32]> = SmallVec::with_capacity(hashes.len());
        let mut held: SmallVec<[u32; 32]> = SmallVec::new();
        // Room under `max_engine_blocks` for the new records the pod's own
        // bound lets in, taken in one read-modify-write of the shared count
        // (each waits for the stores before it) and no more than can be
        // used, so a pod storing beside this one is never refused room this
        // one leaves unused. What goes unused (a hash the event names twice,
        // a refusal partway) goes back at the end, with the records' bytes.
        let room = self
            .budget()
            .reserve(new.min(max_own.saturating_sub(own)) as usize);
        let (mut added, mut added_bytes) = (0u64, 0usize);
        let recorded: Result<(), EngineError> = 'records: {
            for (k, (&h, toks)) in hashes.iter().zip(tokens.chunks_exact(per)).enumerate() {
                // A hash not recorded before the event may have been by it
                // (named twice): looked up again once the event has added.
                let at = match found[k] {
                    None if added > 0 => records.find(h),
                    at => at,
                };
                let (at, became_held) = match at {
                    Some(at) => (at, records.add_copy_in(lane, at)),
                    None => {
                        let full = EngineError::Full { max: max_records };
                        if own.saturating_add(added) >= max_own {
                            break 'records Err(EngineError::PodFull { max: max_own });
                        }
                        if added == room {
                            break 'records Err(full);
                        }
                        let seeds = match seeds {
                            [] => &[][..],
                            s => &s[k * seeds_per..(k + 1) * seeds_per],
                        };
                        let data = block_data(records, spec, ratio, up, toks, seeds);
                        let first = u32::from(lane == Lane::FIRST);
                        let Some(at) = records.insert(h, up, first, data) else {
                            break 'records Err(full);
                        };
                        if lane != Lane::FIRST {
                            records.add_copy_in(lane, at);
                        }
                        added += 1;
                        added_bytes += records.record_bytes(at);
                        (at, true)
                    }
                };
                if alias != Alias::None {
                    self.name_record(model, records, spec, ratio, at, h, up_at, toks, alias);
                }
                up_at = Some(at);
                recorded_at.push(at);
                done.stored += 1;
                newly_held |= became_held;
                if became_held && list_held {
                    held.push(at);
                }
                up = Some(h);
            }
            Ok(())
        };
        // The records were counted as `room`; what went unused goes back.
        self.budget()
            .count(added_bytes as i64, added as i64 - room as i64);
        if records.len() == 0 {
            models.swap_remove_index(i);
            // Nothing was recorded, so nothing is to be placed.
            recorded?;
            return Ok(Recorded {
                model: i,
                at: SmallVec::new(),
                held: SmallVec::new(),
                last: None,
                refused: None,
            });
        }
        Ok(Recorded {
            model: i,
            at: recorded_at,
            held,
            last: up.filter(|_| newly_held),
            refused: recorded.err(),
        })
    }

    /// Places `pod` on the path of the records at `at` (a store under
    /// `parent`, the last of them `last`) in the tree of the model at
    /// `model`: from the chain cache when the store extends it, else by a
    /// walk to the root. A chain that cannot be placed is counted as an
    /// orphan or too deep.
    #[allow(clippy::too_many_arguments)]
    fn place_chain(
        &self,
        engine: &mut Engine,
        model: usize,
        pod: &str,
        parent: Option<u64>,
        at: &[u32],
        last: u64,
        done: &mut Applied,
    ) -> Result<(), EngineError> {
        let (ratio, align) = (engine.ratio, engine.align());
        let max_key = self.sh.cfg.max_key_blocks;
        let Engine {
            models,
            chain,
            scratch,
            ..
        } = &mut *engine;
        let Some((model, records)) = models.get_index(model) else {
            return Ok(());
        };
        let extended = extend_chain(chain, records, ratio, model, parent, at, max_key);
        let path = if extended {
            Ok(chain.as_ref().map_or(&[][..], |c| &c.ours[..]))
        } else {
            chain_path(chain, scratch, records, ratio, model, last, max_key)
        };
        let key = match path {
            Ok(key) => key,
            Err(why) => {
                why.count(done);
                return Ok(());
            }
        };
        // Pages: our blocks are whole groups, held only while every page of
        // the group is; a path through a group missing a page stops before it.
        let held;
        let key = match ratio {
            Ratio::Whole(_) => key,
            Ratio::Pages(n) => {
                held = held_groups(records, last, n, key.to_vec());
                &held[..]
            }
        };
        if key.is_empty() {
            return Ok(());
        }
        self.insert_at(model, key, pod, align, PINNED)
            .map_err(EngineError::Insert)
    }
}

/// Our side of a new engine block with tokens `toks` under `up` and
/// identity `seeds` (none, or one per block of ours or per page): our hash
/// of each of our blocks in it, or, for a page, its tokens, depth and seed
/// (and the hash of the group it closes).
fn block_data(
    records: &Records,
    spec: EngineSpec,
    ratio: Ratio,
    up: Option<u64>,
    toks: &[u32],
    seeds: &[u64],
) -> Data {
    let seed = |i: usize| seeds.get(i).copied().unwrap_or(0);
    match ratio {
        Ratio::Whole(1) => Data::One((spec.hash)(toks, seed(0))),
        Ratio::Whole(_) => Data::whole(
            toks.chunks_exact(spec.our_block as usize)
                .enumerate()
                .map(|(i, block)| (spec.hash)(block, seed(i)))
                .collect(),
        ),
        Ratio::Pages(n) => {
            let depth = match up.and_then(|p| records.find(p)) {
                Some(at) => match records.data(at) {
                    DataRef::Page(p) => p.depth.saturating_add(1),
                    _ => 0,
                },
                None => 0,
            };
            let group = (depth % n == n - 1)
                .then(|| group_hash(records, up, toks, seed(0), n, spec))
                .flatten();
            Data::Extra(Extra::Page(Page {
                depth,
                tokens: toks.into(),
                group,
                seed: seed(0),
            }))
        }
    }
}
