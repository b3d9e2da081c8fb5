//! Reading a snapshot: every record checked before anything is applied
//! ([`Snapshot::parse`]), then replayed into an index
//! ([`Snapshot::restore`]). The engines' records are read and restored by
//! `engines.rs`.

use super::engines::{EngineSnap, Engines};
use super::{config, Record, RestoreSummary, SnapshotError, COVERED, MAGIC, ROOT, VERSION};
use crate::precise::groups::HIDDEN_MARK;
use crate::sets::MAX_SETS;
use crate::Index;

/// One node as read: (parent, edge, entries as (pod ref, time)).
type NodeRecord = (u32, Vec<u64>, Vec<(u32, u64)>);

/// A model's nodes as read.
#[derive(Debug)]
struct ModelNodes {
    name: String,
    /// In pre-order.
    nodes: Vec<NodeRecord>,
}

/// A parsed, fully validated snapshot, ready to restore.
#[derive(Debug)]
pub struct Snapshot {
    /// When it was written (ms, the writer's clock).
    pub written_at: u64,
    default_capacity: u64,
    pub(super) pods: Vec<(String, u64)>,
    models: Vec<ModelNodes>,
    pub(super) engines: Vec<EngineSnap>,
    /// Pods' sets: (model, pod, set, hashes).
    sets: Vec<(String, String, u32, Vec<u64>)>,
}

/// The records of a snapshot's body, one at a time.
struct Records<'b> {
    body: &'b [u8],
    at: usize,
}

impl Records<'_> {
    fn next(&mut self) -> Result<Option<Record<'static>>, SnapshotError> {
        if self.at == self.body.len() {
            return Ok(None);
        }
        let (r, n) = bincode::decode_from_slice(&self.body[self.at..], config()).map_err(|e| {
            SnapshotError::Decode {
                offset: self.at,
                reason: e.to_string(),
            }
        })?;
        self.at += n;
        Ok(Some(r))
    }
}

/// A snapshot being read, and what its next records are checked against.
struct Reading {
    snap: Snapshot,
    engines: Engines,
    /// Parents still open on the pre-order path of the current model.
    path: Vec<u32>,
}

impl Reading {
    /// A record of the pods, the trees or the pods' sets.
    fn tree(&mut self, record: Record<'static>) -> Result<(), SnapshotError> {
        let snap = &mut self.snap;
        match record {
            Record::Pod { name, capacity } => {
                if !snap.models.is_empty() {
                    return Err(SnapshotError::Invalid("pod after the first model"));
                }
                if snap.pods.len() >= COVERED as usize {
                    return Err(SnapshotError::Invalid("too many pods"));
                }
                snap.pods.push((name.into_owned(), capacity));
            }
            Record::Model { name } => {
                if !snap.engines.is_empty() {
                    return Err(SnapshotError::Invalid("model after the first engine"));
                }
                self.path.clear();
                snap.models.push(ModelNodes {
                    name: name.into_owned(),
                    nodes: Vec::new(),
                });
            }
            Record::Node {
                parent,
                edge,
                entries,
            } => {
                let Some(model) = snap.models.last_mut() else {
                    return Err(SnapshotError::Invalid("node before any model"));
                };
                let (edge, entries) = (edge.into_owned(), entries.into_owned());
                if edge.is_empty() {
                    return Err(SnapshotError::Invalid("node with an empty edge"));
                }
                if entries.iter().any(|&(p, _)| p as usize >= snap.pods.len()) {
                    return Err(SnapshotError::Invalid("entry names an unknown pod"));
                }
                let path = &mut self.path;
                if parent != ROOT {
                    while path.last().is_some_and(|&p| p != parent) {
                        path.pop();
                    }
                    if path.is_empty() {
                        return Err(SnapshotError::Invalid("nodes not in pre-order"));
                    }
                } else {
                    path.clear();
                }
                let index = match u32::try_from(model.nodes.len()) {
                    Ok(i) if i != ROOT => i,
                    _ => return Err(SnapshotError::Invalid("too many nodes in a model")),
                };
                path.push(index);
                model.nodes.push((parent, edge, entries));
            }
            Record::SetBlocks {
                model,
                pod,
                set,
                hashes,
            } => {
                if !self.engines.counted() {
                    return Err(SnapshotError::Invalid("set blocks before the engine count"));
                }
                let pod = pod.into_owned();
                if set >= MAX_SETS || pod.contains(HIDDEN_MARK) {
                    return Err(SnapshotError::Invalid("a set out of range"));
                }
                snap.sets
                    .push((model.into_owned(), pod, set, hashes.into_owned()));
            }
            _ => return Err(SnapshotError::Invalid("a record out of place")),
        }
        Ok(())
    }
}

impl Snapshot {
    /// Checks and decodes a whole snapshot. Never panics and never allocates
    /// more than the input justifies: every failure is a [`SnapshotError`].
    pub fn parse(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
        if bytes.len() < MAGIC.len() + 8 {
            return Err(SnapshotError::Truncated { len: bytes.len() });
        }
        if bytes[..MAGIC.len()] != MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        let mut digest = [0; 8];
        digest.copy_from_slice(sum);
        if xxhash_rust::xxh3::xxh3_64(body) != u64::from_le_bytes(digest) {
            return Err(SnapshotError::Checksum);
        }
        let mut records = Records {
            body,
            at: MAGIC.len(),
        };
        let Some(Record::Header {
            version,
            written_at,
            default_capacity,
        }) = records.next()?
        else {
            return Err(SnapshotError::Invalid("no header"));
        };
        if version != VERSION && version != 1 {
            return Err(SnapshotError::Version { found: version });
        }
        let mut reading = Reading {
            snap: Snapshot {
                written_at,
                default_capacity,
                pods: Vec::new(),
                models: Vec::new(),
                engines: Vec::new(),
                sets: Vec::new(),
            },
            engines: Engines::default(),
            path: Vec::new(),
        };
        loop {
            match records.next()? {
                None => return Err(SnapshotError::Invalid("no end record")),
                Some(Record::Header { .. }) => return Err(SnapshotError::Invalid("two headers")),
                Some(Record::End {
                    pods,
                    models,
                    nodes,
                }) => {
                    let snap = reading.snap;
                    let total: usize = snap.models.iter().map(|m| m.nodes.len()).sum();
                    if records.at != body.len() {
                        return Err(SnapshotError::Invalid("data after the end record"));
                    }
                    if pods as usize != snap.pods.len()
                        || models as usize != snap.models.len()
                        || nodes != total as u64
                    {
                        return Err(SnapshotError::Invalid("end record counts differ"));
                    }
                    if version >= 2 && !reading.engines.counted() {
                        return Err(SnapshotError::Invalid("no engine count"));
                    }
                    return Ok(snap);
                }
                Some(
                    record @ (Record::Pod { .. }
                    | Record::Model { .. }
                    | Record::Node { .. }
                    | Record::SetBlocks { .. }),
                ) => reading.tree(record)?,
                Some(record) => reading.engines.read(record, &mut reading.snap.engines)?,
            }
        }
    }

    /// Models in the snapshot.
    pub fn models(&self) -> usize {
        self.models.len()
    }

    /// Replays the snapshot into `index` (normally empty) at time `now` (ms):
    /// pods and their capacities first, then one insert per entry that no
    /// child entry covers, at the entry's own time. Entries expired by `now`
    /// are skipped. Limits of `index` apply; what it refuses is counted.
    pub fn restore(mut self, index: &Index, now: u64) -> RestoreSummary {
        let mut sum = RestoreSummary {
            pods: self.pods.len() as u64,
            ..RestoreSummary::default()
        };
        let ttl = index.sh.ttl_ms;
        for (name, capacity) in &self.pods {
            let explicit = *capacity != self.default_capacity;
            // Pods with the default capacity are created by their first insert
            // and take today's default; only explicit capacities are restored.
            if explicit && index.set_pod_capacity(name, *capacity).is_err() {
                sum.refused += 1;
            }
        }
        let engines = EngineSnap::register(std::mem::take(&mut self.engines), index, &mut sum);
        for model in &mut self.models {
            // Mark entries that a child repeats with the same time: the child's
            // insert refreshes the parent to that time, so one insert per chain.
            // If the index refuses that child's insert (its limits shrank), the
            // parent's prefix is still recorded: inserts write top-down, so
            // a refusal comes after the shorter prefixes are in.
            for node in &mut model.nodes {
                node.2.sort_unstable();
            }
            for i in 0..model.nodes.len() {
                let parent = model.nodes[i].0;
                if parent == ROOT {
                    continue;
                }
                let (before, after) = model.nodes.split_at_mut(i);
                let up = &mut before[parent as usize].2;
                for &(pod, time) in &after[0].2 {
                    // Sorted by pod ref (the COVERED bit is above every ref).
                    if let Ok(j) = up.binary_search_by_key(&pod, |e| e.0 & !COVERED) {
                        if up[j].1 == time {
                            up[j].0 |= COVERED;
                        }
                    }
                }
            }
            // Rebuild keys with one stack: (node index, key length after it).
            let mut key: Vec<u64> = Vec::new();
            let mut open: Vec<(u32, usize)> = Vec::new();
            for (i, (parent, edge, entries)) in model.nodes.iter().enumerate() {
                while open.last().is_some_and(|&(n, _)| n != *parent) {
                    open.pop();
                }
                key.truncate(open.last().map_or(0, |&(_, len)| len));
                key.extend_from_slice(edge);
                open.push((i as u32, key.len()));
                for &(pod, time) in entries {
                    if pod & COVERED != 0 {
                        continue;
                    }
                    if now.saturating_sub(time) > ttl {
                        sum.expired += 1;
                        continue;
                    }
                    let name = &self.pods[pod as usize].0;
                    match index.insert(&model.name, &key, name, time.min(now)) {
                        Ok(()) => sum.inserts += 1,
                        Err(_) => sum.refused += 1,
                    }
                }
            }
        }
        EngineSnap::restore(engines, index, &mut sum);
        for (model, pod, set, hashes) in &self.sets {
            match index.set_hold(model, pod, *set, hashes) {
                Ok(()) => sum.set_blocks += hashes.len() as u64,
                Err(_) => sum.refused += 1,
            }
        }
        sum
    }
}
