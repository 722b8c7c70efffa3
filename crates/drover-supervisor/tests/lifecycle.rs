//! Workers start, serve, get replaced after kill -9, and leave nothing behind.

mod common;

use common::*;
use drover_supervisor::{Stream, Supervisor, WorkerState};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_become_ready_with_distinct_ports_and_their_env() {
    let pool = pool("web");
    let mut spec = python_app("web", 3);
    spec.env.insert("EXTRA".into(), "from-spec".into());
    // A PORT in the spec must not override the one drover picked.
    spec.env.insert("PORT".into(), "1".into());
    let (sink, lines) = collecting_sink();
    let sup = Supervisor::start_with_output(spec, pool.clone(), sink).unwrap();
    assert!(
        sup.wait_ready(Duration::from_secs(15)).await,
        "{:?}",
        sup.status()
    );

    let status = sup.status();
    let ports: BTreeSet<u16> = status.iter().map(|w| w.port.unwrap()).collect();
    assert_eq!(ports.len(), 3, "ports must be distinct: {status:?}");
    let expected: Vec<SocketAddr> = ports
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect();
    assert_eq!(pool_addrs(&pool), expected);

    for w in &status {
        assert_eq!(w.app, "web");
        assert_eq!(w.restarts, 0);
        assert!(w.uptime.is_some() && w.pid.is_some());
        let addr = SocketAddr::from(([127, 0, 0, 1], w.port.unwrap()));
        let body = get(addr, "/").await;
        assert!(
            body.contains(&format!("\"port\": {}", w.port.unwrap())),
            "{body}"
        );
        assert!(
            body.contains(&format!("\"worker\": \"{}\"", w.id)),
            "{body}"
        );
        assert!(body.contains("\"app\": \"web\""), "{body}");
        assert!(
            body.contains(&format!("\"pid\": {}", w.pid.unwrap())),
            "{body}"
        );
        assert!(body.contains("\"extra\": \"from-spec\""), "{body}");
    }

    // Output arrives prefixed with app and worker id, from both pipes.
    let has = |stream: Stream, text: &str| {
        lines
            .lock()
            .unwrap()
            .iter()
            .any(|(s, l)| *s == stream && l == text)
    };
    assert!(
        eventually(Duration::from_secs(20), || {
            (0..3).all(|id| {
                has(
                    Stream::Stdout,
                    &format!("[web/{id}] hello from worker {id}"),
                ) && has(
                    Stream::Stderr,
                    &format!("[web/{id}] stderr from worker {id}"),
                )
            })
        })
        .await,
        "{:?}",
        lines.lock().unwrap()
    );
    sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_removes_restarts_and_readds_the_worker() {
    let pool = pool("k9");
    let sup = Supervisor::start(python_app("k9", 2), pool.clone()).unwrap();
    assert!(
        sup.wait_ready(Duration::from_secs(15)).await,
        "{:?}",
        sup.status()
    );
    // Let it serve past min_uptime (500 ms) so the exit is not counted as a crash.
    tokio::time::sleep(Duration::from_millis(600)).await;
    let before = sup.status();
    let (victim, bystander) = (&before[0], &before[1]);
    let old_addr = SocketAddr::from(([127, 0, 0, 1], victim.port.unwrap()));
    let old_pid = victim.pid.unwrap();

    kill9(old_pid);
    // Out of the pool once the exit is seen (the bound is a safety net, not a speed).
    assert!(
        eventually(Duration::from_secs(20), || pool.find(old_addr).is_none()).await,
        "{:?}",
        sup.status()
    );

    assert!(
        eventually(Duration::from_secs(10), || {
            let w = &sup.status()[0];
            w.state == WorkerState::Ready && w.restarts == 1
        })
        .await,
        "{:?}",
        sup.status()
    );
    let after = sup.status();
    let new = &after[0];
    assert_ne!(new.pid, Some(old_pid));
    assert!(
        new.last_exit.as_deref().unwrap().contains("signal: 9"),
        "{new:?}"
    );
    assert_eq!(new.crash_streak, 0, "it served longer than min_uptime");
    let new_addr = SocketAddr::from(([127, 0, 0, 1], new.port.unwrap()));
    assert!(pool.find(new_addr).is_some());
    assert_eq!(pool.endpoints().len(), 2);
    get(new_addr, "/health").await;
    assert!(!process_exists(old_pid), "killed worker was not reaped");

    // The other worker was left alone.
    assert_eq!(after[1].pid, bystander.pid);
    assert_eq!(after[1].restarts, 0);
    sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_everything_including_workers_that_ignore_sigterm() {
    let pool = pool("down");
    let polite = Supervisor::start(python_app("down", 2), pool.clone()).unwrap();
    let mut stubborn_spec = python_app("stubborn", 1);
    stubborn_spec.env.insert("IGNORE_TERM".into(), "1".into());
    stubborn_spec.stop_timeout = Duration::from_millis(300);
    let stubborn_pool = common::pool("stubborn");
    let stubborn = Supervisor::start(stubborn_spec, stubborn_pool.clone()).unwrap();
    assert!(polite.wait_ready(Duration::from_secs(15)).await);
    assert!(stubborn.wait_ready(Duration::from_secs(15)).await);

    let pids: Vec<u32> = polite
        .status()
        .iter()
        .chain(stubborn.status().iter())
        .map(|w| w.pid.unwrap())
        .collect();
    assert_eq!(pids.len(), 3);
    assert!(pids.iter().all(|&p| process_exists(p)));

    // SIGTERM is enough for the polite ones; the stubborn one, which would outlive any
    // wait for it, is SIGKILLed after its 300 ms stop timeout, so shutdown returns (the
    // bound is a safety net, not a speed) but not before that timeout.
    let started = Instant::now();
    let both = async { tokio::join!(polite.shutdown(), stubborn.shutdown()) };
    assert!(
        tokio::time::timeout(Duration::from_secs(20), both)
            .await
            .is_ok(),
        "shutdown never returned: {:?} {:?}",
        polite.status(),
        stubborn.status()
    );
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "the stubborn worker was not given its stop timeout: {:?}",
        started.elapsed()
    );
    for pid in &pids {
        assert!(
            !process_exists(*pid),
            "pid {pid} survived shutdown (or is a zombie)"
        );
    }
    assert!(pool.endpoints().is_empty() && stubborn_pool.endpoints().is_empty());

    // Nothing restarts afterwards, and a second shutdown is harmless.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for w in polite.status().iter().chain(stubborn.status().iter()) {
        assert_eq!(w.state, WorkerState::Stopped, "{w:?}");
        assert_eq!(w.pid, None);
    }
    polite.shutdown().await;
    assert!(pool.endpoints().is_empty());
}
