//! Blocks: their tokens and their engine hashes.
//!
//! Trace block `id` is one engine block of [`BLOCK_TOKENS`] token ids, a
//! fixed function of the id and the token's place in the block (splitmix64
//! of both, below a Llama 3 vocabulary), so equal ids give equal tokens. A
//! block's engine hash chains its parent's engine hash with its tokens, as
//! vLLM's does (`hash_block_tokens`, with xxh3 for sha256): xxh3 of the
//! tokens' little-endian bytes, seeded with the parent's hash, or at the
//! first block with [`NONE_HASH`] (as vLLM's `NONE_HASH` starts every
//! chain). The index never computes these hashes; it only needs them to be
//! a function of the prefix.

use std::collections::HashMap;

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Tokens per engine block: vLLM's default `--block-size`, and the
/// protocol's token block.
pub const BLOCK_TOKENS: usize = 16;

/// Token ids are below this, the size of a Llama 3 vocabulary, so their
/// msgpack forms (1, 3 and 5 bytes) mix as real ones do.
const VOCAB: u64 = 128_256;

/// The engine hash of the empty prefix: the seed of every chain (the low 8
/// bytes of vLLM's `NONE_HASH` under `sha256_cbor`).
const NONE_HASH: u64 = 0x9bd9_6a48_5ad8_4efd;

/// The [`BLOCK_TOKENS`] token ids of trace block `id`.
pub fn block_tokens(id: u64) -> [u32; BLOCK_TOKENS] {
    let mut out = [0u32; BLOCK_TOKENS];
    for (place, t) in out.iter_mut().enumerate() {
        // splitmix64 of (id, place): equal ids give equal tokens.
        let mut z = (id << 4 | place as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        // The remainder is below VOCAB, which fits in a u32.
        *t = ((z ^ (z >> 31)) % VOCAB) as u32;
    }
    out
}

/// The token ids of a whole request, block after block.
pub fn request_tokens(ids: &[u64]) -> Vec<u32> {
    ids.iter().flat_map(|&id| block_tokens(id)).collect()
}

/// An engine's hash of a block of `tokens` (any number of them) whose
/// parent block's hash is `parent` (`None` for the first block).
pub fn engine_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    // 64 ids (256 bytes) on the stack covers every common block size.
    let mut stack = [0u8; 256];
    let mut heap;
    let bytes: &mut [u8] = match tokens.len() * 4 {
        n if n <= stack.len() => &mut stack[..n],
        n => {
            heap = vec![0u8; n];
            &mut heap
        }
    };
    for (b, t) in bytes.chunks_exact_mut(4).zip(tokens) {
        b.copy_from_slice(&t.to_le_bytes());
    }
    xxh3_64_with_seed(bytes, parent.unwrap_or(NONE_HASH))
}

/// The engine hashes of each whole block of `block` tokens of `tokens`,
/// chained from the first: what an engine reports for a prompt.
pub fn chain_hashes(tokens: &[u32], block: usize) -> Vec<u64> {
    let mut parent = None;
    tokens
        .chunks_exact(block.max(1))
        .map(|c| {
            let h = engine_hash(parent, c);
            parent = Some(h);
            h
        })
        .collect()
}

/// The engine hashes of trace blocks, each computed once. Ids are unique
/// per prefix (a block's parent is the same wherever its id appears), so a
/// block's hash is a function of its id.
#[derive(Debug, Clone, Default)]
pub struct Hashes {
    by_id: HashMap<u64, u64>,
}

impl Hashes {
    /// The engine hashes of `key`'s blocks, into `out`.
    pub fn of_key(&mut self, key: &[u64], out: &mut Vec<u64>) {
        out.clear();
        let mut parent = None;
        for &id in key {
            let h = *self
                .by_id
                .entry(id)
                .or_insert_with(|| engine_hash(parent, &block_tokens(id)));
            out.push(h);
            parent = Some(h);
        }
    }

    /// The engine hash of block `id`, if a key holding it was hashed.
    pub fn of(&self, id: u64) -> Option<u64> {
        self.by_id.get(&id).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_ids_give_equal_tokens_and_chains() {
        assert_eq!(block_tokens(7), block_tokens(7));
        assert_ne!(block_tokens(7), block_tokens(8));
        assert!(block_tokens(7).iter().all(|&t| u64::from(t) < VOCAB));
        assert_eq!(request_tokens(&[7])[..], request_tokens(&[7, 8])[..16]);
        // The engine's hash depends on the parent, and only through it.
        let t = block_tokens(8);
        assert_ne!(engine_hash(None, &t), engine_hash(Some(1), &t));
        let mut hashes = Hashes::default();
        let mut h = Vec::new();
        hashes.of_key(&[7, 8], &mut h);
        assert_eq!(h[1], engine_hash(Some(h[0]), &t));
        assert_eq!(hashes.of(8), Some(h[1]));
        assert_eq!(chain_hashes(&request_tokens(&[7, 8]), BLOCK_TOKENS), h);
        assert_eq!(chain_hashes(&request_tokens(&[7, 8]), 8).len(), 4);
    }

    /// The tokens and hashes the benchmarks' figures were made with: a
    /// change here changes every event and every figure.
    #[test]
    fn tokens_and_hashes_are_the_ones_figures_were_made_with() {
        assert_eq!(block_tokens(1)[..4], [77_831, 10_083, 86_578, 76_356]);
        assert_eq!(engine_hash(None, &block_tokens(1)), 0xd7a6_29b4_50f2_9dee);
        assert_eq!(
            engine_hash(Some(5), &block_tokens(2)),
            0x9c44_07b8_3b35_5533
        );
    }
}
