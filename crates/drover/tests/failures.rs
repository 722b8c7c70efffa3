//! Failures: dead, hung and failing backends, timeouts, limits, retries and draining.

mod common;

use common::{addrs, backends, proxy};
use drover_testkit::{spawn_backend_process, wait_until, wait_until_async, HttpClient};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A backend that answers every request with `status` and counts them.
async fn constant_backend(
    status: u16,
) -> (SocketAddr, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let hits = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = hits.clone();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let counter = counter.clone();
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let mut seen = Vec::new();
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                    seen.extend_from_slice(&buf[..n]);
                    while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                        seen.drain(..end + 4);
                        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let reply = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
                        if s.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    (addr, hits)
}

fn closed_port() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

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
        &[
            "--strategy",
            "round-robin",
            "--health-path",
            "/health",
            "--health-interval",
            "100ms",
            "--health-timeout",
            "100ms",
            "--fall",
            "2",
            "--rise",
            "2",
        ],
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

#[tokio::test]
async fn errors_name_their_cause() {
    // 502: nothing listens.
    let d = proxy(&[closed_port(), closed_port()], &[]).await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c.get("/").await;
    assert_eq!(
        (r.status, r.header("drover-error")),
        (502, Some("connect-failed")),
        "{}",
        r.text()
    );
    // ...and once both are ejected, nothing is healthy: 503.
    let r = c.get("/").await;
    assert_eq!(
        (r.status, r.header("drover-error")),
        (503, Some("no-healthy-endpoint"))
    );
    assert!(!r.body.is_empty());

    // 504: the backend is too slow.
    let b = backends(1).await;
    let d = proxy(&addrs(&b), &["--request-timeout", "200ms"]).await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c.get("/delay/2000").await;
    assert_eq!(
        (r.status, r.header("drover-error")),
        (504, Some("backend-timeout"))
    );

    // 502: the backend hung up without answering.
    let r = HttpClient::connect(d.addr())
        .await
        .unwrap()
        .get("/close")
        .await;
    assert_eq!(
        (r.status, r.header("drover-error")),
        (502, Some("backend-closed"))
    );
}

#[tokio::test]
async fn unsafe_requests_are_not_retried_once_sent() {
    let b = backends(2).await;
    let d = proxy(&addrs(&b), &["--strategy", "round-robin"]).await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c.request("POST", "/close", &[], Some(b"x")).await.unwrap();
    assert_eq!(r.status, 502);
    assert_eq!(
        b[0].hits_for("/close") + b[1].hits_for("/close"),
        1,
        "a POST that reached a backend was sent again"
    );

    // A GET is idempotent: it is tried on the other backend too.
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c.get("/close").await;
    assert_eq!(r.status, 502);
    assert_eq!(b[0].hits_for("/close") + b[1].hits_for("/close"), 3);
}

#[tokio::test]
async fn consecutive_5xx_eject_an_endpoint() {
    let (bad, bad_hits) = constant_backend(500).await;
    let good = backends(1).await;
    let d = proxy(&[bad, good[0].addr()], &["--strategy", "round-robin"]).await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let mut errors = 0;
    for _ in 0..40 {
        if c.get("/").await.status == 500 {
            errors += 1;
        }
    }
    // Five 500s in a row eject it; the rest go to the good backend.
    assert_eq!(
        errors,
        5,
        "bad backend got {} requests",
        bad_hits.load(std::sync::atomic::Ordering::Relaxed)
    );
    assert!(d.stderr_text().contains("ejected"), "{}", d.stderr_text());
}

#[tokio::test]
async fn busy_endpoints_queue_requests_in_drover() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), &["--max-conns", "1", "--queue-timeout", "3s"]).await;
    let addr = d.addr();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        tasks.push(tokio::spawn(async move {
            HttpClient::connect(addr)
                .await
                .unwrap()
                .get("/delay/100")
                .await
                .status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    // All four succeeded, but the backend never held more than one at a time.
    assert_eq!(b[0].max_in_flight(), 1);
    assert_eq!(b[0].hits(), 4);
}

/// Sends `schedule` (wait this many ms, then send this path, each on its own
/// connection) through a proxy whose one backend takes one request at a time, after
/// teaching it the cost of each `learn` route; returns the order the backend served
/// them in.
async fn served_order(learn: &[&str], schedule: &[(u64, &'static str)]) -> Vec<String> {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), &["--max-conns", "1", "--queue-timeout", "5s"]).await;
    let addr = d.addr();
    // drover learns each route's cost from its latency.
    let mut c = HttpClient::connect(addr).await.unwrap();
    for path in learn {
        assert_eq!(c.get(path).await.status, 200);
    }
    b[0].reset_stats();
    let mut tasks = Vec::new();
    for &(wait_ms, path) in schedule {
        tokio::time::sleep(Duration::from_millis(wait_ms)).await;
        tasks.push(tokio::spawn(async move {
            HttpClient::connect(addr)
                .await
                .unwrap()
                .get(path)
                .await
                .status
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 200);
    }
    assert_eq!(b[0].max_in_flight(), 1);
    b[0].request_heads().into_iter().map(|h| h.target).collect()
}

/// A cheap request that arrives while an expensive one waits in drover's queue joins
/// ahead of it (costs are learned per route), so it does not sit behind work it has
/// nothing to do with; requests of one route stay in order.
#[tokio::test]
async fn a_queued_cheap_request_passes_a_queued_expensive_one() {
    let order = served_order(
        &["/delay/300", "/delay/1", "/delay/1"],
        &[
            (0, "/delay/400"),
            (100, "/delay/300"),
            (50, "/delay/1"),
            (20, "/delay/1"),
        ],
    )
    .await;
    assert_eq!(order, ["/delay/400", "/delay/1", "/delay/1", "/delay/300"]);
}

/// Cheap requests pass a queued expensive one at most 8 times: the ninth and later
/// queue behind it, so it never starves.
#[tokio::test]
async fn an_expensive_request_is_passed_a_bounded_number_of_times() {
    let mut schedule = vec![(0, "/delay/700"), (100, "/delay/50")];
    schedule.extend([(15, "/delay/1"); 10]);
    let order = served_order(&["/delay/50", "/delay/1", "/delay/1"], &schedule).await;
    let mut want = vec!["/delay/700"];
    want.extend(["/delay/1"; 8]);
    want.push("/delay/50");
    want.extend(["/delay/1"; 2]);
    assert_eq!(order, want);
}

/// `drover_queue_depth` of the default balancer, from /metrics of `admin`.
async fn queue_depth(admin: SocketAddr) -> u64 {
    common::default_metric(admin, "drover_queue_depth").await
}

/// One request holds the only backend slot, one waits in the queue (of one): a third
/// finds the queue full, and the waiter gives up after the queue timeout. The queue
/// timeout is long enough for the third to come while the waiter still waits, and the
/// hog outlasts it.
#[tokio::test]
async fn a_full_queue_and_a_long_wait_get_503() {
    let b = backends(1).await;
    let d = proxy(
        &addrs(&b),
        &[
            "--max-conns",
            "1",
            "--queue-timeout",
            "3s",
            "--queue-max",
            "1",
            "--admin",
            "127.0.0.1:0",
        ],
    )
    .await;
    let addr = d.addr();
    let admin = common::admin_addr(&d).await;
    let hog = tokio::spawn(async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        c.set_timeout(Duration::from_secs(30));
        c.get("/delay/8000").await.status
    });
    assert!(
        wait_until(Duration::from_secs(10), || b[0].in_flight() == 1).await,
        "the hog never reached the backend"
    );
    let waiter = tokio::spawn(async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        c.set_timeout(Duration::from_secs(30));
        let r = c.get("/").await;
        (r.status, r.header("drover-error").map(str::to_owned))
    });
    assert!(
        wait_until_async(Duration::from_secs(10), || async {
            queue_depth(admin).await == 1
        })
        .await,
        "the waiter never queued"
    );
    let r = HttpClient::connect(addr).await.unwrap().get("/").await;
    assert_eq!(
        (r.status, r.header("drover-error")),
        (503, Some("queue-full"))
    );
    assert_eq!(
        waiter.await.unwrap(),
        (503, Some("queue-timeout".to_owned()))
    );
    assert_eq!(hog.await.unwrap(), 200);
    assert_eq!(
        b[0].hits_for("/"),
        0,
        "a request that got a 503 reached the backend"
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
