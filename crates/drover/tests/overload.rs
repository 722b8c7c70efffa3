//! Past capacity, the way the third post measures it: npm `loadtest` sends requests at a
//! fixed rate above what two CPU-bound workers of `drover run` can serve, one new
//! connection per request. By default every request waits its turn (as under Node's
//! cluster module or PM2) and none is refused; a user who asks for a bounded queue
//! gets clean 503s with `Retry-After` and `drover-error: queue-full`, and the log says
//! so once a second, not once per request.

mod common;

use common::bin;
use drover_testkit::{DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Requests per run and the rate they are sent at. Each costs its worker 4 ms of CPU,
/// so two workers serve at most ~500 a second on two free cores: 1,000 a second is past
/// capacity on any machine, by more than the 1,024 waiting requests drover once refused
/// beyond, and the 12 s of CPU they need are served well inside the 30 s queue timeout.
const REQUESTS: u32 = 3000;
const RATE: u32 = 1000;

fn fixture(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(rel)
}

/// `drover run -w 2 -t 1` of the CPU-bound fixture worker, plus `extra` flags.
async fn run_workers(extra: &[&str]) -> DroverProcess {
    let script = fixture("saturation/server.js").display().to_string();
    let mut args = vec!["run", "-w", "2", "-t", "1", "-l", "127.0.0.1:0"];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "node", &script]);
    let d = DroverProcess::spawn(bin(), &args).await;
    // Both workers answer before the load starts. A new connection per request: a lone
    // keep-alive connection goes to a worker of its own after two (`auto`).
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..200 {
        let mut c = HttpClient::connect(d.addr()).await.unwrap();
        let r = c.get("/cpu?ms=0").await;
        seen.insert(r.header("x-worker").unwrap_or("").to_owned());
        if seen.len() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(seen.len(), 2, "both workers should be serving");
    d
}

/// What loadtest reported: (completed requests, errors). loadtest's CLI counts any
/// status >= 400 as an error and shows it as `-1` (it keeps no status without a
/// status callback), so an error here is a 503 or a failed connection alike.
struct Report {
    completed: u64,
    errors: u64,
    text: String,
}

async fn loadtest(addr: SocketAddr) -> Report {
    let bin = fixture("loadtest/node_modules/.bin/loadtest");
    assert!(
        bin.exists(),
        "{} is missing: run `npm ci --prefix crates/drover/tests/fixtures/loadtest` (scripts/test does)",
        bin.display()
    );
    let out = tokio::process::Command::new(bin)
        .args([
            "-n",
            &REQUESTS.to_string(),
            "--rps",
            &RATE.to_string(),
            &format!("http://{addr}/cpu?ms=4"),
        ])
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(120), out)
        .await
        .expect("loadtest ran past 120 s")
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let field = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name:?} in loadtest's output:\n{text}"))
    };
    Report {
        completed: field("Completed requests:"),
        errors: field("Total errors:"),
        text,
    }
}

/// One test, two runs in turn: run side by side they would share the cores.
#[tokio::test]
async fn past_capacity_requests_wait_by_default_and_are_shed_only_when_asked() {
    every_request_waits_its_turn_by_default().await;
    a_bounded_queue_sheds_with_clean_503s_and_few_log_lines().await;
}

async fn every_request_waits_its_turn_by_default() {
    let d = run_workers(&[]).await;
    let r = loadtest(d.addr()).await;
    assert_eq!(r.completed, u64::from(REQUESTS), "{}", r.text);
    assert_eq!(r.errors, 0, "requests were refused:\n{}", r.text);
    // Past capacity is not a backend failure: nothing was ejected on the way. (A connect
    // that failed names its ejection, `ejected_for=None` when there was none: CI once
    // saw one connect to a worker time out at this load, with nothing ejected.)
    assert!(
        d.lines_containing("ejected for").is_empty(),
        "{}",
        d.stderr_text()
    );
}

async fn a_bounded_queue_sheds_with_clean_503s_and_few_log_lines() {
    let d = run_workers(&["--queue-max", "4"]).await;
    let addr = d.addr();
    let load = tokio::spawn(async move { loadtest(addr).await });

    // Beside the load, ask until the queue turns one away, and read the answer whole.
    let mut refused = None;
    for _ in 0..400 {
        let mut c = HttpClient::connect(addr).await.unwrap();
        let r = c.request("GET", "/cpu?ms=4", &[], None).await.unwrap();
        if r.status == 503 {
            refused = Some(r);
            break;
        }
    }
    let report = load.await.unwrap();
    let r = refused.expect("a queue of 4 past capacity never refused a request");
    assert_eq!(r.header("drover-error"), Some("queue-full"));
    assert_eq!(r.header("retry-after"), Some("1"));
    assert!(r.text().contains("queue is full"), "{}", r.text());

    assert!(
        report.errors >= 20,
        "a queue of 4 past capacity should refuse many: {}",
        report.text
    );
    // One warning a second, each with the count it stands for.
    let warnings = d.lines_containing("queue is full");
    assert!(
        !warnings.is_empty() && (warnings.len() as u64) < report.errors / 4,
        "{} warnings for {} refusals",
        warnings.len(),
        report.errors
    );
    assert!(
        warnings.iter().any(|l| l.contains("held_back")),
        "{warnings:?}"
    );
}
