//! Precise mode in the simulation: every pod's cache reports its changes to
//! the index as an inference engine does, and the index applies them one
//! event at a time ([`Index::apply`]); the server's engine subscriptions
//! apply a batch at a time, which ends in the same state.
//!
//! **Engines.** The pods are `engine_sim`'s: each trace id is one engine
//! block of [`BLOCK_TOKENS`] tokens, a fixed function of the id, so equal
//! ids give equal tokens; engine blocks are our blocks (`engine_block =
//! our_block`). Gateways look up the token key of those tokens
//! ([`token_key`]: `hash_token_block` per block, as the server hashes
//! stored blocks), and the engine names each block by its own hash chained
//! over (parent, tokens), opaque to the index as vLLM's are. Each request
//! a pod serves is one [`Step`] of events: a `BlockRemoved` per block
//! evicted, a `BlockStored` per run of blocks that entered its cache.
//!
//! **Delay.** A [`Feeder`] applies a step's events `delay` after the
//! change: the engine's scheduler step, its publisher and the server's
//! subscription.

use std::collections::VecDeque;
use std::sync::Arc;

use anyhow::Context;
use engine_sim::{block_tokens, Step, BLOCK_TOKENS};
use prefix_events::Event;
use prefix_index::{Applied, EngineHandle, EngineOp, Index};
use prefix_proto::key::hash_token_block;

/// The gateways' token key of a trace key: one `hash_token_block` per block.
pub fn token_key(key: &[u64]) -> Vec<u64> {
    key.iter()
        .map(|&id| hash_token_block(&block_tokens(id)))
        .collect()
}

/// `event` as the index applies it.
fn op(event: &Event) -> EngineOp<'_> {
    match event {
        Event::Stored(s) => EngineOp::Stored {
            parent: s.parent,
            hashes: &s.hashes,
            tokens: &s.tokens,
            seeds: &[],
            alias: prefix_index::Alias::None,
        },
        Event::Removed(r) => EngineOp::Removed { hashes: &r.hashes },
        Event::Cleared => EngineOp::Cleared,
    }
}

/// Feeds the index the events of every pod's cache, `delay_ms` after each
/// change.
pub struct Feeder {
    index: Arc<Index>,
    model: String,
    pods: Vec<(String, EngineHandle)>,
    delay_ms: u64,
    pending: VecDeque<(u64, usize, Event)>,
    /// What the index did with the events so far.
    pub applied: Applied,
}

impl Feeder {
    /// Registers `pods` as engine-fed in `index` (their gateway inserts
    /// become speculative), their blocks under `model`.
    pub fn new(
        index: Arc<Index>,
        model: &str,
        pods: &[String],
        delay_ms: u64,
    ) -> anyhow::Result<Feeder> {
        let spec = prefix_server::engine_spec(BLOCK_TOKENS as u32, BLOCK_TOKENS as u32);
        let pods = pods
            .iter()
            .map(|p| Ok((p.clone(), index.engine(p, spec)?)))
            .collect::<anyhow::Result<_>>()
            .context("registering the simulated engines")?;
        Ok(Feeder {
            index,
            model: model.into(),
            pods,
            delay_ms,
            pending: VecDeque::new(),
            applied: Applied::default(),
        })
    }

    /// A pod's cache changed at `now` by `step`; with no delay the index
    /// hears of it at once.
    pub fn changed(&mut self, step: Step, now: u64) -> anyhow::Result<()> {
        let at = now.saturating_add(self.delay_ms);
        self.pending
            .extend(step.events.into_iter().map(|e| (at, step.pod, e)));
        self.deliver(now)
    }

    /// Applies every event due by `now`, in the order they happened.
    pub fn deliver(&mut self, now: u64) -> anyhow::Result<()> {
        while self.pending.front().is_some_and(|(at, _, _)| *at <= now) {
            let Some((_, pod, event)) = self.pending.pop_front() else {
                break;
            };
            let (name, engine) = &self.pods[pod];
            let done = self
                .index
                .apply(&mut engine.lock(), name, &self.model, op(&event))
                .with_context(|| format!("applying {event:?} to {name}"))?;
            self.applied.add(&done);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use engine_sim::{Lru, Pods, Release};
    use prefix_index::IndexConfig;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    /// The heart of precise mode: with events applied at once and no
    /// gateway inserts, the index's answer for every pod and every key is
    /// what that pod's cache holds, through evictions of last blocks (pods
    /// that release tail first, as engines do) and of first and middle ones
    /// (pods that release in order), blocks stored again under cached
    /// children, and keys longer than a cache.
    #[test]
    fn the_index_follows_every_cache_exactly() {
        const PODS: usize = 4;
        let index = Arc::new(Index::new(IndexConfig::default()));
        let names: Vec<String> = (0..PODS).map(|p| format!("pod-{p}")).collect();
        let mut feeder = Feeder::new(index.clone(), "m", &names, 0).unwrap();
        let mut pods = Pods::from_caches(
            (0..PODS)
                .map(|p| {
                    let release = [Release::TailFirst, Release::InOrder][p % 2];
                    Lru::new(6 + 5 * (p / 2), release)
                })
                .collect(),
        );
        // Keys over a small tree of prefixes: 12 conversations whose turns
        // grow, ids unique per prefix as in Mooncake.
        let mut rng = SmallRng::seed_from_u64(3);
        let mut keys: Vec<Vec<u64>> = Vec::new();
        for step in 0..3_000u64 {
            let conv = rng.random_range(0..12u64);
            let len = rng.random_range(1..14usize);
            let key: Vec<u64> = (0..len as u64).map(|b| conv * 100 + b).collect();
            let pod = rng.random_range(0..PODS);
            feeder.changed(pods.serve(pod, &key), step).unwrap();
            keys.push(key);
            if step % 7 == 0 {
                for k in keys.iter().rev().take(40) {
                    let got = index.lookup("m", &token_key(k), None, step);
                    for (p, name) in names.iter().enumerate() {
                        let said = got.iter().find(|(n, _)| n == name).map_or(0, |m| m.1);
                        assert_eq!(
                            said as usize,
                            pods.hits(p, k),
                            "step {step}, {name}, key {k:?}"
                        );
                    }
                }
            }
        }
        let a = feeder.applied;
        assert!(a.removed > 1_000, "{a:?}");
        assert_eq!((a.unknown, a.orphaned, a.too_deep), (0, 0, 0), "{a:?}");
    }

    #[test]
    fn delayed_events_wait_for_their_time() {
        let index = Arc::new(Index::new(IndexConfig::default()));
        let mut feeder = Feeder::new(index.clone(), "m", &["p".into()], 1_000).unwrap();
        let mut pods = Pods::new(1, 8, Release::TailFirst);
        feeder.changed(pods.serve(0, &[1, 2]), 5_000).unwrap();
        let held = |now| index.lookup("m", &token_key(&[1, 2]), None, now);
        assert!(held(5_999).is_empty());
        feeder.deliver(6_000).unwrap();
        assert_eq!(held(6_000), [("p".to_string(), 2)]);
    }
}
