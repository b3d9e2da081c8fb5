//! [`Index`]: the index's operations, written once, over a [`Route`] that
//! decides where each goes.
//!
//! [`Client`](crate::Client) is `Index<Server>`: every op to one server.
//! [`Cluster`](crate::Cluster) is `Index<ReplicaSets>`: each op to the
//! servers it concerns (a lookup to one replica of its model, an insert to
//! every replica, a pod's removal to every server; see
//! [`ReplicaSets`](crate::ReplicaSets)). An operation builds its [`Op`], hands it to the route, and reads
//! the [`Reply`]; so both kinds of gateway have the same calls, with the
//! same arguments and answers, as the `sqlx` pools of each database share
//! theirs. The calls are inherent methods: no trait to import.
//!
//! A route is static: `Client::lookup` compiles to the one server's send
//! and deadline, nothing boxed or dispatched. Code that picks a route at
//! run time (the Python package) erases it behind its own [`Route`].

use std::future::Future;

use crate::error::ClientError;
use crate::wire::{
    EngineState, Op, PodBlocks, PodDetail, PodTiers, Receipt, Reply, SampledKey, Subscription,
    WireStats,
};

/// Where an [`Index`]'s operations go: one server, or a cluster's replica
/// sets. Implement it to put something else under the same calls (a test
/// double, a route chosen at run time).
pub trait Route: Clone + Send + Sync + 'static {
    /// Sends `op` where it belongs and waits for its reply, within the
    /// route's deadline. A refusal ([`Reply::Error`]) is returned as
    /// [`ClientError::Server`], never as a reply.
    fn one(&self, op: Op) -> impl Future<Output = Result<Reply, ClientError>> + Send;

    /// Many operations; one reply each, in the order of `ops`. A failed op
    /// answers [`Reply::Error`] in its place without failing the others.
    fn batch(&self, ops: Vec<Op>) -> impl Future<Output = Result<Vec<Reply>, ClientError>> + Send;
}

/// The answer to a lookup.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LookupResult {
    /// Blocks in the key the server looked up (after its `max_key_blocks` cut).
    pub key_blocks: u32,
    /// Every pod holding at least one leading block, by blocks descending,
    /// then pod name.
    pub matches: Vec<PodBlocks>,
}

/// The answer to a detailed lookup ([`Index::lookup_detail`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DetailResult {
    /// Blocks in the key the server looked up (after its `max_key_blocks` cut).
    pub key_blocks: u32,
    /// The plain answer's pods in its order, each with the blocks a lower
    /// cache tier holds after its match and its view, then pods held by a
    /// lower tier alone.
    pub matches: Vec<PodDetail>,
}

/// The answer to a tiered lookup ([`Index::lookup_tiers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TiersResult {
    /// Blocks in the key the server looked up (after its `max_key_blocks` cut).
    pub key_blocks: u32,
    /// The plain answer's pods in its order, each with how far each of its
    /// lower cache tiers reaches, then pods held by lower tiers alone.
    pub matches: Vec<PodTiers>,
}

/// Writes a server applied, as [`Index::tail`] answers them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Writes {
    /// The position of the first write here: past the one asked when the
    /// server no longer kept those between (they are lost to the asker).
    pub from: u64,
    /// The position to ask from next.
    pub next: u64,
    /// The writes (inserts, pod removals, capacities), in the order the
    /// server applied them.
    pub ops: Vec<Op>,
}

/// The index's operations over the route `R`: see the module's docs.
/// Clones share the route's connections.
#[derive(Clone)]
pub struct Index<R> {
    pub(crate) route: R,
}

impl<R: std::fmt::Debug> std::fmt::Debug for Index<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.route.fmt(f)
    }
}

impl<R> Index<R> {
    /// The operations over `route`.
    pub fn new(route: R) -> Self {
        Index { route }
    }

    /// Where the operations go.
    pub fn route(&self) -> &R {
        &self.route
    }
}

impl<R: Route> Index<R> {
    /// Every pod's matched leading blocks of `key` under `model` (or only the
    /// `candidates`' matches).
    pub async fn lookup(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
    ) -> Result<LookupResult, ClientError> {
        let op = Op::Lookup {
            model: model.into(),
            key: key.to_vec(),
            candidates: candidates.map(|c| c.iter().map(|s| s.to_string()).collect()),
        };
        lookup_result(self.route.one(op).await?)
    }

    /// [`Index::lookup`] by token ids: the key is their hashes in blocks of
    /// `block_tokens` ids ([`key::token_key`](crate::key::token_key)), which
    /// must be the server's `token-block` (default
    /// [`TOKEN_BLOCK_TOKENS`](crate::key::TOKEN_BLOCK_TOKENS)).
    ///
    /// Engine-fed (precise) pods are matched by token keys only: engines
    /// report the token ids of the blocks they cache, and the server hashes
    /// those, so a text key never reaches them.
    pub async fn lookup_tokens(
        &self,
        model: &str,
        tokens: &[u32],
        block_tokens: usize,
        candidates: Option<&[&str]>,
    ) -> Result<LookupResult, ClientError> {
        let key = crate::key::token_key(tokens, block_tokens);
        self.lookup(model, &key, candidates).await
    }

    /// As [`Index::lookup_tokens`], for a request with an identity beyond
    /// its token ids (a cache salt, multimodal items, prompt embeddings):
    /// the key is [`key::token_key_with`](crate::key::token_key_with), so
    /// an engine's salted or multimodal blocks match only the same salt or
    /// items.
    pub async fn lookup_tokens_with(
        &self,
        model: &str,
        tokens: &[u32],
        block_tokens: usize,
        identity: &crate::key::Identity,
        candidates: Option<&[&str]>,
    ) -> Result<LookupResult, ClientError> {
        let key = crate::key::token_key_with(tokens, block_tokens, identity);
        self.lookup(model, &key, candidates).await
    }

    /// As [`Index::lookup`], each pod's answer with the run of blocks a
    /// lower cache tier (CPU memory, storage) holds after its match, and
    /// how far it can be trusted ([`PodDetail`]): what a gateway weighs
    /// when it scores offloaded blocks or falls back to load for a pod
    /// whose view is not exact. About twice a lookup's work on the server.
    pub async fn lookup_detail(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
    ) -> Result<DetailResult, ClientError> {
        let op = Op::LookupDetail {
            model: model.into(),
            key: key.to_vec(),
            candidates: candidates.map(|c| c.iter().map(|s| s.to_string()).collect()),
        };
        match self.route.one(op).await? {
            Reply::Detail {
                key_blocks,
                matches,
            } => Ok(DetailResult {
                key_blocks,
                matches,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// As [`Index::lookup`], each pod's answer with how far each of its
    /// lower cache tiers (CPU memory, storage) reaches ([`PodTiers`]): a
    /// router that weighs a CPU hit below a GPU one needs nothing else.
    /// About twice a lookup's work on the server.
    pub async fn lookup_tiers(
        &self,
        model: &str,
        key: &[u64],
        candidates: Option<&[&str]>,
    ) -> Result<TiersResult, ClientError> {
        let op = Op::LookupTiers {
            model: model.into(),
            key: key.to_vec(),
            candidates: candidates.map(|c| c.iter().map(|s| s.to_string()).collect()),
        };
        match self.route.one(op).await? {
            Reply::Tiers {
                key_blocks,
                matches,
            } => Ok(TiersResult {
                key_blocks,
                matches,
            }),
            other => Err(unexpected(other)),
        }
    }

    /// Records that `pod` holds every prefix of `key` under `model`.
    pub async fn insert(&self, model: &str, key: &[u64], pod: &str) -> Result<(), ClientError> {
        let op = Op::Insert {
            model: model.into(),
            key: key.to_vec(),
            pod: pod.into(),
        };
        done(self.route.one(op).await?)
    }

    /// Reports what `pod`'s engine reused of a request routed there
    /// ([`Receipt`]): the server counts it for the pod, and shows a pod
    /// whose receipts over-predict as `Suspect`. On a cluster it goes to
    /// every replica of the model's set, as inserts do.
    pub async fn receipt(&self, receipt: Receipt) -> Result<(), ClientError> {
        done(self.route.one(Op::Receipt(receipt)).await?)
    }

    /// Forgets a pod everywhere; returns whether the server knew it (on a
    /// cluster: whether any did).
    pub async fn remove_pod(&self, pod: &str) -> Result<bool, ClientError> {
        removed(self.route.one(Op::RemovePod { pod: pod.into() }).await?)
    }

    /// Sets a pod's KV-cache capacity in blocks.
    pub async fn set_pod_capacity(&self, pod: &str, blocks: u64) -> Result<(), ClientError> {
        let op = Op::SetPodCapacity {
            pod: pod.into(),
            blocks,
        };
        done(self.route.one(op).await?)
    }

    /// Makes the server follow an inference engine's KV-cache events
    /// (precise mode), replacing any subscription of the same pod. A writer's
    /// op; refused with `BadSubscription` and the reason when the server
    /// cannot follow it (its block size, its endpoint, `max-engines`).
    pub async fn subscribe_engine(&self, sub: Subscription) -> Result<(), ClientError> {
        done(self.route.one(Op::Subscribe(sub)).await?)
    }

    /// Stops following `pod`'s engine; the server removes the pod with what
    /// it held. Returns whether the server followed it (on a cluster:
    /// whether any did).
    pub async fn unsubscribe_engine(&self, pod: &str) -> Result<bool, ClientError> {
        removed(self.route.one(Op::Unsubscribe { pod: pod.into() }).await?)
    }

    /// Every engine the server follows, by pod name, with its state.
    pub async fn list_engines(&self) -> Result<Vec<EngineState>, ClientError> {
        match self.route.one(Op::ListEngines).await? {
            Reply::Engines(list) => Ok(list),
            other => Err(unexpected(other)),
        }
    }

    /// Up to `count` keys the server's index holds (at most
    /// [`wire::MAX_SAMPLE`](crate::wire::MAX_SAMPLE) per call), picked at
    /// random as `seed` decides.
    pub async fn sample_keys(&self, count: u32, seed: u64) -> Result<Vec<SampledKey>, ClientError> {
        match self.route.one(Op::SampleKeys { count, seed }).await? {
            Reply::Keys(keys) => Ok(keys),
            other => Err(unexpected(other)),
        }
    }

    /// The writes the server applied from position `from` on, at most
    /// `max` (and at most [`wire::MAX_TAIL`](crate::wire::MAX_TAIL)) of
    /// them; with no `from`, the server starts keeping its writes and
    /// answers none, only where the next one will be. See
    /// [`Op::Tail`](crate::wire::Op::Tail).
    pub async fn tail(&self, from: Option<u64>, max: u32) -> Result<Writes, ClientError> {
        match self.route.one(Op::Tail { from, max }).await? {
            Reply::Writes { from, next, ops } => Ok(Writes { from, next, ops }),
            other => Err(unexpected(other)),
        }
    }

    /// One level of the digests of the server's gateway-fed entries (see
    /// [`DigestAsk`](crate::wire::DigestAsk)): what a replica compares
    /// with its own to repair itself. A peer's or a writer's op.
    pub async fn digest(
        &self,
        ask: crate::wire::DigestAsk,
    ) -> Result<crate::wire::DigestAnswer, ClientError> {
        match self.route.one(Op::Digest(ask)).await? {
            Reply::Digest(answer) => Ok(*answer),
            other => Err(unexpected(other)),
        }
    }

    /// The server's index statistics.
    pub async fn stats(&self) -> Result<WireStats, ClientError> {
        match self.route.one(Op::Stats).await? {
            Reply::Stats(s) => Ok(s),
            other => Err(unexpected(other)),
        }
    }

    /// A round trip that touches nothing.
    pub async fn ping(&self) -> Result<(), ClientError> {
        match self.route.one(Op::Ping).await? {
            Reply::Pong => Ok(()),
            other => Err(unexpected(other)),
        }
    }

    /// Many operations in one call; one reply each, in order. A failed op
    /// answers [`Reply::Error`] without failing the others.
    pub async fn batch(&self, ops: Vec<Op>) -> Result<Vec<Reply>, ClientError> {
        self.route.batch(ops).await
    }
}

/// A lookup's reply as its result.
pub(crate) fn lookup_result(reply: Reply) -> Result<LookupResult, ClientError> {
    match reply {
        Reply::Lookup {
            key_blocks,
            matches,
        } => Ok(LookupResult {
            key_blocks,
            matches,
        }),
        other => Err(unexpected(other)),
    }
}

fn done(reply: Reply) -> Result<(), ClientError> {
    match reply {
        Reply::Done => Ok(()),
        other => Err(unexpected(other)),
    }
}

fn removed(reply: Reply) -> Result<bool, ClientError> {
    match reply {
        Reply::Removed(found) => Ok(found),
        other => Err(unexpected(other)),
    }
}

pub(crate) fn unexpected(reply: Reply) -> ClientError {
    ClientError::Protocol(format!("unexpected reply {reply:?}"))
}
