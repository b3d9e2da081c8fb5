//! Batches encoded the way vLLM 0.33's publisher encodes them (a positional
//! batch of tagged-map events, `docs/events.md`): what a simulated engine
//! sends. The load tester replays traces as engine events with it, the
//! benchmarks feed decoders with it, and the tests play engines with it;
//! `decode_batch` reads back exactly what it writes, in either [`Layout`].

use rmp::encode as enc;

use crate::batch::{Batch, Event, RawExtraKey, Removed, Stored};

/// Which fields the events carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// The fields vLLM always sends: a `BlockStored` of `type` and its 7
    /// required fields, a `BlockRemoved` of `type`, `block_hashes` and
    /// `medium`, each under the smallest map header.
    Required,
    /// Every field vLLM 0.33's GPU block pool sets
    /// (`shared/engines/vllm-kv-events.md`, §4 and §7): a `BlockStored`
    /// also has `extra_keys` (a nil per block), `group_idx` (0 unless the
    /// store names another) and `kv_cache_spec_kind` (`"full_attention"`
    /// unless it names another), under msgspec's `map16` header; a
    /// `BlockRemoved` also has `group_idx`.
    GpuPool,
}

/// The optional fields a store carries beyond its layout's: `extra_keys`
/// when some block has keys, `group_idx` and `kv_cache_spec_kind` when set
/// (in [`Layout::Required`]; the GPU pool's layout always has them),
/// `kv_cache_spec_sliding_window`, `cache_salt` (SGLang's) and
/// `lookahead_token_ids` (an empty list per block).
fn optional_fields(s: &Stored, layout: Layout) -> u32 {
    let required = layout == Layout::Required;
    u32::from(required && !s.extra_keys.is_empty())
        + u32::from(required && s.group.is_some())
        + u32::from(required && s.group_kind.is_some())
        + u32::from(s.sliding_window.is_some())
        + u32::from(s.cache_salt.is_some())
        + u32::from(s.lookahead)
}

/// The msgpack payload of `batch`, in [`Layout::Required`].
pub fn encode_batch(batch: &Batch) -> Vec<u8> {
    let mut out = Vec::new();
    encode_batch_into(batch, Layout::Required, &mut out);
    out
}

/// Appends the msgpack payload of `batch` in `layout` to `out`.
pub fn encode_batch_into(batch: &Batch, layout: Layout, out: &mut Vec<u8>) {
    // Writing into a Vec cannot fail: every `write_*` below is infallible
    // here, so their results are dropped.
    let _ = enc::write_array_len(out, 3);
    let _ = enc::write_f64(out, batch.ts);
    let _ = enc::write_array_len(out, batch.events.len() as u32);
    for event in &batch.events {
        match event {
            Event::Stored(s) => stored(out, s, layout),
            Event::Removed(r) => removed(out, r, layout),
            Event::Cleared => {
                let _ = enc::write_map_len(out, 1);
                kv(out, "type", "AllBlocksCleared");
            }
        }
    }
    match batch.data_parallel_rank {
        Some(rank) => {
            let _ = enc::write_uint(out, u64::from(rank));
        }
        None => {
            let _ = enc::write_nil(out);
        }
    }
}

fn kv(out: &mut Vec<u8>, key: &str, value: &str) {
    let _ = enc::write_str(out, key);
    let _ = enc::write_str(out, value);
}

fn opt_str(out: &mut Vec<u8>, key: &str, value: Option<&str>) {
    let _ = enc::write_str(out, key);
    match value {
        Some(v) => {
            let _ = enc::write_str(out, v);
        }
        None => {
            let _ = enc::write_nil(out);
        }
    }
}

fn hashes(out: &mut Vec<u8>, hashes: &[u64]) {
    let _ = enc::write_str(out, "block_hashes");
    let _ = enc::write_array_len(out, hashes.len() as u32);
    for &h in hashes {
        let _ = enc::write_uint(out, h);
    }
}

fn stored(out: &mut Vec<u8>, s: &Stored, layout: Layout) {
    let more = optional_fields(s, layout);
    match layout {
        Layout::Required => {
            let _ = enc::write_map_len(out, 8 + more);
        }
        // msgspec writes a map16 header even for a map a fixmap holds.
        Layout::GpuPool => {
            out.push(0xde);
            out.extend_from_slice(&(0x0b + more as u16).to_be_bytes());
        }
    }
    kv(out, "type", "BlockStored");
    hashes(out, &s.hashes);
    let _ = enc::write_str(out, "parent_block_hash");
    match s.parent {
        Some(p) => {
            let _ = enc::write_uint(out, p);
        }
        None => {
            let _ = enc::write_nil(out);
        }
    }
    let _ = enc::write_str(out, "token_ids");
    let _ = enc::write_array_len(out, s.tokens.len() as u32);
    for &t in &s.tokens {
        let _ = enc::write_uint(out, u64::from(t));
    }
    let _ = enc::write_str(out, "block_size");
    let _ = enc::write_uint(out, u64::from(s.block_size));
    let _ = enc::write_str(out, "lora_id");
    let _ = enc::write_nil(out);
    opt_str(out, "medium", s.medium.as_deref());
    opt_str(out, "lora_name", s.lora_name.as_deref());
    if layout == Layout::GpuPool || !s.extra_keys.is_empty() {
        extra_keys(out, s);
    }
    match layout {
        Layout::GpuPool => {
            group_idx(out, s.group.unwrap_or(0));
            let kind = s.group_kind.as_deref().unwrap_or("full_attention");
            kv(out, "kv_cache_spec_kind", kind);
        }
        Layout::Required => {
            if let Some(g) = s.group {
                group_idx(out, g);
            }
            if let Some(kind) = &s.group_kind {
                kv(out, "kv_cache_spec_kind", kind);
            }
        }
    }
    if let Some(w) = s.sliding_window {
        let _ = enc::write_str(out, "kv_cache_spec_sliding_window");
        let _ = enc::write_uint(out, u64::from(w));
    }
    if let Some(salt) = &s.cache_salt {
        kv(out, "cache_salt", salt);
    }
    if s.lookahead {
        let _ = enc::write_str(out, "lookahead_token_ids");
        let _ = enc::write_array_len(out, s.hashes.len() as u32);
        for _ in &s.hashes {
            let _ = enc::write_array_len(out, 0);
        }
    }
}

/// `extra_keys`: each block's keys, nil for a block without (every block
/// when the store has none).
fn extra_keys(out: &mut Vec<u8>, s: &Stored) {
    let _ = enc::write_str(out, "extra_keys");
    let _ = enc::write_array_len(out, s.hashes.len() as u32);
    for i in 0..s.hashes.len() {
        let Some(Some(keys)) = s.extra_keys.get(i) else {
            let _ = enc::write_nil(out);
            continue;
        };
        let _ = enc::write_array_len(out, keys.len() as u32);
        for key in keys.iter() {
            match key {
                RawExtraKey::Text(t) => {
                    let _ = enc::write_str(out, t);
                }
                RawExtraKey::Mm { identifier, offset } => {
                    let _ = enc::write_array_len(out, 2);
                    match std::str::from_utf8(identifier) {
                        Ok(id) => {
                            let _ = enc::write_str(out, id);
                        }
                        Err(_) => {
                            let _ = enc::write_bin(out, identifier);
                        }
                    }
                    let _ = enc::write_sint(out, *offset);
                }
                RawExtraKey::Bytes(b) => {
                    let _ = enc::write_bin(out, b);
                }
                // A shape no engine sends.
                RawExtraKey::Unknown => {
                    let _ = enc::write_f64(out, 0.0);
                }
            }
        }
    }
}

fn removed(out: &mut Vec<u8>, r: &Removed, layout: Layout) {
    let group = match layout {
        Layout::Required => r.group,
        Layout::GpuPool => Some(r.group.unwrap_or(0)),
    };
    let _ = enc::write_map_len(out, 3 + u32::from(group.is_some()));
    kv(out, "type", "BlockRemoved");
    hashes(out, &r.hashes);
    opt_str(out, "medium", r.medium.as_deref());
    if let Some(g) = group {
        group_idx(out, g);
    }
}

/// A KV-cache group's index.
fn group_idx(out: &mut Vec<u8>, group: u32) {
    let _ = enc::write_str(out, "group_idx");
    let _ = enc::write_uint(out, u64::from(group));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{decode_batch, DecodeLimits};

    #[test]
    fn what_is_encoded_decodes_back() {
        let batch = Batch {
            ts: 1_796_049_997.5,
            events: vec![
                Event::Stored(Stored {
                    hashes: vec![u64::MAX, 7],
                    parent: Some(3),
                    tokens: (0..32).collect(),
                    block_size: 16,
                    lora_name: Some("sql".into()),
                    medium: Some("GPU".into()),
                    ..Default::default()
                }),
                Event::Removed(Removed {
                    hashes: [7].into(),
                    medium: None,
                    group: Some(1),
                }),
                Event::Stored(Stored {
                    hashes: vec![9],
                    tokens: (0..16).collect(),
                    block_size: 16,
                    group: Some(1),
                    group_kind: Some("sliding_window".into()),
                    sliding_window: Some(128),
                    ..Default::default()
                }),
                Event::Cleared,
            ],
            data_parallel_rank: Some(2),
            unknown_events: 0,
            bad: None,
        };
        let bytes = encode_batch(&batch);
        assert_eq!(
            decode_batch(&bytes, &DecodeLimits::default()).unwrap(),
            batch
        );
    }

    #[test]
    fn the_layout_is_vllms() {
        // The doc's real AllBlocksCleared batch, byte for byte.
        let batch = Batch {
            ts: f64::from_bits(0x41da_c362_e585_d5ce),
            events: vec![Event::Cleared],
            data_parallel_rank: Some(0),
            unknown_events: 0,
            bad: None,
        };
        let real =
            b"\x93\xcb\x41\xda\xc3\x62\xe5\x85\xd5\xce\x91\x81\xa4type\xb0AllBlocksCleared\x00";
        assert_eq!(encode_batch(&batch), real);
    }

    #[test]
    fn the_gpu_pools_layout_is_vllms() {
        // The real BlockStored batch of `shared/engines/vllm-kv-events.md`,
        // §7, byte for byte: decoded, then written again.
        let real: Vec<u8> = concat!(
            "93cb41dac3631363774591de000ba474797065ab426c6f636b53746f726564ac",
            "626c6f636b5f68617368657393cf5896a494c10f45aacf1b21f7b4efbb2c06cf",
            "84b82a066b9279f6b1706172656e745f626c6f636b5f68617368c0a9746f6b65",
            "6e5f696473dc0030cd1133cd48dccd6c79cd66b1cd61c4cd0814cd20a7cd0f18",
            "cd3f6bcd6168cd3989cd3c73cd5368cd3098cd64f5cd1ae0cd0c04cd3e73cd03",
            "a1cd7259cd6afbcd31e6cd3765cd4dc1cd6193cd623346cd5912cd3903cd2218",
            "cd5c5ccd66a3cd1d49cd4babcd78ffcd0d16cd7362cd28a2cd03ebcd02dccd0b",
            "12cd3830cd54f7cd4115cd0dd1cd63a5cd14f5cd42afaa626c6f636b5f73697a",
            "6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65",
            "c0aa65787472615f6b65797393c0c0c0a967726f75705f69647800b26b765f63",
            "616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00",
        )
        .as_bytes()
        .chunks(2)
        .map(|h| u8::from_str_radix(std::str::from_utf8(h).unwrap(), 16).unwrap())
        .collect();
        let batch = decode_batch(&real, &DecodeLimits::default()).unwrap();
        let mut out = Vec::new();
        encode_batch_into(&batch, Layout::GpuPool, &mut out);
        assert_eq!(out, real);
    }
}
