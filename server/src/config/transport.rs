//! The transport's settings: the listeners (QUIC, the HTTP/JSON API, the
//! metrics and probes), TLS, connections and their streams, and the
//! shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::declare::{address_or_off, duration, duration_or_off, optional, plain, settings};
use super::value::{invalid, ConfigError, HumanDuration};

settings! {
    /// What a user may set of the transport (see [`super::Settings`]).
    pub struct TransportSettings {
        /// QUIC (UDP) address to serve on.
        #[arg(long, env = "PREFIX_INDEX_LISTEN")]
        listen: SocketAddr = plain => transport.listen,
        /// HTTP address for /metrics, /healthz and /readyz; "off" disables it.
        #[arg(long, env = "PREFIX_INDEX_METRICS_LISTEN")]
        metrics_listen: String = address_or_off => transport.metrics_listen,
        /// TCP address of the HTTP/JSON API (HTTP/1.1 and HTTP/2 over TLS, the
        /// same certificates and roles as QUIC; docs/http.md); "off" disables it.
        #[arg(long, env = "PREFIX_INDEX_HTTP_LISTEN")]
        http_listen: String = address_or_off => transport.http_listen,
        /// Serve --http-listen as plain HTTP (HTTP/1.1, and HTTP/2 with prior
        /// knowledge for gRPC), without TLS: only inside a network that
        /// encrypts and authenticates on its own (a service mesh with mutual
        /// TLS). Every client that reaches the port may then read and write;
        /// refused with --client-ca. See docs/operations.md, "Security model".
        #[arg(
            long,
            env = "PREFIX_INDEX_HTTP_PLAINTEXT",
            num_args = 0..=1,
            default_missing_value = "true"
        )]
        http_plaintext: bool = plain => transport.http_plaintext,
        /// PEM certificate chain to serve; with --key. Without both, a
        /// self-signed certificate is made and written to <data-dir>/cert.pem.
        #[arg(long, env = "PREFIX_INDEX_CERT", requires = "key")]
        cert: PathBuf = cert_file => transport.tls,
        /// PEM private key of --cert.
        #[arg(long, env = "PREFIX_INDEX_KEY", requires = "cert")]
        key: PathBuf = key_file => transport.tls,
        /// PEM CA certificates: when set, only clients presenting a certificate
        /// signed by one of them may connect (mutual TLS).
        #[arg(long, env = "PREFIX_INDEX_CLIENT_CA")]
        client_ca: PathBuf = optional => transport.client_ca,
        /// Concurrent client connections; more are refused.
        #[arg(long, env = "PREFIX_INDEX_MAX_CONNECTIONS")]
        max_connections: usize = plain => transport.max_connections,
        /// Concurrent streams per connection.
        #[arg(long, env = "PREFIX_INDEX_MAX_STREAMS")]
        max_streams: u32 = plain => transport.max_streams,
        /// Close connections silent for this long.
        #[arg(long, env = "PREFIX_INDEX_IDLE_TIMEOUT")]
        idle_timeout: HumanDuration = duration => transport.idle_timeout,
        /// How long a request may take to arrive once it has begun: an HTTP
        /// request's body after its headers, a QUIC frame after its first byte,
        /// and a TLS handshake on the HTTP listener. Past it the request is
        /// refused and its connection (HTTP) or stream (QUIC) closed.
        #[arg(long, env = "PREFIX_INDEX_READ_TIMEOUT")]
        read_timeout: HumanDuration = duration => transport.read_timeout,
        /// How long an answer may wait for the client to take it: past it a
        /// QUIC stream is reset, an HTTP connection closed.
        #[arg(long, env = "PREFIX_INDEX_WRITE_TIMEOUT")]
        write_timeout: HumanDuration = duration => transport.write_timeout,
        /// Bytes a connection may send ahead of what the server has read (its
        /// QUIC receive window): the memory one connection can make the server
        /// buffer.
        #[arg(long, env = "PREFIX_INDEX_CONNECTION_WINDOW")]
        connection_window: u32 = plain => transport.connection_window,
        /// Keep the workers polling the network for this long after the last
        /// read instead of sleeping: lower latency when requests come one at a
        /// time, for every worker's core at 100% while they come and for this
        /// long after. For servers with cores of their own (see
        /// docs/operations.md); "0s" is off.
        #[arg(long, env = "PREFIX_INDEX_BUSY_POLL")]
        busy_poll: HumanDuration = duration_or_off => transport.busy_poll,
        /// On shutdown, how long in-flight requests may take to finish.
        #[arg(long, env = "PREFIX_INDEX_DRAIN_TIMEOUT")]
        drain_timeout: HumanDuration = duration => transport.drain_timeout,
        /// On shutdown, past the drain, how long connections get to close and
        /// the server's tasks to end before it stops anyway.
        #[arg(long, env = "PREFIX_INDEX_CLOSE_TIMEOUT")]
        close_timeout: HumanDuration = duration => transport.close_timeout,
    }
}

/// The certificate's file and its key's: each one half of
/// [`CertSource::Files`] (the other given with it; `validate` refuses one
/// alone).
mod cert_file {
    use std::path::PathBuf;

    use super::{CertSource, ConfigError};

    pub fn put(_: &'static str, path: PathBuf, tls: &mut CertSource) -> Result<(), ConfigError> {
        set(tls, |cert, _| *cert = path);
        Ok(())
    }

    pub fn written(tls: &CertSource) -> Option<PathBuf> {
        written_files(tls).map(|(cert, _)| cert)
    }

    /// `tls` as the files it names (both empty where it named none), each
    /// changed by `change`.
    pub(super) fn set(tls: &mut CertSource, change: impl FnOnce(&mut PathBuf, &mut PathBuf)) {
        let (mut cert, mut key) = written_files(tls).unwrap_or_default();
        change(&mut cert, &mut key);
        *tls = CertSource::Files { cert, key };
    }

    /// The files `tls` names, if it names any.
    pub(super) fn written_files(tls: &CertSource) -> Option<(PathBuf, PathBuf)> {
        match tls {
            CertSource::Files { cert, key } => Some((cert.clone(), key.clone())),
            CertSource::SelfSigned => None,
        }
    }
}

/// The private key's file: the other half of [`CertSource::Files`].
mod key_file {
    use std::path::PathBuf;

    use super::cert_file::{set, written_files};
    use super::{CertSource, ConfigError};

    pub fn put(_: &'static str, path: PathBuf, tls: &mut CertSource) -> Result<(), ConfigError> {
        set(tls, |_, key| *key = path);
        Ok(())
    }

    pub fn written(tls: &CertSource) -> Option<PathBuf> {
        written_files(tls).map(|(_, key)| key)
    }
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

impl TransportConfig {
    /// Checks every value's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let CertSource::Files { cert, key } = &self.tls {
            if cert.as_os_str().is_empty() || key.as_os_str().is_empty() {
                return invalid("cert/key", &"one of them", "give both, or neither");
            }
        }
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
