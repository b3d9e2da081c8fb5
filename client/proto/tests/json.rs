//! The JSON mapping under proptest, as the binary decoders are fuzzed: every
//! operation survives the trip to JSON and back; mutated and arbitrary
//! bodies never panic, fail with a message, and allocate in proportion to
//! their length.
//!
//! The long run: `FUZZ_CASES=100000 cargo test --release -p prefix-proto --test json`.

use std::alloc::System;

use counting_alloc::Counting;
use prefix_proto::json::{parse_batch, JsonOp, KeyOptions};
use prefix_proto::{Op, OpKind, Reply};
use prefix_testkit::fuzz::cases;
use prefix_testkit::ops;
use proptest::prelude::*;
use serde_json::{json, Map, Value};

#[global_allocator]
static ALLOC: Counting<System> = Counting::new(System);

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9\"\\\\é -]{0,12}"
}

fn op() -> impl Strategy<Value = Op> {
    ops::op(name, 0..20, ops::subscription(name, name))
}

/// `op` as a gateway writes it, keys as hashes.
fn to_json(op: &Op) -> Value {
    let mut v = match op {
        Op::Lookup { .. } | Op::LookupDetail { .. } | Op::LookupTiers { .. } => {
            let l = op.as_lookup().expect("a lookup");
            let mut v = json!({"model": l.model, "hashes": l.key});
            if let Some(c) = l.candidates {
                v["candidates"] = json!(c);
            }
            v
        }
        Op::Insert { model, key, pod } => json!({"model": model, "hashes": key, "pod": pod}),
        Op::RemovePod { pod } | Op::Unsubscribe { pod } => json!({ "pod": pod }),
        Op::SetPodCapacity { pod, blocks } => json!({"pod": pod, "blocks": blocks}),
        Op::Stats | Op::Ping | Op::ListEngines => json!({}),
        Op::SampleKeys { count, seed } => json!({"count": count, "seed": seed}),
        Op::Tail { from, max } => match from {
            Some(f) => json!({"from": f, "max": max}),
            None => json!({ "max": max }),
        },
        Op::Digest(a) => json!({
            "level": a.level, "model": a.model, "low": a.low, "high": a.high, "of": a.of,
        }),
        Op::Receipt(r) => {
            let mut v = json!({
                "model": r.model, "pod": r.pod, "hashes": r.key,
                "predicted_blocks": r.predicted_blocks, "cached_tokens": r.cached_tokens,
            });
            if let Some(p) = r.prompt_tokens {
                v["prompt_tokens"] = json!(p);
            }
            v
        }
        Op::Subscribe(s) => {
            let mut v = json!({
                "pod": s.pod, "model": s.model, "endpoint": s.endpoint,
                "block_size": s.block_size, "topic": s.topic, "media": s.media,
            });
            if let Some(r) = &s.replay {
                v["replay"] = json!(r);
            }
            v
        }
    };
    v["op"] = json!(op.kind().name());
    v
}

/// A JSON value of any shape, small.
fn value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>().prop_map(|f| json!(f)),
        name().prop_map(Value::String),
        prop::sample::select(vec![
            "op", "lookup", "insert", "model", "pod", "hashes", "tokens", "text", "ops"
        ])
        .prop_map(|s| json!(s)),
    ];
    leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec(
                (
                    prop::sample::select(vec![
                        "op",
                        "model",
                        "pod",
                        "hashes",
                        "tokens",
                        "text",
                        "candidates",
                        "blocks",
                        "ops",
                        "endpoint",
                        "x"
                    ]),
                    inner
                ),
                0..6
            )
            .prop_map(|kv| Value::Object(
                kv.into_iter()
                    .map(|(k, v)| (k.to_string(), v))
                    .collect::<Map<_, _>>()
            )),
        ]
    })
}

/// Runs every entry point on `bytes`; nothing panics, and no allocation is
/// out of proportion to the input.
fn parse_all(bytes: &[u8]) -> Result<(), TestCaseError> {
    ALLOC.reset_largest_here();
    let opts = KeyOptions::default();
    let mut outcomes = vec![JsonOp::parse(bytes).map(drop).map_err(|e| e.to_string())];
    for kind in OpKind::ALL {
        let parsed = JsonOp::parse_as(kind, bytes).and_then(|op| op.to_op(&opts));
        outcomes.push(parsed.map(drop).map_err(|e| e.to_string()));
    }
    let batch = parse_batch(bytes, &opts, 64);
    let largest = ALLOC.largest_here();
    // A JSON value costs at most a few words per input byte (an array of
    // one-digit numbers: 32 bytes a `Value` per 2 bytes of text).
    let bound = 32 * bytes.len() + 4096;
    prop_assert!(
        largest <= bound,
        "{} bytes made a {largest}-byte allocation (bound {bound})",
        bytes.len()
    );
    for e in outcomes.into_iter().filter_map(Result::err) {
        prop_assert!(!e.is_empty());
    }
    if let Err(reply) = batch {
        let is_error = matches!(reply, Reply::Error { .. });
        prop_assert!(is_error, "{:?}", reply);
    }
    Ok(())
}

/// Panics with the property's name and its minimal failing input.
fn run<T: std::fmt::Debug>(name: &str, r: Result<(), proptest::test_runner::TestError<T>>) {
    if let Err(e) = r {
        panic!("{name}: {e}");
    }
}

/// One test runs every property in turn: the allocation bound counts every
/// thread's allocations, so nothing else may run meanwhile.
#[test]
fn the_json_mapping_holds_under_proptest() {
    let config = || ProptestConfig::with_cases(cases(2000));

    // Every op survives the trip to JSON and back, with "op" or on its route.
    let mut runner = proptest::test_runner::TestRunner::new(config());
    run(
        "round trip",
        runner.run(&op(), |op| {
            let v = to_json(&op);
            let bytes = serde_json::to_vec(&v).unwrap();
            let parsed = JsonOp::parse(&bytes).unwrap();
            prop_assert_eq!(parsed.kind(), op.kind());
            prop_assert_eq!(parsed.to_op(&KeyOptions::default()).unwrap(), op.clone());
            let mut body = v;
            body.as_object_mut().unwrap().remove("op");
            let on_route =
                JsonOp::parse_as(op.kind(), &serde_json::to_vec(&body).unwrap()).unwrap();
            prop_assert_eq!(on_route.to_op(&KeyOptions::default()).unwrap(), op);
            Ok(())
        }),
    );

    // Valid bodies with a few bytes changed, inserted or removed.
    let edits = prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6);
    let mut runner = proptest::test_runner::TestRunner::new(config());
    run(
        "mutated bodies",
        runner.run(&(op(), edits), |(op, edits)| {
            let mut bytes = serde_json::to_vec(&to_json(&op)).unwrap();
            for (at, byte, how) in edits {
                let i = at.index(bytes.len() + 1);
                match how {
                    0 if i < bytes.len() => bytes[i] = byte,
                    1 => bytes.insert(i, byte),
                    _ if i < bytes.len() => {
                        bytes.remove(i);
                    }
                    _ => bytes.push(byte),
                }
            }
            parse_all(&bytes)
        }),
    );

    // JSON of any shape, alone and as a batch's ops.
    let mut runner = proptest::test_runner::TestRunner::new(config());
    run(
        "arbitrary values",
        runner.run(&value(), |v| {
            parse_all(&serde_json::to_vec(&v).unwrap())?;
            let batch = json!({"ops": [v.clone(), v]});
            parse_all(&serde_json::to_vec(&batch).unwrap())
        }),
    );

    // Bytes of any kind.
    let mut runner = proptest::test_runner::TestRunner::new(config());
    run(
        "arbitrary bytes",
        runner.run(&prop::collection::vec(any::<u8>(), 0..256), |bytes| {
            parse_all(&bytes)
        }),
    );

    // Deep nesting is an error, not a stack overflow: an op's fields are
    // typed (a nested array fails at once), and a batch's op that is not an
    // object is refused.
    let (open, close) = ("[".repeat(100_000), "]".repeat(100_000));
    let deep = format!(r#"{{"op":"lookup","model":"m","hashes":{open}{close}}}"#);
    assert!(JsonOp::parse(deep.as_bytes()).is_err());
    let deep = format!(r#"{{"ops":[{open}{close}]}}"#);
    match parse_batch(deep.as_bytes(), &KeyOptions::default(), 64) {
        Err(Reply::Error { message, .. }) => assert!(message.starts_with("ops[0]"), "{message}"),
        other => panic!("{other:?}"),
    }
}
