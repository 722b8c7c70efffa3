//! `round-robin`: each eligible endpoint in turn.
//!
//! The baseline, and what Node's cluster module, PM2 and node-http-proxy do. It assumes
//! every request costs the same, which is why it is not drover's default; it stays for
//! backends whose requests really are uniform and for comparisons.
//!
//! One shared counter picks the slot; a pick that lands on an ineligible endpoint moves
//! on to the next eligible one and advances the counter past the slots it skipped, so
//! the endpoint after a dead one does not inherit its turns (see `common::rotate`).

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
        claim(set, ctx, || rotate(&self.next, eps, ctx).map(|i| &eps[i]))
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
    fn honours_eligibility() {
        check_eligibility(&RoundRobin::new());
    }
}
