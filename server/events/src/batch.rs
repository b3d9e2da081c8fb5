//! Payload decoding: one msgpack `KVEventBatch` in, a [`Batch`] out.
//!
//! # The layouts accepted
//!
//! Engines encode with msgspec, and the layout has changed over versions;
//! [`decode_batch`] accepts every form below in any combination.
//!
//! * Batch: an array `[ts, events, data_parallel_rank]` (vLLM and SGLang
//!   today: `array_like=True`; SGLang names the third field `attn_dp_rank`),
//!   or `[ts, events]` (older versions, no rank). Extra trailing elements are
//!   ignored, as msgspec's decoder ignores them. A map `{ts, events,
//!   data_parallel_rank | attn_dp_rank}` is accepted too, unknown keys
//!   ignored; no engine version sends one, it is what the same structs give
//!   without `array_like`.
//! * Event: a map tagged by its `"type"` key (vLLM 0.33, and since about
//!   0.26 by third-party reports; SGLang 0.5.23), with named fields, in any
//!   key order; unknown keys are skipped and absent optional fields read as
//!   `None`. Or an array with the tag first (older vLLM and SGLang):
//!   `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
//!   lora_id, medium, lora_name, ...]`, `["BlockRemoved", block_hashes,
//!   medium, ...]`, `["AllBlocksCleared"]`; positions past `block_size` (past
//!   `block_hashes`) may be absent, and positions past the ones read are
//!   skipped. SGLang's `BlockStoredWithMetadata` puts a `{cache_salt}` map at
//!   position 7 where vLLM has `lora_name`: a map there is skipped.
//! * An event whose type is unknown (either form) is skipped and counted in
//!   [`Batch::unknown_events`]; the rest of the batch decodes.
//! * Block hashes: an unsigned int (vLLM: the last 8 bytes of the digest,
//!   often ≥ 2^63), a signed int (SGLang: an int64, taken as its two's
//!   complement bits), or bytes (vLLM with
//!   `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`: the whole 32- or 16-byte digest,
//!   of which the last 8 bytes, big-endian, are the hash vLLM would have sent
//!   as an int).
//! * Token ids: ints from 0 to `u32::MAX`. SGLang's EAGLE "bigram" radix
//!   keys publish `[token, next_token]` pairs instead (its own typed decoder
//!   cannot read them back); a pair reads as its first token, the prompt's
//!   token at that position.
//! * msgpack need not be minimal: msgspec writes `map16` headers for small
//!   maps and mixes int widths in one array.
//!
//! # Cost
//!
//! One pass over the payload (map-form events: two over their fields), no
//! recursion beyond the fixed nesting of the format, and no allocation
//! larger than a small multiple of the payload: a declared length reserves at
//! most what the bytes left could hold, and [`DecodeLimits`] caps each list.

mod error;
mod event;
mod extra;
#[cfg(test)]
mod testing;

use compact_str::CompactString;
use smallvec::SmallVec;

use crate::msgpack::{Reader, Shape};
pub use error::{DecodeError, Location};

/// One batch of KV-cache events, as one engine (one data-parallel rank)
/// published it for one scheduler step.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// The engine's wall clock when it built the batch, in seconds since the
    /// Unix epoch (Python's `time.time()`).
    pub ts: f64,
    /// The events, in the engine's order; the order matters (a block can be
    /// removed and stored again within one batch).
    pub events: Vec<Event>,
    /// The engine's data-parallel rank: each rank has its own KV cache.
    /// `None` when the batch has no rank (older engines, or nil).
    pub data_parallel_rank: Option<u32>,
    /// Events of a type this crate does not know, skipped. Non-zero means
    /// the engine is newer than this decoder; the known events still apply.
    pub unknown_events: u32,
    /// Events that did not decode, skipped alone (see [`DecodeError`]):
    /// how many, and why the first did not. `None` when all decoded.
    pub bad: Option<BadEvents>,
}

/// The events of a batch that did not decode.
#[derive(Debug, Clone, PartialEq)]
pub struct BadEvents {
    /// How many were skipped.
    pub count: u32,
    /// Why the first of them did not decode.
    pub first: DecodeError,
}

/// One change to an engine's KV cache.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// Blocks were cached (`BlockStored`).
    Stored(Stored),
    /// Blocks were evicted (`BlockRemoved`).
    Removed(Removed),
    /// The engine's whole cache was emptied (`AllBlocksCleared`).
    Cleared,
}

/// `BlockStored`: a run of consecutive blocks of one sequence was cached.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    /// The engine's block hashes, in sequence order.
    pub hashes: Vec<u64>,
    /// The hash of the block before `hashes[0]`; `None` when `hashes[0]` is
    /// the sequence's first block (nil on the wire), or the field is absent.
    pub parent: Option<u64>,
    /// The token ids of the blocks, concatenated: normally
    /// `hashes.len() * block_size` of them (SGLang's last page of a radix
    /// node can be shorter).
    pub tokens: Vec<u32>,
    /// Tokens per block (vLLM: 16 by default; SGLang: the page size, 1 by
    /// default).
    pub block_size: u32,
    /// The LoRA adapter the blocks were computed with; `None` for the base
    /// model (nil or absent).
    pub lora_name: Option<CompactString>,
    /// The storage tier: vLLM `"GPU"`, `"CPU"`, `"STORAGE"`; SGLang `"GPU"`,
    /// `"CPU_PINNED"`, `"DISK"`, `"EXTERNAL"`. `None` when nil or absent
    /// (older engines: the GPU). A name of up to 24 bytes is held inline
    /// (a payload carries one for every event).
    pub medium: Option<CompactString>,
    /// Each block's extra keys (vLLM's `extra_keys`, see [`RawExtraKey`]),
    /// one entry per block, `None` for a block without any. Empty when the
    /// event has none at all (absent, nil, or nil for every block), as for
    /// every plain-text request, so those cost no allocation.
    pub extra_keys: Vec<Option<Box<[RawExtraKey]>>>,
    /// SGLang's `cache_salt` (a field of its `BlockStored`, or in the
    /// metadata map of its older `BlockStoredWithMetadata`): the request's
    /// salt, by which SGLang namespaces the hashes. `None` when nil or
    /// absent.
    pub cache_salt: Option<CompactString>,
    /// Whether the blocks were hashed with lookahead tokens (vLLM's
    /// `lookahead_token_ids` not nil): the engine reuses such a block only
    /// when those tokens follow it.
    pub lookahead: bool,
    /// The KV-cache group that stored the blocks (vLLM's `group_idx`):
    /// hybrid models keep one group per attention kind. `None` when nil or
    /// absent (SGLang, older vLLM): group 0.
    pub group: Option<u32>,
    /// The group's kind (`kv_cache_spec_kind`): `"full_attention"`,
    /// `"sliding_window"`, `"mamba"`... `None` when nil or absent.
    pub group_kind: Option<CompactString>,
    /// A sliding-window group's window in tokens
    /// (`kv_cache_spec_sliding_window`); `None` when nil or absent.
    pub sliding_window: Option<u32>,
}

/// One of a block's extra keys as vLLM publishes it, untagged (its
/// `to_event_extra_keys`): in order, the LoRA name (when the event has
/// `lora_name`), the multimodal items, the cache salt (first block only)
/// and the prompt-embeds digest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RawExtraKey {
    /// A string: the LoRA name, or the cache salt.
    Text(CompactString),
    /// An `(identifier, offset)` pair: a multimodal item overlapping the
    /// block, `offset` tokens from the block's start (negative when it
    /// started in an earlier block).
    Mm {
        /// The item's identifier (a string's bytes, or bytes).
        identifier: Box<[u8]>,
        /// Its offset relative to the block's start.
        offset: i64,
    },
    /// Bytes: a prompt-embeds digest.
    Bytes(Box<[u8]>),
    /// Any other shape (a float, a map, a pair of other types...): the
    /// block's identity cannot be told, so it must match no key.
    Unknown,
}

/// `BlockRemoved`: blocks were evicted.
#[derive(Debug, Clone, PartialEq)]
pub struct Removed {
    /// The evicted blocks' hashes. vLLM's GPU pool sends one per event, and
    /// a third of a busy engine's block operations are such events: one
    /// hash is held inline.
    pub hashes: SmallVec<[u64; 1]>,
    /// The storage tier they left, as in [`Stored::medium`].
    pub medium: Option<CompactString>,
    /// The KV-cache group they left, as in [`Stored::group`].
    pub group: Option<u32>,
}

/// Caps on what one payload may declare, so a hostile or broken publisher
/// cannot make the decoder do work or hold memory out of proportion to what
/// the index will use. Memory is already bounded by the payload's size (a
/// list reserves no more elements than bytes are left); these caps bound it
/// below what a large ZeroMQ message would allow. A payload over
/// `max_events` is refused whole with [`DecodeError::Limit`]; an event over
/// `max_hashes` or `max_tokens` is skipped alone ([`Batch::bad`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Events in one batch (unknown ones included).
    ///
    /// Default 65,536: a batch is one scheduler step. vLLM sends one
    /// `BlockStored` per request scheduled in the step (`max_num_seqs`, 256
    /// to 1,024 by default) and one `BlockRemoved` per evicted block (a step
    /// that admits a 128k-token prompt at 16 tokens a block evicts up to
    /// 8,192 blocks); SGLang merges runs of events. 65,536 is 8 × that step,
    /// about 8 MiB of decoded events.
    pub max_events: usize,
    /// Block hashes in one event.
    ///
    /// Default 1,048,576 (8 MiB): an event carries the blocks one request
    /// cached in one step, at most its context. SGLang's default page is one
    /// token and it merges a run of pages into one event, so a 1M-token
    /// prompt cached in one step is a million hashes.
    pub max_hashes: usize,
    /// Token ids in one event.
    ///
    /// Default 4,194,304 (16 MiB): as for `max_hashes`, an event's tokens
    /// are at most one request's context; 4 Mi tokens covers the longest
    /// contexts served today (1M for many models) with room to spare.
    pub max_tokens: usize,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_events: 1 << 16,
            max_hashes: 1 << 20,
            max_tokens: 1 << 22,
        }
    }
}

/// Decodes one payload (the last frame of a live or replayed message).
///
/// An error in the batch's frame refuses the whole batch; an event that is
/// well framed but does not decode is skipped alone, and counted in
/// [`Batch::bad`] (see [`DecodeError`]). Events of unknown types are
/// counted in [`Batch::unknown_events`].
///
/// ```
/// use prefix_events::{decode_batch, DecodeLimits, Event};
///
/// // [1.5, [{"type": "AllBlocksCleared"}], 0]
/// let payload = b"\x93\xcb\x3f\xf8\0\0\0\0\0\0\x91\x81\xa4type\xb0AllBlocksCleared\x00";
/// let batch = decode_batch(payload, &DecodeLimits::default()).unwrap();
/// assert_eq!(batch.events, [Event::Cleared]);
/// assert_eq!(batch.data_parallel_rank, Some(0));
/// ```
pub fn decode_batch(payload: &[u8], limits: &DecodeLimits) -> Result<Batch, DecodeError> {
    let mut r = Reader::new(payload);
    let batch = match r.shape().map_err(|e| Location::BATCH.err(e))? {
        Shape::Array => positional(&mut r, limits)?,
        Shape::Map => named(&mut r, limits)?,
        Shape::Other(found) => {
            return Err(DecodeError::UnexpectedType {
                at: Location::BATCH,
                expected: "an array or a map",
                found,
            })
        }
    };
    match r.remaining() {
        0 => Ok(batch),
        extra => Err(DecodeError::TrailingBytes { extra }),
    }
}

/// `[ts, events, data_parallel_rank?, ...]`.
fn positional(r: &mut Reader<'_>, limits: &DecodeLimits) -> Result<Batch, DecodeError> {
    let n = r.array_len().map_err(|e| Location::BATCH.err(e))?;
    if n < 2 {
        let field = if n == 0 { "ts" } else { "events" };
        return Err(DecodeError::Missing {
            at: Location::batch(field),
        });
    }
    let ts = ts(r)?;
    let (events, unknown_events, bad) = event::decode_events(r, limits)?;
    let data_parallel_rank = if n > 2 { rank(r)? } else { None };
    for i in 3..n {
        r.skip().map_err(|e| Location::BATCH.at(i).err(e))?;
    }
    Ok(Batch {
        ts,
        events,
        data_parallel_rank,
        unknown_events,
        bad,
    })
}

/// `{ts, events, data_parallel_rank | attn_dp_rank, ...}`, in any order.
fn named(r: &mut Reader<'_>, limits: &DecodeLimits) -> Result<Batch, DecodeError> {
    let n = r.map_len().map_err(|e| Location::BATCH.err(e))?;
    let (mut ts_at, mut events_at, mut rank_at) = (None, None, None);
    for _ in 0..n {
        let key = r.str().map_err(|e| Location::batch("map key").err(e))?;
        let (slot, field) = match key {
            "ts" => (Some(&mut ts_at), "ts"),
            "events" => (Some(&mut events_at), "events"),
            "data_parallel_rank" => (Some(&mut rank_at), "data_parallel_rank"),
            "attn_dp_rank" => (Some(&mut rank_at), "attn_dp_rank"),
            _ => (None, "(unknown field)"),
        };
        let value = *r;
        r.skip().map_err(|e| Location::batch(field).err(e))?;
        if let Some(slot) = slot {
            *slot = Some(value);
        }
    }
    let missing = |field| DecodeError::Missing {
        at: Location::batch(field),
    };
    let ts = ts(&mut ts_at.ok_or_else(|| missing("ts"))?)?;
    let (events, unknown_events, bad) =
        event::decode_events(&mut events_at.ok_or_else(|| missing("events"))?, limits)?;
    let data_parallel_rank = match rank_at {
        Some(mut r) => rank(&mut r)?,
        None => None,
    };
    Ok(Batch {
        ts,
        events,
        data_parallel_rank,
        unknown_events,
        bad,
    })
}

fn ts(r: &mut Reader<'_>) -> Result<f64, DecodeError> {
    r.float().map_err(|e| Location::batch("ts").err(e))
}

fn rank(r: &mut Reader<'_>) -> Result<Option<u32>, DecodeError> {
    let at = Location::batch("data_parallel_rank");
    if r.eat_nil() {
        return Ok(None);
    }
    let value = r.int().map_err(|e| at.err(e))?;
    u32::try_from(value)
        .map(Some)
        .map_err(|_| DecodeError::OutOfRange { at, value })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hex, whitespace ignored.
    fn hex(s: &str) -> Vec<u8> {
        let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        digits
            .chunks(2)
            .map(|pair| {
                let pair = std::str::from_utf8(pair).unwrap();
                u8::from_str_radix(pair, 16).unwrap()
            })
            .collect()
    }

    fn decode(payload: &[u8]) -> Result<Batch, DecodeError> {
        decode_batch(payload, &DecodeLimits::default())
    }

    /// The real `BlockStored` batch of `shared/engines/vllm-kv-events.md` §7
    /// (vLLM 0.33.0, pod0 seq 0): map16 header with 11 entries, three uint64
    /// hashes, nil parent, 48 token ids in mixed widths, unknown keys
    /// (`lora_id`, `extra_keys`, `group_idx`, `kv_cache_spec_kind`).
    const STORED_350: &str = "
        93cb41dac3631363774591de000ba474797065ab426c6f636b53746f726564ac
        626c6f636b5f68617368657393cf5896a494c10f45aacf1b21f7b4efbb2c06cf
        84b82a066b9279f6b1706172656e745f626c6f636b5f68617368c0a9746f6b65
        6e5f696473dc0030cd1133cd48dccd6c79cd66b1cd61c4cd0814cd20a7cd0f18
        cd3f6bcd6168cd3989cd3c73cd5368cd3098cd64f5cd1ae0cd0c04cd3e73cd03
        a1cd7259cd6afbcd31e6cd3765cd4dc1cd6193cd623346cd5912cd3903cd2218
        cd5c5ccd66a3cd1d49cd4babcd78ffcd0d16cd7362cd28a2cd03ebcd02dccd0b
        12cd3830cd54f7cd4115cd0dd1cd63a5cd14f5cd42afaa626c6f636b5f73697a
        6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65
        c0aa65787472615f6b65797393c0c0c0a967726f75705f69647800b26b765f63
        616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00";

    /// §7, pod1 seq 20: one `BlockRemoved` (fixmap, one hash, `group_idx`).
    const REMOVED_76: &str = "
        93 cb41dac362e569cea4 91 84 a474797065 ac426c6f636b52656d6f766564
        ac626c6f636b5f686173686573 91 cf7034fe9ff95a9d6e a66d656469756d
        a3475055 a967726f75705f696478 00 00";

    /// §7, pod1 seq 40: `AllBlocksCleared`.
    const CLEARED_35: &str =
        "93 cb41dac362e585d5ce 91 81 a474797065 b0416c6c426c6f636b73436c6561726564 00";

    #[test]
    fn the_captured_block_stored_batch() {
        let payload = hex(STORED_350);
        assert_eq!(payload.len(), 350);
        let batch = decode(&payload).unwrap();
        assert_eq!(batch.ts.to_bits(), 0x41da_c363_1363_7745);
        assert_eq!(batch.ts, 1_796_049_997.554_154_6);
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(batch.unknown_events, 0);
        let tokens = vec![
            4403, 18652, 27769, 26289, 25028, 2068, 8359, 3864, 16235, 24936, 14729, 15475, 21352,
            12440, 25845, 6880, 3076, 15987, 929, 29273, 27387, 12774, 14181, 19905, 24979, 25139,
            70, 22802, 14595, 8728, 23644, 26275, 7497, 19371, 30975, 3350, 29538, 10402, 1003,
            732, 2834, 14384, 21751, 16661, 3537, 25509, 5365, 17071,
        ];
        assert_eq!(
            batch.events,
            [Event::Stored(Stored {
                hashes: vec![
                    6_383_470_480_645_375_402,
                    1_955_116_069_743_700_998,
                    9_563_440_015_784_180_214,
                ],
                parent: None,
                tokens,
                block_size: 16,
                lora_name: None,
                medium: Some("GPU".into()),
                group: Some(0),
                group_kind: Some("full_attention".into()),
                ..Default::default()
            })]
        );
    }

    #[test]
    fn the_captured_block_removed_batch() {
        let payload = hex(REMOVED_76);
        assert_eq!(payload.len(), 76);
        let batch = decode(&payload).unwrap();
        assert_eq!(batch.ts.to_bits(), 0x41da_c362_e569_cea4);
        assert_eq!(batch.data_parallel_rank, Some(0));
        assert_eq!(
            batch.events,
            [Event::Removed(Removed {
                hashes: [0x7034_fe9f_f95a_9d6e].into(),
                medium: Some("GPU".into()),
                group: Some(0),
            })]
        );
    }

    #[test]
    fn the_captured_all_blocks_cleared_batch() {
        let payload = hex(CLEARED_35);
        assert_eq!(payload.len(), 35);
        let batch = decode(&payload).unwrap();
        assert_eq!(batch.ts.to_bits(), 0x41da_c362_e585_d5ce);
        assert_eq!(batch.events, [Event::Cleared]);
        assert_eq!(batch.data_parallel_rank, Some(0));
    }

    #[test]
    fn every_prefix_of_a_capture_is_refused_as_truncated() {
        for capture in [STORED_350, REMOVED_76, CLEARED_35] {
            let payload = hex(capture);
            for len in 0..payload.len() {
                match decode(&payload[..len]) {
                    Err(DecodeError::Truncated { .. }) => {}
                    other => panic!("{len} bytes: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn batch_arrays_of_two_or_more_elements() {
        // [2.0, []]: older engines, no rank.
        let batch = decode(&hex("92 cb4000000000000000 90")).unwrap();
        assert_eq!((batch.ts, batch.data_parallel_rank), (2.0, None));
        // [2.0, [], nil]: msgspec's trailing nil.
        let batch = decode(&hex("93 cb4000000000000000 90 c0")).unwrap();
        assert_eq!(batch.data_parallel_rank, None);
        // [2.0, [], 3, "later", {}]: extra elements ignored.
        let batch = decode(&hex("95 cb4000000000000000 90 03 a56c61746572 80")).unwrap();
        assert_eq!(batch.data_parallel_rank, Some(3));
        // array16 header for three elements, rank as uint32.
        let batch = decode(&hex("dc0003 cb4000000000000000 90 ce00000007")).unwrap();
        assert_eq!(batch.data_parallel_rank, Some(7));
    }

    #[test]
    fn map_form_batches_in_any_key_order() {
        // {"events": [], "x": [1, 2], "attn_dp_rank": 2, "ts": 2.0}
        let payload = hex(
            "84 a66576656e747390 a178920102 ac6174746e5f64705f72616e6b02 a27473cb4000000000000000",
        );
        let batch = decode(&payload).unwrap();
        assert_eq!((batch.ts, batch.data_parallel_rank), (2.0, Some(2)));
        // {"ts": 2.0, "events": [], "data_parallel_rank": nil}
        let payload = hex(
            "83 a27473cb4000000000000000 a66576656e747390 b2646174615f706172616c6c656c5f72616e6b c0",
        );
        assert_eq!(decode(&payload).unwrap().data_parallel_rank, None);
    }

    #[test]
    fn bad_batches_are_refused_typed() {
        let err = |s: &str| decode(&hex(s)).unwrap_err().to_string();
        assert_eq!(err(""), "batch: the payload ends inside this value");
        assert_eq!(
            err("a178"),
            "batch: expected an array or a map, found a string"
        );
        assert_eq!(err("91 cb4000000000000000"), "batch: events: missing");
        assert_eq!(err("90"), "batch: ts: missing");
        assert_eq!(
            err("92 a178 90"),
            "batch: ts: expected a float, found a string"
        );
        assert_eq!(
            err("92 cb4000000000000000 a178"),
            "batch: events: expected an array, found a string"
        );
        assert_eq!(
            err("93 cb4000000000000000 90 ff"),
            "batch: data_parallel_rank: -1 does not fit in a u32"
        );
        assert_eq!(
            err("92 cb4000000000000000 90 c0"),
            "1 trailing bytes after the batch"
        );
        assert_eq!(err("81 a27473 01"), "batch: events: missing");
        assert_eq!(
            err("81 01 01"),
            "batch: map key: expected a string, found an integer"
        );
    }

    #[test]
    fn the_event_limit_is_checked_before_anything_is_reserved() {
        // [2.0, array32 of 2^32 - 1 events]: five bytes claim four billion.
        let payload = hex("92 cb4000000000000000 ddffffffff");
        let limits = DecodeLimits::default();
        assert_eq!(
            decode_batch(&payload, &limits),
            Err(DecodeError::Limit {
                at: Location::batch("events"),
                limit: "max_events",
                len: u32::MAX as usize,
                max: limits.max_events,
            })
        );
        // Under the limit, the claim fails on the bytes instead.
        let small = DecodeLimits {
            max_events: usize::MAX,
            ..limits
        };
        assert!(matches!(
            decode_batch(&payload, &small),
            Err(DecodeError::Truncated { .. })
        ));
    }
}
