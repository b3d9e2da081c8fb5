//! The limits of one request: its frame or body, its batch and candidates,
//! and when it is heavy enough to leave the async workers.

use super::declare::{plain, settings};
use super::value::{invalid, ConfigError};
use prefix_proto::{Limits, MAX_FRAME_CEILING};

settings! {
    /// What a user may set of the request limits (see [`super::Settings`]).
    pub struct LimitSettings {
        /// Largest request payload in bytes (at most 16 MiB).
        #[arg(long, env = "PREFIX_INDEX_MAX_FRAME_BYTES")]
        max_frame_bytes: u32 = plain => limits.max_frame_bytes,
        /// Largest HTTP/JSON request body in bytes; larger ones are refused
        /// (413) before they are parsed.
        #[arg(long, env = "PREFIX_INDEX_HTTP_MAX_BODY_BYTES")]
        http_max_body_bytes: usize = plain => limits.http_max_body_bytes,
        /// Most ops in one batch.
        #[arg(long, env = "PREFIX_INDEX_MAX_BATCH")]
        max_batch: usize = plain => limits.max_batch,
        /// Most candidate pods in one lookup.
        #[arg(long, env = "PREFIX_INDEX_MAX_CANDIDATES")]
        max_candidates: usize = plain => limits.max_candidates,
        /// Frames whose keys total more blocks than this run on the blocking pool,
        /// so they do not hold up other connections.
        #[arg(long, env = "PREFIX_INDEX_INLINE_BLOCKS")]
        inline_blocks: usize = plain => limits.inline_blocks,
        /// Heavy requests (see --inline-blocks) one connection may have running
        /// at once; past it, its streams stop reading until one finishes.
        #[arg(long, env = "PREFIX_INDEX_MAX_IN_FLIGHT")]
        max_in_flight: usize = plain => limits.max_in_flight,
    }
}

/// The request limits a server enforces (the key and name limits are the
/// index's: [`prefix_index::IndexConfig`]).
#[derive(Debug, Clone, PartialEq)]
pub struct LimitsConfig {
    /// Largest request payload. Default 1 MiB (a lookup of a
    /// `max_key_blocks` key, or a batch of 64 lookups of 2,048-block keys);
    /// hard ceiling 16 MiB.
    pub max_frame_bytes: u32,
    /// Largest HTTP/JSON request body. Default 8 MiB: a lookup of the
    /// longest key, 65,536 blocks, as 1,048,576 token ids of up to six
    /// digits is under 7.4 MB of JSON; at most 64 MiB.
    pub http_max_body_bytes: usize,
    /// Most ops per batch. Default 1,024.
    pub max_batch: usize,
    /// Most candidates per lookup. Default 1,024.
    pub max_candidates: usize,
    /// Frames with more key blocks than this run on tokio's blocking pool.
    /// Default 16,384 (a few hundred microseconds of lookups).
    pub inline_blocks: usize,
    /// Heavy requests running at once per connection. Default 16: enough to
    /// keep both blocking-pool cores busy from one client, not enough for one
    /// client to queue thousands of milliseconds-long tasks.
    pub max_in_flight: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        // The protocol's defaults, which clients assume until told otherwise.
        let wire = Limits::default();
        LimitsConfig {
            max_frame_bytes: wire.max_frame_bytes,
            http_max_body_bytes: 8 << 20,
            max_batch: wire.max_batch,
            max_candidates: wire.max_candidates,
            inline_blocks: 16_384,
            max_in_flight: 16,
        }
    }
}

impl LimitsConfig {
    /// Checks every value's range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max_frame_bytes < 64 || self.max_frame_bytes > MAX_FRAME_CEILING {
            return invalid(
                "max-frame-bytes",
                &self.max_frame_bytes,
                "must be 64 to 16777216",
            );
        }
        if self.http_max_body_bytes < 1024 || self.http_max_body_bytes > 64 << 20 {
            return invalid(
                "http-max-body-bytes",
                &self.http_max_body_bytes,
                "must be 1024 to 67108864",
            );
        }
        if self.max_batch == 0 {
            return invalid("max-batch", &0, "must be at least 1");
        }
        if self.max_in_flight == 0 || self.max_in_flight > 65_536 {
            return invalid("max-in-flight", &self.max_in_flight, "must be 1 to 65536");
        }
        Ok(())
    }
}
