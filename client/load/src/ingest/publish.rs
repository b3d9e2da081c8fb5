//! The engines' side of the ingest benchmark: per engine a PUB socket (live
//! batches) and a ROUTER socket (replays), bound on loopback through libzmq
//! itself, as vLLM's publisher does through pyzmq. Each engine has a libzmq
//! context of its own, as each engine is a process of its own.
//!
//! The PUB socket has no high-water mark: a publisher faster than the
//! server queues in libzmq instead of dropping (vLLM's 100,000 would also
//! hold a whole run), so the run measures the server, not loss and replay.
//! The replay socket answers "every batch from N" from the batches
//! published so far, like vLLM's: a server asks it for the engine's recent
//! past when it connects (nothing, before the run), and again if it misses
//! batches, which the report would show in the server's replay count.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;

/// The topic every batch is published under (vLLM's `topic` setting).
pub const TOPIC: &str = "kv";

/// Name prefix of the publishing threads (CPU time is told apart by name).
pub const PUBLISH_THREAD: &str = "publish-";

/// Name prefix of the replay threads.
const REPLAY_THREAD: &str = "replay-";

/// How often a replay thread looks at its stop flag.
const POLL_MS: i64 = 50;

/// One engine's sockets, bound; publishing starts with [`Engine::start`].
pub struct Engine {
    /// Its PUB endpoint, `tcp://127.0.0.1:port`.
    pub endpoint: String,
    /// Its replay endpoint.
    pub replay: String,
    /// Until [`Engine::start`] moves it to its thread.
    publisher: Option<zmq::Socket>,
    batches: Arc<Vec<Vec<u8>>>,
    /// Batches handed to the PUB socket so far.
    published: Arc<AtomicUsize>,
    /// Replay requests answered so far.
    answered: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    replier: Option<JoinHandle<()>>,
    // Dropped last: dropping a context waits for its sockets.
    _ctx: zmq::Context,
}

/// A publishing thread's end: its socket (kept open until the run ends, so
/// that nothing queued is dropped) and when it handed over its last batch.
pub struct Published {
    _socket: zmq::Socket,
    /// When the last batch was queued in libzmq.
    pub done: Instant,
}

impl Engine {
    /// Binds engine `n`'s sockets on loopback, to publish `batches` (in
    /// sequence order from 0).
    pub fn bind(n: usize, batches: Arc<Vec<Vec<u8>>>) -> anyhow::Result<Engine> {
        let ctx = zmq::Context::new();
        let publisher = ctx.socket(zmq::PUB)?;
        publisher.set_sndhwm(0)?;
        // Closing drops whatever is still queued: a run ends once the
        // server has everything, or has given up on it.
        publisher.set_linger(0)?;
        publisher.bind("tcp://127.0.0.1:0")?;
        let router = ctx.socket(zmq::ROUTER)?;
        router.set_linger(0)?;
        // A ROUTER drops what passes its high-water mark: a replay of the
        // whole run must not lose its middle.
        router.set_sndhwm(0)?;
        router.bind("tcp://127.0.0.1:0")?;
        let endpoint = |s: &zmq::Socket| -> anyhow::Result<String> {
            s.get_last_endpoint()?
                .map_err(|_| anyhow::anyhow!("an endpoint that is not UTF-8"))
        };
        let (endpoint, replay) = (endpoint(&publisher)?, endpoint(&router)?);
        let stop = Arc::new(AtomicBool::new(false));
        let published = Arc::new(AtomicUsize::new(0));
        let answered = Arc::new(AtomicUsize::new(0));
        let replayer = Replay {
            batches: batches.clone(),
            published: published.clone(),
            answered: answered.clone(),
            stop: stop.clone(),
        };
        let replier = std::thread::Builder::new()
            .name(format!("{REPLAY_THREAD}{n}"))
            .spawn(move || replayer.run(&router))
            .context("starting a replay thread")?;
        Ok(Engine {
            endpoint,
            replay,
            publisher: Some(publisher),
            batches,
            published,
            answered,
            stop,
            replier: Some(replier),
            _ctx: ctx,
        })
    }

    /// Starts engine `n`'s publishing thread: once `start` opens, it
    /// publishes every batch as fast as libzmq takes them, then waits for
    /// `release` (a thread that ends takes its CPU time out of the
    /// per-thread counts the run reads at its end).
    pub fn start(
        &mut self,
        n: usize,
        start: Arc<Barrier>,
        release: Arc<AtomicBool>,
    ) -> anyhow::Result<JoinHandle<anyhow::Result<Published>>> {
        // The socket moves to the thread (libzmq sockets belong to one
        // thread at a time) and comes back in `Published`.
        let socket = self
            .publisher
            .take()
            .context("the engine has started already")?;
        let (batches, published) = (self.batches.clone(), self.published.clone());
        std::thread::Builder::new()
            .name(format!("{PUBLISH_THREAD}{n}"))
            .spawn(move || {
                start.wait();
                for (seq, payload) in batches.iter().enumerate() {
                    let msg: [&[u8]; 3] = [TOPIC.as_bytes(), &(seq as u64).to_be_bytes(), payload];
                    socket.send_multipart(msg, 0)?;
                    // Relaxed: the replay thread reads only this count; the
                    // batches themselves were written before either thread
                    // started.
                    published.store(seq + 1, Ordering::Relaxed);
                }
                let done = Instant::now();
                // Relaxed: a release flag; the join orders the rest.
                while !release.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(Published {
                    done,
                    _socket: socket,
                })
            })
            .context("starting a publishing thread")
    }

    /// Replay requests this engine has answered.
    pub fn replays_answered(&self) -> usize {
        // Relaxed: a count, read on its own.
        self.answered.load(Ordering::Relaxed)
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        // Relaxed: a stop flag; the join below orders everything else.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.replier.take() {
            let _ = t.join();
        }
    }
}

/// One engine's replay side, run by its own thread.
struct Replay {
    batches: Arc<Vec<Vec<u8>>>,
    published: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Replay {
    /// Answers replay requests (`[id, "", start seq]`) with every batch
    /// published from the start on, then the end marker, until stopped.
    fn run(&self, router: &zmq::Socket) {
        // Relaxed: a stop flag (see `Drop for Engine`).
        while !self.stop.load(Ordering::Relaxed) {
            if !matches!(router.poll(zmq::POLLIN, POLL_MS), Ok(n) if n > 0) {
                continue;
            }
            let Ok(frames) = router.recv_multipart(0) else {
                continue;
            };
            let [id, _, start] = &frames[..] else {
                continue;
            };
            let Ok(start) = <[u8; 8]>::try_from(&start[..]).map(u64::from_be_bytes) else {
                continue;
            };
            let from = usize::try_from(start).unwrap_or(usize::MAX);
            // Relaxed: see where it is stored.
            let upto = self.published.load(Ordering::Relaxed);
            for (seq, payload) in self.batches.iter().enumerate().take(upto).skip(from) {
                let seq = (seq as u64).to_be_bytes();
                let msg: [&[u8]; 5] = [id, b"", TOPIC.as_bytes(), &seq, payload];
                if router.send_multipart(msg, 0).is_err() {
                    break;
                }
            }
            let end: [&[u8]; 5] = [id, b"", b"", &u64::MAX.to_be_bytes(), b""];
            let _ = router.send_multipart(end, 0);
            // Relaxed: a count, read on its own.
            self.answered.fetch_add(1, Ordering::Relaxed);
        }
    }
}
