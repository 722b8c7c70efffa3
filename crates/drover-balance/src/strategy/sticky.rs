//! `sticky`: a client that carries an endpoint id (from a cookie the proxy set) goes back
//! to that endpoint while it is eligible; otherwise `p2c` chooses, and the proxy re-pins
//! the client to the new endpoint.
//!
//! Stickiness yields to health, never to load: a client whose endpoint is down, ejected
//! or excluded (a retry) goes elsewhere, since waiting for a dead endpoint would turn
//! affinity into an outage; a client whose endpoint is only at its concurrency cap
//! waits for it in drover's queue. Moving it would break the sessions that need
//! affinity (socket.io's long-polling keeps its session in one process): a long-poll
//! holds its slot for seconds, and the session's next request must still go where the
//! session lives.
//!
//! Ids (`Endpoint::id`) are stable hashes of the address, so a cookie survives drover
//! restarts. Small pools are searched linearly (a few string compares beat a lock); large
//! ones through an id index built once per set generation.

use super::common::{claim, PerSet};
use super::p2c;
use crate::endpoint::Endpoint;
use crate::pick::{NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use crate::Balancer;
use std::collections::HashMap;
use std::sync::Arc;

/// Up to this many endpoints, the id is found by a linear search.
const LINEAR_MAX: usize = 16;

#[derive(Debug, Default)]
pub struct Sticky {
    index: PerSet<HashMap<Box<str>, usize>>,
}

impl Sticky {
    pub fn new() -> Self {
        Self::default()
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

impl Balancer for Sticky {
    fn pick(&self, set: &EndpointSet, ctx: &PickContext<'_>) -> Result<Pick, NoPick> {
        let pinned = ctx.sticky.and_then(|id| self.find(set, id));
        match pinned.filter(|e| ctx.usable(e)) {
            // Full is not down: the request waits for its endpoint (`AllBusy` queues it).
            Some(e) => Pick::try_new(e, ctx).ok_or(NoPick::AllBusy),
            None => claim(set, ctx, || p2c::choose(set, ctx)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::strategy::testing::*;

    fn pinned(id: &str) -> PickContext<'_> {
        PickContext {
            sticky: Some(id),
            ..ctx()
        }
    }

    #[test]
    fn follows_the_cookie_in_small_and_large_pools() {
        for n in [3, 40] {
            let s = set_of(&vec![1; n]);
            let st = Sticky::new();
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
        let st = Sticky::new();
        let id = s.endpoints()[0].id().to_string();
        s.endpoints()[0].set_healthy(false);
        assert_eq!(index_of(&s, &st.pick(&s, &pinned(&id)).unwrap()), 1);
        assert_eq!(index_of(&s, &st.pick(&s, &pinned("nope")).unwrap()), 1);
        s.endpoints()[0].set_healthy(true);
        assert_eq!(index_of(&s, &st.pick(&s, &pinned(&id)).unwrap()), 0);
    }

    #[test]
    fn honours_eligibility() {
        check_eligibility(&Sticky::new());
    }

    #[test]
    fn a_pinned_client_waits_for_its_full_endpoint() {
        let s = set_of(&[1, 1]);
        let st = Sticky::new();
        let id = s.endpoints()[0].id().to_string();
        s.endpoints()[0].set_max_conns(1);
        let held = st.pick(&s, &pinned(&id)).unwrap();
        assert_eq!(st.pick(&s, &pinned(&id)).unwrap_err(), NoPick::AllBusy);
        drop(held);
        assert_eq!(index_of(&s, &st.pick(&s, &pinned(&id)).unwrap()), 0);
    }
}
