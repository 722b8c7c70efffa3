//! Child-process harness: start a binary, wait for its "listening on ADDR"
//! line, keep its output drained, signal it, and never leave it running.

use std::future::Future;
use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::time::{sleep, Instant};

/// How long a process gets to print its ready line.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Poll period for readiness, exit and `wait_until`.
const POLL: Duration = Duration::from_millis(10);

/// The drover binary under test is just a child process with a ready line.
pub type DroverProcess = ChildProcess;

/// A running child whose stdout and stderr are drained into buffers by
/// background threads (so a chatty child never blocks on a full pipe).
/// The child runs in its own process group; on drop the whole group gets
/// SIGKILL (workers a supervisor started included) and the child is reaped.
pub struct ChildProcess {
    child: Mutex<Child>,
    pid: u32,
    addr: SocketAddr,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Copies a pipe into `buf` line by line until EOF, on its own thread so it
/// works whatever runtime (or none) the test uses.
fn drain(pipe: impl Read + Send + 'static, buf: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        while let Ok(n) = reader.read_until(b'\n', &mut line) {
            if n == 0 {
                break;
            }
            lock(&buf).push_str(&String::from_utf8_lossy(&line));
            line.clear();
        }
    });
}

/// The first whitespace-delimited token after `marker` on any line of
/// `text` that parses as a socket address (quotes, commas and a JSON line's closing
/// brace trimmed).
pub fn addr_after(text: &str, marker: &str) -> Option<SocketAddr> {
    addrs_after(text, marker).into_iter().next()
}

/// Every such address, in order of appearance.
pub fn addrs_after(text: &str, marker: &str) -> Vec<SocketAddr> {
    text.lines()
        .filter_map(|line| {
            let rest = &line[line.find(marker)? + marker.len()..];
            let token = rest.split_whitespace().next()?;
            token
                .trim_matches(|c: char| matches!(c, '"' | '\'' | ',' | ';' | '.' | '(' | ')' | '}'))
                .parse()
                .ok()
        })
        .collect()
}

impl ChildProcess {
    /// Starts `bin args...` and waits (10 s at most) for a line containing
    /// `listening on ADDR`; panics with the captured output otherwise.
    pub async fn spawn(bin: &Path, args: &[&str]) -> ChildProcess {
        let mut cmd = Command::new(bin);
        cmd.args(args);
        spawn_ready_line(cmd, "listening on ").await
    }

    /// The address from the ready line.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Everything the child wrote to stderr so far.
    pub fn stderr_text(&self) -> String {
        lock(&self.stderr).clone()
    }

    /// Everything the child wrote to stdout so far.
    pub fn stdout_text(&self) -> String {
        lock(&self.stdout).clone()
    }

    /// Lines of stdout and stderr (stdout first) that contain `needle`.
    pub fn lines_containing(&self, needle: &str) -> Vec<String> {
        let text = format!("{}{}", self.stdout_text(), self.stderr_text());
        text.lines()
            .filter(|l| l.contains(needle))
            .map(str::to_string)
            .collect()
    }

    /// Waits for an output line (either stream) containing `needle`.
    pub async fn wait_for_line(&self, needle: &str, limit: Duration) -> Option<String> {
        let mut found = None;
        wait_until(limit, || {
            found = self.lines_containing(needle).into_iter().next();
            found.is_some()
        })
        .await;
        found
    }

    /// Every address printed after `marker` so far (e.g. "listening on "
    /// for each balancer and the admin API).
    pub fn addrs_after(&self, marker: &str) -> Vec<SocketAddr> {
        let text = format!("{}{}", self.stdout_text(), self.stderr_text());
        addrs_after(&text, marker)
    }

    /// Sends a signal by name ("TERM", "HUP", "SIGINT", "KILL", ...) with
    /// the `kill` command, since the crate forbids unsafe (no libc calls).
    pub fn signal(&self, sig: &str) -> std::io::Result<()> {
        let sig = sig.trim_start_matches("SIG");
        let status = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid.to_string())
            .stderr(Stdio::null())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!(
                "kill -{sig} {} failed: {status}",
                self.pid
            )))
        }
    }

    /// SIGKILL to the child only (not its group), like `kill -9 PID`.
    pub fn kill(&self) {
        let _ = lock(&self.child).kill();
    }

    /// SIGKILL to the child's whole process group (it and its workers).
    pub fn kill_group(&self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.pid)])
            .stderr(Stdio::null())
            .status();
    }

    /// The exit status if the child exits within `limit`.
    pub async fn wait_exit(&self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = lock(&self.child).try_wait() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            sleep(POLL).await;
        }
    }

    /// `Some(status)` if the child has exited already.
    pub fn try_exit_status(&self) -> Option<ExitStatus> {
        lock(&self.child).try_wait().ok().flatten()
    }
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        // The group first, while the child's pid is still ours (unreaped),
        // so the group id cannot have been reused.
        self.kill_group();
        let mut child = lock(&self.child);
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Starts `cmd` (stdin null, stdout and stderr captured, own process
/// group) and waits up to 10 s for an output line on either stream that
/// contains `marker` followed by a socket address. Panics with all
/// captured output if the line never comes or the process exits first.
pub async fn spawn_ready_line(cmd: Command, marker: &str) -> ChildProcess {
    spawn_ready_line_within(cmd, marker, READY_TIMEOUT).await
}

/// [`spawn_ready_line`], waiting up to `timeout`: for a program that builds
/// its app before it listens.
pub async fn spawn_ready_line_within(
    mut cmd: Command,
    marker: &str,
    timeout: Duration,
) -> ChildProcess {
    let program = format!("{:?}", cmd.get_program());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    let stdout = Arc::new(Mutex::new(String::new()));
    let stderr = Arc::new(Mutex::new(String::new()));
    if let Some(pipe) = child.stdout.take() {
        drain(pipe, stdout.clone());
    }
    if let Some(pipe) = child.stderr.take() {
        drain(pipe, stderr.clone());
    }
    let mut process = ChildProcess {
        pid: child.id(),
        child: Mutex::new(child),
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        stdout,
        stderr,
    };
    let deadline = Instant::now() + timeout;
    loop {
        let text = format!("{}{}", process.stdout_text(), process.stderr_text());
        if let Some(addr) = addr_after(&text, marker) {
            process.addr = addr;
            return process;
        }
        let exited = process.try_exit_status();
        if exited.is_some() || Instant::now() >= deadline {
            // Give the drain threads a moment to copy the last lines.
            sleep(Duration::from_millis(100)).await;
            let why = match exited {
                Some(status) => format!("exited ({status})"),
                None => format!("printed no {marker:?}ADDR line within {timeout:?}"),
            };
            panic!(
                "{program} {why}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                process.stdout_text(),
                process.stderr_text()
            );
        }
        sleep(POLL).await;
    }
}

/// Polls `cond` every 10 ms until it holds (true) or `limit` passes
/// (false). Sleeps asynchronously so in-process backends keep serving.
pub async fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(POLL).await;
    }
}

/// [`wait_until`] for a condition that must itself do I/O, e.g. a request.
pub async fn wait_until_async<F, Fut>(limit: Duration, mut cond: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if tokio::time::timeout_at(deadline, cond()).await == Ok(true) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(POLL).await;
    }
}

/// Path of the `testkit-backend` binary next to the running test binary
/// (`target/<profile>/`). Cargo does not build a dependency's binaries for
/// another crate's tests, so the first call in a process runs
/// `cargo build -p drover-testkit --bin testkit-backend` (a no-op when up to
/// date; `cargo test` holds no build lock while tests run). Without `CARGO`
/// in the environment (test binary run by hand) an existing binary is used.
pub fn testkit_backend_bin() -> PathBuf {
    static BUILT: Mutex<bool> = Mutex::new(false);
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<test> -> target/<profile>
    let profile_dir = exe
        .parent()
        .and_then(|dir| {
            if dir.ends_with("deps") {
                dir.parent()
            } else {
                Some(dir)
            }
        })
        .expect("test binary has a parent directory")
        .to_path_buf();
    let bin = profile_dir.join("testkit-backend");
    let mut built = lock(&BUILT);
    let cargo = std::env::var("CARGO").ok();
    if !*built && (cargo.is_some() || !bin.exists()) {
        let profile = match profile_dir.file_name().and_then(|n| n.to_str()) {
            Some("debug") | None => "dev".to_string(),
            Some(other) => other.to_string(),
        };
        let status = Command::new(cargo.unwrap_or_else(|| "cargo".into()))
            .args([
                "build",
                "-q",
                "-p",
                "drover-testkit",
                "--bin",
                "testkit-backend",
            ])
            .args(["--profile", &profile])
            .status()
            .expect("run cargo build for testkit-backend");
        assert!(
            status.success(),
            "building testkit-backend failed: {status}"
        );
        *built = true;
    }
    assert!(
        bin.exists(),
        "testkit-backend not found at {}",
        bin.display()
    );
    bin
}

/// Starts the `testkit-backend` binary as its own process (for `kill -9`
/// tests) on 127.0.0.1:0 and waits for its ready line.
pub async fn spawn_backend_process(name: &str) -> ChildProcess {
    spawn_backend_process_on(name, SocketAddr::from(([127, 0, 0, 1], 0))).await
}

/// Same on a chosen address (e.g. the port of one that was killed).
pub async fn spawn_backend_process_on(name: &str, addr: SocketAddr) -> ChildProcess {
    let mut cmd = Command::new(testkit_backend_bin());
    cmd.args(["--listen", &addr.to_string(), "--name", name]);
    spawn_ready_line(cmd, "listening on ").await
}

/// A TCP port that is free now on every address (bound, then let go), never the same
/// one twice in this process: for peers that take no port 0 (systemd-socket-activate,
/// a config written before its server starts, an app that listens on a port of its
/// own).
///
/// Drawn at random below Linux's ephemeral range (32768-60999 by default), where
/// neither `bind(0)` nor an outgoing connection takes ports: a port from `bind(0)`
/// could be taken by any other process's connection before the peer binds it, and
/// the tests open thousands. Below drover's own range for its workers' ports
/// (drover-supervisor's `WORKER_PORTS`) too, so the drovers under test never take one.
pub fn free_port() -> u16 {
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    const RANGE: std::ops::Range<u16> = 10_000..20_000;
    use std::hash::{BuildHasher, Hasher};
    for _ in 0..1000 {
        let mut draw = std::collections::hash_map::RandomState::new().build_hasher();
        draw.write_u32(std::process::id());
        let span = u64::from(RANGE.end - RANGE.start);
        let port = RANGE.start + u16::try_from(draw.finish() % span).expect("within the range");
        let mut given = lock(&GIVEN);
        if given.contains(&port) {
            continue;
        }
        // Dual-stack where there is IPv6 (`[::]` covers 0.0.0.0 too), else IPv4.
        let free = match std::net::TcpListener::bind(("::", port)) {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => false,
            Err(_) => std::net::TcpListener::bind(("0.0.0.0", port)).is_ok(),
        };
        if free {
            given.push(port);
            return port;
        }
    }
    panic!("no free TCP port in {RANGE:?}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addr_parsing() {
        let text = "x\ndrover: balancer \"default\" listening on 127.0.0.1:40123\nadmin listening on [::1]:9, ok\n";
        assert_eq!(
            addr_after(text, "listening on "),
            Some("127.0.0.1:40123".parse().unwrap())
        );
        assert_eq!(
            addrs_after(text, "listening on "),
            vec![
                "127.0.0.1:40123".parse().unwrap(),
                "[::1]:9".parse().unwrap()
            ]
        );
        assert_eq!(addr_after("listening on nowhere", "listening on "), None);
    }

    #[tokio::test]
    async fn wait_until_times_out_and_succeeds() {
        let start = Instant::now();
        assert!(!wait_until(Duration::from_millis(50), || false).await);
        assert!(start.elapsed() >= Duration::from_millis(50));
        let mut n = 0;
        assert!(
            wait_until(Duration::from_secs(1), || {
                n += 1;
                n > 3
            })
            .await
        );
        assert!(wait_until_async(Duration::from_secs(1), || async { true }).await);
    }

    #[tokio::test]
    async fn spawn_reads_marker_from_stderr_and_drains() {
        let mut cmd = Command::new("sh");
        cmd.args([
            "-c",
            "echo 'drover: balancer \"default\" listening on 127.0.0.1:4321' >&2; echo more >&2; sleep 30",
        ]);
        let p = spawn_ready_line(cmd, "listening on ").await;
        assert_eq!(p.addr(), "127.0.0.1:4321".parse().unwrap());
        assert!(p
            .wait_for_line("more", Duration::from_secs(5))
            .await
            .is_some());
        p.signal("TERM").unwrap();
        let status = p
            .wait_exit(Duration::from_secs(5))
            .await
            .expect("exits on TERM");
        assert!(!status.success());
    }

    #[tokio::test]
    #[should_panic(expected = "exited")]
    async fn spawn_panics_with_output_when_child_exits() {
        let mut cmd = Command::new("sh");
        cmd.args(["-c", "echo boom >&2; exit 3"]);
        spawn_ready_line(cmd, "listening on ").await;
    }
}
