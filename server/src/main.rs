//! `prefix-server`: parse the configuration, set up logging, serve until
//! SIGTERM or SIGINT.

use anyhow::Context;
use clap::{CommandFactory, FromArgMatches, Parser};
use prefix_server::Settings;

#[global_allocator]
static GLOBAL: prefix_server::Allocator = prefix_server::Allocator;

/// The shared prefix index server for LLM inference gateways.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// TOML file with any of the settings below (kebab-case keys, e.g.
    /// `listen = "0.0.0.0:7070"`); flags and environment win over it.
    #[arg(long, env = "PREFIX_INDEX_CONFIG")]
    config: Option<std::path::PathBuf>,
    #[command(flatten)]
    settings: Settings,
}

fn main() -> anyhow::Result<()> {
    // No transparent huge pages: each thread's first small allocations
    // would put a whole 2 MiB in memory (a server at rest held 24 MB
    // resident with them, 12.4 MB without; lookups on the trace's index
    // are as fast either way, `docs/benchmarks.md`). mimalloc asks for
    // none (its `no_thp` feature); this keeps a kernel whose setting is
    // `always` from giving them anyway, before the runtime's threads
    // start. Where the kernel refuses, nothing changes.
    #[cfg(target_os = "linux")]
    let _ = rustix::thread::disable_transparent_huge_pages(true);
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?
        .block_on(serve())
}

async fn serve() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    // The environment variables, and the defaults in --help from the
    // server's own configuration.
    let matches = Settings::augment(Cli::command()).get_matches();
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let file = match &cli.config {
        Some(path) => Settings::from_file(path)?,
        None => Settings::default(),
    };
    let cfg = cli.settings.or(file).resolve()?;
    prefix_server::run(cfg, shutdown_signal())
        .await
        .context("server failed")
}

/// Resolves at the first SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => tracing::info!("SIGINT"),
        _ = term => tracing::info!("SIGTERM"),
    }
}
