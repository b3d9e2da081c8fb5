//! What can be wrong with a payload, and where.

use std::fmt;

use crate::msgpack::{ReadError, Reader};

/// Where in a payload a decoding error is: the event (its 0-based position in
/// the batch's `events` array, unknown events included), the field, and the
/// element of a list field.
///
/// Displays as `batch`, `batch: ts`, `event 3`, `event 3: token_ids` or
/// `event 3: block_hashes[2]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    /// The event's position in `events`; `None` for the batch itself.
    pub event: Option<usize>,
    /// The field's wire name (`token_ids`); empty for the event or batch as
    /// a whole.
    pub field: &'static str,
    /// The element of a list field.
    pub index: Option<usize>,
}

impl Location {
    pub(crate) const BATCH: Location = Location {
        event: None,
        field: "",
        index: None,
    };

    pub(crate) fn batch(field: &'static str) -> Self {
        Location {
            field,
            ..Self::BATCH
        }
    }

    pub(crate) fn event(event: usize, field: &'static str) -> Self {
        Location {
            event: Some(event),
            field,
            index: None,
        }
    }

    pub(crate) fn at(self, index: usize) -> Self {
        Location {
            index: Some(index),
            ..self
        }
    }

    /// The error a failed read here becomes.
    pub(crate) fn err(self, e: ReadError) -> DecodeError {
        match e {
            ReadError::Eof => DecodeError::Truncated { at: self },
            ReadError::Type { expected, found } => DecodeError::UnexpectedType {
                at: self,
                expected,
                found,
            },
            ReadError::Utf8 => DecodeError::InvalidUtf8 { at: self },
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.event {
            Some(i) => write!(f, "event {i}")?,
            None => f.write_str("batch")?,
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        if let Some(i) = self.index {
            write!(f, "[{i}]")?;
        }
        Ok(())
    }
}

/// Why [`decode_batch`](crate::decode_batch) refused a payload. Each variant
/// says where ([`Location`]); the message reads like
/// `event 3: token_ids: expected an array, found a string`.
///
/// An error in the batch's frame (its array or map, `ts`, the `events`
/// array's header) or one that breaks the msgpack framing of an event
/// refuses the whole batch. An event that is well framed but does not
/// decode (a field of the wrong type, a list over a limit) is skipped
/// alone and counted in [`Batch::bad`](crate::Batch::bad), so that one
/// bad removal does not take the batch's other events with it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// The payload ends inside a value: it was cut short, or a length field
    /// claims more bytes or elements than are left.
    #[error("{at}: the payload ends inside this value")]
    Truncated { at: Location },
    /// A value has a msgpack type the format does not allow there.
    #[error("{at}: expected {expected}, found {found}")]
    UnexpectedType {
        at: Location,
        expected: &'static str,
        found: &'static str,
    },
    /// A string (a map key, an event type, `medium`, `lora_name`) is not
    /// UTF-8.
    #[error("{at}: the string is not valid UTF-8")]
    InvalidUtf8 { at: Location },
    /// A required field is absent: a key of a map-form event or batch, or a
    /// position of an array-form one.
    #[error("{at}: missing")]
    Missing { at: Location },
    /// A block hash sent as bytes is shorter than the 8 bytes a `u64` hash
    /// is taken from.
    #[error("{at}: hash of {len} bytes (at least 8 needed)")]
    ShortHash { at: Location, len: usize },
    /// A token id sent as an array (SGLang's `(token, next_token)` pairs)
    /// is an empty one.
    #[error("{at}: an empty array where a token id (or a pair) belongs")]
    EmptyToken { at: Location },
    /// An int does not fit its field: a token id, a block size or a data
    /// parallel rank must be a non-negative `u32`.
    #[error("{at}: {value} does not fit in a u32")]
    OutOfRange { at: Location, value: i128 },
    /// A list declares more elements than a [`DecodeLimits`](crate::DecodeLimits)
    /// field allows.
    #[error("{at}: {len} elements, more than {limit} ({max})")]
    Limit {
        at: Location,
        /// The `DecodeLimits` field: `max_events`, `max_hashes` or `max_tokens`.
        limit: &'static str,
        len: usize,
        max: usize,
    },
    /// Bytes follow the batch; a payload is exactly one msgpack value (the
    /// engines' msgspec decoder refuses trailing bytes too).
    #[error("{extra} trailing bytes after the batch")]
    TrailingBytes { extra: usize },
}

/// The length of the list at `r`, refused with [`DecodeError::Limit`] past
/// `max` (the [`super::DecodeLimits`] field named `limit`).
pub(super) fn list_len(
    r: &mut Reader<'_>,
    at: Location,
    limit: &'static str,
    max: usize,
) -> Result<usize, DecodeError> {
    let n = r.array_len().map_err(|e| at.err(e))?;
    if n > max {
        return Err(DecodeError::Limit {
            at,
            limit,
            len: n,
            max,
        });
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_say_what_and_where() {
        let e = Location::event(3, "token_ids").err(ReadError::Type {
            expected: "an array",
            found: "a string",
        });
        assert_eq!(
            e.to_string(),
            "event 3: token_ids: expected an array, found a string"
        );
        let e = DecodeError::ShortHash {
            at: Location::event(0, "block_hashes").at(2),
            len: 4,
        };
        assert_eq!(
            e.to_string(),
            "event 0: block_hashes[2]: hash of 4 bytes (at least 8 needed)"
        );
        assert_eq!(
            Location::BATCH.err(ReadError::Eof).to_string(),
            "batch: the payload ends inside this value"
        );
        assert_eq!(Location::batch("ts").to_string(), "batch: ts");
    }
}
