//! `prefix-index`: the shared prefix index of an LLM inference gateway fleet.
//!
//! A gateway turns each prompt into a **key** (the hashes of its fixed-size
//! blocks, by the protocol's rule in `prefix-proto`), asks
//! [`Reader::lookup`] how many leading blocks of it each pod is believed to
//! hold in its KV cache, routes, and then calls [`Index::insert`] to record that the chosen pod now holds that prefix. This
//! crate is the index itself: no runtime, no sockets, no clock. Time comes in
//! as an argument (milliseconds), the way quinn-proto takes `now`.
//!
//! ```
//! use prefix_index::{Index, IndexConfig};
//!
//! let index = Index::new(IndexConfig::default());
//! let now = 1_700_000_000_000; // ms
//! // Two prompts: the same four-block system prompt, then their own blocks.
//! let a = [11, 12, 13, 14, 21, 22, 23];
//! let b = [11, 12, 13, 14, 31, 32];
//! index.insert("llama-3-8b", &a, "pod-a", now).unwrap();
//! index.insert("llama-3-8b", &b, "pod-b", now).unwrap();
//!
//! let reader = index.reader();
//! let found = reader.lookup("llama-3-8b", &a, None, now + 1);
//! let named: Vec<_> = found
//!     .matches
//!     .iter()
//!     .map(|m| (reader.pod_name(m.pod).unwrap(), m.blocks))
//!     .collect();
//! // pod-a holds the whole key; pod-b only the shared system prompt.
//! assert_eq!(named, [("pod-a", 7), ("pod-b", 4)]);
//! assert_eq!(found.key_blocks, 7);
//! ```
//!
//! # Data structure
//!
//! One radix tree per model over sequences of `u64` block hashes. A node holds
//! an **edge** (a run of blocks, so unshared conversation tails cost one node),
//! a set of **pod entries** (`(pod, last used)` words, `slots`), and a
//! **child table** keyed by each child's first block (`children`). A pod in a
//! node's entries holds every block from the root to the end of that node's
//! edge.
//!
//! Invariants, after every operation:
//! - `pods(node) ⊇ pods(child)`, and a pod's last-used time in a node is at
//!   least its time in any child (inserts write top-down with the same `now`);
//! - the root has an empty edge and no entries; every other edge is non-empty
//!   and siblings differ in their first block;
//! - per-pod block counts equal the sum of edge lengths of the nodes holding
//!   the pod (what capacities and `max_blocks` bound).
//!
//! # Concurrency
//!
//! **Readers** ([`Reader::lookup`]) pin a private crossbeam-epoch `Collector`
//! once, walk down with `Acquire` loads only, record the path, then read each
//! path node's entries bottom-up: a pod's answer is the depth of the deepest
//! node where its entry is visible (not expired, pod not removed). Once every
//! pod live in the pod table it reads (of any model) or every live candidate
//! has an answer, the nodes above are not read: when every pod holds the
//! whole key, only the deepest node's entries are. They take no lock, change
//! no reference count, store to no shared memory, never retry.
//!
//! **Writers** never take a global lock. Refreshing a time is a lock-free CAS on
//! the pod's word. Adding a pod to a node, adding a child, and replacing a node
//! take that node's (one-byte) lock; structural changes are copy-on-write: an
//! edge split builds an upper and a lower node, **seals** the old one (after
//! which nothing in it changes), and publishes the upper with one `Release`
//! store into the parent's slot. Sealing sets a bit in every entry word with a
//! read-modify-write, so a refresh racing with it either lands in the copy or
//! sees the bit and is redone from the root; a node with 100,000
//! children grows its table geometrically, never copying it per insert. This is
//! ROWEX (Leis et al., "The ART of Practical Synchronization", DaMoN 2016) with
//! lock-free timestamp updates.
//!
//! **Node states**: live (reachable) → sealed (being replaced or unlinked,
//! immutable) → retired (unlinked, waiting for a grace period) → freed.
//!
//! **Reclamation**: unlinked nodes, old child tables, old model and name maps,
//! rank tables and pod names are retired through the collector, by one
//! function (`Epoch::retire`). Its deferred functions only queue the object;
//! the maintenance thread frees the queue in [`Index::sweep`] /
//! [`Index::reclaim`], so a reader that happens to collect never pays for
//! freeing a subtree. A removed pod's id is reused only after two grace
//! periods (see the `pods` module).
//!
//! **In the code**, that protocol is carried by types. Every walk and every
//! change of the tree goes through a `NodeRef<'g>`: a node reference whose
//! lifetime is a pin of the index's collector (in the manner of
//! crossbeam-epoch's `Shared<'g, T>`), so whatever it reaches stays
//! allocated for `'g`; writers change a child table only through a lock
//! guard that proves the node is locked and not sealed. One walker serves
//! lookups (along a key), the sweep (post-order, resumable across pins) and
//! snapshots (pre-order). Raw pointers and `unsafe` stay in the small
//! building blocks below that (child tables, pod slots, nodes, node
//! references, reclamation, the pod registry), and every atomic, lock and
//! the collector come through one module, so loom models (`loom_tests.rs`)
//! check the slot, child-table and pod-id protocols as compiled.
//!
//! # Semantics
//!
//! - TTL: an entry unused for longer than `ttl` is invisible at once; the sweep
//!   only reclaims it.
//! - Capacity: past a pod's capacity the sweep evicts its least recently used
//!   blocks, deepest first (see the `sweep` module); `max_blocks` bounds all entries.
//! - [`Index::remove_pod`]: the pod vanishes from lookups at once.
//! - A lookup that starts after an insert returned sees it (unless expired,
//!   evicted or removed since); a lookup concurrent with writes may miss them
//!   but never reports a block that a pod was not given.

mod aliases;
mod children;
pub mod config;
mod detail;
pub mod digest;
pub mod error;
mod index;
mod named;
mod node;
mod node_ref;
mod pods;
pub mod precise;
pub mod receipts;
mod reclaim;
mod sets;
mod shared;
mod slots;
pub mod snapshot;
mod stats;
pub mod sweep;
mod sync;
mod translate;
mod tree;
mod walk;

#[cfg(all(test, loom))]
mod loom_tests;

pub use config::IndexConfig;
pub use detail::{DetailMatch, Detailed, TierMatch, Tiered};
pub use error::{EngineError, InsertError, PodError};
pub use index::{Index, Lookup, Reader};
pub use pods::PodId;
pub use precise::groups::{Group, GroupKind, MAX_LOWER_TIERS};
pub use precise::{
    Alias, Applied, Engine, EngineBatch, EngineHandle, EngineOp, EngineSpec, Ratio, PINNED,
};
pub use receipts::{Change, ReceiptRefusal, ReceiptRule, Recorded, Standing};
pub use sets::{SetError, MAX_SETS};
pub use snapshot::{RestoreSummary, Snapshot, SnapshotError, WriteSummary};
pub use stats::Stats;
pub use sweep::{SweepReport, Through};
pub use tree::Match;
