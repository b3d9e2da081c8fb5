//! Busy polling: keep the runtime's workers polling the network between
//! requests instead of sleeping, for a while after the last one.
//!
//! A worker with nothing to do sleeps in `epoll_wait`, and the next packet
//! must wake it. On a virtual machine that wake-up is an inter-processor
//! interrupt through the hypervisor and a context switch: tens of
//! microseconds, often more than the request's own work, and it comes back
//! at every frame when frames arrive one at a time (measured in
//! `docs/benchmarks.md`). A worker that never sleeps finds the packet on its
//! next poll instead.
//!
//! A [`BusyPoll`] runs one *spinner* task per worker. A spinner yields to
//! the scheduler in a loop; tokio polls its I/O driver without blocking
//! whenever a yielded task is waiting, so each turn is one non-blocking
//! `epoll_wait` and whatever work it found. The serving path calls
//! [`BusyPoll::touch`] on every read; once no read has come for the
//! configured window the spinners park and the workers sleep as usual, so an
//! idle server costs nothing. The next read wakes them.
//!
//! The price is CPU: while traffic flows, and for the window after it, every
//! worker runs at 100% whatever the load. Give the server cores of its own.
//!
//! Everything here is a hint. A lost or late wake-up (the flags below use
//! plain loads on the serving path) only means some requests take the
//! sleeping path, as they would without busy polling; no request ever waits
//! for a spinner.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// How often a spinner looks at the activity flag. Short next to any useful
/// window, long enough that the flag's cache line is not moved between cores
/// on every turn.
const CHECK_EVERY: Duration = Duration::from_micros(50);

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
    wake: Notify,
}

impl BusyPoll {
    /// Spinners keep polling for `window` after the last read.
    pub fn new(window: Duration) -> Arc<Self> {
        Arc::new(BusyPoll {
            window,
            origin: Instant::now(),
            seen: AtomicBool::new(false),
            last_active: AtomicU64::new(0),
            parked: AtomicBool::new(false),
            wake: Notify::new(),
        })
    }

    /// Notes a read: keeps the spinners spinning, or wakes parked ones.
    /// Called on the serving path; it costs two loads of a cache line that
    /// is written about once per [`CHECK_EVERY`], and a store when it is.
    #[inline]
    pub fn touch(&self) {
        // SeqCst here and in `spin` before parking: a spinner stores `parked`
        // and then loads `seen`, we store `seen` and then load `parked`, so at
        // least one of the two sees the other's store and a read is not left
        // without a spinner (x86 compiles these loads to plain moves).
        if !self.seen.load(Ordering::SeqCst) {
            self.seen.store(true, Ordering::SeqCst);
        }
        if self.parked.load(Ordering::SeqCst) && self.parked.swap(false, Ordering::SeqCst) {
            self.wake.notify_waiters();
        }
    }

    /// Starts one spinner per worker of the current runtime, on `tracker`;
    /// they stop at `stop`.
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

    /// Whether a read came within the window before `now`; clears `seen`.
    fn active(&self, now: Instant) -> bool {
        let t = self.micros(now);
        // Relaxed: a hint (see the module docs); `touch` sets it again.
        if self.seen.swap(false, Ordering::Relaxed) {
            // Relaxed: only ever compared with the clock, by spinners.
            self.last_active.fetch_max(t, Ordering::Relaxed);
            return true;
        }
        let window = u64::try_from(self.window.as_micros()).unwrap_or(u64::MAX);
        // Relaxed: as above.
        t.saturating_sub(self.last_active.load(Ordering::Relaxed)) <= window
    }

    /// One spinner: yield in a loop while reads keep coming, park when they
    /// stop, until `stop`.
    async fn spin(self: Arc<Self>, stop: CancellationToken) {
        // A spinner starts spinning: the window counts from now.
        self.last_active
            .fetch_max(self.micros(Instant::now()), Ordering::Relaxed);
        let mut next_check = Instant::now();
        loop {
            if stop.is_cancelled() {
                return;
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
            let notified = self.wake.notified();
            let mut notified = std::pin::pin!(notified);
            // Registered before `parked` is set, so a `touch` that sees the
            // flag also reaches this waiter.
            notified.as_mut().enable();
            // SeqCst: see `touch`.
            self.parked.store(true, Ordering::SeqCst);
            if self.seen.load(Ordering::SeqCst) {
                // A read slipped in between: keep spinning.
                continue;
            }
            tokio::select! {
                _ = notified => {}
                _ = stop.cancelled() => return,
            }
            self.last_active
                .fetch_max(self.micros(Instant::now()), Ordering::Relaxed);
        }
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

    /// Waits until the spinner has been polled `n` more times: it spins. A
    /// parked one never gets there; the deadline only ends a failing test.
    fn keeps_polling(polls: &AtomicU64, n: u64) {
        let (start, deadline) = (
            polls.load(Ordering::Relaxed),
            Instant::now() + Duration::from_secs(20),
        );
        while polls.load(Ordering::Relaxed) - start < n {
            assert!(Instant::now() < deadline, "the spinner stopped spinning");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits until the spinner goes 50 ms without a poll: it parked.
    fn parks(polls: &AtomicU64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let before = polls.load(Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(50));
            if polls.load(Ordering::Relaxed) == before {
                return;
            }
            assert!(Instant::now() < deadline, "the spinner never parked");
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
    fn spins_without_reads_until_the_window_ends() {
        let rt = one_worker();
        let busy = BusyPoll::new(Duration::from_secs(3600));
        let (stop, polls) = (CancellationToken::new(), Arc::new(AtomicU64::new(0)));
        let task = rt.spawn(counted(busy, stop.clone(), polls.clone()));
        keeps_polling(&polls, 10_000);
        stop.cancel();
        rt.block_on(task).unwrap();
    }

    #[test]
    fn parks_when_reads_stop_and_wakes_at_the_next() {
        let rt = one_worker();
        let busy = BusyPoll::new(Duration::from_millis(5));
        let (stop, polls) = (CancellationToken::new(), Arc::new(AtomicU64::new(0)));
        let task = rt.spawn(counted(busy.clone(), stop.clone(), polls.clone()));
        parks(&polls);
        let parked_at = polls.load(Ordering::Relaxed);
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
        keeps_polling(&polls, 10_000);
        reading.store(false, Ordering::Relaxed);
        reader.join().unwrap();
        parks(&polls);
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
        let busy = BusyPoll::new(Duration::from_secs(3600));
        let (tracker, stop) = (TaskTracker::new(), CancellationToken::new());
        rt.block_on(async {
            busy.start(&tracker, &stop);
            assert_eq!(tracker.len(), 2);
            tokio::time::sleep(Duration::from_millis(20)).await;
            stop.cancel();
            tracker.close();
            tokio::time::timeout(Duration::from_secs(20), tracker.wait())
                .await
                .expect("spinners stop when told");
        });
    }
}
