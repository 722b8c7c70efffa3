//! Issue 11, items 5 and 6: nothing a worker started outlives it, and a command or an
//! address that cannot work stops `drover up`/`drover run` at once, saying where.
//!
//! Workers here are shell wrappers that start a child and record its pid, so the tests
//! can look for that child after drover stopped, reloaded, scaled down or restarted
//! the worker.

mod common;

use common::{admin_addr, alive, bin, ctl, pi_server, probe, status, stops_cleanly, temp_dir};
use drover_testkit::{wait_until, DroverProcess};
use std::path::Path;
use std::process::Output;
use std::time::Duration;

/// How long a stopped process may take to disappear. Generous: the test only fails
/// when it never does.
const GONE_WITHIN: Duration = Duration::from_secs(10);

async fn all_gone(pids: &[u32]) -> bool {
    wait_until(GONE_WITHIN, || pids.iter().all(|p| !alive(*p))).await
}

/// `(worker id, child pid)` lines the wrapper appends to `file`.
fn children(file: &Path) -> Vec<(usize, u32)> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (id, pid) = l.split_once(' ')?;
            Some((id.parse().ok()?, pid.parse().ok()?))
        })
        .collect()
}

async fn wait_children(file: &Path, n: usize, d: &DroverProcess) -> Vec<(usize, u32)> {
    let enough = wait_until(Duration::from_secs(15), || children(file).len() >= n).await;
    assert!(
        enough,
        "expected {n} children in {}, got {:?}\n{}",
        file.display(),
        children(file),
        d.stderr_text()
    );
    children(file)
}

/// A worker that starts `sleep 1000` in the background, records it, then becomes the
/// pi server (`exec`, so the server is the process drover started).
fn forking_worker(file: &Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        r#"sleep 1000 & echo "$DROVER_WORKER_ID $!" >> "$0"; exec node "$1""#.into(),
        file.display().to_string(),
        pi_server(),
    ]
}

/// `drover run -w WORKERS` of `forking_worker`, with an admin API on a free port.
async fn run_forking(
    tag: &str,
    workers: &str,
) -> (DroverProcess, std::net::SocketAddr, std::path::PathBuf) {
    let file = temp_dir(tag).join("children");
    let cmd = forking_worker(&file);
    let mut args = vec![
        "run",
        "-w",
        workers,
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--",
    ];
    args.extend(cmd.iter().map(String::as_str));
    let d = DroverProcess::spawn(bin(), &args).await;
    let admin = admin_addr(&d).await;
    (d, admin, file)
}

fn worker_pids(s: &drover_admin::Status) -> Vec<Option<u32>> {
    s.apps[0].workers.iter().map(|w| w.pid).collect()
}

/// `run_forking` with 2 workers, once both have started their child: drover, and the
/// pids of the workers and of their children.
async fn two_forking_workers(tag: &str) -> (DroverProcess, Vec<u32>) {
    let (d, admin, file) = run_forking(tag, "2").await;
    let kids = wait_children(&file, 2, &d).await;
    let mains = worker_pids(&status(admin).await).into_iter().flatten();
    let pids = kids.iter().map(|k| k.1).chain(mains).collect();
    (d, pids)
}

#[tokio::test]
async fn ctrl_c_stops_every_worker_and_what_it_started() {
    let (d, pids) = two_forking_workers("proc-int").await;
    // Ctrl-C at a terminal reaches drover's process group only; the workers, in groups
    // of their own, hear of it through drover.
    d.signal("INT").unwrap();
    let exit = d.wait_exit(Duration::from_secs(20)).await;
    assert!(
        exit.is_some_and(|s| s.success()),
        "{exit:?}\n{}",
        d.stderr_text()
    );
    assert!(
        all_gone(&pids).await,
        "still running after drover stopped: {:?}",
        pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
}

/// A program that daemonizes (`rackup -D`, a `--daemon` flag): a child in a session of
/// its own goes on, and the process drover started exits. The daemon left the worker's
/// process group, which is what drover stops, so each restart left one more running:
/// 34 `rackup -D` daemons ran orphaned after 30 s, and all of them after drover stopped
/// (Ruby seat), where systemd stops them with the service's cgroup. drover is now its
/// workers' subreaper: each daemon comes back to it when its worker ends, and is
/// stopped, and the log says why.
#[tokio::test]
async fn a_program_that_daemonizes_leaves_nothing_running_and_is_told_why() {
    let file = temp_dir("proc-daemon").join("children");
    let file_arg = file.display().to_string();
    let d = DroverProcess::spawn(
        bin(),
        &[
            "run",
            "-w",
            "1",
            "-l",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--",
            "sh",
            "-c",
            r#"setsid sleep 1000 & echo "$DROVER_WORKER_ID $!" >> "$0"; exit 0"#,
            &file_arg,
        ],
    )
    .await;
    let kids = wait_children(&file, 3, &d).await;
    // Each start's daemon was stopped before the next start.
    let earlier: Vec<u32> = kids[..kids.len() - 1].iter().map(|k| k.1).collect();
    assert!(
        all_gone(&earlier).await,
        "daemons of ended workers still run: {:?}\n{}",
        earlier.iter().filter(|p| alive(**p)).collect::<Vec<_>>(),
        d.stderr_text()
    );
    assert!(
        d.wait_for_line("the program daemonized", GONE_WITHIN)
            .await
            .is_some(),
        "{}",
        d.stderr_text()
    );
    d.signal("INT").unwrap();
    assert!(d.wait_exit(Duration::from_secs(20)).await.is_some());
    let all: Vec<u32> = children(&file).iter().map(|k| k.1).collect();
    assert!(
        all_gone(&all).await,
        "daemons still run after drover stopped: {:?}",
        all.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn what_workers_started_dies_with_a_sigkilled_drover() {
    let (d, pids) = two_forking_workers("proc-kill9").await;
    // drover alone, as the OOM killer would: nothing of drover runs to stop anything.
    // The workers had the parent-death signal before; their children (the `sleep`s,
    // which the workers' groups share) were left running until the lifeline.
    d.kill();
    d.wait_exit(Duration::from_secs(5))
        .await
        .expect("drover survived SIGKILL");
    assert!(
        all_gone(&pids).await,
        "outlived a SIGKILLed drover: {:?}",
        pids.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_shell_wrappers_server_does_not_keep_the_port_after_drover_stops() {
    let dir = temp_dir("proc-wrap");
    let file = dir.join("children");
    // The shell is the worker drover started; the server is its child and holds the
    // port. Before process groups, SIGTERM reached the shell only.
    let toml = dir.join("drover.toml");
    std::fs::write(
        &toml,
        format!(
            "[[app]]\nname = \"web\"\ncommand = [\"sh\", \"-c\", 'node \"$1\" & echo \"$DROVER_WORKER_ID $!\" >> \"$0\"; wait', \"{}\", \"{}\"]\nstop_timeout = \"5s\"\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n",
            file.display(),
            pi_server()
        ),
    )
    .unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "-c", toml.to_str().unwrap()]).await;
    let kids = wait_children(&file, 1, &d).await;
    let server = kids[0].1;
    d.signal("TERM").unwrap();
    let exit = d.wait_exit(Duration::from_secs(20)).await;
    assert!(
        exit.is_some_and(|s| s.success()),
        "{exit:?}\n{}",
        d.stderr_text()
    );
    assert!(
        all_gone(&[server]).await,
        "the server {server} outlived drover"
    );
}

#[tokio::test]
async fn reload_and_scale_down_stop_what_the_old_workers_started() {
    let (d, admin, file) = run_forking("proc-reload", "2").await;
    let first = wait_children(&file, 2, &d).await;
    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
    let after = wait_children(&file, 4, &d).await;
    let old: Vec<u32> = first.iter().map(|k| k.1).collect();
    assert!(
        all_gone(&old).await,
        "children of replaced workers outlived the reload: {:?}",
        old.iter().filter(|p| alive(**p)).collect::<Vec<_>>()
    );
    let newest = |id: usize| after.iter().rev().find(|k| k.0 == id).unwrap().1;
    assert!(alive(newest(0)) && alive(newest(1)), "{after:?}");

    let (code, _, err) = ctl(admin, &["scale", "1"]).await;
    assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
    assert!(
        all_gone(&[newest(1)]).await,
        "the child of retired worker 1 outlived the scale-down"
    );
    assert!(alive(newest(0)), "worker 0's child was stopped too");
    stops_cleanly(d).await;
    assert!(all_gone(&[newest(0)]).await);
}

#[tokio::test]
async fn a_worker_that_dies_takes_what_it_started_with_it_before_its_restart() {
    let (d, admin, file) = run_forking("proc-crash", "1").await;
    let first = wait_children(&file, 1, &d).await;
    let main = worker_pids(&status(admin).await)[0].expect("worker 0 has a pid");
    let killed = std::process::Command::new("kill")
        .args(["-9", &main.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // The replacement records its own child as it starts; by then the old child must
    // be gone already, or it could still hold what the replacement needs (its port).
    wait_children(&file, 2, &d).await;
    assert!(
        !alive(first[0].1),
        "the dead worker's child {} was still running when its replacement started",
        first[0].1
    );
    stops_cleanly(d).await;
}

// ---------------------------------------------------------------------------------------
// Item 6: a command or an address that cannot work.
// ---------------------------------------------------------------------------------------

/// Runs drover to its end; a drover still running after 20 s fails the test (it was
/// meant to refuse to start).
async fn run_to_end(args: &[&str], cwd: &Path) -> Output {
    let child = tokio::process::Command::new(bin())
        .args(args)
        .current_dir(cwd)
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(Duration::from_secs(20), child).await {
        Ok(out) => out.unwrap(),
        Err(_) => panic!("drover {args:?} kept running instead of failing"),
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// An app that would leave `marker` behind if it ever started.
fn marker_app(name: &str, marker: &Path) -> String {
    format!(
        "[[app]]\nname = \"{name}\"\ncommand = [\"sh\", \"-c\", \"touch {} && exec sleep 30\"]\n",
        marker.display()
    )
}

#[tokio::test]
async fn up_with_a_missing_program_fails_at_once_naming_the_app_and_path() {
    let dir = temp_dir("proc-missing");
    let marker = dir.join("started");
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            "{}\n[[app]]\nname = \"broken\"\ncommand = [\"/nonexistent/server\", \"--port\"]\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:good\"]\n",
            marker_app("good", &marker)
        ),
    )
    .unwrap();
    let out = run_to_end(&["up", "-c", file.to_str().unwrap()], &dir).await;
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("\"broken\"") && err.contains("/nonexistent/server"),
        "{err}"
    );
    assert!(!err.contains("listening on"), "a listener started: {err}");
    assert!(!marker.exists(), "a worker started: {err}");
}

#[tokio::test]
async fn run_resolves_the_program_through_path_and_fails_when_it_is_not_there() {
    let dir = temp_dir("proc-path");
    let out = run_to_end(
        &[
            "run",
            "-l",
            "127.0.0.1:0",
            "--admin",
            "off",
            "--",
            "drover-no-such-program",
        ],
        &dir,
    )
    .await;
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("drover-no-such-program"), "{err}");
    assert!(err.contains("PATH"), "{err}");
    assert!(!err.contains("listening on"), "a listener started: {err}");
}

#[tokio::test]
async fn a_relative_program_is_looked_up_in_the_apps_cwd_and_must_be_executable() {
    let dir = temp_dir("proc-noexec");
    let app_dir = dir.join("app");
    std::fs::create_dir_all(&app_dir).unwrap();
    // Executable where drover runs, not executable in the app's cwd: the app's cwd
    // decides, as it does for the spawn. No extension: a `serve.sh` that cannot run by
    // itself runs under bash, as PM2 runs it (`with_interpreter`).
    for (d, mode) in [(&dir, 0o755), (&app_dir, 0o644)] {
        let script = d.join("serve");
        std::fs::write(&script, "#!/bin/sh\nexec sleep 30\n").unwrap();
        let mut perms = std::fs::metadata(&script).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, mode);
        std::fs::set_permissions(&script, perms).unwrap();
    }
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            "[[app]]\nname = \"web\"\ncommand = [\"./serve\"]\ncwd = \"{}\"\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:web\"]\n",
            app_dir.display()
        ),
    )
    .unwrap();
    let out = run_to_end(&["up", "-c", file.to_str().unwrap()], &dir).await;
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    let expected = app_dir.join("serve").display().to_string();
    assert!(
        err.contains("\"web\"") && err.contains(&expected) && err.contains("not executable"),
        "{err}"
    );
}

#[tokio::test]
async fn a_taken_balancer_address_names_the_file_line_and_key_and_starts_nothing() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = temp_dir("proc-bind");
    let marker = dir.join("started");
    let file = dir.join("drover.toml");
    // The balancer's listen is on line 6: the app's three lines, a blank one, the table.
    std::fs::write(
        &file,
        format!(
            "{}\n[[balancer]]\nlisten = \"{addr}\"\nbackends = [\"app:web\"]\n",
            marker_app("web", &marker)
        ),
    )
    .unwrap();
    let out = run_to_end(&["up", "-c", file.to_str().unwrap()], &dir).await;
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    let at = format!("{}:6:", file.display());
    assert!(
        err.contains(&at) && err.contains("balancer[0].listen") && err.contains(&addr.to_string()),
        "expected {at} balancer[0].listen in: {err}"
    );
    // And what holds it (this test), as `drover check` says: it said only "Address
    // already in use".
    let pid = format!(" (pid {})", std::process::id());
    assert!(
        err.contains("Address already in use (os error 98), by ") && err.contains(&pid),
        "{err}"
    );
    assert!(!marker.exists(), "a worker started: {err}");
}

#[tokio::test]
async fn a_taken_admin_address_names_the_file_line_and_key() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = temp_dir("proc-bind-admin");
    let marker = dir.join("started");
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            "[admin]\nlisten = \"{addr}\"\n\n{}\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:web\"]\n",
            marker_app("web", &marker)
        ),
    )
    .unwrap();
    let out = run_to_end(&["up", "-c", file.to_str().unwrap()], &dir).await;
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    let at = format!("{}:2:", file.display());
    assert!(
        err.contains(&at) && err.contains("admin.listen"),
        "expected {at} admin.listen in: {err}"
    );
    assert!(
        err.contains(", by ") && err.contains(&format!(" (pid {})", std::process::id())),
        "{err}"
    );
    assert!(!marker.exists(), "a worker started: {err}");
}

#[tokio::test]
async fn run_names_the_listen_flag_when_its_address_is_taken_and_starts_nothing() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = temp_dir("proc-bind-flag");
    let marker = dir.join("started");
    let script = format!("touch {} && exec sleep 30", marker.display());
    let out = run_to_end(
        &[
            "run", "-l", &addr, "--admin", "off", "--", "sh", "-c", &script,
        ],
        &dir,
    )
    .await;
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("--listen") && err.contains(&addr),
        "expected --listen {addr} in: {err}"
    );
    assert!(
        err.contains(&format!(" (pid {})", std::process::id())),
        "{err}"
    );
    assert!(!marker.exists(), "a worker started: {err}");
}

/// The zombies among the children of process `pid` (from the host's /proc).
fn zombie_children(pid: u32) -> Vec<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
        .filter(|c| {
            std::fs::read_to_string(format!("/proc/{c}/stat"))
                .ok()
                .and_then(|s| Some(s.rsplit_once(')')?.1.split_whitespace().next()? == "Z"))
                .unwrap_or(false)
        })
        .collect()
}

/// drover as a container's first process (PID 1 of a PID namespace, as `docker run`
/// starts its command): every process whose parent ends is re-parented to it, and stays
/// a zombie until drover reaps it. Each worker here leaves one such process (a `sleep`
/// its shell started in a subshell that exited). Before, they stayed: two per start,
/// two more per reload, for as long as drover ran, until the container's process table
/// filled. Now drover reaps them, and still reaps its own workers as before (a reload
/// replaces both, and each new one serves).
#[tokio::test]
async fn as_a_containers_first_process_drover_reaps_what_its_workers_leave() {
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
        .arg(bin())
        .args([
            "run",
            "-w",
            "2",
            "-l",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .args(["--", "sh", "-c"])
        .arg("(sleep 0.2 &); exec python3 -m http.server \"$PORT\" --bind 127.0.0.1");
    let d = drover_testkit::spawn_ready_line(cmd, "\"default\" listening on ").await;
    // unshare's one child is drover, PID 1 inside.
    let unshare = d.pid();
    let drover: u32 = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("drover below unshare: {e}\n{}", d.stderr_text()));
    let admin = admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    common::wait_all_serving(&d, admin).await;
    let r = common::examples::get(d.addr(), "/").await;
    assert_eq!(r.status, 200, "{}", d.stderr_text());
    // Each of the 4 workers started left a sleep behind; none stays a zombie.
    let none_left = wait_until(GONE_WITHIN, || zombie_children(drover).is_empty()).await;
    assert!(
        none_left,
        "zombies of drover (PID 1): {:?}\n{}",
        zombie_children(drover),
        d.stderr_text()
    );
    // SIGTERM to drover itself (unshare passes none on); unshare exits as it does.
    let term = std::process::Command::new("kill")
        .args(["-TERM", &drover.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let status = d.wait_exit(GONE_WITHIN).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        d.stderr_text()
    );
}

/// `--stop-timeout`, also as PM2's `--kill-timeout` (a bare number in milliseconds, as
/// PM2 reads it), bounds how long a worker that ignores SIGTERM holds drover's stop, so
/// a container's stop fits `docker stop`'s 10 s. Before, only a drover.toml or PM2's
/// form after a script could set it: `drover run -w 1 --kill-timeout 3000 -- CMD` was
/// refused as an unexpected argument (container seat).
#[tokio::test]
async fn a_stop_timeout_flag_bounds_the_wait_for_a_worker_that_ignores_sigterm() {
    let program = "import http.server, os, signal\n\
                   signal.signal(signal.SIGTERM, signal.SIG_IGN)\n\
                   http.server.HTTPServer(('127.0.0.1', int(os.environ['PORT'])), \
                   http.server.SimpleHTTPRequestHandler).serve_forever()\n";
    for (flag, value) in [("--stop-timeout", "300ms"), ("--kill-timeout", "300")] {
        let d = DroverProcess::spawn(
            bin(),
            &[
                "run",
                "-w",
                "1",
                "-l",
                "127.0.0.1:0",
                "--admin",
                "127.0.0.1:0",
                flag,
                value,
                "--",
                "python3",
                "-c",
                program,
            ],
        )
        .await;
        let admin = admin_addr(&d).await;
        common::wait_all_serving(&d, admin).await;
        d.signal("TERM").unwrap();
        let line = d
            .wait_for_line("did not exit within", Duration::from_secs(8))
            .await
            .unwrap_or_else(|| panic!("{flag} {value}: no SIGKILL line:\n{}", d.stderr_text()));
        // It names the worker (it said only a pid).
        assert!(
            line.contains("within 300ms of SIGTERM") && line.contains("worker app/0 (pid "),
            "{flag}: {line}"
        );
        let status = d.wait_exit(Duration::from_secs(8)).await;
        assert!(status.is_some_and(|s| s.success()), "{}", d.stderr_text());
    }
    let refused = std::process::Command::new(bin())
        .args(["run", "--stop-timeout", "soon", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && err.contains("'soon' for '--stop-timeout"),
        "{err}"
    );
}

/// `drover run -w 1 FLAGS` (admin API behind a token) of a Python server on its `PORT`
/// that answers `ok`, and `/slow` after 4 s, and listens `boot_secs` after it starts.
async fn run_python_ok_server(boot_secs: u32, flags: &[&str]) -> DroverProcess {
    let program = format!(
        "import http.server, os, time\n\
         class H(http.server.BaseHTTPRequestHandler):\n\
         \x20   def do_GET(self):\n\
         \x20       if self.path == '/slow':\n\
         \x20           time.sleep(4)\n\
         \x20       self.send_response(200)\n\
         \x20       self.send_header('content-length', '2')\n\
         \x20       self.end_headers()\n\
         \x20       self.wfile.write(b'ok')\n\
         \x20   def log_message(self, *args):\n\
         \x20       pass\n\
         time.sleep({boot_secs})\n\
         http.server.ThreadingHTTPServer(('127.0.0.1', int(os.environ['PORT'])), H).serve_forever()\n"
    );
    let mut args = vec![
        "run",
        "-w",
        "1",
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ];
    args.extend(["--admin-token", "secret"]);
    args.extend_from_slice(flags);
    args.extend(["--", "python3", "-c", program.as_str()]);
    DroverProcess::spawn(bin(), &args).await
}

/// `GET /readyz` answers what an orchestrator's probe needs, with no token (a probe
/// carries none, and the answer holds no data): 503 while the app's workers start, 200
/// once one serves, and 503 from the moment a stop begins, while drover drains the
/// requests it holds; `/livez` is 200 throughout. Before, the only probe was
/// `/v1/status`, which needs the token off loopback and answered 200 while every
/// worker crash-looped and while drover drained (container seat).
#[tokio::test]
async fn readyz_says_whether_drover_serves_and_turns_at_a_stop() {
    // It listens 3 s after it starts: drover is not ready until then.
    let d = run_python_ok_server(3, &[]).await;
    let admin = admin_addr(&d).await;
    assert_eq!(
        probe(admin, "GET", "/readyz").await,
        (503, "not ready: an app has no serving worker\n".to_string()),
        "{}",
        d.stderr_text()
    );
    assert_eq!(
        probe(admin, "GET", "/livez").await,
        (200, "ok\n".to_string())
    );
    assert_eq!(probe(admin, "GET", "/v1/status").await.0, 401);
    assert_eq!(probe(admin, "POST", "/readyz").await.0, 405);
    let ready = drover_testkit::wait_until_async(Duration::from_secs(20), || async {
        probe(admin, "GET", "/readyz").await == (200, "ready\n".to_string())
    })
    .await;
    assert!(ready, "{}", d.stderr_text());

    // A request in flight keeps the drain going while the probe is asked.
    let addr = d.addr();
    let slow = tokio::spawn(async move {
        let mut c = drover_testkit::HttpClient::connect(addr).await.unwrap();
        c.get("/slow").await.status
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    d.signal("TERM").unwrap();
    let draining = drover_testkit::wait_until_async(Duration::from_secs(3), || async {
        probe(admin, "GET", "/readyz").await
            == (
                503,
                "not ready: drover is stopping (draining)\n".to_string(),
            )
    })
    .await;
    assert!(draining, "{}", d.stderr_text());
    assert_eq!(slow.await.unwrap(), 200);
    let status = d.wait_exit(Duration::from_secs(15)).await;
    assert!(status.is_some_and(|s| s.success()), "{}", d.stderr_text());
}

/// `--shutdown-delay` (HAProxy's `grace`): a stop says "draining" on `/readyz` at once
/// and still serves new connections for the delay, for a load balancer in front that
/// takes drover out of rotation only some seconds after the stop begins. Before, the
/// listener closed at the signal and those clients were refused.
#[tokio::test]
async fn a_shutdown_delay_keeps_accepting_while_readyz_says_draining() {
    let d = run_python_ok_server(0, &["--shutdown-delay", "4s"]).await;
    let admin = admin_addr(&d).await;
    let ready = drover_testkit::wait_until_async(Duration::from_secs(20), || async {
        probe(admin, "GET", "/readyz").await == (200, "ready\n".to_string())
    })
    .await;
    assert!(ready, "{}", d.stderr_text());
    d.signal("TERM").unwrap();
    let draining = drover_testkit::wait_until_async(Duration::from_secs(2), || async {
        probe(admin, "GET", "/readyz").await
            == (
                503,
                "not ready: drover is stopping (draining)\n".to_string(),
            )
    })
    .await;
    assert!(draining, "{}", d.stderr_text());
    // A client that arrives now, on a new connection, is still served.
    let mut c = drover_testkit::HttpClient::connect(d.addr())
        .await
        .unwrap_or_else(|e| panic!("refused during the delay: {e}\n{}", d.stderr_text()));
    assert_eq!(c.get("/").await.status, 200, "{}", d.stderr_text());
    drop(c);
    let status = d.wait_exit(Duration::from_secs(20)).await;
    assert!(status.is_some_and(|s| s.success()), "{}", d.stderr_text());
    assert!(
        d.stderr_text()
            .contains("still accepting for 4s (--shutdown-delay)"),
        "{}",
        d.stderr_text()
    );
}

/// `WEB_CONCURRENCY` (set by Heroku, Render and Dokku from the machine's memory, read by
/// gunicorn and throng) is how many workers `drover run` starts when `-w` does not say;
/// a value that is no count is refused by name, nothing started. Before, drover started
/// one per core whatever the platform said.
#[tokio::test]
async fn web_concurrency_sets_the_worker_count_when_w_does_not() {
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["run", "-l", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--"])
        .args(["node", &pi_server()])
        .env("WEB_CONCURRENCY", "3");
    let d = drover_testkit::spawn_ready_line(cmd, "listening on ").await;
    let admin = admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    assert_eq!(
        status(admin).await.apps[0].workers.len(),
        3,
        "{}",
        d.stderr_text()
    );
    stops_cleanly(d).await;

    let out = tokio::time::timeout(
        Duration::from_secs(20),
        tokio::process::Command::new(bin())
            .args(["run", "-l", "127.0.0.1:0", "--", "node", &pi_server()])
            .env("WEB_CONCURRENCY", "lots")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("drover started with WEB_CONCURRENCY=lots")
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("WEB_CONCURRENCY=\"lots\"") && stderr.contains("-w N"),
        "{stderr}"
    );
}
