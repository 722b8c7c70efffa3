//! A stalled and a trickling request body, with the timeouts given as flags
//! (`--client-timeout`, `--body-timeout`, `--body-min-rate`). The slow and stalled peers
//! themselves are tested in-process: crates/drover-proxy/tests/hardening_clients.rs.

mod common;

use common::{addrs, backends, proxy};
use drover_testkit::{parse_status, post_trickle, read_head};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// A client that stops sending its body gets a 408 naming the client timeout.
#[tokio::test]
async fn a_stalled_request_body_gets_408() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), &["--client-timeout", "1s"]).await;
    let mut s = TcpStream::connect(d.addr()).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789")
        .await
        .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), read_head(&mut s))
        .await
        .expect("no answer to a stalled body");
    let text = String::from_utf8_lossy(&answer).to_lowercase();
    assert_eq!(parse_status(&answer), Some(408), "{text}");
    assert!(text.contains("drover-error: client-timeout"), "{text}");
    assert_eq!(b[0].hits_for("/echo"), 0);
}

/// The same minimum rate holds while drover streams a body too large for its buffer
/// (64 KiB) to the backend: 70 KiB at once, then a byte every half second.
#[tokio::test]
async fn a_streamed_body_below_the_minimum_rate_is_cut() {
    let b = backends(1).await;
    // 70 KiB at 1 MB/s earns 0.07 s of credit beyond the 1 s grace.
    let d = proxy(
        &addrs(&b),
        &["--body-timeout", "1s", "--body-min-rate", "1000000"],
    )
    .await;
    let len = 100 * 1024;
    let got = post_trickle(d.addr(), len, 70 * 1024, 1, Duration::from_millis(500)).await;
    let text = String::from_utf8_lossy(&got).to_lowercase();
    assert_eq!(parse_status(&got), Some(408), "{text}");
    assert!(text.contains("drover-error: body-too-slow"), "{text}");
}
