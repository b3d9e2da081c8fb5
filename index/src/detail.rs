//! Detailed answers: for each pod, besides its match, the blocks a lower
//! cache tier holds right after it, and how far the answer can be trusted.
//!
//! The plain lookup answers what a gateway routes on most of the time and
//! stays as lean as it is; a detailed lookup runs it, then walks the key's
//! path once more for what only engine-fed pods have:
//! - **lower tiers**: an engine that offloads blocks to CPU memory or
//!   storage (vLLM's offloading connector, `medium` `CPU`) reloads, after
//!   the blocks its GPU holds, the run of following blocks a lower tier
//!   holds. A subscription that follows lower tiers holds each tier's
//!   blocks apart, as a hidden pod of the tiered pod per tier
//!   (`{pod}\0` and [`lower_lane`]), each block alone. A detailed answer
//!   counts the run that any of the tiers holds; a tiered answer
//!   ([`Reader::lookup_tiers`]) gives each tier's **reach**: how far the
//!   match extends with that tier and the ones before it in the
//!   subscription's order (a block counts when any of them holds it, as an
//!   engine reloads a block from whichever tier has it).
//! - **views**: the follower of each engine says whether the pod's blocks
//!   are the engine's cache event by event, or not right now (learning
//!   again after a resync, replaying, disconnected); a match that rests on
//!   a gateway's insert the engine has not confirmed says so too.

use prefix_proto::{PodView, ReceiptCounts};
use smallvec::SmallVec;

use crate::precise::PINNED;

use crate::index::{Index, Reader};
use crate::node_ref::NodeRef;
use crate::pods::PodId;
use crate::precise::groups::{hidden_name, lower_lane};
use crate::precise::states::{PodState, StateMap};
use crate::reclaim::Pin;
use crate::shared::Shared;
use crate::tree::Match;

/// One pod's detailed answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DetailMatch {
    /// The pod.
    pub pod: PodId,
    /// Leading blocks of the key it holds, as [`Reader::lookup`] answers
    /// (for a tiered pod: on the GPU). May be 0 when `lower` is not.
    pub blocks: u32,
    /// The run of blocks after those that a lower tier holds.
    pub lower: u32,
    /// How far the answer can be trusted.
    pub view: PodView,
    /// For a gateway-fed pod ([`PodView::Gateway`]), milliseconds since its
    /// entry on the last block it matches was last written (how near it is
    /// to its TTL); 0 for every other view.
    pub age: u64,
    /// Its recent receipts ([`crate::receipts`]).
    pub receipts: ReceiptCounts,
}

/// One pod's tiered answer ([`Reader::lookup_tiers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierMatch {
    /// The pod.
    pub pod: PodId,
    /// Leading blocks of the key its primary tier (the GPU) holds.
    pub blocks: u32,
    /// For each of its lower tiers, in the subscription's order: the
    /// leading blocks of the key held by the primary tier, that tier and the
    /// tiers before it (a block counts when any of them holds it), whole
    /// engine blocks. Never less than `blocks`, nor than the tier before.
    /// Empty for a pod without lower tiers.
    pub reach: SmallVec<[u32; 4]>,
}

/// A tiered lookup's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tiered {
    /// The key's length in blocks (after the key limit).
    pub key_blocks: u32,
    /// Pods whose `blocks` or any reach is above 0: those of the plain
    /// answer in its order, then pods held only by lower tiers, by their
    /// last reach descending.
    pub matches: Vec<TierMatch>,
}

/// A detailed lookup's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Detailed {
    /// The key's length in blocks (after the key limit).
    pub key_blocks: u32,
    /// Pods with `blocks` or `lower` above 0: those of the plain answer in
    /// its order, then pods held only by a lower tier, by `lower`
    /// descending.
    pub matches: Vec<DetailMatch>,
}

impl Index {
    /// Says how far `pod`'s answers can be trusted: what its engine's
    /// follower knows ([`PodView::Exact`], [`PodView::Learning`],
    /// [`PodView::Replaying`], [`PodView::Disconnected`]). Detailed lookups
    /// report it; a pod never set is exact.
    pub fn set_view(&self, pod: &str, view: PodView) {
        self.update_state(pod, |s| s.view = Some(view));
    }

    /// Sets the view of each pod of `views`, in one step: pods' states are
    /// one map that readers load without a lock, copied on each change, so
    /// thousands of pods changing at once (a fleet's engines connecting)
    /// copy it once here where [`Index::set_view`] each would copy it each
    /// time.
    pub fn set_views<'a>(&self, views: impl IntoIterator<Item = (&'a str, PodView)>) {
        let pin = self.pin();
        let set = |s: &mut PodState, view| s.view = Some(view);
        self.engines.states.update(views, set, &self.sh.epoch, &pin);
    }

    /// Records that lower tier `tier` (0-based) holds blocks of `pod`.
    pub(crate) fn set_tiered(&self, pod: &str, tier: u32) {
        let n = u8::try_from(tier.saturating_add(1)).unwrap_or(u8::MAX);
        self.update_state(pod, |s| s.tiers = s.tiers.max(n));
    }

    /// How many lower tiers of `pod` have held blocks (see [`PodState`]).
    pub(crate) fn lower_tiers(&self, pod: &str, pin: &Pin) -> u32 {
        let states = self.engines.states.get(pin);
        states.get(pod).map_or(0, |s| u32::from(s.tiers))
    }

    /// Forgets the states of `pods` (their engines are dropped, their
    /// lower tiers' hidden pods removed), with one copy of the states for
    /// all of them.
    pub(crate) fn forget_states(&self, pods: &[&str]) {
        let pin = self.pin();
        self.engines.states.forget(pods, &self.sh.epoch, &pin);
    }

    /// Changes `pod`'s state by `change`, copying the map only when it
    /// changes (control-plane rate: a follower's transitions, a pod's first
    /// lower-tier store).
    fn update_state(&self, pod: &str, change: impl Fn(&mut PodState)) {
        let pin = self.pin();
        self.engines
            .states
            .update_one(pod, change, &self.sh.epoch, &pin);
    }
}

impl Reader<'_> {
    /// As [`Reader::lookup`], with each pod's lower-tier run and view
    /// ([`Detailed`]). Costs a plain lookup, one more walk of the key's
    /// path, and a look at each tiered pod.
    pub fn lookup_detail(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
        now: u64,
    ) -> Detailed {
        let mut out = Detailed {
            key_blocks: 0,
            matches: Vec::new(),
        };
        out.key_blocks = self.walk_detail(model, key, candidates, now, |d, reach| {
            let lower = reach.last().map_or(0, |&r| r - d.blocks);
            out.matches.push(DetailMatch { lower, ..d });
        });
        out
    }

    /// As [`Reader::lookup`], with the reach of each pod's lower tiers
    /// ([`Tiered`]): what a router weighing a pod's CPU or storage hits
    /// needs, in one call. Costs as [`Reader::lookup_detail`].
    pub fn lookup_tiers(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
        now: u64,
    ) -> Tiered {
        let mut out = Tiered {
            key_blocks: 0,
            matches: Vec::new(),
        };
        out.key_blocks = self.walk_detail(model, key, candidates, now, |d, reach| {
            out.matches.push(TierMatch {
                pod: d.pod,
                blocks: d.blocks,
                reach: reach.into(),
            });
        });
        out
    }

    /// The plain lookup, then each pod's detail and its lower tiers' reach,
    /// handed to `each` in the answers' order (see [`Detailed::matches`]);
    /// returns the key's length in blocks.
    fn walk_detail(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
        now: u64,
        mut each: impl FnMut(DetailMatch, &[u32]),
    ) -> u32 {
        let mut found = Vec::new();
        let key_blocks = self.lookup_into(model, key, candidates, now, &mut found);
        let index = self.index();
        let (sh, pin) = (&index.sh, self.pin());
        let path = index
            .models(pin)
            .get(model)
            .map(|tree| tree.path(sh, index.cut(key), pin))
            .unwrap_or_default();
        let states = index.engines.states.get(pin);
        let on = OnPath {
            sh,
            pin,
            path: &path,
            states,
            now,
        };
        let mut reach: SmallVec<[u32; 4]> = SmallVec::new();
        for m in &found {
            let d = on.detail(*m, &mut reach);
            each(d, &reach);
        }
        if !sh.pods.any_precise() {
            return key_blocks;
        }
        // Pods held by lower tiers alone, by their last reach descending.
        let mut lower_only: Vec<(DetailMatch, SmallVec<[u32; 4]>)> = Vec::new();
        for (name, _) in states.iter().filter(|(_, s)| s.tiers > 0) {
            if candidates.is_some_and(|c| !c.contains(&&**name)) {
                continue;
            }
            let Some(id) = sh.pods.id(name, pin) else {
                continue;
            };
            if !sh.pods.is_match(id.0) || found.iter().any(|m| m.pod == id) {
                continue;
            }
            let d = on.detail(Match { pod: id, blocks: 0 }, &mut reach);
            if reach.last().is_some_and(|&r| r > 0) {
                lower_only.push((d, reach.clone()));
            }
        }
        lower_only.sort_by_key(|(_, r)| std::cmp::Reverse(r.last().copied()));
        for (d, r) in &lower_only {
            each(*d, r);
        }
        key_blocks
    }
}

/// A detailed lookup's key path and what it reads beside it, under the
/// reader's pin (`'g`).
struct OnPath<'p, 'g> {
    sh: &'g Shared,
    pin: &'g Pin,
    path: &'p [(NodeRef<'g>, u32)],
    states: &'g StateMap,
    now: u64,
}

impl OnPath<'_, '_> {
    /// The time of `pod`'s visible entry on the node holding block `block`
    /// of the key, if any.
    fn entry(&self, pod: u32, block: u32) -> Option<u64> {
        let sh = self.sh;
        let k = self.path.partition_point(|&(_, d)| d <= block);
        let (node, _) = self.path.get(k)?;
        node.pods
            .find(pod)
            .filter(|&t| self.now.saturating_sub(t) <= sh.ttl_ms)
    }

    /// `m`'s detail (its `lower` left 0), and in `reach` the reach of
    /// each of its lower tiers (see [`TierMatch::reach`]).
    fn detail(&self, m: Match, reach: &mut SmallVec<[u32; 4]>) -> DetailMatch {
        let (sh, pin) = (self.sh, self.pin);
        let (pod, blocks) = (m.pod, m.blocks);
        reach.clear();
        let standing = sh.pods.receipts(pod.0).standing(&sh.cfg.receipts, self.now);
        // Evidence over belief: receipts that over-predict override the view.
        let judged = |view| {
            if standing.suspect {
                PodView::Suspect
            } else {
                view
            }
        };
        if !sh.pods.is_precise(pod.0) {
            let written = blocks.checked_sub(1).and_then(|b| self.entry(pod.0, b));
            return DetailMatch {
                pod,
                blocks,
                lower: 0,
                view: judged(PodView::Gateway),
                age: written.map_or(0, |t| self.now.saturating_sub(t)),
                receipts: standing.counts,
            };
        }
        let name = sh.pods.name(pod, pin);
        let state = name
            .and_then(|n| self.states.get(n))
            .copied()
            .unwrap_or_default();
        let mut view = state.view.unwrap_or(PodView::Exact);
        if matches!(view, PodView::Exact | PodView::Learning)
            && blocks > 0
            && self.entry(pod.0, blocks - 1).is_some_and(|t| t != PINNED)
        {
            view = PodView::Speculative;
        }
        // A hybrid pod's lower tiers are not modelled (see `docs`).
        if let (Some(name), false) = (name, state.tiers == 0 || sh.pods.is_hybrid(pod.0)) {
            let tiers: SmallVec<[Option<PodId>; 4]> = (0..u32::from(state.tiers))
                .map(|t| sh.pods.id(&hidden_name(name, lower_lane(t)), pin))
                .collect();
            // Whole engine blocks, as the engine reloads them: each unit
            // after the match is read at its last block, and noted with the
            // first tier (in the subscription's order) that holds it.
            let align = sh.pods.align(pod.0).max(1);
            let mut end = blocks;
            let mut first: SmallVec<[u8; 32]> = SmallVec::new();
            while let Some(t) = tiers
                .iter()
                .position(|id| id.is_some_and(|id| self.entry(id.0, end + align - 1).is_some()))
            {
                first.push(t as u8);
                end += align;
            }
            for t in 0..tiers.len() {
                let run = first.iter().take_while(|&&f| usize::from(f) <= t).count() as u32;
                reach.push(blocks + run * align);
            }
        }
        DetailMatch {
            pod,
            blocks,
            lower: 0,
            view: judged(view),
            age: 0,
            receipts: standing.counts,
        }
    }
}

#[cfg(test)]
mod tests;
