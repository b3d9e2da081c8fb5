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

/// Every file of this folder is a module above, but for `fleet.rs` (a
/// binary of its own) and this one: with `autotests = false`, a file left
/// out would never be built or run.
#[test]
fn every_test_file_is_a_module() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter_map(|name| Some(name.strip_suffix(".rs")?.to_string()))
        .filter(|name| name != "it" && name != "fleet")
        .collect();
    files.sort();
    let modules: Vec<&str> = include_str!("it.rs")
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    assert_eq!(files, modules);
}
