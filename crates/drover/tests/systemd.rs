//! systemd's notify protocol, spoken by `drover up` to a `NOTIFY_SOCKET` this test listens
//! on, as systemd does for a `Type=notify` service with `WatchdogSec=`: READY=1 once the
//! workers serve (not before), WATCHDOG=1 while it runs, RELOADING=1 and READY=1 around a
//! reload, STOPPING=1 on SIGTERM. The workers never see the socket.
//!
//! This machine (a container) runs no systemd to start drover under, so the test plays
//! systemd's part of the protocol itself; `examples/systemd/drover.service` is the unit.

mod common;

use common::{admin_addr, bin, status, temp_dir, wait_all_serving};
use drover_testkit::{free_port, spawn_ready_line, wait_until_async, HttpClient};
use std::os::unix::net::UnixDatagram;
use std::process::Command;
use std::time::{Duration, Instant};

/// The datagrams that arrive within `limit`, until one contains `until`.
fn messages_until(socket: &UnixDatagram, until: &str, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        socket
            .set_read_timeout(Some(
                deadline
                    .saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ))
            .unwrap();
        let Ok(n) = socket.recv(&mut buf) else { break };
        let text = String::from_utf8_lossy(&buf[..n]).into_owned();
        let done = text.lines().any(|l| l == until);
        seen.push(text);
        if done {
            return seen;
        }
    }
    panic!("no {until:?} within {limit:?}; got {seen:?}");
}

#[tokio::test]
async fn drover_up_speaks_the_notify_protocol_and_keeps_it_from_its_workers() {
    let dir = temp_dir("systemd");
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    // A worker that takes a while to start (so READY=1 has something to wait for) and
    // tells what it sees of systemd's variables.
    let worker = dir.join("worker.js");
    std::fs::write(
        &worker,
        r#"setTimeout(() => {
  require("http")
    .createServer((req, res) =>
      res.end(["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"]
        .map((k) => `${k}=${process.env[k] ?? "unset"}`).join(" ")))
    .listen(Number(process.env.PORT), "127.0.0.1");
}, 700);
"#,
    )
    .unwrap();
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[app]]\nname = \"web\"\ncommand = [\"node\", \"{}\"]\nworkers = 2\n\n[[balancer]]\nname = \"front\"\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:web\"]\n",
            worker.display()
        ),
    )
    .unwrap();
    let mut cmd = Command::new(bin());
    cmd.args(["up", "-c", file.to_str().unwrap()])
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "400000");
    let d = spawn_ready_line(cmd, "balancer \"front\" listening on ").await;
    let front = d.addr();
    let admin = admin_addr(&d).await;

    // READY=1 comes once both workers serve: at that moment status says so.
    let socket = tokio::task::spawn_blocking(move || {
        let seen = messages_until(&socket, "READY=1", Duration::from_secs(20));
        (socket, seen)
    });
    let (socket, seen) = socket.await.unwrap();
    let s = status(admin).await;
    assert!(
        s.apps[0]
            .workers
            .iter()
            .all(|w| matches!(w.state.as_str(), "ready" | "busy")),
        "READY=1 before the workers served: {s:?}"
    );
    assert!(
        seen.iter()
            .all(|m| !m.contains("RELOADING") && !m.contains("STOPPING")),
        "{seen:?}"
    );
    let mut client = HttpClient::connect(front).await.unwrap();
    let body = client.get("/").await.text();
    assert_eq!(
        body,
        "NOTIFY_SOCKET=unset WATCHDOG_USEC=unset WATCHDOG_PID=unset"
    );

    // The watchdog: WATCHDOG_USEC=400000 asks for a pet at least every 0.4 s.
    let (socket, seen) = tokio::task::spawn_blocking(move || {
        let mut pets = 0;
        let mut seen = Vec::new();
        while pets < 3 {
            for m in messages_until(&socket, "WATCHDOG=1", Duration::from_secs(5)) {
                pets += usize::from(m.lines().any(|l| l == "WATCHDOG=1"));
                seen.push(m);
            }
        }
        (socket, seen)
    })
    .await
    .unwrap();
    assert!(seen.iter().all(|m| !m.contains("READY=1")), "{seen:?}");

    // A reload (SIGHUP, as `ExecReload=kill -HUP $MAINPID` sends): RELOADING=1 with the
    // monotonic time Type=notify-reload wants, then READY=1.
    d.signal("HUP").unwrap();
    let (socket, seen) = tokio::task::spawn_blocking(move || {
        let seen = messages_until(&socket, "READY=1", Duration::from_secs(30));
        (socket, seen)
    })
    .await
    .unwrap();
    let reloading = seen
        .iter()
        .position(|m| m.lines().any(|l| l == "RELOADING=1"))
        .unwrap_or_else(|| panic!("no RELOADING=1 before READY=1: {seen:?}"));
    assert!(
        seen[reloading].contains("MONOTONIC_USEC="),
        "{:?}",
        seen[reloading]
    );
    // Still serving after it.
    assert!(
        wait_until_async(Duration::from_secs(10), || async {
            status(admin).await.apps[0]
                .workers
                .iter()
                .all(|w| w.state == "ready")
        })
        .await
    );

    // SIGTERM: STOPPING=1, and drover exits cleanly.
    d.signal("TERM").unwrap();
    let seen = tokio::task::spawn_blocking(move || {
        messages_until(&socket, "STOPPING=1", Duration::from_secs(10))
    })
    .await
    .unwrap();
    assert!(!seen.is_empty());
    assert!(d
        .wait_exit(Duration::from_secs(20))
        .await
        .is_some_and(|s| s.success()));
}

/// The shipped units, as systemd reads them: no unknown key, no value it cannot parse,
/// and an `ExecStart` that names drover (here, the binary under test).
#[test]
fn the_example_units_verify_with_systemd_analyze() {
    if !has_systemd_tool("systemd-analyze") {
        return;
    }
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/systemd");
    let unit = std::fs::read_to_string(examples.join("drover.service")).unwrap();
    assert!(
        unit.contains("ExecStart=/usr/local/bin/drover up"),
        "{unit}"
    );
    let dir = temp_dir("systemd-unit");
    let local = unit
        .replace("/usr/local/bin/drover", &bin().display().to_string())
        .replace(
            "WorkingDirectory=/srv/app",
            &format!("WorkingDirectory={}", dir.display()),
        );
    let service = dir.join("drover.service");
    std::fs::write(&service, local).unwrap();
    // The socket unit activates the service of its own name, beside it.
    let socket = dir.join("drover.socket");
    std::fs::copy(examples.join("drover.socket"), &socket).unwrap();
    for path in [&service, &socket] {
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(path)
            .output()
            .unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "{}: {said}", path.display());
        assert!(
            said.trim().is_empty(),
            "systemd-analyze verify {}: {said}",
            path.display()
        );
    }
}

/// Whether `tool` runs here; a note, or under CI a failure (`scripts/test` installs
/// Debian's systemd, which has it), when it does not.
fn has_systemd_tool(tool: &str) -> bool {
    let found = Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("CI").is_none(),
            "{tool} is missing (scripts/test installs Debian's systemd)"
        );
        eprintln!("skipped: {tool} is missing (apt-get install systemd)");
    }
    found
}

/// `drover ...` as socket activation starts it: systemd-socket-activate listens on each
/// address and, at the first connection, execs drover with them as descriptors 3, 4, ...
/// named by `names` (`LISTEN_FDS`, `LISTEN_FDNAMES`), as systemd does for a unit with
/// `ListenStream=` and `FileDescriptorName=`.
async fn socket_activated(
    ports: &[u16],
    names: &str,
    drover: &[&str],
) -> drover_testkit::ChildProcess {
    let mut cmd = Command::new("systemd-socket-activate");
    for port in ports {
        cmd.arg("-l").arg(format!("127.0.0.1:{port}"));
    }
    cmd.arg(format!("--fdname={names}"))
        .arg("--")
        .arg(bin())
        .args(drover);
    spawn_ready_line(cmd, "Listening on ").await
}

#[tokio::test]
async fn drover_up_serves_the_sockets_systemd_passes_by_name_or_address() {
    if !has_systemd_tool("systemd-socket-activate") {
        return;
    }
    let dir = temp_dir("socket-activation");
    // A worker that shows what it holds: every descriptor, and the activation variables.
    let worker = dir.join("worker.js");
    std::fs::write(
        &worker,
        r#"const fs = require("fs");
require("http")
  .createServer((req, res) => {
    const fds = fs.readdirSync("/proc/self/fd").map((fd) => {
      try { return fs.readlinkSync(`/proc/self/fd/${fd}`); } catch { return ""; }
    });
    res.end(JSON.stringify({ fds, listenFds: process.env.LISTEN_FDS ?? null }));
  })
  .listen(Number(process.env.PORT), "127.0.0.1");
"#,
    )
    .unwrap();
    let backend = drover_testkit::Backend::start().await;
    let (front, admin, api) = (free_port(), free_port(), free_port());
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            r#"[admin]
listen = "127.0.0.1:{admin}"

[[app]]
name = "web"
command = ["node", "{worker}"]
workers = 2

[[balancer]]
name = "front"
listen = "127.0.0.1:{front}"
backends = ["app:web"]

[[balancer]]
name = "api"
listen = "127.0.0.1:{api}"
backends = ["{backend}"]
"#,
            worker = worker.display(),
            backend = backend.addr(),
        ),
    )
    .unwrap();
    // "front" and "admin" go by name; the third carries the unit's name, so it goes by
    // the address it is bound to.
    let d = socket_activated(
        &[front, admin, api],
        "front:admin:drover.socket",
        &["up", "-c", file.to_str().unwrap()],
    )
    .await;

    // The request that starts drover is answered: it waited in the passed socket's
    // backlog while drover started.
    let api_addr = std::net::SocketAddr::from(([127, 0, 0, 1], api));
    let mut client = HttpClient::connect(api_addr).await.unwrap();
    client.set_timeout(Duration::from_secs(20));
    let first = client.get("/").await;
    assert_eq!(first.status, 200, "{}", d.stderr_text());
    assert_eq!(backend.hits(), 1);
    let stderr = d.stderr_text();
    for line in [
        format!("balancer \"front\" serves the socket systemd passed as \"front\" (127.0.0.1:{front})"),
        format!("admin API serves the socket systemd passed as \"admin\" (127.0.0.1:{admin})"),
        format!("balancer \"api\" serves the socket systemd passed as \"drover.socket\" (127.0.0.1:{api})"),
    ] {
        assert!(stderr.contains(&line), "no {line:?} in\n{stderr}");
    }

    let admin = std::net::SocketAddr::from(([127, 0, 0, 1], admin));
    wait_all_serving(&d, admin).await;
    // The workers inherit neither the sockets nor the variables that name them.
    let passed: Vec<String> = (3..6)
        .map(|fd| {
            std::fs::read_link(format!("/proc/{}/fd/{fd}", d.pid()))
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    assert!(
        passed.iter().all(|l| l.starts_with("socket:")),
        "{passed:?}"
    );
    let front_addr = std::net::SocketAddr::from(([127, 0, 0, 1], front));
    for _ in 0..4 {
        let body: serde_json::Value = serde_json::from_str(
            &HttpClient::connect(front_addr)
                .await
                .unwrap()
                .get("/")
                .await
                .text(),
        )
        .unwrap();
        assert_eq!(body["listenFds"], serde_json::Value::Null, "{body}");
        let fds: Vec<String> = serde_json::from_value(body["fds"].clone()).unwrap();
        assert!(
            passed.iter().all(|p| !fds.contains(p)),
            "{fds:?} holds one of {passed:?}"
        );
    }

    // A reload keeps serving on the same sockets.
    let (code, out, err) = common::ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        HttpClient::connect(api_addr)
            .await
            .unwrap()
            .get("/")
            .await
            .status,
        200
    );
    common::stops_cleanly(d).await;
}

#[tokio::test]
async fn a_passed_socket_no_listener_takes_stops_the_start() {
    if !has_systemd_tool("systemd-socket-activate") {
        return;
    }
    let (stray, front) = (free_port(), free_port());
    let d = socket_activated(
        &[stray],
        "stray",
        &[
            "proxy",
            "--listen",
            &format!("127.0.0.1:{front}"),
            "--backend",
            "127.0.0.1:1",
        ],
    )
    .await;
    // The first connection starts drover, which refuses the socket and exits.
    let _ = std::net::TcpStream::connect(("127.0.0.1", stray)).unwrap();
    let status = d
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("drover exited");
    assert_eq!(status.code(), Some(2), "{}", d.stderr_text());
    let want = format!(
        "systemd passed a socket named \"stray\" on 127.0.0.1:{stray}, but no balancer is named \"stray\" and no listen address is 127.0.0.1:{stray}"
    );
    assert!(d.stderr_text().contains(&want), "{}", d.stderr_text());
}

/// `drover check -c file`: its exit code and what it printed (stdout, then stderr).
fn check(file: &std::path::Path) -> (Option<i32>, String) {
    let out = Command::new(bin())
        .args(["check", "-c", file.to_str().unwrap()])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code(), text)
}

#[tokio::test]
async fn drover_check_takes_an_address_systemd_holds_for_socket_activation_as_free() {
    if !has_systemd_tool("systemd-socket-activate") {
        return;
    }
    let dir = temp_dir("check-activation");
    let (front, api) = (free_port(), free_port());
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        format!(
            "[[balancer]]\nname = \"front\"\nlisten = \"127.0.0.1:{front}\"\nbackends = [\"127.0.0.1:1\"]\n\n[[balancer]]\nname = \"api\"\nlisten = \"127.0.0.1:{api}\"\nbackends = [\"127.0.0.1:1\"]\n"
        ),
    )
    .unwrap();
    // systemd holds "front" for drover, which has not started (no connection came).
    let activator =
        socket_activated(&[front], "front", &["up", "-c", file.to_str().unwrap()]).await;
    // Another program holds "api": that one is in use.
    let other = std::net::TcpListener::bind(("127.0.0.1", api)).unwrap();
    let (code, out) = check(&file);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains(&format!(
            "balancer \"api\": cannot listen on 127.0.0.1:{api}"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!("pid {})", std::process::id())),
        "names the holder: {out}"
    );
    assert!(!out.contains(&format!("127.0.0.1:{front}: ")), "{out}");
    drop(other);
    let (code, out) = check(&file);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains(&format!(
            "held by systemd for socket activation, drover takes them when it starts: balancer \"front\" on 127.0.0.1:{front} (by systemd-socket-, pid {})",
            activator.pid()
        )),
        "{out}"
    );
    // drover never started: the check took nothing from systemd.
    assert!(
        !activator.stderr_text().contains("drover: balancer"),
        "{}",
        activator.stderr_text()
    );

    // The check started by socket activation itself, with the sockets (LISTEN_FDS).
    drop(activator);
    let checked =
        socket_activated(&[front], "front", &["check", "-c", file.to_str().unwrap()]).await;
    let _ = std::net::TcpStream::connect(("127.0.0.1", front)).unwrap();
    let status = checked
        .wait_exit(Duration::from_secs(10))
        .await
        .expect("the check exited");
    // The output's readers may lag the exit (a CI run once saw none of it).
    let _ = checked
        .wait_for_line("LISTEN_FDS", Duration::from_secs(5))
        .await;
    let out = checked.stdout_text() + &checked.stderr_text();
    assert_eq!(status.code(), Some(0), "{status:?}\n{out}");
    assert!(
        out.contains(&format!(
            "balancer \"front\" on 127.0.0.1:{front} (passed to this check, LISTEN_FDS)"
        )),
        "{out}"
    );
}
