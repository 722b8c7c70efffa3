//! `p2c`: drover's default. In pools of up to 16 endpoints it scans every one and takes
//! the least loaded; in larger pools it draws two at random (the power of two choices)
//! and takes the less loaded of those. Less loaded means: an idle one (nothing pending;
//! idle ones take turns by weight, see `idle_turns`), else the one with less pending work (the learned
//! cost of the requests awaiting an answer, scaled by its weight; see
//! `Endpoint::pending_score`), where a busy endpoint the picking thread would have to
//! open a new connection to counts its work twice (`common::NEW_CONNECTION_FACTOR`).
//!
//! Why scan: with unequal costs, a few expensive requests occupy most of a small pool.
//! Two random draws then often land on two busy endpoints and put a cheap request behind
//! an expensive one while another endpoint sits idle; a scan never does. In
//! `bench/queue-model.js` (open loop, no noise), two choices by pending work ran p99 up
//! to 1.75 x least-conn's with 4-8 workers (7 workers, 9.8 % of requests at 700 x the
//! rest, 50 % load), where the scan ran 0.59-1.0 x. The power of two choices exists to
//! spare the cost of reading every endpoint and to keep concurrent pickers that read the
//! same stale scores from herding onto one (Mitzenmacher). Neither holds here: reading
//! 16 endpoints costs a few atomic loads each, and pending work is claimed at the pick,
//! so the next pick, on any thread, already sees it. Past 16 the draws keep a pick O(1)
//! in pools that DNS or etcd can grow to hundreds.
//!
//! Large pools never allocate or walk the list: indices are drawn and redrawn (a bounded
//! number of times) while they land on ineligible endpoints. Only when most of the pool
//! is down do the draws run out, and then one linear scan finds whatever is left.

use super::common::{claim, least_loaded, least_loaded_of, random_start};
use crate::endpoint::Endpoint;
use crate::pick::{NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use crate::Balancer;
use std::sync::Arc;

/// Pools this small are scanned in full (see the module comment).
const FULL_SCAN_MAX: usize = 16;

/// Draws per choice before falling back to a scan: with half the pool ineligible, 8
/// draws all miss once in 256 picks.
const DRAWS: usize = 8;

#[derive(Debug, Default)]
pub struct P2c;

impl P2c {
    pub fn new() -> Self {
        P2c
    }
}

/// The p2c choice, shared by `hash` as its fallback.
pub(crate) fn choose<'s>(set: &'s EndpointSet, ctx: &PickContext<'_>) -> Option<&'s Arc<Endpoint>> {
    let eps = set.endpoints();
    let n = eps.len();
    if n <= FULL_SCAN_MAX {
        return least_loaded(set, ctx, random_start(n));
    }
    let pair = draw(eps, ctx, None).and_then(|a| Some((a, draw(eps, ctx, Some(a))?)));
    let Some((a, b)) = pair else {
        return least_loaded(set, ctx, random_start(n));
    };
    least_loaded_of([&eps[a], &eps[b]], set.idle_turns(), ctx)
}

/// A random eligible index other than `other`, or `None` when the draws run out.
fn draw(eps: &[Arc<Endpoint>], ctx: &PickContext<'_>, other: Option<usize>) -> Option<usize> {
    let n = eps.len();
    (0..DRAWS)
        .map(|_| match other {
            None => fastrand::usize(..n),
            // Uniform over the other n - 1 indices, without a retry on a repeat.
            Some(a) => (a + 1 + fastrand::usize(..n - 1)) % n,
        })
        .find(|&i| ctx.eligible(&eps[i]))
}

impl Balancer for P2c {
    fn pick(&self, set: &EndpointSet, ctx: &PickContext<'_>) -> Result<Pick, NoPick> {
        claim(set, ctx, || choose(set, ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::testing::*;

    #[test]
    fn small_pools_take_the_least_loaded() {
        let s = set_of(&[1, 1, 1]);
        let busy = PickContext {
            cost: 9_000_000,
            ..ctx()
        };
        let _a = Pick::try_new(&s.endpoints()[0], &busy).unwrap();
        let _c = Pick::try_new(&s.endpoints()[2], &ctx()).unwrap();
        for _ in 0..10 {
            let p = P2c::new().pick(&s, &ctx()).unwrap();
            assert_eq!(index_of(&s, &p), 1);
        }
        // With every endpoint busy, the least work wins.
        let _b = Pick::try_new(&s.endpoints()[1], &busy).unwrap();
        for _ in 0..10 {
            let p = P2c::new().pick(&s, &ctx()).unwrap();
            assert_eq!(index_of(&s, &p), 2);
        }
    }

    /// Idle connections of one picking thread, by endpoint index.
    struct PooledAt(Vec<std::net::SocketAddr>);

    impl crate::Pooled for PooledAt {
        fn has_idle(&self, endpoint: &Endpoint) -> bool {
            self.0.contains(&endpoint.addr())
        }
    }

    /// What p2c picks, 10 times over, for a thread holding idle connections to the
    /// endpoints at `pooled` (indices); panics unless every pick agrees.
    fn picked_with_idle_at(s: &EndpointSet, pooled: &[usize]) -> usize {
        let pooled = PooledAt(pooled.iter().map(|&i| s.endpoints()[i].addr()).collect());
        let ctx = PickContext {
            pooled: Some(&pooled),
            ..ctx()
        };
        let first = index_of(s, &P2c::new().pick(s, &ctx).unwrap());
        for _ in 0..9 {
            assert_eq!(index_of(s, &P2c::new().pick(s, &ctx).unwrap()), first);
        }
        first
    }

    #[test]
    fn a_busy_endpoint_on_an_idle_connection_wins_unless_another_holds_under_half_its_work() {
        use crate::strategy::common::NEW_CONNECTION_FACTOR;
        let s = set_of(&[1, 1, 1]);
        let work = |ms: u64| PickContext {
            cost: ms * 1_000_000,
            ..ctx()
        };
        // Every endpoint busy: 0 with 10 ms of work, 1 with 6 ms, 2 with 30 ms.
        let _held = [(0, 10), (1, 6), (2, 30)]
            .map(|(i, ms)| Pick::try_new(&s.endpoints()[i], &work(ms)).unwrap());
        // 1 has the least work but no idle connection; 0 has one and under twice 1's work.
        const { assert!(10.0 <= 6.0 * NEW_CONNECTION_FACTOR) };
        assert_eq!(picked_with_idle_at(&s, &[0, 2]), 0);
        for _ in 0..10 {
            assert_eq!(index_of(&s, &P2c::new().pick(&s, &ctx()).unwrap()), 1);
        }
        // Only 2 is pooled, at five times 1's work: a new connection to 1 it is.
        assert_eq!(picked_with_idle_at(&s, &[2]), 1);
        // The least loaded is pooled itself: it wins as before.
        assert_eq!(picked_with_idle_at(&s, &[1, 0]), 1);
    }

    #[test]
    fn an_idle_endpoint_wins_over_a_busy_one_on_an_idle_connection() {
        let s = set_of(&[1, 1]);
        let _held = Pick::try_new(&s.endpoints()[0], &ctx()).unwrap();
        assert_eq!(picked_with_idle_at(&s, &[0]), 1);
    }

    #[test]
    fn a_connections_next_request_goes_where_its_last_went_while_that_one_is_idle() {
        let s = set_of(&[1, 1, 1]);
        let previous = &s.endpoints()[2];
        let again = PickContext {
            previous: Some(previous),
            ..ctx()
        };
        for _ in 0..20 {
            let p = P2c::new().pick(&s, &again).unwrap();
            assert_eq!(index_of(&s, &p), 2);
        }
        // Its CPU reads saturated (from that last request, say), nothing pending: still.
        previous.report_load(1, 1.0);
        assert!(previous.is_saturated(1) && previous.is_idle());
        for _ in 0..20 {
            let p = P2c::new().pick(&s, &again).unwrap();
            assert_eq!(index_of(&s, &p), 2);
        }
        // Busy with another request: the connection's next one goes to a free endpoint.
        let _held = Pick::try_new(previous, &ctx()).unwrap();
        for _ in 0..20 {
            let p = P2c::new().pick(&s, &again).unwrap();
            assert_ne!(index_of(&s, &p), 2);
        }
    }

    #[test]
    fn a_cheap_request_finds_the_one_endpoint_without_expensive_work_in_a_pool_of_eight() {
        // Seven endpoints each hold an expensive request, one holds a cheap one. Two
        // random draws would miss that one three times in four.
        fastrand::seed(8);
        let s = set_of(&[1; 8]);
        let expensive = PickContext {
            cost: 70_000_000,
            ..ctx()
        };
        let cheap = PickContext {
            cost: 100_000,
            ..ctx()
        };
        let _held: Vec<Pick> = s
            .endpoints()
            .iter()
            .enumerate()
            .map(|(i, e)| Pick::try_new(e, if i == 5 { &cheap } else { &expensive }).unwrap())
            .collect();
        for _ in 0..50 {
            let p = P2c::new().pick(&s, &cheap).unwrap();
            assert_eq!(index_of(&s, &p), 5);
        }
    }

    #[test]
    fn a_cheap_request_avoids_the_expensive_work_whatever_the_latency_estimates() {
        // Endpoint 0 just answered an expensive request (its latency estimate peaks at
        // 10 ms) and holds a cheap one; endpoint 1 holds an expensive one. The new request
        // would wait behind 10 ms of work on 1 and behind 50 µs on 0.
        let s = set_of(&[1, 1]);
        s.endpoints()[0].observe_rtt(1, 10_000_000);
        s.endpoints()[1].observe_rtt(1, 50_000);
        let cheap = PickContext {
            cost: 50_000,
            ..ctx()
        };
        let expensive = PickContext {
            cost: 10_000_000,
            ..ctx()
        };
        let _a = Pick::try_new(&s.endpoints()[0], &cheap).unwrap();
        let _b = Pick::try_new(&s.endpoints()[1], &expensive).unwrap();
        for _ in 0..10 {
            let p = P2c::new().pick(&s, &cheap).unwrap();
            assert_eq!(index_of(&s, &p), 0);
        }
    }

    #[test]
    fn idle_endpoints_share_light_traffic_whatever_their_latency() {
        // One request at a time: nothing is pending at any pick. A latency estimate is
        // noise here (one endpoint answered a little faster once); ranking by it would
        // send everything to one endpoint and never refresh the others' estimates.
        fastrand::seed(5);
        for n in [2, 3, 6] {
            let s = set_of(&vec![1; n]);
            s.endpoints()[0].observe_rtt(1, 100_000);
            for e in &s.endpoints()[1..] {
                e.observe_rtt(1, 900_000);
            }
            let c = counts(&P2c::new(), &s, 3_000);
            let fair = 3_000 / n;
            assert!(
                c.iter().all(|&k| k > fair * 3 / 4 && k < fair * 5 / 4),
                "{c:?}"
            );
        }
        // Weighted: shares follow weights.
        let s = set_of(&[1, 3]);
        let c = counts(&P2c::new(), &s, 4_000);
        assert!((800..1200).contains(&c[0]), "{c:?}");
    }

    #[test]
    fn never_picks_the_worst_of_a_large_pool() {
        fastrand::seed(3);
        // Larger than FULL_SCAN_MAX: the two-choice path.
        let s = set_of(&[1; 20]);
        s.endpoints()[4].report_load(1, 5.0);
        let n = counts(&P2c::new(), &s, 5_000);
        assert_eq!(n[4], 0, "{n:?}");
        assert!(
            n.iter().enumerate().all(|(i, &c)| i == 4 || c > 180),
            "{n:?}"
        );
    }

    #[test]
    fn finds_the_last_eligible_endpoint_in_a_large_pool() {
        fastrand::seed(4);
        let s = set_of(&[1; 1000]);
        for e in &s.endpoints()[1..] {
            e.set_healthy(false);
        }
        for _ in 0..20 {
            let p = P2c::new().pick(&s, &ctx()).unwrap();
            assert_eq!(index_of(&s, &p), 0);
        }
    }

    #[test]
    fn honours_eligibility() {
        check_eligibility(&P2c::new());
    }
}
