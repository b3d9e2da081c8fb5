//! `prefix-server`: the QUIC service around [`prefix_index::Index`].
//!
//! Placeholder crate: the protocol, server and maintenance task arrive with the
//! service issue (#3). Until then the index is usable embedded, as a library.

pub use prefix_index::{Index, IndexConfig};
