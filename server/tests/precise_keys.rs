//! What a gateway's token key finds of an engine's blocks, end to end.
//!
//! Long prompts: an engine's 128,000-token prompt, stored in chunks of 512
//! blocks, is answered whole (8,000 blocks) with the default settings, over
//! QUIC and HTTP.
//!
//! Block identity: vLLM 0.33.0's own event bytes
//! (`tests/data/vllm_identity`, encoded by its publisher's structs from
//! requests hashed by its own functions), published over libzmq to a
//! server that follows one pod per request; then gateway lookups of the
//! same token ids, with and without the request's identity, answer what
//! vLLM would reuse:
//!
//! | pod's cache | lookup | vLLM reuses |
//! |---|---|---|
//! | plain | plain | 10 |
//! | salted `tenant-a` | plain, or another salt | 0 |
//! | salted `tenant-a` | salt `tenant-a` | 10 |
//! | image `img-a` on blocks 2–5 | the same tokens, image `img-b` (or none) | 2 |
//! | image `img-a` on blocks 2–5 | image `img-a` | 10 |
//! | LoRA `sql-lora` (salted or not) | model `sql-lora`, same salt | 10 |
//!
//! Hybrid models: a full-attention group and a sliding-window group (32
//! tokens) each store the 10 blocks; the window group then evicts blocks 8
//! and 9. vLLM's coordinator reuses 8.
//!
//! Tiers and views: a subscription that follows the CPU tier answers a
//! detailed lookup with the GPU's match and the CPU's run after it; a gap
//! with no replay makes the pod's view "learning".

use prefix_testkit::publisher::{payload, Publisher};
use prefix_testkit::server as common;
use prefix_testkit::vllm::{self, PublishedCase};

use std::path::Path;

use prefix_client::Client;
use prefix_events::{Event, Stored};
use prefix_proto::key::{Identity, MmItem};
use prefix_proto::PodView;
use prefix_server::Subscription;
use serde_json::{json, Value};

const BLOCK: usize = 16;
const TOPIC: &str = "kv";

/// The subscription to `publisher` as pod `pod` of model `m`.
fn subscription(pod: &str, publisher: &Publisher) -> Subscription {
    Subscription {
        pod: pod.into(),
        model: "m".into(),
        endpoint: publisher.endpoint.clone(),
        replay: None,
        block_size: BLOCK as u32,
        topic: TOPIC.into(),
        media: vec!["GPU".into()],
    }
}

/// A server following `sub`, its HTTP API on if `http`, and a client of it.
async fn following(sub: Subscription, http: bool) -> (common::TestServer, Client) {
    let server = common::start(|cfg| {
        cfg.engines.subscriptions = vec![sub];
        if http {
            cfg.transport.http_listen = Some("127.0.0.1:0".parse().unwrap());
        }
    })
    .await;
    let client = server.client().await;
    (server, client)
}

/// The JSON answer to `body` posted to the HTTP API's `path` on `port`,
/// trusting the server's certificate at `ca`.
async fn post(ca: &Path, port: u16, path: &str, body: &Value) -> Value {
    let root = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    let http = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(root)
        .use_rustls_tls()
        .build()
        .unwrap();
    let text = http
        .post(format!("https://localhost:{port}{path}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    serde_json::from_str(&text).unwrap()
}

/// Blocks `pod` matches for `tokens` with `identity` under `model`.
async fn blocks(client: &Client, model: &str, pod: &str, tokens: &[u32], id: &Identity) -> u32 {
    let got = client
        .lookup_tokens_with(model, tokens, BLOCK, id, None)
        .await
        .unwrap();
    got.matches
        .iter()
        .find(|m| m.pod.as_str() == pod)
        .map_or(0, |m| m.blocks)
}

fn salted(salt: &str) -> Identity {
    Identity {
        cache_salt: Some(salt.into()),
        ..Identity::default()
    }
}

fn image(id: &str) -> Identity {
    Identity {
        mm_items: vec![MmItem {
            identifier: id.into(),
            offset: 32,
            length: 64,
        }],
        ..Identity::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lookups_answer_what_vllm_would_reuse() {
    let cases = vllm::published();
    let case = |name: &str| cases.cases.iter().find(|c| c.name == name).unwrap().clone();
    let ctx = zmq::Context::new();
    let publishers: Vec<(PublishedCase, Publisher)> = cases
        .cases
        .iter()
        .map(|c| (c.clone(), Publisher::bind(&ctx, TOPIC)))
        .collect();
    let subs = publishers
        .iter()
        .map(|(c, p)| subscription(&c.name, p))
        .collect();
    let server = common::start(|cfg| cfg.engines.subscriptions = subs).await;
    let client = server.client().await;
    for (c, p) in &publishers {
        p.publish_when_subscribed(&vllm::published_batch(&c.file));
    }
    // Each pod holds its request's 10 blocks, asked with its identity.
    for (c, _) in &publishers {
        let model = c.lora_name.as_deref().unwrap_or("m");
        let id = Identity {
            cache_salt: c.cache_salt.clone(),
            mm_items: c.mm_items.clone(),
            prompt_embeds: None,
        };
        common::eventually(&format!("{} is followed", c.name), async || {
            blocks(&client, model, &c.name, &c.tokens, &id).await == 10
        })
        .await;
    }

    let plain = Identity::default();
    let text = case("plain").tokens;
    assert_eq!(blocks(&client, "m", "plain", &text, &plain).await, 10);
    // A salted cache answers only its own salt.
    assert_eq!(blocks(&client, "m", "salted", &text, &plain).await, 0);
    assert_eq!(
        blocks(&client, "m", "salted", &text, &salted("tenant-b")).await,
        0
    );
    assert_eq!(
        blocks(&client, "m", "salted", &text, &salted("tenant-a")).await,
        10
    );
    // Another image with the same placeholder tokens: only the blocks
    // before it; the same image: all of them.
    let pixels = case("image_a").tokens;
    assert_eq!(
        blocks(&client, "m", "image_a", &pixels, &image("img-b")).await,
        2
    );
    assert_eq!(blocks(&client, "m", "image_a", &pixels, &plain).await, 2);
    assert_eq!(
        blocks(&client, "m", "image_a", &pixels, &image("img-a")).await,
        10
    );
    // An adapter is its own model; its salt still counts.
    assert_eq!(blocks(&client, "sql-lora", "lora", &text, &plain).await, 10);
    assert_eq!(blocks(&client, "m", "lora", &text, &plain).await, 0);
    assert_eq!(
        blocks(&client, "sql-lora", "lora_salted", &text, &plain).await,
        0
    );
    assert_eq!(
        blocks(
            &client,
            "sql-lora",
            "lora_salted",
            &text,
            &salted("tenant-a")
        )
        .await,
        10
    );
    let http = server.metrics_addr.unwrap();
    let identity =
        |pod: &str| format!("prefix_index_engine_identity_blocks_total{{pod=\"{pod}\"}}");
    let pods = ["salted", "image_a", "plain"].map(identity);
    assert_eq!(common::metrics(http, &pods).await, [1.0, 4.0, 0.0]);
    client.close().await;
    server.shutdown().await;
}

/// A hybrid model's pod: both groups hold the 10 blocks, then the window
/// group evicts blocks 8 and 9. The answer is vLLM's: 10, then 8; the
/// full-attention group's 10 blocks alone do not make a hit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hybrid_pod_answers_the_hit_every_group_allows() {
    let hybrid = vllm::published().hybrid;
    let ctx = zmq::Context::new();
    let engine = Publisher::bind(&ctx, TOPIC);
    let (server, client) = following(subscription("hybrid", &engine), false).await;
    let plain = Identity::default();
    engine.publish_when_subscribed(&vllm::published_batch(&hybrid.stored));
    common::eventually("both groups are held", async || {
        blocks(&client, "m", "hybrid", &hybrid.tokens, &plain).await == 10
    })
    .await;
    engine.publish(1, &vllm::published_batch(&hybrid.evicted));
    common::eventually("the window's loss is seen", async || {
        blocks(&client, "m", "hybrid", &hybrid.tokens, &plain).await == 8
    })
    .await;
    // Only the window group lost them: a prefix of 8 still answers 8.
    assert_eq!(
        blocks(&client, "m", "hybrid", &hybrid.tokens[..8 * BLOCK], &plain).await,
        8
    );
    let http = server.metrics_addr.unwrap();
    let metric = |name: &str| format!("prefix_index_engine_{name}_total{{pod=\"hybrid\"}}");
    let blocks = ["blocks_stored", "blocks_removed", "unmodelled_blocks"].map(metric);
    assert_eq!(common::metrics(http, &blocks).await, [20.0, 2.0, 0.0]);
    client.close().await;
    server.shutdown().await;
}

/// One store or removal of `tier`, blocks `range` of the chain.
fn tier_event(
    hashes: &[u64],
    tokens: &[u32],
    range: std::ops::Range<usize>,
    medium: &str,
    store: bool,
) -> Event {
    match store {
        true => Event::Stored(Stored {
            hashes: hashes[range.clone()].to_vec(),
            parent: range.start.checked_sub(1).map(|i| hashes[i]),
            tokens: tokens[range.start * BLOCK..range.end * BLOCK].to_vec(),
            block_size: BLOCK as u32,
            medium: Some(medium.into()),
            ..Stored::default()
        }),
        false => Event::Removed(prefix_events::Removed {
            hashes: hashes[range].iter().rev().copied().collect(),
            medium: Some(medium.into()),
            group: None,
        }),
    }
}

/// A pod whose subscription follows the CPU tier: its detailed answer is
/// the GPU's match and the CPU's run after it, its view exact; a gap with
/// no replay makes it learn again, and says so, over QUIC, HTTP and in the
/// metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn detailed_lookups_count_the_cpu_tier_and_say_when_a_view_is_not_exact() {
    let ctx = zmq::Context::new();
    let engine = Publisher::bind(&ctx, TOPIC);
    let sub = Subscription {
        media: vec!["GPU".into(), "CPU".into()],
        ..subscription("tiered", &engine)
    };
    let (server, client) = following(sub, true).await;
    let tokens: Vec<u32> = (0..(10 * BLOCK) as u32).map(|i| i * 7 % 50_000).collect();
    let hashes = engine_sim::chain_hashes(&tokens, BLOCK);
    let key = prefix_proto::key::token_key(&tokens, BLOCK);
    let detail = async || {
        let found = client.lookup_detail("m", &key, None).await.unwrap();
        found
            .matches
            .iter()
            .map(|m| (m.pod.to_string(), m.blocks, m.lower_blocks, m.view))
            .collect::<Vec<_>>()
    };
    let row = |blocks, lower, view| vec![("tiered".to_string(), blocks, lower, view)];
    engine.publish_when_subscribed(&payload(vec![
        tier_event(&hashes, &tokens, 0..10, "GPU", true),
        tier_event(&hashes, &tokens, 0..10, "CPU", true),
    ]));
    common::eventually("both tiers are held", async || {
        detail().await == row(10, 0, PodView::Exact)
    })
    .await;
    engine.publish(
        1,
        &payload(vec![tier_event(&hashes, &tokens, 6..10, "GPU", false)]),
    );
    common::eventually("the GPU's eviction is seen", async || {
        detail().await == row(6, 4, PodView::Exact)
    })
    .await;
    // The plain lookup answers the GPU alone.
    let plain = client.lookup("m", &key, None).await.unwrap();
    assert_eq!(plain.matches[0].blocks, 6);
    // Batch 2 is lost, and there is no replay: the pod is cleared and
    // learns again from batch 3.
    engine.publish(
        3,
        &payload(vec![tier_event(&hashes, &tokens, 0..4, "GPU", true)]),
    );
    common::eventually("the pod learns again", async || {
        detail().await == row(4, 0, PodView::Learning)
    })
    .await;
    let api = server.api_addr.expect("the API is on");
    let body = json!({"model": "m", "tokens": tokens});
    let answer = post(&server.ca, api.port(), "/v1/lookup-detail", &body).await;
    assert_eq!(
        answer["matches"],
        json!([{"pod": "tiered", "blocks": 4, "lower_blocks": 0, "view": "learning", "age_ms": 0,
            "receipts": {"exact": 0, "over": 0, "under": 0}}]),
        "{answer}"
    );
    let metrics = server.metrics_addr.unwrap();
    let view = |v: &str| format!("prefix_index_engine_view{{pod=\"tiered\",view=\"{v}\"}}");
    let views = ["learning", "exact"].map(view);
    assert_eq!(common::metrics(metrics, &views).await, [1.0, 0.0]);
    client.close().await;
    server.shutdown().await;
}

/// An engine holds a 128,000-token prompt, stored as vLLM stores a long
/// prefill: 512 blocks an event, each under the last. A gateway's lookup of
/// it answers 8,000 blocks with the default key limit, over QUIC and over
/// the HTTP API's token ids.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_prompt_an_engine_holds_is_answered_whole() {
    const BLOCKS: usize = 8_000;
    let ctx = zmq::Context::new();
    let engine = Publisher::bind(&ctx, TOPIC);
    let (server, client) = following(subscription("long", &engine), true).await;
    let tokens: Vec<u32> = (0..(BLOCKS * BLOCK) as u32).map(|i| i % 50_000).collect();
    let hashes = engine_sim::chain_hashes(&tokens, BLOCK);
    engine.subscribed();
    for (seq, chunk) in (0..BLOCKS).step_by(512).enumerate() {
        let end = (chunk + 512).min(BLOCKS);
        let event = Event::Stored(Stored {
            hashes: hashes[chunk..end].to_vec(),
            parent: chunk.checked_sub(1).map(|i| hashes[i]),
            tokens: tokens[chunk * BLOCK..end * BLOCK].to_vec(),
            block_size: BLOCK as u32,
            medium: Some("GPU".into()),
            ..Stored::default()
        });
        engine.publish(seq as u64, &payload(vec![event]));
    }
    let plain = Identity::default();
    common::eventually("the whole prompt is held", async || {
        blocks(&client, "m", "long", &tokens, &plain).await == BLOCKS as u32
    })
    .await;
    let api = server.api_addr.expect("the API is on");
    let body = json!({"model": "m", "tokens": tokens, "candidates": ["long"]});
    let answer = post(&server.ca, api.port(), "/v1/lookup", &body).await;
    assert_eq!(answer["key_blocks"], json!(BLOCKS), "{answer}");
    assert_eq!(
        answer["matches"],
        json!([{"pod": "long", "blocks": BLOCKS}]),
        "{answer}"
    );
    client.close().await;
    server.shutdown().await;
}
