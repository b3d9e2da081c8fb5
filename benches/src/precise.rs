//! Engine KV-cache events made from the Mooncake trace, for the precise-mode
//! benchmarks (`benches/engine_events.rs`).
//!
//! Each trace `hash_id` stands for one engine block of [`ENGINE_BLOCK`]
//! tokens. Its token ids are a fixed function of the id and the token's
//! place in the block, so equal ids give equal tokens; a block's engine hash
//! chains its parent's engine hash with its tokens, as vLLM's does (with
//! xxh3 for sha256). [`PodCaches`] plays `pods` engines, each an LRU cache of
//! `capacity` blocks, and turns each request into one scheduler [`Step`]:
//! the blocks it evicts to make room (tail first, as vLLM frees a request's
//! blocks in reverse so its tail goes first) and one store of its uncached
//! blocks under its cached prefix. [`encode_vllm_batch`] writes a step as the
//! msgpack batch vLLM publishes for it.

use std::collections::{BTreeMap, HashMap, HashSet};

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Tokens per engine block (vLLM's default `--block-size`).
pub const ENGINE_BLOCK: usize = 16;

/// Token ids are below this, the size of a Llama 3 vocabulary, so their
/// msgpack forms (1, 3 and 5 bytes) mix as real ones do.
const VOCAB: u64 = 128_256;

/// The engine hash of the empty prefix (vLLM's `NONE_HASH`).
const NONE_HASH: u64 = 0x9bd9_6a48_5ad8_4efd;

/// Appends the [`ENGINE_BLOCK`] token ids of trace block `hash_id`.
pub fn block_tokens(hash_id: u64, out: &mut Vec<u32>) {
    for place in 0..ENGINE_BLOCK as u64 {
        // splitmix64 of (id, place): equal ids give equal tokens.
        let mut z = (hash_id << 4 | place).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.push(((z ^ (z >> 31)) % VOCAB) as u32);
    }
}

/// The token ids of a whole request.
pub fn request_tokens(hash_ids: &[u64]) -> Vec<u32> {
    let mut out = Vec::with_capacity(hash_ids.len() * ENGINE_BLOCK);
    for &id in hash_ids {
        block_tokens(id, &mut out);
    }
    out
}

/// An engine's hash of a block: its parent's hash chained with its tokens.
pub fn engine_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut bytes = [0u8; ENGINE_BLOCK * 4];
    for (b, t) in bytes.chunks_exact_mut(4).zip(tokens) {
        b.copy_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(&bytes, parent.unwrap_or(NONE_HASH))
}

/// The trace with each request's chain of engine hashes.
pub struct EngineTrace {
    /// Each request's `hash_ids`.
    pub requests: Vec<Vec<u64>>,
    /// Each request's engine hashes, block by block.
    pub chains: Vec<Vec<u64>>,
}

impl EngineTrace {
    /// Hashes every request of `requests`.
    pub fn new(requests: Vec<Vec<u64>>) -> Self {
        let mut tokens = Vec::with_capacity(ENGINE_BLOCK);
        let chains = requests
            .iter()
            .map(|r| {
                let mut parent = None;
                r.iter()
                    .map(|&id| {
                        tokens.clear();
                        block_tokens(id, &mut tokens);
                        let h = engine_hash(parent, &tokens);
                        parent = Some(h);
                        h
                    })
                    .collect()
            })
            .collect();
        EngineTrace { requests, chains }
    }
}

/// A `BlockStored` event: consecutive blocks of one sequence.
#[derive(Debug, Clone)]
pub struct StoredBlocks {
    /// The engine hash of the block before the first; `None` at block 0.
    pub parent: Option<u64>,
    /// The blocks' engine hashes.
    pub hashes: Vec<u64>,
    /// Their tokens, [`ENGINE_BLOCK`] per hash.
    pub tokens: Vec<u32>,
}

/// What one engine publishes for one request: a batch of events.
#[derive(Debug, Clone)]
pub struct Step {
    /// The pod (engine) that served the request.
    pub pod: usize,
    /// Blocks evicted to make room, one `BlockRemoved` each, in order.
    pub removed: Vec<u64>,
    /// The request's blocks the pod did not hold, if any.
    pub stored: Option<StoredBlocks>,
}

impl Step {
    /// Block operations: blocks stored plus blocks removed.
    pub fn block_ops(&self) -> u64 {
        (self.removed.len() + self.stored.as_ref().map_or(0, |s| s.hashes.len())) as u64
    }
}

/// One pod's cache: least recently used first.
#[derive(Clone, Default)]
struct Lru {
    used: HashMap<u64, u64, ahash::RandomState>,
    order: BTreeMap<u64, u64>,
}

impl Lru {
    fn touch(&mut self, hash: u64, clock: &mut u64) {
        *clock += 1;
        if let Some(old) = self.used.insert(hash, *clock) {
            self.order.remove(&old);
        }
        self.order.insert(*clock, hash);
    }

    fn evict(&mut self) -> Option<u64> {
        let (_, hash) = self.order.pop_first()?;
        self.used.remove(&hash);
        Some(hash)
    }
}

/// `pods` engines with an LRU cache of `capacity` blocks each.
#[derive(Clone)]
pub struct PodCaches {
    pods: Vec<Lru>,
    capacity: usize,
    clock: u64,
}

impl PodCaches {
    /// Empty caches.
    pub fn new(pods: usize, capacity: usize) -> Self {
        PodCaches {
            pods: vec![Lru::default(); pods],
            capacity,
            clock: 0,
        }
    }

    /// Blocks held, over every pod: the (pod, block) pairs an index holds.
    pub fn held(&self) -> usize {
        self.pods.iter().map(|p| p.used.len()).sum()
    }

    /// Each pod's held engine blocks (their engine hashes).
    pub fn held_blocks(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.pods
            .iter()
            .enumerate()
            .flat_map(|(pod, lru)| lru.used.keys().map(move |&h| (pod, h)))
    }

    /// What each pod holds, as paths: for every held block with no held
    /// child, a request of `trace` that has it and its place there (the
    /// pod holds that request's blocks up to it).
    pub fn held_paths(&self, trace: &EngineTrace) -> Vec<Vec<(usize, usize)>> {
        let mut first_seen = HashMap::<u64, (usize, usize), ahash::RandomState>::default();
        for (r, chain) in trace.chains.iter().enumerate() {
            for (i, &h) in chain.iter().enumerate() {
                first_seen.entry(h).or_insert((r, i));
            }
        }
        self.pods
            .iter()
            .map(|lru| {
                let parents: HashSet<u64, ahash::RandomState> = lru
                    .used
                    .keys()
                    .filter_map(|h| {
                        let (r, i) = first_seen[h];
                        i.checked_sub(1).map(|p| trace.chains[r][p])
                    })
                    .collect();
                lru.used
                    .keys()
                    .filter(|h| !parents.contains(h))
                    .map(|h| first_seen[h])
                    .collect()
            })
            .collect()
    }

    /// Serves request `r` of `trace` on `pod`: its cached prefix (contiguous
    /// from block 0) is reused, blocks are evicted least recently used first
    /// to make room, and the rest is stored. A request's blocks are then
    /// used head last, so its tail is evicted before its head and every
    /// pod's cache stays closed under prefixes.
    pub fn serve(&mut self, trace: &EngineTrace, r: usize, pod: usize) -> Step {
        let chain = &trace.chains[r];
        let lru = &mut self.pods[pod];
        let cached = chain
            .iter()
            .take_while(|h| lru.used.contains_key(h))
            .count();
        for &h in chain[..cached].iter().rev() {
            lru.touch(h, &mut self.clock);
        }
        let new = chain.len() - cached;
        let mut removed = Vec::new();
        while lru.used.len() + new > self.capacity {
            match lru.evict() {
                Some(h) => removed.push(h),
                None => break,
            }
        }
        for &h in chain.iter().rev() {
            lru.touch(h, &mut self.clock);
        }
        let stored = (new > 0).then(|| {
            let mut tokens = Vec::with_capacity(new * ENGINE_BLOCK);
            for &id in &trace.requests[r][cached..] {
                block_tokens(id, &mut tokens);
            }
            StoredBlocks {
                parent: cached.checked_sub(1).map(|i| chain[i]),
                hashes: chain[cached..].to_vec(),
                tokens,
            }
        });
        Step {
            pod,
            removed,
            stored,
        }
    }
}

/// Every request of `trace` served in order, round-robin over the pods
/// (request `i` on pod `i % pods`), from empty caches; the caches after.
pub fn replay(trace: &EngineTrace, pods: usize, capacity: usize) -> (Vec<Step>, PodCaches) {
    let mut caches = PodCaches::new(pods, capacity);
    let steps = (0..trace.requests.len())
        .map(|r| caches.serve(trace, r, r % pods))
        .collect();
    (steps, caches)
}

/// Writing to a `Vec<u8>` cannot fail (its `io::Write` never errs); this
/// drops the `Result` rmp's encoders return.
fn put<T, E: std::fmt::Debug>(r: Result<T, E>) {
    r.expect("writing to a Vec<u8> cannot fail");
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put(rmp::encode::write_str(out, s));
}

/// Writes `step` as vLLM 0.33 publishes it: `[ts, [event, ...], 0]`, each
/// event a map tagged by `"type"` with the fields its GPU block pool sets
/// (`shared/engines/vllm-kv-events.md`, §4 and §7), the
/// removals first (blocks are evicted when allocated, before the new ones
/// are cached), `BlockStored` with msgspec's `map16` header.
pub fn encode_vllm_batch(step: &Step, ts: f64, out: &mut Vec<u8>) {
    let events = step.removed.len() + usize::from(step.stored.is_some());
    put(rmp::encode::write_array_len(out, 3));
    put(rmp::encode::write_f64(out, ts));
    put(rmp::encode::write_array_len(out, events as u32));
    for &h in &step.removed {
        put(rmp::encode::write_map_len(out, 4));
        put_str(out, "type");
        put_str(out, "BlockRemoved");
        put_str(out, "block_hashes");
        put(rmp::encode::write_array_len(out, 1));
        put(rmp::encode::write_uint(out, h));
        put_str(out, "medium");
        put_str(out, "GPU");
        put_str(out, "group_idx");
        put(rmp::encode::write_uint(out, 0));
    }
    if let Some(s) = &step.stored {
        // msgspec sizes the header for the struct, not the fields present.
        out.extend_from_slice(&[0xde, 0x00, 0x0b]);
        put_str(out, "type");
        put_str(out, "BlockStored");
        put_str(out, "block_hashes");
        put(rmp::encode::write_array_len(out, s.hashes.len() as u32));
        for &h in &s.hashes {
            put(rmp::encode::write_uint(out, h));
        }
        put_str(out, "parent_block_hash");
        match s.parent {
            Some(p) => put(rmp::encode::write_uint(out, p)),
            None => put(rmp::encode::write_nil(out)),
        }
        put_str(out, "token_ids");
        put(rmp::encode::write_array_len(out, s.tokens.len() as u32));
        for &t in &s.tokens {
            put(rmp::encode::write_uint(out, u64::from(t)));
        }
        put_str(out, "block_size");
        put(rmp::encode::write_uint(out, ENGINE_BLOCK as u64));
        put_str(out, "lora_id");
        put(rmp::encode::write_nil(out));
        put_str(out, "medium");
        put_str(out, "GPU");
        put_str(out, "lora_name");
        put(rmp::encode::write_nil(out));
        put_str(out, "extra_keys");
        put(rmp::encode::write_array_len(out, s.hashes.len() as u32));
        for _ in &s.hashes {
            put(rmp::encode::write_nil(out));
        }
        put_str(out, "group_idx");
        put(rmp::encode::write_uint(out, 0));
        put_str(out, "kv_cache_spec_kind");
        put_str(out, "full_attention");
    }
    put(rmp::encode::write_uint(out, 0));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace() -> EngineTrace {
        EngineTrace::new(vec![vec![0, 1, 2], vec![0, 1, 3], vec![0, 4], vec![5, 6]])
    }

    #[test]
    fn equal_ids_give_equal_tokens_and_chains() {
        let t = trace();
        assert_eq!(t.chains[0][..2], t.chains[1][..2]);
        assert_ne!(t.chains[0][2], t.chains[1][2]);
        assert_eq!(request_tokens(&[7])[..], request_tokens(&[7, 8])[..16]);
    }

    #[test]
    fn caches_reuse_prefixes_and_evict_tails_first() {
        let t = trace();
        let mut c = PodCaches::new(1, 4);
        let s = c.serve(&t, 0, 0);
        assert_eq!(s.stored.as_ref().map(|s| s.hashes.len()), Some(3));
        assert_eq!(s.stored.as_ref().and_then(|s| s.parent), None);
        // [0, 1] cached; block 3 needs no eviction (4 blocks fit).
        let s = c.serve(&t, 1, 0);
        assert!(s.removed.is_empty());
        let stored = s.stored.as_ref().map(|s| (s.parent, s.hashes.len()));
        assert_eq!(stored, Some((Some(t.chains[1][1]), 1)));
        // [0] cached, one new block: request 0's tail (block 2) goes first.
        let s = c.serve(&t, 2, 0);
        assert_eq!(s.removed, [t.chains[0][2]]);
        assert_eq!(c.held(), 4);
        let mut paths = c.held_paths(&t).remove(0);
        paths.sort_unstable();
        assert_eq!(paths, [(1, 2), (2, 1)]);
    }

    #[test]
    fn batches_decode_as_vllm_ones() {
        let t = trace();
        let mut c = PodCaches::new(1, 3);
        c.serve(&t, 0, 0);
        let s = c.serve(&t, 3, 0);
        assert_eq!(s.removed, [t.chains[0][2], t.chains[0][1]]);
        assert_eq!(s.block_ops(), 4);
        let mut bytes = Vec::new();
        encode_vllm_batch(&s, 1.5, &mut bytes);
        let limits = prefix_events::DecodeLimits::default();
        let batch = prefix_events::decode_batch(&bytes, &limits).expect("decodes");
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(batch.events.len(), 3);
        let prefix_events::Event::Stored(stored) = &batch.events[2] else {
            panic!("the store comes last: {:?}", batch.events[2]);
        };
        assert_eq!(stored.hashes, t.chains[3]);
        assert_eq!(stored.parent, None);
        assert_eq!(stored.tokens, request_tokens(&[5, 6]));
        assert_eq!(stored.medium.as_deref(), Some("GPU"));
    }
}
