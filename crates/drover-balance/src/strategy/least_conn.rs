//! `least-conn`: the endpoint with the fewest requests in flight per unit of weight.
//!
//! What HAProxy's `leastconn` and nginx's `least_conn` do, kept for comparison with them
//! and for backends whose requests cost alike. It counts requests, not their expected
//! cost or latency: that is `peak-ewma` and `p2c`.
//!
//! The score is `(in_flight + 1) / weight` rather than `in_flight / weight`, so among
//! idle endpoints the heavier one still goes first, as in HAProxy. Ties are common (every
//! idle endpoint scores the same), so the scan starts where round-robin would pick
//! (`common::rotate`): always starting at the first endpoint would pile every tie onto
//! it, and a plain rotating start would give a dead endpoint's ties to its successor.

use super::common::{claim, least_by, rotate};
use crate::pick::{NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use crate::Balancer;
use std::sync::atomic::AtomicUsize;

#[derive(Debug, Default)]
pub struct LeastConn {
    next: AtomicUsize,
}

impl LeastConn {
    pub fn new() -> Self {
        Self::default()
    }
}

impl Balancer for LeastConn {
    fn pick(&self, set: &EndpointSet, ctx: &PickContext<'_>) -> Result<Pick, NoPick> {
        claim(set, ctx, || {
            let start = rotate(&self.next, set.endpoints(), ctx)?;
            least_by(set.endpoints(), ctx, start, |e| {
                (e.in_flight() as f64 + 1.0) / e.effective_weight(ctx.now)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::testing::*;

    #[test]
    fn prefers_fewest_in_flight() {
        let s = set_of(&[1, 1, 1]);
        let lc = LeastConn::new();
        let _a = Pick::try_new(&s.endpoints()[0], &ctx()).unwrap();
        let _b = Pick::try_new(&s.endpoints()[2], &ctx()).unwrap();
        for _ in 0..5 {
            let p = lc.pick(&s, &ctx()).unwrap();
            assert_eq!(index_of(&s, &p), 1);
        }
    }

    #[test]
    fn ties_rotate() {
        let s = set_of(&[1, 1, 1]);
        assert_eq!(counts(&LeastConn::new(), &s, 300), vec![100, 100, 100]);
    }

    #[test]
    fn weight_divides_connections() {
        let s = set_of(&[1, 3]);
        let lc = LeastConn::new();
        let held: Vec<Pick> = (0..400).map(|_| lc.pick(&s, &ctx()).unwrap()).collect();
        let heavy = held.iter().filter(|p| index_of(&s, p) == 1).count();
        assert_eq!(heavy, 300);
    }

    #[test]
    fn honours_eligibility() {
        check_eligibility(&LeastConn::new());
    }
}
