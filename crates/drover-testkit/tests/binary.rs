//! The testkit-backend binary as a separate process.

use drover_testkit::{spawn_ready_line, ChildProcess, HttpClient};
use std::process::Command;
use std::time::Duration;

const BIN: &str = env!("CARGO_BIN_EXE_testkit-backend");

#[tokio::test]
async fn binary_starts_answers_and_dies_on_kill() {
    let mut cmd = Command::new(BIN);
    cmd.args(["--listen", "127.0.0.1:0", "--name", "p1"]);
    let p = spawn_ready_line(cmd, "listening on ").await;
    assert_eq!(p.stdout_text().lines().count(), 1, "exactly one ready line");

    let mut c = HttpClient::connect(p.addr()).await.unwrap();
    let r = c.get("/").await;
    assert_eq!((r.status, r.text().as_str()), (200, "p1"));

    p.signal("KILL").unwrap();
    assert!(p.wait_exit(Duration::from_secs(5)).await.is_some());
    assert!(c.request("GET", "/", &[], None).await.is_err());
}

#[tokio::test]
async fn spawn_uses_listening_marker() {
    let p = ChildProcess::spawn(BIN.as_ref(), &["--name", "p2"]).await;
    let mut c = HttpClient::connect(p.addr()).await.unwrap();
    assert_eq!(c.get("/").await.text(), "p2");
}

#[tokio::test]
async fn bad_flag_exits_2_naming_the_flag() {
    for (args, flag) in [
        (&["--listen", "nope"][..], "--listen"),
        (&["--frobnicate"][..], "--frobnicate"),
        (&["--name"][..], "--name"),
    ] {
        let out = Command::new(BIN).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

#[tokio::test]
async fn helper_finds_the_binary() {
    // The integration-test binary lives in target/<profile>/deps, like the
    // drover crate's tests that will use this helper.
    assert_eq!(
        drover_testkit::testkit_backend_bin(),
        std::path::PathBuf::from(BIN)
    );
}

const TCP_BIN: &str = env!("CARGO_BIN_EXE_testkit-tcp");

/// The one JSON line a testkit-tcp load run prints, as (field, number) pairs.
fn tcp_run(args: &[&str]) -> Vec<(String, f64)> {
    let out = Command::new(TCP_BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = String::from_utf8(out.stdout).unwrap();
    line.trim()
        .trim_matches(|c| c == '{' || c == '}')
        .split(',')
        .map(|kv| {
            let (k, v) = kv.split_once(':').unwrap();
            (k.trim_matches('"').to_string(), v.parse().unwrap())
        })
        .collect()
}

fn field(run: &[(String, f64)], name: &str) -> f64 {
    run.iter().find(|(k, _)| k == name).unwrap().1
}

#[tokio::test]
async fn testkit_tcp_serves_bulk_and_short_connections() {
    let mut cmd = Command::new(TCP_BIN);
    cmd.args(["serve", "127.0.0.1:0"]);
    let p = spawn_ready_line(cmd, "listening on ").await;
    let addr = p.addr().to_string();
    // Every byte asked for, over the connections asked for (whole multiples only).
    let bulk = tcp_run(&["bulk", &addr, "4", "4000000"]);
    assert_eq!(field(&bulk, "bytes"), 4_000_000.0);
    let short = tcp_run(&["short", &addr, "4", "1"]);
    assert!(field(&short, "connections") > 0.0, "{short:?}");
    assert_eq!(field(&short, "errors"), 0.0);
    p.signal("KILL").unwrap();
}
