//! Typed errors, one enum per operation.

use thiserror::Error;

/// Why a pod could not be named or created.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PodError {
    /// The name is empty or longer than `max_name_len`.
    #[error("pod name of {len} bytes is not allowed (1 to {max})")]
    BadName {
        /// Length of the offered name.
        len: usize,
        /// The configured `max_name_len`.
        max: usize,
    },
    /// The name holds a NUL character, which marks the index's own hidden
    /// pods (one per KV-cache group of a hybrid model's engine-fed pod).
    #[error("pod names may not hold a NUL character")]
    Reserved,
    /// `max_pods` ids are in use.
    #[error("too many pods (max_pods = {max})")]
    TooManyPods {
        /// The configured `max_pods`.
        max: usize,
    },
}

/// Why an insert failed. An insert that fails may have recorded a prefix of its
/// key for the pod (never more than the key).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum InsertError {
    /// The pod name was refused.
    #[error(transparent)]
    Pod(#[from] PodError),
    /// The model name is empty or longer than `max_name_len`.
    #[error("model name of {len} bytes is not allowed (1 to {max})")]
    BadModel {
        /// Length of the offered name.
        len: usize,
        /// The configured `max_name_len`.
        max: usize,
    },
    /// `max_models` models exist already.
    #[error("too many models (max_models = {max})")]
    TooManyModels {
        /// The configured `max_models`.
        max: usize,
    },
    /// Storing the key would pass `max_blocks`; the sweep frees room.
    #[error("index is full (max_blocks = {max}); retry after the next sweep")]
    Full {
        /// The configured `max_blocks`.
        max: u64,
    },
}

/// Why an engine could not be registered or an engine event was refused.
/// A refused event changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum EngineError {
    /// Neither block size divides the other.
    #[error("engine block of {engine} tokens does not map to our block of {ours} tokens (neither divides the other)")]
    BlockSizes {
        /// The engine's block size in tokens.
        engine: u32,
        /// Ours (the gateways' token block size).
        ours: u32,
    },
    /// A store's token ids do not fill its blocks.
    #[error("{tokens} token ids do not fill {blocks} blocks of {block} tokens")]
    TokenCount {
        /// Token ids in the event.
        tokens: usize,
        /// Block hashes in the event.
        blocks: usize,
        /// The engine's block size.
        block: u32,
    },
    /// A store's identity seeds are neither none nor one per block of ours
    /// (or per page).
    #[error("a store of {blocks} blocks has {seeds} identity seeds (0 or {expected} expected)")]
    SeedCount {
        /// Seeds given.
        seeds: usize,
        /// Engine blocks in the store.
        blocks: usize,
        /// Seeds a store of that many blocks needs.
        expected: usize,
    },
    /// `max_engine_blocks` engine blocks are recorded already.
    #[error("engine block records are full (max_engine_blocks = {max})")]
    Full {
        /// The configured `max_engine_blocks`.
        max: u64,
    },
    /// `max_engine_blocks_per_pod` engine blocks of this pod are recorded
    /// already.
    #[error("this engine's block records are full (max_engine_blocks_per_pod = {max})")]
    PodFull {
        /// The configured `max_engine_blocks_per_pod`.
        max: u64,
    },
    /// A store or removal named a KV-cache group past `max_engine_groups`.
    #[error("KV-cache group {idx} is past the {max} an engine may have (max_engine_groups)")]
    Group {
        /// The group's index.
        idx: u32,
        /// The configured `max_engine_groups` (at most 64).
        max: u32,
    },
    /// An event named a lower cache tier past the most a pod may have.
    #[error("lower cache tier {tier} is past the {max} a pod may have")]
    Tier {
        /// The tier's index among the pod's lower tiers.
        tier: u32,
        /// [`crate::MAX_LOWER_TIERS`].
        max: u32,
    },
    /// A snapshot's engine record was refused.
    #[error("engine block {hash:#x} of the snapshot: {why}")]
    Record {
        /// The block's engine hash.
        hash: u64,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The pod name was refused.
    #[error(transparent)]
    Pod(#[from] PodError),
    /// Placing the blocks in the tree failed.
    #[error(transparent)]
    Insert(#[from] InsertError),
}
