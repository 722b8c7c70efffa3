//! HTTP/2 from clients, through real sockets: curl over TLS (ALPN `h2`) and with prior
//! knowledge (h2c), the h2 crate's client for many streams on one connection, and
//! frames written by hand for what no well-behaved client sends (the attacks).
//!
//! The backends are testkit's HTTP/1.1 servers: every stream must reach them as an
//! HTTP/1.1 request over the keep-alive pool.

use bytes::Bytes;
use drover_balance::Strategy;
use drover_proxy::{Proxy, ProxyOptions};
use drover_registry::{Pool, PoolOptions};
use drover_testkit::{addrs, backends, Backend};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A proxy in this process, its pool kept for a reload; shut down when dropped.
struct Running {
    proxy: Proxy,
    opts: ProxyOptions,
    pool: Arc<Pool>,
}

impl Running {
    fn addr(&self) -> SocketAddr {
        self.proxy.local_addr().expect("a listener")
    }

    /// A reload with the same settings: a new generation of them.
    fn reload(&self) {
        self.proxy
            .reconfigure(
                self.opts.clone(),
                Arc::clone(&self.pool),
                Strategy::RoundRobin.build(),
            )
            .expect("the reload applies");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.proxy.begin_shutdown();
    }
}

fn start(backends: &[Backend], tune: impl FnOnce(&mut ProxyOptions)) -> Running {
    let mut opts = ProxyOptions {
        listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        threads: 1,
        h2c: true,
        ..ProxyOptions::default()
    };
    tune(&mut opts);
    let members: Vec<(SocketAddr, u32)> = addrs(backends).iter().map(|&a| (a, 1)).collect();
    let pool = Arc::new(Pool::new(
        opts.name.clone(),
        &members,
        PoolOptions::default(),
    ));
    let proxy = Proxy::start(
        opts.clone(),
        Arc::clone(&pool),
        Strategy::RoundRobin.build(),
    )
    .expect("the proxy starts");
    Running { proxy, opts, pool }
}

/// What curl printed: the body, then the status and HTTP version (`-w`).
struct Curled {
    body: String,
    status: u16,
    version: String,
}

async fn curl(args: &[&str]) -> Curled {
    let out = tokio::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-w",
            "\n%{http_code} %{http_version}",
        ])
        .args(args)
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, tail) = text.rsplit_once('\n').expect("curl's -w line");
    let (status, version) = tail.split_once(' ').expect("status and version");
    Curled {
        body: body.to_owned(),
        status: status.parse().unwrap_or(0),
        version: version.to_owned(),
    }
}

/// An h2 client connection with prior knowledge; the task driving it ends when the
/// connection does.
async fn h2c(addr: SocketAddr) -> (h2::client::SendRequest<Bytes>, tokio::task::JoinHandle<()>) {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let (send, conn) = h2::client::handshake(tcp).await.expect("h2 handshake");
    let driver = tokio::spawn(async move {
        let _ = conn.await;
    });
    (send, driver)
}

/// Sends `req` with `body` (as one DATA frame, or none) and reads the whole response.
async fn exchange(
    send: &mut h2::client::SendRequest<Bytes>,
    req: http::Request<()>,
    body: Option<&[u8]>,
) -> Result<(http::response::Parts, Vec<u8>), h2::Error> {
    let mut send = send.clone().ready().await?;
    let (response, mut stream) = send.send_request(req, body.is_none())?;
    if let Some(body) = body {
        stream.send_data(Bytes::copy_from_slice(body), true)?;
    }
    let (parts, mut recv) = response.await?.into_parts();
    let mut got = Vec::new();
    while let Some(data) = recv.data().await {
        let data = data?;
        let _ = recv.flow_control().release_capacity(data.len());
        got.extend_from_slice(&data);
    }
    Ok((parts, got))
}

fn get(addr: SocketAddr, path: &str) -> http::Request<()> {
    http::Request::get(format!("http://{addr}{path}"))
        .body(())
        .unwrap()
}

#[tokio::test]
async fn h2c_with_prior_knowledge_and_http1_on_the_same_port() {
    let b = backends(1).await;
    let scratch = tempfile::tempdir().unwrap();
    let log = scratch.path().join("access.jsonl");
    let d = start(&b, |o| {
        o.access_log.format = drover_proxy::access_log::Format::Json;
        o.access_log.path = log.display().to_string();
    });
    let url = format!("http://{}/headers", d.addr());
    let r = curl(&["--http2-prior-knowledge", &url]).await;
    assert_eq!((r.status, r.version.as_str()), (200, "2"), "{}", r.body);
    let head = b[0].last_request_head().unwrap();
    assert_eq!(head.header_str("host"), Some(d.addr().to_string()));
    assert_eq!(
        head.header_str("x-forwarded-proto").as_deref(),
        Some("http")
    );
    assert_eq!(
        head.header_str("x-forwarded-for").as_deref(),
        Some("127.0.0.1")
    );
    assert_eq!(head.header_str("x-request-id").map(|s| s.len()), Some(16));
    assert!(head.header("transfer-encoding").is_none());
    // A client without prior knowledge speaks HTTP/1.1 to the same listener.
    let r = curl(&["--http1.1", &url]).await;
    assert_eq!((r.status, r.version.as_str()), (200, "1.1"));
    assert_eq!(d.proxy.stats().snapshot().http2_streams, 1);
    assert_eq!(d.proxy.stats().snapshot().http2_connections, 1);
    // One access log line each, with its protocol.
    let lines = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.lines().count() >= 2 {
                return text;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("two access log lines");
    let protocols: Vec<String> = lines
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|v| format!("{} {} {}", v["protocol"], v["status"], v["method"]))
        .collect();
    assert_eq!(
        protocols,
        ["\"HTTP/2.0\" 200 \"GET\"", "\"HTTP/1.1\" 200 \"GET\""],
        "{lines}"
    );
}

#[tokio::test]
async fn h2c_is_off_unless_asked() {
    let b = backends(1).await;
    let d = start(&b, |o| o.h2c = false);
    let url = format!("http://{}/", d.addr());
    let r = curl(&["--http2-prior-knowledge", &url]).await;
    assert_ne!(r.version, "2");
    assert_eq!(b[0].hits(), 0, "the preface reached a backend as a request");
}

/// A CA of the test's own and a certificate for `localhost` it signs, as files.
struct Pki {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    /// Where the files are, removed with the `Pki`.
    _dir: tempfile::TempDir,
}

fn pki(tag: &str) -> Pki {
    let scratch = tempfile::Builder::new()
        .prefix(&format!("drover-h2-{tag}-"))
        .tempdir()
        .unwrap();
    let dir = scratch.path();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "drover h2 test CA");
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca =
        rcgen::CertifiedIssuer::self_signed(params, rcgen::KeyPair::generate().unwrap()).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "localhost");
    let cert = params.signed_by(&key, &ca).unwrap();
    let files = Pki {
        ca: dir.join("ca.pem"),
        cert: dir.join("localhost.pem"),
        key: dir.join("localhost.key"),
        _dir: scratch,
    };
    std::fs::write(&files.ca, ca.pem()).unwrap();
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    files
}

fn tls(pki: &Pki) -> Arc<drover_proxy::tls::Certificates> {
    let settings = drover_proxy::tls::Settings {
        certs: vec![drover_proxy::tls::CertFiles {
            cert: pki.cert.clone(),
            key: pki.key.clone(),
        }],
        alpn: Vec::new(),
        min_version: Default::default(),
        client_ca: None,
        verify_client: Default::default(),
    };
    Arc::new(drover_proxy::tls::Certificates::load(&settings).unwrap())
}

#[tokio::test]
async fn h2_over_tls_by_alpn_and_http1_when_turned_off() {
    let b = backends(2).await;
    let pki = pki("alpn");
    let d = start(&b, |o| {
        o.h2c = false;
        o.tls = Some(tls(&pki));
    });
    let port = d.addr().port();
    let resolve = format!("localhost:{port}:127.0.0.1");
    let url = format!("https://localhost:{port}/headers");
    let ca = pki.ca.to_str().unwrap();
    let r = curl(&["--http2", "--cacert", ca, "--resolve", &resolve, &url]).await;
    assert_eq!((r.status, r.version.as_str()), (200, "2"), "{}", r.body);
    assert!(
        r.body.to_lowercase().contains("x-forwarded-proto: https"),
        "{}",
        r.body
    );
    assert!(
        r.body.contains(&format!("host: localhost:{port}")),
        "{}",
        r.body
    );
    // A POST body over TLS, with its length.
    let url_echo = format!("https://localhost:{port}/echo");
    let r = curl(&[
        "--http2",
        "--cacert",
        ca,
        "--resolve",
        &resolve,
        "--data-binary",
        "over tls",
        &url_echo,
    ])
    .await;
    assert_eq!(
        (r.status, r.version.as_str(), r.body.as_str()),
        (200, "2", "over tls")
    );

    let off = start(&b, |o| {
        o.h2c = false;
        o.http2 = false;
        o.tls = Some(tls(&pki));
    });
    let port = off.addr().port();
    let resolve = format!("localhost:{port}:127.0.0.1");
    let url = format!("https://localhost:{port}/");
    let r = curl(&["--http2", "--cacert", ca, "--resolve", &resolve, &url]).await;
    assert_eq!((r.status, r.version.as_str()), (200, "1.1"));
}

#[tokio::test]
async fn many_streams_on_one_connection_spread_over_the_backends() {
    let b = backends(3).await;
    let d = start(&b, |_| {});
    let (send, _driver) = h2c(d.addr()).await;
    let addr = d.addr();
    let mut calls = Vec::new();
    for i in 0..120 {
        let mut send = send.clone();
        calls.push(tokio::spawn(async move {
            // Some wait at the backend, so that streams are in flight together.
            let path = if i % 2 == 0 { "/delay/20" } else { "/" };
            exchange(&mut send, get(addr, path), None).await
        }));
    }
    for call in calls {
        let (parts, _) = call.await.unwrap().expect("every stream is answered");
        assert_eq!(parts.status, 200);
    }
    let hits: Vec<u64> = b.iter().map(Backend::hits).collect();
    assert_eq!(hits.iter().sum::<u64>(), 120, "{hits:?}");
    assert!(
        hits.iter().all(|&n| n == 40),
        "round robin per stream: {hits:?}"
    );
    let counts = d.proxy.stats().snapshot();
    assert_eq!((counts.http2_connections, counts.http2_streams), (1, 120));
    // Over the keep-alive pool: streams one after another reuse the backend
    // connections the burst opened.
    let opened: u64 = b.iter().map(Backend::connections).sum();
    let mut send = send.clone();
    for _ in 0..30 {
        let (parts, _) = exchange(&mut send, get(addr, "/"), None).await.unwrap();
        assert_eq!(parts.status, 200);
    }
    let connections: u64 = b.iter().map(Backend::connections).sum();
    assert_eq!(connections, opened, "backend connections were not reused");
}

#[tokio::test]
async fn request_bodies_with_and_without_a_length() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    let (mut send, _driver) = h2c(d.addr()).await;
    let post = || http::Request::post(format!("http://{}/echo", d.addr()));

    let req = post().header("content-length", "5").body(()).unwrap();
    let (parts, body) = exchange(&mut send, req, Some(b"hello")).await.unwrap();
    assert_eq!(
        (parts.status.as_u16(), body.as_slice()),
        (200, &b"hello"[..])
    );
    let head = b[0].last_request_head().unwrap();
    assert_eq!(head.header_str("content-length").as_deref(), Some("5"));

    // No length: the backend gets it chunked, and its chunked answer comes back as
    // DATA frames, unchunked.
    let mut ready = send.clone().ready().await.unwrap();
    let (response, mut stream) = ready.send_request(post().body(()).unwrap(), false).unwrap();
    for part in [&b"one "[..], b"two ", b"three"] {
        stream.send_data(Bytes::from_static(part), false).unwrap();
    }
    stream.send_data(Bytes::new(), true).unwrap();
    let (parts, mut recv) = response.await.unwrap().into_parts();
    assert_eq!(parts.status, 200);
    assert!(parts.headers.get("transfer-encoding").is_none());
    let mut got = Vec::new();
    while let Some(data) = recv.data().await {
        got.extend_from_slice(&data.unwrap());
    }
    assert_eq!(got, b"one two three");
    let head = b[0].last_request_head().unwrap();
    assert_eq!(
        head.header_str("transfer-encoding").as_deref(),
        Some("chunked")
    );
    assert!(head.header("content-length").is_none());
}

#[tokio::test]
async fn large_responses_error_pages_and_head() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    let (mut send, _driver) = h2c(d.addr()).await;
    // More than the stream's and the connection's windows: flow control both ways.
    let (parts, body) = exchange(&mut send, get(d.addr(), "/big/300000"), None)
        .await
        .unwrap();
    assert_eq!(parts.status, 200);
    assert_eq!(body.len(), 300_000);
    // A backend's own error page passes as it is.
    let (parts, body) = exchange(&mut send, get(d.addr(), "/status/503"), None)
        .await
        .unwrap();
    assert_eq!(
        (parts.status.as_u16(), body.as_slice()),
        (503, &b"status 503\n"[..])
    );
    // HEAD: the length, and no body.
    let head = http::Request::head(format!("http://{}/big/1000", d.addr()))
        .body(())
        .unwrap();
    let (parts, body) = exchange(&mut send, head, None).await.unwrap();
    assert_eq!(parts.status, 200);
    assert!(body.is_empty());
    // drover's own error page, when no backend answers.
    b[0].stop().await;
    let (parts, body) = exchange(&mut send, get(d.addr(), "/"), None).await.unwrap();
    assert_eq!(parts.status, 502);
    assert!(parts.headers.get("drover-error").is_some(), "{parts:?}");
    assert!(parts.headers.get("connection").is_none());
    assert!(!body.is_empty());
}

#[tokio::test]
async fn a_stream_the_client_resets_frees_its_backend_at_once() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    let (send, _driver) = h2c(d.addr()).await;
    let mut ready = send.clone().ready().await.unwrap();
    // The backend never answers /hang: only drover's closing its connection ends it.
    let (response, mut stream) = ready.send_request(get(d.addr(), "/hang"), true).unwrap();
    let waited = tokio::time::timeout(Duration::from_secs(10), async {
        while b[0].in_flight() == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    assert!(
        waited.await.is_ok(),
        "the request never reached the backend"
    );
    stream.send_reset(h2::Reason::CANCEL);
    drop(response);
    let freed = tokio::time::timeout(Duration::from_secs(10), async {
        while b[0].in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    assert!(
        freed.await.is_ok(),
        "the reset stream still holds its backend"
    );
    // The connection goes on.
    let (parts, _) = exchange(&mut send.clone(), get(d.addr(), "/"), None)
        .await
        .unwrap();
    assert_eq!(parts.status, 200);
}

#[tokio::test]
async fn a_response_cut_short_resets_its_stream_and_one_ended_by_close_ends_it() {
    let cut = |head: &str, body: &str| {
        vec![(Duration::ZERO, format!("{head}\r\n\r\n{body}").into_bytes())]
    };
    // 10 bytes of the 100 announced, then the backend closes.
    let (short, _) =
        drover_testkit::raw_backend(cut("HTTP/1.1 200 OK\r\nContent-Length: 100", "0123456789"))
            .await;
    // No length: the body ends where the backend closes (HTTP/1.1's rule).
    let (until_close, _) = drover_testkit::raw_backend(cut("HTTP/1.1 200 OK", "all of it")).await;
    for (backend, want) in [(short, None), (until_close, Some(&b"all of it"[..]))] {
        let mut opts = ProxyOptions {
            h2c: true,
            retries: 0,
            ..ProxyOptions::default()
        };
        opts.listen = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
        let pool = Arc::new(Pool::new("cut", &[(backend, 1)], PoolOptions::default()));
        let proxy = Proxy::start(opts, pool, Strategy::RoundRobin.build()).unwrap();
        let (mut send, _driver) = h2c(proxy.local_addr().unwrap()).await;
        let got = exchange(&mut send, get(proxy.local_addr().unwrap(), "/"), None).await;
        match want {
            Some(body) => {
                let (parts, got) = got.expect("a close-delimited body ends the stream");
                assert_eq!((parts.status.as_u16(), got.as_slice()), (200, body));
            }
            None => {
                let e = got.expect_err("a cut body must not end as a whole one");
                assert_eq!(e.reason(), Some(h2::Reason::INTERNAL_ERROR), "{e}");
            }
        }
        proxy.begin_shutdown();
    }
}

#[tokio::test]
async fn early_hints_reach_the_client_before_the_answer() {
    let (backend, _) = drover_testkit::raw_backend(vec![(
        Duration::ZERO,
        b"HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_vec(),
    )])
    .await;
    let opts = ProxyOptions {
        listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
        h2c: true,
        ..ProxyOptions::default()
    };
    let pool = Arc::new(Pool::new("hints", &[(backend, 1)], PoolOptions::default()));
    let proxy = Proxy::start(opts, pool, Strategy::RoundRobin.build()).unwrap();
    let (send, _driver) = h2c(proxy.local_addr().unwrap()).await;
    let mut ready = send.ready().await.unwrap();
    let (mut response, _) = ready
        .send_request(get(proxy.local_addr().unwrap(), "/"), true)
        .unwrap();
    let hint = std::future::poll_fn(|cx| response.poll_informational(cx))
        .await
        .expect("an informational response")
        .unwrap();
    assert_eq!(hint.status(), 103);
    assert_eq!(hint.headers()["link"], "</s.css>; rel=preload");
    let (parts, mut body) = response.await.unwrap().into_parts();
    assert_eq!(parts.status, 200);
    assert_eq!(body.data().await.unwrap().unwrap(), "ok");
    proxy.begin_shutdown();
}

// --- Frames by hand: what a well-behaved client never sends. ---

const HEADERS: u8 = 0x1;
const DATA: u8 = 0x0;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const GOAWAY: u8 = 0x7;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;

const PROTOCOL_ERROR: u32 = 0x1;
const INTERNAL_ERROR: u32 = 0x2;
const REFUSED_STREAM: u32 = 0x7;
const ENHANCE_YOUR_CALM: u32 = 0xb;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut f = vec![(len >> 16) as u8, (len >> 8) as u8, len as u8, kind, flags];
    f.extend_from_slice(&stream.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

/// An HPACK integer with an `n`-bit prefix whose other bits are `first`.
fn hpack_int(out: &mut Vec<u8>, first: u8, n: u8, mut v: usize) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(first | v as u8);
        return;
    }
    out.push(first | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

/// A literal field without indexing, its name new (RFC 7541 §6.2.2).
fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    hpack_int(out, 0, 7, name.len());
    out.extend_from_slice(name);
    hpack_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// The pseudo-fields of a request: `:method` (indexed: GET or POST), `:scheme http`,
/// `:path` and `:authority` (literals with indexed names).
fn request_block(post: bool, path: &str) -> Vec<u8> {
    let mut b = vec![if post { 0x83 } else { 0x82 }, 0x86];
    b.push(0x04);
    hpack_int(&mut b, 0, 7, path.len());
    b.extend_from_slice(path.as_bytes());
    b.push(0x01);
    hpack_int(&mut b, 0, 7, "test".len());
    b.extend_from_slice(b"test");
    b
}

/// A raw h2c connection: preface and an empty SETTINGS sent.
async fn raw(addr: SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    s.write_all(&frame(SETTINGS, 0, 0, &[])).await.unwrap();
    s
}

#[derive(Debug, Clone, PartialEq)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

impl Frame {
    /// The error code of a RST_STREAM or GOAWAY.
    fn error_code(&self) -> Option<u32> {
        let at = match self.kind {
            RST_STREAM => 0,
            GOAWAY => 4,
            _ => return None,
        };
        let b = self.payload.get(at..at + 4)?;
        Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// Frames from the server until it closes, or `until` says stop, or 10 s pass quiet.
async fn frames(s: &mut TcpStream, until: impl Fn(&Frame) -> bool) -> Vec<Frame> {
    let mut got = Vec::new();
    loop {
        let mut head = [0u8; 9];
        match tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut head)).await {
            Ok(Ok(_)) => {}
            _ => return got,
        }
        let len = (usize::from(head[0]) << 16) | (usize::from(head[1]) << 8) | usize::from(head[2]);
        let mut payload = vec![0; len];
        if s.read_exact(&mut payload).await.is_err() {
            return got;
        }
        let f = Frame {
            kind: head[3],
            flags: head[4],
            stream: u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff,
            payload,
        };
        let stop = until(&f);
        got.push(f);
        if stop {
            return got;
        }
    }
}

fn goaway(fs: &[Frame]) -> Option<u32> {
    fs.iter()
        .find(|f| f.kind == GOAWAY)
        .and_then(Frame::error_code)
}

fn reset_of(fs: &[Frame], stream: u32) -> Option<u32> {
    fs.iter()
        .find(|f| f.kind == RST_STREAM && f.stream == stream)
        .and_then(Frame::error_code)
}

/// A response HEADERS frame on `stream`.
fn answered(fs: &[Frame], stream: u32) -> bool {
    fs.iter().any(|f| f.kind == HEADERS && f.stream == stream)
}

#[tokio::test]
async fn a_content_length_the_data_disagrees_with_is_a_stream_error() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    for (declared, sent) in [(10usize, 5usize), (3, 6)] {
        let mut s = raw(d.addr()).await;
        let mut block = request_block(true, "/echo");
        literal(
            &mut block,
            b"content-length",
            declared.to_string().as_bytes(),
        );
        let mut out = frame(HEADERS, END_HEADERS, 1, &block);
        out.extend(frame(DATA, END_STREAM, 1, &vec![b'x'; sent]));
        s.write_all(&out).await.unwrap();
        let fs = frames(&mut s, |f| f.kind == RST_STREAM || f.kind == GOAWAY).await;
        assert_eq!(
            reset_of(&fs, 1),
            Some(PROTOCOL_ERROR),
            "{declared} vs {sent}: {fs:?}"
        );
        assert!(!answered(&fs, 1), "{fs:?}");
    }
    assert_eq!(
        b[0].hits(),
        0,
        "a request with a wrong length reached the backend"
    );
}

#[tokio::test]
async fn what_http1_would_read_differently_is_refused() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    // A connection-specific field makes the request malformed: its stream is reset. A
    // value HPACK decodes to CR, LF or NUL cannot be a field at all: the decoder (the
    // connection's, shared by every stream) fails, and so does the connection.
    let stream_error = |fs: &[Frame]| reset_of(fs, 1) == Some(PROTOCOL_ERROR);
    let connection_error = |fs: &[Frame]| goaway(fs) == Some(PROTOCOL_ERROR);
    type Check = fn(&[Frame]) -> bool;
    let cases: [(&[u8], &[u8], Check); 6] = [
        (b"transfer-encoding", b"chunked", stream_error),
        (b"connection", b"keep-alive", stream_error),
        (b"upgrade", b"websocket", stream_error),
        (b"te", b"gzip", stream_error),
        (b"x-smuggle", b"a\r\nx-injected: 1", connection_error),
        (b"x-nul", b"a\0b", connection_error),
    ];
    for (name, value, refused) in cases {
        let mut s = raw(d.addr()).await;
        let mut block = request_block(false, "/headers");
        literal(&mut block, name, value);
        s.write_all(&frame(HEADERS, END_HEADERS | END_STREAM, 1, &block))
            .await
            .unwrap();
        let fs = frames(&mut s, |f| f.kind == RST_STREAM || f.kind == GOAWAY).await;
        let what = String::from_utf8_lossy(name);
        assert!(refused(&fs), "{what}: {fs:?}");
        assert!(!answered(&fs, 1), "{what}: answered: {fs:?}");
    }
    assert_eq!(b[0].hits(), 0, "a malformed request reached the backend");
}

#[tokio::test]
async fn rapid_reset_ends_the_connection() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    let mut s = raw(d.addr()).await;
    // HEADERS then RST_STREAM(CANCEL) at once, 100 times: CVE-2023-44487. (Few enough
    // bytes for drover to read them all before it closes: unread bytes would make the
    // close a TCP reset, which may discard the GOAWAY before this test reads it.)
    let mut out = Vec::new();
    for i in 0..100u32 {
        let id = 2 * i + 1;
        out.extend(frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            id,
            &request_block(false, "/delay/50"),
        ));
        out.extend(frame(RST_STREAM, 0, id, &8u32.to_be_bytes()));
    }
    // The server may close while this is still being written.
    let _ = s.write_all(&out).await;
    let fs = frames(&mut s, |f| f.kind == GOAWAY).await;
    assert_eq!(goaway(&fs), Some(ENHANCE_YOUR_CALM), "{fs:?}");
    let hits = b[0].hits();
    assert!(
        hits <= 20,
        "{hits} of 100 reset requests reached the backend"
    );
}

#[tokio::test]
async fn a_client_that_resets_the_streams_drover_works_on_is_closed() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    let mut s = raw(d.addr()).await;
    // Each stream reaches the backend (which never answers /hang) before the client
    // resets it: past h2's own limit, which counts streams reset before drover took them.
    let mut sent = 0u64;
    for i in 0..400u32 {
        let id = 2 * i + 1;
        let headers = frame(
            HEADERS,
            END_HEADERS | END_STREAM,
            id,
            &request_block(false, "/hang"),
        );
        if s.write_all(&headers).await.is_err() {
            break;
        }
        let reached = tokio::time::timeout(Duration::from_secs(5), async {
            while b[0].hits() <= sent {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        if reached.await.is_err() {
            break; // no longer taken: the connection is closing
        }
        sent += 1;
        if s.write_all(&frame(RST_STREAM, 0, id, &8u32.to_be_bytes()))
            .await
            .is_err()
        {
            break;
        }
    }
    let fs = frames(&mut s, |f| f.kind == GOAWAY).await;
    assert_eq!(
        goaway(&fs),
        Some(ENHANCE_YOUR_CALM),
        "after {sent} streams: {fs:?}"
    );
    assert!(sent < 400, "all {sent} reset streams were served");
    assert!(sent > 256, "closed after {sent} streams only");
}

#[tokio::test]
async fn an_empty_data_frame_flood_ends_the_connection() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    let mut s = raw(d.addr()).await;
    // A request whose body never comes: only empty DATA frames (CVE-2019-9518), which
    // cost the server a frame each and carry nothing.
    let mut block = request_block(true, "/echo");
    literal(&mut block, b"content-length", b"10");
    let mut out = frame(HEADERS, END_HEADERS, 1, &block);
    for _ in 0..1000 {
        out.extend(frame(DATA, 0, 1, &[]));
    }
    let _ = s.write_all(&out).await;
    let fs = frames(&mut s, |f| f.kind == GOAWAY).await;
    assert_eq!(goaway(&fs), Some(ENHANCE_YOUR_CALM), "{fs:?}");
    assert_eq!(b[0].hits(), 0);
}

/// This process's resident memory.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

#[tokio::test]
async fn a_ping_and_settings_flood_from_a_client_that_reads_nothing_is_held_back() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    let mut s = raw(d.addr()).await;
    // Each PING and SETTINGS asks for an answer (CVE-2019-9512, -9515). drover sends
    // each before it reads the next frame, so a client that reads none of them is
    // read no further once the socket buffers between them are full: the flood stalls
    // in the client instead of queueing answers in drover.
    let mut flood = Vec::new();
    for i in 0..2_000_000u64 {
        flood.extend(frame(0x6, 0, 0, &i.to_be_bytes())); // PING
        flood.extend(frame(SETTINGS, 0, 0, &[]));
    }
    // drover runs in this process: what it holds shows in this process's RSS (socket
    // buffers do not), and the answers to 4 million frames would be 50 MB.
    let before = rss_kib();
    let wrote = tokio::time::timeout(Duration::from_secs(5), s.write_all(&flood)).await;
    assert!(
        wrote.is_err(),
        "all {} MB were read while no answer was",
        flood.len() >> 20
    );
    let grew = rss_kib().saturating_sub(before);
    assert!(
        grew < 16 * 1024,
        "drover grew by {grew} KiB under the flood"
    );
    // Meanwhile every other client is served.
    let (mut send, _driver) = h2c(d.addr()).await;
    let (parts, _) = exchange(&mut send, get(d.addr(), "/"), None).await.unwrap();
    assert_eq!(parts.status, 200);
}

#[tokio::test]
async fn streams_past_the_limit_are_refused() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    let mut s = raw(d.addr()).await;
    // The server says its limit in its SETTINGS.
    let fs = frames(&mut s, |f| f.kind == SETTINGS && f.flags == 0).await;
    let settings = &fs.last().unwrap().payload;
    let limit = settings
        .chunks(6)
        .find(|c| c[..2] == [0, 3])
        .map(|c| u32::from_be_bytes([c[2], c[3], c[4], c[5]]));
    assert_eq!(limit, Some(128));
    s.write_all(&frame(SETTINGS, 1, 0, &[])).await.unwrap();
    // 200 requests that stay open: a body announced and never sent.
    let mut out = Vec::new();
    for i in 0..200u32 {
        let mut block = request_block(true, "/echo");
        literal(&mut block, b"content-length", b"10");
        out.extend(frame(HEADERS, END_HEADERS, 2 * i + 1, &block));
    }
    s.write_all(&out).await.unwrap();
    let last = 2 * 199 + 1;
    let fs = frames(&mut s, |f| f.kind == RST_STREAM && f.stream == last).await;
    let refused = fs
        .iter()
        .filter(|f| f.kind == RST_STREAM && f.error_code() == Some(REFUSED_STREAM))
        .count();
    assert_eq!(refused, 72, "{fs:?}");
    assert_eq!(
        reset_of(&fs, 1),
        None,
        "an open stream within the limit was reset"
    );
}

#[tokio::test]
async fn hpack_bombs_reach_no_backend() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    // One 4,000-byte field put in the dynamic table, then named by its index: 1,000
    // times is 4 MB of header list from a 5 KB block, 5 times just over the 16 KiB limit.
    let bomb = |refs: usize| {
        let mut block = request_block(false, "/");
        block.push(0x40);
        hpack_int(&mut block, 0, 7, 4);
        block.extend_from_slice(b"x-bb");
        hpack_int(&mut block, 0, 7, 4000);
        block.extend(std::iter::repeat_n(b'b', 4000));
        block.extend(std::iter::repeat_n(0x80 | 62, refs));
        frame(HEADERS, END_HEADERS | END_STREAM, 1, &block)
    };
    let mut s = raw(d.addr()).await;
    s.write_all(&bomb(1000)).await.unwrap();
    let fs = frames(&mut s, |f| f.kind == GOAWAY).await;
    assert_eq!(goaway(&fs), Some(ENHANCE_YOUR_CALM), "{fs:?}");
    // Over the limit but not by much: the stream is answered 431 (by the h2 crate), the
    // connection goes on.
    let mut s = raw(d.addr()).await;
    s.write_all(&bomb(5)).await.unwrap();
    let fs = frames(&mut s, |f| f.stream == 1 || f.kind == GOAWAY).await;
    assert!(answered(&fs, 1) || reset_of(&fs, 1).is_some(), "{fs:?}");
    assert_eq!(goaway(&fs), None, "{fs:?}");
    assert_eq!(b[0].hits(), 0, "a bomb reached the backend");
}

#[tokio::test]
async fn continuation_flood_ends_the_connection() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    let mut s = raw(d.addr()).await;
    // A HEADERS that never ends, then CONTINUATION frames without END_HEADERS.
    let mut out = frame(HEADERS, 0, 1, &request_block(false, "/"));
    for i in 0..50 {
        let mut block = Vec::new();
        literal(&mut block, format!("x-{i}").as_bytes(), b"v");
        out.extend(frame(CONTINUATION, 0, 1, &block));
    }
    let _ = s.write_all(&out).await;
    let fs = frames(&mut s, |f| f.kind == GOAWAY).await;
    assert_eq!(goaway(&fs), Some(ENHANCE_YOUR_CALM), "{fs:?}");
    assert_eq!(b[0].hits(), 0);
}

#[tokio::test]
async fn a_slow_stream_finishes_across_a_reload_and_a_shutdown() {
    let b = backends(1).await;
    let d = start(&b, |_| {});
    let (mut send, driver) = h2c(d.addr()).await;
    let slow = {
        let mut send = send.clone();
        let req = get(d.addr(), "/delay/1500");
        tokio::spawn(async move { exchange(&mut send, req, None).await })
    };
    while b[0].in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    d.reload();
    let (parts, body) = slow.await.unwrap().expect("the slow stream finished");
    assert_eq!((parts.status.as_u16(), body.is_empty()), (200, false));
    // GOAWAY came: the connection ends once its streams have, and takes no new one.
    tokio::time::timeout(Duration::from_secs(10), driver)
        .await
        .expect("the connection closed after the reload's GOAWAY")
        .unwrap();
    assert!(exchange(&mut send, get(d.addr(), "/"), None).await.is_err());

    // The same for a shutdown, on a new connection under the new settings.
    let (send, driver) = h2c(d.addr()).await;
    let slow = {
        let mut send = send.clone();
        let req = get(d.addr(), "/delay/1500");
        tokio::spawn(async move { exchange(&mut send, req, None).await })
    };
    while b[0].in_flight() == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    d.proxy.begin_shutdown();
    let (parts, _) = slow.await.unwrap().expect("the slow stream finished");
    assert_eq!(parts.status, 200);
    tokio::time::timeout(Duration::from_secs(10), driver)
        .await
        .expect("the connection closed after the shutdown's GOAWAY")
        .unwrap();
    assert!(d.proxy.drained(Duration::from_secs(10)).await);
}

#[tokio::test]
async fn a_client_that_opens_no_window_is_cut_off_at_the_client_timeout() {
    let b = backends(1).await;
    let d = start(&b, |o| o.timeouts.client = Duration::from_millis(500));
    let mut s = TcpStream::connect(d.addr()).await.unwrap();
    s.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    // SETTINGS_INITIAL_WINDOW_SIZE = 0: no stream may be sent a byte of DATA.
    s.write_all(&frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0, 0]))
        .await
        .unwrap();
    s.write_all(&frame(
        HEADERS,
        END_HEADERS | END_STREAM,
        1,
        &request_block(false, "/big/1000000"),
    ))
    .await
    .unwrap();
    let fs = frames(&mut s, |f| f.kind == RST_STREAM && f.stream == 1).await;
    assert!(answered(&fs, 1), "the head needs no window: {fs:?}");
    assert!(!fs.iter().any(|f| f.kind == DATA), "{fs:?}");
    // Cut off, not ended: the client must not take a part for the whole.
    assert_eq!(reset_of(&fs, 1), Some(INTERNAL_ERROR), "{fs:?}");
    // The backend connection it held is gone, and the backend free again.
    let freed = tokio::time::timeout(Duration::from_secs(10), async {
        while b[0].in_flight() > 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    assert!(
        freed.await.is_ok(),
        "the backend still serves the cut-off stream"
    );
}

/// `http2_max_streams` is what a client is told it may open at once (SETTINGS), and
/// what drover runs at once on one connection.
#[tokio::test]
async fn a_client_is_told_the_streams_it_may_open() {
    let b = backends(1).await;
    let d = start(&b, |o| o.http2_max_streams = 2);
    let (mut send, _driver) = h2c(d.addr()).await;
    let (parts, _) = exchange(&mut send, get(d.addr(), "/"), None).await.unwrap();
    assert_eq!(parts.status, 200);
    assert_eq!(send.current_max_send_streams(), 2);
    // Six slow requests at once: at most two at the backend together.
    b[0].reset_stats();
    let slow: Vec<_> = (0..6)
        .map(|_| {
            let mut send = send.clone();
            let req = get(d.addr(), "/delay/200");
            tokio::spawn(async move { exchange(&mut send, req, None).await.unwrap().0.status })
        })
        .collect();
    for s in slow {
        assert_eq!(s.await.unwrap(), 200);
    }
    assert_eq!(b[0].max_in_flight(), 2);
}
