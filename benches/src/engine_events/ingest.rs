//! The `ingest/…` group: every event into a fresh index.

use std::hint::black_box;
use std::time::Instant;

use criterion::{Bencher, BenchmarkId, Criterion, SamplingMode, Throughput};
use engine_sim::Step;
use prefix_events::{decode_batch, DecodeLimits};

use super::{parallel, runs, subscriptions, Ours, Peer, Workload, PODS};

/// Ours applying decoded events on 1 and 2 threads (pods split by
/// parity), decoding alone, and decoding and applying; then `peer`'s rows.
pub(super) fn ingest(c: &mut Criterion, w: &Workload, peer: &mut impl Peer) {
    let subs = subscriptions(&w.names);
    let by_thread: [Vec<&Step>; 2] =
        [0, 1].map(|t| w.steps.iter().filter(|s| s.pod % 2 == t).collect());
    let mut g = c.benchmark_group(format!("ingest/mooncake_{PODS}pods_{}blocks", w.capacity));
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
    g.throughput(Throughput::Elements(w.ops));
    for threads in [1usize, 2] {
        g.bench_function(
            BenchmarkId::new("ours/apply", format!("threads={threads}")),
            |b| {
                b.iter_custom(|iters| {
                    runs(iters, || {
                        let o = Ours::new(&w.names);
                        let t = if threads == 1 {
                            let start = Instant::now();
                            black_box(o.apply(&w.names, &w.steps));
                            start.elapsed()
                        } else {
                            parallel(2, |t| {
                                black_box(o.apply(&w.names, by_thread[t].iter().copied()));
                            })
                        };
                        drop(o);
                        t
                    })
                })
            },
        );
    }
    // Decoding alone, to tell its share of decode+apply.
    g.bench_function(BenchmarkId::new("ours/decode", "threads=1"), |b| {
        let limits = DecodeLimits::default();
        b.iter(|| {
            let mut events = 0;
            for (_, bytes) in &w.payloads {
                let batch = decode_batch(bytes, &limits).expect("the batches are well formed");
                events += batch.events.len();
            }
            black_box(events)
        })
    });
    // Decoding and applying `payloads`, each run into a fresh index.
    let decode_apply = |b: &mut Bencher, payloads: &[(usize, Vec<u8>)]| {
        b.iter_custom(|iters| {
            runs(iters, || {
                let o = Ours::new(&w.names);
                let start = Instant::now();
                black_box(o.decode_apply(&subs, payloads));
                start.elapsed()
            })
        })
    };
    g.bench_function(BenchmarkId::new("ours/decode+apply", "threads=1"), |b| {
        decode_apply(b, &w.payloads)
    });
    // The same with identities: what folding extra keys into seeds costs.
    for (name, payloads) in &w.identity_payloads {
        g.bench_function(
            BenchmarkId::new("ours/decode+apply", format!("threads=1,{name}")),
            |b| decode_apply(b, payloads),
        );
    }
    peer.ingest(&mut g, w);
    g.finish();
}
