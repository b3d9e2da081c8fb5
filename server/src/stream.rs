//! The async side of a connection: accept streams, move bytes between QUIC
//! and the [`Handler`], drain on shutdown.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

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

/// Serves one stream: read what has arrived, answer every whole frame in it,
/// write the answers in one go, repeat. At shutdown, answers what has already
/// arrived, then finishes the stream and waits for the client to acknowledge.
async fn serve_stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    conn: quinn::Connection,
    handler: Arc<Handler>,
    shutdown: CancellationToken,
) {
    let mut inbox = Inbox::default();
    let mut out = Vec::with_capacity(64 << 10);
    let mut draining = false;
    loop {
        let read = if draining {
            // Only what is already here: a zero timeout polls the read once.
            match tokio::time::timeout(Duration::ZERO, recv.read_chunk(READ_CHUNK, true)).await {
                Ok(r) => r,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                biased;
                r = recv.read_chunk(READ_CHUNK, true) => r,
                _ = shutdown.cancelled() => {
                    draining = true;
                    continue;
                }
            }
        };
        let chunk = match read {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                // The client finished its side; answer a frame it cut short.
                if let Some((id, e)) = inbox.truncated() {
                    handler.refused();
                    encode_error(id, &e, &mut out);
                }
                break;
            }
            Err(e) => {
                tracing::debug!(reason = %e, "stream ended");
                return;
            }
        };
        inbox.push(&chunk.bytes);
        let fatal = answer(&handler, &mut inbox, &mut out).await;
        if !out.is_empty() {
            if send.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if let Some(code) = fatal {
            let _ = recv.stop(u32::from(code).into());
            break;
        }
    }
    if !out.is_empty() && send.write_all(&out).await.is_err() {
        return;
    }
    let _ = send.finish();
    // Wait until the client has acknowledged the answers (or stops the
    // stream), so closing the connection afterwards loses nothing. A live
    // client acknowledges within a few round trips, even with a loss or two;
    // a vanished one never does, so do not wait for it longer than that.
    let patience = (conn.rtt() * 10).clamp(Duration::from_millis(50), Duration::from_secs(2));
    let _ = tokio::time::timeout(patience, send.stopped()).await;
}

/// Answers every whole frame in the inbox into `out`. Returns the error code
/// if the stream's framing is lost and it must close.
async fn answer(handler: &Arc<Handler>, inbox: &mut Inbox, out: &mut Vec<u8>) -> Option<u16> {
    loop {
        match inbox.next(&handler.limits) {
            Next::Wait => return None,
            Next::Request { id, request } => {
                if handler.is_heavy(&request) {
                    // A big batch of long keys takes milliseconds: run it off
                    // the async workers so other connections are not held up.
                    let h = handler.clone();
                    let mut buf = std::mem::take(out);
                    let done = tokio::task::spawn_blocking(move || {
                        h.serve(id, &request, &mut buf);
                        buf
                    })
                    .await;
                    match done {
                        Ok(buf) => *out = buf,
                        Err(e) => {
                            tracing::error!(error = %e, "request task failed");
                            return Some(prefix_client::wire::ErrorCode::Internal as u16);
                        }
                    }
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
