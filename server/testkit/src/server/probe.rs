//! What tests wait on and read: a condition polled until it holds, and the
//! metrics listener's plain HTTP.

use std::net::SocketAddr;
use std::time::Duration;

/// Polls `f` every 20 ms until it is true; panics after 20 s. The bound is
/// a safety net, not a measurement: whatever a test waits for here happens
/// in milliseconds when it works, and never when it does not.
pub async fn eventually(what: &str, mut f: impl AsyncFnMut() -> bool) {
    for _ in 0..1000 {
        if f().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("never happened: {what}");
}

/// A bare HTTP/1.1 GET (the tests need no HTTP client crate for this).
pub async fn http_get(addr: SocketAddr, path: &str) -> String {
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
    value_of(&http_get(addr, "/metrics").await, name)
}

/// The values of several counters or gauges on `/metrics`, in the order
/// named (0 for any absent), read from one scrape: the series of a family
/// that a test checks together.
pub async fn metrics<const N: usize>(addr: SocketAddr, names: &[impl AsRef<str>; N]) -> [f64; N] {
    let body = http_get(addr, "/metrics").await;
    names.each_ref().map(|name| value_of(&body, name.as_ref()))
}

/// The value of the series `name` in a scrape's `body` (0 if absent).
fn value_of(body: &str, name: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// This process's resident memory in bytes (Linux), for tests that report
/// what a number of connections costs.
pub fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .expect("VmRSS in /proc/self/status")
        << 10
}

/// The count the environment variable `name` gives, else `default`: how
/// tests that print figures are scaled up by hand.
pub fn count_from_env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
