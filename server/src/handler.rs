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

use prefix_index::{Change, Index, InsertError, Match, PodError, Reader};
use prefix_proto::json::JsonWriter;
use prefix_proto::key::TOKEN_BLOCK_TOKENS;
use prefix_proto::{
    encode_response, ErrorCode, Limits, Op, OpKind, PodDetail, PodTiers, Receipt, ReceiptCounts,
    Reply, Request, Response, ResponseWriter, SampledKey, TierReach, ANSWER_ROOM,
    MAX_FRAME_CEILING, MAX_SAMPLE,
};
use smallvec::SmallVec;

use crate::access::Access;
use crate::clock::now_ms;
use crate::engines::Engines;
use crate::metrics::{self, Metrics, Tally};
use crate::replica::Replica;
use crate::service::{Service, SnapshotJob};
use engine_ops::{list_engines, subscribe};

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
    /// Writes a detailed lookup's reply, with each pod's recent receipts
    /// (`receipts[i]` are `matches[i]`'s) where the encoding has room.
    fn detail(&mut self, key_blocks: u32, matches: Vec<PodDetail>, receipts: &[ReceiptCounts]) {
        let _ = receipts;
        self.reply(&Reply::Detail {
            key_blocks,
            matches,
        });
    }
    /// Writes any other reply.
    fn reply(&mut self, reply: &Reply);
    /// Bytes written so far: an answer stops at [`MAX_FRAME_CEILING`].
    fn written(&self) -> usize;
}

/// Implements [`Replies`] for each writer named by its own `lookup`,
/// `reply` and `len`.
macro_rules! replies_by_own_methods {
    ($($writer:ident),+) => {$(
        impl Replies for $writer<'_> {
            fn lookup(&mut self, key_blocks: u32, matches: &[(&str, u32)]) {
                $writer::lookup(self, key_blocks, matches);
            }
            fn detail(
                &mut self,
                key_blocks: u32,
                matches: Vec<PodDetail>,
                receipts: &[ReceiptCounts],
            ) {
                $writer::detail(self, key_blocks, matches, receipts);
            }
            fn reply(&mut self, reply: &Reply) {
                $writer::reply(self, reply);
            }
            fn written(&self) -> usize {
                $writer::len(self)
            }
        }
    )+};
}

replies_by_own_methods!(ResponseWriter, JsonWriter);

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

/// Replies kept as values, in order: what the routers' drop-in routes
/// (`crate::routers`) turn into another indexer's answers.
#[derive(Debug, Default)]
pub struct Captured {
    /// The replies, one per op applied.
    pub replies: Vec<Reply>,
}

impl Replies for Captured {
    fn lookup(&mut self, key_blocks: u32, matches: &[(&str, u32)]) {
        let matches = matches
            .iter()
            .map(|&(pod, blocks)| prefix_proto::PodBlocks {
                pod: pod.into(),
                blocks,
            })
            .collect();
        self.replies.push(Reply::Lookup {
            key_blocks,
            matches,
        });
    }
    fn reply(&mut self, reply: &Reply) {
        self.replies.push(reply.clone());
    }
    fn written(&self) -> usize {
        0
    }
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
        PodError::BadName { .. } | PodError::Reserved => ErrorCode::BadName.reply(e),
        PodError::TooManyPods { .. } => ErrorCode::TooManyPods.reply(e),
    }
}

/// Writes the answer to an op not applied (refused, or held by a replica
/// filling itself); returns whether it failed.
fn not_applied(reply: &Reply, w: &mut impl Replies) -> bool {
    w.reply(reply);
    matches!(reply, Reply::Error { .. })
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

/// A lookup's candidate names, borrowed.
fn names(candidates: &Option<Vec<String>>) -> Option<SmallVec<[&str; 16]>> {
    candidates
        .as_ref()
        .map(|c| c.iter().map(String::as_str).collect())
}

/// The refusal of an op the client may not do, if it may not.
fn forbidden(op: &Op, access: &Access) -> Option<Reply> {
    match access {
        Access::Write => None,
        // Every write the server applies, for the replicas of its set.
        Access::Read if op.kind() == OpKind::Tail => Some(ErrorCode::Forbidden.reply(
            "this client's certificate is a reader: a server's tail is for its peers and writers",
        )),
        Access::Read if op.kind() == OpKind::Digest => Some(ErrorCode::Forbidden.reply(
            "this client's certificate is a reader: a server's digests are for its peers and \
             writers",
        )),
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
        match self.refusal(op, access, now) {
            Some(reply) => not_applied(&reply, w),
            None => self.execute(op, now, reader, scratch, hits, w),
        }
    }

    /// The answer to `op` at `now` when it is not to be applied now: a
    /// role or limit refuses it, or a replica filling itself holds it (or
    /// one catching up refuses a lookup).
    fn refusal(&self, op: &Op, access: &Access, now: u64) -> Option<Reply> {
        if let Some(refusal) = forbidden(op, access) {
            return Some(refusal);
        }
        if let Err(e) = self.limits.check_op(op) {
            return Some(e.to_reply());
        }
        self.replica.admit(op, &self.metrics, now)
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
                let names = names(candidates);
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
            Op::Stats => Reply::Stats(self.index.stats().size),
            Op::Ping => Reply::Pong,
            Op::Subscribe(sub) => self.with_engines(|e| subscribe(e, sub)),
            Op::Unsubscribe { pod } => self.with_engines(|e| Reply::Removed(e.unsubscribe(pod))),
            Op::ListEngines => self.with_engines(list_engines),
            Op::LookupDetail {
                model,
                key,
                candidates,
            } => {
                let names = names(candidates);
                let found = reader.lookup_detail(model, key, names.as_deref(), now);
                let (matches, receipts): (Vec<PodDetail>, Vec<ReceiptCounts>) = found
                    .matches
                    .iter()
                    .filter_map(|m| {
                        let detail = PodDetail {
                            pod: reader.pod_name(m.pod)?.into(),
                            blocks: m.blocks,
                            lower_blocks: m.lower,
                            view: m.view,
                            age_ms: m.age,
                        };
                        Some((detail, m.receipts))
                    })
                    .unzip();
                w.detail(found.key_blocks, matches, &receipts);
                return false;
            }
            Op::LookupTiers {
                model,
                key,
                candidates,
            } => {
                let names = names(candidates);
                let found = reader.lookup_tiers(model, key, names.as_deref(), now);
                let catalog = self.engines.as_ref().map(|e| e.catalog());
                let matches = found
                    .matches
                    .iter()
                    .filter_map(|m| {
                        let pod = reader.pod_name(m.pod)?;
                        let media = catalog
                            .as_ref()
                            .map(|c| c.lower_media(pod))
                            .unwrap_or_default();
                        let tiers = m
                            .reach
                            .iter()
                            .enumerate()
                            .map(|(i, &blocks)| TierReach {
                                medium: media
                                    .get(i)
                                    .map_or_else(|| format!("tier{i}"), |m| (*m).into()),
                                blocks,
                            })
                            .collect();
                        Some(PodTiers {
                            pod: pod.into(),
                            blocks: m.blocks,
                            tiers,
                        })
                    })
                    .collect();
                Reply::Tiers {
                    key_blocks: found.key_blocks,
                    matches,
                }
            }
            Op::Tail { from, max } => self.replica.tail(*from, *max, now),
            Op::Digest(ask) => {
                crate::repair::answer(&self.index, reader, &self.replica.removals, ask, now)
            }
            Op::Receipt(receipt) => self.receipt(receipt, now),
            Op::SampleKeys { count, seed } => {
                let count = (*count).min(MAX_SAMPLE) as usize;
                // Keys of up to `max-key-blocks` each: stop within the
                // answer's room (a hash takes at most 10 bytes).
                let mut room = ANSWER_ROOM;
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
        self.answer(op, &reply, now, w)
    }

    /// Counts a receipt for its pod, logging once each change of the pod's
    /// standing with the evidence.
    fn receipt(&self, receipt: &Receipt, now: u64) -> Reply {
        let block_tokens = self
            .engines
            .as_ref()
            .map_or(TOKEN_BLOCK_TOKENS as u32, |e| e.config().token_block);
        let recorded = match self.index.record_receipt(receipt, block_tokens, now) {
            Ok(recorded) => recorded,
            Err(e) => return ErrorCode::BadReceipt.reply(e),
        };
        self.metrics.receipt(recorded.judged.difference());
        let c = recorded.counts;
        // Doubted pods are cleared by their follower, if the operator asks.
        let resync = recorded.change == Some(Change::Suspect)
            && self
                .engines
                .as_ref()
                .is_some_and(|e| e.config().receipt_resync && e.doubt(&receipt.pod));
        match recorded.change {
            Some(Change::Suspect) => tracing::warn!(
                pod = %receipt.pod,
                model = %receipt.model,
                over = c.over,
                exact = c.exact,
                under = c.under,
                predicted = recorded.judged.expected,
                reused = recorded.judged.reused,
                key_blocks = receipt.key.len(),
                resync,
                "pod is suspect: its recent receipts over-predict (the engine reused less than \
                 the index promised; events lost, or evictions never told)"
            ),
            Some(Change::Cleared) => tracing::info!(
                pod = %receipt.pod,
                over = c.over,
                exact = c.exact,
                under = c.under,
                "pod is suspect no more: its receipts agree again, or none came for \
                 --receipt-quiet"
            ),
            None => {}
        }
        Reply::Done
    }

    /// Writes `reply` to `op` (recording an applied write for the
    /// replicas' tail); returns whether it failed.
    fn answer(&self, op: &Op, reply: &Reply, now: u64, w: &mut impl Replies) -> bool {
        let failed = matches!(reply, Reply::Error { .. });
        if !failed && op.kind().tailed() {
            self.replica.record(op, reply, now);
        }
        w.reply(reply);
        failed
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

    /// Applies writes read from a peer's tail, in order, as a writer's:
    /// checked against this server's limits, held while it fills (as the
    /// gateways' writes are), else applied. Only the writes a tail carries
    /// ([`OpKind::tailed`]) are taken: a peer's answer subscribes nothing
    /// here. Returns how many were refused.
    pub fn apply_tail(&self, ops: &[Op]) -> u64 {
        let now = now_ms();
        let reader = self.index.reader();
        let (mut scratch, mut hits) = (Vec::new(), Hits::default());
        let mut refused = 0;
        for op in ops {
            if !op.kind().tailed() {
                refused += 1;
                continue;
            }
            let failed = self.apply(
                op,
                &Access::Write,
                now,
                &reader,
                &mut scratch,
                &mut hits,
                &mut Discard,
            );
            refused += u64::from(failed);
        }
        refused
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
                let mut i = 0;
                while i < ops.len() {
                    // Subscriptions in a row, and unsubscriptions in a row,
                    // are made in one step: a fleet subscribed in batches
                    // costs no more than configured.
                    let run = match &ops[i] {
                        Op::Subscribe(_) | Op::Unsubscribe { .. } => {
                            let kind = std::mem::discriminant(&ops[i]);
                            ops[i..]
                                .iter()
                                .take_while(|op| std::mem::discriminant(*op) == kind)
                                .count()
                        }
                        _ => 1,
                    };
                    match (&self.engines, &ops[i]) {
                        (Some(engines), Op::Subscribe(_)) if run > 1 => {
                            let run = &ops[i..i + run];
                            self.subscribe_run(engines, run, access, now, &mut tally, w);
                            i += run.len();
                        }
                        (Some(engines), Op::Unsubscribe { .. }) if run > 1 => {
                            let run = &ops[i..i + run];
                            self.unsubscribe_run(engines, run, access, now, &mut tally, w);
                            i += run.len();
                        }
                        _ => {
                            let op = &ops[i];
                            let failed =
                                self.apply(op, access, now, &reader, &mut scratch, &mut hits, w);
                            tally.add(metrics::op_slot(op), failed);
                            i += 1;
                        }
                    }
                    if w.written() > MAX_FRAME_CEILING as usize {
                        too_large = Some(i);
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
    /// [`crate::Access`]); ops it may not do are refused one by one with
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

mod engine_ops;
#[cfg(test)]
mod tests;
