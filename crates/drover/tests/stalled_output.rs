//! A stderr nobody reads: a terminal paused with Ctrl-S, a log shipper or a container's
//! log driver that fell behind. It must cost drover lines of output, never service.
//! Before, the write that found the pipe full blocked a runtime thread for good, and
//! every task behind it: requests, restarts, the admin API.

mod common;

use common::{bin, metrics_text, status, temp_dir};
use drover_testkit::HttpClient;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{ChildStderr, Command};

/// Reads `stderr` up to the listen and admin lines of `drover run`; the rest stays
/// unread in the pipe.
async fn addresses(stderr: &mut BufReader<ChildStderr>) -> (SocketAddr, SocketAddr) {
    let (mut listen, mut admin) = (None, None);
    let mut seen = String::new();
    while listen.is_none() || admin.is_none() {
        let mut line = String::new();
        let n = tokio::time::timeout(Duration::from_secs(20), stderr.read_line(&mut line))
            .await
            .unwrap_or_else(|_| panic!("no addresses in 20 s: {seen}"))
            .unwrap();
        assert!(n > 0, "drover ended: {seen}");
        let addr = |after: &str| -> Option<SocketAddr> {
            let rest = line.split(after).nth(1)?;
            rest.split_whitespace().next()?.parse().ok()
        };
        if line.contains("balancer") {
            listen = listen.or(addr("listening on "));
        }
        if line.contains("admin API") {
            admin = admin.or(addr("listening on "));
        }
        seen.push_str(&line);
    }
    (listen.unwrap(), admin.unwrap())
}

/// A worker that writes an 8 KB line per request (2,000 requests: 16 MB, past both
/// the pipe's 64 KiB and drover's 8 MiB of spool), under `drover run -w 2` whose
/// stderr nothing reads. Every request is answered, a killed worker is replaced, the
/// admin API answers; once the pipe is read again, drover says how many lines it
/// dropped, and `/metrics` counts them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stderr_nobody_reads_costs_lines_not_service() {
    let dir = temp_dir("stalled-stderr");
    let app = dir.join("app.js");
    std::fs::write(
        &app,
        "require('http').createServer((q, s) => { console.log('GET', q.url, 'x'.repeat(8000)); \
         s.end('ok ' + process.pid); }).listen(process.env.PORT);",
    )
    .unwrap();
    let mut child = Command::new(bin())
        .args([
            "run",
            "-w",
            "2",
            "-l",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
        ])
        .args(["--", "node", app.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let (listen, admin) = addresses(&mut stderr).await;

    let load = |n: usize| async move {
        let mut c = HttpClient::connect(listen).await.unwrap();
        c.set_timeout(Duration::from_secs(5));
        let mut answered = 0;
        for _ in 0..n {
            match c.request("GET", "/", &[], None).await {
                Ok(r) if r.status == 200 => answered += 1,
                _ => break,
            }
        }
        answered
    };
    let (a, b) = tokio::join!(load(1000), load(1000));
    assert_eq!(
        a + b,
        2000,
        "requests went unanswered while stderr was full"
    );

    // Supervision goes on: a killed worker is replaced.
    let first = status(admin).await.apps[0].workers[0].pid.unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-9", &first.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut replaced = false;
    for _ in 0..200 {
        let w = &status(admin).await.apps[0].workers[0];
        if w.state == "ready" && w.pid.is_some_and(|p| p != first) {
            replaced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(replaced, "worker 0 was not replaced while stderr was full");

    // The reader comes back: what was kept comes out, then a line on what was not.
    let mut out = Vec::new();
    let mut chunk = vec![0; 1 << 20];
    let mut noticed = false;
    for _ in 0..100 {
        // Each answer logs a line, and the notice goes out with the first that fits.
        assert_eq!(load(1).await, 1);
        while let Ok(Ok(n)) =
            tokio::time::timeout(Duration::from_millis(100), stderr.read(&mut chunk)).await
        {
            if n == 0 {
                break;
            }
            out.extend_from_slice(&chunk[..n]);
        }
        let text = String::from_utf8_lossy(&out);
        if text.contains("lines of output dropped: nothing read drover's stderr for a while") {
            noticed = true;
            break;
        }
    }
    assert!(noticed, "no notice of dropped lines in {} bytes", out.len());
    let metrics = metrics_text(admin).await;
    let dropped: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("drover_stderr_dropped_lines_total "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no drover_stderr_dropped_lines_total in {metrics}"));
    assert!(dropped > 0, "{metrics}");
    child.start_kill().unwrap();
    let _ = child.wait().await;
}
