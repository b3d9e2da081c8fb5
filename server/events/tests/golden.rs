//! Golden vectors: payloads that msgspec encoded from the engines' own struct
//! definitions (vLLM 0.33 and older layouts, SGLang 0.5.23 and older layouts,
//! map-form batches), each beside the values it must decode to. The payloads
//! and the expected values come from `tests/data/make_vectors.py`, which says
//! where each layout comes from and how to regenerate them.

use std::fs;
use std::path::{Path, PathBuf};

use prefix_events::{decode_batch, Batch, DecodeLimits, Event, RawExtraKey, Removed, Stored};
use serde::Deserialize;

/// `NAME.json`, as the script writes it.
#[derive(Deserialize)]
struct Expected {
    engine: String,
    ts_bits: u64,
    data_parallel_rank: Option<u32>,
    unknown_events: u32,
    events: Vec<ExpectedEvent>,
}

/// One of a block's extra keys as the script writes it.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonKey {
    Text(String),
    Mm(String, i64),
    Bytes { hex: String },
}

impl From<JsonKey> for RawExtraKey {
    fn from(k: JsonKey) -> Self {
        match k {
            JsonKey::Text(t) => RawExtraKey::Text(t.into()),
            JsonKey::Mm(id, offset) => RawExtraKey::Mm {
                identifier: id.into_bytes().into(),
                offset,
            },
            JsonKey::Bytes { hex } => RawExtraKey::Bytes(
                (0..hex.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                    .collect(),
            ),
        }
    }
}

#[derive(Deserialize)]
enum ExpectedEvent {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: u32,
        lora_name: Option<String>,
        medium: Option<String>,
        cache_salt: Option<String>,
        extra_keys: Vec<Option<Vec<JsonKey>>>,
        lookahead: bool,
        #[serde(default)]
        group: Option<u32>,
        #[serde(default)]
        group_kind: Option<String>,
        #[serde(default)]
        sliding_window: Option<u32>,
    },
    Removed {
        hashes: Vec<u64>,
        medium: Option<String>,
        #[serde(default)]
        group: Option<u32>,
    },
    Cleared,
}

impl From<ExpectedEvent> for Event {
    fn from(e: ExpectedEvent) -> Self {
        match e {
            ExpectedEvent::Stored {
                hashes,
                parent,
                tokens,
                block_size,
                lora_name,
                medium,
                cache_salt,
                extra_keys,
                lookahead,
                group,
                group_kind,
                sliding_window,
            } => Event::Stored(Stored {
                hashes,
                parent,
                tokens,
                block_size,
                lora_name: lora_name.map(Into::into),
                medium: medium.map(Into::into),
                cache_salt: cache_salt.map(Into::into),
                extra_keys: extra_keys
                    .into_iter()
                    .map(|b| b.map(|keys| keys.into_iter().map(RawExtraKey::from).collect()))
                    .collect(),
                lookahead,
                group,
                group_kind: group_kind.map(Into::into),
                sliding_window,
            }),
            ExpectedEvent::Removed {
                hashes,
                medium,
                group,
            } => Event::Removed(Removed {
                hashes: hashes.into(),
                medium: medium.map(Into::into),
                group,
            }),
            ExpectedEvent::Cleared => Event::Cleared,
        }
    }
}

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data")
}

/// Every `NAME.msgpack` in `tests/data`, with its name.
fn vectors() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = fs::read_dir(data_dir())
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "msgpack"))
        .map(|path| {
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&path).unwrap())
        })
        .collect();
    out.sort();
    out
}

#[test]
fn every_vector_decodes_to_its_expected_values() {
    let vectors = vectors();
    assert!(vectors.len() >= 11, "only {} vectors found", vectors.len());
    for (name, payload) in vectors {
        let json = fs::read_to_string(data_dir().join(format!("{name}.json"))).unwrap();
        let expected: Expected = serde_json::from_str(&json).unwrap();
        let want = Batch {
            ts: f64::from_bits(expected.ts_bits),
            events: expected.events.into_iter().map(Event::from).collect(),
            data_parallel_rank: expected.data_parallel_rank,
            unknown_events: expected.unknown_events,
            bad: None,
        };
        let got = decode_batch(&payload, &DecodeLimits::default())
            .unwrap_or_else(|e| panic!("{name} ({}): {e}", expected.engine));
        assert_eq!(got.ts.to_bits(), expected.ts_bits, "{name}: ts");
        assert_eq!(got, want, "{name} ({})", expected.engine);
    }
}

/// The vectors cover what the brief for this crate asks of them; a vector
/// set regenerated without one of these cases fails here.
#[test]
fn the_vectors_cover_every_case() {
    let mut all = Vec::new();
    for (name, payload) in vectors() {
        let batch = decode_batch(&payload, &DecodeLimits::default()).unwrap();
        all.push((name, batch));
    }
    let events = || all.iter().flat_map(|(_, b)| &b.events);
    let stored = || {
        events().filter_map(|e| match e {
            Event::Stored(s) => Some(s),
            _ => None,
        })
    };
    let hashes = || {
        events().flat_map(|e| match e {
            Event::Stored(s) => s.hashes.clone(),
            Event::Removed(r) => r.hashes.to_vec(),
            Event::Cleared => Vec::new(),
        })
    };
    assert!(hashes().any(|h| h >= 1 << 63), "a hash ≥ 2^63");
    assert!(stored().any(|s| s.parent.is_none()), "a nil parent");
    assert!(stored().any(|s| s.parent.is_some()), "a parent");
    assert!(stored().any(|s| s.lora_name.is_some()), "a LoRA name");
    assert!(
        stored().any(|s| s.medium.as_deref().is_some_and(|m| m != "GPU")),
        "a non-GPU medium"
    );
    assert!(
        events().any(|e| matches!(e, Event::Cleared)),
        "AllBlocksCleared"
    );
    assert!(
        all.iter().any(|(_, b)| b.unknown_events > 0),
        "an unknown event"
    );
    assert!(
        all.iter().any(|(_, b)| b.data_parallel_rank.is_none()),
        "no rank"
    );
    let names: Vec<&str> = all.iter().map(|(n, _)| n.as_str()).collect();
    for name in [
        "vllm_0_33_int_hashes",
        "vllm_0_33_sha256_bytes",
        "vllm_0_33_xxhash_bytes",
        "vllm_oldest",
        "sglang_0_5_23",
        "map_batch_vllm",
    ] {
        assert!(names.contains(&name), "{name} missing");
    }
}
