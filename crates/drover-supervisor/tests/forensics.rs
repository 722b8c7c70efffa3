//! Restart records, through real worker processes: why each process ended, its exit
//! code or signal, and the last lines it wrote to stderr.

mod common;

use common::*;
use drover_supervisor::{
    AppSpec, Backoff, RestartReason, RestartRecord, Stream, Supervisor, HISTORY_PER_APP,
    STDERR_LINE_MAX, STDERR_TAIL_LINES,
};
use std::time::Duration;

/// An app running `script` under `sh -c`, restarted quickly.
fn sh_app(name: &str, script: &str) -> AppSpec {
    AppSpec {
        restart: fast_backoff(),
        ready_timeout: Duration::from_secs(5),
        stop_timeout: Duration::from_secs(1),
        ..AppSpec::new(name, vec!["sh".into(), "-c".into(), script.into()])
    }
}

/// Waits until the app has a record matching `pred`; returns it.
async fn record_where(sup: &Supervisor, pred: impl Fn(&RestartRecord) -> bool) -> RestartRecord {
    let mut found = None;
    let seen = eventually(Duration::from_secs(10), || {
        found = sup.restarts().into_iter().find(|r| pred(r));
        found.is_some()
    })
    .await;
    assert!(seen, "no such record in {:#?}", sup.restarts());
    found.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exit_code_is_recorded_with_the_last_stderr_lines_which_are_still_forwarded() {
    let script = "for i in $(seq 1 25); do echo \"err line $i\" >&2; done; \
                  echo 'to stdout'; exit 3";
    let (sink, lines) = collecting_sink();
    let sup = Supervisor::start_with_output(sh_app("three", script), pool("three"), sink).unwrap();
    let record = record_where(&sup, |_| true).await;
    sup.shutdown().await;

    assert_eq!(record.reason, RestartReason::Exit, "{record:#?}");
    assert_eq!((record.exit_code, record.signal), (Some(3), None));
    assert_eq!((record.app.as_str(), record.worker), ("three", 0));
    assert!(
        record.pid.is_some() && record.uptime.is_some(),
        "{record:#?}"
    );
    assert_eq!(
        record.detail.as_deref(),
        Some("ended before it was ready"),
        "{record:#?}"
    );
    // The last 20 of its 25 stderr lines, in order; stdout is not kept.
    let expected: Vec<String> = (6..=25).map(|i| format!("err line {i}")).collect();
    assert_eq!(record.stderr_tail, expected);
    assert_eq!(record.stderr_tail.len(), STDERR_TAIL_LINES);

    // Keeping the tail does not stop the forwarding: every line still went out.
    let lines = lines.lock().unwrap();
    assert!(lines.contains(&(Stream::Stderr, "[three/0] err line 1".to_string())));
    assert!(lines.contains(&(Stream::Stderr, "[three/0] err line 25".to_string())));
    assert!(lines.contains(&(Stream::Stdout, "[three/0] to stdout".to_string())));

    let w = &sup.status()[0];
    assert!(w.restarts_by_reason.get(RestartReason::Exit) >= 1, "{w:?}");
    assert_eq!(w.last_reason, Some(RestartReason::Exit));
    assert_eq!((w.last_exit_code, w.last_signal), (Some(3), None));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_from_outside_is_a_signal_with_its_name_rss_and_uptime() {
    let sup = Supervisor::start(python_app("k9", 1), pool("k9")).unwrap();
    assert!(sup.wait_ready(Duration::from_secs(15)).await);
    let before = sup.status()[0].clone();
    let pid = before.pid.unwrap();
    assert!(before.started_at.is_some(), "{before:?}");
    assert!(before.cpu_seconds.is_some_and(|s| s >= 0.0), "{before:?}");
    // Killed the moment it is ready: its first sample was taken before that.
    kill9(pid);

    let record = record_where(&sup, |r| r.pid == Some(pid)).await;
    assert_eq!(record.reason, RestartReason::Signal, "{record:#?}");
    assert_eq!((record.exit_code, record.signal), (None, Some(9)));
    assert_eq!(record.signal_name(), Some("SIGKILL"));
    assert!(record.uptime.unwrap() > Duration::ZERO);
    assert!(record.rss_bytes.is_some_and(|b| b > 0), "{record:#?}");
    assert!(record.cpu_seconds.is_some(), "{record:#?}");

    assert!(
        eventually(Duration::from_secs(10), || sup.status()[0]
            .pid
            .is_some_and(|p| p != pid))
        .await
    );
    let w = &sup.status()[0];
    assert_eq!(w.restarts_by_reason.get(RestartReason::Signal), 1, "{w:?}");
    assert_eq!(w.restarts_by_reason.total(), 1, "{w:?}");
    assert_eq!((w.last_exit_code, w.last_signal), (None, Some(9)));
    assert_eq!(w.last_exit.as_deref(), Some("signal: 9 (SIGKILL)"));

    // A reload ends it again: the last exit is the reload's, in every field. Before,
    // the line still said SIGKILL beside the reload's exit code.
    let pid = w.pid.unwrap();
    sup.reload(None).await.expect("reload");
    let record = record_where(&sup, |r| r.pid == Some(pid)).await;
    assert_eq!(record.reason, RestartReason::Reload, "{record:#?}");
    let w = &sup.status()[0];
    let shown = record.exit_text();
    assert!(shown.is_some(), "{record:#?}");
    assert_eq!(w.last_exit, shown, "{w:?}");
    assert_ne!(w.last_exit.as_deref(), Some("signal: 9 (SIGKILL)"));
    sup.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_loop_keeps_only_the_last_records() {
    // Each run writes its number to stderr, so the records show which runs they are.
    let counter = temp_dir().join("runs");
    let script = format!(
        "n=$(cat '{f}' 2>/dev/null || echo 0); n=$((n+1)); echo $n > '{f}'; \
         echo \"run $n\" >&2; exit 1",
        f = counter.display()
    );
    let spec = AppSpec {
        restart: Backoff {
            initial: Duration::from_millis(1),
            max: Duration::from_millis(5),
            factor: 2.0,
            min_uptime: Duration::from_millis(500),
            crash_loop_after: 3,
            max_restarts: None,
        },
        ..sh_app("loop", &script)
    };
    let sup = Supervisor::start(spec, pool("loop")).unwrap();
    assert!(
        eventually(Duration::from_secs(30), || {
            sup.status()[0].restarts_by_reason.get(RestartReason::Exit) >= 30
        })
        .await,
        "{:?}",
        sup.status()
    );
    sup.shutdown().await;

    // Shut down, nothing changes any more: the counter says how many ended.
    let ended = sup.status()[0].restarts_by_reason.get(RestartReason::Exit);
    assert!(ended >= 30);
    let records = sup.restarts();
    assert_eq!(records.len(), HISTORY_PER_APP);
    let runs: Vec<String> = records
        .iter()
        .map(|r| {
            assert_eq!((r.reason, r.exit_code), (RestartReason::Exit, Some(1)));
            r.stderr_tail.join("|")
        })
        .collect();
    let expected: Vec<String> = (ended - HISTORY_PER_APP as u64 + 1..=ended)
        .map(|n| format!("run {n}"))
        .collect();
    assert_eq!(runs, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_megabyte_stderr_line_is_kept_capped_and_forwarded_as_one_line() {
    let script = "echo before >&2; head -c 1048576 /dev/zero | tr '\\0' x >&2; echo >&2; \
                  echo after >&2; exit 3";
    let (sink, lines) = collecting_sink();
    let sup = Supervisor::start_with_output(sh_app("big", script), pool("big"), sink).unwrap();
    let record = record_where(&sup, |_| true).await;
    sup.shutdown().await;

    assert_eq!(record.exit_code, Some(3));
    let tail = &record.stderr_tail;
    assert_eq!(tail.len(), 3, "one line per line written: {:?}", tail.len());
    assert_eq!(tail[0], "before");
    assert_eq!(tail[2], "after");
    let cut = tail[1].strip_suffix(" [...]").expect("marked as cut");
    assert_eq!(cut, "x".repeat(STDERR_LINE_MAX));

    // drover's own stderr got all of it, as one line (a JSON log line stays one).
    let forwarded: Vec<usize> = lines
        .lock()
        .unwrap()
        .iter()
        .filter(|(s, l)| *s == Stream::Stderr && l.starts_with("[big/0] x"))
        .map(|(_, l)| l.len() - "[big/0] ".len())
        .collect();
    assert_eq!(forwarded, [1 << 20]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaling_down_records_scale_and_not_ready_records_start_failed() {
    let sup = Supervisor::start(python_app("sc", 2), pool("sc")).unwrap();
    assert!(sup.wait_ready(Duration::from_secs(15)).await);
    let retired = sup.status()[1].pid.unwrap();
    sup.scale(1).await.unwrap();
    let records = sup.restarts();
    assert_eq!(records.len(), 1, "{records:#?}");
    let r = &records[0];
    assert_eq!(
        (r.reason, r.worker, r.pid),
        (RestartReason::Scale, 1, Some(retired))
    );
    sup.shutdown().await;
    // Shutdown itself is not a restart.
    assert_eq!(sup.restarts().len(), 1, "{:#?}", sup.restarts());

    // Runs but never listens on PORT: stopped after ready_timeout.
    let silent = AppSpec {
        ready_timeout: Duration::from_millis(200),
        ..sh_app("silent", "echo 'booting...' >&2; exec sleep 30")
    };
    let sup = Supervisor::start(silent, pool("silent")).unwrap();
    let r = record_where(&sup, |_| true).await;
    sup.shutdown().await;
    assert_eq!(r.reason, RestartReason::StartFailed, "{r:#?}");
    assert!(
        r.detail.as_deref().unwrap().starts_with("not ready within"),
        "{r:#?}"
    );
    // drover's SIGTERM ended it.
    assert_eq!(r.signal_name(), Some("SIGTERM"), "{r:#?}");
    assert_eq!(r.stderr_tail, ["booting..."]);
}
