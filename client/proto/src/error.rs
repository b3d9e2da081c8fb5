//! Error codes on the wire, and the typed errors of decoding.

use thiserror::Error;

use crate::message::Reply;
use crate::version::VERSION;

/// Error codes carried in [`Reply::Error`], in `STOP_SENDING` and in QUIC
/// close frames. Numbers are stable: a code is never reused for another
/// meaning.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The payload did not decode, or the stream ended inside a frame.
    Malformed = 1,
    /// The header's magic or version is not ours.
    BadVersion = 2,
    /// The header's kind is not the one this stream carries (a server reads
    /// only requests, kind 1; a client only responses, kind 2).
    UnknownKind = 3,
    /// The payload is longer than `max_frame_bytes`.
    FrameTooLarge = 4,
    /// A key is longer than `max_key_blocks`.
    KeyTooLong = 5,
    /// A batch has more than `max_batch` ops.
    BatchTooLarge = 6,
    /// A model or pod name is empty or longer than `max_name_len`.
    BadName = 7,
    /// A lookup lists more than `max_candidates` pods.
    TooManyCandidates = 8,
    /// The index has `max_pods` pods.
    TooManyPods = 9,
    /// The index has `max_models` models.
    TooManyModels = 10,
    /// The index is at `max_blocks`; retry after the next sweep.
    IndexFull = 11,
    /// This client may not do that.
    Forbidden = 12,
    /// The server is shutting down or overloaded.
    Unavailable = 13,
    /// A bug on the server side.
    Internal = 14,
    /// An engine subscription is refused: a field empty or too long, an
    /// endpoint that is not `tcp://`, a block size that does not map to the
    /// server's token block, or `max-engines` reached. The message says which.
    BadSubscription = 15,
    /// This server does not do that op (the engine ops, on a server that
    /// does not follow engines).
    Unsupported = 16,
    /// A snapshot asked of a replica that is filling itself from its peers
    /// and holds nothing of its own to give: a replica that hears this from
    /// every peer knows the whole set is new, and starts empty at once.
    Cold = 17,
    /// A receipt the server cannot count: its pod is not in the index
    /// (never named, or removed since), or its figures cannot be true of
    /// its key (a prediction longer than the key, a reuse longer than the
    /// prompt or the key).
    BadReceipt = 18,
}

impl ErrorCode {
    /// Every code, in number order.
    pub const ALL: [ErrorCode; 18] = [
        ErrorCode::Malformed,
        ErrorCode::BadVersion,
        ErrorCode::UnknownKind,
        ErrorCode::FrameTooLarge,
        ErrorCode::KeyTooLong,
        ErrorCode::BatchTooLarge,
        ErrorCode::BadName,
        ErrorCode::TooManyCandidates,
        ErrorCode::TooManyPods,
        ErrorCode::TooManyModels,
        ErrorCode::IndexFull,
        ErrorCode::Forbidden,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
        ErrorCode::BadSubscription,
        ErrorCode::Unsupported,
        ErrorCode::Cold,
        ErrorCode::BadReceipt,
    ];

    /// The code for a number, if known (newer peers may send codes we lack).
    pub fn from_u16(n: u16) -> Option<ErrorCode> {
        Self::ALL.into_iter().find(|c| *c as u16 == n)
    }

    /// Its name in `snake_case`, as JSON error bodies and metrics carry it.
    pub const fn name(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::BadVersion => "bad_version",
            ErrorCode::UnknownKind => "unknown_kind",
            ErrorCode::FrameTooLarge => "frame_too_large",
            ErrorCode::KeyTooLong => "key_too_long",
            ErrorCode::BatchTooLarge => "batch_too_large",
            ErrorCode::BadName => "bad_name",
            ErrorCode::TooManyCandidates => "too_many_candidates",
            ErrorCode::TooManyPods => "too_many_pods",
            ErrorCode::TooManyModels => "too_many_models",
            ErrorCode::IndexFull => "index_full",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::BadSubscription => "bad_subscription",
            ErrorCode::Unsupported => "unsupported",
            ErrorCode::Cold => "cold",
            ErrorCode::BadReceipt => "bad_receipt",
        }
    }

    /// A reply carrying this code and `message`.
    pub fn reply(self, message: impl ToString) -> Reply {
        Reply::Error {
            code: self as u16,
            message: message.to_string(),
        }
    }
}

/// Why bytes could not be turned into a message, or a message breaks a limit.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum WireError {
    /// The header does not start with `PI` or has another version.
    #[error("not a prefix-index/{VERSION} frame (magic {magic:?}, version {version})")]
    BadVersion {
        /// The first two bytes.
        magic: [u8; 2],
        /// The version byte.
        version: u8,
    },
    /// The kind byte is not the one this stream carries.
    #[error("unexpected frame kind {0}")]
    UnknownKind(u8),
    /// The header announces more payload than allowed.
    #[error("frame of {len} bytes exceeds max_frame_bytes = {max}")]
    FrameTooLarge {
        /// Announced payload length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The payload did not decode, had bytes left over, or the stream ended
    /// inside a frame.
    #[error("malformed payload: {0}")]
    Malformed(String),
    /// A key is too long.
    #[error("key of {len} blocks exceeds max_key_blocks = {max}")]
    KeyTooLong {
        /// Blocks sent.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A batch is too large.
    #[error("batch of {len} ops exceeds max_batch = {max}")]
    BatchTooLarge {
        /// Ops sent.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A name is empty or too long.
    #[error("name of {len} bytes is not allowed (1 to {max})")]
    BadName {
        /// Bytes sent.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// Too many candidates.
    #[error("{len} candidates exceed max_candidates = {max}")]
    TooManyCandidates {
        /// Candidates sent.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A digest question lists more groups, cells or items than one answer
    /// may carry.
    #[error("a digest question of {len} groups, cells or items exceeds {max}")]
    TooManyDigestItems {
        /// Listed.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A batch carries more than one `Digest` question.
    #[error("a batch of {len} digest questions: a batch carries at most one")]
    DigestsInBatch {
        /// Digest questions sent.
        len: usize,
    },
    /// A field of an engine subscription is empty where it may not be, or
    /// too long (see [`Limits::max_text_len`](crate::Limits::max_text_len)).
    #[error("engine subscription's {field} of {len} bytes is not allowed ({min} to {max})")]
    BadEngineField {
        /// The field: `endpoint`, `replay`, `topic`, `media` (its names
        /// joined by `+`, as in the server's text form) or `media name`.
        field: &'static str,
        /// Bytes sent.
        len: usize,
        /// The least allowed.
        min: usize,
        /// The limit.
        max: usize,
    },
    /// A receipt's figures cannot be true of its key.
    #[error("bad receipt: {0}")]
    BadReceipt(#[from] crate::message::ReceiptError),
}

impl WireError {
    /// The code to answer this error with.
    pub fn code(&self) -> ErrorCode {
        match self {
            WireError::BadVersion { .. } => ErrorCode::BadVersion,
            WireError::UnknownKind(_) => ErrorCode::UnknownKind,
            WireError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            WireError::Malformed(_) => ErrorCode::Malformed,
            WireError::KeyTooLong { .. } => ErrorCode::KeyTooLong,
            WireError::BatchTooLarge { .. } => ErrorCode::BatchTooLarge,
            WireError::BadName { .. } => ErrorCode::BadName,
            WireError::TooManyCandidates { .. } => ErrorCode::TooManyCandidates,
            WireError::BadEngineField { .. } => ErrorCode::BadSubscription,
            WireError::BadReceipt(_) => ErrorCode::BadReceipt,
            WireError::TooManyDigestItems { .. } | WireError::DigestsInBatch { .. } => {
                ErrorCode::BatchTooLarge
            }
        }
    }

    /// This error as a reply.
    pub fn to_reply(&self) -> Reply {
        self.code().reply(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_numbered_in_order_and_round_trip() {
        for (i, c) in ErrorCode::ALL.into_iter().enumerate() {
            assert_eq!(c as u16, i as u16 + 1);
            assert_eq!(ErrorCode::from_u16(c as u16), Some(c));
        }
        assert_eq!(ErrorCode::from_u16(0), None);
        assert_eq!(ErrorCode::from_u16(19), None);
    }
}
