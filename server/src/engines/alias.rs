//! Which other indexer's name an engine's stored blocks also get
//! (`--block-aliases`; `prefix_index::Alias`), decided per store event.
//! Sans-IO: an event in, an alias rule out.
//!
//! - **Dynamo**: NVIDIA Dynamo names a block by xxh3-64 of its token ids
//!   (little-endian u32s) under a seed of 1337, plus xxh3-64 of the LoRA
//!   adapter's name (seed 0) and of the cache salt (seed 1), each when
//!   given and not empty (`dynamo-kv-router` 1.6.1, `protocols.rs`
//!   `compute_block_hash_for_seq`, `dynamo-kv-hashing` `compute_salt_hash`).
//!   The salt is the store's own (SGLang's `cache_salt`, or vLLM's salt
//!   among the first block's extra keys); a store that names none passes
//!   on its parent's ([`prefix_index::Alias::Tokens`]). A store whose
//!   blocks carry any other identity (multimodal items, prompt embeddings,
//!   lookahead tokens) is not named: Dynamo's rule would give them the
//!   name of a different block.
//! - **Engine**: the engine's own block hash (SGLang's chained SHA-256,
//!   which its router computes from the prompt).

use prefix_events::{RawExtraKey, Stored};
use prefix_index::Alias;
use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::config::BlockAliases;

/// Dynamo's seed of every block hash (`XXH3_SEED`).
pub const DYNAMO_SEED: u64 = 1337;

/// The seed Dynamo hashes the blocks of a request with: its LoRA adapter
/// and cache salt folded into its base seed, 1337 (an empty name or salt is
/// none).
pub fn dynamo_seed(lora: Option<&str>, salt: Option<&str>) -> u64 {
    let mut seed = DYNAMO_SEED;
    if let Some(l) = lora.filter(|l| !l.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(l.as_bytes(), 0));
    }
    if let Some(s) = salt.filter(|s| !s.is_empty()) {
        seed = seed.wrapping_add(xxh3_64_with_seed(s.as_bytes(), 1));
    }
    seed
}

/// Dynamo's local hash of one block of token ids under `seed`.
#[cfg(test)]
fn dynamo_block_hash(tokens: &[u32], seed: u64) -> u64 {
    prefix_proto::key::hash_token_block_seeded(tokens, seed)
}

/// The name `s`'s blocks get under `aliases`.
pub fn alias_of(aliases: BlockAliases, s: &Stored) -> Alias {
    match aliases {
        BlockAliases::None => Alias::None,
        BlockAliases::Engine => Alias::EngineHash,
        BlockAliases::Dynamo => dynamo_alias(s),
    }
}

fn dynamo_alias(s: &Stored) -> Alias {
    if s.lookahead {
        return Alias::None;
    }
    let lora = s.lora_name.as_deref().filter(|l| !l.is_empty());
    let mut salt = s.cache_salt.as_deref().filter(|t| !t.is_empty());
    for (j, keys) in s.extra_keys.iter().enumerate() {
        let keys = keys.as_deref().unwrap_or(&[]);
        // vLLM lists the adapter's name first, then the block's items,
        // then (first block only) the salt, then an embeddings digest.
        let skip = match (keys.first(), lora) {
            (Some(RawExtraKey::Text(t)), Some(l)) if t == l => 1,
            _ => 0,
        };
        for key in &keys[skip..] {
            match key {
                RawExtraKey::Text(t) if j == 0 && salt.is_none() && !t.is_empty() => {
                    salt = Some(t);
                }
                RawExtraKey::Text(t) if Some(&**t) == salt => {}
                _ => return Alias::None,
            }
        }
    }
    Alias::Tokens {
        seed: dynamo_seed(lora, salt),
        salted: salt.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dynamo's own golden values (`dynamo-tokens` 1.6.1 `lib.rs` tests:
    /// blocks of 4) and vectors computed independently with the Python
    /// `xxhash` package from the rule above (`xxh3_64_intdigest`).
    #[test]
    fn matches_dynamos_goldens_and_independent_vectors() {
        assert_eq!(
            dynamo_block_hash(&[1, 2, 3, 4], DYNAMO_SEED),
            14643705804678351452
        );
        assert_eq!(
            dynamo_block_hash(&[5, 6, 7, 8], DYNAMO_SEED),
            16777012769546811212
        );
        assert_eq!(
            dynamo_block_hash(&[9, 10, 11, 12], DYNAMO_SEED),
            483935686894639516
        );
        let tokens: Vec<u32> = (0..16).collect();
        let vectors = [
            (None, None, 1337, 15310707395893867146),
            (
                Some("adapter-a"),
                None,
                8842669519798868182,
                17429507120064042683,
            ),
            (
                None,
                Some("tenant-a"),
                1948188790972764086,
                2130915519417463704,
            ),
            (
                Some("adapter-a"),
                Some("tenant-a"),
                10790858310771630931,
                6489352321440148776,
            ),
            (Some(""), Some(""), 1337, 15310707395893867146),
        ];
        for (lora, salt, seed, hash) in vectors {
            assert_eq!(dynamo_seed(lora, salt), seed, "{lora:?} {salt:?}");
            assert_eq!(dynamo_block_hash(&tokens, seed), hash, "{lora:?} {salt:?}");
        }
    }

    fn stored(extra: Vec<Option<Box<[RawExtraKey]>>>, lora: Option<&str>) -> Stored {
        Stored {
            hashes: vec![1, 2],
            parent: None,
            tokens: (0..32).collect(),
            block_size: 16,
            lora_name: lora.map(Into::into),
            medium: None,
            extra_keys: extra,
            cache_salt: None,
            lookahead: false,
            group: None,
            group_kind: None,
            sliding_window: None,
        }
    }

    #[test]
    fn a_store_is_named_by_its_adapter_and_salt_and_not_past_other_identities() {
        let plain = stored(Vec::new(), None);
        assert_eq!(
            alias_of(BlockAliases::Dynamo, &plain),
            Alias::Tokens {
                seed: 1337,
                salted: false
            }
        );
        assert_eq!(alias_of(BlockAliases::None, &plain), Alias::None);
        assert_eq!(alias_of(BlockAliases::Engine, &plain), Alias::EngineHash);
        // vLLM: the adapter's name first, then the salt on the first block.
        let text = |t: &str| RawExtraKey::Text(t.into());
        let salted = stored(
            vec![
                Some(vec![text("a"), text("tenant-a")].into()),
                Some(vec![text("a")].into()),
            ],
            Some("a"),
        );
        assert_eq!(
            alias_of(BlockAliases::Dynamo, &salted),
            Alias::Tokens {
                seed: dynamo_seed(Some("a"), Some("tenant-a")),
                salted: true
            }
        );
        // SGLang's salt field.
        let mut sglang = stored(Vec::new(), None);
        sglang.cache_salt = Some("s".into());
        assert_eq!(
            alias_of(BlockAliases::Dynamo, &sglang),
            Alias::Tokens {
                seed: dynamo_seed(None, Some("s")),
                salted: true
            }
        );
        // An image, or embeddings: not named.
        let image = stored(
            vec![Some(
                vec![RawExtraKey::Mm {
                    identifier: b"img".to_vec().into(),
                    offset: 0,
                }]
                .into(),
            )],
            None,
        );
        assert_eq!(alias_of(BlockAliases::Dynamo, &image), Alias::None);
        let mut ahead = stored(Vec::new(), None);
        ahead.lookahead = true;
        assert_eq!(alias_of(BlockAliases::Dynamo, &ahead), Alias::None);
    }
}
