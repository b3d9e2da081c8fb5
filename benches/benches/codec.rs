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

/// A lookup's body as Dynamo's `/query` takes it.
#[derive(serde::Deserialize)]
#[allow(dead_code)]
struct Query {
    token_ids: Vec<u32>,
    model_name: String,
}

fn json_token_ids(c: &mut Criterion) {
    let mut g = c.benchmark_group("json_token_ids");
    for tokens in [1_746usize, 1_000_000] {
        // Ids below 150,000 from a fixed generator: mostly of five and six
        // digits, as a large vocabulary's are.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let ids: Vec<u32> = (0..tokens)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 150_000) as u32
            })
            .collect();
        let body = serde_json::to_vec(&serde_json::json!({"token_ids": ids, "model_name": "kimi"}))
            .expect("body");
        let put = |q: &mut Query, ids| q.token_ids = ids;
        // Both read the same ids.
        let alone: Query = serde_json::from_slice(&body).expect("serde_json");
        let lifted: Query = wire::json::ids::from_slice(&body, "token_ids", put).expect("ids");
        assert!(alone.token_ids == ids && lifted.token_ids == ids);
        g.throughput(Throughput::Bytes(body.len() as u64));
        if tokens > 100_000 {
            g.sample_size(20);
        }
        g.bench_function(format!("serde_json/{tokens}"), |b| {
            b.iter(|| serde_json::from_slice::<Query>(&body).expect("serde_json"))
        });
        g.bench_function(format!("ids/{tokens}"), |b| {
            b.iter(|| wire::json::ids::from_slice(&body, "token_ids", put).expect("ids"))
        });
    }
    g.finish();
}

criterion::criterion_group!(benches, decode_lookup_answer, json_token_ids);
criterion::criterion_main!(benches);
