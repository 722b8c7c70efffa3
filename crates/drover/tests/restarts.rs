//! `drover ctl restarts` and the restart fields of `drover ctl status`, through the real
//! binary: a crash-looping app and a worker killed from outside.

mod common;

use common::{admin_addr, bin, ctl, probe, status, temp_dir};
use drover_admin::RestartRow;
use drover_testkit::DroverProcess;
use std::time::Duration;

/// `drover up` with app "web" (the Python test worker, behind a balancer) and app
/// "bad", which writes two lines to stderr and exits with code 3, over and over.
async fn up_web_and_bad() -> (DroverProcess, std::net::SocketAddr) {
    let dir = temp_dir("restarts");
    let script = drover_testkit::write_py_worker(&dir).display().to_string();
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[app]]\nname = \"web\"\ncommand = [\"python3\", \"{script}\"]\n\
         [[app]]\nname = \"bad\"\n\
         command = [\"sh\", \"-c\", \"echo 'connecting to db' >&2; echo 'fatal: db down' >&2; exit 3\"]\n\
         [[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n"
    );
    let file = dir.join("drover.toml");
    std::fs::write(&file, toml).unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "-c", file.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    (d, admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctl_restarts_prints_why_workers_restarted_with_their_stderr() {
    let (d, admin) = up_web_and_bad().await;

    // Wait for a few crashes of "bad" and for "web" to serve.
    let mut web_pid = None;
    for _ in 0..200 {
        let s = status(admin).await;
        let bad = s.apps.iter().find(|a| a.name == "bad").unwrap();
        let web = s.apps.iter().find(|a| a.name == "web").unwrap();
        if bad.restarts.len() >= 2 && web.workers[0].state == "ready" {
            web_pid = web.workers[0].pid;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let web_pid = web_pid.unwrap_or_else(|| panic!("{}", d.stderr_text()));

    // As a log: a header per restart, its stderr indented below.
    let (code, out, err) = ctl(admin, &["restarts", "--app", "bad"]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 6, "{out}");
    for record in lines.chunks(3).take(2) {
        let header = record[0];
        assert!(
            header.contains("  bad/0  pid ") && header.contains("  exit  code 3  uptime "),
            "{out}"
        );
        assert!(header.contains("(ended before it was ready)"), "{out}");
        assert_eq!(
            &record[1..],
            ["    connecting to db", "    fatal: db down"],
            "{out}"
        );
    }
    assert!(!out.contains("web/"), "--app bad shows web: {out}");

    // As JSON.
    let (code, out, err) = ctl(admin, &["restarts", "--app", "bad", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let rows: Vec<RestartRow> = serde_json::from_str(&out).unwrap();
    assert!(rows.len() >= 2, "{out}");
    for r in &rows {
        assert_eq!((r.app.as_str(), r.reason.as_str()), ("bad", "exit"));
        assert_eq!((r.exit_code, r.signal), (Some(3), None));
        assert_eq!(r.stderr_tail, ["connecting to db", "fatal: db down"]);
        assert!(r.time.ends_with('Z') && r.unix_secs > 1.6e9, "{r:?}");
    }

    // A worker killed from outside is a signal, named.
    let killed = std::process::Command::new("kill")
        .args(["-9", &web_pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut web_log = String::new();
    for _ in 0..200 {
        let (code, out, err) = ctl(admin, &["restarts", "--app", "web"]).await;
        assert_eq!(code, 0, "{err}");
        if out.contains(&format!("web/0  pid {web_pid}  signal  signal 9 (SIGKILL)")) {
            web_log = out;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !web_log.is_empty(),
        "no SIGKILL record: {}",
        d.stderr_text()
    );

    // Without --app, both apps, oldest first.
    let (code, out, _) = ctl(admin, &["restarts"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("bad/0") && out.contains("web/0"), "{out}");
    let (code, _, err) = ctl(admin, &["restarts", "--app", "nope"]).await;
    assert_ne!(code, 0);
    assert!(
        err.contains("no app named \"nope\" runs (apps: web, bad)"),
        "{err}"
    );

    // The status table names each worker's last restart reason; the JSON has counters.
    let (code, table, err) = ctl(admin, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(table.contains("LAST RESTART"), "{table}");
    let lines: Vec<&str> = table.lines().collect();
    let bad = lines
        .iter()
        .position(|l| l.starts_with("app bad "))
        .unwrap();
    let col = lines[bad + 1].find("LAST RESTART").unwrap();
    assert!(lines[bad + 2][col..].starts_with("exit "), "{table}");
    let s = status(admin).await;
    let web = &s.apps.iter().find(|a| a.name == "web").unwrap().workers[0];
    assert_eq!(web.last_restart_reason.as_deref(), Some("signal"));
    assert_eq!(web.last_signal_name.as_deref(), Some("SIGKILL"));
    assert_eq!(web.restarts_by_reason.get("signal"), Some(&1));
    assert_eq!(web.restarts_by_reason.get("memory"), Some(&0));
    if web.state == "ready" {
        assert!(web.cpu_seconds.is_some() && web.started_at_unix_secs.is_some());
    }
}

/// A Python app that binds a port of its own (`app.run(port=5000)`) under `drover run
/// -w 2`: one worker binds it, the other fails with "Address already in use" and loops.
/// drover's crash-loop warning says what that output means and how to fix it. Before,
/// it said only "crash-looping ... within 1s of becoming ready" (it never was), and the
/// reason came 30 s later.
#[tokio::test]
async fn a_crash_loop_on_a_taken_port_says_to_listen_on_port() {
    let dir = temp_dir("own-port");
    let port = drover_testkit::free_port();
    std::fs::write(
        dir.join("app.py"),
        format!(
            "import http.server\n\
             http.server.HTTPServer(('127.0.0.1', {port}), http.server.SimpleHTTPRequestHandler).serve_forever()\n"
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(bin());
    cmd.args("run -w 2 -l 127.0.0.1:0 --admin 127.0.0.1:0 -- python3 app.py".split(' '))
        .current_dir(&dir);
    let d = drover_testkit::spawn_ready_line(cmd, "admin API listening on").await;
    let said = drover_testkit::wait_until(Duration::from_secs(30), || {
        d.stderr_text()
            .contains("its output says its address is in use")
    })
    .await;
    let log = d.stderr_text();
    assert!(said, "{log}");
    assert!(
        log.contains("exits in a row before it was ready or within"),
        "{log}"
    );
}

/// `max_restarts` (PM2's, `--max-restarts` under `drover run`): a worker that crashes at
/// every start is `errored` after that many restarts in a row and not started again,
/// while the other app serves on and drover keeps running. Before, the key was noted
/// as not applied, and the worker was restarted for as long as drover ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_restarts_leaves_a_crashing_worker_errored_while_another_app_serves() {
    let dir = temp_dir("max-restarts");
    let script = drover_testkit::write_py_worker(&dir).display().to_string();
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[app]]\nname = \"web\"\ncommand = [\"python3\", \"{script}\"]\n\
         [[app]]\nname = \"bad\"\nmax_restarts = 2\n\
         command = [\"sh\", \"-c\", \"echo 'fatal: db down' >&2; exit 3\"]\n\
         [[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n"
    );
    let file = dir.join("drover.toml");
    std::fs::write(&file, toml).unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "-c", file.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    let errored = drover_testkit::wait_until_async(Duration::from_secs(20), || async {
        let s = status(admin).await;
        let bad = s.apps.iter().find(|a| a.name == "bad").unwrap();
        bad.workers[0].state == "errored"
    })
    .await;
    assert!(errored, "{}", d.stderr_text());
    let bad_restarts = |s: &drover_admin::Status| {
        s.apps.iter().find(|a| a.name == "bad").unwrap().workers[0].restarts
    };
    assert_eq!(bad_restarts(&status(admin).await), 2, "{}", d.stderr_text());
    assert!(
        d.stderr_text().contains("worker bad/0 is errored")
            && d.stderr_text()
                .contains("past max_restarts = 2 (--max-restarts)")
            && d.stderr_text().contains("; not restarted")
            && !d.stderr_text().contains("restarting in 0ns"),
        "{}",
        d.stderr_text()
    );
    // Not started again, and drover serves the other app on.
    assert!(d.wait_exit(Duration::from_secs(2)).await.is_none());
    let s = status(admin).await;
    assert_eq!(bad_restarts(&s), 2);
    let web = s.apps.iter().find(|a| a.name == "web").unwrap();
    assert!(
        web.workers.iter().any(|w| w.state == "ready"),
        "{:?}",
        web.workers
    );
    // drover gave up on an app: not live, so an orchestrator restarts it (before,
    // `/livez` said "ok" while `/readyz` said "not ready" for good).
    assert_eq!(
        probe(admin, "GET", "/livez").await,
        (
            503,
            "not live: every worker of an app is errored (past max_restarts): drover starts \
             them no more\n"
                .to_string()
        )
    );
    assert_eq!(probe(admin, "GET", "/readyz").await.0, 503);
    // A reload starts it again (to crash, and be errored again).
    let (code, _, err) = ctl(admin, &["reload", "--app", "bad"]).await;
    let _ = (code, err);
    let again = drover_testkit::wait_until_async(Duration::from_secs(20), || async {
        bad_restarts(&status(admin).await) > 2
    })
    .await;
    assert!(again, "{}", d.stderr_text());
}

/// Once every worker of every app is errored, drover stops and exits 1, as
/// `pm2-runtime` does, so that a container's restart policy or systemd acts; a
/// container whose app cannot start no longer sits "up" answering 503 forever.
#[tokio::test]
async fn drover_exits_1_once_every_worker_is_errored() {
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
            "--max-restarts",
            "1",
            "--",
            "sh",
            "-c",
            "exit 3",
        ],
    )
    .await;
    let status = d.wait_exit(Duration::from_secs(30)).await;
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "{}",
        d.stderr_text()
    );
    assert!(
        d.stderr_text()
            .contains("every app's workers are errored (--max-restarts)"),
        "{}",
        d.stderr_text()
    );
}
