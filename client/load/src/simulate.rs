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
/// bound, as SVG: ticks at the simulated gateway counts, and the legend in
/// a band above the bound, where no line goes.
pub fn plot(results: &[SimResult], bound: f64, path: &std::path::Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut counts: Vec<usize> = results.iter().map(|r| r.gateways).collect();
    counts.sort_unstable();
    counts.dedup();
    let max_g = counts.last().copied().unwrap_or(8) as f64;
    // Every line is at or under the bound; the top 40% of the height holds
    // the legend (five entries) clear of them.
    let top = (bound / 0.6).max(0.05);
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Block hit ratio vs gateway replicas (Mooncake trace)",
            ("sans-serif", 18),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0.5f64..max_g + 0.5, 0f64..top)?;
    // The x axis gets its ticks and labels below, at the simulated counts
    // only: plotters would place them at round fractions.
    chart
        .configure_mesh()
        .x_desc("gateway replicas")
        .y_desc("block hit ratio")
        .x_labels(0)
        .disable_x_mesh()
        .draw()?;
    let font = ("sans-serif", 13).into_font().color(&BLACK);
    for &g in &counts {
        let (px, py) = chart.backend_coord(&(g as f64, 0.0));
        root.draw(&PathElement::new(vec![(px, py), (px, py + 5)], BLACK))?;
        let label = g.to_string();
        let (w, _) = root.estimate_text_size(&label, &font)?;
        root.draw(&Text::new(label, (px - w as i32 / 2, py + 8), font.clone()))?;
    }
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
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE)
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

    /// The plot's x axis is labelled at the simulated gateway counts only,
    /// and its legend box covers no line.
    #[test]
    fn the_plot_has_integer_ticks_and_a_legend_clear_of_the_lines() {
        let bound = 0.366;
        let results: Vec<SimResult> = [1usize, 2, 4, 8]
            .iter()
            .flat_map(|&gateways| {
                Policy::ALL
                    .iter()
                    .enumerate()
                    .map(move |(i, &policy)| SimResult {
                        gateways,
                        policy,
                        hit_ratio: bound * (1.0 - 0.1 * i as f64) / (1.0 + 0.01 * gateways as f64),
                        imbalance: 1.0,
                    })
            })
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sim.svg");
        plot(&results, bound, &path).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let texts: Vec<&str> = svg
            .split("<text")
            .skip(1)
            .filter_map(|t| Some(t.split('>').nth(1)?.split('<').next()?.trim()))
            .collect();
        for tick in ["1", "2", "4", "8"] {
            assert!(texts.contains(&tick), "no tick {tick} in {texts:?}");
        }
        for t in &texts {
            assert!(
                !matches!(*t, "1.0" | "1.5" | "2.5" | "3" | "5" | "6" | "7"),
                "tick {t}"
            );
        }
        // The legend box: the one rectangle with a black border.
        let legend = svg
            .split("<rect")
            .skip(1)
            .find(|r| r.contains("stroke=\"#000000\""))
            .expect("a legend box");
        let attr = |name: &str| -> f64 {
            legend
                .split(&format!(" {name}=\""))
                .nth(1)
                .and_then(|v| v.split('"').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} of {legend}"))
        };
        let (x0, y0) = (attr("x"), attr("y"));
        let (x1, y1) = (x0 + attr("width"), y0 + attr("height"));
        // Every drawn line's points lie outside the box (the legend's own
        // sample strokes are inside it, so only the data lines are checked:
        // polylines with more than two points, and the bound's line).
        for line in svg.split("<polyline").skip(1) {
            let points = line
                .split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            let pts: Vec<(f64, f64)> = points
                .split_whitespace()
                .filter_map(|p| {
                    let (x, y) = p.split_once(',')?;
                    Some((x.parse().ok()?, y.parse().ok()?))
                })
                .collect();
            let inside_legend = pts
                .iter()
                .all(|&(x, y)| x >= x0 && x <= x1 && y >= y0 && y <= y1);
            if inside_legend {
                continue; // a legend sample
            }
            for w in pts.windows(2) {
                let (ya, yb) = (w[0].1.min(w[1].1), w[0].1.max(w[1].1));
                let (xa, xb) = (w[0].0.min(w[1].0), w[0].0.max(w[1].0));
                let crosses = xa <= x1 && xb >= x0 && ya <= y1 && yb >= y0;
                assert!(
                    !crosses,
                    "a line {w:?} runs through the legend {x0},{y0}..{x1},{y1}"
                );
            }
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
