//! TLS material both ends load: PEM certificates and keys.
//!
//! The protocol runs over QUIC, so always over TLS 1.3 with the [`ALPN`]
//! `prefix-index/1`; a server and every Rust client read their certificates
//! and keys with these two functions, so both report a bad file the same way.
//!
//! [`ALPN`]: crate::ALPN

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use thiserror::Error;

/// Why TLS material could not be loaded or used.
#[derive(Debug, Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("{path}: {reason}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// A PEM file held no certificate (or no key).
    #[error("{0}: no certificate or key found")]
    Empty(PathBuf),
    /// rustls refused the material (a bad key, a CA it cannot use, ...).
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The rustls configuration has no QUIC-capable cipher suite.
    #[error("TLS configuration cannot carry QUIC: {0}")]
    Quic(String),
}

/// Reads every certificate of a PEM file, in order.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Pem {
            path: path.into(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Empty(path.into()));
    }
    Ok(certs)
}

/// Reads the first private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::Empty(path.into()),
        e => TlsError::Pem {
            path: path.into(),
            reason: e.to_string(),
        },
    })
}
