//! A stored block's identity from the engine's event: vLLM's `extra_keys`
//! and SGLang's `cache_salt` folded into the identity seeds of our blocks,
//! by the rule gateways build keys with (`prefix_proto::key::identity`).
//! Sans-IO: an event in, seeds out.
//!
//! - vLLM lists each block's keys untagged, in order: the LoRA name (when
//!   the event has `lora_name`; left out here, since an adapter is its own
//!   model namespace), the multimodal `(identifier, offset)` pairs, the
//!   cache salt (first block only), the prompt-embeds digest. A string
//!   after the LoRA name is the salt; bytes are the digest.
//! - SGLang namespaces its hashes by `cache_salt` and sends the salt as a
//!   field of the store: it enters the sequence's first block (a store
//!   with no parent), as vLLM's salt does.
//! - Blocks whose identity cannot be told are given a seed no gateway key
//!   has ([`unmatched_seed`]), so they never match: keys of a shape no
//!   engine sends, blocks hashed with lookahead tokens, and multimodal or
//!   prompt-embeds keys of an engine block whose size is not ours (an
//!   item's offset in the engine's block does not say which of our blocks
//!   it covers, nor does a page's). A salt is exact at any block size.

use prefix_events::{RawExtraKey, Stored};
use prefix_index::Ratio;
use prefix_proto::key::{identity_seed, unmatched_seed, ExtraKey};

/// What the fold found, counted per subscription.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Identified {
    /// Engine blocks stored with an identity (a salt, items, embeddings).
    pub blocks: u64,
    /// Engine blocks whose identity could not be told: they match no key.
    pub untold: u64,
}

impl Identified {
    /// Adds another event's counts.
    pub fn add(&mut self, o: Identified) {
        self.blocks += o.blocks;
        self.untold += o.untold;
    }
}

/// Fills `seeds` with the identity seeds of the blocks of `s` (one per
/// block of ours, or per page: [`Ratio::seeds_per_block`] per engine
/// block); leaves it empty when every block is plain, as for every
/// plain-text request.
pub fn store_seeds(s: &Stored, ratio: Ratio, seeds: &mut Vec<u64>) -> Identified {
    seeds.clear();
    let mut found = Identified::default();
    let salt = s
        .cache_salt
        .as_deref()
        .filter(|salt| !salt.is_empty() && s.parent.is_none());
    if s.extra_keys.is_empty() && salt.is_none() && !s.lookahead {
        return found;
    }
    let per = ratio.seeds_per_block();
    // Our blocks' seeds: an engine block of ours, one of several of ours (a
    // salt is its first's), or a page (a group takes its first page's).
    let ours = ratio == Ratio::Whole(1);
    let lora = s.lora_name.as_deref();
    let mut keys: Vec<ExtraKey<'_>> = Vec::new();
    for j in 0..s.hashes.len() {
        keys.clear();
        let mut told = !s.lookahead;
        let mut only_salt = true;
        let raw = s
            .extra_keys
            .get(j)
            .and_then(Option::as_deref)
            .unwrap_or(&[]);
        let skip = match (raw.first(), lora) {
            (Some(RawExtraKey::Text(t)), Some(l)) if t == l => 1,
            _ => 0,
        };
        for key in &raw[skip..] {
            keys.push(match key {
                RawExtraKey::Text(t) => ExtraKey::CacheSalt(t.as_bytes()),
                RawExtraKey::Mm { identifier, offset } => {
                    only_salt = false;
                    ExtraKey::Mm {
                        identifier,
                        offset: *offset,
                    }
                }
                RawExtraKey::Bytes(d) => {
                    only_salt = false;
                    ExtraKey::PromptEmbeds(d)
                }
                RawExtraKey::Unknown => {
                    told = false;
                    continue;
                }
            });
        }
        if let (0, Some(salt)) = (j, salt) {
            keys.push(ExtraKey::CacheSalt(salt.as_bytes()));
        }
        if !keys.is_empty() || !told {
            found.blocks += 1;
        }
        if !told || !(ours || only_salt) {
            found.untold += 1;
            seeds.extend(std::iter::repeat_n(unmatched_seed(), per));
            continue;
        }
        seeds.push(identity_seed(keys.iter().copied()));
        seeds.extend(std::iter::repeat_n(0, per - 1));
    }
    if seeds.iter().all(|&s| s == 0) {
        seeds.clear();
    }
    found
}

#[cfg(test)]
mod tests;
