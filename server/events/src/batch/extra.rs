//! vLLM's `extra_keys`: one entry per block, each nil or a list of untagged
//! keys ([`RawExtraKey`]).

use smallvec::SmallVec;

use super::error::list_len;
use super::{DecodeError, DecodeLimits, Location, RawExtraKey};
use crate::msgpack::{Reader, Scalar, Shape};

/// The `extra_keys` field: empty when it is nil or nil for every block
/// (nothing is allocated until a block has keys). More entries than
/// `max_hashes` (one per block) are refused with [`DecodeError::Limit`].
pub(super) fn extra_keys(
    r: &mut Reader<'_>,
    at: Location,
    limits: &DecodeLimits,
) -> Result<Vec<Option<Box<[RawExtraKey]>>>, DecodeError> {
    if r.eat_nil() {
        return Ok(Vec::new());
    }
    // One entry per block hash.
    let n = list_len(r, at, "max_hashes", limits.max_hashes)?;
    let mut out: Vec<Option<Box<[RawExtraKey]>>> = Vec::new();
    for j in 0..n {
        if r.eat_nil() {
            if !out.is_empty() {
                out.push(None);
            }
            continue;
        }
        let keys = block_keys(r, at.at(j))?;
        if out.is_empty() {
            // Each entry takes at least one byte: what is left bounds the
            // reservation whatever the header claims.
            out.reserve(n.min(j + 1 + r.remaining()));
            out.resize(j, None);
        }
        out.push(Some(keys));
    }
    Ok(out)
}

/// One block's keys: an array of scalars and pairs.
fn block_keys(r: &mut Reader<'_>, at: Location) -> Result<Box<[RawExtraKey]>, DecodeError> {
    let n = r.array_len().map_err(|e| at.err(e))?;
    let mut keys: SmallVec<[RawExtraKey; 2]> = SmallVec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        keys.push(key(r, at)?);
    }
    Ok(keys.into_vec().into_boxed_slice())
}

/// One key; a shape no engine sends is stepped over as [`RawExtraKey::Unknown`].
fn key(r: &mut Reader<'_>, at: Location) -> Result<RawExtraKey, DecodeError> {
    match r.scalar().map_err(|e| at.err(e))? {
        Some(Scalar::Str(s)) => match std::str::from_utf8(s) {
            Ok(s) => return Ok(RawExtraKey::Text(s.into())),
            Err(_) => return Ok(RawExtraKey::Unknown),
        },
        Some(Scalar::Bin(b)) => return Ok(RawExtraKey::Bytes(b.into())),
        Some(Scalar::Int(_)) => return Ok(RawExtraKey::Unknown),
        None => {}
    }
    if r.shape().map_err(|e| at.err(e))? == Shape::Array {
        let mut pair = *r;
        if let Some(mm) = mm_pair(&mut pair).map_err(|e| at.err(e))? {
            *r = pair;
            return Ok(mm);
        }
    }
    r.skip().map_err(|e| at.err(e))?;
    Ok(RawExtraKey::Unknown)
}

/// `[identifier, offset]` with a string or bytes identifier and an int
/// offset that fits an i64; `None` for any other array.
fn mm_pair(r: &mut Reader<'_>) -> Result<Option<RawExtraKey>, crate::msgpack::ReadError> {
    if r.array_len()? != 2 {
        return Ok(None);
    }
    let identifier = match r.scalar()? {
        Some(Scalar::Str(s) | Scalar::Bin(s)) => s,
        _ => return Ok(None),
    };
    let offset = match r.scalar()? {
        Some(Scalar::Int(v)) => match i64::try_from(v) {
            Ok(v) => v,
            Err(_) => return Ok(None),
        },
        _ => return Ok(None),
    };
    Ok(Some(RawExtraKey::Mm {
        identifier: identifier.into(),
        offset,
    }))
}
