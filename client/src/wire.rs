//! The wire protocol, sans-IO: bytes in, typed messages out, and back.
//!
//! Every message travels in a **frame**: a 16-byte header followed by a
//! bincode-encoded payload.
//!
//! ```text
//!  0      2        3      4              8                     16
//!  +------+--------+------+--------------+---------------------+-----------
//!  | "PI" | version| kind | payload len  | request id          | payload …
//!  |      |   u8   |  u8  |   u32 LE     |   u64 LE            |
//!  +------+--------+------+--------------+---------------------+-----------
//! ```
//!
//! `kind` is 1 for a [`Request`], 2 for a [`Response`]. The request id is the
//! client's: the server echoes it, so many requests can be in flight on one
//! stream and answered in any order. A [`Request`] carries one [`Op`] or a batch
//! of them; a [`Response`] carries one [`Reply`] per op, in order.
//!
//! All encoding lives in this module and in [`PodName`]'s own impls (bincode
//! 2.0.1, standard config, little-endian varints): a maintained
//! bincode-compatible codec can replace it without touching anything else. Decoding never trusts a length field: frames
//! over [`Limits::max_frame_bytes`] are refused from the header alone, and
//! bincode runs with a hard allocation ceiling ([`DECODE_CEILING`]) so a short
//! frame cannot make it reserve a huge vector. Every failure is a [`WireError`]
//! with an [`ErrorCode`] for the reply.

use bincode::{Decode, Encode};
use thiserror::Error;

pub use crate::pod_name::PodName;

/// The QUIC ALPN of this protocol version.
pub const ALPN: &[u8] = b"prefix-index/1";
/// The frame format version this module speaks.
pub const VERSION: u8 = 1;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 16;
const MAGIC: [u8; 2] = *b"PI";
/// The most bytes bincode may reserve while decoding one payload, whatever its
/// length fields say: 64 MiB, four times the largest `max_frame_bytes` we accept.
/// Small payloads get much less (see [`decode_budget`]).
pub const DECODE_CEILING: usize = 64 << 20;
/// The largest `max_frame_bytes` a configuration may set: 16 MiB.
pub const MAX_FRAME_CEILING: u32 = 16 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_CEILING>()
}

/// Protocol limits. Both ends check them; the server's are authoritative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload in bytes. Default 1 MiB: a batch of 64 lookups of
    /// 2,048-block keys.
    pub max_frame_bytes: u32,
    /// Longest key in blocks. Default 2,048 (the index's `max_key_blocks`).
    pub max_key_blocks: usize,
    /// Most ops in one batch. Default 1,024.
    pub max_batch: usize,
    /// Longest model or pod name in bytes. Default 253 (a DNS-1123 name).
    pub max_name_len: usize,
    /// Most candidate pods in one lookup. Default 1,024.
    pub max_candidates: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 1 << 20,
            max_key_blocks: 2048,
            max_batch: 1024,
            max_name_len: 253,
            max_candidates: 1024,
        }
    }
}

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Client to server.
    Request,
    /// Server to client.
    Response,
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

/// One operation on the index.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Op {
    /// Each pod's matched leading blocks of `key` (or only the candidates').
    Lookup {
        /// Model namespace.
        model: String,
        /// Block hashes.
        key: Vec<u64>,
        /// Only these pods, if given.
        candidates: Option<Vec<String>>,
    },
    /// `pod` now holds every prefix of `key`.
    Insert {
        /// Model namespace.
        model: String,
        /// Block hashes.
        key: Vec<u64>,
        /// The pod.
        pod: String,
    },
    /// Forget a pod everywhere.
    RemovePod {
        /// The pod.
        pod: String,
    },
    /// Set a pod's capacity in blocks.
    SetPodCapacity {
        /// The pod.
        pod: String,
        /// Capacity in blocks.
        blocks: u64,
    },
    /// Index statistics.
    Stats,
    /// Liveness check.
    Ping,
}

/// A request payload.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Request {
    /// One operation.
    One(Op),
    /// Many operations, applied in order, answered in order.
    Batch(Vec<Op>),
}

/// One pod's answer to a lookup.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct PodBlocks {
    /// The pod (on the wire, a string).
    pub pod: PodName,
    /// Leading blocks of the key it holds.
    pub blocks: u32,
}

/// Index statistics on the wire (see `prefix_index::Stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Encode, Decode)]
pub struct WireStats {
    /// Models.
    pub models: u64,
    /// Live pods.
    pub pods: u64,
    /// Tree nodes.
    pub nodes: u64,
    /// Distinct stored blocks.
    pub tree_blocks: u64,
    /// Stored (pod, block) pairs.
    pub entries: u64,
    /// Heap bytes of the index.
    pub bytes: u64,
}

impl From<prefix_index::Stats> for WireStats {
    fn from(s: prefix_index::Stats) -> Self {
        WireStats {
            models: s.models,
            pods: s.pods,
            nodes: s.nodes,
            tree_blocks: s.tree_blocks,
            entries: s.entries,
            bytes: s.bytes,
        }
    }
}

/// The answer to one [`Op`].
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Reply {
    /// Answer to a lookup: the key's block count and every matching pod.
    Lookup {
        /// Blocks in the key.
        key_blocks: u32,
        /// Pods by blocks descending, then name.
        matches: Vec<PodBlocks>,
    },
    /// Insert or capacity change applied.
    Done,
    /// Whether `RemovePod` found the pod.
    Removed(bool),
    /// Statistics.
    Stats(WireStats),
    /// Answer to `Ping`.
    Pong,
    /// The op failed; `code` is an [`ErrorCode`] number.
    Error {
        /// See [`ErrorCode`].
        code: u16,
        /// Human-readable detail.
        message: String,
    },
}

/// A response payload: one reply per op of the request, in order.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Response {
    /// Reply to [`Request::One`].
    One(Reply),
    /// Replies to [`Request::Batch`].
    Batch(Vec<Reply>),
}

/// Error codes carried in [`Reply::Error`] and in QUIC close frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The payload did not decode.
    Malformed = 1,
    /// The header's magic or version is not ours.
    BadVersion = 2,
    /// The header's kind is unknown (or a response sent to a server).
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
}

impl ErrorCode {
    /// The code for a number, if known (newer peers may send codes we lack).
    pub fn from_u16(n: u16) -> Option<ErrorCode> {
        use ErrorCode::*;
        [
            Malformed,
            BadVersion,
            UnknownKind,
            FrameTooLarge,
            KeyTooLong,
            BatchTooLarge,
            BadName,
            TooManyCandidates,
            TooManyPods,
            TooManyModels,
            IndexFull,
            Forbidden,
            Unavailable,
            Internal,
        ]
        .into_iter()
        .find(|c| *c as u16 == n)
    }
}

/// Why bytes could not be turned into a message.
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
    /// The kind byte is neither request nor response.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// The header announces more payload than allowed.
    #[error("frame of {len} bytes exceeds max_frame_bytes = {max}")]
    FrameTooLarge {
        /// Announced payload length.
        len: u32,
        /// The limit.
        max: u32,
    },
    /// The payload did not decode, or had bytes left over.
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
        }
    }

    /// This error as a reply.
    pub fn to_reply(&self) -> Reply {
        Reply::Error {
            code: self.code() as u16,
            message: self.to_string(),
        }
    }
}

/// Reads a header from the start of `buf`: `Ok(None)` if fewer than
/// [`HEADER_LEN`] bytes are there yet.
pub fn decode_header(buf: &[u8], limits: &Limits) -> Result<Option<Header>, WireError> {
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
        k => return Err(WireError::UnknownKind(k)),
    };
    let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    let max = limits.max_frame_bytes.min(MAX_FRAME_CEILING);
    if len > max {
        return Err(WireError::FrameTooLarge { len, max });
    }
    let request_id = u64::from_le_bytes([h[8], h[9], h[10], h[11], h[12], h[13], h[14], h[15]]);
    Ok(Some(Header {
        kind,
        len,
        request_id,
    }))
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
pub fn split_frame<'b>(buf: &'b [u8], limits: &Limits) -> Result<Option<Frame<'b>>, WireError> {
    let Some(header) = decode_header(buf, limits)? else {
        return Ok(None);
    };
    let end = HEADER_LEN + header.len as usize;
    Ok(buf.get(HEADER_LEN..end).map(|payload| Frame {
        header,
        payload,
        used: end,
    }))
}

fn encode_frame<T: Encode>(kind: u8, request_id: u64, msg: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[VERSION, kind, 0, 0, 0, 0]);
    out.extend_from_slice(&request_id.to_le_bytes());
    // Encoding into a Vec cannot fail: the writer never runs out of room and
    // our messages have no fallible encoders.
    let _ = bincode::encode_into_std_write(msg, out, config());
    // Payloads are built by us within `max_frame_bytes` (≤ 16 MiB); saturate
    // anyway so a bug yields a frame the peer refuses, not a wrapped length.
    let len = u32::try_from(out.len() - start - HEADER_LEN).unwrap_or(u32::MAX);
    out[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
}

/// Writes a response frame piece by piece, from borrowed data: the server's
/// path for lookup answers, which would otherwise copy every pod name into an
/// owned [`Reply`] only to encode it. The bytes are exactly those of
/// [`encode_response`] for the equivalent [`Response`].
pub struct ResponseWriter<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> ResponseWriter<'a> {
    fn begin(out: &'a mut Vec<u8>, request_id: u64) -> Self {
        let start = out.len();
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&[VERSION, 2, 0, 0, 0, 0]);
        out.extend_from_slice(&request_id.to_le_bytes());
        ResponseWriter { out, start }
    }

    fn put<T: Encode>(&mut self, v: T) {
        // Encoding into a Vec cannot fail (see `encode_frame`).
        let _ = bincode::encode_into_std_write(v, self.out, config());
    }

    /// Starts a [`Response::One`]; write exactly one reply next.
    pub fn one(out: &'a mut Vec<u8>, request_id: u64) -> Self {
        let mut w = Self::begin(out, request_id);
        w.put(0u32);
        w
    }

    /// Starts a [`Response::Batch`] of `replies` replies; write exactly that
    /// many next.
    pub fn batch(out: &'a mut Vec<u8>, request_id: u64, replies: usize) -> Self {
        let mut w = Self::begin(out, request_id);
        w.put(1u32);
        w.put(replies as u64);
        w
    }

    /// Writes a [`Reply::Lookup`] listing `matches` (pod name, blocks).
    pub fn lookup(&mut self, key_blocks: u32, matches: &[(&str, u32)]) {
        self.put(0u32);
        self.put(key_blocks);
        self.put(matches.len() as u64);
        for (pod, blocks) in matches {
            self.put(*pod);
            self.put(*blocks);
        }
    }

    /// Writes any reply.
    pub fn reply(&mut self, reply: &Reply) {
        self.put(reply);
    }

    /// Payload bytes written so far.
    pub fn len(&self) -> usize {
        self.out.len() - self.start - HEADER_LEN
    }

    /// Whether no payload byte has been written (never true after `one` or
    /// `batch`, which write the variant).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the frame written so far, leaving the buffer as it was.
    pub fn abandon(self) {
        self.out.truncate(self.start);
    }

    /// Completes the frame (fills in its length).
    pub fn finish(self) {
        let len = u32::try_from(self.out.len() - self.start - HEADER_LEN).unwrap_or(u32::MAX);
        self.out[self.start + 4..self.start + 8].copy_from_slice(&len.to_le_bytes());
    }
}

/// Appends a request frame to `out`.
pub fn encode_request(request_id: u64, request: &Request, out: &mut Vec<u8>) {
    encode_frame(1, request_id, request, out);
}

/// Appends a response frame to `out`.
pub fn encode_response(request_id: u64, response: &Response, out: &mut Vec<u8>) {
    encode_frame(2, request_id, response, out);
}

/// The most bytes decoding a payload of `len` bytes may reserve. Bincode
/// reserves a container's memory from its length field before reading its
/// elements, against this budget; so it must be generous enough for real
/// payloads (every element costs at least one byte on the wire and at most
/// 128 in memory, an `Op` in a batch: 128 × `len` suffices), and small enough
/// that a short frame with a huge length field cannot make the server
/// reserve megabytes. It is at most max(1 MiB, 1024 × `len`), and never more
/// than [`DECODE_CEILING`].
pub fn decode_budget(len: usize) -> usize {
    match len {
        0..=8_192 => 1 << 20,
        8_193..=65_536 => 8 << 20,
        _ => DECODE_CEILING,
    }
}

fn decode_payload<T: Decode<()>>(payload: &[u8]) -> Result<T, WireError> {
    fn with<const N: usize, T: Decode<()>>(
        p: &[u8],
    ) -> Result<(T, usize), bincode::error::DecodeError> {
        bincode::decode_from_slice(p, bincode::config::standard().with_limit::<N>())
    }
    let decoded = match decode_budget(payload.len()) {
        b if b == 1 << 20 => with::<{ 1 << 20 }, T>(payload),
        b if b == 8 << 20 => with::<{ 8 << 20 }, T>(payload),
        _ => with::<DECODE_CEILING, T>(payload),
    };
    let (msg, used) = decoded.map_err(|e| WireError::Malformed(e.to_string()))?;
    if used != payload.len() {
        return Err(WireError::Malformed(format!(
            "{} bytes left over",
            payload.len() - used
        )));
    }
    Ok(msg)
}

fn check_name(name: &str, limits: &Limits) -> Result<(), WireError> {
    if name.is_empty() || name.len() > limits.max_name_len {
        return Err(WireError::BadName {
            len: name.len(),
            max: limits.max_name_len,
        });
    }
    Ok(())
}

/// Checks one op against the limits.
pub fn check_op(op: &Op, limits: &Limits) -> Result<(), WireError> {
    let key_ok = |key: &[u64]| {
        if key.len() > limits.max_key_blocks {
            return Err(WireError::KeyTooLong {
                len: key.len(),
                max: limits.max_key_blocks,
            });
        }
        Ok(())
    };
    match op {
        Op::Lookup {
            model,
            key,
            candidates,
        } => {
            check_name(model, limits)?;
            key_ok(key)?;
            if let Some(c) = candidates {
                if c.len() > limits.max_candidates {
                    return Err(WireError::TooManyCandidates {
                        len: c.len(),
                        max: limits.max_candidates,
                    });
                }
                c.iter().try_for_each(|p| check_name(p, limits))?;
            }
            Ok(())
        }
        Op::Insert { model, key, pod } => {
            check_name(model, limits)?;
            check_name(pod, limits)?;
            key_ok(key)
        }
        Op::RemovePod { pod } | Op::SetPodCapacity { pod, .. } => check_name(pod, limits),
        Op::Stats | Op::Ping => Ok(()),
    }
}

/// Decodes a request payload. Limits on individual ops are checked by the
/// caller with [`check_op`], so one bad op in a batch fails alone.
pub fn decode_request(payload: &[u8], limits: &Limits) -> Result<Request, WireError> {
    let request: Request = decode_payload(payload)?;
    if let Request::Batch(ops) = &request {
        if ops.len() > limits.max_batch {
            return Err(WireError::BatchTooLarge {
                len: ops.len(),
                max: limits.max_batch,
            });
        }
    }
    Ok(request)
}

/// Decodes a response payload.
pub fn decode_response(payload: &[u8]) -> Result<Response, WireError> {
    decode_payload(payload)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup() -> Request {
        Request::One(Op::Lookup {
            model: "m".into(),
            key: vec![1, 300],
            candidates: None,
        })
    }

    #[test]
    fn request_bytes_are_stable() {
        let mut out = Vec::new();
        encode_request(7, &lookup(), &mut out);
        // Header: "PI", version 1, kind 1, length 10, request id 7.
        // Payload: variant One (0), Op::Lookup (0), "m" (len 1, 'm'), key
        // (len 2, 1, 300 as varint 251 + u16 LE), candidates None (0).
        assert_eq!(
            out,
            [
                b'P', b'I', 1, 1, 10, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, //
                0, 0, 1, b'm', 2, 1, 251, 44, 1, 0
            ]
        );
        let Frame {
            header: h,
            payload,
            used,
        } = split_frame(&out, &Limits::default()).unwrap().unwrap();
        assert_eq!(
            h,
            Header {
                kind: Kind::Request,
                len: 10,
                request_id: 7
            }
        );
        assert_eq!(used, out.len());
        assert_eq!(
            decode_request(payload, &Limits::default()).unwrap(),
            lookup()
        );
    }

    #[test]
    fn responses_round_trip() {
        let resp = Response::Batch(vec![
            Reply::Lookup {
                key_blocks: 3,
                matches: vec![PodBlocks {
                    pod: "a".into(),
                    blocks: 3,
                }],
            },
            Reply::Done,
            Reply::Removed(true),
            Reply::Stats(WireStats {
                entries: 9,
                ..WireStats::default()
            }),
            Reply::Pong,
            WireError::KeyTooLong { len: 9, max: 4 }.to_reply(),
        ]);
        let mut out = Vec::new();
        encode_response(u64::MAX, &resp, &mut out);
        let f = split_frame(&out, &Limits::default()).unwrap().unwrap();
        assert_eq!(
            (f.header.kind, f.header.request_id),
            (Kind::Response, u64::MAX)
        );
        assert_eq!(decode_response(f.payload).unwrap(), resp);
    }

    #[test]
    fn the_response_writer_matches_the_derived_encoding() {
        let lookup = Reply::Lookup {
            key_blocks: 300,
            matches: vec![
                PodBlocks {
                    pod: "pod-a".into(),
                    blocks: 300,
                },
                PodBlocks {
                    pod: "b".into(),
                    blocks: 1,
                },
            ],
        };
        let (mut want, mut got) = (Vec::new(), Vec::new());
        encode_response(9, &Response::One(lookup.clone()), &mut want);
        let mut w = ResponseWriter::one(&mut got, 9);
        w.lookup(300, &[("pod-a", 300), ("b", 1)]);
        w.finish();
        assert_eq!(got, want);

        let batch = Response::Batch(vec![lookup, Reply::Done, Reply::Pong]);
        let (mut want, mut got) = (Vec::new(), vec![1, 2, 3]);
        want.extend_from_slice(&[1, 2, 3]);
        encode_response(u64::MAX, &batch, &mut want);
        let mut w = ResponseWriter::batch(&mut got, u64::MAX, 3);
        w.lookup(300, &[("pod-a", 300), ("b", 1)]);
        w.reply(&Reply::Done);
        w.reply(&Reply::Pong);
        w.finish();
        assert_eq!(got, want);
    }

    #[test]
    fn partial_frames_wait_for_more_bytes() {
        let mut out = Vec::new();
        encode_request(1, &lookup(), &mut out);
        for cut in 0..out.len() {
            assert_eq!(
                split_frame(&out[..cut], &Limits::default()),
                Ok(None),
                "cut {cut}"
            );
        }
    }

    #[test]
    fn bad_headers_are_typed_errors() {
        let limits = Limits {
            max_frame_bytes: 100,
            ..Limits::default()
        };
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&[b'P', b'I', 1, 1]);
        assert!(decode_header(&h, &limits).unwrap().is_some());
        h[2] = 2;
        assert_eq!(
            decode_header(&h, &limits).unwrap_err().code(),
            ErrorCode::BadVersion
        );
        h[2] = 1;
        h[3] = 9;
        assert_eq!(decode_header(&h, &limits), Err(WireError::UnknownKind(9)));
        h[3] = 1;
        h[4..8].copy_from_slice(&101u32.to_le_bytes());
        assert_eq!(
            decode_header(&h, &limits),
            Err(WireError::FrameTooLarge { len: 101, max: 100 })
        );
    }

    #[test]
    fn hostile_length_fields_do_not_allocate() {
        // A Batch claiming 2^61 ops, then a key claiming 2^61 blocks: both must
        // fail at once (the decode ceiling), not reserve memory.
        let huge = [0xFF, 0, 0, 0, 0, 0, 0, 0, 0x20];
        let mut batch = vec![1u8];
        batch.extend_from_slice(&huge);
        assert!(matches!(
            decode_request(&batch, &Limits::default()),
            Err(WireError::Malformed(_))
        ));
        let mut key = vec![0u8, 1, 1, b'm'];
        key.extend_from_slice(&huge);
        assert!(matches!(
            decode_request(&key, &Limits::default()),
            Err(WireError::Malformed(_))
        ));
    }

    #[test]
    fn limits_are_checked_per_op() {
        let limits = Limits {
            max_key_blocks: 2,
            max_name_len: 3,
            max_candidates: 1,
            max_batch: 2,
            ..Limits::default()
        };
        let op = |model: &str, key: Vec<u64>, candidates: Option<Vec<String>>| Op::Lookup {
            model: model.into(),
            key,
            candidates,
        };
        assert_eq!(check_op(&op("m", vec![1, 2], None), &limits), Ok(()));
        assert_eq!(
            check_op(&op("m", vec![1, 2, 3], None), &limits)
                .unwrap_err()
                .code(),
            ErrorCode::KeyTooLong
        );
        assert_eq!(
            check_op(&op("", vec![], None), &limits).unwrap_err().code(),
            ErrorCode::BadName
        );
        assert_eq!(
            check_op(&op("long", vec![], None), &limits)
                .unwrap_err()
                .code(),
            ErrorCode::BadName
        );
        let two = Some(vec!["a".into(), "b".into()]);
        assert_eq!(
            check_op(&op("m", vec![], two), &limits).unwrap_err().code(),
            ErrorCode::TooManyCandidates
        );
        let mut out = Vec::new();
        encode_request(
            1,
            &Request::Batch(vec![Op::Ping, Op::Ping, Op::Stats]),
            &mut out,
        );
        let payload = split_frame(&out, &limits).unwrap().unwrap().payload;
        assert_eq!(
            decode_request(payload, &limits).unwrap_err().code(),
            ErrorCode::BatchTooLarge
        );
    }

    #[test]
    fn trailing_bytes_are_malformed() {
        let mut out = Vec::new();
        encode_request(1, &Request::One(Op::Ping), &mut out);
        out.push(0);
        let payload = &out[HEADER_LEN..];
        assert!(matches!(
            decode_request(payload, &Limits::default()),
            Err(WireError::Malformed(_))
        ));
    }

    #[test]
    fn every_error_code_round_trips() {
        for n in 0..=20u16 {
            if let Some(c) = ErrorCode::from_u16(n) {
                assert_eq!(c as u16, n);
            }
        }
        assert_eq!(ErrorCode::from_u16(14), Some(ErrorCode::Internal));
        assert_eq!(ErrorCode::from_u16(15), None);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// Arbitrary bytes never panic the decoders; each failure is typed.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let limits = Limits::default();
            let _ = split_frame(&bytes, &limits);
            let _ = decode_request(&bytes, &limits);
            let _ = decode_response(&bytes);
        }
    }
}
