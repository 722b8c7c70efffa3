//! TLS passthrough routed by SNI (`mode = "tcp"` with `routes`), through real
//! processes: HTTPS backends made here (tokio-rustls, each with a certificate of its
//! own from the test's CA, each answering with its name), reached through drover by
//! curl (`--resolve`, verifying the certificate) and `openssl s_client -servername`.
//! Exact names, the most specific wildcard, the listener's own backends as the
//! default, a hello without SNI, a hello sent a byte at a time; garbage, a stalled
//! client and no route closed and counted; each pool's metrics; a reload that changes
//! the map. A listener with `tls` ends the TLS itself and routes by the session's name.

mod common;

use common::pki::{far_future, tools, Pki};
use common::{bin, ctl, metrics_text, proxy_config, temp_dir};
use std::io::{Read, Write};
use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// An HTTPS server on 127.0.0.1:0 with a certificate of CN `name` for `names`, signed by
/// `pki`'s CA, answering every request with `name`.
async fn backend(pki: &Pki, name: &'static str, names: &[&str]) -> SocketAddr {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.signed_by(&key, &pki.ca).unwrap();
    let der = rustls::pki_types::PrivateKeyDer::try_from(key.serialize_der()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone()], der)
        .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(s).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                    name.len()
                );
                let _ = tls.write_all(answer.as_bytes()).await;
                let _ = tls.shutdown().await;
            });
        }
    });
    addr
}

/// An HTTP server in the clear on 127.0.0.1:0, answering every request with `name`.
async fn plain_backend(name: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{name}",
                    name.len()
                );
                let _ = s.write_all(answer.as_bytes()).await;
                let _ = s.shutdown().await;
            });
        }
    });
    addr
}

/// The `front` TCP listener with `front_keys` (its backends and routes), and the TCP
/// balancers `api` and `web` over their backends (`web` has no listener: it serves what
/// routes send it), behind an admin API.
fn config(front_keys: &str, api: SocketAddr, web: SocketAddr) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n\
         [[balancer]]\nname = \"front\"\nmode = \"tcp\"\nlisten = \"127.0.0.1:0\"\nthreads = 1\n{front_keys}\n\
         [[balancer]]\nname = \"api\"\nmode = \"tcp\"\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"{api}\"]\n\n\
         [[balancer]]\nname = \"web\"\nmode = \"tcp\"\nthreads = 1\nbackends = [\"{web}\"]\n"
    )
}

/// curl to `https://host:PORT/` with `host` resolved to `addr`, trusting the test CA:
/// the body, or the error.
fn curl(pki: &Pki, host: &str, addr: SocketAddr) -> Result<String, String> {
    let out = Command::new("curl")
        .args(["-sS", "--http1.1", "--max-time", "10", "--cacert"])
        .arg(&pki.ca_pem)
        .arg("--resolve")
        .arg(format!("{host}:{}:127.0.0.1", addr.port()))
        .arg(format!("https://{host}:{}/", addr.port()))
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The subject CN of the certificate `openssl s_client` was shown through `addr`, with
/// `-servername sni` or none; `None` when the handshake failed.
fn served_cn(addr: SocketAddr, sni: Option<&str>) -> Option<String> {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect", &addr.to_string()]);
    match sni {
        Some(name) => cmd.args(["-servername", name]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines().find_map(|l| {
        let cn = l
            .strip_prefix("subject=")?
            .split_once("CN")?
            .1
            .split_once('=')?
            .1;
        Some(cn.split(',').next().unwrap_or(cn).trim().to_string())
    })
}

/// A counter of balancer `b` with `labels` after `balancer="b"` (0 when absent).
async fn metric(admin: SocketAddr, b: &str, name: &str, labels: &str) -> u64 {
    let text = metrics_text(admin).await;
    let prefix = format!("{name}{{balancer=\"{b}\"{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.parse().unwrap())
}

/// Waits (10 s at most) until the counter reads `want`.
async fn wait_metric(admin: SocketAddr, b: &str, name: &str, labels: &str, want: u64) {
    let reached = drover_testkit::wait_until_async(Duration::from_secs(10), || async {
        metric(admin, b, name, labels).await == want
    })
    .await;
    assert!(
        reached,
        "{name}{{balancer={b}{labels}}} never read {want}:\n{}",
        metrics_text(admin).await
    );
}

/// A whole HTTPS request through `addr` by a rustls client whose ClientHello (for
/// `name`) goes out one byte per write, each its own segment: the body, or the error.
fn trickled_request(pki: &Pki, addr: SocketAddr, name: &str) -> Result<String, String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca.der().clone()).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server = rustls::pki_types::ServerName::try_from(name.to_string()).unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), server).unwrap();
    let mut sock = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    sock.set_nodelay(true).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut hello = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut hello).unwrap();
    }
    for byte in &hello {
        sock.write_all(std::slice::from_ref(byte))
            .map_err(|e| e.to_string())?;
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    tls.write_all(format!("GET / HTTP/1.1\r\nHost: {name}\r\n\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    match tls.read_to_end(&mut answer) {
        Ok(_) => {}
        // The backend closes without close_notify's wait: what came is the answer.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(e) => return Err(e.to_string()),
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    Ok(text.split("\r\n\r\n").nth(1).unwrap_or("").to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_go_to_the_pool_their_sni_names_and_a_reload_changes_the_map() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tcp-sni");
    let api = backend(&pki, "api", &["api.example.com", "x.v2.example.com"]).await;
    let web = backend(
        &pki,
        "web",
        &["www.example.com", "a.b.example.com", "api.example.com"],
    )
    .await;
    let fallback = backend(&pki, "fallback", &["other.test"]).await;
    let routes = "routes = [\n  { sni = [\"api.example.com\", \"*.v2.example.com\"], balancer = \"api\" },\n  { sni = [\"*.example.com\"], balancer = \"web\" },\n]\n";
    let front = format!("backends = [\"{fallback}\"]\n{routes}");
    let (d, addr, admin, path) = proxy_config(&pki.dir, &config(&front, api, web), "front").await;

    // Exact beats the wildcard; the longer wildcard beats the shorter; any depth.
    assert_eq!(curl(&pki, "api.example.com", addr), Ok("api".into()));
    assert_eq!(curl(&pki, "x.v2.example.com", addr), Ok("api".into()));
    assert_eq!(curl(&pki, "www.example.com", addr), Ok("web".into()));
    assert_eq!(curl(&pki, "a.b.example.com", addr), Ok("web".into()));
    // No route: the listener's own backends; so is a hello without SNI.
    assert_eq!(curl(&pki, "other.test", addr), Ok("fallback".into()));
    assert_eq!(served_cn(addr, None).as_deref(), Some("fallback"));
    assert_eq!(
        served_cn(addr, Some("API.EXAMPLE.COM")).as_deref(),
        Some("api"),
        "any case"
    );
    // A hello in single-byte segments is read whole, then relayed from its first byte.
    let pki_ref = &pki;
    let trickled =
        tokio::task::block_in_place(|| trickled_request(pki_ref, addr, "www.example.com"));
    assert_eq!(trickled, Ok("web".into()));

    // Each pool counts its own connections; the listener counts what it served itself.
    let connections = "drover_tcp_connections_total";
    wait_metric(admin, "api", connections, "", 3).await;
    wait_metric(admin, "web", connections, "", 3).await;
    wait_metric(admin, "front", connections, "", 2).await;
    assert!(metric(admin, "api", "drover_tcp_received_bytes_total", "").await > 0);

    // Garbage: closed unread, counted.
    let mut s = TcpStream::connect(addr).await.unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed: {read:?}");
    assert!(got.is_empty(), "no byte answers garbage");
    let unrouted = "drover_tcp_sni_unrouted_total";
    wait_metric(admin, "front", unrouted, ",reason=\"not-tls\"", 1).await;
    assert_eq!(metric(admin, "front", connections, "").await, 2);

    // A reload that changes the map: api.example.com now goes to web.
    let swapped = format!(
        "backends = [\"{fallback}\"]\nroutes = [\n  {{ sni = [\"*.v2.example.com\"], balancer = \"api\" }},\n  {{ sni = [\"*.example.com\"], balancer = \"web\" }},\n]\n"
    );
    std::fs::write(&path, config(&swapped, api, web)).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(curl(&pki, "api.example.com", addr), Ok("web".into()));
    assert_eq!(curl(&pki, "x.v2.example.com", addr), Ok("api".into()));
    drop(d);
}

/// A TCP listener with `tls` ends the clients' TLS itself and routes each session by
/// the name it was made for: drover's certificate for that name is the one shown, and
/// the bytes inside go in the clear to the route's pool. A session without SNI gets the
/// first certificate and the listener's own backends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_listener_routes_each_session_by_its_name_and_relays_it_in_the_clear() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tcp-sni-terminated");
    let (api_cert, api_key) =
        pki.leaf("front-api", "front-api", &["api.example.com"], far_future());
    let (web_cert, web_key) = pki.leaf("front-web", "front-web", &["*.example.com"], far_future());
    let api = plain_backend("api").await;
    let web = plain_backend("web").await;
    let fallback = plain_backend("fallback").await;
    let front = format!(
        "backends = [\"{fallback}\"]\n\
         tls = {{ certs = [{{ cert = \"{}\", key = \"{}\" }}, {{ cert = \"{}\", key = \"{}\" }}] }}\n\
         routes = [\n  {{ sni = [\"api.example.com\"], balancer = \"api\" }},\n  {{ sni = [\"*.example.com\"], balancer = \"web\" }},\n]\n",
        api_cert.display(),
        api_key.display(),
        web_cert.display(),
        web_key.display()
    );
    let (d, addr, admin, _path) = proxy_config(&pki.dir, &config(&front, api, web), "front").await;
    assert_eq!(curl(&pki, "api.example.com", addr), Ok("api".into()));
    assert_eq!(curl(&pki, "www.example.com", addr), Ok("web".into()));
    assert_eq!(
        served_cn(addr, Some("api.example.com")).as_deref(),
        Some("front-api")
    );
    assert_eq!(
        served_cn(addr, Some("www.example.com")).as_deref(),
        Some("front-web")
    );
    assert_eq!(served_cn(addr, None).as_deref(), Some("front-api"));
    wait_metric(admin, "front", "drover_tls_handshakes_total", "", 5).await;
    let connections = "drover_tcp_connections_total";
    wait_metric(admin, "api", connections, "", 2).await;
    wait_metric(admin, "web", connections, "", 2).await;
    wait_metric(admin, "front", connections, "", 1).await;

    // A renewed certificate is served once its files change, with no reload, as on an
    // HTTPS listener.
    pki.leaf(
        "front-api",
        "front-api-renewed",
        &["api.example.com"],
        far_future(),
    );
    let renewed = drover_testkit::wait_until_async(Duration::from_secs(10), || async {
        served_cn(addr, Some("api.example.com")).as_deref() == Some("front-api-renewed")
    })
    .await;
    assert!(renewed, "{}", d.stderr_text());
    assert_eq!(curl(&pki, "api.example.com", addr), Ok("api".into()));
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_default_no_route_a_stall_and_a_truncated_hello_are_closed_and_counted() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tcp-sni-closed");
    let api = backend(&pki, "api", &["api.example.com"]).await;
    let web = backend(&pki, "web", &["www.example.com"]).await;
    let front = "backends = []\ntimeouts = { header_read = \"1s\" }\nroutes = [{ sni = [\"api.example.com\"], balancer = \"api\" }, { sni = [\"unused.example.com\"], balancer = \"web\" }]\n";
    let (d, addr, admin, _path) = proxy_config(&pki.dir, &config(front, api, web), "front").await;
    assert_eq!(curl(&pki, "api.example.com", addr), Ok("api".into()));
    // No route and no backends of its own: closed, as is a hello without SNI.
    assert!(curl(&pki, "www.example.com", addr).is_err());
    assert_eq!(served_cn(addr, None), None);
    let unrouted = "drover_tcp_sni_unrouted_total";
    wait_metric(admin, "front", unrouted, ",reason=\"no-route\"", 2).await;
    assert_eq!(
        metric(admin, "web", "drover_tcp_connections_total", "").await,
        0
    );

    // A client that says nothing, and one that stops half-way through its hello: cut
    // by the header read timeout.
    let silent = TcpStream::connect(addr).await.unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
        .await
        .unwrap();
    for mut s in [silent, half] {
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "cut: {read:?}");
    }
    wait_metric(admin, "front", unrouted, ",reason=\"timeout\"", 2).await;
    // A truncated hello, then the client's close.
    let mut cut = TcpStream::connect(addr).await.unwrap();
    cut.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01])
        .await
        .unwrap();
    drop(cut);
    wait_metric(admin, "front", unrouted, ",reason=\"closed\"", 1).await;
    // A record that is no ClientHello.
    let mut bad = TcpStream::connect(addr).await.unwrap();
    bad.write_all(&[0x16, 0x03, 0x01, 0x00, 0x04, 0x02, 0x00, 0x00, 0x00])
        .await
        .unwrap();
    wait_metric(admin, "front", unrouted, ",reason=\"bad-hello\"", 1).await;
    drop(d);
}

#[test]
fn drover_check_names_a_duplicate_route_with_both_places() {
    let dir = temp_dir("tcp-sni-check");
    let path = dir.join("drover.toml");
    let text = config(
        "backends = []\nroutes = [\n  { sni = [\"a.test\"], balancer = \"api\" },\n  { sni = [\"A.test\"], balancer = \"web\" },\n]\n",
        "127.0.0.1:9001".parse().unwrap(),
        "127.0.0.1:9002".parse().unwrap(),
    );
    std::fs::write(&path, text).unwrap();
    let out = Command::new(bin())
        .args(["check", "-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "{}:12:12: balancer[0].routes[1].sni[0]: \"a.test\" is routed already by balancer[0].routes[0].sni[0] (line 11, column 12)",
            path.display()
        )),
        "{err}"
    );
}
