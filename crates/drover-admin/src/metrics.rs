//! `GET /metrics`: the balancers' and endpoints' counts from the data plane, and the
//! supervisor's workers, as Prometheus text (or OpenMetrics when asked for).

use crate::status::{Status, WorkerRow};
use drover_metrics::{render, BalancerSnapshot, Exposition, Format};

/// The whole scrape.
pub fn render(format: Format, balancers: &[BalancerSnapshot], status: &Status) -> String {
    let mut e = Exposition::new(format);
    e.gauge(
        "drover_build_info",
        "Always 1; the version of drover that answers.",
        None,
    );
    e.sample_u64(&[("version", env!("CARGO_PKG_VERSION"))], 1);
    render::balancers(&mut e, balancers);
    workers(&mut e, status);
    e.counter(
        "drover_stderr_dropped_lines",
        "Lines for drover's stderr (its log, its workers' output) dropped because nothing read it and its 8 MiB buffer was full.",
    );
    e.sample_u64(&[], drover_spool::stderr_dropped_lines());
    e.finish()
}

/// Writes one worker's samples, given its `app` and `worker` labels.
type WorkerWriter<'a> = &'a dyn Fn(&mut Exposition, &[(&str, &str)], &WorkerRow);

fn workers(e: &mut Exposition, status: &Status) {
    let each = |e: &mut Exposition, f: WorkerWriter<'_>| {
        for app in &status.apps {
            for w in &app.workers {
                let id = w.id.to_string();
                f(e, &[("app", &app.name), ("worker", &id)], w);
            }
        }
    };
    e.gauge(
        "drover_worker_up",
        "1 while the worker's process is ready and serving.",
        None,
    );
    each(e, &|e, l, w| e.sample_u64(l, u64::from(w.state == "ready")));
    e.counter(
        "drover_worker_restarts",
        "Processes of the worker slot that ended, by reason: exit, signal, health, memory, reload, scale, start-failed, lost.",
    );
    each(e, &|e, l, w| {
        for (reason, &n) in &w.restarts_by_reason {
            e.sample_u64(&[l[0], l[1], ("reason", reason)], n);
        }
    });
    e.gauge(
        "drover_worker_last_exit_code",
        "Exit code of the worker's previous process, when it exited with one.",
        None,
    );
    each(e, &|e, l, w| {
        if let Some(code) = w.last_exit_code {
            e.sample(l, f64::from(code));
        }
    });
    e.gauge(
        "drover_worker_last_signal",
        "Signal that ended the worker's previous process, when one did.",
        None,
    );
    each(e, &|e, l, w| {
        if let Some(sig) = w.last_signal {
            e.sample(l, f64::from(sig));
        }
    });
    e.gauge(
        "drover_worker_resident_memory_bytes",
        "Resident memory of the worker's current process.",
        Some("bytes"),
    );
    each(e, &|e, l, w| {
        if let Some(rss) = w.rss_bytes {
            e.sample_u64(l, rss);
        }
    });
    e.counter(
        "drover_worker_cpu_seconds",
        "CPU time (user and system) the worker's current process has used; starts again with each process.",
    );
    each(e, &|e, l, w| {
        if let Some(cpu) = w.cpu_seconds {
            e.sample(l, cpu);
        }
    });
    e.gauge(
        "drover_worker_start_time_seconds",
        "When the worker's current process started, in seconds since the Unix epoch.",
        Some("seconds"),
    );
    each(e, &|e, l, w| {
        if let Some(at) = w.started_at_unix_secs {
            e.sample(l, at);
        }
    });
}
