//! The index's settings: its bounds and policies (defaults, with their
//! reasons, in [`IndexConfig`]), and its upkeep (the sweep and snapshots).

use std::time::Duration;

use prefix_index::IndexConfig;
use serde::{Deserialize, Serialize};

use super::value::{
    duration, duration_or_off, invalid, written_or_off, ConfigError, HumanDuration,
};

/// What a user may set of the index (see [`super::Settings`]).
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct IndexSettings {
    /// Seconds an entry stays visible after its last insert.
    #[arg(long, env = "PREFIX_INDEX_TTL")]
    pub ttl: Option<u64>,
    /// Blocks each pod caches until set_pod_capacity says otherwise.
    #[arg(long, env = "PREFIX_INDEX_POD_CAPACITY")]
    pub pod_capacity: Option<u64>,
    /// Longest key in blocks; longer keys are refused (KeyTooLong).
    #[arg(long, env = "PREFIX_INDEX_MAX_KEY_BLOCKS")]
    pub max_key_blocks: Option<usize>,
    /// Global bound on stored (pod, block) entries; about 13-19 bytes each.
    #[arg(long, env = "PREFIX_INDEX_MAX_BLOCKS")]
    pub max_blocks: Option<u64>,
    /// Distinct pods.
    #[arg(long, env = "PREFIX_INDEX_MAX_PODS")]
    pub max_pods: Option<u32>,
    /// Distinct models.
    #[arg(long, env = "PREFIX_INDEX_MAX_MODELS")]
    pub max_models: Option<usize>,
    /// Longest model or pod name in bytes.
    #[arg(long, env = "PREFIX_INDEX_MAX_NAME_LEN")]
    pub max_name_len: Option<usize>,
    /// How long a gateway's insert for an engine-fed pod counts before the
    /// engine confirms it.
    #[arg(long, env = "PREFIX_INDEX_SPECULATIVE_TTL")]
    pub speculative_ttl: Option<HumanDuration>,
    /// Bound on engine block records (parent, copies and hashes of each
    /// block an engine reported), over all engines.
    #[arg(long, env = "PREFIX_INDEX_MAX_ENGINE_BLOCKS")]
    pub max_engine_blocks: Option<u64>,
    /// Bound on one engine's block records, so that one engine cannot
    /// take the others' room under --max-engine-blocks.
    #[arg(long, env = "PREFIX_INDEX_MAX_ENGINE_BLOCKS_PER_POD")]
    pub max_engine_blocks_per_pod: Option<u64>,
    /// The largest ratio of an engine's block size to --token-block, either
    /// way; engines past it are refused.
    #[arg(long, env = "PREFIX_INDEX_MAX_BLOCK_RATIO")]
    pub max_block_ratio: Option<u32>,
    /// KV-cache groups one engine may name (group indexes 0 to this less
    /// one); stores and removals naming a higher one are refused. 1 to 64.
    #[arg(long, env = "PREFIX_INDEX_MAX_ENGINE_GROUPS")]
    pub max_engine_groups: Option<u32>,
    /// How often the maintenance task sweeps (TTL, capacities).
    #[arg(long, env = "PREFIX_INDEX_SWEEP_INTERVAL")]
    pub sweep_interval: Option<HumanDuration>,
    /// Nodes one sweep call may visit before it yields.
    #[arg(long, env = "PREFIX_INDEX_SWEEP_BUDGET")]
    pub sweep_budget: Option<usize>,
    /// How often the index is written to <data-dir>/index.snapshot (it is
    /// also written at shutdown and read back at start); "0s" turns
    /// snapshots off.
    #[arg(long, env = "PREFIX_INDEX_SNAPSHOT_INTERVAL")]
    pub snapshot_interval: Option<HumanDuration>,
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

impl IndexSettings {
    /// The index and upkeep these settings describe, defaults filled in.
    pub fn resolve(self) -> (IndexConfig, Upkeep) {
        let (d, u) = (IndexConfig::default(), Upkeep::default());
        let index = IndexConfig {
            ttl: self.ttl.map_or(d.ttl, Duration::from_secs),
            pod_capacity: self.pod_capacity.unwrap_or(d.pod_capacity),
            max_blocks: self.max_blocks.unwrap_or(d.max_blocks),
            max_key_blocks: self.max_key_blocks.unwrap_or(d.max_key_blocks),
            max_pods: self.max_pods.unwrap_or(d.max_pods),
            max_models: self.max_models.unwrap_or(d.max_models),
            max_name_len: self.max_name_len.unwrap_or(d.max_name_len),
            speculative_ttl: duration(self.speculative_ttl, d.speculative_ttl),
            max_engine_blocks: self.max_engine_blocks.unwrap_or(d.max_engine_blocks),
            max_engine_blocks_per_pod: self
                .max_engine_blocks_per_pod
                .unwrap_or(d.max_engine_blocks_per_pod),
            max_block_ratio: self.max_block_ratio.unwrap_or(d.max_block_ratio),
            max_engine_groups: self.max_engine_groups.unwrap_or(d.max_engine_groups),
            ..d
        };
        let upkeep = Upkeep {
            sweep_interval: duration(self.sweep_interval, u.sweep_interval),
            sweep_budget: self.sweep_budget.unwrap_or(u.sweep_budget),
            snapshot_interval: duration_or_off(self.snapshot_interval, u.snapshot_interval),
        };
        (index, upkeep)
    }

    /// The settings that resolve to `index` and `upkeep`.
    pub fn from_configs(index: &IndexConfig, upkeep: &Upkeep) -> Self {
        IndexSettings {
            ttl: Some(index.ttl.as_secs()),
            pod_capacity: Some(index.pod_capacity),
            max_key_blocks: Some(index.max_key_blocks),
            max_blocks: Some(index.max_blocks),
            max_pods: Some(index.max_pods),
            max_models: Some(index.max_models),
            max_name_len: Some(index.max_name_len),
            speculative_ttl: Some(HumanDuration(index.speculative_ttl)),
            max_engine_blocks: Some(index.max_engine_blocks),
            max_engine_blocks_per_pod: Some(index.max_engine_blocks_per_pod),
            max_block_ratio: Some(index.max_block_ratio),
            max_engine_groups: Some(index.max_engine_groups),
            sweep_interval: Some(HumanDuration(upkeep.sweep_interval)),
            sweep_budget: Some(upkeep.sweep_budget),
            snapshot_interval: written_or_off(upkeep.snapshot_interval),
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
