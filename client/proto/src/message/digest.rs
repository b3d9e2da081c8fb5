//! Digest repair between replicas: what one server asks a peer about the
//! gateway-fed entries it holds, level by level, and the answers.
//!
//! A server's gateway-fed entries of a model are a set of **items**: one
//! per (block position, pod), a block position being the key prefix that
//! ends at the block. Items fall into [`CELLS`] cells by their hash; a
//! cell's digest is the XOR of its items' hashes, and a group's the XOR of
//! its [`CELLS_PER_GROUP`] cells'. Two servers holding the same entries
//! have the same digests whatever the shape of their trees (a split edge
//! holds the same items). Only the entries last written inside a
//! [`DigestAsk`]'s window count, the same window on both sides.
//!
//! The levels, each answering only where the one before differed:
//! 1. [`DigestLevel::Models`]: every gateway-fed model's [`GROUPS`] group
//!    digests, the pods the server removed lately (tombstones), and how far
//!    its sweep evicted entries for capacities;
//! 2. [`DigestLevel::Cells`]: the cell digests of the groups in `of`;
//! 3. [`DigestLevel::Items`]: the item hashes of the cells in `of`;
//! 4. [`DigestLevel::Entries`]: for the items in `of`, the entries holding
//!    them (pod, key, last write), what the asker copies.
//!
//! The hashes are fixed here (xxh3, seeds below), the same on every
//! platform and build: servers of one replica set compare them.

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};

/// Cells per model: 4,096, so that a difference of a few hundred items
/// leaves most cells alike and a cell lists a few hundred items of an
/// index of a million.
pub const CELLS: usize = 4096;

/// Groups per model; each folds [`CELLS_PER_GROUP`] cells.
pub const GROUPS: usize = 64;

/// Cells per group.
pub const CELLS_PER_GROUP: usize = CELLS / GROUPS;

/// Most groups, cells or items one question lists in `of`: 65,536
/// hashes take at most 590 KB, within the default 1 MiB frame.
pub const MAX_DIGEST_ASK: usize = 1 << 16;

/// Most items (level `items`) or keys' blocks (level `entries`) one
/// answer carries; more are not an error: the answer stops there and says
/// so (`more`). 262,144 hashes take at most 2.4 MB, within the room an
/// answer of many entries stops in ([`crate::ANSWER_ROOM`], 4 MiB): a
/// replica catching up on a large index needs few answers.
pub const MAX_DIGEST_ANSWER: usize = 1 << 18;

/// The seed of a block position's hash chain: the hash of an empty prefix.
const PATH_SEED: u64 = 0x7072_6566_6978_2d64;
/// The seed of a pod name's hash.
const POD_SEED: u64 = 0x6469_6765_7374_2d70;

/// The hash of the prefix `parent` (a prefix's hash) followed by `block`;
/// [`path_root`] is the empty prefix's.
pub fn path_step(parent: u64, block: u64) -> u64 {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&parent.to_le_bytes());
    b[8..].copy_from_slice(&block.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64_with_seed(&b, PATH_SEED)
}

/// The hash of the empty prefix, where every key's chain starts.
pub const fn path_root() -> u64 {
    PATH_SEED
}

/// The hash of a pod's name, as items use it.
pub fn pod_hash(pod: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(pod.as_bytes(), POD_SEED)
}

/// The item of pod `pod` (its [`pod_hash`]) on the block position `path`
/// (its hash): never 0, so an empty cell's digest is 0.
pub fn item(path: u64, pod: u64) -> u64 {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(&path.to_le_bytes());
    b[8..].copy_from_slice(&pod.to_le_bytes());
    xxhash_rust::xxh3::xxh3_64(&b).max(1)
}

/// The cell an item falls in: its top 12 bits.
pub const fn cell_of(item: u64) -> usize {
    (item >> (64 - CELLS.trailing_zeros())) as usize
}

/// The group a cell falls in.
pub const fn group_of(cell: usize) -> usize {
    cell / CELLS_PER_GROUP
}

/// Folds a model's cell digests into its group digests.
pub fn groups(cells: &[u64]) -> Vec<u64> {
    cells
        .chunks(CELLS_PER_GROUP)
        .map(|c| c.iter().fold(0, |a, b| a ^ b))
        .collect()
}

/// Which level of the digests a [`DigestAsk`] wants.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Encode, Decode, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum DigestLevel {
    /// Every gateway-fed model's group digests, and the recent removals.
    #[default]
    Models,
    /// The cell digests of the groups in `of`.
    Cells,
    /// The item hashes of the cells in `of`.
    Items,
    /// The entries holding the items in `of`.
    Entries,
}

/// One question of digest repair ([`crate::Op::Digest`]).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct DigestAsk {
    /// The level wanted.
    #[cfg_attr(feature = "clap", arg(long, value_enum))]
    pub level: DigestLevel,
    /// The model (empty at level `models`, which answers every model).
    #[serde(default)]
    #[cfg_attr(feature = "clap", arg(long, default_value = ""))]
    pub model: String,
    /// Only entries last written after this time count (ms since the Unix
    /// epoch).
    #[cfg_attr(feature = "clap", arg(long))]
    pub low: u64,
    /// Only entries last written at or before this time count (ms since
    /// the Unix epoch).
    #[cfg_attr(feature = "clap", arg(long))]
    pub high: u64,
    /// Groups (level `cells`), cells (level `items`) or items (level
    /// `entries`); comma-separated on the command line.
    #[serde(default)]
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub of: Vec<u64>,
}

/// One model's group digests.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct ModelDigest {
    /// The model.
    pub model: String,
    /// Its [`GROUPS`] group digests.
    pub groups: Vec<u64>,
}

/// A pod a server removed, and when (a tombstone): entries of it last
/// written before are stale everywhere.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct Tombstone {
    /// The pod.
    pub pod: String,
    /// When it was removed (ms since the Unix epoch).
    pub at: u64,
}

/// How far a server's sweep evicted a pod's entries for its capacity
/// (every pod's for the global bound, with `pod` empty): every block of
/// it last used before `through`, and those last used at `through` from
/// depth `depth` on (blocks used at once go deepest first, as in the
/// pod's own cache).
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct Eviction {
    /// The pod; empty for every pod (the global bound, `max_blocks`).
    pub pod: String,
    /// The newest last use evicted (ms since the Unix epoch).
    pub through: u64,
    /// The shallowest depth evicted of the blocks last used at `through`.
    pub depth: u32,
}

/// An entry holding asked items: `pod` holds every prefix of `key`, last
/// written at `at`.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct DigestEntry {
    /// The pod.
    pub pod: String,
    /// The key, from the root to the deepest asked block of its node.
    pub key: Vec<u64>,
    /// Its last write (ms since the Unix epoch).
    pub at: u64,
}

/// The answer to a [`DigestAsk`]: the level's fields filled, the others
/// empty.
#[derive(Debug, Clone, Default, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
pub struct DigestAnswer {
    /// Level `models`: each gateway-fed model's group digests, by name.
    pub models: Vec<ModelDigest>,
    /// Level `models`: the pods removed lately.
    pub removals: Vec<Tombstone>,
    /// Level `models`: how far the sweep evicted each pod's entries for
    /// its capacity, and every pod's for the global bound (pods never
    /// evicted from are left out).
    pub evictions: Vec<Eviction>,
    /// Level `cells`: [`CELLS_PER_GROUP`] digests per group asked, in its
    /// order; level `items`: the item hashes of the cells asked, ascending.
    pub values: Vec<u64>,
    /// Level `entries`: the entries holding the items asked.
    pub entries: Vec<DigestEntry>,
    /// Whether the answer stopped at [`MAX_DIGEST_ANSWER`] before all was
    /// said.
    pub more: bool,
}

impl DigestAnswer {
    /// Its size on the wire, in bytes (without the frame's header).
    pub fn encoded_len(&self) -> usize {
        let mut size = bincode::enc::write::SizeWriter::default();
        // Writing to a counter does not fail.
        let _ = bincode::encode_into_writer(self, &mut size, bincode::config::standard());
        size.bytes_written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hashes_are_fixed() {
        // Servers of one set compare these: a change here is a change of
        // the protocol. The values are the reference implementation's
        // (Python's `xxhash` package, `xxh3_64_intdigest`), as a gateway
        // or tool in another language computes them.
        assert_eq!(path_step(path_root(), 1), 0x68ed_b76a_80ac_b88a);
        assert_eq!(pod_hash("pod-a"), 0xad28_d707_d4e7_037c);
        assert_eq!(item(1, 2), 0x07ee_86c2_8144_6bef);
    }

    #[test]
    fn cells_fold_into_their_groups() {
        let mut cells = vec![0u64; CELLS];
        cells[0] = 1;
        cells[CELLS_PER_GROUP - 1] = 2;
        cells[CELLS - 1] = 4;
        let g = groups(&cells);
        assert_eq!(g.len(), GROUPS);
        assert_eq!((g[0], g[1], g[GROUPS - 1]), (3, 0, 4));
        assert_eq!(cell_of(u64::MAX), CELLS - 1);
        assert_eq!(group_of(CELLS - 1), GROUPS - 1);
    }
}
