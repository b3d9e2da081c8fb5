//! The limits of one request: its frame or body, its batch and candidates,
//! and when it is heavy enough to leave the async workers.

use prefix_proto::{Limits, MAX_FRAME_CEILING};

use super::declare::{plain, settings};

settings! {
    /// What a user may set of the request limits (see [`super::Settings`]).
    pub struct LimitSettings => limits {
        /// Largest request payload in bytes (at most 16 MiB).
        #[arg(long)]
        // The protocol's default, which clients assume until told
        // otherwise: 1 MiB, a lookup of a `max_key_blocks` key, or a batch
        // of 64 lookups of 2,048-block keys.
        max_frame_bytes: u32 = plain => max_frame_bytes: u32 = Limits::default().max_frame_bytes,
            check 64..=MAX_FRAME_CEILING,
        /// Largest HTTP/JSON request body in bytes; larger ones are refused
        /// (413) before they are parsed.
        #[arg(long)]
        // 8 MiB: a lookup of the longest key, 65,536 blocks, as 1,048,576
        // token ids of up to six digits is under 7.4 MB of JSON.
        http_max_body_bytes: usize = plain => http_max_body_bytes: usize = 8 << 20,
            check 1024..=64 << 20,
        /// Most ops in one batch.
        #[arg(long)]
        // The protocol's default (1,024), as for the frame.
        max_batch: usize = plain => max_batch: usize = Limits::default().max_batch, check 1..,
        /// Most candidate pods in one lookup.
        #[arg(long)]
        // The protocol's default (1,024), as for the frame.
        max_candidates: usize = plain => max_candidates: usize = Limits::default().max_candidates,
        /// Frames whose keys total more blocks than this run on the blocking pool,
        /// so they do not hold up other connections.
        #[arg(long)]
        // 16,384: a few hundred microseconds of lookups.
        inline_blocks: usize = plain => inline_blocks: usize = 16_384,
        /// Heavy requests (see --inline-blocks) one connection may have running
        /// at once; past it, its streams stop reading until one finishes.
        #[arg(long)]
        // 16: enough to keep both blocking-pool cores busy from one client,
        // not enough for one client to queue thousands of milliseconds-long
        // tasks.
        max_in_flight: usize = plain => max_in_flight: usize = 16, check 1..=65_536,
    }
    /// The request limits a server enforces (the key and name limits are the
    /// index's: [`prefix_index::IndexConfig`]).
    pub struct LimitsConfig {}
}
