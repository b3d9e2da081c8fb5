//! The server's TLS: its certificate (given, or self-signed and kept in the
//! data directory) and, with a client CA, mutual TLS.

use std::path::Path;
use std::sync::Arc;

use prefix_client::pem::{load_certs, load_chain, load_key, TlsError};
use prefix_proto::ALPN;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

use crate::config::{CertSource, ServerConfig};

/// Why the server's TLS could not be set up.
#[derive(Debug, Error)]
pub enum ServerTlsError {
    /// Loading or using PEM material failed.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The self-signed certificate could not be made.
    #[error("cannot generate a certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The data directory or a file in it could not be written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: std::path::PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The client CA bundle cannot verify clients.
    #[error("client CA: {0}")]
    ClientCa(String),
    /// The system's random number generator failed.
    #[error("the system's random number generator failed")]
    Random,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ServerTlsError + '_ {
    move |source| ServerTlsError::Io {
        path: path.into(),
        source,
    }
}

/// The certificate chain and key to serve with.
pub fn server_identity(
    cfg: &ServerConfig,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ServerTlsError> {
    match &cfg.transport.tls {
        CertSource::Files { cert, key } => Ok((load_chain(cert)?, load_key(key)?)),
        CertSource::SelfSigned => self_signed(&cfg.data_dir),
    }
}

/// Loads `<dir>/cert.pem` and `<dir>/key.pem`, or makes them: a self-signed
/// certificate for `localhost` and `127.0.0.1`. Kept across restarts so
/// clients that trust `cert.pem` keep connecting.
fn self_signed(
    dir: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), ServerTlsError> {
    let cert_path = dir.join("cert.pem");
    let key_path = dir.join("key.pem");
    if cert_path.exists() && key_path.exists() {
        return Ok((load_certs(&cert_path)?, load_key(&key_path)?));
    }
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let made = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])?;
    write_private(&key_path, made.signing_key.serialize_pem().as_bytes())?;
    std::fs::write(&cert_path, made.cert.pem()).map_err(io_err(&cert_path))?;
    tracing::info!(cert = %cert_path.display(), "generated a self-signed certificate; clients pass it as --ca");
    Ok((load_certs(&cert_path)?, load_key(&key_path)?))
}

/// Writes a file only its owner can read.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), ServerTlsError> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(path).map_err(io_err(path))?;
    f.write_all(bytes).map_err(io_err(path))
}

/// The rustls configuration: TLS 1.3, our ALPN, and client verification when
/// a client CA is configured.
pub fn rustls_config(cfg: &ServerConfig) -> Result<rustls::ServerConfig, ServerTlsError> {
    let (chain, key) = server_identity(cfg)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(TlsError::from)?;
    let builder = match &cfg.transport.client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in load_certs(ca)? {
                roots.add(c).map_err(TlsError::from)?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| ServerTlsError::ClientCa(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut tls = builder
        .with_single_cert(chain, key)
        .map_err(TlsError::from)?;
    tls.alpn_protocols = vec![ALPN.to_vec()];
    Ok(tls)
}

/// Bytes of the QUIC endpoint's secret, `<data-dir>/quic.key`.
const QUIC_SECRET_LEN: usize = 32;

/// Stateless resets sent at most this often: a restarted server resets up
/// to a thousand of its predecessor's connections a second (clients whose
/// packets come faster find theirs gone at their idle timeout). Resets
/// need little limiting: each is smaller than the packet that caused it
/// and answers only a connection ID this server's secret signed.
const MIN_RESET_INTERVAL: std::time::Duration = std::time::Duration::from_millis(1);

/// The QUIC endpoint's configuration. Its stateless-reset key and the key
/// its connection IDs are signed with come from a secret of this server's
/// own, `<data-dir>/quic.key` (made once, readable by the owner only), so
/// they stay the same across restarts (RFC 9000, 10.3): a server started
/// again at the same address takes the packets of its predecessor's
/// connections for its own IDs and answers them with a stateless reset
/// their clients accept, so they reconnect at once instead of sending into
/// a connection nobody holds until their idle timeout ends it. The secret
/// is per server, never shared with its replicas even when they share a
/// certificate: a server that could sign another's resets could be made
/// to end that server's connections by anyone who saw their IDs.
pub fn endpoint_config(cfg: &ServerConfig) -> Result<quinn::EndpointConfig, ServerTlsError> {
    let secret = quic_secret(&cfg.data_dir)?;
    let derive = |label: &[u8]| {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        ctx.update(label);
        ctx.update(&secret);
        ctx.finish()
    };
    let reset = derive(b"prefix-index QUIC stateless reset key\0");
    let reset = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, reset.as_ref());
    let mut cid_key = [0u8; 8];
    cid_key.copy_from_slice(&derive(b"prefix-index QUIC connection ID key\0").as_ref()[..8]);
    let cid_key = u64::from_le_bytes(cid_key);
    let mut endpoint = quinn::EndpointConfig::new(Arc::new(reset));
    endpoint
        .cid_generator(move || {
            Box::new(quinn_proto::HashedConnectionIdGenerator::from_key(cid_key))
        })
        .min_reset_interval(MIN_RESET_INTERVAL);
    Ok(endpoint)
}

/// The endpoint's secret in `dir`: read, or made and written (an unreadable
/// or short file is replaced: connections of the process before then end
/// at their idle timeout instead of a reset, nothing worse).
fn quic_secret(dir: &Path) -> Result<[u8; QUIC_SECRET_LEN], ServerTlsError> {
    let path = dir.join("quic.key");
    if let Ok(bytes) = std::fs::read(&path) {
        if let Ok(secret) = <[u8; QUIC_SECRET_LEN]>::try_from(bytes.as_slice()) {
            return Ok(secret);
        }
    }
    let mut secret = [0u8; QUIC_SECRET_LEN];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut secret)
        .map_err(|_| ServerTlsError::Random)?;
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    write_private(&path, &secret)?;
    Ok(secret)
}

/// What this server trusts in its peers and presents to them when it fills
/// itself from one (see [`crate::bootstrap`]): its own certificate and key
/// (so a peer with roles knows it), checked against `peer_ca`, else
/// `client_ca` (one CA for every party), else its own certificate (replicas
/// sharing one).
pub fn peer_tls(cfg: &ServerConfig) -> Result<prefix_client::TlsConfig, ServerTlsError> {
    let (cert, key) = match &cfg.transport.tls {
        CertSource::Files { cert, key } => (cert.clone(), key.clone()),
        CertSource::SelfSigned => (cfg.data_dir.join("cert.pem"), cfg.data_dir.join("key.pem")),
    };
    let ca = cfg
        .replicas
        .peer_ca
        .clone()
        .or_else(|| cfg.transport.client_ca.clone())
        .unwrap_or_else(|| cert.clone());
    Ok(prefix_client::TlsConfig::from_files(
        &ca,
        Some(&cert),
        Some(&key),
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quic_secret_is_kept_per_data_directory_and_never_shared() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let first = quic_secret(a.path()).unwrap();
        assert_eq!(quic_secret(a.path()).unwrap(), first, "kept across starts");
        assert_ne!(quic_secret(b.path()).unwrap(), first, "made per server");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(a.path().join("quic.key")).unwrap();
            assert_eq!(mode.permissions().mode() & 0o777, 0o600);
        }
        // A damaged file is replaced, not trusted.
        std::fs::write(a.path().join("quic.key"), b"short").unwrap();
        let again = quic_secret(a.path()).unwrap();
        assert_ne!(again, first);
        assert_eq!(quic_secret(a.path()).unwrap(), again);
    }
}
