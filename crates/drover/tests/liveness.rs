//! Hung is not busy, through the real binary and real Node workers: a worker in an
//! endless loop, or stopped with SIGSTOP, is killed and replaced while the other serves;
//! two workers failing their checks at once are restarted one at a time. (A burst that
//! keeps workers busy is `liveness_burst.rs`: alone in its binary, so it has the cores.)
//! These count restarts and failed requests; nothing here is timed.

mod common;

use common::{
    admin_addr, assert_no_restarts, bin, get_answered, liveness_config, restart_records,
    serving_pids, status, temp_dir, up_serving, wait_all_serving,
};
use drover_admin::RestartRow;
use drover_testkit::{wait_until, wait_until_async, DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// `drover up` of the liveness fixture, two workers, with quick health checks (see
/// `liveness_config`). `tag` names the test's own directory: tests run at once in one
/// process, and one that shared another's would remove its drover.toml before drover
/// read it (every sick file is named `sick`, so its name could not tell them apart).
async fn up_two_workers(tag: &str, sick_file: &Path) -> (DroverProcess, SocketAddr) {
    let env = format!(
        "env = {{ SICK_FILE = \"{}\", SLOW_FILE = \"{}.slow\" }}\n",
        sick_file.display(),
        sick_file.display()
    );
    let (d, admin, _) = up_serving(&format!("liveness-{tag}"), &liveness_config(2, &env)).await;
    (d, admin)
}

fn no_sick_file(tag: &str) -> PathBuf {
    temp_dir(&format!("liveness-sick-{tag}")).join("sick")
}

/// Waits for `n` restart records; panics with drover's log if they do not come.
async fn wait_restarts(d: &DroverProcess, admin: SocketAddr, n: usize) -> Vec<RestartRow> {
    let came = wait_until_async(Duration::from_secs(30), || async {
        restart_records(&status(admin).await).len() >= n
    })
    .await;
    assert!(came, "no {n} restarts\n{}", d.stderr_text());
    restart_records(&status(admin).await)
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
    let (d, admin) = up_two_workers("spin", &no_sick_file("spin")).await;
    let before = serving_pids(&status(admin).await);
    let stop = Arc::new(AtomicBool::new(false));
    let load = common::steady_load(d.addr(), 2, "/", Arc::clone(&stop));

    let spin = spin_one_worker(d.addr()).await;
    let records = wait_restarts(&d, admin, 1).await;
    let hung = &records[0];
    assert_eq!(hung.reason, "health", "{hung:?}");
    let detail = hung.detail.as_deref().unwrap_or_default();
    // Two checks (`fall`), or more where the machine's other load kept the worker off a
    // core: it is then judged on the time it ran (see the starved tests).
    assert!(
        detail.starts_with("hung: no answer to ")
            && detail.contains(" health checks in a row")
            && detail.contains("an endless loop? a request that computes this long needs a larger health fall or interval: --fall, --health-interval"),
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
    assert_eq!(restart_records(&s).len(), 1, "{:?}", restart_records(&s));
    let other = before.iter().find(|p| **p != hung.pid).unwrap();
    assert!(after.contains(other), "the other worker kept its process");
}

/// A worker whose health check answers, but badly (a path the app does not have
/// answers 404; here, `/health` says 503), is said to be so at once. Before, nothing
/// was logged until the ready timeout ran out: 30 s in which every client got a 503
/// and the log said nothing of why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_fails_at_start_is_named_at_once() {
    let dir = temp_dir("liveness-sick-at-start");
    let sick = dir.join("sick");
    std::fs::write(&sick, "").unwrap();
    let env = format!("env = {{ SICK_FILE = \"{}\" }}\n", sick.display());
    let file = dir.join("drover.toml");
    std::fs::write(&file, liveness_config(1, &env)).unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "-c", file.to_str().unwrap()]).await;
    let said = wait_until(Duration::from_secs(10), || {
        d.stderr_text()
            .contains("worker listens, but its health check failed (status 503)")
    })
    .await;
    assert!(said, "{}", d.stderr_text());
}

/// `drover run` takes the checks' timings as flags, as a hung worker's restart record
/// tells the user to raise them (`--fall`, `--health-interval`); it refused them as
/// unknown. `--fall 2` finds a spinning worker after two checks (the default is three).
/// A worker that computes longer than its checks allow, and comes back: the app's
/// requests take that long. One a little longer later is busy, not an endless loop
/// (a socket.io handler that blocked its loop 5 s at a time was killed in one worker,
/// then, sent again by its client, in the next; PM2 and Node's cluster module lost
/// none). An endless loop is still found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_computing_as_long_as_it_came_back_from_before_is_not_restarted() {
    // A check every 300 ms, four failures in a row to restart: 0.9 s of computing
    // allowed.
    let toml = liveness_config(1, "").replace(
        "interval = \"300ms\", timeout = \"300ms\", fall = 2",
        "interval = \"300ms\", timeout = \"300ms\", fall = 4",
    );
    assert!(toml.contains("fall = 4"), "{toml}");
    let (d, admin, _) = up_serving("liveness-came-back", &toml).await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    c.set_timeout(Duration::from_secs(60));
    // 1.2 s: checks fail, too few to restart; it comes back.
    get_answered(&mut c, "/work?ms=1200", "worked", &d).await;
    // 2 s: more than the checks allow, less than three times what it came back from.
    get_answered(&mut c, "/work?ms=2000", "worked", &d).await;
    assert_no_restarts(admin, "a worker computing as long as before is busy", &d).await;
    // Or, where the machine's other load kept it off a core, starved (see the starved
    // tests), which spares it first.
    let log = d.stderr_text();
    assert!(
        log.contains("the app's workers came back from")
            || log.contains("other processes keep it off a core"),
        "{log}"
    );
    // An endless loop is still killed, once it has spun three times that long.
    let spin = spin_one_worker(d.addr()).await;
    let records = wait_restarts(&d, admin, 1).await;
    let detail = records[0].detail.as_deref().unwrap_or_default();
    assert!(detail.contains("an endless loop?"), "{detail}");
    assert_ne!(spin.await.unwrap(), 200);
}

/// An upgraded connection to a worker (`burn`, see the fixture), past drover's 101.
async fn upgraded(addr: SocketAddr) -> tokio::io::BufReader<tokio::net::TcpStream> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let mut s = tokio::io::BufReader::new(tokio::net::TcpStream::connect(addr).await.unwrap());
    s.get_mut()
        .write_all(b"GET /burn HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: burn\r\n\r\n")
        .await
        .unwrap();
    let mut line = String::new();
    s.read_line(&mut line).await.unwrap();
    assert!(line.starts_with("HTTP/1.1 101"), "{line}");
    while line != "\r\n" {
        line.clear();
        s.read_line(&mut line).await.unwrap();
    }
    s
}

/// A worker whose handler on an upgraded connection (a WebSocket's) blocks its event
/// loop for seconds, writing its progress as it goes, is busy: what it writes is a sign
/// of life. drover saw none (the events on a WebSocket are no requests it sees
/// answered), and a socket.io worker whose handler blocked its loop 5 s at a time was
/// killed as spinning, then, its client sending again, the next worker too. An endless
/// loop on such a connection is still found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_writing_on_an_upgraded_connection_while_its_loop_is_blocked_is_busy() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let (d, admin, _) = up_serving("liveness-upgraded", &liveness_config(1, "")).await;
    let mut tunnel = upgraded(d.addr()).await;
    // 4.5 s with its loop blocked, where the checks allow 0.3 s; a line every 150 ms.
    tunnel.get_mut().write_all(b"burn 150 30\n").await.unwrap();
    let mut line = String::new();
    for i in 0..30 {
        line.clear();
        let read = tokio::time::timeout(Duration::from_secs(20), tunnel.read_line(&mut line)).await;
        assert_eq!(
            read.ok()
                .and_then(Result::ok)
                .map(|_| line.trim().to_string()),
            Some(format!("done {i}")),
            "{}",
            d.stderr_text()
        );
    }
    assert_no_restarts(
        admin,
        "a worker writing on its upgraded connection is busy",
        &d,
    )
    .await;
    tunnel.get_mut().write_all(b"spin\n").await.unwrap();
    let records = wait_restarts(&d, admin, 1).await;
    let detail = records[0].detail.as_deref().unwrap_or_default();
    assert!(detail.contains("an endless loop?"), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drover_run_takes_the_checks_timings_as_flags() {
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/liveness/server.js");
    let args = [
        "run",
        "-w",
        "2",
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--threads",
        "1",
        "--health-path",
        "/health",
        "--health-interval",
        "300ms",
        "--health-timeout",
        "300ms",
        "--fall",
        "2",
        "--",
        "node",
        server.to_str().unwrap(),
    ];
    let d = DroverProcess::spawn(bin(), &args).await;
    let admin = admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    let spin = spin_one_worker(d.addr()).await;
    let records = wait_restarts(&d, admin, 1).await;
    let detail = records[0].detail.as_deref().unwrap_or_default();
    // Two checks (`--fall 2`), or more only where the machine's other load kept the
    // worker off a core, which drover says (see the starved tests).
    assert!(
        detail.starts_with("hung: no answer to 2 health checks in a row")
            || d.stderr_text()
                .contains("other processes keep it off a core"),
        "{detail}\n{}",
        d.stderr_text()
    );
    assert_ne!(spin.await.unwrap(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_is_killed_and_replaced_while_the_other_serves() {
    let (d, admin) = up_two_workers("stop", &no_sick_file("stop")).await;
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

/// A worker that runs a program synchronously (`execFileSync`, as an app runs a
/// command-line tool to render a PDF) answers no probe for 4 s while its main thread
/// waits, idle, as a deadlocked one would. But it waits on a program it started: busy,
/// not hung. Its request is answered and nothing is restarted. Before, it was killed as
/// "deadlocked" after 2 probes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_waits_on_a_program_it_ran_is_not_restarted() {
    let (d, admin) = up_two_workers("program", &no_sick_file("program")).await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = common::steady_load(d.addr(), 2, "/", Arc::clone(&stop));
    runs_a_program_with_no_restart(&d, admin, 4000).await;
    common::assert_load_never_failed(&stop, load, 8, "while a worker ran a program").await;
}

/// GET /program?ms=`ms` is answered, and no worker restarted meanwhile.
async fn runs_a_program_with_no_restart(d: &DroverProcess, admin: SocketAddr, ms: u64) {
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    c.set_timeout(Duration::from_secs(60));
    let r = c.get(&format!("/program?ms={ms}")).await;
    assert_eq!(
        (r.status, r.text().as_str()),
        (200, "ran"),
        "{}",
        d.stderr_text()
    );
    assert_no_restarts(admin, "a worker waiting on its program is busy", d).await;
}

/// The same, for a worker that served requests right up to the moment it ran the
/// program. Those requests completed in the probe interval the program began in, and
/// drover took the end of that interval's failed probe for the worker's last sign of
/// life: the program, older than that by up to two probes, read as started before the
/// quiet spell, so not the worker's work, and the worker was killed as deadlocked. CI
/// (stop 91) saw it on two workers in turn: the request, retried on each, killed each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_that_served_until_it_ran_a_program_is_not_restarted() {
    let sick = no_sick_file("served-program");
    let env = format!("env = {{ SICK_FILE = \"{}\" }}\n", sick.display());
    let (d, admin, _) = up_serving("liveness-served-program", &liveness_config(1, &env)).await;
    let stop = Arc::new(AtomicBool::new(false));
    // One worker: every request of the load, before the program and while it runs
    // (those wait for it), is the worker's.
    let load = common::steady_load(d.addr(), 1, "/", Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(500)).await;
    runs_a_program_with_no_restart(&d, admin, 3000).await;
    common::assert_load_never_failed(&stop, load, 20, "while the worker ran a program").await;
}

/// A worker whose clients' connections drover handed over (`mode = "handoff"`, and
/// the default `auto` once requests cost alike) serves them past drover. Back to back,
/// its requests compute longer than a probe may wait (400 ms against 300 ms), and its
/// event loop turns only between batches of them: three requests that arrived together
/// run in one turn, 1.2 s, two probes' worth. Busy, not hung: the preload says what it
/// served as each request ends (once 250 ms have passed since it last did), not on a
/// timer, which waits for the batch to end; and any answer to drover's ping since the
/// probe before counts. Before, the worker was killed as hung with its clients'
/// requests (`drover run -w 2 --health-path /health` with 2 s requests on kept
/// connections: 3 of 20 failed, where Node's cluster module and PM2 failed none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_computing_on_handed_connections_is_not_restarted() {
    let sick = no_sick_file("handed-work");
    let env = format!(
        "mode = \"handoff\"\nenv = {{ SICK_FILE = \"{}\" }}\n",
        sick.display()
    );
    let (d, admin, _) = up_serving("liveness-handed-work", &liveness_config(1, &env)).await;
    let addr = d.addr();
    let clients: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn(async move {
                let mut c = HttpClient::connect(addr).await.unwrap();
                c.set_timeout(Duration::from_secs(30));
                let mut answers = Vec::new();
                for _ in 0..6 {
                    match c.request("GET", "/work?ms=400", &[], None).await {
                        Ok(r) => answers.push(r.status.to_string()),
                        Err(e) => {
                            answers.push(e.to_string());
                            break;
                        }
                    }
                }
                answers
            })
        })
        .collect();
    for client in clients {
        let answers = client.await.unwrap();
        assert!(
            answers.iter().all(|s| s == "200"),
            "{answers:?}\n{}",
            d.stderr_text()
        );
    }
    assert_no_restarts(
        admin,
        "a worker computing between turns of its event loop is busy",
        &d,
    )
    .await;
}

/// A worker that waits forever on a lock, idle and with no program of its own running,
/// is deadlocked: it is killed and replaced, and said to be so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlocked_worker_is_killed_and_replaced() {
    let (d, admin) = up_two_workers("deadlock", &no_sick_file("deadlock")).await;
    let stuck = tokio::spawn({
        let addr = d.addr();
        async move {
            let mut c = HttpClient::connect(addr).await.unwrap();
            c.set_timeout(Duration::from_secs(60));
            c.request("POST", "/deadlock", &[], Some(b""))
                .await
                .map_or(0, |r| r.status)
        }
    });
    let records = wait_restarts(&d, admin, 1).await;
    let hung = &records[0];
    let detail = hung.detail.as_deref().unwrap_or_default();
    assert!(
        detail.starts_with("hung: no answer to 2 health checks in a row")
            && detail.contains("deadlocked"),
        "{detail}"
    );
    assert_eq!(hung.signal_name.as_deref(), Some("SIGKILL"), "{hung:?}");
    wait_replaced(&d, admin, hung.pid.unwrap()).await;
    assert_ne!(stuck.await.unwrap(), 200);
}

/// A Python app under a shell (`sh -c "python3 app.py"`: the app is the worker's child
/// from its start) that deadlocks right after its first answers: the child that runs is
/// the app itself, not a program the worker waits on, so it is found hung and killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadlocked_app_below_a_shell_is_killed() {
    let dir = temp_dir("liveness-shell");
    std::fs::write(
        dir.join("app.py"),
        format!(
            "import http.server, os, threading\n{}\
         server = http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H)\n\
         for _ in range(2):\n\
         \x20   server.handle_request()\n\
         lock = threading.Lock()\n\
         lock.acquire()\n\
         lock.acquire()\n",
            ok_handler("")
        ),
    )
    .unwrap();
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[app]]\nname = \"web\"\ncommand = [\"sh\", \"-c\", \"cd {} && python3 app.py\"]\nworkers = 1\n\
         health = {{ path = \"/health\", interval = \"300ms\", timeout = \"300ms\", fall = 2 }}\n\
         [[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n",
        dir.display()
    );
    let file = dir.join("drover.toml");
    std::fs::write(&file, toml).unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "-c", file.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    let records = wait_restarts(&d, admin, 1).await;
    let hung = &records[0];
    let detail = hung.detail.as_deref().unwrap_or_default();
    assert!(
        detail.starts_with("hung: no answer to 2 health checks"),
        "{detail}"
    );
}

/// A Python `http.server` handler class `H` whose GET runs `first` (statements, each
/// line indented by 8 spaces) and then answers 200 `ok`; it logs nothing.
fn ok_handler(first: &str) -> String {
    format!(
        "class H(http.server.BaseHTTPRequestHandler):\n\
         \x20   def do_GET(self):\n\
         {first}\
         \x20       self.send_response(200)\n\
         \x20       self.send_header('content-length', '2')\n\
         \x20       self.end_headers()\n\
         \x20       self.wfile.write(b'ok')\n\
         \x20   def log_message(self, *a):\n\
         \x20       pass\n"
    )
}

/// `drover up` of one Python worker, the `app.py` written in `dir`, with `extra` app
/// keys and checks of `/health` every 300 ms that give up after 300 ms, `fall` failed in
/// a row a hang; once its `/health` answers through drover: drover and its admin address.
async fn up_one_python_worker(dir: &Path, extra: &str, fall: u32) -> (DroverProcess, SocketAddr) {
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[app]]\nname = \"web\"\ncommand = [\"python3\", \"{}\"]\nworkers = 1\n{extra}\
         health = {{ path = \"/health\", interval = \"300ms\", timeout = \"300ms\", fall = {fall} }}\n\
         [[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n",
        dir.join("app.py").display()
    );
    let file = dir.join("drover.toml");
    std::fs::write(&file, toml).unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "-c", file.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    let addr = d.addr();
    let ready = wait_until_async(Duration::from_secs(20), || async {
        let Ok(mut c) = HttpClient::connect(addr).await else {
            return false;
        };
        c.get("/health").await.status == 200
    })
    .await;
    assert!(ready, "{}", d.stderr_text());
    (d, admin)
}

/// A Python worker (no event loop drover can ping) whose routes and `/health` wait on a
/// dependency that stalls: blocked reading its connection, or polling it, or waiting
/// on an epoll set. Busy, not hung: it is not restarted, and the POST it holds is
/// answered once the dependency is back. Killed as deadlocked after 4 s before, with the
/// POST (gunicorn's sync worker on a stalled redis; nginx in front of gunicorn failed
/// none), and on an epoll set later still (a Go worker, whose netpoller waits there:
/// both workers were killed in turn).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_python_worker_waiting_on_a_stalled_dependency_is_not_restarted() {
    use std::io::{BufRead, Write};
    use std::sync::atomic::Ordering;
    let dir = temp_dir("liveness-dependency");
    // The dependency: answers each line once it is not stalled.
    let dependency = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dep_port = dependency.local_addr().unwrap().port();
    let stalled = Arc::new(AtomicBool::new(false));
    let stall = Arc::clone(&stalled);
    std::thread::spawn(move || {
        for conn in dependency.incoming().flatten() {
            let stall = Arc::clone(&stall);
            std::thread::spawn(move || {
                let mut reader = std::io::BufReader::new(conn.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_ok() {
                    while stall.load(Ordering::Relaxed) {
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    let _ = (&conn).write_all(b"ok\n");
                }
            });
        }
    });
    std::fs::write(
        dir.join("app.py"),
        "import http.server, os, selectors, socket\n\
         DEP = int(os.environ['DEP'])\n\
         def ask(path):\n\
         \x20   s = socket.create_connection(('127.0.0.1', DEP))\n\
         \x20   if 'poll' in path:\n\
         \x20       s.settimeout(60)\n\
         \x20   s.sendall(b'q\\n')\n\
         \x20   got = b''\n\
         \x20   while not got.endswith(b'\\n'):\n\
         \x20       if 'epoll' in path:\n\
         \x20           sel = selectors.EpollSelector()\n\
         \x20           sel.register(s, selectors.EVENT_READ)\n\
         \x20           sel.register(IDLE, selectors.EVENT_READ)\n\
         \x20           sel.select()\n\
         \x20           sel.close()\n\
         \x20       chunk = s.recv(64)\n\
         \x20       if not chunk:\n\
         \x20           break\n\
         \x20       got += chunk\n\
         \x20   s.close()\n\
         class H(http.server.BaseHTTPRequestHandler):\n\
         \x20   def answer(self):\n\
         \x20       self.send_response(200)\n\
         \x20       self.send_header('content-length', '2')\n\
         \x20       self.end_headers()\n\
         \x20       self.wfile.write(b'ok')\n\
         \x20   def do_GET(self):\n\
         \x20       ask(self.path)\n\
         \x20       self.answer()\n\
         \x20   def do_POST(self):\n\
         \x20       self.rfile.read(int(self.headers.get('content-length', 0)))\n\
         \x20       ask(self.path)\n\
         \x20       self.answer()\n\
         \x20   def log_message(self, *a):\n\
         \x20       pass\n\
         IDLE = socket.create_connection(('127.0.0.1', DEP))\n\
         http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n",
    )
    .unwrap();
    let env = format!("env = {{ DEP = \"{dep_port}\" }}\n");
    let (d, admin) = up_one_python_worker(&dir, &env, 2).await;
    let addr = d.addr();
    // Blocked (as Go's netpoller and asyncio wait) in epoll_wait on a set that also
    // holds an idle connection: the dependency's, which awaits its answer, counts; the
    // idle one does not. First, while no check waits in the worker to block in recv
    // (its `/health` asks the dependency too). Then in recv, and in poll.
    for (method, path) in [
        ("POST", "/epoll"),
        ("POST", "/read"),
        ("POST", "/poll"),
        ("GET", "/read"),
    ] {
        stalled.store(true, Ordering::Relaxed);
        let asked = tokio::spawn(async move {
            let mut c = HttpClient::connect(addr).await.unwrap();
            c.request(
                method,
                path,
                &[],
                (method == "POST").then_some(&b"order"[..]),
            )
            .await
            .map(|r| r.status)
        });
        // Eight checks at least, where two in a row without an answer are a hang.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        stalled.store(false, Ordering::Relaxed);
        let answered = asked.await.unwrap();
        assert!(
            matches!(answered, Ok(200)),
            "{method} {path}: {answered:?}\n{}",
            d.stderr_text()
        );
    }
    assert_no_restarts(admin, "restarted while it waited", &d).await;
    let said = format!("waits on a connection to 127.0.0.1:{dep_port}");
    assert!(d.stderr_text().contains(&said), "{}", d.stderr_text());
}

/// A worker that serves one request at a time (a single-threaded Puma, Python's
/// `http.server`) whose handler sleeps, as one standing for a slow call does, longer
/// than its checks allow: its thread is in one timed sleep the whole time, which ends by
/// itself, so it is busy, not hung, and the request is answered. A single-threaded Puma
/// with a 10 s sleep was killed as deadlocked at 6.9 s, and the GET sent on to the other
/// worker killed that one too (Ruby seat); nginx in front of it answers at 10 s. A loop
/// that sleeps and looks again, for ever, runs between its sleeps: still found hung.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_whose_handler_sleeps_is_not_restarted_and_one_that_polls_for_ever_is() {
    let dir = temp_dir("liveness-sleep");
    std::fs::write(
        dir.join("app.py"),
        format!(
            "import http.server, os, time\n{}\
             http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n",
            ok_handler(
                "        if self.path == '/sleep':\n\
                 \x20           time.sleep(2.5)\n\
                 \x20       while self.path == '/poll':\n\
                 \x20           time.sleep(0.05)\n"
            )
        ),
    )
    .unwrap();
    // Checks every 300 ms that give up after 300 ms, two failed in a row a hang: the
    // sleep outlasts eight of them.
    let (d, admin) = up_one_python_worker(&dir, "", 2).await;
    let addr = d.addr();
    let mut c = HttpClient::connect(addr).await.unwrap();
    let slept = c.get("/sleep").await;
    assert_eq!(slept.status, 200, "{}", d.stderr_text());
    assert_no_restarts(admin, "restarted while its handler slept", &d).await;
    assert!(
        d.stderr_text()
            .contains("one timed sleep: it ends by itself"),
        "{}",
        d.stderr_text()
    );
    let polls = tokio::spawn(async move {
        let mut c = HttpClient::connect(addr).await.unwrap();
        c.request("GET", "/poll", &[], None).await.map(|r| r.status)
    });
    let records = wait_restarts(&d, admin, 1).await;
    let detail = records[0].detail.as_deref().unwrap_or_default();
    // Found hung; on a loaded machine a check may land in one of its sleeps and spare
    // it for a while (5 checks, not 2, once in CI), as a sleep of half an interval does.
    assert!(
        detail.starts_with("hung: no answer to ") && detail.contains("health checks in a row"),
        "{detail}"
    );
    assert_ne!(polls.await.unwrap().ok(), Some(200));
}

/// A worker that serves one request at a time, whose `/health` takes 1 s (a dependency
/// down, its client retrying) where the check gives up after 300 ms: it still runs
/// every probe it was sent. drover sends the next only once the last is answered, so
/// the worker runs about one a second, not three, and its late answers show it lives:
/// not restarted. Before, the probes queued in it, each timed out, and it was killed as
/// hung (gunicorn's sync worker on a redis that was down: clients waited 10-14 s
/// behind the probes, and a worker was killed per outage; Python seat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_slow_health_route_runs_one_probe_at_a_time_and_is_not_restarted() {
    let dir = temp_dir("liveness-slow-health");
    let calls = dir.join("health-calls");
    let slow = dir.join("slow");
    std::fs::write(
        dir.join("app.py"),
        format!(
            "import http.server, os, time\n{}\
             http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n",
            ok_handler(&format!(
                "        if self.path == '/health' and os.path.exists({:?}):\n\
                 \x20           with open({:?}, 'a') as f:\n\
                 \x20               f.write('x')\n\
                 \x20           time.sleep(1)\n",
                slow.display().to_string(),
                calls.display().to_string()
            ))
        ),
    )
    .unwrap();
    let (d, admin) = up_one_python_worker(&dir, "", 5).await;
    let addr = d.addr();
    std::fs::write(&slow, "").unwrap();
    // 6 s: twenty checks, five failed in a row a hang.
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let mut c = HttpClient::connect(addr).await.unwrap();
        assert_eq!(c.get("/").await.status, 200, "{}", d.stderr_text());
    }
    let probes = std::fs::read_to_string(&calls).unwrap_or_default().len();
    assert_no_restarts(admin, "restarted for a slow health route", &d).await;
    // One at a time: about one a second (the route's time), not one per check.
    assert!(
        probes <= 9,
        "{probes} probes ran in 6 s\n{}",
        d.stderr_text()
    );
}

/// Every route of both workers, `/health` too, waits 3 s on a slow database: probes get
/// no answer and nothing completes for seconds, as in a deadlock. But each worker's event
/// loop answers drover's ping over its IPC channel, so it waits and is not hung: no
/// worker is restarted (a restart would fail the requests it holds and make the database
/// no faster), and no request fails, as under Node's cluster module.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_waiting_on_a_slow_dependency_are_not_restarted() {
    let sick = no_sick_file("slow-dependency");
    let (d, admin) = up_two_workers("slow-dependency", &sick).await;
    let slow = PathBuf::from(format!("{}.slow", sick.display()));
    let stop = Arc::new(AtomicBool::new(false));
    let load = common::steady_load(d.addr(), 4, "/", Arc::clone(&stop));
    tokio::time::sleep(Duration::from_millis(300)).await;
    std::fs::write(&slow, "").unwrap();
    // About 7 s of a slow database: with checks every 300 ms that give up after 300 ms,
    // two in a row with nothing completed is a hang under the probes alone.
    let mut busy_seen = false;
    for _ in 0..35 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let s = status(admin).await;
        busy_seen |= s.apps[0].workers.iter().any(|w| w.state == "busy");
    }
    std::fs::remove_file(&slow).unwrap();
    let served =
        common::assert_load_never_failed(&stop, load, 8, "while the database was slow").await;
    assert_no_restarts(admin, "no worker should be restarted for waiting", &d).await;
    assert!(
        busy_seen,
        "the workers should read busy while they wait ({served} served)"
    );
}

/// Both workers' health routes say 503 (a shared dependency is down, say). One worker
/// is restarted; its replacement cannot become ready while the route says 503, and the
/// other worker is not touched meanwhile: it keeps serving. Once the route recovers,
/// the replacement joins and nothing else restarts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_failing_their_checks_at_once_are_restarted_one_at_a_time() {
    let sick = no_sick_file("both");
    let (d, admin) = up_two_workers("both", &sick).await;
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
        assert!(restart_records(&s).iter().all(|r| r.pid == first.pid));
    }

    std::fs::remove_file(&sick).unwrap();
    let after = wait_replaced(&d, admin, first.pid.unwrap()).await;
    assert!(after.contains(&other), "{after:?}");
    common::assert_load_never_failed(&stop, load, 20, "while both workers were sick").await;
    let health: Vec<_> = restart_records(&status(admin).await)
        .into_iter()
        .filter(|r| r.reason == "health")
        .collect();
    assert_eq!(health.len(), 1, "{health:?}");
}

/// drover itself short of descriptors (past capacity, say) cannot make its probes: that
/// says nothing about the workers. With `fall = 1` one such probe counted as a failure
/// would restart a worker; none is restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_drover_cannot_make_restart_no_worker() {
    let dir = temp_dir("liveness-shortage");
    // Checks every 100 ms, and one failure would be enough. The workers close a
    // connection after one answer, so each check needs a new one (a check's kept
    // connection, made before the shortage, needs no descriptor, and the shortage would
    // meet no check).
    let toml = liveness_config(2, "env = { REQUESTS_PER_CONNECTION = \"1\" }\n").replace(
        "interval = \"300ms\", timeout = \"300ms\", fall = 2",
        "interval = \"100ms\", timeout = \"300ms\", fall = 1",
    );
    assert!(toml.contains("fall = 1"), "{toml}");
    let file = dir.join("drover.toml");
    std::fs::write(&file, toml).unwrap();
    // Started under 1,024 descriptors (its client budget is sized from that), then
    // lowered to 64 while it runs, as descriptors held elsewhere would take them.
    let script = "ulimit -n 1024 && DROVER_LOG=drover_supervisor=debug exec \"$0\" \"$@\"";
    let args = [
        "-c",
        script,
        &bin().display().to_string(),
        "up",
        "-c",
        file.to_str().unwrap(),
    ];
    let d = DroverProcess::spawn(Path::new("/bin/sh"), &args).await;
    let admin = admin_addr(&d).await;
    let before = wait_all_serving(&d, admin).await;
    common::lower_nofile(&d, 64);
    let mut idle = Vec::new();
    for _ in 0..150 {
        idle.push(HttpClient::connect(d.addr()).await.unwrap());
    }
    assert!(
        d.wait_for_line("worker health check not run", Duration::from_secs(10))
            .await
            .is_some(),
        "no probe met the shortage:\n{}",
        d.stderr_text()
    );
    // Many probe intervals of shortage.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(idle);
    let s = status(admin).await;
    assert_eq!(restart_records(&s), [], "{}", d.stderr_text());
    assert_eq!(serving_pids(&s), before);
}
