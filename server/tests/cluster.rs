//! Three servers, models placed by rendezvous hashing of their names.

use prefix_testkit::server as common;

use prefix_client::wire::{Op, Reply};
use prefix_client::{place, Cluster, TlsConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_are_spread_over_three_servers() {
    let servers = [
        common::start(|_| {}).await,
        common::start(|_| {}).await,
        common::start(|_| {}).await,
    ];
    let (list, cfg) = common::named(&servers);
    let names: Vec<String> = list.iter().map(|(n, _)| n.clone()).collect();
    let cluster = Cluster::connect(&list, cfg).await.unwrap();

    let models: Vec<String> = (0..30).map(|m| format!("model-{m}")).collect();
    for m in &models {
        cluster.insert(m, &[1, 2, 3], "pod-a").await.unwrap();
    }
    // Every model lives on exactly the server rendezvous hashing names, and
    // every server got some.
    let mut per_server = [0u64; 3];
    for m in &models {
        let home = place(m, &names).unwrap();
        per_server[home] += 1;
        for (i, s) in servers.iter().enumerate() {
            let found = s.index.lookup(m, &[1, 2, 3], None, 0);
            assert_eq!(found.len(), usize::from(i == home), "{m} on server {i}");
        }
        let r = cluster.lookup(m, &[1, 2], None).await.unwrap();
        assert_eq!(r.matches[0].blocks, 2);
    }
    assert!(per_server.iter().all(|&n| n > 0), "{per_server:?}");
    for (i, s) in servers.iter().enumerate() {
        assert_eq!(s.index.stats().models, per_server[i]);
    }

    // A batch is split per server and answered in order.
    let ops: Vec<Op> = models
        .iter()
        .map(|m| Op::Lookup {
            model: m.clone(),
            key: vec![1, 2, 3, 4],
            candidates: None,
        })
        .collect();
    let replies = cluster.batch(ops).await.unwrap();
    assert_eq!(replies.len(), models.len());
    assert!(replies
        .iter()
        .all(|r| matches!(r, Reply::Lookup { key_blocks: 4, matches } if matches[0].blocks == 3)));

    // Pods are global: removal reaches every server.
    assert!(cluster.remove_pod("pod-a").await.unwrap());
    for m in &models {
        assert!(cluster
            .lookup(m, &[1], None)
            .await
            .unwrap()
            .matches
            .is_empty());
    }
    assert_eq!(cluster.stats().await.unwrap().pods, 0);
    for s in servers {
        s.shutdown().await;
    }
}

/// Servers given by `host:port` name: connected by name, and found again by
/// name when they come back (a new process on the same port here; the name
/// is resolved before every attempt, so a pod back at a new IP is found).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_named_by_host_connect_and_reconnect() {
    use prefix_client::ServerAddr;
    assert_eq!(
        ServerAddr::from("10.0.0.5:7070"),
        ServerAddr::Addr("10.0.0.5:7070".parse().unwrap())
    );
    assert_eq!(
        ServerAddr::from("index-0.index:7070"),
        ServerAddr::Name("index-0.index:7070".into())
    );
    let (addr, http) = common::free_ports();
    let dir = tempfile::tempdir().unwrap();
    let mut first =
        common::Proc::start(prefix_testkit::server_bin!(), dir.path(), addr, http, "0s");
    first.client().await;
    let named = format!("localhost:{}", addr.port());
    let tls = TlsConfig::from_files(&dir.path().join("cert.pem"), None, None).unwrap();
    let cfg = prefix_client::ClientConfig {
        tls,
        deadline: std::time::Duration::from_secs(5),
        backoff_max: std::time::Duration::from_millis(100),
        ..Default::default()
    };
    let cluster = Cluster::connect(&[("index-0".to_string(), named.clone())], cfg)
        .await
        .unwrap();
    cluster.insert("m", &[1, 2], "p").await.unwrap();
    let (_, client) = cluster.servers().next().unwrap();
    assert_eq!(client.server(), &ServerAddr::Name(named));
    assert_eq!(client.addr().port(), addr.port());
    // Stopped cleanly, so the client sees the connection close at once.
    first.signal("-TERM");
    first.wait().await;
    let mut second =
        common::Proc::start(prefix_testkit::server_bin!(), dir.path(), addr, http, "0s");
    common::eventually("the named server is found again", async || {
        cluster.insert("m", &[3, 4], "p").await.is_ok()
    })
    .await;
    let r = cluster.lookup("m", &[3, 4], None).await.unwrap();
    assert_eq!(r.matches[0].blocks, 2);
    let _ = second.child.kill();
    second.wait().await;
}
