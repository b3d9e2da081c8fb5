//! Engine subscriptions: the one description of an engine to follow, in
//! each of its forms, and what a server's follower of it has seen.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use bincode::{Decode, Encode};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// An engine to follow: the one description of an engine subscription.
///
/// Its forms: on the wire (bincode, the `subscribe` op), in JSON (the HTTP
/// API's and replay's `subscribe` object, `"replay"` left out when there is
/// none and the defaults below filled in), on the command line
/// (`prefix-client subscribe`, with the `clap` feature) and as text (the
/// server's `--engine`, [`FromStr`](std::str::FromStr) and
/// [`Display`](std::fmt::Display)):
/// `pod=vllm-0,model=meta-llama/Llama-3.1-8B,endpoint=tcp://10.0.0.5:5557`
/// with optional `replay=tcp://...`, `block-size=16`, `topic=kv-events` and
/// `media=GPU+CPU`.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
pub struct Subscription {
    /// The pod the engine serves (gateways route to this name).
    #[cfg_attr(feature = "clap", arg(long))]
    pub pod: String,
    /// The model it serves; an event's LoRA adapter name overrides it.
    #[cfg_attr(feature = "clap", arg(long, help = "The model it serves"))]
    pub model: String,
    /// The engine's ZeroMQ PUB endpoint, `tcp://host:port`.
    #[cfg_attr(
        feature = "clap",
        arg(long, help = "The engine's ZeroMQ PUB endpoint, tcp://host:port")
    )]
    pub endpoint: String,
    /// The engine's replay (ROUTER) endpoint, if it has one: the server asks
    /// it for missed batches instead of resyncing the pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "clap",
        arg(long, help = "The engine's replay (ROUTER) endpoint, if it has one")
    )]
    pub replay: Option<String>,
    /// Tokens per engine block (vLLM `--block-size`, SGLang `--page-size`).
    #[serde(default = "Subscription::default_block_size")]
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            default_value_t = Subscription::DEFAULT_BLOCK_SIZE,
            help = "Tokens per engine block (vLLM --block-size, SGLang --page-size)"
        )
    )]
    pub block_size: u32,
    /// The ZeroMQ topic to subscribe to (empty: every message).
    #[serde(default)]
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            default_value = "",
            help = "The topic to subscribe to (empty: every message)"
        )
    )]
    pub topic: String,
    /// Cache tiers routed on, e.g. `["GPU"]`; events of other tiers (CPU or
    /// storage offloading) are skipped.
    #[serde(default = "Subscription::default_media")]
    #[cfg_attr(
        feature = "clap",
        arg(
            long,
            value_delimiter = ',',
            default_value = "GPU",
            help = "Cache tiers routed on (comma-separated on the command line; a name with `+` in it is refused by the server)"
        )
    )]
    pub media: Vec<String>,
}

impl Subscription {
    /// The block size when none is given: vLLM's default.
    pub const DEFAULT_BLOCK_SIZE: u32 = 16;

    /// [`Subscription::DEFAULT_BLOCK_SIZE`], for serde.
    fn default_block_size() -> u32 {
        Self::DEFAULT_BLOCK_SIZE
    }

    /// The media when none are given: engines cache in GPU memory; other
    /// tiers are offloads.
    pub fn default_media() -> Vec<String> {
        vec!["GPU".into()]
    }

    /// A subscription of `pod` serving `model` at `endpoint`, every other
    /// field its default.
    pub fn new(
        pod: impl Into<String>,
        model: impl Into<String>,
        endpoint: impl Into<String>,
    ) -> Self {
        Subscription {
            pod: pod.into(),
            model: model.into(),
            endpoint: endpoint.into(),
            replay: None,
            block_size: Self::DEFAULT_BLOCK_SIZE,
            topic: String::new(),
            media: Self::default_media(),
        }
    }

    /// Refuses endpoints other than `tcp://`: the only transport servers
    /// follow engines over (the text form and the `subscribe` op alike).
    pub fn check_endpoints(&self) -> Result<(), SubscriptionError> {
        match std::iter::once(&self.endpoint)
            .chain(&self.replay)
            .find(|e| !e.starts_with("tcp://"))
        {
            Some(e) => Err(SubscriptionError {
                why: format!("endpoint {e} is not tcp://host:port"),
                text: self.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Whether events of this medium are routed on (`None`: the engine did
    /// not say, as older vLLM versions do, which means the GPU).
    pub fn routes_medium(&self, medium: Option<&str>) -> bool {
        self.tier(medium).is_some()
    }

    /// The tier events of this medium feed, if they are routed on: the
    /// GPU's when the subscription lists it (else its first medium's) is
    /// the pod's match; any other listed medium is a lower tier, counted
    /// after it, numbered in the list's order. `None` (the engine did not
    /// say) is the GPU, and so is `DEVICE` (NVIDIA Dynamo's name for it)
    /// when the GPU is listed.
    pub fn tier(&self, medium: Option<&str>) -> Option<Tier> {
        let primary = self.primary_medium();
        let m = match medium {
            None => return Some(Tier::Primary),
            Some(m) if m.eq_ignore_ascii_case(primary) => return Some(Tier::Primary),
            Some(m) if primary == "GPU" && m.eq_ignore_ascii_case("DEVICE") => {
                return Some(Tier::Primary)
            }
            Some(m) => m,
        };
        self.lower_media()
            .position(|x| x.eq_ignore_ascii_case(m))
            .map(|i| Tier::Lower(i as u32))
    }

    /// The medium of the pod's match: the GPU when listed, else the first.
    fn primary_medium(&self) -> &str {
        match self.media.iter().any(|m| m.eq_ignore_ascii_case("GPU")) {
            true => "GPU",
            false => self.media.first().map_or("GPU", String::as_str),
        }
    }

    /// The lower tiers' media, in the order their tiers are numbered.
    pub fn lower_media(&self) -> impl Iterator<Item = &str> {
        let primary = self.primary_medium();
        let mut seen_primary = false;
        self.media.iter().map(String::as_str).filter(move |m| {
            // The primary once, whatever its case; every other medium.
            if m.eq_ignore_ascii_case(primary) && !seen_primary {
                seen_primary = true;
                return false;
            }
            true
        })
    }
}

/// Which of a pod's tiers an engine event of a routed medium feeds (see
/// [`Subscription::tier`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The tier the pod's match is of (the GPU).
    Primary,
    /// A lower tier (CPU memory, storage): counted after the match. Its
    /// index among the subscription's lower tiers
    /// ([`Subscription::lower_media`]).
    Lower(u32),
}

/// Why a subscription is refused as written: its text form does not parse,
/// or a field is not one a server follows.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("engine subscription {text:?}: {why}")]
pub struct SubscriptionError {
    /// The subscription, as text.
    pub text: String,
    /// What is wrong.
    pub why: String,
}

/// The text form (see [`Subscription`]); media are upper-cased, endpoints must
/// be `tcp://`.
impl FromStr for Subscription {
    type Err = SubscriptionError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |why: String| SubscriptionError {
            text: text.into(),
            why,
        };
        let mut fields = BTreeMap::new();
        for part in text.split(',').filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| err(format!("{part:?} is not key=value")))?;
            if fields.insert(k.trim(), v.trim()).is_some() {
                return Err(err(format!("{k} given twice")));
            }
        }
        let mut take = |k: &str| fields.remove(k).map(str::to_string);
        let need = |v: Option<String>, k: &str| {
            v.filter(|v| !v.is_empty())
                .ok_or_else(|| err(format!("{k}= is missing")))
        };
        let sub = Subscription {
            pod: need(take("pod"), "pod")?,
            model: need(take("model"), "model")?,
            endpoint: need(take("endpoint"), "endpoint")?,
            replay: take("replay").filter(|r| !r.is_empty()),
            block_size: match take("block-size") {
                None => Subscription::DEFAULT_BLOCK_SIZE,
                Some(b) => b
                    .parse()
                    .map_err(|_| err(format!("block-size={b} is not a number")))?,
            },
            topic: take("topic").unwrap_or_default(),
            media: match take("media") {
                None => Subscription::default_media(),
                Some(m) => m
                    .split('+')
                    .map(|x| x.trim().to_ascii_uppercase())
                    .collect(),
            },
        };
        if let Some(k) = fields.keys().next() {
            return Err(err(format!(
                "unknown key {k} (pod, model, endpoint, replay, block-size, topic, media)"
            )));
        }
        sub.check_endpoints()?;
        Ok(sub)
    }
}

impl fmt::Display for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "pod={},model={},endpoint={}",
            self.pod, self.model, self.endpoint
        )?;
        if let Some(r) = &self.replay {
            write!(f, ",replay={r}")?;
        }
        write!(f, ",block-size={}", self.block_size)?;
        if !self.topic.is_empty() {
            write!(f, ",topic={}", self.topic)?;
        }
        write!(f, ",media={}", self.media.join("+"))
    }
}

/// One engine subscription and what its follower has seen, as a
/// `ListEngines` reply carries it.
#[derive(Debug, Clone, PartialEq, Eq, Encode, Decode)]
pub struct EngineState {
    /// The subscription.
    pub sub: Subscription,
    /// What its follower has seen.
    pub status: EngineStatus,
}

/// What a server's follower of one engine has seen (on the wire, right
/// after its [`Subscription`] in an [`EngineState`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Encode, Decode)]
pub struct EngineStatus {
    /// Whether the server's socket to the engine is connected.
    pub connected: bool,
    /// The last event batch's sequence number applied, if any.
    pub last_seq: Option<u64>,
    /// Events applied.
    pub events: u64,
    /// Engine blocks stored, as the engine reported them.
    pub blocks_stored: u64,
    /// Engine blocks removed, as the engine reported them.
    pub blocks_removed: u64,
    /// Times the pod was cleared and rebuilt (gaps no replay could fill,
    /// engine restarts).
    pub resyncs: u64,
    /// Replays asked of the engine's replay endpoint.
    pub replays: u64,
    /// Stored blocks whose parent block was unknown (not placed).
    pub orphaned: u64,
    /// Messages that did not decode.
    pub decode_errors: u64,
    /// Milliseconds between the last batch's engine timestamp and its
    /// arrival (negative when the clocks disagree).
    pub lag_ms: i64,
    /// The latest problem, in words.
    pub last_error: Option<String>,
}
