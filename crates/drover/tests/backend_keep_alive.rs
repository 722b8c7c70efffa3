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
    let answer = raw_exchange(
        at,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await
    .unwrap();
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
