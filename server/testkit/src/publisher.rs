//! The tests' fake engine, as vLLM's and SGLang's publishers are: a socket
//! bound to a loopback port that sends `[topic, seq, payload]` messages
//! and, optionally, a replay socket answering "every batch from N" from
//! what it published, as vLLM's does (`engine_sim::sockets` speaks both).
//! Its publisher is an XPUB socket, so that a test can wait for the
//! server's subscription before it publishes (a PUB socket drops what it
//! sends before a subscriber is there). With it, the batches such an
//! engine sends for a prompt of its own.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use engine_sim::sockets::{answer_replay, send_live, subscribed, Engine, Replies, ANY_PORT};
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
    replies: Option<Replies>,
}

impl Publisher {
    /// A publisher on a free loopback port, publishing under `topic`.
    pub fn bind(ctx: &zmq::Context, topic: &str) -> Publisher {
        Publisher::bind_at(ctx, topic, ANY_PORT, None)
    }

    /// A publisher and a replay socket, each on a free loopback port.
    pub fn with_replay(ctx: &zmq::Context, topic: &str) -> Publisher {
        Publisher::bind_at(ctx, topic, ANY_PORT, Some(ANY_PORT))
    }

    /// A publisher on `endpoint` and, with `replay`, a replay socket on it
    /// (a restarted engine binds its ports again).
    pub fn bind_at(
        ctx: &zmq::Context,
        topic: &str,
        endpoint: &str,
        replay: Option<&str>,
    ) -> Publisher {
        let engine = Engine::bind(ctx, endpoint, replay).unwrap();
        let buffer = Buffer::default();
        let (replay, replies) = match engine.replay {
            None => (None, None),
            Some(router) => {
                let (buf, topic) = (buffer.clone(), topic.to_string());
                let answer = move |_, router: &zmq::Socket, request: &[Vec<u8>]| {
                    let kept = buf.lock().unwrap().clone();
                    let batches = kept.iter().map(|(seq, p)| (*seq, &p[..]));
                    answer_replay(router, request, topic.as_bytes(), batches).unwrap();
                };
                let replies = Replies::spawn("replay".into(), vec![router.socket], answer).unwrap();
                (Some(router.endpoint), Some(replies))
            }
        };
        Publisher {
            socket: engine.live.socket,
            endpoint: engine.live.endpoint,
            replay,
            topic: topic.into(),
            buffer,
            replies,
        }
    }

    /// Waits until a subscriber's subscription has reached the publisher
    /// (one not waited for yet; at most 10 s: a safety net): until then a
    /// PUB socket drops what it sends to it ("slow joiner"), which a test
    /// publishing a single batch cannot tell from a batch lost on purpose.
    pub fn subscribed(&self) {
        let came = subscribed(&self.socket, Duration::from_secs(10)).unwrap();
        assert!(came, "no subscriber within 10 s");
    }

    /// Publishes `payload` as batch `seq` (and keeps it for replays).
    pub fn publish(&self, seq: u64, payload: &[u8]) {
        send_live(&self.socket, self.topic.as_bytes(), seq, payload).unwrap();
        self.keep(seq, payload);
    }

    /// Keeps `payload` as batch `seq` for replays without sending it: the
    /// PUB socket dropped it for its subscriber.
    pub fn keep(&self, seq: u64, payload: &[u8]) {
        if self.replies.is_some() {
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
        self.socket = Engine::bind(ctx, &self.endpoint, None).unwrap().live.socket;
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
