//! `engine-sim`: a simulated inference engine, the one the workspace's
//! benchmarks, load tester and tests play vLLM with.
//!
//! A trace names each block of a request by an id, unique per prefix (as
//! the Mooncake trace's `hash_ids` are). The simulation makes each id one
//! engine block of [`BLOCK_TOKENS`] token ids ([`block_tokens`]), names it
//! by an engine hash chained over its parent's hash and its tokens as
//! vLLM's are ([`engine_hash`], [`Hashes`]), keeps each pod's KV cache as
//! an LRU of blocks that frees a request's blocks tail first, as vLLM and
//! SGLang do, or in order ([`Lru`], [`Release`]), and turns each request a
//! pod serves into the batch of KV events the engine publishes for it
//! ([`Pods::serve`], [`Step`]), in vLLM's msgpack ([`Step::encode`],
//! through `prefix_events::encode`).
//!
//! It is not an engine model beyond that: no scheduler, no preemption, no
//! timing. Equal inputs give equal hashes, events and evictions on every
//! run and every machine, so figures made from them compare.
//!
//! # Example
//!
//! ```
//! use engine_sim::{Pods, Release};
//! use prefix_events::Event;
//!
//! let mut pods = Pods::new(1, 3, Release::TailFirst);
//! let first = pods.serve(0, &[10, 11]);
//! assert_eq!(first.stored_blocks(), 2);
//! // Block 10 is cached; 12 needs room, and request 1's tail (11) leaves.
//! let second = pods.serve(0, &[10, 12, 13]);
//! assert!(matches!(&second.events[0], Event::Removed(r) if r.hashes[..] == [pods.hash(11).unwrap()]));
//! assert_eq!((second.removed_blocks(), second.stored_blocks()), (1, 2));
//! ```

mod block;
mod cache;
mod pods;
#[cfg(feature = "zmq")]
pub mod sockets;

pub use block::{block_tokens, chain_hashes, engine_hash, request_tokens, Hashes, BLOCK_TOKENS};
pub use cache::{Lru, Release};
pub use pods::{Pods, Step};
