//! Engines published from child processes: a fleet of thousands needs more
//! open files than one process may have (five an engine: its PUB socket's
//! listener, connection and mailbox, its ROUTER's listener and mailbox).
//!
//! Each child (`prefix-load publish-engines`, hidden) computes the same
//! plan from the same trace and settings, binds its range of the engines
//! in groups ([`Group`]) and speaks a line protocol with the parent:
//! - child: `engine <i> <endpoint> <replay> <topic>` per engine, then
//!   `bound`; `answered` once each of its engines has answered a replay
//!   request (the one a server asks on connecting);
//! - parent: `start`; child: `published <seconds>` once every batch is
//!   handed to libzmq, counted from `start`;
//! - parent: `stop` (or its end of the pipe closing); the child exits.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::AtomicBool;
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::plan::plan;
use super::publish::{layout, Ends, Group};
use super::{topic, IngestConfig};
use crate::simulate::Release;

/// What a child is told.
#[derive(Debug, Clone, clap::Args)]
pub struct ChildArgs {
    /// The trace.
    #[arg(long)]
    pub trace: PathBuf,
    /// Engines of the whole run.
    #[arg(long)]
    pub engines: usize,
    /// Each engine's cache in blocks.
    #[arg(long)]
    pub capacity: usize,
    /// Rounds of the trace.
    #[arg(long)]
    pub rounds: usize,
    /// The caches' release order.
    #[arg(long, value_enum)]
    pub release: Release,
    /// First engine of this child's.
    #[arg(long)]
    pub from: usize,
    /// One past its last.
    #[arg(long)]
    pub to: usize,
    /// Engine `i`'s pod is this followed by `i`.
    #[arg(long)]
    pub pod_prefix: String,
}

/// Runs a child: binds, reports, publishes when told.
pub fn child_main(a: ChildArgs) -> anyhow::Result<()> {
    let trace = crate::workload::load_trace(&a.trace)?;
    let cfg = IngestConfig {
        engines: a.engines,
        capacity: a.capacity,
        rounds: a.rounds,
        timeout: Duration::ZERO,
        release: a.release,
        publisher_processes: 1,
        subscribe_batch: 1,
        trace: a.trace.clone(),
    };
    let plan = plan(&trace, &cfg);
    let range: Vec<usize> = (a.from..a.to.min(plan.batches.len())).collect();
    prefix_server::raise_open_files(6 * range.len() as u64 + 1_024)?;
    let groups = layout(range.len());
    let mut out = std::io::stdout().lock();
    let mut bound = Vec::with_capacity(groups);
    for g in 0..groups {
        let members: Vec<usize> = range.iter().copied().skip(g).step_by(groups).collect();
        let topics = members
            .iter()
            .map(|&e| topic(&format!("{}{e}", a.pod_prefix)))
            .collect();
        let batches = members.iter().map(|&e| plan.batches[e].clone()).collect();
        let (group, ends) = Group::bind(g, members.clone(), topics, batches)?;
        for (e, end) in members.iter().zip(ends) {
            writeln!(
                out,
                "engine {e} {} {} {}",
                end.endpoint, end.replay, end.topic
            )?;
        }
        bound.push(group);
    }
    writeln!(out, "bound")?;
    out.flush()?;
    let (tx, commands) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut answered = false;
    loop {
        if !answered && bound.iter().all(|g| g.unanswered().next().is_none()) {
            answered = true;
            writeln!(out, "answered")?;
            out.flush()?;
        }
        match commands.recv_timeout(Duration::from_millis(20)) {
            Ok(c) if c == "start" => break,
            // The run ended before it began (the server refused an engine).
            Ok(c) if c == "stop" => return Ok(()),
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(()),
        }
    }
    let start = Arc::new(Barrier::new(groups + 1));
    let release = Arc::new(AtomicBool::new(false));
    let threads = bound
        .iter_mut()
        .enumerate()
        .map(|(g, group)| group.start(g, start.clone(), release.clone()))
        .collect::<anyhow::Result<Vec<_>>>()?;
    start.wait();
    let t0 = Instant::now();
    while !bound.iter().all(Group::published_all) {
        std::thread::sleep(Duration::from_millis(5));
    }
    writeln!(out, "published {}", t0.elapsed().as_secs_f64())?;
    out.flush()?;
    // Until told to stop: what is queued in libzmq must stay.
    while let Ok(c) = commands.recv() {
        if c == "stop" {
            break;
        }
    }
    release.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
    Ok(())
}

/// `release` as the command line names it.
fn release_name(release: Release) -> anyhow::Result<String> {
    use clap::ValueEnum;
    Ok(release
        .to_possible_value()
        .context("a release order without a name")?
        .get_name()
        .to_string())
}

/// The parent's end of one child.
pub struct Publisher {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
}

impl Publisher {
    /// Starts a child for engines `from..to` of the run `cfg`; returns it
    /// with its engines' ends, once bound.
    pub fn spawn(
        cfg: &IngestConfig,
        from: usize,
        to: usize,
        pod_prefix: &str,
    ) -> anyhow::Result<(Publisher, Vec<(usize, Ends)>)> {
        let exe = std::env::current_exe().context("finding prefix-load itself")?;
        let mut child = Command::new(exe)
            .arg("publish-engines")
            .arg("--trace")
            .arg(&cfg.trace)
            .args(["--engines", &cfg.engines.to_string()])
            .args(["--capacity", &cfg.capacity.to_string()])
            .args(["--rounds", &cfg.rounds.to_string()])
            .args(["--release", &release_name(cfg.release)?])
            .args(["--from", &from.to_string(), "--to", &to.to_string()])
            .args(["--pod-prefix", pod_prefix])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("starting a publishing process")?;
        let stdin = child.stdin.take().context("its stdin")?;
        let stdout = child.stdout.take().context("its stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut p = Publisher {
            child,
            stdin,
            lines,
        };
        let mut ends = Vec::new();
        loop {
            let line = p.next(Duration::from_secs(600))?;
            let words: Vec<&str> = line.split(' ').collect();
            match words[..] {
                ["engine", e, endpoint, replay, topic] => ends.push((
                    e.parse()?,
                    Ends {
                        endpoint: endpoint.into(),
                        replay: replay.into(),
                        topic: topic.into(),
                    },
                )),
                ["bound"] => return Ok((p, ends)),
                _ => anyhow::bail!("a publishing process said {line:?}"),
            }
        }
    }

    fn next(&mut self, within: Duration) -> anyhow::Result<String> {
        self.lines
            .recv_timeout(within)
            .context("a publishing process stopped answering")
    }

    /// Waits until `until` for the child to say its engines answered a
    /// replay; whether it did.
    pub fn answered(&mut self, until: Instant) -> bool {
        let left = until.saturating_duration_since(Instant::now());
        matches!(self.next(left).as_deref(), Ok("answered"))
    }

    /// Tells the child to publish.
    pub fn start(&mut self) -> anyhow::Result<()> {
        writeln!(self.stdin, "start")?;
        Ok(self.stdin.flush()?)
    }

    /// Waits for the child to have handed over every batch: how long it
    /// took from `start`.
    pub fn published(&mut self, within: Duration) -> anyhow::Result<f64> {
        loop {
            let line = self.next(within)?;
            if let Some(s) = line.strip_prefix("published ") {
                return Ok(s.parse()?);
            }
        }
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "stop");
        let _ = self.stdin.flush();
        let _ = self.child.wait();
    }
}
