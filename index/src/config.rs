//! Index limits and policies. Every limit the index enforces is here.

use std::time::Duration;

use crate::receipts::ReceiptRule;

/// Configuration of an [`crate::Index`]. Every field has a documented default.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexConfig {
    /// How long a (block, pod) entry stays visible after its last insert.
    /// Default 600 s: vLLM and SGLang keep idle prefix blocks for minutes under
    /// load, and a stale hit costs a full prefill anyway.
    pub ttl: Duration,
    /// Blocks each pod is assumed to cache until `set_pod_capacity` says
    /// otherwise. Default 31,250: the per-server figure the Gateway API
    /// Inference Extension's prefix scorer uses.
    pub pod_capacity: u64,
    /// Hard bound on stored (pod, block) pairs across all models; inserts that
    /// would pass it fail with `InsertError::Full`. Default 16,777,216 (2^24):
    /// 512 pods at the default capacity, about 0.5 GiB at the measured cost.
    pub max_blocks: u64,
    /// When stored pairs exceed `max_blocks * evict_to`, the sweep evicts the
    /// least recently used entries across all pods down to that level. Default
    /// 0.9: headroom so inserts keep succeeding between sweeps.
    pub evict_to: f64,
    /// Keys are cut to this many blocks. Default 65,536: 1 Mi tokens at the
    /// gateways' default 16 tokens a block, the longest contexts served
    /// today, so any prompt an engine holds gets a lookup's answer.
    pub max_key_blocks: usize,
    /// Distinct pods (live, or removed and not yet reclaimed). Default 4,096.
    /// Hard ceiling 1,048,575 (ids share a 64-bit word with the time).
    pub max_pods: u32,
    /// Distinct model names. Default 1,024.
    pub max_models: usize,
    /// How long a gateway's insert for an engine-fed pod stays visible
    /// unless the engine confirms the blocks. Default 2 s: an engine
    /// publishes a request's blocks within a scheduler step of receiving
    /// it, while the second request of a session often arrives within a
    /// second of the first.
    pub speculative_ttl: Duration,
    /// Hard bound on engine block records across all engine-fed pods (each
    /// holds a block's parent, copy count and our hashes); stores past it
    /// are refused. Pods storing at once share it exactly: each store takes
    /// room for its event's new records before recording them. Default
    /// 16,777,216 (2^24), as `max_blocks`.
    pub max_engine_blocks: u64,
    /// Bound on one engine-fed pod's records, so that one engine that
    /// stores and never removes (buggy, or whose removals were lost)
    /// cannot take every other engine's room under `max_engine_blocks`.
    /// Default 16,777,216, as `max_engine_blocks`: no tighter unless set;
    /// the sum of the pods' KV-cache blocks over their count, with room,
    /// makes each engine's share its own.
    pub max_engine_blocks_per_pod: u64,
    /// The largest ratio of an engine's block size to ours, either way: an
    /// engine block of this many of ours, or this many engine pages to one
    /// of our blocks; engines past it are refused. Default 1,024: real ones
    /// are 64 or less (SGLang's one-token pages under 64-token blocks), and
    /// the bound keeps a chain's walk within `max_key_blocks` times it.
    pub max_block_ratio: u32,
    /// The most KV-cache groups an engine's stores may name (indices
    /// `0..max_engine_groups`); a store or removal naming a higher index
    /// is refused. Default 32, and at most 64: hybrid models have a
    /// handful (one per attention kind and page size; vLLM splits a kind's
    /// layers into groups of equal size).
    pub max_engine_groups: u32,
    /// Longest pod or model name in bytes. Default 253: a DNS-1123 subdomain,
    /// the longest Kubernetes object name.
    pub max_name_len: usize,
    /// How receipts make a pod suspect ([`ReceiptRule`]'s defaults, with
    /// their reasons).
    pub receipts: ReceiptRule,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            ttl: Duration::from_secs(600),
            pod_capacity: 31_250,
            max_blocks: 1 << 24,
            evict_to: 0.9,
            max_key_blocks: 1 << 16,
            max_pods: 4096,
            max_models: 1024,
            speculative_ttl: Duration::from_secs(2),
            max_engine_blocks: 1 << 24,
            max_engine_blocks_per_pod: 1 << 24,
            max_block_ratio: 1024,
            max_engine_groups: 32,
            max_name_len: 253,
            receipts: ReceiptRule::default(),
        }
    }
}

impl IndexConfig {
    pub(crate) fn ttl_ms(&self) -> u64 {
        u64::try_from(self.ttl.as_millis()).unwrap_or(u64::MAX)
    }

    /// How far back a speculative insert is dated so that the one TTL
    /// check lookups make expires it after `speculative_ttl`.
    pub(crate) fn speculative_age(&self) -> u64 {
        let spec = u64::try_from(self.speculative_ttl.as_millis()).unwrap_or(u64::MAX);
        self.ttl_ms().saturating_sub(spec)
    }
}
