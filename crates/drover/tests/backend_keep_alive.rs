//! How long drover reuses an idle backend connection: as long as the backend says it
//! keeps it (`Keep-Alive: timeout=N`, which Node sends), less a second; 4 s when it says
//! nothing. A connection dropped early is a new one the next time, and a Node worker
//! busy with CPU work reads its new connections last (see `upstream::KEEP_ALIVE_MARGIN`).

mod common;

use common::proxy;
use drover_testkit::{parse_status, raw_exchange};
use std::net::SocketAddr;
use std::time::Duration;
use tokio::process::{Child, Command};

/// Node's HTTP server with the keep-alive timeout given in ms (`process.argv[1]`),
/// answering how many connections it has accepted so far.
const NODE_SERVER: &str = r#"
let connections = 0;
const server = require('http').createServer((req, res) => res.end(`connections=${connections}`));
server.on('connection', () => connections++);
server.keepAliveTimeout = Number(process.argv[1]);
server.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
"#;

async fn node_server(keep_alive_ms: u32) -> (Child, SocketAddr) {
    let mut cmd = Command::new("node");
    cmd.args(["-e", NODE_SERVER, &keep_alive_ms.to_string()]);
    common::node_listening(cmd).await
}

/// What the backend answers through drover.
async fn connections_seen(at: SocketAddr) -> String {
    answer_through(at, "/").await
}

/// The body of `GET path` through drover, which must be a 200.
async fn answer_through(at: SocketAddr, path: &str) -> String {
    let request = format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n");
    let answer = raw_exchange(at, request.as_bytes()).await.unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    assert_eq!(parse_status(&answer), Some(200), "{text}");
    text.rsplit("\r\n\r\n")
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// A backend that keeps idle connections 30 s has its connection reused after 6 s
/// without traffic; one that keeps them Node's default 5 s gets a new one after 4.5 s,
/// and the request after the pause does not meet the backend closing the old one.
#[tokio::test]
async fn an_idle_backend_connection_is_reused_for_as_long_as_its_backend_keeps_it() {
    let ((_long, long), (_short, short)) = tokio::join!(node_server(30_000), node_server(5_000));
    let d_long = proxy(&[long], &[]).await;
    let d_short = proxy(&[short], &[]).await;
    assert_eq!(connections_seen(d_long.addr()).await, "connections=1");
    assert_eq!(connections_seen(d_short.addr()).await, "connections=1");
    tokio::time::sleep(Duration::from_millis(4_500)).await;
    assert_eq!(
        connections_seen(d_short.addr()).await,
        "connections=2",
        "kept 5 s by the backend: not reused after 4.5 s"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        connections_seen(d_long.addr()).await,
        "connections=1",
        "kept 30 s by the backend: reused after 6 s"
    );
}

/// A Node server whose requests burn CPU (`/cpu?us=N`, of the process's own CPU time),
/// keeping idle connections 60 s; `/connections` answers how many it has accepted.
const NODE_CPU_SERVER: &str = r#"
let connections = 0;
const cpuNs = () => { const u = process.cpuUsage(); return (u.user + u.system) * 1000; };
const server = require('http').createServer((req, res) => {
  if (req.url === '/connections') return res.end(String(connections));
  const end = cpuNs() + Number(new URL(req.url, 'http://x').searchParams.get('us')) * 1000;
  while (cpuNs() < end) {}
  res.end('ok');
});
server.on('connection', () => connections++);
server.keepAliveTimeout = 60_000;
server.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
"#;

/// Connections the backends have accepted so far, asked of each directly (the asking
/// connection included).
async fn accepted(backends: &[SocketAddr]) -> u64 {
    let mut total = 0;
    for &b in backends {
        let answer = raw_exchange(
            b,
            b"GET /connections HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
        )
        .await
        .unwrap();
        let text = String::from_utf8_lossy(&answer);
        total += text
            .rsplit("\r\n\r\n")
            .next()
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    total
}

/// Closed-loop load of unequal costs through drover: `clients` keep-alive connections.
async fn load(at: SocketAddr, clients: u32, secs: u32) {
    let out = Command::new(common::bin())
        .args([
            "bench",
            "--mix",
            "85:/cpu?us=400,15:/cpu?us=10000",
            "--json",
        ])
        .args([
            "-c",
            &clients.to_string(),
            "-d",
            &format!("{secs}s"),
            "--timeout",
            "30s",
        ])
        .arg(format!("http://{at}/"))
        .output()
        .await
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{report}");
    assert!(report.contains("\"errors_total\":0"), "{report}");
}

/// Under steady load, requests go out on the connections drover already holds: a busy
/// Node server accepts about one new connection per turn of its event loop, so a request
/// on a new one waits seconds (`strategy::common::NEW_CONNECTION_FACTOR`). 300 clients
/// over 4 CPU-bound backends keep ~75 requests in each. Balanced by pending work alone,
/// each backend's share moved, and drover opened 37-59 new connections into that wait
/// in 6 s (0-10 now); with 64 idle connections kept per backend, not 1024, the 44 let go
/// after the first run's last answers were opened again in the second.
#[tokio::test]
async fn steady_load_goes_out_on_the_backend_connections_drover_holds() {
    let mut servers = Vec::new();
    for _ in 0..4 {
        let mut cmd = Command::new("node");
        cmd.args(["-e", NODE_CPU_SERVER]);
        servers.push(common::node_listening(cmd).await);
    }
    let backends: Vec<SocketAddr> = servers.iter().map(|(_, a)| *a).collect();
    let d = proxy(&backends, &[]).await;
    load(d.addr(), 300, 4).await;
    let before = accepted(&backends).await;
    load(d.addr(), 300, 6).await;
    // Each count asked for is a connection of its own.
    let new = accepted(&backends).await - before - backends.len() as u64;
    eprintln!("{new} new backend connections in 6 s of steady load");
    assert!(
        new <= 24,
        "{new} new backend connections in 6 s of steady load through drover"
    );
}

/// A Node server (on `PORT`, else any port) that answers `/seen` with the connections it
/// has accepted and the `/health` probes it has answered.
const NODE_PROBED_SERVER: &str = r#"
let connections = 0, probes = 0;
const server = require('http').createServer((req, res) => {
  if (req.url === '/health') probes++;
  res.end(req.url === '/seen' ? `connections=${connections} probes=${probes}` : 'ok');
});
server.on('connection', () => connections++);
server.listen(Number(process.env.PORT || 0), '127.0.0.1', () => console.log(`listening ${server.address().port}`));
"#;

/// `(connections, probes)` the server behind `at` has seen, asked through drover (whose
/// own backend connection is one of them).
async fn probes_seen(at: SocketAddr) -> (u64, u64) {
    let seen = answer_through(at, "/seen").await;
    let number = |key: &str| -> u64 {
        seen.split(' ')
            .find_map(|kv| kv.strip_prefix(key))
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no {key} in {seen:?}"))
    };
    (number("connections="), number("probes="))
}

/// Waits for 15 more probes of the server behind `at` and asserts they opened at most
/// one connection, where a connection per probe waited behind a busy server's listen
/// queue (see `drover_registry::http_probe`). Counted from the first answer on, so the
/// connections of a worker's readiness checks and of drover's requests are not.
async fn assert_probes_share_a_connection(at: SocketAddr, what: &str) {
    let (connections_before, probes_before) = probes_seen(at).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (connections, probes) = probes_seen(at).await;
        if probes >= probes_before + 15 {
            let opened = connections - connections_before;
            assert!(
                opened <= 1,
                "{what}: {} probes opened {opened} connections",
                probes - probes_before
            );
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: {} probes in 20 s",
            probes - probes_before
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn health_probes_keep_their_connection_from_probe_to_probe() {
    let health = [
        "--health-path",
        "/health",
        "--health-interval",
        "100ms",
        "--health-timeout",
        "1s",
    ];
    let mut cmd = Command::new("node");
    cmd.args(["-e", NODE_PROBED_SERVER]);
    let (_server, backend) = common::node_listening(cmd).await;
    let d = proxy(&[backend], &health).await;
    assert_probes_share_a_connection(d.addr(), "drover proxy").await;

    // The liveness probes of the workers drover runs.
    let dir = common::temp_dir("probed-worker-js");
    let worker = dir.join("server.js");
    std::fs::write(&worker, NODE_PROBED_SERVER).unwrap();
    let toml = format!(
        "[[app]]\nname = \"web\"\ncommand = [\"node\", \"{}\"]\nworkers = 1\n\
         health = {{ path = \"/health\", interval = \"100ms\", timeout = \"1s\" }}\n\
         [admin]\nlisten = \"127.0.0.1:0\"\n\
         [[balancer]]\nlisten = \"127.0.0.1:0\"\nthreads = 1\nbackends = [\"app:web\"]\n",
        worker.display()
    );
    let (d, _, _) = common::up_serving("probed-worker", &toml).await;
    assert_probes_share_a_connection(d.addr(), "drover up").await;
}
