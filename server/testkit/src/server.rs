//! Test servers on `127.0.0.1:0`, each with its own data directory, and
//! clients that trust them: in this process ([`start`], a [`TestServer`]
//! whose index and metrics the test can read directly), or the real binary
//! in another ([`Proc`], for signals, kills and restarts). [`eventually`],
//! [`metric`] and [`http_get`] are what tests wait on and read.

mod probe;
mod process;
mod writes;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use prefix_client::{Client, ClientConfig, TlsConfig};
use prefix_index::Index;
use prefix_server::Metrics;
use prefix_server::{Server, ServerConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use probe::{count_from_env, eventually, http_get, metric, metrics, resident_bytes};
pub use process::{client_bin, free_ports, Proc};
pub use writes::{steady_write, SteadyWrites};

/// A server running in this process, on the current tokio runtime.
pub struct TestServer {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    /// The HTTP/JSON API's address, if the config turned it on.
    pub api_addr: Option<SocketAddr>,
    pub index: Arc<Index>,
    pub metrics: Arc<Metrics>,
    /// The server's certificate (self-signed unless the config named one).
    pub ca: PathBuf,
    pub dir: tempfile::TempDir,
    pub engines: Arc<prefix_server::Engines>,
    pub replica: Arc<prefix_server::Replica>,
    stop: Option<oneshot::Sender<()>>,
    pub task: Option<JoinHandle<Result<(), prefix_server::ServerError>>>,
}

/// A config for tests: loopback, ephemeral ports, a fresh data directory.
pub fn config(dir: &tempfile::TempDir) -> ServerConfig {
    let mut cfg = ServerConfig {
        data_dir: dir.path().into(),
        ..ServerConfig::default()
    };
    cfg.transport.listen = "127.0.0.1:0".parse().unwrap();
    cfg.transport.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    cfg
}

/// Starts a server with `tweak` applied to the test [`config`].
pub async fn start(tweak: impl FnOnce(&mut ServerConfig)) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    tweak(&mut cfg);
    start_with(cfg, dir).await
}

/// Starts a server on `cfg`; `dir` lives as long as the [`TestServer`].
pub async fn start_with(cfg: ServerConfig, dir: tempfile::TempDir) -> TestServer {
    let ca = cfg.data_dir.join("cert.pem");
    let server = Server::bind(cfg).await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let (addr, metrics_addr) = (server.local_addr(), server.metrics_addr());
    let api_addr = server.api_addr();
    let (index, metrics) = (server.index().clone(), server.metrics().clone());
    let engines = server.engines().clone();
    let replica = server.replica().clone();
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    TestServer {
        addr,
        metrics_addr,
        api_addr,
        index,
        metrics,
        ca,
        dir,
        engines,
        replica,
        stop: Some(stop),
        task: Some(task),
    }
}

/// A client config trusting the certificate at `ca`, with a deadline long
/// enough for a loaded CI machine (tests check behaviour, not speed).
pub fn trusting(ca: &Path) -> ClientConfig {
    ClientConfig {
        tls: TlsConfig::from_files(ca, None, None).unwrap(),
        deadline: Duration::from_secs(10),
        ..ClientConfig::default()
    }
}

impl TestServer {
    /// A client trusting this server ([`trusting`]).
    pub async fn client(&self) -> Client {
        Client::connect(self.addr, self.client_config())
            .await
            .unwrap()
    }

    /// The config of [`TestServer::client`].
    pub fn client_config(&self) -> ClientConfig {
        trusting(&self.ca)
    }

    /// How its fill from a peer went, once it is over.
    pub fn replica_report(&self) -> Option<prefix_server::FillReport> {
        self.replica.report()
    }

    /// The engine subscriptions and their states.
    pub fn engines_list(&self) -> Vec<(prefix_server::Subscription, prefix_server::EngineStatus)> {
        self.engines.list()
    }

    /// Triggers shutdown without waiting.
    pub fn begin_shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Shuts down and waits; the server must exit cleanly. (The 30 s bound
    /// is a safety net: a server that never stops fails the test instead
    /// of hanging it.)
    pub async fn shutdown(mut self) {
        self.begin_shutdown();
        let task = self.task.take().unwrap();
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("server stops")
            .unwrap()
            .unwrap();
    }
}

/// The servers named `index-0`, `index-1`, … (a `Cluster`'s list), and a
/// client config that trusts every one of them (each test server made its
/// own self-signed certificate).
pub fn named(servers: &[TestServer]) -> (Vec<(String, SocketAddr)>, ClientConfig) {
    let mut tls = TlsConfig::default();
    for s in servers {
        tls.roots
            .extend(prefix_client::load_certs(&s.ca).expect("the server's certificate"));
    }
    let list = servers
        .iter()
        .enumerate()
        .map(|(i, s)| (format!("index-{i}"), s.addr))
        .collect();
    let cfg = ClientConfig {
        tls,
        ..servers[0].client_config()
    };
    (list, cfg)
}

/// Waits until each of the metrics listeners `http` answers ready.
pub async fn all_ready(http: &[SocketAddr]) {
    for &h in http {
        eventually("ready", async || {
            std::net::TcpStream::connect(h).is_ok() && http_get(h, "/readyz").await.contains("200")
        })
        .await;
    }
}

/// A gateway's `Cluster` over the replica set at `addrs` (named
/// `index-0`, `index-1`, …, each trusting `ca`), every model on all of
/// them, writes queued for a replica for up to 10 s; and the client config
/// it uses.
pub async fn replica_gateway(
    addrs: &[SocketAddr],
    ca: &Path,
) -> (
    prefix_client::Cluster,
    Vec<(String, SocketAddr)>,
    ClientConfig,
) {
    let cfg = ClientConfig {
        connect_timeout: Duration::from_secs(10),
        ..trusting(ca)
    };
    let list: Vec<(String, SocketAddr)> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (format!("index-{i}"), *a))
        .collect();
    let replication = prefix_client::Replication {
        replicas: addrs.len(),
        write_deadline: Duration::from_secs(10),
        ..prefix_client::Replication::default()
    };
    let gateway = prefix_client::Cluster::connect_replicated(&list, replication, cfg.clone())
        .await
        .expect("the replica set");
    (gateway, list, cfg)
}

/// A raw QUIC connection speaking our ALPN, for tests that misbehave.
pub async fn raw(server: &TestServer) -> quinn::Connection {
    let tls = TlsConfig::from_files(&server.ca, None, None).unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(tls.quic_config().unwrap());
    ep.connect(server.addr, "localhost").unwrap().await.unwrap()
}
