//! The client's TLS: what it trusts and presents, as a quinn configuration.
//!
//! QUIC always runs over TLS 1.3. A client trusts exactly the CA certificates
//! it is given (the server's self-signed `cert.pem`, or the CA that signed the
//! server's certificate) and, for mutual TLS, presents its own certificate.
//! PEM files are read by the protocol crate's `tls` module, shared with the
//! server.

use std::path::Path;
use std::sync::Arc;

use crate::pem::{explain_handshake, load_certs, load_chain, load_key, TlsError};
use prefix_proto::ALPN;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How long a connection lasts with no answer from the server, by default:
/// long enough for any pause of a live server, short enough that a gateway
/// finds a killed one (and, by name, its successor) within seconds.
pub const DEFAULT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The shortest idle timeout a client sets: shorter ones count as this.
pub const MIN_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(100);

/// The longest interval between pings: well inside the server's default
/// idle timeout (30 s), whatever the client's own.
const MAX_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(5);

/// What a client trusts and presents.
#[derive(Debug, Default)]
pub struct TlsConfig {
    /// CA certificates that may sign the server's certificate.
    pub roots: Vec<CertificateDer<'static>>,
    /// Certificate chain and key to present for mutual TLS.
    pub identity: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
}

impl Clone for TlsConfig {
    fn clone(&self) -> Self {
        TlsConfig {
            roots: self.roots.clone(),
            identity: self
                .identity
                .as_ref()
                .map(|(chain, key)| (chain.clone(), key.clone_key())),
        }
    }
}

impl TlsConfig {
    /// Trust the CA certificates in `ca` (a PEM file), and present
    /// `cert`/`key` if both are given.
    pub fn from_files(
        ca: &Path,
        cert: Option<&Path>,
        key: Option<&Path>,
    ) -> Result<Self, TlsError> {
        let identity = match (cert, key) {
            (Some(c), Some(k)) => Some((load_chain(c)?, load_key(k)?)),
            _ => None,
        };
        Ok(TlsConfig {
            roots: load_certs(ca)?,
            identity,
        })
    }

    /// The quinn client configuration: TLS 1.3, our ALPN, these roots, and
    /// connections that end [`DEFAULT_IDLE_TIMEOUT`] after the server last
    /// answered.
    pub fn quic_config(&self) -> Result<quinn::ClientConfig, TlsError> {
        self.quic_config_with_idle(DEFAULT_IDLE_TIMEOUT)
    }

    /// As [`TlsConfig::quic_config`], with connections that end `idle`
    /// after the server last answered: the client pings four times within
    /// it, so only a server that is gone (killed, or cut off) stays silent
    /// that long, and the connection is then found dead and replaced
    /// rather than kept for the server's own, longer, idle timeout.
    pub fn quic_config_with_idle(
        &self,
        idle: std::time::Duration,
    ) -> Result<quinn::ClientConfig, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for ca in &self.roots {
            roots.add(ca.clone())?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13])?
            .with_root_certificates(roots);
        let mut tls = match &self.identity {
            Some((chain, key)) => builder.with_client_auth_cert(chain.clone(), key.clone_key())?,
            None => builder.with_no_client_auth(),
        };
        tls.alpn_protocols = vec![ALPN.to_vec()];
        let quic = quinn::crypto::rustls::QuicClientConfig::try_from(tls)
            .map_err(|e| TlsError::Quic(e.to_string()))?;
        let mut cfg = quinn::ClientConfig::new(Arc::new(quic));
        let mut transport = quinn::TransportConfig::default();
        // A quiet gateway keeps its connection: it pings four times within its
        // own idle timeout, and at least every 5 s, inside the server's (30 s
        // by default; the shorter of the two governs). Zero sets no idle
        // timeout of its own: the server's governs.
        let idle = (!idle.is_zero()).then(|| idle.max(MIN_IDLE_TIMEOUT));
        let ping = idle.map_or(MAX_KEEP_ALIVE, |i| (i / 4).min(MAX_KEEP_ALIVE));
        transport
            .keep_alive_interval(Some(ping))
            .max_idle_timeout(idle.and_then(|i| i.try_into().ok()));
        cfg.transport_config(Arc::new(transport));
        Ok(cfg)
    }
}

/// Words for why a connection ended, naming the certificate problem when the
/// server refused the TLS handshake. With TLS 1.3 a client's handshake
/// completes before the server has checked the client's certificate, so a
/// refusal arrives as the connection's close: a TLS alert number, which says
/// little to a user on its own.
pub(crate) fn describe_close(e: &quinn::ConnectionError) -> String {
    if let quinn::ConnectionError::ConnectionClosed(close) = e {
        // QUIC carries a TLS alert as the transport error 0x100 + alert.
        let alert = u64::from(close.error_code).checked_sub(0x100);
        let why = match alert {
            Some(42) => Some("it refused this client's certificate (bad certificate)"),
            Some(43) => Some("this client's certificate is of a kind it does not accept"),
            Some(44) => Some("this client's certificate is revoked"),
            Some(45) => Some("this client's certificate has expired"),
            Some(46) => Some("it could not check this client's certificate"),
            Some(48) => {
                Some("this client's certificate is not signed by a CA it trusts (its --client-ca)")
            }
            Some(116) => {
                Some("it requires a client certificate (mutual TLS): give --cert and --key")
            }
            _ => None,
        };
        if let Some(why) = why {
            return format!("the server refused the TLS handshake: {why} ({e})");
        }
    }
    let text = e.to_string();
    match explain_handshake(&text) {
        Some(why) => format!("{text}: {why}"),
        None => text,
    }
}
