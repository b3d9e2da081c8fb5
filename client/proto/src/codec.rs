//! The payload codec: messages to bytes and back, bincode 2.0.1 with the
//! standard configuration (little-endian varints).
//!
//! All use of bincode is here, in the messages' derives and in
//! [`PodName`](crate::PodName)'s own impls, so a maintained bincode-compatible
//! codec can replace it without touching anything else. Decoding never trusts
//! a length field: bincode runs with an allocation budget scaled to the
//! payload ([`decode_budget`]), so a short frame cannot make it reserve a
//! huge vector, and a payload must decode exactly, with no byte left over.

use bincode::{Decode, Encode};

use crate::error::WireError;
use crate::header::{Kind, HEADER_LEN, MAGIC};
use crate::limits::Limits;
use crate::message::{PodDetail, ReceiptCounts, Reply, Request, Response};
use crate::version::VERSION;

/// The most bytes bincode may reserve while decoding one payload, whatever its
/// length fields say: 64 MiB, four times the largest `max_frame_bytes` we accept.
/// Small payloads get much less (see [`decode_budget`]).
pub const DECODE_CEILING: usize = 64 << 20;

fn config() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<DECODE_CEILING>()
}

fn encode_frame<T: Encode>(kind: Kind, request_id: u64, msg: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[VERSION, kind as u8, 0, 0, 0, 0]);
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
        out.extend_from_slice(&[VERSION, Kind::Response as u8, 0, 0, 0, 0]);
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
    pub fn lookup<S: AsRef<str>>(&mut self, key_blocks: u32, matches: &[(S, u32)]) {
        self.put(0u32);
        self.put(key_blocks);
        self.put(matches.len() as u64);
        for (pod, blocks) in matches {
            self.put(pod.as_ref());
            self.put(*blocks);
        }
    }

    /// Writes any reply.
    pub fn reply(&mut self, reply: &Reply) {
        self.put(reply);
    }

    /// Writes a [`Reply::Detail`]. Each pod's recent receipts are not in
    /// this encoding (its `PodDetail` is fixed: see `docs/protocol.md`); the
    /// JSON form carries them ([`crate::json::JsonWriter::detail`]).
    pub fn detail(&mut self, key_blocks: u32, matches: Vec<PodDetail>, _: &[ReceiptCounts]) {
        self.put(&Reply::Detail {
            key_blocks,
            matches,
        });
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
    encode_frame(Kind::Request, request_id, request, out);
}

/// Appends a snapshot request frame ([`Kind::Snapshot`], no payload) to
/// `out`.
pub fn encode_snapshot_request(request_id: u64, out: &mut Vec<u8>) {
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&[VERSION, Kind::Snapshot as u8]);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&request_id.to_le_bytes());
}

/// Appends a response frame to `out`.
pub fn encode_response(request_id: u64, response: &Response, out: &mut Vec<u8>) {
    encode_frame(Kind::Response, request_id, response, out);
}

/// Appends the frame that answers request `request_id` with `error`: a
/// `Response::One` carrying its `Reply::Error`.
pub fn encode_error(request_id: u64, error: &WireError, out: &mut Vec<u8>) {
    encode_response(request_id, &Response::One(error.to_reply()), out);
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

/// Decodes a request payload. Limits on individual ops are checked by the
/// caller with [`Limits::check_op`], so one bad op in a batch fails alone.
pub fn decode_request(payload: &[u8], limits: &Limits) -> Result<Request, WireError> {
    let request: Request = decode_payload(payload)?;
    if let Request::Batch(ops) = &request {
        limits.check_batch(ops)?;
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
    use crate::header::{split_frame, Frame, Header};
    use crate::message::{EngineState, EngineStatus, Op, PodBlocks, Subscription, WireStats};

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
        } = split_frame(&out, 1 << 20).unwrap().unwrap();
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
            Reply::Engines(vec![EngineState {
                sub: Subscription {
                    pod: "a".into(),
                    model: "m".into(),
                    endpoint: "tcp://h:1".into(),
                    replay: Some("tcp://h:2".into()),
                    block_size: 16,
                    topic: "kv".into(),
                    media: vec!["GPU".into()],
                },
                status: EngineStatus {
                    connected: true,
                    last_seq: Some(u64::MAX),
                    events: 1,
                    blocks_stored: 2,
                    blocks_removed: 3,
                    resyncs: 4,
                    replays: 5,
                    orphaned: 6,
                    decode_errors: 7,
                    lag_ms: -8,
                    last_error: Some("gap".into()),
                },
            }]),
        ]);
        let mut out = Vec::new();
        encode_response(u64::MAX, &resp, &mut out);
        let f = split_frame(&out, 1 << 20).unwrap().unwrap();
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
            assert_eq!(split_frame(&out[..cut], 1 << 20), Ok(None), "cut {cut}");
        }
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
    fn a_batch_over_the_limit_is_refused_whole() {
        let limits = Limits {
            max_batch: 2,
            ..Limits::default()
        };
        let mut out = Vec::new();
        encode_request(
            1,
            &Request::Batch(vec![Op::Ping, Op::Ping, Op::Stats]),
            &mut out,
        );
        assert_eq!(
            decode_request(&out[HEADER_LEN..], &limits),
            Err(WireError::BatchTooLarge { len: 3, max: 2 })
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
}
