//! Garbage, truncated, oversized and unknown frames, sent on raw QUIC
//! streams: each gets its typed error, the index is untouched, and the server
//! keeps serving a well-behaved client meanwhile.

use prefix_testkit::server as common;

use prefix_client::wire::{
    self, ErrorCode, Op, Reply, Request, Response, HEADER_LEN, MAX_FRAME_CEILING,
};

/// Sends `bytes` on a new stream, finishes it, and reads every answer frame
/// until the server ends the stream.
async fn exchange(conn: &quinn::Connection, bytes: &[u8]) -> Vec<(u64, Response)> {
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(bytes).await.unwrap();
    let _ = send.finish();
    frames(&recv.read_to_end(64 << 20).await.unwrap())
}

/// The answer frames in `all`, which holds nothing else.
fn frames(all: &[u8]) -> Vec<(u64, Response)> {
    let mut at = 0;
    let mut out = Vec::new();
    while let Some(f) = wire::split_frame(&all[at..], MAX_FRAME_CEILING).unwrap() {
        out.push((
            f.header.request_id,
            wire::decode_response(f.payload).unwrap(),
        ));
        at += f.used;
    }
    assert_eq!(at, all.len(), "trailing bytes in the answers");
    out
}

fn code_of(r: &Response) -> Option<ErrorCode> {
    match r {
        Response::One(Reply::Error { code, .. }) => ErrorCode::from_u16(*code),
        _ => None,
    }
}

fn request(id: u64, r: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    wire::encode_request(id, r, &mut out);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_frames_get_typed_errors_and_the_server_keeps_serving() {
    // Small limits, so that frames over them are small.
    let server = common::start(|cfg| {
        cfg.limits.max_frame_bytes = 4096;
        cfg.index.max_key_blocks = 2048;
    })
    .await;
    let good = server.client().await;
    good.insert("m", &[1, 2], "p").await.unwrap();
    let conn = common::raw(&server).await;

    // Garbage: not our magic. Answered, then the stream is closed.
    let a = exchange(&conn, b"GET / HTTP/1.1\r\nHost: example\r\n\r\n").await;
    assert_eq!(a.len(), 1);
    assert_eq!(code_of(&a[0].1), Some(ErrorCode::BadVersion));

    // A future protocol version.
    let mut v2 = request(5, &Request::One(Op::Ping));
    v2[2] = 2;
    let a = exchange(&conn, &v2).await;
    assert_eq!((a[0].0, code_of(&a[0].1)), (5, Some(ErrorCode::BadVersion)));

    // An unknown frame kind.
    let mut kind = request(6, &Request::One(Op::Ping));
    kind[3] = 7;
    let a = exchange(&conn, &kind).await;
    assert_eq!(
        (a[0].0, code_of(&a[0].1)),
        (6, Some(ErrorCode::UnknownKind))
    );

    // Oversized: the header alone is refused; the payload is never read.
    let mut big = request(7, &Request::One(Op::Ping));
    big[4..8].copy_from_slice(&(1u32 << 30).to_le_bytes());
    let a = exchange(&conn, &big).await;
    assert_eq!(
        (a[0].0, code_of(&a[0].1)),
        (7, Some(ErrorCode::FrameTooLarge))
    );

    // Truncated: the stream ends inside a frame.
    let whole = request(8, &Request::One(Op::Ping));
    let a = exchange(&conn, &whole[..whole.len() - 1]).await;
    assert_eq!((a[0].0, code_of(&a[0].1)), (8, Some(ErrorCode::Malformed)));
    let a = exchange(&conn, &whole[..5]).await;
    assert_eq!(code_of(&a[0].1), Some(ErrorCode::Malformed));

    // An unknown op (a variant this version lacks), then a good frame on the
    // same stream: the first is refused, the second answered.
    let mut unknown = request(9, &Request::One(Op::Ping));
    unknown[HEADER_LEN + 1] = 42;
    unknown.extend(request(10, &Request::One(Op::Ping)));
    let a = exchange(&conn, &unknown).await;
    assert_eq!((a[0].0, code_of(&a[0].1)), (9, Some(ErrorCode::Malformed)));
    assert_eq!(a[1], (10, Response::One(Reply::Pong)));

    // Over-limit keys and names, and a batch over max_batch.
    let long_key = Request::One(Op::Insert {
        model: "m".into(),
        key: vec![9; 3000],
        pod: "q".into(),
    });
    let long_name = Request::One(Op::Insert {
        model: "m".into(),
        key: vec![9],
        pod: "q".repeat(300),
    });
    let empty_model = Request::One(Op::Lookup {
        model: String::new(),
        key: vec![9],
        candidates: None,
    });
    let mut bytes = request(11, &long_key);
    bytes.extend(request(12, &long_name));
    bytes.extend(request(13, &empty_model));
    bytes.extend(request(14, &Request::Batch(vec![Op::Ping; 1025])));
    let a = exchange(&conn, &bytes).await;
    let got: Vec<_> = a.iter().map(|(id, r)| (*id, code_of(r))).collect();
    assert_eq!(
        got,
        [
            (11, Some(ErrorCode::KeyTooLong)),
            (12, Some(ErrorCode::BadName)),
            (13, Some(ErrorCode::BadName)),
            (14, Some(ErrorCode::BatchTooLarge)),
        ]
    );

    // A response frame sent to the server.
    let mut resp = Vec::new();
    wire::encode_response(15, &Response::One(Reply::Pong), &mut resp);
    let a = exchange(&conn, &resp).await;
    assert_eq!(
        (a[0].0, code_of(&a[0].1)),
        (15, Some(ErrorCode::UnknownKind))
    );

    // Nothing above changed the index; the good client was served throughout
    // and still is.
    let s = good.stats().await.unwrap();
    assert_eq!((s.entries, s.pods, s.models), (2, 1, 1));
    assert_eq!(
        good.lookup("m", &[1, 2], None).await.unwrap().matches.len(),
        1
    );
    let metrics = server.metrics.render(&server.index);
    assert!(
        metrics.contains("prefix_index_requests_total{op=\"frame\",outcome=\"error\"} 9"),
        "{metrics}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stream_does_not_close_the_connection() {
    let server = common::start(|_| {}).await;
    let conn = common::raw(&server).await;
    let a = exchange(&conn, &[0xFF; 40]).await;
    assert_eq!(code_of(&a[0].1), Some(ErrorCode::BadVersion));
    // Same connection, new stream: fine.
    let a = exchange(&conn, &request(1, &Request::One(Op::Ping))).await;
    assert_eq!(a, [(1, Response::One(Reply::Pong))]);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_behind_a_fatal_frame_is_served_even_after_heavy_work_finishes() {
    // Every frame is heavy here, so the stream has work on the blocking pool
    // when the fatal frame arrives; finishing it must not resume the stream.
    let server = common::start(|cfg| cfg.limits.inline_blocks = 1).await;
    let conn = common::raw(&server).await;
    let heavy = Request::Batch(
        (0..64)
            .map(|i| Op::Lookup {
                model: "m".into(),
                key: (0..512).map(|b| b * 64 + i).collect(),
                candidates: None,
            })
            .collect(),
    );
    let mut bytes = request(1, &heavy);
    // A response frame sent to the server: the stream's framing is lost.
    let mut fatal = Vec::new();
    wire::encode_response(2, &Response::One(Reply::Pong), &mut fatal);
    bytes.extend(fatal);
    bytes.extend(request(
        3,
        &Request::One(Op::Insert {
            model: "m".into(),
            key: vec![7, 7],
            pod: "behind-the-fatal-frame".into(),
        }),
    ));
    let answers = exchange(&conn, &bytes).await;
    let ids: Vec<u64> = answers.iter().map(|a| a.0).collect();
    assert!(ids.contains(&1) && ids.contains(&2), "{ids:?}");
    assert!(
        !ids.contains(&3),
        "a frame behind the fatal one was served: {ids:?}"
    );
    assert_eq!(server.index.stats().entries, 0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_that_stall_are_refused_while_a_client_is_served() {
    let read_timeout = std::time::Duration::from_secs(1);
    let server = common::start(|cfg| cfg.transport.read_timeout = read_timeout).await;
    // Whole frames further apart than the timeout are no stall.
    let conn = common::raw(&server).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&request(1, &Request::One(Op::Ping)))
        .await
        .unwrap();
    tokio::time::sleep(read_timeout * 3 / 2).await;
    send.write_all(&request(2, &Request::One(Op::Ping)))
        .await
        .unwrap();
    send.finish().unwrap();
    let all = frames(&recv.read_to_end(1 << 20).await.unwrap());
    let pong = Response::One(Reply::Pong);
    assert_eq!(all, [(1, pong.clone()), (2, pong)]);
    // Streams that stop inside a frame: inside its header, and inside its
    // payload, on connections of their own. `STALLED_CONNECTIONS` sets how
    // many (the figures in docs/protocol.md come from 1,000).
    let each = common::count_from_env("STALLED_CONNECTIONS", 20);
    let before = common::resident_bytes();
    let ping = request(3, &Request::One(Op::Ping));
    let mut stalled = Vec::new();
    for i in 0..each {
        let conn = common::raw(&server).await;
        let (mut send, recv) = conn.open_bi().await.unwrap();
        let cut = if i % 2 == 0 { 5 } else { ping.len() - 1 };
        send.write_all(&ping[..cut]).await.unwrap();
        stalled.push((std::time::Instant::now(), conn, send, recv));
    }
    println!(
        "{} stalled QUIC connections held; this process grew {} bytes per connection (client and server sides)",
        server.metrics.connections.get(),
        common::resident_bytes().saturating_sub(before) / each as u64
    );
    // A client is served meanwhile.
    let good = server.client().await;
    good.insert("m", &[1, 2], "p").await.unwrap();
    let mut lived = std::time::Duration::ZERO;
    for (opened, _conn, _send, mut recv) in stalled {
        let all = tokio::time::timeout(read_timeout * 20, recv.read_to_end(1 << 20))
            .await
            .expect("a stalled frame is answered")
            .unwrap();
        lived = lived.max(opened.elapsed());
        let answer = frames(&all);
        assert_eq!(answer.len(), 1, "{answer:?}");
        assert_eq!(
            code_of(&answer[0].1),
            Some(ErrorCode::Malformed),
            "{answer:?}"
        );
    }
    println!(
        "every stalled frame answered and its stream closed; the longest after {lived:?} against read-timeout {read_timeout:?}"
    );
    assert_eq!(
        good.lookup("m", &[1, 2], None).await.unwrap().matches.len(),
        1
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_left_unread_reset_the_stream_while_a_client_is_served() {
    let write_timeout = std::time::Duration::from_secs(1);
    let server = common::start(|cfg| cfg.transport.write_timeout = write_timeout).await;
    // A key 1,000 pods hold: a batch of 1,024 lookups of it answers about
    // 10 MB, past what the client's windows take unread.
    let good = server
        .client()
        .await
        .with_deadline(std::time::Duration::from_secs(10));
    let pods: Vec<Op> = (0..1000)
        .map(|p| Op::Insert {
            model: "m".into(),
            key: vec![1],
            pod: format!("pod-{p}"),
        })
        .collect();
    good.call(Request::Batch(pods)).await.unwrap();
    let lookup = Op::Lookup {
        model: "m".into(),
        key: vec![1],
        candidates: None,
    };
    let conn = common::raw(&server).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&request(1, &Request::Batch(vec![lookup; 1024])))
        .await
        .unwrap();
    // Nothing is read for a while: the server's write stays blocked.
    tokio::time::sleep(write_timeout * 3).await;
    assert_eq!(
        good.lookup("m", &[1], None).await.unwrap().matches.len(),
        1000
    );
    let read = tokio::time::timeout(write_timeout * 20, recv.read_to_end(64 << 20))
        .await
        .expect("the stream ends");
    let code = u32::from(ErrorCode::Unavailable as u16).into();
    assert!(
        matches!(read, Err(quinn::ReadToEndError::Read(quinn::ReadError::Reset(c))) if c == code),
        "{read:?}"
    );
    server.shutdown().await;
}
