//! A fake engine's KV-event publisher, as vLLM's and SGLang's are: a
//! socket bound to a loopback port that sends `[topic, seq, payload]`
//! messages. An XPUB socket, so that a test can wait for the server's
//! subscription before it publishes (a PUB socket drops what it sends
//! before a subscriber is there).

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
