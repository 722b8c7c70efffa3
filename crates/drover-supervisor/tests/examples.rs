//! The demo servers in examples/ run under the supervisor and drain on SIGTERM.

mod common;

use common::*;
use drover_supervisor::{AppSpec, Supervisor, Workers};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn example(file: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(file);
    path.to_string_lossy().into_owned()
}

async fn serves_and_drains(program: &str, file: &str) {
    let name = file.replace('.', "-");
    let mut spec = AppSpec::new(&name, vec![program.into(), example(file)]);
    spec.workers = Workers::Count(2);
    spec.ready_timeout = Duration::from_secs(10);
    // Long, so a quick shutdown proves the server exited on SIGTERM, not SIGKILL.
    spec.stop_timeout = Duration::from_secs(10);
    spec.health = Some(drover_registry::HealthCheck::http("/health"));
    let pool = pool(&name);
    let (sink, lines) = collecting_sink();
    let sup = Supervisor::start_with_output(spec, pool.clone(), sink).unwrap();
    assert!(
        sup.wait_ready(Duration::from_secs(15)).await,
        "{:?}",
        sup.status()
    );

    for w in sup.status() {
        let ep = std::net::SocketAddr::from(([127, 0, 0, 1], w.port.unwrap()));
        assert!(pool.find(ep).is_some());
        let body = get(ep, "/pi?iterations=1000").await.replace(' ', "");
        assert!(body.contains("\"iterations\":1000"), "{body}");
        // DROVER_WORKER_ID and the pid reach the app.
        assert!(body.contains(&format!("\"worker\":\"{}\"", w.id)), "{body}");
        assert!(
            body.contains(&format!("\"pid\":{}", w.pid.unwrap())),
            "{body}"
        );
        assert_eq!(get(ep, "/health").await, "ok");
        let expensive = get(ep, "/mixed?n=10").await.replace(' ', "");
        assert!(expensive.contains("\"kind\":\"expensive\""), "{expensive}");
        let cheap = get(ep, "/mixed?n=3").await.replace(' ', "");
        assert!(cheap.contains("\"iterations\":10000"), "{cheap}");
    }

    let pids: Vec<u32> = sup.status().iter().map(|w| w.pid.unwrap()).collect();
    let started = Instant::now();
    sup.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(pids.iter().all(|&p| !process_exists(p)));
    let drained = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(_, l)| l.contains("SIGTERM, draining"))
        .count();
    assert_eq!(drained, 2, "{:?}", lines.lock().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_pi_server() {
    serves_and_drains("node", "pi-server.js").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_pi_server() {
    serves_and_drains("python3", "pi-server.py").await;
}
