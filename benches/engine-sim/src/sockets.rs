//! The engine's side of its KV-event sockets, as vLLM's publisher has
//! them (`docs/events.md`, "Formats accepted"): live batches on a PUB
//! socket, and replays answered on a ROUTER socket. This is the one fake
//! engine: the tests' ([`Engine`], [`Replies`]) and the load tester's
//! fleets bind, publish and answer replays through it, so they speak the
//! one wire the server reads; an engine that connects to the server's
//! collector instead ([`connect`]) sends the same messages.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Where [`bind`] finds a free loopback port.
pub const ANY_PORT: &str = "tcp://127.0.0.1:*";

/// How often a replay thread looks at its stop flag, in milliseconds.
const POLL_MS: i64 = 50;

/// A bound socket and the endpoint it is bound at.
pub struct Bound {
    /// The socket.
    pub socket: zmq::Socket,
    /// `tcp://127.0.0.1:<port>`.
    pub endpoint: String,
}

/// A socket of `kind` bound at `at` ([`ANY_PORT`] for a free port).
///
/// It has no high-water mark, so that what a slow subscriber has not
/// taken yet queues here instead of being dropped (a batch a test loses
/// is one it drops on purpose), and no linger: closing drops whatever is
/// still queued, as a run ends once the server has everything or has
/// given up on it. libzmq closes a socket in its I/O thread, so a fixed
/// port a socket held a moment ago may come free only a little later: it
/// is tried again for up to 5 s.
pub fn bind(ctx: &zmq::Context, kind: zmq::SocketType, at: &str) -> zmq::Result<Bound> {
    let socket = ctx.socket(kind)?;
    socket.set_linger(0)?;
    socket.set_sndhwm(0)?;
    let mut tries = 0;
    loop {
        match socket.bind(at) {
            Ok(()) => break,
            Err(zmq::Error::EADDRINUSE) if tries < 250 => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(e),
        }
    }
    // libzmq writes endpoints in ASCII.
    let endpoint = socket
        .get_last_endpoint()?
        .map_err(|_| zmq::Error::EINVAL)?;
    Ok(Bound { socket, endpoint })
}

/// A PUB socket connected to `endpoint` (the server's collector, or
/// `tcp://<source>:0;<host>:<port>` to connect from `source`), with no
/// linger, as an engine publishing to a collector has it.
pub fn connect(ctx: &zmq::Context, endpoint: &str) -> zmq::Result<zmq::Socket> {
    let socket = ctx.socket(zmq::PUB)?;
    socket.set_linger(0)?;
    socket.connect(endpoint)?;
    Ok(socket)
}

/// One fake engine's bound sockets.
pub struct Engine {
    /// Live batches. An XPUB socket (verbose: every subscription is told,
    /// a repeat included), so that a sender can wait for its subscriber
    /// ([`subscribed`]): a PUB socket drops what it sends before one is
    /// there.
    pub live: Bound,
    /// Replay requests, if the engine answers them ([`Replies`]).
    pub replay: Option<Bound>,
}

impl Engine {
    /// An engine publishing at `at` and, with `replay`, answering replays
    /// there ([`ANY_PORT`] for free ports; a restarted engine binds its
    /// old ones again).
    pub fn bind(ctx: &zmq::Context, at: &str, replay: Option<&str>) -> zmq::Result<Engine> {
        let live = bind(ctx, zmq::XPUB, at)?;
        live.socket.set_xpub_verbose(true)?;
        let replay = replay.map(|at| bind(ctx, zmq::ROUTER, at)).transpose()?;
        Ok(Engine { live, replay })
    }
}

/// Waits up to `timeout` for a subscription to reach the XPUB socket
/// `live` (an unsubscription, from a subscriber that left, is passed
/// over); false when none came. With a zero `timeout` it only looks.
pub fn subscribed(live: &zmq::Socket, timeout: Duration) -> zmq::Result<bool> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if live.poll(zmq::POLLIN, left.as_millis() as i64)? == 0 {
            return Ok(false);
        }
        // The message's first byte: 1 subscribes, 0 unsubscribes.
        if live.recv_bytes(0)?.first() == Some(&1) {
            return Ok(true);
        }
    }
}

/// A thread answering the replay requests of a group of engines, as
/// vLLM's publisher thread does, until dropped.
pub struct Replies {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Replies {
    /// Starts thread `name` answering each request on `routers` (the
    /// engines' ROUTER sockets) with `answer(engine, router, request)`,
    /// `engine` the router's place in `routers` (answered with
    /// [`answer_replay`]).
    pub fn spawn<F>(
        name: String,
        routers: Vec<zmq::Socket>,
        mut answer: F,
    ) -> std::io::Result<Replies>
    where
        F: FnMut(usize, &zmq::Socket, &[Vec<u8>]) + Send + 'static,
    {
        let stop = Arc::new(AtomicBool::new(false));
        let halt = stop.clone();
        let thread = std::thread::Builder::new().name(name).spawn(move || {
            // Relaxed: a stop flag; the join in `halt` orders the rest.
            while !halt.load(Ordering::Relaxed) {
                let mut items: Vec<_> = routers
                    .iter()
                    .map(|r| r.as_poll_item(zmq::POLLIN))
                    .collect();
                match zmq::poll(&mut items, POLL_MS) {
                    Ok(0) => continue,
                    Ok(_) => {}
                    // Not a reason to spin: wait as a quiet poll would.
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(POLL_MS as u64));
                        continue;
                    }
                }
                let ready: Vec<usize> = (0..items.len())
                    .filter(|&i| items[i].is_readable())
                    .collect();
                for e in ready {
                    while let Ok(request) = routers[e].recv_multipart(zmq::DONTWAIT) {
                        answer(e, &routers[e], &request);
                    }
                }
            }
        })?;
        Ok(Replies {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it: `Err` with its panic if `answer`
    /// panicked (dropping them stops it too, and drops a panic).
    pub fn join(mut self) -> std::thread::Result<()> {
        self.halt()
    }

    fn halt(&mut self) -> std::thread::Result<()> {
        // Relaxed: a stop flag; the join orders the rest.
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map_or(Ok(()), JoinHandle::join)
    }
}

impl Drop for Replies {
    fn drop(&mut self) {
        let _ = self.halt();
    }
}

/// Sends batch `seq` on a PUB (or XPUB) socket: `[topic, seq, payload]`,
/// the number as 8 big-endian bytes.
pub fn send_live(socket: &zmq::Socket, topic: &[u8], seq: u64, payload: &[u8]) -> zmq::Result<()> {
    let msg: [&[u8]; 3] = [topic, &seq.to_be_bytes(), payload];
    socket.send_multipart(msg, 0)
}

/// The first batch a replay request asks for: `request` is what a ROUTER
/// socket received, `[identity, "", start]` with the start as big-endian
/// bytes. None for a message of another shape.
pub fn replay_start(request: &[Vec<u8>]) -> Option<u64> {
    let [_, empty, start] = request else {
        return None;
    };
    let start = <[u8; 8]>::try_from(&start[..]).ok()?;
    empty.is_empty().then(|| u64::from_be_bytes(start))
}

/// Answers the replay `request` on `router` with `batches` (`(seq,
/// payload)`, in order: those from the start asked for), each as
/// `[identity, "", topic, seq, payload]`, then the end marker `[identity,
/// "", "", u64::MAX, ""]`. A request of another shape is not answered.
pub fn answer_replay<'a>(
    router: &zmq::Socket,
    request: &[Vec<u8>],
    topic: &[u8],
    batches: impl IntoIterator<Item = (u64, &'a [u8])>,
) -> zmq::Result<()> {
    let (Some(start), Some(id)) = (replay_start(request), request.first()) else {
        return Ok(());
    };
    for (seq, payload) in batches.into_iter().filter(|(seq, _)| *seq >= start) {
        let msg: [&[u8]; 5] = [id, b"", topic, &seq.to_be_bytes(), payload];
        router.send_multipart(msg, 0)?;
    }
    let end: [&[u8]; 5] = [id, b"", b"", &u64::MAX.to_be_bytes(), b""];
    router.send_multipart(end, 0)
}
