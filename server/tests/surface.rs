//! What users script against, held to the copies in `tests/data/surface/`:
//! every `--help` of `prefix-server` and `prefix-client` (flags, defaults,
//! environment variables) and the name and type of every metric family a
//! server with an engine renders. A restructure leaves these byte-for-byte
//! the same; a change on purpose rewrites the copies with
//! `PREFIX_SURFACE_WRITE=1 cargo test -p prefix-server --test it surface::` and
//! says what changed in `CHANGELOG.md`.

use std::path::{Path, PathBuf};
use std::process::Command;

use prefix_testkit::server as common;
use prefix_testkit::server::client_bin;

/// Where the copies live.
fn surface_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/surface")
}

/// Holds `text` to the copy named `name`, or writes it when asked to.
fn hold(name: &str, text: &str) -> Result<(), String> {
    let path = surface_dir().join(name);
    if std::env::var_os("PREFIX_SURFACE_WRITE").is_some() {
        std::fs::create_dir_all(surface_dir()).unwrap();
        std::fs::write(&path, text).unwrap();
        return Ok(());
    }
    let kept = std::fs::read_to_string(&path).map_err(|e| {
        format!(
            "{}: {e} (write it with PREFIX_SURFACE_WRITE=1)",
            path.display()
        )
    })?;
    if kept == text {
        return Ok(());
    }
    let first = kept
        .lines()
        .zip(text.lines())
        .position(|(a, b)| a != b)
        .unwrap_or_else(|| kept.lines().count().min(text.lines().count()));
    Err(format!(
        "{name} differs from {} at line {}:\n  kept: {:?}\n  now:  {:?}",
        path.display(),
        first + 1,
        kept.lines().nth(first).unwrap_or("<end>"),
        text.lines().nth(first).unwrap_or("<end>"),
    ))
}

/// `bin args`'s standard output, which must succeed. The environment's
/// `PREFIX_INDEX_*` variables are cleared: clap shows a set one's value in
/// `--help`.
fn output(bin: &Path, args: &[&str]) -> String {
    let mut cmd = Command::new(bin);
    cmd.args(args).env("COLUMNS", "100");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("PREFIX_INDEX_") {
            cmd.env_remove(key);
        }
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{} {args:?} failed", bin.display());
    String::from_utf8(out.stdout).unwrap()
}

/// The subcommands a `--help` lists under "Commands:", `help` aside.
fn subcommands(help: &str) -> Vec<String> {
    help.lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|name| *name != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn every_help_is_as_kept() {
    let mut failed = Vec::new();
    let mut check = |name: &str, text: String| {
        if let Err(e) = hold(name, &text) {
            failed.push(e);
        }
    };
    let server = Path::new(env!("CARGO_BIN_EXE_prefix-server"));
    check("prefix-server.help", output(server, &["--help"]));
    let client = client_bin();
    let help = output(&client, &["--help"]);
    let commands = subcommands(&help);
    assert!(
        commands.len() >= 10,
        "prefix-client lists its subcommands: {commands:?}"
    );
    check("prefix-client.help", help);
    for command in commands {
        let text = output(&client, &[&command, "--help"]);
        check(&format!("prefix-client-{command}.help"), text);
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_family_is_as_kept() {
    let server = common::start(|_| {}).await;
    // An engine (nothing listens at its endpoint) brings the engines'
    // families in.
    server
        .engines
        .subscribe("pod=p,model=m,endpoint=tcp://127.0.0.1:9".parse().unwrap())
        .unwrap();
    let text = common::http_get(server.metrics_addr.unwrap(), "/metrics").await;
    let families: String = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(
        families.lines().count() > 20,
        "the server renders its families: {text}"
    );
    server.shutdown().await;
    hold("metrics.txt", &families).unwrap();
}
