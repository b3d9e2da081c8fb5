//! Routing simulation: a trace replayed through the real index by G gateway
//! replicas routing to P pods, each pod with a simulated KV cache.
//!
//! Request i goes to gateway i mod G. The gateway scores every pod, picks the
//! best, and the request's leading blocks found in that pod's cache count as
//! hits (engines reuse only a contiguous cached prefix). Then the blocks enter
//! the pod's cache (an LRU of `capacity` blocks, `engine_sim`'s) and the gateway
//! tells its index that the pod holds the key. Policies:
//!
//! - `random`: a uniformly random pod;
//! - `least-loaded`: the pod with the least current load;
//! - `prefix-shared`: every gateway asks one shared index (approximate mode:
//!   the index learns from the gateways' inserts and forgets by its model
//!   of each pod's capacity, `capacity_model` times the real cache);
//! - `prefix-local`: each gateway asks its own index, which learns only from
//!   the requests that gateway routed (same capacity model);
//! - `precise`: one shared index fed by the pods' own cache events, as the
//!   server's engine subscriptions feed it ([`precise`]); gateways look up
//!   token keys and their inserts are speculative;
//! - `oracle`: the gateway reads every pod's cache itself.
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
//! other pods once its holder is that much busier than average. `matched`
//! is the index's answer, or for the oracle the pod's real cache.
//!
//! The index's **accuracy** is measured on the pod each request goes to: of
//! the blocks the index said that pod held, the share it held (and, as
//! recall, of the blocks it held, the share the index said).
//!
//! Time is the trace's: request times are milliseconds after [`EPOCH`], so
//! the index's TTLs, the speculative TTL and the event delay all run on it.

mod plot;
pub mod precise;
mod receipts;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use engine_sim::Pods;
use prefix_client::Client;
use prefix_index::{Index, IndexConfig};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::workload::Request;
pub use engine_sim::Release;
pub use plot::plot;
pub use receipts::{Lost, ReceiptShares, Silence, Silenced};

/// The simulation's clock at the trace's time 0, in ms: a real date, so that
/// times dated back by a TTL stay positive.
pub const EPOCH: u64 = 1_700_000_000_000;

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
    /// Longest prefix in one shared index fed by the pods' cache events.
    Precise,
    /// Longest prefix in the pods' real caches.
    Oracle,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 6] = [
        Policy::Random,
        Policy::LeastLoaded,
        Policy::PrefixShared,
        Policy::PrefixLocal,
        Policy::Precise,
        Policy::Oracle,
    ];

    /// Its name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Random => "random",
            Policy::LeastLoaded => "least-loaded",
            Policy::PrefixShared => "prefix-shared",
            Policy::PrefixLocal => "prefix-local",
            Policy::Precise => "precise",
            Policy::Oracle => "oracle",
        }
    }

    /// Whether it models pod capacities (and so runs once per capacity
    /// model).
    pub fn models_capacity(self) -> bool {
        matches!(self, Policy::PrefixShared | Policy::PrefixLocal)
    }

    /// Whether it routes on an index's answers.
    fn uses_index(self) -> bool {
        matches!(
            self,
            Policy::PrefixShared | Policy::PrefixLocal | Policy::Precise
        )
    }
}

/// The simulation's knobs.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Pods.
    pub pods: usize,
    /// Each pod's KV cache, in blocks.
    pub capacity: usize,
    /// The approximate policies' capacity model: the capacity the index is
    /// told each pod has, as a multiple of `capacity`.
    pub capacity_model: f64,
    /// Requests that define "current load".
    pub window: usize,
    /// Weight of load against match in the prefix policies.
    pub balance: f64,
    /// Seed of the random policy.
    pub seed: u64,
    /// Precise: from a change of a pod's cache to the index applying its
    /// event.
    pub event_delay: Duration,
    /// Precise: how long a gateway's insert stays visible unless the
    /// engine's events confirm it; zero: gateways do not insert.
    pub speculative_ttl: Duration,
    /// The order in which each pod's cache releases a request's blocks.
    pub release: Release,
    /// Precise: a pod whose events stop reaching the index.
    pub silence: Option<Silence>,
}

/// One (gateways, policy, capacity model) result.
#[derive(Debug, Clone, Serialize)]
pub struct SimResult {
    /// Gateway replicas.
    pub gateways: usize,
    /// Policy.
    pub policy: Policy,
    /// The index's capacity model over the real cache, for the policies
    /// that have one.
    pub capacity_model: Option<f64>,
    /// Cached blocks hit / prompt blocks.
    pub hit_ratio: f64,
    /// Most requests on one pod / mean requests per pod.
    pub imbalance: f64,
    /// Of the blocks the index said the chosen pod held, the share it held
    /// (for the policies that ask an index).
    pub accuracy: Option<f64>,
    /// Of the blocks the chosen pod held, the share the index said it held.
    pub recall: Option<f64>,
    /// What gateways' receipts would say of the index's answers for the
    /// chosen pods (for the policies that ask an index).
    pub receipts: Option<ReceiptShares>,
    /// The silenced pod's account (precise, with a silence).
    pub silenced: Option<Silenced>,
}

impl SimResult {
    /// The policy's name, with its capacity model unless that is right.
    pub fn label(&self) -> String {
        match self.capacity_model {
            Some(m) if m != 1.0 => format!("{} (capacity model {m}x)", self.policy.name()),
            _ => self.policy.name().to_string(),
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

/// Blocks the index predicted on the chosen pods, blocks those pods held,
/// and blocks both.
#[derive(Default)]
struct Accuracy {
    predicted: u64,
    held: u64,
    both: u64,
}

impl Accuracy {
    fn add(&mut self, predicted: usize, held: usize) {
        // Both are leading runs of the key: the shorter is in both.
        self.predicted += predicted as u64;
        self.held += held as u64;
        self.both += predicted.min(held) as u64;
    }

    fn accuracy(&self) -> f64 {
        // No prediction is no wrong prediction.
        match self.predicted {
            0 => 1.0,
            p => self.both as f64 / p as f64,
        }
    }

    fn recall(&self) -> f64 {
        match self.held {
            0 => 1.0,
            h => self.both as f64 / h as f64,
        }
    }
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
    let speculate = !cfg.speculative_ttl.is_zero();
    let idx = match backend {
        Backend::Embedded => Idx::Local(Arc::new(Index::new(IndexConfig {
            // The trace spans an hour; entries should leave by capacity, as
            // the simulated caches evict, not by age.
            ttl: Duration::from_secs(4 * 3600),
            max_blocks: 1 << 26,
            speculative_ttl: cfg.speculative_ttl,
            ..IndexConfig::default()
        }))),
        Backend::Remote(_) if policy == Policy::Precise => anyhow::bail!(
            "the precise policy needs the in-process index (the simulated engines' events are applied in this process)"
        ),
        Backend::Remote(c) => Idx::Remote(c.clone()),
    };
    let model = |g: usize| match policy {
        Policy::PrefixLocal => format!("sim-r{run_id}-g{g}"),
        _ => format!("sim-r{run_id}"),
    };
    let mut feeder = match (&idx, policy) {
        (Idx::Local(index), Policy::Precise) => Some(precise::Feeder::new(
            index.clone(),
            &model(0),
            &pods,
            u64::try_from(cfg.event_delay.as_millis()).unwrap_or(u64::MAX),
        )?),
        _ => None,
    };
    if policy.models_capacity() {
        let modelled = (cfg.capacity as f64 * cfg.capacity_model).round() as u64;
        for p in &pods {
            idx.set_capacity(p, modelled.max(1)).await?;
        }
    }
    let mut engines = Pods::new(cfg.pods, cfg.capacity, cfg.release);
    let mut load = vec![0usize; cfg.pods];
    let mut recent: VecDeque<usize> = VecDeque::new();
    let mut served = vec![0u64; cfg.pods];
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    let (mut hits, mut total) = (0usize, 0usize);
    let mut accuracy = Accuracy::default();
    let mut receipts = receipts::Book::default();
    let silence = cfg.silence.filter(|_| policy == Policy::Precise);
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
        let now = EPOCH + r.at_ms;
        if let Some(f) = &mut feeder {
            f.deliver(now)?;
        }
        // Engine-fed pods are matched by token keys; the others by the
        // trace's ids.
        let token_key = feeder.as_ref().map(|_| precise::token_key(&r.key));
        let key = token_key.as_deref().unwrap_or(&r.key);
        let mut matched = vec![0u32; cfg.pods];
        let pod = match policy {
            Policy::Random => rng.random_range(0..cfg.pods),
            Policy::LeastLoaded => least_loaded(&load, i),
            Policy::PrefixShared | Policy::PrefixLocal | Policy::Precise | Policy::Oracle => {
                if policy == Policy::Oracle {
                    for (p, m) in matched.iter_mut().enumerate() {
                        *m = engines.hits(p, &r.key) as u32;
                    }
                } else {
                    for (name, blocks) in idx.lookup(&model(g), key, now).await? {
                        if let Some(&p) = pod_of.get(name.as_str()) {
                            matched[p] = blocks;
                        }
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
        let held = engines.hits(pod, &r.key);
        accuracy.add(matched[pod] as usize, held);
        // What of this pod's events is lost, if it is silenced by now.
        let lost = silence
            .filter(|s| s.pod == pod && r.at_ms >= s.from_ms)
            .map(|s| s.lost);
        if policy.uses_index() {
            let local = match &idx {
                Idx::Local(i) => Some(&**i),
                Idx::Remote(_) => None,
            };
            let held = held as u32;
            let name = &pods[pod];
            receipts.add(
                local,
                &model(g),
                name,
                key,
                matched[pod],
                held,
                lost.is_some(),
                now,
            );
        }
        hits += held;
        total += r.key.len();
        match &mut feeder {
            Some(f) => {
                let mut step = engines.serve(pod, &r.key);
                // A silenced pod's cache changes; the index hears only
                // what is not lost.
                if let Some(lost) = lost {
                    step.events.retain(|e| !lost.drops(e));
                }
                f.changed(step, now)?
            }
            None => engines.touch(pod, &r.key),
        }
        served[pod] += 1;
        load[pod] += 1;
        recent.push_back(pod);
        if recent.len() > cfg.window {
            if let Some(old) = recent.pop_front() {
                load[old] -= 1;
            }
        }
        let inserts = match policy {
            Policy::Precise => speculate,
            p => p.uses_index(),
        };
        if inserts {
            idx.insert(&model(g), key, &pods[pod], now).await?;
            if i % 64 == 63 {
                idx.sweep(now);
            }
        }
    }
    let mean = served.iter().sum::<u64>() as f64 / cfg.pods as f64;
    let max = served.iter().copied().max().unwrap_or(0) as f64;
    let predicts = policy.uses_index() || policy == Policy::Oracle;
    Ok(SimResult {
        gateways,
        policy,
        capacity_model: policy.models_capacity().then_some(cfg.capacity_model),
        hit_ratio: hits as f64 / total.max(1) as f64,
        imbalance: max / mean.max(1e-9),
        accuracy: predicts.then(|| accuracy.accuracy()),
        recall: predicts.then(|| accuracy.recall()),
        receipts: receipts.shares(),
        silenced: silence.map(|_| receipts.silenced()),
    })
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

    fn config(capacity: usize) -> SimConfig {
        SimConfig {
            pods: 8,
            capacity,
            capacity_model: 1.0,
            window: 32,
            balance: 0.5,
            seed: 1,
            event_delay: Duration::ZERO,
            speculative_ttl: Duration::ZERO,
            release: Release::TailFirst,
            silence: None,
        }
    }

    /// 41 conversations of 20 turns, each turn two blocks longer than the
    /// last and `gap_ms` after it; 41 is prime to the gateway counts, so
    /// turns of one conversation reach different gateways, as round-robin
    /// does to real sessions.
    fn conversations(gap_ms: u64) -> Vec<Request> {
        let mut trace = Vec::new();
        for turn in 1..=20u64 {
            for c in 0..41u64 {
                let key: Vec<u64> = (0..turn * 2).map(|b| c * 10_000 + b).collect();
                trace.push(Request {
                    at_ms: turn * gap_ms + c,
                    key,
                    session: c,
                });
            }
        }
        trace
    }

    async fn run(trace: &[Request], g: usize, p: Policy, cfg: &SimConfig) -> SimResult {
        simulate(trace, g, p, cfg, &Backend::Embedded, 0)
            .await
            .unwrap()
    }

    /// With events applied at once and no speculation, the precise index
    /// answers what the caches hold: it routes exactly as the oracle does,
    /// through caches small enough to evict most of what they get.
    #[tokio::test]
    async fn precise_routes_as_the_oracle_when_events_are_immediate() {
        let trace = conversations(1_000);
        for capacity in [40, 100, 4096] {
            let cfg = config(capacity);
            let oracle = run(&trace, 1, Policy::Oracle, &cfg).await;
            let precise = run(&trace, 1, Policy::Precise, &cfg).await;
            assert_eq!(
                precise.hit_ratio, oracle.hit_ratio,
                "{capacity}: {precise:?} {oracle:?}"
            );
            assert_eq!(precise.imbalance, oracle.imbalance, "{capacity}");
            assert_eq!((precise.accuracy, precise.recall), (Some(1.0), Some(1.0)));
            // Immediate events confirm every speculative insert at once.
            let speculating = SimConfig {
                speculative_ttl: Duration::from_secs(2),
                ..cfg.clone()
            };
            let spec = run(&trace, 1, Policy::Precise, &speculating).await;
            assert_eq!(spec.hit_ratio, oracle.hit_ratio, "{capacity}: {spec:?}");
        }
    }

    /// With every event on time, receipts agree with every answer of the
    /// precise index; when one pod's evictions are lost, its receipts
    /// over-predict and make it suspect, and no other pod.
    #[tokio::test]
    async fn lost_evictions_make_their_pod_and_only_it_suspect() {
        let trace = conversations(1_000);
        let cfg = config(40);
        let healthy = run(&trace, 1, Policy::Precise, &cfg).await;
        let shares = healthy.receipts.unwrap();
        assert_eq!((shares.over, shares.under), (0.0, 0.0), "{shares:?}");
        assert_eq!(healthy.silenced, None);
        let lossy = SimConfig {
            silence: Some(Silence {
                pod: 2,
                from_ms: 5_000,
                lost: Lost::Evictions,
            }),
            ..cfg
        };
        let lost = run(&trace, 1, Policy::Precise, &lossy).await;
        let q = lost.silenced.unwrap();
        assert!(q.over >= 8, "{q:?}");
        assert!(q.suspect_after.is_some(), "{q:?}");
        // Found at the rule's count, if the over-predictions came in a
        // run, and before all of them.
        assert!(
            q.over_by_then.is_some_and(|n| (8..q.over).contains(&n)),
            "{q:?}"
        );
        assert_eq!(q.others_suspect, 0, "{q:?}");
        assert!(lost.receipts.unwrap().over > 0.0);
        // Other policies are not silenced.
        assert_eq!(
            run(&trace, 1, Policy::PrefixShared, &lossy).await.silenced,
            None
        );
    }

    /// Events that arrive later than the next turn leave the index behind
    /// the caches; speculative inserts bridge the gap while they last.
    #[tokio::test]
    async fn late_events_need_speculation_until_they_arrive() {
        // Turns 1 s apart; the events of a conversation come after its end.
        let trace = conversations(1_000);
        let cfg = SimConfig {
            event_delay: Duration::from_secs(100),
            ..config(4096)
        };
        let oracle = run(&trace, 1, Policy::Oracle, &cfg).await;
        let blind = run(&trace, 1, Policy::Precise, &cfg).await;
        let speculating = SimConfig {
            speculative_ttl: Duration::from_secs(2),
            ..cfg.clone()
        };
        let spec = run(&trace, 1, Policy::Precise, &speculating).await;
        assert!(
            blind.hit_ratio < 0.9 * oracle.hit_ratio,
            "{blind:?} {oracle:?}"
        );
        assert!(
            spec.hit_ratio > 0.99 * oracle.hit_ratio,
            "{spec:?} {oracle:?}"
        );
        // Speculation that ends before the events come does not bridge it.
        let short = SimConfig {
            speculative_ttl: Duration::from_millis(500),
            ..cfg
        };
        let short = run(&trace, 1, Policy::Precise, &short).await;
        assert!(short.hit_ratio < 0.9 * oracle.hit_ratio, "{short:?}");
    }

    /// A capacity model above the real cache predicts blocks that are gone;
    /// one below forgets blocks that are there.
    #[tokio::test]
    async fn a_wrong_capacity_model_shows_in_accuracy_and_recall() {
        let trace = conversations(1_000);
        let at = |m: f64| SimConfig {
            capacity_model: m,
            ..config(100)
        };
        let over = run(&trace, 1, Policy::PrefixShared, &at(4.0)).await;
        let under = run(&trace, 1, Policy::PrefixShared, &at(0.25)).await;
        assert!(over.accuracy.unwrap() < 0.95, "{over:?}");
        assert!(under.recall.unwrap() < 0.95, "{under:?}");
        assert_eq!(over.capacity_model, Some(4.0));
        assert_eq!(over.label(), "prefix-shared (capacity model 4x)");
    }

    #[test]
    fn upper_bound_counts_prefix_reuse() {
        let t = [req(&[1, 2, 3]), req(&[1, 2, 4]), req(&[5, 2])];
        // Second request hits 2 of 3; the third none (its first block is new).
        assert!((upper_bound(&t) - 2.0 / 8.0).abs() < 1e-12);
    }

    #[tokio::test]
    async fn prefix_routing_beats_random_on_shared_prefixes() {
        let trace = conversations(1_000);
        let cfg = config(4096);
        let shared = run(&trace, 4, Policy::PrefixShared, &cfg).await;
        let local = run(&trace, 4, Policy::PrefixLocal, &cfg).await;
        let random = run(&trace, 4, Policy::Random, &cfg).await;
        let bound = upper_bound(&trace);
        assert!(shared.hit_ratio <= bound + 1e-12);
        assert!(shared.hit_ratio > 0.9 * bound, "{shared:?} vs {bound}");
        assert!(shared.hit_ratio > local.hit_ratio, "{shared:?} {local:?}");
        assert!(local.hit_ratio > random.hit_ratio, "{local:?} {random:?}");
        assert!(shared.imbalance < 2.0, "{shared:?}");
    }
}
