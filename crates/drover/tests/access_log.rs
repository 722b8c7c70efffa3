//! Access logs through the real binary: `drover proxy --access-log combined|json
//! --access-log-path FILE` in front of real backends, its lines read back field by
//! field, by GoAccess, and across a logrotate-style rename and SIGUSR1 under load.

mod common;

use common::{admin_addr, counted_load, default_metric, proxy, temp_dir};
use drover_testkit::{raw_exchange, wait_until_async, Backend, DroverProcess, HttpClient};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// `drover proxy` over `backends` with an access log of `format` at `path`, plus `extra`.
async fn logging_proxy(
    backends: &[SocketAddr],
    format: &str,
    path: &Path,
    extra: &[&str],
) -> DroverProcess {
    let mut args = vec![
        "--access-log",
        format,
        "--access-log-path",
        path.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    proxy(backends, &args).await
}

/// SIGTERM, a clean exit, then the log's lines: written out before drover exits.
async fn stop_and_read(d: DroverProcess, path: &Path) -> Vec<String> {
    d.signal("TERM").unwrap();
    let status = d.wait_exit(Duration::from_secs(15)).await.unwrap();
    assert!(status.success(), "{}", d.stderr_text());
    read_lines(path)
}

fn read_lines(path: &Path) -> Vec<String> {
    let bytes = std::fs::read(path).unwrap_or_default();
    // Both formats escape every byte a client sent: a line is always UTF-8.
    String::from_utf8(bytes)
        .expect("an access log line is UTF-8")
        .lines()
        .map(str::to_string)
        .collect()
}

/// An address where nothing listens (below the range `bind(0)` hands out, so no other
/// test's server takes it meanwhile).
fn dead_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], drover_testkit::free_port()))
}

/// A combined-format line taken apart as GoAccess and awk users do.
#[derive(Debug)]
struct Combined {
    host: String,
    time: String,
    request: String,
    status: u16,
    bytes: String,
    referer: String,
    user_agent: String,
}

fn parse_combined(line: &str) -> Combined {
    let (host, rest) = line
        .split_once(" - - [")
        .unwrap_or_else(|| panic!("{line}"));
    let (time, rest) = rest.split_once("] \"").unwrap();
    let (request, rest) = rest.split_once("\" ").unwrap();
    let mut it = rest.splitn(3, ' ');
    let status = it.next().unwrap().parse().unwrap();
    let bytes = it.next().unwrap().to_string();
    let quoted = it.next().unwrap();
    let (referer, user_agent) = quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .and_then(|q| q.split_once("\" \""))
        .unwrap_or_else(|| panic!("{line}"));
    Combined {
        host: host.into(),
        time: time.into(),
        request: request.into(),
        status,
        bytes,
        referer: referer.into(),
        user_agent: user_agent.into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn combined_lines_say_what_each_request_got() {
    let dir = temp_dir("access-combined");
    let log = dir.join("access.log");
    let backend = Backend::start().await;
    let d = logging_proxy(&[backend.addr()], "combined", &log, &[]).await;
    // Raw, to count the body bytes the client got (the combined format's, as nginx's
    // `$body_bytes_sent`; drover logged head and body before, 191 for a 6-byte body).
    let got = raw_exchange(
        d.addr(),
        b"GET /status/200?q=1 HTTP/1.1\r\nHost: x\r\nUser-Agent: test/1.0\r\nReferer: http://ref.example/\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(got.starts_with(b"HTTP/1.1 200"));
    let head_len = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    let get_body_bytes = got.len() - head_len;
    assert!(get_body_bytes > 0);
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c
        .request("POST", "/status/201", &[], Some(b"hello body"))
        .await
        .unwrap();
    assert_eq!(r.status, 201);
    let r = c.request("GET", "/status/404", &[], None).await.unwrap();
    assert_eq!(r.status, 404);
    // A head drover cannot read: its line has `-` for the request.
    let raw = raw_exchange(d.addr(), b"NOT A REQUEST\r\n\r\n")
        .await
        .unwrap();
    assert!(
        raw.starts_with(b"HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&raw)
    );
    let lines = stop_and_read(d, &log).await;
    assert_eq!(lines.len(), 4, "{lines:#?}");
    let l: Vec<Combined> = lines.iter().map(|l| parse_combined(l)).collect();
    assert_eq!(l[0].host, "127.0.0.1");
    // 26/Nov/2026:15:11:41 +0000
    let t = &l[0].time;
    assert_eq!(t.len(), 26, "{t}");
    assert!(t.ends_with(" +0000") && &t[2..3] == "/" && &t[6..7] == "/" && &t[11..12] == ":");
    assert_eq!(l[0].request, "GET /status/200?q=1 HTTP/1.1");
    assert_eq!(l[0].status, 200);
    assert_eq!(l[0].bytes, get_body_bytes.to_string());
    assert_eq!(l[0].referer, "http://ref.example/");
    assert_eq!(l[0].user_agent, "test/1.0");
    assert_eq!(l[1].request, "POST /status/201 HTTP/1.1");
    assert_eq!(l[1].status, 201);
    assert_eq!(
        (l[1].referer.as_str(), l[1].user_agent.as_str()),
        ("-", "-")
    );
    assert_eq!(l[2].status, 404);
    assert_eq!(l[3].request, "-");
    assert_eq!(l[3].status, 400);
    assert_ne!(l[3].bytes, "-");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_carry_every_field_and_any_bytes() {
    let dir = temp_dir("access-json");
    let log = dir.join("access.jsonl");
    let backend = Backend::start().await;
    let d = logging_proxy(&[backend.addr()], "json", &log, &["--admin", "127.0.0.1:0"]).await;
    let admin = admin_addr(&d).await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c
        .request("GET", "/status/200", &[("x-request-id", "req-42")], None)
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    // A User-Agent with quotes, backslashes, a tab and bytes that are not UTF-8.
    let weird = b"GET /weird HTTP/1.1\r\nHost: x\r\nUser-Agent: a\"b\\c\td \xff\xfe\xc3 end\r\nConnection: close\r\n\r\n";
    let raw = raw_exchange(d.addr(), weird).await.unwrap();
    assert!(raw.starts_with(b"HTTP/1.1 200"));
    let weird_bytes = raw.len() as u64;
    assert_eq!(
        default_metric(admin, "drover_access_log_dropped_total").await,
        0
    );

    // The same log format in front of a backend that is gone: drover's own 502.
    let dead_log = dir.join("dead.jsonl");
    let dead = logging_proxy(&[dead_addr()], "json", &dead_log, &[]).await;
    let r = HttpClient::connect(dead.addr())
        .await
        .unwrap()
        .request("GET", "/x", &[("referer", "http://r/")], None)
        .await
        .unwrap();
    assert_eq!(r.status, 502);

    let lines = stop_and_read(d, &log).await;
    let dead_lines = stop_and_read(dead, &dead_log).await;
    assert_eq!(lines.len(), 2, "{lines:#?}");
    let v: Vec<Value> = lines
        .iter()
        .chain(&dead_lines)
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let ok = &v[0];
    let names: Vec<&str> = ok.as_object().unwrap().keys().map(String::as_str).collect();
    for field in [
        "time",
        "client",
        "method",
        "target",
        "protocol",
        "status",
        "bytes",
        "duration_ms",
        "upstream_ms",
        "queue_ms",
        "endpoint",
        "retries",
        "error",
        "request_id",
        "user_agent",
        "referer",
    ] {
        assert!(names.contains(&field), "{field} missing from {ok}");
    }
    assert!(ok["time"].as_str().unwrap().ends_with('Z'));
    assert_eq!(ok["client"], "127.0.0.1");
    assert_eq!(ok["method"], "GET");
    assert_eq!(ok["target"], "/status/200");
    assert_eq!(ok["protocol"], "HTTP/1.1");
    assert_eq!(ok["status"], 200);
    assert!(ok["bytes"].as_u64().unwrap() > 0);
    assert!(ok["duration_ms"].as_f64().unwrap() >= ok["upstream_ms"].as_f64().unwrap());
    assert_eq!(ok["endpoint"], backend.addr().to_string());
    assert_eq!(ok["retries"], 0);
    assert!(ok["error"].is_null() && ok["referer"].is_null());
    assert_eq!(ok["request_id"], "req-42");

    let weird = &v[1];
    assert_eq!(weird["target"], "/weird");
    assert_eq!(weird["bytes"], weird_bytes);
    assert_eq!(
        weird["user_agent"],
        "a\"b\\c\td \u{FFFD}\u{FFFD}\u{FFFD} end"
    );
    // drover made a request id for the request that came without one.
    assert_eq!(weird["request_id"].as_str().unwrap().len(), 16);

    assert_eq!(dead_lines.len(), 1, "{dead_lines:#?}");
    let failed = &v[2];
    assert_eq!(failed["status"], 502);
    assert_eq!(failed["error"], "connect-failed");
    assert!(failed["upstream_ms"].is_null());
    assert_eq!(failed["referer"], "http://r/");
    assert!(failed["bytes"].as_u64().unwrap() > 0);
}

/// GoAccess reads drover's combined lines as nginx's: no invalid request, every one
/// counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaccess_reads_every_line() {
    if which("goaccess").is_none() {
        let why = "goaccess is not on PATH (apt-get install goaccess; scripts/test does)";
        assert!(std::env::var_os("CI").is_none(), "{why}");
        eprintln!("skipping: {why}");
        return;
    }
    let dir = temp_dir("access-goaccess");
    let log = dir.join("access.log");
    let backend = Backend::start().await;
    let d = logging_proxy(&[backend.addr()], "combined", &log, &[]).await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let agents = [
        "Mozilla/5.0 (X11; Linux x86_64)",
        "curl/8.5.0",
        "a \"quoted\" agent",
    ];
    for i in 0..30 {
        let ua = agents[i % agents.len()];
        let status = [200, 404, 500][i % 3];
        let (method, body) = if i % 5 == 0 {
            ("POST", Some(&b"x=1"[..]))
        } else {
            ("GET", None)
        };
        let r = c
            .request(
                method,
                &format!("/status/{status}?i={i}"),
                &[("user-agent", ua)],
                body,
            )
            .await
            .unwrap();
        assert_eq!(r.status, status);
    }
    let lines = stop_and_read(d, &log).await;
    assert_eq!(lines.len(), 30);
    let report = dir.join("report.json");
    let out = std::process::Command::new("goaccess")
        .arg(&log)
        .arg("--log-format=COMBINED")
        .arg("-o")
        .arg(&report)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let general = &report["general"];
    assert_eq!(general["failed_requests"], 0, "{general}");
    assert_eq!(general["total_requests"], 30, "{general}");
    assert_eq!(general["valid_requests"], 30, "{general}");
}

fn which(program: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
    })
}

/// logrotate's way: rename the file, SIGUSR1, go on. Under a steady stream of requests,
/// the old and the new file together hold one line per answered request, no more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotation_under_load_loses_no_line() {
    let dir = temp_dir("access-rotate");
    let log = dir.join("access.log");
    let rotated = dir.join("access.log.1");
    let backend = Backend::start().await;
    let fields = ["--access-log-fields", "request_id,status"];
    let d = logging_proxy(&[backend.addr()], "json", &log, &fields).await;
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let load = counted_load(d.addr(), 4, "/", Arc::clone(&stop), Arc::clone(&served));
    wait_until_async(Duration::from_secs(10), || async {
        served.load(Ordering::Relaxed) > 300
    })
    .await;
    std::fs::rename(&log, &rotated).unwrap();
    let before = served.load(Ordering::Relaxed);
    d.signal("USR1").unwrap();
    // The new file appears (created by the reopen) and gets lines while load goes on.
    wait_until_async(Duration::from_secs(10), || async {
        read_lines(&log).len() > 50 && served.load(Ordering::Relaxed) > before + 300
    })
    .await;
    stop.store(true, Ordering::Relaxed);
    let mut answered = 0;
    for task in load {
        let (ok, failed) = task.await.unwrap();
        assert!(failed.is_empty(), "{failed:?}");
        answered += ok;
    }
    let new = stop_and_read(d, &log).await;
    let old = read_lines(&rotated);
    assert!(!old.is_empty() && !new.is_empty());
    let mut ids = std::collections::BTreeSet::new();
    for line in old.iter().chain(&new) {
        let v: Value = serde_json::from_str(line).unwrap();
        assert_eq!(v["status"], 200, "{line}");
        assert!(
            ids.insert(v["request_id"].as_str().unwrap().to_string()),
            "twice: {line}"
        );
    }
    assert_eq!(
        old.len() + new.len(),
        answered,
        "old {} + new {} lines for {answered} answered requests",
        old.len(),
        new.len()
    );
}

/// A path drover cannot append to stops the start, naming the flag.
#[tokio::test]
async fn an_unwritable_path_fails_the_start() {
    let out = tokio::process::Command::new(common::bin())
        .args([
            "proxy",
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:1",
            "--access-log",
            "combined",
            "--access-log-path",
            "/nonexistent-dir/access.log",
        ])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--access-log-path: balancer \"default\": cannot open /nonexistent-dir/access.log for append"),
        "{stderr}"
    );
}

/// In a drover.toml, the same error names the file, line and column of the path, for
/// `drover check` as for a start.
#[tokio::test]
async fn drover_check_names_the_place_of_an_unwritable_path() {
    let dir = temp_dir("access-check");
    let file = dir.join("drover.toml");
    std::fs::write(
        &file,
        "[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:1\"]\n\
         access_log = { format = \"json\", path = \"/nonexistent-dir/web.log\" }\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(common::bin())
        .args(["check", "-c", file.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let place = format!("{}:4:40: balancer[0].access_log.path:", file.display());
    assert!(stderr.contains(&place), "{place} not in {stderr}");
    assert!(
        stderr.contains("cannot open /nonexistent-dir/web.log for append"),
        "{stderr}"
    );
}

/// A log whose writer cannot write (a FIFO nobody reads: the pipe fills, and the writer
/// blocks in `write`) costs lines, counted, and never a request: every request is
/// answered at once. Once the FIFO is read, the lines written and the lines dropped add
/// up to the requests answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_writer_drops_and_counts_lines_and_requests_go_on() {
    let dir = temp_dir("access-fifo");
    let fifo = dir.join("access.fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    // Read and write, so opening never blocks and drover's open for append finds a
    // reader; nothing reads it until the test says so.
    let pipe = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let backend = Backend::start().await;
    let d = logging_proxy(
        &[backend.addr()],
        "json",
        &fifo,
        &["--admin", "127.0.0.1:0"],
    )
    .await;
    let admin = admin_addr(&d).await;
    // Lines of about 15 KB (a long target and User-Agent) fill the 8 MiB buffer after
    // some 550 requests.
    let target = format!("/status/200?{}", "t".repeat(7000));
    let agent = "a".repeat(8000);
    let requests = 1000;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let started = std::time::Instant::now();
    for _ in 0..requests {
        let r = c
            .request("GET", &target, &[("user-agent", &agent)], None)
            .await
            .unwrap();
        assert_eq!(r.status, 200);
    }
    let took = started.elapsed();
    let dropped = default_metric(admin, "drover_access_log_dropped_total").await as usize;
    assert!(
        (300..requests).contains(&dropped),
        "{dropped} of {requests} lines dropped"
    );

    // Now read the FIFO: what waits is written, and nothing more is lost.
    let lines = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&lines);
    std::thread::spawn(move || {
        use std::io::Read;
        let mut pipe = pipe;
        let mut buf = vec![0; 1 << 16];
        // Ends with the test: the test's own descriptor keeps a writer open.
        while let Ok(n) = pipe.read(&mut buf) {
            let newlines = buf[..n].iter().filter(|&&b| b == b'\n').count();
            counted.fetch_add(newlines, Ordering::Relaxed);
        }
    });
    d.signal("TERM").unwrap();
    assert!(d
        .wait_exit(Duration::from_secs(15))
        .await
        .unwrap()
        .success());
    wait_until_async(Duration::from_secs(5), || async {
        lines.load(Ordering::Relaxed) + dropped == requests
    })
    .await;
    eprintln!(
        "{requests} requests in {took:?}, {} lines written, {dropped} dropped",
        lines.load(Ordering::Relaxed)
    );
}

/// A reload that changes a balancer's access log applies from the next request: the old
/// log keeps what it had, the new one gets the rest, each in its own format.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_moves_the_log() {
    let dir = temp_dir("access-reload");
    let (first, second) = (dir.join("first.jsonl"), dir.join("second.log"));
    let backend = Backend::start().await;
    let file = dir.join("drover.toml");
    let config = |log: &str| {
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"{}\"]\naccess_log = {log}\n",
            backend.addr()
        )
    };
    let json = format!("{{ format = \"json\", path = \"{}\" }}", first.display());
    std::fs::write(&file, config(&json)).unwrap();
    let d = DroverProcess::spawn(
        common::bin(),
        &["proxy", "--config", file.to_str().unwrap()],
    )
    .await;
    let admin = admin_addr(&d).await;
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..3 {
        assert_eq!(c.get("/status/200").await.status, 200);
    }
    let combined = format!(
        "{{ format = \"combined\", path = \"{}\" }}",
        second.display()
    );
    std::fs::write(&file, config(&combined)).unwrap();
    let (code, _, err) = common::ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}");
    for _ in 0..2 {
        assert_eq!(c.get("/status/201").await.status, 201);
    }
    let second_lines = stop_and_read(d, &second).await;
    let first_lines = read_lines(&first);
    assert_eq!(first_lines.len(), 3, "{first_lines:#?}");
    assert!(first_lines.iter().all(|l| l.starts_with('{')));
    assert_eq!(second_lines.len(), 2, "{second_lines:#?}");
    assert!(second_lines
        .iter()
        .all(|l| parse_combined(l).request == "GET /status/201 HTTP/1.1"));
}
