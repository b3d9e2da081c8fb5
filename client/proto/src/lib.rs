//! `prefix-proto`: the `prefix-index/1` wire protocol, sans-IO.
//!
//! Bytes in, typed messages out, and back; no sockets, no runtime, no clock.
//! The server, the Rust client and the load tester's baseline all speak the
//! protocol through this crate, the way quinn speaks QUIC through
//! quinn-proto; a gateway in another language implements the same contract
//! from `docs/protocol.md`, whose test vectors the tests here check.
//!
//! - [`frame`]: the 16-byte header and [`FrameReader`], which cuts a
//!   stream's bytes into whole frames (or one typed [`FrameError`]).
//! - [`message`]: [`Request`], [`Op`], [`Response`], [`Reply`] (with the
//!   engine ops' [`Subscription`], the one description of an engine
//!   subscription, and [`EngineState`]), and [`OpKind`], the
//!   table of operations every other part derives from.
//! - [`codec`]: payloads to bytes and back, with allocation budgets.
//! - [`Limits`] and [`ErrorCode`]/[`WireError`]: what is refused, and how.
//! - [`key`]: how a prompt becomes block hashes, identical in every gateway.
//! - [`json`]: the operations and replies as JSON objects (the HTTP API's
//!   bodies, `prefix-client replay`'s lines).
//!
//! ```
//! use prefix_proto::{encode_request, FrameReader, Incoming, Kind, Limits, Op, Request};
//!
//! let mut bytes = Vec::new();
//! encode_request(7, &Request::One(Op::Ping), &mut bytes);
//! let limits = Limits::default();
//! let mut reader = FrameReader::new(Kind::Request, limits.max_frame_bytes);
//! reader.push(&bytes[..5]); // bytes arrive in any pieces
//! assert_eq!(reader.next_request(&limits), Ok(None));
//! reader.push(&bytes[5..]);
//! assert_eq!(
//!     reader.next_request(&limits),
//!     Ok(Some(Incoming::Request { id: 7, request: Request::One(Op::Ping) }))
//! );
//! ```

pub mod codec;
mod error;
pub mod frame;
mod header;
pub mod json;
pub mod key;
mod limits;
pub mod message;
mod pod_name;
mod version;

pub use codec::{
    decode_budget, decode_request, decode_response, encode_error, encode_request, encode_response,
    encode_snapshot_request, ResponseWriter, DECODE_CEILING,
};
pub use error::{ErrorCode, WireError};
pub use frame::{
    decode_header, split_frame, Frame, FrameError, FrameReader, Header, Incoming, Kind, ALPN,
    HEADER_LEN, VERSION,
};
pub use limits::{Limits, ANSWER_ROOM, MAX_FRAME_CEILING};
pub use message::{
    DigestAnswer, DigestAsk, DigestEntry, DigestLevel, EngineState, EngineStatus, Eviction, Judged,
    LookupArgs, ModelDigest, Op, OpKind, PodBlocks, PodDetail, PodTiers, PodView, Receipt,
    ReceiptCounts, ReceiptError, ReceiptOutcome, Reply, Request, Response, SampledKey,
    Subscription, SubscriptionError, Tier, TierReach, Tombstone, WireStats, MAX_SAMPLE, MAX_TAIL,
};
pub use pod_name::PodName;
