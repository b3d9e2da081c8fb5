//! Requests in, replies out: the index's [`Service`], without I/O.
//!
//! The stream layer (`stream.rs`) reads frames with the protocol crate's
//! [`FrameReader`](prefix_proto::FrameReader) and hands each decoded request
//! to the [`Handler`]'s [`Service::serve`], which applies it to the index and writes the answer
//! frame; everything here is tested with byte vectors.
//!
//! What happens to bad input:
//! - a payload that does not decode, or a batch over `max_batch`, gets an
//!   error reply with its request id, and the stream goes on (the frame's
//!   length is known, so the next frame is found);
//! - an op that breaks a limit, or that the client's role does not allow,
//!   gets an error reply in its place; the batch's other ops are applied;
//! - a header that is not ours (magic, version, kind) or announces more than
//!   `max_frame_bytes` gets an error reply, then the stream is closed: its
//!   framing can no longer be trusted;
//! - a stream that ends inside a frame gets a `Malformed` reply.
//!
//! None of them touches the index.
//!
//! The engine ops (`subscribe`, `unsubscribe`, `list_engines`) go to the
//! server's [`Engines`]; subscribing starts the subscription's thread, which
//! is quick enough to do here.

use std::sync::Arc;
use std::time::Instant;

use prefix_index::{EngineError, Index, InsertError, Match, PodError, Reader, Stats};
use prefix_proto::json::JsonWriter;
use prefix_proto::{
    encode_response, EngineState, EngineSub, ErrorCode, Limits, Op, Reply, Request, Response,
    ResponseWriter, SampledKey, WireStats, MAX_FRAME_CEILING, MAX_SAMPLE,
};
use smallvec::SmallVec;

use crate::access::Access;
use crate::clock::now_ms;
use crate::engines::{wire, Engines, SubscribeError};
use crate::metrics::{self, Metrics, Tally};
use crate::replica::Replica;
use crate::service::{Service, SnapshotJob};

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

/// Where a handler writes its replies: a response frame (QUIC) or a JSON
/// answer (the HTTP API). Both write lookups from borrowed pod names.
pub trait Replies {
    /// Writes a lookup's reply.
    fn lookup(&mut self, key_blocks: u32, matches: &[(&str, u32)]);
    /// Writes any other reply.
    fn reply(&mut self, reply: &Reply);
    /// Bytes written so far: an answer stops at [`MAX_FRAME_CEILING`].
    fn written(&self) -> usize;
}

impl Replies for ResponseWriter<'_> {
    fn lookup(&mut self, key_blocks: u32, matches: &[(&str, u32)]) {
        ResponseWriter::lookup(self, key_blocks, matches);
    }
    fn reply(&mut self, reply: &Reply) {
        ResponseWriter::reply(self, reply);
    }
    fn written(&self) -> usize {
        ResponseWriter::len(self)
    }
}

impl Replies for JsonWriter<'_> {
    fn lookup(&mut self, key_blocks: u32, matches: &[(&str, u32)]) {
        JsonWriter::lookup(self, key_blocks, matches);
    }
    fn reply(&mut self, reply: &Reply) {
        JsonWriter::reply(self, reply);
    }
    fn written(&self) -> usize {
        JsonWriter::len(self)
    }
}

/// The refusal of a batch whose answers would pass [`MAX_FRAME_CEILING`]
/// after `applied` of its `ops` ops.
fn too_large(applied: usize, ops: usize) -> Reply {
    ErrorCode::FrameTooLarge.reply(format!(
        "the answers would exceed {MAX_FRAME_CEILING} bytes; the first {applied} of {ops} ops \
         were applied; send smaller batches"
    ))
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
    /// The engine subscriptions (precise mode), for the engine ops; none
    /// where a handler serves an index alone (benchmarks, tests), which
    /// answers them `Unsupported`.
    pub engines: Option<Arc<Engines>>,
    /// The replica gate: writes held and lookups refused while the server
    /// fills itself from a peer, and the one snapshot it sends at a time.
    pub replica: Arc<Replica>,
}

/// Replies nobody reads: held writes applied after a fill. Their errors
/// are counted in the metrics like any op's.
struct Discard;

impl Replies for Discard {
    fn lookup(&mut self, _: u32, _: &[(&str, u32)]) {}
    fn reply(&mut self, _: &Reply) {}
    fn written(&self) -> usize {
        0
    }
}

fn pod_error(e: &PodError) -> Reply {
    match e {
        PodError::BadName { .. } => ErrorCode::BadName.reply(e),
        PodError::TooManyPods { .. } => ErrorCode::TooManyPods.reply(e),
    }
}

/// The refusal of a subscription, with the code a client can act on.
fn subscription_error(e: &SubscribeError) -> Reply {
    let code = match e {
        SubscribeError::Index {
            source: EngineError::Pod(PodError::BadName { .. }),
            ..
        } => ErrorCode::BadName,
        SubscribeError::Index {
            source: EngineError::Pod(PodError::TooManyPods { .. }),
            ..
        } => ErrorCode::TooManyPods,
        // The OS refused a thread: the server is short of resources.
        SubscribeError::Thread(_) => ErrorCode::Unavailable,
        _ => ErrorCode::BadSubscription,
    };
    code.reply(e)
}

/// Starts following `sub`'s engine.
fn subscribe(engines: &Arc<Engines>, sub: &EngineSub) -> Reply {
    let started = wire::accept(sub.clone())
        .map_err(SubscribeError::from)
        .and_then(|sub| engines.subscribe(sub));
    match started {
        Ok(()) => Reply::Done,
        Err(e) => subscription_error(&e),
    }
}

/// Every subscription and its state.
fn list_engines(engines: &Arc<Engines>) -> Reply {
    let list = engines.list().into_iter();
    Reply::Engines(
        list.map(|(sub, status)| EngineState { sub, status })
            .collect(),
    )
}

/// The index's statistics as a `Stats` reply carries them.
fn wire_stats(s: Stats) -> WireStats {
    WireStats {
        models: s.models,
        pods: s.pods,
        nodes: s.nodes,
        tree_blocks: s.tree_blocks,
        entries: s.entries,
        bytes: s.bytes,
    }
}

/// One frame's lookups per model: (model, key blocks, best matched blocks),
/// added to the metrics once per frame (frames rarely mix models).
#[derive(Default)]
struct Hits<'r>(SmallVec<[(&'r str, u64, u64); 1]>);

impl<'r> Hits<'r> {
    fn add(&mut self, model: &'r str, key_blocks: u32, matched: u32) {
        let (k, m) = (u64::from(key_blocks), u64::from(matched));
        match self.0.iter_mut().find(|h| h.0 == model) {
            Some(h) => {
                h.1 += k;
                h.2 += m;
            }
            None => self.0.push((model, k, m)),
        }
    }
}

/// The refusal of an op the client may not do, if it may not.
fn forbidden(op: &Op, access: &Access) -> Option<Reply> {
    match access {
        Access::Write => None,
        Access::Read | Access::Peer if !op.kind().writes() => None,
        Access::Read => Some(ErrorCode::Forbidden.reply(
            "this client's certificate is a reader: it may look up but not change the index",
        )),
        Access::Peer => Some(ErrorCode::Forbidden.reply(
            "this client's certificate is a peer: it may look up and take snapshots, but not \
             change the index",
        )),
        Access::Denied(who) => Some(ErrorCode::Forbidden.reply(format!(
            "{who} has no role on this server (see --reader, --writer and --peer-identity)"
        ))),
    }
}

impl Handler {
    /// `f`'s reply, or `Unsupported` from a handler without engines.
    fn with_engines(&self, f: impl FnOnce(&Arc<Engines>) -> Reply) -> Reply {
        match &self.engines {
            Some(engines) => f(engines),
            None => ErrorCode::Unsupported.reply("this server does not follow engines"),
        }
    }

    /// Applies one op and writes its reply; returns whether it failed.
    #[allow(clippy::too_many_arguments)]
    fn apply<'r>(
        &self,
        op: &'r Op,
        access: &Access,
        now: u64,
        reader: &Reader<'_>,
        scratch: &mut Vec<Match>,
        hits: &mut Hits<'r>,
        w: &mut impl Replies,
    ) -> bool {
        if let Some(refusal) = forbidden(op, access) {
            w.reply(&refusal);
            return true;
        }
        if let Err(e) = self.limits.check_op(op) {
            w.reply(&e.to_reply());
            return true;
        }
        if let Some(reply) = self.replica.admit(op, &self.metrics) {
            w.reply(&reply);
            return matches!(reply, Reply::Error { .. });
        }
        self.execute(op, now, reader, scratch, hits, w)
    }

    /// Applies one op that may be applied now and writes its reply; returns
    /// whether it failed.
    fn execute<'r>(
        &self,
        op: &'r Op,
        now: u64,
        reader: &Reader<'_>,
        scratch: &mut Vec<Match>,
        hits: &mut Hits<'r>,
        w: &mut impl Replies,
    ) -> bool {
        let reply = match op {
            Op::Lookup {
                model,
                key,
                candidates,
            } => {
                let names: Option<SmallVec<[&str; 16]>> = candidates
                    .as_ref()
                    .map(|c| c.iter().map(String::as_str).collect());
                scratch.clear();
                let (key_blocks, known) =
                    reader.lookup_model_into(model, key, names.as_deref(), now, scratch);
                // Matches come longest first. Only models the index has are
                // counted: a label per name a client makes up is unbounded.
                if known {
                    hits.add(model, key_blocks, scratch.first().map_or(0, |m| m.blocks));
                }
                // Names are borrowed from the index for as long as the reader
                // pins it: no copy until they are encoded.
                let matches: SmallVec<[(&str, u32); 16]> = scratch
                    .iter()
                    .filter_map(|m| Some((reader.pod_name(m.pod)?, m.blocks)))
                    .collect();
                w.lookup(key_blocks, &matches);
                return false;
            }
            Op::Insert { model, key, pod } => match self.index.insert(model, key, pod, now) {
                Ok(()) => Reply::Done,
                Err(InsertError::Pod(e)) => pod_error(&e),
                Err(e @ InsertError::BadModel { .. }) => ErrorCode::BadName.reply(e),
                Err(e @ InsertError::TooManyModels { .. }) => ErrorCode::TooManyModels.reply(e),
                Err(e @ InsertError::Full { .. }) => ErrorCode::IndexFull.reply(e),
            },
            Op::RemovePod { pod } => Reply::Removed(self.index.remove_pod(pod)),
            Op::SetPodCapacity { pod, blocks } => match self.index.set_pod_capacity(pod, *blocks) {
                Ok(()) => Reply::Done,
                Err(e) => pod_error(&e),
            },
            Op::Stats => Reply::Stats(wire_stats(self.index.stats())),
            Op::Ping => Reply::Pong,
            Op::Subscribe(sub) => self.with_engines(|e| subscribe(e, sub)),
            Op::Unsubscribe { pod } => self.with_engines(|e| Reply::Removed(e.unsubscribe(pod))),
            Op::ListEngines => self.with_engines(list_engines),
            Op::SampleKeys { count, seed } => {
                let count = (*count).min(MAX_SAMPLE) as usize;
                // Keys of up to `max-key-blocks` each: stop within a
                // quarter of the largest answer (a hash takes at most 10
                // bytes), so that the answer always fits.
                let mut room = MAX_FRAME_CEILING as usize / 4;
                let keys = reader.sample_keys(count, *seed).into_iter();
                Reply::Keys(
                    keys.take_while(|(model, key)| {
                        let size = model.len() + 10 * key.len() + 16;
                        room = room.saturating_sub(size);
                        room > 0
                    })
                    .map(|(model, key)| SampledKey {
                        model: model.into(),
                        key,
                    })
                    .collect(),
                )
            }
        };
        w.reply(&reply);
        matches!(reply, Reply::Error { .. })
    }
}

impl Handler {
    /// Applies writes held while the server filled itself from a peer, in
    /// order, now that the gate lets nothing else through first (they were
    /// checked against roles and limits, and counted, when they arrived).
    pub fn apply_held(&self, ops: Vec<Op>) {
        let now = now_ms();
        let reader = self.index.reader();
        let (mut scratch, mut hits) = (Vec::new(), Hits::default());
        for op in &ops {
            self.execute(op, now, &reader, &mut scratch, &mut hits, &mut Discard);
        }
    }

    /// Applies `request`'s ops in order for a client allowed `access`,
    /// writing their replies to `w`, and counts them. Returns how many ops
    /// were applied if the answers passed [`MAX_FRAME_CEILING`] (the rest
    /// are skipped: the caller answers `FrameTooLarge` instead). This also
    /// bounds the memory one request can make the server build.
    pub fn apply_all(
        &self,
        request: &Request,
        access: &Access,
        w: &mut impl Replies,
    ) -> Option<usize> {
        let _in_flight = InFlight::new(&self.metrics);
        let started = Instant::now();
        let now = now_ms();
        let reader = self.index.reader();
        let mut tally = Tally::default();
        let mut scratch = Vec::new();
        let mut hits = Hits::default();
        let mut too_large = None;
        let slot = match request {
            Request::One(op) => {
                let failed = self.apply(op, access, now, &reader, &mut scratch, &mut hits, w);
                let slot = metrics::op_slot(op);
                tally.add(slot, failed);
                slot
            }
            Request::Batch(ops) => {
                for (i, op) in ops.iter().enumerate() {
                    let failed = self.apply(op, access, now, &reader, &mut scratch, &mut hits, w);
                    tally.add(metrics::op_slot(op), failed);
                    if w.written() > MAX_FRAME_CEILING as usize {
                        too_large = Some(i + 1);
                        break;
                    }
                }
                metrics::BATCH
            }
        };
        drop(reader);
        for &(model, key_blocks, matched) in &hits.0 {
            self.metrics.lookups(model, key_blocks, matched);
        }
        self.metrics.count(&tally);
        self.metrics.observe(slot, started.elapsed().as_secs_f64());
        too_large
    }

    /// Applies `request` as [`Service::serve`] does and appends its JSON
    /// answer to `out` (see [`prefix_proto::json`]); returns the error code
    /// that decides the HTTP status: one op's, or a whole batch's refusal.
    pub fn serve_json(&self, request: &Request, access: &Access, out: &mut Vec<u8>) -> Option<u16> {
        match request {
            Request::One(_) => {
                let mut w = JsonWriter::one(out);
                self.apply_all(request, access, &mut w);
                w.finish()
            }
            Request::Batch(ops) => {
                let mut w = JsonWriter::batch(out);
                match self.apply_all(request, access, &mut w) {
                    None => w.finish(),
                    Some(applied) => {
                        w.abandon();
                        let reply = too_large(applied, ops.len());
                        let mut w = JsonWriter::one(out);
                        w.reply(&reply);
                        w.finish()
                    }
                }
            }
        }
    }
}

impl Service for Handler {
    /// The index's snapshot, for writers and peers, one at a time, once the
    /// server is not filling itself.
    fn snapshot(&self, access: &Access) -> Result<SnapshotJob, Reply> {
        if !access.may_snapshot() {
            let who = match access {
                Access::Denied(who) => who.as_str(),
                _ => "this client's certificate",
            };
            return Err(ErrorCode::Forbidden.reply(format!(
                "{who} may not take snapshots: list it under --peer-identity (or --writer)"
            )));
        }
        let sending = self.replica.send()?;
        let (index, metrics) = (self.index.clone(), self.metrics.clone());
        Ok(Box::new(move |out| {
            let _one_at_a_time = sending;
            index.write_snapshot(out, now_ms())?;
            metrics.snapshots_sent.inc();
            Ok(())
        }))
    }

    /// Whether a request should run on the blocking pool: its weight (see
    /// [`Op::weight`]) is over `inline_blocks`, or it subscribes or
    /// unsubscribes an engine (which waits for a subscription thread to
    /// stop and for the engine's lock).
    fn is_heavy(&self, request: &Request) -> bool {
        request.weight() > self.inline_blocks
            || request
                .ops()
                .iter()
                .any(|op| matches!(op, Op::Subscribe(_) | Op::Unsubscribe { .. }))
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
    fn serve(&self, id: u64, request: &Request, access: &Access, out: &mut Vec<u8>) {
        match request {
            Request::One(_) => {
                let mut w = ResponseWriter::one(out, id);
                self.apply_all(request, access, &mut w);
                w.finish();
            }
            Request::Batch(ops) => {
                let mut w = ResponseWriter::batch(out, id, ops.len());
                match self.apply_all(request, access, &mut w) {
                    None => w.finish(),
                    Some(applied) => {
                        w.abandon();
                        let reply = too_large(applied, ops.len());
                        encode_response(id, &Response::One(reply), out);
                    }
                }
            }
        }
    }

    /// Counts a frame refused before any op was read.
    fn refused(&self) {
        let mut tally = Tally::default();
        tally.add(metrics::FRAME, true);
        self.metrics.count(&tally);
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engines::EngineConfig;
    use prefix_index::IndexConfig;
    use prefix_proto::{
        decode_response, encode_request, split_frame, FrameReader, Incoming, Kind, PodBlocks,
        HEADER_LEN,
    };
    use tokio_util::sync::CancellationToken;

    fn handler() -> Handler {
        Handler {
            engines: None,
            replica: crate::replica::Replica::serving(),
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
        encode_request(id, request, &mut out);
        out
    }

    fn answer(out: &[u8]) -> (u64, Response) {
        let f = split_frame(out, MAX_FRAME_CEILING).unwrap().unwrap();
        assert_eq!(f.used, out.len());
        (f.header.request_id, decode_response(f.payload).unwrap())
    }

    fn reader(h: &Handler) -> FrameReader {
        FrameReader::new(Kind::Request, h.limits.max_frame_bytes)
    }

    /// Answers every whole frame in `reader` as the stream layer does.
    fn run(h: &Handler, reader: &mut FrameReader, access: &Access) -> Vec<(u64, Response)> {
        let mut answers = Vec::new();
        loop {
            let mut out = Vec::new();
            match reader.next_request(&h.limits) {
                Ok(None) => return answers,
                Ok(Some(Incoming::Request { id, request })) => {
                    h.serve(id, &request, access, &mut out)
                }
                Ok(Some(refused)) => refused.encode_refusal(&mut out),
                Err(fatal) => fatal.encode(&mut out),
            }
            answers.push(answer(&out));
        }
    }

    #[test]
    fn lookups_count_key_and_matched_blocks_per_known_model() {
        let h = handler();
        h.index.insert("m", &[1, 2, 3], "a", now_ms()).unwrap();
        let lookup = |model: &str, key: Vec<u64>| Op::Lookup {
            model: model.into(),
            key,
            candidates: None,
        };
        let batch = Request::Batch(vec![
            lookup("m", vec![1, 2, 9]),
            lookup("m", vec![1, 2, 3, 4]),
            lookup("made-up", vec![1]),
        ]);
        let mut out = Vec::new();
        h.serve(1, &batch, &Access::Write, &mut out);
        let text = h.metrics.render(&h.index);
        for line in [
            "prefix_index_lookup_key_blocks_total{model=\"m\"} 7",
            "prefix_index_lookup_matched_blocks_total{model=\"m\"} 5",
        ] {
            assert!(text.contains(line), "{line} missing in\n{text}");
        }
        assert!(!text.contains("made-up"));
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
        let mut r = reader(&h);
        let mut answers = Vec::new();
        for b in bytes.chunks(3) {
            r.push(b);
            answers.extend(run(&h, &mut r, &Access::Write));
        }
        assert_eq!(r.pending(), 0);
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
        let mut r = reader(&h);
        r.push(&frame(
            5,
            &Request::Batch(vec![too_long, bad_name, Op::Ping]),
        ));
        let answers = run(&h, &mut r, &Access::Write);
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
        let mut r = reader(&h);
        r.push(&bad);
        let answers = run(&h, &mut r, &Access::Write);
        assert_eq!(answers.len(), 2);
        assert!(matches!(
            &answers[0],
            (7, Response::One(Reply::Error { code, .. })) if *code == ErrorCode::Malformed as u16
        ));
        assert_eq!(answers[1], (8, Response::One(Reply::Pong)));
    }

    #[test]
    fn a_reader_may_do_what_the_op_table_marks_as_reading_only() {
        let h = handler();
        h.index.insert("m", &[1], "p", now_ms()).unwrap();
        let ops = [
            Op::Lookup {
                model: "m".into(),
                key: vec![1],
                candidates: None,
            },
            Op::Insert {
                model: "m".into(),
                key: vec![2],
                pod: "p".into(),
            },
            Op::RemovePod { pod: "p".into() },
            Op::SetPodCapacity {
                pod: "p".into(),
                blocks: 1,
            },
            Op::Stats,
            Op::Ping,
            Op::Subscribe(engine_sub("p", 16)),
            Op::Unsubscribe { pod: "p".into() },
            Op::ListEngines,
        ];
        let mut r = reader(&h);
        r.push(&frame(1, &Request::Batch(ops.to_vec())));
        let answers = run(&h, &mut r, &Access::Read);
        let Response::Batch(replies) = &answers[0].1 else {
            panic!("{answers:?}")
        };
        for (op, reply) in ops.iter().zip(replies) {
            let refused =
                matches!(reply, Reply::Error { code, .. } if *code == ErrorCode::Forbidden as u16);
            assert_eq!(refused, op.kind().writes(), "{op:?}: {reply:?}");
        }
        // Nothing changed: the pod is still there with its one block.
        assert_eq!(h.index.stats().entries, 1);
        let denied = Access::Denied("cn:nobody".into());
        let mut r = reader(&h);
        r.push(&frame(2, &Request::One(Op::Ping)));
        assert!(matches!(
            &run(&h, &mut r, &denied)[0].1,
            Response::One(Reply::Error { code, .. }) if *code == ErrorCode::Forbidden as u16
        ));
    }

    fn engine_sub(pod: &str, block_size: u32) -> EngineSub {
        EngineSub {
            pod: pod.into(),
            model: "m".into(),
            // Nothing listens there: the subscription's thread keeps
            // reconnecting until it is stopped.
            endpoint: "tcp://127.0.0.1:1".into(),
            replay: None,
            block_size,
            topic: String::new(),
            media: vec!["GPU".into()],
        }
    }

    /// A handler with engines, and the token that stops their threads.
    fn precise() -> (Handler, CancellationToken) {
        let h = handler();
        let stop = CancellationToken::new();
        let engines = Engines::new(h.index.clone(), EngineConfig::default(), stop.clone(), None);
        let h = Handler {
            engines: Some(engines),
            replica: crate::replica::Replica::serving(),
            ..h
        };
        (h, stop)
    }

    /// Stops every engine thread and waits for them.
    fn stop_engines(h: &Handler, stop: &CancellationToken) {
        stop.cancel();
        if let Some(engines) = &h.engines {
            engines.join();
        }
    }

    /// The reply to one op sent alone.
    fn one(h: &Handler, op: Op, access: &Access) -> Reply {
        let mut out = Vec::new();
        h.serve(1, &Request::One(op), access, &mut out);
        match answer(&out) {
            (1, Response::One(reply)) => reply,
            other => panic!("{other:?}"),
        }
    }

    fn error_code(reply: &Reply) -> Option<ErrorCode> {
        match reply {
            Reply::Error { code, .. } => ErrorCode::from_u16(*code),
            _ => None,
        }
    }

    #[test]
    fn engines_are_subscribed_listed_and_unsubscribed() {
        let (h, stop) = precise();
        let sub = engine_sub("vllm-0", 64);
        let w = &Access::Write;
        assert_eq!(one(&h, Op::Subscribe(sub.clone()), w), Reply::Done);
        let Reply::Engines(list) = one(&h, Op::ListEngines, w) else {
            panic!("not an engine list")
        };
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].sub, sub);
        assert_eq!((list[0].status.last_seq, list[0].status.events), (None, 0));
        // The same pod again replaces its subscription.
        let other = EngineSub {
            topic: "kv".into(),
            ..sub.clone()
        };
        assert_eq!(one(&h, Op::Subscribe(other.clone()), w), Reply::Done);
        let Reply::Engines(list) = one(&h, Op::ListEngines, w) else {
            panic!("not an engine list")
        };
        assert_eq!(list.iter().map(|e| &e.sub).collect::<Vec<_>>(), [&other]);
        let unsubscribe = Op::Unsubscribe {
            pod: "vllm-0".into(),
        };
        assert_eq!(one(&h, unsubscribe.clone(), w), Reply::Removed(true));
        assert_eq!(one(&h, unsubscribe, w), Reply::Removed(false));
        assert_eq!(one(&h, Op::ListEngines, w), Reply::Engines(vec![]));
        stop_engines(&h, &stop);
    }

    #[test]
    fn a_subscription_the_server_cannot_follow_is_refused_with_its_reason() {
        let (h, stop) = precise();
        let w = &Access::Write;
        // 24-token blocks do not map to the 16-token blocks of token keys.
        let reply = one(&h, Op::Subscribe(engine_sub("a", 24)), w);
        assert_eq!(error_code(&reply), Some(ErrorCode::BadSubscription));
        let Reply::Error { message, .. } = reply else {
            unreachable!()
        };
        assert!(message.contains("engine block of 24 tokens"), "{message}");
        let ipc = EngineSub {
            endpoint: "ipc:///tmp/kv".into(),
            ..engine_sub("a", 16)
        };
        let reply = one(&h, Op::Subscribe(ipc), w);
        assert_eq!(error_code(&reply), Some(ErrorCode::BadSubscription));
        assert!(format!("{reply:?}").contains("is not tcp://"), "{reply:?}");
        let no_media = EngineSub {
            media: vec![],
            ..engine_sub("a", 16)
        };
        let reply = one(&h, Op::Subscribe(no_media), w);
        assert_eq!(error_code(&reply), Some(ErrorCode::BadSubscription));
        let unnamed = engine_sub("", 16);
        let reply = one(&h, Op::Subscribe(unnamed), w);
        assert_eq!(error_code(&reply), Some(ErrorCode::BadName));
        assert_eq!(one(&h, Op::ListEngines, w), Reply::Engines(vec![]));
        stop_engines(&h, &stop);
    }

    #[test]
    fn a_reader_may_list_engines_but_not_change_them() {
        let (h, stop) = precise();
        assert_eq!(
            one(&h, Op::Subscribe(engine_sub("a", 16)), &Access::Write),
            Reply::Done
        );
        let r = &Access::Read;
        for op in [
            Op::Subscribe(engine_sub("b", 16)),
            Op::Unsubscribe { pod: "a".into() },
        ] {
            let reply = one(&h, op, r);
            assert_eq!(error_code(&reply), Some(ErrorCode::Forbidden), "{reply:?}");
        }
        let Reply::Engines(list) = one(&h, Op::ListEngines, r) else {
            panic!("not an engine list")
        };
        assert_eq!(list.len(), 1, "the reader changed nothing");
        stop_engines(&h, &stop);
    }

    #[test]
    fn without_engines_the_engine_ops_are_unsupported() {
        let h = handler();
        for op in [
            Op::Subscribe(engine_sub("a", 16)),
            Op::Unsubscribe { pod: "a".into() },
            Op::ListEngines,
        ] {
            let reply = one(&h, op, &Access::Write);
            assert_eq!(error_code(&reply), Some(ErrorCode::Unsupported));
            assert!(
                format!("{reply:?}").contains("does not follow engines"),
                "{reply:?}"
            );
        }
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
        assert_eq!(batch.weight(), 120);
        assert!(h.is_heavy(&batch));
        assert!(!h.is_heavy(&Request::One(Op::Ping)));
        // Engine subscriptions wait for threads and locks: never inline,
        // whatever the weight allowed inline.
        let h = Handler {
            inline_blocks: usize::MAX,
            ..h
        };
        assert!(!h.is_heavy(&batch));
        assert!(h.is_heavy(&Request::One(Op::Unsubscribe { pod: "p".into() })));
    }

    use proptest::prelude::Strategy as _;

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
            std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(500)
        ))]
        /// A stream of valid frames and garbage, cut at arbitrary points:
        /// the framing never panics, every answer is a well-formed response
        /// frame, nothing after a fatal error is answered, and the index only
        /// holds what the valid frames inserted.
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
            let mut r = reader(&h);
            let bytes: Vec<u8> = parts.concat();
            let mut at = 0;
            let mut sizes = cuts.iter().cycle();
            let mut fatal = false;
            while at < bytes.len() {
                let n = (*sizes.next().unwrap()).min(bytes.len() - at);
                r.push(&bytes[at..at + n]);
                at += n;
                for (_, response) in run(&h, &mut r, &Access::Write) {
                    proptest::prop_assert!(!fatal, "answered after a fatal error: {response:?}");
                    if let Response::One(Reply::Error { code, .. }) = response {
                        let code = ErrorCode::from_u16(code);
                        fatal |= matches!(
                            code,
                            Some(ErrorCode::BadVersion | ErrorCode::UnknownKind | ErrorCode::FrameTooLarge)
                        );
                    }
                }
                proptest::prop_assert_eq!(fatal, r.has_failed());
            }
            if let Err(e) = r.finish() {
                proptest::prop_assert!(!fatal);
                proptest::prop_assert_eq!(e.error.code(), ErrorCode::Malformed);
            }
            // Keys are two blocks of 0..4: at most 16 distinct, two entries each.
            proptest::prop_assert!(h.index.stats().entries <= 2 * 16);
        }
    }
}
