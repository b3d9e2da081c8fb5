//! Test certificates made with rcgen: a certificate authority that signs
//! client certificates, the three gateways a mutual-TLS test gives roles
//! to, a server certificate several servers can share, and the fingerprint
//! an operator would compute.
//!
//! Everything is written as PEM files into a directory the test owns, since
//! the server and the client take their TLS material as files.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

/// A CA, and a function making client certificates it signs.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    /// A new self-signed CA with common name `name`.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    /// Writes the CA's certificate to `dir/name`, and returns that path.
    pub fn write(&self, dir: &Path, name: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, self.issuer.pem()).unwrap();
        p
    }

    /// Writes `<name>.pem` and `<name>.key` for a client certificate with
    /// common name (and DNS name) `name`, and returns their paths.
    pub fn client(&self, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

/// The gateways of a mutual-TLS test: the clients' CA (`clients-ca.pem`,
/// common name `gateways`) and three client certificates it signed, each a
/// (certificate, key) pair of paths. Which roles they get is the server's
/// config: [`Roles::READER`] and [`Roles::WRITER`] name the first two by
/// common name; the third is on no list.
#[derive(Clone)]
pub struct Roles {
    /// The CA that signed the three, for the server's `client_ca`.
    pub ca: PathBuf,
    /// Common name `gw-readonly`.
    pub reader: (PathBuf, PathBuf),
    /// Common name `gw-writer`.
    pub writer: (PathBuf, PathBuf),
    /// Common name `gw-unlisted`.
    pub unlisted: (PathBuf, PathBuf),
}

impl Roles {
    /// The reader's common name.
    pub const READER: &'static str = "gw-readonly";
    /// The writer's common name.
    pub const WRITER: &'static str = "gw-writer";
    /// The common name of the certificate on neither list.
    pub const UNLISTED: &'static str = "gw-unlisted";

    /// Makes the CA and the three certificates in `dir`.
    pub fn new(dir: &Path) -> Roles {
        let ca = Ca::new("gateways");
        Roles {
            ca: ca.write(dir, "clients-ca.pem"),
            reader: ca.client(dir, Self::READER),
            writer: ca.client(dir, Self::WRITER),
            unlisted: ca.client(dir, Self::UNLISTED),
        }
    }

    /// Turns on mutual TLS with this CA in `cfg`, with the reader and the
    /// writer on their lists by common name.
    #[cfg(feature = "server")]
    pub fn configure(&self, cfg: &mut prefix_server::ServerConfig) {
        cfg.transport.client_ca = Some(self.ca.clone());
        let cn = |name: &str| format!("cn:{name}").parse().unwrap();
        cfg.roles.readers = vec![cn(Self::READER)];
        cfg.roles.writers = vec![cn(Self::WRITER)];
    }
}

/// Writes a self-signed server certificate for `localhost` and `127.0.0.1`
/// to `dir/cert.pem` and its key to `dir/key.pem` (the names the server
/// uses), and returns their paths: one certificate several test servers
/// can serve, so one client config trusts them all.
pub fn server_cert(dir: &Path) -> (PathBuf, PathBuf) {
    let made =
        rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (cert, key)
}

/// `sha256:<hex>` of a PEM certificate file, as an operator would compute it
/// (`openssl x509 -noout -fingerprint -sha256`).
pub fn fingerprint(pem: &Path) -> String {
    let der = CertificateDer::from_pem_file(pem).unwrap();
    let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
    let hex: Vec<String> = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    format!("sha256:{}", hex.join(":"))
}
