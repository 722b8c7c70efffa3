//! Open-loop send schedule.
//!
//! Request `i` of a run at `rate` requests/s is due at `i / rate` seconds after the start,
//! whatever happened to earlier requests. Latency is measured from that due time, so a
//! stall in the system under test (or in the load generator) shows up in the percentiles
//! instead of silently lowering the offered load (coordinated omission, as wrk2 and
//! `oha -q` avoid it).
//!
//! With several generator threads, thread `k` of `n` takes the global indices
//! `k, k + n, k + 2n, ...`, so the union of all threads is exactly the single schedule.

use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    rate: f64,
    stride: u64,
    offset: u64,
}

impl Schedule {
    /// The share of thread `thread` out of `threads` of a schedule at `rate` requests/s.
    pub fn new(rate: f64, threads: usize, thread: usize) -> Schedule {
        assert!(rate.is_finite() && rate > 0.0, "rate must be positive");
        assert!(threads > 0 && thread < threads);
        Schedule {
            rate,
            stride: threads as u64,
            offset: thread as u64,
        }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Global index of this thread's `j`-th request.
    pub fn global_index(&self, j: u64) -> u64 {
        self.offset + j * self.stride
    }

    /// When this thread's `j`-th request is due, from the start of the run.
    pub fn due(&self, j: u64) -> Duration {
        let i = self.global_index(j) as f64;
        Duration::from_nanos((i * 1e9 / self.rate).round() as u64)
    }

    /// How many requests of the whole schedule (all threads) are due strictly before `d`.
    pub fn total_within(rate: f64, d: Duration) -> u64 {
        (d.as_secs_f64() * rate).ceil() as u64
    }

    /// How many of this thread's requests are due strictly before `d`, capped so that the
    /// whole schedule sends no more than `max_total` requests.
    pub fn count_within(&self, d: Duration, max_total: Option<u64>) -> u64 {
        let mut g = Schedule::total_within(self.rate, d);
        if let Some(m) = max_total {
            g = g.min(m);
        }
        if g <= self.offset {
            0
        } else {
            (g - self.offset).div_ceil(self.stride)
        }
    }
}

/// Poisson arrivals: due times with exponential gaps of mean `1 / rate`, from a seed, so
/// a run can be repeated. The fixed schedule's count is an upper bound on how many are
/// asked for; `next_due` ends the stream at the run's duration.
#[derive(Debug, Clone)]
pub struct Poisson {
    rate: f64,
    rng: fastrand::Rng,
    t: f64,
}

impl Poisson {
    pub fn new(rate: f64, seed: u64) -> Poisson {
        assert!(rate.is_finite() && rate > 0.0, "rate must be positive");
        Poisson {
            rate,
            rng: fastrand::Rng::with_seed(seed),
            t: 0.0,
        }
    }

    /// The next due time from the start, or None once it would be at or past `end`.
    pub fn next_due(&mut self, end: Duration) -> Option<Duration> {
        // 1 - U is in (0, 1], so the logarithm is finite.
        self.t += -(1.0 - self.rng.f64()).ln() / self.rate;
        (self.t < end.as_secs_f64()).then(|| Duration::from_secs_f64(self.t))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_gaps_average_one_over_rate() {
        let mut p = Poisson::new(1000.0, 7);
        let end = Duration::from_secs(20);
        let mut n = 0u64;
        let mut last = Duration::ZERO;
        let mut short = 0u64; // gaps under the mean: 1 - 1/e = 63 % of them
        while let Some(d) = p.next_due(end) {
            assert!(d >= last);
            if (d - last).as_secs_f64() < 1e-3 {
                short += 1;
            }
            last = d;
            n += 1;
        }
        assert!(
            (19_500..20_500).contains(&n),
            "{n} arrivals in 20 s at 1000/s"
        );
        let share = short as f64 / n as f64;
        assert!((0.61..0.65).contains(&share), "{share}");
        // Same seed, same stream.
        let (mut a, mut b) = (Poisson::new(50.0, 1), Poisson::new(50.0, 1));
        assert_eq!(a.next_due(end), b.next_due(end));
    }

    #[test]
    fn fixed_interval() {
        let s = Schedule::new(1000.0, 1, 0);
        assert_eq!(s.due(0), Duration::ZERO);
        assert_eq!(s.due(1), Duration::from_millis(1));
        assert_eq!(s.due(2500), Duration::from_millis(2500));
        let s = Schedule::new(3.0, 1, 0);
        assert_eq!(s.due(1), Duration::from_nanos(333_333_333));
        assert_eq!(s.due(3), Duration::from_secs(1));
    }

    #[test]
    fn count_within_duration() {
        let s = Schedule::new(1000.0, 1, 0);
        assert_eq!(s.count_within(Duration::from_secs(1), None), 1000);
        assert_eq!(s.count_within(Duration::from_secs(1), Some(200)), 200);
        assert_eq!(s.count_within(Duration::ZERO, None), 0);
        // Every counted request is due before the end, the next one is not.
        let d = Duration::from_millis(1234);
        let n = s.count_within(d, None);
        assert!(s.due(n - 1) < d && s.due(n) >= d);
        // Non-integral: 2.5 req/s for 1 s sends at 0 s and 0.4 s and 0.8 s.
        let s = Schedule::new(2.5, 1, 0);
        assert_eq!(s.count_within(Duration::from_secs(1), None), 3);
    }

    #[test]
    fn threads_partition_the_schedule() {
        let rate = 1000.0;
        let d = Duration::from_secs(1);
        let single = Schedule::new(rate, 1, 0);
        let mut all: Vec<Duration> = Vec::new();
        let mut counts = Vec::new();
        for k in 0..3 {
            let s = Schedule::new(rate, 3, k);
            let n = s.count_within(d, None);
            counts.push(n);
            all.extend((0..n).map(|j| s.due(j)));
        }
        assert_eq!(counts, vec![334, 333, 333]);
        all.sort();
        let expect: Vec<Duration> = (0..1000).map(|i| single.due(i)).collect();
        assert_eq!(all, expect);
        // A cap on the total is shared the same way.
        let capped: u64 = (0..3)
            .map(|k| Schedule::new(rate, 3, k).count_within(d, Some(10)))
            .sum();
        assert_eq!(capped, 10);
    }

    #[test]
    fn more_threads_than_requests() {
        let total: u64 = (0..8)
            .map(|k| Schedule::new(100.0, 8, k).count_within(Duration::from_millis(30), None))
            .sum();
        assert_eq!(total, 3);
    }
}
