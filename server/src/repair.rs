//! Replicas that repair each other in the background.
//!
//! Every `--repair-interval`, a server samples `--repair-keys` keys from
//! each peer (`SampleKeys`: root-to-leaf keys of the peer's trees), looks
//! each up there in detail (`LookupDetail`, one batch) and here, and copies
//! what the peer holds and this server lacks: for each gateway-fed pod the
//! peer holds deeper along the key, an insert of the peer's prefix for that
//! pod, written at the peer's time (`age_ms`), so that the copy expires
//! when the original does and two replicas never keep an entry alive by
//! copying it back and forth. Every server pulls from every peer, so what
//! any one of them holds reaches the others.
//!
//! What is not copied:
//! - engine-fed pods (any view but `Gateway`): each replica follows its
//!   engines itself;
//! - an entry of a pod this server removed after the peer wrote it: the
//!   peer missed the removal (`replica::removals`);
//! - entries this server holds and the peer lacks: the peer's own repair
//!   pulls them.
//!
//! A removal one replica missed is not undone by repair: its entries there
//! stay until their TTL, and the other replicas do not copy them back.
//!
//! The work is bounded per peer and round: one sample, one batch of
//! `--repair-keys` detailed lookups there and as many here, and an insert
//! per entry copied. A round comes every `--repair-interval`, or every
//! tenth of it ([`DIVERGED_SPEEDUP`]) after a round that copied something.

use std::sync::Arc;

use prefix_client::{Client, TlsConfig};
use prefix_index::Index;
use prefix_proto::{Op, PodView, Reply, SampledKey};
use tokio_util::sync::CancellationToken;

use crate::bootstrap;
use crate::clock::now_ms;
use crate::handler::Handler;
use crate::replica::config::ReplicaConfig;
use crate::replica::removals::Removals;

/// How many times more often rounds come while the last one copied
/// something: a burst one replica missed is found sooner (1,000 keys in 11
/// to 16 s at the defaults, `docs/benchmarks.md`), and the work stays
/// bounded (at most this many rounds per `--repair-interval`).
pub const DIVERGED_SPEEDUP: u32 = 10;

/// What one round with one peer found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Compared {
    /// Keys compared.
    pub keys: u64,
    /// Entries copied: (key prefix, pod) pairs the peer held deeper.
    pub copied: u64,
}

/// Copies into `index` what the peer's answers (`replies`, one `Detail`
/// per key of `keys`, asked at `asked`) hold and `index` lacks (see the
/// module's docs). An entry's age is counted from `asked`, before the
/// answer came: a copy never outlives its original. An age of 0 is not
/// known (an entry written this very millisecond, or one the peer could
/// not time): such an entry is left for a later round.
pub fn copy_missing(
    index: &Index,
    removals: &Removals,
    keys: &[SampledKey],
    replies: &[Reply],
    asked: u64,
) -> Compared {
    let mut done = Compared::default();
    let reader = index.reader();
    for (k, reply) in keys.iter().zip(replies) {
        let Reply::Detail { matches, .. } = reply else {
            continue;
        };
        done.keys += 1;
        let here = reader.lookup_detail(&k.model, &k.key, None, asked).matches;
        for theirs in matches {
            if theirs.view != PodView::Gateway || theirs.blocks == 0 || theirs.age_ms == 0 {
                continue;
            }
            let pod = theirs.pod.as_str();
            let mine = here.iter().find(|m| reader.pod_name(m.pod) == Some(pod));
            if mine.is_some_and(|m| m.view != PodView::Gateway || m.blocks >= theirs.blocks) {
                continue;
            }
            let written = asked.saturating_sub(theirs.age_ms);
            if removals.after(pod, written) {
                continue;
            }
            let blocks = (theirs.blocks as usize).min(k.key.len());
            if index
                .insert(&k.model, &k.key[..blocks], pod, written)
                .is_ok()
            {
                done.copied += 1;
            }
        }
    }
    done
}

/// Repairs this server from `peers` until shutdown (see the module's docs).
pub async fn run(
    cfg: ReplicaConfig,
    tls: TlsConfig,
    handler: Arc<Handler>,
    shutdown: CancellationToken,
) {
    let mut clients: Vec<Option<Client>> = cfg.peers.iter().map(|_| None).collect();
    let mut round = 0u64;
    let mut pause = cfg.repair_interval;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = cfg.repair_interval;
        // A filling server takes its peers' whole index instead.
        if handler.replica.is_filling() {
            continue;
        }
        round += 1;
        handler.replica.removals.prune(now_ms());
        for (i, peer) in cfg.peers.iter().enumerate() {
            let seed = round.rotate_left(17) ^ i as u64 ^ now_ms();
            let client = match &clients[i] {
                Some(c) => c.clone(),
                None => match bootstrap::connect(peer, &cfg, &tls, cfg.connect_timeout).await {
                    Ok(c) => {
                        clients[i] = Some(c.clone());
                        c
                    }
                    Err(e) => {
                        handler.metrics.repair_failures.inc();
                        tracing::debug!(%peer, error = %e, "repair: no connection to the peer");
                        continue;
                    }
                },
            };
            match with_peer(&client, &handler, cfg.repair_keys, seed).await {
                Ok(done) => {
                    handler.metrics.repair_keys.inc_by(done.keys);
                    handler.metrics.repair_copied.inc_by(done.copied);
                    if done.copied > 0 {
                        // More is likely missing where this was: the next
                        // round comes sooner.
                        pause = cfg.repair_interval / DIVERGED_SPEEDUP;
                        tracing::info!(%peer, keys = done.keys, copied = done.copied, "repair copied what the peer held and this server lacked");
                    }
                }
                Err(e) => {
                    handler.metrics.repair_failures.inc();
                    tracing::debug!(%peer, error = %e, "repair: a round with the peer failed");
                }
            }
        }
    }
    for c in clients.into_iter().flatten() {
        c.close().await;
    }
}

/// One round with one peer: `count` keys sampled there (`seed`), compared,
/// and what is missing here copied.
async fn with_peer(
    client: &Client,
    handler: &Arc<Handler>,
    count: u32,
    seed: u64,
) -> Result<Compared, prefix_client::ClientError> {
    let asked = now_ms();
    let keys = client.sample_keys(count, seed).await?;
    if keys.is_empty() {
        return Ok(Compared::default());
    }
    let ops = keys
        .iter()
        .map(|k| Op::LookupDetail {
            model: k.model.clone(),
            key: k.key.clone(),
            candidates: None,
        })
        .collect();
    let replies = client.batch(ops).await?;
    let h = handler.clone();
    let copy = move || copy_missing(&h.index, &h.replica.removals, &keys, &replies, asked);
    Ok(tokio::task::spawn_blocking(copy).await.unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prefix_index::IndexConfig;
    use prefix_proto::PodDetail;

    use super::*;

    const NOW: u64 = 1_700_000_000_000;

    fn detail(pod: &str, blocks: u32, age_ms: u64, view: PodView) -> PodDetail {
        PodDetail {
            pod: pod.into(),
            blocks,
            lower_blocks: 0,
            view,
            age_ms,
        }
    }

    fn key() -> SampledKey {
        SampledKey {
            model: "m".into(),
            key: vec![1, 2, 3, 4],
        }
    }

    fn index() -> Index {
        Index::new(IndexConfig {
            ttl: Duration::from_secs(60),
            ..IndexConfig::default()
        })
    }

    #[test]
    fn what_the_peer_holds_deeper_is_copied_at_the_peers_time() {
        let index = index();
        index.insert("m", &[1, 2], "a", NOW).unwrap();
        let reply = Reply::Detail {
            key_blocks: 4,
            matches: vec![
                detail("a", 4, 10_000, PodView::Gateway),
                detail("b", 1, 1, PodView::Gateway),
                detail("engine", 4, 0, PodView::Exact),
                // Of an age not known: left for a later round.
                detail("unknown", 4, 0, PodView::Gateway),
            ],
        };
        let done = copy_missing(&index, &Removals::default(), &[key()], &[reply], NOW);
        assert_eq!(done, Compared { keys: 1, copied: 2 });
        let mut found = index.lookup("m", &[1, 2, 3, 4], None, NOW);
        found.sort();
        assert_eq!(found, [("a".to_string(), 4), ("b".to_string(), 1)]);
        // Written 10 s before: it expires 50 s from now, with the peer's
        // (the first two blocks, written here at NOW, live on).
        let later = NOW + 50_001;
        assert_eq!(
            index.lookup("m", &[1, 2, 3, 4], None, later),
            [("a".to_string(), 2), ("b".to_string(), 1)]
        );
    }

    #[test]
    fn an_entry_written_before_a_removal_here_is_not_copied_back() {
        let index = index();
        let removals = Removals::default();
        removals.record("a", NOW - 1_000);
        let reply = |age_ms| Reply::Detail {
            key_blocks: 4,
            matches: vec![detail("a", 4, age_ms, PodView::Gateway)],
        };
        let stale = copy_missing(&index, &removals, &[key()], &[reply(5_000)], NOW);
        assert_eq!(stale.copied, 0);
        // Written after the removal: the pod came back.
        let fresh = copy_missing(&index, &removals, &[key()], &[reply(500)], NOW);
        assert_eq!(fresh.copied, 1);
    }

    #[test]
    fn a_replica_holding_as_much_or_more_copies_nothing() {
        let index = index();
        index.insert("m", &[1, 2, 3, 4], "a", NOW).unwrap();
        let reply = Reply::Detail {
            key_blocks: 4,
            matches: vec![detail("a", 3, 0, PodView::Gateway)],
        };
        let done = copy_missing(&index, &Removals::default(), &[key()], &[reply], NOW);
        assert_eq!(done, Compared { keys: 1, copied: 0 });
    }
}
