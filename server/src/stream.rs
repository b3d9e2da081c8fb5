//! The async side of a connection: accept streams, move bytes between QUIC
//! and the [`Handler`], drain on shutdown.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use prefix_client::wire::{ErrorCode, Request};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::{Access, Roles};
use crate::busy_poll::BusyPoll;
use crate::handler::{encode_error, Handler, Inbox, Next};

/// What every stream of one connection shares.
struct Shared {
    conn: quinn::Connection,
    handler: Arc<Handler>,
    /// What the client may do, from its certificate.
    access: Arc<Access>,
    /// Heavy requests the connection may still start (`max_in_flight`).
    permits: Arc<Semaphore>,
    shutdown: CancellationToken,
    busy: Option<Arc<BusyPoll>>,
}

/// What every connection is served with.
pub struct ConnSetup {
    /// The protocol logic.
    pub handler: Arc<Handler>,
    /// Roles of client identities.
    pub roles: Roles,
    /// Heavy requests one connection may have running.
    pub max_in_flight: usize,
    /// Streams one connection may have open (quinn's credit).
    pub max_streams: u32,
    /// Told of every read, when busy polling is on.
    pub busy: Option<Arc<BusyPoll>>,
}

/// Serves one accepted connection: every bidirectional stream the client
/// opens gets its own task. Returns when the client closes the connection or
/// at shutdown, once every stream that had arrived by then has its task (the
/// stream tasks then drain on their own).
pub async fn serve_connection(
    conn: quinn::Connection,
    setup: &ConnSetup,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let certs = conn.peer_identity().and_then(|any| {
        any.downcast::<Vec<rustls_pki_types::CertificateDer<'static>>>()
            .ok()
    });
    let access = setup.roles.access(certs.as_deref().map(Vec::as_slice));
    if let Access::Denied(who) = &access {
        tracing::warn!(remote = %conn.remote_address(), client = %who, "a client with no role connected; its requests will be refused");
    }
    let shared = Arc::new(Shared {
        conn: conn.clone(),
        handler: setup.handler.clone(),
        access: Arc::new(access),
        permits: Arc::new(Semaphore::new(setup.max_in_flight)),
        busy: setup.busy.clone(),
        shutdown: shutdown.clone(),
    });
    loop {
        let accepted = tokio::select! {
            // Shutdown first: from then on the drain below takes every
            // stream that has arrived.
            biased;
            _ = shutdown.cancelled() => {
                // Streams that arrived before shutdown, with requests on
                // them, but that this loop had not accepted yet: the drain
                // answers them like those already running. The client may
                // have opened at most `max_streams` (quinn's credit); stop
                // there even if streams ending meanwhile let it open more.
                for _ in 0..setup.max_streams {
                    let Poll::Ready(Ok((send, recv))) = poll_once(conn.accept_bi()).await else {
                        break;
                    };
                    tracker.spawn(serve_stream(send, recv, shared.clone()));
                }
                return;
            }
            s = conn.accept_bi() => s,
        };
        match accepted {
            Ok((send, recv)) => {
                tracker.spawn(serve_stream(send, recv, shared.clone()));
            }
            Err(e) => {
                tracing::debug!(remote = %conn.remote_address(), reason = %e, "connection ended");
                return;
            }
        }
    }
}

/// Polls `fut` once: what is ready now, without waiting for more.
async fn poll_once<F: Future>(fut: F) -> Poll<F::Output> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await
}

/// Largest chunk read at once.
const READ_CHUNK: usize = 256 << 10;

/// At shutdown, reads of already-arrived data a stream may still make.
const DRAIN_READS: usize = 64;

/// What woke a stream task.
enum Event {
    Read(Result<Option<quinn::Chunk>, quinn::ReadError>),
    Heavy(Result<(tokio::task::Id, (u64, Vec<u8>)), tokio::task::JoinError>),
    /// A heavy-request permit for the frame waiting for one.
    Permit(OwnedSemaphorePermit),
}

/// Serves one stream: read what has arrived, answer every whole frame in it,
/// write the answers in one go, repeat. Heavy frames run on the blocking pool
/// and are answered when done, possibly after frames that came later (the
/// client matches answers by request id), so they hold up neither other
/// connections nor this stream. A connection runs at most `max_in_flight`
/// heavy frames at once; a stream whose next heavy frame finds none free stops
/// reading until one is (back-pressure on that client alone). At shutdown,
/// answers what has already arrived, then finishes the stream and waits for
/// the client to acknowledge.
async fn serve_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    shared: Arc<Shared>,
) {
    let Shared {
        conn,
        handler,
        shutdown,
        ..
    } = &*shared;
    let mut inbox = Inbox::default();
    let mut out = Vec::with_capacity(64 << 10);
    let mut heavy = Heavy::new(&shared);
    let (mut reading, mut draining, mut ended) = (true, false, false);
    // Once the framing is lost, nothing more of this stream is served: not
    // even frames already buffered behind the bad one.
    let mut fatal = false;
    let mut drained = 0;
    loop {
        if !out.is_empty() {
            if send.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if !reading && heavy.tasks.is_empty() && heavy.waiting.is_none() {
            break;
        }
        if !draining && shutdown.is_cancelled() {
            draining = true;
        }
        let event = if heavy.waiting.is_some() {
            let permits = heavy.shared.permits.clone();
            tokio::select! {
                Some(done) = heavy.tasks.join_next_with_id(), if !heavy.tasks.is_empty() => Event::Heavy(done),
                Ok(p) = permits.acquire_owned() => Event::Permit(p),
            }
        } else if !reading {
            match heavy.tasks.join_next_with_id().await {
                Some(done) => Event::Heavy(done),
                None => continue,
            }
        } else if draining {
            // Only what has already arrived: poll the read once. A client
            // that keeps sending could otherwise hold the drain open, so
            // stop after a bounded amount too.
            drained += 1;
            match poll_once(recv.read_chunk(READ_CHUNK, true)).await {
                Poll::Ready(r) if drained <= DRAIN_READS => Event::Read(r),
                _ => {
                    let _ = recv.stop(u32::from(ErrorCode::Unavailable as u16).into());
                    reading = false;
                    continue;
                }
            }
        } else {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    draining = true;
                    continue;
                }
                Some(done) = heavy.tasks.join_next_with_id(), if !heavy.tasks.is_empty() => Event::Heavy(done),
                r = recv.read_chunk(READ_CHUNK, true) => Event::Read(r),
            }
        };
        match event {
            Event::Heavy(done) => heavy.finished(done, handler, &mut out),
            Event::Permit(permit) => heavy.resume(permit),
            Event::Read(Ok(Some(chunk))) => {
                if let Some(busy) = &shared.busy {
                    busy.touch();
                }
                inbox.push(&chunk.bytes);
            }
            Event::Read(Ok(None)) => {
                reading = false;
                ended = true;
            }
            Event::Read(Err(e)) => {
                // The connection is gone: nobody to answer.
                tracing::debug!(reason = %e, "stream ended");
                return;
            }
        }
        if heavy.waiting.is_some() || fatal {
            continue;
        }
        if let Some(code) = answer(handler, &mut inbox, &mut out, &mut heavy) {
            let _ = recv.stop(u32::from(code).into());
            reading = false;
            ended = false;
            fatal = true;
        }
        if ended && heavy.waiting.is_none() {
            // The client finished its side; answer a frame it cut short.
            if let Some((id, e)) = inbox.truncated() {
                handler.refused();
                encode_error(id, &e, &mut out);
            }
            ended = false;
        }
    }
    let _ = send.finish();
    // Wait until the client has acknowledged the answers (or stops the
    // stream), so closing the connection afterwards loses nothing. A live
    // client acknowledges within a few round trips, even with a loss or two;
    // a vanished one never does, so do not wait for it longer than that.
    let patience = (conn.rtt() * 10).clamp(Duration::from_millis(50), Duration::from_secs(2));
    let _ = tokio::time::timeout(patience, send.stopped()).await;
}

/// A stream's heavy frames on the blocking pool.
struct Heavy {
    tasks: tokio::task::JoinSet<(u64, Vec<u8>)>,
    /// Request id of each task, to answer even if one fails.
    ids: std::collections::HashMap<tokio::task::Id, u64>,
    /// A heavy frame read while the connection had no permit free; the
    /// stream reads nothing more until it starts.
    waiting: Option<(u64, Request)>,
    /// The connection's handler, access and permits.
    shared: Arc<Shared>,
}

impl Heavy {
    fn new(shared: &Arc<Shared>) -> Heavy {
        Heavy {
            tasks: tokio::task::JoinSet::new(),
            ids: std::collections::HashMap::new(),
            waiting: None,
            shared: shared.clone(),
        }
    }

    /// Starts a heavy frame if the connection has a permit free; otherwise
    /// parks it (and returns false: read no further frames for now).
    fn start(&mut self, id: u64, request: Request) -> bool {
        match self.shared.permits.clone().try_acquire_owned() {
            Ok(permit) => {
                self.spawn(permit, id, request);
                true
            }
            Err(_) => {
                self.waiting = Some((id, request));
                false
            }
        }
    }

    /// Starts the parked frame with a permit that came free.
    fn resume(&mut self, permit: OwnedSemaphorePermit) {
        if let Some((id, request)) = self.waiting.take() {
            self.spawn(permit, id, request);
        }
    }

    fn spawn(&mut self, permit: OwnedSemaphorePermit, id: u64, request: Request) {
        let shared = self.shared.clone();
        let task = self.tasks.spawn_blocking(move || {
            let _permit = permit;
            let mut buf = Vec::new();
            shared.handler.serve(id, &request, &shared.access, &mut buf);
            (id, buf)
        });
        self.ids.insert(task.id(), id);
    }

    fn finished(
        &mut self,
        done: Result<(tokio::task::Id, (u64, Vec<u8>)), tokio::task::JoinError>,
        handler: &Handler,
        out: &mut Vec<u8>,
    ) {
        match done {
            Ok((task, (_, bytes))) => {
                self.ids.remove(&task);
                out.extend_from_slice(&bytes);
            }
            Err(e) => {
                let id = self.ids.remove(&e.id()).unwrap_or(0);
                tracing::error!(error = %e, request_id = id, "request task failed");
                handler.refused();
                let msg = format!("the server failed on this request: {e}");
                prefix_client::wire::encode_response(
                    id,
                    &prefix_client::wire::Response::One(prefix_client::wire::Reply::Error {
                        code: prefix_client::wire::ErrorCode::Internal as u16,
                        message: msg,
                    }),
                    out,
                );
            }
        }
    }
}

/// Answers every whole frame in the inbox into `out`, starting heavy ones on
/// the blocking pool, until the inbox is empty or a heavy frame has to wait
/// for a permit. Returns the error code if the stream's framing is lost and it
/// must close.
fn answer(
    handler: &Handler,
    inbox: &mut Inbox,
    out: &mut Vec<u8>,
    heavy: &mut Heavy,
) -> Option<u16> {
    loop {
        match inbox.next(&handler.limits) {
            Next::Wait => return None,
            Next::Request { id, request } => {
                if handler.is_heavy(&request) {
                    // A big batch of long keys takes milliseconds: run it off
                    // the async workers so other connections are not held up.
                    if !heavy.start(id, request) {
                        return None;
                    }
                } else {
                    handler.serve(id, &request, &heavy.shared.access, out);
                }
            }
            Next::Refuse { id, error } => {
                handler.refused();
                encode_error(id, &error, out);
            }
            Next::Fatal { id, error } => {
                tracing::debug!(%error, "closing a stream");
                handler.refused();
                encode_error(id, &error, out);
                return Some(error.code() as u16);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServerConfig;
    use prefix_client::wire::{self, Op, Reply, Response};
    use prefix_client::TlsConfig;

    /// A server-side connection, not yet served, and its client side.
    async fn pair(dir: &tempfile::TempDir) -> (ServerConfig, quinn::Connection, quinn::Connection) {
        let cfg = ServerConfig {
            listen: "127.0.0.1:0".parse().unwrap(),
            metrics_listen: None,
            data_dir: dir.path().into(),
            ..ServerConfig::default()
        };
        let tls = crate::tls::rustls_config(&cfg).unwrap();
        let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
        let server =
            quinn::Endpoint::server(quinn::ServerConfig::with_crypto(Arc::new(quic)), cfg.listen)
                .unwrap();
        let trust = TlsConfig::from_files(&dir.path().join("cert.pem"), None, None).unwrap();
        let mut client = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        client.set_default_client_config(trust.quic_config().unwrap());
        let connecting = client
            .connect(server.local_addr().unwrap(), "localhost")
            .unwrap();
        let (ours, theirs) = tokio::join!(
            async { server.accept().await.unwrap().await.unwrap() },
            async { connecting.await.unwrap() }
        );
        (cfg, ours, theirs)
    }

    #[tokio::test]
    async fn a_stream_that_arrived_before_shutdown_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let (cfg, conn, client) = pair(&dir).await;
        let (mut send, mut recv) = client.open_bi().await.unwrap();
        let mut frame = Vec::new();
        wire::encode_request(7, &wire::Request::One(Op::Ping), &mut frame);
        send.write_all(&frame).await.unwrap();
        send.finish().unwrap();
        // The request is in the server's connection, not yet accepted by
        // anyone, when shutdown has already begun.
        let mut waited = 0;
        while conn.stats().frame_rx.stream == 0 {
            waited += 1;
            assert!(waited < 10_000, "the request never reached the server");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let shutdown = CancellationToken::new();
        shutdown.cancel();
        let tracker = TaskTracker::new();
        let handler = Arc::new(Handler {
            index: Arc::new(prefix_index::Index::new(cfg.index.clone())),
            limits: cfg.limits(),
            metrics: Arc::new(crate::metrics::Metrics::default()),
            inline_blocks: cfg.inline_blocks,
        });
        let setup = ConnSetup {
            handler,
            roles: cfg.roles.clone(),
            max_in_flight: 4,
            max_streams: cfg.max_streams,
            busy: None,
        };
        serve_connection(conn, &setup, shutdown, tracker.clone()).await;
        tracker.close();
        tracker.wait().await;

        let answer = recv.read_to_end(1 << 20).await.unwrap();
        let f = wire::split_frame(&answer, &cfg.limits())
            .unwrap()
            .expect("a whole frame");
        assert_eq!(f.header.request_id, 7);
        assert_eq!(
            wire::decode_response(f.payload).unwrap(),
            Response::One(Reply::Pong)
        );
        assert_eq!(f.used, answer.len(), "one answer only");
    }
}
