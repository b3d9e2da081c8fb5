//! In-process servers for one-command runs: the real server, or a bare quinn
//! echo server that answers every request frame with a canned response of the
//! real server's size, so the transport can be measured without the index.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use prefix_client::wire::{self, Limits, PodBlocks, Reply, Request, Response, MAX_FRAME_CEILING};
use prefix_client::TlsConfig;
use prefix_server::{Server, ServerConfig};
use tokio::sync::oneshot;

/// A running in-process server; stops when dropped.
pub struct Embedded {
    /// Its QUIC address.
    pub addr: SocketAddr,
    /// TLS trusting its certificate.
    pub tls: TlsConfig,
    _stop: oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

impl Embedded {
    /// A started server whose certificate is in `dir`.
    fn new(
        addr: SocketAddr,
        stop: oneshot::Sender<()>,
        dir: tempfile::TempDir,
    ) -> anyhow::Result<Self> {
        let tls = TlsConfig::from_files(&dir.path().join("cert.pem"), None, None)?;
        Ok(Embedded {
            addr,
            tls,
            _stop: stop,
            _dir: dir,
        })
    }
}

fn config(dir: &tempfile::TempDir) -> ServerConfig {
    ServerConfig {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        metrics_listen: None,
        data_dir: dir.path().into(),
        // Load tests may send the largest batches.
        max_frame_bytes: MAX_FRAME_CEILING,
        max_batch: 4096,
        ..ServerConfig::default()
    }
}

/// Starts the real server on a free loopback port.
pub async fn server(tweak: impl FnOnce(&mut ServerConfig)) -> anyhow::Result<Embedded> {
    let dir = tempfile::tempdir()?;
    let mut cfg = config(&dir);
    tweak(&mut cfg);
    let server = Server::bind(cfg)
        .await
        .context("starting the embedded server")?;
    let addr = server.local_addr();
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    Embedded::new(addr, stop, dir)
}

/// The canned answer of the echo server: a lookup reply listing `pods` pods,
/// or `Done`, per op, the sizes the real server sends.
fn canned(request: &Request, pods: usize) -> Response {
    let lookup = || Reply::Lookup {
        key_blocks: 32,
        matches: (0..pods)
            .map(|i| PodBlocks {
                pod: format!("pod-{i}").into(),
                blocks: 32 - i as u32,
            })
            .collect(),
    };
    let reply = |op: &wire::Op| match op {
        wire::Op::Lookup { .. } => lookup(),
        _ => Reply::Done,
    };
    match request {
        Request::One(op) => Response::One(reply(op)),
        Request::Batch(ops) => Response::Batch(ops.iter().map(reply).collect()),
    }
}

/// Starts a bare quinn echo server: same TLS, ALPN, framing and codec as the
/// real one, no index. Every request frame is decoded and answered with
/// [`canned`] replies naming `pods` pods.
pub async fn echo(pods: usize) -> anyhow::Result<Embedded> {
    let dir = tempfile::tempdir()?;
    let cfg = config(&dir);
    let tls = prefix_server::tls::rustls_config(&cfg)?;
    let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls)?;
    let endpoint =
        quinn::Endpoint::server(quinn::ServerConfig::with_crypto(Arc::new(quic)), cfg.listen)?;
    let addr = endpoint.local_addr()?;
    let (stop, mut stopped) = oneshot::channel::<()>();
    tokio::spawn(async move {
        loop {
            let incoming = tokio::select! {
                _ = &mut stopped => break,
                i = endpoint.accept() => match i { Some(i) => i, None => break },
            };
            tokio::spawn(async move {
                let Ok(conn) = incoming.await else { return };
                while let Ok((send, recv)) = conn.accept_bi().await {
                    tokio::spawn(echo_stream(send, recv, pods));
                }
            });
        }
        endpoint.close(0u32.into(), b"done");
    });
    Embedded::new(addr, stop, dir)
}

async fn echo_stream(mut send: quinn::SendStream, mut recv: quinn::RecvStream, pods: usize) {
    let limits = Limits {
        max_frame_bytes: MAX_FRAME_CEILING,
        max_batch: usize::MAX,
        ..Limits::default()
    };
    let (mut buf, mut out) = (Vec::new(), Vec::new());
    while let Ok(Some(chunk)) = recv.read_chunk(256 << 10, true).await {
        buf.extend_from_slice(&chunk.bytes);
        let mut at = 0;
        while let Ok(Some(f)) = wire::split_frame(&buf[at..], &limits) {
            at += f.used;
            if let Ok(req) = wire::decode_request(f.payload, &limits) {
                wire::encode_response(f.header.request_id, &canned(&req, pods), &mut out);
            }
        }
        buf.drain(..at);
        if send.write_all(&out).await.is_err() {
            return;
        }
        out.clear();
    }
}
