//! TLS material both ends load: PEM certificates and keys.
//!
//! The protocol runs over QUIC, so always over TLS 1.3 with the [`ALPN`]
//! `prefix-index/1`; a server and every Rust client read their certificates
//! and keys with these two functions, so both report a bad file the same way.
//!
//! [`ALPN`]: prefix_proto::ALPN

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
    /// A certificate to present is X.509 v1, which TLS peers refuse.
    #[error("{0}: {V1_CERTIFICATE}")]
    Version1(PathBuf),
}

/// Why an X.509 v1 certificate is refused, in words (rustls says only
/// `UnsupportedCertVersion`). `openssl x509 -req` makes v1 certificates
/// unless given an extensions file.
pub const V1_CERTIFICATE: &str = "the certificate is X.509 v1; v3 with extensions is required \
     (with `openssl x509 -req`, add `-extfile` with the extensions; see docs/operations.md)";

/// Reads the certificate chain a peer presents (a server's `--cert`, a
/// client's `--cert`): [`load_certs`], and its first certificate must be
/// X.509 v3, which is what every TLS 1.3 peer accepts.
pub fn load_chain(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = load_certs(path)?;
    if is_version_1(&certs[0]) {
        return Err(TlsError::Version1(path.into()));
    }
    Ok(certs)
}

/// Whether `cert` is an X.509 v1 certificate. Other defects are left to the
/// TLS stack, which names them itself.
pub fn is_version_1(cert: &CertificateDer<'_>) -> bool {
    matches!(
        webpki::EndEntityCert::try_from(cert),
        Err(webpki::Error::UnsupportedCertVersion)
    )
}

/// Words for a failed handshake's error text, when it is one whose text does
/// not say it plainly.
pub fn explain_handshake(error: &str) -> Option<&'static str> {
    error
        .contains("UnsupportedCertVersion")
        .then_some(V1_CERTIFICATE)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_1_certificate_is_refused_in_words() {
        // Made by `openssl x509 -req` without an extensions file.
        let v1 = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/v1-cert.pem");
        assert!(is_version_1(&load_certs(&v1).unwrap()[0]));
        let e = load_chain(&v1).unwrap_err();
        assert!(
            e.to_string()
                .contains("X.509 v1; v3 with extensions is required"),
            "{e}"
        );
        let v3 = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        assert!(!is_version_1(v3.cert.der()));
        assert_eq!(
            explain_handshake(
                "invalid peer certificate: Other(OtherError(UnsupportedCertVersion))"
            ),
            Some(V1_CERTIFICATE)
        );
        assert_eq!(
            explain_handshake("invalid peer certificate: UnknownIssuer"),
            None
        );
    }
}
