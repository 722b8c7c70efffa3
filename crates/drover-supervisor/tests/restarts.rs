//! Crash loops back off while healthy apps keep serving; hung workers are replaced.

mod common;

use common::*;
use drover_registry::HealthCheck;
use drover_supervisor::{
    AppSpec, ProgramError, RestartReason, SpecError, Supervisor, SupervisorError, WorkerState,
};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_loop_backs_off_and_others_keep_serving() {
    let ok_pool = pool("ok");
    let ok = Supervisor::start(python_app("ok", 1), ok_pool.clone()).unwrap();
    assert!(ok.wait_ready(Duration::from_secs(15)).await);
    let ok_pid = ok.status()[0].pid;

    let crash_pool = pool("crash");
    let mut spec = AppSpec::new("crash", vec!["sh".into(), "-c".into(), "exit 1".into()]);
    spec.restart = fast_backoff(); // 50 ms doubling, crash-looping after 3
    spec.ready_timeout = Duration::from_secs(5);
    let crash = Supervisor::start(spec, crash_pool.clone()).unwrap();

    // Record when each restart happens; the gaps are the back-off delays.
    let mut restart_times = vec![Instant::now()];
    let mut seen_looping = false;
    let deadline = Instant::now() + Duration::from_secs(10);
    while restart_times.len() < 5 && Instant::now() < deadline {
        let w = &crash.status()[0];
        seen_looping |= w.state == WorkerState::CrashLooping;
        if w.restarts as usize >= restart_times.len() {
            restart_times.push(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert_eq!(restart_times.len(), 5, "{:?}", crash.status());
    let gaps: Vec<Duration> = restart_times.windows(2).map(|w| w[1] - w[0]).collect();
    // Delays are 50, 100, 200, 400 ms, each gap also holds a short process life. Lower
    // bounds are exact; growth is checked end to end so a slow spawn under load does
    // not make the test flaky.
    for (gap, min_ms) in gaps[1..].iter().zip([100u64, 200, 400]) {
        assert!(*gap >= Duration::from_millis(min_ms * 9 / 10), "{gaps:?}");
    }
    assert!(
        gaps[3] > gaps[1].mul_f64(1.5),
        "back-off does not grow: {gaps:?}"
    );

    assert!(
        eventually(Duration::from_secs(3), || {
            let w = &crash.status()[0];
            seen_looping |= w.state == WorkerState::CrashLooping;
            seen_looping
        })
        .await,
        "{:?}",
        crash.status()
    );
    let w = &crash.status()[0];
    assert!(w.crash_streak >= 3, "{w:?}");
    assert_eq!(w.last_exit.as_deref(), Some("exit status: 1"));
    assert!(crash_pool.endpoints().is_empty());

    // Meanwhile the healthy app never noticed.
    let s = &ok.status()[0];
    assert_eq!(
        (s.state, s.pid, s.restarts),
        (WorkerState::Ready, ok_pid, 0)
    );
    assert_eq!(ok_pool.endpoints().len(), 1);

    crash.stop().await;
    ok.stop().await;
}

/// Workers that lose their database crash together and back off together. Here the
/// back-off is 20 s, so before, the app found its database back only when that ended.
/// While nothing of the app serves or starts, one worker at a time tries each second
/// (the app's scout); once it has served `min_uptime`, the others start too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_with_no_worker_serving_retries_before_its_back_off_ends() {
    let pool = pool("scout");
    let mut spec = python_app("scout", 3);
    let db = temp_dir().join("db");
    std::fs::write(&db, "up").unwrap();
    spec.env
        .insert("NEEDS_FILE".into(), db.to_string_lossy().into_owned());
    spec.restart = drover_supervisor::Backoff {
        initial: Duration::from_secs(20),
        max: Duration::from_secs(20),
        factor: 1.0,
        min_uptime: Duration::from_millis(500),
        crash_loop_after: 3,
        max_restarts: None,
    };
    let sup = Supervisor::start(spec, pool.clone()).unwrap();
    assert!(
        sup.wait_ready(Duration::from_secs(15)).await,
        "{:?}",
        sup.status()
    );

    // The database goes: every worker exits. The scouts try one at a time.
    std::fs::remove_file(&db).unwrap();
    assert!(
        eventually(Duration::from_secs(5), || pool.endpoints().is_empty()).await,
        "{:?}",
        sup.status()
    );
    let restarts = |sup: &Supervisor| sup.status().iter().map(|w| w.restarts).sum::<u32>();
    let before = restarts(&sup);
    let mut most_running = 0;
    assert!(
        eventually(Duration::from_secs(10), || {
            most_running =
                most_running.max(sup.status().iter().filter(|w| w.pid.is_some()).count());
            restarts(&sup) >= before + 2
        })
        .await,
        "no scout tried within 10 s of a 20 s back-off: {:?}",
        sup.status()
    );
    assert!(most_running <= 1, "{most_running} scouts at once");

    // It comes back: the next scout serves, then the others follow it.
    std::fs::write(&db, "up").unwrap();
    assert!(
        eventually(Duration::from_secs(10), || {
            let s = sup.status();
            s.iter().all(|w| w.state == WorkerState::Ready) && pool.endpoints().len() == 3
        })
        .await,
        "the app did not recover within 10 s of its database: {:?}",
        sup.status()
    );
    sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_with_a_hung_health_check_is_restarted() {
    let pool = pool("hung");
    let mut spec = python_app("hung", 1);
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
    let sup = Supervisor::start(spec, pool.clone()).unwrap();
    assert!(
        sup.wait_ready(Duration::from_secs(15)).await,
        "{:?}",
        sup.status()
    );
    let first = sup.status()[0].clone();
    let first_addr = SocketAddr::from(([127, 0, 0, 1], first.port.unwrap()));
    assert!(pool.find(first_addr).is_some());

    // The first process hangs on its second /health; two failed checks take it out.
    assert!(
        eventually(Duration::from_secs(5), || pool.find(first_addr).is_none()).await,
        "hung worker stayed in the pool"
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
    let second = sup.status()[0].clone();
    assert_ne!(second.pid, first.pid);
    assert!(
        second
            .last_exit
            .as_deref()
            .unwrap()
            .contains("health checks"),
        "{second:?}"
    );
    assert!(!process_exists(first.pid.unwrap()));
    let records = sup.restarts();
    assert_eq!(records.len(), 1, "{records:#?}");
    assert_eq!(
        (records[0].reason, records[0].pid),
        (RestartReason::Health, first.pid),
        "{records:#?}"
    );
    assert!(records[0]
        .detail
        .as_deref()
        .unwrap()
        .contains("health checks"));
    let addr = SocketAddr::from(([127, 0, 0, 1], second.port.unwrap()));
    assert_eq!(get(addr, "/health").await, "ok");

    // The replacement answers its checks, so it stays.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let w = &sup.status()[0];
    assert_eq!(
        (w.state, w.restarts, w.pid),
        (WorkerState::Ready, 1, second.pid)
    );
    sup.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_program_is_refused_and_a_silent_or_vanished_one_is_retried() {
    // Missing from the start: it could only restart forever, so the start fails.
    let err = Supervisor::start(
        AppSpec::new("missing", vec!["/nonexistent/drover-test-program".into()]),
        pool("missing"),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            SupervisorError::Program {
                source: ProgramError::NotFound { .. },
                ..
            }
        ),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.contains("\"missing\"") && err.contains("/nonexistent/drover-test-program"),
        "{err}"
    );

    // Removed after the start (a deploy half done): retried until it is back.
    let program = temp_dir().join("server");
    std::fs::write(&program, "#!/bin/sh\nexec sleep 30\n").unwrap();
    let mut perms = std::fs::metadata(&program).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&program, perms).unwrap();
    let vanished = AppSpec {
        restart: fast_backoff(),
        ready_timeout: Duration::from_millis(200),
        stop_timeout: Duration::from_millis(500),
        ..AppSpec::new("vanished", vec![program.display().to_string()])
    };
    let silent = AppSpec {
        restart: fast_backoff(),
        ready_timeout: Duration::from_millis(200),
        stop_timeout: Duration::from_millis(500),
        // Runs but never listens on PORT.
        ..AppSpec::new("silent", vec!["sleep".into(), "30".into()])
    };
    let a = Supervisor::start(vanished, pool("vanished")).unwrap();
    std::fs::remove_file(&program).unwrap();
    let b = Supervisor::start(silent, pool("silent")).unwrap();
    let failed_to_start = |w: &drover_supervisor::WorkerStatus| {
        w.last_exit
            .as_deref()
            .is_some_and(|e| e.starts_with("failed to start"))
    };
    assert!(
        eventually(Duration::from_secs(5), || {
            let wa = &a.status()[0];
            wa.restarts >= 2 && failed_to_start(wa) && b.status()[0].restarts >= 2
        })
        .await,
        "{:?} {:?}",
        a.status(),
        b.status()
    );
    let wb = &b.status()[0];
    assert!(
        wb.last_exit
            .as_deref()
            .unwrap()
            .contains("not ready within"),
        "{wb:?}"
    );
    tokio::join!(a.shutdown(), b.shutdown());
    // Both never became ready: a program that is gone, and one that never listened.
    let ra = a.restarts();
    assert!(
        ra.iter().any(|r| r.reason == RestartReason::StartFailed
            && r.pid.is_none()
            && r.detail.as_deref().unwrap().starts_with("failed to start")),
        "{ra:#?}"
    );
    let rb = b.restarts();
    assert!(
        rb.iter()
            .all(|r| r.reason == RestartReason::StartFailed && r.pid.is_some()),
        "{rb:#?}"
    );
}

#[test]
fn invalid_specs_are_rejected_with_the_app_name() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let err = Supervisor::start(AppSpec::new("empty", vec![]), pool("x")).unwrap_err();
    assert!(
        matches!(
            err,
            SupervisorError::InvalidSpec {
                source: SpecError::NoProgram,
                ..
            }
        ),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.contains("\"empty\"") && err.contains("command"),
        "{err}"
    );
}
