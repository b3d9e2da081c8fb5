//! The follower and the applier against a simulated engine and a network
//! that loses, duplicates and reorders batches, with engine restarts and
//! cache clears: once the stream settles (no replay under way, nothing in
//! flight), every lookup must match the engine's own cache exactly.
//!
//! The engine keeps every batch it sent for replay, as vLLM's buffer does
//! (up to `buffer_steps`); replies arrive in one piece. `PROPTEST_CASES`
//! sets the number of streams.

use std::collections::HashMap;

use prefix_events::{decode_batch, encode_batch, Batch, DecodeLimits, Event, Removed, Stored};
use prefix_index::{EngineHandle, EngineOp, Index, IndexConfig};
use prefix_proto::key::token_key;
use proptest::prelude::*;

use super::apply::apply_batch;
use super::Subscription;
use prefix_events::follow::{Action, Follower};

const BLOCK: usize = 16;
const PROMPTS: u32 = 4;
const LEN: usize = 6;

/// Prompt `p`: all share their first 2 blocks, prompts 2 and 3 their first 4.
fn prompt(p: u32) -> Vec<u32> {
    (0..LEN * BLOCK)
        .map(|i| {
            let owner = match (i / BLOCK, p) {
                (0..=1, _) => 0,
                (2..=3, 2..=3) => 2,
                _ => p,
            };
            owner * 1_000 + i as u32
        })
        .collect()
}

/// The engine's hashes of `tokens`, chained as vLLM's are.
fn hashes(tokens: &[u32]) -> Vec<u64> {
    engine_sim::chain_hashes(tokens, BLOCK)
}

#[derive(Debug, Clone)]
enum Op {
    /// The engine caches prompt `p` up to block `end` from `start` (clamped
    /// to the first block it lacks; earlier ones are stored again as copies).
    Store { p: u32, start: usize, end: usize },
    /// One copy less of the `pick`-th cached block.
    Evict { pick: usize },
    /// `AllBlocksCleared`.
    Clear,
    /// The engine restarts: empty cache, numbers from 0, empty buffer.
    Restart,
}

/// What the network does to a batch.
#[derive(Debug, Clone, Copy)]
enum Net {
    Deliver,
    Lose,
    Duplicate,
    /// Held back, delivered after the next batch.
    Delay,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (0..PROMPTS, 0..LEN, 1..=LEN).prop_map(|(p, start, end)| Op::Store { p, start, end }),
        4 => any::<usize>().prop_map(|pick| Op::Evict { pick }),
        1 => Just(Op::Clear),
        1 => Just(Op::Restart),
    ]
}

fn net() -> impl Strategy<Value = Net> {
    prop_oneof![
        12 => Just(Net::Deliver),
        2 => Just(Net::Lose),
        1 => Just(Net::Duplicate),
        1 => Just(Net::Delay),
    ]
}

/// The simulated engine.
#[derive(Default)]
struct Engine {
    cached: HashMap<u64, u32>,
    seq: u64,
    buffer: Vec<(u64, Vec<u8>)>,
}

impl Engine {
    fn batch(&mut self, event: Event) -> (u64, Vec<u8>) {
        let payload = encode_batch(&Batch {
            ts: 0.0,
            events: vec![event],
            data_parallel_rank: Some(0),
            unknown_events: 0,
            bad: None,
        });
        let seq = self.seq;
        self.seq += 1;
        self.buffer.push((seq, payload.clone()));
        (seq, payload)
    }

    /// Applies `op`; the batch it publishes, if any.
    fn step(&mut self, op: &Op) -> Option<(u64, Vec<u8>)> {
        match *op {
            Op::Store { p, start, end } => {
                let tokens = prompt(p);
                let hs = hashes(&tokens);
                let lacks = (0..end)
                    .find(|&j| self.cached.get(&hs[j]).is_none_or(|&c| c == 0))
                    .unwrap_or(end);
                let start = start.min(lacks);
                if start == end {
                    return None;
                }
                for h in &hs[start..end] {
                    *self.cached.entry(*h).or_default() += 1;
                }
                Some(self.batch(Event::Stored(Stored {
                    hashes: hs[start..end].to_vec(),
                    parent: start.checked_sub(1).map(|j| hs[j]),
                    tokens: tokens[start * BLOCK..end * BLOCK].to_vec(),
                    block_size: BLOCK as u32,
                    lora_name: None,
                    medium: Some("GPU".into()),
                    ..Default::default()
                })))
            }
            Op::Evict { pick } => {
                let mut held: Vec<u64> = self
                    .cached
                    .iter()
                    .filter(|(_, &c)| c > 0)
                    .map(|(&h, _)| h)
                    .collect();
                if held.is_empty() {
                    return None;
                }
                held.sort_unstable();
                let h = held[pick % held.len()];
                if let Some(c) = self.cached.get_mut(&h) {
                    *c -= 1;
                }
                Some(self.batch(Event::Removed(Removed {
                    hashes: [h].into(),
                    medium: Some("GPU".into()),
                    group: None,
                })))
            }
            Op::Clear => {
                self.cached.clear();
                Some(self.batch(Event::Cleared))
            }
            Op::Restart => {
                *self = Engine::default();
                None
            }
        }
    }

    fn matched(&self, tokens: &[u32]) -> u32 {
        hashes(tokens)
            .iter()
            .take_while(|h| self.cached.get(h).is_some_and(|&c| c > 0))
            .count() as u32
    }
}

/// The server's side: a follower, its index, and the engine it answers
/// replays from.
struct Server {
    index: Index,
    engine: EngineHandle,
    sub: Subscription,
    follower: Follower<Vec<u8>>,
}

impl Server {
    fn new() -> Server {
        let index = Index::new(IndexConfig::default());
        let spec = crate::engines::engine_spec(BLOCK as u32, BLOCK as u32);
        let sub: Subscription = "pod=e,model=m,endpoint=tcp://h:1,replay=tcp://h:2"
            .parse()
            .unwrap();
        Server {
            engine: index.engine("e", spec).unwrap(),
            index,
            sub,
            follower: Follower::new(
                true,
                prefix_events::HeldLimit {
                    batches: 1_000,
                    bytes: usize::MAX,
                },
                None,
            ),
        }
    }

    /// Carries out the follower's actions; replays are answered at once from
    /// the engine's buffer.
    fn act(&mut self, mut actions: Vec<Action<Vec<u8>>>, engine: &Engine) {
        while !actions.is_empty() {
            let mut next = Vec::new();
            for action in actions {
                match action {
                    Action::Apply { payload, .. } => {
                        let batch = decode_batch(&payload, &DecodeLimits::default()).unwrap();
                        let out = apply_batch(
                            &self.index,
                            &self.sub,
                            &self.engine,
                            &batch,
                            super::config::BlockAliases::None,
                        );
                        if out.applied.orphaned > 0 {
                            self.follower.orphaned(&mut next);
                        }
                    }
                    Action::Clear(_) => {
                        let mut e = self.engine.lock();
                        self.index
                            .apply(&mut e, "e", "m", EngineOp::Cleared)
                            .unwrap();
                    }
                    Action::Replay { from } => {
                        for (seq, payload) in engine.buffer.iter().filter(|b| b.0 >= from) {
                            self.follower.replayed(*seq, payload.clone(), &mut next);
                        }
                        self.follower.replay_ended(&mut next);
                    }
                    // Only counted, by the server.
                    Action::Gap { .. } => {}
                }
            }
            actions = next;
        }
    }

    fn live(&mut self, seq: u64, payload: Vec<u8>, engine: &Engine) {
        let mut out = Vec::new();
        self.follower.live(seq, payload, &mut out);
        self.act(out, engine);
    }

    fn connected(&mut self, engine: &Engine) {
        let mut out = Vec::new();
        self.follower.connected(&mut out);
        self.act(out, engine);
    }
}

fn run(steps: Vec<(Op, Net)>) -> Result<(), TestCaseError> {
    let mut engine = Engine::default();
    let mut server = Server::new();
    server.connected(&engine);
    let mut delayed: Option<(u64, Vec<u8>)> = None;
    for (op, net) in steps {
        if let Op::Restart = op {
            engine.step(&op);
            // What the old process had in flight went with its connection;
            // the socket reconnects to the new one.
            delayed = None;
            server.connected(&engine);
            continue;
        }
        let Some((seq, payload)) = engine.step(&op) else {
            continue;
        };
        match net {
            Net::Deliver => server.live(seq, payload, &engine),
            Net::Lose => {}
            Net::Duplicate => {
                server.live(seq, payload.clone(), &engine);
                server.live(seq, payload, &engine);
            }
            Net::Delay => {
                if let Some((s, p)) = delayed.replace((seq, payload)) {
                    server.live(s, p, &engine);
                }
                continue;
            }
        }
        if let Some((s, p)) = delayed.take() {
            server.live(s, p, &engine);
        }
        // Settled when nothing is held back and the last batch the engine
        // sent has been seen (a lost last batch is found with the next).
        let settled = !server.follower.replaying()
            && delayed.is_none()
            && server.follower.last().map(|l| l.seq + 1) == Some(engine.seq);
        if settled {
            for p in 0..PROMPTS {
                let tokens = prompt(p);
                let key = token_key(&tokens, BLOCK);
                let got = server.index.lookup("m", &key, None, 0);
                let got = got.first().map_or(0, |m| m.1);
                prop_assert_eq!(got, engine.matched(&tokens), "prompt {}", p);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
    ))]

    #[test]
    fn lookups_match_the_engine_through_loss_duplicates_reordering_and_restarts(
        steps in prop::collection::vec((op(), net()), 1..80)
    ) {
        run(steps)?;
    }
}
