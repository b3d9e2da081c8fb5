//! A fake engine's KV-event publisher, as vLLM's and SGLang's are: a
//! socket bound to a loopback port that sends `[topic, seq, payload]`
//! messages. An XPUB socket, so that a test can wait for the server's
//! subscription before it publishes (a PUB socket drops what it sends
//! before a subscriber is there). With it, the batches such an engine
//! sends for a prompt of its own.

use prefix_events::{encode_batch, Batch, Event, Stored};

/// One engine's publisher.
pub struct Publisher {
    socket: zmq::Socket,
    /// Its endpoint, `tcp://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The topic it publishes under.
    pub topic: String,
}

impl Publisher {
    /// A publisher on a free loopback port, publishing under `topic`.
    pub fn bind(ctx: &zmq::Context, topic: &str) -> Publisher {
        let socket = ctx.socket(zmq::XPUB).unwrap();
        socket.set_linger(0).unwrap();
        socket.set_xpub_verbose(true).unwrap();
        socket.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = socket.get_last_endpoint().unwrap().unwrap();
        Publisher {
            socket,
            endpoint,
            topic: topic.into(),
        }
    }

    /// Waits until a subscriber is there (at most 10 s: a safety net).
    pub fn subscribed(&self) {
        loop {
            assert!(
                self.socket.poll(zmq::POLLIN, 10_000).unwrap() > 0,
                "no subscriber within 10 s"
            );
            if self.socket.recv_bytes(0).unwrap().first() == Some(&1) {
                return;
            }
        }
    }

    /// Publishes `payload` as batch `seq`.
    pub fn publish(&self, seq: u64, payload: &[u8]) {
        let msg: [&[u8]; 3] = [self.topic.as_bytes(), &seq.to_be_bytes(), payload];
        self.socket.send_multipart(msg, 0).unwrap();
    }

    /// Publishes `payload` as batch 0 once a subscriber is there.
    pub fn publish_when_subscribed(&self, payload: &[u8]) {
        self.subscribed();
        self.publish(0, payload);
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
    encode_batch(&Batch {
        ts: 1.8e9,
        events: vec![Event::Stored(Stored {
            hashes: engine_sim::chain_hashes(&tokens, block),
            parent: None,
            tokens,
            block_size: block as u32,
            medium: Some("GPU".into()),
            ..Default::default()
        })],
        data_parallel_rank: Some(0),
        unknown_events: 0,
        bad: None,
    })
}
