//! A frame's 16-byte header, and cutting whole frames out of bytes (see
//! `frame.rs` for the layout and the stream reader).

use crate::error::WireError;
use crate::limits::MAX_FRAME_CEILING;
use crate::version::VERSION;

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 16;
pub(crate) const MAGIC: [u8; 2] = *b"PI";

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Client to server.
    Request = 1,
    /// Server to client.
    Response = 2,
    /// Client to server, with an empty payload: "send me your snapshot".
    /// Answered by one response frame (`Reply::Done` or an error) followed,
    /// after `Done`, by the snapshot's bytes until the stream ends; so it is
    /// the last frame a client sends on its stream. A replica filling itself
    /// from a peer asks this (see `docs/protocol.md`, "Snapshots").
    Snapshot = 3,
}

impl Kind {
    /// Whether a reader expecting `self` frames takes a `kind` frame: a
    /// server's request streams also carry snapshot requests.
    pub(crate) fn takes(self, kind: Kind) -> bool {
        kind == self || (self == Kind::Request && kind == Kind::Snapshot)
    }
}

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Request or response.
    pub kind: Kind,
    /// Payload bytes after the header.
    pub len: u32,
    /// The client's request id, echoed in the response.
    pub request_id: u64,
}

/// Reads a header from the start of `buf`: `Ok(None)` if fewer than
/// [`HEADER_LEN`] bytes are there yet. A length over `max_frame_bytes` (or
/// over [`MAX_FRAME_CEILING`], whichever is less) is refused from the header
/// alone.
pub fn decode_header(buf: &[u8], max_frame_bytes: u32) -> Result<Option<Header>, WireError> {
    let Some(h) = buf.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let (magic, version) = ([h[0], h[1]], h[2]);
    if magic != MAGIC || version != VERSION {
        return Err(WireError::BadVersion { magic, version });
    }
    let kind = match h[3] {
        1 => Kind::Request,
        2 => Kind::Response,
        3 => Kind::Snapshot,
        k => return Err(WireError::UnknownKind(k)),
    };
    let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let max = max_frame_bytes.min(MAX_FRAME_CEILING);
    if len > max {
        return Err(WireError::FrameTooLarge { len, max });
    }
    Ok(Some(Header {
        kind,
        len,
        request_id: request_id(h),
    }))
}

/// The request id of a header, as far as it arrived (0 before all 16 bytes).
pub(crate) fn request_id(header: &[u8]) -> u64 {
    header
        .get(8..HEADER_LEN)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// One whole frame at the front of a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'b> {
    /// Its header.
    pub header: Header,
    /// Its payload bytes.
    pub payload: &'b [u8],
    /// Bytes of the buffer it used (header and payload).
    pub used: usize,
}

/// Splits one whole frame off the front of `buf`. `Ok(None)` means more bytes
/// are needed.
pub fn split_frame(buf: &[u8], max_frame_bytes: u32) -> Result<Option<Frame<'_>>, WireError> {
    let Some(header) = decode_header(buf, max_frame_bytes)? else {
        return Ok(None);
    };
    let end = HEADER_LEN + header.len as usize;
    Ok(buf.get(HEADER_LEN..end).map(|payload| Frame {
        header,
        payload,
        used: end,
    }))
}
