//! What a failure says about a server: down, suspect for a while, or
//! merely slow; and whether another replica may answer instead.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use super::Counters;
use crate::error::ClientError;
use crate::wire::{ErrorCode, Reply};

pub(super) fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

pub(super) fn mark_suspect(c: &Counters, epoch: Instant, suspect_for: Duration) {
    let for_ms = u64::try_from(suspect_for.as_millis()).unwrap_or(u64::MAX);
    let until = millis_since(epoch).saturating_add(for_ms);
    // Relaxed: see `Cluster::is_suspect`.
    c.suspect_until.store(until, Ordering::Relaxed);
}

/// Whether another replica may answer what this one could not.
pub(super) fn fails_over(e: &ClientError) -> bool {
    match e {
        ClientError::Timeout(_) | ClientError::Disconnected { .. } => true,
        ClientError::Server { code, .. } => *code == ErrorCode::Unavailable as u16,
        ClientError::Invalid(_) | ClientError::Protocol(_) => false,
    }
}

/// Whether the error says the server is not there (not merely slow).
pub(super) fn down(e: &ClientError) -> bool {
    match e {
        ClientError::Disconnected { .. } => true,
        ClientError::Server { code, .. } => *code == ErrorCode::Unavailable as u16,
        _ => false,
    }
}

/// A failure as the reply in its op's place.
pub(super) fn as_reply(e: &ClientError) -> Reply {
    let code = e.code().unwrap_or(ErrorCode::Unavailable);
    code.reply(e)
}
