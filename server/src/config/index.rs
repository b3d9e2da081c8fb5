//! The index's settings: its bounds and policies (defaults, with their
//! reasons, in [`IndexConfig`](prefix_index::IndexConfig)), and its upkeep
//! (the sweep and snapshots).

use std::time::Duration;

use super::declare::{duration, duration_or_off, plain, seconds, settings, NotZero};
use super::value::HumanDuration;

settings! {
    /// What a user may set of the index (see [`super::Settings`]).
    pub struct IndexSettings => index {
        /// Seconds an entry stays visible after its last insert.
        #[arg(long)]
        ttl: u64 = seconds => ttl,
            check NotZero("ttl", "0", "must be at least 1 second"),
        /// Blocks each pod caches until set_pod_capacity says otherwise.
        #[arg(long)]
        pod_capacity: u64 = plain => pod_capacity,
        /// Longest key in blocks; longer keys are refused (KeyTooLong).
        #[arg(long)]
        max_key_blocks: usize = plain => max_key_blocks, check 1..,
        /// Global bound on stored (pod, block) entries; about 13-19 bytes each.
        #[arg(long)]
        max_blocks: u64 = plain => max_blocks,
        /// Distinct pods.
        #[arg(long)]
        max_pods: u32 = plain => max_pods, check 1..=(1 << 20) - 1,
        /// Distinct models.
        #[arg(long)]
        max_models: usize = plain => max_models,
        /// Longest model or pod name in bytes.
        #[arg(long)]
        max_name_len: usize = plain => max_name_len, check 1..,
        /// How long a gateway's insert for an engine-fed pod counts before the
        /// engine confirms it.
        #[arg(long)]
        speculative_ttl: HumanDuration = duration => speculative_ttl,
        /// Bound on engine block records (parent, copies and hashes of each
        /// block an engine reported), over all engines.
        #[arg(long)]
        max_engine_blocks: u64 = plain => max_engine_blocks, check 1..,
        /// Bound on one engine's block records, so that one engine cannot
        /// take the others' room under --max-engine-blocks.
        #[arg(long)]
        max_engine_blocks_per_pod: u64 = plain => max_engine_blocks_per_pod, check 1..,
        /// The largest ratio of an engine's block size to --token-block, either
        /// way; engines past it are refused.
        #[arg(long)]
        max_block_ratio: u32 = plain => max_block_ratio, check 1..,
        /// KV-cache groups one engine may name (group indexes 0 to this less
        /// one); stores and removals naming a higher one are refused. 1 to 64.
        #[arg(long)]
        max_engine_groups: u32 = plain => max_engine_groups, check 1..=64,
        /// Receipts each pod's counts cover: its last this many (1 to 31).
        #[arg(long)]
        receipt_window: u32 = plain => receipts.window, check 1..=31,
        /// Over-predicted receipts in a pod's window that make it suspect, and
        /// agreeing receipts in a row that end it (at most --receipt-window); 0
        /// never makes a pod suspect.
        #[arg(long)]
        receipt_suspect: u32 = plain => receipts.suspect, check 0..=31,
        /// How long a suspect pod that gets no receipt stays suspect.
        #[arg(long)]
        receipt_quiet: HumanDuration = duration => receipts.quiet,
        /// Over-predictions of at most this many blocks count as exact (1 for
        /// engines drafting with EAGLE, which reuse one block less than a hit).
        #[arg(long)]
        receipt_tolerance: u32 = plain => receipts.tolerance,
    }
}

/// The sweep's settings, refused together when either is zero.
const SWEEP: NotZero = NotZero("sweep-interval/sweep-budget", "0", "must be positive");

settings! {
    /// What a user may set of the index's upkeep (see [`super::Settings`]).
    pub struct UpkeepSettings => upkeep {
        /// How often the maintenance task sweeps (TTL, capacities).
        #[arg(long)]
        // 1 s: TTLs are minutes, so expiry lags by at most a second, and
        // capacity overshoot stays one second of inserts.
        sweep_interval: HumanDuration = duration
            => sweep_interval: Duration = Duration::from_secs(1), check SWEEP,
        /// Nodes one sweep call may visit before it yields.
        #[arg(long)]
        // 65,536: a few milliseconds of work, after which the task yields
        // and continues.
        sweep_budget: usize = plain => sweep_budget: usize = 65_536, check SWEEP,
        /// How often the index is written to <data-dir>/index.snapshot (it is
        /// also written at shutdown and read back at start); "0s" turns
        /// snapshots off.
        #[arg(long)]
        // 30 s: a crash loses at most that much of inserts, and at the
        // default bound (16 M entries) writing takes a few seconds of one
        // core per period.
        snapshot_interval: HumanDuration = duration_or_off
            => snapshot_interval: Option<Duration> = Some(Duration::from_secs(30)),
    }
    /// How the server keeps its index: the sweep and snapshots.
    pub struct Upkeep {}
}
