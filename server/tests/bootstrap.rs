//! A cold replica filled from a live peer: it holds writes and refuses
//! lookups while it fills, refuses a damaged or truncated snapshot and asks
//! the next peer, and once ready answers as the peer it filled from.

use prefix_testkit::server as common;

use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use prefix_client::{Client, ClientError};
use prefix_index::Index;
use prefix_proto::{ErrorCode, Reply, Request};
use prefix_server::config::CertSource;
use prefix_server::Access;
use prefix_server::Handler;
use prefix_server::Replica;
use prefix_server::Server;
use prefix_server::{Service, SnapshotJob};
use tokio::sync::oneshot;

/// What a test peer does to the snapshot it sends.
#[derive(Clone)]
enum Mode {
    /// Sends it as it is, once the test opens the gate.
    Gated(Arc<(Mutex<bool>, Condvar)>),
    /// Flips one bit in its middle.
    Flip,
    /// Sends its first two thirds, then ends the stream normally.
    Cut,
}

/// A peer answering like the index's handler, with its snapshot altered.
struct TestPeer {
    inner: Handler,
    mode: Mode,
}

impl Service for TestPeer {
    fn serve(&self, id: u64, request: &Request, access: &Access, out: &mut Vec<u8>) {
        self.inner.serve(id, request, access, out);
    }
    fn is_heavy(&self, request: &Request) -> bool {
        self.inner.is_heavy(request)
    }
    fn refused(&self) {
        self.inner.refused();
    }
    fn limits(&self) -> &prefix_proto::Limits {
        self.inner.limits()
    }
    fn snapshot(&self, access: &Access) -> Result<SnapshotJob, Reply> {
        let job = self.inner.snapshot(access)?;
        let mode = self.mode.clone();
        Ok(Box::new(move |out| {
            if let Mode::Gated(gate) = &mode {
                // Bounded, so that a failing test does not leave a blocking
                // thread the runtime would wait for at exit.
                let (open, cv) = &**gate;
                let open = open.lock().unwrap();
                let (open, _) = cv
                    .wait_timeout_while(open, Duration::from_secs(30), |open| !*open)
                    .unwrap();
                drop(open);
                return job(out);
            }
            let mut bytes = Vec::new();
            job(&mut bytes)?;
            match mode {
                Mode::Flip => {
                    let mid = bytes.len() / 2;
                    bytes[mid] ^= 0x10;
                }
                Mode::Cut => bytes.truncate(bytes.len() * 2 / 3),
                Mode::Gated(_) => unreachable!(),
            }
            out.write_all(&bytes)
        }))
    }
}

/// The index every peer holds: 3 models, 200 keys each of 6 blocks sharing
/// a 2-block prefix per model, on 5 pods.
fn fill(index: &Index) {
    for m in 0..3u64 {
        for k in 0..200u64 {
            index
                .insert(&model(m), &key(m, k), &format!("pod-{}", k % 5), now())
                .unwrap();
        }
    }
}

fn model(m: u64) -> String {
    format!("model-{m}")
}

fn key(m: u64, k: u64) -> Vec<u64> {
    let mut key = vec![m << 32, m << 32 | 1];
    key.extend((0..4).map(|b| m << 32 | k << 8 | (b + 2)));
    key
}

fn now() -> u64 {
    prefix_server::now_ms()
}

/// A running test peer.
struct Peer {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

/// Starts a peer serving `cert`, holding [`fill`]'s index, altering its
/// snapshot as `mode` says.
async fn peer(cert: &Certs, mode: Mode) -> Peer {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::config(&dir);
    cfg.transport.tls = cert.source();
    cfg.transport.metrics_listen = None;
    cfg.upkeep.snapshot_interval = None;
    let server = Server::bind(cfg.clone()).await.unwrap();
    fill(server.index());
    let inner = Handler {
        index: server.index().clone(),
        limits: cfg.wire_limits(),
        metrics: server.metrics().clone(),
        inline_blocks: cfg.limits.inline_blocks,
        engines: None,
        replica: Replica::serving(),
    };
    let addr = server.local_addr();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let service = Arc::new(TestPeer { inner, mode });
        let _ = server
            .serve(service, async move {
                let _ = stopped.await;
            })
            .await;
    });
    Peer {
        addr,
        stop,
        task,
        _dir: dir,
    }
}

impl Peer {
    async fn shutdown(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

/// One certificate every server of a test serves and presents to its peers.
struct Certs {
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Certs {
    fn new() -> Certs {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = prefix_testkit::tls::server_cert(dir.path());
        Certs {
            cert,
            key,
            _dir: dir,
        }
    }

    fn source(&self) -> CertSource {
        CertSource::Files {
            cert: self.cert.clone(),
            key: self.key.clone(),
        }
    }
}

/// A cold server filling from `peers`.
async fn cold(certs: &Certs, peers: &[SocketAddr]) -> common::TestServer {
    let (cert, key) = (certs.cert.clone(), certs.key.clone());
    let peers: Vec<String> = peers.iter().map(ToString::to_string).collect();
    let mut server = common::start(move |cfg| {
        cfg.transport.tls = CertSource::Files { cert, key };
        cfg.replicas.peers = peers;
    })
    .await;
    server.ca = certs.cert.clone();
    server
}

/// Every key of [`fill`] looks up the same on both.
async fn same_answers(a: &Client, b: &Client) {
    for m in 0..3 {
        for k in 0..200 {
            let (x, y) = (
                a.lookup(&model(m), &key(m, k), None).await.unwrap(),
                b.lookup(&model(m), &key(m, k), None).await.unwrap(),
            );
            assert_eq!(x, y, "model {m} key {k}");
            assert!(!x.matches.is_empty(), "model {m} key {k}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_replica_holds_writes_while_it_fills_then_answers_as_its_peer() {
    let certs = Certs::new();
    let gate = Arc::new((Mutex::new(false), Condvar::new()));
    let live = peer(&certs, Mode::Gated(gate.clone())).await;
    let replica = cold(&certs, &[live.addr]).await;
    let http = replica.metrics_addr.unwrap();
    let client = replica.client().await;

    // Filling: alive, not ready; lookups refused so a gateway asks another
    // replica; writes held.
    common::eventually("the transfer has started", async || {
        common::metric(http, "prefix_index_bootstrapping").await == 1.0
    })
    .await;
    client.ping().await.unwrap();
    assert!(common::http_get(http, "/readyz").await.contains("503"));
    let refused = client.lookup(&model(0), &key(0, 0), None).await;
    assert!(
        matches!(&refused, Err(ClientError::Server { code, .. }) if *code == ErrorCode::Unavailable as u16),
        "{refused:?}"
    );
    client.insert("held", &[7, 8, 9], "pod-held").await.unwrap();
    client.remove_pod("pod-4").await.unwrap();
    assert_eq!(replica.index.stats().entries, 0, "nothing applied yet");

    // The peer sends; the replica restores, applies what it held, and is
    // ready.
    *gate.0.lock().unwrap() = true;
    gate.1.notify_all();
    common::eventually("ready", async || {
        common::http_get(http, "/readyz").await.contains("200")
    })
    .await;
    let report = replica.replica_report().expect("a fill report");
    assert_eq!(report.from, Some(live.addr.to_string()));
    assert_eq!((report.held, report.refused.len()), (2, 0), "{report:?}");
    assert!(report.bytes > 0 && report.inserts >= 600, "{report:?}");

    // The held writes came after the peer's content: the insert is there,
    // and the removed pod is gone from what the peer had.
    let held = client.lookup("held", &[7, 8, 9], None).await.unwrap();
    assert_eq!(held.matches[0].pod.as_str(), "pod-held");
    let peer_client = Client::connect(live.addr, replica.client_config())
        .await
        .unwrap();
    peer_client.remove_pod("pod-4").await.unwrap();
    peer_client
        .insert("held", &[7, 8, 9], "pod-held")
        .await
        .unwrap();
    same_answers(&client, &peer_client).await;
    assert_eq!(
        common::metric(http, "prefix_index_bootstrap_held_writes_total").await,
        2.0
    );
    live.shutdown().await;
    replica.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_or_truncated_snapshot_is_refused_and_the_next_peer_asked() {
    let certs = Certs::new();
    let flip = peer(&certs, Mode::Flip).await;
    let cut = peer(&certs, Mode::Cut).await;
    let open = Arc::new((Mutex::new(true), Condvar::new()));
    let good = peer(&certs, Mode::Gated(open)).await;
    let replica = cold(&certs, &[flip.addr, cut.addr, good.addr]).await;
    let http = replica.metrics_addr.unwrap();
    common::eventually("ready", async || {
        common::http_get(http, "/readyz").await.contains("200")
    })
    .await;
    let report = replica.replica_report().expect("a fill report");
    assert_eq!(report.from, Some(good.addr.to_string()), "{report:?}");
    let why: Vec<(String, String)> = report
        .refused
        .iter()
        .map(|r| (r.peer.clone(), r.why.clone()))
        .collect();
    assert_eq!(why.len(), 2, "{why:?}");
    assert_eq!(why[0].0, flip.addr.to_string());
    assert_eq!(why[1].0, cut.addr.to_string());
    for (_, w) in &why {
        assert!(
            w.contains("refused its snapshot") && w.contains("checksum"),
            "{w}"
        );
    }
    assert_eq!(
        common::metric(http, "prefix_index_bootstrap_failures_total").await,
        2.0
    );
    let good_client = Client::connect(good.addr, replica.client_config())
        .await
        .unwrap();
    same_answers(&replica.client().await, &good_client).await;
    for p in [flip, cut, good] {
        p.shutdown().await;
    }
    replica.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_peer_answering_a_replica_serves_after_the_timeout() {
    let certs = Certs::new();
    // Nobody listens there.
    let nobody = common::free_ports().0;
    let (cert, key) = (certs.cert.clone(), certs.key.clone());
    let replica = common::start(move |cfg| {
        cfg.transport.tls = CertSource::Files { cert, key };
        cfg.replicas.peers = vec![nobody.to_string()];
        cfg.replicas.timeout = Duration::from_millis(1500);
    })
    .await;
    let http = replica.metrics_addr.unwrap();
    common::eventually("ready", async || {
        common::http_get(http, "/readyz").await.contains("200")
    })
    .await;
    let report = replica.replica_report().expect("a fill report");
    assert_eq!(report.from, None);
    assert!(!report.refused.is_empty());
    replica.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshots_go_to_writers_and_peers_only() {
    let ca = prefix_testkit::tls::Ca::new("test-ca");
    let dir = tempfile::tempdir().unwrap();
    let ca_pem = ca.write(dir.path(), "ca");
    let server = common::start(|cfg| {
        cfg.transport.client_ca = Some(ca_pem.clone());
        cfg.roles.readers = vec!["cn:gw-ro".parse().unwrap()];
        cfg.roles.writers = vec!["cn:gw-rw".parse().unwrap()];
        cfg.roles.peers = vec!["cn:index-1".parse().unwrap()];
    })
    .await;
    fill(&server.index);
    let as_client = |name: &str| {
        let (cert, key) = ca.client(dir.path(), name);
        prefix_client::ClientConfig {
            tls: prefix_client::TlsConfig::from_files(&server.ca, Some(&cert), Some(&key)).unwrap(),
            deadline: Duration::from_secs(10),
            ..Default::default()
        }
    };
    let connect = async |name: &str| {
        let config = as_client(name);
        Client::connect(server.addr, config).await.unwrap()
    };
    let whole_snapshot = async |c: &Client| c.snapshot(1 << 30, Duration::from_secs(10)).await;
    for name in ["gw-ro", "stranger"] {
        let client = connect(name).await;
        let refused = whole_snapshot(&client).await;
        assert!(
            matches!(&refused, Err(ClientError::Server { code, .. }) if *code == ErrorCode::Forbidden as u16),
            "{name}: {refused:?}"
        );
    }
    let writer = connect("gw-rw").await;
    let whole = whole_snapshot(&writer).await.unwrap();
    let replica = connect("index-1").await;
    let bytes = whole_snapshot(&replica).await.unwrap();
    assert_eq!(bytes.len(), whole.len());
    let snap = prefix_index::Snapshot::parse(&bytes).unwrap();
    let copy = Index::new(Default::default());
    assert_eq!(snap.restore(&copy, now()).inserts, 600);
    // A limit smaller than the snapshot stops the transfer.
    let small = replica
        .snapshot(bytes.len() as u64 - 1, Duration::from_secs(10))
        .await;
    assert!(matches!(small, Err(ClientError::Protocol(_))), "{small:?}");
    // The connection still serves after both, and the server sends its
    // snapshot again once the cut transfer has let go of its slot.
    let looked = replica.lookup(&model(1), &key(1, 3), None).await.unwrap();
    assert_eq!(looked.matches[0].blocks, 6);
    common::eventually("the slot is free again", async || {
        whole_snapshot(&replica).await.is_ok()
    })
    .await;
    server.shutdown().await;
}

/// On one stream, a heavy frame (run on the blocking pool) and then a
/// snapshot request: the heavy frame is answered first, then the snapshot's
/// answer and bytes follow, and the stream ends whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_request_is_answered_after_the_frames_before_it() {
    use prefix_proto::{decode_response, encode_request, encode_snapshot_request, split_frame};
    use prefix_proto::{Op, Response, MAX_FRAME_CEILING};
    let server = common::start(|_| {}).await;
    fill(&server.index);
    // 32 lookups of 1,000 blocks: heavier than `inline-blocks` (16,384).
    let heavy = Request::Batch(
        (0..32)
            .map(|k| Op::Lookup {
                model: model(0),
                key: (0..1000).map(|b| k << 16 | b).collect(),
                candidates: None,
            })
            .collect(),
    );
    let conn = common::raw(&server).await;
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    let mut frames = Vec::new();
    encode_request(1, &heavy, &mut frames);
    encode_snapshot_request(2, &mut frames);
    send.write_all(&frames).await.unwrap();
    send.finish().unwrap();
    let all = recv.read_to_end(64 << 20).await.unwrap();
    let first = split_frame(&all, MAX_FRAME_CEILING).unwrap().unwrap();
    assert_eq!(first.header.request_id, 1);
    let Response::Batch(replies) = decode_response(first.payload).unwrap() else {
        panic!("not the batch's answer");
    };
    assert_eq!(replies.len(), 32);
    let rest = &all[first.used..];
    let second = split_frame(rest, MAX_FRAME_CEILING).unwrap().unwrap();
    assert_eq!(second.header.request_id, 2);
    assert_eq!(
        decode_response(second.payload).unwrap(),
        Response::One(Reply::Done)
    );
    let snap = prefix_index::Snapshot::parse(&rest[second.used..]).unwrap();
    assert_eq!(
        snap.restore(&Index::new(Default::default()), now()).inserts,
        600
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_set_started_at_once_serves_without_waiting_out_the_timeout() {
    let certs = Certs::new();
    let ports: Vec<SocketAddr> = (0..3).map(|_| common::free_ports().0).collect();
    let timeout = Duration::from_secs(60);
    let start = |me: SocketAddr| {
        let (cert, key) = (certs.cert.clone(), certs.key.clone());
        let peers: Vec<String> = ports
            .iter()
            .filter(|&&p| p != me)
            .map(ToString::to_string)
            .collect();
        common::start(move |cfg| {
            cfg.transport.listen = me;
            cfg.transport.tls = CertSource::Files { cert, key };
            cfg.replicas.peers = peers;
            cfg.replicas.timeout = timeout;
        })
    };
    let started = std::time::Instant::now();
    let (a, b, c) = tokio::join!(start(ports[0]), start(ports[1]), start(ports[2]));
    let mut servers = [a, b, c];
    for s in &mut servers {
        s.ca = certs.cert.clone();
    }
    for s in &servers {
        let http = s.metrics_addr.unwrap();
        common::eventually("ready", async || {
            common::http_get(http, "/readyz").await.contains("200")
        })
        .await;
    }
    let took = started.elapsed();
    eprintln!("three cold servers ready in {took:?}");
    let mut agreed = 0;
    for s in &servers {
        let report = s.replica_report().expect("a fill report");
        match report.from {
            // Ended by every peer saying it is cold, not by the timeout.
            None => {
                assert!(report.new_set, "{report:?}");
                agreed += 1;
            }
            // Or filled from one that agreed first: empty.
            Some(_) => assert_eq!(report.inserts, 0, "{report:?}"),
        }
    }
    assert!(agreed > 0, "some server must have started on its own");
    // A cold server among warm ones still fills from them.
    let c = servers[0].client().await;
    c.insert("m", &[1, 2, 3], "p").await.unwrap();
    let late = cold(&certs, &[ports[0]]).await;
    let http = late.metrics_addr.unwrap();
    common::eventually("ready", async || {
        common::http_get(http, "/readyz").await.contains("200")
    })
    .await;
    let report = late.replica_report().expect("a fill report");
    assert!(report.from.is_some(), "{report:?}");
    let found = late
        .client()
        .await
        .lookup("m", &[1, 2, 3], None)
        .await
        .unwrap();
    assert_eq!(found.matches.len(), 1, "{found:?}");
    late.shutdown().await;
    for s in servers {
        s.shutdown().await;
    }
}
