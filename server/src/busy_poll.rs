//! Busy polling: keep the runtime's workers polling the network between
//! requests instead of sleeping, for a while after the last one.
//!
//! A worker with nothing to do sleeps in `epoll_wait`, and the next packet
//! must wake it. On a virtual machine that wake-up is an inter-processor
//! interrupt through the hypervisor and a context switch: tens of
//! microseconds, often more than the request's own work, and it comes back
//! at every frame when frames arrive one at a time (measured in
//! `docs/benchmarks.md`). A worker that does not sleep finds the packet on
//! its next poll instead.
//!
//! A [`BusyPoll`] starts as many *spinner* tasks as the runtime has workers.
//! A spinner yields to the scheduler in a loop. A tokio worker whose only
//! work is a yielded task polls the I/O driver with a zero timeout before
//! running it again, so each turn is a non-blocking `epoll_wait` (by the one
//! worker that holds the driver at that moment; the others just turn) and
//! whatever work it found. tokio places tasks, not we: the spinners usually
//! spread over the workers by work stealing, but a worker left without one
//! sleeps as usual. The serving path calls [`BusyPoll::touch`] on every read;
//! once no read has come for the configured window the spinners park and the
//! workers sleep as usual, so an idle server costs nothing; the next read
//! wakes them (that read itself takes the sleeping path).
//!
//! The price is CPU: while traffic flows, and for the window after it, every
//! worker runs at 100% whatever the load. Give the server cores of its own.
//!
//! Everything here is a hint. A lost or late wake-up only means some requests
//! take the sleeping path, as they would without busy polling: a request
//! never waits for a spinner. The serving path's cost is two loads, a store
//! about once per [`CHECK_EVERY`], and when spinners have parked, one
//! `notify_waiters` (a short mutex inside tokio's `Notify`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often a spinner looks at the activity flag. Short next to any useful
/// window (a window shorter than this acts as this long), long enough that
/// the flag's cache line is not moved between cores on every turn.
pub const CHECK_EVERY: Duration = Duration::from_micros(50);

/// Shared state of one server's spinners.
pub struct BusyPoll {
    /// Keep spinning this long after the last read.
    window: Duration,
    /// Time zero of `last_active`.
    origin: Instant,
    /// A read came since a spinner last looked.
    seen: AtomicBool,
    /// Microseconds from `origin` to the last time a spinner saw `seen`.
    last_active: AtomicU64,
    /// Some spinner is parked (or about to): the next read should wake them.
    parked: AtomicBool,
    /// Where parked spinners wait.
    wake: Notify,
    /// Spinners spinning right now (the others are parked or gone).
    spinning: Gauge,
}

impl BusyPoll {
    /// Spinners keep polling for `window` after the last read.
    pub fn new(window: Duration) -> Arc<Self> {
        Self::with_gauge(window, Gauge::default())
    }

    /// As [`BusyPoll::new`], counting the spinners spinning in `spinning`
    /// (the server's metric).
    pub fn with_gauge(window: Duration, spinning: Gauge) -> Arc<Self> {
        Arc::new(BusyPoll {
            window,
            origin: Instant::now(),
            seen: AtomicBool::new(false),
            last_active: AtomicU64::new(0),
            parked: AtomicBool::new(false),
            wake: Notify::new(),
            spinning,
        })
    }

    /// Spinners that never park: for a load generator, for the length of a
    /// run.
    pub fn always() -> Arc<Self> {
        Self::new(Duration::MAX)
    }

    /// Spinners spinning right now.
    pub fn spinning(&self) -> i64 {
        self.spinning.get()
    }

    /// Notes a read: keeps the spinners spinning, or wakes parked ones.
    #[inline]
    pub fn touch(&self) {
        // SeqCst, here and in `spin` before parking: a spinner stores
        // `parked` and then loads `seen`; we store `seen` (or find it already
        // set: then it stays set until a spinner's SeqCst swap, which that
        // spinner follows by spinning on) and then load `parked`. So at least
        // one side sees the other, and a read is not left with every spinner
        // parked. On x86 these loads are plain moves.
        if !self.seen.load(Ordering::SeqCst) {
            self.seen.store(true, Ordering::SeqCst);
        }
        if self.parked.load(Ordering::SeqCst) && self.parked.swap(false, Ordering::SeqCst) {
            self.wake.notify_waiters();
        }
    }

    /// Starts one spinner per worker of the current runtime, on `tracker`;
    /// they stop at `stop`.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start(self: &Arc<Self>, tracker: &TaskTracker, stop: &CancellationToken) {
        let workers = tokio::runtime::Handle::current().metrics().num_workers();
        for _ in 0..workers.max(1) {
            tracker.spawn(self.clone().spin(stop.clone()));
        }
    }

    /// Microseconds since `origin`.
    fn micros(&self, at: Instant) -> u64 {
        u64::try_from(at.duration_since(self.origin).as_micros()).unwrap_or(u64::MAX)
    }

    /// Marks `now` as a time of activity.
    fn active_at(&self, now: Instant) {
        // Relaxed: a timestamp only ever compared with the clock, by
        // spinners; a stale read makes one spin a little longer or park a
        // little early, nothing more.
        self.last_active
            .fetch_max(self.micros(now), Ordering::Relaxed);
    }

    /// Whether a read came within the window before `now`; clears `seen`.
    fn active(&self, now: Instant) -> bool {
        // SeqCst: part of the pairing described in `touch`.
        if self.seen.swap(false, Ordering::SeqCst) {
            self.active_at(now);
            return true;
        }
        let window = u64::try_from(self.window.as_micros()).unwrap_or(u64::MAX);
        // Relaxed: see `active_at`.
        let last = self.last_active.load(Ordering::Relaxed);
        self.micros(now).saturating_sub(last) <= window
    }

    /// One spinner: yield in a loop while reads keep coming, park when they
    /// stop, until `stop`.
    async fn spin(self: Arc<Self>, stop: CancellationToken) {
        // A spinner starts spinning: the window counts from now.
        self.active_at(Instant::now());
        self.spinning.inc();
        let mut next_check = Instant::now();
        loop {
            if stop.is_cancelled() {
                break;
            }
            tokio::task::yield_now().await;
            let now = Instant::now();
            if now < next_check {
                continue;
            }
            next_check = now + CHECK_EVERY;
            if self.active(now) {
                continue;
            }
            // Created before `parked` is set: `notify_waiters` reaches every
            // `Notified` that exists when it is called, so a `touch` that
            // sees the flag wakes this one.
            let notified = self.wake.notified();
            // SeqCst: see `touch`.
            self.parked.store(true, Ordering::SeqCst);
            if self.seen.load(Ordering::SeqCst) {
                // A read slipped in between: keep spinning. `parked` stays
                // set: another spinner may have parked meanwhile and needs
                // the next read to wake it (an extra wake-up costs nothing).
                continue;
            }
            self.spinning.dec();
            tokio::select! {
                _ = notified => {}
                _ = stop.cancelled() => return,
            }
            self.spinning.inc();
            self.active_at(Instant::now());
        }
        self.spinning.dec();
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    /// A spinner whose task's polls are counted.
    async fn counted(busy: Arc<BusyPoll>, stop: CancellationToken, polls: Arc<AtomicU64>) {
        let mut fut = std::pin::pin!(busy.spin(stop));
        std::future::poll_fn(|cx| {
            polls.fetch_add(1, Ordering::Relaxed);
            fut.as_mut().poll(cx)
        })
        .await
    }

    /// Fails the test after 20 s; a working spinner gets there in
    /// milliseconds.
    fn deadline() -> Instant {
        Instant::now() + Duration::from_secs(20)
    }

    /// Waits until the spinner has been polled `n` more times: it spins.
    fn keeps_polling(polls: &AtomicU64, n: u64) {
        let (start, deadline) = (polls.load(Ordering::Relaxed), deadline());
        while polls.load(Ordering::Relaxed) - start < n {
            assert!(Instant::now() < deadline, "the spinner stopped spinning");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until `busy` has `n` spinners spinning.
    fn spinners(busy: &BusyPoll, n: i64) {
        let deadline = deadline();
        while busy.spinning() != n {
            assert!(
                Instant::now() < deadline,
                "spinning: {} not {n}",
                busy.spinning()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn one_worker() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn spins_within_the_window_without_reads() {
        let rt = one_worker();
        let busy = BusyPoll::always();
        let (stop, polls) = (CancellationToken::new(), Arc::new(AtomicU64::new(0)));
        let task = rt.spawn(counted(busy.clone(), stop.clone(), polls.clone()));
        keeps_polling(&polls, 10_000);
        assert_eq!(busy.spinning(), 1);
        stop.cancel();
        rt.block_on(task).unwrap();
        assert_eq!(busy.spinning(), 0);
    }

    #[test]
    fn parks_when_reads_stop_and_wakes_at_the_next() {
        let rt = one_worker();
        let busy = BusyPoll::new(Duration::from_millis(5));
        let (stop, polls) = (CancellationToken::new(), Arc::new(AtomicU64::new(0)));
        let task = rt.spawn(counted(busy.clone(), stop.clone(), polls.clone()));
        // Started; with no read, parked after the window and then never
        // polled.
        keeps_polling(&polls, 1);
        spinners(&busy, 0);
        let parked_at = polls.load(Ordering::Relaxed);
        // Not a threshold: a parked spinner is never polled however long
        // this waits, so the test cannot fail for a slow machine; one that
        // kept spinning would be polled thousands of times meanwhile.
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            polls.load(Ordering::Relaxed),
            parked_at,
            "parked means never polled"
        );
        // Reads keep coming: it wakes and spins far past the window.
        let reading = Arc::new(AtomicBool::new(true));
        let reader = std::thread::spawn({
            let (busy, reading) = (busy.clone(), reading.clone());
            move || {
                while reading.load(Ordering::Relaxed) {
                    busy.touch();
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        });
        spinners(&busy, 1);
        keeps_polling(&polls, 10_000);
        reading.store(false, Ordering::Relaxed);
        reader.join().unwrap();
        // Reads stop: it parks again.
        spinners(&busy, 0);
        stop.cancel();
        rt.block_on(task).unwrap();
    }

    #[test]
    fn one_spinner_per_worker_and_they_stop() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let busy = BusyPoll::always();
        let (tracker, stop) = (TaskTracker::new(), CancellationToken::new());
        rt.block_on(async {
            busy.start(&tracker, &stop);
            assert_eq!(tracker.len(), 2);
            stop.cancel();
            tracker.close();
            tokio::time::timeout(Duration::from_secs(20), tracker.wait())
                .await
                .expect("spinners stop when told");
        });
        assert_eq!(busy.spinning(), 0);
    }
}
