//! Restarts of the real `prefix-server` binary: SIGTERM writes a snapshot the
//! next start restores; kill -9 loses at most the inserts after the last
//! periodic snapshot, and the restarted server resets the connections the
//! killed one held; a damaged snapshot is set aside and the server starts
//! empty.
//!
//! Nothing here passes or fails by how fast the machine is. Each test waits
//! for an event (an answer, a snapshot counted on `/metrics`, an exit); its
//! time bounds are safety nets that fail a test whose event never comes
//! instead of hanging it. Where the claim is "found at once rather than
//! after the 10-minute idle timeout", the bound (20 s, 60 s) sits well above
//! "at once" on any machine and far below the 10 minutes the failure would
//! take.

use prefix_testkit::server as common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::{free_ports, Proc};
use prefix_client::LookupResult as Lookup;
use prefix_client::{Client, ClientError};
use prefix_testkit::server_bin;

/// A data directory and the ports that one test's servers keep across
/// restarts.
struct Home {
    dir: tempfile::TempDir,
    addr: SocketAddr,
    http: SocketAddr,
}

impl Home {
    fn new() -> Home {
        let dir = tempfile::tempdir().unwrap();
        let (addr, http) = free_ports();
        Home { dir, addr, http }
    }

    /// A server here with these extra flags.
    fn start_with(&self, flags: &[&str]) -> Proc {
        Proc::start_with(server_bin!(), self.dir.path(), self.addr, self.http, flags)
    }

    /// A server here, snapshotting every `snapshot_interval`, and a client
    /// it has answered.
    async fn start(&self, snapshot_interval: &str) -> (Proc, Client) {
        let (dir, addr, http) = (self.dir.path(), self.addr, self.http);
        let mut server = Proc::start(server_bin!(), dir, addr, http, snapshot_interval);
        let c = server.client().await;
        (server, c)
    }
}

/// Keys with shared prefixes over three models and five pods.
fn workload(tag: u64, n: u64) -> Vec<(String, Vec<u64>, String)> {
    (0..n)
        .map(|i| {
            let model = format!("model-{}", i % 3);
            let key = vec![i % 4, 1_000 + i % 16, tag * 100_000 + i, 7];
            (model, key, format!("pod-{}", i % 5))
        })
        .collect()
}

async fn insert_all(c: &Client, ops: &[(String, Vec<u64>, String)]) {
    for (model, key, pod) in ops {
        c.insert(model, key, pod).await.unwrap();
    }
}

/// Every lookup of every key and of each key's first two blocks.
async fn answers(c: &Client, ops: &[(String, Vec<u64>, String)]) -> Vec<Lookup> {
    let mut out = Vec::new();
    for (model, key, _) in ops {
        out.push(c.lookup(model, key, None).await.unwrap());
        out.push(c.lookup(model, &key[..2], None).await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_then_restart_answers_the_same() {
    let home = Home::new();
    let ops = workload(1, 300);
    let (mut server, c) = home.start("1h").await;
    insert_all(&c, &ops).await;
    c.set_pod_capacity("pod-3", 12_345).await.unwrap();
    let before = answers(&c, &ops).await;
    let stats = c.stats().await.unwrap();
    c.close().await;

    server.signal("-TERM");
    let status = server.wait().await;
    assert!(status.success(), "exit {status}; log:\n{}", server.log());
    assert!(home.dir.path().join("index.snapshot").exists());
    drop(server);

    let (server, c) = home.start("1h").await;
    assert_eq!(answers(&c, &ops).await, before);
    let again = c.stats().await.unwrap();
    assert_eq!((again.pods, again.entries), (stats.pods, stats.entries));
    assert!(
        server.log().contains("restored the snapshot"),
        "{}",
        server.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_at_most_the_last_interval() {
    let home = Home::new();
    let http = home.http;
    let (mut server, c) = home.start("300ms").await;
    let early = workload(1, 200);
    insert_all(&c, &early).await;
    let want = answers(&c, &early).await;
    // Two more snapshots: the second began after every early insert was
    // acknowledged, so it holds them all.
    let written = common::metric(http, "prefix_index_snapshots_written_total").await;
    common::eventually("two snapshots after the inserts", async || {
        common::metric(http, "prefix_index_snapshots_written_total").await >= written + 2.0
    })
    .await;
    let late = workload(2, 200);
    insert_all(&c, &late).await;
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    drop(server);

    let (_server, c) = home.start("300ms").await;
    assert_eq!(
        answers(&c, &early).await,
        want,
        "an insert before the last snapshot was lost"
    );
    // The late inserts may or may not have made a snapshot; either way no
    // lookup may report more than was inserted.
    for (model, key, _) in &late {
        let found = c.lookup(model, key, None).await.unwrap();
        assert!(found.matches.iter().all(|m| m.blocks <= 4));
    }
}

/// Flags of the servers that a client outlives: no snapshots, and a server
/// idle timeout of 10 minutes, so that only the client's timeout or a
/// reset can end a connection within a test.
const QUIET: [&str; 4] = ["--snapshot-interval", "0s", "--idle-timeout", "10m"];

/// A server on [`QUIET`] with a client (`deadline`, `idle_timeout`) it has
/// answered, then killed (SIGKILL: no close reaches the client).
async fn killed_under_a_client(home: &Home, deadline: Duration, idle_timeout: Duration) -> Client {
    let mut server = home.start_with(&QUIET);
    drop(server.client().await);
    let cert = home.dir.path().join("cert.pem");
    let cfg = prefix_client::ClientConfig {
        tls: prefix_client::TlsConfig::from_files(&cert, None, None).unwrap(),
        deadline,
        idle_timeout,
        ..prefix_client::ClientConfig::default()
    };
    let client = Client::connect(home.addr, cfg).await.unwrap();
    // The one answer before the kill waits as long as a loaded machine needs.
    client
        .with_deadline(Duration::from_secs(10))
        .ping()
        .await
        .unwrap();
    server.child.kill().unwrap();
    server.child.wait().unwrap();
    client
}

/// Pings through `client` every 20 ms until an outcome is `done`, for at
/// most `limit`: how many were not, or `None` when `limit` passed first.
async fn ping_until(
    client: &Client,
    limit: Duration,
    done: impl Fn(&Result<(), ClientError>) -> bool,
) -> Option<u32> {
    let mut missed = 0;
    let wait = async {
        while !done(&client.ping().await) {
            missed += 1;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(limit, wait).await.ok()?;
    Some(missed)
}

/// A server killed and started again at the same address answers the
/// packets of its predecessor's connections with a stateless reset their
/// clients accept (its reset and connection-ID keys come from its private
/// key, so they survive the restart): a client that kept its connection
/// through the kill reconnects at once. Both idle timeouts are 10 minutes
/// here, so without the reset the client would keep sending into the dead
/// connection for that long, and the minute this test waits would pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_resets_the_connections_of_the_killed_one() {
    let home = Home::new();
    let long = Duration::from_secs(600);
    let client = killed_under_a_client(&home, Duration::from_secs(1), long).await;
    let mut server = home.start_with(&QUIET);
    drop(server.client().await);
    let started = Instant::now();
    let failed = ping_until(&client, Duration::from_secs(60), Result::is_ok).await;
    assert!(
        failed.is_some(),
        "the old connection was not reset; log:\n{}",
        server.log()
    );
    eprintln!(
        "the old client answered again {:?} after the new server did, after {} failed pings",
        started.elapsed(),
        failed.unwrap_or_default()
    );
}

/// A server killed and not restarted is found gone at the client's idle
/// timeout (1 s here, 5 s by default), not the server's (10 minutes here):
/// calls then fail at once as `Disconnected` while the client tries to
/// reconnect, instead of timing out one by one on the dead connection. A
/// test bound of 20 s separates the client's timeout from the server's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_is_found_gone_at_the_clients_idle_timeout() {
    let home = Home::new();
    let (deadline, idle) = (Duration::from_millis(200), Duration::from_secs(1));
    let client = killed_under_a_client(&home, deadline, idle).await;
    let started = Instant::now();
    let gone = |r: &Result<(), ClientError>| matches!(r, Err(ClientError::Disconnected { .. }));
    assert!(
        ping_until(&client, Duration::from_secs(20), gone)
            .await
            .is_some(),
        "the dead connection was kept"
    );
    eprintln!(
        "the killed server was found gone after {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_snapshot_is_set_aside_and_the_server_starts_empty() {
    let home = Home::new();
    let (mut server, c) = home.start("1h").await;
    insert_all(&c, &workload(1, 50)).await;
    c.close().await;
    server.signal("-TERM");
    assert!(server.wait().await.success());
    drop(server);

    // Flip one byte in the middle of the snapshot.
    let path = home.dir.path().join("index.snapshot");
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();

    let (server, c) = home.start("1h").await;
    let stats = c.stats().await.unwrap();
    assert_eq!(stats.entries, 0);
    let log = server.log();
    assert!(
        log.contains("cannot be restored") && log.contains("checksum"),
        "{log}"
    );
    let aside: Vec<_> = std::fs::read_dir(home.dir.path())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("index.snapshot.bad-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert_eq!(
        common::metric(home.http, "prefix_index_snapshot_failures_total").await,
        1.0
    );
}
