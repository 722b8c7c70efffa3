//! `drover run --mode handoff`: drover hands each new client connection to the Node
//! worker least behind, which then serves it directly (no per-request hop). Driven with
//! a Node app that hard-codes its port and reports, per answer, its pid and the client
//! port it sees.

mod common;

use common::examples::{clean_env, drover_stops_cleanly};
use common::{admin_addr, bin, ctl, serving_pids, status, wait_all_serving};
use drover_testkit::{spawn_ready_line, wait_until_async, ChildProcess, HttpClient};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn conns_app() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/node_as_written/conns.js")
        .display()
        .to_string()
}

async fn handoff(workers: usize) -> (ChildProcess, SocketAddr) {
    handoff_with("node", workers, &[]).await
}

/// `extra` after the app: `{port}` makes it listen on its PORT, as apps that read it
/// do (drover then gives it a socket bound there rather than accepting for it).
async fn handoff_with(node: &str, workers: usize, extra: &[&str]) -> (ChildProcess, SocketAddr) {
    let mut cmd = Command::new(bin());
    cmd.args(["run", "-w", &workers.to_string(), "--mode", "handoff"])
        .args("--listen 127.0.0.1:0 --admin 127.0.0.1:0 --threads 1 --".split(' '))
        .args([node, &conns_app()])
        .args(extra);
    clean_env(&mut cmd);
    let d = spawn_ready_line(cmd, "\"default\" listening on ").await;
    let admin = admin_addr(&d).await;
    wait_all_serving(&d, admin).await;
    (d, admin)
}

/// One GET on a new connection: the answer's fields, and the client's own port.
async fn ask(addr: SocketAddr, path: &str) -> std::io::Result<(serde_json::Value, u16)> {
    let mut c = HttpClient::connect(addr).await?;
    c.set_timeout(Duration::from_secs(20));
    let port = c.local_addr()?.port();
    let r = c.request("GET", path, &[], None).await?;
    if r.status != 200 {
        return Err(std::io::Error::other(format!("{} {}", r.status, r.text())));
    }
    let body = serde_json::from_str(&r.text()).map_err(std::io::Error::other)?;
    Ok((body, port))
}

#[tokio::test]
async fn connections_go_straight_to_the_workers_and_spread_evenly() {
    // On every Node of `node_binaries` (the machine's and Debian's 18), with a port in
    // the code and with PORT.
    for (_, node) in common::node_binaries() {
        for extra in [&[][..], &["{port}"][..]] {
            straight_and_even(&node.display().to_string(), extra).await;
        }
    }
}

async fn straight_and_even(node: &str, extra: &[&str]) {
    let (d, _) = handoff_with(node, 2, extra).await;
    let mut per_pid: BTreeMap<u64, usize> = BTreeMap::new();
    for _ in 0..200 {
        let (body, port) = ask(d.addr(), "/").await.unwrap();
        // No hop: the worker sees the client's own connection.
        assert_eq!(body["remotePort"], port, "{body}");
        *per_pid.entry(body["pid"].as_u64().unwrap()).or_default() += 1;
    }
    assert_eq!(per_pid.len(), 2, "{per_pid:?}");
    for n in per_pid.values() {
        assert!((90..=110).contains(n), "not within 45-55 %: {per_pid:?}");
    }
    let metrics = drover_testkit::HttpClient::connect(admin_addr(&d).await)
        .await
        .unwrap()
        .get("/metrics")
        .await
        .text();
    assert!(
        metrics.lines().any(
            |l| l.starts_with("drover_handoffs_total{balancer=\"default\"} ")
                && l.split(' ').nth(1).unwrap().parse::<u64>().unwrap() >= 200
        ),
        "{metrics}"
    );
    drover_stops_cleanly("handoff", &d).await;
}

#[tokio::test]
async fn a_busy_worker_gets_fewer_new_connections_than_an_idle_one() {
    let (d, _) = handoff(2).await;
    let addr = d.addr();
    // One worker spins for 3 s on the first connection.
    let spin = tokio::spawn(async move { ask(addr, "/spin?ms=3000").await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut asks = Vec::new();
    for _ in 0..20 {
        asks.push(tokio::spawn(async move { ask(addr, "/").await.unwrap().0 }));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let busy = spin.await.unwrap().0["pid"].as_u64().unwrap();
    let mut to_busy = 0;
    for a in asks {
        if a.await.unwrap()["pid"].as_u64().unwrap() == busy {
            to_busy += 1;
        }
    }
    // The busy worker takes up no connection while it spins; at most the one given
    // before drover saw it fall behind reaches it.
    assert!(
        to_busy <= 2,
        "{to_busy} of 20 new connections went to the busy worker\n{}",
        d.stderr_text()
    );
    drover_stops_cleanly("handoff", &d).await;
}

#[tokio::test]
async fn reload_and_scale_under_load_fail_no_request() {
    let (d, admin) = handoff(2).await;
    let addr = d.addr();
    let stop = Arc::new(AtomicBool::new(false));
    // Clients that open a connection per request, as the posts' load tests do.
    let load: Vec<_> = (0..4)
        .map(|_| {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut ok, mut failed) = (0, Vec::new());
                while !stop.load(Ordering::Relaxed) {
                    match ask(addr, "/").await {
                        Ok(_) => ok += 1,
                        Err(e) => failed.push(e.to_string()),
                    }
                }
                (ok, failed)
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let first = serving_pids(&status(admin).await);

    let (code, out, err) = ctl(admin, &["reload"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    let replaced = wait_until_async(Duration::from_secs(20), || async {
        let now = serving_pids(&status(admin).await);
        now.iter().all(|p| p.is_some() && !first.contains(p))
    })
    .await;
    assert!(replaced, "{}", d.stderr_text());

    let (code, out, err) = ctl(admin, &["scale", "3"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    let three = wait_until_async(Duration::from_secs(20), || async {
        let pids = serving_pids(&status(admin).await);
        pids.len() == 3 && pids.iter().all(Option::is_some)
    })
    .await;
    assert!(three, "{}", d.stderr_text());
    let (code, out, err) = ctl(admin, &["scale", "1"]).await;
    assert_eq!(code, 0, "{out}{err}\n{}", d.stderr_text());
    tokio::time::sleep(Duration::from_millis(500)).await;

    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut failed) = (0, Vec::new());
    for l in load {
        let (o, f) = l.await.unwrap();
        ok += o;
        failed.extend(f);
    }
    assert!(ok > 50, "too little load: {ok}");
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}\n{}",
        failed.len(),
        ok + failed.len(),
        &failed[..failed.len().min(5)],
        d.stderr_text()
    );
    drover_stops_cleanly("handoff", &d).await;
}

#[tokio::test]
async fn a_burst_of_connections_at_a_busy_worker_is_all_served() {
    let (d, _) = handoff(1).await;
    let addr = d.addr();
    let spin = tokio::spawn(async move { ask(addr, "/spin?ms=500").await.unwrap() });
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The worker, busy, takes up none: once it has stalled, drover serves the rest
    // itself (proxied through the worker's port), and every one is answered.
    let burst: Vec<_> = (0..100)
        .map(|_| tokio::spawn(async move { ask(addr, "/").await }))
        .collect();
    let mut direct = 0;
    for b in burst {
        let (body, port) = b
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{e}\n{}", d.stderr_text()));
        if body["remotePort"] == port {
            direct += 1;
        }
    }
    spin.await.unwrap();
    assert!(direct > 0, "handed {direct} of 100");
    drover_stops_cleanly("handoff", &d).await;
}
