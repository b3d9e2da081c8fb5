//! The scenarios of NVIDIA Dynamo's own HTTP tests of its standalone KV
//! indexer (`dynamo-kv-router` 1.6.1, `tests/standalone_indexer_http.rs`),
//! run against prefix-server and, side by side, against Dynamo's own
//! service, each fed through the wire the way a deployment feeds it: both
//! register the same engines with `/register` and follow the same ZMQ
//! publisher, whose vLLM events are Dynamo's own `RawKvEvent`s encoded as
//! its tests encode them. Each answer of ours must pass the assertions
//! Dynamo's test makes of its own, and equal Dynamo's answer.
//!
//! Dynamo's tests put local block hashes (11, 12, 13) straight into its
//! indexer's internals; over the wire a block's local hash is what Dynamo's
//! rule (`compute_block_hash_for_seq`, used here) makes of the block's
//! tokens, so the scenarios store token blocks and ask by their hashes.
//!
//! `/query_tiered_by_hash` is not in Dynamo 1.6.1's service; its client
//! (`RemoteIndexerTransport`) decodes the answer as a
//! `WireTieredMatchDetails`, published in 1.6.1: our answer is decoded so
//! and compared with what Dynamo's indexer finds for the same hashes.
//!
//! `PREFIX_SERVER` names the server binary, from the repository's root
//! (default: `target/release/prefix-server`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use dynamo_kv_router::indexer::WireTieredMatchDetails;
use dynamo_kv_router::protocols::LocalBlockHash;
use dynamo_kv_router::services::indexer::server::{create_router, AppState};
use dynamo_kv_router::zmq_wire::RawKvEvent;
use dynamo_kv_router::RoutingPartitionId;
use prefix_conformance_dynamo::{self as lib, post, wait_for_health, Ours, Publisher};
use serde_json::{json, Value};

const MODEL: &str = "test-model";
const BLOCK_SIZE: u32 = 4;

/// Dynamo's own service, in this process, as its tests start it.
struct Dynamo {
    base: String,
    state: Arc<AppState>,
}

async fn start_dynamo() -> Dynamo {
    let state = Arc::new(AppState::new(1).unwrap());
    state.registry.signal_ready();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = create_router(state.clone());
    tokio::spawn(async move { axum_serve(listener, app).await });
    let base = format!("http://{addr}");
    wait_for_health(&base).await;
    Dynamo { base, state }
}

async fn axum_serve(listener: tokio::net::TcpListener, app: axum::Router) {
    axum::serve(listener, app).await.unwrap();
}

/// A vLLM store of `BLOCK_SIZE`-token blocks.
fn stored(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    medium: &str,
    salt: Option<&str>,
) -> RawKvEvent {
    lib::stored(hashes, parent, tokens, BLOCK_SIZE, medium, salt)
}

/// Dynamo's block hashes of `tokens` in `BLOCK_SIZE`-token blocks.
fn local_hashes(tokens: &[u32], salt: Option<&str>) -> Vec<i64> {
    lib::local_hashes(tokens, BLOCK_SIZE, salt)
}

/// Both services, and the engines registered with both.
struct Pair {
    ours: Ours,
    dynamo: Dynamo,
}

impl Pair {
    async fn start() -> Pair {
        Pair {
            ours: Ours::start(BLOCK_SIZE).await,
            dynamo: start_dynamo().await,
        }
    }

    /// Registers worker `id` (rank 0) in `group` with both, following `p`.
    async fn register(&self, id: u64, group: &str, p: &Publisher) {
        let body = json!({
            "instance_id": id, "endpoint": p.endpoint, "model_name": MODEL,
            "routing_group": group, "block_size": BLOCK_SIZE, "dp_rank": 0,
        });
        for base in [&self.ours.base, &self.dynamo.base] {
            let (s, v) = post(base, "/register", &body).await;
            assert_eq!(s, 201, "{base}: {v}");
        }
    }

    /// Publishers for workers 7 and 8, registered in `groups`, once both
    /// services' listeners have reached them.
    async fn workers_7_and_8(
        &self,
        ctx: &zmq::Context,
        groups: [&str; 2],
    ) -> (Publisher, Publisher) {
        let (w7, w8) = (Publisher::bind(ctx), Publisher::bind(ctx));
        self.register(7, groups[0], &w7).await;
        self.register(8, groups[1], &w8).await;
        w7.subscribed(2);
        w8.subscribed(2);
        (w7, w8)
    }

    /// Asks both services `body` at `path` until `instance` scores `tokens`
    /// on rank 0: both answers then name no `other` and are alike.
    async fn only(&self, path: &str, body: &Value, instance: &str, tokens: u64, other: &str) {
        let (ours, theirs) = self
            .ask(path, body, |b| b["scores"][instance]["0"] == tokens)
            .await;
        for body in [&ours, &theirs] {
            assert_eq!(body["scores"][instance]["0"], tokens);
            assert!(body["scores"].get(other).is_none());
        }
        assert_eq!(ours, theirs);
    }

    /// Both services' answers to `body` at `path`, once `done` holds of
    /// both (their listeners take the events in their own time).
    async fn ask(&self, path: &str, body: &Value, done: impl Fn(&Value) -> bool) -> (Value, Value) {
        for _ in 0..500 {
            let (s1, ours) = post(&self.ours.base, path, body).await;
            let (s2, theirs) = post(&self.dynamo.base, path, body).await;
            if s1 == 200 && s2 == 200 && done(&ours) && done(&theirs) {
                return (ours, theirs);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let (_, ours) = post(&self.ours.base, path, body).await;
        let (_, theirs) = post(&self.dynamo.base, path, body).await;
        panic!("{path} {body}: never answered as expected\nours:    {ours}\nDynamo's: {theirs}");
    }
}

/// `query_by_hash_returns_per_instance_tier_breakdown`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_by_hash_returns_per_instance_tier_breakdown() {
    let pair = Pair::start().await;
    let ctx = zmq::Context::new();
    let (mut w7, mut w8) = pair.workers_7_and_8(&ctx, ["default", "default"]).await;
    // Worker 7: 2 device blocks + 1 host-pinned extension.
    // Worker 8: 2 device blocks, no lower-tier.
    let tokens: Vec<u32> = (1..=12).collect();
    w7.publish(stored(&[0x11, 0x12], None, &tokens[..8], "GPU", None));
    w8.publish(stored(&[0x11, 0x12], None, &tokens[..8], "GPU", None));
    w7.publish(stored(&[0x13], Some(0x12), &tokens[8..], "CPU_TIER1", None));
    let body = json!({
        "block_hashes": local_hashes(&tokens, None),
        "model_name": MODEL,
        "routing_group": "default",
    });
    let (ours, theirs) = pair
        .ask("/query_by_hash", &body, |b| {
            b["instances"]["7"]["cpu"] == 12 && b["instances"]["8"]["gpu"] == 8
        })
        .await;
    for body in [&ours, &theirs] {
        // Dynamo's assertions.
        assert_eq!(body["scores"]["7"]["0"], (2 * BLOCK_SIZE) as u64);
        assert_eq!(body["scores"]["8"]["0"], (2 * BLOCK_SIZE) as u64);
        let inst7 = &body["instances"]["7"];
        assert_eq!(inst7["gpu"], (2 * BLOCK_SIZE) as u64, "instance 7 gpu");
        assert_eq!(inst7["cpu"], (3 * BLOCK_SIZE) as u64, "instance 7 cpu");
        assert_eq!(inst7["disk"], (3 * BLOCK_SIZE) as u64, "instance 7 disk");
        assert_eq!(inst7["dp"]["0"], (2 * BLOCK_SIZE) as u64);
        assert_eq!(inst7["longest_matched"], (3 * BLOCK_SIZE) as u64);
        let inst8 = &body["instances"]["8"];
        assert_eq!(inst8["gpu"], (2 * BLOCK_SIZE) as u64);
        assert_eq!(inst8["cpu"], (2 * BLOCK_SIZE) as u64);
        assert_eq!(inst8["longest_matched"], (2 * BLOCK_SIZE) as u64);
    }
    assert_eq!(ours, theirs);
    let mut null_salt = body.clone();
    null_salt["cache_salt"] = Value::Null;
    for base in [&pair.ours.base, &pair.dynamo.base] {
        assert_eq!(post(base, "/query_by_hash", &null_salt).await.0, 200);
    }

    // The remote indexer client's route, decoded as that client decodes
    // it, against what Dynamo's indexer finds for the same hashes.
    let (s, tiered) = post(&pair.ours.base, "/query_tiered_by_hash", &body).await;
    assert_eq!(s, 200, "{tiered}");
    assert_eq!(tiered["block_size"], BLOCK_SIZE);
    let wire: WireTieredMatchDetails = serde_json::from_value(tiered["tiered"].clone())
        .expect("the answer decodes as Dynamo's client decodes it");
    let entry = pair
        .dynamo
        .state
        .registry
        .get_indexer(&RoutingPartitionId::new(MODEL, "default"))
        .unwrap();
    let sequence: Vec<LocalBlockHash> = local_hashes(&tokens, None)
        .into_iter()
        .map(|h| LocalBlockHash(h as u64))
        .collect();
    let details = entry.indexer.find_tiered_matches(sequence).await.unwrap();
    let expected = WireTieredMatchDetails::from(&details);
    assert_eq!(normalized(&wire), normalized(&expected));
}

/// A tiered answer as sorted lists, lower-tier hits of 0 left out (a tier
/// absent and one with no hits read the same to Dynamo's client).
fn normalized(w: &WireTieredMatchDetails) -> Value {
    let v = serde_json::to_value(w).unwrap();
    let mut scores: Vec<String> = v["device"]["scores"]
        .as_array()
        .unwrap()
        .iter()
        .map(ToString::to_string)
        .collect();
    scores.sort();
    let mut tiers = BTreeMap::new();
    for t in v["lower_tier"].as_array().unwrap() {
        let mut hits: Vec<String> = t[1]["hits"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| h[1] != 0)
            .map(ToString::to_string)
            .collect();
        hits.sort();
        if !hits.is_empty() {
            tiers.insert(t[0].to_string(), hits);
        }
    }
    json!({ "scores": scores, "tiers": tiers })
}

/// `query_by_hash_isolates_routing_groups_and_ignores_legacy_tenant_id`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_by_hash_isolates_routing_groups_and_ignores_legacy_tenant_id() {
    let pair = Pair::start().await;
    let ctx = zmq::Context::new();
    let (mut w7, mut w8) = pair.workers_7_and_8(&ctx, ["default", "group-b"]).await;
    let tokens: Vec<u32> = vec![1, 2, 3, 4];
    w7.publish(stored(&[0x11], None, &tokens, "GPU", None));
    w8.publish(stored(&[0x11], None, &tokens, "GPU", None));
    let hashes = local_hashes(&tokens, None);
    let legacy = json!({"block_hashes": hashes, "model_name": MODEL, "tenant_id": "group-b"});
    pair.only("/query_by_hash", &legacy, "7", u64::from(BLOCK_SIZE), "8")
        .await;
    let explicit = json!({"block_hashes": hashes, "model_name": MODEL,
                          "routing_group": "group-b", "tenant_id": "default"});
    pair.only("/query_by_hash", &explicit, "8", u64::from(BLOCK_SIZE), "7")
        .await;
}

/// `query_isolates_cache_salts`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_isolates_cache_salts() {
    let pair = Pair::start().await;
    let ctx = zmq::Context::new();
    let (mut w7, mut w8) = pair.workers_7_and_8(&ctx, ["default", "default"]).await;
    let tokens = vec![1_u32, 2, 3, 4, 5, 6, 7, 8];
    w7.publish(stored(
        &[0x21, 0x22],
        None,
        &tokens,
        "GPU",
        Some("tenant-a"),
    ));
    w8.publish(stored(
        &[0x21, 0x22],
        None,
        &tokens,
        "GPU",
        Some("tenant-b"),
    ));
    for (salt, expected, other) in [("tenant-a", "7", "8"), ("tenant-b", "8", "7")] {
        let body = json!({"token_ids": tokens, "model_name": MODEL,
                          "routing_group": "default", "cache_salt": salt});
        pair.only("/query", &body, expected, tokens.len() as u64, other)
            .await;
        // And by hash, the salt in the hashes' seed.
        let body = json!({"block_hashes": local_hashes(&tokens, Some(salt)), "model_name": MODEL});
        pair.only(
            "/query_by_hash",
            &body,
            expected,
            tokens.len() as u64,
            other,
        )
        .await;
    }
}

/// `query_by_hash_rejects_cache_salt`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_by_hash_rejects_cache_salt() {
    let pair = Pair::start().await;
    let ctx = zmq::Context::new();
    let w = Publisher::bind(&ctx);
    pair.register(7, "default", &w).await;
    for cache_salt in ["tenant-a", ""] {
        let body = json!({"block_hashes": [11_i64, 12], "model_name": MODEL,
                          "routing_group": "default", "cache_salt": cache_salt});
        for base in [&pair.ours.base, &pair.dynamo.base] {
            let (s, v) = post(base, "/query_by_hash", &body).await;
            assert_eq!(s, 400, "{base}");
            assert!(v["error"]
                .as_str()
                .is_some_and(|e| e.contains("block_hashes must already include")));
        }
    }
}

/// `query_returns_404_for_unknown_model`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_returns_404_for_unknown_model() {
    let pair = Pair::start().await;
    let body = json!({"token_ids": [1_u32, 2, 3], "model_name": "no-such-model"});
    for base in [&pair.ours.base, &pair.dynamo.base] {
        let (s, v) = post(base, "/query", &body).await;
        assert_eq!(s, 404, "{base}");
        assert!(
            v["error"]
                .as_str()
                .is_some_and(|e| e.contains("no indexer for model=")),
            "unexpected 404 body: {v}"
        );
    }
}

/// `zmq_published_tiered_events_appear_in_http_query`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zmq_published_tiered_events_appear_in_http_query() {
    let pair = Pair::start().await;
    let ctx = zmq::Context::new();
    let mut p = Publisher::bind(&ctx);
    pair.register(7, "default", &p).await;
    p.subscribed(2);
    p.publish(stored(
        &[0xD0E0_AAAA_BBBB_CCCC],
        None,
        &[10, 11, 12, 13],
        "GPU",
        None,
    ));
    p.publish(stored(
        &[0x40E0_AAAA_BBBB_CCCC],
        Some(0xD0E0_AAAA_BBBB_CCCC),
        &[20, 21, 22, 23],
        "CPU_TIER1",
        None,
    ));
    let body = json!({"token_ids": [10, 11, 12, 13, 20, 21, 22, 23],
                      "model_name": MODEL, "routing_group": "default"});
    let (ours, theirs) = pair
        .ask("/query", &body, |b| {
            b["instances"]["7"]["cpu"].as_u64().unwrap_or(0) >= 8
        })
        .await;
    for body in [&ours, &theirs] {
        let inst = &body["instances"]["7"];
        assert_eq!(inst["gpu"], 4, "device-tier tokens");
        assert_eq!(inst["cpu"], 8, "cumulative through host-pinned");
        assert_eq!(inst["longest_matched"], 8);
    }
    assert_eq!(ours, theirs);
    // The workers' listing, as Dynamo lists them.
    let ours = reqwest::get(format!("{}/workers", pair.ours.base))
        .await
        .unwrap();
    let theirs = reqwest::get(format!("{}/workers", pair.dynamo.base))
        .await
        .unwrap();
    let (ours, theirs): (Value, Value) = (ours.json().await.unwrap(), theirs.json().await.unwrap());
    assert_eq!(ours, theirs);
}
