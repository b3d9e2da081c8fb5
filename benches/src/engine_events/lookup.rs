//! The `lookup/…` group: every trace request as a key after the ingest.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput};
use prefix_index::Index;

use super::{parallel, Peer, Workload, MODEL, NOW};

/// Lookups on 1 and 2 threads in `ours`: the index after the sweep (the
/// server's maintenance), before it, the same pairs inserted by gateways
/// (the tree without engine feeding), and fed by a hybrid model's engines
/// (two KV-cache groups: every answer found by their rules); then detailed
/// lookups of the first; `peer`'s rows after ours at each thread count.
pub(super) fn lookups(c: &mut Criterion, w: &Workload, ours: [&Index; 4], peer: &mut impl Peer) {
    let n = w.our_keys.len() as u64;
    let mut g = c.benchmark_group(format!("lookup/mooncake_{n}_requests"));
    g.sample_size(20);
    for threads in [1usize, 2] {
        g.throughput(Throughput::Elements(n * threads as u64));
        let id = |name: &str| BenchmarkId::new(name, format!("threads={threads}"));
        for (name, index) in ["ours", "ours-unswept", "ours-gateway-fed", "ours-hybrid"]
            .iter()
            .zip(ours)
        {
            g.bench_function(id(name), |b| {
                b.iter_custom(|iters| {
                    parallel(threads, |_| {
                        let mut out = Vec::new();
                        for _ in 0..iters {
                            for k in &w.our_keys {
                                out.clear();
                                index.reader().lookup_into(MODEL, k, None, NOW, &mut out);
                                black_box(&out);
                            }
                        }
                    })
                })
            });
        }
        g.bench_function(id("ours-detail"), |b| {
            b.iter_custom(|iters| {
                parallel(threads, |_| {
                    for _ in 0..iters {
                        for k in &w.our_keys {
                            black_box(ours[0].reader().lookup_detail(MODEL, k, None, NOW));
                        }
                    }
                })
            })
        });
        peer.lookups(&mut g, w, threads);
    }
    g.finish();
}
