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
//! Engine-fed pods (see the `precise` module) are written as their engine
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
//! copies) are written only for hybrid models' pods (`crate::precise::groups`), and
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

use std::borrow::Cow;

use bincode::{Decode, Encode};
use thiserror::Error;

use crate::precise::groups::GroupKind;

mod engines;
mod read;
mod write;

pub use read::Snapshot;

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

/// A record's field that is a string, a slice or a block's data: borrowed
/// from the index when a snapshot is written, owned when one is read, the
/// same bytes either way (bincode writes a borrowed and an owned value
/// alike).
struct Stored<'a, T: ?Sized + ToOwned>(Cow<'a, T>);

impl<'a, T: ?Sized + ToOwned> Stored<'a, T> {
    /// A borrowed field, to write.
    fn of(value: &'a T) -> Self {
        Stored(Cow::Borrowed(value))
    }

    /// A field read, taken out.
    fn into_owned(self) -> T::Owned {
        self.0.into_owned()
    }
}

impl<T: ?Sized + ToOwned> Clone for Stored<'_, T> {
    fn clone(&self) -> Self {
        Stored(self.0.clone())
    }
}

impl<T: ?Sized + ToOwned> Encode for Stored<'_, T>
where
    for<'b> &'b T: Encode,
{
    fn encode<E: bincode::enc::Encoder>(
        &self,
        e: &mut E,
    ) -> Result<(), bincode::error::EncodeError> {
        self.0.as_ref().encode(e)
    }
}

impl<C, T: ?Sized + ToOwned> Decode<C> for Stored<'_, T>
where
    T::Owned: Decode<C>,
{
    fn decode<D: bincode::de::Decoder<Context = C>>(
        d: &mut D,
    ) -> Result<Self, bincode::error::DecodeError> {
        Ok(Stored(Cow::Owned(T::Owned::decode(d)?)))
    }
}

// Bincode's derive asks for this beside `Decode`; reading never borrows
// (a slice of `u64` cannot be borrowed from varint bytes).
impl<'de, C, T: ?Sized + ToOwned> bincode::BorrowDecode<'de, C> for Stored<'_, T>
where
    T::Owned: Decode<C>,
{
    fn borrow_decode<D: bincode::de::BorrowDecoder<'de, Context = C>>(
        d: &mut D,
    ) -> Result<Self, bincode::error::DecodeError> {
        Ok(Stored(Cow::Owned(T::Owned::decode(d)?)))
    }
}

/// One record, written from the index's data and read back into owned
/// data by the same definition (see [`Stored`]).
#[derive(Clone, Encode, Decode)]
enum Record<'a> {
    Header {
        version: u32,
        written_at: u64,
        default_capacity: u64,
    },
    Pod {
        name: Stored<'a, str>,
        capacity: u64,
    },
    Model {
        name: Stored<'a, str>,
    },
    Node {
        parent: u32,
        edge: Stored<'a, [u64]>,
        entries: Stored<'a, [(u32, u64)]>,
    },
    End {
        pods: u32,
        models: u32,
        nodes: u64,
    },
    Engine {
        pod: Stored<'a, str>,
        engine_block: u32,
        our_block: u32,
        last_batch: Option<(u64, u64)>,
    },
    EngineModel {
        name: Stored<'a, str>,
    },
    Block {
        hash: u64,
        parent: Option<u64>,
        copies: u32,
        data: Stored<'a, BlockData>,
    },
    Engines {
        engines: u32,
        blocks: u64,
    },
    EngineGroups {
        groups: Stored<'a, [(u32, KindData)]>,
    },
    GroupCopies {
        group: u32,
        blocks: Stored<'a, [(u64, u32)]>,
    },
    BlockAliases {
        blocks: Stored<'a, [(u64, u64, u64)]>,
    },
    SetBlocks {
        model: Stored<'a, str>,
        pod: Stored<'a, str>,
        set: u32,
        hashes: Stored<'a, [u64]>,
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

/// An engine record's own data (`precise::Data`), as written.
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

#[cfg(all(test, not(loom)))]
mod tests;
