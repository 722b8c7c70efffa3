//! Kept-alive backend connections that the backend closes as a request crosses them.

mod common;

use common::proxy;
use drover_balance::Strategy;
use drover_metrics::Cause;
use drover_testkit::HttpClient;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// What the closing backend saw.
#[derive(Default)]
struct Seen {
    connections: AtomicU64,
    /// Request heads received, answered or not.
    requests: AtomicU64,
    answered: AtomicU64,
}

/// A backend that answers the first request of each connection with keep-alive, and
/// closes the connection without a word when a second request arrives on it: what a
/// server's idle timeout does when its close crosses drover's next request on the wire.
async fn closing_backend() -> (SocketAddr, Arc<Seen>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(Seen::default());
    let counts = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counts.connections.fetch_add(1, Relaxed);
            tokio::spawn(serve_one_then_close(stream, Arc::clone(&counts)));
        }
    });
    (addr, seen)
}

async fn serve_one_then_close(mut stream: TcpStream, seen: Arc<Seen>) {
    let mut buf = Vec::new();
    for answer in [true, false] {
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                buf.drain(..end + 4);
                break;
            }
            let mut chunk = [0u8; 4096];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        seen.requests.fetch_add(1, Relaxed);
        if answer {
            let reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
            if stream.write_all(reply).await.is_err() {
                return;
            }
            seen.answered.fetch_add(1, Relaxed);
        }
    }
    // Dropped: closed with the second request unanswered.
}

#[tokio::test]
async fn a_get_that_meets_a_closing_kept_alive_connection_goes_again_on_a_new_one() {
    let (backend, seen) = closing_backend().await;
    // One endpoint: a retry that excluded it, as a retry on another endpoint does,
    // would leave nothing to try and answer 502.
    let d = proxy(&[backend], Strategy::default(), |_| {});
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    for i in 0..5 {
        let r = c.get("/").await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text());
    }
    // Requests 2 to 5 each met the connection the request before left idle, and each
    // went again on a new one: 5 answered on 5 connections, 4 heads dropped unanswered.
    assert_eq!(seen.answered.load(Relaxed), 5);
    assert_eq!(seen.connections.load(Relaxed), 5);
    assert_eq!(seen.requests.load(Relaxed), 9);
    let counts = d.counts();
    assert_eq!(
        counts.retries.iter().sum::<u64>(),
        0,
        "going again on a new connection spends no retry"
    );
    assert_eq!(counts.errors.iter().sum::<u64>(), 0);
}

#[tokio::test]
async fn a_post_that_meets_a_closing_kept_alive_connection_is_not_sent_twice() {
    let (backend, seen) = closing_backend().await;
    let d = proxy(&[backend], Strategy::default(), |_| {});
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    assert_eq!(c.get("/").await.status, 200);
    // The backend received this POST and closed without answering: it may have acted
    // on it, so drover must not send it again.
    let r = c
        .request("POST", "/order", &[("Content-Length", "0")], None)
        .await
        .unwrap();
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("drover-error"), Some("backend-closed"));
    assert_eq!(
        seen.requests.load(Relaxed),
        2,
        "the POST went to the backend once"
    );
    assert_eq!(seen.connections.load(Relaxed), 1);
    assert_eq!(d.counts().errors[Cause::BackendClosed as usize], 1);
}
