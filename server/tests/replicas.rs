//! Replica sets: each model on R servers, writes to all of them, reads
//! spread over gateways and failing over within the deadline.

use prefix_testkit::server as common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Proc;
use prefix_client::{ClientConfig, Cluster, Replication};
use prefix_testkit::server_bin;

/// Lookups answered `ok` by a server, from its metrics page.
async fn lookups_served(metrics: SocketAddr) -> f64 {
    common::metric(
        metrics,
        "prefix_index_requests_total{op=\"lookup\",outcome=\"ok\"}",
    )
    .await
}

/// `replicas` per model, reads preferring the replica `seed` picks and
/// hedged to the next after `hedge_after`.
fn replication(replicas: usize, seed: u64, hedge_after: Duration) -> Replication {
    Replication {
        replicas,
        seed,
        hedge_after: Some(hedge_after),
        // Writes count as failed past this: long enough for a loaded
        // machine, so only a dead replica fails one.
        write_deadline: Duration::from_secs(10),
        ..Replication::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_reach_every_replica_and_reads_divide_over_gateways() {
    let first = common::start(|_| {}).await;
    let cert = first.ca.clone();
    let key = first.dir.path().join("key.pem");
    let mut servers = vec![first];
    for _ in 0..2 {
        let (c, k) = (cert.clone(), key.clone());
        servers.push(
            common::start(move |cfg| {
                cfg.transport.tls = prefix_server::config::CertSource::Files { cert: c, key: k };
            })
            .await,
        );
    }
    let list: Vec<(String, SocketAddr)> = servers
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("index-{i}"), s.addr))
        .collect();
    let cfg = common::trusting(&cert);
    let mut gateways = Vec::new();
    for seed in 0..6 {
        // No hedge within the deadline: each lookup is served by its
        // preferred replica alone, however slow the machine.
        let no_hedge = replication(3, seed, cfg.deadline);
        gateways.push(
            Cluster::connect_replicated(&list, no_hedge, cfg.clone())
                .await
                .unwrap(),
        );
    }
    let models: Vec<String> = (0..20).map(|m| format!("model-{m}")).collect();
    for m in &models {
        gateways[0].insert(m, &[1, 2, 3], "pod-a").await.unwrap();
    }
    // Every replica gets every write (the call returned with the first).
    for s in &servers {
        common::eventually("every replica has every model", async || {
            s.index.stats().models == models.len() as u64
        })
        .await;
    }
    let before: Vec<f64> = lookups_by_server(&servers).await;
    for g in &gateways {
        for m in &models {
            let r = g.lookup(m, &[1, 2], None).await.unwrap();
            assert_eq!(r.matches[0].blocks, 2);
        }
    }
    let after: Vec<f64> = lookups_by_server(&servers).await;
    let served: Vec<f64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
    // 120 lookups over 3 replicas: each takes a share.
    assert!(served.iter().all(|&n| n >= 15.0), "{served:?}");
    assert_eq!(served.iter().sum::<f64>(), 120.0);
    let stats = gateways[0].replica_stats();
    assert!(
        stats
            .iter()
            .all(|s| s.connected && s.applied == 20 && s.dropped == 0),
        "{stats:?}"
    );
    for s in servers {
        s.shutdown().await;
    }
}

/// Each server's lookups served so far.
async fn lookups_by_server(servers: &[common::TestServer]) -> Vec<f64> {
    let mut out = Vec::new();
    for s in servers {
        out.push(lookups_served(s.metrics_addr.unwrap()).await);
    }
    out
}

/// What the gateways wrote: (model, first block) → pod, for 4-block keys.
type Written = parking_lot::Mutex<HashMap<(String, u64), String>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_under_load_costs_no_lookup_and_no_wrong_answer() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ports: Vec<(SocketAddr, SocketAddr)> = (0..3).map(|_| common::free_ports()).collect();
    // Room for every write: answers then depend on the writes alone, never
    // on when each replica's sweep evicted over a capacity.
    const ROOM: [&str; 2] = ["--pod-capacity", "10000000"];
    let mut procs = vec![Proc::start_with(
        server_bin!(),
        dirs[0].path(),
        ports[0].0,
        ports[0].1,
        &["--snapshot-interval", "0s", ROOM[0], ROOM[1]],
    )];
    procs[0].client().await;
    let cert = dirs[0].path().join("cert.pem");
    let key = dirs[0].path().join("key.pem");
    // The other servers: the first one's certificate, room, and `extra`.
    let flags = |extra: &[&str]| -> Vec<String> {
        let mut f: Vec<String> = ["--snapshot-interval", "0s", ROOM[0], ROOM[1]]
            .map(String::from)
            .into();
        f.extend(["--cert".into(), cert.to_string_lossy().into_owned()]);
        f.extend(["--key".into(), key.to_string_lossy().into_owned()]);
        f.extend(extra.iter().map(|s| s.to_string()));
        f
    };
    let start = |dir: &std::path::Path, (addr, http): (SocketAddr, SocketAddr), extra: &[&str]| {
        let f = flags(extra);
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        Proc::start_with(server_bin!(), dir, addr, http, &f)
    };
    for i in 1..3 {
        procs.push(start(dirs[i].path(), ports[i], &[]));
    }
    let list: Vec<(String, SocketAddr)> =
        (0..3).map(|i| (format!("index-{i}"), ports[i].0)).collect();
    // The deadline (10 s) is long enough for a loaded CI machine; the hedge
    // (100 ms) is what moves a lookup off a dead replica. A lookup that no
    // hedge saved fails at the deadline, and is counted.
    let cfg = ClientConfig {
        connect_timeout: Duration::from_secs(10),
        ..common::trusting(&cert)
    };
    let hedge = Duration::from_millis(100);
    let mut gateways = Vec::new();
    for seed in 0..2 {
        let mut tries = 0;
        let cluster = loop {
            match Cluster::connect_replicated(&list, replication(3, seed, hedge), cfg.clone()).await
            {
                Ok(c) => break c,
                Err(e) if tries < 100 => {
                    tries += 1;
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("{e}"),
            }
        };
        gateways.push(cluster);
    }

    let written = Arc::new(Written::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (lookups, failed, wrong, stale) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let mut tasks = Vec::new();
    for (g, cluster) in gateways.iter().enumerate() {
        let (cluster, written, stop) = (cluster.clone(), written.clone(), stop.clone());
        let (lookups, failed, wrong, stale) = (
            lookups.clone(),
            failed.clone(),
            wrong.clone(),
            stale.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i: u64 = 0;
            let mut mine: Vec<(String, Vec<u64>, String)> = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let model = format!("model-{}", i % 8);
                let key: Vec<u64> = (0..4).map(|b| (g as u64) << 40 | i << 8 | b).collect();
                let pod = format!("pod-{}", i % 5);
                // Recorded before the insert: a lookup may see it as soon as
                // one replica has it.
                written.lock().insert((model.clone(), key[0]), pod.clone());
                let _ = cluster.insert(&model, &key, &pod).await;
                mine.push((model, key, pod));
                // Look up an earlier write of this gateway.
                let (m, k, _) = &mine[(i as usize * 7919) % mine.len()];
                lookups.fetch_add(1, Ordering::Relaxed);
                match cluster.lookup(m, k, None).await {
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => {
                        let w = written.lock();
                        let want = w.get(&(m.clone(), k[0])).cloned();
                        // Only the pod written for this key may match, and
                        // by at most the key's length.
                        let bad = r
                            .matches
                            .iter()
                            .any(|pm| Some(pm.pod.as_str()) != want.as_deref() || pm.blocks > 4);
                        if bad {
                            wrong.fetch_add(1, Ordering::Relaxed);
                        } else if r.matches.is_empty() {
                            stale.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            }
        }));
    }
    // The load runs for a number of lookups, not for a time: LOOKUPS
    // before the kill, LOOKUPS more after it, and until the gateways have
    // found the replica dead.
    const LOOKUPS: u64 = 300;
    common::eventually("lookups before the kill", async || {
        lookups.load(Ordering::Relaxed) >= LOOKUPS
    })
    .await;
    let before_kill = (
        lookups.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
    );
    procs[1].signal("-KILL");
    procs[1].wait().await;
    common::eventually("lookups after the kill", async || {
        lookups.load(Ordering::Relaxed) >= before_kill.0 + LOOKUPS
    })
    .await;
    common::eventually("the gateways find the replica dead", async || {
        gateways.iter().all(|g| {
            let dead = &g.replica_stats()[1];
            !dead.connected || dead.failed > 0
        })
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
    let (n, f, w, s) = (
        lookups.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        wrong.load(Ordering::Relaxed),
        stale.load(Ordering::Relaxed),
    );
    eprintln!(
        "{n} lookups ({} before the kill), {f} failed ({} before), {w} wrong, {s} stale; replicas {:?}",
        before_kill.0,
        before_kill.1,
        gateways[0].replica_stats()
    );
    assert_eq!(w, 0, "wrong answers");
    assert_eq!(before_kill.1, 0, "lookups failed with every replica up");
    // At most the lookups in flight to the dead replica when it died: one
    // per gateway (each has one call in flight at a time).
    assert!(
        f <= gateways.len() as u64,
        "{f} lookups failed after the kill"
    );

    // The killed replica comes back with an empty data directory: it fills
    // from a live peer, says it is ready, and then answers as the others do.
    let empty = tempfile::tempdir().unwrap();
    let (p0, p2) = (ports[0].0.to_string(), ports[2].0.to_string());
    procs[1] = start(empty.path(), ports[1], &["--peer", &p0, "--peer", &p2]);
    common::eventually("the restarted replica is ready", async || {
        std::net::TcpStream::connect(ports[1].1).is_ok()
            && common::http_get(ports[1].1, "/readyz")
                .await
                .contains("200")
    })
    .await;
    let log = procs[1].log();
    let restored = log
        .lines()
        .find(|l| l.contains("restored a peer's snapshot"));
    assert!(restored.is_some_and(|l| l.contains(&p0)), "{log}");
    let filled = log.lines().find(|l| l.contains("filled; ready"));
    assert!(filled.is_some(), "{log}");
    eprintln!(
        "{}\n{}",
        restored.unwrap_or_default(),
        filled.unwrap_or_default()
    );
    let mut direct = Vec::new();
    for (addr, _) in &ports {
        direct.push(
            prefix_client::Client::connect(*addr, cfg.clone())
                .await
                .unwrap(),
        );
    }
    let keys: Vec<(String, Vec<u64>)> = {
        let w = written.lock();
        let mut all: Vec<_> = w.keys().cloned().collect();
        all.sort();
        let step = (all.len() / 1000).max(1);
        all.into_iter()
            .step_by(step)
            .map(|(m, first)| (m, (0..4).map(|b| first | b).collect()))
            .collect()
    };
    let mut others_differ = 0;
    for (m, k) in &keys {
        let mut answers = Vec::new();
        for c in &direct {
            let mut r = c.lookup(m, k, None).await.unwrap();
            r.matches.sort_by(|a, b| a.pod.cmp(&b.pod));
            answers.push(r);
        }
        assert_eq!(answers[1], answers[0], "{m} {k:?}: the filled replica");
        // The other two saw the same writes, unless a batch to one of them
        // failed (its writer counts it): reported, not asserted.
        if answers[2] != answers[0] {
            others_differ += 1;
        }
    }
    eprintln!(
        "{} sampled lookups answered alike by the filled replica and its peer; \
         the third replica differs on {others_differ}",
        keys.len()
    );
    for mut p in procs {
        let _ = p.child.kill();
        let _ = p.wait().await;
    }
}
