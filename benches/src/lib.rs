//! Workloads and baselines shared by the benchmarks in `benches/`.
//!
//! - [`ChatWorkload`]: 50 shared system prompts of 500 B to 8 KB, conversations
//!   that grow turn by turn, each conversation served by one of 16 pods; the
//!   block-hash keys, and optionally the texts (for text-keyed trees).
//! - [`mooncake`]: the production trace of `../shared/traces/`, whose
//!   `hash_ids` are ready-made keys.
//! - [`RwLockIndex`]: the per-gateway index design we replace: a map from the
//!   chained hash of each prefix to its pods, behind one read-write lock.
//! - [`engine_events`]: the precise-mode benchmark's workload (the Mooncake
//!   trace as engine KV-cache events, served by `engine_sim`'s simulated
//!   pods, and vLLM's msgpack form of them), our index's
//!   rows, and a [`engine_events::Peer`] for another index's rows beside
//!   them (NVIDIA Dynamo's, in the workspace `benches/dynamo/`).

use std::collections::HashMap;
use std::io::BufRead;
use std::path::Path;

use parking_lot::RwLock;
use prefix_proto::key;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smallvec::SmallVec;

pub mod engine_events;

/// Pods in every workload.
pub const PODS: usize = 16;

/// The pod names used by every workload.
pub fn pod_names() -> Vec<String> {
    (0..PODS).map(|i| format!("pod-{i:02}")).collect()
}

fn random_text(rng: &mut StdRng, len: usize) -> String {
    const WORDS: [&str; 16] = [
        "the ",
        "model ",
        "cache ",
        "prefix ",
        "token ",
        "route ",
        "gateway ",
        "pod ",
        "answer ",
        "question ",
        "system ",
        "user ",
        "block ",
        "hash ",
        "tree ",
        "epoch ",
    ];
    let mut s = String::with_capacity(len + 16);
    while s.len() < len {
        s.push_str(WORDS[rng.random_range(0..WORDS.len())]);
        if rng.random_bool(0.1) {
            s.push_str(&rng.random::<u32>().to_string());
        }
    }
    s.truncate(len);
    s
}

/// One conversation turn: the whole prompt so far and its key.
pub struct Prompt {
    /// The prompt text (system prompt plus every turn so far); empty unless the
    /// workload was built with texts.
    pub text: String,
    /// Its block hashes (64-byte blocks).
    pub key: Vec<u64>,
    /// The pod serving the conversation.
    pub pod: usize,
}

/// The synthetic chat workload.
pub struct ChatWorkload {
    /// Every turn of every conversation, in insertion order.
    pub prompts: Vec<Prompt>,
}

impl ChatWorkload {
    /// `conversations` conversations over 50 system prompts, 1 to 6 turns of
    /// 200 B to 4 KB each; `texts` keeps each prompt's text (for text-keyed
    /// structures), which costs gigabytes at 100,000 conversations.
    pub fn new(conversations: usize, seed: u64, texts: bool) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let systems: Vec<String> = (0..50)
            .map(|_| {
                let len = rng.random_range(500..8_000);
                random_text(&mut rng, len)
            })
            .collect();
        let mut prompts = Vec::new();
        for c in 0..conversations {
            // Popular system prompts are shared by more conversations.
            let sys = (rng.random::<f64>().powi(2) * systems.len() as f64) as usize;
            let mut text = systems[sys].clone();
            for _ in 0..rng.random_range(1..=6) {
                let len = rng.random_range(200..4_000);
                text.push_str(&random_text(&mut rng, len));
                prompts.push(Prompt {
                    key: key::text_key(&text, key::TEXT_BLOCK_BYTES),
                    text: if texts { text.clone() } else { String::new() },
                    pod: c % PODS,
                });
            }
        }
        ChatWorkload { prompts }
    }

    /// Keys cut to exactly `blocks` blocks, from prompts at least that long.
    pub fn keys_of_len(&self, blocks: usize, count: usize) -> Vec<Vec<u64>> {
        self.prompts
            .iter()
            .filter(|p| p.key.len() >= blocks)
            .map(|p| p.key[..blocks].to_vec())
            .take(count)
            .collect()
    }
}

/// One Mooncake trace request: arrival (ms) and its block-hash key.
pub struct TraceRequest {
    /// Arrival time, ms from the trace start.
    pub timestamp: u64,
    /// The `hash_ids`.
    pub key: Vec<u64>,
}

/// Loads the Mooncake trace (JSON Lines with integer fields only).
pub fn mooncake(path: &Path) -> std::io::Result<Vec<TraceRequest>> {
    let file = std::fs::File::open(path)?;
    let mut out = Vec::new();
    for line in std::io::BufReader::new(file).lines() {
        let line = line?;
        let field = |name: &str| {
            line.split(&format!("\"{name}\":"))
                .nth(1)
                .map(str::to_owned)
        };
        let (Some(ts), Some(ids)) = (field("timestamp"), field("hash_ids")) else {
            continue;
        };
        let timestamp = ts
            .split([',', '}'])
            .next()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        let ids = ids
            .split('[')
            .nth(1)
            .and_then(|s| s.split(']').next())
            .unwrap_or("");
        let key = ids
            .split(',')
            .filter_map(|s| s.trim().parse().ok())
            .collect();
        out.push(TraceRequest { timestamp, key });
    }
    Ok(out)
}

/// The trace shipped with the project, relative to the workspace.
pub fn mooncake_path() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/traces/mooncake_conversation.jsonl")
}

/// The baseline: chained prefix hashes → pods, under one `RwLock`, as in a
/// per-replica gateway index. A lookup read-locks once and probes the map
/// block by block.
#[derive(Default)]
pub struct RwLockIndex {
    map: RwLock<HashMap<u64, SmallVec<[u16; 4]>, ahash::RandomState>>,
}

/// The hash of a prefix: the hash of the prefix before it chained with
/// its last block's hash.
fn prefix_hash(prev: u64, block: u64) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(&block.to_le_bytes(), prev)
}

impl RwLockIndex {
    /// Records that `pod` holds every prefix of `key`.
    pub fn insert(&self, key: &[u64], pod: u16) {
        let mut map = self.map.write();
        let mut h = 0;
        for &b in key {
            h = prefix_hash(h, b);
            let pods = map.entry(h).or_default();
            if !pods.contains(&pod) {
                pods.push(pod);
            }
        }
    }

    /// Each pod's matched leading blocks, sorted by blocks descending.
    pub fn lookup(&self, key: &[u64]) -> SmallVec<[(u16, u32); 16]> {
        let map = self.map.read();
        let mut out: SmallVec<[(u16, u32); 16]> = SmallVec::new();
        let mut h = 0;
        for (i, &b) in key.iter().enumerate() {
            h = prefix_hash(h, b);
            let Some(pods) = map.get(&h) else { break };
            for &p in pods {
                match out.iter_mut().find(|e| e.0 == p) {
                    Some(e) => e.1 = i as u32 + 1,
                    None => out.push((p, i as u32 + 1)),
                }
            }
        }
        out.sort_unstable_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }
}
