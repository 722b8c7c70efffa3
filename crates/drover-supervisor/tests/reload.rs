//! Rolling reloads, memory-limit replacement and shared-socket mode, with real workers.

mod common;

use common::*;
use drover_supervisor::{
    AppSpec, Mode, ReplaceError, RestartReason, SharedListener, SpecError, Supervisor,
    SupervisorError, Undone, WorkerState, Workers,
};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn pids(sup: &Supervisor) -> Vec<u32> {
    sup.status()
        .iter()
        .map(|w| w.pid.expect("running"))
        .collect()
}

fn json_field(body: &str, key: &str) -> String {
    let needle = format!("\"{key}\": ");
    let at = body
        .find(&needle)
        .unwrap_or_else(|| panic!("{key} in {body}"))
        + needle.len();
    body[at..]
        .split([',', '}'])
        .next()
        .unwrap()
        .trim_matches('"')
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_replaces_every_worker_with_the_new_spec_and_the_pool_never_empties() {
    let pool = pool("web");
    let spec = python_app("web", 2);
    let sup = Supervisor::start(spec.clone(), pool.clone()).unwrap();
    assert!(sup.wait_ready(Duration::from_secs(15)).await);
    let before = pids(&sup);

    // Watch the pool the whole time: a reload must never leave it empty.
    let stop = Arc::new(AtomicBool::new(false));
    let empty_seen = Arc::new(AtomicUsize::new(0));
    let watcher = {
        let (pool, stop, empty_seen) = (pool.clone(), stop.clone(), empty_seen.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if pool.endpoints().is_empty() {
                    empty_seen.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })
    };

    let mut next = spec.clone();
    next.env.insert("EXTRA".into(), "v2".into());
    sup.reload(Some(next.clone())).await.expect("reload");
    stop.store(true, Ordering::Relaxed);
    watcher.await.unwrap();
    assert_eq!(
        empty_seen.load(Ordering::Relaxed),
        0,
        "pool was empty during reload"
    );

    let after = pids(&sup);
    for (old, new) in before.iter().zip(&after) {
        assert_ne!(old, new, "worker not replaced: {before:?} -> {after:?}");
    }
    for old in &before {
        assert!(
            eventually(Duration::from_secs(5), || !process_exists(*old)).await,
            "old worker {old} still exists (zombie?)"
        );
    }
    assert_eq!(pool_addrs(&pool).len(), 2);
    for addr in pool_addrs(&pool) {
        assert_eq!(json_field(&get(addr, "/").await, "extra"), "v2");
    }
    assert_eq!(*sup.spec(), next);
    assert!(sup.status().iter().all(|w| w.state == WorkerState::Ready));
    // Each old worker has a restart record saying a reload replaced it.
    let records = sup.restarts();
    let replaced: Vec<(usize, Option<u32>, RestartReason)> = records
        .iter()
        .map(|r| (r.worker, r.pid, r.reason))
        .collect();
    assert_eq!(
        replaced,
        [
            (0, Some(before[0]), RestartReason::Reload),
            (1, Some(before[1]), RestartReason::Reload)
        ],
        "{records:#?}"
    );
    for w in sup.status() {
        assert_eq!(w.restarts_by_reason.get(RestartReason::Reload), 1, "{w:?}");
        assert_eq!(w.last_reason, Some(RestartReason::Reload));
    }

    // A reload with no new spec restarts the same command: fresh processes again.
    sup.reload(None).await.expect("plain reload");
    let again = pids(&sup);
    assert!(
        after.iter().zip(&again).all(|(a, b)| a != b),
        "{after:?} {again:?}"
    );
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_that_never_gets_ready_leaves_the_old_workers_serving() {
    let pool = pool("web");
    let spec = python_app("web", 2);
    let sup = Supervisor::start(spec.clone(), pool.clone()).unwrap();
    assert!(sup.wait_ready(Duration::from_secs(15)).await);
    let before = pids(&sup);

    let mut broken = spec.clone();
    broken.command = vec!["sh".into(), "-c".into(), "exit 3".into()];
    let err = sup.reload(Some(broken)).await.unwrap_err();
    assert!(
        matches!(
            err,
            SupervisorError::ReloadFailed {
                worker: 0,
                source: ReplaceError::ExitedEarly(_),
                undone: Undone::NothingChanged,
                ..
            }
        ),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.contains("worker 0") && err.contains("exit status: 3"),
        "{err}"
    );
    assert!(err.contains("nothing was changed"), "{err}");
    assert_eq!(pids(&sup), before);
    assert_eq!(*sup.spec(), spec);
    // The failed replacement has a record; the old worker, which serves on, has none.
    let records = sup.restarts();
    assert_eq!(records.len(), 1, "{records:#?}");
    let r = &records[0];
    assert_eq!(
        (r.reason, r.worker, r.exit_code),
        (RestartReason::StartFailed, 0, Some(3)),
        "{r:#?}"
    );
    assert_ne!(r.pid, Some(before[0]));
    assert!(r.detail.as_deref().unwrap().starts_with("as a replacement"));

    // Worker 0's replacement comes up, worker 1's does not: worker 0 is rolled back.
    let flag = temp_dir().join("started-once");
    let script = spec.command[1].clone();
    let mut flaky = spec.clone();
    flaky.command = vec![
        "sh".into(),
        "-c".into(),
        format!(
            "if [ -e {f} ]; then exit 4; fi; touch {f}; exec python3 {script}",
            f = flag.display()
        ),
    ];
    let err = sup.reload(Some(flaky)).await.unwrap_err();
    assert!(
        matches!(
            err,
            SupervisorError::ReloadFailed {
                worker: 1,
                undone: Undone::RolledBack { upto: 1 },
                ..
            }
        ),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.contains("worker 1") && err.contains("rolled back: ok"),
        "{err}"
    );
    assert_eq!(*sup.spec(), spec);
    let now = pids(&sup);
    assert_ne!(now[0], before[0], "worker 0 was replaced twice");
    assert_eq!(now[1], before[1]);
    for addr in pool_addrs(&pool) {
        assert_eq!(json_field(&get(addr, "/").await, "extra"), "null");
    }

    // Bad specs are refused before anything starts.
    let mut more = spec.clone();
    more.workers = Workers::Count(3);
    let err = sup.reload(Some(more)).await.unwrap_err();
    assert!(
        matches!(err, SupervisorError::WorkersChanged { workers: 2, .. }),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "app \"web\": reload keeps 2 workers; scale to change the count"
    );
    let mut empty = spec.clone();
    empty.command.clear();
    let err = sup.reload(Some(empty)).await.unwrap_err();
    assert!(
        matches!(
            err,
            SupervisorError::InvalidReloadSpec(SpecError::NoProgram)
        ),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "command must name a program");
    assert_eq!(pids(&sup), now);
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_over_max_memory_is_replaced_without_a_gap() {
    let pool = pool("fat");
    let mut spec = python_app("fat", 1);
    // Any Python process is over 1 MiB, so the worker is replaced about every second.
    spec.max_memory = Some(1 << 20);
    let sup = Supervisor::start(spec, pool.clone()).unwrap();
    assert!(sup.wait_ready(Duration::from_secs(15)).await);
    let first = pids(&sup)[0];
    assert!(sup.status()[0].rss_bytes.unwrap() > 1 << 20);

    let mut replaced = false;
    for _ in 0..600 {
        assert!(
            !pool.endpoints().is_empty(),
            "pool emptied during a memory restart"
        );
        if pids(&sup)[0] != first {
            replaced = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(replaced, "not replaced: {:?}", sup.status());
    assert!(eventually(Duration::from_secs(5), || !process_exists(first)).await);
    // A replacement is not a crash.
    assert_eq!(sup.status()[0].crash_streak, 0);
    // Its restart record says why, with the RSS that was over the limit. It is written
    // once the old worker's stop has returned, a moment after its process is gone.
    assert!(
        eventually(Duration::from_secs(5), || sup
            .restarts()
            .iter()
            .any(|r| r.pid == Some(first)))
        .await
    );
    let records = sup.restarts();
    let record = records
        .iter()
        .find(|r| r.pid == Some(first))
        .unwrap_or_else(|| panic!("no record of {first}: {records:#?}"));
    assert_eq!(record.reason, RestartReason::Memory, "{record:#?}");
    assert!(record.rss_bytes.unwrap() > 1 << 20, "{record:#?}");
    assert!(
        record
            .detail
            .as_deref()
            .unwrap()
            .contains("over max_memory"),
        "{record:#?}"
    );
    assert!(
        sup.status()[0]
            .restarts_by_reason
            .get(RestartReason::Memory)
            >= 1
    );
    // It is a restart, as PM2's counter counts one: a worker replaced for its memory
    // every few seconds showed RESTARTS 0.
    assert!(sup.status()[0].restarts >= 1, "{:?}", sup.status());
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_mode_hands_a_socket_to_every_worker() {
    let socket = SharedListener::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr();
    let mut spec = python_app("shared", 2);
    spec.mode = Mode::Shared;
    let (sink, _lines) = collecting_sink();
    let sup = Supervisor::start_shared(spec, socket, sink).unwrap();
    assert_eq!(sup.shared_addr(), Some(addr));
    assert!(sup.wait_ready(Duration::from_secs(15)).await);
    assert!(sup.status().iter().all(|w| w.port.is_none()));

    // Each answer names its worker; LISTEN_PID is the worker's own pid, as
    // systemd-style libraries check.
    // Overlapping slow requests: each worker accepts on its own socket, and new
    // connections are placed on both.
    let mut workers = BTreeSet::new();
    for _ in 0..10 {
        let asks: Vec<_> = (0..4)
            .map(|_| tokio::spawn(async move { get(addr, "/slow").await }))
            .collect();
        for ask in asks {
            let body = ask.await.unwrap();
            assert_eq!(json_field(&body, "listen_pid"), json_field(&body, "pid"));
            assert_eq!(json_field(&body, "port"), "null");
            workers.insert(json_field(&body, "worker"));
        }
        if workers.len() == 2 {
            break;
        }
    }
    assert_eq!(
        workers.len(),
        2,
        "the kernel gave every connection to {workers:?}"
    );

    // Supervision still applies: a killed worker comes back on the same socket.
    let victim = sup.status()[0].pid.unwrap();
    kill9(victim);
    assert!(
        eventually(Duration::from_secs(10), || {
            let w = &sup.status()[0];
            w.state == WorkerState::Ready && w.pid != Some(victim)
        })
        .await
    );
    // And so does a rolling reload; the socket never closes, so no connection is refused.
    let before = pids(&sup);
    let reload = sup.reload(None);
    let load = async {
        for _ in 0..100 {
            get(addr, "/").await;
        }
    };
    let (reloaded, ()) = tokio::join!(reload, load);
    reloaded.unwrap();
    assert!(pids(&sup).iter().zip(&before).all(|(a, b)| a != b));
    get(addr, "/").await;
    sup.shutdown().await;
}

#[test]
fn shared_mode_refuses_health_checks_and_proxy_start() {
    let mut spec = AppSpec::new("s", vec!["x".into()]);
    spec.mode = Mode::Shared;
    spec.health = Some(Default::default());
    assert_eq!(spec.validate(), Err(SpecError::HealthInSharedMode));
    assert!(spec
        .validate()
        .unwrap_err()
        .to_string()
        .contains("shared mode"));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        spec.health = None;
        let err = Supervisor::start(spec, pool("s")).unwrap_err();
        assert!(
            matches!(err, SupervisorError::SharedNeedsSocket { .. }),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "app \"s\": shared mode needs a listening socket (start_shared)"
        );
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_that_speak_only_http2_need_a_way_to_probe_them() {
    // An h2c spec given to a supervisor that cannot make HTTP/2 probes is refused, on
    // start and on reload, rather than probed in HTTP/1.1 (which such workers refuse).
    let mut spec = python_app("h2", 1);
    spec.h2c = true;
    let err = Supervisor::start(spec.clone(), pool("h2")).unwrap_err();
    assert!(
        matches!(err, SupervisorError::NoHttp2Probe { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("HTTP/2"), "{err}");
    spec.h2c = false;
    let sup = Supervisor::start(spec.clone(), pool("h2")).unwrap();
    assert!(sup.wait_ready(Duration::from_secs(10)).await);
    spec.h2c = true;
    let err = sup.reload(Some(spec)).await.unwrap_err();
    assert!(
        matches!(err, SupervisorError::NoHttp2Probe { .. }),
        "{err:?}"
    );
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_up_to_workers_that_never_get_ready_changes_nothing() {
    let pool = pool("grow");
    let script = server_script();
    let mut spec = python_app("grow", 1);
    // Worker 0 serves; every later id exits at once.
    spec.command = vec![
        "sh".into(),
        "-c".into(),
        format!(
            "[ \"$DROVER_WORKER_ID\" = 0 ] || exit 4; exec python3 {}",
            script.display()
        ),
    ];
    let sup = Supervisor::start(spec, pool.clone()).unwrap();
    assert!(sup.wait_ready(Duration::from_secs(15)).await);
    let before = pids(&sup);

    let err = sup.scale(3).await.unwrap_err();
    assert!(
        matches!(err, SupervisorError::ScaleFailed { kept: 1, .. }),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.contains("is crash-looping") && err.contains("exit status: 4"),
        "{err}"
    );
    assert!(
        err.contains("the new workers were stopped and the app keeps 1"),
        "{err}"
    );
    assert_eq!(pids(&sup), before);
    assert_eq!(sup.spec().workers, Workers::Count(1));
    assert_eq!(pool_addrs(&pool).len(), 1);

    let err = sup.scale(0).await.unwrap_err();
    assert!(
        matches!(
            err,
            SupervisorError::InvalidWorkers {
                source: SpecError::InvalidWorkers { workers: 0 },
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "app \"grow\": workers must be in 1..=1024, not 0"
    );
    assert_eq!(sup.scale(1).await.unwrap(), "app \"grow\": 1 -> 1 workers");

    sup.shutdown().await;
    let err = sup.scale(2).await.unwrap_err();
    assert!(
        matches!(err, SupervisorError::ShuttingDown { .. }),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "app \"grow\" is shutting down");
}
