//! `prefix-server`: the QUIC service that shares one [`prefix_index::Index`]
//! among many gateway replicas.
//!
//! Its modules are private; what other crates use is re-exported here: the
//! [`Server`] and its [`config`] ([`ServerConfig`], [`Settings`]), the
//! [`Service`] a server answers with, the index's [`Handler`], and what the
//! load tester, the benches and the tests drive directly ([`Engines`],
//! [`apply_batch`], [`Replica`], [`Metrics`], [`BusyPoll`], snapshots).
//!
//! - `config`: flags, environment and TOML into a [`ServerConfig`], each
//!   subsystem's settings in its own file.
//! - `handler`: the index's [`Service`], without I/O (requests in, answer
//!   frames out); `service`: what the stream layer asks of whatever answers
//!   requests.
//! - `stream`: the async glue moving bytes between QUIC streams and a
//!   service: framing (with `prefix-proto`'s `FrameReader`), heavy frames,
//!   back-pressure, drain.
//! - `maintenance`: the sweep task (TTL, capacities, freeing memory);
//!   `clock`: the time the server gives the index.
//! - `api`: the HTTP/JSON API, the same operations for gateways without
//!   QUIC (off unless `--http-listen` is set).
//! - `metrics` and `http`: Prometheus `/metrics`, `/healthz`, `/readyz`.
//! - `tls`: the certificate (given or self-signed) and mutual TLS;
//!   `access`: roles of client certificates (readers and writers).
//! - `busy_poll`: optional spinning workers, for latency on machines where
//!   waking a thread is slow.
//! - `snapshot`: the index saved to the data directory and restored;
//!   `files`: files of the data directory set aside.
//! - `replica`: the gate of a replica filling itself, the snapshot it
//!   sends and the writes it keeps for peers; `bootstrap`: a cold replica
//!   filled from a live peer's snapshot and tail; `repair`: replicas
//!   copying from each other what one lacks.
//! - `engines`: precise mode, following engines' KV-cache events over
//!   ZeroMQ (their codec is the `prefix-events` crate).
//!
//! [`Server::bind`] opens the sockets (tests bind `127.0.0.1:0` and read the
//! ports back); [`Server::run`] serves until the shutdown future resolves,
//! then stops accepting, finishes the requests in flight and returns.
//! [`Server::serve`] does the same with another [`Service`] in the index's
//! place (the load tester's echo baseline).
//!
//! ```no_run
//! # async fn f() -> anyhow::Result<()> {
//! use prefix_server::{Server, ServerConfig};
//! let server = Server::bind(ServerConfig::default()).await?;
//! println!("serving on {}", server.local_addr());
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await?;
//! # Ok(()) }
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prefix_index::Index;
use thiserror::Error;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod access;
mod allocator;
mod api;
mod bootstrap;
mod busy_poll;
mod clock;
pub mod config;
mod descriptors;
mod engines;
mod files;
mod handler;
mod http;
mod linger;
mod maintenance;
mod memory;
mod metrics;
mod repair;
mod replica;
pub mod routers;
mod service;
pub mod snapshot;
mod stream;
mod tls;

pub use access::Access;
pub use allocator::Allocator;
pub use api::{http_status, route, BATCH_PATH};
pub use busy_poll::BusyPoll;
pub use clock::now_ms;
pub use config::{ServerConfig, Settings};
pub use descriptors::{open_files_needed, raise_open_files, Needs, OpenFiles};
pub use engines::alias::dynamo_seed;
pub use engines::apply::apply_batch;
pub use engines::{
    engine_spec, BlockAliases, EngineAllow, EngineRefusal, EngineStatus, Engines, Subscription,
    ENGINE_ZMQ_THREADS,
};
pub use handler::Handler;
pub use http::PROBE_PATHS;
pub use metrics::Metrics;
pub use replica::{FillReport, Refusal, Replica};
pub use service::{Service, SnapshotJob};

/// Why the server could not start or stopped abnormally.
#[derive(Debug, Error)]
pub enum ServerError {
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// TLS could not be set up.
    #[error(transparent)]
    Tls(#[from] tls::ServerTlsError),
    /// Precise mode could not start (a subscription, the collector's socket).
    #[error(transparent)]
    Engines(#[from] engines::StartError),
    /// The open-file limit cannot be raised to what `--max-engines` needs.
    #[error("the open-file limit is {limit}, and --max-engines {max_engines} needs {required}: raise the hard limit (ulimit -Hn, systemd's LimitNOFILE=, a container's nofile ulimit) or lower --max-engines")]
    OpenFiles {
        /// The soft limit, raised as far as the hard limit allows.
        limit: u64,
        /// What `--max-engines` and `--max-engine-replays` need.
        required: u64,
        /// The setting.
        max_engines: usize,
    },
    /// A socket could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A bound, not yet running server.
pub struct Server {
    cfg: ServerConfig,
    endpoint: quinn::Endpoint,
    http: Option<tokio::net::TcpListener>,
    /// The HTTP/JSON API's socket and TLS, if it is on.
    api: Option<(tokio::net::TcpListener, Option<Arc<rustls::ServerConfig>>)>,
    index: Arc<Index>,
    metrics: Arc<Metrics>,
    /// The snapshot period, unless snapshots are off (by config, or because
    /// an unreadable snapshot is in the way).
    snapshots: Option<Duration>,
    /// What a cold start fills itself with from a peer, until it runs.
    filling: Option<bootstrap::Filling>,
    /// The replica gate: closed while filling.
    replica: Arc<Replica>,
    /// Engine subscriptions (precise mode), started at bind time (or once
    /// filled from a peer).
    engines: Arc<engines::Engines>,
    /// Stops everything the server started.
    token: CancellationToken,
}

impl Server {
    /// Validates the configuration, sets up TLS and binds the QUIC and HTTP
    /// sockets. Needs a tokio runtime.
    pub async fn bind(cfg: ServerConfig) -> Result<Server, ServerError> {
        cfg.validate()?;
        let tls = tls::rustls_config(&cfg)?;
        let api_tls = (!cfg.transport.http_plaintext).then(|| Arc::new(api::http_tls(tls.clone())));
        let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls).map_err(|e| {
            tls::ServerTlsError::from(prefix_client::pem::TlsError::Quic(e.to_string()))
        })?;
        let mut server_config = quinn::ServerConfig::with_crypto(Arc::new(quic));
        let mut transport = quinn::TransportConfig::default();
        transport
            .max_concurrent_bidi_streams(cfg.transport.max_streams.into())
            .max_concurrent_uni_streams(0u32.into())
            .max_idle_timeout(cfg.transport.idle_timeout.try_into().ok())
            .receive_window(cfg.transport.connection_window.into())
            .stream_receive_window(cfg.transport.connection_window.min(1 << 20).into());
        server_config.transport_config(Arc::new(transport));
        let bind_err = |addr| move |source| ServerError::Bind { addr, source };
        let socket = std::net::UdpSocket::bind(cfg.transport.listen)
            .map_err(bind_err(cfg.transport.listen))?;
        let endpoint = quinn::Endpoint::new(
            tls::endpoint_config(&cfg)?,
            Some(server_config),
            socket,
            Arc::new(quinn::TokioRuntime),
        )
        .map_err(bind_err(cfg.transport.listen))?;
        let http = match cfg.transport.metrics_listen {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(bind_err(addr))?,
            ),
            None => None,
        };
        let api = match cfg.transport.http_listen {
            Some(addr) => Some((
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(bind_err(addr))?,
                api_tls,
            )),
            None => None,
        };
        let index = Arc::new(Index::new(cfg.index.clone()));
        let metrics = Arc::<Metrics>::default();
        let (snapshots, filling) = restore_or_plan(&cfg, &index, &metrics).await?;
        let token = CancellationToken::new();
        // Run-time subscriptions outlive a restart as the snapshot does.
        let kept = cfg
            .upkeep
            .snapshot_interval
            .map(|_| cfg.data_dir.join(engines::kept::FILE));
        let held = descriptors::held(&cfg);
        let engines = engines::Engines::new(
            index.clone(),
            cfg.engines.clone(),
            token.clone(),
            kept,
            held,
        )?;
        // After the restore, so that engine events find their parents in the
        // restored records: now, or once filled from a peer.
        if filling.is_none() {
            if let Err(e) = engines.start() {
                token.cancel();
                engines.join();
                return Err(e.into());
            }
        }
        metrics.watch_engines(&engines);
        let own = filling.as_ref().map(|f| f.fallback.is_some());
        let replica = Replica::new(&cfg.replicas, &cfg.index, own);
        Ok(Server {
            index,
            metrics,
            snapshots,
            filling,
            replica,
            cfg,
            endpoint,
            http,
            api,
            engines,
            token,
        })
    }

    /// The replica gate (tests read how a fill went).
    pub fn replica(&self) -> &Arc<Replica> {
        &self.replica
    }

    /// The index's request handler.
    fn handler(&self) -> Arc<Handler> {
        Arc::new(Handler {
            index: self.index.clone(),
            limits: self.cfg.wire_limits(),
            metrics: self.metrics.clone(),
            inline_blocks: self.cfg.limits.inline_blocks,
            engines: Some(self.engines.clone()),
            replica: self.replica.clone(),
        })
    }

    /// The engine subscriptions (tests read their state directly).
    pub fn engines(&self) -> &Arc<engines::Engines> {
        &self.engines
    }

    /// The QUIC address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        // The socket was bound by `bind`; reading its address back only fails
        // if the OS has lost it, in which case report the configured one.
        self.endpoint
            .local_addr()
            .unwrap_or(self.cfg.transport.listen)
    }

    /// The HTTP address actually bound, if any.
    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The HTTP/JSON API's address actually bound, if it is on.
    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.api.as_ref().and_then(|(l, _)| l.local_addr().ok())
    }

    /// The server's metrics (tests read them directly).
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.metrics
    }

    /// The index being served (tests and embedding read it directly).
    pub fn index(&self) -> &Arc<Index> {
        &self.index
    }

    /// Serves the index until `shutdown` resolves; then stops accepting
    /// connections, answers the requests already received (for up to
    /// `drain_timeout`), closes every connection and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
        let handler = self.handler();
        self.serve_with(handler.clone(), Some(handler), shutdown)
            .await
    }

    /// As [`Server::run`], with `service` answering the requests: the same
    /// transport, framing, drain and busy polling, and the same maintenance
    /// of the (then unused) index.
    pub async fn serve<S: Service>(
        self,
        service: Arc<S>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServerError> {
        self.serve_with(service, None, shutdown).await
    }

    /// As [`Server::serve`], with the HTTP/JSON API answered by `api` (the
    /// API needs the index's handler: a stand-in service has none).
    ///
    /// Every subsystem starts on one [`Tasks`]: the shutdown cancels its
    /// token, waits for its tracker through the drain, then cuts what
    /// outlived the drain.
    async fn serve_with<S: Service>(
        mut self,
        service: Arc<S>,
        api: Option<Arc<Handler>>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ServerError> {
        let tasks = Tasks {
            tracker: TaskTracker::new(),
            stop: self.token.clone(),
            hard: CancellationToken::new(),
        };
        let ready = Arc::new(AtomicBool::new(self.filling.is_none()));
        self.start_fill(&tasks, &ready, api.clone());
        self.start_repair(&tasks, api.clone());
        let busy = self.start_busy_poll(&tasks);
        self.start_maintenance(&tasks);
        self.start_snapshots(&tasks);
        self.start_probes(&tasks, &ready);
        self.start_api(&tasks, &ready, api);
        tasks
            .tracker
            .spawn(engines::dns::run(self.engines.clone(), tasks.stop.clone()));
        tracing::info!(
            listen = %self.endpoint.local_addr().map_or_else(|_| "?".into(), |a| a.to_string()),
            "serving"
        );
        let setup = Arc::new(stream::ConnSetup {
            service,
            roles: self.cfg.roles.clone(),
            max_in_flight: self.cfg.limits.max_in_flight,
            max_streams: self.cfg.transport.max_streams,
            busy,
            snapshots: stream::SnapshotSending {
                timeout: self.cfg.replicas.send_timeout,
                piece_bytes: self.cfg.replicas.send_piece_bytes,
                pieces: self.cfg.replicas.send_pieces,
            },
            read_timeout: self.cfg.transport.read_timeout,
            write_timeout: self.cfg.transport.write_timeout,
        });
        let accept = accept_loop(
            &self.endpoint,
            &self.cfg,
            setup,
            self.metrics.clone(),
            tasks.stop.clone(),
            tasks.tracker.clone(),
        );
        tokio::pin!(shutdown);
        tokio::select! {
            _ = &mut shutdown => {}
            _ = accept => {}
        }
        self.stop(tasks, &ready).await;
        Ok(())
    }

    /// Stops what [`Server::serve_with`] started: no new connections, the
    /// requests in flight answered (for up to `drain_timeout`), every
    /// connection closed, the engines joined, the last snapshot written.
    async fn stop(self, tasks: Tasks, ready: &AtomicBool) {
        tracing::info!("shutting down: draining requests in flight");
        // Relaxed: see `http::readyz`.
        ready.store(false, Ordering::Relaxed);
        self.endpoint.set_server_config(None);
        tasks.stop.cancel();
        tasks.tracker.close();
        if tokio::time::timeout(self.cfg.transport.drain_timeout, tasks.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(timeout = ?self.cfg.transport.drain_timeout, "drain timed out; closing anyway");
        }
        // Past the drain, nothing more reaches the index before the
        // snapshot: the HTTP listeners' connections go (QUIC's just below).
        tasks.hard.cancel();
        self.endpoint.close(0u32.into(), stream::SHUTDOWN_REASON);
        let _ =
            tokio::time::timeout(self.cfg.transport.close_timeout, self.endpoint.wait_idle()).await;
        // The token stopped the engine threads; each notices within its
        // poll period. Joined before the snapshot, so it has every event.
        let engines = self.engines.clone();
        let _ = tokio::task::spawn_blocking(move || engines.join()).await;
        if self.snapshots.is_some() && !self.replica.is_filling() {
            // Every answered insert is in it: the drain is over. (A server
            // stopped while still filling keeps the snapshot it had.)
            snapshot::save_and_report(self.index.clone(), self.cfg.data_dir.clone(), &self.metrics)
                .await;
        }
        if tokio::time::timeout(self.cfg.transport.close_timeout, tasks.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!("tasks still running after the drain; stopping anyway");
        }
        tracing::info!("stopped");
    }

    /// Fills a cold replica from its peers, if it is one.
    fn start_fill(&mut self, tasks: &Tasks, ready: &Arc<AtomicBool>, api: Option<Arc<Handler>>) {
        let Some(filling) = self.filling.take() else {
            return;
        };
        let target = bootstrap::Target {
            handler: api.unwrap_or_else(|| self.handler()),
            engines: self.engines.clone(),
            metrics: self.metrics.clone(),
            ready: ready.clone(),
            tasks: tasks.tracker.clone(),
        };
        tasks
            .tracker
            .spawn(bootstrap::fill(filling, target, tasks.stop.clone()));
    }

    /// Starts repairing from the peers, if there are any and repair is on.
    fn start_repair(&self, tasks: &Tasks, api: Option<Arc<Handler>>) {
        let cfg = &self.cfg.replicas;
        if cfg.peers.is_empty() || cfg.repair_budget == 0 {
            return;
        }
        let tls = match tls::peer_tls(&self.cfg) {
            Ok(tls) => tls,
            Err(e) => {
                tracing::error!(error = %e, "repair is off: no TLS configuration for the peers");
                return;
            }
        };
        tasks.tracker.spawn(repair::run(
            cfg.clone(),
            tls,
            api.unwrap_or_else(|| self.handler()),
            tasks.stop.clone(),
        ));
    }

    /// Starts the busy-polling spinners, if they are on.
    fn start_busy_poll(&self, tasks: &Tasks) -> Option<Arc<busy_poll::BusyPoll>> {
        self.cfg.transport.busy_poll.map(|window| {
            let busy = busy_poll::BusyPoll::with_gauge(window, self.metrics.busy_spinners.clone());
            busy.start(&tasks.tracker, &tasks.stop);
            busy
        })
    }

    /// Starts the sweep.
    fn start_maintenance(&self, tasks: &Tasks) {
        tasks.tracker.spawn(maintenance::run(
            self.index.clone(),
            self.metrics.clone(),
            self.cfg.upkeep.sweep_interval,
            self.cfg.upkeep.sweep_budget,
            tasks.stop.clone(),
        ));
    }

    /// Starts writing snapshots, if they are on.
    fn start_snapshots(&self, tasks: &Tasks) {
        let Some(every) = self.snapshots else {
            return;
        };
        tasks.tracker.spawn(snapshot::run(
            self.index.clone(),
            self.replica.clone(),
            self.cfg.data_dir.clone(),
            self.metrics.clone(),
            every,
            tasks.stop.clone(),
        ));
    }

    /// What the probes read; `detail`: whether `/readyz` names the
    /// engines not connected.
    fn probe(&self, tasks: &Tasks, ready: &Arc<AtomicBool>, detail: bool) -> http::Probe {
        http::Probe {
            index: self.index.clone(),
            metrics: self.metrics.clone(),
            ready: ready.clone(),
            stopping: tasks.stop.clone(),
            detail,
        }
    }

    /// Serves `/metrics`, `/healthz` and `/readyz`, if they are on: they
    /// stop taking connections at the shutdown and close the ones left
    /// once the drain is over (a peer that sent half a request would keep
    /// a graceful shutdown waiting).
    fn start_probes(&mut self, tasks: &Tasks, ready: &Arc<AtomicBool>) {
        let Some(listener) = self.http.take() else {
            return;
        };
        // The metrics listener shows every pod already.
        let app = http::router(self.probe(tasks, ready, true));
        let (stop, hard) = (tasks.stop.clone(), tasks.hard.clone());
        tasks.tracker.spawn(async move {
            let served = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned());
            tokio::select! {
                served = served => {
                    if let Err(e) = served {
                        tracing::error!(error = %e, "metrics listener failed");
                    }
                }
                () = hard.cancelled() => {}
            }
        });
    }

    /// Serves the HTTP/JSON API, if it is on and there is an index to
    /// answer it.
    fn start_api(&mut self, tasks: &Tasks, ready: &Arc<AtomicBool>, api: Option<Arc<Handler>>) {
        let (Some((socket, tls)), Some(handler)) = (self.api.take(), api) else {
            return;
        };
        let keys = prefix_proto::json::KeyOptions {
            block_tokens: self.cfg.engines.token_block as usize,
            ..Default::default()
        };
        let api = Arc::new(api::Api {
            handler,
            keys,
            max_body: self.cfg.limits.http_max_body_bytes,
            read_timeout: self.cfg.transport.read_timeout,
        });
        let app = api::router(api.clone())
            .merge(routers::router(api))
            // A client of the API may not be one allowed to list engines.
            .merge(http::probes(self.probe(tasks, ready, false)));
        let addr = socket
            .local_addr()
            .map_or_else(|_| "?".into(), |a| a.to_string());
        if tls.is_none() {
            tracing::warn!(
                http = %addr,
                "the HTTP/JSON API is PLAIN HTTP (--http-plaintext): no encryption and no client \
                 identities; every client that reaches this port may read and write"
            );
        }
        tracing::info!(http = %addr, "serving the HTTP/JSON API");
        let listener = api::Listener {
            tls,
            roles: self.cfg.roles.clone(),
            max_connections: self.cfg.transport.max_connections,
            max_streams: self.cfg.transport.max_streams,
            max_in_flight: self.cfg.limits.max_in_flight,
            idle_timeout: self.cfg.transport.idle_timeout,
            read_timeout: self.cfg.transport.read_timeout,
            write_timeout: self.cfg.transport.write_timeout,
            max_body: self.cfg.limits.http_max_body_bytes,
            metrics: self.metrics.clone(),
        };
        tasks.tracker.spawn(api::serve(
            socket,
            listener,
            app,
            tasks.stop.clone(),
            tasks.hard.clone(),
            tasks.tracker.clone(),
        ));
    }
}

/// What every task the server starts is spawned on.
struct Tasks {
    /// What the shutdown waits for.
    tracker: TaskTracker,
    /// Cancelled at the shutdown: stop taking work, finish what is in
    /// flight.
    stop: CancellationToken,
    /// Cancelled once the drain is over: drop the connections left.
    hard: CancellationToken,
}

/// Restores the server's own snapshot, or, for a cold start with peers,
/// plans to fill from one (see [`bootstrap`]): the snapshot period (none
/// when snapshots are off or an unreadable snapshot is in the way) and the
/// plan.
async fn restore_or_plan(
    cfg: &ServerConfig,
    index: &Arc<Index>,
    metrics: &Arc<Metrics>,
) -> Result<(Option<Duration>, Option<bootstrap::Filling>), ServerError> {
    let Some(every) = cfg.upkeep.snapshot_interval else {
        return Ok((None, plan(cfg, None)?));
    };
    let started = std::time::Instant::now();
    // Reading and replaying a large snapshot takes seconds: keep it off the
    // async workers.
    let dir = cfg.data_dir.clone();
    let found = match tokio::task::spawn_blocking(move || snapshot::find(&dir, now_ms())).await {
        Ok(found) => found,
        Err(e) => {
            tracing::error!(error = %e, "reading the snapshot failed; snapshots are off");
            return Ok((None, plan(cfg, None)?));
        }
    };
    let stale = match &found {
        snapshot::Found::Parsed { age, .. } => *age > cfg.replicas.max_age,
        _ => true,
    };
    if cfg.replicas.peers.is_empty() || !stale {
        let (i, m, dir) = (index.clone(), metrics.clone(), cfg.data_dir.clone());
        let restored = tokio::task::spawn_blocking(move || {
            let loaded = found.restore(&i, now_ms());
            snapshot::report(loaded, &dir, started, &m)
        });
        return match restored.await {
            Ok(may_save) => Ok((may_save.then_some(every), None)),
            Err(e) => {
                tracing::error!(error = %e, "restoring the snapshot failed; snapshots are off");
                Ok((None, None))
            }
        };
    }
    let (fallback, may_save) = match found {
        snapshot::Found::Parsed { snapshot, age } => {
            tracing::info!(age = ?age, max_age = ?cfg.replicas.max_age, "the snapshot is too old to start from: filling from a peer");
            (Some(snapshot), true)
        }
        snapshot::Found::Missing => {
            tracing::info!("no snapshot: filling from a peer");
            (None, true)
        }
        snapshot::Found::SetAside { error, moved_to } => {
            let loaded = snapshot::Loaded::SetAside { error, moved_to };
            (
                None,
                snapshot::report(loaded, &cfg.data_dir, started, metrics),
            )
        }
    };
    Ok((may_save.then_some(every), plan(cfg, fallback)?))
}

/// What filling from a peer needs, if the server has peers.
fn plan(
    cfg: &ServerConfig,
    fallback: Option<prefix_index::Snapshot>,
) -> Result<Option<bootstrap::Filling>, ServerError> {
    if cfg.replicas.peers.is_empty() {
        return Ok(None);
    }
    Ok(Some(bootstrap::Filling {
        cfg: cfg.replicas.clone(),
        tls: tls::peer_tls(cfg)?,
        fallback,
    }))
}

/// Accepts connections until cancelled, refusing those over the limit.
async fn accept_loop<S: Service>(
    endpoint: &quinn::Endpoint,
    cfg: &ServerConfig,
    setup: Arc<stream::ConnSetup<S>>,
    metrics: Arc<Metrics>,
    token: CancellationToken,
    tracker: TaskTracker,
) {
    // One permit per connection, held by its task from the handshake on.
    let open = Arc::new(Semaphore::new(cfg.transport.max_connections));
    while let Some(incoming) = endpoint.accept().await {
        let Ok(permit) = open.clone().try_acquire_owned() else {
            metrics.connections_refused.inc();
            tracing::warn!(remote = %incoming.remote_address(), max = cfg.transport.max_connections, "refusing a connection: max-connections reached");
            incoming.refuse();
            continue;
        };
        let (setup, metrics, token, tracker2) = (
            setup.clone(),
            metrics.clone(),
            token.clone(),
            tracker.clone(),
        );
        tracker.spawn(async move {
            let _permit = permit;
            let conn = match incoming.await {
                Ok(c) => c,
                Err(e) => {
                    metrics.handshakes_failed.inc();
                    let reason = e.to_string();
                    match prefix_client::pem::explain_handshake(&reason) {
                        // A client certificate the operator made wrong: say
                        // so where the operator looks.
                        Some(why) => tracing::warn!(%reason, "a client's handshake failed: {why}"),
                        None => tracing::debug!(%reason, "handshake failed"),
                    }
                    return;
                }
            };
            metrics.connections_accepted.inc();
            metrics.connections.inc();
            stream::serve_connection(conn, &setup, token, tracker2).await;
            metrics.connections.dec();
        });
    }
}

/// Binds and serves until `shutdown` (the entry point of the binary),
/// first raising the open-file limit to what `cfg` may use.
pub async fn run(cfg: ServerConfig, shutdown: impl Future<Output = ()>) -> Result<(), ServerError> {
    let needs = descriptors::open_files_needed(&cfg);
    match descriptors::raise_open_files(needs.wanted) {
        Ok(r) if r.now < needs.required => {
            return Err(ServerError::OpenFiles {
                limit: r.now,
                required: needs.required,
                max_engines: cfg.engines.max_engines,
            })
        }
        Ok(r) if !r.is_enough() => tracing::warn!(
            limit = r.now,
            wanted = r.needed,
            "the open-file limit covers --max-engines engines at an address, not everything --max-connections (with --http-listen) and engines named by host name may use: lower them, or raise the hard limit (ulimit -Hn, LimitNOFILE=)"
        ),
        Ok(r) if r.now > r.before => tracing::info!(from = r.before, to = r.now, "raised the open-file limit"),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    Server::bind(cfg).await?.run(shutdown).await
}
