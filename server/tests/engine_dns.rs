//! Engines found through DNS (`--engine-dns`), against a real DNS server
//! started by the test (hickory's, in process, on a loopback port): the
//! server follows the engines the SRV records name, unsubscribes one whose
//! record goes, follows one that appears, keeps what it follows while the
//! DNS server refuses to answer, and leaves alone a pod followed otherwise.

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use hickory_server::net::runtime::{Time, TokioRuntimeProvider};
use hickory_server::proto::rr::rdata::{A, SOA, SRV};
use hickory_server::proto::rr::{LowerName, Name, RData, Record};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::store::in_memory::InMemoryZoneHandler;
use hickory_server::zone_handler::{AxfrPolicy, Catalog, ZoneHandler, ZoneType};
use prefix_proto::key::token_key;
use prefix_testkit::publisher::{own_prompt, stored_batch, Publisher};
use prefix_testkit::server as common;

const BLOCK: usize = 16;
const ZONE: &str = "cluster.local.";
const SRV_NAME: &str = "_kv-events._tcp.vllm.ns.svc.cluster.local.";

/// A DNS server's records, swapped whole: what it answers now, or none
/// (every query refused, as a server that is down for the zone).
struct Zone(ArcSwap<Catalog>);

impl Zone {
    /// A catalog serving `engines` (pod name, port) as the SRV records of
    /// [`SRV_NAME`], each target with an address record for loopback;
    /// `None` serves no zone at all.
    fn catalog(engines: Option<&[(String, u16)]>) -> Catalog {
        let mut catalog = Catalog::new();
        let Some(engines) = engines else {
            return catalog;
        };
        let origin = Name::from_ascii(ZONE).unwrap();
        let mut zone = InMemoryZoneHandler::<TokioRuntimeProvider>::empty(
            origin.clone(),
            ZoneType::Primary,
            AxfrPolicy::Deny,
        );
        let soa = SOA::new(
            Name::from_ascii("ns.cluster.local.").unwrap(),
            Name::from_ascii("admin.cluster.local.").unwrap(),
            1,
            60,
            60,
            60,
            0,
        );
        zone.upsert_mut(Record::from_rdata(origin.clone(), 0, RData::SOA(soa)), 1);
        let srv_name = Name::from_ascii(SRV_NAME).unwrap();
        for (pod, port) in engines {
            let target = Name::from_ascii(format!("{pod}.vllm.ns.svc.cluster.local.")).unwrap();
            let srv = SRV::new(0, 100, *port, target.clone());
            zone.upsert_mut(Record::from_rdata(srv_name.clone(), 0, RData::SRV(srv)), 1);
            let a = RData::A(A(Ipv4Addr::LOCALHOST));
            zone.upsert_mut(Record::from_rdata(target, 0, a), 1);
        }
        let zone: Arc<dyn ZoneHandler> = Arc::new(zone);
        catalog.upsert(LowerName::new(&origin), vec![zone]);
        catalog
    }

    fn serve(&self, engines: Option<&[(String, u16)]>) {
        self.0.store(Arc::new(Zone::catalog(engines)));
    }
}

/// Answers from whatever catalog the zone holds now.
struct Handler(Arc<Zone>);

// The trait is declared through `async_trait`: its method, written out.
impl RequestHandler for Handler {
    fn handle_request<'s, 'r, 'f, R, T>(
        &'s self,
        request: &'r Request,
        response_handle: R,
    ) -> Pin<Box<dyn Future<Output = ResponseInfo> + Send + 'f>>
    where
        R: ResponseHandler + 'f,
        T: Time + 'f,
        's: 'f,
        'r: 'f,
        Self: 'f,
    {
        let catalog = self.0 .0.load_full();
        Box::pin(async move {
            catalog
                .handle_request::<R, T>(request, response_handle)
                .await
        })
    }
}

/// Starts a DNS server on a loopback UDP port, serving `zone`.
async fn dns_server(zone: Arc<Zone>) -> (SocketAddr, hickory_server::Server<Handler>) {
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let mut server = hickory_server::Server::new(Handler(zone));
    server.register_socket(socket);
    (addr, server)
}

/// Engine `i`'s prompt: 2 blocks of its own.
fn prompt(i: usize) -> Vec<u32> {
    own_prompt(i, 2, BLOCK)
}

fn batch(i: usize) -> Vec<u8> {
    stored_batch(prompt(i), BLOCK)
}

fn port(p: &Publisher) -> u16 {
    p.endpoint.rsplit(':').next().unwrap().parse().unwrap()
}

/// Waits (at most 30 s: a safety net, not a timing claim) until `done`.
async fn until(what: &str, mut done: impl FnMut() -> bool) {
    for _ in 0..600 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("not within 30 s: {what}");
}

/// The followed pods and their endpoints, by pod.
fn followed(server: &common::TestServer) -> Vec<(String, String)> {
    let mut list: Vec<_> = server
        .engines_list()
        .into_iter()
        .map(|(sub, _)| (sub.pod, sub.endpoint))
        .collect();
    list.sort();
    list
}

/// The value of the metric line that starts with `prefix`.
async fn metric(server: &common::TestServer, prefix: &str) -> f64 {
    let url = format!("http://{}/metrics", server.metrics_addr.unwrap());
    let text = reqwest::get(url).await.unwrap().text().await.unwrap();
    text.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap())
}

/// Publishes engine `i`'s batch once the server has subscribed, and waits
/// until a lookup of its prompt names `pod`.
async fn fed(server: &common::TestServer, publisher: &Publisher, i: usize, pod: &str) {
    tokio::task::block_in_place(|| publisher.publish_when_subscribed(&batch(i)));
    let client = server.client().await;
    let key = token_key(&prompt(i), BLOCK);
    for _ in 0..600 {
        let found = client.lookup("m", &key, None).await.unwrap();
        if found.matches.iter().any(|m| m.pod == pod && m.blocks == 2) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{pod}'s blocks not found within 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engines_follow_the_records_of_a_dns_server() {
    let ctx = zmq::Context::new();
    let publishers: Vec<Publisher> = (0..5).map(|_| Publisher::bind(&ctx, "")).collect();
    let ports: Vec<u16> = publishers.iter().map(port).collect();
    let endpoints: Vec<String> = publishers.iter().map(|p| p.endpoint.clone()).collect();
    let engine = |i: usize| (format!("vllm-{i}"), ports[i]);
    let zone = Arc::new(Zone(ArcSwap::from_pointee(Zone::catalog(None))));
    zone.serve(Some(&[engine(0), engine(1), engine(2)]));
    let (dns, _dns_server) = dns_server(zone.clone()).await;
    let server = common::start(|cfg| {
        let dns_cfg = &mut cfg.engines.dns;
        dns_cfg.sources = vec![format!("srv={SRV_NAME},model=m,block-size={BLOCK}")
            .parse()
            .unwrap()];
        dns_cfg.interval = Duration::from_millis(200);
        dns_cfg.server = Some(dns);
    })
    .await;
    let at = |i: usize| (format!("vllm-{i}"), endpoints[i].clone());

    // The three engines the records name are followed, at their endpoints.
    until("three engines followed", || {
        followed(&server) == [at(0), at(1), at(2)]
    })
    .await;
    for (i, publisher) in publishers.iter().enumerate().take(3) {
        fed(&server, publisher, i, &format!("vllm-{i}")).await;
    }
    let source = format!("prefix_index_engine_dns_engines{{source=\"{SRV_NAME}\"}}");
    assert_eq!(metric(&server, &source).await, 3.0);

    // A record removed: its engine is unsubscribed and its pod's blocks go.
    zone.serve(Some(&[engine(0), engine(2)]));
    until("vllm-1 unsubscribed", || {
        followed(&server) == [at(0), at(2)]
    })
    .await;
    let client = server.client().await;
    let gone = client
        .lookup("m", &token_key(&prompt(1), BLOCK), None)
        .await
        .unwrap();
    assert!(gone.matches.iter().all(|m| m.pod != "vllm-1"), "{gone:?}");

    // A record added: its engine is followed and fed.
    zone.serve(Some(&[engine(0), engine(2), engine(3)]));
    until("vllm-3 followed", || {
        followed(&server) == [at(0), at(2), at(3)]
    })
    .await;
    fed(&server, &publishers[3], 3, "vllm-3").await;

    // The DNS server refuses every query: the followed set stays.
    let failed = format!(
        "prefix_index_engine_dns_lookups_total{{source=\"{SRV_NAME}\",outcome=\"failed\"}}"
    );
    let before = metric(&server, &failed).await;
    zone.serve(None);
    for _ in 0..600 {
        if metric(&server, &failed).await >= before + 3.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        metric(&server, &failed).await >= before + 3.0,
        "lookups did not fail"
    );
    assert_eq!(followed(&server), [at(0), at(2), at(3)]);
    assert_eq!(metric(&server, &source).await, 3.0);

    // Back, with a record for a pod a run-time subscription follows: that
    // subscription stays, the record is counted as refused.
    let other = prefix_server::Subscription {
        pod: "vllm-4".into(),
        model: "m".into(),
        endpoint: "tcp://127.0.0.1:9".into(),
        replay: None,
        block_size: BLOCK as u32,
        topic: String::new(),
        media: vec!["GPU".into()],
    };
    server.engines.subscribe(other.clone()).unwrap();
    let refused = format!("prefix_index_engine_dns_refused_total{{source=\"{SRV_NAME}\"}}");
    zone.serve(Some(&[engine(0), engine(2), engine(3), engine(4)]));
    for _ in 0..600 {
        if metric(&server, &refused).await >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        metric(&server, &refused).await >= 1.0,
        "the record was not refused"
    );
    let four = followed(&server);
    assert!(
        four.contains(&("vllm-4".into(), other.endpoint.clone())),
        "{four:?}"
    );

    // Every record gone (the name answers NXDOMAIN): nothing of DNS's is
    // followed; the run-time subscription stays.
    zone.serve(Some(&[]));
    until("DNS's engines unsubscribed", || {
        followed(&server) == [("vllm-4".into(), other.endpoint.clone())]
    })
    .await;
    assert_eq!(metric(&server, &source).await, 0.0);
    server.shutdown().await;
}
