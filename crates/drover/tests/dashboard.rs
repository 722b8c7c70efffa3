//! Issue 14, item 3: the live dashboard at `GET /` of the admin listener, through the
//! real binary, real workers (the bundled Node pi server) and a real browser.
//!
//! The browser test drives headless Chromium (`common::browser`). Without Chromium it is
//! skipped, saying so, except under CI (env `CI` set), where that is a failure.
//!
//! `DROVER_DASHBOARD_PNG=docs/dashboard.png cargo test -p drover --test dashboard
//! browser` also writes the screenshot the README shows (after 30 s more of load, so
//! the charts have something to draw).

mod common;

use common::browser::{chromium_missing, Cdp, Chromium};
use common::{admin_addr, bin, pi_server, steady_load, stops_cleanly, temp_dir};
use drover_testkit::{DroverProcess, HttpClient};
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

const TOKEN: &str = "s3cret";

/// `drover run -w 2` of the pi server with an admin API that needs `TOKEN`. Returns
/// drover, the balancer's address and the admin address.
async fn run_pi() -> (DroverProcess, SocketAddr, SocketAddr) {
    let server = pi_server();
    let d = DroverProcess::spawn(
        bin(),
        &[
            "run",
            "-w",
            "2",
            "-l",
            "127.0.0.1:0",
            "--admin",
            "127.0.0.1:0",
            "--admin-token",
            TOKEN,
            "--",
            "node",
            &server,
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    let balancer = *d
        .addrs_after("listening on ")
        .first()
        .expect("the balancer's address");
    (d, balancer, admin)
}

/// Every `http://` or `https://` reference in `text`, as the host[:port] it names.
fn hosts_named(text: &str) -> Vec<String> {
    let mut hosts = Vec::new();
    for scheme in ["http://", "https://"] {
        for (at, _) in text.match_indices(scheme) {
            let rest = &text[at + scheme.len()..];
            let end = rest
                .find(|c: char| c == '/' || c == '"' || c == '\'' || c.is_whitespace())
                .unwrap_or(rest.len());
            hosts.push(rest[..end].to_string());
        }
    }
    hosts
}

fn loopback(host: &str) -> bool {
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    matches!(name, "127.0.0.1" | "localhost" | "[::1]")
}

/// A streaming GET of `/v1/events`: the status and headers, then SSE frames one by one
/// (the body is chunked; each frame is written whole, so frames are parsed off the
/// de-chunked bytes).
struct EventStream {
    conn: BufReader<TcpStream>,
    pending: Vec<u8>,
}

impl EventStream {
    async fn open(admin: SocketAddr, token: Option<&str>) -> (u16, String, Option<EventStream>) {
        let mut conn = BufReader::new(TcpStream::connect(admin).await.unwrap());
        let auth = token.map_or_else(String::new, |t| format!("authorization: Bearer {t}\r\n"));
        let req = format!("GET /v1/events HTTP/1.1\r\nhost: {admin}\r\n{auth}\r\n");
        conn.get_mut().write_all(req.as_bytes()).await.unwrap();
        let mut head = String::new();
        loop {
            let mut line = String::new();
            conn.read_line(&mut line).await.unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            head.push_str(&line);
        }
        let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
        let stream = (status == 200).then(|| EventStream {
            conn,
            pending: Vec::new(),
        });
        (status, head.to_ascii_lowercase(), stream)
    }

    /// The next frame: its event name and its JSON.
    async fn next(&mut self) -> (String, Value) {
        tokio::time::timeout(Duration::from_secs(10), self.next_inner())
            .await
            .expect("no frame within 10 s")
    }

    async fn next_inner(&mut self) -> (String, Value) {
        loop {
            if let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
                let frame = String::from_utf8(self.pending.drain(..end + 2).collect()).unwrap();
                if frame.starts_with(':') {
                    continue;
                }
                let mut event = String::new();
                let mut data = String::new();
                for line in frame.lines() {
                    if let Some(e) = line.strip_prefix("event: ") {
                        event = e.to_string();
                    } else if let Some(d) = line.strip_prefix("data: ") {
                        data.push_str(d);
                    }
                }
                return (event, serde_json::from_str(&data).unwrap());
            }
            let mut size = String::new();
            self.conn.read_line(&mut size).await.unwrap();
            let size = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
            assert!(size > 0, "the stream ended");
            let mut chunk = vec![0; size + 2];
            self.conn.read_exact(&mut chunk).await.unwrap();
            self.pending.extend_from_slice(&chunk[..size]);
        }
    }
}

#[tokio::test]
async fn the_page_needs_no_token_and_the_stream_does() {
    let (d, _, admin) = run_pi().await;
    let mut c = HttpClient::connect(admin).await.unwrap();
    let page = c.get("/").await;
    assert_eq!(page.status, 200, "{}", page.text());
    assert!(page
        .header("content-type")
        .unwrap()
        .starts_with("text/html"));
    let html = page.text();
    assert!(
        html.contains("/ui/app.js") && html.contains("/ui/uplot.js"),
        "{html}"
    );
    let foreign: Vec<String> = hosts_named(&html)
        .into_iter()
        .filter(|h| !loopback(h))
        .collect();
    assert!(
        foreign.is_empty(),
        "the page names other hosts: {foreign:?}"
    );
    // Its assets too (uPlot's licence banner, a comment on its first line, aside).
    for path in ["/ui/app.js", "/ui/app.css", "/ui/uplot.js", "/ui/uplot.css"] {
        let r = c.get(path).await;
        assert_eq!(r.status, 200, "{path}");
        let text = r.text();
        let body = if path.starts_with("/ui/uplot") {
            text.split_once('\n')
                .map_or(text.as_str(), |(_, rest)| rest)
        } else {
            &text
        };
        let foreign: Vec<String> = hosts_named(body)
            .into_iter()
            .filter(|h| !loopback(h))
            .collect();
        assert!(foreign.is_empty(), "{path} names other hosts: {foreign:?}");
    }
    // Data keeps the token rule.
    assert_eq!(c.get("/v1/status").await.status, 401);
    let (status, head, _) = EventStream::open(admin, None).await;
    assert_eq!(status, 401, "{head}");
    let (status, _, _) = EventStream::open(admin, Some("wrong")).await;
    assert_eq!(status, 401);

    let (status, head, stream) = EventStream::open(admin, Some(TOKEN)).await;
    assert_eq!(status, 200, "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    let mut first = stream.unwrap();
    let (event, history) = first.next().await;
    assert_eq!(event, "history", "{history}");
    assert_eq!(history["capacity"], 600);
    // Three samples as they come, once both workers serve; a subscriber that joins
    // after them finds each in its history, under the same time.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while seen.len() < 3 {
        assert!(
            Instant::now() < deadline,
            "no 3 samples with both workers ready"
        );
        let (event, sample) = first.next().await;
        if event != "sample" {
            continue;
        }
        let b = &sample["balancers"][0];
        assert_eq!(b["name"], "default");
        let workers = sample["apps"][0]["workers"].as_array().unwrap();
        assert_eq!(workers.len(), 2, "{sample}");
        if workers.iter().any(|w| w["state"] != "ready") {
            continue;
        }
        assert_eq!(b["endpoints"].as_array().unwrap().len(), 2, "{sample}");
        assert_eq!(b["endpoints"][0]["state"], "up", "{sample}");
        if let Some(t) = b["point"]["t"].as_f64() {
            seen.push(t);
        }
    }
    let (_, _, later) = EventStream::open(admin, Some(TOKEN)).await;
    let (event, history) = later.unwrap().next().await;
    assert_eq!(event, "history");
    let series = &history["series"][0];
    assert_eq!(series["balancer"], "default");
    let times: Vec<f64> = series["t"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_f64)
        .collect();
    for t in &seen {
        assert!(times.contains(t), "{t} not in the history {times:?}");
    }
    for key in ["rps", "eps", "p50", "p99"] {
        assert_eq!(series[key].as_array().unwrap().len(), times.len(), "{key}");
    }
    stops_cleanly(d).await;
}

/// The worker rows the page shows, as `[{worker, pid, restarts, state}]`.
const WORKERS_JS: &str = "JSON.stringify([...document.querySelectorAll('tr[data-worker]')].map(tr => ({worker: tr.dataset.worker, pid: tr.querySelector('.pid').textContent, restarts: tr.querySelector('.restarts').textContent, state: tr.querySelector('.state').textContent})))";

async fn dom_workers(cdp: &mut Cdp) -> Vec<Value> {
    let text = cdp.eval(WORKERS_JS).await;
    serde_json::from_str(text.as_str().unwrap()).unwrap()
}

#[tokio::test]
async fn the_browser_shows_a_killed_worker_restarted_and_asks_no_other_host() {
    if chromium_missing() {
        return;
    }
    let (d, balancer, admin) = run_pi().await;
    let stop = Arc::new(AtomicBool::new(false));
    let load = steady_load(balancer, 4, "/pi?iterations=20000", stop.clone());
    let chromium = Chromium::start(&temp_dir("dashboard-chromium")).await;
    let mut cdp = Cdp::page(&chromium).await;
    cdp.call("Network.enable", json!({})).await;
    cdp.call("Page.enable", json!({})).await;
    cdp.call(
        "Emulation.setDeviceMetricsOverride",
        json!({ "width": 1400, "height": 1500, "deviceScaleFactor": 1, "mobile": false }),
    )
    .await;
    let origin = format!("http://{admin}");
    cdp.call("Page.navigate", json!({ "url": format!("{origin}/") }))
        .await;

    // The admin has a token: the page says so and asks for it.
    assert!(
        cdp.until(
            Duration::from_secs(15),
            "!document.getElementById('login').hidden && document.getElementById('conn').textContent.includes('401')"
        )
        .await,
        "the page did not ask for the token: {}",
        cdp.eval("document.body.innerText").await
    );
    cdp.eval(&format!(
        "document.getElementById('token').value = '{TOKEN}'; document.getElementById('login').requestSubmit(); true"
    ))
    .await;
    assert!(
        cdp.until(
            Duration::from_secs(15),
            "document.querySelectorAll('tr[data-worker]').length === 2 && [...document.querySelectorAll('tr[data-worker] .state')].every(td => td.textContent === 'ready') && document.querySelectorAll('tr[data-endpoint]').length === 2 && sessionStorage.getItem('drover-admin-token') === 's3cret'"
        )
        .await,
        "the page never showed 2 ready workers and 2 endpoints: {}",
        cdp.eval("document.body.innerText").await
    );
    // The default mode may hand client connections to the workers: the table counts them.
    assert!(
        cdp.until(
            Duration::from_secs(15),
            "[...document.querySelectorAll('th')].some(th => th.textContent === 'clients')"
        )
        .await,
        "no clients column: {}",
        cdp.eval("document.body.innerText").await
    );
    // The charts are drawn, with requests in them.
    assert!(
        cdp.until(
            Duration::from_secs(15),
            "document.querySelectorAll('.uplot').length === 3 && document.querySelector('[data-balancer] .meta').textContent.match(/requests (\\d+)/)[1] > 0"
        )
        .await
    );

    // kill -9 one worker under load: the page shows its slot serving again under a new
    // pid, with one more restart (not merely the old pid gone, or the slot restarting).
    // About a second here; the bound is a safety net for a loaded machine, not a speed.
    let before = dom_workers(&mut cdp).await;
    let victim = before[0].clone();
    let pid = victim["pid"].as_str().unwrap().to_string();
    let restarts: u64 = victim["restarts"].as_str().unwrap().parse().unwrap();
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status()
        .unwrap();
    assert!(killed.success());
    let at = Instant::now();
    let shown = cdp
        .until(
            Duration::from_secs(20),
            &format!(
                "(() => {{ const tr = document.querySelector('tr[data-worker=\"{}\"]'); if (!tr) return false; const pid = tr.querySelector('.pid').textContent; return /^[0-9]+$/.test(pid) && pid !== '{pid}' && Number(tr.querySelector('.restarts').textContent) > {restarts} && ['ready', 'busy'].includes(tr.querySelector('.state').textContent); }})()",
                victim["worker"].as_str().unwrap()
            ),
        )
        .await;
    let after = dom_workers(&mut cdp).await;
    assert!(
        shown,
        "after kill -9 of pid {pid} the page never showed worker {} serving under a new pid: {after:?} (waited {:?})",
        victim["worker"],
        at.elapsed()
    );
    // That pid is the worker drover now runs in that slot.
    let slot: usize = victim["worker"].as_str().unwrap().parse().unwrap();
    let new_pid = after
        .iter()
        .find(|w| w["worker"] == victim["worker"])
        .and_then(|w| w["pid"].as_str())
        .unwrap()
        .to_string();
    let now_running = status_with_token(admin).await.apps[0]
        .workers
        .iter()
        .find(|w| w.id == slot)
        .and_then(|w| w.pid);
    assert_eq!(
        now_running.map(|p| p.to_string()),
        Some(new_pid.clone()),
        "the page shows pid {new_pid} for worker {slot}"
    );
    eprintln!(
        "the page showed the new pid {new_pid} {:?} after the kill",
        at.elapsed()
    );
    // The event list has the restart too.
    assert!(
        cdp.until(
            Duration::from_secs(10),
            "[...document.querySelectorAll('#events li')].some(li => li.dataset.kind === 'restart')"
        )
        .await,
        "{}",
        cdp.eval("document.getElementById('events').innerText").await
    );
    eprintln!("workers before the kill {before:?}, after {after:?}");

    // A relative path is from the repository root (tests run in crates/drover).
    let png_to = std::env::var_os("DROVER_DASHBOARD_PNG")
        .map(|p| Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(p));
    if png_to.is_some() {
        // More of the charts for the README's picture.
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    let shot = cdp
        .call("Page.captureScreenshot", json!({ "format": "png" }))
        .await;
    let png = base64_decode(shot["data"].as_str().unwrap());
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000);
    let out = png_to.unwrap_or_else(|| temp_dir("dashboard-shot").join("dashboard.png"));
    std::fs::write(&out, &png).unwrap();
    eprintln!("screenshot: {} ({} bytes)", out.display(), png.len());

    // Everything the page asked for was on the admin listener.
    let urls = cdp.requested();
    for needed in [
        "/ui/uplot.js",
        "/ui/app.js",
        "/v1/events",
        "/v1/balancers/default/members",
    ] {
        assert!(
            urls.iter().any(|u| u == &format!("{origin}{needed}")),
            "{needed} never asked for: {urls:?}"
        );
    }
    let elsewhere: Vec<&String> = urls
        .iter()
        .filter(|u| !u.starts_with(&format!("{origin}/")))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "the page asked other hosts: {elsewhere:?}"
    );

    drop(cdp);
    drop(chromium);
    stop.store(true, Ordering::Relaxed);
    for l in load {
        let _ = l.await;
    }
    stops_cleanly(d).await;
}

/// Standard base64 (what CDP sends screenshots in).
fn base64_decode(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = text.bytes().filter(|&c| c != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            acc |= u32::from(value(c)) << (18 - 6 * i);
        }
        let n = chunk.len() * 6 / 8;
        out.extend_from_slice(&acc.to_be_bytes()[1..1 + n]);
    }
    out
}

#[test]
fn base64_decodes() {
    assert_eq!(base64_decode("aGVsbG8="), b"hello");
    assert_eq!(base64_decode("aGk="), b"hi");
    assert_eq!(base64_decode("YWJj"), b"abc");
}

/// `drover ctl status --json` with the token.
async fn status_with_token(admin: SocketAddr) -> drover_admin::Status {
    let (code, out, err) = common::ctl(admin, &["--token", TOKEN, "status", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// The page's buttons, clicked in the browser: drain a runtime member, scale, reload;
/// a refused confirmation and a bad worker count change nothing.
#[tokio::test]
async fn the_pages_buttons_drain_scale_and_reload() {
    if chromium_missing() {
        return;
    }
    let (d, _balancer, admin) = run_pi().await;
    let auth = format!("Bearer {TOKEN}");
    let extra = drover_testkit::Backend::named("extra").start().await;
    let body = format!("{{\"address\": \"{}\", \"ttl\": \"60s\"}}", extra.addr());
    let mut c = HttpClient::connect(admin).await.unwrap();
    let r = c
        .request(
            "PUT",
            "/v1/balancers/default/members/extra",
            &[("authorization", &auth)],
            Some(body.as_bytes()),
        )
        .await
        .unwrap();
    assert_eq!(r.status, 201, "{}", r.text());

    let chromium = Chromium::start(&temp_dir("dashboard-actions")).await;
    let mut cdp = Cdp::page(&chromium).await;
    cdp.call("Page.enable", json!({})).await;
    cdp.call(
        "Page.navigate",
        json!({ "url": format!("http://{admin}/") }),
    )
    .await;
    assert!(
        cdp.until(
            Duration::from_secs(15),
            "!document.getElementById('login').hidden"
        )
        .await
    );
    cdp.eval(&format!(
        "document.getElementById('token').value = '{TOKEN}'; document.getElementById('login').requestSubmit(); true"
    ))
    .await;
    let ready_workers = |n: usize| {
        format!("document.querySelectorAll('tr[data-worker]').length === {n} && [...document.querySelectorAll('tr[data-worker] .state')].every(td => td.textContent === 'ready')")
    };
    let result_js = "document.getElementById('result').textContent";

    // Drain: the runtime member's row has the button; once clicked (and confirmed) it
    // leaves the pool, and the page says what the API answered.
    let row = format!("tr[data-endpoint=\"{}\"]", extra.addr());
    assert!(
        cdp.until(
            Duration::from_secs(15),
            &format!(
                "!!document.querySelector('{row} button') && ({})",
                ready_workers(2)
            )
        )
        .await,
        "no drain button for the runtime member: {}",
        cdp.eval("document.body.innerText").await
    );
    cdp.eval(&format!(
        "window.confirm = () => true; document.querySelector('{row} button').click(); true"
    ))
    .await;
    assert!(
        cdp.until(
            Duration::from_secs(10),
            &format!("!document.querySelector('{row}') && {result_js}.startsWith('200')")
        )
        .await,
        "the drained member stayed: {}",
        cdp.eval(result_js).await
    );
    let s = status_with_token(admin).await;
    assert!(
        s.balancers[0]
            .endpoints
            .iter()
            .all(|e| e.addr != extra.addr().to_string()),
        "{s:?}"
    );

    // Scale: a bad count is refused in the page; a refused confirmation sends nothing;
    // a confirmed one runs 3 workers.
    let scale_js = |n: &str, confirm: bool| {
        format!(
            "(() => {{ window.confirm = () => {confirm}; const box = document.querySelector('[data-app]'); box.querySelector('input[type=number]').value = '{n}'; [...box.querySelectorAll('button')].find(b => b.textContent === 'scale').click(); return true; }})()"
        )
    };
    cdp.eval(&scale_js("two", true)).await;
    assert!(
        cdp.until(
            Duration::from_secs(5),
            &format!("{result_js}.includes('whole number')")
        )
        .await
    );
    cdp.eval(&scale_js("3", false)).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(status_with_token(admin).await.apps[0].workers.len(), 2);
    cdp.eval(&scale_js("3", true)).await;
    assert!(
        cdp.until(Duration::from_secs(60), &ready_workers(3)).await,
        "{}",
        cdp.eval("document.body.innerText").await
    );
    assert_eq!(status_with_token(admin).await.apps[0].workers.len(), 3);

    // Reload: every worker is replaced (new pids), and the page says it is done.
    let before: Vec<Option<u32>> = status_with_token(admin).await.apps[0]
        .workers
        .iter()
        .map(|w| w.pid)
        .collect();
    cdp.eval(
        "window.confirm = () => true; [...document.querySelector('[data-app]').querySelectorAll('button')].find(b => b.textContent === 'reload').click(); true",
    )
    .await;
    assert!(
        cdp.until(
            Duration::from_secs(90),
            &format!("{result_js}.startsWith('200')")
        )
        .await,
        "{}",
        cdp.eval(result_js).await
    );
    let after: Vec<Option<u32>> = status_with_token(admin).await.apps[0]
        .workers
        .iter()
        .map(|w| w.pid)
        .collect();
    assert_eq!(after.len(), 3);
    assert!(
        after.iter().all(|p| p.is_some() && !before.contains(p)),
        "{before:?} → {after:?}"
    );

    drop(cdp);
    drop(chromium);
    stops_cleanly(d).await;
}

/// A self-signed certificate for `soon.test` that expires `days` from now, and its key,
/// in `dir` as `soon.pem` and `soon.key`.
fn certificate_expiring_in(dir: &Path, days: u64) -> (std::path::PathBuf, std::path::PathBuf) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["soon.test".to_string()]).unwrap();
    params.not_before = rcgen::date_time_ymd(2000, 1, 1);
    // rcgen takes a date and time: the epoch plus now plus `days`.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + now + Duration::from_secs(days * 86_400);
    let cert = params.self_signed(&key).unwrap();
    let (pem, k) = (dir.join("soon.pem"), dir.join("soon.key"));
    std::fs::write(&pem, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    (pem, k)
}

/// Issue 24 item 1: a certificate within 14 days of its expiry is a warning on the
/// dashboard, in the stream's sample and on the page (when Chromium is there).
#[tokio::test]
async fn a_certificate_expiring_in_5_days_is_a_warning_on_the_dashboard() {
    let dir = temp_dir("dashboard-cert");
    let (cert, key) = certificate_expiring_in(&dir, 5);
    let backend = drover_testkit::Backend::start().await;
    let d = common::proxy(
        &[backend.addr()],
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
            "--admin",
            "127.0.0.1:0",
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    let sample = first_sample(admin).await;
    let due = &sample["balancers"][0]["expiring_certificates"];
    assert_eq!(due.as_array().map(Vec::len), Some(1), "{sample}");
    assert_eq!(due[0]["cert"], cert.to_str().unwrap());
    let days = due[0]["days_left"].as_f64().unwrap();
    assert!((4.9..=5.0).contains(&days), "{days}");

    if chromium_missing() {
        return;
    }
    let (_chromium, mut cdp) = dashboard_in_chromium(admin, "dashboard-cert-chromium").await;
    let shown = cdp
        .until(
            Duration::from_secs(15),
            "(() => { const w = document.querySelector('[data-balancer] .cert-warnings'); return !!w && !w.hidden && w.getAttribute('role') === 'alert' && w.querySelectorAll('.cert-warning').length === 1 && w.textContent.includes('soon.pem') && w.textContent.includes('(in 5 days)'); })()",
        )
        .await;
    assert!(
        shown,
        "no warning of soon.pem on the page: {}",
        cdp.eval("document.body.innerText").await
    );
    // Visible: laid out with a size, not merely in the DOM.
    let size = cdp
        .eval("(() => { const r = document.querySelector('.cert-warning').getBoundingClientRect(); return r.width > 0 && r.height > 0; })()")
        .await;
    assert_eq!(size, json!(true));
}

/// Issue 25 item 6: a listener's routes, and a balancer that only routes reach, are
/// in the stream's sample and on the page (when Chromium is there).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_shows_routes_and_a_balancer_without_listener() {
    let dir = temp_dir("dashboard-routes");
    let backend = drover_testkit::Backend::named("api").start().await;
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [[balancer]]\nname = \"front\"\nlisten = \"127.0.0.1:0\"\nbackends = []\n\
         routes = [{{ host = [\"api.test\"], path_prefix = \"/v1\", strip_prefix = true, balancer = \"api\" }}]\n\n\
         [[balancer]]\nname = \"api\"\nbackends = [\"{}\"]\n",
        backend.addr()
    );
    let (_d, _front, admin, _path) = common::proxy_config(&dir, &toml, "front").await;
    let sample = first_sample(admin).await;
    let by_name = |name: &str| {
        sample["balancers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} in {sample}"))
    };
    assert_eq!(
        by_name("front")["routes"],
        json!(["host api.test path /v1 (stripped) -> api"])
    );
    assert_eq!(by_name("api")["listen"], "-");

    if chromium_missing() {
        return;
    }
    let (_chromium, mut cdp) = dashboard_in_chromium(admin, "dashboard-routes-chromium").await;
    let shown = cdp
        .until(
            Duration::from_secs(15),
            "(() => { const t = [...document.querySelectorAll('[data-balancer] .meta')].map((m) => m.textContent).join('\\n'); return t.includes('routes: host api.test path /v1 (stripped) -> api') && t.includes('no listener: what routes send it'); })()",
        )
        .await;
    assert!(
        shown,
        "no routes on the page: {}",
        cdp.eval("document.body.innerText").await
    );
}

/// The first sample the dashboard's event stream sends.
async fn first_sample(admin: SocketAddr) -> Value {
    let (status, _, stream) = EventStream::open(admin, None).await;
    assert_eq!(status, 200);
    let mut stream = stream.unwrap();
    loop {
        let (event, data) = stream.next().await;
        if event == "sample" {
            return data;
        }
    }
}

/// The dashboard of `admin` loading in a headless Chromium (its profile under `tag`).
async fn dashboard_in_chromium(admin: SocketAddr, tag: &str) -> (Chromium, Cdp) {
    let chromium = Chromium::start(&temp_dir(tag)).await;
    let mut cdp = Cdp::page(&chromium).await;
    cdp.call("Page.enable", json!({})).await;
    cdp.call(
        "Page.navigate",
        json!({ "url": format!("http://{admin}/") }),
    )
    .await;
    (chromium, cdp)
}
