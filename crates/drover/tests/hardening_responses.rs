//! A backend response cut mid-stream is logged, naming the backend (issue 11, item 9).
//! The other malformed responses are tested in-process:
//! crates/drover-proxy/tests/hardening_responses.rs.

mod common;

use common::proxy;
use drover_testkit::{parse_status, raw_backend, raw_exchange, wait_until};
use std::time::Duration;

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n";

#[tokio::test]
async fn an_invalid_chunk_size_after_bytes_were_sent_closes_and_is_logged() {
    let (backend, _) = raw_backend(vec![
        (
            Duration::ZERO,
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n".to_vec(),
        ),
        (Duration::from_millis(300), b"zz\r\n".to_vec()),
    ])
    .await;
    let d = proxy(&[backend], &[]).await;
    let got = raw_exchange(d.addr(), GET).await.unwrap();
    let got = String::from_utf8_lossy(&got);
    // HTTP/1.1 has no way to say "this response failed" once it started: the client
    // sees the body end without its last chunk, and the connection close.
    assert_eq!(parse_status(got.as_bytes()), Some(200), "got {got:?}");
    assert!(got.ends_with("5\r\nhello\r\n"), "got {got:?}");
    let logged = wait_until(Duration::from_secs(5), || {
        d.lines_containing("mid-stream")
            .iter()
            .any(|l| l.contains("WARN") && l.contains(&backend.to_string()))
    })
    .await;
    assert!(logged, "no warning naming {backend}: {}", d.stderr_text());
}
