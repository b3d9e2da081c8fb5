//! Giving the memory a burst of engine events left free back to the
//! system.
//!
//! A backlog of engine messages (an engine that published faster than it
//! was applied, or a replay) passes through two allocators, and neither
//! returns the memory of its peak by itself:
//! - libzmq's receive queues are C++ allocations from glibc's `malloc`,
//!   whose arenas give back only a free run at their top; the free chunks
//!   inside them stay resident;
//! - mimalloc, the server's allocator, purges freed pages after a delay,
//!   but only when the thread that freed them allocates again, so an
//!   engine thread gone quiet keeps the tables and records it outgrew.
//!
//! `docs/benchmarks.md` ("Beside Dynamo's standalone service") measures
//! both. An engine thread keeps a [`Releaser`] and gives the memory back
//! through it: once its engines have been quiet for [`QUIET`] after
//! messages, and every [`BUSY_EVERY`] while messages keep coming, so a
//! backlog drained under steady traffic is given back too, and a thread
//! that reads a message now and then pays for one release a second at
//! most.

use std::time::{Duration, Instant};

/// How long an engine thread's engines are quiet before it gives back
/// what their messages left.
const QUIET: Duration = Duration::from_secs(1);
/// How often a thread that keeps reading messages gives memory back.
const BUSY_EVERY: Duration = Duration::from_secs(10);

/// Returns to the system what glibc's arenas hold free and what this
/// thread's mimalloc heap and mimalloc's arenas have freed.
fn release() {
    // SAFETY: `mi_collect` takes no pointer and has no precondition: it
    // may run on any thread at any time (on a thread whose mimalloc heap
    // was never set up, where mimalloc is not the global allocator, it
    // returns at once), and with `force` it frees and purges whatever is
    // unused now instead of after a delay.
    unsafe { libmimalloc_sys::mi_collect(true) };
    // SAFETY: `malloc_trim` takes no pointer and has no precondition; it
    // locks each arena in turn while it returns that arena's free pages.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0)
    };
}

/// One engine thread's account of when it last read messages and last
/// gave memory back.
#[derive(Debug)]
pub(crate) struct Releaser {
    /// When the thread last read a message, if it has since the last
    /// release.
    read: Option<Instant>,
    /// When it last gave memory back.
    released: Instant,
}

impl Releaser {
    pub(crate) fn new(now: Instant) -> Releaser {
        Releaser {
            read: None,
            released: now,
        }
    }

    /// The thread read messages at `now`.
    pub(crate) fn read(&mut self, now: Instant) {
        self.read = Some(now);
    }

    /// Gives memory back if messages were read since the last release and
    /// the engines have been quiet for [`QUIET`] since, or [`BUSY_EVERY`]
    /// has passed since the last release. Returns whether it did.
    pub(crate) fn look(&mut self, now: Instant) -> bool {
        let Some(last) = self.read else {
            return false;
        };
        let quiet = now.saturating_duration_since(last) >= QUIET;
        let due = now.saturating_duration_since(self.released) >= BUSY_EVERY;
        if !(quiet || due) {
            return false;
        }
        release();
        self.read = None;
        self.released = now;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_release_waits_for_quiet_after_messages_or_for_its_period() {
        let t0 = Instant::now();
        let mut r = Releaser::new(t0);
        // Nothing read: never.
        assert!(!r.look(t0 + BUSY_EVERY * 2));
        // Read, then looked at too soon.
        r.read(t0);
        assert!(!r.look(t0 + QUIET / 2));
        // Quiet long enough: once, then not again until more is read.
        assert!(r.look(t0 + QUIET));
        assert!(!r.look(t0 + QUIET * 2));
        // Reading all along: at the period, not before.
        let t1 = t0 + QUIET;
        let mut at = t1;
        while at < t1 + BUSY_EVERY {
            r.read(at);
            assert!(
                !r.look(at),
                "released while reading, {:?} after the last",
                at - t1
            );
            at += QUIET / 4;
        }
        r.read(at);
        assert!(r.look(at));
    }

    #[test]
    fn release_runs_where_mimalloc_is_not_the_allocator() {
        // This test binary allocates with glibc: the release must still
        // run (mimalloc's heap for this thread was never set up).
        let junk: Vec<Vec<u8>> = (0..64).map(|i| vec![i as u8; 64 << 10]).collect();
        drop(junk);
        release();
        release();
    }
}
