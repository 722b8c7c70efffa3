//! TCP mode through real processes: `drover proxy --tcp` (and `mode = "tcp"` in a
//! drover.toml) in front of redis-server driven by redis-benchmark, and in front of small
//! backends written here (echo, one that answers only once the client has finished
//! sending, one that says its name). Connections spread by open connections, a dead
//! backend is skipped by a connect retry, a half-close passes through, the idle timeout
//! cuts a silent connection, hash on the client address keeps a client on one backend,
//! max_conns queues connections, health checks by TCP connect, and reload and shutdown
//! leave relayed connections running.

mod common;

use common::pki::{far_future, tools, Pki};
use common::{admin_addr, bin, metrics_text, proxy, status, temp_dir};
use drover_testkit::{wait_until_async, DroverProcess};
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

/// How long any one wait in these tests may take before it counts as failed.
const PATIENCE: Duration = Duration::from_secs(10);

/// A backend that sends back what it gets, and passes on the end of it.
async fn echo() -> SocketAddr {
    serve(|mut s| async move {
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
        let _ = w.shutdown().await;
    })
    .await
}

/// A backend that answers only once the client has finished sending (it half-closed):
/// `got N bytes`, then a 1 MB tail, then the end.
async fn answers_after_the_end() -> SocketAddr {
    serve(|mut s| async move {
        let mut got = Vec::new();
        if s.read_to_end(&mut got).await.is_err() {
            return;
        }
        let _ = s
            .write_all(format!("got {} bytes\n", got.len()).as_bytes())
            .await;
        let _ = s.write_all(&vec![b'x'; 1_000_000]).await;
        let _ = s.shutdown().await;
    })
    .await
}

/// A backend that says `name` and closes.
async fn named(name: &'static str) -> SocketAddr {
    serve(move |mut s| async move {
        let _ = s.write_all(name.as_bytes()).await;
        let _ = s.shutdown().await;
    })
    .await
}

/// Accepts on 127.0.0.1:0, each connection in a task of its own.
async fn serve<F, Fut>(each: F) -> SocketAddr
where
    F: Fn(TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(each(s));
        }
    });
    addr
}

/// A backend that requires a PROXY protocol header, answers with the client's IP it
/// names (`none` for a `LOCAL` one) and a space, then echoes the rest.
async fn names_the_client() -> SocketAddr {
    serve(|mut s| async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        let header = loop {
            let Ok(n) = s.read(&mut buf).await else {
                return;
            };
            if n == 0 {
                return;
            }
            got.extend_from_slice(&buf[..n]);
            if let Some(h) = drover_proxy::proxy_protocol::parse(&got).unwrap() {
                break h;
            }
        };
        let named = header
            .client
            .map_or("none".to_string(), |c| c.ip().to_string());
        let _ = s.write_all(format!("{named} ").as_bytes()).await;
        let _ = s.write_all(&got[header.len..]).await;
        let (mut r, mut w) = s.split();
        let _ = tokio::io::copy(&mut r, &mut w).await;
        let _ = w.shutdown().await;
    })
    .await
}

/// A connection from `from` (a loopback address) to `to`.
async fn connect_from(from: &str, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    socket.connect(to).await.unwrap()
}

/// Sends `data` on `s`, finishes sending, and reads to the end (as text).
async fn send_and_read(mut s: TcpStream, data: &[u8]) -> String {
    // The write may fail when drover already closed the connection: that is an answer.
    let _ = s.write_all(data).await;
    let _ = s.shutdown().await;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, s.read_to_end(&mut got))
        .await
        .expect("the answer ended in time");
    String::from_utf8_lossy(&got).into_owned()
}

/// A port nothing listens on.
fn dead_port() -> SocketAddr {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// `drover proxy --tcp` with an admin API, over `backends`, plus `extra` flags.
async fn tcp_proxy(backends: &[SocketAddr], extra: &[&str]) -> (DroverProcess, SocketAddr) {
    let mut args = vec!["--tcp", "--admin", "127.0.0.1:0", "--slow-start", "0s"];
    args.extend_from_slice(extra);
    let d = proxy(backends, &args).await;
    let admin = admin_addr(&d).await;
    (d, admin)
}

/// Sends `data` on a new connection to `to`, finishes sending, and reads to the end.
async fn round_trip(to: SocketAddr, data: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(to).await.unwrap();
    s.write_all(data).await.unwrap();
    s.shutdown().await.unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, s.read_to_end(&mut got))
        .await
        .expect("the answer ended in time")
        .unwrap();
    got
}

/// What a new connection from `from` (a loopback address) to `to` reads until the end.
async fn read_from(from: &str, to: SocketAddr) -> String {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(format!("{from}:0").parse().unwrap()).unwrap();
    let mut s = socket.connect(to).await.unwrap();
    let mut got = String::new();
    tokio::time::timeout(PATIENCE, s.read_to_string(&mut got))
        .await
        .expect("the answer ended in time")
        .unwrap();
    got
}

/// What `curl -sS ARGS https://localhost:PORT/` prints (its output, then its errors),
/// with `localhost` at 127.0.0.1 and `pki`'s CA trusted: drover's TLS at `port`.
fn curl_localhost(pki: &Pki, port: u16, args: &[&str]) -> String {
    let out = Command::new("curl")
        .arg("-sS")
        .args(args)
        .arg("--cacert")
        .arg(&pki.ca_pem)
        .arg("--resolve")
        .arg(format!("localhost:{port}:127.0.0.1"))
        .arg(format!("https://localhost:{port}/"))
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// A sample of the default balancer's `name`, with `labels` after the balancer's.
async fn metric(admin: SocketAddr, name: &str, labels: &str) -> u64 {
    let text = metrics_text(admin).await;
    let prefix = format!("{name}{{balancer=\"default\"{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.parse().unwrap())
}

/// The lines of /metrics for `name` (any labels).
async fn metric_lines(admin: SocketAddr, name: &str) -> Vec<String> {
    metrics_text(admin)
        .await
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .map(str::to_owned)
        .collect()
}

/// The endpoints' open connections, from `drover ctl status`.
async fn open_connections(admin: SocketAddr) -> u32 {
    let s = status(admin).await;
    assert_eq!(s.balancers[0].mode, "tcp");
    s.balancers[0].endpoints.iter().map(|e| e.in_flight).sum()
}

// ---------------------------------------------------------------------------------------
// redis-server behind drover
// ---------------------------------------------------------------------------------------

/// redis-server and redis-benchmark, or `None` outside CI when they are missing.
fn redis_tools() -> Option<(PathBuf, PathBuf, PathBuf)> {
    let find = |name: &str| {
        ["/usr/bin", "/usr/local/bin", "/usr/sbin"]
            .iter()
            .map(|d| Path::new(d).join(name))
            .find(|p| p.exists())
    };
    match (
        find("redis-server"),
        find("redis-benchmark"),
        find("redis-cli"),
    ) {
        (Some(s), Some(b), Some(c)) => Some((s, b, c)),
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "redis-server, redis-benchmark or redis-cli is missing (scripts/test installs redis-server and redis-tools)"
            );
            eprintln!("skipped: redis is missing (apt-get install redis-server redis-tools)");
            None
        }
    }
}

/// A health check as redis asks to be checked: PING, +PONG.
const REDIS_CHECK: [&str; 7] = [
    "--health-tcp",
    "--health-send",
    "PING\\r\\n",
    "--health-receive",
    "+PONG",
    "--health-interval",
    "200ms",
];

/// A redis-server on a free port, without persistence; killed on drop.
struct Redis {
    child: std::process::Child,
    port: u16,
}

impl Redis {
    fn start(server: &Path, cli: &Path, dir: &Path) -> Redis {
        Redis::start_with(server, cli, dir, None)
    }

    /// With `tls` (its certificate, key and the CA its clients are told to trust), it
    /// takes TLS connections only (`--port 0 --tls-port`), and no client certificate.
    fn start_with(server: &Path, cli: &Path, dir: &Path, tls: Option<[&Path; 3]>) -> Redis {
        let port = dead_port().port();
        let mut cmd = Command::new(server);
        match tls {
            None => cmd.args(["--port", &port.to_string()]),
            Some([cert, key, ca]) => cmd
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .arg("--tls-cert-file")
                .arg(cert)
                .arg("--tls-key-file")
                .arg(key)
                .arg("--tls-ca-cert-file")
                .arg(ca)
                .args(["--tls-auth-clients", "no"]),
        };
        let child = cmd
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir)
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("start redis-server");
        let redis = Redis { child, port };
        let ping: Vec<String> = match tls {
            None => vec!["PING".into()],
            Some([_, _, ca]) => vec![
                "--tls".into(),
                "--cacert".into(),
                ca.display().to_string(),
                "PING".into(),
            ],
        };
        let ping: Vec<&str> = ping.iter().map(String::as_str).collect();
        let started = std::time::Instant::now();
        while !String::from_utf8_lossy(&redis_cli_output(cli, redis.addr(), &ping, None).stdout)
            .contains("PONG")
        {
            assert!(started.elapsed() < PATIENCE, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    fn cli(&self, cli: &Path, args: &[&str]) -> String {
        redis_cli(cli, self.addr(), args, None)
    }

    /// Connections it has accepted, from `INFO stats`.
    fn connections_received(&self, cli: &Path) -> u64 {
        let info = self.cli(cli, &["INFO", "stats"]);
        info.lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .unwrap_or_else(|| panic!("no total_connections_received in {info}"))
            .trim()
            .parse()
            .unwrap()
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-cli -h -p args`, with `stdin` as its commands when given; stdout, which
/// must have succeeded.
fn redis_cli(cli: &Path, to: SocketAddr, args: &[&str], stdin: Option<&str>) -> String {
    let out = redis_cli_output(cli, to, args, stdin);
    assert!(out.status.success(), "redis-cli {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn redis_cli_output(
    cli: &Path,
    to: SocketAddr,
    args: &[&str],
    stdin: Option<&str>,
) -> std::process::Output {
    use std::io::Write;
    let mut cmd = Command::new(cli);
    cmd.args(["-h", "127.0.0.1", "-p", &to.port().to_string()])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = cmd.spawn().expect("run redis-cli");
    let mut input = child.stdin.take().unwrap();
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

/// `redis-benchmark -t set,get -n 1000 -c 10` through `to` (with `extra` flags, as
/// `--tls`), which must report both tests and no error.
fn set_and_get_without_error(benchmark: &Path, to: SocketAddr, extra: &[&str]) {
    let out = Command::new(benchmark)
        .args(["-h", "127.0.0.1", "-p", &to.port().to_string()])
        .args(extra)
        .args(["-t", "set,get", "-n", "1000", "-c", "10", "-q"])
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && !text.to_lowercase().contains("error"),
        "{text}"
    );
    assert!(text.contains("SET") && text.contains("GET"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_benchmark_through_drover_has_no_error_and_connections_spread() {
    let Some((server, benchmark, cli)) = redis_tools() else {
        return;
    };
    let dir = temp_dir("tcp-redis");
    let redis: Vec<Redis> = (0..3).map(|_| Redis::start(&server, &cli, &dir)).collect();
    let addrs: Vec<SocketAddr> = redis.iter().map(Redis::addr).collect();
    let (d, admin) = tcp_proxy(
        &addrs,
        &[&["--strategy", "least-conn"][..], &REDIS_CHECK[..]].concat(),
    )
    .await;
    let before: Vec<u64> = redis.iter().map(|r| r.connections_received(&cli)).collect();

    // Commands on one connection through drover land on one redis, in order.
    let answers = redis_cli(
        &cli,
        d.addr(),
        &[],
        Some("SET drover-key hello\nGET drover-key\nINCR drover-n\nINCR drover-n\n"),
    );
    assert_eq!(
        answers.lines().collect::<Vec<_>>(),
        ["OK", "hello", "1", "2"]
    );

    let out = Command::new(&benchmark)
        .args(["-h", "127.0.0.1", "-p", &d.addr().port().to_string()])
        .args(["-t", "set,get", "-n", "2000", "-c", "20", "--csv"])
        .output()
        .expect("run redis-benchmark");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    eprintln!("redis-benchmark through drover:\n{stdout}");
    // redis-benchmark stops at the first error reply or lost connection, saying so.
    assert!(
        !stdout.contains("ERR") && !stderr.contains("Error"),
        "{stdout}\n{stderr}"
    );
    let tests: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("\"SET\"") || l.starts_with("\"GET\""))
        .collect();
    assert_eq!(tests.len(), 2, "{stdout}");

    // 20 connections per test, by open connections: every redis gets its share.
    let got: Vec<u64> = redis
        .iter()
        .zip(&before)
        .map(|(r, b)| r.connections_received(&cli) - b)
        .collect();
    assert!(got.iter().sum::<u64>() >= 41, "{got:?}");
    assert!(
        got.iter().all(|&n| n >= 8),
        "connections per redis: {got:?}"
    );
    assert!(metric(admin, "drover_tcp_connections_total", "").await >= 41);
    assert!(metric(admin, "drover_tcp_received_bytes_total", "").await > 2000 * 20);
    assert!(metric(admin, "drover_tcp_sent_bytes_total", "").await > 2000 * 5);
    assert_eq!(
        metric(
            admin,
            "drover_tcp_unserved_total",
            ",cause=\"connect-failed\""
        )
        .await,
        0
    );
    // Every redis passed its PING checks, and none failed one.
    let value = |l: &str| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap();
    assert!(
        wait_until_async(PATIENCE, || async {
            let lines = metric_lines(admin, "drover_endpoint_health_checks_total").await;
            lines
                .iter()
                .filter(|l| l.contains("result=\"pass\"") && value(l) > 0)
                .count()
                == 3
        })
        .await
    );
    let lines = metric_lines(admin, "drover_endpoint_health_checks_total").await;
    assert!(
        lines
            .iter()
            .filter(|l| l.contains("result=\"fail\""))
            .all(|l| value(l) == 0),
        "{lines:?}"
    );
}

// ---------------------------------------------------------------------------------------
// Connect retries, half-close, idle timeout
// ---------------------------------------------------------------------------------------

/// `backend_tls` on a TCP balancer (HAProxy's `server … ssl` in `mode tcp`): plain
/// redis-cli and redis-benchmark, talking to drover, reach a redis-server that takes
/// only TLS. Beside it, a redis-server whose certificate another CA signed: a health
/// check over TLS (PING, +PONG) fails it, and without health checks a connection
/// placed on it fails its handshake as a connect fails, and goes to the other one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_tls_lets_plain_clients_reach_backends_that_take_only_tls() {
    let Some((server, benchmark, cli)) = redis_tools() else {
        return;
    };
    let dir = temp_dir("tcp-redis-tls");
    let pki = Pki::new("tcp-redis-tls-ca");
    let other = Pki::new("tcp-redis-tls-other-ca");
    let (cert, key) = pki.leaf("redis", "redis", &["127.0.0.1"], far_future());
    let (other_cert, other_key) = other.leaf("redis", "redis", &["127.0.0.1"], far_future());
    let trusted = Redis::start_with(&server, &cli, &dir, Some([&cert, &key, &pki.ca_pem]));
    let untrusted = Redis::start_with(
        &server,
        &cli,
        &dir,
        Some([&other_cert, &other_key, &other.ca_pem]),
    );
    let backends = [trusted.addr(), untrusted.addr()];
    let ca = pki.ca_pem.to_str().unwrap();
    let tls = [
        "--backend-tls",
        "--backend-ca",
        ca,
        "--strategy",
        "round-robin",
    ];
    let (d, admin) = tcp_proxy(&backends, &[&tls[..], &REDIS_CHECK[..]].concat()).await;
    let sorted = wait_until_async(PATIENCE, || async {
        let s = status(admin).await;
        let healthy = |addr: SocketAddr| {
            s.balancers[0]
                .endpoints
                .iter()
                .any(|e| e.addr == addr.to_string() && e.healthy)
        };
        healthy(trusted.addr()) && !healthy(untrusted.addr())
    })
    .await;
    assert!(
        sorted,
        "{:?}\n{}",
        status(admin).await.balancers[0].endpoints,
        d.stderr_text()
    );
    assert_eq!(
        redis_cli(&cli, d.addr(), &["SET", "k", "through-tls"], None).trim(),
        "OK"
    );
    for _ in 0..4 {
        assert_eq!(
            redis_cli(&cli, d.addr(), &["GET", "k"], None).trim(),
            "through-tls"
        );
    }
    set_and_get_without_error(&benchmark, d.addr(), &[]);

    // No health checks: each connection placed on the untrusted one goes on to the
    // trusted one, and the failed handshakes are counted by why.
    let (plain, plain_admin) = tcp_proxy(&backends, &tls).await;
    for _ in 0..6 {
        assert_eq!(
            redis_cli(&cli, plain.addr(), &["PING"], None).trim(),
            "PONG"
        );
    }
    let failures = metric_lines(plain_admin, "drover_backend_tls_failures_total").await;
    assert!(
        failures.iter().any(|l| !l.ends_with(" 0")),
        "{failures:?}\n{}",
        plain.stderr_text()
    );
    drop(d);
    drop(plain);
}

/// `tls` on a TCP balancer (HAProxy's `bind … ssl crt` in `mode tcp`): redis-cli and
/// redis-benchmark speak TLS to drover, which relays what the sessions carry to a plain
/// redis-server, and over TLS again to one that takes only TLS (with `backend_tls`).
/// No ALPN is agreed, even with a client that offers one; a client that speaks no TLS
/// is closed with no answer, and one that stalls its handshake is cut by the header
/// read timeout; each is counted by why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_a_tcp_balancer_ends_the_clients_tls_and_relays_what_it_carries() {
    let Some((server, benchmark, cli)) = redis_tools() else {
        return;
    };
    if !tools() {
        return;
    }
    let dir = temp_dir("tcp-tls-front");
    let pki = Pki::new("tcp-tls-front-ca");
    let (cert, key) = pki.leaf("front", "drover-front", &["127.0.0.1"], far_future());
    let (redis_cert, redis_key) = pki.leaf("redis", "redis", &["127.0.0.1"], far_future());
    let plain = Redis::start(&server, &cli, &dir);
    let tls = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--header-timeout",
        "1s",
    ];
    let (d, admin) = tcp_proxy(&[plain.addr()], &tls).await;
    let ca = pki.ca_pem.to_str().unwrap();
    let over_tls = ["--tls", "--cacert", ca];
    let set = [&over_tls[..], &["SET", "k", "over-tls"]].concat();
    assert_eq!(redis_cli(&cli, d.addr(), &set, None).trim(), "OK");
    assert_eq!(plain.cli(&cli, &["GET", "k"]).trim(), "over-tls");
    set_and_get_without_error(&benchmark, d.addr(), &over_tls);
    assert!(metric(admin, "drover_tls_handshakes_total", "").await >= 21);

    // drover's certificate is the one shown, and an offered ALPN is not taken up: the
    // bytes inside are the client's protocol, unread.
    let shown = Command::new("openssl")
        .args(["s_client", "-connect", &d.addr().to_string()])
        .args(["-alpn", "h2,http/1.1", "-CAfile", ca])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.contains("CN = drover-front"), "{shown}");
    assert!(shown.contains("No ALPN negotiated"), "{shown}");
    assert!(shown.contains("Verify return code: 0 (ok)"), "{shown}");

    // Plain redis to the TLS port: closed with no answer (an HTTP 400 would be noise
    // in a protocol the client may not speak), and counted.
    let mut s = TcpStream::connect(d.addr()).await.unwrap();
    s.write_all(b"PING\r\n").await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(PATIENCE, s.read_to_end(&mut got)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
    let failures = "drover_tls_handshake_failures_total";
    assert_eq!(metric(admin, failures, ",reason=\"not-tls\"").await, 1);
    // A client that connects and says nothing is cut at the header read timeout.
    let mut stalled = TcpStream::connect(d.addr()).await.unwrap();
    let read = tokio::time::timeout(PATIENCE, stalled.read_to_end(&mut got)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    assert_eq!(metric(admin, failures, ",reason=\"timeout\"").await, 1);
    assert_eq!(open_connections(admin).await, 0);

    // TLS both ways: ended at drover, begun again towards a redis that takes only TLS.
    let only_tls = Redis::start_with(
        &server,
        &cli,
        &dir,
        Some([&redis_cert, &redis_key, &pki.ca_pem]),
    );
    let both = [&tls[..], &["--backend-tls", "--backend-ca", ca]].concat();
    let (twice, _) = tcp_proxy(&[only_tls.addr()], &both).await;
    let set = [&over_tls[..], &["SET", "k", "tls-both-ways"]].concat();
    assert_eq!(redis_cli(&cli, twice.addr(), &set, None).trim(), "OK");
    let get = [&over_tls[..], &["GET", "k"]].concat();
    assert_eq!(
        redis_cli(&cli, twice.addr(), &get, None).trim(),
        "tls-both-ways"
    );
    drop(d);
    drop(twice);
}

/// `--tls-alpn` on a TCP balancer (HAProxy's `bind … ssl alpn`): curl, which speaks
/// HTTP/2 over TLS only when ALPN agrees to it, reaches through drover's TLS a backend
/// that speaks HTTP/2 in the clear (another drover, with `--h2c`); a client that offers
/// only protocols not listed fails its handshake, and one that offers none is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_alpn_lets_http2_clients_reach_a_cleartext_http2_backend() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tcp-tls-alpn");
    let (cert, key) = pki.leaf("front", "localhost", &["localhost"], far_future());
    let web = drover_testkit::backends(1).await;
    let h2c = proxy(&[web[0].addr()], &["--h2c"]).await;
    let tls = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-alpn",
        "h2,http/1.1",
    ];
    let (d, admin) = tcp_proxy(&[h2c.addr()], &tls).await;
    let port = d.addr().port();
    let curl = |version: &str| {
        let args = [
            version,
            "-o",
            "/dev/null",
            "-w",
            "%{http_version} %{http_code}",
        ];
        curl_localhost(&pki, port, &args)
    };
    assert_eq!(curl("--http2"), "2 200", "{}", d.stderr_text());
    // ALPN agrees to http/1.1 when that is all the client offers: the h2c listener
    // serves HTTP/1.1 too.
    assert_eq!(curl("--http1.1"), "1.1 200");
    let s_client = |alpn: Option<&str>| {
        let mut cmd = Command::new("openssl");
        cmd.args(["s_client", "-connect", &d.addr().to_string()])
            .args(["-servername", "localhost", "-CAfile"])
            .arg(&pki.ca_pem);
        if let Some(alpn) = alpn {
            cmd.args(["-alpn", alpn]);
        }
        let out = cmd.stdin(std::process::Stdio::null()).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let agreed = s_client(Some("mqtt,h2"));
    assert!(agreed.contains("ALPN protocol: h2"), "{agreed}");
    let refused = s_client(Some("mqtt"));
    assert!(
        refused.to_lowercase().contains("no application protocol"),
        "{refused}"
    );
    let none = s_client(None);
    assert!(none.contains("No ALPN negotiated"), "{none}");
    assert!(none.contains("Verify return code: 0 (ok)"), "{none}");
    let failures = metric_lines(admin, "drover_tls_handshake_failures_total").await;
    assert!(failures.iter().any(|l| !l.ends_with(" 0")), "{failures:?}");
    drop(d);
    drop(h2c);
}

/// An HTTP/2 server over TLS that takes only sessions agreed on `h2` (Node's
/// `http2.createSecureServer` without `allowHTTP1`, as a gRPC server over TLS), behind a
/// TCP balancer that ends its clients' TLS with `--tls-alpn h2,http/1.1` and speaks TLS
/// again to its backend. The backend is offered by ALPN what the client agreed on with
/// drover. Before, it was offered nothing: the client's HTTP/2 reached a session with
/// no protocol, which Node drops (`unknownProtocol`), and curl failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_alpn_agreed_with_a_client_is_offered_to_a_tls_backend() {
    if !tools() {
        return;
    }
    let pki = Pki::new("tcp-tls-alpn-backend");
    let (cert, key) = pki.leaf("front", "localhost", &["localhost"], far_future());
    let (back_cert, back_key) = pki.leaf("back", "backend", &["backend"], far_future());
    let script = r#"
        const fs = require('fs');
        const http2 = require('http2');
        const [cert, key] = process.argv.slice(1);
        const server = http2.createSecureServer({ cert: fs.readFileSync(cert), key: fs.readFileSync(key) });
        server.on('stream', (stream) => {
          stream.respond({ ':status': 200 });
          stream.end(`h2 backend, alpn ${stream.session.alpnProtocol}`);
        });
        server.listen(0, '127.0.0.1', () => console.log(`listening on 127.0.0.1:${server.address().port}`));
    "#;
    let mut node = Command::new("node");
    node.args(["-e", script]).arg(&back_cert).arg(&back_key);
    let backend = drover_testkit::spawn_ready_line(node, "listening on ").await;
    let flags = [
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--tls-alpn",
        "h2,http/1.1",
        "--backend-ca",
        pki.ca_pem.to_str().unwrap(),
        "--backend-server-name",
        "backend",
    ];
    let (d, admin) = tcp_proxy(&[backend.addr()], &flags).await;
    let port = d.addr().port();
    let said = curl_localhost(
        &pki,
        port,
        &["--http2", "-w", " %{http_version} %{http_code}"],
    );
    assert_eq!(
        said,
        "h2 backend, alpn h2 2 200",
        "{}\n{}",
        d.stderr_text(),
        backend.stderr_text()
    );
    assert_eq!(
        metric(admin, "drover_tcp_connections_total", "").await,
        1,
        "{}",
        d.stderr_text()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_backend_is_skipped_by_a_connect_retry() {
    let (dead, live) = (dead_port(), echo().await);
    let (d, admin) = tcp_proxy(&[dead, live], &["--strategy", "round-robin"]).await;
    for i in 0..20 {
        let data = format!("hello {i}");
        assert_eq!(round_trip(d.addr(), data.as_bytes()).await, data.as_bytes());
    }
    // The dead one was tried, failed, counted against its passive health (ejected, as
    // an HTTP connect failure ejects) and passed over; no client saw it.
    let s = status(admin).await;
    let dead_row = s.balancers[0]
        .endpoints
        .iter()
        .find(|e| e.addr == dead.to_string())
        .unwrap();
    assert!(dead_row.ejections >= 1, "{dead_row:?}");
    assert!(metric(admin, "drover_retries_total", ",cause=\"connect-failed\"").await >= 1);
    assert_eq!(
        metric(
            admin,
            "drover_tcp_unserved_total",
            ",cause=\"connect-failed\""
        )
        .await,
        0
    );
    assert_eq!(metric(admin, "drover_tcp_connections_total", "").await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_no_backend_takes_is_closed_and_counted() {
    let (d, admin) = tcp_proxy(&[dead_port(), dead_port()], &[]).await;
    // Closed without a byte: the client reads the end.
    assert_eq!(read_from("127.0.0.1", d.addr()).await, "");
    assert!(
        wait_until_async(PATIENCE, || async {
            metric(
                admin,
                "drover_tcp_unserved_total",
                ",cause=\"connect-failed\"",
            )
            .await
                == 1
        })
        .await
    );
    assert_eq!(metric(admin, "drover_tcp_connections_total", "").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_close_reaches_the_backend_and_its_answer_still_comes_back() {
    let backend = answers_after_the_end().await;
    let (d, _admin) = tcp_proxy(&[backend], &[]).await;
    let request = vec![b'r'; 200_000];
    let answer = round_trip(d.addr(), &request).await;
    let head = b"got 200000 bytes\n";
    assert!(
        answer.starts_with(head),
        "{:?}",
        &answer[..40.min(answer.len())]
    );
    assert_eq!(answer.len(), head.len() + 1_000_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_idle_timeout_cuts_a_silent_connection_not_a_busy_one() {
    let backend = echo().await;
    let (d, admin) = tcp_proxy(&[backend], &["--idle-timeout", "1s"]).await;

    // Busy: a byte each 300 ms for twice the idle timeout, every one echoed.
    let mut busy = TcpStream::connect(d.addr()).await.unwrap();
    for i in 0..7u8 {
        busy.write_all(&[i]).await.unwrap();
        let mut one = [0u8; 1];
        tokio::time::timeout(PATIENCE, busy.read_exact(&mut one))
            .await
            .expect("echoed")
            .unwrap();
        assert_eq!(one[0], i);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // Silent: drover closes it, and the endpoint's connection count goes back to 0.
    let mut silent = TcpStream::connect(d.addr()).await.unwrap();
    silent.write_all(b"x").await.unwrap();
    let mut got = Vec::new();
    let read = tokio::time::timeout(PATIENCE, silent.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "drover kept an idle connection open");
    assert_eq!(got, b"x");
    drop(busy);
    assert!(wait_until_async(PATIENCE, || async { open_connections(admin).await == 0 }).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_does_not_read_holds_its_backend_back_not_drovers_memory() {
    const TOTAL: usize = 64 << 20;
    let written = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = written.clone();
    // Writes TOTAL bytes as fast as the connection takes them, counting what it wrote.
    let backend = serve(move |mut s| {
        let counted = counted.clone();
        async move {
            let chunk = vec![b'z'; 64 * 1024];
            let mut left = TOTAL;
            while left > 0 {
                let n = left.min(chunk.len());
                if s.write_all(&chunk[..n]).await.is_err() {
                    return;
                }
                counted.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
                left -= n;
            }
            let _ = s.shutdown().await;
        }
    })
    .await;
    let (d, _admin) = tcp_proxy(&[backend], &[]).await;
    let mut client = TcpStream::connect(d.addr()).await.unwrap();
    // The client reads nothing: the backend's writes stall once the sockets' buffers
    // and drover's one buffer per direction are full.
    let now = || written.load(std::sync::atomic::Ordering::Relaxed);
    let mut last = usize::MAX;
    assert!(
        wait_until_async(PATIENCE, || {
            let (before, seen) = (last, now());
            last = seen;
            async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                seen > 0 && seen == before
            }
        })
        .await,
        "the backend never stalled"
    );
    assert!(now() < TOTAL / 2, "drover took {} of {TOTAL} bytes", now());
    // Reading resumes the flow, and every byte arrives.
    let mut got = 0;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = tokio::time::timeout(PATIENCE, client.read(&mut buf))
            .await
            .expect("bytes keep coming")
            .unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    assert_eq!(got, TOTAL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_proxy_protocol_names_the_client_to_the_backend_before_its_bytes() {
    let backend = names_the_client().await;
    for version in ["v1", "v2"] {
        let (d, _admin) = tcp_proxy(&[backend], &["--send-proxy-protocol", version]).await;
        let socket = TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.5:0".parse().unwrap()).unwrap();
        let mut s = socket.connect(d.addr()).await.unwrap();
        s.write_all(b"hello").await.unwrap();
        s.shutdown().await.unwrap();
        let mut got = String::new();
        tokio::time::timeout(PATIENCE, s.read_to_string(&mut got))
            .await
            .expect("answered in time")
            .unwrap();
        assert_eq!(got, "127.0.0.5 hello", "{version}");
    }
}

// ---------------------------------------------------------------------------------------
// Behind another balancer: the PROXY protocol read (proxy_protocol)
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_in_front_in_tcp_mode_names_the_client_and_drover_names_it_on() {
    let backend = names_the_client().await;
    let (d, _admin) = tcp_proxy(
        &[backend],
        &[
            "--proxy-protocol-from",
            "127.0.0.1",
            "--send-proxy-protocol",
            "v2",
        ],
    )
    .await;
    let port = drover_testkit::free_port();
    let cfg = format!(
        "frontend front\n  mode tcp\n  bind 127.0.0.1:{port}\n  default_backend to_drover\n\
         backend to_drover\n  mode tcp\n  server d {} send-proxy-v2\n",
        d.addr()
    );
    let front: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let Some(_haproxy) = common::start_haproxy("tcp-proxy-protocol", &cfg, &[front]).await else {
        return;
    };
    // HAProxy connects from 127.0.0.1: only the header tells the client.
    for client in ["127.0.0.7", "127.0.0.8"] {
        let got = send_and_read(connect_from(client, front).await, b"hello").await;
        assert_eq!(got, format!("{client} hello"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_sent_with_the_proxy_header_reach_the_backend_first() {
    let backend = names_the_client().await;
    let (d, _admin) = tcp_proxy(
        &[backend],
        &[
            "--proxy-protocol-from",
            "127.0.0.1",
            "--send-proxy-protocol",
            "v1",
        ],
    )
    .await;
    let client: SocketAddr = "198.51.100.4:5000".parse().unwrap();
    let local: SocketAddr = "10.0.0.1:80".parse().unwrap();
    for version in [
        drover_proxy::proxy_protocol::SendVersion::V1,
        drover_proxy::proxy_protocol::SendVersion::V2,
    ] {
        // Header and payload in one write: drover reads them together.
        let mut first = drover_proxy::proxy_protocol::header(version, client, local);
        first.extend_from_slice(b"hello, in the header's segment");
        let got = send_and_read(connect_from("127.0.0.1", d.addr()).await, &first).await;
        assert_eq!(
            got, "198.51.100.4 hello, in the header's segment",
            "{version}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_senders_and_bad_or_late_headers_are_closed_unread_and_counted() {
    let backend = echo().await;
    let (d, admin) = tcp_proxy(
        &[backend],
        &[
            "--proxy-protocol-from",
            "127.0.0.1",
            "--header-timeout",
            "1s",
        ],
    )
    .await;
    let header = b"PROXY TCP4 198.51.100.4 10.0.0.1 5000 80\r\nhello";
    // An address drover does not trust, with a header that would pass from a trusted one.
    let got = send_and_read(connect_from("127.0.0.9", d.addr()).await, header).await;
    assert_eq!(got, "");
    // A trusted sender without a header: the client's bytes are no header.
    let got = send_and_read(connect_from("127.0.0.1", d.addr()).await, b"hello").await;
    assert_eq!(got, "");
    // A trusted sender that sends nothing is closed at the header read timeout.
    let mut silent = connect_from("127.0.0.1", d.addr()).await;
    let mut got = Vec::new();
    tokio::time::timeout(PATIENCE, silent.read_to_end(&mut got))
        .await
        .expect("closed by the header read timeout")
        .unwrap();
    assert!(got.is_empty());
    let refused = |reason: &'static str| async move {
        metric(
            admin,
            "drover_proxy_protocol_refused_total",
            &format!(",reason=\"{reason}\""),
        )
        .await
    };
    assert_eq!(refused("untrusted-sender").await, 1);
    assert_eq!(refused("bad-header").await, 2);
    // None reached a backend; a good header still does, and only what follows it
    // (the client's bytes) is relayed.
    assert_eq!(metric(admin, "drover_tcp_connections_total", "").await, 0);
    let got = send_and_read(connect_from("127.0.0.1", d.addr()).await, header).await;
    assert_eq!(got, "hello");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_on_the_client_address_uses_the_client_the_header_names() {
    let backends = [named("a").await, named("b").await, named("c").await];
    let (d, _admin) = tcp_proxy(
        &backends,
        &[
            "--strategy",
            "hash",
            "--hash-key",
            "client-ip",
            "--proxy-protocol-from",
            "127.0.0.1",
        ],
    )
    .await;
    let mut seen = std::collections::BTreeSet::new();
    for client in 2..12 {
        let header = format!("PROXY TCP4 198.51.100.{client} 10.0.0.1 5000 80\r\n");
        let once = || async {
            send_and_read(connect_from("127.0.0.1", d.addr()).await, header.as_bytes()).await
        };
        let first = once().await;
        for _ in 0..3 {
            assert_eq!(once().await, first, "client 198.51.100.{client}");
        }
        seen.insert(first);
    }
    // One sender, ten clients named: spread as ten clients would be.
    assert!(seen.len() >= 2, "{seen:?}");
}

// ---------------------------------------------------------------------------------------
// The access log: a JSON line per connection
// ---------------------------------------------------------------------------------------

/// The JSON lines of the log at `path`, once there are `n` (written as connections end).
async fn log_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let read = || {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
            .collect::<Vec<serde_json::Value>>()
    };
    let complete = wait_until_async(PATIENCE, || async { read().len() >= n }).await;
    assert!(complete, "{:?}", read());
    read()
}

/// `tcp_proxy` with `extra` flags and a JSON access log in a directory of its own
/// (`tag`); the log's path.
async fn logged_tcp_proxy(
    tag: &str,
    backends: &[SocketAddr],
    extra: &[&str],
) -> (DroverProcess, PathBuf) {
    let path = temp_dir(tag).join("tcp.log");
    let mut flags = extra.to_vec();
    flags.extend([
        "--access-log",
        "json",
        "--access-log-path",
        path.to_str().unwrap(),
    ]);
    let (d, _admin) = tcp_proxy(backends, &flags).await;
    (d, path)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_access_log_line_per_connection_says_its_bytes_and_endpoint() {
    let backend = answers_after_the_end().await;
    let (d, path) = logged_tcp_proxy("tcp-access-log", &[backend], &[]).await;
    for (from, sent) in [("127.0.0.7", 5), ("127.0.0.8", 70_000)] {
        let got = send_and_read(connect_from(from, d.addr()).await, &vec![b'a'; sent]).await;
        assert!(got.starts_with(&format!("got {sent} bytes\n")));
    }
    let lines = log_lines(&path, 2).await;
    for (line, (client, received)) in lines.iter().zip([("127.0.0.7", 5), ("127.0.0.8", 70_000)]) {
        let answer = format!("got {received} bytes\n").len() + 1_000_000;
        assert_eq!(line["client"], client, "{line}");
        assert_eq!(line["endpoint"], backend.to_string(), "{line}");
        assert_eq!(line["bytes_received"], received, "{line}");
        assert_eq!(line["bytes_sent"], answer, "{line}");
        assert_eq!(line["end"], "done", "{line}");
        assert_eq!(line["retries"], 0, "{line}");
        assert!(line["error"].is_null(), "{line}");
        assert!(
            line["connect_ms"].is_number() && line["duration_ms"].is_number(),
            "{line}"
        );
        assert!(line["time"].as_str().unwrap().ends_with('Z'), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_no_backend_takes_is_logged_with_its_cause() {
    let (d, path) =
        logged_tcp_proxy("tcp-access-log-unserved", &[dead_port(), dead_port()], &[]).await;
    assert_eq!(read_from("127.0.0.7", d.addr()).await, "");
    let lines = log_lines(&path, 1).await;
    let line = &lines[0];
    assert_eq!(line["client"], "127.0.0.7", "{line}");
    assert!(
        line["endpoint"].is_null() && line["connect_ms"].is_null(),
        "{line}"
    );
    assert_eq!(line["end"], "unserved", "{line}");
    assert_eq!(line["error"], "connect-failed", "{line}");
    // Two backends, both tried: one retry.
    assert_eq!(line["retries"], 1, "{line}");
    assert_eq!(
        (line["bytes_received"].as_u64(), line["bytes_sent"].as_u64()),
        (Some(0), Some(0))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_a_proxy_header_names_is_the_one_logged() {
    let backend = echo().await;
    let (d, path) = logged_tcp_proxy(
        "tcp-access-log-proxy",
        &[backend],
        &["--proxy-protocol-from", "127.0.0.1"],
    )
    .await;
    let header = b"PROXY TCP4 198.51.100.4 10.0.0.1 5000 80\r\nhello";
    let got = send_and_read(connect_from("127.0.0.1", d.addr()).await, header).await;
    assert_eq!(got, "hello");
    let lines = log_lines(&path, 1).await;
    assert_eq!(lines[0]["client"], "198.51.100.4");
    // The header is not the client's: only what followed it counts.
    assert_eq!(lines[0]["bytes_received"], 5);
    assert_eq!(lines[0]["bytes_sent"], 5);
}

// ---------------------------------------------------------------------------------------
// Placement: hash on the client address, max_conns and its queue, health checks
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hash_on_the_client_address_keeps_each_client_on_one_backend() {
    let backends = [named("a").await, named("b").await, named("c").await];
    let (d, _admin) = tcp_proxy(
        &backends,
        &["--strategy", "hash", "--hash-key", "client-ip"],
    )
    .await;
    let mut seen = std::collections::BTreeSet::new();
    for client in 2..12 {
        let from = format!("127.0.0.{client}");
        let first = read_from(&from, d.addr()).await;
        for _ in 0..4 {
            assert_eq!(read_from(&from, d.addr()).await, first, "client {from}");
        }
        seen.insert(first);
    }
    // Ten clients over three backends: not all on one (Maglev spreads keys).
    assert!(seen.len() >= 2, "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_conns_queues_connections_and_a_full_queue_closes_them() {
    let backend = echo().await;
    let (d, admin) = tcp_proxy(&[backend], &["--max-conns", "1"]).await;
    let mut first = TcpStream::connect(d.addr()).await.unwrap();
    first.write_all(b"1").await.unwrap();
    let mut one = [0u8; 1];
    first.read_exact(&mut one).await.unwrap();
    // The second waits in drover's queue for the first's slot: nothing comes back yet.
    let mut second = TcpStream::connect(d.addr()).await.unwrap();
    second.write_all(b"2").await.unwrap();
    assert!(
        wait_until_async(PATIENCE, || async {
            metrics_text(admin)
                .await
                .contains("drover_queue_depth{balancer=\"default\"} 1")
        })
        .await
    );
    assert_eq!(open_connections(admin).await, 1);
    let (code, text, err) = common::ctl(admin, &["status"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(text.contains("(p2c, tcp)"), "{text}");
    drop(first);
    tokio::time::timeout(PATIENCE, second.read_exact(&mut one))
        .await
        .expect("the queued connection was relayed once the first closed")
        .unwrap();
    assert_eq!(one[0], b'2');
    drop(second);

    let (d, admin) = tcp_proxy(&[backend], &["--max-conns", "1", "--queue-max", "0"]).await;
    let mut held = TcpStream::connect(d.addr()).await.unwrap();
    held.write_all(b"1").await.unwrap();
    held.read_exact(&mut one).await.unwrap();
    assert_eq!(read_from("127.0.0.1", d.addr()).await, "");
    assert_eq!(
        metric(admin, "drover_tcp_unserved_total", ",cause=\"queue-full\"").await,
        1
    );
}

/// Waits until the first balancer's health checks mark `addr` down.
async fn wait_down(admin: SocketAddr, addr: SocketAddr) {
    let down = wait_until_async(PATIENCE, || async {
        status(admin).await.balancers[0]
            .endpoints
            .iter()
            .any(|e| e.addr == addr.to_string() && !e.healthy)
    })
    .await;
    assert!(down, "{addr} never marked down");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tcp_health_check_takes_a_dead_backend_out_before_any_client_meets_it() {
    let (dead, live) = (dead_port(), echo().await);
    let (d, admin) = tcp_proxy(
        &[dead, live],
        &["--health-tcp", "--health-interval", "100ms", "--fall", "1"],
    )
    .await;
    wait_down(admin, dead).await;
    for i in 0..10 {
        let data = format!("hi {i}");
        assert_eq!(round_trip(d.addr(), data.as_bytes()).await, data.as_bytes());
    }
    assert_eq!(
        metric(admin, "drover_retries_total", ",cause=\"connect-failed\"").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_and_receive_check_takes_out_a_backend_that_answers_wrong() {
    // Both accept connections; only one answers PING with +PONG.
    let (wrong, right) = (echo().await, named("+PONG").await);
    let (d, admin) = tcp_proxy(
        &[wrong, right],
        &[
            &REDIS_CHECK[..5],
            &["--health-interval", "100ms", "--health-timeout", "200ms"],
            &["--fall", "1"],
        ]
        .concat(),
    )
    .await;
    wait_down(admin, wrong).await;
    let s = status(admin).await;
    assert!(s.balancers[0]
        .endpoints
        .iter()
        .any(|e| e.addr == right.to_string() && e.healthy));
    for _ in 0..10 {
        assert_eq!(read_from("127.0.0.1", d.addr()).await, "+PONG");
    }
}

// ---------------------------------------------------------------------------------------
// Reload and shutdown
// ---------------------------------------------------------------------------------------

fn tcp_file(backend: SocketAddr, listen: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[balancer]]\nlisten = \"{listen}\"\nmode = \"tcp\"\nthreads = 1\nslow_start = \"0s\"\nbackends = [\"{backend}\"]\n"
    )
}

/// Writes `b` on `s` and reads it back from the echo behind.
async fn echoes(s: &mut TcpStream, b: u8) -> bool {
    let mut one = [0u8; 1];
    s.write_all(&[b]).await.is_ok()
        && matches!(
            tokio::time::timeout(PATIENCE, s.read_exact(&mut one)).await,
            Ok(Ok(_))
        )
        && one[0] == b
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_sends_new_connections_to_the_new_backends_and_leaves_open_ones_running() {
    let (old, new) = (echo().await, named("new").await);
    let path = temp_dir("tcp-reload").join("drover.toml");
    // A fixed address, written the same in both files: the listener is kept.
    let listen = dead_port().to_string();
    std::fs::write(&path, tcp_file(old, &listen)).unwrap();
    let d = DroverProcess::spawn(bin(), &["proxy", "--config", path.to_str().unwrap()]).await;
    let admin = admin_addr(&d).await;
    let mut open = TcpStream::connect(d.addr()).await.unwrap();
    assert!(echoes(&mut open, 1).await);

    // Same listen address, new backend.
    std::fs::write(&path, tcp_file(new, &listen)).unwrap();
    let (code, out, err) = common::ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    assert_eq!(read_from("127.0.0.1", d.addr()).await, "new");
    // The connection placed before goes on to the old backend.
    assert!(echoes(&mut open, 2).await);

    // The mode is the listener's for good: a reload to HTTP is refused, nothing changes.
    let http = tcp_file(old, &listen).replace("mode = \"tcp\"\n", "");
    std::fs::write(&path, http).unwrap();
    let (code, _, err) = common::ctl(admin, &["reload"]).await;
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("mode changed from tcp to http"), "{err}");
    assert!(err.contains("nothing was reloaded"), "{err}");
    assert_eq!(read_from("127.0.0.1", d.addr()).await, "new");

    // SIGTERM: no new connection, the open one still relayed; drover exits once it ends.
    d.signal("TERM").unwrap();
    assert!(
        wait_until_async(PATIENCE, || async {
            TcpStream::connect(d.addr()).await.is_err()
        })
        .await
    );
    assert!(echoes(&mut open, 3).await);
    assert!(
        d.try_exit_status().is_none(),
        "drover left before the connection ended"
    );
    drop(open);
    let exit = d
        .wait_exit(PATIENCE)
        .await
        .expect("drover exits once drained");
    assert!(exit.success());
}
