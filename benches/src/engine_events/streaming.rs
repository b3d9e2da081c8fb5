//! The `lookup_while_streaming/…` group: lookups while another thread
//! applies the events that follow the trace.

use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use engine_sim::{Pods, Step};

use super::{Group, Ours, Peer, Workload, NOW, PODS, STREAM_RATE};

/// The requests after the replay (the trace again, round-robin going on),
/// served to pods whose caches start as the replay left them.
struct Requests {
    pods: Pods,
    next: usize,
}

impl Requests {
    fn new(w: &Workload) -> Self {
        Requests {
            pods: w.pods.clone(),
            next: w.requests.len(),
        }
    }

    /// The next request's step.
    fn step(&mut self, w: &Workload) -> Step {
        let g = self.next;
        self.next += 1;
        self.pods.serve(g % PODS, &w.requests[g % w.requests.len()])
    }
}

/// Keeps `STREAM_RATE` block operations a second from `start`: sleeps
/// while `ops` are ahead of it.
fn keep_rate(start: Instant, ops: u64) {
    while ops as f64 > start.elapsed().as_secs_f64() * STREAM_RATE as f64 {
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Serves the requests after the replay and hands each step to `apply`,
/// at `STREAM_RATE` block operations a second, until `stop`; block
/// operations applied and the time taken.
pub fn stream(w: &Workload, stop: &AtomicBool, mut apply: impl FnMut(&Step)) -> (u64, Duration) {
    let mut requests = Requests::new(w);
    let start = Instant::now();
    let mut ops = 0u64;
    // Relaxed: a flag polled between steps, ordering nothing else.
    while !stop.load(Ordering::Relaxed) {
        keep_rate(start, ops);
        let step = requests.step(w);
        apply(&step);
        ops += step.block_ops();
    }
    (ops, start.elapsed())
}

/// Measures `lookups` while `writer` streams events in (it runs from
/// before the function's warm-up to after its last sample).
pub fn while_writing(
    g: &mut Group<'_>,
    name: &str,
    parameter: &str,
    lookups: impl Fn(),
    writer: impl FnOnce(&AtomicBool) -> (u64, Duration) + Send,
) {
    let id = BenchmarkId::new(name, parameter);
    let stop = AtomicBool::new(false);
    let (ops, took) = std::thread::scope(|s| {
        let writer = s.spawn(|| writer(&stop));
        g.bench_function(id, |b| b.iter(&lookups));
        // Relaxed: see `stream`.
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("the writer thread")
    });
    if ops > 0 {
        eprintln!(
            "lookup_while_streaming/{name}/{parameter}: the writer applied {ops} block operations in {:.1} s ({:.0}/s)",
            took.as_secs_f64(),
            ops as f64 / took.as_secs_f64()
        );
    }
}

/// Applies streamed steps to our index and runs the server's maintenance
/// loop (`server/src/maintenance.rs`) on the writer's clock: every second,
/// a full sweep pass in calls of 65,536 nodes (the defaults), if
/// `Index::sweep_due` says one is due, or always with `every_second`.
fn our_writer<'a>(w: &'a Workload, o: &'a Ours, every_second: bool) -> impl FnMut(&Step) + 'a {
    let start = Instant::now();
    let mut tick = start;
    let (mut passes, mut swept, mut seconds) = (0u32, Duration::ZERO, 0u32);
    move |s| {
        black_box(o.apply(&w.names, [s]));
        if tick.elapsed() < Duration::from_secs(1) {
            return;
        }
        tick = Instant::now();
        seconds += 1;
        let now = NOW + start.elapsed().as_millis() as u64;
        if every_second || o.index.sweep_due(now) {
            loop {
                let r = o.index.sweep(now, 65_536);
                if r.passes > 0 || r.visited < 65_536 {
                    break;
                }
            }
            passes += 1;
            swept += tick.elapsed();
        }
        if seconds % 5 == 0 {
            let st = o.index.stats();
            eprintln!(
                "  writer at {seconds} s: {passes} sweep passes ({:.0} ms); {} nodes, {} tree blocks, {} entries",
                swept.as_secs_f64() * 1e3,
                st.nodes,
                st.tree_blocks,
                st.entries
            );
        }
    }
}

/// What the writer of `alternated` does.
const STILL: u8 = 0;
/// Streams into the index the lookups read.
const INTO_READ: u8 = 1;
/// Streams into a copy of it that nobody reads.
const INTO_COPY: u8 = 2;

/// Lookups on `read` in three states taken in turn, each criterion sample
/// one round: the writer still, streaming into `read` at `STREAM_RATE`, and
/// streaming at the same rate into `copy`, an index nobody reads. Criterion
/// times the second; the printed line gives each round's rates over the
/// still one taken beside it. The third state has every cost of a writer
/// on this machine (a core's share, the shared cache, memory bandwidth)
/// and none of sharing the index, so what the second loses beyond it is
/// what our index's writers cost its readers. Rounds rotate the order of
/// the states, so a drift of the machine's speed falls on all three alike.
fn alternated(g: &mut Group<'_>, w: &Workload, read: &Ours, copy: &Ours) {
    let mode = AtomicU8::new(STILL);
    let stop = AtomicBool::new(false);
    // Lookups a second in each state, one row per round.
    let rounds = std::cell::RefCell::new(Vec::<[f64; 3]>::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut writers = [our_writer(w, read, false), our_writer(w, copy, false)];
            let mut requests = [Requests::new(w), Requests::new(w)];
            let (mut was, mut start, mut ops) = (STILL, Instant::now(), 0u64);
            // Relaxed: flags polled between steps, ordering nothing else.
            while !stop.load(Ordering::Relaxed) {
                let now = mode.load(Ordering::Relaxed);
                if now != was {
                    (was, start, ops) = (now, Instant::now(), 0);
                }
                let i = match now {
                    INTO_READ => 0,
                    INTO_COPY => 1,
                    _ => {
                        std::thread::sleep(Duration::from_micros(200));
                        continue;
                    }
                };
                keep_rate(start, ops);
                let step = requests[i].step(w);
                writers[i](&step);
                ops += step.block_ops();
            }
        });
        let id = BenchmarkId::new(
            "ours",
            format!("streaming_{}k_blocks_per_s,alternated", STREAM_RATE / 1000),
        );
        g.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let mut took = [Duration::ZERO; 3];
                let round = rounds.borrow().len();
                for k in 0..3 {
                    let state = (round + k) % 3;
                    // Relaxed: see the writer.
                    mode.store(state as u8, Ordering::Relaxed);
                    // The writer's next step starts the state's stream.
                    std::thread::sleep(Duration::from_millis(5));
                    let start = Instant::now();
                    let mut out = Vec::new();
                    for _ in 0..iters {
                        black_box(read.lookups(&w.our_keys, &mut out));
                    }
                    took[state] = start.elapsed();
                }
                mode.store(STILL, Ordering::Relaxed);
                let rate = |t: Duration| (iters * w.our_keys.len() as u64) as f64 / t.as_secs_f64();
                rounds.borrow_mut().push(took.map(rate));
                took[INTO_READ as usize]
            })
        });
        // Relaxed: see the writer.
        stop.store(true, Ordering::Relaxed);
    });
    let rounds = rounds.into_inner();
    // None when a filter left the benchmark out.
    if rounds.is_empty() {
        return;
    }
    let ratios = |state: u8| {
        let mut r: Vec<f64> = rounds
            .iter()
            .map(|x| x[state as usize] / x[STILL as usize])
            .collect();
        r.sort_by(f64::total_cmp);
        format!(
            "median {:.2}× (range {:.2}–{:.2}×)",
            r[r.len() / 2],
            r[0],
            r[r.len() - 1]
        )
    };
    let mut still: Vec<f64> = rounds.iter().map(|x| x[STILL as usize]).collect();
    still.sort_by(f64::total_cmp);
    eprintln!(
        "lookup_while_streaming/ours/alternated, {} rounds (still: median {:.2} M lookups/s): streaming into the index read, over still: {}; streaming into a copy nobody reads, over still: {}",
        rounds.len(),
        still[still.len() / 2] / 1e6,
        ratios(INTO_READ),
        ratios(INTO_COPY),
    );
}

/// Lookups read-only, while streaming, read-only again on what the stream
/// left, while streaming with a sweep every second, and [`alternated`];
/// then `peer`'s rows.
pub(super) fn lookups_while_streaming(
    c: &mut Criterion,
    w: &Workload,
    ours: &Ours,
    peer: &mut impl Peer,
) {
    let mut g = c.benchmark_group(format!(
        "lookup_while_streaming/mooncake_{}_requests",
        w.our_keys.len()
    ));
    g.sample_size(20);
    g.throughput(Throughput::Elements(w.our_keys.len() as u64));
    let stream_id = format!("streaming_{}k_blocks_per_s", STREAM_RATE / 1000);
    let our_lookups = |o: &Ours| {
        let mut out = Vec::new();
        black_box(o.lookups(&w.our_keys, &mut out));
    };
    g.bench_function(BenchmarkId::new("ours", "read_only"), |b| {
        b.iter(|| our_lookups(ours))
    });
    while_writing(
        &mut g,
        "ours",
        &stream_id,
        || our_lookups(ours),
        |stop| stream(w, stop, our_writer(w, ours, false)),
    );
    // Read-only again, on what the stream left: the events change what
    // lookups find (pods' caches churn, removals mark gaps the lookups
    // then round around), so this row tells that from the writer's
    // interference.
    g.bench_function(BenchmarkId::new("ours", "read_only_after_streaming"), |b| {
        b.iter(|| our_lookups(ours))
    });
    // The same from the same start, sweeping every second whether due or not.
    let fresh = || {
        let o = Ours::new(&w.names);
        o.apply(&w.names, &w.steps);
        o.swept()
    };
    let swept = fresh();
    while_writing(
        &mut g,
        "ours",
        &format!("{stream_id}+sweep_every_1s"),
        || our_lookups(&swept),
        |stop| stream(w, stop, our_writer(w, &swept, true)),
    );
    drop(swept);
    alternated(&mut g, w, &fresh(), &fresh());
    peer.while_streaming(&mut g, w, &stream_id);
    g.finish();
}
