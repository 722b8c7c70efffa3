//! drover under a descriptor limit smaller than its clients: connections past what
//! the limit allows wait in the kernel's listen backlog, and the descriptors go round.

mod common;

use common::bin;
use drover_testkit::{DroverProcess, HttpClient};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// 150 keep-alive clients that each send request after request, through a drover
/// started under `ulimit -n 256` (room for 64 client connections): every client is
/// answered. Before, the first 64 connections kept their descriptors for as long as
/// their clients sent, and the other 86 waited in the backlog, unanswered, as long as
/// the load lasted (under `ulimit -n 1024`, 1,550 of 2,000 clients for 15 s); now a
/// keep-alive connection closes after its response while others wait, and its client
/// joins the line again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_past_the_descriptor_limit_are_each_answered_in_turn() {
    let backends = drover_testkit::backends(1).await;
    let backend = backends[0].addr().to_string();
    let script = "ulimit -n 256 && exec \"$0\" \"$@\"";
    let args = [
        "-c",
        script,
        &bin().display().to_string(),
        "proxy",
        "--listen",
        "127.0.0.1:0",
        "--threads",
        "1",
        "--backend",
        &backend,
    ];
    let d = DroverProcess::spawn(Path::new("/bin/sh"), &args).await;
    let addr = d.addr();
    const CLIENTS: usize = 150;
    let answered = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let answered = Arc::clone(&answered);
        tasks.push(tokio::spawn(async move {
            let mut mine = 0usize;
            let mut conn: Option<HttpClient> = None;
            // Each client goes on sending until every client has been answered.
            while answered.load(Relaxed) < CLIENTS && Instant::now() < deadline {
                let c = match conn.as_mut() {
                    Some(c) => c,
                    None => match HttpClient::connect(addr).await {
                        Ok(c) => conn.insert(c),
                        Err(_) => {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    },
                };
                let left = deadline.saturating_duration_since(Instant::now());
                match tokio::time::timeout(left, c.request("GET", "/", &[], None)).await {
                    Ok(Ok(r)) if r.status == 200 => {
                        mine += 1;
                        if mine == 1 {
                            answered.fetch_add(1, Relaxed);
                        }
                    }
                    // Closed after its answer (or refused): connect again.
                    _ => conn = None,
                }
            }
            mine
        }));
    }
    let mut unanswered = 0;
    for t in tasks {
        if t.await.unwrap() == 0 {
            unanswered += 1;
        }
    }
    assert_eq!(
        unanswered,
        0,
        "{unanswered} of {CLIENTS} clients never answered\n{}",
        d.stderr_text()
    );
}
