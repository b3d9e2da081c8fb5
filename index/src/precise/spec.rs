//! How an engine's blocks map to ours: the sizes an engine is registered
//! with and the ratio between them.

use crate::error::EngineError;

/// How engine blocks map to ours.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ratio {
    /// An engine block is this many of ours (its size is a multiple of ours).
    Whole(u32),
    /// This many engine pages make one of our blocks.
    Pages(u32),
}

impl Ratio {
    /// Our blocks per engine block: an engine reuses whole blocks only, so
    /// an engine-fed pod's matches round down to a multiple of this.
    pub fn align(self) -> u32 {
        match self {
            Ratio::Whole(r) => r,
            Ratio::Pages(_) => 1,
        }
    }

    /// Identity seeds per engine block: one per block of ours in it, or
    /// one per page.
    pub fn seeds_per_block(self) -> usize {
        match self {
            Ratio::Whole(r) => r as usize,
            Ratio::Pages(_) => 1,
        }
    }

    /// The mapping between an engine's block size and ours, in tokens;
    /// refused when neither divides the other, or the ratio passes `max`
    /// ([`IndexConfig::max_block_ratio`](crate::IndexConfig::max_block_ratio)).
    pub fn new(engine_block: u32, our_block: u32, max: u32) -> Result<Ratio, EngineError> {
        let bad = || EngineError::BlockSizes {
            engine: engine_block,
            ours: our_block,
        };
        if engine_block == 0 || our_block == 0 {
            return Err(bad());
        }
        let ratio = if engine_block % our_block == 0 {
            Ratio::Whole(engine_block / our_block)
        } else if our_block % engine_block == 0 {
            Ratio::Pages(our_block / engine_block)
        } else {
            return Err(bad());
        };
        match ratio {
            Ratio::Whole(r) | Ratio::Pages(r) if r > max => Err(bad()),
            _ => Ok(ratio),
        }
    }
}

/// How an engine's blocks become ours.
#[derive(Debug, Clone, Copy)]
pub struct EngineSpec {
    /// Tokens in one engine block (vLLM: `--block-size`, 16 by default;
    /// SGLang: `--page-size`, 1 by default).
    pub engine_block: u32,
    /// Tokens in one of our blocks: the gateways' token block size.
    pub our_block: u32,
    /// Our hash of one block of `our_block` token ids with an identity
    /// seed (0: a plain block): the gateways' rule.
    pub hash: fn(&[u32], u64) -> u64,
}
