//! Answers that take as long as the app likes: server-sent events. An `EventSource`
//! subscription stays open for hours, and its app writes when it has news: minutes may
//! pass with nothing sent, and Node sends no head at all before the first event unless
//! the app flushes it. Node alone, Node's cluster module and PM2 wait for as long as the
//! client does. A request timeout that cut such a stream after 30 quiet seconds (nginx's
//! `proxy_read_timeout` does it after 60) broke apps that work without drover; every
//! other answer still keeps to the timeout. gRPC calls are held the same way (see
//! `backend_http2.rs` for their path).

mod common;

use common::proxy;
use drover_testkit::{parse_status, raw_exchange_timeout};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

/// A Node app as SSE tutorials write one (on `PORT` under `drover run`). `/events?gap=MS&count=N` sends N events, one
/// every MS; with `flush=1` its head goes at once, else with the first event (Node holds
/// a `writeHead` until the first write). `/slow?ms=MS` answers after MS; `/chunks?gap=MS`
/// is a plain chunked body with a quiet gap in it; `/stats` counts open and closed
/// streams (closed when the client's connection ends, as `req.on('close')` sees it), and
/// `/slow` answers whose client left first (`left`);
/// `/page` subscribes a browser's `EventSource` to three events 1.5 s apart.
const SSE_APP: &str = r#"
let open = 0, closed = 0, left = 0;
const server = require('http').createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  const n = (k, d) => Number(url.searchParams.get(k) ?? d);
  if (url.pathname === '/stats') return res.end(JSON.stringify({ open, closed, left }));
  if (url.pathname === '/page') {
    res.setHeader('Content-Type', 'text/html');
    return res.end(`<script>window.got = [];
      new EventSource('/events?gap=1500&count=3').onmessage = (e) => got.push(e.data);</script>`);
  }
  if (url.pathname === '/slow') {
    const timer = setTimeout(() => res.end('late'), n('ms', 0));
    return req.on('close', () => { if (!res.writableEnded) { clearTimeout(timer); left++; } });
  }
  if (url.pathname === '/chunks') {
    res.write('first ');
    return setTimeout(() => res.end('last'), n('gap', 0));
  }
  res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-cache' });
  if (url.searchParams.get('flush') === '1') res.flushHeaders();
  open++;
  let sent = 0;
  const timer = setInterval(() => {
    res.write(`data: event ${++sent}\n\n`);
    if (sent === n('count', 1)) { clearInterval(timer); res.end(); }
  }, n('gap', 0));
  req.on('close', () => { clearInterval(timer); open--; closed++; });
});
server.listen(process.env.PORT || 0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
"#;

async fn sse_app() -> (Child, SocketAddr) {
    let mut cmd = Command::new("node");
    cmd.args(["-e", SSE_APP]);
    common::node_listening(cmd).await
}

/// What a client gets for `path` (with `extra` header lines), read to the end.
async fn exchange(addr: SocketAddr, path: &str, extra: &str) -> String {
    let request =
        format!("GET {path} HTTP/1.1\r\nHost: app.test\r\n{extra}Connection: close\r\n\r\n");
    let answer = raw_exchange_timeout(addr, request.as_bytes(), Duration::from_secs(15))
        .await
        .unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A client subscribed to a quiet stream at `addr` (its head, flushed at once, read).
async fn subscribed(addr: SocketAddr) -> tokio::net::TcpStream {
    subscribed_to(addr, "/events?gap=600000&flush=1").await
}

/// A client subscribed to the event stream at `path` (its head read).
async fn subscribed_to(addr: SocketAddr, path: &str) -> tokio::net::TcpStream {
    opened(addr, path, "Accept: text/event-stream\r\n").await
}

/// A client whose GET of `path` (with `extra` header lines) has its answer's head.
async fn opened(addr: SocketAddr, path: &str, extra: &str) -> tokio::net::TcpStream {
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: app.test\r\n{extra}\r\n");
    client.write_all(request.as_bytes()).await.unwrap();
    let mut head = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut head))
        .await
        .expect("no head")
        .unwrap();
    let head = String::from_utf8_lossy(&head[..n]).into_owned();
    assert_eq!(parse_status(head.as_bytes()), Some(200), "{head}");
    client
}

async fn stats(app: SocketAddr) -> serde_json::Value {
    let answer = exchange(app, "/stats", "").await;
    let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {answer}"))
}

/// With a request timeout of 1 s: an event stream whose first event (and head) comes
/// after 1.5 s and whose events are 1.5 s apart is relayed whole, whether the client
/// said it wants one (`Accept`, as every `EventSource` does) or the answer says it is
/// one (`Content-Type`). A plain answer that late still gets 504, and a plain body that
/// goes quiet as long is still cut: the timeout holds for everything else.
#[tokio::test]
async fn an_event_stream_outlasts_the_request_timeout_and_nothing_else_does() {
    let (_app, app) = sse_app().await;
    let d = proxy(&[app], &["--request-timeout", "1s"]).await;
    let accept = "Accept: text/event-stream\r\n";
    let (subscribed, declared, slow, chunks) = tokio::join!(
        exchange(d.addr(), "/events?gap=1500&count=3", accept),
        exchange(d.addr(), "/events?gap=1500&count=3&flush=1", ""),
        exchange(d.addr(), "/slow?ms=2500", ""),
        exchange(d.addr(), "/chunks?gap=2500", ""),
    );
    for (what, answer) in [("Accept", &subscribed), ("Content-Type", &declared)] {
        assert_eq!(
            parse_status(answer.as_bytes()),
            Some(200),
            "{what}: {answer}"
        );
        for i in 1..=3 {
            assert!(
                answer.contains(&format!("data: event {i}\n")),
                "{what}: {answer}"
            );
        }
        assert!(
            answer.ends_with("0\r\n\r\n"),
            "{what}: the stream was cut: {answer}"
        );
    }
    assert_eq!(parse_status(slow.as_bytes()), Some(504), "{slow}");
    // The answer names the setting: a file's balancer keeps 30 s where `drover run`
    // waits, and a report that worked under `drover run` got a bare 504 under `drover up`.
    assert!(slow.contains("--request-timeout"), "{slow}");
    assert_eq!(parse_status(chunks.as_bytes()), Some(200), "{chunks}");
    assert!(
        chunks.contains("first") && !chunks.contains("last"),
        "a plain body quiet past the request timeout was not cut: {chunks}"
    );
}

/// A client that leaves a quiet stream is let go, and the app hears of it (its
/// `req.on('close')`), within a request timeout, or a client timeout where that is
/// shorter: nothing is written on the stream that would find out, so drover asks the
/// client's socket that often. Until then the stream stays open across quiet gaps.
#[tokio::test]
async fn a_client_that_leaves_a_quiet_event_stream_frees_it_at_the_app() {
    for timeouts in [
        ["--request-timeout", "1s", "--client-timeout", "30s"],
        ["--request-timeout", "10m", "--client-timeout", "1s"],
    ] {
        a_client_leaves_a_quiet_stream(&timeouts).await;
    }
}

async fn a_client_leaves_a_quiet_stream(timeouts: &[&str]) {
    let (_app, app) = sse_app().await;
    let d = proxy(&[app], timeouts).await;
    let client = subscribed(d.addr()).await;
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let s = stats(app).await;
    assert_eq!(
        (s["open"].as_u64(), s["closed"].as_u64()),
        (Some(1), Some(0)),
        "{s}"
    );
    drop(client);
    let mut last = serde_json::Value::Null;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        last = stats(app).await;
        if last["closed"].as_u64() == Some(1) {
            assert_eq!(last["open"].as_u64(), Some(0), "{last}");
            return;
        }
    }
    panic!("{timeouts:?}: the app's stream stayed open 6 s after its client left: {last}");
}

/// Subscriptions whose head waits for the first event hold their endpoint's slots, but
/// once a request timeout has passed with their clients still there, drover counts them
/// as waiting, not as pending work: otherwise hundreds of them weigh as hundreds of
/// ordinary requests, and the endpoint holding a few more gets none of the short ones.
#[tokio::test]
async fn quiet_subscriptions_stop_counting_as_pending_work() {
    let (_app, app) = sse_app().await;
    let d = proxy(
        &[app],
        &["--request-timeout", "1s", "--admin", "127.0.0.1:0"],
    )
    .await;
    let admin = common::admin_addr(&d).await;
    let mut clients = Vec::new();
    for _ in 0..3 {
        let mut c = tokio::net::TcpStream::connect(d.addr()).await.unwrap();
        c.write_all(b"GET /events?gap=600000 HTTP/1.1\r\nHost: app.test\r\nAccept: text/event-stream\r\n\r\n")
            .await
            .unwrap();
        clients.push(c);
    }
    let mut last = None;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let s = common::status(admin).await;
        let e = &s.balancers[0].endpoints[0];
        if (e.in_flight, e.pending) == (3, 0) {
            assert_eq!(stats(app).await["open"].as_u64(), Some(3));
            return;
        }
        last = Some((e.in_flight, e.pending));
    }
    panic!("(in flight, pending) stayed {last:?}, not (3, 0)");
}

/// An event stream never ends by itself, so a stop waits out the drain timeout for it,
/// and says so a second in (before, it sat silent for the whole drain); a second SIGINT
/// (a second Ctrl-C) or SIGTERM stops the wait, and drover exits 0.
#[tokio::test]
async fn a_second_signal_ends_a_drain_that_an_event_stream_holds_open() {
    let (_app, app) = sse_app().await;
    for sig in ["INT", "TERM"] {
        let d = proxy(&[app], &["--drain-timeout", "300s"]).await;
        let _client = subscribed(d.addr()).await;
        d.signal(sig).unwrap();
        let draining = d
            .wait_for_line("received, draining", Duration::from_secs(10))
            .await;
        assert!(draining.is_some(), "SIG{sig}: {}", d.stderr_text());
        assert!(
            d.wait_exit(Duration::from_secs(1)).await.is_none(),
            "SIG{sig}: drover did not wait for the open stream"
        );
        // It says what it waits on, and how to stop waiting, instead of sitting silent.
        let said = d
            .wait_for_line("open client connection", Duration::from_secs(5))
            .await
            .unwrap_or_else(|| panic!("SIG{sig}: nothing said:\n{}", d.stderr_text()));
        assert!(
            said.contains("waiting up to 300s for 1 open client connection")
                && said.contains("send the signal again"),
            "{said}"
        );
        d.signal(sig).unwrap();
        let status = d.wait_exit(Duration::from_secs(20)).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "SIG{sig} twice: {status:?}: {}",
            d.stderr_text()
        );
        assert!(
            d.stderr_text().contains(&format!("SIG{sig} again")),
            "{}",
            d.stderr_text()
        );
    }
}

/// `drover run --drain-timeout` bounds a stop's wait for its clients too, as it bounds
/// a reload's for each worker: with 1 s, a stop that an event stream holds open ends
/// within it. Before, the flag reached only the workers, and every SIGTERM of
/// `drover run` waited 30 s for such a stream (past `docker stop`'s 10 s).
#[tokio::test]
async fn drover_runs_drain_timeout_bounds_the_wait_of_a_stop() {
    let d = run_sse("streams-run-drain", "1", &["--drain-timeout", "1s"]).await;
    let _client = subscribed(d.addr()).await;
    d.signal("TERM").unwrap();
    let status = d.wait_exit(Duration::from_secs(15)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}: {}",
        d.stderr_text()
    );
    assert!(
        d.stderr_text().contains("drain timeout reached"),
        "{}",
        d.stderr_text()
    );
}

/// `drover run` takes `drover proxy`'s timeouts for its balancer: with
/// `--request-timeout 1s` a plain answer after 2.5 s is a 504, and an event stream with
/// 1.5 s between events arrives whole.
#[tokio::test]
async fn drover_run_takes_the_request_timeout_and_an_event_stream_outlasts_it() {
    let app = common::temp_dir("streams-run").join("sse.js");
    std::fs::write(&app, SSE_APP).unwrap();
    let app = app.display().to_string();
    let args = [
        "run",
        "-w",
        "2",
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--request-timeout",
        "1s",
        "--",
        "node",
        &app,
    ];
    let d = drover_testkit::DroverProcess::spawn(common::bin(), &args).await;
    let admin = common::admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    let accept = "Accept: text/event-stream\r\n";
    let (slow, stream) = tokio::join!(
        exchange(d.addr(), "/slow?ms=2500", ""),
        exchange(d.addr(), "/events?gap=1500&count=2", accept),
    );
    assert_eq!(parse_status(slow.as_bytes()), Some(504), "{slow}");
    assert!(
        stream.contains("data: event 2\n") && stream.ends_with("0\r\n\r\n"),
        "{stream}"
    );
}

/// `drover run -w WORKERS EXTRA -- node sse.js`, every worker serving.
async fn run_sse(label: &str, workers: &str, extra: &[&str]) -> drover_testkit::DroverProcess {
    let app = common::temp_dir(label).join("sse.js");
    std::fs::write(&app, SSE_APP).unwrap();
    let app = app.display().to_string();
    let mut args = vec![
        "run",
        "-w",
        workers,
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["--", "node", &app]);
    let d = drover_testkit::DroverProcess::spawn(common::bin(), &args).await;
    let admin = common::admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    d
}

/// Under `drover run` an answer may take as long as the app likes, as under Node's
/// cluster module and PM2, which bound none: a long-poll, a report or an export that
/// answered after 30 s got a 504 from drover alone. The wait asks at each quiet
/// interval (the client timeout, here 500 ms) whether its client is still there. A
/// client that leaves is let go at once, not at the next interval (30 s by default):
/// the app hears of it (`req.on('close')`) while its answer is still on its way, as it
/// would without drover, and can keep what it would have sent for the next poll.
#[tokio::test]
async fn under_drover_run_an_answer_waits_as_long_as_its_client_stays() {
    let d = run_sse(
        "streams-run-off",
        "1",
        &["--request-timeout", "off", "--client-timeout", "500ms"],
    )
    .await;
    let slow = exchange(d.addr(), "/slow?ms=2500", "").await;
    assert_eq!(parse_status(slow.as_bytes()), Some(200), "{slow}");
    assert!(slow.ends_with("late"), "{slow}");

    // drover run's defaults: no request timeout, and a 30 s client timeout.
    let d = run_sse("streams-run-default", "1", &[]).await;
    let mut client = tokio::net::TcpStream::connect(d.addr()).await.unwrap();
    client
        .write_all(b"GET /slow?ms=600000 HTTP/1.1\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(stats(d.addr()).await["left"].as_u64(), Some(0));
    drop(client);
    let mut last = serde_json::Value::Null;
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        last = stats(d.addr()).await;
        if last["left"].as_u64() == Some(1) {
            return;
        }
    }
    panic!(
        "the app's answer was still awaited 10 s after its client left: {last}\n{}",
        d.stderr_text()
    );
}

/// A browser's `EventSource` (headless Chromium) on a page of the app, supervised by
/// `drover up` as 2 workers behind a balancer whose request timeout is 1 s: the first
/// event, and the head with it, come after 1.5 s, the next two 1.5 s apart, and all
/// three arrive on the one stream.
#[tokio::test]
async fn a_browsers_event_source_gets_every_event_through_drovers_workers() {
    use common::browser::{chromium_missing, Cdp, Chromium};
    if chromium_missing() {
        return;
    }
    let dir = common::temp_dir("streams-browser");
    let app = dir.join("sse.js");
    std::fs::write(&app, SSE_APP).unwrap();
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[app]]\nname = \"web\"\ncommand = [\"node\", \"{}\"]\nworkers = 2\n\n[[balancer]]\nlisten = \"127.0.0.1:0\"\nbackends = [\"app:web\"]\ntimeouts = {{ request = \"1s\" }}\n",
        app.display()
    );
    let (d, _admin, _file) = common::up_serving("streams-browser-up", &toml).await;
    let chromium = Chromium::start(&dir.join("chromium")).await;
    let mut cdp = Cdp::page(&chromium).await;
    let url = format!("http://{}/page", d.addr());
    cdp.call("Page.navigate", serde_json::json!({ "url": url }))
        .await;
    let all = cdp
        .until(
            Duration::from_secs(20),
            "window.got && window.got.length >= 3",
        )
        .await;
    let got = cdp.eval("JSON.stringify(window.got)").await;
    assert!(all, "the page got {got}: {}", d.stderr_text());
    assert!(
        got.as_str()
            .unwrap()
            .starts_with(r#"["event 1","event 2","event 3""#),
        "{got}"
    );
}

/// A rolling reload does not wait out each worker's answers under way before it goes
/// on: an old process finishes what it holds in the background while the next worker
/// is replaced. With 2 workers each sending a slow download (not a stream drover ends,
/// see `a_reload_ends_the_streams_of_an_app_that_does_not_handle_sigterm`) and a drain
/// timeout of 60 s, both have new processes while both downloads are under way; each
/// arrives whole, and the reload is done once they have. Before, each old process held
/// the reload for its whole drain (a reload of 4 workers with streams took 40 s, PM2's
/// 0.8 s), and the second worker was replaced only after the first answer was over.
#[tokio::test]
async fn a_reload_replaces_the_next_worker_while_an_old_one_finishes_a_download() {
    let d = run_sse("streams-reload-download", "2", &["--drain-timeout", "60s"]).await;
    let admin = common::admin_addr(&d).await;
    let old = common::serving_pids(&common::status(admin).await);
    let mut downloads = Vec::new();
    for _ in 0..2 {
        downloads.push(opened(d.addr(), "/chunks?gap=8000", "Connection: close\r\n").await);
    }
    // One on each worker: the second goes to the one with nothing in flight.
    let apart = drover_testkit::wait_until_async(Duration::from_secs(10), || async {
        let s = common::status(admin).await;
        s.balancers[0].endpoints.iter().all(|e| e.in_flight == 1)
    })
    .await;
    assert!(apart, "{:?}", common::status(admin).await);
    let reload = tokio::spawn(async move { common::ctl(admin, &["reload"]).await });
    let both_new = drover_testkit::wait_until_async(Duration::from_secs(40), || async {
        let now = common::serving_pids(&common::status(admin).await);
        now.iter().zip(&old).all(|(n, o)| n.is_some() && n != o)
    })
    .await;
    assert!(
        both_new,
        "{:?}\n{}",
        common::status(admin).await,
        d.stderr_text()
    );
    assert!(
        !reload.is_finished(),
        "the reload did not wait for the old processes"
    );
    for download in &mut downloads {
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(20), download.read_to_end(&mut rest))
            .await
            .expect("an old worker's download did not end")
            .unwrap();
        let rest = String::from_utf8_lossy(&rest);
        assert!(
            rest.contains("last"),
            "cut short: {rest}\n{}",
            d.stderr_text()
        );
    }
    let (code, out, err) = tokio::time::timeout(Duration::from_secs(30), reload)
        .await
        .expect("the reload did not end once the downloads had")
        .unwrap();
    assert_eq!(code, 0, "{out}{err}");
}

/// An app that ends its own streams on SIGTERM (as Fastify's and socket.io's `close()`
/// end their WebSockets, and NestJS's shutdown hooks run) gets the signal soon after a
/// reload's drain of its old worker begins, while an event stream holds it, and ends
/// the stream itself: the client reads the app's last event. Before, the old worker
/// got SIGTERM only when `drain_timeout` ran out (here 120 s; a reload of an app with
/// one WebSocket open took 30 s, PM2's 4.6 s), then the stream was cut.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_tells_an_app_that_handles_sigterm_while_a_stream_holds_its_drain() {
    let (d, admin, mut client) = run_app_that_ends_its_streams("streams-reload").await;
    let reload = tokio::spawn(async move { common::ctl(admin, &["reload"]).await });
    read_the_apps_last_event(&d, &mut client).await;
    let (code, out, err) = tokio::time::timeout(Duration::from_secs(30), reload)
        .await
        .expect("the reload did not end")
        .unwrap();
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
}

/// The same at a stop (Ctrl-C): once only the stream is left, the workers are stopped,
/// so the app ends it itself, and drover exits. Before, the balancer's drain waited
/// out `drain_timeout` (here 120 s) for the stream, and then cut it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_tells_an_app_that_handles_sigterm_while_a_stream_holds_the_drain() {
    let (d, _admin, mut client) = run_app_that_ends_its_streams("streams-stop").await;
    d.signal("INT").unwrap();
    read_the_apps_last_event(&d, &mut client).await;
    let status = d.wait_exit(Duration::from_secs(30)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}: {}",
        d.stderr_text()
    );
    assert!(
        d.stderr_text()
            .contains("only streams (event streams, WebSockets) are left open"),
        "{}",
        d.stderr_text()
    );
}

/// `drover run -w 1 --drain-timeout 120s` of a Node app that ends its event streams on
/// SIGTERM (as Fastify's and socket.io's `close()` end their WebSockets), serving, with
/// one client subscribed.
async fn run_app_that_ends_its_streams(
    dir: &str,
) -> (
    drover_testkit::DroverProcess,
    std::net::SocketAddr,
    tokio::net::TcpStream,
) {
    let source = r#"
const streams = new Set();
const server = require('http').createServer((req, res) => {
  res.writeHead(200, { 'Content-Type': 'text/event-stream' });
  res.flushHeaders();
  streams.add(res);
  req.on('close', () => streams.delete(res));
});
process.on('SIGTERM', () => {
  for (const res of streams) res.end(`data: bye from ${process.pid}\n\n`);
  server.close();
});
server.listen(process.env.PORT || 0, '127.0.0.1');
"#;
    let (d, admin) = run_node_app(dir, source, &["--drain-timeout", "120s"]).await;
    let client = subscribed_to(d.addr(), "/events").await;
    (d, admin, client)
}

/// `drover run -w 1 FLAGS -- node APP` of the Node app `source` (written to a file in a
/// directory of its own, `dir`), once it serves; with its admin address.
async fn run_node_app(
    dir: &str,
    source: &str,
    flags: &[&str],
) -> (drover_testkit::DroverProcess, std::net::SocketAddr) {
    let app = common::temp_dir(dir).join("app.js");
    std::fs::write(&app, source).unwrap();
    let app = app.display().to_string();
    let mut args = vec![
        "run",
        "-w",
        "1",
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(flags);
    args.extend(["--", "node", app.as_str()]);
    let d = drover_testkit::DroverProcess::spawn(common::bin(), &args).await;
    let admin = common::admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    (d, admin)
}

/// Reads `client`'s stream until the app's last event ("bye from PID"), within 25 s.
async fn read_the_apps_last_event(
    d: &drover_testkit::DroverProcess,
    client: &mut tokio::net::TcpStream,
) {
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(25), async {
        let mut buf = [0u8; 1024];
        while !String::from_utf8_lossy(&got).contains("bye from") {
            match client.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    let got = String::from_utf8_lossy(&got).into_owned();
    assert!(
        read.is_ok() && got.contains("bye from"),
        "the app's last event did not come within 25 s: {got:?}\n{}",
        d.stderr_text()
    );
}

/// Streams cut together (their backend killed under 20 open event streams) are logged
/// as one line a second with the count held back, as other failed requests are: a
/// worker stopped with 50 streams open wrote 50 lines within 3 ms.
#[tokio::test]
async fn streams_cut_together_are_logged_once_a_second() {
    let (mut app_process, app) = sse_app().await;
    let d = proxy(&[app], &[]).await;
    let mut clients = Vec::new();
    for _ in 0..20 {
        clients.push(subscribed(d.addr()).await);
    }
    app_process.start_kill().unwrap();
    for client in &mut clients {
        let mut buf = [0u8; 256];
        let ended = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(n) = client.read(&mut buf).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        assert!(ended.is_ok(), "a stream outlived its backend");
    }
    let logged = drover_testkit::wait_until(Duration::from_secs(5), || {
        !d.lines_containing("failed mid-stream").is_empty()
    })
    .await;
    assert!(logged, "{}", d.stderr_text());
    let lines = d.lines_containing("failed mid-stream");
    assert!(lines.len() <= 2, "{lines:#?}");
}

/// A worker whose server waits for its connections to end once it closes (Node's
/// `server.close()` on SIGTERM, as Next.js does) leaves as soon as the last response it
/// streamed has ended: drover closes the backend connection that response frees rather
/// than keep it for reuse. Before, the idle connection held the old worker of a reload
/// until its keep-alive timeout (6 s for Next.js; here 120 s, past `--stop-timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retiring_worker_is_not_held_by_the_connection_its_last_stream_freed() {
    let source = r#"
const server = require('http').createServer((req, res) => {
  res.writeHead(200, { 'Content-Type': 'text/plain' });
  res.write('first\n');
  setTimeout(() => res.end('last\n'), 1500);
});
server.keepAliveTimeout = 120000;
process.on('SIGTERM', () => server.close());
server.listen(process.env.PORT || 0, '127.0.0.1');
"#;
    let (d, admin) = run_node_app("streams-retiring", source, &["--stop-timeout", "90s"]).await;
    let mut client = subscribed_to(d.addr(), "/slow").await;
    let reload = tokio::spawn(async move { common::ctl(admin, &["reload"]).await });
    let mut got = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&got).contains("last") {
        match tokio::time::timeout(Duration::from_secs(10), client.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => got.extend_from_slice(&buf[..n]),
            other => panic!(
                "the stream ended early ({other:?}): {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    let (code, out, err) = tokio::time::timeout(Duration::from_secs(30), reload)
        .await
        .unwrap_or_else(|_| {
            panic!(
                "the old worker was held past its stream:\n{}",
                d.stderr_text()
            )
        })
        .unwrap();
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
}

/// A Node app whose server, on SIGTERM, closes and waits for its connections to end
/// before it exits, as Nuxt's (Nitro) and SvelteKit's adapter-node do (Node exits by
/// itself once they have, its channel to drover let go): `/events` is an
/// event stream that never ends by itself, and an upgrade is a tunnel that echoes.
const WAITING_APP: &str = r#"
const server = require('http').createServer((req, res) => {
  if (req.url !== '/events') return res.end('ok');
  res.writeHead(200, { 'Content-Type': 'text/event-stream' });
  res.flushHeaders();
});
server.on('upgrade', (req, socket) => {
  socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n');
  socket.on('data', (d) => socket.write(d));
});
process.on('SIGTERM', () => server.close(() => process.exit(0)));
server.listen(process.env.PORT, '127.0.0.1');
"#;

/// `drover run -w 1 -- node APP` of the Node program `js`, its worker serving, and its
/// admin address.
async fn run_one_worker(label: &str, js: &str) -> (drover_testkit::DroverProcess, SocketAddr) {
    let app = common::temp_dir(label).join("app.js");
    std::fs::write(&app, js).unwrap();
    let args = common::run_args(1, &[], &["node", &app.display().to_string()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let d = drover_testkit::DroverProcess::spawn(common::bin(), &args).await;
    let admin = common::admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    (d, admin)
}

/// A tunnel through `addr` to the app's upgrade handler, its echo checked.
async fn tunnelled(addr: SocketAddr) -> tokio::net::TcpStream {
    let mut client = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request =
        "GET /ws HTTP/1.1\r\nHost: app.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n";
    client.write_all(request.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    while !String::from_utf8_lossy(&got).contains("\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut buf))
            .await
            .expect("no 101")
            .unwrap();
        assert!(
            n > 0,
            "closed before its 101: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(
        parse_status(&got),
        Some(101),
        "{}",
        String::from_utf8_lossy(&got)
    );
    client.write_all(b"ping").await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(10), client.read(&mut buf))
        .await
        .expect("no echo")
        .unwrap();
    assert_eq!(&buf[..n], b"ping");
    client
}

/// Whether `client`'s connection ends (EOF or an error) within `limit`, what it gets
/// meanwhile read and dropped.
async fn ends_within(client: &mut tokio::net::TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 512];
    tokio::time::timeout(limit, async {
        while matches!(client.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await
    .is_ok()
}

/// A reload and a stop of an app whose server waits on SIGTERM for its connections to
/// end, with an event stream (and, at the stop, a WebSocket too) open through drover:
/// drover ends the streams it relays to the worker 2 s after its SIGTERM, the app's
/// `server.close()` returns, and the worker exits by itself. Before, drover held them
/// open until `stop_timeout` and SIGKILL: a stop of Nuxt or SvelteKit with one stream
/// open took 14 s (PM2's 2 s), and its shutdown code never ran.
#[tokio::test]
async fn streams_to_a_worker_told_to_stop_end_so_that_its_server_can_close() {
    let (d, admin) = run_one_worker("streams-cut", WAITING_APP).await;

    let mut stream = subscribed_to(d.addr(), "/events").await;
    d.signal("HUP").unwrap();
    assert!(
        ends_within(&mut stream, Duration::from_secs(30)).await,
        "the stream to the reloaded worker stayed open\n{}",
        d.stderr_text()
    );
    // A reload returns once its old workers have stopped.
    d.wait_for_line("reloaded app", Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("no reload:\n{}", d.stderr_text()));
    assert!(!d.stderr_text().contains("SIGKILL"), "{}", d.stderr_text());
    common::wait_all_serving(&d, admin).await;

    let mut stream = subscribed_to(d.addr(), "/events").await;
    let mut tunnel = tunnelled(d.addr()).await;
    d.signal("TERM").unwrap();
    let status = d.wait_exit(Duration::from_secs(30)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}: {}",
        d.stderr_text()
    );
    assert!(ends_within(&mut stream, Duration::from_secs(1)).await);
    assert!(ends_within(&mut tunnel, Duration::from_secs(1)).await);
    assert!(!d.stderr_text().contains("SIGKILL"), "{}", d.stderr_text());
}

/// A reload of an app that does not handle SIGTERM (a WebSocket server as the `ws`
/// README writes one) with an event stream and a WebSocket open on its worker: once
/// only they are left, drover ends them, and the old worker's drain is over. Before, it
/// waited out `drain_timeout` (30 s; PM2's reload: 0.9 s) with the clients on the old
/// code all along.
#[tokio::test]
async fn a_reload_ends_the_streams_of_an_app_that_does_not_handle_sigterm() {
    let handler = "process.on('SIGTERM', () => server.close(() => process.exit(0)));";
    assert!(WAITING_APP.contains(handler));
    let (d, _admin) = run_one_worker("streams-cut-nosig", &WAITING_APP.replace(handler, "")).await;
    let mut stream = subscribed_to(d.addr(), "/events").await;
    let mut tunnel = tunnelled(d.addr()).await;
    d.signal("HUP").unwrap();
    for (what, client) in [("stream", &mut stream), ("WebSocket", &mut tunnel)] {
        assert!(
            ends_within(client, Duration::from_secs(20)).await,
            "the {what} to the reloaded worker stayed open\n{}",
            d.stderr_text()
        );
    }
    d.wait_for_line("reloaded app", Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("no reload:\n{}", d.stderr_text()));
    assert!(
        !d.stderr_text().contains("drain_timeout"),
        "{}",
        d.stderr_text()
    );
    // Its clients come back to the new worker.
    let _again = subscribed_to(d.addr(), "/events").await;
}
