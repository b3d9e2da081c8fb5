//! The field's routers' indexer APIs, end to end (`docs/routers.md`).
//!
//! Dynamo's standalone indexer routes, over plain HTTP: vLLM 0.33.0's own
//! event bytes (`tests/data/vllm_identity`) published by engines that
//! `/register` enrolled, then `/query` by token ids and `/query_by_hash`
//! by Dynamo's block hashes answer what vLLM would reuse, salt and LoRA
//! included; a CPU tier counts as Dynamo's `cpu`; `/workers` and
//! `/unregister` behave as Dynamo's; bad requests get Dynamo's statuses.
//!
//! SGLang's gRPC indexer service, over plain HTTP/2 as its router calls
//! it: a bridge's reports, revocations and clears, then prefix matches,
//! placements and hit counts, with the reference server's statuses; and,
//! with `--block-aliases engine`, a pod followed through SGLang's own
//! events matched by the router's hashes.

use prefix_testkit::publisher::{payload, Publisher};
use prefix_testkit::server as common;
use prefix_testkit::vllm::{self, PublishedCase};

use std::net::SocketAddr;

use prefix_events::{Event, Stored};
use prefix_server::config::ServerConfig;
use prefix_server::routers::sglang::pb;
use prefix_server::BlockAliases;
use serde_json::{json, Value};
use xxhash_rust::xxh3::xxh3_64_with_seed;

use pb::kv_indexer_client::KvIndexerClient;

const BLOCK: usize = 16;

/// A server with the HTTP API in plain HTTP, keying engine blocks by
/// `aliases`.
async fn start(aliases: BlockAliases, tweak: impl FnOnce(&mut ServerConfig)) -> common::TestServer {
    common::start(|cfg| {
        cfg.transport.http_listen = Some("127.0.0.1:0".parse().unwrap());
        cfg.transport.http_plaintext = true;
        cfg.engines.block_aliases = aliases;
        tweak(cfg);
    })
    .await
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("http://{addr}{path}")
}

async fn post(http: &reqwest::Client, addr: SocketAddr, path: &str, body: Value) -> (u16, Value) {
    let r = http.post(url(addr, path)).json(&body).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn get(http: &reqwest::Client, addr: SocketAddr, path: &str) -> (u16, Value) {
    let r = http.get(url(addr, path)).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Posts `body` to `path`, which must answer `status` with an error that
/// says `says`.
async fn refused(
    http: &reqwest::Client,
    addr: SocketAddr,
    path: &str,
    body: Value,
    status: u16,
    says: &str,
) {
    let (s, v) = post(http, addr, path, body).await;
    assert_eq!(s, status, "{v}");
    assert!(v["error"].as_str().unwrap().contains(says), "{v}");
}

/// How many workers `/workers` lists.
async fn worker_count(http: &reqwest::Client, addr: SocketAddr) -> usize {
    let (_, v) = get(http, addr, "/workers").await;
    v.as_array().unwrap().len()
}

/// Dynamo's local block hashes of `tokens` (xxh3-64 of each block's
/// little-endian ids, seed 1337 plus the adapter's and the salt's
/// hashes), as signed integers: computed here from the rule, apart from
/// the server's code.
fn dynamo_hashes(tokens: &[u32], lora: Option<&str>, salt: Option<&str>) -> Vec<i64> {
    let mut seed = 1337u64;
    if let Some(l) = lora {
        seed = seed.wrapping_add(xxh3_64_with_seed(l.as_bytes(), 0));
    }
    if let Some(s) = salt {
        seed = seed.wrapping_add(xxh3_64_with_seed(s.as_bytes(), 1));
    }
    tokens
        .chunks_exact(BLOCK)
        .map(|b| {
            let bytes: Vec<u8> = b.iter().flat_map(|t| t.to_le_bytes()).collect();
            xxh3_64_with_seed(&bytes, seed) as i64
        })
        .collect()
}

/// A store of one block.
fn stored(hash: u64, parent: Option<u64>, tokens: Vec<u32>, block_size: u32) -> Event {
    Event::Stored(Stored {
        hashes: vec![hash],
        parent,
        tokens,
        block_size,
        ..Stored::default()
    })
}

/// The GPU tokens `instance` is answered with, 0 when it is not.
fn gpu(answer: &Value, instance: &str) -> u64 {
    answer["instances"][instance]["gpu"].as_u64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamos_routes_answer_what_vllm_would_reuse() {
    let cases = vllm::published();
    let server = start(BlockAliases::Dynamo, |_| {}).await;
    let addr = server.api_addr.unwrap();
    let http = reqwest::Client::new();
    let ctx = zmq::Context::new();
    let mut engines = Vec::new();
    // One Dynamo worker per request, instance ids 1, 2, ...
    for (i, c) in cases.cases.iter().enumerate() {
        let p = Publisher::bind(&ctx, "kv");
        let body = json!({
            "instance_id": i + 1, "endpoint": p.endpoint, "model_name": "m",
            "block_size": BLOCK, "dp_rank": 0,
        });
        assert_eq!(
            post(&http, addr, "/register", body).await.0,
            201,
            "{}",
            c.name
        );
        engines.push((c.clone(), p));
    }
    for (c, p) in &engines {
        p.publish_when_subscribed(&vllm::published_batch(&c.file));
    }
    let query = |c: &PublishedCase, salt: Option<&str>, lora: Option<&str>| json!({"token_ids": c.tokens, "model_name": "m", "cache_salt": salt, "lora_name": lora});
    for (i, (c, _)) in engines.iter().enumerate() {
        let id = (i + 1).to_string();
        let body = query(c, c.cache_salt.as_deref(), c.lora_name.as_deref());
        // An image's blocks are not named by token ids alone: only the
        // two blocks before it are.
        let reach = if c.mm_items.is_empty() { 160 } else { 32 };
        common::eventually(&format!("{} is followed", c.name), async || {
            gpu(&post(&http, addr, "/query", body.clone()).await.1, &id) == reach
        })
        .await;
    }
    let case = |name: &str| {
        engines
            .iter()
            .find(|(c, _)| c.name == name)
            .unwrap()
            .0
            .clone()
    };
    let plain = case("plain");
    // Token ids: the request's identity decides which cache answers.
    let (s, v) = post(&http, addr, "/query", query(&plain, None, None)).await;
    assert_eq!(s, 200);
    assert_eq!(v["scores"]["1"]["0"], 160);
    assert_eq!(v["frequencies"], json!([]));
    assert_eq!(
        v["instances"]["1"],
        json!({"longest_matched":160,"gpu":160,"dp":{"0":160},"cpu":160,"disk":160})
    );
    assert_eq!(
        gpu(&v, "2"),
        0,
        "a salted cache answers a plain prompt: {v}"
    );
    let (_, v) = post(&http, addr, "/query", query(&plain, Some("tenant-b"), None)).await;
    assert_eq!((gpu(&v, "1"), gpu(&v, "2")), (0, 0));
    let (_, v) = post(&http, addr, "/query", query(&plain, Some("tenant-a"), None)).await;
    assert_eq!((gpu(&v, "1"), gpu(&v, "2")), (0, 160));
    let (_, v) = post(
        &http,
        addr,
        "/query",
        query(&case("lora"), None, Some("sql-lora")),
    )
    .await;
    assert_eq!((gpu(&v, "4"), gpu(&v, "5")), (160, 0));
    // Another image with the same placeholder ids: the blocks before it.
    let (_, v) = post(&http, addr, "/query", query(&case("image_a"), None, None)).await;
    assert_eq!(gpu(&v, "3"), 32);

    // Dynamo's block hashes: the same answers (an image's blocks are never
    // named by Dynamo's rule, which has no term for the image).
    let by_hash = async |c: &PublishedCase, salt: Option<&str>, lora: Option<&str>| {
        let body = json!({"block_hashes": dynamo_hashes(&c.tokens, lora, salt), "model_name": "m"});
        post(&http, addr, "/query_by_hash", body).await
    };
    let (s, v) = by_hash(&plain, None, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!((gpu(&v, "1"), gpu(&v, "2")), (160, 0));
    let (_, v) = by_hash(&plain, Some("tenant-a"), None).await;
    assert_eq!((gpu(&v, "1"), gpu(&v, "2")), (0, 160));
    let (_, v) = by_hash(&case("lora_salted"), Some("tenant-a"), Some("sql-lora")).await;
    assert_eq!((gpu(&v, "4"), gpu(&v, "5")), (0, 160));
    let (_, v) = by_hash(&case("image_a"), None, None).await;
    // Only the two blocks before the image.
    assert_eq!(gpu(&v, "3"), 32);
    // The remote client's route: engine blocks, by tier.
    let (s, v) = post(&http, addr, "/query_tiered_by_hash",
        json!({"block_hashes": dynamo_hashes(&plain.tokens, None, None), "model_name": "m", "routing_group": "default"})).await;
    assert_eq!(s, 200);
    assert_eq!(v["block_size"], 16);
    assert_eq!(
        v["tiered"]["device"]["scores"],
        json!([[{"worker_id":1,"dp_rank":0},10],[{"worker_id":3,"dp_rank":0},2]])
    );

    // Workers, and one unregistered.
    let (s, v) = get(&http, addr, "/workers").await;
    assert_eq!(s, 200);
    let ids: Vec<u64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["instance_id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [1, 2, 3, 4, 5]);
    assert_eq!(v[0]["listeners"]["0"]["status"], "active");
    assert_eq!(v[0]["block_size"], 16);
    let (_, v) = get(&http, addr, "/workers?model_name=other").await;
    assert_eq!(v, json!([]));
    let (s, _) = post(
        &http,
        addr,
        "/unregister",
        json!({"instance_id": 1, "model_name": "m"}),
    )
    .await;
    assert_eq!(s, 200);
    let (_, v) = post(&http, addr, "/query", query(&plain, None, None)).await;
    assert_eq!(gpu(&v, "1"), 0);
    assert_eq!(worker_count(&http, addr).await, 4);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_tier_is_dynamos_cpu_and_its_host_hits() {
    let server = start(BlockAliases::Dynamo, |cfg| cfg.engines.token_block = 4).await;
    let addr = server.api_addr.unwrap();
    let http = reqwest::Client::new();
    let ctx = zmq::Context::new();
    let p = Publisher::bind(&ctx, "");
    let body = json!({"instance_id": 7, "endpoint": p.endpoint, "model_name": "test-model",
                      "routing_group": "default", "block_size": 4, "dp_rank": 0});
    assert_eq!(post(&http, addr, "/register", body).await.0, 201);
    // Dynamo's own ZMQ scenario: a GPU block, then its child on the CPU.
    let stored = |hash: u64, parent: Option<u64>, tokens: Vec<u32>, medium: &str| {
        let mut s = stored(hash, parent, tokens, 4);
        if let Event::Stored(s) = &mut s {
            s.medium = Some(medium.into());
        }
        payload(vec![s])
    };
    p.subscribed();
    p.publish(
        0,
        &stored(0xD0E0_AAAA_BBBB_CCCC, None, vec![10, 11, 12, 13], "GPU"),
    );
    p.publish(
        1,
        &stored(
            0x40E0_AAAA_BBBB_CCCC,
            Some(0xD0E0_AAAA_BBBB_CCCC),
            vec![20, 21, 22, 23],
            "CPU_TIER1",
        ),
    );
    let q = json!({"token_ids": [10,11,12,13,20,21,22,23], "model_name": "test-model", "routing_group": "default"});
    common::eventually("the CPU block is followed", async || {
        post(&http, addr, "/query", q.clone()).await.1["instances"]["7"]["cpu"] == 8
    })
    .await;
    let (_, v) = post(&http, addr, "/query", q).await;
    assert_eq!(
        v["instances"]["7"],
        json!({"longest_matched":8,"gpu":4,"dp":{"0":4},"cpu":8,"disk":8})
    );
    let hashes: Vec<i64> = [[10, 11, 12, 13], [20, 21, 22, 23]]
        .iter()
        .map(|b| {
            let bytes: Vec<u8> = b.iter().flat_map(|t: &u32| t.to_le_bytes()).collect();
            xxh3_64_with_seed(&bytes, 1337) as i64
        })
        .collect();
    let (_, v) = post(
        &http,
        addr,
        "/query_tiered_by_hash",
        json!({"block_hashes": hashes, "model_name": "test-model", "routing_group": "default"}),
    )
    .await;
    assert_eq!(
        v,
        json!({"block_size":4,"tiered":{
        "device":{"scores":[[{"worker_id":7,"dp_rank":0},1]],"frequencies":[]},
        "lower_tier":[["host_pinned",{"hits":[[{"worker_id":7,"dp_rank":0},1]]}],
                      ["disk",{"hits":[[{"worker_id":7,"dp_rank":0},0]]}]]}})
    );
    // Our own tiered lookup says the same, by medium.
    let (_, v) = post(
        &http,
        addr,
        "/v1/lookup-tiers",
        json!({"model":"test-model","tokens":[10,11,12,13,20,21,22,23]}),
    )
    .await;
    let tiers = &v["matches"][0]["tiers"];
    assert_eq!(v["matches"][0]["blocks"], 1);
    assert_eq!(
        tiers[tiers.as_array().unwrap().len() - 1],
        json!({"medium":"CPU_TIER1","blocks":2})
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dynamos_routes_refuse_what_dynamo_refuses() {
    // A body limit small enough that the too-large body is written whole
    // before the server answers it.
    let server = start(BlockAliases::None, |cfg| {
        cfg.limits.http_max_body_bytes = 4096
    })
    .await;
    let addr = server.api_addr.unwrap();
    let http = reqwest::Client::new();
    let reg = |id: Value, group: &str, rank: u32, block: u32| {
        json!({"instance_id": id, "endpoint": "tcp://127.0.0.1:1", "model_name": "m",
               "routing_group": group, "block_size": block, "dp_rank": rank})
    };
    // Each step in order: a route, a body, the status Dynamo answers.
    let steps = |steps: Vec<(&'static str, Value, u16)>| async {
        for (path, body, want) in steps {
            let (s, v) = post(&http, addr, path, body.clone()).await;
            assert_eq!(s, want, "{path} {body}: {v}");
        }
    };
    steps(vec![
        ("/register", reg(json!(7), "default", 0, 16), 201),
        ("/register", reg(json!(7), "default", 1, 16), 201),
        // A rank in another group, a block size the partition does not use.
        ("/register", reg(json!(7), "other", 2, 16), 409),
        ("/register", reg(json!(8), "default", 0, 32), 409),
    ])
    .await;
    let (s, v) = post(&http, addr, "/register", reg(json!(7), "default", 0, 16)).await;
    assert_eq!(
        (s, v["error"].as_str().unwrap()),
        (409, "instance 7 dp_rank 0 already registered")
    );
    // Mooncake's string ids and spellings are read too.
    let mooncake = json!({"instance_id": "vllm-prefill-node1", "endpoint": "tcp://127.0.0.1:2",
                          "modelname": "m", "block_size": 16, "dp_rank": 0, "additionalsalt": "x"});
    assert_eq!(post(&http, addr, "/register", mooncake).await.0, 201);
    let (_, workers) = get(&http, addr, "/workers").await;
    assert_eq!(workers[0]["instance_id"], 7);
    assert_eq!(workers[0]["endpoints"].as_object().unwrap().len(), 2);
    assert_eq!(workers[1]["instance_id"], "vllm-prefill-node1");
    // Bad endpoints, bodies and shapes.
    let mut bad = reg(json!(9), "default", 0, 16);
    bad["endpoint"] = json!("udp://h:1");
    assert_eq!(post(&http, addr, "/register", bad).await.0, 400);
    assert_eq!(
        post(
            &http,
            addr,
            "/register",
            reg(json!("a/b"), "default", 0, 16)
        )
        .await
        .0,
        400
    );
    let raw = |body: &'static [u8], ct: &'static str| {
        http.post(url(addr, "/query"))
            .header("content-type", ct)
            .body(body)
            .send()
    };
    assert_eq!(raw(b"{", "application/json").await.unwrap().status(), 400);
    assert_eq!(
        raw(
            b"{\"token_ids\":[-1],\"model_name\":\"m\"}",
            "application/json"
        )
        .await
        .unwrap()
        .status(),
        422
    );
    assert_eq!(
        raw(b"\x82", "application/msgpack").await.unwrap().status(),
        415
    );
    let huge = vec![b' '; 4097];
    let r = http
        .post(url(addr, "/query"))
        .body(huge)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    // Unknown partitions, salts by hash, by-hash without aliases.
    refused(
        &http,
        addr,
        "/query",
        json!({"token_ids": [1, 2, 3], "model_name": "no-such-model"}),
        404,
        "no indexer for model=",
    )
    .await;
    steps(vec![
        (
            "/query",
            json!({"token_ids": [1], "model_name": "m", "routing_group": "nope"}),
            404,
        ),
        (
            "/query",
            json!({"token_ids": [1], "model_name": "m", "block_size": 32}),
            400,
        ),
    ])
    .await;
    for salt in ["tenant-a", ""] {
        refused(
            &http,
            addr,
            "/query_by_hash",
            json!({"block_hashes": [11, 12], "model_name": "m", "cache_salt": salt}),
            400,
            "block_hashes must already include",
        )
        .await;
    }
    refused(
        &http,
        addr,
        "/query_by_hash",
        json!({"block_hashes": [11], "model_name": "m", "cache_salt": null}),
        501,
        "--block-aliases dynamo",
    )
    .await;
    // A prompt of fewer tokens than a block: an empty answer.
    let (s, v) = post(
        &http,
        addr,
        "/query",
        json!({"token_ids": [1, 2, 3], "model_name": "m"}),
    )
    .await;
    assert_eq!(
        (s, v),
        (200, json!({"scores":{},"frequencies":[],"instances":{}}))
    );
    // Unregister: Dynamo's 404s, then every rank of an instance.
    steps(vec![
        (
            "/unregister",
            json!({"instance_id": 99, "model_name": "m"}),
            404,
        ),
        (
            "/unregister",
            json!({"instance_id": 7, "model_name": "x"}),
            404,
        ),
        (
            "/unregister",
            json!({"instance_id": 7, "model_name": "m", "dp_rank": 5}),
            404,
        ),
        (
            "/unregister",
            json!({"instance_id": 7, "model_name": "m", "dp_rank": 1}),
            200,
        ),
        (
            "/unregister",
            json!({"instance_id": 7, "model_name": "m", "routing_group": "default"}),
            200,
        ),
    ])
    .await;
    assert_eq!(worker_count(&http, addr).await, 1);
    assert_eq!(
        http.get(url(addr, "/health"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    server.shutdown().await;
}

/// SGLang's router's client, over plain HTTP/2.
async fn grpc(addr: SocketAddr) -> Router {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    KvIndexerClient::new(channel).max_decoding_message_size(16 << 20)
}

type Router = KvIndexerClient<tonic::transport::Channel>;

/// A batch of `actions` from a worker (its id and address), applied.
async fn apply(
    c: &mut Router,
    (worker, address): (&str, &str),
    actions: Vec<pb::ExternalKvAction>,
) {
    c.apply_external_kv_batch(batch(worker, address, actions))
        .await
        .unwrap();
}

/// The answer to a prefix query.
async fn match_prefix(
    c: &mut Router,
    query: pb::MatchExternalKvPrefixRequest,
) -> pb::MatchExternalKvPrefixResponse {
    c.match_external_kv_prefix(query)
        .await
        .unwrap()
        .into_inner()
}

/// (hash, hit count) of each of `hashes` that has one.
async fn hit_counts(c: &mut Router, hashes: &[i64]) -> Vec<(i64, u64)> {
    let query = pb::GetExternalKvHitCountsRequest {
        hashes: hashes.to_vec(),
    };
    let counts = c.get_external_kv_hit_counts(query).await.unwrap();
    (counts.into_inner().entries.iter())
        .map(|e| (e.hash, e.hit_count_total))
        .collect()
}

fn report(tier: pb::TierType, hashes: &[i64]) -> pb::ExternalKvAction {
    action(pb::ExternalKvActionType::ActionReport, tier, hashes)
}

fn revoke(tier: pb::TierType, hashes: &[i64]) -> pb::ExternalKvAction {
    action(pb::ExternalKvActionType::ActionRevoke, tier, hashes)
}

fn action(
    kind: pb::ExternalKvActionType,
    tier: pb::TierType,
    hashes: &[i64],
) -> pb::ExternalKvAction {
    pb::ExternalKvAction {
        r#type: kind as i32,
        tier: tier as i32,
        hashes: hashes.to_vec(),
        ..Default::default()
    }
}

fn batch(
    worker: &str,
    address: &str,
    actions: Vec<pb::ExternalKvAction>,
) -> pb::ApplyExternalKvBatchRequest {
    pb::ApplyExternalKvBatchRequest {
        worker_id: worker.into(),
        seq: 1,
        actions,
        worker_address: address.into(),
        cache_spec: None,
    }
}

fn prefix(hashes: &[i64]) -> pb::MatchExternalKvPrefixRequest {
    pb::MatchExternalKvPrefixRequest {
        hashes: hashes.to_vec(),
        max_blocks: 0,
    }
}

/// (worker id, blocks) of a prefix answer.
fn matched(r: &pb::MatchExternalKvPrefixResponse) -> Vec<(String, u32)> {
    r.matches
        .iter()
        .map(|m| (m.worker_id.clone(), m.matched_prefix_blocks))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglangs_indexer_service_holds_what_bridges_report() {
    use pb::TierType::{TierDram, TierHbm, TierSsd};
    let server = start(BlockAliases::None, |_| {}).await;
    let mut c = grpc(server.api_addr.unwrap()).await;
    // Workers: (id, address).
    let (long, short) = (("long", "http://w1:30000"), ("short", "http://w2:30000"));
    let (dram, noaddr) = (("dram", "http://w3:30000"), ("noaddr", ""));
    let (ssd, large) = (("ssd", "http://w4:30000"), ("large", "http://w5:30000"));
    apply(&mut c, long, vec![report(TierHbm, &[1, 2, 3])]).await;
    apply(&mut c, short, vec![report(TierHbm, &[1])]).await;
    apply(
        &mut c,
        dram,
        vec![report(TierHbm, &[1]), report(TierDram, &[2])],
    )
    .await;
    apply(&mut c, noaddr, vec![report(TierHbm, &[1, 2, 3])]).await;
    let r = match_prefix(&mut c, prefix(&[1, 2, 3])).await;
    assert_eq!(
        matched(&r),
        [("long".into(), 3), ("dram".into(), 2), ("short".into(), 1)]
    );
    assert_eq!((r.best_prefix_blocks, r.blocks_read), (3, 3));
    assert_eq!(r.matches[0].worker_address, "http://w1:30000");
    // A first block nobody holds: nothing.
    let r = match_prefix(&mut c, prefix(&[9, 1])).await;
    assert_eq!(
        (r.matches.len(), r.best_prefix_blocks, r.blocks_read),
        (0, 0, 1)
    );
    // max_blocks caps the blocks considered.
    let mut capped = prefix(&[1, 2, 3]);
    capped.max_blocks = 2;
    let r = match_prefix(&mut c, capped).await;
    assert_eq!(r.best_prefix_blocks, 2);
    // Revocations and clears act at their tier only.
    apply(&mut c, long, vec![revoke(TierHbm, &[2])]).await;
    apply(
        &mut c,
        dram,
        vec![action(
            pb::ExternalKvActionType::ActionClearAllAtTier,
            TierHbm,
            &[],
        )],
    )
    .await;
    let r = match_prefix(&mut c, prefix(&[1, 2, 3])).await;
    assert_eq!(matched(&r), [("long".into(), 1), ("short".into(), 1)]);
    // Placements by tier, and hit counts.
    apply(&mut c, ssd, vec![report(TierSsd, &[5])]).await;
    let all = c
        .match_external_kv(pb::MatchExternalKvRequest {
            hashes: vec![1, 2, 5, 1],
            count_as_hit: true,
        })
        .await
        .unwrap()
        .into_inner();
    let ids: Vec<&str> = all.matches.iter().map(|m| m.worker_id.as_str()).collect();
    assert_eq!(ids, ["long", "short", "noaddr", "dram", "ssd"]);
    let dram = &all.matches[3];
    assert_eq!(
        (
            dram.hashes_by_tier[0].tier,
            dram.hashes_by_tier[0].hashes.clone()
        ),
        (TierDram as i32, vec![2])
    );
    assert_eq!(hit_counts(&mut c, &[1, 4, 5]).await, [(1, 1), (5, 1)]);
    // A full revocation drops the count.
    apply(&mut c, ssd, vec![revoke(TierSsd, &[5])]).await;
    assert!(hit_counts(&mut c, &[5]).await.is_empty());
    // A long prefix across two full batches, and a query past 4 MiB.
    let big: Vec<i64> = (1_000..1_000 + 16_385).collect();
    apply(&mut c, large, vec![report(TierHbm, &big[..16_384])]).await;
    apply(&mut c, large, vec![report(TierHbm, &big[16_384..])]).await;
    let r = match_prefix(&mut c, prefix(&big)).await;
    assert_eq!((r.best_prefix_blocks, r.blocks_read), (16_385, 16_385));
    let wide: Vec<i64> = std::iter::once(1_000).chain(1..600_000).collect();
    let r = match_prefix(&mut c, prefix(&wide)).await;
    assert_eq!(r.best_prefix_blocks, 1);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sglangs_indexer_service_answers_the_statuses_its_clients_act_on() {
    use pb::TierType::TierHbm;
    use tonic::Code;
    let server = start(BlockAliases::None, |_| {}).await;
    let mut c = grpc(server.api_addr.unwrap()).await;
    let code = |r: Result<tonic::Response<pb::ApplyExternalKvBatchResponse>, tonic::Status>| {
        r.unwrap_err().code()
    };
    assert_eq!(
        code(
            c.apply_external_kv_batch(batch("", "a", vec![report(TierHbm, &[1])]))
                .await
        ),
        Code::InvalidArgument
    );
    let mut odd = report(TierHbm, &[1]);
    odd.r#type = 999;
    assert_eq!(
        code(c.apply_external_kv_batch(batch("w", "", vec![odd])).await),
        Code::InvalidArgument
    );
    let mut untiered = report(TierHbm, &[1]);
    untiered.tier = 0;
    assert_eq!(
        code(
            c.apply_external_kv_batch(batch("w", "", vec![untiered]))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            c.apply_external_kv_batch(batch("w", "", vec![report(TierHbm, &[])]))
                .await
        ),
        Code::InvalidArgument
    );
    let mut masks = report(TierHbm, &[1, 2]);
    masks.component_masks = vec![1];
    assert_eq!(
        code(c.apply_external_kv_batch(batch("w", "", vec![masks])).await),
        Code::InvalidArgument
    );
    let many = (0..1_025).map(|i| report(TierHbm, &[i])).collect();
    assert_eq!(
        code(c.apply_external_kv_batch(batch("w", "", many)).await),
        Code::ResourceExhausted
    );
    // An empty batch only refreshes the worker's address.
    apply(&mut c, ("w", "addr"), vec![]).await;
    // Past the message bound, a prefix query is OUT_OF_RANGE: the router
    // routes by load instead.
    let huge: Vec<i64> = (0..1_049_600).collect();
    let r = c.match_external_kv_prefix(prefix(&huge)).await;
    assert_eq!(r.unwrap_err().code(), Code::OutOfRange);
    let r = c.match_external_kv_prefix(prefix(&[])).await;
    assert_eq!(r.unwrap_err().code(), Code::InvalidArgument);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workers_cache_spec_decides_its_prefix() {
    use pb::TierType::{TierHbm, TierSsd};
    let server = start(BlockAliases::None, |_| {}).await;
    let mut c = grpc(server.api_addr.unwrap()).await;
    let spec = pb::WorkerCacheSpec {
        version: 1,
        components: 1 | 2,
        swa_window_tokens: 100,
        full_tier_mask: 1 << 1 | 1 << 2,
        swa_tier_mask: 1 << 1,
        mamba_tier_mask: 0,
    };
    // FULL|SWA on the first three blocks, FULL alone on the fourth; 50
    // tokens a block: the window (100 tokens) holds up to block 3.
    let mut r = report(TierHbm, &[1, 2, 3, 4]);
    r.component_masks = vec![3, 3, 3, 1];
    r.block_sizes = vec![50; 4];
    let mut b = batch("swa", "http://w:1", vec![r]);
    b.cache_spec = Some(spec);
    c.apply_external_kv_batch(b).await.unwrap();
    let got = match_prefix(&mut c, prefix(&[1, 2, 3, 4])).await;
    assert_eq!(matched(&got), [("swa".into(), 3)]);
    // Component detail without a spec cannot be read: 0.
    let mut r = report(TierHbm, &[1, 2]);
    r.component_masks = vec![1, 1];
    apply(&mut c, ("nospec", "http://w:2"), vec![r]).await;
    // Storage is never served under a spec.
    let mut r = report(TierSsd, &[1]);
    r.component_masks = vec![1];
    let mut b = batch("ssd", "http://w:3", vec![r]);
    b.cache_spec = Some(spec);
    c.apply_external_kv_batch(b).await.unwrap();
    let got = match_prefix(&mut c, prefix(&[1, 2, 3, 4])).await;
    assert_eq!(matched(&got), [("swa".into(), 3)]);
    server.shutdown().await;
}

/// SGLang's router's block hashes (`compute_block_hashes`): SHA-256 of the
/// previous block's digest (none before the first) and the block's ids as
/// little-endian u32s; the digest's first 8 bytes, big-endian, signed.
fn router_hashes(tokens: &[u32], block: usize) -> Vec<i64> {
    let mut prev: Option<ring::digest::Digest> = None;
    tokens
        .chunks(block)
        .map(|b| {
            let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
            if let Some(p) = &prev {
                ctx.update(p.as_ref());
            }
            for t in b {
                ctx.update(&t.to_le_bytes());
            }
            let d = ctx.finish();
            let h = i64::from_be_bytes(d.as_ref()[..8].try_into().unwrap());
            prev = Some(d);
            h
        })
        .collect()
}

#[test]
fn router_hashes_match_sglangs_goldens() {
    // From the router's own tests (`src/policies/kv_events/hash.rs`, at
    // 360d10d6).
    assert_eq!(router_hashes(&[1, 2, 3, 4], 4), [-3488128144981237669]);
    assert_eq!(
        router_hashes(&[1, 2, 3, 4, 5], 4),
        [-3488128144981237669, -3787494577174227566]
    );
    assert_eq!(
        router_hashes(&[10, 20, 30, 40, 50, 60, 70, 80], 2),
        [
            978178666101069530,
            -895308556211281782,
            -8033692805846017938,
            835415944263129316
        ]
    );
    let long: Vec<u32> = (1..=128).collect();
    assert_eq!(
        router_hashes(&long, 16),
        [
            8635429971592222890,
            1256577331724852459,
            5689809685380680247,
            3927976462491479733,
            5639345789331840936,
            -4601255381563393033,
            3368460852864325515,
            1233425155141659070
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_followed_through_sglangs_events_answers_the_routers_hashes() {
    let ctx = zmq::Context::new();
    let p = Publisher::bind(&ctx, "");
    let sub = prefix_server::Subscription {
        pod: "http://127.0.0.1:30001".into(),
        model: "m".into(),
        endpoint: p.endpoint.clone(),
        replay: None,
        block_size: BLOCK as u32,
        topic: String::new(),
        media: vec!["GPU".into()],
    };
    let server = start(BlockAliases::Engine, |cfg| {
        cfg.engines.subscriptions = vec![sub]
    })
    .await;
    let mut c = grpc(server.api_addr.unwrap()).await;
    // SGLang stores a 4-block prompt under the router's hashes, one page a
    // store, each the child of the one before.
    let tokens: Vec<u32> = (100..164).collect();
    let hashes = router_hashes(&tokens, BLOCK);
    let events = hashes
        .iter()
        .enumerate()
        .map(|(i, &h)| {
            let parent = i.checked_sub(1).map(|j| hashes[j] as u64);
            let toks = tokens[i * BLOCK..(i + 1) * BLOCK].to_vec();
            stored(h as u64, parent, toks, BLOCK as u32)
        })
        .collect();
    p.publish_when_subscribed(&payload(events));
    // The router asks with a longer prompt's hashes (its last block partial).
    let asked: Vec<u32> = (100..170).collect();
    let q = router_hashes(&asked, BLOCK);
    common::eventually("the engine's blocks are followed", async || {
        let r = c
            .match_external_kv_prefix(prefix(&q))
            .await
            .unwrap()
            .into_inner();
        matched(&r) == [("http://127.0.0.1:30001".to_string(), 4)]
    })
    .await;
    server.shutdown().await;
}
