//! The HTTP/JSON API: the protocol's operations for gateways without QUIC.
//!
//! One route per operation of the table ([`route`]), plus `/v1/batch`;
//! bodies and answers are the JSON objects of [`prefix_proto::json`], keys
//! given as hashes, token ids or text (hashed here with the server's block
//! sizes). Every request goes through the same [`Handler`] as a QUIC frame:
//! the same limits, roles, metrics and answers. HTTP/1.1 and HTTP/2 (by
//! ALPN) over TLS with the QUIC listener's certificate and client CA; a
//! client certificate's role is read once per connection.
//!
//! Statuses: 200 with the answer; an op's error answers its error object
//! with the status [`http_status`] gives its code (a batch answers 200 with
//! one object per op, unless the batch itself is refused). A body over
//! `http_max_body_bytes` is refused (413, `frame_too_large`) before it is
//! parsed; one that does not parse answers 400 `malformed`. Nothing refused
//! reaches the index.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, MethodRouter};
use axum::{Extension, Router};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use prefix_proto::json::{error_json, http_status, parse_batch, JsonOp, KeyOptions};
use prefix_proto::{ErrorCode, OpKind, Reply, Request};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::Service as _;

use crate::access::{Access, Roles};
use crate::handler::Handler;
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
}

/// One connection's client, as its TLS handshake named it, and its share
/// of the blocking pool.
struct Conn {
    access: Access,
    /// Heavy requests running at once (`--max-in-flight`): an HTTP/2
    /// connection multiplexes requests as a QUIC one does.
    heavy: Semaphore,
}

/// The routes.
pub fn router(api: Arc<Api>) -> Router {
    let max_body = api.max_body;
    let mut app = Router::new();
    for kind in OpKind::ALL {
        let (method, path) = route(kind);
        let handler = move |State(api): State<Arc<Api>>,
                            Extension(conn): Extension<Arc<Conn>>,
                            body: Result<Bytes, BytesRejection>| async move {
            let request = body.map_err(|r| refusal(r, api.max_body)).and_then(|body| {
                let body: &[u8] = if method == Method::GET && body.is_empty() {
                    b"{}"
                } else {
                    &body
                };
                JsonOp::parse_as(kind, body)
                    .and_then(|op| op.to_op(&api.keys))
                    .map(Request::One)
                    .map_err(|e| e.to_reply())
            });
            answer(&api, &conn, request).await
        };
        let on: MethodRouter<Arc<Api>> = if route(kind).0 == Method::GET {
            get(handler)
        } else {
            post(handler)
        };
        app = app.route(path, on);
    }
    let batch = |State(api): State<Arc<Api>>,
                 Extension(conn): Extension<Arc<Conn>>,
                 body: Result<Bytes, BytesRejection>| async move {
        let max = api.handler.limits.max_batch;
        let request = body
            .map_err(|r| refusal(r, api.max_body))
            .and_then(|body| parse_batch(&body, &api.keys, max));
        answer(&api, &conn, request).await
    };
    app.route(BATCH_PATH, post(batch))
        .fallback(|| async { not_found(StatusCode::NOT_FOUND, "no such path") })
        .method_not_allowed_fallback(|| async {
            not_found(
                StatusCode::METHOD_NOT_ALLOWED,
                "this path takes another method",
            )
        })
        .layer(DefaultBodyLimit::max(max_body))
        .with_state(api)
}

/// A body that could not be read: too large, or cut.
fn refusal(r: BytesRejection, max_body: usize) -> Reply {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        ErrorCode::FrameTooLarge.reply(format!("the body exceeds http-max-body-bytes = {max_body}"))
    } else {
        ErrorCode::Malformed.reply(r.body_text())
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
    let message = format!("{what}; the API is {}", paths.join(", "));
    json_response(status, serde_json::to_vec(&error_json(None, &message)))
}

fn json_response(status: StatusCode, body: serde_json::Result<Vec<u8>>) -> Response {
    let body = body.unwrap_or_else(|_| br#"{"ok":false}"#.to_vec());
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// Applies a parsed request (on the blocking pool when it is heavy) and
/// answers it.
async fn answer(api: &Arc<Api>, conn: &Arc<Conn>, request: Result<Request, Reply>) -> Response {
    let request = match request {
        Ok(r) => r,
        Err(refused) => {
            api.handler.refused();
            let code = match &refused {
                Reply::Error { code, .. } => *code,
                _ => ErrorCode::Internal as u16,
            };
            let body = serde_json::to_vec(&prefix_proto::json::reply_json(&refused));
            return json_response(status_of(Some(code)), body);
        }
    };
    let mut out = Vec::new();
    let code = if api.handler.is_heavy(&request) {
        let Ok(_permit) = conn.heavy.acquire().await else {
            return json_response(
                status_of(Some(ErrorCode::Unavailable as u16)),
                serde_json::to_vec(&error_json(
                    Some(ErrorCode::Unavailable as u16),
                    "shutting down",
                )),
            );
        };
        let (api, conn) = (api.clone(), conn.clone());
        let ran = tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let code = api.handler.serve_json(&request, &conn.access, &mut out);
            (code, out)
        })
        .await;
        match ran {
            Ok((code, body)) => {
                out = body;
                code
            }
            Err(_) => {
                let code = ErrorCode::Internal as u16;
                out = serde_json::to_vec(&error_json(Some(code), "the request failed"))
                    .unwrap_or_default();
                Some(code)
            }
        }
    } else {
        api.handler.serve_json(&request, &conn.access, &mut out)
    };
    json_response(status_of(code), Ok(out))
}

fn status_of(code: Option<u16>) -> StatusCode {
    match code.map(|c| ErrorCode::from_u16(c).map_or(500, http_status)) {
        None => StatusCode::OK,
        Some(s) => StatusCode::from_u16(s).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
    }
}

/// How the listener runs.
pub struct Listener {
    /// The bound socket.
    pub socket: TcpListener,
    /// The server's TLS, with ALPN set for HTTP.
    pub tls: Arc<rustls::ServerConfig>,
    /// Roles of client identities.
    pub roles: Roles,
    /// Connections at once; more are closed at once.
    pub max_connections: usize,
    /// Heavy requests one connection may have running.
    pub max_in_flight: usize,
    /// Bounds a TLS handshake and the wait for a request's headers.
    pub idle_timeout: Duration,
    /// Counts connections.
    pub metrics: Arc<Metrics>,
}

/// The server's rustls configuration with HTTP's ALPN instead of QUIC's.
pub fn http_tls(mut tls: rustls::ServerConfig) -> rustls::ServerConfig {
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tls
}

/// Accepts connections until `token` is cancelled, then lets the requests
/// in flight finish (each connection closes once idle).
pub async fn serve(l: Listener, app: Router, token: CancellationToken, tracker: TaskTracker) {
    let acceptor = tokio_rustls::TlsAcceptor::from(l.tls.clone());
    let open = Arc::new(Semaphore::new(l.max_connections));
    let graceful = GracefulShutdown::new();
    let l = Arc::new(l);
    loop {
        let accepted = tokio::select! {
            biased;
            _ = token.cancelled() => break,
            a = l.socket.accept() => a,
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
        let (acceptor, app, l, watcher) =
            (acceptor.clone(), app.clone(), l.clone(), graceful.watcher());
        tracker.spawn(async move {
            let _permit = permit;
            serve_one(tcp, remote, acceptor, app, &l, watcher).await;
        });
    }
    graceful.shutdown().await;
}

async fn serve_one(
    tcp: tokio::net::TcpStream,
    remote: SocketAddr,
    acceptor: tokio_rustls::TlsAcceptor,
    app: Router,
    l: &Listener,
    watcher: hyper_util::server::graceful::Watcher,
) {
    let tls = match tokio::time::timeout(l.idle_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            l.metrics.handshakes_failed.inc();
            let reason = e.to_string();
            match prefix_proto::tls::explain_handshake(&reason) {
                Some(why) => {
                    tracing::warn!(%remote, %reason, "an HTTP client's handshake failed: {why}")
                }
                None => tracing::debug!(%remote, %reason, "HTTP handshake failed"),
            }
            return;
        }
        Err(_) => {
            l.metrics.handshakes_failed.inc();
            return;
        }
    };
    let certs = tls.get_ref().1.peer_certificates().map(<[_]>::to_vec);
    let access = l.roles.access(certs.as_deref());
    if let Access::Denied(who) = &access {
        tracing::warn!(%remote, client = %who, "an HTTP client with no role connected; its requests will be refused");
    }
    let conn = Arc::new(Conn {
        access,
        heavy: Semaphore::new(l.max_in_flight),
    });
    l.metrics.connections_accepted.inc();
    l.metrics.connections.inc();
    let service =
        hyper::service::service_fn(move |mut req: hyper::Request<hyper::body::Incoming>| {
            req.extensions_mut().insert(conn.clone());
            app.clone().call(req)
        });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(l.idle_timeout);
    let served = watcher
        .watch(
            builder
                .serve_connection(TokioIo::new(tls), service)
                .into_owned(),
        )
        .await;
    if let Err(e) = served {
        tracing::debug!(%remote, error = %e, "HTTP connection ended");
    }
    l.metrics.connections.dec();
}
