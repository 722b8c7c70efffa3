//! Shared helpers: a real Python HTTP worker, an app spec with test-sized timings, and
//! polling with a deadline (every wait in these tests is bounded).

#![allow(dead_code)] // each test binary uses a different subset

use drover_registry::{Pool, PoolOptions};
use drover_supervisor::{AppSpec, Backoff, LineSink, LogLine, Stream, Workers};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A fresh directory under cargo's `target/tmp` (not /tmp, so runs leave nothing
/// behind outside the build directory), unique per call.
pub fn temp_dir() -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "drover-supervisor-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes the Python worker into a fresh temp dir and returns its path.
pub fn server_script() -> PathBuf {
    drover_testkit::write_py_worker(&temp_dir())
}

/// An app running the Python worker, with back-offs and timeouts sized for tests.
pub fn python_app(name: &str, workers: usize) -> AppSpec {
    let script = server_script();
    let mut spec = AppSpec::new(
        name,
        vec!["python3".into(), script.to_string_lossy().into_owned()],
    );
    spec.workers = Workers::Count(workers);
    spec.ready_timeout = Duration::from_secs(10);
    spec.stop_timeout = Duration::from_secs(2);
    spec.restart = fast_backoff();
    spec
}

pub fn fast_backoff() -> Backoff {
    Backoff {
        initial: Duration::from_millis(50),
        max: Duration::from_secs(2),
        factor: 2.0,
        min_uptime: Duration::from_millis(500),
        crash_loop_after: 3,
        max_restarts: None,
    }
}

pub fn pool(name: &str) -> Arc<Pool> {
    Arc::new(Pool::new(name, &[], PoolOptions::default()))
}

pub fn pool_addrs(pool: &Pool) -> Vec<SocketAddr> {
    let mut addrs: Vec<SocketAddr> = pool.endpoints().iter().map(|e| e.addr()).collect();
    addrs.sort();
    addrs
}

/// Polls `cond` every 10 ms until it holds or `within` passes; true if it held.
pub async fn eventually(within: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// `GET path` over a fresh connection; returns the body.
pub async fn get(addr: SocketAddr, path: &str) -> String {
    let fetch = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut resp = String::new();
        s.read_to_string(&mut resp).await.unwrap();
        resp
    };
    let resp = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .expect("GET timed out");
    let (head, body) = resp.split_once("\r\n\r\n").expect("no header end");
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_string()
}

/// True while a process with this pid exists (zombies included: /proc keeps them).
pub fn process_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

pub fn kill9(pid: u32) {
    let ok = std::process::Command::new("kill")
        .args(["-9", &pid.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill -9 {pid} failed");
}

/// Output lines kept by `collecting_sink`, as `(stream, "[app/ID] text")`.
pub type Lines = Arc<Mutex<Vec<(Stream, String)>>>;

/// A sink that keeps every output line.
pub fn collecting_sink() -> (LineSink, Lines) {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&lines);
    let sink: LineSink = Arc::new(move |lines: &[LogLine<'_>]| {
        let mut keep = keep.lock().unwrap();
        keep.extend(lines.iter().map(|line| (line.stream, line.to_string())));
    });
    (sink, lines)
}
