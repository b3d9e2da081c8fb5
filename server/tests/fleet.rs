//! Precise mode at fleet scale: one server follows more engines than
//! libzmq's default socket limit (1,023 a context) lets a socket-per-engine
//! design follow, from a few threads. `FLEET_ENGINES` scales the fleet (2,000 by default). One test
//! alone in this binary: it counts the process's engine threads, and the
//! heap the server holds per engine (a counting allocator; libzmq's own
//! allocations, in C++, pass it by).

use engine_sim::sockets::{self, answer_replay, send_live, Engine, Replies, ANY_PORT};
use prefix_testkit::publisher::{own_prompt, stored_batch};
use prefix_testkit::server as common;

use counting_alloc::Counting;
use std::alloc::System;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prefix_proto::key::token_key;
use prefix_server::Subscription;

const BLOCK: usize = 16;

/// Counts live heap bytes, for the server's cost per engine.
#[global_allocator]
static ALLOC: Counting<System> = Counting::new(System);

/// The most heap the server may hold per followed engine (its session,
/// counters, engine state, pod and view), its own fixed heap shared out
/// among them: a few KiB today, where a buffer per engine would be tens.
const MAX_HEAP_PER_ENGINE: isize = 8 << 10;

/// Publishers per libzmq context (each context allows 1,023 sockets).
const PER_CONTEXT: usize = 400;

/// Engine `i`'s prompt: 2 blocks of its own.
fn prompt(i: usize) -> Vec<u32> {
    own_prompt(i, 2, BLOCK)
}

fn batch(i: usize) -> Vec<u8> {
    stored_batch(prompt(i), BLOCK)
}

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// Every engine of a fleet is followed through a few threads: each is
/// connected, each one's batch applied, lookups right for a sample of
/// them. Every 50th engine has a replay endpoint, asked on connecting with
/// at most 4 replays at once; one engine is named by host name (a socket
/// of its own). No engine thread comes per engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_follows_thousands_of_engines_from_few_threads() {
    let n = common::count_from_env("FLEET_ENGINES", 2_000);
    // The publishers' descriptors (3 an engine) and the server's.
    prefix_server::raise_open_files(4 * n as u64 + 1_024).unwrap();
    let contexts: Vec<zmq::Context> = (0..n.div_ceil(PER_CONTEXT))
        .map(|_| zmq::Context::new())
        .collect();
    let mut publishers = Vec::new();
    let mut routers = Vec::new();
    let mut subs = Vec::new();
    for i in 0..n {
        let ctx = &contexts[i / PER_CONTEXT];
        let engine = Engine::bind(ctx, ANY_PORT, (i % 50 == 0).then_some(ANY_PORT)).unwrap();
        let endpoint = match i {
            1 => engine.live.endpoint.replace("127.0.0.1", "localhost"),
            _ => engine.live.endpoint,
        };
        let mut sub: Subscription =
            format!("pod=e{i},model=m,endpoint={endpoint},topic=kv@e{i}@m,block-size={BLOCK}")
                .parse()
                .unwrap();
        if let Some(router) = engine.replay {
            sub.replay = Some(router.endpoint);
            routers.push(router.socket);
        }
        publishers.push(engine.live.socket);
        subs.push(sub);
    }
    let replayers = routers.len();
    // Each request is answered with the end marker alone: nothing was
    // published before the server asks.
    let answered = Arc::new(AtomicUsize::new(0));
    let count = answered.clone();
    let answering = Replies::spawn("replay".into(), routers, move |_, router, request| {
        answer_replay(router, request, b"", []).unwrap();
        // Relaxed: a count, read after the replies stop.
        count.fetch_add(1, Ordering::Relaxed);
    })
    .unwrap();
    let heap_before = ALLOC.live();
    let server = common::start(|cfg| {
        cfg.engines.subscriptions = subs;
        cfg.engines.max_engines = n;
        cfg.engines.max_replays = 4;
    })
    .await;
    common::eventually("every engine is connected", async || {
        server.engines_list().iter().all(|(_, st)| st.connected)
    })
    .await;
    // Only then may a batch be published: a PUB drops what it has no
    // subscriber for yet.
    let mut subscribed = vec![false; n];
    common::eventually("every engine has the server's subscription", async || {
        for (p, seen) in publishers.iter().zip(&mut subscribed) {
            *seen |= sockets::subscribed(p, Duration::ZERO).unwrap();
        }
        subscribed.iter().all(|s| *s)
    })
    .await;
    server.index.reclaim();
    let per_engine = (ALLOC.live() - heap_before) / n as isize;
    eprintln!("the server's heap: {per_engine} bytes per engine followed");
    // Below a thousand engines the server's fixed heap (a few MB) would be
    // most of the share.
    if n >= 1_000 {
        assert!(
            per_engine <= MAX_HEAP_PER_ENGINE,
            "{per_engine} bytes per engine"
        );
    }
    for (i, p) in publishers.iter().enumerate() {
        let topic = format!("kv@e{i}@m");
        send_live(p, topic.as_bytes(), 0, &batch(i)).unwrap();
    }
    common::eventually("every engine's batch is applied", async || {
        server
            .engines_list()
            .iter()
            .all(|(_, st)| st.last_seq == Some(0) && st.blocks_stored == 2)
    })
    .await;
    let client = server.client().await;
    for i in (0..n).step_by(n / 40).chain([1]) {
        let got = client
            .lookup("m", &token_key(&prompt(i), BLOCK), None)
            .await
            .unwrap();
        let pods: Vec<(&str, u32)> = got
            .matches
            .iter()
            .map(|m| (m.pod.as_str(), m.blocks))
            .collect();
        assert_eq!(pods, [(format!("e{i}").as_str(), 2)], "engine {i}");
    }
    let states = server.engines_list();
    let with_replay = states.iter().filter(|(s, _)| s.replay.is_some());
    assert!(with_replay
        .clone()
        .all(|(_, st)| st.replays >= 1 && st.resyncs == 0));
    assert_eq!(with_replay.count(), replayers);
    assert!(
        states.iter().all(|(_, st)| st.last_error.is_none()),
        "{:?}",
        states.iter().find(|(_, st)| st.last_error.is_some())
    );
    // The server's engine threads: its shards, however many engines, and
    // libzmq's I/O and reaper threads.
    assert_eq!(
        threads_named("engine-shard-"),
        server.engines.config().threads
    );
    assert_eq!(threads_named("engine-zmq"), 2);
    let standing = server.engines.standing(0);
    assert_eq!(
        (standing.followed, standing.connected, standing.failing),
        (n, n, 0)
    );
    answering.join().unwrap();
    // Relaxed: the replies' thread has been joined.
    assert!(answered.load(Ordering::Relaxed) >= replayers);
    server.shutdown().await;
}
