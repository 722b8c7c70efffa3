//! The learned limit holds requests in drover only while a backend says its CPU is
//! saturated (`endpoint-load-metrics`), in this process over testkit backends. How
//! `drover run` measures its workers' CPU instead is the `drover` crate's test
//! (crates/drover/tests/saturation.rs).

mod common;

use common::{addrs, backends, proxy_with_pool};
use drover_balance::Strategy;
use drover_testkit::HttpClient;
use std::net::SocketAddr;

/// `n` GETs of `path` at once, each on its own connection; every one must answer 200.
async fn all_at_once(addr: SocketAddr, n: usize, path: &'static str) {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let mut c = HttpClient::connect(addr).await.unwrap();
                c.request("GET", path, &[], None).await.unwrap().status
            })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
}

/// The balancer learns saturation from the backends' own reports
/// (`endpoint-load-metrics`): while they say they are saturated, requests wait in drover
/// for the learned limit; while they say they are not, all go out at once.
#[tokio::test]
async fn backends_that_report_saturation_are_held_back_and_others_are_not() {
    let b = backends(2).await;
    // The pool as `drover proxy` makes it: a learned limit (`--max-conns auto`).
    let d = proxy_with_pool(
        &addrs(&b),
        Strategy::default(),
        |_| {},
        |p| {
            p.adaptive_limit = true;
        },
    );

    // Reporting 30 % busy: 24 slow requests are all at the backends together.
    for be in &b {
        be.set_load_report(Some(0.3));
    }
    all_at_once(d.addr(), 4, "/delay/10").await;
    for be in &b {
        be.reset_stats();
    }
    all_at_once(d.addr(), 24, "/delay/1000").await;
    let peaks: Vec<u64> = b.iter().map(|be| be.max_in_flight()).collect();
    assert_eq!(peaks.iter().sum::<u64>(), 24, "not saturated: {peaks:?}");

    // Reporting 95 % busy: the learned limit (4 at first) holds, the rest wait in drover
    // and are all served.
    for be in &b {
        be.set_load_report(Some(0.95));
    }
    all_at_once(d.addr(), 4, "/delay/10").await;
    for be in &b {
        be.reset_stats();
    }
    all_at_once(d.addr(), 24, "/delay/300").await;
    let peaks: Vec<u64> = b.iter().map(|be| be.max_in_flight()).collect();
    assert!(
        peaks.iter().all(|&p| (1..=4).contains(&p)),
        "saturated: at most the learned limit each, held {peaks:?}"
    );
}
