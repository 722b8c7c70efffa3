//! `round-robin`: each eligible endpoint in turn.
//!
//! The baseline, and what Node's cluster module, PM2 and node-http-proxy do. It assumes
//! every request costs the same, which is why it is not drover's default; it stays for
//! backends whose requests really are uniform and for comparisons.
//!
//! One shared counter picks the slot; a pick that lands on an ineligible endpoint moves
//! on to the next eligible one and advances the counter past the slots it skipped, so
//! the endpoint after a dead one does not inherit its turns (see `common::rotate`).
//!
//! An endpoint in slow start takes its turn with the chance its ramp gives, and passes
//! it on otherwise, so its share grows over `slow_start` as under HAProxy's roundrobin
//! with `slowstart`. Before, it took its full turn at once while `drover ctl status`
//! said it ramped.

use super::common::{claim, rotate};
use crate::pick::{NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use crate::Balancer;
use std::sync::atomic::AtomicUsize;

#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl RoundRobin {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Balancer for RoundRobin {
    fn pick(&self, set: &EndpointSet, ctx: &PickContext<'_>) -> Result<Pick, NoPick> {
        let eps = set.endpoints();
        claim(set, ctx, || {
            let mut passed = None;
            for _ in 0..eps.len() {
                let i = rotate(&self.next, eps, ctx)?;
                let ramp = eps[i].ramp(ctx.now);
                if ramp >= 1.0 || fastrand::f64() < ramp {
                    return Some(&eps[i]);
                }
                passed.get_or_insert(i);
            }
            // Every eligible endpoint ramps and passed: the first takes it.
            passed.map(|i| &eps[i])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::testing::*;

    #[test]
    fn rotates_over_all() {
        let s = set_of(&[1, 1, 1]);
        let rr = RoundRobin::new();
        assert_eq!(picks(&rr, &s, 6), vec![0, 1, 2, 0, 1, 2]);
    }

    #[test]
    fn skipped_endpoint_does_not_double_its_successor() {
        let s = set_of(&[1, 1, 1, 1]);
        s.endpoints()[1].set_healthy(false);
        let rr = RoundRobin::new();
        assert_eq!(counts(&rr, &s, 300), vec![100, 0, 100, 100]);
    }

    #[test]
    fn slow_start_scales_the_share() {
        let s = set_of(&[1, 1, 1]);
        s.endpoints()[1].start_ramp(1, 1_000_000);
        let rr = RoundRobin::new();
        let share_at = |now| {
            let mut n = [0; 3];
            for _ in 0..3_000 {
                let p = rr.pick(&s, &ctx_at(now)).unwrap();
                n[index_of(&s, &p)] += 1;
            }
            n
        };
        // Half way through its ramp, it takes half its turns: 1 in 5, not 1 in 3.
        let half = share_at(500_001);
        assert!((480..=720).contains(&half[1]), "{half:?}");
        assert!(half[0] > 1_000 && half[2] > 1_000, "{half:?}");
        // Ramped, its full turn.
        assert_eq!(share_at(2_000_000), [1_000; 3]);
    }

    #[test]
    fn honours_eligibility() {
        check_eligibility(&RoundRobin::new());
    }
}
