//! `prefix-load stalls`: how much latency the machine itself adds.
//!
//! Tail latency on loopback is bounded below by the machine: when the
//! hypervisor or the kernel takes a core away for a millisecond, every request
//! that core was carrying waits that millisecond, whatever the service does.
//! This probe runs one thread per core, each reading the clock in a tight
//! loop, and counts the gaps between consecutive reads: a gap far longer than
//! one loop turn is time the thread did not run. It reports, per threshold,
//! how often such gaps came and what share of the time lay beyond the
//! threshold. Work caught on a core during a gap waits for the rest of it, so
//! a p99 under a threshold needs that share well under 1%.
//!
//! The probe keeps every core busy, so it measures what a busy core loses:
//! other tenants' time and whatever else the kernel runs on it. On a machine
//! that is only partly busy the kernel's own work can use idle time instead,
//! so read the result as an upper estimate of the floor. Run it on an
//! otherwise idle machine, before quoting a p99.

use std::time::{Duration, Instant};

use serde::Serialize;

/// Gaps shorter than this are loop turns, not stalls.
const NOISE: Duration = Duration::from_micros(20);

/// Thresholds reported, in microseconds.
pub const THRESHOLDS_US: [u64; 4] = [100, 300, 1_000, 2_000];

/// What one threshold saw, over all threads.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Band {
    /// The threshold in microseconds.
    pub over_us: u64,
    /// Gaps longer than it, per second per thread.
    pub per_sec: f64,
    /// Share of each thread's time spent beyond the threshold inside such
    /// gaps, in percent.
    pub excess_pct: f64,
}

/// The probe's result.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Report {
    /// Probing threads.
    pub threads: usize,
    /// Seconds probed.
    pub seconds: f64,
    /// One band per threshold of [`THRESHOLDS_US`].
    pub bands: Vec<Band>,
    /// The longest gap seen, in microseconds.
    pub max_us: u64,
}

/// The gaps longer than [`NOISE`] one thread saw in `duration`.
fn probe(duration: Duration) -> Vec<Duration> {
    // Reserved up front: growing the vector inside the loop would itself show
    // as gaps. Tens of gaps a second is the norm; past this it still works.
    let mut gaps = Vec::with_capacity(1 << 16);
    let start = Instant::now();
    let mut last = start;
    loop {
        let now = Instant::now();
        let gap = now - last;
        if gap > NOISE {
            gaps.push(gap);
        }
        last = now;
        if now - start >= duration {
            return gaps;
        }
    }
}

/// Summarises the gaps `threads` threads saw over `seconds` each.
pub fn summarise(gaps: &[Duration], threads: usize, seconds: f64) -> Report {
    let span = (threads.max(1) as f64) * seconds.max(1e-9);
    let bands = THRESHOLDS_US
        .iter()
        .map(|&us| {
            let t = Duration::from_micros(us);
            let over: Vec<Duration> = gaps.iter().filter(|&&g| g > t).map(|&g| g - t).collect();
            Band {
                over_us: us,
                per_sec: over.len() as f64 / span,
                excess_pct: over.iter().map(Duration::as_secs_f64).sum::<f64>() / span * 100.0,
            }
        })
        .collect();
    Report {
        threads,
        seconds,
        bands,
        max_us: gaps.iter().max().map_or(0, |g| g.as_micros() as u64),
    }
}

/// Runs the probe on `threads` threads for `duration`.
pub fn run(threads: usize, duration: Duration) -> anyhow::Result<Report> {
    let threads = threads.max(1);
    let handles: Vec<_> = (0..threads)
        .map(|_| std::thread::spawn(move || probe(duration)))
        .collect();
    let mut gaps = Vec::new();
    for h in handles {
        gaps.extend(
            h.join()
                .map_err(|_| anyhow::anyhow!("a probe thread panicked"))?,
        );
    }
    Ok(summarise(&gaps, threads, duration.as_secs_f64()))
}

/// Prints the report as a table.
pub fn print(r: &Report) {
    println!(
        "stall probe   {} thread(s) x {:.1} s, each reading the clock nonstop",
        r.threads, r.seconds
    );
    println!("gaps over     per s per thread   share of time beyond the threshold");
    for b in &r.bands {
        println!(
            "{:>7} µs    {:>8.1}           {:.3}%",
            b.over_us, b.per_sec, b.excess_pct
        );
    }
    println!("longest gap   {} µs", r.max_us);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_count_gaps_and_the_time_beyond_each_threshold() {
        let us = Duration::from_micros;
        // One thread, 1 s: gaps of 150 µs, 500 µs and 2.5 ms.
        let r = summarise(&[us(150), us(500), us(2_500)], 1, 1.0);
        let band = |t| r.bands.iter().find(|b| b.over_us == t).unwrap().clone();
        assert_eq!(band(100).per_sec, 3.0);
        // Beyond 300 µs: 200 µs + 2,200 µs of 1 s.
        assert_eq!(band(300).per_sec, 2.0);
        assert!((band(300).excess_pct - 0.24).abs() < 1e-9);
        assert_eq!(band(1_000).per_sec, 1.0);
        assert!((band(2_000).excess_pct - 0.05).abs() < 1e-9);
        assert_eq!(r.max_us, 2_500);
        // Two threads halve the rates.
        assert_eq!(summarise(&[us(150)], 2, 1.0).bands[0].per_sec, 0.5);
    }

    #[test]
    fn a_short_probe_runs_and_stops() {
        let r = run(1, Duration::from_millis(50)).unwrap();
        assert_eq!(r.bands.len(), THRESHOLDS_US.len());
        assert!(r.seconds > 0.0);
    }
}
