//! Failures that need the binary: a backend process killed under load, active health
//! checks from flags, and draining on SIGTERM. The rest (drover's errors, retries,
//! passive ejection, the queue) run in-process: crates/drover-proxy/tests/failures.rs.

mod common;

use common::{addrs, backends, proxy};
use drover_testkit::{spawn_backend_process, wait_until, HttpClient};
use std::time::Duration;

/// HTTP checks of `/health` every 100 ms, 100 ms to answer, down after 2 failures.
const FAST_CHECKS: &[&str] = &[
    "--health-path",
    "/health",
    "--health-interval",
    "100ms",
    "--health-timeout",
    "100ms",
    "--fall",
    "2",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_backend_under_load_fails_no_get() {
    let b0 = spawn_backend_process("k0").await;
    let b1 = spawn_backend_process("k1").await;
    let d = proxy(&[b0.addr(), b1.addr()], &["--strategy", "round-robin"]).await;
    let addr = d.addr();
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let answered = answered.clone();
        clients.push(tokio::spawn(async move {
            let mut c = HttpClient::connect(addr).await.unwrap();
            let mut failed = Vec::new();
            for i in 0..300 {
                let path = if i % 10 == 0 { "/delay/5" } else { "/" };
                match c.request("GET", path, &[], None).await {
                    Ok(r) if r.status == 200 => {
                        answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    Ok(r) => failed.push(format!(
                        "status {} {:?}",
                        r.status,
                        r.header("drover-error")
                    )),
                    Err(e) => {
                        failed.push(format!("{e}"));
                        c = HttpClient::connect(addr).await.unwrap();
                    }
                }
            }
            failed
        }));
    }
    // Kill b0 once the load runs through both backends (round robin), with most of
    // the 1200 requests still to come.
    assert!(
        wait_until(Duration::from_secs(10), || {
            answered.load(std::sync::atomic::Ordering::Relaxed) >= 20
        })
        .await,
        "the load was never served\n{}",
        d.stderr_text()
    );
    b0.kill();
    let mut failed = Vec::new();
    for c in clients {
        failed.extend(c.await.unwrap());
    }
    assert!(
        failed.is_empty(),
        "{} failed GETs: {:?}\n{}",
        failed.len(),
        &failed[..failed.len().min(5)],
        d.stderr_text()
    );
    assert!(
        d.stderr_text().contains("connect failed"),
        "the kill was not noticed:\n{}",
        d.stderr_text()
    );
}

#[tokio::test]
async fn hung_backend_is_taken_out_by_the_active_check_and_returns() {
    let b = backends(2).await;
    let d = proxy(
        &addrs(&b),
        &[&["--strategy", "round-robin", "--rise", "2"], FAST_CHECKS].concat(),
    )
    .await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    b[0].set_hang_health(true);
    // After `fall` failed checks every request goes to the healthy backend. drover logs
    // "endpoint down" after it took the endpoint out, so nothing is left to wait for.
    let hung = b[0].addr().to_string();
    let out = wait_until(Duration::from_secs(5), || {
        d.stderr_text()
            .lines()
            .any(|l| l.contains("endpoint down") && l.contains(&hung))
    })
    .await;
    assert!(
        out,
        "no health log about {}: {}",
        b[0].addr(),
        d.stderr_text()
    );
    b[0].reset_stats();
    for _ in 0..20 {
        assert_eq!(c.get("/").await.header("x-backend"), Some("b1"));
    }
    assert_eq!(b[0].hits_except_health(), 0);
    b[0].set_hang_health(false);
    let mut back = false;
    for _ in 0..100 {
        if c.get("/").await.header("x-backend") == Some("b0") {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(back, "b0 never came back after passing checks");
}

/// Health checks that get no answer take down at most half the backends: with 3 of 4
/// silent on `/health` (busy with load drover cannot see, or hung), two go down and the
/// third stays in rotation, its log line saying why.
#[tokio::test]
async fn silent_checks_take_down_at_most_half_the_backends() {
    let b = backends(4).await;
    let d = proxy(
        &addrs(&b),
        &[&["--strategy", "round-robin"], FAST_CHECKS].concat(),
    )
    .await;
    for silent in &b[..3] {
        silent.set_hang_health(true);
    }
    let logged = |d: &drover_testkit::DroverProcess, what: &str, addr: std::net::SocketAddr| {
        d.stderr_text()
            .lines()
            .any(|l| l.contains(what) && l.contains(&addr.to_string()))
    };
    let settled = wait_until(Duration::from_secs(5), || {
        let down = b[..3]
            .iter()
            .filter(|s| logged(&d, "endpoint down", s.addr()))
            .count();
        let held = b[..3]
            .iter()
            .filter(|s| logged(&d, "kept in rotation", s.addr()))
            .count();
        down == 2 && held == 1
    })
    .await;
    assert!(settled, "{}", d.stderr_text());
    let held = b[..3]
        .iter()
        .find(|s| logged(&d, "kept in rotation", s.addr()))
        .unwrap();
    assert!(
        d.stderr_text().contains(
            "take down at most 2 of 4 endpoints (half, rounded down), and 2 are down on them"
        ),
        "{}",
        d.stderr_text()
    );
    for s in &b {
        s.reset_stats();
    }
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..20 {
        assert_eq!(c.get("/").await.status, 200);
    }
    // Round-robin over the two in rotation: the held one and the one that answers.
    assert_eq!(held.hits_except_health(), 10);
    assert_eq!(b[3].hits_except_health(), 10);
}

/// `drover ctl status` says why a backend whose checks get no answer is kept, and that it
/// takes one request at a time meanwhile (a lone backend: checks that get no answer take
/// down none of one).
#[tokio::test]
async fn ctl_status_shows_a_kept_backend_on_probation() {
    let b = backends(1).await;
    let backend = b[0].addr().to_string();
    let (d, admin) =
        common::proxy_with_admin(&[&["--backend", backend.as_str()], FAST_CHECKS].concat()).await;
    b[0].set_hang_health(true);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let table = loop {
        let (code, table, err) = common::ctl(admin, &["status"]).await;
        assert_eq!(code, 0, "{err}");
        if table.contains("kept in rotation") || std::time::Instant::now() > deadline {
            break table;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let row = table
        .lines()
        .find(|l| l.starts_with(&backend))
        .unwrap_or_else(|| panic!("no row for {backend}:\n{table}\n{}", d.stderr_text()));
    assert!(row.contains(" up "), "{row}");
    assert!(row.contains("1 (checks get no answer)"), "{table}");
    assert!(
        table.contains(&format!(
            "{backend}: health check failing: timeout after 100ms; kept in rotation: checks that get no answer take down at most 0 of 1 endpoints"
        )),
        "{table}"
    );
    // Served meanwhile, one at a time.
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    assert_eq!(c.get("/").await.status, 200);
    b[0].set_hang_health(false);
}

/// Backends that are truly hung (stopped) all go down, past the half that checks with
/// no answer may take: drover's own requests wait on them and none completes, which no
/// load elsewhere explains.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_backends_with_requests_stuck_on_them_all_go_down() {
    let mut b = Vec::new();
    for name in ["s0", "s1", "s2", "s3"] {
        b.push(spawn_backend_process(name).await);
    }
    let addrs: Vec<_> = b.iter().map(|p| p.addr()).collect();
    let d = proxy(
        &addrs,
        &[
            &["--strategy", "round-robin", "--request-timeout", "2s"],
            FAST_CHECKS,
        ]
        .concat(),
    )
    .await;
    let signal = |sig: &str, p: &drover_testkit::ChildProcess| {
        let ok = std::process::Command::new("kill")
            .args([sig, &p.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {}", p.pid());
    };
    for stopped in &b[..3] {
        signal("-STOP", stopped);
    }
    // Clients keep sending, so requests wait on every stopped backend.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..8 {
        let (addr, done) = (d.addr(), done.clone());
        clients.push(tokio::spawn(async move {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(mut c) = HttpClient::connect(addr).await {
                    let _ = c.request("GET", "/", &[], None).await;
                }
            }
        }));
    }
    let logged = |what: &str, addr: std::net::SocketAddr| {
        d.stderr_text()
            .lines()
            .any(|l| l.contains(what) && l.contains(&addr.to_string()))
    };
    let all_down = wait_until(Duration::from_secs(10), || {
        addrs[..3].iter().all(|a| logged("endpoint down", *a))
    })
    .await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    assert!(all_down, "{}", d.stderr_text());
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..8 {
        assert_eq!(c.get("/").await.header("x-backend"), Some("s3"));
    }
    for stopped in &b[..3] {
        signal("-CONT", stopped);
    }
}

/// GETs that wait on a backend its checks then find hung (a stopped process) go to
/// another backend as soon as it is found so, instead of waiting out the request timeout
/// (nginx's `proxy_next_upstream timeout`, without the wait); a POST is not sent twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gets_waiting_on_a_backend_found_hung_go_to_another() {
    let stopped = spawn_backend_process("s0").await;
    let serving = spawn_backend_process("s1").await;
    let (stopped_addr, serving_addr) = (stopped.addr().to_string(), serving.addr().to_string());
    let (d, admin) = common::proxy_with_admin(
        &[
            &["--backend", &stopped_addr, "--backend", &serving_addr],
            &["--strategy", "round-robin", "--request-timeout", "8s"],
            FAST_CHECKS,
        ]
        .concat(),
    )
    .await;
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &stopped.pid().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {}", stopped.pid());
    };
    signal("-STOP");
    // Each on its own connection, at once: round-robin puts half on the stopped backend
    // before its checks have failed `fall` times.
    let mut clients = Vec::new();
    for i in 0..8 {
        let addr = d.addr();
        clients.push(tokio::spawn(async move {
            let mut c = HttpClient::connect(addr).await.unwrap();
            let (method, body) = if i == 0 {
                ("POST", Some(&b"x"[..]))
            } else {
                ("GET", None)
            };
            let r = c.request(method, "/", &[], body).await.unwrap();
            let header = |name| r.header(name).map(str::to_owned);
            (
                method,
                r.status,
                header("x-backend"),
                header("drover-error"),
            )
        }));
    }
    let mut answers = Vec::new();
    for c in clients {
        answers.push(c.await.unwrap());
    }
    signal("-CONT");
    let log = d.stderr_text();
    assert!(
        log.lines()
            .any(|l| l.contains("endpoint down") && l.contains(&stopped_addr)),
        "{log}"
    );
    for (method, status, backend, error) in &answers {
        if *method == "GET" {
            assert_eq!(
                (*status, backend.as_deref()),
                (200, Some("s1")),
                "{answers:?}"
            );
        } else if backend.as_deref() != Some("s1") {
            // On the stopped backend, a POST waits out the request timeout: it may not go twice.
            assert_eq!(
                (*status, error.as_deref()),
                (504, Some("backend-timeout")),
                "{answers:?}"
            );
        }
    }
    let metrics = common::metrics_text(admin).await;
    assert!(
        metrics.contains(r#"drover_retries_total{balancer="default",cause="backend-hung"}"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn sigterm_drains_in_flight_requests_and_exits_zero() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), &["--drain-timeout", "20s"]).await;
    let addr = d.addr();
    let mut idle = HttpClient::connect(addr).await.unwrap();
    assert_eq!(idle.get("/").await.status, 200);
    let slow = tokio::spawn(async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        c.set_timeout(Duration::from_secs(30));
        c.get("/delay/3000").await
    });
    // SIGTERM once the backend holds it (it answers 3 s later).
    assert!(
        wait_until(Duration::from_secs(10), || b[0].in_flight() == 1).await,
        "the slow request never reached the backend"
    );
    assert!(!slow.is_finished());
    d.signal("TERM").unwrap();
    let r = slow.await.unwrap();
    assert_eq!(r.status, 200, "the in-flight request was cut off");
    assert_eq!(r.header("connection"), Some("close"));
    let status = d
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("drover did not exit");
    assert!(
        status.success(),
        "exit status {status:?}\n{}",
        d.stderr_text()
    );
    // The idle keep-alive connection was closed, and nothing listens any more.
    assert!(idle.request("GET", "/", &[], None).await.is_err());
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}
