//! The async side of a connection: accept streams, move bytes between QUIC
//! and the [`Handler`], drain on shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use std::future::Future;

use prefix_client::wire::ErrorCode;

use crate::handler::{encode_error, Handler, Inbox, Next};

/// Serves one accepted connection: every bidirectional stream the client
/// opens gets its own task. Returns when the client closes the connection or
/// at shutdown (the stream tasks then drain on their own).
pub async fn serve_connection(
    conn: quinn::Connection,
    handler: Arc<Handler>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => return,
            s = conn.accept_bi() => s,
        };
        match accepted {
            Ok((send, recv)) => {
                tracker.spawn(serve_stream(
                    send,
                    recv,
                    conn.clone(),
                    handler.clone(),
                    shutdown.clone(),
                ));
            }
            Err(e) => {
                tracing::debug!(remote = %conn.remote_address(), reason = %e, "connection ended");
                return;
            }
        }
    }
}

/// Largest chunk read at once.
const READ_CHUNK: usize = 256 << 10;

/// Heavy frames one stream may have on the blocking pool at once. Past it the
/// stream stops reading until one finishes: back-pressure on that client
/// alone.
const HEAVY_PER_STREAM: usize = 4;

/// At shutdown, reads of already-arrived data a stream may still make.
const DRAIN_READS: usize = 64;

/// What woke a stream task.
enum Event {
    Read(Result<Option<quinn::Chunk>, quinn::ReadError>),
    Heavy(Result<(tokio::task::Id, (u64, Vec<u8>)), tokio::task::JoinError>),
}

/// Serves one stream: read what has arrived, answer every whole frame in it,
/// write the answers in one go, repeat. Heavy frames run on the blocking pool
/// and are answered when done, possibly after frames that came later (the
/// client matches answers by request id), so they hold up neither other
/// connections nor this stream. At shutdown, answers what has already arrived,
/// then finishes the stream and waits for the client to acknowledge.
async fn serve_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    conn: quinn::Connection,
    handler: Arc<Handler>,
    shutdown: CancellationToken,
) {
    let mut inbox = Inbox::default();
    let mut out = Vec::with_capacity(64 << 10);
    let mut heavy = Heavy::default();
    let (mut reading, mut draining) = (true, false);
    let mut drained = 0;
    loop {
        if !out.is_empty() {
            if send.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if !reading && heavy.tasks.is_empty() {
            break;
        }
        if !draining && shutdown.is_cancelled() {
            draining = true;
        }
        let event = if !reading || heavy.tasks.len() >= HEAVY_PER_STREAM {
            match heavy.tasks.join_next_with_id().await {
                Some(done) => Event::Heavy(done),
                None => continue,
            }
        } else if draining {
            // Only what has already arrived: poll the read once. A client
            // that keeps sending could otherwise hold the drain open, so
            // stop after a bounded amount too.
            drained += 1;
            let polled = {
                let mut read = std::pin::pin!(recv.read_chunk(READ_CHUNK, true));
                std::future::poll_fn(|cx| std::task::Poll::Ready(read.as_mut().poll(cx))).await
            };
            match polled {
                std::task::Poll::Ready(r) if drained <= DRAIN_READS => Event::Read(r),
                _ => {
                    let _ = recv.stop(u32::from(ErrorCode::Unavailable as u16).into());
                    reading = false;
                    continue;
                }
            }
        } else {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    draining = true;
                    continue;
                }
                Some(done) = heavy.tasks.join_next_with_id(), if !heavy.tasks.is_empty() => Event::Heavy(done),
                r = recv.read_chunk(READ_CHUNK, true) => Event::Read(r),
            }
        };
        match event {
            Event::Heavy(done) => heavy.finished(done, &handler, &mut out),
            Event::Read(Ok(Some(chunk))) => {
                inbox.push(&chunk.bytes);
                if let Some(code) = answer(&handler, &mut inbox, &mut out, &mut heavy) {
                    let _ = recv.stop(u32::from(code).into());
                    reading = false;
                }
            }
            Event::Read(Ok(None)) => {
                // The client finished its side; answer a frame it cut short.
                if let Some((id, e)) = inbox.truncated() {
                    handler.refused();
                    encode_error(id, &e, &mut out);
                }
                reading = false;
            }
            Event::Read(Err(e)) => {
                // The connection is gone: nobody to answer.
                tracing::debug!(reason = %e, "stream ended");
                return;
            }
        }
    }
    let _ = send.finish();
    // Wait until the client has acknowledged the answers (or stops the
    // stream), so closing the connection afterwards loses nothing. A live
    // client acknowledges within a few round trips, even with a loss or two;
    // a vanished one never does, so do not wait for it longer than that.
    let patience = (conn.rtt() * 10).clamp(Duration::from_millis(50), Duration::from_secs(2));
    let _ = tokio::time::timeout(patience, send.stopped()).await;
}

/// A stream's heavy frames on the blocking pool.
#[derive(Default)]
struct Heavy {
    tasks: tokio::task::JoinSet<(u64, Vec<u8>)>,
    /// Request id of each task, to answer even if one fails.
    ids: std::collections::HashMap<tokio::task::Id, u64>,
}

impl Heavy {
    fn start(&mut self, handler: &Arc<Handler>, id: u64, request: prefix_client::wire::Request) {
        let h = handler.clone();
        let task = self.tasks.spawn_blocking(move || {
            let mut buf = Vec::new();
            h.serve(id, &request, &mut buf);
            (id, buf)
        });
        self.ids.insert(task.id(), id);
    }

    fn finished(
        &mut self,
        done: Result<(tokio::task::Id, (u64, Vec<u8>)), tokio::task::JoinError>,
        handler: &Handler,
        out: &mut Vec<u8>,
    ) {
        match done {
            Ok((task, (_, bytes))) => {
                self.ids.remove(&task);
                out.extend_from_slice(&bytes);
            }
            Err(e) => {
                let id = self.ids.remove(&e.id()).unwrap_or(0);
                tracing::error!(error = %e, request_id = id, "request task failed");
                handler.refused();
                let msg = format!("the server failed on this request: {e}");
                prefix_client::wire::encode_response(
                    id,
                    &prefix_client::wire::Response::One(prefix_client::wire::Reply::Error {
                        code: prefix_client::wire::ErrorCode::Internal as u16,
                        message: msg,
                    }),
                    out,
                );
            }
        }
    }
}

/// Answers every whole frame in the inbox into `out`, starting heavy ones on
/// the blocking pool. Returns the error code if the stream's framing is lost
/// and it must close.
fn answer(
    handler: &Arc<Handler>,
    inbox: &mut Inbox,
    out: &mut Vec<u8>,
    heavy: &mut Heavy,
) -> Option<u16> {
    loop {
        match inbox.next(&handler.limits) {
            Next::Wait => return None,
            Next::Request { id, request } => {
                if handler.is_heavy(&request) {
                    // A big batch of long keys takes milliseconds: run it off
                    // the async workers so other connections are not held up.
                    heavy.start(handler, id, request);
                } else {
                    handler.serve(id, &request, out);
                }
            }
            Next::Refuse { id, error } => {
                handler.refused();
                encode_error(id, &error, out);
            }
            Next::Fatal { id, error } => {
                tracing::debug!(%error, "closing a stream");
                handler.refused();
                encode_error(id, &error, out);
                return Some(error.code() as u16);
            }
        }
    }
}
