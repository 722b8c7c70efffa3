//! Whether an app's requests cost alike: what decides, under `drover run`'s default mode,
//! between placing each request (late binding) and handing whole connections to the
//! workers (no hop).
//!
//! Placing each request wins the tail when costs differ: a cheap request never waits
//! behind a heavy one that drover could see coming. When every request costs about the
//! same, the workers' connection counts already say their load, and the per-request hop
//! only costs throughput (half of Node cluster's on a hello server with 2 cores). So a
//! connection may leave drover's path once the app's costs have been alike for long
//! enough, and not while a heavy route has been seen recently.
//!
//! It reads the route estimates of `CostTable` (each a low envelope of its latency, so
//! queueing under load does not make a cheap route look heavy) as they are updated.

use crate::clock::Nanos;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// A route is heavy when its cost is at least this many times the app's typical one...
const HEAVY_RATIO: u64 = 4;

/// ...and at least this much: below it, a request that waits behind one loses less than
/// the hop costs every request.
const HEAVY_FLOOR: Nanos = 1_000_000;

/// Costs count as alike after this many requests with no heavy one among them: with a
/// heavy share as low as 1 %, 1,000 requests without one happen by chance once in
/// 20,000 starts.
const CALM_REQUESTS: u64 = 1_000;

/// ...spanning at least this long (a burst at a cold start is not a history).
const CALM_SPAN: Nanos = 500_000_000;

/// The app's typical cost follows the lower requests: a cheaper route pulls it halfway
/// down at once, a dearer one only 1/16 up, so a heavy share of up to about 30 % leaves
/// it near the light routes' cost.
const DOWN_SHIFT: u32 = 1;
const UP_SHIFT: u32 = 4;

/// Lock-free: one per balancer, updated by every proxied request of every thread.
#[derive(Debug, Default)]
pub struct CostSpread {
    /// The app's typical request cost in ns (0 before the first request).
    typical: AtomicU64,
    /// Requests since the last heavy one (or since the first).
    calm_requests: AtomicU64,
    /// When the last heavy request was seen, or the first request (ns, `clock`).
    calm_since: AtomicU64,
}

impl CostSpread {
    pub fn new() -> Self {
        Self::default()
    }

    /// One request served, whose route costs `cost` (its `CostTable` estimate).
    pub fn observe(&self, now: Nanos, cost: Nanos) {
        let cost = cost.max(1);
        let typical = self.typical.load(Relaxed);
        if typical == 0 {
            self.typical.store(cost, Relaxed);
            self.calm_since.store(now, Relaxed);
            self.calm_requests.store(1, Relaxed);
            return;
        }
        let next = if cost >= typical {
            typical + ((cost - typical) >> UP_SHIFT)
        } else {
            typical - ((typical - cost) >> DOWN_SHIFT)
        };
        // One attempt: a lost update is another request's sample, as good as this one.
        let _ = self
            .typical
            .compare_exchange(typical, next.max(1), Relaxed, Relaxed);
        if cost >= HEAVY_FLOOR && cost >= typical.saturating_mul(HEAVY_RATIO) {
            self.calm_requests.store(0, Relaxed);
            self.calm_since.store(now, Relaxed);
        } else {
            self.calm_requests.fetch_add(1, Relaxed);
        }
    }

    /// Whether requests have cost alike for long enough to stop placing them one by one.
    pub fn is_even(&self, now: Nanos) -> bool {
        self.calm_requests.load(Relaxed) >= CALM_REQUESTS
            && now.saturating_sub(self.calm_since.load(Relaxed)) >= CALM_SPAN
    }

    /// The app's typical request cost in ns, 0 before any.
    #[cfg(test)]
    fn typical(&self) -> Nanos {
        self.typical.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    const US: Nanos = 1_000;

    fn feed(s: &CostSpread, start: Nanos, n: u64, cost: impl Fn(u64) -> Nanos) -> Nanos {
        // One request every 100 µs.
        for i in 0..n {
            s.observe(start + i * 100 * US, cost(i));
        }
        start + n * 100 * US
    }

    #[test]
    fn alike_costs_are_even_after_enough_requests_and_time() {
        let s = CostSpread::new();
        assert!(!s.is_even(0));
        // 1,000 requests in 100 ms: not long enough yet.
        let t = feed(&s, 1, 1_000, |i| 50 * US + (i % 7) * US);
        assert!(!s.is_even(t));
        let t = feed(&s, t, 5_000, |i| 50 * US + (i % 7) * US);
        assert!(s.is_even(t));
    }

    #[test]
    fn a_heavy_route_among_light_ones_is_uneven_at_any_share() {
        for every in [3, 10, 100] {
            let s = CostSpread::new();
            // Light 200 µs, heavy 10 ms (the mixed load of bench/cluster.sh, 10 %).
            let t = feed(&s, 1, 20_000, |i| {
                if i % every == 0 {
                    10 * MS
                } else {
                    200 * US
                }
            });
            assert!(!s.is_even(t), "heavy every {every}");
            assert!(s.typical() < MS, "typical {} at every {every}", s.typical());
        }
    }

    #[test]
    fn costs_below_the_floor_count_as_alike() {
        let s = CostSpread::new();
        let t = feed(
            &s,
            1,
            10_000,
            |i| if i % 10 == 0 { 500 * US } else { 20 * US },
        );
        assert!(s.is_even(t));
    }

    #[test]
    fn uniformly_slow_requests_are_even() {
        // Every request costs 300 ms (a CPU-heavy app): none is heavier than the rest.
        let s = CostSpread::new();
        let t = feed(&s, 1, 6_000, |_| 300 * MS);
        assert!(s.is_even(t));
    }

    #[test]
    fn a_heavy_request_resets_the_calm() {
        let s = CostSpread::new();
        let t = feed(&s, 1, 10_000, |_| 100 * US);
        assert!(s.is_even(t));
        s.observe(t, 20 * MS);
        assert!(!s.is_even(t + 1));
        let t = feed(&s, t + 1, 10_000, |_| 100 * US);
        assert!(s.is_even(t));
    }
}
