use super::*;
use crate::engines::EngineConfig;
use prefix_index::IndexConfig;
use prefix_proto::{
    decode_response, encode_request, split_frame, FrameReader, Incoming, Kind, PodBlocks,
    Subscription, HEADER_LEN,
};
use tokio_util::sync::CancellationToken;

fn handler() -> Handler {
    Handler {
        engines: None,
        replica: crate::replica::Replica::serving(),
        index: Arc::new(Index::new(IndexConfig::default())),
        limits: Limits {
            max_key_blocks: 4,
            ..Limits::default()
        },
        metrics: Arc::default(),
        inline_blocks: 100,
    }
}

fn frame(id: u64, request: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    encode_request(id, request, &mut out);
    out
}

fn answer(out: &[u8]) -> (u64, Response) {
    let f = split_frame(out, MAX_FRAME_CEILING).unwrap().unwrap();
    assert_eq!(f.used, out.len());
    (f.header.request_id, decode_response(f.payload).unwrap())
}

fn reader(h: &Handler) -> FrameReader {
    FrameReader::new(Kind::Request, h.limits.max_frame_bytes)
}

/// Answers every whole frame in `reader` as the stream layer does.
fn run(h: &Handler, reader: &mut FrameReader, access: &Access) -> Vec<(u64, Response)> {
    let mut answers = Vec::new();
    loop {
        let mut out = Vec::new();
        match reader.next_request(&h.limits) {
            Ok(None) => return answers,
            Ok(Some(Incoming::Request { id, request })) => h.serve(id, &request, access, &mut out),
            Ok(Some(refused)) => refused.encode_refusal(&mut out),
            Err(fatal) => fatal.encode(&mut out),
        }
        answers.push(answer(&out));
    }
}

#[test]
fn lookups_count_key_and_matched_blocks_per_known_model() {
    let h = handler();
    h.index.insert("m", &[1, 2, 3], "a", now_ms()).unwrap();
    let lookup = |model: &str, key: Vec<u64>| Op::Lookup {
        model: model.into(),
        key,
        candidates: None,
    };
    let batch = Request::Batch(vec![
        lookup("m", vec![1, 2, 9]),
        lookup("m", vec![1, 2, 3, 4]),
        lookup("made-up", vec![1]),
    ]);
    let mut out = Vec::new();
    h.serve(1, &batch, &Access::Write, &mut out);
    let text = h.metrics.render(&h.index);
    for line in [
        "prefix_index_lookup_key_blocks_total{model=\"m\"} 7",
        "prefix_index_lookup_matched_blocks_total{model=\"m\"} 5",
    ] {
        assert!(text.contains(line), "{line} missing in\n{text}");
    }
    assert!(!text.contains("made-up"));
}

#[test]
fn frames_split_across_pushes_are_answered_in_order() {
    let h = handler();
    let insert = Request::One(Op::Insert {
        model: "m".into(),
        key: vec![1, 2, 3],
        pod: "p".into(),
    });
    let lookup = Request::Batch(vec![
        Op::Lookup {
            model: "m".into(),
            key: vec![1, 2, 9],
            candidates: None,
        },
        Op::Ping,
    ]);
    let mut bytes = frame(1, &insert);
    bytes.extend(frame(2, &lookup));
    let mut r = reader(&h);
    let mut answers = Vec::new();
    for b in bytes.chunks(3) {
        r.push(b);
        answers.extend(run(&h, &mut r, &Access::Write));
    }
    assert_eq!(r.pending(), 0);
    assert_eq!(answers[0], (1, Response::One(Reply::Done)));
    assert_eq!(
        answers[1],
        (
            2,
            Response::Batch(vec![
                Reply::Lookup {
                    key_blocks: 3,
                    matches: vec![PodBlocks {
                        pod: "p".into(),
                        blocks: 2
                    }]
                },
                Reply::Pong
            ])
        )
    );
}

#[test]
fn bad_ops_fail_alone_and_change_nothing() {
    let h = handler();
    let too_long = Op::Insert {
        model: "m".into(),
        key: vec![1; 5],
        pod: "p".into(),
    };
    let bad_name = Op::Insert {
        model: "m".into(),
        key: vec![1],
        pod: String::new(),
    };
    let mut r = reader(&h);
    r.push(&frame(
        5,
        &Request::Batch(vec![too_long, bad_name, Op::Ping]),
    ));
    let answers = run(&h, &mut r, &Access::Write);
    let Response::Batch(r) = &answers[0].1 else {
        panic!("{answers:?}")
    };
    let codes: Vec<_> = r
        .iter()
        .map(|r| match r {
            Reply::Error { code, .. } => ErrorCode::from_u16(*code),
            _ => None,
        })
        .collect();
    assert_eq!(
        codes,
        [Some(ErrorCode::KeyTooLong), Some(ErrorCode::BadName), None]
    );
    assert_eq!(h.index.stats().entries, 0);
}

#[test]
fn a_malformed_payload_is_refused_and_the_stream_goes_on() {
    let h = handler();
    let mut bad = frame(7, &Request::One(Op::Ping));
    bad[HEADER_LEN] = 9; // no such Request variant
    bad.extend(frame(8, &Request::One(Op::Ping)));
    let mut r = reader(&h);
    r.push(&bad);
    let answers = run(&h, &mut r, &Access::Write);
    assert_eq!(answers.len(), 2);
    assert!(matches!(
        &answers[0],
        (7, Response::One(Reply::Error { code, .. })) if *code == ErrorCode::Malformed as u16
    ));
    assert_eq!(answers[1], (8, Response::One(Reply::Pong)));
}

#[test]
fn a_reader_may_do_what_the_op_table_marks_as_reading_only() {
    let h = handler();
    h.index.insert("m", &[1], "p", now_ms()).unwrap();
    let ops = [
        Op::Lookup {
            model: "m".into(),
            key: vec![1],
            candidates: None,
        },
        Op::Insert {
            model: "m".into(),
            key: vec![2],
            pod: "p".into(),
        },
        Op::RemovePod { pod: "p".into() },
        Op::SetPodCapacity {
            pod: "p".into(),
            blocks: 1,
        },
        Op::Stats,
        Op::Ping,
        Op::Subscribe(engine_sub("p", 16)),
        Op::Unsubscribe { pod: "p".into() },
        Op::ListEngines,
    ];
    let mut r = reader(&h);
    r.push(&frame(1, &Request::Batch(ops.to_vec())));
    let answers = run(&h, &mut r, &Access::Read);
    let Response::Batch(replies) = &answers[0].1 else {
        panic!("{answers:?}")
    };
    for (op, reply) in ops.iter().zip(replies) {
        let refused =
            matches!(reply, Reply::Error { code, .. } if *code == ErrorCode::Forbidden as u16);
        assert_eq!(refused, op.kind().writes(), "{op:?}: {reply:?}");
    }
    // Nothing changed: the pod is still there with its one block.
    assert_eq!(h.index.stats().entries, 1);
    let denied = Access::Denied("cn:nobody".into());
    let mut r = reader(&h);
    r.push(&frame(2, &Request::One(Op::Ping)));
    assert!(matches!(
        &run(&h, &mut r, &denied)[0].1,
        Response::One(Reply::Error { code, .. }) if *code == ErrorCode::Forbidden as u16
    ));
}

fn engine_sub(pod: &str, block_size: u32) -> Subscription {
    Subscription {
        pod: pod.into(),
        model: "m".into(),
        // Nothing listens there: the subscription's thread keeps
        // reconnecting until it is stopped.
        endpoint: "tcp://127.0.0.1:1".into(),
        replay: None,
        block_size,
        topic: String::new(),
        media: vec!["GPU".into()],
    }
}

/// A handler with engines, and the token that stops their threads.
fn precise() -> (Handler, CancellationToken) {
    let h = handler();
    let stop = CancellationToken::new();
    let engines = Engines::new(
        h.index.clone(),
        EngineConfig::default(),
        stop.clone(),
        None,
        0,
    )
    .unwrap();
    let h = Handler {
        engines: Some(engines),
        replica: crate::replica::Replica::serving(),
        ..h
    };
    (h, stop)
}

/// Stops every engine thread and waits for them.
fn stop_engines(h: &Handler, stop: &CancellationToken) {
    stop.cancel();
    if let Some(engines) = &h.engines {
        engines.join();
    }
}

/// The reply to one op sent alone.
fn one(h: &Handler, op: Op, access: &Access) -> Reply {
    let mut out = Vec::new();
    h.serve(1, &Request::One(op), access, &mut out);
    match answer(&out) {
        (1, Response::One(reply)) => reply,
        other => panic!("{other:?}"),
    }
}

fn error_code(reply: &Reply) -> Option<ErrorCode> {
    match reply {
        Reply::Error { code, .. } => ErrorCode::from_u16(*code),
        _ => None,
    }
}

#[test]
fn engines_are_subscribed_listed_and_unsubscribed() {
    let (h, stop) = precise();
    let sub = engine_sub("vllm-0", 64);
    let w = &Access::Write;
    assert_eq!(one(&h, Op::Subscribe(sub.clone()), w), Reply::Done);
    let Reply::Engines(list) = one(&h, Op::ListEngines, w) else {
        panic!("not an engine list")
    };
    assert_eq!(list.len(), 1);
    assert_eq!(list[0].sub, sub);
    assert_eq!((list[0].status.last_seq, list[0].status.events), (None, 0));
    // The same pod again replaces its subscription.
    let other = Subscription {
        topic: "kv".into(),
        ..sub.clone()
    };
    assert_eq!(one(&h, Op::Subscribe(other.clone()), w), Reply::Done);
    let Reply::Engines(list) = one(&h, Op::ListEngines, w) else {
        panic!("not an engine list")
    };
    assert_eq!(list.iter().map(|e| &e.sub).collect::<Vec<_>>(), [&other]);
    let unsubscribe = Op::Unsubscribe {
        pod: "vllm-0".into(),
    };
    assert_eq!(one(&h, unsubscribe.clone(), w), Reply::Removed(true));
    assert_eq!(one(&h, unsubscribe, w), Reply::Removed(false));
    assert_eq!(one(&h, Op::ListEngines, w), Reply::Engines(vec![]));
    stop_engines(&h, &stop);
}

#[test]
fn a_subscription_the_server_cannot_follow_is_refused_with_its_reason() {
    let (h, stop) = precise();
    let w = &Access::Write;
    // 24-token blocks do not map to the 16-token blocks of token keys.
    let reply = one(&h, Op::Subscribe(engine_sub("a", 24)), w);
    assert_eq!(error_code(&reply), Some(ErrorCode::BadSubscription));
    let Reply::Error { message, .. } = reply else {
        unreachable!()
    };
    assert!(message.contains("engine block of 24 tokens"), "{message}");
    let ipc = Subscription {
        endpoint: "ipc:///tmp/kv".into(),
        ..engine_sub("a", 16)
    };
    let reply = one(&h, Op::Subscribe(ipc), w);
    assert_eq!(error_code(&reply), Some(ErrorCode::BadSubscription));
    assert!(format!("{reply:?}").contains("is not tcp://"), "{reply:?}");
    let no_media = Subscription {
        media: vec![],
        ..engine_sub("a", 16)
    };
    let reply = one(&h, Op::Subscribe(no_media), w);
    assert_eq!(error_code(&reply), Some(ErrorCode::BadSubscription));
    let unnamed = engine_sub("", 16);
    let reply = one(&h, Op::Subscribe(unnamed), w);
    assert_eq!(error_code(&reply), Some(ErrorCode::BadName));
    assert_eq!(one(&h, Op::ListEngines, w), Reply::Engines(vec![]));
    stop_engines(&h, &stop);
}

#[test]
fn a_reader_may_list_engines_but_not_change_them() {
    let (h, stop) = precise();
    assert_eq!(
        one(&h, Op::Subscribe(engine_sub("a", 16)), &Access::Write),
        Reply::Done
    );
    let r = &Access::Read;
    for op in [
        Op::Subscribe(engine_sub("b", 16)),
        Op::Unsubscribe { pod: "a".into() },
    ] {
        let reply = one(&h, op, r);
        assert_eq!(error_code(&reply), Some(ErrorCode::Forbidden), "{reply:?}");
    }
    let Reply::Engines(list) = one(&h, Op::ListEngines, r) else {
        panic!("not an engine list")
    };
    assert_eq!(list.len(), 1, "the reader changed nothing");
    stop_engines(&h, &stop);
}

#[test]
fn without_engines_the_engine_ops_are_unsupported() {
    let h = handler();
    for op in [
        Op::Subscribe(engine_sub("a", 16)),
        Op::Unsubscribe { pod: "a".into() },
        Op::ListEngines,
    ] {
        let reply = one(&h, op, &Access::Write);
        assert_eq!(error_code(&reply), Some(ErrorCode::Unsupported));
        assert!(
            format!("{reply:?}").contains("does not follow engines"),
            "{reply:?}"
        );
    }
}

#[test]
fn an_answer_past_the_frame_ceiling_is_refused_not_built() {
    let h = handler();
    // 2,000 pods with 250-byte names: each lookup lists ~0.5 MB.
    for p in 0..2000 {
        let pod = format!("{p:0>250}");
        h.index.insert("m", &[1], &pod, now_ms()).unwrap();
    }
    let lookup = Op::Lookup {
        model: "m".into(),
        key: vec![1],
        candidates: None,
    };
    let mut out = vec![7];
    h.serve(
        3,
        &Request::Batch(vec![lookup; 64]),
        &Access::Write,
        &mut out,
    );
    assert_eq!(out[0], 7, "what was in the buffer stays");
    assert!(out.len() < 1 << 20, "the large answer was dropped");
    let (id, r) = answer(&out[1..]);
    assert_eq!(id, 3);
    let Response::One(Reply::Error { code, message }) = r else {
        panic!("{r:?}")
    };
    assert_eq!(ErrorCode::from_u16(code), Some(ErrorCode::FrameTooLarge));
    assert!(message.contains("of 64 ops were applied"), "{message}");
    assert_eq!(h.metrics.in_flight.get(), 0);
}

#[test]
fn heavy_requests_are_recognised() {
    let h = handler();
    let batch = Request::Batch(
        (0..30)
            .map(|_| Op::Lookup {
                model: "m".into(),
                key: vec![1; 4],
                candidates: None,
            })
            .collect(),
    );
    assert_eq!(batch.weight(), 120);
    assert!(h.is_heavy(&batch));
    assert!(!h.is_heavy(&Request::One(Op::Ping)));
    // Engine subscriptions wait for threads and locks: never inline,
    // whatever the weight allowed inline.
    let h = Handler {
        inline_blocks: usize::MAX,
        ..h
    };
    assert!(!h.is_heavy(&batch));
    assert!(h.is_heavy(&Request::One(Op::Unsubscribe { pod: "p".into() })));
}

use proptest::prelude::Strategy as _;

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(
        std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(500)
    ))]
    /// A stream of valid frames and garbage, cut at arbitrary points:
    /// the framing never panics, every answer is a well-formed response
    /// frame, nothing after a fatal error is answered, and the index only
    /// holds what the valid frames inserted.
    #[test]
    fn arbitrary_streams_get_well_formed_answers(
        parts in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
                (0u64..4, 0u64..4).prop_map(|(a, b)| frame(a, &Request::One(Op::Insert {
                    model: "m".into(), key: vec![a, b], pod: "p".into(),
                }))),
                proptest::prelude::any::<u64>().prop_map(|id| frame(id, &Request::One(Op::Ping))),
            ],
            1..12,
        ),
        cuts in proptest::collection::vec(1usize..40, 1..20),
    ) {
        let h = handler();
        let mut r = reader(&h);
        let bytes: Vec<u8> = parts.concat();
        let mut at = 0;
        let mut sizes = cuts.iter().cycle();
        let mut fatal = false;
        while at < bytes.len() {
            let n = (*sizes.next().unwrap()).min(bytes.len() - at);
            r.push(&bytes[at..at + n]);
            at += n;
            for (_, response) in run(&h, &mut r, &Access::Write) {
                proptest::prop_assert!(!fatal, "answered after a fatal error: {response:?}");
                if let Response::One(Reply::Error { code, .. }) = response {
                    let code = ErrorCode::from_u16(code);
                    fatal |= matches!(
                        code,
                        Some(ErrorCode::BadVersion | ErrorCode::UnknownKind | ErrorCode::FrameTooLarge)
                    );
                }
            }
            proptest::prop_assert_eq!(fatal, r.has_failed());
        }
        if let Err(e) = r.finish() {
            proptest::prop_assert!(!fatal);
            proptest::prop_assert_eq!(e.error.code(), ErrorCode::Malformed);
        }
        // Keys are two blocks of 0..4: at most 16 distinct, two entries each.
        proptest::prop_assert!(h.index.stats().entries <= 2 * 16);
    }
}
