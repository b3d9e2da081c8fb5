//! vLLM's own block extra keys for a set of requests:
//! `client/proto/testdata/vllm_extra_keys.json`, made from the vLLM 0.33.0
//! wheel by `gen_vllm_identity.py` beside it. The key rule's tests (the
//! gateways' side in `prefix-proto`, the events' side in the server) check
//! against it.

use std::path::Path;

use prefix_proto::key::{Identity, MmItem};
use serde::Deserialize;
use serde_json::Value;

/// One request, with vLLM's keys for each of its blocks.
#[derive(Debug, Clone, Deserialize)]
pub struct Case {
    /// What it exercises.
    pub name: String,
    /// Tokens per block.
    pub block_size: usize,
    /// Tokens in the request.
    pub num_tokens: usize,
    /// Its `cache_salt`.
    pub cache_salt: Option<String>,
    /// Its LoRA adapter.
    pub lora: Option<Lora>,
    /// Its multimodal items.
    pub mm_items: Vec<MmItem>,
    /// Its prompt-embeds digest per block, hex.
    pub prompt_embeds_digests: Option<Vec<String>>,
    /// vLLM's tagged keys per block (`generate_block_hash_extra_keys`):
    /// `["mm", id, offset]`, `["lora", name, path]`, `["cache_salt", s]`,
    /// `["prompt_embeds", {"hex": ...}]`.
    pub hash_keys: Vec<Option<Vec<Value>>>,
    /// What vLLM publishes per block (`to_event_extra_keys`): strings,
    /// `[id, offset]` pairs, `{"hex": ...}` for bytes.
    pub event_keys: Vec<Option<Vec<Value>>>,
}

/// A LoRA adapter.
#[derive(Debug, Clone, Deserialize)]
pub struct Lora {
    /// Its name: the model namespace.
    pub name: String,
    /// Its path (in vLLM's hash, not in its events).
    pub path: String,
}

impl Case {
    /// Full blocks of the request.
    pub fn blocks(&self) -> usize {
        self.num_tokens / self.block_size
    }

    /// The request's identity, as a gateway gives it.
    pub fn identity(&self) -> Identity {
        Identity {
            cache_salt: self.cache_salt.clone(),
            mm_items: self.mm_items.clone(),
            prompt_embeds: self
                .prompt_embeds_digests
                .as_ref()
                .map(|d| d.iter().map(|h| hex(h)).collect()),
        }
    }
}

/// Every case of the file.
pub fn cases() -> Vec<Case> {
    #[derive(Deserialize)]
    struct File {
        cases: Vec<Case>,
    }
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../client/proto/testdata/vllm_extra_keys.json");
    let file: File = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    file.cases
}

/// The bytes of a hex string.
pub fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// The batches vLLM's own publisher sent for a set of requests
/// (`server/tests/data/vllm_identity`, whose README says how they were
/// made): what precise mode and the routers' routes are checked against.
#[derive(Debug, Clone, Deserialize)]
pub struct Published {
    /// The requests, one engine each.
    pub cases: Vec<PublishedCase>,
    /// A hybrid model's two batches.
    pub hybrid: PublishedHybrid,
}

/// One request and the batch its engine published.
#[derive(Debug, Clone, Deserialize)]
pub struct PublishedCase {
    /// What it exercises.
    pub name: String,
    /// The batch's file ([`published_batch`]).
    pub file: String,
    /// Its token ids.
    pub tokens: Vec<u32>,
    /// Its `cache_salt`.
    pub cache_salt: Option<String>,
    /// Its multimodal items.
    pub mm_items: Vec<MmItem>,
    /// Its LoRA adapter's name.
    pub lora_name: Option<String>,
}

/// The hybrid scenario's two batches (see the fixtures' README).
#[derive(Debug, Clone, Deserialize)]
pub struct PublishedHybrid {
    /// The batch that stores the request's blocks.
    pub stored: String,
    /// The batch that evicts the window's blocks.
    pub evicted: String,
    /// The request's token ids.
    pub tokens: Vec<u32>,
}

fn published_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/vllm_identity")
}

/// The published requests.
pub fn published() -> Published {
    let text = std::fs::read_to_string(published_dir().join("cases.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

/// The bytes of the batch in `file`.
pub fn published_batch(file: &str) -> Vec<u8> {
    std::fs::read(published_dir().join(file)).unwrap()
}
