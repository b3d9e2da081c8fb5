//! Engine events on the wire, as vLLM 0.33 publishes them: a msgpack batch
//! `[ts, [event maps], data_parallel_rank]` (msgspec's `array_like` batch of
//! `type`-tagged event maps), sent as the multipart message `[topic, seq
//! (8 bytes big-endian), payload]`; replays answer `["", topic, seq,
//! payload]` per batch and end with sequence `u64::MAX` and an empty
//! payload (`docs/events.md`, "Formats accepted").

use crate::simulate::precise::{Event, BLOCK_TOKENS};

/// One batch of events, encoded as vLLM 0.33 does (by
/// `prefix_events::encode_batch`), dated `ts` (seconds since the Unix epoch).
pub fn encode_batch(ts: f64, events: &[Event], out: &mut Vec<u8>) {
    let gpu = || Some("GPU".into());
    let events = events
        .iter()
        .map(|e| match e {
            Event::Stored {
                parent,
                hashes,
                tokens,
            } => prefix_events::Event::Stored(prefix_events::Stored {
                hashes: hashes.clone(),
                parent: *parent,
                tokens: tokens.clone(),
                block_size: BLOCK_TOKENS as u32,
                lora_name: None,
                medium: gpu(),
            }),
            Event::Removed { hash } => prefix_events::Event::Removed(prefix_events::Removed {
                hashes: [*hash].into(),
                medium: gpu(),
            }),
        })
        .collect();
    let batch = prefix_events::Batch {
        ts,
        events,
        data_parallel_rank: Some(0),
        unknown_events: 0,
        bad: None,
    };
    out.extend_from_slice(&prefix_events::encode_batch(&batch));
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_events::{decode_batch, DecodeLimits, Event as Decoded, Removed, Stored};

    #[test]
    fn batches_decode_as_the_server_decodes_them() {
        let tokens: Vec<u32> = (0..2 * BLOCK_TOKENS as u32).map(|t| t * 7_919).collect();
        let events = [
            Event::Stored {
                parent: None,
                hashes: vec![u64::MAX - 1, 5],
                tokens: tokens.clone(),
            },
            Event::Stored {
                parent: Some(5),
                hashes: vec![9],
                tokens: tokens[..BLOCK_TOKENS].to_vec(),
            },
            Event::Removed { hash: 1 << 63 },
        ];
        let mut payload = Vec::new();
        encode_batch(1.8e9, &events, &mut payload);
        let batch = decode_batch(&payload, &DecodeLimits::default()).unwrap();
        assert_eq!(batch.ts, 1.8e9);
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(batch.unknown_events, 0);
        let stored = |parent, hashes: Vec<u64>, tokens: Vec<u32>| {
            Decoded::Stored(Stored {
                hashes,
                parent,
                tokens,
                block_size: BLOCK_TOKENS as u32,
                lora_name: None,
                medium: Some("GPU".into()),
            })
        };
        assert_eq!(
            batch.events,
            [
                stored(None, vec![u64::MAX - 1, 5], tokens.clone()),
                stored(Some(5), vec![9], tokens[..BLOCK_TOKENS].to_vec()),
                Decoded::Removed(Removed {
                    hashes: [1 << 63].into(),
                    medium: Some("GPU".into()),
                }),
            ]
        );
    }
}
