//! `peak-ewma`: a full scan for the endpoint with the least load score.
//!
//! The same score as `p2c` (expected outstanding work under a peak-EWMA latency
//! estimate, scaled by reported load and weight; see `Endpoint::load_score`), but over
//! every eligible endpoint: the best choice the information allows, at O(n) per pick.
//! Worth it for small pools where each mistake is expensive; p2c is the default because
//! the scan costs more on large pools and can herd concurrent picks onto one endpoint.
//! Each pick adds its cost to the endpoint's in-flight work at once, which is what keeps
//! back-to-back picks from all landing on the same one. The scan starts at a random
//! index so exact ties spread. Unlike `p2c` it ranks idle endpoints by latency too, so
//! light traffic goes to the fastest endpoint (and stays there while it is fastest).

use super::common::{claim, least_by, random_start};
use crate::pick::{NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use crate::Balancer;

#[derive(Debug, Default)]
pub struct PeakEwma;

impl PeakEwma {
    pub fn new() -> Self {
        PeakEwma
    }
}

impl Balancer for PeakEwma {
    fn pick(&self, set: &EndpointSet, ctx: &PickContext<'_>) -> Result<Pick, NoPick> {
        let eps = set.endpoints();
        claim(set, ctx, || {
            least_by(eps, ctx, random_start(eps.len()), |e| e.load_score(ctx.now))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::testing::*;

    #[test]
    fn picks_the_fastest_endpoint() {
        let s = set_of(&[1; 8]);
        for (i, e) in s.endpoints().iter().enumerate() {
            e.observe_rtt(1, 1_000_000 + 1_000 * (8 - i as u64));
        }
        let p = PeakEwma::new().pick(&s, &ctx()).unwrap();
        assert_eq!(index_of(&s, &p), 7);
    }

    #[test]
    fn held_work_spreads_back_to_back_picks() {
        let s = set_of(&[1; 4]);
        let b = PeakEwma::new();
        let held: Vec<Pick> = (0..8).map(|_| b.pick(&s, &ctx()).unwrap()).collect();
        for e in s.endpoints() {
            assert_eq!(e.in_flight(), 2);
        }
        drop(held);
    }

    #[test]
    fn honours_eligibility() {
        check_eligibility(&PeakEwma::new());
    }
}
