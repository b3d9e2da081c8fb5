//! `prefix-events`: the KV-cache events that inference engines (vLLM,
//! SGLang) publish over ZeroMQ, decoded. Bytes in, typed values out.
//!
//! An engine with KV events enabled publishes, for each scheduler step that
//! changed its prefix cache, one batch of events: blocks stored (with their
//! hashes, parent and tokens), blocks removed, or the whole cache cleared.
//! The server subscribes to each engine and keeps the shared prefix index in
//! step with them; this crate is the part of that which needs no socket:
//!
//! * [`frames`]: the multipart framing. [`parse_live`] for a PUB/SUB
//!   message (`topic`, `seq`, `payload`), [`parse_replay`] and
//!   [`replay_request`] for catching up on missed sequence numbers through
//!   the engine's ROUTER replay socket, [`parse_topic`] for llm-d's
//!   `kv@<pod>@<model>` topics.
//! * [`batch`]: the msgpack payload. [`decode_batch`] turns it into a
//!   [`Batch`] of [`Event`]s, accepting the layouts vLLM and SGLang have
//!   used over their versions, and refusing malformed or oversized input
//!   with a typed [`DecodeError`] that says where it went wrong. Limits are
//!   in [`DecodeLimits`].
//!
//! * [`encode`]: [`encode_batch`] and [`encode_batch_into`] write a batch
//!   as vLLM does (with its required fields, or every field its GPU block
//!   pool sets: [`Layout`]), for whatever plays an engine (the load tester,
//!   benchmarks, tests).
//! * [`follow`]: following one engine's stream by sequence number: a
//!   [`Follower`] turns the numbers it sees into [`Action`]s (apply, ask a
//!   replay, resync), so the socket task only moves frames and timers.
//!
//! It is not a ZeroMQ client (no sockets, no async runtime: the server moves
//! the frames), and not an index (it does not interpret hashes or count
//! copies). It recomputes no block hashes:
//! hashes are opaque `u64`s, in the engine's own hashing scheme.
//!
//! Peer input never panics here, and decoding never allocates out of
//! proportion to the payload; `tests/fuzz.rs` checks both, and
//! `tests/golden.rs` checks payloads that msgspec (the engines' encoder)
//! produced from the engines' struct definitions.
//!
//! # Example
//!
//! ```
//! use prefix_events::{decode_batch, parse_live, parse_topic, DecodeLimits, Event};
//!
//! // A live message as a SUB socket receives it (a real AllBlocksCleared
//! // batch from vLLM 0.33).
//! let seq = 40u64.to_be_bytes();
//! let payload = b"\x93\xcb\x41\xda\xc3\x62\xe5\x85\xd5\xce\x91\x81\xa4type\xb0AllBlocksCleared\x00";
//! let frames: [&[u8]; 3] = [b"kv@pod-1@Qwen/Qwen3-8B", &seq, payload];
//!
//! let live = parse_live(&frames)?;
//! assert_eq!(live.seq, 40);
//! assert_eq!(parse_topic(live.topic), Some(("pod-1", "Qwen/Qwen3-8B")));
//!
//! let batch = decode_batch(live.payload, &DecodeLimits::default())?;
//! assert_eq!(batch.events, [Event::Cleared]);
//! assert_eq!(batch.data_parallel_rank, Some(0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod batch;
pub mod encode;
pub mod follow;
pub mod frames;
mod msgpack;

pub use batch::{
    decode_batch, BadEvents, Batch, DecodeError, DecodeLimits, Event, RawExtraKey, Removed, Stored,
};
pub use encode::{encode_batch, encode_batch_into, Layout};
pub use follow::{digest, Action, Applied, Follower, HeldLimit, Resync};
pub use frames::{
    parse_live, parse_replay, parse_topic, replay_request, FrameError, Live, ReplayItem, END_SEQ,
};
