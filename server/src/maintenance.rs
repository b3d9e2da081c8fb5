//! The maintenance task: sweeps the index when it has work.
//!
//! Every `sweep_interval` it asks the index whether a sweep is due (a cheap
//! look at counters, see `Index::sweep_due`); if so it runs one complete pass
//! (TTL expiry, removed pods, capacity and global-bound eviction, then freeing
//! retired memory) in calls of at most `sweep_budget` nodes; if not, it only
//! frees the retired memory whose grace period has passed. Each call runs on
//! tokio's blocking pool and the task yields between calls, so request
//! handling never waits for it; readers never wait for it either (the index's
//! lookups take no lock).

use std::sync::Arc;
use std::time::{Duration, Instant};

use prefix_index::Index;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use crate::clock::now_ms;
use crate::metrics::Metrics;

/// Runs until `shutdown`.
pub async fn run(
    index: Arc<Index>,
    metrics: Arc<Metrics>,
    interval: Duration,
    budget: usize,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(interval);
    // After a slow pass, wait a whole interval rather than sweep back to back.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        // A pass costs time in proportion to the whole index; run one only
        // when it has work (a pod over capacity, the global bound, a removed
        // pod, or memory of expired entries to free every ttl/8).
        if !index.sweep_due(now_ms()) {
            // Freed here too, not only by a pass: an index with nothing to
            // sweep still retires the copies its writers replace (the pod
            // names and views, one copy per engine subscribed), and they
            // would wait for the next pass, which may never come.
            let idx = index.clone();
            if let Err(e) = tokio::task::spawn_blocking(move || idx.reclaim()).await {
                tracing::error!(error = %e, "reclaim failed");
            }
            continue;
        }
        loop {
            let idx = index.clone();
            let started = Instant::now();
            let call = tokio::task::spawn_blocking(move || idx.sweep(now_ms(), budget)).await;
            let report = match call {
                Ok(r) => r,
                Err(e) => {
                    tracing::error!(error = %e, "sweep failed");
                    break;
                }
            };
            metrics.sweep(&report, started.elapsed().as_secs_f64());
            if report.expired + report.evicted + report.purged > 0 {
                tracing::debug!(?report, "swept");
            }
            let unfinished = report.passes == 0 && report.visited >= budget as u64;
            if !unfinished || shutdown.is_cancelled() {
                break;
            }
        }
    }
}
