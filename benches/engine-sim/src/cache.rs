//! A pod's KV cache: LRU over blocks, named by their trace ids (unique per
//! prefix).
//!
//! A request's blocks are released tail first, as vLLM frees a finished
//! request's blocks in reverse order into the queue it evicts from, and as
//! SGLang's radix cache evicts leaves first: the last block of a prompt is
//! the least recently used of its blocks and leaves first, and the prefix
//! other requests share stays longest. A cache can also release them in
//! order ([`Release::InOrder`]), so that first and middle blocks leave
//! while blocks below them stay: an order neither engine uses, and the
//! costliest for the index to follow (each removal a walk of its own), for
//! measuring that worst case and for tests that the index follows a cache
//! through any order.
//! Hits count the leading blocks present only: engines reuse a contiguous
//! cached prefix.

use std::collections::{HashMap, VecDeque};

/// The order in which a request's blocks become free, the least recently
/// used first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Release {
    /// The last block first: vLLM's and SGLang's order.
    TailFirst,
    /// The first block first.
    InOrder,
}

/// One pod's cache.
#[derive(Debug, Clone)]
pub struct Lru {
    capacity: usize,
    release: Release,
    tick: u64,
    last: HashMap<u64, u64>,
    order: VecDeque<(u64, u64)>,
}

impl Lru {
    /// An empty cache of `capacity` blocks that releases a request's blocks
    /// in the order given.
    pub fn new(capacity: usize, release: Release) -> Lru {
        Lru {
            capacity,
            release,
            tick: 0,
            last: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Leading blocks of `key` present.
    pub fn hits(&self, key: &[u64]) -> usize {
        key.iter().take_while(|b| self.last.contains_key(b)).count()
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.last.len()
    }

    /// Whether it holds no block.
    pub fn is_empty(&self) -> bool {
        self.last.is_empty()
    }

    /// The blocks held, in no particular order.
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        self.last.keys().copied()
    }

    /// Uses every block of `key` now and releases them in the cache's
    /// order, evicting the least recently released past capacity.
    /// Afterwards `new` holds the positions in `key` of the blocks that were
    /// not cached, in ascending order, and `evicted` the blocks that left,
    /// in the order they left. Returns how many of those left to make room:
    /// the rest, after them, are blocks of `key` itself, which leave only
    /// when `key` is longer than the cache.
    pub fn touch(&mut self, key: &[u64], new: &mut Vec<usize>, evicted: &mut Vec<u64>) -> usize {
        new.clear();
        evicted.clear();
        let before = self.tick;
        // The block released first is the oldest of the key's blocks.
        let n = key.len();
        for k in 0..n {
            let i = match self.release {
                Release::TailFirst => n - 1 - k,
                Release::InOrder => k,
            };
            self.tick += 1;
            if self.last.insert(key[i], self.tick).is_none() {
                new.push(i);
            }
            self.order.push_back((key[i], self.tick));
        }
        if self.release == Release::TailFirst {
            new.reverse();
        }
        let mut made_room = 0;
        while self.last.len() > self.capacity {
            let Some((b, t)) = self.order.pop_front() else {
                break;
            };
            // Stale queue entries (the block was used again later) are skipped.
            if self.last.get(&b) == Some(&t) {
                self.last.remove(&b);
                evicted.push(b);
                // Every block of `key` was used after `before`.
                made_room += usize::from(t <= before);
            }
        }
        // Keep the queue from growing without bound on hot blocks.
        if self.order.len() > 4 * self.capacity.max(1024) {
            let last = &self.last;
            self.order.retain(|(b, t)| last.get(b) == Some(t));
        }
        made_room
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(c: &mut Lru, key: &[u64]) -> (Vec<usize>, Vec<u64>, usize) {
        let (mut new, mut evicted) = (Vec::new(), Vec::new());
        let made_room = c.touch(key, &mut new, &mut evicted);
        (new, evicted, made_room)
    }

    #[test]
    fn lru_counts_leading_hits_and_evicts_oldest() {
        let mut c = Lru::new(3, Release::TailFirst);
        assert_eq!(touch(&mut c, &[1, 2]), (vec![0, 1], vec![], 0));
        assert_eq!(c.hits(&[1, 2, 3]), 2);
        assert_eq!(c.hits(&[2, 1]), 2);
        assert_eq!(c.hits(&[5, 1]), 0);
        // 2 is now the oldest and goes; 1 was cached.
        assert_eq!(touch(&mut c, &[1, 9, 8]), (vec![1, 2], vec![2], 1));
        assert_eq!(c.hits(&[2]), 0);
        assert_eq!(c.hits(&[1, 9, 8]), 3);
        // A request's blocks leave tail first: 8, 9, then 1. A key longer
        // than the cache evicts its own last blocks, after the others.
        assert_eq!(
            touch(&mut c, &[4, 5, 6, 7]),
            (vec![0, 1, 2, 3], vec![8, 9, 1, 7], 3)
        );
        assert_eq!(c.hits(&[4, 5, 6, 7]), 3);
        assert_eq!(c.hits(&[7]), 0);
        assert_eq!(c.len(), 3);
    }

    #[test]
    fn in_order_the_first_blocks_leave_first() {
        let mut c = Lru::new(3, Release::InOrder);
        assert_eq!(touch(&mut c, &[1, 2]), (vec![0, 1], vec![], 0));
        // 1 was released first, so it is the oldest and goes, though 2
        // below it stays.
        assert_eq!(touch(&mut c, &[5, 6]), (vec![0, 1], vec![1], 1));
        assert_eq!(c.hits(&[1, 2]), 0);
        assert_eq!(c.hits(&[5, 6]), 2);
        // A key longer than the cache evicts its own first blocks.
        assert_eq!(
            touch(&mut c, &[7, 8, 9, 10]),
            (vec![0, 1, 2, 3], vec![2, 5, 6, 7], 3)
        );
        assert_eq!(c.hits(&[7, 8, 9, 10]), 0);
    }
}
