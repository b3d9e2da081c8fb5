//! `prefix-client`: the library gateways embed to query a shared prefix index
//! server, and the wire protocol both ends speak.
//!
//! - [`Client`]: one server. One QUIC connection with several long-lived
//!   streams, many requests in flight, a short per-call deadline (2 ms by
//!   default: a gateway routes on load alone rather than wait), reconnection
//!   with backoff in the background. Clones share the connection.
//! - [`Cluster`]: several servers, each model placed on one by rendezvous
//!   hashing of its name.
//! - [`wire`]: the sans-IO codec (frames, messages, limits, error codes).
//! - [`key`]: block hashing of text and token ids, identical to the embedded
//!   index's, so every gateway builds the same keys.
//! - [`replay`]: the JSON Lines format of `prefix-client replay`.
//!
//! It is not a server and holds no index; `prefix-server` does.
//!
//! ```no_run
//! use prefix_client::{key, Client, ClientConfig, TlsConfig};
//! # async fn f() -> anyhow::Result<()> {
//! let tls = TlsConfig::from_files("prefix-index-data/cert.pem".as_ref(), None, None)?;
//! let client = Client::connect("127.0.0.1:7070".parse()?, ClientConfig { tls, ..Default::default() }).await?;
//! let prompt = key::text_key("You are a helpful assistant. ...", key::TEXT_BLOCK_BYTES);
//! client.insert("llama-3-8b", &prompt, "pod-a").await?;
//! let found = client.lookup("llama-3-8b", &prompt, None).await?;
//! assert_eq!(found.matches[0].pod, "pod-a");
//! # Ok(()) }
//! ```

pub use prefix_index::key;

mod client;
mod cluster;
mod conn;
mod error;
mod pod_name;
pub mod replay;
mod tls;
pub mod wire;

pub use client::{Client, ClientConfig, LookupResult};
pub use cluster::{place, Cluster};
pub use error::{ClientError, ConnectError};
pub use tls::{load_certs, load_key, TlsConfig, TlsError};
