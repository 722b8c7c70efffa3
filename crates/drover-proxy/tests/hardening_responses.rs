//! Malformed backend responses (issue 11, items 2 and 9): what a broken or hostile
//! backend writes must never reach the client as anything drover did not parse. Raw TCP
//! backends write the bad bytes; a raw client reads exactly what drover sends. In this
//! process; the warning a response cut mid-stream logs is the `drover` crate's test.

mod common;

use common::{addrs, backends, proxy};
use drover_balance::Strategy;
use drover_testkit::{parse_status, raw_backend, raw_exchange};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";

/// A backend that writes `reply` at once to every request.
async fn replying(reply: &[u8]) -> (SocketAddr, Arc<AtomicUsize>) {
    raw_backend(vec![(Duration::ZERO, reply.to_vec())]).await
}

/// Sends `request` through a fresh drover over a backend that answers `reply`; returns
/// everything the client got.
async fn through_drover(reply: &[u8], request: &[u8]) -> String {
    let (backend, hits) = replying(reply).await;
    let d = proxy(&[backend], Strategy::default(), |_| {});
    let got = raw_exchange(d.addr(), request).await.unwrap();
    assert_eq!(
        hits.load(Ordering::Relaxed),
        1,
        "the backend was not asked once"
    );
    String::from_utf8_lossy(&got).into_owned()
}

fn assert_bad_response(what: &str, got: &str) {
    assert_eq!(
        parse_status(got.as_bytes()),
        Some(502),
        "{what}: got {got:?}"
    );
    assert!(
        got.to_ascii_lowercase()
            .contains("\r\ndrover-error: bad-response\r\n"),
        "{what}: got {got:?}"
    );
}

#[tokio::test]
async fn a_header_hidden_in_the_status_line_never_reaches_the_client() {
    for (what, reply, request) in [
        (
            "an injected header",
            &b"HTTP/1.1 200 OK\nX-Injected: 1\r\nContent-Length: 2\r\n\r\nok"[..],
            GET,
        ),
        (
            "a load report drover promises to strip",
            b"HTTP/1.1 200 OK\nendpoint-load-metrics: TEXT cpu_utilization=0.5\r\nContent-Length: 2\r\n\r\nok",
            GET,
        ),
        (
            "Transfer-Encoding shown to an HTTP/1.0 client after de-chunking",
            b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
            b"GET / HTTP/1.0\r\n\r\n",
        ),
    ] {
        let got = through_drover(reply, request).await;
        assert_bad_response(what, &got);
        let lower = got.to_ascii_lowercase();
        for leaked in ["x-injected", "endpoint-load-metrics", "transfer-encoding"] {
            assert!(!lower.contains(leaked), "{what}: {leaked} leaked: {got:?}");
        }
    }
}

#[tokio::test]
async fn malformed_backend_heads_are_a_502() {
    for (what, reply) in [
        (
            "no status code",
            &b"HTTP/1.1\r\nContent-Length: 2\r\n\r\nok"[..],
        ),
        (
            "an empty status code",
            b"HTTP/1.1 \r\nContent-Length: 2\r\n\r\nok",
        ),
        (
            "a two-digit code",
            b"HTTP/1.1 20 OK\r\nContent-Length: 2\r\n\r\nok",
        ),
        (
            "a code above 599",
            b"HTTP/1.1 999 OK\r\nContent-Length: 2\r\n\r\nok",
        ),
        (
            "a garbled version",
            b"HTTP/9.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        ),
        (
            "a bare CR in the reason",
            b"HTTP/1.1 200 O\rK\r\nContent-Length: 2\r\n\r\nok",
        ),
        (
            "a control byte in the reason",
            b"HTTP/1.1 200 O\x0bK\r\nContent-Length: 2\r\n\r\nok",
        ),
        (
            "a control byte in a field",
            b"HTTP/1.1 200 OK\r\nX-A: a\x7fb\r\nContent-Length: 2\r\n\r\nok",
        ),
        (
            "a folded field",
            b"HTTP/1.1 200 OK\r\nX-A: a\r\n X-B: b\r\nContent-Length: 2\r\n\r\nok",
        ),
        (
            "a bare LF between fields",
            b"HTTP/1.1 200 OK\r\nX-A: a\nX-B: b\r\nContent-Length: 2\r\n\r\nok",
        ),
    ] {
        let got = through_drover(reply, GET).await;
        assert_bad_response(what, &got);
        assert!(!got.contains("X-B"), "{what}: {got:?}");
    }
}

#[tokio::test]
async fn the_client_head_is_rebuilt_from_parsed_parts() {
    // A valid but unusual head: HTTP/1.0, no reason phrase, a value with HTAB.
    let got = through_drover(
        b"HTTP/1.0 203\r\nX-A:\ta\tb \r\nContent-Length: 2\r\n\r\nok",
        GET,
    )
    .await;
    assert!(
        got.starts_with("HTTP/1.1 203 \r\nX-A: a\tb\r\n"),
        "got {got:?}"
    );
    assert!(got.ends_with("\r\n\r\nok"), "got {got:?}");
}

#[tokio::test]
async fn bad_responses_count_against_the_backend() {
    let (bad, bad_hits) =
        replying(b"HTTP/1.1 200 OK\nX-Injected: 1\r\nContent-Length: 2\r\n\r\nok").await;
    let good = backends(1).await;
    let d = proxy(&[bad, addrs(&good)[0]], Strategy::RoundRobin, |o| {
        o.retries = 0
    });
    let mut statuses = Vec::new();
    for _ in 0..20 {
        let got = raw_exchange(d.addr(), GET).await.unwrap();
        assert!(!String::from_utf8_lossy(&got).contains("X-Injected"));
        statuses.push(parse_status(&got));
    }
    let failed = statuses.iter().filter(|s| **s == Some(502)).count();
    // Passive health ejects an endpoint after 5 failures in a row; then only the good
    // backend serves.
    assert_eq!(failed, 5, "{statuses:?}");
    assert_eq!(bad_hits.load(Ordering::Relaxed), 5);
    assert!(
        statuses[15..].iter().all(|s| *s == Some(200)),
        "{statuses:?}"
    );
}

#[tokio::test]
async fn an_invalid_first_chunk_size_is_a_502() {
    let got = through_drover(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        GET,
    )
    .await;
    assert_bad_response("an invalid chunk size", &got);
    assert!(!got.contains("hello"), "{got:?}");
    // The same for an HTTP/1.0 client, for whom drover decodes the chunks.
    let got = through_drover(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n-1\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
    )
    .await;
    assert_bad_response("an invalid chunk size after a chunk", &got);
}
