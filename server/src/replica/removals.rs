//! The pods this server removed lately, and when: what keeps repair from
//! copying back, from a peer that missed a removal, entries written before
//! it.
//!
//! A removal is kept for one TTL: an entry written before it has expired
//! everywhere by then. At most `max` are kept (four times `--max-pods`, as
//! the server sets it): past it, those older than a TTL go, then the older
//! half, in one pass each time (so a flood of removals costs bounded memory
//! and amortised constant time, and at worst lets repair copy a stale entry,
//! which then expires by its TTL).

use std::collections::HashMap;

use parking_lot::Mutex;

/// Pod removals by time.
#[derive(Debug)]
pub struct Removals {
    /// Pod name to when it was last removed (ms since the epoch).
    at: Mutex<HashMap<String, u64>>,
    /// Most kept.
    max: usize,
    /// How long one is kept, in ms (the index's TTL).
    ttl_ms: u64,
}

impl Default for Removals {
    /// As the default index configuration sets it.
    fn default() -> Removals {
        let d = prefix_index::IndexConfig::default();
        Removals::for_index(&d)
    }
}

impl Removals {
    /// As a server of `index`'s configuration keeps them: at most four times
    /// `max_pods`, each for the TTL.
    pub fn for_index(index: &prefix_index::IndexConfig) -> Removals {
        let max = (index.max_pods as usize).saturating_mul(4);
        Removals::new(max, index.ttl.as_millis() as u64)
    }

    /// Keeping at most `max` removals, each for `ttl_ms`.
    pub fn new(max: usize, ttl_ms: u64) -> Removals {
        Removals {
            at: Mutex::default(),
            max: max.max(1),
            ttl_ms,
        }
    }

    /// `pod` was removed at `now`.
    pub fn record(&self, pod: &str, now: u64) {
        let mut at = self.at.lock();
        if at.len() >= self.max && !at.contains_key(pod) {
            let ttl = self.ttl_ms;
            at.retain(|_, &mut t| now.saturating_sub(t) <= ttl);
            if at.len() >= self.max {
                let mut times: Vec<u64> = at.values().copied().collect();
                let mid = times.len() / 2;
                let (_, &mut median, _) = times.select_nth_unstable(mid);
                at.retain(|_, &mut t| t > median);
            }
        }
        at.insert(pod.into(), now);
    }

    /// Keeps a removal of `pod` at `at` a peer made, unless a later one is
    /// kept.
    pub fn learn(&self, pod: &str, at: u64) {
        if !self.at_or_after(pod, at) {
            self.record(pod, at);
        }
    }

    /// Whether a removal of `pod` at `at` or later is kept.
    pub fn at_or_after(&self, pod: &str, at: u64) -> bool {
        self.at.lock().get(pod).is_some_and(|&t| t >= at)
    }

    /// Whether `pod` was removed here after `written` (so an entry written
    /// then is stale).
    pub fn after(&self, pod: &str, written: u64) -> bool {
        self.at.lock().get(pod).is_some_and(|&t| t > written)
    }

    /// Every removal kept, as (pod, when): what a peer applies where it
    /// missed them.
    pub fn recent(&self) -> Vec<(String, u64)> {
        self.at
            .lock()
            .iter()
            .map(|(pod, &t)| (pod.clone(), t))
            .collect()
    }

    /// Forgets removals older than a TTL at `now`.
    pub fn prune(&self, now: u64) {
        let ttl = self.ttl_ms;
        self.at
            .lock()
            .retain(|_, &mut t| now.saturating_sub(t) <= ttl);
    }

    /// Removals kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.at.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removal_outdates_entries_written_before_it_for_one_ttl() {
        let r = Removals::new(10, 60_000);
        r.record("p", 1_000);
        assert!(r.after("p", 999));
        assert!(!r.after("p", 1_001), "written again after the removal");
        assert!(!r.after("q", 0));
        r.prune(1_000 + 60_000);
        assert!(r.after("p", 999));
        r.prune(1_000 + 60_001);
        assert!(!r.after("p", 999), "forgotten after a TTL");
    }

    #[test]
    fn a_flood_of_removals_keeps_at_most_the_bound_and_the_newest() {
        let r = Removals::new(100, u64::MAX);
        for i in 0..10_000u64 {
            r.record(&format!("p{i}"), i);
        }
        assert!(r.len() <= 100, "{}", r.len());
        assert!(r.after("p9999", 9_998), "the newest is kept");
        assert!(!r.after("p0", 0), "the oldest went");
    }
}
