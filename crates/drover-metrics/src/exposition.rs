//! The Prometheus text format (0.0.4) and OpenMetrics 1.0, written by hand.
//!
//! Why not the `prometheus-client` crate: its histograms take a lock per observation and
//! its registry wants to own the metrics; drover counts on striped atomics it already
//! has (see `stripe`) and renders a snapshot, which needs only the writer below. The two
//! formats differ in three places (the `TYPE` line's name for counters, `UNIT` lines and
//! the closing `# EOF`), handled here.

use crate::histogram::HistogramSnapshot;
use std::fmt::Write;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// `text/plain; version=0.0.4`: what Prometheus asks for by default.
    Prometheus,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when the `Accept` header lists it, else the classic text format (as
    /// the Go and Python client libraries negotiate).
    pub fn from_accept(accept: Option<&str>) -> Format {
        match accept {
            Some(a) if a.contains("application/openmetrics-text") => Format::OpenMetrics,
            _ => Format::Prometheus,
        }
    }

    pub fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => "text/plain; version=0.0.4; charset=utf-8",
            Format::OpenMetrics => "application/openmetrics-text; version=1.0.0; charset=utf-8",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// Writes metric families one after another.
#[derive(Debug)]
pub struct Exposition {
    format: Format,
    out: String,
    /// The family being written: its name (without `_total`) and kind.
    name: &'static str,
    kind: Kind,
}

/// Label pairs of one sample; values are escaped on output.
pub type Labels<'a> = &'a [(&'a str, &'a str)];

impl Exposition {
    pub fn new(format: Format) -> Self {
        Exposition {
            format,
            out: String::with_capacity(64 * 1024),
            name: "",
            kind: Kind::Gauge,
        }
    }

    /// Starts a counter family; `name` is without `_total`, which samples get.
    pub fn counter(&mut self, name: &'static str, help: &str) {
        self.family(name, help, Kind::Counter, None);
    }

    /// Starts a gauge family; `unit` (e.g. "seconds", "bytes") must end the name.
    pub fn gauge(&mut self, name: &'static str, help: &str, unit: Option<&str>) {
        self.family(name, help, Kind::Gauge, unit);
    }

    /// Starts a histogram family of seconds.
    pub fn histogram(&mut self, name: &'static str, help: &str) {
        self.family(name, help, Kind::Histogram, Some("seconds"));
    }

    fn family(&mut self, name: &'static str, help: &str, kind: Kind, unit: Option<&str>) {
        debug_assert!(
            unit.is_none_or(|u| name.ends_with(u)),
            "{name} must end with its unit"
        );
        self.name = name;
        self.kind = kind;
        let type_name = match kind {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        let typed = match (self.format, kind) {
            (Format::Prometheus, Kind::Counter) => format!("{name}_total"),
            _ => name.to_string(),
        };
        let _ = writeln!(self.out, "# HELP {typed} {}", escape_help(help));
        let _ = writeln!(self.out, "# TYPE {typed} {type_name}");
        if let (Format::OpenMetrics, Some(unit)) = (self.format, unit) {
            let _ = writeln!(self.out, "# UNIT {name} {unit}");
        }
    }

    /// One sample of the current counter or gauge family.
    pub fn sample(&mut self, labels: Labels<'_>, value: f64) {
        debug_assert!(self.kind != Kind::Histogram);
        let suffix = if self.kind == Kind::Counter {
            "_total"
        } else {
            ""
        };
        self.line(suffix, labels, None, value);
    }

    /// A counter's or gauge's integer sample (written without a decimal point).
    pub fn sample_u64(&mut self, labels: Labels<'_>, value: u64) {
        debug_assert!(self.kind != Kind::Histogram);
        let suffix = if self.kind == Kind::Counter {
            "_total"
        } else {
            ""
        };
        self.start(suffix, labels, None);
        let _ = writeln!(self.out, " {value}");
    }

    /// The current histogram family's series for `labels`.
    pub fn histogram_sample(&mut self, labels: Labels<'_>, h: &HistogramSnapshot) {
        debug_assert!(self.kind == Kind::Histogram);
        let exported = h.exported();
        for &(le, count) in &exported {
            self.start("_bucket", labels, Some(le));
            let _ = writeln!(self.out, " {count}");
        }
        self.line("_sum", labels, None, h.sum_ns as f64 / 1e9);
        let total = exported.last().map_or(0, |&(_, c)| c);
        self.start("_count", labels, None);
        let _ = writeln!(self.out, " {total}");
    }

    /// The text, ended as the format requires.
    pub fn finish(mut self) -> String {
        if self.format == Format::OpenMetrics {
            self.out.push_str("# EOF\n");
        }
        self.out
    }

    fn line(&mut self, suffix: &str, labels: Labels<'_>, le: Option<&str>, value: f64) {
        self.start(suffix, labels, le);
        let _ = writeln!(self.out, " {}", float(value));
    }

    fn start(&mut self, suffix: &str, labels: Labels<'_>, le: Option<&str>) {
        self.out.push_str(self.name);
        self.out.push_str(suffix);
        if labels.is_empty() && le.is_none() {
            return;
        }
        self.out.push('{');
        let mut first = true;
        for (k, v) in labels.iter().copied().chain(le.map(|le| ("le", le))) {
            if !first {
                self.out.push(',');
            }
            first = false;
            self.out.push_str(k);
            self.out.push_str("=\"");
            escape_value(&mut self.out, v);
            self.out.push('"');
        }
        self.out.push('}');
    }
}

fn float(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v.is_infinite() {
        if v > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        v.to_string()
    }
}

fn escape_value(out: &mut String, v: &str) {
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn escape_help(help: &str) -> String {
    help.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::histogram::Histogram;

    #[test]
    fn counters_are_typed_per_format_and_open_metrics_ends_with_eof() {
        for format in [Format::Prometheus, Format::OpenMetrics] {
            let mut e = Exposition::new(format);
            e.counter("drover_requests", "Requests.");
            e.sample_u64(&[("balancer", "web")], 7);
            let text = e.finish();
            assert!(text.contains("drover_requests_total{balancer=\"web\"} 7\n"));
            match format {
                Format::Prometheus => {
                    assert!(text.contains("# TYPE drover_requests_total counter\n"));
                    assert!(!text.contains("# EOF"));
                }
                Format::OpenMetrics => {
                    assert!(text.contains("# TYPE drover_requests counter\n"));
                    assert!(text.ends_with("# EOF\n"));
                }
            }
        }
    }

    #[test]
    fn label_values_are_escaped() {
        let mut e = Exposition::new(Format::Prometheus);
        e.gauge("drover_x", "X.", None);
        e.sample(&[("balancer", "a\"b\\c\nd")], 0.5);
        assert!(e
            .finish()
            .contains("drover_x{balancer=\"a\\\"b\\\\c\\nd\"} 0.5\n"));
    }

    #[test]
    fn a_histogram_has_cumulative_buckets_sum_and_count() {
        let h = Histogram::default();
        h.record(1_000_000);
        h.record(3_000_000);
        let mut e = Exposition::new(Format::OpenMetrics);
        e.histogram("drover_request_duration_seconds", "Latency.");
        e.histogram_sample(&[("balancer", "web")], &h.snapshot());
        let text = e.finish();
        assert!(text.contains("# UNIT drover_request_duration_seconds seconds\n"));
        assert!(text
            .contains("drover_request_duration_seconds_bucket{balancer=\"web\",le=\"0.001\"} 1\n"));
        assert!(text
            .contains("drover_request_duration_seconds_bucket{balancer=\"web\",le=\"0.005\"} 2\n"));
        assert!(text
            .contains("drover_request_duration_seconds_bucket{balancer=\"web\",le=\"+Inf\"} 2\n"));
        assert!(text.contains("drover_request_duration_seconds_sum{balancer=\"web\"} 0.004\n"));
        assert!(text.contains("drover_request_duration_seconds_count{balancer=\"web\"} 2\n"));
        assert_eq!(
            Format::from_accept(Some(
                "application/openmetrics-text; version=1.0.0,text/plain;q=0.5"
            )),
            Format::OpenMetrics
        );
        assert_eq!(Format::from_accept(Some("text/plain")), Format::Prometheus);
        assert_eq!(Format::from_accept(None), Format::Prometheus);
    }
}
