//! Frames: the 16-byte header, and [`FrameReader`], which cuts a stream's
//! bytes into whole frames.
//!
//! ```text
//!  0      2        3      4              8                     16
//!  +------+--------+------+--------------+---------------------+-----------
//!  | "PI" | version| kind | payload len  | request id          | payload …
//!  |      |   u8   |  u8  |   u32 LE     |   u64 LE            |
//!  +------+--------+------+--------------+---------------------+-----------
//! ```
//!
//! A header is checked as soon as its 16 bytes are in: a foreign magic or
//! version, the wrong kind for the stream, or a length over the reader's
//! `max_frame_bytes` is a [`FrameError`]. After one, the stream's framing
//! can no longer be trusted (skipping a huge payload would let a peer make
//! the reader consume junk), so the reader stops: it yields nothing more.

use crate::codec::{decode_request, encode_error};
use crate::error::WireError;
use crate::header::request_id;
use crate::limits::Limits;
use crate::message::Request;

pub use crate::header::{decode_header, split_frame, Frame, Header, Kind, HEADER_LEN};
pub use crate::version::{ALPN, VERSION};

/// A stream's framing failed: answer `error` with request id `id`, then end
/// the stream.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{error} (request id {id})")]
pub struct FrameError {
    /// The id in the offending header; 0 when the header had not fully
    /// arrived.
    pub id: u64,
    /// What was wrong.
    pub error: WireError,
}

impl FrameError {
    /// Appends the error frame that answers it.
    pub fn encode(&self, out: &mut Vec<u8>) {
        encode_error(self.id, &self.error, out);
    }
}

/// What a server's [`FrameReader`] yields per whole request frame.
#[derive(Debug, PartialEq, Eq)]
pub enum Incoming {
    /// A request that decoded and fits the batch limit.
    Request {
        /// Its id.
        id: u64,
        /// The request.
        request: Request,
    },
    /// A request for the server's snapshot (a [`Kind::Snapshot`] frame):
    /// the stream's last request, answered with the snapshot's bytes.
    Snapshot {
        /// Its id.
        id: u64,
    },
    /// A whole frame that must be answered with this error; the stream goes
    /// on (the frame's length was known, so the next frame is found).
    Refused {
        /// Its id.
        id: u64,
        /// Why.
        error: WireError,
    },
}

impl Incoming {
    /// Appends the error frame that answers a refused frame (nothing for a
    /// request).
    pub fn encode_refusal(&self, out: &mut Vec<u8>) {
        if let Incoming::Refused { id, error } = self {
            encode_error(*id, error, out);
        }
    }
}

/// A stream's received bytes, cut into whole frames of one kind.
///
/// The server reads request frames, the client response frames; both push
/// what QUIC hands them and take frames until [`FrameReader::next_frame`]
/// says more bytes are needed. Bytes stay in one buffer, compacted as frames
/// are taken, so a frame split over many reads costs no extra copy.
#[derive(Debug)]
pub struct FrameReader {
    buf: Vec<u8>,
    /// Start of the first byte not yet part of a taken frame.
    at: usize,
    expect: Kind,
    max_frame_bytes: u32,
    /// Set by the first framing error: nothing more is read.
    failed: bool,
    /// Bytes of whole frames taken since the start of the stream.
    taken: u64,
}

/// Taken bytes past which the buffer is compacted (when they are also more
/// than half of it): large enough that compacting is rare, small enough
/// that a long stream's buffer does not grow without bound.
const COMPACT_AT: usize = 64 << 10;

impl FrameReader {
    /// A reader of `expect` frames of at most `max_frame_bytes` payload.
    pub fn new(expect: Kind, max_frame_bytes: u32) -> Self {
        FrameReader {
            buf: Vec::new(),
            at: 0,
            expect,
            max_frame_bytes,
            failed: false,
            taken: 0,
        }
    }

    /// Appends received bytes (ignored once the framing has failed).
    pub fn push(&mut self, bytes: &[u8]) {
        if self.failed {
            return;
        }
        if self.at > 0 && self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        } else if self.at > COMPACT_AT && self.at * 2 > self.buf.len() {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet part of a whole frame.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.at
    }

    /// Bytes of whole frames taken so far: where on the stream the frame
    /// being received (if [`FrameReader::pending`]) begins.
    pub fn taken(&self) -> u64 {
        self.taken
    }

    /// Whether a framing error has stopped the reader.
    pub fn has_failed(&self) -> bool {
        self.failed
    }

    /// Takes the next whole frame off the front: `Ok(None)` when more bytes
    /// are needed, or after a framing error. The error itself is returned
    /// once; the reader then drops what it holds.
    pub fn next_frame(&mut self) -> Result<Option<Frame<'_>>, FrameError> {
        if self.failed {
            return Ok(None);
        }
        // Only plain values leave this match, so the error path below may
        // take `self` mutably. The header is checked as soon as it is in,
        // before its payload arrives.
        let rest = &self.buf[self.at..];
        let checked = match decode_header(rest, self.max_frame_bytes) {
            Ok(None) => return Ok(None),
            Ok(Some(h)) if !self.expect.takes(h.kind) => Err(WireError::UnknownKind(h.kind as u8)),
            Ok(Some(h)) if rest.len() < HEADER_LEN + h.len as usize => return Ok(None),
            Ok(Some(h)) => Ok((h, HEADER_LEN + h.len as usize)),
            Err(error) => Err(error),
        };
        match checked {
            Ok((header, used)) => {
                let start = self.at;
                self.at += used;
                self.taken += used as u64;
                Ok(Some(Frame {
                    header,
                    payload: &self.buf[start + HEADER_LEN..start + used],
                    used,
                }))
            }
            Err(error) => Err(self.fail(error)),
        }
    }

    /// Takes the next whole request frame and decodes it against `limits`
    /// (the batch size; each op is checked by whoever applies it, so one bad
    /// op in a batch fails alone).
    pub fn next_request(&mut self, limits: &Limits) -> Result<Option<Incoming>, FrameError> {
        Ok(self.next_frame()?.map(|frame| {
            let id = frame.header.request_id;
            if frame.header.kind == Kind::Snapshot {
                return match frame.payload.len() {
                    0 => Incoming::Snapshot { id },
                    n => Incoming::Refused {
                        id,
                        error: WireError::Malformed(format!(
                            "a snapshot request has no payload ({n} bytes given)"
                        )),
                    },
                };
            }
            match decode_request(frame.payload, limits) {
                Ok(request) => Incoming::Request { id, request },
                Err(error) => Incoming::Refused { id, error },
            }
        }))
    }

    /// The stream ended: the error for a frame it cut short, if any. A cut
    /// header gives request id 0 (the id was not all there).
    pub fn finish(&mut self) -> Result<(), FrameError> {
        if self.failed || self.pending() == 0 {
            return Ok(());
        }
        let error = WireError::Malformed(format!(
            "stream ended inside a frame ({} bytes of it received)",
            self.pending()
        ));
        Err(self.fail(error))
    }

    /// The frame being received did not arrive whole within `waited` of its
    /// first byte: the error that answers it; the reader then drops what it
    /// holds.
    pub fn stalled(&mut self, waited: std::time::Duration) -> FrameError {
        let error = WireError::Malformed(format!(
            "a frame did not arrive whole within {waited:?} of its first byte ({} bytes of it came)",
            self.pending()
        ));
        self.fail(error)
    }

    fn fail(&mut self, error: WireError) -> FrameError {
        let id = request_id(&self.buf[self.at..]);
        self.failed = true;
        self.buf = Vec::new();
        self.at = 0;
        FrameError { id, error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{encode_request, encode_response};
    use crate::error::ErrorCode;
    use crate::message::{Op, Reply, Response};

    fn ping(id: u64) -> Vec<u8> {
        let mut out = Vec::new();
        encode_request(id, &Request::One(Op::Ping), &mut out);
        out
    }

    fn reader() -> FrameReader {
        FrameReader::new(Kind::Request, 1 << 20)
    }

    #[test]
    fn bad_headers_are_typed_errors() {
        let mut h = [0u8; HEADER_LEN];
        h[..4].copy_from_slice(&[b'P', b'I', 1, 1]);
        assert!(decode_header(&h, 100).unwrap().is_some());
        h[2] = 2;
        assert_eq!(
            decode_header(&h, 100).unwrap_err().code(),
            ErrorCode::BadVersion
        );
        h[2] = 1;
        h[3] = 9;
        assert_eq!(decode_header(&h, 100), Err(WireError::UnknownKind(9)));
        h[3] = 1;
        h[4..8].copy_from_slice(&101u32.to_le_bytes());
        assert_eq!(
            decode_header(&h, 100),
            Err(WireError::FrameTooLarge { len: 101, max: 100 })
        );
        assert_eq!(
            decode_header(&h, u32::MAX).unwrap().unwrap().len,
            101,
            "the ceiling is 16 MiB, not the configured value"
        );
    }

    #[test]
    fn frames_split_across_pushes_come_out_whole_and_in_order() {
        let mut bytes = ping(1);
        bytes.extend(ping(2));
        let mut r = reader();
        let mut ids = Vec::new();
        for b in bytes.chunks(3) {
            r.push(b);
            while let Some(f) = r.next_frame().unwrap() {
                ids.push(f.header.request_id);
            }
        }
        assert_eq!(ids, [1, 2]);
        assert_eq!(r.pending(), 0);
        assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn a_frame_of_the_wrong_kind_stops_the_stream() {
        let mut response = Vec::new();
        encode_response(4, &Response::One(Reply::Pong), &mut response);
        response.extend(ping(5));
        let mut r = reader();
        r.push(&response);
        assert_eq!(
            r.next_frame(),
            Err(FrameError {
                id: 4,
                error: WireError::UnknownKind(2)
            })
        );
        // The ping behind it is not served: the framing is not trusted.
        assert_eq!(r.next_frame(), Ok(None));
        r.push(&ping(6));
        assert_eq!(r.next_frame(), Ok(None));
        assert!(r.has_failed());
        assert_eq!(r.finish(), Ok(()));
    }

    #[test]
    fn the_wrong_kind_is_refused_from_the_header_alone() {
        let mut response = Vec::new();
        encode_response(9, &Response::One(Reply::Pong), &mut response);
        let mut r = reader();
        r.push(&response[..HEADER_LEN]);
        assert_eq!(
            r.next_frame(),
            Err(FrameError {
                id: 9,
                error: WireError::UnknownKind(2)
            })
        );
    }

    #[test]
    fn foreign_and_oversized_headers_stop_the_stream() {
        let mut r = reader();
        r.push(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(matches!(
            r.next_frame(),
            Err(FrameError {
                error: WireError::BadVersion { .. },
                ..
            })
        ));
        let mut big = ping(3);
        big[4..8].copy_from_slice(&(2u32 << 20).to_le_bytes());
        let mut r = reader();
        r.push(&big);
        assert_eq!(
            r.next_frame(),
            Err(FrameError {
                id: 3,
                error: WireError::FrameTooLarge {
                    len: 2 << 20,
                    max: 1 << 20
                }
            })
        );
    }

    #[test]
    fn a_stream_cut_inside_a_frame_is_reported_at_its_end() {
        let f = ping(11);
        let mut r = reader();
        r.push(&f[..f.len() - 1]);
        assert_eq!(r.next_frame(), Ok(None));
        let e = r.finish().unwrap_err();
        assert_eq!((e.id, e.error.code()), (11, ErrorCode::Malformed));
        // A cut header has no id yet.
        let mut r = reader();
        r.push(&f[..HEADER_LEN - 1]);
        assert_eq!(r.next_frame(), Ok(None));
        assert_eq!(r.finish().unwrap_err().id, 0);
        assert_eq!(reader().finish(), Ok(()));
    }

    #[test]
    fn taken_marks_where_the_frame_being_received_begins() {
        let f = ping(5);
        let mut r = reader();
        r.push(&f);
        r.push(&f[..3]);
        assert_eq!(r.taken(), 0);
        assert!(r.next_frame().unwrap().is_some());
        assert_eq!(r.next_frame(), Ok(None));
        assert_eq!((r.taken(), r.pending()), (f.len() as u64, 3));
        let e = r.stalled(std::time::Duration::from_secs(1));
        assert_eq!((e.id, e.error.code()), (0, ErrorCode::Malformed));
        assert!(r.has_failed());
    }

    #[test]
    fn requests_are_decoded_and_bad_payloads_refused_alone() {
        let mut bad = ping(7);
        bad[HEADER_LEN] = 9; // no such Request variant
        bad.extend(ping(8));
        let mut r = reader();
        r.push(&bad);
        let limits = Limits::default();
        let first = r.next_request(&limits).unwrap().unwrap();
        assert!(matches!(
            &first,
            Incoming::Refused {
                id: 7,
                error: WireError::Malformed(_)
            }
        ));
        let mut answer = Vec::new();
        first.encode_refusal(&mut answer);
        assert_eq!(answer[3], Kind::Response as u8);
        assert_eq!(
            r.next_request(&limits).unwrap(),
            Some(Incoming::Request {
                id: 8,
                request: Request::One(Op::Ping)
            })
        );
        assert_eq!(r.next_request(&limits).unwrap(), None);
    }

    #[test]
    fn snapshot_requests_ride_request_streams_only() {
        let mut snap = Vec::new();
        crate::codec::encode_snapshot_request(9, &mut snap);
        assert_eq!(snap.len(), HEADER_LEN);
        let limits = Limits::default();
        let mut r = reader();
        r.push(&ping(1));
        r.push(&snap);
        assert!(matches!(
            r.next_request(&limits),
            Ok(Some(Incoming::Request { id: 1, .. }))
        ));
        assert_eq!(
            r.next_request(&limits),
            Ok(Some(Incoming::Snapshot { id: 9 }))
        );
        // A snapshot request with a payload is refused alone.
        let mut padded = snap.clone();
        padded[4] = 1;
        padded.push(0);
        r.push(&padded);
        assert!(matches!(
            r.next_request(&limits),
            Ok(Some(Incoming::Refused {
                id: 9,
                error: WireError::Malformed(_)
            }))
        ));
        // A client's reader of responses takes none.
        let mut client = FrameReader::new(Kind::Response, 1 << 20);
        client.push(&snap);
        assert_eq!(
            client.next_frame().map(|f| f.map(|f| f.used)),
            Err(FrameError {
                id: 9,
                error: WireError::UnknownKind(3)
            })
        );
    }

    #[test]
    fn the_buffer_is_compacted_on_long_streams() {
        let mut r = reader();
        let frame = ping(1);
        // Keep a partial frame pending so the buffer is never empty.
        r.push(&frame[..5]);
        for _ in 0..20_000 {
            r.push(&frame[5..]);
            r.push(&frame[..5]);
            assert!(r.next_frame().unwrap().is_some());
        }
        assert!(
            r.buf.len() < 4 * COMPACT_AT,
            "buffer grew to {}",
            r.buf.len()
        );
        assert_eq!(r.pending(), 5);
    }
}
