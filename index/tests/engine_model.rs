//! The precise mode against a naive model: random engine event streams per
//! pod (stores with shared prefixes and repeated copies, removals tail first
//! and out of order, unknown removals, clears) mixed with gateway inserts
//! (speculative for engine-fed pods), sweeps and lookups; batches of
//! tail-first removals (which the index holds and releases as one run)
//! followed by a store in the same batch. Every lookup must
//! agree exactly with the model, which keeps each pod's cached blocks as a
//! plain map of copy counts and recomputes matches block by block.
//!
//! Engine blocks of 4 tokens (one of ours) and of 8 (two of ours) are
//! tested; `PROPTEST_CASES` sets the number of streams.

use std::collections::HashMap;
use std::time::Duration;

use engine_sim::chain_hashes;
use prefix_index::{EngineHandle, EngineOp, EngineSpec, Index, IndexConfig};
use proptest::prelude::*;

const OURS: u32 = 4;
const SPEC_TTL: u64 = 2_000;
const TTL: u64 = 60_000;
const PROMPTS: u32 = 4;
/// Our blocks per prompt.
const LEN: u32 = 8;
const ENGINE_PODS: [&str; 2] = ["e0", "e1"];
const PLAIN: &str = "g";

fn hash(tokens: &[u32]) -> u64 {
    xxhash_rust_like(tokens, 0)
}

fn xxhash_rust_like(tokens: &[u32], seed: u64) -> u64 {
    let mut h = seed ^ 0xcbf2_9ce4_8422_2325;
    for &t in tokens {
        h = (h ^ u64::from(t)).wrapping_mul(0x100_0000_01b3);
        h ^= h >> 29;
    }
    h
}

/// Prompt `p`'s tokens: all prompts share their first 2 blocks, prompts 2
/// and 3 their first 5.
fn tokens(p: u32) -> Vec<u32> {
    (0..LEN)
        .flat_map(|i| {
            let owner = match (i, p) {
                (0..=1, _) => 0,
                (2..=4, 2..=3) => 2,
                _ => p,
            };
            [owner, i, 7, 7]
        })
        .collect()
}

fn our_key(p: u32) -> Vec<u64> {
    tokens(p).chunks(OURS as usize).map(hash).collect()
}

/// Engine hashes of prompt `p` with engine blocks of `eb` tokens.
fn engine_hashes(p: u32, eb: u32) -> Vec<u64> {
    chain_hashes(&tokens(p), eb as usize)
}

#[derive(Debug, Clone)]
enum Op {
    /// Engine-fed pod stores prompt `p` up to engine block `end`, starting
    /// at `start` (clamped to the first block it lacks: engines compute
    /// only past what they hold, and may store held blocks again).
    Store {
        pod: usize,
        p: u32,
        start: u32,
        end: u32,
    },
    /// One copy less of the `pick`-th held block (any position).
    Remove {
        pod: usize,
        pick: usize,
    },
    /// One batch: one copy less of each of the `n` deepest held blocks of
    /// prompt `p`, deepest first (as an engine frees a sequence), in an
    /// event each or in one event (`one_event`); then, if `store` says so,
    /// a store of prompt `store` up to its engine block `end`.
    RemoveTail {
        pod: usize,
        p: u32,
        n: usize,
        one_event: bool,
        store: Option<(u32, u32)>,
    },
    /// A hash the engine never stored.
    RemoveUnknown {
        pod: usize,
    },
    Clear {
        pod: usize,
    },
    /// A gateway insert of prompt `p` cut to `len` blocks; pod 2 is plain.
    Insert {
        pod: usize,
        p: u32,
        len: u32,
    },
    Wait {
        ms: u64,
    },
    Sweep,
    Lookup {
        p: u32,
        len: u32,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..2usize, 0..PROMPTS, 0..16u32, 1..=16u32)
            .prop_map(|(pod, p, start, end)| Op::Store { pod, p, start, end }),
        3 => (0..2usize, any::<usize>()).prop_map(|(pod, pick)| Op::Remove { pod, pick }),
        3 => (0..2usize, 0..PROMPTS, 1..8usize, any::<bool>(), prop::option::of((0..PROMPTS, 1..=16u32)))
            .prop_map(|(pod, p, n, one_event, store)| Op::RemoveTail { pod, p, n, one_event, store }),
        1 => (0..2usize).prop_map(|pod| Op::RemoveUnknown { pod }),
        1 => (0..2usize).prop_map(|pod| Op::Clear { pod }),
        3 => (0..3usize, 0..PROMPTS, 1..=LEN).prop_map(|(pod, p, len)| Op::Insert { pod, p, len }),
        2 => (0..1_500u64).prop_map(|ms| Op::Wait { ms }),
        1 => Just(Op::Sweep),
        5 => (0..PROMPTS, 1..=LEN).prop_map(|(p, len)| Op::Lookup { p, len }),
    ]
}

/// What an engine stores of prompt `p` up to its engine block `end`: from
/// `start`, clamped to the first block the pod lacks (engines compute only
/// past what they hold, and may store held blocks again).
struct Store {
    hashes: Vec<u64>,
    tokens: Vec<u32>,
    range: std::ops::Range<usize>,
    eb: usize,
}

impl Store {
    /// `None` when the pod holds every block up to `end`.
    fn new(pod: &Pod, eb: u32, p: u32, start: usize, end: u32) -> Option<Store> {
        let end = end.min(LEN * OURS / eb) as usize;
        let hashes = engine_hashes(p, eb);
        let lacks = (0..end)
            .find(|&j| pod.copies.get(&hashes[j]).is_none_or(|&c| c == 0))
            .unwrap_or(end);
        let start = start.min(lacks);
        (start < end).then(|| Store {
            hashes,
            tokens: tokens(p),
            range: start..end,
            eb: eb as usize,
        })
    }

    fn op(&self) -> EngineOp<'_> {
        let (start, end) = (self.range.start, self.range.end);
        EngineOp::Stored {
            parent: start.checked_sub(1).map(|j| self.hashes[j]),
            hashes: &self.hashes[start..end],
            tokens: &self.tokens[start * self.eb..end * self.eb],
            seeds: &[],
            alias: prefix_index::Alias::None,
        }
    }

    /// The model after the engine applied it.
    fn done(&self, pod: &mut Pod) {
        for &h in &self.hashes[self.range.clone()] {
            *pod.copies.entry(h).or_default() += 1;
        }
    }
}

/// One engine-fed pod as the model sees it.
#[derive(Default)]
struct Pod {
    /// Engine hash → copies.
    copies: HashMap<u64, u32>,
    /// Our-key prefix → last gateway insert covering it (speculative).
    speculative: HashMap<Vec<u64>, u64>,
}

struct Model {
    eb: u32,
    pods: [Pod; 2],
    /// The plain pod's inserts: our-key prefix → last insert time.
    plain: HashMap<Vec<u64>, u64>,
}

impl Model {
    /// Our block `i` is in engine block `i * OURS / eb` (`eb` is a
    /// multiple of ours).
    fn engine_block_of(&self, i: u32) -> usize {
        (i * OURS / self.eb) as usize
    }

    fn lookup(&self, p: u32, len: u32, now: u64) -> Vec<(String, u32)> {
        let key = our_key(p);
        let hashes = engine_hashes(p, self.eb);
        let mut out = Vec::new();
        for (n, pod) in self.pods.iter().enumerate() {
            let visible = |i: u32| {
                let held = pod
                    .copies
                    .get(&hashes[self.engine_block_of(i)])
                    .is_some_and(|&c| c > 0);
                let spec = pod
                    .speculative
                    .get(&key[..=i as usize])
                    .is_some_and(|&t| now.saturating_sub(t) <= SPEC_TTL);
                held || spec
            };
            // An engine reuses whole engine blocks only.
            let m = (0..len).take_while(|&i| visible(i)).count() as u32;
            let m = m - m % (self.eb / OURS);
            if m > 0 {
                out.push((ENGINE_PODS[n].to_string(), m));
            }
        }
        let m = (0..len)
            .take_while(|&i| {
                self.plain
                    .get(&key[..=i as usize])
                    .is_some_and(|&t| now.saturating_sub(t) <= TTL)
            })
            .count() as u32;
        if m > 0 {
            out.push((PLAIN.to_string(), m));
        }
        out.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        out
    }

    /// Drops the speculation on the last of our blocks of engine block `h`
    /// (in any prompt): the index takes the pod off that node whole, and
    /// only that one (the others may be a sibling engine block's too).
    fn release(&mut self, pod: usize, h: u64) {
        for p in 0..PROMPTS {
            let hashes = engine_hashes(p, self.eb);
            let key = our_key(p);
            if let Some(j) = hashes.iter().position(|&x| x == h) {
                let per = (self.eb / OURS) as usize;
                self.pods[pod].speculative.remove(&key[..(j + 1) * per]);
            }
        }
    }
}

fn run(eb: u32, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let index = Index::new(IndexConfig {
        ttl: Duration::from_millis(TTL),
        speculative_ttl: Duration::from_millis(SPEC_TTL),
        ..IndexConfig::default()
    });
    let spec = EngineSpec {
        engine_block: eb,
        our_block: OURS,
        hash: xxhash_rust_like,
    };
    let engines: Vec<EngineHandle> = ENGINE_PODS
        .iter()
        .map(|p| index.engine(p, spec).unwrap())
        .collect();
    let mut model = Model {
        eb,
        pods: [Pod::default(), Pod::default()],
        plain: HashMap::new(),
    };
    let mut now = 1_700_000_000_000u64;
    for op in ops {
        match op {
            Op::Store { pod, p, start, end } => {
                let Some(st) = Store::new(&model.pods[pod], eb, p, start as usize, end) else {
                    continue;
                };
                let got = index
                    .apply(&mut engines[pod].lock(), ENGINE_PODS[pod], "m", st.op())
                    .unwrap();
                prop_assert_eq!(got.orphaned, 0);
                st.done(&mut model.pods[pod]);
            }
            Op::Remove { pod, pick } => {
                let mut held: Vec<u64> = model.pods[pod]
                    .copies
                    .iter()
                    .filter(|(_, &c)| c > 0)
                    .map(|(&h, _)| h)
                    .collect();
                if held.is_empty() {
                    continue;
                }
                held.sort_unstable();
                let h = held[pick % held.len()];
                let op = EngineOp::Removed { hashes: &[h] };
                let got = index
                    .apply(&mut engines[pod].lock(), ENGINE_PODS[pod], "m", op)
                    .unwrap();
                prop_assert_eq!((got.removed, got.unknown), (1, 0));
                let c = model.pods[pod].copies.get_mut(&h).unwrap();
                *c -= 1;
                if *c == 0 {
                    model.release(pod, h);
                }
            }
            Op::RemoveTail {
                pod,
                p,
                n,
                one_event,
                store,
            } => {
                let hashes = engine_hashes(p, eb);
                let tail: Vec<u64> = hashes
                    .iter()
                    .rev()
                    .copied()
                    .filter(|h| model.pods[pod].copies.get(h).is_some_and(|&c| c > 0))
                    .take(n)
                    .collect();
                let mut engine = engines[pod].lock();
                let mut batch = index.batch(&mut engine, ENGINE_PODS[pod]);
                let events: Vec<&[u64]> = match one_event {
                    true => vec![&tail[..]],
                    false => tail.chunks(1).collect(),
                };
                for hs in events {
                    let got = batch.apply("m", EngineOp::Removed { hashes: hs }).unwrap();
                    prop_assert_eq!((got.removed, got.unknown), (hs.len() as u64, 0));
                }
                for &h in &tail {
                    let c = model.pods[pod].copies.get_mut(&h).unwrap();
                    *c -= 1;
                    if *c == 0 {
                        model.release(pod, h);
                    }
                }
                if let Some((q, end)) = store {
                    if let Some(st) = Store::new(&model.pods[pod], eb, q, 0, end) {
                        prop_assert_eq!(batch.apply("m", st.op()).unwrap().orphaned, 0);
                        st.done(&mut model.pods[pod]);
                    }
                }
                batch.finish().unwrap();
            }
            Op::RemoveUnknown { pod } => {
                let op = EngineOp::Removed { hashes: &[42] };
                let got = index
                    .apply(&mut engines[pod].lock(), ENGINE_PODS[pod], "m", op)
                    .unwrap();
                prop_assert_eq!((got.removed, got.unknown), (0, 1));
            }
            Op::Clear { pod } => {
                index
                    .apply(
                        &mut engines[pod].lock(),
                        ENGINE_PODS[pod],
                        "m",
                        EngineOp::Cleared,
                    )
                    .unwrap();
                model.pods[pod] = Pod::default();
            }
            Op::Insert { pod, p, len } => {
                let key = our_key(p);
                let name = [ENGINE_PODS[0], ENGINE_PODS[1], PLAIN][pod];
                index.insert("m", &key[..len as usize], name, now).unwrap();
                let into = match pod {
                    2 => &mut model.plain,
                    n => &mut model.pods[n].speculative,
                };
                for i in 1..=len as usize {
                    into.insert(key[..i].to_vec(), now);
                }
            }
            Op::Wait { ms } => now += ms,
            Op::Sweep => {
                index.sweep(now, usize::MAX);
            }
            Op::Lookup { p, len } => {
                let key = our_key(p);
                let got = index.lookup("m", &key[..len as usize], None, now);
                prop_assert_eq!(got, model.lookup(p, len, now), "prompt {} len {}", p, len);
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(
        std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
    ))]

    #[test]
    fn engine_blocks_of_our_size(ops in prop::collection::vec(op(), 1..120)) {
        run(4, ops)?;
    }

    #[test]
    fn engine_blocks_of_twice_our_size(ops in prop::collection::vec(op(), 1..120)) {
        run(8, ops)?;
    }
}
