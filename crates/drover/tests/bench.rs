//! `drover bench` through the real binary against real backends: closed and open loop,
//! `--json`, `--html`, `--slo` exit codes, `compare`, coordinated omission, bad input.

mod common;

use common::{bin, temp_dir};
use drover_testkit::Backend;
use serde_json::Value;
use std::path::Path;
use std::process::Output;

async fn bench(args: &[&str]) -> Output {
    tokio::process::Command::new(bin())
        .arg("bench")
        .args(args)
        .output()
        .await
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {}\n{}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

fn url(b: &Backend, path: &str) -> String {
    format!("http://{}{path}", b.addr())
}

/// loadtest's `-n N --rps R` sends N requests however long that takes; so does
/// `drover bench -n N --rate R` without `-d` (it stopped at the default 10 s before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_with_no_duration_is_sent_in_full_past_ten_seconds() {
    let b = Backend::named("b0").start().await;
    let out = bench(&["--rate", "100", "-n", "1100", "--json", &url(&b, "/")]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json(&out);
    assert_eq!(r["requests"], 1100);
    assert!(
        r["elapsed_s"].as_f64().unwrap() > 10.0,
        "{}",
        r["elapsed_s"]
    );
    assert_eq!(r["duration_s"], r["elapsed_s"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closed_loop_sends_exactly_n_requests_and_reports_json() {
    let b = Backend::named("b0").start().await;
    let out = bench(&["-n", "300", "-c", "4", "--json", &url(&b, "/")]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json(&out);
    assert_eq!(r["mode"], "closed");
    assert_eq!(r["requests"], 300);
    assert_eq!(r["ok"], 300);
    assert_eq!(r["status"]["200"], 300);
    assert_eq!(r["errors_total"], 0);
    assert!(r["bytes"].as_u64().unwrap() > 300 * 20);
    let intervals = r["intervals"].as_array().unwrap();
    assert!(!intervals.is_empty());
    let per_second: u64 = intervals
        .iter()
        .map(|i| i["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(per_second, 300);
    assert!(intervals.iter().all(|i| i["target_rps"].is_null()));
    let l = &r["latency_us"];
    assert!(l["p50"].as_u64() <= l["p75"].as_u64() && l["p75"].as_u64() <= l["p99"].as_u64());
    assert!(!r["spectrum"].as_array().unwrap().is_empty());
    assert_eq!(b.hits(), 300);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_text_summary_html_and_met_slos() {
    let b = Backend::named("b0").start().await;
    let dir = temp_dir("bench-html");
    let html = dir.join("report.html");
    let out = bench(&[
        "--rps",
        "100",
        "-d",
        "2s",
        "--html",
        html.to_str().unwrap(),
        "--count-header",
        "x-backend",
        "--slo",
        "errors<1%",
        "--slo",
        "p99<5s",
        &url(&b, "/"),
    ])
    .await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    for needle in [
        "open loop at 100 req/s",
        "Latency distribution",
        "99.9%",
        "200 requests in",
        "Requests/sec:",
        "Transfer/sec:",
        "x-backend  b0: 200 (100.0%)",
        "SLO errors<1%",
        "SLO p99<5s",
    ] {
        assert!(stdout.contains(needle), "{needle:?} in:\n{stdout}");
    }
    assert!(!stdout.contains("BREACHED"), "{stdout}");
    // Not a terminal: no progress line.
    assert!(!text(&out.stderr).contains('\r'), "{}", text(&out.stderr));
    // The schedule has exactly 200 requests due in 2 s at 100 req/s.
    assert_eq!(b.hits(), 200);

    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!doctype html>"));
    assert!(page.contains("new uPlot("));
    assert!(page.contains("Responses per x-backend"));
    assert!(page.contains("<td>errors&lt;1%</td><td class=\"good\">met</td>"));
    assert_no_external_addresses(&page);
}

/// Every http:// or https:// in `page` names a loopback host: the page fetches nothing.
fn assert_no_external_addresses(page: &str) {
    for scheme in ["http://", "https://"] {
        for (at, _) in page.match_indices(scheme) {
            let host = &page[at + scheme.len()..];
            assert!(
                ["127.0.0.1", "localhost", "[::1]"]
                    .iter()
                    .any(|l| host.starts_with(l)),
                "external address in the report: {}",
                &page[at..(at + 60).min(page.len())]
            );
        }
    }
    assert!(
        !page.contains("<link") && !page.contains("src="),
        "no loaded resources"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breached_slo_exits_3_and_says_which() {
    let b = Backend::named("b0").start().await;
    let out = bench(&[
        "-n",
        "20",
        "-c",
        "2",
        "--slo",
        "p50<1ms",
        "--slo",
        "errors<=0%",
        &url(&b, "/delay/30"),
    ])
    .await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(3), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("SLO p50<1ms") && stdout.contains("BREACHED"),
        "{stdout}"
    );
    assert!(stdout.contains("SLO errors<=0%       met"), "{stdout}");

    // --json: the verdicts are in the JSON, the breach on stderr as well.
    let out = bench(&[
        "-n",
        "5",
        "-c",
        "1",
        "--json",
        "--slo",
        "p50<1ms",
        &url(&b, "/delay/30"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(3));
    let r = json(&out);
    assert_eq!(r["slo"][0]["slo"], "p50<1ms");
    assert_eq!(r["slo"][0]["met"], false);
    assert!(r["slo"][0]["actual"].as_f64().unwrap() >= 30_000.0);
    assert!(text(&out.stderr).contains("BREACHED"));
}

/// The backend stops answering for 500 ms once. Open loop at 200 req/s over one
/// connection: the ~100 requests due during the stall wait, and their latency counts
/// from when they were due, so the p99 shows the stall. Measured from when each was
/// written (what a closed-loop client sees), only the one stalled request is slow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_latency_counts_from_the_scheduled_time() {
    let b = Backend::named("b0").start().await;
    let out = bench(&[
        "--rate",
        "200",
        "-d",
        "3s",
        "-c",
        "1",
        "--json",
        &url(&b, "/stall-once/500"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json(&out);
    assert_eq!(r["requests"], 600);
    let p99 = r["latency_us"]["p99"].as_u64().unwrap();
    assert!(p99 >= 400_000, "p99 {p99} µs hides the stall");
    let service_p99 = r["service_us"]["p99"].as_u64().unwrap();
    assert!(service_p99 < 400_000, "service p99 {service_p99} µs");
    assert!(r["service_us"]["max"].as_u64().unwrap() >= 400_000);
    // The stall is in the first second's samples; the target rate is the schedule's.
    let first = &r["intervals"][0];
    assert!(first["p99_us"].as_u64().unwrap() >= 400_000, "{first}");
    assert_eq!(first["target_rps"], 200.0);
}

/// Open loop at a rate drover bench cannot reach (200,000 req/s from one thread of a
/// debug build): the run still ends within `-d` and `--timeout`, every scheduled request
/// is accounted for, and those whose timeout passed before a connection was free are
/// counted as never sent, apart from the server's timeouts. Before, each waited in a
/// task and timer of its own: `--rate 200000 -d 2s --timeout 1s` lasted 18 s, called
/// every unsent request a timeout, and reported a tenth of the rate served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_past_the_clients_reach_ends_on_time_and_counts_what_it_never_sent() {
    let b = Backend::named("b0").start().await;
    let out = bench(&[
        "--rate",
        "200000",
        "-d",
        "1s",
        "--timeout",
        "500ms",
        "-c",
        "16",
        "--json",
        &url(&b, "/"),
    ])
    .await;
    let r = json(&out);
    let (requests, errors) = (r["requests"].as_u64().unwrap(), &r["errors"]);
    let failed = r["errors_total"].as_u64().unwrap();
    assert_eq!(
        requests + failed,
        200_000,
        "every scheduled request: {errors}"
    );
    assert!(errors["unsent"].as_u64().unwrap() > 0, "{errors}");
    assert_eq!(errors["connect"], 0, "{errors}");
    let elapsed = r["elapsed_s"].as_f64().unwrap();
    // A bound on the run's length, as `-d` and `--timeout` promise; not a speed.
    assert!(elapsed < 1.0 + 0.5 + 2.0, "the run lasted {elapsed} s");
    let shown = text(
        &bench(&[
            "--rate",
            "200000",
            "-d",
            "1s",
            "--timeout",
            "500ms",
            &url(&b, "/"),
        ])
        .await
        .stdout,
    );
    assert!(
        shown.contains("never sent") && shown.contains("the server never saw them"),
        "{shown}"
    );
}

/// `--mix` reports each path's requests that got no response too. Before, a path whose
/// every request failed read "0 requests", as if it had not been asked for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_counts_each_paths_requests_without_a_response() {
    let b = Backend::named("b0").start().await;
    let target = url(&b, "/");
    let args = [
        "-n",
        "40",
        "-c",
        "2",
        "--mix",
        "1:/,1:/close",
        "--timeout",
        "2s",
    ];
    let out = bench(&[&args[..], &["--json", &target]].concat()).await;
    let r = json(&out);
    let (ok, closed) = (&r["paths"]["/"], &r["paths"]["/close"]);
    assert_eq!(closed["requests"], 0, "{r}");
    let failed = closed["without_response"].as_u64().unwrap();
    assert!(failed > 0, "{r}");
    assert_eq!(ok["without_response"], 0, "{r}");
    assert_eq!(ok["requests"].as_u64().unwrap() + failed, 40, "{r}");
    let shown = text(&bench(&[&args[..], &[&target[..]]].concat()).await.stdout);
    assert!(shown.contains("with no response)"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compare_tells_noise_from_a_slower_backend() {
    let fast = Backend::named("fast").start().await;
    let slow = Backend::named("slow").start().await;
    let dir = temp_dir("bench-compare");
    let (fast_url, slow_url) = (url(&fast, "/"), url(&slow, "/delay/20"));
    let args_a = ["-c", "2", "-d", "6s", "--json", &fast_url];
    let args_b = ["-c", "2", "-d", "6s", "--json", &slow_url];
    let (a, b) = tokio::join!(bench(&args_a), bench(&args_b));
    assert_eq!(a.status.code(), Some(0), "{}", text(&a.stderr));
    assert_eq!(b.status.code(), Some(0), "{}", text(&b.stderr));
    let (pa, pb) = (dir.join("a.json"), dir.join("b.json"));
    std::fs::write(&pa, &a.stdout).unwrap();
    std::fs::write(&pb, &b.stdout).unwrap();
    let (pa, pb) = (pa.to_str().unwrap(), pb.to_str().unwrap());

    let same = bench(&["compare", pa, pa]).await;
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stderr));
    let out = text(&same.stdout);
    assert!(out.contains("no difference beyond noise"), "{out}");

    let diff = bench(&["compare", pa, pb]).await;
    assert_eq!(diff.status.code(), Some(0), "{}", text(&diff.stderr));
    let out = text(&diff.stdout);
    assert!(out.contains("differences beyond noise: p50"), "{out}");
    let p50 = out.lines().find(|l| l.starts_with("p50")).unwrap();
    assert!(p50.ends_with("B is worse"), "{out}");
    assert!(out.contains("note: targets differ"), "{out}");

    // A run of another kind is refused, naming why.
    let mut open: Value = serde_json::from_slice(&b.stdout).unwrap();
    open["mode"] = "open".into();
    let po = dir.join("open.json");
    std::fs::write(&po, open.to_string()).unwrap();
    let out = bench(&["compare", pa, po.to_str().unwrap()]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("closed-loop run and B a open-loop"),
        "{}",
        text(&out.stderr)
    );
}

async fn refused(args: &[&str], code: i32, needle: &str) {
    let out = bench(args).await;
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
    assert!(
        stderr.contains(needle),
        "{args:?}: expected {needle:?} in: {stderr}"
    );
}

#[tokio::test]
async fn bad_flags_slos_and_files_are_named() {
    let dir = temp_dir("bench-bad");
    let junk = dir.join("junk.json");
    std::fs::write(&junk, "{\"requests\": 1}").unwrap();
    let junk = junk.to_str().unwrap();
    let missing = dir.join("missing.json");
    let missing = missing.to_str().unwrap();
    // Nothing listens on a port bound and dropped just now.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let closed = closed.to_string();
    let target = format!("http://{closed}/");

    refused(&["--slo", "p98<1ms", &target], 2, "unknown metric \"p98\"").await;
    refused(&["--slo", "p99<5", &target], 2, "with a unit").await;
    refused(&["--slo", "errors=1%", &target], 2, "no comparison").await;
    refused(&["--rate", "0", &target], 2, "--rate").await;
    refused(&["--rps", "fast", &target], 2, "--rate").await;
    refused(&["--rate", "-5", &target], 2, "must be a positive number").await;
    refused(&["-n", "0", &target], 2, "--requests must be at least 1").await;
    refused(&["-d", "0s", &target], 2, "--duration must be more than 0").await;
    refused(
        &["--timeout", "0s", &target],
        2,
        "--timeout must be more than 0",
    )
    .await;
    refused(&["-d", "soon", &target], 2, "invalid duration \"soon\"").await;
    refused(
        &["-d", "10", &target],
        2,
        "a number needs a unit, e.g. \"10s\"",
    )
    .await;
    refused(&["--mix", "0:/a", &target], 2, "weight must be at least 1").await;
    // https is a target like http; one nothing listens on fails before the run.
    refused(
        &["https://127.0.0.1:1/"],
        1,
        "cannot connect to 127.0.0.1:1",
    )
    .await;
    refused(&[], 2, "<URL>").await;
    refused(&["--admin-token", "t", &target], 2, "--admin").await;
    refused(&["compare", missing, junk], 2, "cannot read").await;
    refused(
        &["compare", junk, junk],
        2,
        "is not a `drover bench --json` report",
    )
    .await;
    refused(&["compare", junk], 2, "<B>").await;
    refused(&["-n", "3", "-c", "1", &target], 1, "no response at all").await;
    refused(
        &["-n", "3", "--admin", &closed, &target],
        1,
        &format!("--admin: cannot read http://{closed}/metrics"),
    )
    .await;
    refused(
        &["-n", "3", "--admin", "nowhere", &target],
        1,
        "--admin \"nowhere\"",
    )
    .await;
    let html_in_missing_dir = Path::new(missing).join("x/report.html");
    let fast = Backend::named("b0").start().await;
    refused(
        &[
            "-n",
            "3",
            "--html",
            html_in_missing_dir.to_str().unwrap(),
            &url(&fast, "/"),
        ],
        1,
        "cannot write",
    )
    .await;
}

/// The progress line appears when stderr is a terminal (a pty from `script`), redrawn
/// in place with `\r`, and is cleared at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_line_on_a_terminal() {
    if !Path::new("/usr/bin/script").exists() {
        eprintln!("skipped: no /usr/bin/script (util-linux) to give drover bench a terminal");
        return;
    }
    let b = Backend::named("b0").start().await;
    let cmd = format!(
        "{} bench --rate 200 -d 1s --json {} >/dev/null",
        bin().display(),
        url(&b, "/")
    );
    let out = tokio::process::Command::new("/usr/bin/script")
        .args(["-qec", &cmd, "/dev/null"])
        .output()
        .await
        .unwrap();
    let tty = text(&out.stdout);
    assert!(out.status.success(), "{tty}{}", text(&out.stderr));
    let redraws = tty.matches('\r').count();
    assert!(redraws >= 3, "{tty:?}");
    assert!(
        tty.contains("requests") && tty.contains("req/s") && tty.contains("p99"),
        "{tty:?}"
    );
    assert!(tty.ends_with("\r\x1b[K"), "{tty:?}");
}

/// A stand-in for drover's admin listener: `/metrics` answers `scrapes[i]` on the i-th
/// request, and the request heads are kept.
fn fake_admin(
    scrapes: Vec<String>,
) -> (std::net::SocketAddr, std::thread::JoinHandle<Vec<String>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let mut heads = Vec::new();
        for body in scrapes {
            let (mut sock, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let n = sock.read(&mut buf).unwrap();
            heads.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            let reply = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            sock.write_all(reply.as_bytes()).unwrap();
        }
        heads
    });
    (addr, server)
}

/// drover's endpoint metrics after `n` requests to `endpoint`, each queued 2 ms and 8 ms
/// at the backend, 10 ms in all.
fn endpoint_metrics(endpoint: &str, n: u64) -> String {
    let mut s = String::from("# TYPE drover_endpoint_queue_wait_seconds histogram\n");
    for (metric, each) in [
        ("drover_endpoint_queue_wait_seconds", 0.002),
        ("drover_endpoint_response_head_seconds", 0.008),
        ("drover_endpoint_request_duration_seconds", 0.010),
    ] {
        let labels = format!("balancer=\"web\",endpoint=\"{endpoint}\"");
        for le in ["0.005", "0.025", "+Inf"] {
            let within = if le == "0.005" && each > 0.005 { 0 } else { n };
            s += &format!("{metric}_bucket{{{labels},le=\"{le}\"}} {within}\n");
        }
        s += &format!("{metric}_sum{{{labels}}} {}\n", each * n as f64);
        s += &format!("{metric}_count{{{labels}}} {n}\n");
    }
    s += &format!(
        "drover_endpoint_responses_total{{balancer=\"web\",endpoint=\"{endpoint}\",code=\"2xx\"}} {n}\n"
    );
    s
}

/// `--admin` against a stand-in for drover's /metrics whose numbers are known exactly:
/// scraped before and after, the difference reported per endpoint in the text, the JSON
/// and the HTML page.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_metrics_are_scraped_before_and_after() {
    let b = Backend::named("b0").start().await;
    let endpoint = b.addr().to_string();
    let (admin, server) = fake_admin(vec![
        endpoint_metrics(&endpoint, 7),
        endpoint_metrics(&endpoint, 57),
        endpoint_metrics(&endpoint, 7),
        endpoint_metrics(&endpoint, 57),
    ]);
    let admin = admin.to_string();
    let target = url(&b, "/");
    let out = bench(&[
        "-n",
        "50",
        "-c",
        "2",
        "--admin",
        &admin,
        "--admin-token",
        "tok",
        &target,
    ])
    .await;
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains(&format!("drover's view ({admin}/metrics")),
        "{stdout}"
    );
    let row = stdout
        .lines()
        .find(|l| l.contains(&format!("web/{endpoint}")))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(row.contains(" 50 ") && row.contains("100.0%"), "{row}");
    assert!(
        row.contains("2.00ms / ") && row.contains("8.00ms / ") && row.contains("10.0ms / "),
        "{row}"
    );

    let dir = temp_dir("bench-admin");
    let html = dir.join("admin.html");
    let out = bench(&[
        "-n",
        "50",
        "-c",
        "2",
        "--json",
        "--admin",
        &admin,
        "--admin-token",
        "tok",
        "--html",
        html.to_str().unwrap(),
        &target,
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json(&out);
    let e = &r["admin"]["endpoints"][0];
    assert_eq!(e["endpoint"], endpoint.as_str());
    assert_eq!(e["requests"], 50);
    assert_eq!(e["responses"]["2xx"], 50);
    assert_eq!(e["queue_wait"]["mean_us"], 2000.0);
    assert_eq!(e["backend"]["mean_us"], 8000.0);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("Requests per endpoint"));
    assert!(page.contains("Where the time went"));
    assert_no_external_addresses(&page);

    let heads = server.join().unwrap();
    assert_eq!(heads.len(), 4);
    assert!(heads
        .iter()
        .all(|h| h.starts_with("GET /metrics HTTP/1.1\r\n")
            && h.contains("Authorization: Bearer tok\r\n")));
}

/// `--admin` against a real drover: its /metrics, read before and after, credits each
/// endpoint with the requests this run sent through it, and splits their time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_reports_what_drover_counted_per_endpoint() {
    let backends = common::backends(2).await;
    let d = common::proxy(
        &common::addrs(&backends),
        &[
            "--name",
            "web",
            "--admin",
            "127.0.0.1:0",
            "--admin-token",
            "tok",
        ],
    )
    .await;
    let admin = common::admin_addr(&d).await.to_string();
    let target = format!("http://{}/delay/2", d.addr());
    // Traffic before the run is not the run's.
    let warm = bench(&["-n", "30", "-c", "2", &target]).await;
    assert_eq!(warm.status.code(), Some(0), "{}", text(&warm.stderr));

    let refused = bench(&["-n", "3", "--admin", &admin, &target]).await;
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains("--admin-token"),
        "{}",
        text(&refused.stderr)
    );

    let out = bench(&[
        "-n",
        "200",
        "-c",
        "4",
        "--json",
        "--admin",
        &admin,
        "--admin-token",
        "tok",
        &target,
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json(&out);
    let endpoints = r["admin"]["endpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 2, "{}", r["admin"]);
    let mut total = 0;
    let mut named: Vec<String> = endpoints
        .iter()
        .map(|e| e["endpoint"].as_str().unwrap().to_string())
        .collect();
    let mut expected: Vec<String> = common::addrs(&backends)
        .iter()
        .map(|a| a.to_string())
        .collect();
    named.sort();
    expected.sort();
    assert_eq!(named, expected);
    for e in endpoints {
        assert_eq!(e["balancer"], "web");
        let n = e["requests"].as_u64().unwrap();
        assert!(n > 0, "{e}");
        assert_eq!(e["responses"]["2xx"], n);
        total += n;
        // The backend sleeps 2 ms; drover's time covers the backend's.
        let backend = e["backend"]["mean_us"].as_f64().unwrap();
        let request = e["request"]["mean_us"].as_f64().unwrap();
        assert!(backend >= 2000.0 && request >= backend, "{e}");
        assert!(e["queue_wait"]["mean_us"].as_f64().unwrap() >= 0.0);
    }
    assert_eq!(total, 200);
}

/// ab's `-p FILE -T TYPE`, loadtest's `-m POST -P BODY`: every request carries the
/// method and body, framed by drover bench; `HEAD` responses are read as heads only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_carry_the_method_and_body_asked_for() {
    let b = Backend::named("b0").start().await;
    let dir = temp_dir("bench-body");
    let file = dir.join("order.json");
    std::fs::write(&file, br#"{"item":42}"#).unwrap();
    let out = bench(&[
        "-n",
        "50",
        "-c",
        "2",
        "-m",
        "POST",
        "--body-file",
        file.to_str().unwrap(),
        "-T",
        "application/json",
        "--json",
        &url(&b, "/echo"),
    ])
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json(&out);
    assert_eq!(
        (r["ok"].as_u64(), r["method"].as_str()),
        (Some(50), Some("POST"))
    );
    let heads = b.request_heads();
    assert_eq!(heads.len(), 50);
    for h in &heads {
        assert_eq!(h.method, "POST");
        assert_eq!(h.header_str("content-length").as_deref(), Some("11"));
        assert_eq!(
            h.header_str("content-type").as_deref(),
            Some("application/json")
        );
    }
    // Each answer echoed the 11 bytes: the body went out whole on a kept connection.
    assert_eq!(r["connections_opened"], 2);

    b.reset_stats();
    let out = bench(&["-n", "20", "-c", "1", "-m", "HEAD", "--json", &url(&b, "/")]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json(&out);
    assert_eq!(
        (r["ok"].as_u64(), r["errors_total"].as_u64()),
        (Some(20), Some(0))
    );
    assert!(b.request_heads().iter().all(|h| h.method == "HEAD"));

    let out = bench(&["-n", "1", "-m", "GE T", &url(&b, "/")]).await;
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("bad --method"),
        "{}",
        text(&out.stderr)
    );
}
