//! Requests drover must refuse, and must not pass on: each gets its status and the
//! backend never sees it.

mod common;

use common::{addrs, backends, proxy};
use drover_balance::Strategy;
use drover_testkit::{parse_status, raw_exchange, raw_exchange_timeout};
use std::time::Duration;

async fn refused(cases: &[(&str, &[u8], u16)]) {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), Strategy::default(), |o| {
        o.timeouts.header_read = Duration::from_millis(500)
    });
    for (what, raw, want) in cases {
        let reply = raw_exchange(d.addr(), raw).await.unwrap();
        let text = String::from_utf8_lossy(&reply);
        assert_eq!(parse_status(&reply), Some(*want), "{what}: got {text}");
        assert!(
            text.to_ascii_lowercase()
                .contains("drover-error: bad-request"),
            "{what}: {text}"
        );
        assert!(
            text.to_ascii_lowercase().contains("connection: close"),
            "{what}: {text}"
        );
    }
    assert_eq!(
        b[0].hits(),
        0,
        "a refused request reached the backend: {:?}",
        b[0].last_request_head()
    );
}

#[tokio::test]
async fn smuggling_attempts_get_400() {
    refused(&[
        ("conflicting Content-Length", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400),
        ("duplicate Content-Length", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400),
        ("Content-Length list", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc", 400),
        ("signed Content-Length", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc", 400),
        ("Content-Length with Transfer-Encoding", b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        ("Transfer-Encoding not ending in chunked", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400),
        ("unknown Transfer-Encoding", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n", 400),
        ("two Transfer-Encoding fields", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        ("Transfer-Encoding with space before colon", b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400),
        ("Transfer-Encoding in HTTP/1.0", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ])
    .await;
}

#[tokio::test]
async fn malformed_heads_get_400() {
    refused(&[
        (
            "obsolete line folding",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n  folded\r\n\r\n",
            400,
        ),
        ("bare LF line ends", b"GET / HTTP/1.1\nHost: a\n\n", 400),
        (
            "bare LF after a header",
            b"GET / HTTP/1.1\r\nHost: a\nX-B: 1\r\n\r\n",
            400,
        ),
        (
            "space in header name",
            b"GET / HTTP/1.1\r\nHost: a\r\nX A: 1\r\n\r\n",
            400,
        ),
        (
            "control byte in value",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\x012\r\n\r\n",
            400,
        ),
        (
            "NUL in value",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: \x00\r\n\r\n",
            400,
        ),
        (
            "bare CR in value",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r2\r\n\r\n",
            400,
        ),
        ("missing Host", b"GET / HTTP/1.1\r\nX-A: 1\r\n\r\n", 400),
        (
            "two Host fields",
            b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
            400,
        ),
        (
            "space in target",
            b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
            400,
        ),
        ("not HTTP", b"HELLO\r\n\r\n", 400),
    ])
    .await;
}

#[tokio::test]
async fn oversize_heads_get_431_and_414() {
    let long_header = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\n\r\n",
        "x".repeat(20_000)
    );
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: a\r\n\r\n", "u".repeat(17_000));
    // More fields than Node's http server keeps (2000), in under 16 KiB.
    let many = format!(
        "GET / HTTP/1.1\r\nHost: a\r\n{}\r\n",
        "A:1\r\n".repeat(2_000)
    );
    refused(&[
        ("header section over 16 KiB", long_header.as_bytes(), 431),
        ("too many header fields", many.as_bytes(), 431),
        ("target over 16 KiB", long_uri.as_bytes(), 414),
    ])
    .await;
}

#[tokio::test]
async fn bad_chunked_body_is_cut_off() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), Strategy::default(), |_| {});
    let reply = raw_exchange(
        d.addr(),
        b"POST /echo HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    // The head was fine and went out, but the body's framing was not: the client gets
    // 400 and the backend connection is dropped rather than left mid-body.
    let text = String::from_utf8_lossy(&reply).to_ascii_lowercase();
    assert_eq!(parse_status(&reply), Some(400), "{text}");
    assert!(
        text.contains("drover-error: bad-request"),
        "the 400 did not come from drover: {text}"
    );
    assert_eq!(
        b[0].hits_for("/echo"),
        0,
        "the backend answered a request with a broken body"
    );
}

#[tokio::test]
async fn slow_client_is_cut_off() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), Strategy::default(), |o| {
        o.timeouts.header_read = Duration::from_millis(300)
    });
    // Sends half a head and stalls, like a slowloris client.
    let reply = raw_exchange_timeout(
        d.addr(),
        b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow:",
        Duration::from_secs(3),
    )
    .await
    .unwrap();
    assert_eq!(
        parse_status(&reply),
        Some(408),
        "{}",
        String::from_utf8_lossy(&reply)
    );
    assert_eq!(b[0].hits(), 0);
}

#[tokio::test]
async fn connect_method_is_refused() {
    refused(&[(
        "CONNECT",
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
        405,
    )])
    .await;
}
