//! Replicas that converge: a replica killed under a steady stream of writes
//! and restarted empty fills from a peer's snapshot and tail, repair copies
//! what it still lacks, and soon after the writes stop every replica
//! answers every sampled key alike.
//!
//! The write rate is `CONVERGE_WRITES_PER_SEC` (default 1,000); the test
//! prints how long the replicas took to agree after the writes stopped, and
//! what the tail and repair carried (`docs/benchmarks.md`, "Replicas that
//! converge").

use prefix_testkit::server as common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::Proc;
use prefix_client::compare::compare;
use prefix_client::wire::Op;
use prefix_client::Client;
use prefix_testkit::server_bin;

/// Counters of the tail and repair of the servers at `metrics`, summed.
async fn carried(metrics: &[SocketAddr]) -> [f64; 4] {
    let mut sum = [0.0; 4];
    for http in metrics {
        for (i, name) in [
            "prefix_index_tail_writes_total",
            "prefix_index_tail_lost_writes_total",
            "prefix_index_repair_items_total",
            "prefix_index_repair_copied_entries_total",
        ]
        .iter()
        .enumerate()
        {
            sum[i] += common::metric(*http, name).await;
        }
    }
    sum
}

/// The number in environment variable `name`, else `default`.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_under_writes_converges_with_its_peers() {
    let rate: u64 = setting("CONVERGE_WRITES_PER_SEC", 1000);
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ports: Vec<(SocketAddr, SocketAddr)> = (0..3).map(|_| common::free_ports()).collect();
    let peers = |me: usize| -> Vec<String> {
        (0..3)
            .filter(|&i| i != me)
            .flat_map(|i| ["--peer".to_string(), ports[i].0.to_string()])
            .collect()
    };
    // Room for every write: answers then depend on the writes alone.
    let flags = |me: usize, certs: Option<(&std::path::Path, &std::path::Path)>| {
        let mut f: Vec<String> = ["--snapshot-interval", "0s", "--pod-capacity", "10000000"]
            .map(String::from)
            .into();
        f.extend(peers(me));
        if let Some((cert, key)) = certs {
            f.extend(["--cert".into(), cert.to_string_lossy().into_owned()]);
            f.extend(["--key".into(), key.to_string_lossy().into_owned()]);
        }
        f
    };
    let start = |me: usize, dir: &std::path::Path, certs| {
        let f = flags(me, certs);
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        Proc::start_with(server_bin!(), dir, ports[me].0, ports[me].1, &f)
    };
    // The first server makes the certificate the others share; a new set
    // (every peer cold) starts at once.
    let mut procs = vec![start(0, dirs[0].path(), None)];
    procs[0].client().await;
    let cert = dirs[0].path().join("cert.pem");
    let key = dirs[0].path().join("key.pem");
    for (i, dir) in dirs.iter().enumerate().skip(1) {
        procs.push(start(i, dir.path(), Some((&cert, &key))));
    }
    let http: Vec<SocketAddr> = ports.iter().map(|p| p.1).collect();
    common::all_ready(&http).await;
    let addrs: Vec<SocketAddr> = ports.iter().map(|p| p.0).collect();
    let (writer, _, cfg) = common::replica_gateway(&addrs, &cert).await;

    // Writes at `rate`, in batches every 10 ms, until told to stop.
    let writes = common::SteadyWrites::start(&writer, rate);
    writes.until(rate).await;
    procs[1].signal("-KILL");
    procs[1].wait().await;
    let at_kill = writes.written();
    // Down for a while under writes, then back with an empty data
    // directory: it fills from a peer while the writes go on.
    writes.until(at_kill + rate / 2).await;
    let empty = tempfile::tempdir().unwrap();
    procs[1] = start(1, empty.path(), Some((&cert, &key)));
    common::all_ready(&[ports[1].1]).await;
    let at_ready = writes.written();
    writes.until(at_ready + rate).await;
    let total = writes.stop().await;
    let stopped = Instant::now();

    let mut servers = Vec::new();
    for (i, (addr, _)) in ports.iter().enumerate() {
        let c = Client::connect(*addr, cfg.clone()).await.unwrap();
        servers.push((format!("index-{i}"), c));
    }
    let mut last = None;
    let mut seed = 0;
    common::eventually("the replicas agree on every sampled key", async || {
        seed += 1;
        let c = compare(&servers, 3000, seed, 3).await.unwrap();
        let agree = c.differing == 0 && c.sampled > 0;
        last = Some(c);
        agree
    })
    .await;
    let took = stopped.elapsed();
    // The tail the restarted server followed; repair on every server.
    let [tail, lost, _, _] = carried(&[ports[1].1]).await;
    let all: Vec<SocketAddr> = ports.iter().map(|p| p.1).collect();
    let [_, _, keys, copied] = carried(&all).await;
    let c = last.unwrap();
    eprintln!(
        "{rate} writes/s, {total} written ({at_kill} at the kill, {at_ready} when the filled \
         replica was ready): {} sampled keys alike {took:?} after the writes stopped; tail \
         {tail} writes applied, {lost} lost; repair compared {keys} items and copied {copied} \
         entries; {:?}",
        c.sampled,
        writer.replica_stats()
    );
    let log = procs[1].log();
    assert!(log.contains("restored a peer's snapshot"), "{log}");
    assert!(tail > 0.0, "the restarted replica followed its peer's tail");
    for mut p in procs {
        let _ = p.child.kill();
        let _ = p.wait().await;
    }
}

/// Two replicas of each other, started together: a new set, so both serve
/// at once; with the directory of the certificate they share.
async fn pair(
    tweak: impl Fn(&mut prefix_server::ServerConfig) + Clone + Send + 'static,
) -> (Vec<common::TestServer>, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = prefix_testkit::tls::server_cert(dir.path());
    let ports: Vec<SocketAddr> = (0..2).map(|_| common::free_ports().0).collect();
    let start = |me: usize| {
        let (cert, key, tweak) = (cert.clone(), key.clone(), tweak.clone());
        let peer = ports[1 - me].to_string();
        let listen = ports[me];
        common::start(move |cfg| {
            cfg.transport.listen = listen;
            cfg.transport.tls = prefix_server::config::CertSource::Files { cert, key };
            cfg.replicas.peers = vec![peer];
            tweak(cfg);
        })
    };
    let (a, b) = tokio::join!(start(0), start(1));
    let mut servers = vec![a, b];
    for s in &mut servers {
        s.ca = cert.clone();
        let http = s.metrics_addr.unwrap();
        common::eventually("ready", async || {
            common::http_get(http, "/readyz").await.contains("200")
        })
        .await;
    }
    (servers, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_one_replica_missed_is_repaired_from_its_peer() {
    let burst: u64 = setting("REPAIR_BURST_KEYS", 1000);
    // Rounds five times as often as the default, so that a loaded machine
    // still repairs within the test's patience; `docs/benchmarks.md` gives
    // the default's figure (REPAIR_INTERVAL_MS=1000).
    let interval: u64 = setting("REPAIR_INTERVAL_MS", 200);
    let (servers, _certs) = pair(move |cfg| {
        cfg.replicas.repair_interval = Duration::from_millis(interval);
        // Of a new set started together, one may fill from the other (if
        // the other was ready first) and follow its tail: not for long
        // here (see below), so that the burst reaches the other by repair
        // alone.
        cfg.replicas.tail_window = Duration::from_secs(1);
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (a, b) = (servers[0].client().await, servers[1].client().await);
    // Written to one replica alone, as when a gateway's queue for the
    // other overflowed.
    for chunk in (0..burst).collect::<Vec<_>>().chunks(256) {
        let ops = chunk
            .iter()
            .map(|&i| Op::Insert {
                model: format!("model-{}", i % 3),
                key: (0..4).map(|b| i << 8 | b).collect(),
                pod: format!("pod-{}", i % 5),
            })
            .collect();
        for r in a.batch(ops).await.unwrap() {
            assert_eq!(r, prefix_client::wire::Reply::Done);
        }
    }
    let written = Instant::now();
    let pair = [("a".to_string(), a), ("b".to_string(), b)];
    // Each key of the burst is a leaf of its own: copied once, whole.
    let http = servers[1].metrics_addr.unwrap();
    let copied = || common::metric(http, "prefix_index_repair_copied_entries_total");
    common::eventually("repaired", async || copied().await >= burst as f64).await;
    let took = written.elapsed();
    let items = common::metric(http, "prefix_index_repair_items_total").await;
    let after = compare(&pair, 3000, 2, 3).await.unwrap();
    eprintln!(
        "a burst of {burst} keys on one replica, repair every {interval} ms: copied to the \
         other {took:?} later, which \
         compared {items} items and copied {} entries; {} sampled keys compared after",
        copied().await,
        after.sampled
    );
    assert_eq!(after.differing, 0, "{after:?}");
    assert_eq!(
        copied().await,
        burst as f64,
        "each missing entry copied once"
    );
    for s in servers {
        s.shutdown().await;
    }
}
