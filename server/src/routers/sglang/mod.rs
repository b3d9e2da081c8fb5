//! SGLang's external KV indexer service (gRPC `kv_indexer.v1.KVIndexer`,
//! `server/proto/kv_indexer.proto`), served on the HTTP listener over
//! HTTP/2: what SGLang's experimental router calls with
//! `--kv-indexer-endpoint`, and its per-worker bridge writes to.
//!
//! - **Writes** (`ApplyExternalKvBatch`, a writer's): a worker's reports,
//!   revocations and clears of blocks at a tier, by SGLang's chained block
//!   hashes alone, are held as the worker's block sets (`Index::set_hold`)
//!   under the model [`SET_MODEL`]: one set per tier and component kind
//!   (`sets`). Its address (the router's URL of it), cache spec and block
//!   size are kept beside, from its latest batch (`workers`).
//! - **Prefix queries** (`MatchExternalKvPrefix`): each worker holding the
//!   first hash, with the run of leading hashes its sets hold, by its
//!   cache spec's rules when it has one (`prefix`). With
//!   `--block-aliases engine`, pods followed through SGLang's own events
//!   answer too, their engine hashes translated into our keys; their pod
//!   name is their address.
//! - `MatchExternalKv` and `GetExternalKvHitCounts`: which workers hold
//!   which hashes, and how often a counting match found each.
//!
//! Statuses are the ones the router and the bridge act on: what the index
//! cannot answer now (a cold replica, a full index) is `UNAVAILABLE` or
//! `RESOURCE_EXHAUSTED`, on which the router falls back to the least
//! loaded worker and the bridge reconnects; a request that is wrong is
//! `INVALID_ARGUMENT`, a client without the role `PERMISSION_DENIED`
//! (the bridge stops on both: they do not heal).

use std::sync::Arc;

use axum::Router;
use tonic::{Request, Response, Status};

use crate::access::Access;
use crate::api::{run_job, Api, Conn, NotRun};

mod hits;
mod prefix;
mod sets;
mod workers;

/// The code generated from `server/proto/kv_indexer.proto`.
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod pb {
    tonic::include_proto!("kv_indexer.v1");
}

use pb::kv_indexer_server::{KvIndexer, KvIndexerServer};
use pb::*;

/// The model the bridges' block sets are held under: the router's hashes
/// name no model.
pub const SET_MODEL: &str = "kv_indexer.v1";

/// The service, on the API's state.
#[derive(Clone)]
pub struct Service {
    api: Arc<Api>,
    workers: Arc<workers::Workers>,
    hits: Arc<hits::Hits>,
}

/// The service's routes (every method of `kv_indexer.v1.KVIndexer`). A
/// message over `--http-max-body-bytes` is refused `OUT_OF_RANGE` before
/// it is decoded.
pub fn router(api: Arc<Api>) -> Router {
    let max = api.max_body;
    let service = KvIndexerServer::new(Service {
        api,
        workers: Arc::default(),
        hits: Arc::default(),
    })
    .max_decoding_message_size(max);
    let path = format!("/{}/{{*method}}", pb::kv_indexer_server::SERVICE_NAME);
    Router::new().route_service(&path, service)
}

/// The client's connection, as the HTTP listener's layer put it in the
/// request; its access, as its TLS handshake named it.
fn conn<T>(request: &Request<T>) -> Result<Arc<Conn>, Status> {
    request
        .extensions()
        .get::<Arc<Conn>>()
        .cloned()
        .ok_or_else(|| Status::internal("the request came on no connection of the API"))
}

/// Refuses a write to a client without the writer's role.
fn may_write(access: &Access) -> Result<(), Status> {
    match access {
        Access::Write => Ok(()),
        Access::Denied(who) => Err(Status::permission_denied(format!(
            "{who} has no role on this server (see --reader, --writer and --peer-identity)"
        ))),
        _ => Err(Status::permission_denied(
            "this client's certificate may not change the index: it needs the writer's role",
        )),
    }
}

/// Refuses a read to a client with no role.
fn may_read(access: &Access) -> Result<(), Status> {
    match access {
        Access::Denied(who) => Err(Status::permission_denied(format!(
            "{who} has no role on this server (see --reader, --writer and --peer-identity)"
        ))),
        _ => Ok(()),
    }
}

/// Refuses while the server fills itself from a peer: it has no answers
/// of its own yet, and writes now would be lost to the fill.
fn filled(api: &Api) -> Result<(), Status> {
    match api.handler.replica.is_filling() {
        true => Err(Status::unavailable(
            "this replica is filling itself from a peer: ask another replica",
        )),
        false => Ok(()),
    }
}

/// Runs `f`, work over `blocks` blocks, for `conn` as the API runs any
/// request ([`run_job`]): here when it is light, otherwise on the blocking
/// pool.
async fn run<T: Send + 'static>(
    api: &Api,
    conn: &Conn,
    blocks: usize,
    f: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, Status> {
    let heavy = blocks > api.handler.inline_blocks;
    match run_job(conn, heavy, f).await {
        Ok(done) => done,
        Err(NotRun::ShuttingDown) => Err(Status::unavailable("the server is shutting down")),
        Err(NotRun::Failed) => Err(Status::internal("the request failed")),
    }
}

impl Service {
    /// Serves one call: the client's role checked by `may`, the request
    /// checked by `check` (which says how many blocks of work it is), then
    /// `f` run as [`run`] runs work, once this replica has its answers.
    async fn serve<Q: Send + 'static, T: Send + 'static>(
        &self,
        request: Request<Q>,
        may: fn(&Access) -> Result<(), Status>,
        check: impl FnOnce(&Q) -> Result<usize, Status>,
        f: impl FnOnce(&Service, Q) -> Result<T, Status> + Send + 'static,
    ) -> Result<Response<T>, Status> {
        let conn = conn(&request)?;
        may(&conn.access)?;
        let q = request.into_inner();
        let blocks = check(&q)?;
        let me = self.clone();
        let answer = run(&self.api, &conn, blocks, move || {
            filled(&me.api)?;
            f(&me, q)
        })
        .await?;
        Ok(Response::new(answer))
    }

    /// Checks a query's hashes (see [`sets::check_query`]); they are its
    /// blocks of work.
    fn query_blocks(&self, hashes: &[i64]) -> Result<usize, Status> {
        sets::check_query(hashes, self.api.handler.limits.max_key_blocks)?;
        Ok(hashes.len())
    }
}

#[tonic::async_trait]
impl KvIndexer for Service {
    async fn apply_external_kv_batch(
        &self,
        request: Request<ApplyExternalKvBatchRequest>,
    ) -> Result<Response<ApplyExternalKvBatchResponse>, Status> {
        let l = &self.api.handler.limits;
        let limits = sets::Limits {
            actions: l.max_batch,
            hashes: l.max_key_blocks,
            name: l.max_name_len,
        };
        let check = |batch: &ApplyExternalKvBatchRequest| {
            sets::check(batch, &limits)?;
            Ok(batch.actions.iter().map(|a| a.hashes.len().max(1)).sum())
        };
        self.serve(request, may_write, check, |me, batch| {
            me.workers.update(&batch);
            sets::apply(&me.api.handler.index, &batch, &me.hits)?;
            Ok(ApplyExternalKvBatchResponse {})
        })
        .await
    }

    async fn match_external_kv(
        &self,
        request: Request<MatchExternalKvRequest>,
    ) -> Result<Response<MatchExternalKvResponse>, Status> {
        let check = |q: &MatchExternalKvRequest| self.query_blocks(&q.hashes);
        self.serve(request, may_read, check, |me, q| {
            let workers = me.workers.get();
            let index = &me.api.handler.index;
            Ok(prefix::match_all(index, &workers, &me.hits, &q))
        })
        .await
    }

    async fn match_external_kv_prefix(
        &self,
        request: Request<MatchExternalKvPrefixRequest>,
    ) -> Result<Response<MatchExternalKvPrefixResponse>, Status> {
        let check = |q: &MatchExternalKvPrefixRequest| match q.hashes.len() {
            0 => Err(Status::invalid_argument("hashes must not be empty")),
            n => Ok(n),
        };
        self.serve(request, may_read, check, |me, q| {
            let workers = me.workers.get();
            let engines = me.api.handler.engines.as_ref();
            let by_engine = engines
                .is_some_and(|e| e.config().block_aliases == crate::engines::BlockAliases::Engine);
            let index = &me.api.handler.index;
            Ok(prefix::match_prefix(index, &workers, by_engine, &q))
        })
        .await
    }

    async fn get_external_kv_hit_counts(
        &self,
        request: Request<GetExternalKvHitCountsRequest>,
    ) -> Result<Response<GetExternalKvHitCountsResponse>, Status> {
        let check = |q: &GetExternalKvHitCountsRequest| self.query_blocks(&q.hashes);
        self.serve(request, may_read, check, |me, q| {
            let entries = me.hits.counts(&me.api.handler.index, &q.hashes);
            Ok(GetExternalKvHitCountsResponse { entries })
        })
        .await
    }
}
