//! Precise mode's settings: the engines followed, the central collector,
//! and the bounds on what one engine can make the server hold.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::admission::EngineAllow;
use super::dns::DnsConfig;
use super::{Ratio, Subscription};
use crate::config::declare::{duration, list, optional, plain, settings, NotZero};
use crate::config::value::{invalid, ConfigError, HumanDuration};

/// Settings refused together when one is zero.
const ONE: NotZero = NotZero(
    "token-block/max-held-batches/max-engines/max-engine-replays",
    "0",
    "must be at least 1",
);
/// The same of the bounds on a decoded batch.
const DECODE: NotZero = NotZero(
    "max-batch-events/max-event-hashes/max-event-tokens",
    "0",
    "must be at least 1",
);

settings! {
    /// What a user may set of precise mode (see [`crate::config::Settings`]).
    pub struct EngineSettings => engines {
        /// An engine to follow (precise mode): pod=<name>,model=<model>,
        /// endpoint=tcp://host:port, and optionally replay=tcp://host:port,
        /// block-size=<tokens>, topic=<topic>, media=GPU+CPU. Repeat the flag;
        /// in the environment separate them with ';'. See docs/events.md.
        #[arg(long = "engine", value_delimiter = ';')]
        engines: Vec<String> = list => subscriptions: Vec<Subscription> = Vec::new(),
        /// Engines found through DNS: srv=<SRV name>,model=<model>, and
        /// optionally replay-port=<port>, block-size=<tokens>, topic=<topic>,
        /// media=GPU+CPU. Every record of the SRV name (a headless Service's
        /// named port: _kv-events._tcp.vllm.<namespace>.svc.cluster.local) is
        /// an engine, its pod named by the target's first label. Resolved
        /// every --engine-dns-interval; engines that appear are subscribed,
        /// those gone unsubscribed. Repeat the flag; in the environment
        /// separate them with ';'. See docs/events.md.
        #[arg(long = "engine-dns", value_delimiter = ';')]
        engine_dns: Vec<String> = list => dns.sources,
        /// How often the --engine-dns names are resolved again.
        #[arg(long)]
        engine_dns_interval: HumanDuration = duration => dns.interval,
            check Duration::from_millis(100)..=Duration::from_secs(3600),
        /// The DNS server (ip:port) --engine-dns asks, instead of the system's
        /// (/etc/resolv.conf).
        #[arg(long)]
        engine_dns_server: std::net::SocketAddr = optional => dns.server,
        /// Bind a SUB socket here (tcp://host:port) for engines that connect to
        /// the server and publish with topics kv@<pod>@<model>; "off" for none.
        #[arg(long)]
        engine_listen: String = collector_listen => listen: Option<String> = None,
        /// A network (10.0.0.0/16) or address engines may connect to
        /// --engine-listen from; connections from elsewhere are refused before
        /// any message is read. Repeat the flag; in the environment separate
        /// them with ';'. None given: any host that reaches the port.
        #[arg(long = "engine-allow", value_delimiter = ';')]
        // Open, as the port is off by default: an operator who opens it is
        // warned at start when the list is empty and the address is not
        // loopback.
        engine_allow: Vec<String> = collector_allow => allow: EngineAllow = EngineAllow::default(),
        /// Let a pod met through --engine-listen move to another address:
        /// without it, a pod's topic is bound to the address of its first
        /// message until the pod is unsubscribed, and messages under it from
        /// elsewhere are refused.
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        engine_allow_moves: bool = plain => allow_moves: bool = false,
        /// Clear an engine-fed pod and learn it again (its engine's whole
        /// buffer, with a replay endpoint) when gateways' receipts make it
        /// suspect.
        #[arg(long, num_args = 0..=1, default_missing_value = "true")]
        // Off: a suspect view already steers routing away; a resync drops
        // whatever the pod's blocks still say truly, which an operator
        // chooses.
        receipt_resync: bool = plain => receipt_resync: bool = false,
        /// Block size in tokens of the engines that connect to --engine-listen.
        #[arg(long)]
        // vLLM's default block size.
        engine_block_size: u32 = plain => central_block_size: u32 = 16,
        /// Tokens per block of the gateways' token keys; engine blocks are
        /// hashed into blocks of this size.
        #[arg(long)]
        token_block: u32 = plain
            => token_block: u32 = prefix_proto::key::TOKEN_BLOCK_TOKENS as u32, check ONE,
        /// Also key engine blocks by another indexer's hashes: "dynamo" (NVIDIA
        /// Dynamo's local block hashes, for /query_by_hash and
        /// /query_tiered_by_hash), "engine" (each engine's own block hashes,
        /// for SGLang's router: MatchExternalKvPrefix) or "none". Costs memory
        /// per engine block; see docs/routers.md.
        #[arg(long)]
        // None: each named block costs the index an entry in a table of
        // names (docs/routers.md has the figures), and only a router written
        // for another indexer asks by them.
        block_aliases: BlockAliases = plain => block_aliases: BlockAliases = BlockAliases::None,
        /// Most engines followed at once (configured, subscribed at run time,
        /// or met through --engine-listen).
        #[arg(long)]
        max_engines: usize = plain => max_engines: usize = 1_024, check ONE,
        /// Threads that follow the engines, each polling its share of their
        /// sockets.
        #[arg(long)]
        // Decoding and applying take one core at most a few engines' worth
        // of batches each; two threads keep up with a busy fleet on a small
        // machine and leave the rest to lookups.
        engine_threads: usize = plain => threads: usize = 2, check 1..=64,
        /// Most replays under way at once, over all engines; each holds a
        /// socket and a connection to its engine while it runs, and a replay
        /// past the bound waits for one to end.
        #[arg(long)]
        // A replay is asked on every (re)connection: a fleet starting at
        // once asks thousands, answered this many at a time.
        max_engine_replays: usize = plain => max_replays: usize = 64, check ONE,
        /// How long a replay may take before the pod is cleared and learnt
        /// again instead.
        #[arg(long)]
        // vLLM answers a replay request within its publisher loop's 100 ms
        // tick; 5 s allows for a buffer of thousands of batches.
        replay_timeout: HumanDuration = duration => replay_timeout: Duration =
            Duration::from_secs(5),
            check NotZero("replay-timeout", "0s", "must be positive"),
        /// Live batches held back while a replay runs; past it, the pod is
        /// cleared and learnt again.
        #[arg(long)]
        // vLLM's replay buffer holds 10,000 batches: a replay can bring no
        // more than that many, nor need more held back.
        max_held_batches: usize = plain => max_held_batches: usize = 10_000, check ONE,
        /// Bytes of live batches held back while a replay runs; past it, the
        /// pod is cleared and learnt again.
        #[arg(long)]
        // Seconds of a busy engine's batches (tens of KiB each) while a
        // replay runs; with max-event-bytes, the bound on what one engine's
        // replay holds whatever it sends.
        max_held_bytes: usize = plain => max_held_bytes: usize = 256 << 20,
        /// Most events in one engine batch; a larger batch is skipped as a
        /// decode error.
        #[arg(long)]
        max_batch_events: usize = plain => decode.max_events, check DECODE,
        /// Most block hashes in one engine event; a larger event is skipped
        /// alone as a decode error.
        #[arg(long)]
        max_event_hashes: usize = plain => decode.max_hashes, check DECODE,
        /// Most token ids in one engine event; a larger event is skipped alone
        /// as a decode error.
        #[arg(long)]
        max_event_tokens: usize = plain => decode.max_tokens, check DECODE,
        /// Largest engine event message in bytes; libzmq drops a connection
        /// that sends a larger one (the gap is then replayed or resynced).
        #[arg(long)]
        // A prefill of 128 Ki tokens (8,192 blocks) encodes in about
        // 0.5 MiB; 4 MiB leaves room for steps of many requests.
        max_event_bytes: usize = plain => max_message_bytes: usize = 4 << 20, check 1024..,
        /// Engine messages buffered per engine connection while its thread is
        /// busy; past it libzmq drops them (a gap, replayed or resynced).
        #[arg(long)]
        // Seconds of a busy engine's batches (one per scheduler step); with
        // the message bound, at most 4 GiB from a hostile peer, a few MiB
        // from a real one.
        max_queued_events: usize = plain
            => max_queued_messages: usize = 1_000, check 1..=i32::MAX as usize,
        /// How often each engine thread wakes when nothing arrives, to notice
        /// the shutdown and a replay's deadline.
        #[arg(long)]
        // A stopped server waits at most this for its engine threads, and a
        // replay's deadline is kept to within it; idle engines cost no
        // wake-ups of their own.
        engine_poll: HumanDuration = duration => poll: Duration = Duration::from_millis(100),
            check Duration::from_millis(1)..=Duration::from_secs(10),
        /// How long an engine-fed pod reports its view as "learning" after a
        /// resync (or after joining a running engine) when nothing proves it
        /// exact sooner: an estimate of how long the engine's cache takes to
        /// turn over.
        #[arg(long)]
        // A busy engine's GPU cache (tens of thousands of blocks) turns over
        // within minutes; an idle one's may not, and its pods then answer
        // short of what it holds, never more.
        learning_period: HumanDuration = duration
            => learning_period: Duration = Duration::from_secs(300),
    }
    /// Precise mode's configuration (see `ServerConfig::engines`).
    pub struct EngineConfig {
        /// Engines found through DNS (the defaults' reasons in `DnsConfig`).
        dns: DnsConfig,
        /// Bounds on one decoded batch: events, and hashes and token ids per
        /// event. A batch over the first is skipped whole, an event over the
        /// others alone, as decode errors.
        decode: prefix_events::DecodeLimits,
    }
}

/// The central collector's address: `tcp://host:port`, or `off`.
mod collector_listen {
    use crate::config::value::invalid;
    use crate::config::ConfigError;

    pub fn put(
        name: &'static str,
        written: String,
        value: &mut Option<String>,
    ) -> Result<(), ConfigError> {
        *value = match written.as_str() {
            "off" => None,
            l if l.starts_with("tcp://") => Some(written),
            l => return invalid(name, &l, "not tcp://host:port or \"off\""),
        };
        Ok(())
    }

    pub fn written(value: &Option<String>) -> Option<String> {
        Some(value.clone().unwrap_or_else(|| "off".into()))
    }
}

/// Where engines may connect to the central collector from: networks
/// and addresses; none given, anywhere.
mod collector_allow {
    use super::EngineAllow;
    use crate::config::value::invalid;
    use crate::config::ConfigError;

    pub fn put(
        name: &'static str,
        written: Vec<String>,
        value: &mut EngineAllow,
    ) -> Result<(), ConfigError> {
        *value = EngineAllow::parse(&written)
            .or_else(|bad| invalid(name, &bad, "not a network (10.0.0.0/16) or an address"))?;
        Ok(())
    }

    pub fn written(value: &EngineAllow) -> Option<Vec<String>> {
        (!value.is_open()).then(|| value.entries())
    }
}

/// Which other indexer's hashes engine blocks are also keyed by
/// (`--block-aliases`; `prefix_index::Alias`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum BlockAliases {
    /// Our hashes only.
    #[default]
    None,
    /// NVIDIA Dynamo's local block hashes: xxh3-64 of each engine block's
    /// token ids, seeded by its LoRA adapter and salt.
    Dynamo,
    /// Each engine's own block hashes (SGLang's, which its router
    /// computes from the prompt).
    Engine,
}

impl EngineConfig {
    /// How much a replay may hold back of the live stream.
    pub fn held_limit(&self) -> prefix_events::HeldLimit {
        prefix_events::HeldLimit {
            batches: self.max_held_batches,
            bytes: self.max_held_bytes,
        }
    }

    /// [`EngineConfig::poll`] in milliseconds, as libzmq's poll takes it.
    pub(super) fn poll_ms(&self) -> i64 {
        i64::try_from(self.poll.as_millis()).unwrap_or(i64::MAX)
    }

    /// Checks what the table's rules cannot: that the engines' block sizes
    /// fit the gateways' within `max_ratio` (the index's `max_block_ratio`),
    /// and that no two engines or sources name one pod or SRV name.
    pub fn validate(&self, max_ratio: u32) -> Result<(), ConfigError> {
        if self.max_held_bytes < self.max_message_bytes {
            return invalid(
                "max-held-bytes",
                &self.max_held_bytes,
                "must be at least max-event-bytes",
            );
        }
        let dns = &self.dns;
        let templates = dns.sources.iter().map(|s| &s.template);
        let sizes = self.subscriptions.iter().chain(templates.clone());
        let sizes = sizes.map(|s| s.block_size);
        let central = self.listen.as_ref().map(|_| self.central_block_size);
        for size in sizes.chain(central) {
            if Ratio::new(size, self.token_block, max_ratio).is_err() {
                return invalid(
                    "engine block-size",
                    &size,
                    "must divide or be a multiple of token-block, within max-block-ratio",
                );
            }
        }
        if let Some(s) = self
            .subscriptions
            .iter()
            .chain(templates)
            .find(|s| s.lower_media().count() > prefix_index::MAX_LOWER_TIERS as usize)
        {
            return invalid(
                "engine",
                &s.pod,
                "lists more lower cache tiers (media) than a pod may have (16)",
            );
        }
        if let Some(srv) = repeated(dns.sources.iter().map(|s| &*s.srv)) {
            return invalid("engine-dns", &srv, "two sources name this SRV record set");
        }
        if let Some(pod) = repeated(self.subscriptions.iter().map(|s| &*s.pod)) {
            return invalid("engine", &pod, "two subscriptions name this pod");
        }
        Ok(())
    }
}

/// A name `names` holds more than once, if any.
fn repeated<'a>(names: impl Iterator<Item = &'a str>) -> Option<&'a str> {
    let mut names: Vec<&str> = names.collect();
    names.sort_unstable();
    names.windows(2).find(|w| w[0] == w[1]).map(|w| w[0])
}
