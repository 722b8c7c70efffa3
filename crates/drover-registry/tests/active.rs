//! Active health checks against tiny real backends on 127.0.0.1.

use drover_balance::clock;
use drover_registry::{
    probe, spawn_active_checks, CheckKind, HealthCheck, Pool, PoolOptions, ProbeError, Source,
    StatusRange,
};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const OK: u8 = 0;
const ERROR: u8 = 1;
const HANG: u8 = 2;
const GARBAGE: u8 = 3;
/// Half a status line, then close.
const CUT: u8 = 4;

/// A backend whose answer to every request is set by `mode`.
struct Backend {
    addr: SocketAddr,
    mode: Arc<AtomicU8>,
    hits: Arc<AtomicUsize>,
    last_request: Arc<Mutex<Vec<u8>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl Backend {
    async fn start(mode: u8) -> Backend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        Backend::serve(listener, mode)
    }

    fn serve(listener: TcpListener, mode: u8) -> Backend {
        let addr = listener.local_addr().unwrap();
        let mode = Arc::new(AtomicU8::new(mode));
        let hits = Arc::new(AtomicUsize::new(0));
        let last_request = Arc::new(Mutex::new(Vec::new()));
        let (m, h, r) = (mode.clone(), hits.clone(), last_request.clone());
        let accept = tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return;
                };
                let (m, h, r) = (m.clone(), h.clone(), r.clone());
                tokio::spawn(handle(conn, m, h, r));
            }
        });
        Backend {
            addr,
            mode,
            hits,
            last_request,
            accept,
        }
    }

    fn set(&self, mode: u8) {
        self.mode.store(mode, SeqCst);
    }

    fn hits(&self) -> usize {
        self.hits.load(SeqCst)
    }
}

async fn handle(
    mut conn: TcpStream,
    mode: Arc<AtomicU8>,
    hits: Arc<AtomicUsize>,
    last: Arc<Mutex<Vec<u8>>>,
) {
    let mut req = Vec::new();
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    *last.lock().unwrap() = req;
    hits.fetch_add(1, SeqCst);
    let answer: &[u8] = match mode.load(SeqCst) {
        OK => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok",
        ERROR => b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n",
        GARBAGE => b"garbage\r\n\r\n",
        CUT => b"HTTP/1.1 20",
        _ => {
            // Accept, read, never answer; keep the socket open past any probe timeout.
            tokio::time::sleep(Duration::from_secs(3600)).await;
            return;
        }
    };
    let _ = conn.write_all(answer).await;
}

fn check(kind: CheckKind) -> HealthCheck {
    HealthCheck {
        kind,
        interval: Duration::from_millis(50),
        timeout: Duration::from_millis(100),
        rise: 2,
        fall: 3,
    }
}

fn pool_of(addrs: &[SocketAddr], opts: PoolOptions) -> Arc<Pool> {
    let members: Vec<_> = addrs.iter().map(|a| (*a, 1)).collect();
    Arc::new(Pool::new("test", &members, opts))
}

/// Polls `f` until it holds, failing the test after 5 s.
async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn healthy(pool: &Pool, addr: SocketAddr) -> bool {
    pool.find(addr).unwrap().is_healthy()
}

#[tokio::test]
async fn http_500_goes_down_after_fall_and_back_up_after_rise_with_slow_start() {
    let backend = Backend::start(ERROR).await;
    let opts = PoolOptions {
        slow_start: Duration::from_secs(30),
        ..PoolOptions::default()
    };
    let pool = pool_of(&[backend.addr], opts);
    let checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/health")));

    wait_until("down", || !healthy(&pool, backend.addr)).await;
    assert!(backend.hits() >= 3, "down only after `fall` failures");
    let report = checks.report();
    assert_eq!(report.len(), 1);
    assert_eq!(report[0].addr, backend.addr);
    assert!(report[0].failures >= 3);
    assert_eq!(report[0].last_error.as_deref(), Some("status 500"));
    // It answers: what it holds may still finish, so its requests stay with it.
    assert!(!pool.find(backend.addr).unwrap().is_hung());

    backend.set(OK);
    let hits = backend.hits();
    wait_until("up", || healthy(&pool, backend.addr)).await;
    assert!(backend.hits() - hits >= 2, "up only after `rise` passes");
    let ep = pool.find(backend.addr).unwrap();
    assert!(ep.ramp(clock::now()) < 0.5, "slow start begins on recovery");
}

#[tokio::test]
async fn the_request_is_a_plain_http11_get() {
    let backend = Backend::start(OK).await;
    let pool = pool_of(&[backend.addr], PoolOptions::default());
    let _checks = spawn_active_checks(pool.clone(), check(CheckKind::http("health")));
    wait_until("probed", || backend.hits() > 0).await;
    let req = String::from_utf8(backend.last_request.lock().unwrap().clone()).unwrap();
    assert_eq!(
        req,
        format!(
            "GET /health HTTP/1.1\r\nHost: {}\r\nUser-Agent: drover-health\r\n\r\n",
            backend.addr
        )
    );
    assert!(healthy(&pool, backend.addr));
}

#[tokio::test]
async fn a_hung_backend_times_out_and_goes_down_while_another_answers() {
    let backend = Backend::start(HANG).await;
    let good = Backend::start(OK).await;
    let pool = pool_of(&[backend.addr, good.addr], PoolOptions::default());
    let started = Instant::now();
    let checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("down", || !healthy(&pool, backend.addr)).await;
    // Three rounds, each cut off at the 100 ms timeout.
    assert!(started.elapsed() >= Duration::from_millis(300));
    let report = checks.report();
    let hung = report.iter().find(|r| r.addr == backend.addr).unwrap();
    assert!(!hung.held_up, "{hung:?}");
    assert!(pool.find(backend.addr).unwrap().is_hung());
    assert!(!pool.find(good.addr).unwrap().is_hung());
}

/// A lone endpoint that stops answering stays in rotation (nginx never marks a lone
/// server down): taking it down turns a slow answer into no answer at all. Its report
/// says why it is kept; a refused connect or a bad status still takes it down.
#[tokio::test]
async fn a_lone_endpoint_is_not_taken_down_for_timeouts_alone() {
    let backend = Backend::start(HANG).await;
    let pool = pool_of(&[backend.addr], PoolOptions::default());
    let checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("held up", || {
        checks.report().first().is_some_and(|r| r.held_up)
    })
    .await;
    let hits = backend.hits();
    wait_until("five more rounds", || backend.hits() >= hits + 5).await;
    assert!(healthy(&pool, backend.addr));
    let r = &checks.report()[0];
    assert!(r.failures >= 3, "{r:?}");
    let why = r.last_error.as_deref().unwrap();
    assert!(why.starts_with("timeout after 100ms"), "{why}");
    assert!(
        why.contains("kept in rotation: checks that get no answer take down at most 0 of 1 endpoints (half, rounded down), and 0 are down on them"),
        "{why}"
    );
    let ep = pool.find(backend.addr).unwrap();
    assert!(ep.is_on_probation());
    backend.set(ERROR);
    wait_until("down on a bad status", || !healthy(&pool, backend.addr)).await;
    assert!(!checks.report()[0].held_up);
    assert!(!ep.is_on_probation(), "down is down, not on probation");
}

/// A check that passes ends probation; so does stopping the checks (a reload that turns
/// them off), which would otherwise leave the endpoint at one request for good.
#[tokio::test]
async fn probation_ends_when_a_check_passes_or_the_checks_stop() {
    let backend = Backend::start(HANG).await;
    let pool = pool_of(&[backend.addr], PoolOptions::default());
    let ep = pool.find(backend.addr).unwrap();
    let checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("on probation", || ep.is_on_probation()).await;
    backend.set(OK);
    wait_until("off probation", || !ep.is_on_probation()).await;
    assert!(healthy(&pool, backend.addr));
    backend.set(HANG);
    wait_until("on probation again", || ep.is_on_probation()).await;
    drop(checks);
    assert!(!ep.is_on_probation());
}

/// Checks that get no answer take down at most half the endpoints (rounded down); the
/// rest stay in rotation, held. An endpoint down for a bad answer does not count, so
/// when one of those down on timeouts starts answering badly, a held one may go down.
#[tokio::test]
async fn timeouts_take_down_at_most_half_the_endpoints() {
    let hung: Vec<Backend> = vec![
        Backend::start(HANG).await,
        Backend::start(HANG).await,
        Backend::start(HANG).await,
    ];
    let good = Backend::start(OK).await;
    let mut addrs: Vec<SocketAddr> = hung.iter().map(|b| b.addr).collect();
    addrs.push(good.addr);
    let pool = pool_of(&addrs, PoolOptions::default());
    let checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    let down = |pool: &Pool| hung.iter().filter(|b| !healthy(pool, b.addr)).count();
    wait_until("two down, one held", || {
        down(&pool) == 2 && checks.report().iter().any(|r| r.held_up)
    })
    .await;
    let hits = good.hits();
    wait_until("five more rounds", || good.hits() >= hits + 5).await;
    assert_eq!(down(&pool), 2);
    assert!(healthy(&pool, good.addr));
    let held = checks.report().into_iter().find(|r| r.held_up).unwrap();
    assert!(healthy(&pool, held.addr));
    // Kept, but one request at a time: a hung one then holds one request, not many.
    assert!(pool.find(held.addr).unwrap().is_on_probation());
    assert!(!pool.find(good.addr).unwrap().is_on_probation());
    let why = held.last_error.unwrap();
    assert!(
        why.contains(
            "take down at most 2 of 4 endpoints (half, rounded down), and 2 are down on them"
        ),
        "{why}"
    );
    // One of the two down starts answering 500: down for that now, which frees its place.
    let first_down = hung.iter().find(|b| !healthy(&pool, b.addr)).unwrap();
    first_down.set(ERROR);
    wait_until("the held one down", || !healthy(&pool, held.addr)).await;
    assert_eq!(down(&pool), 3);
    assert!(healthy(&pool, good.addr));
    assert!(checks.report().iter().all(|r| !r.held_up));
}

/// Several backends that stop answering at once (busy with another balancer's load
/// while this one carries none) stay up: taking them all down is the outage. One that
/// refuses or answers badly meanwhile still goes down, and so does a hung one once
/// another answers.
#[tokio::test]
async fn timeouts_on_every_endpoint_at_once_take_none_down() {
    let a = Backend::start(OK).await;
    let b = Backend::start(OK).await;
    let bad = Backend::start(ERROR).await;
    let pool = pool_of(&[a.addr, b.addr, bad.addr], PoolOptions::default());
    let _checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("bad down", || !healthy(&pool, bad.addr)).await;
    // Every endpoint still up times out: ten rounds, and neither goes down.
    a.set(HANG);
    b.set(HANG);
    let hits = a.hits();
    wait_until("ten rounds", || a.hits() >= hits + 10).await;
    assert!(healthy(&pool, a.addr) && healthy(&pool, b.addr));
    // Once one answers again, the other's timeouts are its own.
    b.set(OK);
    wait_until("hung down", || !healthy(&pool, a.addr)).await;
    assert!(healthy(&pool, b.addr));
}

#[tokio::test]
async fn a_closed_port_goes_down() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let pool = pool_of(&[addr], PoolOptions::default());
    let _checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("down", || !healthy(&pool, addr)).await;
}

#[tokio::test]
async fn garbage_and_cut_answers_are_failures() {
    let garbage = Backend::start(GARBAGE).await;
    let cut = Backend::start(CUT).await;
    let pool = pool_of(&[garbage.addr, cut.addr], PoolOptions::default());
    let _checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("garbage down", || !healthy(&pool, garbage.addr)).await;
    wait_until("cut down", || !healthy(&pool, cut.addr)).await;
}

#[tokio::test]
async fn one_hung_backend_does_not_hide_another() {
    let hung = Backend::start(HANG).await;
    let good = Backend::start(OK).await;
    let bad = Backend::start(ERROR).await;
    let pool = pool_of(&[hung.addr, good.addr, bad.addr], PoolOptions::default());
    let _checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("bad down", || !healthy(&pool, bad.addr)).await;
    wait_until("hung down", || !healthy(&pool, hung.addr)).await;
    assert!(healthy(&pool, good.addr));
}

#[tokio::test]
async fn tcp_check_rises_falls_and_rises_again() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let opts = PoolOptions {
        initially_unhealthy: true,
        ..PoolOptions::default()
    };
    let pool = pool_of(&[addr], opts);
    assert!(!healthy(&pool, addr));
    let _checks = spawn_active_checks(pool.clone(), check(CheckKind::Tcp));
    // Connect alone passes: the listener's backlog accepts without `accept()`.
    wait_until("up", || healthy(&pool, addr)).await;
    drop(listener);
    wait_until("down", || !healthy(&pool, addr)).await;
    let Ok(listener) = TcpListener::bind(addr).await else {
        return; // the port was taken meanwhile; the rest was shown
    };
    let _backend = Backend::serve(listener, OK);
    wait_until("up again", || healthy(&pool, addr)).await;
}

#[tokio::test]
async fn endpoints_added_later_are_checked_and_dropping_the_handle_stops() {
    let a = Backend::start(OK).await;
    let b = Backend::start(ERROR).await;
    let pool = pool_of(&[a.addr], PoolOptions::default());
    let checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("a probed", || a.hits() > 0).await;
    pool.insert(Source::Admin, b.addr, 1);
    wait_until("b down", || !healthy(&pool, b.addr)).await;

    drop(checks);
    tokio::time::sleep(Duration::from_millis(20)).await;
    let hits = a.hits();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(a.hits(), hits, "no probes after the handle is dropped");
}

#[tokio::test]
async fn supervised_workers_are_left_to_their_supervisor() {
    // Both answer 500: a probe would take either down.
    let fixed = Backend::start(ERROR).await;
    let worker = Backend::start(ERROR).await;
    let pool = pool_of(&[fixed.addr], PoolOptions::default());
    pool.insert(Source::Supervisor, worker.addr, 1);
    let _checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("the fixed backend down", || !healthy(&pool, fixed.addr)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(healthy(&pool, worker.addr), "a worker was marked down");
    assert_eq!(worker.hits(), 0, "a worker was probed");

    // An address the supervisor shares with another source is its worker too.
    pool.insert(Source::Supervisor, fixed.addr, 1);
    let probed = fixed.hits();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        fixed.hits() <= probed + 1,
        "a worker's address was probed on"
    );
}

/// A backend that answers every request on a connection, alternating a sized and a
/// chunked body, until the connection's `last`-th request: that one it reads and
/// closes the connection on unanswered, as a server whose idle timeout ends the
/// connection just as a request arrives. It counts connections and answers.
struct KeepingBackend {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    answers: Arc<AtomicUsize>,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for KeepingBackend {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

impl KeepingBackend {
    async fn start(last: usize) -> KeepingBackend {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let answers = Arc::new(AtomicUsize::new(0));
        let (c, a) = (connections.clone(), answers.clone());
        let accept = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                c.fetch_add(1, SeqCst);
                tokio::spawn(keep_answering(conn, last, a.clone()));
            }
        });
        KeepingBackend {
            addr,
            connections,
            answers,
            accept,
        }
    }
}

async fn keep_answering(mut conn: TcpStream, last: usize, answers: Arc<AtomicUsize>) {
    let mut buf = [0u8; 1024];
    for n in 1.. {
        let mut req = Vec::new();
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            match conn.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(k) => req.extend_from_slice(&buf[..k]),
            }
        }
        if n == last {
            return;
        }
        let answer: &[u8] = if n % 2 == 1 {
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
        } else {
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"
        };
        if conn.write_all(answer).await.is_err() {
            return;
        }
        answers.fetch_add(1, SeqCst);
    }
}

#[tokio::test]
async fn an_http_check_keeps_its_connection_from_probe_to_probe() {
    let backend = KeepingBackend::start(usize::MAX).await;
    let pool = pool_of(&[backend.addr], PoolOptions::default());
    let checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("ten probes answered", || backend.answers.load(SeqCst) >= 10).await;
    assert_eq!(
        backend.connections.load(SeqCst),
        1,
        "a connection per probe"
    );
    assert!(healthy(&pool, backend.addr));
    assert!(checks.report().iter().all(|r| r.failures == 0));
}

#[tokio::test]
async fn a_kept_connection_the_backend_closes_as_the_probe_arrives_is_replaced() {
    // Each connection answers one probe and closes on the next unanswered: every probe
    // after the first meets a connection that closes under it.
    let backend = KeepingBackend::start(2).await;
    let pool = pool_of(&[backend.addr], PoolOptions::default());
    let checks = spawn_active_checks(pool.clone(), check(CheckKind::http("/")));
    wait_until("ten probes answered", || backend.answers.load(SeqCst) >= 10).await;
    assert!(backend.connections.load(SeqCst) >= 10);
    assert!(healthy(&pool, backend.addr));
    let report = checks.report();
    assert!(
        report
            .iter()
            .all(|r| r.failures == 0 && r.last_error.is_none()),
        "{report:?}"
    );
    // A one-off probe (readiness) asks for the connection to close, and passes.
    assert!(
        probe(backend.addr, &CheckKind::http("/"), Duration::from_secs(1))
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn probe_reports_why() {
    let t = Duration::from_millis(200);
    let http = CheckKind::http("/");
    let ok = Backend::start(OK).await;
    assert!(probe(ok.addr, &http, t).await.is_ok());

    let expect_204 = CheckKind::Http {
        path: "/".into(),
        expect: StatusRange::exact(204),
    };
    assert!(matches!(
        probe(ok.addr, &expect_204, t).await,
        Err(ProbeError::Status(200))
    ));

    ok.set(ERROR);
    let e = probe(ok.addr, &http, t).await.unwrap_err();
    assert_eq!(e.to_string(), "status 500");
    ok.set(GARBAGE);
    let e = probe(ok.addr, &http, t).await.unwrap_err();
    assert_eq!(e.to_string(), "malformed status line");
    ok.set(CUT);
    let e = probe(ok.addr, &http, t).await.unwrap_err();
    assert!(matches!(e, ProbeError::Closed), "{e}");
    ok.set(HANG);
    let e = probe(ok.addr, &http, t).await.unwrap_err();
    assert_eq!(e.to_string(), "timeout after 200ms");
    // A TCP check passes on a hung backend: it only proves the port is open.
    assert!(probe(ok.addr, &CheckKind::Tcp, t).await.is_ok());

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let closed = listener.local_addr().unwrap();
    drop(listener);
    let e = probe(closed, &CheckKind::Tcp, t).await.unwrap_err();
    assert_eq!(e.to_string(), "connection refused");
}

/// A server that answers `+PONG` to `PING` (as redis does), `-ERR` to anything else, and
/// greets nobody.
async fn pong_server() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut buf = [0u8; 64];
                let Ok(n) = s.read(&mut buf).await else {
                    return;
                };
                let answer: &[u8] = if buf[..n].starts_with(b"PING\r\n") {
                    b"+PONG\r\n"
                } else {
                    b"-ERR unknown\r\n"
                };
                let _ = s.write_all(answer).await;
            });
        }
    });
    addr
}

#[tokio::test]
async fn a_tcp_exchange_passes_only_on_the_expected_answer() {
    let t = Duration::from_millis(300);
    let addr = pong_server().await;
    let ping = |send: &[u8], receive: &[u8]| CheckKind::TcpExchange {
        send: send.into(),
        receive: receive.into(),
    };
    assert!(probe(addr, &ping(b"PING\r\n", b"+PONG"), t).await.is_ok());
    // The answer's start is named, so a log says what came instead.
    let e = probe(addr, &ping(b"HELLO\r\n", b"+PONG"), t)
        .await
        .unwrap_err();
    assert_eq!(e.to_string(), "unexpected answer \"-ERR unknown\\r\\n\"");
    // Nothing sent: the server waits for a command and never greets; the check times out.
    let e = probe(addr, &ping(b"", b"+PONG"), t).await.unwrap_err();
    assert_eq!(e.to_string(), "timeout after 300ms");
}
