//! The wire codec alone: what one frame costs to decode, apart from the
//! transport.
//!
//! `decode_lookup_answer` decodes the answer to a batch of 16 lookups, each
//! naming 16 pods (the shape of the `prefix-load --batch 16` runs), and
//! compares the client's [`PodName`] (names of up to 24 bytes kept inline)
//! with the same bytes decoded into one `String` per pod, as the client did
//! before: a mirror of the wire types with `String` names, decoded by bincode
//! with the same format (standard, varints) in the same run. Names come in two
//! lengths: `short` (`pod-07`, 6 bytes) fits inline, `long` (31 bytes, a
//! Deployment's pod name) does not.

use bincode::Decode;
use criterion::{Criterion, Throughput};
use prefix_proto::{self as wire, PodBlocks, PodName, Reply, Response};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const LOOKUPS: usize = 16;
const PODS: usize = 16;

/// The wire types as they were, with a `String` per pod.
#[derive(Decode)]
#[allow(dead_code)]
enum OldResponse {
    One(OldReply),
    Batch(Vec<OldReply>),
}

#[derive(Decode)]
#[allow(dead_code)]
enum OldReply {
    Lookup {
        key_blocks: u32,
        matches: Vec<OldPodBlocks>,
    },
}

#[derive(Decode)]
#[allow(dead_code)]
struct OldPodBlocks {
    pod: String,
    blocks: u32,
}

fn answer(name: impl Fn(usize) -> String) -> Vec<u8> {
    let reply = |l: usize| Reply::Lookup {
        key_blocks: 24,
        matches: (0..PODS)
            .map(|p| PodBlocks {
                pod: PodName::from(name(p)),
                blocks: (24 - (p + l) % 24) as u32,
            })
            .collect(),
    };
    let mut out = Vec::new();
    wire::encode_response(
        1,
        &Response::Batch((0..LOOKUPS).map(reply).collect()),
        &mut out,
    );
    out.split_off(wire::HEADER_LEN)
}

fn decode_lookup_answer(c: &mut Criterion) {
    let mut g = c.benchmark_group("decode_lookup_answer");
    g.throughput(Throughput::Elements(LOOKUPS as u64));
    let cfg = bincode::config::standard().with_limit::<{ 1 << 20 }>();
    for (label, payload) in [
        ("short", answer(|p| format!("pod-{p:02}"))),
        (
            "long",
            answer(|p| format!("vllm-llama-3-8b-7d9f8c6b5-x2x{p:02}")),
        ),
    ] {
        // Both decoders read the same bytes to the end.
        let (_, used) = bincode::decode_from_slice::<OldResponse, _>(&payload, cfg).expect("old");
        assert_eq!(used, payload.len());
        g.bench_function(format!("string_names/{label}"), |b| {
            b.iter(|| bincode::decode_from_slice::<OldResponse, _>(&payload, cfg).expect("old"))
        });
        g.bench_function(format!("pod_names/{label}"), |b| {
            b.iter(|| wire::decode_response(&payload).expect("new"))
        });
    }
    g.finish();
}

criterion::criterion_group!(benches, decode_lookup_answer);
criterion::criterion_main!(benches);
