//! CPU time over the measured window, split between the server and the load
//! generator (with its client library).
//!
//! On a machine that the server shares with its load generator, ops per
//! second says how fast the pair went, not what the server costs. The
//! server's CPU time per op does: it sizes a server (cores for a given rate,
//! see `docs/operations.md`) and it is the number a change to the server's
//! path has to move. Where the server's time comes from ([`Probe`]):
//! - in this process (`--embedded`, `--echo`): the servers run on their own
//!   runtime whose threads are all named [`SERVER_THREAD`]; every other thread
//!   of the process counts as load generator;
//! - another process (`--server` with `--metrics`): its
//!   `prefix_index_process_cpu_seconds_total`, scraped from its metrics
//!   listener at both ends of the window;
//! - otherwise only this process's time is known.
//!
//! On a virtual machine the window also records the machine's **steal
//! time**: time its virtual CPUs were ready to run but the hypervisor ran
//! something else. Every thread caught in such a gap waits for its end,
//! whatever the service does, so a run with steal time has a tail that is
//! partly the machine's (see `prefix-load stalls` for the gaps themselves).
//!
//! The kernel reports CPU time in clock ticks (10 ms at the usual 100 Hz), so
//! a window of a few seconds resolves to a fraction of a percent. A server
//! thread that exits inside the window takes its time with it (the kernel
//! keeps only the process total), which is why the embedded runtime keeps
//! its idle threads alive for longer than any run.

use std::time::Duration;

use serde::Serialize;

/// Name of every thread of the embedded server's runtime (workers and
/// blocking pool).
pub const SERVER_THREAD: &str = "prefix-server";

// The kernel keeps 15 bytes of a thread's name; a longer one would never match.
const _: () = assert!(SERVER_THREAD.len() <= 15);

/// CPU time used so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTimes {
    /// By the whole process, including threads that have exited.
    pub total: Duration,
    /// By the live threads named [`SERVER_THREAD`].
    pub server: Duration,
}

impl CpuTimes {
    /// The times now, or `None` where they cannot be read (no `/proc`).
    pub fn now() -> Option<CpuTimes> {
        read().ok()
    }
}

/// The CPU time (user and system) a process or thread's `stat` shows.
#[cfg(target_os = "linux")]
fn used(s: &procfs::process::Stat) -> Duration {
    let tick_ns = 1_000_000_000 / procfs::ticks_per_second().max(1);
    Duration::from_nanos(s.utime.saturating_add(s.stime).saturating_mul(tick_ns))
}

/// The CPU time another process of this machine has used so far.
#[cfg(target_os = "linux")]
pub fn process(pid: u32) -> procfs::ProcResult<Duration> {
    let pid = i32::try_from(pid).unwrap_or(i32::MAX);
    Ok(used(&procfs::process::Process::new(pid)?.stat()?))
}

/// Resident memory of another process of this machine, bytes.
#[cfg(target_os = "linux")]
pub fn resident(pid: u32) -> procfs::ProcResult<u64> {
    let pid = i32::try_from(pid).unwrap_or(i32::MAX);
    let status = procfs::process::Process::new(pid)?.status()?;
    Ok(status.vmrss.unwrap_or(0) * 1024)
}

#[cfg(target_os = "linux")]
fn read() -> procfs::ProcResult<CpuTimes> {
    let me = procfs::process::Process::myself()?;
    let mut server = Duration::ZERO;
    for task in me.tasks()? {
        // A thread may exit between the listing and the read: skip it.
        let Ok(stat) = task.and_then(|t| t.stat()) else {
            continue;
        };
        if stat.comm == SERVER_THREAD {
            server += used(&stat);
        }
    }
    // Read last, so it already counts every tick the threads above had.
    let total = used(&me.stat()?);
    Ok(CpuTimes { total, server })
}

/// One live thread of this process and the CPU time it has used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadTime {
    /// Its kernel thread id.
    pub tid: i32,
    /// Its name (the kernel keeps 15 bytes of it).
    pub name: String,
    /// User and system time used so far.
    pub cpu: Duration,
}

/// Every live thread of this process, or `None` where `/proc` cannot be
/// read.
#[cfg(target_os = "linux")]
pub fn threads() -> Option<Vec<ThreadTime>> {
    let me = procfs::process::Process::myself().ok()?;
    let tick_ns = 1_000_000_000 / procfs::ticks_per_second().max(1);
    let mut all = Vec::new();
    for task in me.tasks().ok()? {
        // A thread may exit between the listing and the read: skip it.
        let Ok(stat) = task.and_then(|t| t.stat()) else {
            continue;
        };
        all.push(ThreadTime {
            tid: stat.pid,
            cpu: Duration::from_nanos(
                stat.utime
                    .saturating_add(stat.stime)
                    .saturating_mul(tick_ns),
            ),
            name: stat.comm,
        });
    }
    Some(all)
}

#[cfg(not(target_os = "linux"))]
pub fn threads() -> Option<Vec<ThreadTime>> {
    None
}

/// Steal time of the whole machine so far (all its CPUs), or `None` where the
/// kernel does not report it.
#[cfg(target_os = "linux")]
pub fn steal() -> Option<Duration> {
    use procfs::CurrentSI;
    procfs::KernelStats::current().ok()?.total.steal_duration()
}

#[cfg(not(target_os = "linux"))]
pub fn steal() -> Option<Duration> {
    None
}

#[cfg(not(target_os = "linux"))]
fn read() -> Result<CpuTimes, ()> {
    Err(())
}

/// Where the server's CPU time is read.
#[derive(Debug, Clone)]
pub enum Probe {
    /// The server runs in this process, on threads named [`SERVER_THREAD`].
    InProcess,
    /// The server runs elsewhere; its metrics page (this URL) gives its CPU
    /// time.
    Metrics(String),
    /// The server runs elsewhere, unmeasured: only this process is read.
    LoadOnly,
}

/// CPU time used so far, by the load generator and the server, each where
/// known.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// By this process, less the in-process server's threads.
    pub load: Option<Duration>,
    /// By the server.
    pub server: Option<Duration>,
    /// Taken from the whole machine by its hypervisor (steal time).
    pub steal: Option<Duration>,
}

impl Probe {
    /// Reads now. May block (files, an HTTP request): call it off the async
    /// workers. What cannot be read (no `/proc`; a metrics page that does not
    /// answer) is left out.
    pub fn read(&self) -> Reading {
        let (own, steal) = (CpuTimes::now(), steal());
        match self {
            Probe::InProcess => Reading {
                load: own.map(|o| o.total.saturating_sub(o.server)),
                server: own.map(|o| o.server),
                steal,
            },
            Probe::Metrics(url) => Reading {
                load: own.map(|o| o.total),
                server: match scrape(url) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        tracing::warn!(error = %e, "no CPU time from the server's metrics");
                        None
                    }
                },
                steal,
            },
            Probe::LoadOnly => Reading {
                load: own.map(|o| o.total),
                server: None,
                steal,
            },
        }
    }
}

/// How long one read of a server's metrics page may take.
pub const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// The server's metric of its CPU time.
pub const CPU_METRIC: &str = "prefix_index_process_cpu_seconds_total";

/// The server's CPU time, from its metrics page at `url`.
pub fn scrape(url: &str) -> anyhow::Result<Duration> {
    use anyhow::Context;
    let seconds = scrape_value(url, CPU_METRIC)?;
    Duration::try_from_secs_f64(seconds).with_context(|| format!("{CPU_METRIC} = {seconds}"))
}

/// A server's resident memory in bytes, on its metrics page.
pub const RESIDENT_METRIC: &str = "prefix_index_process_resident_memory_bytes";

/// The value of `metric` (a counter or gauge without labels) on the
/// Prometheus page at `url`.
pub fn scrape_value(url: &str, metric: &str) -> anyhow::Result<f64> {
    use anyhow::Context;
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .timeout_global(Some(SCRAPE_TIMEOUT))
        // A metrics listener is reached directly, whatever proxy the
        // environment names for other traffic.
        .proxy(None)
        .build()
        .into();
    let page = agent
        .get(url)
        .call()
        // A server following thousands of engines has a page of tens of
        // MB (series per engine); ureq stops at 10 MB by default.
        .and_then(|mut r| r.body_mut().with_config().limit(1 << 30).read_to_string())
        .with_context(|| format!("reading {url}"))?;
    value(&page, metric).with_context(|| format!("no {metric} in {url}"))
}

/// The value of `metric` in a Prometheus text page.
fn value(page: &str, metric: &str) -> Option<f64> {
    page.lines()
        .find_map(|l| l.strip_prefix(metric)?.strip_prefix(' '))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// Where the CPU went in a measured window, as printed and in `--json`
/// (each `None` where unknown).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuUse {
    /// Cores the server kept busy on average.
    pub server_cpu_cores: Option<f64>,
    /// The server's CPU time per op answered, in microseconds.
    pub server_cpu_us_per_op: Option<f64>,
    /// Cores the load generator (with its client library) kept busy on
    /// average.
    pub load_cpu_cores: Option<f64>,
    /// The load generator's CPU time per op answered, in microseconds.
    pub load_cpu_us_per_op: Option<f64>,
    /// CPUs of this machine that its hypervisor took away on average (steal
    /// time per second, summed over every CPU).
    pub steal_cores: Option<f64>,
}

impl CpuUse {
    /// The use between two readings `seconds` apart, in which `ops` ops were
    /// answered.
    pub fn between(before: Reading, after: Reading, seconds: f64, ops: u64) -> CpuUse {
        let seconds = seconds.max(1e-9);
        let per_op = |t: f64| {
            if ops == 0 {
                0.0
            } else {
                t * 1e6 / ops as f64
            }
        };
        let used =
            |b: Option<Duration>, a: Option<Duration>| Some(a?.saturating_sub(b?).as_secs_f64());
        let server = used(before.server, after.server);
        let load = used(before.load, after.load);
        CpuUse {
            server_cpu_cores: server.map(|t| t / seconds),
            server_cpu_us_per_op: server.map(per_op),
            load_cpu_cores: load.map(|t| t / seconds),
            load_cpu_us_per_op: load.map(per_op),
            steal_cores: used(before.steal, after.steal).map(|t| t / seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_the_window_between_server_and_load() {
        let at = |load_ms, server_ms: Option<u64>| Reading {
            load: Some(Duration::from_millis(load_ms)),
            server: server_ms.map(Duration::from_millis),
            steal: None,
        };
        // 2 s in which the server used 1.5 s of CPU and the load 1 s, over
        // 500,000 ops.
        let u = CpuUse::between(at(600, Some(400)), at(1_600, Some(1_900)), 2.0, 500_000);
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(close(u.server_cpu_cores, 0.75), "{u:?}");
        assert!(close(u.server_cpu_us_per_op, 3.0), "{u:?}");
        assert!(close(u.load_cpu_cores, 0.5), "{u:?}");
        assert!(close(u.load_cpu_us_per_op, 2.0), "{u:?}");
        // A server time missing at either end (unmeasured, or a scrape that
        // failed) leaves the server out, not a wrong figure.
        for (b, a) in [(None, None), (Some(400), None), (None, Some(1_900))] {
            let u = CpuUse::between(at(600, b), at(1_600, a), 2.0, 500_000);
            assert_eq!(u.server_cpu_cores, None);
            assert_eq!(u.server_cpu_us_per_op, None);
            assert!(close(u.load_cpu_cores, 0.5), "{u:?}");
        }
        // Likewise this process's own time, where `/proc` cannot be read.
        let blind = Reading {
            load: None,
            server: Some(Duration::from_millis(400)),
            steal: None,
        };
        let u = CpuUse::between(blind, at(1_600, Some(1_900)), 2.0, 500_000);
        assert_eq!(u.load_cpu_cores, None);
        assert!(close(u.server_cpu_cores, 0.75), "{u:?}");
    }

    #[test]
    fn steal_time_is_per_second_of_the_window_and_left_out_where_unknown() {
        let at = |steal_ms: Option<u64>| Reading {
            load: Some(Duration::ZERO),
            server: None,
            steal: steal_ms.map(Duration::from_millis),
        };
        // 150 ms stolen from the machine's CPUs in a 3 s window.
        let u = CpuUse::between(at(Some(1_000)), at(Some(1_150)), 3.0, 10);
        assert!(
            u.steal_cores.is_some_and(|c| (c - 0.05).abs() < 1e-9),
            "{u:?}"
        );
        assert_eq!(
            CpuUse::between(at(None), at(Some(5)), 3.0, 10).steal_cores,
            None
        );
    }

    #[test]
    fn times_that_go_backwards_count_as_zero() {
        // A server thread that exited takes its time out of the server's
        // live sum (and puts it in the load's difference); a restarted
        // remote server starts its counter again. Neither gives a negative.
        let before = Reading {
            load: Some(Duration::from_secs(10)),
            server: Some(Duration::from_secs(4)),
            steal: None,
        };
        let after = Reading {
            load: Some(Duration::from_secs(9)),
            server: Some(Duration::from_secs(2)),
            steal: None,
        };
        let u = CpuUse::between(before, after, 1.0, 0);
        assert_eq!(u.load_cpu_cores, Some(0.0));
        assert_eq!(u.server_cpu_cores, Some(0.0));
        assert_eq!(u.server_cpu_us_per_op, Some(0.0));
    }

    #[test]
    fn finds_the_cpu_metric_in_a_metrics_page() {
        let page = "# HELP prefix_index_process_cpu_seconds User and system CPU time\n\
                    # TYPE prefix_index_process_cpu_seconds counter\n\
                    # UNIT prefix_index_process_cpu_seconds seconds\n\
                    prefix_index_process_cpu_seconds_total_other 9.0\n\
                    prefix_index_process_cpu_seconds_total 12.34\n\
                    # EOF\n";
        assert_eq!(value(page, CPU_METRIC), Some(12.34));
        assert_eq!(value("# EOF\n", CPU_METRIC), None);
        assert_eq!(
            value("prefix_index_process_cpu_seconds_total x\n", CPU_METRIC),
            None
        );
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_the_machines_steal_time() {
        // Reported since Linux 2.6.11; zero on bare metal, never decreasing.
        let before = steal().expect("/proc/stat has a steal column");
        let after = steal().expect("/proc/stat has a steal column");
        assert!(after >= before, "{before:?} then {after:?}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn reads_this_process_and_its_named_threads() {
        let before = CpuTimes::now().expect("/proc is readable on Linux");
        // A thread named like the server spins until it has been charged
        // CPU time; it stays alive (and counted) until told to stop.
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spin = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name(SERVER_THREAD.into())
                .spawn(move || {
                    let mut x = 0u64;
                    // Relaxed: a stop flag; nothing else is published.
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_add(1));
                    }
                    x
                })
                .expect("thread starts")
        };
        let mut after = before;
        for _ in 0..3_000 {
            after = CpuTimes::now().expect("/proc is readable on Linux");
            if after.server > before.server {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        // Relaxed: see the loop.
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        spin.join().expect("spinner");
        assert!(after.server > before.server, "{before:?} -> {after:?}");
        // The total is read after the threads, so it includes their ticks.
        assert!(after.total >= before.total);
        assert!(after.total - before.total >= after.server - before.server);
    }
}
