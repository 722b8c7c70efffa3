//! Each strategy's spread, through a real listener and real backends in this process
//! (how `--strategy` and drover.toml reach these options is the `drover` crate's test).

mod common;

use common::{addrs, backends, proxy};
use drover_balance::Strategy;
use drover_proxy::HashKey;
use drover_testkit::{answered_by, Backend, HttpClient};
use std::net::SocketAddr;

fn share(seen: &[String], name: &str) -> usize {
    seen.iter().filter(|s| *s == name).count()
}

/// Runs `n` concurrent `/delay/ms` requests and returns each backend's peak concurrency.
async fn concurrent(addr: SocketAddr, b: &[Backend], n: usize, ms: u64) -> Vec<u64> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        tasks.push(tokio::spawn(async move {
            HttpClient::connect(addr)
                .await
                .unwrap()
                .get(&format!("/delay/{ms}"))
                .await
                .status
        }));
        // Let each request get placed before the next arrives.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    b.iter().map(Backend::max_in_flight).collect()
}

#[tokio::test]
async fn round_robin_alternates() {
    let b = backends(3).await;
    let d = proxy(&addrs(&b), Strategy::RoundRobin, |_| {});
    let seen = answered_by(d.addr(), 90, "/", &[]).await;
    for name in ["b0", "b1", "b2"] {
        assert_eq!(share(&seen, name), 30);
    }
}

#[tokio::test]
async fn random_uses_every_backend() {
    let b = backends(2).await;
    let d = proxy(&addrs(&b), Strategy::Random, |_| {});
    let seen = answered_by(d.addr(), 200, "/", &[]).await;
    assert!(
        (60..=140).contains(&share(&seen, "b0")),
        "{}",
        share(&seen, "b0")
    );
}

#[tokio::test]
async fn least_loaded_strategies_spread_concurrent_work() {
    for strategy in [Strategy::LeastConn, Strategy::P2c, Strategy::PeakEwma] {
        let b = backends(2).await;
        let d = proxy(&addrs(&b), strategy, |_| {});
        let peaks = concurrent(d.addr(), &b, 4, 300).await;
        assert_eq!(
            peaks,
            vec![2, 2],
            "{strategy:?}: four slow requests should split two and two"
        );
    }
}

#[tokio::test]
async fn p2c_sends_less_to_a_backend_that_reports_itself_busy() {
    // (report, range of b0's share of 200 sequential requests)
    for (load, expected) in [(0.8, 40..=90), (3.0, 0..=0)] {
        let b = backends(2).await;
        b[0].set_load_report(Some(load));
        // The library's pool has no concurrency limit, so only the placement decides.
        let d = proxy(&addrs(&b), Strategy::P2c, |_| {});
        // Both answer once (concurrently, so each is picked), and b0's report arrives.
        concurrent(d.addr(), &b, 2, 50).await;
        // One request at a time, so both endpoints are idle at every pick. An idle
        // endpoint's share is its weight / (1 + reported load): at 0.8, b0 gets about
        // 36 %. One that reports saturation (>= 0.9) is not free: it gets nothing while
        // another endpoint is idle. (Busy endpoints are ranked by pending work alone;
        // see `Endpoint::pending_score`.)
        let seen = answered_by(d.addr(), 200, "/", &[]).await;
        let b0 = share(&seen, "b0");
        assert!(expected.contains(&b0), "load {load}: b0 got {b0} of 200");
    }
}

#[tokio::test]
async fn hash_keeps_a_key_on_one_backend() {
    let b = backends(3).await;
    let d = proxy(&addrs(&b), Strategy::Hash, |o| {
        o.hash_key = Some(HashKey::Header("x-user".into()));
    });
    let mut owners = std::collections::HashSet::new();
    for user in 0..30 {
        let user = format!("user-{user}");
        let seen = answered_by(d.addr(), 5, "/", &[("x-user", &user)]).await;
        assert!(seen.iter().all(|s| *s == seen[0]), "{user} moved: {seen:?}");
        owners.insert(seen[0].clone());
    }
    assert_eq!(owners.len(), 3, "30 keys should land on all 3 backends");
}

#[tokio::test]
async fn sticky_cookie_pins_and_falls_back() {
    let b = backends(2).await;
    let d = proxy(&addrs(&b), Strategy::Sticky, |o| {
        o.sticky_cookie = Some("drover_sticky".into());
    });
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let first = c.get("/").await;
    let cookie = first
        .header("set-cookie")
        .expect("sticky sets a cookie")
        .to_owned();
    assert!(cookie.starts_with("drover_sticky=") && cookie.contains("Path=/"));
    let pair = cookie.split(';').next().unwrap().to_owned();
    let owner = first.header("x-backend").unwrap().to_owned();
    for _ in 0..20 {
        let r = c
            .request("GET", "/", &[("Cookie", &pair)], None)
            .await
            .unwrap();
        assert_eq!(r.header("x-backend"), Some(owner.as_str()));
        assert!(
            r.header("set-cookie").is_none(),
            "the cookie is only set when it changes"
        );
    }
    // The pinned backend dies: the client moves and gets a new cookie.
    let idx = if owner == "b0" { 0 } else { 1 };
    b[idx].stop().await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c
        .request("GET", "/", &[("Cookie", &pair)], None)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_ne!(r.header("x-backend"), Some(owner.as_str()));
    assert!(r.header("set-cookie").is_some_and(|c| c != cookie));
}
