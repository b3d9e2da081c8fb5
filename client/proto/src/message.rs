//! The messages frames carry, and the table of operations.
//!
//! Every operation of the protocol is an [`Op`] variant and has an
//! [`OpKind`]: its name (the metric label, the `op` of a JSON Lines replay
//! line, the CLI's subcommand), whether it changes the index (what a reader
//! certificate may not do) and its weight (what decides whether a server runs
//! it off its async workers). A new operation is added here, and the
//! compiler then points at every place that must handle it.

use bincode::{Decode, Encode};

use crate::pod_name::PodName;

mod digest;
mod engine;
mod receipt;

pub use digest::{
    cell_of, group_of, groups, item, path_root, path_step, pod_hash, DigestAnswer, DigestAsk,
    DigestEntry, DigestLevel, Eviction, ModelDigest, Tombstone, CELLS, CELLS_PER_GROUP, GROUPS,
    MAX_DIGEST_ANSWER, MAX_DIGEST_ASK,
};
pub use engine::{EngineState, EngineStatus, Subscription, SubscriptionError, Tier};
pub use receipt::{Judged, Receipt, ReceiptCounts, ReceiptError, ReceiptOutcome};

/// One operation on the index.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Op {
    /// Each pod's matched leading blocks of `key`, or only the candidates'.
    Lookup {
        /// Model namespace.
        model: String,
        /// Block hashes.
        key: Vec<u64>,
        /// Only these pods, if given (a filter: unknown names are dropped).
        candidates: Option<Vec<String>>,
    },
    /// `pod` now holds every prefix of `key`.
    Insert {
        /// Model namespace.
        model: String,
        /// Block hashes.
        key: Vec<u64>,
        /// The pod.
        pod: String,
    },
    /// Forget a pod everywhere.
    RemovePod {
        /// The pod.
        pod: String,
    },
    /// Set a pod's capacity in blocks (naming the pod if it is new).
    SetPodCapacity {
        /// The pod.
        pod: String,
        /// Capacity in blocks.
        blocks: u64,
    },
    /// Index statistics.
    Stats,
    /// Liveness check.
    Ping,
    /// Follow an inference engine's KV-cache events (precise mode), replacing
    /// any subscription of the same pod.
    Subscribe(Subscription),
    /// Stop following a pod's engine; the pod is removed with what it held.
    Unsubscribe {
        /// The pod.
        pod: String,
    },
    /// Every engine subscription and its state.
    ListEngines,
    /// Up to `count` (at most [`MAX_SAMPLE`]) keys the index holds, each
    /// with its model, picked at random (`seed` decides): what a tool
    /// comparing replicas looks up on each.
    SampleKeys {
        /// Keys wanted.
        count: u32,
        /// Decides the picks.
        seed: u64,
    },
    /// As [`Op::Lookup`], each pod's answer with the blocks a lower cache
    /// tier holds after its match and how far it can be trusted
    /// ([`PodDetail`]).
    LookupDetail {
        /// Model namespace.
        model: String,
        /// Block hashes.
        key: Vec<u64>,
        /// Only these pods, if given (a filter: unknown names are dropped).
        candidates: Option<Vec<String>>,
    },
    /// The writes this server applied (inserts, pod removals, capacities),
    /// in order, from position `from` on: what a replica that filled
    /// itself from this one's snapshot applies after it. With no `from`,
    /// the server starts keeping its writes (if it was not) and answers
    /// where the next one will be, before the snapshot is asked.
    Tail {
        /// The position of the first write wanted (a `Writes` reply's
        /// `next`), or none to start.
        from: Option<u64>,
        /// Most writes wanted (at most [`MAX_TAIL`]).
        max: u32,
    },
    /// As [`Op::Lookup`], each pod's answer with how far each of its lower
    /// cache tiers (CPU memory, storage) reaches ([`PodTiers`]): what a
    /// router that weighs such hits needs, in one call.
    LookupTiers {
        /// Model namespace.
        model: String,
        /// Block hashes.
        key: Vec<u64>,
        /// Only these pods, if given (a filter: unknown names are dropped).
        candidates: Option<Vec<String>>,
    },
    /// One level of the digests of the gateway-fed entries this server
    /// holds ([`DigestAsk`]): what a replica compares with its own to copy
    /// only what differs.
    Digest(DigestAsk),
    /// What an engine reused of a request routed to a pod, beside what
    /// the index predicted ([`Receipt`]): counted per pod, and a pod whose
    /// receipts over-predict is shown `Suspect`.
    Receipt(Receipt),
}

/// Most writes one `Tail` answers (more are not an error: the answer stops
/// there, or where it would pass a quarter of the largest frame).
pub const MAX_TAIL: u32 = 4096;

/// Most keys one `SampleKeys` answers (more are not an error: the answer
/// stops there). 256 keys of the longest length fit well in a frame.
pub const MAX_SAMPLE: u32 = 256;

/// A key the index holds, as `SampleKeys` answers it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct SampledKey {
    /// Its model.
    pub model: String,
    /// Its block hashes, from the root to a leaf of the model's tree.
    pub key: Vec<u64>,
}

/// Which operation an [`Op`] is: the one table every part of the service
/// derives its per-operation behaviour from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// [`Op::Lookup`].
    Lookup,
    /// [`Op::Insert`].
    Insert,
    /// [`Op::RemovePod`].
    RemovePod,
    /// [`Op::SetPodCapacity`].
    SetPodCapacity,
    /// [`Op::Stats`].
    Stats,
    /// [`Op::Ping`].
    Ping,
    /// [`Op::Subscribe`].
    Subscribe,
    /// [`Op::Unsubscribe`].
    Unsubscribe,
    /// [`Op::ListEngines`].
    ListEngines,
    /// [`Op::SampleKeys`].
    SampleKeys,
    /// [`Op::LookupDetail`].
    LookupDetail,
    /// [`Op::Tail`].
    Tail,
    /// [`Op::LookupTiers`].
    LookupTiers,
    /// [`Op::Digest`].
    Digest,
    /// [`Op::Receipt`].
    Receipt,
}

/// What a server charges a pod-table change, in key blocks: removing a pod or
/// naming a new one copies the pod table, which costs about as much as
/// walking 1,024 blocks.
pub const POD_TABLE_WEIGHT: usize = 1024;

/// What a server charges each key of a sample: a descent from the root to
/// a leaf, about a long key's walk.
pub const SAMPLE_WEIGHT: usize = 256;

/// What a server charges a digest question: it walks a model's whole tree
/// (every model's, at level `models`), so it always runs off the async
/// workers.
pub const DIGEST_WEIGHT: usize = 1 << 20;

impl OpKind {
    /// Every operation, in [`OpKind::index`] order (the wire's variant order).
    pub const ALL: [OpKind; 15] = [
        OpKind::Lookup,
        OpKind::Insert,
        OpKind::RemovePod,
        OpKind::SetPodCapacity,
        OpKind::Stats,
        OpKind::Ping,
        OpKind::Subscribe,
        OpKind::Unsubscribe,
        OpKind::ListEngines,
        OpKind::SampleKeys,
        OpKind::LookupDetail,
        OpKind::Tail,
        OpKind::LookupTiers,
        OpKind::Digest,
        OpKind::Receipt,
    ];

    /// Its name in `snake_case`: the metric label, the replay line's `op`,
    /// and (in `kebab-case`) the CLI subcommand.
    pub const fn name(self) -> &'static str {
        match self {
            OpKind::Lookup => "lookup",
            OpKind::Insert => "insert",
            OpKind::RemovePod => "remove_pod",
            OpKind::SetPodCapacity => "set_pod_capacity",
            OpKind::Stats => "stats",
            OpKind::Ping => "ping",
            OpKind::Subscribe => "subscribe",
            OpKind::Unsubscribe => "unsubscribe",
            OpKind::ListEngines => "list_engines",
            OpKind::SampleKeys => "sample_keys",
            OpKind::LookupDetail => "lookup_detail",
            OpKind::Tail => "tail",
            OpKind::LookupTiers => "lookup_tiers",
            OpKind::Digest => "digest",
            OpKind::Receipt => "receipt",
        }
    }

    /// Whether it changes the index, what feeds it or what it says of a
    /// pod (a reader may not send it).
    pub const fn writes(self) -> bool {
        match self {
            OpKind::Insert
            | OpKind::RemovePod
            | OpKind::SetPodCapacity
            | OpKind::Subscribe
            | OpKind::Unsubscribe
            | OpKind::Receipt => true,
            OpKind::Lookup
            | OpKind::Stats
            | OpKind::Ping
            | OpKind::ListEngines
            | OpKind::SampleKeys
            | OpKind::LookupDetail
            | OpKind::Tail
            | OpKind::LookupTiers
            | OpKind::Digest => false,
        }
    }

    /// Whether a server's tail carries it ([`Op::Tail`]): the writes to
    /// the index that gateways send every replica (inserts, pod removals,
    /// capacities), not engine subscriptions, which each replica of a
    /// model is sent itself.
    pub const fn tailed(self) -> bool {
        matches!(
            self,
            OpKind::Insert | OpKind::RemovePod | OpKind::SetPodCapacity
        )
    }

    /// Whether it looks a key up (plain, detailed or tiered): what a
    /// replica that is not up to date refuses.
    pub const fn looks_up(self) -> bool {
        matches!(
            self,
            OpKind::Lookup | OpKind::LookupDetail | OpKind::LookupTiers
        )
    }

    /// Its position in [`OpKind::ALL`], for tables indexed by operation.
    pub const fn index(self) -> usize {
        self as usize
    }
}

/// What the three lookups ([`Op::Lookup`], [`Op::LookupDetail`],
/// [`Op::LookupTiers`]) are given, whichever of them it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LookupArgs<'a> {
    /// Model namespace.
    pub model: &'a str,
    /// Block hashes.
    pub key: &'a [u64],
    /// Only these pods, if given.
    pub candidates: Option<&'a [String]>,
}

impl Op {
    /// A lookup's arguments, whichever of the three lookups it is; `None`
    /// for every other operation.
    pub fn as_lookup(&self) -> Option<LookupArgs<'_>> {
        match self {
            Op::Lookup {
                model,
                key,
                candidates,
            }
            | Op::LookupDetail {
                model,
                key,
                candidates,
            }
            | Op::LookupTiers {
                model,
                key,
                candidates,
            } => Some(LookupArgs {
                model,
                key,
                candidates: candidates.as_deref(),
            }),
            _ => None,
        }
    }

    /// Which operation this is.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Lookup { .. } => OpKind::Lookup,
            Op::Insert { .. } => OpKind::Insert,
            Op::RemovePod { .. } => OpKind::RemovePod,
            Op::SetPodCapacity { .. } => OpKind::SetPodCapacity,
            Op::Stats => OpKind::Stats,
            Op::Ping => OpKind::Ping,
            Op::Subscribe(_) => OpKind::Subscribe,
            Op::Unsubscribe { .. } => OpKind::Unsubscribe,
            Op::ListEngines => OpKind::ListEngines,
            Op::SampleKeys { .. } => OpKind::SampleKeys,
            Op::LookupDetail { .. } => OpKind::LookupDetail,
            Op::Tail { .. } => OpKind::Tail,
            Op::LookupTiers { .. } => OpKind::LookupTiers,
            Op::Digest(_) => OpKind::Digest,
            Op::Receipt(_) => OpKind::Receipt,
        }
    }

    /// How heavy it is to serve, in key blocks or their equivalent: a lookup
    /// walks its key and hashes each candidate name, an insert walks its key,
    /// a pod-table change (engine subscriptions included: they name or
    /// remove an engine-fed pod) costs [`POD_TABLE_WEIGHT`] (a detailed
    /// or tiered lookup is weighed as a lookup), a sample
    /// [`SAMPLE_WEIGHT`] per key asked (at most [`MAX_SAMPLE`]), a tail
    /// one per write asked (at most [`MAX_TAIL`]: copies of them), a digest
    /// [`DIGEST_WEIGHT`], the rest 1 (a receipt too: it reads its key's
    /// length, not its blocks).
    pub fn weight(&self) -> usize {
        match self {
            Op::Lookup {
                key, candidates, ..
            }
            | Op::LookupDetail {
                key, candidates, ..
            }
            | Op::LookupTiers {
                key, candidates, ..
            } => key.len() + candidates.as_ref().map_or(0, Vec::len),
            Op::Insert { key, .. } => key.len(),
            Op::RemovePod { .. }
            | Op::SetPodCapacity { .. }
            | Op::Subscribe(_)
            | Op::Unsubscribe { .. } => POD_TABLE_WEIGHT,
            Op::Stats | Op::Ping | Op::ListEngines | Op::Receipt(_) => 1,
            Op::SampleKeys { count, .. } => (*count).min(MAX_SAMPLE) as usize * SAMPLE_WEIGHT,
            Op::Tail { max, .. } => (*max).clamp(1, MAX_TAIL) as usize,
            Op::Digest(_) => DIGEST_WEIGHT,
        }
    }
}

/// A request payload.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Request {
    /// One operation.
    One(Op),
    /// Many operations, applied in order, answered in order.
    Batch(Vec<Op>),
}

impl Request {
    /// Its operations, in order.
    pub fn ops(&self) -> &[Op] {
        match self {
            Request::One(op) => std::slice::from_ref(op),
            Request::Batch(ops) => ops,
        }
    }

    /// The sum of its operations' weights (see [`Op::weight`]).
    pub fn weight(&self) -> usize {
        self.ops().iter().map(Op::weight).sum()
    }
}

/// One pod's answer to a lookup.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct PodBlocks {
    /// The pod (on the wire, a string).
    pub pod: PodName,
    /// Leading blocks of the key it holds (at least 1).
    pub blocks: u32,
}

/// One pod's answer to a detailed lookup.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct PodDetail {
    /// The pod (on the wire, a string).
    pub pod: PodName,
    /// Leading blocks of the key it holds, as a plain lookup answers (a
    /// tiered pod's on the GPU); 0 when only a lower tier holds any.
    pub blocks: u32,
    /// The run of blocks right after those that a lower cache tier (CPU
    /// memory, storage) holds: the engine reloads them rather than
    /// computing them. 0 unless the pod's subscription follows lower tiers.
    pub lower_blocks: u32,
    /// How far the answer can be trusted.
    pub view: PodView,
    /// For a gateway-fed pod (view `Gateway`), milliseconds since its entry
    /// on the last block it matches was last written: how near it is to
    /// its TTL. 0 for every other view.
    pub age_ms: u64,
}

/// One pod's answer to a tiered lookup.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct PodTiers {
    /// The pod (on the wire, a string).
    pub pod: PodName,
    /// Leading blocks of the key its GPU holds, as a plain lookup answers;
    /// 0 when only a lower tier holds any.
    pub blocks: u32,
    /// Each of its lower tiers, in its subscription's order: empty for a
    /// pod without any.
    pub tiers: Vec<TierReach>,
}

/// How far one lower cache tier of a pod reaches.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct TierReach {
    /// The tier's medium, as the subscription names it (`CPU`, `DISK`).
    pub medium: String,
    /// Leading blocks of the key that the GPU, this tier and the tiers
    /// before it hold (a block counts when any of them holds it): never
    /// less than the pod's `blocks`, nor than the tier before's.
    pub blocks: u32,
}

/// How far a pod's answer can be trusted right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Encode, Decode)]
pub enum PodView {
    /// Fed by gateways' inserts: what was routed there.
    Gateway,
    /// Engine-fed and followed event by event: the engine's cache.
    Exact,
    /// Engine-fed and learning again after events were lost with no replay
    /// to fill them: the engine may hold blocks the answer lacks.
    Learning,
    /// A replay of missed events is running: the answer is behind.
    Replaying,
    /// The engine's event socket is not connected: its recent events are
    /// not known.
    Disconnected,
    /// The match's last blocks rest on a gateway's insert the engine has
    /// not confirmed yet.
    Speculative,
    /// The pod's recent receipts over-predicted: engines reused less than
    /// the index promised, so its answers are likely stale (events lost,
    /// evictions never told). Shown until its receipts agree again.
    Suspect,
}

impl PodView {
    /// Every view, in wire order.
    pub const ALL: [PodView; 7] = [
        PodView::Gateway,
        PodView::Exact,
        PodView::Learning,
        PodView::Replaying,
        PodView::Disconnected,
        PodView::Speculative,
        PodView::Suspect,
    ];

    /// Its name in `snake_case` (JSON, the CLI, metrics).
    pub const fn name(self) -> &'static str {
        match self {
            PodView::Gateway => "gateway",
            PodView::Exact => "exact",
            PodView::Learning => "learning",
            PodView::Replaying => "replaying",
            PodView::Disconnected => "disconnected",
            PodView::Speculative => "speculative",
            PodView::Suspect => "suspect",
        }
    }

    /// Whether the answer is the engine's cache as it is: only an exact
    /// view is.
    pub const fn is_exact(self) -> bool {
        matches!(self, PodView::Exact)
    }
}

/// An index's size, as a `Stats` reply carries it (and the index's own
/// statistics begin with).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Encode, Decode)]
pub struct WireStats {
    /// Models with at least one tree.
    pub models: u64,
    /// Live (named, not removed) pods.
    pub pods: u64,
    /// Tree nodes, roots excluded.
    pub nodes: u64,
    /// Blocks stored in the trees' edges: distinct (model, prefix) blocks.
    pub tree_blocks: u64,
    /// Stored (pod, node block) pairs: what capacities and `max_blocks` bound.
    pub entries: u64,
    /// Heap bytes the index holds, by its own count.
    pub bytes: u64,
}

impl std::ops::AddAssign<&WireStats> for WireStats {
    /// Adds another server's counts (a cluster's sum).
    fn add_assign(&mut self, s: &WireStats) {
        self.models += s.models;
        self.pods += s.pods;
        self.nodes += s.nodes;
        self.tree_blocks += s.tree_blocks;
        self.entries += s.entries;
        self.bytes += s.bytes;
    }
}

/// The answer to one [`Op`].
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Reply {
    /// Answer to a lookup: the key's block count and every matching pod.
    Lookup {
        /// Blocks in the key (the query's length).
        key_blocks: u32,
        /// Pods holding at least one leading block, by blocks descending,
        /// then name.
        matches: Vec<PodBlocks>,
    },
    /// Insert, capacity change or subscription applied.
    Done,
    /// Whether `RemovePod` found the pod live, or `Unsubscribe` the pod
    /// followed.
    Removed(bool),
    /// Statistics.
    Stats(WireStats),
    /// Answer to `Ping`.
    Pong,
    /// The op failed; `code` is an [`ErrorCode`](crate::ErrorCode) number.
    Error {
        /// See [`ErrorCode`](crate::ErrorCode).
        code: u16,
        /// Human-readable detail.
        message: String,
    },
    /// Answer to `ListEngines`: every subscription, by pod name.
    Engines(Vec<EngineState>),
    /// Answer to `SampleKeys`.
    Keys(Vec<SampledKey>),
    /// Answer to `LookupDetail`: the key's block count and every pod with
    /// blocks on its GPU or a lower tier.
    Detail {
        /// Blocks in the key (the query's length).
        key_blocks: u32,
        /// As [`Reply::Lookup`]'s matches, in their order, then pods held
        /// by a lower tier alone, by `lower_blocks` descending.
        matches: Vec<PodDetail>,
    },
    /// Answer to `Tail`: writes at positions `from .. next`, in order.
    /// `from` is past the position asked when the server no longer kept
    /// the writes between (more came than it keeps, or it had stopped
    /// keeping them): those are lost to the asker.
    Writes {
        /// The position of the first write here.
        from: u64,
        /// The position to ask from next.
        next: u64,
        /// The writes.
        ops: Vec<Op>,
    },
    /// Answer to `LookupTiers`: the key's block count and every pod with
    /// blocks on its GPU or a lower tier.
    Tiers {
        /// Blocks in the key (the query's length).
        key_blocks: u32,
        /// As [`Reply::Lookup`]'s matches, in their order, then pods held
        /// by lower tiers alone, by their last tier's reach descending.
        matches: Vec<PodTiers>,
    },
    /// Answer to `Digest` (boxed: the largest answer, kept out of the
    /// others' size).
    Digest(Box<DigestAnswer>),
}

/// A response payload: one reply per op of the request, in order.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub enum Response {
    /// Reply to [`Request::One`].
    One(Reply),
    /// Replies to [`Request::Batch`].
    Batch(Vec<Reply>),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_follows_the_wire_order() {
        let ops = [
            Op::Lookup {
                model: "m".into(),
                key: vec![1, 2],
                candidates: Some(vec!["a".into()]),
            },
            Op::Insert {
                model: "m".into(),
                key: vec![1, 2],
                pod: "a".into(),
            },
            Op::RemovePod { pod: "a".into() },
            Op::SetPodCapacity {
                pod: "a".into(),
                blocks: 1,
            },
            Op::Stats,
            Op::Ping,
            Op::Subscribe(Subscription::new("a", "m", "tcp://h:1")),
            Op::Unsubscribe { pod: "a".into() },
            Op::ListEngines,
            Op::SampleKeys {
                count: 1000,
                seed: 1,
            },
            Op::LookupDetail {
                model: "m".into(),
                key: vec![1, 2, 3],
                candidates: None,
            },
            Op::Tail {
                from: None,
                max: 1 << 20,
            },
            Op::LookupTiers {
                model: "m".into(),
                key: vec![1, 2],
                candidates: None,
            },
            Op::Digest(DigestAsk {
                level: DigestLevel::Models,
                model: String::new(),
                low: 1,
                high: 2,
                of: vec![],
            }),
            Op::Receipt(Receipt {
                model: "m".into(),
                pod: "a".into(),
                key: vec![1, 2],
                ..Receipt::default()
            }),
        ];
        assert_eq!(ops.len(), OpKind::ALL.len());
        for (i, op) in ops.iter().enumerate() {
            assert_eq!(op.kind(), OpKind::ALL[i]);
            assert_eq!(op.kind().index(), i);
            // The wire's variant index is the table's.
            let bytes = bincode::encode_to_vec(op, bincode::config::standard()).unwrap();
            assert_eq!(usize::from(bytes[0]), i);
        }
        let writes: Vec<_> = OpKind::ALL.iter().filter(|k| k.writes()).collect();
        assert_eq!(
            writes,
            [
                &OpKind::Insert,
                &OpKind::RemovePod,
                &OpKind::SetPodCapacity,
                &OpKind::Subscribe,
                &OpKind::Unsubscribe,
                &OpKind::Receipt
            ]
        );
        let weights: Vec<_> = ops.iter().map(Op::weight).collect();
        // A sample is charged for at most MAX_SAMPLE keys.
        let sample = MAX_SAMPLE as usize * SAMPLE_WEIGHT;
        // A tail is charged for at most MAX_TAIL writes.
        let tail = MAX_TAIL as usize;
        assert_eq!(
            weights,
            [
                3,
                2,
                1024,
                1024,
                1,
                1,
                1024,
                1024,
                1,
                sample,
                3,
                tail,
                2,
                DIGEST_WEIGHT,
                1
            ]
        );
        assert_eq!(
            Request::Batch(ops.to_vec()).weight(),
            4110 + sample + tail + DIGEST_WEIGHT
        );
        let names: Vec<_> = OpKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            names[6..],
            [
                "subscribe",
                "unsubscribe",
                "list_engines",
                "sample_keys",
                "lookup_detail",
                "tail",
                "lookup_tiers",
                "digest",
                "receipt"
            ]
        );
        // New replies come after the old ones too.
        let engines = bincode::encode_to_vec(Reply::Engines(vec![]), bincode::config::standard());
        assert_eq!(engines.unwrap(), [6, 0]);
        let keys = bincode::encode_to_vec(Reply::Keys(vec![]), bincode::config::standard());
        assert_eq!(keys.unwrap(), [7, 0]);
        let detail = Reply::Detail {
            key_blocks: 0,
            matches: vec![],
        };
        let detail = bincode::encode_to_vec(detail, bincode::config::standard());
        assert_eq!(detail.unwrap(), [8, 0, 0]);
        let writes = Reply::Writes {
            from: 1,
            next: 1,
            ops: vec![],
        };
        let writes = bincode::encode_to_vec(writes, bincode::config::standard());
        assert_eq!(writes.unwrap(), [9, 1, 1, 0]);
        let tiers = Reply::Tiers {
            key_blocks: 0,
            matches: vec![],
        };
        let tiers = bincode::encode_to_vec(tiers, bincode::config::standard());
        assert_eq!(tiers.unwrap(), [10, 0, 0]);
        let digest =
            bincode::encode_to_vec(Reply::Digest(Box::default()), bincode::config::standard());
        assert_eq!(digest.unwrap(), [11, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Request::One(Op::Ping).ops(), &[Op::Ping]);
    }

    #[test]
    fn subscriptions_read_and_write_one_text_form() {
        let text = "pod=vllm-0,model=Qwen/Qwen3-8B,endpoint=tcp://10.0.0.5:5557,replay=tcp://10.0.0.5:5558,block-size=64,topic=kv,media=GPU+CPU";
        let sub: Subscription = text.parse().unwrap();
        assert_eq!(sub.block_size, 64);
        assert_eq!(sub.media, ["GPU", "CPU"]);
        assert_eq!(sub.to_string().parse::<Subscription>().unwrap(), sub);
        let short: Subscription = "pod=a,model=m,endpoint=tcp://h:1".parse().unwrap();
        assert_eq!(short, Subscription::new("a", "m", "tcp://h:1"));
        for (bad, why) in [
            ("pod=a,model=m", "endpoint= is missing"),
            ("pod=a,model=m,endpoint=ipc:///x", "not tcp://"),
            (
                "pod=a,model=m,endpoint=tcp://h:1,colour=red",
                "unknown key colour",
            ),
            ("pod=a,pod=b,model=m,endpoint=tcp://h:1", "pod given twice"),
            (
                "pod=a,model=m,endpoint=tcp://h:1,block-size=x",
                "not a number",
            ),
        ] {
            let err = bad.parse::<Subscription>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn media_default_to_the_gpu() {
        let sub = Subscription::new("a", "m", "tcp://h:1");
        assert!(sub.routes_medium(Some("gpu")));
        assert!(sub.routes_medium(None));
        assert!(!sub.routes_medium(Some("CPU")));
        assert_eq!(sub.tier(Some("gpu")), Some(Tier::Primary));
        let tiered = Subscription {
            media: vec!["CPU".into(), "GPU".into()],
            ..sub.clone()
        };
        assert_eq!(tiered.tier(Some("GPU")), Some(Tier::Primary));
        assert_eq!(tiered.tier(Some("cpu")), Some(Tier::Lower(0)));
        assert_eq!(tiered.tier(Some("DISK")), None);
        assert_eq!(tiered.tier(Some("DEVICE")), Some(Tier::Primary));
        let three = Subscription {
            media: vec!["GPU".into(), "CPU".into(), "DISK".into()],
            ..sub.clone()
        };
        assert_eq!(three.tier(Some("disk")), Some(Tier::Lower(1)));
        assert_eq!(three.lower_media().collect::<Vec<_>>(), ["CPU", "DISK"]);
        let cpu_only = Subscription {
            media: vec!["CPU".into()],
            ..sub.clone()
        };
        assert_eq!(cpu_only.tier(Some("CPU")), Some(Tier::Primary));
        assert_eq!(cpu_only.tier(None), Some(Tier::Primary));
    }

    #[test]
    fn an_engine_state_is_its_subscription_then_its_status_on_the_wire() {
        let sub = Subscription::new("a", "m", "tcp://h:1");
        let status = EngineStatus {
            last_seq: Some(3),
            last_error: Some("x".into()),
            ..EngineStatus::default()
        };
        let cfg = bincode::config::standard();
        let mut flat = bincode::encode_to_vec(&sub, cfg).unwrap();
        flat.extend(bincode::encode_to_vec(&status, cfg).unwrap());
        let state = EngineState { sub, status };
        assert_eq!(bincode::encode_to_vec(&state, cfg).unwrap(), flat);
    }
}
