//! Per-subscription metrics, read from each subscription's counters at
//! scrape time (labelled by pod), and the lookups' hit-ratio counters
//! (labelled by model).

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
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

/// A metric a family's samples are, and so the family's type (known even
/// for a family with no samples).
pub(crate) trait Sample: EncodeMetric {
    const KIND: MetricType;
}

impl Sample for ConstCounter<u64> {
    const KIND: MetricType = MetricType::Counter;
}

impl<N> Sample for ConstGauge<N>
where
    ConstGauge<N>: EncodeMetric,
{
    const KIND: MetricType = MetricType::Gauge;
}

/// Encodes one family of labelled samples: its name and help, its unit if
/// it has one, and each sample's labels and value.
pub(crate) fn labelled<L: EncodeLabelSet, M: Sample>(
    encoder: &mut DescriptorEncoder,
    (name, help, unit): (&str, &str, Option<&Unit>),
    samples: impl IntoIterator<Item = (L, M)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, unit, M::KIND)?;
    for (labels, metric) in samples {
        metric.encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The samples of a family of counters.
pub(crate) fn counters<L>(
    samples: impl IntoIterator<Item = (L, u64)>,
) -> impl Iterator<Item = (L, ConstCounter<u64>)> {
    samples.into_iter().map(|(l, n)| (l, ConstCounter::new(n)))
}

/// The samples of a family of gauges.
fn gauges<L, N>(
    samples: impl IntoIterator<Item = (L, N)>,
) -> impl Iterator<Item = (L, ConstGauge<N>)> {
    samples.into_iter().map(|(l, n)| (l, ConstGauge::new(n)))
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
        labelled(
            &mut encoder,
            ("engine_refused", "Publishing to --engine-listen refused, by reason: address (a connection from outside --engine-allow), moved (a message under a pod's topic from another address than the pod's)", None),
            counters(EngineRefusal::ALL.map(|why| (Reason { reason: why.label() }, engines.refused(why)))),
        )?;
        let standing = engines.standing(0);
        let disconnected = standing.followed - standing.connected - standing.failing;
        labelled(
            &mut encoder,
            ("engine_subscriptions", "Engines followed, by state: connected, disconnected, failing (its socket could not be opened or connected; the reason is the pod's last_error in list-engines)", None),
            gauges([
                ("connected", standing.connected),
                ("disconnected", disconnected),
                ("failing", standing.failing),
            ].map(|(state, n)| (State { state }, n as i64))),
        )?;
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
        let pod = |pod: &String| Pod { pod: pod.clone() };
        for (name, help, read) in COUNTERS {
            let samples = all.iter().map(|(p, stats)| (pod(p), read(stats)));
            labelled(&mut encoder, (name, help, None), counters(samples))?;
        }
        let resyncs = all.iter().flat_map(|(pod, stats)| {
            let reasons = Resync::LABELS.iter().zip(&stats.resyncs);
            reasons.map(|(reason, c)| {
                (
                    PodReason {
                        pod: pod.clone(),
                        reason,
                    },
                    counter(c),
                )
            })
        });
        labelled(
            &mut encoder,
            (
                "engine_resyncs",
                "Pods cleared and learnt again, by reason",
                None,
            ),
            counters(resyncs),
        )?;
        // Relaxed, both: a statistic.
        let up = |s: &SubStats| i64::from(s.connected.load(Ordering::Relaxed));
        let lag = |s: &SubStats| s.lag_ms.load(Ordering::Relaxed) as f64 / 1000.0;
        labelled(
            &mut encoder,
            (
                "engine_connected",
                "Whether the engine's PUB socket is connected (1) or not (0)",
                None,
            ),
            gauges(all.iter().map(|(p, stats)| (pod(p), up(stats)))),
        )?;
        labelled(
            &mut encoder,
            (
                "engine_lag",
                "Time from an engine's batch timestamp to its arrival, for the last batch",
                Some(&Unit::Seconds),
            ),
            gauges(all.iter().map(|(p, stats)| (pod(p), lag(stats)))),
        )?;
        const VIEWS: [PodView; 5] = [
            PodView::Exact,
            PodView::Learning,
            PodView::Replaying,
            PodView::Disconnected,
            PodView::Suspect,
        ];
        let reader = engines.index().reader();
        let at = crate::clock::now_ms();
        let views = all.iter().flat_map(|(pod, stats)| {
            // Evidence over belief, as in detailed lookups.
            let suspect = reader.receipts_of(pod, at).is_some_and(|s| s.suspect);
            let now = if suspect {
                Some(PodView::Suspect)
            } else {
                stats.view()
            };
            VIEWS.map(|view| {
                let labels = ViewLabels {
                    pod: pod.clone(),
                    view: view.name(),
                };
                (labels, i64::from(now == Some(view)))
            })
        });
        labelled(
            &mut encoder,
            ("engine_view", "How far the pod's answers can be trusted: 1 for its view (exact, learning, replaying, disconnected, suspect), 0 for the others", None),
            gauges(views),
        )
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
    let each = || sources.iter().zip(stats);
    let source = |s: &super::dns::DnsSource| Source {
        source: s.srv.clone(),
    };
    let lookups = each().flat_map(|(src, s)| {
        [("resolved", &s.resolved), ("failed", &s.failed)].map(|(outcome, c)| {
            let labels = SourceOutcome {
                source: src.srv.clone(),
                outcome,
            };
            (labels, counter(c))
        })
    });
    labelled(
        encoder,
        ("engine_dns_lookups", "Lookups of an --engine-dns source, by outcome: resolved (records or none), failed (what it follows is kept)", None),
        counters(lookups),
    )?;
    labelled(
        encoder,
        ("engine_dns_refused", "Engines an --engine-dns source named that could not be followed (max-engines, the index's bounds, a pod followed otherwise), counted each round", None),
        counters(each().map(|(src, s)| (source(src), counter(&s.refused)))),
    )?;
    // Relaxed: a statistic.
    let followed = |s: &super::dns::SourceStats| s.followed.load(Ordering::Relaxed);
    labelled(
        encoder,
        (
            "engine_dns_engines",
            "Engines an --engine-dns source follows now",
            None,
        ),
        gauges(each().map(|(src, s)| (source(src), followed(s)))),
    )
}
