//! Where keys come from: a synthetic chat workload, or the Mooncake trace.

use std::path::Path;

use anyhow::Context;
use prefix_client::key;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use serde::Deserialize;

/// One request of a workload: its key and the session it continues (sessions
/// stick to a pod in the load test's inserts).
#[derive(Debug, Clone)]
pub struct Request {
    /// Arrival time in ms from the start (trace replay), 0 for synthetic.
    pub at_ms: u64,
    /// Block hashes.
    pub key: Vec<u64>,
    /// Session (conversation) number.
    pub session: u64,
}

/// Synthetic chat: `systems` shared system prompts, `sessions` conversations
/// that grow by one turn each time they are picked, sessions picked by a Zipf
/// law (a few hot ones, a long tail). Text keys are hashed by the client
/// library, as a gateway would.
pub struct Chat {
    rng: SmallRng,
    systems: Vec<String>,
    sessions: Vec<String>,
    pick: Zipf<f64>,
    max_bytes: usize,
}

/// Printable pseudo-text of `len` bytes.
fn text(rng: &mut SmallRng, len: usize) -> String {
    (0..len)
        .map(|_| char::from(b'a' + rng.random_range(0..26u8)))
        .collect()
}

impl Chat {
    /// A chat workload. `seed` makes it repeatable; each gateway or
    /// connection uses its own seed.
    pub fn new(seed: u64, systems: usize, sessions: usize, zipf: f64, max_blocks: usize) -> Chat {
        let mut rng = SmallRng::seed_from_u64(seed);
        // The system prompts are the same for every seed: shared prefixes.
        let mut shared = SmallRng::seed_from_u64(0x0051_57e3);
        let systems: Vec<String> = (0..systems.max(1))
            .map(|_| {
                let len = shared.random_range(1_000..4_000);
                text(&mut shared, len)
            })
            .collect();
        let sessions = (0..sessions.max(1))
            .map(|_| systems[rng.random_range(0..systems.len())].clone())
            .collect::<Vec<_>>();
        let pick = Zipf::new(sessions.len() as f64, zipf.max(0.01)).expect("valid Zipf parameters");
        Chat {
            rng,
            systems,
            sessions,
            pick,
            max_bytes: max_blocks.max(1) * key::TEXT_BLOCK_BYTES,
        }
    }

    /// The next request: a session grows by one turn (200 B to 2 KB); when it
    /// would pass the longest key, it starts over on a system prompt.
    pub fn next(&mut self) -> Request {
        let s = (self.pick.sample(&mut self.rng) as usize - 1).min(self.sessions.len() - 1);
        let turn = self.rng.random_range(200..2_000);
        if self.sessions[s].len() + turn > self.max_bytes {
            let sys = self.rng.random_range(0..self.systems.len());
            self.sessions[s] = self.systems[sys].clone();
        }
        let t = text(&mut self.rng, turn);
        self.sessions[s].push_str(&t);
        Request {
            at_ms: 0,
            key: key::text_key(&self.sessions[s], key::TEXT_BLOCK_BYTES),
            session: s as u64,
        }
    }
}

#[derive(Deserialize)]
struct TraceLine {
    timestamp: u64,
    hash_ids: Vec<u64>,
}

/// Loads a Mooncake JSON Lines trace: `timestamp` (ms) and `hash_ids` (the
/// key). Each request is its own session. A trace without a request is an
/// error: every figure of a run over it would be zero or undefined.
pub fn load_trace(path: &Path) -> anyhow::Result<Vec<Request>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let requests = text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            let t: TraceLine = serde_json::from_str(l)
                .with_context(|| format!("{}:{}: not a trace line", path.display(), i + 1))?;
            Ok(Request {
                at_ms: t.timestamp,
                key: t.hash_ids,
                session: i as u64,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(
        !requests.is_empty(),
        "{} holds no request: a trace is JSON Lines of {{\"timestamp\", \"hash_ids\", ...}}",
        path.display()
    );
    Ok(requests)
}

/// The trace shipped beside the project (`../shared/traces/`), if present.
pub fn default_trace() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces/mooncake_conversation.jsonl")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_sessions_grow_and_share_system_prompts() {
        let mut a = Chat::new(1, 4, 50, 1.1, 512);
        let mut b = Chat::new(2, 4, 50, 1.1, 512);
        let (ra, rb) = (a.next(), b.next());
        assert!(ra.key.len() >= 1_000 / 64);
        // Same system prompts for every seed: some first block is shared.
        let firsts: std::collections::HashSet<u64> = (0..200).map(|_| a.next().key[0]).collect();
        assert!(firsts.len() <= 4);
        assert!(firsts.contains(&rb.key[0]) || (0..200).any(|_| firsts.contains(&b.next().key[0])));
        // A session's next turn extends its previous key.
        let mut c = Chat::new(3, 1, 1, 1.0, 512);
        let (k1, k2) = (c.next().key, c.next().key);
        assert!(k2.len() >= k1.len() && k2[..k1.len()] == k1[..]);
    }

    #[test]
    fn the_trace_loads() {
        let path = default_trace();
        if !path.exists() {
            return;
        }
        let t = load_trace(&path).unwrap();
        assert!(t.len() > 10_000);
        assert!(t.windows(2).all(|w| w[0].at_ms <= w[1].at_ms));
        assert!(!t[0].key.is_empty());
    }
}
