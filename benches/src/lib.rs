//! Benchmarks live in `benches/`; this crate holds their shared workload builders.
