//! Generates SGLang's KV indexer service (`proto/kv_indexer.proto`) for
//! the server: its messages with prost, its service trait with tonic. The
//! descriptor comes from protox, so no `protoc` need be installed.
//!
//! And links `prefix-server` with the functions it runs from its start
//! through its first requests and its first engine placed first, in that
//! order (`link/startup-symbols.txt`, written by
//! `link/startup-symbols.sh`): a server at rest then maps about 1.5 to 3
//! MB of its code rather than pages spread over all of it, about 7 MB
//! (docs/benchmarks.md, "Idle memory"). It takes lld's
//! `--symbol-ordering-file`, so only where lld is the linker unless told
//! otherwise: x86_64 Linux with Rust 1.90 or later.
//! `PREFIX_SERVER_LINK_ORDER=0` leaves it out, for a toolchain set to link
//! with another linker.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/kv_indexer.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_transport(false)
        .compile_fds(descriptors)?;
    startup_symbols_first();
    Ok(())
}

/// The link arguments that place the startup symbols first, where the
/// linker is lld.
fn startup_symbols_first() {
    let order = Path::new(env!("CARGO_MANIFEST_DIR")).join("link/startup-symbols.txt");
    println!("cargo:rerun-if-changed={}", order.display());
    println!("cargo:rerun-if-env-changed=PREFIX_SERVER_LINK_ORDER");
    // Left out when asked, and in a copy of the sources without the list.
    if std::env::var("PREFIX_SERVER_LINK_ORDER").is_ok_and(|v| v == "0") || !order.exists() {
        return;
    }
    // The toolchains that link this target with their own lld by default.
    let lld = std::env::var("TARGET").is_ok_and(|t| t == "x86_64-unknown-linux-gnu")
        && version_check::is_min_version("1.90.0").unwrap_or(false);
    if !lld {
        return;
    }
    println!(
        "cargo:rustc-link-arg-bin=prefix-server=-Wl,--symbol-ordering-file={}",
        order.display()
    );
    // A name that no longer matches (the file is older than the build's
    // dependencies) is passed over: its code is placed as if unlisted.
    println!("cargo:rustc-link-arg-bin=prefix-server=-Wl,--no-warn-symbol-ordering");
}
