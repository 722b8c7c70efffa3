//! A request that ends the worker it runs on (an uncaught exception) ends that worker
//! alone, as under Node's cluster module: drover does not retry it on the others. One
//! that hangs its worker hangs that worker alone, and the requests that waited behind
//! it go to another. A request on a worker killed from
//! outside (`kill -9`), or on one that ends itself with status 0 (a recycle), still goes
//! to another. Real `drover up` and real Node workers; restarts and answers are counted,
//! nothing is timed.

mod common;

use common::{liveness_config, restart_records, status, up_serving};
use drover_testkit::{wait_until_async, DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::time::Duration;

/// `drover up` of the liveness fixture, three workers behind one balancer (default
/// retries: 2), with quick health checks so an endless loop is found in about a second.
async fn up_three_workers(tag: &str) -> (DroverProcess, SocketAddr) {
    let tag = format!("ends-workers-{tag}");
    let (d, admin, _) = up_serving(&tag, &liveness_config(3, "")).await;
    (d, admin)
}

/// Waits for `n` restart records, then a while longer: a request retried on another
/// worker would end it within milliseconds.
async fn restarts_after(d: &DroverProcess, admin: SocketAddr, n: usize) -> usize {
    let came = wait_until_async(Duration::from_secs(30), || async {
        restart_records(&status(admin).await).len() >= n
    })
    .await;
    assert!(came, "no {n} restarts\n{}", d.stderr_text());
    tokio::time::sleep(Duration::from_secs(1)).await;
    restart_records(&status(admin).await).len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_that_crashes_its_worker_ends_that_worker_alone() {
    let (d, admin) = up_three_workers("crash").await;
    let addr = d.addr();
    let mut c = HttpClient::connect(addr).await.unwrap();
    let r = c.get("/crash").await;
    assert_eq!(
        (r.status, r.header("drover-error")),
        (502, Some("backend-crashed")),
        "{}\n{}",
        r.text(),
        d.stderr_text()
    );
    // Retried, it would have ended all three (it did: three restarts within 30 ms).
    assert_eq!(
        restarts_after(&d, admin, 1).await,
        1,
        "{:?}\n{}",
        restart_records(&status(admin).await),
        d.stderr_text()
    );
    let mut c = HttpClient::connect(addr).await.unwrap();
    assert_eq!(c.get("/").await.status, 200);
    let s = status(admin).await;
    assert!(
        s.balancers[0].endpoints.iter().all(|e| e.available),
        "{s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_that_hangs_its_worker_hangs_that_worker_alone() {
    // Found hung and killed, the worker fails the request it held longest: the loop's
    // own. Before, it went to the next worker, which hung too: two workers killed,
    // one after the other, for one GET (three, before a request a second worker
    // dropped was its last).
    let (d, admin) = up_three_workers("hang").await;
    a_get_that_hangs_one_worker(&d, admin, "/spin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_that_hangs_its_worker_on_a_kept_connection_hangs_that_worker_alone() {
    // Every worker has answered a request, so the balancer keeps a connection to each
    // and the loop's GET goes out on one, as on any app with traffic. Before, a worker
    // killed with it read as a kept connection closing as the request crossed it (no
    // drop counted), the new connection to the dead worker was refused, and the GET
    // went on to the next: three tries, three workers hung (CI saw it, with a GET that
    // drover took for a hang).
    let (d, admin) = up_three_workers("hang-kept").await;
    for get in one_slow_get_on_each_worker(d.addr(), admin).await {
        assert_eq!(get.await.unwrap().0, 200, "{}", d.stderr_text());
    }
    a_get_that_hangs_one_worker(&d, admin, "/spin").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_that_waited_behind_an_endless_loop_go_to_another_worker() {
    // Round-robin places a GET on the looping worker, behind the loop's own: it did
    // nothing there, is sent to another worker once drover kills this one, and is
    // served; the loop's GET, the one the worker held longest, fails.
    let toml = liveness_config(3, "")
        .replace("threads = 1\n", "threads = 1\nstrategy = \"round-robin\"\n");
    assert!(toml.contains("round-robin"), "{toml}");
    let (d, admin, _) = up_serving("ends-workers-behind-loop", &toml).await;
    let addr = d.addr();
    let spin = tokio::spawn(async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        c.set_timeout(Duration::from_secs(60));
        let r = c.get("/spin").await;
        (r.status, r.header("drover-error").map(str::to_owned))
    });
    let held = wait_until_async(Duration::from_secs(10), || async {
        let s = status(admin).await;
        s.balancers[0].endpoints.iter().any(|e| e.in_flight == 1)
    })
    .await;
    assert!(held, "{:?}", status(admin).await);
    // Three more: one for each worker, the looping one's included.
    let gets = common::gets_at_once(addr, 3, "/wait?ms=50", Duration::from_secs(60));
    let behind = wait_until_async(Duration::from_secs(10), || async {
        let s = status(admin).await;
        s.balancers[0].endpoints.iter().any(|e| e.in_flight == 2)
    })
    .await;
    assert!(behind, "{:?}\n{}", status(admin).await, d.stderr_text());
    for get in gets {
        assert_eq!(get.await.unwrap(), 200, "{}", d.stderr_text());
    }
    assert_eq!(
        spin.await.unwrap(),
        (504, Some("backend-hung".to_owned())),
        "{}",
        d.stderr_text()
    );
    assert_eq!(restarts_after(&d, admin, 1).await, 1, "{}", d.stderr_text());
}

/// GET `path` of three workers fails (`504 backend-hung`) once the worker it hung is
/// killed, and the other two are left alone.
async fn a_get_that_hangs_one_worker(d: &DroverProcess, admin: SocketAddr, path: &str) {
    common::get_fails(d, path, Duration::from_secs(60), (504, "backend-hung")).await;
    assert_eq!(restarts_after(d, admin, 1).await, 1, "{}", d.stderr_text());
}

/// GET `path` of three workers fails (502 `backend-closed`) once it has ended two of
/// them, and the third is left alone.
async fn a_get_that_ends_two_workers(d: &DroverProcess, admin: SocketAddr, path: &str) {
    common::get_fails(d, path, Duration::from_secs(60), (502, "backend-closed")).await;
    assert_eq!(restarts_after(d, admin, 2).await, 2, "{}", d.stderr_text());
}

/// One slow GET on each of the three workers (the balancer places them apart), spawned:
/// each gives its status and the pid that answered.
async fn one_slow_get_on_each_worker(
    addr: SocketAddr,
    admin: SocketAddr,
) -> Vec<tokio::task::JoinHandle<(u16, Option<String>)>> {
    let gets = (0..3)
        .map(|_| {
            tokio::spawn(async move {
                let mut c = HttpClient::connect(addr).await.unwrap();
                c.set_timeout(Duration::from_secs(30));
                let r = c.get("/wait?ms=1500").await;
                (r.status, r.header("x-pid").map(str::to_owned))
            })
        })
        .collect();
    let held = wait_until_async(Duration::from_secs(10), || async {
        let s = status(admin).await;
        s.balancers[0].endpoints.iter().all(|e| e.in_flight == 1)
    })
    .await;
    assert!(held, "{:?}", status(admin).await);
    gets
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_on_a_worker_killed_from_outside_go_to_another() {
    let (d, admin) = up_three_workers("kill").await;
    let addr = d.addr();
    let gets = one_slow_get_on_each_worker(addr, admin).await;
    let victim = status(admin).await.apps[0].workers[1].pid.unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-9", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    for get in gets {
        let (code, pid) = get.await.unwrap();
        assert_eq!(code, 200, "{}", d.stderr_text());
        assert_ne!(pid, Some(victim.to_string()));
    }
    assert_eq!(restarts_after(&d, admin, 1).await, 1, "{}", d.stderr_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_on_a_worker_that_recycles_itself_go_to_another() {
    let (d, admin) = up_three_workers("recycle").await;
    let addr = d.addr();
    let gets = one_slow_get_on_each_worker(addr, admin).await;
    // Answered, then `process.exit(0)`, with another GET in it: under Node cluster and
    // PM2 that GET fails; it was in flight, not the exit's cause (before: 502
    // `backend-crashed`).
    let mut c = HttpClient::connect(addr).await.unwrap();
    let r = c.get("/recycle").await;
    assert_eq!(r.status, 200, "{}", d.stderr_text());
    let recycled = r.header("x-pid").unwrap().to_owned();
    for get in gets {
        let (code, pid) = get.await.unwrap();
        assert_eq!(code, 200, "{}", d.stderr_text());
        assert_ne!(pid, Some(recycled.clone()));
    }
    assert_eq!(restarts_after(&d, admin, 1).await, 1, "{}", d.stderr_text());
    // Its warning reads as text in a file or a pipe: no colour codes (`^[[33m WARN`).
    let log = d.stderr_text();
    assert!(log.contains(" WARN "), "{log}");
    assert!(!log.contains('\x1b'), "{log:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_that_exits_its_worker_with_status_0_ends_a_second_one_at_most() {
    // An exit with status 0 is the app's plan, so what it dropped goes again, once: a
    // `/quit` route ends two workers, not all three.
    let (d, admin) = up_three_workers("quit").await;
    a_get_that_ends_two_workers(&d, admin, "/quit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_that_exits_its_worker_on_a_kept_connection_ends_a_second_one_at_most() {
    // As above, on kept connections (before: all three workers ended).
    let (d, admin) = up_three_workers("quit-kept").await;
    for get in one_slow_get_on_each_worker(d.addr(), admin).await {
        assert_eq!(get.await.unwrap().0, 200, "{}", d.stderr_text());
    }
    a_get_that_ends_two_workers(&d, admin, "/quit").await;
}
