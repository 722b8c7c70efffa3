//! Request forms a client may send that the backend must see in its own: here, HTTP/1.0
//! without Host, to a backend that holds HTTP/1.1 to its rules. (The absolute form,
//! `GET http://host/path`: routes.rs, as it decides the route.)
//!
//! HTTP/1.0 lets a request name no host (`openssl s_time`, HAProxy's default
//! `option httpchk`, old monitoring scripts). drover sends every request on as HTTP/1.1,
//! to keep the backend connection for the next one, and HTTP/1.1 must name a host: Node
//! (since 20) and nginx answer 400 to one that does not. So drover names the address the
//! client reached, where nginx names its upstream.

mod common;

use common::proxy;
use drover_testkit::{parse_status, raw_exchange};
use std::net::SocketAddr;
use tokio::process::{Child, Command};

/// Node's own HTTP server (it refuses an HTTP/1.1 request without Host): it answers the
/// Host it was sent and how many connections it has accepted so far.
const NODE_SERVER: &str = r#"
let connections = 0;
const server = require('http').createServer((req, res) => {
  res.end(`host=${req.headers.host} connections=${connections}`);
});
server.on('connection', () => connections++);
server.listen(0, '127.0.0.1', () => console.log(`listening ${server.address().port}`));
"#;

async fn node_server() -> (Child, SocketAddr) {
    let mut cmd = Command::new("node");
    cmd.args(["-e", NODE_SERVER]);
    common::node_listening(cmd).await
}

/// Twenty HTTP/1.0 requests without Host, each on a connection of its own, all answered
/// by Node over one pooled backend connection; one that names a host keeps it.
#[tokio::test]
async fn http10_requests_without_host_reach_a_node_backend_over_one_kept_connection() {
    let (_node, backend) = node_server().await;
    let d = proxy(&[backend], &[]).await;
    let mut last = String::new();
    for i in 0..20 {
        let answer = raw_exchange(d.addr(), b"GET / HTTP/1.0\r\n\r\n")
            .await
            .unwrap();
        let text = String::from_utf8_lossy(&answer).into_owned();
        assert_eq!(parse_status(&answer), Some(200), "request {i}: {text}");
        assert!(text.to_lowercase().contains("connection: close"), "{text}");
        last = text;
    }
    let want = format!("host={} connections=1", d.addr());
    assert!(
        last.ends_with(&want),
        "the backend saw another host, or a connection per request: {last}"
    );
    let answer = raw_exchange(d.addr(), b"GET / HTTP/1.0\r\nHost: app.test\r\n\r\n")
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&answer);
    assert!(text.ends_with("host=app.test connections=1"), "{text}");
}
