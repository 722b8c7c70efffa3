//! HTTP/2 and gRPC to backends (`backend_protocol = "h2c"`, `drover proxy
//! --backend-protocol h2c`) through real processes: Node's `http2` servers (which take
//! no HTTP/1.1 at all) and `@grpc/grpc-js` servers, driven by Node's `http2` client and
//! grpc-js's client over one connection each, and by HTTP/1.1 clients. Each request is
//! a stream of drover's own connection to the backend it picked, so one client
//! connection's requests spread over every backend, a slow backend gets fewer of them,
//! trailers pass both ways (gRPC's status rides there), a server-streaming call
//! arrives whole, and drover keeps one connection per backend. Active health checks
//! speak HTTP/2 too. An Upgrade, which HTTP/2 cannot carry, is refused with 501; the
//! settings that cannot go together are refused naming why.

mod common;

use common::pki::{far_future, Pki};
use common::{admin_addr, bin, proxy, status};
use drover_testkit::{raw_exchange, wait_until, HttpClient};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::{Child, Command};

fn fixture(dir: &str, file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir)
        .join(file)
}

/// A Node server of the fixtures, started with `args`, and the port it printed.
async fn node_server(script: &Path, args: &[&str]) -> (Child, SocketAddr) {
    let mut cmd = Command::new("node");
    cmd.arg(script).args(args);
    common::node_listening(cmd).await
}

/// Runs a fixture client and parses the JSON it prints.
async fn node_client(script: &Path, args: &[&str]) -> serde_json::Value {
    node_client_within(script, args, "20000").await
}

/// `node_client`, each call with a deadline of `deadline_ms`.
async fn node_client_within(script: &Path, args: &[&str], deadline_ms: &str) -> serde_json::Value {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        Command::new("node")
            .arg(script)
            .args(args)
            .env("DEADLINE_MS", deadline_ms)
            .output(),
    )
    .await
    .expect("the client did not finish in time")
    .expect("node");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// `drover proxy --h2c --backend-protocol h2c` over `backends`, plus `extra`.
async fn h2c_proxy(backends: &[SocketAddr], extra: &[&str]) -> drover_testkit::DroverProcess {
    let mut args = vec!["--h2c", "--backend-protocol", "h2c", "--slow-start", "0s"];
    args.extend_from_slice(extra);
    proxy(backends, &args).await
}

/// Three Node http2 servers named A, B and C.
async fn h2c_backends() -> Vec<(Child, SocketAddr)> {
    let script = fixture("http2", "h2c_backend.js");
    let mut all = Vec::new();
    for name in ["A", "B", "C"] {
        all.push(node_server(&script, &[name]).await);
    }
    all
}

/// The gRPC calls of a client's answers that did not end OK.
fn failed_calls(answers: &serde_json::Value) -> Vec<&serde_json::Value> {
    answers
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["code"] != 0)
        .collect()
}

/// Three gRPC servers named G1, G2 and G3, each taking `delay_ms` a unary call, and
/// their addresses.
async fn grpc_backends(delay_ms: &str) -> (Vec<(Child, SocketAddr)>, Vec<SocketAddr>) {
    let server = fixture("grpc", "server.js");
    let mut servers = Vec::new();
    for name in ["G1", "G2", "G3"] {
        servers.push(node_server(&server, &[name, delay_ms]).await);
    }
    let addrs = servers.iter().map(|s| s.1).collect();
    (servers, addrs)
}

/// Answers counted by the backend that gave them.
fn by_backend(answers: &serde_json::Value, field: &str) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for a in answers.as_array().unwrap() {
        let name = a[field].as_str().unwrap_or("-").to_owned();
        *counts.entry(name).or_default() += 1;
    }
    counts
}

#[tokio::test]
async fn each_stream_of_one_connection_is_placed_and_trailers_pass_both_ways() {
    let servers = h2c_backends().await;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.1).collect();
    let d = h2c_proxy(&addrs, &[]).await;
    let url = format!("http://{}", d.addr());
    let client = fixture("http2", "client.js");

    // 60 requests at once on one HTTP/2 connection: every backend takes some.
    let answers = node_client(&client, &[&url, "60", "/"]).await;
    let counts = by_backend(&answers, "backend");
    assert_eq!(
        counts.keys().collect::<Vec<_>>(),
        ["A", "B", "C"],
        "{answers}"
    );
    for a in answers.as_array().unwrap() {
        assert_eq!(a["status"], 200, "{a}");
        assert_eq!(a["body"], a["backend"], "{a}");
    }

    // Response trailers reach an HTTP/2 client as trailers...
    let answers = node_client(&client, &[&url, "1", "/trailers"]).await;
    let a = &answers[0];
    assert!(a["body"].as_str().unwrap().starts_with("body from "), "{a}");
    assert_eq!(a["trailers"]["x-checksum"], "abc123", "{a}");
    assert_eq!(a["trailers"]["grpc-status"], "0", "{a}");
    // ...and an HTTP/1.1 client as the chunked body's trailer section.
    let raw = raw_exchange(
        d.addr(),
        b"GET /trailers HTTP/1.1\r\nHost: t\r\nTE: trailers\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let raw = String::from_utf8_lossy(&raw).to_ascii_lowercase();
    assert!(raw.contains("transfer-encoding: chunked"), "{raw}");
    assert!(
        raw.contains("\r\n0\r\nx-checksum: abc123\r\ngrpc-status: 0\r\n\r\n"),
        "{raw}"
    );

    // A request body with trailers, from an HTTP/2 client: the backend gets both.
    let answers = node_client(&client, &[&url, "1", "/echo", "POST", "hello, backend"]).await;
    let echo: serde_json::Value =
        serde_json::from_str(answers[0]["body"].as_str().unwrap()).unwrap();
    assert_eq!(echo["length"], 14, "{echo}");
    assert_eq!(echo["trailers"]["x-sum"], "14", "{echo}");
    assert_eq!(echo["te"], "trailers", "{echo}");

    // HTTP/1.1 clients' bodies, by length and chunked.
    let mut h1 = HttpClient::connect(d.addr()).await.unwrap();
    let r = h1
        .request(
            "POST",
            "/echo",
            &[("host", "api.test")],
            Some(&[7u8; 100_000]),
        )
        .await
        .unwrap();
    let echo: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    assert_eq!(
        (echo["length"].as_u64(), echo["authority"].as_str()),
        (Some(100_000), Some("api.test"))
    );
    let r = h1
        .request(
            "POST",
            "/echo",
            &[("transfer-encoding", "chunked")],
            Some(b"5\r\nhello\r\n6\r\n world\r\n0\r\nx-sum: 11\r\n\r\n"),
        )
        .await
        .unwrap();
    let echo: serde_json::Value = serde_json::from_str(&r.text()).unwrap();
    assert_eq!(echo["length"], 11, "{echo}");
    assert_eq!(echo["trailers"]["x-sum"], "11", "{echo}");

    // A WebSocket cannot ride an HTTP/2 stream: refused, not left waiting for a 101.
    let r = h1
        .request(
            "GET",
            "/ws",
            &[
                ("connection", "Upgrade"),
                ("upgrade", "websocket"),
                ("sec-websocket-version", "13"),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="),
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 501);
    assert_eq!(r.header("drover-error"), Some("upgrade-over-http2"));

    // One connection per backend carried all of it (one serving thread).
    let mut sessions = 0;
    for (_, addr) in &servers {
        let count = node_client(&client, &[&format!("http://{addr}"), "1", "/count"]).await;
        let count: serde_json::Value =
            serde_json::from_str(count[0]["body"].as_str().unwrap()).unwrap();
        // This count's own connection is one.
        sessions += count["sessions"].as_u64().unwrap() - 1;
    }
    assert_eq!(sessions, 3, "drover opened more connections than backends");
}

/// A watch (a server-streaming call that sends when it has news) and a unary call that
/// takes its time both outlast the request timeout: a gRPC client sets its own deadline,
/// and a call cut at drover's timeout broke apps that run without it (see streams.rs).
#[tokio::test]
async fn grpc_calls_quiet_past_the_request_timeout_arrive_whole() {
    let server = fixture("grpc", "server.js");
    let client = fixture("grpc", "client.js");
    let (_g, addr) = node_server(&server, &["G1", "1500"]).await;
    let d = h2c_proxy(&[addr], &["--request-timeout", "1s"]).await;
    let target = d.addr().to_string();
    let (tick, name) = ([&target, "Tick", "3"], [&target, "Name", "1"]);
    let (watch, unary) = tokio::join!(node_client(&client, &tick), node_client(&client, &name));
    let got = watch[0]["got"].as_array().unwrap();
    assert_eq!(
        (watch[0]["code"].as_i64(), got.len()),
        (Some(0), 3),
        "{watch}"
    );
    assert_eq!(unary[0]["code"], 0, "{unary}");
    assert_eq!(unary[0]["reply"], "G1", "{unary}");
}

#[tokio::test]
async fn grpc_calls_on_one_channel_spread_by_load_and_keep_their_status() {
    let server = fixture("grpc", "server.js");
    let client = fixture("grpc", "client.js");
    // G1 takes 300 ms a call; G2 and G3 answer at once.
    let mut servers = vec![node_server(&server, &["G1", "300"]).await];
    for name in ["G2", "G3"] {
        servers.push(node_server(&server, &[name]).await);
    }
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.1).collect();
    let d = h2c_proxy(&addrs, &[]).await;
    let target = d.addr().to_string();

    // 300 calls, 12 at a time, on one channel: an L4 balancer would send them all to
    // one backend; drover places each, and the slow one has calls in flight longest.
    let answers = node_client(&client, &[&target, "Name", "300", "12"]).await;
    for a in answers.as_array().unwrap() {
        assert_eq!(a["code"], 0, "{a}");
    }
    let counts = by_backend(&answers, "reply");
    assert_eq!(counts.values().sum::<usize>(), 300, "{counts:?}");
    eprintln!("calls by backend: {counts:?}");
    let slow = counts.get("G1").copied().unwrap_or(0);
    for fast in ["G2", "G3"] {
        let n = counts.get(fast).copied().unwrap_or(0);
        assert!(
            n > slow,
            "the slow backend got {slow}, {fast} {n}: {counts:?}"
        );
    }

    // A failed call's status and message come through (trailers-only answer).
    let answers = node_client(&client, &[&target, "Fail", "1"]).await;
    assert_eq!(answers[0]["code"], 5, "{answers}");
    assert!(
        answers[0]["details"]
            .as_str()
            .unwrap()
            .starts_with("no such thing on G"),
        "{answers}"
    );
    // A server-streaming call arrives whole, from one backend, with its OK status.
    let answers = node_client(&client, &[&target, "Count", "50"]).await;
    let got = answers[0]["got"].as_array().unwrap();
    assert_eq!(
        (answers[0]["code"].as_i64(), got.len()),
        (Some(0), 50),
        "{answers}"
    );
    let from = got[0]
        .as_str()
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_owned();
    assert!(got.iter().all(|m| m.as_str().unwrap().starts_with(&from)));
}

#[tokio::test]
async fn health_checks_speak_http2_to_the_backends() {
    let mut servers = h2c_backends().await;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.1).collect();
    let d = h2c_proxy(
        &addrs,
        &[
            "--admin",
            "127.0.0.1:0",
            "--health-path",
            "/health",
            "--health-interval",
            "200ms",
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    let healthy = |s: &drover_admin::Status| {
        s.balancers[0]
            .endpoints
            .iter()
            .filter(|e| e.healthy)
            .count()
    };
    // Node's http2 server answers no HTTP/1.1 probe: these pass over HTTP/2.
    let mut seen = 0;
    for _ in 0..50 {
        seen = healthy(&status(admin).await);
        if seen == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(seen, 3, "{}", d.stderr_text());
    // `ctl status` says what the balancer speaks to its backends.
    assert_eq!(status(admin).await.balancers[0].backend_protocol, "h2c");
    let (_, table, _) = common::ctl(admin, &["status"]).await;
    assert!(table.contains(", h2c to backends)"), "{table}");
    // One backend stops: its probes fail, and requests go to the other two.
    let (mut stopped, gone) = servers.remove(0);
    stopped.kill().await.unwrap();
    let mut down = false;
    for _ in 0..50 {
        let s = status(admin).await;
        let e = s.balancers[0]
            .endpoints
            .iter()
            .find(|e| e.addr == gone.to_string());
        if e.is_some_and(|e| !e.healthy) {
            down = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(down, "the stopped backend stayed healthy");
    let answers = node_client(
        &fixture("http2", "client.js"),
        &[&format!("http://{}", d.addr()), "20", "/"],
    )
    .await;
    let counts = by_backend(&answers, "backend");
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["B", "C"], "{answers}");
    // One connection to each backend that took requests (the probes' own are not
    // counted).
    let metrics = common::metrics_text(admin).await;
    let opened = metrics
        .lines()
        .find(|l| l.starts_with("drover_backend_http2_connections_total{"))
        .unwrap_or_else(|| panic!("{metrics}"));
    assert!(opened.ends_with(" 2"), "{opened}");
}

#[tokio::test]
async fn a_bidirectional_grpc_call_runs_both_ways_at_once() {
    let client = fixture("grpc", "client.js");
    let (_servers, addrs) = grpc_backends("0").await;
    let d = h2c_proxy(&addrs, &[]).await;
    // Each message goes only once the reply to the one before has come back: a proxy
    // that reads the request to its end before answering stalls until the deadline.
    for _ in 0..3 {
        let answers = node_client(&client, &[&d.addr().to_string(), "Chat", "20"]).await;
        let a = &answers[0];
        assert_eq!(a["code"], 0, "{a}\n{}", d.stderr_text());
        let got: Vec<&str> = a["got"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_str().unwrap())
            .collect();
        assert_eq!(got.len(), 20, "{a}");
        let from = got[0].split(':').next().unwrap();
        for (i, m) in got.iter().enumerate() {
            assert_eq!(*m, format!("{from}:{}", i + 1), "{a}");
        }
    }
}

#[tokio::test]
async fn a_grpc_backend_that_stops_gracefully_under_load_fails_no_call() {
    let client = fixture("grpc", "client.js");
    let (mut servers, addrs) = grpc_backends("2").await;
    let d = h2c_proxy(&addrs, &[]).await;
    let target = d.addr().to_string();
    // 1,500 calls, 8 at a time, on one channel; G1 stops (SIGTERM: GOAWAY, then it
    // finishes what it took and exits) once it has taken calls, as a deploy stops a
    // server. (Not after a fixed time: on a busy machine the client had not started
    // calling 800 ms in, and G1 took none.)
    let load = tokio::spawn({
        let (client, target) = (client.clone(), target.clone());
        async move { node_client(&client, &[&target, "Name", "1500", "8"]).await }
    });
    let (client_ref, g1) = (&client, &addrs[0].to_string());
    let g1_took_calls = drover_testkit::wait_until_async(Duration::from_secs(20), || async move {
        node_client(client_ref, &[g1, "Calls", "1"]).await[0]["reply"] != "0"
    })
    .await;
    assert!(g1_took_calls, "G1 took no call");
    let pid = servers[0].0.id().unwrap();
    let term = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(term.success());
    let answers = load.await.unwrap();
    let failed = failed_calls(&answers);
    let counts = by_backend(&answers, "reply");
    assert!(failed.is_empty(), "{} failed: {failed:?}", failed.len());
    assert!(counts.get("G1").is_some_and(|&n| n > 0), "{counts:?}");
    let exited = tokio::time::timeout(Duration::from_secs(10), servers[0].0.wait()).await;
    assert!(exited.is_ok(), "G1 did not stop");
    eprintln!("calls by backend: {counts:?}");
}

#[tokio::test]
async fn reloads_under_grpc_load_fail_no_call() {
    let server = fixture("grpc", "server.js");
    let client = fixture("grpc", "client.js");
    let mut servers = Vec::new();
    for name in ["G1", "G2", "G3"] {
        servers.push(node_server(&server, &[name, "2"]).await);
    }
    let toml = |backends: &[SocketAddr]| {
        let list: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[balancer]]\nname = \"grpc\"\nlisten = \"127.0.0.1:0\"\nbackends = [{}]\nh2c = true\nbackend_protocol = \"h2c\"\nslow_start = \"0s\"\n",
            list.join(", ")
        )
    };
    let dir = common::temp_dir("backend-http2-reload");
    let first = [servers[0].1, servers[1].1];
    let (d, addr, admin, path) = common::proxy_config(&dir, &toml(&first), "grpc").await;
    let load = tokio::spawn({
        let (client, target) = (client.clone(), addr.to_string());
        async move { node_client(&client, &[&target, "Name", "1500", "8"]).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // G3 joins, then G1 leaves: each reload starts new connections to the backends.
    let all = [servers[0].1, servers[1].1, servers[2].1];
    let last = [servers[1].1, servers[2].1];
    for backends in [&all[..], &last[..]] {
        std::fs::write(&path, toml(backends)).unwrap();
        let (code, out, err) = common::ctl(admin, &["reload"]).await;
        assert_eq!(code, 0, "{out}{err}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let answers = load.await.unwrap();
    let failed = failed_calls(&answers);
    assert!(
        failed.is_empty(),
        "{} failed: {failed:?}\n{}",
        failed.len(),
        d.stderr_text()
    );
    let counts = by_backend(&answers, "reply");
    assert!(counts.get("G3").is_some_and(|&n| n > 0), "{counts:?}");
    eprintln!("calls by backend: {counts:?}");
}

#[tokio::test]
async fn grpc_health_checks_take_a_backend_that_is_not_serving_out() {
    let client = fixture("grpc", "client.js");
    let (_servers, addrs) = grpc_backends("0").await;
    let d = h2c_proxy(
        &addrs,
        &[
            "--admin",
            "127.0.0.1:0",
            "--health-grpc",
            "--health-interval",
            "200ms",
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    let endpoint = |s: &drover_admin::Status, addr: SocketAddr| {
        s.balancers[0]
            .endpoints
            .iter()
            .find(|e| e.addr == addr.to_string())
            .cloned()
            .unwrap()
    };
    let mut healthy = 0;
    for _ in 0..50 {
        let s = status(admin).await;
        healthy = addrs.iter().filter(|a| endpoint(&s, **a).healthy).count();
        if healthy == 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(healthy, 3, "{}", d.stderr_text());
    // G1's health service turns NOT_SERVING (asked directly, not through drover).
    let sick = node_client(&client, &[&addrs[0].to_string(), "Sick", "1"]).await;
    assert_eq!(sick[0]["reply"], "sick", "{sick}");
    let mut why = None;
    for _ in 0..50 {
        let e = endpoint(&status(admin).await, addrs[0]);
        if !e.healthy {
            why = e.check_error;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let why = why.expect("the backend that is not serving stayed in rotation");
    assert!(why.contains("NOT_SERVING"), "{why}");
    let answers = node_client(&client, &[&d.addr().to_string(), "Name", "30", "6"]).await;
    let counts = by_backend(&answers, "reply");
    assert_eq!(counts.keys().collect::<Vec<_>>(), ["G2", "G3"], "{answers}");
}

#[tokio::test]
async fn http2_over_tls_to_the_backends_is_agreed_by_alpn() {
    let pki = Pki::new("backend-h2");
    let (cert, key) = pki.leaf("backend", "backend", &["127.0.0.1"], far_future());
    let script = fixture("http2", "h2c_backend.js");
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let (_h2, h2_addr) = node_server(&script, &["T", cert, key]).await;
    let (_h1, h1_addr) = node_server(&script, &["H1", cert, key, "http1"]).await;
    let ca = pki.ca_pem.to_str().unwrap();

    let flags = [
        "--backend-protocol",
        "h2",
        "--backend-ca",
        ca,
        "--slow-start",
        "0s",
    ];
    let d = proxy(&[h2_addr], &flags).await;
    let mut client = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..3 {
        let r = client.get("/").await;
        assert_eq!((r.status, r.text()), (200, "T".to_owned()));
        assert_eq!(r.header("x-scheme"), Some("https"));
    }
    // A TLS backend that does not offer h2 by ALPN: nothing is sent, and it says why.
    let d = proxy(&[h1_addr], &flags).await;
    let r = HttpClient::connect(d.addr()).await.unwrap().get("/").await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(
        r.header("drover-error"),
        Some("backend-tls"),
        "{}",
        r.text()
    );
    assert!(r.text().contains("(no-alpn)"), "{}", r.text());
}

#[tokio::test]
async fn a_grpc_call_is_never_downgraded_to_http1() {
    let server = fixture("grpc", "server.js");
    let client = fixture("grpc", "client.js");
    let (_g, addr) = node_server(&server, &["G1"]).await;
    // An HTTP/2 front, HTTP/1.1 to the backend (the default backend_protocol).
    let d = proxy(&[addr], &["--h2c"]).await;
    let answers = node_client(&client, &[&d.addr().to_string(), "Name", "1"]).await;
    let a = &answers[0];
    // drover's reason reaches the client as gRPC's status (it read "Received HTTP
    // status code 502" before: gRPC seat #3).
    assert_eq!(a["code"], 14, "UNAVAILABLE: {a}");
    assert!(
        a["details"]
            .as_str()
            .unwrap()
            .contains("set backend_protocol = \"h2c\""),
        "{a}"
    );
    // The warning may reach drover's stderr after the answer reached the client.
    let warned = wait_until(Duration::from_secs(5), || {
        d.stderr_text().contains("backend_protocol = \"h2c\"")
    })
    .await;
    assert!(warned, "{}", d.stderr_text());
    // Nothing reached the backend.
    let calls = node_client(&client, &[&addr.to_string(), "Calls", "1"]).await;
    assert_eq!(calls[0]["reply"], "0", "{calls}");
    // An HTTP/1.1 client's gRPC-shaped request, the same.
    let r = HttpClient::connect(d.addr())
        .await
        .unwrap()
        .request(
            "POST",
            "/test.Echo/Name",
            &[("content-type", "application/grpc+proto")],
            Some(b"\0\0\0\0\0"),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.header("grpc-status"), Some("14"));
    assert_eq!(r.header("drover-error"), Some("grpc-over-http1"));
}

/// drover's own failures reach a gRPC client as gRPC statuses with drover's reason: a
/// backend that refuses connections is UNAVAILABLE, "... connect ...". Before, the
/// client read only "Received HTTP status code 502" (gRPC seat #3).
#[tokio::test]
async fn drovers_own_failures_reach_a_grpc_client_as_grpc_statuses() {
    let closed = SocketAddr::from(([127, 0, 0, 1], drover_testkit::free_port()));
    let d = h2c_proxy(&[closed], &[]).await;
    let client = fixture("grpc", "client.js");
    let answers = node_client(&client, &[&d.addr().to_string(), "Name", "1"]).await;
    let a = &answers[0];
    assert_eq!(a["code"], 14, "UNAVAILABLE: {a}");
    let details = a["details"].as_str().unwrap();
    assert!(
        details.contains("connect") && !details.contains("HTTP status code"),
        "{a}"
    );
}

/// `--backend-protocol h2c` without `--h2c`: the listener reads HTTP/1.1 only, so a
/// gRPC client's HTTP/2 fails. drover says why, in the log and in the refusal, naming
/// the flag. Before, every call failed with "Protocol error" and nothing was logged.
#[tokio::test]
async fn a_grpc_client_on_a_listener_without_h2c_is_told_to_pass_it() {
    let server = fixture("grpc", "server.js");
    let client = fixture("grpc", "client.js");
    let (_g, addr) = node_server(&server, &["G1"]).await;
    let d = proxy(&[addr], &["--backend-protocol", "h2c"]).await;
    let answers = node_client(&client, &[&d.addr().to_string(), "Name", "1"]).await;
    assert_eq!(answers[0]["code"], 14, "UNAVAILABLE: {answers}");
    let said = drover_testkit::wait_until(Duration::from_secs(10), || {
        d.stderr_text().contains("the client spoke HTTP/2 with prior knowledge (h2c: gRPC clients do on plain TCP), and this listener reads HTTP/1.1 only: pass --h2c")
    })
    .await;
    assert!(said, "{}", d.stderr_text());
    let reply = drover_testkit::raw_exchange_timeout(
        d.addr(),
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
        Duration::from_secs(10),
    )
    .await
    .unwrap();
    assert_eq!(drover_testkit::parse_status(&reply), Some(400));
    assert!(
        String::from_utf8_lossy(&reply).contains("pass --h2c"),
        "{}",
        String::from_utf8_lossy(&reply)
    );
}

#[tokio::test]
async fn grpc_calls_to_drover_run_workers_spread_per_call() {
    // A gRPC app as written: it binds 0.0.0.0:50051 whatever PORT says, and each of the
    // three workers thinks it has that port. One client channel (one HTTP/2 connection
    // to drover) makes every call; drover places each on a worker over its own HTTP/2
    // connection to it. Node's cluster module or PM2 would hand the channel's one
    // connection to one worker, and every call would go there.
    let server = fixture("grpc", "server.js");
    let client = fixture("grpc", "client.js");
    let d = drover_testkit::DroverProcess::spawn(
        bin(),
        &[
            "run",
            "-w",
            "3",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--h2c",
            "--backend-protocol",
            "h2c",
            // Each worker is ready once it answers the gRPC health service, asked over
            // HTTP/2 as the calls are (grpc-js closes an HTTP/1.1 probe at once).
            "--health-grpc",
            "--",
            "node",
            server.to_str().unwrap(),
            "",
            "20",
            "0.0.0.0:50051",
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    let target = d.addr().to_string();
    let answers = node_client(&client, &[&target, "Name", "300", "12"]).await;
    assert!(
        failed_calls(&answers).is_empty(),
        "{answers}\n{}",
        d.stderr_text()
    );
    let counts = by_backend(&answers, "reply");
    eprintln!("calls by worker: {counts:?}");
    for worker in ["worker0", "worker1", "worker2"] {
        let n = counts.get(worker).copied().unwrap_or(0);
        assert!(n >= 50, "{worker} took {n} of 300 calls: {counts:?}");
    }
    // Never handed over, however alike the calls: the balancer places each.
    let s = status(admin).await;
    assert_eq!(s.balancers[0].backend_protocol, "h2c", "{s:?}");
    assert_eq!(
        common::default_metric(admin, "drover_handoffs_total").await,
        0
    );

    // A rolling reload of the workers under calls fails none: each old worker takes no
    // new stream once its successor serves, and finishes those it has.
    let before = common::serving_pids(&status(admin).await);
    let calls = {
        let (client, target) = (client.clone(), target.clone());
        tokio::spawn(async move { node_client(&client, &[&target, "Name", "1500", "8"]).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (code, out, err) = common::ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let answers = calls.await.unwrap();
    assert!(
        failed_calls(&answers).is_empty(),
        "{:?}\n{}",
        failed_calls(&answers),
        d.stderr_text()
    );
    let after = common::serving_pids(&status(admin).await);
    assert!(
        before.iter().zip(&after).all(|(b, a)| b != a),
        "not every worker was replaced: {before:?} -> {after:?}"
    );

    // What cannot go with it is refused, naming why.
    let refused = |args: &[&str]| {
        let out = std::process::Command::new(bin())
            .args(["run", "--listen", "127.0.0.1:0"])
            .args(args)
            .args(["--", "node", "x.js"])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = refused(&["--backend-protocol", "h2"]);
    assert!(e.contains("use h2c"), "{e}");
    let e = refused(&["--backend-protocol", "h2c", "--mode", "handoff"]);
    assert!(e.contains("--mode handoff"), "{e}");
    let e = refused(&["--h2c", "--mode", "shared"]);
    assert!(e.contains("--mode shared"), "{e}");
    let e = refused(&["--health-grpc"]);
    assert!(
        e.contains("--health-grpc") && e.contains("--backend-protocol h2c"),
        "{e}"
    );
    let e = refused(&["--health-grpc", "--mode", "shared"]);
    assert!(e.contains("--mode shared"), "{e}");
}

/// A gRPC app run as PM2 runs it (`pm2 start server.js -i 2`), with none of drover's
/// HTTP/2 flags: its server is cleartext HTTP/2 (`http2.createServer` inside grpc-js),
/// which drover's preload says, so the balancer at the port it names hands each
/// connection to a worker unread, as Node's cluster module does, and every call
/// succeeds. Before, drover read the HTTP/2 preface as an HTTP/1.1 request and answered
/// 400. With `--backend-protocol h2c` (the test above) drover places each call.
#[tokio::test]
async fn a_grpc_app_with_no_http2_flags_is_handed_its_connections_as_under_pm2() {
    let server = fixture("grpc", "server.js");
    let client = fixture("grpc", "client.js");
    let port = drover_testkit::free_port();
    let at = format!("0.0.0.0:{port}");
    let mut cmd = std::process::Command::new(bin());
    cmd.args(["run", "-w", "2", "--admin", "127.0.0.1:0", "--", "node"])
        .arg(&server)
        .args(["", "5", &at]);
    for var in ["LISTEN_FDS", "LISTEN_PID", "DROVER_WORKER_ID", "PORT"] {
        cmd.env_remove(var);
    }
    let d = drover_testkit::spawn_ready_line(cmd, "\"default\" listening on ").await;
    assert_eq!(d.addr().port(), port, "{}", d.stderr_text());
    assert!(
        d.stderr_text()
            .contains("speaks cleartext HTTP/2 (http2.createServer)"),
        "{}",
        d.stderr_text()
    );
    let admin = admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    for _ in 0..4 {
        let target = format!("127.0.0.1:{port}");
        let answers = node_client(&client, &[&target, "Name", "20", "4"]).await;
        assert!(
            failed_calls(&answers).is_empty(),
            "{answers}\n{}",
            d.stderr_text()
        );
    }
    assert!(common::default_metric(admin, "drover_handoffs_total").await >= 4);
    d.signal("TERM").unwrap();
    assert!(d
        .wait_exit(Duration::from_secs(20))
        .await
        .is_some_and(|s| s.success()));
}

/// `drover up` of a gRPC app as written (2 workers of the fixture server bound to
/// 0.0.0.0:50051, each call `delay_ms`), with `health = { grpc = true }` probed every
/// 200 ms (`timeout`, 2 failures in a row), behind an h2c balancer with `balancer_extra`:
/// drover, its admin address and where clients call.
async fn grpc_app_up(
    tag: &str,
    delay_ms: u32,
    timeout: &str,
    balancer_extra: &str,
) -> (drover_testkit::DroverProcess, SocketAddr, String) {
    let server = fixture("grpc", "server.js");
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\
         [[app]]\nname = \"grpc\"\ncommand = [\"node\", \"{}\", \"\", \"{delay_ms}\", \"0.0.0.0:50051\"]\nworkers = 2\n\
         health = {{ grpc = true, interval = \"200ms\", timeout = \"{timeout}\", fall = 2 }}\n\
         [[balancer]]\nlisten = \"127.0.0.1:0\"\nh2c = true\nbackend_protocol = \"h2c\"\nbackends = [\"app:grpc\"]\n{balancer_extra}",
        server.display()
    );
    let (d, admin, _file) = common::up_serving(tag, &toml).await;
    let target = d.addr().to_string();
    (d, admin, target)
}

/// Waits (15 s at most) for the one restart of the app, then for its workers to serve
/// again: the restart's detail.
async fn the_one_restart(d: &drover_testkit::DroverProcess, admin: SocketAddr) -> String {
    let restarted = drover_testkit::wait_until_async(Duration::from_secs(15), || async {
        !common::restart_records(&status(admin).await).is_empty()
    })
    .await;
    assert!(restarted, "{}", d.stderr_text());
    common::wait_all_serving(d, admin).await;
    let records = common::restart_records(&status(admin).await);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0].reason, "health", "{records:?}");
    records[0].detail.clone().unwrap_or_default()
}

#[tokio::test]
async fn grpc_health_checks_of_an_apps_workers_speak_http2() {
    // drover up, a gRPC app behind a balancer that speaks h2c to it, and
    // `health = { grpc = true }`: readiness and liveness ask each worker's
    // grpc.health.v1.Health service over HTTP/2. A worker whose service turns
    // NOT_SERVING is restarted, with why; the other one is left alone.
    let client = fixture("grpc", "client.js");
    let (d, admin, target) = grpc_app_up("grpc-app-health", 0, "1s", "").await;
    let answers = node_client(&client, &[&target, "Name", "20", "2"]).await;
    assert!(failed_calls(&answers).is_empty(), "{answers}");
    assert!(common::restart_records(&status(admin).await).is_empty());

    // One worker's health service turns NOT_SERVING (through drover: whichever it is).
    let sick = node_client(&client, &[&target, "Sick", "1", "1"]).await;
    assert_eq!(sick[0]["reply"], "sick", "{sick}");
    let detail = the_one_restart(&d, admin).await;
    assert!(detail.contains("NOT_SERVING"), "{detail}");
    let answers = node_client(&client, &[&target, "Name", "20", "2"]).await;
    assert!(failed_calls(&answers).is_empty(), "{answers}");
    common::stops_cleanly(d).await;
}

#[tokio::test]
async fn a_grpc_worker_busy_with_a_burst_is_not_hung_and_an_endless_loop_is() {
    // A grpc-js worker runs every call that came in one read before any answer leaves,
    // so under a burst of CPU-heavy calls it completes nothing for seconds, longer than
    // its health checks wait: it is busy, and must not be restarted with all its calls.
    let client = fixture("grpc", "client.js");
    let (d, admin, target) = grpc_app_up(
        "grpc-app-busy",
        150,
        "500ms",
        "timeouts = { request = \"6s\" }\n",
    )
    .await;
    // One call first, timed on one worker only (a 150 ms timer): it must not make the
    // new calls look cheaper on the other (before, 39 of 40 went there).
    let first = node_client(&client, &[&target, "Name", "1"]).await;
    assert!(failed_calls(&first).is_empty(), "{first}");
    // 40 calls of 150 ms at once: about 3 s of work per worker, answered together.
    let answers = node_client(&client, &[&target, "Work", "40"]).await;
    assert!(
        failed_calls(&answers).is_empty(),
        "{:?}\n{}",
        failed_calls(&answers),
        d.stderr_text()
    );
    let counts = by_backend(&answers, "reply");
    for worker in ["worker0", "worker1"] {
        let n = counts.get(worker).copied().unwrap_or(0);
        assert!(n >= 12, "{worker} took {n} of 40 calls: {counts:?}");
    }
    let records = common::restart_records(&status(admin).await);
    assert!(records.is_empty(), "{records:?}");

    // An endless loop is still found: its call ends at the request timeout (504, so
    // UNAVAILABLE or the like for the client), then the probes count, and the worker
    // is replaced as hung.
    let spun = node_client(&client, &[&target, "Spin", "1"]).await;
    assert_ne!(spun[0]["code"], 0, "{spun}");
    let detail = the_one_restart(&d, admin).await;
    assert!(detail.contains("hung"), "{detail}");
    let answers = node_client(&client, &[&target, "Name", "20", "2"]).await;
    assert!(failed_calls(&answers).is_empty(), "{answers}");
    common::stops_cleanly(d).await;
}

#[tokio::test]
async fn settings_that_cannot_go_with_http2_backends_are_refused() {
    let refused = |args: &[&str]| {
        let out = std::process::Command::new(bin())
            .args([
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--backend",
                "127.0.0.1:1",
            ])
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?} started");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let e = refused(&["--backend-protocol", "h2"]);
    assert!(
        e.contains("--backend-protocol h2") && e.contains("--backend-tls"),
        "{e}"
    );
    let e = refused(&["--backend-protocol", "h2c", "--backend-tls"]);
    assert!(e.contains("\"h2\""), "{e}");
    let e = refused(&["--backend-protocol", "h2c", "--send-proxy-protocol", "v2"]);
    assert!(e.contains("PROXY protocol"), "{e}");
    let e = refused(&["--backend-protocol", "h3"]);
    assert!(e.contains("h2c"), "{e}");
    let e = refused(&["--health-grpc"]);
    assert!(e.contains("--health-grpc") && e.contains("h2c"), "{e}");
    let e = refused(&["--backend-protocol", "h2c", "--tcp"]);
    assert!(
        e.contains("--backend-protocol does not apply to --tcp"),
        "{e}"
    );
}

/// A client that stops reading its server streams (24 of them on one connection, each
/// sending 2 MB) holds back its own streams only: another client's calls to the same
/// backend, on the one HTTP/2 connection each serving thread keeps to it, are answered
/// meanwhile, and the slow client reads everything once it reads again. Before, the
/// backend connection's window (4 MiB) filled with what 16 such streams held unread,
/// and every other call to that backend waited, here past its 3 s deadline (gRPC seat
/// #1; nginx, with a connection per call, answers them).
#[tokio::test]
async fn a_slow_reader_of_server_streams_holds_up_no_other_clients_call() {
    let (_backend, backend) = node_server(&fixture("grpc", "server.js"), &["A"]).await;
    let d = h2c_proxy(&[backend], &[]).await;
    let mut reader = Command::new("node")
        .arg(fixture("grpc", "slow-reader.js"))
        .args([&d.addr().to_string(), "24", "6000"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node");
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(reader.stdout.take().unwrap()).lines();
    let holding = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
    assert!(
        matches!(&holding, Ok(Ok(Some(l))) if l == "holding"),
        "{holding:?}"
    );
    // Its streams fill every window they can meanwhile.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let client = fixture("grpc", "client.js");
    let answers = node_client_within(&client, &[&d.addr().to_string(), "Name", "5"], "3000").await;
    assert!(
        failed_calls(&answers).is_empty(),
        "{answers}\n{}",
        d.stderr_text()
    );
    let read = tokio::time::timeout(Duration::from_secs(60), lines.next_line()).await;
    // 24 streams of 20 messages of 100,000 bytes, each with gRPC's 5-byte prefix.
    let all = 24 * 20 * (100_000 + 5);
    assert!(
        matches!(&read, Ok(Ok(Some(l))) if *l == format!("read {all}")),
        "{read:?}\n{}",
        d.stderr_text()
    );
}

/// A backend that allows 5 streams at once per connection (its
/// SETTINGS_MAX_CONCURRENT_STREAMS), with 5 watches (server-streaming calls) open on
/// it through drover: another client's calls are answered within their deadline, on a
/// second connection drover opens to the backend, and the watches all end whole.
/// Before, the calls waited on the one connection for a watch to end, here past their
/// 2 s deadline (gRPC seat #2; nginx, with a connection per call, answers them).
#[tokio::test]
async fn calls_past_a_backends_stream_cap_go_on_another_connection_to_it() {
    let mut server = Command::new("node");
    server
        .arg(fixture("grpc", "server.js"))
        .args(["A", "500"])
        .env("MAX_STREAMS", "5");
    let (_backend, backend) = common::node_listening(server).await;
    let d = h2c_proxy(&[backend], &[]).await;
    let addr = d.addr().to_string();
    let client = fixture("grpc", "client.js");
    // One call first: the backend's SETTINGS, and its cap, are known from then on.
    let first = node_client(&client, &[&addr, "Name", "1"]).await;
    assert!(failed_calls(&first).is_empty(), "{first}");
    let watches: Vec<_> = (0..5)
        .map(|_| {
            Command::new("node")
                .arg(&client)
                .args([&addr, "Tick", "8"])
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .expect("node")
        })
        .collect();
    let watches = tokio::spawn(async move {
        let mut all = Vec::new();
        for watch in watches {
            all.push(watch.wait_with_output().await.expect("node"));
        }
        all
    });
    // The watches open meanwhile (8 ticks 500 ms apart: 4 s each).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let answers = node_client_within(&client, &[&addr, "Name", "3"], "2000").await;
    assert!(
        failed_calls(&answers).is_empty(),
        "{answers}\n{}",
        d.stderr_text()
    );
    for watch in watches.await.unwrap() {
        let got: serde_json::Value = serde_json::from_slice(&watch.stdout).unwrap();
        assert_eq!(got[0]["code"], 0, "{got}");
        assert_eq!(got[0]["got"].as_array().map(Vec::len), Some(8), "{got}");
    }
}
