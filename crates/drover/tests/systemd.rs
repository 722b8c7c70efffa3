//! systemd's notify protocol, spoken by `drover up` to a `NOTIFY_SOCKET` this test listens
//! on, as systemd does for a `Type=notify` service with `WatchdogSec=`: READY=1 once the
//! workers serve (not before), WATCHDOG=1 while it runs, RELOADING=1 and READY=1 around a
//! reload, STOPPING=1 on SIGTERM. The workers never see the socket.
//!
//! This machine (a container) runs no systemd to start drover under, so the test plays
//! systemd's part of the protocol itself; `examples/systemd/drover.service` is the unit.

mod common;

use common::{admin_addr, bin, status, temp_dir};
use drover_testkit::{spawn_ready_line, wait_until_async, HttpClient};
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

/// The shipped unit, as systemd reads it: no unknown key, no value it cannot parse, and
/// an `ExecStart` that names drover (here, the binary under test).
#[test]
fn the_example_unit_verifies_with_systemd_analyze() {
    let has_analyze = Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_analyze {
        assert!(
            std::env::var_os("CI").is_none(),
            "systemd-analyze is missing (scripts/test installs Debian's systemd)"
        );
        eprintln!("skipped: systemd-analyze is missing (apt-get install systemd)");
        return;
    }
    let unit = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples/systemd/drover.service"),
    )
    .unwrap();
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
    let path = dir.join("drover.service");
    std::fs::write(&path, local).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(said.trim().is_empty(), "systemd-analyze verify: {said}");
}
