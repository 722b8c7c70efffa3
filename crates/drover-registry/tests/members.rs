//! Runtime members: registration, heartbeats, TTL expiry, drains, and refusals that
//! change nothing.

use drover_balance::{clock, Pick, PickContext};
use drover_registry::{
    MemberError, MemberErrorKind, MemberState, Members, Pool, PoolOptions, Registration, Source,
};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn addr(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

fn reg(port: u16, ttl: Option<u64>) -> Registration {
    Registration {
        address: addr(port).to_string(),
        addr: addr(port),
        ttl: ttl.map(Duration::from_secs),
        weight: 1,
        meta: BTreeMap::new(),
    }
}

fn setup() -> (Arc<Pool>, Arc<Members>) {
    let pool = Arc::new(Pool::new("web", &[(addr(1), 1)], PoolOptions::default()));
    let members = Members::new(Arc::clone(&pool), Source::Admin);
    (pool, members)
}

fn pool_addrs(pool: &Pool) -> Vec<SocketAddr> {
    pool.endpoints().iter().map(|e| e.addr()).collect()
}

#[test]
fn a_member_joins_stays_while_it_heartbeats_and_leaves_when_its_ttl_lapses() {
    let (pool, members) = setup();
    let t0 = Instant::now();
    let r = members.register_at("a", reg(2, Some(10)), t0).unwrap();
    assert!(r.created);
    assert_eq!(r.member.state, MemberState::Active);
    assert_eq!(r.member.ttl_left, Some(Duration::from_secs(10)));
    assert_eq!(pool_addrs(&pool), [addr(1), addr(2)]);

    // Heartbeats push the deadline; a load report reaches the endpoint.
    let hb = members
        .heartbeat_at("a", Some(0.5), t0 + Duration::from_secs(8))
        .unwrap();
    assert_eq!(hb.ttl_left, Some(Duration::from_secs(10)));
    assert_eq!(pool.find(addr(2)).unwrap().reported_load(clock::now()), 0.5);
    assert!(members.sweep_at(t0 + Duration::from_secs(17)).is_empty());
    assert_eq!(
        members.sweep_at(t0 + Duration::from_secs(18)),
        ["a".to_string()]
    );
    assert_eq!(pool_addrs(&pool), [addr(1)]);
    assert!(members.list_at(t0).is_empty());
    // A heartbeat after that is told to register again (the SDK does so).
    let e = members.heartbeat_at("a", None, t0).unwrap_err();
    assert_eq!(e.kind(), MemberErrorKind::NotFound);
}

#[test]
fn a_member_without_ttl_stays_until_drained() {
    let (pool, members) = setup();
    let t0 = Instant::now();
    members.register_at("a", reg(2, None), t0).unwrap();
    assert!(members
        .sweep_at(t0 + Duration::from_secs(100_000))
        .is_empty());
    let v = members.drain_at("a", t0).unwrap();
    assert_eq!(
        v.state,
        MemberState::Removed,
        "nothing in flight: gone at once"
    );
    assert_eq!(pool_addrs(&pool), [addr(1)]);
}

#[test]
fn a_drained_member_gets_no_new_requests_and_goes_when_its_last_one_ends() {
    let (pool, members) = setup();
    let t0 = Instant::now();
    members.register_at("a", reg(2, Some(10)), t0).unwrap();
    let ep = pool.find(addr(2)).unwrap();
    let pick = Pick::try_new(
        &ep,
        &PickContext {
            now: clock::now(),
            ..Default::default()
        },
    )
    .unwrap();
    let v = members.drain_at("a", t0).unwrap();
    assert_eq!((v.state, v.in_flight), (MemberState::Draining, 1));
    assert_eq!(pool_addrs(&pool), [addr(1)], "out of the pool at once");
    // Heartbeats do not bring it back; a registration does.
    let e = members.heartbeat_at("a", None, t0).unwrap_err();
    assert_eq!(e, MemberError::Draining { id: "a".into() });
    assert!(members.sweep_at(t0 + Duration::from_secs(60)).is_empty());
    assert_eq!(members.list_at(t0)[0].state, MemberState::Draining);
    drop(pick);
    assert_eq!(members.sweep_at(t0), ["a".to_string()]);
    assert!(members.list_at(t0).is_empty());
}

#[test]
fn registering_again_updates_in_place_and_keeps_the_endpoint() {
    let (pool, members) = setup();
    let t0 = Instant::now();
    members.register_at("a", reg(2, Some(10)), t0).unwrap();
    let ep = pool.find(addr(2)).unwrap();
    let mut again = reg(2, Some(30));
    again.weight = 5;
    again.meta.insert("zone".into(), "b".into());
    let r = members.register_at("a", again, t0).unwrap();
    assert!(!r.created);
    assert_eq!(r.member.weight, 5);
    assert_eq!(r.member.meta["zone"], "b");
    assert!(Arc::ptr_eq(&ep, &pool.find(addr(2)).unwrap()));
    assert_eq!(ep.weight(), 5);
}

#[test]
fn conflicts_and_bad_values_are_refused_and_change_nothing() {
    let (pool, members) = setup();
    let t0 = Instant::now();
    members.register_at("a", reg(2, Some(10)), t0).unwrap();
    let before = members.list_at(t0);
    let gen = pool.snapshot().generation();

    let e = members.register_at("a", reg(3, Some(10)), t0).unwrap_err();
    assert_eq!(e.kind(), MemberErrorKind::Conflict);
    assert!(e.to_string().contains("127.0.0.1:2"), "{e}");
    let e = members.register_at("b", reg(2, Some(10)), t0).unwrap_err();
    assert!(e.to_string().contains("member \"a\""), "{e}");
    let e = members.register_at("b", reg(1, Some(10)), t0).unwrap_err();
    assert!(e.to_string().contains("static backend"), "{e}");

    for (id, r, field) in [
        ("bad/id", reg(4, Some(10)), "id"),
        ("", reg(4, Some(10)), "id"),
        ("b", reg(4, Some(0)), "ttl"),
        ("b", reg(4, Some(90_000)), "ttl"),
        (
            "b",
            Registration {
                weight: 0,
                ..reg(4, None)
            },
            "weight",
        ),
        (
            "b",
            Registration {
                meta: (0..40).map(|i| (i.to_string(), String::new())).collect(),
                ..reg(4, None)
            },
            "meta",
        ),
    ] {
        let e = members.register_at(id, r, t0).unwrap_err();
        assert_eq!(e.kind(), MemberErrorKind::Invalid, "{e}");
        assert!(e.to_string().starts_with(field), "{field}: {e}");
    }
    for load in [-0.1, 1.5, f64::NAN] {
        let e = members.heartbeat_at("a", Some(load), t0).unwrap_err();
        assert!(e.to_string().starts_with("load"), "{e}");
    }
    assert_eq!(members.list_at(t0), before);
    assert_eq!(pool.snapshot().generation(), gen);
    assert_eq!(pool_addrs(&pool), [addr(1), addr(2)]);
}

#[tokio::test]
async fn the_sweeper_removes_lapsed_members_on_its_own() {
    let (pool, members) = setup();
    let t0 = Instant::now();
    members.register_at("a", reg(2, Some(1)), t0).unwrap();
    let sweeper = members.spawn_sweeper();
    while pool_addrs(&pool) != [addr(1)] && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t0.elapsed();
    assert_eq!(pool_addrs(&pool), [addr(1)], "still there after {took:?}");
    assert!(
        took >= Duration::from_secs(1),
        "removed before its TTL: {took:?}"
    );
    drop(members);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(sweeper.is_finished(), "the sweeper ends with its Members");
}

#[tokio::test]
async fn a_sweeper_with_nothing_to_sweep_sleeps_until_a_member_with_a_ttl_registers() {
    let (pool, members) = setup();
    let sweeper = members.spawn_sweeper();
    // Nothing has a TTL: the sweeper sleeps, and must still hear of what comes later.
    members
        .register_at("fixed", reg(3, None), Instant::now())
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t0 = Instant::now();
    members.register_at("a", reg(2, Some(1)), t0).unwrap();
    while pool_addrs(&pool).contains(&addr(2)) && t0.elapsed() < Duration::from_secs(5) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = t0.elapsed();
    assert!(
        !pool_addrs(&pool).contains(&addr(2)),
        "still there after {took:?}"
    );
    assert!(
        pool_addrs(&pool).contains(&addr(3)),
        "a member with no TTL stays"
    );
    assert!(
        took >= Duration::from_secs(1),
        "removed before its TTL: {took:?}"
    );
    // Asleep again (only "fixed" is left), it still ends with its Members.
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(members);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        sweeper.is_finished(),
        "the sleeping sweeper ends with its Members"
    );
}

/// Thousands of members register (a fleet after a deploy, one balancer for all of it):
/// each registration costs about the same however many came before. Before, every
/// registration looked each member up in the pool's snapshot with a scan of every
/// other, so the n-th cost n² and 10,000 never finished (the admin API stopped
/// answering); 4,000 took 35 s, and here 3,377 took 60 s (a debug build). Now 5,000
/// take about 25 s in a debug build and 2.5 s in a release one; the deadline is far
/// above that and far below the old n³.
#[test]
fn thousands_of_members_register_each_at_a_like_cost() {
    let (pool, members) = setup();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(90);
    let fleet: u16 = 5_000;
    for n in 0..fleet {
        let port = 10_000 + n;
        members
            .register_at(&format!("m{n}"), reg(port, None), t0)
            .unwrap();
        assert!(Instant::now() < deadline, "{n} registered in 90 s");
    }
    assert_eq!(pool.endpoints().len(), usize::from(fleet) + 1);
    assert_eq!(members.list_at(t0).len(), usize::from(fleet));
    // Each is found at its own address.
    for n in [0, 2_500, fleet - 1] {
        assert_eq!(
            pool.find(addr(10_000 + n)).unwrap().addr(),
            addr(10_000 + n)
        );
    }
    assert!(pool.find(addr(9_999)).is_none());
}
