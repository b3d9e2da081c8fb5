//! In-process servers for one-command runs: the real server, or a bare quinn
//! echo server that answers every request frame with a canned response of the
//! real server's size, so the transport can be measured without the index.
//!
//! Each runs on a runtime of its own, as it would in its own process: its
//! tasks never share a worker with the load generator's, and its threads
//! (all named [`SERVER_THREAD`]) can be told apart to measure its CPU time
//! (see [`crate::cpu`]).

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prefix_client::wire::{self, Limits, Reply, Request, MAX_FRAME_CEILING};
use prefix_client::TlsConfig;
use prefix_server::busy_poll::BusyPoll;
use prefix_server::{Server, ServerConfig};
use tokio::runtime::Runtime;
use tokio::sync::oneshot;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;

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
    // Dropped in this order: the stop signal starts the server's shutdown,
    // the echo server's spinners (if any) are told to stop, then the runtime
    // ends every task, then the directory goes.
    _stop: oneshot::Sender<()>,
    _spinners: Option<DropGuard>,
    _runtime: ServerRuntime,
    _dir: tempfile::TempDir,
}

impl Embedded {
    /// A server started on `runtime` whose certificate is in `dir`.
    fn new(
        addr: SocketAddr,
        runtime: ServerRuntime,
        stop: oneshot::Sender<()>,
        dir: tempfile::TempDir,
    ) -> anyhow::Result<Self> {
        let tls = TlsConfig::from_files(&dir.path().join("cert.pem"), None, None)?;
        Ok(Embedded {
            addr,
            tls,
            _stop: stop,
            _spinners: None,
            _runtime: runtime,
            _dir: dir,
        })
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
    ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        metrics_listen: None,
        data_dir: dir.path().into(),
        // Load tests may send the largest batches.
        max_frame_bytes: MAX_FRAME_CEILING,
        max_batch: 4096,
        // Nothing to keep: no snapshot work in the server's CPU time, and
        // none left writing into the directory when it is deleted.
        snapshot_interval: None,
        ..ServerConfig::default()
    }
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
    let rt = runtime(threads)?;
    let (stop, stopped) = oneshot::channel::<()>();
    // Bound inside its runtime, so the QUIC endpoint's driver runs there.
    let addr = rt
        .spawn(async move {
            let server = Server::bind(cfg)
                .await
                .context("starting the embedded server")?;
            let addr = server.local_addr();
            tokio::spawn(server.run(async move {
                let _ = stopped.await;
            }));
            anyhow::Ok(addr)
        })
        .await??;
    Embedded::new(addr, rt, stop, dir)
}

/// Appends the echo server's canned answer to `request`: per op, a lookup
/// reply listing `matches` or `Done`, the sizes the real server sends,
/// written the way the real server writes its lookup answers.
fn canned(id: u64, request: &Request, matches: &[(&str, u32)], out: &mut Vec<u8>) {
    let reply = |w: &mut wire::ResponseWriter<'_>, op: &wire::Op| match op {
        wire::Op::Lookup { .. } => w.lookup(32, matches),
        _ => w.reply(&Reply::Done),
    };
    let w = match request {
        Request::One(op) => {
            let mut w = wire::ResponseWriter::one(out, id);
            reply(&mut w, op);
            w
        }
        Request::Batch(ops) => {
            let mut w = wire::ResponseWriter::batch(out, id, ops.len());
            for op in ops {
                reply(&mut w, op);
            }
            w
        }
    };
    w.finish();
}

/// Starts a bare quinn echo server: same TLS, ALPN, framing and codec as the
/// real one, no index, on a runtime of its own with `threads` workers. Every
/// request frame is decoded and answered with [`canned`] replies naming
/// `pods` pods (`pod-0`, `pod-1`, ...). With `busy_poll`, it busy-polls as
/// the real server does.
pub async fn echo(
    threads: usize,
    pods: usize,
    busy_poll: Option<std::time::Duration>,
) -> anyhow::Result<Embedded> {
    let dir = tempfile::tempdir()?;
    let cfg = config(&dir);
    let tls = prefix_server::tls::rustls_config(&cfg)?;
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let rt = runtime(threads)?;
    let endpoint = {
        // Made inside its runtime, so the endpoint's driver runs there.
        let _inside = rt.enter();
        quinn::Endpoint::server(quinn::ServerConfig::with_crypto(Arc::new(quic)), cfg.listen)?
    };
    let addr = endpoint.local_addr()?;
    let (stop, mut stopped) = oneshot::channel::<()>();
    let stop_spinning = CancellationToken::new();
    let busy = busy_poll.map(|window| {
        let busy = BusyPoll::new(window);
        let _inside = rt.enter();
        busy.start(&TaskTracker::new(), &stop_spinning);
        busy
    });
    rt.spawn(async move {
        loop {
            let incoming = tokio::select! {
                _ = &mut stopped => break,
                i = endpoint.accept() => match i { Some(i) => i, None => break },
            };
            let busy = busy.clone();
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok((send, recv)) = conn.accept_bi().await {
                    tokio::spawn(echo_stream(send, recv, pods, busy.clone()));
                }
            });
        }
        endpoint.close(0u32.into(), b"done");
    });
    let mut echo = Embedded::new(addr, rt, stop, dir)?;
    echo._spinners = Some(stop_spinning.drop_guard());
    Ok(echo)
}

/// Reads frames the way the real server does (its [`Inbox`]) and refuses
/// bad ones the same way, so the two differ only in what they answer.
///
/// [`Inbox`]: prefix_server::handler::Inbox
async fn echo_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    pods: usize,
    busy: Option<Arc<BusyPoll>>,
) {
    use prefix_server::handler::{encode_error, Inbox, Next};
    let limits = Limits {
        max_frame_bytes: MAX_FRAME_CEILING,
        max_batch: usize::MAX,
        ..Limits::default()
    };
    let names: Vec<String> = (0..pods).map(|i| format!("pod-{i}")).collect();
    let matches: Vec<(&str, u32)> = (0..pods)
        .map(|i| (names[i].as_str(), 32u32.saturating_sub(i as u32)))
        .collect();
    let (mut inbox, mut out) = (Inbox::default(), Vec::new());
    while let Ok(Some(chunk)) = recv.read_chunk(256 << 10, true).await {
        if let Some(busy) = &busy {
            busy.touch();
        }
        inbox.push(&chunk.bytes);
        loop {
            match inbox.next(&limits) {
                Next::Request { id, request } => canned(id, &request, &matches, &mut out),
                Next::Refuse { id, error } => encode_error(id, &error, &mut out),
                Next::Fatal { id, error } => {
                    // The framing is lost: answer this one, end the stream.
                    encode_error(id, &error, &mut out);
                    let _ = send.write_all(&out).await;
                    let _ = recv.stop(u32::from(error.code() as u16).into());
                    return;
                }
                Next::Wait => break,
            }
        }
        if send.write_all(&out).await.is_err() {
            return;
        }
        out.clear();
    }
}
