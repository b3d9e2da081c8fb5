//! `prefix-client`: one-shot commands and JSON Lines replay against a
//! prefix-index server. Every command prints JSON, in the `replay` format.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use prefix_client::wire::json::{JsonOp, KeyOptions};
use prefix_client::{compare, replay};
use prefix_client::{Client, ClientConfig, TlsConfig};
use tokio::io::{AsyncWriteExt, BufReader};

#[derive(Debug, Parser)]
#[command(version, about = "Query and update a prefix-index server")]
struct Cli {
    /// Server address (host:port).
    #[arg(
        long,
        global = true,
        env = "PREFIX_INDEX_SERVER",
        default_value = "127.0.0.1:7070"
    )]
    server: String,
    /// PEM CA certificate(s) to trust: the server's self-signed cert.pem, or
    /// the CA that signed its certificate.
    #[arg(
        long,
        global = true,
        env = "PREFIX_INDEX_CA",
        default_value = "prefix-index-data/cert.pem"
    )]
    ca: PathBuf,
    /// Client certificate for mutual TLS (with --key).
    #[arg(long, global = true, requires = "key")]
    cert: Option<PathBuf>,
    /// Private key of --cert.
    #[arg(long, global = true, requires = "cert")]
    key: Option<PathBuf>,
    /// Name the server's certificate must hold [default: the host of
    /// --server, or localhost for an IP address].
    #[arg(long, global = true)]
    server_name: Option<String>,
    /// Bytes per text block.
    #[arg(long, global = true, default_value_t = 64)]
    block_bytes: usize,
    /// Token ids per token block.
    #[arg(long, global = true, default_value_t = 16)]
    block_tokens: usize,
    /// How long each request may take (e.g. 500ms, 2s).
    #[arg(long, global = true, default_value = "2s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Op(JsonOp),
    /// Apply JSON Lines ops from FILE (or stdin), one JSON answer per line.
    Replay {
        /// Input file; stdin when absent or "-".
        file: Option<PathBuf>,
    },
    /// Compare replicas (these servers, not --server): their stats side by
    /// side, and the share of sampled lookups they answer differently (keys
    /// sampled from each one's content, looked up on all).
    Compare {
        /// The servers (host:port), two or more.
        #[arg(required = true, num_args = 2..)]
        servers: Vec<String>,
        /// Keys to sample, an even share from each server.
        #[arg(long, default_value_t = 1000)]
        samples: u32,
        /// Decides the samples.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Differing keys to print, with each server's answer.
        #[arg(long, default_value_t = 5)]
        examples: usize,
    },
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let tls = TlsConfig::from_files(&cli.ca, cli.cert.as_deref(), cli.key.as_deref())
        .with_context(|| format!("loading TLS material (--ca {})", cli.ca.display()))?;
    if let Command::Compare {
        servers,
        samples,
        seed,
        examples,
    } = &cli.command
    {
        let mut clients = Vec::new();
        for server in servers {
            clients.push((server.clone(), connect(&cli, &tls, server).await?));
        }
        let found = compare::compare(&clients, *samples, *seed, *examples).await?;
        for (_, c) in &clients {
            c.close().await;
        }
        return print(&serde_json::json!({ "ok": true, "compare": found })).await;
    }
    let client = connect(&cli, &tls, &cli.server).await?;
    let opts = KeyOptions {
        block_bytes: cli.block_bytes,
        block_tokens: cli.block_tokens,
    };
    let line = match cli.command {
        Command::Replay { file } => {
            let stdout = tokio::io::stdout();
            let counts = match file.filter(|f| f.as_os_str() != "-") {
                Some(path) => {
                    let f = tokio::fs::File::open(&path)
                        .await
                        .with_context(|| format!("opening {}", path.display()))?;
                    replay::replay(&client, &opts, BufReader::new(f), stdout).await?
                }
                None => {
                    let stdin = BufReader::new(tokio::io::stdin());
                    replay::replay(&client, &opts, stdin, stdout).await?
                }
            };
            client.close().await;
            let lines = if counts.lines == 1 { "line" } else { "lines" };
            eprintln!("{} {lines}, {} failed", counts.lines, counts.failed);
            return Ok(());
        }
        Command::Op(line) => line,
        Command::Compare { .. } => unreachable!("answered above"),
    };
    let out = replay::apply(&client, &line, &opts).await;
    client.close().await;
    print(&out).await
}

/// Prints `out` as one JSON line; exits 1 unless it says `"ok": true`.
async fn print(out: &serde_json::Value) -> anyhow::Result<()> {
    let mut text = serde_json::to_vec(out)?;
    text.push(b'\n');
    let mut stdout = tokio::io::stdout();
    stdout.write_all(&text).await?;
    // tokio's stdout buffers on a thread of its own: flush before exiting, or
    // the answer (the only explanation of a failure) may never be written.
    stdout.flush().await?;
    if out["ok"] != serde_json::Value::Bool(true) {
        std::process::exit(1);
    }
    Ok(())
}

/// A client of `server` with the command line's TLS and timeout.
async fn connect(cli: &Cli, tls: &TlsConfig, server: &str) -> anyhow::Result<Client> {
    let addr = resolve(server).await?;
    let server_name =
        cli.server_name
            .clone()
            .unwrap_or_else(|| match server.rsplit_once(':').map(|(h, _)| h) {
                Some(h) if h.parse::<std::net::IpAddr>().is_err() && !h.starts_with('[') => {
                    h.into()
                }
                _ => "localhost".into(),
            });
    let cfg = ClientConfig {
        tls: tls.clone(),
        server_name,
        deadline: cli.timeout,
        connect_timeout: cli.timeout.max(Duration::from_secs(1)),
        ..ClientConfig::default()
    };
    Client::connect(addr, cfg)
        .await
        .with_context(|| format!("connecting to {addr}"))
}

/// Resolves host:port (the first address wins).
async fn resolve(server: &str) -> anyhow::Result<SocketAddr> {
    if let Ok(a) = server.parse() {
        return Ok(a);
    }
    match tokio::net::lookup_host(server).await?.next() {
        Some(a) => Ok(a),
        None => bail!("{server} resolves to no address"),
    }
}
