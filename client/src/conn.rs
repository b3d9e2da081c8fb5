//! One QUIC connection to one server, carrying pipelined requests.
//!
//! A connection opens `streams` long-lived bidirectional streams ("lanes").
//! Each lane has a writer task, which drains a queue of encoded frames and
//! writes whatever has queued up in one go, and a reader task, which splits the
//! answers into frames and hands each to the caller waiting on its request id.
//! Many requests are thus in flight on each lane at once; the server may answer
//! them in any order (it answers heavy frames when they are done). More lanes
//! spread a client's frames over more server tasks, at the price of smaller
//! writes.
//!
//! When either task of any lane fails, or the server finishes a lane, the
//! connection is marked dead and every waiting caller gets
//! [`ClientError::Disconnected`]; the [`crate::Client`] then reconnects.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::error::ClientError;
use crate::wire::{self, FrameReader, Kind, Response, MAX_FRAME_CEILING};

type Answer = Result<Response, ClientError>;

/// Largest piece of a snapshot read at once.
const SNAPSHOT_CHUNK: usize = 1 << 20;

/// A request on its way to a lane's writer.
struct Outgoing {
    id: u64,
    frame: Vec<u8>,
    answer: oneshot::Sender<Answer>,
}

/// Callers waiting for answers on one lane, by request id.
type Pending = Mutex<HashMap<u64, oneshot::Sender<Answer>>>;

struct Lane {
    queue: mpsc::Sender<Outgoing>,
    pending: Arc<Pending>,
}

/// A live (or just-died) connection.
pub(crate) struct Conn {
    quic: quinn::Connection,
    addr: SocketAddr,
    lanes: Box<[Lane]>,
    next_lane: AtomicUsize,
    next_id: AtomicU64,
    dead: Arc<Dead>,
}

/// Set once, by whichever task sees the connection fail first.
#[derive(Default)]
struct Dead {
    flag: AtomicBool,
    reason: Mutex<Option<String>>,
}

impl Dead {
    fn set(&self, reason: String) {
        self.reason.lock().get_or_insert(reason);
        // Release: pairs with the Acquire in `is_dead`, so a caller that sees
        // the flag also sees the reason.
        self.flag.store(true, Ordering::Release);
    }
}

/// A ticket for one request in flight.
pub(crate) struct Ticket {
    pub(crate) id: u64,
    pub(crate) answer: oneshot::Receiver<Answer>,
    lane: usize,
}

impl Conn {
    /// Opens `streams` lanes on an established connection and starts their
    /// tasks. `queue` bounds the frames waiting for each writer.
    pub(crate) async fn start(
        quic: quinn::Connection,
        addr: SocketAddr,
        streams: usize,
        queue: usize,
    ) -> Result<Arc<Conn>, quinn::ConnectionError> {
        let dead = Arc::new(Dead::default());
        let mut lanes = Vec::with_capacity(streams);
        for _ in 0..streams.max(1) {
            // Opening a stream is local: it reaches the server with its first frame.
            let (send, recv) = quic.open_bi().await?;
            let (tx, rx) = mpsc::channel(queue.max(1));
            let pending = Arc::new(Pending::default());
            tokio::spawn(write_lane(send, rx, pending.clone(), dead.clone(), addr));
            tokio::spawn(read_lane(recv, pending.clone(), dead.clone(), addr));
            lanes.push(Lane { queue: tx, pending });
        }
        Ok(Arc::new(Conn {
            quic,
            addr,
            lanes: lanes.into(),
            next_lane: AtomicUsize::new(0),
            next_id: AtomicU64::new(1),
            dead,
        }))
    }

    /// Whether the connection can no longer carry requests.
    pub(crate) fn is_dead(&self) -> bool {
        // Acquire: pairs with the Release in `Dead::set`.
        self.dead.flag.load(Ordering::Acquire) || self.quic.close_reason().is_some()
    }

    /// Why it died, for error messages.
    pub(crate) fn reason(&self) -> String {
        if let Some(r) = self.dead.reason.lock().clone() {
            return r;
        }
        self.quic
            .close_reason()
            .map_or_else(|| "connection closed".into(), |e| e.to_string())
    }

    pub(crate) fn disconnected(&self) -> ClientError {
        ClientError::Disconnected {
            addr: self.addr,
            reason: self.reason(),
        }
    }

    /// Asks for the server's snapshot on a stream of its own and reads it
    /// whole: the answer's frame (`Done` or the server's refusal), then the
    /// snapshot's bytes until the server ends the stream, at most
    /// `max_bytes` of them.
    pub(crate) async fn snapshot(&self, max_bytes: u64) -> Result<Vec<u8>, ClientError> {
        let lost = |e: &dyn std::fmt::Display| ClientError::Disconnected {
            addr: self.addr,
            reason: e.to_string(),
        };
        let (mut send, mut recv) = self.quic.open_bi().await.map_err(|e| lost(&e))?;
        let mut frame = Vec::with_capacity(wire::HEADER_LEN);
        wire::encode_snapshot_request(self.next_id(), &mut frame);
        send.write_all(&frame).await.map_err(|e| lost(&e))?;
        // The request is the stream's last frame.
        let _ = send.finish();
        let mut buf = Vec::new();
        let start = loop {
            let bad =
                |e: wire::WireError| ClientError::Protocol(format!("a snapshot's answer: {e}"));
            if let Some(f) = wire::split_frame(&buf, MAX_FRAME_CEILING).map_err(bad)? {
                match wire::decode_response(f.payload).map_err(bad)? {
                    Response::One(wire::Reply::Done) => break f.used,
                    Response::One(wire::Reply::Error { code, message }) => {
                        return Err(ClientError::Server { code, message })
                    }
                    other => {
                        return Err(ClientError::Protocol(format!(
                            "expected a snapshot's answer, got {other:?}"
                        )))
                    }
                }
            }
            match recv.read_chunk(SNAPSHOT_CHUNK, true).await {
                Ok(Some(chunk)) => buf.extend_from_slice(&chunk.bytes),
                Ok(None) => {
                    return Err(ClientError::Protocol(
                        "the stream ended before the snapshot's answer".into(),
                    ))
                }
                Err(e) => return Err(lost(&e)),
            }
        };
        buf.drain(..start);
        loop {
            match recv.read_chunk(SNAPSHOT_CHUNK, true).await {
                Ok(Some(chunk)) => {
                    if (buf.len() + chunk.bytes.len()) as u64 > max_bytes {
                        let _ = recv.stop(0u32.into());
                        return Err(ClientError::Protocol(format!(
                            "the snapshot is over {max_bytes} bytes"
                        )));
                    }
                    buf.extend_from_slice(&chunk.bytes);
                }
                Ok(None) => return Ok(buf),
                Err(e) => return Err(lost(&e)),
            }
        }
    }

    /// A fresh request id (unique on this connection).
    pub(crate) fn next_id(&self) -> u64 {
        // Relaxed: ids only need to be unique, not ordered with anything.
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Queues an encoded request frame (carrying request id `id`) on the next
    /// lane. Never waits: a full queue means the server is far behind, and
    /// the caller's deadline would pass anyway.
    pub(crate) fn send(&self, id: u64, frame: Vec<u8>) -> Result<Ticket, ClientError> {
        // Relaxed: round-robin needs no ordering.
        let lane = self.next_lane.fetch_add(1, Ordering::Relaxed) % self.lanes.len();
        let (tx, rx) = oneshot::channel();
        let out = Outgoing {
            id,
            frame,
            answer: tx,
        };
        match self.lanes[lane].queue.try_send(out) {
            Ok(()) => Ok(Ticket {
                id,
                answer: rx,
                lane,
            }),
            Err(mpsc::error::TrySendError::Full(_)) => Err(ClientError::Server {
                code: wire::ErrorCode::Unavailable as u16,
                message: "client send queue is full".into(),
            }),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(self.disconnected()),
        }
    }

    /// Forgets a request whose caller stopped waiting.
    pub(crate) fn abandon(&self, ticket: &Ticket) {
        self.lanes[ticket.lane].pending.lock().remove(&ticket.id);
    }

    /// Closes the connection (the client is being dropped).
    pub(crate) fn close(&self) {
        self.quic.close(0u32.into(), b"client closed");
    }
}

/// Fails every waiting caller of a lane.
fn fail_all(pending: &Pending, dead: &Dead, addr: SocketAddr) {
    let reason = dead
        .reason
        .lock()
        .clone()
        .unwrap_or_else(|| "connection closed".into());
    for (_, tx) in pending.lock().drain() {
        let _ = tx.send(Err(ClientError::Disconnected {
            addr,
            reason: reason.clone(),
        }));
    }
}

/// Bytes a writer gathers into one write before sending.
const WRITE_CHUNK: usize = 256 << 10;

async fn write_lane(
    mut send: quinn::SendStream,
    mut queue: mpsc::Receiver<Outgoing>,
    pending: Arc<Pending>,
    dead: Arc<Dead>,
    addr: SocketAddr,
) {
    let mut buf = Vec::with_capacity(64 << 10);
    while let Some(first) = queue.recv().await {
        buf.clear();
        let mut next = Some(first);
        {
            let mut waiting = pending.lock();
            while let Some(out) = next.take() {
                if out.answer.is_closed() {
                    // The caller gave up (its deadline passed) while the
                    // frame queued: sending it would only add load.
                } else if dead.flag.load(Ordering::Acquire) {
                    // Acquire: pairs with `Dead::set`. The reader is gone, so
                    // nobody would answer: fail now instead of at the deadline.
                    let _ = out.answer.send(Err(ClientError::Disconnected {
                        addr,
                        reason: dead.reason.lock().clone().unwrap_or_default(),
                    }));
                } else {
                    // Register before the bytes leave, so the answer always
                    // finds its caller.
                    waiting.insert(out.id, out.answer);
                    buf.extend_from_slice(&out.frame);
                }
                if buf.len() < WRITE_CHUNK {
                    next = queue.try_recv().ok();
                }
            }
        }
        if buf.is_empty() {
            continue;
        }
        if let Err(e) = send.write_all(&buf).await {
            dead.set(format!("sending failed: {e}"));
            break;
        }
    }
    // Either every sender is gone (the connection was dropped) or writing
    // failed; in both cases no answer will come for what is pending.
    let _ = send.finish();
    fail_all(&pending, &dead, addr);
}

async fn read_lane(
    mut recv: quinn::RecvStream,
    pending: Arc<Pending>,
    dead: Arc<Dead>,
    addr: SocketAddr,
) {
    // Answers may be larger than requests (a batch of lookups lists pods), so
    // accept frames up to the protocol's ceiling.
    let mut reader = FrameReader::new(Kind::Response, MAX_FRAME_CEILING);
    let reason = loop {
        match recv.read_chunk(1 << 20, true).await {
            Ok(Some(chunk)) => reader.push(&chunk.bytes),
            Ok(None) => break "the server closed the stream (shutting down?)".to_string(),
            Err(quinn::ReadError::ConnectionLost(e)) => {
                break format!("connection lost: {}", crate::tls::describe_close(&e))
            }
            Err(e) => break format!("receiving failed: {e}"),
        }
        let failed = loop {
            match reader.next_frame() {
                Ok(Some(frame)) => {
                    let answer = wire::decode_response(frame.payload)
                        .map_err(|e| ClientError::Protocol(e.to_string()));
                    let waiter = pending.lock().remove(&frame.header.request_id);
                    if let Some(tx) = waiter {
                        let _ = tx.send(answer);
                    }
                }
                Ok(None) => break None,
                Err(e) => break Some(format!("bad frame from the server: {e}")),
            }
        };
        if let Some(reason) = failed {
            break reason;
        }
    };
    dead.set(reason);
    fail_all(&pending, &dead, addr);
}
