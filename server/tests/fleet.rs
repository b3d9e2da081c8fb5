//! Precise mode at fleet scale: one server follows more engines than
//! libzmq's default socket limit (1,023 a context) lets a socket-per-engine
//! design follow, from a few threads. `FLEET_ENGINES` scales the fleet (2,000 by default). One test
//! alone in this binary: it counts the process's engine threads, and the
//! heap the server holds per engine (a counting allocator; libzmq's own
//! allocations, in C++, pass it by).

use engine_sim::sockets::{answer_replay, send_live};
use prefix_testkit::publisher::{own_prompt, stored_batch};
use prefix_testkit::server as common;

use counting_alloc::Counting;
use std::alloc::System;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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

/// Answers every replay request on `routers` with the end marker (an
/// engine with nothing buffered yet), until `stop`.
fn answer_replays(
    routers: Vec<zmq::Socket>,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<usize> {
    std::thread::spawn(move || {
        let mut answered = 0;
        // Relaxed: a stop flag; the join orders the rest.
        while !stop.load(Ordering::Relaxed) {
            let mut items: Vec<_> = routers
                .iter()
                .map(|r| r.as_poll_item(zmq::POLLIN))
                .collect();
            zmq::poll(&mut items, 50).unwrap();
            let ready: Vec<bool> = items.iter().map(|i| i.is_readable()).collect();
            for (router, _) in routers.iter().zip(ready).filter(|(_, r)| *r) {
                while let Ok(request) = router.recv_multipart(zmq::DONTWAIT) {
                    // Nothing was published before the server asks.
                    answer_replay(router, &request, b"", []).unwrap();
                    answered += 1;
                }
            }
        }
        answered
    })
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
        // XPUB: tells when the server's subscription has arrived.
        let publisher = ctx.socket(zmq::XPUB).unwrap();
        publisher.set_linger(0).unwrap();
        publisher.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = publisher.get_last_endpoint().unwrap().unwrap();
        let endpoint = match i {
            1 => endpoint.replace("127.0.0.1", "localhost"),
            _ => endpoint,
        };
        let mut sub: Subscription =
            format!("pod=e{i},model=m,endpoint={endpoint},topic=kv@e{i}@m,block-size={BLOCK}")
                .parse()
                .unwrap();
        if i % 50 == 0 {
            let router = ctx.socket(zmq::ROUTER).unwrap();
            router.set_linger(0).unwrap();
            router.bind("tcp://127.0.0.1:*").unwrap();
            sub.replay = Some(router.get_last_endpoint().unwrap().unwrap());
            routers.push(router);
        }
        publishers.push(publisher);
        subs.push(sub);
    }
    let replayers = routers.len();
    let stop = Arc::new(AtomicBool::new(false));
    let answering = answer_replays(routers, stop.clone());
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
            *seen |= p.recv_bytes(zmq::DONTWAIT).is_ok();
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
    stop.store(true, Ordering::Relaxed);
    assert!(answering.join().unwrap() >= replayers);
    server.shutdown().await;
}
