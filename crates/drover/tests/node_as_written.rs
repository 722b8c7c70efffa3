//! Node apps as their authors wrote them (examples/as-written/): a port from argv, a
//! hard-coded port, Express's `app.listen(3000)`, an ES module, and pi-server.js, which
//! reads PORT. Each runs unchanged under `drover run -w 3`, on every Node of
//! `node_binaries` (the machine's and Debian's 18), and every worker answers through
//! drover's listen address: drover is their cluster primary (drover-node).
//!
//! Then what it takes from the app's listen() beyond one port (a helper on port 0, UDP, a
//! second port and a Unix socket its workers share), where it cannot apply and says so
//! (a program that is not Node and ignores PORT), and workers killed, reloaded and scaled
//! under load.

mod common;

use common::examples::{clean_env, drover_stops_cleanly, get};
use common::{
    admin_addr, alive, assert_load_never_failed, bin, ctl, node_binaries, pi_server,
    restart_records, status, steady_load, temp_dir, wait_all_serving,
};
use drover_testkit::{spawn_ready_line, wait_until_async, ChildProcess};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

fn as_written(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/as-written")
        .join(file)
        .canonicalize()
        .unwrap()
}

fn fixture(file: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/node_as_written")
        .join(file)
        .display()
        .to_string()
}

/// `drover run -w WORKERS` of `command` in `cwd`, round-robin (so a few requests reach
/// every worker), once every worker serves. Returns drover and its admin address.
async fn run(workers: usize, command: &[String], cwd: &Path) -> (ChildProcess, SocketAddr) {
    run_within(workers, command, cwd, Duration::from_secs(20)).await
}

/// [`run`], waiting up to `limit` for every worker to serve: for apps compiled or built
/// before they listen.
async fn run_within(
    workers: usize,
    command: &[String],
    cwd: &Path,
    limit: Duration,
) -> (ChildProcess, SocketAddr) {
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-w", &workers.to_string()])
        .args(
            "--listen 127.0.0.1:0 --admin 127.0.0.1:0 --threads 1 --strategy round-robin --"
                .split(' '),
        )
        .args(command)
        .current_dir(cwd);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    common::wait_all_serving_within(&d, admin, limit).await;
    (d, admin)
}

/// `drover run -w WORKERS -- node SCRIPT` in `cwd`, with no `--listen` (clients connect
/// where the app's `listen()` says), once every worker serves.
async fn run_as_written(workers: usize, script: &str, cwd: &Path) -> (ChildProcess, SocketAddr) {
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "-w",
        &workers.to_string(),
        "--admin",
        "127.0.0.1:0",
        "--",
        "node",
        script,
    ])
    .current_dir(cwd);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    // Its balancer binds the app's port: nothing is unserved (`drover up`'s warning for
    // an app with no [[balancer]] once said so here too).
    assert!(
        !d.stderr_text().contains("no [[balancer]] is in front"),
        "{}",
        d.stderr_text()
    );
    (d, admin)
}

/// Asks `/` on new connections until every serving worker's pid was in an answer.
async fn every_worker_answers(who: &str, d: &ChildProcess, admin: SocketAddr) {
    let pids: BTreeSet<String> = common::serving_pids(&status(admin).await)
        .into_iter()
        .map(|p| p.unwrap().to_string())
        .collect();
    let mut answered = BTreeSet::new();
    for _ in 0..30 {
        let r = common::examples::try_get(d.addr(), "/")
            .await
            .unwrap_or_else(|e| panic!("{who}: GET /: {e}\n{}", d.stderr_text()));
        let body = r.text();
        assert_eq!(r.status, 200, "{who}: {body}\n{}", d.stderr_text());
        answered.extend(pids.iter().filter(|p| body.contains(p.as_str())).cloned());
        if answered == pids {
            return;
        }
    }
    panic!(
        "{who}: workers {pids:?}, answers from {answered:?}\n{}",
        d.stderr_text()
    );
}

/// `drover run --admin off WORDS` in `dir` fails before it starts anything, saying
/// `needle`.
fn run_is_refused(dir: &Path, words: &[&str], needle: &str) {
    let out = Command::new(bin())
        .args(["run", "--admin", "off"])
        .args(words)
        .current_dir(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{words:?}: {err}");
    assert!(err.contains(needle), "{words:?}: {needle:?} in {err}");
    assert!(!err.contains("starting"), "{words:?}: {err}");
}

/// Waits for every line of `needles` in drover's output (its own log and the workers').
async fn says(who: &str, d: &ChildProcess, needles: &[&str]) {
    for needle in needles {
        assert!(
            d.wait_for_line(needle, Duration::from_secs(10))
                .await
                .is_some(),
            "{who}: no line with {needle:?}\n{}",
            d.stderr_text()
        );
    }
}

/// The pids of the serving workers, from a status in which every worker serves.
async fn serving(d: &ChildProcess, admin: SocketAddr) -> BTreeSet<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let pids = common::serving_pids(&status(admin).await);
        if !pids.is_empty() && pids.iter().all(Option::is_some) {
            return pids.into_iter().flatten().map(|p| p.to_string()).collect();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every worker serves: {pids:?}\n{}",
            d.stderr_text()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `drover ctl reload`, once every worker of `before` has been replaced; the new pids.
async fn reloaded(
    who: &str,
    d: &ChildProcess,
    admin: SocketAddr,
    before: &BTreeSet<String>,
) -> BTreeSet<String> {
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{who}: {out}{err}\n{}", d.stderr_text());
    let after = serving(d, admin).await;
    assert!(after.is_disjoint(before), "{who}: {after:?} {before:?}");
    after
}

/// Requests one at a time, each on a new connection, until `stop`: how many got a 200,
/// and what the others got. Paced: the tests that run alongside need the cores too.
fn paced_requests<F, Fut>(
    stop: Arc<AtomicBool>,
    ask: F,
) -> tokio::task::JoinHandle<(usize, Vec<String>)>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<(u16, String), String>> + Send,
{
    tokio::spawn(async move {
        let (mut ok, mut failed) = (0, Vec::new());
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match ask().await {
                Ok((200, _)) => ok += 1,
                Ok((status, body)) => failed.push(format!("{status} {body}")),
                Err(e) => failed.push(e),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        (ok, failed)
    })
}

/// The apps of examples/as-written that listen on a port they name, run by `node`: (what
/// each is, its command, where it runs).
fn apps_naming_their_port(
    node: &str,
    dir: &Path,
    express: &Path,
) -> [(&'static str, Vec<String>, PathBuf); 4] {
    let node = node.to_string();
    [
        (
            "port from argv, given",
            vec![node.clone(), "argv-port.js".into(), "4001".into()],
            dir.to_path_buf(),
        ),
        (
            "hard-coded port",
            vec![node.clone(), "hard-coded.js".into()],
            dir.to_path_buf(),
        ),
        (
            "ES module, fixed host and port",
            vec![node.clone(), "esm.mjs".into()],
            dir.to_path_buf(),
        ),
        (
            "Express app.listen(3000)",
            vec![node, "app.js".into()],
            express.to_path_buf(),
        ),
    ]
}

#[tokio::test]
async fn apps_as_written_run_unchanged_as_three_workers_on_every_node() {
    let dir = as_written(".");
    let express = as_written("express");
    assert!(
        express.join("node_modules/express").exists(),
        "run `npm ci --prefix examples/as-written/express` (scripts/test does)"
    );
    for (name, node) in node_binaries() {
        let node = node.display().to_string();
        let mut cases = vec![
            (
                "port from argv, its default",
                vec![node.clone(), "argv-port.js".into()],
                dir.clone(),
            ),
            ("reads PORT", vec![node.clone(), pi_server()], dir.clone()),
        ];
        cases.extend(apps_naming_their_port(&node, &dir, &express));
        for (what, command, cwd) in cases {
            let who = format!("{name}: {what}");
            let (d, admin) = run(3, &command, &cwd).await;
            every_worker_answers(&who, &d, admin).await;
            drover_stops_cleanly(&who, &d).await;
        }
    }
    // `node --env-file` (Node 20.6 and later: the machine's own), the port from the file.
    let env_dir = temp_dir("env-file");
    std::fs::write(env_dir.join(".env"), "GREETING=from-env-file\n").unwrap();
    std::fs::write(
        env_dir.join("app.js"),
        "require('http').createServer((q, s) => s.end(`${process.env.GREETING} ${process.pid}`)).listen(5000);\n",
    )
    .unwrap();
    let env_file = vec![
        "node".to_string(),
        "--env-file=.env".to_string(),
        "app.js".to_string(),
    ];
    let (d, admin) = run(2, &env_file, &env_dir).await;
    every_worker_answers("node --env-file", &d, admin).await;
    assert!(get(d.addr(), "/")
        .await
        .text()
        .starts_with("from-env-file "));
    drover_stops_cleanly("node --env-file", &d).await;

    // `npm start` (the Express example's script is `node app.js`): npm is a Node
    // process itself, and the app below it is the worker, through a preload.
    let npm = vec!["npm".to_string(), "start".to_string()];
    let (d, _) = run(2, &npm, &express).await;
    for _ in 0..4 {
        let r = get(d.addr(), "/").await;
        assert!(
            r.text().starts_with("Hello World from Express"),
            "{}\n{}",
            r.text(),
            d.stderr_text()
        );
    }
    drover_stops_cleanly("npm start", &d).await;

    // Through a shell, as `sh -c` wrappers and npm scripts run node: node is the
    // worker's child here, so its pid is not the worker's; the answers come from it.
    let shell = vec![
        "sh".to_string(),
        "-c".to_string(),
        "node hard-coded.js; exit".to_string(),
    ];
    let (d, _) = run(2, &shell, &dir).await;
    for _ in 0..4 {
        let r = get(d.addr(), "/").await;
        assert!(
            r.text().starts_with("Hello from server1"),
            "{}\n{}",
            r.text(),
            d.stderr_text()
        );
    }
    drover_stops_cleanly("sh -c", &d).await;
}

#[tokio::test]
async fn a_listen_on_any_port_and_udp_get_sockets_of_their_own() {
    let (d, admin) = run(
        2,
        &["node".into(), fixture("any-port.js")],
        &temp_dir("any-port"),
    )
    .await;
    let workers: BTreeSet<u16> = status(admin).await.apps[0]
        .workers
        .iter()
        .filter_map(|w| w.port)
        .collect();
    let r = get(d.addr(), "/").await;
    let summary: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    assert_eq!(summary["helperSays"], "helper", "{summary}");
    let helper = summary["helperPort"].as_u64().unwrap();
    assert!(
        helper > 0 && !workers.contains(&(helper as u16)),
        "{summary}"
    );
    assert!(summary["udpPort"].as_u64().unwrap() > 0, "{summary}");
    drover_stops_cleanly("any port", &d).await;
}

/// An app that listens on a second port (its metrics server's) runs as under Node's
/// cluster module and PM2: drover balances the first port, and binds the second once for
/// all workers, each new connection to the next in turn. A reload under load on the
/// second port fails none of its requests: a connection the retiring worker refuses
/// (its server closed a moment before) goes to another worker, as Node's primary sends it.
#[tokio::test]
async fn a_second_port_is_shared_by_the_workers_as_under_node_cluster() {
    for (label, node) in node_binaries() {
        let second = drover_testkit::free_port();
        let mut cmd = Command::new(bin());
        cmd.args(
            "run -w 3 --listen 127.0.0.1:0 --admin 127.0.0.1:0 --threads 1 --strategy round-robin --"
                .split(' '),
        )
        .arg(&node)
        .arg(fixture("two-ports.js"))
        .current_dir(temp_dir("two-ports"));
        clean_env(&mut cmd);
        cmd.env("SECOND_PORT", second.to_string());
        let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
        let admin = admin_addr(&d).await;
        let pids = serving(&d, admin).await;
        every_worker_answers(&label, &d, admin).await;
        says(
            &label,
            &d,
            &[&format!(
                "also listens on port {second} (every address): its workers share it"
            )],
        )
        .await;

        let at = SocketAddr::from(([127, 0, 0, 1], second));
        let mut answered = BTreeSet::new();
        for _ in 0..9 {
            let r = get(at, "/").await;
            let body = r.text();
            assert_eq!(r.status, 200, "{label}: {body}");
            let pid = body
                .strip_prefix("second port (pid ")
                .and_then(|b| b.strip_suffix(")\n"))
                .unwrap_or_else(|| panic!("{label}: {body}"));
            answered.insert(pid.to_string());
        }
        assert_eq!(
            answered, pids,
            "{label}: each worker serves the second port"
        );
        let (_, table, _) = ctl(admin, &["status"]).await;
        assert!(
            table.contains(&format!(
                "its workers share *:{second} (3 workers): each new"
            )),
            "{label}: {table}"
        );

        // New connections to the second port while every worker is replaced.
        let stop = Arc::new(AtomicBool::new(false));
        let load = paced_requests(stop.clone(), move || async move {
            let r = common::examples::try_get(at, "/")
                .await
                .map_err(|e| e.to_string())?;
            Ok((r.status, r.text()))
        });
        let after = reloaded(&label, &d, admin, &pids).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_load_never_failed(&stop, vec![load], 20, "on the second port during a reload").await;
        let r = get(at, "/").await;
        assert!(
            after.iter().any(|p| r.text().contains(p.as_str())),
            "{label}: {}",
            r.text()
        );
        drover_stops_cleanly(&label, &d).await;
        // Bound once for the app, closed with it.
        assert!(
            std::net::TcpListener::bind(at).is_ok(),
            "{label}: port {second} still bound"
        );
    }
}

/// An app whose metrics server listens before its API (which waits for its database):
/// drover balanced the first port it heard, so with `--listen` every client reached the
/// metrics server (60 of 60), and the API was only shared. `--app-port` names the API's:
/// drover balances it at `--listen`, by load, and the workers share the metrics port.
/// Without it, drover's message names the flag.
#[tokio::test]
async fn app_port_names_the_server_drover_balances_when_another_listens_first() {
    let (api, metrics) = (drover_testkit::free_port(), drover_testkit::free_port());
    let start = |extra: &[&str]| {
        let mut cmd = Command::new(bin());
        cmd.args(
            "run -w 2 --listen 127.0.0.1:0 --admin 127.0.0.1:0 --threads 1 --strategy round-robin"
                .split(' '),
        )
        .args(extra)
        .args(["--", "node", &fixture("metrics-first.js")])
        .current_dir(temp_dir("metrics-first"));
        clean_env(&mut cmd);
        cmd.env("API_PORT", api.to_string())
            .env("METRICS_PORT", metrics.to_string());
        spawn_ready_line(cmd, "\"default\" listening on ")
    };

    let d = start(&[]).await;
    says(
        "without --app-port",
        &d,
        &[&format!("also listens on port {api}"), "--app-port"],
    )
    .await;
    drover_stops_cleanly("without --app-port", &d).await;

    let api_port = api.to_string();
    let d = start(&["--app-port", &api_port]).await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let mut apis = BTreeSet::new();
    for _ in 0..6 {
        let r = get(d.addr(), "/").await;
        assert!(
            r.text().starts_with("api (pid "),
            "{}\n{}",
            r.text(),
            d.stderr_text()
        );
        apis.insert(r.text());
    }
    assert_eq!(apis.len(), 2, "{apis:?}");
    says(
        "with --app-port",
        &d,
        &[&format!(
            "also listens on port {metrics} (every address): its workers share it"
        )],
    )
    .await;
    let r = get(SocketAddr::from(([127, 0, 0, 1], metrics)), "/").await;
    assert!(r.text().starts_with("metrics (pid "), "{}", r.text());
    let s = status(admin).await;
    assert!(s.apps[0].restarts.is_empty(), "{:?}", s.apps[0].restarts);
    drover_stops_cleanly("with --app-port", &d).await;
}

/// A second port drover cannot bind (another program has it) is the app's `listen()`
/// error, with the reason in drover's log, and the first port still serves.
#[tokio::test]
async fn a_second_port_that_is_taken_is_refused_with_the_reason() {
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let second = taken.local_addr().unwrap().port();
    let mut cmd = Command::new(bin());
    cmd.args("run -w 2 --listen 127.0.0.1:0 --admin 127.0.0.1:0 --threads 1 --".split(' '))
        .arg("node")
        .arg(fixture("two-ports.js"))
        .current_dir(temp_dir("two-ports-taken"));
    clean_env(&mut cmd);
    cmd.env("SECOND_PORT", second.to_string());
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    every_worker_answers("taken second port", &d, admin).await;
    says(
        "taken second port",
        &d,
        &[
            &format!("listen() on (any):{second} after port 3000: drover binds such a port once"),
            "Address already in use",
            "second listen failed: EADDRINUSE",
        ],
    )
    .await;
    drover_stops_cleanly("taken second port", &d).await;
}

/// `head` (a request, `Connection: close`) to `addr` from the loopback address `from`
/// (any 127.x address is this host's): the whole answer.
async fn ask_from(from: [u8; 4], addr: SocketAddr, head: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket
        .bind((std::net::Ipv4Addr::from(from), 0).into())
        .unwrap();
    let mut stream = socket.connect(addr).await.unwrap();
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer))
        .await
        .expect("an answer in 10 s")
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// Under Node's cluster module and PM2 an app's `req.socket.remoteAddress` is its
/// client's, and what keys on it works: here express-rate-limit as its README writes it
/// (5 requests per client). A request drover places comes on drover's own connection to
/// the worker, and every client looked like 127.0.0.1: one client's 5 requests made
/// every other client's first one a 429. The app sees each client's address and the
/// forwarding fields as the client sent them (drover's own element taken off, so the
/// rate limiter does not warn of an untrusted proxy), a WebSocket-style upgrade too.
#[tokio::test]
async fn a_request_drover_places_shows_the_app_its_clients_address_as_under_node_cluster() {
    let dir = fixture("rate-limit");
    let dir = Path::new(&dir);
    assert!(
        dir.join("node_modules/express-rate-limit").exists(),
        "run `npm ci --prefix crates/drover/tests/fixtures/node_as_written/rate-limit` \
         (scripts/test does)"
    );
    for (label, node) in node_binaries() {
        // One worker: the limiter counts in the worker's memory, as under PM2.
        let mut cmd = Command::new(bin());
        cmd.args("run -w 1 --listen 127.0.0.1:0 --admin off --mode proxy --".split(' '))
            .arg(&node)
            .arg("app.js")
            .current_dir(dir);
        clean_env(&mut cmd);
        let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
        says(&label, &d, &["listening on port 3000"]).await;
        let get = "GET / HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n";
        for n in 1..=5 {
            let answer = ask_from([127, 0, 0, 5], d.addr(), get).await;
            assert!(
                answer.starts_with("HTTP/1.1 200")
                    && answer.contains(
                        "ip 127.0.0.5 socket 127.0.0.5 IPv4 x-forwarded-for - forwarded - raw 0 "
                    ),
                "{label}: request {n}: {answer}\n{}",
                d.stderr_text()
            );
        }
        let answer = ask_from([127, 0, 0, 5], d.addr(), get).await;
        assert!(answer.starts_with("HTTP/1.1 429"), "{label}: {answer}");
        // Another client has a count of its own; the fields it sent reach the app as sent.
        let forwarded = "GET / HTTP/1.1\r\nHost: app\r\nX-Forwarded-For: 9.9.9.9\r\n\
                         Forwarded: for=9.9.9.9\r\nConnection: close\r\n\r\n";
        let answer = ask_from([127, 0, 0, 6], d.addr(), forwarded).await;
        assert!(
            answer.starts_with("HTTP/1.1 200")
                && answer.contains(
                    "ip 127.0.0.6 socket 127.0.0.6 IPv4 x-forwarded-for 9.9.9.9 \
                     forwarded for=9.9.9.9 raw 2 "
                ),
            "{label}: {answer}\n{}",
            d.stderr_text()
        );
        let upgrade = "GET / HTTP/1.1\r\nHost: app\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n";
        let answer = ask_from([127, 0, 0, 7], d.addr(), upgrade).await;
        assert!(
            answer.starts_with("HTTP/1.1 101") && answer.contains("upgraded 127.0.0.7\n"),
            "{label}: {answer}\n{}",
            d.stderr_text()
        );
        assert!(
            !d.stderr_text().contains("ERR_ERL_"),
            "{label}: express-rate-limit warned\n{}",
            d.stderr_text()
        );
        drover_stops_cleanly(&label, &d).await;
    }
}

/// `drover run -w 2 --mode MODE EXTRA…` of the express-session fixture (`npm ci`
/// installs it), once both workers serve.
async fn run_sessions_app(mode: &str, extra: &[&str]) -> ChildProcess {
    let dir = fixture("sessions");
    let dir = Path::new(&dir);
    assert!(
        dir.join("node_modules/express-session").exists(),
        "run `npm ci --prefix crates/drover/tests/fixtures/node_as_written/sessions` \
         (scripts/test does)"
    );
    let mut cmd = Command::new(bin());
    cmd.args("run -w 2 --listen 127.0.0.1:0 --admin 127.0.0.1:0 --mode".split(' '))
        .arg(mode)
        .args(extra)
        .args(["--", "node", "app.js"])
        .current_dir(dir);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    d
}

/// Heads as large as the app's own Node takes and sends pass through drover, as under
/// PM2 or Node's cluster module, where Node alone reads them: a 15 KB query string (drover
/// refused targets over 8 KiB, as nginx), 300 request fields and an answer with 150
/// cookies (drover refused over 100 and 128 fields, with a 431 and a 502). Each is asked
/// on a new connection, which drover reads under both modes.
#[tokio::test]
async fn heads_as_large_as_nodes_own_pass_drover_run_as_under_pm2() {
    let dir = temp_dir("big-heads");
    for mode in ["auto", "proxy"] {
        let mut cmd = Command::new(bin());
        cmd.args("run -w 2 --listen 127.0.0.1:0 --admin off --mode".split(' '))
            .arg(mode)
            .args(["--", "node", &fixture("big-heads.js")])
            .current_dir(&dir);
        clean_env(&mut cmd);
        let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
        let at = d.addr();
        let ask = |head: String| async move {
            let reply =
                drover_testkit::raw_exchange_timeout(at, head.as_bytes(), Duration::from_secs(10))
                    .await
                    .unwrap();
            String::from_utf8_lossy(&reply).into_owned()
        };
        let target = format!("/?q={}", "u".repeat(15_000));
        let reply = ask(format!(
            "GET {target} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"
        ))
        .await;
        assert!(
            reply.starts_with("HTTP/1.1 200") && reply.contains("target 15004 "),
            "{mode}, a 15 KB target: {}",
            &reply[..reply.len().min(300)]
        );
        let fields: String = (0..300).map(|i| format!("X-F{i}: {i}\r\n")).collect();
        let reply = ask(format!(
            "GET / HTTP/1.1\r\nHost: a\r\n{fields}Connection: close\r\n\r\n"
        ))
        .await;
        let fields_seen: usize = reply
            .rsplit("fields ")
            .next()
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or(0);
        assert!(
            reply.starts_with("HTTP/1.1 200") && fields_seen >= 302,
            "{mode}, 300 fields: {}",
            &reply[..reply.len().min(300)]
        );
        let reply =
            ask("GET /?cookies=150 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n".into()).await;
        let cookies = reply
            .lines()
            .filter(|l| l.to_ascii_lowercase().starts_with("set-cookie: c"))
            .count();
        assert!(
            reply.starts_with("HTTP/1.1 200") && cookies == 150,
            "{mode}, 150 cookies: {cookies} in {}",
            &reply[..reply.len().min(300)]
        );
        drover_stops_cleanly(mode, &d).await;
    }
}

/// With `--listen`, an app whose `listen()` names a port of its own (3000) is served at
/// drover's address only, and nothing serves 3000: an app that calls itself there
/// (server-side rendering fetching `http://localhost:3000/api`, which works under PM2)
/// gets "connection refused". drover says so, and how to serve the port; an app on its
/// `PORT` hears nothing.
#[tokio::test]
async fn with_listen_an_app_that_names_its_own_port_is_told_that_nothing_serves_it() {
    let (d, _) = run(2, &["node".into(), fixture("big-heads.js")], Path::new(".")).await;
    says(
        "listen(3000)",
        &d,
        &[
            "app \"app\" listens on port 3000 (its own choice, not its PORT)",
            "drover run without --listen",
        ],
    )
    .await;
    drover_stops_cleanly("listen(3000)", &d).await;
    let (d, _) = run(2, &["node".into(), fixture("port-only.js")], Path::new(".")).await;
    get(d.addr(), "/").await;
    assert!(
        !d.stderr_text().contains("nothing serves port"),
        "{}",
        d.stderr_text()
    );
    drover_stops_cleanly("listen(PORT)", &d).await;
}

/// An app that raised Node's 16 KiB head limit (`maxHeaderSize`, or
/// `--max-http-header-size`) for a large cookie is told, in drover's output, that drover
/// answers such heads with a 431 and which flag lets them through; with that flag
/// drover passes the cookie on to the app, as PM2 does.
#[tokio::test]
async fn an_app_that_reads_larger_heads_is_told_and_served_with_max_header_bytes() {
    let dir = temp_dir("large-heads");
    let start = |words: &[&str]| {
        let mut cmd = Command::new(bin());
        cmd.args("run -w 2 --listen 127.0.0.1:0 --admin 127.0.0.1:0".split(' '))
            .args(words)
            .current_dir(&dir);
        clean_env(&mut cmd);
        async move {
            let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
            let admin = admin_addr(&d).await;
            wait_all_serving(&d, admin).await;
            d
        }
    };
    let fixture = fixture("big-heads.js");
    let cookie = |at: SocketAddr| async move {
        let head = format!(
            "GET / HTTP/1.1\r\nHost: a\r\nCookie: token={}\r\nConnection: close\r\n\r\n",
            "t".repeat(30_000)
        );
        let reply =
            drover_testkit::raw_exchange_timeout(at, head.as_bytes(), Duration::from_secs(10))
                .await
                .unwrap();
        drover_testkit::parse_status(&reply)
    };
    for (who, words) in [
        ("maxHeaderSize", vec!["--", "node", &fixture, "large"]),
        (
            "--max-http-header-size",
            vec!["--", "node", "--max-http-header-size=65536", &fixture],
        ),
    ] {
        let d = start(&words).await;
        says(who, &d, &["run drover with --max-header-bytes 65536"]).await;
        assert_eq!(cookie(d.addr()).await, Some(431), "{who}");
        drover_stops_cleanly(who, &d).await;
    }
    let d = start(&[
        "--max-header-bytes",
        "64KiB",
        "--",
        "node",
        &fixture,
        "large",
    ])
    .await;
    assert_eq!(cookie(d.addr()).await, Some(200), "with --max-header-bytes");
    // Both workers' servers listen by now: neither said a word.
    assert!(
        !d.stderr_text().contains("--max-header-bytes"),
        "{}",
        d.stderr_text()
    );
    drover_stops_cleanly("with --max-header-bytes", &d).await;
}

/// An app that keeps its sessions in the worker's memory (express-session's default
/// store) works under Node's cluster module for a browser tab's keep-alive connection:
/// the worker that accepted it answers all its requests. Under drover's default mode the
/// request after a login was placed on whichever worker was free, and the connection
/// then handed to either: in five tabs, one to every page of two of them answered
/// "who are you?". The worker that served a connection's last request now serves its
/// next one, and takes it when it is handed over, while it is free (tried a few times,
/// one request apart, since a worker says late that its last client left: this test,
/// run 4 at a time, failed 4 of 12 before that).
#[tokio::test]
async fn a_browser_tabs_connection_keeps_its_in_memory_session_as_under_node_cluster() {
    // "auto" hands the connection over after its first requests; "proxy" places each.
    for mode in ["auto", "proxy"] {
        let d = run_sessions_app(mode, &[]).await;
        for tab in 0..5 {
            let mut client = drover_testkit::HttpClient::connect(d.addr()).await.unwrap();
            let login = client.request("POST", "/login", &[], None).await.unwrap();
            assert_eq!(login.status, 302, "{mode}, tab {tab}: {}", login.text());
            let cookie = login
                .header("set-cookie")
                .and_then(|c| c.split(';').next())
                .unwrap_or_else(|| panic!("{mode}, tab {tab}: no session cookie"))
                .to_owned();
            for page in 0..20 {
                let me = client
                    .request("GET", "/me", &[("cookie", &cookie)], None)
                    .await
                    .unwrap();
                assert!(
                    me.status == 200 && me.text().starts_with("hello ann"),
                    "--mode {mode}, tab {tab}, page {page}: {} {}\n{}",
                    me.status,
                    me.text(),
                    d.stderr_text()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        drover_stops_cleanly("sessions", &d).await;
    }
}

/// The usual production set-up: nginx ends TLS and says so in `X-Forwarded-Proto`
/// (and the host the client asked for in `X-Forwarded-Host`); behind it, PM2 or Node's
/// cluster module pass both on as they came, and an Express app with `trust proxy` sees
/// `req.secure`. drover replaced them with its own view (plain HTTP, its own address):
/// the app sent every request to HTTPS again, a redirect loop in the browser, and a
/// secure session cookie was never set. A loopback or private client is taken for such
/// a proxy; a public one cannot claim HTTPS (`http1::request` tests that).
#[tokio::test]
async fn behind_a_proxy_that_ends_tls_the_app_hears_how_its_client_came_as_under_pm2() {
    // "auto" places a connection's first requests and hands it over; "proxy" places all.
    for mode in ["auto", "proxy"] {
        let d = run_sessions_app(mode, &[]).await;
        // What nginx sends with `proxy_set_header X-Forwarded-Proto $scheme;` and
        // `X-Forwarded-Host $host;`, on one keep-alive connection.
        let mut front = drover_testkit::HttpClient::connect(d.addr()).await.unwrap();
        for n in 0..6 {
            let r = front
                .request(
                    "GET",
                    "/account",
                    &[
                        ("x-forwarded-proto", "https"),
                        ("x-forwarded-host", "shop.example"),
                        ("x-forwarded-for", "203.0.113.9"),
                    ],
                    None,
                )
                .await
                .unwrap();
            assert!(
                r.status == 200 && r.text().starts_with("account over https://shop.example "),
                "--mode {mode}, request {n}: {} {:?} {}\n{}",
                r.status,
                r.header("location"),
                r.text(),
                d.stderr_text()
            );
        }
        // A client that came over plain HTTP is sent to HTTPS, by the app.
        let mut plain = drover_testkit::HttpClient::connect(d.addr()).await.unwrap();
        let r = plain.get("/account").await;
        assert_eq!(
            (r.status, r.header("location")),
            (301, Some("https://127.0.0.1/account")),
            "--mode {mode}"
        );
        drover_stops_cleanly(mode, &d).await;
    }
    // Told which proxy is in front, drover keeps that one's fields only: another client,
    // loopback too, cannot claim HTTPS.
    let d = run_sessions_app("proxy", &["--forwarded-headers-from", "127.0.0.5"]).await;
    let claim = "GET /account HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Forwarded-Proto: https\r\n\
                 X-Forwarded-Host: shop.example\r\nConnection: close\r\n\r\n";
    let answer = ask_from([127, 0, 0, 5], d.addr(), claim).await;
    assert!(
        answer.starts_with("HTTP/1.1 200") && answer.contains("account over https://shop.example "),
        "from the proxy named: {answer}"
    );
    let answer = ask_from([127, 0, 0, 6], d.addr(), claim).await;
    assert!(
        answer.starts_with("HTTP/1.1 301") && answer.contains("https://127.0.0.1/account"),
        "from another address: {answer}"
    );
    drover_stops_cleanly("forwarded-headers-from", &d).await;
    // At the edge, none: drover writes its own for every client, as nginx's `$scheme`
    // (an office LAN's client on a private address claimed another host before).
    let d = run_sessions_app("proxy", &["--forwarded-headers-from", "none"]).await;
    let answer = ask_from([127, 0, 0, 5], d.addr(), claim).await;
    assert!(
        answer.starts_with("HTTP/1.1 301") && answer.contains("https://127.0.0.1/account"),
        "from a loopback address, with none trusted: {answer}"
    );
    drover_stops_cleanly("forwarded-headers-from none", &d).await;
}

/// `GET /` over the Unix socket at `path`: the status and body, or why not.
async fn get_over_unix(path: &Path) -> Result<(u16, String), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| format!("connect {}: {e}", path.display()))?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: app\r\nConnection: close\r\n\r\n")
        .await
        .map_err(|e| format!("write: {e}"))?;
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .map_err(|_| "no answer in 5 s".to_string())?
        .map_err(|e| format!("read: {e}"))?;
    let answer = String::from_utf8_lossy(&answer).to_string();
    let status = answer
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("not HTTP: {answer:?}"))?;
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    Ok((status, body.to_string()))
}

/// Asks over the Unix socket at `path` until every pid of `pids` answered.
async fn every_worker_answers_at(who: &str, path: &Path, pids: &BTreeSet<String>) {
    let mut answered = BTreeSet::new();
    for _ in 0..30 {
        let (status, body) = get_over_unix(path).await.unwrap();
        assert_eq!(status, 200, "{who}: {body}");
        answered.extend(pids.iter().filter(|p| body.contains(p.as_str())).cloned());
        if answered == *pids {
            return;
        }
    }
    panic!("{who}: workers {pids:?}, answers from {answered:?}");
}

/// An app behind nginx listens on a Unix socket, as it would under PM2: drover binds the
/// path once and its workers share it (Node's cluster module does the same), with no TCP
/// balancer unless `--listen` asks for one. A new worker's removal of the "stale" file
/// before its `listen()` removes nothing (under Node's cluster module and PM2 it removes
/// the socket its other workers serve, for good): killed, reloaded and scaled under load,
/// nothing fails, and the file is the same socket throughout. drover removes it as it
/// stops, as Node's primary does.
#[tokio::test]
async fn a_unix_socket_is_shared_by_the_workers_as_under_node_cluster() {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    for (label, node) in node_binaries() {
        let dir = temp_dir("unix-socket");
        let path = dir.join("app.sock");
        let mut cmd = Command::new(bin());
        cmd.args("run -w 3 --admin 127.0.0.1:0 --threads 1 --".split(' '))
            .arg(&node)
            .arg(fixture("unix-socket.js"))
            .arg("app.sock")
            .current_dir(&dir);
        clean_env(&mut cmd);
        let d = spawn_ready_line(cmd, "admin API listening on ").await;
        let admin = admin_addr(&d).await;
        let pids = serving(&d, admin).await;
        says(
            &label,
            &d,
            &[&format!(
                "listens on the Unix socket {}: drover binds it once and its workers share it",
                path.display()
            )],
        )
        .await;
        assert!(
            !d.stderr_text()
                .contains("balancer \"default\" listening on"),
            "{label}: no TCP balancer\n{}",
            d.stderr_text()
        );
        every_worker_answers_at(&label, &path, &pids).await;
        let (_, table, _) = ctl(admin, &["status"]).await;
        assert!(
            table.contains(&format!(
                "its workers share unix:{} (3 workers)",
                path.display()
            )),
            "{label}: {table}"
        );
        let socket = std::fs::metadata(&path).unwrap();
        assert!(socket.file_type().is_socket(), "{label}");

        let stop = Arc::new(AtomicBool::new(false));
        let at = path.clone();
        let load = paced_requests(stop.clone(), move || {
            let at = at.clone();
            async move { get_over_unix(&at).await }
        });
        let victim = pids.iter().next().unwrap();
        assert!(Command::new("kill")
            .args(["-KILL", victim])
            .status()
            .unwrap()
            .success());
        let replaced = wait_until_async(Duration::from_secs(20), || async {
            let now = common::serving_pids(&status(admin).await);
            now.iter()
                .all(|p| p.is_some_and(|p| p.to_string() != *victim))
        })
        .await;
        assert!(replaced, "{label}: {}", d.stderr_text());
        // The replacement of the killed one is new too.
        let before = serving(&d, admin).await.union(&pids).cloned().collect();
        reloaded(&label, &d, admin, &before).await;
        let (code, out, err) = ctl(admin, &["scale", "4"]).await;
        assert_eq!(code, 0, "{label}: {out}{err}\n{}", d.stderr_text());
        let four = wait_until_async(Duration::from_secs(20), || async {
            let pids = common::serving_pids(&status(admin).await);
            pids.len() == 4 && pids.iter().all(Option::is_some)
        })
        .await;
        assert!(four, "{label}: {}", d.stderr_text());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_load_never_failed(
            &stop,
            vec![load],
            20,
            "on the Unix socket while workers were killed, reloaded and scaled",
        )
        .await;
        let now = std::fs::metadata(&path).unwrap();
        assert_eq!(
            (now.dev(), now.ino()),
            (socket.dev(), socket.ino()),
            "{label}: the workers that started later removed no socket of drover's"
        );
        drover_stops_cleanly(&label, &d).await;
        assert!(!path.exists(), "{label}: {} left behind", path.display());
    }
}

/// A Unix socket's path that drover cannot bind (a file is there, and the app leaves it)
/// is the app's `listen()` error, with the reason in drover's log; the file is left as
/// it was. `--listen` serves no worker then: none listens.
#[tokio::test]
async fn a_unix_socket_path_that_is_taken_is_refused_with_the_reason() {
    let dir = temp_dir("unix-socket-taken");
    let path = dir.join("app.sock");
    std::fs::write(&path, "not a socket").unwrap();
    let mut cmd = Command::new(bin());
    cmd.args("run -w 1 --listen 127.0.0.1:0 --admin off -- node".split(' '))
        .arg(fixture("unix-socket.js"))
        .arg(&path)
        .env("LEAVE_STALE", "1")
        .current_dir(&dir);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    says(
        "taken unix socket",
        &d,
        &[
            &format!(
                "listen({}): drover binds a Unix socket once, for all of the app's workers to share, and could not: Address already in use",
                path.display()
            ),
            "unix listen failed: EADDRINUSE",
        ],
    )
    .await;
    drover_stops_cleanly("taken unix socket", &d).await;
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "not a socket");
}

/// `drover up` with one app of `command` (TOML array items) that may take 1 s to be
/// ready; waits until a restart record's detail passes `told` and returns drover.
async fn up_until_a_record_says(
    dir: &Path,
    command: &str,
    told: impl Fn(&str) -> bool,
) -> (ChildProcess, SocketAddr) {
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            r#"
[[balancer]]
listen = "127.0.0.1:0"
backends = ["app:web"]

[admin]
listen = "127.0.0.1:0"

[[app]]
name = "web"
command = [{command}]
ready_timeout = "1s"
"#
        ),
    )
    .unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["up", "-c", file.to_str().unwrap()]);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "listening on ").await;
    let admin = admin_addr(&d).await;
    wait_for_record(&d, admin, |r| r.detail.as_deref().is_some_and(&told)).await;
    (d, admin)
}

/// Waits up to 20 s for a restart record that `matches`; fails with the records and
/// drover's output.
async fn wait_for_record(
    d: &ChildProcess,
    admin: SocketAddr,
    matches: impl Fn(&drover_admin::RestartRow) -> bool,
) {
    let said = wait_until_async(Duration::from_secs(20), || async {
        restart_records(&status(admin).await).iter().any(&matches)
    })
    .await;
    assert!(
        said,
        "{:?}\n{}",
        restart_records(&status(admin).await),
        d.stderr_text()
    );
}

#[tokio::test]
async fn a_program_that_ignores_port_is_told_what_to_do() {
    let dir = temp_dir("ignores-port");
    let (d, _) = up_until_a_record_says(
        &dir,
        r#""python3", "-m", "http.server", "--bind", "127.0.0.1", "0""#,
        |t| t.contains("never listened on its PORT") && t.contains("{port}"),
    )
    .await;
    drover_stops_cleanly("ignores PORT", &d).await;
}

/// A command an npm package installs (`ts-node app.ts`, `next start -p 3000`,
/// `react-router-serve`): a script whose `#!` line runs Node, started by its path or by
/// its name on PATH. drover took it for a program that is not Node: it served the app at
/// 127.0.0.1:8000 at once, and said that nothing served the port the app names. Now it
/// runs in Node as `node app.js` does: served at the port its listen() names, by every
/// worker, as under PM2.
#[tokio::test]
async fn a_command_whose_first_line_runs_node_is_served_where_its_app_listens() {
    let bin_dir = PathBuf::from(fixture("bin"));
    for by_name in [false, true] {
        let port = drover_testkit::free_port();
        let program = if by_name {
            "hello-cli".to_string()
        } else {
            bin_dir.join("hello-cli").display().to_string()
        };
        let mut cmd = Command::new(bin());
        cmd.args(["run", "-w", "3", "--admin", "127.0.0.1:0", "--"])
            .arg(&program)
            .arg(port.to_string());
        clean_env(&mut cmd);
        if by_name {
            let path = std::env::var("PATH").unwrap_or_default();
            cmd.env("PATH", format!("{}:{path}", bin_dir.display()));
        }
        let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
        assert_eq!(d.addr().port(), port, "{program}: {}", d.stderr_text());
        let admin = admin_addr(&d).await;
        serving(&d, admin).await;
        every_worker_answers(&program, &d, admin).await;
        drover_stops_cleanly(&program, &d).await;
    }
}

/// `node -e CODE`: Node makes a cluster worker of a process with a channel only when it
/// runs a script, so the app's `listen()`, on a port in its code or on `PORT`, waited for
/// an answer from drover that its unset-up worker could not read: no worker was ever
/// ready. Now they serve, on every Node of `node_binaries`.
#[tokio::test]
async fn an_app_given_as_node_e_code_is_served() {
    let dir = common::temp_dir("node-e");
    for (name, node) in common::node_binaries() {
        for port in ["3000", "process.env.PORT"] {
            let code = format!(
                "require('http').createServer((q, s) => s.end('pid ' + process.pid)).listen({port})"
            );
            let command = [node.display().to_string(), "-e".into(), code];
            let (d, admin) = run(2, &command, &dir).await;
            every_worker_answers(&format!("{name} -e listen({port})"), &d, admin).await;
            drover_stops_cleanly("node -e", &d).await;
        }
    }
}

/// socket.io's guide runs Node's cluster module itself with @socket.io/sticky: the
/// app's primary listens and passes connections to its workers, which listen on no
/// port. As drover's worker the app is no primary, its worker code never listens, and
/// the worker was restarted for "not ready (connection refused)" with no word of why.
/// Now the record and the log name the cause (the app asked `cluster.isPrimary`) and
/// the way out; and the way out works: `--mode background` starts the app as `node
/// app.js` does (PM2's fork mode), its primary serves its port, and both of its
/// workers answer.
#[tokio::test]
async fn an_app_with_a_primary_of_its_own_is_told_to_run_in_background_mode_and_serves_there() {
    let port = drover_testkit::free_port();
    let told = "asked Node's cluster module whether it is the primary";
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "-w",
        "1",
        "--ready-timeout",
        "1s",
        "--admin",
        "127.0.0.1:0",
    ])
    .args(["--", "node", &fixture("own-primary.js"), &port.to_string()]);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "admin API listening on ").await;
    wait_for_record(&d, d.addr(), |r| {
        r.detail
            .as_deref()
            .is_some_and(|t| t.contains(told) && t.contains("--mode background"))
    })
    .await;
    says("own primary", &d, &[told]).await;
    drover_stops_cleanly("own primary", &d).await;

    let mut cmd = Command::new(bin());
    cmd.args(["run", "--mode", "background", "--admin", "127.0.0.1:0"])
        .args(["--", "node", &fixture("own-primary.js"), &port.to_string()]);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "admin API listening on ").await;
    says("background", &d, &[&format!("listening on {port}")]).await;
    let mut workers = BTreeSet::new();
    for _ in 0..6 {
        let r = common::examples::try_get(SocketAddr::from(([127, 0, 0, 1], port)), "/")
            .await
            .unwrap_or_else(|e| panic!("GET /: {e}\n{}", d.stderr_text()));
        assert_eq!(r.status, 200, "{}", d.stderr_text());
        workers.insert(r.text());
    }
    assert_eq!(workers.len(), 2, "{workers:?}\n{}", d.stderr_text());
    drover_stops_cleanly("background", &d).await;
    assert!(!d.stderr_text().contains(told), "{}", d.stderr_text());
}

/// A Node script that ends without listening (a one-off job run as a server) exits as
/// it would alone, and its restart record says why it is no worker: it never listened,
/// and an app that serves no port runs in background mode.
#[tokio::test]
async fn a_node_script_that_ends_without_listening_is_told_what_to_do() {
    let dir = temp_dir("ends-without-listening");
    let app = dir.join("once.js");
    std::fs::write(&app, "console.log('done');\n").unwrap();
    let (d, _) = up_until_a_record_says(&dir, &format!(r#""node", {:?}"#, app), |t| {
        t.contains("ended before it was ready")
            && t.contains("never listened on its PORT")
            && t.contains("background")
    })
    .await;
    drover_stops_cleanly("ends without listening", &d).await;
}

#[tokio::test]
async fn a_node_app_whose_only_server_listens_on_port_0_is_told_what_to_do() {
    // Under Node's cluster module every worker would share one "random" port; drover
    // leaves listen(0) to the app (a helper server), so this worker is never ready, and
    // its restart record says why, with the port it got.
    let dir = temp_dir("port-0");
    let app = dir.join("app.js");
    std::fs::write(
        &app,
        "const s = require('http').createServer((q, r) => r.end('ok'));\n\
         s.listen(0, () => console.log('app listening on ' + s.address().port));\n",
    )
    .unwrap();
    let (d, admin) = up_until_a_record_says(&dir, &format!(r#""node", {:?}"#, app), |t| {
        t.contains("never listened on its PORT") && t.contains("listened on port 0 and got port")
    })
    .await;
    // The port it printed is in a record: the worker's own, which drover names.
    let output = d.stdout_text() + &d.stderr_text();
    let printed: Vec<String> = output
        .lines()
        .filter_map(|l| l.split("app listening on ").nth(1).map(str::to_string))
        .collect();
    let records = restart_records(&status(admin).await);
    let names_a_printed_port = |t: &str| {
        printed
            .iter()
            .any(|p| t.contains(&format!("got port {p} ")))
    };
    assert!(
        records
            .iter()
            .any(|r| r.detail.as_deref().is_some_and(names_a_printed_port)),
        "printed ports {printed:?}, records {records:?}"
    );
    drover_stops_cleanly("port 0", &d).await;
}

#[tokio::test]
async fn a_hard_coded_port_app_is_killed_reloaded_and_scaled_under_load_without_a_failure() {
    let dir = as_written(".");
    let command = ["node".to_string(), "hard-coded.js".to_string()];
    let (d, admin) = run(2, &command, &dir).await;
    let stop_load = Arc::new(AtomicBool::new(false));
    let load = steady_load(d.addr(), 4, "/", stop_load.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let victim = common::serving_pids(&status(admin).await)[0].unwrap();
    let killed = Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    wait_all_serving(&d, admin).await;

    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    wait_all_serving(&d, admin).await;

    // In `pm2 scale`'s order: the app, then the count.
    let (code, out, err) = ctl(admin, &["scale", "app", "3"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    let three = wait_until_async(Duration::from_secs(20), || async {
        let pids = common::serving_pids(&status(admin).await);
        pids.len() == 3 && pids.iter().all(Option::is_some)
    })
    .await;
    assert!(three, "{}", d.stderr_text());
    let (code, out, err) = ctl(admin, &["scale", "1"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    tokio::time::sleep(Duration::from_millis(500)).await;

    assert_load_never_failed(
        &stop_load,
        load,
        50,
        "while a worker was killed, reloaded and scaled",
    )
    .await;
    drover_stops_cleanly("kill, reload, scale", &d).await;
}

/// A TypeScript app as its author runs it, with tsx and no build step (`npm start`, whose
/// script is `tsx server.ts`, and `npx tsx server.ts`), on a port fixed in its code.
/// tsx is a Node process that runs the app in a Node process of its own below it: that
/// one becomes drover's worker, through the preload. Before, tsx itself took the
/// channel, its own IPC socket was refused, and every worker crash-looped.
#[tokio::test]
async fn a_typescript_app_run_by_tsx_runs_unchanged_as_three_workers() {
    let dir = as_written("typescript");
    assert!(
        dir.join("node_modules/tsx").exists(),
        "run `npm ci --prefix examples/as-written/typescript` (scripts/test does)"
    );
    for command in [&["npm", "start"][..], &["npx", "tsx", "server.ts"]] {
        let who = command.join(" ");
        let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        let (d, _) = run(3, &command, &dir).await;
        // The answering pids are the apps' below tsx, not the workers' (npm's, npx's);
        // round-robin over 3 workers reaches each of them within a few requests.
        let mut pids = BTreeSet::new();
        for _ in 0..12 {
            let r = get(d.addr(), "/").await;
            let body = r.text();
            assert!(
                body.starts_with("Hello from TypeScript (pid "),
                "{who}: {body}\n{}",
                d.stderr_text()
            );
            pids.insert(body.trim().to_string());
        }
        assert_eq!(pids.len(), 3, "{who}: {pids:?}\n{}", d.stderr_text());
        drover_stops_cleanly(&who, &d).await;
    }
}

/// The same TypeScript app in development, as its `npm run dev` runs it: `ts-node-dev
/// --respawn --transpile-only server.ts`, and type-checked through its short name
/// (`tsnd server.ts`). ts-node-dev is a Node wrapper: it forks the app's process with an
/// IPC channel of its own, over which that process asks it to compile each TypeScript
/// file and then waits for the file. Before, ts-node-dev took drover's channel, and each
/// worker's app bound port 3000 past drover; once it passed the channel on, the app's
/// compile questions went to drover, unanswered, and no worker ever listened.
#[tokio::test]
async fn a_typescript_app_run_by_ts_node_dev_runs_unchanged_as_two_workers() {
    let dir = as_written("typescript");
    assert!(
        dir.join("node_modules/ts-node-dev").exists(),
        "run `npm ci --prefix examples/as-written/typescript` (scripts/test does)"
    );
    for command in [
        &["npm", "run", "dev"][..],
        &["./node_modules/.bin/tsnd", "server.ts"],
    ] {
        let who = command.join(" ");
        let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        // Each worker compiles the app (type-checks it, under tsnd) before it listens:
        // on a loaded machine, tens of seconds.
        let (d, _) = run_within(2, &command, &dir, Duration::from_secs(90)).await;
        let mut pids = BTreeSet::new();
        for _ in 0..8 {
            let body = get(d.addr(), "/").await.text();
            assert!(
                body.starts_with("Hello from TypeScript (pid "),
                "{who}: {body}\n{}",
                d.stderr_text()
            );
            pids.insert(body.trim().to_string());
        }
        assert_eq!(pids.len(), 2, "{who}: {pids:?}\n{}", d.stderr_text());
        assert!(
            !d.stderr_text().contains("EADDRINUSE"),
            "{who}: {}",
            d.stderr_text()
        );
        drover_stops_cleanly(&who, &d).await;
    }
}

/// A NestJS app as its scaffold starts it: `npm start` is `nest start`, whose CLI builds
/// the app (tsc) and runs `node dist/main` in a Node process of its own, as tsx does.
/// Before, the CLI's process took drover's channel and its app bound port 3000 past
/// drover: one worker's app served every client, and the other's failed with
/// EADDRINUSE. Now the CLI passes the channel on, and each worker's app serves.
#[tokio::test]
async fn a_nest_app_started_by_its_cli_runs_unchanged_as_two_workers() {
    let dir = as_written("nest");
    assert!(
        dir.join("node_modules/@nestjs/cli").exists(),
        "run `npm ci --prefix examples/as-written/nest` (scripts/test does)"
    );
    for command in [
        &["npm", "start"][..],
        &["./node_modules/.bin/nest", "start"],
    ] {
        let who = command.join(" ");
        let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        // As its users run it: no --listen, at the PORT its scaffold reads. Each worker
        // builds the app (tsc) before it listens: on a loaded machine, tens of seconds.
        let port = drover_testkit::free_port();
        let mut cmd = Command::new(bin());
        cmd.args(["run", "-w", "2", "--admin", "127.0.0.1:0", "--threads", "1"])
            .args(["--strategy", "round-robin", "--"])
            .args(&command)
            .current_dir(&dir);
        clean_env(&mut cmd);
        cmd.env("PORT", port.to_string());
        let built = Duration::from_secs(90);
        let d =
            drover_testkit::spawn_ready_line_within(cmd, "\"default\" listening on ", built).await;
        let admin = admin_addr(&d).await;
        common::wait_all_serving_within(&d, admin, built).await;
        both_apps_answer_at(&who, &d, port, "Hello from Nest (pid ").await;
        drover_stops_cleanly(&who, &d).await;
    }
}

/// An `npm start` that sets the app's environment through a Node wrapper, which runs
/// `node server.js` below it: `cross-env NODE_ENV=production node server.js`, dotenv-cli's
/// `dotenv -e .env -- node server.js`, `env-cmd -f .env node server.js`, `dotenvx run`;
/// or that runs npm scripts in order with npm-run-all (`run-s build serve`), or watches
/// the app's files with nodemon (`nodemon server.js`). Before, the
/// wrapper's process took drover's channel and the app bound its port past drover: one
/// worker's app served every client, and the other's failed with EADDRINUSE.
#[tokio::test]
async fn an_app_started_through_an_environment_wrapper_runs_as_written() {
    let dir = PathBuf::from(fixture("env-wrappers"));
    assert!(
        dir.join("node_modules/cross-env").exists(),
        "run `npm ci --prefix crates/drover/tests/fixtures/node_as_written/env-wrappers` (scripts/test does)"
    );
    for (command, says) in [
        (&["npm", "start"][..], "production -"),
        (&["npm", "run", "start:dotenv"], "- hello from .env"),
        (&["npm", "run", "start:env-cmd"], "- hello from .env"),
        (&["npm", "run", "start:dotenvx"], "- hello from .env"),
        // npm-run-all's `run-s greet serve`: a script, then the app's.
        (&["npm", "run", "start:run-s"], "- - (pid"),
        // nodemon forks the app with an IPC channel of its own: the app's process
        // takes drover's channel beside it.
        (&["npm", "run", "start:nodemon"], "- - (pid"),
        (&["./node_modules/.bin/nodemon", "server.js"], "- - (pid"),
        (
            &[
                "./node_modules/.bin/cross-env",
                "NODE_ENV=production",
                "node",
                "server.js",
            ],
            "production -",
        ),
    ] {
        let who = command.join(" ");
        let command: Vec<String> = command.iter().map(|s| s.to_string()).collect();
        let port = drover_testkit::free_port();
        let (d, _) = run_without_listen(&command, &dir, Some(port)).await;
        both_apps_answer_at(&who, &d, port, says).await;
        drover_stops_cleanly(&who, &d).await;
    }
}

/// drover serves at `port` (the app's own, no --listen), and both workers' apps answer
/// there, below whatever runs them (each answer starts with `says` and names its pid),
/// with no EADDRINUSE from an app that bound the port past drover.
async fn both_apps_answer_at(who: &str, d: &ChildProcess, port: u16, says: &str) {
    assert_eq!(d.addr().port(), port, "{who}: {}", d.stderr_text());
    let at = SocketAddr::from(([127, 0, 0, 1], port));
    let mut answers = BTreeSet::new();
    for _ in 0..12 {
        let body = get(at, "/").await.text();
        assert!(body.starts_with(says), "{who}: {body}\n{}", d.stderr_text());
        answers.insert(body.trim().to_string());
    }
    assert_eq!(answers.len(), 2, "{who}: {answers:?}\n{}", d.stderr_text());
    assert!(
        !d.stderr_text().contains("EADDRINUSE"),
        "{who}: {}",
        d.stderr_text()
    );
}

/// A Node wrapper drover does not know (`node wrap.js server.js`, which runs the app in a
/// Node process of its own) keeps drover's channel, and each worker's copy of the app
/// binds its port itself; all but the first fail with EADDRINUSE. The app's process says
/// why, and what to run instead. Before, only Node's EADDRINUSE was printed, and the
/// worker whose app did bind was said to have "never listened on its PORT".
#[tokio::test]
async fn an_app_below_a_node_wrapper_drover_does_not_know_says_why_its_port_is_taken() {
    let port = drover_testkit::free_port();
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-w", "2", "--admin", "127.0.0.1:0", "--", "node"])
        .args([
            fixture("wrap.js"),
            fixture("port-or-argv.js"),
            port.to_string(),
        ]);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "admin API listening on ").await;
    says(
        "unknown wrapper",
        &d,
        &[
            &format!("cannot listen on port {port}, which another process holds"),
            "drover's worker (pid ",
            "start the app itself (drover run -- node app.js)",
        ],
    )
    .await;
    drover_stops_cleanly("unknown wrapper", &d).await;
}

/// An `npm start` that runs steps before the app, as apps' scripts do: a `prestart`
/// script, and `node migrate.js && node server.js`. Each step is a Node process of the
/// worker that ends its work without listening; as a cluster worker (the first Node
/// process below a runner takes drover's channel) its channel kept it alive, so the
/// app's process never started, and drover stopped the worker after its ready timeout,
/// blaming the port, and ran the migration again, forever. Now each step exits as it
/// would alone, the app takes the channel up, each worker's migration runs once, and
/// no worker is restarted: on every Node, and through a shell as well.
#[tokio::test]
async fn an_npm_start_that_runs_steps_before_the_app_serves_as_written() {
    let dir = temp_dir("steps-before");
    std::fs::write(
        dir.join("package.json"),
        r#"{ "name": "steps-before", "private": true, "scripts": {
  "prestart": "node check-env.js",
  "start": "node migrate.js && node server.js" } }
"#,
    )
    .unwrap();
    std::fs::write(dir.join("check-env.js"), "console.log('env ok');\n").unwrap();
    // A migration that waits on its database (a timer here) and notes each run.
    std::fs::write(
        dir.join("migrate.js"),
        "setTimeout(() => require('fs').appendFileSync('migrations.log', `${process.pid}\\n`), 300);\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("server.js"),
        "require('http').createServer((q, s) => s.end(`server ${process.pid}`)).listen(3000);\n",
    )
    .unwrap();
    let runs = |dir: &Path| {
        std::fs::read_to_string(dir.join("migrations.log"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let npm = vec!["npm".to_string(), "start".to_string()];
    let (d, admin) = run(2, &npm, &dir).await;
    both_apps_serve("npm start with steps before the app", &d).await;
    assert_eq!(runs(&dir), 2, "{}", d.stderr_text());
    let s = status(admin).await;
    assert!(s.apps[0].restarts.is_empty(), "{:?}", s.apps[0].restarts);
    drover_stops_cleanly("npm start with steps before the app", &d).await;

    for (name, node) in node_binaries() {
        let _ = std::fs::remove_file(dir.join("migrations.log"));
        let node = node.display().to_string();
        let shell = vec![
            "sh".to_string(),
            "-c".to_string(),
            format!("{node} check-env.js && {node} migrate.js && {node} server.js"),
        ];
        let who = format!("{name}: sh -c with steps before the app");
        let (d, admin) = run(2, &shell, &dir).await;
        both_apps_serve(&who, &d).await;
        assert_eq!(runs(&dir), 2, "{who}\n{}", d.stderr_text());
        let s = status(admin).await;
        assert!(
            s.apps[0].restarts.is_empty(),
            "{who}: {:?}",
            s.apps[0].restarts
        );
        drover_stops_cleanly(&who, &d).await;
    }
}

/// Round-robin GETs reach two app processes below the workers' runners (whose pids
/// `ctl status` shows are not the apps').
async fn both_apps_serve(who: &str, d: &ChildProcess) {
    let mut apps = BTreeSet::new();
    for _ in 0..6 {
        let r = get(d.addr(), "/").await;
        assert!(
            r.text().starts_with("server "),
            "{who}: {}\n{}",
            r.text(),
            d.stderr_text()
        );
        apps.insert(r.text());
    }
    assert_eq!(apps.len(), 2, "{who}: {apps:?}\n{}", d.stderr_text());
}

/// A runner that outlives its app (a watch mode waiting for a change, nodemon, a shell
/// script that goes on): the app's Node process exits, the process drover started does
/// not. drover knows the app's pid from its preload, sees it end, and restarts the
/// worker, where it used to keep it in rotation with nothing behind its port.
#[tokio::test]
async fn a_worker_whose_app_process_ended_below_a_runner_is_restarted() {
    let script = fixture("exits-on-request.js");
    let command = vec![
        "sh".to_string(),
        "-c".to_string(),
        format!("node {script}; sleep 600"),
    ];
    let (d, admin) = run(2, &command, &temp_dir("app-ended")).await;
    let r = get(d.addr(), "/exit").await;
    assert!(r.text().starts_with("exiting"), "{}", r.text());
    wait_for_record(&d, admin, |r| {
        r.reason == "exit"
            && r.detail.as_deref().is_some_and(|d| {
                d.contains("its app's Node process (pid ") && d.contains("kept running")
            })
    })
    .await;
    // Both workers serve again, and every request gets an answer.
    wait_all_serving(&d, admin).await;
    for _ in 0..6 {
        let r = get(d.addr(), "/").await;
        assert!(r.text().starts_with("Hello (pid "), "{}", r.text());
    }
    drover_stops_cleanly("sh -c 'node …; sleep 600'", &d).await;
}

/// PM2 and Node's cluster module serve an app that says "listening on port N" at N.
/// With no --listen, so does drover: its balancer binds the port the first worker's
/// `listen()` names, as Node's primary binds it (any address, so IPv4 and IPv6 loopback
/// both reach it), and every worker answers there. Before, it listened on
/// 127.0.0.1:8000 only, and a client of port N was refused.
#[tokio::test]
async fn without_listen_clients_connect_at_the_port_the_app_names() {
    let port = drover_testkit::free_port();
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-w", "3", "--admin", "127.0.0.1:0", "--threads", "1"])
        .args(["--strategy", "round-robin", "--", "node", "argv-port.js"])
        .arg(port.to_string())
        .current_dir(as_written("."));
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    assert_eq!(d.addr().port(), port, "{}", d.stderr_text());
    assert!(d.addr().ip().is_unspecified(), "{}", d.stderr_text());
    says("argv port", &d, &["clients connect there"]).await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let mut at = vec![SocketAddr::from(([127, 0, 0, 1], port))];
    if d.addr().is_ipv6() {
        at.push(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port)));
    }
    let pids: BTreeSet<String> = common::serving_pids(&status(admin).await)
        .into_iter()
        .map(|p| p.unwrap().to_string())
        .collect();
    for addr in at {
        let mut answered = BTreeSet::new();
        for _ in 0..30 {
            let r = get(addr, "/pi?iterations=1000").await;
            assert_eq!(r.status, 200, "{addr}: {}\n{}", r.text(), d.stderr_text());
            let body = r.text();
            answered.extend(pids.iter().filter(|p| body.contains(p.as_str())).cloned());
        }
        assert_eq!(answered, pids, "{addr}\n{}", d.stderr_text());
    }
    drover_stops_cleanly("argv port", &d).await;
}

/// `drover run -w 2` of `command` in `cwd` with no --listen, with `PORT` in drover's
/// environment if given, once every worker serves; drover and its admin address.
async fn run_without_listen(
    command: &[String],
    cwd: &Path,
    users_port: Option<u16>,
) -> (ChildProcess, SocketAddr) {
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-w", "2", "--admin", "127.0.0.1:0", "--threads", "1"])
        .args(["--strategy", "round-robin", "--"])
        .args(command)
        .current_dir(cwd);
    clean_env(&mut cmd);
    if let Some(port) = users_port {
        cmd.env("PORT", port.to_string());
    }
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    // Its balancer binds the app's port: nothing is unserved (`drover up`'s warning for
    // an app with no [[balancer]] once said so here too).
    assert!(
        !d.stderr_text().contains("no [[balancer]] is in front"),
        "{}",
        d.stderr_text()
    );
    (d, admin)
}

/// Asks `/` at `at` on new connections until both workers (their apps' pids, below a
/// runner too) have answered.
async fn both_answer(who: &str, d: &ChildProcess, at: SocketAddr) {
    let mut pids = BTreeSet::new();
    for _ in 0..12 {
        let r = get(at, "/").await;
        assert_eq!(r.status, 200, "{who}: {}\n{}", r.text(), d.stderr_text());
        let body = r.text();
        let pid = body.split(',').next().unwrap_or_default().to_string();
        pids.insert(pid);
    }
    assert_eq!(pids.len(), 2, "{who}: {pids:?}\n{}", d.stderr_text());
}

/// An app that reads `PORT` with a fallback (`process.env.PORT || 3000`, as Express's
/// generator, Next.js and NestJS write it), run with no --listen: under `node app.js`
/// and PM2 it listens on its fallback, or on the user's `PORT`, and clients connect
/// there. So under drover: the app sees the user's `PORT` (none here), not drover's
/// loopback port for the worker, whether Node runs it directly (on every Node here), a
/// runner starts it (`npm start`, whose child gets drover's `PORT`, for what it starts
/// may not be Node, and the preload gives the app the user's back), or `node
/// --env-file` sets it. Before, every such app saw drover's port and was served at
/// 127.0.0.1:8000, and `--env-file`'s PORT was ignored. An app with no fallback at all
/// (`listen(Number(process.env.PORT))`, `listen({ port: process.env.PORT })`), which
/// Node alone cannot run without a PORT, still gets the worker's port and is served at
/// drover's default address, 127.0.0.1:8000 (which must be free, as for tests/readme.rs).
#[tokio::test]
async fn an_app_that_reads_port_sees_the_users_and_is_served_where_it_listens() {
    let dir = temp_dir("users-port");
    let app = fixture("port-or-argv.js");
    let sees = |who: &str, body: &str, port: Option<u16>| {
        let seen = match port {
            Some(p) => format!("\"PORT\":\"{p}\""),
            None => "\"PORT\":null".to_string(),
        };
        assert!(body.contains(&seen), "{who}: {seen} in {body}");
    };
    let mut cases: Vec<(String, Vec<String>, Option<u16>, u16)> = Vec::new();
    for (name, node) in node_binaries() {
        let fallback = drover_testkit::free_port();
        let command = vec![
            node.display().to_string(),
            app.clone(),
            fallback.to_string(),
        ];
        cases.push((format!("{name}: its fallback"), command, None, fallback));
    }
    let users = drover_testkit::free_port();
    let ignored = drover_testkit::free_port();
    cases.push((
        "the user's PORT".into(),
        vec!["node".into(), app.clone(), ignored.to_string()],
        Some(users),
        users,
    ));
    let npm = drover_testkit::free_port();
    std::fs::write(
        dir.join("package.json"),
        format!(
            r#"{{"name": "users-port", "version": "1.0.0", "scripts": {{"start": "node {app} {npm}"}}}}"#
        ),
    )
    .unwrap();
    cases.push((
        "npm start".into(),
        vec!["npm".into(), "start".into()],
        None,
        npm,
    ));
    for (who, command, users_port, port) in cases {
        let (d, _) = run_without_listen(&command, &dir, users_port).await;
        assert_eq!(d.addr().port(), port, "{who}: {}", d.stderr_text());
        assert!(d.addr().ip().is_unspecified(), "{who}: {}", d.stderr_text());
        says(&who, &d, &["clients connect there"]).await;
        let at = SocketAddr::from(([127, 0, 0, 1], port));
        both_answer(&who, &d, at).await;
        sees(&who, &get(at, "/").await.text(), users_port);
        drover_stops_cleanly(&who, &d).await;
    }

    // `node --env-file` (Node 20.6 and later: the machine's own) sets PORT from the file.
    let from_file = drover_testkit::free_port();
    std::fs::write(dir.join(".env"), format!("PORT={from_file}\n")).unwrap();
    let command = ["node", "--env-file=.env", &app, "1"].map(String::from);
    let (d, _) = run_without_listen(&command, &dir, None).await;
    assert_eq!(
        d.addr().port(),
        from_file,
        "--env-file: {}",
        d.stderr_text()
    );
    both_answer("--env-file", &d, d.addr()).await;
    sees(
        "--env-file",
        &get(d.addr(), "/").await.text(),
        Some(from_file),
    );
    drover_stops_cleanly("--env-file", &d).await;

    // No fallback, or no port named at all (`listen(cb)`, `listen()`): the worker's own
    // port, and drover's default address.
    for form in ["number", "object", "callback", "bare"] {
        let who = format!("listen() of no port ({form})");
        let command = ["node", &fixture("port-only.js"), form].map(String::from);
        let (d, admin) = run_without_listen(&command, &dir, None).await;
        let default = SocketAddr::from(([127, 0, 0, 1], 8000));
        assert_eq!(d.addr(), default, "{who}: {}", d.stderr_text());
        both_answer(&who, &d, default).await;
        let ports: BTreeSet<String> = status(admin).await.apps[0]
            .workers
            .iter()
            .filter_map(|w| w.port.map(|p| format!("\"port\":{p}")))
            .collect();
        let body = get(default, "/").await.text();
        assert!(
            ports.iter().any(|p| body.contains(p.as_str())),
            "{who}: one of {ports:?} in {body}"
        );
        drover_stops_cleanly(&who, &d).await;
    }
}

/// `listen({ port, exclusive: true })` makes a cluster worker bind the port itself,
/// past its primary: under Node's cluster module and PM2 every worker but the first
/// fails with EADDRINUSE, and under drover the first served clients past drover while
/// the others crash-looped. drover's preload drops the option (drover is the one
/// process that binds), and every worker serves through drover.
#[tokio::test]
async fn a_listen_with_exclusive_asks_drover_like_any_other() {
    let port = drover_testkit::free_port();
    let command = ["node", &fixture("exclusive.js"), &port.to_string()].map(String::from);
    let (d, _) = run_without_listen(&command, &temp_dir("exclusive"), None).await;
    assert_eq!(
        d.addr(),
        SocketAddr::from(([127, 0, 0, 1], port)),
        "{}",
        d.stderr_text()
    );
    both_answer("exclusive", &d, d.addr()).await;
    assert!(
        !d.stderr_text().contains("EADDRINUSE"),
        "{}",
        d.stderr_text()
    );
    drover_stops_cleanly("exclusive", &d).await;
}

/// `node --inspect app.js` as N workers: under Node's cluster module (and PM2) each
/// worker's inspector gets the port after the last one's (9230, 9231, …: every fork one
/// more), so each can be debugged. Before, every drover worker asked for the same port,
/// and all but one logged `Starting inspector on 127.0.0.1:9229 failed: address already
/// in use`. A reload's new workers get the next ports, while the old ones still hold
/// theirs.
#[tokio::test]
async fn every_worker_gets_an_inspector_port_of_its_own_as_under_node_cluster() {
    let base = drover_testkit::free_port();
    let inspect = format!("--inspect=127.0.0.1:{base}");
    let app = fixture("port-or-argv.js");
    let (d, admin) = run(2, &["node".into(), inspect, app], &temp_dir("inspect")).await;
    let inspector_answers = |nth: u16| async move {
        let at = SocketAddr::from(([127, 0, 0, 1], base + nth));
        wait_until_async(Duration::from_secs(10), || async {
            common::examples::try_get(at, "/json/version")
                .await
                .is_ok_and(|r| r.status == 200 && r.text().contains("Protocol-Version"))
        })
        .await
    };
    for nth in [1, 2] {
        assert!(
            inspector_answers(nth).await,
            "no inspector at {}\n{}",
            base + nth,
            d.stderr_text()
        );
    }
    let before = serving(&d, admin).await;
    reloaded("inspect", &d, admin, &before).await;
    for nth in [3, 4] {
        assert!(
            inspector_answers(nth).await,
            "no inspector at {} after the reload\n{}",
            base + nth,
            d.stderr_text()
        );
    }
    assert!(
        !d.stderr_text().contains("Starting inspector"),
        "{}",
        d.stderr_text()
    );
    drover_stops_cleanly("inspect", &d).await;
}

/// `node --watch app.js` runs the app in a child of Node's own watch process. Started
/// by drover, that child was no worker of drover's: the first bound the app's port
/// itself, past drover, and the others failed with EADDRINUSE; it is refused, naming
/// drover's own watch. Below a runner (`npm run dev`) drover cannot see the option:
/// the child became drover's worker, and the one Node's watch restarted after a change
/// joined the same worker's channel as a second app, on the port the first still held
/// (requests failed). Each such worker now stops at once, saying why and naming
/// drover's own watch.
#[tokio::test]
async fn node_watch_mode_is_refused_or_named_and_drovers_watch_offered() {
    let dir = temp_dir("node-watch");
    let app = fixture("port-or-argv.js");
    for option in ["--watch", "--watch-path=."] {
        run_is_refused(
            &dir,
            &["-w", "2", "--", "node", option, &app],
            &format!("node {option} runs the app in a child process of its own"),
        );
    }
    run_is_refused(&dir, &["--", "node", "--watch", &app], "drover run --watch");
    std::fs::write(
        dir.join("package.json"),
        format!(
            r#"{{"name": "dev", "version": "1.0.0", "scripts": {{"dev": "node --watch {app}"}}}}"#
        ),
    )
    .unwrap();
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "-w",
        "2",
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ])
    .args(["--", "npm", "run", "dev"])
    .current_dir(&dir);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let said = "drover: this app runs under `node --watch`, which restarts it in a new process";
    says(
        "npm run dev",
        &d,
        &[said, "drover run --watch -- node app.js"],
    )
    .await;
    // No worker serves: none runs an app that could answer past drover.
    let admin = admin_addr(&d).await;
    let serving = common::serving_pids(&status(admin).await);
    assert!(
        serving.iter().all(Option::is_none),
        "{serving:?}\n{}",
        d.stderr_text()
    );
    drover_stops_cleanly("npm run dev", &d).await;
}

/// Node's cluster module (and so PM2) hands over every connection of any server a
/// worker listens on: an HTTPS server that holds its own certificate
/// (`https.createServer({ key, cert }, app).listen(8443)`, as Node's docs write it) and
/// a protocol of its own (`net.createServer`) run as N workers as they do HTTP. So does
/// drover: its preload says what the server speaks, and for one that is not HTTP the
/// balancer hands each connection to a worker at accept, unread (TCP mode), by load.
/// Before, drover read the bytes as HTTP: a TLS handshake and "hi" got 400 Bad
/// Request. With `--listen` (a balancer that reads HTTP, started before the app
/// listened), drover stops, saying why and what to do.
#[tokio::test]
async fn a_server_that_ends_tls_itself_or_speaks_its_own_protocol_runs_as_written() {
    if !common::pki::tools() {
        return;
    }
    let pki = common::pki::Pki::new("tls-app");
    let (cert, key) = pki.leaf(
        "server",
        "localhost",
        &["localhost"],
        common::pki::far_future(),
    );
    let dir = pki.dir.clone();
    std::fs::copy(&cert, dir.join("cert.pem")).unwrap();
    std::fs::copy(&key, dir.join("key.pem")).unwrap();
    let (tls_port, tcp_port) = (drover_testkit::free_port(), drover_testkit::free_port());
    std::fs::write(
        dir.join("https-server.js"),
        format!("const fs = require('fs');\nconst https = require('https');\nconst options = {{ key: fs.readFileSync('key.pem'), cert: fs.readFileSync('cert.pem') }};\nhttps.createServer(options, (req, res) => res.end('secure ' + process.pid)).listen({tls_port});\n"),
    )
    .unwrap();
    std::fs::write(
        dir.join("echo.js"),
        format!("require('net').createServer((c) => c.on('data', (d) => c.write(process.pid + ' ' + d))).listen({tcp_port});\n"),
    )
    .unwrap();
    // The same, written with its handler attached after listen(): until the handler is
    // there it looks like a port probe (get-port's plain net server), which serves nothing.
    std::fs::write(
        dir.join("echo-attached-after-listen.js"),
        format!("const server = require('net').createServer();\nserver.listen({tcp_port});\nserver.on('connection', (c) => c.on('data', (d) => c.write(process.pid + ' ' + d)));\n"),
    )
    .unwrap();
    let start = |node: &Path, script: &str| {
        let mut cmd = Command::new(bin());
        cmd.args(["run", "-w", "3", "--admin", "127.0.0.1:0", "--"])
            .arg(node)
            .arg(script)
            .current_dir(&dir);
        clean_env(&mut cmd);
        spawn_ready_line(cmd, "\"default\" listening on ")
    };

    // A protocol of its own, under every Node here (the preload's word on what a
    // server speaks must reach drover from Debian's Node 18 too): 9 connections held
    // open, each answered by the worker it went to, and handed over (no hop: drover
    // counts each handoff).
    let written = node_binaries()
        .into_iter()
        .map(|(name, node)| (name, node, "echo.js"))
        .chain([(
            "after listen()".to_string(),
            PathBuf::from("node"),
            "echo-attached-after-listen.js",
        )]);
    for (name, node, script) in written {
        let d = start(&node, script).await;
        assert_eq!(d.addr().port(), tcp_port, "{name}: {}", d.stderr_text());
        says(
            &name,
            &d,
            &["speaks a TCP protocol of its own (net.createServer), not HTTP/1.1"],
        )
        .await;
        let admin = admin_addr(&d).await;
        wait_all_serving(&d, admin).await;
        let (held, pids) = echo_on_held_connections(("127.0.0.1", tcp_port), 9, &name, &d).await;
        assert!(
            pids.len() >= 2,
            "{name}: 9 connections went to {pids:?}\n{}",
            d.stderr_text()
        );
        // drover counts a handoff once the worker has the connection, and the worker may
        // echo before that count lands (8 of 9 once in CI): wait for it.
        let mut handed = 0;
        for _ in 0..50 {
            handed = common::default_metric(admin, "drover_handoffs_total").await;
            if handed >= 9 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(handed, 9, "{name}: {}", d.stderr_text());
        drop(held);
        drover_stops_cleanly(&name, &d).await;
    }

    // TLS the app ends itself: curl verifies the app's own certificate.
    let d = start(Path::new("node"), "https-server.js").await;
    assert_eq!(d.addr().port(), tls_port, "{}", d.stderr_text());
    says(
        "https",
        &d,
        &["speaks TLS (https.createServer or tls.createServer), not HTTP/1.1"],
    )
    .await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    for _ in 0..6 {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "10", "--cacert"])
            .arg(&pki.ca_pem)
            .arg(format!("https://localhost:{tls_port}/"))
            .output()
            .unwrap();
        let body = String::from_utf8_lossy(&out.stdout);
        assert!(
            body.starts_with("secure "),
            "{body}{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            d.stderr_text()
        );
    }
    assert!(common::default_metric(admin, "drover_handoffs_total").await >= 6);
    drover_stops_cleanly("https", &d).await;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    // Its own protocol behind drover's TLS (`--tls-cert`), as HAProxy's `bind … ssl`
    // in `mode tcp`: drover ends the clients' TLS and relays what each session carries
    // to a worker (a session's keys are drover's: it cannot be handed over).
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-w", "2", "--admin", "127.0.0.1:0"])
        .args([
            "--tls-cert",
            cert,
            "--tls-key",
            key,
            "--",
            "node",
            "echo.js",
        ])
        .current_dir(&dir);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    says("echo behind TLS", &d, &["drover ends the clients' TLS"]).await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let client = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let mut held = Vec::new();
    let mut pids = BTreeSet::new();
    for _ in 0..6 {
        let tcp = tokio::net::TcpStream::connect(("127.0.0.1", tcp_port))
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut s = connector.connect(name, tcp).await.unwrap();
        s.write_all(b"hi").await.unwrap();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .expect("an answer through TLS")
            .unwrap();
        let got = String::from_utf8_lossy(&buf[..n]).into_owned();
        let (pid, said) = got.split_once(' ').unwrap_or(("", ""));
        assert_eq!(said, "hi", "{got:?}\n{}", d.stderr_text());
        pids.insert(pid.to_string());
        held.push(s);
    }
    assert_eq!(pids.len(), 2, "{pids:?}");
    assert_eq!(
        common::default_metric(admin, "drover_handoffs_total").await,
        0
    );
    assert_eq!(
        common::default_metric(admin, "drover_tls_handshakes_total").await,
        6
    );
    drop(held);
    drover_stops_cleanly("echo behind TLS", &d).await;

    // What cannot apply to such a server stops drover, saying why: a balancer that
    // reads HTTP in front of it, an HTTP health check, TLS ended by drover in front of
    // TLS the app ends.
    for (flags, says) in [
        (&["-l", "127.0.0.1:0"][..], "run it without --listen"),
        (
            &["--health-path", "/health"][..],
            "its health check asks it for an HTTP answer",
        ),
        (
            &["--tls-cert", cert, "--tls-key", key][..],
            "ends TLS itself with its own certificate; drover would end the clients' TLS first",
        ),
    ] {
        let out = Command::new("timeout")
            .arg("60")
            .arg(bin())
            .args(["run", "-w", "2", "--admin", "off"])
            .args(flags)
            .arg("https-server.js")
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(
            err.contains("its server speaks TLS") && err.contains(says),
            "{flags:?}: {err}"
        );
    }
}

/// `n` connections to an echo server (it answers "PID what-it-got") at `addr`, each
/// answered and held open: the connections, and the pids that answered.
async fn echo_on_held_connections(
    addr: impl tokio::net::ToSocketAddrs + Copy,
    n: usize,
    who: &str,
    d: &ChildProcess,
) -> (Vec<tokio::net::TcpStream>, BTreeSet<String>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut held = Vec::new();
    let mut pids = BTreeSet::new();
    for i in 0..n {
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(format!("hi {i}").as_bytes()).await.unwrap();
        let mut answer = vec![0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(10), c.read(&mut answer))
            .await
            .expect("the echo answers")
            .unwrap();
        let answer = String::from_utf8_lossy(&answer[..read]).to_string();
        let (pid, said) = answer.split_once(' ').unwrap_or_default();
        let want = format!("hi {i}");
        assert_eq!(said, want, "{who}: {answer:?}\n{}", d.stderr_text());
        pids.insert(pid.to_string());
        held.push(c);
    }
    (held, pids)
}

/// `drover run --tcp`: TCP servers of any language balanced by connection, as HAProxy's
/// `mode tcp` balances them, with `--listen` where clients connect. A program that is
/// not Node has each connection relayed (held connections spread over the workers); a
/// Node app's are handed to its workers. HTTP-only flags are refused with it.
#[tokio::test]
async fn run_tcp_balances_servers_of_any_language_by_connection() {
    let dir = temp_dir("run-tcp");
    std::fs::write(
        dir.join("echo.py"),
        "import os, socketserver\nclass Echo(socketserver.BaseRequestHandler):\n    def handle(self):\n        data = self.request.recv(1024)\n        self.request.sendall(f'{os.getpid()} '.encode() + data)\n        self.request.recv(1024)\nclass Server(socketserver.ThreadingTCPServer):\n    allow_reuse_address = True\n    daemon_threads = True\nServer(('127.0.0.1', int(os.environ['PORT'])), Echo).serve_forever()\n",
    )
    .unwrap();
    let node_port = drover_testkit::free_port();
    std::fs::write(
        dir.join("echo.js"),
        format!("require('net').createServer((c) => c.on('data', (d) => c.write(process.pid + ' ' + d))).listen({node_port});\n"),
    )
    .unwrap();
    for (program, handed) in [
        (&["python3", "echo.py"][..], false),
        (&["node", "echo.js"][..], true),
    ] {
        let mut cmd = Command::new(bin());
        cmd.args([
            "run",
            "--tcp",
            "-w",
            "2",
            "-l",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--",
        ])
        .args(program)
        .current_dir(&dir);
        clean_env(&mut cmd);
        let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
        let admin = admin_addr(&d).await;
        wait_all_serving(&d, admin).await;
        let who = format!("{program:?}");
        let (held, pids) = echo_on_held_connections(d.addr(), 6, &who, &d).await;
        assert_eq!(pids.len(), 2, "{program:?}: {pids:?}\n{}", d.stderr_text());
        let handoffs = common::default_metric(admin, "drover_handoffs_total").await;
        assert_eq!(handoffs > 0, handed, "{program:?}: {handoffs} handed over");
        drop(held);
        drover_stops_cleanly(&format!("{program:?}"), &d).await;
    }
    // A drover.toml's mode = "tcp" balancer in front of the Node app hands its
    // connections over the same way.
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n[[app]]\nname = \"echo\"\nworkers = 2\ncommand = [\"node\", {:?}]\n[[balancer]]\nname = \"echo\"\nlisten = \"127.0.0.1:0\"\nmode = \"tcp\"\nbackends = [\"app:echo\"]\n",
        dir.join("echo.js").display().to_string()
    );
    std::fs::write(dir.join("drover.toml"), toml).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["up", "-c", "drover.toml"]).current_dir(&dir);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"echo\" listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let (held, pids) = echo_on_held_connections(d.addr(), 6, "drover up", &d).await;
    assert_eq!(pids.len(), 2, "{pids:?}\n{}", d.stderr_text());
    let text = common::metrics_text(admin).await;
    assert!(
        text.contains("drover_handoffs_total{balancer=\"echo\"} 6"),
        "{text}"
    );
    drop(held);
    drover_stops_cleanly("drover up", &d).await;

    for (flags, says) in [
        (
            &["--health-path", "/h"][..],
            "--health-path does not apply to --tcp",
        ),
        (
            &["--mode", "shared"][..],
            "--tcp does not apply to --mode shared",
        ),
        (
            &["--h2c"][..],
            "--tcp: --h2c: HTTP/2 is read frame by frame",
        ),
    ] {
        let mut words = vec!["--tcp"];
        words.extend_from_slice(flags);
        words.extend_from_slice(&["--", "python3", "echo.py"]);
        run_is_refused(&dir, &words, says);
    }
}

/// The port the app names is taken (the app already runs outside drover, say): drover
/// stops, saying which address and what to pass, and leaves no worker behind; under PM2
/// every worker would crash-loop on EADDRINUSE.
#[tokio::test]
async fn without_listen_a_taken_app_port_stops_drover_with_the_reason() {
    let holder = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = holder.local_addr().unwrap().port();
    let mut cmd = tokio::process::Command::new(bin());
    cmd.args([
        "run",
        "-w",
        "2",
        "--admin",
        "off",
        "--",
        "node",
        "argv-port.js",
    ])
    .arg(port.to_string())
    .current_dir(as_written("."))
    .kill_on_drop(true);
    for var in ["LISTEN_FDS", "LISTEN_PID", "DROVER_WORKER_ID", "PORT"] {
        cmd.env_remove(var);
    }
    let out = tokio::time::timeout(Duration::from_secs(60), cmd.output())
        .await
        .expect("drover stops within a minute")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&format!(
            ":{port} (the port the app's listen() names; pass -l ADDR to serve its clients elsewhere)"
        )),
        "{err}"
    );
    assert!(err.contains("drover: stopped"), "{err}");
    let left = Command::new("pgrep")
        .args(["-f", &format!("argv-port.js {port}")])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "workers left: {}",
        String::from_utf8_lossy(&left.stdout)
    );
    drop(holder);
}

/// `pm2 start app.js -i 3` names the script alone; so may `drover run -w 3 app.js`,
/// with no `--` and no `node`: a script that cannot run by itself gets the interpreter
/// its extension names, as PM2 gives it (`app.py` runs under python3).
#[tokio::test]
async fn a_script_named_alone_runs_under_its_interpreter_as_under_pm2() {
    let examples = as_written("..");
    for (who, script, cwd) in [
        ("node", "hard-coded.js", as_written(".")),
        ("python", "pi-server.py", examples.clone()),
    ] {
        let mut cmd = Command::new(bin());
        cmd.args([
            "run",
            "-w",
            "3",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .args(["--threads", "1", "--strategy", "round-robin", script])
        .current_dir(cwd);
        clean_env(&mut cmd);
        let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
        let admin = admin_addr(&d).await;
        wait_all_serving(&d, admin).await;
        if who == "node" {
            every_worker_answers(who, &d, admin).await;
        } else {
            let r = get(d.addr(), "/pi?iterations=1000").await;
            assert_eq!(r.status, 200, "{who}: {}\n{}", r.text(), d.stderr_text());
        }
        drover_stops_cleanly(who, &d).await;
    }
}

/// `pm2 start argv-port.js -i 3 --name api --max-memory-restart 300M -- PORT`, typed
/// to drover: after a script named alone,
/// the words up to `--` are drover's flags and those after it the app's, as PM2 reads
/// them. Before, `-i 3 …` went to the app, which ran on the default number of workers.
#[tokio::test]
async fn after_a_script_named_alone_drovers_flags_come_first_and_the_apps_after_a_double_dash() {
    let port = drover_testkit::free_port();
    let mut cmd = Command::new(bin());
    cmd.args(["run", "argv-port.js", "-i", "3", "--admin", "127.0.0.1:0"])
        .args(["--name", "api", "--max-memory-restart", "300M"])
        .args(["--threads", "1", "--strategy", "round-robin", "--"])
        .arg(port.to_string())
        .current_dir(as_written("."));
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    // The app got its argument: its listen() named the port, where drover serves.
    assert_eq!(d.addr().port(), port, "{}", d.stderr_text());
    let admin = admin_addr(&d).await;
    let pids = wait_all_serving(&d, admin).await;
    assert_eq!(pids.len(), 3, "-i 3 is drover's: {}", d.stderr_text());
    // PM2's --name is drover's too (and --max-memory-restart, parsed above).
    assert_eq!(
        status(admin).await.apps[0].name,
        "api",
        "{}",
        d.stderr_text()
    );
    every_worker_answers("pm2 order", &d, admin).await;
    drover_stops_cleanly("pm2 order", &d).await;
}

/// PM2's instance counts on the command line: `pm2 start app.js -i 0` runs one worker per
/// core and `-i -1` all cores but one (at least one). Before, drover refused both (0 is
/// not a count, and `-1` read as a flag).
#[tokio::test]
async fn pm2s_instances_0_and_minus_n_are_read_as_pm2_reads_them() {
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    for (given, workers) in [("0", cores), ("-1", (cores - 1).max(1))] {
        let port = drover_testkit::free_port();
        let mut cmd = Command::new(bin());
        cmd.args(["run", "argv-port.js", "-i", given, "--admin", "127.0.0.1:0"])
            .args(["--threads", "1", "--"])
            .arg(port.to_string())
            .current_dir(as_written("."));
        clean_env(&mut cmd);
        let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
        let admin = admin_addr(&d).await;
        let pids = wait_all_serving(&d, admin).await;
        assert_eq!(pids.len(), workers, "-i {given}: {}", d.stderr_text());
        drover_stops_cleanly(&format!("-i {given}"), &d).await;
    }
}

/// A word after a script named alone that is not drover's (PM2 refuses it too): drover
/// starts nothing and says how to give it to the app.
#[tokio::test]
async fn after_a_script_named_alone_a_word_not_drovers_is_refused_with_both_ways_to_pass_it() {
    for (words, named) in [
        (&["--port", "3000"][..], "unexpected argument '--port'"),
        (&["8080"][..], "`8080` is not one"),
    ] {
        let mut cmd = tokio::process::Command::new(bin());
        cmd.args(["run", "argv-port.js", "--admin", "off"])
            .args(words)
            .current_dir(as_written("."))
            .kill_on_drop(true);
        let out = tokio::time::timeout(Duration::from_secs(20), cmd.output())
            .await
            .expect("drover exits at once")
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        let joined = words.join(" ");
        assert!(err.contains(named), "{err}");
        assert!(
            err.contains(&format!("drover run argv-port.js --admin off -- {joined}")),
            "{err}"
        );
        assert!(
            err.contains(&format!(
                "drover run --admin off node argv-port.js {joined}"
            )),
            "{err}"
        );
        assert!(!err.contains("starting"), "nothing starts: {err}");
    }
}

/// Whether this machine has the IPv6 loopback (the tests of `localhost`'s two
/// addresses need it).
fn has_ipv6_loopback() -> bool {
    std::net::TcpListener::bind("[::1]:0").is_ok()
}

/// An app that listens at `localhost` where it names both loopbacks (Fastify's
/// default on Debian: ::1, then 127.0.0.1), on its PORT. drover reaches a worker at
/// 127.0.0.1:PORT; before, the app's socket was bound at ::1 as asked, no worker ever
/// became ready ("no healthy endpoint"), and its second listen() was logged as failed.
#[tokio::test]
async fn an_app_on_its_port_at_both_loopbacks_serves() {
    if !has_ipv6_loopback() {
        eprintln!("skipped: no IPv6 loopback here");
        return;
    }
    let (d, admin) = run(
        3,
        &["node".into(), fixture("both-loopbacks.js")],
        &temp_dir("both-loopbacks-port"),
    )
    .await;
    every_worker_answers("both loopbacks, PORT", &d, admin).await;
    says("both loopbacks, PORT", &d, &["listening at both loopbacks"]).await;
    assert!(!d.stderr_text().contains("failed"), "{}", d.stderr_text());
    drover_stops_cleanly("both loopbacks, PORT", &d).await;
}

/// The same app on a port of its own (from argv), with no --listen: under Node's
/// cluster module its clients reach it at both loopbacks, and so under drover, whose
/// balancer binds both. Before, it bound the first (::1), and a client of 127.0.0.1
/// (`ab`, `curl -4`) was refused.
#[tokio::test]
async fn an_app_at_both_loopbacks_is_served_at_both() {
    if !has_ipv6_loopback() {
        eprintln!("skipped: no IPv6 loopback here");
        return;
    }
    let port = drover_testkit::free_port();
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "-w",
        "2",
        "--admin",
        "127.0.0.1:0",
        "--threads",
        "1",
        "--",
    ])
    .args(["node", &fixture("both-loopbacks.js"), &port.to_string()])
    .current_dir(temp_dir("both-loopbacks-own-port"));
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    says(
        "both loopbacks",
        &d,
        &[&format!("listening on [::1]:{port} and 127.0.0.1:{port}")],
    )
    .await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    for ip in [
        std::net::IpAddr::from([127, 0, 0, 1]),
        std::net::IpAddr::from(std::net::Ipv6Addr::LOCALHOST),
    ] {
        let r = get(SocketAddr::new(ip, port), "/").await;
        assert_eq!(r.status, 200, "{ip}: {}\n{}", r.text(), d.stderr_text());
        assert!(r.text().contains("both loopbacks"), "{}", r.text());
    }
    says("both loopbacks", &d, &["listening at both loopbacks"]).await;
    assert!(!d.stderr_text().contains("failed"), "{}", d.stderr_text());
    // Status names both addresses, as the start line does.
    let (code, out, err) = ctl(admin, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    let both = format!("on [::1]:{port} and 127.0.0.1:{port}");
    assert!(out.contains(&both), "{out}");
    drover_stops_cleanly("both loopbacks", &d).await;
}

/// Fastify as its guide writes it (an ES module, `listen({ port: 3000 })` at
/// `localhost`), on the machine's Node (Fastify 5 needs Node 20).
#[tokio::test]
async fn fastify_as_its_guide_writes_it_runs_unchanged_as_three_workers() {
    let fastify = as_written("fastify");
    assert!(
        fastify.join("node_modules/fastify").exists(),
        "run `npm ci --prefix examples/as-written/fastify` (scripts/test does)"
    );
    let (d, admin) = run(3, &["node".into(), "app.js".into()], &fastify).await;
    every_worker_answers("fastify", &d, admin).await;
    assert!(
        !d.stderr_text().contains("listen() failed"),
        "{}",
        d.stderr_text()
    );
    drover_stops_cleanly("fastify", &d).await;
}

/// Which process answers as which PM2 instance (`NODE_APP_INSTANCE`), over new connections
/// until every one of `workers` has answered.
async fn instances(d: &ChildProcess, workers: usize) -> std::collections::BTreeMap<String, u64> {
    let mut seen = std::collections::BTreeMap::new();
    for _ in 0..60 {
        let r = get(d.addr(), "/").await;
        assert_eq!(r.status, 200, "{}\n{}", r.text(), d.stderr_text());
        let body: serde_json::Value = serde_json::from_str(r.text().trim()).unwrap();
        let instance = body["instance"].as_str().unwrap_or("unset").to_string();
        seen.insert(instance, body["pid"].as_u64().unwrap());
        if seen.len() == workers {
            break;
        }
    }
    seen
}

/// An app written for PM2's cluster mode reads its instance's number from
/// `NODE_APP_INSTANCE` and starts its scheduled job in instance 0 only. drover numbers
/// its workers the same way, 0..N-1, and a restarted worker gets its number again, so
/// the job runs once. Before, the variable was unset: this app ran its job nowhere (and
/// one that tests `!== undefined` first, everywhere).
#[tokio::test]
async fn an_app_written_for_pm2_gets_its_instance_number_and_runs_its_job_once() {
    let mut cmd = Command::new(bin());
    cmd.args(["run", &fixture("pm2-instance.js"), "-i", "3"])
        .args(["--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
        .args(["--threads", "1", "--strategy", "round-robin"]);
    clean_env(&mut cmd);
    cmd.env_remove("NODE_APP_INSTANCE");
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let before = instances(&d, 3).await;
    let numbers: Vec<&str> = before.keys().map(String::as_str).collect();
    assert_eq!(numbers, ["0", "1", "2"], "{}", d.stderr_text());

    let victim = before["1"];
    let killed = Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let replaced = wait_until_async(Duration::from_secs(30), || async {
        let pids = common::serving_pids(&status(admin).await);
        pids.len() == 3
            && pids
                .iter()
                .all(|p| p.is_some_and(|p| u64::from(p) != victim))
    })
    .await;
    assert!(replaced, "{}", d.stderr_text());
    let after = instances(&d, 3).await;
    let numbers: Vec<&str> = after.keys().map(String::as_str).collect();
    assert_eq!(numbers, ["0", "1", "2"], "{}", d.stderr_text());
    assert_ne!(after["1"], victim, "{}", d.stderr_text());
    assert_eq!(after["0"], before["0"], "{}", d.stderr_text());

    let jobs = d.stderr_text().matches("scheduled job started").count();
    assert_eq!(jobs, 1, "{}", d.stderr_text());
    drover_stops_cleanly("pm2 instance", &d).await;
}

/// Whether the consumer's log has a line from instance `instance` in process `pid`.
fn worked(log: &Path, instance: usize, pid: u32) -> bool {
    std::fs::read_to_string(log).is_ok_and(|t| t.lines().any(|l| l == format!("{instance} {pid}")))
}

/// A worker that serves no port (a queue consumer; PM2 runs it as `pm2 start
/// consumer.js`) runs under `--mode background`: no balancer, no PORT, each worker up once
/// it has run a second, and one killed is restarted with its instance number. Before,
/// drover waited for it to listen, stopped it after 30 s and started it again, forever.
/// The flags only a balancer uses are refused in that mode, naming the flag.
#[tokio::test]
async fn a_worker_that_serves_no_port_runs_in_background_mode_and_is_restarted() {
    let log = temp_dir("background").join("ticks");
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "-w",
        "2",
        "--mode",
        "background",
        "--admin",
        "127.0.0.1:0",
    ])
    .args(["--", "node", &fixture("queue-consumer.js")])
    .arg(&log);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "admin API listening on ").await;
    let admin = d.addr();
    let pids: Vec<u32> = wait_all_serving(&d, admin)
        .await
        .into_iter()
        .map(Option::unwrap)
        .collect();
    assert_eq!(pids.len(), 2, "{}", d.stderr_text());
    let s = status(admin).await;
    assert!(s.balancers.is_empty(), "{}", d.stderr_text());
    assert!(
        s.apps[0].workers.iter().all(|w| w.port.is_none()),
        "{}",
        d.stderr_text()
    );
    let both = wait_until_async(Duration::from_secs(10), || async {
        worked(&log, 0, pids[0]) && worked(&log, 1, pids[1])
    })
    .await;
    assert!(both, "{}", d.stderr_text());

    let killed = Command::new("kill")
        .args(["-KILL", &pids[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let again = wait_until_async(Duration::from_secs(20), || async {
        let now = common::serving_pids(&status(admin).await);
        now.len() == 2 && now[0].is_some_and(|p| p != pids[0]) && now[1] == Some(pids[1])
    })
    .await;
    assert!(again, "{}", d.stderr_text());
    let new = common::serving_pids(&status(admin).await)[0].unwrap();
    let works = wait_until_async(Duration::from_secs(10), || async { worked(&log, 0, new) }).await;
    assert!(works, "{}", d.stderr_text());
    let records = restart_records(&status(admin).await);
    assert!(
        records
            .iter()
            .any(|r| r.worker == 0 && r.pid == Some(pids[0])),
        "{records:?}\n{}",
        d.stderr_text()
    );
    drover_stops_cleanly("background", &d).await;

    for flag in [
        &["--listen", "127.0.0.1:0"][..],
        &["--health-path", "/health"][..],
        &["--strategy", "least-conn"][..],
    ] {
        let out = Command::new(bin())
            .args(["run", "--mode", "background", "--admin", "off"])
            .args(flag)
            .args(["--", "node", &fixture("queue-consumer.js"), "/dev/null"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{flag:?}: {err}");
        assert!(
            err.contains(&format!("{} does not apply to --mode background", flag[0])),
            "{flag:?}: {err}"
        );
    }
}

/// An app written for PM2 stops gracefully on SIGINT only, PM2's stop signal; drover
/// stops workers with SIGTERM, which Node answers by ending at once when the app does
/// not listen to it. The preload sends a SIGTERM to the app's SIGINT listeners then, so
/// the app finishes its work, in a background worker and in a cluster worker alike.
#[tokio::test]
async fn an_app_that_stops_on_sigint_only_stops_gracefully() {
    for (who, flags, port) in [
        ("background", &["--mode", "background"][..], None),
        (
            "cluster worker",
            &["--listen", "127.0.0.1:0"][..],
            Some("3000"),
        ),
    ] {
        let mut cmd = Command::new(bin());
        cmd.args(["run", "-w", "1", "--admin", "127.0.0.1:0"])
            .args(flags)
            .args(["--", "node", &fixture("sigint-only.js")])
            .args(port);
        clean_env(&mut cmd);
        let d = spawn_ready_line(cmd, "admin API listening on ").await;
        let pids = wait_all_serving(&d, d.addr()).await;
        let pid = pids[0].unwrap();
        drover_stops_cleanly(who, &d).await;
        let said = format!("pid {pid} finished its work on SIGINT");
        assert!(
            d.stderr_text().contains(&said),
            "{who}: {}",
            d.stderr_text()
        );
    }
}

/// An app that shuts down as Express's guide shows: on SIGTERM it closes its server and
/// lets Node exit once nothing is left (no `process.exit()`). Alone it exits at once.
/// As drover's cluster worker its IPC channel held it until drover's SIGKILL,
/// `stop_timeout` (10 s) later, on every reload, scale-down and stop: a reload of 4
/// workers took over 40 s, and each ended as "signal 9". Under Node 18 its close() also
/// waited 5 s for drover's idle keep-alive connections. Now each worker leaves once its
/// server has closed, under every Node here: a reload under load fails nothing and
/// records exit code 0 for the old workers, and drover stops with no SIGKILL.
#[tokio::test]
async fn an_app_that_closes_its_server_on_sigterm_leaves_once_it_has_closed() {
    for (name, node) in node_binaries() {
        let port = drover_testkit::free_port();
        // PM2's form, for its --kill-timeout: 3 s, below the 5 s for which Node 18's
        // server.close() waited on drover's idle keep-alive connections.
        let mut cmd = Command::new(bin());
        cmd.args(["run", "-w", "2", "--admin", "127.0.0.1:0"])
            .arg(fixture("closes-on-sigterm.js"))
            .args(["--kill-timeout", "3000", "--interpreter"])
            .arg(&node)
            .arg("--")
            .arg(port.to_string());
        clean_env(&mut cmd);
        let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
        let admin = admin_addr(&d).await;
        let before = serving(&d, admin).await;
        let stop = Arc::new(AtomicBool::new(false));
        let at = d.addr();
        let load = paced_requests(stop.clone(), move || async move {
            let r = common::examples::try_get(at, "/")
                .await
                .map_err(|e| e.to_string())?;
            Ok((r.status, r.text()))
        });
        reloaded(&name, &d, admin, &before).await;
        let retired = |r: &drover_admin::RestartRow| {
            r.reason == "reload" && r.pid.is_some_and(|p| before.contains(&p.to_string()))
        };
        let both = wait_until_async(Duration::from_secs(20), || async {
            restart_records(&status(admin).await)
                .iter()
                .filter(|r| retired(r))
                .count()
                == 2
        })
        .await;
        let records = restart_records(&status(admin).await);
        assert!(both, "{name}: {records:?}\n{}", d.stderr_text());
        for r in records.iter().filter(|r| retired(r)) {
            assert_eq!(
                (r.exit_code, r.signal),
                (Some(0), None),
                "{name}: {r:?}\n{}",
                d.stderr_text()
            );
        }
        assert_load_never_failed(&stop, vec![load], 20, "during a reload").await;
        drover_stops_cleanly(&name, &d).await;
        let text = d.stderr_text();
        assert_eq!(
            text.matches(": HTTP server closed").count(),
            4,
            "{name}: each worker's server closed\n{text}"
        );
        assert!(!text.contains("did not exit within"), "{name}: {text}");
    }
}

/// react-router-serve and remix-serve see that their port is free before they listen
/// (get-port): a plain net server listens there and closes, and the app's HTTP server
/// listens next. drover took the probe for the app's server and balanced the app as a
/// TCP protocol of its own, handing its HTTP clients over unread. Now the server that
/// follows the probe decides, under every Node here: the app is balanced as HTTP.
#[tokio::test]
async fn an_app_that_probes_its_port_first_is_balanced_as_the_server_that_follows() {
    for (name, node) in node_binaries() {
        let port = drover_testkit::free_port();
        let mut cmd = Command::new(bin());
        cmd.args(["run", "-w", "3", "--admin", "127.0.0.1:0", "--"])
            .arg(&node)
            .arg(fixture("probes-its-port.js"))
            .arg(port.to_string());
        clean_env(&mut cmd);
        let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
        assert_eq!(d.addr().port(), port, "{name}: {}", d.stderr_text());
        let admin = admin_addr(&d).await;
        serving(&d, admin).await;
        every_worker_answers(&name, &d, admin).await;
        let text = d.stderr_text();
        assert!(
            text.contains("strategy p2c)") && !text.contains("speaks a TCP protocol"),
            "{name}: balanced as HTTP\n{text}"
        );
        drover_stops_cleanly(&name, &d).await;
    }
}

/// A PM2 user's deployment is an ecosystem file, started with `pm2 start
/// ecosystem.config.js --env production`; `drover run` takes the same file and the same
/// words. Its cluster-mode app is served where its workers' listen(PORT) says (the
/// file's `env.PORT`), each worker with its instance number and the `env_production`
/// layer; its fork-mode app runs as a background worker; keys drover does not apply
/// (a log file) are named in a note, not refused. A reload reads the file again, as
/// `pm2 reload ecosystem.config.js` does: a new env and instance count apply under load
/// with no failed request; an app new to the file starts, served where its workers
/// listen, and an app taken out of it runs on, as PM2 leaves it. A new app that cannot
/// serve (its port is taken) changes nothing, and its workers are stopped. Before,
/// `drover run` ran the file as an app: `node ecosystem.config.js` exits at once, and
/// drover restarted it forever; then, a reload that added an app was refused.
#[tokio::test]
async fn a_pm2_ecosystem_file_runs_its_apps_as_pm2_runs_them() {
    let dir = temp_dir("ecosystem");
    let port = drover_testkit::free_port();
    let ticks = dir.join("ticks");
    std::fs::write(
        dir.join("api.js"),
        "require('http').createServer((req, res) => res.end(JSON.stringify({ pid: process.pid, instance: process.env.NODE_APP_INSTANCE, id: process.env.INSTANCE_ID, env: process.env.NODE_ENV }))).listen(process.env.PORT);\n",
    )
    .unwrap();
    let file = |instances: usize, production: &str, consumer: bool, more: &str| {
        format!(
            r#"// As PM2's guide writes one.
module.exports = {{
  apps: [
    {{
      name: 'api',
      script: './api.js',
      instances: {instances},
      exec_mode: 'cluster',
      instance_var: 'INSTANCE_ID',
      out_file: './logs/api.log',
      env: {{ PORT: {port}, NODE_ENV: 'development' }},
      env_production: {{ NODE_ENV: '{production}' }},
    }},
    {consumer}{more}
  ],
  deploy: {{ production: {{ user: 'node', host: 'example.com' }} }},
}};
"#,
            consumer = match consumer {
                true => format!(
                    "{{ name: 'consumer', script: {:?}, args: [{:?}] }},",
                    fixture("queue-consumer.js"),
                    ticks.display().to_string()
                ),
                false => String::new(),
            },
        )
    };
    std::fs::write(
        dir.join("ecosystem.config.js"),
        file(2, "production", true, ""),
    )
    .unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["run", "ecosystem.config.js", "--env", "production"])
        .args(["--admin", "127.0.0.1:0"])
        .current_dir(&dir);
    clean_env(&mut cmd);
    cmd.env_remove("NODE_APP_INSTANCE").env_remove("NODE_ENV");
    let d = spawn_ready_line(cmd, "\"api\" listening on ").await;
    assert_eq!(d.addr().port(), port, "{}", d.stderr_text());
    says(
        "ecosystem",
        &d,
        &["apps[0] (api): out_file: drover prints every worker's output"],
    )
    .await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let s = status(admin).await;
    let names: Vec<&str> = s.apps.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["api", "consumer"], "{}", d.stderr_text());
    let mut seen = BTreeSet::new();
    for _ in 0..40 {
        let r = get(SocketAddr::from(([127, 0, 0, 1], port)), "/").await;
        assert_eq!(r.status, 200, "{}\n{}", r.text(), d.stderr_text());
        let body: serde_json::Value = serde_json::from_str(r.text().trim()).unwrap();
        assert_eq!(body["env"], "production", "{}", d.stderr_text());
        // PM2's instance_var names the same number again.
        assert_eq!(body["id"], body["instance"], "{}", d.stderr_text());
        seen.insert(body["instance"].as_str().unwrap_or("unset").to_string());
    }
    let seen: Vec<&str> = seen.iter().map(String::as_str).collect();
    assert_eq!(seen, ["0", "1"], "{}", d.stderr_text());
    let works = wait_until_async(Duration::from_secs(10), || async {
        let s = status(admin).await;
        let consumer = &s.apps[1];
        assert_eq!(consumer.mode, "background", "{}", d.stderr_text());
        consumer
            .workers
            .iter()
            .filter_map(|w| w.pid)
            .any(|pid| worked(&ticks, 0, pid))
    })
    .await;
    assert!(works, "{}", d.stderr_text());

    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let stop_load = Arc::new(AtomicBool::new(false));
    let load = steady_load(addr, 4, "/", stop_load.clone());
    std::fs::write(
        dir.join("ecosystem.config.js"),
        file(3, "release-2", true, ""),
    )
    .unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    let three = wait_until_async(Duration::from_secs(20), || async {
        let s = status(admin).await;
        s.apps[0].workers.len() == 3
            && s.apps[0]
                .workers
                .iter()
                .all(|w| w.pid.is_some() && w.state == "ready")
    })
    .await;
    assert!(three, "{}", d.stderr_text());
    // The load stops first: its keep-alive connections, handed to workers, keep one of
    // them busy, and drover places each new connection on a less busy one.
    assert_load_never_failed(&stop_load, load, 50, "while the file's apps reloaded").await;
    let mut seen = BTreeSet::new();
    for _ in 0..300 {
        let r = get(addr, "/").await;
        let body: serde_json::Value = serde_json::from_str(r.text().trim()).unwrap();
        assert_eq!(body["env"], "release-2", "{}", d.stderr_text());
        seen.insert(body["instance"].as_str().unwrap_or("unset").to_string());
        if seen.len() == 3 {
            break;
        }
    }
    assert_eq!(seen.len(), 3, "{seen:?}\n{}", d.stderr_text());

    // `pm2 reload` starts an app the file names anew ("Applications extra not running,
    // starting...") and leaves alone one it no longer names. This one hard-codes its
    // port, so drover learns where its clients connect from its workers' listen().
    let extra_port = drover_testkit::free_port();
    std::fs::write(
        dir.join("extra.js"),
        format!("require('http').createServer((req, res) => res.end('extra ' + process.env.NODE_APP_INSTANCE)).listen({extra_port});\n"),
    )
    .unwrap();
    let extra =
        "\n    { name: 'extra', script: './extra.js', instances: 2, exec_mode: 'cluster', cron_restart: '0 3 * * *' },";
    std::fs::write(
        dir.join("ecosystem.config.js"),
        file(3, "release-3", false, extra),
    )
    .unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    for said in [
        "started extra (2 workers)",
        "consumer is not in ecosystem.config.js: it runs on",
    ] {
        assert!(out.contains(said), "{said:?} in {out}{err}");
    }
    // A key drover does not apply is named at a reload too, as at start.
    says("ecosystem reload", &d, &["(extra): cron_restart"]).await;
    let extra_addr = SocketAddr::from(([127, 0, 0, 1], extra_port));
    let mut seen = BTreeSet::new();
    for _ in 0..40 {
        let r = get(extra_addr, "/").await;
        assert_eq!(r.status, 200, "{}\n{}", r.text(), d.stderr_text());
        seen.insert(r.text());
    }
    assert_eq!(seen.len(), 2, "{seen:?}\n{}", d.stderr_text());
    assert!(get(addr, "/").await.text().contains("release-3"));
    let s = status(admin).await;
    let names: Vec<&str> = s.apps.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["api", "consumer", "extra"], "{}", d.stderr_text());
    // It runs on: its ticks go on growing.
    let ticked = || std::fs::read_to_string(&ticks).map_or(0, |t| t.lines().count());
    let since = ticked();
    let works = wait_until_async(Duration::from_secs(10), || async { ticked() > since + 2 }).await;
    assert!(works, "the consumer left out of the file stopped working");

    // A new app that cannot serve: its port is another program's. The reload says
    // why, its workers stop, and nothing else changes.
    let taken = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port();
    std::fs::write(
        dir.join("blocked.js"),
        format!("require('http').createServer((req, res) => res.end('blocked')).listen({taken_port});\n"),
    )
    .unwrap();
    let blocked = format!(
        "{extra}\n    {{ name: 'blocked', script: './blocked.js', exec_mode: 'cluster' }},"
    );
    std::fs::write(
        dir.join("ecosystem.config.js"),
        file(3, "release-4", false, &blocked),
    )
    .unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_ne!(code, 0, "{out}{err}");
    for said in [
        "balancer \"blocked\": cannot listen on",
        "the port the app's listen() names",
        "nothing was reloaded",
    ] {
        assert!(err.contains(said), "{said:?} in {out}{err}");
    }
    assert!(get(addr, "/").await.text().contains("release-3"));
    let s = status(admin).await;
    let names: Vec<&str> = s.apps.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["api", "consumer", "extra"], "{}", d.stderr_text());
    let extra_pids: Vec<u32> = s.apps[2].workers.iter().filter_map(|w| w.pid).collect();
    let blocked_pids = node_pids_running(&dir, "blocked.js");
    assert!(
        blocked_pids.is_empty(),
        "blocked's workers run on: {blocked_pids:?}"
    );
    drop(taken);
    drover_stops_cleanly("ecosystem", &d).await;
    let outlived: Vec<&u32> = extra_pids.iter().filter(|p| alive(**p)).collect();
    assert!(
        outlived.is_empty(),
        "the added app's workers outlived drover: {outlived:?}"
    );
}

/// The pids of processes running in `dir` whose command line names `script`: another
/// run of the same test, at the same time, has its own directory.
fn node_pids_running(dir: &Path, script: &str) -> Vec<u32> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cwd = std::fs::read_link(entry.path().join("cwd")).ok();
        if String::from_utf8_lossy(&cmdline).contains(script)
            && cwd.as_deref() == Some(dir.as_path())
            && alive(pid)
        {
            pids.push(pid);
        }
    }
    pids
}

/// An ecosystem file as an ES module (`export default`), and ones that cannot run: each
/// error names the file and what is wrong, and nothing starts.
#[tokio::test]
async fn ecosystem_files_in_esm_run_and_bad_ones_are_refused_naming_why() {
    let dir = temp_dir("ecosystem-esm");
    let (port, env_port) = (drover_testkit::free_port(), drover_testkit::free_port());
    std::fs::write(
        dir.join("app.mjs"),
        "import http from 'node:http';\nhttp.createServer((req, res) => res.end(`${process.pid}`)).listen(Number(process.argv[2]));\n",
    )
    .unwrap();
    // The app listens on the port its argv names: clients connect there, whatever
    // `port` (its PORT) says, as under PM2.
    std::fs::write(
        dir.join("ecosystem.config.mjs"),
        format!("export default {{ apps: [{{ name: 'web', script: 'app.mjs', args: '{port}', instances: 2, port: {env_port} }}] }};\n"),
    )
    .unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["run", "ecosystem.config.mjs", "--admin", "127.0.0.1:0"])
        .current_dir(&dir);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"web\" listening on ").await;
    assert_eq!(d.addr().port(), port, "{}", d.stderr_text());
    says("ecosystem esm", &d, &["clients connect there"]).await;
    // -l is refused with a file, so the line must not offer it.
    assert!(!d.stderr_text().contains("-l ADDR"), "{}", d.stderr_text());
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let r = get(SocketAddr::from(([127, 0, 0, 1], port)), "/").await;
    assert_eq!(r.status, 200, "{}", d.stderr_text());
    drover_stops_cleanly("ecosystem esm", &d).await;

    std::fs::write(
        dir.join("throws.config.js"),
        "throw new Error('DATABASE_URL is not set');\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("cut.config.js"),
        "module.exports = { apps: [ { script: 'app.mjs' \n",
    )
    .unwrap();
    // Top-level code that never ends: drover gives up on it, naming the file.
    std::fs::write(dir.join("spins.config.js"), "while (true) {}\n").unwrap();
    std::fs::write(
        dir.join("noscript.config.js"),
        "module.exports = { apps: [{ name: 'web' }] };\n",
    )
    .unwrap();
    for (args, needle) in [
        (
            &["throws.config.js"][..],
            "throws.config.js: node could not evaluate it",
        ),
        (&["throws.config.js"][..], "DATABASE_URL is not set"),
        (&["cut.config.js"][..], "SyntaxError"),
        (
            &["spins.config.js"][..],
            "spins.config.js: node did not finish evaluating it within 10 s",
        ),
        (
            &["noscript.config.js"][..],
            "noscript.config.js: apps[0]: no `script`",
        ),
        (&["gone.config.js"][..], "gone.config.js: no such file"),
        (
            &["ecosystem.config.mjs", "--listen", "127.0.0.1:0"][..],
            "--listen does not apply to an ecosystem file",
        ),
        (
            &["ecosystem.config.mjs", "--only", "api"][..],
            "--only \"api\": ecosystem.config.mjs has no app of that name (it has web)",
        ),
        (&["ecosystem.yml"][..], "not YAML"),
        (
            &["--env", "production", "--", "node", "app.mjs"][..],
            "--env applies to a PM2 ecosystem file",
        ),
    ] {
        run_is_refused(&dir, args, needle);
    }
}

/// PM2's other ways to name a program: `pm2 start npm --name web -i 2 -- start` (a
/// program, PM2's flags, `--`, the program's words), and a command line in one word,
/// `pm2 start "npm start" -i 2` (run directly when it is plain words, by bash when it
/// has shell syntax). Before, drover gave npm `--name web -i 2 -- start`, and looked
/// for a program named "npm start".
#[tokio::test]
async fn pm2s_program_and_command_line_forms_run_as_under_pm2() {
    let dir = as_written(".");
    let express = as_written("express");
    let cases: [(&str, &[&str], &Path, &str); 3] = [
        (
            "npm then flags",
            &["npm", "--name", "web", "-i", "2"],
            &express,
            "Hello World from Express",
        ),
        (
            "one word",
            &["npm start", "-i", "2", "--name", "web"],
            &express,
            "Hello World from Express",
        ),
        (
            "shell line",
            &["node hard-coded.js; exit", "-i", "2", "--name", "web"],
            &dir,
            "Hello from server1",
        ),
    ];
    for (who, words, cwd, answer) in cases {
        let mut cmd = Command::new(bin());
        cmd.arg("run").args(words).args([
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--threads",
            "1",
        ]);
        if who == "npm then flags" {
            cmd.args(["--", "start"]);
        }
        cmd.current_dir(cwd);
        clean_env(&mut cmd);
        let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
        let admin = admin_addr(&d).await;
        wait_all_serving(&d, admin).await;
        let s = status(admin).await;
        assert_eq!(s.apps[0].name, "web", "{who}\n{}", d.stderr_text());
        assert_eq!(s.apps[0].workers.len(), 2, "{who}\n{}", d.stderr_text());
        for _ in 0..4 {
            let r = get(d.addr(), "/").await;
            assert!(
                r.text().starts_with(answer),
                "{who}: {}\n{}",
                r.text(),
                d.stderr_text()
            );
        }
        drover_stops_cleanly(who, &d).await;
    }
    // A program's flags that are not drover's, before a `--`, stay the program's: here
    // the program is not found, and the error says so.
    let out = Command::new(bin())
        .args([
            "run",
            "--admin",
            "off",
            "no-such-program",
            "--inspect",
            "--",
            "x.js",
        ])
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("no-such-program"), "{err}");
    assert!(!err.contains("drover reads the words"), "{err}");
}

/// `drover run --watch`, as `pm2 start app.js --watch`: a saved file reloads the app,
/// rolling, with no failed request under load (PM2 restarts it); a change below
/// node_modules does not (PM2's default ignore). The app logs each request to a file
/// beside its code, which changes all the time under load: before, each write put
/// the reload off by the watch delay, and the saved file was never applied.
#[tokio::test]
async fn watch_reloads_the_app_on_a_change_with_no_failed_request() {
    let dir = temp_dir("watch");
    let app = |v: &str| {
        format!("require('http').createServer((req, res) => {{ require('fs').appendFileSync('requests.log', req.url + '\\n'); res.end('{v} ' + process.pid); }}).listen(process.env.PORT);\n")
    };
    std::fs::write(dir.join("app.js"), app("v1")).unwrap();
    std::fs::create_dir_all(dir.join("node_modules/dep")).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(
        "run --watch -w 2 --listen 127.0.0.1:0 --admin 127.0.0.1:0 --threads 1 -- node app.js"
            .split(' '),
    )
    .current_dir(&dir);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    let before = wait_all_serving(&d, admin).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load(d.addr(), 2, "/", stop.clone());

    std::fs::write(dir.join("node_modules/dep/index.js"), "x").unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(common::serving_pids(&status(admin).await), before);
    assert!(
        !d.stderr_text().contains("changed; reloading"),
        "{}",
        d.stderr_text()
    );

    std::fs::write(dir.join("app.js"), app("v2")).unwrap();
    says(
        "watch",
        &d,
        &[
            "app \"app\": app.js changed; reloading",
            "app \"app\" reloaded after the change",
        ],
    )
    .await;
    let r = get(d.addr(), "/").await;
    assert!(r.text().starts_with("v2 "), "{}", r.text());
    assert_load_never_failed(&stop, load, 50, "while a file change reloaded the app").await;
    drover_stops_cleanly("watch", &d).await;

    // A watched path that is not there is refused at start, naming it; nothing runs.
    std::fs::write(
        dir.join("ecosystem.config.js"),
        "module.exports = { apps: [{ name: 'web', script: 'app.js', watch: ['src'] }] };\n",
    )
    .unwrap();
    run_is_refused(
        &dir,
        &["ecosystem.config.js"],
        &format!(
            "app \"web\": cannot watch {}: No such file",
            dir.join("src").display()
        ),
    );
}

/// A reload watches as the ecosystem file now says, as `pm2 reload ecosystem.config.js`
/// does: `watch` added to an app watches its files from then on, and taken out stops
/// watching them; a watched path that is not there fails the reload with nothing
/// changed. Before, watches were set at start only.
#[tokio::test]
async fn a_reload_watches_as_the_file_now_says() {
    let dir = temp_dir("watch-reload");
    let port = drover_testkit::free_port();
    let app = |v: &str| {
        format!("require('http').createServer((req, res) => res.end('{v} ' + process.pid)).listen(process.env.PORT);\n")
    };
    let file = |watch: &str| {
        format!("module.exports = {{ apps: [{{ name: 'web', script: 'app.js', instances: 2, exec_mode: 'cluster', env: {{ PORT: {port} }}{watch} }}] }};\n")
    };
    std::fs::write(dir.join("app.js"), app("v1")).unwrap();
    std::fs::write(dir.join("ecosystem.config.js"), file("")).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["run", "ecosystem.config.js", "--admin", "127.0.0.1:0"])
        .current_dir(&dir);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"web\" listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let at = SocketAddr::from(([127, 0, 0, 1], port));
    let reloads = |d: &ChildProcess| d.stderr_text().matches("changed; reloading").count();

    // Not watched: a change does nothing.
    std::fs::write(dir.join("app.js"), app("v2")).unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(reloads(&d), 0, "{}", d.stderr_text());
    assert!(get(at, "/").await.text().starts_with("v1 "));

    // A path that is not there: the reload fails, and the app runs on as it was.
    let before = wait_all_serving(&d, admin).await;
    std::fs::write(dir.join("ecosystem.config.js"), file(", watch: ['src']")).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains(&format!("cannot watch {}", dir.join("src").display()))
            && err.contains("nothing was reloaded"),
        "{err}"
    );
    assert_eq!(common::serving_pids(&status(admin).await), before);

    // watch added: the reload applies it, and the next change reloads the app.
    std::fs::write(dir.join("ecosystem.config.js"), file(", watch: true")).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    wait_all_serving(&d, admin).await;
    assert!(get(at, "/").await.text().starts_with("v2 "));
    std::fs::write(dir.join("app.js"), app("v3")).unwrap();
    says(
        "watch added by a reload",
        &d,
        &[
            "app \"web\": app.js changed; reloading",
            "app \"web\" reloaded after the change",
        ],
    )
    .await;
    assert!(get(at, "/").await.text().starts_with("v3 "));

    // watch taken out: changes do nothing again.
    std::fs::write(dir.join("ecosystem.config.js"), file("")).unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    wait_all_serving(&d, admin).await;
    let seen = reloads(&d);
    std::fs::write(dir.join("app.js"), app("v4")).unwrap();
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert_eq!(reloads(&d), seen, "{}", d.stderr_text());
    assert!(get(at, "/").await.text().starts_with("v3 "));
    drover_stops_cleanly("watch reload", &d).await;
}

/// The same for a drover.toml: `watch = true` added to an `[[app]]` and `drover ctl
/// reload` watch its files from then on.
#[tokio::test]
async fn a_drover_toml_reload_watches_as_it_now_says() {
    let dir = temp_dir("watch-reload-toml");
    let app = |v: &str| {
        format!("require('http').createServer((req, res) => res.end('{v} ' + process.pid)).listen(process.env.PORT);\n")
    };
    let toml = |watch: &str| {
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:web\"]\n\n[[app]]\nname = \"web\"\ncommand = [\"node\", \"app.js\"]\nworkers = 2\ncwd = {:?}\n{watch}",
            dir.display().to_string()
        )
    };
    std::fs::write(dir.join("app.js"), app("v1")).unwrap();
    std::fs::create_dir_all(dir.join("conf")).unwrap();
    let file = dir.join("conf/drover.toml");
    std::fs::write(&file, toml("")).unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["up", "-c", file.to_str().unwrap()]);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    std::fs::write(&file, toml("watch = true\n")).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    wait_all_serving(&d, admin).await;
    std::fs::write(dir.join("app.js"), app("v2")).unwrap();
    says(
        "drover.toml watch added by a reload",
        &d,
        &[
            "app \"web\": app.js changed; reloading",
            "app \"web\" reloaded after the change",
        ],
    )
    .await;
    assert!(get(d.addr(), "/").await.text().starts_with("v2 "));
    drover_stops_cleanly("drover.toml watch reload", &d).await;
}

/// `pm2 start app.js -i 2 --name api --kill-timeout 3000 --node-args=… --watch -o out.log`
/// as a PM2 user writes it: PM2's own flags after the script apply as the keys they
/// stand for (the app gets its node args; a file change reloads it), or are named in a
/// note saying why not, and
/// never become the app's arguments. Before, each was refused as a word meant for the
/// app.
#[tokio::test]
async fn pm2s_own_flags_after_a_script_apply_or_are_noted() {
    let dir = temp_dir("pm2-flags");
    std::fs::write(
        dir.join("app.js"),
        "require('http').createServer((req, res) => res.end(JSON.stringify({ execArgv: process.execArgv, argv: process.argv.slice(2), cwd: process.cwd() }))).listen(process.env.PORT);\n",
    )
    .unwrap();
    // Run from another directory: the script is found under `--cwd`, as PM2 finds it.
    let elsewhere = temp_dir("pm2-flags-elsewhere");
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "app.js",
        "-i",
        "2",
        "-n",
        "api",
        "--kill-timeout",
        "3000",
    ])
    .args(["--cwd", dir.to_str().unwrap()])
    .args([
        "--node-args=--max-old-space-size=300 --no-warnings",
        "--time",
    ])
    .args(["--watch", "-o", "out.log", "-l", "all.log", "--merge-logs"])
    .args([
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--threads",
        "1",
    ])
    .args(["--", "--port", "1"])
    .current_dir(&elsewhere);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    says(
        "pm2 flags",
        &d,
        &["note: PM2's flag: -o out.log, -l all.log: drover prints every worker's output"],
    )
    .await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let s = status(admin).await;
    assert_eq!(s.apps[0].name, "api", "{}", d.stderr_text());
    assert_eq!(s.apps[0].workers.len(), 2, "{}", d.stderr_text());
    let r = get(d.addr(), "/").await;
    let body: serde_json::Value = serde_json::from_str(r.text().trim()).unwrap();
    assert_eq!(
        body["argv"],
        serde_json::json!(["--port", "1"]),
        "{}",
        d.stderr_text()
    );
    assert_eq!(
        body["cwd"].as_str().map(Path::new),
        Some(dir.as_path()),
        "{}",
        d.stderr_text()
    );
    let exec_argv = body["execArgv"].to_string();
    assert!(
        exec_argv.contains("--max-old-space-size=300") && exec_argv.contains("--no-warnings"),
        "{exec_argv}\n{}",
        d.stderr_text()
    );
    // --watch applies: a file written in the app's directory reloads it.
    std::fs::write(dir.join("routes.js"), "// a new route\n").unwrap();
    says(
        "pm2 flags",
        &d,
        &[
            "app \"api\": routes.js changed; reloading",
            "app \"api\" reloaded after the change",
        ],
    )
    .await;
    drover_stops_cleanly("pm2 flags", &d).await;

    // Bad values are refused, naming the flag; nothing starts.
    std::fs::write(
        dir.join("ecosystem.config.js"),
        "module.exports = { apps: [{ script: 'app.js' }] };\n",
    )
    .unwrap();
    for (words, needle) in [
        (
            &["app.js", "--kill-timeout"][..],
            "--kill-timeout: PM2's flag takes a value",
        ),
        (
            &["app.js", "--listen-timeout", "0"][..],
            "--listen-timeout 0 must be more than 0",
        ),
        (&["app.js", "-k", "soon"][..], "PM2's flag: -k soon: "),
        (
            &["ecosystem.config.js", "--wait-ready"][..],
            "--wait-ready does not apply to an ecosystem file",
        ),
        (
            &["ecosystem.config.js", "--kill-timeout", "3000"][..],
            "--kill-timeout 3000: with an ecosystem file, give it in the file (`kill_timeout`)",
        ),
    ] {
        run_is_refused(&dir, words, needle);
    }
}

/// PM2's `wait_ready`: an app that listens at once but warms up first (answering 503
/// meanwhile) and then calls `process.send('ready')`. With `--wait-ready` a rolling
/// reload under load fails no request: a new worker gets clients only once it said
/// ready. Without it, the same reload sends clients to workers still warming up (503s),
/// which shows the test can fail. An app whose code never sends 'ready' is served once
/// `--ready-timeout` has passed (3 s while no other worker serves), with a warning, and
/// never restarted for it.
#[tokio::test]
async fn wait_ready_holds_clients_until_the_app_says_ready_as_under_pm2() {
    let dir = temp_dir("wait-ready");
    std::fs::write(
        dir.join("warm.js"),
        r#"let ready = false;
require('http').createServer((req, res) => {
  if (!ready) { res.statusCode = 503; return res.end('warming up\n'); }
  res.end(`ok ${process.pid}\n`);
}).listen(process.env.PORT, () => setTimeout(() => {
  ready = true;
  if (process.env.SAY_READY !== '0') process.send('ready');
}, 2000));
"#,
    )
    .unwrap();
    let start = |flags: &[&str], say_ready: bool| {
        let mut cmd = Command::new(bin());
        cmd.args(["run", "-w", "2"])
            .args(flags)
            .args(["-l", "127.0.0.1:0", "--admin", "127.0.0.1:0"])
            .args(["--threads", "1", "--", "node", "warm.js"])
            .current_dir(&dir);
        clean_env(&mut cmd);
        cmd.env("SAY_READY", if say_ready { "1" } else { "0" });
        spawn_ready_line(cmd, "\"default\" listening on ")
    };
    for wait_ready in [true, false] {
        let who = if wait_ready {
            "--wait-ready"
        } else {
            "without"
        };
        let flags: &[&str] = if wait_ready { &["--wait-ready"] } else { &[] };
        let d = start(flags, true).await;
        let admin = admin_addr(&d).await;
        wait_all_serving(&d, admin).await;
        let warm = wait_until_async(Duration::from_secs(10), || async {
            get(d.addr(), "/").await.status == 200
        })
        .await;
        assert!(warm, "{who}\n{}", d.stderr_text());
        let stop = Arc::new(AtomicBool::new(false));
        let load = steady_load(d.addr(), 4, "/", stop.clone());
        let (code, out, err) = ctl(admin, &["reload"]).await;
        assert_eq!(code, 0, "{who}: {out}{err}\n{}", d.stderr_text());
        if wait_ready {
            assert_load_never_failed(&stop, load, 50, "in a reload with --wait-ready").await;
        } else {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let mut failed = Vec::new();
            for l in load {
                failed.extend(l.await.unwrap().1);
            }
            assert!(
                failed.iter().any(|f| f.starts_with("503")),
                "without --wait-ready, clients should have met a warming worker: {failed:?}\n{}",
                d.stderr_text()
            );
        }
        drover_stops_cleanly(who, &d).await;
    }

    // Its code never sends 'ready'. At a cold start no other worker serves, so each is
    // held back only PM2's 3 s; in a reload the old workers serve, and the new one
    // waits all of --ready-timeout. Never a restart for it.
    let d = start(&["--wait-ready", "--ready-timeout", "6s"], false).await;
    says(
        "never ready",
        &d,
        &["has not sent process.send('ready') within 3s (wait_ready), and no other worker of app serves: it gets clients now"],
    )
    .await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load(d.addr(), 2, "/", stop.clone());
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    says(
        "never ready",
        &d,
        &["has not sent process.send('ready') within 6s (wait_ready): it gets clients anyway"],
    )
    .await;
    assert_load_never_failed(
        &stop,
        load,
        50,
        "in a reload of an app that never says ready",
    )
    .await;
    let records = restart_records(&status(admin).await);
    assert!(
        records.iter().all(|r| r.reason == "reload"),
        "{records:?}\n{}",
        d.stderr_text()
    );
    drover_stops_cleanly("never ready", &d).await;

    // Workers that cannot send it: refused at start, naming why; nothing starts.
    for (words, needle) in [
        (
            &["--wait-ready", "--", "python3", "-m", "http.server", "{port}"][..],
            "wait_ready: a worker says it is ready with process.send('ready') over Node's IPC channel, and python3 is not Node",
        ),
        (
            &["--wait-ready", "--mode", "background", "--", "node", "warm.js"][..],
            "which background mode does not open",
        ),
    ] {
        run_is_refused(&dir, words, needle);
    }
}

/// PM2's `increment_var`: fork-mode instances of one app, each on its own port
/// (`PORT`, `PORT+1`), as a PM2 user puts several processes behind their own nginx.
/// Before, every instance got the same `PORT`, and all but one crash-looped on
/// EADDRINUSE.
#[tokio::test]
async fn increment_var_gives_fork_mode_instances_ports_of_their_own_as_pm2_does() {
    let dir = temp_dir("increment-var");
    // Two ports in a row, both free.
    let port = (0..100)
        .map(|_| drover_testkit::free_port())
        .find(|p| std::net::TcpListener::bind(("127.0.0.1", p + 1)).is_ok())
        .expect("two free ports in a row");
    std::fs::write(
        dir.join("api.js"),
        "require('http').createServer((req, res) => res.end(`${process.env.NODE_APP_INSTANCE} ${process.env.PORT}`)).listen(process.env.PORT, '127.0.0.1');\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("ecosystem.config.js"),
        format!("module.exports = {{ apps: [{{ name: 'api', script: 'api.js', exec_mode: 'fork', instances: 2, increment_var: 'PORT', env: {{ PORT: {port} }} }}] }};\n"),
    )
    .unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["run", "ecosystem.config.js", "--admin", "127.0.0.1:0"])
        .current_dir(&dir);
    clean_env(&mut cmd);
    cmd.env_remove("PORT");
    // No balancer for fork-mode apps: the admin API's line is the one with an address.
    let d = spawn_ready_line(cmd, "admin API listening on ").await;
    let admin = d.addr();
    for (instance, p) in [(0, port), (1, port + 1)] {
        let addr = SocketAddr::from(([127, 0, 0, 1], p));
        let answered = wait_until_async(Duration::from_secs(10), || async {
            common::examples::try_get(addr, "/")
                .await
                .is_ok_and(|r| r.text() == format!("{instance} {p}"))
        })
        .await;
        assert!(answered, "instance {instance} at {p}\n{}", d.stderr_text());
    }
    let s = status(admin).await;
    assert!(
        s.apps[0].workers.iter().all(|w| w.restarts == 0),
        "{}",
        d.stderr_text()
    );
    drover_stops_cleanly("increment_var", &d).await;
}

/// `drover run --mode shared -w WORKERS` of `command` in `cwd`, once every worker serves:
/// no balancer, each worker accepts on a socket of its own that drover passes it.
async fn run_shared(workers: usize, command: &[String], cwd: &Path) -> (ChildProcess, SocketAddr) {
    let mut cmd = Command::new(bin());
    cmd.args(["run", "--mode", "shared", "-w", &workers.to_string()])
        .args("--listen 127.0.0.1:0 --admin 127.0.0.1:0 --".split(' '))
        .args(command)
        .current_dir(cwd);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"app\" listening on ").await;
    let admin = admin_addr(&d).await;
    serving(&d, admin).await;
    (d, admin)
}

/// Asks `/` on new connections, 20 ms apart for up to 15 s, until every serving
/// worker's pid was in an answer. In shared mode a worker whose CPU reads busy (a Node
/// still starting on a loaded machine) gets few new connections until it is not.
async fn every_worker_answers_in_time(who: &str, d: &ChildProcess, admin: SocketAddr) {
    let pids = serving(d, admin).await;
    let mut answered = BTreeSet::new();
    let mut bodies = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while answered != pids && std::time::Instant::now() < deadline {
        let r = common::examples::try_get(d.addr(), "/")
            .await
            .unwrap_or_else(|e| panic!("{who}: GET /: {e}\n{}", d.stderr_text()));
        let body = r.text();
        assert_eq!(r.status, 200, "{who}: {body}\n{}", d.stderr_text());
        answered.extend(pids.iter().filter(|p| body.contains(p.as_str())).cloned());
        if bodies.len() < 10 {
            bodies.push(body);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        answered,
        pids,
        "{who}: answers from {answered:?} of {pids:?}; the first: {bodies:?}\n{}",
        d.stderr_text()
    );
}

/// Shared mode passes each worker a listening socket (fd 3, as systemd does), and an app
/// as written listens on a port of its own instead: before, its workers bound 3000 (all
/// but one crash-looped) and clients' connections waited on drover's sockets, unserved.
/// drover's preload makes the app's first listen() serve the socket, whatever port it
/// names, on every Node, below npm too, and every worker answers at drover's address.
/// A second port cannot be shared in this mode: the output says why, and what to run.
#[tokio::test]
async fn apps_as_written_serve_drovers_sockets_in_shared_mode_on_every_node() {
    let dir = as_written(".");
    let express = as_written("express");
    assert!(
        express.join("node_modules/express").exists(),
        "run `npm ci --prefix examples/as-written/express` (scripts/test does)"
    );
    for (name, node) in node_binaries() {
        let node = node.display().to_string();
        for (what, command, cwd) in apps_naming_their_port(&node, &dir, &express) {
            let who = format!("shared mode, {name}: {what}");
            let (d, admin) = run_shared(3, &command, &cwd).await;
            every_worker_answers_in_time(&who, &d, admin).await;
            // Nothing listens on a port of its own: the looks would name it.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            assert!(
                !d.stderr_text().contains("listens on") && !d.stderr_text().contains("EADDRINUSE"),
                "{who}:\n{}",
                d.stderr_text()
            );
            drover_stops_cleanly(&who, &d).await;
        }
    }

    // `npm start`: npm's Node closes fd 3 for what it starts; the app below finds the
    // socket past it. (The answers name the app's pids, below npm's.)
    let npm = vec!["npm".to_string(), "start".to_string()];
    let (d, _) = run_shared(2, &npm, &express).await;
    let mut answered = BTreeSet::new();
    for _ in 0..30 {
        let r = get(d.addr(), "/").await;
        let body = r.text();
        assert!(
            body.starts_with("Hello World from Express (pid "),
            "{body}\n{}",
            d.stderr_text()
        );
        answered.insert(body);
        if answered.len() == 2 {
            break;
        }
    }
    assert_eq!(answered.len(), 2, "{answered:?}\n{}", d.stderr_text());
    drover_stops_cleanly("shared mode, npm start", &d).await;

    // Below npm, an app that reads systemd's socket variables itself, as SvelteKit's
    // adapter-node does: it refuses a LISTEN_PID not its own, and every worker threw
    // (it was npm's), crash-looping. It is told none, and serves the socket.
    let aware = temp_dir("shared-systemd-aware");
    std::fs::write(
        aware.join("package.json"),
        r#"{ "name": "aware", "private": true, "scripts": { "start": "node app.js" } }"#,
    )
    .unwrap();
    std::fs::write(
        aware.join("app.js"),
        "const pid = Number(process.env.LISTEN_PID || 0);\n\
         if (pid !== 0 && pid !== process.pid) throw new Error(`received LISTEN_PID ${pid} but current process id is ${process.pid}`);\n\
         const server = require('http').createServer((q, s) => s.end(`aware ${process.pid}`));\n\
         if (process.env.LISTEN_FDS === '1') server.listen({ fd: 3 }); else server.listen(3000);\n",
    )
    .unwrap();
    let (d, _) = run_shared(2, &npm, &aware).await;
    let r = get(d.addr(), "/").await;
    assert!(
        r.text().starts_with("aware "),
        "{}\n{}",
        r.text(),
        d.stderr_text()
    );
    assert!(
        !d.stderr_text().contains("LISTEN_PID"),
        "{}",
        d.stderr_text()
    );
    drover_stops_cleanly("shared mode, npm start, systemd-aware", &d).await;

    // A second port that nothing handles a failure of: every worker's copy binds it.
    let second = drover_testkit::free_port();
    let app = format!(
        "const http = require('http');\
         http.createServer((q, s) => s.end(`first ${{process.pid}}`)).listen(3000);\
         http.createServer((q, s) => s.end('metrics')).listen({second});"
    );
    let command = vec!["node".to_string(), "-e".to_string(), app];
    let mut cmd = Command::new(bin());
    cmd.args("run --mode shared -w 2 --listen 127.0.0.1:0 --admin off --".split(' '))
        .args(&command);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"app\" listening on ").await;
    says(
        "second port",
        &d,
        &[
            &format!("cannot listen on port {second}, which another process holds"),
            "(it named port 3000)",
            "Run the app without --mode shared",
            &format!("listens on [::]:{second} itself"),
        ],
    )
    .await;
    // The first port still serves.
    let r = get(d.addr(), "/").await;
    assert!(r.text().starts_with("first "), "{}", r.text());
    drover_stops_cleanly("second port", &d).await;
}

/// Keep-alive clients that send request after request on their connections, until
/// `stop`: how many answers came, and every failure. A `Connection: close` answer is a
/// server's way to end a connection cleanly: the client opens a new one, as every HTTP
/// client does.
fn keep_alive_load(
    at: SocketAddr,
    clients: usize,
    stop: Arc<AtomicBool>,
) -> Vec<tokio::task::JoinHandle<(usize, Vec<String>)>> {
    (0..clients)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0, Vec::new());
                'connections: while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let mut c = match drover_testkit::HttpClient::connect(at).await {
                        Ok(c) => c,
                        Err(e) => {
                            failed.push(format!("connect: {e}"));
                            continue;
                        }
                    };
                    c.set_timeout(Duration::from_secs(10));
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        match c.request("GET", "/", &[], None).await {
                            Ok(r) if r.status == 200 => {
                                ok += 1;
                                if r.header("connection")
                                    .is_some_and(|v| v.eq_ignore_ascii_case("close"))
                                {
                                    continue 'connections;
                                }
                            }
                            Ok(r) => failed.push(format!("{} {}", r.status, r.text())),
                            Err(e) => {
                                failed.push(e.to_string());
                                continue 'connections;
                            }
                        }
                    }
                }
                (ok, failed)
            })
        })
        .collect()
}

/// In shared mode a worker serves its keep-alive clients itself, and an app as written
/// has no SIGTERM handler: drover's SIGTERM ended it at once, and the request each of its
/// clients had just sent was lost (wrk -c8 counted 11 over a reload and a scale-down).
/// drover's preload now drains the worker first, as Node's cluster module disconnects
/// one: it stops accepting, answers what comes with `Connection: close` and closes a
/// connection that sends nothing for a second. Under keep-alive load, a reload and a
/// scale-down fail nothing, and the retired workers end by the SIGTERM, not by the
/// SIGKILL `stop_timeout` later, though a client keeps an idle connection open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_as_written_in_shared_mode_is_reloaded_and_scaled_under_keep_alive_load_without_a_failure(
) {
    for (name, node) in node_binaries() {
        let command = vec![node.display().to_string(), "hard-coded.js".to_string()];
        let (d, admin) = run_shared(2, &command, &as_written(".")).await;
        let before = serving(&d, admin).await;
        // One client that sends a request and then nothing.
        let mut idle = drover_testkit::HttpClient::connect(d.addr()).await.unwrap();
        let r = idle.request("GET", "/", &[], None).await.unwrap();
        assert_eq!(r.status, 200);
        let stop = Arc::new(AtomicBool::new(false));
        let load = keep_alive_load(d.addr(), 6, stop.clone());
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = reloaded(&name, &d, admin, &before).await;
        let (code, out, err) = ctl(admin, &["scale", "1"]).await;
        assert_eq!(code, 0, "{name}: {out}{err}");
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (mut ok, mut failed) = (0, Vec::new());
        for l in load {
            let (n, f) = l.await.unwrap();
            ok += n;
            failed.extend(f);
        }
        assert!(ok > 200, "{name}: too little load to mean anything: {ok}");
        assert!(
            failed.is_empty(),
            "{name}: {} of {} requests failed: {:?}\n{}",
            failed.len(),
            ok + failed.len(),
            &failed[..failed.len().min(5)],
            d.stderr_text()
        );
        // Three retired: the two the reload replaced, and one of theirs.
        let retired: BTreeSet<String> = before.union(&after).cloned().collect();
        let ended = wait_until_async(Duration::from_secs(30), || async {
            restart_records(&status(admin).await)
                .iter()
                .filter(|r| r.pid.is_some_and(|p| retired.contains(&p.to_string())))
                .count()
                == 3
        })
        .await;
        let records = restart_records(&status(admin).await);
        assert!(ended, "{name}: {records:?}\n{}", d.stderr_text());
        for r in records
            .iter()
            .filter(|r| r.pid.is_some_and(|p| retired.contains(&p.to_string())))
        {
            assert_eq!(r.signal, Some(15), "{name}: {r:?}\n{}", d.stderr_text());
        }
        drover_stops_cleanly(&name, &d).await;
        assert!(
            !d.stderr_text().contains("did not exit within"),
            "{name}: {}",
            d.stderr_text()
        );
    }
}

/// An HTTPS app that ends TLS itself (its connections are handed over, and drover cannot
/// take them back) retires cleanly at a reload under keep-alive load. Its last
/// connections close after its channel has gone, and the preload's word on each close
/// found no channel: Node threw ERR_IPC_CHANNEL_CLOSED from a timer, and every old
/// worker ended with status 1 (`reload`, code 1, in `ctl restarts`, the stack in
/// drover's output), where PM2's end cleanly.
#[tokio::test]
async fn an_https_app_retires_cleanly_at_a_reload_under_keep_alive_load() {
    if !common::pki::tools() {
        return;
    }
    let pki = common::pki::Pki::new("tls-app-reload");
    let (cert, key) = pki.leaf(
        "server",
        "localhost",
        &["localhost"],
        common::pki::far_future(),
    );
    let dir = pki.dir.clone();
    std::fs::copy(&cert, dir.join("cert.pem")).unwrap();
    std::fs::copy(&key, dir.join("key.pem")).unwrap();
    let port = drover_testkit::free_port();
    std::fs::write(
        dir.join("https-server.js"),
        format!("const fs = require('fs');\nconst https = require('https');\nconst options = {{ key: fs.readFileSync('key.pem'), cert: fs.readFileSync('cert.pem') }};\nhttps.createServer(options, (req, res) => res.end('secure ' + process.pid)).listen({port});\n"),
    )
    .unwrap();
    // Four keep-alive clients for 5 s; prints how many answers came.
    std::fs::write(
        dir.join("load.js"),
        format!("const https = require('https');\nconst agent = new https.Agent({{ keepAlive: true, maxSockets: 4, ca: require('fs').readFileSync('{}') }});\nlet ok = 0; const end = Date.now() + 5000;\nconst loop = () => {{ if (Date.now() > end) return; https.get({{ host: 'localhost', port: {port}, agent }}, (res) => {{ res.resume(); res.on('end', () => {{ ok++; loop(); }}); }}).on('error', loop); }};\nfor (let i = 0; i < 4; i++) loop();\nsetTimeout(() => {{ console.log(ok); process.exit(0); }}, 5500);\n", pki.ca_pem.display()),
    )
    .unwrap();
    let (d, admin) = run_as_written(2, "https-server.js", &dir).await;
    let load = tokio::process::Command::new("node")
        .arg("load.js")
        .current_dir(&dir)
        .output();
    let reload = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        common::ctl(admin, &["reload"]).await
    };
    let (load, (code, out, err)) = tokio::join!(load, reload);
    assert_eq!(code, 0, "{out}{err}");
    let answered: usize = String::from_utf8_lossy(&load.unwrap().stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    assert!(
        answered > 50,
        "too little load: {answered}\n{}",
        d.stderr_text()
    );
    let records = common::restart_records(&common::status(admin).await);
    assert_eq!(records.len(), 2, "{records:?}");
    for r in &records {
        assert!(
            r.exit_code.is_none_or(|c| c == 0),
            "a retiring worker failed: {r:?}\n{}",
            d.stderr_text()
        );
    }
    assert!(
        !d.stderr_text().contains("ERR_IPC_CHANNEL_CLOSED"),
        "{}",
        d.stderr_text()
    );
    drover_stops_cleanly("https", &d).await;
}

/// New code that moves the app's port (`listen(3001)` where it was `listen(3000)`) is
/// served where clients already connect: drover took that address from the first
/// workers, and a reload does not move its balancer. Under PM2 the new port serves, so
/// drover says so, naming both ports and the ways out. Before, nothing was said.
#[tokio::test]
async fn a_reload_whose_code_moved_the_port_says_where_it_is_served() {
    let dir = common::temp_dir("moved-port");
    let (first, moved) = (drover_testkit::free_port(), drover_testkit::free_port());
    let app = dir.join("app.js");
    let write = |port: u16| {
        std::fs::write(
            &app,
            format!(
                "require('http').createServer((req, res) => res.end('v{port}')).listen({port});\n"
            ),
        )
        .unwrap()
    };
    write(first);
    let (d, admin) = run_as_written(2, "app.js", &dir).await;
    assert_eq!(d.addr().port(), first, "{}", d.stderr_text());
    let before = serving(&d, admin).await;
    write(moved);
    reloaded("moved port", &d, admin, &before).await;
    says(
        "moved port",
        &d,
        &[&format!(
            "listens on port {moved} where the app's first workers listened on port {first}"
        )],
    )
    .await;
    let served = get(d.addr(), "/").await;
    assert_eq!(served.text(), format!("v{moved}"), "{}", d.stderr_text());
    drover_stops_cleanly("moved port", &d).await;
}

/// `drover up` of a file with an `[[app]]` and no `[[balancer]]`: its workers' `listen()`
/// is answered by drover, which binds nothing for them there, so nothing serves the
/// port the app names. drover says so, and what to add. Before: the app said
/// "listening", its status said ready, its clients were refused, and nothing was said.
#[tokio::test]
async fn an_app_with_no_balancer_in_front_is_named_as_unserved() {
    let dir = common::temp_dir("no-balancer");
    let port = drover_testkit::free_port();
    std::fs::write(
        dir.join("app.js"),
        format!("require('http').createServer((req, res) => res.end('ok')).listen({port});\n"),
    )
    .unwrap();
    let up = |file: &'static str, toml: &'static str, ready: &'static str| {
        std::fs::write(dir.join(file), toml).unwrap();
        let mut cmd = Command::new(bin());
        cmd.args(["up", "-c", file]).current_dir(&dir);
        clean_env(&mut cmd);
        spawn_ready_line(cmd, ready)
    };
    let d = up(
        "drover.toml",
        "[admin]\nlisten = \"127.0.0.1:0\"\n[[app]]\nname = \"web\"\ncommand = [\"node\", \"app.js\"]\nworkers = 1\n",
        "admin API listening on",
    )
    .await;
    says(
        "no balancer",
        &d,
        &[&format!(
            "app \"web\" listens on port {port}, and no [[balancer]] is in front of it"
        )],
    )
    .await;
    drover_stops_cleanly("no balancer", &d).await;
    // A balancer at another port: the note names the drover.toml way to serve the
    // app's own port, and not `drover run`'s --listen, which this file has none of.
    let d = up(
        "elsewhere.toml",
        "[[app]]\nname = \"web\"\ncommand = [\"node\", \"app.js\"]\nworkers = 1\n[[balancer]]\nname = \"front\"\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:web\"]\n",
        "\"front\" listening on",
    )
    .await;
    says(
        "balancer elsewhere",
        &d,
        &[&format!(
            "nothing serves port {port}, so a call the app makes to itself there (http://localhost:{port}/...) is refused, where PM2 serves it. To serve it: in drover.toml a balancer with listen = \"[::]:{port}\""
        )],
    )
    .await;
    drover_stops_cleanly("balancer elsewhere", &d).await;
}

/// `cluster.worker.id` numbers each worker from 1, and a new one (a restart, a reload)
/// gets a number of its own, as Node's primary numbers each fork: an app that logs it,
/// or keys on it (`cluster.worker.id || ...`), sees what it would under Node cluster.
/// Before, it was the worker's slot: 0 (falsy) for the first, and the same again after
/// every restart. `NODE_APP_INSTANCE` stays the slot, as PM2 sets it.
#[tokio::test]
async fn cluster_worker_ids_count_from_1_and_each_fork_gets_its_own() {
    let dir = common::temp_dir("cluster-ids");
    let port = drover_testkit::free_port();
    std::fs::write(
        dir.join("app.js"),
        format!("const cluster = require('cluster');\nconsole.log(`cluster id ${{cluster.worker.id}} instance ${{process.env.NODE_APP_INSTANCE}}`);\nrequire('http').createServer((req, res) => res.end('ok')).listen({port});\n"),
    )
    .unwrap();
    let (d, admin) = run_as_written(2, "app.js", &dir).await;
    let before = serving(&d, admin).await;
    reloaded("cluster ids", &d, admin, &before).await;
    says(
        "cluster ids",
        &d,
        &["cluster id 3 instance", "cluster id 4 instance"],
    )
    .await;
    let said = d.stderr_text();
    for first in ["cluster id 1 instance", "cluster id 2 instance"] {
        assert!(said.contains(first), "{said}");
    }
    assert!(!said.contains("cluster id 0"), "{said}");
    for instance in ["instance 0", "instance 1"] {
        assert_eq!(said.matches(instance).count(), 2, "{said}");
    }
    drover_stops_cleanly("cluster ids", &d).await;
}

/// Where drover cannot write its Node preload in `TMPDIR` (a container whose root
/// filesystem and `/tmp` are read-only: Kubernetes' `readOnlyRootFilesystem`), it goes to
/// `/dev/shm`, and an app that names its port still runs as written. Before, the
/// workers started without it after one warning line: an app on a fixed port was not
/// served, and each reload failed requests in flight (153 in the container seat).
#[tokio::test]
async fn the_preload_goes_elsewhere_when_tmpdir_cannot_be_written() {
    let port = drover_testkit::free_port().to_string();
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "-w",
        "2",
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ])
    .args(["--", "node", &fixture("port-or-argv.js"), &port])
    .current_dir(temp_dir("read-only-tmp"));
    clean_env(&mut cmd);
    cmd.env("TMPDIR", "/nonexistent/drover-tmp")
        .env_remove("XDG_RUNTIME_DIR");
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let r = get(d.addr(), "/").await;
    assert_eq!(r.status, 200, "{}", d.stderr_text());
    assert!(!d.stderr_text().contains("preload"), "{}", d.stderr_text());
    drover_stops_cleanly("a TMPDIR it cannot write", &d).await;
}

/// A worker's own port is drover's way in, and no one else's: an app that listens on
/// its `PORT` at any address (`listen(PORT)`, `0.0.0.0`, `::`) is bound at the IPv4
/// loopback, so clients reach it only through drover's listen address. Before, each
/// worker of a Next.js app under `drover run -l` listened on `0.0.0.0:PORT` and
/// answered from the network past drover (its limits, logs and TLS).
#[tokio::test]
async fn a_workers_own_port_is_bound_at_loopback_whatever_address_the_app_names() {
    let dir = temp_dir("loopback-only");
    let app = dir.join("any-address.js");
    std::fs::write(
        &app,
        "const host = process.argv[2];\n\
         const server = require('http').createServer((req, res) => res.end(String(process.pid)));\n\
         if (host) server.listen(Number(process.env.PORT), host); else server.listen(Number(process.env.PORT));\n",
    )
    .unwrap();
    for host in ["", "0.0.0.0", "::"] {
        let mut command = vec!["node".to_string(), app.display().to_string()];
        if !host.is_empty() {
            command.push(host.to_string());
        }
        let (d, admin) = run(2, &command, Path::new(".")).await;
        get(d.addr(), "/").await;
        let status = common::status(admin).await;
        for worker in &status.apps[0].workers {
            let port = worker.port.expect("a serving worker has a port");
            let bound = listening_at(port);
            assert_eq!(
                bound,
                vec![format!("0100007F:{port:04X}")],
                "listen({host:?}): worker port {port} bound at {bound:?}"
            );
        }
        drover_stops_cleanly(&format!("listen(PORT, {host:?})"), &d).await;
    }
}

/// The local addresses (as /proc/net/tcp and tcp6 write them) of the listening sockets
/// on `port`.
fn listening_at(port: u16) -> Vec<String> {
    let mut found = Vec::new();
    for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(local), Some(state)) = (fields.get(1), fields.get(3)) else {
                continue;
            };
            if *state == "0A" && local.ends_with(&format!(":{port:04X}")) {
                found.push(local.to_string());
            }
        }
    }
    found
}

/// A worker drover retires while it serves clients handed to it has its servers closed
/// through its channel, as Node's primary's `worker.disconnect()` closes them; the app's
/// own `server.close()` on the SIGTERM that follows is then done, not an error. Before,
/// Node answered it with ERR_SERVER_NOT_RUNNING, which a Next.js app logged on 5 of 6
/// reloads under load ("Error: Server is not running.").
#[tokio::test]
async fn a_retired_workers_own_close_of_its_server_is_not_an_error() {
    let mut cmd = Command::new(bin());
    cmd.args("run -w 2 -l 127.0.0.1:0 --admin 127.0.0.1:0 --mode handoff --".split(' '))
        .arg("node")
        .arg(fixture("closes-on-sigterm.js"))
        .arg("{port}");
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    let before = serving(&d, admin).await;
    // Keep-alive clients, handed to the workers, open across the reload.
    let mut clients = Vec::new();
    for _ in 0..8 {
        let mut c = drover_testkit::HttpClient::connect(d.addr()).await.unwrap();
        assert_eq!(c.get("/").await.status, 200, "{}", d.stderr_text());
        clients.push(c);
    }
    reloaded("handoff", &d, admin, &before).await;
    let settled = drover_testkit::wait_until(Duration::from_secs(20), || {
        let text = d.stderr_text();
        text.matches(": HTTP server closed").count() + text.matches("close failed").count() >= 2
    })
    .await;
    let text = d.stderr_text();
    assert!(
        settled,
        "the old workers did not close their servers:\n{text}"
    );
    assert!(!text.contains("close failed"), "{text}");
    drop(clients);
    drover_stops_cleanly("handoff", &d).await;
}

/// Under `npm start`, a worker's RSS and CPU time in `drover ctl status` are its app's,
/// the Node process below npm, as `--max-memory` compares them. Before, the status read
/// npm's own (an idle 55 MB beside a Next.js server's 200 MB).
#[tokio::test]
async fn status_shows_the_apps_memory_under_npm_start_not_npms() {
    let dir = temp_dir("npm-rss");
    std::fs::write(
        dir.join("package.json"),
        r#"{ "name": "npm-rss", "private": true, "scripts": { "start": "node app.js" } }"#,
    )
    .unwrap();
    std::fs::write(
        dir.join("app.js"),
        "const ballast = Buffer.alloc(200 * 1024 * 1024, 1);\n\
         require('http').createServer((q, s) => s.end(String(ballast.length))).listen(process.env.PORT || 3000);\n",
    )
    .unwrap();
    let npm = vec!["npm".to_string(), "start".to_string()];
    let (d, admin) = run(1, &npm, &dir).await;
    let big = 150 << 20;
    let seen = wait_until_async(Duration::from_secs(10), || async {
        common::status(admin).await.apps[0].workers[0]
            .rss_bytes
            .is_some_and(|rss| rss >= big)
    })
    .await;
    let worker = &common::status(admin).await.apps[0].workers[0];
    assert!(
        seen,
        "RSS {:?} is not the app's:\n{}",
        worker.rss_bytes,
        d.stderr_text()
    );
    drover_stops_cleanly("npm start", &d).await;
}

/// `drover run ecosystem.config.js --worker-ports LOW-HIGH`: every cluster-mode app's
/// workers take their own ports in the range, through a reload too. Before, the flag
/// was refused with an ecosystem file, and PM2's file has no key for it: a firewalled
/// host could not run one (Node seat #3).
#[tokio::test]
async fn an_ecosystem_files_workers_take_their_ports_in_the_worker_ports_range() {
    let dir = temp_dir("ecosystem-worker-ports");
    let port = drover_testkit::free_port();
    std::fs::write(
        dir.join("api.js"),
        "require('http').createServer((req, res) => res.end('ok')).listen(process.env.PORT);\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("ecosystem.config.js"),
        format!("module.exports = {{ apps: [{{ name: 'api', script: './api.js', instances: 2, exec_mode: 'cluster', env: {{ PORT: {port} }} }}] }};\n"),
    )
    .unwrap();
    let low = drover_testkit::free_port();
    let range = format!("{low}-{}", low + 5);
    let mut cmd = Command::new(bin());
    cmd.args(["run", "ecosystem.config.js", "--worker-ports", &range])
        .args(["--admin", "127.0.0.1:0"])
        .current_dir(&dir);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"api\" listening on ").await;
    let admin = admin_addr(&d).await;
    for round in ["start", "reload"] {
        if round == "reload" {
            let (code, out, err) = ctl(admin, &["reload"]).await;
            assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
        }
        wait_all_serving(&d, admin).await;
        let ports: Vec<Option<u16>> = status(admin).await.apps[0]
            .workers
            .iter()
            .map(|w| w.port)
            .collect();
        assert!(
            ports
                .iter()
                .all(|p| p.is_some_and(|p| (low..=low + 5).contains(&p))),
            "{round}: {ports:?} outside {range}\n{}",
            d.stderr_text()
        );
        let r = get(SocketAddr::from(([127, 0, 0, 1], port)), "/").await;
        assert_eq!(r.status, 200, "{round}: {}", d.stderr_text());
    }
}

/// An app written as Express's guide shows (`server.close()` on SIGTERM, no exit) that
/// also holds a timer does not exit, and gets SIGKILL at `stop_timeout`: the warning
/// says why it may have stayed and what to do, where it named only the signal (Node
/// seat #2: every stop and reload of such an app took 10 s, PM2's 0.5 s).
#[tokio::test]
async fn a_node_app_that_stays_after_its_sigterm_handler_is_told_why_and_what_to_do() {
    let dir = temp_dir("late-exit");
    let app = dir.join("guide.js");
    std::fs::write(
        &app,
        "const server = require('http').createServer((req, res) => res.end('ok')).listen(process.env.PORT);\nsetInterval(() => {}, 1000);\nprocess.on('SIGTERM', () => server.close());\n",
    )
    .unwrap();
    let args = common::run_args(
        1,
        &["--stop-timeout", "1s"],
        &["node", &app.display().to_string()],
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = drover_testkit::DroverProcess::spawn(bin(), &args).await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    d.signal("TERM").unwrap();
    let status = d.wait_exit(Duration::from_secs(20)).await;
    assert!(status.is_some(), "{}", d.stderr_text());
    let err = d.stderr_text();
    assert!(
        err.contains("sending SIGKILL")
            && err.contains("its app handles SIGTERM")
            && err.contains("process.exit() in the handler")
            && err.contains("--stop-timeout"),
        "{err}"
    );
}
