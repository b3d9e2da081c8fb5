//! An answer that leaves a request's body unread still reaches the client:
//! over HTTP/1.1 the server closes its sending side and reads the rest of
//! the upload before the socket closes (a client that sends its whole body
//! before reading, as Python's `http.client` does, reads the 404 or 413),
//! and over HTTP/2 the 413 arrives with its JSON and the upload is taken
//! to its end rather than reset (curl, for one, drops an answer whose
//! stream is reset while it sends).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;

use prefix_testkit::server::{self as common, TestServer};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The body limit of these tests' server.
const MAX_BODY: usize = 4 << 20;

/// A server with the API as plain HTTP on an ephemeral port.
async fn start() -> (TestServer, SocketAddr) {
    let server = common::start(|cfg| {
        cfg.transport.http_listen = Some("127.0.0.1:0".parse().unwrap());
        cfg.transport.http_plaintext = true;
        cfg.limits.http_max_body_bytes = MAX_BODY;
    })
    .await;
    let addr = server.api_addr.expect("the API is on");
    (server, addr)
}

/// Sends a whole HTTP/1.1 request with a body of `len` bytes, then reads
/// the answer to its end: its status and JSON body.
async fn send_then_read(addr: SocketAddr, path: &str, len: usize) -> std::io::Result<(u16, Value)> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await?;
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: test\r\ncontent-type: application/json\r\ncontent-length: {len}\r\n\r\n"
    );
    tcp.write_all(head.as_bytes()).await?;
    // Well past what the sockets' buffers hold: a server that closes at
    // once leaves this write failing.
    tcp.write_all(&vec![b' '; len]).await?;
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    Ok((status, serde_json::from_str(body).expect("a JSON body")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http1_client_that_sends_its_whole_body_first_reads_the_404_or_413() {
    let (_server, addr) = start().await;
    for (path, len, status, name) in [
        ("/v1/nope", MAX_BODY, 404, None),
        ("/v1/lookup", MAX_BODY + 1, 413, Some("frame_too_large")),
    ] {
        let answer = tokio::time::timeout(Duration::from_secs(60), send_then_read(addr, path, len))
            .await
            .expect("answered within a minute");
        let (got, body) = answer.unwrap_or_else(|e| panic!("POST {path} of {len} bytes: {e}"));
        assert_eq!(got, status, "POST {path}: {body}");
        assert_eq!(body["ok"], false, "{body}");
        if let Some(name) = name {
            assert_eq!(body["error"]["name"], name, "{body}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_upload_past_the_limit_gets_the_413_with_its_json_and_is_taken_to_its_end() {
    let (_server, addr) = start().await;
    let client = reqwest::Client::builder()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    // Refused by its declared length before any of it is read, and
    // streamed with no length: refused when it grows past the limit.
    for (declared, len) in [(true, MAX_BODY + 1), (false, 2 * MAX_BODY)] {
        let (body, left) = Spaces::body(len, declared);
        let response = client
            .post(format!("http://{addr}/v1/lookup"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("declared {declared}: an answer: {e:?}"));
        assert_eq!(response.version(), reqwest::Version::HTTP_2);
        assert_eq!(response.status(), 413);
        let body: Value = response.json().await.expect("the 413's JSON");
        assert_eq!(body["error"]["name"], "frame_too_large", "{body}");
        // A reset stream would leave the rest unsent for good.
        let sent = async {
            while left.load(Ordering::Relaxed) > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(60), sent)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "declared {declared}: the upload stopped with {} bytes unsent",
                    left.load(Ordering::Relaxed)
                )
            });
    }
}

/// A body of spaces, sent in chunks of 64 KiB, counting what is left.
struct Spaces {
    left: Arc<AtomicUsize>,
    declared: bool,
}

impl Spaces {
    /// `len` bytes, declared as the body's length or not (then the server
    /// finds out the size as it reads), and the count of bytes not yet
    /// taken by the client to send.
    fn body(len: usize, declared: bool) -> (reqwest::Body, Arc<AtomicUsize>) {
        let left = Arc::new(AtomicUsize::new(len));
        let body = Spaces {
            left: left.clone(),
            declared,
        };
        (reqwest::Body::wrap(body), left)
    }
}

impl http_body::Body for Spaces {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        // Relaxed: the test only waits for the count to reach 0.
        let n = self.left.load(Ordering::Relaxed).min(65_536);
        self.left.fetch_sub(n, Ordering::Relaxed);
        let chunk = Bytes::from(vec![b' '; n]);
        Poll::Ready((n > 0).then(|| Ok(http_body::Frame::data(chunk))))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        match self.declared {
            true => http_body::SizeHint::with_exact(self.left.load(Ordering::Relaxed) as u64),
            false => http_body::SizeHint::default(),
        }
    }
}
