//! [`Client`]: one server, many requests in flight, short deadlines,
//! reconnection in the background. Its route is [`Server`]; its operations
//! are [`Index`]'s.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::conn::Conn;
use crate::error::{ClientError, ConnectError};
use crate::index::{Index, Route};
use crate::tls::TlsConfig;
use crate::wire::{self, Limits, Op, Reply, Request, Response};

/// How a [`Client`] connects and how long it waits.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// What to trust and present.
    pub tls: TlsConfig,
    /// The name the server's certificate must carry. Default `localhost`,
    /// which the server's self-signed certificate holds.
    pub server_name: String,
    /// How long each call waits for its answer. Default 2 ms: a gateway that
    /// does not hear back in time routes on load alone rather than add
    /// latency to the request it is placing.
    pub deadline: Duration,
    /// How long [`Client::connect`] and each reconnection attempt may take.
    /// Default 5 s.
    pub connect_timeout: Duration,
    /// First pause before reconnecting after a failure; doubles per failed
    /// attempt. Default 20 ms, so a restarted server is found quickly.
    pub backoff_min: Duration,
    /// Longest pause between reconnection attempts. Default 2 s.
    pub backoff_max: Duration,
    /// Long-lived QUIC streams per connection. Default 1: every frame
    /// queued while a write is under way goes out in the next write, so one
    /// stream batches best (`docs/benchmarks.md`, "Why long-lived streams",
    /// compares the counts). The server answers heavy frames out of order,
    /// so one stream has no head-of-line blocking on the server side.
    pub streams: usize,
    /// Frames that may wait for each stream's writer. Default 4,096; past it
    /// calls fail at once with `Unavailable`.
    pub queue: usize,
    /// Limits checked before sending (the server checks its own too).
    pub limits: Limits,
    /// How long the connection lasts with no answer from the server (the
    /// client pings four times within it, and at least every 5 s): a killed
    /// or cut-off server is found gone this long after it went, and
    /// reconnection begins. The server's own idle timeout (30 s by default)
    /// bounds it from above; zero leaves it to the server's; values below
    /// [`crate::MIN_IDLE_TIMEOUT`] (100 ms) count as that. Default 5 s
    /// ([`crate::DEFAULT_IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            tls: TlsConfig::default(),
            server_name: "localhost".into(),
            deadline: Duration::from_millis(2),
            connect_timeout: Duration::from_secs(5),
            backoff_min: Duration::from_millis(20),
            backoff_max: Duration::from_secs(2),
            streams: 1,
            queue: 4096,
            limits: Limits::default(),
            idle_timeout: crate::DEFAULT_IDLE_TIMEOUT,
        }
    }
}

/// Where a server is: an address, or a `host:port` name resolved again before
/// every connection attempt, so that a server back at another address (a
/// Kubernetes pod keeps its name across restarts, not its IP) is found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerAddr {
    /// A fixed address.
    Addr(SocketAddr),
    /// A `host:port` name.
    Name(String),
}

impl From<SocketAddr> for ServerAddr {
    fn from(addr: SocketAddr) -> Self {
        ServerAddr::Addr(addr)
    }
}

impl From<&str> for ServerAddr {
    /// An address if it is one (`10.0.0.5:7070`, `[::1]:7070`), else a name.
    fn from(s: &str) -> Self {
        s.parse()
            .map_or_else(|_| ServerAddr::Name(s.into()), ServerAddr::Addr)
    }
}

impl From<String> for ServerAddr {
    fn from(s: String) -> Self {
        ServerAddr::from(s.as_str())
    }
}

impl std::fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerAddr::Addr(a) => a.fmt(f),
            ServerAddr::Name(n) => f.write_str(n),
        }
    }
}

enum State {
    Up(Arc<Conn>),
    Down { reason: String },
}

struct Inner {
    target: ServerAddr,
    /// The address last connected to or tried (for a name: unspecified, with
    /// no port, until it first resolves).
    addr: Mutex<SocketAddr>,
    cfg: ClientConfig,
    endpoint: quinn::Endpoint,
    state: Mutex<State>,
    /// Wakes the reconnect task when a connection is found dead.
    wake: Arc<tokio::sync::Notify>,
}

/// A connection to one prefix-index server, shared by every task of a
/// gateway: clones are cheap and share the connection. Its operations
/// (`lookup`, `insert`, ...) are [`Index`]'s.
///
/// Each call waits at most its deadline. While the server is unreachable,
/// calls fail at once with [`ClientError::Disconnected`] and a background task
/// reconnects with exponential backoff. Requires a tokio runtime.
pub type Client = Index<Server>;

/// A [`Client`]'s route: every operation to one server, over one
/// connection, within the client's deadline.
#[derive(Clone)]
pub struct Server {
    inner: Arc<Inner>,
    deadline: Duration,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("server", &self.inner.target)
            .field("deadline", &self.deadline)
            .finish()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let State::Up(conn) = &*self.state.lock() {
            conn.close();
        }
    }
}

impl Client {
    /// Connects to `server` (an address, or a `host:port` name resolved
    /// again before every reconnection), waiting up to `connect_timeout` for
    /// the first connection.
    pub async fn connect(
        server: impl Into<ServerAddr>,
        cfg: ClientConfig,
    ) -> Result<Client, ConnectError> {
        let inner = Inner::new(server.into(), cfg)?;
        let conn = inner.dial().await?;
        *inner.state.lock() = State::Up(conn);
        Ok(Client::spawn(inner))
    }

    /// A client that connects in the background: calls fail with
    /// [`ClientError::Disconnected`] until the server is reached. For gateways
    /// that must start while the index server is down.
    pub fn start(server: impl Into<ServerAddr>, cfg: ClientConfig) -> Result<Client, ConnectError> {
        let inner = Inner::new(server.into(), cfg)?;
        *inner.state.lock() = State::Down {
            reason: "connecting".into(),
        };
        let client = Client::spawn(inner);
        client.route.inner.wake.notify_one();
        Ok(client)
    }

    fn spawn(inner: Inner) -> Client {
        let deadline = inner.cfg.deadline;
        let inner = Arc::new(inner);
        tokio::spawn(reconnect(Arc::downgrade(&inner), inner.wake.clone()));
        Index::new(Server { inner, deadline })
    }

    /// The server's address (for a name, the one last connected to or
    /// tried).
    pub fn addr(&self) -> SocketAddr {
        *self.route.inner.addr.lock()
    }

    /// The server as given: an address or a name.
    pub fn server(&self) -> &ServerAddr {
        &self.route.inner.target
    }

    /// How long each call waits for its answer.
    pub fn deadline(&self) -> Duration {
        self.route.deadline
    }

    /// The limits this client sends under.
    pub fn limits(&self) -> &Limits {
        &self.route.inner.cfg.limits
    }

    /// Checks `op` against the limits this client sends under.
    pub fn check(&self, op: &Op) -> Result<(), ClientError> {
        Ok(self.route.inner.cfg.limits.check_op(op)?)
    }

    /// This client with another per-call deadline (sharing the connection).
    pub fn with_deadline(&self, deadline: Duration) -> Client {
        Index::new(Server {
            inner: self.route.inner.clone(),
            deadline,
        })
    }

    /// Closes the connection politely and waits (up to a second) until the
    /// server has been told, so it frees the connection at once. Calls on
    /// any clone fail afterwards until the background task reconnects; use
    /// it when the process is about to exit.
    pub async fn close(&self) {
        if let State::Up(conn) = &*self.route.inner.state.lock() {
            conn.close();
        }
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            self.route.inner.endpoint.wait_idle(),
        )
        .await;
    }

    /// Whether a connection is up right now.
    pub fn is_connected(&self) -> bool {
        matches!(&*self.route.inner.state.lock(), State::Up(c) if !c.is_dead())
    }

    /// The server's snapshot: its whole index in the snapshot file's format
    /// (`prefix_index::Snapshot::parse` reads and checks it), taken on a
    /// stream of its own within `timeout` (not the call deadline: a large
    /// index takes seconds). At most `max_bytes` are accepted. When the
    /// server has roles, it needs a writer or peer certificate.
    pub async fn snapshot(
        &self,
        max_bytes: u64,
        timeout: Duration,
    ) -> Result<Vec<u8>, ClientError> {
        let conn = self.route.inner.conn()?;
        tokio::time::timeout(timeout, conn.snapshot(max_bytes))
            .await
            .map_err(|_| ClientError::Timeout(timeout))?
    }

    /// Sends one request and waits for its answer until the deadline.
    pub async fn call(&self, request: Request) -> Result<Response, ClientError> {
        self.route.call(request).await
    }
}

impl Server {
    /// Sends one request and waits for its answer until the deadline.
    async fn call(&self, request: Request) -> Result<Response, ClientError> {
        let limits = &self.inner.cfg.limits;
        match &request {
            Request::One(op) => limits.check_op(op)?,
            Request::Batch(ops) => {
                if ops.len() > limits.max_batch {
                    return Err(wire::WireError::BatchTooLarge {
                        len: ops.len(),
                        max: limits.max_batch,
                    }
                    .into());
                }
                // Ops are not checked one by one: the server answers a bad op
                // with its own error and still applies the others.
            }
        }
        let conn = self.inner.conn()?;
        let id = conn.next_id();
        let mut frame = Vec::new();
        wire::encode_request(id, &request, &mut frame);
        let len = frame.len() - wire::HEADER_LEN;
        if len > limits.max_frame_bytes as usize {
            return Err(wire::WireError::FrameTooLarge {
                len: u32::try_from(len).unwrap_or(u32::MAX),
                max: limits.max_frame_bytes,
            }
            .into());
        }
        let mut ticket = conn.send(id, frame)?;
        let answer = tokio::time::timeout(self.deadline, &mut ticket.answer).await;
        match answer {
            Ok(Ok(answer)) => answer,
            // The lane dropped our sender: the connection died under us.
            Ok(Err(_)) => Err(conn.disconnected()),
            Err(_) => {
                conn.abandon(&ticket);
                Err(ClientError::Timeout(self.deadline))
            }
        }
    }
}

impl Route for Server {
    async fn one(&self, op: Op) -> Result<Reply, ClientError> {
        match self.call(Request::One(op)).await? {
            Response::One(Reply::Error { code, message }) => {
                Err(ClientError::Server { code, message })
            }
            Response::One(reply) => Ok(reply),
            other => Err(ClientError::Protocol(format!(
                "expected one reply, got {other:?}"
            ))),
        }
    }

    /// Every op in one frame, applied by the server in order.
    async fn batch(&self, ops: Vec<Op>) -> Result<Vec<Reply>, ClientError> {
        let n = ops.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        match self.call(Request::Batch(ops)).await? {
            Response::Batch(replies) if replies.len() == n => Ok(replies),
            other => Err(ClientError::Protocol(format!(
                "expected {n} batch replies, got {other:?}"
            ))),
        }
    }
}

impl Inner {
    fn new(target: ServerAddr, cfg: ClientConfig) -> Result<Inner, ConnectError> {
        let quic = cfg.tls.quic_config_with_idle(cfg.idle_timeout)?;
        let v4: SocketAddr = (Ipv4Addr::UNSPECIFIED, 0).into();
        let v6: SocketAddr = (Ipv6Addr::UNSPECIFIED, 0).into();
        let (mut endpoint, addr) = match &target {
            ServerAddr::Addr(a) if a.is_ipv4() => (quinn::Endpoint::client(v4)?, *a),
            ServerAddr::Addr(a) => (quinn::Endpoint::client(v6)?, *a),
            // A name may resolve to either family: a dual-stack socket
            // reaches both (quinn maps IPv4 addresses), where the host has
            // IPv6 at all.
            ServerAddr::Name(_) => match quinn::Endpoint::client(v6) {
                Ok(e) => (e, v6),
                Err(_) => (quinn::Endpoint::client(v4)?, v4),
            },
        };
        endpoint.set_default_client_config(quic);
        Ok(Inner {
            target,
            addr: Mutex::new(addr),
            cfg,
            endpoint,
            state: Mutex::new(State::Down {
                reason: "not connected yet".into(),
            }),
            wake: Arc::default(),
        })
    }

    /// The live connection, or why there is none. A dead one found here is
    /// swapped out and the reconnect task woken.
    fn conn(&self) -> Result<Arc<Conn>, ClientError> {
        let mut state = self.state.lock();
        match &*state {
            State::Up(conn) if !conn.is_dead() => Ok(conn.clone()),
            State::Up(conn) => {
                let err = conn.disconnected();
                *state = State::Down {
                    reason: conn.reason(),
                };
                self.wake.notify_one();
                Err(err)
            }
            State::Down { reason } => Err(ClientError::Disconnected {
                addr: *self.addr.lock(),
                reason: reason.clone(),
            }),
        }
    }

    /// One connection attempt (a name resolved first), bounded by
    /// `connect_timeout`.
    async fn dial(&self) -> Result<Arc<Conn>, ConnectError> {
        let refused = |addr, reason: String| ConnectError::Refused { addr, reason };
        let attempt = async {
            let addr = match &self.target {
                ServerAddr::Addr(a) => *a,
                ServerAddr::Name(name) => {
                    let found = tokio::net::lookup_host(name.as_str()).await;
                    let tried = *self.addr.lock();
                    let addr = found
                        .map_err(|e| refused(tried, format!("{name}: {e}")))?
                        .next()
                        .ok_or_else(|| refused(tried, format!("{name} resolves to no address")))?;
                    *self.addr.lock() = addr;
                    addr
                }
            };
            let connecting = self
                .endpoint
                .connect(addr, &self.cfg.server_name)
                .map_err(|e| refused(addr, e.to_string()))?;
            let quic = connecting
                .await
                .map_err(|e| refused(addr, crate::tls::describe_close(&e)))?;
            Conn::start(quic, addr, self.cfg.streams, self.cfg.queue)
                .await
                .map_err(|e| refused(addr, crate::tls::describe_close(&e)))
        };
        tokio::time::timeout(self.cfg.connect_timeout, attempt)
            .await
            .map_err(|_| ConnectError::Timeout {
                addr: *self.addr.lock(),
                timeout: self.cfg.connect_timeout,
            })?
    }
}

/// Background task: whenever the connection is down, reconnect with
/// exponential backoff. Ends when the last [`Client`] clone is dropped.
async fn reconnect(inner: Weak<Inner>, wake: Arc<tokio::sync::Notify>) {
    loop {
        // Wait until woken, but also look every second: a connection can die
        // without any call noticing (an idle client whose server restarted),
        // and the client may have been dropped.
        let _ = tokio::time::timeout(Duration::from_secs(1), wake.notified()).await;
        let Some(me) = inner.upgrade() else { return };
        let down = match &*me.state.lock() {
            State::Up(conn) => conn.is_dead(),
            State::Down { .. } => true,
        };
        if !down {
            continue;
        }
        let mut backoff = me.cfg.backoff_min;
        let mut first = true;
        drop(me);
        loop {
            if !first {
                tokio::time::sleep(backoff).await;
            }
            let Some(me) = inner.upgrade() else { return };
            let started = Instant::now();
            match me.dial().await {
                Ok(conn) => {
                    tracing::info!(server = %me.target, addr = %me.addr.lock(), "connected");
                    *me.state.lock() = State::Up(conn);
                    break;
                }
                Err(e) => {
                    tracing::debug!(server = %me.target, error = %e, elapsed = ?started.elapsed(), "reconnect failed");
                    *me.state.lock() = State::Down {
                        reason: e.to_string(),
                    };
                    if !first {
                        backoff = (backoff * 2).min(me.cfg.backoff_max);
                    }
                    first = false;
                }
            }
        }
    }
}
