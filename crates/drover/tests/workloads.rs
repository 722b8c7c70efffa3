//! Workloads the default balancing (p2c, `max_conns = "auto"`) must serve, each through
//! real sockets and real processes: I/O-bound backends that hold many requests at once,
//! bursts of slow requests, long-polls next to short requests, light sequential traffic,
//! a restarted worker, socket.io sessions over long-polling, sticky and hash picks next
//! to a concurrency limit, and `drover run`'s limit and queue flags.
//!
//! The tests assert behaviour (statuses, counts, which backend answered), never speed.
//! Where they wait on timers, the timers are seconds long and the margins wide, so a
//! noisy two-core machine gets the same answer as an idle one.
//!
//! The socket.io tests need `npm ci --prefix crates/drover/tests/fixtures/workloads/socketio`
//! first (scripts/test runs it).

mod common;

use common::{addrs, admin_addr, backends, bin, pi_server, proxy, status};
use drover_admin::WorkerRow;
use drover_testkit::{spawn_ready_line, wait_until, Backend, ChildProcess, DroverProcess};
use drover_testkit::{HttpClient, Response};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

/// A file under `tests/fixtures/workloads/`, as an absolute path.
fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/workloads")
        .join(name)
        .display()
        .to_string()
}

/// The Node timer server: `/sleep/MS` waits MS ms on a timer (no CPU), `x-worker` names
/// the worker (see the comment at the top of fixtures/workloads/timer-server.js).
fn timer_server() -> String {
    fixture("timer-server.js")
}

/// One GET on its own connection; `Err` carries the I/O error as text.
fn get_on_new_connection(
    addr: SocketAddr,
    path: String,
    headers: Vec<(String, String)>,
    limit: Duration,
) -> JoinHandle<Result<Response, String>> {
    tokio::spawn(async move {
        let mut c = HttpClient::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        c.set_timeout(limit);
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        c.request("GET", &path, &headers, None)
            .await
            .map_err(|e| e.to_string())
    })
}

/// "200" for a success, else the status and `drover-error`, or the I/O error: what a
/// failure message shows.
fn outcome(r: &Result<Response, String>) -> String {
    match r {
        Ok(r) if r.status == 200 => "200".into(),
        Ok(r) => format!(
            "{} {}",
            r.status,
            r.header("drover-error").unwrap_or("(no drover-error)")
        ),
        Err(e) => e.clone(),
    }
}

/// How many times each outcome occurred, e.g. `{"200": 24, "503 queue-timeout": 26}`.
fn tally<'a>(
    outcomes: impl IntoIterator<Item = &'a Result<Response, String>>,
) -> BTreeMap<String, usize> {
    let mut t = BTreeMap::new();
    for o in outcomes {
        *t.entry(outcome(o)).or_insert(0) += 1;
    }
    t
}

async fn join_all<T>(tasks: Vec<JoinHandle<T>>) -> Vec<T> {
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("request task panicked"));
    }
    out
}

/// Requests in flight at the in-process backends right now.
fn held(b: &[Backend]) -> u64 {
    b.iter().map(Backend::in_flight).sum()
}

/// `drover run` on free ports (balancer and admin API), one serving thread, plus `extra`
/// flags, running `cmd`. Returns drover and its admin address.
async fn run(workers: &str, extra: &[&str], cmd: &[&str]) -> (DroverProcess, SocketAddr) {
    let mut args = vec![
        "run",
        "-w",
        workers,
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "-t",
        "1",
    ];
    args.extend_from_slice(extra);
    args.push("--");
    args.extend_from_slice(cmd);
    let d = DroverProcess::spawn(bin(), &args).await;
    let admin = admin_addr(&d).await;
    (d, admin)
}

/// Waits (30 s at most) until the app has `n` workers, all ready, and the balancer has
/// `n` available endpoints; returns the workers.
async fn all_ready(d: &DroverProcess, admin: SocketAddr, n: usize) -> Vec<WorkerRow> {
    let mut last = None;
    for _ in 0..300 {
        let s = status(admin).await;
        let ws = &s.apps[0].workers;
        let available = s
            .balancers
            .first()
            .map_or(n, |b| b.endpoints.iter().filter(|e| e.available).count());
        if ws.len() == n && ws.iter().all(|w| w.state == "ready") && available == n {
            return ws.clone();
        }
        last = Some(s);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the {n} workers were never all ready and available: {last:#?}\n{}",
        d.stderr_text()
    );
}

/// Issue 10, failure 1: the learned limit started at 4 per backend, so a fresh drover
/// held back all but a few requests from a backend that waits on I/O and could take
/// them all at once. The limit must start off: every concurrent request reaches a
/// backend at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_bound_backend_gets_every_concurrent_request_at_once_from_a_fresh_start() {
    const N: u64 = 100;
    let b = backends(2).await;
    let d = proxy(&addrs(&b), &[]).await;
    // Each request waits 6 s at its backend: all 100 overlap there unless drover holds
    // some back, since sending 100 requests on loopback takes far less than that.
    let tasks: Vec<_> = (0..N)
        .map(|_| {
            get_on_new_connection(
                d.addr(),
                "/delay/6000".into(),
                vec![],
                Duration::from_secs(40),
            )
        })
        .collect();
    let mut most = 0;
    let all_at_once = wait_until(Duration::from_secs(5), || {
        most = most.max(held(&b));
        most == N
    })
    .await;
    let peaks: Vec<u64> = b.iter().map(Backend::max_in_flight).collect();
    let results = join_all(tasks).await;
    assert!(
        all_at_once,
        "a fresh drover should pass all {N} concurrent requests to two I/O-bound backends at \
         once, but they held at most {most} together (peak per backend {peaks:?}); \
         outcomes: {:?}",
        tally(&results)
    );
    assert_eq!(
        tally(&results),
        BTreeMap::from([("200".to_string(), N as usize)]),
        "every request should succeed"
    );
}

/// Issue 10, failure 2: a burst of slow I/O-bound requests through `drover run` queued
/// in drover behind the learned limit of 4 per worker and about half of them got
/// `503 queue-timeout` after 5 s, although the workers could have held them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_requests_in_a_burst_all_complete() {
    let server = timer_server();
    let (d, admin) = run("2", &[], &["node", &server]).await;
    all_ready(&d, admin, 2).await;
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            get_on_new_connection(
                d.addr(),
                "/sleep/2000".into(),
                vec![],
                Duration::from_secs(40),
            )
        })
        .collect();
    let results = join_all(tasks).await;
    assert_eq!(
        tally(&results),
        BTreeMap::from([("200".to_string(), 50)]),
        "50 concurrent 2 s requests over two I/O-bound workers should all succeed"
    );
}

/// Issue 10, failure 3: long-polls held the learned limit (and looked like queueing
/// inside the backend), so short requests waited in drover's queue behind them. The
/// short requests must be answered while the long-polls are still open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_do_not_hold_back_short_requests() {
    const LONG: usize = 40;
    const CONNS: usize = 20;
    const PER_CONN: usize = 20;
    let b = backends(2).await;
    let d = proxy(&addrs(&b), &[]).await;
    let addr = d.addr();

    // 40 long-polls of 12 s each, each on its own connection.
    let long_done = Arc::new(AtomicUsize::new(0));
    let long: Vec<JoinHandle<Result<Response, String>>> = (0..LONG)
        .map(|_| {
            let poll =
                get_on_new_connection(addr, "/delay/12000".into(), vec![], Duration::from_secs(40));
            let long_done = long_done.clone();
            tokio::spawn(async move {
                let r = poll.await.expect("long-poll task panicked");
                long_done.fetch_add(1, Ordering::SeqCst);
                r
            })
        })
        .collect();
    let mut most = 0;
    let all_open = wait_until(Duration::from_secs(5), || {
        most = most.max(held(&b));
        most == LONG as u64
    })
    .await;

    // Then 400 short requests (5 ms each) from 20 keep-alive connections. Each
    // connection stops at its first failure, so a broken drover fails fast.
    let short: Vec<JoinHandle<(usize, Vec<String>)>> = (0..CONNS)
        .map(|_| {
            tokio::spawn(async move {
                let mut c = match HttpClient::connect(addr).await {
                    Ok(c) => c,
                    Err(e) => return (0, vec![format!("connect: {e}")]),
                };
                c.set_timeout(Duration::from_secs(20));
                let mut ok = 0;
                for _ in 0..PER_CONN {
                    let r = c
                        .request("GET", "/delay/5", &[], None)
                        .await
                        .map_err(|e| e.to_string());
                    if matches!(&r, Ok(r) if r.status == 200) {
                        ok += 1;
                    } else {
                        return (ok, vec![outcome(&r)]);
                    }
                }
                (ok, Vec::new())
            })
        })
        .collect();
    let short = join_all(short).await;
    let long_done_before_short = long_done.load(Ordering::SeqCst);
    let short_ok: usize = short.iter().map(|(ok, _)| ok).sum();
    let short_failed: Vec<&String> = short.iter().flat_map(|(_, f)| f).collect();
    let long = join_all(long).await;

    assert!(
        all_open,
        "all {LONG} long-polls should reach a backend at once; at most {most} did \
         (long-poll outcomes {:?})",
        tally(&long)
    );
    assert!(
        short_failed.is_empty() && short_ok == CONNS * PER_CONN,
        "{short_ok} of {} short requests succeeded next to {LONG} open long-polls; \
         failures: {:?}",
        CONNS * PER_CONN,
        &short_failed[..short_failed.len().min(5)]
    );
    assert_eq!(
        long_done_before_short, 0,
        "the short requests should all be answered while the 12 s long-polls are open, \
         but {long_done_before_short} long-polls had returned first"
    );
    assert_eq!(
        tally(&long),
        BTreeMap::from([("200".to_string(), LONG)]),
        "every long-poll should succeed"
    );
}

/// The backends' shares of `seen` (one `x-backend` per request), and a failure message
/// unless each is within [1/(2N), 2/N] of the total.
fn spread_problem(seen: &[String], names: &[&str], what: &str) -> Option<String> {
    let total = seen.len();
    let n = names.len();
    let counts: BTreeMap<&str, usize> = names
        .iter()
        .map(|name| (*name, seen.iter().filter(|s| s == name).count()))
        .collect();
    let (low, high) = (total / (2 * n), 2 * total / n);
    counts
        .values()
        .any(|&c| c < low || c > high)
        .then(|| format!("{what}: {counts:?}, each should be in {low}..={high}"))
}

/// Issue 10, failure 4: with sequential traffic every backend is idle at each pick, and
/// the old tie-break (lowest latency estimate) sent nearly everything to one of them.
/// Idle backends take turns, so every backend gets its share.
#[tokio::test]
async fn light_sequential_traffic_reaches_every_backend() {
    let b = backends(3).await;
    let names = ["b0", "b1", "b2"];
    let d = proxy(&addrs(&b), &[]).await;
    let x_backend = |r: Response| {
        assert_eq!(r.status, 200, "{}", r.text());
        r.header("x-backend").unwrap().to_owned()
    };

    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let mut one_conn = Vec::new();
    for _ in 0..300 {
        one_conn.push(x_backend(c.get("/").await));
    }
    drop(c);
    let mut new_conns = Vec::new();
    for _ in 0..300 {
        let mut c = HttpClient::connect(d.addr()).await.unwrap();
        new_conns.push(x_backend(c.get("/").await));
    }

    let problems: Vec<String> = [
        spread_problem(
            &one_conn,
            &names,
            "300 sequential requests on one connection",
        ),
        spread_problem(
            &new_conns,
            &names,
            "300 sequential requests, a connection each",
        ),
    ]
    .into_iter()
    .flatten()
    .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Issue 10, failure 5: a worker that `drover run` restarted after `kill -9` got almost
/// no sequential traffic when the survivor won every tie on its latency estimate (or
/// took nearly all of it when it won them instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_worker_gets_its_share_of_sequential_requests() {
    let server = pi_server();
    let (d, admin) = run("2", &[], &["node", &server]).await;
    let before = all_ready(&d, admin, 2).await;
    let path = "/pi?iterations=1000";
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..50 {
        assert_eq!(c.get(path).await.status, 200);
    }

    let victim = &before[0];
    let victim_pid = victim.pid.unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &victim_pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success(), "kill -9 {victim_pid} failed");
    // Wait for its replacement: same worker id, a new pid, ready, in the pool, and past
    // its slow start. (A replacement joins a worker that has served, so it ramps, over
    // as long as the pool had served when it joined: a few seconds here. While it ramps
    // it gets less by design; it used to get nearly as much only because the survivor
    // was still ramping from the fresh start too.)
    let mut replaced = false;
    for _ in 0..300 {
        let s = status(admin).await;
        let available = s.balancers[0]
            .endpoints
            .iter()
            .filter(|e| e.available && e.ramp == 1.0)
            .count();
        replaced = available == 2
            && s.apps[0].workers.iter().any(|w| {
                w.id == victim.id && w.state == "ready" && w.pid.is_some_and(|p| p != victim_pid)
            });
        if replaced {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        replaced,
        "worker {} was not replaced: {:#?}\n{}",
        victim.id,
        status(admin).await,
        d.stderr_text()
    );

    // A new connection per request: a lone keep-alive connection would go to a worker
    // of its own after two requests (`auto`), and the balancer would place no more.
    let mut by_worker: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..200 {
        let mut c = HttpClient::connect(d.addr()).await.unwrap();
        let r = c.get(path).await;
        assert_eq!(r.status, 200, "{}", r.text());
        *by_worker
            .entry(r.header("x-worker").unwrap_or("?").to_owned())
            .or_insert(0) += 1;
    }
    // Idle workers take turns, so each gets about half; the
    // replacement must get at least 1/(2N), and so must the survivor (a replacement that
    // takes everything is the same fault the other way round).
    let replacement = by_worker.get(&victim.id.to_string()).copied().unwrap_or(0);
    let survivor = 200 - replacement;
    assert!(
        replacement >= 50 && survivor >= 50,
        "the replacement of worker {} and the survivor should each get at least 1/4 of \
         200 sequential requests; requests per worker: {by_worker:?}",
        victim.id
    );
}

/// Under `drover run` a keep-alive connection's next request goes to the worker that
/// answered its last (Node's cluster module never moves a connection), and each such
/// request counted a turn of that worker's among idle ones. One client's run of 400
/// requests put that worker 400 turns behind, and the next 800 new connections, one at
/// a time, went to the other two while it stood idle (the same after a reload made the
/// CI run of `a_pm2_ecosystem_file_runs_its_apps_as_pm2_runs_them` fail). The run now
/// counts as one turn.
#[tokio::test]
async fn a_keep_alive_clients_run_does_not_keep_new_connections_from_its_worker() {
    let server = pi_server();
    let (d, admin) = run("3", &["--mode", "proxy"], &["node", &server]).await;
    all_ready(&d, admin, 3).await;
    let worker = |r: Response| {
        assert_eq!(r.status, 200, "{}\n{}", r.text(), d.stderr_text());
        r.header("x-worker").unwrap_or("?").to_owned()
    };
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let mut one_conn = BTreeSet::new();
    for _ in 0..400 {
        one_conn.insert(worker(c.get("/").await));
    }
    assert_eq!(one_conn.len(), 1, "one connection stays on one worker");
    drop(c);
    let mut new_conns = BTreeMap::new();
    for _ in 0..30 {
        let mut c = HttpClient::connect(d.addr()).await.unwrap();
        *new_conns.entry(worker(c.get("/").await)).or_insert(0) += 1;
    }
    assert_eq!(
        new_conns.len(),
        3,
        "30 new connections one at a time, after one client's 400 requests on {one_conn:?}, \
         should reach all 3 idle workers: {new_conns:?}"
    );
}

/// The socket.io fixture (`npm ci` installs it), or a panic saying how to install it.
fn socketio_dir() -> PathBuf {
    let dir = PathBuf::from(fixture("socketio"));
    let installed = [
        "socket.io",
        "socket.io-client",
        "@socket.io/cluster-adapter",
        "@socket.io/sticky",
        "sticky-session",
    ]
    .iter()
    .all(|p| {
        dir.join("node_modules")
            .join(p)
            .join("package.json")
            .exists()
    });
    assert!(
        installed,
        "the socket.io fixture is not installed: run `npm ci --prefix {}` (scripts/test does)",
        dir.display()
    );
    dir
}

/// `node CLIENT http://ADDR ARGS...` of the socket.io fixture's clients, within 50 s.
async fn socketio_client(client: &str, addr: SocketAddr, args: &[String]) -> std::process::Output {
    let run = tokio::process::Command::new("node")
        .arg(socketio_dir().join(client))
        .arg(format!("http://{addr}"))
        .args(args)
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(Duration::from_secs(50), run)
        .await
        .unwrap_or_else(|_| panic!("the socket.io fixture's {client} did not finish within 50 s"))
        .expect("run node")
}

/// Runs `sessions` socket.io-client sessions at once against `addr` (long-polling only,
/// 20 messages each, see fixtures/workloads/socketio/client.js) and returns one failure
/// text per session that did not complete on a single worker.
async fn socketio_sessions(addr: SocketAddr, sessions: usize) -> Vec<String> {
    let args = [sessions.to_string(), "20".into()];
    let out = socketio_client("client.js", addr, &args).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "socket.io client failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), sessions, "one line per session:\n{stdout}");
    lines
        .iter()
        .filter(|s| {
            let errors = s["errors"].as_array().map_or(1, Vec::len);
            let workers = s["workers"].as_array().map_or(0, Vec::len);
            errors > 0 || s["acks"] != 20 || workers != 1
        })
        .map(|s| {
            let no_cookie = s["cookies"].as_array().is_none_or(Vec::is_empty);
            let why = if no_cookie {
                "(no sticky cookie was set) "
            } else {
                ""
            };
            format!("{why}{s}")
        })
        .collect()
}

/// Two rounds of 6 concurrent sessions (the second meets whatever the first taught the
/// balancer); every session must complete with all its acks from one worker.
async fn assert_socketio_sessions_survive(addr: SocketAddr, how: &str, log: impl Fn() -> String) {
    let mut failed = Vec::new();
    for round in 1..=2 {
        for f in socketio_sessions(addr, 6).await {
            failed.push(format!("round {round}: {f}"));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 12 socket.io long-polling sessions through {how} broke (each should get \
         20 acks from one worker, with no `Session ID unknown` 400):\n{}\n--- drover ---\n{}",
        failed.len(),
        failed.join("\n"),
        log()
    );
}

/// Issue 10, failure 6 (`drover run`): socket.io over long-polling needs every request
/// of a session on the worker that holds it. A session holds a GET open while it POSTs,
/// and the learned limit moved sticky requests to another worker, which answered
/// `400 Session ID unknown`; under `drover run` the sticky cookie was not even set.
/// Since then, the default strategy keeps them there too, by the session id drover
/// reads from each session's handshake (`engine_io` in drover-proxy): an app run as
/// written, which Node's cluster module and PM2 break the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_io_polling_sessions_survive_the_default_strategy_and_sticky() {
    let dir = socketio_dir();
    let server = dir.join("server.js").display().to_string();
    for extra in [&[][..], &["--strategy", "sticky"]] {
        let (d, admin) = run("3", extra, &["node", &server]).await;
        all_ready(&d, admin, 3).await;
        let how = format!("drover run -w 3 {}", extra.join(" "));
        assert_socketio_sessions_survive(d.addr(), &how, || d.stderr_text()).await;
    }
}

/// socket.io's cluster adapter (`io.adapter(createAdapter())`, no primary code): drover
/// relays its messages between the app's workers, as Node's primary does with
/// `setupPrimary()`, so a broadcast reaches the clients of every worker. Before, only
/// those on the shouting worker heard it (2 of 6 here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_io_broadcasts_reach_the_clients_of_every_worker_through_the_cluster_adapter() {
    let dir = socketio_dir();
    let server = dir.join("adapter-server.js").display().to_string();
    let (d, admin) = run("3", &[], &["node", &server]).await;
    all_ready(&d, admin, 3).await;
    assert_broadcast_reaches_every_client(&d).await;
}

/// 6 clients of the fixture's broadcast-client.js over WebSockets: they must be held by
/// several workers, and every one must hear the first one's shout.
async fn assert_broadcast_reaches_every_client(d: &DroverProcess) {
    let out = socketio_client("broadcast-client.js", d.addr(), &["6".into()]).await;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!(
            "{e}: {stdout}\n{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            d.stderr_text()
        )
    });
    let workers: BTreeSet<&str> = line["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|w| w.as_str())
        .collect();
    assert!(
        workers.len() >= 2 && workers.iter().all(|w| !w.starts_with("error")),
        "the clients should be on several workers: {line}"
    );
    assert!(
        line["heard"].as_array().unwrap().iter().all(|h| h == true),
        "every client should hear the broadcast, on whichever worker: {line}\n{}",
        d.stderr_text()
    );
}

/// socket.io's guide to Node's cluster module, as it writes the app
/// (fixtures/workloads/socketio/guide-server.js): its primary listens and hands each
/// connection to a worker (@socket.io/sticky's `setupMaster`), and each worker's server
/// listens on no port (`setupWorker`). As drover's worker the app runs its worker code
/// alone, so no worker ever listened, and drover restarted all three for never being
/// ready, as PM2 does. Now drover's preload has setupWorker's server listen, and drover
/// does the primary's part: long-polling sessions complete on one worker each, a
/// broadcast reaches the clients of every worker, and no worker was restarted. (Under
/// its own primary, `node guide-server.js`, all 6 sessions of one run went to one worker.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_io_app_written_for_its_own_sticky_primary_serves_as_written() {
    let (d, admin, first) = sticky_app("guide-server.js").await;
    // setupWorker's `Connection: close` on every answer is taken off: drover routes
    // each request, and would open a connection to the worker for each one.
    let port = first[0].port.expect("a worker's port");
    let handshake = "/socket.io/?EIO=4&transport=polling";
    let r = common::examples::try_get(SocketAddr::from(([127, 0, 0, 1], port)), handshake)
        .await
        .unwrap_or_else(|e| panic!("GET {handshake} at worker 0: {e}\n{}", d.stderr_text()));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_ne!(r.header("connection"), Some("close"), "{r:?}");
    let how = "drover run -w 3 -- node guide-server.js";
    assert_socketio_sessions_survive(d.addr(), how, || d.stderr_text()).await;
    // The 12 sessions, each kept on its worker, on more than one (the broadcast's 6
    // clients come over WebSockets, with no session to pin).
    let metrics = common::metrics_text(admin).await;
    let kept: Vec<u64> = metrics
        .lines()
        .filter(|l| l.starts_with("drover_endpoint_sessions{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(kept.len(), 3, "{metrics}");
    assert_eq!(kept.iter().sum::<u64>(), 12, "{kept:?}");
    assert!(kept.iter().filter(|&&n| n > 0).count() >= 2, "{kept:?}");
    assert_broadcast_reaches_every_client(&d).await;
    assert_no_worker_replaced(&d, admin, &first).await;
}

/// The older way (fixtures/workloads/socketio/sticky-session-server.js, as
/// sticky-session's README writes it): `sticky.listen(server, port)` is true in a worker,
/// which listens on no port, since its primary would pass it connections. Under drover
/// the worker listens where `sticky.listen` says, and its sessions complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_io_app_written_for_sticky_session_serves_as_written() {
    let (d, admin, first) = sticky_app("sticky-session-server.js").await;
    let how = "drover run -w 3 -- node sticky-session-server.js";
    assert_socketio_sessions_survive(d.addr(), how, || d.stderr_text()).await;
    assert_no_worker_replaced(&d, admin, &first).await;
}

/// The same app run as `node app.js` runs it, in `--mode shared` (or `background`):
/// drover's worker is no cluster worker, so the app's own primary serves and forks its
/// workers, whose channel is that primary's, not drover's. drover's preload leaves their
/// setupWorker alone, and they take what their primary passes them: before, each also
/// listened on a random port through the app's primary, and drover said its worker
/// "listens on [::]:PORT itself".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_io_app_run_with_its_own_primary_keeps_its_workers_as_they_are() {
    let server = socketio_dir().join("guide-server.js").display().to_string();
    let args = [
        "run",
        "--mode",
        "shared",
        "-w",
        "1",
        "-l",
        "127.0.0.1:0",
        "--admin",
        "off",
        "--",
        "node",
        &server,
    ];
    let d = DroverProcess::spawn(bin(), &args).await;
    let started = || d.stderr_text().matches("Worker ").count() >= 2;
    assert!(
        wait_until(Duration::from_secs(20), started).await,
        "the app's primary should fork 2 workers:\n{}",
        d.stderr_text()
    );
    let failed = socketio_sessions(d.addr(), 4).await;
    assert!(failed.is_empty(), "{failed:?}\n{}", d.stderr_text());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !d.stderr_text().contains("itself"),
        "the app's own workers should listen nowhere:\n{}",
        d.stderr_text()
    );
}

/// `drover run -w 3` of the socket.io fixture `app`, once its 3 workers are ready.
async fn sticky_app(app: &str) -> (DroverProcess, SocketAddr, Vec<WorkerRow>) {
    let server = socketio_dir().join(app).display().to_string();
    let (d, admin) = run("3", &[], &["node", &server]).await;
    let first = all_ready(&d, admin, 3).await;
    (d, admin, first)
}

async fn assert_no_worker_replaced(d: &DroverProcess, admin: SocketAddr, first: &[WorkerRow]) {
    let workers = all_ready(d, admin, 3).await;
    let pids = |ws: &[WorkerRow]| ws.iter().map(|w| w.pid).collect::<BTreeSet<_>>();
    assert_eq!(
        pids(first),
        pids(&workers),
        "no worker should have been replaced: {workers:#?}\n{}",
        d.stderr_text()
    );
}

/// A socket.io app drover's preload cannot see into (bundled, or as here, its packages
/// loaded through `NODE_PATH` rather than from `node_modules/engine.io/`) gets client
/// connections handed to its workers under `auto`, like any app, until the balancer sees
/// its first socket.io request: from then on it hands none, as a session's requests
/// must all pass drover to reach the worker that holds the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_the_balancer_sees_socket_io_it_hands_no_more_connections_to_workers() {
    let dir = socketio_dir();
    let tmp = common::temp_dir("socketio-vendored");
    let copied = std::process::Command::new("cp")
        .arg("-r")
        .arg(dir.join("node_modules"))
        .arg(tmp.join("vendor"))
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::create_dir_all(tmp.join("app")).unwrap();
    let server = tmp.join("app/server.js");
    std::fs::copy(dir.join("server.js"), &server).unwrap();
    let mut cmd = std::process::Command::new(bin());
    cmd.args([
        "run",
        "-w",
        "3",
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ])
    .args(["--", "node"])
    .arg(&server)
    .env("NODE_PATH", tmp.join("vendor"))
    .env_remove("PORT");
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    all_ready(&d, admin, 3).await;
    let handoffs = || common::default_metric(admin, "drover_handoffs_total");

    // Light traffic on a keep-alive connection: handed to a worker after its second
    // request.
    let mut first = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..2 {
        assert_eq!(first.get("/health").await.status, 200);
    }
    let mut handed = 0;
    for _ in 0..100 {
        handed = handoffs().await;
        if handed > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        handed > 0,
        "no connection was handed over before socket.io was seen, so this shows nothing"
    );

    // A socket.io handshake, then another keep-alive connection as the first was.
    let mut handshake = HttpClient::connect(d.addr()).await.unwrap();
    let answer = handshake
        .get("/socket.io/?EIO=4&transport=polling&t=x")
        .await;
    assert!(answer.text().contains("\"sid\""), "{}", answer.text());
    let mut next = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..4 {
        assert_eq!(next.get("/health").await.status, 200);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        handoffs().await,
        handed,
        "a connection was handed to a worker after the balancer saw socket.io"
    );
    // The first connection, given back, is served through drover.
    assert_eq!(first.get("/health").await.status, 200);
}

/// The same sessions through `drover proxy` over three socket.io processes, with
/// round-robin (a pin holds under any strategy) and with `sticky`, whose pick must
/// hold while the worker is busy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_io_polling_sessions_survive_round_robin_and_sticky_behind_drover_proxy() {
    let dir = socketio_dir();
    let mut servers: Vec<ChildProcess> = Vec::new();
    for i in 0..3 {
        let mut cmd = std::process::Command::new("node");
        cmd.arg(dir.join("server.js"))
            .env("PORT", "0")
            .env("DROVER_WORKER_ID", format!("s{i}"));
        servers.push(spawn_ready_line(cmd, "listening on ").await);
    }
    let backends: Vec<SocketAddr> = servers.iter().map(ChildProcess::addr).collect();
    for strategy in ["round-robin", "sticky"] {
        let d = proxy(&backends, &["--strategy", strategy]).await;
        let how = format!("drover proxy --strategy {strategy}");
        assert_socketio_sessions_survive(d.addr(), &how, || d.stderr_text()).await;
    }
}

/// Pins a client to one backend with `pin` headers, makes that backend hold a slow
/// request (its one slot under `--max-conns 1`), then sends another pinned request: it
/// must wait for the pinned backend, never go to the other one.
async fn assert_pinned_request_waits(
    b: &[Backend],
    addr: SocketAddr,
    pin: Vec<(String, String)>,
    what: &str,
) {
    let slow = get_on_new_connection(
        addr,
        "/delay/2500".into(),
        pin.clone(),
        Duration::from_secs(30),
    );
    let mut owner = None;
    let busy = wait_until(Duration::from_secs(5), || {
        owner = b.iter().position(|x| x.in_flight() == 1);
        owner.is_some()
    })
    .await;
    assert!(busy, "{what}: the slow request never reached a backend");
    let owner = b[owner.unwrap()].name().to_owned();
    let second = get_on_new_connection(addr, "/".into(), pin, Duration::from_secs(30))
        .await
        .unwrap();
    let slow = slow.await.unwrap();
    assert_eq!(
        slow.as_ref().ok().and_then(|r| r.header("x-backend")),
        Some(owner.as_str()),
        "{what}: the slow request ({})",
        outcome(&slow)
    );
    assert_eq!(
        second
            .as_ref()
            .ok()
            .map(|r| (r.status, r.header("x-backend").map(str::to_owned))),
        Some((200, Some(owner.clone()))),
        "{what}: a request pinned to {owner} while {owner} is at its limit should wait for \
         it and be answered by it ({})",
        outcome(&second)
    );
}

/// Issue 10, failure 7: at an endpoint's limit, sticky and hash picks fell back to
/// another endpoint, breaking the affinity they exist for. While their backend is up
/// they must wait for it (in drover's queue) instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_and_sticky_picks_are_never_moved_by_the_limit() {
    // sticky: the first answer sets the cookie that pins the client.
    let b = backends(2).await;
    let d = proxy(
        &addrs(&b),
        &[
            "--strategy",
            "sticky",
            "--max-conns",
            "1",
            "--queue-timeout",
            "20s",
        ],
    )
    .await;
    let first = HttpClient::connect(d.addr()).await.unwrap().get("/").await;
    let cookie = first
        .header("set-cookie")
        .expect("sticky sets a cookie")
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    assert_pinned_request_waits(
        &b,
        d.addr(),
        vec![("cookie".into(), cookie)],
        "sticky --max-conns 1",
    )
    .await;

    // hash: a key names one backend.
    let b = backends(2).await;
    let d = proxy(
        &addrs(&b),
        &[
            "--strategy",
            "hash",
            "--hash-key",
            "header:x-user",
            "--max-conns",
            "1",
            "--queue-timeout",
            "20s",
        ],
    )
    .await;
    assert_pinned_request_waits(
        &b,
        d.addr(),
        vec![("x-user".into(), "user-7".into())],
        "hash --max-conns 1",
    )
    .await;
}

/// Runs `drover run ARGS -- true` (no admin API) and returns its exit code and stderr.
async fn run_fails(args: &[&str]) -> (Option<i32>, String) {
    let out = tokio::process::Command::new(bin())
        .args(["run", "-w", "1", "-l", "127.0.0.1:0", "--admin", "off"])
        .args(args)
        .args(["--", "true"])
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("drover run with a bad flag should exit at once")
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Issue 10, item 5: `drover run` takes `--max-conns`, `--queue-max` and
/// `--queue-timeout` as `drover proxy` does, and they apply to its balancer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drover_run_accepts_limit_and_queue_flags() {
    let flags = [
        "--max-conns",
        "1",
        "--queue-max",
        "1",
        "--queue-timeout",
        "1s",
    ];

    // It starts and serves.
    let server = pi_server();
    let (d, admin) = run("1", &flags, &["node", &server]).await;
    all_ready(&d, admin, 1).await;
    let r = HttpClient::connect(d.addr())
        .await
        .unwrap()
        .get("/pi?iterations=1000")
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    drop(d);

    // The flags apply: one request in the worker, one in the queue (which gives up
    // after 1 s), and a third finds the queue full.
    let server = timer_server();
    let (d, admin) = run("1", &flags, &["node", &server]).await;
    all_ready(&d, admin, 1).await;
    let held = get_on_new_connection(
        d.addr(),
        "/sleep/5000".into(),
        vec![],
        Duration::from_secs(30),
    );
    let mut in_worker = false;
    for _ in 0..100 {
        let s = status(admin).await;
        in_worker = s.balancers[0]
            .endpoints
            .iter()
            .map(|e| e.in_flight)
            .sum::<u32>()
            == 1;
        if in_worker {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(in_worker, "the first request never reached the worker");
    let queued = get_on_new_connection(
        d.addr(),
        "/sleep/10".into(),
        vec![],
        Duration::from_secs(30),
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let refused = get_on_new_connection(
        d.addr(),
        "/sleep/10".into(),
        vec![],
        Duration::from_secs(30),
    );
    let (held, queued, refused) = (
        held.await.unwrap(),
        queued.await.unwrap(),
        refused.await.unwrap(),
    );
    assert_eq!(
        [outcome(&held), outcome(&queued), outcome(&refused)],
        ["200", "503 queue-timeout", "503 queue-full"],
        "with --max-conns 1 --queue-max 1 --queue-timeout 1s: the first request holds the \
         worker for 5 s, the second waits 1 s in the queue, the third finds it full"
    );

    // Bad values exit non-zero with an error naming the flag.
    for (bad, flag) in [
        ("--max-conns=-1", "--max-conns"),
        ("--max-conns=lots", "--max-conns"),
        ("--queue-max=many", "--queue-max"),
        ("--queue-timeout=xyz", "--queue-timeout"),
    ] {
        let (code, stderr) = run_fails(&[bad]).await;
        assert!(
            code.is_some_and(|c| c != 0)
                && stderr.contains(flag)
                && !stderr.contains("unexpected argument"),
            "drover run {bad} should fail with an error naming {flag}: exit {code:?}, {stderr}"
        );
    }
}
