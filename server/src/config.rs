//! Server configuration: flags, `PREFIX_INDEX_*` environment variables and an
//! optional TOML file, in that order of precedence, over documented defaults.
//!
//! [`Settings`] is what a user may set (every field optional, the same names
//! as flags and TOML keys); [`ServerConfig`] is the resolved configuration the
//! server runs with. Every limit the server enforces is a field here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use prefix_index::IndexConfig;
use prefix_proto::{Limits, MAX_FRAME_CEILING};

use crate::access::{Identity, Roles};
use crate::bootstrap::ReplicaConfig;
use crate::engines::{EngineConfig, Ratio, Subscription};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A duration written the human way: `250ms`, `1s`, `5m`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HumanDuration(pub Duration);

impl FromStr for HumanDuration {
    type Err = humantime::DurationError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        humantime::parse_duration(s).map(HumanDuration)
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What a user may set. Flags override the environment, which overrides the
/// TOML file (`--config`), which overrides the defaults of [`ServerConfig`].
///
/// Each field is one setting, declared once: its name is the TOML key (in
/// kebab-case) and, upper-cased behind `PREFIX_INDEX_`, the environment
/// variable; the flag is the same name (singular for the repeatable
/// `--reader` and `--writer`); its doc comment is the `--help` text. Defaults
/// and the reasons for them live in [`ServerConfig`]'s `Default` alone:
/// `--help` shows them through [`Settings::with_defaults`], and tests hold
/// the mapping both ways and `docs/operations.md` to them.
#[derive(Debug, Clone, Default, PartialEq, clap::Args, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Settings {
    /// QUIC (UDP) address to serve on.
    #[arg(long, env = "PREFIX_INDEX_LISTEN")]
    pub listen: Option<SocketAddr>,
    /// HTTP address for /metrics, /healthz and /readyz; "off" disables it.
    #[arg(long, env = "PREFIX_INDEX_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// TCP address of the HTTP/JSON API (HTTP/1.1 and HTTP/2 over TLS, the
    /// same certificates and roles as QUIC; docs/http.md); "off" disables it.
    #[arg(long, env = "PREFIX_INDEX_HTTP_LISTEN")]
    pub http_listen: Option<String>,
    /// Largest HTTP/JSON request body in bytes; larger ones are refused
    /// (413) before they are parsed.
    #[arg(long, env = "PREFIX_INDEX_HTTP_MAX_BODY_BYTES")]
    pub http_max_body_bytes: Option<usize>,
    /// Directory for the generated certificate and the index snapshot.
    #[arg(long, env = "PREFIX_INDEX_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// PEM certificate chain to serve; with --key. Without both, a
    /// self-signed certificate is made and written to <data-dir>/cert.pem.
    #[arg(long, env = "PREFIX_INDEX_CERT", requires = "key")]
    pub cert: Option<PathBuf>,
    /// PEM private key of --cert.
    #[arg(long, env = "PREFIX_INDEX_KEY", requires = "cert")]
    pub key: Option<PathBuf>,
    /// PEM CA certificates: when set, only clients presenting a certificate
    /// signed by one of them may connect (mutual TLS).
    #[arg(long, env = "PREFIX_INDEX_CLIENT_CA")]
    pub client_ca: Option<PathBuf>,
    /// Seconds an entry stays visible after its last insert.
    #[arg(long, env = "PREFIX_INDEX_TTL")]
    pub ttl: Option<u64>,
    /// Blocks each pod caches until set_pod_capacity says otherwise.
    #[arg(long, env = "PREFIX_INDEX_POD_CAPACITY")]
    pub pod_capacity: Option<u64>,
    /// Longest key in blocks; longer keys are refused (KeyTooLong).
    #[arg(long, env = "PREFIX_INDEX_MAX_KEY_BLOCKS")]
    pub max_key_blocks: Option<usize>,
    /// Global bound on stored (pod, block) entries; about 13-19 bytes each.
    #[arg(long, env = "PREFIX_INDEX_MAX_BLOCKS")]
    pub max_blocks: Option<u64>,
    /// Distinct pods.
    #[arg(long, env = "PREFIX_INDEX_MAX_PODS")]
    pub max_pods: Option<u32>,
    /// Distinct models.
    #[arg(long, env = "PREFIX_INDEX_MAX_MODELS")]
    pub max_models: Option<usize>,
    /// Longest model or pod name in bytes.
    #[arg(long, env = "PREFIX_INDEX_MAX_NAME_LEN")]
    pub max_name_len: Option<usize>,
    /// Largest request payload in bytes (at most 16 MiB).
    #[arg(long, env = "PREFIX_INDEX_MAX_FRAME_BYTES")]
    pub max_frame_bytes: Option<u32>,
    /// Most ops in one batch.
    #[arg(long, env = "PREFIX_INDEX_MAX_BATCH")]
    pub max_batch: Option<usize>,
    /// Most candidate pods in one lookup.
    #[arg(long, env = "PREFIX_INDEX_MAX_CANDIDATES")]
    pub max_candidates: Option<usize>,
    /// Concurrent client connections; more are refused.
    #[arg(long, env = "PREFIX_INDEX_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Concurrent streams per connection.
    #[arg(long, env = "PREFIX_INDEX_MAX_STREAMS")]
    pub max_streams: Option<u32>,
    /// Close connections silent for this long.
    #[arg(long, env = "PREFIX_INDEX_IDLE_TIMEOUT")]
    pub idle_timeout: Option<HumanDuration>,
    /// How often the maintenance task sweeps (TTL, capacities).
    #[arg(long, env = "PREFIX_INDEX_SWEEP_INTERVAL")]
    pub sweep_interval: Option<HumanDuration>,
    /// Nodes one sweep call may visit before it yields.
    #[arg(long, env = "PREFIX_INDEX_SWEEP_BUDGET")]
    pub sweep_budget: Option<usize>,
    /// Frames whose keys total more blocks than this run on the blocking pool,
    /// so they do not hold up other connections.
    #[arg(long, env = "PREFIX_INDEX_INLINE_BLOCKS")]
    pub inline_blocks: Option<usize>,
    /// On shutdown, how long in-flight requests may take to finish.
    #[arg(long, env = "PREFIX_INDEX_DRAIN_TIMEOUT")]
    pub drain_timeout: Option<HumanDuration>,
    /// How often the index is written to <data-dir>/index.snapshot (it is
    /// also written at shutdown and read back at start); "0s" turns
    /// snapshots off.
    #[arg(long, env = "PREFIX_INDEX_SNAPSHOT_INTERVAL")]
    pub snapshot_interval: Option<HumanDuration>,
    /// Heavy requests (see --inline-blocks) one connection may have running
    /// at once; past it, its streams stop reading until one finishes.
    #[arg(long, env = "PREFIX_INDEX_MAX_IN_FLIGHT")]
    pub max_in_flight: Option<usize>,
    /// Bytes a connection may send ahead of what the server has read (its
    /// QUIC receive window): the memory one connection can make the server
    /// buffer.
    #[arg(long, env = "PREFIX_INDEX_CONNECTION_WINDOW")]
    pub connection_window: Option<u32>,
    /// Keep the workers polling the network for this long after the last
    /// read instead of sleeping: lower latency when requests come one at a
    /// time, for every worker's core at 100% while they come and for this
    /// long after. For servers with cores of their own (see
    /// docs/operations.md); "0s" is off.
    #[arg(long, env = "PREFIX_INDEX_BUSY_POLL")]
    pub busy_poll: Option<HumanDuration>,
    /// A client identity that may only look up (and ask stats, ping):
    /// sha256:<hex> or cn:<common name>. Repeat the flag; in the
    /// environment separate them with ';'. Needs --client-ca.
    #[arg(long = "reader", env = "PREFIX_INDEX_READERS", value_delimiter = ';')]
    pub readers: Option<Vec<String>>,
    /// A client identity that may also insert, remove pods and set
    /// capacities (same forms as --reader). With either list set, clients
    /// matching neither may do nothing.
    #[arg(long = "writer", env = "PREFIX_INDEX_WRITERS", value_delimiter = ';')]
    pub writers: Option<Vec<String>>,
    /// A client identity that may look up and take this server's snapshot:
    /// the certificate the other replicas present (same forms as --reader).
    #[arg(
        long = "peer-identity",
        env = "PREFIX_INDEX_PEER_IDENTITIES",
        value_delimiter = ';'
    )]
    pub peer_identities: Option<Vec<String>>,
    /// Another replica of this index (host:port of its QUIC listener), asked
    /// for its snapshot when this server starts cold. Repeat the flag; in the
    /// environment separate them with ';'. Tried in the order given.
    #[arg(long = "peer", env = "PREFIX_INDEX_PEERS", value_delimiter = ';')]
    pub peers: Option<Vec<String>>,
    /// CA certificate (PEM) the peers' certificates are checked against;
    /// default: --client-ca, else the server's own certificate.
    #[arg(long, env = "PREFIX_INDEX_PEER_CA")]
    pub peer_ca: Option<PathBuf>,
    /// The name the peers' certificates are checked for; default: the host
    /// of each --peer.
    #[arg(long, env = "PREFIX_INDEX_PEER_SERVER_NAME")]
    pub peer_server_name: Option<String>,
    /// A snapshot of its own older than this does not count: the server
    /// fills itself from a peer instead.
    #[arg(long, env = "PREFIX_INDEX_BOOTSTRAP_MAX_AGE")]
    pub bootstrap_max_age: Option<HumanDuration>,
    /// How long filling from peers may take in all (connections, transfers,
    /// restores) before the server starts from its own snapshot, however
    /// old, or empty: all replicas may be starting at once.
    #[arg(long, env = "PREFIX_INDEX_BOOTSTRAP_TIMEOUT")]
    pub bootstrap_timeout: Option<HumanDuration>,
    /// Largest snapshot taken from a peer, in bytes; a larger one is refused.
    #[arg(long, env = "PREFIX_INDEX_MAX_SNAPSHOT_BYTES")]
    pub max_snapshot_bytes: Option<u64>,
    /// Writes held while a peer's snapshot is being restored (applied right
    /// after it), in key blocks (1,024 for a pod-table change); past it,
    /// writes are refused `Unavailable`.
    #[arg(long, env = "PREFIX_INDEX_BOOTSTRAP_QUEUE")]
    pub bootstrap_queue: Option<usize>,
    /// How long sending this server's snapshot to one peer may take before
    /// the transfer is cut (it holds the index's memory from being freed).
    #[arg(long, env = "PREFIX_INDEX_SNAPSHOT_SEND_TIMEOUT")]
    pub snapshot_send_timeout: Option<HumanDuration>,
    /// An engine to follow (precise mode): pod=<name>,model=<model>,
    /// endpoint=tcp://host:port, and optionally replay=tcp://host:port,
    /// block-size=<tokens>, topic=<topic>, media=GPU+CPU. Repeat the flag;
    /// in the environment separate them with ';'. See docs/events.md.
    #[arg(long = "engine", env = "PREFIX_INDEX_ENGINES", value_delimiter = ';')]
    pub engines: Option<Vec<String>>,
    /// Bind a SUB socket here (tcp://host:port) for engines that connect to
    /// the server and publish with topics kv@<pod>@<model>; "off" for none.
    #[arg(long, env = "PREFIX_INDEX_ENGINE_LISTEN")]
    pub engine_listen: Option<String>,
    /// Block size in tokens of the engines that connect to --engine-listen.
    #[arg(long, env = "PREFIX_INDEX_ENGINE_BLOCK_SIZE")]
    pub engine_block_size: Option<u32>,
    /// Tokens per block of the gateways' token keys; engine blocks are
    /// hashed into blocks of this size.
    #[arg(long, env = "PREFIX_INDEX_TOKEN_BLOCK")]
    pub token_block: Option<u32>,
    /// How long a gateway's insert for an engine-fed pod counts before the
    /// engine confirms it.
    #[arg(long, env = "PREFIX_INDEX_SPECULATIVE_TTL")]
    pub speculative_ttl: Option<HumanDuration>,
    /// Bound on engine block records (parent, copies and hashes of each
    /// block an engine reported), over all engines.
    #[arg(long, env = "PREFIX_INDEX_MAX_ENGINE_BLOCKS")]
    pub max_engine_blocks: Option<u64>,
    /// Bound on one engine's block records, so that one engine cannot
    /// take the others' room under --max-engine-blocks.
    #[arg(long, env = "PREFIX_INDEX_MAX_ENGINE_BLOCKS_PER_POD")]
    pub max_engine_blocks_per_pod: Option<u64>,
    /// Most engines followed at once (configured, subscribed at run time,
    /// or met through --engine-listen).
    #[arg(long, env = "PREFIX_INDEX_MAX_ENGINES")]
    pub max_engines: Option<usize>,
    /// How long a replay may take before the pod is cleared and learnt
    /// again instead.
    #[arg(long, env = "PREFIX_INDEX_REPLAY_TIMEOUT")]
    pub replay_timeout: Option<HumanDuration>,
    /// Live batches held back while a replay runs; past it, the pod is
    /// cleared and learnt again.
    #[arg(long, env = "PREFIX_INDEX_MAX_HELD_BATCHES")]
    pub max_held_batches: Option<usize>,
    /// Bytes of live batches held back while a replay runs; past it, the
    /// pod is cleared and learnt again.
    #[arg(long, env = "PREFIX_INDEX_MAX_HELD_BYTES")]
    pub max_held_bytes: Option<usize>,
    /// Most events in one engine batch; a larger batch is skipped as a
    /// decode error.
    #[arg(long, env = "PREFIX_INDEX_MAX_BATCH_EVENTS")]
    pub max_batch_events: Option<usize>,
    /// Most block hashes in one engine event; a larger event is skipped
    /// alone as a decode error.
    #[arg(long, env = "PREFIX_INDEX_MAX_EVENT_HASHES")]
    pub max_event_hashes: Option<usize>,
    /// Most token ids in one engine event; a larger event is skipped alone
    /// as a decode error.
    #[arg(long, env = "PREFIX_INDEX_MAX_EVENT_TOKENS")]
    pub max_event_tokens: Option<usize>,
    /// Largest engine event message in bytes; libzmq drops a connection
    /// that sends a larger one (the gap is then replayed or resynced).
    #[arg(long, env = "PREFIX_INDEX_MAX_EVENT_BYTES")]
    pub max_event_bytes: Option<usize>,
    /// Engine messages buffered per socket while its thread is busy; past
    /// it libzmq drops them (a gap, replayed or resynced).
    #[arg(long, env = "PREFIX_INDEX_MAX_QUEUED_EVENTS")]
    pub max_queued_events: Option<usize>,
}

/// Why the configuration is unusable.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The TOML file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The TOML file did not parse.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message.
        source: Box<toml::de::Error>,
    },
    /// An engine subscription does not parse.
    #[error("engine = {value}: {why}")]
    Engine {
        /// The text.
        value: String,
        /// What is wrong.
        why: String,
    },
    /// A value is out of range.
    #[error("{name} = {value}: {why}")]
    Invalid {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
}

impl Settings {
    /// Reads a TOML settings file.
    pub fn from_file(path: &Path) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        toml::from_str(&text).map_err(|source| ConfigError::Parse {
            path: path.into(),
            source: Box::new(source),
        })
    }

    /// These settings, with `under`'s filling the gaps.
    pub fn or(self, under: Settings) -> Settings {
        let (mut merged, over) = (under.to_table(), self.to_table());
        merged.extend(over);
        // Both tables come from `Settings` values, so they deserialize back
        // into one; should that ever fail, the upper settings alone stand.
        toml::Value::Table(merged).try_into().unwrap_or(self)
    }

    /// The settings that are set, as a TOML table (unset ones are absent).
    fn to_table(&self) -> toml::Table {
        // Every field serializes to a TOML value (strings, integers, arrays
        // of strings); `None` fields are left out.
        toml::Table::try_from(self).unwrap_or_default()
    }

    /// Every setting's value in `cfg`, rendered as a user would write it:
    /// `none` for an unset optional one.
    pub fn describe(cfg: &ServerConfig) -> Vec<(String, String)> {
        let table = Settings::from(cfg).to_table();
        Settings::names()
            .into_iter()
            .map(|name| {
                let value = match table.get(&name) {
                    Some(toml::Value::String(s)) => s.clone(),
                    Some(toml::Value::Array(a)) => a
                        .iter()
                        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string))
                        .collect::<Vec<_>>()
                        .join(";"),
                    Some(v) => v.to_string(),
                    None => "none".into(),
                };
                (name, value)
            })
            .collect()
    }

    /// Every setting's TOML key, in declaration order.
    pub fn names() -> Vec<String> {
        use clap::Args as _;
        let cmd = Settings::augment_args(clap::Command::new("settings"));
        cmd.get_arguments()
            .map(|a| a.get_id().as_str().replace('_', "-"))
            .collect()
    }

    /// `cmd` (which flattens [`Settings`]) with each setting's default from
    /// [`ServerConfig::default`] shown in its help, as `[default: ...]`. The
    /// defaults are not clap's: a flag's absence must leave room for the
    /// environment and the file.
    pub fn with_defaults(mut cmd: clap::Command) -> clap::Command {
        for (name, value) in Settings::describe(&ServerConfig::default()) {
            if value == "none" {
                continue;
            }
            let id = name.replace('-', "_");
            cmd = cmd.mut_arg(id, |arg| {
                let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
                arg.help(format!("{help} [default: {value}]"))
            });
        }
        cmd
    }

    /// The configuration these settings describe, defaults filled in.
    pub fn resolve(self) -> Result<ServerConfig, ConfigError> {
        let d = ServerConfig::default();
        let metrics_listen = match self.metrics_listen.as_deref() {
            None => d.metrics_listen,
            Some("off") => None,
            Some(s) => Some(s.parse().map_err(|_| ConfigError::Invalid {
                name: "metrics-listen",
                value: s.into(),
                why: "not an address (host:port) or \"off\"",
            })?),
        };
        let http_listen = match self.http_listen.as_deref() {
            None => d.http_listen,
            Some("off") => None,
            Some(s) => Some(s.parse().map_err(|_| ConfigError::Invalid {
                name: "http-listen",
                value: s.into(),
                why: "not an address (host:port) or \"off\"",
            })?),
        };
        let dur = |v: Option<HumanDuration>, d: Duration| v.map_or(d, |h| h.0);
        let cfg = ServerConfig {
            listen: self.listen.unwrap_or(d.listen),
            metrics_listen,
            http_listen,
            http_max_body_bytes: self.http_max_body_bytes.unwrap_or(d.http_max_body_bytes),
            data_dir: self.data_dir.unwrap_or(d.data_dir),
            tls: match (self.cert, self.key) {
                (Some(cert), Some(key)) => CertSource::Files { cert, key },
                _ => CertSource::SelfSigned,
            },
            client_ca: self.client_ca,
            index: IndexConfig {
                ttl: self.ttl.map_or(d.index.ttl, Duration::from_secs),
                pod_capacity: self.pod_capacity.unwrap_or(d.index.pod_capacity),
                max_blocks: self.max_blocks.unwrap_or(d.index.max_blocks),
                max_key_blocks: self.max_key_blocks.unwrap_or(d.index.max_key_blocks),
                max_pods: self.max_pods.unwrap_or(d.index.max_pods),
                max_models: self.max_models.unwrap_or(d.index.max_models),
                max_name_len: self.max_name_len.unwrap_or(d.index.max_name_len),
                speculative_ttl: dur(self.speculative_ttl, d.index.speculative_ttl),
                max_engine_blocks: self.max_engine_blocks.unwrap_or(d.index.max_engine_blocks),
                max_engine_blocks_per_pod: self
                    .max_engine_blocks_per_pod
                    .unwrap_or(d.index.max_engine_blocks_per_pod),
                ..d.index
            },
            max_frame_bytes: self.max_frame_bytes.unwrap_or(d.max_frame_bytes),
            max_batch: self.max_batch.unwrap_or(d.max_batch),
            max_candidates: self.max_candidates.unwrap_or(d.max_candidates),
            max_connections: self.max_connections.unwrap_or(d.max_connections),
            max_streams: self.max_streams.unwrap_or(d.max_streams),
            idle_timeout: dur(self.idle_timeout, d.idle_timeout),
            sweep_interval: dur(self.sweep_interval, d.sweep_interval),
            sweep_budget: self.sweep_budget.unwrap_or(d.sweep_budget),
            inline_blocks: self.inline_blocks.unwrap_or(d.inline_blocks),
            drain_timeout: dur(self.drain_timeout, d.drain_timeout),
            snapshot_interval: match self.snapshot_interval {
                None => d.snapshot_interval,
                Some(h) if h.0.is_zero() => None,
                Some(h) => Some(h.0),
            },
            max_in_flight: self.max_in_flight.unwrap_or(d.max_in_flight),
            connection_window: self.connection_window.unwrap_or(d.connection_window),
            busy_poll: match self.busy_poll {
                None => d.busy_poll,
                Some(h) if h.0.is_zero() => None,
                Some(h) => Some(h.0),
            },
            roles: Roles {
                readers: identities("reader", self.readers)?,
                writers: identities("writer", self.writers)?,
                peers: identities("peer-identity", self.peer_identities)?,
            },
            replicas: ReplicaConfig {
                peers: self.peers.unwrap_or_default(),
                peer_ca: self.peer_ca,
                peer_server_name: self.peer_server_name,
                max_age: dur(self.bootstrap_max_age, d.replicas.max_age),
                timeout: dur(self.bootstrap_timeout, d.replicas.timeout),
                max_snapshot_bytes: self
                    .max_snapshot_bytes
                    .unwrap_or(d.replicas.max_snapshot_bytes),
                queue: self.bootstrap_queue.unwrap_or(d.replicas.queue),
                send_timeout: dur(self.snapshot_send_timeout, d.replicas.send_timeout),
            },
            engines: EngineConfig {
                subscriptions: subscriptions(self.engines)?,
                listen: match self.engine_listen.as_deref() {
                    None => d.engines.listen,
                    Some("off") => None,
                    Some(l) if l.starts_with("tcp://") => Some(l.into()),
                    Some(l) => {
                        return Err(ConfigError::Invalid {
                            name: "engine-listen",
                            value: l.into(),
                            why: "not tcp://host:port or \"off\"",
                        })
                    }
                },
                central_block_size: self
                    .engine_block_size
                    .unwrap_or(d.engines.central_block_size),
                token_block: self.token_block.unwrap_or(d.engines.token_block),
                replay_timeout: dur(self.replay_timeout, d.engines.replay_timeout),
                max_held_batches: self.max_held_batches.unwrap_or(d.engines.max_held_batches),
                max_held_bytes: self.max_held_bytes.unwrap_or(d.engines.max_held_bytes),
                decode: prefix_events::DecodeLimits {
                    max_events: self.max_batch_events.unwrap_or(d.engines.decode.max_events),
                    max_hashes: self.max_event_hashes.unwrap_or(d.engines.decode.max_hashes),
                    max_tokens: self.max_event_tokens.unwrap_or(d.engines.decode.max_tokens),
                },
                max_engines: self.max_engines.unwrap_or(d.engines.max_engines),
                max_message_bytes: self.max_event_bytes.unwrap_or(d.engines.max_message_bytes),
                max_queued_messages: self
                    .max_queued_events
                    .unwrap_or(d.engines.max_queued_messages),
            },
        };
        cfg.validate()?;
        Ok(cfg)
    }
}

/// The settings that resolve to `cfg`: every value set, `off`/`0s` for what
/// is off. `Settings::from(&cfg).resolve()` gives `cfg` back (a test holds
/// this for every field).
impl From<&ServerConfig> for Settings {
    fn from(cfg: &ServerConfig) -> Self {
        let (cert, key) = match &cfg.tls {
            CertSource::Files { cert, key } => (Some(cert.clone()), Some(key.clone())),
            CertSource::SelfSigned => (None, None),
        };
        let off = Duration::ZERO;
        let names = |ids: &[Identity]| {
            (!ids.is_empty()).then(|| ids.iter().map(ToString::to_string).collect())
        };
        Settings {
            listen: Some(cfg.listen),
            metrics_listen: Some(cfg.metrics_listen.map_or("off".into(), |a| a.to_string())),
            http_listen: Some(cfg.http_listen.map_or("off".into(), |a| a.to_string())),
            http_max_body_bytes: Some(cfg.http_max_body_bytes),
            data_dir: Some(cfg.data_dir.clone()),
            cert,
            key,
            client_ca: cfg.client_ca.clone(),
            ttl: Some(cfg.index.ttl.as_secs()),
            pod_capacity: Some(cfg.index.pod_capacity),
            max_key_blocks: Some(cfg.index.max_key_blocks),
            max_blocks: Some(cfg.index.max_blocks),
            max_pods: Some(cfg.index.max_pods),
            max_models: Some(cfg.index.max_models),
            max_name_len: Some(cfg.index.max_name_len),
            max_frame_bytes: Some(cfg.max_frame_bytes),
            max_batch: Some(cfg.max_batch),
            max_candidates: Some(cfg.max_candidates),
            max_connections: Some(cfg.max_connections),
            max_streams: Some(cfg.max_streams),
            idle_timeout: Some(HumanDuration(cfg.idle_timeout)),
            sweep_interval: Some(HumanDuration(cfg.sweep_interval)),
            sweep_budget: Some(cfg.sweep_budget),
            inline_blocks: Some(cfg.inline_blocks),
            drain_timeout: Some(HumanDuration(cfg.drain_timeout)),
            snapshot_interval: Some(HumanDuration(cfg.snapshot_interval.unwrap_or(off))),
            max_in_flight: Some(cfg.max_in_flight),
            connection_window: Some(cfg.connection_window),
            busy_poll: Some(HumanDuration(cfg.busy_poll.unwrap_or(off))),
            readers: names(&cfg.roles.readers),
            writers: names(&cfg.roles.writers),
            peer_identities: names(&cfg.roles.peers),
            peers: (!cfg.replicas.peers.is_empty()).then(|| cfg.replicas.peers.clone()),
            peer_ca: cfg.replicas.peer_ca.clone(),
            peer_server_name: cfg.replicas.peer_server_name.clone(),
            bootstrap_max_age: Some(HumanDuration(cfg.replicas.max_age)),
            bootstrap_timeout: Some(HumanDuration(cfg.replicas.timeout)),
            max_snapshot_bytes: Some(cfg.replicas.max_snapshot_bytes),
            bootstrap_queue: Some(cfg.replicas.queue),
            snapshot_send_timeout: Some(HumanDuration(cfg.replicas.send_timeout)),
            engines: (!cfg.engines.subscriptions.is_empty()).then(|| {
                cfg.engines
                    .subscriptions
                    .iter()
                    .map(ToString::to_string)
                    .collect()
            }),
            engine_listen: Some(cfg.engines.listen.clone().unwrap_or_else(|| "off".into())),
            engine_block_size: Some(cfg.engines.central_block_size),
            token_block: Some(cfg.engines.token_block),
            speculative_ttl: Some(HumanDuration(cfg.index.speculative_ttl)),
            max_engine_blocks: Some(cfg.index.max_engine_blocks),
            max_engine_blocks_per_pod: Some(cfg.index.max_engine_blocks_per_pod),
            max_engines: Some(cfg.engines.max_engines),
            replay_timeout: Some(HumanDuration(cfg.engines.replay_timeout)),
            max_held_batches: Some(cfg.engines.max_held_batches),
            max_held_bytes: Some(cfg.engines.max_held_bytes),
            max_batch_events: Some(cfg.engines.decode.max_events),
            max_event_hashes: Some(cfg.engines.decode.max_hashes),
            max_event_tokens: Some(cfg.engines.decode.max_tokens),
            max_event_bytes: Some(cfg.engines.max_message_bytes),
            max_queued_events: Some(cfg.engines.max_queued_messages),
        }
    }
}

/// Parses the engine subscriptions.
fn subscriptions(list: Option<Vec<String>>) -> Result<Vec<Subscription>, ConfigError> {
    list.unwrap_or_default()
        .into_iter()
        .map(|s| {
            s.parse()
                .map_err(|e: crate::engines::SubscriptionError| ConfigError::Engine {
                    value: s,
                    why: e.to_string(),
                })
        })
        .collect()
}

/// Parses a list of client identities.
fn identities(name: &'static str, list: Option<Vec<String>>) -> Result<Vec<Identity>, ConfigError> {
    list.unwrap_or_default()
        .into_iter()
        .map(|s| {
            s.parse().map_err(|_| ConfigError::Invalid {
                name,
                value: s,
                why: "expected sha256:<64 hex digits> or cn:<common name>",
            })
        })
        .collect()
}

/// Where the server's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CertSource {
    /// PEM files given by the operator.
    Files {
        /// Certificate chain.
        cert: PathBuf,
        /// Private key.
        key: PathBuf,
    },
    /// A self-signed certificate for `localhost` and `127.0.0.1`, made once
    /// and kept in the data directory (`cert.pem`, `key.pem`) so clients that
    /// pinned it keep working across restarts.
    SelfSigned,
}

/// The resolved configuration of a server.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// QUIC address. Default `127.0.0.1:7070`: loopback until an operator
    /// decides to expose it.
    pub listen: SocketAddr,
    /// HTTP address for metrics and probes, or none. Default `127.0.0.1:7071`.
    pub metrics_listen: Option<SocketAddr>,
    /// The HTTP/JSON API's address, or none. Default none: QUIC is the fast
    /// path, the HTTP API the convenient one, opened when asked for.
    pub http_listen: Option<SocketAddr>,
    /// Largest HTTP/JSON request body. Default 4 MiB: a lookup of a
    /// 2,048-block key as 32,768 token ids is under 400 KB of JSON, so ten
    /// of them fit in one batch; at most 64 MiB.
    pub http_max_body_bytes: usize,
    /// Data directory. Default `./prefix-index-data`.
    pub data_dir: PathBuf,
    /// The server certificate. Default: self-signed.
    pub tls: CertSource,
    /// CA bundle for mutual TLS; none means any client may connect.
    pub client_ca: Option<PathBuf>,
    /// The index's own limits and policies (see [`IndexConfig`]).
    pub index: IndexConfig,
    /// Largest request payload. Default 1 MiB (a batch of 64 lookups of
    /// 2,048-block keys); hard ceiling 16 MiB.
    pub max_frame_bytes: u32,
    /// Most ops per batch. Default 1,024.
    pub max_batch: usize,
    /// Most candidates per lookup. Default 1,024.
    pub max_candidates: usize,
    /// Concurrent connections. Default 4,096: a large gateway fleet, each
    /// replica holding one connection, with room for tools.
    pub max_connections: usize,
    /// Concurrent bidirectional streams per connection. Default 64: clients
    /// use a handful of long-lived streams (4 by default).
    pub max_streams: u32,
    /// Idle connections close after this. Default 30 s; clients that are
    /// merely quiet keep the connection alive with QUIC pings.
    pub idle_timeout: Duration,
    /// Sweep period. Default 1 s: TTLs are minutes, so expiry lags by at most
    /// a second, and capacity overshoot stays one second of inserts.
    pub sweep_interval: Duration,
    /// Nodes per sweep call. Default 65,536: a few milliseconds of work, after
    /// which the task yields and continues.
    pub sweep_budget: usize,
    /// Frames with more key blocks than this run on tokio's blocking pool.
    /// Default 16,384 (a few hundred microseconds of lookups).
    pub inline_blocks: usize,
    /// Time allowed for in-flight requests at shutdown. Default 5 s.
    pub drain_timeout: Duration,
    /// Snapshot period, or none for no snapshots at all. Default 30 s: a
    /// crash loses at most that much of inserts, and at the default bound
    /// (16 M entries) writing takes a few seconds of one core per period.
    pub snapshot_interval: Option<Duration>,
    /// Heavy requests running at once per connection. Default 16: enough to
    /// keep both blocking-pool cores busy from one client, not enough for one
    /// client to queue thousands of milliseconds-long tasks.
    pub max_in_flight: usize,
    /// QUIC receive window per connection, in bytes. Default 4 MiB: ample
    /// for loopback and datacenter round trips, and 4,096 connections can
    /// then buffer at most 16 GiB only if every one of them is stalled with a
    /// full window (size it down with `max_connections` on small machines).
    pub connection_window: u32,
    /// Busy polling (see [`crate::busy_poll`]): how long the workers keep
    /// polling after the last read, or none to let them sleep. Default none:
    /// spinning is worth a core per worker only on machines where wake-ups
    /// are slow (virtual machines) and the cores are the server's alone.
    pub busy_poll: Option<Duration>,
    /// Roles of client identities (see [`crate::access`]). Default: none,
    /// every connected client may write.
    pub roles: Roles,
    /// Precise mode: engine subscriptions and their limits (see
    /// [`crate::engines`]). Default: no engines.
    pub engines: EngineConfig,
    /// The other replicas, and how a cold start fills itself from them (see
    /// [`crate::bootstrap`]). Default: no peers.
    pub replicas: ReplicaConfig,
}

impl Default for ServerConfig {
    fn default() -> Self {
        let limits = Limits::default();
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 7071))),
            http_listen: None,
            http_max_body_bytes: 4 << 20,
            data_dir: PathBuf::from("prefix-index-data"),
            tls: CertSource::SelfSigned,
            client_ca: None,
            index: IndexConfig::default(),
            max_frame_bytes: limits.max_frame_bytes,
            max_batch: limits.max_batch,
            max_candidates: limits.max_candidates,
            max_connections: 4096,
            max_streams: 64,
            idle_timeout: Duration::from_secs(30),
            sweep_interval: Duration::from_secs(1),
            sweep_budget: 65_536,
            inline_blocks: 16_384,
            drain_timeout: Duration::from_secs(5),
            snapshot_interval: Some(Duration::from_secs(30)),
            max_in_flight: 16,
            connection_window: 4 << 20,
            busy_poll: None,
            roles: Roles::default(),
            engines: EngineConfig::default(),
            replicas: ReplicaConfig::default(),
        }
    }
}

impl ServerConfig {
    /// The wire limits this configuration enforces.
    pub fn limits(&self) -> Limits {
        Limits {
            max_frame_bytes: self.max_frame_bytes,
            max_key_blocks: self.index.max_key_blocks,
            max_batch: self.max_batch,
            max_name_len: self.index.max_name_len,
            max_candidates: self.max_candidates,
        }
    }

    /// Checks every value's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |name, value: &dyn ToString, why| {
            Err(ConfigError::Invalid {
                name,
                value: value.to_string(),
                why,
            })
        };
        if self.max_frame_bytes < 64 || self.max_frame_bytes > MAX_FRAME_CEILING {
            return bad(
                "max-frame-bytes",
                &self.max_frame_bytes,
                "must be 64 to 16777216",
            );
        }
        if self.http_max_body_bytes < 1024 || self.http_max_body_bytes > 64 << 20 {
            return bad(
                "http-max-body-bytes",
                &self.http_max_body_bytes,
                "must be 1024 to 67108864",
            );
        }
        if self.index.max_pods == 0 || self.index.max_pods > (1 << 20) - 1 {
            return bad("max-pods", &self.index.max_pods, "must be 1 to 1048575");
        }
        if self.index.max_key_blocks == 0 {
            return bad("max-key-blocks", &0, "must be at least 1");
        }
        if self.index.max_name_len == 0 {
            return bad("max-name-len", &0, "must be at least 1");
        }
        if self.index.max_engine_blocks == 0 {
            return bad("max-engine-blocks", &0, "must be at least 1");
        }
        if self.index.max_engine_blocks_per_pod == 0 {
            return bad("max-engine-blocks-per-pod", &0, "must be at least 1");
        }
        if self.index.ttl.is_zero() {
            return bad("ttl", &0, "must be at least 1 second");
        }
        if self.max_batch == 0 || self.max_connections == 0 || self.max_streams == 0 {
            return bad(
                "max-batch/max-connections/max-streams",
                &0,
                "must be at least 1",
            );
        }
        if self.sweep_interval.is_zero() || self.sweep_budget == 0 {
            return bad("sweep-interval/sweep-budget", &0, "must be positive");
        }
        if self.idle_timeout < Duration::from_secs(1) {
            return bad(
                "idle-timeout",
                &format!("{:?}", self.idle_timeout),
                "must be at least 1s",
            );
        }
        if self.max_in_flight == 0 || self.max_in_flight > 65_536 {
            return bad("max-in-flight", &self.max_in_flight, "must be 1 to 65536");
        }
        if self.connection_window < 65_536 {
            return bad(
                "connection-window",
                &self.connection_window,
                "must be at least 65536",
            );
        }
        let r = &self.replicas;
        if let Some(p) = r
            .peers
            .iter()
            .find(|p| crate::bootstrap::split_peer(p).is_none())
        {
            return bad("peer", p, "not host:port");
        }
        if r.queue == 0 || r.timeout.is_zero() || r.send_timeout.is_zero() {
            return bad(
                "bootstrap-queue/bootstrap-timeout/snapshot-send-timeout",
                &0,
                "must be positive",
            );
        }
        if r.max_snapshot_bytes < 1 << 20 {
            return bad(
                "max-snapshot-bytes",
                &r.max_snapshot_bytes,
                "must be at least 1048576",
            );
        }
        if self.roles.enabled() && self.client_ca.is_none() {
            return bad(
                "reader/writer/peer-identity",
                &"set",
                "roles name client certificates: they need --client-ca (mutual TLS)",
            );
        }
        let e = &self.engines;
        if e.token_block == 0 || e.max_held_batches == 0 || e.max_engines == 0 {
            return bad(
                "token-block/max-held-batches/max-engines",
                &0,
                "must be at least 1",
            );
        }
        if e.replay_timeout.is_zero() {
            return bad("replay-timeout", &"0s", "must be positive");
        }
        if e.max_held_bytes < e.max_message_bytes {
            return bad(
                "max-held-bytes",
                &e.max_held_bytes,
                "must be at least max-event-bytes",
            );
        }
        let d = &e.decode;
        if d.max_events == 0 || d.max_hashes == 0 || d.max_tokens == 0 {
            return bad(
                "max-batch-events/max-event-hashes/max-event-tokens",
                &0,
                "must be at least 1",
            );
        }
        if e.max_message_bytes < 1024 {
            return bad(
                "max-event-bytes",
                &e.max_message_bytes,
                "must be at least 1024",
            );
        }
        if e.max_queued_messages == 0 || e.max_queued_messages > i32::MAX as usize {
            return bad(
                "max-queued-events",
                &e.max_queued_messages,
                "must be 1 to 2147483647",
            );
        }
        let sizes = e.subscriptions.iter().map(|s| s.block_size);
        let central = e.listen.as_ref().map(|_| e.central_block_size);
        for size in sizes.chain(central) {
            if Ratio::new(size, e.token_block).is_err() {
                return bad(
                    "engine block-size",
                    &size,
                    "must divide or be a multiple of token-block",
                );
            }
        }
        let mut pods: Vec<&str> = e.subscriptions.iter().map(|s| &*s.pod).collect();
        pods.sort_unstable();
        if let Some(w) = pods.windows(2).find(|w| w[0] == w[1]) {
            return bad("engine", &w[0], "two subscriptions name this pod");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_override_file_override_defaults() {
        let file: Settings = toml::from_str(
            r#"
            listen = "0.0.0.0:9000"
            ttl = 60
            sweep-interval = "250ms"
            metrics-listen = "off"
            "#,
        )
        .unwrap();
        let flags = Settings {
            ttl: Some(30),
            ..Settings::default()
        };
        let cfg = flags.or(file).resolve().unwrap();
        assert_eq!(cfg.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(cfg.index.ttl, Duration::from_secs(30));
        assert_eq!(cfg.sweep_interval, Duration::from_millis(250));
        assert_eq!(cfg.metrics_listen, None);
        assert_eq!(cfg.index.pod_capacity, 31_250);
        assert_eq!(cfg.tls, CertSource::SelfSigned);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        assert!(toml::from_str::<Settings>("tll = 5").is_err());
        let s = Settings {
            max_frame_bytes: Some(MAX_FRAME_CEILING + 1),
            ..Settings::default()
        };
        assert!(matches!(s.resolve(), Err(ConfigError::Invalid { .. })));
        let s = Settings {
            metrics_listen: Some("nowhere".into()),
            ..Settings::default()
        };
        assert!(s.resolve().is_err());
        for (s, flag) in [
            (
                Settings {
                    max_engine_blocks: Some(0),
                    ..Settings::default()
                },
                "max-engine-blocks ",
            ),
            (
                Settings {
                    max_engine_blocks_per_pod: Some(0),
                    ..Settings::default()
                },
                "max-engine-blocks-per-pod",
            ),
        ] {
            let err = s.resolve().unwrap_err().to_string();
            assert!(err.contains(flag), "{err}");
        }
        assert!(Settings::default().resolve().is_ok());
    }

    #[test]
    fn busy_polling_is_off_by_default_and_0s_turns_it_off() {
        let on = |toml_text: &str| {
            toml::from_str::<Settings>(toml_text)
                .unwrap()
                .resolve()
                .unwrap()
                .busy_poll
        };
        assert_eq!(on(""), None);
        assert_eq!(on(r#"busy-poll = "0s""#), None);
        assert_eq!(
            on(r#"busy-poll = "100ms""#),
            Some(Duration::from_millis(100))
        );
    }

    /// A configuration with every setting away from its default.
    fn everything_changed() -> ServerConfig {
        let d = ServerConfig::default();
        ServerConfig {
            listen: "0.0.0.0:9000".parse().unwrap(),
            metrics_listen: None,
            http_listen: Some("0.0.0.0:8443".parse().unwrap()),
            http_max_body_bytes: 4096,
            data_dir: "/var/lib/x".into(),
            tls: CertSource::Files {
                cert: "c.pem".into(),
                key: "k.pem".into(),
            },
            client_ca: Some("ca.pem".into()),
            index: IndexConfig {
                ttl: Duration::from_secs(61),
                pod_capacity: 7,
                max_blocks: 8,
                max_key_blocks: 9,
                max_pods: 10,
                max_models: 11,
                max_name_len: 12,
                speculative_ttl: Duration::from_millis(2500),
                max_engine_blocks: 24,
                max_engine_blocks_per_pod: 23,
                ..d.index
            },
            max_frame_bytes: 4096,
            max_batch: 13,
            max_candidates: 14,
            max_connections: 15,
            max_streams: 16,
            idle_timeout: Duration::from_secs(17),
            sweep_interval: Duration::from_millis(180),
            sweep_budget: 19,
            inline_blocks: 20,
            drain_timeout: Duration::from_secs(21),
            snapshot_interval: None,
            max_in_flight: 22,
            connection_window: 1 << 17,
            busy_poll: Some(Duration::from_micros(230)),
            roles: Roles {
                readers: vec!["cn:r".parse().unwrap()],
                writers: vec![
                    "cn:w".parse().unwrap(),
                    format!("sha256:{}", "ab".repeat(32)).parse().unwrap(),
                ],
                peers: vec!["cn:index".parse().unwrap()],
            },
            replicas: ReplicaConfig {
                peers: vec!["index-1.index:7070".into(), "10.0.0.2:7070".into()],
                peer_ca: Some("peer-ca.pem".into()),
                peer_server_name: Some("index.internal".into()),
                max_age: Duration::from_secs(27),
                timeout: Duration::from_secs(28),
                max_snapshot_bytes: 29 << 20,
                queue: 30,
                send_timeout: Duration::from_secs(31),
            },
            engines: EngineConfig {
                subscriptions: vec![
                    "pod=a,model=m,endpoint=tcp://h:1,replay=tcp://h:2,block-size=32"
                        .parse()
                        .unwrap(),
                    "pod=b,model=org/m,endpoint=tcp://h:3,topic=kv,media=GPU+CPU"
                        .parse()
                        .unwrap(),
                ],
                listen: Some("tcp://0.0.0.0:5557".into()),
                central_block_size: 64,
                token_block: 8,
                replay_timeout: Duration::from_secs(25),
                max_held_batches: 26,
                max_held_bytes: 1 << 22,
                decode: prefix_events::DecodeLimits {
                    max_events: 29,
                    max_hashes: 30,
                    max_tokens: 31,
                },
                max_engines: 27,
                max_message_bytes: 2048,
                max_queued_messages: 28,
            },
        }
    }

    #[test]
    fn engine_settings_are_checked() {
        let mut cfg = ServerConfig::default();
        cfg.engines.subscriptions = vec!["pod=a,model=m,endpoint=tcp://h:1,block-size=24"
            .parse()
            .unwrap()];
        let err = cfg.validate().unwrap_err().to_string();
        assert!(
            err.contains("must divide or be a multiple of token-block"),
            "{err}"
        );
        cfg.engines.subscriptions = vec![
            "pod=a,model=m,endpoint=tcp://h:1".parse().unwrap(),
            "pod=a,model=n,endpoint=tcp://h:2".parse().unwrap(),
        ];
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("two subscriptions name this pod"), "{err}");
        let bad = Settings {
            engines: Some(vec!["pod=a,endpoint=tcp://h:1".into()]),
            ..Settings::default()
        };
        let err = bad.resolve().unwrap_err().to_string();
        assert!(err.contains("model= is missing"), "{err}");
        let listen = Settings {
            engine_listen: Some("udp://x".into()),
            ..Settings::default()
        };
        assert!(listen.resolve().is_err());
    }

    #[test]
    fn settings_and_configurations_map_both_ways() {
        for cfg in [ServerConfig::default(), everything_changed()] {
            assert_eq!(Settings::from(&cfg).resolve().unwrap(), cfg);
        }
        // Every setting of the changed configuration differs from the
        // default one, so no field is left out of the mapping.
        let (d, x) = (
            Settings::describe(&ServerConfig::default()),
            Settings::describe(&everything_changed()),
        );
        assert_eq!(d.len(), Settings::names().len());
        for ((name, a), (_, b)) in d.iter().zip(&x) {
            assert_ne!(a, b, "{name} is not mapped");
        }
    }

    #[test]
    fn settings_merge_setting_by_setting_through_toml() {
        let low = Settings::from(&everything_changed());
        let high = Settings {
            ttl: Some(5),
            readers: Some(vec!["cn:other".into()]),
            ..Settings::default()
        };
        let merged = high.clone().or(low.clone());
        assert_eq!(merged.ttl, Some(5));
        assert_eq!(merged.readers, high.readers);
        assert_eq!(merged.max_batch, low.max_batch);
        assert_eq!(merged.writers, low.writers);
        assert_eq!(Settings::default().or(low.clone()), low);
    }

    #[test]
    fn flags_environment_and_keys_share_one_name() {
        use clap::Args as _;
        let cmd = Settings::augment_args(clap::Command::new("t"));
        for arg in cmd.get_arguments() {
            let key = arg.get_id().as_str().replace('_', "-");
            let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or_default();
            assert_eq!(
                env,
                format!("PREFIX_INDEX_{}", key.to_uppercase().replace('-', "_")),
                "{key}"
            );
            let flag = arg.get_long().unwrap_or_default();
            let plural = match flag.strip_suffix('y') {
                Some(stem) => format!("{stem}ies"),
                None => format!("{flag}s"),
            };
            assert!(key == flag || key == plural, "{key} vs --{flag}");
        }
    }

    #[test]
    fn help_shows_the_real_defaults() {
        let cmd = Settings::with_defaults(<Settings as clap::Args>::augment_args(
            clap::Command::new("t"),
        ));
        let help = |id: &str| {
            let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
            arg.get_help().unwrap().to_string()
        };
        assert!(help("ttl").ends_with("[default: 600]"), "{}", help("ttl"));
        assert!(help("busy_poll").ends_with("[default: 0s]"));
        assert!(help("metrics_listen").ends_with("[default: 127.0.0.1:7071]"));
        assert!(!help("cert").contains("[default"));
    }

    /// `docs/operations.md`'s settings table lists exactly the settings,
    /// each with its real default.
    #[test]
    fn the_operations_doc_matches_the_settings() {
        let doc = include_str!("../../docs/operations.md");
        let table = doc
            .split("## Settings")
            .nth(1)
            .expect("a Settings section")
            .lines()
            .skip_while(|l| !l.starts_with("| flag"))
            .skip(2)
            .take_while(|l| l.starts_with('|'));
        let ticked = |cell: &str| -> Vec<String> {
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        use clap::Args as _;
        let cmd = Settings::augment_args(clap::Command::new("t"));
        let flag_of = |key: &str| {
            let id = key.replace('-', "_");
            let arg = cmd
                .get_arguments()
                .find(|a| a.get_id() == id.as_str())
                .unwrap();
            format!("--{}", arg.get_long().unwrap())
        };
        let defaults: std::collections::HashMap<String, String> =
            Settings::describe(&ServerConfig::default())
                .into_iter()
                .map(|(key, value)| (flag_of(&key), value))
                .collect();
        let mut documented = Vec::new();
        for row in table {
            let cells: Vec<&str> = row.split('|').map(str::trim).collect();
            let default = ticked(cells[2]).into_iter().next().unwrap_or("none".into());
            for flag in ticked(cells[1]) {
                let real = defaults
                    .get(&flag)
                    .unwrap_or_else(|| panic!("{flag} is documented but is no setting"));
                assert_eq!(&default, real, "the default of {flag}");
                documented.push(flag);
            }
        }
        let mut all: Vec<_> = defaults.into_keys().collect();
        all.sort();
        documented.sort();
        assert_eq!(documented, all, "every setting is documented once");
    }
}
