//! Seeing how far replicas differ: their statistics side by side, and the
//! share of a sample of lookups they answer differently.
//!
//! Replicas converge only as far as they see the same writes: one that was
//! down, or whose write queue overflowed, misses some. The keys looked up
//! are sampled from every replica's own content (`SampleKeys`), so a key
//! only one of them holds is looked up on all; each is looked up on every
//! replica, in batches, and the answers compared whole (pods and blocks).

use std::collections::BTreeSet;

use serde::Serialize;

use crate::client::Client;
use crate::error::ClientError;
use crate::wire::{json, Op, Reply, WireStats, MAX_SAMPLE};

/// Lookups sent in one batch.
const BATCH: usize = 256;

/// One replica's side of a comparison.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    /// The server, as named by the caller.
    pub server: String,
    /// Its index statistics.
    pub stats: serde_json::Value,
    /// Sampled lookups it answers differently from the first server.
    pub differs_from_first: u64,
}

/// A sampled key the replicas answer differently, with each one's answer.
#[derive(Debug, Clone, Serialize)]
pub struct Difference {
    /// The key's model.
    pub model: String,
    /// The key.
    pub hashes: Vec<u64>,
    /// Each server's answer, in the servers' order.
    pub answers: Vec<serde_json::Value>,
}

/// What [`compare`] found.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Each server, in the order given.
    pub servers: Vec<Side>,
    /// Distinct keys looked up on every server.
    pub sampled: u64,
    /// Of those, the keys not answered identically by all.
    pub differing: u64,
    /// `differing / sampled` (0 when nothing was sampled).
    pub share_differing: f64,
    /// Up to `examples` of the differing keys.
    pub examples: Vec<Difference>,
}

/// Compares `servers` (named clients): statistics, and about `samples` keys
/// sampled from all of them (an even share from each, `seed` deciding)
/// looked up on each. Keeps up to `examples` differing keys.
pub async fn compare(
    servers: &[(String, Client)],
    samples: u32,
    seed: u64,
    examples: usize,
) -> Result<Comparison, ClientError> {
    let mut stats: Vec<WireStats> = Vec::with_capacity(servers.len());
    for (_, c) in servers {
        stats.push(c.stats().await?);
    }
    let share = samples.div_ceil(servers.len().max(1) as u32);
    let mut keys: BTreeSet<(String, Vec<u64>)> = BTreeSet::new();
    for (i, (_, c)) in servers.iter().enumerate() {
        let mut asked = 0;
        let mut round = 0u64;
        while asked < share {
            let n = (share - asked).min(MAX_SAMPLE);
            let seed = seed ^ (i as u64) << 48 ^ round;
            let got = c.sample_keys(n, seed).await?;
            asked += n;
            round += 1;
            let empty = got.is_empty();
            keys.extend(got.into_iter().map(|k| (k.model, k.key)));
            if empty {
                break;
            }
        }
    }
    let keys: Vec<(String, Vec<u64>)> = keys.into_iter().collect();
    // answers[server][key]
    let mut answers: Vec<Vec<Reply>> = Vec::with_capacity(servers.len());
    for (_, c) in servers {
        let mut mine = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(BATCH) {
            let ops = chunk
                .iter()
                .map(|(model, key)| Op::Lookup {
                    model: model.clone(),
                    key: key.clone(),
                    candidates: None,
                })
                .collect();
            mine.extend(c.batch(ops).await?);
        }
        answers.push(mine);
    }
    let mut differs_from_first = vec![0u64; servers.len()];
    let (mut differing, mut kept) = (0u64, Vec::new());
    for (k, (model, key)) in keys.iter().enumerate() {
        let first = &answers[0][k];
        let mut same = true;
        for (s, theirs) in answers.iter().enumerate().skip(1) {
            if &theirs[k] != first {
                differs_from_first[s] += 1;
                same = false;
            }
        }
        if !same {
            differing += 1;
            if kept.len() < examples {
                kept.push(Difference {
                    model: model.clone(),
                    hashes: key.clone(),
                    answers: answers.iter().map(|a| json::reply_json(&a[k])).collect(),
                });
            }
        }
    }
    let sampled = keys.len() as u64;
    Ok(Comparison {
        servers: servers
            .iter()
            .zip(stats)
            .zip(differs_from_first)
            .map(|(((name, _), s), d)| {
                let mut stats = json::reply_json(&Reply::Stats(s));
                if let Some(fields) = stats.as_object_mut() {
                    fields.remove("ok");
                }
                Side {
                    server: name.clone(),
                    stats,
                    differs_from_first: d,
                }
            })
            .collect(),
        sampled,
        differing,
        share_differing: if sampled == 0 {
            0.0
        } else {
            differing as f64 / sampled as f64
        },
        examples: kept,
    })
}
