//! The server's integration tests as one test binary: each file of this
//! folder is one of its modules, so that the server and its dependencies are
//! linked into one test executable rather than one a file. `fleet.rs` is
//! the exception, a binary of its own: it counts its process's threads and
//! the heap its allocator hands out, which other tests would disturb.
//!
//! One file's tests: `cargo test -p prefix-server --test it -- soak::`.

mod bad_input;
mod bootstrap;
mod cli;
mod cluster;
mod converge;
mod engine_dns;
mod engines;
mod flood;
mod http_api;
mod http_close;
mod partition;
mod precise_keys;
mod receipts;
mod replay;
mod replicas;
mod restart;
mod routers;
mod service;
mod soak;
mod surface;
mod tls;
