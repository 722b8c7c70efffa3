//! Issue 20, item 5: past what its descriptors allow, drover stops accepting and leaves
//! new connections in the kernel's listen backlog, as Node's cluster module does,
//! instead of accepting them and failing requests with `503 local-resources` when a
//! backend connection can no longer be opened.

mod common;

use common::{addrs, backends, proxy_with_nofile};
use drover_testkit::parse_status;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// drover's descriptor limit: room for 64 client connections (each with a backend
/// connection) beside what drover holds for itself.
const NOFILE: u32 = 256;
/// Concurrent requests, each on its own connection: several times what 256 descriptors
/// hold, and all within the kernel's listen backlog (1,024).
const CLIENTS: usize = 600;

/// Sends one GET on a new connection and returns its status and `drover-error`.
async fn one_request(addr: std::net::SocketAddr) -> String {
    let exchange = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(b"GET /delay/100 HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
            .await?;
        let mut answer = Vec::new();
        s.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(answer)
    };
    match tokio::time::timeout(Duration::from_secs(120), exchange).await {
        Ok(Ok(answer)) => {
            let text = String::from_utf8_lossy(&answer);
            let cause = text
                .lines()
                .find_map(|l| l.strip_prefix("drover-error: "))
                .unwrap_or("");
            format!("{:?} {cause}", parse_status(&answer))
        }
        Ok(Err(e)) => format!("error: {e}"),
        Err(_) => "no answer in 120 s".into(),
    }
}

/// No concurrency limit, so every accepted request opens a backend connection at once:
/// before backpressure, the first ~120 clients took every descriptor and the rest of
/// the burst got `503 local-resources`. Now every request is answered with a 200.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_past_the_descriptor_limit_waits_in_the_backlog_and_is_served() {
    let b = backends(2).await;
    let d = proxy_with_nofile(NOFILE, &addrs(&b), &["--max-conns", "0"]).await;
    let addr = d.addr();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(one_request(addr)))
        .collect();
    let mut outcomes = BTreeMap::new();
    for t in tasks {
        *outcomes.entry(t.await.unwrap()).or_insert(0usize) += 1;
    }
    assert_eq!(
        outcomes,
        BTreeMap::from([("Some(200) ".to_owned(), CLIENTS)]),
        "{}",
        d.stderr_text()
    );
    assert!(
        !d.lines_containing("not accepting new connections")
            .is_empty(),
        "the burst never reached the descriptor budget:\n{}",
        d.stderr_text()
    );
    assert!(
        d.lines_containing("out of resources").is_empty(),
        "{}",
        d.stderr_text()
    );
    // The backlog drained: drover accepts again at once.
    assert_eq!(one_request(addr).await, "Some(200) ");
}
