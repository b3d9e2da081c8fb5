//! The server's clock: the one place it reads the time it gives the index.

/// Milliseconds since the Unix epoch: the index's clock. Wall time, so that
/// snapshots keep entry ages across restarts.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
