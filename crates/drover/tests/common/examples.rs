//! Running an example app under drover, for the tests of `examples/` (examples.rs and
//! examples_tetra.rs): behind `drover run -w 2`, in its shared-socket mode, and the
//! checks both make of it.

use drover_testkit::{spawn_ready_line, wait_until, ChildProcess, HttpClient, Response};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;
use tokio::time::Instant;

/// Bound on one request: each answer takes milliseconds at most, but a loaded machine
/// may take seconds to start an interpreter behind a socket's backlog.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A child environment free of what this test process may have inherited and the apps
/// would act on.
pub fn clean_env(cmd: &mut Command) {
    for var in ["LISTEN_FDS", "LISTEN_PID", "DROVER_WORKER_ID", "PORT"] {
        cmd.env_remove(var);
    }
}

/// GET on a fresh connection: in shared mode each request is a new accept, and some
/// servers speak HTTP/1.0 and close after each answer.
pub async fn get(addr: SocketAddr, path: &str) -> Response {
    try_get(addr, path)
        .await
        .unwrap_or_else(|e| panic!("GET {path} via {addr}: {e}"))
}

pub async fn try_get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    let mut c = HttpClient::connect(addr).await?;
    c.set_timeout(REQUEST_TIMEOUT);
    c.request("GET", path, &[], None).await
}

/// `drover run -w 2` of `server` (round-robin, so both workers see traffic as soon as
/// both are in), once its balancer listens.
pub async fn behind_drover(server: &[String]) -> ChildProcess {
    let mut cmd = Command::new(super::bin());
    let flags = "run -w 2 --listen 127.0.0.1:0 --threads 1 --admin off \
                 --strategy round-robin --health-path /health --";
    cmd.args(flags.split_whitespace()).args(server);
    clean_env(&mut cmd);
    // Worker output is forwarded to drover's stderr and says "listening on" too.
    spawn_ready_line(cmd, "\"default\" listening on ").await
}

/// drover's shared mode over `server`: no balancer; the workers accept on the socket
/// drover passes them as fd 3 (LISTEN_FDS). Returns once both workers took it rather
/// than binding PORT (each says so in its ready line, which drover forwards prefixed with
/// the worker's id); that also keeps the first requests from sitting in the backlog
/// while a loaded machine is still starting the interpreters.
pub async fn shared_mode(who: &str, server: &[String]) -> ChildProcess {
    let mut cmd = Command::new(super::bin());
    cmd.args("run --mode shared -w 2 --listen 127.0.0.1:0 --admin off --".split(' '))
        .args(server);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"app\" listening on ").await;
    for id in 0..2 {
        let took = format!("[app/{id}] ");
        let ready = wait_until(Duration::from_secs(15), || {
            d.lines_containing("(fd 3 from LISTEN_FDS)")
                .iter()
                .any(|l| l.contains(&took))
        })
        .await;
        assert!(
            ready,
            "{who}: worker {id} never served fd 3\n{}",
            d.stderr_text()
        );
    }
    d
}

/// Asks `path` until both workers, 0 and 1, have answered it. `worker_of` checks a 200
/// answer and returns the worker that gave it.
pub async fn check_both_workers(
    who: &str,
    d: &ChildProcess,
    path: &'static str,
    worker_of: impl Fn(&Response) -> String,
) {
    let addr = d.addr();
    let mut workers = BTreeSet::new();
    let mut answers = 0;
    // Bounds a loaded machine; both usually answer within a second.
    let deadline = Instant::now() + Duration::from_secs(15);
    while workers.len() < 2 && Instant::now() < deadline {
        // Overlapping requests, as a load generator would send them.
        let asks: Vec<_> = (0..4)
            .map(|_| tokio::spawn(async move { try_get(addr, path).await }))
            .collect();
        for ask in asks {
            let r = ask
                .await
                .unwrap()
                .unwrap_or_else(|e| panic!("{who}: GET {path}: {e}\n{}", d.stderr_text()));
            if r.status == 200 {
                workers.insert(worker_of(&r));
                answers += 1;
            } else {
                // Until a worker is ready, the balancer itself answers (no backend yet);
                // in shared mode the connection just waits in the socket's backlog.
                assert!(
                    r.header("x-worker").is_none(),
                    "{who}: {} {}",
                    r.status,
                    r.text()
                );
            }
        }
    }
    assert_eq!(
        workers,
        BTreeSet::from(["0".to_string(), "1".to_string()]),
        "{who}: workers that answered in {answers} answers\n{}",
        d.stderr_text()
    );
}

/// SIGTERM to drover: it drains, stops its workers (which exit on SIGTERM) and exits 0.
pub async fn drover_stops_cleanly(who: &str, d: &ChildProcess) {
    d.signal("TERM").unwrap();
    let status = d.wait_exit(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{who}: drover did not stop cleanly: {status:?}\n{}",
        d.stderr_text()
    );
}
