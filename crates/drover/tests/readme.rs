//! The README's first command, run exactly as written (`sh -c` in the repository root):
//! it must start drover on the address the README's `curl` uses, answer that request with
//! a pi estimate, and stop cleanly on Ctrl-C (SIGINT to its process group), workers and
//! listening ports included.
//!
//! The command is `cargo run --release -- up`, so the first run on a fresh clone builds
//! the release profile (minutes); later runs reuse it. The ports the repository's
//! drover.toml binds (127.0.0.1:8000 and 127.0.0.1:9900) must be free: the test fails,
//! naming the port, when one is not.

use drover_testkit::HttpClient;
use std::fs::File;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tokio::time::sleep;

/// Until the README's address answers 200: a release build from scratch (thin LTO, one
/// codegen unit) takes minutes on a small machine, and more than 8 of them on 2 cores
/// that something else also uses (a CI run beside another build gave no 200 in 480 s).
const START_LIMIT: Duration = Duration::from_secs(15 * 60);
/// From SIGINT until every process of the group is gone. drover's default drain timeout
/// is 30 s and nothing is in flight, so this is slack.
const STOP_LIMIT: Duration = Duration::from_secs(45);
const POLL: Duration = Duration::from_millis(250);

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

/// The first command of the README's first ```sh block, without its `# comment`.
fn first_command(readme: &str) -> String {
    let mut lines = readme.lines();
    lines
        .by_ref()
        .find(|l| l.trim() == "```sh")
        .expect("README.md has no ```sh block");
    let line = lines.next().expect("README.md ends inside its ```sh block");
    assert!(
        !line.trim_start().starts_with("```"),
        "README.md's first ```sh block is empty"
    );
    let command = line.split_once(" #").map_or(line, |(c, _)| c).trim();
    assert!(
        !command.is_empty(),
        "README.md's first ```sh block starts with a comment"
    );
    command.to_string()
}

/// Address and target of the README's first `curl 'http://ADDR/PATH'`.
fn curl_target(readme: &str) -> (SocketAddr, String) {
    let at = readme
        .find("curl '")
        .expect("README.md has no `curl '...'` to try")
        + "curl '".len();
    let url = &readme[at..at + readme[at..].find('\'').expect("unterminated curl URL")];
    let rest = url
        .strip_prefix("http://")
        .unwrap_or_else(|| panic!("README's curl URL {url:?} is not http://"));
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let addr = authority
        .parse()
        .unwrap_or_else(|e| panic!("README's curl URL {url:?}: {authority:?} is not IP:PORT: {e}"));
    let path = if path.is_empty() { "/" } else { path };
    (addr, path.to_string())
}

/// Every address the repository's drover.toml listens on, with where it says so.
fn config_listeners(root: &Path) -> Vec<(SocketAddr, String)> {
    let text = std::fs::read_to_string(root.join("drover.toml")).expect("read drover.toml");
    let table: toml::Table = text.parse().expect("drover.toml is TOML");
    let mut out = Vec::new();
    let mut add = |value: Option<&toml::Value>, what: String| {
        if let Some(s) = value.and_then(toml::Value::as_str) {
            let addr = s
                .parse()
                .unwrap_or_else(|e| panic!("drover.toml {what} = {s:?}: {e}"));
            out.push((addr, format!("drover.toml's {what}")));
        }
    };
    add(
        table.get("admin").and_then(|a| a.get("listen")),
        "[admin] listen".into(),
    );
    let balancers = table.get("balancer").and_then(toml::Value::as_array);
    for (i, b) in balancers.into_iter().flatten().enumerate() {
        add(b.get("listen"), format!("balancer[{i}].listen"));
    }
    out
}

/// Fails the test, naming the port, when something already listens on `addr`.
fn assert_free(addr: SocketAddr, what: &str) {
    if let Err(e) = TcpListener::bind(addr) {
        panic!(
            "port {port} ({addr}, {what}) is already in use ({e}); the README's first \
             command needs it. Stop whatever holds it (`ss -ltnp 'sport = :{port}'` shows \
             it, e.g. a `drover up` still running) and run the test again",
            port = addr.port()
        );
    }
}

/// Pid and name of each live (not zombie) process in process group `pgid`.
fn group_members(pgid: u32) -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and parentheses.
        let (head, tail) = stat.rsplit_once(") ")?;
        let comm = head.split_once(" (")?.1.to_string();
        let fields: Vec<&str> = tail.split_whitespace().collect();
        let (state, pgrp) = (*fields.first()?, fields.get(2)?.parse::<u32>().ok()?);
        (pgrp == pgid && state != "Z").then_some((pid, comm))
    })
    .collect()
}

/// The command's process group; dropping it SIGKILLs the whole group (cargo, rustc,
/// drover, its workers) unless every member was seen gone, and reaps the child.
struct Group {
    child: Child,
    pgid: u32,
    gone: bool,
    log: PathBuf,
}

impl Group {
    /// Sends `sig` (a name such as "KILL") to every process in the group.
    fn signal(&self, sig: &str) -> bool {
        kill(sig, &[format!("-{}", self.pgid)])
    }

    /// Ctrl-C: SIGINT to the processes a terminal would signal for the command typed at
    /// a shell prompt. That is the whole group, less the `sh -c` standing in for the
    /// user's shell (when sh did not exec the command): sh, unlike an interactive
    /// shell, would die of it and report that instead of drover's exit status.
    fn ctrl_c(&self) -> bool {
        let targets: Vec<String> = group_members(self.pgid)
            .into_iter()
            .filter(|(pid, comm)| !(*pid == self.pgid && comm == "sh"))
            .map(|(pid, _)| pid.to_string())
            .collect();
        !targets.is_empty() && kill("INT", &targets)
    }

    fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("wait for the command")
    }

    /// The last lines of the command's output, for failure messages.
    fn output_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(60);
        format!(
            "--- last output of the command ({}) ---\n{}",
            self.log.display(),
            lines[from..].join("\n")
        )
    }
}

/// `kill -SIG -- TARGETS...` (the workspace forbids unsafe, so no libc::kill).
fn kill(sig: &str, targets: &[String]) -> bool {
    Command::new("kill")
        .arg(format!("-{sig}"))
        .arg("--")
        .args(targets)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.gone {
            // The group first, while its leader is unreaped, so the id cannot be reused.
            self.signal("KILL");
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn readme_first_command_serves_the_readme_curl_and_stops_on_ctrl_c() {
    let root = repo_root();
    let readme = std::fs::read_to_string(root.join("README.md")).expect("read README.md");
    let command = first_command(&readme);
    let (addr, target) = curl_target(&readme);

    let mut ports = vec![(addr, "the README's curl address".to_string())];
    for (a, what) in config_listeners(&root) {
        if a == addr {
            ports[0].1.push_str(&format!(" and {what}"));
        } else {
            ports.push((a, what));
        }
    }
    for (a, what) in &ports {
        assert_free(*a, what);
    }

    let log = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("readme-first-command-{}.log", std::process::id()));
    let out = File::create(&log).expect("create the log file");
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(&command)
        .current_dir(&root)
        .env("CARGO_TERM_COLOR", "never")
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("dup the log file"))
        .stderr(out)
        .process_group(0);
    // `cargo` in the command means the cargo running these tests, when cargo says which.
    if let Some(dir) = std::env::var_os("CARGO")
        .map(PathBuf::from)
        .and_then(|c| c.parent().map(Path::to_path_buf))
    {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let paths = std::iter::once(dir).chain(std::env::split_paths(&path));
        cmd.env("PATH", std::env::join_paths(paths).expect("PATH"));
    }
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start sh -c {command:?}: {e}"));
    let mut group = Group {
        pgid: child.id(),
        child,
        gone: false,
        log,
    };

    // Up: the README's curl, until it gets a 200 (the build, then workers getting ready).
    let started = Instant::now();
    let response = loop {
        if let Some(status) = group.exited() {
            panic!(
                "`{command}` exited ({status}) before http://{addr}{target} answered 200\n{}",
                group.output_tail()
            );
        }
        let last = match HttpClient::connect(addr).await {
            Ok(mut client) => match client.request("GET", &target, &[], None).await {
                Ok(r) if r.status == 200 => break r,
                Ok(r) => format!("{} {}", r.status, r.text()),
                Err(e) => format!("request failed: {e}"),
            },
            Err(e) => format!("connect failed: {e}"),
        };
        if started.elapsed() > START_LIMIT {
            panic!(
                "`{command}`: http://{addr}{target} gave no 200 within {START_LIMIT:?} \
                 (last: {last})\n{}",
                group.output_tail()
            );
        }
        sleep(POLL).await;
    };
    let body: serde_json::Value = serde_json::from_slice(&response.body).unwrap_or_else(|e| {
        panic!(
            "GET {target}: the body is not JSON ({e}): {:?}",
            response.text()
        )
    });
    let pi = body["pi"]
        .as_f64()
        .unwrap_or_else(|| panic!("GET {target}: no numeric \"pi\" in {body}"));
    assert!(
        (pi - std::f64::consts::PI).abs() < 0.05,
        "GET {target}: pi estimate {pi} is off: {body}"
    );
    if let Some(n) = target.split("iterations=").nth(1) {
        let n: u64 = n
            .split('&')
            .next()
            .unwrap_or(n)
            .parse()
            .expect("iterations");
        assert_eq!(body["iterations"].as_u64(), Some(n), "GET {target}: {body}");
    }

    assert!(
        group.ctrl_c(),
        "SIGINT to process group {} failed\n{}",
        group.pgid,
        group.output_tail()
    );
    let stopping = Instant::now();
    let status = loop {
        if let Some(status) = group.exited() {
            break status;
        }
        if stopping.elapsed() > STOP_LIMIT {
            panic!(
                "`{command}` did not exit within {STOP_LIMIT:?} of SIGINT\n{}",
                group.output_tail()
            );
        }
        sleep(POLL).await;
    };
    loop {
        let left = group_members(group.pgid);
        if left.is_empty() {
            group.gone = true;
            break;
        }
        if stopping.elapsed() > STOP_LIMIT {
            panic!(
                "processes of `{command}` outlived it by {STOP_LIMIT:?}: {left:?}\n{}",
                group.output_tail()
            );
        }
        sleep(POLL).await;
    }
    assert!(
        status.success(),
        "`{command}` did not stop cleanly on SIGINT: {status}\n{}",
        group.output_tail()
    );
    for (a, what) in &ports {
        assert!(
            TcpStream::connect_timeout(a, Duration::from_secs(1)).is_err(),
            "{a} ({what}) still accepts connections after `{command}` stopped\n{}",
            group.output_tail()
        );
    }
    let _ = std::fs::remove_file(&group.log);
}
