//! Keys: the block hashes of a prompt, built the same way by every gateway.
//!
//! A key is a sequence of `u64` block hashes. Each block is hashed on its own
//! with xxh3-64 (seed 0); the block's position is given by its place in the
//! tree, not mixed into its hash. A trailing partial block is dropped, because
//! inference engines reuse only full KV blocks.
//!
//! - text: the UTF-8 bytes cut into blocks of [`TEXT_BLOCK_BYTES`] bytes;
//! - tokens: blocks of [`TOKEN_BLOCK_TOKENS`] token ids, each id as 4
//!   little-endian bytes, so a 16-token block hashes 64 bytes.
//!
//! A token block may carry an identity beyond its ids (a cache salt,
//! multimodal items, prompt embeddings): its [`Identity`] seeds its hash, and
//! [`token_key_with`] builds such a request's key.
//!
//! All gateways of one model must use the same block sizes. `docs/protocol.md`
//! lists test vectors that a gateway in another language can check against.

use xxhash_rust::xxh3::xxh3_64;

mod identity;

pub use identity::{
    hash_token_block_seeded, identity_seed, unmatched_seed, ExtraKey, Identity, MmItem,
};

/// Default bytes per text block.
pub const TEXT_BLOCK_BYTES: usize = 64;
/// Default token ids per token block.
pub const TOKEN_BLOCK_TOKENS: usize = 16;

/// The hash of one block's bytes: xxh3-64 with seed 0.
#[inline]
pub fn hash_block(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// The key of a text prompt: one hash per full `block_bytes` bytes.
/// `block_bytes` of 0 gives an empty key.
pub fn text_key(text: &str, block_bytes: usize) -> Vec<u64> {
    let mut key = Vec::new();
    text_key_into(text.as_bytes(), block_bytes, &mut key);
    key
}

/// Appends the key of `bytes` to `key` (no allocation if `key` has room).
pub fn text_key_into(bytes: &[u8], block_bytes: usize, key: &mut Vec<u64>) {
    if block_bytes == 0 {
        return;
    }
    key.extend(bytes.chunks_exact(block_bytes).map(hash_block));
}

/// The key of a token-id prompt: one hash per full `block_tokens` ids.
/// `block_tokens` of 0 gives an empty key.
pub fn token_key(tokens: &[u32], block_tokens: usize) -> Vec<u64> {
    if block_tokens == 0 || block_tokens > tokens.len() {
        return Vec::new();
    }
    tokens
        .chunks_exact(block_tokens)
        .map(hash_token_block)
        .collect()
}

/// The key of a token-id prompt with an identity: as [`token_key`], each
/// block hashed with its identity seed ([`Identity::block_seeds`]). A plain
/// identity gives the plain key.
pub fn token_key_with(tokens: &[u32], block_tokens: usize, identity: &Identity) -> Vec<u64> {
    if identity.is_plain() {
        return token_key(tokens, block_tokens);
    }
    if block_tokens == 0 {
        return Vec::new();
    }
    let blocks = tokens.chunks_exact(block_tokens);
    let seeds = identity.block_seeds(blocks.len(), block_tokens);
    blocks
        .zip(seeds)
        .map(|(block, seed)| hash_token_block_seeded(block, seed))
        .collect()
}

/// The hash of one block of token ids (each id as 4 little-endian bytes).
/// The server hashes engines' stored blocks with it, so that a gateway's
/// token key walks to the blocks an engine reported.
pub fn hash_token_block(block: &[u32]) -> u64 {
    with_token_bytes(block, hash_block)
}

/// `hash` of the block's ids as 4 little-endian bytes each.
#[inline]
fn with_token_bytes(block: &[u32], hash: impl FnOnce(&[u8]) -> u64) -> u64 {
    // 64 ids (256 bytes) on the stack covers every common block size.
    let mut stack = [0u8; 256];
    let mut heap;
    let buf: &mut [u8] = match block.len() * 4 {
        n if n <= stack.len() => &mut stack[..n],
        n => {
            heap = vec![0u8; n];
            &mut heap
        }
    };
    for (out, t) in buf.chunks_exact_mut(4).zip(block) {
        out.copy_from_slice(&t.to_le_bytes());
    }
    hash(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Vectors computed with the Python `xxhash` package (an independent
    /// implementation): `xxhash.xxh3_64_intdigest(data)`.
    #[test]
    fn matches_independent_xxh3_vectors() {
        assert_eq!(hash_block(b""), 0x2D06_8005_38D3_94C2);
        let fox = "The quick brown fox jumps over the lazy dog. Pack my box with fi";
        assert_eq!(
            text_key(&format!("{}{fox}xyz", "a".repeat(64)), 64),
            vec![0x2ddd_cef0_7d26_ee8c, 0xbc3b_1760_e084_a797]
        );
        let bytes: Vec<u8> = (0u8..64).collect();
        assert_eq!(hash_block(&bytes), 0x6187_eb90_89b0_ed55);
        let llama = [
            128000, 9906, 1917, 13, 220, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1001,
        ];
        let tokens: Vec<u32> = (0..16).chain(llama).chain([7, 7, 7]).collect();
        assert_eq!(
            token_key(&tokens, 16),
            vec![0x79c2_079c_74a8_ee4d, 0xab0a_d845_cfd7_9968]
        );
    }

    #[test]
    fn text_drops_the_partial_tail_and_is_position_free() {
        let a = "a".repeat(64);
        let b = "b".repeat(64);
        let text = format!("{a}{b}{a}tail");
        let key = text_key(&text, 64);
        assert_eq!(key.len(), 3);
        assert_eq!(key[0], key[2]);
        assert_ne!(key[0], key[1]);
        assert!(text_key("short", 64).is_empty());
        assert!(text_key(&text, 0).is_empty());
    }

    #[test]
    fn tokens_hash_as_little_endian_words() {
        let tokens: Vec<u32> = (0..40).collect();
        let key = token_key(&tokens, 16);
        assert_eq!(key.len(), 2);
        let bytes: Vec<u8> = (0u32..16).flat_map(|t| t.to_le_bytes()).collect();
        assert_eq!(key[0], hash_block(&bytes));
        assert!(token_key(&tokens, 0).is_empty());
        assert!(token_key(&tokens, usize::MAX).is_empty());
    }
}
