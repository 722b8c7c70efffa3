//! A request pinned to an endpoint goes back to it while it is usable, whatever the
//! strategy; an unpinned one (or one whose endpoint is gone) is placed by the strategy
//! this wraps. Every strategy is built wrapped (`Strategy::build`). A pin is an
//! endpoint id: from the cookie the proxy sets under `sticky` (which is `p2c` plus that
//! cookie), or, under any strategy, the endpoint that holds the request's engine.io
//! (socket.io) session, learned by the proxy from the session's handshake.
//!
//! A pin yields to health, never to load: a request whose endpoint is down, ejected or
//! excluded (a retry) goes elsewhere, since waiting for a dead endpoint would turn
//! affinity into an outage; a request whose endpoint is only at its concurrency cap
//! waits for it in drover's queue. Moving it would break the sessions that need
//! affinity (socket.io's long-polling keeps its session in one process): a long-poll
//! holds its slot for seconds, and the session's next request must still go where the
//! session lives.
//!
//! Ids (`Endpoint::id`) are stable hashes of the address, so a cookie survives drover
//! restarts. Small pools are searched linearly (a few string compares beat a lock); large
//! ones through an id index built once per set generation.

use super::common::PerSet;
use crate::endpoint::Endpoint;
use crate::pick::{NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use crate::Balancer;
use std::collections::HashMap;
use std::sync::Arc;

/// Up to this many endpoints, the id is found by a linear search.
const LINEAR_MAX: usize = 16;

#[derive(Debug)]
pub struct Pinned {
    inner: Box<dyn Balancer>,
    index: PerSet<HashMap<Box<str>, usize>>,
}

impl Pinned {
    /// `inner` places what no pin places.
    pub fn new(inner: Box<dyn Balancer>) -> Self {
        Pinned {
            inner,
            index: PerSet::default(),
        }
    }

    fn find<'s>(&self, set: &'s EndpointSet, id: &str) -> Option<&'s Arc<Endpoint>> {
        let eps = set.endpoints();
        if eps.len() <= LINEAR_MAX {
            return eps.iter().find(|e| e.id() == id);
        }
        let index = self.index.get(set, |s| {
            let mut map = HashMap::with_capacity(s.len());
            for (i, e) in s.endpoints().iter().enumerate() {
                map.entry(e.id().into()).or_insert(i);
            }
            map
        });
        index.get(id).map(|&i| &eps[i])
    }
}

impl Balancer for Pinned {
    fn pick(&self, set: &EndpointSet, ctx: &PickContext<'_>) -> Result<Pick, NoPick> {
        let pinned = ctx.pinned.and_then(|id| self.find(set, id));
        match pinned.filter(|e| ctx.usable(e)) {
            // Full is not down: the request waits for its endpoint (`AllBusy` queues it).
            Some(e) => Pick::try_new(e, ctx).ok_or(NoPick::AllBusy),
            None => self.inner.pick(set, ctx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::testing::*;
    use crate::strategy::{P2c, RoundRobin};

    /// `sticky`: p2c, pinned.
    fn sticky() -> Pinned {
        Pinned::new(Box::new(P2c::new()))
    }

    fn pinned(id: &str) -> PickContext<'_> {
        PickContext {
            pinned: Some(id),
            ..ctx()
        }
    }

    #[test]
    fn follows_the_cookie_in_small_and_large_pools() {
        for n in [3, 40] {
            let s = set_of(&vec![1; n]);
            let st = sticky();
            for target in [0, n / 2, n - 1] {
                let id = s.endpoints()[target].id().to_string();
                for _ in 0..3 {
                    assert_eq!(index_of(&s, &st.pick(&s, &pinned(&id)).unwrap()), target);
                }
            }
        }
    }

    #[test]
    fn falls_back_when_pinned_endpoint_is_down_or_unknown() {
        let s = set_of(&[1, 1]);
        let st = sticky();
        let id = s.endpoints()[0].id().to_string();
        s.endpoints()[0].set_healthy(false);
        assert_eq!(index_of(&s, &st.pick(&s, &pinned(&id)).unwrap()), 1);
        assert_eq!(index_of(&s, &st.pick(&s, &pinned("nope")).unwrap()), 1);
        s.endpoints()[0].set_healthy(true);
        assert_eq!(index_of(&s, &st.pick(&s, &pinned(&id)).unwrap()), 0);
    }

    #[test]
    fn honours_eligibility() {
        check_eligibility(&sticky());
    }

    #[test]
    fn a_pinned_client_waits_for_its_full_endpoint() {
        let s = set_of(&[1, 1]);
        let st = sticky();
        let id = s.endpoints()[0].id().to_string();
        s.endpoints()[0].set_max_conns(1);
        let held = st.pick(&s, &pinned(&id)).unwrap();
        assert_eq!(st.pick(&s, &pinned(&id)).unwrap_err(), NoPick::AllBusy);
        drop(held);
        assert_eq!(index_of(&s, &st.pick(&s, &pinned(&id)).unwrap()), 0);
    }

    #[test]
    fn a_pin_holds_under_any_strategy_and_the_rest_is_the_strategys() {
        let s = set_of(&[1, 1, 1]);
        let rr = Pinned::new(Box::new(RoundRobin::new()));
        let id = s.endpoints()[2].id().to_string();
        for _ in 0..6 {
            assert_eq!(index_of(&s, &rr.pick(&s, &pinned(&id)).unwrap()), 2);
        }
        // Unpinned: round-robin's turns, all three.
        let turns: std::collections::BTreeSet<usize> = (0..3)
            .map(|_| index_of(&s, &rr.pick(&s, &ctx()).unwrap()))
            .collect();
        assert_eq!(turns.len(), 3);
    }
}
