//! `prefix-client`: the library gateways embed to query a shared prefix index.
//!
//! Today it holds the wire protocol ([`wire`], shared with the server) and
//! re-exports the key builders, so an embedded index and a remote one see
//! identical keys. The connection, batching and deadlines arrive with the rest
//! of the service issue (#3).

pub use prefix_index::key;

pub mod wire;
