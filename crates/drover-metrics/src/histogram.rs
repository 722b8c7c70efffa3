//! Latency histograms with fixed buckets, counted on atomics.
//!
//! The buckets follow the R10 preferred numbers (1, 1.25, 1.6, 2, 2.5, 3.15, 4, 5, 6.3, 8
//! per decade, steps of about 26 %) from 50 µs to 50 s: fine enough that a quantile read
//! from them (the dashboard's p50 and p99) is within a step of the truth, and fixed, so
//! histograms from every stripe, endpoint and scrape add up bucket by bucket. Prometheus
//! gets the 1–2.5–5 subset (`EXPORTED`): exact cumulative counts at those bounds, a
//! third of the lines per histogram.

use crate::stripe::Striped;
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Upper bounds of the finite buckets, in nanoseconds. A last bucket (+Inf) follows.
pub const BOUNDS_NS: [u64; 61] = [
    50_000,
    63_000,
    80_000,
    100_000,
    125_000,
    160_000,
    200_000,
    250_000,
    315_000,
    400_000,
    500_000,
    630_000,
    800_000,
    1_000_000,
    1_250_000,
    1_600_000,
    2_000_000,
    2_500_000,
    3_150_000,
    4_000_000,
    5_000_000,
    6_300_000,
    8_000_000,
    10_000_000,
    12_500_000,
    16_000_000,
    20_000_000,
    25_000_000,
    31_500_000,
    40_000_000,
    50_000_000,
    63_000_000,
    80_000_000,
    100_000_000,
    125_000_000,
    160_000_000,
    200_000_000,
    250_000_000,
    315_000_000,
    400_000_000,
    500_000_000,
    630_000_000,
    800_000_000,
    1_000_000_000,
    1_250_000_000,
    1_600_000_000,
    2_000_000_000,
    2_500_000_000,
    3_150_000_000,
    4_000_000_000,
    5_000_000_000,
    6_300_000_000,
    8_000_000_000,
    10_000_000_000,
    12_500_000_000,
    16_000_000_000,
    20_000_000_000,
    25_000_000_000,
    31_500_000_000,
    40_000_000_000,
    50_000_000_000,
];

/// Buckets: the finite ones and +Inf.
pub const BUCKETS: usize = BOUNDS_NS.len() + 1;

/// Indexes into `BOUNDS_NS` of the bounds Prometheus gets: 0.1 ms, 0.25 ms, 0.5 ms, 1 ms …
/// 25 s, 50 s (and +Inf).
pub const EXPORTED: [usize; 18] = [
    3, 7, 10, 13, 17, 20, 23, 27, 30, 33, 37, 40, 43, 47, 50, 53, 57, 60,
];

/// The exported bounds as Prometheus `le` label values (seconds), written once here
/// rather than formatted for every series of every scrape.
pub const EXPORTED_LE: [&str; 18] = [
    "0.0001", "0.00025", "0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1",
    "0.25", "0.5", "1", "2.5", "5", "10", "25", "50",
];

/// The bucket a latency falls in: the first whose bound is at least it.
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    BOUNDS_NS.partition_point(|&bound| bound < ns)
}

/// One stripe's counts.
#[derive(Debug)]
pub struct Cells {
    counts: [AtomicU64; BUCKETS],
    sum_ns: AtomicU64,
}

impl Default for Cells {
    fn default() -> Self {
        Cells {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_ns: AtomicU64::new(0),
        }
    }
}

/// A latency histogram many threads record into without contending.
#[derive(Debug, Default)]
pub struct Histogram {
    stripes: Striped<Cells>,
}

impl Histogram {
    #[inline]
    pub fn record(&self, ns: u64) {
        let cells = self.stripes.local();
        cells.counts[bucket_of(ns)].fetch_add(1, Relaxed);
        // Most queue waits are 0: adding nothing costs an atomic all the same.
        if ns != 0 {
            cells.sum_ns.fetch_add(ns, Relaxed);
        }
    }

    /// `n` observations of `ns` at once (durations a worker measured and reported).
    pub fn record_n(&self, ns: u64, n: u64) {
        if n == 0 {
            return;
        }
        let cells = self.stripes.local();
        cells.counts[bucket_of(ns)].fetch_add(n, Relaxed);
        cells.sum_ns.fetch_add(ns.saturating_mul(n), Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut snap = HistogramSnapshot::default();
        for cells in self.stripes.all() {
            for (total, count) in snap.counts.iter_mut().zip(&cells.counts) {
                *total += count.load(Relaxed);
            }
            snap.sum_ns += cells.sum_ns.load(Relaxed);
        }
        snap
    }
}

/// Counts per bucket (not cumulative) and the sum, at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HistogramSnapshot {
    pub counts: Vec<u64>,
    pub sum_ns: u64,
}

impl Default for HistogramSnapshot {
    fn default() -> Self {
        HistogramSnapshot {
            counts: vec![0; BUCKETS],
            sum_ns: 0,
        }
    }
}

impl HistogramSnapshot {
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Adds another histogram's counts (e.g. every endpoint's into a balancer's).
    pub fn add(&mut self, other: &HistogramSnapshot) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum_ns += other.sum_ns;
    }

    /// What was recorded since `earlier` (a snapshot of the same histogram). Saturates
    /// where the histogram was replaced in between.
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        HistogramSnapshot {
            counts: self
                .counts
                .iter()
                .zip(&earlier.counts)
                .map(|(now, then)| now.saturating_sub(*then))
                .collect(),
            sum_ns: self.sum_ns.saturating_sub(earlier.sum_ns),
        }
    }

    /// The `q` quantile (0..=1) in seconds, interpolated linearly inside its bucket as
    /// Prometheus's `histogram_quantile` does; `None` when empty. A quantile in the
    /// +Inf bucket is reported as the largest finite bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut below = 0u64;
        for (i, &count) in self.counts.iter().enumerate() {
            if count > 0 && (below + count) as f64 >= rank {
                let Some(&upper) = BOUNDS_NS.get(i) else {
                    return Some(BOUNDS_NS[BOUNDS_NS.len() - 1] as f64 / 1e9);
                };
                let lower = if i == 0 { 0 } else { BOUNDS_NS[i - 1] };
                let within = ((rank - below as f64) / count as f64).clamp(0.0, 1.0);
                return Some((lower as f64 + within * (upper - lower) as f64) / 1e9);
            }
            below += count;
        }
        Some(BOUNDS_NS[BOUNDS_NS.len() - 1] as f64 / 1e9)
    }

    /// Cumulative counts at the exported bounds, as (`le` label, count), then
    /// ("+Inf", total).
    pub fn exported(&self) -> Vec<(&'static str, u64)> {
        let mut cumulative = Vec::with_capacity(EXPORTED.len() + 1);
        let mut running = 0u64;
        let mut next = 0;
        for (i, &count) in self.counts.iter().enumerate() {
            running += count;
            if next < EXPORTED.len() && EXPORTED[next] == i {
                cumulative.push((EXPORTED_LE[next], running));
                next += 1;
            }
        }
        cumulative.push(("+Inf", running));
        cumulative
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_rise_and_the_exported_ones_are_round() {
        assert!(BOUNDS_NS.windows(2).all(|w| w[0] < w[1]));
        for (&i, le) in EXPORTED.iter().zip(EXPORTED_LE) {
            assert_eq!(
                le.parse::<f64>().unwrap(),
                BOUNDS_NS[i] as f64 / 1e9,
                "{le}"
            );
        }
        let exported: Vec<u64> = EXPORTED.iter().map(|&i| BOUNDS_NS[i]).collect();
        assert_eq!(
            exported,
            [
                100_000,
                250_000,
                500_000,
                1_000_000,
                2_500_000,
                5_000_000,
                10_000_000,
                25_000_000,
                50_000_000,
                100_000_000,
                250_000_000,
                500_000_000,
                1_000_000_000,
                2_500_000_000,
                5_000_000_000,
                10_000_000_000,
                25_000_000_000,
                50_000_000_000
            ]
        );
    }

    #[test]
    fn a_value_falls_in_the_first_bucket_whose_bound_holds_it() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(50_000), 0);
        assert_eq!(bucket_of(50_001), 1);
        assert_eq!(bucket_of(1_000_000), 13);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_land_within_a_bucket_of_the_truth() {
        let h = Histogram::default();
        // 990 requests of 1 ms, 10 of 300 ms: p50 near 1 ms, p99 near 1 ms, p99.9 near 300.
        for _ in 0..990 {
            h.record(1_000_000);
        }
        for _ in 0..10 {
            h.record(300_000_000);
        }
        let s = h.snapshot();
        assert_eq!(s.count(), 1000);
        assert_eq!(s.sum_ns, 990 * 1_000_000 + 10 * 300_000_000);
        let p50 = s.quantile(0.5).unwrap();
        assert!((0.0008..=0.001).contains(&p50), "{p50}");
        let p999 = s.quantile(0.999).unwrap();
        assert!((0.25..=0.315).contains(&p999), "{p999}");
        assert_eq!(HistogramSnapshot::default().quantile(0.5), None);
    }

    #[test]
    fn exported_counts_are_cumulative_and_end_with_the_total() {
        let h = Histogram::default();
        h.record(90_000); // ≤ 0.1 ms
        h.record(2_000_000); // ≤ 2.5 ms
        h.record(100_000_000_000); // +Inf
        let e = h.snapshot().exported();
        assert_eq!(e.len(), EXPORTED.len() + 1);
        assert_eq!(e[0], ("0.0001", 1));
        assert_eq!(e[4], ("0.0025", 2));
        assert_eq!(e[EXPORTED.len() - 1].1, 2);
        assert_eq!(e[EXPORTED.len()], ("+Inf", 3));
    }

    #[test]
    fn since_is_what_was_added_in_between() {
        let h = Histogram::default();
        h.record(1_000_000);
        let before = h.snapshot();
        h.record(2_000_000);
        h.record(2_000_000);
        let delta = h.snapshot().since(&before);
        assert_eq!(delta.count(), 2);
        assert_eq!(delta.sum_ns, 4_000_000);
    }
}
