//! The index's settings: its bounds and policies (defaults, with their
//! reasons, in [`IndexConfig`]), and its upkeep (the sweep and snapshots).

use std::time::Duration;

use prefix_index::IndexConfig;

use super::declare::{duration, duration_or_off, plain, seconds, settings};
use super::value::{invalid, ConfigError, HumanDuration};

settings! {
    /// What a user may set of the index (see [`super::Settings`]).
    pub struct IndexSettings {
        /// Seconds an entry stays visible after its last insert.
        #[arg(long, env = "PREFIX_INDEX_TTL")]
        ttl: u64 = seconds => index.ttl,
        /// Blocks each pod caches until set_pod_capacity says otherwise.
        #[arg(long, env = "PREFIX_INDEX_POD_CAPACITY")]
        pod_capacity: u64 = plain => index.pod_capacity,
        /// Longest key in blocks; longer keys are refused (KeyTooLong).
        #[arg(long, env = "PREFIX_INDEX_MAX_KEY_BLOCKS")]
        max_key_blocks: usize = plain => index.max_key_blocks,
        /// Global bound on stored (pod, block) entries; about 13-19 bytes each.
        #[arg(long, env = "PREFIX_INDEX_MAX_BLOCKS")]
        max_blocks: u64 = plain => index.max_blocks,
        /// Distinct pods.
        #[arg(long, env = "PREFIX_INDEX_MAX_PODS")]
        max_pods: u32 = plain => index.max_pods,
        /// Distinct models.
        #[arg(long, env = "PREFIX_INDEX_MAX_MODELS")]
        max_models: usize = plain => index.max_models,
        /// Longest model or pod name in bytes.
        #[arg(long, env = "PREFIX_INDEX_MAX_NAME_LEN")]
        max_name_len: usize = plain => index.max_name_len,
        /// How long a gateway's insert for an engine-fed pod counts before the
        /// engine confirms it.
        #[arg(long, env = "PREFIX_INDEX_SPECULATIVE_TTL")]
        speculative_ttl: HumanDuration = duration => index.speculative_ttl,
        /// Bound on engine block records (parent, copies and hashes of each
        /// block an engine reported), over all engines.
        #[arg(long, env = "PREFIX_INDEX_MAX_ENGINE_BLOCKS")]
        max_engine_blocks: u64 = plain => index.max_engine_blocks,
        /// Bound on one engine's block records, so that one engine cannot
        /// take the others' room under --max-engine-blocks.
        #[arg(long, env = "PREFIX_INDEX_MAX_ENGINE_BLOCKS_PER_POD")]
        max_engine_blocks_per_pod: u64 = plain => index.max_engine_blocks_per_pod,
        /// The largest ratio of an engine's block size to --token-block, either
        /// way; engines past it are refused.
        #[arg(long, env = "PREFIX_INDEX_MAX_BLOCK_RATIO")]
        max_block_ratio: u32 = plain => index.max_block_ratio,
        /// KV-cache groups one engine may name (group indexes 0 to this less
        /// one); stores and removals naming a higher one are refused. 1 to 64.
        #[arg(long, env = "PREFIX_INDEX_MAX_ENGINE_GROUPS")]
        max_engine_groups: u32 = plain => index.max_engine_groups,
        /// How often the maintenance task sweeps (TTL, capacities).
        #[arg(long, env = "PREFIX_INDEX_SWEEP_INTERVAL")]
        sweep_interval: HumanDuration = duration => upkeep.sweep_interval,
        /// Nodes one sweep call may visit before it yields.
        #[arg(long, env = "PREFIX_INDEX_SWEEP_BUDGET")]
        sweep_budget: usize = plain => upkeep.sweep_budget,
        /// How often the index is written to <data-dir>/index.snapshot (it is
        /// also written at shutdown and read back at start); "0s" turns
        /// snapshots off.
        #[arg(long, env = "PREFIX_INDEX_SNAPSHOT_INTERVAL")]
        snapshot_interval: HumanDuration = duration_or_off => upkeep.snapshot_interval,
    }
}

/// How the server keeps its index: the sweep and snapshots.
#[derive(Debug, Clone, PartialEq)]
pub struct Upkeep {
    /// Sweep period. Default 1 s: TTLs are minutes, so expiry lags by at most
    /// a second, and capacity overshoot stays one second of inserts.
    pub sweep_interval: Duration,
    /// Nodes per sweep call. Default 65,536: a few milliseconds of work, after
    /// which the task yields and continues.
    pub sweep_budget: usize,
    /// Snapshot period, or none for no snapshots at all. Default 30 s: a
    /// crash loses at most that much of inserts, and at the default bound
    /// (16 M entries) writing takes a few seconds of one core per period.
    pub snapshot_interval: Option<Duration>,
}

impl Default for Upkeep {
    fn default() -> Self {
        Upkeep {
            sweep_interval: Duration::from_secs(1),
            sweep_budget: 65_536,
            snapshot_interval: Some(Duration::from_secs(30)),
        }
    }
}

/// Checks every value of the index's configuration the server can be given.
pub fn validate(index: &IndexConfig, upkeep: &Upkeep) -> Result<(), ConfigError> {
    if index.max_pods == 0 || index.max_pods > (1 << 20) - 1 {
        return invalid("max-pods", &index.max_pods, "must be 1 to 1048575");
    }
    if index.max_key_blocks == 0 {
        return invalid("max-key-blocks", &0, "must be at least 1");
    }
    if index.max_name_len == 0 {
        return invalid("max-name-len", &0, "must be at least 1");
    }
    if index.max_engine_blocks == 0 {
        return invalid("max-engine-blocks", &0, "must be at least 1");
    }
    if index.max_engine_blocks_per_pod == 0 {
        return invalid("max-engine-blocks-per-pod", &0, "must be at least 1");
    }
    if index.max_block_ratio == 0 {
        return invalid("max-block-ratio", &0, "must be at least 1");
    }
    if index.max_engine_groups == 0 || index.max_engine_groups > 64 {
        return invalid(
            "max-engine-groups",
            &index.max_engine_groups,
            "must be 1 to 64",
        );
    }
    if index.ttl.is_zero() {
        return invalid("ttl", &0, "must be at least 1 second");
    }
    if upkeep.sweep_interval.is_zero() || upkeep.sweep_budget == 0 {
        return invalid("sweep-interval/sweep-budget", &0, "must be positive");
    }
    Ok(())
}
