//! `GET /metrics` read by Prometheus's own parser (the Python client library, in both
//! the classic text format and OpenMetrics), and its counts checked against traffic the
//! test sent through a real `drover proxy` to real backends.

mod common;

use common::{admin_addr, bin};
use drover_testkit::{raw_exchange, wait_until_async, Backend, DroverProcess, HttpClient};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use tokio::io::AsyncWriteExt;

/// One parsed sample: name, labels, value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: serde_json::Map<String, Value>,
    value: f64,
}

struct Scrape {
    samples: Vec<Sample>,
    types: serde_json::Map<String, Value>,
}

impl Scrape {
    /// The sum of the samples named `name` whose labels include all of `labels`.
    fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).and_then(Value::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }

    fn has(&self, name: &str) -> bool {
        self.samples.iter().any(|s| s.name == name)
    }
}

/// A Python that has `prometheus_client` (pyenv's, or Debian's python3-prometheus-client).
fn python() -> &'static str {
    for py in ["python3", "/usr/bin/python3"] {
        let ok = std::process::Command::new(py)
            .args(["-c", "import prometheus_client"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return py;
        }
    }
    panic!("no python3 with prometheus_client: apt-get install python3-prometheus-client (scripts/test does)");
}

async fn parse(text: &str, format: &str) -> Scrape {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/metrics/parse.py");
    let mut child = tokio::process::Command::new(python())
        .arg(script)
        .arg(format)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(text.as_bytes()).await.unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    assert!(
        out.status.success(),
        "the {format} parser refused the scrape: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let samples = v["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| Sample {
            name: s[0].as_str().unwrap().to_string(),
            labels: s[1].as_object().unwrap().clone(),
            value: s[2].as_f64().unwrap(),
        })
        .collect();
    Scrape {
        samples,
        types: v["types"].as_object().unwrap().clone(),
    }
}

/// GET /metrics with `accept`: status, content type, body.
async fn scrape(admin: SocketAddr, accept: Option<&str>) -> (u16, String, String) {
    let mut c = HttpClient::connect(admin).await.unwrap();
    let headers: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
    let r = c.request("GET", "/metrics", &headers, None).await.unwrap();
    let ctype = r.header("content-type").unwrap_or_default().to_string();
    (r.status, ctype, r.text())
}

async fn get_status(addr: SocketAddr, path: &str) -> u16 {
    let mut c = HttpClient::connect(addr).await.unwrap();
    c.get(path).await.status
}

async fn proxy_with_admin(backends: &[SocketAddr], extra: &[&str]) -> (DroverProcess, SocketAddr) {
    let mut args: Vec<String> = [
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "2",
        "--name",
        "web",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for b in backends {
        args.extend(["--backend".to_string(), b.to_string()]);
    }
    args.extend(["--admin".to_string(), "127.0.0.1:0".to_string()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = DroverProcess::spawn(bin(), &args).await;
    let admin = admin_addr(&d).await;
    (d, admin)
}

#[tokio::test]
async fn counters_and_histograms_match_the_traffic_sent_in_both_formats() {
    let (a, b) = (
        Backend::named("a").start().await,
        Backend::named("b").start().await,
    );
    let (d, admin) = proxy_with_admin(&[a.addr(), b.addr()], &[]).await;

    // Known traffic: 40 × 200, 10 × 404, 3 × 503 from a backend (spread out, so no
    // endpoint is ejected for errors in a row), 2 slow 200s (300 ms), 1 bad request.
    for i in 0..40 {
        assert_eq!(get_status(d.addr(), "/").await, 200);
        if i % 10 == 0 && i < 30 {
            assert_eq!(get_status(d.addr(), "/status/503").await, 503);
        }
        if i % 4 == 0 {
            assert_eq!(get_status(d.addr(), "/status/404").await, 404);
        }
    }
    for _ in 0..2 {
        assert_eq!(get_status(d.addr(), "/delay/300").await, 200);
    }
    let refused = raw_exchange(
        d.addr(),
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    )
    .await
    .unwrap();
    assert!(
        refused.starts_with(b"HTTP/1.1 400"),
        "{}",
        String::from_utf8_lossy(&refused)
    );

    let (status, ctype, text) = scrape(admin, None).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(ctype, "text/plain; version=0.0.4; charset=utf-8");
    let (status, om_type, om_text) = scrape(
        admin,
        Some("application/openmetrics-text; version=1.0.0,text/plain;q=0.5"),
    )
    .await;
    assert_eq!(status, 200);
    assert!(
        om_type.starts_with("application/openmetrics-text"),
        "{om_type}"
    );
    assert!(om_text.ends_with("# EOF\n"));

    for (scrape, format) in [
        (parse(&text, "prometheus").await, "prometheus"),
        (parse(&om_text, "openmetrics").await, "openmetrics"),
    ] {
        let web = [("balancer", "web")];
        let req = "drover_requests_total";
        assert_eq!(scrape.sum(req, &web), 56.0, "{format}: 40 + 3 + 10 + 2 + 1");
        let resp = "drover_responses_total";
        assert_eq!(
            scrape.sum(resp, &[("balancer", "web"), ("code", "2xx")]),
            42.0,
            "{format}"
        );
        assert_eq!(
            scrape.sum(resp, &[("balancer", "web"), ("code", "4xx")]),
            11.0,
            "{format}: 10 + the 400"
        );
        assert_eq!(
            scrape.sum(resp, &[("balancer", "web"), ("code", "5xx")]),
            3.0,
            "{format}"
        );
        assert_eq!(scrape.sum("drover_errors_total", &web), 0.0, "{format}");

        // Per endpoint: what the backends answered (not drover's own 400), and each
        // backend's count is what it saw.
        let ep = "drover_endpoint_responses_total";
        assert_eq!(scrape.sum(ep, &[("code", "2xx")]), 42.0, "{format}");
        assert_eq!(scrape.sum(ep, &[("code", "4xx")]), 10.0, "{format}");
        assert_eq!(scrape.sum(ep, &[("code", "5xx")]), 3.0, "{format}");
        for backend in [&a, &b] {
            let addr = backend.addr().to_string();
            assert_eq!(
                scrape.sum(ep, &[("endpoint", &addr)]),
                backend.hits() as f64,
                "{format}: {addr}"
            );
        }

        // Histograms: 55 requests timed (the refused one has no duration), the two
        // slow ones above 0.25 s, and an endpoint histogram for each backend.
        let dur = "drover_request_duration_seconds";
        assert_eq!(scrape.sum(&format!("{dur}_count"), &web), 55.0, "{format}");
        let le = |v: &'static str| [("balancer", "web"), ("le", v)];
        assert_eq!(
            scrape.sum(&format!("{dur}_bucket"), &le("+Inf")),
            55.0,
            "{format}"
        );
        assert!(
            scrape.sum(&format!("{dur}_bucket"), &le("0.25")) <= 53.0,
            "{format}"
        );
        assert!(scrape.sum(&format!("{dur}_sum"), &web) >= 0.6, "{format}");
        let head = "drover_endpoint_response_head_seconds_count";
        assert_eq!(scrape.sum(head, &web), 55.0, "{format}");
        assert_eq!(
            scrape.sum("drover_endpoint_queue_wait_seconds_count", &web),
            55.0,
            "{format}"
        );
        assert!(scrape.sum("drover_endpoint_connect_seconds_count", &web) >= 1.0);
        assert_eq!(scrape.sum("drover_endpoint_up", &web), 2.0, "{format}");
        assert_eq!(
            scrape.sum("drover_endpoint_available", &web),
            2.0,
            "{format}"
        );
        assert_eq!(scrape.sum("drover_build_info", &[]), 1.0, "{format}");
        // Both parsers name a counter's family without `_total`.
        let family = "drover_request_duration_seconds";
        assert_eq!(
            scrape.types.get(family).and_then(Value::as_str),
            Some("histogram")
        );
        assert_eq!(
            scrape.types.get("drover_requests").and_then(Value::as_str),
            Some("counter")
        );
        // Labels come from configuration only: no path or client address anywhere.
        for s in &scrape.samples {
            for (k, v) in &s.labels {
                let v = v.as_str().unwrap_or_default();
                assert!(!v.contains("/status") && !v.contains("/delay"), "{k}={v}");
            }
        }
    }
    drop(d);
}

#[tokio::test]
async fn a_dead_backend_shows_as_retries_failures_and_an_ejection() {
    let live = Backend::named("live").start().await;
    let dead = dead_addr();
    let (d, admin) = proxy_with_admin(&[dead, live.addr()], &[]).await;
    for _ in 0..20 {
        assert_eq!(
            get_status(d.addr(), "/").await,
            200,
            "retried on the live one"
        );
    }
    let (_, _, text) = scrape(admin, None).await;
    let s = parse(&text, "prometheus").await;
    let dead = dead.to_string();
    assert!(
        s.sum("drover_retries_total", &[("cause", "connect-failed")]) >= 1.0,
        "{text}"
    );
    assert!(
        s.sum(
            "drover_endpoint_failures_total",
            &[("endpoint", &dead), ("cause", "connect-failed")]
        ) >= 1.0
    );
    assert!(
        s.sum(
            "drover_endpoint_ejections_total",
            &[("endpoint", &dead), ("reason", "connect-failures")]
        ) >= 1.0
    );
    assert_eq!(
        s.sum("drover_endpoint_available", &[("endpoint", &dead)]),
        0.0
    );
    assert_eq!(s.sum("drover_responses_total", &[("code", "2xx")]), 20.0);
    assert_eq!(s.sum("drover_errors_total", &[]), 0.0);
    drop(d);
}

#[tokio::test]
async fn drovers_own_errors_are_counted_by_cause() {
    // No backend answers at all: every request gets drover's 502 or 503.
    let dead = dead_addr();
    let (d, admin) = proxy_with_admin(&[dead], &[]).await;
    for _ in 0..5 {
        let status = get_status(d.addr(), "/").await;
        assert!(status == 502 || status == 503, "{status}");
    }
    let (_, _, text) = scrape(admin, None).await;
    let s = parse(&text, "prometheus").await;
    let errors = s.sum("drover_errors_total", &[("balancer", "web")]);
    assert_eq!(errors, 5.0, "{text}");
    assert_eq!(
        s.sum("drover_errors_total", &[("cause", "connect-failed")])
            + s.sum("drover_errors_total", &[("cause", "no-healthy-endpoint")]),
        5.0
    );
    assert_eq!(s.sum("drover_responses_total", &[("code", "5xx")]), 5.0);
    assert_eq!(s.sum("drover_request_duration_seconds_count", &[]), 5.0);
    drop(d);
}

#[tokio::test]
async fn metrics_refuses_what_it_does_not_serve_and_keeps_the_token_rule() {
    let be = Backend::named("a").start().await;
    let (d, admin) = proxy_with_admin(&[be.addr()], &["--admin-token", "s3cret"]).await;
    let (status, _, body) = scrape(admin, None).await;
    assert_eq!(status, 401, "{body}");
    let mut c = HttpClient::connect(admin).await.unwrap();
    let auth = [("authorization", "Bearer s3cret")];
    let r = c.request("GET", "/metrics", &auth, None).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(parse(&r.text(), "prometheus")
        .await
        .has("drover_requests_total"));
    let r = c
        .request("POST", "/metrics", &auth, Some(b""))
        .await
        .unwrap();
    assert_eq!(r.status, 405);
    assert_eq!(r.header("allow"), Some("GET"));
    let r = c
        .request("GET", "/metrics?name=x", &auth, None)
        .await
        .unwrap();
    assert_eq!(r.status, 400);
    assert!(r.text().contains("name"), "{}", r.text());
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_show_their_restarts_by_reason_exit_signal_memory_and_cpu() {
    let dir = common::temp_dir("metrics-workers");
    let script = drover_testkit::write_py_worker(&dir).display().to_string();
    let d = DroverProcess::spawn(
        bin(),
        &[
            "run",
            "-w",
            "2",
            "--listen",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--",
            "python3",
            &script,
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    /// Both workers ready, and worker 1's pid (when `not` is given, another than it).
    async fn ready_worker_1(admin: SocketAddr, not: Option<u32>) -> Option<u32> {
        let s = common::status(admin).await;
        let workers = &s.apps[0].workers;
        let ready = workers.iter().filter(|w| w.state == "ready").count() == 2;
        let pid = workers[1].pid;
        (ready && pid.is_some() && pid != not).then_some(pid?)
    }
    let limit = std::time::Duration::from_secs(10);
    let up = || async { ready_worker_1(admin, None).await.is_some() };
    assert!(wait_until_async(limit, up).await, "{}", d.stderr_text());
    let victim = ready_worker_1(admin, None).await.unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &victim.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    // Back to two ready workers, the killed one replaced.
    let back = || async { ready_worker_1(admin, Some(victim)).await.is_some() };
    assert!(wait_until_async(limit, back).await, "{}", d.stderr_text());

    let (_, _, text) = scrape(admin, None).await;
    let (_, _, om) = scrape(admin, Some("application/openmetrics-text")).await;
    parse(&om, "openmetrics").await;
    let s = parse(&text, "prometheus").await;
    let w1 = [("worker", "1"), ("reason", "signal")];
    assert_eq!(s.sum("drover_worker_restarts_total", &w1), 1.0, "{text}");
    assert_eq!(
        s.sum("drover_worker_restarts_total", &[("worker", "0")]),
        0.0,
        "{text}"
    );
    assert_eq!(s.sum("drover_worker_last_signal", &[("worker", "1")]), 9.0);
    assert_eq!(s.sum("drover_worker_up", &[]), 2.0);
    for w in ["0", "1"] {
        assert!(s.sum("drover_worker_resident_memory_bytes", &[("worker", w)]) > 1e6);
        assert!(s.has("drover_worker_cpu_seconds_total"));
        assert!(s.sum("drover_worker_start_time_seconds", &[("worker", w)]) > 1.6e9);
    }
    drop(d);
}

/// An address nothing listens at. A port from `bind(0)`, let go, could be handed to the
/// next `bind(0)` (another test's drover, whose answers and counts then mixed with
/// this one's in CI); `free_port` draws below the range `bind(0)` hands out.
fn dead_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], drover_testkit::free_port()))
}
