//! `limits.max_body_bytes` (`--max-body-bytes`), nginx's `client_max_body_size`: a
//! request body over it gets drover's 413. One whose length its head gives is refused
//! before any of it is read (no `100 Continue`, nothing sent on); one without (chunked,
//! an HTTP/2 body with no `content-length`) is counted as it comes, and refused when it
//! passes the limit, in drover's buffer or while it streams to a backend. Driven with
//! raw HTTP/1.1 and with curl over HTTP/2.

mod common;

use common::{addrs, backends, default_metric, proxy, proxy_with_admin};
use drover_testkit::{chunked_body, parse_status, raw_exchange, read_head, HttpClient};
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A status and `drover-error` of `bytes`, an answer read off the wire.
fn status_and_cause(bytes: &[u8]) -> (Option<u16>, String) {
    let text = String::from_utf8_lossy(bytes).to_lowercase();
    let cause = text
        .lines()
        .find_map(|l| l.strip_prefix("drover-error: "))
        .unwrap_or("")
        .trim()
        .to_string();
    (parse_status(bytes), cause)
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413_and_one_within_it_goes_on() {
    let b = backends(1).await;
    let mut args = vec!["--max-body-bytes", "1KiB"];
    let backend = b[0].addr().to_string();
    args.extend(["--backend", &backend]);
    let (d, admin) = proxy_with_admin(&args).await;

    // Up to the limit, with a length or chunked: sent on whole.
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c
        .request("POST", "/echo", &[], Some(&[b'a'; 1024]))
        .await
        .unwrap();
    assert_eq!((r.status, r.body.len()), (200, 1024), "{}", r.text());
    let chunked = chunked_body(&[&[b'b'; 600], &[b'c'; 424]]);
    let r = c
        .request(
            "POST",
            "/echo",
            &[("transfer-encoding", "chunked")],
            Some(&chunked),
        )
        .await
        .unwrap();
    assert_eq!((r.status, r.body.len()), (200, 1024), "{}", r.text());
    assert_eq!(b[0].hits_for("/echo"), 2);

    // A length over it: refused from the head, the connection closed after.
    let r = c
        .request("POST", "/echo", &[], Some(&[b'a'; 1025]))
        .await
        .unwrap();
    assert_eq!(r.status, 413, "{}", r.text());
    assert_eq!(r.header("drover-error"), Some("body-too-large"));
    assert!(r.text().contains("1024 bytes"), "{}", r.text());
    assert_eq!(r.header("connection"), Some("close"));

    // A client that waits for `100 Continue` gets the 413 instead, and sends nothing.
    let mut s = TcpStream::connect(d.addr()).await.unwrap();
    s.write_all(
        b"PUT /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5000000\r\nexpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), read_head(&mut s))
        .await
        .expect("no answer without the body");
    assert_eq!(
        status_and_cause(&answer),
        (Some(413), "body-too-large".into()),
        "{}",
        String::from_utf8_lossy(&answer)
    );

    // Chunked, past the limit within drover's buffer: refused before any backend.
    let over = chunked_body(&[&[b'b'; 600], &[b'c'; 425]]);
    let mut raw = b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n".to_vec();
    raw.extend_from_slice(&over);
    let answer = raw_exchange(d.addr(), &raw).await.unwrap();
    assert_eq!(
        status_and_cause(&answer),
        (Some(413), "body-too-large".into())
    );
    assert_eq!(
        b[0].hits_for("/echo"),
        2,
        "a refused body reached the backend"
    );
    assert_eq!(default_metric(admin, "drover_requests_total").await, 5);
    let metrics = common::metrics_text(admin).await;
    assert!(
        metrics.contains("code=\"4xx\"} 3"),
        "the three 413s are counted:\n{metrics}"
    );
}

/// A chunked body larger than drover's 64 KiB buffer streams to the backend as it comes;
/// the moment it passes the limit, the client gets the 413 and the backend's connection
/// is closed (it never sees the body end, so never takes it for whole). The backend
/// serves the next request.
#[tokio::test]
async fn a_streamed_body_is_cut_when_it_passes_the_limit() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), &["--max-body-bytes", "100KiB"]).await;
    let mut s = TcpStream::connect(d.addr()).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n")
        .await
        .unwrap();
    let chunk = chunked_body(&[&[b'z'; 16 * 1024]]);
    let chunk = &chunk[..chunk.len() - 5]; // without the last chunk: the body goes on
    let mut answer = Vec::new();
    for _ in 0..20 {
        // drover may answer and close before all 320 KiB are written.
        if s.write_all(chunk).await.is_err() {
            break;
        }
        let mut buf = [0u8; 4096];
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(50), s.read(&mut buf)).await {
            answer.extend_from_slice(&buf[..n]);
            break;
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await;
    assert_eq!(
        status_and_cause(&answer),
        (Some(413), "body-too-large".into()),
        "{}\n{}",
        String::from_utf8_lossy(&answer),
        d.stderr_text()
    );
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    let r = c
        .request("POST", "/echo", &[], Some(b"next"))
        .await
        .unwrap();
    assert_eq!((r.status, r.text()), (200, "next".to_string()));
}

/// Over HTTP/2 (h2c, curl with prior knowledge): a `content-length` over the limit, and
/// a body with none (curl's upload from stdin) that passes it, each get the 413 on
/// their stream; a body within it is echoed. (curl runs on a thread of its own: the
/// backend serves on the test's runtime.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_bodies_over_the_limit_get_413() {
    let b = backends(1).await;
    let d = proxy(&addrs(&b), &["--h2c", "--max-body-bytes", "1KiB"]).await;
    let url = format!("http://{}/echo", d.addr());
    let curl = |extra: &[&str], stdin: &[u8]| -> String {
        let mut child = Command::new("curl")
            .args(["-sS", "--http2-prior-knowledge", "--max-time", "20"])
            .args(["-o", "/dev/null", "-w", "%{http_version} %{http_code}"])
            .args(extra)
            .arg(&url)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("curl");
        child.stdin.take().unwrap().write_all(stdin).unwrap();
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.is_empty(), "curl: {err}\n{}", d.stderr_text());
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let within = "x".repeat(1024);
    let over = "x".repeat(1025);
    assert_eq!(curl(&["--data-binary", &within], b""), "2 200");
    assert_eq!(curl(&["--data-binary", &over], b""), "2 413");
    // `-T -`: a PUT of unknown length, sent in DATA frames with no content-length.
    assert_eq!(curl(&["-T", "-"], &[b'y'; 1024]), "2 200");
    assert_eq!(curl(&["-T", "-"], &[b'y'; 5000]), "2 413");
    assert_eq!(b[0].hits_for("/echo"), 2);
}
