//! The protocol's operations as JSON, without I/O: the bodies of the
//! server's HTTP API and the lines of `prefix-client replay`.
//!
//! One [`JsonOp`] per operation of the table ([`OpKind`]), tagged by its
//! name:
//!
//! ```text
//! {"op":"insert","model":M,"text":T,"pod":P}      ("tokens":[..] or "hashes":[..] instead of "text")
//! {"op":"lookup","model":M,"text":T,"candidates":[..]}   (candidates optional)
//! {"op":"remove_pod","pod":P}
//! {"op":"set_pod_capacity","pod":P,"blocks":N}
//! {"op":"stats"}
//! {"op":"ping"}
//! {"op":"subscribe","pod":P,"model":M,"endpoint":E}   (optional: "replay":E, "block_size":16, "topic":"", "media":["GPU"])
//! {"op":"unsubscribe","pod":P}
//! {"op":"list_engines"}
//! {"op":"receipt","model":M,"tokens":[..],"pod":P,"predicted_blocks":N,"cached_tokens":T}   (optional: "prompt_tokens")
//! ```
//!
//! The HTTP API takes the same objects without `"op"` (the route names it),
//! and a batch as `{"ops":[...]}`. Parsing is strict: a field the op does not
//! have is refused, as is a wrong type or a second key source. Keys are
//! hashed here with the rule of [`crate::key`], so a gateway in any language
//! can send text or token ids and leave hashing to the other end.
//!
//! Every answer is one object: `{"ok":true,...}` with the reply's fields
//! ([`reply_json`]), or `{"ok":false,"error":{"code":N,"name":S,"message":M}}`
//! with the protocol's [`ErrorCode`] ([`error_json`]).

use std::sync::OnceLock;

use serde::{Deserialize, Serialize};

use thiserror::Error;

use crate::error::ErrorCode;
use crate::key;
use crate::message::{DigestAsk, DigestLevel, Op, OpKind, Receipt, Reply, Request, Subscription};

/// How text and token ids become block hashes; every gateway of a model
/// must agree on these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyOptions {
    /// Bytes per text block (default 64).
    pub block_bytes: usize,
    /// Token ids per token block (default 16).
    pub block_tokens: usize,
}

impl Default for KeyOptions {
    fn default() -> Self {
        KeyOptions {
            block_bytes: key::TEXT_BLOCK_BYTES,
            block_tokens: key::TOKEN_BLOCK_TOKENS,
        }
    }
}

/// A key given as text, token ids or ready hashes (exactly one). On the
/// command line, `--text`, `--tokens 1,2,3` or `--hashes 7,8`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
// The group's members are named: clap leaves a group with a flattened
// field empty.
#[cfg_attr(
    feature = "clap",
    group(required = true, multiple = false, args = ["text", "tokens", "hashes"])
)]
pub struct KeySource {
    /// Prompt text, hashed in blocks of `block_bytes` (--block-bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long))]
    pub text: Option<String>,
    /// Token ids (comma-separated on the command line), hashed in blocks of
    /// `block_tokens` (--block-tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub tokens: Option<Vec<u32>>,
    /// Block hashes (comma-separated on the command line), used as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub hashes: Option<Vec<u64>>,
    /// With `tokens`: what else identifies the request's blocks.
    #[serde(flatten)]
    #[cfg_attr(feature = "clap", command(flatten))]
    pub identity: TokenIdentity,
}

/// A token key's identity beyond its ids ([`key::Identity`]), as JSON
/// fields and command-line flags: only with `tokens`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::Args))]
// No group of its own: these flags go with `--tokens`, outside the key's
// one-of group.
#[cfg_attr(feature = "clap", group(skip))]
pub struct TokenIdentity {
    /// The request's `cache_salt`, as given to vLLM: a salted engine's
    /// blocks match only keys with the same salt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long))]
    pub cache_salt: Option<String>,
    /// The request's multimodal items, `{"identifier", "offset",
    /// "length"}` in token positions, the identifier being the request's
    /// `multi_modal_uuids` entry (or vLLM's item hash). On the command
    /// line, `--mm-item IDENTIFIER:OFFSET:LENGTH`, once per item.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long = "mm-item"))]
    pub mm_items: Option<Vec<key::MmItem>>,
    /// With prompt embeddings: each block's digest of them, in hex (vLLM:
    /// SHA-256 of the block's tensor bytes); comma-separated on the
    /// command line. The key stops after the last block with a digest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
    pub prompt_embeds: Option<Vec<String>>,
}

impl TokenIdentity {
    /// Whether any field is given.
    pub fn is_given(&self) -> bool {
        self.cache_salt.is_some() || self.mm_items.is_some() || self.prompt_embeds.is_some()
    }

    /// The identity these fields describe, or why they do not.
    pub fn identity(&self) -> Result<key::Identity, JsonError> {
        let prompt_embeds = match &self.prompt_embeds {
            None => None,
            Some(digests) => Some(
                digests
                    .iter()
                    .enumerate()
                    .map(|(i, d)| {
                        hex(d).ok_or_else(|| {
                            JsonError::new(format!(
                                "prompt_embeds[{i}]: a digest is hex with an even number of digits"
                            ))
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(key::Identity {
            cache_salt: self.cache_salt.clone(),
            mm_items: self.mm_items.clone().unwrap_or_default(),
            prompt_embeds,
        })
    }
}

/// The bytes of an even-length hex string.
fn hex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

impl KeySource {
    /// The block hashes (moved, when given as hashes), or why there are
    /// none.
    pub fn into_key(self, opts: &KeyOptions) -> Result<Vec<u64>, JsonError> {
        match self {
            KeySource {
                text: None,
                tokens: None,
                hashes: Some(h),
                identity,
            } if !identity.is_given() => Ok(h),
            other => other.key(opts),
        }
    }

    /// The block hashes, or why there are none.
    pub fn key(&self, opts: &KeyOptions) -> Result<Vec<u64>, JsonError> {
        if self.tokens.is_none() && self.identity.is_given() {
            return Err(JsonError::new(
                "\"cache_salt\", \"mm_items\" and \"prompt_embeds\" go with \"tokens\"",
            ));
        }
        match (&self.text, &self.tokens, &self.hashes) {
            (Some(t), None, None) => Ok(key::text_key(t, opts.block_bytes)),
            (None, Some(t), None) => Ok(key::token_key_with(
                t,
                opts.block_tokens,
                &self.identity.identity()?,
            )),
            (None, None, Some(h)) => Ok(h.clone()),
            (None, None, None) => Err(JsonError::new(
                "give one of \"text\", \"tokens\" or \"hashes\"",
            )),
            _ => Err(JsonError::new(
                "give only one of \"text\", \"tokens\" or \"hashes\"",
            )),
        }
    }
}

/// One operation as JSON (a replay line, an HTTP body), and one
/// `prefix-client` subcommand: one variant per operation of the protocol,
/// named by its [`OpKind::name`].
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[cfg_attr(feature = "clap", derive(clap::Subcommand))]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum JsonOp {
    /// Record that a pod holds every prefix of a key.
    Insert {
        /// Model name.
        #[cfg_attr(feature = "clap", arg(long))]
        model: String,
        /// The key.
        #[serde(flatten)]
        #[cfg_attr(feature = "clap", command(flatten))]
        key: KeySource,
        /// Pod name.
        #[cfg_attr(feature = "clap", arg(long))]
        pod: String,
    },
    /// Each pod's matched leading blocks of a key.
    Lookup {
        /// Model name.
        #[cfg_attr(feature = "clap", arg(long))]
        model: String,
        /// The key.
        #[serde(flatten)]
        #[cfg_attr(feature = "clap", command(flatten))]
        key: KeySource,
        /// Only these pods (comma-separated on the command line).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
        candidates: Option<Vec<String>>,
    },
    /// Forget a pod everywhere.
    RemovePod {
        /// Pod name.
        pod: String,
    },
    /// Set a pod's KV-cache capacity in blocks.
    SetPodCapacity {
        /// Pod name.
        pod: String,
        /// Capacity in blocks.
        blocks: u64,
    },
    /// Index statistics.
    Stats,
    /// Round trip to the server.
    Ping,
    /// Follow an inference engine's KV-cache events (precise mode).
    Subscribe {
        /// The engine.
        #[serde(flatten)]
        #[cfg_attr(feature = "clap", command(flatten))]
        engine: Subscription,
    },
    /// Stop following a pod's engine (the pod is removed).
    Unsubscribe {
        /// Pod name.
        #[cfg_attr(feature = "clap", arg(long))]
        pod: String,
    },
    /// Every engine followed, with its state.
    ListEngines,
    /// Keys the index holds, picked at random (to look up on replicas).
    SampleKeys {
        /// Keys wanted (at most 256 are answered).
        #[cfg_attr(feature = "clap", arg(long, default_value_t = 16))]
        count: u32,
        /// Decides the picks.
        #[serde(default)]
        #[cfg_attr(feature = "clap", arg(long, default_value_t = 0))]
        seed: u64,
    },
    /// As lookup, each pod with the blocks a lower cache tier holds after
    /// its match and how far its answer can be trusted.
    LookupDetail {
        /// Model name.
        #[cfg_attr(feature = "clap", arg(long))]
        model: String,
        /// The key.
        #[serde(flatten)]
        #[cfg_attr(feature = "clap", command(flatten))]
        key: KeySource,
        /// Only these pods (comma-separated on the command line).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
        candidates: Option<Vec<String>>,
    },
    /// As lookup, each pod with how far each of its lower cache tiers
    /// (CPU memory, storage) reaches.
    LookupTiers {
        /// Model name.
        #[cfg_attr(feature = "clap", arg(long))]
        model: String,
        /// The key.
        #[serde(flatten)]
        #[cfg_attr(feature = "clap", command(flatten))]
        key: KeySource,
        /// Only these pods (comma-separated on the command line).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "clap", arg(long, value_delimiter = ','))]
        candidates: Option<Vec<String>>,
    },
    /// The writes the server applied from a position on (what a replica
    /// filled from its snapshot applies after it); without `from`, start
    /// keeping them and say where the next one will be.
    Tail {
        /// The position of the first write wanted (an answer's `next`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "clap", arg(long))]
        from: Option<u64>,
        /// Most writes wanted (at most 4,096 are answered).
        #[cfg_attr(feature = "clap", arg(long, default_value_t = 256))]
        max: u32,
    },
    /// One level of the digests of the gateway-fed entries (what replicas
    /// compare to repair each other).
    Digest {
        /// The question.
        #[serde(flatten)]
        #[cfg_attr(feature = "clap", command(flatten))]
        ask: DigestAsk,
    },
    /// What an engine reused of a request routed to a pod, beside what the
    /// lookup predicted for it (counted per pod; see `lookup-detail`).
    Receipt {
        /// Model name, as the lookup named it.
        #[cfg_attr(feature = "clap", arg(long))]
        model: String,
        /// The key looked up.
        #[serde(flatten)]
        #[cfg_attr(feature = "clap", command(flatten))]
        key: KeySource,
        /// The pod the request went to.
        #[cfg_attr(feature = "clap", arg(long))]
        pod: String,
        /// The blocks the lookup answered for the pod when the gateway
        /// routed.
        #[cfg_attr(feature = "clap", arg(long))]
        predicted_blocks: u32,
        /// The tokens the engine reported reusing (vLLM:
        /// `usage.prompt_tokens_details.cached_tokens`).
        #[cfg_attr(feature = "clap", arg(long))]
        cached_tokens: u32,
        /// The prompt's length in tokens, when the key is not its tokens
        /// (with `tokens`, their count).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[cfg_attr(feature = "clap", arg(long))]
        prompt_tokens: Option<u32>,
    },
}

/// Why a JSON body or line is not an operation. Answered with
/// [`ErrorCode::Malformed`].
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{0}")]
pub struct JsonError(String);

impl JsonError {
    fn new(message: impl Into<String>) -> Self {
        JsonError(message.into())
    }

    /// This error as a reply.
    pub fn to_reply(&self) -> Reply {
        ErrorCode::Malformed.reply(self)
    }
}

/// The fields each operation's object may have (besides `"op"`), in the
/// order its errors list them: the ones its parse reads. Parsing refuses
/// others, which serde cannot do for objects with flattened parts.
pub fn fields(kind: OpKind) -> &'static [&'static str] {
    static FIELDS: OnceLock<[Vec<&'static str>; OpKind::ALL.len()]> = OnceLock::new();
    &FIELDS.get_or_init(|| OpKind::ALL.map(Fields::read_by))[kind.index()]
}

/// The operation named `name` ([`OpKind::name`]).
pub fn kind_named(name: &str) -> Option<OpKind> {
    OpKind::ALL.into_iter().find(|k| k.name() == name)
}

impl JsonOp {
    /// The operation this is.
    pub fn kind(&self) -> OpKind {
        match self {
            JsonOp::Insert { .. } => OpKind::Insert,
            JsonOp::Lookup { .. } => OpKind::Lookup,
            JsonOp::RemovePod { .. } => OpKind::RemovePod,
            JsonOp::SetPodCapacity { .. } => OpKind::SetPodCapacity,
            JsonOp::Stats => OpKind::Stats,
            JsonOp::Ping => OpKind::Ping,
            JsonOp::Subscribe { .. } => OpKind::Subscribe,
            JsonOp::Unsubscribe { .. } => OpKind::Unsubscribe,
            JsonOp::ListEngines => OpKind::ListEngines,
            JsonOp::SampleKeys { .. } => OpKind::SampleKeys,
            JsonOp::LookupDetail { .. } => OpKind::LookupDetail,
            JsonOp::Tail { .. } => OpKind::Tail,
            JsonOp::LookupTiers { .. } => OpKind::LookupTiers,
            JsonOp::Digest { .. } => OpKind::Digest,
            JsonOp::Receipt { .. } => OpKind::Receipt,
        }
    }

    /// One operation from its object, which names it with `"op"`.
    pub fn parse(bytes: &[u8]) -> Result<JsonOp, JsonError> {
        JsonOp::parse_fields(bytes, None)
    }

    /// One operation of kind `kind` from its object without `"op"` (an HTTP
    /// body: the route names the operation).
    pub fn parse_as(kind: OpKind, bytes: &[u8]) -> Result<JsonOp, JsonError> {
        JsonOp::parse_fields(bytes, Some(kind))
    }

    /// Parses straight into typed fields (keys into `Vec`s, no JSON tree in
    /// between: memory stays near the body's size), then keeps only an
    /// object whose fields are its op's.
    fn parse_fields(bytes: &[u8], kind: Option<OpKind>) -> Result<JsonOp, JsonError> {
        // serde would also take the fields as an array, by position: only
        // an object is an op.
        if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return Err(JsonError::new("expected a JSON object of an op's fields"));
        }
        let f: Fields =
            ids::from_slice(bytes, "tokens", |f: &mut Fields, ids| f.tokens = Some(ids)).map_err(
                |e| {
                    let what = if e.is_syntax() || e.is_eof() {
                        "bad JSON"
                    } else {
                        "bad object"
                    };
                    JsonError::new(format!("{what}: {e}"))
                },
            )?;
        let kind = match (kind, f.op.as_deref()) {
            (Some(_), Some(_)) => {
                return Err(JsonError::new(
                    "unknown field \"op\": the path names the operation",
                ))
            }
            (Some(kind), None) => kind,
            (None, Some(name)) => kind_named(name).ok_or_else(|| {
                JsonError::new(format!("unknown op {name:?}; the ops are {}", op_names()))
            })?,
            (None, None) => {
                return Err(JsonError::new(format!(
                    "missing field \"op\"; one of {}",
                    op_names()
                )))
            }
        };
        f.into_op(kind)
    }
    /// The protocol operation, with its key hashed by `opts`, moving what
    /// it can (a key of hashes is not copied).
    pub fn into_op(self, opts: &KeyOptions) -> Result<Op, JsonError> {
        Ok(match self {
            JsonOp::Insert { model, key, pod } => Op::Insert {
                model,
                key: key.into_key(opts)?,
                pod,
            },
            JsonOp::Lookup {
                model,
                key,
                candidates,
            } => Op::Lookup {
                model,
                key: key.into_key(opts)?,
                candidates,
            },
            JsonOp::LookupDetail {
                model,
                key,
                candidates,
            } => Op::LookupDetail {
                model,
                key: key.into_key(opts)?,
                candidates,
            },
            JsonOp::LookupTiers {
                model,
                key,
                candidates,
            } => Op::LookupTiers {
                model,
                key: key.into_key(opts)?,
                candidates,
            },
            JsonOp::RemovePod { pod } => Op::RemovePod { pod },
            JsonOp::SetPodCapacity { pod, blocks } => Op::SetPodCapacity { pod, blocks },
            JsonOp::Stats => Op::Stats,
            JsonOp::Ping => Op::Ping,
            JsonOp::Subscribe { engine } => Op::Subscribe(engine),
            JsonOp::Unsubscribe { pod } => Op::Unsubscribe { pod },
            JsonOp::ListEngines => Op::ListEngines,
            JsonOp::SampleKeys { count, seed } => Op::SampleKeys { count, seed },
            JsonOp::Tail { from, max } => Op::Tail { from, max },
            JsonOp::Digest { ask } => Op::Digest(ask),
            JsonOp::Receipt {
                model,
                key,
                pod,
                predicted_blocks,
                cached_tokens,
                prompt_tokens,
            } => {
                let counted = key.tokens.as_ref().map(|t| t.len());
                let prompt_tokens = match (prompt_tokens, counted) {
                    (Some(given), Some(n)) if given as usize != n => {
                        return Err(JsonError::new(format!(
                            "prompt_tokens {given} is not the {n} tokens given"
                        )))
                    }
                    (Some(given), _) => Some(given),
                    (None, n) => n.map(|n| u32::try_from(n).unwrap_or(u32::MAX)),
                };
                Op::Receipt(Receipt {
                    model,
                    pod,
                    key: key.into_key(opts)?,
                    prompt_tokens,
                    predicted_blocks,
                    cached_tokens,
                })
            }
        })
    }

    /// The protocol operation, with its key hashed by `opts`.
    pub fn to_op(&self, opts: &KeyOptions) -> Result<Op, JsonError> {
        self.clone().into_op(opts)
    }
}

/// A batch body, `{"ops":[op, ...]}`, each op an object naming itself with
/// `"op"`, as a request (hashed by `opts`). The list is cut into its ops'
/// raw text first: more than `max_batch` ops are refused before any is
/// parsed.
pub fn parse_batch(bytes: &[u8], opts: &KeyOptions, max_batch: usize) -> Result<Request, Reply> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Batch<'a> {
        #[serde(borrow)]
        ops: Vec<&'a serde_json::value::RawValue>,
    }
    let batch: Batch<'_> = serde_json::from_slice(bytes)
        .map_err(|e| JsonError::new(format!("a batch is {{\"ops\":[...]}}: {e}")).to_reply())?;
    if batch.ops.len() > max_batch {
        return Err(ErrorCode::BatchTooLarge.reply(format!(
            "batch of {} ops exceeds max_batch = {max_batch}",
            batch.ops.len()
        )));
    }
    let ops = batch
        .ops
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            JsonOp::parse(raw.get().as_bytes())
                .and_then(|op| op.into_op(opts))
                .map_err(|e| JsonError::new(format!("ops[{i}]: {e}")).to_reply())
        })
        .collect::<Result<Vec<Op>, Reply>>()?;
    crate::limits::check_digests(&ops).map_err(|e| e.to_reply())?;
    Ok(Request::Batch(ops))
}

/// Declares [`Fields`], its `given()` and its `every()` from one list of
/// the fields, so that a field added to one is in the others.
macro_rules! op_fields {
    ($($name:ident: $ty:ty,)*) => {
        /// Every field any op has, typed: what a body parses into before
        /// its op's fields are checked. Unknown fields and repeated ones are
        /// refused here.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields, expecting = "a JSON object of an op's fields")]
        struct Fields {
            op: Option<String>,
            $($name: Option<$ty>,)*
            /// The names of the fields taken, when they are noted (see
            /// [`fields`]).
            #[serde(skip)]
            read: Option<Vec<&'static str>>,
        }

        impl Fields {
            /// The names of the fields given (besides `"op"`).
            fn given(&self) -> impl Iterator<Item = &'static str> + '_ {
                [$((stringify!($name), self.$name.is_some()),)*]
                    .into_iter()
                    .filter_map(|(name, given)| given.then_some(name))
            }

            /// Every field given (with its type's default), noting which
            /// are taken.
            fn every() -> Fields {
                Fields {
                    op: None,
                    $($name: Some(Default::default()),)*
                    read: Some(Vec::new()),
                }
            }
        }
    };
}

op_fields! {
    model: String,
    text: String,
    tokens: Vec<u32>,
    hashes: Vec<u64>,
    cache_salt: String,
    mm_items: Vec<key::MmItem>,
    prompt_embeds: Vec<String>,
    candidates: Vec<String>,
    pod: String,
    blocks: u64,
    endpoint: String,
    replay: String,
    block_size: u32,
    topic: String,
    media: Vec<String>,
    count: u32,
    seed: u64,
    from: u64,
    max: u32,
    level: DigestLevel,
    low: u64,
    high: u64,
    of: Vec<u64>,
    predicted_blocks: u32,
    cached_tokens: u32,
    prompt_tokens: u32,
}

/// Takes field `$name` of `$fields` (`Option`al), noting its name where
/// [`Fields::read_by`] asks: an op's fields are the ones its parse takes.
macro_rules! take {
    ($fields:ident . $name:ident) => {{
        if let Some(read) = &mut $fields.read {
            read.push(stringify!($name));
        }
        $fields.$name.take()
    }};
}

impl Fields {
    /// The op of kind `kind`, if every field given is one of its own and
    /// every field it needs is given.
    fn into_op(mut self, kind: OpKind) -> Result<JsonOp, JsonError> {
        let allowed = fields(kind);
        if let Some(extra) = self.given().find(|f| !allowed.contains(f)) {
            return Err(JsonError::new(format!(
                "unknown field \"{extra}\" for {}; its fields are {}",
                kind.name(),
                if allowed.is_empty() {
                    "none".into()
                } else {
                    allowed.join(", ")
                }
            )));
        }
        self.take(kind)
    }

    /// The names of the fields an op of kind `kind` takes, in order.
    fn read_by(kind: OpKind) -> Vec<&'static str> {
        let mut every = Fields::every();
        // Every field is given, so nothing is missing and every take runs.
        let _ = every.take(kind);
        every.read.unwrap_or_default()
    }

    /// The key's fields.
    fn key(&mut self) -> KeySource {
        KeySource {
            text: take!(self.text),
            tokens: take!(self.tokens),
            hashes: take!(self.hashes),
            identity: TokenIdentity {
                cache_salt: take!(self.cache_salt),
                mm_items: take!(self.mm_items),
                prompt_embeds: take!(self.prompt_embeds),
            },
        }
    }

    /// The op of kind `kind` from its fields: required ones missing are
    /// refused, others take their defaults.
    fn take(&mut self, kind: OpKind) -> Result<JsonOp, JsonError> {
        // Takes a required field: `{op}: missing field `{name}`` without it.
        macro_rules! need {
            ($name:ident) => {
                take!(self.$name).ok_or_else(|| {
                    let name = stringify!($name);
                    JsonError::new(format!("{}: missing field `{name}`", kind.name()))
                })?
            };
        }
        // The three lookups take the same fields.
        macro_rules! lookup {
            ($variant:ident) => {
                JsonOp::$variant {
                    model: need!(model),
                    key: self.key(),
                    candidates: take!(self.candidates),
                }
            };
        }
        Ok(match kind {
            OpKind::Lookup => lookup!(Lookup),
            OpKind::Insert => JsonOp::Insert {
                model: need!(model),
                key: self.key(),
                pod: need!(pod),
            },
            OpKind::RemovePod => JsonOp::RemovePod { pod: need!(pod) },
            OpKind::SetPodCapacity => JsonOp::SetPodCapacity {
                pod: need!(pod),
                blocks: need!(blocks),
            },
            OpKind::Stats => JsonOp::Stats,
            OpKind::Ping => JsonOp::Ping,
            OpKind::Subscribe => JsonOp::Subscribe {
                engine: Subscription {
                    pod: need!(pod),
                    model: need!(model),
                    endpoint: need!(endpoint),
                    replay: take!(self.replay),
                    block_size: take!(self.block_size).unwrap_or(Subscription::DEFAULT_BLOCK_SIZE),
                    topic: take!(self.topic).unwrap_or_default(),
                    media: take!(self.media).unwrap_or_else(Subscription::default_media),
                },
            },
            OpKind::Unsubscribe => JsonOp::Unsubscribe { pod: need!(pod) },
            OpKind::ListEngines => JsonOp::ListEngines,
            OpKind::SampleKeys => JsonOp::SampleKeys {
                count: need!(count),
                seed: take!(self.seed).unwrap_or_default(),
            },
            OpKind::LookupDetail => lookup!(LookupDetail),
            OpKind::LookupTiers => lookup!(LookupTiers),
            OpKind::Tail => JsonOp::Tail {
                from: take!(self.from),
                max: need!(max),
            },
            OpKind::Digest => JsonOp::Digest {
                ask: DigestAsk {
                    level: need!(level),
                    model: take!(self.model).unwrap_or_default(),
                    low: need!(low),
                    high: need!(high),
                    of: take!(self.of).unwrap_or_default(),
                },
            },
            OpKind::Receipt => JsonOp::Receipt {
                model: need!(model),
                key: self.key(),
                pod: need!(pod),
                predicted_blocks: need!(predicted_blocks),
                cached_tokens: need!(cached_tokens),
                prompt_tokens: take!(self.prompt_tokens),
            },
        })
    }
}

fn op_names() -> String {
    let names: Vec<&str> = OpKind::ALL.iter().map(|k| k.name()).collect();
    names.join(", ")
}

pub mod ids;
mod reply;
#[cfg(test)]
mod tests;

pub use reply::{detail_json, error_json, reply_json, tiers_json, write_json, JsonWriter};
