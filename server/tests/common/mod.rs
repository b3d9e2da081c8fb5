//! Test servers on `127.0.0.1:0`, with their own data directory, and clients
//! that trust them.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use prefix_client::{Client, ClientConfig, TlsConfig};
use prefix_index::Index;
use prefix_server::metrics::Metrics;
use prefix_server::{Server, ServerConfig};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub struct TestServer {
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    /// The HTTP/JSON API's address, if the config turned it on.
    pub api_addr: Option<SocketAddr>,
    pub index: Arc<Index>,
    pub metrics: Arc<Metrics>,
    pub ca: PathBuf,
    pub dir: tempfile::TempDir,
    pub engines: Arc<prefix_server::engines::Engines>,
    pub replica: Arc<prefix_server::bootstrap::Replica>,
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

    /// How its fill from a peer went, once it is over.
    pub fn replica_report(&self) -> Option<prefix_server::bootstrap::FillReport> {
        self.replica.report()
    }

    /// The engine subscriptions and their states.
    pub fn engines_list(
        &self,
    ) -> Vec<(
        prefix_server::engines::Subscription,
        prefix_server::engines::State,
    )> {
        self.engines.list()
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

/// A bare HTTP/1.1 GET (the test needs no HTTP client crate for this).
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

/// The value of a counter or gauge on `/metrics` (0 if absent).
pub async fn metric(addr: SocketAddr, name: &str) -> f64 {
    let body = http_get(addr, "/metrics").await;
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A raw QUIC connection speaking our ALPN, for tests that misbehave.
pub async fn raw(server: &TestServer) -> quinn::Connection {
    let tls = TlsConfig::from_files(&server.ca, None, None).unwrap();
    let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    ep.set_default_client_config(tls.quic_config().unwrap());
    ep.connect(server.addr, "localhost").unwrap().await.unwrap()
}

/// A server process on fixed loopback ports (so a restart keeps its address).
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
}

pub fn free_ports() -> (SocketAddr, SocketAddr) {
    let udp = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let tcp = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    (udp, tcp)
}

impl Proc {
    pub fn start(dir: &Path, addr: SocketAddr, http: SocketAddr, snapshot_interval: &str) -> Proc {
        Proc::start_with(dir, addr, http, &["--snapshot-interval", snapshot_interval])
    }

    /// Starts the binary with these extra flags.
    pub fn start_with(dir: &Path, addr: SocketAddr, http: SocketAddr, flags: &[&str]) -> Proc {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("server.log"))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_prefix-server"))
            .args(["--listen", &addr.to_string()])
            .args(["--metrics-listen", &http.to_string()])
            .arg("--data-dir")
            .arg(dir)
            .args(flags)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Proc {
            child,
            addr,
            dir: dir.into(),
        }
    }

    /// A client, once the server answers (it may still be restoring).
    pub async fn client(&mut self) -> Client {
        for _ in 0..500 {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("server exited: {status}; log:\n{}", self.log());
            }
            let ca = self.dir.join("cert.pem");
            if ca.exists() {
                let cfg = ClientConfig {
                    tls: TlsConfig::from_files(&ca, None, None).unwrap(),
                    deadline: Duration::from_secs(10),
                    ..ClientConfig::default()
                };
                if let Ok(c) = Client::connect(self.addr, cfg).await {
                    if c.ping().await.is_ok() {
                        return c;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        panic!("server never answered; log:\n{}", self.log());
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    pub async fn wait(&mut self) -> ExitStatus {
        for _ in 0..1500 {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("server did not exit; log:\n{}", self.log());
    }

    /// Resident memory of the process, from `/proc/<pid>/statm` (Linux).
    pub fn rss_bytes(&self) -> Option<u64> {
        let statm = std::fs::read_to_string(format!("/proc/{}/statm", self.child.id())).ok()?;
        Some(statm.split_whitespace().nth(1)?.parse::<u64>().ok()? * 4096)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A CA, and a function making client certificates it signs.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        Ca { issuer }
    }

    pub fn write(&self, dir: &Path, name: &str) -> std::path::PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, self.issuer.pem()).unwrap();
        p
    }

    /// Writes `<name>.pem` and `<name>.key` for a client certificate.
    pub fn client(&self, dir: &Path, name: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(vec![name.to_string()]).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (c, k) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        (c, k)
    }
}

/// `sha256:<hex>` of a PEM certificate file, as an operator would compute it
/// (`openssl x509 -noout -fingerprint -sha256`).
pub fn fingerprint(pem: &Path) -> String {
    let der = prefix_client::load_certs(pem).unwrap().remove(0);
    let digest = ring::digest::digest(&ring::digest::SHA256, der.as_ref());
    let hex: Vec<String> = digest.as_ref().iter().map(|b| format!("{b:02X}")).collect();
    format!("sha256:{}", hex.join(":"))
}
