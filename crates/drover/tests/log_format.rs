//! `--log-format json` (`DROVER_LOG_FORMAT=json`): every line drover writes to stderr,
//! its messages, its log records and its workers' output, is one JSON object with a
//! timestamp; a worker's line says its app, worker and stream.

mod common;

use common::examples::clean_env;
use common::{addrs, admin_addr, backends, bin, wait_all_serving};
use drover_testkit::{spawn_ready_line, HttpClient};
use std::process::Command;
use std::time::Duration;

/// A Node app that says one line on each stream (the stderr one with a colour code)
/// and exits with status 3 on `/crash`.
const APP: &str = "const http = require('http');
console.log('out ' + process.env.NODE_APP_INSTANCE);
console.error('err \\x1b[31mred\\x1b[0m');
http.createServer((req, res) => {
  if (req.url === '/crash') process.exit(3);
  res.end('ok');
}).listen(process.env.PORT);";

/// Every stderr line of a finished drover as JSON; panics naming a line that is not an
/// object with a timestamp.
fn json_lines(stderr: &str) -> Vec<serde_json::Value> {
    stderr
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {l}\n--- stderr:\n{stderr}"));
            let at = v["timestamp"]
                .as_str()
                .unwrap_or_else(|| panic!("no timestamp: {l}"));
            assert!(at.ends_with('Z') && at.contains('T'), "{l}");
            v
        })
        .collect()
}

#[tokio::test]
async fn every_line_of_drover_run_is_a_json_object() {
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-w", "2", "--log-format", "json"])
        .args("-l 127.0.0.1:0 --admin 127.0.0.1:0 --threads 1 -- node -e".split(' '))
        .arg(APP);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    assert_eq!(c.get("/").await.status, 200);
    // A worker that crashes: drover's log record of it (a WARN with its fields).
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let _ = c.request("GET", "/crash", &[], None).await;
    assert!(
        d.wait_for_line("exited", Duration::from_secs(10))
            .await
            .is_some(),
        "{}",
        d.stderr_text()
    );
    d.signal("TERM").unwrap();
    assert!(d.wait_exit(Duration::from_secs(30)).await.is_some());
    let lines = json_lines(&d.stderr_text());

    let worker_says = |stream: &str, message: &str| {
        lines.iter().any(|v| {
            v["stream"] == stream
                && v["message"] == message
                && v["app"].as_str().is_some_and(|a| !a.is_empty())
                && v["worker"].as_u64().is_some()
                && v.get("level").is_none()
        })
    };
    assert!(
        worker_says("stdout", "out 0") && worker_says("stdout", "out 1"),
        "{lines:#?}"
    );
    assert!(
        worker_says("stderr", "err \u{1b}[31mred\u{1b}[0m"),
        "{lines:#?}"
    );
    let message = |level: &str, part: &str| {
        lines.iter().any(|v| {
            v["level"] == level
                && v["message"].as_str().is_some_and(|m| m.contains(part))
                && v.get("stream").is_none()
        })
    };
    assert!(message("INFO", "listening on 127.0.0.1:"), "{lines:#?}");
    assert!(message("INFO", "stopped"), "{lines:#?}");
    // tracing's records keep their level, fields and target.
    assert!(
        lines
            .iter()
            .any(|v| v["level"] == "WARN" && v["target"].as_str().is_some()),
        "{lines:#?}"
    );
}

/// The environment's `DROVER_LOG_FORMAT` does the same, for `drover proxy` too.
#[tokio::test]
async fn drover_log_format_in_the_environment_is_the_flag() {
    let b = backends(1).await;
    let mut cmd = Command::new(bin());
    cmd.args(["proxy", "--listen", "127.0.0.1:0", "--backend"])
        .arg(addrs(&b)[0].to_string())
        .env("DROVER_LOG_FORMAT", "json");
    let d = spawn_ready_line(cmd, "listening on ").await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    assert_eq!(c.get("/").await.status, 200);
    d.signal("TERM").unwrap();
    assert!(d.wait_exit(Duration::from_secs(30)).await.is_some());
    let lines = json_lines(&d.stderr_text());
    assert!(
        lines.iter().any(|v| v["level"] == "INFO"
            && v["message"]
                .as_str()
                .is_some_and(|m| m.contains("listening on"))),
        "{lines:#?}"
    );
}
