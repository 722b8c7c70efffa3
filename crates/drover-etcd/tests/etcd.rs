//! EtcdMembers against real etcd servers: two balancers sharing a prefix, TTLs on
//! leases, etcd going away and coming back, compaction, bad values, refusals.

mod common;

use common::*;
use drover_balance::{clock, Pick, PickContext};
use drover_etcd::{EtcdAuth, EtcdMembers, EtcdOptions};
use drover_registry::{MemberError, MemberState, MemberStore, Registration, Source};
use std::sync::Arc;
use std::time::Duration;

const SOON: Duration = Duration::from_secs(5);

async fn connected(m: &drover_etcd::EtcdMembers) -> bool {
    eventually(SOON, || m.status().connected).await
}

fn pick(ep: &Arc<drover_balance::Endpoint>) -> Pick {
    Pick::try_new(
        ep,
        &PickContext {
            now: clock::now(),
            ..Default::default()
        },
    )
    .expect("a free endpoint")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_registered_at_one_balancer_shows_in_the_other() {
    bounded(30, async {
        let etcd = Etcd::start().await;
        let (pool_a, pool_b) = (pool(&[]), pool(&[]));
        let a = start(&etcd, &pool_a);
        let b = start(&etcd, &pool_b);
        assert!(connected(&a).await && connected(&b).await);

        let mut r = reg(7001, None);
        r.weight = 3;
        r.meta.insert("zone".into(), "a".into());
        let done = a.register("m1".into(), r.clone()).await.unwrap();
        assert!(done.created);
        assert_eq!(done.member.source, Source::Etcd);
        assert_eq!(done.member.state, MemberState::Active);
        assert_eq!(
            addrs(&pool_a),
            [addr(7001)],
            "in A's pool when register answers"
        );
        assert!(eventually(SOON, || addrs(&pool_b) == [addr(7001)]).await);
        assert_eq!(pool_b.find(addr(7001)).unwrap().weight(), 3);
        let listed = b.list();
        assert_eq!(listed.len(), 1);
        assert_eq!(
            (listed[0].id.as_str(), listed[0].weight, listed[0].ttl),
            ("m1", 3, None)
        );
        assert_eq!(listed[0].meta.get("zone").map(String::as_str), Some("a"));

        // One key per member, a JSON value with the fields named in the design.
        let mut c = etcd.client().await;
        let resp = c.get(a.key_of("m1"), None).await.unwrap();
        assert_eq!(a.key_of("m1"), format!("{PREFIX}/members/m1"));
        let kv = &resp.kvs()[0];
        assert_eq!(kv.lease(), 0, "no TTL, no lease");
        let json: serde_json::Value = serde_json::from_slice(kv.value()).unwrap();
        assert_eq!(json["addr"], "127.0.0.1:7001");
        assert_eq!(json["address"], "127.0.0.1:7001");
        assert_eq!(json["weight"], 3);
        assert_eq!(json["meta"]["zone"], "a");
        assert!(json["ttl_secs"].is_null());

        // Registering again updates; a heartbeat at B carries load to B's endpoint.
        let again = a.register("m1".into(), r.clone()).await.unwrap();
        assert!(!again.created);
        // With a TTL: a lease; registering again takes a new one and revokes the old.
        let mut r5 = r.clone();
        r5.ttl = Some(Duration::from_secs(5));
        a.register("m1".into(), r5.clone()).await.unwrap();
        let lease_of = |c: &mut etcd_client::Client| {
            let mut c = c.clone();
            let key = a.key_of("m1");
            async move { c.get(key, None).await.unwrap().kvs()[0].lease() }
        };
        let l1 = lease_of(&mut c).await;
        assert_ne!(l1, 0);
        let again = a.register("m1".into(), r5).await.unwrap();
        assert_eq!(again.member.ttl, Some(Duration::from_secs(5)));
        let l2 = lease_of(&mut c).await;
        assert_ne!(l2, l1);
        let leases: Vec<i64> = c
            .leases()
            .await
            .unwrap()
            .leases()
            .iter()
            .map(|l| l.id())
            .collect();
        assert_eq!(leases, [l2], "the old lease was revoked after the put");
        let hb = b.heartbeat("m1".into(), Some(0.75)).await.unwrap();
        assert_eq!(hb.id, "m1");
        let load = pool_b.find(addr(7001)).unwrap().reported_load(clock::now());
        assert!((load - 0.75).abs() < 1e-9, "load {load}");

        // A drain at A with a request in flight there: draining at A, gone from B.
        let ep = pool_a.find(addr(7001)).unwrap();
        let held = pick(&ep);
        let v = a.drain("m1".into()).await.unwrap();
        assert_eq!((v.state, v.in_flight), (MemberState::Draining, 1));
        assert!(addrs(&pool_a).is_empty(), "no new requests at A");
        assert!(eventually(SOON, || addrs(&pool_b).is_empty()).await);
        assert_eq!(
            a.heartbeat("m1".into(), None).await.unwrap_err(),
            MemberError::Draining { id: "m1".into() }
        );
        assert_eq!(a.list()[0].state, MemberState::Draining);
        drop(held);
        assert!(a.list().is_empty(), "removed once its request ended");
        assert!(
            c.leases().await.unwrap().leases().is_empty(),
            "a drain revokes the member's lease"
        );
        assert_eq!(
            a.drain("m1".into()).await.unwrap_err(),
            MemberError::NotFound { id: "m1".into() }
        );
        assert_eq!(
            b.heartbeat("m1".into(), None).await.unwrap_err(),
            MemberError::NotFound { id: "m1".into() }
        );

        // A dropped EtcdMembers stops applying changes to its pool.
        drop(b);
        a.register("m2".into(), reg(7002, None)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(addrs(&pool_b).is_empty(), "B's watcher ended with it");
        let s = a.status();
        assert!(s.connected);
        assert_eq!(s.members, 1);
        assert!(s.revision > 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_without_heartbeats_leaves_every_pool_within_its_ttl() {
    bounded(30, async {
        let etcd = Etcd::start().await;
        let (pool_a, pool_b) = (pool(&[]), pool(&[]));
        let a = start(&etcd, &pool_a);
        let b = start(&etcd, &pool_b);
        assert!(connected(&a).await && connected(&b).await);

        let granted = std::time::Instant::now();
        let silent = a
            .register("silent".into(), reg(7101, Some(2)))
            .await
            .unwrap();
        assert_eq!(silent.member.ttl, Some(Duration::from_secs(2)));
        let left = silent.member.ttl_left.expect("A granted the lease");
        assert!(left <= Duration::from_secs(2) && left > Duration::from_secs(1));
        a.register("kept".into(), reg(7102, Some(2))).await.unwrap();
        let both = sorted(vec![addr(7101), addr(7102)]);
        assert!(eventually(SOON, || addrs(&pool_b) == both).await);

        // "kept" heartbeats at B (which did not grant its lease); "silent" says nothing.
        let beats = {
            let b = Arc::clone(&b);
            tokio::spawn(async move {
                loop {
                    b.heartbeat("kept".into(), None).await.expect("heartbeat");
                    tokio::time::sleep(Duration::from_millis(400)).await;
                }
            })
        };
        let gone = vec![addr(7102)];
        assert!(
            eventually(Duration::from_secs(6), || addrs(&pool_a) == gone
                && addrs(&pool_b) == gone)
            .await,
            "silent member still there: A {:?} B {:?}",
            addrs(&pool_a),
            addrs(&pool_b)
        );
        let took = granted.elapsed();
        assert!(
            took >= Duration::from_millis(1900),
            "left after {took:?}, before its TTL"
        );
        // Well past its TTL, the heartbeated member is still in both pools.
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(addrs(&pool_a), gone);
        assert_eq!(addrs(&pool_b), gone);
        let kept = b.list();
        assert_eq!(kept.len(), 1);
        assert!(
            kept[0].ttl_left.is_some(),
            "B renewed the lease, so it knows"
        );
        beats.abort();
        assert_eq!(
            a.heartbeat("silent".into(), None).await.unwrap_err(),
            MemberError::NotFound {
                id: "silent".into()
            }
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_etcd_is_away_the_pools_keep_their_members_and_writes_are_refused() {
    bounded(40, async {
        let mut etcd = Etcd::start().await;
        let (pool_a, pool_b) = (pool(&[]), pool(&[]));
        let a = start(&etcd, &pool_a);
        let b = start(&etcd, &pool_b);
        assert!(connected(&a).await && connected(&b).await);
        a.register("m1".into(), reg(7201, None)).await.unwrap();
        a.register("m2".into(), reg(7202, None)).await.unwrap();
        let two = sorted(vec![addr(7201), addr(7202)]);
        assert!(eventually(SOON, || addrs(&pool_b) == two).await);
        let ep = pool_b.find(addr(7201)).unwrap();

        etcd.kill();
        assert!(
            eventually(SOON, || !a.status().connected && !b.status().connected).await,
            "status says disconnected"
        );
        let s = b.status();
        assert!(s.last_error.is_some());
        assert_eq!(s.members, 2);
        assert_eq!(addrs(&pool_a), two, "fail static");
        assert_eq!(addrs(&pool_b), two, "fail static");
        let e = a.register("m3".into(), reg(7203, None)).await.unwrap_err();
        assert!(matches!(e, MemberError::Unavailable(_)), "{e:?}");
        assert!(matches!(
            b.heartbeat("m1".into(), None).await.unwrap_err(),
            MemberError::Unavailable(_)
        ));
        assert!(matches!(
            b.drain("m1".into()).await.unwrap_err(),
            MemberError::Unavailable(_)
        ));
        assert_eq!(addrs(&pool_a), two, "nothing applied");
        assert_eq!(a.list().len(), 2);

        etcd.restart().await;
        assert!(connected(&a).await && connected(&b).await, "reconnected");
        assert!(Arc::ptr_eq(&pool_b.find(addr(7201)).unwrap(), &ep));
        a.register("m3".into(), reg(7203, None)).await.unwrap();
        let three = sorted(vec![addr(7201), addr(7202), addr(7203)]);
        assert!(eventually(SOON, || addrs(&pool_b) == three).await);
        b.drain("m2".into()).await.unwrap();
        let two = sorted(vec![addr(7201), addr(7203)]);
        assert!(eventually(SOON, || addrs(&pool_a) == two && addrs(&pool_b) == two).await);
        assert_eq!(
            a.status().relists,
            0,
            "resumed the watch, no second listing"
        );
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_answered_after_an_outage_brings_the_watch_back_before_its_back_off_ends() {
    bounded(40, async {
        let mut etcd = Etcd::start().await;
        let pool_a = pool(&[]);
        // A back-off of 20 s at once: without the wake-up, the watcher would sleep 10 to
        // 20 s after its first failure, long after etcd and the write are back.
        let a = EtcdMembers::start_with(
            vec![etcd.url()],
            PREFIX.to_string(),
            Arc::clone(&pool_a),
            EtcdOptions {
                backoff_min: Duration::from_secs(20),
                backoff_max: Duration::from_secs(20),
                ..options()
            },
        );
        assert!(connected(&a).await);
        etcd.kill();
        assert!(eventually(SOON, || !a.status().connected).await);
        etcd.restart().await;
        let written = std::time::Instant::now();
        // The first write may meet etcd still electing itself leader.
        let mut registered = false;
        while !registered && written.elapsed() < SOON {
            registered = a.register("m1".into(), reg(7301, None)).await.is_ok();
        }
        assert!(registered, "etcd took no write after it came back");
        assert!(
            eventually(Duration::from_secs(3), || addrs(&pool_a)
                == vec![addr(7301)])
            .await,
            "the watcher slept on after its own write was answered: {:?}",
            a.status()
        );
        assert!(a.status().connected);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_compaction_the_watcher_lists_again_and_applies_only_the_difference() {
    bounded(40, async {
        let mut etcd = Etcd::start().await;
        let pool_a = pool(&[]);
        let a = start(&etcd, &pool_a);
        assert!(connected(&a).await);
        a.register("stay".into(), reg(7301, None)).await.unwrap();
        a.register("go".into(), reg(7302, None)).await.unwrap();
        let ep = pool_a.find(addr(7301)).unwrap();
        let held = pick(&ep);
        let seen = a.status().revision;

        // etcd goes away from A's port; the same data is served on another port, where
        // members change and history is compacted before A can watch again.
        etcd.kill();
        assert!(eventually(SOON, || !a.status().connected).await);
        let other_port = free_port();
        etcd.spawn_on(other_port);
        etcd.wait_ready(other_port).await;
        let mut c = client_on(other_port).await;
        c.delete(a.key_of("go"), None).await.unwrap();
        let put = c.put(a.key_of("new"), value(7303), None).await.unwrap();
        let rev = put.header().unwrap().revision();
        assert!(rev >= seen + 2);
        c.compact(rev, None).await.unwrap();
        drop(c);
        etcd.kill();
        assert_eq!(addrs(&pool_a), sorted(vec![addr(7301), addr(7302)]));

        etcd.restart().await;
        let want = sorted(vec![addr(7301), addr(7303)]);
        assert!(
            eventually(Duration::from_secs(5), || addrs(&pool_a) == want).await,
            "pool {:?}",
            addrs(&pool_a)
        );
        let s = a.status();
        assert_eq!(s.relists, 1, "listed again after the compaction");
        assert!(s.revision >= rev);
        let now = pool_a.find(addr(7301)).unwrap();
        assert!(
            Arc::ptr_eq(&now, &ep),
            "the member that stayed kept its endpoint"
        );
        assert_eq!(now.in_flight(), 1, "and its request in flight");
        drop(held);

        // And the watch goes on from the listing.
        a.register("later".into(), reg(7304, None)).await.unwrap();
        let mut c = etcd.client().await;
        c.delete(a.key_of("new"), None).await.unwrap();
        let want = sorted(vec![addr(7301), addr(7304)]);
        assert!(eventually(SOON, || addrs(&pool_a) == want).await);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_that_are_not_members_are_skipped_and_the_others_applied() {
    bounded(30, async {
        let etcd = Etcd::start().await;
        let mut c = etcd.client().await;
        let members = format!("{PREFIX}/members/");
        c.put(format!("{members}junk"), "not json", None)
            .await
            .unwrap();
        c.put(
            format!("{members}badaddr"),
            r#"{"address":"x","addr":"nowhere","weight":1}"#,
            None,
        )
        .await
        .unwrap();
        c.put(
            format!("{members}zeroweight"),
            r#"{"address":"127.0.0.1:7409","addr":"127.0.0.1:7409","weight":0}"#,
            None,
        )
        .await
        .unwrap();
        c.put(format!("{members}bad/id"), value(7408), None)
            .await
            .unwrap();
        c.put(format!("{members}ok"), value(7401), None)
            .await
            .unwrap();

        let pool_a = pool(&[]);
        let a = start(&etcd, &pool_a);
        assert!(connected(&a).await);
        assert!(eventually(SOON, || addrs(&pool_a) == [addr(7401)]).await);
        assert_eq!(a.status().members, 1);

        // The same through the watch.
        c.put(format!("{members}junk2"), "{", None).await.unwrap();
        c.put(format!("{members}ok2"), value(7402), None)
            .await
            .unwrap();
        let want = sorted(vec![addr(7401), addr(7402)]);
        assert!(eventually(SOON, || addrs(&pool_a) == want).await);
        let ids: Vec<String> = a.list().into_iter().map(|m| m.id).collect();
        assert_eq!(ids, ["ok", "ok2"]);
        // A heartbeat or a drain of a bad key is refused as not a member.
        assert_eq!(
            a.heartbeat("junk".into(), None).await.unwrap_err(),
            MemberError::NotFound { id: "junk".into() }
        );
        // Registering over a key that is not a member replaces it.
        let done = a.register("junk".into(), reg(7403, None)).await.unwrap();
        assert!(done.created);
        let want = sorted(vec![addr(7401), addr(7402), addr(7403)]);
        assert_eq!(addrs(&pool_a), want);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_change_nothing() {
    bounded(30, async {
        let etcd = Etcd::start().await;
        let static_addr = addr(7500);
        let pool_a = pool(&[static_addr]);
        let a = start(&etcd, &pool_a);
        assert!(connected(&a).await);
        a.register("a".into(), reg(7501, None)).await.unwrap();
        a.register("z".into(), reg(7509, None)).await.unwrap();
        let mut c = etcd.client().await;
        let before_value = c.get(a.key_of("a"), None).await.unwrap().kvs()[0]
            .value()
            .to_vec();
        let want = sorted(vec![static_addr, addr(7501), addr(7509)]);
        assert_eq!(addrs(&pool_a), want);

        let with = |port: u16, f: &dyn Fn(&mut Registration)| {
            let mut r = reg(port, Some(5));
            f(&mut r);
            r
        };
        let cases: Vec<(&str, Registration, MemberError)> = vec![
            (
                "bad/id",
                reg(7502, Some(5)),
                MemberError::InvalidId("bad/id".into()),
            ),
            (
                "b",
                with(7502, &|r| r.ttl = Some(Duration::from_millis(500))),
                MemberError::InvalidTtl(Duration::from_millis(500)),
            ),
            (
                "b",
                with(7502, &|r| r.weight = 0),
                MemberError::InvalidWeight(0),
            ),
            (
                "a",
                reg(7502, Some(5)),
                MemberError::IdTaken {
                    id: "a".into(),
                    addr: addr(7501),
                },
            ),
            (
                "a",
                reg(7509, Some(5)),
                MemberError::IdTaken {
                    id: "a".into(),
                    addr: addr(7501),
                },
            ),
            (
                "b",
                reg(7501, Some(5)),
                MemberError::AddressTaken {
                    addr: addr(7501),
                    by: "member \"a\"".into(),
                },
            ),
            (
                "c",
                reg(7500, Some(5)),
                MemberError::AddressTaken {
                    addr: static_addr,
                    by: "a static backend of balancer \"web\"".into(),
                },
            ),
        ];
        for (id, r, want_err) in cases {
            let e = a.register(id.into(), r).await.unwrap_err();
            assert_eq!(e, want_err, "register {id}");
        }
        assert!(matches!(
            a.register(
                "b".into(),
                with(7502, &|r| {
                    r.meta = (0..40).map(|i| (format!("k{i}"), "v".into())).collect();
                })
            )
            .await
            .unwrap_err(),
            MemberError::InvalidMeta(_)
        ));
        assert!(matches!(
            a.heartbeat("a".into(), Some(1.5)).await.unwrap_err(),
            MemberError::InvalidLoad(_)
        ));
        assert_eq!(
            a.heartbeat("nobody".into(), None).await.unwrap_err(),
            MemberError::NotFound {
                id: "nobody".into()
            }
        );
        assert_eq!(
            a.drain("nobody".into()).await.unwrap_err(),
            MemberError::NotFound {
                id: "nobody".into()
            }
        );

        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(addrs(&pool_a), want, "the pool did not change");
        assert_eq!(
            keys(&mut c).await,
            [a.key_of("a"), a.key_of("z")],
            "etcd did not change"
        );
        let after_value = c.get(a.key_of("a"), None).await.unwrap().kvs()[0]
            .value()
            .to_vec();
        assert_eq!(before_value, after_value);
        assert!(
            c.leases().await.unwrap().leases().is_empty(),
            "no lease granted for a refused registration"
        );
        assert_eq!(a.list().len(), 2);
    })
    .await;
}

/// Registrations racing through two balancers: one address under several ids at once
/// goes to exactly one of them, and the others are told who holds it; one id sent
/// several times at once is registered once. Before, each registration read etcd, saw
/// the address free, and wrote its own key: 3 of 6 ids ended on one address, and
/// repeats of one registration were refused as "membership store unavailable".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_registrations_give_an_address_to_one_id() {
    bounded(60, async {
        let etcd = Etcd::start().await;
        let (pool_a, pool_b) = (pool(&[]), pool(&[]));
        let a = start(&etcd, &pool_a);
        let b = start(&etcd, &pool_b);
        assert!(connected(&a).await && connected(&b).await);
        let mut c = etcd.client().await;
        for round in 0..5u16 {
            let port = 7600 + round;
            let ttl = (round % 2 == 0).then_some(30);
            let ids = (0..8).map(|i| (format!("r{round}-{i}"), port)).collect();
            let results = register_at_once([&a, &b], ids, ttl).await;
            let won: Vec<_> = results.iter().filter(|r| r.is_ok()).collect();
            assert_eq!(won.len(), 1, "round {round}: {results:?}");
            for r in &results {
                if let Err(e) = r {
                    assert!(
                        matches!(e, MemberError::AddressTaken { addr, .. } if *addr == self::addr(port)),
                        "round {round}: {e}"
                    );
                }
            }
            let holders = keys(&mut c).await.len();
            assert_eq!(holders, usize::from(round) + 1, "round {round}: one key per address");

            // The same registration, sent 6 times at once through both balancers.
            let id = format!("same-{round}");
            let port = 7700 + round;
            let ids = (0..6).map(|_| (id.clone(), port)).collect();
            let results = register_at_once([&a, &b], ids, ttl).await;
            assert!(results.iter().all(|r| r.is_ok()), "round {round}: {results:?}");
            assert_eq!(
                results.iter().filter(|r| r.as_ref().unwrap().created).count(),
                1,
                "round {round}: created once"
            );
            a.drain(id).await.unwrap();
        }
        let want: Vec<_> = (0..5).map(|r| addr(7600 + r)).collect();
        assert!(eventually(SOON, || addrs(&pool_a) == want && addrs(&pool_b) == want).await);
    })
    .await;
}

/// Registers each `(id, port)` at once, alternating between the balancers, and
/// returns the answers in order.
async fn register_at_once(
    stores: [&Arc<EtcdMembers>; 2],
    ids: Vec<(String, u16)>,
    ttl: Option<u64>,
) -> Vec<Result<drover_registry::Registered, MemberError>> {
    let tasks: Vec<_> = ids
        .into_iter()
        .enumerate()
        .map(|(i, (id, port))| {
            let store = Arc::clone(stores[i % 2]);
            tokio::spawn(async move { store.register(id, reg(port, ttl)).await })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

/// A balancer with nothing to write stays connected to a healthy etcd. Before, its
/// HTTP/2 pings came every 2 s, oftener than etcd takes them (5 s by default): etcd
/// closed the connection about every 8 s, and each time drover logged "etcd
/// unreachable" and listed the prefix again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_watch_stays_connected_to_a_healthy_etcd() {
    bounded(40, async {
        let etcd = Etcd::start().await;
        let pool_a = pool(&[]);
        let a = start(&etcd, &pool_a);
        assert!(connected(&a).await);
        let since = a.status().since;
        let idle = std::time::Instant::now();
        while idle.elapsed() < Duration::from_secs(20) {
            let status = a.status();
            assert!(
                status.connected && status.since == since,
                "cut while idle after {:?}: {status:?}",
                idle.elapsed()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starting_while_etcd_is_unreachable_neither_fails_nor_blocks() {
    bounded(30, async {
        let port = free_port();
        let pool_a = pool(&[]);
        let started = std::time::Instant::now();
        let a = start_at(port, &pool_a);
        assert!(
            started.elapsed() < Duration::from_millis(100),
            "start does not wait"
        );
        assert!(eventually(SOON, || a.status().last_error.is_some()).await);
        assert!(!a.status().connected);
        let e = a.register("m".into(), reg(7601, None)).await.unwrap_err();
        assert!(matches!(e, MemberError::Unavailable(_)), "{e:?}");
        assert!(a.list().is_empty() && addrs(&pool_a).is_empty());

        // etcd appears: the background task connects and the view follows it.
        let etcd = Etcd::start_on(port).await;
        let mut c = etcd.client().await;
        c.put(a.key_of("m0"), value(7600), None).await.unwrap();
        assert!(connected(&a).await);
        assert!(eventually(SOON, || addrs(&pool_a) == [addr(7600)]).await);
        a.register("m".into(), reg(7601, None)).await.unwrap();
        assert_eq!(addrs(&pool_a), sorted(vec![addr(7600), addr(7601)]));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_whose_revision_went_back_is_listed_again() {
    bounded(30, async {
        let mut etcd = Etcd::start().await;
        let pool_a = pool(&[]);
        let a = start(&etcd, &pool_a);
        assert!(connected(&a).await);
        for (i, port) in [7701, 7702, 7703].into_iter().enumerate() {
            a.register(format!("m{i}"), reg(port, None)).await.unwrap();
        }
        assert_eq!(addrs(&pool_a).len(), 3);

        // The same address, a new cluster with none of the old data (revision 1).
        etcd.kill();
        assert!(eventually(SOON, || !a.status().connected).await);
        std::fs::remove_dir_all(etcd.dir.join("data")).unwrap();
        etcd.restart().await;
        assert!(connected(&a).await);
        let mut c = etcd.client().await;
        c.put(a.key_of("fresh"), value(7704), None).await.unwrap();
        assert!(
            eventually(SOON, || addrs(&pool_a) == [addr(7704)]).await,
            "pool {:?}",
            addrs(&pool_a)
        );
        assert_eq!(a.status().relists, 1);
    })
    .await;
}

/// etcd with authentication on (`etcdctl auth enable`): a balancer that logs in as a
/// user whose role may read and write the prefix registers and watches members; one
/// with a wrong password says so in its status, and its registration is refused with
/// nothing written; a login token that lapsed (etcd's `--auth-token-ttl`) is renewed by
/// logging in again, and the operation that met it goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_a_user_logs_in_a_wrong_password_is_refused_and_a_lapsed_token_renewed() {
    bounded(60, async {
        let etcd = Etcd::start_with(&["--auth-token-ttl", "1"]).await;
        let mut root = etcd.client().await;
        root.user_add("root", "root-password", None).await.unwrap();
        root.user_grant_role("root", "root").await.unwrap();
        root.role_add("pool").await.unwrap();
        let perm = etcd_client::Permission::read_write(PREFIX).with_prefix();
        root.role_grant_permission("pool", perm).await.unwrap();
        root.user_add("drover", "s3cret", None).await.unwrap();
        root.user_grant_role("drover", "pool").await.unwrap();
        root.auth_enable().await.unwrap();
        let as_user = |password: &'static str| EtcdOptions {
            auth: Some(EtcdAuth {
                user: "drover".into(),
                password: Arc::new(move || Ok(password.to_string())),
            }),
            ..options()
        };
        let url = vec![etcd.url()];
        let (pool_a, pool_b) = (pool(&[]), pool(&[]));
        let a = EtcdMembers::start_with(
            url.clone(),
            PREFIX.into(),
            Arc::clone(&pool_a),
            as_user("s3cret"),
        );
        let wrong = EtcdMembers::start_with(
            url.clone(),
            PREFIX.into(),
            Arc::clone(&pool_b),
            as_user("guess"),
        );
        assert!(connected(&a).await, "{:?}", a.status());
        a.register("be-1".into(), reg(7101, Some(30)))
            .await
            .unwrap();
        assert_eq!(addrs(&pool_a), [addr(7101)]);

        let refused = eventually(SOON, || {
            wrong
                .status()
                .last_error
                .is_some_and(|e| e.contains("authentication failed"))
        })
        .await;
        assert!(refused, "{:?}", wrong.status());
        assert!(!wrong.status().connected);
        let e = wrong
            .register("be-2".into(), reg(7102, Some(30)))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("authentication failed"), "{e}");
        assert!(addrs(&pool_b).is_empty());

        // Unused for longer than its TTL, the token lapses; the next registration meets
        // it, logs in again and goes through.
        tokio::time::sleep(Duration::from_secs(3)).await;
        a.register("be-3".into(), reg(7103, Some(30)))
            .await
            .unwrap();
        assert!(eventually(SOON, || addrs(&pool_a).len() == 2).await);
        let mut logged_in = etcd_client::Client::connect(
            [etcd.url()],
            Some(etcd_client::ConnectOptions::new().with_user("root", "root-password")),
        )
        .await
        .unwrap();
        let mut stored = keys(&mut logged_in).await;
        stored.sort();
        assert_eq!(stored.len(), 2, "{stored:?}");
        assert!(stored.iter().all(|k| !k.ends_with("be-2")), "{stored:?}");
    })
    .await;
}
