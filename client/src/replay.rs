//! JSON Lines operations, as `prefix-client replay` reads and writes them.
//!
//! One JSON object per input line, one per output line, in order; each op is
//! applied before the next line is read. Lines and answers are the objects of
//! [`prefix_proto::json`] (the HTTP API's, with `"op"` naming the
//! operation): `{"op":"lookup","model":M,"text":T}` answers
//! `{"ok":true,"key_blocks":N,"matches":[{"pod":P,"blocks":K},...]}`.
//! Engine-fed (precise) pods match token keys only: look them up with
//! `"tokens"`. A line that fails (bad JSON, an unknown op or field, a server
//! error, a timeout) answers its error object and replay goes on with the
//! next line.

use serde_json::Value;
use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncWrite, AsyncWriteExt};

use crate::client::Client;
use crate::wire::json::{error_json, reply_json, JsonOp, KeyOptions};
use crate::wire::{Reply, Request, Response};

/// Applies one op and returns its output object.
pub async fn apply(client: &Client, op: &JsonOp, opts: &KeyOptions) -> Value {
    let op = match op.to_op(opts) {
        Ok(op) => op,
        Err(e) => return reply_json(&e.to_reply()),
    };
    match client.call(Request::One(op)).await {
        Ok(Response::One(reply)) => reply_json(&reply),
        Ok(Response::Batch(_)) => reply_json(&Reply::Error {
            code: crate::wire::ErrorCode::Internal as u16,
            message: "a batch answer to one op".into(),
        }),
        Err(e) => error_json(e.code().map(|c| c as u16), &e.to_string()),
    }
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
        let out = match JsonOp::parse(text.as_bytes()) {
            Ok(op) => apply(client, &op, opts).await,
            Err(e) => reply_json(&e.to_reply()),
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
    use crate::wire::{OpKind, Subscription};

    #[test]
    fn subcommands_follow_the_op_table() {
        use clap::Subcommand as _;
        let cli = JsonOp::augment_subcommands(clap::Command::new("t"));
        let commands: Vec<String> = cli.get_subcommands().map(|c| c.get_name().into()).collect();
        let want: Vec<String> = OpKind::ALL
            .iter()
            .map(|k| k.name().replace('_', "-"))
            .collect();
        assert_eq!(commands.len(), want.len());
        for name in want {
            assert!(commands.contains(&name), "{name} not in {commands:?}");
        }
    }

    #[test]
    fn subscriptions_take_the_engine_defaults() {
        use clap::Parser as _;
        let short =
            JsonOp::parse(br#"{"op":"subscribe","pod":"p","model":"m","endpoint":"tcp://h:1"}"#)
                .unwrap();
        let want = Subscription {
            pod: "p".into(),
            model: "m".into(),
            endpoint: "tcp://h:1".into(),
            replay: None,
            block_size: 16,
            topic: String::new(),
            media: vec!["GPU".into()],
        };
        let JsonOp::Subscribe { engine } = &short else {
            panic!("{short:?}")
        };
        assert_eq!(engine, &want);

        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            op: JsonOp,
        }
        let args = ["t", "subscribe", "--pod", "p", "--model", "m"];
        let cli = Cli::try_parse_from(args.iter().chain(&["--endpoint", "tcp://h:1"])).unwrap();
        assert_eq!(cli.op, short);
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
        let JsonOp::Subscribe { engine } = &full.op else {
            panic!("{:?}", full.op)
        };
        let Subscription {
            replay,
            block_size,
            topic,
            media,
            ..
        } = engine;
        assert_eq!(
            (replay.as_deref(), *block_size, &**topic, &media[..]),
            (
                Some("tcp://h:2"),
                64,
                "kv",
                &["GPU".to_string(), "CPU".into()][..]
            )
        );
        // What a replay line writes reads back the same.
        let text = serde_json::to_vec(&full.op).unwrap();
        assert_eq!(JsonOp::parse(&text).unwrap(), full.op);
        let cli = Cli::try_parse_from(["t", "lookup", "--model", "m", "--tokens", "1,2"]).unwrap();
        assert_eq!(cli.op.kind(), OpKind::Lookup);
        assert!(Cli::try_parse_from(["t", "lookup", "--model", "m"]).is_err());
    }
}
