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
        "Times the worker slot started a new process after its first.",
    );
    each(e, &|e, l, w| e.sample_u64(l, u64::from(w.restarts)));
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
    e.gauge(
        "drover_worker_uptime_seconds",
        "Time since the worker's current process started.",
        Some("seconds"),
    );
    each(e, &|e, l, w| {
        if let Some(up) = w.uptime_secs {
            e.sample(l, up);
        }
    });
}
