//! The server's work on one frame, apart from the transport and the request
//! decoding: `Handler::serve` on an already-decoded request (look up, count,
//! time, encode the answer), against an index that holds every Mooncake trace
//! key for 16 pods, the state `prefix-load --prefill` leaves, so every answer
//! names 16 pods.
//!
//! `lookup_into` is the index's own part of the same lookups, measured in
//! the same run: what `serve` adds to it is the handler's cost per frame
//! (metrics, clocks, the epoch pin, the answer's encoding).
//!
//! `serve_one_receipt_frames` serves a gateway's receipts for the same keys
//! (one per lookup, for the pod each would be routed to): what sending a
//! receipt for every request costs beside the lookup itself.

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput};
use prefix_benches::{mooncake, mooncake_path, pod_names};
use prefix_index::{Index, IndexConfig};
use prefix_proto::{Limits, Op, Receipt, Request};
use prefix_server::now_ms;
use prefix_server::Access;
use prefix_server::Handler;
use prefix_server::Metrics;
use prefix_server::Service;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const MODEL: &str = "kimi";

fn main() {
    let mut c = Criterion::default().configure_from_args();
    let Ok(trace) = mooncake(&mooncake_path()) else {
        eprintln!(
            "mooncake trace not found at {}: skipped",
            mooncake_path().display()
        );
        return;
    };
    let index = Arc::new(Index::new(IndexConfig {
        // Above what the prefill stores: no eviction while measuring.
        pod_capacity: 10_000_000,
        ..IndexConfig::default()
    }));
    // Entries stamped now, so the handler's clock sees them live.
    let now = now_ms();
    for r in &trace {
        for pod in &pod_names() {
            index.insert(MODEL, &r.key, pod, now).expect("insert");
        }
    }
    let handler = Handler {
        engines: None,
        replica: prefix_server::Replica::serving(),
        index: index.clone(),
        limits: Limits::default(),
        metrics: Arc::new(Metrics::default()),
        inline_blocks: usize::MAX,
    };
    let lookup = |i: usize| Op::Lookup {
        model: MODEL.into(),
        key: trace[(i * 11) % trace.len()].key.clone(),
        candidates: None,
    };
    let ones: Vec<Request> = (0..256).map(|i| Request::One(lookup(i))).collect();
    let pods = pod_names();
    let receipts: Vec<Request> = (0..256)
        .map(|i| {
            let key = trace[(i * 11) % trace.len()].key.clone();
            let blocks = key.len() as u32;
            Request::One(Op::Receipt(Receipt {
                model: MODEL.into(),
                pod: pods[i % pods.len()].clone(),
                prompt_tokens: Some(blocks * 16 + 1),
                predicted_blocks: blocks,
                // Mostly as predicted, one in eight short of it.
                cached_tokens: if i % 8 == 0 { 0 } else { blocks * 16 },
                key,
            }))
        })
        .collect();
    let batches: Vec<Request> = (0..16)
        .map(|b| Request::Batch((0..16).map(|i| lookup(b * 16 + i)).collect()))
        .collect();

    let mut g = c.benchmark_group("handler");
    g.throughput(Throughput::Elements(256));
    g.bench_function("lookup_into", |b| {
        let mut out = Vec::new();
        b.iter(|| {
            for r in &ones {
                let Request::One(Op::Lookup { key, .. }) = r else {
                    unreachable!("lookups only")
                };
                out.clear();
                index.reader().lookup_into(MODEL, key, None, now, &mut out);
                black_box(&out);
            }
        })
    });
    for (name, frames) in [
        ("serve_one_lookup_frames", &ones),
        ("serve_one_receipt_frames", &receipts),
        ("serve_batch_16_frames", &batches),
    ] {
        g.bench_function(name, |b| {
            let mut out = Vec::with_capacity(1 << 20);
            b.iter(|| {
                out.clear();
                for (id, r) in frames.iter().enumerate() {
                    handler.serve(id as u64, r, &Access::Write, &mut out);
                }
                black_box(&out);
            })
        });
    }
    g.finish();
    c.final_summary();
}
