//! The async side of a connection: accept streams, move bytes between QUIC
//! and a [`Service`], drain on shutdown.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use prefix_proto::{
    encode_response, ErrorCode, FrameReader, Incoming, Kind, Reply, Request, Response,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::access::{Access, Roles};
use crate::busy_poll::BusyPoll;
use crate::service::Service;

/// The reason a connection is closed with at shutdown (application code 0).
pub const SHUTDOWN_REASON: &[u8] = b"server shutting down";

/// What every stream of one connection shares.
struct Shared<S> {
    conn: quinn::Connection,
    service: Arc<S>,
    /// What the client may do, from its certificate.
    access: Arc<Access>,
    /// Heavy requests the connection may still start (`max_in_flight`).
    permits: Arc<Semaphore>,
    shutdown: CancellationToken,
    busy: Option<Arc<BusyPoll>>,
    /// How snapshots are sent.
    snapshots: SnapshotSending,
    /// How long a frame may take to arrive once begun.
    read_timeout: Duration,
    /// How long writing answers may stay blocked.
    write_timeout: Duration,
}

impl<S> Drop for Shared<S> {
    /// The connection's last stream is done. At shutdown, close it now with
    /// the shutdown reason: dropping the last handle would close it too, but
    /// with an empty reason.
    fn drop(&mut self) {
        if self.shutdown.is_cancelled() {
            self.conn.close(0u32.into(), SHUTDOWN_REASON);
        }
    }
}

/// What every connection is served with.
pub struct ConnSetup<S> {
    /// What answers the requests.
    pub service: Arc<S>,
    /// Roles of client identities.
    pub roles: Roles,
    /// Heavy requests one connection may have running.
    pub max_in_flight: usize,
    /// Streams one connection may have open (quinn's credit).
    pub max_streams: u32,
    /// Told of every read, when busy polling is on.
    pub busy: Option<Arc<BusyPoll>>,
    /// How a snapshot is sent to a peer that asks for it.
    pub snapshots: SnapshotSending,
    /// How long a request frame may take to arrive once its first byte has
    /// (`--read-timeout`): a stream whose frame stalls past it is answered
    /// `Malformed` and closed, and what it buffered is dropped.
    pub read_timeout: Duration,
    /// How long writing a stream's answers may stay blocked on a client
    /// that does not take them (`--write-timeout`): past it the stream is
    /// reset, and what it held is dropped.
    pub write_timeout: Duration,
}

/// How a snapshot is sent to a peer that asks for it (see
/// `ReplicaConfig`).
#[derive(Debug, Clone, Copy)]
pub struct SnapshotSending {
    /// How long one transfer may take before it is reset: it pins the
    /// index's memory and holds the one transfer slot.
    pub timeout: Duration,
    /// Bytes handed from the writing job to the stream at a time.
    pub piece_bytes: usize,
    /// Pieces queued between them: with one being filled and one being
    /// written, one transfer holds `(pieces + 2) * piece_bytes`.
    pub pieces: usize,
}

/// Serves one accepted connection: every bidirectional stream the client
/// opens gets its own task. Returns when the client closes the connection or
/// at shutdown, once every stream that had arrived by then has its task (the
/// stream tasks then drain on their own).
pub async fn serve_connection<S: Service>(
    conn: quinn::Connection,
    setup: &ConnSetup<S>,
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
        service: setup.service.clone(),
        access: Arc::new(access),
        permits: Arc::new(Semaphore::new(setup.max_in_flight)),
        busy: setup.busy.clone(),
        shutdown: shutdown.clone(),
        snapshots: setup.snapshots,
        read_timeout: setup.read_timeout,
        write_timeout: setup.write_timeout,
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

/// Sleeps until `due`, or forever without one.
async fn sleep_until(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
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

/// Where a stream's reading side is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Input {
    /// Reading whatever the client sends.
    Open,
    /// Shutting down: reading only what has already arrived, at most this
    /// many more reads, so a client that keeps sending cannot hold the drain
    /// open.
    Draining(usize),
    /// The client finished its side; frames still buffered are answered,
    /// then a frame it cut short is reported.
    Ended,
    /// Nothing more is read or answered from the input: it ended and was
    /// answered, the framing failed, or the drain stopped it.
    Closed,
}

/// What woke a stream task.
enum Event {
    Read(Result<Option<quinn::Chunk>, quinn::ReadError>),
    Heavy(Result<(tokio::task::Id, (u64, Vec<u8>)), tokio::task::JoinError>),
    /// A heavy-request permit for the frame waiting for one.
    Permit(OwnedSemaphorePermit),
    /// The frame being received did not arrive within `read_timeout`.
    Stalled,
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
async fn serve_stream<S: Service>(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    shared: Arc<Shared<S>>,
) {
    let service = &*shared.service;
    let mut reader = FrameReader::new(Kind::Request, service.limits().max_frame_bytes);
    let mut out = Vec::with_capacity(64 << 10);
    let mut heavy = Heavy::new(&shared);
    let mut input = Input::Open;
    // A snapshot request's id: answered once every earlier request is.
    let mut snapshot = None;
    // The frame being received: where it begins on the stream, and when
    // it is due whole.
    let mut partial: Option<(u64, tokio::time::Instant)> = None;
    loop {
        if !out.is_empty() {
            let began = tokio::time::Instant::now();
            match tokio::time::timeout(shared.write_timeout, send.write_all(&out)).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return,
                Err(_) => {
                    tracing::debug!(
                        "a client left its answers unread past write-timeout: resetting the stream"
                    );
                    let _ = send.reset(u32::from(ErrorCode::Unavailable as u16).into());
                    let _ = recv.stop(u32::from(ErrorCode::Unavailable as u16).into());
                    return;
                }
            }
            out.clear();
            // The stream read nothing while it wrote: the frame being
            // received is not held to the time spent here.
            if let Some((_, due)) = &mut partial {
                *due += began.elapsed();
            }
        }
        if input == Input::Closed && heavy.is_idle() {
            break;
        }
        if input == Input::Open && shared.shutdown.is_cancelled() {
            input = Input::Draining(DRAIN_READS);
        }
        let event = if heavy.waiting.is_some() {
            let permits = shared.permits.clone();
            tokio::select! {
                Some(done) = heavy.tasks.join_next_with_id(), if !heavy.tasks.is_empty() => Event::Heavy(done),
                Ok(p) = permits.acquire_owned() => Event::Permit(p),
            }
        } else {
            match input {
                Input::Ended | Input::Closed => match heavy.tasks.join_next_with_id().await {
                    Some(done) => Event::Heavy(done),
                    None => continue,
                },
                Input::Draining(left) => {
                    // Only what has already arrived: poll the read once.
                    let read = match left {
                        0 => Poll::Pending,
                        _ => poll_once(recv.read_chunk(READ_CHUNK, true)).await,
                    };
                    match read {
                        Poll::Ready(r) => {
                            input = Input::Draining(left - 1);
                            Event::Read(r)
                        }
                        Poll::Pending => {
                            let _ = recv.stop(u32::from(ErrorCode::Unavailable as u16).into());
                            input = Input::Closed;
                            continue;
                        }
                    }
                }
                Input::Open => {
                    let due = partial.map(|(_, due)| due);
                    tokio::select! {
                        biased;
                        _ = shared.shutdown.cancelled() => continue,
                        Some(done) = heavy.tasks.join_next_with_id(), if !heavy.tasks.is_empty() => Event::Heavy(done),
                        r = recv.read_chunk(READ_CHUNK, true) => Event::Read(r),
                        _ = sleep_until(due), if due.is_some() => Event::Stalled,
                    }
                }
            }
        };
        match event {
            Event::Heavy(done) => heavy.finished(done, service, &mut out),
            Event::Permit(permit) => {
                // The stream read nothing while it waited: the frame behind
                // the one that waited is timed from now.
                partial = None;
                heavy.resume(permit);
            }
            Event::Stalled => {
                service.refused();
                let stalled = reader.stalled(shared.read_timeout);
                tracing::debug!(error = %stalled, "closing a stream");
                stalled.encode(&mut out);
                let _ = recv.stop(u32::from(ErrorCode::Malformed as u16).into());
                input = Input::Closed;
                continue;
            }
            Event::Read(Ok(Some(chunk))) => {
                if let Some(busy) = &shared.busy {
                    busy.touch();
                }
                reader.push(&chunk.bytes);
            }
            Event::Read(Ok(None)) => input = Input::Ended,
            Event::Read(Err(e)) => {
                // The connection is gone: nobody to answer.
                tracing::debug!(reason = %e, "stream ended");
                return;
            }
        }
        if heavy.waiting.is_some() {
            continue;
        }
        match answer(service, &mut reader, &mut out, &mut heavy) {
            Some(Stop::Framing(code)) => {
                let _ = recv.stop(u32::from(code).into());
                input = Input::Closed;
                continue;
            }
            Some(Stop::Snapshot(id)) => {
                // The stream's last request: whatever the client sends after
                // it is not read.
                let _ = recv.stop(0u32.into());
                snapshot = Some(id);
                input = Input::Closed;
                continue;
            }
            None => {}
        }
        partial = match partial {
            _ if reader.pending() == 0 => None,
            Some((at, due)) if at == reader.taken() => Some((at, due)),
            _ => Some((
                reader.taken(),
                tokio::time::Instant::now() + shared.read_timeout,
            )),
        };
        if input == Input::Ended && heavy.waiting.is_none() {
            // The client finished its side; answer a frame it cut short.
            if let Err(cut) = reader.finish() {
                service.refused();
                cut.encode(&mut out);
            }
            input = Input::Closed;
        }
    }
    if let Some(id) = snapshot {
        if !send_snapshot(&mut send, id, &shared).await {
            return;
        }
    }
    let _ = send.finish();
    // Wait until the client has acknowledged the answers (or stops the
    // stream), so closing the connection afterwards loses nothing. A live
    // client acknowledges within a few round trips, even with a loss or two;
    // a vanished one never does, so do not wait for it longer than that.
    let patience =
        (shared.conn.rtt() * 10).clamp(Duration::from_millis(50), Duration::from_secs(2));
    let _ = tokio::time::timeout(patience, send.stopped()).await;
}

/// A stream's heavy frames on the blocking pool.
struct Heavy<S> {
    tasks: tokio::task::JoinSet<(u64, Vec<u8>)>,
    /// Request id of each task, to answer even if one fails.
    ids: std::collections::HashMap<tokio::task::Id, u64>,
    /// A heavy frame read while the connection had no permit free; the
    /// stream reads nothing more until it starts.
    waiting: Option<(u64, Request)>,
    /// The connection's service, access and permits.
    shared: Arc<Shared<S>>,
}

impl<S: Service> Heavy<S> {
    fn new(shared: &Arc<Shared<S>>) -> Self {
        Heavy {
            tasks: tokio::task::JoinSet::new(),
            ids: std::collections::HashMap::new(),
            waiting: None,
            shared: shared.clone(),
        }
    }

    /// Whether no heavy frame is running or waiting.
    fn is_idle(&self) -> bool {
        self.tasks.is_empty() && self.waiting.is_none()
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
            shared.service.serve(id, &request, &shared.access, &mut buf);
            (id, buf)
        });
        self.ids.insert(task.id(), id);
    }

    fn finished(
        &mut self,
        done: Result<(tokio::task::Id, (u64, Vec<u8>)), tokio::task::JoinError>,
        service: &S,
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
                service.refused();
                let reply =
                    ErrorCode::Internal.reply(format!("the server failed on this request: {e}"));
                encode_response(id, &Response::One(reply), out);
            }
        }
    }
}

/// A [`std::io::Write`] that hands full pieces to the sending task; fails
/// once the task has stopped (the client went away).
struct Pieces {
    piece: Vec<u8>,
    /// A full piece's bytes.
    size: usize,
    to: tokio::sync::mpsc::Sender<Vec<u8>>,
}

impl Pieces {
    fn hand_over(&mut self) -> std::io::Result<()> {
        let full = std::mem::replace(&mut self.piece, Vec::with_capacity(self.size));
        self.to
            .blocking_send(full)
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the client left"))
    }
}

impl std::io::Write for Pieces {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = buf.len().min(self.size - self.piece.len());
        self.piece.extend_from_slice(&buf[..n]);
        if self.piece.len() == self.size {
            self.hand_over()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.piece.is_empty() {
            return Ok(());
        }
        self.hand_over()
    }
}

/// Answers snapshot request `id`: the refusal, or `Done` followed by the
/// snapshot's bytes, written by the service's job on the blocking pool as the
/// stream takes them. Returns whether the stream may be finished normally: a
/// transfer cut short (the client left, the job failed, or it ran past
/// `snapshot_timeout`: the job pins the index's memory while it runs) is
/// reset instead, so the client cannot take a truncated snapshot for a whole
/// one (its checks would refuse it anyway).
async fn send_snapshot<S: Service>(
    send: &mut quinn::SendStream,
    id: u64,
    shared: &Shared<S>,
) -> bool {
    let mut head = Vec::new();
    let asked = if shared.shutdown.is_cancelled() {
        // A transfer would hold the drain open.
        Err(ErrorCode::Unavailable.reply("the server is shutting down: ask another replica"))
    } else {
        shared.service.snapshot(&shared.access)
    };
    let job = match asked {
        Ok(job) => {
            encode_response(id, &Response::One(Reply::Done), &mut head);
            job
        }
        Err(refusal) => {
            encode_response(id, &Response::One(refusal), &mut head);
            return send.write_all(&head).await.is_ok();
        }
    };
    if send.write_all(&head).await.is_err() {
        return false;
    }
    let sending = shared.snapshots;
    let (to, mut pieces) = tokio::sync::mpsc::channel(sending.pieces);
    let writing = tokio::task::spawn_blocking(move || {
        let mut sink = Pieces {
            piece: Vec::with_capacity(sending.piece_bytes),
            size: sending.piece_bytes,
            to,
        };
        job(&mut sink)?;
        std::io::Write::flush(&mut sink)
    });
    let moved = async {
        while let Some(piece) = pieces.recv().await {
            if send.write_all(&piece).await.is_err() {
                return false;
            }
        }
        true
    };
    let sent = tokio::time::timeout(sending.timeout, moved)
        .await
        .unwrap_or(false);
    // Dropping the receiver fails the job's next hand-over, so it stops.
    drop(pieces);
    match writing.await {
        Ok(Ok(())) if sent => true,
        outcome => {
            let why = match outcome {
                Ok(Ok(())) => format!(
                    "the client stopped reading, or took longer than {:?}",
                    sending.timeout
                ),
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            };
            tracing::warn!(%why, "a snapshot transfer was cut short");
            let _ = send.reset(u32::from(ErrorCode::Internal as u16).into());
            false
        }
    }
}

/// Why a stream stops reading requests.
enum Stop {
    /// Its framing is lost: close it with this error code.
    Framing(u16),
    /// A snapshot request (this id): answer it once every earlier request is.
    Snapshot(u64),
}

/// Answers every whole frame in the reader into `out`, starting heavy ones on
/// the blocking pool, until no whole frame is left, a heavy frame has to
/// wait for a permit, or the stream stops reading requests.
fn answer<S: Service>(
    service: &S,
    reader: &mut FrameReader,
    out: &mut Vec<u8>,
    heavy: &mut Heavy<S>,
) -> Option<Stop> {
    loop {
        match reader.next_request(service.limits()) {
            Ok(None) => return None,
            Ok(Some(Incoming::Snapshot { id })) => return Some(Stop::Snapshot(id)),
            Ok(Some(Incoming::Request { id, request })) => {
                if service.is_heavy(&request) {
                    // A big batch of long keys takes milliseconds: run it off
                    // the async workers so other connections are not held up.
                    if !heavy.start(id, request) {
                        return None;
                    }
                } else {
                    service.serve(id, &request, &heavy.shared.access, out);
                }
            }
            Ok(Some(refused)) => {
                service.refused();
                refused.encode_refusal(out);
            }
            Err(fatal) => {
                tracing::debug!(error = %fatal, "closing a stream");
                service.refused();
                fatal.encode(out);
                return Some(Stop::Framing(fatal.error.code() as u16));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::Handler;
    use crate::ServerConfig;
    use prefix_client::TlsConfig;
    use prefix_proto::{decode_response, encode_request, split_frame, Op, Reply};

    /// A server-side connection, not yet served, and its client side.
    async fn pair(dir: &tempfile::TempDir) -> (ServerConfig, quinn::Connection, quinn::Connection) {
        let mut cfg = ServerConfig {
            data_dir: dir.path().into(),
            ..ServerConfig::default()
        };
        cfg.transport.listen = "127.0.0.1:0".parse().unwrap();
        cfg.transport.metrics_listen = None;
        let tls = crate::tls::rustls_config(&cfg).unwrap();
        let quic = quinn::crypto::rustls::QuicServerConfig::try_from(tls).unwrap();
        let server = quinn::Endpoint::server(
            quinn::ServerConfig::with_crypto(Arc::new(quic)),
            cfg.transport.listen,
        )
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
        encode_request(7, &Request::One(Op::Ping), &mut frame);
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
            engines: None,
            replica: crate::replica::Replica::serving(),
            index: Arc::new(prefix_index::Index::new(cfg.index.clone())),
            limits: cfg.wire_limits(),
            metrics: Arc::new(crate::metrics::Metrics::default()),
            inline_blocks: cfg.limits.inline_blocks,
        });
        let setup = ConnSetup {
            service: handler,
            roles: cfg.roles.clone(),
            max_in_flight: 4,
            max_streams: cfg.transport.max_streams,
            busy: None,
            snapshots: SnapshotSending {
                timeout: Duration::from_secs(60),
                piece_bytes: 1 << 20,
                pieces: 4,
            },
            read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
        };
        serve_connection(conn, &setup, shutdown, tracker.clone()).await;
        tracker.close();
        tracker.wait().await;

        let answer = recv.read_to_end(1 << 20).await.unwrap();
        let f = split_frame(&answer, cfg.limits.max_frame_bytes)
            .unwrap()
            .expect("a whole frame");
        assert_eq!(f.header.request_id, 7);
        assert_eq!(
            decode_response(f.payload).unwrap(),
            Response::One(Reply::Pong)
        );
        assert_eq!(f.used, answer.len(), "one answer only");
    }
}
