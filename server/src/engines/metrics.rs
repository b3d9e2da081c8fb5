//! Per-subscription metrics, read from each subscription's counters at
//! scrape time (labelled by pod), and the lookups' hit-ratio counters
//! (labelled by model).

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::{EngineRefusal, Engines, SubStats};
use prefix_events::follow::Resync;
use prefix_proto::PodView;

/// The server's engine subscriptions, once they exist (metrics are made
/// before them).
pub type EnginesCell = Arc<OnceLock<Weak<Engines>>>;

/// Encodes every subscription's counters.
#[derive(Debug)]
pub struct EngineCollector(pub EnginesCell);

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct Pod {
    pod: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct State {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct Source {
    source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct SourceOutcome {
    source: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct PodReason {
    pod: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ViewLabels {
    pod: String,
    view: &'static str,
}

type Read = fn(&SubStats) -> u64;

fn counter(c: &std::sync::atomic::AtomicU64) -> u64 {
    // Relaxed: a statistic.
    c.load(Ordering::Relaxed)
}

/// (name, help, value) of every per-pod counter.
const COUNTERS: [(&str, &str, Read); 18] = [
    ("engine_batches", "Event batches applied", |s| {
        counter(&s.batches)
    }),
    ("engine_events", "Engine events applied", |s| {
        counter(&s.events)
    }),
    ("engine_blocks_stored", "Engine block copies stored", |s| {
        counter(&s.blocks_stored)
    }),
    (
        "engine_blocks_removed",
        "Engine block copies removed",
        |s| counter(&s.blocks_removed),
    ),
    (
        "engine_unknown_removals",
        "Removals of blocks not held (ignored)",
        |s| counter(&s.unknown_removed),
    ),
    (
        "engine_orphaned_stores",
        "Stores whose parent block is unknown",
        |s| counter(&s.orphaned),
    ),
    (
        "engine_too_deep_stores",
        "Stores past max-key-blocks or in a parent cycle",
        |s| counter(&s.too_deep),
    ),
    (
        "engine_refused_events",
        "Events refused (block size, token count, record bound)",
        |s| counter(&s.refused),
    ),
    (
        "engine_other_medium_events",
        "Events of a cache tier not routed on",
        |s| counter(&s.other_medium),
    ),
    (
        "engine_unknown_events",
        "Events of an unknown type, skipped",
        |s| counter(&s.unknown_events),
    ),
    (
        "engine_identity_blocks",
        "Blocks stored with an identity beyond their tokens (salt, multimodal items, prompt embeddings)",
        |s| counter(&s.identity_blocks),
    ),
    (
        "engine_untold_blocks",
        "Blocks whose identity could not be told (unknown extra keys, lookahead hashing, items in blocks not of the gateways' size): they match no key",
        |s| counter(&s.untold_blocks),
    ),
    (
        "engine_unmodelled_blocks",
        "Blocks stored in a KV-cache group of a kind the index does not model (Mamba with block-aligned caching, another block size): the pod matches nothing while it has one",
        |s| counter(&s.unmodelled_blocks),
    ),
    (
        "engine_unresolved_blocks",
        "Blocks of a store that skips blocks (a sliding window's) whose place in the sequence no other group told: not held",
        |s| counter(&s.unresolved_blocks),
    ),
    (
        "engine_decode_errors",
        "Messages that did not decode, skipped",
        |s| counter(&s.decode_errors),
    ),
    (
        "engine_sequence_gaps",
        "Gaps in the live stream's sequence numbers (each a run of lost batches, replayed or not)",
        |s| counter(&s.gaps),
    ),
    (
        "engine_lost_batches",
        "Batches the live stream skipped; those a replay brought back are applied and counted in engine_batches too",
        |s| counter(&s.lost),
    ),
    (
        "engine_replays",
        "Replays asked of the engine: to fill a gap, to check the engine after a (re)connection, or for its whole buffer",
        |s| counter(&s.replays),
    ),
];

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(engines) = self.0.get().and_then(Weak::upgrade) else {
            return Ok(());
        };
        let strays = ConstCounter::new(engines.strays());
        let family = encoder.encode_descriptor(
            "engine_stray_messages",
            "Messages to --engine-listen not placed (not a live message, a topic other than kv@<pod>@<model>, a pod followed otherwise or past max-engines), skipped",
            None,
            strays.metric_type(),
        )?;
        strays.encode(family)?;
        let mut family = encoder.encode_descriptor(
            "engine_refused",
            "Publishing to --engine-listen refused, by reason: address (a connection from outside --engine-allow), moved (a message under a pod's topic from another address than the pod's)",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for why in EngineRefusal::ALL {
            let labels = Reason {
                reason: why.label(),
            };
            ConstCounter::new(engines.refused(why)).encode(family.encode_family(&labels)?)?;
        }
        let standing = engines.standing(0);
        let mut family = encoder.encode_descriptor(
            "engine_subscriptions",
            "Engines followed, by state: connected, disconnected, failing (its socket could not be opened or connected; the reason is the pod's last_error in list-engines)",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        let disconnected = standing.followed - standing.connected - standing.failing;
        for (state, n) in [
            ("connected", standing.connected),
            ("disconnected", disconnected),
            ("failing", standing.failing),
        ] {
            let labels = State { state };
            ConstGauge::new(n as i64).encode(family.encode_family(&labels)?)?;
        }
        let running = ConstGauge::new(engines.replays_running() as i64);
        let family = encoder.encode_descriptor(
            "engine_replays_running",
            "Replays under way now, each with a socket of its own (at most --max-engine-replays)",
            None,
            running.metric_type(),
        )?;
        running.encode(family)?;
        dns(&engines, &mut encoder)?;
        let all = engines.stats();
        for (name, help, read) in COUNTERS {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstCounter::new(0u64).metric_type(),
            )?;
            for (pod, stats) in &all {
                let labels = Pod { pod: pod.clone() };
                ConstCounter::new(read(stats)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "engine_resyncs",
            "Pods cleared and learnt again, by reason",
            None,
            ConstCounter::new(0u64).metric_type(),
        )?;
        for (pod, stats) in &all {
            for (reason, c) in Resync::LABELS.iter().zip(&stats.resyncs) {
                let labels = PodReason {
                    pod: pod.clone(),
                    reason,
                };
                ConstCounter::new(counter(c)).encode(family.encode_family(&labels)?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "engine_connected",
            "Whether the engine's PUB socket is connected (1) or not (0)",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        for (pod, stats) in &all {
            // Relaxed: a statistic.
            let up = i64::from(stats.connected.load(Ordering::Relaxed));
            ConstGauge::new(up).encode(family.encode_family(&Pod { pod: pod.clone() })?)?;
        }
        let mut family = encoder.encode_descriptor(
            "engine_lag",
            "Time from an engine's batch timestamp to its arrival, for the last batch",
            Some(&Unit::Seconds),
            ConstGauge::new(0.0f64).metric_type(),
        )?;
        for (pod, stats) in &all {
            // Relaxed: a statistic.
            let lag = stats.lag_ms.load(Ordering::Relaxed) as f64 / 1000.0;
            ConstGauge::new(lag).encode(family.encode_family(&Pod { pod: pod.clone() })?)?;
        }
        let mut family = encoder.encode_descriptor(
            "engine_view",
            "How far the pod's answers can be trusted: 1 for its view (exact, learning, replaying, disconnected), 0 for the others",
            None,
            ConstGauge::new(0i64).metric_type(),
        )?;
        const VIEWS: [PodView; 4] = [
            PodView::Exact,
            PodView::Learning,
            PodView::Replaying,
            PodView::Disconnected,
        ];
        for (pod, stats) in &all {
            let now = stats.view();
            for view in VIEWS {
                let labels = ViewLabels {
                    pod: pod.clone(),
                    view: view.name(),
                };
                let on = i64::from(now == Some(view));
                ConstGauge::new(on).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// Encodes the counters of the engines found through DNS, by source (its
/// SRV name).
fn dns(engines: &Engines, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
    let sources = &engines.config().dns.sources;
    if sources.is_empty() {
        return Ok(());
    }
    let stats = engines.dns_stats();
    let mut family = encoder.encode_descriptor(
        "engine_dns_lookups",
        "Lookups of an --engine-dns source, by outcome: resolved (records or none), failed (what it follows is kept)",
        None,
        ConstCounter::new(0u64).metric_type(),
    )?;
    for (source, s) in sources.iter().zip(stats) {
        for (outcome, c) in [("resolved", &s.resolved), ("failed", &s.failed)] {
            let labels = SourceOutcome {
                source: source.srv.clone(),
                outcome,
            };
            ConstCounter::new(counter(c)).encode(family.encode_family(&labels)?)?;
        }
    }
    let mut family = encoder.encode_descriptor(
        "engine_dns_refused",
        "Engines an --engine-dns source named that could not be followed (max-engines, the index's bounds, a pod followed otherwise), counted each round",
        None,
        ConstCounter::new(0u64).metric_type(),
    )?;
    for (source, s) in sources.iter().zip(stats) {
        let labels = Source {
            source: source.srv.clone(),
        };
        ConstCounter::new(counter(&s.refused)).encode(family.encode_family(&labels)?)?;
    }
    let mut family = encoder.encode_descriptor(
        "engine_dns_engines",
        "Engines an --engine-dns source follows now",
        None,
        ConstGauge::new(0i64).metric_type(),
    )?;
    for (source, s) in sources.iter().zip(stats) {
        let labels = Source {
            source: source.srv.clone(),
        };
        // Relaxed: a statistic.
        let n = s.followed.load(Ordering::Relaxed);
        ConstGauge::new(n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}
