//! What receipts would show: for each request routed on the index's answer,
//! the blocks the index predicted for the chosen pod beside the blocks its
//! cache really held, judged as the server judges a gateway's receipt
//! ([`Receipt::judge`]), and, with an in-process index, counted by the
//! index itself, so that a pod whose events are silently lost is found as
//! a server would find it ([`Silence`]), or not.

use prefix_index::{Change, Index};
use prefix_proto::{Receipt, ReceiptOutcome};
use serde::Serialize;

/// A pod whose engine's events stop reaching the index from a time on, its
/// cache changing still: the precise policy's test of receipts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Silence {
    /// The pod, by number.
    pub pod: usize,
    /// From this trace time on (ms after the trace's start).
    pub from_ms: u64,
    /// Which of its events are lost.
    pub lost: Lost,
}

/// Which of a silenced pod's events are lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lost {
    /// Its evictions, its stores still arriving (an engine that evicts
    /// through a path that publishes nothing, an offloading connector that
    /// stores without removing): the index keeps promising blocks the pod
    /// dropped.
    Evictions,
    /// Every event (a publisher misconfigured, a topic mismatch): the index
    /// keeps what it had, so the pod answers as it was, less and less like
    /// its cache.
    All,
}

impl Lost {
    /// Whether `event` of a silenced pod is lost.
    pub fn drops(self, event: &prefix_events::Event) -> bool {
        match self {
            Lost::Evictions => matches!(event, prefix_events::Event::Removed(_)),
            Lost::All => true,
        }
    }

    /// What is lost, in words.
    pub fn name(self) -> &'static str {
        match self {
            Lost::Evictions => "evictions",
            Lost::All => "events",
        }
    }
}

/// Shares of receipts by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ReceiptShares {
    /// The engine reused what the index predicted.
    pub exact: f64,
    /// The index predicted more than the engine reused.
    pub over: f64,
    /// The engine reused more than the index predicted.
    pub under: f64,
}

/// What became of a silenced pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Silenced {
    /// Requests routed to it after its events were first lost.
    pub requests: u64,
    /// Of those, the ones whose receipts over-predicted.
    pub over: u64,
    /// The request (counted from the loss's time) whose receipt made it
    /// suspect, if one did.
    pub suspect_after: Option<u64>,
    /// Its over-predicted receipts by then.
    pub over_by_then: Option<u64>,
    /// Times a pod became suspect while all its events arrived (the other
    /// pods, and this one before the loss): the rule's false alarms.
    pub others_suspect: u64,
}

/// Receipts of one run.
#[derive(Default)]
pub(super) struct Book {
    counts: [u64; 3],
    silenced: Silenced,
}

impl Book {
    /// Counts the receipt of a request for `key` routed to `pod` (named
    /// `name`), the index having predicted `predicted` blocks and its cache
    /// holding `held`; `silenced` if its events are being lost.
    /// The trace's blocks are the receipt's tokens, one per block.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn add(
        &mut self,
        index: Option<&Index>,
        model: &str,
        name: &str,
        key: &[u64],
        predicted: u32,
        held: u32,
        silenced: bool,
        now: u64,
    ) {
        let receipt = Receipt {
            model: model.into(),
            pod: name.into(),
            key: key.to_vec(),
            prompt_tokens: None,
            predicted_blocks: predicted,
            cached_tokens: held,
        };
        let Ok(judged) = receipt.judge(1, 1, 0) else {
            return;
        };
        self.counts[judged.outcome.index()] += 1;
        if silenced {
            self.silenced.requests += 1;
            self.silenced.over += u64::from(judged.outcome == ReceiptOutcome::Over);
        }
        // A pod the index has not named yet (no answer, no insert) has
        // nothing to doubt.
        let change = index.and_then(|i| i.record_receipt(&receipt, 1, now).ok()?.change);
        if !silenced && change == Some(Change::Suspect) {
            self.silenced.others_suspect += 1;
        }
        if silenced && change == Some(Change::Suspect) && self.silenced.suspect_after.is_none() {
            self.silenced.suspect_after = Some(self.silenced.requests);
            self.silenced.over_by_then = Some(self.silenced.over);
        }
    }

    /// The shares of each outcome, if any receipt was counted.
    pub(super) fn shares(&self) -> Option<ReceiptShares> {
        let total = self.counts.iter().sum::<u64>();
        (total > 0).then(|| {
            let share = |n: u64| n as f64 / total as f64;
            ReceiptShares {
                exact: share(self.counts[0]),
                over: share(self.counts[1]),
                under: share(self.counts[2]),
            }
        })
    }

    /// The silenced pod's account.
    pub(super) fn silenced(&self) -> Silenced {
        self.silenced.clone()
    }
}
