//! Shared helpers: a real Python HTTP worker, an app spec with test-sized timings, and
//! polling with a deadline (every wait in these tests is bounded).

#![allow(dead_code)] // each test binary uses a different subset

use drover_registry::{Pool, PoolOptions};
use drover_supervisor::{AppSpec, Backoff, LineSink, LogLine, Stream};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A single-threaded http.server worker. It prints a line to each pipe at start,
/// answers `/health` with "ok" and anything else with JSON describing itself.
/// With `HANG_FLAG=path`, the first process to start (the one that creates the file)
/// hangs forever in its second `/health` request: a hung event loop, in effect.
/// With `IGNORE_TERM=1` it ignores SIGTERM, so only SIGKILL stops it.
const SERVER_PY: &str = r#"
import json, os, signal, socket, sys, time
from http.server import HTTPServer, BaseHTTPRequestHandler

shared = os.environ.get("LISTEN_FDS") == "1"
port = None if shared else int(os.environ["PORT"])
wid = os.environ.get("DROVER_WORKER_ID")
app = os.environ.get("DROVER_APP")
if os.environ.get("IGNORE_TERM"):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
hang = False
flag = os.environ.get("HANG_FLAG")
if flag and not os.path.exists(flag):
    open(flag, "w").close()
    hang = True
health_calls = 0

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        global health_calls
        if self.path == "/health":
            health_calls += 1
            if hang and health_calls > 1:
                time.sleep(3600)
            body = b"ok"
        else:
            if self.path == "/slow":
                time.sleep(0.2)
            body = json.dumps({"port": port, "worker": wid, "app": app,
                               "pid": os.getpid(), "extra": os.environ.get("EXTRA"),
                               "listen_pid": os.environ.get("LISTEN_PID")}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

print(f"hello from worker {wid}", flush=True)
print(f"stderr from worker {wid}", file=sys.stderr, flush=True)
if shared:
    # systemd's convention: the listening socket is fd 3.
    server = HTTPServer(("127.0.0.1", 0), Handler, bind_and_activate=False)
    server.socket.close()
    server.socket = socket.socket(fileno=3)
else:
    server = HTTPServer(("127.0.0.1", port), Handler)
server.serve_forever()
"#;

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
    let path = temp_dir().join("server.py");
    std::fs::write(&path, SERVER_PY).unwrap();
    path
}

/// An app running the Python worker, with back-offs and timeouts sized for tests.
pub fn python_app(name: &str, workers: usize) -> AppSpec {
    let script = server_script();
    let mut spec = AppSpec::new(
        name,
        vec!["python3".into(), script.to_string_lossy().into_owned()],
    );
    spec.workers = workers;
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
    let sink: LineSink = Arc::new(move |line: LogLine<'_>| {
        keep.lock().unwrap().push((line.stream, line.to_string()));
    });
    (sink, lines)
}
