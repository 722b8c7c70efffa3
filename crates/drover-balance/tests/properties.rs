//! Property tests over seeded random cases: every strategy, many shapes of pool.

use drover_balance::hashing::key_hash;
use drover_balance::strategy::{Maglev, P2c, SmoothWeighted, WeightedRandom};
use drover_balance::{Balancer, Endpoint, EndpointSet, NoPick, Pick, PickContext, Strategy};
use std::sync::Arc;

fn endpoint(i: usize, weight: u32) -> Arc<Endpoint> {
    let addr = format!("10.1.{}.{}:8080", i / 250, i % 250 + 1);
    Arc::new(Endpoint::with_weight(addr.parse().unwrap(), weight))
}

fn pool(weights: &[u32]) -> EndpointSet {
    EndpointSet::new(
        weights
            .iter()
            .enumerate()
            .map(|(i, &w)| endpoint(i, w))
            .collect(),
    )
}

fn at(now: u64) -> PickContext<'static> {
    PickContext {
        now,
        ..Default::default()
    }
}

fn index_of(set: &EndpointSet, p: &Pick) -> usize {
    set.endpoints()
        .iter()
        .position(|e| Arc::ptr_eq(e, p.endpoint()))
        .unwrap()
}

fn shares(b: &dyn Balancer, set: &EndpointSet, picks: usize) -> Vec<f64> {
    let mut n = vec![0usize; set.len()];
    for _ in 0..picks {
        n[index_of(set, &b.pick(set, &at(1)).unwrap())] += 1;
    }
    n.into_iter().map(|c| c as f64 / picks as f64).collect()
}

fn assert_shares(got: &[f64], weights: &[u32], tolerance: f64) {
    let total: u32 = weights.iter().sum();
    for (g, &w) in got.iter().zip(weights) {
        let want = w as f64 / total as f64;
        assert!(
            (g - want).abs() <= tolerance * want,
            "share {g:.4} vs {want:.4} (weights {weights:?})"
        );
    }
}

#[test]
fn weighted_shares_within_one_percent() {
    let weights = [1, 2, 3, 4];
    assert_shares(
        &shares(&SmoothWeighted::new(), &pool(&weights), 100_000),
        &weights,
        0.01,
    );
    let mut rng = fastrand::Rng::with_seed(11);
    for _ in 0..20 {
        let weights: Vec<u32> = (0..rng.usize(1..12)).map(|_| rng.u32(1..20)).collect();
        let got = shares(&SmoothWeighted::new(), &pool(&weights), 50_000);
        assert_shares(&got, &weights, 0.01);
    }
}

#[test]
fn random_shares_follow_weights() {
    fastrand::seed(12);
    let weights = [1, 2, 3, 4];
    // 400k draws: one standard deviation of the smallest share is 0.75 % of it.
    assert_shares(
        &shares(&WeightedRandom::new(), &pool(&weights), 400_000),
        &weights,
        0.04,
    );
}

#[test]
fn round_robin_and_least_conn_share_evenly_among_the_eligible() {
    let mut rng = fastrand::Rng::with_seed(13);
    for _ in 0..30 {
        let n = rng.usize(2..16);
        let set = pool(&vec![1; n]);
        let down: Vec<bool> = (0..n).map(|_| rng.u8(..4) == 0).collect();
        for (e, &d) in set.endpoints().iter().zip(&down) {
            e.set_healthy(!d);
        }
        let up = down.iter().filter(|d| !**d).count();
        if up == 0 {
            continue;
        }
        for s in [
            Strategy::RoundRobin,
            Strategy::LeastConn,
            Strategy::Weighted,
        ] {
            let got = shares(&*s.build(), &set, up * 100);
            for (g, &d) in got.iter().zip(&down) {
                let want = if d { 0.0 } else { 1.0 / up as f64 };
                assert!((g - want).abs() < 1e-9, "{s}: {got:?} down {down:?}");
            }
        }
    }
}

fn maglev_owner(m: &Maglev, set: &EndpointSet, key: u64) -> Arc<Endpoint> {
    let i = m.table(set).lookup(key_hash(&key.to_le_bytes())).unwrap();
    Arc::clone(&set.endpoints()[i])
}

#[test]
fn maglev_removal_moves_about_one_nth_of_the_keys() {
    let mut rng = fastrand::Rng::with_seed(14);
    let keys = 50_000u64;
    for n in [5, 10, 23, 50] {
        let m = Maglev::new();
        let before = pool(&vec![1; n]);
        let gone = rng.usize(..n);
        let mut eps = before.endpoints().to_vec();
        let removed = eps.remove(gone);
        let after = EndpointSet::new(eps);
        let (mut moved, mut moved_needlessly) = (0, 0);
        for k in 0..keys {
            let (a, b) = (maglev_owner(&m, &before, k), maglev_owner(&m, &after, k));
            if !Arc::ptr_eq(&a, &b) {
                moved += 1;
                if !Arc::ptr_eq(&a, &removed) {
                    moved_needlessly += 1;
                }
            }
        }
        let frac = moved as f64 / keys as f64;
        assert!(frac <= 1.2 / n as f64, "n={n}: {frac:.4} moved");
        assert!(frac >= 0.8 / n as f64, "n={n}: {frac:.4} moved");
        // Maglev trades a little disruption for even spread; keep the excess small.
        assert!(
            (moved_needlessly as f64 / keys as f64) < 0.2 / n as f64,
            "n={n}: {moved_needlessly} needless moves"
        );
    }
}

#[test]
fn maglev_addition_moves_about_one_nth_of_the_keys() {
    let keys = 50_000u64;
    for n in [4, 9, 30] {
        let m = Maglev::new();
        let before = pool(&vec![1; n]);
        let mut eps = before.endpoints().to_vec();
        eps.push(endpoint(500, 1));
        let after = EndpointSet::new(eps);
        let moved = (0..keys)
            .filter(|&k| !Arc::ptr_eq(&maglev_owner(&m, &before, k), &maglev_owner(&m, &after, k)))
            .count();
        let frac = moved as f64 / keys as f64;
        assert!(frac <= 1.2 / (n + 1) as f64, "n={n}: {frac:.4} moved");
    }
}

#[test]
fn maglev_spread_is_near_even() {
    for n in [3, 10, 37] {
        let m = Maglev::new();
        let set = pool(&vec![1; n]);
        let mut count = vec![0usize; n];
        let keys = 20_000 * n;
        for k in 0..keys {
            let key = format!("client-{k}");
            let ctx = PickContext {
                hash_key: Some(key.as_bytes()),
                ..at(1)
            };
            count[index_of(&set, &m.pick(&set, &ctx).unwrap())] += 1;
        }
        for c in count {
            let share = c as f64 * n as f64 / keys as f64;
            assert!(
                (share - 1.0).abs() < 0.05,
                "n={n}: relative share {share:.3}"
            );
        }
    }
}

#[test]
fn maglev_retry_goes_elsewhere_and_stays_consistent() {
    let m = Maglev::with_table_size(4099);
    let set = pool(&[1; 6]);
    for k in 0..500 {
        let key = format!("k{k}");
        let first = PickContext {
            hash_key: Some(key.as_bytes()),
            ..at(1)
        };
        let p = m.pick(&set, &first).unwrap();
        let exclude = [Arc::clone(p.endpoint())];
        let retry = PickContext {
            exclude: &exclude,
            ..first
        };
        let r1 = m.pick(&set, &retry).unwrap();
        let r2 = m.pick(&set, &retry).unwrap();
        assert!(!Arc::ptr_eq(r1.endpoint(), p.endpoint()));
        assert!(Arc::ptr_eq(r1.endpoint(), r2.endpoint()));
    }
}

#[test]
fn load_state_survives_a_set_change() {
    let set = pool(&[1, 1, 1]);
    let ctx = PickContext {
        now: 10,
        cost: 5_000_000,
        ..Default::default()
    };
    let held: Vec<Pick> = set.endpoints()[..2]
        .iter()
        .map(|e| Pick::try_new(e, &ctx).unwrap())
        .collect();
    set.endpoints()[0].observe_rtt(10, 7_000_000);
    set.endpoints()[1].report_load(10, 0.8);

    let mut eps = set.endpoints()[..2].to_vec();
    eps.push(endpoint(99, 1));
    let next = EndpointSet::new(eps);
    let (a, b) = (&next.endpoints()[0], &next.endpoints()[1]);
    assert_eq!((a.in_flight(), a.pending_cost()), (1, 5_000_000));
    assert_eq!(a.rtt_estimate(), 7_000_000.0);
    assert_eq!(b.reported_load(11), 0.8);
    // The new snapshot's balancer sees the held work and prefers the newcomer.
    for _ in 0..10 {
        let p = P2c::new().pick(&next, &at(11)).unwrap();
        assert_eq!(index_of(&next, &p), 2);
    }
    drop(held);
    assert_eq!((a.in_flight(), a.pending_cost()), (0, 0));
}

/// Each endpoint's state: 0 ok, 1 down, 2 ejected, 3 excluded, 4 full.
fn random_states(rng: &mut fastrand::Rng, set: &EndpointSet, now: u64) -> (Vec<u8>, Vec<Pick>) {
    let mut holds = Vec::new();
    let states: Vec<u8> = set.endpoints().iter().map(|_| rng.u8(..5)).collect();
    for (e, &s) in set.endpoints().iter().zip(&states) {
        match s {
            1 => e.set_healthy(false),
            2 => e.eject_until(now + 1),
            4 => {
                e.set_max_conns(1);
                holds.push(Pick::try_new(e, &at(now)).unwrap());
            }
            _ => {}
        }
    }
    (states, holds)
}

#[test]
fn every_strategy_picks_only_eligible_endpoints_and_explains_why_not() {
    let mut rng = fastrand::Rng::with_seed(15);
    fastrand::seed(16);
    for case in 0..300 {
        let n = rng.usize(0..40);
        let set = pool(&(0..n).map(|_| rng.u32(1..5)).collect::<Vec<_>>());
        let now = 100;
        let (states, _holds) = random_states(&mut rng, &set, now);
        let exclude: Vec<Arc<Endpoint>> = set
            .endpoints()
            .iter()
            .zip(&states)
            .filter(|(_, &s)| s == 3)
            .map(|(e, _)| Arc::clone(e))
            .collect();
        let pin = set.endpoints().first().map(|e| e.id().to_string());
        let key = format!("key-{case}");
        let ctx = PickContext {
            now,
            exclude: &exclude,
            hash_key: (case % 2 == 0).then_some(key.as_bytes()),
            pinned: pin.as_deref(),
            ..Default::default()
        };
        let expected_err = if states.contains(&4) {
            NoPick::AllBusy
        } else {
            NoPick::NoneAvailable
        };
        for s in Strategy::ALL {
            let b = s.build();
            // A pinned request waits for its endpoint when that one is only full, under
            // any strategy (the pin is the first endpoint); so does a hashed one.
            let may_wait_for_pin = states.first() == Some(&4)
                || (s == Strategy::Hash && ctx.hash_key.is_some() && states.contains(&4));
            for _ in 0..20 {
                match b.pick(&set, &ctx) {
                    Ok(p) => assert_eq!(states[index_of(&set, &p)], 0, "{s} case {case}"),
                    Err(NoPick::AllBusy) if may_wait_for_pin => {}
                    Err(e) => {
                        assert!(
                            !states.contains(&0),
                            "{s} case {case}: {e:?} but {states:?}"
                        );
                        assert_eq!(e, expected_err, "{s} case {case}");
                    }
                }
            }
        }
    }
}

#[test]
fn p2c_sends_less_to_endpoints_holding_costly_work_or_reporting_load() {
    fastrand::seed(17);
    let set = pool(&[1; 8]);
    let costly = PickContext {
        now: 1,
        cost: 50_000_000,
        ..Default::default()
    };
    let _held = Pick::try_new(&set.endpoints()[0], &costly).unwrap();
    set.endpoints()[1].report_load(1, 0.9);
    let got = shares(&P2c::new(), &set, 20_000);
    let even = 1.0 / 8.0;
    assert!(got[0] < 0.2 * even, "{got:?}");
    // It loses every comparison except against endpoint 0: 2/56 of the pairs.
    assert!(got[1] < 0.3 * even, "{got:?}");
    assert!(got[2..].iter().all(|&g| g > even), "{got:?}");
}

/// A closed-form simulation: one endpoint serves 10x slower. Requests arrive every
/// 100 µs and hold their slot for the endpoint's service time; p2c learns the latency
/// and the held work and sends the slow endpoint far less than its 1/5 round-robin share.
#[test]
fn p2c_steers_away_from_a_slow_endpoint() {
    fastrand::seed(18);
    let set = pool(&[1; 5]);
    let service = |i: usize| if i == 0 { 10_000_000 } else { 1_000_000 };
    let b = P2c::new();
    let mut in_flight: Vec<(u64, Pick)> = Vec::new();
    let mut sent = [0usize; 5];
    let total = 20_000;
    for step in 0..total {
        let now = 1 + step as u64 * 100_000;
        in_flight.retain(|(done, p)| {
            if *done <= now {
                p.observe(*done);
                false
            } else {
                true
            }
        });
        let p = b.pick(&set, &at(now)).unwrap();
        let i = index_of(&set, &p);
        sent[i] += 1;
        in_flight.push((now + service(i), p));
    }
    let slow = sent[0] as f64 / total as f64;
    assert!(slow < 0.08, "slow endpoint got {slow:.3} of {sent:?}");
}

#[test]
fn sticky_follows_its_endpoint_and_falls_back_when_it_is_down() {
    fastrand::seed(19);
    for n in [2, 5, 60] {
        let set = pool(&vec![1; n]);
        let st = Strategy::Sticky.build();
        let target = &set.endpoints()[n - 1];
        let id = target.id().to_string();
        let ctx = PickContext {
            pinned: Some(&id),
            ..at(10)
        };
        assert!(Arc::ptr_eq(st.pick(&set, &ctx).unwrap().endpoint(), target));
        for mut_state in 0..2 {
            match mut_state {
                0 => target.set_healthy(false),
                _ => {
                    target.set_healthy(true);
                    target.eject_until(11);
                }
            }
            for _ in 0..20 {
                assert!(!Arc::ptr_eq(
                    st.pick(&set, &ctx).unwrap().endpoint(),
                    target
                ));
            }
        }
        let later = PickContext { now: 11, ..ctx };
        assert!(Arc::ptr_eq(
            st.pick(&set, &later).unwrap().endpoint(),
            target
        ));
    }
}

#[test]
fn concurrent_picks_never_exceed_max_conns() {
    let set = pool(&[1, 2, 3]);
    for e in set.endpoints() {
        e.set_max_conns(2);
    }
    for s in Strategy::ALL {
        let b = s.build();
        std::thread::scope(|scope| {
            for t in 0..4 {
                let (b, set) = (&b, &set);
                scope.spawn(move || {
                    let key = format!("t{t}");
                    let ctx = PickContext {
                        now: 1,
                        hash_key: Some(key.as_bytes()),
                        ..Default::default()
                    };
                    for _ in 0..5_000 {
                        match b.pick(set, &ctx) {
                            Ok(p) => assert!(p.endpoint().in_flight() <= 2, "{s}"),
                            Err(e) => assert_eq!(e, NoPick::AllBusy, "{s}"),
                        }
                    }
                });
            }
        });
        assert!(set.endpoints().iter().all(|e| e.in_flight() == 0), "{s}");
    }
}
