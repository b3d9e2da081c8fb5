//! Every operation end to end, concurrency, TTL, removal, draining at
//! shutdown, and reconnection, through the public client.

use prefix_testkit::server as common;

use std::time::Duration;

use prefix_client::wire::{ErrorCode, Op, PodBlocks, Reply};
use prefix_client::{key, Client, ClientError};

fn pb(pod: &str, blocks: u32) -> PodBlocks {
    PodBlocks {
        pod: pod.into(),
        blocks,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_end_to_end() {
    let server = common::start(|_| {}).await;
    let c = server.client().await;
    c.ping().await.unwrap();
    let prompt = "You are a helpful assistant. ".repeat(20);
    let key = key::text_key(&prompt, key::TEXT_BLOCK_BYTES);
    assert_eq!(key.len(), prompt.len() / 64);
    c.insert("m", &key, "pod-b").await.unwrap();
    c.insert("m", &key[..3], "pod-a").await.unwrap();
    c.insert("m", &key[..3], "pod-c").await.unwrap();

    let found = c.lookup("m", &key, None).await.unwrap();
    assert_eq!(found.key_blocks, key.len() as u32);
    assert_eq!(
        found.matches,
        [
            pb("pod-b", key.len() as u32),
            pb("pod-a", 3),
            pb("pod-c", 3)
        ]
    );
    let only = c
        .lookup("m", &key, Some(&["pod-c", "nobody"]))
        .await
        .unwrap();
    assert_eq!(only.matches, [pb("pod-c", 3)]);
    assert!(c
        .lookup("other", &key, None)
        .await
        .unwrap()
        .matches
        .is_empty());

    let s = c.stats().await.unwrap();
    assert_eq!((s.models, s.pods), (1, 3));
    assert_eq!(s.entries, key.len() as u64 + 6);

    c.set_pod_capacity("pod-b", 2).await.unwrap();
    common::eventually("capacity eviction", async || {
        server.index.pod_blocks("pod-b") == 2
    })
    .await;
    assert_eq!(
        c.lookup("m", &key, Some(&["pod-b"])).await.unwrap().matches,
        [pb("pod-b", 2)]
    );

    assert!(c.remove_pod("pod-a").await.unwrap());
    assert!(!c.remove_pod("pod-a").await.unwrap());
    assert_eq!(
        c.lookup("m", &key, None).await.unwrap().matches,
        [pb("pod-c", 3), pb("pod-b", 2)]
    );

    let replies = c
        .batch(vec![
            Op::Insert {
                model: "m2".into(),
                key: vec![7, 8],
                pod: "p".into(),
            },
            Op::Lookup {
                model: "m2".into(),
                key: vec![7, 8, 9],
                candidates: None,
            },
            Op::Insert {
                model: "m2".into(),
                key: vec![1],
                pod: String::new(),
            },
            Op::Ping,
        ])
        .await
        .unwrap();
    assert_eq!(replies[0], Reply::Done);
    assert_eq!(
        replies[1],
        Reply::Lookup {
            key_blocks: 3,
            matches: vec![pb("p", 2)]
        }
    );
    assert!(matches!(&replies[2], Reply::Error { code, .. } if *code == ErrorCode::BadName as u16));
    assert_eq!(replies[3], Reply::Pong);

    // Metrics and probes answer over HTTP.
    let metrics = common::http_get(server.metrics_addr.unwrap(), "/metrics").await;
    assert!(metrics.contains("prefix_index_requests_total{op=\"lookup\",outcome=\"ok\"}"));
    assert!(metrics.contains("prefix_index_index_entries"));
    assert!(metrics.contains("prefix_index_sweep_calls_total"));
    #[cfg(target_os = "linux")]
    {
        // The metric is there, and counts (the "process" is this test's,
        // which has done work by now).
        let cpu = common::metric(
            server.metrics_addr.unwrap(),
            "prefix_index_process_cpu_seconds_total",
        )
        .await;
        assert!(cpu > 0.0, "{metrics}");
    }
    assert!(common::http_get(server.metrics_addr.unwrap(), "/readyz")
        .await
        .starts_with("HTTP/1.1 200"));
    assert!(common::http_get(server.metrics_addr.unwrap(), "/healthz")
        .await
        .starts_with("HTTP/1.1 200"));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_lose_no_insert() {
    let server = common::start(|_| {}).await;
    let (clients, per_client) = (8u64, 300u64);
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = server.client().await;
        tasks.push(tokio::spawn(async move {
            // Each client inserts keys sharing a prefix with everyone's, in
            // pipelined batches and single calls alike.
            for i in 0..per_client {
                let key = [1, 2, c * 1000 + i + 10, i];
                let pod = format!("pod-{}", (c + i) % 5);
                if i % 2 == 0 {
                    client.insert("m", &key, &pod).await.unwrap();
                } else {
                    let op = Op::Insert {
                        model: "m".into(),
                        key: key.to_vec(),
                        pod,
                    };
                    assert_eq!(client.batch(vec![op]).await.unwrap(), [Reply::Done]);
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let c = server.client().await;
    for cl in 0..clients {
        let lookups: Vec<Op> = (0..per_client)
            .map(|i| Op::Lookup {
                model: "m".into(),
                key: vec![1, 2, cl * 1000 + i + 10, i],
                candidates: Some(vec![format!("pod-{}", (cl + i) % 5)]),
            })
            .collect();
        for (i, r) in c.batch(lookups).await.unwrap().into_iter().enumerate() {
            let Reply::Lookup { matches, .. } = r else {
                panic!("{r:?}")
            };
            assert_eq!(matches.len(), 1, "client {cl} insert {i} lost");
            assert_eq!(matches[0].blocks, 4);
        }
    }
    assert_eq!(c.stats().await.unwrap().pods, 5);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_polling_server_serves_idles_and_stops() {
    // Spinners take every worker of this runtime; requests still get through
    // (the spinners yield), before and after they park. A drain that never
    // times out makes shutdown wait for the spinners too: if they ignored it,
    // the server would not stop.
    let server = common::start(|cfg| {
        cfg.transport.busy_poll = Some(Duration::from_millis(20));
        cfg.transport.drain_timeout = Duration::from_secs(3600);
    })
    .await;
    let spinners = server.metrics.busy_spinners.clone();
    let c = server.client().await;
    c.insert("m", &[1, 2, 3], "p").await.unwrap();
    assert_eq!(
        c.lookup("m", &[1, 2], None).await.unwrap().matches,
        [pb("p", 2)]
    );
    // No read for the window: every spinner parks.
    common::eventually("the spinners park", async || spinners.get() == 0).await;
    assert_eq!(
        c.lookup("m", &[1, 2, 3], None).await.unwrap().matches,
        [pb("p", 3)]
    );
    // Reads again: they spin again (both, one per worker), until reads stop.
    common::eventually("the spinners spin", async || {
        c.ping().await.unwrap();
        spinners.get() == 2
    })
    .await;
    server.shutdown().await;
    assert_eq!(spinners.get(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ttl_expiry_is_seen_over_the_network() {
    let server = common::start(|cfg| {
        cfg.index.ttl = Duration::from_secs(1);
        cfg.upkeep.sweep_interval = Duration::from_millis(50);
    })
    .await;
    let c = server.client().await;
    c.insert("m", &[1, 2, 3], "p").await.unwrap();
    assert_eq!(
        c.lookup("m", &[1, 2], None).await.unwrap().matches,
        [pb("p", 2)]
    );
    common::eventually("entries expire", async || {
        c.lookup("m", &[1, 2], None)
            .await
            .unwrap()
            .matches
            .is_empty()
    })
    .await;
    common::eventually("the sweep frees them", async || {
        c.stats().await.unwrap().entries == 0
    })
    .await;
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_typed_and_leave_the_index_alone() {
    let server = common::start(|cfg| {
        cfg.index.max_key_blocks = 8;
        cfg.index.max_name_len = 10;
        cfg.index.max_pods = 2;
    })
    .await;
    let c = server.client().await;
    // Past the client's own limits, a call fails without being sent.
    let past = prefix_client::wire::Limits::default().max_key_blocks + 1;
    let e = c.insert("m", &vec![1; past], "p").await.unwrap_err();
    assert!(matches!(e, ClientError::Invalid(_)), "{e}");
    // Past the server's tighter limits, the server answers typed errors.
    let e = c.insert("m", &[1; 9], "p").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::KeyTooLong), "{e}");
    let e = c
        .insert("m", &[1], "a-very-long-pod-name")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::BadName), "{e}");
    c.insert("m", &[1], "p1").await.unwrap();
    c.insert("m", &[1], "p2").await.unwrap();
    let e = c.insert("m", &[1], "p3").await.unwrap_err();
    assert_eq!(e.code(), Some(ErrorCode::TooManyPods), "{e}");
    assert_eq!(c.stats().await.unwrap().entries, 2);
    server.shutdown().await;
}

/// A server taking the largest frames, a client allowed to send them, and
/// `n` lookups that are slow to serve: pods sit at every 8th depth of one
/// 2,048-block key, so each lookup walks 256 nodes and lists 256 pods.
async fn deep_index(n: usize) -> (common::TestServer, Client, Vec<Op>) {
    let server = common::start(|cfg| {
        cfg.limits.max_frame_bytes = 16 << 20;
        cfg.limits.max_batch = 4096;
    })
    .await;
    let mut cfg = server.client_config();
    cfg.limits.max_frame_bytes = 16 << 20;
    cfg.limits.max_batch = 4096;
    let c = Client::connect(server.addr, cfg).await.unwrap();
    let key: Vec<u64> = (0..2048).collect();
    let inserts: Vec<Op> = (1..=256u64)
        .map(|i| Op::Insert {
            model: "m".into(),
            key: key[..(i * 8) as usize].to_vec(),
            pod: format!("p{i}"),
        })
        .collect();
    c.batch(inserts).await.unwrap();
    let lookups = (0..n)
        .map(|_| Op::Lookup {
            model: "m".into(),
            key: key.clone(),
            candidates: None,
        })
        .collect();
    (server, c, lookups)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_drains_requests_in_flight() {
    // A heavy batch (run on the blocking pool) is caught in flight, then the
    // server is told to stop: the batch must still be answered in full, the
    // server must exit cleanly, and new calls must fail fast.
    let (mut server, c, lookups) = deep_index(600).await;
    let mut caught = false;
    for _attempt in 0..20 {
        let c2 = c.clone();
        let batch = lookups.clone();
        let call = tokio::spawn(async move { c2.batch(batch).await });
        while !call.is_finished() && server.metrics.in_flight.get() == 0 {
            tokio::task::yield_now().await;
        }
        if call.is_finished() {
            call.await.unwrap().unwrap();
            continue;
        }
        server.begin_shutdown();
        let replies = call.await.unwrap().expect("an in-flight batch is answered");
        assert_eq!(replies.len(), 600);
        assert!(replies
            .iter()
            .all(|r| matches!(r, Reply::Lookup { matches, .. } if matches.len() == 256)));
        caught = true;
        break;
    }
    assert!(caught, "never caught a batch in flight");
    let task = server.task.take().unwrap();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    let e = c.ping().await.unwrap_err();
    assert!(matches!(e, ClientError::Disconnected { .. }), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_closes_connections_with_code_0_and_its_reason() {
    // Two connections: one idle, one with a finished stream whose answer the
    // drain must still deliver. Both are closed with the documented reason.
    let server = common::start(|_| {}).await;
    let idle = common::raw(&server).await;
    let busy = common::raw(&server).await;
    let (mut send, mut recv) = busy.open_bi().await.unwrap();
    let mut frame = Vec::new();
    prefix_client::wire::encode_request(
        3,
        &prefix_client::wire::Request::One(Op::Ping),
        &mut frame,
    );
    send.write_all(&frame).await.unwrap();
    send.finish().unwrap();
    let answer = recv.read_to_end(1 << 20).await.unwrap();
    assert!(!answer.is_empty(), "the ping is answered");
    server.shutdown().await;
    for conn in [idle, busy] {
        match conn.closed().await {
            quinn::ConnectionError::ApplicationClosed(close) => {
                assert_eq!(u64::from(close.error_code), 0);
                assert_eq!(&close.reason[..], b"server shutting down");
            }
            other => panic!("closed otherwise: {other}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heavy_frame_does_not_hold_up_the_next_one() {
    // One stream: the heavy batch goes to the blocking pool and the ping sent
    // after it on the same stream is answered first.
    let (server, c, lookups) = deep_index(600).await;
    c.ping().await.unwrap();
    let mut overtaken = false;
    for _attempt in 0..20 {
        let (c2, batch) = (c.clone(), lookups.clone());
        let call = tokio::spawn(async move { c2.batch(batch).await });
        while !call.is_finished() && server.metrics.in_flight.get() == 0 {
            tokio::task::yield_now().await;
        }
        c.ping().await.unwrap();
        overtaken |= !call.is_finished();
        assert_eq!(call.await.unwrap().unwrap().len(), 600);
        if overtaken {
            break;
        }
    }
    assert!(overtaken, "the ping never overtook the heavy batch");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_reconnects_after_a_restart() {
    let first = common::start(|_| {}).await;
    let addr = first.addr;
    let c = first.client().await;
    c.insert("m", &[1], "p").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    // Keep the certificate, as a restarted server does with its data dir.
    std::fs::copy(
        first.dir.path().join("cert.pem"),
        dir.path().join("cert.pem"),
    )
    .unwrap();
    std::fs::copy(first.dir.path().join("key.pem"), dir.path().join("key.pem")).unwrap();
    first.shutdown().await;

    // While it is down, calls fail at once with a clear error (well within
    // their deadline: the client does not wait for a dead server).
    let e = c.ping().await.unwrap_err();
    assert!(matches!(e, ClientError::Disconnected { .. }), "{e}");

    let mut cfg = common::config(&dir);
    cfg.transport.listen = addr;
    let second = common::start_with(cfg, dir).await;
    common::eventually("the client reconnects", async || c.ping().await.is_ok()).await;
    assert!(c.is_connected());
    c.insert("m", &[1], "p").await.unwrap();
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_deadline_times_out_instead_of_waiting() {
    let (server, c, heavy) = deep_index(2000).await;
    // Two thousand deep lookups take far longer than a microsecond.
    let hurried = c.with_deadline(Duration::from_micros(1));
    let e = hurried.batch(heavy).await.unwrap_err();
    assert!(matches!(e, ClientError::Timeout(_)), "{e}");
    // The connection is still good for the next call.
    c.ping().await.unwrap();
    server.shutdown().await;
}
