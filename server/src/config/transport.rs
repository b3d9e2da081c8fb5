//! The transport's settings: the listeners (QUIC, the HTTP/JSON API, the
//! metrics and probes), TLS, connections and their streams, and the
//! shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::value::{
    address_or_off, address_written, duration, duration_or_off, invalid, written_or_off,
    ConfigError, HumanDuration,
};

/// What a user may set of the transport (see [`super::Settings`]).
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct TransportSettings {
    /// QUIC (UDP) address to serve on.
    #[arg(long, env = "PREFIX_INDEX_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// HTTP address for /metrics, /healthz and /readyz; "off" disables it.
    #[arg(long, env = "PREFIX_INDEX_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// TCP address of the HTTP/JSON API (HTTP/1.1 and HTTP/2 over TLS, the
    /// same certificates and roles as QUIC; docs/http.md); "off" disables it.
    #[arg(long, env = "PREFIX_INDEX_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// Serve --http-listen as plain HTTP (HTTP/1.1, and HTTP/2 with prior
    /// knowledge for gRPC), without TLS: only inside a network that
    /// encrypts and authenticates on its own (a service mesh with mutual
    /// TLS). Every client that reaches the port may then read and write;
    /// refused with --client-ca. See docs/operations.md, "Security model".
    #[arg(long, env = "PREFIX_INDEX_HTTP_PLAINTEXT", num_args = 0..=1, default_missing_value = "true")]
    pub http_plaintext: Option<bool>,
    /// PEM certificate chain to serve; with --key. Without both, a
    /// self-signed certificate is made and written to <data-dir>/cert.pem.
    #[arg(long, env = "PREFIX_INDEX_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, env = "PREFIX_INDEX_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// PEM CA certificates: when set, only clients presenting a certificate
    /// signed by one of them may connect (mutual TLS).
    #[arg(long, env = "PREFIX_INDEX_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// Concurrent client connections; more are refused.
    #[arg(long, env = "PREFIX_INDEX_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Concurrent streams per connection.
    #[arg(long, env = "PREFIX_INDEX_MAX_STREAMS")]
    pub max_streams: Option<u32>,
    /// Close connections silent for this long.
    #[arg(long, env = "PREFIX_INDEX_IDLE_TIMEOUT")]
    pub idle_timeout: Option<HumanDuration>,
    /// How long a request may take to arrive once it has begun: an HTTP
    /// request's body after its headers, a QUIC frame after its first byte,
    /// and a TLS handshake on the HTTP listener. Past it the request is
    /// refused and its connection (HTTP) or stream (QUIC) closed.
    #[arg(long, env = "PREFIX_INDEX_READ_TIMEOUT")]
    pub read_timeout: Option<HumanDuration>,
    /// How long an answer may wait for the client to take it: past it a
    /// QUIC stream is reset, an HTTP connection closed.
    #[arg(long, env = "PREFIX_INDEX_WRITE_TIMEOUT")]
    pub write_timeout: Option<HumanDuration>,
    /// Bytes a connection may send ahead of what the server has read (its
    /// QUIC receive window): the memory one connection can make the server
    /// buffer.
    #[arg(long, env = "PREFIX_INDEX_CONNECTION_WINDOW")]
    pub connection_window: Option<u32>,
    /// Keep the workers polling the network for this long after the last
    /// read instead of sleeping: lower latency when requests come one at a
    /// time, for every worker's core at 100% while they come and for this
    /// long after. For servers with cores of their own (see
    /// docs/operations.md); "0s" is off.
    #[arg(long, env = "PREFIX_INDEX_BUSY_POLL")]
    pub busy_poll: Option<HumanDuration>,
    /// On shutdown, how long in-flight requests may take to finish.
    #[arg(long, env = "PREFIX_INDEX_DRAIN_TIMEOUT")]
    pub drain_timeout: Option<HumanDuration>,
    /// On shutdown, past the drain, how long connections get to close and
    /// the server's tasks to end before it stops anyway.
    #[arg(long, env = "PREFIX_INDEX_CLOSE_TIMEOUT")]
    pub close_timeout: Option<HumanDuration>,
}

/// Where the server's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertSource {
    /// PEM files given by the operator.
    Files {
        /// Certificate chain.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
    },
    /// A self-signed certificate for `localhost` and `127.0.0.1`, made once
    /// and kept in the data directory (`cert.pem`, `key.pem`) so clients that
    /// pinned it keep working across restarts.
    SelfSigned,
}

/// The transport a server runs with.
#[derive(Debug, Clone, PartialEq)]
pub struct TransportConfig {
    /// QUIC address. Default `127.0.0.1:7070`: loopback until an operator
    /// decides to expose it.
    pub listen: SocketAddr,
    /// HTTP address for metrics and probes, or none. Default `127.0.0.1:7071`.
    pub metrics_listen: Option<SocketAddr>,
    /// The HTTP/JSON API's address, or none. Default none: QUIC is the fast
    /// path, the HTTP API the convenient one, opened when asked for.
    pub http_listen: Option<SocketAddr>,
    /// Whether the HTTP API is plain HTTP. Default no: TLS with the QUIC
    /// listener's certificate; plain HTTP gives up encryption and client
    /// identities, which only a mesh around the server can stand for.
    pub http_plaintext: bool,
    /// The server certificate. Default: self-signed.
    pub tls: CertSource,
    /// CA bundle for mutual TLS; none means any client may connect.
    pub client_ca: Option<PathBuf>,
    /// Concurrent connections. Default 4,096: a large gateway fleet, each
    /// replica holding one connection, with room for tools.
    pub max_connections: usize,
    /// Concurrent bidirectional streams per connection. Default 64: clients
    /// use a handful of long-lived streams (4 by default).
    pub max_streams: u32,
    /// Idle connections close after this. Default 30 s; clients that are
    /// merely quiet keep the connection alive with QUIC pings.
    pub idle_timeout: Duration,
    /// How long a request may take to arrive once begun (see
    /// [`TransportSettings::read_timeout`]). Default 10 s: a whole frame or
    /// body of the largest size allowed crosses a slow datacenter link in a
    /// fraction of that, and a client that stalls mid-request holds its
    /// connection (and the buffered part) no longer.
    pub read_timeout: Duration,
    /// How long writing an answer may stay blocked on a client that does
    /// not read it (see [`TransportSettings::write_timeout`]). Default 10 s:
    /// the largest answer (16 MiB) crosses a slow link in a fraction of
    /// it, and a client that stops reading holds its answer's memory no
    /// longer.
    pub write_timeout: Duration,
    /// QUIC receive window per connection, in bytes. Default 4 MiB: ample
    /// for loopback and datacenter round trips, and 4,096 connections can
    /// then buffer at most 16 GiB only if every one of them is stalled with a
    /// full window (size it down with `max_connections` on small machines).
    pub connection_window: u32,
    /// Busy polling (see [`crate::BusyPoll`]): how long the workers keep
    /// polling after the last read, or none to let them sleep. Default none:
    /// spinning is worth a core per worker only on machines where wake-ups
    /// are slow (virtual machines) and the cores are the server's alone.
    pub busy_poll: Option<Duration>,
    /// Time allowed for in-flight requests at shutdown. Default 5 s.
    pub drain_timeout: Duration,
    /// Time allowed, past the drain, for connections to close and tasks to
    /// end. Default 1 s: a QUIC close needs one round trip, and what a
    /// connection still sends then is dropped anyway.
    pub close_timeout: Duration,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 7071))),
            http_listen: None,
            http_plaintext: false,
            tls: CertSource::SelfSigned,
            client_ca: None,
            max_connections: 4096,
            max_streams: 64,
            idle_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
            connection_window: 4 << 20,
            busy_poll: None,
            drain_timeout: Duration::from_secs(5),
            close_timeout: Duration::from_secs(1),
        }
    }
}

impl TransportSettings {
    /// The transport these settings describe, defaults filled in.
    pub fn resolve(self) -> Result<TransportConfig, ConfigError> {
        let d = TransportConfig::default();
        Ok(TransportConfig {
            listen: self.listen.unwrap_or(d.listen),
            metrics_listen: address_or_off(
                "metrics-listen",
                self.metrics_listen.as_deref(),
                d.metrics_listen,
            )?,
            http_listen: address_or_off("http-listen", self.http_listen.as_deref(), d.http_listen)?,
            http_plaintext: self.http_plaintext.unwrap_or(d.http_plaintext),
            tls: match (self.cert, self.key) {
                (Some(cert), Some(key)) => CertSource::Files { cert, key },
                _ => CertSource::SelfSigned,
            },
            client_ca: self.client_ca,
            max_connections: self.max_connections.unwrap_or(d.max_connections),
            max_streams: self.max_streams.unwrap_or(d.max_streams),
            idle_timeout: duration(self.idle_timeout, d.idle_timeout),
            read_timeout: duration(self.read_timeout, d.read_timeout),
            write_timeout: duration(self.write_timeout, d.write_timeout),
            connection_window: self.connection_window.unwrap_or(d.connection_window),
            busy_poll: duration_or_off(self.busy_poll, d.busy_poll),
            drain_timeout: duration(self.drain_timeout, d.drain_timeout),
            close_timeout: duration(self.close_timeout, d.close_timeout),
        })
    }
}

impl From<&TransportConfig> for TransportSettings {
    fn from(c: &TransportConfig) -> Self {
        let (cert, key) = match &c.tls {
            CertSource::Files { cert, key } => (Some(cert.clone()), Some(key.clone())),
            CertSource::SelfSigned => (None, None),
        };
        TransportSettings {
            listen: Some(c.listen),
            metrics_listen: address_written(c.metrics_listen),
            http_listen: address_written(c.http_listen),
            http_plaintext: Some(c.http_plaintext),
            cert,
            key,
            client_ca: c.client_ca.clone(),
            max_connections: Some(c.max_connections),
            max_streams: Some(c.max_streams),
            idle_timeout: Some(HumanDuration(c.idle_timeout)),
            read_timeout: Some(HumanDuration(c.read_timeout)),
            write_timeout: Some(HumanDuration(c.write_timeout)),
            connection_window: Some(c.connection_window),
            busy_poll: written_or_off(c.busy_poll),
            drain_timeout: Some(HumanDuration(c.drain_timeout)),
            close_timeout: Some(HumanDuration(c.close_timeout)),
        }
    }
}

impl TransportConfig {
    /// Checks every value's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_connections == 0 || self.max_streams == 0 {
            return invalid("max-connections/max-streams", &0, "must be at least 1");
        }
        if self.idle_timeout < Duration::from_secs(1) {
            return invalid(
                "idle-timeout",
                &format!("{:?}", self.idle_timeout),
                "must be at least 1s",
            );
        }
        for (name, value) in [
            ("read-timeout", self.read_timeout),
            ("write-timeout", self.write_timeout),
        ] {
            if value < Duration::from_millis(100) {
                return invalid(name, &format!("{value:?}"), "must be at least 100ms");
            }
        }
        if self.http_plaintext && self.client_ca.is_some() {
            return invalid(
                "http-plaintext",
                &true,
                "cannot serve plain HTTP beside --client-ca: a plain connection carries no \
                 client certificate, so roles could not be told",
            );
        }
        if self.connection_window < 65_536 {
            return invalid(
                "connection-window",
                &self.connection_window,
                "must be at least 65536",
            );
        }
        Ok(())
    }
}
