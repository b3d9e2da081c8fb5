//! The wire of NVIDIA Dynamo's standalone KV indexer (`dynamo-kv-router`
//! 1.6.1, feature `standalone-indexer`, `src/services/indexer/server.rs`;
//! its remote client, `RemoteIndexerTransport` on Dynamo's main branch, for
//! `/query_tiered_by_hash`), the shape Mooncake's RFC #1403 describes.
//! Sans-IO: bodies in, typed requests out; answers in, JSON out.
//!
//! Field names, defaults and answer shapes are Dynamo's. Unknown fields
//! are ignored, as Dynamo ignores them. Besides Dynamo's spellings, the
//! ones other clients of the RFC send are read: `model` and `modelname`
//! for `model_name` (Mooncake's Conductor, Ascend MindIE's coordinator),
//! `additionalsalt` for `additional_salt`, an `instance_id` given as a
//! string (Mooncake's), and a query's `block_size` (MindIE's, which must
//! then be the partition's).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// Dynamo's routing group when none is given.
pub const DEFAULT_GROUP: &str = "default";

fn default_group() -> String {
    DEFAULT_GROUP.into()
}

/// An instance's id: Dynamo's `u64`, or the string Mooncake's clients send.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(untagged)]
pub enum InstanceId {
    /// Dynamo's worker id.
    Number(u64),
    /// Another client's name of the instance.
    Name(String),
}

impl InstanceId {
    /// Its text, as a pod name and an answer's key carry it.
    pub fn text(&self) -> String {
        match self {
            InstanceId::Number(n) => n.to_string(),
            InstanceId::Name(s) => s.clone(),
        }
    }

    /// The id as its text reads back: a number when it is one.
    pub fn from_text(text: &str) -> InstanceId {
        match text.parse::<u64>() {
            Ok(n) if n.to_string() == text => InstanceId::Number(n),
            _ => InstanceId::Name(text.into()),
        }
    }

    /// As JSON: a number, or a string.
    pub fn json(&self) -> Value {
        match self {
            InstanceId::Number(n) => json!(n),
            InstanceId::Name(s) => json!(s),
        }
    }
}

/// `POST /register`.
#[derive(Debug, Clone, Deserialize)]
pub struct Register {
    /// The worker (a pod of ours with its rank).
    pub instance_id: InstanceId,
    /// Its ZeroMQ PUB endpoint.
    pub endpoint: String,
    /// The model its blocks are of.
    #[serde(alias = "model", alias = "modelname")]
    pub model_name: String,
    /// Dynamo's partition of workers within a model.
    #[serde(default = "default_group")]
    pub routing_group: String,
    /// Tokens per engine block.
    pub block_size: u32,
    /// Its data-parallel rank (absent: 0).
    #[serde(default)]
    pub dp_rank: Option<u32>,
    /// Its replay (ROUTER) endpoint.
    #[serde(default)]
    pub replay_endpoint: Option<String>,
}

/// `POST /unregister`.
#[derive(Debug, Clone, Deserialize)]
pub struct Unregister {
    /// The worker.
    pub instance_id: InstanceId,
    /// Its model.
    #[serde(alias = "model", alias = "modelname")]
    pub model_name: String,
    /// Its routing group; absent: whichever it is in.
    #[serde(default)]
    pub routing_group: Option<String>,
    /// One rank; absent: every rank of the instance.
    #[serde(default)]
    pub dp_rank: Option<u32>,
}

/// `POST /query`.
#[derive(Debug, Clone, Deserialize)]
pub struct Query {
    /// The prompt's token ids.
    pub token_ids: Vec<u32>,
    /// Its model.
    #[serde(alias = "model", alias = "modelname")]
    pub model_name: String,
    /// The routing group asked.
    #[serde(default = "default_group")]
    pub routing_group: String,
    /// The LoRA adapter the request runs with.
    #[serde(default)]
    pub lora_name: Option<String>,
    /// The request's cache salt.
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// The block size the client hashes in (MindIE's); must be the
    /// partition's when given.
    #[serde(default)]
    pub block_size: Option<u32>,
}

/// `POST /query_by_hash` and `POST /query_tiered_by_hash`.
#[derive(Debug, Clone, Deserialize)]
pub struct QueryByHash {
    /// Dynamo's local block hashes, as signed 64-bit integers.
    pub block_hashes: Vec<i64>,
    /// Their model.
    #[serde(alias = "model", alias = "modelname")]
    pub model_name: String,
    /// The routing group asked.
    #[serde(default = "default_group")]
    pub routing_group: String,
    /// Refused when given: the hashes carry the salt.
    #[serde(default)]
    pub cache_salt: Option<String>,
}

/// `GET /workers`'s filters.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct WorkerFilter {
    /// Only workers of this model.
    #[serde(default)]
    pub model_name: Option<String>,
    /// Only workers of this routing group.
    #[serde(default)]
    pub routing_group: Option<String>,
}

/// Why a body is not a request, with Dynamo's statuses: 400 for bad JSON,
/// 415 for a body that is not JSON at all (MindIE's msgpack), 422 for JSON
/// of the wrong shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// The HTTP status.
    pub status: u16,
    /// What is wrong.
    pub message: String,
}

impl Refused {
    /// A refusal with `status`.
    pub fn new(status: u16, message: impl Into<String>) -> Refused {
        Refused {
            status,
            message: message.into(),
        }
    }

    /// Its body: `{"error": message}`, as Dynamo answers errors.
    pub fn body(&self) -> Value {
        json!({ "error": self.message })
    }
}

/// A body's array of token ids, read apart from the rest
/// ([`prefix_proto::json::ids`]): the field's name, and where the ids go.
pub type Ids<T> = (&'static str, fn(&mut T, Vec<u32>));

/// A route's body, as [`parse`] reads it.
pub trait Body: serde::de::DeserializeOwned {
    /// Its token ids, if it has any.
    const IDS: Option<Ids<Self>> = None;
}

impl Body for Register {}
impl Body for Unregister {}
impl Body for QueryByHash {}
impl Body for Query {
    const IDS: Option<Ids<Self>> = Some(("token_ids", |q, ids| q.token_ids = ids));
}

/// Parses a JSON body of `T`, with Dynamo's statuses for what is wrong.
/// `content_type` is the request's, if it gave one: a body named as
/// something other than JSON (MindIE's msgpack) is refused 415; one named
/// as plain text or as a form, what tools such as `curl -d` send unless
/// told otherwise, is read as JSON.
pub fn parse<T: Body>(body: &[u8], content_type: Option<&str>) -> Result<T, Refused> {
    if let Some(ct) = content_type {
        let ct = ct.split(';').next().unwrap_or("").trim();
        let json = ct.eq_ignore_ascii_case("application/json")
            || (ct.starts_with("application/") && ct.ends_with("+json"));
        // What `curl -d` and other tools send by default, for a body that
        // is JSON all the same: read as such, as `/v1/...` reads any body.
        let lax = ct.is_empty()
            || ct.eq_ignore_ascii_case("text/plain")
            || ct.eq_ignore_ascii_case("application/x-www-form-urlencoded");
        if !json && !lax {
            return Err(Refused::new(
                415,
                format!("expected a JSON body (Content-Type: application/json), not {ct}"),
            ));
        }
    }
    let parsed = match T::IDS {
        Some((field, put)) => prefix_proto::json::ids::from_slice(body, field, put),
        None => serde_json::from_slice(body),
    };
    parsed.map_err(|e| {
        let status = if e.is_syntax() || e.is_eof() {
            400
        } else {
            422
        };
        Refused::new(status, format!("the body does not parse: {e}"))
    })
}

/// One worker rank's match, in blocks of ours: its GPU's, and how far its
/// host-memory tiers and then every lower tier reach.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RankMatch {
    /// Leading blocks its GPU holds.
    pub gpu: u32,
    /// How far the GPU and its host-memory tiers reach.
    pub cpu: u32,
    /// How far every tier reaches.
    pub disk: u32,
}

/// Each instance's ranks' matches, by instance then rank.
pub type Matches = BTreeMap<String, BTreeMap<u32, RankMatch>>;

/// `/query` and `/query_by_hash`'s answer (Dynamo's `ScoreResponse`),
/// counts in tokens (`blocks × tokens_per_block`): `scores` each instance's
/// ranks with GPU blocks, `frequencies` empty (as Dynamo 1.6.1 answers
/// it), `instances` each instance with any tier's blocks: `gpu`, `cpu` and
/// `disk` the most any of its ranks reaches (cumulative: `disk ≥ cpu ≥
/// gpu`), `longest_matched` the most of those, `dp` each rank's GPU
/// tokens. Written straight from these types (ranks, numbers, become JSON
/// object keys as strings), with no intermediate JSON tree.
#[derive(Debug, Serialize)]
pub struct ScoreResponse<'a> {
    scores: BTreeMap<&'a str, BTreeMap<u32, u64>>,
    frequencies: [u64; 0],
    instances: BTreeMap<&'a str, InstanceScore>,
}

/// One instance of [`ScoreResponse::instances`].
#[derive(Debug, Serialize)]
struct InstanceScore {
    longest_matched: u64,
    gpu: u64,
    dp: BTreeMap<u32, u64>,
    cpu: u64,
    disk: u64,
}

/// `matches` as [`ScoreResponse`].
pub fn score_response(matches: &Matches, tokens_per_block: u32) -> ScoreResponse<'_> {
    let tokens = |blocks: u32| u64::from(blocks) * u64::from(tokens_per_block);
    let mut scores = BTreeMap::new();
    let mut instances = BTreeMap::new();
    for (instance, ranks) in matches {
        let gpu_ranks: BTreeMap<u32, u64> = ranks
            .iter()
            .filter(|(_, m)| m.gpu > 0)
            .map(|(r, m)| (*r, tokens(m.gpu)))
            .collect();
        if !gpu_ranks.is_empty() {
            scores.insert(instance.as_str(), gpu_ranks);
        }
        let most = |f: fn(&RankMatch) -> u32| ranks.values().map(f).max().unwrap_or(0);
        let (gpu, cpu, disk) = (most(|m| m.gpu), most(|m| m.cpu), most(|m| m.disk));
        instances.insert(
            instance.as_str(),
            InstanceScore {
                longest_matched: tokens(gpu.max(cpu).max(disk)),
                gpu: tokens(gpu),
                dp: ranks.iter().map(|(r, m)| (*r, tokens(m.gpu))).collect(),
                cpu: tokens(cpu),
                disk: tokens(disk),
            },
        );
    }
    ScoreResponse {
        scores,
        frequencies: [],
        instances,
    }
}

/// `/query_tiered_by_hash`'s answer (`TieredQueryResponse`): counts in
/// engine blocks of `block_size` tokens, each rank with GPU blocks in
/// `device.scores`, and the blocks each lower tier adds after the tier
/// above it in `lower_tier` (`host_pinned`, then `disk`), for every rank
/// of the answer (0 included, as Dynamo lists them). Instances whose id
/// is not a number have no `worker_id` here and are left out.
pub fn tiered_response(matches: &Matches, block_size: u32, blocks_per_block: u32) -> Value {
    let engine = |ours: u32| ours / blocks_per_block.max(1);
    let mut scores = Vec::new();
    let mut host = Vec::new();
    let mut disk = Vec::new();
    for (instance, ranks) in matches {
        let Ok(worker_id) = instance.parse::<u64>() else {
            continue;
        };
        for (&rank, m) in ranks {
            let who = json!({ "worker_id": worker_id, "dp_rank": rank });
            let (gpu, cpu, all) = (engine(m.gpu), engine(m.cpu), engine(m.disk));
            if gpu > 0 {
                scores.push(json!([who, gpu]));
            }
            host.push(json!([who, cpu.saturating_sub(gpu)]));
            disk.push(json!([who, all.saturating_sub(cpu)]));
        }
    }
    json!({
        "block_size": block_size,
        "tiered": {
            "device": { "scores": scores, "frequencies": [] },
            "lower_tier": [
                ["host_pinned", { "hits": host }],
                ["disk", { "hits": disk }],
            ],
        },
    })
}

/// One worker of `GET /workers` (Dynamo's `WorkerInfo`), its ranks' endpoints
/// and listeners keyed by rank.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerInfo {
    /// The worker's id (a number, or a string for other clients' ids).
    pub instance_id: Value,
    /// Where its events come from: always `zmq`.
    pub source: &'static str,
    /// Its ranks' listeners together: `failed` if any failed, else
    /// `pending` if any is, else `active`.
    pub status: &'static str,
    /// Its model.
    pub model_name: String,
    /// Its routing group.
    pub routing_group: String,
    /// Tokens per engine block.
    pub block_size: u32,
    /// Each rank's event endpoint.
    pub endpoints: BTreeMap<String, String>,
    /// Each rank's listener.
    pub listeners: BTreeMap<String, Listener>,
}

/// One rank's listener of a [`WorkerInfo`].
#[derive(Debug, Clone, Serialize)]
pub struct Listener {
    /// Its event endpoint.
    pub endpoint: String,
    /// `active` (connected), `pending` (not connected yet) or `failed`
    /// (not connected, with the latest problem in `last_error`).
    pub status: &'static str,
    /// The latest problem, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The status of a worker whose ranks' listeners are `statuses`.
pub fn worker_status<'a>(statuses: impl IntoIterator<Item = &'a str>) -> &'static str {
    let all: Vec<&str> = statuses.into_iter().collect();
    if all.contains(&"failed") {
        "failed"
    } else if all.contains(&"pending") {
        "pending"
    } else {
        "active"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_read_dynamos_fields_and_the_other_clients_spellings() {
        let r: Register = parse(
            br#"{"instance_id":7,"endpoint":"tcp://h:1","model_name":"m","block_size":16,"tenant_id":"x","additionalsalt":"s"}"#,
            Some("application/json"),
        )
        .unwrap();
        assert_eq!(r.instance_id, InstanceId::Number(7));
        assert_eq!((r.routing_group.as_str(), r.dp_rank), ("default", None));
        let r: Register = parse(
            br#"{"instance_id":"vllm-prefill-node1","endpoint":"tcp://h:1","modelname":"m","block_size":16,"dp_rank":1}"#,
            None,
        )
        .unwrap();
        assert_eq!(r.instance_id.text(), "vllm-prefill-node1");
        assert_eq!((r.model_name.as_str(), r.dp_rank), ("m", Some(1)));
        let q: Query = parse(br#"{"model":"m","block_size":16,"token_ids":[1,2]}"#, None).unwrap();
        assert_eq!((q.model_name.as_str(), q.block_size), ("m", Some(16)));
        assert_eq!(q.token_ids, [1, 2]);
        let q: Query = parse(br#"{"modelname":"m", "token_ids": [0, 7]}"#, None).unwrap();
        assert_eq!((q.model_name.as_str(), q.token_ids), ("m", vec![0, 7]));
        let h: QueryByHash = parse(
            br#"{"block_hashes":[-1,2],"model_name":"m","cache_salt":null}"#,
            None,
        )
        .unwrap();
        assert_eq!((h.block_hashes, h.cache_salt), (vec![-1, 2], None));
    }

    #[test]
    fn bad_bodies_get_dynamos_statuses() {
        let status = |body: &[u8], ct| parse::<Query>(body, ct).unwrap_err().status;
        assert_eq!(status(b"{", None), 400);
        assert_eq!(status(b"{}", None), 422);
        assert_eq!(status(br#"{"token_ids":[-1],"model_name":"m"}"#, None), 422);
        assert_eq!(status(b"\x82\xa1a", Some("application/msgpack")), 415);
        assert_eq!(status(b"{", Some("application/octet-stream")), 415);
        let body = br#"{"token_ids":[],"model_name":"m"}"#;
        for ct in ["application/x-www-form-urlencoded", "text/plain"] {
            assert!(parse::<Query>(body, Some(ct)).is_ok(), "{ct}");
        }
        assert!(parse::<Query>(
            br#"{"token_ids":[],"model_name":"m"}"#,
            Some("application/json; charset=utf-8")
        )
        .is_ok());
        // A number past u64 as an instance id is a name, never a wrong number.
        let r: Register = parse(
            br#"{"instance_id":"18446744073709551616","endpoint":"e","model_name":"m","block_size":1}"#,
            None,
        )
        .unwrap();
        assert_eq!(InstanceId::from_text(&r.instance_id.text()), r.instance_id);
    }

    #[test]
    fn answers_count_tokens_cumulatively_and_blocks_per_tier() {
        let mut m = Matches::new();
        m.entry("7".into()).or_default().insert(
            0,
            RankMatch {
                gpu: 2,
                cpu: 3,
                disk: 3,
            },
        );
        m.entry("8".into()).or_default().insert(
            0,
            RankMatch {
                gpu: 2,
                cpu: 2,
                disk: 2,
            },
        );
        let v = serde_json::to_value(score_response(&m, 4)).unwrap();
        assert_eq!(
            v,
            json!({"scores":{"7":{"0":8},"8":{"0":8}},"frequencies":[],
                   "instances":{"7":{"longest_matched":12,"gpu":8,"dp":{"0":8},"cpu":12,"disk":12},
                                "8":{"longest_matched":8,"gpu":8,"dp":{"0":8},"cpu":8,"disk":8}}})
        );
        let t = tiered_response(&m, 4, 1);
        assert_eq!(
            t["tiered"]["device"]["scores"][0],
            json!([{"worker_id":7,"dp_rank":0},2])
        );
        assert_eq!(
            t["tiered"]["lower_tier"][0],
            json!(["host_pinned", {"hits": [[{"worker_id":7,"dp_rank":0},1],[{"worker_id":8,"dp_rank":0},0]]}])
        );
        assert_eq!(worker_status(["active", "pending"]), "pending");
        assert_eq!(worker_status(["active", "failed", "pending"]), "failed");
    }
}
