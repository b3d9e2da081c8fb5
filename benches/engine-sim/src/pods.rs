//! Pods serving requests: each an engine with an LRU cache, publishing one
//! batch of KV events per request.
//!
//! **Events.** When a request's blocks enter a pod's cache, the blocks that
//! were not cached are stored: each run of consecutive ones is one
//! `BlockStored` whose parent is the block before it (with caches that
//! release tail first, a request's uncached blocks are one run after its
//! cached prefix). Each block the cache evicts is one `BlockRemoved`
//! (vLLM's GPU pool removes one block per event). A batch holds, in order,
//! the removals of the blocks evicted to make room (vLLM evicts when it
//! allocates, before it caches the new blocks), the stores, and then the
//! removals of the request's own blocks that did not fit (only when it is
//! longer than the cache, which a real engine would refuse). Every event
//! is on the `"GPU"` medium, in blocks of [`BLOCK_TOKENS`] tokens.

use prefix_events::encode::{encode_batch_into, Layout};
use prefix_events::{Batch, Event, Removed, Stored};

use crate::block::{block_tokens, Hashes, BLOCK_TOKENS};
use crate::cache::{Lru, Release};

/// What one engine publishes for one request: a batch of events.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The pod (engine) that served the request.
    pub pod: usize,
    /// Its events, in the order the engine publishes them.
    pub events: Vec<Event>,
}

impl Step {
    /// Engine blocks stored.
    pub fn stored_blocks(&self) -> u64 {
        self.blocks(true)
    }

    /// Engine blocks removed.
    pub fn removed_blocks(&self) -> u64 {
        self.blocks(false)
    }

    /// Engine blocks the step's stores (`stored`) or its removals name.
    fn blocks(&self, stored: bool) -> u64 {
        let named = |e: &Event| match e {
            Event::Stored(s) if stored => s.hashes.len() as u64,
            Event::Removed(r) if !stored => r.hashes.len() as u64,
            _ => 0,
        };
        self.events.iter().map(named).sum()
    }

    /// Block operations: blocks stored plus blocks removed.
    pub fn block_ops(&self) -> u64 {
        self.stored_blocks() + self.removed_blocks()
    }

    /// Appends the step as vLLM's msgpack batch `[ts, [event, ...], 0]`,
    /// dated `ts` (seconds since the Unix epoch), in `layout`.
    pub fn encode(&self, ts: f64, layout: Layout, out: &mut Vec<u8>) {
        let batch = Batch {
            ts,
            events: self.events.clone(),
            data_parallel_rank: Some(0),
            unknown_events: 0,
            bad: None,
        };
        encode_batch_into(&batch, layout, out);
    }
}

/// `pods` engines, each with an LRU cache, and the engine hashes of the
/// blocks they were sent.
#[derive(Debug, Clone)]
pub struct Pods {
    caches: Vec<Lru>,
    hashes: Hashes,
    key_hashes: Vec<u64>,
    new: Vec<usize>,
    evicted: Vec<u64>,
}

impl Pods {
    /// `pods` empty caches of `capacity` blocks each that release a
    /// request's blocks in the order given.
    pub fn new(pods: usize, capacity: usize, release: Release) -> Pods {
        Pods::from_caches((0..pods).map(|_| Lru::new(capacity, release)).collect())
    }

    /// Pods with the caches given, one each (of any capacity and order).
    pub fn from_caches(caches: Vec<Lru>) -> Pods {
        Pods {
            caches,
            hashes: Hashes::default(),
            key_hashes: Vec::new(),
            new: Vec::new(),
            evicted: Vec::new(),
        }
    }

    /// Pod `pod`'s cache.
    pub fn cache(&self, pod: usize) -> &Lru {
        &self.caches[pod]
    }

    /// The leading blocks of `key` pod `pod` holds.
    pub fn hits(&self, pod: usize, key: &[u64]) -> usize {
        self.caches[pod].hits(key)
    }

    /// The engine hash of block `id`, if any pod was sent it.
    pub fn hash(&self, id: u64) -> Option<u64> {
        self.hashes.of(id)
    }

    /// Blocks held, over every pod: the (pod, block) pairs an index holds.
    pub fn held(&self) -> usize {
        self.caches.iter().map(Lru::len).sum()
    }

    /// Each pod's held blocks, as (pod, engine hash).
    pub fn held_blocks(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        self.caches.iter().enumerate().flat_map(move |(pod, c)| {
            c.blocks()
                .filter_map(move |id| Some((pod, self.hashes.of(id)?)))
        })
    }

    /// Pod `pod` serves request `key` (trace block ids) and tells nobody:
    /// its cache changes as [`Pods::serve`]'s does.
    pub fn touch(&mut self, pod: usize, key: &[u64]) {
        self.caches[pod].touch(key, &mut self.new, &mut self.evicted);
    }

    /// Pod `pod` serves request `key` (trace block ids): its cached prefix
    /// is reused, its blocks are used (released in the cache's order),
    /// blocks are evicted least recently released first, and the step
    /// holds the events of it (see the module's docs); no event if nothing
    /// changed.
    pub fn serve(&mut self, pod: usize, key: &[u64]) -> Step {
        let made_room = self.caches[pod].touch(key, &mut self.new, &mut self.evicted);
        if !self.new.is_empty() {
            self.hashes.of_key(key, &mut self.key_hashes);
        }
        let (new, evicted) = (&self.new, &self.evicted);
        let mut events = Vec::with_capacity(evicted.len() + 1);
        // Every cached block was hashed when it entered.
        let removed = |id: &u64| {
            let hash = self.hashes.of(*id)?;
            Some(Event::Removed(Removed {
                hashes: [hash].into(),
                medium: Some("GPU".into()),
                group: None,
            }))
        };
        events.extend(evicted[..made_room].iter().filter_map(removed));
        let mut i = 0;
        while i < new.len() {
            let start = new[i];
            let mut end = start + 1;
            i += 1;
            while new.get(i) == Some(&end) {
                end += 1;
                i += 1;
            }
            events.push(Event::Stored(Stored {
                hashes: self.key_hashes[start..end].to_vec(),
                parent: start.checked_sub(1).map(|p| self.key_hashes[p]),
                tokens: key[start..end]
                    .iter()
                    .flat_map(|&id| block_tokens(id))
                    .collect(),
                block_size: BLOCK_TOKENS as u32,
                lora_name: None,
                medium: Some("GPU".into()),
                ..Default::default()
            }));
        }
        events.extend(evicted[made_room..].iter().filter_map(removed));
        Step { pod, events }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::{chain_hashes, request_tokens};
    use prefix_events::{decode_batch, DecodeLimits};

    fn stored(e: &Event) -> Option<&Stored> {
        match e {
            Event::Stored(s) => Some(s),
            _ => None,
        }
    }

    fn removed(e: &Event) -> Option<u64> {
        match e {
            Event::Removed(r) => Some(r.hashes[0]),
            _ => None,
        }
    }

    #[test]
    fn caches_reuse_prefixes_and_evict_tails_first() {
        let mut p = Pods::new(1, 4, Release::TailFirst);
        let chain = |ids: &[u64]| chain_hashes(&request_tokens(ids), BLOCK_TOKENS);
        let s = p.serve(0, &[0, 1, 2]);
        let st = stored(&s.events[0]).unwrap();
        assert_eq!((st.parent, &st.hashes), (None, &chain(&[0, 1, 2])));
        assert_eq!(st.tokens, request_tokens(&[0, 1, 2]));
        // [0, 1] cached; block 3 needs no eviction (4 blocks fit).
        let s = p.serve(0, &[0, 1, 3]);
        assert_eq!(s.events.len(), 1);
        let st = stored(&s.events[0]).unwrap();
        assert_eq!((st.parent, st.hashes.len()), (Some(chain(&[0, 1])[1]), 1));
        // [0] cached, one new block: request 0's tail (block 2) goes first,
        // before the store.
        let s = p.serve(0, &[0, 4]);
        assert_eq!(removed(&s.events[0]), Some(chain(&[0, 1, 2])[2]));
        assert!(stored(&s.events[1]).is_some());
        assert_eq!(
            (s.removed_blocks(), s.stored_blocks(), s.block_ops()),
            (1, 1, 2)
        );
        assert_eq!(p.held(), 4);
        // Nothing new, nothing evicted: no event.
        assert!(p.serve(0, &[0, 4]).events.is_empty());
        let mut held: Vec<u64> = p.held_blocks().map(|(_, h)| h).collect();
        held.sort_unstable();
        let mut want = vec![
            chain(&[0])[0],
            chain(&[0, 1])[1],
            chain(&[0, 1, 3])[2],
            chain(&[0, 4])[1],
        ];
        want.sort_unstable();
        assert_eq!(held, want);
    }

    #[test]
    fn own_blocks_that_do_not_fit_are_removed_after_the_store() {
        let mut p = Pods::new(1, 2, Release::TailFirst);
        p.serve(0, &[7]);
        let s = p.serve(0, &[1, 2, 3]);
        let kinds: Vec<bool> = s.events.iter().map(|e| stored(e).is_some()).collect();
        // Block 7 made room; then the store of 1..3; then 3, which did not fit.
        assert_eq!(kinds, [false, true, false]);
        assert_eq!(removed(&s.events[0]), p.hash(7));
        assert_eq!(removed(&s.events[2]), p.hash(3));
    }

    #[test]
    fn in_order_caches_store_runs_under_the_block_before() {
        let mut p = Pods::new(1, 3, Release::InOrder);
        p.serve(0, &[1, 2, 3]);
        // 1 leaves first; 2 and 3 stay, so serving 1..4 stores 1 alone
        // (no parent) and 4 under 3.
        p.serve(0, &[9]);
        let s = p.serve(0, &[1, 2, 3, 4]);
        let runs: Vec<(Option<u64>, usize)> = s
            .events
            .iter()
            .filter_map(stored)
            .map(|s| (s.parent, s.hashes.len()))
            .collect();
        assert_eq!(runs, [(None, 1), (p.hash(3), 1)]);
    }

    #[test]
    fn batches_decode_as_the_server_decodes_them() {
        let mut p = Pods::new(1, 3, Release::TailFirst);
        p.serve(0, &[0, 1, 2]);
        let s = p.serve(0, &[5, 6]);
        assert_eq!(s.block_ops(), 4);
        for layout in [Layout::Required, Layout::GpuPool] {
            let mut bytes = Vec::new();
            s.encode(1.5, layout, &mut bytes);
            let batch = decode_batch(&bytes, &DecodeLimits::default()).expect("decodes");
            assert_eq!(batch.ts, 1.5);
            assert_eq!(batch.data_parallel_rank, Some(0));
            // The GPU pool names each event's KV-cache group: the first,
            // of full attention.
            let expected: Vec<Event> = match layout {
                Layout::Required => s.events.clone(),
                Layout::GpuPool => s
                    .events
                    .iter()
                    .map(|e| match e.clone() {
                        Event::Stored(st) => Event::Stored(Stored {
                            group: Some(0),
                            group_kind: Some("full_attention".into()),
                            ..st
                        }),
                        Event::Removed(r) => Event::Removed(Removed {
                            group: Some(0),
                            ..r
                        }),
                        other => other,
                    })
                    .collect(),
            };
            assert_eq!(batch.events, expected);
        }
    }
}
