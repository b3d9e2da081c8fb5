//! The server under test, as the run sees it: its subscriptions'
//! counters, and its CPU time against the engines'.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use engine_sim::BLOCK_TOKENS;
use prefix_client::{Client, ClientConfig};
use prefix_proto::key::token_key;
use prefix_proto::{EngineStatus, Op, Reply};

use super::plan::Check;
use super::publish::PUBLISH_THREAD;
use super::MODEL;
use crate::cpu::{self, ThreadTime, SERVER_THREAD};

/// One subscription's counters, as the server reports them.
#[derive(Debug, Clone, Default)]
pub(super) struct Progress {
    /// Whether its socket is connected to the engine.
    pub(super) connected: bool,
    /// The last sequence number applied, plus one.
    pub(super) next_seq: u64,
    /// Engine blocks stored.
    pub(super) stored: u64,
    /// Engine blocks removed.
    pub(super) removed: u64,
    /// Replays asked for.
    pub(super) replays: u64,
    /// Clears of the pod.
    pub(super) resyncs: u64,
    /// Stores under an unknown parent.
    pub(super) orphaned: u64,
    /// Messages that did not decode.
    pub(super) decode_errors: u64,
}

impl Progress {
    /// The counters of a subscription's state.
    fn of(st: &EngineStatus) -> Progress {
        Progress {
            connected: st.connected,
            next_seq: st.last_seq.map_or(0, |s| s + 1),
            stored: st.blocks_stored,
            removed: st.blocks_removed,
            replays: st.replays,
            resyncs: st.resyncs,
            orphaned: st.orphaned,
            decode_errors: st.decode_errors,
        }
    }
}

/// The server under test.
pub(super) enum Server {
    /// In this process.
    Embedded(Box<crate::embedded::Embedded>),
    /// Elsewhere, through a client.
    Remote(Client),
}

impl Server {
    /// The counters of the subscriptions of `pods`, in that order (a pod
    /// the server does not list yet reads as all zero).
    pub(super) async fn progress(&self, pods: &[String]) -> anyhow::Result<Vec<Progress>> {
        let found: HashMap<String, Progress> = match self {
            Server::Embedded(s) => s
                .engines
                .list()
                .into_iter()
                .map(|(sub, st)| (sub.pod, Progress::of(&st)))
                .collect(),
            Server::Remote(c) => c
                .list_engines()
                .await?
                .into_iter()
                .map(|st| (st.sub.pod, Progress::of(&st.status)))
                .collect(),
        };
        Ok(pods
            .iter()
            .map(|pod| found.get(pod).cloned().unwrap_or_default())
            .collect())
    }

    /// Looks up each check's tokens: how many of them the server matches
    /// exactly as the engine's cache holds them, of how many.
    pub(super) async fn check(
        &self,
        checks: &[Check],
        pods: &[String],
    ) -> anyhow::Result<(usize, usize)> {
        let own;
        let client = match self {
            Server::Remote(c) => c,
            Server::Embedded(s) => {
                let cfg = ClientConfig {
                    tls: s.tls.clone(),
                    deadline: std::time::Duration::from_secs(5),
                    ..ClientConfig::default()
                };
                own = Client::connect(s.addr, cfg).await?;
                &own
            }
        };
        let mut right = 0;
        for c in checks {
            let key = token_key(&c.tokens, BLOCK_TOKENS);
            let got = client.lookup(MODEL, &key, None).await?;
            let blocks = got
                .matches
                .iter()
                .find(|m| m.pod.as_str() == pods[c.engine])
                .map_or(0, |m| m.blocks as usize);
            right += usize::from(blocks == c.blocks);
        }
        Ok((checks.len(), right))
    }

    /// Stops following the engines (their threads end, the pods go),
    /// `batch` ops to a request as they were subscribed.
    pub(super) async fn unsubscribe(&self, pods: &[String], batch: usize) {
        let c = match self {
            Server::Embedded(s) => {
                let pods: Vec<&str> = pods.iter().map(String::as_str).collect();
                s.engines.unsubscribe_all(&pods);
                return;
            }
            Server::Remote(c) => c,
        };
        for chunk in pods.chunks(batch.max(1)) {
            if let [pod] = chunk {
                if let Err(e) = c.unsubscribe_engine(pod).await {
                    tracing::warn!(pod, "unsubscribing: {e}");
                }
                continue;
            }
            let ops = chunk
                .iter()
                .map(|pod| Op::Unsubscribe { pod: pod.clone() })
                .collect();
            match c.batch(ops).await {
                Ok(replies) => {
                    for (pod, reply) in chunk.iter().zip(replies) {
                        if let Reply::Error { code, message } = reply {
                            tracing::warn!(pod, "unsubscribing: {code:?}: {message}");
                        }
                    }
                }
                Err(e) => tracing::warn!(pods = chunk.len(), "unsubscribing: {e}"),
            }
        }
    }
}

/// CPU time by side, summed over threads.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Split {
    /// The server's subscription threads.
    pub(super) subscriptions: Duration,
    /// The server's libzmq threads.
    pub(super) server_zmq: Duration,
    /// The server's runtime.
    pub(super) server_runtime: Duration,
    /// The engines: publishing, replay and libzmq threads.
    pub(super) publishers: Duration,
}

/// Sorts threads by side. The engines' side: the publishing threads, and
/// the threads that appeared while their sockets were bound (`engines`:
/// replay threads, libzmq's I/O and reaper threads). The server's side:
/// its runtime, its engine threads and its libzmq threads, each named so.
pub(super) fn split(threads: &[ThreadTime], engines: &HashSet<i32>) -> Split {
    let mut s = Split::default();
    for t in threads {
        let slot = if t.name.starts_with(PUBLISH_THREAD) || engines.contains(&t.tid) {
            &mut s.publishers
        } else if t.name == SERVER_THREAD {
            &mut s.server_runtime
        } else if t.name.starts_with(ENGINE_THREAD) {
            &mut s.subscriptions
        } else if t.name == prefix_server::ENGINE_ZMQ_THREADS {
            &mut s.server_zmq
        } else {
            continue;
        };
        *slot += t.cpu;
    }
    s
}

/// The name prefix of the server's engine threads.
const ENGINE_THREAD: &str = "engine-shard-";

/// The ids of this process's threads.
pub(super) fn thread_ids() -> HashSet<i32> {
    cpu::threads()
        .unwrap_or_default()
        .iter()
        .map(|t| t.tid)
        .collect()
}
