//! JSON Lines operations, as `prefix-client replay` reads and writes them.
//!
//! One JSON object per input line, one per output line, in order; each op is
//! applied before the next line is read. Input:
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
//! ```
//!
//! Output: `{"ok":true,...}` or `{"ok":false,"error":"..."}`. A lookup answers
//! `{"ok":true,"blocks":N,"matches":[{"pod":P,"blocks":K},...]}`: N is the
//! key's block count, and matches lists every pod with K ≥ 1, by K descending
//! then pod name. Engine-fed (precise) pods match token keys only: look them
//! up with `"tokens"`. `list_engines` answers `{"ok":true,"engines":[...]}`,
//! one object per engine: its subscription's fields, then its state
//! (`connected`, `last_seq`, `events`, ..., `lag_ms`, `last_error`). A line that fails (bad JSON, an unknown op, a server error,
//! a timeout) answers its error and replay goes on with the next line.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use crate::client::Client;
use crate::key;
use crate::wire::{EngineState, EngineSub, OpKind};

/// How text and tokens become block hashes; every gateway of a model must
/// agree on these.
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
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize, clap::Args)]
#[group(required = true, multiple = false)]
pub struct KeySource {
    /// Prompt text, hashed in blocks of `block_bytes` (--block-bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub text: Option<String>,
    /// Token ids (comma-separated on the command line), hashed in blocks of
    /// `block_tokens` (--block-tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_delimiter = ',')]
    pub tokens: Option<Vec<u32>>,
    /// Block hashes (comma-separated on the command line), used as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long, value_delimiter = ',')]
    pub hashes: Option<Vec<u64>>,
}

impl KeySource {
    /// The block hashes, or why there are none.
    pub fn key(&self, opts: &KeyOptions) -> Result<Vec<u64>, String> {
        match (&self.text, &self.tokens, &self.hashes) {
            (Some(t), None, None) => Ok(key::text_key(t, opts.block_bytes)),
            (None, Some(t), None) => Ok(key::token_key(t, opts.block_tokens)),
            (None, None, Some(h)) => Ok(h.clone()),
            (None, None, None) => Err("give one of \"text\", \"tokens\" or \"hashes\"".into()),
            _ => Err("give only one of \"text\", \"tokens\" or \"hashes\"".into()),
        }
    }
}

/// An engine to follow, as `subscribe` takes it: the fields of
/// [`EngineSub`], with the defaults of the server's `--engine`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, clap::Args)]
pub struct EngineArgs {
    /// The pod the engine serves (gateways route to this name).
    #[arg(long)]
    pub pod: String,
    /// The model it serves.
    #[arg(long)]
    pub model: String,
    /// The engine's ZeroMQ PUB endpoint, tcp://host:port.
    #[arg(long)]
    pub endpoint: String,
    /// The engine's replay (ROUTER) endpoint, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[arg(long)]
    pub replay: Option<String>,
    /// Tokens per engine block (vLLM --block-size, SGLang --page-size).
    #[serde(default = "default_block_size")]
    #[arg(long, default_value_t = default_block_size())]
    pub block_size: u32,
    /// The topic to subscribe to (empty: every message).
    #[serde(default)]
    #[arg(long, default_value = "")]
    pub topic: String,
    /// Cache tiers routed on (comma-separated on the command line).
    #[serde(default = "default_media")]
    #[arg(long, value_delimiter = ',', default_value = "GPU")]
    pub media: Vec<String>,
}

/// vLLM's default block size.
fn default_block_size() -> u32 {
    16
}

/// Engines cache in GPU memory; other tiers are offloads.
fn default_media() -> Vec<String> {
    vec!["GPU".into()]
}

impl From<&EngineArgs> for EngineSub {
    fn from(a: &EngineArgs) -> Self {
        EngineSub {
            pod: a.pod.clone(),
            model: a.model.clone(),
            endpoint: a.endpoint.clone(),
            replay: a.replay.clone(),
            block_size: a.block_size,
            topic: a.topic.clone(),
            media: a.media.clone(),
        }
    }
}

/// One engine of a `list_engines` answer, as a JSON object.
fn engine_json(e: &EngineState) -> Value {
    let s = &e.sub;
    json!({
        "pod": s.pod,
        "model": s.model,
        "endpoint": s.endpoint,
        "replay": s.replay,
        "block_size": s.block_size,
        "topic": s.topic,
        "media": s.media,
        "connected": e.connected,
        "last_seq": e.last_seq,
        "events": e.events,
        "blocks_stored": e.blocks_stored,
        "blocks_removed": e.blocks_removed,
        "resyncs": e.resyncs,
        "replays": e.replays,
        "orphaned": e.orphaned,
        "decode_errors": e.decode_errors,
        "lag_ms": e.lag_ms,
        "last_error": e.last_error,
    })
}

/// One input line, and one `prefix-client` subcommand: one variant per
/// operation of the protocol, named by its [`OpKind::name`] (the test
/// `lines_follow_the_op_table` holds them together).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize, clap::Subcommand)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Line {
    /// Record that a pod holds every prefix of a key.
    Insert {
        /// Model name.
        #[arg(long)]
        model: String,
        /// The key.
        #[serde(flatten)]
        #[command(flatten)]
        key: KeySource,
        /// Pod name.
        #[arg(long)]
        pod: String,
    },
    /// Each pod's matched leading blocks of a key.
    Lookup {
        /// Model name.
        #[arg(long)]
        model: String,
        /// The key.
        #[serde(flatten)]
        #[command(flatten)]
        key: KeySource,
        /// Only these pods (comma-separated on the command line).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[arg(long, value_delimiter = ',')]
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
        #[command(flatten)]
        engine: EngineArgs,
    },
    /// Stop following a pod's engine (the pod is removed).
    Unsubscribe {
        /// Pod name.
        #[arg(long)]
        pod: String,
    },
    /// Every engine followed, with its state.
    ListEngines,
}

impl Line {
    /// The operation this line applies.
    pub fn kind(&self) -> OpKind {
        match self {
            Line::Insert { .. } => OpKind::Insert,
            Line::Lookup { .. } => OpKind::Lookup,
            Line::RemovePod { .. } => OpKind::RemovePod,
            Line::SetPodCapacity { .. } => OpKind::SetPodCapacity,
            Line::Stats => OpKind::Stats,
            Line::Ping => OpKind::Ping,
            Line::Subscribe { .. } => OpKind::Subscribe,
            Line::Unsubscribe { .. } => OpKind::Unsubscribe,
            Line::ListEngines => OpKind::ListEngines,
        }
    }
}

/// Applies one line's op and returns its output object.
pub async fn apply(client: &Client, line: &Line, opts: &KeyOptions) -> Value {
    match run(client, line, opts).await {
        Ok(v) => v,
        Err(e) => json!({ "ok": false, "error": e }),
    }
}

async fn run(client: &Client, line: &Line, opts: &KeyOptions) -> Result<Value, String> {
    let err = |e: crate::ClientError| e.to_string();
    Ok(match line {
        Line::Insert { model, key, pod } => {
            client
                .insert(model, &key.key(opts)?, pod)
                .await
                .map_err(err)?;
            json!({ "ok": true })
        }
        Line::Lookup {
            model,
            key,
            candidates,
        } => {
            let names: Option<Vec<&str>> = candidates
                .as_ref()
                .map(|c| c.iter().map(String::as_str).collect());
            let r = client
                .lookup(model, &key.key(opts)?, names.as_deref())
                .await
                .map_err(err)?;
            let matches: Vec<Value> = r
                .matches
                .iter()
                .map(|m| json!({ "pod": m.pod, "blocks": m.blocks }))
                .collect();
            json!({ "ok": true, "blocks": r.key_blocks, "matches": matches })
        }
        Line::RemovePod { pod } => {
            let removed = client.remove_pod(pod).await.map_err(err)?;
            json!({ "ok": true, "removed": removed })
        }
        Line::SetPodCapacity { pod, blocks } => {
            client.set_pod_capacity(pod, *blocks).await.map_err(err)?;
            json!({ "ok": true })
        }
        Line::Stats => {
            let s = client.stats().await.map_err(err)?;
            json!({
                "ok": true,
                "models": s.models,
                "pods": s.pods,
                "nodes": s.nodes,
                "tree_blocks": s.tree_blocks,
                "entries": s.entries,
                "bytes": s.bytes,
            })
        }
        Line::Ping => {
            client.ping().await.map_err(err)?;
            json!({ "ok": true })
        }
        Line::Subscribe { engine } => {
            client.subscribe_engine(engine.into()).await.map_err(err)?;
            json!({ "ok": true })
        }
        Line::Unsubscribe { pod } => {
            let removed = client.unsubscribe_engine(pod).await.map_err(err)?;
            json!({ "ok": true, "removed": removed })
        }
        Line::ListEngines => {
            let engines = client.list_engines().await.map_err(err)?;
            let engines: Vec<Value> = engines.iter().map(engine_json).collect();
            json!({ "ok": true, "engines": engines })
        }
    })
}

/// What a replay did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayCounts {
    /// Lines read.
    pub lines: u64,
    /// Lines answered `"ok":false`.
    pub failed: u64,
}

/// Reads JSON Lines from `input`, applies each, writes one output line each.
/// Only I/O errors on `input` or `output` stop it.
pub async fn replay<R, W>(
    client: &Client,
    opts: &KeyOptions,
    input: R,
    mut output: W,
) -> std::io::Result<ReplayCounts>
where
    R: AsyncBufRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut counts = ReplayCounts::default();
    let mut lines = input.lines();
    while let Some(text) = lines.next_line().await? {
        counts.lines += 1;
        let out = match serde_json::from_str::<Line>(&text) {
            Ok(line) => apply(client, &line, opts).await,
            Err(e) => json!({ "ok": false, "error": format!("bad line: {e}") }),
        };
        if out["ok"] != Value::Bool(true) {
            counts.failed += 1;
        }
        let mut bytes = serde_json::to_vec(&out)?;
        bytes.push(b'\n');
        output.write_all(&bytes).await?;
        // Flush per line so a process driving replay through a pipe sees each
        // answer before it sends its next line.
        output.flush().await?;
    }
    Ok(counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_parse() {
        let l: Line =
            serde_json::from_str(r#"{"op":"insert","model":"m","text":"abc","pod":"p"}"#).unwrap();
        assert_eq!(
            l,
            Line::Insert {
                model: "m".into(),
                key: KeySource {
                    text: Some("abc".into()),
                    ..KeySource::default()
                },
                pod: "p".into()
            }
        );
        let l: Line = serde_json::from_str(
            r#"{"op":"lookup","model":"m","hashes":[18446744073709551615],"candidates":["a"]}"#,
        )
        .unwrap();
        let Line::Lookup {
            key, candidates, ..
        } = l
        else {
            panic!("{l:?}")
        };
        assert_eq!(key.key(&KeyOptions::default()).unwrap(), vec![u64::MAX]);
        assert_eq!(candidates, Some(vec!["a".to_string()]));
        assert!(serde_json::from_str::<Line>(r#"{"op":"drop_table"}"#).is_err());
        assert!(serde_json::from_str::<Line>(r#"{"op":"remove_pod"}"#).is_err());
        let both = KeySource {
            text: Some("x".into()),
            tokens: Some(vec![1]),
            hashes: None,
        };
        assert!(both.key(&KeyOptions::default()).is_err());
        assert!(KeySource::default().key(&KeyOptions::default()).is_err());
    }

    #[test]
    fn lines_follow_the_op_table() {
        use clap::Subcommand as _;
        let cli = clap::Command::new("t");
        let cli = Line::augment_subcommands(cli);
        let commands: Vec<String> = cli.get_subcommands().map(|c| c.get_name().into()).collect();
        let mut kinds = Vec::new();
        for kind in OpKind::ALL {
            // The replay line of each operation names it by the table's name...
            let text = match kind {
                OpKind::Lookup | OpKind::Insert => {
                    format!(
                        r#"{{"op":"{}","model":"m","hashes":[1],"pod":"p"}}"#,
                        kind.name()
                    )
                }
                OpKind::RemovePod => format!(r#"{{"op":"{}","pod":"p"}}"#, kind.name()),
                OpKind::SetPodCapacity => {
                    format!(r#"{{"op":"{}","pod":"p","blocks":1}}"#, kind.name())
                }
                OpKind::Subscribe => format!(
                    r#"{{"op":"{}","pod":"p","model":"m","endpoint":"tcp://h:1"}}"#,
                    kind.name()
                ),
                OpKind::Unsubscribe => format!(r#"{{"op":"{}","pod":"p"}}"#, kind.name()),
                OpKind::Stats | OpKind::Ping | OpKind::ListEngines => {
                    format!(r#"{{"op":"{}"}}"#, kind.name())
                }
            };
            let line: Line = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(line.kind(), kind);
            kinds.push(line.kind());
            // ...and so does its subcommand, in kebab-case.
            assert!(
                commands.contains(&kind.name().replace('_', "-")),
                "{commands:?}"
            );
        }
        assert_eq!(kinds, OpKind::ALL);
        assert_eq!(commands.len(), OpKind::ALL.len());
    }

    #[test]
    fn subscriptions_take_the_engine_defaults() {
        use clap::Parser as _;
        let short: Line = serde_json::from_str(
            r#"{"op":"subscribe","pod":"p","model":"m","endpoint":"tcp://h:1"}"#,
        )
        .unwrap();
        let want = EngineSub {
            pod: "p".into(),
            model: "m".into(),
            endpoint: "tcp://h:1".into(),
            replay: None,
            block_size: 16,
            topic: String::new(),
            media: vec!["GPU".into()],
        };
        let Line::Subscribe { engine } = &short else {
            panic!("{short:?}")
        };
        assert_eq!(EngineSub::from(engine), want);

        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            line: Line,
        }
        let args = ["t", "subscribe", "--pod", "p", "--model", "m"];
        let cli = Cli::try_parse_from(args.iter().chain(&["--endpoint", "tcp://h:1"])).unwrap();
        assert_eq!(cli.line, short);
        let full = Cli::try_parse_from(args.iter().chain(&[
            "--endpoint",
            "tcp://h:1",
            "--replay",
            "tcp://h:2",
            "--block-size",
            "64",
            "--topic",
            "kv",
            "--media",
            "GPU,CPU",
        ]))
        .unwrap();
        let Line::Subscribe { engine } = &full.line else {
            panic!("{:?}", full.line)
        };
        let sub = EngineSub::from(engine);
        assert_eq!(
            (
                sub.replay.as_deref(),
                sub.block_size,
                &*sub.topic,
                &sub.media[..]
            ),
            (
                Some("tcp://h:2"),
                64,
                "kv",
                &["GPU".to_string(), "CPU".into()][..]
            )
        );
        // What a replay line writes reads back the same.
        let text = serde_json::to_string(&full.line).unwrap();
        assert_eq!(serde_json::from_str::<Line>(&text).unwrap(), full.line);
        let cli = Cli::try_parse_from(["t", "unsubscribe", "--pod", "p"]).unwrap();
        assert_eq!(cli.line, Line::Unsubscribe { pod: "p".into() });
    }

    #[test]
    fn keys_follow_the_block_sizes() {
        let opts = KeyOptions {
            block_bytes: 4,
            block_tokens: 2,
        };
        let text = KeySource {
            text: Some("abcdefghi".into()),
            ..KeySource::default()
        };
        assert_eq!(text.key(&opts).unwrap().len(), 2);
        let tokens = KeySource {
            tokens: Some(vec![1, 2, 3, 4, 5]),
            ..KeySource::default()
        };
        assert_eq!(tokens.key(&opts).unwrap(), key::token_key(&[1, 2, 3, 4], 2));
    }
}
