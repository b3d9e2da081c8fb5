//! Precise mode: our index fed engine KV-cache events made from the
//! Mooncake trace, applied, decoded and applied, looked up, and looked up
//! while events stream in; heap per (pod, block). The groups and the
//! workload are `prefix_benches::engine_events`.
//!
//! `cargo bench -p prefix-benches --bench engine_events`; the same groups
//! with NVIDIA Dynamo's KV router beside ours are the workspace in
//! `benches/dynamo/`. See `docs/benchmarks.md`, "Precise mode".

use counting_alloc::Counting;
use prefix_benches::engine_events::{run, Alone};

/// mimalloc (the server's allocator), counting live bytes for the memory figures.
#[global_allocator]
static GLOBAL: Counting<mimalloc::MiMalloc> = Counting::new(mimalloc::MiMalloc);

fn main() {
    run(|_| Alone, || GLOBAL.live());
}
