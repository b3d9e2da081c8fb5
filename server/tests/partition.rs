//! A replica back from a partition: of three replicas under a steady
//! stream of writes and lookups, one is paused (SIGSTOP, as a server cut
//! off by the network or stalled) while a pod is removed on the others,
//! then let go. No lookup fails or is answered wrong meanwhile (a paused
//! replica's lookups fail over; one catching up refuses them until it has
//! caught up), and soon after the writes stop every replica holds the
//! same entries, the removal included.
//!
//! The pause lasts `PARTITION_FREEZE_SECS` (default 10) at
//! `PARTITION_WRITES_PER_SEC` (default 1,000); the test prints how long
//! the replicas took to agree after the writes stopped, what repair
//! carried, and its traffic with nothing differing (`docs/benchmarks.md`,
//! "A replica back from a partition").

use prefix_testkit::server as common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Proc;
use prefix_client::compare::compare;
use prefix_client::Client;
use prefix_testkit::server_bin;

/// The number in environment variable `name`, else `default`.
fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The sum of counter `name` over the servers at `metrics`.
async fn total(metrics: &[SocketAddr], name: &str) -> f64 {
    let mut sum = 0.0;
    for http in metrics {
        sum += common::metric(*http, name).await;
    }
    sum
}

/// The key of the removed pod's `i`th write.
fn leaving_key(i: u64) -> Vec<u64> {
    (0..4).map(|b| (1 << 40 | i) << 8 | b).collect()
}

/// The pod removed during the pause, and how many keys it holds.
const LEAVING: &str = "pod-leaving";
const LEAVING_KEYS: u64 = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_paused_under_writes_catches_up_when_let_go() {
    let rate: u64 = setting("PARTITION_WRITES_PER_SEC", 1000);
    let freeze = Duration::from_secs(setting("PARTITION_FREEZE_SECS", 10));
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ports: Vec<(SocketAddr, SocketAddr)> = (0..3).map(|_| common::free_ports()).collect();
    let flags = |me: usize, certs: Option<(&std::path::Path, &std::path::Path)>| {
        // Room for every write: answers then depend on the writes alone.
        // Of a new set started together, one may fill from another and
        // follow its tail: not for long here, so that what the paused
        // replica missed reaches it by repair alone.
        let mut f: Vec<String> = [
            "--snapshot-interval",
            "0s",
            "--pod-capacity",
            "10000000",
            "--tail-window",
            "1s",
        ]
        .map(String::from)
        .into();
        for i in (0..3).filter(|&i| i != me) {
            f.extend(["--peer".to_string(), ports[i].0.to_string()]);
        }
        if let Some((cert, key)) = certs {
            f.extend(["--cert".into(), cert.to_string_lossy().into_owned()]);
            f.extend(["--key".into(), key.to_string_lossy().into_owned()]);
        }
        f
    };
    let start = |me: usize, certs| {
        let f = flags(me, certs);
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        Proc::start_with(server_bin!(), dirs[me].path(), ports[me].0, ports[me].1, &f)
    };
    let mut procs = vec![start(0, None)];
    procs[0].client().await;
    let cert = dirs[0].path().join("cert.pem");
    let key_pem = dirs[0].path().join("key.pem");
    for i in 1..3 {
        procs.push(start(i, Some((&cert, &key_pem))));
    }
    let http: Vec<SocketAddr> = ports.iter().map(|p| p.1).collect();
    common::all_ready(&http).await;
    let addrs: Vec<SocketAddr> = ports.iter().map(|p| p.0).collect();
    let (gateway, list, cfg) = common::replica_gateway(&addrs, &cert).await;
    let mut servers = Vec::new();
    for (name, addr) in &list {
        servers.push((
            name.clone(),
            Client::connect(*addr, cfg.clone()).await.unwrap(),
        ));
    }
    // The pod to remove, on every replica.
    for i in 0..LEAVING_KEYS {
        gateway
            .insert("model-0", &leaving_key(i), LEAVING)
            .await
            .unwrap();
    }
    // Whether a server answers that it holds the pod (none while it
    // refuses lookups, catching up).
    let holds_leaving = async |c: &Client| {
        let found = c.lookup("model-0", &leaving_key(0), None).await.ok()?;
        Some(found.matches.iter().any(|m| m.pod.as_str() == LEAVING))
    };
    for (_, c) in &servers {
        common::eventually("every replica holds the pod", async || {
            holds_leaving(c).await == Some(true)
        })
        .await;
    }

    // Writes at `rate`, in batches every 10 ms; lookups of keys written a
    // second before, each expected to find its pod.
    let writes = common::SteadyWrites::start(&gateway, rate);
    let (stop, written) = (Arc::new(AtomicBool::new(false)), writes.counter());
    let (lookups, failed, wrong) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let reads = {
        let (stop, written, gateway) = (stop.clone(), written.clone(), gateway.clone());
        let (lookups, failed, wrong) = (lookups.clone(), failed.clone(), wrong.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(5)).await;
                let done = written.load(Ordering::Relaxed);
                if done < rate {
                    continue;
                }
                // Keys acknowledged a second ago or more, spread over all.
                n += 1;
                let i = 1 + (n.wrapping_mul(0x9e37_79b9) % (done - rate + 1));
                let (model, key, pod) = common::steady_write(i);
                lookups.fetch_add(1, Ordering::Relaxed);
                match gateway.lookup(&model, &key, None).await {
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r)
                        if !r
                            .matches
                            .iter()
                            .any(|m| m.pod.as_str() == pod && m.blocks == 4) =>
                    {
                        wrong.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(_) => {}
                }
            }
        })
    };
    writes.until(2 * rate).await;

    // The third replica pauses; the pod is removed on the other two alone
    // (the gateway's removal never reached it).
    procs[2].signal("-STOP");
    let paused = Instant::now();
    let at_pause = writes.written();
    tokio::time::sleep(Duration::from_secs(1)).await;
    for (_, c) in &servers[..2] {
        assert!(c.remove_pod(LEAVING).await.unwrap());
    }
    tokio::time::sleep(freeze.saturating_sub(paused.elapsed())).await;
    procs[2].signal("-CONT");
    let resumed = Instant::now();
    let at_resume = writes.written();
    // How long it refuses lookups, catching up.
    let mut back = None;
    while writes.written() < at_resume + 3 * rate || back.is_none() {
        if back.is_none() && holds_leaving(&servers[2].1).await.is_some() {
            back = Some(resumed.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            resumed.elapsed() < Duration::from_secs(300),
            "never caught up"
        );
    }
    let total_written = writes.stop().await;
    stop.store(true, Ordering::Relaxed);
    reads.await.unwrap();
    let stopped = Instant::now();

    // Every replica holds the same entries: equal counts, no sampled key
    // answered differently, the removed pod gone from the paused one.
    let mut seed = 0;
    let agreed = loop {
        seed += 1;
        let mut entries = Vec::new();
        for (_, c) in &servers {
            entries.push(c.stats().await.unwrap().entries);
        }
        // Refused while the paused replica catches up.
        let c = compare(&servers, 3000, seed, 3).await;
        let gone = holds_leaving(&servers[2].1).await == Some(false);
        let same = entries.iter().all(|&e| e == entries[0]);
        if same && gone && c.as_ref().is_ok_and(|c| c.differing == 0 && c.sampled > 0) {
            break stopped.elapsed();
        }
        assert!(
            stopped.elapsed() < Duration::from_secs(120),
            "the replicas never agreed: {entries:?} entries, the pod gone: {gone}, {c:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let paused_http = [http[2]];
    let copied = total(&paused_http, "prefix_index_repair_copied_entries_total").await;
    let removed = total(&paused_http, "prefix_index_repair_removed_pods_total").await;
    let bytes = total(&http, "prefix_index_repair_received_bytes_total").await;
    let items = total(&http, "prefix_index_repair_items_total").await;
    // Repair's traffic with nothing differing, over five seconds, once
    // the last writes are older than what repair leaves out.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let bytes0 = total(&http, "prefix_index_repair_received_bytes_total").await;
    let rounds0 = total(&http, "prefix_index_repair_rounds_total").await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let idle_bytes = total(&http, "prefix_index_repair_received_bytes_total").await - bytes0;
    let idle_rounds = total(&http, "prefix_index_repair_rounds_total").await - rounds0;
    let entries = servers[0].1.stats().await.unwrap().entries;
    eprintln!(
        "paused {freeze:?} at {rate} writes/s ({total_written} written, {at_pause} at the \
         pause, {at_resume} at the resume): it answered lookups again {back:?} after the \
         resume, and every replica held the same {entries} entries {agreed:?} after the \
         writes stopped; the paused one copied {copied} entries and \
         removed {removed} pods; repair received {bytes} bytes and compared {items} items in \
         all; with nothing differing, {idle_bytes} bytes in {idle_rounds} rounds over 5 s; \
         lookups {} ({} failed, {} wrong)",
        lookups.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed),
        wrong.load(Ordering::Relaxed),
    );
    if std::env::var_os("PARTITION_LOGS").is_some() {
        for p in &procs {
            eprintln!("---- {}", p.log());
        }
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no lookup failed");
    assert_eq!(wrong.load(Ordering::Relaxed), 0, "no lookup was wrong");
    assert!(
        copied > 0.0,
        "repair carried the writes the paused replica missed"
    );
    assert!(
        removed >= 1.0,
        "the removal reached the paused replica by repair"
    );
    for mut p in procs {
        let _ = p.child.kill();
        let _ = p.wait().await;
    }
}
