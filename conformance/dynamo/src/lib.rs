//! What the conformance scenarios (`tests/standalone_indexer.rs`), the
//! lookup benchmark (`benches/routers.rs`) and the end-to-end memory run
//! (`benches/dynamo/benches/end_to_end.rs` of the repository) share:
//! prefix-server and Dynamo's standalone service started as processes,
//! a fake vLLM publisher that sends Dynamo's own `RawKvEvent`s or ready
//! msgpack batches, and Dynamo's block hash rule.

use std::io::BufRead;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use dynamo_kv_router::protocols::{compute_block_hash_for_seq, BlockHashOptions};
use dynamo_kv_router::services::indexer::server::{create_router, AppState};
use dynamo_kv_router::zmq_wire::{BlockHashValue, RawKvEvent};
use engine_sim::sockets;
use http_body_util::{BodyExt, Full};
use hyper::header::{self, HeaderValue};
use hyper_util::rt::TokioIo;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The line of prefix-server's log that names its HTTP address.
const SERVING: &str = "serving the HTTP/JSON API http=";
/// The line of prefix-server's log that names its QUIC address.
const SERVING_QUIC: &str = "serving listen=";

/// prefix-server, started as a process with Dynamo's routes in plain HTTP
/// (and, from [`Ours::start`], Dynamo's block aliases); killed when
/// dropped.
pub struct Ours {
    /// `http://127.0.0.1:<port>`.
    pub base: String,
    /// Its QUIC address.
    pub quic: std::net::SocketAddr,
    child: tokio::process::Child,
    dir: TempDir,
}

/// A directory removed when dropped.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Ours {
    /// Starts `PREFIX_SERVER` (a path from the repository's root, or an
    /// absolute one; default: the workspace's release build) with blocks
    /// of `token_block` tokens and Dynamo's block aliases.
    pub async fn start(token_block: u32) -> Ours {
        Ours::start_with(token_block, &["--block-aliases", "dynamo"]).await
    }

    /// Starts `PREFIX_SERVER` with blocks of `token_block` tokens and the
    /// settings `extra` besides.
    pub async fn start_with(token_block: u32, extra: &[&str]) -> Ours {
        // Cargo runs a test or bench in its package's directory, so a
        // relative path is taken from the repository's root, where the
        // docs' commands run.
        let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
        let bin = root.join(
            std::env::var_os("PREFIX_SERVER")
                .unwrap_or_else(|| "target/release/prefix-server".into()),
        );
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir =
            std::env::temp_dir().join(format!("prefix-conformance-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut child = tokio::process::Command::new(&bin)
            .args(["--listen", "127.0.0.1:0", "--metrics-listen", "off"])
            .args(["--http-listen", "127.0.0.1:0", "--http-plaintext"])
            .args(extra)
            .arg("--token-block")
            .arg(token_block.to_string())
            .args(["--snapshot-interval", "0s", "--data-dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        // Its log, on stderr, names the addresses it bound.
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let (mut addr, mut quic) = (None, None);
        while addr.is_none() || quic.is_none() {
            let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
                .await
                .expect("the server never said where it listens")
                .unwrap()
                .expect("the server stopped");
            let after = |marker: &str| {
                let at = line.find(marker)?;
                let rest = &line[at + marker.len()..];
                Some(rest.split_whitespace().next()?.to_string())
            };
            addr = addr.or_else(|| after(SERVING));
            quic = quic.or_else(|| after(SERVING_QUIC));
        }
        let (addr, quic) = (addr.unwrap(), quic.unwrap().parse().unwrap());
        // Keep draining its log.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let base = format!("http://{addr}");
        wait_for_health(&base).await;
        Ours {
            base,
            quic,
            child,
            dir: TempDir(dir),
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("the server runs")
    }

    /// The certificate its QUIC clients trust: the one it made in its data
    /// directory.
    pub fn cert(&self) -> std::path::PathBuf {
        self.dir.0.join("cert.pem")
    }
}

/// The environment variable that makes a process started by
/// [`Dynamo::start`] serve Dynamo's service (see [`serve_dynamo_if_asked`]).
const DYNAMO_SERVE: &str = "DYNAMO_SERVE";

/// NVIDIA Dynamo's standalone indexer service (`create_router` of
/// `dynamo-kv-router` 1.6.1, as its `run_server` serves it) as a child
/// process: the running executable started again with [`DYNAMO_SERVE`]
/// set, which must call [`serve_dynamo_if_asked`] first thing. Killed when
/// dropped.
pub struct Dynamo {
    child: std::process::Child,
    /// `http://127.0.0.1:<port>`.
    pub base: String,
}

impl Dynamo {
    /// Starts the service with `threads` indexer threads (its concurrent
    /// tree, which reads inline; 1 thread puts each read through a single
    /// actor) on a 2-thread Tokio runtime, prefix-server's default on a
    /// 2-core machine.
    pub fn start(threads: usize) -> Dynamo {
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .env(DYNAMO_SERVE, threads.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        Dynamo {
            base: format!("http://{}", line.trim()),
            child,
        }
    }

    /// The service's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Dynamo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In a process [`Dynamo::start`] started, serves Dynamo's service on a
/// free loopback port, which it prints, and never returns; elsewhere
/// returns at once.
pub fn serve_dynamo_if_asked() {
    let Some(threads) = std::env::var_os(DYNAMO_SERVE) else {
        return;
    };
    let threads: usize = threads.to_str().and_then(|t| t.parse().ok()).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let state = Arc::new(AppState::new(threads).unwrap());
        state.registry.signal_ready();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        println!("{}", listener.local_addr().unwrap());
        axum::serve(listener, create_router(state)).await.unwrap();
    });
    std::process::exit(0);
}

/// Waits until `base/health` answers 200 (at most 10 s).
pub async fn wait_for_health(base: &str) {
    let client = reqwest::Client::new();
    for _ in 0..500 {
        if let Ok(r) = client.get(format!("{base}/health")).send().await {
            if r.status().is_success() {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("{base}/health never answered");
}

/// A ZMQ publisher both services subscribe to: the workspace's fake
/// engine (`engine_sim::sockets`) without a replay socket.
pub struct Publisher {
    socket: zmq::Socket,
    /// Its endpoint, `tcp://127.0.0.1:<port>`.
    pub endpoint: String,
    seq: u64,
}

impl Publisher {
    /// A publisher on a free loopback port.
    pub fn bind(ctx: &zmq::Context) -> Publisher {
        let live = sockets::Engine::bind(ctx, sockets::ANY_PORT, None)
            .unwrap()
            .live;
        Publisher {
            socket: live.socket,
            endpoint: live.endpoint,
            seq: 0,
        }
    }

    /// Waits for `n` subscriptions.
    pub fn subscribed(&self, n: usize) {
        for _ in 0..n {
            let came = sockets::subscribed(&self.socket, Duration::from_secs(20)).unwrap();
            assert!(came, "no subscriber");
        }
    }

    /// Publishes `event` as vLLM does, encoded as Dynamo's tests encode it.
    pub fn publish(&mut self, event: RawKvEvent) {
        let payload = rmp_serde::to_vec_named(&(0.0_f64, vec![event], Some(0_i32))).unwrap();
        self.publish_payload(&payload);
    }

    /// Publishes a vLLM msgpack batch as vLLM does: no topic, the next
    /// sequence number, the batch.
    pub fn publish_payload(&mut self, payload: &[u8]) {
        sockets::send_live(&self.socket, b"", self.seq, payload).unwrap();
        self.seq += 1;
    }
}

/// A vLLM store of consecutive blocks of `tokens`, `block_size` each.
pub fn stored(
    hashes: &[u64],
    parent: Option<u64>,
    tokens: &[u32],
    block_size: u32,
    medium: &str,
    salt: Option<&str>,
) -> RawKvEvent {
    RawKvEvent::BlockStored {
        block_hashes: hashes
            .iter()
            .map(|&h| BlockHashValue::Unsigned(h))
            .collect(),
        parent_block_hash: parent.map(BlockHashValue::Unsigned),
        token_ids: tokens.to_vec(),
        block_size: block_size as usize,
        medium: Some(medium.into()),
        lora_name: None,
        cache_namespace: salt.map(Into::into),
        block_mm_infos: None,
        is_eagle: None,
        group_idx: None,
        kv_cache_spec_kind: None,
        kv_cache_spec_sliding_window: None,
        locality: None,
        ownership: None,
        session_id: None,
    }
}

/// Dynamo's block hashes of `tokens` in blocks of `block_size`, as
/// `/query_by_hash` takes them.
pub fn local_hashes(tokens: &[u32], block_size: u32, salt: Option<&str>) -> Vec<i64> {
    let options = BlockHashOptions {
        cache_namespace: salt,
        ..Default::default()
    };
    compute_block_hash_for_seq(tokens, block_size, options)
        .into_iter()
        .map(|h| h.0 as i64)
        .collect()
}

/// Linux's clock ticks per second in `/proc/<pid>/stat` (USER_HZ).
const TICKS_PER_SECOND: u64 = 100;

/// The CPU time process `pid` has used, to a clock tick (10 ms).
pub fn cpu_time(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The fields after the command name, which is in parentheses.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    // utime and stime, fields 14 and 15 of the line.
    let ticks = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    Duration::from_millis(ticks * 1000 / TICKS_PER_SECOND)
}

/// A benchmark's client connection: one kept-alive HTTP/1.1 connection,
/// hyper's own, without a pool or a URL to parse per request. It is the
/// least a client does for a request, so that the client takes as little
/// as it can of the cores it shares with the service it measures.
pub struct Conn {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    host: HeaderValue,
}

impl Conn {
    /// A connection to `base` (`http://host:port`).
    pub async fn open(base: &str) -> Conn {
        let authority = base.strip_prefix("http://").expect("an http:// base");
        let stream = tokio::net::TcpStream::connect(authority).await.unwrap();
        // A request goes out at once, not held back by Nagle's algorithm.
        stream.set_nodelay(true).unwrap();
        let (send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .unwrap();
        // The connection's I/O runs as a task of its own until it closes.
        tokio::spawn(connection);
        Conn {
            send,
            host: HeaderValue::from_str(authority).unwrap(),
        }
    }

    /// POSTs the JSON `body` to `path`; panics unless the answer is a 200
    /// with a body, which is read whole and not further.
    pub async fn ask(&mut self, path: &str, body: Bytes) {
        let request = hyper::Request::post(path)
            .header(header::HOST, self.host.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(body))
            .unwrap();
        // Ready once the last answer's end has been read off the socket.
        self.send.ready().await.unwrap();
        let answer = self.send.send_request(request).await.unwrap();
        assert_eq!(answer.status(), 200, "{path}");
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert!(!body.is_empty(), "{path}");
    }
}

/// POSTs `body` as JSON; the status and the JSON answer (null if none).
pub async fn post(base: &str, path: &str, body: &Value) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .json(body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}
