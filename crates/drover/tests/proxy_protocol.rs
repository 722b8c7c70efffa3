//! The PROXY protocol through real processes: HAProxy in front of drover with
//! `send-proxy-v2` and `send-proxy` (v1), and drover telling its backend the client's
//! address; senders drover does not trust, and trusted ones without a header, refused.
//! Clients connect from other loopback addresses (127.0.0.7, ...) than the sender
//! (127.0.0.1), so the address a backend sees says whose it is.

mod common;

use common::{backends, bin, proxy, start_haproxy};
use drover_testkit::{free_port, wait_until_async};
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

/// What a GET from `from` to `to` got: the response bytes (empty when drover closed the
/// connection unanswered).
async fn get_from(from: &str, to: SocketAddr, path: &str) -> Vec<u8> {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut stream = socket.connect(to).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    // The write may fail when drover already closed the connection: that is an answer.
    let _ = stream.write_all(request.as_bytes()).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    answer
}

fn status_of(answer: &[u8]) -> Option<u16> {
    drover_testkit::parse_status(answer)
}

/// HAProxy with two frontends in front of drover at `drover`: one sends PROXY v2, the
/// other v1. `None` outside CI when HAProxy is missing.
async fn haproxy_in_front(
    drover: SocketAddr,
) -> Option<(tokio::process::Child, SocketAddr, SocketAddr)> {
    let (v2, v1) = (free_port(), free_port());
    let cfg = format!(
        "frontend v2\n  bind 127.0.0.1:{v2}\n  default_backend to_drover_v2\n\
         frontend v1\n  bind 127.0.0.1:{v1}\n  default_backend to_drover_v1\n\
         backend to_drover_v2\n  server d {drover} send-proxy-v2\n\
         backend to_drover_v1\n  server d {drover} send-proxy\n"
    );
    let v2: SocketAddr = format!("127.0.0.1:{v2}").parse().unwrap();
    let v1: SocketAddr = format!("127.0.0.1:{v1}").parse().unwrap();
    let child = start_haproxy("proxy-protocol-haproxy", &cfg, &[v2, v1]).await?;
    Some((child, v2, v1))
}

#[tokio::test]
async fn haproxy_send_proxy_v2_and_v1_tell_drover_the_client() {
    let b = backends(1).await;
    let d = proxy(
        &[b[0].addr()],
        &[
            "--proxy-protocol-from",
            "127.0.0.1",
            "--admin",
            "127.0.0.1:0",
        ],
    )
    .await;
    let Some((_haproxy, v2, v1)) = haproxy_in_front(d.addr()).await else {
        return;
    };
    for (front, client) in [(v2, "127.0.0.7"), (v1, "127.0.0.8")] {
        let answer = get_from(client, front, "/who").await;
        assert_eq!(
            status_of(&answer),
            Some(200),
            "{}",
            String::from_utf8_lossy(&answer)
        );
        let head = b[0].last_request_head().unwrap();
        assert_eq!(
            head.header_str("x-forwarded-for").as_deref(),
            Some(client),
            "through {front}"
        );
        let forwarded = head.header_str("forwarded").unwrap_or_default();
        assert!(forwarded.contains(&format!("for={client}")), "{forwarded}");
    }
}

#[tokio::test]
async fn untrusted_senders_and_missing_headers_are_refused() {
    let b = backends(1).await;
    let d = proxy(
        &[b[0].addr()],
        &[
            "--proxy-protocol-from",
            "127.0.0.5,10.0.0.0/8",
            "--admin",
            "127.0.0.1:0",
        ],
    )
    .await;
    let admin = common::admin_addr(&d).await;
    // A client that spoofs a header from an address drover does not trust.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.9:0".parse().unwrap()).unwrap();
    let mut spoof = socket.connect(d.addr()).await.unwrap();
    let _ = spoof
        .write_all(b"PROXY TCP4 203.0.113.1 10.0.0.1 5000 80\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), spoof.read_to_end(&mut answer)).await;
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    // A trusted sender with no header: plain HTTP is no PROXY header.
    let answer = get_from("127.0.0.5", d.addr(), "/").await;
    assert!(answer.is_empty(), "{}", String::from_utf8_lossy(&answer));
    // A trusted sender with a header gets through, with the client it names.
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.5:0".parse().unwrap()).unwrap();
    let mut ok = socket.connect(d.addr()).await.unwrap();
    ok.write_all(
        b"PROXY TCP4 198.51.100.4 10.0.0.1 5000 80\r\nGET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    ok.read_to_end(&mut answer).await.unwrap();
    assert_eq!(
        status_of(&answer),
        Some(200),
        "{}",
        String::from_utf8_lossy(&answer)
    );
    assert_eq!(
        b[0].last_request_head()
            .unwrap()
            .header_str("x-forwarded-for")
            .as_deref(),
        Some("198.51.100.4")
    );
    assert_eq!(b[0].hits(), 1, "a refused connection reached the backend");
    let metrics = common::metrics_text(admin).await;
    for reason in ["untrusted-sender", "bad-header"] {
        let line = format!(
            "drover_proxy_protocol_refused_total{{balancer=\"default\",reason=\"{reason}\"}} 1"
        );
        assert!(
            metrics.lines().any(|l| l == line),
            "no {line:?} in\n{metrics}"
        );
    }
}

#[test]
fn bad_senders_in_flags_are_refused_with_the_flag() {
    let out = Command::new(bin())
        .args([
            "proxy",
            "--backend",
            "127.0.0.1:9",
            "--proxy-protocol-from",
            "10.0.0.0/33",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--proxy-protocol-from") && stderr.contains("10.0.0.0/33"),
        "{stderr}"
    );
}

/// HAProxy as a backend that requires a PROXY protocol header (`accept-proxy`, either
/// version) and answers each request with the client the header named (`src`), and the
/// source port of the connection the request came over (`fc_src_port`: drover's side of
/// its backend connection). `None` outside CI when HAProxy is missing.
async fn haproxy_behind() -> Option<(tokio::process::Child, SocketAddr)> {
    let port = free_port();
    let cfg = format!(
        "frontend backend\n  bind 127.0.0.1:{port} accept-proxy\n\
         \x20 http-request return status 200 content-type text/plain lf-string \"client=%[src]:%[src_port] via=%[fc_src_port]\"\n"
    );
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // A directory per port: two tests may start one at once.
    let child = start_haproxy(&format!("proxy-protocol-behind-{port}"), &cfg, &[addr]).await?;
    Some((child, addr))
}

/// A keep-alive client bound to `from`, and its local address.
async fn client_from(from: &str, to: SocketAddr) -> (drover_testkit::HttpClient, SocketAddr) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let stream = socket.connect(to).await.unwrap();
    let local = stream.local_addr().unwrap();
    (
        drover_testkit::HttpClient::from_stream(stream).unwrap(),
        local,
    )
}

/// `client=IP:PORT via=PORT` from the backend, as (client, via).
fn who(body: &str) -> (String, String) {
    let mut parts = body.split_whitespace();
    let client = parts.next().unwrap().strip_prefix("client=").unwrap();
    let via = parts.next().unwrap().strip_prefix("via=").unwrap();
    (client.to_string(), via.to_string())
}

#[tokio::test]
async fn drover_sends_each_client_to_haproxy_by_proxy_protocol_on_connections_of_its_own() {
    let Some((_haproxy, backend)) = haproxy_behind().await else {
        return;
    };
    for version in ["v1", "v2"] {
        // The health check must send a header too: HAProxy drops a connection without
        // one, and the only backend would then be down.
        let d = proxy(
            &[backend],
            &[
                "--send-proxy-protocol",
                version,
                "--health-path",
                "/",
                "--health-interval",
                "100ms",
                "--admin",
                "127.0.0.1:0",
            ],
        )
        .await;
        let admin = common::admin_addr(&d).await;
        let healthy = wait_until_async(Duration::from_secs(10), || async {
            common::status(admin).await.balancers[0]
                .endpoints
                .iter()
                .all(|e| e.healthy)
        })
        .await;
        assert!(healthy, "{version}: {}", d.stderr_text());
        // Two clients' requests interleave on their keep-alive connections: each is
        // told as itself, over a backend connection of its own that it keeps.
        let (mut a, a_addr) = client_from("127.0.0.7", d.addr()).await;
        let (mut b, b_addr) = client_from("127.0.0.8", d.addr()).await;
        let mut via = (Vec::new(), Vec::new());
        for _ in 0..3 {
            for (c, addr, seen) in [(&mut a, a_addr, &mut via.0), (&mut b, b_addr, &mut via.1)] {
                let r = c.get("/").await;
                assert_eq!(r.status, 200, "{version}: {}", r.text());
                let (client, through) = who(&r.text());
                assert_eq!(client, addr.to_string(), "{version}");
                seen.push(through);
            }
        }
        via.0.dedup();
        via.1.dedup();
        assert_eq!((via.0.len(), via.1.len()), (1, 1), "{version}: {via:?}");
        assert_ne!(
            via.0, via.1,
            "{version}: two clients shared a backend connection"
        );
        common::stops_cleanly(d).await;
    }
}

#[test]
fn send_proxy_protocol_refuses_bad_versions_and_drover_run() {
    let out = Command::new(bin())
        .args([
            "proxy",
            "--backend",
            "127.0.0.1:1",
            "--send-proxy-protocol",
            "3",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("--send-proxy-protocol") && err.contains("\"3\""),
        "{err}"
    );
    let out = Command::new(bin())
        .args(["run", "--send-proxy-protocol", "v2", "--", "node", "app.js"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--send-proxy-protocol does not apply to drover run"),
        "{err}"
    );
}

/// A reload that turns `send_proxy_protocol` on gives the health checks the header too:
/// HAProxy behind (`accept-proxy`) drops a probe without one, so the only endpoint is
/// down before the reload and up after it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_turns_send_proxy_protocol_on_gives_the_probes_the_header() {
    let Some((_haproxy, backend)) = haproxy_behind().await else {
        return;
    };
    let dir = common::temp_dir("proxy-protocol-reload");
    let toml = |send: &str| {
        format!(
            "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[balancer]]\nname = \"front\"\nlisten = \"127.0.0.1:0\"\n\
             backends = [\"{backend}\"]\n\
             health = {{ path = \"/\", interval = \"100ms\", timeout = \"1s\", rise = 1, fall = 1 }}\n{send}"
        )
    };
    let (d, _addr, admin, path) = common::proxy_config(&dir, &toml(""), "front").await;
    let healthy = || async {
        common::status(admin).await.balancers[0]
            .endpoints
            .iter()
            .all(|e| e.healthy)
    };
    let down = wait_until_async(Duration::from_secs(10), || async { !healthy().await }).await;
    assert!(down, "probes without a header pass: {}", d.stderr_text());
    std::fs::write(&path, toml("send_proxy_protocol = \"v2\"\n")).unwrap();
    let (code, out, err) = common::ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let up = wait_until_async(Duration::from_secs(10), healthy).await;
    assert!(
        up,
        "the probes after the reload send no header: {}",
        d.stderr_text()
    );
}
