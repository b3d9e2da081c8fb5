//! Following one engine's event stream by sequence number, without I/O.
//!
//! An engine numbers its batches 0, 1, 2, ... per publisher instance and
//! says nothing else about order or loss: a PUB socket drops batches for a
//! slow subscriber, and a restarted engine counts from 0 again. A
//! [`Follower`] turns the numbers it sees into [`Action`]s:
//!
//! - the next number: apply the batch;
//! - a number that skips ahead (a gap): with a replay endpoint, ask for
//!   the missing batches and hold live ones back until the replay ends
//!   (applying replayed and held batches in order, each once); without one,
//!   or when the replay cannot fill the gap, **resync**: clear the pod and
//!   learn it again from the stream. Every skip ahead is also reported as
//!   [`Action::Gap`], for counting: the follower is the one place that
//!   knows what a number means, so a replay asked is never taken for a gap;
//! - the last batch applied again (same number, same bytes): a duplicate,
//!   dropped;
//! - a number at or below the last one (the engine restarted): clear the
//!   pod, and with a replay endpoint replay the new engine's whole buffer
//!   (batches it sent before the connection came back are in it);
//! - the first number seen, above 0, with a replay endpoint: replay from 0
//!   (the engine's buffer holds its recent past); after a restart of this
//!   server the follower starts from the last number its snapshot holds,
//!   so only what it missed is replayed;
//! - after a (re)connection, with a replay endpoint: replay from the last
//!   number applied. The answer's first batch tells what the engine is: the
//!   very batch applied, the same engine; another batch under that number,
//!   or none at all, a new engine (resync, then its whole buffer); a newer
//!   number, a buffer that no longer reaches back, so the batches between
//!   are lost (resync, then its whole buffer, named apart from a restart:
//!   the remedy is a larger buffer);
//! - a store under an unknown parent (reported by the applier) while a
//!   replay endpoint exists and no full replay ran since the last resync:
//!   resync and replay the engine's whole buffer, which holds the recent
//!   stores that the parents most likely came in.
//!
//! The socket task moves frames and timers; everything it decides comes
//! from here, so the decisions are unit-tested on plain sequences.

use std::collections::VecDeque;

/// Why a follower cleared its pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resync {
    /// The engine restarted: the sequence went back, or after a
    /// reconnection its replay buffer holds another batch under the last
    /// number applied, or nothing from that number on.
    Restart {
        /// The last number applied before.
        last: u64,
        /// The number that came, if one did.
        seq: Option<u64>,
    },
    /// Batches were lost and there is no replay endpoint.
    Gap {
        /// The first missing number.
        from: u64,
        /// The number that came.
        seq: u64,
    },
    /// The replay skipped numbers (the engine's buffer no longer holds
    /// them).
    ReplayHole {
        /// The first missing number.
        from: u64,
        /// The number that came.
        seq: u64,
    },
    /// The replay did not end within the replay timeout.
    ReplayTimeout,
    /// More live batches arrived during a replay than may be held back.
    ReplayOverflow,
    /// A store's parent was unknown; the whole replay buffer follows.
    Orphan,
    /// After a reconnection, the engine's replay buffer no longer reaches
    /// back to the last batch applied: its oldest batch is newer, so the
    /// batches between are lost (or the engine is a new one that got past
    /// our numbers; nothing tells them apart).
    ReplayTooShort {
        /// The last number applied.
        last: u64,
        /// The oldest number the buffer holds.
        first: u64,
    },
    /// Gateways' receipts said the engine reused less than the index
    /// promised (the pod turned suspect, with `--receipt-resync`): events
    /// were lost without a trace.
    Receipts,
}

impl Resync {
    /// A short label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Resync::Restart { .. } => "restart",
            Resync::Gap { .. } => "gap",
            Resync::ReplayHole { .. } => "replay_hole",
            Resync::ReplayTimeout => "replay_timeout",
            Resync::ReplayOverflow => "replay_overflow",
            Resync::Orphan => "orphan",
            Resync::ReplayTooShort { .. } => "replay_too_short",
            Resync::Receipts => "receipts",
        }
    }

    /// Every label, for metrics registered up front (a new one goes last,
    /// so the series keep their order).
    pub const LABELS: [&'static str; 8] = [
        "restart",
        "gap",
        "replay_hole",
        "replay_timeout",
        "replay_overflow",
        "orphan",
        "replay_too_short",
        "receipts",
    ];
}

impl std::fmt::Display for Resync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Resync::Restart {
                last,
                seq: Some(seq),
            } => write!(f, "sequence went back from {last} to {seq}: the engine restarted"),
            Resync::Restart { last, seq: None } => write!(
                f,
                "after a reconnection the engine does not hold batch {last} as applied: it restarted"
            ),
            Resync::Gap { from, seq } => write!(
                f,
                "batches {from}..{seq} lost and no replay endpoint to ask for them"
            ),
            Resync::ReplayHole { from, seq } => write!(
                f,
                "replay skipped batches {from}..{seq}: the engine's buffer no longer holds them"
            ),
            Resync::ReplayTimeout => write!(f, "replay did not end in time"),
            Resync::Receipts => write!(
                f,
                "gateways' receipts over-predict: the engine reused less than the index promised"
            ),
            Resync::ReplayOverflow => write!(
                f,
                "more live batches held back during a replay than max-held-batches or max-held-bytes allow"
            ),
            Resync::Orphan => write!(
                f,
                "a stored block's parent is unknown; replaying the engine's whole buffer"
            ),
            Resync::ReplayTooShort { last, first } if first == last.saturating_add(1) => write!(
                f,
                "after a reconnection the engine's replay buffer starts at batch {first}, right after batch {last} applied, which it no longer holds to tell the same engine from a new one (raise the engine's buffer_steps)"
            ),
            Resync::ReplayTooShort { last, first } => write!(
                f,
                "after a reconnection the engine's replay buffer starts at batch {first}, past batch {last} applied: batches {}..{first} are lost (raise the engine's buffer_steps)",
                last.saturating_add(1)
            ),
        }
    }
}

/// What the socket task does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action<T> {
    /// Apply this batch.
    Apply {
        /// Its sequence number.
        seq: u64,
        /// Its payload.
        payload: T,
    },
    /// Clear the pod (it holds nothing known any more), for this reason.
    Clear(Resync),
    /// Ask the replay endpoint for every batch from this number on, and
    /// start the replay timeout.
    Replay {
        /// The first number wanted.
        from: u64,
    },
    /// The live stream skipped numbers `from..seq` (`seq` came): batches a
    /// PUB socket dropped, or an engine's first batches missed. Only
    /// counted: the `Replay` or `Clear` that deals with it follows.
    Gap {
        /// The first number missing.
        from: u64,
        /// The number that came.
        seq: u64,
    },
}

/// The last batch applied: its number and a digest of its payload (which
/// tells the same engine's copy of it from a new engine's batch of the same
/// number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Its sequence number.
    pub seq: u64,
    /// xxh3-64 of its payload.
    pub digest: u64,
}

/// What the follower is doing besides following the live stream.
#[derive(Debug)]
enum Mode<T> {
    /// Following the live stream.
    Live,
    /// A replay is under way; live batches are held back.
    Replaying(Held<T>),
    /// After a (re)connection: the replay asked from the last batch applied
    /// must start with that very batch, or the engine is a new one.
    Verifying(Held<T>),
    /// The check failed (a new engine, or a buffer that no longer reaches
    /// back): the rest of the answer is dropped, then the whole buffer is
    /// asked for; the pod is cleared for this reason.
    Discarding(Held<T>, Resync),
}

/// How much a replay may hold back of the live stream: past either bound,
/// the pod is cleared and learnt again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldLimit {
    /// Batches (`--max-held-batches`).
    pub batches: usize,
    /// Their payloads' bytes (`--max-held-bytes`).
    pub bytes: usize,
}

/// Live batches held back during a replay, in order, and their bytes.
#[derive(Debug)]
struct Held<T> {
    batches: VecDeque<(u64, T)>,
    bytes: usize,
}

impl<T: AsRef<[u8]>> Held<T> {
    fn new() -> Self {
        Held {
            batches: VecDeque::new(),
            bytes: 0,
        }
    }

    /// Holds one more batch if `limit` allows; hands it back otherwise.
    fn push(&mut self, seq: u64, payload: T, limit: HeldLimit) -> Result<(), T> {
        let bytes = self.bytes.saturating_add(payload.as_ref().len());
        if self.batches.len() >= limit.batches || bytes > limit.bytes {
            return Err(payload);
        }
        self.bytes = bytes;
        self.batches.push_back((seq, payload));
        Ok(())
    }
}

impl<T> IntoIterator for Held<T> {
    type Item = (u64, T);
    type IntoIter = std::collections::vec_deque::IntoIter<(u64, T)>;

    fn into_iter(self) -> Self::IntoIter {
        self.batches.into_iter()
    }
}

/// The sequence state of one engine stream.
#[derive(Debug)]
pub struct Follower<T> {
    /// The last batch applied.
    last: Option<Applied>,
    /// Whether the engine has a replay endpoint.
    can_replay: bool,
    mode: Mode<T>,
    /// How much a replay may hold back.
    max_held: HeldLimit,
    /// Whether the whole replay buffer was asked for since the last resync
    /// (or the replay endpoint stopped answering): no second full replay.
    replayed_all: bool,
    /// Whether the replay under way asks for the whole buffer (from 0).
    full: bool,
    /// Whether the engine's whole buffer has been applied and was empty:
    /// its next batch is its first, number 0.
    at_start: bool,
}

impl<T: AsRef<[u8]>> Follower<T> {
    /// A follower that last applied `resume` (from a snapshot), or nothing.
    pub fn new(can_replay: bool, max_held: HeldLimit, resume: Option<Applied>) -> Self {
        Follower {
            last: resume,
            can_replay,
            mode: Mode::Live,
            max_held,
            replayed_all: false,
            full: false,
            at_start: false,
        }
    }

    /// The last batch applied.
    pub fn last(&self) -> Option<Applied> {
        self.last
    }

    /// Whether a replay is under way.
    pub fn replaying(&self) -> bool {
        !matches!(self.mode, Mode::Live)
    }

    fn held(&mut self) -> Option<&mut Held<T>> {
        match &mut self.mode {
            Mode::Live => None,
            Mode::Replaying(h) | Mode::Verifying(h) | Mode::Discarding(h, _) => Some(h),
        }
    }

    fn take_held(&mut self) -> Held<T> {
        match std::mem::replace(&mut self.mode, Mode::Live) {
            Mode::Live => Held::new(),
            Mode::Replaying(h) | Mode::Verifying(h) | Mode::Discarding(h, _) => h,
        }
    }

    /// The socket (re)connected to the engine. Nothing on the wire tells a
    /// restarted engine from the same one after a network blip; with a
    /// replay endpoint, the engine's copy of the last batch applied does.
    /// Without anything applied yet, the engine's whole buffer is its
    /// recent past, worth having before its next batch.
    pub fn connected(&mut self, out: &mut Vec<Action<T>>) {
        if !self.can_replay || !matches!(self.mode, Mode::Live) {
            return;
        }
        match self.last {
            Some(last) => {
                out.push(Action::Replay { from: last.seq });
                self.mode = Mode::Verifying(Held::new());
            }
            None if !self.replayed_all => {
                self.replayed_all = true;
                self.full = true;
                out.push(Action::Replay { from: 0 });
                self.mode = Mode::Replaying(Held::new());
            }
            None => {}
        }
    }

    /// A batch from the live stream.
    pub fn live(&mut self, seq: u64, payload: T, out: &mut Vec<Action<T>>) {
        let max = self.max_held;
        if let Some(held) = self.held() {
            let Err(payload) = held.push(seq, payload, max) else {
                return;
            };
            self.mode = Mode::Live;
            self.resync(Resync::ReplayOverflow, seq, payload, out);
            return;
        }
        // The very batch applied last, again: a duplicate, not a restart.
        if self
            .last
            .is_some_and(|l| l.seq == seq && l.digest == digest(&payload))
        {
            return;
        }
        match self.last.map(|l| l.seq) {
            // The engine's first batches were lost. Asked once: a batch
            // its buffer does not reach is applied as it comes.
            None if self.at_start && seq > 0 && self.can_replay => {
                out.push(Action::Gap { from: 0, seq });
                self.replay(0, false, seq, payload, out)
            }
            None if self.at_start && seq > 0 => {
                out.push(Action::Gap { from: 0, seq });
                self.resync(Resync::Gap { from: 0, seq }, seq, payload, out)
            }
            // Joining a stream under way: what came before is in the
            // engine's replay buffer.
            None if seq > 0 && self.can_replay && !self.replayed_all => {
                self.replayed_all = true;
                self.replay(0, true, seq, payload, out);
            }
            None => self.apply(seq, payload, out),
            Some(last) if seq == last.wrapping_add(1) => self.apply(seq, payload, out),
            // A new engine: everything it did since it started is in its
            // buffer (the batches before this one may have gone by before
            // the connection came back).
            Some(last) if seq <= last && self.can_replay => {
                self.restart(
                    Resync::Restart {
                        last,
                        seq: Some(seq),
                    },
                    out,
                );
                self.replay(0, true, seq, payload, out);
            }
            Some(last) if seq <= last => self.resync(
                Resync::Restart {
                    last,
                    seq: Some(seq),
                },
                seq,
                payload,
                out,
            ),
            // A gap (`last + 1` cannot overflow: `seq <= last` went above).
            Some(last) if self.can_replay => {
                out.push(Action::Gap {
                    from: last + 1,
                    seq,
                });
                self.replay(last + 1, false, seq, payload, out)
            }
            Some(last) => {
                out.push(Action::Gap {
                    from: last + 1,
                    seq,
                });
                self.resync(
                    Resync::Gap {
                        from: last + 1,
                        seq,
                    },
                    seq,
                    payload,
                    out,
                )
            }
        }
    }

    /// A batch from the replay endpoint (numbers at or below the last one
    /// applied are dropped: the replay repeats what came live).
    pub fn replayed(&mut self, seq: u64, payload: T, out: &mut Vec<Action<T>>) {
        match &self.mode {
            Mode::Live | Mode::Discarding(..) => {}
            Mode::Verifying(_) => {
                // vLLM answers from its oldest batch when it holds none as
                // old as the number asked: a newer first batch means the
                // buffer rolled past the last one applied. A lower one
                // (vLLM sends none) or another batch under that number is
                // a new engine's. `connected` verifies only with a batch
                // applied; without one nothing tells the engine, so it is
                // taken for a new one.
                let why = match self.last {
                    Some(last) if last.seq == seq && last.digest == digest(&payload) => None,
                    Some(last) if seq > last.seq => Some(Resync::ReplayTooShort {
                        last: last.seq,
                        first: seq,
                    }),
                    Some(last) => Some(Resync::Restart {
                        last: last.seq,
                        seq: None,
                    }),
                    None => Some(Resync::Restart { last: 0, seq: None }),
                };
                let held = self.take_held();
                self.mode = match why {
                    None => Mode::Replaying(held),
                    Some(why) => Mode::Discarding(held, why),
                };
            }
            Mode::Replaying(_) => match self.last.map(|l| l.seq) {
                Some(last) if seq <= last => {}
                Some(last) if seq != last + 1 => {
                    self.take_held();
                    self.replay_hole(last, seq, payload, out);
                }
                _ => self.apply(seq, payload, out),
            },
        }
    }

    /// The replay's end marker: the held live batches follow, in order.
    pub fn replay_ended(&mut self, out: &mut Vec<Action<T>>) {
        match std::mem::replace(&mut self.mode, Mode::Live) {
            Mode::Live => {}
            Mode::Replaying(held) => {
                self.at_start = std::mem::take(&mut self.full) && self.last.is_none();
                // No second replay for the same gap: a held batch the answer
                // did not reach up to was sent by another engine than the
                // one that answered.
                for (seq, payload) in held {
                    match self.last.map(|l| l.seq) {
                        None => self.live(seq, payload, out),
                        Some(last) if seq <= last => {}
                        Some(last) if seq == last + 1 => self.apply(seq, payload, out),
                        Some(last) => self.replay_hole(last, seq, payload, out),
                    }
                }
            }
            // An answer with no batch: the engine's numbers are all below
            // the last one applied, a new engine. Its whole buffer is what
            // it holds.
            Mode::Verifying(held) => {
                let last = self.last.map_or(0, |l| l.seq);
                self.restart(Resync::Restart { last, seq: None }, out);
                self.full = true;
                out.push(Action::Replay { from: 0 });
                self.mode = Mode::Replaying(held);
            }
            // The answer's first batch failed the check (`replayed` says
            // why): cleared for that reason, then the whole buffer.
            Mode::Discarding(held, why) => {
                self.restart(why, out);
                self.full = true;
                out.push(Action::Replay { from: 0 });
                self.mode = Mode::Replaying(held);
            }
        }
    }

    /// The replay timeout passed before its end marker.
    pub fn replay_timed_out(&mut self, out: &mut Vec<Action<T>>) {
        if matches!(self.mode, Mode::Live) {
            return;
        }
        let held = self.take_held();
        self.full = false;
        self.at_start = false;
        out.push(Action::Clear(Resync::ReplayTimeout));
        // The replay endpoint does not answer: no full replay until the
        // next resync for another reason.
        self.replayed_all = true;
        self.last = None;
        for (seq, payload) in held {
            self.live(seq, payload, out);
        }
    }

    /// The applier met a store whose parent is unknown.
    pub fn orphaned(&mut self, out: &mut Vec<Action<T>>) {
        if !self.can_replay || self.replayed_all || !matches!(self.mode, Mode::Live) {
            return;
        }
        self.restart(Resync::Orphan, out);
        self.full = true;
        out.push(Action::Replay { from: 0 });
        self.mode = Mode::Replaying(Held::new());
    }

    /// Gateways' receipts doubt the pod's blocks: it is cleared, and the
    /// engine's whole buffer applied where a replay endpoint has it (else
    /// the pod is learnt again). Returns whether it was: not while a replay
    /// or a reconnection's check runs (ask again after it).
    pub fn doubted(&mut self, out: &mut Vec<Action<T>>) -> bool {
        if !matches!(self.mode, Mode::Live) {
            return false;
        }
        self.restart(Resync::Receipts, out);
        if self.can_replay {
            self.full = true;
            out.push(Action::Replay { from: 0 });
            self.mode = Mode::Replaying(Held::new());
        }
        true
    }

    /// Clears for `why` and forgets the last batch; the whole buffer is
    /// asked for next.
    fn restart(&mut self, why: Resync, out: &mut Vec<Action<T>>) {
        out.push(Action::Clear(why));
        self.last = None;
        self.replayed_all = true;
    }

    /// Asks for every batch from `from` on, holding this one back.
    /// `full`: the answer is the engine's whole buffer, so an empty one
    /// means its next batch is its first.
    fn replay(&mut self, from: u64, full: bool, seq: u64, payload: T, out: &mut Vec<Action<T>>) {
        self.full = full;
        out.push(Action::Replay { from });
        let mut held = Held::new();
        // The first batch held is held whatever its size: a message is
        // within --max-event-bytes, which the bound on bytes is above.
        held.bytes = payload.as_ref().len();
        held.batches.push_back((seq, payload));
        self.mode = Mode::Replaying(held);
    }

    fn apply(&mut self, seq: u64, payload: T, out: &mut Vec<Action<T>>) {
        self.at_start = false;
        self.last = Some(Applied {
            seq,
            digest: digest(&payload),
        });
        out.push(Action::Apply { seq, payload });
    }

    /// Batch `seq` of a replay (or held through one) does not follow `last`,
    /// the last one applied: the replay left a hole.
    fn replay_hole(&mut self, last: u64, seq: u64, payload: T, out: &mut Vec<Action<T>>) {
        let why = Resync::ReplayHole {
            from: last + 1,
            seq,
        };
        self.resync(why, seq, payload, out);
    }

    fn resync(&mut self, why: Resync, seq: u64, payload: T, out: &mut Vec<Action<T>>) {
        out.push(Action::Clear(why));
        // After a replay that failed, no full replay at once: the next one
        // would likely fail the same way (and clear the pod again).
        if !matches!(why, Resync::ReplayOverflow | Resync::ReplayHole { .. }) {
            self.replayed_all = false;
        }
        self.apply(seq, payload, out);
    }
}

/// The digest a follower keeps of the last batch applied.
pub fn digest(payload: &impl AsRef<[u8]>) -> u64 {
    xxhash_rust::xxh3::xxh3_64(payload.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;

    type F = Follower<Vec<u8>>;

    /// The payload of batch `seq` of engine `e` (two engines number alike).
    fn p(e: u8, seq: u64) -> Vec<u8> {
        let mut v = seq.to_be_bytes().to_vec();
        v.push(e);
        v
    }

    fn at(seq: u64) -> Option<Applied> {
        Some(Applied {
            seq,
            digest: digest(&p(0, seq)),
        })
    }

    fn seqs(out: &[Action<Vec<u8>>]) -> Vec<String> {
        out.iter()
            .map(|a| match a {
                Action::Apply { seq, payload } => {
                    format!("apply {seq}{}", ["", "'"][usize::from(payload[8])])
                }
                Action::Clear(why) => format!("clear {}", why.label()),
                Action::Replay { from } => format!("replay {from}"),
                Action::Gap { from, seq } => format!("gap {from}..{seq}"),
            })
            .collect()
    }

    fn connected(f: &mut F) -> Vec<String> {
        let mut out = Vec::new();
        f.connected(&mut out);
        seqs(&out)
    }

    fn live(f: &mut F, s: &[u64]) -> Vec<String> {
        let mut out = Vec::new();
        for &seq in s {
            f.live(seq, p(0, seq), &mut out);
        }
        seqs(&out)
    }

    fn replay(f: &mut F, e: u8, s: &[u64]) -> Vec<String> {
        let mut out = Vec::new();
        for &seq in s {
            f.replayed(seq, p(e, seq), &mut out);
        }
        f.replay_ended(&mut out);
        seqs(&out)
    }

    #[test]
    fn in_order_batches_apply_from_wherever_the_stream_starts() {
        let mut f = F::new(false, held(8), None);
        assert_eq!(live(&mut f, &[5, 6, 7]), ["apply 5", "apply 6", "apply 7"]);
        assert_eq!(f.last().map(|l| l.seq), Some(7));
    }

    #[test]
    fn a_restart_clears_and_relearns() {
        let mut f = F::new(false, held(8), None);
        assert_eq!(
            live(&mut f, &[3, 4, 0, 1]),
            ["apply 3", "apply 4", "clear restart", "apply 0", "apply 1"]
        );
        // The last batch again is a duplicate; another under its number is
        // a new engine's.
        assert_eq!(live(&mut f, &[1]), Vec::<String>::new());
        let mut out = Vec::new();
        f.live(1, p(1, 1), &mut out);
        assert_eq!(seqs(&out), ["clear restart", "apply 1'"]);
    }

    #[test]
    fn a_restart_with_replay_relearns_the_new_engines_buffer() {
        let mut f = F::new(true, held(8), at(9));
        assert_eq!(live(&mut f, &[2]), ["clear restart", "replay 0"]);
        assert_eq!(
            replay(&mut f, 0, &[0, 1, 2]),
            ["apply 0", "apply 1", "apply 2"]
        );
    }

    #[test]
    fn joining_late_replays_the_engines_buffer_and_resuming_only_the_rest() {
        let mut f = F::new(true, held(8), None);
        assert_eq!(live(&mut f, &[4]), ["replay 0"]);
        let mut resumed = F::new(true, held(8), at(6));
        assert_eq!(live(&mut resumed, &[7]), ["apply 7"]);
        let mut behind = F::new(true, held(8), at(6));
        assert_eq!(live(&mut behind, &[9]), ["gap 7..9", "replay 7"]);
        // From the very first batch, nothing is missing.
        let mut first = F::new(true, held(8), None);
        assert_eq!(live(&mut first, &[0, 1]), ["apply 0", "apply 1"]);
    }

    #[test]
    fn a_reconnection_to_the_same_engine_replays_only_what_was_missed() {
        let mut f = F::new(true, held(8), at(4));
        assert_eq!(connected(&mut f), ["replay 4"]);
        assert_eq!(live(&mut f, &[7]), Vec::<String>::new());
        assert_eq!(
            replay(&mut f, 0, &[4, 5, 6, 7]),
            ["apply 5", "apply 6", "apply 7"]
        );
        assert!(!f.replaying());
    }

    #[test]
    fn a_reconnection_to_a_new_engine_relearns_it_whatever_its_numbers() {
        // The new engine got past our last number while we were away: its
        // batch 4 is not ours.
        let mut f = F::new(true, held(8), at(4));
        f.connected(&mut Vec::new());
        assert_eq!(replay(&mut f, 1, &[4, 5, 6]), ["clear restart", "replay 0"]);
        assert_eq!(
            replay(&mut f, 1, &[0, 1, 2, 3, 4, 5, 6]),
            ["apply 0'", "apply 1'", "apply 2'", "apply 3'", "apply 4'", "apply 5'", "apply 6'"]
        );
        // Or its numbers are all below ours: the answer is the end marker.
        let mut g = F::new(true, held(8), at(40));
        g.connected(&mut Vec::new());
        assert_eq!(replay(&mut g, 1, &[]), ["clear restart", "replay 0"]);
        // A first connection asks for the engine's recent past, once.
        let mut fresh = F::new(true, held(8), None);
        let mut out = Vec::new();
        fresh.connected(&mut out);
        fresh.connected(&mut out);
        assert_eq!(seqs(&out), ["replay 0"]);
        assert_eq!(replay(&mut fresh, 0, &[0, 1]), ["apply 0", "apply 1"]);
        // Without a replay endpoint there is nothing to ask.
        let mut h = F::new(false, held(8), at(4));
        let mut out = Vec::new();
        h.connected(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn doubted_pods_are_cleared_and_learnt_again() {
        let doubt = |f: &mut F| {
            let mut out = Vec::new();
            let done = f.doubted(&mut out);
            (done, seqs(&out))
        };
        // With a replay endpoint: the engine's whole buffer, then live on.
        let mut f = F::new(true, held(8), at(4));
        assert_eq!(live(&mut f, &[5]), ["apply 5"]);
        assert_eq!(
            doubt(&mut f),
            (true, vec!["clear receipts".into(), "replay 0".into()])
        );
        assert_eq!(live(&mut f, &[7]), Vec::<String>::new());
        assert_eq!(
            replay(&mut f, 0, &[3, 4, 5, 6, 7]),
            ["apply 3", "apply 4", "apply 5", "apply 6", "apply 7"]
        );
        // Not while a replay runs: the doubt waits for it.
        assert_eq!(connected(&mut f), ["replay 7"]);
        assert_eq!(doubt(&mut f), (false, vec![]));
        // Without one: cleared, and the next batches are learnt.
        let mut g = F::new(false, held(8), at(4));
        assert_eq!(live(&mut g, &[5]), ["apply 5"]);
        assert_eq!(doubt(&mut g), (true, vec!["clear receipts".into()]));
        assert_eq!(live(&mut g, &[6]), ["apply 6"]);
    }

    #[test]
    fn a_gap_without_replay_clears() {
        let mut f = F::new(false, held(8), None);
        assert_eq!(
            live(&mut f, &[1, 4]),
            ["apply 1", "gap 2..4", "clear gap", "apply 4"]
        );
    }

    #[test]
    fn a_replay_fills_the_gap_and_held_batches_follow_once() {
        let mut f = F::new(true, held(8), at(0));
        assert_eq!(
            live(&mut f, &[1, 4, 5]),
            ["apply 1", "gap 2..4", "replay 2"]
        );
        assert!(f.replaying());
        // The engine's buffer holds everything from 2, the live 4 and 5 too.
        assert_eq!(
            replay(&mut f, 0, &[2, 3, 4, 5]),
            ["apply 2", "apply 3", "apply 4", "apply 5"]
        );
        assert!(!f.replaying());
        assert_eq!(live(&mut f, &[6]), ["apply 6"]);
    }

    #[test]
    fn a_replay_that_skips_numbers_clears() {
        let mut f = F::new(true, held(8), at(0));
        live(&mut f, &[1, 9]);
        assert_eq!(replay(&mut f, 0, &[5]), ["clear replay_hole", "apply 5"]);
        // The held batch was dropped with the replay; the next one is a gap.
        assert_eq!(live(&mut f, &[10]), ["gap 6..10", "replay 6"]);
    }

    #[test]
    fn a_silent_replay_times_out_and_held_batches_apply() {
        let mut f = F::new(true, held(8), at(0));
        live(&mut f, &[1, 5, 6]);
        let mut out = Vec::new();
        f.replay_timed_out(&mut out);
        assert_eq!(seqs(&out), ["clear replay_timeout", "apply 5", "apply 6"]);
    }

    /// Up to `batches` batches, of any size.
    fn held(batches: usize) -> HeldLimit {
        HeldLimit {
            batches,
            bytes: usize::MAX,
        }
    }

    #[test]
    fn too_many_held_bytes_or_batches_end_the_replay() {
        // Room for the batch that starts the replay and one more: in bytes,
        // then in batches.
        let size = p(0, 5).len();
        let bytes = HeldLimit {
            batches: 100,
            bytes: 2 * size,
        };
        for limit in [bytes, held(2)] {
            let mut f = F::new(true, limit, at(0));
            assert_eq!(
                live(&mut f, &[1, 5, 6, 7]),
                [
                    "apply 1",
                    "gap 2..5",
                    "replay 2",
                    "clear replay_overflow",
                    "apply 7"
                ],
                "{limit:?}"
            );
            assert!(!f.replaying(), "{limit:?}");
        }
    }

    #[test]
    fn an_orphan_replays_the_whole_buffer_once_per_resync() {
        let mut f = F::new(true, held(8), at(6));
        live(&mut f, &[7]);
        let mut out = Vec::new();
        f.orphaned(&mut out);
        assert_eq!(seqs(&out), ["clear orphan", "replay 0"]);
        assert_eq!(
            replay(&mut f, 0, &[3, 4, 5, 6, 7]),
            ["apply 3", "apply 4", "apply 5", "apply 6", "apply 7"]
        );
        let mut out = Vec::new();
        f.orphaned(&mut out);
        assert!(out.is_empty());
        // Without a replay endpoint an orphan is only counted.
        let mut g = F::new(false, held(8), None);
        g.orphaned(&mut out);
        assert!(out.is_empty());
    }

    /// A gap is reported once, replayed or not; a reconnection's check, a
    /// join, a restart and a replay hole are no gaps.
    #[test]
    fn gaps_are_the_live_streams_skips_only() {
        let mut f = F::new(true, held(8), at(4));
        assert_eq!(connected(&mut f), ["replay 4"]);
        assert_eq!(replay(&mut f, 0, &[4, 5]), ["apply 5"]);
        assert_eq!(live(&mut f, &[8]), ["gap 6..8", "replay 6"]);
        // The replay comes short of the gap: a resync, no second gap (the
        // held 8 goes with the failed replay, and so does the replayed one).
        assert_eq!(replay(&mut f, 0, &[7, 8]), ["clear replay_hole", "apply 7"]);
        // The engine's first batches, missed after its empty buffer.
        let mut g = F::new(true, held(8), None);
        g.connected(&mut Vec::new());
        assert_eq!(replay(&mut g, 0, &[]), Vec::<String>::new());
        assert_eq!(live(&mut g, &[3]), ["gap 0..3", "replay 0"]);
        // Joining late and restarts are no gaps.
        let mut h = F::new(true, held(8), None);
        assert_eq!(live(&mut h, &[4]), ["replay 0"]);
        let mut r = F::new(true, held(8), at(9));
        assert_eq!(live(&mut r, &[2]), ["clear restart", "replay 0"]);
    }

    /// After a reconnection, an answer that starts past the last batch
    /// applied is a buffer that rolled past it, not a restart: the pod is
    /// cleared for that reason and the whole buffer applied.
    #[test]
    fn a_reconnection_past_the_engines_buffer_is_not_a_restart() {
        let mut f = F::new(true, held(8), at(4));
        f.connected(&mut Vec::new());
        assert_eq!(
            replay(&mut f, 0, &[7, 8]),
            ["clear replay_too_short", "replay 0"]
        );
        assert_eq!(replay(&mut f, 0, &[7, 8]), ["apply 7", "apply 8"]);
        assert!(!f.replaying());
        let why = Resync::ReplayTooShort { last: 4, first: 7 };
        assert_eq!(
            why.to_string(),
            "after a reconnection the engine's replay buffer starts at batch 7, past batch 4 applied: batches 5..7 are lost (raise the engine's buffer_steps)"
        );
        // A buffer that starts right after lost nothing, but cannot prove
        // the engine is the same.
        let next = Resync::ReplayTooShort { last: 4, first: 5 }.to_string();
        assert!(
            !next.contains("lost") && next.contains("right after batch 4"),
            "{next}"
        );
        // Every reason has its label, once (the metric's series).
        assert!(Resync::LABELS.contains(&why.label()));
        let mut labels = Resync::LABELS.to_vec();
        labels.sort_unstable();
        labels.dedup();
        assert_eq!(labels.len(), Resync::LABELS.len());
    }
}
