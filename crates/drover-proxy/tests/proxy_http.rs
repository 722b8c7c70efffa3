//! The data plane through real sockets: keep-alive, bodies, headers, upgrades.

mod common;

use common::{addrs, backends, proxy};
use drover_balance::Strategy;
use drover_testkit::{big_body, chunked_body, raw_exchange, ws_connect, HttpClient, WsMessage};

#[tokio::test]
async fn keep_alive_both_sides() {
    let b = backends(2).await;
    let d = proxy(&addrs(&b), Strategy::RoundRobin, |_| {});
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..20 {
        let r = c.get("/").await;
        assert_eq!(r.status, 200);
    }
    // One client connection, and the proxy reused its backend connections.
    assert_eq!(b[0].hits() + b[1].hits(), 20);
    assert!(
        b[0].connections() + b[1].connections() <= 2,
        "backend connections were not reused"
    );
}

#[tokio::test]
async fn forwarding_headers_and_request_id() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), Strategy::default(), |_| {});
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c
        .request(
            "GET",
            "/headers",
            &[
                ("Host", "shop.example"),
                ("X-Forwarded-For", "203.0.113.9"),
                ("Connection", "keep-alive, x-secret"),
                ("X-Secret", "1"),
            ],
            None,
        )
        .await
        .unwrap();
    assert_eq!(r.status, 200);
    let head = b[0].last_request_head().unwrap();
    assert_eq!(
        head.header_str("x-forwarded-for").as_deref(),
        Some("203.0.113.9, 127.0.0.1")
    );
    assert_eq!(
        head.header_str("x-forwarded-proto").as_deref(),
        Some("http")
    );
    assert_eq!(
        head.header_str("x-forwarded-host").as_deref(),
        Some("shop.example")
    );
    assert_eq!(
        head.header_str("forwarded").as_deref(),
        Some("for=127.0.0.1;host=\"shop.example\";proto=http")
    );
    assert_eq!(head.header_str("x-request-id").map(|s| s.len()), Some(16));
    assert!(
        head.header("x-secret").is_none(),
        "a header named in Connection was forwarded"
    );
    assert!(head.header("connection").is_none());

    c.request("GET", "/headers", &[("X-Request-Id", "keep-me")], None)
        .await
        .unwrap();
    let head = b[0].last_request_head().unwrap();
    assert_eq!(head.header_all("x-request-id"), vec![&b"keep-me"[..]]);
}

#[tokio::test]
async fn bodies_stream_both_ways() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), Strategy::default(), |_| {});
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let body = big_body(300_000);
    let r = c.request("POST", "/echo", &[], Some(&body)).await.unwrap();
    assert_eq!(r.status, 200);
    assert_eq!(r.body, body);

    let chunked = chunked_body(&[b"hello ", b"chunked ", b"world"]);
    let r = c
        .request(
            "POST",
            "/echo",
            &[("Transfer-Encoding", "chunked")],
            Some(&chunked),
        )
        .await
        .unwrap();
    assert_eq!(r.header("transfer-encoding"), Some("chunked"));
    assert_eq!(r.text(), "hello chunked world");

    let r = c.get("/big/1000000").await;
    assert_eq!(r.body, big_body(1_000_000));
    // The connection is still good after all that.
    assert_eq!(c.get("/").await.status, 200);
}

#[tokio::test]
async fn load_reports_are_consumed_and_removed() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), Strategy::default(), |_| {});
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c.get("/load/0.75").await;
    assert_eq!(r.status, 200);
    assert!(r.header("endpoint-load-metrics").is_none());
    assert_eq!(r.header("x-backend"), Some("b0"));
}

#[tokio::test]
async fn head_and_http10() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), Strategy::default(), |_| {});
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c.request("HEAD", "/big/5000", &[], None).await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.body.is_empty());
    assert_eq!(c.get("/").await.status, 200);

    // HTTP/1.0 cannot read chunks: drover decodes them and closes.
    let raw = raw_exchange(d.addr(), b"GET /big/40000 HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(!text.to_ascii_lowercase().contains("transfer-encoding"));
    let body_at = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4;
    assert_eq!(&raw[body_at..], &big_body(40_000)[..]);
}

#[tokio::test]
async fn pipelined_requests_answer_in_order() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), Strategy::default(), |_| {});
    let raw = raw_exchange(
        d.addr(),
        b"GET /delay/50 HTTP/1.1\r\nHost: a\r\n\r\nGET /status/201 HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&raw);
    let first = text.find("HTTP/1.1 200").expect("first response");
    let second = text.find("HTTP/1.1 201").expect("second response");
    assert!(first < second, "{text}");
}

#[tokio::test]
async fn websocket_echo_through_the_proxy() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), Strategy::default(), |_| {});
    let mut ws = ws_connect(d.addr(), "/ws").await.unwrap();
    for msg in ["hello", "through", "drover"] {
        ws.send_text(msg).await.unwrap();
        match ws.recv().await.unwrap() {
            WsMessage::Text(t) => assert_eq!(t, msg),
            other => panic!("unexpected {other:?}"),
        }
    }
    ws.close(1000).await.unwrap();
}

#[tokio::test]
async fn expect_continue_is_answered() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), Strategy::default(), |_| {});
    let raw = raw_exchange(
        d.addr(),
        b"POST /echo HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi",
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&raw);
    assert!(
        text.starts_with("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200"),
        "{text}"
    );
    assert!(text.ends_with("hi"), "{text}");
}
