//! Replicas that repair each other in the background, by digests.
//!
//! Every `--repair-interval`, a server compares its gateway-fed entries
//! with each peer's, level by level ([`prefix_proto::DigestAsk`]): the
//! peer's group digests of every model, then the cells of the groups that
//! differ, then the items of the cells that differ, and asks the entries
//! holding the items the peer has and this server lacks, which it copies
//! at the peer's write times (so a copy expires when its original does,
//! and two replicas never keep an entry alive by copying it back and
//! forth). Every server pulls from every peer, so what any one of them
//! holds reaches the others. Both sides digest the same window of write
//! times ([`compare::window`]): entries written in the last
//! [`compare::SETTLE`] are still in flight to some replicas, and those
//! within [`compare::EXPIRY_GUARD`] of their TTL about to go.
//!
//! The peer's answer to the first question carries the pods it removed
//! lately (tombstones): a pod removed there after its last write here is
//! removed here too ([`apply::bury`]). It also says how far the peer's
//! sweep evicted each pod's entries for its capacity: where that is
//! further than here, the sweep here evicts as far ([`apply::evict`]), so
//! the two hold the same entries.
//!
//! What is not copied:
//! - engine-fed pods (nor removed or evicted on a peer's word): each
//!   replica follows its engines itself;
//! - an entry of a pod this server removed after the peer wrote it;
//! - an entry written when or before the sweep here evicted that pod's
//!   entries for its capacity (or the global bound): repair never restores
//!   what the sweep took;
//! - entries this server holds and the peer lacks: the peer's own repair
//!   pulls them.
//!
//! The traffic is proportional to the difference, and the work bounded:
//! with nothing differing, a round with a peer is one question and an
//! answer of 64 digests a model, and a walk of the trees on each side. A
//! round asks for items while it has compared fewer than
//! `--repair-budget` (so at least one answer's worth), in answers of at most
//! [`MAX_DIGEST_ANSWER`](prefix_proto::message::MAX_DIGEST_ANSWER) each.
//! A round comes every `--repair-interval`, or every tenth of it
//! ([`DIVERGED_SPEEDUP`]) after a round that copied or removed something
//! or left cells to compare, and while the server catches up.
//!
//! A server back from a pause or from a time without peers catches up
//! (see [`crate::replica::Replica::behind`]): it refuses lookups until a
//! round that began late enough has compared everything with a peer. It
//! pulls from every peer at once, so it may copy an entry once per peer.
//!
//! What a peer says is checked before it is used: answers of the wrong
//! shape end the round ([`RepairError::Answer`]); write times, removals
//! and evictions dated after this server's clock are taken as of now or
//! passed over ([`apply`]).

use std::sync::Arc;

use prefix_client::{Client, ClientError, TlsConfig};
use prefix_index::digest::Window;
use prefix_proto::message::{cell_of, groups, CELLS, CELLS_PER_GROUP, GROUPS, MAX_DIGEST_ASK};
use prefix_proto::{DigestAnswer, DigestAsk, DigestLevel};
use tokio_util::sync::CancellationToken;

use crate::bootstrap;
use crate::clock::now_ms;
use crate::handler::Handler;
use crate::replica::config::ReplicaConfig;

mod answer;
pub mod apply;
pub mod compare;

pub use answer::answer;

/// How many times more often rounds come while the last one copied
/// something: more is likely missing where that was, and the work stays
/// bounded (at most this many rounds per `--repair-interval`).
pub const DIVERGED_SPEEDUP: u32 = 10;

/// What one round with one peer did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Round {
    /// Cells whose digests differed.
    pub cells: u64,
    /// Items of those cells compared (theirs and ours).
    pub items: u64,
    /// Entries copied.
    pub copied: u64,
    /// Pods removed by the peer's tombstones.
    pub removed: u64,
    /// Bytes of the peer's answers.
    pub bytes: u64,
    /// Whether every differing cell was compared (the budget sufficed).
    pub complete: bool,
}

/// How often the repair task ticks: a longer gap between ticks is a pause
/// of the server ([`crate::replica::PAUSED`]).
const TICK: std::time::Duration = std::time::Duration::from_millis(100);

/// Repairs this server from `peers` until shutdown (see the module's
/// docs): one task per peer, so that a peer that does not answer delays
/// no other, and this one ticking (the clock a pause shows on).
pub async fn run(
    cfg: ReplicaConfig,
    tls: TlsConfig,
    handler: Arc<Handler>,
    shutdown: CancellationToken,
) {
    let cfg = Arc::new(cfg);
    let peers = tokio_util::task::TaskTracker::new();
    for i in 0..cfg.peers.len() {
        let (cfg, tls, handler, shutdown) =
            (cfg.clone(), tls.clone(), handler.clone(), shutdown.clone());
        peers.spawn(with_peer_until(i, cfg, tls, handler, shutdown));
    }
    peers.close();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tick.tick() => handler.replica.tick(now_ms()),
        }
    }
    peers.wait().await;
}

/// Repairs this server from peer number `i` until shutdown.
async fn with_peer_until(
    i: usize,
    cfg: Arc<ReplicaConfig>,
    tls: TlsConfig,
    handler: Arc<Handler>,
    shutdown: CancellationToken,
) {
    let peer = &cfg.peers[i];
    let replica = &handler.replica;
    let mut client: Option<Client> = None;
    let mut pause = cfg.repair_interval;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = cfg.repair_interval;
        // A filling server takes its peers' whole index instead.
        if replica.is_filling() {
            continue;
        }
        replica.removals.prune(now_ms());
        let c = match &client {
            Some(c) => c.clone(),
            None => match bootstrap::connect(peer, &cfg, &tls, cfg.connect_timeout).await {
                Ok(c) => {
                    client = Some(c.clone());
                    c
                }
                Err(e) => {
                    handler.metrics.repair_failures.inc();
                    replica.answered(i, cfg.peers.len(), false, now_ms());
                    tracing::debug!(%peer, error = %e, "repair: no connection to the peer");
                    continue;
                }
            },
        };
        let m = &handler.metrics;
        let started = now_ms();
        let mut done = Round::default();
        let outcome = with_peer(&c, &handler, cfg.repair_budget, &mut done).await;
        // What the round did counts, whether or not it ended.
        m.repair_cells.inc_by(done.cells);
        m.repair_items.inc_by(done.items);
        m.repair_bytes.inc_by(done.bytes);
        m.repair_copied.inc_by(done.copied);
        m.repair_removed.inc_by(done.removed);
        match outcome {
            Ok(()) => {
                replica.answered(i, cfg.peers.len(), true, now_ms());
                if done.complete {
                    replica.caught_up(started);
                }
                m.repair_rounds.inc();
                // More is likely missing where this was, or more is left
                // to compare, or the server is catching up: the next round
                // comes sooner.
                if done.copied > 0 || done.removed > 0 || !done.complete || replica.is_catching_up()
                {
                    pause = cfg.repair_interval / DIVERGED_SPEEDUP;
                }
                if done.copied > 0 || done.removed > 0 {
                    tracing::info!(%peer, cells = done.cells, items = done.items, copied = done.copied, removed = done.removed, "repair copied what the peer held and this server lacked");
                }
            }
            Err(e) => {
                m.repair_failures.inc();
                // Only the peer's failures say it is unreachable.
                if !matches!(e, RepairError::Task(_)) {
                    replica.answered(i, cfg.peers.len(), false, now_ms());
                }
                tracing::debug!(%peer, error = %e, "repair: a round with the peer failed");
            }
        }
    }
    if let Some(c) = client {
        c.close().await;
    }
}

/// Why a round of repair with a peer ended early.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    /// The peer did not answer, or refused.
    #[error("the peer: {0}")]
    Peer(#[from] ClientError),
    /// The peer's answer is not one this server asked for.
    #[error("the peer's answer: {0}")]
    Answer(&'static str),
    /// Work on this server's index failed (a bug, not the peer's doing).
    #[error("a repair task here: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Runs `work` on the index off the async workers: each walks a tree.
async fn blocking<T: Send + 'static>(
    handler: &Arc<Handler>,
    work: impl FnOnce(&Handler) -> T + Send + 'static,
) -> Result<T, RepairError> {
    let h = handler.clone();
    Ok(tokio::task::spawn_blocking(move || work(&h)).await?)
}

/// One question to the peer, its answer's bytes counted in `round`.
async fn ask(
    client: &Client,
    round: &mut Round,
    level: DigestLevel,
    model: &str,
    w: Window,
    of: Vec<u64>,
) -> Result<DigestAnswer, RepairError> {
    let answer = client
        .digest(DigestAsk {
            level,
            model: model.into(),
            low: w.low,
            high: w.high,
            of,
        })
        .await?;
    round.bytes += answer.encoded_len() as u64;
    Ok(answer)
}

/// One round with one peer, comparing at most `budget` items (see the
/// module's docs); `round` says what it did, also when a question fails.
async fn with_peer(
    client: &Client,
    handler: &Arc<Handler>,
    budget: usize,
    round: &mut Round,
) -> Result<(), RepairError> {
    let ttl = handler.index.config().ttl;
    let Some(w) = compare::window(now_ms(), ttl) else {
        round.complete = true;
        return Ok(());
    };
    let theirs = ask(client, round, DigestLevel::Models, "", w, Vec::new()).await?;
    if theirs.models.iter().any(|m| m.groups.len() != GROUPS) {
        return Err(RepairError::Answer("a model's digests are not 64 groups"));
    }
    let (tombstones, evictions) = (theirs.removals, theirs.evictions);
    let models = theirs.models;
    let names: Vec<String> = models.iter().map(|m| m.model.clone()).collect();
    let (mine, removed) = blocking(handler, move |h| {
        apply::evict(&h.index, &evictions, w.now);
        let removed = apply::bury(&h.index, &h.replica.removals, &tombstones, w.now);
        let reader = h.index.reader();
        let mine: Vec<Vec<u64>> = names
            .iter()
            .map(|m| reader.digest_cells(m, w).unwrap_or_else(|| vec![0; CELLS]))
            .collect();
        (mine, removed)
    })
    .await?;
    round.removed = removed;
    round.complete = true;
    let mut budget = budget;
    for (theirs, mine) in models.iter().zip(mine) {
        if budget == 0 {
            round.complete = false;
            break;
        }
        let groups_differing = compare::differing(&groups(&mine), &theirs.groups);
        if groups_differing.is_empty() {
            continue;
        }
        let model = theirs.model.as_str();
        let cells_theirs = ask(
            client,
            round,
            DigestLevel::Cells,
            model,
            w,
            groups_differing.clone(),
        )
        .await?;
        if cells_theirs.values.len() != groups_differing.len() * CELLS_PER_GROUP {
            return Err(RepairError::Answer("not 64 cell digests a group asked"));
        }
        // Their cells of the groups asked, beside ours.
        let mut cells = Vec::new();
        for (k, &g) in groups_differing.iter().enumerate() {
            let at = g as usize * CELLS_PER_GROUP;
            let got = &cells_theirs.values[k * CELLS_PER_GROUP..(k + 1) * CELLS_PER_GROUP];
            for c in compare::differing(&mine[at..at + CELLS_PER_GROUP], got) {
                cells.push(at as u64 + c);
            }
        }
        round.cells += cells.len() as u64;
        let mut rest = &cells[..];
        while !rest.is_empty() && budget > 0 {
            let items = ask(client, round, DigestLevel::Items, model, w, rest.to_vec()).await?;
            let covered = compare::covered(rest, &items.values, items.more);
            if covered.is_empty() {
                round.complete = false;
                break;
            }
            rest = &rest[covered.len()..];
            // Ours of the cells covered, in one walk.
            let (name, asked) = (model.to_owned(), covered);
            let ours = blocking(handler, move |h| {
                let max = usize::MAX;
                h.index
                    .reader()
                    .digest_items(&name, w, &mask(&asked), max)
                    .0
            })
            .await?;
            round.items += (items.values.len() + ours.len()) as u64;
            budget = budget.saturating_sub(items.values.len());
            if budget == 0 && !rest.is_empty() {
                round.complete = false;
            }
            let wanted = compare::wanted(&items.values, &ours);
            for (k, part) in wanted.chunks(MAX_DIGEST_ASK).enumerate() {
                // What a round with another peer copied meanwhile is not
                // asked again (a server catching up pulls from all).
                let mut part = match k {
                    0 => part.to_vec(),
                    _ => remaining(handler, model, w, part.to_vec()).await?,
                };
                while !part.is_empty() {
                    let found =
                        ask(client, round, DigestLevel::Entries, model, w, part.clone()).await?;
                    let more = found.more;
                    let name = model.to_owned();
                    round.copied += blocking(handler, move |h| {
                        let evicted = h.index.evicted();
                        let removals = &h.replica.removals;
                        apply::copy(&h.index, removals, &evicted, &name, &found.entries, w)
                    })
                    .await?;
                    if !more {
                        break;
                    }
                    // The answer stopped at its bound: ask again for the
                    // items this server still lacks, while that shrinks
                    // (an entry not copied stays lacking).
                    let left = remaining(handler, model, w, part.clone()).await?;
                    if left.len() >= part.len() {
                        round.complete = false;
                        break;
                    }
                    part = left;
                }
            }
        }
    }
    Ok(())
}

/// The items of `part` this server still lacks, after a copy.
async fn remaining(
    handler: &Arc<Handler>,
    model: &str,
    w: Window,
    part: Vec<u64>,
) -> Result<Vec<u64>, RepairError> {
    let name = model.to_owned();
    blocking(handler, move |h| {
        let cells: Vec<u64> = part.iter().map(|&i| cell_of(i) as u64).collect();
        let (ours, _) = h
            .index
            .reader()
            .digest_items(&name, w, &mask(&cells), usize::MAX);
        compare::wanted(&part, &ours)
    })
    .await
}

/// `cells` as a mask of all of a model's.
fn mask(cells: &[u64]) -> Vec<bool> {
    let mut mask = vec![false; CELLS];
    for &c in cells {
        if let Some(m) = mask.get_mut(c as usize) {
            *m = true;
        }
    }
    mask
}
