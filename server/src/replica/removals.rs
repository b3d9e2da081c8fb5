//! The pods this server removed lately, and when: what keeps repair from
//! copying back, from a peer that missed a removal, entries written before
//! it.
//!
//! A removal is kept for one TTL: an entry written before it has expired
//! everywhere by then. At most [`MAX_KEPT`] are kept; past it the oldest is
//! dropped first, so a flood of removals costs bounded memory (and at worst
//! lets repair copy a stale entry, which then expires by its TTL).

use std::collections::HashMap;

use parking_lot::Mutex;

/// Most removals kept.
pub const MAX_KEPT: usize = 65_536;

/// Pod removals by time.
#[derive(Debug, Default)]
pub struct Removals {
    /// Pod name to when it was last removed (ms since the epoch).
    at: Mutex<HashMap<String, u64>>,
}

impl Removals {
    /// `pod` was removed at `now`.
    pub fn record(&self, pod: &str, now: u64) {
        let mut at = self.at.lock();
        if at.len() >= MAX_KEPT && !at.contains_key(pod) {
            let oldest = at.iter().min_by_key(|(_, &t)| t).map(|(p, _)| p.clone());
            if let Some(p) = oldest {
                at.remove(&p);
            }
        }
        at.insert(pod.into(), now);
    }

    /// Whether `pod` was removed here after `written` (so an entry written
    /// then is stale).
    pub fn after(&self, pod: &str, written: u64) -> bool {
        self.at.lock().get(pod).is_some_and(|&t| t > written)
    }

    /// Forgets removals older than `ttl_ms` at `now`.
    pub fn prune(&self, now: u64, ttl_ms: u64) {
        self.at
            .lock()
            .retain(|_, &mut t| now.saturating_sub(t) <= ttl_ms);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removal_outdates_entries_written_before_it_for_one_ttl() {
        let r = Removals::default();
        r.record("p", 1_000);
        assert!(r.after("p", 999));
        assert!(!r.after("p", 1_001), "written again after the removal");
        assert!(!r.after("q", 0));
        r.prune(1_000 + 60_000, 60_000);
        assert!(r.after("p", 999));
        r.prune(1_000 + 60_001, 60_000);
        assert!(!r.after("p", 999), "forgotten after a TTL");
    }
}
