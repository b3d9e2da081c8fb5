//! Prometheus metrics, rendered in the text format on `/metrics`.
//!
//! Request counters are resolved once per (op, outcome) pair at start, so the
//! request path only adds to atomics; streams add a whole frame's counts at
//! once. Index sizes are read from the index at scrape time.

use std::sync::Arc;

use prefix_index::{Index, SweepReport, WriteSummary};

use crate::engines::metrics::{EngineCollector, EnginesCell};
use crate::engines::Engines;
use prefix_proto::{Op, OpKind, ReceiptOutcome};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

/// Label slots: one per operation, in [`OpKind::ALL`] order, then `batch`
/// (the latency of whole batch frames) and `frame` (frames refused before any
/// op could be read).
pub const SLOTS: usize = OpKind::ALL.len() + 2;
/// Slot of the `batch` label.
pub const BATCH: usize = OpKind::ALL.len();
/// Slot of the `frame` label.
pub const FRAME: usize = OpKind::ALL.len() + 1;

/// The label of a slot.
pub fn slot_label(slot: usize) -> &'static str {
    match OpKind::ALL.get(slot) {
        Some(kind) => kind.name(),
        None if slot == BATCH => "batch",
        None => "frame",
    }
}

/// The label slot of an op.
pub fn op_slot(op: &Op) -> usize {
    op.kind().index()
}

/// Ops counted by (op slot, failed?), added to the shared counters at once.
#[derive(Debug, Default)]
pub struct Tally(pub [[u64; 2]; SLOTS]);

impl Tally {
    /// Counts one op.
    pub fn add(&mut self, slot: usize, failed: bool) {
        self.0[slot][usize::from(failed)] += 1;
    }
}

/// Every metric of a server.
pub struct Metrics {
    registry: Registry,
    requests: Vec<[Counter; 2]>,
    latency: Vec<Histogram>,
    /// Open client connections.
    pub connections: Gauge,
    /// Request frames being applied right now.
    pub in_flight: Gauge,
    /// Busy-polling spinners spinning right now (see [`crate::BusyPoll`]).
    pub busy_spinners: Gauge,
    /// Connections accepted since start.
    pub connections_accepted: Counter,
    /// Connections refused (over `max_connections`, or shutting down).
    pub connections_refused: Counter,
    /// Handshakes that failed (untrusted client certificate, wrong ALPN, ...).
    pub handshakes_failed: Counter,
    sweep_calls: Counter,
    sweep_passes: Counter,
    sweep_expired: Counter,
    sweep_evicted: Counter,
    sweep_purged: Counter,
    sweep_unlinked: Counter,
    sweep_seconds: Histogram,
    snapshots: Counter,
    /// Snapshots that could not be written, and a snapshot refused at start.
    pub snapshot_failures: Counter,
    snapshot_bytes: Gauge,
    snapshot_entries: Gauge,
    /// Snapshots sent to peers (replicas filling themselves).
    pub snapshots_sent: Counter,
    /// Snapshots asked of peers that failed or were refused (damaged,
    /// truncated, too large, peer unreachable).
    pub bootstrap_failures: Counter,
    /// Writes held while filling from a peer, applied after the restore.
    pub bootstrap_held: Counter,
    /// Whether the server is filling itself from a peer right now (1) or not.
    pub bootstrapping: Gauge,
    /// Writes read from a peer's tail after its snapshot, and applied (or
    /// held with the gateways' writes while filling).
    pub tail_writes: Counter,
    /// Writes of a peer's tail this server never got: the peer no longer
    /// kept them, or they were refused here (limits, a full hold queue).
    pub tail_lost: Counter,
    /// Rounds of repair with a peer that ended (whatever they found).
    pub repair_rounds: Counter,
    /// Cells of digests that differed from a peer's.
    pub repair_cells: Counter,
    /// Items (block position, pod) of differing cells compared with a
    /// peer's.
    pub repair_items: Counter,
    /// Bytes of the peers' answers to repair's questions.
    pub repair_bytes: Counter,
    /// Entries repair copied from a peer: (key, pod) pairs the peer held
    /// and this server lacked.
    pub repair_copied: Counter,
    /// Pods repair removed here because a peer had removed them after
    /// their last write here.
    pub repair_removed: Counter,
    /// Rounds of repair with a peer that failed (unreachable, refused).
    pub repair_failures: Counter,
    snapshot_seconds: Histogram,
    /// Resident memory of the process, read at scrape time (Linux).
    resident_bytes: Gauge,
    index: [Gauge; 8],
    /// The engine subscriptions, read at scrape time.
    engines: EnginesCell,
    /// Key blocks and best matched blocks of lookups, by model.
    lookup_blocks: Family<ModelLabels, Counter>,
    lookup_matched: Family<ModelLabels, Counter>,
    /// Blocks predicted minus blocks reused, per receipt.
    receipt_difference: Histogram,
    /// Each pod's receipts by outcome, read from the index at each scrape.
    receipts: ReceiptsCell,
}

/// Each live pod's receipts by outcome ([`ReceiptOutcome::ALL`] order), as
/// the scrape being rendered read them from the index (`Metrics::render`
/// fills it before it encodes: the registry's collectors see no index).
type ReceiptsCell = Arc<parking_lot::Mutex<Vec<(String, [u64; 3])>>>;

/// Encodes `receipts_total{pod,outcome}` from the last scrape's reading.
#[derive(Debug)]
struct ReceiptCollector(ReceiptsCell);

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ReceiptLabels {
    pod: String,
    outcome: &'static str,
}

impl Collector for ReceiptCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let all = self.0.lock().clone();
        let samples = all.iter().flat_map(|(pod, totals)| {
            ReceiptOutcome::ALL.iter().zip(totals).map(|(o, &n)| {
                let labels = ReceiptLabels {
                    pod: pod.clone(),
                    outcome: o.name(),
                };
                (labels, n)
            })
        });
        crate::engines::metrics::labelled(
            &mut encoder,
            (
                "receipts",
                "Receipts counted per pod, by outcome: exact, over (the index promised more than the engine reused), under",
                None,
            ),
            crate::engines::metrics::counters(samples),
        )
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct FrameLabels {
    op: &'static str,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("prefix_index");
        let requests_family = Family::<OpLabels, Counter>::default();
        registry.register(
            "requests",
            "Operations handled, by op and outcome (a batch counts each op)",
            requests_family.clone(),
        );
        let requests = (0..SLOTS)
            .map(slot_label)
            .map(|op| {
                ["ok", "error"].map(|outcome| {
                    requests_family
                        .get_or_create(&OpLabels { op, outcome })
                        .clone()
                })
            })
            .collect();
        // 1 µs to ~0.5 s, doubling.
        let latency_family = Family::<FrameLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(1e-6, 2.0, 20))
        });
        registry.register(
            "request_duration_seconds",
            "Server time per frame, from decoded to answered, by op (batch for batches)",
            latency_family.clone(),
        );
        let latency = (0..SLOTS)
            .map(|slot| {
                let op = slot_label(slot);
                latency_family.get_or_create(&FrameLabels { op }).clone()
            })
            .collect();
        let m = Metrics {
            registry,
            requests,
            latency,
            connections: Gauge::default(),
            in_flight: Gauge::default(),
            busy_spinners: Gauge::default(),
            connections_accepted: Counter::default(),
            connections_refused: Counter::default(),
            handshakes_failed: Counter::default(),
            sweep_calls: Counter::default(),
            sweep_passes: Counter::default(),
            sweep_expired: Counter::default(),
            sweep_evicted: Counter::default(),
            sweep_purged: Counter::default(),
            sweep_unlinked: Counter::default(),
            sweep_seconds: Histogram::new(exponential_buckets(1e-5, 2.0, 18)),
            snapshots: Counter::default(),
            snapshot_failures: Counter::default(),
            snapshots_sent: Counter::default(),
            bootstrap_failures: Counter::default(),
            bootstrap_held: Counter::default(),
            tail_writes: Counter::default(),
            tail_lost: Counter::default(),
            repair_rounds: Counter::default(),
            repair_cells: Counter::default(),
            repair_items: Counter::default(),
            repair_bytes: Counter::default(),
            repair_copied: Counter::default(),
            repair_removed: Counter::default(),
            repair_failures: Counter::default(),
            bootstrapping: Gauge::default(),
            snapshot_bytes: Gauge::default(),
            snapshot_entries: Gauge::default(),
            snapshot_seconds: Histogram::new(exponential_buckets(1e-3, 2.0, 16)),
            resident_bytes: Gauge::default(),
            index: Default::default(),
            engines: EnginesCell::default(),
            lookup_blocks: Family::default(),
            lookup_matched: Family::default(),
            receipt_difference: Histogram::new([
                -64.0, -16.0, -4.0, -1.0, 0.0, 1.0, 4.0, 16.0, 64.0,
            ]),
            receipts: ReceiptsCell::default(),
        };
        m.register_rest()
    }
}

impl Metrics {
    fn register_rest(mut self) -> Self {
        let r = &mut self.registry;
        r.register(
            "connections",
            "Open client connections",
            self.connections.clone(),
        );
        r.register(
            "requests_in_flight",
            "Request frames being applied right now",
            self.in_flight.clone(),
        );
        r.register(
            "busy_poll_spinners",
            "Busy-polling spinners spinning right now (each keeps a worker at 100%)",
            self.busy_spinners.clone(),
        );
        r.register(
            "connections_accepted",
            "Connections accepted",
            self.connections_accepted.clone(),
        );
        r.register(
            "connections_refused",
            "Connections refused: over max_connections or shutting down",
            self.connections_refused.clone(),
        );
        r.register(
            "handshakes_failed",
            "TLS or QUIC handshakes that failed (untrusted certificate, wrong ALPN)",
            self.handshakes_failed.clone(),
        );
        r.register("sweep_calls", "Sweep calls", self.sweep_calls.clone());
        r.register(
            "sweep_passes",
            "Completed sweep passes over every model",
            self.sweep_passes.clone(),
        );
        r.register(
            "sweep_expired_entries",
            "(pod, block) entries removed by TTL",
            self.sweep_expired.clone(),
        );
        r.register(
            "sweep_evicted_entries",
            "(pod, block) entries evicted for pod capacity or max_blocks",
            self.sweep_evicted.clone(),
        );
        r.register(
            "sweep_purged_entries",
            "(pod, block) entries of removed pods freed",
            self.sweep_purged.clone(),
        );
        r.register(
            "sweep_unlinked_nodes",
            "Tree nodes unlinked by the sweep",
            self.sweep_unlinked.clone(),
        );
        r.register(
            "sweep_duration_seconds",
            "Time of one sweep call",
            self.sweep_seconds.clone(),
        );
        r.register(
            "snapshots_written",
            "Snapshots written to the data directory",
            self.snapshots.clone(),
        );
        r.register(
            "snapshot_failures",
            "Snapshots that could not be written, or refused at start",
            self.snapshot_failures.clone(),
        );
        r.register(
            "snapshots_sent",
            "Snapshots sent to peers filling themselves",
            self.snapshots_sent.clone(),
        );
        r.register(
            "bootstrap_failures",
            "Snapshots asked of peers that failed or were refused",
            self.bootstrap_failures.clone(),
        );
        r.register(
            "bootstrap_held_writes",
            "Writes held while filling from a peer, applied after the restore",
            self.bootstrap_held.clone(),
        );
        r.register(
            "tail_writes",
            "Writes read from a peer's tail after its snapshot and applied",
            self.tail_writes.clone(),
        );
        r.register(
            "tail_lost_writes",
            "Writes of a peer's tail never applied here (not kept there, or refused here)",
            self.tail_lost.clone(),
        );
        r.register(
            "repair_rounds",
            "Rounds of repair with a peer that ended",
            self.repair_rounds.clone(),
        );
        r.register(
            "repair_differing_cells",
            "Cells of digests that differed from a peer's",
            self.repair_cells.clone(),
        );
        r.register(
            "repair_items",
            "Items (block position, pod) of differing cells compared with a peer's",
            self.repair_items.clone(),
        );
        r.register(
            "repair_received_bytes",
            "Bytes of the peers' answers to repair's questions",
            self.repair_bytes.clone(),
        );
        r.register(
            "repair_copied_entries",
            "Entries (key, pod) repair copied from a peer that held them and this server lacked",
            self.repair_copied.clone(),
        );
        r.register(
            "repair_removed_pods",
            "Pods repair removed because a peer removed them after their last write here",
            self.repair_removed.clone(),
        );
        r.register(
            "repair_failures",
            "Rounds of repair with a peer that failed",
            self.repair_failures.clone(),
        );
        r.register(
            "bootstrapping",
            "1 while the server fills itself from a peer (not ready), else 0",
            self.bootstrapping.clone(),
        );
        r.register(
            "snapshot_bytes",
            "Size of the last snapshot written",
            self.snapshot_bytes.clone(),
        );
        r.register(
            "snapshot_entries",
            "(pod, node) entries in the last snapshot written",
            self.snapshot_entries.clone(),
        );
        r.register(
            "snapshot_duration_seconds",
            "Time to write one snapshot",
            self.snapshot_seconds.clone(),
        );
        r.register(
            "process_resident_memory_bytes",
            "Resident memory of the server process",
            self.resident_bytes.clone(),
        );
        r.register_collector(Box::new(ProcessCpu));
        r.register_collector(Box::new(EngineCollector(self.engines.clone())));
        r.register_collector(Box::new(ReceiptCollector(self.receipts.clone())));
        r.register(
            "receipt_difference_blocks",
            "Per receipt, the blocks the index predicted minus those the engine reused (above 0: over-predicted)",
            self.receipt_difference.clone(),
        );
        r.register(
            "lookup_key_blocks",
            "Blocks in the keys of lookups, by model",
            self.lookup_blocks.clone(),
        );
        r.register(
            "lookup_matched_blocks",
            "Blocks matched by the best pod of each lookup, by model: over \
             lookup_key_blocks, the hit ratio the index predicts",
            self.lookup_matched.clone(),
        );
        let names = [
            ("index_models", "Models in the index"),
            ("index_pods", "Live pods"),
            ("index_nodes", "Tree nodes"),
            ("index_tree_blocks", "Distinct blocks stored"),
            (
                "index_entries",
                "Stored (pod, block) entries, bounded by max_blocks",
            ),
            ("index_bytes", "Heap bytes of the index"),
            (
                "index_engine_blocks",
                "Engine block records of engine-fed pods, bounded by max_engine_blocks",
            ),
            (
                "index_engine_bytes",
                "Heap bytes of the engine block records",
            ),
        ];
        for ((name, help), g) in names.iter().zip(&self.index) {
            r.register(*name, *help, g.clone());
        }
        self
    }

    /// Adds a frame's op counts.
    pub fn count(&self, tally: &Tally) {
        for (slot, [ok, err]) in tally.0.iter().enumerate() {
            if *ok > 0 {
                self.requests[slot][0].inc_by(*ok);
            }
            if *err > 0 {
                self.requests[slot][1].inc_by(*err);
            }
        }
    }

    /// The engine subscriptions, once watched.
    pub fn engines(&self) -> Option<Arc<Engines>> {
        self.engines.get().and_then(std::sync::Weak::upgrade)
    }

    /// Reads the engine subscriptions' counters at each scrape from now on.
    pub fn watch_engines(&self, engines: &Arc<Engines>) {
        let _ = self.engines.set(Arc::downgrade(engines));
    }

    /// Counts one frame's lookups of one model: their key blocks and their
    /// best matches.
    pub fn lookups(&self, model: &str, key_blocks: u64, matched: u64) {
        let labels = ModelLabels {
            model: model.to_string(),
        };
        self.lookup_blocks.get_or_create(&labels).inc_by(key_blocks);
        self.lookup_matched.get_or_create(&labels).inc_by(matched);
    }

    /// Records one frame's server time.
    pub fn observe(&self, slot: usize, seconds: f64) {
        self.latency[slot].observe(seconds);
    }

    /// Records one snapshot written.
    pub fn snapshot(&self, s: &WriteSummary, seconds: f64) {
        self.snapshots.inc();
        self.snapshot_bytes.set(s.bytes as i64);
        self.snapshot_entries.set(s.entries as i64);
        self.snapshot_seconds.observe(seconds);
    }

    /// Records one sweep call.
    pub fn sweep(&self, r: &SweepReport, seconds: f64) {
        self.sweep_calls.inc();
        self.sweep_passes.inc_by(r.passes);
        self.sweep_expired.inc_by(r.expired);
        self.sweep_evicted.inc_by(r.evicted);
        self.sweep_purged.inc_by(r.purged);
        self.sweep_unlinked.inc_by(r.unlinked);
        self.sweep_seconds.observe(seconds);
    }

    /// Counts a receipt's difference (blocks predicted minus reused).
    pub fn receipt(&self, difference: i64) {
        self.receipt_difference.observe(difference as f64);
    }

    /// The text exposition, with index sizes read now.
    pub fn render(&self, index: &Index) -> String {
        let s = index.stats();
        let values = [
            s.models,
            s.pods,
            s.nodes,
            s.tree_blocks,
            s.entries,
            s.bytes,
            s.engine_blocks,
            s.engine_bytes,
        ];
        for (g, v) in self.index.iter().zip(values) {
            g.set(i64::try_from(v).unwrap_or(i64::MAX));
        }
        if let Some(rss) = resident_bytes() {
            self.resident_bytes
                .set(i64::try_from(rss).unwrap_or(i64::MAX));
        }
        *self.receipts.lock() = index.receipt_totals();
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// `process_cpu_seconds_total`: the CPU time (user and system) this process
/// has used, read at each scrape. Over the request counters it gives the
/// server's CPU time per op, the figure that sizes a server
/// (`docs/operations.md`); `prefix-load --metrics` reads it so.
#[derive(Debug)]
struct ProcessCpu;

impl Collector for ProcessCpu {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        // Where it cannot be read (no `/proc`), the metric is left out.
        let Some(seconds) = cpu_seconds() else {
            return Ok(());
        };
        let counter = ConstCounter::new(seconds);
        let metric = encoder.encode_descriptor(
            "process_cpu",
            "User and system CPU time of the server process",
            Some(&Unit::Seconds),
            counter.metric_type(),
        )?;
        counter.encode(metric)
    }
}

/// User plus system CPU time of this process, in seconds.
#[cfg(target_os = "linux")]
fn cpu_seconds() -> Option<f64> {
    let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
    let ticks = stat.utime.saturating_add(stat.stime);
    Some(ticks as f64 / procfs::ticks_per_second().max(1) as f64)
}

#[cfg(not(target_os = "linux"))]
fn cpu_seconds() -> Option<f64> {
    None
}

/// Resident memory of this process (procfs scales the kernel's page count by
/// the real page size).
#[cfg(target_os = "linux")]
fn resident_bytes() -> Option<u64> {
    use procfs::WithCurrentSystemInfo;
    let stat = procfs::process::Process::myself().ok()?.stat().ok()?;
    Some(stat.rss_bytes().get())
}

#[cfg(not(target_os = "linux"))]
fn resident_bytes() -> Option<u64> {
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use prefix_index::IndexConfig;

    #[test]
    fn every_operation_has_its_own_labelled_counters() {
        let labels: Vec<_> = (0..SLOTS).map(slot_label).collect();
        let names: Vec<_> = OpKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(labels[..OpKind::ALL.len()], names[..]);
        assert_eq!(labels[BATCH], "batch");
        assert_eq!(labels[FRAME], "frame");
        let m = Metrics::default();
        let mut tally = Tally::default();
        for (n, kind) in OpKind::ALL.iter().enumerate() {
            for _ in 0..=n {
                tally.add(kind.index(), false);
            }
        }
        tally.add(FRAME, true);
        m.count(&tally);
        let text = m.render(&Index::new(IndexConfig::default()));
        for (n, name) in names.iter().enumerate() {
            let line = format!(
                "prefix_index_requests_total{{op=\"{name}\",outcome=\"ok\"}} {}",
                n + 1
            );
            assert!(text.contains(&line), "{line} missing in\n{text}");
        }
        assert!(text.contains("prefix_index_requests_total{op=\"frame\",outcome=\"error\"} 1"));
    }
}
