//! Batches encoded the way vLLM 0.33's publisher encodes them (a positional
//! batch of tagged-map events, `docs/events.md`): what a simulated engine
//! sends. The load tester replays traces as engine events with it, the
//! benchmarks feed decoders with it, and the tests play engines with it;
//! `decode_batch` reads back exactly what it writes.

use rmp::encode as enc;

use crate::batch::{Batch, Event, Removed, Stored};

/// The msgpack payload of `batch`.
pub fn encode_batch(batch: &Batch) -> Vec<u8> {
    let mut out = Vec::new();
    // Writing into a Vec cannot fail: every `write_*` below is infallible
    // here, so their results are dropped.
    let _ = enc::write_array_len(&mut out, 3);
    let _ = enc::write_f64(&mut out, batch.ts);
    let _ = enc::write_array_len(&mut out, batch.events.len() as u32);
    for event in &batch.events {
        match event {
            Event::Stored(s) => stored(&mut out, s),
            Event::Removed(r) => removed(&mut out, r),
            Event::Cleared => {
                let _ = enc::write_map_len(&mut out, 1);
                kv(&mut out, "type", "AllBlocksCleared");
            }
        }
    }
    match batch.data_parallel_rank {
        Some(rank) => {
            let _ = enc::write_uint(&mut out, u64::from(rank));
        }
        None => {
            let _ = enc::write_nil(&mut out);
        }
    }
    out
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

fn stored(out: &mut Vec<u8>, s: &Stored) {
    let _ = enc::write_map_len(out, 8);
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
}

fn removed(out: &mut Vec<u8>, r: &Removed) {
    let _ = enc::write_map_len(out, 3);
    kv(out, "type", "BlockRemoved");
    hashes(out, &r.hashes);
    opt_str(out, "medium", r.medium.as_deref());
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
                }),
                Event::Removed(Removed {
                    hashes: [7].into(),
                    medium: None,
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
}
