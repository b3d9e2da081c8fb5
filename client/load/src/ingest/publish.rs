//! The engines' side of the ingest benchmark: per engine the sockets of
//! the one fake engine (`engine_sim::sockets`: live batches and replays),
//! bound on loopback through libzmq itself, as vLLM's publisher does
//! through pyzmq, each publishing under a topic of its own
//! (`kv@<pod>@<model>`, llm-d's convention).
//!
//! Engines come in groups (`layout`): a group has a libzmq context, a
//! publishing thread and a replay thread of its own. Up to
//! [`GROUPS`] engines, each engine is a group, as each engine is a process
//! of its own; a fleet larger than that is spread over [`GROUPS`] groups,
//! or more so that no context holds more than [`PER_GROUP`] engines
//! (libzmq allows 1,023 sockets a context), since thousands of threads
//! would measure the machine's scheduler rather than the server.
//!
//! The live socket has no high-water mark: a publisher faster than the
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
use engine_sim::sockets::{answer_replay, replay_start, send_live, Engine, Replies};

/// Name prefix of the publishing threads (CPU time is told apart by name).
pub const PUBLISH_THREAD: &str = "publish-";

/// Name prefix of the replay threads.
const REPLAY_THREAD: &str = "replay-";

/// Where an engine binds its sockets: loopback, free ports.
const LOOPBACK: &str = "tcp://127.0.0.1:0";

/// Groups of engines a fleet is spread over, at least.
pub const GROUPS: usize = 8;

/// Most engines in a group (two sockets each, within libzmq's 1,023 a
/// context).
pub const PER_GROUP: usize = 400;

/// How many groups `n` engines make.
pub fn layout(n: usize) -> usize {
    n.min(GROUPS).max(n.div_ceil(PER_GROUP))
}

/// One engine's endpoints and topic.
#[derive(Debug, Clone)]
pub struct Ends {
    /// Its live (XPUB) endpoint, `tcp://127.0.0.1:port`.
    pub endpoint: String,
    /// Its replay endpoint.
    pub replay: String,
    /// The topic it publishes under.
    pub topic: String,
}

/// A group of engines' sockets, bound; publishing starts with
/// [`Group::start`].
pub struct Group {
    /// The engines' indices in the fleet, in the group's order.
    members: Vec<usize>,
    /// Until [`Group::start`] moves them to its thread.
    publishers: Option<Vec<zmq::Socket>>,
    topics: Arc<Vec<String>>,
    batches: Arc<Vec<Arc<Vec<Vec<u8>>>>>,
    /// Batches handed to each live socket so far.
    published: Arc<Vec<AtomicUsize>>,
    /// Replay requests each engine has answered so far.
    answered: Arc<Vec<AtomicUsize>>,
    /// Dropped before the context: it stops the replay thread, which
    /// holds the ROUTER sockets.
    _replies: Replies,
    // Dropped last: dropping a context waits for its sockets.
    _ctx: zmq::Context,
}

/// A publishing thread's end: its sockets (kept open until the run ends,
/// so that nothing queued is dropped) and when it handed over its last
/// batch.
pub struct Published {
    _sockets: Vec<zmq::Socket>,
    /// When the last batch was queued in libzmq.
    pub done: Instant,
}

impl Group {
    /// Binds group `g`'s sockets on loopback for the engines `members`,
    /// each to publish its `batches` (in sequence order from 0) under its
    /// topic; returns each engine's ends, in `members`' order.
    pub fn bind(
        g: usize,
        members: Vec<usize>,
        topics: Vec<String>,
        batches: Vec<Arc<Vec<Vec<u8>>>>,
    ) -> anyhow::Result<(Group, Vec<Ends>)> {
        let ctx = zmq::Context::new();
        let mut publishers = Vec::with_capacity(members.len());
        let mut routers = Vec::with_capacity(members.len());
        let mut ends = Vec::with_capacity(members.len());
        for topic in &topics {
            let engine = Engine::bind(&ctx, LOOPBACK, Some(LOOPBACK))?;
            let router = engine
                .replay
                .context("an engine without its replay socket")?;
            ends.push(Ends {
                endpoint: engine.live.endpoint,
                replay: router.endpoint,
                topic: topic.clone(),
            });
            publishers.push(engine.live.socket);
            routers.push(router.socket);
        }
        let n = members.len();
        let published: Arc<Vec<AtomicUsize>> =
            Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
        let answered: Arc<Vec<AtomicUsize>> =
            Arc::new((0..n).map(|_| AtomicUsize::new(0)).collect());
        let (topics, batches) = (Arc::new(topics), Arc::new(batches));
        let replay = Replay {
            topics: topics.clone(),
            batches: batches.clone(),
            published: published.clone(),
            answered: answered.clone(),
        };
        let name = format!("{REPLAY_THREAD}{g}");
        let replies = Replies::spawn(name, routers, move |e, router, request| {
            replay.answer(e, router, request)
        })
        .context("starting a replay thread")?;
        let group = Group {
            members,
            publishers: Some(publishers),
            topics,
            batches,
            published,
            answered,
            _replies: replies,
            _ctx: ctx,
        };
        Ok((group, ends))
    }

    /// Starts group `g`'s publishing thread: once `start` opens, it
    /// publishes every engine's batches as fast as libzmq takes them, the
    /// engines' in turn (each engine's n-th batch, then their n+1-th), then
    /// waits for `release` (a thread that ends takes its CPU time out of
    /// the per-thread counts the run reads at its end).
    pub fn start(
        &mut self,
        g: usize,
        start: Arc<Barrier>,
        release: Arc<AtomicBool>,
    ) -> anyhow::Result<JoinHandle<anyhow::Result<Published>>> {
        // The sockets move to the thread (libzmq sockets belong to one
        // thread at a time) and come back in `Published`.
        let sockets = self
            .publishers
            .take()
            .context("the group has started already")?;
        let (topics, batches) = (self.topics.clone(), self.batches.clone());
        let published = self.published.clone();
        std::thread::Builder::new()
            .name(format!("{PUBLISH_THREAD}{g}"))
            .spawn(move || {
                start.wait();
                let longest = batches.iter().map(|b| b.len()).max().unwrap_or(0);
                for seq in 0..longest {
                    for (e, socket) in sockets.iter().enumerate() {
                        let Some(payload) = batches[e].get(seq) else {
                            continue;
                        };
                        send_live(socket, topics[e].as_bytes(), seq as u64, payload)?;
                        // Relaxed: the replay thread reads only this count;
                        // the batches themselves were written before either
                        // thread started.
                        published[e].store(seq + 1, Ordering::Relaxed);
                    }
                }
                let done = Instant::now();
                // Relaxed: a release flag; the join orders the rest.
                while !release.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(Published {
                    done,
                    _sockets: sockets,
                })
            })
            .context("starting a publishing thread")
    }

    /// Whether every batch of the group has been handed to libzmq.
    pub fn published_all(&self) -> bool {
        // Relaxed: counts, read on their own.
        self.published
            .iter()
            .zip(self.batches.iter())
            .all(|(p, b)| p.load(Ordering::Relaxed) >= b.len())
    }

    /// The fleet indices of the engines of this group that have answered
    /// no replay request yet.
    pub fn unanswered(&self) -> impl Iterator<Item = usize> + '_ {
        // Relaxed: counts, read on their own.
        self.members
            .iter()
            .zip(self.answered.iter())
            .filter(|(_, a)| a.load(Ordering::Relaxed) == 0)
            .map(|(m, _)| *m)
    }
}

/// A group's replay side, run by its replay thread.
struct Replay {
    topics: Arc<Vec<String>>,
    batches: Arc<Vec<Arc<Vec<Vec<u8>>>>>,
    published: Arc<Vec<AtomicUsize>>,
    answered: Arc<Vec<AtomicUsize>>,
}

impl Replay {
    /// Answers a replay request (`[id, "", start seq]`) to engine `e`
    /// with every batch it published from the start on, then the end
    /// marker.
    fn answer(&self, e: usize, router: &zmq::Socket, request: &[Vec<u8>]) {
        if replay_start(request).is_none() {
            return;
        }
        // Relaxed: see where it is stored.
        let upto = self.published[e].load(Ordering::Relaxed);
        let batches = self.batches[e].iter().take(upto);
        let numbered = batches.enumerate().map(|(seq, p)| (seq as u64, &p[..]));
        if answer_replay(router, request, self.topics[e].as_bytes(), numbered).is_ok() {
            // Relaxed: a count, read on its own.
            self.answered[e].fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_fleets_are_an_engine_a_group_and_large_ones_fit_contexts() {
        assert_eq!(layout(1), 1);
        assert_eq!(layout(8), 8);
        assert_eq!(layout(100), GROUPS);
        assert_eq!(layout(10_000), 25);
        assert!(10_000usize.div_ceil(layout(10_000)) <= PER_GROUP);
    }
}
