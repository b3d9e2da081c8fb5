//! Routing simulation: a trace replayed through the real index by G gateway
//! replicas routing to P pods, each pod with a simulated KV cache.
//!
//! Request i goes to gateway i mod G. The gateway scores every pod, picks the
//! best, and the request's leading blocks found in that pod's cache count as
//! hits (engines reuse only a contiguous cached prefix). Then the blocks enter
//! the pod's cache (an LRU of `capacity` blocks) and the gateway tells its
//! index that the pod holds the key. Policies:
//!
//! - `random`: a uniformly random pod;
//! - `least-loaded`: the pod with the least current load;
//! - `prefix-shared`: every gateway asks one shared index;
//! - `prefix-local`: each gateway asks its own index, which learns only from
//!   the requests that gateway routed.
//!
//! Load is what a gateway can observe of each pod: how many of the last
//! `window` requests (from all gateways) went to it, as the queue depth that
//! endpoint pickers scrape from model servers. Prefix policies score
//!
//! ```text
//! score(p) = matched(p) / key_blocks  -  balance * load(p) / mean_load
//! ```
//!
//! and take the highest (ties: least loaded, then lowest index): a full match
//! is worth `1 / balance` times the mean load, so a hot prefix spills to
//! other pods once its holder is that much busier than average.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;

use prefix_client::Client;
use prefix_index::{Index, IndexConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::workload::Request;

/// How gateways pick pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Uniformly random.
    Random,
    /// Least current load.
    LeastLoaded,
    /// Longest prefix in one shared index, weighed against load.
    PrefixShared,
    /// Longest prefix in the gateway's own index, weighed against load.
    PrefixLocal,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 4] = [
        Policy::Random,
        Policy::LeastLoaded,
        Policy::PrefixShared,
        Policy::PrefixLocal,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Random => "random",
            Policy::LeastLoaded => "least-loaded",
            Policy::PrefixShared => "prefix-shared",
            Policy::PrefixLocal => "prefix-local",
        }
    }
}

/// The simulation's knobs.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Pods.
    pub pods: usize,
    /// Each pod's KV cache, in blocks.
    pub capacity: usize,
    /// Requests that define "current load".
    pub window: usize,
    /// Weight of load against match in the prefix policies.
    pub balance: f64,
    /// Seed of the random policy.
    pub seed: u64,
}

/// One (gateways, policy) result.
#[derive(Debug, Clone, Serialize)]
pub struct SimResult {
    /// Gateway replicas.
    pub gateways: usize,
    /// Policy.
    pub policy: Policy,
    /// Cached blocks hit / prompt blocks.
    pub hit_ratio: f64,
    /// Most requests on one pod / mean requests per pod.
    pub imbalance: f64,
}

/// A pod's simulated KV cache: LRU over blocks, identified by their prefix
/// position (Mooncake ids are already unique per prefix).
struct Lru {
    capacity: usize,
    tick: u64,
    last: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
}

impl Lru {
    fn new(capacity: usize) -> Lru {
        Lru {
            capacity,
            tick: 0,
            last: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Leading blocks of `key` present.
    fn hits(&self, key: &[u64]) -> usize {
        key.iter().take_while(|b| self.last.contains_key(b)).count()
    }

    /// Uses every block of `key` now, evicting the least recently used past
    /// capacity.
    fn touch(&mut self, key: &[u64]) {
        for &b in key {
            self.tick += 1;
            self.last.insert(b, self.tick);
            self.order.push_back((b, self.tick));
        }
        while self.last.len() > self.capacity {
            let Some((b, t)) = self.order.pop_front() else {
                break;
            };
            // Stale queue entries (the block was used again later) are skipped.
            if self.last.get(&b) == Some(&t) {
                self.last.remove(&b);
            }
        }
        // Keep the queue from growing without bound on hot blocks.
        if self.order.len() > 4 * self.capacity.max(1024) {
            let last = &self.last;
            self.order.retain(|(b, t)| last.get(b) == Some(t));
        }
    }
}

/// The index gateways query: in this process, or a remote server.
#[derive(Clone)]
pub enum Backend {
    /// A fresh in-process index per run (time is the trace's).
    Embedded,
    /// A server; runs are kept apart by model and pod names.
    Remote(Client),
}

enum Idx {
    Local(Arc<Index>),
    Remote(Client),
}

impl Idx {
    async fn lookup(
        &self,
        model: &str,
        key: &[u64],
        now: u64,
    ) -> anyhow::Result<Vec<(String, u32)>> {
        Ok(match self {
            Idx::Local(i) => i.lookup(model, key, None, now),
            Idx::Remote(c) => c
                .lookup(model, key, None)
                .await?
                .matches
                .into_iter()
                .map(|m| (m.pod.into(), m.blocks))
                .collect(),
        })
    }

    async fn insert(&self, model: &str, key: &[u64], pod: &str, now: u64) -> anyhow::Result<()> {
        match self {
            Idx::Local(i) => i.insert(model, key, pod, now)?,
            Idx::Remote(c) => c.insert(model, key, pod).await?,
        }
        Ok(())
    }

    async fn set_capacity(&self, pod: &str, blocks: u64) -> anyhow::Result<()> {
        match self {
            Idx::Local(i) => i.set_pod_capacity(pod, blocks)?,
            Idx::Remote(c) => c.set_pod_capacity(pod, blocks).await?,
        }
        Ok(())
    }

    fn sweep(&self, now: u64) {
        if let Idx::Local(i) = self {
            i.sweep(now, usize::MAX);
        }
    }
}

/// Share of blocks an unbounded single cache would have hit: the trace's
/// upper bound.
pub fn upper_bound(trace: &[Request]) -> f64 {
    let mut seen = HashSet::new();
    let (mut hits, mut total) = (0usize, 0usize);
    for r in trace {
        hits += r.key.iter().take_while(|b| seen.contains(*b)).count();
        total += r.key.len();
        seen.extend(r.key.iter().copied());
    }
    hits as f64 / total.max(1) as f64
}

/// Replays `trace` with `gateways` gateways under `policy`.
pub async fn simulate(
    trace: &[Request],
    gateways: usize,
    policy: Policy,
    cfg: &SimConfig,
    backend: &Backend,
    run_id: usize,
) -> anyhow::Result<SimResult> {
    let pods: Vec<String> = (0..cfg.pods)
        .map(|p| format!("r{run_id}-pod-{p:03}"))
        .collect();
    let pod_of: HashMap<&str, usize> = pods
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), i))
        .collect();
    let idx = match backend {
        Backend::Embedded => Idx::Local(Arc::new(Index::new(IndexConfig {
            // The trace spans an hour; entries should leave by capacity, as
            // the simulated caches evict, not by age.
            ttl: std::time::Duration::from_secs(4 * 3600),
            max_blocks: 1 << 26,
            ..IndexConfig::default()
        }))),
        Backend::Remote(c) => Idx::Remote(c.clone()),
    };
    for p in &pods {
        idx.set_capacity(p, cfg.capacity as u64).await?;
    }
    let model = |g: usize| match policy {
        Policy::PrefixLocal => format!("sim-r{run_id}-g{g}"),
        _ => format!("sim-r{run_id}"),
    };
    let mut caches: Vec<Lru> = (0..cfg.pods).map(|_| Lru::new(cfg.capacity)).collect();
    let mut load = vec![0usize; cfg.pods];
    let mut recent: VecDeque<usize> = VecDeque::new();
    let mut served = vec![0u64; cfg.pods];
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    let (mut hits, mut total) = (0usize, 0usize);
    let mean_load = (cfg.window as f64 / cfg.pods as f64).max(1e-9);
    // Ties go round-robin (by request number), not always to pod 0.
    let least_loaded = |load: &[usize], i: usize| {
        let n = load.len();
        (0..n)
            .min_by_key(|&p| (load[p], (p + n - i % n) % n))
            .unwrap_or(0)
    };
    for (i, r) in trace.iter().enumerate() {
        let g = i % gateways.max(1);
        let now = r.at_ms;
        let pod = match policy {
            Policy::Random => rng.random_range(0..cfg.pods),
            Policy::LeastLoaded => least_loaded(&load, i),
            Policy::PrefixShared | Policy::PrefixLocal => {
                let mut matched = vec![0u32; cfg.pods];
                for (name, blocks) in idx.lookup(&model(g), &r.key, now).await? {
                    if let Some(&p) = pod_of.get(name.as_str()) {
                        matched[p] = blocks;
                    }
                }
                let n = r.key.len().max(1) as f64;
                let score =
                    |p: usize| matched[p] as f64 / n - cfg.balance * load[p] as f64 / mean_load;
                (0..cfg.pods)
                    .max_by(|&a, &b| {
                        score(a)
                            .total_cmp(&score(b))
                            .then(load[b].cmp(&load[a]))
                            .then(b.cmp(&a))
                    })
                    .unwrap_or(0)
            }
        };
        hits += caches[pod].hits(&r.key);
        total += r.key.len();
        caches[pod].touch(&r.key);
        served[pod] += 1;
        load[pod] += 1;
        recent.push_back(pod);
        if recent.len() > cfg.window {
            if let Some(old) = recent.pop_front() {
                load[old] -= 1;
            }
        }
        if matches!(policy, Policy::PrefixShared | Policy::PrefixLocal) {
            idx.insert(&model(g), &r.key, &pods[pod], now).await?;
            if i % 64 == 63 {
                idx.sweep(now);
            }
        }
    }
    let mean = served.iter().sum::<u64>() as f64 / cfg.pods as f64;
    let max = served.iter().copied().max().unwrap_or(0) as f64;
    Ok(SimResult {
        gateways,
        policy,
        hit_ratio: hits as f64 / total.max(1) as f64,
        imbalance: max / mean.max(1e-9),
    })
}

/// Draws hit ratio against gateways, one line per policy, with the upper
/// bound, as SVG.
pub fn plot(results: &[SimResult], bound: f64, path: &std::path::Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let max_g = results.iter().map(|r| r.gateways).max().unwrap_or(8) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Block hit ratio vs gateway replicas (Mooncake trace)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0.5f64..max_g + 0.5, 0f64..(bound * 1.15).max(0.05))?;
    chart
        .configure_mesh()
        .x_desc("gateway replicas")
        .y_desc("block hit ratio")
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            [(0.5, bound), (max_g + 0.5, bound)],
            BLACK.stroke_width(1),
        ))?
        .label("upper bound (one unbounded cache)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLACK));
    let colors = [RED, BLUE, GREEN, MAGENTA];
    for (policy, color) in Policy::ALL.iter().zip(colors) {
        let pts: Vec<(f64, f64)> = results
            .iter()
            .filter(|r| r.policy == *policy)
            .map(|r| (r.gateways as f64, r.hit_ratio))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(policy.name())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        chart.draw_series(pts.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(key: &[u64]) -> Request {
        Request {
            at_ms: 0,
            key: key.to_vec(),
            session: 0,
        }
    }

    #[test]
    fn lru_counts_leading_hits_and_evicts_oldest() {
        let mut c = Lru::new(3);
        c.touch(&[1, 2]);
        assert_eq!(c.hits(&[1, 2, 3]), 2);
        assert_eq!(c.hits(&[2, 1]), 2);
        assert_eq!(c.hits(&[5, 1]), 0);
        c.touch(&[1, 9, 8]); // 2 is now the oldest and goes
        assert_eq!(c.hits(&[2]), 0);
        assert_eq!(c.hits(&[1, 9, 8]), 3);
    }

    #[test]
    fn upper_bound_counts_prefix_reuse() {
        let t = [req(&[1, 2, 3]), req(&[1, 2, 4]), req(&[5, 2])];
        // Second request hits 2 of 3; the third none (its first block is new).
        assert!((upper_bound(&t) - 2.0 / 8.0).abs() < 1e-12);
    }

    #[tokio::test]
    async fn prefix_routing_beats_random_on_shared_prefixes() {
        // 41 conversations of 20 turns, each turn extending the last; 41 is
        // prime to the gateway count, so turns of one conversation reach
        // different gateways, as round-robin does to real sessions.
        let mut trace = Vec::new();
        for turn in 1..=20u64 {
            for c in 0..41u64 {
                let key: Vec<u64> = (0..turn * 2).map(|b| c * 10_000 + b).collect();
                trace.push(Request {
                    at_ms: turn * 1000 + c,
                    key,
                    session: c,
                });
            }
        }
        let cfg = SimConfig {
            pods: 8,
            capacity: 4096,
            window: 32,
            balance: 0.5,
            seed: 1,
        };
        let run = |g, p| {
            let (trace, cfg) = (&trace, &cfg);
            async move {
                simulate(trace, g, p, cfg, &Backend::Embedded, 0)
                    .await
                    .unwrap()
            }
        };
        let shared = run(4, Policy::PrefixShared).await;
        let local = run(4, Policy::PrefixLocal).await;
        let random = run(4, Policy::Random).await;
        let bound = upper_bound(&trace);
        assert!(shared.hit_ratio <= bound + 1e-12);
        assert!(shared.hit_ratio > 0.9 * bound, "{shared:?} vs {bound}");
        assert!(shared.hit_ratio > local.hit_ratio, "{shared:?} {local:?}");
        assert!(local.hit_ratio > random.hit_ratio, "{local:?} {random:?}");
        assert!(shared.imbalance < 2.0, "{shared:?}");
    }
}
