//! Generates SGLang's KV indexer service (`proto/kv_indexer.proto`) for
//! the server: its messages with prost, its service trait with tonic. The
//! descriptor comes from protox, so no `protoc` need be installed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/kv_indexer.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_transport(false)
        .compile_fds(descriptors)?;
    Ok(())
}
