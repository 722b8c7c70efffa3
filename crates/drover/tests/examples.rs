//! The example servers in `examples/` (pi and tetration, each in Node, Python and Go):
//! behind `drover run`, in its shared-socket mode, on a socket passed as fd 3
//! (LISTEN_FDS) without drover, and answering alike across languages.
//!
//! Go servers are built once per test process with `go build`. Without `go` their tests
//! pass as skipped, except under CI (env `CI` set), where a missing `go` is a failure.

mod common;

use common::examples::{self, clean_env, drover_stops_cleanly, get};
use drover_testkit::{parse_status, spawn_ready_line, wait_until, ChildProcess, Response};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lang {
    Node,
    Python,
    Go,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum App {
    Pi,
    Tetra,
}

impl App {
    fn name(self) -> &'static str {
        match self {
            App::Pi => "pi-server",
            App::Tetra => "tetra-server",
        }
    }

    /// A request with a known answer, cheap in every language.
    fn sample_path(self) -> &'static str {
        match self {
            App::Pi => "/pi?iterations=1000",
            App::Tetra => "/tetra/1.5?n=3",
        }
    }

    /// A request that keeps `lang`'s server busy for a second or so (CPU, on a quiet
    /// machine): long enough to be in flight when a signal comes.
    fn slow_path(self, lang: Lang) -> &'static str {
        match (self, lang) {
            (App::Pi, Lang::Python) => "/pi?iterations=10000000",
            (App::Pi, _) => "/pi?iterations=100000000",
            (App::Tetra, _) => "/tetra/1.2?n=10000000",
        }
    }
}

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .canonicalize()
        .expect("examples/ exists")
}

/// Directory holding the built Go servers, or `None` when `go` is missing outside CI.
fn go_binaries() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(build_go_servers).as_deref()
}

fn build_go_servers() -> Option<PathBuf> {
    let has_go = Command::new("go")
        .arg("version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_go {
        assert!(
            std::env::var_os("CI").is_none(),
            "`go` is missing; scripts/test installs it (apt-get install golang-go)"
        );
        eprintln!("skipping the Go example servers: `go` is not installed");
        return None;
    }
    // Under target/, so runs reuse one directory instead of piling up binaries in /tmp.
    let out_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("examples-go");
    std::fs::create_dir_all(&out_dir).unwrap();
    for app in [App::Pi, App::Tetra] {
        let mut cmd = Command::new("go");
        cmd.args(["build", "-o"])
            .arg(out_dir.join(app.name()))
            .arg(".")
            .current_dir(examples_dir().join("go").join(app.name()))
            // The modules need no downloads; a newer toolchain must not be fetched either.
            .env("GOTOOLCHAIN", "local");
        // `go` refuses to run without somewhere to cache builds.
        if ["GOCACHE", "XDG_CACHE_HOME", "HOME"]
            .iter()
            .all(|v| std::env::var_os(v).is_none())
        {
            cmd.env(
                "GOCACHE",
                Path::new(env!("CARGO_TARGET_TMPDIR")).join("examples-gocache"),
            );
        }
        let out = cmd.output().expect("run go build");
        assert!(
            out.status.success(),
            "go build of examples/go/{} failed:\n{}",
            app.name(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Some(out_dir)
}

/// The command line that runs `app` in `lang`; `None` when it is skipped (no `go`).
fn command(lang: Lang, app: App) -> Option<Vec<String>> {
    let script = |ext: &str| {
        examples_dir()
            .join(format!("{}.{ext}", app.name()))
            .display()
            .to_string()
    };
    Some(match lang {
        Lang::Node => vec!["node".into(), script("js")],
        Lang::Python => vec!["python3".into(), script("py")],
        Lang::Go => vec![go_binaries()?.join(app.name()).display().to_string()],
    })
}

// --- a JSON reader for the servers' flat answers (no JSON crate among the
// dev-dependencies, and the answers hold nothing nested) ---

#[derive(Clone, Debug, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
}

impl Json {
    fn num(&self) -> f64 {
        match self {
            Json::Num(n) => *n,
            other => panic!("expected a number, got {other:?}"),
        }
    }
}

struct Reader<'a> {
    s: &'a [u8],
    i: usize,
}

impl Reader<'_> {
    fn ws(&mut self) {
        while self.s.get(self.i).is_some_and(u8::is_ascii_whitespace) {
            self.i += 1;
        }
    }

    fn eat(&mut self, b: u8) -> bool {
        self.ws();
        let hit = self.s.get(self.i) == Some(&b);
        self.i += usize::from(hit);
        hit
    }

    fn expect(&mut self, b: u8) -> Result<(), String> {
        if self.eat(b) {
            Ok(())
        } else {
            Err(format!("expected {:?} at byte {}", b as char, self.i))
        }
    }

    fn string(&mut self) -> Result<String, String> {
        self.expect(b'"')?;
        let mut out = String::new();
        loop {
            let rest = std::str::from_utf8(&self.s[self.i..]).map_err(|e| e.to_string())?;
            let mut chars = rest.chars();
            let c = chars.next().ok_or("unterminated string")?;
            self.i += c.len_utf8();
            match c {
                '"' => return Ok(out),
                '\\' => {
                    let e = *self.s.get(self.i).ok_or("unterminated escape")?;
                    self.i += 1;
                    out.push(match e {
                        b'n' => '\n',
                        b't' => '\t',
                        b'r' => '\r',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'u' => {
                            let hex = self.s.get(self.i..self.i + 4).ok_or("short \\u")?;
                            self.i += 4;
                            let code = u32::from_str_radix(std::str::from_utf8(hex).unwrap(), 16)
                                .map_err(|e| e.to_string())?;
                            char::from_u32(code).unwrap_or('\u{fffd}')
                        }
                        other => other as char,
                    });
                }
                c => out.push(c),
            }
        }
    }

    fn value(&mut self) -> Result<Json, String> {
        self.ws();
        let rest = &self.s[self.i..];
        for (word, value) in [
            ("null", Json::Null),
            ("true", Json::Bool(true)),
            ("false", Json::Bool(false)),
        ] {
            if rest.starts_with(word.as_bytes()) {
                self.i += word.len();
                return Ok(value);
            }
        }
        if rest.first() == Some(&b'"') {
            return self.string().map(Json::Str);
        }
        let len = rest
            .iter()
            .take_while(|b| b"+-.eE0123456789".contains(b))
            .count();
        let text = std::str::from_utf8(&rest[..len]).unwrap();
        self.i += len;
        text.parse()
            .map(Json::Num)
            .map_err(|_| format!("bad value at byte {}", self.i - len))
    }
}

fn parse_object(text: &str) -> Result<BTreeMap<String, Json>, String> {
    let mut r = Reader {
        s: text.as_bytes(),
        i: 0,
    };
    let mut out = BTreeMap::new();
    r.expect(b'{')?;
    if !r.eat(b'}') {
        loop {
            r.ws();
            let key = r.string()?;
            r.expect(b':')?;
            out.insert(key, r.value()?);
            if r.eat(b',') {
                continue;
            }
            r.expect(b'}')?;
            break;
        }
    }
    r.ws();
    if r.i != r.s.len() {
        return Err(format!("trailing bytes at {}", r.i));
    }
    Ok(out)
}

/// The JSON object of a 200 answer; panics with the answer otherwise.
fn json_answer(who: &str, path: &str, r: &Response) -> BTreeMap<String, Json> {
    assert_eq!(r.status, 200, "{who} GET {path}: {}", r.text());
    assert!(
        r.header("content-type")
            .is_some_and(|t| t.starts_with("application/json")),
        "{who} GET {path}: {:?}",
        r.headers
    );
    parse_object(&r.text()).unwrap_or_else(|e| panic!("{who} GET {path}: {e}: {}", r.text()))
}

// --- what the answers must be ---

/// x↑↑n as the servers define it: the tower of n copies of x, evaluated from the top.
fn tower(x: f64, n: u32) -> f64 {
    (0..n).fold(1.0, |t, _| x.powf(t))
}

/// Each language's pow may round its last bit differently; towers of these heights
/// do not amplify that much.
fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

/// Checks an answer to `App::sample_path` and returns its `worker` id (None if null).
fn check_sample(who: &str, app: App, r: &Response) -> Option<String> {
    let path = app.sample_path();
    let a = json_answer(who, path, r);
    match app {
        App::Pi => {
            assert_eq!(a["iterations"], Json::Num(1000.0), "{who}: {a:?}");
            // 1000 points: the estimate's standard deviation is about 0.05.
            let pi = a["pi"].num();
            assert!((pi - std::f64::consts::PI).abs() < 0.6, "{who}: {a:?}");
        }
        App::Tetra => {
            assert_eq!(a["x"], Json::Num(1.5), "{who}: {a:?}");
            assert_eq!(a["n"], Json::Num(3.0), "{who}: {a:?}");
            let value = a["value"].num();
            assert!(close(value, tower(1.5, 3)), "{who}: {a:?}");
        }
    }
    assert!(a["ms"].num() >= 0.0, "{who}: {a:?}");
    let pid = a["pid"].num();
    assert!(pid >= 1.0 && pid.fract() == 0.0, "{who}: {a:?}");
    let worker = match &a["worker"] {
        Json::Str(w) => Some(w.clone()),
        Json::Null => None,
        other => panic!("{who}: worker is {other:?}"),
    };
    // Load generators count answers per worker by this header.
    let expected_header = worker.clone().unwrap_or_else(|| format!("{pid}"));
    assert_eq!(
        r.header("x-worker"),
        Some(expected_header.as_str()),
        "{who}: {:?}",
        r.headers
    );
    worker
}

/// The 400s (and the 422) every language must give, with the message's key part.
fn bad_inputs(app: App) -> &'static [(&'static str, u16, &'static str)] {
    match app {
        App::Pi => &[
            (
                "/pi?iterations=-1",
                400,
                "iterations must be an integer in 1..100000000",
            ),
            (
                "/pi?iterations=abc",
                400,
                "iterations must be an integer in 1..100000000",
            ),
            ("/mixed?n=abc", 400, "n must be an integer"),
        ],
        App::Tetra => &[
            (
                "/tetra/abc",
                400,
                "x must be a positive finite decimal number, got \"abc\"",
            ),
            (
                "/tetra/1.5?n=-1",
                400,
                "n must be an integer in 0..10000000, got \"-1\"",
            ),
            (
                "/tetra/2?n=5",
                422,
                "2^^5 overflows a 64-bit float (it exceeds 1.8e308)",
            ),
        ],
    }
}

fn check_bad_input(who: &str, path: &str, status: u16, message: &str, r: &Response) {
    assert_eq!(r.status, status, "{who} GET {path}: {}", r.text());
    assert!(
        r.text().contains(message),
        "{who} GET {path}: {:?} lacks {message:?}",
        r.text()
    );
    assert!(
        r.header("x-worker").is_some(),
        "{who} GET {path}: no x-worker on an error: {:?}",
        r.headers
    );
}

// --- behind drover ---

async fn behind_drover(lang: Lang, app: App) {
    let Some(server) = command(lang, app) else {
        return;
    };
    let who = format!("{lang:?} {}", app.name());
    let d = examples::behind_drover(&server).await;
    check_both_workers(&who, app, &d).await;
    for (path, status, message) in bad_inputs(app) {
        let r = get(d.addr(), path).await;
        check_bad_input(&who, path, *status, message, &r);
    }
    drover_stops_cleanly(&who, &d).await;
}

/// drover's shared mode: no balancer, the workers accept on the socket drover passes
/// them as fd 3 (LISTEN_FDS, one socket per worker), and drover places the connections.
async fn shared_mode(lang: Lang, app: App) {
    let Some(server) = command(lang, app) else {
        return;
    };
    let who = format!("{lang:?} {} (shared socket)", app.name());
    let d = examples::shared_mode(&who, &server).await;
    check_both_workers(&who, app, &d).await;
    drover_stops_cleanly(&who, &d).await;
}

/// Asks through drover until both workers, 0 and 1, have answered correctly; then
/// checks `/health`.
async fn check_both_workers(who: &str, app: App, d: &ChildProcess) {
    examples::check_both_workers(who, d, app.sample_path(), |r| {
        check_sample(who, app, r).expect("drover sets DROVER_WORKER_ID")
    })
    .await;

    let health = get(d.addr(), "/health").await;
    assert_eq!(
        (health.status, health.text().as_str()),
        (200, "ok"),
        "{who}"
    );
}

// --- LISTEN_FDS without drover ---

fn launcher() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/listen_fds_launch.py")
}

/// `server` started by the launcher, with a listening socket on fd 3 and LISTEN_FDS
/// set; `addr()` is that socket's address. `extra` goes before the program.
async fn launch(server: &[String], extra: &[&str], port: u16) -> ChildProcess {
    let mut cmd = Command::new("python3");
    cmd.arg(launcher()).args(extra).args(server);
    clean_env(&mut cmd);
    cmd.env("PORT", port.to_string());
    spawn_ready_line(cmd, "fd 3 listening on ").await
}

/// `server` with a socket on fd 3, once it says it serves that socket.
async fn launch_on_fd_3(who: &str, server: &[String]) -> ChildProcess {
    // PORT=0: a server that wrongly binds PORT announces some other port, and fails here.
    let p = launch(server, &[], 0).await;
    let ready = format!("listening on {} (fd 3 from LISTEN_FDS)", p.addr());
    assert!(
        p.wait_for_line(&ready, Duration::from_secs(15))
            .await
            .is_some(),
        "{who}: no {ready:?} line\n{}{}",
        p.stdout_text(),
        p.stderr_text()
    );
    p
}

/// Sends SIGTERM and expects exit status 0 soon after.
async fn stops_cleanly(who: &str, p: &ChildProcess) {
    p.signal("TERM").unwrap();
    let status = p.wait_exit(Duration::from_secs(5)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{who}: exit after SIGTERM: {status:?}\n{}{}",
        p.stdout_text(),
        p.stderr_text()
    );
}

async fn serves_fd_3(lang: Lang, app: App) {
    let Some(server) = command(lang, app) else {
        return;
    };
    let who = format!("{lang:?} {}", app.name());
    let p = launch_on_fd_3(&who, &server).await;
    let addr = p.addr();

    let health = get(addr, "/health").await;
    assert_eq!(
        (health.status, health.text().as_str()),
        (200, "ok"),
        "{who}"
    );
    let r = get(addr, app.sample_path()).await;
    assert_eq!(
        check_sample(&who, app, &r),
        None,
        "{who}: no DROVER_WORKER_ID"
    );
    // exec kept the launcher's pid, so the answer names the child we started.
    let a = json_answer(&who, app.sample_path(), &r);
    assert_eq!(a["pid"], Json::Num(f64::from(p.pid())), "{who}");
    drains_on_sigterm(&who, &p, app.slow_path(lang)).await;
}

/// A slow request is in the server's hands when SIGTERM comes: it is answered with a 200,
/// no connection made once the server says it drains is served, and the server exits 0.
async fn drains_on_sigterm(who: &str, p: &ChildProcess, slow_path: &str) {
    let addr = p.addr();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    slow.write_all(
        format!("GET {slow_path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let read = wait_until(Duration::from_secs(10), || server_read_all(&slow)).await;
    // Read, not yet answered: in flight.
    let mut byte = [0u8; 1];
    assert!(
        matches!(slow.try_read(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "{who}: GET {slow_path} was answered before SIGTERM; it is too quick to test a drain with"
    );
    assert!(read, "{who}: the server never read GET {slow_path}");
    p.signal("TERM").unwrap();
    assert!(
        p.wait_for_line("SIGTERM, draining", Duration::from_secs(10))
            .await
            .is_some(),
        "{who}: no \"draining\" line after SIGTERM\n{}{}",
        p.stdout_text(),
        p.stderr_text()
    );
    // From now on a new connection is refused, or closed unanswered once the server lets
    // go of its socket.
    let late = match TcpStream::connect(addr).await {
        Err(e) => format!("refused ({e})"),
        Ok(mut late) => {
            let _ = late
                .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
                .await;
            let mut got = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(30), late.read_to_end(&mut got))
                .await
                .unwrap_or_else(|_| panic!("{who}: a connection made while draining was held"));
            assert!(
                got.is_empty(),
                "{who}: a connection made while draining was answered: {}",
                String::from_utf8_lossy(&got)
            );
            match read {
                Ok(_) => "closed unanswered".to_string(),
                Err(e) => format!("closed unanswered ({e})"),
            }
        }
    };
    eprintln!("{who}: a connection made while draining was {late}");

    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(60), slow.read_to_end(&mut answer))
        .await
        .unwrap_or_else(|_| panic!("{who}: GET {slow_path} unanswered 60 s after SIGTERM"))
        .unwrap_or_else(|e| panic!("{who}: GET {slow_path} cut off by SIGTERM: {e}"));
    let text = String::from_utf8_lossy(&answer);
    assert_eq!(
        parse_status(&answer),
        Some(200),
        "{who}: GET {slow_path}: {text}"
    );
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    assert!(
        parse_object(body.trim_end()).is_ok(),
        "{who}: GET {slow_path}: {text}"
    );

    let status = p.wait_exit(Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{who}: exit after SIGTERM: {status:?}\n{}{}",
        p.stdout_text(),
        p.stderr_text()
    );
}

/// Whether the server end of `client`'s connection has read everything `client` sent:
/// all of it acknowledged, and none left unread in the server's socket (their lines of
/// /proc/net/tcp: the client's send queue and the server's receive queue are empty).
fn server_read_all(client: &TcpStream) -> bool {
    let (Ok(local), Ok(peer)) = (client.local_addr(), client.peer_addr()) else {
        return false;
    };
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap_or_default();
    let (mut acked, mut read) = (false, false);
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (Some(l), Some(r), Some((tx, rx))) = (
            f.get(1).and_then(|a| proc_net_addr(a)),
            f.get(2).and_then(|a| proc_net_addr(a)),
            f.get(4).and_then(|q| q.split_once(':')),
        ) else {
            continue;
        };
        let empty = |q: &str| u64::from_str_radix(q, 16) == Ok(0);
        if (l, r) == (local, peer) {
            acked = empty(tx);
        } else if (l, r) == (peer, local) {
            // 01: ESTABLISHED.
            read = f.get(3) == Some(&"01") && empty(rx);
        }
    }
    acked && read
}

/// An IPv4 address as /proc/net/tcp writes it: `0100007F:1F90` (the address's bytes as a
/// native-endian word, then the port), in hex.
fn proc_net_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let ip = u32::from_be(u32::from_str_radix(ip, 16).ok()?);
    Some(SocketAddr::from((
        std::net::Ipv4Addr::from(ip),
        u16::from_str_radix(port, 16).ok()?,
    )))
}

async fn ignores_fd_3_of_another_pid(lang: Lang, app: App) {
    let Some(server) = command(lang, app) else {
        return;
    };
    let who = format!("{lang:?} {}", app.name());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = launch(&server, &["--wrong-pid"], port).await;
    let own = format!("listening on 127.0.0.1:{port}");
    let line = p.wait_for_line(&own, Duration::from_secs(15)).await;
    assert!(
        line.as_deref().is_some_and(|l| !l.contains("LISTEN_FDS")),
        "{who}: no {own:?} line\n{}{}",
        p.stdout_text(),
        p.stderr_text()
    );
    let r = get(SocketAddr::from(([127, 0, 0, 1], port)), "/health").await;
    assert_eq!(r.status, 200, "{who}");
    stops_cleanly(&who, &p).await;
}

macro_rules! example_server {
    ($name:ident, $lang:expr, $app:expr) => {
        mod $name {
            use super::*;

            #[tokio::test]
            async fn answers_behind_drover_from_both_workers() {
                behind_drover($lang, $app).await;
            }

            #[tokio::test]
            async fn answers_in_drover_shared_mode_from_both_workers() {
                shared_mode($lang, $app).await;
            }

            #[tokio::test]
            async fn serves_the_socket_on_fd_3_and_drains_on_sigterm() {
                serves_fd_3($lang, $app).await;
            }

            #[tokio::test]
            async fn binds_port_when_listen_pid_names_another_process() {
                ignores_fd_3_of_another_pid($lang, $app).await;
            }
        }
    };
}

example_server!(node_pi, Lang::Node, App::Pi);
example_server!(python_pi, Lang::Python, App::Pi);
example_server!(go_pi, Lang::Go, App::Pi);
example_server!(node_tetra, Lang::Node, App::Tetra);
example_server!(python_tetra, Lang::Python, App::Tetra);
example_server!(go_tetra, Lang::Go, App::Tetra);

// --- the same answers in every language ---

/// Every available implementation of `app` on its own socket, labelled.
async fn all_languages(app: App) -> Vec<(String, ChildProcess)> {
    let mut out = Vec::new();
    for lang in [Lang::Node, Lang::Python, Lang::Go] {
        if let Some(server) = command(lang, app) {
            let who = format!("{lang:?}");
            let p = launch_on_fd_3(&who, &server).await;
            out.push((who, p));
        }
    }
    out
}

/// What must agree between languages in one answer: the status, and either the exact
/// error text or the answer's keys and deterministic fields.
#[derive(Debug)]
enum Outcome {
    Error(u16, String),
    Answer(BTreeMap<String, Json>),
}

async fn outcome(who: &str, addr: SocketAddr, path: &str) -> Outcome {
    let r = get(addr, path).await;
    assert!(
        r.header("x-worker").is_some(),
        "{who} GET {path}: {:?}",
        r.headers
    );
    if r.status == 200 {
        Outcome::Answer(json_answer(who, path, &r))
    } else {
        Outcome::Error(r.status, r.text())
    }
}

/// Asks every server each path and checks the outcomes agree: same status, same error
/// text, same keys, and `same` on the answers.
async fn compare(
    app: App,
    paths: &[&str],
    same: impl Fn(&str, &BTreeMap<String, Json>, &BTreeMap<String, Json>),
) {
    let servers = all_languages(app).await;
    for path in paths {
        let mut first: Option<(&str, Outcome)> = None;
        for (lang, p) in &servers {
            let got = outcome(lang, p.addr(), path).await;
            let Some((first_lang, want)) = &first else {
                first = Some((lang, got));
                continue;
            };
            let ctx = format!("GET {path}: {first_lang} vs {lang}");
            match (want, &got) {
                (Outcome::Error(s1, t1), Outcome::Error(s2, t2)) => {
                    assert_eq!((s1, t1), (s2, t2), "{ctx}");
                }
                (Outcome::Answer(a), Outcome::Answer(b)) => {
                    let keys = |m: &BTreeMap<String, Json>| m.keys().cloned().collect::<Vec<_>>();
                    assert_eq!(keys(a), keys(b), "{ctx}");
                    same(&ctx, a, b);
                }
                _ => panic!("{ctx}: {want:?} vs {got:?}"),
            }
        }
    }
    for (lang, p) in &servers {
        stops_cleanly(lang, p).await;
    }
}

#[tokio::test]
async fn tetra_servers_agree_across_languages() {
    let paths = [
        "/tetra/1.5?n=3",
        "/tetra/2",
        "/tetra/2?n=0",
        "/tetra/3?n=3",
        "/tetra/0.5?n=1000",
        "/tetra/0.01?n=7",
        "/tetra/1e-3?n=2",
        "/tetra/+.25e1?n=2",
        "/tetra/1.2?n=100000",
        "/tetra/1e308?n=1",
        "/tetra/2?n=5",
        "/tetra/1e308?n=2",
        "/tetra/abc",
        "/tetra/0",
        "/tetra/-1",
        "/tetra/NaN",
        "/tetra/Infinity",
        "/tetra/inf",
        "/tetra/1e400",
        "/tetra/0x10",
        "/tetra/1_0",
        "/tetra/%31",
        "/tetra/",
        "/tetra/1.5?n=-1",
        "/tetra/1.5?n=1.5",
        "/tetra/1.5?n=",
        "/tetra/1.5?n=10000001",
        "/tetra/1.5?n=99999999999999999999999",
        "/tetra/1/2",
        "/mixed?n=10",
        "/mixed?n=7",
        "/mixed?n=-20",
        "/mixed?n=abc",
        "/nope",
    ];
    compare(App::Tetra, &paths, |ctx, a, b| {
        for key in ["x", "n", "kind"] {
            assert_eq!(a.get(key), b.get(key), "{ctx}: {key}");
        }
        let (value, x, n) = (a["value"].num(), a["x"].num(), a["n"].num());
        assert!(close(value, b["value"].num()), "{ctx}: {a:?} vs {b:?}");
        assert!(close(value, tower(x, n as u32)), "{ctx}: {a:?}");
    })
    .await;
}

#[tokio::test]
async fn pi_servers_agree_across_languages() {
    let paths = [
        "/pi?iterations=1000",
        "/?iterations=20000",
        "/pi?iterations=-1",
        "/pi?iterations=0",
        "/pi?iterations=1e3",
        "/pi?iterations=abc",
        "/pi?iterations=",
        "/pi?iterations=100000001",
        "/mixed?n=10",
        "/mixed?n=3",
        "/mixed?n=x",
        "/nope",
    ];
    compare(App::Pi, &paths, |ctx, a, b| {
        for key in ["iterations", "kind"] {
            assert_eq!(a.get(key), b.get(key), "{ctx}: {key}");
        }
        for m in [a, b] {
            let pi = m["pi"].num();
            assert!((pi - std::f64::consts::PI).abs() < 0.6, "{ctx}: {m:?}");
        }
    })
    .await;
}

#[test]
fn json_reader_reads_what_the_servers_write() {
    let a = parse_object(
        "{\"x\": 2.0, \"n\":4,\"value\":65536,\"worker\":null,\"ok\":true,\"kind\":\"c\\\"h\\u00e9\"}\n",
    )
    .unwrap();
    assert_eq!(a["x"], Json::Num(2.0));
    assert_eq!(a["n"], Json::Num(4.0));
    assert_eq!(a["worker"], Json::Null);
    assert_eq!(a["ok"], Json::Bool(true));
    assert_eq!(a["kind"], Json::Str("c\"hé".into()));
    assert!(parse_object("{\"x\":1} junk").is_err());
    assert!(parse_object("{}").unwrap().is_empty());
}
