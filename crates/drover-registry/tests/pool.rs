//! Membership changes: endpoints that stay keep their state; new ones slow-start.

use drover_balance::{clock, Pick, PickContext};
use drover_registry::{Pool, PoolOptions, Source};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

fn addr(port: u16) -> SocketAddr {
    ([127, 0, 0, 1], port).into()
}

fn slow_start_opts() -> PoolOptions {
    PoolOptions {
        slow_start: Duration::from_secs(30),
        max_conns: 7,
        ..PoolOptions::default()
    }
}

#[test]
fn load_state_survives_a_membership_change() {
    let pool = Pool::new("web", &[(addr(1), 1), (addr(2), 1)], slow_start_opts());
    let a = pool.find(addr(1)).unwrap();
    let now = clock::now();
    let pick = Pick::try_new(
        &a,
        &PickContext {
            now,
            ..Default::default()
        },
    )
    .unwrap();
    a.observe_rtt(now, 42_000);
    a.set_healthy(false);
    a.eject_until(now + 1_000_000_000);
    let before = pool.snapshot().generation();

    let change = pool.set_source(Source::Static, &[(addr(3), 1), (addr(1), 3)]);
    assert_eq!(change.added, [addr(3)]);
    assert_eq!(change.removed, [addr(2)]);

    let snap = pool.snapshot();
    assert!(snap.generation() > before);
    assert_eq!(snap.len(), 2);
    let a2 = snap.find(addr(1)).unwrap();
    assert!(Arc::ptr_eq(&a, a2), "the same endpoint, not a copy");
    assert_eq!(a2.in_flight(), 1);
    assert_eq!(a2.rtt_estimate(), 42_000.0);
    assert!(!a2.is_healthy());
    assert_eq!(a2.ejected_until(), now + 1_000_000_000);
    assert_eq!(a2.weight(), 3, "weight follows the new list");
    drop(pick);
    assert_eq!(a2.in_flight(), 0);
    // Order follows the list given.
    let order: Vec<_> = snap.endpoints().iter().map(|e| e.addr()).collect();
    assert_eq!(order, [addr(3), addr(1)]);
}

#[test]
fn only_endpoints_joining_a_running_pool_slow_start() {
    let pool = Pool::new("web", &[(addr(1), 1)], slow_start_opts());
    let now = clock::now();
    assert_eq!(pool.find(addr(1)).unwrap().ramp(now), 1.0);
    // The pool has served for a while: the newcomer ramps over that while.
    std::thread::sleep(Duration::from_millis(300));
    pool.set_source(Source::Static, &[(addr(1), 1), (addr(2), 1)]);
    let now = clock::now();
    assert_eq!(pool.find(addr(1)).unwrap().ramp(now), 1.0);
    assert!(pool.find(addr(2)).unwrap().ramp(now) < 0.2);
}

/// At a fresh start (a supervisor's workers joining an empty pool one by one) no member
/// is warmer than another: the first does not ramp, and one that joins later ramps for
/// no longer than the pool has had members, not for the whole `slow_start`.
#[test]
fn a_member_ramps_no_longer_than_the_pool_has_had_members() {
    let pool = Pool::new("app", &[], slow_start_opts());
    pool.insert(Source::Supervisor, addr(1), 1);
    assert_eq!(pool.find(addr(1)).unwrap().ramp(clock::now()), 1.0);

    std::thread::sleep(Duration::from_millis(200));
    pool.insert(Source::Supervisor, addr(2), 1);
    let joined = clock::now();
    let late = pool.find(addr(2)).unwrap();
    assert!(
        late.ramp(joined) < 0.2,
        "it joined a pool that served 200 ms"
    );
    // Its ramp lasts about those 200 ms (and at most a little more), not 30 s.
    let ramp_len = 400_000_000;
    assert_eq!(late.ramp(joined + ramp_len), 1.0);
    assert_eq!(pool.find(addr(1)).unwrap().ramp(joined), 1.0);
}

#[test]
fn no_slow_start_when_disabled() {
    let pool = Pool::new("web", &[(addr(1), 1)], PoolOptions::default());
    pool.insert(Source::Admin, addr(2), 1);
    assert_eq!(pool.find(addr(2)).unwrap().ramp(clock::now()), 1.0);
}

#[test]
fn max_conns_applies_to_every_endpoint() {
    let pool = Pool::new("web", &[(addr(1), 1)], slow_start_opts());
    pool.insert(Source::Admin, addr(2), 1);
    for ep in pool.endpoints() {
        assert_eq!(ep.max_conns(), 7);
    }
}

#[test]
fn initially_unhealthy_endpoints_wait_for_checks() {
    let opts = PoolOptions {
        initially_unhealthy: true,
        ..PoolOptions::default()
    };
    let pool = Pool::new("w", &[(addr(1), 1)], opts);
    assert!(!pool.find(addr(1)).unwrap().is_healthy());
    pool.insert(Source::Admin, addr(2), 1);
    assert!(!pool.find(addr(2)).unwrap().is_healthy());
}

#[test]
fn an_unchanged_list_keeps_the_snapshot() {
    let pool = Pool::new("web", &[(addr(1), 1), (addr(2), 2)], PoolOptions::default());
    let gen = pool.snapshot().generation();
    assert!(pool
        .set_source(Source::Static, &[(addr(1), 1), (addr(2), 2)])
        .is_empty());
    assert_eq!(pool.snapshot().generation(), gen);
    // A weight change swaps (strategies may cache weight-derived tables per snapshot).
    assert!(pool
        .set_source(Source::Static, &[(addr(1), 1), (addr(2), 5)])
        .is_empty());
    assert!(pool.snapshot().generation() > gen);
}

#[test]
fn duplicates_keep_the_first() {
    let pool = Pool::new("web", &[(addr(1), 4), (addr(1), 9)], PoolOptions::default());
    assert_eq!(pool.endpoints().len(), 1);
    assert_eq!(pool.endpoints()[0].weight(), 4);
}

#[test]
fn insert_and_remove() {
    let pool = Pool::new("web", &[], PoolOptions::default());
    assert!(pool.snapshot().is_empty());
    assert_eq!(pool.insert(Source::Admin, addr(1), 1).added, [addr(1)]);
    assert!(pool.insert(Source::Admin, addr(1), 2).is_empty());
    assert_eq!(pool.find(addr(1)).unwrap().weight(), 2);
    assert_eq!(pool.remove(Source::Admin, addr(1)).removed, [addr(1)]);
    assert!(pool.remove(Source::Admin, addr(1)).is_empty());
    assert!(pool.snapshot().is_empty());
}

#[test]
fn concurrent_inserts_are_not_lost() {
    let pool = Arc::new(Pool::new("web", &[], PoolOptions::default()));
    std::thread::scope(|s| {
        for t in 0..8u16 {
            let pool = Arc::clone(&pool);
            s.spawn(move || {
                for i in 0..50 {
                    pool.insert(Source::Admin, addr(1000 + t * 100 + i), 1);
                    // Readers meanwhile never block and always see a whole set.
                    assert!(!pool.snapshot().is_empty());
                }
            });
        }
    });
    assert_eq!(pool.endpoints().len(), 400);
}

#[test]
fn status_reports_each_endpoint() {
    let pool = Pool::new("web", &[(addr(1), 2), (addr(2), 1)], PoolOptions::default());
    let now = clock::now();
    let b = pool.find(addr(2)).unwrap();
    b.eject_until(now + 3_000_000_000);
    b.observe_rtt(now, 5_000);
    let status = pool.status_at(now);
    assert_eq!(status.len(), 2);
    assert_eq!(status[0].addr, addr(1));
    assert!(status[0].available && status[0].healthy);
    assert_eq!(status[0].weight, 2);
    assert_eq!(status[0].ejected_for, Duration::ZERO);
    assert!(!status[1].available && status[1].healthy);
    assert_eq!(status[1].ejected_for, Duration::from_secs(3));
    assert_eq!(status[1].rtt_ns, 5_000);
    assert_eq!(status[1].id, b.id());
}

#[test]
fn pool_forwards_passive_reports() {
    let pool = Pool::new("web", &[(addr(1), 1), (addr(2), 1)], PoolOptions::default());
    let a = pool.find(addr(1)).unwrap();
    let now = clock::now();
    for _ in 0..4 {
        assert_eq!(pool.on_response(&a, 503, now), None);
    }
    pool.on_response(&a, 200, now);
    assert_eq!(a.fail_streak(), 0);
    assert_eq!(
        pool.on_connect_failure(&a, now),
        Some(pool.options().passive.base_ejection)
    );
    assert!(!a.is_available(now));
}

#[test]
fn sources_combine_and_an_address_stays_while_any_source_names_it() {
    let pool = Pool::new("web", &[(addr(1), 2)], PoolOptions::default());
    let static_ep = pool.find(addr(1)).unwrap();
    assert_eq!(pool.insert(Source::Admin, addr(2), 1).added, [addr(2)]);
    // The admin API naming a static address adds nothing; the first source's weight wins.
    assert!(pool.insert(Source::Admin, addr(1), 9).is_empty());
    assert_eq!(pool.find(addr(1)).unwrap().weight(), 2);
    assert_eq!(pool.sources_of(addr(1)), [Source::Static, Source::Admin]);
    // Letting go in one source keeps what another still names, with its state.
    assert!(pool.remove(Source::Admin, addr(1)).is_empty());
    assert!(Arc::ptr_eq(&static_ep, &pool.find(addr(1)).unwrap()));
    // Replacing one source leaves the others alone.
    let change = pool.set_source(Source::Etcd, &[(addr(3), 1)]);
    assert_eq!(change.added, [addr(3)]);
    let change = pool.set_source(Source::Static, &[]);
    assert_eq!(change.removed, [addr(1)]);
    let order: Vec<_> = pool.endpoints().iter().map(|e| e.addr()).collect();
    assert_eq!(order, [addr(2), addr(3)]);
    assert!(pool.sources_of(addr(1)).is_empty());
}

#[test]
fn endpoints_not_from_a_source_leave_out_every_address_it_names() {
    let pool = Pool::new("web", &[(addr(1), 1), (addr(2), 1)], PoolOptions::default());
    pool.set_source(Source::Supervisor, &[(addr(2), 1), (addr(3), 1)]);
    pool.insert(Source::Dns, addr(4), 1);
    let others: Vec<_> = pool
        .endpoints_not_from(Source::Supervisor)
        .iter()
        .map(|e| e.addr())
        .collect();
    // addr(2) is also static, but the supervisor names it: one endpoint, the worker's.
    assert_eq!(others, [addr(1), addr(4)]);
    assert_eq!(pool.endpoints_not_from(Source::Etcd).len(), 4);
}

#[test]
fn the_set_counts_the_supervised_members_not_here_yet() {
    // A fixed backend beside an app's workers, as `backends = ["app:web", "10.0.0.5:80"]`.
    let pool = Pool::new("web", &[(addr(1), 1)], PoolOptions::default());
    assert_eq!(pool.snapshot().awaited(), 0, "nothing supervised");
    pool.expect_members(2);
    assert_eq!(pool.snapshot().awaited(), 2);
    pool.insert(Source::Supervisor, addr(2), 1);
    assert_eq!(
        pool.snapshot().awaited(),
        1,
        "the fixed backend is no worker"
    );
    let generation = pool.snapshot().generation();
    pool.expect_members(3);
    assert_eq!(pool.snapshot().awaited(), 2);
    assert_eq!(pool.snapshot().generation(), generation, "the same members");
    pool.insert(Source::Supervisor, addr(3), 1);
    pool.insert(Source::Supervisor, addr(4), 1);
    assert_eq!(pool.snapshot().awaited(), 0);
    // A worker that ends leaves the pool until its replacement joins.
    pool.remove(Source::Supervisor, addr(3));
    assert_eq!(pool.snapshot().awaited(), 1);
    pool.expect_members(2);
    assert_eq!(pool.snapshot().awaited(), 0);
}
