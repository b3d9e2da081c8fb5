//! The replicas' settings: the peers, and how a cold start fills itself
//! from them.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::declare::{duration, list, optional, plain, settings, NotZero};
use crate::config::value::{invalid, ConfigError, HumanDuration};

/// The settings of filling from peers refused together when one is zero.
const BOOTSTRAP: NotZero = NotZero(
    "bootstrap-queue/bootstrap-timeout/snapshot-send-timeout",
    "0",
    "must be positive",
);
/// The same of asking peers.
const RETRY: NotZero = NotZero(
    "bootstrap-retry/peer-connect-timeout",
    "0s",
    "must be positive",
);
/// The same of the tail and repair.
const TAIL: NotZero = NotZero("tail-queue/repair-interval", "0", "must be positive");

settings! {
    /// What a user may set of the replicas (see [`crate::config::Settings`]).
    pub struct ReplicaSettings => replicas {
        /// Another replica of this index (host:port of its QUIC listener), asked
        /// for its snapshot when this server starts cold. Repeat the flag; in the
        /// environment separate them with ';'. Tried in the order given.
        #[arg(long = "peer", value_delimiter = ';')]
        // None: the server never fills itself from another.
        peers: Vec<String> = list => peers: Vec<String> = Vec::new(),
        /// CA certificate (PEM) the peers' certificates are checked against;
        /// default: --client-ca, else the server's own certificate.
        #[arg(long)]
        // None: `client_ca`, else the server's own certificate (replicas
        // sharing one certificate).
        peer_ca: PathBuf = optional => peer_ca: Option<PathBuf> = None,
        /// The name the peers' certificates are checked for; default: the host
        /// of each --peer.
        #[arg(long)]
        // None: each peer's host.
        peer_server_name: String = optional => peer_server_name: Option<String> = None,
        /// A snapshot of its own older than this does not count: the server
        /// fills itself from a peer instead.
        #[arg(long)]
        // 1 minute: two snapshot periods, so a server that merely restarted
        // keeps its own, and one that was down longer than that fills from a
        // peer that saw the writes it missed.
        bootstrap_max_age: HumanDuration = duration
            => max_age: Duration = Duration::from_secs(60),
        /// How long filling from peers may take in all (connections, transfers,
        /// restores) before the server starts from its own snapshot, however
        /// old, or empty: all replicas may be starting at once.
        #[arg(long)]
        // 60 s: long enough for a peer that restarts alongside to come up
        // and for a transfer of the default bound's snapshot (about 150 MB,
        // 1 to 2 s on loopback), short enough that a whole set restarting at
        // once serves (from its own snapshots) within about a minute.
        bootstrap_timeout: HumanDuration = duration
            => timeout: Duration = Duration::from_secs(60), check BOOTSTRAP,
        /// Pause between rounds of asking every peer for its snapshot.
        #[arg(long)]
        // 1 s: a peer that is starting too is asked again soon after it can
        // answer, and a set of replicas asking each other sends a few
        // requests a second.
        bootstrap_retry: HumanDuration = duration
            => retry: Duration = Duration::from_secs(1), check RETRY,
        /// Most time one connection attempt to a peer may take.
        #[arg(long)]
        // 5 s: a handshake within a datacenter takes milliseconds, so a peer
        // this slow is taken as down and the next one asked.
        peer_connect_timeout: HumanDuration = duration
            => connect_timeout: Duration = Duration::from_secs(5), check RETRY,
        /// Largest snapshot taken from a peer, in bytes; a larger one is refused.
        #[arg(long)]
        // 4 GiB: the default index's bound (16.8 M entries) makes snapshots
        // of about 150 MB.
        max_snapshot_bytes: u64 = plain => max_snapshot_bytes: u64 = 4 << 30, check 1 << 20..,
        /// Writes held while a peer's snapshot is being restored (applied right
        /// after it), in key blocks (1,024 for a pod-table change); past it,
        /// writes are refused `Unavailable`.
        #[arg(long)]
        // 4,194,304 (counted as `Op::weight`): 32 MiB of block hashes, about
        // ten seconds of a busy gateway fleet's inserts.
        bootstrap_queue: usize = plain => queue: usize = 4 << 20, check BOOTSTRAP,
        /// How long sending this server's snapshot to one peer may take before
        /// the transfer is cut (it holds the index's memory from being freed).
        #[arg(long)]
        // 2 minutes: a 4 GiB snapshot at 150 MB/s takes half that; the
        // transfer pins the index's memory (nothing retired meanwhile is
        // freed) and holds the one transfer slot.
        snapshot_send_timeout: HumanDuration = duration
            => send_timeout: Duration = Duration::from_secs(120), check BOOTSTRAP,
        /// Bytes of a snapshot being sent handed from its writer to the
        /// connection at a time.
        #[arg(long)]
        // 1 MiB: each write to the stream is large enough to be efficient.
        snapshot_piece_bytes: usize = plain
            => send_piece_bytes: usize = 1 << 20, check 4096..=64 << 20,
        /// Pieces of a snapshot being sent queued for the connection; one
        /// transfer holds this many plus two.
        #[arg(long)]
        // 4: 6 MiB a transfer (one piece being filled and one being written
        // besides), and the writer rarely waits.
        snapshot_pieces: usize = plain => send_pieces: usize = 4, check 1..=1024,
        /// How long a replica filled from a peer's snapshot keeps applying the
        /// writes the peer applied after it (its tail), and how long a server
        /// keeps its writes for a peer that stopped asking for them.
        #[arg(long)]
        // 30 s: a gateway's client reconnects within its backoff (2 s at
        // most) and a `Cluster` marks a replica healthy again within a few
        // seconds, so its own writes reach the replica long before. Under
        // 1 s, a tail read every 100 ms lapses between reads.
        tail_window: HumanDuration = duration
            => tail_window: Duration = Duration::from_secs(30), check Duration::from_secs(1)..,
        /// Writes a server keeps for peers following its tail, in key blocks
        /// (1,024 for a pod-table change); past it the oldest are dropped and
        /// a peer behind them is told it lost them.
        #[arg(long)]
        // 4,194,304, counted as the bootstrap queue plus 16 per write
        // (`tail::OP_OVERHEAD`): about 32 MiB, some 200,000 four-block
        // inserts, seconds of a busy fleet's writes (a tail is read every
        // 100 ms).
        tail_queue: usize = plain => tail_queue: usize = 4 << 20, check TAIL,
        /// Pause between rounds of repair: digests compared with each peer's,
        /// and what the peer holds and this server lacks copied.
        #[arg(long)]
        repair_interval: HumanDuration = duration
            => repair_interval: Duration = Duration::from_secs(1), check TAIL,
        /// Most items (block position, pod) compared with each peer per round
        /// of repair, and most asked for; 0 turns repair off.
        #[arg(long)]
        // 262,144: one answer of items (`MAX_DIGEST_ANSWER`) a round, at
        // most 2.4 MB from the peer; a minute of 1,000 new four-block keys
        // a second missed is copied in a few rounds.
        repair_budget: usize = plain => repair_budget: usize = 1 << 18, check 0..=(1 << 24),
    }
    /// The other replicas, and how a cold start fills itself from them.
    pub struct ReplicaConfig {}
}

impl ReplicaConfig {
    /// Checks what the table's rules cannot: that each peer is `host:port`.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(p) = self.peers.iter().find(|p| split_peer(p).is_none()) {
            return invalid("peer", p, "not host:port");
        }
        Ok(())
    }
}
/// The host and port of a `host:port` peer (`[v6]:port` too), if it is one.
pub fn split_peer(peer: &str) -> Option<(&str, u16)> {
    let (host, port) = peer.rsplit_once(':')?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let port = port.parse().ok()?;
    (!host.is_empty()).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_are_host_and_port() {
        assert_eq!(
            split_peer("index-1.index:7070"),
            Some(("index-1.index", 7070))
        );
        assert_eq!(split_peer("[::1]:7070"), Some(("::1", 7070)));
        for bad in ["index-1", ":7070", "h:port", "h:70700"] {
            assert_eq!(split_peer(bad), None, "{bad}");
        }
    }
}
