//! NVIDIA Dynamo's standalone KV indexer API, served on the HTTP listener
//! (`docs/routers.md`): `POST /register`, `POST /unregister`,
//! `GET /workers`, `POST /query`, `POST /query_by_hash`,
//! `POST /query_tiered_by_hash` and `GET /health`, with Dynamo's field
//! names, statuses and answers (`wire`).
//!
//! Each route is our own operations under another name, applied by the
//! same [`Handler`](crate::Handler) as a QUIC frame (roles, limits, a cold replica's gate,
//! metrics):
//! - a registered **worker** rank is an engine subscription whose pod is
//!   named `{instance}/{rank}` (`{group}/{instance}/{rank}` outside the
//!   default routing group) and whose model is the worker's: `/register`
//!   subscribes it, `/unregister` unsubscribes, `/workers` lists them;
//!   such subscriptions made any other way (`--engine`, `subscribe`) are
//!   workers too. A **partition** (a model and routing group) exists
//!   while a worker of it does.
//! - `/query` is a tiered lookup (`lookup_tiers`) of the prompt's token
//!   key (the LoRA adapter as the model, the salt as the key's identity),
//!   answered for the partition's workers; `/query_by_hash` and
//!   `/query_tiered_by_hash` translate Dynamo's block hashes into our key
//!   first (`--block-aliases dynamo`, `prefix_index::Alias`).

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use axum::extract::{FromRequest, Query as UrlQuery, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};
use prefix_proto::json::{KeySource, TokenIdentity};
use prefix_proto::{EngineState, ErrorCode, Op, PodTiers, Reply, Request, Subscription};
use serde_json::{json, Value};

use crate::api::{http_status, read_body, run_job, Api, Conn, NotRun, Unread};
use crate::engines::catalog::Catalog;
use crate::engines::BlockAliases;
use crate::handler::Captured;
use crate::service::Service as _;

pub mod wire;

use wire::{InstanceId, Matches, RankMatch, Refused, DEFAULT_GROUP};

/// The media a registered worker is subscribed with: the GPU, then
/// Dynamo's names of host memory, then of storage and shared tiers
/// (`StorageTier::from_kv_medium`), so that a tier's reach in this order
/// is Dynamo's `cpu` through the host-memory ones and `disk` through all.
pub const MEDIA: [&str; 12] = [
    "GPU",
    "CPU",
    "CPU_PINNED",
    "CPU_TIER1",
    "CPU_TIER2",
    "DISK",
    "NVME",
    "STORAGE",
    "EXTERNAL",
    "NETWORK",
    "REMOTE",
    "SHARED",
];

/// Dynamo's host-memory media: its `cpu` count reaches through them.
fn is_host(medium: &str) -> bool {
    ["CPU", "CPU_PINNED", "CPU_TIER1"]
        .iter()
        .any(|m| m.eq_ignore_ascii_case(medium))
}

/// A worker rank, as its pod's name tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Worker {
    /// Its routing group.
    pub group: String,
    /// Its instance id, as text.
    pub instance: String,
    /// Its data-parallel rank.
    pub rank: u32,
}

impl Worker {
    /// The pod of this worker rank.
    pub fn pod(&self) -> String {
        match self.group.as_str() {
            DEFAULT_GROUP => format!("{}/{}", self.instance, self.rank),
            group => format!("{group}/{}/{}", self.instance, self.rank),
        }
    }

    /// The worker rank a pod is, if its name is one's.
    pub fn of_pod(pod: &str) -> Option<Worker> {
        let (rest, rank) = pod.rsplit_once('/')?;
        let rank: u32 = rank.parse().ok().filter(|r: &u32| r.to_string() == rank)?;
        let (group, instance) = match rest.rsplit_once('/') {
            Some((group, instance)) => (group, instance),
            None => (DEFAULT_GROUP, rest),
        };
        if instance.is_empty() || group.is_empty() {
            return None;
        }
        Some(Worker {
            group: group.into(),
            instance: instance.into(),
            rank,
        })
    }
}

/// The worker ranks of the followed subscriptions, with their
/// subscriptions.
fn workers(catalog: &Catalog) -> Vec<(Worker, &Subscription)> {
    let mut all: Vec<(Worker, &Subscription)> = catalog
        .subs
        .values()
        .filter_map(|s| Some((Worker::of_pod(&s.pod)?, &**s)))
        .collect();
    all.sort_by(|a, b| a.1.pod.cmp(&b.1.pod));
    all
}

/// What the routes share: the API's state, one registration at a time
/// (what it checks is what it subscribes), and the partitions of the last
/// catalog read.
struct Dynamo {
    api: Arc<Api>,
    registering: tokio::sync::Mutex<()>,
    partitions: ArcSwapOption<Partitions>,
}

/// The partitions of one catalog, by model, then routing group.
struct Partitions {
    /// The catalog they were read from; held, so that no other catalog is
    /// ever at its address while this is compared with one.
    of: Arc<Catalog>,
    by_model: HashMap<String, HashMap<String, Arc<Partition>>>,
}

/// One model's and routing group's workers.
#[derive(Default)]
struct Partition {
    /// Their pods, one per rank, each with the rank its name tells.
    pods: HashMap<String, Worker>,
    /// Their block size (all of theirs are the same: `/register` refuses
    /// another).
    block_size: u32,
}

impl Partitions {
    fn of(catalog: Arc<Catalog>) -> Partitions {
        let mut by_model: HashMap<String, HashMap<String, Partition>> = HashMap::new();
        for (w, sub) in workers(&catalog) {
            let p = by_model
                .entry(sub.model.clone())
                .or_default()
                .entry(w.group.clone())
                .or_default();
            p.pods.insert(sub.pod.clone(), w);
            p.block_size = sub.block_size;
        }
        let by_model = by_model
            .into_iter()
            .map(|(m, groups)| {
                (
                    m,
                    groups.into_iter().map(|(g, p)| (g, Arc::new(p))).collect(),
                )
            })
            .collect();
        Partitions {
            of: catalog,
            by_model,
        }
    }
}

impl Dynamo {
    /// A partition's workers and its block size, or Dynamo's 404. The
    /// partitions are read again only when the catalog changed: a query
    /// costs the same with one worker or ten thousand.
    fn partition(&self, model: &str, group: &str) -> Result<Arc<Partition>, Refused> {
        let catalog = catalog_of(&self.api)?;
        let cached = self.partitions.load_full();
        let parts = match cached {
            Some(p) if Arc::ptr_eq(&p.of, &catalog) => p,
            _ => {
                let fresh = Arc::new(Partitions::of(catalog));
                self.partitions.store(Some(fresh.clone()));
                fresh
            }
        };
        parts
            .by_model
            .get(model)
            .and_then(|groups| groups.get(group))
            .cloned()
            .ok_or_else(|| {
                Refused::new(
                    404,
                    format!("no indexer for model={model} routing_group={group}"),
                )
            })
    }
}

/// The routes, on the API's state.
pub fn router(api: Arc<Api>) -> Router {
    let state = Arc::new(Dynamo {
        api,
        registering: tokio::sync::Mutex::new(()),
        partitions: ArcSwapOption::empty(),
    });
    Router::new()
        .route("/register", post(register))
        .route("/unregister", post(unregister))
        .route("/workers", get(list_workers))
        .route("/query", post(query))
        .route("/query_by_hash", post(query_by_hash))
        .route("/query_tiered_by_hash", post(query_tiered_by_hash))
        .route("/health", get(|| async { StatusCode::OK }))
        .with_state(state)
}

fn answer(status: u16, body: impl serde::Serialize) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = serde_json::to_vec(&body).unwrap_or_else(|_| b"{}".to_vec());
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A refusal is answered as Dynamo answers errors, so that a route can
/// return `Result<Response, Refused>` and refuse with `?`.
impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        answer(self.status, self.body())
    }
}

/// An error reply of our own as Dynamo's error answer.
fn reply_error(reply: &Reply) -> Refused {
    match reply {
        Reply::Error { code, message } => {
            let status = ErrorCode::from_u16(*code).map_or(500, http_status);
            Refused::new(status, message.clone())
        }
        other => Refused::new(500, format!("unexpected answer {other:?}")),
    }
}

/// A route's body, read as the API reads any body (its size and time
/// limits) and parsed as `T` with Dynamo's statuses for what is wrong.
struct Parsed<T>(T);

impl<T: wire::Body> FromRequest<Arc<Dynamo>> for Parsed<T> {
    type Rejection = Refused;

    async fn from_request(
        request: axum::extract::Request,
        d: &Arc<Dynamo>,
    ) -> Result<Self, Refused> {
        let (parts, body) = request.into_parts();
        let api = &d.api;
        let bytes = match read_body(api, &parts.headers, body).await {
            Ok(b) => b,
            Err(Unread::Refused(reply)) => return Err(reply_error(&reply)),
            Err(Unread::Late) => {
                return Err(Refused::new(
                    408,
                    format!(
                        "the body did not arrive within read-timeout = {:?}",
                        api.read_timeout
                    ),
                ))
            }
        };
        let ct = parts.headers.get(header::CONTENT_TYPE);
        wire::parse(&bytes, ct.and_then(|v| v.to_str().ok())).map(Parsed)
    }
}

/// Applies `ops` for `conn`'s client through the handler, as the API runs
/// any request ([`run_job`]), and returns their replies.
async fn apply(api: &Arc<Api>, conn: &Conn, ops: Vec<Op>) -> Result<Vec<Reply>, Refused> {
    let request = match ops.len() {
        1 => Request::One(ops.into_iter().next().unwrap_or(Op::Ping)),
        _ => Request::Batch(ops),
    };
    let heavy = api.handler.is_heavy(&request);
    let (api, access) = (api.clone(), conn.access.clone());
    let ran = run_job(conn, heavy, move || {
        let mut captured = Captured::default();
        api.handler.apply_all(&request, &access, &mut captured);
        captured.replies
    })
    .await;
    ran.map_err(|e| match e {
        NotRun::ShuttingDown => Refused::new(503, "shutting down"),
        NotRun::Failed => Refused::new(500, "the request failed"),
    })
}

/// The one reply of `ops`, an error one refused.
async fn apply_one(api: &Arc<Api>, conn: &Conn, op: Op) -> Result<Reply, Refused> {
    let reply = apply(api, conn, vec![op])
        .await?
        .pop()
        .ok_or_else(|| Refused::new(500, "no answer"))?;
    match reply {
        Reply::Error { .. } => Err(reply_error(&reply)),
        reply => Ok(reply),
    }
}

fn catalog_of(api: &Api) -> Result<Arc<Catalog>, Refused> {
    match &api.handler.engines {
        Some(engines) => Ok(engines.catalog()),
        None => Err(Refused::new(501, "this server follows no engines")),
    }
}

async fn register(
    State(d): State<Arc<Dynamo>>,
    Extension(conn): Extension<Arc<Conn>>,
    Parsed(r): Parsed<wire::Register>,
) -> Result<Response, Refused> {
    let api = &d.api;
    let instance = r.instance_id.text();
    if instance.is_empty() || instance.contains(['/', '\0']) || r.routing_group.contains('\0') {
        return Err(Refused::new(
            400,
            format!(
                "instance_id {instance:?} and routing_group must be non-empty names without '/'"
            ),
        ));
    }
    let worker = Worker {
        group: r.routing_group.clone(),
        instance,
        rank: r.dp_rank.unwrap_or(0),
    };
    // One registration at a time: what is checked is what is subscribed.
    let _one = d.registering.lock().await;
    let catalog = catalog_of(api)?;
    for (w, sub) in workers(&catalog) {
        if w.instance != worker.instance {
            if sub.model == r.model_name
                && w.group == worker.group
                && sub.block_size != r.block_size
            {
                return Err(Refused::new(
                    409,
                    format!(
                        "block_size mismatch for model={} routing_group={}: existing={}, requested={}",
                        r.model_name, worker.group, sub.block_size, r.block_size
                    ),
                ));
            }
            continue;
        }
        if sub.model != r.model_name || w.group != worker.group {
            return Err(Refused::new(
                409,
                format!(
                    "instance {} is already registered for model={} routing_group={}",
                    worker.instance, sub.model, w.group
                ),
            ));
        }
        if w.rank == worker.rank {
            return Err(Refused::new(
                409,
                format!(
                    "instance {} dp_rank {} already registered",
                    worker.instance, worker.rank
                ),
            ));
        }
    }
    let sub = Subscription {
        pod: worker.pod(),
        model: r.model_name,
        endpoint: r.endpoint,
        replay: r.replay_endpoint.filter(|e| !e.is_empty()),
        block_size: r.block_size,
        topic: String::new(),
        media: MEDIA.iter().map(|m| (*m).into()).collect(),
    };
    apply_one(api, &conn, Op::Subscribe(sub)).await?;
    Ok(answer(201, json!({ "status": "ok" })))
}

async fn unregister(
    State(d): State<Arc<Dynamo>>,
    Extension(conn): Extension<Arc<Conn>>,
    Parsed(r): Parsed<wire::Unregister>,
) -> Result<Response, Refused> {
    let api = &d.api;
    let instance = r.instance_id.text();
    let _one = d.registering.lock().await;
    let catalog = catalog_of(api)?;
    let of_instance: Vec<(Worker, &Subscription)> = workers(&catalog)
        .into_iter()
        .filter(|(w, _)| w.instance == instance)
        .collect();
    let Some((first, sub)) = of_instance.first() else {
        return Err(Refused::new(404, format!("instance {instance} not found")));
    };
    let group_differs = r.routing_group.as_ref().is_some_and(|g| *g != first.group);
    if sub.model != r.model_name || group_differs {
        return Err(Refused::new(
            404,
            format!(
                "instance {instance} is registered for model={} routing_group={}",
                sub.model, first.group
            ),
        ));
    }
    let pods: Vec<String> = of_instance
        .iter()
        .filter(|(w, _)| r.dp_rank.is_none_or(|rank| w.rank == rank))
        .map(|(_, s)| s.pod.clone())
        .collect();
    if pods.is_empty() {
        let rank = r.dp_rank.unwrap_or(0);
        return Err(Refused::new(
            404,
            format!("instance {instance} dp_rank {rank} not found"),
        ));
    }
    let ops = pods
        .into_iter()
        .map(|pod| Op::Unsubscribe { pod })
        .collect();
    for reply in apply(api, &conn, ops).await? {
        if let Reply::Error { .. } = reply {
            return Err(reply_error(&reply));
        }
    }
    Ok(answer(200, json!({ "status": "ok" })))
}

async fn list_workers(
    State(d): State<Arc<Dynamo>>,
    Extension(conn): Extension<Arc<Conn>>,
    UrlQuery(filter): UrlQuery<wire::WorkerFilter>,
) -> Result<Response, Refused> {
    match apply_one(&d.api, &conn, Op::ListEngines).await? {
        Reply::Engines(states) => Ok(answer(200, workers_json(&states, &filter))),
        other => Err(reply_error(&other)),
    }
}

/// `GET /workers`'s answer: a bare array, one object per instance.
fn workers_json(states: &[EngineState], filter: &wire::WorkerFilter) -> Value {
    use std::collections::BTreeMap;
    let mut by_instance: BTreeMap<(String, String), wire::WorkerInfo> = BTreeMap::new();
    for st in states {
        let Some(w) = Worker::of_pod(&st.sub.pod) else {
            continue;
        };
        if filter
            .model_name
            .as_ref()
            .is_some_and(|m| *m != st.sub.model)
            || filter.routing_group.as_ref().is_some_and(|g| *g != w.group)
        {
            continue;
        }
        let info = by_instance
            .entry((w.group.clone(), w.instance.clone()))
            .or_insert_with(|| wire::WorkerInfo {
                instance_id: InstanceId::from_text(&w.instance).json(),
                source: "zmq",
                status: "active",
                model_name: st.sub.model.clone(),
                routing_group: w.group.clone(),
                block_size: st.sub.block_size,
                endpoints: BTreeMap::new(),
                listeners: BTreeMap::new(),
            });
        let status = match (st.status.connected, &st.status.last_error) {
            (true, _) => "active",
            (false, None) => "pending",
            (false, Some(_)) => "failed",
        };
        let rank = w.rank.to_string();
        info.endpoints.insert(rank.clone(), st.sub.endpoint.clone());
        info.listeners.insert(
            rank,
            wire::Listener {
                endpoint: st.sub.endpoint.clone(),
                status,
                last_error: st
                    .status
                    .last_error
                    .clone()
                    .filter(|_| !st.status.connected),
            },
        );
        info.status = wire::worker_status(info.listeners.values().map(|l| l.status));
    }
    serde_json::to_value(by_instance.into_values().collect::<Vec<_>>()).unwrap_or(json!([]))
}

/// A tiered lookup's matches of the partition's pods, by instance and
/// rank, in blocks of ours.
fn matches(found: &[PodTiers], pods: &HashMap<String, Worker>) -> Matches {
    let mut out = Matches::new();
    for m in found {
        let Some(w) = pods.get(&*m.pod) else {
            continue;
        };
        // Host memory first in a worker's media: `cpu` reaches through
        // the host tiers before the first other one.
        let host = m.tiers.iter().take_while(|t| is_host(&t.medium)).last();
        let cpu = host.map_or(m.blocks, |t| t.blocks);
        let disk = m.tiers.last().map_or(cpu, |t| t.blocks);
        out.entry(w.instance.clone()).or_default().insert(
            w.rank,
            RankMatch {
                gpu: m.blocks,
                cpu,
                disk,
            },
        );
    }
    out
}

/// Looks up `key` in `model`'s namespace with every tier, for `access`.
async fn tiers(
    api: &Arc<Api>,
    conn: &Conn,
    model: String,
    mut key: Vec<u64>,
) -> Result<Vec<PodTiers>, Refused> {
    // Dynamo looks up a prompt of any length: past the key limit, the
    // first `max_key_blocks` blocks answer.
    key.truncate(api.handler.limits.max_key_blocks);
    if key.is_empty() {
        return Ok(Vec::new());
    }
    let op = Op::LookupTiers {
        model,
        key,
        candidates: None,
    };
    match apply_one(api, conn, op).await? {
        Reply::Tiers { matches, .. } => Ok(matches),
        other => Err(reply_error(&other)),
    }
}

async fn query(
    State(d): State<Arc<Dynamo>>,
    Extension(conn): Extension<Arc<Conn>>,
    Parsed(q): Parsed<wire::Query>,
) -> Result<Response, Refused> {
    let api = &d.api;
    let partition = d.partition(&q.model_name, &q.routing_group)?;
    let block_size = partition.block_size;
    if q.block_size.is_some_and(|b| b != block_size) {
        return Err(Refused::new(
            400,
            format!(
                "block_size {:?}: this partition's blocks are of {block_size} tokens",
                q.block_size
            ),
        ));
    }
    let source = KeySource {
        tokens: Some(q.token_ids),
        identity: TokenIdentity {
            cache_salt: q.cache_salt.filter(|s| !s.is_empty()),
            ..TokenIdentity::default()
        },
        ..KeySource::default()
    };
    let key = source
        .into_key(&api.keys)
        .map_err(|e| Refused::new(400, e.to_string()))?;
    // An adapter's blocks are a model of their own.
    let model = q
        .lora_name
        .filter(|l| !l.is_empty())
        .unwrap_or(q.model_name);
    let found = tiers(api, &conn, model, key).await?;
    let m = matches(&found, &partition.pods);
    Ok(answer(
        200,
        wire::score_response(&m, api.keys.block_tokens as u32),
    ))
}

/// `/query_by_hash` and `/query_tiered_by_hash`: the partition's matches of
/// Dynamo's block hashes, and its block size.
async fn by_hash(d: &Dynamo, conn: &Conn, q: wire::QueryByHash) -> Result<(Matches, u32), Refused> {
    let api = &d.api;
    if q.cache_salt.is_some() {
        return Err(Refused::new(
            400,
            "cache_salt is not accepted by /query_by_hash; block_hashes must already include the intended cache salt",
        ));
    }
    let partition = d.partition(&q.model_name, &q.routing_group)?;
    let aliases = api
        .handler
        .engines
        .as_ref()
        .map(|e| e.config().block_aliases);
    if aliases != Some(BlockAliases::Dynamo) {
        return Err(Refused::new(
            501,
            "this server does not key engine blocks by Dynamo's block hashes: start it with --block-aliases dynamo",
        ));
    }
    let names: Vec<u64> = q.block_hashes.iter().map(|&h| h as u64).collect();
    let (model, key) = translate(api, &q.model_name, &names);
    let found = match model {
        Some(model) => tiers(api, conn, model, key).await?,
        None => Vec::new(),
    };
    Ok((matches(&found, &partition.pods), partition.block_size))
}

/// Our key of Dynamo's block hashes `names`, and the model it is of: the
/// partition's own, or an adapter's (Dynamo's hashes carry the adapter in
/// their seed; its blocks are a model of their own here).
fn translate(api: &Api, model: &str, names: &[u64]) -> (Option<String>, Vec<u64>) {
    let reader = api.handler.index.reader();
    let Some(&first) = names.first() else {
        return (None, Vec::new());
    };
    let key = reader.translate(model, names);
    if !key.is_empty() {
        return (Some(model.into()), key);
    }
    for other in reader.alias_models(first) {
        let key = reader.translate(other, names);
        if !key.is_empty() {
            return (Some(other.into()), key);
        }
    }
    (None, Vec::new())
}

async fn query_by_hash(
    State(d): State<Arc<Dynamo>>,
    Extension(conn): Extension<Arc<Conn>>,
    Parsed(q): Parsed<wire::QueryByHash>,
) -> Result<Response, Refused> {
    let (m, _) = by_hash(&d, &conn, q).await?;
    let block_tokens = d.api.keys.block_tokens as u32;
    Ok(answer(200, wire::score_response(&m, block_tokens)))
}

async fn query_tiered_by_hash(
    State(d): State<Arc<Dynamo>>,
    Extension(conn): Extension<Arc<Conn>>,
    Parsed(q): Parsed<wire::QueryByHash>,
) -> Result<Response, Refused> {
    let (m, block_size) = by_hash(&d, &conn, q).await?;
    let ours = (block_size / (d.api.keys.block_tokens as u32).max(1)).max(1);
    Ok(answer(200, wire::tiered_response(&m, block_size, ours)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_ranks_and_their_pods_name_each_other() {
        for (group, instance, rank, pod) in [
            ("default", "7", 0, "7/0"),
            ("default", "vllm-prefill-node1", 3, "vllm-prefill-node1/3"),
            ("acme", "7", 1, "acme/7/1"),
            ("a/b", "7", 1, "a/b/7/1"),
        ] {
            let w = Worker {
                group: group.into(),
                instance: instance.into(),
                rank,
            };
            assert_eq!(w.pod(), pod);
            assert_eq!(Worker::of_pod(pod), Some(w));
        }
        for pod in ["vllm-0", "7/x", "7/01", "/0", "7/", "a//0"] {
            assert_eq!(Worker::of_pod(pod), None, "{pod}");
        }
    }
}
