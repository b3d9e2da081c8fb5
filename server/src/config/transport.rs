//! The transport's settings: the listeners (QUIC, the HTTP/JSON API, the
//! metrics and probes), TLS, connections and their streams, and the
//! shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::declare::{
    address_or_off, duration, duration_or_off, optional, plain, settings, NotZero,
};
use super::value::{invalid, ConfigError, HumanDuration};

/// The connection settings, refused together when either is zero.
const STREAMS: NotZero = NotZero("max-connections/max-streams", "0", "must be at least 1");

settings! {
    /// What a user may set of the transport (see [`super::Settings`]).
    pub struct TransportSettings => transport {
        /// QUIC (UDP) address to serve on.
        #[arg(long)]
        // Loopback until an operator decides to expose it.
        listen: SocketAddr = plain
            => listen: SocketAddr = SocketAddr::from(([127, 0, 0, 1], 7070)),
        /// HTTP address for /metrics, /healthz and /readyz; "off" disables it.
        #[arg(long)]
        metrics_listen: String = address_or_off
            => metrics_listen: Option<SocketAddr> = Some(SocketAddr::from(([127, 0, 0, 1], 7071))),
        /// TCP address of the HTTP/JSON API (HTTP/1.1 and HTTP/2 over TLS, the
        /// same certificates and roles as QUIC; docs/http.md); "off" disables it.
        #[arg(long)]
        // Off: QUIC is the fast path, the HTTP API the convenient one,
        // opened when asked for.
        http_listen: String = address_or_off => http_listen: Option<SocketAddr> = None,
        /// Serve --http-listen as plain HTTP (HTTP/1.1, and HTTP/2 with prior
        /// knowledge for gRPC), without TLS: only inside a network that
        /// encrypts and authenticates on its own (a service mesh with mutual
        /// TLS). Every client that reaches the port may then read and write;
        /// refused with --client-ca. See docs/operations.md, "Security model".
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        // No: TLS with the QUIC listener's certificate; plain HTTP gives up
        // encryption and client identities, which only a mesh around the
        // server can stand for.
        http_plaintext: bool = plain => http_plaintext: bool = false,
        /// PEM certificate chain to serve; with --key. Without both, a
        /// self-signed certificate is made and written to <data-dir>/cert.pem.
        #[arg(long, requires = "key")]
        cert: PathBuf = cert_file => tls: CertSource = CertSource::SelfSigned,
        /// PEM private key of --cert.
        #[arg(long, requires = "cert")]
        key: PathBuf = key_file => tls,
        /// PEM CA certificates: when set, only clients presenting a certificate
        /// signed by one of them may connect (mutual TLS).
        #[arg(long)]
        // None: any client may connect.
        client_ca: PathBuf = optional => client_ca: Option<PathBuf> = None,
        /// Concurrent client connections; more are refused.
        #[arg(long)]
        // 4,096: a large gateway fleet, each replica holding one
        // connection, with room for tools.
        max_connections: usize = plain => max_connections: usize = 4096, check STREAMS,
        /// Concurrent streams per connection.
        #[arg(long)]
        // 64: clients use a handful of long-lived streams (4 by default).
        max_streams: u32 = plain => max_streams: u32 = 64, check STREAMS,
        /// Close connections silent for this long.
        #[arg(long)]
        // 30 s; clients that are merely quiet keep the connection alive with
        // QUIC pings.
        idle_timeout: HumanDuration = duration
            => idle_timeout: Duration = Duration::from_secs(30), check Duration::from_secs(1)..,
        /// How long a request may take to arrive once it has begun: an HTTP
        /// request's body after its headers, a QUIC frame after its first byte,
        /// and a TLS handshake on the HTTP listener. Past it the request is
        /// refused and its connection (HTTP) or stream (QUIC) closed.
        #[arg(long)]
        // 10 s: a whole frame or body of the largest size allowed crosses a
        // slow datacenter link in a fraction of that, and a client that
        // stalls mid-request holds its connection (and the buffered part) no
        // longer.
        read_timeout: HumanDuration = duration
            => read_timeout: Duration = Duration::from_secs(10),
            check Duration::from_millis(100)..,
        /// How long an answer may wait for the client to take it: past it a
        /// QUIC stream is reset, an HTTP connection closed.
        #[arg(long)]
        // 10 s: the largest answer (16 MiB) crosses a slow link in a fraction
        // of it, and a client that stops reading holds its answer's memory no
        // longer.
        write_timeout: HumanDuration = duration
            => write_timeout: Duration = Duration::from_secs(10),
            check Duration::from_millis(100)..,
        /// Bytes a connection may send ahead of what the server has read (its
        /// QUIC receive window): the memory one connection can make the server
        /// buffer.
        #[arg(long)]
        // 4 MiB: ample for loopback and datacenter round trips, and 4,096
        // connections can then buffer at most 16 GiB only if every one of
        // them is stalled with a full window (size it down with
        // max-connections on small machines).
        connection_window: u32 = plain => connection_window: u32 = 4 << 20, check 65_536..,
        /// Keep the workers polling the network for this long after the last
        /// read instead of sleeping: lower latency when requests come one at a
        /// time, for every worker's core at 100% while they come and for this
        /// long after. For servers with cores of their own (see
        /// docs/operations.md); "0s" is off.
        #[arg(long)]
        // Off (see `crate::BusyPoll`): spinning is worth a core per worker
        // only on machines where wake-ups are slow (virtual machines) and the
        // cores are the server's alone.
        busy_poll: HumanDuration = duration_or_off
            => busy_poll: Option<Duration> = None,
        /// On shutdown, how long in-flight requests may take to finish.
        #[arg(long)]
        drain_timeout: HumanDuration = duration
            => drain_timeout: Duration = Duration::from_secs(5),
        /// On shutdown, past the drain, how long connections get to close and
        /// the server's tasks to end before it stops anyway.
        #[arg(long)]
        // 1 s: a QUIC close needs one round trip, and what a connection
        // still sends then is dropped anyway.
        close_timeout: HumanDuration = duration
            => close_timeout: Duration = Duration::from_secs(1),
    }
    /// The transport a server runs with.
    pub struct TransportConfig {}
}

/// The files `tls` names (both empty where it names none).
fn files(tls: &CertSource) -> (PathBuf, PathBuf) {
    match tls {
        CertSource::Files { cert, key } => (cert.clone(), key.clone()),
        CertSource::SelfSigned => Default::default(),
    }
}

/// The certificate's file: one half of [`CertSource::Files`] (the other
/// given with it: `validate` refuses one alone).
mod cert_file {
    use super::{files, CertSource, ConfigError, PathBuf};

    pub fn put(_: &'static str, cert: PathBuf, tls: &mut CertSource) -> Result<(), ConfigError> {
        *tls = CertSource::Files {
            cert,
            key: files(tls).1,
        };
        Ok(())
    }

    pub fn written(tls: &CertSource) -> Option<PathBuf> {
        matches!(tls, CertSource::Files { .. }).then(|| files(tls).0)
    }
}

/// The private key's file: the other half of [`CertSource::Files`].
mod key_file {
    use super::{files, CertSource, ConfigError, PathBuf};

    pub fn put(_: &'static str, key: PathBuf, tls: &mut CertSource) -> Result<(), ConfigError> {
        *tls = CertSource::Files {
            cert: files(tls).0,
            key,
        };
        Ok(())
    }

    pub fn written(tls: &CertSource) -> Option<PathBuf> {
        matches!(tls, CertSource::Files { .. }).then(|| files(tls).1)
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

impl TransportConfig {
    /// Checks what spans two settings (each one's rule is in the table).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let CertSource::Files { cert, key } = &self.tls {
            if cert.as_os_str().is_empty() || key.as_os_str().is_empty() {
                return invalid("cert/key", &"one of them", "give both, or neither");
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
        Ok(())
    }
}
