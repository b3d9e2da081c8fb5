//! Receipts: what engines reused against what the index predicted, per pod,
//! and the `Suspect` view that follows from them.
//!
//! A gateway that routed a request to a pod on the index's answer reports
//! afterwards what the engine reused ([`Receipt`](prefix_proto::Receipt)).
//! Each pod keeps the outcomes of its last receipts (at most
//! [`MAX_WINDOW`]), two bits each, and whether it is suspect, in one word
//! that each receipt changes in one step, so recording and reading take no
//! lock and a pod's standing always follows from its window:
//! - a pod becomes **suspect** when its window holds `suspect` over-predicted
//!   receipts (the index promised blocks the engine did not have: events
//!   lost, evictions never told);
//! - it stays suspect until its last `suspect` receipts in a row agree
//!   (exact or under), and the window then restarts with them; or until it
//!   goes `quiet` with no receipt at all (a router that avoids a suspect pod
//!   sends it nothing to agree with), and the window restarts with the next.
//!
//! The state lives in the pod's slot: a pod removed and named again starts
//! with none.

use std::time::Duration;

use prefix_proto::{Judged, ReceiptCounts, ReceiptError, ReceiptOutcome};
use thiserror::Error;

use crate::sync::{AtomicU64, Ordering};

/// The longest window a pod keeps: 31 receipts of two bits, beside the
/// suspect bit, fill its word.
pub const MAX_WINDOW: u32 = 31;

/// How receipts turn into a pod's standing (settings of [`crate::IndexConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiptRule {
    /// The receipts each pod's counts cover: its last this many (1 to
    /// [`MAX_WINDOW`]).
    pub window: u32,
    /// Over-predicted receipts in the window that make the pod suspect, and
    /// agreeing receipts in a row that end it; 0 never makes a pod suspect.
    pub suspect: u32,
    /// A suspect pod with no receipt for this long is suspect no more.
    pub quiet: Duration,
    /// Over-predictions of at most this many blocks count as exact (for
    /// engines that reuse less than a hit by design: EAGLE drafting drops
    /// the last matched block).
    pub tolerance: u32,
}

impl Default for ReceiptRule {
    /// - a window of 31 receipts, the most a pod's word holds: the longest
    ///   memory costs nothing more, and a gateway sending one receipt per
    ///   request fills it within seconds on a busy pod;
    /// - suspect at 8 over-predicted (a quarter of it): a healthy pod
    ///   over-predicts only when an eviction races a routing, a few
    ///   receipts in a hundred (none in the repository's simulation);
    /// - quiet after 60 s: long enough that a router still sending a pod
    ///   some traffic keeps its evidence, short enough that one that
    ///   stopped sending it any tries it again within a minute;
    /// - no tolerance: vLLM and SGLang without drafting reuse every
    ///   whole block a hit finds.
    fn default() -> Self {
        ReceiptRule {
            window: MAX_WINDOW,
            suspect: 8,
            quiet: Duration::from_secs(60),
            tolerance: 0,
        }
    }
}

/// Outcome codes, two bits a receipt; 0 is a slot not yet used.
const EXACT: u64 = 0b01;
const UNDER: u64 = 0b10;
const OVER: u64 = 0b11;
/// The low bit of every slot.
const LOW: u64 = 0x1555_5555_5555_5555;
/// The slots of the window: the word's low 62 bits.
const RING: u64 = (1 << (2 * MAX_WINDOW)) - 1;
/// In the state word: the pod is suspect.
const SUSPECT: u64 = 1 << 63;

/// One pod's receipts (a field of its slot in the pod table).
pub(crate) struct PodReceipts {
    /// The outcomes of its last receipts, newest in the low bits
    /// ([`RING`]), and [`SUSPECT`].
    state: AtomicU64,
    /// When it last had a receipt (ms since the Unix epoch).
    last: AtomicU64,
    /// Receipts counted since the pod was named, by outcome
    /// ([`ReceiptOutcome::index`]).
    totals: [AtomicU64; 3],
}

/// What a receipt changed of its pod's standing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The pod became suspect with this receipt.
    Suspect,
    /// The pod is suspect no more.
    Cleared,
}

/// A receipt counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Recorded {
    /// Its verdict.
    pub judged: Judged,
    /// The pod's counts after it.
    pub counts: ReceiptCounts,
    /// Whether it changed the pod's standing.
    pub change: Option<Change>,
}

/// Why a receipt was not counted.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ReceiptRefusal {
    /// The pod is not in the index.
    #[error("pod {pod:?} is not in the index (never named, or removed): receipts count for pods it holds")]
    UnknownPod {
        /// The name sent.
        pod: String,
    },
    /// The figures cannot be true of the key.
    #[error(transparent)]
    Bad(#[from] ReceiptError),
}

/// The mask of `n` slots (at most [`MAX_WINDOW`]).
fn slots(n: u32) -> u64 {
    (1u64 << (2 * n.min(MAX_WINDOW))) - 1
}

/// The counts of the last `window` slots of `ring`.
fn counts(ring: u64, window: u32) -> ReceiptCounts {
    let ring = ring & slots(window);
    let (lo, hi) = (ring & LOW, (ring >> 1) & LOW);
    ReceiptCounts {
        exact: (lo & !hi).count_ones(),
        over: (lo & hi).count_ones(),
        under: (hi & !lo).count_ones(),
    }
}

/// How many of `ring`'s newest receipts in a row are not over-predicted.
fn agreeing(ring: u64) -> u32 {
    let (lo, hi) = (ring & LOW, (ring >> 1) & LOW);
    let used = (lo | hi).count_ones();
    ((lo & hi).trailing_zeros() / 2).min(used)
}

/// The state after a receipt of `code` on state `old` under `rule`; a pod
/// gone quiet (`quiet`) starts its window again with it.
fn next(old: u64, code: u64, rule: &ReceiptRule, quiet: bool) -> u64 {
    let mut suspect = old & SUSPECT != 0;
    let mut ring = old & RING;
    if suspect && quiet {
        (suspect, ring) = (false, 0);
    }
    ring = ((ring << 2) | code) & RING;
    if rule.suspect == 0 {
        suspect = false;
    } else if !suspect {
        suspect = counts(ring, rule.window).over >= rule.suspect;
    } else if agreeing(ring) >= rule.suspect {
        // The old over-predictions are answered: the window restarts with
        // the agreeing receipts.
        suspect = false;
        ring &= slots(rule.suspect);
    }
    ring | if suspect { SUSPECT } else { 0 }
}

impl PodReceipts {
    pub(crate) fn new() -> Self {
        PodReceipts {
            state: AtomicU64::new(0),
            last: AtomicU64::new(0),
            totals: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Forgets everything (the slot's pod is new). Called before the
    /// slot's Release store of LIVE in `Pods::claim`, which orders these
    /// stores before any receipt for the new pod.
    pub(crate) fn reset(&self) {
        // Relaxed (all): ordered by the Release store of LIVE after them.
        self.state.store(0, Ordering::Relaxed);
        self.last.store(0, Ordering::Relaxed);
        for t in &self.totals {
            t.store(0, Ordering::Relaxed);
        }
    }

    /// Counts a receipt of `outcome` at `now`: what it changed of the
    /// pod's standing, and the window's counts it left.
    pub(crate) fn record(
        &self,
        outcome: ReceiptOutcome,
        rule: &ReceiptRule,
        now: u64,
    ) -> (Option<Change>, ReceiptCounts) {
        let code = match outcome {
            ReceiptOutcome::Exact => EXACT,
            ReceiptOutcome::Under => UNDER,
            ReceiptOutcome::Over => OVER,
        };
        // Relaxed (every access here): these words publish no other data.
        // A receipt's whole change of window and standing is one
        // read-modify-write of `state`, and all threads see those in one
        // order, so each transition is reported by the one receipt that
        // made it. `last` only decides whether a pod went quiet, a
        // judgement of time that a receipt racing it may see either way.
        self.totals[outcome.index()].fetch_add(1, Ordering::Relaxed);
        let quiet = is_quiet(self.last.fetch_max(now, Ordering::Relaxed), rule, now);
        let step = |old| Some(next(old, code, rule, quiet));
        // `next` always answers: the update cannot fail.
        let old = self
            .state
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, step)
            .unwrap_or_default();
        let new = next(old, code, rule, quiet);
        // A pod gone quiet was no longer shown suspect.
        let shown = old & SUSPECT != 0 && !quiet;
        let change = match (shown, new & SUSPECT != 0) {
            (false, true) => Some(Change::Suspect),
            (true, false) => Some(Change::Cleared),
            (false, false) if old & SUSPECT != 0 => Some(Change::Cleared),
            _ => None,
        };
        (change, counts(new & RING, rule.window))
    }

    /// The pod's counts, and whether it is suspect at `now`.
    pub(crate) fn standing(&self, rule: &ReceiptRule, now: u64) -> Standing {
        // Relaxed: statistics (see `record`).
        let state = self.state.load(Ordering::Relaxed);
        let last = self.last.load(Ordering::Relaxed);
        Standing {
            counts: counts(state & RING, rule.window),
            suspect: state & SUSPECT != 0 && !is_quiet(last, rule, now),
        }
    }

    /// Forgets the pod's window and standing, not its totals.
    pub(crate) fn restart(&self) {
        // Relaxed: statistics (see `record`); one store, so a receipt
        // racing it lands before (and is forgotten) or after.
        self.state.store(0, Ordering::Relaxed);
    }

    /// Receipts counted since the pod was named, by outcome.
    pub(crate) fn totals(&self) -> [u64; 3] {
        // Relaxed: counters.
        self.totals.each_ref().map(|t| t.load(Ordering::Relaxed))
    }
}

/// Whether a pod whose last receipt came at `last` has gone quiet by `now`.
fn is_quiet(last: u64, rule: &ReceiptRule, now: u64) -> bool {
    let quiet = u64::try_from(rule.quiet.as_millis()).unwrap_or(u64::MAX);
    now.saturating_sub(last) > quiet
}

/// A pod's recent receipts and whether they make it suspect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// Its last receipts (the rule's window), by outcome.
    pub counts: ReceiptCounts,
    /// Whether they over-predict enough for its answers to be doubted.
    pub suspect: bool,
}

#[cfg(test)]
mod tests;
