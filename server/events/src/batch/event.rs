//! The `events` array: each event as a tagged map or a tagged array, and the
//! fields they share (hashes, token ids, optional strings).

use compact_str::CompactString;
use smallvec::SmallVec;

use super::error::list_len;
use super::extra::extra_keys;
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
    let n = list_len(r, at, "max_events", limits.max_events)?;
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
    extra_keys: Option<Reader<'a>>,
    cache_salt: Option<Reader<'a>>,
    lookahead: Option<Reader<'a>>,
    group: Option<Reader<'a>>,
    group_kind: Option<Reader<'a>>,
    sliding_window: Option<Reader<'a>>,
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
            b"extra_keys" => Some(&mut f.extra_keys),
            b"cache_salt" => Some(&mut f.cache_salt),
            b"lookahead_token_ids" => Some(&mut f.lookahead),
            b"group_idx" => Some(&mut f.group),
            b"kv_cache_spec_kind" => Some(&mut f.group_kind),
            b"kv_cache_spec_sliding_window" => Some(&mut f.sliding_window),
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
    let optional_u32 = |slot: Option<Reader<'a>>, field| match slot {
        Some(mut r) => opt_u32(&mut r, Location::event(i, field)),
        None => Ok(None),
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
            extra_keys: match f.extra_keys {
                Some(mut r) => extra_keys(&mut r, Location::event(i, "extra_keys"), limits)?,
                None => Vec::new(),
            },
            cache_salt: optional_str(f.cache_salt, "cache_salt")?,
            lookahead: f.lookahead.is_some_and(|mut r| !r.eat_nil()),
            group: optional_u32(f.group, "group_idx")?,
            group_kind: optional_str(f.group_kind, "kv_cache_spec_kind")?,
            sliding_window: optional_u32(f.sliding_window, "kv_cache_spec_sliding_window")?,
        }),
        Kind::Removed => Event::Removed(Removed {
            hashes: f.hashes.ok_or_else(|| missing("block_hashes"))??,
            medium: optional_str(f.medium, "medium")?,
            group: optional_u32(f.group, "group_idx")?,
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
            let mut stored = Stored {
                hashes,
                parent,
                tokens,
                block_size,
                ..Stored::default()
            };
            if n > 5 {
                // lora_id: deprecated, and the index keys on hashes.
                r.skip().map_err(|e| at("lora_id").err(e))?;
                read = 6;
            }
            if n > 6 {
                stored.medium = opt_str(r, at("medium"))?;
                read = 7;
            }
            if n > 7 {
                (stored.lora_name, stored.cache_salt) = stored_position_7(r, at("lora_name"))?;
                read = 8;
            }
            if n > 8 {
                stored.extra_keys = extra_keys(r, at("extra_keys"), limits)?;
                read = 9;
            }
            if n > 9 {
                stored.group = opt_u32(r, at("group_idx"))?;
                read = 10;
            }
            if n > 10 {
                stored.group_kind = opt_str(r, at("kv_cache_spec_kind"))?;
                read = 11;
            }
            if n > 11 {
                stored.sliding_window = opt_u32(r, at("kv_cache_spec_sliding_window"))?;
                read = 12;
            }
            // locality, ownership, session_id; then lookahead_token_ids.
            if n > LOOKAHEAD_POSITION {
                for _ in read..LOOKAHEAD_POSITION {
                    r.skip().map_err(|e| at("").err(e))?;
                }
                stored.lookahead = !r.eat_nil();
                if stored.lookahead {
                    r.skip().map_err(|e| at("lookahead_token_ids").err(e))?;
                }
                read = LOOKAHEAD_POSITION + 1;
            }
            Some(Event::Stored(stored))
        }
        Kind::Removed => {
            if n < 2 {
                return missing("block_hashes");
            }
            let hashes = hashes(r, at("block_hashes"), limits)?;
            read = 2;
            let (mut medium, mut group) = (None, None);
            if n > 2 {
                medium = opt_str(r, at("medium"))?;
                read = 3;
            }
            if n > 3 {
                group = opt_u32(r, at("group_idx"))?;
                read = 4;
            }
            Some(Event::Removed(Removed {
                hashes,
                medium,
                group,
            }))
        }
        Kind::Cleared => Some(Event::Cleared),
        Kind::Unknown => None,
    };
    for _ in read..n {
        r.skip().map_err(|e| at("").err(e))?;
    }
    Ok(event)
}

/// Where an array-form `BlockStored` has `lookahead_token_ids`.
const LOOKAHEAD_POSITION: usize = 15;

/// Position 7 of an array-form `BlockStored`: vLLM's `lora_name` (a string
/// or nil), or SGLang's `BlockStoredWithMetadata.metadata`, a map whose
/// `cache_salt` is read (other keys are skipped). As (LoRA name, salt).
fn stored_position_7(
    r: &mut Reader<'_>,
    at: Location,
) -> Result<(Option<CompactString>, Option<CompactString>), DecodeError> {
    if r.shape().map_err(|e| at.err(e))? == Shape::Map {
        let n = r.map_len().map_err(|e| at.err(e))?;
        let mut salt = None;
        for _ in 0..n {
            let key = r.str_bytes().map_err(|e| at.err(e))?;
            if key == b"cache_salt" {
                salt = opt_str(r, at)?;
            } else {
                r.skip().map_err(|e| at.err(e))?;
            }
        }
        return Ok((None, salt));
    }
    let name = opt_str(r, at).map_err(|e| match e {
        DecodeError::UnexpectedType { at, found, .. } => DecodeError::UnexpectedType {
            at,
            expected: "a string, nil or a map",
            found,
        },
        e => e,
    })?;
    Ok((name, None))
}

/// A list of block hashes (one is held inline: see [`Removed::hashes`]).
fn hashes(
    r: &mut Reader<'_>,
    at: Location,
    limits: &DecodeLimits,
) -> Result<SmallVec<[u64; 1]>, DecodeError> {
    let n = list_len(r, at, "max_hashes", limits.max_hashes)?;
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
    let n = list_len(r, at, "max_tokens", limits.max_tokens)?;
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

/// A non-negative int that fits in a `u32`, or `None` for nil.
fn opt_u32(r: &mut Reader<'_>, at: Location) -> Result<Option<u32>, DecodeError> {
    if r.eat_nil() {
        return Ok(None);
    }
    uint32(r, at).map(Some)
}

/// A string, or `None` for nil.
fn opt_str(r: &mut Reader<'_>, at: Location) -> Result<Option<CompactString>, DecodeError> {
    if r.eat_nil() {
        return Ok(None);
    }
    r.str().map(|s| Some(s.into())).map_err(|e| at.err(e))
}

#[cfg(test)]
mod tests;
