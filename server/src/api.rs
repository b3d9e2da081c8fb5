//! The HTTP/JSON API: the protocol's operations for gateways without QUIC.
//!
//! One route per operation of the table ([`route`]), plus `/v1/batch`;
//! bodies and answers are the JSON objects of [`prefix_proto::json`], keys
//! given as hashes, token ids or text (hashed here with the server's block
//! sizes). Every request goes through the same [`Handler`] as a QUIC frame:
//! the same limits, roles, metrics and answers. HTTP/1.1 and HTTP/2 (by
//! ALPN) over TLS with the QUIC listener's certificate and client CA; a
//! client certificate's role is read once per connection. With
//! `--http-plaintext`, plain HTTP instead (HTTP/1.1, and HTTP/2 with prior
//! knowledge, told apart by the client's first bytes), for deployments
//! inside a mesh that encrypts and authenticates on its own.
//!
//! The same listener serves the routers' drop-in APIs
//! (`crate::routers`): NVIDIA Dynamo's indexer routes and SGLang's gRPC
//! indexer service.
//!
//! The listener also answers the probes, `/healthz` and `/readyz`, as the
//! metrics listener does ([`crate::http::probes`]).
//!
//! Statuses: 200 with the answer; an op's error answers its error object
//! with the status [`http_status`] gives its code (a batch answers 200 with
//! one object per op, unless the batch itself is refused). A body over
//! `http_max_body_bytes` is refused (413, `frame_too_large`) before it is
//! parsed, by its declared length when it has one; one that does not
//! arrive within `read_timeout` of its headers answers 408; one that does
//! not parse answers 400 `malformed`. An answer that leaves the body unread
//! closes an HTTP/1.1 connection (`Connection: close`). Nothing refused
//! reaches the index.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode, Version};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Extension, Router};
use http_body::Body as _;
use http_body_util::BodyExt as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use prefix_proto::json::{error_json, parse_batch, JsonOp, KeyOptions};
use prefix_proto::{ErrorCode, OpKind, Reply, Request};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service as _;

use crate::access::{Access, Roles};
use crate::handler::Handler;
use crate::linger::{Budget, Lingering};
use crate::metrics::Metrics;
use crate::service::Service;

/// The path of a batch of ops.
pub const BATCH_PATH: &str = "/v1/batch";

/// Each operation's method and path: reads without a body are `GET`.
pub const fn route(kind: OpKind) -> (Method, &'static str) {
    match kind {
        OpKind::Lookup => (Method::POST, "/v1/lookup"),
        OpKind::Insert => (Method::POST, "/v1/insert"),
        OpKind::RemovePod => (Method::POST, "/v1/remove-pod"),
        OpKind::SetPodCapacity => (Method::POST, "/v1/pod-capacity"),
        OpKind::Stats => (Method::GET, "/v1/stats"),
        OpKind::Ping => (Method::GET, "/v1/ping"),
        OpKind::Subscribe => (Method::POST, "/v1/subscribe"),
        OpKind::Unsubscribe => (Method::POST, "/v1/unsubscribe"),
        OpKind::ListEngines => (Method::GET, "/v1/engines"),
        OpKind::SampleKeys => (Method::POST, "/v1/sample-keys"),
        OpKind::LookupDetail => (Method::POST, "/v1/lookup-detail"),
        OpKind::Tail => (Method::POST, "/v1/tail"),
        OpKind::LookupTiers => (Method::POST, "/v1/lookup-tiers"),
        OpKind::Digest => (Method::POST, "/v1/digest"),
        OpKind::Receipt => (Method::POST, "/v1/receipt"),
    }
}

/// What the routes share.
pub struct Api {
    /// Applies the requests: the QUIC listener's.
    pub handler: Arc<Handler>,
    /// How text and token ids are hashed: the server's token block
    /// (`--token-block`) and the default text block.
    pub keys: KeyOptions,
    /// Largest body read (`--http-max-body-bytes`).
    pub max_body: usize,
    /// How long a body may take to arrive after its headers
    /// (`--read-timeout`).
    pub read_timeout: Duration,
}

/// One connection's client, as its TLS handshake named it, its share of
/// the blocking pool, and what its idle timer reads.
pub(crate) struct Conn {
    /// What the client may do.
    pub(crate) access: Access,
    /// Heavy requests running at once (`--max-in-flight`): an HTTP/2
    /// connection multiplexes requests as a QUIC one does. A permit lives
    /// as long as its blocking job, even if the client gives up on it.
    heavy: Arc<Semaphore>,
    /// Requests being answered.
    busy: AtomicUsize,
    /// When the last request ended or began.
    last: parking_lot::Mutex<std::time::Instant>,
}

/// Bodies larger than this are parsed (and their keys hashed) on the
/// blocking pool with the request, not on the async workers QUIC shares.
const INLINE_BODY: usize = 64 << 10;

/// Why a job of [`run_job`] did not run to its end.
pub(crate) enum NotRun {
    /// The server is shutting down: no permit is handed out any more.
    ShuttingDown,
    /// The job panicked.
    Failed,
}

/// Runs `job` for the connection `conn`: here, on the async worker, when
/// it is light (a lookup takes microseconds, less than a hand-off to
/// another thread); when `heavy`, on the blocking pool under one of the
/// connection's permits (`--max-in-flight`), so that a client's large
/// requests wait for each other and not the async workers QUIC shares.
/// Every door of the HTTP listener runs its work through here.
pub(crate) async fn run_job<T: Send + 'static>(
    conn: &Conn,
    heavy: bool,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, NotRun> {
    if !heavy {
        return Ok(job());
    }
    let Ok(permit) = conn.heavy.clone().acquire_owned().await else {
        return Err(NotRun::ShuttingDown);
    };
    tokio::task::spawn_blocking(move || {
        // The permit is the job's: a client that gives up on the request
        // does not free it while the work goes on.
        let _permit = permit;
        job()
    })
    .await
    .map_err(|_| NotRun::Failed)
}

/// The routes.
pub fn router(api: Arc<Api>) -> Router {
    let mut app = Router::new();
    for kind in OpKind::ALL {
        let (method, path) = route(kind);
        let takes_body = method != Method::GET;
        let handler = move |State(api): State<Arc<Api>>,
                            Extension(conn): Extension<Arc<Conn>>,
                            headers: HeaderMap,
                            body: Body| async move {
            let keys = api.keys;
            let parse = move |body: Bytes| {
                JsonOp::parse_as(kind, &body)
                    .and_then(|op| op.into_op(&keys))
                    .map(Request::One)
                    .map_err(|e| e.to_reply())
            };
            // A GET takes no body: one sent anyway is not read (and closes
            // an HTTP/1.1 connection after the answer, see `serve_one`).
            let body = if takes_body {
                read_body(&api, &headers, body).await
            } else {
                Ok(Bytes::from_static(b"{}"))
            };
            answer(&api, &conn, body, parse).await
        };
        let on: MethodRouter<Arc<Api>> = if takes_body {
            post(handler)
        } else {
            get(handler)
        };
        app = app.route(path, on);
    }
    let batch = |State(api): State<Arc<Api>>,
                 Extension(conn): Extension<Arc<Conn>>,
                 headers: HeaderMap,
                 body: Body| async move {
        let (max, keys) = (api.handler.limits.max_batch, api.keys);
        let parse = move |body: Bytes| parse_batch(&body, &keys, max);
        let body = read_body(&api, &headers, body).await;
        answer(&api, &conn, body, parse).await
    };
    app.route(BATCH_PATH, post(batch))
        .fallback(|| async { not_found(StatusCode::NOT_FOUND, "no such path") })
        .method_not_allowed_fallback(|| async {
            not_found(
                StatusCode::METHOD_NOT_ALLOWED,
                "this path takes another method",
            )
        })
        .with_state(api)
}

/// A body that was not taken.
pub(crate) enum Unread {
    /// Refused with this protocol error (too large, or cut).
    Refused(Reply),
    /// It did not arrive within `--read-timeout` of the headers.
    Late,
}

/// Reads a request's body: refused before any of it is read when its
/// declared length is over the limit (so an `Expect: 100-continue` client
/// is answered 413, never `100 Continue`), and cut off when it grows past
/// the limit or stops arriving.
pub(crate) async fn read_body(api: &Api, headers: &HeaderMap, body: Body) -> Result<Bytes, Unread> {
    let too_large = || {
        Unread::Refused(ErrorCode::FrameTooLarge.reply(format!(
            "the body exceeds http-max-body-bytes = {}",
            api.max_body
        )))
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > api.max_body as u64) {
        return Err(too_large());
    }
    let limited = http_body_util::Limited::new(body, api.max_body);
    match tokio::time::timeout(api.read_timeout, limited.collect()).await {
        Err(_) => Err(Unread::Late),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => Err(Unread::Refused(
            ErrorCode::Malformed.reply(format!("the body could not be read: {e}")),
        )),
    }
}

/// A path or method the API does not have: no protocol code.
fn not_found(status: StatusCode, what: &str) -> Response {
    let mut paths: Vec<String> = OpKind::ALL
        .iter()
        .map(|k| {
            let (m, p) = route(*k);
            format!("{m} {p}")
        })
        .collect();
    paths.push(format!("POST {BATCH_PATH}"));
    paths.extend(crate::http::PROBE_PATHS.map(|p| format!("GET {p}")));
    let message = format!("{what}; the API is {}", paths.join(", "));
    json_response(status, serde_json::to_vec(&error_json(None, &message)))
}

/// An error answer with the protocol's `code`.
fn error_response(code: ErrorCode, message: &str) -> Response {
    let code = code as u16;
    json_response(
        status_of(Some(code)),
        serde_json::to_vec(&error_json(Some(code), message)),
    )
}

fn json_response(status: StatusCode, body: serde_json::Result<Vec<u8>>) -> Response {
    let body = body.unwrap_or_else(|_| br#"{"ok":false}"#.to_vec());
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Parses a body and applies its request, on the async worker when both
/// are light, else on the blocking pool under one of the connection's
/// heavy permits; answers it.
async fn answer(
    api: &Arc<Api>,
    conn: &Arc<Conn>,
    body: Result<Bytes, Unread>,
    parse: impl FnOnce(Bytes) -> Result<Request, Reply> + Send + 'static,
) -> Response {
    let body = match body {
        Ok(b) => b,
        Err(Unread::Refused(reply)) => return refused(api, reply),
        Err(Unread::Late) => {
            api.handler.refused();
            let message = format!(
                "the body did not arrive within read-timeout = {:?}",
                api.read_timeout
            );
            return json_response(
                StatusCode::REQUEST_TIMEOUT,
                serde_json::to_vec(&error_json(None, &message)),
            );
        }
    };
    // Light: parsed here, and applied here unless the request is heavy.
    let parsed = if body.len() <= INLINE_BODY {
        match parse(body) {
            Ok(request) if !api.handler.is_heavy(&request) => {
                let mut out = Vec::new();
                let code = api.handler.serve_json(&request, &conn.access, &mut out);
                return json_response(status_of(code), Ok(out));
            }
            Ok(request) => Ok(request),
            Err(reply) => return refused(api, reply),
        }
    } else {
        Err((body, parse))
    };
    let (api2, conn2) = (api.clone(), conn.clone());
    let ran = run_job(conn, true, move || {
        let request = match parsed {
            Ok(request) => request,
            Err((body, parse)) => match parse(body) {
                Ok(request) => request,
                Err(reply) => return Err(reply),
            },
        };
        let mut out = Vec::new();
        let code = api2.handler.serve_json(&request, &conn2.access, &mut out);
        Ok((code, out))
    })
    .await;
    match ran {
        Ok(Ok((code, out))) => json_response(status_of(code), Ok(out)),
        Ok(Err(reply)) => refused(api, reply),
        Err(NotRun::ShuttingDown) => error_response(ErrorCode::Unavailable, "shutting down"),
        Err(NotRun::Failed) => error_response(ErrorCode::Internal, "the request failed"),
    }
}

/// The answer to a request refused before any op ran.
fn refused(api: &Api, reply: Reply) -> Response {
    api.handler.refused();
    let code = match &reply {
        Reply::Error { code, .. } => *code,
        _ => ErrorCode::Internal as u16,
    };
    let body = serde_json::to_vec(&prefix_proto::json::reply_json(&reply));
    json_response(status_of(Some(code)), body)
}

fn status_of(code: Option<u16>) -> StatusCode {
    match code.map(|c| ErrorCode::from_u16(c).map_or(500, http_status)) {
        None => StatusCode::OK,
        Some(s) => StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// How the listener runs.
pub struct Listener {
    /// The server's TLS, with ALPN set for HTTP; none to serve plain HTTP
    /// (`--http-plaintext`: HTTP/1.1, and HTTP/2 with prior knowledge).
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Roles of client identities.
    pub roles: Roles,
    /// Connections at once (a budget of the API's own, beside QUIC's); more
    /// are closed at once.
    pub max_connections: usize,
    /// Requests one HTTP/2 connection may have open at once.
    pub max_streams: u32,
    /// Heavy requests one connection may have running.
    pub max_in_flight: usize,
    /// Bounds the wait for a request's headers, and how long a connection
    /// may sit with no request before it is closed.
    pub idle_timeout: Duration,
    /// Bounds a TLS handshake (a request's body is bounded by
    /// [`Api::read_timeout`], the same value).
    pub read_timeout: Duration,
    /// How long a write to the connection may stay blocked on a client
    /// that does not read: past it the connection is closed.
    pub write_timeout: Duration,
    /// A request's body limit (see [`Api::max_body`]). What an answer
    /// leaves unread of a body is read on and dropped, up to twice this
    /// and within `read_timeout`, so that a client still sending reads the
    /// answer: HTTP/1.1 as its connection closes, HTTP/2 on the stream (see
    /// `linger.rs`).
    pub max_body: usize,
    /// Counts connections.
    pub metrics: Arc<Metrics>,
}

/// The server's rustls configuration with HTTP's ALPN instead of QUIC's.
pub fn http_tls(mut tls: rustls::ServerConfig) -> rustls::ServerConfig {
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tls
}

/// Accepts connections until `token` is cancelled; then stops listening
/// and lets each connection finish the requests it has (closing it once
/// idle), until `hard` is cancelled, which drops them.
pub async fn serve(
    socket: TcpListener,
    l: Listener,
    app: Router,
    token: CancellationToken,
    hard: CancellationToken,
    tracker: TaskTracker,
) {
    let acceptor = l.tls.clone().map(tokio_rustls::TlsAcceptor::from);
    let open = Arc::new(Semaphore::new(l.max_connections));
    let l = Arc::new(l);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = token.cancelled() => break,
            a = socket.accept() => a,
        };
        let (tcp, remote) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors, most likely: wait for some to close.
                tracing::warn!(error = %e, "HTTP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = open.clone().try_acquire_owned() else {
            l.metrics.connections_refused.inc();
            tracing::warn!(%remote, max = l.max_connections, "refusing an HTTP connection: max-connections reached");
            continue;
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, app, l) = (acceptor.clone(), app.clone(), l.clone());
        let (token, hard) = (token.clone(), hard.clone());
        tracker.spawn(async move {
            let _permit = permit;
            serve_one(tcp, remote, acceptor, app, &l, token, hard).await;
        });
    }
    // No new connections: the socket closes here, so clients are refused
    // rather than left in the backlog.
    drop(socket);
}

/// A connection's bytes, with TLS or without.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// Which HTTP a connection speaks.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Speaks {
    /// HTTP/1.1, as ALPN chose.
    Http1,
    /// HTTP/2, as ALPN chose.
    Http2,
    /// Either, told by the client's first bytes (plain HTTP: HTTP/2 with
    /// prior knowledge, as gRPC clients speak it, or HTTP/1.1).
    Either,
}

async fn serve_one(
    tcp: tokio::net::TcpStream,
    remote: SocketAddr,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    app: Router,
    l: &Listener,
    token: CancellationToken,
    hard: CancellationToken,
) {
    let (io, certs, speaks): (Box<dyn Io>, _, _) = match acceptor {
        None => (Box::new(tcp), None, Speaks::Either),
        Some(acceptor) => {
            let handshake = tokio::time::timeout(l.read_timeout, acceptor.accept(tcp));
            let tls = tokio::select! {
                _ = token.cancelled() => return,
                h = handshake => match h {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        l.metrics.handshakes_failed.inc();
                        let reason = e.to_string();
                        match prefix_client::pem::explain_handshake(&reason) {
                            Some(why) => tracing::warn!(%remote, %reason, "an HTTP client's handshake failed: {why}"),
                            None => tracing::debug!(%remote, %reason, "HTTP handshake failed"),
                        }
                        return;
                    }
                    Err(_) => {
                        l.metrics.handshakes_failed.inc();
                        return;
                    }
                },
            };
            let certs = tls.get_ref().1.peer_certificates().map(<[_]>::to_vec);
            let speaks = match tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                true => Speaks::Http2,
                false => Speaks::Http1,
            };
            (Box::new(tls), certs, speaks)
        }
    };
    let access = l.roles.access(certs.as_deref());
    if let Access::Denied(who) = &access {
        tracing::warn!(%remote, client = %who, "an HTTP client with no role connected; its requests will be refused");
    }
    let conn = Arc::new(Conn {
        access,
        heavy: Arc::new(Semaphore::new(l.max_in_flight)),
        busy: Default::default(),
        last: parking_lot::Mutex::new(std::time::Instant::now()),
    });
    l.metrics.connections_accepted.inc();
    l.metrics.connections.inc();
    // A client that stops reading its answers would hold the connection
    // (and the answer) for as long as it likes.
    let mut io = tokio_io_timeout::TimeoutStream::new(io);
    io.set_write_timeout(Some(l.write_timeout));
    let linger = Budget {
        bytes: l.max_body.saturating_mul(2),
        time: l.read_timeout,
    };
    let io = Lingering::new(Box::pin(io), linger, token.clone());
    let (unread, stop) = (io.unread(), token.clone());
    let for_requests = conn.clone();
    let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
        let conn = for_requests.clone();
        let (unread, stop) = (unread.clone(), stop.clone());
        let http1 = req.version() < Version::HTTP_2;
        let (mut parts, body) = req.into_parts();
        let body = Followed::new(body);
        let left = body.left.clone();
        parts.extensions.insert(conn.clone());
        let call = app.clone().call(hyper::Request::from_parts(parts, body));
        async move {
            let _busy = Busy::new(&conn);
            let mut response = call.await?;
            // A body left unread (refused, late, or not wanted) is still
            // on the wire. Its rest is read and dropped (see `linger.rs`)
            // so that a client still sending reads the answer, unless the
            // client stopped sending (408).
            // Relaxed: set by this request's own future, which is done.
            if !left.ended.load(Ordering::Relaxed) {
                let read_on = response.status() != StatusCode::REQUEST_TIMEOUT;
                if http1 {
                    // The connection cannot carry another request: the
                    // answer says it closes rather than leaving the
                    // client's next request to fail, and the close
                    // lingers. Relaxed: read by the close, on this
                    // connection's task.
                    unread.store(read_on, Ordering::Relaxed);
                    response
                        .headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                } else if let Some(body) = left.body.lock().take().filter(|_| read_on) {
                    // Only the stream ends, once both sides are done,
                    // rather than being reset under a client still
                    // sending (which some clients, as curl, take for a
                    // failed request, answer and all).
                    tokio::spawn(crate::linger::drain(body, linger, stop));
                }
            }
            Ok::<_, std::convert::Infallible>(response)
        }
    });
    // Over TLS the protocol is the one ALPN chose: no sniffing of a preface
    // that a silent client would never send. Plain HTTP has no ALPN: the
    // client's first bytes tell (a silent one is closed when idle).
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder = match speaks {
        Speaks::Http2 => builder.http2_only(),
        Speaks::Http1 => builder.http1_only(),
        Speaks::Either => builder,
    };
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(l.idle_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(l.max_streams)
        .keep_alive_interval(l.idle_timeout / 2)
        .keep_alive_timeout(l.idle_timeout / 2);
    let served = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(served);
    let mut closing = false;
    let mut tick = tokio::time::interval(l.idle_timeout / 4);
    let result = loop {
        tokio::select! {
            r = served.as_mut() => break r,
            _ = token.cancelled(), if !closing => {
                closing = true;
                served.as_mut().graceful_shutdown();
            }
            _ = hard.cancelled() => break Ok(()),
            _ = tick.tick(), if !closing => {
                // Relaxed: a request that starts meanwhile is answered
                // before the graceful shutdown closes the connection.
                let idle = conn.busy.load(Ordering::Relaxed) == 0
                    && conn.last.lock().elapsed() >= l.idle_timeout;
                if idle {
                    closing = true;
                    served.as_mut().graceful_shutdown();
                }
            }
        }
    };
    if let Err(e) = result {
        tracing::debug!(%remote, error = %e, "HTTP connection ended");
    }
    l.metrics.connections.dec();
}

/// A request's body that notes whether it was read to its end and hands
/// over what an answer left of it.
struct Followed {
    inner: Option<Incoming>,
    left: Arc<Left>,
}

/// What a request left of its body, as its future reads it once it has
/// its answer.
struct Left {
    /// Whether the body was read to its end.
    ended: AtomicBool,
    /// The body, if it was dropped before its end.
    body: parking_lot::Mutex<Option<Incoming>>,
}

impl Followed {
    fn new(inner: Incoming) -> Self {
        let left = Left {
            ended: AtomicBool::new(inner.is_end_stream()),
            body: Default::default(),
        };
        Followed {
            inner: Some(inner),
            left: Arc::new(left),
        }
    }
}

impl Drop for Followed {
    fn drop(&mut self) {
        if let Some(body) = self.inner.take().filter(|b| !b.is_end_stream()) {
            *self.left.body.lock() = Some(body);
        }
    }
}

impl http_body::Body for Followed {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, hyper::Error>>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        let polled = Pin::new(&mut *inner).poll_frame(cx);
        if matches!(polled, Poll::Ready(None)) || inner.is_end_stream() {
            // Relaxed: read by the same request's future (`serve_one`).
            self.left.ended.store(true, Ordering::Relaxed);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Incoming::is_end_stream)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| http_body::SizeHint::with_exact(0), Incoming::size_hint)
    }
}

/// Counts a request as being answered while it lives.
struct Busy<'a>(&'a Conn);

impl<'a> Busy<'a> {
    fn new(conn: &'a Conn) -> Self {
        // Relaxed: read only by the idle timer, which tolerates a late view.
        conn.busy.fetch_add(1, Ordering::Relaxed);
        *conn.last.lock() = std::time::Instant::now();
        Busy(conn)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        *self.0.last.lock() = std::time::Instant::now();
        // Relaxed: see `Busy::new`.
        self.0.busy.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The HTTP status that answers an error code: 4xx for what the request
/// got wrong, 5xx for what the server cannot do now.
pub fn http_status(code: ErrorCode) -> u16 {
    match code {
        ErrorCode::Malformed
        | ErrorCode::BadVersion
        | ErrorCode::UnknownKind
        | ErrorCode::BadName
        | ErrorCode::BadSubscription => 400,
        ErrorCode::Forbidden => 403,
        ErrorCode::FrameTooLarge => 413,
        ErrorCode::KeyTooLong
        | ErrorCode::BatchTooLarge
        | ErrorCode::TooManyCandidates
        | ErrorCode::BadReceipt => 422,
        ErrorCode::TooManyPods | ErrorCode::TooManyModels => 507,
        ErrorCode::IndexFull | ErrorCode::Unavailable | ErrorCode::Cold => 503,
        ErrorCode::Internal => 500,
        ErrorCode::Unsupported => 501,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_code_has_a_client_or_server_status() {
        for code in ErrorCode::ALL {
            let s = http_status(code);
            assert!((400..600).contains(&s), "{code:?}");
            assert_eq!(
                s >= 500,
                matches!(
                    code,
                    ErrorCode::TooManyPods
                        | ErrorCode::TooManyModels
                        | ErrorCode::IndexFull
                        | ErrorCode::Unavailable
                        | ErrorCode::Cold
                        | ErrorCode::Internal
                        | ErrorCode::Unsupported
                )
            );
        }
    }
}
