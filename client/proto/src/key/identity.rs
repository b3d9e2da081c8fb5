//! Block identity: what besides its token ids makes a block the block an
//! engine will reuse.
//!
//! vLLM hashes each block with *extra keys* beside its tokens: the LoRA
//! adapter, the multimodal items (images, audio) whose placeholder tokens
//! overlap the block, the request's cache salt on its first block, and a
//! digest of the block's prompt embeddings. Two blocks with the same tokens
//! and different extra keys are different blocks, and so is every block
//! after them. The placeholder tokens of every image are the same ids, so
//! tokens alone cannot tell two images apart, and a salted tenant's cache
//! must never answer an unsalted key.
//!
//! The rule (`docs/protocol.md`, "Keys"): a block's extra keys, LoRA left
//! out (an adapter is its own model namespace), are encoded in vLLM's order
//! as [`ExtraKey`]s; their xxh3-64 is the block's **identity seed**, and the
//! block's hash is the xxh3-64 of its token bytes *with that seed*. A block
//! without extra keys has seed 0, and xxh3-64 with seed 0 is plain xxh3-64:
//! plain keys are unchanged.
//!
//! Gateways describe a request's identity as an [`Identity`] (its cache
//! salt, its multimodal items as token ranges, its prompt-embeds digests);
//! [`Identity::block_seeds`] gives each block's seed as vLLM's
//! `generate_block_hash_extra_keys` gives its extra keys. The server folds
//! the `extra_keys` of an engine's events into the same seeds.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed, Xxh3Default};

/// One extra key of a block, as the identity rule encodes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtraKey<'a> {
    /// A multimodal item overlapping the block: its identifier and where it
    /// starts, in tokens from the block's first token (negative when it
    /// started in an earlier block).
    Mm {
        /// The item's identifier: vLLM's item hash, or the
        /// `multi_modal_uuids` entry the request gave.
        identifier: &'a [u8],
        /// The item's offset relative to the block's start.
        offset: i64,
    },
    /// The request's cache salt (first block only).
    CacheSalt(&'a [u8]),
    /// The digest of the block's prompt embeddings (vLLM: SHA-256).
    PromptEmbeds(&'a [u8]),
}

impl ExtraKey<'_> {
    /// Feeds this key's encoding to `h`: a tag byte, the length of its
    /// bytes as u32 little-endian, the bytes, and for an item its offset as
    /// i64 little-endian.
    fn encode(&self, h: &mut Xxh3Default) {
        let (tag, bytes) = match *self {
            ExtraKey::Mm { identifier, .. } => (1u8, identifier),
            ExtraKey::CacheSalt(s) => (2, s),
            ExtraKey::PromptEmbeds(d) => (3, d),
        };
        h.update(&[tag]);
        // Lengths past u32 are cut; no identifier, salt or digest is that long.
        h.update(&(bytes.len() as u32).to_le_bytes());
        h.update(bytes);
        if let ExtraKey::Mm { offset, .. } = *self {
            h.update(&offset.to_le_bytes());
        }
    }
}

/// The identity seed of a block with `keys` (in vLLM's order: multimodal
/// items, cache salt, prompt-embeds digest): 0 when there are none.
pub fn identity_seed<'a>(keys: impl IntoIterator<Item = ExtraKey<'a>>) -> u64 {
    let mut h = Xxh3Default::new();
    let mut any = false;
    for k in keys {
        k.encode(&mut h);
        any = true;
    }
    if any {
        h.digest()
    } else {
        0
    }
}

/// The seed of a block whose identity cannot be told exactly (an engine
/// block that is several of ours and holds a multimodal item, say): no
/// gateway key holds it, so such a block never matches. It is the identity
/// seed of an encoding no [`ExtraKey`] produces (tag 0xff).
pub fn unmatched_seed() -> u64 {
    let mut h = Xxh3Default::new();
    h.update(&[0xff]);
    h.digest()
}

/// The hash of one block of token ids with identity seed `seed`: xxh3-64 of
/// the ids as 4 little-endian bytes each, seeded (seed 0: the plain hash,
/// [`hash_token_block`](super::hash_token_block)).
#[inline]
pub fn hash_token_block_seeded(block: &[u32], seed: u64) -> u64 {
    // One body for both, called through engines' function pointers: the
    // plain hash is not a call deeper.
    super::with_token_bytes(block, |bytes| match seed {
        0 => xxh3_64(bytes),
        s => xxh3_64_with_seed(bytes, s),
    })
}

/// A multimodal item of a request, in token positions: the placeholder
/// tokens `offset .. offset + length` stand for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmItem {
    /// What the gateway passes to vLLM as the item's `multi_modal_uuids`
    /// entry, or vLLM's own hash of the item.
    pub identifier: String,
    /// The position of its first placeholder token in the prompt.
    pub offset: u32,
    /// How many placeholder tokens it has.
    pub length: u32,
}

impl fmt::Display for MmItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.identifier, self.offset, self.length)
    }
}

/// `IDENTIFIER:OFFSET:LENGTH`; the identifier may itself hold colons.
impl FromStr for MmItem {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("a multimodal item is IDENTIFIER:OFFSET:LENGTH, not {s:?}");
        let mut parts = s.rsplitn(3, ':');
        let length = parts.next().ok_or_else(bad)?;
        let offset = parts.next().ok_or_else(bad)?;
        let identifier = parts.next().filter(|i| !i.is_empty()).ok_or_else(bad)?;
        Ok(MmItem {
            identifier: identifier.into(),
            offset: offset.parse().map_err(|_| bad())?,
            length: length.parse().map_err(|_| bad())?,
        })
    }
}

/// What besides its token ids identifies a request's blocks, as a gateway
/// knows it. The default (no salt, no items, no embeddings) is a plain
/// request, whose key is the plain token key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    /// The request's `cache_salt`: enters the first block only, and so
    /// every block's path. An empty salt is no salt (as in vLLM).
    pub cache_salt: Option<String>,
    /// The request's multimodal items; any order (they are taken by
    /// offset, as vLLM takes them).
    pub mm_items: Vec<MmItem>,
    /// With prompt embeddings: the digest of each block's embeddings, as
    /// vLLM computes it (SHA-256 of the block's tensor bytes). The key
    /// stops after the last block with a digest.
    pub prompt_embeds: Option<Vec<Vec<u8>>>,
}

impl Identity {
    /// Whether this is a plain request (every block's seed is 0).
    pub fn is_plain(&self) -> bool {
        self.cache_salt.as_deref().is_none_or(str::is_empty)
            && self.mm_items.is_empty()
            && self.prompt_embeds.is_none()
    }

    /// The identity seed of each of the first `blocks` blocks of
    /// `block_tokens` tokens (fewer when prompt-embeds digests run out).
    ///
    /// The items overlapping each block are found as vLLM's
    /// `_gen_mm_extra_hash_keys` finds them, walking the items by offset
    /// with one cursor over the whole prompt: an item is the block's when
    /// it starts before the block ends and ends after it starts; the cursor
    /// passes an item once a block reaches its end, and a block's walk
    /// stops at an item that runs past the block.
    pub fn block_seeds(&self, blocks: usize, block_tokens: usize) -> Vec<u64> {
        let mut items: Vec<&MmItem> = self.mm_items.iter().collect();
        items.sort_by_key(|i| i.offset);
        let salt = self.cache_salt.as_deref().filter(|s| !s.is_empty());
        let blocks = match &self.prompt_embeds {
            Some(d) => blocks.min(d.len()),
            None => blocks,
        };
        let bt = block_tokens as u64;
        let mut next = 0;
        let mut keys: Vec<ExtraKey<'_>> = Vec::new();
        (0..blocks as u64)
            .map(|b| {
                let (start, end) = (b * bt, (b + 1) * bt);
                keys.clear();
                // vLLM looks no further once the last item ends before the
                // block starts (its cursor then stays where it was).
                let past_all = items
                    .last()
                    .is_none_or(|l| u64::from(l.offset) + u64::from(l.length) <= start);
                while !past_all && next < items.len() {
                    let it = items[next];
                    let (offset, stop) = (
                        u64::from(it.offset),
                        u64::from(it.offset) + u64::from(it.length),
                    );
                    if end <= offset {
                        break;
                    }
                    if start >= stop {
                        next += 1;
                        continue;
                    }
                    keys.push(ExtraKey::Mm {
                        identifier: it.identifier.as_bytes(),
                        offset: offset as i64 - start as i64,
                    });
                    if end >= stop {
                        next += 1;
                    } else {
                        break;
                    }
                }
                if let (0, Some(s)) = (start, salt) {
                    keys.push(ExtraKey::CacheSalt(s.as_bytes()));
                }
                if let Some(d) = &self.prompt_embeds {
                    keys.push(ExtraKey::PromptEmbeds(&d[b as usize]));
                }
                identity_seed(keys.iter().copied())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::super::{token_key, token_key_with};
    use super::*;

    fn item(id: &str, offset: u32, length: u32) -> MmItem {
        MmItem {
            identifier: id.into(),
            offset,
            length,
        }
    }

    fn salted(salt: &str) -> Identity {
        Identity {
            cache_salt: Some(salt.into()),
            ..Identity::default()
        }
    }

    /// Vectors computed with the Python `xxhash` package from the rule as
    /// `docs/protocol.md` states it (tag, u32 LE length, bytes, i64 LE
    /// offset; `xxh3_64_intdigest(block, seed=...)`).
    #[test]
    fn matches_independent_vectors() {
        let tokens: Vec<u32> = (0..32).collect();
        let salt = identity_seed([ExtraKey::CacheSalt(b"tenant-a")]);
        assert_eq!(salt, 0x3b49_0f35_e06e_9357);
        assert_eq!(
            token_key_with(&tokens, 16, &salted("tenant-a"))[0],
            0xac64_a7d7_a02b_4a1e
        );
        let image = Identity {
            mm_items: vec![item("img-a", 8, 16)],
            ..Identity::default()
        };
        assert_eq!(
            image.block_seeds(2, 16),
            vec![0x196e_8c42_8a63_77dc, 0xf508_2003_2176_ce30]
        );
        assert_eq!(
            token_key_with(&tokens, 16, &image),
            vec![0xa281_ce7b_d569_058d, 0x06de_7ad1_2d1c_f9ac]
        );
        let both = Identity {
            cache_salt: Some("tenant-a".into()),
            ..image
        };
        assert_eq!(token_key_with(&tokens, 16, &both)[0], 0xd407_25c8_4868_8234);
        assert_eq!(unmatched_seed(), 0xd6bc_ec3c_6b29_d72e);
    }

    #[test]
    fn a_plain_identity_is_the_plain_key() {
        let tokens: Vec<u32> = (0..100).collect();
        assert_eq!(
            token_key_with(&tokens, 16, &Identity::default()),
            token_key(&tokens, 16)
        );
        // vLLM takes an empty salt as none.
        assert_eq!(
            token_key_with(&tokens, 16, &salted("")),
            token_key(&tokens, 16)
        );
        assert!(token_key_with(&tokens, 0, &salted("s")).is_empty());
    }

    #[test]
    fn a_salt_changes_the_first_block_only() {
        let tokens: Vec<u32> = (0..64).collect();
        let plain = token_key(&tokens, 16);
        let a = token_key_with(&tokens, 16, &salted("a"));
        let b = token_key_with(&tokens, 16, &salted("b"));
        assert_ne!(a[0], plain[0]);
        assert_ne!(a[0], b[0]);
        // Later blocks differ by their path, not their hash.
        assert_eq!(a[1..], plain[1..]);
    }

    #[test]
    fn items_enter_every_block_they_overlap_with_their_relative_offset() {
        let id = Identity {
            mm_items: vec![item("img", 32, 64)],
            ..Identity::default()
        };
        let mm = |offset| {
            identity_seed([ExtraKey::Mm {
                identifier: b"img",
                offset,
            }])
        };
        assert_eq!(
            id.block_seeds(8, 16),
            vec![0, 0, mm(0), mm(-16), mm(-32), mm(-48), 0, 0]
        );
        // Two items in one block, in offset order whatever the given order.
        let two = Identity {
            mm_items: vec![item("b", 24, 6), item("a", 18, 4)],
            ..Identity::default()
        };
        let both = identity_seed([
            ExtraKey::Mm {
                identifier: b"a",
                offset: 2,
            },
            ExtraKey::Mm {
                identifier: b"b",
                offset: 8,
            },
        ]);
        assert_eq!(two.block_seeds(3, 16), vec![0, both, 0]);
        // An item ending exactly at a block's end is not in the next one.
        let edge = Identity {
            mm_items: vec![item("e", 16, 16)],
            ..Identity::default()
        };
        assert_eq!(edge.block_seeds(3, 16)[2], 0);
        assert_ne!(edge.block_seeds(3, 16)[1], 0);
    }

    #[test]
    fn prompt_embeds_digests_bound_the_key() {
        let tokens: Vec<u32> = (0..64).collect();
        let id = Identity {
            prompt_embeds: Some(vec![vec![1; 32], vec![2; 32]]),
            ..Identity::default()
        };
        let key = token_key_with(&tokens, 16, &id);
        assert_eq!(key.len(), 2);
        assert_ne!(key[..], token_key(&tokens, 16)[..2]);
    }

    #[test]
    fn items_parse_from_the_command_line_form() {
        assert_eq!(
            "sha256:abc:3:40".parse::<MmItem>(),
            Ok(item("sha256:abc", 3, 40))
        );
        assert_eq!(item("x:y", 1, 2).to_string(), "x:y:1:2");
        for bad in ["", "a:1", ":1:2", "a:x:2", "a:1:-2"] {
            assert!(bad.parse::<MmItem>().is_err(), "{bad}");
        }
    }
}
