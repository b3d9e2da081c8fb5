//! `prefix-client`: the library gateways embed to query a shared prefix index.
//!
//! Placeholder crate: the connection, batching and deadlines arrive with the
//! service issue (#3). The key builders are already here, shared with the index
//! so that an embedded index and a remote one see identical keys.

pub use prefix_index::key;
