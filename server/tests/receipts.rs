//! Receipts against a real server over its HTTP API, as a gateway sends
//! them: counted per pod in the metrics and in detailed lookups, refused
//! with `bad_receipt` when they cannot be true, and a pod whose engine's
//! events silently stopped turned `suspect` by the receipts, then back to
//! its former view once they agree again.

use prefix_testkit::publisher::{stored_batch, Publisher};
use prefix_testkit::server as common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

const BLOCK: usize = 16;
/// `--receipt-suspect`'s default: over-predicted receipts in a pod's window
/// that make it suspect, and agreeing ones in a row that end it.
const SUSPECT: usize = 8;

async fn start() -> (common::TestServer, SocketAddr) {
    start_with(|_| {}).await
}

async fn start_with(
    tweak: impl FnOnce(&mut prefix_server::ServerConfig),
) -> (common::TestServer, SocketAddr) {
    let server = common::start(|cfg| {
        cfg.transport.http_listen = Some("127.0.0.1:0".parse().unwrap());
        cfg.transport.http_plaintext = true;
        tweak(cfg);
    })
    .await;
    let addr = server.api_addr.expect("the API is on");
    (server, addr)
}

async fn post(addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let http = reqwest::Client::new();
    let r = http
        .post(format!("http://{addr}{path}"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// A prompt of `blocks` whole blocks and 5 tokens more (so an engine can
/// reuse every whole block), no other prompt's.
fn prompt(i: u32, blocks: usize) -> Vec<u32> {
    (0..(blocks * BLOCK + 5) as u32)
        .map(|t| i * 10_000 + t)
        .collect()
}

fn receipt(pod: &str, tokens: &[u32], predicted: u32, cached_blocks: u32) -> Value {
    json!({
        "model": "m", "pod": pod, "tokens": tokens,
        "predicted_blocks": predicted, "cached_tokens": cached_blocks * BLOCK as u32,
    })
}

/// `pod`'s entry in the detailed lookup of `tokens`.
async fn detail(addr: SocketAddr, pod: &str, tokens: &[u32]) -> Value {
    let (s, v) = post(
        addr,
        "/v1/lookup-detail",
        json!({"model": "m", "tokens": tokens}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let matches = v["matches"].as_array().unwrap();
    let m = matches.iter().find(|m| m["pod"] == pod);
    m.cloned().unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_are_counted_per_pod_in_the_metrics_and_the_detailed_lookup() {
    let (server, addr) = start().await;
    let tokens = prompt(1, 4);
    let (s, _) = post(
        addr,
        "/v1/insert",
        json!({"model": "m", "tokens": tokens, "pod": "p"}),
    )
    .await;
    assert_eq!(s, 200);
    for _ in 0..6 {
        let (s, v) = post(addr, "/v1/receipt", receipt("p", &tokens, 4, 4)).await;
        assert_eq!((s, v), (200, json!({"ok": true})));
    }
    for _ in 0..4 {
        let (s, _) = post(addr, "/v1/receipt", receipt("p", &tokens, 4, 1)).await;
        assert_eq!(s, 200);
    }
    let m = detail(addr, "p", &tokens).await;
    assert_eq!(m["receipts"], json!({"exact": 6, "over": 4, "under": 0}));
    // Four of the window's 32 are not enough to doubt the pod.
    assert_eq!(m["view"], "gateway");
    let metrics = server.metrics_addr.unwrap();
    let count =
        |outcome: &str| format!("prefix_index_receipts_total{{pod=\"p\",outcome=\"{outcome}\"}}");
    let counts = ["exact", "over", "under"].map(count);
    assert_eq!(common::metrics(metrics, &counts).await, [6.0, 4.0, 0.0]);
    // The differences: six of 0 blocks, four of 3.
    let bucket = |le: &str| format!("prefix_index_receipt_difference_blocks_bucket{{le=\"{le}\"}}");
    let buckets = ["0.0", "4.0"].map(bucket);
    assert_eq!(common::metrics(metrics, &buckets).await, [6.0, 10.0]);

    // In a batch, as one op among others.
    let ops = json!({"ops": [
        {"op": "receipt", "model": "m", "pod": "p", "tokens": tokens,
         "predicted_blocks": 2, "cached_tokens": 64},
        {"op": "ping"},
    ]});
    let (s, v) = post(addr, "/v1/batch", ops).await;
    assert_eq!((s, &v["results"][0]), (200, &json!({"ok": true})), "{v}");
    assert_eq!(
        detail(addr, "p", &tokens).await["receipts"],
        json!({"exact": 6, "over": 4, "under": 1})
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_that_cannot_be_counted_are_refused_with_their_reason() {
    let (server, addr) = start().await;
    let tokens = prompt(1, 4);
    post(
        addr,
        "/v1/insert",
        json!({"model": "m", "tokens": tokens, "pod": "p"}),
    )
    .await;
    let refused = |v: &Value, name: &str, why: &str| {
        assert_eq!(v["ok"], false, "{v}");
        assert_eq!(v["error"]["name"], name, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(why), "{message} lacks {why}");
    };
    // A pod the index never heard of, and one removed since.
    let (s, v) = post(addr, "/v1/receipt", receipt("q", &tokens, 1, 1)).await;
    assert_eq!(s, 422);
    refused(&v, "bad_receipt", "not in the index");
    // A prediction longer than the key; a reuse longer than the prompt, or
    // than the key.
    let (s, v) = post(addr, "/v1/receipt", receipt("p", &tokens, 5, 1)).await;
    assert_eq!(s, 422);
    refused(&v, "bad_receipt", "more than the key's 4 blocks");
    let mut past = receipt("p", &tokens, 4, 0);
    past["cached_tokens"] = json!(tokens.len() + 1);
    let (_, v) = post(addr, "/v1/receipt", past).await;
    refused(&v, "bad_receipt", "more than prompt_tokens 69");
    let past_key = json!({"model": "m", "pod": "p", "hashes": [1, 2],
        "predicted_blocks": 2, "cached_tokens": 48});
    let (_, v) = post(addr, "/v1/receipt", past_key).await;
    refused(
        &v,
        "bad_receipt",
        "more than the key's 2 blocks of 16 tokens",
    );
    // A prompt length that is not the tokens'; a field missing.
    let mut wrong = receipt("p", &tokens, 4, 4);
    wrong["prompt_tokens"] = json!(70);
    let (s, v) = post(addr, "/v1/receipt", wrong).await;
    assert_eq!(s, 400);
    refused(&v, "malformed", "is not the 69 tokens given");
    let (s, v) = post(
        addr,
        "/v1/receipt",
        json!({"model": "m", "pod": "p", "tokens": tokens, "predicted_blocks": 1}),
    )
    .await;
    assert_eq!(s, 400);
    refused(&v, "malformed", "missing field `cached_tokens`");
    // Nothing refused was counted; a removed pod's receipts come late.
    assert_eq!(
        detail(addr, "p", &tokens).await["receipts"],
        json!({"exact": 0, "over": 0, "under": 0})
    );
    post(addr, "/v1/remove-pod", json!({"pod": "p"})).await;
    let (s, v) = post(addr, "/v1/receipt", receipt("p", &tokens, 4, 4)).await;
    assert_eq!(s, 422);
    refused(&v, "bad_receipt", "removed");
    server.shutdown().await;
}

/// An engine's cache, as the gateway's requests meet it: each prompt
/// whole, or not.
struct Engine {
    sockets: Publisher,
    seq: u64,
    cached: std::collections::HashSet<u32>,
    /// Whether its events reach the server (else it publishes nothing).
    publishing: bool,
}

impl Engine {
    /// Serves prompt `i`: returns the blocks it reused, then caches the
    /// prompt (publishing the store if it publishes).
    fn serve(&mut self, i: u32, blocks: usize) -> u32 {
        let reused = if self.cached.contains(&i) {
            blocks as u32
        } else {
            0
        };
        if self.cached.insert(i) && self.publishing {
            let tokens = prompt(i, blocks);
            let whole = tokens[..blocks * BLOCK].to_vec();
            self.sockets.publish(self.seq, &stored_batch(whole, BLOCK));
            self.seq += 1;
        }
        reused
    }
}

const BLOCKS: usize = 4;
const PROMPTS: u32 = 20;

/// A gateway's request for prompt `i`: a detailed lookup, the engine's
/// work, a receipt. Returns the blocks predicted and reused.
async fn route(addr: SocketAddr, i: u32, engine: &mut Engine) -> (u32, u32) {
    let tokens = prompt(i, BLOCKS);
    let m = detail(addr, "vllm-0", &tokens).await;
    let predicted = m["blocks"].as_u64().unwrap_or(0) as u32;
    let reused = engine.serve(i, BLOCKS);
    let (s, v) = post(
        addr,
        "/v1/receipt",
        receipt("vllm-0", &tokens, predicted, reused),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    (predicted, reused)
}

/// An engine subscribed as pod `vllm-0` of model `m`, which has computed
/// every prompt once (the server heard of each), then evicted them all
/// through a path that publishes nothing, and publishes nothing more.
async fn silenced_engine(ctx: &zmq::Context, addr: SocketAddr) -> Engine {
    let mut engine = Engine {
        sockets: Publisher::bind(ctx, "kv"),
        seq: 0,
        cached: Default::default(),
        publishing: true,
    };
    let sub = json!({"pod": "vllm-0", "model": "m", "endpoint": engine.sockets.endpoint,
        "topic": "kv", "block_size": BLOCK});
    let (s, v) = post(addr, "/v1/subscribe", sub).await;
    assert_eq!(s, 200, "{v}");
    engine.sockets.subscribed();
    for i in 0..PROMPTS {
        route(addr, i, &mut engine).await;
    }
    // Its stores can arrive before the socket's monitor says it is
    // connected (the pod shows disconnected until then): wait for both.
    let deadline = Instant::now() + Duration::from_secs(10);
    let last = prompt(PROMPTS - 1, BLOCKS);
    loop {
        let m = detail(addr, "vllm-0", &last).await;
        if m["blocks"] == BLOCKS && m["view"] == "exact" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the engine's stores never arrived, or it never showed exact: {m}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Healthy: every prompt again, each reused whole, as predicted.
    for i in 0..PROMPTS {
        assert_eq!(
            route(addr, i, &mut engine).await,
            (BLOCKS as u32, BLOCKS as u32)
        );
    }
    let m = detail(addr, "vllm-0", &last).await;
    assert_eq!(m["view"], "exact");
    assert_eq!(m["receipts"]["over"], 0);
    engine.cached.clear();
    engine.publishing = false;
    engine
}

fn view_gauge(view: &str) -> String {
    format!("prefix_index_engine_view{{pod=\"vllm-0\",view=\"{view}\"}}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn receipts_find_a_pod_whose_events_silently_stopped() {
    let (server, addr) = start().await;
    let ctx = zmq::Context::new();
    let mut engine = silenced_engine(&ctx, addr).await;
    let last = prompt(PROMPTS - 1, BLOCKS);
    // The index still promises every prompt, and each request recomputes
    // its prompt, which the index is not told either.
    for (n, i) in (0..PROMPTS).enumerate() {
        assert_eq!(route(addr, i, &mut engine).await, (BLOCKS as u32, 0));
        let view = detail(addr, "vllm-0", &last).await["view"].clone();
        // Suspect at the documented count of over-predicted receipts, not
        // before.
        let expected = if n + 1 >= SUSPECT { "suspect" } else { "exact" };
        assert_eq!(view, expected, "after {} over-predicted receipts", n + 1);
    }
    let metrics = server.metrics_addr.unwrap();
    let views = ["suspect", "exact"].map(view_gauge);
    assert_eq!(common::metrics(metrics, &views).await, [1.0, 0.0]);

    // The engine cached every prompt again while the index was not told, so
    // index and engine agree once more: receipts agree, and after the
    // documented count in a row the pod shows its former view.
    for (n, i) in (0..PROMPTS).enumerate() {
        assert_eq!(
            route(addr, i, &mut engine).await,
            (BLOCKS as u32, BLOCKS as u32)
        );
        let view = detail(addr, "vllm-0", &last).await["view"].clone();
        let expected = if n + 1 >= SUSPECT { "exact" } else { "suspect" };
        assert_eq!(view, expected, "after {} agreeing receipts", n + 1);
    }
    assert_eq!(common::metrics(metrics, &views).await, [0.0, 1.0]);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_receipt_resync_a_suspect_pod_is_learnt_again() {
    let (server, addr) = start_with(|cfg| cfg.engines.receipt_resync = true).await;
    let ctx = zmq::Context::new();
    let mut engine = silenced_engine(&ctx, addr).await;
    for i in 0..SUSPECT as u32 {
        assert_eq!(route(addr, i, &mut engine).await, (BLOCKS as u32, 0));
    }
    // The follower clears the pod at its next look (a second apart): with
    // no replay endpoint it is learnt again from its next events, and what
    // the index promised of it is gone.
    let metrics = server.metrics_addr.unwrap();
    let resyncs = "prefix_index_engine_resyncs_total{pod=\"vllm-0\",reason=\"receipts\"}";
    let deadline = Instant::now() + Duration::from_secs(10);
    while common::metric(metrics, resyncs).await != 1.0 {
        assert!(Instant::now() < deadline, "the pod was never resynced");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let last = prompt(PROMPTS - 1, BLOCKS);
    assert_eq!(detail(addr, "vllm-0", &last).await, Value::Null);
    let views = ["learning", "suspect"].map(view_gauge);
    assert_eq!(common::metrics(metrics, &views).await, [1.0, 0.0]);
    // Its receipts start again with the clear: the pod's next answers are
    // what its engine says from now on.
    engine.publishing = true;
    engine.cached.clear();
    route(addr, 0, &mut engine).await;
    let first = prompt(0, BLOCKS);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = detail(addr, "vllm-0", &first).await;
        if m["blocks"] == BLOCKS {
            assert_eq!(m["view"], "learning");
            assert_eq!(m["receipts"], json!({"exact": 1, "over": 0, "under": 0}));
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the engine's store never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    server.shutdown().await;
}
