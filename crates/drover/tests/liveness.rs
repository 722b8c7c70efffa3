//! Busy is not hung, through the real binary and real Node workers: a burst of CPU-heavy
//! requests with the README's health settings restarts nothing and fails nothing; a
//! worker in an endless loop, or stopped with SIGSTOP, is killed and replaced while the
//! other serves; two workers failing their checks at once are restarted one at a time.
//! These count restarts and failed requests; nothing here is timed.

mod common;

use common::{admin_addr, bin, pi_server, status, temp_dir};
use drover_admin::{RestartRow, Status};
use drover_testkit::{wait_until_async, DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

fn fixture() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/liveness/server.js")
        .display()
        .to_string()
}

fn restarts(s: &Status) -> Vec<RestartRow> {
    s.apps.iter().flat_map(|a| a.restarts.clone()).collect()
}

/// The pids of the app's serving workers, by worker id (`None`: not serving).
fn serving_pids(s: &Status) -> Vec<Option<u32>> {
    s.apps[0]
        .workers
        .iter()
        .map(|w| {
            matches!(w.state.as_str(), "ready" | "busy")
                .then_some(w.pid)
                .flatten()
        })
        .collect()
}

/// `n` requests for `path` at once, each on its own connection; the statuses (0 for a
/// request that got no answer), in no order.
async fn burst(addr: SocketAddr, n: usize, path: &'static str) -> Vec<u16> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let Ok(mut c) = HttpClient::connect(addr).await else {
                    return 0;
                };
                c.set_timeout(Duration::from_secs(120));
                c.request("GET", path, &[], None)
                    .await
                    .map_or(0, |r| r.status)
            })
        })
        .collect();
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap());
    }
    statuses
}

/// The README's settings: `drover run -w 2 --health-path /health` of the pi server
/// (its checks every 2 s, 1 s to answer, 3 failures in a row), and 100 requests of 10⁷
/// Monte-Carlo points each at once, twice, as `ab -c 100` on a CPU loop sends them.
/// Each worker holds seconds of queued work, so its health route waits behind that
/// work and gets no answer; it completes request after request meanwhile. Both workers
/// used to be restarted at once, and 108 of 200 requests failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_cpu_heavy_requests_restarts_no_worker_and_fails_no_request() {
    let pi = pi_server();
    let d = DroverProcess::spawn(
        bin(),
        &[
            "run",
            "-w",
            "2",
            "-l",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--health-path",
            "/health",
            "--",
            "node",
            &pi,
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    let pids = wait_serving(&d, admin).await;
    for round in 0..2 {
        let statuses = burst(d.addr(), 100, "/pi?iterations=10000000").await;
        let failed: Vec<_> = statuses.iter().filter(|&&s| s != 200).collect();
        assert!(
            failed.is_empty(),
            "round {round}: {} of 100 failed: {failed:?}\n{}",
            failed.len(),
            d.stderr_text()
        );
    }
    let s = status(admin).await;
    assert_eq!(restarts(&s), [], "{}", d.stderr_text());
    assert_eq!(serving_pids(&s), pids, "the same processes serve");
}

/// `drover up` of the liveness fixture, two workers, with quick health checks (every
/// 300 ms, 300 ms to answer, 2 failures in a row) so a hang is found in about a second.
async fn up_two_workers(sick_file: &Path) -> (DroverProcess, SocketAddr) {
    let dir = temp_dir(&format!(
        "liveness-{}",
        sick_file.file_name().unwrap().to_string_lossy()
    ));
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[app]]\nname = \"web\"\ncommand = [\"node\", \"{}\"]\nworkers = 2\n\
         env = {{ SICK_FILE = \"{}\" }}\n\
         health = {{ path = \"/health\", interval = \"300ms\", timeout = \"300ms\", fall = 2 }}\n\
         [[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n",
        fixture(),
        sick_file.display()
    );
    let file = dir.join("drover.toml");
    std::fs::write(&file, toml).unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "-c", file.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    wait_serving(&d, admin).await;
    (d, admin)
}

/// Waits until every worker serves; their pids.
async fn wait_serving(d: &DroverProcess, admin: SocketAddr) -> Vec<Option<u32>> {
    let ready = wait_until_async(Duration::from_secs(20), || async {
        serving_pids(&status(admin).await)
            .iter()
            .all(Option::is_some)
    })
    .await;
    assert!(ready, "{}", d.stderr_text());
    serving_pids(&status(admin).await)
}

fn no_sick_file(tag: &str) -> PathBuf {
    temp_dir(&format!("liveness-sick-{tag}")).join("sick")
}

/// Waits for `n` restart records; panics with drover's log if they do not come.
async fn wait_restarts(d: &DroverProcess, admin: SocketAddr, n: usize) -> Vec<RestartRow> {
    let came = wait_until_async(Duration::from_secs(30), || async {
        restarts(&status(admin).await).len() >= n
    })
    .await;
    assert!(came, "no {n} restarts\n{}", d.stderr_text());
    restarts(&status(admin).await)
}

/// Waits until both workers serve again, the one that was `gone` with a new process.
async fn wait_replaced(d: &DroverProcess, admin: SocketAddr, gone: u32) -> Vec<Option<u32>> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let pids = serving_pids(&status(admin).await);
        if pids.iter().all(|p| p.is_some_and(|p| p != gone)) {
            return pids;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{pids:?}\n{}",
            d.stderr_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A POST that sends one worker into an endless loop. Its connection is answered with
/// a 502 once the worker is killed; a POST is not retried, so the loop does not move to
/// the other worker.
async fn spin_one_worker(addr: SocketAddr) -> tokio::task::JoinHandle<u16> {
    tokio::spawn(async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        c.set_timeout(Duration::from_secs(60));
        c.request("POST", "/spin", &[], Some(b""))
            .await
            .map_or(0, |r| r.status)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_in_an_endless_loop_is_killed_and_replaced_while_the_other_serves() {
    let (d, admin) = up_two_workers(&no_sick_file("spin")).await;
    let before = serving_pids(&status(admin).await);
    let stop = Arc::new(AtomicBool::new(false));
    let load = common::steady_load(d.addr(), 2, "/", Arc::clone(&stop));

    let spin = spin_one_worker(d.addr()).await;
    let records = wait_restarts(&d, admin, 1).await;
    let hung = &records[0];
    assert_eq!(hung.reason, "health", "{hung:?}");
    let detail = hung.detail.as_deref().unwrap_or_default();
    assert!(
        detail.starts_with("hung: no answer to 2 health checks in a row")
            && detail.contains("an endless loop?"),
        "{detail}"
    );
    // Killed at once, not asked to stop: a spinning process cannot act on a SIGTERM.
    assert_eq!(hung.signal_name.as_deref(), Some("SIGKILL"), "{hung:?}");
    let after = wait_replaced(&d, admin, hung.pid.unwrap()).await;
    assert!(before.contains(&hung.pid), "{before:?} {hung:?}");

    // Only the request that was on the hung worker failed; the rest of the load, also
    // what was bound to the hung worker before it was found, was served.
    assert_ne!(spin.await.unwrap(), 200);
    common::assert_load_never_failed(&stop, load, 20, "while a worker hung").await;
    let s = status(admin).await;
    assert_eq!(restarts(&s).len(), 1, "{:?}", restarts(&s));
    let other = before.iter().find(|p| **p != hung.pid).unwrap();
    assert!(after.contains(other), "the other worker kept its process");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_is_killed_and_replaced_while_the_other_serves() {
    let (d, admin) = up_two_workers(&no_sick_file("stop")).await;
    let before = serving_pids(&status(admin).await);
    let stop = Arc::new(AtomicBool::new(false));
    let load = common::steady_load(d.addr(), 2, "/", Arc::clone(&stop));

    let victim = before[0].unwrap();
    let stopped = std::process::Command::new("kill")
        .args(["-STOP", &victim.to_string()])
        .status()
        .unwrap();
    assert!(stopped.success());
    let records = wait_restarts(&d, admin, 1).await;
    let hung = &records[0];
    assert_eq!((hung.reason.as_str(), hung.pid), ("health", Some(victim)));
    let detail = hung.detail.as_deref().unwrap_or_default();
    assert!(detail.contains("the process is stopped"), "{detail}");
    assert_eq!(hung.signal_name.as_deref(), Some("SIGKILL"), "{hung:?}");
    let after = wait_replaced(&d, admin, victim).await;
    assert_eq!(after[1], before[1], "the other worker kept its process");
    assert!(
        !Path::new(&format!("/proc/{victim}")).exists(),
        "the stopped process is gone"
    );
    // Requests bound to the stopped worker got no answer until it was killed; they are
    // GETs, so they were retried on the other worker.
    common::assert_load_never_failed(&stop, load, 20, "while a worker was stopped").await;
}

/// Both workers' health routes say 503 (a shared dependency is down, say). One worker
/// is restarted; its replacement cannot become ready while the route says 503, and the
/// other worker is not touched meanwhile: it keeps serving. Once the route recovers,
/// the replacement joins and nothing else restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_failing_their_checks_at_once_are_restarted_one_at_a_time() {
    let sick = no_sick_file("both");
    let (d, admin) = up_two_workers(&sick).await;
    let before = serving_pids(&status(admin).await);
    let stop = Arc::new(AtomicBool::new(false));
    let load = common::steady_load(d.addr(), 2, "/", Arc::clone(&stop));

    std::fs::write(&sick, "").unwrap();
    let first = wait_restarts(&d, admin, 1).await.remove(0);
    assert_eq!(first.reason, "health", "{first:?}");
    assert!(
        first
            .detail
            .as_deref()
            .unwrap_or_default()
            .starts_with("failed 2 health checks in a row (last: status 503)"),
        "{first:?}"
    );
    // Many check intervals later, the other worker still serves with its process.
    let other = *before.iter().find(|p| **p != first.pid).unwrap();
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let s = status(admin).await;
        assert!(
            serving_pids(&s).contains(&other),
            "the other worker was taken away too: {:?}\n{}",
            s.apps[0].workers,
            d.stderr_text()
        );
        assert!(restarts(&s).iter().all(|r| r.pid == first.pid));
    }

    std::fs::remove_file(&sick).unwrap();
    let after = wait_replaced(&d, admin, first.pid.unwrap()).await;
    assert!(after.contains(&other), "{after:?}");
    common::assert_load_never_failed(&stop, load, 20, "while both workers were sick").await;
    let health: Vec<_> = restarts(&status(admin).await)
        .into_iter()
        .filter(|r| r.reason == "health")
        .collect();
    assert_eq!(health.len(), 1, "{health:?}");
}
