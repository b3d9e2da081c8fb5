//! Giving the memory a burst of engine events left free back to the
//! system, once the burst is over.
//!
//! A backlog of engine messages (an engine that published faster than it
//! was applied, or a replay) passes through two allocators, and neither
//! returns the memory of its peak by itself once the process is quiet:
//! - libzmq's receive queues are C++ allocations from glibc's `malloc`,
//!   whose arenas give back only a free run at their top; the free chunks
//!   inside them stay resident (after the Mooncake trace published at
//!   once to 16 engines, about 70 MB of the server's 135);
//! - mimalloc, the server's allocator, purges freed pages after a delay,
//!   but only when the thread that freed them allocates again, so an
//!   engine thread gone quiet keeps the tables and records it outgrew
//!   (about 30 MB in the same run).
//!
//! [`release`] does both now; an engine thread calls it when it wakes
//! with nothing to read after having applied messages, so a thread busy
//! with a steady stream never pays for it (its own allocations purge as
//! they go).

/// Returns to the system what glibc's arenas hold free and what this
/// thread's mimalloc heap and mimalloc's arenas have freed.
pub(crate) fn release() {
    // SAFETY: `mi_collect` takes no pointer and has no precondition: it
    // may run on any thread at any time, and with `force` it frees and
    // purges whatever is unused now instead of after a delay.
    unsafe { libmimalloc_sys::mi_collect(true) };
    // SAFETY: `malloc_trim` takes no pointer and has no precondition; it
    // locks each arena in turn while it returns that arena's free pages.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    unsafe {
        libc::malloc_trim(0)
    };
}
