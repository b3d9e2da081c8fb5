//! The engine records of every engine-fed pod, counted against
//! `max_engine_blocks`: one shared count of records and their bytes, which
//! [`Stats`](crate::Stats) reports as `engine_blocks` and `engine_bytes`.

use super::Engine;
use crate::index::Index;
use crate::stats::Counters;

/// The shared count of engine records and its bound, as a store, a removal
/// or a restore takes and gives back room.
#[derive(Clone, Copy)]
pub(crate) struct Budget<'a> {
    counters: &'a Counters,
    max: u64,
}

impl Budget<'_> {
    /// Counts `n` records and `bytes` of them more (or fewer, when negative).
    pub(crate) fn count(self, bytes: i64, n: i64) {
        Counters::add(&self.counters.engine_records, n);
        Counters::add(&self.counters.engine_bytes, bytes);
    }

    /// Takes room for up to `n` more records under `max_engine_blocks` and
    /// returns how many fit: counted at once, so pods storing at the same
    /// time never pass the bound together. Room taken and not used goes back
    /// through [`Budget::count`].
    pub(crate) fn reserve(self, n: usize) -> u64 {
        if n == 0 {
            return 0;
        }
        Counters::add_upto(&self.counters.engine_records, n as u64, self.max)
    }

    /// Uncounts every record of `engine` (which the caller then clears).
    pub(crate) fn uncount(self, engine: &Engine) {
        for records in engine.models.values() {
            self.count(-(records.total_bytes() as i64), -(records.len() as i64));
        }
    }
}

impl Index {
    /// The engine records' shared count.
    pub(crate) fn budget(&self) -> Budget<'_> {
        Budget {
            counters: &self.sh.counters,
            max: self.sh.cfg.max_engine_blocks,
        }
    }
}
