//! CPU time of this process over the measured window, split between the
//! embedded server's threads and the rest (the load generator and its
//! client library).
//!
//! On a machine that the server shares with its load generator, ops per
//! second says how fast the pair went, not what the server costs. The
//! server's CPU time per op does: it sizes a server (cores for a given rate,
//! see `docs/operations.md`) and it is the number a change to the server's
//! path has to move. The embedded servers run on their own runtime whose
//! threads are all named [`SERVER_THREAD`]; every other thread of the process
//! counts as load generator.
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

#[cfg(target_os = "linux")]
fn read() -> procfs::ProcResult<CpuTimes> {
    let me = procfs::process::Process::myself()?;
    let tick_ns = 1_000_000_000 / procfs::ticks_per_second().max(1);
    let used = |s: &procfs::process::Stat| {
        Duration::from_nanos(s.utime.saturating_add(s.stime).saturating_mul(tick_ns))
    };
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

#[cfg(not(target_os = "linux"))]
fn read() -> Result<CpuTimes, ()> {
    Err(())
}

/// Where the CPU went in a measured window, as printed and in `--json`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CpuUse {
    /// Cores the embedded server kept busy on average (`None` against a
    /// server in another process).
    pub server_cpu_cores: Option<f64>,
    /// The embedded server's CPU time per op answered, in microseconds.
    pub server_cpu_us_per_op: Option<f64>,
    /// Cores the rest of the process (load generator, client library) kept
    /// busy on average.
    pub load_cpu_cores: f64,
    /// The rest's CPU time per op answered, in microseconds.
    pub load_cpu_us_per_op: f64,
}

impl CpuUse {
    /// The use between two readings `seconds` apart, in which `ops` ops were
    /// answered; `embedded` says whether the server ran in this process.
    pub fn between(
        before: CpuTimes,
        after: CpuTimes,
        seconds: f64,
        ops: u64,
        embedded: bool,
    ) -> CpuUse {
        let server = after.server.saturating_sub(before.server).as_secs_f64();
        let load = after
            .total
            .saturating_sub(before.total)
            .as_secs_f64()
            .max(server)
            - server;
        let seconds = seconds.max(1e-9);
        let per_op = |t: f64| {
            if ops == 0 {
                0.0
            } else {
                t * 1e6 / ops as f64
            }
        };
        CpuUse {
            server_cpu_cores: embedded.then(|| server / seconds),
            server_cpu_us_per_op: embedded.then(|| per_op(server)),
            load_cpu_cores: load / seconds,
            load_cpu_us_per_op: per_op(load),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_the_window_between_server_and_load() {
        let at = |total_ms, server_ms| CpuTimes {
            total: Duration::from_millis(total_ms),
            server: Duration::from_millis(server_ms),
        };
        // 2 s in which the server used 1.5 s of CPU and the rest 1 s, over
        // 500,000 ops.
        let u = CpuUse::between(at(1_000, 400), at(3_500, 1_900), 2.0, 500_000, true);
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        assert!(close(u.server_cpu_cores, 0.75), "{u:?}");
        assert!(close(u.server_cpu_us_per_op, 3.0), "{u:?}");
        assert!(close(Some(u.load_cpu_cores), 0.5), "{u:?}");
        assert!(close(Some(u.load_cpu_us_per_op), 2.0), "{u:?}");
        // Against a remote server every thread here is load.
        let remote = CpuUse::between(at(1_000, 0), at(3_500, 0), 2.0, 500_000, false);
        assert_eq!(remote.server_cpu_cores, None);
        assert_eq!(remote.server_cpu_us_per_op, None);
        assert!(close(Some(remote.load_cpu_cores), 1.25), "{remote:?}");
    }

    #[test]
    fn load_is_never_negative() {
        // Two readings whose server part grew more than the process total
        // (ticks charged between the reads of one reading, or a server thread
        // that exited and took its time out of the server's sum but not the
        // total's): the load side is then zero, not negative.
        let before = CpuTimes {
            total: Duration::from_secs(10),
            server: Duration::from_secs(2),
        };
        let after = CpuTimes {
            total: Duration::from_secs(11),
            server: Duration::from_secs(4),
        };
        let u = CpuUse::between(before, after, 1.0, 0, true);
        assert_eq!(u.load_cpu_cores, 0.0);
        assert_eq!(u.server_cpu_us_per_op, Some(0.0));
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
