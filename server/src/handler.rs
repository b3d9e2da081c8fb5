//! Requests in, replies out: the protocol logic of the server, without I/O.
//!
//! [`Inbox`] cuts a stream's bytes into frames and decodes them; [`Handler`]
//! applies a decoded request to the index. The async code in `stream.rs` only
//! moves bytes between QUIC and these two, so everything here is tested with
//! byte vectors.
//!
//! What happens to bad input:
//! - a payload that does not decode, or an op that breaks a limit, gets an
//!   error reply with its request id, and the stream goes on (the frame's
//!   length is known, so the next frame is found);
//! - a header that is not ours (magic, version, kind) or announces more than
//!   `max_frame_bytes` gets an error reply, then the stream is closed: its
//!   framing can no longer be trusted, and skipping a huge payload would let
//!   one client make the server read junk;
//! - a stream that ends inside a frame gets a `Malformed` reply.
//!
//! None of them touches the index.

use std::sync::Arc;
use std::time::Instant;

use prefix_client::wire::{
    self, ErrorCode, Kind, Limits, Op, Reply, Request, Response, ResponseWriter, WireError,
    HEADER_LEN, MAX_FRAME_CEILING,
};
use prefix_index::{Index, InsertError, Match, PodError, Reader};
use smallvec::SmallVec;

use crate::access::Access;
use crate::metrics::{self, Metrics, Tally};

/// The next thing a stream's bytes hold.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// More bytes are needed.
    Wait,
    /// A decoded request.
    Request {
        /// Its id.
        id: u64,
        /// The request.
        request: Request,
    },
    /// A whole frame that must be answered with this error; the stream goes on.
    Refuse {
        /// Its id.
        id: u64,
        /// Why.
        error: WireError,
    },
    /// Framing is lost: answer this error, then close the stream.
    Fatal {
        /// The id in the offending header (0 if there was none).
        id: u64,
        /// Why.
        error: WireError,
    },
}

/// A stream's unprocessed bytes.
#[derive(Debug, Default)]
pub struct Inbox {
    buf: Vec<u8>,
    at: usize,
}

impl Inbox {
    /// Appends received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        if self.at > 0 && self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        } else if self.at > (64 << 10) && self.at * 2 > self.buf.len() {
            self.buf.drain(..self.at);
            self.at = 0;
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet part of a whole frame.
    pub fn pending(&self) -> usize {
        self.buf.len() - self.at
    }

    /// Takes the next frame off the front.
    pub fn next(&mut self, limits: &Limits) -> Next {
        let rest = &self.buf[self.at..];
        let frame = match wire::split_frame(rest, limits) {
            Ok(Some(f)) => f,
            Ok(None) => return Next::Wait,
            Err(error) => {
                let id = request_id(rest);
                self.at = self.buf.len();
                return Next::Fatal { id, error };
            }
        };
        let id = frame.header.request_id;
        self.at += frame.used;
        if frame.header.kind != Kind::Request {
            return Next::Fatal {
                id,
                error: WireError::UnknownKind(2),
            };
        }
        match wire::decode_request(frame.payload, limits) {
            Ok(request) => Next::Request { id, request },
            Err(error) => Next::Refuse { id, error },
        }
    }

    /// What to answer when the stream ends with bytes left over.
    pub fn truncated(&self) -> Option<(u64, WireError)> {
        let rest = &self.buf[self.at..];
        (!rest.is_empty()).then(|| {
            (
                request_id(rest),
                WireError::Malformed(format!(
                    "stream ended inside a frame ({} bytes of it received)",
                    rest.len()
                )),
            )
        })
    }
}

/// The request id of a header, as far as it arrived (0 otherwise).
fn request_id(header: &[u8]) -> u64 {
    header
        .get(8..HEADER_LEN)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Appends an error frame.
pub fn encode_error(id: u64, error: &WireError, out: &mut Vec<u8>) {
    wire::encode_response(id, &Response::One(error.to_reply()), out);
}

/// Counts a frame in `requests_in_flight` while it lives, even if applying
/// it panics.
struct InFlight<'a>(&'a Metrics);

impl<'a> InFlight<'a> {
    fn new(m: &'a Metrics) -> Self {
        m.in_flight.inc();
        InFlight(m)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

/// Applies requests to the index.
pub struct Handler {
    /// The index.
    pub index: Arc<Index>,
    /// The limits every op is checked against.
    pub limits: Limits,
    /// Where counts and latencies go.
    pub metrics: Arc<Metrics>,
    /// Frames with more key blocks than this should run off the async workers.
    pub inline_blocks: usize,
}

/// Milliseconds since the Unix epoch: the index's clock. Wall time, so that
/// snapshots keep entry ages across restarts.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn error(code: ErrorCode, message: impl ToString) -> Reply {
    Reply::Error {
        code: code as u16,
        message: message.to_string(),
    }
}

fn pod_error(e: &PodError) -> Reply {
    match e {
        PodError::BadName { .. } => error(ErrorCode::BadName, e),
        PodError::TooManyPods { .. } => error(ErrorCode::TooManyPods, e),
    }
}

/// The refusal of an op the client may not do, if it may not.
fn forbidden(op: &Op, access: &Access) -> Option<Reply> {
    match access {
        Access::Write => None,
        Access::Read => match op {
            Op::Lookup { .. } | Op::Stats | Op::Ping => None,
            Op::Insert { .. } | Op::RemovePod { .. } | Op::SetPodCapacity { .. } => Some(error(
                ErrorCode::Forbidden,
                "this client's certificate is a reader: it may look up but not change the index",
            )),
        },
        Access::Denied(who) => Some(error(
            ErrorCode::Forbidden,
            format!("{who} has no role on this server (see --reader and --writer)"),
        )),
    }
}

impl Handler {
    /// How heavy a request is to serve, in key blocks or their equivalent:
    /// candidate names are hashed like blocks, and changing the pod table
    /// (removing a pod, naming a new one for its capacity) copies it, which
    /// counts as 1,024.
    pub fn weight(request: &Request) -> usize {
        let op_weight = |op: &Op| match op {
            Op::Lookup {
                key, candidates, ..
            } => key.len() + candidates.as_ref().map_or(0, Vec::len),
            Op::Insert { key, .. } => key.len(),
            Op::RemovePod { .. } | Op::SetPodCapacity { .. } => 1024,
            Op::Stats | Op::Ping => 1,
        };
        match request {
            Request::One(op) => op_weight(op),
            Request::Batch(ops) => ops.iter().map(op_weight).sum(),
        }
    }

    /// Whether a request should run on the blocking pool.
    pub fn is_heavy(&self, request: &Request) -> bool {
        Self::weight(request) > self.inline_blocks
    }

    /// Applies a request and appends its response frame to `out`.
    ///
    /// An answer is at most [`MAX_FRAME_CEILING`] bytes, the most a client
    /// accepts: a batch whose answers would pass it (many lookups each listing
    /// hundreds of pods) stops there and is answered `FrameTooLarge` instead;
    /// its ops before that point were applied. This also bounds the memory one
    /// request can make the server build.
    ///
    /// `access` is what the connection's client may do (see
    /// [`crate::access`]); ops it may not do are refused one by one with
    /// `Forbidden` and change nothing.
    pub fn serve(&self, id: u64, request: &Request, access: &Access, out: &mut Vec<u8>) {
        let _in_flight = InFlight::new(&self.metrics);
        let started = Instant::now();
        let now = now_ms();
        let reader = self.index.reader();
        let mut tally = Tally::default();
        let mut scratch = Vec::new();
        let slot = match request {
            Request::One(op) => {
                let mut w = ResponseWriter::one(out, id);
                let failed = self.apply(op, access, now, &reader, &mut scratch, &mut w);
                w.finish();
                let slot = metrics::op_slot(op);
                tally.add(slot, failed);
                slot
            }
            Request::Batch(ops) => {
                let mut w = ResponseWriter::batch(out, id, ops.len());
                let mut too_large = None;
                for (i, op) in ops.iter().enumerate() {
                    let failed = self.apply(op, access, now, &reader, &mut scratch, &mut w);
                    tally.add(metrics::op_slot(op), failed);
                    if w.len() > MAX_FRAME_CEILING as usize {
                        too_large = Some(i + 1);
                        break;
                    }
                }
                match too_large {
                    None => w.finish(),
                    Some(applied) => {
                        w.abandon();
                        let message = format!(
                            "the answers would exceed {MAX_FRAME_CEILING} bytes; the first \
                             {applied} of {} ops were applied; send smaller batches",
                            ops.len()
                        );
                        let reply = error(ErrorCode::FrameTooLarge, message);
                        wire::encode_response(id, &Response::One(reply), out);
                    }
                }
                metrics::BATCH
            }
        };
        drop(reader);
        self.metrics.count(&tally);
        self.metrics.observe(slot, started.elapsed().as_secs_f64());
    }

    /// Counts a frame refused before any op was read.
    pub fn refused(&self) {
        let mut tally = Tally::default();
        tally.add(metrics::FRAME, true);
        self.metrics.count(&tally);
    }

    /// Applies one op and writes its reply; returns whether it failed.
    fn apply(
        &self,
        op: &Op,
        access: &Access,
        now: u64,
        reader: &Reader<'_>,
        scratch: &mut Vec<Match>,
        w: &mut ResponseWriter<'_>,
    ) -> bool {
        if let Some(refusal) = forbidden(op, access) {
            w.reply(&refusal);
            return true;
        }
        if let Err(e) = wire::check_op(op, &self.limits) {
            w.reply(&e.to_reply());
            return true;
        }
        if let Op::Lookup {
            model,
            key,
            candidates,
        } = op
        {
            let names: Option<SmallVec<[&str; 16]>> = candidates
                .as_ref()
                .map(|c| c.iter().map(String::as_str).collect());
            scratch.clear();
            let key_blocks = reader.lookup_into(model, key, names.as_deref(), now, scratch);
            // Names are borrowed from the index for as long as the reader
            // pins it: no copy until they are encoded.
            let matches: SmallVec<[(&str, u32); 16]> = scratch
                .iter()
                .filter_map(|m| Some((reader.pod_name(m.pod)?, m.blocks)))
                .collect();
            w.lookup(key_blocks, &matches);
            return false;
        }
        let reply = self.apply_write(op, now);
        w.reply(&reply);
        matches!(reply, Reply::Error { .. })
    }

    /// Applies an op other than a lookup (already checked against the limits).
    fn apply_write(&self, op: &Op, now: u64) -> Reply {
        match op {
            Op::Lookup { .. } => error(ErrorCode::Internal, "lookup on the write path"),
            Op::Insert { model, key, pod } => match self.index.insert(model, key, pod, now) {
                Ok(()) => Reply::Done,
                Err(InsertError::Pod(e)) => pod_error(&e),
                Err(e @ InsertError::BadModel { .. }) => error(ErrorCode::BadName, e),
                Err(e @ InsertError::TooManyModels { .. }) => error(ErrorCode::TooManyModels, e),
                Err(e @ InsertError::Full { .. }) => error(ErrorCode::IndexFull, e),
            },
            Op::RemovePod { pod } => Reply::Removed(self.index.remove_pod(pod)),
            Op::SetPodCapacity { pod, blocks } => match self.index.set_pod_capacity(pod, *blocks) {
                Ok(()) => Reply::Done,
                Err(e) => pod_error(&e),
            },
            Op::Stats => Reply::Stats(self.index.stats().into()),
            Op::Ping => Reply::Pong,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_client::wire::PodBlocks;
    use prefix_index::IndexConfig;

    fn handler() -> Handler {
        Handler {
            index: Arc::new(Index::new(IndexConfig::default())),
            limits: Limits {
                max_key_blocks: 4,
                ..Limits::default()
            },
            metrics: Arc::default(),
            inline_blocks: 100,
        }
    }

    fn frame(id: u64, request: &Request) -> Vec<u8> {
        let mut out = Vec::new();
        wire::encode_request(id, request, &mut out);
        out
    }

    fn answer(out: &[u8]) -> (u64, Response) {
        let f = wire::split_frame(out, &Limits::default()).unwrap().unwrap();
        assert_eq!(f.used, out.len());
        (
            f.header.request_id,
            wire::decode_response(f.payload).unwrap(),
        )
    }

    fn run(h: &Handler, inbox: &mut Inbox) -> Vec<(u64, Response)> {
        let mut answers = Vec::new();
        loop {
            let mut out = Vec::new();
            match inbox.next(&h.limits) {
                Next::Wait => return answers,
                Next::Request { id, request } => h.serve(id, &request, &Access::Write, &mut out),
                Next::Refuse { id, error } | Next::Fatal { id, error } => {
                    encode_error(id, &error, &mut out)
                }
            }
            answers.push(answer(&out));
        }
    }

    #[test]
    fn frames_split_across_pushes_are_answered_in_order() {
        let h = handler();
        let insert = Request::One(Op::Insert {
            model: "m".into(),
            key: vec![1, 2, 3],
            pod: "p".into(),
        });
        let lookup = Request::Batch(vec![
            Op::Lookup {
                model: "m".into(),
                key: vec![1, 2, 9],
                candidates: None,
            },
            Op::Ping,
        ]);
        let mut bytes = frame(1, &insert);
        bytes.extend(frame(2, &lookup));
        let mut inbox = Inbox::default();
        let mut answers = Vec::new();
        for b in bytes.chunks(3) {
            inbox.push(b);
            answers.extend(run(&h, &mut inbox));
        }
        assert_eq!(inbox.pending(), 0);
        assert_eq!(answers[0], (1, Response::One(Reply::Done)));
        assert_eq!(
            answers[1],
            (
                2,
                Response::Batch(vec![
                    Reply::Lookup {
                        key_blocks: 3,
                        matches: vec![PodBlocks {
                            pod: "p".into(),
                            blocks: 2
                        }]
                    },
                    Reply::Pong
                ])
            )
        );
    }

    #[test]
    fn bad_ops_fail_alone_and_change_nothing() {
        let h = handler();
        let too_long = Op::Insert {
            model: "m".into(),
            key: vec![1; 5],
            pod: "p".into(),
        };
        let bad_name = Op::Insert {
            model: "m".into(),
            key: vec![1],
            pod: String::new(),
        };
        let mut inbox = Inbox::default();
        inbox.push(&frame(
            5,
            &Request::Batch(vec![too_long, bad_name, Op::Ping]),
        ));
        let answers = run(&h, &mut inbox);
        let Response::Batch(r) = &answers[0].1 else {
            panic!("{answers:?}")
        };
        let codes: Vec<_> = r
            .iter()
            .map(|r| match r {
                Reply::Error { code, .. } => ErrorCode::from_u16(*code),
                _ => None,
            })
            .collect();
        assert_eq!(
            codes,
            [Some(ErrorCode::KeyTooLong), Some(ErrorCode::BadName), None]
        );
        assert_eq!(h.index.stats().entries, 0);
    }

    #[test]
    fn a_malformed_payload_is_refused_and_the_stream_goes_on() {
        let h = handler();
        let mut bad = frame(7, &Request::One(Op::Ping));
        bad[HEADER_LEN] = 9; // no such Request variant
        bad.extend(frame(8, &Request::One(Op::Ping)));
        let mut inbox = Inbox::default();
        inbox.push(&bad);
        let answers = run(&h, &mut inbox);
        assert_eq!(answers.len(), 2);
        assert!(matches!(
            &answers[0],
            (7, Response::One(Reply::Error { code, .. })) if *code == ErrorCode::Malformed as u16
        ));
        assert_eq!(answers[1], (8, Response::One(Reply::Pong)));
    }

    #[test]
    fn foreign_headers_are_fatal() {
        let h = handler();
        let mut inbox = Inbox::default();
        inbox.push(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(matches!(
            inbox.next(&h.limits),
            Next::Fatal {
                error: WireError::BadVersion { .. },
                ..
            }
        ));
        let mut inbox = Inbox::default();
        let mut big = frame(3, &Request::One(Op::Ping));
        big[4..8].copy_from_slice(&(2u32 << 20).to_le_bytes());
        inbox.push(&big);
        assert_eq!(
            inbox.next(&h.limits),
            Next::Fatal {
                id: 3,
                error: WireError::FrameTooLarge {
                    len: 2 << 20,
                    max: 1 << 20
                }
            }
        );
        let mut inbox = Inbox::default();
        let mut response = Vec::new();
        wire::encode_response(4, &Response::One(Reply::Pong), &mut response);
        inbox.push(&response);
        assert!(matches!(inbox.next(&h.limits), Next::Fatal { id: 4, .. }));
    }

    #[test]
    fn truncated_streams_are_reported() {
        let mut inbox = Inbox::default();
        let f = frame(11, &Request::One(Op::Ping));
        inbox.push(&f[..f.len() - 1]);
        assert_eq!(inbox.next(&Limits::default()), Next::Wait);
        let (id, e) = inbox.truncated().unwrap();
        assert_eq!((id, e.code()), (11, ErrorCode::Malformed));
        assert_eq!(Inbox::default().truncated(), None);
    }

    #[test]
    fn an_answer_past_the_frame_ceiling_is_refused_not_built() {
        let h = handler();
        // 2,000 pods with 250-byte names: each lookup lists ~0.5 MB.
        for p in 0..2000 {
            let pod = format!("{p:0>250}");
            h.index.insert("m", &[1], &pod, now_ms()).unwrap();
        }
        let lookup = Op::Lookup {
            model: "m".into(),
            key: vec![1],
            candidates: None,
        };
        let mut out = vec![7];
        h.serve(
            3,
            &Request::Batch(vec![lookup; 64]),
            &Access::Write,
            &mut out,
        );
        assert_eq!(out[0], 7, "what was in the buffer stays");
        assert!(out.len() < 1 << 20, "the large answer was dropped");
        let (id, r) = answer(&out[1..]);
        assert_eq!(id, 3);
        let Response::One(Reply::Error { code, message }) = r else {
            panic!("{r:?}")
        };
        assert_eq!(ErrorCode::from_u16(code), Some(ErrorCode::FrameTooLarge));
        assert!(message.contains("of 64 ops were applied"), "{message}");
        assert_eq!(h.metrics.in_flight.get(), 0);
    }

    #[test]
    fn heavy_requests_are_recognised() {
        let h = handler();
        let batch = Request::Batch(
            (0..30)
                .map(|_| Op::Lookup {
                    model: "m".into(),
                    key: vec![1; 4],
                    candidates: None,
                })
                .collect(),
        );
        assert_eq!(Handler::weight(&batch), 120);
        assert!(h.is_heavy(&batch));
        assert!(!h.is_heavy(&Request::One(Op::Ping)));
    }

    use proptest::prelude::Strategy as _;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
            std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(500)
        ))]
        /// A stream of valid frames and garbage, cut at arbitrary points:
        /// the framing never panics, every answer is a well-formed response
        /// frame, and after a fatal error the stream is not read further.
        #[test]
        fn arbitrary_streams_get_well_formed_answers(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
                    (0u64..4, 0u64..4).prop_map(|(a, b)| frame(a, &Request::One(Op::Insert {
                        model: "m".into(), key: vec![a, b], pod: "p".into(),
                    }))),
                    proptest::prelude::any::<u64>().prop_map(|id| frame(id, &Request::One(Op::Ping))),
                ],
                1..12,
            ),
            cuts in proptest::collection::vec(1usize..40, 1..20),
        ) {
            let h = handler();
            let mut inbox = Inbox::default();
            let bytes: Vec<u8> = parts.concat();
            let mut at = 0;
            let mut sizes = cuts.iter().cycle();
            'feed: while at < bytes.len() {
                let n = (*sizes.next().unwrap()).min(bytes.len() - at);
                inbox.push(&bytes[at..at + n]);
                at += n;
                loop {
                    let mut out = Vec::new();
                    match inbox.next(&h.limits) {
                        Next::Wait => break,
                        Next::Request { id, request } => h.serve(id, &request, &Access::Write, &mut out),
                        Next::Refuse { id, error } => encode_error(id, &error, &mut out),
                        Next::Fatal { id, error } => {
                            encode_error(id, &error, &mut out);
                            let _ = answer(&out);
                            break 'feed;
                        }
                    }
                    let _ = answer(&out);
                }
            }
            let _ = inbox.truncated();
            proptest::prop_assert!(h.index.stats().entries <= 2 * 16);
        }
    }
}
