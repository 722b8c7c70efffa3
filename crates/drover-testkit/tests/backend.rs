//! Every Backend route, driven through the testkit's own clients.

use drover_testkit::{
    big_body, chunked_body, parse_status, raw_exchange, ws_connect, Backend, HttpClient, WsMessage,
};
use std::time::{Duration, Instant};

#[tokio::test]
async fn keep_alive_routes_on_one_connection() {
    let b = Backend::named("b1").start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();

    let r = c.get("/").await;
    assert_eq!((r.status, r.text().as_str()), (200, "b1"));
    assert_eq!(r.header("X-Backend"), Some("b1"));

    let r = c.get("/anything/else?q=1").await;
    assert_eq!(r.text(), "b1");

    assert_eq!(c.get("/status/503").await.status, 503);
    let r = c.get("/status/204").await;
    assert_eq!((r.status, r.body.len()), (204, 0));
    assert_eq!(c.get("/status/nope").await.status, 400);

    let r = c.get("/load/0.42").await;
    assert_eq!(
        r.header("endpoint-load-metrics"),
        Some("TEXT cpu_utilization=0.42, named_metrics.elu=0.42")
    );

    let r = c
        .request("HEAD", "/", &[], None)
        .await
        .expect("HEAD answered");
    assert_eq!((r.status, r.body.len()), (200, 0));
    assert_eq!(r.header("content-length"), Some("2"));

    assert_eq!(b.connections(), 1, "all on one keep-alive connection");
    assert_eq!(b.hits(), 7);
    assert_eq!(b.hits_for("/"), 2);
    assert_eq!(b.hits_for("/anything/else"), 1);
    let last = b.last_request_head().unwrap();
    assert_eq!((last.method.as_str(), last.target.as_str()), ("HEAD", "/"));
    assert_eq!(b.request_heads().len(), 7);
    b.reset_stats();
    assert_eq!((b.hits(), b.request_heads().len()), (0, 0));
}

#[tokio::test]
async fn default_name_is_the_address() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();
    assert_eq!(c.get("/").await.text(), b.addr().to_string());
    assert_eq!(b.name(), b.addr().to_string());
}

#[tokio::test]
async fn delay_waits() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();
    let start = Instant::now();
    assert_eq!(c.get("/delay/150").await.status, 200);
    assert!(start.elapsed() >= Duration::from_millis(150));
}

#[tokio::test]
async fn stall_once_pauses_every_connection_once() {
    let b = Backend::start().await;
    let mut first = HttpClient::connect(b.addr()).await.unwrap();
    let mut other = HttpClient::connect(b.addr()).await.unwrap();
    let start = Instant::now();
    let stalled = tokio::spawn(async move { first.get("/stall-once/300").await });
    assert!(drover_testkit::wait_until(Duration::from_secs(2), || b.hits() == 1).await);
    // Another connection, another path: held back too.
    assert_eq!(other.get("/").await.status, 200);
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(stalled.await.unwrap().status, 200);
    // Once only: the same path again is answered at once.
    let again = Instant::now();
    assert_eq!(other.get("/stall-once/300").await.status, 200);
    assert!(again.elapsed() < Duration::from_millis(300));
}

#[tokio::test]
async fn in_flight_is_tracked() {
    let b = Backend::start().await;
    let mut tasks = Vec::new();
    for _ in 0..3 {
        let addr = b.addr();
        tasks.push(tokio::spawn(async move {
            HttpClient::connect(addr)
                .await
                .unwrap()
                .get("/delay/300")
                .await
        }));
    }
    assert!(drover_testkit::wait_until(Duration::from_secs(2), || b.in_flight() == 3).await);
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 200);
    }
    assert_eq!((b.in_flight(), b.max_in_flight()), (0, 3));
}

#[tokio::test]
async fn echo_content_length_and_chunked_with_trailers() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();

    let r = c
        .request("POST", "/echo", &[], Some(b"hello body"))
        .await
        .unwrap();
    assert_eq!(r.body, b"hello body");
    assert_eq!(r.header("content-length"), Some("10"));

    let mut body = chunked_body(&[b"abc", b"0123456789abcdef0123"]);
    // Add a trailer field to the encoded body by hand.
    body.truncate(body.len() - 2);
    body.extend_from_slice(b"x-sum: 42\r\n\r\n");
    let r = c
        .request(
            "POST",
            "/echo",
            &[("transfer-encoding", "chunked")],
            Some(&body),
        )
        .await
        .unwrap();
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.body, b"abc0123456789abcdef0123");
    assert_eq!(r.trailers, vec![("x-sum".to_string(), "42".to_string())]);

    // Still the same connection after both framings.
    assert_eq!(c.get("/").await.status, 200);
    assert_eq!(b.connections(), 1);
}

#[tokio::test]
async fn expect_continue_is_honoured() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();
    let r = c
        .request("PUT", "/echo", &[("expect", "100-continue")], Some(b"x"))
        .await
        .unwrap();
    assert_eq!((r.status, r.body.as_slice()), (200, b"x".as_slice()));
}

#[tokio::test]
async fn headers_returns_the_raw_head() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();
    let r = c
        .request(
            "GET",
            "/headers",
            &[("X-Custom", "v1"), ("x-custom", "v2")],
            None,
        )
        .await
        .unwrap();
    let text = r.text();
    assert!(text.starts_with("GET /headers HTTP/1.1\r\n"), "{text}");
    assert!(text.contains("X-Custom: v1\r\n") && text.ends_with("\r\n\r\n"));
    let head = b.last_request_head().unwrap();
    assert_eq!(head.header_all("x-custom"), vec![b"v1".as_slice(), b"v2"]);
    assert_eq!(head.header_str("host"), Some(b.addr().to_string()));
}

#[tokio::test]
async fn connection_close_is_honoured() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();
    let r = c
        .request("GET", "/", &[("connection", "close")], None)
        .await
        .unwrap();
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.request("GET", "/", &[], None).await.is_err());
}

#[tokio::test]
async fn close_route_gives_eof_without_response() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();
    let err = c.request("GET", "/close", &[], None).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof, "{err}");
    assert_eq!(b.hits_for("/close"), 1);
}

#[tokio::test]
async fn hang_never_answers_until_stop() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();
    c.set_timeout(Duration::from_millis(200));
    let err = c.request("GET", "/hang", &[], None).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    assert_eq!(b.open_connections(), 1);
    b.stop().await;
    assert!(drover_testkit::wait_until(Duration::from_secs(2), || b.open_connections() == 0).await);
    c.set_timeout(Duration::from_secs(2));
    assert!(
        c.read_response(false).await.is_err(),
        "stop() drops the socket"
    );
}

#[tokio::test]
async fn health_switches() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();
    let r = c.get("/health").await;
    assert_eq!((r.status, r.text().as_str()), (200, "ok"));
    b.set_health(false);
    assert_eq!(c.get("/health").await.status, 503);
    b.set_health(true);
    assert_eq!(c.get("/health").await.status, 200);
    b.set_hang_health(true);
    c.set_timeout(Duration::from_millis(200));
    assert!(c.request("GET", "/health", &[], None).await.is_err());
    assert_eq!(b.hits_for("/health"), 4);
    assert_eq!(b.hits_except_health(), 0);
}

#[tokio::test]
async fn big_is_streamed_in_chunks() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();
    let n = 100_000;
    let r = c.get(&format!("/big/{n}")).await;
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.body.len(), n);
    assert_eq!(r.body, big_body(n));
    assert_eq!(c.get("/big/0").await.body.len(), 0);
}

#[tokio::test]
async fn stop_then_restart_on_same_port() {
    let b = Backend::named("first").start().await;
    let addr = b.addr();
    let mut c = HttpClient::connect(addr).await.unwrap();
    assert_eq!(c.get("/").await.text(), "first");
    b.stop().await;
    assert!(c.request("GET", "/", &[], None).await.is_err());
    assert!(HttpClient::connect(addr).await.is_err(), "listener closed");

    let b2 = Backend::named("second").start_on(addr).await.unwrap();
    let mut c = HttpClient::connect(addr).await.unwrap();
    assert_eq!(c.get("/").await.text(), "second");
    assert_eq!(b2.connections(), 1);
}

#[tokio::test]
async fn raw_exchange_and_bad_requests() {
    let b = Backend::start().await;
    let out = raw_exchange(b.addr(), b"GARBAGE\r\n\r\n").await.unwrap();
    assert_eq!(parse_status(&out), Some(400));
    let out = raw_exchange(
        b.addr(),
        b"GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(parse_status(&out), Some(200));
    assert_eq!(parse_status(b"HTTP/1.0 404 Not Found\r\n"), Some(404));
    assert_eq!(parse_status(b"HTTP/2 200"), None);
    assert_eq!(parse_status(b""), None);
}

#[tokio::test]
async fn websocket_echo_round_trip() {
    let b = Backend::named("wsb").start().await;
    let mut ws = ws_connect(b.addr(), "/ws").await.unwrap();
    assert_eq!(ws.handshake.status, 101);
    assert_eq!(ws.handshake.header("x-backend"), Some("wsb"));
    ws.send_text("hello").await.unwrap();
    assert_eq!(ws.recv().await.unwrap(), WsMessage::Text("hello".into()));
    let big: Vec<u8> = (0..70_000).map(|i| (i % 256) as u8).collect();
    ws.send_binary(&big).await.unwrap();
    assert_eq!(ws.recv().await.unwrap(), WsMessage::Binary(big));
    ws.send_ping(b"p").await.unwrap();
    assert_eq!(ws.recv().await.unwrap(), WsMessage::Pong(b"p".to_vec()));
    ws.close(1000).await.unwrap();
    assert_eq!(ws.recv().await.unwrap(), WsMessage::Close(Some(1000)));
    assert!(ws.recv().await.is_err(), "server closes after close frame");
}

#[tokio::test]
async fn websocket_requires_upgrade_headers() {
    let b = Backend::start().await;
    let mut c = HttpClient::connect(b.addr()).await.unwrap();
    let r = c.get("/ws").await;
    assert_eq!(r.status, 400);
    assert!(r.text().contains("Upgrade"));
}
