//! Receipts: what engines reused against what the index predicted, per pod,
//! and the `Suspect` view that follows from them.
//!
//! A gateway that routed a request to a pod on the index's answer reports
//! afterwards what the engine reused ([`Receipt`]). Each pod keeps the
//! outcomes of its last receipts (at most [`MAX_WINDOW`]) in one word, two
//! bits each, so recording and reading take no lock:
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

use prefix_proto::{Judged, Receipt, ReceiptCounts, ReceiptError, ReceiptOutcome};
use thiserror::Error;

use crate::index::{Index, Reader};
use crate::pods::PodId;
use crate::sync::{AtomicU64, Ordering};

/// The longest window a pod keeps: 32 receipts of two bits fill its word.
pub const MAX_WINDOW: u32 = 32;

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
    /// A window of 32 receipts, suspect at 8 over-predicted (a quarter: a
    /// healthy pod's over-predictions are races between a routing and an
    /// eviction told just after it, a few in a hundred), quiet after 60 s,
    /// no tolerance.
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
const LOW: u64 = 0x5555_5555_5555_5555;
/// In `mark`: the pod is suspect. The other bits hold the time of its last
/// receipt (ms since the Unix epoch, far below 2^63).
const SUSPECT: u64 = 1 << 63;

/// One pod's receipts (a field of its slot in the pod table).
pub(crate) struct PodReceipts {
    /// The outcomes of its last receipts, newest in the low bits.
    ring: AtomicU64,
    /// [`SUSPECT`] and the time of its last receipt.
    mark: AtomicU64,
    /// Receipts counted since the pod was named, by outcome
    /// ([`ReceiptOutcome::ALL`] order).
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

/// The counts of the last `window` slots of `ring`.
fn counts(ring: u64, window: u32) -> ReceiptCounts {
    let ring = if window >= MAX_WINDOW {
        ring
    } else {
        ring & ((1u64 << (2 * window)) - 1)
    };
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

impl PodReceipts {
    pub(crate) fn new() -> Self {
        PodReceipts {
            ring: AtomicU64::new(0),
            mark: AtomicU64::new(0),
            totals: [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)],
        }
    }

    /// Forgets everything (the slot's pod is new).
    pub(crate) fn reset(&self) {
        // Relaxed (all): statistics of a pod being named; a receipt racing
        // the naming counts for either.
        self.ring.store(0, Ordering::Relaxed);
        self.mark.store(0, Ordering::Relaxed);
        for t in &self.totals {
            t.store(0, Ordering::Relaxed);
        }
    }

    /// Counts a receipt of `outcome` at `now`.
    fn record(&self, outcome: ReceiptOutcome, rule: &ReceiptRule, now: u64) -> Option<Change> {
        // Relaxed (every access here): these words publish no other data;
        // each transition is decided by a read-modify-write of `mark`,
        // which all threads see in one order, so exactly one receipt
        // reports it.
        let code = match outcome {
            ReceiptOutcome::Exact => EXACT,
            ReceiptOutcome::Under => UNDER,
            ReceiptOutcome::Over => OVER,
        };
        let slot = ReceiptOutcome::ALL.iter().position(|o| *o == outcome);
        self.totals[slot.unwrap_or(0)].fetch_add(1, Ordering::Relaxed);
        let now = now & !SUSPECT;
        let mark = self.mark.load(Ordering::Relaxed);
        if mark & SUSPECT != 0 && self.quiet(mark, rule, now) {
            // Quiet for too long: the window restarts with this receipt.
            let restarted =
                self.mark
                    .compare_exchange(mark, now, Ordering::Relaxed, Ordering::Relaxed);
            if restarted.is_ok() {
                self.ring.store(code, Ordering::Relaxed);
                return Some(Change::Cleared);
            }
        }
        let ring = (self
            .ring
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                Some((r << 2) | code)
            }))
        .map_or(code, |r| (r << 2) | code);
        let mark = self
            .mark
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |m| {
                Some((m & SUSPECT) | (m & !SUSPECT).max(now))
            })
            .unwrap_or(0);
        if rule.suspect == 0 {
            return None;
        }
        if mark & SUSPECT == 0 {
            if counts(ring, rule.window).over < rule.suspect {
                return None;
            }
            let was = self.mark.fetch_or(SUSPECT, Ordering::Relaxed);
            return (was & SUSPECT == 0).then_some(Change::Suspect);
        }
        if agreeing(ring) < rule.suspect {
            return None;
        }
        let was = self.mark.fetch_and(!SUSPECT, Ordering::Relaxed);
        if was & SUSPECT == 0 {
            return None;
        }
        // The window restarts with the agreeing receipts: the old
        // over-predictions are answered.
        let keep = if rule.suspect >= MAX_WINDOW {
            u64::MAX
        } else {
            (1u64 << (2 * rule.suspect)) - 1
        };
        self.ring.fetch_and(keep, Ordering::Relaxed);
        Some(Change::Cleared)
    }

    /// Whether a pod marked `mark` has gone quiet by `now`.
    fn quiet(&self, mark: u64, rule: &ReceiptRule, now: u64) -> bool {
        let quiet = u64::try_from(rule.quiet.as_millis()).unwrap_or(u64::MAX);
        now.saturating_sub(mark & !SUSPECT) > quiet
    }

    /// The pod's counts, and whether it is suspect at `now`.
    pub(crate) fn standing(&self, rule: &ReceiptRule, now: u64) -> Standing {
        // Relaxed: statistics (see `record`).
        let (ring, mark) = (
            self.ring.load(Ordering::Relaxed),
            self.mark.load(Ordering::Relaxed),
        );
        Standing {
            counts: counts(ring, rule.window),
            suspect: mark & SUSPECT != 0 && !self.quiet(mark, rule, now),
        }
    }

    /// Receipts counted since the pod was named, by outcome.
    fn totals(&self) -> [u64; 3] {
        // Relaxed: counters.
        self.totals.each_ref().map(|t| t.load(Ordering::Relaxed))
    }
}

/// A pod's recent receipts and whether they make it suspect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Standing {
    /// Its last receipts (the rule's window), by outcome.
    pub counts: ReceiptCounts,
    /// Whether they over-predict enough for its answers to be doubted.
    pub suspect: bool,
}

impl Index {
    /// Counts `receipt` for its pod at `now`, the engine's reuse read in
    /// blocks of `block_tokens` tokens (the server's token block) and whole
    /// engine blocks of the pod.
    pub fn record_receipt(
        &self,
        receipt: &Receipt,
        block_tokens: u32,
        now: u64,
    ) -> Result<Recorded, ReceiptRefusal> {
        let (sh, pin) = (&self.sh, self.pin());
        receipt.check()?;
        let id = sh
            .pods
            .id(&receipt.pod, &pin)
            .filter(|id| sh.pods.is_match(id.0))
            .ok_or_else(|| ReceiptRefusal::UnknownPod {
                pod: receipt.pod.clone(),
            })?;
        let rule = &sh.cfg.receipts;
        let align = sh.pods.align(id.0);
        let judged = receipt.judge(block_tokens, align, rule.tolerance)?;
        let book = sh.pods.receipts(id.0);
        let change = book.record(judged.outcome, rule, now);
        Ok(Recorded {
            judged,
            counts: book.standing(rule, now).counts,
            change,
        })
    }

    /// Forgets `pod`'s recent receipts (not its totals): what they said is
    /// answered (its engine was learnt anew). Returns whether the pod is in
    /// the index.
    pub fn restart_receipts(&self, pod: &str) -> bool {
        let (sh, pin) = (&self.sh, self.pin());
        let Some(id) = sh.pods.id(pod, &pin).filter(|id| sh.pods.is_match(id.0)) else {
            return false;
        };
        let book = sh.pods.receipts(id.0);
        // Relaxed: statistics (see `PodReceipts::record`).
        book.ring.store(0, Ordering::Relaxed);
        book.mark.fetch_and(!SUSPECT, Ordering::Relaxed);
        true
    }

    /// Each live pod's receipts since it was named, by outcome
    /// ([`ReceiptOutcome::ALL`] order), for pods with any, by name.
    pub fn receipt_totals(&self) -> Vec<(String, [u64; 3])> {
        let (sh, pin) = (&self.sh, self.pin());
        let mut all: Vec<(String, [u64; 3])> = sh
            .pods
            .live(&pin)
            .filter(|&(_, id)| !sh.pods.is_hidden(id))
            .map(|(name, id)| (name.to_owned(), sh.pods.receipts(id).totals()))
            .filter(|(_, t)| t.iter().any(|&n| n > 0))
            .collect();
        all.sort_unstable();
        all
    }
}

impl Reader<'_> {
    /// `pod`'s recent receipts and whether they make it suspect at `now`.
    pub fn receipts(&self, pod: PodId, now: u64) -> Standing {
        let sh = &self.index().sh;
        sh.pods.receipts(pod.0).standing(&sh.cfg.receipts, now)
    }

    /// As [`Reader::receipts`], by name: none for a pod not in the index.
    pub fn receipts_of(&self, pod: &str, now: u64) -> Option<Standing> {
        let sh = &self.index().sh;
        let id = sh.pods.id(pod, self.pin())?;
        sh.pods.is_match(id.0).then(|| self.receipts(id, now))
    }
}

#[cfg(test)]
mod tests;
