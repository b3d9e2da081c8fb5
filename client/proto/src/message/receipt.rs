//! A receipt: what an engine reported it reused of a request's prompt,
//! beside what the index predicted for that pod when a gateway routed the
//! request there.
//!
//! vLLM reports the reuse in each response
//! (`usage.prompt_tokens_details.cached_tokens`, with
//! `--enable-prompt-tokens-details`), SGLang as `cached_tokens` in its meta
//! info. A gateway that sends one receipt per request lets the server
//! compare each pod's answers with what happened ([`ReceiptOutcome`]).

use bincode::{Decode, Encode};
use thiserror::Error;

/// What a gateway reports after a request: the key it looked up, the
/// blocks the lookup answered for the pod it routed to, and the tokens the
/// engine reported reusing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Encode, Decode)]
pub struct Receipt {
    /// Model namespace, as the lookup named it.
    pub model: String,
    /// The pod the request went to.
    pub pod: String,
    /// The key looked up (block hashes).
    pub key: Vec<u64>,
    /// The prompt's length in tokens, when known: an engine never reuses a
    /// prompt's last token (it computes at least one), so a full match of
    /// a prompt that ends on a block's end reuses one block less.
    pub prompt_tokens: Option<u32>,
    /// The blocks the lookup answered for `pod` when the gateway routed.
    pub predicted_blocks: u32,
    /// The tokens the engine reported reusing from its cache.
    pub cached_tokens: u32,
}

/// Why a receipt cannot be true of its own key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum ReceiptError {
    /// The prediction is longer than the key.
    #[error("predicted_blocks {predicted} is more than the key's {key_blocks} blocks")]
    PredictedPastKey {
        /// Blocks predicted.
        predicted: u32,
        /// Blocks in the key.
        key_blocks: usize,
    },
    /// The engine reused more tokens than the prompt has.
    #[error("cached_tokens {cached} is more than prompt_tokens {prompt}")]
    CachedPastPrompt {
        /// Tokens reused.
        cached: u32,
        /// Tokens in the prompt.
        prompt: u32,
    },
    /// The engine reused more whole blocks than the key has.
    #[error(
        "cached_tokens {cached} is more than the key's {key_blocks} blocks of {block_tokens} tokens"
    )]
    CachedPastKey {
        /// Tokens reused.
        cached: u32,
        /// Blocks in the key.
        key_blocks: usize,
        /// Tokens per block.
        block_tokens: u32,
    },
}

impl Receipt {
    /// Checks what the receipt can say of itself: a prediction within the
    /// key and a reuse within the prompt. The reuse against the key's
    /// blocks needs the server's tokens per block ([`Receipt::reused_blocks`]).
    pub fn check(&self) -> Result<(), ReceiptError> {
        if self.predicted_blocks as usize > self.key.len() {
            return Err(ReceiptError::PredictedPastKey {
                predicted: self.predicted_blocks,
                key_blocks: self.key.len(),
            });
        }
        match self.prompt_tokens {
            Some(prompt) if self.cached_tokens > prompt => Err(ReceiptError::CachedPastPrompt {
                cached: self.cached_tokens,
                prompt,
            }),
            _ => Ok(()),
        }
    }

    /// The whole blocks of `block_tokens` tokens the engine reused (a
    /// partial block of ours is no hit the index could have answered), or
    /// why there cannot be that many.
    pub fn reused_blocks(&self, block_tokens: u32) -> Result<u32, ReceiptError> {
        let reused = self.cached_tokens / block_tokens.max(1);
        if reused as usize > self.key.len() {
            return Err(ReceiptError::CachedPastKey {
                cached: self.cached_tokens,
                key_blocks: self.key.len(),
                block_tokens,
            });
        }
        Ok(reused)
    }

    /// The most blocks of `block_tokens` tokens, in whole units of `align`
    /// blocks (an engine block), that an engine can reuse of this prompt:
    /// all but its last token, when the prompt's length is known; else the
    /// whole key.
    pub fn reusable_blocks(&self, block_tokens: u32, align: u32) -> u32 {
        let key = u32::try_from(self.key.len()).unwrap_or(u32::MAX);
        match self.prompt_tokens {
            Some(prompt) => {
                let blocks = prompt.saturating_sub(1) / block_tokens.max(1);
                let align = align.max(1);
                (blocks / align * align).min(key)
            }
            None => key,
        }
    }

    /// How the engine's reuse compares with the prediction, with blocks of
    /// `block_tokens` tokens for a pod whose engine blocks are `align` of
    /// them, an over-prediction of up to `tolerance` blocks counting as
    /// exact. Fails as [`Receipt::reused_blocks`] does.
    pub fn judge(
        &self,
        block_tokens: u32,
        align: u32,
        tolerance: u32,
    ) -> Result<Judged, ReceiptError> {
        let reused = self.reused_blocks(block_tokens)?;
        let expected = self
            .predicted_blocks
            .min(self.reusable_blocks(block_tokens, align));
        let outcome = if reused > expected {
            ReceiptOutcome::Under
        } else if expected - reused > tolerance {
            ReceiptOutcome::Over
        } else {
            ReceiptOutcome::Exact
        };
        Ok(Judged {
            outcome,
            expected,
            reused,
        })
    }
}

/// A receipt's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Judged {
    /// How the reuse compares with the prediction.
    pub outcome: ReceiptOutcome,
    /// The blocks the prediction promised the engine could reuse: the
    /// prediction, at most what the prompt allows.
    pub expected: u32,
    /// The blocks the engine reused.
    pub reused: u32,
}

impl Judged {
    /// Blocks predicted minus blocks reused: above 0 when the index
    /// over-predicted, below when it under-predicted.
    pub fn difference(&self) -> i64 {
        i64::from(self.expected) - i64::from(self.reused)
    }
}

/// How an engine's reuse compares with the index's prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReceiptOutcome {
    /// As predicted (within the tolerance).
    Exact,
    /// The index promised more than the engine reused: blocks it believed
    /// cached were not (events lost, evictions it never heard of).
    Over,
    /// The engine reused more than the index promised (blocks it never
    /// heard of, or a tier the gateway did not count).
    Under,
}

impl ReceiptOutcome {
    /// Every outcome, in metric order.
    pub const ALL: [ReceiptOutcome; 3] = [
        ReceiptOutcome::Exact,
        ReceiptOutcome::Over,
        ReceiptOutcome::Under,
    ];

    /// Its position in [`ReceiptOutcome::ALL`], for tables by outcome.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Its name (metrics, JSON).
    pub const fn name(self) -> &'static str {
        match self {
            ReceiptOutcome::Exact => "exact",
            ReceiptOutcome::Over => "over",
            ReceiptOutcome::Under => "under",
        }
    }
}

/// A pod's recent receipts, by outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiptCounts {
    /// As predicted.
    pub exact: u32,
    /// Over-predicted.
    pub over: u32,
    /// Under-predicted.
    pub under: u32,
}

impl ReceiptCounts {
    /// Receipts counted.
    pub fn total(&self) -> u32 {
        self.exact + self.over + self.under
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(key: usize, prompt: Option<u32>, predicted: u32, cached: u32) -> Receipt {
        Receipt {
            model: "m".into(),
            pod: "p".into(),
            key: (0..key as u64).collect(),
            prompt_tokens: prompt,
            predicted_blocks: predicted,
            cached_tokens: cached,
        }
    }

    #[test]
    fn outcomes_compare_whole_blocks() {
        let judge = |r: Receipt| r.judge(16, 1, 0).unwrap();
        // 10 blocks predicted, 160 tokens reused: exact.
        let j = judge(receipt(12, Some(200), 10, 160));
        assert_eq!((j.outcome, j.difference()), (ReceiptOutcome::Exact, 0));
        // 4 reused of 10: over by 6.
        let j = judge(receipt(12, Some(200), 10, 64));
        assert_eq!((j.outcome, j.difference()), (ReceiptOutcome::Over, 6));
        // 12 reused of 10: under by 2. A partial block counts for nothing.
        let j = judge(receipt(12, Some(200), 10, 12 * 16 + 5));
        assert_eq!((j.outcome, j.difference()), (ReceiptOutcome::Under, -2));
    }

    #[test]
    fn a_prompt_ending_on_a_block_reuses_one_block_less() {
        // 160 tokens, 10 blocks, all predicted: the engine computes the last
        // token, so it reuses 9 blocks, which is exact.
        let r = receipt(10, Some(160), 10, 144);
        assert_eq!(r.judge(16, 1, 0).unwrap().outcome, ReceiptOutcome::Exact);
        // With engine blocks of 4 of ours, it reuses 8.
        let r = receipt(10, Some(160), 8, 128);
        assert_eq!(r.judge(16, 4, 0).unwrap().outcome, ReceiptOutcome::Exact);
        // Without the prompt's length, the key's 10 blocks are the bound.
        let r = receipt(10, None, 10, 144);
        assert_eq!(r.judge(16, 1, 0).unwrap().outcome, ReceiptOutcome::Over);
        // A tolerance of one block (EAGLE drafts) takes it.
        assert_eq!(r.judge(16, 1, 1).unwrap().outcome, ReceiptOutcome::Exact);
    }

    #[test]
    fn receipts_that_cannot_be_true_are_refused() {
        assert_eq!(
            receipt(4, None, 5, 0).check(),
            Err(ReceiptError::PredictedPastKey {
                predicted: 5,
                key_blocks: 4
            })
        );
        assert_eq!(
            receipt(4, Some(60), 4, 61).check(),
            Err(ReceiptError::CachedPastPrompt {
                cached: 61,
                prompt: 60
            })
        );
        let past = receipt(4, None, 4, 5 * 16);
        assert!(past.check().is_ok());
        assert!(matches!(
            past.judge(16, 1, 0),
            Err(ReceiptError::CachedPastKey { .. })
        ));
    }
}
