//! Helpers for the strategies' unit tests.

use crate::endpoint::Endpoint;
use crate::pick::{NoPick, Pick, PickContext};
use crate::set::EndpointSet;
use crate::Balancer;
use std::sync::Arc;

pub fn endpoint(i: usize, weight: u32) -> Arc<Endpoint> {
    let addr = format!("10.0.{}.{}:8000", i / 250, i % 250 + 1);
    Arc::new(Endpoint::with_weight(addr.parse().unwrap(), weight))
}

pub fn set_of(weights: &[u32]) -> EndpointSet {
    EndpointSet::new(
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| endpoint(i, w))
            .collect(),
    )
}

pub fn ctx() -> PickContext<'static> {
    ctx_at(1)
}

pub fn ctx_at(now: u64) -> PickContext<'static> {
    PickContext {
        now,
        ..Default::default()
    }
}

pub fn index_of(set: &EndpointSet, pick: &Pick) -> usize {
    set.endpoints()
        .iter()
        .position(|e| Arc::ptr_eq(e, pick.endpoint()))
        .expect("picked endpoint is in the set")
}

/// The indices of `n` picks, each released before the next.
pub fn picks(b: &dyn Balancer, set: &EndpointSet, n: usize) -> Vec<usize> {
    (0..n)
        .map(|_| index_of(set, &b.pick(set, &ctx()).unwrap()))
        .collect()
}

/// How many of `n` picks (each released before the next) went to each endpoint.
pub fn counts(b: &dyn Balancer, set: &EndpointSet, n: usize) -> Vec<usize> {
    let mut c = vec![0; set.len()];
    for i in picks(b, set, n) {
        c[i] += 1;
    }
    c
}

/// Down, ejected, excluded and full endpoints are never chosen; a pool of only those is
/// `AllBusy` while a full one could free up, `NoneAvailable` otherwise. The context
/// carries a sticky id naming the down endpoint, to exercise that path. (A hash key whose
/// endpoint is full waits for it instead: see the `maglev` tests.)
pub fn check_eligibility(b: &dyn Balancer) {
    let set = set_of(&[1, 1, 1, 1, 1]);
    let e = set.endpoints();
    e[0].set_healthy(false);
    e[1].eject_until(1_000);
    e[3].set_max_conns(1);
    let id = e[0].id().to_string();
    let exclude = [Arc::clone(&e[2])];
    let ctx = PickContext {
        now: 10,
        pinned: Some(&id),
        exclude: &exclude,
        ..Default::default()
    };
    let full = Pick::try_new(&e[3], &ctx).unwrap();
    for _ in 0..20 {
        let p = b.pick(&set, &ctx).expect("endpoint 4 is eligible");
        assert_eq!(index_of(&set, &p), 4, "{b:?}");
    }
    e[4].set_max_conns(1);
    let _also_full = b.pick(&set, &ctx).unwrap();
    assert_eq!(b.pick(&set, &ctx).unwrap_err(), NoPick::AllBusy, "{b:?}");
    drop(full);
    let p = b.pick(&set, &ctx).expect("endpoint 3 freed up");
    assert_eq!(index_of(&set, &p), 3, "{b:?}");
    drop(p);
    e[3].set_healthy(false);
    e[4].set_healthy(false);
    assert_eq!(
        b.pick(&set, &ctx).unwrap_err(),
        NoPick::NoneAvailable,
        "{b:?}"
    );
    let empty = EndpointSet::new(Vec::new());
    assert_eq!(
        b.pick(&empty, &ctx).unwrap_err(),
        NoPick::NoneAvailable,
        "{b:?}"
    );
    // Once the ejection ends, endpoint 1 is back.
    let later = PickContext { now: 1_000, ..ctx };
    assert_eq!(index_of(&set, &b.pick(&set, &later).unwrap()), 1, "{b:?}");
}
