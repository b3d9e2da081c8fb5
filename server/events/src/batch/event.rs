//! The `events` array: each event as a tagged map or a tagged array, and the
//! fields they share (hashes, token ids, optional strings).

use compact_str::CompactString;
use smallvec::SmallVec;

use super::{BadEvents, DecodeError, DecodeLimits, Event, Location, Removed, Stored};
use crate::msgpack::{utf8, IntOrBin, Reader, Shape};

/// The shortest event that decodes into an entry, `["BlockRemoved", []]`, is
/// 15 bytes. Reserving one entry per 15 bytes left holds every event a
/// payload can carry, and no more than about 8 bytes of `Event` per payload
/// byte, whatever the array's header claims.
const MIN_EVENT_BYTES: usize = 15;

/// Decodes the `events` array; returns the known events, the count of
/// unknown ones, and the events that did not decode but could be stepped
/// over (their framing is intact), skipped alone.
pub(super) fn decode_events(
    r: &mut Reader<'_>,
    limits: &DecodeLimits,
) -> Result<(Vec<Event>, u32, Option<BadEvents>), DecodeError> {
    let at = Location::batch("events");
    let n = r.array_len().map_err(|e| at.err(e))?;
    if n > limits.max_events {
        return Err(DecodeError::Limit {
            at,
            limit: "max_events",
            len: n,
            max: limits.max_events,
        });
    }
    let mut events = Vec::with_capacity(n.min(r.remaining() / MIN_EVENT_BYTES));
    let mut unknown = 0u32;
    let mut bad: Option<BadEvents> = None;
    for i in 0..n {
        let start = *r;
        match decode_event(r, i, limits) {
            Ok(Some(event)) => events.push(event),
            Ok(None) => unknown = unknown.saturating_add(1),
            Err(e) => {
                // Stepped over from its start: only a well-framed event can
                // be, and what follows it then starts where it ends.
                let mut past = start;
                if past.skip().is_err() {
                    return Err(e);
                }
                *r = past;
                match &mut bad {
                    Some(b) => b.count = b.count.saturating_add(1),
                    None => bad = Some(BadEvents { count: 1, first: e }),
                }
            }
        }
    }
    Ok((events, unknown, bad))
}

/// One event; `None` for an unknown type (skipped whole).
fn decode_event(
    r: &mut Reader<'_>,
    i: usize,
    limits: &DecodeLimits,
) -> Result<Option<Event>, DecodeError> {
    match r.shape().map_err(|e| Location::event(i, "").err(e))? {
        Shape::Map => map_event(r, i, limits),
        Shape::Array => array_event(r, i, limits),
        Shape::Other(found) => Err(DecodeError::UnexpectedType {
            at: Location::event(i, ""),
            expected: "a map or an array",
            found,
        }),
    }
}

/// Where the fields a map-form event may carry start, found in a first pass
/// over its keys: the `"type"` key may come anywhere (msgspec writes it
/// first, but nothing requires that), and which fields matter depends on it.
///
/// The two long arrays, `token_ids` and `block_hashes`, are read in that
/// same pass (their values, or why they do not decode, not where they
/// start), so the pass does not step over every token once only to read it
/// again; an error is reported only if the event's type needs the field.
#[derive(Default)]
struct Fields<'a> {
    kind: Option<Reader<'a>>,
    hashes: Option<Result<SmallVec<[u64; 1]>, DecodeError>>,
    parent: Option<Reader<'a>>,
    tokens: Option<Result<Vec<u32>, DecodeError>>,
    block_size: Option<Reader<'a>>,
    lora_name: Option<Reader<'a>>,
    medium: Option<Reader<'a>>,
}

/// Field names the engines send (but the two read in the first pass), so
/// an error stepping over a field's value names the field.
const FIELDS: &[&str] = &[
    "type",
    "parent_block_hash",
    "block_size",
    "lora_name",
    "medium",
    "lora_id",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
    "locality",
    "ownership",
    "session_id",
    "lookahead_token_ids",
    "cache_salt",
];

/// How an error names the field of map key `key`: looked up only when
/// there is an error to report.
fn field_name(key: &[u8]) -> &'static str {
    FIELDS
        .iter()
        .find(|known| known.as_bytes() == key)
        .copied()
        .unwrap_or("(unknown field)")
}

fn map_event<'a>(
    r: &mut Reader<'a>,
    i: usize,
    limits: &DecodeLimits,
) -> Result<Option<Event>, DecodeError> {
    let n = r.map_len().map_err(|e| Location::event(i, "").err(e))?;
    let mut f = Fields::<'a>::default();
    for _ in 0..n {
        let key_at = || Location::event(i, "map key");
        // Known keys are compared as bytes: only UTF-8 matches them.
        let key = r.str_bytes().map_err(|e| key_at().err(e))?;
        // A repeated key: the last one counts.
        match key {
            b"block_hashes" => {
                let at = Location::event(i, "block_hashes");
                f.hashes = Some(read_now(r, at, |r| hashes(r, at, limits))?);
                continue;
            }
            b"token_ids" => {
                let at = Location::event(i, "token_ids");
                f.tokens = Some(read_now(r, at, |r| tokens(r, at, limits))?);
                continue;
            }
            _ => {}
        }
        let slot = match key {
            b"type" => Some(&mut f.kind),
            b"parent_block_hash" => Some(&mut f.parent),
            b"block_size" => Some(&mut f.block_size),
            b"lora_name" => Some(&mut f.lora_name),
            b"medium" => Some(&mut f.medium),
            other => {
                utf8(other).map_err(|e| key_at().err(e))?;
                None
            }
        };
        let value = *r;
        r.skip()
            .map_err(|e| Location::event(i, field_name(key)).err(e))?;
        if let Some(slot) = slot {
            *slot = Some(value);
        }
    }
    let required = |slot: Option<Reader<'a>>, field| {
        slot.ok_or(DecodeError::Missing {
            at: Location::event(i, field),
        })
    };
    let kind = event_type(&mut required(f.kind, "type")?, Location::event(i, "type"))?;
    let optional_str = |slot: Option<Reader<'a>>, field| match slot {
        Some(mut r) => opt_str(&mut r, Location::event(i, field)),
        None => Ok(None),
    };
    let missing = |field| DecodeError::Missing {
        at: Location::event(i, field),
    };
    Ok(Some(match kind {
        Kind::Stored => Event::Stored(Stored {
            hashes: f.hashes.ok_or_else(|| missing("block_hashes"))??.into_vec(),
            parent: match f.parent {
                Some(mut r) => opt_hash(&mut r, Location::event(i, "parent_block_hash"))?,
                None => None,
            },
            tokens: f.tokens.ok_or_else(|| missing("token_ids"))??,
            block_size: uint32(
                &mut required(f.block_size, "block_size")?,
                Location::event(i, "block_size"),
            )?,
            lora_name: optional_str(f.lora_name, "lora_name")?,
            medium: optional_str(f.medium, "medium")?,
        }),
        Kind::Removed => Event::Removed(Removed {
            hashes: f.hashes.ok_or_else(|| missing("block_hashes"))??,
            medium: optional_str(f.medium, "medium")?,
        }),
        Kind::Cleared => Event::Cleared,
        Kind::Unknown => return Ok(None),
    }))
}

/// An event's type tag.
enum Kind {
    Stored,
    Removed,
    Cleared,
    /// Any other (valid UTF-8) tag: the event is counted and skipped.
    Unknown,
}

/// Reads an event's type tag, compared as bytes (only UTF-8 matches a
/// known one).
fn event_type(r: &mut Reader<'_>, at: Location) -> Result<Kind, DecodeError> {
    Ok(match r.str_bytes().map_err(|e| at.err(e))? {
        b"BlockStored" => Kind::Stored,
        b"BlockRemoved" => Kind::Removed,
        b"AllBlocksCleared" => Kind::Cleared,
        other => {
            utf8(other).map_err(|e| at.err(e))?;
            Kind::Unknown
        }
    })
}

/// The value at `r` as `read` reads it, with `r` past it either way: what
/// did not decode is stepped over, and its error kept for when the field
/// is needed (stepping over fails only where the payload itself ends or
/// lies, and that fails the event at once, as for any field).
fn read_now<'a, T>(
    r: &mut Reader<'a>,
    at: Location,
    read: impl FnOnce(&mut Reader<'a>) -> Result<T, DecodeError>,
) -> Result<Result<T, DecodeError>, DecodeError> {
    let mut ahead = *r;
    let value = read(&mut ahead);
    match value {
        Ok(_) => *r = ahead,
        Err(_) => r.skip().map_err(|e| at.err(e))?,
    }
    Ok(value)
}

/// Positions of an array-form `BlockStored`, for "missing" errors.
const STORED_POSITIONS: [&str; 5] = [
    "type",
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
];

fn array_event(
    r: &mut Reader<'_>,
    i: usize,
    limits: &DecodeLimits,
) -> Result<Option<Event>, DecodeError> {
    let n = r.array_len().map_err(|e| Location::event(i, "").err(e))?;
    let at = |field| Location::event(i, field);
    let missing = |field| Err(DecodeError::Missing { at: at(field) });
    if n == 0 {
        return missing("type");
    }
    let kind = event_type(r, at("type"))?;
    // Elements read so far; the rest are skipped at the end.
    let mut read = 1;
    let event = match kind {
        Kind::Stored => {
            if n < STORED_POSITIONS.len() {
                return missing(STORED_POSITIONS[n]);
            }
            let hashes = hashes(r, at("block_hashes"), limits)?.into_vec();
            let parent = opt_hash(r, at("parent_block_hash"))?;
            let tokens = tokens(r, at("token_ids"), limits)?;
            let block_size = uint32(r, at("block_size"))?;
            read = STORED_POSITIONS.len();
            let mut medium = None;
            let mut lora_name = None;
            if n > 5 {
                // lora_id: deprecated, and the index keys on hashes.
                r.skip().map_err(|e| at("lora_id").err(e))?;
                read = 6;
            }
            if n > 6 {
                medium = opt_str(r, at("medium"))?;
                read = 7;
            }
            if n > 7 {
                lora_name = stored_position_7(r, at("lora_name"))?;
                read = 8;
            }
            Some(Event::Stored(Stored {
                hashes,
                parent,
                tokens,
                block_size,
                lora_name,
                medium,
            }))
        }
        Kind::Removed => {
            if n < 2 {
                return missing("block_hashes");
            }
            let hashes = hashes(r, at("block_hashes"), limits)?;
            read = 2;
            let mut medium = None;
            if n > 2 {
                medium = opt_str(r, at("medium"))?;
                read = 3;
            }
            Some(Event::Removed(Removed { hashes, medium }))
        }
        Kind::Cleared => Some(Event::Cleared),
        Kind::Unknown => None,
    };
    for _ in read..n {
        r.skip().map_err(|e| at("").err(e))?;
    }
    Ok(event)
}

/// Position 7 of an array-form `BlockStored`: vLLM's `lora_name` (a string
/// or nil), or SGLang's `BlockStoredWithMetadata.metadata` (a map holding
/// `cache_salt`), skipped.
fn stored_position_7(
    r: &mut Reader<'_>,
    at: Location,
) -> Result<Option<CompactString>, DecodeError> {
    if r.shape().map_err(|e| at.err(e))? == Shape::Map {
        r.skip().map_err(|e| at.err(e))?;
        return Ok(None);
    }
    opt_str(r, at).map_err(|e| match e {
        DecodeError::UnexpectedType { at, found, .. } => DecodeError::UnexpectedType {
            at,
            expected: "a string, nil or a map",
            found,
        },
        e => e,
    })
}

/// A list of block hashes (one is held inline: see [`Removed::hashes`]).
fn hashes(
    r: &mut Reader<'_>,
    at: Location,
    limits: &DecodeLimits,
) -> Result<SmallVec<[u64; 1]>, DecodeError> {
    let n = r.array_len().map_err(|e| at.err(e))?;
    if n > limits.max_hashes {
        return Err(DecodeError::Limit {
            at,
            limit: "max_hashes",
            len: n,
            max: limits.max_hashes,
        });
    }
    // Each hash takes at least one byte.
    let mut out = SmallVec::with_capacity(n.min(r.remaining()));
    for j in 0..n {
        out.push(hash(r, at.at(j))?);
    }
    Ok(out)
}

/// A hash, or `None` for nil.
fn opt_hash(r: &mut Reader<'_>, at: Location) -> Result<Option<u64>, DecodeError> {
    if r.eat_nil() {
        return Ok(None);
    }
    hash(r, at).map(Some)
}

/// One block hash: an unsigned or signed int, or the last 8 bytes (big
/// endian) of a byte string.
fn hash(r: &mut Reader<'_>, at: Location) -> Result<u64, DecodeError> {
    match r.int_or_bin().map_err(|e| at.err(e))? {
        // A msgpack int is a u64 or an i64. `as` keeps the low 64 bits: the
        // value itself for a u64, the two's complement bits for a negative
        // i64 (SGLang's signed hashes).
        IntOrBin::Int(v) => Ok(v as u64),
        IntOrBin::Bin(bytes) => match bytes.last_chunk::<8>() {
            Some(last) => Ok(u64::from_be_bytes(*last)),
            None => Err(DecodeError::ShortHash {
                at,
                len: bytes.len(),
            }),
        },
    }
}

/// A list of token ids, each a `u32`.
fn tokens(
    r: &mut Reader<'_>,
    at: Location,
    limits: &DecodeLimits,
) -> Result<Vec<u32>, DecodeError> {
    let n = r.array_len().map_err(|e| at.err(e))?;
    if n > limits.max_tokens {
        return Err(DecodeError::Limit {
            at,
            limit: "max_tokens",
            len: n,
            max: limits.max_tokens,
        });
    }
    // Each token id takes at least one byte.
    let mut out = Vec::with_capacity(n.min(r.remaining()));
    let mut j = 0;
    while j < n {
        // Token ids are small unsigned ints but for EAGLE's pairs: runs of
        // those are read without the general path's error locations.
        j += r.small_uints(n - j, &mut out);
        if j < n {
            out.push(token(r, at.at(j))?);
            j += 1;
        }
    }
    Ok(out)
}

/// One token id: an int, or the first of an array (SGLang's EAGLE
/// speculative decoding keys pages by `(token, next_token)` pairs; the
/// prompt's token at that position is the first).
fn token(r: &mut Reader<'_>, at: Location) -> Result<u32, DecodeError> {
    if r.shape() != Ok(Shape::Array) {
        return uint32(r, at);
    }
    let n = r.array_len().map_err(|e| at.err(e))?;
    if n == 0 {
        return Err(DecodeError::EmptyToken { at });
    }
    let t = uint32(r, at)?;
    for _ in 1..n {
        r.skip().map_err(|e| at.err(e))?;
    }
    Ok(t)
}

/// A non-negative int that fits in a `u32`.
fn uint32(r: &mut Reader<'_>, at: Location) -> Result<u32, DecodeError> {
    let value = r.int().map_err(|e| at.err(e))?;
    u32::try_from(value).map_err(|_| DecodeError::OutOfRange { at, value })
}

/// A string, or `None` for nil.
fn opt_str(r: &mut Reader<'_>, at: Location) -> Result<Option<CompactString>, DecodeError> {
    if r.eat_nil() {
        return Ok(None);
    }
    r.str().map(|s| Some(s.into())).map_err(|e| at.err(e))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{batch_of, W};
    use super::super::{decode_batch, Batch};
    use super::*;

    fn decode(events: &[Vec<u8>]) -> Result<Batch, DecodeError> {
        decode_batch(&batch_of(events), &DecodeLimits::default())
    }

    /// Why the batch did not decode, or else its first bad event.
    fn why(got: Result<Batch, DecodeError>) -> String {
        match got {
            Err(e) => e.to_string(),
            Ok(b) => b
                .bad
                .map_or_else(|| "decoded".into(), |b| b.first.to_string()),
        }
    }

    fn stored(hashes: Vec<u64>, parent: Option<u64>, tokens: Vec<u32>) -> Event {
        Event::Stored(Stored {
            hashes,
            parent,
            tokens,
            block_size: 2,
            lora_name: None,
            medium: None,
        })
    }

    #[test]
    fn map_events_in_any_key_order_with_unknown_keys() {
        let e = W::default()
            .map(6)
            .s("token_ids")
            .arr(2)
            .u(1)
            .u(2)
            .s("future")
            .map(1)
            .s("x")
            .arr(1)
            .nil()
            .s("block_size")
            .u(2)
            .s("type")
            .s("BlockStored")
            .s("parent_block_hash")
            .u(u64::MAX)
            .s("block_hashes")
            .arr(1)
            .u(5)
            .done();
        let batch = decode(&[e]).unwrap();
        assert_eq!(batch.events, [stored(vec![5], Some(u64::MAX), vec![1, 2])]);
    }

    #[test]
    fn absent_optional_fields_are_none() {
        // SGLang omits medium/lora_name when None (omit_defaults), and a
        // stripped-down publisher may omit the parent.
        let e = W::default()
            .map(4)
            .s("type")
            .s("BlockStored")
            .s("block_hashes")
            .arr(0)
            .s("token_ids")
            .arr(0)
            .s("block_size")
            .u(2)
            .done();
        assert_eq!(decode(&[e]).unwrap().events, [stored(vec![], None, vec![])]);
        let e = W::default()
            .map(2)
            .s("block_hashes")
            .arr(1)
            .u(9)
            .s("type")
            .s("BlockRemoved")
            .done();
        assert_eq!(
            decode(&[e]).unwrap().events,
            [Event::Removed(Removed {
                hashes: [9].into(),
                medium: None
            })]
        );
    }

    #[test]
    fn array_events_of_every_length_the_engines_sent() {
        let base = || {
            W::default()
                .s("BlockStored")
                .arr(2)
                .u(7)
                .i(-1)
                .nil()
                .arr(2)
                .u(3)
                .u(4)
                .u(2)
        };
        // Oldest: up to block_size (SGLang 0.4) or lora_id (vLLM).
        let five = W::default().arr(5).raw(&base().done()).done();
        let six = W::default().arr(6).raw(&base().nil().done()).done();
        // Then medium, then lora_name, then extra_keys and more.
        let seven = W::default()
            .arr(7)
            .raw(&base().u(3).s("CPU_PINNED").done())
            .done();
        let nine = W::default()
            .arr(9)
            .raw(&base().nil().s("GPU").s("adapter").arr(1).nil().done())
            .done();
        // SGLang's BlockStoredWithMetadata: a {cache_salt} map at position 7.
        let salted = W::default()
            .arr(8)
            .raw(&base().nil().s("GPU").map(1).s("cache_salt").s("s").done())
            .done();
        let batch = decode(&[five, six, seven, nine, salted]).unwrap();
        let with = |medium: Option<&str>, lora: Option<&str>| {
            Event::Stored(Stored {
                hashes: vec![7, u64::MAX],
                parent: None,
                tokens: vec![3, 4],
                block_size: 2,
                lora_name: lora.map(Into::into),
                medium: medium.map(Into::into),
            })
        };
        assert_eq!(
            batch.events,
            [
                with(None, None),
                with(None, None),
                with(Some("CPU_PINNED"), None),
                with(Some("GPU"), Some("adapter")),
                with(Some("GPU"), None),
            ]
        );
        let removed = W::default().arr(1).s("BlockRemoved").done();
        assert_eq!(why(decode(&[removed])), "event 0: block_hashes: missing");
        let removed = W::default()
            .arr(4)
            .s("BlockRemoved")
            .arr(1)
            .u(1)
            .s("DISK")
            .u(0)
            .done();
        let cleared = W::default().arr(2).s("AllBlocksCleared").map(0).done();
        assert_eq!(
            decode(&[removed, cleared]).unwrap().events,
            [
                Event::Removed(Removed {
                    hashes: [1].into(),
                    medium: Some("DISK".into())
                }),
                Event::Cleared
            ]
        );
    }

    #[test]
    fn unknown_event_types_are_skipped_and_counted() {
        let unknown_map = W::default()
            .map(2)
            .s("type")
            .s("BlockPinned")
            .s("block_hashes")
            .arr(1)
            .raw(&[0x91, 0x91, 0xc0])
            .done();
        let unknown_array = W::default().arr(3).s("KvMetrics").u(1).map(0).done();
        let cleared = W::default().map(1).s("type").s("AllBlocksCleared").done();
        let batch = decode(&[unknown_map, cleared, unknown_array]).unwrap();
        assert_eq!(batch.events, [Event::Cleared]);
        assert_eq!(batch.unknown_events, 2);
    }

    #[test]
    fn long_arrays_read_in_the_first_pass_keep_the_last_key_and_its_error() {
        let payload = |first: &[u8], last: &[u8]| {
            W::default()
                .map(5)
                .s("token_ids")
                .raw(first)
                .s("type")
                .s("BlockStored")
                .s("block_hashes")
                .arr(1)
                .u(7)
                .s("block_size")
                .u(2)
                .s("token_ids")
                .raw(last)
                .done()
        };
        let ok = decode(&[payload(&[0xa1, b'x'], &[0x92, 1, 0xcd, 1, 0])]).unwrap();
        assert_eq!(ok.events, [stored(vec![7], None, vec![1, 256])]);
        assert_eq!(
            why(decode(&[payload(&[0x92, 1, 2], &[0xa1, b'x'])])),
            "event 0: token_ids: expected an array, found a string"
        );
    }

    #[test]
    fn hashes_in_every_form() {
        let digest: Vec<u8> = (1..=32).collect();
        let e = W::default()
            .arr(3)
            .s("BlockRemoved")
            .arr(6)
            .u(0)
            .u(1 << 63)
            .i(-2)
            .i(i64::MIN)
            .bin(&digest)
            .bin(&digest[..8])
            .nil()
            .done();
        let want = [
            0,
            1 << 63,
            u64::MAX - 1,
            1 << 63,
            0x191a_1b1c_1d1e_1f20,
            0x0102_0304_0506_0708,
        ];
        assert_eq!(
            decode(&[e]).unwrap().events,
            [Event::Removed(Removed {
                hashes: want[..].into(),
                medium: None
            })]
        );
    }

    #[test]
    fn bad_fields_are_refused_with_where_and_what() {
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (
                W::default()
                    .arr(2)
                    .s("BlockRemoved")
                    .arr(1)
                    .bin(&[1; 4])
                    .done(),
                "event 1: block_hashes[0]: hash of 4 bytes (at least 8 needed)",
            ),
            (
                W::default().arr(2).s("BlockRemoved").arr(1).s("x").done(),
                "event 1: block_hashes[0]: expected an integer or bytes, found a string",
            ),
            (
                W::default()
                    .map(4)
                    .s("type")
                    .s("BlockStored")
                    .s("block_hashes")
                    .arr(0)
                    .s("token_ids")
                    .s("oops")
                    .s("block_size")
                    .u(1)
                    .done(),
                "event 1: token_ids: expected an array, found a string",
            ),
            (
                W::default()
                    .arr(5)
                    .s("BlockStored")
                    .arr(0)
                    .nil()
                    .arr(2)
                    .u(1)
                    .u(1 << 32)
                    .u(1)
                    .done(),
                "event 1: token_ids[1]: 4294967296 does not fit in a u32",
            ),
            (
                W::default()
                    .arr(5)
                    .s("BlockStored")
                    .arr(0)
                    .nil()
                    .arr(1)
                    .i(-1)
                    .u(1)
                    .done(),
                "event 1: token_ids[0]: -1 does not fit in a u32",
            ),
            (
                // A pair (SGLang's EAGLE pages) must have a token first.
                W::default()
                    .arr(5)
                    .s("BlockStored")
                    .arr(0)
                    .nil()
                    .arr(1)
                    .arr(0)
                    .u(1)
                    .done(),
                "event 1: token_ids[0]: an empty array where a token id (or a pair) belongs",
            ),
            (
                W::default()
                    .arr(4)
                    .s("BlockStored")
                    .arr(0)
                    .nil()
                    .arr(0)
                    .done(),
                "event 1: block_size: missing",
            ),
            (
                W::default().map(1).s("block_hashes").arr(0).done(),
                "event 1: type: missing",
            ),
            (
                W::default().map(1).s("type").u(1).done(),
                "event 1: type: expected a string, found an integer",
            ),
            (
                W::default()
                    .map(1)
                    .s("extra_keys")
                    .raw(&[0x93, 0xc0])
                    .done(),
                "event 1: extra_keys: the payload ends inside this value",
            ),
            (
                W::default().map(1).s("mystery").raw(&[0x93, 0xc0]).done(),
                "event 1: (unknown field): the payload ends inside this value",
            ),
            (
                W::default().map(1).raw(&[0xa2, 0xc3, 0x28]).u(1).done(),
                "event 1: map key: the string is not valid UTF-8",
            ),
            (W::default().arr(0).done(), "event 1: type: missing"),
            (
                W::default().s("BlockStored").done(),
                "event 1: expected a map or an array, found a string",
            ),
            (
                W::default().arr(1).raw(&[0xa1, 0xff]).done(),
                "event 1: type: the string is not valid UTF-8",
            ),
            (
                W::default()
                    .arr(3)
                    .s("BlockRemoved")
                    .arr(0)
                    .raw(&[0xa1, 0xff])
                    .done(),
                "event 1: medium: the string is not valid UTF-8",
            ),
            (
                W::default()
                    .arr(8)
                    .s("BlockStored")
                    .arr(0)
                    .nil()
                    .arr(0)
                    .u(1)
                    .nil()
                    .nil()
                    .u(3)
                    .done(),
                "event 1: lora_name: expected a string, nil or a map, found an integer",
            ),
        ];
        let cleared = W::default().arr(1).s("AllBlocksCleared").done();
        for (event, want) in cases {
            let got = why(decode(&[cleared.clone(), event]));
            assert_eq!(got, want);
        }
    }

    #[test]
    fn a_malformed_event_is_skipped_alone_while_its_framing_holds() {
        let cleared = W::default().arr(1).s("AllBlocksCleared").done();
        let removed = |medium: W| {
            W::default()
                .map(3)
                .s("type")
                .s("BlockRemoved")
                .s("block_hashes")
                .arr(1)
                .u(9)
                .s("medium")
                .raw(&medium.done())
                .done()
        };
        // A medium of the wrong type, and a hash too short: both framed.
        let bad_medium = removed(W::default().u(3));
        let short_hash = W::default()
            .arr(2)
            .s("BlockRemoved")
            .arr(1)
            .bin(&[1; 4])
            .done();
        let good = removed(W::default().s("GPU"));
        let batch = decode(&[
            bad_medium.clone(),
            cleared.clone(),
            short_hash,
            good.clone(),
        ])
        .unwrap();
        let want = Event::Removed(Removed {
            hashes: [9].into(),
            medium: Some("GPU".into()),
        });
        assert_eq!(batch.events, [Event::Cleared, want]);
        let bad = batch.bad.unwrap();
        assert_eq!(bad.count, 2);
        assert_eq!(
            bad.first.to_string(),
            "event 0: medium: expected a string, found an integer"
        );
        assert_eq!(decode(&[cleared.clone(), good.clone()]).unwrap().bad, None);
        // An event that claims more than the payload holds cannot be
        // stepped over, and the batch is refused.
        let cut = W::default().arr(2).s("BlockRemoved").raw(&[0x93, 1]).done();
        let got = decode(&[cleared, good, cut]);
        assert!(matches!(got, Err(DecodeError::Truncated { .. })), "{got:?}");
    }

    #[test]
    fn list_limits_name_the_limit() {
        let limits = DecodeLimits {
            max_events: 2,
            max_hashes: 1,
            max_tokens: 3,
        };
        let run = |events: &[Vec<u8>]| decode_batch(&batch_of(events), &limits);
        let hashes = W::default()
            .arr(2)
            .s("BlockRemoved")
            .arr(2)
            .u(1)
            .u(2)
            .done();
        assert_eq!(
            why(run(&[hashes])),
            "event 0: block_hashes: 2 elements, more than max_hashes (1)"
        );
        let tokens = W::default()
            .arr(5)
            .s("BlockStored")
            .arr(0)
            .nil()
            .arr(4)
            .raw(&[1, 2, 3, 4])
            .u(1)
            .done();
        assert_eq!(
            why(run(&[tokens])),
            "event 0: token_ids: 4 elements, more than max_tokens (3)"
        );
        let cleared = W::default().arr(1).s("AllBlocksCleared").done();
        assert_eq!(
            why(run(&[cleared.clone(), cleared.clone(), cleared])),
            "batch: events: 3 elements, more than max_events (2)"
        );
    }

    #[test]
    fn the_shortest_decodable_event_is_min_event_bytes_long() {
        let removed = W::default().arr(2).s("BlockRemoved").arr(0).done();
        let stored = W::default()
            .arr(5)
            .s("BlockStored")
            .arr(0)
            .nil()
            .arr(0)
            .u(0)
            .done();
        let cleared = W::default().arr(1).s("AllBlocksCleared").done();
        assert_eq!(removed.len(), MIN_EVENT_BYTES);
        assert!(stored.len() >= MIN_EVENT_BYTES);
        assert!(cleared.len() >= MIN_EVENT_BYTES);
    }

    #[test]
    fn eagle_pairs_read_as_their_first_token_between_runs_of_ints() {
        // SGLang with EAGLE: a page's token is a (token, next_token) pair.
        // Wide ints around them, so that each run after a pair is read
        // eight bytes at a time.
        let b = W::default()
            .arr(5)
            .s("BlockStored")
            .arr(1)
            .u(9)
            .nil()
            .arr(9)
            .u(70_000)
            .arr(2)
            .u(11)
            .u(12)
            .u(70_001)
            .u(70_002)
            .u(70_003)
            .arr(2)
            .u(13)
            .u(14)
            .u(300)
            .u(5)
            .u(200)
            .u(9)
            .done();
        let batch = decode_batch(&batch_of(&[b]), &DecodeLimits::default()).unwrap();
        match &batch.events[..] {
            [Event::Stored(s)] => assert_eq!(
                s.tokens,
                [70_000, 11, 70_001, 70_002, 70_003, 13, 300, 5, 200]
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_error_stepping_over_a_field_names_it() {
        for field in [
            "type",
            "parent_block_hash",
            "block_size",
            "lora_name",
            "medium",
            "extra_keys",
        ] {
            let b = W::default().map(1).s(field).raw(&[0x93, 0xc0]).done();
            let err = why(decode_batch(&batch_of(&[b]), &DecodeLimits::default()));
            assert_eq!(
                err,
                format!("event 0: {field}: the payload ends inside this value")
            );
        }
    }
}
