//! In-process servers for one-command runs: the real server, or the echo
//! baseline, the real server with a service that answers every request frame
//! with a canned response of the real server's size, so the transport can be
//! measured without the index.
//!
//! Each runs on a runtime of its own, as it would in its own process: its
//! tasks never share a worker with the load generator's, and its threads
//! (all named [`SERVER_THREAD`]) can be told apart to measure its CPU time
//! (see [`crate::cpu`]).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prefix_client::TlsConfig;
use prefix_proto::{Limits, Op, Reply, Request, ResponseWriter, MAX_FRAME_CEILING};
use prefix_server::Access;
use prefix_server::Engines;
use prefix_server::{Server, ServerConfig, Service};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;

use crate::cpu::SERVER_THREAD;

/// The busy-polling window of in-process servers under `--busy-poll`:
/// longer than any pause of a closed or open loop. (A trace replayed at its
/// own pace can pause longer; the spinners then park, and the next frame
/// takes the sleeping path.)
pub const BUSY_POLL_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// A running in-process server; stops when dropped.
pub struct Embedded {
    /// Its QUIC address.
    pub addr: SocketAddr,
    /// TLS trusting its certificate.
    pub tls: TlsConfig,
    /// Its engine subscriptions (precise mode).
    pub engines: Arc<Engines>,
    /// Its HTTP/JSON API, if the config turned it on.
    pub api: Option<SocketAddr>,
    // Dropped in this order: the stop signal starts the server's shutdown,
    // then the runtime ends every task, then the directory goes.
    _stop: oneshot::Sender<()>,
    _runtime: ServerRuntime,
    _dir: tempfile::TempDir,
}

impl Embedded {
    /// A server started on `runtime` whose certificate is in `dir`.
    fn new(
        (addr, engines, api): (SocketAddr, Arc<Engines>, Option<SocketAddr>),
        runtime: ServerRuntime,
        stop: oneshot::Sender<()>,
        dir: tempfile::TempDir,
    ) -> anyhow::Result<Self> {
        let tls = TlsConfig::from_files(&dir.path().join("cert.pem"), None, None)?;
        Ok(Embedded {
            addr,
            tls,
            engines,
            api,
            _stop: stop,
            _runtime: runtime,
            _dir: dir,
        })
    }
}

impl Embedded {
    /// Its certificate, for clients other than `prefix-client`.
    pub fn ca_path(&self) -> std::path::PathBuf {
        self._dir.path().join("cert.pem")
    }
}

/// An in-process server's runtime. It is dropped inside the load
/// generator's runtime (also on an early error), where waiting for the
/// server's tasks to finish is not allowed, so it shuts down in the
/// background; nothing of a load test's server needs a graceful end (its
/// data directory is deleted next).
struct ServerRuntime(Option<Runtime>);

impl std::ops::Deref for ServerRuntime {
    type Target = Runtime;

    fn deref(&self) -> &Runtime {
        self.0.as_ref().expect("present until dropped")
    }
}

impl Drop for ServerRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// A runtime with `threads` workers for one in-process server.
fn runtime(threads: usize) -> anyhow::Result<ServerRuntime> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .thread_name(SERVER_THREAD)
        // Longer than any run: a blocking-pool thread that exits would take
        // its CPU time out of the server's count (see `crate::cpu`).
        .thread_keep_alive(std::time::Duration::from_secs(24 * 3600))
        .enable_all()
        .build()
        .context("starting the embedded server's runtime")?;
    Ok(ServerRuntime(Some(rt)))
}

fn config(dir: &tempfile::TempDir) -> ServerConfig {
    let mut cfg = ServerConfig {
        data_dir: dir.path().into(),
        ..ServerConfig::default()
    };
    cfg.transport.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    cfg.transport.metrics_listen = None;
    // Load tests may send the largest batches.
    cfg.limits.max_frame_bytes = MAX_FRAME_CEILING;
    cfg.limits.max_batch = 4096;
    // Nothing to keep: no snapshot work in the server's CPU time, and none
    // left writing into the directory when it is deleted.
    cfg.upkeep.snapshot_interval = None;
    cfg
}

/// Starts the real server on a free loopback port, on a runtime of its own
/// with `threads` workers.
pub async fn server(
    threads: usize,
    tweak: impl FnOnce(&mut ServerConfig),
) -> anyhow::Result<Embedded> {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(&dir);
    tweak(&mut cfg);
    launch(threads, cfg, dir, None).await
}

/// Binds a server with `cfg` on a runtime of its own and serves the index,
/// or `echo` in its place.
async fn launch(
    threads: usize,
    cfg: ServerConfig,
    dir: tempfile::TempDir,
    echo: Option<Arc<Echo>>,
) -> anyhow::Result<Embedded> {
    let rt = runtime(threads)?;
    let (stop, stopped) = oneshot::channel::<()>();
    // Bound inside its runtime, so the QUIC endpoint's driver runs there.
    let addr = rt
        .spawn(async move {
            let server = Server::bind(cfg)
                .await
                .context("starting the in-process server")?;
            let addr = (
                server.local_addr(),
                server.engines().clone(),
                server.api_addr(),
            );
            let stopped = async move {
                let _ = stopped.await;
            };
            match echo {
                Some(echo) => tokio::spawn(server.serve(echo, stopped)),
                None => tokio::spawn(server.run(stopped)),
            };
            anyhow::Ok(addr)
        })
        .await??;
    Embedded::new(addr, rt, stop, dir)
}

/// The echo baseline's [`Service`]: every request is answered with canned
/// replies of the real server's sizes, per op a lookup reply listing
/// `matches` or `Done`, written the way the real server writes its lookup
/// answers. Nothing is heavy: no request does any work.
struct Echo {
    /// (pod name, blocks) of every canned lookup answer.
    matches: Vec<(String, u32)>,
    limits: Limits,
}

impl Service for Echo {
    fn serve(&self, id: u64, request: &Request, _: &Access, out: &mut Vec<u8>) {
        let reply = |w: &mut ResponseWriter<'_>, op: &Op| match op {
            Op::Lookup { .. } => w.lookup(32, &self.matches),
            _ => w.reply(&Reply::Done),
        };
        let w = match request {
            Request::One(op) => {
                let mut w = ResponseWriter::one(out, id);
                reply(&mut w, op);
                w
            }
            Request::Batch(ops) => {
                let mut w = ResponseWriter::batch(out, id, ops.len());
                for op in ops {
                    reply(&mut w, op);
                }
                w
            }
        };
        w.finish();
    }

    fn is_heavy(&self, _: &Request) -> bool {
        false
    }

    fn refused(&self) {}

    fn limits(&self) -> &Limits {
        &self.limits
    }
}

/// Starts the echo baseline: the real server's endpoint, transport, TLS,
/// framing, stream handling and busy polling, with an [`Echo`] service in
/// the index's place, on a runtime of its own with `threads` workers. Every
/// request frame is decoded and answered with canned replies naming `pods`
/// pods (`pod-0`, `pod-1`, ...).
pub async fn echo(
    threads: usize,
    pods: usize,
    busy_poll: Option<std::time::Duration>,
) -> anyhow::Result<Embedded> {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(&dir);
    cfg.transport.busy_poll = busy_poll;
    let echo = Arc::new(Echo {
        matches: (0..pods)
            .map(|i| (format!("pod-{i}"), 32u32.saturating_sub(i as u32)))
            .collect(),
        limits: Limits {
            max_batch: usize::MAX,
            ..cfg.wire_limits()
        },
    });
    launch(threads, cfg, dir, Some(echo)).await
}
