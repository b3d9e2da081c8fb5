//! Test servers on `127.0.0.1:0`, with their own data directory, and clients
//! that trust them.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use prefix_client::{Client, ClientConfig, TlsConfig};
use prefix_index::Index;
use prefix_server::metrics::Metrics;
use prefix_server::{Server, ServerConfig};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    pub index: Arc<Index>,
    pub metrics: Arc<Metrics>,
    pub ca: PathBuf,
    pub dir: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    pub task: Option<JoinHandle<Result<(), prefix_server::ServerError>>>,
}

/// A config for tests: loopback, ephemeral ports, a fresh data directory.
pub fn config(dir: &tempfile::TempDir) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        metrics_listen: Some("127.0.0.1:0".parse().unwrap()),
        data_dir: dir.path().into(),
        ..ServerConfig::default()
    }
}

/// Starts a server with `tweak` applied to the test config.
pub async fn start(tweak: impl FnOnce(&mut ServerConfig)) -> TestServer {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&dir);
    tweak(&mut cfg);
    start_with(cfg, dir).await
}

pub async fn start_with(cfg: ServerConfig, dir: tempfile::TempDir) -> TestServer {
    let ca = cfg.data_dir.join("cert.pem");
    let server = Server::bind(cfg).await.unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let (addr, metrics_addr) = (server.local_addr(), server.metrics_addr());
    let (index, metrics) = (server.index().clone(), server.metrics().clone());
    let task = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    TestServer {
        addr,
        metrics_addr,
        index,
        metrics,
        ca,
        dir,
        stop: Some(stop),
        task: Some(task),
    }
}

impl TestServer {
    /// A client trusting this server, with a deadline long enough for a
    /// loaded CI machine (tests check behaviour, not speed).
    pub async fn client(&self) -> Client {
        Client::connect(self.addr, self.client_config())
            .await
            .unwrap()
    }

    pub fn client_config(&self) -> ClientConfig {
        ClientConfig {
            tls: TlsConfig::from_files(&self.ca, None, None).unwrap(),
            deadline: Duration::from_secs(10),
            ..ClientConfig::default()
        }
    }

    /// Triggers shutdown without waiting.
    pub fn begin_shutdown(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Shuts down and waits; the server must exit cleanly.
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

/// Polls `f` every 20 ms until it is true; panics after 20 s.
pub async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    for _ in 0..1000 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never happened: {what}");
}
