//! The real `prefix-server` binary in a process of its own, on loopback
//! ports chosen before it starts (so a restart keeps its address).

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use prefix_client::Client;

/// A server process; killed when dropped.
pub struct Proc {
    pub child: Child,
    pub addr: SocketAddr,
    pub dir: PathBuf,
}

/// The `prefix-client` binary of the test's build profile, brought up to
/// date first (a test of one package alone would otherwise find a stale
/// one), once per test process.
pub fn client_bin() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let mut build = Command::new(env!("CARGO"));
            build.args([
                "build",
                "-q",
                "-p",
                "prefix-client",
                "--bin",
                "prefix-client",
            ]);
            // target/<profile>/deps/<the test> → target/<profile>/prefix-client
            let exe = std::env::current_exe().unwrap();
            let out = exe.parent().unwrap().parent().unwrap();
            // The profile's directory is named after it, but for `dev`'s.
            let profile = match out.file_name().and_then(|n| n.to_str()) {
                Some("debug") | None => "dev",
                Some(name) => name,
            };
            build.args(["--profile", profile]);
            let status = build
                .current_dir(env!("CARGO_MANIFEST_DIR"))
                .status()
                .unwrap();
            assert!(status.success(), "building prefix-client failed");
            out.join("prefix-client")
        })
        .clone()
}

/// A free UDP port for QUIC and a free TCP port for metrics on
/// `127.0.0.1`, for a process that must keep them over restarts.
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
    /// Starts `bin` (see [`crate::server_bin!`]) on `dir`, serving QUIC on
    /// `addr` and metrics on `http`, snapshotting every `snapshot_interval`.
    pub fn start(
        bin: &Path,
        dir: &Path,
        addr: SocketAddr,
        http: SocketAddr,
        snapshot_interval: &str,
    ) -> Proc {
        Proc::start_with(
            bin,
            dir,
            addr,
            http,
            &["--snapshot-interval", snapshot_interval],
        )
    }

    /// Starts `bin` with these extra flags; its log goes to
    /// `dir/server.log`.
    pub fn start_with(
        bin: &Path,
        dir: &Path,
        addr: SocketAddr,
        http: SocketAddr,
        flags: &[&str],
    ) -> Proc {
        Proc::launch(Command::new(bin), dir, addr, http, flags)
    }

    /// Starts `bin` as [`Proc::start_with`] does, under an open-file limit
    /// of `open_files` (soft and hard, as `ulimit -n` sets them).
    pub fn start_limited(
        bin: &Path,
        dir: &Path,
        addr: SocketAddr,
        http: SocketAddr,
        flags: &[&str],
        open_files: u64,
    ) -> Proc {
        let mut sh = Command::new("sh");
        let script = format!("ulimit -n {open_files} && exec \"$0\" \"$@\"");
        sh.arg("-c").arg(script).arg(bin);
        Proc::launch(sh, dir, addr, http, flags)
    }

    /// Runs `command` with the server's flags after its own arguments.
    fn launch(
        mut command: Command,
        dir: &Path,
        addr: SocketAddr,
        http: SocketAddr,
        flags: &[&str],
    ) -> Proc {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("server.log"))
            .unwrap();
        let child = command
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

    /// A client ([`super::trusting`] the certificate in `dir`), once the
    /// server answers (it may still be restoring). Panics with the log if
    /// the process exits, or if it has not answered after about 20 s (a
    /// safety net).
    pub async fn client(&mut self) -> Client {
        for _ in 0..500 {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("server exited: {status}; log:\n{}", self.log());
            }
            let ca = self.dir.join("cert.pem");
            if ca.exists() {
                if let Ok(c) = Client::connect(self.addr, super::trusting(&ca)).await {
                    if c.ping().await.is_ok() {
                        return c;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(40)).await;
        }
        panic!("server never answered; log:\n{}", self.log());
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    /// Sends `sig` (`-TERM`, `-KILL`, …) with `kill`.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }

    /// Waits for the process to exit; panics with the log after 30 s (a
    /// safety net).
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
