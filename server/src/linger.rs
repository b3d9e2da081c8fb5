//! What the server does with a request body its answer left unread, so
//! that a client still sending reads the answer.
//!
//! HTTP/1.1 closes the connection: closing the socket at once would make
//! the kernel reset it over the unread bytes, and a client still sending
//! (as Python's `http.client` sends its whole body before reading) would
//! fail on send instead of reading the answer. So the close lingers (RFC
//! 9112 §9.6): the sending side shuts first, then what the client still
//! sends is read and dropped, within a budget of bytes and time, before
//! the socket closes ([`Lingering`]). HTTP/2 ends only the stream: its
//! body is read and dropped within the same budget ([`drain`]), so that
//! the stream closes once both sides are done instead of being reset.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// How long and how much a closing connection reads on.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Budget {
    /// Most bytes read and dropped.
    pub(crate) bytes: usize,
    /// Longest time spent reading them.
    pub(crate) time: Duration,
}

/// A connection's bytes that linger on close when [`Lingering::unread`]
/// was set: the sending side shuts, then reading goes on until the client
/// closes, the budget is spent, a read fails or the server stops.
pub(crate) struct Lingering<T> {
    io: T,
    unread: Arc<AtomicBool>,
    budget: Budget,
    stop: CancellationToken,
    close: Close,
}

/// Where a close stands.
enum Close {
    /// Not started.
    Open,
    /// The sending side is shut; reading on, `left` bytes more at most,
    /// until `until` or the server stops.
    Draining {
        left: usize,
        until: Pin<Box<Sleep>>,
        stopped: Pin<Box<WaitForCancellationFutureOwned>>,
    },
    /// Done: nothing more is read.
    Done,
}

impl<T> Lingering<T> {
    /// `io`, lingering within `budget` on a close that follows an unread
    /// body, and not past `stop`: a server that stops waits for no client.
    pub(crate) fn new(io: T, budget: Budget, stop: CancellationToken) -> Self {
        Lingering {
            io,
            unread: Arc::default(),
            budget,
            stop,
            close: Close::Open,
        }
    }

    /// The flag an answer sets when it leaves its request's body unread.
    pub(crate) fn unread(&self) -> Arc<AtomicBool> {
        self.unread.clone()
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Lingering<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncWrite for Lingering<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            match &mut this.close {
                Close::Open => {
                    ready!(Pin::new(&mut this.io).poll_shutdown(cx))?;
                    // Relaxed: set by a request's future, which ran on
                    // this connection's task before the close began.
                    this.close = match this.unread.load(Ordering::Relaxed) {
                        true => Close::Draining {
                            left: this.budget.bytes,
                            until: Box::pin(tokio::time::sleep(this.budget.time)),
                            stopped: Box::pin(this.stop.clone().cancelled_owned()),
                        },
                        false => Close::Done,
                    };
                }
                Close::Draining {
                    left,
                    until,
                    stopped,
                } => {
                    if until.as_mut().poll(cx).is_ready() || stopped.as_mut().poll(cx).is_ready() {
                        this.close = Close::Done;
                        continue;
                    }
                    let mut scratch = [0u8; 8192];
                    let mut buf = ReadBuf::new(&mut scratch);
                    match ready!(Pin::new(&mut this.io).poll_read(cx, &mut buf)) {
                        Ok(()) if !buf.filled().is_empty() && buf.filled().len() < *left => {
                            *left -= buf.filled().len();
                        }
                        // The client closed, the budget is spent, or the
                        // connection failed: nothing more to wait for.
                        _ => this.close = Close::Done,
                    }
                }
                Close::Done => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// Reads and drops what is left of `body` until it ends, the budget is
/// spent, a read fails or the server stops (`stop`).
pub(crate) async fn drain(mut body: Incoming, budget: Budget, stop: CancellationToken) {
    let mut left = budget.bytes;
    let reading = async {
        while let Some(Ok(frame)) = body.frame().await {
            let n = frame.data_ref().map_or(0, |data| data.len());
            if n >= left {
                return;
            }
            left -= n;
        }
    };
    // Past the time, or as the server stops, the body is dropped and its
    // stream reset.
    tokio::select! {
        _ = tokio::time::timeout(budget.time, reading) => {}
        _ = stop.cancelled() => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A lingering end over one side of an in-memory pipe, with the other,
    /// and the token that stops the server.
    fn pair(
        bytes: usize,
        time: Duration,
    ) -> (
        Lingering<tokio::io::DuplexStream>,
        tokio::io::DuplexStream,
        CancellationToken,
    ) {
        let (ours, theirs) = tokio::io::duplex(1 << 16);
        let stop = CancellationToken::new();
        let ours = Lingering::new(ours, Budget { bytes, time }, stop.clone());
        // Relaxed: read by the close, on this same task.
        ours.unread().store(true, Ordering::Relaxed);
        (ours, theirs, stop)
    }

    /// Waits for `close`, failing (rather than hanging) past a minute.
    async fn within_a_minute(close: impl Future<Output = io::Result<()>>, what: &str) {
        tokio::time::timeout(Duration::from_secs(60), close)
            .await
            .unwrap_or_else(|_| panic!("{what}"))
            .unwrap();
    }

    #[tokio::test]
    async fn a_close_after_an_unread_body_reads_on_until_the_client_closes() {
        let (mut ours, mut theirs, _stop) = pair(1 << 20, Duration::from_secs(3600));
        let client = tokio::spawn(async move {
            // Past the pipe's 64 KiB: written only if the server reads on.
            theirs.write_all(&[b' '; 100_000]).await.unwrap();
            let mut answer = Vec::new();
            theirs.read_to_end(&mut answer).await.unwrap();
            answer
        });
        ours.write_all(b"answer").await.unwrap();
        within_a_minute(ours.shutdown(), "the client's close ends the wait").await;
        let answer = tokio::time::timeout(Duration::from_secs(60), client)
            .await
            .expect("the client wrote its body and read the answer");
        assert_eq!(answer.unwrap(), b"answer");
    }

    #[tokio::test]
    async fn lingering_stops_at_its_time() {
        let (mut ours, _theirs, _stop) = pair(1 << 20, Duration::from_millis(200));
        // The client neither sends nor closes: only the time ends the wait.
        within_a_minute(ours.shutdown(), "the close ends at the time budget").await;
    }

    #[tokio::test]
    async fn lingering_stops_at_its_bytes() {
        let (mut ours, mut theirs, _stop) = pair(10_000, Duration::from_secs(3600));
        // More than the budget, and never closed: the budget ends the wait.
        theirs.write_all(&[b' '; 20_000]).await.unwrap();
        within_a_minute(ours.shutdown(), "the close ends at the byte budget").await;
    }

    #[tokio::test]
    async fn lingering_stops_when_the_server_stops() {
        let (mut ours, _theirs, stop) = pair(1 << 20, Duration::from_secs(3600));
        stop.cancel();
        within_a_minute(ours.shutdown(), "a stopping server waits for no client").await;
    }

    #[tokio::test]
    async fn a_close_with_nothing_unread_does_not_wait() {
        // A budget of an hour, and a client that never closes: only a
        // close that does not linger ends within the minute.
        let (mut ours, _theirs, _stop) = pair(1 << 20, Duration::from_secs(3600));
        // Relaxed: as in `pair`.
        ours.unread().store(false, Ordering::Relaxed);
        within_a_minute(ours.shutdown(), "no lingering").await;
    }
}
