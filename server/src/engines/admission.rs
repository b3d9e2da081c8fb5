//! Who may publish to the central collector (`--engine-listen`).
//!
//! Two checks, both before a message reaches the index:
//! - **Where from.** libzmq asks a ZAP handler (ZeroMQ's authentication
//!   protocol, RFC 27) about each connection to the collector's socket
//!   before it reads a message of it; [`answer`] admits the peer when its
//!   address is in `--engine-allow` (anyone when the list is empty) and
//!   names it by that address (the connection's `User-Id`).
//! - **Whose topic.** A pod met through the collector is bound to the
//!   `User-Id` of its first message; a message under its topic from
//!   anywhere else is refused ([`Binding`]) unless `--engine-allow-moves`
//!   lets the pod move.
//!
//! Each refusal is counted by reason and logged at most once per
//! [`LOG_EVERY`](super::stats::LOG_EVERY).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ipnet::IpNet;
use parking_lot::Mutex;

/// The ZAP domain the collector's socket sets, so that libzmq asks the
/// handler about connections that use no security mechanism (NULL).
pub(super) const DOMAIN: &str = "prefix-index-engines";

/// Where libzmq sends ZAP requests: an inproc endpoint of the collector's
/// context (fixed by RFC 27).
pub(super) const ENDPOINT: &str = "inproc://zeromq.zap.01";

/// The networks engines may connect from; empty admits anyone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineAllow(Vec<IpNet>);

impl EngineAllow {
    /// Parses each entry: a network (`10.0.0.0/16`, `fd00::/8`) or one
    /// address; the error is the first entry that is neither.
    pub fn parse(entries: &[String]) -> Result<EngineAllow, String> {
        entries
            .iter()
            .map(|e| {
                let e = e.trim();
                e.parse::<IpNet>()
                    .or_else(|_| e.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| e.to_string())
            })
            .collect::<Result<_, _>>()
            .map(EngineAllow)
    }

    /// The entries, as given back by [`EngineAllow::parse`].
    pub fn entries(&self) -> Vec<String> {
        self.0.iter().map(ToString::to_string).collect()
    }

    /// Whether the list is empty: anyone is admitted.
    pub fn is_open(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `ip` may connect. An IPv4 peer of a dual-stack socket shows
    /// as an IPv4-mapped IPv6 address, and is checked as the IPv4 one.
    pub fn admits(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.is_open() || self.0.iter().any(|net| net.contains(&ip))
    }
}

/// What [`answer`] decided about one connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Verdict {
    /// Admitted, named by this address.
    Admitted(String),
    /// Refused: its address is not in the list.
    Refused(String),
    /// Not a ZAP request this handler understands; refused.
    Malformed,
}

/// The ZAP reply to one request's frames (version, request id, domain,
/// address, routing id, mechanism, credentials...), and what it decided.
pub(super) fn answer(request: &[Vec<u8>], allow: &EngineAllow) -> (Vec<Vec<u8>>, Verdict) {
    let id = request.get(1).cloned().unwrap_or_default();
    let reply = |code: &str, text: &str, user: &str| {
        vec![
            b"1.0".to_vec(),
            id.clone(),
            code.as_bytes().to_vec(),
            text.as_bytes().to_vec(),
            user.as_bytes().to_vec(),
            Vec::new(),
        ]
    };
    let address = match request {
        [version, _, _, address, _, mechanism, ..] if version == b"1.0" && mechanism == b"NULL" => {
            std::str::from_utf8(address).ok()
        }
        _ => None,
    };
    let Some(address) = address else {
        return (
            reply("500", "not a ZAP 1.0 request for NULL", ""),
            Verdict::Malformed,
        );
    };
    match address.parse::<IpAddr>() {
        Ok(ip) if allow.admits(ip) => {
            let name = ip.to_canonical().to_string();
            (reply("200", "OK", &name), Verdict::Admitted(name))
        }
        // An address that is no plain IP (an IPv6 one with its zone,
        // `fe80::1%eth0`, or none at all) is admitted only by an open
        // list, named as libzmq gave it.
        Err(_) if allow.is_open() => {
            let name = match address {
                "" => "unknown".to_string(),
                a => a.to_string(),
            };
            (reply("200", "OK", &name), Verdict::Admitted(name))
        }
        _ => (
            reply("400", "not in --engine-allow", ""),
            Verdict::Refused(address.to_string()),
        ),
    }
}

/// The origin a pod met through the collector is bound to, and whether a
/// message from `origin` under its topic is taken.
#[derive(Debug)]
pub(super) struct Binding {
    origin: Option<Box<str>>,
}

/// What [`Binding::check`] decided.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Check<'a> {
    /// From the pod's origin (or the first message: now its origin).
    Same,
    /// From another origin, which is now the pod's: it was `from`.
    Moved { from: Box<str> },
    /// From another origin than the pod's, `bound`: refused.
    Foreign { bound: &'a str },
}

impl Binding {
    /// A pod not yet bound: its first message binds it.
    pub(super) fn new() -> Binding {
        Binding { origin: None }
    }

    /// Checks a message from `origin`.
    pub(super) fn check(&mut self, origin: &str, moves: bool) -> Check<'_> {
        match self.origin.as_deref().map(|bound| bound == origin) {
            None => {
                self.origin = Some(origin.into());
                Check::Same
            }
            Some(true) => Check::Same,
            Some(false) if moves => Check::Moved {
                from: self.origin.replace(origin.into()).unwrap_or_default(),
            },
            Some(false) => Check::Foreign {
                bound: self.origin.as_deref().unwrap_or_default(),
            },
        }
    }
}

/// Why publishing was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineRefusal {
    /// A connection from outside `--engine-allow`.
    Address = 0,
    /// A message under a pod's topic from another origin than the pod's.
    Moved = 1,
}

impl EngineRefusal {
    /// Each reason, in label order.
    pub const ALL: [EngineRefusal; 2] = [EngineRefusal::Address, EngineRefusal::Moved];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            EngineRefusal::Address => "address",
            EngineRefusal::Moved => "moved",
        }
    }
}

/// Refusals counted by reason, each reason logged at most once per
/// `LOG_EVERY` (a flood of one does not hide the other).
#[derive(Debug, Default)]
pub(super) struct Refusals {
    counts: [AtomicU64; EngineRefusal::ALL.len()],
    logged: [Mutex<Option<Instant>>; EngineRefusal::ALL.len()],
}

impl Refusals {
    /// Counts a refusal, and logs `what` unless one of its reason was
    /// logged lately.
    pub(super) fn refuse(&self, why: EngineRefusal, what: impl FnOnce() -> String) {
        let n = self.count_one(why);
        if !super::stats::log_due(&mut self.logged[why as usize].lock()) {
            return;
        }
        tracing::warn!(
            reason = why.label(),
            refused = n,
            "engine collector: refused {}",
            what()
        );
    }

    /// Counts a refusal that is logged elsewhere (by its pod); the count so
    /// far.
    pub(super) fn count_one(&self, why: EngineRefusal) -> u64 {
        // Relaxed: a statistic.
        1 + self.counts[why as usize].fetch_add(1, Ordering::Relaxed)
    }

    /// Refusals so far for `why`.
    pub(super) fn count(&self, why: EngineRefusal) -> u64 {
        // Relaxed: a statistic.
        self.counts[why as usize].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(address: &str) -> Vec<Vec<u8>> {
        ["1.0", "7", DOMAIN, address, "", "NULL"]
            .map(|f| f.as_bytes().to_vec())
            .to_vec()
    }

    #[test]
    fn the_list_admits_its_networks_and_addresses_only() {
        let allow = EngineAllow::parse(&[
            "10.1.0.0/16".into(),
            " 192.168.5.7 ".into(),
            "fd00::/8".into(),
        ])
        .unwrap();
        for (ip, admitted) in [
            ("10.1.200.3", true),
            ("10.2.0.1", false),
            ("192.168.5.7", true),
            ("192.168.5.8", false),
            ("fd12::1", true),
            ("fe80::1", false),
            // An IPv4 peer of a dual-stack socket.
            ("::ffff:10.1.0.9", true),
        ] {
            assert_eq!(allow.admits(ip.parse().unwrap()), admitted, "{ip}");
        }
        assert!(EngineAllow::default().admits("203.0.113.1".parse().unwrap()));
        assert!(EngineAllow::parse(&["10.0.0.0/33".into()]).is_err());
        assert!(EngineAllow::parse(&["pods".into()]).is_err());
        assert_eq!(
            allow.entries(),
            ["10.1.0.0/16", "192.168.5.7/32", "fd00::/8"]
        );
    }

    #[test]
    fn zap_requests_are_answered_by_address() {
        let allow = EngineAllow::parse(&["10.0.0.0/8".into()]).unwrap();
        let (reply, verdict) = answer(&request("10.0.0.5"), &allow);
        assert_eq!(verdict, Verdict::Admitted("10.0.0.5".into()));
        assert_eq!(reply[..5], [&b"1.0"[..], b"7", b"200", b"OK", b"10.0.0.5"]);
        assert_eq!(reply.len(), 6);
        let (reply, verdict) = answer(&request("::ffff:10.0.0.6"), &allow);
        assert_eq!(
            (verdict, &reply[4][..]),
            (Verdict::Admitted("10.0.0.6".into()), &b"10.0.0.6"[..])
        );
        let (reply, verdict) = answer(&request("172.16.0.1"), &allow);
        assert_eq!(verdict, Verdict::Refused("172.16.0.1".into()));
        assert_eq!((&reply[1][..], &reply[2][..]), (&b"7"[..], &b"400"[..]));
        // Not ZAP 1.0, another mechanism, too few frames: refused.
        let mut old = request("10.0.0.5");
        old[0] = b"0.9".to_vec();
        let mut curve = request("10.0.0.5");
        curve[5] = b"CURVE".to_vec();
        for bad in [old, curve, request("10.0.0.5")[..3].to_vec(), Vec::new()] {
            let (reply, verdict) = answer(&bad, &allow);
            assert_eq!((verdict, &reply[2][..]), (Verdict::Malformed, &b"500"[..]));
        }
        // An address that is no plain IP: refused by a list, admitted as
        // given by an open one.
        for odd in ["fe80::1%eth0", ""] {
            assert_eq!(
                answer(&request(odd), &allow).1,
                Verdict::Refused(odd.into())
            );
        }
        let open = EngineAllow::default();
        let (reply, verdict) = answer(&request("fe80::1%eth0"), &open);
        assert_eq!(verdict, Verdict::Admitted("fe80::1%eth0".into()));
        assert_eq!(&reply[4][..], b"fe80::1%eth0");
        assert_eq!(
            answer(&request(""), &open).1,
            Verdict::Admitted("unknown".into())
        );
    }

    #[test]
    fn a_pod_stays_with_its_first_origin_unless_moves_are_allowed() {
        let mut b = Binding::new();
        assert_eq!(b.check("10.0.0.5", false), Check::Same);
        assert_eq!(b.check("10.0.0.5", false), Check::Same);
        assert_eq!(
            b.check("10.0.0.9", false),
            Check::Foreign { bound: "10.0.0.5" }
        );
        assert_eq!(
            b.check("10.0.0.9", true),
            Check::Moved {
                from: "10.0.0.5".into()
            }
        );
        assert_eq!(
            b.check("10.0.0.5", false),
            Check::Foreign { bound: "10.0.0.9" }
        );
    }
}
