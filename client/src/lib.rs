//! `prefix-client`: the library gateways embed to query a shared prefix index
//! server.
//!
//! - [`Client`]: one server. One QUIC connection with several long-lived
//!   streams, many requests in flight, a short per-call deadline (2 ms by
//!   default: a gateway routes on load alone rather than wait), reconnection
//!   with backoff in the background. Clones share the connection.
//! - [`Cluster`]: several servers, each model placed on its replica set by
//!   rendezvous hashing of its name, with failover.
//! - [`Index`]: their operations (`lookup`, `insert`, `list_engines`, ...),
//!   written once over a [`Route`] that decides where each goes: a
//!   `Client` is `Index<Server>`, a `Cluster` is `Index<ReplicaSets>`, so
//!   both have the same calls, with the same arguments and answers.
//! - [`wire`]: the protocol both ends speak, the `prefix-proto` crate
//!   (frames, messages, limits, error codes), re-exported.
//! - [`key`]: block hashing of text and token ids, the protocol's rule, so
//!   every gateway builds the same keys.
//! - [`replay`]: the JSON Lines format of `prefix-client replay`.
//! - [`compare`]: how far replicas differ (`prefix-client compare`).
//!
//! It is not a server and holds no index; `prefix-server` does. It depends
//! on the protocol crate only, not on the index.
//!
//! ```no_run
//! use prefix_client::{key, Client, ClientConfig, TlsConfig};
//! # async fn f() -> anyhow::Result<()> {
//! let tls = TlsConfig::from_files("prefix-index-data/cert.pem".as_ref(), None, None)?;
//! let client = Client::connect("127.0.0.1:7070", ClientConfig { tls, ..Default::default() }).await?;
//! let prompt = key::text_key("You are a helpful assistant. ...", key::TEXT_BLOCK_BYTES);
//! client.insert("llama-3-8b", &prompt, "pod-a").await?;
//! let found = client.lookup("llama-3-8b", &prompt, None).await?;
//! assert_eq!(found.matches[0].pod, "pod-a");
//! # Ok(()) }
//! ```

pub use prefix_proto as wire;
pub use prefix_proto::key;

mod client;
mod cluster;
pub mod compare;
mod conn;
mod error;
mod index;
pub mod pem;
pub mod replay;
mod tls;

pub use client::{Client, ClientConfig, Server, ServerAddr};
pub use cluster::{place, replicas, Cluster, ReplicaSets, ReplicaStats, Replication};
pub use error::{ClientError, ConnectError};
pub use index::{DetailResult, Index, LookupResult, Route, TiersResult, Writes};
pub use pem::{load_certs, load_key, TlsError};
pub use tls::{TlsConfig, DEFAULT_IDLE_TIMEOUT, MIN_IDLE_TIMEOUT};
