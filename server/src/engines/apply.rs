//! One decoded batch of engine events into the index, without I/O.
//!
//! The model of an event is its LoRA adapter's name when it has one
//! (adapters are models of their own for routing), else the
//! subscription's. Events about another tier than the GPU (`medium` of
//! CPU or storage offloading) stay out of the routing view unless the
//! subscription accepts that medium; an accepted lower tier's blocks are
//! held apart from the GPU's, and detailed lookups count them after the
//! match ([`prefix_index::EngineBatch::apply_lower`]). A bad event (wrong block size, token
//! ids that do not fill its blocks, the record bound reached) is counted
//! and skipped; the rest of the batch still applies. A store's blocks
//! carry their identity (salt, multimodal items) as seeds
//! ([`super::identity`]), and each event its KV-cache group
//! ([`super::groups`]).

use prefix_events::{Batch, Event};
use prefix_index::{Applied, EngineError, EngineOp, Group, GroupKind, Index};

use super::alias::alias_of;
use super::config::BlockAliases;
use super::groups::group_of;
use super::identity::{store_seeds, Identified};
use super::Subscription;
use prefix_proto::Tier;

/// What applying one batch did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The index's counts.
    pub applied: Applied,
    /// Events applied.
    pub events: u64,
    /// Events of a medium the subscription does not route on.
    pub other_medium: u64,
    /// Events of a type this server does not know (skipped by the decoder).
    pub unknown_events: u64,
    /// Blocks stored with an identity, and those whose identity could not
    /// be told (they match no key).
    pub identity: Identified,
    /// Events refused, with the first reason (and batches whose held
    /// removals could not be taken off the tree).
    pub refused: u64,
    /// Why the first refused event was refused.
    pub first_refusal: Option<String>,
}

/// Applies `batch` to `sub`'s pod as one [`prefix_index::EngineBatch`]
/// (removals run tail first are released together), holding its engine
/// lock for the batch.
pub fn apply_batch(
    index: &Index,
    sub: &Subscription,
    engine: &prefix_index::EngineHandle,
    batch: &Batch,
    aliases: BlockAliases,
) -> Outcome {
    let mut out = Outcome {
        unknown_events: u64::from(batch.unknown_events),
        ..Outcome::default()
    };
    let mut engine = engine.lock();
    let ratio = engine.ratio();
    let mut seeds = Vec::new();
    let mut applying = index.batch(&mut engine, &sub.pod);
    for event in &batch.events {
        let mut identified = Identified::default();
        let (medium, model, group, op) = match event {
            Event::Stored(s) => {
                let group = group_of(s, sub.block_size);
                // vLLM's lower-tier placeholders carry hashes alone (no
                // tokens, block size 0): found among the records by hash.
                let placeholder = s.tokens.is_empty()
                    && s.block_size == 0
                    && matches!(sub.tier(s.medium.as_deref()), Some(Tier::Lower(_)));
                // A hybrid model's group of another block size is counted
                // as not modelled (below); the first group's is refused.
                if s.block_size != sub.block_size && group.idx == 0 && !placeholder {
                    out.refuse(format!(
                        "stored blocks of {} tokens on a subscription of {}-token blocks",
                        s.block_size, sub.block_size
                    ));
                    continue;
                }
                identified = store_seeds(s, ratio, &mut seeds);
                let op = EngineOp::Stored {
                    parent: s.parent,
                    hashes: &s.hashes,
                    tokens: &s.tokens,
                    seeds: &seeds,
                    alias: alias_of(aliases, s),
                };
                (
                    s.medium.as_deref(),
                    s.lora_name.as_deref().unwrap_or(&sub.model),
                    group,
                    op,
                )
            }
            Event::Removed(r) => {
                // A removal names its group, not the group's kind.
                let group = Group {
                    idx: r.group.unwrap_or(0),
                    kind: GroupKind::Full,
                };
                (
                    r.medium.as_deref(),
                    &*sub.model,
                    group,
                    EngineOp::Removed { hashes: &r.hashes },
                )
            }
            Event::Cleared => (None, &*sub.model, Group::PLAIN, EngineOp::Cleared),
        };
        let applied = match sub.tier(medium) {
            None => {
                out.other_medium += 1;
                continue;
            }
            Some(Tier::Primary) => applying.apply_group(group, model, op),
            // Lower tiers are modelled for group 0 (see `docs/events.md`).
            Some(Tier::Lower(t)) if group.idx == 0 => applying.apply_lower(t, model, op),
            Some(Tier::Lower(_)) => {
                if let EngineOp::Stored { hashes, .. } = op {
                    out.applied.unmodelled += hashes.len() as u64;
                }
                out.events += 1;
                continue;
            }
        };
        match applied {
            Ok(done) => {
                out.applied.add(&done);
                out.events += 1;
                out.identity.add(identified);
            }
            Err(
                e @ (EngineError::TokenCount { .. }
                | EngineError::Full { .. }
                | EngineError::Insert(_)),
            ) => out.refuse(e.to_string()),
            Err(e) => out.refuse(e.to_string()),
        }
    }
    match applying.finish() {
        Ok(done) => out.applied.add(&done),
        Err(e) => out.refuse(e.to_string()),
    }
    out
}

impl Outcome {
    fn refuse(&mut self, why: String) {
        self.refused += 1;
        self.first_refusal.get_or_insert(why);
    }
}

#[cfg(test)]
mod tests {
    use prefix_events::{Removed, Stored};
    use prefix_index::IndexConfig;
    use prefix_proto::key::token_key;

    use super::*;

    fn sub() -> Subscription {
        Subscription {
            pod: "pod-0".into(),
            model: "base".into(),
            endpoint: "tcp://127.0.0.1:1".into(),
            replay: None,
            block_size: 16,
            topic: String::new(),
            media: vec!["GPU".into()],
        }
    }

    fn stored(
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        lora: Option<&str>,
        medium: &str,
    ) -> Event {
        Event::Stored(Stored {
            block_size: 16,
            hashes,
            parent,
            tokens,
            lora_name: lora.map(Into::into),
            medium: Some(medium.into()),
            ..Default::default()
        })
    }

    #[test]
    fn adapters_are_models_and_other_tiers_stay_out() {
        let index = Index::new(IndexConfig::default());
        let s = sub();
        let spec = crate::engines::engine_spec(16, 16);
        let engine = index.engine(&s.pod, spec).unwrap();
        let tokens: Vec<u32> = (0..32).collect();
        let batch = Batch {
            ts: 0.0,
            events: vec![
                stored(vec![1, 2], None, tokens.clone(), None, "GPU"),
                stored(
                    vec![9],
                    None,
                    tokens[..16].to_vec(),
                    Some("sql-lora"),
                    "GPU",
                ),
                stored(vec![5], None, (100..116).collect(), None, "CPU"),
                Event::Removed(Removed {
                    hashes: [2].into(),
                    medium: Some("CPU".into()),
                    group: None,
                }),
                stored(vec![7], None, vec![1; 8], None, "GPU"),
            ],
            data_parallel_rank: Some(0),
            unknown_events: 1,
            bad: None,
        };
        let out = apply_batch(&index, &s, &engine, &batch, BlockAliases::None);
        assert_eq!(
            (
                out.events,
                out.other_medium,
                out.refused,
                out.unknown_events
            ),
            (2, 2, 1, 1)
        );
        let key = token_key(&tokens, 16);
        assert_eq!(
            index.lookup("base", &key, None, 0),
            [("pod-0".to_string(), 2)]
        );
        assert_eq!(
            index.lookup("sql-lora", &key, None, 0),
            [("pod-0".to_string(), 1)]
        );
        assert!(index
            .lookup(
                "base",
                &token_key(&(100..116).collect::<Vec<_>>(), 16),
                None,
                0
            )
            .is_empty());
        // A removal names no model: it finds the adapter's block.
        let batch = Batch {
            ts: 0.0,
            events: vec![Event::Removed(Removed {
                hashes: [9].into(),
                medium: Some("GPU".into()),
                group: None,
            })],
            data_parallel_rank: None,
            unknown_events: 0,
            bad: None,
        };
        assert_eq!(
            apply_batch(&index, &s, &engine, &batch, BlockAliases::None)
                .applied
                .removed,
            1
        );
        assert!(index.lookup("sql-lora", &key, None, 0).is_empty());
    }

    #[test]
    fn a_followed_lower_tier_is_counted_after_the_gpus_match() {
        let index = Index::new(IndexConfig::default());
        let s = Subscription {
            media: vec!["GPU".into(), "CPU".into()],
            ..sub()
        };
        let spec = crate::engines::engine_spec(16, 16);
        let engine = index.engine(&s.pod, spec).unwrap();
        let tokens: Vec<u32> = (0..64).collect();
        let removed = |h: u64, medium: &str| {
            Event::Removed(Removed {
                hashes: [h].into(),
                medium: Some(medium.into()),
                group: None,
            })
        };
        // vLLM's placeholder: hashes alone.
        let placeholder = Event::Stored(Stored {
            hashes: vec![4],
            medium: Some("CPU".into()),
            ..Default::default()
        });
        let batch = Batch {
            ts: 0.0,
            events: vec![
                stored(vec![1, 2, 3, 4], None, tokens.clone(), None, "GPU"),
                stored(vec![1, 2, 3], None, tokens[..48].to_vec(), None, "CPU"),
                placeholder,
                removed(4, "GPU"),
                removed(3, "GPU"),
                stored(vec![9], None, (100..116).collect(), None, "DISK"),
            ],
            data_parallel_rank: Some(0),
            unknown_events: 0,
            bad: None,
        };
        let out = apply_batch(&index, &s, &engine, &batch, BlockAliases::None);
        assert_eq!((out.events, out.other_medium, out.refused), (5, 1, 0));
        let key = token_key(&tokens, 16);
        assert_eq!(
            index.lookup("base", &key, None, 0),
            [("pod-0".to_string(), 2)]
        );
        let detail = index.reader().lookup_detail("base", &key, None, 0);
        let m = detail.matches[0];
        assert_eq!((m.blocks, m.lower), (2, 2));
    }
}
