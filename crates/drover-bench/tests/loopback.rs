//! The generator against a tiny keep-alive server on 127.0.0.1:0, bounded to 200
//! requests per run.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use drover_bench::{run, Config, Mix, Mode, Reuse};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Default)]
struct Seen {
    root: AtomicU64,
    chunked: AtomicU64,
    bad: AtomicU64,
    close: AtomicU64,
    tagged: AtomicU64,
    connections: AtomicU64,
}

/// Serves keep-alive HTTP/1.1: `/` 200 with Content-Length, `/chunked` 200 chunked,
/// `/bad` 500, `/close` 200 then closes, `/tagged` 200 with `X-Worker: w0`..`w2` in
/// turn (no header on every fourth).
fn start_server() -> (SocketAddr, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let std_listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    std_listener.set_nonblocking(true).unwrap();
    let addr = std_listener.local_addr().unwrap();
    let s2 = Arc::clone(&seen);
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let listener = TcpListener::from_std(std_listener).unwrap();
            loop {
                let (sock, _) = listener.accept().await.unwrap();
                s2.connections.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(serve(sock, Arc::clone(&s2)));
            }
        });
    });
    (addr, seen)
}

async fn serve(mut sock: TcpStream, seen: Arc<Seen>) {
    let mut buf = Vec::with_capacity(4096);
    loop {
        let (len, path) = loop {
            let mut headers = [httparse::EMPTY_HEADER; 32];
            let mut req = httparse::Request::new(&mut headers);
            if let Ok(httparse::Status::Complete(n)) = req.parse(&buf) {
                break (n, req.path.unwrap_or("").to_string());
            }
            let mut chunk = [0u8; 4096];
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        buf.drain(..len);
        let (resp, close): (&[u8], bool) = match path.as_str() {
            "/tagged" => {
                let k = seen.tagged.fetch_add(1, Ordering::Relaxed);
                (
                    match k % 4 {
                        0 => b"HTTP/1.1 200 OK\r\nX-Worker: w0\r\nContent-Length: 2\r\n\r\nok",
                        1 => b"HTTP/1.1 200 OK\r\nx-worker: w1\r\nContent-Length: 2\r\n\r\nok",
                        2 => b"HTTP/1.1 200 OK\r\nX-WORKER:w2\r\nContent-Length: 2\r\n\r\nok",
                        _ => b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
                    },
                    false,
                )
            }
            "/" => {
                seen.root.fetch_add(1, Ordering::Relaxed);
                (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false)
            }
            "/chunked" => {
                seen.chunked.fetch_add(1, Ordering::Relaxed);
                (
                    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;x=y\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
                    false,
                )
            }
            "/close" => {
                seen.close.fetch_add(1, Ordering::Relaxed);
                (
                    b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
                    true,
                )
            }
            _ => {
                seen.bad.fetch_add(1, Ordering::Relaxed);
                (
                    b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\n\r\nfail",
                    false,
                )
            }
        };
        if sock.write_all(resp).await.is_err() || close {
            return;
        }
    }
}

fn config(addr: SocketAddr, mix: &str, mode: Mode, connections: usize) -> Config {
    Config {
        addr,
        host: addr.to_string(),
        mix: Mix::parse(mix).unwrap(),
        mode,
        connections,
        duration: Duration::from_secs(20),
        max_requests: Some(200),
        threads: 1,
        timeout: Duration::from_secs(5),
        seed: 3,
        headers: vec![],
        count_header: None,
        poisson: false,
        progress: false,
        tls: None,
        payload: Default::default(),
    }
}

#[test]
fn closed_and_open_loop_against_local_server() {
    let (addr, seen) = start_server();

    // Closed loop, 4 connections, 200 requests over two paths.
    let r = run(&config(addr, "3:/,1:/chunked", Mode::Closed, 4)).unwrap();
    assert_eq!(r.mode, "closed");
    assert_eq!(r.requests, 200, "{}", r.render_text());
    assert_eq!(r.ok, 200);
    assert_eq!(r.errors_total, 0);
    let root = seen.root.load(Ordering::Relaxed);
    let chunked = seen.chunked.load(Ordering::Relaxed);
    assert_eq!(root + chunked, 200);
    assert_eq!(r.paths["/"].requests, root);
    assert_eq!(r.paths["/chunked"].requests, chunked);
    assert!(chunked > 20 && root > 100, "root {root} chunked {chunked}");
    assert_eq!(r.connections_opened, 4, "keep-alive reuses connections");
    assert!(r.latency_us.p50 > 0 && r.latency_us.max >= r.latency_us.p99);
    assert_eq!(r.status["200"], 200);

    // Open loop at 2000 req/s: 200 requests take ~0.1 s; non-2xx and closing responses.
    let r = run(&config(
        addr,
        "2:/,1:/bad,1:/close",
        Mode::Open {
            rate: 2000.0,
            reuse: Reuse::Random,
        },
        16,
    ))
    .unwrap();
    assert_eq!(r.mode, "open");
    assert_eq!(r.requests, 200, "{}", r.render_text());
    let bad = seen.bad.load(Ordering::Relaxed);
    assert_eq!(r.errors.status, bad);
    assert_eq!(r.errors_total, bad, "{}", r.render_text());
    assert_eq!(r.ok, 200 - bad);
    assert_eq!(r.status["500"], bad);
    assert!(
        r.elapsed_s >= 0.09 && r.elapsed_s < 5.0,
        "elapsed {}",
        r.elapsed_s
    );
    let svc = r.service_us.unwrap();
    assert_eq!(svc.count, 200);
    assert!(r.latency_us.p50 >= svc.p50 / 2);
    // Every /close response forces a new connection.
    assert!(r.connections_opened > seen.close.load(Ordering::Relaxed) / 2);

    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(json["requests"], 200);
    assert!(json["latency_us"]["p99"].is_u64());
    assert!(json["errors"]["timeout"].is_u64());

    // Nobody listening: connect errors, no hang.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_addr = dead.local_addr().unwrap();
    drop(dead);
    let mut cfg = config(dead_addr, "/", Mode::Closed, 2);
    cfg.max_requests = Some(20);
    let r = run(&cfg).unwrap();
    assert_eq!(r.requests, 0);
    assert_eq!(r.errors.connect, 20);
}

#[test]
fn counts_responses_per_header_value() {
    let (addr, seen) = start_server();
    for mode in [
        Mode::Closed,
        Mode::Open {
            rate: 2000.0,
            reuse: Reuse::Random,
        },
    ] {
        seen.tagged.store(0, Ordering::Relaxed);
        let mut cfg = config(addr, "/tagged", mode, 1);
        cfg.count_header = Some("X-Worker".into());
        let r = run(&cfg).unwrap();
        assert_eq!(r.requests, 200, "{}", r.render_text());
        let c = r.header_counts.as_ref().unwrap();
        assert_eq!(c.header, "X-Worker");
        // One connection, so the server answers in turn: 50 of each.
        for w in ["w0", "w1", "w2"] {
            assert_eq!(c.values[w], 50, "{c:?}");
        }
        assert_eq!((c.missing, c.other), (50, 0));
        assert!(
            r.render_text().contains(
                "X-Worker   w0: 50 (25.0%), w1: 50 (25.0%), w2: 50 (25.0%), without header: 50"
            ),
            "{}",
            r.render_text()
        );
        let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
        assert_eq!(json["header_counts"]["values"]["w1"], 50);
        assert_eq!(json["header_counts"]["missing"], 50);
    }

    // Without the option the report has no counts at all.
    let r = run(&config(addr, "/tagged", Mode::Closed, 1)).unwrap();
    assert!(r.header_counts.is_none());
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert!(json.get("header_counts").is_none());
}
