//! TLS to backends (`backend_tls`, `drover proxy --backend-tls`) through real processes
//! and real sockets: the backends are rustls servers in this test and `openssl
//! s_server`, with certificates a CA of the test's own signs (rcgen). drover verifies
//! them against that CA or the system's store (or not at all, when told so by name), by
//! IP SAN or by `server_name` (sent as SNI); keeps its TLS connections alive (counted at
//! the backend), for HTTP/1.1 and HTTP/2 clients and request bodies alike; shows a
//! client certificate to a backend that requires one; and answers a
//! 502 naming the TLS failure (`drover-error: backend-tls`), counted in /metrics and
//! held against the endpoint, for a self-signed, expired or misnamed certificate, a
//! plain HTTP backend, one that stalls mid-handshake and one that wants a client
//! certificate drover has not got. Health checks go over TLS and say why they fail in
//! `ctl status`. Bad files are refused at start (`drover check`) and on reload, which
//! then changes nothing.

mod common;

use common::pki::{far_future, Pki};
use common::{admin_addr, bin, ctl, metrics_text, status};
use drover_testkit::{DroverProcess, HttpClient};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// `path` as TOML writes a string.
fn toml_path(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// An HTTPS backend: a rustls server answering each HTTP/1.1 request on a kept-alive
/// connection with `sni=NAME client-cert=yes|no`, counting the TCP connections it
/// accepted, the handshakes that completed and the requests it answered. A request with
/// `Upgrade: websocket` is answered `101` and the connection then echoes what it gets.
struct TlsBackend {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    handshakes: Arc<AtomicUsize>,
    requests: Arc<AtomicUsize>,
    _task: tokio::task::JoinHandle<()>,
}

/// A rustls server on 127.0.0.1:0 with the certificate `cert` (PEM chain and key);
/// with `client_ca`, it requires a client certificate signed by that CA.
async fn tls_backend(cert: &(PathBuf, PathBuf), client_ca: Option<&Pki>) -> TlsBackend {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&cert.0)
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&cert.1).unwrap();
    let builder = rustls::ServerConfig::builder();
    let builder = match client_ca {
        Some(pki) => {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(pki.ca_der()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots))
                .build()
                .unwrap();
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let config = Arc::new(builder.with_single_cert(chain, key).unwrap());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (connections, handshakes, requests) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let task = {
        let (connections, handshakes, requests) = (
            Arc::clone(&connections),
            Arc::clone(&handshakes),
            Arc::clone(&requests),
        );
        tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                connections.fetch_add(1, Ordering::SeqCst);
                let (acceptor, handshakes, requests) = (
                    acceptor.clone(),
                    Arc::clone(&handshakes),
                    Arc::clone(&requests),
                );
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    handshakes.fetch_add(1, Ordering::SeqCst);
                    let (sni, client_cert) = {
                        let conn = tls.get_ref().1;
                        (
                            conn.server_name().map(str::to_owned),
                            conn.peer_certificates().is_some_and(|c| !c.is_empty()),
                        )
                    };
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    loop {
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            // A body (Content-Length only: drover sends no other framing
                            // for one) is read whole and its length answered.
                            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
                            let length: usize = head
                                .lines()
                                .find_map(|l| l.strip_prefix("content-length:"))
                                .map_or(0, |v| v.trim().parse().unwrap());
                            if buf.len() < end + 4 + length {
                                break;
                            }
                            buf.drain(..end + 4 + length);
                            requests.fetch_add(1, Ordering::SeqCst);
                            if head.contains("\nupgrade: websocket") {
                                let switched = "HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: Upgrade\r\n\r\n";
                                if tls.write_all(switched.as_bytes()).await.is_err()
                                    || tls.write_all(&buf).await.is_err()
                                {
                                    return;
                                }
                                let (mut rd, mut wr) = tokio::io::split(tls);
                                let _ = tokio::io::copy(&mut rd, &mut wr).await;
                                return;
                            }
                            let mut body = format!(
                                "sni={} client-cert={}",
                                sni.as_deref().unwrap_or("-"),
                                if client_cert { "yes" } else { "no" }
                            );
                            if length > 0 {
                                body += &format!(" body={length}");
                            }
                            let answer = format!(
                                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}",
                                body.len()
                            );
                            if tls.write_all(answer.as_bytes()).await.is_err() {
                                return;
                            }
                        }
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        })
    };
    TlsBackend {
        addr,
        connections,
        handshakes,
        requests,
        _task: task,
    }
}

/// A `tls_backend` with a certificate `pki` signed for 127.0.0.1, asking for no client
/// certificate.
async fn ip_backend(pki: &Pki, name: &str) -> TlsBackend {
    tls_backend(
        &pki.leaf(name, "backend", &["127.0.0.1"], far_future()),
        None,
    )
    .await
}

/// A self-signed certificate for 127.0.0.1, as `NAME.pem` and `NAME.key` in `dir`:
/// signed by no CA drover trusts.
fn self_signed(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let made = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (pem, key) = (
        dir.join(format!("{name}.pem")),
        dir.join(format!("{name}.key")),
    );
    std::fs::write(&pem, made.cert.pem()).unwrap();
    std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
    (pem, key)
}

/// The balancer `web` over `backends` with `extra` keys (its `backend_tls` among them),
/// one thread, behind an admin API.
fn config(backends: &[SocketAddr], extra: &str) -> String {
    let list: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[balancer]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\nthreads = 1\nretries = 0\nbackends = [{}]\n{extra}",
        list.join(", ")
    )
}

/// `drover proxy --config` of `toml` in `dir`: drover, the balancer's and the admin
/// API's addresses, and the file.
async fn start(dir: &Path, toml: &str) -> (DroverProcess, SocketAddr, SocketAddr, PathBuf) {
    let path = dir.join("drover.toml");
    std::fs::write(&path, toml).unwrap();
    let d = DroverProcess::spawn(bin(), &["proxy", "--config", path.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    let web = *d
        .addrs_after("balancer \"web\" listening on ")
        .first()
        .unwrap_or_else(|| panic!("no listen line\n{}", d.stderr_text()));
    (d, web, admin, path)
}

/// One `GET /` on a new connection to `addr`.
async fn get(addr: SocketAddr) -> drover_testkit::Response {
    HttpClient::connect(addr).await.unwrap().get("/").await
}

/// The sample of `metric` whose labels include every one of `labels`, or 0.
fn sample(metrics: &str, metric: &str, labels: &[&str]) -> u64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")))
        .find(|l| labels.iter().all(|want| l.contains(want)))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[tokio::test]
async fn verifies_backends_by_a_given_ca_and_keeps_tls_connections_alive() {
    let pki = Pki::new("backend-tls-ca");
    let by_ip = pki.leaf("by-ip", "backend", &["127.0.0.1"], far_future());
    let backend = tls_backend(&by_ip, None).await;
    let extra = format!("backend_tls = {{ ca = {} }}\n", toml_path(&pki.ca_pem));
    let (d, web, _admin, _) = start(&pki.dir, &config(&[backend.addr], &extra)).await;

    // Twenty requests, one after the other over one client connection: a serving thread
    // reuses its one kept-alive TLS connection to the backend for all of them.
    let mut client = HttpClient::connect(web).await.unwrap();
    for i in 0..20 {
        let r = client.get(&format!("/{i}")).await;
        assert_eq!(r.status, 200, "{}\n{}", r.text(), d.stderr_text());
        // Verified by its IP SAN, so no SNI was sent (RFC 6066 has none for an IP).
        assert_eq!(r.text(), "sni=- client-cert=no");
    }
    assert_eq!(backend.requests.load(Ordering::SeqCst), 20);
    assert_eq!(
        backend.handshakes.load(Ordering::SeqCst),
        1,
        "each request made its own TLS connection: no keep-alive over TLS"
    );
    // A request body (2 MB, far past the socket buffers) goes whole over TLS, on the
    // same connection.
    let big = vec![b'x'; 2_000_000];
    let r = client
        .request("POST", "/upload", &[], Some(&big))
        .await
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "sni=- client-cert=no body=2000000");
    // And again from other client connections, still over the same backend connection.
    for _ in 0..5 {
        assert_eq!(get(web).await.status, 200);
    }
    assert_eq!(backend.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn server_name_is_sent_as_sni_and_verified_and_flags_do_the_same() {
    let pki = Pki::new("backend-tls-name");
    // Named only by DNS name: an IP endpoint needs server_name to verify it.
    let named = pki.leaf("named", "api", &["api.internal"], far_future());
    let backend = tls_backend(&named, None).await;

    let extra = format!(
        "backend_tls = {{ ca = {}, server_name = \"api.internal\" }}\n",
        toml_path(&pki.ca_pem)
    );
    let (_d, web, _, _) = start(&pki.dir, &config(&[backend.addr], &extra)).await;
    let r = get(web).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "sni=api.internal client-cert=no");

    // The same with `drover proxy` flags.
    let d = common::proxy(
        &[backend.addr],
        &[
            "--backend-ca",
            pki.ca_pem.to_str().unwrap(),
            "--backend-server-name",
            "api.internal",
        ],
    )
    .await;
    let r = get(d.addr()).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), d.stderr_text());
    assert_eq!(r.text(), "sni=api.internal client-cert=no");

    // Without server_name the IP is verified, and the certificate has no IP SAN.
    let d = common::proxy(
        &[backend.addr],
        &["--backend-ca", pki.ca_pem.to_str().unwrap()],
    )
    .await;
    let r = get(d.addr()).await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("drover-error"), Some("backend-tls"));
    assert!(r.text().contains("(wrong-name)"), "{}", r.text());
}

#[tokio::test]
async fn a_client_certificate_is_shown_to_a_backend_that_requires_one() {
    let pki = Pki::new("backend-tls-mtls");
    let server = pki.leaf("server", "backend", &["127.0.0.1"], far_future());
    let client = pki.leaf("client", "drover", &["drover.client"], far_future());
    let backend = tls_backend(&server, Some(&pki)).await;

    let extra = format!(
        "backend_tls = {{ ca = {}, cert = {}, key = {} }}\n",
        toml_path(&pki.ca_pem),
        toml_path(&client.0),
        toml_path(&client.1)
    );
    let (_d, web, _, _) = start(&pki.dir, &config(&[backend.addr], &extra)).await;
    let r = get(web).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.text(), "sni=- client-cert=yes");

    // Without one, the backend refuses the handshake and the client hears why.
    let d = common::proxy(
        &[backend.addr],
        &["--backend-ca", pki.ca_pem.to_str().unwrap()],
    )
    .await;
    let r = get(d.addr()).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("drover-error"), Some("backend-tls"));
    assert!(
        r.text().contains("client-cert-required"),
        "{}\n{}",
        r.text(),
        d.stderr_text()
    );

    // A client certificate another CA signed is refused by the backend.
    let other = Pki::new("backend-tls-mtls-other");
    let stranger = other.leaf("stranger", "drover", &["drover.client"], far_future());
    let d = common::proxy(
        &[backend.addr],
        &[
            "--backend-ca",
            pki.ca_pem.to_str().unwrap(),
            "--backend-cert",
            stranger.0.to_str().unwrap(),
            "--backend-key",
            stranger.1.to_str().unwrap(),
        ],
    )
    .await;
    let r = get(d.addr()).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("client-cert-refused"), "{}", r.text());
}

#[tokio::test]
async fn without_a_ca_the_system_store_verifies_and_insecure_skip_verify_takes_anything() {
    let pki = Pki::new("backend-tls-system");
    let backend = tls_backend(&self_signed(&pki.dir, "self"), None).await;
    // The system's trust store does not know the test's certificate.
    let d = DroverProcess::spawn(
        bin(),
        &[
            "proxy",
            "-l",
            "127.0.0.1:0",
            "-t",
            "1",
            "-b",
            &backend.addr.to_string(),
            "--backend-tls",
        ],
    )
    .await;
    let r = get(d.addr()).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert!(r.text().contains("(unknown-issuer)"), "{}", r.text());
    // Verification off, by its name: encrypted, not authenticated.
    let d = common::proxy(&[backend.addr], &["--backend-insecure-skip-verify"]).await;
    let r = get(d.addr()).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), d.stderr_text());
    assert_eq!(r.text(), "sni=- client-cert=no");
    let extra = "backend_tls = { insecure_skip_verify = true }\n";
    let (_d, web, _, _) = start(&pki.dir, &config(&[backend.addr], extra)).await;
    assert_eq!(get(web).await.status, 200);
}

/// A backend that takes connections and never says a word: a TLS client waits for
/// its ServerHello.
async fn silent_backend() -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = listener.accept().await {
            held.push(s);
        }
    });
    (addr, task)
}

/// A plain HTTP server as nginx is to a TLS client: whatever arrives gets a 400, then
/// the connection closes. Counts the connections it answered.
async fn plain_http_backend() -> (SocketAddr, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let answered = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&answered);
    let task = tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            let mut buf = [0u8; 1024];
            if matches!(s.read(&mut buf).await, Ok(n) if n > 0) {
                let _ = s
                    .write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                    .await;
                count.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (addr, answered, task)
}

#[tokio::test]
async fn each_tls_failure_is_a_502_naming_it_counted_and_held_against_the_endpoint() {
    let pki = Pki::new("backend-tls-fail");
    let self_signed = tls_backend(&self_signed(&pki.dir, "self"), None).await;
    let expired = tls_backend(
        &pki.leaf("expired", "backend", &["127.0.0.1"], (2020, 1, 1)),
        None,
    )
    .await;
    let misnamed = tls_backend(
        &pki.leaf("misnamed", "backend", &["other.example"], far_future()),
        None,
    )
    .await;
    let (plain, plain_answered, _plain) = plain_http_backend().await;
    let (silent, _silent) = silent_backend().await;

    let cases = [
        (self_signed.addr, "unknown-issuer"),
        (expired.addr, "expired"),
        (misnamed.addr, "wrong-name"),
        (plain, "not-tls"),
        (silent, "timeout"),
    ];
    for (addr, reason) in cases {
        // The stalled handshake is cut at the connect timeout; the others are answered
        // well within the default one (a short one would time out on a busy machine).
        let connect = if reason == "timeout" { "300ms" } else { "5s" };
        let extra = format!(
            "backend_tls = {{ ca = {} }}\ntimeouts = {{ connect = \"{connect}\" }}\n",
            toml_path(&pki.ca_pem)
        );
        let (d, web, admin, _) = start(&pki.dir, &config(&[addr], &extra)).await;
        let r = get(web).await;
        assert_eq!(r.status, 502, "{reason}: {}", r.text());
        assert_eq!(r.header("drover-error"), Some("backend-tls"), "{reason}");
        assert!(
            r.text().contains(&format!("({reason})")),
            "{reason}: {}\n{}",
            r.text(),
            d.stderr_text()
        );
        let metrics = metrics_text(admin).await;
        assert_eq!(
            sample(
                &metrics,
                "drover_errors_total",
                &["balancer=\"web\"", "cause=\"backend-tls\""]
            ),
            1,
            "{reason}\n{metrics}"
        );
        assert_eq!(
            sample(
                &metrics,
                "drover_endpoint_failures_total",
                &[&format!("{addr}"), "cause=\"backend-tls\""]
            ),
            1,
            "{reason}\n{metrics}"
        );
        assert_eq!(
            sample(
                &metrics,
                "drover_backend_tls_failures_total",
                &["balancer=\"web\"", &format!("reason=\"{reason}\"")]
            ),
            1,
            "{reason}\n{metrics}"
        );
        // Passive health took it out as for a failed connect (the ejection lasts 2 s;
        // its count stays).
        let s = status(admin).await;
        let ep = &s.balancers[0].endpoints[0];
        assert_eq!(ep.ejections, 1, "{reason}: {ep:?}");
    }
    // The plain backend got the ClientHello, which it answered as HTTP.
    assert_eq!(plain_answered.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn health_checks_go_over_tls_and_say_why_they_fail() {
    let pki = Pki::new("backend-tls-health");
    let good = ip_backend(&pki, "good").await;
    let bad = tls_backend(&self_signed(&pki.dir, "bad"), None).await;
    let extra = format!(
        "backend_tls = {{ ca = {} }}\nhealth = {{ path = \"/health\", interval = \"100ms\", timeout = \"1s\", fall = 2, rise = 1 }}\n",
        toml_path(&pki.ca_pem)
    );
    let (d, web, admin, _) = start(&pki.dir, &config(&[good.addr, bad.addr], &extra)).await;
    let mut why = None;
    for _ in 0..100 {
        let s = status(admin).await;
        let row = s.balancers[0]
            .endpoints
            .iter()
            .find(|e| e.addr == bad.addr.to_string())
            .unwrap()
            .clone();
        if !row.healthy {
            why = row.check_error;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let why = why.unwrap_or_else(|| panic!("never marked down\n{}", d.stderr_text()));
    assert!(
        why.starts_with("TLS handshake failed: unknown-issuer"),
        "{why}"
    );
    let (_, table, _) = ctl(admin, &["status"]).await;
    assert!(
        table.contains(&format!(
            "{}: health check failing: TLS handshake failed: unknown-issuer",
            bad.addr
        )),
        "{table}"
    );
    // The good one passes its checks over TLS (the probes reached it as requests).
    let s = status(admin).await;
    let row = s.balancers[0]
        .endpoints
        .iter()
        .find(|e| e.addr == good.addr.to_string())
        .unwrap();
    assert!(row.healthy && row.check_error.is_none(), "{row:?}");
    assert!(good.requests.load(Ordering::SeqCst) >= 1);
    // Every request goes to the good one now.
    for _ in 0..5 {
        assert_eq!(get(web).await.status, 200);
    }
}

/// `drover check -c FILE`: its exit code and what it printed.
fn check(file: &Path) -> (bool, String) {
    let out = Command::new(bin())
        .args(["check", "-c", file.to_str().unwrap()])
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[tokio::test]
async fn bad_files_are_named_with_their_place_and_a_reload_with_one_changes_nothing() {
    let pki = Pki::new("backend-tls-files");
    let backend = ip_backend(&pki, "server").await;
    let client = pki.leaf("client", "drover", &["drover.client"], far_future());
    let missing = pki.dir.join("missing.pem");
    let not_pem = pki.dir.join("not.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let file = pki.dir.join("check.toml");

    // The file and why, at the line and column of the key that named it.
    let cases = [
        (
            format!("backend_tls = {{ ca = {} }}\n", toml_path(&missing)),
            format!("check.toml:10:22: balancer[0].backend_tls.ca: balancer \"web\": backend_tls: cannot read {}", missing.display()),
        ),
        (
            format!("backend_tls = {{ ca = {} }}\n", toml_path(&not_pem)),
            format!("check.toml:10:22: balancer[0].backend_tls.ca: balancer \"web\": backend_tls: {} is not PEM", not_pem.display()),
        ),
        (
            format!(
                "backend_tls = {{ cert = {}, key = {} }}\n",
                toml_path(&client.0),
                toml_path(&not_pem)
            ),
            format!("balancer[0].backend_tls.key: balancer \"web\": backend_tls: {} is not PEM", not_pem.display()),
        ),
        (
            format!(
                "backend_tls = {{ cert = {}, key = {} }}\n",
                toml_path(&missing),
                toml_path(&client.1)
            ),
            format!("balancer[0].backend_tls.cert: balancer \"web\": backend_tls: cannot read {}", missing.display()),
        ),
    ];
    for (extra, want) in &cases {
        std::fs::write(&file, config(&[backend.addr], extra)).unwrap();
        let (ok, out) = check(&file);
        assert!(!ok, "{extra} passed");
        assert!(out.contains(want.as_str()), "want {want}\nin {out}");
    }

    // A start with a bad CA fails, naming the flag.
    let out = Command::new(bin())
        .args([
            "proxy",
            "-l",
            "127.0.0.1:0",
            "-b",
            &backend.addr.to_string(),
        ])
        .args(["--backend-ca", missing.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(&format!(
            "--backend-ca: balancer \"default\": backend_tls: cannot read {}",
            missing.display()
        )),
        "{err}"
    );

    // A reload whose CA file went bad is refused and the balancer serves as before.
    let ca = pki.dir.join("reload-ca.pem");
    std::fs::copy(&pki.ca_pem, &ca).unwrap();
    let extra = format!("backend_tls = {{ ca = {} }}\n", toml_path(&ca));
    let (d, web, admin, _) = start(&pki.dir, &config(&[backend.addr], &extra)).await;
    assert_eq!(get(web).await.status, 200);
    std::fs::write(&ca, "not a certificate\n").unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains(&format!("{} is not PEM", ca.display())),
        "{err}"
    );
    assert_eq!(get(web).await.status, 200, "{}", d.stderr_text());
    // Put right, the reload applies: the CA file is read again.
    std::fs::copy(&pki.ca_pem, &ca).unwrap();
    let (code, _, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(get(web).await.status, 200);
}

#[tokio::test]
async fn a_reload_of_drover_started_from_flags_reads_the_backend_ca_again() {
    let pki = Pki::new("backend-tls-flags-reload");
    let other = Pki::new("backend-tls-flags-other");
    let backend = ip_backend(&pki, "server").await;
    // It starts trusting another CA than the one that signed the backend's certificate.
    let ca = pki.dir.join("flags-ca.pem");
    std::fs::copy(&other.ca_pem, &ca).unwrap();
    let d = common::proxy(
        &[backend.addr],
        &[
            "--backend-ca",
            ca.to_str().unwrap(),
            "--admin",
            "127.0.0.1:0",
            "--retries",
            "0",
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    let r = get(d.addr()).await;
    assert_eq!(r.status, 502, "{}", r.text());
    // Both test CAs have one name, so the other CA's signature is what fails.
    assert_eq!(
        r.header("drover-error"),
        Some("backend-tls"),
        "{}",
        r.text()
    );

    // A CA file that went bad: the reload is refused, naming the file, and nothing changed.
    std::fs::write(&ca, "not a certificate\n").unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains(&format!("{} is not PEM", ca.display()))
            && err.contains("nothing was reloaded"),
        "{err}"
    );
    // Still refused (a failed handshake ejects the endpoint for a while, so a 503 may
    // say so instead).
    let r = get(d.addr()).await;
    assert!(matches!(r.status, 502 | 503), "{} {}", r.status, r.text());

    // The right CA in the file: after `drover ctl reload` the backend is trusted, once
    // its ejection has run out.
    std::fs::copy(&pki.ca_pem, &ca).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("certificates read again: default"), "{out}");
    let mut last = None;
    for _ in 0..150 {
        let r = get(d.addr()).await;
        if r.status == 200 {
            assert_eq!(r.text(), "sni=- client-cert=no");
            return;
        }
        last = Some((r.status, r.text()));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "never served after the reload: {last:?}\n{}",
        d.stderr_text()
    );
}

#[tokio::test]
async fn a_websocket_upgrade_goes_over_tls_to_the_backend() {
    let pki = Pki::new("backend-tls-websocket");
    let backend = ip_backend(&pki, "server").await;
    let d = common::proxy(
        &[backend.addr],
        &["--backend-ca", pki.ca_pem.to_str().unwrap()],
    )
    .await;
    let mut c = tokio::net::TcpStream::connect(d.addr()).await.unwrap();
    c.write_all(
        b"GET /chat HTTP/1.1\r\nHost: ws.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
    )
    .await
    .unwrap();
    let mut got = Vec::new();
    let mut chunk = [0u8; 1024];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), c.read(&mut chunk))
            .await
            .expect("no answer to the upgrade")
            .unwrap();
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
        got.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&got).to_string();
    assert!(
        head.starts_with("HTTP/1.1 101"),
        "{head}\n{}",
        d.stderr_text()
    );
    // Both ways through the tunnel, over drover's TLS connection to the backend, which
    // echoes: frames are opaque bytes to drover.
    for message in [&b"hello over tls"[..], &[0x81, 0x02, b'h', b'i'][..]] {
        c.write_all(message).await.unwrap();
        let mut echoed = vec![0u8; message.len()];
        tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut echoed))
            .await
            .expect("no echo")
            .unwrap();
        assert_eq!(echoed, message);
    }
    assert_eq!(backend.handshakes.load(Ordering::SeqCst), 1);
}

/// `openssl s_server -www` on a free port with `cert`, requiring a client certificate
/// signed by `client_ca`: a TLS server of another implementation than drover's. Killed
/// when dropped.
async fn openssl_backend(cert: &(PathBuf, PathBuf), client_ca: &Path) -> (SocketAddr, KillOnDrop) {
    let addr: SocketAddr = format!("127.0.0.1:{}", drover_testkit::free_port())
        .parse()
        .unwrap();
    let child = std::process::Command::new("openssl")
        .args(["s_server", "-quiet", "-www", "-accept", &addr.to_string()])
        .args([
            "-cert",
            cert.0.to_str().unwrap(),
            "-key",
            cert.1.to_str().unwrap(),
        ])
        .args([
            "-Verify",
            "1",
            "-verify_return_error",
            "-CAfile",
            client_ca.to_str().unwrap(),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let child = KillOnDrop(child);
    let up = drover_testkit::wait_until_async(Duration::from_secs(10), || async {
        tokio::net::TcpStream::connect(addr).await.is_ok()
    })
    .await;
    assert!(up, "openssl s_server did not start on {addr}");
    (addr, child)
}

struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn an_openssl_backend_checks_drovers_client_certificate() {
    if !common::pki::tools() {
        return;
    }
    let pki = Pki::new("backend-tls-openssl");
    let server = pki.leaf("server", "backend", &["127.0.0.1"], far_future());
    let client = pki.leaf("client", "drover-client", &["drover.client"], far_future());
    let (backend, _openssl) = openssl_backend(&server, &pki.ca_pem).await;

    let d = common::proxy(
        &[backend],
        &[
            "--backend-ca",
            pki.ca_pem.to_str().unwrap(),
            "--backend-cert",
            client.0.to_str().unwrap(),
            "--backend-key",
            client.1.to_str().unwrap(),
        ],
    )
    .await;
    let r = get(d.addr()).await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), d.stderr_text());
    // s_server's status page: the session it negotiated with drover.
    assert!(r.text().contains("TLSv1.3"), "{}", r.text());

    let d = common::proxy(&[backend], &["--backend-ca", pki.ca_pem.to_str().unwrap()]).await;
    let r = get(d.addr()).await;
    assert_eq!(r.status, 502, "{}", r.text());
    assert_eq!(r.header("drover-error"), Some("backend-tls"));
    assert!(r.text().contains("client-cert-required"), "{}", r.text());
}

#[tokio::test]
async fn http2_clients_reach_tls_backends_too() {
    if !common::pki::tools() {
        return;
    }
    let pki = Pki::new("backend-tls-h2");
    let backend = ip_backend(&pki, "server").await;
    let d = common::proxy(
        &[backend.addr],
        &["--backend-ca", pki.ca_pem.to_str().unwrap(), "--h2c"],
    )
    .await;
    // Three HTTP/2 requests (a curl connection each), each over the pool's one TLS
    // connection to the backend. One curl run with several URLs is not used: on its
    // reused prior-knowledge connection the second request fails with a plain backend
    // too, which is not this feature's to fix.
    let url = format!("http://{}/", d.addr());
    for _ in 0..3 {
        let out = tokio::process::Command::new("curl")
            .args(["-sS", "--http2-prior-knowledge", "-w", " %{http_version}"])
            .arg(&url)
            .output()
            .await
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            "sni=- client-cert=no 2",
            "{}\n{}",
            String::from_utf8_lossy(&out.stderr),
            d.stderr_text()
        );
    }
    assert_eq!(backend.handshakes.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_route_to_a_balancer_with_backend_tls_speaks_tls_to_its_backends() {
    let pki = Pki::new("backend-tls-routes");
    let tls = ip_backend(&pki, "server").await;
    let plain = drover_testkit::Backend::start().await;
    // `web` (the listener) keeps its plain backend; /secure/ goes to `secure`, which
    // has no listener and speaks TLS to its own.
    let toml = format!(
        "{}routes = [{{ path_prefix = \"/secure/\", balancer = \"secure\" }}]\n\n[[balancer]]\nname = \"secure\"\nbackends = [\"{}\"]\nbackend_tls = {{ ca = {} }}\n",
        config(&[plain.addr()], ""),
        tls.addr,
        toml_path(&pki.ca_pem)
    );
    let (d, web, _, _) = start(&pki.dir, &toml).await;
    let mut client = HttpClient::connect(web).await.unwrap();
    let r = client.get("/secure/a").await;
    assert_eq!(r.status, 200, "{}\n{}", r.text(), d.stderr_text());
    assert_eq!(r.text(), "sni=- client-cert=no");
    let r = client.get("/other").await;
    assert_eq!(r.status, 200);
    assert_eq!(plain.hits(), 1);
    assert_eq!(tls.requests.load(Ordering::SeqCst), 1);
}
