//! TLS termination through real processes and real clients: curl, `openssl s_client`
//! and a rustls client. Certificates are made here, by a CA of the test's own (rcgen):
//! SNI picks each one, a wildcard covers its names, the first is the default; backends
//! hear `X-Forwarded-Proto: https`; keep-alive, large bodies and a WebSocket pass over
//! TLS; sessions resume by ticket, also after a reload; a reload swaps a certificate
//! under load with no request failed, and a bad file on reload changes nothing; `drover
//! check` and a start name each bad file and why; a client that never finishes its
//! handshake is cut by the header timeout; plain HTTP to the TLS port gets a 400; the
//! metrics count each.

mod common;

use common::pki::{far_future, tools, Pki};
use common::{admin_addr, bin, ctl, metrics_text, temp_dir};
use drover_testkit::{Backend, DroverProcess};
use rustls::pki_types::{CertificateDer, ServerName};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// `path` as TOML writes a string.
fn toml_path(path: &Path) -> String {
    format!("{:?}", path.display().to_string())
}

/// `tls = { certs = [...] }` of these pairs.
fn tls_table(pairs: &[&(PathBuf, PathBuf)]) -> String {
    let certs: Vec<String> = pairs
        .iter()
        .map(|(c, k)| format!("{{ cert = {}, key = {} }}", toml_path(c), toml_path(k)))
        .collect();
    format!("tls = {{ certs = [{}] }}\n", certs.join(", "))
}

/// The balancer `web` on 127.0.0.1:0 over `backend`, one thread, with `extra` keys,
/// behind an admin API.
fn config(backend: SocketAddr, extra: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[balancer]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"{backend}\"]\n{extra}"
    )
}

/// `drover proxy --config` of `toml`: drover, the balancer's and the admin API's
/// addresses, and the file.
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

/// What `openssl s_client` prints for a handshake with `addr`: with `-servername sni`,
/// or with no SNI at all.
fn s_client(addr: SocketAddr, sni: Option<&str>, extra: &[&str]) -> String {
    let mut cmd = Command::new("openssl");
    cmd.args(["s_client", "-connect", &addr.to_string()]);
    match sni {
        Some(name) => cmd.args(["-servername", name]),
        None => cmd.arg("-noservername"),
    };
    let out = cmd
        .args(extra)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// The served certificate's subject CN, from `s_client`'s output (`subject=CN = x`).
fn subject_cn(out: &str) -> String {
    out.lines()
        .find_map(|l| {
            l.strip_prefix("subject=")?
                .split_once("CN")?
                .1
                .split_once('=')
        })
        .map(|(_, cn)| cn.split(',').next().unwrap_or(cn).trim().to_string())
        .unwrap_or_else(|| panic!("no subject in:\n{out}"))
}

/// `curl` with the test CA, `host` resolved to `addr`: exit code, body, stderr (`-v`).
fn curl(
    pki: &Pki,
    host: &str,
    addr: SocketAddr,
    urls: &[&str],
    extra: &[&str],
) -> (i32, String, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "-v", "--http1.1", "--max-time", "20", "--cacert"])
        .arg(&pki.ca_pem)
        .arg("--resolve")
        .arg(format!("{host}:{}:127.0.0.1", addr.port()))
        .args(extra);
    for u in urls {
        cmd.arg(format!("https://{host}:{}{u}", addr.port()));
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What `drover check -c` says of `toml`, written to `name` in `dir`; it must refuse it.
fn check_refuses(dir: &Path, name: &str, toml: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, toml).unwrap();
    let out = Command::new(bin())
        .args(["check", "-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success(), "{name} was taken");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A metric's value for the balancer `web`, with `labels` after `balancer="web"`.
async fn metric(admin: SocketAddr, name: &str, labels: &str) -> Option<f64> {
    let text = metrics_text(admin).await;
    let prefix = format!("{name}{{balancer=\"web\"{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.parse().unwrap())
}

/// Waits (10 s at most) until the metric of `metric` reads `want`; panics with the
/// metrics otherwise. A failed handshake is counted just after its connection closes,
/// so a client can see the close first.
async fn wait_metric(admin: SocketAddr, name: &str, labels: &str, want: f64) {
    let reached = drover_testkit::wait_until_async(Duration::from_secs(10), || async {
        metric(admin, name, labels).await == Some(want)
    })
    .await;
    assert!(
        reached,
        "{name}{labels} never read {want}:\n{}",
        metrics_text(admin).await
    );
}

/// A rustls client that trusts the test CA only. It never resumes a session: a
/// resumed one shows the certificate of the session it resumes, not the one served now.
fn client_config(ca: CertificateDer<'static>) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca).unwrap();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

async fn tls_connect(
    addr: SocketAddr,
    name: &str,
    config: &Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name.to_string()).unwrap();
    tokio_rustls::TlsConnector::from(Arc::clone(config))
        .connect(name, tcp)
        .await
}

/// The certificate the server presented on `s`.
fn served(s: &TlsStream<TcpStream>) -> Vec<u8> {
    s.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

/// A keep-alive GET on `s`: the status and body (the backend's answers carry a
/// Content-Length).
async fn get(s: &mut TlsStream<TcpStream>, path: &str) -> std::io::Result<(u16, String)> {
    let request = format!("GET {path} HTTP/1.1\r\nHost: a.test\r\n\r\n");
    s.write_all(request.as_bytes()).await?;
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::other("closed before the head"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_lowercase();
    let status = drover_testkit::parse_status(&buf).unwrap_or(0);
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map(|v| v.trim().parse().unwrap())
        .ok_or_else(|| std::io::Error::other(format!("no content-length: {head}")))?;
    while buf.len() < head_end + length {
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::Error::other("closed mid-body"));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    Ok((
        status,
        String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sni_picks_each_certificate_a_wildcard_covers_its_names_and_the_first_is_the_default() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tls-sni");
    let default = pki.leaf("default", "default.test", &["default.test"], far_future());
    let a = pki.leaf("a", "a.test", &["a.test"], (2090, 6, 1));
    let wild = pki.leaf("wild", "wild", &["*.w.test", "w.test"], far_future());
    let backend = Backend::start().await;
    let toml = config(backend.addr(), &tls_table(&[&default, &a, &wild]));
    let (d, web, admin, _) = start(&pki.dir, &toml).await;

    for (sni, cn) in [
        (Some("a.test"), "a.test"),
        (Some("A.TEST"), "a.test"),
        (Some("x.w.test"), "wild"),
        (Some("w.test"), "wild"),
        (Some("deep.x.w.test"), "default.test"),
        (Some("other.test"), "default.test"),
        (None, "default.test"),
    ] {
        let out = s_client(web, sni, &[]);
        assert_eq!(subject_cn(&out), cn, "SNI {sni:?}:\n{out}");
    }
    // An IP address as SNI is not a name (RFC 6066 §3), but wrk and Node send it: the
    // default certificate, and no log line per handshake.
    let script = format!(
        "const tls = require('tls'); let left = 3; for (let i = 0; i < 3; i++) {{ \
         const s = tls.connect({{ port: {}, host: '127.0.0.1', servername: '127.0.0.1', \
         rejectUnauthorized: false }}, () => {{ \
         console.log(s.getPeerCertificate().subject.CN); s.end(); \
         if (--left === 0) process.exit(0); }}); }}",
        web.port()
    );
    let out = Command::new("node").args(["-e", &script]).output().unwrap();
    let cns = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        cns.lines().collect::<Vec<_>>(),
        ["default.test"; 3],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !d.stderr_text().contains("Illegal SNI"),
        "{}",
        d.stderr_text()
    );
    // curl checks the name against the certificate it gets: each one verifies.
    for host in ["a.test", "x.w.test", "default.test"] {
        let (code, body, err) = curl(&pki, host, web, &["/"], &[]);
        assert_eq!(code, 0, "{host}: {err}");
        assert_eq!(body, backend.name(), "{host}");
        assert!(err.contains("ALPN: server accepted http/1.1"), "{err}");
    }
    // ALPN: h2 is chosen over http/1.1 (`http2` is on by default), and http/1.1 is
    // agreed with a client that offers it alone.
    let out = s_client(web, Some("a.test"), &["-alpn", "http/1.1,h2"]);
    assert!(out.contains("ALPN protocol: h2"), "{out}");
    let out = s_client(web, Some("a.test"), &["-alpn", "http/1.1"]);
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");

    // Each certificate's notAfter, as a gauge.
    let expiry = |file: &Path| {
        let file = file.display().to_string();
        async move {
            metric(
                admin,
                "drover_tls_certificate_expiry_seconds",
                &format!(",cert=\"{file}\""),
            )
            .await
        }
    };
    assert_eq!(expiry(&default.0).await, Some(4_102_444_800.0));
    // 2090-06-01T00:00:00Z
    assert_eq!(expiry(&a.0).await, Some(3_799_958_400.0));
    let handshakes = metric(admin, "drover_tls_handshakes_total", "")
        .await
        .unwrap();
    assert!(handshakes >= 10.0, "{handshakes}");
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_reaches_the_backend_as_https_over_keep_alive_with_large_bodies_and_websockets() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tls-forward");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    let (d, web, admin, _) = start(&pki.dir, &config(backend.addr(), &tls_table(&[&a]))).await;

    // Two requests, one connection, one handshake.
    let (code, body, err) = curl(&pki, "a.test", web, &["/headers", "/big/1000000"], &[]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("Re-using existing connection") || err.contains("Reusing existing"),
        "curl opened a second connection:\n{err}"
    );
    let head = body.to_lowercase();
    assert!(head.contains("x-forwarded-proto: https\r\n"), "{head}");
    assert!(head.contains(";proto=https\r\n"), "{head}");
    // The megabyte came whole, after the head the backend echoed.
    let big = body.len() - body.find("\r\n\r\n").unwrap() - 4;
    assert_eq!(big, 1_000_000, "the large body over TLS");
    assert_eq!(
        metric(admin, "drover_tls_handshakes_total", "").await,
        Some(1.0)
    );

    // An HTTP/1.0 client gets the chunked body decoded and ended by the close, which
    // comes with a close_notify: the client can tell the end from a cut.
    let client = client_config(pki.ca_der());
    let mut s = tls_connect(web, "a.test", &client).await.unwrap();
    s.write_all(b"GET /big/300000 HTTP/1.0\r\nHost: a.test\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    s.read_to_end(&mut answer)
        .await
        .expect("the close came with a close_notify");
    let body = answer.len() - answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap() - 4;
    assert_eq!(body, 300_000, "{}", String::from_utf8_lossy(&answer[..200]));

    // The same response cut short (the backend dies mid-body): no close_notify, so the
    // client sees a cut, not an end.
    let dying = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dying_addr = dying.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut c, _)) = dying.accept().await {
            let mut head = [0u8; 1024];
            let _ = c.read(&mut head).await;
            let partial = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n";
            let _ = c.write_all(partial).await;
        }
    });
    let cut = Pki::new("tls-forward-cut");
    let b = cut.leaf("b", "b.test", &["b.test"], far_future());
    let (d2, web2, _, _) = start(&cut.dir, &config(dying_addr, &tls_table(&[&b]))).await;
    let mut s = tls_connect(web2, "b.test", &client_config(cut.ca_der()))
        .await
        .unwrap();
    s.write_all(b"GET / HTTP/1.0\r\nHost: b.test\r\n\r\n")
        .await
        .unwrap();
    let mut answer = Vec::new();
    let end = s.read_to_end(&mut answer).await;
    assert!(
        String::from_utf8_lossy(&answer).ends_with("hello"),
        "{answer:?}"
    );
    assert_eq!(
        end.unwrap_err().kind(),
        std::io::ErrorKind::UnexpectedEof,
        "a cut response ended with a close_notify"
    );
    drop(d2);

    // A WebSocket over TLS: the upgrade, then frames both ways.
    let mut s = tls_connect(web, "a.test", &client).await.unwrap();
    let key = "dGhlIHNhbXBsZSBub25jZQ==";
    let upgrade = format!(
        "GET /ws HTTP/1.1\r\nHost: a.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: {key}\r\n\r\n"
    );
    s.write_all(upgrade.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        assert_eq!(
            s.read(&mut byte).await.unwrap(),
            1,
            "closed in the 101's head"
        );
        head.push(byte[0]);
    }
    assert_eq!(drover_testkit::parse_status(&head), Some(101));
    let accept = drover_testkit::ws_accept_key(key);
    assert!(
        String::from_utf8_lossy(&head).contains(&accept),
        "{}",
        String::from_utf8_lossy(&head)
    );
    for text in ["over tls", "and again"] {
        let frame = drover_testkit::ws_encode_frame(true, 0x1, text.as_bytes(), Some([1, 2, 3, 4]));
        s.write_all(&frame).await.unwrap();
        let mut echo = vec![0u8; 2 + text.len()];
        tokio::time::timeout(Duration::from_secs(10), s.read_exact(&mut echo))
            .await
            .expect("the echo in time")
            .unwrap();
        assert_eq!(echo[0], 0x81, "a final text frame");
        assert_eq!(&echo[2..], text.as_bytes());
    }
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_resume_by_ticket_with_tls_1_2_and_1_3_also_after_a_reload() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tls-resume");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    let (d, web, admin, path) = start(&pki.dir, &config(backend.addr(), &tls_table(&[&a]))).await;
    let ca = pki.ca_pem.to_str().unwrap().to_string();
    let session = |version: &str| pki.dir.join(format!("session-{version}.pem"));
    // TLS 1.3 sends its ticket after the handshake: a request with `Connection: close`
    // lets s_client read it, and drover's close ends s_client.
    let first = |version: &str| {
        let out_file = session(version);
        let mut cmd = Command::new("openssl");
        cmd.args([
            "s_client",
            "-connect",
            &web.to_string(),
            "-servername",
            "a.test",
        ])
        .args(["-CAfile", &ca, "-ign_eof", &format!("-{version}")])
        .arg("-sess_out")
        .arg(&out_file)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().unwrap();
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
            .unwrap();
        let out = child.wait_with_output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let again = |version: &str| {
        let session = session(version);
        s_client(
            web,
            Some("a.test"),
            &[
                "-CAfile",
                &ca,
                &format!("-{version}"),
                "-sess_in",
                session.to_str().unwrap(),
            ],
        )
    };
    for version in ["tls1_2", "tls1_3"] {
        let out = first(version);
        assert!(out.contains("New, TLSv1."), "{version}:\n{out}");
        assert!(
            out.contains("Verify return code: 0 (ok)"),
            "{version}:\n{out}"
        );
        assert!(out.contains("HTTP/1.1 200"), "{version}:\n{out}");
        let out = again(version);
        assert!(
            out.contains("Reused, TLSv1."),
            "{version}: not resumed:\n{out}"
        );
    }
    // A reload keeps the ticket key: the tickets issued before it still resume.
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}");
    let _ = path;
    for version in ["tls1_2", "tls1_3"] {
        let out = again(version);
        assert!(
            out.contains("Reused, TLSv1."),
            "{version}: not resumed after a reload:\n{out}"
        );
    }
    drop(d);
}

/// `openssl s_client -msg` through `addr` for `a.test` over TLS 1.3, sending one
/// request with `Connection: close` (so it reads what drover sends after the
/// handshake), saving the session to `out` or resuming the one in `resume`: whether it
/// resumed, and how many NewSessionTickets came.
fn tickets(
    addr: SocketAddr,
    ca: &Path,
    out: &Path,
    resume: Option<&Path>,
) -> (bool, usize, String) {
    let mut cmd = Command::new("openssl");
    cmd.args([
        "s_client",
        "-connect",
        &addr.to_string(),
        "-servername",
        "a.test",
    ])
    .arg("-CAfile")
    .arg(ca)
    .args(["-tls1_3", "-ign_eof", "-msg", "-sess_out"])
    .arg(out);
    if let Some(session) = resume {
        cmd.arg("-sess_in").arg(session);
    }
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let done = child.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&done.stdout).into_owned();
    let count = text
        .lines()
        .filter(|l| l.starts_with("<<<") && l.ends_with(", NewSessionTicket"))
        .count();
    (text.contains("Reused, TLSv1.3"), count, text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_tls_1_3_connection_gets_one_new_session_ticket() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tls-tickets");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    let (d, web, _admin, _path) = start(&pki.dir, &config(backend.addr(), &tls_table(&[&a]))).await;
    let (first, second) = (pki.dir.join("first.pem"), pki.dir.join("second.pem"));
    let per_connection = drover_proxy::tls::TLS13_TICKETS;
    let (resumed, count, text) = tickets(web, &pki.ca_pem, &first, None);
    assert!(!resumed && text.contains("HTTP/1.1 200"), "{text}");
    assert_eq!(count, per_connection, "a full handshake:\n{text}");
    // Each resumed connection gets one ticket, as from OpenSSL: enough for the next
    // resumption, one fewer for the client to take in than rustls's default of 2.
    for (from, to) in [(&first, &second), (&second, &first)] {
        let (resumed, count, text) = tickets(web, &pki.ca_pem, to, Some(from));
        assert!(resumed, "not resumed:\n{text}");
        assert!(text.contains("HTTP/1.1 200"), "{text}");
        assert_eq!(count, 1, "a resumed handshake:\n{text}");
    }
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_swaps_the_certificate_under_load_with_no_request_failed_and_a_bad_one_changes_nothing(
) {
    if !tools() {
        return;
    }
    let pki = Pki::new("tls-reload");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let first = std::fs::read(&a.0).unwrap();
    let backend = Backend::start().await;
    let (d, web, admin, _) = start(&pki.dir, &config(backend.addr(), &tls_table(&[&a]))).await;
    let config = client_config(pki.ca_der());
    let cert_der = |pem: &[u8]| {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_slice(pem).unwrap().to_vec()
    };

    // A connection from before the reload, used after it.
    let mut before = tls_connect(web, "a.test", &config).await.unwrap();
    assert_eq!(get(&mut before, "/").await.unwrap().0, 200);
    assert_eq!(served(&before), cert_der(&first));

    // Load: new connections (a handshake each) with three keep-alive requests on each.
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicUsize::new(0));
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (stop, ok, config) = (stop.clone(), ok.clone(), config.clone());
            tokio::spawn(async move {
                let mut failed = Vec::new();
                let mut certs = std::collections::BTreeSet::new();
                while !stop.load(Ordering::Relaxed) {
                    let mut s = match tls_connect(web, "a.test", &config).await {
                        Ok(s) => s,
                        Err(e) => {
                            failed.push(format!("handshake: {e}"));
                            continue;
                        }
                    };
                    certs.insert(served(&s));
                    for _ in 0..3 {
                        match get(&mut s, "/").await {
                            Ok((200, _)) => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            other => failed.push(format!("{other:?}")),
                        }
                    }
                }
                (failed, certs)
            })
        })
        .collect();
    let wait_served = |more: usize| {
        let ok = ok.clone();
        async move {
            let from = ok.load(Ordering::Relaxed);
            assert!(
                drover_testkit::wait_until(Duration::from_secs(20), || {
                    ok.load(Ordering::Relaxed) >= from + more
                })
                .await,
                "the load stalled"
            );
        }
    };
    wait_served(100).await;

    // The same name, a new key and certificate, in the same files.
    let renewed = pki.leaf("renewed", "a.test", &["a.test"], (2099, 1, 1));
    std::fs::copy(&renewed.0, &a.0).unwrap();
    std::fs::copy(&renewed.1, &a.1).unwrap();
    let second = std::fs::read(&a.0).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    // It says so, to the one who asked and in drover's output: before, the reply said
    // "no balancer changed" and the log said nothing (HTTPS edge seat).
    assert!(out.contains("certificates read again: web"), "{out}");
    let logged = d
        .wait_for_line(
            "drover: reload asked through the admin API",
            Duration::from_secs(10),
        )
        .await
        .is_some()
        && d.wait_for_line("certificates read again: web", Duration::from_secs(10))
            .await
            .is_some();
    assert!(logged, "{}", d.stderr_text());
    let fresh = tls_connect(web, "a.test", &config).await.unwrap();
    assert_eq!(
        served(&fresh),
        cert_der(&second),
        "a new connection after the reload"
    );
    assert_eq!(
        metric(
            admin,
            "drover_tls_certificate_expiry_seconds",
            &format!(",cert=\"{}\"", a.0.display())
        )
        .await,
        Some(4_070_908_800.0),
        "the renewed certificate's notAfter (2099-01-01)"
    );
    wait_served(100).await;
    // The connection from before the reload still serves.
    assert_eq!(get(&mut before, "/").await.unwrap().0, 200);

    // A bad file: the reload is refused, names it, and the renewed certificate serves on.
    std::fs::write(&a.0, "not a certificate\n").unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_ne!(code, 0, "{out}");
    let shown = format!("{out}{err}");
    assert!(shown.contains(&a.0.display().to_string()), "{shown}");
    assert!(shown.contains("is not PEM"), "{shown}");
    assert!(shown.contains("balancer[0].tls.certs[0].cert"), "{shown}");
    assert!(shown.contains("nothing was reloaded"), "{shown}");
    wait_served(50).await;
    let after = tls_connect(web, "a.test", &config).await.unwrap();
    assert_eq!(
        served(&after),
        cert_der(&second),
        "the refused reload changed it"
    );

    stop.store(true, Ordering::Relaxed);
    let (mut failed, mut certs) = (Vec::new(), std::collections::BTreeSet::new());
    for l in load {
        let (f, c) = l.await.unwrap();
        failed.extend(f);
        certs.extend(c);
    }
    let served_total = ok.load(Ordering::Relaxed);
    assert!(
        failed.is_empty(),
        "{} of {} requests failed across the reloads: {:?}",
        failed.len(),
        served_total + failed.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(certs.contains(&cert_der(&first)) && certs.contains(&cert_der(&second)));
    eprintln!("a certificate swapped and a bad one refused under load: {served_total} requests, none failed");
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drover_check_and_a_start_name_each_bad_file_and_why() {
    let pki = Pki::new("tls-check");
    let good = pki.leaf("good", "good.test", &["good.test"], far_future());
    let other = pki.leaf("other", "other.test", &["other.test"], far_future());
    let not_pem = pki.dir.join("not.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    let missing = pki.dir.join("missing.pem");
    let cases = [
        (
            (not_pem.clone(), good.1.clone()),
            "cert",
            &not_pem,
            "is not PEM",
        ),
        (
            (missing.clone(), good.1.clone()),
            "cert",
            &missing,
            "cannot read",
        ),
        (
            (good.0.clone(), other.1.clone()),
            "key",
            &other.1,
            "is not the private key of the certificate in",
        ),
    ];
    let mut toml = String::new();
    for (i, (pair, _, _, _)) in cases.iter().enumerate() {
        toml += &format!(
            "[[balancer]]\nname = \"b{i}\"\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9\"]\n{}\n",
            tls_table(&[pair])
        );
    }
    let path = pki.dir.join("bad.toml");
    std::fs::write(&path, &toml).unwrap();
    let out = Command::new(bin())
        .args(["check", "-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for (i, (_, part, file, why)) in cases.iter().enumerate() {
        // Balancer i's table is lines 6i+1 to 6i+6; `tls` is its fifth.
        let at = format!("{}:{}:", path.display(), 6 * i + 5);
        let line = text
            .lines()
            .find(|l| l.contains(&format!("balancer[{i}].tls.certs[0].{part}:")))
            .unwrap_or_else(|| panic!("no error for balancer {i} in:\n{text}"));
        assert!(line.contains(&at), "{line} is not at {at}");
        assert!(line.contains(&file.display().to_string()), "{line}");
        assert!(line.contains(why), "{line} lacks {why:?}");
    }

    // A start refuses the file the same way, and so do the flags, naming the flag.
    let out = Command::new(bin())
        .args(["proxy", "--config", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        text.contains("balancer[0].tls.certs[0].cert") && text.contains("is not PEM"),
        "{text}"
    );
    let out = Command::new(bin())
        .args([
            "proxy",
            "-l",
            "127.0.0.1:0",
            "-b",
            "127.0.0.1:9",
            "--tls-cert",
        ])
        .arg(&good.0)
        .arg("--tls-key")
        .arg(&other.1)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        text.contains("--tls-key: balancer \"default\": tls:"),
        "{text}"
    );
    assert!(text.contains("is not the private key"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_handshakes_are_cut_by_the_header_timeout_and_plain_http_gets_a_400() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tls-stall");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    let extra = format!(
        "timeouts = {{ header_read = \"1s\" }}\n{}",
        tls_table(&[&a])
    );
    let (_d, web, admin, _) = start(&pki.dir, &config(backend.addr(), &extra)).await;

    // Silent after connecting, and silent after the first bytes of a ClientHello.
    for sent in [&b""[..], &[0x16, 0x03, 0x01][..]] {
        let mut s = TcpStream::connect(web).await.unwrap();
        s.write_all(sent).await.unwrap();
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(15), s.read(&mut buf))
            .await
            .expect("drover cut the stalled handshake");
        assert!(matches!(closed, Ok(0) | Err(_)), "{closed:?}");
    }
    let failures = "drover_tls_handshake_failures_total";
    wait_metric(admin, failures, ",reason=\"timeout\"", 2.0).await;

    // Plain HTTP to the TLS port: a 400 that says so.
    let answer = drover_testkit::raw_exchange(
        web,
        b"GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    assert_eq!(drover_testkit::parse_status(&answer), Some(400));
    let text = String::from_utf8_lossy(&answer);
    assert!(text.contains("drover-error: plain-http-to-tls"), "{text}");
    assert!(text.contains("use https://"), "{text}");
    wait_metric(admin, failures, ",reason=\"not-tls\"", 1.0).await;

    // A client that does not trust the certificate ends the handshake with an alert.
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "--resolve"])
        .arg(format!("a.test:{}:127.0.0.1", web.port()))
        .arg(format!("https://a.test:{}/", web.port()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    wait_metric(admin, failures, ",reason=\"client-alert\"", 1.0).await;
    // An alert record alone is TLS, not plain text (it was counted `not-tls`); a
    // handshake record that holds no ClientHello is a protocol error.
    for (sent, reason, count) in [
        (
            &[0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x28][..],
            "client-alert",
            2.0,
        ),
        (
            &[
                0x16, 0x03, 0x01, 0x00, 0x05, 0x68, 0x69, 0x68, 0x69, 0x68, 0x69,
            ][..],
            "protocol",
            1.0,
        ),
    ] {
        let mut s = TcpStream::connect(web).await.unwrap();
        s.write_all(sent).await.unwrap();
        let mut buf = [0u8; 64];
        let _ = tokio::time::timeout(Duration::from_secs(15), s.read(&mut buf)).await;
        wait_metric(admin, failures, &format!(",reason=\"{reason}\""), count).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flags_serve_tls_and_a_reload_without_a_file_reads_the_certificates_again() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tls-flags");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    let d = DroverProcess::spawn(
        bin(),
        &[
            "proxy",
            "-l",
            "127.0.0.1:0",
            "--threads",
            "1",
            "-b",
            &backend.addr().to_string(),
            "--admin",
            "127.0.0.1:0",
            "--tls-cert",
            a.0.to_str().unwrap(),
            "--tls-key",
            a.1.to_str().unwrap(),
        ],
    )
    .await;
    let admin = admin_addr(&d).await;
    let web = d.addr();
    let config = client_config(pki.ca_der());
    let s = tls_connect(web, "a.test", &config).await.unwrap();
    let first = served(&s);

    let renewed = pki.leaf("renewed", "a.test", &["a.test"], far_future());
    std::fs::copy(&renewed.0, &a.0).unwrap();
    std::fs::copy(&renewed.1, &a.1).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("certificates read again: default"), "{out}");
    let mut s = tls_connect(web, "a.test", &config).await.unwrap();
    let second = served(&s);
    assert_ne!(second, first, "the reload did not swap the certificate");
    assert_eq!(get(&mut s, "/").await.unwrap().0, 200);

    std::fs::copy(&renewed.0, &a.1).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_ne!(code, 0, "{out}");
    let shown = format!("{out}{err}");
    assert!(
        shown.contains("no PRIVATE KEY section") && shown.contains(&a.1.display().to_string()),
        "{shown}"
    );
    let s = tls_connect(web, "a.test", &config).await.unwrap();
    assert_eq!(
        served(&s),
        second,
        "the refused reload changed the certificate"
    );
    drop(d);
}

/// A stream that sends `prefix` in one write with the first bytes written to it: a
/// PROXY protocol header and the ClientHello in one segment, as a balancer in front may
/// send them (drover then reads both at once, and the handshake must start from the
/// bytes after the header).
struct Prefixed {
    inner: TcpStream,
    prefix: Vec<u8>,
    pending: Vec<u8>,
}

impl Prefixed {
    fn poll_pending(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        while !self.pending.is_empty() {
            let n = std::task::ready!(
                std::pin::Pin::new(&mut self.inner).poll_write(cx, &self.pending)
            )?;
            self.pending.drain(..n);
        }
        std::task::Poll::Ready(Ok(()))
    }
}

impl tokio::io::AsyncRead for Prefixed {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            this.pending = std::mem::take(&mut this.prefix);
            this.pending.extend_from_slice(buf);
            // Taken whole; what the socket does not take now goes at the next flush.
            if let std::task::Poll::Ready(Err(e)) = this.poll_pending(cx) {
                return std::task::Poll::Ready(Err(e));
            }
            return std::task::Poll::Ready(Ok(buf.len()));
        }
        std::task::ready!(this.poll_pending(cx))?;
        std::pin::Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_pending(cx))?;
        std::pin::Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_pending(cx))?;
        std::pin::Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_behind_a_proxy_protocol_sender_starts_after_the_header() {
    let pki = Pki::new("tls-proxy-protocol");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    let extra = format!(
        "proxy_protocol = {{ trusted = [\"127.0.0.1\"] }}\n{}",
        tls_table(&[&a])
    );
    let (d, web, _, _) = start(&pki.dir, &config(backend.addr(), &extra)).await;
    let config = client_config(pki.ca_der());
    let header = b"PROXY TCP4 203.0.113.7 127.0.0.1 5555 443\r\n".to_vec();
    let name = ServerName::try_from("a.test").unwrap();
    for same_segment in [true, false] {
        let mut tcp = TcpStream::connect(web).await.unwrap();
        let prefix = if same_segment {
            header.clone()
        } else {
            tcp.write_all(&header).await.unwrap();
            Vec::new()
        };
        let stream = Prefixed {
            inner: tcp,
            prefix,
            pending: Vec::new(),
        };
        let mut s = tokio_rustls::TlsConnector::from(config.clone())
            .connect(name.clone(), stream)
            .await
            .unwrap_or_else(|e| panic!("same segment {same_segment}: {e}\n{}", d.stderr_text()));
        s.write_all(b"GET /headers HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = Vec::new();
        // Ended by drover's close_notify: no error.
        s.read_to_end(&mut answer).await.unwrap();
        let text = String::from_utf8_lossy(&answer).to_lowercase();
        assert!(text.starts_with("http/1.1 200"), "{text}");
        assert!(text.contains("x-forwarded-for: 203.0.113.7\r\n"), "{text}");
        assert!(text.contains("x-forwarded-proto: https\r\n"), "{text}");
    }
    drop(d);
}

/// Moves `renewed`'s files over `served`'s, a renewal tool's way, and waits until a
/// handshake for a.test at `web` gets the renewed certificate, which it returns.
async fn renew(
    d: &DroverProcess,
    web: SocketAddr,
    config: &Arc<rustls::ClientConfig>,
    renewed: &(PathBuf, PathBuf),
    served_files: &(PathBuf, PathBuf),
) -> Vec<u8> {
    let renewed_der = {
        use rustls::pki_types::pem::PemObject;
        CertificateDer::from_pem_file(&renewed.0).unwrap().to_vec()
    };
    std::fs::rename(&renewed.0, &served_files.0).unwrap();
    std::fs::rename(&renewed.1, &served_files.1).unwrap();
    let swapped = drover_testkit::wait_until_async(Duration::from_secs(20), || async {
        served(&tls_connect(web, "a.test", config).await.unwrap()) == renewed_der
    })
    .await;
    assert!(
        swapped,
        "the renewed files were never served\n{}",
        d.stderr_text()
    );
    renewed_der
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewed_files_are_served_without_a_reload_and_a_bad_renewal_changes_nothing() {
    let pki = Pki::new("tls-watch");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    let (d, web, admin, _) = start(&pki.dir, &config(backend.addr(), &tls_table(&[&a]))).await;
    let config = client_config(pki.ca_der());
    let serving = || async {
        let s = tls_connect(web, "a.test", &config).await.unwrap();
        served(&s)
    };

    // A renewal tool's way: the new files moved over the old ones.
    let renewed = pki.leaf("renewed", "a.test", &["a.test"], (2099, 1, 1));
    let renewed_der = renew(&d, web, &config, &renewed, &a).await;
    wait_metric(
        admin,
        "drover_tls_certificate_expiry_seconds",
        &format!(",cert=\"{}\"", a.0.display()),
        4_070_908_800.0,
    )
    .await;

    // A renewal that went wrong: logged with the file and why, the last good one serves.
    let bad = pki.dir.join("bad.pem");
    std::fs::write(&bad, "not a certificate\n").unwrap();
    std::fs::rename(&bad, &a.0).unwrap();
    let line = d
        .wait_for_line("cannot be used", Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("no error logged\n{}", d.stderr_text()));
    assert!(
        line.contains(&a.0.display().to_string()) && line.contains("is not PEM"),
        "{line}"
    );
    assert_eq!(
        serving().await,
        renewed_der,
        "a bad renewal changed the certificate"
    );
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_certificate_is_served_with_an_error_and_blocks_no_other_certificate() {
    let pki = Pki::new("tls-expired");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let old = pki.leaf("old", "old.test", &["old.test"], (2001, 1, 1));
    let backend = Backend::start().await;
    let toml = config(backend.addr(), &tls_table(&[&a, &old]));

    // drover check passes, with a warning; a start serves, and logs an error.
    let path = pki.dir.join("check.toml");
    std::fs::write(&path, &toml).unwrap();
    let out = Command::new(bin())
        .args(["check", "-c", path.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with("warning:")
            && l.contains(&old.0.display().to_string())
            && l.contains("expired on Jan  1 00:00:00 2001")),
        "{text}"
    );
    let (d, web, admin, path) = start(&pki.dir, &toml).await;
    let line = d
        .wait_for_line("the TLS certificate expired on", Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("no error at start\n{}", d.stderr_text()));
    assert!(line.contains("ERROR") && line.contains("old.pem"), "{line}");
    let config = client_config(pki.ca_der());
    let refused = tls_connect(web, "old.test", &config).await.unwrap_err();
    assert!(
        refused.to_string().to_lowercase().contains("expired"),
        "{refused}"
    );
    let serving = || async {
        let s = tls_connect(web, "a.test", &config).await.unwrap();
        served(&s)
    };

    // a.test renewed beside the expired one: served.
    let renewed = pki.leaf("renewed", "a.test", &["a.test"], (2099, 1, 1));
    let renewed = renew(&d, web, &config, &renewed, &a).await;

    // An expired copy put back over a valid one changes nothing: by the watch, nor by a
    // reload, which applies the rest of the file.
    let stale = pki.leaf("stale", "a.test", &["a.test"], (2002, 1, 1));
    std::fs::rename(&stale.0, &a.0).unwrap();
    std::fs::rename(&stale.1, &a.1).unwrap();
    let line = d
        .wait_for_line("cannot be used", Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("no error logged\n{}", d.stderr_text()));
    assert!(
        line.contains(&a.0.display().to_string())
            && line.contains("expired on Jan  1 00:00:00 2002"),
        "{line}"
    );
    assert_eq!(serving().await, renewed, "an expired renewal was served");
    let extra =
        "[[balancer]]\nname = \"extra\"\nlisten = \"127.0.0.1:0\"\nbackends = [\"127.0.0.1:9\"]\n";
    std::fs::write(&path, format!("{toml}{extra}")).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        !d.addrs_after("balancer \"extra\" listening on ").is_empty(),
        "the rest of the reload was not applied\n{}",
        d.stderr_text()
    );
    let line = d
        .wait_for_line("not changed by the reload", Duration::from_secs(20))
        .await
        .unwrap_or_else(|| panic!("no error logged\n{}", d.stderr_text()));
    assert!(line.contains("expired on Jan  1 00:00:00 2002"), "{line}");
    assert_eq!(serving().await, renewed, "an expired renewal was served");
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drover_run_serves_tls_and_hands_no_tls_connection_to_a_worker() {
    const CONNECTIONS: usize = 16;
    let pki = Pki::new("tls-run");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let app = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/node_as_written/conns.js");
    // `handoff` hands every plain connection to a worker at accept and between requests:
    // a TLS one's session is drover's, and it must stay.
    let mut cmd = Command::new(bin());
    cmd.args([
        "run",
        "-w",
        "2",
        "--mode",
        "handoff",
        "--listen",
        "127.0.0.1:0",
    ])
    .args(["--admin", "127.0.0.1:0", "--threads", "1", "--tls-cert"])
    .arg(&a.0)
    .arg("--tls-key")
    .arg(&a.1)
    .arg("--")
    .arg("node")
    .arg(&app);
    common::examples::clean_env(&mut cmd);
    let d = drover_testkit::spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    common::wait_all_serving(&d, admin).await;
    let client = client_config(pki.ca_der());
    let mut pids = std::collections::BTreeSet::new();
    // Light traffic: each connection's first request goes to the idle worker whose turn
    // it is, and its next ones stay there. (When idle workers were drawn at random, 6
    // connections all drew the same worker about once in 32 runs; 16 connections keep
    // this test from leaning on the order of turns.)
    for _ in 0..CONNECTIONS {
        let mut s = tls_connect(d.addr(), "a.test", &client).await.unwrap();
        for _ in 0..5 {
            let (status, body) = get(&mut s, "/").await.unwrap();
            assert_eq!(status, 200, "{body}");
            let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
            pids.insert(answer["pid"].as_u64().unwrap());
        }
    }
    assert_eq!(
        pids.len(),
        2,
        "drover placed the requests on both workers: {pids:?}"
    );
    assert_eq!(
        common::default_metric(admin, "drover_handoffs_total").await,
        0
    );
    assert_eq!(
        common::default_metric(admin, "drover_tls_handshakes_total").await,
        CONNECTIONS as u64
    );
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_expiring_within_14_days_is_warned_of_by_check_and_at_start() {
    if !tools() {
        return;
    }
    let dir = temp_dir("tls-expiring");
    let (cert, key) = (dir.join("soon.pem"), dir.join("soon.key"));
    // Five days from now: the openssl CLI counts days from today, rcgen only dates.
    self_signed(
        &cert,
        &key,
        &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"],
        &["-days", "5", "-subj", "/CN=soon.test"],
    );
    let backend = Backend::start().await;
    let toml = config(backend.addr(), &tls_table(&[&(cert.clone(), key)]));
    std::fs::write(dir.join("check.toml"), &toml).unwrap();
    let out = Command::new(bin())
        .args(["check", "-c"])
        .arg(dir.join("check.toml"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "a certificate still valid fails check: {stderr}"
    );
    let warning = stderr
        .lines()
        .find(|l| l.starts_with("warning: ") && l.contains("expires on"))
        .unwrap_or_else(|| panic!("no warning:\n{stderr}"));
    assert!(warning.contains(&cert.display().to_string()), "{warning}");

    let (d, _, _, _) = start(&dir, &toml).await;
    let line = d
        .wait_for_line("the TLS certificate expires on", Duration::from_secs(5))
        .await
        .unwrap_or_else(|| panic!("no warning at start\n{}", d.stderr_text()));
    assert!(line.contains("WARN") && line.contains("soon.pem"), "{line}");
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_balancer_redirects_every_request_to_https() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tls-redirect");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    let https = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // certbot's webroot beside the redirect, as nginx's `location
    // /.well-known/acme-challenge/` beside `return 301`: proxied, the rest redirected.
    let acme = format!(
        "routes = [{{ path_prefix = \"/.well-known/acme-challenge/\", balancer = \"acme\" }}]\n\n[[balancer]]\nname = \"acme\"\nbackends = [\"{}\"]\n",
        backend.addr()
    );
    let toml = format!(
        "{}\n[[balancer]]\nname = \"http\"\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = []\nredirect_to_https = {}\n{acme}",
        config(backend.addr(), &tls_table(&[&a])).replacen(
            "listen = \"127.0.0.1:0\"\nthreads",
            &format!("listen = \"{https}\"\nthreads"),
            1
        ),
        https.port()
    );
    let (d, web, admin, _) = start(&pki.dir, &toml).await;
    assert_eq!(web, https);
    let http = *d
        .addrs_after("balancer \"http\" listening on ")
        .first()
        .unwrap();

    // The answer, as it is.
    let answer = drover_testkit::raw_exchange(
        http,
        b"GET /headers?x=1 HTTP/1.1\r\nHost: a.test:80\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 308 "), "{text}");
    let location = format!("location: https://a.test:{}/headers?x=1\r\n", https.port());
    assert!(text.contains(&location), "{text}");

    // Followed by curl, over keep-alive to the plain port, to the backend over HTTPS.
    let out = Command::new("curl")
        .args(["-sS", "-L", "--max-time", "20", "--cacert"])
        .arg(&pki.ca_pem)
        .arg("--resolve")
        .arg(format!("a.test:{}:127.0.0.1", https.port()))
        .arg("--resolve")
        .arg(format!("a.test:{}:127.0.0.1", http.port()))
        .arg(format!("http://a.test:{}/headers?x=1", http.port()))
        .output()
        .unwrap();
    let body = String::from_utf8_lossy(&out.stdout).to_lowercase();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(body.starts_with("get /headers?x=1 http/1.1"), "{body}");
    assert!(body.contains("x-forwarded-proto: https"), "{body}");

    // A request with a body: redirected (308 keeps the method), and the connection closes.
    let answer = drover_testkit::raw_exchange(
        http,
        b"POST /form HTTP/1.1\r\nHost: a.test\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 308 "), "{text}");
    assert!(text.contains("connection: close\r\n"), "{text}");
    // HTTP/1.0 without Host: to the address the client reached (nginx's `$host` falls
    // back to the server's name).
    let answer = drover_testkit::raw_exchange(http, b"GET /a HTTP/1.0\r\n\r\n")
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    let location = format!("location: https://127.0.0.1:{}/a\r\n", https.port());
    assert!(
        text.starts_with("HTTP/1.1 308 ") && text.contains(&location),
        "{text}"
    );
    assert_eq!(
        backend.hits(),
        1,
        "only the followed request reached the backend"
    );
    let answer = drover_testkit::raw_exchange(
        http,
        b"GET /.well-known/acme-challenge/t0ken HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 200 "), "{text}");
    assert_eq!(backend.hits(), 2, "the challenge reached the backend");
    let redirected = metrics_text(admin)
        .await
        .lines()
        .any(|l| l == "drover_responses_total{balancer=\"http\",code=\"3xx\"} 4");
    assert!(redirected, "{}", metrics_text(admin).await);
    drop(d);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_gets_all_of_a_large_response_on_a_kept_connection() {
    let pki = Pki::new("tls-slow-reader");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    let (d, web, _, _) = start(&pki.dir, &config(backend.addr(), &tls_table(&[&a]))).await;
    let mut s = tls_connect(web, "a.test", &client_config(pki.ca_der()))
        .await
        .unwrap();
    // Kept alive, so nothing but drover's own flush sends the response's last bytes:
    // what TLS took while the socket was full must still go out once it drains.
    s.write_all(b"GET /big/24000000 HTTP/1.1\r\nHost: a.test\r\n\r\n")
        .await
        .unwrap();
    // The socket and drover's buffers fill while the client reads nothing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(30), async {
        let mut chunk = vec![0u8; 16 * 1024];
        while !got.ends_with(b"\r\n0\r\n\r\n") {
            let n = s.read(&mut chunk).await?;
            if n == 0 {
                return Err(std::io::Error::other("closed"));
            }
            got.extend_from_slice(&chunk[..n]);
            // A slow reader: 16 KiB a millisecond at most.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    })
    .await;
    assert!(
        matches!(read, Ok(Ok(()))),
        "{read:?} after {} bytes",
        got.len()
    );
    // The connection serves another request after it.
    assert_eq!(get(&mut s, "/").await.unwrap().0, 200);
    drop(d);
}

/// Runs `openssl` with `args` in `dir`; its stderr on failure.
fn openssl_in(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rsa_and_ecdsa_keys_load_as_pkcs1_pkcs8_and_sec1() {
    if !tools() {
        return;
    }
    let dir = temp_dir("tls-key-formats");
    let openssl = |args: &[&str]| openssl_in(&dir, args);
    // RSA: PKCS#8 as made, PKCS#1 ("BEGIN RSA PRIVATE KEY") converted; ECDSA: SEC1 ("BEGIN
    // EC PRIVATE KEY", after an EC PARAMETERS section), as `openssl ecparam` writes it.
    let named = |cn: &str| [format!("/CN={cn}"), format!("subjectAltName=DNS:{cn}")];
    let [subj, san] = named("rsa.test");
    openssl(&[
        "genpkey",
        "-algorithm",
        "RSA",
        "-pkeyopt",
        "rsa_keygen_bits:2048",
        "-out",
        "rsa8.key",
    ]);
    openssl(&[
        "req", "-x509", "-key", "rsa8.key", "-out", "rsa.pem", "-days", "30", "-subj", &subj,
        "-addext", &san,
    ]);
    openssl(&["rsa", "-in", "rsa8.key", "-traditional", "-out", "rsa1.key"]);
    openssl(&[
        "ecparam",
        "-genkey",
        "-name",
        "prime256v1",
        "-out",
        "ec.key",
    ]);
    let [subj, san] = named("ec.test");
    openssl(&[
        "req", "-new", "-x509", "-key", "ec.key", "-out", "ec.pem", "-days", "30", "-subj", &subj,
        "-addext", &san,
    ]);
    let f = |name: &str| dir.join(name);
    let backend = Backend::start().await;
    let toml = config(
        backend.addr(),
        &tls_table(&[
            &(f("rsa.pem"), f("rsa1.key")),
            &(f("ec.pem"), f("ec.key")),
            &(f("rsa.pem"), f("rsa8.key")),
        ]),
    );
    let (d, web, _, _) = start(&dir, &toml).await;
    for (sni, signature) in [("rsa.test", "RSA-PSS"), ("ec.test", "ECDSA")] {
        let out = s_client(web, Some(sni), &[]);
        assert!(
            out.contains(&format!("Peer signature type: {signature}")),
            "{sni}:\n{out}"
        );
    }
    drop(d);
}

/// An RSA and an ECDSA certificate for one name, as nginx's two `ssl_certificate`
/// lines: each client gets one it can use, the first listed when it can use both.
/// Before, only the first listed was ever served, and a client that takes the other
/// algorithm alone failed its handshake (alert 40).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rsa_and_an_ecdsa_certificate_for_one_name_each_serve_the_clients_that_take_it() {
    if !tools() {
        return;
    }
    let dir = temp_dir("tls-rsa-and-ecdsa");
    let openssl = |args: &[&str]| openssl_in(&dir, args);
    let make = |file: &str, cn: &str, rsa: bool| {
        let key = format!("{file}.key");
        if rsa {
            openssl(&[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
                &key,
            ]);
        } else {
            openssl(&[
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
                &key,
            ]);
        }
        let (subj, san) = (format!("/CN={cn}"), format!("subjectAltName=DNS:{cn}"));
        let pem = format!("{file}.pem");
        openssl(&[
            "req", "-x509", "-key", &key, "-out", &pem, "-days", "30", "-subj", &subj, "-addext",
            &san,
        ]);
        (dir.join(pem), dir.join(key))
    };
    // both.test: RSA first, also the default; rev.test: ECDSA first.
    let pairs = [
        make("rsa-both", "both.test", true),
        make("ec-both", "both.test", false),
        make("ec-rev", "rev.test", false),
        make("rsa-rev", "rev.test", true),
    ];
    let backend = Backend::start().await;
    let toml = config(
        backend.addr(),
        &tls_table(&pairs.iter().collect::<Vec<_>>()),
    );
    let (d, web, _, _) = start(&dir, &toml).await;
    let ecdsa_only_1_2 = ["-tls1_2", "-cipher", "ECDHE-ECDSA-AES128-GCM-SHA256"];
    let rsa_only_1_2 = ["-tls1_2", "-cipher", "ECDHE-RSA-AES128-GCM-SHA256"];
    let cases: [(Option<&str>, &[&str], &str); 7] = [
        (Some("both.test"), &[], "RSA-PSS"),
        (Some("both.test"), &ecdsa_only_1_2, "ECDSA"),
        (
            Some("both.test"),
            &["-tls1_3", "-sigalgs", "ECDSA+SHA256"],
            "ECDSA",
        ),
        (None, &ecdsa_only_1_2, "ECDSA"),
        (Some("rev.test"), &[], "ECDSA"),
        (Some("rev.test"), &rsa_only_1_2, "RSA-PSS"),
        (
            Some("rev.test"),
            &["-tls1_3", "-sigalgs", "rsa_pss_rsae_sha256"],
            "RSA-PSS",
        ),
    ];
    for (sni, args, signature) in cases {
        let out = s_client(web, sni, args);
        let line = out
            .lines()
            .find(|l| l.starts_with("Peer signature type: "))
            .unwrap_or_else(|| panic!("{sni:?} {args:?}: no handshake:\n{out}"));
        assert_eq!(
            line,
            format!("Peer signature type: {signature}"),
            "{sni:?} {args:?}"
        );
    }
    drop(d);
}

/// The binary's wiring of HTTP/2 (the data plane's own tests are in-process, in
/// crates/drover-proxy/tests/http2.rs): `drover proxy --h2c` serves cleartext HTTP/2 to
/// a client with prior knowledge and HTTP/1.1 to the others on one port, and
/// `http2 = false` in a drover.toml leaves h2 out of ALPN.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_by_flag_and_http2_off_by_file() {
    if !tools() {
        return;
    }
    let backend = Backend::start().await;
    let d = DroverProcess::spawn(
        bin(),
        &[
            "proxy",
            "-l",
            "127.0.0.1:0",
            "--threads",
            "1",
            "-b",
            &backend.addr().to_string(),
            "--h2c",
        ],
    )
    .await;
    let url = format!("http://{}/", d.addr());
    let version = |flags: &[&str]| {
        let out = Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "20",
                "-o",
                "/dev/null",
                "-w",
                "%{http_version} %{http_code}",
            ])
            .args(flags)
            .arg(&url)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert_eq!(version(&["--http2-prior-knowledge"]), "2 200");
    assert_eq!(version(&["--http1.1"]), "1.1 200");
    // curl's `--http2` on http:// asks to upgrade (`Upgrade: h2c`), which RFC 9113
    // deprecates and nginx ignores: the request is answered over HTTP/1.1, with its
    // body, and the backend never sees the upgrade (a WebSocket server answered it 400,
    // and one with a body was refused by drover itself).
    assert_eq!(version(&["--http2"]), "1.1 200");
    assert_eq!(version(&["--http2", "-d", "hello"]), "1.1 200");
    assert_eq!(backend.hits(), 4);
    drop(d);

    let pki = Pki::new("tls-http2-off");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let toml = config(
        backend.addr(),
        &format!("{}http2 = false\n", tls_table(&[&a])),
    );
    let (_d, web, _, _) = start(&pki.dir, &toml).await;
    let out = s_client(web, Some("a.test"), &["-alpn", "h2,http/1.1"]);
    assert!(out.contains("ALPN protocol: http/1.1"), "{out}");
    let out = s_client(web, Some("a.test"), &["-alpn", "http/1.0"]);
    assert!(out.contains("ALPN protocol: http/1.0"), "{out}");
}

/// `min_version = "1.3"` (nginx's `ssl_protocols TLSv1.3`, HAProxy's `ssl-min-ver`)
/// refuses a client that offers only TLS 1.2, and serves 1.3; the flag does the same,
/// and a version drover cannot take is refused by name. Before, the key was unknown:
/// a "TLS 1.3 only" policy could not be set (edge seat).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minimum_tls_version_refuses_older_clients() {
    let pki = Pki::new("tls-min-version");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    let table = tls_table(&[&a]).replacen("tls = {", "tls = { min_version = \"1.3\",", 1);
    assert!(table.contains("min_version"), "{table}");
    let (d, web, _, _) = start(&pki.dir, &config(backend.addr(), &table)).await;
    let out = s_client(web, Some("a.test"), &["-tls1_2"]);
    assert!(
        out.contains("alert protocol version") || !out.contains("New, TLSv1.2"),
        "{out}"
    );
    assert!(!out.contains("New, TLSv1.2"), "{out}");
    let out = s_client(web, Some("a.test"), &["-tls1_3"]);
    assert!(out.contains("New, TLSv1.3"), "{out}");
    drop(d);
    // The default takes both.
    let (d, web, _, _) = start(&pki.dir, &config(backend.addr(), &tls_table(&[&a]))).await;
    assert!(s_client(web, Some("a.test"), &["-tls1_2"]).contains("New, TLSv1.2"));
    drop(d);
    // Bad values, named.
    let bad = tls_table(&[&a]).replacen("tls = {", "tls = { min_version = \"1.1\",", 1);
    let err = check_refuses(&pki.dir, "bad-min.toml", &config(backend.addr(), &bad));
    assert!(
        err.contains("tls.min_version") && err.contains("TLS 1.0 and 1.1 are not offered"),
        "{err}"
    );
    let out = Command::new(bin())
        .args([
            "proxy",
            "-l",
            "127.0.0.1:0",
            "-b",
            &backend.addr().to_string(),
        ])
        .args([
            "--tls-cert",
            a.0.to_str().unwrap(),
            "--tls-key",
            a.1.to_str().unwrap(),
        ])
        .args(["--tls-min-version", "1.4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--tls-min-version") && err.contains("expected 1.2 or 1.3"),
        "{err}"
    );
}

/// An HTTP/1.0 client that names `http/1.0` in its handshake (`curl -0`, health probes
/// written so) is served, with HTTP/2 on as off: drover offered only `h2` and
/// `http/1.1`, so the handshake ended with alert 120 (no application protocol), where
/// nginx answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_1_0_client_that_names_it_in_alpn_is_served() {
    let pki = Pki::new("tls-http10-alpn");
    let a = pki.leaf("a", "a.test", &["a.test"], far_future());
    let backend = Backend::start().await;
    for extra in ["", "http2 = false\n"] {
        let toml = config(backend.addr(), &format!("{}{extra}", tls_table(&[&a])));
        let (d, web, _, _) = start(&pki.dir, &toml).await;
        let out = s_client(web, Some("a.test"), &["-alpn", "http/1.0"]);
        assert!(out.contains("ALPN protocol: http/1.0"), "{extra}: {out}");
        let (code, body, err) = curl(&pki, "a.test", web, &["/"], &["-0"]);
        assert_eq!(code, 0, "{extra}: {err}\n{}", d.stderr_text());
        assert!(
            err.contains("ALPN: server accepted http/1.0") || err.contains("HTTP/1.0"),
            "{err}"
        );
        assert!(!body.is_empty(), "{err}");
    }
}

/// `drover bench` against drover's HTTPS: the test CA by `--cacert` (with a new
/// connection per request, sessions resume from the first one's ticket), full
/// handshakes only with `--no-tls-resume`, any certificate with `--insecure`, and a
/// certificate it cannot check fails the run before it starts, saying why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drover_bench_loads_https_full_or_resumed_and_names_a_certificate_it_cannot_check() {
    let pki = Pki::new("tls-bench");
    let leaf = pki.leaf("site", "localhost", &["localhost"], far_future());
    let backend = Backend::start().await;
    let (_d, web, _admin, _) = start(&pki.dir, &config(backend.addr(), &tls_table(&[&leaf]))).await;
    let url = format!("https://localhost:{}/", web.port());
    let ca = pki.ca_pem.to_str().unwrap();
    let bench = |extra: &[&str]| {
        let mut cmd = Command::new(bin());
        cmd.args(["bench", "-n", "60", "-c", "3", "--json"])
            .args(extra)
            .arg(&url);
        let out = cmd.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let report = |out: &str| -> serde_json::Value { serde_json::from_str(out).unwrap() };

    // Keep-alive: three connections, three handshakes.
    let (code, out, err) = bench(&["--cacert", ca]);
    assert_eq!(code, Some(0), "{err}");
    let r = report(&out);
    assert_eq!(r["ok"], 60, "{out}");
    assert_eq!(r["connections_opened"], 3, "{out}");
    assert_eq!(
        r["tls"]["full"].as_u64().unwrap() + r["tls"]["resumed"].as_u64().unwrap(),
        3,
        "{out}"
    );

    // A new connection per request: after the first, they resume.
    let (code, out, err) = bench(&["--cacert", ca, "-H", "Connection: close"]);
    assert_eq!(code, Some(0), "{err}");
    let r = report(&out);
    assert_eq!(
        (r["ok"].as_u64(), r["connections_opened"].as_u64()),
        (Some(60), Some(60)),
        "{out}"
    );
    assert!(r["tls"]["resumed"].as_u64().unwrap() >= 50, "{out}");

    // --no-tls-resume: every one a full handshake.
    let (code, out, err) = bench(&["--cacert", ca, "-H", "Connection: close", "--no-tls-resume"]);
    assert_eq!(code, Some(0), "{err}");
    let r = report(&out);
    assert_eq!(
        (r["tls"]["full"].as_u64(), r["tls"]["resumed"].as_u64()),
        (Some(60), Some(0)),
        "{out}"
    );

    // The system's roots do not know the test CA: the run does not start, and says why.
    let (code, out, err) = bench(&[]);
    assert_eq!(code, Some(1), "{out}");
    assert!(
        err.contains("TLS handshake with localhost:")
            && err.contains("certificate")
            && err.contains("--cacert"),
        "{err}"
    );
    // --insecure accepts it.
    let (code, out, err) = bench(&["--insecure"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(report(&out)["ok"], 60, "{out}");
    // A CA file that is not one, and a TLS flag on a plain URL: usage errors naming it.
    let text = pki.dir.join("not-a-ca.pem");
    std::fs::write(&text, "hello\n").unwrap();
    let (code, _, err) = bench(&["--cacert", text.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(
        err.contains("not-a-ca.pem") && err.contains("no PEM certificate"),
        "{err}"
    );
    let out = Command::new(bin())
        .args(["bench", "-n", "1", "--insecure"])
        .arg(format!("http://{}/", backend.addr()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--insecure is for https://"), "{err}");
}

/// `openssl req -x509 -nodes` with `key_args` (the key's kind) and `args` (the rest),
/// writing `cert` and `key`.
fn self_signed(cert: &Path, key: &Path, key_args: &[&str], args: &[&str]) {
    let made = Command::new("openssl")
        .args(["req", "-x509", "-nodes"])
        .args(key_args)
        .args(args)
        .arg("-keyout")
        .arg(key)
        .arg("-out")
        .arg(cert)
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
}

/// The self-signed certificate a user makes first, `openssl req -x509` as it comes:
/// OpenSSL 3 marks it `CA:TRUE`, which webpki refuses as a server's and curl takes.
/// `drover bench --cacert` with it says why and what to make instead (it said
/// `Other(OtherError(CaUsedAsEndEntity))` and to pass the --cacert it had); one made with
/// `CA:FALSE` is checked and loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drover_bench_says_why_a_self_signed_ca_certificate_is_refused() {
    let dir = temp_dir("tls-self-signed");
    let backend = Backend::start().await;
    for (name, extra) in [
        ("ca", &[][..]),
        (
            "leaf",
            &["-addext", "basicConstraints=critical,CA:FALSE"][..],
        ),
    ] {
        let (cert, key) = (
            dir.join(format!("{name}.pem")),
            dir.join(format!("{name}.key")),
        );
        let names = [
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ];
        self_signed(
            &cert,
            &key,
            &["-newkey", "rsa:2048", "-days", "30"],
            &[&names[..], extra].concat(),
        );
        let d = DroverProcess::spawn(
            bin(),
            &[
                "proxy",
                "--listen",
                "127.0.0.1:0",
                "--backend",
                &backend.addr().to_string(),
                "--tls-cert",
                cert.to_str().unwrap(),
                "--tls-key",
                key.to_str().unwrap(),
            ],
        )
        .await;
        let out = Command::new(bin())
            .args([
                "bench",
                "-n",
                "5",
                "-c",
                "1",
                "--cacert",
                cert.to_str().unwrap(),
            ])
            .arg(format!("https://localhost:{}/", d.addr().port()))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        if name == "ca" {
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert!(
                err.contains("is a CA certificate, basicConstraints CA:TRUE")
                    && err.contains("-addext basicConstraints=critical,CA:FALSE"),
                "{err}"
            );
        } else {
            assert_eq!(out.status.code(), Some(0), "{err}");
        }
    }
}

/// h2load's summary line for `what`: `requests: N total, N started, N done, N
/// succeeded, N failed, N errored, N timeout`, as (done, succeeded, failed, errored).
fn h2load_counts(out: &str) -> (u64, u64, u64, u64) {
    let line = out
        .lines()
        .find(|l| l.starts_with("requests: "))
        .unwrap_or_else(|| panic!("no requests line from h2load:\n{out}"));
    let count = |word: &str| -> u64 {
        line.split(", ")
            .find_map(|part| part.trim_start_matches("requests: ").strip_suffix(word))
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {word:?} in {line:?}"))
    };
    (
        count(" done"),
        count(" succeeded"),
        count(" failed"),
        count(" errored"),
    )
}

/// h2load (nghttp2's load generator, the HTTP/2 row of bench/h2.sh) against drover: 100
/// streams at once over 10 connections, over TLS (ALPN `h2`) and in cleartext with
/// prior knowledge (`--h2c`). Every request is answered, with 2xx, and the streams of
/// each connection are spread over the three backends, counted there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2loads_streams_over_tls_and_h2c_are_all_answered_and_spread_over_the_backends() {
    const REQUESTS: u64 = 3000;
    let here = Command::new("h2load").arg("--version").output().is_ok();
    if common::tool_missing(here, "h2load (nghttp2-client; scripts/test installs it)") {
        return;
    }
    let backends = [
        Backend::start().await,
        Backend::start().await,
        Backend::start().await,
    ];
    let list: Vec<String> = backends
        .iter()
        .map(|b| format!("\"{}\"", b.addr()))
        .collect();
    let pki = Pki::new("tls-h2load");
    let leaf = pki.leaf("site", "localhost", &["localhost"], far_future());
    let toml = format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[balancer]]\nname = \"web\"\nlisten = \"127.0.0.1:0\"\nbackends = [{}]\n{}",
        list.join(", "),
        tls_table(&[&leaf])
    );
    let (tls, web, _admin, _) = start(&pki.dir, &toml).await;
    let mut backends_list = Vec::new();
    for b in &backends {
        backends_list.extend(["-b".to_string(), b.addr().to_string()]);
    }
    let mut args = vec!["proxy", "-l", "127.0.0.1:0", "--h2c"];
    args.extend(backends_list.iter().map(String::as_str));
    let h2c = DroverProcess::spawn(bin(), &args).await;

    for (what, url) in [
        ("TLS", format!("https://localhost:{}/", web.port())),
        ("h2c", format!("http://{}/", h2c.addr())),
    ] {
        let before: Vec<u64> = backends.iter().map(Backend::hits).collect();
        let out = tokio::process::Command::new("h2load")
            .args(["-n", &REQUESTS.to_string(), "-c", "10", "-m", "10", &url])
            .output()
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(text.contains("Application protocol: h2"), "{what}: {text}");
        assert_eq!(
            h2load_counts(&text),
            (REQUESTS, REQUESTS, 0, 0),
            "{what}: every request answered\n{text}\n{}{}",
            tls.stderr_text(),
            h2c.stderr_text()
        );
        assert!(
            text.contains(&format!("status codes: {REQUESTS} 2xx")),
            "{what}: {text}"
        );
        let served: Vec<u64> = backends
            .iter()
            .zip(&before)
            .map(|(b, was)| b.hits() - was)
            .collect();
        assert_eq!(served.iter().sum::<u64>(), REQUESTS, "{what}: {served:?}");
        assert!(
            served.iter().all(|&n| n > 0),
            "{what}: each backend took some of the streams: {served:?}"
        );
    }
}

/// `client_ca` in `tls` (`--tls-client-ca`; nginx's `ssl_verify_client on` with
/// `ssl_client_certificate`, HAProxy's `verify required ca-file`): curl with a
/// certificate the CA signed is served; with none, or with one another CA signed, its
/// handshake is refused and counted `client-cert`. The CA file is read again when it
/// changes (a rotated CA): the other CA's client is served then, and the first's
/// refused. A `client_ca` that is not PEM stops the start naming the key and the file,
/// and the flag serves as the key does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_ca_serves_the_clients_it_signed_and_refuses_the_rest() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tls-client-ca");
    let site = pki.leaf("site", "a.test", &["a.test"], far_future());
    let alice = pki.leaf("alice", "alice", &[], far_future());
    let other = Pki::new("tls-client-ca-other");
    let mallory = other.leaf("mallory", "mallory", &[], far_future());
    let client_ca = pki.dir.join("clients-ca.pem");
    std::fs::copy(&pki.ca_pem, &client_ca).unwrap();
    let backend = Backend::start().await;
    let table = tls_table(&[&site]).replacen(
        "tls = {",
        &format!("tls = {{ client_ca = {},", toml_path(&client_ca)),
        1,
    );
    let (d, web, admin, _) = start(&pki.dir, &config(backend.addr(), &table)).await;
    let with = |(cert, key): &(PathBuf, PathBuf)| {
        let (code, _, err) = curl(
            &pki,
            "a.test",
            web,
            &["/"],
            &[
                "--cert",
                cert.to_str().unwrap(),
                "--key",
                key.to_str().unwrap(),
            ],
        );
        (code, err)
    };
    let (code, err) = with(&alice);
    assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
    let (code, err) = with(&mallory);
    assert_ne!(code, 0, "another CA's client was served: {err}");
    let (code, _, err) = curl(&pki, "a.test", web, &["/"], &[]);
    assert_ne!(code, 0, "a client with no certificate was served: {err}");
    let failures = "drover_tls_handshake_failures_total";
    wait_metric(admin, failures, ",reason=\"client-cert\"", 2.0).await;

    // The other CA in its place: read again, as a certificate is.
    std::fs::copy(&other.ca_pem, &client_ca).unwrap();
    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(with(&mallory).0, 0, "{}", d.stderr_text());
    assert_ne!(with(&alice).0, 0);
    drop(d);

    // A CA file that is not PEM, named with its key.
    std::fs::write(&client_ca, "not a certificate\n").unwrap();
    let err = check_refuses(
        &pki.dir,
        "bad-client-ca.toml",
        &config(backend.addr(), &table),
    );
    assert!(
        err.contains("tls.client_ca") && err.contains("clients-ca.pem is not PEM"),
        "{err}"
    );

    // The flag.
    std::fs::copy(&pki.ca_pem, &client_ca).unwrap();
    let flags = [
        "proxy",
        "-l",
        "127.0.0.1:0",
        "-b",
        &backend.addr().to_string(),
        "--tls-cert",
        site.0.to_str().unwrap(),
        "--tls-key",
        site.1.to_str().unwrap(),
        "--tls-client-ca",
        client_ca.to_str().unwrap(),
    ];
    let d = DroverProcess::spawn(bin(), &flags).await;
    let web = d.addr();
    let (code, _, err) = curl(&pki, "a.test", web, &["/"], &[]);
    assert_ne!(code, 0, "{err}");
    let (code, _, err) = curl(
        &pki,
        "a.test",
        web,
        &["/"],
        &[
            "--cert",
            alice.0.to_str().unwrap(),
            "--key",
            alice.1.to_str().unwrap(),
        ],
    );
    assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
}

/// The backend hears who a client is: `X-Forwarded-Client-Cert: Subject="CN=alice"`
/// (Envoy's XFCC format) for the certificate the client presented, and a client's own
/// such header never (it could name anyone). `verify_client = "optional"` serves a
/// client without a certificate too, with no XFCC; one whose certificate another CA
/// signed is still refused. `verify_client` without `client_ca` is refused by name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backend_hears_the_clients_certificate_and_no_forged_one() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tls-xfcc");
    let site = pki.leaf("site", "a.test", &["a.test"], far_future());
    let alice = pki.leaf("alice", "alice", &[], far_future());
    let other = Pki::new("tls-xfcc-other");
    let mallory = other.leaf("mallory", "mallory", &[], far_future());
    let backend = Backend::start().await;
    let table = tls_table(&[&site]).replacen(
        "tls = {",
        &format!(
            "tls = {{ client_ca = {}, verify_client = \"optional\",",
            toml_path(&pki.ca_pem)
        ),
        1,
    );
    let (d, web, _, _) = start(&pki.dir, &config(backend.addr(), &table)).await;
    let forged = "X-Forwarded-Client-Cert: Subject=\"CN=mallory\"";
    let headers = |cert: Option<&(PathBuf, PathBuf)>| {
        let mut extra = vec!["-H", forged];
        if let Some((c, k)) = cert {
            extra.extend(["--cert", c.to_str().unwrap(), "--key", k.to_str().unwrap()]);
        }
        curl(&pki, "a.test", web, &["/headers"], &extra)
    };
    let (code, body, err) = headers(Some(&alice));
    assert_eq!(code, 0, "{err}\n{}", d.stderr_text());
    let head = body.to_lowercase();
    assert!(
        head.contains("x-forwarded-client-cert: subject=\"cn=alice\"\r\n"),
        "{body}"
    );
    assert!(!head.contains("mallory"), "{body}");
    // No certificate: served, and nothing names a client.
    let (code, body, err) = headers(None);
    assert_eq!(code, 0, "{err}");
    assert!(
        !body.to_lowercase().contains("x-forwarded-client-cert"),
        "{body}"
    );
    // Another CA's certificate is refused, optional or not.
    assert_ne!(headers(Some(&mallory)).0, 0);
    drop(d);

    let bad = tls_table(&[&site]).replacen("tls = {", "tls = { verify_client = \"optional\",", 1);
    let err = check_refuses(&pki.dir, "bad-verify.toml", &config(backend.addr(), &bad));
    assert!(
        err.contains("tls.verify_client") && err.contains("without client_ca"),
        "{err}"
    );
}
