//! Issue 11 ("Hardening"), items 4, 7, 8 and 9b: drover's own limits. Its own shortage
//! of descriptors is not a backend's failure and is reported; an admin API off loopback
//! needs a token however drover starts; a healthy pool at its limit never answers
//! `no-healthy-endpoint`.

mod common;

use common::*;
use drover_testkit::HttpClient;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// Descriptors drover may hold in the shortage tests: a dozen for itself (std streams,
/// event loops, the listener), the rest for clients and backends.
const NOFILE: u32 = 64;
/// More client connections than that.
const CLIENTS: usize = 150;

/// What each of `CLIENTS` connections, opened before any sends, got for one GET.
async fn burst_past_the_descriptor_limit(
    d: &drover_testkit::DroverProcess,
) -> BTreeMap<String, usize> {
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let mut c = HttpClient::connect(d.addr()).await.unwrap();
        c.set_timeout(Duration::from_secs(30));
        clients.push(c);
    }
    // drover has accepted all it can: every descriptor it has is taken.
    assert!(
        d.wait_for_line("cannot accept connections", Duration::from_secs(10))
            .await
            .is_some(),
        "no warning that accepts fail for want of descriptors:\n{}",
        d.stderr_text()
    );
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                match c
                    .request("GET", "/", &[("connection", "close")], None)
                    .await
                {
                    Ok(r) => format!("{} {}", r.status, r.header("drover-error").unwrap_or("")),
                    Err(e) => format!("error: {e}"),
                }
            })
        })
        .collect();
    let mut outcomes = BTreeMap::new();
    for t in tasks {
        *outcomes.entry(t.await.unwrap()).or_insert(0) += 1;
    }
    outcomes
}

/// Item 4: with descriptors exhausted, connecting to a backend fails with EMFILE in
/// drover. That used to eject the (healthy) backends: clients got 502 `connect-failed`,
/// then 503 `no-healthy-endpoint` until the ejection ran out. Now the client is told
/// the truth (503 `local-resources`), and every backend keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drovers_own_descriptor_shortage_ejects_no_backend() {
    let b = backends(2).await;
    let d = proxy_with_nofile(NOFILE, &addrs(&b), &[]).await;
    let outcomes = burst_past_the_descriptor_limit(&d).await;
    eprintln!("outcomes of {CLIENTS} requests: {outcomes:?}");
    let truthful = |o: &str| o == "200 " || o == "503 local-resources";
    assert!(
        outcomes.keys().all(|o| truthful(o)),
        "{outcomes:?}\n{}",
        d.stderr_text()
    );
    assert!(
        outcomes.contains_key("503 local-resources"),
        "the burst never ran drover short: {outcomes:?}"
    );
    assert!(
        d.lines_containing("connect failed").is_empty() && d.lines_containing("ejected").is_empty(),
        "a backend was blamed:\n{}",
        d.stderr_text()
    );
    assert!(!d
        .lines_containing("drover is out of resources; not counted against the endpoint")
        .is_empty());

    // The pressure is gone: at once, both backends serve (none was ejected).
    for x in &b {
        x.reset_stats();
    }
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..40 {
        let r = c.get("/").await;
        assert_eq!(r.status, 200, "{:?}", r.header("drover-error"));
    }
    for x in &b {
        assert!(x.hits() > 0, "{} got nothing after the shortage", x.name());
    }
    stops_cleanly(d).await;
}

/// Item 9b: failed accepts (EMFILE) are warned about, at most once a second with the
/// count held back, and drover keeps serving once descriptors come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_accepts_are_warned_about_at_most_once_a_second() {
    let b = backends(1).await;
    let d = proxy_with_nofile(NOFILE, &addrs(&b), &[]).await;
    let started = Instant::now();
    let mut idle = Vec::new();
    for _ in 0..CLIENTS {
        idle.push(HttpClient::connect(d.addr()).await.unwrap());
    }
    assert!(
        d.wait_for_line("cannot accept connections", Duration::from_secs(10))
            .await
            .is_some(),
        "no warning that accepts fail:\n{}",
        d.stderr_text()
    );
    // Keep the shortage up for a while: the accept loop meets EMFILE again every pause.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let warned = d.lines_containing("cannot accept connections");
    let seconds = started.elapsed().as_secs() as usize;
    assert!(
        warned.len() <= seconds + 1,
        "{} warnings in {seconds} s:\n{}",
        warned.len(),
        warned.join("\n")
    );
    assert!(
        warned
            .iter()
            .any(|l| l.contains("held_back") && !l.contains("held_back=0")),
        "the warnings do not count what they held back:\n{}",
        warned.join("\n")
    );
    drop(idle);
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    assert_eq!(c.get("/").await.status, 200);
    stops_cleanly(d).await;
}

/// Item 4, for active health checks: a probe drover cannot make for want of descriptors
/// is neither a pass nor a failure. With `--fall 1` one such probe used to mark the
/// backend down, and `--rise 100` would keep it out for 10 s after the shortage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_drover_cannot_make_mark_no_backend_down() {
    let b = backends(1).await;
    let checks = [
        "--health-tcp",
        "--health-interval",
        "100ms",
        "--fall",
        "1",
        "--rise",
        "100",
    ];
    let d = proxy_with_nofile(NOFILE, &addrs(&b), &checks).await;
    let mut idle = Vec::new();
    for _ in 0..CLIENTS {
        idle.push(HttpClient::connect(d.addr()).await.unwrap());
    }
    assert!(
        d.wait_for_line("health check not run", Duration::from_secs(10))
            .await
            .is_some(),
        "no probe met the shortage:\n{}",
        d.stderr_text()
    );
    drop(idle);
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c.get("/").await;
    assert_eq!(
        r.status,
        200,
        "{:?}\n{}",
        r.header("drover-error"),
        d.stderr_text()
    );
    assert!(
        d.lines_containing("endpoint down").is_empty(),
        "{}",
        d.stderr_text()
    );
    stops_cleanly(d).await;
}
