//! The dashboard's one sampler: once a second it reads `Control::metrics()` and
//! `Control::status()`, turns the cumulative counts into per-second points (requests/s,
//! errors/s, p50/p99 latency), keeps the last `HISTORY` points per balancer, derives
//! events by comparing the sample with the one before, and broadcasts each sample as
//! one SSE frame encoded once for every subscriber.
//!
//! Memory is bounded: `HISTORY` points per balancer that exists now, `EVENTS` events,
//! `WINDOW_SLOTS` histogram snapshots per endpoint that exists now, and a broadcast
//! channel of `BACKLOG` frames (a subscriber that falls further behind skips ahead).

use crate::control::Control;
use crate::status::Status;
use bytes::Bytes;
use drover_metrics::{BalancerCounts, BalancerSnapshot, EndpointSnapshot, HistogramSnapshot};
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};
use tokio::sync::broadcast;

/// One point a second.
pub const INTERVAL: Duration = Duration::from_secs(1);
/// Ten minutes of points per balancer.
pub const HISTORY: usize = 600;
/// The events kept for new subscribers.
pub const EVENTS: usize = 200;
/// Frames a subscriber may fall behind before it skips ahead.
pub const BACKLOG: usize = 16;
/// An endpoint's p99 is over the last minute: a snapshot of its histogram every
/// `WINDOW_STEP` samples, `WINDOW_SLOTS` of them (so 60 to 70 s).
const WINDOW_STEP: u64 = 10;
const WINDOW_SLOTS: usize = 7;

/// One second of one balancer.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    /// Unix seconds.
    pub t: f64,
    pub rps: f64,
    /// 5xx answers per second, drover's own errors included (it answers them 502, 503
    /// or 504, and counts them as responses too).
    pub eps: f64,
    /// drover's own errors per second (no endpoint, queue full, backend failed...).
    pub derr: f64,
    /// Latency quantiles of the requests that ended in that second, milliseconds; none
    /// when none ended.
    pub p50: Option<f64>,
    pub p99: Option<f64>,
}

/// Something that happened between two samples.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Event {
    /// Unix seconds.
    pub t: f64,
    /// ejection, restart (a worker's restarts rose), replace (its pid changed without
    /// one: a reload), scale, reload.
    pub kind: &'static str,
    /// The balancer (ejections) or app (the others) it is about.
    pub subject: String,
    pub text: String,
}

/// What the dashboard shows of one endpoint now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EndpointView {
    pub address: String,
    /// up, ejected (healthy but taken out by passive checks) or down (failing checks).
    pub state: &'static str,
    pub in_flight: u64,
    /// 0 = none.
    pub limit: u64,
    /// Why `limit` is what it is ("saturated": a learned limit, on pending requests).
    pub limit_reason: String,
    /// Requests awaiting their answer that later ones overtook (not counted by a learned
    /// limit).
    pub waiting: u64,
    /// Over the last minute, milliseconds.
    pub p99_ms: Option<f64>,
    pub responses_5xx: u64,
    /// Requests to it that failed (connect, closed, timed out, bad response): the
    /// failures drover retries elsewhere when it may.
    pub failures: u64,
    pub ejections: u64,
    /// The last active health check: "pass", "fail", or none seen yet.
    pub check: Option<&'static str>,
    pub weight: u64,
    pub load: f64,
    pub latency_estimate_ms: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BalancerView {
    pub name: String,
    pub listen: Option<String>,
    pub strategy: Option<String>,
    pub app: Option<String>,
    /// Its routes, as `drover ctl status` shows them: `MATCHES -> BALANCER`.
    pub routes: Vec<String>,
    /// The newest point (absent on the first sample).
    pub point: Option<Point>,
    pub queue_depth: u64,
    pub connections: u64,
    pub requests: u64,
    pub retries: u64,
    pub endpoints: Vec<EndpointView>,
    /// The certificates it serves that expire within `CertificateExpiry::WARNING`, or
    /// have expired: the page shows each as a warning.
    pub expiring_certificates: Vec<ExpiringCertificate>,
}

/// A certificate due for renewal, as the dashboard shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExpiringCertificate {
    /// Its file, as configured.
    pub cert: String,
    /// Its notAfter, Unix seconds.
    pub not_after: i64,
    /// Days from the sample to `not_after`; negative once expired.
    pub days_left: f64,
}

/// The certificates of `counts` due for renewal at `t` (Unix seconds).
pub fn expiring_certificates(counts: &BalancerCounts, t: f64) -> Vec<ExpiringCertificate> {
    counts
        .tls_certificates
        .iter()
        .filter(|c| c.due(t as i64))
        .map(|c| ExpiringCertificate {
            cert: c.cert.clone(),
            not_after: c.not_after,
            days_left: (c.not_after as f64 - t) / 86_400.0,
        })
        .collect()
}

/// One `sample` frame.
#[derive(Debug, Clone, Serialize)]
pub struct SampleFrame {
    pub t: f64,
    pub balancers: Vec<BalancerView>,
    /// `Status::apps` as the admin API answers it (optional fields pass through).
    pub apps: serde_json::Value,
    /// The events derived from this sample.
    pub events: Vec<Event>,
}

/// The `history` frame a subscriber gets first.
#[derive(Debug, Clone, Serialize)]
pub struct HistoryFrame<'a> {
    pub interval_secs: f64,
    pub capacity: usize,
    /// Per balancer, column-wise (what uPlot draws): t, rps, eps, derr, p50, p99.
    pub series: Vec<Series>,
    pub events: &'a VecDeque<Event>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Series {
    pub balancer: String,
    pub t: Vec<f64>,
    pub rps: Vec<f64>,
    pub eps: Vec<f64>,
    pub derr: Vec<f64>,
    pub p50: Vec<Option<f64>>,
    pub p99: Vec<Option<f64>>,
}

/// The per-second point between two cumulative counts `secs` apart.
pub fn point(t: f64, earlier: &BalancerCounts, now: &BalancerCounts, secs: f64) -> Point {
    let secs = secs.max(1e-3);
    let rate = |a: u64, b: u64| b.saturating_sub(a) as f64 / secs;
    let delta = now.request_duration.since(&earlier.request_duration);
    let ms = |q: f64| delta.quantile(q).map(|s| s * 1e3);
    Point {
        t,
        rps: rate(earlier.requests, now.requests),
        eps: rate(earlier.responses[4], now.responses[4]),
        derr: rate(earlier.errors.iter().sum(), now.errors.iter().sum()),
        p50: ms(0.5),
        p99: ms(0.99),
    }
}

/// The events between the `earlier` sample and `now`'s: endpoints whose ejection count
/// rose, workers whose restart count rose or whose pid changed, apps whose number of
/// workers changed.
pub fn derive_events(
    t: f64,
    earlier: (&[BalancerSnapshot], &Status),
    now: (&[BalancerSnapshot], &Status),
) -> Vec<Event> {
    let mut events = Vec::new();
    for b in now.0 {
        let Some(before) = earlier.0.iter().find(|e| e.name == b.name) else {
            continue;
        };
        for e in &b.endpoints {
            let Some(prev) = before.endpoints.iter().find(|p| p.address == e.address) else {
                continue;
            };
            let rose: Vec<String> = e
                .counts
                .ejections
                .iter()
                .zip(&prev.counts.ejections)
                .zip(drover_metrics::Ejection::ALL)
                .filter(|((n, p), _)| n > p)
                .map(|(_, why)| why.as_str().to_string())
                .collect();
            if !rose.is_empty() {
                events.push(Event {
                    t,
                    kind: "ejection",
                    subject: b.name.clone(),
                    text: format!("{} ejected ({})", e.address, rose.join(", ")),
                });
            }
        }
    }
    for app in &now.1.apps {
        let Some(before) = earlier.1.apps.iter().find(|a| a.name == app.name) else {
            continue;
        };
        if before.workers.len() != app.workers.len() {
            events.push(Event {
                t,
                kind: "scale",
                subject: app.name.clone(),
                text: format!("{} workers → {}", before.workers.len(), app.workers.len()),
            });
        }
        for w in &app.workers {
            let Some(prev) = before.workers.iter().find(|p| p.id == w.id) else {
                continue;
            };
            let pids = match (prev.pid, w.pid) {
                (Some(a), Some(b)) if a != b => format!(" (pid {a} → {b})"),
                _ => String::new(),
            };
            if w.restarts > prev.restarts {
                let why = w
                    .last_exit
                    .as_deref()
                    .map_or_else(String::new, |e| format!(": {e}"));
                events.push(Event {
                    t,
                    kind: "restart",
                    subject: app.name.clone(),
                    text: format!("worker {} restarted{pids}{why}", w.id),
                });
            } else if !pids.is_empty() {
                events.push(Event {
                    t,
                    kind: "replace",
                    subject: app.name.clone(),
                    text: format!("worker {} replaced{pids}", w.id),
                });
            }
        }
    }
    events
}

fn endpoint_state(e: &EndpointSnapshot) -> &'static str {
    match (e.healthy, e.available) {
        (true, true) => "up",
        (true, false) => "ejected",
        (false, _) => "down",
    }
}

/// What the sampler remembers of one endpoint between samples.
#[derive(Debug, Default)]
struct EndpointMemory {
    /// Cumulative request-duration snapshots, oldest first, one per `WINDOW_STEP`.
    window: VecDeque<HistogramSnapshot>,
    check: Option<&'static str>,
    seen_at: u64,
}

/// Everything the sampler keeps; behind one mutex, held briefly.
#[derive(Debug, Default)]
pub struct State {
    ticks: u64,
    last: Option<(Instant, Vec<BalancerSnapshot>, Status)>,
    history: HashMap<String, VecDeque<Point>>,
    endpoints: HashMap<(String, String), EndpointMemory>,
    events: VecDeque<Event>,
    /// The newest `sample` frame, for a subscriber that joins before the next one.
    last_frame: Option<Bytes>,
}

impl State {
    /// Takes one sample taken at `at` (monotonic) and `t` (Unix seconds): updates the
    /// history, and answers the frame to send.
    pub fn take(
        &mut self,
        at: Instant,
        t: f64,
        metrics: Vec<BalancerSnapshot>,
        status: Status,
    ) -> SampleFrame {
        self.ticks += 1;
        let tick = self.ticks;
        let mut events = Vec::new();
        let mut views = Vec::with_capacity(metrics.len());
        let earlier = self.last.as_ref();
        if let Some((_, prev_metrics, prev_status)) = earlier {
            events = derive_events(t, (prev_metrics, prev_status), (&metrics, &status));
        }
        for b in &metrics {
            let before = earlier.and_then(|(when, m, _)| {
                m.iter()
                    .find(|p| p.name == b.name)
                    .map(|p| (at.saturating_duration_since(*when).as_secs_f64(), p))
            });
            let point = before.map(|(secs, p)| point(t, &p.counts, &b.counts, secs));
            if let Some(point) = point {
                let h = self.history.entry(b.name.clone()).or_default();
                if h.len() == HISTORY {
                    h.pop_front();
                }
                h.push_back(point);
            }
            let mut endpoints = Vec::with_capacity(b.endpoints.len());
            for e in &b.endpoints {
                let mem = self
                    .endpoints
                    .entry((b.name.clone(), e.address.clone()))
                    .or_default();
                mem.seen_at = tick;
                let prev =
                    before.and_then(|(_, p)| p.endpoints.iter().find(|x| x.address == e.address));
                if let Some(prev) = prev {
                    if e.counts.checks_failed > prev.counts.checks_failed {
                        mem.check = Some("fail");
                    } else if e.counts.checks_passed > prev.counts.checks_passed {
                        mem.check = Some("pass");
                    }
                }
                if mem.window.is_empty() || tick.is_multiple_of(WINDOW_STEP) {
                    if mem.window.len() == WINDOW_SLOTS {
                        mem.window.pop_front();
                    }
                    mem.window.push_back(e.counts.request_duration.clone());
                }
                let minute = mem
                    .window
                    .front()
                    .map(|oldest| e.counts.request_duration.since(oldest));
                endpoints.push(EndpointView {
                    address: e.address.clone(),
                    state: endpoint_state(e),
                    in_flight: e.in_flight,
                    limit: e.limit,
                    limit_reason: e.limit_reason.clone(),
                    waiting: e.waiting,
                    p99_ms: minute.and_then(|m| m.quantile(0.99)).map(|s| s * 1e3),
                    responses_5xx: e.counts.responses[4],
                    failures: e.counts.failures.iter().sum(),
                    ejections: e.counts.ejections.iter().sum(),
                    check: mem.check,
                    weight: e.weight,
                    load: e.reported_load,
                    latency_estimate_ms: e.latency_estimate_seconds * 1e3,
                });
            }
            let st = status.balancers.iter().find(|s| s.name == b.name);
            views.push(BalancerView {
                name: b.name.clone(),
                listen: st.map(crate::BalancerStatus::shown_listen),
                strategy: st.map(|s| s.strategy.clone()),
                app: st.and_then(|s| s.app.clone()),
                routes: st.map_or_else(Vec::new, |s| {
                    s.routes
                        .iter()
                        .map(|r| format!("{} -> {}", r.matches, r.balancer))
                        .collect()
                }),
                point,
                queue_depth: b.queue_depth,
                connections: b.connections,
                requests: b.counts.requests,
                retries: b.counts.retries.iter().sum(),
                endpoints,
                expiring_certificates: expiring_certificates(&b.counts, t),
            });
        }
        // What no longer exists is forgotten, so memory follows what runs now.
        self.history
            .retain(|name, _| metrics.iter().any(|b| &b.name == name));
        self.endpoints.retain(|_, m| m.seen_at == tick);
        for e in &events {
            self.note(e.clone());
        }
        let apps = serde_json::to_value(&status.apps).unwrap_or(serde_json::Value::Null);
        self.last = Some((at, metrics, status));
        SampleFrame {
            t,
            balancers: views,
            apps,
            events,
        }
    }

    /// Keeps an event for later subscribers.
    pub fn note(&mut self, event: Event) {
        if self.events.len() == EVENTS {
            self.events.pop_front();
        }
        self.events.push_back(event);
    }

    pub fn history(&self) -> HistoryFrame<'_> {
        let mut series: Vec<Series> = self
            .history
            .iter()
            .map(|(name, points)| Series {
                balancer: name.clone(),
                t: points.iter().map(|p| p.t).collect(),
                rps: points.iter().map(|p| p.rps).collect(),
                eps: points.iter().map(|p| p.eps).collect(),
                derr: points.iter().map(|p| p.derr).collect(),
                p50: points.iter().map(|p| p.p50).collect(),
                p99: points.iter().map(|p| p.p99).collect(),
            })
            .collect();
        series.sort_by(|a, b| a.balancer.cmp(&b.balancer));
        HistoryFrame {
            interval_secs: INTERVAL.as_secs_f64(),
            capacity: HISTORY,
            series,
            events: &self.events,
        }
    }

    pub fn points(&self, balancer: &str) -> usize {
        self.history.get(balancer).map_or(0, VecDeque::len)
    }
}

/// One SSE frame: `event: NAME` and the JSON on one `data:` line (JSON has no raw
/// newlines, so one line always suffices).
pub fn sse_frame<T: Serialize>(event: &str, value: &T) -> Bytes {
    let json = serde_json::to_string(value)
        .unwrap_or_else(|e| format!("{{\"error\":\"cannot encode: {e}\"}}"));
    Bytes::from(format!("event: {event}\ndata: {json}\n\n"))
}

/// The sampler shared by every subscriber of one admin server.
pub struct Sampler {
    state: Mutex<State>,
    frames: broadcast::Sender<Bytes>,
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler {
            state: Mutex::new(State::default()),
            frames: broadcast::channel(BACKLOG).0,
        }
    }
}

impl Sampler {
    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding it leaves plain data behind; keep serving it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Samples `control` once a second until the task is aborted.
    pub fn spawn(self: &Arc<Self>, control: Arc<dyn Control>) -> tokio::task::JoinHandle<()> {
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(INTERVAL);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            loop {
                tick.tick().await;
                me.sample(control.as_ref());
            }
        })
    }

    /// Takes one sample now and sends it to every subscriber.
    pub fn sample(&self, control: &dyn Control) {
        let metrics = control.metrics();
        let status = control.status();
        let mut state = self.state();
        let frame = state.take(Instant::now(), unix_now(), metrics, status);
        let frame = sse_frame("sample", &frame);
        state.last_frame = Some(frame.clone());
        // Sent under the lock, so a subscriber that joins meanwhile gets each sample
        // once: in its history or as a frame. No subscriber is no error.
        let _ = self.frames.send(frame);
    }

    /// Records an event the API saw happen (a reload or scale it was asked for).
    pub fn note(&self, kind: &'static str, subject: Option<String>, text: String) {
        let event = Event {
            t: unix_now(),
            kind,
            subject: subject.unwrap_or_default(),
            text,
        };
        let mut state = self.state();
        state.note(event.clone());
        let _ = self.frames.send(sse_frame("event", &event));
    }

    /// The frames to send first (the history, then the newest sample, whose point the
    /// history holds too), and a receiver of every later frame.
    pub fn subscribe(&self) -> (Vec<Bytes>, broadcast::Receiver<Bytes>) {
        let state = self.state();
        let mut first = vec![sse_frame("history", &state.history())];
        first.extend(state.last_frame.clone());
        (first, self.frames.subscribe())
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{AppStatus, BalancerStatus, WorkerRow};
    use drover_metrics::Histogram;

    /// A histogram snapshot holding `n` requests of `ms` milliseconds each, on top of
    /// `base`.
    fn with(base: &HistogramSnapshot, n: u64, ms: u64) -> HistogramSnapshot {
        let h = Histogram::default();
        for _ in 0..n {
            h.record(ms * 1_000_000);
        }
        let mut s = h.snapshot();
        s.add(base);
        s
    }

    fn counts(requests: u64, fives: u64, errors: u64, hist: HistogramSnapshot) -> BalancerCounts {
        let mut c = BalancerCounts {
            requests,
            request_duration: hist,
            ..BalancerCounts::default()
        };
        c.responses[1] = requests - fives;
        c.responses[4] = fives;
        c.errors[0] = errors;
        c
    }

    #[test]
    fn certificates_within_14_days_or_expired_are_due_and_no_others() {
        let t = 1_800_000_000.0;
        let day = 86_400;
        let cert = |name: &str, not_after: i64| drover_metrics::CertificateExpiry {
            cert: name.into(),
            not_after,
        };
        let now = t as i64;
        let c = BalancerCounts {
            tls_certificates: vec![
                cert("soon.pem", now + 5 * day),
                cert("edge.pem", now + 14 * day),
                cert("later.pem", now + 14 * day + 1),
                cert("gone.pem", now - 2 * day),
            ],
            ..BalancerCounts::default()
        };
        let due = expiring_certificates(&c, t);
        let shown: Vec<(&str, f64)> = due.iter().map(|c| (c.cert.as_str(), c.days_left)).collect();
        assert_eq!(
            shown,
            [("soon.pem", 5.0), ("edge.pem", 14.0), ("gone.pem", -2.0)]
        );
        assert_eq!(due[0].not_after, now + 5 * day);
        assert!(expiring_certificates(&BalancerCounts::default(), t).is_empty());
    }

    fn endpoint(addr: &str, ejections: u64, passed: u64, failed: u64) -> EndpointSnapshot {
        let mut e = EndpointSnapshot {
            address: addr.into(),
            healthy: true,
            available: true,
            ..EndpointSnapshot::default()
        };
        e.counts.ejections[1] = ejections;
        e.counts.checks_passed = passed;
        e.counts.checks_failed = failed;
        e
    }

    fn balancer(
        name: &str,
        c: BalancerCounts,
        endpoints: Vec<EndpointSnapshot>,
    ) -> BalancerSnapshot {
        BalancerSnapshot {
            name: name.into(),
            counts: c,
            endpoints,
            ..BalancerSnapshot::default()
        }
    }

    fn worker(id: usize, pid: u32, restarts: u32) -> WorkerRow {
        WorkerRow {
            id,
            pid: Some(pid),
            port: None,
            state: "ready".into(),
            uptime_secs: Some(1.0),
            restarts,
            crash_streak: 0,
            rss_bytes: None,
            in_flight: None,
            last_exit: (restarts > 0).then(|| "killed by SIGKILL".to_string()),
            ..WorkerRow::default()
        }
    }

    fn status(workers: Vec<WorkerRow>) -> Status {
        Status {
            apps: vec![AppStatus {
                name: "web".into(),
                mode: "proxy".into(),
                command: vec!["w".into()],
                workers,
                restarts: Vec::new(),
                shared_ports: Vec::new(),
            }],
            balancers: vec![BalancerStatus {
                name: "web".into(),
                listen: "127.0.0.1:8080".into(),
                also_listen: Vec::new(),
                strategy: "p2c".into(),
                mode: "http".into(),
                app: Some("web".into()),
                backend_protocol: "http1".into(),
                endpoints: vec![],
                sources: vec![],
                routes: vec![],
            }],
        }
    }

    #[test]
    fn a_point_is_the_rates_and_quantiles_of_one_interval() {
        let zero = HistogramSnapshot::default();
        let before = counts(1000, 10, 2, with(&zero, 1000, 500));
        // 200 more requests in 2 s: 100 of 1 ms, 100 of 100 ms; 8 of them 5xx, 4 of
        // those drover's own.
        let fast = with(&before.request_duration, 100, 1);
        let now = counts(1200, 18, 6, with(&fast, 100, 100));
        let p = point(7.0, &before, &now, 2.0);
        assert_eq!((p.t, p.rps, p.eps, p.derr), (7.0, 100.0, 4.0, 2.0));
        // The 500 ms requests of before do not count: p99 is of the interval only.
        let p99 = p.p99.unwrap();
        assert!((90.0..=110.0).contains(&p99), "{p99}");
        let p50 = p.p50.unwrap();
        assert!(p50 <= 1.2, "{p50}");
        // An interval with no request has no latency, and no negative rate when a
        // balancer's counts start over.
        let idle = point(8.0, &now, &now, 1.0);
        assert_eq!((idle.rps, idle.p50, idle.p99), (0.0, None, None));
        let reset = point(9.0, &now, &BalancerCounts::default(), 1.0);
        assert_eq!((reset.rps, reset.eps), (0.0, 0.0));
    }

    #[test]
    fn events_come_from_comparing_two_samples() {
        let c = BalancerCounts::default();
        let m0 = vec![balancer(
            "web",
            c.clone(),
            vec![
                endpoint("10.0.0.1:80", 0, 0, 0),
                endpoint("10.0.0.2:80", 1, 0, 0),
            ],
        )];
        let s0 = status(vec![
            worker(0, 100, 0),
            worker(1, 101, 0),
            worker(2, 102, 0),
        ]);
        let same = derive_events(1.0, (&m0, &s0), (&m0, &s0));
        assert!(same.is_empty(), "{same:?}");

        let m1 = vec![balancer(
            "web",
            c,
            vec![
                endpoint("10.0.0.1:80", 1, 0, 0),
                endpoint("10.0.0.2:80", 1, 0, 0),
            ],
        )];
        // Worker 0 was killed and restarted; worker 1 replaced by a reload (new pid, no
        // restart counted); worker 2 retired by a scale to 2.
        let s1 = status(vec![worker(0, 200, 1), worker(1, 201, 0)]);
        let ev = derive_events(2.0, (&m0, &s0), (&m1, &s1));
        let kinds: Vec<(&str, &str)> = ev.iter().map(|e| (e.kind, e.text.as_str())).collect();
        assert_eq!(
            kinds,
            vec![
                ("ejection", "10.0.0.1:80 ejected (error-responses)"),
                ("scale", "3 workers → 2"),
                (
                    "restart",
                    "worker 0 restarted (pid 100 → 200): killed by SIGKILL"
                ),
                ("replace", "worker 1 replaced (pid 101 → 201)"),
            ]
        );
        assert!(ev.iter().all(|e| e.t == 2.0));
        assert_eq!(ev[0].subject, "web");
        // A restart whose new process is not up yet (no pid) is still one.
        let mut down = worker(0, 100, 1);
        down.pid = None;
        let ev = derive_events(
            3.0,
            (&m0, &s0),
            (
                &m0,
                &status(vec![down, worker(1, 101, 0), worker(2, 102, 0)]),
            ),
        );
        assert_eq!(ev.len(), 1);
        assert_eq!(ev[0].text, "worker 0 restarted: killed by SIGKILL");
    }

    #[test]
    fn history_keeps_ten_minutes_of_what_exists_now() {
        let mut st = State::default();
        let start = Instant::now();
        let zero = HistogramSnapshot::default();
        let mut hist = zero.clone();
        let s = status(vec![worker(0, 1, 0)]);
        for i in 0..700u64 {
            hist = with(&hist, 10, 2);
            let m = vec![balancer(
                "web",
                counts(10 * (i + 1), 0, 0, hist.clone()),
                vec![],
            )];
            let at = start + Duration::from_secs(i);
            let frame = st.take(at, i as f64, m, s.clone());
            // The first sample has nothing to compare with.
            assert_eq!(frame.balancers[0].point.is_some(), i > 0);
        }
        assert_eq!(st.points("web"), HISTORY);
        let h = st.history();
        assert_eq!(h.series.len(), 1);
        let series = &h.series[0];
        assert_eq!(series.t.len(), HISTORY);
        assert_eq!((series.t[0], series.t[HISTORY - 1]), (100.0, 699.0));
        assert!(series.rps.iter().all(|r| (*r - 10.0).abs() < 1e-9));
        assert!(series.p99.iter().all(|p| p.is_some_and(|p| p <= 2.5)));
        let json = serde_json::to_value(&h).unwrap();
        assert_eq!(json["series"][0]["balancer"], "web");
        assert_eq!(json["capacity"], HISTORY);
        // A balancer that goes away (a reload dropped it) is forgotten.
        st.take(start + Duration::from_secs(700), 700.0, vec![], s);
        assert_eq!(st.points("web"), 0);
        assert!(st.history().series.is_empty());
    }

    #[test]
    fn endpoint_rows_carry_state_check_and_last_minute_p99() {
        let mut st = State::default();
        let start = Instant::now();
        let s = status(vec![]);
        let zero = HistogramSnapshot::default();
        let take = |st: &mut State, i: u64, e: EndpointSnapshot| {
            let m = vec![balancer("web", BalancerCounts::default(), vec![e])];
            st.take(start + Duration::from_secs(i), i as f64, m, s.clone())
                .balancers
                .remove(0)
                .endpoints
                .remove(0)
        };
        let mut e = endpoint("10.0.0.1:80", 0, 0, 0);
        let row = take(&mut st, 0, e.clone());
        assert_eq!((row.state, row.check, row.p99_ms), ("up", None, None));
        // 50 ms requests, then a failed check: ejected by passive health, check failing.
        e.counts.request_duration = with(&zero, 100, 50);
        e.counts.checks_failed = 1;
        e.available = false;
        let row = take(&mut st, 1, e.clone());
        assert_eq!((row.state, row.check), ("ejected", Some("fail")));
        let p99 = row.p99_ms.unwrap();
        assert!((40.0..=55.0).contains(&p99), "{p99}");
        e.counts.checks_passed = 1;
        e.healthy = false;
        let row = take(&mut st, 2, e.clone());
        assert_eq!((row.state, row.check), ("down", Some("pass")));
        // With no new check the last result stays; with no new request for over a
        // minute the 50 ms requests age out.
        for i in 3..80 {
            take(&mut st, i, e.clone());
        }
        let row = take(&mut st, 80, e);
        assert_eq!((row.check, row.p99_ms), (Some("pass"), None));
    }

    struct Fixed(Mutex<u64>);

    impl Control for Fixed {
        fn status(&self) -> Status {
            status(vec![worker(0, 1, 0)])
        }
        fn reload(
            &self,
            _: Option<String>,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<String, crate::ControlError>> + Send + '_>,
        > {
            Box::pin(async { Ok("reloaded".into()) })
        }
        fn scale(
            &self,
            _: Option<String>,
            _: usize,
        ) -> std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<String, crate::ControlError>> + Send + '_>,
        > {
            Box::pin(async { Ok("scaled".into()) })
        }
        fn members(&self, b: &str) -> Result<crate::BalancerMembers, crate::ControlError> {
            Err(crate::ControlError::NotFound(b.into()))
        }
        fn metrics(&self) -> Vec<BalancerSnapshot> {
            let mut n = self.0.lock().unwrap();
            *n += 5;
            vec![balancer(
                "web",
                counts(*n, 0, 0, HistogramSnapshot::default()),
                vec![],
            )]
        }
    }

    fn frame_json(b: &Bytes) -> (String, serde_json::Value) {
        let text = std::str::from_utf8(b).unwrap();
        assert!(text.ends_with("\n\n"), "{text}");
        let mut lines = text.lines();
        let event = lines
            .next()
            .unwrap()
            .strip_prefix("event: ")
            .unwrap()
            .to_string();
        let data = lines.next().unwrap().strip_prefix("data: ").unwrap();
        (event, serde_json::from_str(data).unwrap())
    }

    #[tokio::test]
    async fn subscribers_get_the_history_then_each_sample_and_laggards_skip_ahead() {
        let sampler = Sampler::default();
        let control = Fixed(Mutex::new(0));
        let (first, _) = sampler.subscribe();
        assert_eq!(first.len(), 1, "no sample yet: the history alone");
        let (event, history) = frame_json(&first[0]);
        assert_eq!(event, "history");
        assert_eq!(history["series"], serde_json::json!([]));
        sampler.sample(&control);
        sampler.sample(&control);
        let (first, mut later) = sampler.subscribe();
        let (event, history) = frame_json(&first[0]);
        assert_eq!(event, "history");
        assert_eq!(history["series"][0]["t"].as_array().unwrap().len(), 1);
        let (event, newest) = frame_json(&first[1]);
        assert_eq!(event, "sample");
        assert_eq!(newest["apps"][0]["workers"][0]["pid"], 1);
        sampler.sample(&control);
        let (event, sample) = frame_json(&later.try_recv().unwrap());
        assert_eq!(event, "sample");
        assert_eq!(sample["balancers"][0]["requests"], 15);
        sampler.note("reload", Some("web".into()), "reloaded".into());
        let (event, note) = frame_json(&later.try_recv().unwrap());
        assert_eq!(
            (event.as_str(), note["kind"].as_str()),
            ("event", Some("reload"))
        );
        // One that never reads does not hold the sampler back nor keep every frame: it
        // is told it lagged, then gets the newest.
        for _ in 0..(BACKLOG * 3) {
            sampler.sample(&control);
        }
        assert!(matches!(
            later.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(_))
        ));
        let mut left = 0;
        while later.try_recv().is_ok() {
            left += 1;
        }
        assert_eq!(left, BACKLOG);
        // The reload is kept for subscribers to come.
        let (first, _) = sampler.subscribe();
        let (_, history) = frame_json(&first[0]);
        assert_eq!(history["events"][0]["text"], "reloaded");
    }
}
