//! A gateway's steady stream of writes to a replica set, for tests that
//! pause, kill or restart a replica under it.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prefix_client::wire::Op;
use prefix_client::Cluster;
use tokio::task::JoinHandle;

use super::eventually;

/// Write number `i` (from 1): a key of four blocks of its own, over six
/// models and eight pods.
pub fn steady_write(i: u64) -> (String, Vec<u64>, String) {
    (
        format!("model-{}", i % 6),
        (0..4).map(|b| i << 8 | b).collect(),
        format!("pod-{}", i % 8),
    )
}

/// Writes [`steady_write`]s through a `Cluster` at a steady rate, in
/// batches every 10 ms, until stopped.
pub struct SteadyWrites {
    stop: Arc<AtomicBool>,
    written: Arc<AtomicU64>,
    task: JoinHandle<()>,
}

impl SteadyWrites {
    /// Starts writing `rate` a second through `gateway`.
    pub fn start(gateway: &Cluster, rate: u64) -> SteadyWrites {
        let stop = Arc::new(AtomicBool::new(false));
        let written = Arc::new(AtomicU64::new(0));
        let (s, w, gateway) = (stop.clone(), written.clone(), gateway.clone());
        let task = tokio::spawn(async move {
            let per_tick = (rate / 100).max(1);
            let mut tick = tokio::time::interval(Duration::from_millis(10));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut i: u64 = 0;
            while !s.load(Ordering::Relaxed) {
                tick.tick().await;
                let ops: Vec<Op> = (0..per_tick)
                    .map(|_| {
                        i += 1;
                        let (model, key, pod) = steady_write(i);
                        Op::Insert { model, key, pod }
                    })
                    .collect();
                let _ = gateway.batch(ops).await;
                w.store(i, Ordering::Relaxed);
            }
        });
        SteadyWrites {
            stop,
            written,
            task,
        }
    }

    /// Writes made (their batches answered) so far.
    pub fn written(&self) -> u64 {
        // Relaxed: a count read for progress, nothing depends on it.
        self.written.load(Ordering::Relaxed)
    }

    /// The count [`SteadyWrites::written`] reads, to share with a reader.
    pub fn counter(&self) -> Arc<AtomicU64> {
        self.written.clone()
    }

    /// Waits until `n` writes are made.
    pub async fn until(&self, n: u64) {
        eventually("writes", async || self.written() >= n).await;
    }

    /// Stops writing, once the batch under way is answered; returns the
    /// writes made.
    pub async fn stop(self) -> u64 {
        // Relaxed: the task reads it between batches; joined below.
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.expect("the writer");
        // Relaxed: the writer's last store is ordered before by the join.
        self.written.load(Ordering::Relaxed)
    }
}
