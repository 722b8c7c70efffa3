//! `{port}` in a command's arguments: each worker gets its own port there, for programs
//! that take the port as a flag rather than from `PORT`; shared mode, which has no port
//! per worker, refuses it. Real `drover run` and `drover up` over real Python servers.

mod common;

use common::{admin_addr, bin, ctl, status, stops_cleanly, temp_dir, wait_all_serving};
use drover_testkit::{DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::time::Duration;

/// The arguments a process was started with, from /proc.
fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect()
}

/// Each serving worker of the first app: (id, pid, port), once all of them serve.
async fn workers(d: &DroverProcess, admin: SocketAddr) -> Vec<(usize, u32, u16)> {
    wait_all_serving(d, admin).await;
    status(admin).await.apps[0]
        .workers
        .iter()
        .map(|w| (w.id, w.pid.unwrap(), w.port.unwrap()))
        .collect()
}

/// `GET path` on a new connection: the status and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let mut c = HttpClient::connect(addr).await.unwrap();
    let r = c.get(path).await;
    (r.status, r.text())
}

/// A directory holding `hello.txt`, for `http.server --directory`.
fn site(tag: &str) -> String {
    let dir = temp_dir(tag);
    std::fs::write(dir.join("hello.txt"), "hello\n").unwrap();
    dir.display().to_string()
}

#[tokio::test]
async fn run_puts_each_workers_port_in_its_arguments() {
    let site = site("port-run");
    // http.server takes its port only as an argument and ignores PORT: it serves only
    // if `{port}` became the worker's port.
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
            "--threads",
            "1",
            "--strategy",
            "round-robin",
            "--",
            "python3",
            "-m",
            "http.server",
            "{port}",
            "--bind",
            "127.0.0.1",
            "--directory",
            &site,
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    let ws = workers(&d, admin).await;
    assert_eq!(ws.len(), 2);
    assert_ne!(ws[0].2, ws[1].2, "two workers on one port: {ws:?}");
    for &(id, pid, port) in &ws {
        let args = cmdline(pid);
        assert!(
            args.contains(&port.to_string()) && !args.iter().any(|a| a.contains("{port}")),
            "worker {id} on port {port} was started with {args:?}"
        );
        // It listens where its argument says.
        let worker = SocketAddr::from(([127, 0, 0, 1], port));
        assert_eq!(get(worker, "/hello.txt").await, (200, "hello\n".into()));
    }
    // Through drover's listen address, round-robin: both workers serve.
    for _ in 0..6 {
        assert_eq!(get(d.addr(), "/hello.txt").await, (200, "hello\n".into()));
    }
    for id in 0..2 {
        // http.server logs each request to stderr, which drover prefixes per worker. A
        // worker's own direct request above is one line; a proxied one makes two.
        let served = drover_testkit::wait_until(Duration::from_secs(10), || {
            d.lines_containing(&format!("[app/{id}] "))
                .iter()
                .filter(|l| l.contains("\"GET /hello.txt HTTP/1.1\" 200"))
                .count()
                >= 2
        })
        .await;
        assert!(
            served,
            "worker {id} served no proxied request\n{}",
            d.stderr_text()
        );
    }
    stops_cleanly(d).await;
}

#[tokio::test]
async fn up_puts_the_port_inside_an_argument_and_restarts_and_reloads_get_their_new_port() {
    let site = site("port-up");
    let dir = temp_dir("port-up-config");
    let file = dir.join("drover.toml");
    // A program that takes `--bind=HOST:PORT`: `{port}` in the middle of an argument.
    let server = "import sys, http.server as h, functools; host, port = sys.argv[1].removeprefix('--bind=').rsplit(':', 1); h.ThreadingHTTPServer((host, int(port)), functools.partial(h.SimpleHTTPRequestHandler, directory=sys.argv[2])).serve_forever()";
    std::fs::write(
        &file,
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[app]]\nname = \"web\"\ncommand = [\"python3\", \"-c\", {server:?}, \"--bind=127.0.0.1:{{port}}\", {site:?}]\nworkers = 2\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n"
        ),
    )
    .unwrap();
    let d = DroverProcess::spawn(bin(), &["up", "--config", file.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    let before = workers(&d, admin).await;
    for &(id, pid, port) in &before {
        let bind = format!("--bind=127.0.0.1:{port}");
        assert!(
            cmdline(pid).contains(&bind),
            "worker {id}: no {bind} in {:?}",
            cmdline(pid)
        );
    }
    assert_eq!(get(d.addr(), "/hello.txt").await, (200, "hello\n".into()));

    // A restart picks a fresh port, and the replacement's argument says that one.
    let (_, old_pid, old_port) = before[0];
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &old_pid.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let replaced = drover_testkit::wait_until_async(Duration::from_secs(20), || async {
        let w = &status(admin).await.apps[0].workers[0];
        w.pid.is_some_and(|p| p != old_pid) && matches!(w.state.as_str(), "ready" | "busy")
    })
    .await;
    assert!(replaced, "worker 0 was not replaced\n{}", d.stderr_text());
    let after = workers(&d, admin).await;
    let (_, pid, port) = after[0];
    assert!(
        cmdline(pid).contains(&format!("--bind=127.0.0.1:{port}")),
        "the replacement on port {port} (was {old_port}) was started with {:?}",
        cmdline(pid)
    );
    assert_eq!(
        get(SocketAddr::from(([127, 0, 0, 1], port)), "/hello.txt").await,
        (200, "hello\n".into())
    );

    // So does every worker a reload starts.
    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
    let reloaded = workers(&d, admin).await;
    for (&(id, pid, port), &(_, old_pid, _)) in reloaded.iter().zip(&after) {
        assert_ne!(pid, old_pid, "worker {id} was not replaced by the reload");
        let bind = format!("--bind=127.0.0.1:{port}");
        assert!(
            cmdline(pid).contains(&bind),
            "reloaded worker {id}: no {bind} in {:?}",
            cmdline(pid)
        );
    }
    assert_eq!(get(d.addr(), "/hello.txt").await, (200, "hello\n".into()));
    stops_cleanly(d).await;
}

/// Runs drover with `args` and expects it to refuse them: exit 2 and `needle` on stderr.
async fn refused(args: &[&str], needle: &str) {
    let out = tokio::process::Command::new(bin())
        .args(args)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: expected {needle:?} in: {stderr}"
    );
}

#[tokio::test]
async fn shared_mode_refuses_a_port_in_the_command() {
    refused(
        &[
            "run",
            "--mode",
            "shared",
            "-l",
            "127.0.0.1:0",
            "--admin",
            "off",
            "--",
            "python3",
            "-m",
            "http.server",
            "{port}",
        ],
        "error: {port} in the command needs a port per worker, which --mode shared does not have",
    )
    .await;
    let dir = temp_dir("port-shared");
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        "[[app]]\nname = \"web\"\ncommand = [\"app\", \"--bind=127.0.0.1:{port}\"]\nmode = \"shared\"\nlisten = \"127.0.0.1:0\"\n",
    )
    .unwrap();
    refused(
        &["up", "--config", file.to_str().unwrap()],
        &format!(
            "error: {}:3:11: app[0].command: {{port}} needs a port per worker, which mode = \"shared\" does not have",
            file.display()
        ),
    )
    .await;
}

/// `PORT` in drover's environment, as Heroku, Cloud Run, Render and Fly set it for the
/// one process they run, and route clients to: with no `-l`, drover's balancer listens
/// there (every IPv4 address), and each worker still gets a port of its own. Before,
/// drover listened on 127.0.0.1:8000 and the platform found nothing at its PORT. A
/// `PORT` that is not a port is refused, naming it.
#[tokio::test]
async fn without_listen_run_serves_at_the_port_in_its_environment() {
    let site = site("port-env");
    let port = drover_testkit::free_port();
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["run", "-w", "2", "--admin", "127.0.0.1:0", "--"])
        .args([
            "python3",
            "-m",
            "http.server",
            "{port}",
            "--bind",
            "127.0.0.1",
        ])
        .args(["--directory", &site])
        .env("PORT", port.to_string());
    let d = drover_testkit::spawn_ready_line(cmd, "\"default\" listening on ").await;
    assert_eq!(
        d.addr(),
        SocketAddr::from(([0, 0, 0, 0], port)),
        "{}",
        d.stderr_text()
    );
    let admin = admin_addr(&d).await;
    let ports: Vec<u16> = workers(&d, admin).await.iter().map(|w| w.2).collect();
    assert!(!ports.contains(&port), "{ports:?}");
    let (code, body) = get(SocketAddr::from(([127, 0, 0, 1], port)), "/hello.txt").await;
    assert_eq!(
        (code, body.as_str()),
        (200, "hello\n"),
        "{}",
        d.stderr_text()
    );
    stops_cleanly(d).await;

    let out = std::process::Command::new(bin())
        .args(["run", "--admin", "off", "--", "python3", "app.py"])
        .env("PORT", "http")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("PORT=\"http\" in drover's environment is not a port"),
        "{err}"
    );
}

/// `drover run -w WORKERS EXTRA -- python3 -m http.server PORT` (a port of its own,
/// not its PORT) serving `site`.
async fn http_server_on(workers: &str, port: u16, site: &str, extra: &[&str]) -> DroverProcess {
    let port = port.to_string();
    let mut args = vec![
        "run",
        "-w",
        workers,
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "python3", "-m", "http.server", &port]);
    args.extend_from_slice(&["--bind", "127.0.0.1", "--directory", site]);
    DroverProcess::spawn(bin(), &args).await
}

/// A program that is not Node and binds a port of its own (`app.run(port=5000)`,
/// `ListenAndServe(":8080")`) is not ready at its PORT: where its ready timeout is
/// shorter than drover's look at where it listens instead (1 s here), drover says where
/// it listens and how to give it its port. Before, the log said only that it was not
/// ready in time and that its next start gets longer, as if it were slow.
#[tokio::test]
async fn a_program_on_a_port_of_its_own_is_told_where_it_listens() {
    let site = site("port-own");
    let own = drover_testkit::free_port();
    let d = http_server_on("1", own, &site, &["--ready-timeout", "1s"]).await;
    let line = d
        .wait_for_line("never listened on its PORT", Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("no line:\n{}", d.stderr_text()));
    assert!(
        line.contains(&format!("it listens on 127.0.0.1:{own} instead"))
            && line.contains("put {port} in its arguments"),
        "{line}"
    );
    stops_cleanly(d).await;
}

/// A program that is not Node and binds a fixed port of its own, with nothing that takes
/// `PORT` (Sinatra's `set :port`, Puma's 9292, here `http.server 4567`), as PM2 runs it:
/// the copy that binds the port serves, and drover sends its clients there; the others
/// cannot bind it, and the log says how to run more. When the serving copy is killed,
/// the next one to bind the port serves. Before, drover stopped the one copy that served
/// at every ready timeout, for not listening on its PORT, and its clients got 503s.
#[tokio::test]
async fn a_program_on_a_fixed_port_of_its_own_serves_through_drover() {
    let site = site("port-fixed");
    let fixed = drover_testkit::free_port();
    let d = http_server_on("2", fixed, &site, &[]).await;
    let served = |what: &'static str| {
        let addr = d.addr();
        async move {
            match tokio::time::timeout(Duration::from_secs(20), get(addr, "/hello.txt")).await {
                Ok(answer) => answer,
                Err(_) => panic!("{what}: no answer within 20 s"),
            }
        }
    };
    let answer = served("at the start").await;
    assert_eq!(
        (answer.0, answer.1.as_str()),
        (200, "hello\n"),
        "{}",
        d.stderr_text()
    );
    let line = d
        .wait_for_line("not on its PORT", Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("no line:\n{}", d.stderr_text()));
    assert!(
        line.contains(&format!("listens on 127.0.0.1:{fixed}, not on its PORT"))
            && line.contains("put {port} in its arguments"),
        "{line}"
    );
    // The serving worker shows the port it serves at.
    let admin = admin_addr(&d).await;
    let serving = status(admin).await.apps[0]
        .workers
        .iter()
        .find(|w| w.port == Some(fixed))
        .and_then(|w| w.pid)
        .unwrap_or_else(|| panic!("no worker at {fixed}:\n{}", d.stderr_text()));
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &serving.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let answer = served("after the serving copy was killed").await;
    assert_eq!(
        (answer.0, answer.1.as_str()),
        (200, "hello\n"),
        "{}",
        d.stderr_text()
    );
    stops_cleanly(d).await;
}

/// `--worker-ports LOW-HIGH` keeps every worker's own port in a range a host or a
/// firewall allows, across a reload too; before, they came from anywhere in
/// 20000-32000 (ops and SSR seats). A range too small for the workers and a reload is
/// refused before anything starts, naming it.
#[tokio::test]
async fn worker_ports_keep_each_workers_port_in_the_range_through_a_reload() {
    let site = site("port-range");
    let low = drover_testkit::free_port();
    let range = format!("{low}-{}", low + 5);
    let args = |range: &str| {
        let command = [
            "python3",
            "-m",
            "http.server",
            "{port}",
            "--bind",
            "127.0.0.1",
        ];
        let command: Vec<&str> = command
            .iter()
            .copied()
            .chain(["--directory", &site])
            .collect();
        common::run_args(2, &["--worker-ports", range], &command)
    };
    let run = args(&range);
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let d = DroverProcess::spawn(bin(), &run).await;
    let admin = admin_addr(&d).await;
    let in_range = |ws: &[(usize, u32, u16)]| {
        ws.iter()
            .all(|&(_, _, port)| (low..=low + 5).contains(&port))
    };
    let before = workers(&d, admin).await;
    assert!(in_range(&before), "{before:?} outside {range}");
    assert_eq!(get(d.addr(), "/hello.txt").await, (200, "hello\n".into()));
    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
    let after = workers(&d, admin).await;
    assert!(in_range(&after), "{after:?} outside {range}");
    assert!(
        after.iter().all(|w| !before.iter().any(|b| b.1 == w.1)),
        "reloaded: {before:?} {after:?}"
    );
    assert_eq!(get(d.addr(), "/hello.txt").await, (200, "hello\n".into()));
    stops_cleanly(d).await;

    // Two ports for two workers: a reload would find none for the replacement.
    let small = format!("{low}-{}", low + 1);
    let run = args(&small);
    let run: Vec<&str> = run.iter().map(String::as_str).collect();
    let out = tokio::process::Command::new(bin())
        .args(&run)
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!(
            "worker_ports {small} holds 2 port(s), and 2 worker(s) need 3"
        )),
        "{err}"
    );
}
