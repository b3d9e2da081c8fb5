//! The decoders under a fuzzer (proptest, on stable): arbitrary bytes, and
//! valid frames cut and mutated. Nothing may panic, every failure is a typed
//! [`WireError`], and no input may make the decoder reserve memory out of
//! proportion to its length (a counting allocator records the largest single
//! allocation).
//!
//! `cargo test` runs a few thousand cases; the long run is
//! `FUZZ_CASES=1000000 cargo test --release -p prefix-proto --test fuzz -- --include-ignored`.

use std::alloc::System;

use counting_alloc::Counting;

use prefix_proto::{
    decode_budget, decode_header, decode_request, decode_response, encode_request, encode_response,
    split_frame, EngineState, EngineStatus, FrameReader, Incoming, Kind, Limits, Op, PodBlocks,
    PodDetail, PodView, Reply, Request, Response, Subscription, WireError, HEADER_LEN,
};
use prefix_testkit::fuzz::{self, cases, mutate, Mutation};
use prefix_testkit::ops;
use proptest::prelude::*;

/// The system allocator, recording the largest request (tests read and reset
/// it around one decode).
#[global_allocator]
static ALLOC: Counting<System> = Counting::new(System);

/// Runs every decoder on `bytes` and checks the allocation bound.
fn decode_all(bytes: &[u8]) -> Result<(), TestCaseError> {
    let limits = Limits::default();
    ALLOC.reset_largest_here();
    let outcomes: [Result<(), WireError>; 4] = [
        decode_header(bytes, limits.max_frame_bytes).map(drop),
        split_frame(bytes, limits.max_frame_bytes).map(drop),
        decode_request(bytes, &limits).map(drop),
        decode_response(bytes).map(drop),
    ];
    let largest = ALLOC.largest_here();
    let bound = decode_budget(bytes.len()) + 4096;
    prop_assert!(
        largest <= bound,
        "{} input bytes made a {largest}-byte allocation (bound {bound})",
        bytes.len()
    );
    for r in outcomes {
        if let Err(e) = r {
            // Typed, with a code and a message.
            let _ = (e.code(), e.to_string());
        }
    }
    // A frame, when one splits off, decodes as a request or fails typed.
    if let Ok(Some(frame)) = split_frame(bytes, limits.max_frame_bytes) {
        let _ = decode_request(frame.payload, &limits);
    }
    Ok(())
}

fn name() -> impl Strategy<Value = String> {
    "[a-z0-9-]{1,12}"
}

fn op() -> impl Strategy<Value = Op> {
    ops::op(name, 0..40, engine_sub())
}

/// A subscription the decoder takes: its endpoints `tcp://`.
fn engine_sub() -> impl Strategy<Value = Subscription> {
    ops::subscription(name, || "tcp://[a-z0-9.]{1,12}:[0-9]{1,5}")
}

fn engine_state() -> impl Strategy<Value = EngineState> {
    (
        engine_sub(),
        any::<bool>(),
        any::<Option<u64>>(),
        prop::array::uniform7(any::<u64>()),
        any::<i64>(),
        prop::option::of(".{0,20}"),
    )
        .prop_map(
            |(sub, connected, last_seq, n, lag_ms, last_error)| EngineState {
                sub,
                status: EngineStatus {
                    connected,
                    last_seq,
                    events: n[0],
                    blocks_stored: n[1],
                    blocks_removed: n[2],
                    resyncs: n[3],
                    replays: n[4],
                    orphaned: n[5],
                    decode_errors: n[6],
                    lag_ms,
                    last_error,
                },
            },
        )
}

fn request() -> impl Strategy<Value = Request> {
    prop_oneof![
        op().prop_map(Request::One),
        // A digest is asked alone (`WireError::DigestsInBatch`).
        prop::collection::vec(
            op().prop_filter("a digest", |op| !matches!(op, Op::Digest(_))),
            0..12
        )
        .prop_map(Request::Batch),
    ]
}

fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        (
            any::<u32>(),
            prop::collection::vec((name(), any::<u32>()), 0..5)
        )
            .prop_map(|(k, m)| {
                Reply::Lookup {
                    key_blocks: k,
                    matches: m
                        .into_iter()
                        .map(|(pod, blocks)| PodBlocks {
                            pod: pod.into(),
                            blocks,
                        })
                        .collect(),
                }
            }),
        Just(Reply::Done),
        any::<bool>().prop_map(Reply::Removed),
        Just(Reply::Pong),
        (any::<u16>(), ".{0,20}").prop_map(|(code, message)| Reply::Error { code, message }),
        prop::collection::vec(engine_state(), 0..3).prop_map(Reply::Engines),
        prop::collection::vec(
            (".{0,8}", prop::collection::vec(any::<u64>(), 0..5))
                .prop_map(|(model, key)| prefix_proto::SampledKey { model, key }),
            0..3
        )
        .prop_map(Reply::Keys),
        (
            any::<u32>(),
            prop::collection::vec(
                (name(), any::<u32>(), any::<u32>(), 0..6usize, any::<u64>()),
                0..5
            )
        )
            .prop_map(|(k, m)| {
                Reply::Detail {
                    key_blocks: k,
                    matches: m
                        .into_iter()
                        .map(|(pod, blocks, lower_blocks, v, age_ms)| PodDetail {
                            pod: pod.into(),
                            blocks,
                            lower_blocks,
                            view: PodView::ALL[v],
                            age_ms,
                        })
                        .collect(),
                }
            }),
        (
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(name().prop_map(|pod| Op::RemovePod { pod }), 0..4)
        )
            .prop_map(|(from, next, ops)| Reply::Writes { from, next, ops }),
    ]
}

/// A mutation of a valid frame: flip bits, cut, splice in a length-like run.
fn mutation() -> impl Strategy<Value = Mutation> {
    // 0xfb..0xfd are bincode's varint markers for 2-, 4- and 8-byte
    // lengths: the way to claim a huge container in a few bytes.
    fuzz::mutation(&[0xfd, 0xff])
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases(1500)))]

    #[test]
    fn arbitrary_bytes_fail_typed_and_small(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        decode_all(&bytes)?;
        // The same bytes behind a valid header: they reach the payload decoders.
        let mut framed = Vec::new();
        encode_request(1, &Request::One(Op::Ping), &mut framed);
        framed.truncate(HEADER_LEN);
        framed[4..8].copy_from_slice(&(bytes.len() as u32).to_le_bytes());
        framed.extend_from_slice(&bytes);
        decode_all(&framed)?;
    }

    /// A stream of valid and mutated frames, delivered in arbitrary pieces:
    /// the reader yields the valid frames before the first bad header whole
    /// and in order, reports that header once, and yields nothing after it.
    #[test]
    fn a_frame_reader_stops_at_the_first_bad_header(
        reqs in prop::collection::vec(request(), 1..6),
        bad_at in 0usize..6,
        muts in prop::collection::vec(mutation(), 1..4),
        pieces in prop::collection::vec(1usize..64, 1..16),
    ) {
        let limits = Limits::default();
        let mut stream = Vec::new();
        for (id, req) in reqs.iter().enumerate() {
            let mut frame = Vec::new();
            encode_request(id as u64, req, &mut frame);
            if id == bad_at {
                frame = mutate(frame, &muts);
            }
            stream.extend(frame);
        }
        let mut reader = FrameReader::new(Kind::Request, limits.max_frame_bytes);
        let (mut ids, mut errors, mut at) = (Vec::new(), 0, 0);
        for n in pieces.iter().cycle() {
            if at == stream.len() {
                break;
            }
            let n = (*n).min(stream.len() - at);
            reader.push(&stream[at..at + n]);
            at += n;
            loop {
                match reader.next_request(&limits) {
                    Ok(None) => break,
                    Ok(Some(incoming)) => {
                        prop_assert_eq!(errors, 0, "a frame after a framing error");
                        let (Incoming::Request { id, .. }
                        | Incoming::Refused { id, .. }
                        | Incoming::Snapshot { id }) = incoming;
                        ids.push(id);
                    }
                    Err(e) => {
                        errors += 1;
                        let _ = (e.error.code(), e.to_string());
                    }
                }
            }
        }
        prop_assert!(errors <= 1);
        prop_assert_eq!(errors == 1, reader.has_failed());
        let clean = reqs.len().min(bad_at);
        // Every frame before the mutated one comes out, in order.
        prop_assert!(ids.len() >= clean);
        prop_assert_eq!(&ids[..clean], &(0..clean as u64).collect::<Vec<_>>()[..]);
        let _ = reader.finish();
    }

    #[test]
    fn valid_requests_round_trip_and_mutants_fail_typed(
        id in any::<u64>(),
        req in request(),
        muts in prop::collection::vec(mutation(), 1..4),
    ) {
        let limits = Limits::default();
        let mut bytes = Vec::new();
        encode_request(id, &req, &mut bytes);
        let frame = split_frame(&bytes, limits.max_frame_bytes).unwrap().unwrap();
        prop_assert_eq!(decode_request(frame.payload, &limits).unwrap(), req);
        decode_all(&mutate(bytes.clone(), &muts))?;
        decode_all(&mutate(bytes[HEADER_LEN..].to_vec(), &muts))?;
    }

    #[test]
    fn valid_responses_round_trip_and_mutants_fail_typed(
        id in any::<u64>(),
        replies in prop::collection::vec(reply(), 1..6),
        muts in prop::collection::vec(mutation(), 1..4),
    ) {
        let resp = Response::Batch(replies);
        let mut bytes = Vec::new();
        encode_response(id, &resp, &mut bytes);
        prop_assert_eq!(decode_response(&bytes[HEADER_LEN..]).unwrap(), resp);
        decode_all(&mutate(bytes[HEADER_LEN..].to_vec(), &muts))?;
    }
}

/// The classic attack, spelled out: a few bytes claiming a 32 MiB name, a key
/// of 4 Mi blocks (32 MiB), or a batch of 2^32 ops. The first two fit under
/// the 64 MiB ceiling, so only the budget scaled to the payload stops them.
#[test]
fn huge_length_fields_in_tiny_frames_are_refused_cheaply() {
    let limits = Limits::default();
    // Request::One, Op::Insert, model length 0xfc (u32) 32 Mi.
    let mut name_bomb = vec![0u8, 1, 0xfc];
    name_bomb.extend_from_slice(&(32u32 << 20).to_le_bytes());
    // Request::One, Op::Lookup, model "m", key length 0xfc (u32) 4 Mi.
    let mut key_bomb = vec![0u8, 0, 1, b'm', 0xfc];
    key_bomb.extend_from_slice(&(4u32 << 20).to_le_bytes());
    // Request::Batch with 2^32 - 1 ops.
    let mut batch_bomb = vec![1u8, 0xfc];
    batch_bomb.extend_from_slice(&u32::MAX.to_le_bytes());
    for bomb in [name_bomb, key_bomb, batch_bomb] {
        ALLOC.reset_largest_here();
        let e = decode_request(&bomb, &limits).unwrap_err();
        let largest = ALLOC.largest_here();
        assert!(matches!(e, WireError::Malformed(_)), "{e}");
        assert!(
            largest <= 1 << 20,
            "{largest} bytes reserved for {} input bytes",
            bomb.len()
        );
    }
}

/// The long run: `FUZZ_CASES` (default 200,000) cases of each property.
#[test]
#[ignore = "long fuzzing run; see the module docs"]
fn long_run() {
    let n = cases(200_000);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(n));
    runner
        .run(&prop::collection::vec(any::<u8>(), 0..4096), |b| {
            decode_all(&b)
        })
        .unwrap();
    runner
        .run(
            &(
                any::<u64>(),
                request(),
                prop::collection::vec(mutation(), 1..6),
            ),
            |(id, req, muts)| {
                let mut bytes = Vec::new();
                encode_request(id, &req, &mut bytes);
                decode_all(&mutate(bytes.clone(), &muts))?;
                decode_all(&mutate(bytes[HEADER_LEN..].to_vec(), &muts))
            },
        )
        .unwrap();
}
