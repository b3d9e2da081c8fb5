//! Engine-fed pods in a snapshot: written as their engine records (not as
//! tree entries), read back and checked, and restored after the trees so
//! that the records rebuild those pods' entries. Everything of precise mode
//! that a snapshot holds is here.

use std::collections::HashSet;
use std::io::{self, Write};

use super::write::Hashing;
use super::{BlockData, KindData, Record, RestoreSummary, SnapshotError, Stored, WriteSummary};
use crate::precise::groups::GroupKind;
use crate::precise::{
    Data, DataRef, EngineOp, EngineSpec, Extra, Lane, Page, Record as EngineRecord,
};
use crate::{EngineHandle, Index};

impl Index {
    /// Writes every engine's records, by pod then model; returns how many
    /// engines there were.
    pub(super) fn write_engines(
        &self,
        w: &mut Hashing<impl Write>,
        sum: &mut WriteSummary,
    ) -> io::Result<u32> {
        let mut engines = 0u32;
        for (pod, engine) in self.engines() {
            let engine = engine.lock();
            w.record(&Record::Engine {
                pod: Stored::of(&pod),
                engine_block: engine.spec.engine_block,
                our_block: engine.spec.our_block,
                last_batch: engine.last_batch(),
            })?;
            engines += 1;
            if engine.ruled() {
                let groups: Vec<(u32, KindData)> = engine
                    .groups
                    .iter()
                    .enumerate()
                    .filter_map(|(i, k)| Some((i as u32, KindData::from((*k)?))))
                    .collect();
                w.record(&Record::EngineGroups {
                    groups: Stored::of(&groups),
                })?;
            }
            let mut models: Vec<_> = engine.models.iter().collect();
            models.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (name, records) in models {
                w.record(&Record::EngineModel {
                    name: Stored::of(name),
                })?;
                for at in records.positions() {
                    let data = match records.data(at) {
                        DataRef::One(h) => BlockData::Whole(vec![h]),
                        DataRef::Many(hs) => BlockData::Whole(hs.to_vec()),
                        DataRef::Page(p) if p.seed == 0 => BlockData::Page {
                            depth: p.depth,
                            tokens: p.tokens.to_vec(),
                            group: p.group,
                        },
                        DataRef::Page(p) => BlockData::SeededPage {
                            depth: p.depth,
                            tokens: p.tokens.to_vec(),
                            group: p.group,
                            seed: p.seed,
                        },
                    };
                    w.record(&Record::Block {
                        hash: records.hash(at),
                        parent: records.parent_hash(at),
                        copies: records.copies(at),
                        data: Stored::of(&data),
                    })?;
                    sum.engine_blocks += 1;
                }
                let mut lanes: Vec<(u32, Vec<(u64, u32)>)> = Vec::new();
                for (Lane(group), at, copies) in records.lane_copies() {
                    match lanes.iter_mut().find(|l| l.0 == group) {
                        Some(l) => l.1.push((records.hash(at), copies)),
                        None => lanes.push((group, vec![(records.hash(at), copies)])),
                    }
                }
                lanes.sort_unstable_by_key(|l| l.0);
                for (group, blocks) in &lanes {
                    w.record(&Record::GroupCopies {
                        group: *group,
                        blocks: Stored::of(blocks),
                    })?;
                }
                let named: Vec<(u64, u64, u64)> = records
                    .aliased()
                    .map(|(at, name, _)| {
                        let seed = records.alias_seed(at).unwrap_or(0);
                        (records.hash(at), name, seed)
                    })
                    .collect();
                if !named.is_empty() {
                    w.record(&Record::BlockAliases {
                        blocks: Stored::of(&named),
                    })?;
                }
            }
        }
        Ok(engines)
    }
}

/// One engine as read: its pod, block sizes, and records per model.
#[derive(Debug)]
pub(super) struct EngineSnap {
    pod: String,
    engine_block: u32,
    our_block: u32,
    last_batch: Option<(u64, u64)>,
    /// Its KV-cache groups' kinds, by index (a hybrid model's).
    groups: Vec<(u32, GroupKind)>,
    models: Vec<EngineModelSnap>,
}

/// One model of an engine as read: its records, and the copies of its
/// groups after the first.
#[derive(Debug)]
struct EngineModelSnap {
    name: String,
    blocks: Vec<(u64, EngineRecord)>,
    lanes: Vec<(u32, Vec<(u64, u32)>)>,
    /// Named blocks: (engine hash, alias, inherited alias seed or 0).
    aliases: Vec<(u64, u64, u64)>,
}

/// What the engine records read so far are checked against.
#[derive(Default)]
pub(super) struct Engines {
    /// The engine count record's (engines, blocks), once read.
    total: Option<(u32, u64)>,
    /// The engine-fed pods read, each once.
    pods: HashSet<String>,
}

impl Engines {
    /// Whether the engine count has been read (what ends the engines).
    pub(super) fn counted(&self) -> bool {
        self.total.is_some()
    }

    /// Reads one engine record into `engines`.
    pub(super) fn read(
        &mut self,
        record: Record<'static>,
        engines: &mut Vec<EngineSnap>,
    ) -> Result<(), SnapshotError> {
        match record {
            Record::Engine {
                pod,
                engine_block,
                our_block,
                last_batch,
            } => {
                if self.total.is_some() {
                    return Err(SnapshotError::Invalid("engine after the engine count"));
                }
                let pod = pod.into_owned();
                if !self.pods.insert(pod.clone()) {
                    return Err(SnapshotError::Invalid("an engine-fed pod twice"));
                }
                engines.push(EngineSnap {
                    pod,
                    engine_block,
                    our_block,
                    last_batch,
                    groups: Vec::new(),
                    models: Vec::new(),
                });
            }
            Record::EngineGroups { groups } => {
                let Some(engine) = engines.last_mut() else {
                    return Err(SnapshotError::Invalid("engine groups before any engine"));
                };
                if !engine.models.is_empty() || !engine.groups.is_empty() {
                    return Err(SnapshotError::Invalid("engine groups out of place"));
                }
                let groups = groups.into_owned().into_iter();
                engine.groups = groups.map(|(i, k)| (i, k.into())).collect();
            }
            Record::GroupCopies { group, blocks } => {
                let model = last_model(engines, "group copies before any engine model")?;
                if group == 0 {
                    return Err(SnapshotError::Invalid("group copies of the first group"));
                }
                if !model.aliases.is_empty() {
                    return Err(SnapshotError::Invalid("group copies after block aliases"));
                }
                model.lanes.push((group, blocks.into_owned()));
            }
            Record::BlockAliases { blocks } => {
                let model = last_model(engines, "block aliases before any engine model")?;
                if !model.aliases.is_empty() {
                    return Err(SnapshotError::Invalid("two block aliases of one model"));
                }
                model.aliases = blocks.into_owned();
            }
            Record::EngineModel { name } => {
                let Some(engine) = engines.last_mut() else {
                    return Err(SnapshotError::Invalid("engine model before any engine"));
                };
                engine.models.push(EngineModelSnap {
                    name: name.into_owned(),
                    blocks: Vec::new(),
                    lanes: Vec::new(),
                    aliases: Vec::new(),
                });
            }
            Record::Block {
                hash,
                parent,
                copies,
                data,
            } => {
                let model = last_model(engines, "engine block before any engine model")?;
                let data = match data.into_owned() {
                    BlockData::Whole(ours) if !ours.is_empty() => Data::whole(ours),
                    BlockData::Whole(_) => {
                        return Err(SnapshotError::Invalid("engine block without hashes"))
                    }
                    BlockData::Page {
                        depth,
                        tokens,
                        group,
                    } => Data::Extra(Extra::Page(Page {
                        depth,
                        tokens: tokens.into(),
                        group,
                        seed: 0,
                    })),
                    BlockData::SeededPage {
                        depth,
                        tokens,
                        group,
                        seed,
                    } => Data::Extra(Extra::Page(Page {
                        depth,
                        tokens: tokens.into(),
                        group,
                        seed,
                    })),
                };
                if !model.lanes.is_empty() || !model.aliases.is_empty() {
                    return Err(SnapshotError::Invalid(
                        "engine block after group copies or aliases",
                    ));
                }
                model
                    .blocks
                    .push((hash, EngineRecord::new(parent, copies, data)));
            }
            Record::Engines {
                engines: count,
                blocks,
            } => {
                if self.total.replace((count, blocks)).is_some() {
                    return Err(SnapshotError::Invalid("two engine counts"));
                }
                let total: usize = engines
                    .iter()
                    .flat_map(|e| e.models.iter())
                    .map(|m| m.blocks.len())
                    .sum();
                if count as usize != engines.len() || blocks != total as u64 {
                    return Err(SnapshotError::Invalid("engine counts differ"));
                }
            }
            _ => return Err(SnapshotError::Invalid("a record out of place")),
        }
        Ok(())
    }
}

/// The model of the last engine read, which a record names `what` needs.
fn last_model<'e>(
    engines: &'e mut [EngineSnap],
    what: &'static str,
) -> Result<&'e mut EngineModelSnap, SnapshotError> {
    engines
        .last_mut()
        .and_then(|e| e.models.last_mut())
        .ok_or(SnapshotError::Invalid(what))
}

impl EngineSnap {
    /// Registers each engine's pod with `index` (before the trees are
    /// restored, so that their inserts see which pods are engine-fed);
    /// what the index refuses is counted and dropped.
    pub(super) fn register(
        engines: Vec<EngineSnap>,
        index: &Index,
        sum: &mut RestoreSummary,
    ) -> Vec<(EngineSnap, EngineHandle)> {
        engines
            .into_iter()
            .filter_map(|e| {
                let spec = EngineSpec {
                    engine_block: e.engine_block,
                    our_block: e.our_block,
                    // The subscription that registers the pod again brings
                    // the gateways' rule (`Index::engine`).
                    hash: crate::precise::unset_hash,
                };
                match index.engine(&e.pod, spec) {
                    Ok(handle) => Some((e, handle)),
                    Err(_) => {
                        sum.refused += 1;
                        None
                    }
                }
            })
            .collect()
    }

    /// Restores the registered engines' records.
    pub(super) fn restore(
        engines: Vec<(EngineSnap, EngineHandle)>,
        index: &Index,
        sum: &mut RestoreSummary,
    ) {
        for (snap, handle) in engines {
            let mut engine = handle.lock();
            engine.set_last_batch(snap.last_batch);
            let before = engine.blocks();
            let groups = index.restore_groups(&mut engine, &snap.pod, &snap.groups);
            let refused = groups.is_err()
                || snap.models.into_iter().any(|m| {
                    index
                        .restore_engine(&mut engine, &snap.pod, &m.name, m.blocks)
                        .and_then(|()| {
                            index.restore_lanes(&mut engine, &snap.pod, &m.name, m.lanes)
                        })
                        .and_then(|()| index.restore_aliases(&mut engine, &m.name, &m.aliases))
                        .is_err()
                });
            if refused {
                // Part of the pod's records is not the state its last
                // batch left: the pod is cleared and learnt again from its
                // engine, as after a gap that cannot be replayed (with no
                // batch applied, its subscription asks for the engine's
                // whole replay buffer).
                sum.refused += 1;
                let _ = index.apply(&mut engine, &snap.pod, "", EngineOp::Cleared);
                engine.set_last_batch(None);
            } else {
                sum.engine_blocks += engine.blocks().saturating_sub(before) as u64;
            }
        }
    }
}
