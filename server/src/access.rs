//! Who may do what: client identities from mutual TLS mapped to roles.
//!
//! Mutual TLS (`--client-ca`) decides who may connect. Roles decide what a
//! connected client may do, from least to most:
//! - **readers** may look up, ask for stats and ping;
//! - **peers** (other replicas of the index, `--peer-identity`) may also take
//!   the server's snapshot, to fill themselves when they start cold;
//! - **writers** may do everything: insert, remove pods, set capacities,
//!   follow engines, and take snapshots (whoever may empty the index may read
//!   it whole).
//!
//! A certificate in several lists gets the most it is given. When no list is
//! set, every connected client is a writer (the behaviour without roles).
//! When any is set, a client matching none may do nothing: every request it
//! sends is refused with `Forbidden`, naming its certificate so the operator
//! can add it.
//!
//! An identity is written `sha256:<hex of the DER certificate's SHA-256>`
//! (pins one certificate) or `cn:<common name>` (any certificate the CA issued
//! whose subject has that common name, so a reissued certificate keeps its
//! role). Common names are compared as whole attribute values, never as text
//! rendered from the subject, so a name containing `,` or `=` cannot pass for
//! another subject.

use std::fmt;
use std::str::FromStr;

use rustls_pki_types::CertificateDer;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::config::declare::{list, settings};

/// One way of naming a client certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// The SHA-256 of the certificate's DER bytes.
    Sha256([u8; 32]),
    /// A common name of the subject.
    CommonName(String),
}

impl FromStr for Identity {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let expected = || format!("identity {s:?}: expected sha256:<hex> or cn:<name>");
        let (kind, value) = s.split_once(':').ok_or_else(expected)?;
        match kind {
            "sha256" => {
                let hex: String = value.chars().filter(|c| *c != ':').collect();
                let mut out = [0u8; 32];
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(format!("identity {s:?}: a SHA-256 is 64 hex digits"));
                }
                for (i, byte) in out.iter_mut().enumerate() {
                    *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
                        .map_err(|_| format!("identity {s:?}: not hexadecimal"))?;
                }
                Ok(Identity::Sha256(out))
            }
            "cn" if !value.is_empty() => Ok(Identity::CommonName(value.into())),
            _ => Err(expected()),
        }
    }
}

impl fmt::Display for Identity {
    /// The form [`Identity::from_str`] reads.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Sha256(digest) => {
                f.write_str("sha256:")?;
                digest.iter().try_for_each(|b| write!(f, "{b:02x}"))
            }
            Identity::CommonName(name) => write!(f, "cn:{name}"),
        }
    }
}

/// What a connection may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// Every operation.
    Write,
    /// Lookups, stats and ping.
    Read,
    /// What a reader may, and snapshots.
    Peer,
    /// Nothing; the text describes the certificate (or its absence).
    Denied(String),
}

/// The identities of a client certificate, as read from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    sha256: [u8; 32],
    common_names: Vec<String>,
    /// The subject as text, only to name the certificate in messages.
    subject: Option<String>,
}

impl Peer {
    /// Reads a client's leaf certificate.
    pub fn from_der(der: &CertificateDer<'_>) -> Peer {
        let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
        let mut sha256 = [0; 32];
        sha256.copy_from_slice(digest.as_ref());
        // The TLS layer has already verified this certificate against the
        // client CA; if it still does not parse here, it matches by hash only.
        let (common_names, subject) = match X509Certificate::from_der(der.as_ref()) {
            Ok((_, cert)) => (
                cert.subject()
                    .iter_common_name()
                    .filter_map(|cn| cn.as_str().ok().map(String::from))
                    .collect(),
                Some(cert.subject().to_string()),
            ),
            Err(_) => (Vec::new(), None),
        };
        Peer {
            sha256,
            common_names,
            subject,
        }
    }

    fn matches(&self, id: &Identity) -> bool {
        match id {
            Identity::Sha256(h) => *h == self.sha256,
            Identity::CommonName(cn) => self.common_names.iter().any(|c| c == cn),
        }
    }
}

impl Access {
    /// Whether it may take the server's snapshot.
    pub fn may_snapshot(&self) -> bool {
        matches!(self, Access::Write | Access::Peer)
    }
}

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:")?;
        for b in self.sha256 {
            write!(f, "{b:02x}")?;
        }
        if let Some(s) = &self.subject {
            write!(f, " (subject {s})")?;
        }
        Ok(())
    }
}

/// The configured roles.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roles {
    /// Identities that may only read.
    pub readers: Vec<Identity>,
    /// Identities that may read and write.
    pub writers: Vec<Identity>,
    /// Identities that may read and take snapshots: the other replicas.
    pub peers: Vec<Identity>,
}

impl Roles {
    /// Whether any role is configured (otherwise everyone connected writes).
    pub fn enabled(&self) -> bool {
        !self.readers.is_empty() || !self.writers.is_empty() || !self.peers.is_empty()
    }

    /// What a connection whose client presented `certs` (leaf first) may do:
    /// the most of every list its certificate matches.
    pub fn access(&self, certs: Option<&[CertificateDer<'_>]>) -> Access {
        if !self.enabled() {
            return Access::Write;
        }
        let Some(leaf) = certs.and_then(<[_]>::first) else {
            return Access::Denied("a client without a certificate".into());
        };
        let peer = Peer::from_der(leaf);
        if self.writers.iter().any(|id| peer.matches(id)) {
            Access::Write
        } else if self.peers.iter().any(|id| peer.matches(id)) {
            Access::Peer
        } else if self.readers.iter().any(|id| peer.matches(id)) {
            Access::Read
        } else {
            Access::Denied(peer.to_string())
        }
    }
}

settings! {
    /// What a user may set of the roles (see [`crate::config::Settings`]).
    pub struct RoleSettings => roles {
        /// A client identity that may only look up (and ask stats, ping):
        /// sha256:<hex> or cn:<common name>. Repeat the flag; in the
        /// environment separate them with ';'. Needs --client-ca.
        #[arg(long = "reader", value_delimiter = ';')]
        readers: Vec<String> = list => readers,
        /// A client identity that may also insert, remove pods and set
        /// capacities (same forms as --reader). With either list set, clients
        /// matching neither may do nothing.
        #[arg(long = "writer", value_delimiter = ';')]
        writers: Vec<String> = list => writers,
        /// A client identity that may look up and take this server's snapshot:
        /// the certificate the other replicas present (same forms as --reader).
        #[arg(long = "peer-identity", value_delimiter = ';')]
        peer_identities: Vec<String> = list => peers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str) -> CertificateDer<'static> {
        let mut params = rcgen::CertificateParams::new(vec!["client".into()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, "infra");
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().clone()
    }

    fn hash(der: &CertificateDer<'_>) -> String {
        Peer::from_der(der).to_string()[..71].to_owned()
    }

    #[test]
    fn identities_parse_and_bad_ones_are_refused() {
        let h = format!("sha256:{}", "ab".repeat(32));
        assert!(matches!(h.parse::<Identity>(), Ok(Identity::Sha256(b)) if b == [0xab; 32]));
        let colons = format!("sha256:{}", vec!["AB"; 32].join(":"));
        assert_eq!(colons.parse::<Identity>(), h.parse::<Identity>());
        assert_eq!(
            "cn:gw-1".parse::<Identity>(),
            Ok(Identity::CommonName("gw-1".into()))
        );
        // `from_str_radix` alone would take a sign: "+a" is not a hex pair.
        let plus = format!("sha256:+a{}", "a".repeat(62));
        for bad in [
            "gw-1",
            "cn:",
            "sha256:abc",
            "sha256:zz",
            "md5:00",
            "subject:CN=gw-1",
            &plus,
        ] {
            assert!(bad.parse::<Identity>().is_err(), "{bad}");
        }
    }

    #[test]
    fn certificates_map_to_roles() {
        let (reader, writer, stranger) = (cert("gw-ro"), cert("gw-rw"), cert("other"));
        let replica = cert("index-1");
        let roles = Roles {
            readers: vec!["cn:gw-ro".parse().unwrap(), "cn:index-1".parse().unwrap()],
            writers: vec![hash(&writer).parse().unwrap()],
            peers: vec!["cn:index-1".parse().unwrap()],
        };
        // A replica is a peer (the more of its two lists), a reader is not.
        let as_replica = roles.access(Some(std::slice::from_ref(&replica)));
        assert_eq!(as_replica, Access::Peer);
        assert!(as_replica.may_snapshot());
        let as_reader = roles.access(Some(std::slice::from_ref(&reader)));
        assert_eq!(as_reader, Access::Read);
        assert!(!as_reader.may_snapshot());
        assert_eq!(roles.access(Some(&[writer])), Access::Write);
        let Access::Denied(who) = roles.access(Some(std::slice::from_ref(&stranger))) else {
            panic!("a stranger got in");
        };
        assert!(
            who.contains(&hash(&stranger)) && who.contains("CN=other"),
            "{who}"
        );
        assert!(matches!(roles.access(None), Access::Denied(_)));
        // The writer list wins over the others.
        let both = Roles {
            readers: vec!["cn:gw-ro".parse().unwrap()],
            writers: vec![hash(&reader).parse().unwrap()],
            peers: vec!["cn:gw-ro".parse().unwrap()],
        };
        assert_eq!(
            both.access(Some(std::slice::from_ref(&reader))),
            Access::Write
        );
        // A common name is matched whole: "gw-ro,O=infra" is not "gw-ro".
        let tricky = cert("gw-ro,O=infra");
        assert!(matches!(roles.access(Some(&[tricky])), Access::Denied(_)));
        // Without roles, everyone connected writes.
        assert_eq!(Roles::default().access(None), Access::Write);
    }
}
