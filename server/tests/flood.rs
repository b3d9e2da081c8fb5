//! Bounded under floods: a flood of unique inserts keeps the index within
//! `max_blocks`, and a client that stops reading its answers holds up nobody.

use prefix_testkit::server as common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prefix_client::wire::{encode_request, ErrorCode, Op, Reply, Request};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_unique_inserts_stays_within_the_memory_bound() {
    const MAX_BLOCKS: u64 = 100_000;
    const CHUNK: u64 = 500;
    // 600,000 keys at least; more if the sweep has not yet made room by
    // then (so the test waits on the sweep, not on a clock), up to 20 times
    // as many.
    const CHUNKS: u64 = 1_200;
    const MAX_CHUNKS: u64 = 20 * CHUNKS;
    const CLIENTS: u64 = 4;
    const PODS: u64 = 1_000;
    let server = common::start(|cfg| {
        cfg.index.max_blocks = MAX_BLOCKS;
        cfg.index.pod_capacity = u64::MAX;
        cfg.upkeep.sweep_interval = Duration::from_millis(50);
        cfg.upkeep.snapshot_interval = None;
    })
    .await;

    // Chunks handed out, and inserts that went through, over all clients.
    let (next, inserted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let client = server.client().await;
        let (next, inserted) = (next.clone(), inserted.clone());
        tasks.push(tokio::spawn(async move {
            let (mut done, mut full) = (0u64, 0u64);
            loop {
                // Past the first CHUNKS, only until the sweep has made room
                // once: more inserts through than fit in the empty index.
                let enough = inserted.load(Ordering::Relaxed) > MAX_BLOCKS / 4;
                let chunk = next.fetch_add(1, Ordering::Relaxed);
                if chunk >= MAX_CHUNKS || (chunk >= CHUNKS && enough) {
                    break;
                }
                let ops = (0..CHUNK)
                    .map(|i| {
                        // Distinct 4-block keys, no shared prefix.
                        let n = (chunk * CHUNK + i).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                        Op::Insert {
                            model: format!("model-{}", n % 4),
                            key: vec![n, n ^ 1, n ^ 2, n ^ 3],
                            pod: format!("pod-{}", n % PODS),
                        }
                    })
                    .collect();
                let mut through = 0;
                for reply in client.batch(ops).await.unwrap() {
                    match reply {
                        Reply::Done => through += 1,
                        // The index refuses past its bound until the sweep
                        // makes room: the typed answer a flood should get.
                        Reply::Error { code, .. } if code == ErrorCode::IndexFull as u16 => {
                            full += 1
                        }
                        other => panic!("unexpected {other:?}"),
                    }
                }
                done += through;
                inserted.fetch_add(through, Ordering::Relaxed);
            }
            (done, full)
        }));
    }
    // Watch the index while the flood runs: never past its bound.
    let mut peak = 0;
    while !tasks.iter().all(|t| t.is_finished()) {
        peak = peak.max(server.index.stats().entries);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (mut done, mut full) = (0, 0);
    for t in tasks {
        let (d, f) = t.await.unwrap();
        done += d;
        full += f;
    }
    // Every chunk handed out was answered whole; a chunk number past the
    // last one is taken by each client when it stops.
    let chunks = next.load(Ordering::Relaxed) - CLIENTS;
    assert_eq!(done + full, chunks * CHUNK);
    // The sweep made room while the flood ran: more went through than fit
    // in the empty index (25,000 keys of 4 blocks).
    assert!(done > MAX_BLOCKS / 4, "only {done} inserts went through");
    assert!(peak <= MAX_BLOCKS, "{peak} entries, bound {MAX_BLOCKS}");
    common::eventually("the sweep evicts down to the target", async || {
        server.index.stats().entries <= MAX_BLOCKS * 9 / 10
    })
    .await;
    // The index's own byte count (nodes, tables, names; what it allocates)
    // stays in proportion to the bound, not to the 2.4 M or more entries
    // offered.
    let s = server.index.stats();
    assert!(
        s.bytes <= 256 * MAX_BLOCKS,
        "{} bytes for {} entries ({} B/entry)",
        s.bytes,
        s.entries,
        s.bytes / s.entries.max(1)
    );
    eprintln!(
        "flood: {done} inserted, {full} refused IndexFull, peak {peak} entries, now {} entries in {} bytes",
        s.entries, s.bytes
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_reads_holds_up_nobody() {
    let server = common::start(|cfg| cfg.transport.connection_window = 1 << 20).await;
    // The stalled client pipelines pings forever and never reads a reply.
    let stalled = common::raw(&server).await;
    let (mut send, _recv) = stalled.open_bi().await.unwrap();
    let mut frames = Vec::new();
    for id in 0..100_000 {
        encode_request(id, &Request::One(Op::Ping), &mut frames);
    }
    let flood = tokio::spawn(async move {
        for _ in 0..100 {
            if send.write_all(&frames).await.is_err() {
                return;
            }
        }
    });
    // The flood has reached the server before the good client starts.
    let metrics = server.metrics_addr.unwrap();
    common::eventually(
        "the server answers the stalled client's pings",
        async || {
            common::metric(
                metrics,
                r#"prefix_index_requests_total{op="ping",outcome="ok"}"#,
            )
            .await
                > 0.0
        },
    )
    .await;

    // Meanwhile a well-behaved client is served as usual.
    let good = server.client().await;
    good.insert("m", &[1, 2, 3], "p").await.unwrap();
    for _ in 0..200 {
        let r = good.lookup("m", &[1, 2, 3], None).await.unwrap();
        assert_eq!(r.matches.len(), 1);
    }
    // The stalled sender is held back by flow control: the server stopped
    // reading it once its answers could not be sent, instead of buffering
    // 140 MB of pings and their answers.
    assert!(!flood.is_finished(), "the server swallowed the whole flood");
    flood.abort();
    stalled.close(0u32.into(), b"done");

    good.ping().await.unwrap();
    server.shutdown().await;
}
