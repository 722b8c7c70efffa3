//! A real browser over drover's HTTPS and HTTP/2 (issue 24): headless Chromium that
//! trusts only a CA the test makes (in its home's NSS database, as a user's browser
//! trusts a company CA), against `drover run --tls-cert` over Node workers. A page, its
//! script and its fetches come over one HTTP/2 connection, each fetch a stream that
//! drover places on a worker of its own choosing, and a rolling reload under the page's
//! fetches fails none; a browser without the CA refuses the site. socket.io's defaults
//! in the browser (long-polling over HTTP/2, then a WebSocket over TLS) keep a session
//! on one worker, under drover's default strategy.

mod common;

use common::browser::{certutil_missing, chromium_missing, Cdp, Chromium};
use common::pki::{far_future, Pki};
use common::{admin_addr, bin, ctl, temp_dir};
use drover_testkit::DroverProcess;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn fixture(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(path)
}

/// `drover run -w WORKERS -- node APP` on a free port, once every worker serves; with
/// `pki`, over HTTPS (`--tls-cert`), serving `localhost` by a certificate of its CA.
async fn run_app(pki: Option<&Pki>, workers: &str, app: &Path) -> DroverProcess {
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-w", workers, "-l", "127.0.0.1:0"])
        .args(["--admin", "127.0.0.1:0"]);
    if let Some(pki) = pki {
        let (cert, key) = pki.leaf("localhost", "localhost", &["localhost"], far_future());
        cmd.arg("--tls-cert").arg(&cert).arg("--tls-key").arg(&key);
    }
    cmd.args(["--", "node"]).arg(app);
    common::examples::clean_env(&mut cmd);
    let d = drover_testkit::spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    d
}

/// The value of `expr`, a promise of a JSON string, parsed.
async fn json_of(cdp: &mut Cdp, expr: &str) -> Value {
    let text = cdp.eval(expr).await;
    serde_json::from_str(text.as_str().unwrap_or("null")).unwrap()
}

/// The protocol (ALPN) of the page's own load and of every request it made since.
async fn protocols(cdp: &mut Cdp) -> Vec<String> {
    let all = json_of(
        cdp,
        "JSON.stringify([performance.getEntriesByType('navigation')[0].nextHopProtocol, \
         ...performance.getEntriesByType('resource').map(e => e.nextHopProtocol)])",
    )
    .await;
    serde_json::from_value(all).unwrap()
}

/// The fetch results of page.js (`[{ok, status, worker, proto, n}]`) that failed, and
/// the workers that answered the others.
fn failed_and_workers(results: &Value) -> (Vec<Value>, BTreeSet<String>) {
    let all = results.as_array().unwrap();
    let failed = all
        .iter()
        .filter(|r| r["ok"] != json!(true) || r["proto"] != json!("https"))
        .cloned()
        .collect();
    let workers = all
        .iter()
        .filter_map(|r| r["worker"].as_str().map(str::to_string))
        .collect();
    (failed, workers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_browser_trusting_the_tests_ca_gets_the_page_and_its_fetches_over_http2_through_a_reload()
{
    if chromium_missing() || certutil_missing() {
        return;
    }
    let pki = Pki::new("browser-https");
    let d = run_app(Some(&pki), "2", &fixture("browser/page.js")).await;
    let admin = admin_addr(&d).await;
    let origin = format!("https://localhost:{}", d.addr().port());

    // A browser without the CA refuses the site: the trust below is the CA's, not a
    // browser that takes any certificate.
    let stranger = Chromium::start(&temp_dir("browser-https-stranger")).await;
    let mut page = Cdp::page(&stranger).await;
    let nav = page
        .call("Page.navigate", json!({ "url": format!("{origin}/") }))
        .await;
    assert_eq!(
        nav["errorText"],
        json!("net::ERR_CERT_AUTHORITY_INVALID"),
        "a browser that does not trust the test's CA: {nav}"
    );
    drop(page);
    drop(stranger);

    let chromium = Chromium::start_trusting(&temp_dir("browser-https-chromium"), &pki.ca_pem).await;
    let mut cdp = Cdp::page(&chromium).await;
    let nav = cdp
        .call("Page.navigate", json!({ "url": format!("{origin}/") }))
        .await;
    assert!(nav.get("errorText").is_none(), "{nav}: {}", d.stderr_text());
    assert!(
        cdp.until(Duration::from_secs(20), "window.first !== undefined")
            .await,
        "the page's script never ran: {}",
        cdp.eval("document.documentElement.outerHTML").await
    );
    let first = json_of(&mut cdp, "window.first.then(JSON.stringify)").await;
    let (failed, workers) = failed_and_workers(&first);
    assert_eq!(first.as_array().unwrap().len(), 20, "{first}");
    assert!(
        failed.is_empty(),
        "fetches failed or reached a worker without X-Forwarded-Proto: https: {failed:?}"
    );
    // Each stream is a request of its own: 20 at once on one connection go to both
    // workers, as 20 requests on 20 connections would.
    assert_eq!(workers.len(), 2, "{first}");
    let first_protocols = protocols(&mut cdp).await;
    assert!(
        first_protocols.len() >= 22,
        "the page, app.js and 20 fetches: {first_protocols:?}"
    );
    assert!(
        first_protocols.iter().all(|p| p == "h2"),
        "all over HTTP/2: {first_protocols:?}"
    );

    // The page keeps fetching, 10 at a time, while drover replaces both workers.
    cdp.eval(
        "window.during = (async () => { const all = []; \
         while (!window.done) all.push(...await window.fetchAll(10)); return all; })(); true",
    )
    .await;
    let before = common::serving_pids(&common::status(admin).await);
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "drover ctl reload: {out}{err}");
    let mut after = before.clone();
    for _ in 0..300 {
        after = common::serving_pids(&common::status(admin).await);
        if after.iter().all(|p| p.is_some() && !before.contains(p)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        after.iter().all(|p| p.is_some() && !before.contains(p)),
        "the reload did not replace both workers: {before:?} -> {after:?}"
    );
    cdp.eval("window.done = true").await;
    let during = json_of(&mut cdp, "window.during.then(JSON.stringify)").await;
    let (failed, _) = failed_and_workers(&during);
    assert!(
        during.as_array().unwrap().len() >= 20,
        "the page fetched too little to tell: {during}"
    );
    assert!(
        failed.is_empty(),
        "{} of {} fetches failed during the reload: {failed:?}\n{}",
        failed.len(),
        during.as_array().unwrap().len(),
        d.stderr_text()
    );
    assert!(
        protocols(&mut cdp).await.iter().all(|p| p == "h2"),
        "all over HTTP/2"
    );
}

/// socket.io's own page (fixtures/workloads/socketio/browser.js) under `drover run -w 3`
/// with its defaults, at `url` in `chromium`: the session starts over long-polling and
/// upgrades to a WebSocket, and every message's ack comes from the one worker that holds
/// the session (drover keeps the session's requests there by the id its handshake
/// named). The page, for more checks.
async fn socket_io_session(chromium: &Chromium, url: &str, d: &DroverProcess) -> Cdp {
    let mut cdp = Cdp::page(chromium).await;
    let nav = cdp.call("Page.navigate", json!({ "url": url })).await;
    assert!(nav.get("errorText").is_none(), "{nav}: {}", d.stderr_text());
    assert!(
        cdp.until(Duration::from_secs(20), "window.result !== undefined")
            .await,
        "the page's script never ran"
    );
    let result = json_of(&mut cdp, "window.result.then(JSON.stringify)").await;
    assert!(
        result.get("error").is_none(),
        "the session broke: {result}\n{}",
        d.stderr_text()
    );
    let acks = result["acks"].as_array().unwrap();
    assert_eq!(acks.len(), 30, "{result}");
    let workers: BTreeSet<&str> = acks.iter().filter_map(|a| a["worker"].as_str()).collect();
    assert_eq!(workers.len(), 1, "one worker holds the session: {result}");
    assert_eq!(
        result["transports"].as_array().unwrap().last(),
        Some(&json!("websocket")),
        "the session upgraded to a WebSocket: {result}"
    );
    cdp
}

/// The protocols of the page's long-polls.
async fn polls(cdp: &mut Cdp) -> Vec<String> {
    let polls = json_of(
        cdp,
        "JSON.stringify(performance.getEntriesByType('resource') \
         .filter(e => e.name.includes('transport=polling')).map(e => e.nextHopProtocol))",
    )
    .await;
    serde_json::from_value(polls).unwrap()
}

fn socket_io_fixture() -> PathBuf {
    let app = fixture("workloads/socketio/browser.js");
    assert!(
        fixture("workloads/socketio/node_modules/socket.io/package.json").exists(),
        "the socket.io fixture is not installed: run `npm ci --prefix {}` (scripts/test does)",
        app.parent().unwrap().display()
    );
    app
}

/// Over HTTPS, the session's long-polls and POSTs are streams of one HTTP/2 connection
/// that drover places one by one; its WebSocket goes over HTTP/1.1 and TLS (drover's
/// HTTP/2 offers no extended CONNECT, so Chromium opens a connection for it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_io_in_a_browser_over_https_polls_over_http2_then_upgrades_on_one_worker() {
    if chromium_missing() || certutil_missing() {
        return;
    }
    let pki = Pki::new("browser-socketio");
    let d = run_app(Some(&pki), "3", &socket_io_fixture()).await;
    let chromium =
        Chromium::start_trusting(&temp_dir("browser-socketio-chromium"), &pki.ca_pem).await;
    let url = format!("https://localhost:{}/", d.addr().port());
    let mut cdp = socket_io_session(&chromium, &url, &d).await;
    let polls = polls(&mut cdp).await;
    assert!(
        !polls.is_empty() && polls.iter().all(|p| p == "h2"),
        "the long-polls went over HTTP/2: {polls:?}"
    );
}

/// Over plain HTTP, `drover run`'s default mode hands a keep-alive connection to a
/// worker once it has carried two requests: the page's connection, which then carried
/// the session's handshake past drover to that worker, while its POSTs went to others
/// (the first session of a fresh drover broke, and socket.io's client started another).
/// drover's preload says the app serves socket.io when it listens, and drover hands
/// such an app no connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn socket_io_in_a_browser_over_http_gets_no_connection_handed_to_a_worker() {
    if chromium_missing() {
        return;
    }
    let d = run_app(None, "3", &socket_io_fixture()).await;
    let chromium = Chromium::start(&temp_dir("browser-socketio-http")).await;
    let url = format!("http://localhost:{}/", d.addr().port());
    let mut cdp = socket_io_session(&chromium, &url, &d).await;
    assert!(!polls(&mut cdp).await.is_empty());
    let admin = admin_addr(&d).await;
    assert_eq!(
        common::default_metric(admin, "drover_handoffs_total").await,
        0
    );
}
