//! What a worker starts goes with it: the worker's whole process group is stopped when
//! the supervisor kills it for failing health checks, replaces it over `max_memory`, or
//! shuts down (issue 11, item 5). Each worker here is a shell wrapper that starts
//! `sleep 1000`, records its pid, and becomes the Python test worker.

mod common;

use common::*;
use drover_registry::HealthCheck;
use drover_supervisor::{AppSpec, Supervisor, WorkerState};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Dead, or a zombie nobody reaped yet (in a container the reaper may never do it).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_none_or(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

fn children(file: &Path) -> Vec<u32> {
    std::fs::read_to_string(file)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The Python worker behind a wrapper that leaves a child; returns the spec and the
/// file the children's pids go to.
fn forking_app(name: &str) -> (AppSpec, PathBuf) {
    let file = temp_dir().join("children");
    let mut spec = python_app(name, 1);
    let mut command = vec![
        "sh".to_string(),
        "-c".into(),
        r#"sleep 1000 & echo $! >> "$0"; exec "$@""#.into(),
        file.display().to_string(),
    ];
    command.append(&mut spec.command);
    spec.command = command;
    (spec, file)
}

async fn gone(pid: u32) -> bool {
    eventually(Duration::from_secs(10), || !alive(pid)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_kill_stops_what_the_worker_started() {
    let (mut spec, file) = forking_app("hung");
    let flag = temp_dir().join("hung-once");
    spec.env
        .insert("HANG_FLAG".into(), flag.to_string_lossy().into_owned());
    spec.health = Some(HealthCheck {
        interval: Duration::from_millis(100),
        timeout: Duration::from_millis(200),
        fall: 2,
        ..HealthCheck::http("/health")
    });
    spec.stop_timeout = Duration::from_secs(1);
    let sup = Supervisor::start(spec, pool("hung")).unwrap();
    // The first process hangs on its second /health and is killed; the second stays.
    assert!(
        eventually(Duration::from_secs(15), || {
            let w = &sup.status()[0];
            w.state == WorkerState::Ready && w.restarts == 1
        })
        .await,
        "{:?}",
        sup.status()
    );
    let kids = children(&file);
    assert_eq!(kids.len(), 2, "{kids:?}");
    assert!(
        !alive(kids[0]),
        "the health-killed worker's child {} was still running after its replacement started",
        kids[0]
    );
    sup.stop().await;
    assert!(gone(kids[1]).await, "shutdown left child {}", kids[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_replacement_stops_what_the_old_worker_started() {
    let (mut spec, file) = forking_app("big");
    // Every worker is over this at once: each is replaced about once a second.
    spec.max_memory = Some(1);
    let sup = Supervisor::start(spec, pool("big")).unwrap();
    assert!(
        eventually(Duration::from_secs(15), || children(&file).len() >= 2).await,
        "no replacement: {:?}",
        sup.status()
    );
    let first = children(&file)[0];
    assert!(
        gone(first).await,
        "the replaced worker's child {first} outlived it"
    );
    sup.stop().await;
    for pid in children(&file) {
        assert!(gone(pid).await, "shutdown left child {pid}");
    }
}
