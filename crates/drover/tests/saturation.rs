//! The learned limit holds requests in drover only while a worker's CPU is saturated:
//! `drover run` measures each worker's main thread, so CPU-bound workers get a few
//! requests at a time (the rest wait in drover, for whichever worker frees first) and
//! I/O-bound ones get every request at once. Counted at the workers, through the real
//! binary and real Node workers.

mod common;

use common::{admin_addr, assert_load_never_failed, bin, status, steady_load, stops_cleanly};
use drover_testkit::{DroverProcess, HttpClient};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

/// `drover run -w 2` of the fixture worker, one serving thread, admin on a free port.
async fn run_workers() -> (DroverProcess, SocketAddr) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/saturation/server.js");
    let script = script.display().to_string();
    let args = [
        "run",
        "-w",
        "2",
        "-t",
        "1",
        "-l",
        "127.0.0.1:0",
        "--admin",
        "127.0.0.1:0",
        "--",
        "node",
        &script,
    ];
    let d = DroverProcess::spawn(bin(), &args).await;
    let admin = admin_addr(&d).await;
    (d, admin)
}

/// The workers' own ports, once both are ready.
async fn worker_ports(admin: SocketAddr) -> Vec<u16> {
    for _ in 0..300 {
        let s = status(admin).await;
        let ws = &s.apps[0].workers;
        if ws.len() == 2 && ws.iter().all(|w| w.state == "ready") {
            return ws.iter().map(|w| w.port.unwrap()).collect();
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("workers never ready");
}

/// Asks each worker directly for `path` (`/stats` or `/reset`); the stats' most
/// requests held at once, per worker.
async fn ask_workers(ports: &[u16], path: &str) -> Vec<u64> {
    let mut out = Vec::new();
    for port in ports {
        let mut c = HttpClient::connect(SocketAddr::from(([127, 0, 0, 1], *port)))
            .await
            .unwrap();
        let r = c.request("GET", path, &[], None).await.unwrap();
        let v: serde_json::Value = serde_json::from_str(&r.text()).unwrap_or_default();
        out.push(v["max_in_flight"].as_u64().unwrap_or(0));
    }
    out
}

#[tokio::test]
async fn cpu_bound_workers_are_held_back_and_io_bound_ones_are_not() {
    let (d, admin) = run_workers().await;
    let addr = d.addr();
    let ports = worker_ports(admin).await;

    // I/O-bound: 40 requests that each wait 1.5 s on a timer, all at once from a fresh
    // start. Nothing is saturated, so all 40 are at the workers together.
    let stop = Arc::new(AtomicBool::new(false));
    let io = steady_load(addr, 40, "/io?ms=1500", stop.clone());
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let s = status(admin).await;
    let held = ask_workers(&ports, "/stats").await;
    assert_eq!(
        held.iter().sum::<u64>(),
        40,
        "I/O-bound: held at once {held:?}"
    );
    for e in &s.balancers[0].endpoints {
        assert_eq!(e.limit, 0, "no limit while not saturated: {e:?}");
        // ...and the status says why, beside the limit it has learned.
        assert_eq!(e.limit_reason, "not-saturated", "{e:?}");
        assert!(e.learned_limit > 0, "{e:?}");
        assert!(e.load < 0.5, "an idle event loop reads as idle: {e:?}");
    }
    assert_load_never_failed(&stop, io, 40, "with I/O-bound workers").await;

    // CPU-bound: 16 connections of 30 ms busy loops keep both event loops saturated.
    // After a second to see it, each worker holds a few requests at a time; the rest
    // wait in drover (without the limit, each would hold about 8).
    ask_workers(&ports, "/reset").await;
    let stop = Arc::new(AtomicBool::new(false));
    let cpu = steady_load(addr, 16, "/cpu?ms=30", stop.clone());
    let mut limited = None;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let s = status(admin).await;
        let eps = &s.balancers[0].endpoints;
        if eps
            .iter()
            .all(|e| e.limit > 0 && e.load >= 0.9 && e.limit_reason == "saturated")
        {
            limited = Some(eps.clone());
            break;
        }
    }
    let limited = limited.expect("both workers seen saturated and limited within 6 s");
    ask_workers(&ports, "/reset").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let held = ask_workers(&ports, "/stats").await;
    assert_load_never_failed(&stop, cpu, 16, "with CPU-bound workers").await;
    assert!(
        held.iter().all(|&n| n <= 5),
        "CPU-bound: each worker should hold a few requests at once, held {held:?} \
         (endpoints when limited: {limited:?})"
    );

    // The load is gone: no limit once the workers idle.
    let mut released = false;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let s = status(admin).await;
        if s.balancers[0].endpoints.iter().all(|e| e.limit == 0) {
            released = true;
            break;
        }
    }
    assert!(released, "the limit lifts once the workers are idle");
    stops_cleanly(d).await;
}
