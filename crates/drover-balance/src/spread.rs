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

/// ...and it rises at most once in this long, whatever the number of requests: it
/// takes seconds, not a burst, to make the app's cheap requests look dearer. Route
/// estimates are latencies, and a worker that waits for a core stretches a cheap
/// request as much as a dear one. With one rise per request, a burst of a mixed app
/// over 7 workers on 2 cores lifted the typical cost to the heavy route's (3 ms against
/// 3.7 ms of CPU for the heavy one, 0.1 ms for the light), the heavy route stopped
/// looking heavy, and `auto` handed ~900 of the burst's connections to the workers;
/// the rounds that did had about twice the p99 of the others (`bench/sweep.sh --only 6`).
const RISE_EVERY: Nanos = 500_000_000;

/// A route that carries at least 9 of every 10 requests is the app's traffic, not a
/// heavy route among light ones, however its cost compares with the typical one:
/// `DOMINANT_UP` per request of it, `DOMINANT_DOWN` per request of another, so its
/// count grows only above that share, and it dominates from `DOMINANT_AT` on. The
/// typical cost follows the cheapest requests and rises slowly (`RISE_EVERY`), so a
/// few cheap ones at a start (a load test's readiness checks on `/health`) held an
/// app of 50 ms calls as "uneven" for 2.5 s, and its 1,000 client connections stayed
/// on drover's hop that long: 11,000-12,800 req/s over 5 s where, without the
/// checks, it served 15,300-15,700 and Node cluster 16,700 (`bench/io-crowd.sh`).
const DOMINANT_UP: u64 = 1;
const DOMINANT_DOWN: u64 = 9;
const DOMINANT_AT: u64 = 256;
const DOMINANT_CAP: u64 = 1024;

/// `CostSpread::dominant`'s low bits: the count; the rest is the route's key.
const COUNT_BITS: u32 = 16;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// Lock-free: one per balancer, updated by every proxied request of every thread.
#[derive(Debug, Default)]
pub struct CostSpread {
    /// The app's typical request cost in ns (0 before the first request).
    typical: AtomicU64,
    /// Requests since the last heavy one (or since the first).
    calm_requests: AtomicU64,
    /// When the last heavy request was seen, or the first request (ns, `clock`).
    calm_since: AtomicU64,
    /// When `typical` last rose (ns, `clock`).
    risen_at: AtomicU64,
    /// The route that carries most requests and its count, packed (see `DOMINANT_UP`).
    dominant: AtomicU64,
}

impl CostSpread {
    pub fn new() -> Self {
        Self::default()
    }

    /// One request of `route` (`CostTable::key`) served, whose route costs `cost` (its
    /// `CostTable` estimate).
    pub fn observe(&self, now: Nanos, route: u64, cost: Nanos) {
        let cost = cost.max(1);
        let dominant = self.count_route(route);
        let typical = self.typical.load(Relaxed);
        if typical == 0 {
            self.typical.store(cost, Relaxed);
            self.calm_since.store(now, Relaxed);
            self.risen_at.store(now, Relaxed);
            self.calm_requests.store(1, Relaxed);
            return;
        }
        if cost < typical {
            // One attempt: a lost update is another request's sample, as good as this one.
            let next = typical - ((typical - cost) >> DOWN_SHIFT);
            let _ = self
                .typical
                .compare_exchange(typical, next.max(1), Relaxed, Relaxed);
        } else {
            let risen_at = self.risen_at.load(Relaxed);
            if now.saturating_sub(risen_at) >= RISE_EVERY
                && self
                    .risen_at
                    .compare_exchange(risen_at, now, Relaxed, Relaxed)
                    .is_ok()
            {
                let next = typical + ((cost - typical) >> UP_SHIFT);
                let _ = self
                    .typical
                    .compare_exchange(typical, next, Relaxed, Relaxed);
            }
        }
        if !dominant && cost >= HEAVY_FLOOR && cost >= typical.saturating_mul(HEAVY_RATIO) {
            self.calm_requests.store(0, Relaxed);
            self.calm_since.store(now, Relaxed);
        } else {
            self.calm_requests.fetch_add(1, Relaxed);
        }
    }

    /// Counts a request of `route`; whether that route dominates (see `DOMINANT_UP`).
    fn count_route(&self, route: u64) -> bool {
        let tag = route & !COUNT_MASK;
        let before = self
            .dominant
            .fetch_update(Relaxed, Relaxed, |word| {
                let count = word & COUNT_MASK;
                Some(if word & !COUNT_MASK == tag {
                    tag | (count + DOMINANT_UP).min(DOMINANT_CAP)
                } else if count <= DOMINANT_DOWN {
                    tag | DOMINANT_UP
                } else {
                    word - DOMINANT_DOWN
                })
            })
            .unwrap_or_else(|word| word);
        before & !COUNT_MASK == tag && before & COUNT_MASK >= DOMINANT_AT
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

    /// Each cost its own route.
    fn route(cost: Nanos) -> u64 {
        crate::hashing::mix64(cost)
    }

    fn feed(s: &CostSpread, start: Nanos, n: u64, cost: impl Fn(u64) -> Nanos) -> Nanos {
        // One request every 100 µs.
        for i in 0..n {
            let c = cost(i);
            s.observe(start + i * 100 * US, route(c), c);
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
    fn a_burst_that_stretches_every_request_leaves_the_heavy_route_heavy() {
        // Light 100 µs, heavy 3.7 ms (4.6 %), then a burst of 2 s in which waiting for a
        // core stretches the light route's estimate to 3 ms and the heavy one's to 5 ms.
        let s = CostSpread::new();
        let t = feed(&s, 1, 10_000, |i| {
            if i % 22 == 0 {
                3_700 * US
            } else {
                100 * US
            }
        });
        assert!(!s.is_even(t));
        let t = feed(&s, t, 20_000, |i| if i % 22 == 0 { 5 * MS } else { 3 * MS });
        assert!(!s.is_even(t), "typical {}", s.typical());
        assert!(s.typical() < MS, "typical {}", s.typical());
    }

    #[test]
    fn a_cheap_route_that_became_dearer_is_the_typical_cost_within_seconds() {
        let s = CostSpread::new();
        let t = feed(&s, 1, 10_000, |_| 100 * US);
        // A deploy makes every request cost 2 ms: after 30 s the typical cost is there,
        // and no route counts as heavy.
        let t = feed(&s, t, 300_000, |_| 2 * MS);
        assert!(s.typical() > 1_900 * US, "typical {}", s.typical());
        assert!(s.is_even(t));
    }

    #[test]
    fn a_heavy_request_resets_the_calm() {
        let s = CostSpread::new();
        let t = feed(&s, 1, 10_000, |_| 100 * US);
        assert!(s.is_even(t));
        s.observe(t, route(20 * MS), 20 * MS);
        assert!(!s.is_even(t + 1));
        let t = feed(&s, t + 1, 10_000, |_| 100 * US);
        assert!(s.is_even(t));
    }

    #[test]
    fn a_few_cheap_requests_before_one_route_of_waits_leave_it_even_within_a_second() {
        // A load test's 8 readiness checks on /health (100 µs), then 1,000 connections
        // of 50 ms calls: the calls are the app's traffic, not a heavy route.
        let s = CostSpread::new();
        let t = feed(&s, 1, 8, |_| 100 * US);
        let t = feed(&s, t, 7_000, |_| 50 * MS);
        assert!(s.is_even(t), "typical {}", s.typical());
    }

    #[test]
    fn a_heavy_route_short_of_nine_in_ten_requests_stays_heavy() {
        // 80 % heavy: the light fifth still waits behind it, so placement still counts.
        let s = CostSpread::new();
        let t = feed(
            &s,
            1,
            20_000,
            |i| if i % 5 == 0 { 200 * US } else { 10 * MS },
        );
        assert!(!s.is_even(t));
    }

    #[test]
    fn the_dominant_route_must_keep_its_share() {
        let s = CostSpread::new();
        let t = feed(&s, 1, 10_000, |_| 20 * MS);
        // Then light routes take over: 20 ms is heavy again once it is 1 in 3.
        let t = feed(
            &s,
            t,
            300,
            |i| if i % 3 == 0 { 20 * MS } else { 100 * US + i },
        );
        s.observe(t, route(20 * MS), 20 * MS);
        assert!(!s.is_even(t + 1));
    }
}
