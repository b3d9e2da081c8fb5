//! The protocol's limits, and the check of one op against them.

use crate::error::WireError;
use crate::message::{LookupArgs, Op, Subscription};

/// The largest `max_frame_bytes` a configuration may set, and the largest
/// frame a client accepts: 16 MiB.
pub const MAX_FRAME_CEILING: u32 = 16 << 20;

/// Room an answer of many entries (sampled keys, a tail's writes) stops
/// within, by the entries' estimated encoded size: a quarter of
/// [`MAX_FRAME_CEILING`], so that an answer fits in a frame whatever the
/// estimate misses.
pub const ANSWER_ROOM: usize = MAX_FRAME_CEILING as usize / 4;

/// Protocol limits. Both ends check them; the server's are authoritative.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload in bytes. Default 1 MiB: a lookup of a key of
    /// `max_key_blocks` (at most 9 bytes a hash, 576 KiB), or a batch of
    /// 64 lookups of 2,048-block keys.
    pub max_frame_bytes: u32,
    /// Longest key in blocks. Default 65,536 (the index's
    /// `max_key_blocks`): 1 Mi tokens at 16 tokens a block.
    pub max_key_blocks: usize,
    /// Most ops in one batch. Default 1,024.
    pub max_batch: usize,
    /// Longest model or pod name in bytes. Default 253 (a DNS-1123 name).
    /// It also bounds an engine subscription's other text fields (see
    /// [`Limits::max_text_len`]).
    pub max_name_len: usize,
    /// Most candidate pods in one lookup. Default 1,024.
    pub max_candidates: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_frame_bytes: 1 << 20,
            max_key_blocks: 1 << 16,
            max_batch: 1024,
            max_name_len: 253,
            max_candidates: 1024,
        }
    }
}

/// Most `Digest` questions one batch carries: each walks a whole tree, and
/// a batch's ops run under one pin of the index, which holds back the
/// freeing of what writers replace until the batch ends.
pub const MAX_DIGESTS_PER_BATCH: usize = 1;

/// Refuses a batch of more than [`MAX_DIGESTS_PER_BATCH`] digest
/// questions, however it arrived (a frame or an HTTP body).
pub(crate) fn check_digests(ops: &[Op]) -> Result<(), WireError> {
    let digests = ops.iter().filter(|op| matches!(op, Op::Digest(_))).count();
    if digests > MAX_DIGESTS_PER_BATCH {
        return Err(WireError::DigestsInBatch { len: digests });
    }
    Ok(())
}

impl Limits {
    /// Checks a batch as a whole: at most `max_batch` ops, at most
    /// [`MAX_DIGESTS_PER_BATCH`] of them digest questions.
    pub fn check_batch(&self, ops: &[Op]) -> Result<(), WireError> {
        if ops.len() > self.max_batch {
            return Err(WireError::BatchTooLarge {
                len: ops.len(),
                max: self.max_batch,
            });
        }
        check_digests(ops)
    }

    /// The frame size actually enforced: `max_frame_bytes`, never past
    /// [`MAX_FRAME_CEILING`].
    pub fn frame_bytes(&self) -> u32 {
        self.max_frame_bytes.min(MAX_FRAME_CEILING)
    }

    /// The longest endpoint, topic or media list (names joined by `+`) of an
    /// engine subscription: 4 × `max_name_len`, 1,012 bytes by default. An
    /// endpoint is a host name of up to `max_name_len` bytes with a scheme
    /// and a port; four times leaves room for any real one, and bounds what
    /// each subscription makes the server keep.
    pub fn max_text_len(&self) -> usize {
        self.max_name_len.saturating_mul(4)
    }

    fn check_name(&self, name: &str) -> Result<(), WireError> {
        if name.is_empty() || name.len() > self.max_name_len {
            return Err(WireError::BadName {
                len: name.len(),
                max: self.max_name_len,
            });
        }
        Ok(())
    }

    fn check_key(&self, key: &[u64]) -> Result<(), WireError> {
        if key.len() > self.max_key_blocks {
            return Err(WireError::KeyTooLong {
                len: key.len(),
                max: self.max_key_blocks,
            });
        }
        Ok(())
    }

    fn check_engine(&self, sub: &Subscription) -> Result<(), WireError> {
        let field = |field, len, min, max| {
            if (min..=max).contains(&len) {
                Ok(())
            } else {
                Err(WireError::BadEngineField {
                    field,
                    len,
                    min,
                    max,
                })
            }
        };
        let text = self.max_text_len();
        self.check_name(&sub.pod)?;
        self.check_name(&sub.model)?;
        field("endpoint", sub.endpoint.len(), 1, text)?;
        if let Some(replay) = &sub.replay {
            field("replay", replay.len(), 1, text)?;
        }
        field("topic", sub.topic.len(), 0, text)?;
        // As the text form writes it: `GPU+CPU`.
        let joined = sub.media.iter().map(|m| m.len() + 1).sum::<usize>();
        field("media", joined.saturating_sub(1), 1, text)?;
        sub.media
            .iter()
            .try_for_each(|m| field("media name", m.len(), 1, self.max_name_len))
    }

    /// Checks a lookup's arguments against the limits.
    fn check_lookup(&self, args: LookupArgs<'_>) -> Result<(), WireError> {
        self.check_name(args.model)?;
        self.check_key(args.key)?;
        if let Some(c) = args.candidates {
            if c.len() > self.max_candidates {
                return Err(WireError::TooManyCandidates {
                    len: c.len(),
                    max: self.max_candidates,
                });
            }
            c.iter().try_for_each(|p| self.check_name(p))?;
        }
        Ok(())
    }

    /// Checks one op against the limits.
    pub fn check_op(&self, op: &Op) -> Result<(), WireError> {
        match op {
            Op::Lookup { .. } | Op::LookupDetail { .. } | Op::LookupTiers { .. } => op
                .as_lookup()
                .map_or(Ok(()), |args| self.check_lookup(args)),
            Op::Insert { model, key, pod } => {
                self.check_name(model)?;
                self.check_name(pod)?;
                self.check_key(key)
            }
            Op::RemovePod { pod } | Op::SetPodCapacity { pod, .. } | Op::Unsubscribe { pod } => {
                self.check_name(pod)
            }
            Op::Subscribe(sub) => self.check_engine(sub),
            Op::Receipt(r) => {
                self.check_name(&r.model)?;
                self.check_name(&r.pod)?;
                self.check_key(&r.key)?;
                Ok(r.check()?)
            }
            Op::Digest(ask) => {
                if !ask.model.is_empty() {
                    self.check_name(&ask.model)?;
                }
                if ask.of.len() > crate::message::MAX_DIGEST_ASK {
                    return Err(WireError::TooManyDigestItems {
                        len: ask.of.len(),
                        max: crate::message::MAX_DIGEST_ASK,
                    });
                }
                Ok(())
            }
            Op::Stats | Op::Ping | Op::ListEngines | Op::SampleKeys { .. } | Op::Tail { .. } => {
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorCode;

    #[test]
    fn limits_are_checked_per_op() {
        let limits = Limits {
            max_key_blocks: 2,
            max_name_len: 3,
            max_candidates: 1,
            ..Limits::default()
        };
        let op = |model: &str, key: Vec<u64>, candidates: Option<Vec<String>>| Op::Lookup {
            model: model.into(),
            key,
            candidates,
        };
        let code = |op: &Op| limits.check_op(op).map_err(|e| e.code());
        assert_eq!(code(&op("m", vec![1, 2], None)), Ok(()));
        assert_eq!(
            code(&op("m", vec![1, 2, 3], None)),
            Err(ErrorCode::KeyTooLong)
        );
        assert_eq!(code(&op("", vec![], None)), Err(ErrorCode::BadName));
        assert_eq!(code(&op("long", vec![], None)), Err(ErrorCode::BadName));
        let two = Some(vec!["a".into(), "b".into()]);
        assert_eq!(
            code(&op("m", vec![], two)),
            Err(ErrorCode::TooManyCandidates)
        );
        let bad_candidate = Some(vec![String::new()]);
        assert_eq!(
            code(&op("m", vec![], bad_candidate)),
            Err(ErrorCode::BadName)
        );
        let insert = Op::Insert {
            model: "m".into(),
            key: vec![1],
            pod: "long".into(),
        };
        assert_eq!(code(&insert), Err(ErrorCode::BadName));
        assert_eq!(
            code(&Op::RemovePod { pod: String::new() }),
            Err(ErrorCode::BadName)
        );
        assert_eq!(code(&Op::Ping), Ok(()));
        assert_eq!(
            code(&Op::Unsubscribe { pod: "long".into() }),
            Err(ErrorCode::BadName)
        );
        assert_eq!(code(&Op::ListEngines), Ok(()));
    }

    #[test]
    fn engine_subscriptions_are_bounded_field_by_field() {
        let limits = Limits {
            max_name_len: 3,
            ..Limits::default()
        };
        assert_eq!(limits.max_text_len(), 12);
        let sub = Subscription {
            pod: "p".into(),
            model: "m".into(),
            endpoint: "tcp://h:1".into(),
            replay: Some("tcp://h:2".into()),
            block_size: 16,
            topic: String::new(),
            media: vec!["GPU".into(), "CPU".into()],
        };
        let check = |f: &dyn Fn(&mut Subscription)| {
            let mut s = sub.clone();
            f(&mut s);
            limits.check_op(&Op::Subscribe(s))
        };
        assert_eq!(check(&|_| ()), Ok(()));
        let bad = |field, len, min, max| {
            Err(WireError::BadEngineField {
                field,
                len,
                min,
                max,
            })
        };
        assert_eq!(check(&|s| s.endpoint.clear()), bad("endpoint", 0, 1, 12));
        assert_eq!(
            check(&|s| s.replay = Some("tcp://host:22".into())),
            bad("replay", 13, 1, 12)
        );
        assert_eq!(
            check(&|s| s.topic = "t".repeat(13)),
            bad("topic", 13, 0, 12)
        );
        assert_eq!(check(&|s| s.media.clear()), bad("media", 0, 1, 12));
        assert_eq!(
            check(&|s| s.media = vec!["GPU".into(); 4]),
            bad("media", 15, 1, 12)
        );
        assert_eq!(
            check(&|s| s.media.push(String::new())),
            bad("media name", 0, 1, 3)
        );
        assert_eq!(
            check(&|s| s.model = "long".into()).map_err(|e| e.code()),
            Err(ErrorCode::BadName)
        );
        assert_eq!(
            check(&|s| s.endpoint.clear()).map_err(|e| e.code()),
            Err(ErrorCode::BadSubscription)
        );
    }

    #[test]
    fn the_frame_limit_never_passes_the_ceiling() {
        let l = Limits {
            max_frame_bytes: u32::MAX,
            ..Limits::default()
        };
        assert_eq!(l.frame_bytes(), MAX_FRAME_CEILING);
        assert_eq!(Limits::default().frame_bytes(), 1 << 20);
    }
}
