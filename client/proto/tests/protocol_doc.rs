//! The test vectors of `docs/protocol.md` are this codec's bytes: every frame
//! there splits whole, decodes, and encodes back to the same bytes; a request
//! the codec refuses is followed by exactly the error frame a server sends.

use prefix_proto::{
    decode_request, decode_response, encode_request, encode_response, encode_snapshot_request,
    split_frame, FrameReader, Kind, Response, MAX_FRAME_CEILING,
};

const DOC: &str = include_str!("../../../docs/protocol.md");

/// The frames of the "Test vectors" section: each fenced block holds frames
/// separated by blank lines, one line of up to 16 hex bytes each, followed by
/// a comment from column 50 on.
fn frames() -> Vec<Vec<u8>> {
    let section = DOC
        .split("## Test vectors")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("a Test vectors section");
    let mut frames = Vec::new();
    for block in section.split("```").skip(1).step_by(2) {
        for frame in block.split("\n\n") {
            let bytes: Vec<u8> = frame
                .lines()
                .flat_map(|l| {
                    let hex = &l[..l.len().min(49)];
                    hex.split_whitespace()
                        .map_while(|t| {
                            (t.len() == 2)
                                .then(|| u8::from_str_radix(t, 16).ok())
                                .flatten()
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            if !bytes.is_empty() {
                frames.push(bytes);
            }
        }
    }
    frames
}

#[test]
fn the_documented_vectors_are_the_codecs_bytes() {
    let frames = frames();
    assert!(frames.len() >= 10, "found {} frames", frames.len());
    let mut refused = None;
    for bytes in &frames {
        let f = split_frame(bytes, MAX_FRAME_CEILING)
            .unwrap_or_else(|e| panic!("{e}: {bytes:02x?}"))
            .unwrap_or_else(|| panic!("not a whole frame: {bytes:02x?}"));
        assert_eq!(f.used, bytes.len(), "one frame, nothing after it");
        let id = f.header.request_id;
        let mut again = Vec::new();
        match f.header.kind {
            Kind::Request => match decode_request(f.payload, &Default::default()) {
                Ok(request) => {
                    encode_request(id, &request, &mut again);
                    assert_eq!(&again, bytes);
                }
                Err(e) => {
                    // The next vector is the server's answer to it.
                    encode_response(id, &Response::One(e.to_reply()), &mut again);
                    refused = Some(again);
                    continue;
                }
            },
            Kind::Snapshot => {
                assert!(f.payload.is_empty(), "a snapshot request has no payload");
                encode_snapshot_request(id, &mut again);
                assert_eq!(&again, bytes);
            }
            Kind::Response => {
                let response = decode_response(f.payload).unwrap();
                if let Some(answer) = refused.take() {
                    assert_eq!(&answer, bytes, "the answer to the refused request");
                }
                encode_response(id, &response, &mut again);
                assert_eq!(&again, bytes);
            }
        }
    }
    assert!(refused.is_none(), "a refused request without its answer");
}

/// The messages the vectors' prose describes, in the doc's order, encoded
/// by the codec: the vectors must be exactly these bytes.
#[test]
fn the_documented_vectors_are_the_messages_they_describe() {
    use prefix_proto::{
        EngineState, EngineStatus, Op, PodBlocks, PodDetail, PodView, Reply, Request, Subscription,
        WireStats,
    };
    let req = |id, r: Request| {
        let mut b = Vec::new();
        encode_request(id, &r, &mut b);
        b
    };
    let resp = |id, r: Response| {
        let mut b = Vec::new();
        encode_response(id, &r, &mut b);
        b
    };
    let vllm = Subscription {
        pod: "vllm-0".into(),
        model: "m1".into(),
        endpoint: "tcp://10.0.0.5:5557".into(),
        replay: Some("tcp://10.0.0.5:5558".into()),
        block_size: 16,
        topic: String::new(),
        media: vec!["GPU".into()],
    };
    let mut stray = req(5, Request::One(Op::Ping));
    stray.push(0);
    stray[4] = 3;
    let expected = vec![
        req(
            7,
            Request::One(Op::Lookup {
                model: "m".into(),
                key: vec![1, 300],
                candidates: None,
            }),
        ),
        req(1, Request::One(Op::Ping)),
        resp(1, Response::One(Reply::Pong)),
        req(
            2,
            Request::One(Op::Lookup {
                model: "m1".into(),
                key: vec![0x2ddd_cef0_7d26_ee8c, 300],
                candidates: Some(vec!["pod-a".into(), "pod-b".into()]),
            }),
        ),
        resp(
            2,
            Response::One(Reply::Lookup {
                key_blocks: 2,
                matches: vec![
                    PodBlocks {
                        pod: "pod-b".into(),
                        blocks: 2,
                    },
                    PodBlocks {
                        pod: "pod-a".into(),
                        blocks: 1,
                    },
                ],
            }),
        ),
        req(
            9,
            Request::One(Op::LookupDetail {
                model: "m".into(),
                key: vec![1, 300],
                candidates: None,
            }),
        ),
        resp(
            9,
            Response::One(Reply::Detail {
                key_blocks: 2,
                matches: vec![PodDetail {
                    pod: "cpu".into(),
                    blocks: 1,
                    lower_blocks: 1,
                    view: PodView::Exact,
                    age_ms: 0,
                }],
            }),
        ),
        req(
            3,
            Request::Batch(vec![
                Op::Insert {
                    model: "m1".into(),
                    key: vec![1, 2],
                    pod: "pod-a".into(),
                },
                Op::RemovePod {
                    pod: "pod-z".into(),
                },
            ]),
        ),
        resp(3, Response::Batch(vec![Reply::Done, Reply::Removed(false)])),
        resp(
            4,
            Response::One(Reply::Stats(WireStats {
                models: 1,
                pods: 2,
                nodes: 3,
                tree_blocks: 300,
                entries: 70_000,
                bytes: 5_000_000_000,
            })),
        ),
        stray,
        resp(
            5,
            Response::One(Reply::Error {
                code: 1,
                message: "malformed payload: 1 bytes left over".into(),
            }),
        ),
        req(6, Request::One(Op::Subscribe(vllm.clone()))),
        resp(6, Response::One(Reply::Done)),
        req(
            7,
            Request::Batch(vec![
                Op::ListEngines,
                Op::Unsubscribe {
                    pod: "vllm-0".into(),
                },
            ]),
        ),
        resp(
            7,
            Response::Batch(vec![
                Reply::Engines(vec![EngineState {
                    sub: vllm,
                    status: EngineStatus {
                        connected: true,
                        last_seq: Some(41),
                        events: 300,
                        blocks_stored: 20,
                        blocks_removed: 4,
                        resyncs: 0,
                        replays: 0,
                        orphaned: 0,
                        decode_errors: 0,
                        lag_ms: -3,
                        last_error: None,
                    },
                }]),
                Reply::Removed(true),
            ]),
        ),
        {
            let mut b = Vec::new();
            encode_snapshot_request(8, &mut b);
            b
        },
        resp(8, Response::One(Reply::Done)),
    ];
    assert_eq!(frames(), expected);
}

#[test]
fn the_documented_answer_to_a_cut_header_is_the_readers() {
    let mut reader = FrameReader::new(Kind::Request, 1 << 20);
    reader.push(&[0x50, 0x49, 0x01, 0x01, 0x02]);
    let mut answer = Vec::new();
    reader.finish().unwrap_err().encode(&mut answer);
    let header: Vec<String> = answer[..16].iter().map(|b| format!("{b:02x}")).collect();
    let text = DOC.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        text.contains(&header.join(" ")),
        "the doc does not show the header {}",
        header.join(" ")
    );
    assert!(text.contains(&format!("by a {}-byte frame", answer.len())));
}

/// The error table lists every code, in order, under the name its JSON
/// form carries in snake_case.
#[test]
fn the_error_table_is_the_codes() {
    let section = DOC.split("## Errors").nth(1).expect("an Errors section");
    let rows: Vec<(u16, String)> = section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            Some((cells.get(1)?.parse().ok()?, cells.get(2)?.to_string()))
        })
        .collect();
    let want: Vec<u16> = prefix_proto::ErrorCode::ALL
        .iter()
        .map(|c| *c as u16)
        .collect();
    assert_eq!(rows.iter().map(|r| r.0).collect::<Vec<_>>(), want);
    for (n, camel) in rows {
        let mut snake = String::new();
        for (i, ch) in camel.chars().enumerate() {
            if ch.is_ascii_uppercase() && i > 0 {
                snake.push('_');
            }
            snake.push(ch.to_ascii_lowercase());
        }
        assert_eq!(prefix_proto::ErrorCode::from_u16(n).unwrap().name(), snake);
    }
}
