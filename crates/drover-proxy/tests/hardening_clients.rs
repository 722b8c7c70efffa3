//! Slow, stalled and early peers around a request body or a response body: none of them
//! may hold a backend that other clients need (issue 11, items 1 and 3; issue 20,
//! item 6), through a real listener in this process. The timeouts as flags are the
//! `drover` crate's tests (crates/drover/tests/hardening_clients.rs).

mod common;

use common::{addrs, backends, proxy, proxy_with_pool};
use drover_balance::Strategy;
use drover_testkit::{parse_status, post_trickle, read_head, wait_until, HttpClient};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Two clients ask for a 50 MB download and never read it. With one connection allowed
/// to the backend, everyone else would wait for them forever; the client timeout cuts
/// each off, and the request behind them is served.
#[tokio::test]
async fn clients_that_stop_reading_are_cut_off_and_free_the_backend() {
    let b = backends(1).await;
    let d = proxy_with_pool(
        &addrs(&b),
        Strategy::default(),
        |o| {
            o.queue.timeout = Duration::from_secs(30);
            o.timeouts.client = Duration::from_secs(1);
        },
        |p| p.max_conns = 1,
    );
    let mut stalled = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(d.addr()).await.unwrap();
        s.write_all(b"GET /big/50000000 HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        stalled.push(s);
    }
    assert!(wait_until(Duration::from_secs(5), || b[0].in_flight() >= 1).await);

    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    c.set_timeout(Duration::from_secs(20));
    let r = c.request("GET", "/", &[], None).await.unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "b0");

    // Both downloads reached the backend and neither holds it any more: drover dropped
    // them rather than wait on their clients.
    assert!(
        wait_until(Duration::from_secs(20), || {
            b[0].hits_for("/big/50000000") == 2 && b[0].in_flight() == 0
        })
        .await,
        "downloads {} of 2, {} in flight",
        b[0].hits_for("/big/50000000"),
        b[0].in_flight(),
    );
    // And each client was cut off: reading now gets what drover had buffered for it, then
    // the end of the connection, well short of the 50 MB it asked for.
    for (i, mut s) in stalled.into_iter().enumerate() {
        let mut got = 0usize;
        let mut buf = vec![0u8; 1 << 16];
        let end = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) => return "closed",
                    Ok(n) => got += n,
                    Err(_) => return "reset",
                }
            }
        })
        .await;
        assert!(
            end.is_ok(),
            "stalled client {i}: drover kept its connection open ({got} bytes read)"
        );
        assert!(
            got < 50_000_000,
            "stalled client {i} got the whole download ({got} bytes): it was not cut off"
        );
        eprintln!("stalled client {i}: {got} bytes, then {}", end.unwrap());
    }
}

/// Four clients send a POST body one byte at a time. The body is read before a backend
/// is picked, so they hold nothing a GET beside them needs, and a complete slow body
/// still arrives intact.
#[tokio::test]
async fn a_slow_request_body_holds_no_backend() {
    let b = backends(1).await;
    let d = proxy_with_pool(
        &addrs(&b),
        Strategy::default(),
        |o| o.queue.timeout = Duration::from_secs(2),
        |p| p.max_conns = 1,
    );
    let started = Arc::new(AtomicUsize::new(0));
    let mut dribblers = Vec::new();
    for _ in 0..4 {
        let mut s = TcpStream::connect(d.addr()).await.unwrap();
        let started = started.clone();
        dribblers.push(tokio::spawn(async move {
            s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n")
                .await
                .unwrap();
            for i in 0..100 {
                if s.write_all(b"x").await.is_err() {
                    return;
                }
                if i == 0 {
                    started.fetch_add(1, Ordering::Relaxed);
                }
                // The slowness is the point: the body stays unfinished for 20 s.
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }));
    }
    // The GETs below come once every dribbler has sent its head and a first byte, and
    // drover holds all four connections.
    assert!(
        wait_until(Duration::from_secs(10), || started.load(Ordering::Relaxed)
            == 4)
        .await,
        "the dribblers never started"
    );
    assert!(
        wait_until(Duration::from_secs(10), || d.client_connections() == 4).await,
        "drover never held the four dribbling connections"
    );
    let mut c = HttpClient::connect(d.addr()).await.unwrap();
    for _ in 0..3 {
        let r = c.request("GET", "/", &[], None).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
    }
    assert_eq!(
        b[0].hits_for("/echo"),
        0,
        "a partial body reached the backend"
    );

    // A slow body that does end is proxied whole.
    let mut s = TcpStream::connect(d.addr()).await.unwrap();
    s.write_all(b"POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 5\r\n\r\n")
        .await
        .unwrap();
    for byte in b"hello" {
        s.write_all(&[*byte]).await.unwrap();
        // Slow on purpose: the body arrives in pieces 100 ms apart.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = tokio::time::timeout(Duration::from_secs(10), read_head(&mut s))
        .await
        .unwrap();
    assert_eq!(parse_status(&answer), Some(200));
    let mut rest = answer;
    while !rest.ends_with(b"hello") {
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(
            n > 0,
            "closed before the echo: {}",
            String::from_utf8_lossy(&rest)
        );
        rest.extend_from_slice(&buf[..n]);
    }
    for t in dribblers {
        t.abort();
    }
}

/// A backend that answers 413 while the client is still uploading, then stops reading:
/// the 413 reaches the client at once (not a 502 after the request timeout), and the
/// upload is cut short: drover discards what still comes for a few seconds (so that
/// closing does not destroy the answer), then closes.
#[tokio::test]
async fn an_early_answer_reaches_the_client_while_it_still_uploads() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                read_head(&mut s).await;
                let _ = s
                    .write_all(b"HTTP/1.1 413 Payload Too Large\r\ncontent-length: 9\r\nconnection: close\r\n\r\ntoo large")
                    .await;
                // Stop reading, keep the connection.
                tokio::time::sleep(Duration::from_secs(60)).await;
            });
        }
    });
    let d = proxy(&[backend], Strategy::default(), |o| {
        o.timeouts.request = Some(Duration::from_secs(20));
    });
    let s = TcpStream::connect(d.addr()).await.unwrap();
    let (mut rd, mut wr) = s.into_split();
    let upload = tokio::spawn(async move {
        wr.write_all(b"POST /upload HTTP/1.1\r\nhost: x\r\ncontent-length: 100000000000\r\n\r\n")
            .await
            .unwrap();
        let chunk = vec![0u8; 64 * 1024];
        let mut sent = 0u64;
        while sent < 100_000_000_000 && wr.write_all(&chunk).await.is_ok() {
            sent += chunk.len() as u64;
        }
        sent
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let read_all = async {
        loop {
            match rd.read(&mut buf).await {
                Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(15), read_all)
        .await
        .expect("drover neither answered nor closed while the client uploaded");
    let text = String::from_utf8_lossy(&got);
    assert_eq!(parse_status(&got), Some(413), "{text}");
    assert!(text.ends_with("too large"), "{text}");
    let sent = tokio::time::timeout(Duration::from_secs(10), upload)
        .await
        .expect("the upload was never cut off")
        .unwrap();
    assert!(sent < 100_000_000_000, "the whole upload was taken");
}

/// Issue 20, item 6: a body that trickles below the minimum rate is cut with 408, even
/// though it never goes quiet for the client timeout; a body sent steadily above the
/// rate completes; other clients are served meanwhile.
#[tokio::test]
async fn a_body_below_the_minimum_rate_is_cut_and_one_above_it_completes() {
    let b = backends(1).await;
    // Grace 1 s, then 100 B/s; the client timeout (30 s) never fires.
    let d = proxy(&addrs(&b), Strategy::default(), |o| {
        o.timeouts.body = Duration::from_secs(1);
        o.timeouts.body_min_rate = 100;
    });
    let addr = d.addr();
    // Two bytes a second: far below the rate.
    let slow = tokio::spawn(post_trickle(addr, 100, 0, 1, Duration::from_millis(500)));
    // 200 B/s for 3 s: above it all the way.
    let steady = tokio::spawn(post_trickle(addr, 600, 0, 20, Duration::from_millis(100)));
    let mut c = HttpClient::connect(addr).await.unwrap();
    for _ in 0..5 {
        let r = c.request("GET", "/", &[], None).await.unwrap();
        assert_eq!(r.status, 200, "{}", r.text());
        // Spread over the first second, while both bodies are still being sent.
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let slow = slow.await.unwrap();
    let text = String::from_utf8_lossy(&slow).to_lowercase();
    assert_eq!(parse_status(&slow), Some(408), "{text}");
    assert!(text.contains("drover-error: body-too-slow"), "{text}");
    let steady = steady.await.unwrap();
    let text = String::from_utf8_lossy(&steady);
    assert_eq!(parse_status(&steady), Some(200), "{text}");
    assert!(steady.ends_with(&[b'x'; 600]), "{text}");
    assert_eq!(
        b[0].hits_for("/echo"),
        1,
        "only the steady body reached the backend"
    );
}
