//! Where each followed engine's live messages come from, decided as it is
//! subscribed, and the descriptors that costs.
//!
//! A shard's engines at an address share SUB sockets: a *group* is one SUB
//! socket connected to many engines, whose messages it tells apart by the
//! address they came from and their topic ([`Routes`]), so a group holds at
//! most one engine per address and topic, and per endpoint; the next such
//! engine opens another group. An engine named by host name has a SUB
//! socket of its own. Each of those sockets, watched by a monitor, holds
//! `per_watched` descriptors (`crate::descriptors`).
//!
//! The seats are decided here, under the followed set's lock, rather than
//! in the shard's thread, so that a subscription whose sockets the
//! open-file limit has no room for is refused as it is made, with the
//! reason, and the engines already followed keep their descriptors. Taken
//! on regardless, its sockets would use the last descriptors and leave
//! none for the connections of every engine (libzmq opens a socket, then
//! fails to connect it), so that at the limit no engine would be followed.
//!
//! **Budget.** These sockets get what the soft open-file limit leaves
//! beyond what the rest of the server may hold at once ([`held`]): the
//! base, one connection per engine up to `max-engines`, the replays and
//! the HTTP connections. A shard's first group is counted in the base, so
//! engines at distinct addresses cost nothing here. The limit is read at
//! each subscription: raised on a running server (`prlimit`), it lets the
//! next ones in. A seat given up is free at once, while libzmq closes the
//! old sockets' descriptors a moment later on its reaper thread: a socket
//! opened in that moment may find none, and is tried again every second
//! (`list-engines` shows why meanwhile).
//!
//! [`held`]: crate::descriptors::held

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};

use thiserror::Error;

/// Where a subscription's live messages come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seat {
    /// Group `id` of its shard, which it joins through `addr`. Ids are not
    /// used again within a shard, so a group a shard has yet to close is
    /// never taken for a new one of the same id.
    Group { id: u64, addr: SocketAddr },
    /// A SUB socket of its own (an engine named by host name: libzmq
    /// resolves the name, so neither its address nor its monitor's
    /// endpoint is known beforehand).
    Own,
}

/// A subscription refused for want of descriptors.
#[derive(Debug, Clone, Copy, Error, PartialEq, Eq)]
#[error(
    "not enough open files for this engine's sockets: they need {needs} descriptors, and \
     {left} are left of the {room} that the open-file limit ({limit}) leaves for engine sockets \
     (raise the limit: ulimit -Hn, LimitNOFILE=; or follow fewer engines named by host name \
     or sharing an address and a topic)"
)]
pub struct OutOfDescriptors {
    /// Descriptors the subscription's sockets would hold.
    pub needs: u64,
    /// Descriptors left for engine sockets.
    pub left: u64,
    /// Descriptors the limit leaves for engine sockets in all.
    pub room: u64,
    /// The soft open-file limit.
    pub limit: u64,
}

/// The seats of all subscriptions, and the descriptors their sockets hold.
#[derive(Debug, Clone)]
pub(super) struct Seats {
    /// Each shard's groups by id.
    shards: Vec<Groups>,
    /// Each subscription's seat, by pod.
    taken: HashMap<String, Taken>,
    /// Descriptors held by the sockets seated (beyond each shard's first
    /// group).
    used: u64,
    /// Descriptors the rest of the server may hold.
    held: u64,
    /// Descriptors one watched socket holds.
    per_watched: u64,
}

#[derive(Debug, Clone, Default)]
struct Groups {
    by_id: BTreeMap<u64, Routes<()>>,
    next: u64,
}

impl Groups {
    /// Descriptors the groups' sockets hold beyond the first group's, at
    /// `per_watched` a socket.
    fn cost(&self, per_watched: u64) -> u64 {
        self.by_id.len().saturating_sub(1) as u64 * per_watched
    }
}

/// A seat taken, and the one of its pod it replaced.
#[derive(Debug)]
pub(super) struct Seated {
    pub(super) seat: Seat,
    old: Option<Taken>,
}

#[derive(Debug, Clone)]
struct Taken {
    shard: usize,
    seat: Seat,
    topic: String,
}

impl Seats {
    /// No seats yet, over `shards` shards, beside `held` descriptors of the
    /// rest of the server, each watched socket holding `per_watched`.
    pub(super) fn new(shards: usize, held: u64, per_watched: u64) -> Seats {
        Seats {
            shards: (0..shards).map(|_| Groups::default()).collect(),
            taken: HashMap::new(),
            used: 0,
            held,
            per_watched,
        }
    }

    /// Seats `pod`'s engine at `endpoint` under `topic` on shard `shard`,
    /// in place of the pod's seat if it has one, within the soft open-file
    /// limit `limit`. Refused, it leaves every seat as it was.
    pub(super) fn take(
        &mut self,
        pod: &str,
        shard: usize,
        endpoint: &str,
        topic: &str,
        limit: u64,
    ) -> Result<Seated, OutOfDescriptors> {
        let old = self.unseat(pod);
        let w = self.per_watched;
        let (seat, needs) = match endpoint_addr(endpoint) {
            Some(addr) => {
                let groups = &self.shards[shard];
                let found = groups
                    .by_id
                    .iter()
                    .find(|(_, r)| r.takes(addr, topic))
                    .map(|(&id, _)| id);
                // A new group costs a socket, but for the shard's first.
                let needs = match found.is_some() || groups.by_id.is_empty() {
                    true => 0,
                    false => w,
                };
                let id = found.unwrap_or(groups.next);
                (Seat::Group { id, addr }, needs)
            }
            None => (Seat::Own, w),
        };
        let room = limit.saturating_sub(self.held);
        if self.used + needs > room {
            let left = room.saturating_sub(self.used);
            if let Some(old) = old {
                self.seat(pod, old);
            }
            return Err(OutOfDescriptors {
                needs,
                left,
                room,
                limit,
            });
        }
        if let Seat::Group { id, .. } = seat {
            let groups = &mut self.shards[shard];
            groups.next = groups.next.max(id + 1);
        }
        let topic = topic.to_string();
        self.seat(pod, Taken { shard, seat, topic });
        Ok(Seated { seat, old })
    }

    /// Undoes `seated`, `pod`'s seat from [`Seats::take`]: the pod's seat is
    /// the one it had before.
    pub(super) fn undo(&mut self, pod: &str, seated: Seated) {
        self.unseat(pod);
        if let Some(old) = seated.old {
            self.seat(pod, old);
        }
    }

    /// Gives up `pod`'s seat; returns whether it had one.
    pub(super) fn release(&mut self, pod: &str) -> bool {
        self.unseat(pod).is_some()
    }

    /// Takes out `pod`'s seat, if it has one.
    fn unseat(&mut self, pod: &str) -> Option<Taken> {
        let taken = self.taken.remove(pod)?;
        let w = self.per_watched;
        match taken.seat {
            Seat::Group { id, addr } => {
                let groups = &mut self.shards[taken.shard];
                self.used -= groups.cost(w);
                if let Some(routes) = groups.by_id.get_mut(&id) {
                    routes.remove(addr, &taken.topic, ());
                    if routes.is_empty() {
                        groups.by_id.remove(&id);
                    }
                }
                self.used += groups.cost(w);
            }
            Seat::Own => self.used -= w,
        }
        Some(taken)
    }

    /// Seats `pod` as `taken` says (a seat decided, or one
    /// [`Seats::unseat`] took out), counting its descriptors.
    fn seat(&mut self, pod: &str, taken: Taken) {
        let w = self.per_watched;
        match taken.seat {
            Seat::Group { id, addr } => {
                let groups = &mut self.shards[taken.shard];
                self.used -= groups.cost(w);
                let routes = groups.by_id.entry(id).or_default();
                routes.insert(addr, &taken.topic, ());
                self.used += groups.cost(w);
            }
            Seat::Own => self.used += w,
        }
        self.taken.insert(pod.to_string(), taken);
    }

    /// Descriptors the seated sockets hold beyond each shard's first group.
    #[cfg(test)]
    fn used(&self) -> u64 {
        self.used
    }
}

/// Which engine of a group each connection and message belongs to.
#[derive(Debug, Clone)]
pub(super) struct Routes<T> {
    /// Engines by the endpoint they are connected through.
    pub(super) by_addr: HashMap<SocketAddr, T>,
    /// Engines by the address and topic of their messages.
    by_origin: HashMap<IpAddr, HashMap<Vec<u8>, T>>,
}

impl<T> Default for Routes<T> {
    fn default() -> Self {
        Routes {
            by_addr: HashMap::new(),
            by_origin: HashMap::new(),
        }
    }
}

impl<T: Copy + PartialEq> Routes<T> {
    pub(super) fn insert(&mut self, addr: SocketAddr, topic: &str, id: T) {
        self.by_addr.insert(addr, id);
        self.by_origin
            .entry(addr.ip())
            .or_default()
            .insert(topic.as_bytes().to_vec(), id);
    }

    /// Takes out engine `id`'s routes (none of another engine's).
    pub(super) fn remove(&mut self, addr: SocketAddr, topic: &str, id: T) {
        if self.by_addr.get(&addr) == Some(&id) {
            self.by_addr.remove(&addr);
        }
        if let Some(topics) = self.by_origin.get_mut(&addr.ip()) {
            if topics.get(topic.as_bytes()) == Some(&id) {
                topics.remove(topic.as_bytes());
            }
            if topics.is_empty() {
                self.by_origin.remove(&addr.ip());
            }
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }

    /// Whether an engine at `addr` publishing under `topic` can join: its
    /// messages must be told from every other engine's. An empty topic
    /// takes every message of its address, so it shares the address with
    /// no other engine of the group.
    pub(super) fn takes(&self, addr: SocketAddr, topic: &str) -> bool {
        !self.by_addr.contains_key(&addr)
            && self.by_origin.get(&addr.ip()).is_none_or(|t| {
                !topic.is_empty() && !t.contains_key(topic.as_bytes()) && !t.contains_key(&b""[..])
            })
    }

    /// The engine a message from `ip` under `topic` belongs to; else, if
    /// engines at `ip` are followed, one of them (to hear of it).
    pub(super) fn owner(&self, ip: Option<IpAddr>, topic: &[u8]) -> Option<Result<T, T>> {
        let topics = self.by_origin.get(&ip?)?;
        match topics.get(topic).or_else(|| topics.get(&b""[..])) {
            Some(&id) => Some(Ok(id)),
            None => topics.values().next().map(|&id| Err(id)),
        }
    }
}

/// The address of a `tcp://address:port` endpoint, if it names one (not a
/// host name).
pub(super) fn endpoint_addr(endpoint: &str) -> Option<SocketAddr> {
    endpoint.strip_prefix("tcp://")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_endpoints_at_an_address_share_a_socket() {
        assert_eq!(
            endpoint_addr("tcp://10.0.0.7:5557"),
            Some("10.0.0.7:5557".parse().unwrap())
        );
        assert_eq!(
            endpoint_addr("tcp://[fd00::7]:5557"),
            Some("[fd00::7]:5557".parse().unwrap())
        );
        for named in [
            "tcp://vllm-0.vllm.default.svc:5557",
            "tcp://localhost:5557",
            "tcp://*:5557",
            "tcp://10.0.0.1;10.0.0.7:5557",
        ] {
            assert_eq!(endpoint_addr(named), None, "{named}");
        }
    }

    /// Engines share a group while their messages can be told apart: by
    /// address, then by topic; an empty topic takes its address whole.
    #[test]
    fn a_group_routes_by_address_and_topic() {
        let at = |s: &str| -> SocketAddr { s.parse().unwrap() };
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let mut r = Routes::default();
        r.insert(at("10.0.0.1:5557"), "kv@a@m", 1);
        assert!(r.takes(at("10.0.0.1:5558"), "kv@b@m"));
        r.insert(at("10.0.0.1:5558"), "kv@b@m", 2);
        // The same endpoint, or the same address and topic: not here.
        assert!(!r.takes(at("10.0.0.1:5557"), "kv@c@m"));
        assert!(!r.takes(at("10.0.0.1:5559"), "kv@a@m"));
        // An empty topic would take messages of both.
        assert!(!r.takes(at("10.0.0.1:5559"), ""));
        assert!(r.takes(at("10.0.0.2:5557"), ""));
        r.insert(at("10.0.0.2:5557"), "", 3);
        assert!(!r.takes(at("10.0.0.2:5558"), "kv@d@m"));
        assert_eq!(r.owner(ip("10.0.0.1"), b"kv@b@m"), Some(Ok(2)));
        assert_eq!(r.owner(ip("10.0.0.2"), b"anything"), Some(Ok(3)));
        assert!(matches!(
            r.owner(ip("10.0.0.1"), b"kv@z@m"),
            Some(Err(1 | 2))
        ));
        assert_eq!(r.owner(ip("10.0.0.9"), b"kv@a@m"), None);
        assert_eq!(r.owner(None, b"kv@a@m"), None);
        // Another engine's routes stay.
        r.remove(at("10.0.0.1:5557"), "kv@a@m", 9);
        assert!(!r.takes(at("10.0.0.1:5559"), "kv@a@m"));
        r.remove(at("10.0.0.1:5557"), "kv@a@m", 1);
        assert!(r.takes(at("10.0.0.1:5559"), "kv@a@m"));
        r.remove(at("10.0.0.1:5558"), "kv@b@m", 2);
        r.remove(at("10.0.0.2:5557"), "", 3);
        assert!(r.is_empty() && r.by_origin.is_empty());
    }

    /// A watched socket's descriptors, as on Linux.
    const W: u64 = 3;

    /// `pod`'s seat at `endpoint` on `shard` under the topic `kv`.
    fn seat(
        s: &mut Seats,
        pod: &str,
        shard: usize,
        endpoint: &str,
        limit: u64,
    ) -> Result<Seat, OutOfDescriptors> {
        s.take(pod, shard, endpoint, "kv", limit).map(|s| s.seat)
    }

    /// Engines at distinct addresses share their shard's first group and
    /// cost nothing; each engine sharing an address and topic with another
    /// opens a group, and each named by host name a socket, within the
    /// room the limit leaves beyond what the server holds.
    #[test]
    fn seats_cost_what_their_sockets_hold_and_stop_at_the_limit() {
        let held = 100;
        let mut s = Seats::new(2, held, W);
        let limit = held + 2 * W;
        for i in 0..50 {
            let seat = seat(
                &mut s,
                &format!("d{i}"),
                0,
                &format!("tcp://10.0.1.{i}:5557"),
                limit,
            );
            assert!(matches!(seat, Ok(Seat::Group { id: 0, .. })), "{seat:?}");
        }
        assert_eq!(s.used(), 0);
        // The same address and topic as d0: a second group of shard 0.
        let same = "tcp://10.0.1.0:5558";
        assert!(matches!(
            seat(&mut s, "s1", 0, same, limit),
            Ok(Seat::Group { id: 1, .. })
        ));
        // On shard 1 it is that shard's first group: free.
        assert!(matches!(
            seat(&mut s, "s2", 1, same, limit),
            Ok(Seat::Group { id: 0, .. })
        ));
        assert_eq!(s.used(), W);
        assert_eq!(
            seat(&mut s, "n1", 0, "tcp://vllm-0:5557", limit),
            Ok(Seat::Own)
        );
        assert_eq!(s.used(), 2 * W);
        let short = seat(&mut s, "n2", 1, "tcp://vllm-1:5557", limit).unwrap_err();
        assert_eq!(
            short,
            OutOfDescriptors {
                needs: W,
                left: 0,
                room: 2 * W,
                limit
            }
        );
        let short = seat(&mut s, "s3", 0, "tcp://10.0.1.0:5559", limit).unwrap_err();
        assert_eq!(short.needs, W);
        // Refused seats take nothing; a raised limit lets them in.
        assert_eq!(s.used(), 2 * W);
        assert_eq!(
            seat(&mut s, "n2", 1, "tcp://vllm-1:5557", limit + W),
            Ok(Seat::Own)
        );
        // A released seat gives its descriptors back; a group's last
        // engine gone, the group goes, and its id is not used again.
        assert!(s.release("n1"));
        assert!(s.release("s1"));
        assert_eq!(s.used(), W);
        assert!(matches!(
            seat(&mut s, "s1", 0, same, limit),
            Ok(Seat::Group { id: 2, .. })
        ));
        assert!(!s.release("nobody"));
    }

    /// A subscription replacing its pod's is seated as if the old seat
    /// were gone; refused, the old seat stays as it was.
    #[test]
    fn a_replacement_counts_without_its_old_seat_and_keeps_it_when_refused() {
        let mut s = Seats::new(1, 0, W);
        let limit = W;
        assert_eq!(
            seat(&mut s, "a", 0, "tcp://vllm-0:5557", limit),
            Ok(Seat::Own)
        );
        // Replaced by another named engine: fits in the old one's room.
        assert_eq!(
            seat(&mut s, "a", 0, "tcp://vllm-1:5557", limit),
            Ok(Seat::Own)
        );
        assert_eq!(s.used(), W);
        assert!(seat(&mut s, "b", 0, "tcp://vllm-2:5557", limit).is_err());
        assert_eq!(s.used(), W);
        assert!(s.taken.contains_key("a") && !s.taken.contains_key("b"));
        // Moved to an address: the shard's first group, free.
        let moved = s.take("a", 0, "tcp://10.0.0.1:5557", "kv", limit).unwrap();
        assert!(matches!(moved.seat, Seat::Group { .. }));
        assert_eq!(s.used(), 0);
        // Undone (the index refused the pod, say): named again.
        s.undo("a", moved);
        assert_eq!(s.used(), W);
        assert!(matches!(s.taken["a"].seat, Seat::Own));
        let new = s.take("c", 0, "tcp://10.0.0.1:5557", "kv", limit).unwrap();
        s.undo("c", new);
        assert!(!s.taken.contains_key("c"));
    }
}
