//! Counters and latency histograms, and the report built from them.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use hdrhistogram::Histogram;
use serde::Serialize;

/// Highest latency a histogram keeps exactly: 10 minutes, in microseconds. Larger values
/// are recorded as this value.
const MAX_US: u64 = 600_000_000;

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_US, 3).expect("valid histogram bounds")
}

/// What one thread of the generator counted.
pub(crate) struct Stats {
    pub latency: Histogram<u64>,
    pub service: Histogram<u64>,
    pub per_path: Vec<Histogram<u64>>,
    pub requests: u64,
    pub ok: u64,
    pub status: BTreeMap<u16, u64>,
    pub errors: Errors,
    pub conn_waits: u64,
    pub connections_opened: u64,
    /// Responses per value of the `--count-header` header, when one was asked for.
    pub header_counts: Option<HeaderCounts>,
}

impl Stats {
    pub fn new(paths: usize, count_header: Option<&str>) -> Stats {
        Stats {
            latency: new_histogram(),
            service: new_histogram(),
            per_path: (0..paths).map(|_| new_histogram()).collect(),
            requests: 0,
            ok: 0,
            status: BTreeMap::new(),
            errors: Errors::default(),
            conn_waits: 0,
            connections_opened: 0,
            header_counts: count_header.map(HeaderCounts::new),
        }
    }

    /// A response arrived. `latency_us` counts from the send (closed loop) or from the
    /// scheduled send time (open loop); `service_us` from the moment it was written.
    /// `tag` is the value of the counted header, if the response had it.
    pub fn record(
        &mut self,
        path: usize,
        status: u16,
        tag: Option<&str>,
        latency_us: u64,
        service_us: u64,
    ) {
        self.requests += 1;
        if let Some(c) = &mut self.header_counts {
            c.add(tag, 1);
        }
        *self.status.entry(status).or_insert(0) += 1;
        if (200..300).contains(&status) {
            self.ok += 1;
        } else {
            self.errors.status += 1;
        }
        let l = latency_us.clamp(1, MAX_US);
        self.latency.saturating_record(l);
        self.per_path[path].saturating_record(l);
        self.service.saturating_record(service_us.clamp(1, MAX_US));
    }

    pub fn merge(&mut self, o: &Stats) {
        // Same bounds everywhere, so `add` cannot fail.
        let _ = self.latency.add(&o.latency);
        let _ = self.service.add(&o.service);
        for (a, b) in self.per_path.iter_mut().zip(&o.per_path) {
            let _ = a.add(b);
        }
        self.requests += o.requests;
        self.ok += o.ok;
        for (k, v) in &o.status {
            *self.status.entry(*k).or_insert(0) += v;
        }
        self.errors.connect += o.errors.connect;
        self.errors.status += o.errors.status;
        self.errors.timeout += o.errors.timeout;
        self.errors.io += o.errors.io;
        self.conn_waits += o.conn_waits;
        self.connections_opened += o.connections_opened;
        if let (Some(a), Some(b)) = (&mut self.header_counts, &o.header_counts) {
            a.merge(b);
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Errors {
    /// Could not open a connection.
    pub connect: u64,
    /// A response came with a status outside 2xx.
    pub status: u64,
    /// No response within `--timeout` (open loop: counted from the scheduled time).
    pub timeout: u64,
    /// Connection reset or closed mid-response, or a response that did not parse.
    pub io: u64,
}

impl Errors {
    pub fn total(&self) -> u64 {
        self.connect + self.status + self.timeout + self.io
    }
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Percentiles {
    pub count: u64,
    pub min: u64,
    pub mean: f64,
    pub p50: u64,
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
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p99_9: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PathReport {
    pub weight: u32,
    pub requests: u64,
    pub latency_us: Percentiles,
}

/// The result of a run. Serialises to the `--json` output.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// "closed" or "open".
    pub mode: &'static str,
    pub target: String,
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
    /// Responses by status code.
    pub status: BTreeMap<String, u64>,
    pub paths: BTreeMap<String, PathReport>,
    /// Responses per value of the `--count-header` header; absent without that option.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub header_counts: Option<HeaderCounts>,
    #[serde(skip)]
    pub histogram: Option<Histogram<u64>>,
}

fn us(v: u64) -> String {
    if v >= 10_000 {
        format!("{:.1}ms", v as f64 / 1000.0)
    } else if v >= 1000 {
        format!("{:.2}ms", v as f64 / 1000.0)
    } else {
        format!("{v}µs")
    }
}

impl Report {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("report serialises")
    }

    /// The human-readable summary.
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let mode = match self.rate {
            Some(r) => format!(
                "open loop at {r:.0} req/s, up to {} connections (reuse {})",
                self.connections,
                self.reuse.as_deref().unwrap_or("random")
            ),
            None => format!("closed loop, {} connections", self.connections),
        };
        let _ = writeln!(
            s,
            "drover-loadgen → {}  {mode}, {} thread(s), {:.1}s, mix {}",
            self.target, self.threads, self.duration_s, self.mix
        );
        let _ = writeln!(
            s,
            "  requests   {} in {:.2}s = {:.1} req/s ({} ok)",
            self.requests, self.elapsed_s, self.rps, self.ok
        );
        let l = &self.latency_us;
        let _ = writeln!(
            s,
            "  latency    p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (mean {})",
            us(l.p50),
            us(l.p90),
            us(l.p99),
            us(l.p99_9),
            us(l.max),
            us(l.mean as u64)
        );
        if let Some(sv) = &self.service_us {
            let _ = writeln!(
                s,
                "  service    p50 {}  p90 {}  p99 {}  p99.9 {}  max {}  (from write, without queueing)",
                us(sv.p50),
                us(sv.p90),
                us(sv.p99),
                us(sv.p99_9),
                us(sv.max)
            );
        }
        if self.paths.len() > 1 {
            for (p, r) in &self.paths {
                let l = &r.latency_us;
                let _ = writeln!(
                    s,
                    "  {p:<10} {} requests  p50 {}  p99 {}  max {}",
                    r.requests,
                    us(l.p50),
                    us(l.p99),
                    us(l.max)
                );
            }
        }
        let e = &self.errors;
        let _ = writeln!(
            s,
            "  errors     {} (connect {}, status {}, timeout {}, io {})",
            self.errors_total, e.connect, e.status, e.timeout, e.io
        );
        if !self.status.is_empty() && self.status.keys().any(|k| k != "200") {
            let codes: Vec<String> = self
                .status
                .iter()
                .map(|(k, v)| format!("{k}: {v}"))
                .collect();
            let _ = writeln!(s, "  status     {}", codes.join(", "));
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
        if self.rate.is_some() && self.conn_waits > 0 {
            let _ = writeln!(
                s,
                "  note       {} requests waited for a free connection (counted in latency)",
                self.conn_waits
            );
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
        let mut on = Stats::new(1, Some("x-worker"));
        on.record(0, 200, Some("1"), 10, 10);
        on.record(0, 502, None, 10, 10);
        let mut off = Stats::new(1, None);
        off.record(0, 200, Some("1"), 10, 10);
        on.merge(&off);
        let c = on.header_counts.unwrap();
        assert_eq!((c.values["1"], c.missing), (1, 1));
        assert!(off.header_counts.is_none());
    }
}
