//! The replicas' settings: the peers, and how a cold start fills itself
//! from them.

use std::path::PathBuf;
use std::time::Duration;

use crate::config::declare::{duration, list, optional, plain, settings};
use crate::config::value::{invalid, ConfigError, HumanDuration};

settings! {
    /// What a user may set of the replicas (see [`crate::config::Settings`]).
    pub struct ReplicaSettings {
        /// Another replica of this index (host:port of its QUIC listener), asked
        /// for its snapshot when this server starts cold. Repeat the flag; in the
        /// environment separate them with ';'. Tried in the order given.
        #[arg(long = "peer", env = "PREFIX_INDEX_PEERS", value_delimiter = ';')]
        peers: Vec<String> = list => replicas.peers,
        /// CA certificate (PEM) the peers' certificates are checked against;
        /// default: --client-ca, else the server's own certificate.
        #[arg(long, env = "PREFIX_INDEX_PEER_CA")]
        peer_ca: PathBuf = optional => replicas.peer_ca,
        /// The name the peers' certificates are checked for; default: the host
        /// of each --peer.
        #[arg(long, env = "PREFIX_INDEX_PEER_SERVER_NAME")]
        peer_server_name: String = optional => replicas.peer_server_name,
        /// A snapshot of its own older than this does not count: the server
        /// fills itself from a peer instead.
        #[arg(long, env = "PREFIX_INDEX_BOOTSTRAP_MAX_AGE")]
        bootstrap_max_age: HumanDuration = duration => replicas.max_age,
        /// How long filling from peers may take in all (connections, transfers,
        /// restores) before the server starts from its own snapshot, however
        /// old, or empty: all replicas may be starting at once.
        #[arg(long, env = "PREFIX_INDEX_BOOTSTRAP_TIMEOUT")]
        bootstrap_timeout: HumanDuration = duration => replicas.timeout,
        /// Pause between rounds of asking every peer for its snapshot.
        #[arg(long, env = "PREFIX_INDEX_BOOTSTRAP_RETRY")]
        bootstrap_retry: HumanDuration = duration => replicas.retry,
        /// Most time one connection attempt to a peer may take.
        #[arg(long, env = "PREFIX_INDEX_PEER_CONNECT_TIMEOUT")]
        peer_connect_timeout: HumanDuration = duration => replicas.connect_timeout,
        /// Largest snapshot taken from a peer, in bytes; a larger one is refused.
        #[arg(long, env = "PREFIX_INDEX_MAX_SNAPSHOT_BYTES")]
        max_snapshot_bytes: u64 = plain => replicas.max_snapshot_bytes,
        /// Writes held while a peer's snapshot is being restored (applied right
        /// after it), in key blocks (1,024 for a pod-table change); past it,
        /// writes are refused `Unavailable`.
        #[arg(long, env = "PREFIX_INDEX_BOOTSTRAP_QUEUE")]
        bootstrap_queue: usize = plain => replicas.queue,
        /// How long sending this server's snapshot to one peer may take before
        /// the transfer is cut (it holds the index's memory from being freed).
        #[arg(long, env = "PREFIX_INDEX_SNAPSHOT_SEND_TIMEOUT")]
        snapshot_send_timeout: HumanDuration = duration => replicas.send_timeout,
        /// Bytes of a snapshot being sent handed from its writer to the
        /// connection at a time.
        #[arg(long, env = "PREFIX_INDEX_SNAPSHOT_PIECE_BYTES")]
        snapshot_piece_bytes: usize = plain => replicas.send_piece_bytes,
        /// Pieces of a snapshot being sent queued for the connection; one
        /// transfer holds this many plus two.
        #[arg(long, env = "PREFIX_INDEX_SNAPSHOT_PIECES")]
        snapshot_pieces: usize = plain => replicas.send_pieces,
        /// How long a replica filled from a peer's snapshot keeps applying the
        /// writes the peer applied after it (its tail), and how long a server
        /// keeps its writes for a peer that stopped asking for them.
        #[arg(long, env = "PREFIX_INDEX_TAIL_WINDOW")]
        tail_window: HumanDuration = duration => replicas.tail_window,
        /// Writes a server keeps for peers following its tail, in key blocks
        /// (1,024 for a pod-table change); past it the oldest are dropped and
        /// a peer behind them is told it lost them.
        #[arg(long, env = "PREFIX_INDEX_TAIL_QUEUE")]
        tail_queue: usize = plain => replicas.tail_queue,
        /// Pause between rounds of repair: keys sampled from each peer, looked
        /// up on both, and what the peer holds and this server lacks copied.
        #[arg(long, env = "PREFIX_INDEX_REPAIR_INTERVAL")]
        repair_interval: HumanDuration = duration => replicas.repair_interval,
        /// Keys sampled from each peer per round of repair (at most 256); 0
        /// turns repair off.
        #[arg(long, env = "PREFIX_INDEX_REPAIR_KEYS")]
        repair_keys: u32 = plain => replicas.repair_keys,
    }
}

/// The other replicas, and how a cold start fills itself from them.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplicaConfig {
    /// The peers' QUIC addresses (`host:port`), asked in this order. Default
    /// none: the server never fills itself from another.
    pub peers: Vec<String>,
    /// CA the peers' certificates are checked against; none: `client_ca`,
    /// else the server's own certificate (replicas sharing one certificate).
    pub peer_ca: Option<PathBuf>,
    /// Name the peers' certificates must carry; none: each peer's host.
    pub peer_server_name: Option<String>,
    /// A snapshot of its own older than this is not started from while a
    /// peer can give a fresher one. Default 1 minute: two snapshot periods,
    /// so a server that merely restarted keeps its own, and one that was down
    /// longer than that fills from a peer that saw the writes it missed.
    pub max_age: Duration,
    /// How long filling may take in all: every connection, transfer and
    /// restore, over every peer asked. Default 60 s: long enough for a peer
    /// that restarts alongside to come up and for a transfer of the default
    /// bound's snapshot (about 150 MB, 1 to 2 s on loopback), short enough
    /// that a whole set restarting at once serves (from its own snapshots)
    /// within about a minute.
    pub timeout: Duration,
    /// Pause between rounds of asking every peer. Default 1 s: a peer that
    /// is starting too is asked again soon after it can answer, and a set
    /// of replicas asking each other sends a few requests a second.
    pub retry: Duration,
    /// Most time one connection attempt to a peer may take. Default 5 s:
    /// a handshake within a datacenter takes milliseconds, so a peer this
    /// slow is taken as down and the next one asked.
    pub connect_timeout: Duration,
    /// Largest snapshot accepted from a peer. Default 4 GiB: the default
    /// index's bound (16.8 M entries) makes snapshots of about 150 MB.
    pub max_snapshot_bytes: u64,
    /// Writes held while filling, counted by weight (key blocks; 1,024 for
    /// a pod-table change, as `Op::weight`). Default 4,194,304: 32 MiB of
    /// block hashes, about ten seconds of a busy gateway fleet's inserts.
    pub queue: usize,
    /// How long sending one snapshot to a peer may take before the transfer
    /// is cut: it pins the index's memory (nothing retired meanwhile is
    /// freed) and holds the one transfer slot. Default 2 minutes: a 4 GiB
    /// snapshot at 150 MB/s takes half that.
    pub send_timeout: Duration,
    /// Bytes of a snapshot being sent handed from the job that writes it to
    /// the connection at a time. Default 1 MiB: each write to the stream is
    /// large enough to be efficient.
    pub send_piece_bytes: usize,
    /// Pieces queued between the writing job and the connection; with one
    /// being filled and one being written, a transfer holds this many plus
    /// two. Default 4: 6 MiB a transfer, and the writer rarely waits.
    pub send_pieces: usize,
    /// How long a filled replica follows its peer's tail, and how long a
    /// server keeps writes for a tail nobody asks for. Default 30 s: a
    /// gateway's client reconnects within its backoff (2 s at most) and a
    /// `Cluster` marks a replica healthy again within a few seconds, so
    /// its own writes reach the replica long before.
    pub tail_window: Duration,
    /// Writes kept for tails, counted by weight as `queue` plus 16 per
    /// write (`tail::OP_OVERHEAD`). Default 4,194,304: about 32 MiB, some
    /// 200,000 four-block inserts, seconds of a busy fleet's writes (a
    /// tail is read every 100 ms).
    pub tail_queue: usize,
    /// Pause between rounds of repair. Default 1 s.
    pub repair_interval: Duration,
    /// Keys sampled from each peer per round of repair (at most
    /// `MAX_SAMPLE`, 256); 0: no repair. Default 256: per peer and round,
    /// one sample, one batch of 256 lookups there and here, and an insert
    /// per key this server lacks.
    pub repair_keys: u32,
}

impl Default for ReplicaConfig {
    fn default() -> Self {
        ReplicaConfig {
            peers: Vec::new(),
            peer_ca: None,
            peer_server_name: None,
            max_age: Duration::from_secs(60),
            timeout: Duration::from_secs(60),
            retry: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(5),
            max_snapshot_bytes: 4 << 30,
            queue: 4 << 20,
            send_timeout: Duration::from_secs(120),
            send_piece_bytes: 1 << 20,
            send_pieces: 4,
            tail_window: Duration::from_secs(30),
            tail_queue: 4 << 20,
            repair_interval: Duration::from_secs(1),
            repair_keys: 256,
        }
    }
}

impl ReplicaConfig {
    /// Checks every value's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(p) = self.peers.iter().find(|p| split_peer(p).is_none()) {
            return invalid("peer", p, "not host:port");
        }
        if self.queue == 0 || self.timeout.is_zero() || self.send_timeout.is_zero() {
            return invalid(
                "bootstrap-queue/bootstrap-timeout/snapshot-send-timeout",
                &0,
                "must be positive",
            );
        }
        if self.retry.is_zero() || self.connect_timeout.is_zero() {
            return invalid(
                "bootstrap-retry/peer-connect-timeout",
                &"0s",
                "must be positive",
            );
        }
        if self.send_piece_bytes < 4096 || self.send_piece_bytes > 64 << 20 {
            return invalid(
                "snapshot-piece-bytes",
                &self.send_piece_bytes,
                "must be 4096 to 67108864",
            );
        }
        if self.send_pieces == 0 || self.send_pieces > 1024 {
            return invalid("snapshot-pieces", &self.send_pieces, "must be 1 to 1024");
        }
        if self.tail_queue == 0 || self.repair_interval.is_zero() {
            return invalid("tail-queue/repair-interval", &0, "must be positive");
        }
        // Shorter, and a tail read every 100 ms lapses between reads.
        if self.tail_window < Duration::from_secs(1) {
            return invalid(
                "tail-window",
                &format!("{:?}", self.tail_window),
                "must be at least 1s",
            );
        }
        if self.repair_keys > prefix_proto::MAX_SAMPLE {
            return invalid("repair-keys", &self.repair_keys, "must be 0 to 256");
        }
        if self.max_snapshot_bytes < 1 << 20 {
            return invalid(
                "max-snapshot-bytes",
                &self.max_snapshot_bytes,
                "must be at least 1048576",
            );
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
