//! Precise mode end to end: the real server subscribed to an engine that
//! speaks vLLM's framing through libzmq itself (a PUB socket and a ROUTER
//! replay socket, as the engines' pyzmq does), with a lost batch that the
//! replay fills, a restart of the server in between (its snapshot keeps the
//! engine's blocks, so later events find their parents), and a restart of
//! the engine (sequence back to 0, empty cache). After each step, gateway
//! lookups by token key must match the engine's own cache.

use engine_sim::sockets;
use prefix_testkit::publisher::{payload, Publisher};
use prefix_testkit::server as common;

use std::collections::HashMap;

use prefix_client::Client;
use prefix_events::{Event, Removed, Stored};
use prefix_proto::key::token_key;
use prefix_server::Subscription;

const BLOCK: usize = 16;
const TOPIC: &str = "kv";
const POD: &str = "vllm-0";

/// Prompt `p` of `blocks` blocks; prompts share their first two blocks.
fn prompt(p: u32, blocks: usize) -> Vec<u32> {
    (0..blocks * BLOCK)
        .map(|i| {
            let owner = if i < 2 * BLOCK { 0 } else { p };
            owner * 100_000 + i as u32
        })
        .collect()
}

/// The engine's hashes of `tokens`, chained as vLLM's are.
fn hashes(tokens: &[u32]) -> Vec<u64> {
    engine_sim::chain_hashes(tokens, BLOCK)
}

fn stored(parent: Option<u64>, hashes: &[u64], tokens: &[u32]) -> Event {
    Event::Stored(Stored {
        hashes: hashes.to_vec(),
        parent,
        tokens: tokens.to_vec(),
        block_size: BLOCK as u32,
        lora_name: None,
        medium: Some("GPU".into()),
        ..Default::default()
    })
}

/// An engine: its cache (copies per block hash), and its sockets (the
/// test kit's fake engine: a publisher and a replay socket answered by a
/// thread, as vLLM's publisher thread does).
struct Engine {
    sockets: Publisher,
    seq: u64,
    cached: HashMap<u64, u32>,
}

impl Engine {
    /// Binds on `endpoints` (`tcp://127.0.0.1:*` twice for new ports).
    fn start(ctx: &zmq::Context, endpoints: (&str, &str)) -> Engine {
        Engine {
            sockets: Publisher::bind_at(ctx, TOPIC, endpoints.0, Some(endpoints.1)),
            seq: 0,
            cached: HashMap::new(),
        }
    }

    /// Binds on new loopback ports.
    fn bind(ctx: &zmq::Context) -> Engine {
        let any = "tcp://127.0.0.1:*";
        Engine::start(ctx, (any, any))
    }

    /// The engine restarted: sequence from 0, nothing cached, its sockets
    /// bound again on the same ports.
    fn restarted(self, ctx: &zmq::Context) -> Engine {
        let replay = self.sockets.replay.clone().expect("a replay socket");
        let endpoints = (self.sockets.endpoint.clone(), replay);
        drop(self);
        Engine::start(ctx, (&endpoints.0, &endpoints.1))
    }

    /// The server's subscription to this engine as pod `POD` of model `m`.
    fn subscription(&self) -> Subscription {
        Subscription {
            pod: POD.into(),
            model: "m".into(),
            endpoint: self.sockets.endpoint.clone(),
            replay: self.sockets.replay.clone(),
            block_size: BLOCK as u32,
            topic: TOPIC.into(),
            media: vec!["GPU".into()],
        }
    }

    /// Waits until the server's subscription has reached the publisher.
    fn subscribed(&self) {
        self.sockets.subscribed();
    }

    /// A network blip: the same engine, its numbers and buffer as they were.
    fn reconnect(&mut self, ctx: &zmq::Context) {
        self.sockets.reconnect(ctx);
    }

    /// Keeps only the newest `keep` batches in the replay buffer.
    fn roll(&self, keep: usize) {
        self.sockets.roll(keep);
    }

    /// Publishes a batch (or, with `lost`, only buffers it: the PUB socket
    /// dropped it for this subscriber).
    fn publish(&mut self, payload: Vec<u8>, lost: bool) {
        let seq = self.seq;
        self.seq += 1;
        match lost {
            false => self.sockets.publish(seq, &payload),
            true => self.sockets.keep(seq, &payload),
        }
    }

    /// Caches blocks `from..to` of `tokens` (the ones before are cached).
    fn store(&mut self, tokens: &[u32], from: usize, to: usize, lost: bool) {
        let hs = hashes(&tokens[..to * BLOCK]);
        let event = stored(
            from.checked_sub(1).map(|i| hs[i]),
            &hs[from..to],
            &tokens[from * BLOCK..to * BLOCK],
        );
        for h in &hs[from..to] {
            *self.cached.entry(*h).or_default() += 1;
        }
        self.publish(payload(vec![event]), lost);
    }

    /// Evicts block `i` of `tokens`.
    fn evict(&mut self, tokens: &[u32], i: usize, lost: bool) {
        let h = hashes(tokens)[i];
        let c = self.cached.get_mut(&h).expect("cached");
        *c -= 1;
        let event = Event::Removed(Removed {
            hashes: [h].into(),
            medium: Some("GPU".into()),
            group: None,
        });
        self.publish(payload(vec![event]), lost);
    }

    /// Leading blocks of `tokens` the engine could reuse.
    fn cached_blocks(&self, tokens: &[u32]) -> u32 {
        hashes(tokens)
            .iter()
            .take_while(|h| self.cached.get(h).is_some_and(|&c| c > 0))
            .count() as u32
    }
}

/// What the server answers for each prompt, against the engine's cache.
async fn agrees(client: &Client, engine: &Engine, prompts: &[Vec<u32>]) -> bool {
    for p in prompts {
        let key = token_key(p, BLOCK);
        let got = client.lookup("m", &key, None).await.unwrap();
        let blocks = got
            .matches
            .iter()
            .find(|m| m.pod.as_str() == POD)
            .map_or(0, |m| m.blocks);
        if blocks != engine.cached_blocks(p) {
            return false;
        }
    }
    true
}

/// Waits until the server answers for each prompt as the engine's cache
/// holds.
async fn until_agrees(what: &str, client: &Client, engine: &Engine, prompts: &[Vec<u32>]) {
    common::eventually(what, async || agrees(client, engine, prompts).await).await;
}

/// A new engine, the server's subscription to it, and a data directory
/// for servers that follow it across restarts.
fn to_follow(ctx: &zmq::Context) -> (Engine, Subscription, tempfile::TempDir) {
    let engine = Engine::bind(ctx);
    let sub = engine.subscription();
    (engine, sub, tempfile::tempdir().unwrap())
}

/// A server that follows `subs`, with its data (and snapshot, written only
/// at shutdown) in `data`, so that a restart keeps what it learnt.
fn following(data: &tempfile::TempDir, subs: &[Subscription]) -> prefix_server::ServerConfig {
    let mut cfg = common::config(data);
    cfg.upkeep.snapshot_interval = Some(std::time::Duration::from_secs(3600));
    cfg.engines.subscriptions = subs.to_vec();
    cfg
}

/// Starts a server on `cfg`, whose data directory the caller keeps for
/// the next start.
async fn restartable(cfg: prefix_server::ServerConfig) -> common::TestServer {
    common::start_with(cfg, tempfile::tempdir().unwrap()).await
}

async fn stop(server: common::TestServer, client: Client) {
    client.close().await;
    server.shutdown().await;
}

/// The pods the server follows, by name.
fn followed(server: &common::TestServer) -> Vec<String> {
    let mut pods: Vec<_> = server
        .engines_list()
        .into_iter()
        .map(|(s, _)| s.pod)
        .collect();
    pods.sort();
    pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_follows_an_engine_through_gaps_and_both_restarts() {
    let ctx = zmq::Context::new();
    let (mut engine, sub, data) = to_follow(&ctx);
    let config = |sub: &Subscription| following(&data, std::slice::from_ref(sub));
    let server = restartable(config(&sub)).await;
    let client = server.client().await;
    let prompts: Vec<Vec<u32>> = (1..=4).map(|p| prompt(p, 6)).collect();

    // Published before the subscription is up, or after: either way the
    // first batch the server sees makes it replay the engine's buffer.
    engine.store(&prompts[0], 0, 4, false);
    engine.store(&prompts[1], 2, 5, false);
    until_agrees("the first stores arrive", &client, &engine, &prompts).await;
    assert_eq!(engine.cached_blocks(&prompts[1]), 5);

    // A lost batch: the next one reveals the gap, the replay fills it (the
    // next one must reach the server: its subscription is in place). The
    // counters are read as deltas: the start may have seen a gap of its
    // own (batch 0 gone by before the subscription was in place).
    let http = server.metrics_addr.unwrap();
    let pod = |name: &str| format!("prefix_index_{name}{{pod=\"{POD}\"}}");
    let gaps = common::metric(http, &pod("engine_sequence_gaps_total")).await;
    let lost = common::metric(http, &pod("engine_lost_batches_total")).await;
    engine.subscribed();
    engine.evict(&prompts[0], 3, true);
    engine.store(&prompts[2], 2, 6, false);
    until_agrees("the gap is replayed", &client, &engine, &prompts).await;
    assert_eq!(engine.cached_blocks(&prompts[0]), 3);
    let gaps = gaps + 1.0;
    assert_eq!(
        common::metric(http, &pod("engine_sequence_gaps_total")).await,
        gaps
    );
    assert_eq!(
        common::metric(http, &pod("engine_lost_batches_total")).await,
        lost + 1.0
    );

    // The engine's publisher goes and comes back: the reconnection's check
    // asks a replay, and is no gap.
    let replays = common::metric(http, &pod("engine_replays_total")).await;
    engine.reconnect(&ctx);
    engine.subscribed();
    common::eventually("the reconnection is checked", async || {
        common::metric(http, &pod("engine_replays_total")).await > replays
    })
    .await;
    assert_eq!(
        common::metric(http, &pod("engine_sequence_gaps_total")).await,
        gaps
    );

    // The server restarts; what the engine does meanwhile is in its buffer.
    stop(server, client).await;
    engine.store(&prompts[1], 5, 6, false);
    let server = restartable(config(&sub)).await;
    // It resumes from the snapshot's last batch, and lists it.
    common::eventually("the batch it resumes from is listed", async || {
        server.engines_list()[0].1.last_seq.is_some()
    })
    .await;
    let client = server.client().await;
    engine.subscribed();
    engine.store(&prompts[3], 2, 3, false);
    until_agrees(
        "events after the restart find their parents",
        &client,
        &engine,
        &prompts,
    )
    .await;
    assert_eq!(engine.cached_blocks(&prompts[1]), 6);

    // The engine restarts: sequence from 0, nothing cached, same ports.
    let mut engine = engine.restarted(&ctx);
    engine.store(&prompts[3], 0, 3, false);
    engine.store(&prompts[3], 3, 4, false);
    // Batches published before the server's socket reconnects are lost to
    // it (PUB/SUB); the first one it sees tells it the engine restarted,
    // and the replay brings the rest. An engine under load keeps
    // publishing; here a copy of a cached block stands for that.
    common::eventually("the restarted engine is learnt afresh", async || {
        if agrees(&client, &engine, &prompts).await {
            return true;
        }
        engine.store(&prompts[3], 0, 1, false);
        false
    })
    .await;
    assert_eq!(engine.cached_blocks(&prompts[0]), 2);
    let states = server.engines_list();
    assert!(states[0].1.resyncs >= 1, "{states:?}");
    let http = server.metrics_addr.unwrap();
    assert!(common::metric(http, &pod("engine_blocks_stored_total")).await > 0.0);
    assert_eq!(common::metric(http, &pod("engine_connected")).await, 1.0);
    let restarts = format!("prefix_index_engine_resyncs_total{{pod=\"{POD}\",reason=\"restart\"}}");
    assert!(common::metric(http, &restarts).await >= 1.0);
    stop(server, client).await;
}

/// After a restart of the server, an engine whose replay buffer rolled
/// past the last batch the snapshot holds (vLLM keeps `buffer_steps`
/// batches) is not taken for a restarted one: the pod is resynced as
/// `replay_too_short` and learns the engine's buffer. A new engine whose
/// batch under that number is another one is a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_buffer_rolled_past_the_snapshot_is_no_restart() {
    let ctx = zmq::Context::new();
    let (mut engine, sub, data) = to_follow(&ctx);
    let config = || following(&data, std::slice::from_ref(&sub));
    let resyncs = |reason: &str| {
        format!("prefix_index_engine_resyncs_total{{pod=\"{POD}\",reason=\"{reason}\"}}")
    };
    let prompts: Vec<Vec<u32>> = (1..=4).map(|p| prompt(p, 4)).collect();
    let server = restartable(config()).await;
    let client = server.client().await;
    engine.subscribed();
    engine.store(&prompts[0], 0, 4, false);
    until_agrees("the engine is followed", &client, &engine, &prompts).await;
    client.close().await;
    // The snapshot holds batch 0 as the last one applied.
    server.shutdown().await;

    // Meanwhile the engine goes on and its buffer keeps only its newest
    // batch (3): batches 1 and 2 are lost to the server.
    for p in &prompts[1..] {
        engine.store(p, 0, 4, false);
    }
    engine.roll(1);
    let server = restartable(config()).await;
    let http = server.metrics_addr.unwrap();
    common::eventually("the short replay is told", async || {
        common::metric(http, &resyncs("replay_too_short")).await == 1.0
    })
    .await;
    assert_eq!(common::metric(http, &resyncs("restart")).await, 0.0);
    let client = server.client().await;
    until_agrees(
        "the engine's buffer is learnt",
        &client,
        &engine,
        &prompts[3..],
    )
    .await;
    let states = server.engines_list();
    let said = states[0].1.last_error.as_deref().unwrap_or_default();
    assert!(
        said.contains("replay buffer starts at batch 3, past batch 0 applied"),
        "{states:?}"
    );
    client.close().await;
    // The snapshot holds batch 3 as the last one applied.
    server.shutdown().await;

    // A new engine on the same ports got past that number while the
    // server was away: its batch 3 is not the one applied.
    let mut engine = engine.restarted(&ctx);
    for i in 0..4 {
        engine.store(&prompts[0], i, i + 1, false);
    }
    engine.store(&prompts[1], 2, 3, false);
    let server = restartable(config()).await;
    let http = server.metrics_addr.unwrap();
    common::eventually("the new engine is told", async || {
        common::metric(http, &resyncs("restart")).await == 1.0
    })
    .await;
    assert_eq!(
        common::metric(http, &resyncs("replay_too_short")).await,
        0.0
    );
    let client = server.client().await;
    until_agrees("the new engine is learnt", &client, &engine, &prompts).await;
    stop(server, client).await;
}

/// An engine-fed pod of the snapshot that nothing follows any more is
/// dropped at start, rather than left holding blocks no event will ever
/// remove; a subscription made at run time outlives a restart (the server
/// follows the engine again, and later events find their parents in the
/// snapshot's records), and so does an unsubscription.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_time_subscriptions_outlive_a_restart_and_unfollowed_pods_go() {
    let ctx = zmq::Context::new();
    let (mut engine, sub, data) = to_follow(&ctx);
    let config = |subs: &[Subscription]| following(&data, subs);
    let start = async |subs: &[Subscription]| {
        let server = restartable(config(subs)).await;
        let client = server.client().await;
        (server, client)
    };
    let prompts: Vec<Vec<u32>> = (1..=2).map(|p| prompt(p, 4)).collect();

    // Configured, then restarted without the line.
    let (server, client) = start(std::slice::from_ref(&sub)).await;
    engine.subscribed();
    engine.store(&prompts[0], 0, 3, false);
    until_agrees(
        "the configured engine is followed",
        &client,
        &engine,
        &prompts,
    )
    .await;
    stop(server, client).await;
    let (server, client) = start(&[]).await;
    assert!(followed(&server).is_empty());
    assert!(server.index.engines().is_empty());
    for p in &prompts {
        let got = client
            .lookup("m", &token_key(p, BLOCK), None)
            .await
            .unwrap();
        assert!(got.matches.is_empty(), "{:?}", got.matches);
    }

    // Subscribed at run time, then restarted with no configured engine:
    // the server follows it again.
    client.subscribe_engine(sub.clone()).await.unwrap();
    engine.subscribed();
    engine.store(&prompts[1], 2, 3, false);
    until_agrees(
        "the run-time subscription is followed",
        &client,
        &engine,
        &prompts,
    )
    .await;
    stop(server, client).await;
    let (server, client) = start(&[]).await;
    assert_eq!(followed(&server), [POD]);
    engine.subscribed();
    engine.store(&prompts[0], 3, 4, false);
    engine.store(&prompts[1], 3, 4, false);
    until_agrees(
        "events after the restart find their parents",
        &client,
        &engine,
        &prompts,
    )
    .await;
    assert_eq!(engine.cached_blocks(&prompts[0]), 4);

    // A configured engine unsubscribed at run time: a restart with the
    // same configuration does not follow it again, and the pod is gone.
    stop(server, client).await;
    let (server, client) = start(std::slice::from_ref(&sub)).await;
    assert_eq!(followed(&server), [POD]);
    assert!(client.unsubscribe_engine(POD).await.unwrap());
    stop(server, client).await;
    let (server, client) = start(std::slice::from_ref(&sub)).await;
    assert!(followed(&server).is_empty());
    assert!(server.index.engines().is_empty());
    stop(server, client).await;

    // The same after a crash that left the pod in the snapshot, with the
    // central collector on (which keeps other unfollowed pods).
    let (server, client) = start(&[]).await;
    client.subscribe_engine(sub.clone()).await.unwrap();
    engine.subscribed();
    engine.store(&prompts[1], 0, 1, false);
    until_agrees("the pod is learnt again", &client, &engine, &prompts).await;
    stop(server, client).await;
    let kept = format!("{{\"unsubscribed\": [\"{POD}\"]}}");
    std::fs::write(data.path().join("subscriptions.json"), kept).unwrap();
    let mut cfg = config(std::slice::from_ref(&sub));
    cfg.engines.listen = Some("tcp://127.0.0.1:*".into());
    let server = restartable(cfg).await;
    assert!(followed(&server).is_empty());
    assert!(server.index.engines().is_empty());
    server.shutdown().await;
}

/// Subscriptions in a row of one batch are made in one step, yet each is
/// answered as if alone, in order with the ops around them: a refused one
/// (a medium that is no tier name, a block size the index refuses, past
/// `max-engines`) leaves no pod behind, and those made are kept for a
/// restart. Unsubscriptions in a row likewise.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriptions_in_one_batch_are_answered_in_order_and_kept() {
    use prefix_proto::{ErrorCode, Op, Reply};
    let data = tempfile::tempdir().unwrap();
    let config = || {
        let mut cfg = following(&data, &[]);
        cfg.engines.max_engines = 3;
        cfg
    };
    // Nothing listens on port 9: followed, never connected.
    let sub = |pod: &str, endpoint: &str| -> Op {
        let text = format!("pod={pod},model=m,endpoint={endpoint},topic={TOPIC}");
        Op::Subscribe(text.parse::<Subscription>().unwrap())
    };
    let ok = "tcp://127.0.0.1:9";
    let server = restartable(config()).await;
    let client = server.client().await;
    let mut bad = sub("bad", ok);
    if let Op::Subscribe(s) = &mut bad {
        s.media = vec!["GPU+CPU".into()];
    }
    // Neither a divisor nor a multiple of the server's 16-token block.
    let mut odd_blocks = sub("e", ok);
    if let Op::Subscribe(s) = &mut odd_blocks {
        s.block_size = 24;
    }
    let replies = client
        .batch(vec![
            sub("a", ok),
            bad,
            sub("b", ok),
            Op::Unsubscribe { pod: "a".into() },
            sub("a", ok),
            odd_blocks,
            sub("c", ok),
            sub("d", ok),
        ])
        .await
        .unwrap();
    let code = |r: &Reply| match r {
        Reply::Error { code, .. } => Some(*code),
        _ => None,
    };
    assert_eq!(replies.len(), 8);
    assert_eq!(replies[0], Reply::Done);
    assert_eq!(code(&replies[1]), Some(ErrorCode::BadSubscription as u16));
    assert_eq!(replies[2], Reply::Done);
    assert_eq!(replies[3], Reply::Removed(true));
    assert_eq!(replies[4], Reply::Done);
    assert_eq!(code(&replies[5]), Some(ErrorCode::BadSubscription as u16));
    assert_eq!(replies[6], Reply::Done);
    assert_eq!(
        code(&replies[7]),
        Some(ErrorCode::BadSubscription as u16),
        "{replies:?}"
    );
    assert_eq!(followed(&server), ["a", "b", "c"]);
    assert_eq!(server.index.stats().pods, 3);
    stop(server, client).await;
    let server = restartable(config()).await;
    assert_eq!(followed(&server), ["a", "b", "c"]);
    // Unsubscriptions in a row: each answered whether its pod was
    // followed, as one by one.
    let client = server.client().await;
    let unsub = |pod: &str| Op::Unsubscribe { pod: pod.into() };
    let replies = client
        .batch(vec![
            unsub("a"),
            unsub("zz"),
            unsub(""),
            unsub("a"),
            unsub("c"),
            Op::Ping,
        ])
        .await
        .unwrap();
    assert_eq!(code(&replies[2]), Some(ErrorCode::BadName as u16));
    let rest: Vec<Reply> = (replies.iter().enumerate())
        .filter(|&(i, _)| i != 2)
        .map(|(_, r)| r.clone())
        .collect();
    assert_eq!(
        rest,
        [
            Reply::Removed(true),
            Reply::Removed(false),
            Reply::Removed(false),
            Reply::Removed(true),
            Reply::Pong
        ]
    );
    assert_eq!(followed(&server), ["b"]);
    assert_eq!(server.index.stats().pods, 1);
    stop(server, client).await;
    let server = restartable(config()).await;
    assert_eq!(followed(&server), ["b"]);
    server.shutdown().await;
}

/// Whether `pod` holds exactly `blocks` leading blocks of `tokens` under
/// model `m`.
async fn holds(client: &Client, tokens: &[u32], pod: &str, blocks: u32) -> bool {
    let got = client
        .lookup("m", &token_key(tokens, BLOCK), None)
        .await
        .unwrap();
    got.matches
        .iter()
        .any(|m| m.pod.as_str() == pod && m.blocks == blocks)
}

/// Central mode: engines connect to the server's SUB socket and name
/// themselves in the topic. A malformed payload and stray topics (a
/// malformed `kv@…` one, and another altogether) are counted and skipped;
/// the stream goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_connecting_to_the_server_are_followed_by_topic() {
    let server = common::start(|cfg| cfg.engines.listen = Some("tcp://127.0.0.1:*".into())).await;
    let endpoint = server.engines.central_endpoint().expect("bound");
    let ctx = zmq::Context::new();
    let publisher = sockets::connect(&ctx, &endpoint).unwrap();
    let client = server.client().await;
    let tokens = prompt(1, 3);
    let hs = hashes(&tokens);
    let topic = b"kv@pod-c@m";
    let mut seq = 0u64;
    // The subscription reaches the publisher after the connection: publish
    // until the server has the blocks.
    common::eventually("the connecting engine is followed", async || {
        let good = payload(vec![stored(None, &hs, &tokens)]);
        let stray: [&[u8]; 3] = [b"kv@", &0u64.to_be_bytes(), b"\x90"];
        publisher.send_multipart(stray, 0).unwrap();
        let garbage: [&[u8]; 3] = [topic, &seq.to_be_bytes(), b"\xc1\xc1"];
        publisher.send_multipart(garbage, 0).unwrap();
        let good: [&[u8]; 3] = [topic, &(seq + 1).to_be_bytes(), &good];
        publisher.send_multipart(good, 0).unwrap();
        seq += 2;
        holds(&client, &tokens, "pod-c", 3).await
    })
    .await;
    // The collector's pods take a subscription's steps: the last batch is
    // recorded with the pod's engine state (snapshots carry it), and its
    // lag is measured from the batch's timestamp.
    let engines = server.index.engines();
    let (_, engine) = engines.iter().find(|(p, _)| p == "pod-c").unwrap();
    assert!(engine.lock().last_batch().is_some());
    let stats = server.engines.stats();
    let (_, pod_c) = stats.iter().find(|(p, _)| p == "pod-c").unwrap();
    assert_ne!(pod_c.lag_ms.load(std::sync::atomic::Ordering::Relaxed), 0);
    // A message under a topic that is no `kv@<pod>@<model>` at all (vLLM's
    // usual `kv`) reaches the collector and is counted, not dropped unseen.
    let before = server.engines.strays();
    common::eventually("a message under another topic is counted", async || {
        let other: [&[u8]; 3] = [b"kv", &0u64.to_be_bytes(), b"\x90"];
        publisher.send_multipart(other, 0).unwrap();
        server.engines.strays() > before
    })
    .await;
    let states = server.engines_list();
    let (sub, state) = &states[0];
    assert_eq!((sub.pod.as_str(), sub.model.as_str()), ("pod-c", "m"));
    assert!(state.decode_errors >= 1, "{state:?}");
    assert!(
        state
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("batch")),
        "{state:?}"
    );
    // Unsubscribed, the pod's blocks go; its next messages meet it again,
    // as a pod learnt anew (its old blocks are not there to find).
    assert!(server.engines.unsubscribe("pod-c"));
    let holds = async |tokens: &[u32], blocks: u32| holds(&client, tokens, "pod-c", blocks).await;
    assert!(!holds(&tokens, 3).await);
    let again = prompt(2, 2);
    let again_hs = hashes(&again);
    common::eventually(
        "the engine is met again after its unsubscription",
        async || {
            let good = payload(vec![stored(None, &again_hs, &again)]);
            let good: [&[u8]; 3] = [topic, &seq.to_be_bytes(), &good];
            publisher.send_multipart(good, 0).unwrap();
            seq += 1;
            holds(&again, 2).await
        },
    )
    .await;
    assert!(!holds(&tokens, 3).await);
    let states = server.engines_list();
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].1.decode_errors, 0, "{:?}", states[0].1);
    // Subscribed at run time, the pod is fed by that subscription alone
    // and learnt anew from it: what the collector taught is gone.
    let sub = Subscription {
        pod: "pod-c".into(),
        model: "m".into(),
        endpoint: "tcp://127.0.0.1:1".into(),
        replay: None,
        block_size: BLOCK as u32,
        topic: TOPIC.into(),
        media: vec!["GPU".into()],
    };
    server.engines.subscribe(sub.clone()).unwrap();
    assert_eq!(server.engines_list()[0].0, sub);
    let got = client
        .lookup("m", &token_key(&again, BLOCK), None)
        .await
        .unwrap();
    assert!(got.matches.is_empty(), "{:?}", got.matches);
    stop(server, client).await;
}

/// Central mode's doors: a connection from outside `--engine-allow` is
/// refused before any of its messages is read, and a pod's topic stays
/// with the address it first came from; each refusal is counted, and the
/// index keeps what the real engine said.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_allowed_hosts_publish_and_a_pod_keeps_its_address() {
    let server = common::start(|cfg| {
        cfg.engines.listen = Some("tcp://127.0.0.1:*".into());
        cfg.engines.allow =
            prefix_server::EngineAllow::parse(&["127.0.0.1".into(), "127.0.0.2/32".into()])
                .unwrap();
    })
    .await;
    let endpoint = server.engines.central_endpoint().expect("bound");
    let port = endpoint.rsplit(':').next().unwrap();
    let ctx = zmq::Context::new();
    // A PUB socket connecting from `source` (Linux routes all of 127/8 to
    // loopback, so each source is a host of its own to the server).
    let from = |source: &str| {
        sockets::connect(&ctx, &format!("tcp://{source}:0;127.0.0.1:{port}")).unwrap()
    };
    let (engine, outsider, neighbour) = (from("127.0.0.1"), from("127.0.0.3"), from("127.0.0.2"));
    let send = |s: &zmq::Socket, topic: &str, seq: u64, event: Event| {
        let body = payload(vec![event]);
        let frames: [&[u8]; 3] = [topic.as_bytes(), &seq.to_be_bytes(), &body];
        s.send_multipart(frames, 0).unwrap();
    };
    let client = server.client().await;
    let tokens = prompt(1, 4);
    let hs = hashes(&tokens);
    let held = async || {
        let got = client
            .lookup("m", &token_key(&tokens, BLOCK), None)
            .await
            .unwrap();
        got.matches
            .iter()
            .map(|m| (m.pod.to_string(), m.blocks))
            .collect::<Vec<_>>()
    };
    let mut seq = 0;
    common::eventually("the engine is followed", async || {
        send(&engine, "kv@p1@m", seq, stored(None, &hs, &tokens));
        seq += 1;
        held().await == [("p1".to_string(), 4)]
    })
    .await;
    use prefix_server::EngineRefusal::{Address, Moved};
    common::eventually("a host outside the list is refused", async || {
        send(&outsider, "kv@intruder@m", 0, stored(None, &hs, &tokens));
        send(&outsider, "kv@p1@m", seq, Event::Cleared);
        server.engines.refused(Address) > 0
    })
    .await;
    common::eventually("another host under p1's topic is refused", async || {
        send(&neighbour, "kv@p1@m", seq, Event::Cleared);
        server.engines.refused(Moved) > 0
    })
    .await;
    // Whatever is still in flight from either is refused too.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(held().await, [("p1".to_string(), 4)]);
    let listed = server.engines_list();
    assert_eq!(listed.len(), 1);
    // The pod says why, and is not vouched for until its address speaks
    // (it may be its own engine, moved).
    let state = &listed[0].1;
    assert!(!state.connected, "{state:?}");
    let error = state.last_error.as_deref().unwrap_or_default();
    assert!(
        error.contains("from 127.0.0.2") && error.contains("bound to 127.0.0.1"),
        "{error}"
    );
    let metrics = server.metrics_addr.unwrap();
    for reason in ["address", "moved"] {
        let name = format!("prefix_index_engine_refused_total{{reason=\"{reason}\"}}");
        assert!(common::metric(metrics, &name).await >= 1.0, "{name}");
    }
    // The real engine goes on.
    let more = prompt(2, 3);
    let more_hs = hashes(&more);
    send(&engine, "kv@p1@m", seq, stored(None, &more_hs, &more));
    common::eventually("the engine's next batch is applied", async || {
        holds(&client, &more, "p1", 3).await
    })
    .await;
    assert!(server.engines_list()[0].1.connected);
    stop(server, client).await;
}

/// Precise mode under replicas: a gateway's `Cluster` with R = 2 over three
/// servers subscribes the engine on the model's two replicas only; each
/// follows the engine itself and holds the engine's view without talking
/// to the other, and when the one the gateway reads first goes, its
/// lookups fail over to the other with the same answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_follow_the_engine_each_and_answer_alike() {
    let ctx = zmq::Context::new();
    let mut engine = Engine::bind(&ctx);
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(common::start(|_| {}).await);
    }
    let (list, cfg) = common::named(&servers);
    let names: Vec<String> = list.iter().map(|(n, _)| n.clone()).collect();
    let replication = prefix_client::Replication {
        replicas: 2,
        ..prefix_client::Replication::default()
    };
    let cluster = prefix_client::Cluster::connect_replicated(&list, replication, cfg)
        .await
        .unwrap();
    cluster
        .subscribe_engine(engine.subscription())
        .await
        .unwrap();
    let replicas = prefix_client::replicas("m", &names, 2);
    assert_eq!(replicas.len(), 2);
    for (i, s) in servers.iter().enumerate() {
        let subscribed = s.engines_list().len();
        assert_eq!(subscribed, usize::from(replicas.contains(&i)), "server {i}");
    }
    // Both replicas' subscriptions have reached the publisher.
    engine.subscribed();
    engine.subscribed();

    let prompts: Vec<Vec<u32>> = (1..=3).map(|p| prompt(p, 5)).collect();
    engine.store(&prompts[0], 0, 5, false);
    engine.store(&prompts[1], 2, 4, false);
    engine.evict(&prompts[0], 4, false);
    engine.evict(&prompts[0], 3, false);
    engine.store(&prompts[2], 2, 5, false);
    let mut clients = Vec::new();
    for &r in &replicas {
        let client = servers[r].client().await;
        until_agrees(
            "each replica follows the engine",
            &client,
            &engine,
            &prompts,
        )
        .await;
        clients.push(client);
    }
    assert_eq!(engine.cached_blocks(&prompts[0]), 3);
    let other = (0..3).find(|i| !replicas.contains(i)).unwrap();
    assert_eq!(servers[other].index.stats().entries, 0);

    // One replica goes: the cluster reads the other, which answers as the
    // engine holds.
    for c in clients {
        c.close().await;
    }
    // The replica this gateway reads first goes, so its reads fail over.
    let preferred = cluster.read_order_of("m")[0].to_string();
    let gone = servers.remove(names.iter().position(|n| *n == preferred).unwrap());
    gone.shutdown().await;
    for p in &prompts {
        let got = cluster
            .lookup("m", &token_key(p, BLOCK), None)
            .await
            .unwrap();
        let blocks = got
            .matches
            .iter()
            .find(|m| m.pod.as_str() == POD)
            .map_or(0, |m| m.blocks);
        assert_eq!(blocks, engine.cached_blocks(p));
    }
    for s in servers {
        s.shutdown().await;
    }
}

/// An engine whose socket cannot be opened is listed as not followed, with
/// the reason, and counted on `/metrics` and named in `/readyz` until its
/// socket opens; the engines beside it are followed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_that_cannot_be_followed_says_so() {
    let ctx = zmq::Context::new();
    let engine = sockets::Engine::bind(&ctx, sockets::ANY_PORT, None).unwrap();
    let good = &engine.live.endpoint;
    let server = common::start(|cfg| {
        cfg.engines.subscriptions = vec![
            format!("pod=good,model=m,endpoint={good}").parse().unwrap(),
            // libzmq refuses an endpoint without a port.
            "pod=bad,model=m,endpoint=tcp://engine-0.example"
                .parse()
                .unwrap(),
        ];
    })
    .await;
    common::eventually("the good engine is connected", async || {
        server
            .engines_list()
            .iter()
            .any(|(s, st)| s.pod == "good" && st.connected)
    })
    .await;
    let (_, bad) = server
        .engines_list()
        .into_iter()
        .find(|(s, _)| s.pod == "bad")
        .unwrap();
    assert!(!bad.connected);
    let why = bad.last_error.unwrap_or_default();
    assert!(
        why.starts_with("not followed: engine socket error"),
        "{why}"
    );
    let metrics = common::http_get(server.metrics_addr.unwrap(), "/metrics").await;
    for line in [
        "engine_subscriptions{state=\"connected\"} 1",
        "engine_subscriptions{state=\"failing\"} 1",
        "engine_subscriptions{state=\"disconnected\"} 0",
    ] {
        assert!(metrics.contains(line), "{line} in:\n{metrics}");
    }
    let ready = common::http_get(server.metrics_addr.unwrap(), "/readyz").await;
    assert!(ready.contains("ready\n"), "{ready}");
    assert!(
        ready.contains(
            "engines: 2 followed, 1 connected, 1 not (1 of them failing to open their socket)"
        ),
        "{ready}"
    );
    assert!(
        ready.contains("\n  bad: not followed: engine socket error"),
        "{ready}"
    );
    server.shutdown().await;
}
