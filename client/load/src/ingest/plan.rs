//! The events of a run: the trace through N engines' caches, encoded.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use engine_sim::Pods;
use prefix_events::encode::Layout;

use super::IngestConfig;
use crate::workload::Request;

/// Every engine's encoded batches and what they hold.
pub(super) struct Plan {
    pub(super) batches: Vec<Arc<Vec<Vec<u8>>>>,
    /// Time spent encoding them.
    pub(super) encoding: Duration,
    pub(super) events: u64,
    pub(super) stored: u64,
    pub(super) removed: u64,
    pub(super) bytes: u64,
    /// A sample of engines' last requests, to look up after the run.
    pub(super) checks: Vec<Check>,
}

/// An engine's last request and how much of it its cache holds at the end.
#[derive(Debug, Clone)]
pub(super) struct Check {
    pub(super) engine: usize,
    pub(super) tokens: Vec<u32>,
    /// Leading blocks of it the engine's cache holds.
    pub(super) blocks: usize,
}

/// Engines sampled for [`Check`]s, at most.
const CHECKED: usize = 32;

/// Block ids of round `r` are the trace's plus `r << ROUND_SHIFT` (Mooncake
/// ids are far below 2^40).
const ROUND_SHIFT: u32 = 40;

/// Turns the trace into each engine's batches, encoded with vLLM's
/// required fields.
pub(super) fn plan(trace: &[Request], cfg: &IngestConfig) -> Plan {
    let n = cfg.engines.max(1);
    let mut pods = Pods::new(n, cfg.capacity, cfg.release);
    let mut batches: Vec<Vec<Vec<u8>>> = vec![Vec::new(); n];
    let mut key = Vec::new();
    let mut last: Vec<Vec<u64>> = vec![Vec::new(); n];
    let (mut stored, mut removed, mut count, mut bytes) = (0, 0, 0, 0);
    let mut encoding = Duration::ZERO;
    let ts = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    for round in 0..cfg.rounds.max(1) {
        for (i, r) in trace.iter().enumerate() {
            let e = (round * trace.len() + i) % n;
            key.clear();
            key.extend(r.key.iter().map(|id| id + ((round as u64) << ROUND_SHIFT)));
            let step = pods.serve(e, &key);
            last[e].clone_from(&key);
            if step.events.is_empty() {
                continue;
            }
            stored += step.stored_blocks();
            removed += step.removed_blocks();
            count += step.events.len() as u64;
            let mut payload = Vec::new();
            let t = Instant::now();
            step.encode(ts, Layout::Required, &mut payload);
            encoding += t.elapsed();
            bytes += payload.len() as u64;
            batches[e].push(payload);
        }
    }
    let checks = (0..n)
        .step_by(n.div_ceil(CHECKED).max(1))
        .filter(|&e| !last[e].is_empty())
        .map(|e| Check {
            engine: e,
            tokens: engine_sim::request_tokens(&last[e]),
            blocks: pods.hits(e, &last[e]),
        })
        .collect();
    Plan {
        checks,
        batches: batches.into_iter().map(Arc::new).collect(),
        encoding,
        events: count,
        stored,
        removed,
        bytes,
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::simulate::Release;
    use prefix_events::{decode_batch, DecodeLimits};

    /// 30 conversations of 6 turns, two blocks more each turn.
    pub(in crate::ingest) fn trace() -> Vec<Request> {
        (1..=6u64)
            .flat_map(|turn| {
                (0..30u64).map(move |c| Request {
                    at_ms: turn * 1000 + c,
                    key: (0..turn * 2).map(|b| c * 1_000 + b).collect(),
                    session: c,
                })
            })
            .collect()
    }

    #[test]
    fn the_plan_stores_each_round_afresh_and_removes_what_caches_evict() {
        let cfg = IngestConfig {
            engines: 3,
            capacity: 20,
            rounds: 2,
            timeout: Duration::from_secs(1),
            release: Release::TailFirst,
            publisher_processes: 1,
            subscribe_batch: 1,
            trace: Default::default(),
        };
        let p = plan(&trace(), &cfg);
        assert_eq!(p.batches.len(), 3);
        assert!(
            p.removed > 0 && p.removed < p.stored,
            "{} {}",
            p.stored,
            p.removed
        );
        // Every batch decodes; its stores and removals add up to the plan's.
        let (mut stored, mut removed) = (0, 0);
        for b in p.batches.iter().flat_map(|b| b.iter()) {
            for e in decode_batch(b, &DecodeLimits::default()).unwrap().events {
                match e {
                    prefix_events::Event::Stored(s) => stored += s.hashes.len() as u64,
                    prefix_events::Event::Removed(r) => removed += r.hashes.len() as u64,
                    prefix_events::Event::Cleared => unreachable!(),
                }
            }
        }
        assert_eq!((stored, removed), (p.stored, p.removed));
        let one = plan(&trace(), &IngestConfig { rounds: 1, ..cfg });
        assert!(
            p.stored >= 2 * one.stored - 20 * 3,
            "{} {}",
            p.stored,
            one.stored
        );
    }
}
