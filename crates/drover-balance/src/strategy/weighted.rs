//! `weighted`: smooth weighted round-robin, nginx's algorithm.
//!
//! Each pick adds every eligible endpoint's effective weight to its running "current"
//! weight, takes the endpoint with the highest current weight and subtracts the total
//! from it. Weights 5,1,1 give `a a b a c a a` rather than `a a a a a b c`: a heavy
//! endpoint never takes a burst, and shares are exact over every window of one cycle.
//! Effective weight includes slow start, so a new endpoint ramps up smoothly too.
//!
//! The current weights are shared state that every pick reads and writes, so they sit
//! behind one short `Mutex`: a lock-free version would need a CAS over the whole vector.
//! The pick costs O(n) under the lock, as in nginx; large pools should use `p2c` or
//! `random`. State is keyed by the set's generation and rebuilt when the set changes,
//! carrying each surviving endpoint's current weight across (matched by `Arc` pointer,
//! then by address), so a membership change does not restart the cycle for everyone.

use super::common::{claim, lock};
use crate::endpoint::Endpoint;
use crate::pick::{NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use crate::Balancer;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

#[derive(Debug, Default)]
pub struct SmoothWeighted {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    generation: u64,
    /// Parallel to the set's endpoints.
    current: Vec<(Arc<Endpoint>, f64)>,
}

impl SmoothWeighted {
    pub fn new() -> Self {
        Self::default()
    }
}

impl State {
    fn sync(&mut self, set: &EndpointSet) {
        // Generations are unique per snapshot; only empty default sets share one.
        if self.generation == set.generation() && self.current.len() == set.len() {
            return;
        }
        // Allocates, but only when membership changed.
        let by_ptr: HashMap<*const Endpoint, f64> = self
            .current
            .iter()
            .map(|(e, w)| (Arc::as_ptr(e), *w))
            .collect();
        let by_addr: HashMap<_, f64> = self.current.iter().map(|(e, w)| (e.addr(), *w)).collect();
        self.current = set
            .endpoints()
            .iter()
            .map(|e| {
                let kept = by_ptr
                    .get(&Arc::as_ptr(e))
                    .or_else(|| by_addr.get(&e.addr()));
                (Arc::clone(e), kept.copied().unwrap_or(0.0))
            })
            .collect();
        self.generation = set.generation();
    }

    fn next(&mut self, ctx: &PickContext<'_>) -> Option<usize> {
        let mut total = 0.0;
        let mut best: Option<(usize, f64)> = None;
        for (i, (e, current)) in self.current.iter_mut().enumerate() {
            if !ctx.eligible(e) {
                continue;
            }
            let w = e.effective_weight(ctx.now);
            *current += w;
            total += w;
            if best.is_none_or(|(_, b)| *current > b) {
                best = Some((i, *current));
            }
        }
        let (b, _) = best?;
        self.current[b].1 -= total;
        Some(b)
    }
}

impl Balancer for SmoothWeighted {
    fn pick(&self, set: &EndpointSet, ctx: &PickContext<'_>) -> Result<Pick, NoPick> {
        claim(set, ctx, || {
            let mut state = lock(&self.state);
            state.sync(set);
            state.next(ctx).map(|i| &set.endpoints()[i])
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::testing::*;

    #[test]
    fn nginx_sequence_is_smooth() {
        let s = set_of(&[5, 1, 1]);
        let w = SmoothWeighted::new();
        assert_eq!(picks(&w, &s, 7), vec![0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn shares_are_exact_per_cycle() {
        let s = set_of(&[1, 2, 3, 4]);
        assert_eq!(
            counts(&SmoothWeighted::new(), &s, 1000),
            vec![100, 200, 300, 400]
        );
    }

    #[test]
    fn state_survives_a_membership_change() {
        let s = set_of(&[1, 1]);
        let w = SmoothWeighted::new();
        assert_eq!(picks(&w, &s, 1), vec![0]);
        // Endpoint 1 is owed a turn; a reset would give it to endpoint 0 again.
        let mut eps = s.endpoints().to_vec();
        eps.push(endpoint(9, 1));
        let s2 = EndpointSet::new(eps);
        assert_eq!(picks(&w, &s2, 1), vec![1]);
    }

    #[test]
    fn slow_start_scales_the_share() {
        let s = set_of(&[1, 1]);
        s.endpoints()[1].start_ramp(1, 1_000_000);
        // At time 500_001 endpoint 1 is half way through its ramp: weight 0.5 vs 1.
        let w = SmoothWeighted::new();
        let mut n = [0; 2];
        for _ in 0..300 {
            let p = w.pick(&s, &ctx_at(500_001)).unwrap();
            n[index_of(&s, &p)] += 1;
        }
        assert_eq!(n, [200, 100]);
    }

    #[test]
    fn honours_eligibility() {
        check_eligibility(&SmoothWeighted::new());
    }
}
