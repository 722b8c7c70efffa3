//! `random`: an endpoint drawn at random, in proportion to its effective weight.
//!
//! Stateless, so it needs no coordination between threads or between several drover
//! instances in front of the same pool, and it cannot synchronise into the lock-step
//! patterns that shared counters can. It ignores load; that is what `p2c` adds.
//!
//! The draw is by rejection: a uniform index, kept with probability (its effective
//! weight ÷ the snapshot's largest weight) if it is eligible. That is O(1) expected while
//! weights are within a small factor of each other and most endpoints are eligible, and
//! exact in distribution (eligibility and slow start change between picks, so a cached
//! prefix-sum array would not be). After `TRIES` misses (most of the pool down, or very
//! unequal weights) it falls back to summing the eligible weights and walking to the
//! chosen one, O(n); both parts draw in proportion to weight, so together they do too.

use super::common::claim;
use crate::endpoint::Endpoint;
use crate::pick::{NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use crate::Balancer;
use std::sync::Arc;

#[derive(Debug, Default)]
pub struct WeightedRandom;

impl WeightedRandom {
    pub fn new() -> Self {
        WeightedRandom
    }
}

/// Rejection draws before the O(n) walk.
const TRIES: usize = 16;

fn choose<'s>(set: &'s EndpointSet, ctx: &PickContext<'_>) -> Option<&'s Arc<Endpoint>> {
    let eps = set.endpoints();
    if eps.is_empty() {
        return None;
    }
    let max = f64::from(set.max_weight().max(1));
    for _ in 0..TRIES {
        let e = &eps[fastrand::usize(..eps.len())];
        if ctx.eligible(e) && fastrand::f64() * max < e.effective_weight(ctx.now) {
            return Some(e);
        }
    }
    walk(eps, ctx)
}

/// The exact O(n) draw: sum the eligible weights, then walk to the chosen one.
fn walk<'s>(eps: &'s [Arc<Endpoint>], ctx: &PickContext<'_>) -> Option<&'s Arc<Endpoint>> {
    let eligible = || eps.iter().filter(|e| ctx.eligible(e));
    let total: f64 = eligible().map(|e| e.effective_weight(ctx.now)).sum();
    let mut r = fastrand::f64() * total;
    let mut last = None;
    for e in eligible() {
        r -= e.effective_weight(ctx.now);
        if r < 0.0 {
            return Some(e);
        }
        last = Some(e);
    }
    // Rounding, or an endpoint that became ineligible between the passes.
    last
}

impl Balancer for WeightedRandom {
    fn pick(&self, set: &EndpointSet, ctx: &PickContext<'_>) -> Result<Pick, NoPick> {
        claim(set, ctx, || choose(set, ctx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::testing::*;

    #[test]
    fn shares_follow_weights() {
        fastrand::seed(7);
        let s = set_of(&[1, 3]);
        let n = counts(&WeightedRandom::new(), &s, 40_000);
        let share = n[1] as f64 / 40_000.0;
        assert!((share - 0.75).abs() < 0.01, "{share}");
    }

    #[test]
    fn skips_ineligible() {
        fastrand::seed(8);
        let s = set_of(&[1, 1, 1]);
        s.endpoints()[0].set_healthy(false);
        let n = counts(&WeightedRandom::new(), &s, 3_000);
        assert_eq!(n[0], 0);
        assert!(n[1] > 1_300 && n[2] > 1_300, "{n:?}");
    }

    #[test]
    fn honours_eligibility() {
        check_eligibility(&WeightedRandom::new());
    }
}
