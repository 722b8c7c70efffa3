//! A Node worker with no health check (`drover run` without `--health-path`) in an
//! endless loop is found hung by its silent event loop and replaced; one that blocks its
//! loop for seconds at a time, or computes a batch of requests in one turn of it, is
//! busy and kept. Alone in its binary: the loop takes a
//! core for half a minute, which other liveness tests would read as starvation. Restarts
//! and answers are counted; nothing is timed.

mod common;

use common::{admin_addr, bin, restart_records, serving_pids, status, wait_all_serving};
use drover_testkit::{wait_until_async, DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// `drover run -w WORKERS` of the liveness fixture with `flags` and no health check,
/// once every worker serves: drover and its admin address.
async fn run_fixture(workers: usize, flags: &[&str]) -> (DroverProcess, SocketAddr) {
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/liveness/server.js");
    let args = common::run_args(workers, flags, &["node", server.to_str().unwrap()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = DroverProcess::spawn(bin(), &args).await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    (d, admin)
}

/// One test, so that the two never run at once: each keeps a core busy for more than
/// half a minute.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_worker_in_an_endless_loop_is_replaced_without_a_health_check() {
    a_batch_computed_in_one_turn_of_the_loop_is_busy().await;
    an_endless_loop_is_hung().await;
}

/// 40 requests of 1 s of CPU each on connections handed to one worker: its loop takes
/// them in one or a few turns, and answers no ping for longer than the loop watch's 30
/// s. It writes each answer as it is done, so it is busy, not hung (before that was
/// read, it was killed at 31 s of computing, with the 2 requests it still held).
async fn a_batch_computed_in_one_turn_of_the_loop_is_busy() {
    let (d, admin) = run_fixture(1, &["--mode", "handoff"]).await;
    let gets = common::gets_at_once(d.addr(), 40, "/compute?ms=1000", Duration::from_secs(180));
    for get in gets {
        assert_eq!(get.await.unwrap(), 200, "{}", d.stderr_text());
    }
    let records = restart_records(&status(admin).await);
    assert!(records.is_empty(), "{records:?}\n{}", d.stderr_text());
}

async fn an_endless_loop_is_hung() {
    let (d, admin) = run_fixture(2, &[]).await;
    let before = serving_pids(&status(admin).await);

    // Busy: a request that blocks its worker's loop for 3 s, and comes back.
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    c.set_timeout(Duration::from_secs(60));
    let r = c.get("/work?ms=3000").await;
    assert_eq!(r.status, 200, "{}", d.stderr_text());

    // Hung: a loop that never ends. Its GET, the one the worker held longest, fails.
    common::get_fails(&d, "/spin", Duration::from_secs(120), (504, "backend-hung")).await;
    let came = wait_until_async(Duration::from_secs(30), || async {
        !restart_records(&status(admin).await).is_empty()
    })
    .await;
    assert!(came, "{}", d.stderr_text());
    let records = restart_records(&status(admin).await);
    assert_eq!(records.len(), 1, "{records:?}");
    let hung = &records[0];
    let detail = hung.detail.as_deref().unwrap_or_default();
    assert!(
        hung.reason == "health"
            && detail.starts_with("hung: its event loop answered no ping for ")
            && detail.contains("an endless loop?"),
        "{hung:?}"
    );
    assert_eq!(hung.signal_name.as_deref(), Some("SIGKILL"), "{hung:?}");
    // Its warning gives the pid as a number (it read `pid=Some(4242)`).
    let log = d.stderr_text();
    assert!(
        log.contains(&format!("pid={}", hung.pid.unwrap())) && !log.contains("Some("),
        "{log}"
    );
    // The other worker kept its process, and both serve.
    wait_all_serving(&d, admin).await;
    let after = serving_pids(&status(admin).await);
    let other = before.iter().find(|p| **p != hung.pid).unwrap();
    assert!(after.contains(other), "{before:?} {after:?}");
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    assert_eq!(c.get("/").await.status, 200);
}
