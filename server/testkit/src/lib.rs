//! Helpers the workspace's tests share, each written once: byte mutators for
//! the decoders' fuzzers, test certificate authorities and role
//! certificates, and test servers (in this process, or the real binary in
//! another) with the probes tests wait on.
//!
//! A dev-dependency only (`publish = false`): nothing here is for
//! production, and helpers `unwrap` freely, as tests do. Each part is a
//! feature, so a crate's tests build no more than they use:
//!
//! - `fuzz` ([`fuzz`]): [`fuzz::Mutation`]s that flip, cut and splice a
//!   valid input, and [`fuzz::cases`], the `FUZZ_CASES` knob. Needs nothing
//!   of ours.
//! - `ops` ([`ops`]): proptest strategies for the protocol's operations
//!   ([`ops::lookup`]), which prefix-proto's fuzzers share.
//! - `tls` ([`tls`]): a [`tls::Ca`] that signs client certificates, the
//!   [`tls::Roles`] a mutual-TLS test gives its gateways, and
//!   [`tls::fingerprint`]. Needs nothing of ours.
//! - `server` ([`server`]): [`server::start`] runs a `prefix-server` in this
//!   process on `127.0.0.1:0` with its own data directory;
//!   [`server::Proc`] runs the binary, whose path only the server crate's
//!   own tests know ([`server_bin!`]); [`server::eventually`],
//!   [`server::metric`] and [`server::http_get`] wait on and read it.
//! - `vllm` ([`vllm`]): vLLM's own block extra keys for a set of requests,
//!   which the key rule's tests check against.
//! - `publisher` ([`publisher`]): the tests' fake engine, a publisher and
//!   replay socket over libzmq, and the batches it sends.
//!
//! The links above resolve with every feature on
//! (`cargo doc -p prefix-testkit --all-features`).
//!
//! ```
//! # #[cfg(feature = "fuzz")] {
//! use prefix_testkit::fuzz::{mutate, Mutation};
//!
//! let cut = mutate(vec![1, 2, 3, 4], &[Mutation::Flip(0, 0xff), Mutation::Cut(2)]);
//! assert_eq!(cut, [0xfe, 2]);
//! # }
//! ```

#[cfg(feature = "fuzz")]
pub mod fuzz;
#[cfg(feature = "ops")]
pub mod ops;
#[cfg(feature = "publisher")]
pub mod publisher;
#[cfg(feature = "server")]
pub mod server;
#[cfg(feature = "tls")]
pub mod tls;
#[cfg(feature = "vllm")]
pub mod vllm;

/// The path of the `prefix-server` binary, for [`server::Proc`].
///
/// Cargo tells only the server crate's own integration tests where its
/// binary is, at compile time (`CARGO_BIN_EXE_prefix-server`), so this
/// expands there, in the test, rather than in the kit.
#[macro_export]
macro_rules! server_bin {
    () => {
        ::std::path::Path::new(env!("CARGO_BIN_EXE_prefix-server"))
    };
}
