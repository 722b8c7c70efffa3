//! A cold start, through the real binary and real Node workers that take 1.5 s to
//! listen: requests sent as soon as drover listens wait in its queue for the first
//! worker instead of getting `503 no-healthy-endpoint`, and so do requests sent while
//! every worker restarts. The wait is bounded: workers that never become ready leave
//! the requests a 503 after the queue timeout. These count answers; nothing is timed.

mod common;

use common::{admin_addr, bin, ctl, status};
use drover_testkit::{wait_until_async, DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

/// The fixture, started with `delays` (ms, one for all workers or one per worker,
/// comma-separated) before it listens.
fn slow_starter(delays: &str) -> [String; 2] {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cold_start/server.js")
        .display()
        .to_string();
    [script, delays.to_owned()]
}

/// `drover run -w 2 EXTRA -- node server.js DELAYS`, returned once drover's balancer
/// listens (its workers are still starting then).
async fn run(delays: &str, extra: &[&str]) -> DroverProcess {
    let [script, delay] = slow_starter(delays);
    run_command(extra, &["node", &script, &delay]).await
}

/// `drover run -w 2 EXTRA -- COMMAND`, as `run`.
async fn run_command(extra: &[&str], command: &[&str]) -> DroverProcess {
    let mut args = vec![
        "run",
        "-w",
        "2",
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(command);
    DroverProcess::spawn(bin(), &args).await
}

/// Fails, with drover's output, unless every one of `answers` is a 200.
fn all_answered(d: &DroverProcess, answers: Vec<(u16, Option<String>)>) {
    let failed: Vec<_> = answers.iter().filter(|a| a.0 != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {failed:?}\n{}",
        failed.len(),
        answers.len(),
        d.stderr_text()
    );
}

/// `n` GETs of `/` at once, each on its own connection; each answer's status and
/// `drover-error` (status 0: no answer).
async fn burst(addr: SocketAddr, n: usize) -> Vec<(u16, Option<String>)> {
    burst_of(addr, n, "/")
        .await
        .into_iter()
        .map(|(status, error, _)| (status, error))
        .collect()
}

/// `n` GETs of `path` at once, each on its own connection; each answer's status,
/// `drover-error` and `x-pid` (the worker's; status 0: no answer).
async fn burst_of(
    addr: SocketAddr,
    n: usize,
    path: &'static str,
) -> Vec<(u16, Option<String>, Option<u32>)> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            tokio::spawn(async move {
                let Ok(mut c) = HttpClient::connect(addr).await else {
                    return (0, None, None);
                };
                c.set_timeout(Duration::from_secs(60));
                match c.request("GET", path, &[], None).await {
                    Ok(r) => (
                        r.status,
                        r.header("drover-error").map(str::to_owned),
                        r.header("x-pid").and_then(|p| p.parse().ok()),
                    ),
                    Err(_) => (0, None, None),
                }
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    answers
}

/// The pids of the app's ready workers.
async fn ready_pids(admin: SocketAddr) -> Vec<u32> {
    status(admin).await.apps[0]
        .workers
        .iter()
        .filter(|w| w.state == "ready")
        .filter_map(|w| w.pid)
        .collect()
}

/// Node's cluster module and PM2 hold the connections of a fresh start until a worker
/// listens; drover used to answer every one of them `503 no-healthy-endpoint` at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_while_the_workers_start_wait_for_them() {
    let d = run("1500", &[]).await;
    let answers = burst(d.addr(), 20).await;
    let failed: Vec<_> = answers.iter().filter(|a| a.0 != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of 20 failed: {failed:?}\n{}",
        failed.len(),
        d.stderr_text()
    );
}

/// Both workers killed at once: until their replacements listen, 1.5 s later, no
/// worker is in the pool; requests sent meanwhile wait for the replacements. (Sent once
/// drover has seen both ends: a request sent in the millisecond before, which both dying
/// workers drop in turn, fails by design, as one that two workers dropped is more likely
/// the request's doing; see `Conn::after_drop`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_while_every_worker_restarts_wait_for_the_replacements() {
    let d = run("1500", &[]).await;
    let admin = admin_addr(&d).await;
    let serving = wait_until_async(Duration::from_secs(20), || async {
        ready_pids(admin).await.len() == 2
    })
    .await;
    assert!(serving, "{}", d.stderr_text());
    let before = ready_pids(admin).await;
    for pid in &before {
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
    }
    let none_ready = wait_until_async(Duration::from_secs(5), || async {
        ready_pids(admin).await.is_empty()
    })
    .await;
    assert!(
        none_ready,
        "drover did not see the workers end\n{}",
        d.stderr_text()
    );
    let answers = burst(d.addr(), 20).await;
    let failed: Vec<_> = answers.iter().filter(|a| a.0 != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of 20 failed: {failed:?}\n{}",
        failed.len(),
        d.stderr_text()
    );
    let after = ready_pids(admin).await;
    assert!(
        after.iter().all(|p| !before.contains(p)),
        "the killed workers serve: {before:?} {after:?}"
    );
}

/// A burst that comes while one worker of two is ready (a client that started with
/// drover, a deploy): all of it used to go to that worker within milliseconds, as the
/// only endpoint there was, and the second worker, ready a moment later, got none of
/// it while the first worked through every request in turn. Node's cluster module hands
/// a worker busy with CPU work no more connections, so the second gets its share there.
/// Now the first takes a few and the rest wait in drover's queue while the second is
/// on its way (it is not, and they go to the first, if the first turns out to be idle).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_while_one_worker_is_ready_waits_for_the_other_instead_of_all_going_to_it() {
    // Worker 0 listens at once, worker 1 after 1.5 s.
    let d = run("0,1500", &[]).await;
    let admin = admin_addr(&d).await;
    let first = wait_until_async(Duration::from_secs(20), || async {
        !ready_pids(admin).await.is_empty()
    })
    .await;
    assert!(first, "{}", d.stderr_text());
    let early = ready_pids(admin).await;
    assert_eq!(early.len(), 1, "both ready at once: {early:?}");
    // 24 requests of 150 ms of CPU at once: 3.6 s of work, 1.8 s on two workers.
    let answers = burst_of(d.addr(), 24, "/work?ms=150").await;
    let failed: Vec<_> = answers.iter().filter(|a| a.0 != 200).collect();
    assert!(failed.is_empty(), "{failed:?}\n{}", d.stderr_text());
    let on_late = answers.iter().filter(|a| a.2 != Some(early[0])).count();
    assert!(
        on_late >= 3,
        "the worker ready second served {on_late} of 24\n{}",
        d.stderr_text()
    );
}

/// Slow start keeps a cold worker from the share that warm ones carry. At a fresh start
/// no worker is warmer than another, so none ramps: each used to start at a tenth of
/// its share for the whole `--slow-start`, so one ready a moment after its sibling
/// counted half as much for seconds. (HAProxy applies `slowstart` at boot to no server.)
/// A replacement after a crash joins workers that have served, and ramps; `ctl status`
/// says so in its WEIGHT column.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_of_a_fresh_start_take_their_full_share_and_a_replacement_ramps() {
    let d = run("0", &["--slow-start", "20s"]).await;
    let admin = admin_addr(&d).await;
    let serving = wait_until_async(Duration::from_secs(20), || async {
        ready_pids(admin).await.len() == 2
    })
    .await;
    assert!(serving, "{}", d.stderr_text());
    // The second ramps at most over the moment between the two joining, not for 20 s.
    let full = wait_until_async(Duration::from_secs(5), || async {
        let s = status(admin).await;
        let ramps: Vec<f64> = s.balancers[0].endpoints.iter().map(|e| e.ramp).collect();
        ramps.len() == 2 && ramps.iter().all(|&r| r == 1.0)
    })
    .await;
    let (_, table, _) = ctl(admin, &["status"]).await;
    assert!(full, "workers of a fresh start still ramp\n{table}");

    // The pool has served for 3 s when a worker dies: its replacement ramps over 3 s.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = ready_pids(admin).await;
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &before[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let last_table = std::sync::Mutex::new(String::new());
    let ramps = wait_until_async(Duration::from_secs(15), || {
        let (last_table, before) = (&last_table, &before);
        async move {
            let s = status(admin).await;
            let Some(port) = s.apps[0]
                .workers
                .iter()
                .find(|w| w.state == "ready" && w.pid.is_some_and(|p| !before.contains(&p)))
                .and_then(|w| w.port)
            else {
                return false;
            };
            let (_, table, _) = ctl(admin, &["status"]).await;
            let row = format!("127.0.0.1:{port} ");
            let found = table
                .lines()
                .any(|l| l.contains(&row) && l.contains("(slow start "));
            *last_table.lock().unwrap() = table;
            found
        }
    })
    .await;
    assert!(
        ramps,
        "the replacement does not slow-start\n{}\n{}",
        last_table.lock().unwrap(),
        d.stderr_text()
    );
}

/// Workers that never listen: the wait ends at the queue timeout with a 503 that says
/// why, and drover keeps serving (here: answering) rather than holding requests forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_for_workers_that_never_start_get_a_503_after_the_queue_timeout() {
    // Ten minutes: longer than the test runs.
    let d = run("600000", &["--queue-timeout", "1s"]).await;
    for round in 0..2 {
        let answers = burst(d.addr(), 10).await;
        for a in &answers {
            assert_eq!(
                (a.0, a.1.as_deref()),
                (503, Some("no-healthy-endpoint")),
                "round {round}: {answers:?}\n{}",
                d.stderr_text()
            );
        }
    }
}

/// An app that fails at boot (here: a file it needs is missing; elsewhere a syntax
/// error, a module not installed) while clients send. drover held each request the whole
/// queue timeout (30 s by default) for a worker that never came, then answered `503
/// no-healthy-endpoint`, where nginx in front of the app answers 502 at once. Once each
/// worker has exited before it was ready, no worker is on its way: requests are answered
/// `503 workers-not-starting` at once, those already waiting too. (The queue timeout is
/// ten minutes here and each client waits one, so only that answer can come.) Once the
/// file is there, a worker starts and requests are served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_that_fails_at_boot_is_answered_at_once_and_serves_once_it_starts() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cold_start/server.py")
        .display()
        .to_string();
    let needs = common::temp_dir("fails-at-boot").join("config.json");
    let needs_arg = needs.display().to_string();
    let d = run_command(
        &["--queue-timeout", "600s"],
        &["python3", &script, "0", &needs_arg],
    )
    .await;
    // The first burst is sent as drover listens, before any worker has failed.
    for round in 0..2 {
        let answers = burst(d.addr(), 10).await;
        for a in &answers {
            assert_eq!(
                (a.0, a.1.as_deref()),
                (503, Some("workers-not-starting")),
                "round {round}: {answers:?}\n{}",
                d.stderr_text()
            );
        }
    }
    // drover's log reaches its stderr through a writer thread, after the answers.
    let said = d
        .wait_for_line("exited before it was ready", Duration::from_secs(5))
        .await;
    assert!(said.is_some(), "{}", d.stderr_text());
    std::fs::write(&needs, "{}").unwrap();
    let served = wait_until_async(Duration::from_secs(60), || async {
        burst(d.addr(), 1).await[0].0 == 200
    })
    .await;
    assert!(served, "{}", d.stderr_text());
    all_answered(&d, burst(d.addr(), 10).await);
}

/// An app that takes longer to boot than the ready timeout (ts-node on a large project,
/// a wait for its database): killed at the timeout and started again with the same
/// time, it never served, where PM2 and Node's cluster module run it. Each start in a
/// row that ran out of time doubles the next one's, so the second start (2 s for a
/// 1.5 s boot) serves. (A program drover cannot ask whether it is starting: a Node
/// app's event loop says so, below.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_slower_to_start_than_the_ready_timeout_gets_more_time_and_serves() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cold_start/server.py")
        .display()
        .to_string();
    let d = run_command(&["--ready-timeout", "1s"], &["python3", &script, "1500"]).await;
    let admin = admin_addr(&d).await;
    all_answered(&d, burst(d.addr(), 10).await);
    // Each worker's first start ran out of its second; the record says why.
    let s = status(admin).await;
    let records = &s.apps[0].restarts;
    assert!(
        records.iter().any(|r| r.reason == "start-failed"
            && r.detail
                .as_deref()
                .is_some_and(|t| t.contains("not ready within 1s"))),
        "{records:?}"
    );
    assert!(
        d.stderr_text().contains("its next start gets 2s"),
        "{}",
        d.stderr_text()
    );
}

/// A Node app that waits before it listens (its migrations, a database slow to answer,
/// here a 5 s timer) past the ready timeout: its event loop answers drover's ping, so
/// it is starting, not hung, and drover waits for it. Before, it was stopped at the
/// timeout and started again, its migration run a second time from the start, and it
/// served later than if left alone (an app that listened after 40 s served after 71 s;
/// under PM2, after 41 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_app_that_waits_before_it_listens_is_waited_for_not_restarted() {
    // A ready timeout of 2 s: a loaded machine takes more than 1 s to start Node with
    // drover's preload, and before the preload runs nothing can answer the ping.
    let d = run("5000", &["--ready-timeout", "2s"]).await;
    let admin = admin_addr(&d).await;
    all_answered(&d, burst(d.addr(), 10).await);
    let s = status(admin).await;
    let app = &s.apps[0];
    assert!(app.restarts.is_empty(), "{:?}", app.restarts);
    assert!(
        app.workers.iter().all(|w| w.restarts == 0),
        "{:?}",
        app.workers
    );
    assert!(
        d.stderr_text()
            .contains("but its event loop answers: it is starting, not hung"),
        "{}",
        d.stderr_text()
    );
    // A reload's replacements are waited for the same way: each was refused at the
    // ready timeout, so no reload of such an app could ever roll out (deploy seat).
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    all_answered(&d, burst(d.addr(), 10).await);
    let s = status(admin).await;
    assert!(
        s.apps[0].restarts.iter().all(|r| r.reason == "reload"),
        "{:?}",
        s.apps[0].restarts
    );
}

/// One whose start keeps its event loop busy past the ready timeout and drover's wait
/// for an answer (a loop that never ends, here 8 s of one) cannot say it is starting:
/// it is stopped, as before, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_app_whose_start_spins_past_the_ready_timeout_is_stopped() {
    let [script, delay] = slow_starter("8000");
    let d = run_command(
        &["--ready-timeout", "1s"],
        &["node", &script, &delay, "spin"],
    )
    .await;
    let admin = admin_addr(&d).await;
    let stopped = wait_until_async(Duration::from_secs(15), || async {
        let s = status(admin).await;
        s.apps[0].restarts.iter().any(|r| {
            r.reason == "start-failed"
                && r.detail
                    .as_deref()
                    .is_some_and(|t| t.contains("not ready within 1s"))
        })
    })
    .await;
    assert!(stopped, "{}", d.stderr_text());
    assert!(
        !d.stderr_text().contains("it is starting, not hung"),
        "{}",
        d.stderr_text()
    );
}

#[tokio::test]
async fn a_zero_ready_timeout_is_refused_by_name() {
    let [script, delay] = slow_starter("0");
    let out = tokio::process::Command::new(bin())
        .args([
            "run",
            "--ready-timeout",
            "0s",
            "-l",
            "127.0.0.1:0",
            "--admin",
            "off",
            "--",
        ])
        .args(["node", &script, &delay])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("ready_timeout") || err.contains("ready-timeout"),
        "{err}"
    );
}
