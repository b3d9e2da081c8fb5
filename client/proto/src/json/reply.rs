//! Answers as JSON: each reply's object, and [`JsonWriter`], which writes
//! one op's answer or a batch's from borrowed data.

use serde::Serialize;
use serde_json::{json, Value};

use crate::error::ErrorCode;
use crate::message::{EngineState, Op, PodDetail, PodTiers, ReceiptCounts, Reply, WireStats};

/// A reply as its JSON object: `{"ok":true,...}` with its fields, or the
/// error object of [`error_json`].
///
/// - lookup: `"key_blocks"` (the key's length in blocks) and `"matches"`,
///   `[{"pod":P,"blocks":K},...]`, every pod with `K ≥ 1`, by `K`
///   descending then pod name;
/// - remove_pod, unsubscribe: `"removed"`, whether the pod was there;
/// - stats: the index's counts; list_engines: `"engines"`, one object per
///   subscription, its fields then its state;
/// - sample_keys: `"keys"`, `[{"model":M,"hashes":[...]},...]`;
/// - lookup_detail: as lookup, each match
///   `{"pod":P,"blocks":K,"lower_blocks":L,"view":V,"age_ms":A}`
///   ([`crate::PodView::name`]);
/// - tail: `"from"`, `"next"` and `"ops"`, each write as a replay line's
///   object ([`write_json`]);
/// - digest: `"models"` (`[{"model":M,"groups":[...]}]`), `"removals"`
///   (`[{"pod":P,"at":T}]`), `"values"`, `"entries"`
///   (`[{"pod":P,"key":[...],"at":T}]`) and `"more"`, as
///   [`crate::message::DigestAnswer`] has them;
/// - insert, set_pod_capacity, subscribe, ping: nothing more.
pub fn reply_json(reply: &Reply) -> Value {
    match reply {
        Reply::Lookup {
            key_blocks,
            matches,
        } => {
            let matches: Vec<Value> = matches
                .iter()
                .map(|m| json!({ "pod": m.pod.as_str(), "blocks": m.blocks }))
                .collect();
            json!({ "ok": true, "key_blocks": key_blocks, "matches": matches })
        }
        Reply::Done | Reply::Pong => json!({ "ok": true }),
        Reply::Removed(removed) => json!({ "ok": true, "removed": removed }),
        Reply::Stats(s) => stats_json(s),
        Reply::Engines(engines) => {
            let engines: Vec<Value> = engines.iter().map(engine_json).collect();
            json!({ "ok": true, "engines": engines })
        }
        Reply::Keys(keys) => {
            let keys: Vec<Value> = keys
                .iter()
                .map(|k| json!({ "model": k.model, "hashes": k.key }))
                .collect();
            json!({ "ok": true, "keys": keys })
        }
        Reply::Detail {
            key_blocks,
            matches,
        } => {
            let matches: Vec<Value> = matches.iter().map(detail_json).collect();
            json!({ "ok": true, "key_blocks": key_blocks, "matches": matches })
        }
        Reply::Tiers {
            key_blocks,
            matches,
        } => {
            let matches: Vec<Value> = matches.iter().map(tiers_json).collect();
            json!({ "ok": true, "key_blocks": key_blocks, "matches": matches })
        }
        Reply::Writes { from, next, ops } => {
            let ops: Vec<Value> = ops.iter().map(write_json).collect();
            json!({ "ok": true, "from": from, "next": next, "ops": ops })
        }
        Reply::Digest(answer) => {
            let mut v = serde_json::to_value(answer).unwrap_or_default();
            if let Value::Object(fields) = &mut v {
                fields.insert("ok".into(), Value::Bool(true));
            }
            v
        }
        Reply::Error { code, message } => error_json(Some(*code), message),
    }
}

/// A write a tail answers, as a replay line's object: `insert` with its key
/// as `"hashes"`, `remove_pod`, `set_pod_capacity` (a tail carries no
/// other op; one would be named alone).
pub fn write_json(op: &Op) -> Value {
    match op {
        Op::Insert { model, key, pod } => {
            json!({ "op": "insert", "model": model, "hashes": key, "pod": pod })
        }
        Op::RemovePod { pod } => json!({ "op": "remove_pod", "pod": pod }),
        Op::SetPodCapacity { pod, blocks } => {
            json!({ "op": "set_pod_capacity", "pod": pod, "blocks": blocks })
        }
        other => json!({ "op": other.kind().name() }),
    }
}

/// One pod of a detailed lookup's answer as JSON.
pub fn detail_json(m: &PodDetail) -> Value {
    json!({
        "pod": m.pod.as_str(),
        "blocks": m.blocks,
        "lower_blocks": m.lower_blocks,
        "view": m.view.name(),
        "age_ms": m.age_ms,
    })
}

/// One pod of a tiered lookup's answer as JSON: its lower tiers in its
/// subscription's order, each with how far it reaches.
pub fn tiers_json(m: &PodTiers) -> Value {
    let tiers: Vec<Value> = m
        .tiers
        .iter()
        .map(|t| json!({ "medium": t.medium, "blocks": t.blocks }))
        .collect();
    json!({ "pod": m.pod.as_str(), "blocks": m.blocks, "tiers": tiers })
}

/// Writes a JSON answer piece by piece, from borrowed data, as
/// [`crate::ResponseWriter`] writes a frame: the server's HTTP API answers
/// lookups without copying pod names into owned replies. One op's answer is
/// its reply object; a batch's is `{"ok":true,"results":[...]}`, one object
/// per op in order.
pub struct JsonWriter<'a> {
    out: &'a mut Vec<u8>,
    start: usize,
    batch: bool,
    written: usize,
    error: Option<u16>,
}

impl<'a> JsonWriter<'a> {
    /// Starts the answer to one op; write exactly one reply next.
    pub fn one(out: &'a mut Vec<u8>) -> Self {
        let start = out.len();
        JsonWriter {
            out,
            start,
            batch: false,
            written: 0,
            error: None,
        }
    }

    /// Starts the answer to a batch.
    pub fn batch(out: &'a mut Vec<u8>) -> Self {
        let start = out.len();
        out.extend_from_slice(br#"{"ok":true,"results":["#);
        JsonWriter {
            out,
            start,
            batch: true,
            written: 0,
            error: None,
        }
    }

    fn next(&mut self) {
        if self.batch && self.written > 0 {
            self.out.push(b',');
        }
        self.written += 1;
    }

    /// Writes a lookup's reply listing `matches` (pod name, blocks).
    pub fn lookup<S: AsRef<str>>(&mut self, key_blocks: u32, matches: &[(S, u32)]) {
        #[derive(Serialize)]
        struct Match<'m> {
            pod: &'m str,
            blocks: u32,
        }
        #[derive(Serialize)]
        struct Lookup<'m> {
            ok: bool,
            key_blocks: u32,
            matches: Vec<Match<'m>>,
        }
        self.next();
        let answer = Lookup {
            ok: true,
            key_blocks,
            matches: matches
                .iter()
                .map(|(pod, blocks)| Match {
                    pod: pod.as_ref(),
                    blocks: *blocks,
                })
                .collect(),
        };
        // Writing into a Vec cannot fail, and these types always serialize.
        let _ = serde_json::to_writer(&mut *self.out, &answer);
    }

    /// Writes a detailed lookup's reply, each pod with its recent receipts
    /// (`receipts[i]` are `matches[i]`'s) as `"receipts":{"exact":E,
    /// "over":O,"under":U}`.
    pub fn detail(&mut self, key_blocks: u32, matches: Vec<PodDetail>, receipts: &[ReceiptCounts]) {
        self.next();
        let matches: Vec<Value> = matches
            .iter()
            .zip(
                receipts
                    .iter()
                    .copied()
                    .chain(std::iter::repeat(ReceiptCounts::default())),
            )
            .map(|(m, r)| {
                let mut v = detail_json(m);
                if let Value::Object(fields) = &mut v {
                    fields.insert(
                        "receipts".into(),
                        json!({ "exact": r.exact, "over": r.over, "under": r.under }),
                    );
                }
                v
            })
            .collect();
        let answer = json!({ "ok": true, "key_blocks": key_blocks, "matches": matches });
        let _ = serde_json::to_writer(&mut *self.out, &answer);
    }

    /// Writes any reply ([`reply_json`]).
    pub fn reply(&mut self, reply: &Reply) {
        self.next();
        if let Reply::Error { code, .. } = reply {
            self.error.get_or_insert(*code);
        }
        let _ = serde_json::to_writer(&mut *self.out, &reply_json(reply));
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.out.len() - self.start
    }

    /// Whether nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops the answer written so far, leaving the buffer as it was.
    pub fn abandon(self) {
        self.out.truncate(self.start);
    }

    /// Completes the answer; returns the error code of one op's reply, if
    /// it was an error (a batch's answer is whole even when ops failed).
    pub fn finish(self) -> Option<u16> {
        if self.batch {
            self.out.extend_from_slice(b"]}");
            None
        } else {
            self.error
        }
    }
}

fn stats_json(s: &WireStats) -> Value {
    json!({
        "ok": true,
        "models": s.models,
        "pods": s.pods,
        "nodes": s.nodes,
        "tree_blocks": s.tree_blocks,
        "entries": s.entries,
        "bytes": s.bytes,
    })
}

/// One engine of a `list_engines` answer.
fn engine_json(e: &EngineState) -> Value {
    let (s, e) = (&e.sub, &e.status);
    json!({
        "pod": s.pod,
        "model": s.model,
        "endpoint": s.endpoint,
        "replay": s.replay,
        "block_size": s.block_size,
        "topic": s.topic,
        "media": s.media,
        "connected": e.connected,
        "last_seq": e.last_seq,
        "events": e.events,
        "blocks_stored": e.blocks_stored,
        "blocks_removed": e.blocks_removed,
        "resyncs": e.resyncs,
        "replays": e.replays,
        "orphaned": e.orphaned,
        "decode_errors": e.decode_errors,
        "lag_ms": e.lag_ms,
        "last_error": e.last_error,
    })
}

/// An error's JSON object: `{"ok":false,"error":{"code":N,"name":S,
/// "message":M}}`. `code` is the protocol's [`ErrorCode`] number (`null`
/// for failures with none, such as a client's timeout); `name` its
/// [`ErrorCode::name`] (`null` for a number this build does not know).
pub fn error_json(code: Option<u16>, message: &str) -> Value {
    let name = code.and_then(ErrorCode::from_u16).map(ErrorCode::name);
    json!({
        "ok": false,
        "error": { "code": code, "name": name, "message": message },
    })
}
