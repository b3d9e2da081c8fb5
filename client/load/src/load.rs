//! The load generator: closed loop (a fixed number of requests in flight) or
//! open loop (a fixed arrival rate, latency counted from each request's
//! scheduled time so queueing in the generator or server is not hidden).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use prefix_client::{Client, ClientError};
use prefix_proto::key::TOKEN_BLOCK_TOKENS;
use prefix_proto::{Op, Receipt, Reply};
use prefix_server::BusyPoll;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cpu::{CpuUse, Probe};
use crate::workload::Request;

/// What to send and how.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Gateway identities; each has its own connections and sessions.
    pub gateways: usize,
    /// Connections per gateway.
    pub connections: usize,
    /// Closed loop: requests in flight per connection.
    pub in_flight: usize,
    /// Open loop: frames per second over all connections.
    pub rate: Option<f64>,
    /// Ops per frame (1 sends single ops).
    pub batch: usize,
    /// Fraction of ops that are lookups; the rest insert.
    pub lookups: f64,
    /// The ops that are not lookups send receipts instead of inserts.
    pub receipts: bool,
    /// Pods that inserts name (sessions stick to one).
    pub pods: usize,
    /// Model name.
    pub model: String,
    /// Measured time.
    pub duration: Duration,
    /// Unmeasured time first.
    pub warmup: Duration,
    /// Where the server's CPU time is read.
    pub cpu: Probe,
    /// Keep the generator's workers polling instead of sleeping, and pace
    /// open-loop frames on a worker by polling the clock (see
    /// [`prefix_server::BusyPoll`]).
    pub busy_poll: bool,
}

/// Where requests come from: a prepared list, sent in order (cycling), either
/// as fast as the loop allows or at the requests' own times scaled by `speed`.
/// Preparing them first keeps key building (text hashing for chat) out of the
/// measured loop, so the generator spends its CPU on sending.
#[derive(Clone)]
pub struct Source {
    /// The requests.
    pub requests: Arc<Vec<Request>>,
    /// Replay at `at_ms / speed`; 0 ignores the times.
    pub speed: f64,
    /// Make every op's key distinct (each block mixed with the op's number)
    /// and spread inserts over every pod: a flood of new keys.
    pub unique: bool,
}

/// The result, as printed and as `--json`.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Ops (lookups and inserts) answered per second of measured time.
    pub ops_per_sec: f64,
    /// Frame latency percentiles in microseconds.
    pub p50_us: u64,
    /// 90th percentile.
    pub p90_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest frame.
    pub max_us: u64,
    /// Ops that failed for another reason than a timeout.
    pub errors: u64,
    /// Frames that passed their deadline.
    pub timeouts: u64,
    /// Ops answered in the measured time.
    pub ops: u64,
    /// Frames answered in the measured time.
    pub frames: u64,
    /// Measured seconds.
    pub seconds: f64,
    /// Where the CPU went in the measured time (absent where it cannot be
    /// read).
    #[serde(flatten)]
    pub cpu: Option<CpuUse>,
}

/// Per-worker tallies, merged at the end.
struct Tally {
    hist: Histogram<u64>,
    ops: u64,
    frames: u64,
    errors: u64,
    timeouts: u64,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            // 1 µs to 60 s at 3 significant digits.
            hist: Histogram::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds"),
            ops: 0,
            frames: 0,
            errors: 0,
            timeouts: 0,
        }
    }

    fn merge(&mut self, o: &Tally) {
        let _ = self.hist.add(&o.hist);
        self.ops += o.ops;
        self.frames += o.frames;
        self.errors += o.errors;
        self.timeouts += o.timeouts;
    }
}

/// Shared run state.
struct Run {
    plan: Plan,
    start: Instant,
    measure_from: Instant,
    stop: AtomicBool,
    /// Ops done (measured or not), for the progress bar.
    done: AtomicU64,
    /// Next request of the source.
    cursor: AtomicUsize,
    source: Source,
}

/// Builds the ops of one frame from workload requests.
struct Maker {
    rng: rand::rngs::SmallRng,
}

impl Maker {
    fn new(seed: u64) -> Maker {
        use rand::SeedableRng;
        Maker {
            rng: rand::rngs::SmallRng::seed_from_u64(seed ^ 0x9e37_79b9),
        }
    }

    fn op(&mut self, run: &Run, gateway: usize) -> Op {
        use rand::Rng;
        let plan = &run.plan;
        // Relaxed: a ticket counter, no data hangs on it.
        let i = run.cursor.fetch_add(1, Ordering::Relaxed);
        let r = &run.source.requests[i % run.source.requests.len()];
        let (key, session) = if run.source.unique {
            let mix = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            (r.key.iter().map(|b| b ^ mix).collect(), i as u64)
        } else {
            (r.key.clone(), r.session)
        };
        if self.rng.random::<f64>() < plan.lookups {
            Op::Lookup {
                model: plan.model.clone(),
                key,
                candidates: None,
            }
        } else {
            let pod = format!("pod-{}", (session as usize + gateway) % plan.pods.max(1));
            if plan.receipts {
                let blocks = u32::try_from(key.len()).unwrap_or(u32::MAX);
                Op::Receipt(Receipt {
                    model: plan.model.clone(),
                    pod,
                    key,
                    prompt_tokens: None,
                    predicted_blocks: blocks,
                    cached_tokens: blocks.saturating_mul(TOKEN_BLOCK_TOKENS as u32),
                })
            } else {
                Op::Insert {
                    model: plan.model.clone(),
                    key,
                    pod,
                }
            }
        }
    }

    fn frame(&mut self, run: &Run, gateway: usize) -> Vec<Op> {
        (0..run.plan.batch.max(1))
            .map(|_| self.op(run, gateway))
            .collect()
    }
}

/// What became of one frame.
enum Outcome {
    /// Sent before the measured time began.
    Warmup,
    /// Answered after `us` microseconds; `failed` of its `ops` were refused.
    Answered { us: u64, ops: u64, failed: u64 },
    /// Passed its deadline.
    Timeout,
    /// Failed whole (disconnected, refused, ...).
    Failed { ops: u64 },
}

impl Tally {
    fn record(&mut self, o: Outcome) {
        match o {
            Outcome::Warmup => {}
            Outcome::Answered { us, ops, failed } => {
                let _ = self.hist.record(us.max(1));
                self.ops += ops - failed;
                self.frames += 1;
                self.errors += failed;
            }
            Outcome::Timeout => self.timeouts += 1,
            Outcome::Failed { ops } => self.errors += ops,
        }
    }
}

/// Sends one frame; latency counts from `scheduled`.
async fn send(client: &Client, ops: Vec<Op>, scheduled: Instant, run: &Run) -> Outcome {
    let n = ops.len() as u64;
    let result = if n == 1 {
        let op = ops.into_iter().next().expect("one op");
        let request = prefix_proto::Request::One(op);
        client.call(request).await.map(|r| match r {
            prefix_proto::Response::One(Reply::Error { .. }) => 1,
            _ => 0,
        })
    } else {
        client.batch(ops).await.map(|replies| {
            replies
                .iter()
                .filter(|r| matches!(r, Reply::Error { .. }))
                .count() as u64
        })
    };
    let end = Instant::now();
    // Relaxed: progress display only.
    run.done.fetch_add(n, Ordering::Relaxed);
    if scheduled < run.measure_from {
        return Outcome::Warmup;
    }
    match result {
        Ok(failed) => Outcome::Answered {
            us: end.duration_since(scheduled).as_micros() as u64,
            ops: n,
            failed,
        },
        Err(ClientError::Timeout(_)) => Outcome::Timeout,
        Err(e) => {
            tracing::debug!(error = %e, "request failed");
            Outcome::Failed { ops: n }
        }
    }
}

/// Runs the plan against `clients` (one per connection, gateway-major) and
/// returns the summary. `progress` is called about every 200 ms with the
/// elapsed time and ops done.
pub async fn run(
    plan: Plan,
    source: Source,
    clients: Vec<(usize, Client)>,
    mut progress: impl FnMut(Duration, u64) + Send + 'static,
) -> Summary {
    let start = Instant::now();
    let run = Arc::new(Run {
        measure_from: start + plan.warmup,
        start,
        stop: AtomicBool::new(false),
        done: AtomicU64::new(0),
        cursor: AtomicUsize::new(0),
        source: source.clone(),
        plan: plan.clone(),
    });
    let end = start + plan.warmup + plan.duration;
    let reporter = {
        let run = run.clone();
        tokio::spawn(async move {
            // Relaxed: a stop flag polled for display only.
            while !run.stop.load(Ordering::Relaxed) {
                progress(run.start.elapsed(), run.done.load(Ordering::Relaxed));
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        })
    };
    // CPU time over the measured window only. Reading `/proc` is file I/O:
    // on the blocking pool, not on a worker that is sending load.
    let (measure_from, probe) = (run.measure_from, plan.cpu.clone());
    let cpu_window = tokio::spawn(async move {
        // Stamped halfway through the read: a scrape of a busy server's
        // metrics page takes a while to be answered.
        let read = || {
            let probe = probe.clone();
            tokio::task::spawn_blocking(move || {
                let start = Instant::now();
                let reading = probe.read();
                (start + (Instant::now() - start) / 2, reading)
            })
        };
        tokio::time::sleep_until(measure_from.into()).await;
        let before = read().await.ok()?;
        tokio::time::sleep_until(end.into()).await;
        let after = read().await.ok()?;
        Some((before, after))
    });
    let (spinners, stop_spinning) = (TaskTracker::new(), CancellationToken::new());
    // Stops them however this function ends.
    let _stop_spinning = stop_spinning.clone().drop_guard();
    if plan.busy_poll {
        BusyPoll::always().start(&spinners, &stop_spinning);
    }
    let mut workers = tokio::task::JoinSet::new();
    match plan.rate {
        Some(rate) => open_loop(&run, clients, rate, end, &mut workers),
        None if source.speed > 0.0 => trace_loop(&run, clients, end, &mut workers),
        None => {
            for (c, (gateway, client)) in clients.into_iter().enumerate() {
                for slot in 0..plan.in_flight.max(1) {
                    let (run, client) = (run.clone(), client.clone());
                    let mut maker = Maker::new((c * 1000 + slot) as u64);
                    workers.spawn(async move {
                        let mut tally = Tally::new();
                        while Instant::now() < end {
                            let ops = maker.frame(&run, gateway);
                            tally.record(send(&client, ops, Instant::now(), &run).await);
                        }
                        tally
                    });
                }
            }
        }
    }
    let mut total = Tally::new();
    while let Some(t) = workers.join_next().await {
        if let Ok(t) = t {
            total.merge(&t);
        }
    }
    stop_spinning.cancel();
    spinners.close();
    spinners.wait().await;
    // Relaxed: see the reporter.
    run.stop.store(true, Ordering::Relaxed);
    let _ = reporter.await;
    let seconds = plan.duration.as_secs_f64().max(1e-9);
    let cpu = match cpu_window.await {
        Ok(Some(((t0, before), (t1, after)))) => Some(CpuUse::between(
            before,
            after,
            (t1 - t0).as_secs_f64(),
            total.ops,
        )),
        _ => None,
    };
    let h = &total.hist;
    let q = |p: f64| {
        if h.is_empty() {
            0
        } else {
            h.value_at_quantile(p)
        }
    };
    Summary {
        ops_per_sec: total.ops as f64 / seconds,
        p50_us: q(0.5),
        p90_us: q(0.9),
        p99_us: q(0.99),
        p999_us: q(0.999),
        max_us: if h.is_empty() { 0 } else { h.max() },
        errors: total.errors,
        timeouts: total.timeouts,
        ops: total.ops,
        frames: total.frames,
        seconds,
        cpu,
    }
}

/// Largest number of frames an open-loop connection may have in flight; past
/// it, scheduled frames are counted as errors rather than queued without
/// bound.
const OPEN_LOOP_CAP: usize = 100_000;

/// Open loop: frames at `rate` per second over all connections.
fn open_loop(
    run: &Arc<Run>,
    clients: Vec<(usize, Client)>,
    rate: f64,
    end: Instant,
    workers: &mut tokio::task::JoinSet<Tally>,
) {
    let interval = Duration::from_secs_f64(1.0 / rate.max(1e-3));
    let start = run.start;
    let times = (0u64..).map(move |k| start + interval.mul_f64(k as f64));
    paced(run, clients, end, workers, times);
}

/// Trace replay at the trace's own pace (scaled by `speed`).
fn trace_loop(
    run: &Arc<Run>,
    clients: Vec<(usize, Client)>,
    end: Instant,
    workers: &mut tokio::task::JoinSet<Tally>,
) {
    let (requests, speed, start) = (run.source.requests.clone(), run.source.speed, run.start);
    let times = (0..requests.len())
        .map(move |i| start + Duration::from_secs_f64(requests[i].at_ms as f64 / 1000.0 / speed));
    paced(run, clients, end, workers, times);
}

/// Sends a frame at each of `times` (until `end`), round-robin over the
/// connections. A pacing thread waits for each time (its `nanosleep` is
/// precise to tens of microseconds, tokio's timer to a millisecond) and hands
/// it to the connection's dispatcher, which sends the frame at once on its own
/// task; latency counts from the scheduled time. With busy polling a task
/// polling the clock paces instead.
fn paced(
    run: &Arc<Run>,
    clients: Vec<(usize, Client)>,
    end: Instant,
    workers: &mut tokio::task::JoinSet<Tally>,
    times: impl Iterator<Item = Instant> + Send + 'static,
) {
    let n = clients.len().max(1);
    let mut senders = Vec::with_capacity(n);
    for (c, (gateway, client)) in clients.into_iter().enumerate() {
        let (tx, rx) = mpsc::unbounded_channel::<Instant>();
        senders.push(tx);
        let maker = Maker::new(c as u64);
        workers.spawn(dispatch(run.clone(), client, gateway, maker, rx));
    }
    let due = times.take_while(move |&at| at < end).enumerate();
    // False once the dispatcher is gone (the run is over).
    let hand_over = move |k: usize, at: Instant| senders[k % n].send(at).is_ok();
    if run.plan.busy_poll {
        // On a worker, polling the clock between other tasks: no thread to
        // wake per frame.
        tokio::spawn(async move {
            for (k, at) in due {
                while Instant::now() < at {
                    tokio::task::yield_now().await;
                }
                if !hand_over(k, at) {
                    break;
                }
            }
        });
    } else {
        std::thread::spawn(move || {
            for (k, at) in due {
                let now = Instant::now();
                if at > now {
                    std::thread::sleep(at - now);
                }
                if !hand_over(k, at) {
                    break;
                }
            }
        });
    }
}

async fn dispatch(
    run: Arc<Run>,
    client: Client,
    gateway: usize,
    mut maker: Maker,
    mut schedule: mpsc::UnboundedReceiver<Instant>,
) -> Tally {
    let mut tally = Tally::new();
    let mut tasks = tokio::task::JoinSet::new();
    while let Some(at) = schedule.recv().await {
        let ops = maker.frame(&run, gateway);
        while let Some(done) = tasks.try_join_next() {
            if let Ok(o) = done {
                tally.record(o);
            }
        }
        if tasks.len() >= OPEN_LOOP_CAP {
            tally.record(Outcome::Failed {
                ops: ops.len() as u64,
            });
            continue;
        }
        let (run, client) = (run.clone(), client.clone());
        tasks.spawn(async move { send(&client, ops, at, &run).await });
    }
    while let Some(done) = tasks.join_next().await {
        if let Ok(o) = done {
            tally.record(o);
        }
    }
    tally
}
