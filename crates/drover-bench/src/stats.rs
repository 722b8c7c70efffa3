//! Counters and latency histograms, and the report built from them.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::{Deserialize, Serialize};

use crate::admin::AdminReport;
use crate::human::{fmt_bytes, fmt_rate, fmt_us, fmt_us_f};
use crate::slo::{LatencyStat, Slo, SloMetric, SloVerdict};

/// Highest latency a histogram keeps exactly: 10 minutes, in microseconds. Larger values
/// are recorded as this value.
const MAX_US: u64 = 600_000_000;

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds")
}

/// Histograms of one interval keep 2 significant digits: enough for charts, and a tenth
/// of the memory of the run-wide ones (a long run keeps one per second).
fn new_interval_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 2).expect("valid histogram bounds")
}

/// Why a request got no response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    Connect,
    Timeout,
    Io,
    /// Open loop: never sent within `--timeout` of its scheduled time.
    Unsent,
}

/// What one thread counted in one interval (second) of the run, by completion time.
pub(crate) struct Interval {
    pub latency: Histogram<u64>,
    pub status: BTreeMap<u16, u64>,
    pub errors: Errors,
    pub bytes: u64,
}

impl Interval {
    fn new() -> Interval {
        Interval {
            latency: new_interval_histogram(),
            status: BTreeMap::new(),
            errors: Errors::default(),
            bytes: 0,
        }
    }

    fn merge(&mut self, o: &Interval) {
        let _ = self.latency.add(&o.latency);
        for (k, v) in &o.status {
            *self.status.entry(*k).or_insert(0) += v;
        }
        self.errors.add(&o.errors);
        self.bytes += o.bytes;
    }
}

/// TLS handshakes by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TlsHandshakes {
    pub full: u64,
    /// From a session ticket of an earlier connection.
    pub resumed: u64,
}

/// What one thread of the generator counted.
pub(crate) struct Stats {
    pub latency: Histogram<u64>,
    pub service: Histogram<u64>,
    pub per_path: Vec<Histogram<u64>>,
    /// Per path: requests that got no response (every kind of `Errors` but `status`).
    pub per_path_failed: Vec<u64>,
    pub requests: u64,
    pub ok: u64,
    /// Response bytes read (heads and bodies).
    pub bytes: u64,
    pub status: BTreeMap<u16, u64>,
    pub errors: Errors,
    pub conn_waits: u64,
    pub connections_opened: u64,
    /// TLS handshakes of the connections opened (an `https://` target).
    pub tls: TlsHandshakes,
    /// Responses per value of the `--count-header` header, when one was asked for.
    pub header_counts: Option<HeaderCounts>,
    /// Index `i` holds what completed in second `i` of the run.
    pub intervals: Vec<Interval>,
}

/// One response, as [`Stats::record`] counts it.
pub(crate) struct Outcome<'a> {
    pub path: usize,
    pub status: u16,
    /// The value of the counted header, if the response had it.
    pub tag: Option<&'a str>,
    /// From the send (closed loop) or from the scheduled send time (open loop).
    pub latency_us: u64,
    /// From the moment the request was written.
    pub service_us: u64,
    pub bytes: u64,
    /// The second of the run it completed in.
    pub interval: usize,
}

impl Stats {
    pub fn new(paths: usize, count_header: Option<&str>) -> Stats {
        Stats {
            latency: new_histogram(),
            service: new_histogram(),
            per_path: (0..paths).map(|_| new_histogram()).collect(),
            per_path_failed: vec![0; paths],
            requests: 0,
            ok: 0,
            bytes: 0,
            status: BTreeMap::new(),
            errors: Errors::default(),
            conn_waits: 0,
            connections_opened: 0,
            tls: TlsHandshakes::default(),
            header_counts: count_header.map(HeaderCounts::new),
            intervals: Vec::new(),
        }
    }

    /// A connection was opened; `handshake` is how its TLS handshake went, if any.
    pub fn opened(&mut self, handshake: Option<crate::tls::Handshake>) {
        self.connections_opened += 1;
        match handshake {
            Some(crate::tls::Handshake::Full) => self.tls.full += 1,
            Some(crate::tls::Handshake::Resumed) => self.tls.resumed += 1,
            None => {}
        }
    }

    fn interval_mut(&mut self, i: usize) -> &mut Interval {
        while self.intervals.len() <= i {
            self.intervals.push(Interval::new());
        }
        &mut self.intervals[i]
    }

    /// A response arrived.
    pub fn record(&mut self, o: &Outcome<'_>) {
        self.requests += 1;
        self.bytes += o.bytes;
        if let Some(c) = &mut self.header_counts {
            c.add(o.tag, 1);
        }
        *self.status.entry(o.status).or_insert(0) += 1;
        if (200..300).contains(&o.status) {
            self.ok += 1;
        } else {
            self.errors.status += 1;
        }
        let l = o.latency_us.clamp(1, MAX_US);
        self.latency.saturating_record(l);
        self.per_path[o.path].saturating_record(l);
        self.service
            .saturating_record(o.service_us.clamp(1, MAX_US));
        let iv = self.interval_mut(o.interval);
        iv.latency.saturating_record(l);
        *iv.status.entry(o.status).or_insert(0) += 1;
        if !(200..300).contains(&o.status) {
            iv.errors.status += 1;
        }
        iv.bytes += o.bytes;
    }

    /// A request failed without a response.
    pub fn error(&mut self, path: usize, kind: ErrorKind, interval: usize) {
        self.errors.count(kind);
        if let Some(n) = self.per_path_failed.get_mut(path) {
            *n += 1;
        }
        self.interval_mut(interval).errors.count(kind);
    }

    pub fn merge(&mut self, o: &Stats) {
        // Same bounds everywhere, so `add` cannot fail.
        let _ = self.latency.add(&o.latency);
        let _ = self.service.add(&o.service);
        for (a, b) in self.per_path.iter_mut().zip(&o.per_path) {
            let _ = a.add(b);
        }
        for (a, b) in self.per_path_failed.iter_mut().zip(&o.per_path_failed) {
            *a += b;
        }
        self.requests += o.requests;
        self.ok += o.ok;
        self.bytes += o.bytes;
        for (k, v) in &o.status {
            *self.status.entry(*k).or_insert(0) += v;
        }
        self.errors.add(&o.errors);
        self.conn_waits += o.conn_waits;
        self.connections_opened += o.connections_opened;
        self.tls.full += o.tls.full;
        self.tls.resumed += o.tls.resumed;
        if let (Some(a), Some(b)) = (&mut self.header_counts, &o.header_counts) {
            a.merge(b);
        }
        for (i, iv) in o.intervals.iter().enumerate() {
            self.interval_mut(i).merge(iv);
        }
    }
}

/// Most distinct values of the counted header that are kept apart. A header that
/// differs on every response (a request id, say) would otherwise grow the report with
/// the run; past this many values, responses are counted together as `other`.
pub const MAX_HEADER_VALUES: usize = 64;

/// Responses counted per value of one response header (`--count-header`), e.g. how many
/// requests each worker answered when workers name themselves in `x-worker`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HeaderCounts {
    /// The header's name as given.
    pub header: String,
    /// Responses per value, for the first [`MAX_HEADER_VALUES`] distinct values seen.
    pub values: BTreeMap<String, u64>,
    /// Responses with a value beyond the first [`MAX_HEADER_VALUES`].
    pub other: u64,
    /// Responses without the header.
    pub missing: u64,
}

impl HeaderCounts {
    pub fn new(header: &str) -> HeaderCounts {
        HeaderCounts {
            header: header.to_string(),
            ..HeaderCounts::default()
        }
    }

    /// Counts `n` responses whose header had `value` (`None`: no such header).
    pub fn add(&mut self, value: Option<&str>, n: u64) {
        let Some(v) = value else {
            self.missing += n;
            return;
        };
        if let Some(c) = self.values.get_mut(v) {
            *c += n;
        } else if self.values.len() < MAX_HEADER_VALUES {
            self.values.insert(v.to_string(), n);
        } else {
            self.other += n;
        }
    }

    pub fn merge(&mut self, o: &HeaderCounts) {
        for (v, n) in &o.values {
            self.add(Some(v), *n);
        }
        self.other += o.other;
        self.missing += o.missing;
    }

    pub fn total(&self) -> u64 {
        self.values.values().sum::<u64>() + self.other + self.missing
    }

    /// Values in natural order: numbers by value (worker 2 before worker 10), then text.
    pub fn sorted(&self) -> Vec<(&str, u64)> {
        let mut v: Vec<(&str, u64)> = self.values.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        v.sort_by(|a, b| natural(a.0, b.0));
        v
    }
}

fn natural(a: &str, b: &str) -> Ordering {
    match (a.parse::<u64>(), b.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        (Ok(_), Err(_)) => Ordering::Less,
        (Err(_), Ok(_)) => Ordering::Greater,
        (Err(_), Err(_)) => a.cmp(b),
    }
}

/// Failed requests by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Errors {
    /// Could not open a connection.
    pub connect: u64,
    /// A response came with a status outside 2xx.
    pub status: u64,
    /// No response within `--timeout` (open loop: counted from the scheduled time).
    pub timeout: u64,
    /// Connection reset or closed mid-response, or a response that did not parse.
    pub io: u64,
    /// Open loop: never sent within `--timeout` of its scheduled time, because every
    /// connection (`-c`) stayed busy, or drover bench itself fell behind `--rate`. Not
    /// the server's timeouts: the server never saw these.
    #[serde(default)]
    pub unsent: u64,
}

impl Errors {
    pub fn total(&self) -> u64 {
        self.status + self.without_response()
    }

    /// Requests that got no response at all (every kind but `status`).
    pub fn without_response(&self) -> u64 {
        self.connect + self.timeout + self.io + self.unsent
    }

    pub(crate) fn count(&mut self, kind: ErrorKind) {
        match kind {
            ErrorKind::Connect => self.connect += 1,
            ErrorKind::Timeout => self.timeout += 1,
            ErrorKind::Io => self.io += 1,
            ErrorKind::Unsent => self.unsent += 1,
        }
    }

    pub(crate) fn add(&mut self, o: &Errors) {
        self.connect += o.connect;
        self.status += o.status;
        self.timeout += o.timeout;
        self.io += o.io;
        self.unsent += o.unsent;
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    pub count: u64,
    pub min: u64,
    pub mean: f64,
    /// Standard deviation.
    #[serde(default)]
    pub stdev: f64,
    pub p50: u64,
    #[serde(default)]
    pub p75: u64,
    pub p90: u64,
    pub p99: u64,
    pub p99_9: u64,
    pub max: u64,
}

impl Percentiles {
    pub fn of(h: &Histogram<u64>) -> Percentiles {
        if h.is_empty() {
            return Percentiles::default();
        }
        Percentiles {
            count: h.len(),
            min: h.min(),
            mean: (h.mean() * 10.0).round() / 10.0,
            stdev: (h.stdev() * 10.0).round() / 10.0,
            p50: h.value_at_quantile(0.50),
            p75: h.value_at_quantile(0.75),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p99_9: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

/// Points of the latency spectrum: percentiles at 1 - 2^(-k/4) for k = 0, 1, 2, ... up
/// to the resolution the number of samples allows, then the maximum. Plotted against
/// 1/(1 - percentile/100) on a log axis, as HdrHistogram's plots do, every "nine" gets
/// the same width.
pub fn spectrum(h: &Histogram<u64>) -> Vec<SpectrumPoint> {
    let mut out = Vec::new();
    if h.is_empty() {
        return out;
    }
    let n = h.len() as f64;
    for k in 0..=120 {
        let q = 1.0 - 0.5f64.powf(f64::from(k) / 4.0);
        if 1.0 / (1.0 - q) > n {
            break;
        }
        out.push(SpectrumPoint {
            percentile: (q * 100.0 * 1e6).round() / 1e6,
            latency_us: h.value_at_quantile(q),
        });
    }
    out.push(SpectrumPoint {
        percentile: 100.0,
        latency_us: h.max(),
    });
    out
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SpectrumPoint {
    pub percentile: f64,
    pub latency_us: u64,
}

/// What completed in one second of the run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntervalReport {
    /// Start, in seconds from the start of the run.
    pub t: f64,
    /// How long the interval is: 1 s, except the last (see [`interval_reports`]).
    pub duration_s: f64,
    /// Responses, any status.
    pub requests: u64,
    /// Responses per second.
    pub rps: f64,
    /// Open loop: requests scheduled per second in this interval.
    pub target_rps: Option<f64>,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub status: BTreeMap<String, u64>,
    pub errors: Errors,
    pub bytes: u64,
}

/// Reports of the run's seconds. A run ends a few milliseconds after a whole second (the
/// last answers), and a sliver's rate would be noise, so a last interval shorter than
/// half a second is folded into the one before. `scheduled(from, to)` is how many
/// requests the open-loop schedule has due in that span (None: closed loop).
pub(crate) fn interval_reports(
    mut intervals: Vec<Interval>,
    elapsed: f64,
    scheduled: impl Fn(f64, f64) -> Option<u64>,
) -> Vec<IntervalReport> {
    let whole = elapsed.ceil().max(1.0) as usize;
    while intervals.len() < whole {
        intervals.push(Interval::new());
    }
    // Answers are counted up to `elapsed`, so nothing lies beyond `whole`.
    intervals.truncate(whole);
    let mut spans: Vec<(f64, f64)> = (0..whole)
        .map(|i| (i as f64, (elapsed - i as f64).clamp(0.0, 1.0)))
        .collect();
    if whole >= 2 && spans[whole - 1].1 < 0.5 {
        let last = intervals.pop().expect("at least two intervals");
        intervals[whole - 2].merge(&last);
        let (_, d) = spans.pop().expect("at least two spans");
        spans[whole - 2].1 += d;
    }
    intervals
        .iter()
        .zip(spans)
        .map(|(iv, (t, d))| {
            let d = d.max(1e-3);
            let requests = iv.latency.len();
            let rate = |n: u64| (n as f64 / d * 10.0).round() / 10.0;
            IntervalReport {
                t,
                duration_s: (d * 1e4).round() / 1e4,
                requests,
                rps: rate(requests),
                target_rps: scheduled(t, t + d).map(rate),
                p50_us: quantile(&iv.latency, 0.5),
                p90_us: quantile(&iv.latency, 0.9),
                p99_us: quantile(&iv.latency, 0.99),
                max_us: if requests == 0 { 0 } else { iv.latency.max() },
                status: iv.status.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                errors: iv.errors,
                bytes: iv.bytes,
            }
        })
        .collect()
}

fn quantile(h: &Histogram<u64>, q: f64) -> u64 {
    if h.is_empty() {
        0
    } else {
        h.value_at_quantile(q)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PathReport {
    pub weight: u32,
    /// Responses, of any status.
    pub requests: u64,
    /// Requests that got none: connect errors, timeouts, resets, never sent.
    pub without_response: u64,
    pub latency_us: Percentiles,
}

/// The result of a run. Serialises to the `--json` output.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// "closed" or "open".
    pub mode: &'static str,
    pub target: String,
    /// Every request's method (`--method`).
    pub method: String,
    pub mix: String,
    pub threads: usize,
    /// Closed loop: connections kept busy. Open loop: most connections the pool may open.
    pub connections: usize,
    /// Open loop: the offered rate in requests/s.
    pub rate: Option<f64>,
    /// Open loop: which idle connection a request goes out on (`random`, `newest`).
    pub reuse: Option<String>,
    pub duration_s: f64,
    /// From the start until the last response.
    pub elapsed_s: f64,
    /// Responses received, any status.
    pub requests: u64,
    /// Responses with a 2xx status.
    pub ok: u64,
    /// Responses per second of `elapsed_s`.
    pub rps: f64,
    /// Response bytes read, heads and bodies.
    pub bytes: u64,
    /// Bytes per second of `elapsed_s`.
    pub bytes_per_s: f64,
    /// Closed loop: from send to response. Open loop: from the scheduled send time to
    /// response, so waiting for a connection or for a late timer counts.
    pub latency_us: Percentiles,
    /// Open loop only: from the moment the request was written to the response.
    pub service_us: Option<Percentiles>,
    pub errors: Errors,
    pub errors_total: u64,
    /// Open loop: requests that found every connection busy and had to wait.
    pub conn_waits: u64,
    pub connections_opened: u64,
    /// The TLS handshakes of those connections; absent for a plain `http://` target.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsHandshakes>,
    /// Responses by status code.
    pub status: BTreeMap<String, u64>,
    pub paths: BTreeMap<String, PathReport>,
    /// Responses per value of the `--count-header` header; absent without that option.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_counts: Option<HeaderCounts>,
    /// The latency percentile distribution (see [`spectrum`]).
    pub spectrum: Vec<SpectrumPoint>,
    /// One entry per second of the run, by completion time.
    pub intervals: Vec<IntervalReport>,
    /// What drover's admin `/metrics` counted during the run (`--admin`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin: Option<AdminReport>,
    /// The verdict on each `--slo`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub slo: Vec<SloVerdict>,
    #[serde(skip)]
    pub histogram: Option<Histogram<u64>>,
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("report serialises")
    }

    /// Requests that were attempted: answered, or failed without an answer.
    pub fn attempts(&self) -> u64 {
        self.requests + self.errors.without_response()
    }

    /// The value an objective on `metric` is about, in its unit (µs, percent,
    /// requests/s).
    pub fn measure(&self, metric: SloMetric) -> f64 {
        let l = &self.latency_us;
        match metric {
            SloMetric::Latency(stat) => match stat {
                LatencyStat::P50 => l.p50 as f64,
                LatencyStat::P75 => l.p75 as f64,
                LatencyStat::P90 => l.p90 as f64,
                LatencyStat::P99 => l.p99 as f64,
                LatencyStat::P999 => l.p99_9 as f64,
                LatencyStat::Max => l.max as f64,
                LatencyStat::Mean => l.mean,
            },
            SloMetric::ErrorPercent => {
                let attempts = self.attempts();
                if attempts == 0 {
                    0.0
                } else {
                    self.errors_total as f64 * 100.0 / attempts as f64
                }
            }
            SloMetric::Rps => self.rps,
        }
    }

    /// Whether this run met `slo`.
    pub fn judge(&self, slo: &Slo) -> SloVerdict {
        slo.verdict(self.measure(slo.metric))
    }

    /// The human-readable summary, laid out like wrk's.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let mode = match self.rate {
            Some(r) => format!(
                "open loop at {} req/s, up to {} connections (reuse {})",
                fmt_rate(r),
                self.connections,
                self.reuse.as_deref().unwrap_or("random")
            ),
            None => format!("closed loop, {} connections", self.connections),
        };
        let _ = writeln!(
            s,
            "drover bench → {}{}  {mode}, {} thread(s), {:.1}s, mix {}",
            if self.method == "GET" {
                String::new()
            } else {
                format!("{} ", self.method)
            },
            self.target,
            self.threads,
            self.duration_s,
            self.mix
        );
        let l = &self.latency_us;
        let _ = writeln!(
            s,
            "  Latency    avg {}  stdev {}  max {}{}",
            fmt_us_f(l.mean),
            fmt_us_f(l.stdev),
            fmt_us(l.max),
            if self.rate.is_some() {
                "  (from each request's scheduled send time)"
            } else {
                ""
            }
        );
        let _ = writeln!(s, "  Latency distribution");
        for (label, v) in [
            ("50%", l.p50),
            ("75%", l.p75),
            ("90%", l.p90),
            ("99%", l.p99),
            ("99.9%", l.p99_9),
        ] {
            let _ = writeln!(s, "    {label:>6}  {}", fmt_us(v));
        }
        if let Some(sv) = &self.service_us {
            let _ = writeln!(
                s,
                "  Service    p50 {}  p90 {}  p99 {}  max {}  (from write, without waiting)",
                fmt_us(sv.p50),
                fmt_us(sv.p90),
                fmt_us(sv.p99),
                fmt_us(sv.max)
            );
        }
        if self.paths.len() > 1 {
            for (p, r) in &self.paths {
                let l = &r.latency_us;
                let failed = if r.without_response > 0 {
                    format!(" ({} with no response)", r.without_response)
                } else {
                    String::new()
                };
                let _ = writeln!(
                    s,
                    "  {p:<10} {} requests{failed}  p50 {}  p99 {}  max {}",
                    r.requests,
                    fmt_us(l.p50),
                    fmt_us(l.p99),
                    fmt_us(l.max)
                );
            }
        }
        let _ = writeln!(
            s,
            "  {} requests in {:.2}s, {} read, {} ok",
            self.requests,
            self.elapsed_s,
            fmt_bytes(self.bytes as f64),
            self.ok
        );
        let non_2xx = self.requests - self.ok;
        if non_2xx > 0 {
            let codes: Vec<String> = self
                .status
                .iter()
                .filter(|(k, _)| !k.starts_with('2'))
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(s, "  Non-2xx responses: {non_2xx} ({})", codes.join(", "));
        }
        let e = &self.errors;
        if e.without_response() > 0 {
            let _ = writeln!(
                s,
                "  Errors: {} (connect {}, timeout {}, io {}{})",
                e.without_response(),
                e.connect,
                e.timeout,
                e.io,
                if e.unsent > 0 {
                    format!(", never sent {}", e.unsent)
                } else {
                    String::new()
                }
            );
        }
        if e.unsent > 0 {
            let _ = writeln!(
                s,
                "  note       {} requests were never sent within --timeout of their scheduled \
                 time: every connection stayed busy (raise -c), or drover bench could not keep \
                 up with --rate (raise -t); the server never saw them",
                e.unsent
            );
        }
        if let Some(c) = &self.header_counts {
            let total = c.total().max(1) as f64;
            let mut parts: Vec<String> = c
                .sorted()
                .iter()
                .map(|(v, n)| format!("{v}: {n} ({:.1}%)", *n as f64 * 100.0 / total))
                .collect();
            if c.other > 0 {
                parts.push(format!("other: {}", c.other));
            }
            if c.missing > 0 {
                parts.push(format!("without header: {}", c.missing));
            }
            let _ = writeln!(s, "  {:<10} {}", c.header, parts.join(", "));
        }
        if let Some(t) = &self.tls {
            let _ = writeln!(
                s,
                "  TLS        {} connections: {} full handshakes, {} resumed",
                self.connections_opened, t.full, t.resumed
            );
        }
        if self.rate.is_some() && self.conn_waits > 0 {
            let _ = writeln!(
                s,
                "  note       {} requests waited for a free connection (counted in latency)",
                self.conn_waits
            );
        }
        let _ = writeln!(s, "Requests/sec: {:.2}", self.rps);
        let _ = writeln!(s, "Transfer/sec: {}", fmt_bytes(self.bytes_per_s));
        if let Some(a) = &self.admin {
            s.push_str(&a.render_text());
        }
        for v in &self.slo {
            let _ = writeln!(s, "{v}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_counts_per_value_and_missing() {
        let mut c = HeaderCounts::new("x-worker");
        c.add(Some("2"), 1);
        c.add(Some("10"), 3);
        c.add(Some("2"), 1);
        c.add(None, 4);
        c.add(Some("b"), 1);
        assert_eq!(c.values["2"], 2);
        assert_eq!(c.values["10"], 3);
        assert_eq!((c.other, c.missing, c.total()), (0, 4, 10));
        assert_eq!(c.sorted(), vec![("2", 2), ("10", 3), ("b", 1)]);
    }

    #[test]
    fn header_counts_are_bounded() {
        let mut c = HeaderCounts::new("x-request-id");
        for i in 0..MAX_HEADER_VALUES + 10 {
            c.add(Some(&i.to_string()), 1);
        }
        assert_eq!(c.values.len(), MAX_HEADER_VALUES);
        assert_eq!(c.other, 10);
        // A value already kept is still counted as itself.
        c.add(Some("0"), 1);
        assert_eq!(c.values["0"], 2);
        assert_eq!(c.total(), MAX_HEADER_VALUES as u64 + 11);
    }

    #[test]
    fn merging_threads_keeps_the_bound_and_the_totals() {
        let mut a = HeaderCounts::new("x-worker");
        let mut b = HeaderCounts::new("x-worker");
        for i in 0..MAX_HEADER_VALUES {
            a.add(Some(&format!("a{i}")), 1);
        }
        b.add(Some("a0"), 5);
        b.add(Some("new"), 2);
        b.add(None, 1);
        a.merge(&b);
        assert_eq!(a.values["a0"], 6);
        assert!(!a.values.contains_key("new"));
        assert_eq!((a.other, a.missing), (2, 1));
        assert_eq!(a.total(), MAX_HEADER_VALUES as u64 + 8);
    }

    #[test]
    fn stats_count_the_header_only_when_asked() {
        let outcome = |status, tag| Outcome {
            path: 0,
            status,
            tag,
            latency_us: 10,
            service_us: 10,
            bytes: 40,
            interval: 0,
        };
        let mut on = Stats::new(1, Some("x-worker"));
        on.record(&outcome(200, Some("1")));
        on.record(&outcome(502, None));
        let mut off = Stats::new(1, None);
        off.record(&outcome(200, Some("1")));
        on.merge(&off);
        let c = on.header_counts.unwrap();
        assert_eq!((c.values["1"], c.missing), (1, 1));
        assert!(off.header_counts.is_none());
    }

    #[test]
    fn intervals_split_by_second_and_fold_the_last_sliver() {
        let mut st = Stats::new(1, None);
        for (interval, status, lat) in [
            (0, 200, 1000),
            (0, 200, 3000),
            (1, 500, 2000),
            (2, 200, 9000),
        ] {
            st.record(&Outcome {
                path: 0,
                status,
                tag: None,
                latency_us: lat,
                service_us: lat,
                bytes: 100,
                interval,
            });
        }
        st.error(0, ErrorKind::Timeout, 1);
        assert_eq!(st.errors.timeout, 1);
        // 2.2 s: the third second is a 0.2 s sliver and joins the second.
        let ivs = interval_reports(st.intervals, 2.2, |from, to| {
            Some(((to - from) * 10.0).round() as u64)
        });
        assert_eq!(ivs.len(), 2);
        assert_eq!(
            (ivs[0].t, ivs[0].duration_s, ivs[0].requests),
            (0.0, 1.0, 2)
        );
        assert_eq!(ivs[0].rps, 2.0);
        assert_eq!(ivs[0].target_rps, Some(10.0));
        assert!((2990..=3010).contains(&ivs[0].max_us), "{}", ivs[0].max_us);
        assert_eq!((ivs[1].duration_s, ivs[1].requests), (1.2, 2));
        assert_eq!(ivs[1].errors.timeout, 1);
        assert_eq!(ivs[1].errors.status, 1);
        assert_eq!(ivs[1].status["500"], 1);
        assert_eq!(ivs[1].bytes, 200);
        assert!((8950..=9050).contains(&ivs[1].max_us));
        // 2.6 s: the last 0.6 s stands alone; seconds nothing completed in are there too.
        let st = Stats::new(1, None);
        let ivs = interval_reports(st.intervals, 2.6, |_, _| None);
        assert_eq!(ivs.len(), 3);
        assert_eq!(
            (ivs[2].duration_s, ivs[2].requests, ivs[2].target_rps),
            (0.6, 0, None)
        );
    }

    #[test]
    fn spectrum_reaches_the_tail_the_samples_allow() {
        let mut h = new_histogram();
        for v in 1..=10_000u64 {
            h.record(v).unwrap();
        }
        let sp = spectrum(&h);
        assert_eq!(sp[0].percentile, 0.0);
        assert_eq!(sp.last().unwrap().percentile, 100.0);
        assert_eq!(sp.last().unwrap().latency_us, h.max());
        // 10,000 samples resolve 1/(1-q) up to 10,000: the 99.99th percentile.
        let finest = sp[sp.len() - 2].percentile;
        assert!((99.98..=99.99).contains(&finest), "{finest}");
        assert!(sp.windows(2).all(|w| w[0].percentile < w[1].percentile));
        assert!(sp.windows(2).all(|w| w[0].latency_us <= w[1].latency_us));
        assert!(spectrum(&new_histogram()).is_empty());
    }
}
