//! The HTTP/JSON API against a real server: the same answers as QUIC over
//! HTTP/1.1 and HTTP/2, bad input refused with 4xx and the protocol's code,
//! roles from client certificates, and `docs/openapi.json` held to the
//! routes the server really has.

use prefix_testkit::server as common;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use common::TestServer;
use prefix_client::key::{text_key, token_key};
use prefix_proto::json::{fields, reply_json};
use prefix_proto::{ErrorCode, Op, OpKind, Request, Response};
use prefix_server::http_status;
use prefix_server::{route, BATCH_PATH};
use prefix_testkit::tls::Roles;
use serde_json::{json, Value};

/// A server with the API on an ephemeral port.
async fn start(tweak: impl FnOnce(&mut prefix_server::ServerConfig)) -> (TestServer, SocketAddr) {
    let server = common::start(|cfg| {
        cfg.transport.http_listen = Some("127.0.0.1:0".parse().unwrap());
        tweak(cfg);
    })
    .await;
    let addr = server.api_addr.expect("the API is on");
    (server, addr)
}

/// An HTTP client trusting the test server, with a client certificate if
/// given; `http1` keeps it to HTTP/1.1, else it takes HTTP/2 by ALPN.
fn client(ca: &Path, identity: Option<&(PathBuf, PathBuf)>, http1: bool) -> reqwest::Client {
    let root = reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap();
    let mut b = reqwest::Client::builder()
        .tls_built_in_root_certs(false)
        .add_root_certificate(root)
        .use_rustls_tls();
    if let Some((cert, key)) = identity {
        let mut pem = std::fs::read(cert).unwrap();
        pem.extend(std::fs::read(key).unwrap());
        b = b.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    if http1 {
        b = b.http1_only();
    }
    b.build().unwrap()
}

/// A TLS connection to the API speaking HTTP/1.1, nothing sent yet.
async fn tls_http1(
    ca: &Path,
    addr: SocketAddr,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    tls_http1_over(ca, tokio::net::TcpStream::connect(addr).await.unwrap()).await
}

/// [`tls_http1`] over a TCP connection already made.
async fn tls_http1_over(
    ca: &Path,
    tcp: tokio::net::TcpStream,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    for c in prefix_client::load_certs(ca).unwrap() {
        roots.add(c).unwrap();
    }
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(name, tcp)
        .await
        .unwrap()
}

/// GETs `paths` one after the other on one TLS connection speaking
/// HTTP/1.1, and returns each whole answer (head and body).
async fn raw_http1(ca: &Path, addr: SocketAddr, paths: &[&str]) -> Vec<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tls = tls_http1(ca, addr).await;
    let mut answers = Vec::new();
    for path in paths {
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n");
        tls.write_all(req.as_bytes()).await.unwrap();
        // Read the head, then exactly Content-Length bytes of body.
        let mut buf = Vec::new();
        let head_end = loop {
            let mut chunk = [0u8; 4096];
            let n = tls.read(&mut chunk).await.unwrap();
            assert!(n > 0, "the server closed the connection after {answers:?}");
            buf.extend_from_slice(&chunk[..n]);
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        while buf.len() < head_end + len {
            let mut chunk = [0u8; 4096];
            let n = tls.read(&mut chunk).await.unwrap();
            assert!(n > 0);
            buf.extend_from_slice(&chunk[..n]);
        }
        answers.push(String::from_utf8(buf).unwrap());
    }
    answers
}

fn url(addr: SocketAddr, path: &str) -> String {
    format!("https://localhost:{}{path}", addr.port())
}

/// Sends `body` to `path` (GET when the route says so) and returns the
/// status, HTTP version and JSON answer.
async fn call(
    http: &reqwest::Client,
    addr: SocketAddr,
    path: &str,
    body: Option<Value>,
) -> (u16, reqwest::Version, Value) {
    let req = match body {
        Some(b) => http.post(url(addr, path)).body(b.to_string()),
        None => http.get(url(addr, path)),
    };
    let resp = req.send().await.unwrap();
    let (status, version) = (resp.status().as_u16(), resp.version());
    let text = resp.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}"));
    (status, version, v)
}

/// Posts `body` to `path` as it is (not as JSON).
async fn post_raw(
    http: &reqwest::Client,
    addr: SocketAddr,
    path: &str,
    body: impl Into<reqwest::Body>,
) -> reqwest::Response {
    http.post(url(addr, path)).body(body).send().await.unwrap()
}

/// The QUIC answer to `op`, as the API writes it.
async fn quic(client: &prefix_client::Client, op: Op) -> Value {
    match client.call(Request::One(op)).await.unwrap() {
        Response::One(r) => reply_json(&r),
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_answers_as_quic_does_over_http1_and_http2() {
    let (server, addr) = start(|_| {}).await;
    for http1 in [true, false] {
        let http = client(&server.ca, None, http1);
        let want = if http1 {
            reqwest::Version::HTTP_11
        } else {
            reqwest::Version::HTTP_2
        };
        let pod = if http1 { "h1" } else { "h2" };
        let insert = async |body: Value| call(&http, addr, "/v1/insert", Some(body)).await;
        let lookup = async |body: Value| call(&http, addr, "/v1/lookup", Some(body)).await.2;
        let tokens: Vec<u32> = (0..40).collect();
        let (s, v, a) = insert(json!({"model": "m", "tokens": tokens, "pod": pod})).await;
        assert_eq!((s, v, a), (200, want, json!({"ok": true})));
        let text = "t".repeat(64 * 3);
        let (s, _, a) = insert(json!({"model": "m", "text": text, "pod": pod})).await;
        assert_eq!((s, a), (200, json!({"ok": true})));
        // Token ids and text are hashed by the server's rule: the same as
        // the hashes a gateway would send.
        let by_tokens = lookup(json!({"model": "m", "tokens": tokens})).await;
        let by_hashes = lookup(json!({"model": "m", "hashes": token_key(&tokens, 16)})).await;
        assert_eq!(by_tokens, by_hashes);
        assert_eq!(by_tokens["key_blocks"], 2);
        let by_text =
            lookup(json!({"model": "m", "text": text, "candidates": [pod, "nobody"]})).await;
        assert_eq!(
            by_text,
            json!({"ok": true, "key_blocks": 3, "matches": [{"pod": pod, "blocks": 3}]})
        );
    }
    // HTTP/1.1 keep-alive: two requests, two answers, one connection (a
    // client's pool cannot show it: it may open a second connection when it
    // sends before the last answer's is back in the pool).
    let answers = raw_http1(&server.ca, addr, &["/v1/ping", "/v1/stats"]).await;
    assert_eq!(answers.len(), 2);
    assert!(
        answers.iter().all(|a| a.starts_with("HTTP/1.1 200")),
        "{answers:?}"
    );

    // The same ops over QUIC give the same objects.
    let http = client(&server.ca, None, false);
    let quic_client = server.client().await;
    let key = text_key(&"t".repeat(64 * 3), 64);
    let pairs: Vec<(&str, Option<Value>, Op)> = vec![
        (
            "/v1/lookup",
            Some(json!({"model": "m", "hashes": key})),
            Op::Lookup {
                model: "m".into(),
                key: key.clone(),
                candidates: None,
            },
        ),
        ("/v1/stats", None, Op::Stats),
        ("/v1/ping", None, Op::Ping),
        (
            "/v1/pod-capacity",
            Some(json!({"pod": "h1", "blocks": 5})),
            Op::SetPodCapacity {
                pod: "h1".into(),
                blocks: 5,
            },
        ),
        ("/v1/engines", None, Op::ListEngines),
    ];
    for (path, body, op) in pairs {
        let (s, _, a) = call(&http, addr, path, body).await;
        assert_eq!(s, 200, "{path}: {a}");
        let mut q = quic(&quic_client, op).await;
        if path == "/v1/stats" {
            // The QUIC client's own connection changes nothing counted here.
            q["bytes"] = a["bytes"].clone();
        }
        assert_eq!(a, q, "{path}");
    }
    let (s, _, a) = call(&http, addr, "/v1/remove-pod", Some(json!({"pod": "h2"}))).await;
    assert_eq!((s, a), (200, json!({"ok": true, "removed": true})));
    assert_eq!(
        quic(&quic_client, Op::RemovePod { pod: "h2".into() }).await,
        json!({"ok": true, "removed": false})
    );
    // A batch answers each op in place, errors included, with 200.
    let (s, _, a) = call(
        &http,
        addr,
        BATCH_PATH,
        Some(json!({"ops": [
            {"op": "lookup", "model": "m", "hashes": key},
            {"op": "insert", "model": "m", "hashes": [1], "pod": ""},
            {"op": "ping"},
        ]})),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        a["results"][0]["matches"][0],
        json!({"pod": "h1", "blocks": 3})
    );
    assert_eq!(a["results"][1]["error"]["name"], "bad_name");
    assert_eq!(a["results"][2], json!({"ok": true}));
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_its_code_and_changes_nothing() {
    let (server, addr) = start(|cfg| {
        cfg.limits.http_max_body_bytes = 4096;
        cfg.limits.max_batch = 2;
        cfg.limits.max_candidates = 2;
        cfg.index.max_key_blocks = 8;
    })
    .await;
    let http = client(&server.ca, None, true);
    let raw = |body: &'static str| {
        let http = http.clone();
        async move {
            let r = post_raw(&http, addr, "/v1/insert", body).await;
            let s = r.status().as_u16();
            (
                s,
                serde_json::from_str::<Value>(&r.text().await.unwrap()).unwrap(),
            )
        }
    };
    let cases: Vec<(u16, &str, (u16, Value))> = vec![
        (400, "malformed", raw("{\"model\":").await),
        (400, "malformed", raw("[]").await),
        (
            400,
            "malformed",
            raw(r#"{"model":"m","hashes":"1","pod":"p"}"#).await,
        ),
        (
            400,
            "malformed",
            raw(r#"{"model":"m","hashes":[1],"pod":"p","ttl":3}"#).await,
        ),
        (
            400,
            "malformed",
            raw(r#"{"model":"m","hashes":[1],"text":"x","pod":"p"}"#).await,
        ),
        (
            400,
            "malformed",
            raw(r#"{"op":"insert","model":"m","hashes":[1],"pod":"p"}"#).await,
        ),
        (
            400,
            "bad_name",
            raw(r#"{"model":"m","hashes":[1],"pod":""}"#).await,
        ),
        (
            422,
            "key_too_long",
            raw(r#"{"model":"m","hashes":[1,2,3,4,5,6,7,8,9],"pod":"p"}"#).await,
        ),
    ];
    for (status, name, (s, v)) in cases {
        assert_eq!(
            (s, v["error"]["name"].as_str()),
            (status, Some(name)),
            "{v}"
        );
        assert_eq!(v["ok"], false);
        let code = v["error"]["code"].as_u64().unwrap() as u16;
        assert_eq!(ErrorCode::from_u16(code).unwrap().name(), name);
    }
    let big = format!(r#"{{"model":"m","text":"{}","pod":"p"}}"#, "x".repeat(5000));
    let r = post_raw(&http, addr, "/v1/insert", big).await;
    assert_eq!(r.status().as_u16(), 413);
    let v: Value = serde_json::from_str(&r.text().await.unwrap()).unwrap();
    assert_eq!(v["error"]["name"], "frame_too_large");
    let (s, _, v) = call(
        &http,
        addr,
        "/v1/lookup",
        Some(json!({"model": "m", "hashes": [1], "candidates": ["a", "b", "c"]})),
    )
    .await;
    assert_eq!(
        (s, &v["error"]["name"]),
        (422, &json!("too_many_candidates"))
    );
    let (s, _, v) = call(
        &http,
        addr,
        BATCH_PATH,
        Some(json!({"ops": [{"op": "ping"}, {"op": "ping"}, {"op": "ping"}]})),
    )
    .await;
    assert_eq!((s, &v["error"]["name"]), (422, &json!("batch_too_large")));
    let (s, _, v) = call(
        &http,
        addr,
        BATCH_PATH,
        Some(json!({"ops": [{"op": "insert", "model": "m", "hashes": [1], "pod": "p"}, {"op": "nope"}]})),
    )
    .await;
    // One op that does not parse refuses the batch before any op runs.
    assert_eq!((s, &v["error"]["name"]), (400, &json!("malformed")));
    assert_eq!(server.index.stats().entries, 0);
    assert_eq!(server.index.stats().pods, 0);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_have_the_same_roles_as_over_quic() {
    let dir = tempfile::tempdir().unwrap();
    let roles = Roles::new(dir.path());
    let (server, addr) = start(|cfg| roles.configure(cfg)).await;
    let insert = json!({"model": "m", "hashes": [1, 2], "pod": "p"});
    let writer = client(&server.ca, Some(&roles.writer), false);
    let (s, _, _) = call(&writer, addr, "/v1/insert", Some(insert.clone())).await;
    assert_eq!(s, 200);
    let reader = client(&server.ca, Some(&roles.reader), true);
    let (s, _, v) = call(&reader, addr, "/v1/insert", Some(insert.clone())).await;
    assert_eq!((s, &v["error"]["name"]), (403, &json!("forbidden")));
    let (s, _, v) = call(
        &reader,
        addr,
        "/v1/lookup",
        Some(json!({"model": "m", "hashes": [1, 2]})),
    )
    .await;
    assert_eq!((s, &v["matches"][0]["blocks"]), (200, &json!(2)));
    let stranger = client(&server.ca, Some(&roles.unlisted), false);
    let (s, _, v) = call(&stranger, addr, "/v1/ping", None).await;
    assert_eq!((s, &v["error"]["name"]), (403, &json!("forbidden")));
    // Without a certificate there is no connection at all.
    let anonymous = client(&server.ca, None, false);
    assert!(anonymous.get(url(addr, "/v1/ping")).send().await.is_err());
    assert_eq!(server.index.stats().entries, 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_and_idle_connections_are_closed() {
    use tokio::io::AsyncReadExt;
    let (server, addr) = start(|cfg| {
        cfg.transport.idle_timeout = std::time::Duration::from_secs(1);
        cfg.transport.read_timeout = std::time::Duration::from_secs(1);
    })
    .await;
    // No TLS handshake at all: dropped after the read timeout.
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(std::time::Duration::from_secs(20), silent.read(&mut buf)).await;
    assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{n:?}");
    // A TLS connection that sends no request: closed once idle.
    let mut quiet = tls_http1(&server.ca, addr).await;
    let n = tokio::time::timeout(std::time::Duration::from_secs(20), quiet.read(&mut buf)).await;
    assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "{n:?}");
    assert_eq!(server.metrics.connections.get(), 0);
    server.shutdown().await;
}

/// Everything the server sends on `conn` until it closes it, and how long
/// that took; panics if it is still open after `limit`.
async fn until_closed(
    conn: &mut (impl tokio::io::AsyncRead + Unpin),
    limit: std::time::Duration,
) -> (String, std::time::Duration) {
    use tokio::io::AsyncReadExt;
    let began = std::time::Instant::now();
    let mut got = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut chunk = [0u8; 4096];
        // A reset or a TLS close without notify ends it as EOF does.
        while let Ok(n @ 1..) = conn.read(&mut chunk).await {
            got.extend_from_slice(&chunk[..n]);
        }
    })
    .await;
    let text = String::from_utf8_lossy(&got).into_owned();
    assert!(
        read.is_ok(),
        "still open after {limit:?}, having sent {text:?}"
    );
    (text, began.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_requests_are_closed_while_a_gateway_is_served() {
    use tokio::io::AsyncWriteExt;
    // Each kind of stall: a body cut short, headers cut short, and a TCP
    // connection that never starts TLS. `STALLED_CONNECTIONS` sets how many
    // of each (the figures in docs/http.md come from 1,000).
    let each = common::count_from_env("STALLED_CONNECTIONS", 50);
    // Long enough for every connection to be open before the first is due.
    let read_timeout = std::time::Duration::from_millis(1000 + 5 * each as u64);
    let idle_timeout = 2 * read_timeout;
    let (server, addr) = start(|cfg| {
        cfg.transport.read_timeout = read_timeout;
        cfg.transport.idle_timeout = idle_timeout;
    })
    .await;
    let before = common::resident_bytes();
    let mut bodies = Vec::new();
    let mut heads = Vec::new();
    let mut silent = Vec::new();
    for _ in 0..each {
        let mut c = tls_http1(&server.ca, addr).await;
        let head = "POST /v1/lookup HTTP/1.1\r\nHost: localhost\r\nContent-Length: 500\r\n\r\n{";
        c.write_all(head.as_bytes()).await.unwrap();
        c.flush().await.unwrap();
        bodies.push((std::time::Instant::now(), c));
        let mut c = tls_http1(&server.ca, addr).await;
        c.write_all(b"POST /v1/lookup HTTP/1.1\r\nHost: local")
            .await
            .unwrap();
        c.flush().await.unwrap();
        heads.push((std::time::Instant::now(), c));
        let c = tokio::net::TcpStream::connect(addr).await.unwrap();
        silent.push((std::time::Instant::now(), c));
    }
    let held = server.metrics.connections.get();
    let per_connection = common::resident_bytes().saturating_sub(before) / (2 * each as u64);
    println!(
        "{held} stalled TLS connections held; this process grew {per_connection} bytes per TLS connection (client and server sides)"
    );
    // A gateway keeps working meanwhile.
    let http = client(&server.ca, None, true);
    let (s, _, _) = call(
        &http,
        addr,
        "/v1/insert",
        Some(json!({"model": "m", "hashes": [1, 2], "pod": "p"})),
    )
    .await;
    assert_eq!(s, 200);
    // Each is closed: a body after the read timeout, headers after the
    // idle timeout, a handshake after the read timeout. The bound only
    // keeps a server that never closes them from hanging the test.
    let limit = 20 * idle_timeout;
    let mut closing = tokio::task::JoinSet::new();
    for (opened, mut c) in bodies {
        closing.spawn(async move {
            let (answer, _) = until_closed(&mut c, limit).await;
            assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
            assert!(
                answer.to_lowercase().contains("connection: close"),
                "{answer}"
            );
            assert!(answer.contains("read-timeout"), "{answer}");
            (0, opened.elapsed())
        });
    }
    for (opened, mut c) in heads {
        closing.spawn(async move {
            until_closed(&mut c, limit).await;
            (1, opened.elapsed())
        });
    }
    for (opened, mut c) in silent {
        closing.spawn(async move {
            until_closed(&mut c, limit).await;
            (2, opened.elapsed())
        });
    }
    // The gateway looks up all along, each answer right.
    let stop = tokio_util::sync::CancellationToken::new();
    let gateway = tokio::spawn({
        let (stop, http) = (stop.clone(), http.clone());
        async move {
            let mut served = 0;
            while !stop.is_cancelled() {
                let body = json!({"model": "m", "hashes": [1, 2]});
                let (s, _, a) = call(&http, addr, "/v1/lookup", Some(body)).await;
                assert_eq!((s, &a["matches"][0]["blocks"]), (200, &json!(2)), "{a}");
                served += 1;
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
            served
        }
    });
    let mut lived = [std::time::Duration::ZERO; 3];
    while let Some(closed) = closing.join_next().await {
        let (kind, after) = closed.unwrap();
        lived[kind] = lived[kind].max(after);
    }
    stop.cancel();
    assert!(gateway.await.unwrap() > 0);
    println!(
        "every stalled connection closed; longest lived (body, headers, handshake): {lived:?} against read-timeout {read_timeout:?}, idle-timeout {idle_timeout:?}"
    );
    assert_eq!(server.index.stats().entries, 2);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_its_answer_unread_is_closed_while_a_gateway_is_served() {
    use tokio::io::AsyncWriteExt;
    let write_timeout = std::time::Duration::from_secs(1);
    let (server, addr) = start(|cfg| cfg.transport.write_timeout = write_timeout).await;
    let http = client(&server.ca, None, true);
    // 1,000 pods with long names hold one key: a batch of 200 lookups of it
    // answers about 12 MB, far past what the sockets' buffers take unread.
    let inserts: Vec<Value> = (0..1000)
        .map(|p| json!({"op": "insert", "model": "m", "hashes": [1], "pod": format!("pod-{p:0>40}")}))
        .collect();
    let (s, _, _) = call(&http, addr, BATCH_PATH, Some(json!({ "ops": inserts }))).await;
    assert_eq!(s, 200);
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut reader = tls_http1_over(&server.ca, socket.connect(addr).await.unwrap()).await;
    let lookups = vec![json!({"op": "lookup", "model": "m", "hashes": [1]}); 200];
    let body = json!({ "ops": lookups }).to_string();
    let head = format!(
        "POST {BATCH_PATH} HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    reader.write_all(head.as_bytes()).await.unwrap();
    reader.write_all(body.as_bytes()).await.unwrap();
    reader.flush().await.unwrap();
    // Nothing is read for a while: the server's write stays blocked, and
    // a gateway is served meanwhile.
    tokio::time::sleep(write_timeout * 3).await;
    let (s, _, a) = call(
        &http,
        addr,
        "/v1/lookup",
        Some(json!({"model": "m", "hashes": [1]})),
    )
    .await;
    assert_eq!(
        (s, a["matches"].as_array().map(Vec::len)),
        (200, Some(1000))
    );
    // The connection ends short of the whole answer.
    let (got, _) = until_closed(&mut reader, 20 * write_timeout).await;
    assert!(
        got.starts_with("HTTP/1.1 200"),
        "{}",
        &got[..got.len().min(200)]
    );
    let head_end = got.find("\r\n\r\n").unwrap() + 4;
    let declared: usize = got[..head_end]
        .to_lowercase()
        .lines()
        .find_map(|l| {
            l.strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap();
    assert!(
        got.len() - head_end < declared,
        "the whole answer of {declared} bytes arrived"
    );
    server.shutdown().await;
}

/// Sends `request` on a fresh HTTP/1.1 connection and returns what the
/// server sent until it closed the connection.
async fn one_shot(server: &TestServer, addr: SocketAddr, request: &str) -> String {
    use tokio::io::AsyncWriteExt;
    let mut c = tls_http1(&server.ca, addr).await;
    c.write_all(request.as_bytes()).await.unwrap();
    c.flush().await.unwrap();
    until_closed(&mut c, std::time::Duration::from_secs(30))
        .await
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_length_over_the_limit_is_refused_before_the_body() {
    let (server, addr) = start(|cfg| cfg.limits.http_max_body_bytes = 4096).await;
    for expect in ["", "Expect: 100-continue\r\n"] {
        let request = format!(
            "POST /v1/insert HTTP/1.1\r\nHost: localhost\r\nContent-Length: 10000000000\r\n{expect}\r\n"
        );
        // No body follows: the answer must not wait for one.
        let answer = one_shot(&server, addr, &request).await;
        assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
        assert!(!answer.contains("100 Continue"), "{answer}");
        assert!(
            answer.to_lowercase().contains("connection: close"),
            "{answer}"
        );
        assert!(answer.contains("frame_too_large"), "{answer}");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_that_leaves_a_body_unread_says_the_connection_closes() {
    let (server, addr) = start(|_| {}).await;
    // A 404, a 405 and a GET, each with a body the server does not read.
    for (request, status) in [
        ("POST /v1/nothing-here", "404"),
        ("PUT /v1/lookup", "405"),
        ("GET /v1/ping", "200"),
    ] {
        let raw =
            format!("{request} HTTP/1.1\r\nHost: localhost\r\nContent-Length: 9\r\n\r\nnot json!");
        let answer = one_shot(&server, addr, &raw).await;
        assert!(
            answer.starts_with(&format!("HTTP/1.1 {status}")),
            "{answer}"
        );
        assert!(
            answer.to_lowercase().contains("connection: close"),
            "{answer}"
        );
    }
    // A client reusing connections follows that: every next request works.
    let http = client(&server.ca, None, true);
    for _ in 0..10 {
        let r = post_raw(&http, addr, "/v1/nothing-here", "{}").await;
        assert_eq!(r.status(), 404);
        let (s, _, a) = call(&http, addr, "/v1/ping", None).await;
        assert_eq!((s, a), (200, json!({"ok": true})));
    }
    // A body that was read keeps the connection open.
    let r = post_raw(&http, addr, "/v1/lookup", "{\"model\": 5}").await;
    assert_eq!(r.status(), 400);
    assert!(r.headers().get("connection").is_none());
    server.shutdown().await;
}

/// `docs/openapi.json`, parsed.
fn openapi() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Every (method, path) the server routes, from its table.
fn routes() -> BTreeSet<(String, String)> {
    let mut all: BTreeSet<(String, String)> = OpKind::ALL
        .iter()
        .map(|k| {
            let (m, p) = route(*k);
            (m.as_str().to_lowercase(), p.to_string())
        })
        .collect();
    all.insert(("post".into(), BATCH_PATH.into()));
    all
}

#[test]
fn the_openapi_description_names_the_routes_fields_and_codes() {
    let doc = openapi();
    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), p.clone()))
        })
        .collect();
    let mut served = routes();
    served.extend(prefix_server::PROBE_PATHS.map(|p| ("get".to_string(), p.to_string())));
    assert_eq!(documented, served);
    let schemas = &doc["components"]["schemas"];
    for kind in OpKind::ALL {
        let (m, p) = route(kind);
        let op = &doc["paths"][p][m.as_str().to_lowercase()];
        // Each route's request schema has exactly the op's fields.
        let props: BTreeSet<String> =
            match op["requestBody"]["content"]["application/json"]["schema"]["$ref"].as_str() {
                Some(r) => {
                    let name = r.rsplit('/').next().unwrap();
                    assert_eq!(schemas[name]["additionalProperties"], false, "{name}");
                    schemas[name]["properties"]
                        .as_object()
                        .unwrap()
                        .keys()
                        .cloned()
                        .collect()
                }
                None => BTreeSet::new(),
            };
        let want: BTreeSet<String> = fields(kind).iter().map(|f| f.to_string()).collect();
        assert_eq!(props, want, "{kind:?}");
        // Every status an error of this route can get is described.
        for status in op["responses"].as_object().unwrap().keys() {
            let name = format!("E{status}");
            assert!(
                status == "200" || doc["components"]["responses"].get(&name).is_some(),
                "{p}: {status}"
            );
        }
    }
    // The batch's op names and the error names are the protocol's.
    let ops: Vec<&str> = schemas["Op"]["properties"]["op"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let names: Vec<&str> = OpKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(ops, names);
    let codes: Vec<Value> = schemas["Error"]["properties"]["error"]["properties"]["name"]["enum"]
        .as_array()
        .unwrap()
        .clone();
    let mut want: Vec<Value> = ErrorCode::ALL.iter().map(|c| json!(c.name())).collect();
    want.push(Value::Null);
    assert_eq!(codes, want);
    for c in ErrorCode::ALL {
        let name = format!("E{}", http_status(c));
        if !matches!(
            c,
            ErrorCode::BadVersion | ErrorCode::UnknownKind | ErrorCode::Internal
        ) {
            assert!(
                doc["components"]["responses"].get(&name).is_some(),
                "{c:?} answers {name}, not described"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_documented_route_answers_and_others_do_not() {
    let (server, addr) = start(|_| {}).await;
    let http = client(&server.ca, None, false);
    let bodies = |kind: OpKind| match kind {
        OpKind::Lookup | OpKind::LookupDetail | OpKind::LookupTiers => {
            Some(json!({"model": "m", "hashes": [1]}))
        }
        OpKind::Insert => Some(json!({"model": "m", "hashes": [1], "pod": "p"})),
        OpKind::RemovePod | OpKind::Unsubscribe => Some(json!({"pod": "p"})),
        OpKind::SetPodCapacity => Some(json!({"pod": "p", "blocks": 1})),
        OpKind::Subscribe => {
            Some(json!({"pod": "e", "model": "m", "endpoint": "tcp://127.0.0.1:1"}))
        }
        OpKind::Stats | OpKind::Ping | OpKind::ListEngines => None,
        OpKind::SampleKeys => Some(json!({"count": 2})),
        OpKind::Tail => Some(json!({"max": 2})),
        OpKind::Digest => Some(json!({"level": "models", "low": 0, "high": 1})),
        // After the insert's route (routes go in path order): pod "p" is known.
        OpKind::Receipt => Some(json!({
            "model": "m", "hashes": [1], "pod": "p", "predicted_blocks": 1, "cached_tokens": 16,
        })),
    };
    let doc = openapi();
    for (method, path) in routes() {
        let op = &doc["paths"][&path][&method];
        let id = op["operationId"].as_str().unwrap();
        let body = match id {
            "batch" => Some(json!({"ops": [{"op": "ping"}]})),
            name => bodies(prefix_proto::json::kind_named(name).unwrap()),
        };
        assert_eq!(body.is_none(), method == "get", "{path}");
        let (s, _, v) = call(&http, addr, &path, body).await;
        assert_eq!((s, &v["ok"]), (200, &json!(true)), "{method} {path}: {v}");
        // The other method is refused, with an error object.
        let wrong = if method == "get" {
            http.post(url(addr, &path)).body("{}")
        } else {
            http.get(url(addr, &path))
        };
        let r = wrong.send().await.unwrap();
        assert_eq!(r.status().as_u16(), 405, "{path}");
    }
    let (s, _, v) = call(&http, addr, "/v1/drop-table", Some(json!({}))).await;
    assert_eq!((s, &v["ok"]), (404, &json!(false)));
    // The probes answer here as on the metrics listener.
    for (path, body) in [("/healthz", "ok\n"), ("/readyz", "ready\n")] {
        let r = http.get(url(addr, path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.text().await.unwrap(), body, "{path}");
    }
    server.shutdown().await;
}
