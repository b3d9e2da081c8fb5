//! The tests' fake engine, as vLLM's and SGLang's publishers are: a socket
//! bound to a loopback port that sends `[topic, seq, payload]` messages
//! and, optionally, a replay socket answering "every batch from N" from
//! what it published, as vLLM's does (`engine_sim::sockets` speaks both).
//! Its publisher is an XPUB socket, so that a test can wait for the
//! server's subscription before it publishes (a PUB socket drops what it
//! sends before a subscriber is there). With it, the batches such an
//! engine sends for a prompt of its own.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use engine_sim::sockets::{answer_replay, send_live};
use prefix_events::{encode_batch, Batch, Event, Stored};

/// The batches an engine keeps for replays, by number.
type Buffer = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// One engine's sockets.
pub struct Publisher {
    socket: zmq::Socket,
    /// Its endpoint, `tcp://127.0.0.1:<port>`.
    pub endpoint: String,
    /// Its replay endpoint, if it answers replays.
    pub replay: Option<String>,
    /// The topic it publishes under.
    pub topic: String,
    /// What it published, for replays (kept only with a replay socket).
    buffer: Buffer,
    replier: Option<Replier>,
}

/// The thread answering replays, as vLLM's publisher thread does.
struct Replier {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Replier {
    fn drop(&mut self) {
        // Relaxed: a stop flag; the join orders the rest.
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A socket of `kind` bound to `endpoint`. libzmq closes a socket in its
/// I/O thread: a port a socket had a moment ago may be free only a little
/// later, so a fixed port is tried again for a while.
fn bind(ctx: &zmq::Context, kind: zmq::SocketType, endpoint: &str) -> zmq::Socket {
    let socket = ctx.socket(kind).unwrap();
    socket.set_linger(0).unwrap();
    for _ in 0..250 {
        match socket.bind(endpoint) {
            Ok(()) => return socket,
            Err(zmq::Error::EADDRINUSE) => std::thread::sleep(std::time::Duration::from_millis(20)),
            Err(e) => panic!("bind {endpoint}: {e}"),
        }
    }
    panic!("{endpoint} stays in use");
}

/// An XPUB socket bound to `endpoint` that tells every subscription
/// (verbose: repeats included).
fn xpub(ctx: &zmq::Context, endpoint: &str) -> zmq::Socket {
    let socket = bind(ctx, zmq::XPUB, endpoint);
    socket.set_xpub_verbose(true).unwrap();
    socket
}

fn last_endpoint(socket: &zmq::Socket) -> String {
    socket.get_last_endpoint().unwrap().unwrap()
}

impl Publisher {
    /// A publisher on a free loopback port, publishing under `topic`.
    pub fn bind(ctx: &zmq::Context, topic: &str) -> Publisher {
        Publisher::bind_at(ctx, topic, "tcp://127.0.0.1:*", None)
    }

    /// A publisher and a replay socket, each on a free loopback port.
    pub fn with_replay(ctx: &zmq::Context, topic: &str) -> Publisher {
        Publisher::bind_at(ctx, topic, "tcp://127.0.0.1:*", Some("tcp://127.0.0.1:*"))
    }

    /// A publisher on `endpoint` and, with `replay`, a replay socket on it
    /// (a restarted engine binds its ports again).
    pub fn bind_at(
        ctx: &zmq::Context,
        topic: &str,
        endpoint: &str,
        replay: Option<&str>,
    ) -> Publisher {
        let socket = xpub(ctx, endpoint);
        let buffer = Buffer::default();
        let (replay, replier) = match replay {
            None => (None, None),
            Some(at) => {
                let router = bind(ctx, zmq::ROUTER, at);
                let bound = last_endpoint(&router);
                let stop = Arc::new(AtomicBool::new(false));
                let (buf, halt, topic) = (buffer.clone(), stop.clone(), topic.to_string());
                let thread = std::thread::spawn(move || {
                    // Relaxed: a stop flag.
                    while !halt.load(Ordering::Relaxed) {
                        if router.poll(zmq::POLLIN, 50).unwrap() == 0 {
                            continue;
                        }
                        let request = router.recv_multipart(0).unwrap();
                        let kept = buf.lock().unwrap().clone();
                        let batches = kept.iter().map(|(seq, p)| (*seq, &p[..]));
                        answer_replay(&router, &request, topic.as_bytes(), batches).unwrap();
                    }
                });
                let replier = Replier {
                    stop,
                    thread: Some(thread),
                };
                (Some(bound), Some(replier))
            }
        };
        Publisher {
            endpoint: last_endpoint(&socket),
            socket,
            replay,
            topic: topic.into(),
            buffer,
            replier,
        }
    }

    /// Waits until a subscriber's subscription has reached the publisher
    /// (one not waited for yet; at most 10 s: a safety net): until then a
    /// PUB socket drops what it sends to it ("slow joiner"), which a test
    /// publishing a single batch cannot tell from a batch lost on purpose.
    pub fn subscribed(&self) {
        loop {
            assert!(
                self.socket.poll(zmq::POLLIN, 10_000).unwrap() > 0,
                "no subscriber within 10 s"
            );
            // 1: subscribe; 0: unsubscribe (a subscriber that left).
            if self.socket.recv_bytes(0).unwrap().first() == Some(&1) {
                return;
            }
        }
    }

    /// Publishes `payload` as batch `seq` (and keeps it for replays).
    pub fn publish(&self, seq: u64, payload: &[u8]) {
        send_live(&self.socket, self.topic.as_bytes(), seq, payload).unwrap();
        self.keep(seq, payload);
    }

    /// Keeps `payload` as batch `seq` for replays without sending it: the
    /// PUB socket dropped it for its subscriber.
    pub fn keep(&self, seq: u64, payload: &[u8]) {
        if self.replier.is_some() {
            self.buffer.lock().unwrap().push((seq, payload.to_vec()));
        }
    }

    /// Publishes `payload` as batch 0 once a subscriber is there.
    pub fn publish_when_subscribed(&self, payload: &[u8]) {
        self.subscribed();
        self.publish(0, payload);
    }

    /// Keeps only the newest `keep` batches for replays, as vLLM's bounded
    /// buffer (`buffer_steps` batches) does once more were published.
    pub fn roll(&self, keep: usize) {
        let mut buffer = self.buffer.lock().unwrap();
        let gone = buffer.len().saturating_sub(keep);
        buffer.drain(..gone);
    }

    /// Closes the publisher and binds a new one on its port: to the
    /// subscribers, a network blip (the same engine, its numbers and its
    /// buffer as they were).
    pub fn reconnect(&mut self, ctx: &zmq::Context) {
        // The old socket goes first: the new one needs its port.
        let closed = ctx.socket(zmq::PUB).unwrap();
        drop(std::mem::replace(&mut self.socket, closed));
        self.socket = xpub(ctx, &self.endpoint);
    }
}

/// Engine `i`'s prompt: `blocks` blocks of `block` tokens that no other
/// engine's prompt shares (token ids `1000 * i + t`).
pub fn own_prompt(i: usize, blocks: usize, block: usize) -> Vec<u32> {
    (0..(blocks * block) as u32)
        .map(|t| i as u32 * 1_000 + t)
        .collect()
}

/// One batch storing `tokens` on the GPU as a chain of `block`-token
/// blocks from the root, as vLLM publishes a prefill (data-parallel rank 0).
pub fn stored_batch(tokens: Vec<u32>, block: usize) -> Vec<u8> {
    payload(vec![Event::Stored(Stored {
        hashes: engine_sim::chain_hashes(&tokens, block),
        parent: None,
        tokens,
        block_size: block as u32,
        medium: Some("GPU".into()),
        ..Default::default()
    })])
}

/// A batch of `events`, encoded as vLLM's publisher does (data-parallel
/// rank 0).
pub fn payload(events: Vec<Event>) -> Vec<u8> {
    encode_batch(&Batch {
        ts: 1.8e9,
        events,
        data_parallel_rank: Some(0),
        unknown_events: 0,
        bad: None,
    })
}
