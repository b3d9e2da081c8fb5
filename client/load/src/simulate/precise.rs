//! Precise mode in the simulation: every pod's cache reports its changes to
//! the index as an inference engine does, and the index applies them one
//! event at a time ([`Index::apply`]); the server's engine subscriptions
//! apply a batch at a time, which ends in the same state.
//!
//! **Tokens.** The trace names blocks by id (Mooncake: ids unique per
//! prefix). Each id here is one engine block of [`BLOCK_TOKENS`] tokens, a
//! fixed function of the id ([`tokens`]), so equal ids give equal tokens;
//! engine blocks are our blocks (`engine_block = our_block`). Gateways look
//! up the token key of those tokens ([`token_key`]: `hash_token_block` per
//! block, as the server hashes stored blocks), and the engine names each
//! block by its own hash chained over (parent, tokens) ([`chain`]), opaque
//! to the index as vLLM's are.
//!
//! **Events.** When a request's blocks enter a pod's cache, the ones that
//! were not cached are stored: each run of consecutive ones is one
//! `BlockStored` whose parent is the block before it. Each block the cache
//! evicts is one `BlockRemoved` (vLLM's GPU pool removes one block per
//! event). A [`Feeder`] applies them `delay` after the change: the engine's
//! scheduler step, its publisher and the server's subscription.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use anyhow::Context;
use prefix_index::{Applied, EngineHandle, EngineOp, EngineSpec, Index};
use prefix_proto::key::{hash_block, hash_token_block, TOKEN_BLOCK_TOKENS};

/// Tokens per engine block (and per block of the gateways' token keys):
/// vLLM's default block size, and the protocol's token block.
pub const BLOCK_TOKENS: usize = TOKEN_BLOCK_TOKENS;

/// Token ids are drawn below this: a Llama-3-sized vocabulary, so that
/// encoded events have the sizes of real ones.
const VOCABULARY: u64 = 128_256;

/// The tokens of trace block `id`: pseudo-random vocabulary ids, a fixed
/// function of `id` (two ids share all 16 with negligible probability).
pub fn tokens(id: u64) -> [u32; BLOCK_TOKENS] {
    let mut out = [0u32; BLOCK_TOKENS];
    for (j, t) in out.iter_mut().enumerate() {
        // splitmix64 of (id, position).
        let mut z = id
            .wrapping_mul(BLOCK_TOKENS as u64)
            .wrapping_add(j as u64)
            .wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // The remainder is below VOCABULARY, which fits in a u32.
        *t = (z % VOCABULARY) as u32;
    }
    out
}

/// The gateways' token key of a trace key: one `hash_token_block` per block.
pub fn token_key(key: &[u64]) -> Vec<u64> {
    key.iter()
        .map(|&id| hash_token_block(&tokens(id)))
        .collect()
}

/// The engine's hash of a block: chained over its parent's hash and its
/// tokens, as vLLM's are (any such function will do; the index never
/// computes it).
pub fn chain(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut bytes = [0u8; 8 + 4 * BLOCK_TOKENS];
    bytes[..8].copy_from_slice(&parent.unwrap_or(u64::MAX).to_le_bytes());
    for (out, t) in bytes[8..].chunks_exact_mut(4).zip(tokens) {
        out.copy_from_slice(&t.to_le_bytes());
    }
    hash_block(&bytes[..8 + 4 * tokens.len()])
}

/// The engine hashes of the trace's blocks, each computed once (ids are
/// unique per prefix, so a block's hash is a function of its id).
#[derive(Default)]
pub struct Chain {
    hashes: HashMap<u64, u64>,
}

impl Chain {
    /// The engine hashes of `key`'s blocks, into `out`.
    pub fn hashes(&mut self, key: &[u64], out: &mut Vec<u64>) {
        out.clear();
        let mut parent = None;
        for &id in key {
            let h = *self
                .hashes
                .entry(id)
                .or_insert_with(|| chain(parent, &tokens(id)));
            out.push(h);
            parent = Some(h);
        }
    }

    /// The engine hash of block `id`, if a key holding it was hashed.
    pub fn of(&self, id: u64) -> Option<u64> {
        self.hashes.get(&id).copied()
    }
}

/// One engine event, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Consecutive blocks cached, the first a child of `parent`.
    Stored {
        /// The engine hash of the block before the first.
        parent: Option<u64>,
        /// Their engine hashes.
        hashes: Vec<u64>,
        /// Their tokens, [`BLOCK_TOKENS`] per block.
        tokens: Vec<u32>,
    },
    /// One block evicted.
    Removed {
        /// Its engine hash.
        hash: u64,
    },
}

impl Event {
    /// As the index applies it.
    pub fn op(&self) -> EngineOp<'_> {
        match self {
            Event::Stored {
                parent,
                hashes,
                tokens,
            } => EngineOp::Stored {
                parent: *parent,
                hashes,
                tokens,
            },
            Event::Removed { hash } => EngineOp::Removed {
                hashes: std::slice::from_ref(hash),
            },
        }
    }
}

/// Appends to `out` the events of one cache change: `key` was used (its
/// engine hashes are `hashes`), the blocks at positions `new` entered the
/// cache and the blocks `evicted` left it.
pub fn events(
    chain: &Chain,
    key: &[u64],
    hashes: &[u64],
    new: &[usize],
    evicted: &[u64],
    out: &mut Vec<Event>,
) {
    let mut i = 0;
    while i < new.len() {
        let start = new[i];
        let mut end = start + 1;
        i += 1;
        while new.get(i) == Some(&end) {
            end += 1;
            i += 1;
        }
        out.push(Event::Stored {
            parent: start.checked_sub(1).map(|p| hashes[p]),
            hashes: hashes[start..end].to_vec(),
            tokens: key[start..end].iter().flat_map(|&id| tokens(id)).collect(),
        });
    }
    // Every cached block was hashed when it entered.
    out.extend(
        evicted
            .iter()
            .filter_map(|&id| chain.of(id))
            .map(|hash| Event::Removed { hash }),
    );
}

/// Feeds the index the events of every pod's cache, `delay_ms` after each
/// change.
pub struct Feeder {
    index: Arc<Index>,
    model: String,
    pods: Vec<(String, EngineHandle)>,
    delay_ms: u64,
    pending: VecDeque<(u64, usize, Event)>,
    chain: Chain,
    hashes: Vec<u64>,
    events: Vec<Event>,
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
        let spec = EngineSpec {
            engine_block: BLOCK_TOKENS as u32,
            our_block: BLOCK_TOKENS as u32,
            hash: hash_token_block,
        };
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
            chain: Chain::default(),
            hashes: Vec::new(),
            events: Vec::new(),
            applied: Applied::default(),
        })
    }

    /// Pod `pod`'s cache changed at `now` (see [`events`]); with no delay
    /// the index hears of it at once.
    pub fn changed(
        &mut self,
        pod: usize,
        key: &[u64],
        new: &[usize],
        evicted: &[u64],
        now: u64,
    ) -> anyhow::Result<()> {
        if !new.is_empty() {
            self.chain.hashes(key, &mut self.hashes);
        }
        self.events.clear();
        events(
            &self.chain,
            key,
            &self.hashes,
            new,
            evicted,
            &mut self.events,
        );
        let at = now.saturating_add(self.delay_ms);
        self.pending
            .extend(self.events.drain(..).map(|e| (at, pod, e)));
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
                .apply(&mut engine.lock(), name, &self.model, event.op())
                .with_context(|| format!("applying {event:?} to {name}"))?;
            self.applied.add(&done);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::cache::{Lru, Release};
    use super::*;
    use prefix_index::IndexConfig;
    use rand::rngs::SmallRng;
    use rand::{Rng, SeedableRng};

    #[test]
    fn equal_ids_give_equal_tokens_and_hashes_chain() {
        assert_eq!(tokens(7), tokens(7));
        assert_ne!(tokens(7), tokens(8));
        assert!(tokens(7).iter().all(|&t| u64::from(t) < VOCABULARY));
        assert_eq!(token_key(&[7, 8]), token_key(&[7, 8]));
        // The engine's hash depends on the parent; our key's blocks do not.
        assert_ne!(chain(None, &tokens(8)), chain(Some(1), &tokens(8)));
        let mut c = Chain::default();
        let mut h = Vec::new();
        c.hashes(&[7, 8], &mut h);
        assert_eq!(h[1], chain(Some(h[0]), &tokens(8)));
        assert_eq!(c.of(8), Some(h[1]));
    }

    #[test]
    fn new_runs_are_stored_under_the_block_before_and_evictions_removed() {
        let mut c = Chain::default();
        let key = [1, 2, 3, 4, 5];
        let mut h = Vec::new();
        c.hashes(&key, &mut h);
        let mut out = Vec::new();
        events(&c, &key, &h, &[0, 1, 3, 4], &[2], &mut out);
        let stored = |parent, from: usize, to: usize| Event::Stored {
            parent,
            hashes: h[from..to].to_vec(),
            tokens: key[from..to].iter().flat_map(|&id| tokens(id)).collect(),
        };
        assert_eq!(
            out,
            [
                stored(None, 0, 2),
                stored(Some(h[2]), 3, 5),
                Event::Removed { hash: h[1] },
            ]
        );
    }

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
        let mut caches: Vec<Lru> = (0..PODS)
            .map(|p| {
                let release = [Release::TailFirst, Release::InOrder][p % 2];
                Lru::new(6 + 5 * (p / 2), release)
            })
            .collect();
        // Keys over a small tree of prefixes: 12 conversations whose turns
        // grow, ids unique per prefix as in Mooncake.
        let mut rng = SmallRng::seed_from_u64(3);
        let mut keys: Vec<Vec<u64>> = Vec::new();
        let (mut new, mut evicted) = (Vec::new(), Vec::new());
        for step in 0..3_000u64 {
            let conv = rng.random_range(0..12u64);
            let len = rng.random_range(1..14usize);
            let key: Vec<u64> = (0..len as u64).map(|b| conv * 100 + b).collect();
            let pod = rng.random_range(0..PODS);
            caches[pod].touch(&key, &mut new, &mut evicted);
            feeder.changed(pod, &key, &new, &evicted, step).unwrap();
            keys.push(key);
            if step % 7 == 0 {
                for k in keys.iter().rev().take(40) {
                    let got = index.lookup("m", &token_key(k), None, step);
                    for (p, name) in names.iter().enumerate() {
                        let said = got.iter().find(|(n, _)| n == name).map_or(0, |m| m.1);
                        assert_eq!(
                            said as usize,
                            caches[p].hits(k),
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
        let mut cache = Lru::new(8, Release::TailFirst);
        let (mut new, mut evicted) = (Vec::new(), Vec::new());
        cache.touch(&[1, 2], &mut new, &mut evicted);
        feeder.changed(0, &[1, 2], &new, &evicted, 5_000).unwrap();
        let held = |now| index.lookup("m", &token_key(&[1, 2]), None, now);
        assert!(held(5_999).is_empty());
        feeder.deliver(6_000).unwrap();
        assert_eq!(held(6_000), [("p".to_string(), 2)]);
    }
}
