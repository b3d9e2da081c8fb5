//! Snapshots: the index's content written to bytes and read back, so a
//! restarted server answers as before.
//!
//! A snapshot is **logical**: live pods (with capacities that differ from the
//! default) and, per model, the tree's nodes in pre-order with their visible
//! `(pod, last used)` entries. Restoring replays them as inserts at their own
//! times, so the restored tree is rebuilt by the same code (and keeps the same
//! invariants) as a live one, and entry ages survive: an entry that had 10 s of
//! TTL left when written has 10 s left minus the downtime when read.
//!
//! Writing walks the trees under one pin while writers go on, so a
//! snapshot is *fuzzy*: an insert concurrent with it may or may not be in it,
//! like with any online dump. Nothing is locked; readers are not disturbed.
//! The pin is held for the whole write, so memory retired meanwhile is
//! freed only after it (a full default index takes about 2 s).
//!
//! Engine-fed pods (see the `engine` module) are written as their engine
//! records, not as tree entries: restoring rebuilds their entries from the
//! records (the held blocks' paths, less the blocks removed under held
//! ones), so engine events that arrive after a restart find their parents.
//! Their speculative entries (seconds long) are not kept.
//!
//! # Format (version 2; version 1, without engines, is read too)
//!
//! ```text
//! magic "PFXSNAP\0" | bincode records ... | xxh3-64 of everything before, u64 LE
//! records: Header { version, written_at, default_capacity }
//!          Pod { name, capacity }*                 (pod refs are their order)
//!          ( Model { name }  Node { parent, edge, entries }* )*
//!          ( Engine { pod, engine_block, our_block, last_batch }
//!            EngineGroups { groups }?
//!            ( EngineModel { name }  Block { hash, parent, copies, data }*
//!              GroupCopies { group, blocks }*  BlockAliases { blocks }? )* )*
//!          (a Block's data: our hashes, a page, or a page with an identity seed)
//!          Engines { engines, blocks }             (version 2)
//!          SetBlocks { model, pod, set, hashes }*
//!          End { pods, models, nodes }
//! ```
//!
//! `EngineGroups` (each KV-cache group's index and kind) and `GroupCopies`
//! (the blocks a group after the first holds, by engine hash, with their
//! copies) are written only for hybrid models' pods (`crate::groups`), and
//! `BlockAliases` (each named block's engine hash, its name in another
//! indexer's hashes and the alias seed its children inherit, 0 for none:
//! `crate::aliases`) only for engines whose blocks are named so, so
//! snapshots without them read in servers that predate them. `SetBlocks`
//! (the hashes one set of a pod holds under one model: `crate::sets`) is
//! written only for pods with sets, for the same reason.
//!
//! `Node::parent` is the index of the parent among the model's nodes (or
//! `ROOT`), and nodes come in pre-order, so a reader rebuilds each node's key
//! with one path stack. [`Snapshot::parse`] checks everything (checksum, magic,
//! version, references, the pre-order, the end counts) before anything is
//! applied, so a damaged file is refused whole, never half restored.

use std::collections::BTreeMap;
use std::io::{self, Write};

use bincode::{Decode, Encode};
use thiserror::Error;
use xxhash_rust::xxh3::Xxh3;

use crate::engine::{
    Data, DataRef, EngineOp, EngineSpec, Extra, Lane, Page, Record as EngineRecord,
};
use crate::groups::{GroupKind, HIDDEN_MARK};
use crate::pods::PodId;
use crate::sets::{split_set, MAX_SETS};
use crate::walk::Walk;
use crate::Index;

/// The first eight bytes of every snapshot.
pub const MAGIC: [u8; 8] = *b"PFXSNAP\0";
/// The format version this crate writes and reads.
pub const VERSION: u32 = 2;
/// `Node::parent` of a child of the root.
const ROOT: u32 = u32::MAX;
/// Marks an entry covered by a child's entry with the same time (restore
/// skips it: the child's insert refreshes it). Pod refs stay below 2^31.
const COVERED: u32 = 1 << 31;
/// Largest single record read back: bounds what a corrupt length can allocate.
const RECORD_LIMIT: usize = 64 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<RECORD_LIMIT>()
}

/// One record, as read.
#[derive(Debug, Encode, Decode)]
enum Record {
    Header {
        version: u32,
        written_at: u64,
        default_capacity: u64,
    },
    Pod {
        name: String,
        capacity: u64,
    },
    Model {
        name: String,
    },
    Node {
        parent: u32,
        edge: Vec<u64>,
        entries: Vec<(u32, u64)>,
    },
    End {
        pods: u32,
        models: u32,
        nodes: u64,
    },
    Engine {
        pod: String,
        engine_block: u32,
        our_block: u32,
        last_batch: Option<(u64, u64)>,
    },
    EngineModel {
        name: String,
    },
    Block {
        hash: u64,
        parent: Option<u64>,
        copies: u32,
        data: BlockData,
    },
    Engines {
        engines: u32,
        blocks: u64,
    },
    EngineGroups {
        groups: Vec<(u32, KindData)>,
    },
    GroupCopies {
        group: u32,
        blocks: Vec<(u64, u32)>,
    },
    BlockAliases {
        blocks: Vec<(u64, u64, u64)>,
    },
    SetBlocks {
        model: String,
        pod: String,
        set: u32,
        hashes: Vec<u64>,
    },
}

/// A KV-cache group's kind ([`GroupKind`]), as written.
#[derive(Debug, Clone, Copy, Encode, Decode)]
enum KindData {
    Full,
    Window(u32),
    Mamba,
    Unmodelled,
}

impl From<GroupKind> for KindData {
    fn from(k: GroupKind) -> Self {
        match k {
            GroupKind::Full => KindData::Full,
            GroupKind::Window(w) => KindData::Window(w),
            GroupKind::Mamba => KindData::Mamba,
            GroupKind::Unmodelled => KindData::Unmodelled,
        }
    }
}

impl From<KindData> for GroupKind {
    fn from(k: KindData) -> Self {
        match k {
            KindData::Full => GroupKind::Full,
            KindData::Window(w) => GroupKind::Window(w),
            KindData::Mamba => GroupKind::Mamba,
            KindData::Unmodelled => GroupKind::Unmodelled,
        }
    }
}

/// An engine record's own data (`engine::Data`), as written.
#[derive(Debug, Clone, Encode, Decode)]
enum BlockData {
    Whole(Vec<u64>),
    /// A plain page (identity seed 0).
    Page {
        depth: u32,
        tokens: Vec<u32>,
        group: Option<u64>,
    },
    /// A page with an identity seed: written only for such pages, so a
    /// snapshot without them reads in servers that predate seeds.
    SeededPage {
        depth: u32,
        tokens: Vec<u32>,
        group: Option<u64>,
        seed: u64,
    },
}

/// One record, as written (borrowed; the same encoding as [`Record`]).
#[derive(Clone, Copy, Encode)]
enum RecordRef<'a> {
    Header {
        version: u32,
        written_at: u64,
        default_capacity: u64,
    },
    Pod {
        name: &'a str,
        capacity: u64,
    },
    Model {
        name: &'a str,
    },
    Node {
        parent: u32,
        edge: &'a [u64],
        entries: &'a [(u32, u64)],
    },
    End {
        pods: u32,
        models: u32,
        nodes: u64,
    },
    Engine {
        pod: &'a str,
        engine_block: u32,
        our_block: u32,
        last_batch: Option<(u64, u64)>,
    },
    EngineModel {
        name: &'a str,
    },
    Block {
        hash: u64,
        parent: Option<u64>,
        copies: u32,
        data: &'a BlockData,
    },
    Engines {
        engines: u32,
        blocks: u64,
    },
    EngineGroups {
        groups: &'a [(u32, KindData)],
    },
    GroupCopies {
        group: u32,
        blocks: &'a [(u64, u32)],
    },
    BlockAliases {
        blocks: &'a [(u64, u64, u64)],
    },
    SetBlocks {
        model: &'a str,
        pod: &'a str,
        set: u32,
        hashes: &'a [u64],
    },
}

/// Why bytes are not a snapshot this version can restore.
#[derive(Debug, Error)]
pub enum SnapshotError {
    /// Shorter than magic and checksum.
    #[error("snapshot truncated: {len} bytes")]
    Truncated {
        /// Bytes present.
        len: usize,
    },
    /// The first bytes are not [`MAGIC`].
    #[error("not a prefix-index snapshot (bad magic)")]
    BadMagic,
    /// The checksum does not match the content.
    #[error("snapshot checksum mismatch (file damaged or truncated)")]
    Checksum,
    /// Written by another format version.
    #[error("snapshot format version {found} (this build reads {VERSION})")]
    Version {
        /// The version in the file.
        found: u32,
    },
    /// A record could not be decoded.
    #[error("snapshot record at byte {offset} cannot be decoded: {reason}")]
    Decode {
        /// Where the record starts.
        offset: usize,
        /// The decoder's message.
        reason: String,
    },
    /// The records decode but do not form a snapshot.
    #[error("snapshot is inconsistent: {0}")]
    Invalid(&'static str),
}

/// What a write produced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteSummary {
    /// Live pods written.
    pub pods: u64,
    /// Models written.
    pub models: u64,
    /// Nodes written.
    pub nodes: u64,
    /// `(pod, node)` entries written.
    pub entries: u64,
    /// Engine block records written.
    pub engine_blocks: u64,
    /// Bytes written.
    pub bytes: u64,
}

/// What a restore did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreSummary {
    /// Pods in the snapshot.
    pub pods: u64,
    /// Inserts replayed.
    pub inserts: u64,
    /// Entries not restored because their TTL had passed by `now`.
    pub expired: u64,
    /// Inserts or pods the index refused (its limits are now lower than when
    /// the snapshot was written, e.g. `max_blocks` or `max_pods`).
    pub refused: u64,
    /// Engine block records restored.
    pub engine_blocks: u64,
    /// Blocks of pods' sets restored (`Index::set_hold`).
    pub set_blocks: u64,
}

/// Feeds everything written into a hash on its way out.
struct Hashing<W> {
    inner: W,
    hash: Xxh3,
    bytes: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.bytes += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

impl<W: Write> Hashing<W> {
    fn record(&mut self, r: &RecordRef<'_>) -> io::Result<()> {
        bincode::encode_into_std_write(r, self, bincode::config::standard())
            .map(drop)
            .map_err(io::Error::other)
    }
}

impl Index {
    /// Writes a snapshot of everything visible at `now` (ms) to `out` (give it
    /// a buffered writer). Runs beside readers and writers without stopping
    /// them; entries expired at `now` and removed pods are left out.
    pub fn write_snapshot(&self, out: impl Write, now: u64) -> io::Result<WriteSummary> {
        let mut w = Hashing {
            inner: out,
            hash: Xxh3::new(),
            bytes: 0,
        };
        let mut sum = WriteSummary::default();
        w.write_all(&MAGIC)?;
        let sh = &self.sh;
        w.record(&RecordRef::Header {
            version: VERSION,
            written_at: now,
            default_capacity: sh.pods.default_capacity(),
        })?;
        let pin = self.pin();
        // Pod id → its position in the pod list (u32::MAX: not written).
        let mut refs: Vec<u32> = Vec::new();
        let mut pods: Vec<(&str, u32)> = sh.pods.live(&pin).collect();
        pods.sort_unstable();
        for &(name, id) in &pods {
            let id = id as usize;
            if refs.len() <= id {
                refs.resize(id + 1, u32::MAX);
            }
            refs[id] = sum.pods as u32;
            w.record(&RecordRef::Pod {
                name,
                capacity: sh.pods.capacity(id as u32),
            })?;
            sum.pods += 1;
        }
        let mut models: Vec<_> = self.models(&pin).iter().collect();
        models.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let mut entries = Vec::new();
        for (name, tree) in models {
            w.record(&RecordRef::Model { name })?;
            sum.models += 1;
            let mut written = 0u32;
            // Pre-order; each level carries its node's index in this model's
            // list (the root's is ROOT), the parent index of its children.
            let mut walk = Walk::new(tree.root(&pin), ROOT);
            loop {
                let Some(node) = walk.next_child() else {
                    if walk.leave().is_none() {
                        break;
                    }
                    continue;
                };
                entries.clear();
                for (pod, time) in node.pods.entries() {
                    // Engine-fed pods are written as their engine records.
                    let visible = now.saturating_sub(time) <= sh.ttl_ms
                        && sh.pods.is_live(pod)
                        && !sh.pods.is_precise(pod);
                    match refs.get(pod as usize) {
                        Some(&r) if visible && r != u32::MAX => entries.push((r, time)),
                        _ => {}
                    }
                }
                // pods(parent) ⊇ pods(child): nothing visible here, nothing below.
                if entries.is_empty() {
                    continue;
                }
                let parent = *walk.data();
                w.record(&RecordRef::Node {
                    parent,
                    edge: &node.edge,
                    entries: &entries,
                })?;
                sum.entries += entries.len() as u64;
                walk.enter(node, written);
                written += 1;
            }
            sum.nodes += u64::from(written);
        }
        drop(pin);
        let mut engines = 0u32;
        for (pod, engine) in self.engines() {
            let engine = engine.lock();
            w.record(&RecordRef::Engine {
                pod: &pod,
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
                w.record(&RecordRef::EngineGroups { groups: &groups })?;
            }
            let mut models: Vec<_> = engine.models.iter().collect();
            models.sort_unstable_by(|a, b| a.0.cmp(b.0));
            for (name, records) in models {
                w.record(&RecordRef::EngineModel { name })?;
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
                    w.record(&RecordRef::Block {
                        hash: records.hash(at),
                        parent: records.parent_hash(at),
                        copies: records.copies(at),
                        data: &data,
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
                    w.record(&RecordRef::GroupCopies {
                        group: *group,
                        blocks,
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
                    w.record(&RecordRef::BlockAliases { blocks: &named })?;
                }
            }
        }
        w.record(&RecordRef::Engines {
            engines,
            blocks: sum.engine_blocks,
        })?;
        self.write_sets(&mut w)?;
        w.record(&RecordRef::End {
            pods: sum.pods as u32,
            models: sum.models as u32,
            nodes: sum.nodes,
        })?;
        let digest = w.hash.digest();
        w.inner.write_all(&digest.to_le_bytes())?;
        w.inner.flush()?;
        sum.bytes = w.bytes + 8;
        Ok(sum)
    }
}

impl Index {
    /// Writes every pod's sets (`crate::sets`): the hashes each holds at
    /// the root of each model's tree, by model, then pod and set.
    fn write_sets(&self, w: &mut Hashing<impl Write>) -> io::Result<()> {
        let sh = &self.sh;
        let pin = self.pin();
        let mut models: Vec<_> = self.models(&pin).iter().collect();
        models.sort_unstable_by(|a, b| a.0.cmp(b.0));
        for (model, tree) in models {
            let mut sets: BTreeMap<(&str, u32), Vec<u64>> = BTreeMap::new();
            let mut walk = Walk::new(tree.root(&pin), ());
            while let Some(node) = walk.next_child() {
                let Some(&first) = node.edge.first() else {
                    continue;
                };
                node.pods.for_each(|id, _| {
                    if !sh.pods.is_live(id) || !sh.pods.is_hidden(id) {
                        return;
                    }
                    if let Some(held) = sh.pods.name(PodId(id), &pin).and_then(split_set) {
                        sets.entry(held).or_default().push(first);
                    }
                });
            }
            for ((pod, set), hashes) in &sets {
                w.record(&RecordRef::SetBlocks {
                    model,
                    pod,
                    set: *set,
                    hashes,
                })?;
            }
        }
        Ok(())
    }
}

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
    pods: Vec<(String, u64)>,
    models: Vec<ModelNodes>,
    engines: Vec<EngineSnap>,
    /// Pods' sets: (model, pod, set, hashes).
    sets: Vec<(String, String, u32, Vec<u64>)>,
}

/// One engine as read: its pod, block sizes, and records per model.
#[derive(Debug)]
struct EngineSnap {
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
        let mut at = MAGIC.len();
        let mut next = || -> Result<Option<Record>, SnapshotError> {
            if at == body.len() {
                return Ok(None);
            }
            let (r, n) = bincode::decode_from_slice(&body[at..], config()).map_err(|e| {
                SnapshotError::Decode {
                    offset: at,
                    reason: e.to_string(),
                }
            })?;
            at += n;
            Ok(Some(r))
        };
        let Some(Record::Header {
            version,
            written_at,
            default_capacity,
        }) = next()?
        else {
            return Err(SnapshotError::Invalid("no header"));
        };
        if version != VERSION && version != 1 {
            return Err(SnapshotError::Version { found: version });
        }
        let mut snap = Snapshot {
            written_at,
            default_capacity,
            pods: Vec::new(),
            models: Vec::new(),
            engines: Vec::new(),
            sets: Vec::new(),
        };
        let mut engine_total: Option<(u32, u64)> = None;
        let mut engine_pods = std::collections::HashSet::new();
        // Parents still open on the pre-order path of the current model.
        let mut path: Vec<u32> = Vec::new();
        loop {
            match next()? {
                None => return Err(SnapshotError::Invalid("no end record")),
                Some(Record::Header { .. }) => return Err(SnapshotError::Invalid("two headers")),
                Some(Record::Pod { name, capacity }) => {
                    if !snap.models.is_empty() {
                        return Err(SnapshotError::Invalid("pod after the first model"));
                    }
                    if snap.pods.len() >= COVERED as usize {
                        return Err(SnapshotError::Invalid("too many pods"));
                    }
                    snap.pods.push((name, capacity));
                }
                Some(Record::Engine {
                    pod,
                    engine_block,
                    our_block,
                    last_batch,
                }) => {
                    if engine_total.is_some() {
                        return Err(SnapshotError::Invalid("engine after the engine count"));
                    }
                    if !engine_pods.insert(pod.clone()) {
                        return Err(SnapshotError::Invalid("an engine-fed pod twice"));
                    }
                    snap.engines.push(EngineSnap {
                        pod,
                        engine_block,
                        our_block,
                        last_batch,
                        groups: Vec::new(),
                        models: Vec::new(),
                    });
                }
                Some(Record::EngineGroups { groups }) => {
                    let Some(engine) = snap.engines.last_mut() else {
                        return Err(SnapshotError::Invalid("engine groups before any engine"));
                    };
                    if !engine.models.is_empty() || !engine.groups.is_empty() {
                        return Err(SnapshotError::Invalid("engine groups out of place"));
                    }
                    engine.groups = groups.into_iter().map(|(i, k)| (i, k.into())).collect();
                }
                Some(Record::GroupCopies { group, blocks }) => {
                    let Some(model) = snap.engines.last_mut().and_then(|e| e.models.last_mut())
                    else {
                        return Err(SnapshotError::Invalid(
                            "group copies before any engine model",
                        ));
                    };
                    if group == 0 {
                        return Err(SnapshotError::Invalid("group copies of the first group"));
                    }
                    if !model.aliases.is_empty() {
                        return Err(SnapshotError::Invalid("group copies after block aliases"));
                    }
                    model.lanes.push((group, blocks));
                }
                Some(Record::BlockAliases { blocks }) => {
                    let Some(model) = snap.engines.last_mut().and_then(|e| e.models.last_mut())
                    else {
                        return Err(SnapshotError::Invalid(
                            "block aliases before any engine model",
                        ));
                    };
                    if !model.aliases.is_empty() {
                        return Err(SnapshotError::Invalid("two block aliases of one model"));
                    }
                    model.aliases = blocks;
                }
                Some(Record::EngineModel { name }) => {
                    let Some(engine) = snap.engines.last_mut() else {
                        return Err(SnapshotError::Invalid("engine model before any engine"));
                    };
                    engine.models.push(EngineModelSnap {
                        name,
                        blocks: Vec::new(),
                        lanes: Vec::new(),
                        aliases: Vec::new(),
                    });
                }
                Some(Record::Block {
                    hash,
                    parent,
                    copies,
                    data,
                }) => {
                    let Some(EngineModelSnap {
                        blocks,
                        lanes,
                        aliases,
                        ..
                    }) = snap.engines.last_mut().and_then(|e| e.models.last_mut())
                    else {
                        return Err(SnapshotError::Invalid(
                            "engine block before any engine model",
                        ));
                    };
                    let data = match data {
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
                    if !lanes.is_empty() || !aliases.is_empty() {
                        return Err(SnapshotError::Invalid(
                            "engine block after group copies or aliases",
                        ));
                    }
                    blocks.push((hash, EngineRecord::new(parent, copies, data)));
                }
                Some(Record::Engines { engines, blocks }) => {
                    if engine_total.replace((engines, blocks)).is_some() {
                        return Err(SnapshotError::Invalid("two engine counts"));
                    }
                    let total: usize = snap
                        .engines
                        .iter()
                        .flat_map(|e| e.models.iter())
                        .map(|m| m.blocks.len())
                        .sum();
                    if engines as usize != snap.engines.len() || blocks != total as u64 {
                        return Err(SnapshotError::Invalid("engine counts differ"));
                    }
                }
                Some(Record::Model { name }) => {
                    if !snap.engines.is_empty() {
                        return Err(SnapshotError::Invalid("model after the first engine"));
                    }
                    path.clear();
                    snap.models.push(ModelNodes {
                        name,
                        nodes: Vec::new(),
                    });
                }
                Some(Record::Node {
                    parent,
                    edge,
                    entries,
                }) => {
                    let Some(model) = snap.models.last_mut() else {
                        return Err(SnapshotError::Invalid("node before any model"));
                    };
                    if edge.is_empty() {
                        return Err(SnapshotError::Invalid("node with an empty edge"));
                    }
                    if entries.iter().any(|&(p, _)| p as usize >= snap.pods.len()) {
                        return Err(SnapshotError::Invalid("entry names an unknown pod"));
                    }
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
                Some(Record::SetBlocks {
                    model,
                    pod,
                    set,
                    hashes,
                }) => {
                    if engine_total.is_none() {
                        return Err(SnapshotError::Invalid("set blocks before the engine count"));
                    }
                    if set >= MAX_SETS || pod.contains(HIDDEN_MARK) {
                        return Err(SnapshotError::Invalid("a set out of range"));
                    }
                    snap.sets.push((model, pod, set, hashes));
                }
                Some(Record::End {
                    pods,
                    models,
                    nodes,
                }) => {
                    let total: usize = snap.models.iter().map(|m| m.nodes.len()).sum();
                    if at != body.len() {
                        return Err(SnapshotError::Invalid("data after the end record"));
                    }
                    if pods as usize != snap.pods.len()
                        || models as usize != snap.models.len()
                        || nodes != total as u64
                    {
                        return Err(SnapshotError::Invalid("end record counts differ"));
                    }
                    if version >= 2 && engine_total.is_none() {
                        return Err(SnapshotError::Invalid("no engine count"));
                    }
                    return Ok(snap);
                }
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
        let engines: Vec<_> = std::mem::take(&mut self.engines)
            .into_iter()
            .filter_map(|e| {
                let spec = EngineSpec {
                    engine_block: e.engine_block,
                    our_block: e.our_block,
                    // The subscription that registers the pod again brings
                    // the gateways' rule (`Index::engine`).
                    hash: crate::engine::unset_hash,
                };
                match index.engine(&e.pod, spec) {
                    Ok(handle) => Some((e, handle)),
                    Err(_) => {
                        sum.refused += 1;
                        None
                    }
                }
            })
            .collect();
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
        for (model, pod, set, hashes) in &self.sets {
            match index.set_hold(model, pod, *set, hashes) {
                Ok(()) => sum.set_blocks += hashes.len() as u64,
                Err(_) => sum.refused += 1,
            }
        }
        sum
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
