//! Service level objectives checked after a run: `--slo 'p99<50ms'`, `errors<0.1%`,
//! `rps>1000`. Each is one metric, one comparison and one threshold; a run that breaches
//! any of them makes `drover bench` exit with [`crate::cli::EXIT_SLO_BREACHED`].

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

use crate::human::fmt_us_f;

/// A latency statistic of the whole run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LatencyStat {
    P50,
    P75,
    P90,
    P99,
    P999,
    Max,
    Mean,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SloMetric {
    Latency(LatencyStat),
    /// Failed requests (no response, or a status outside 2xx) in percent of attempts.
    ErrorPercent,
    /// Responses per second over the run.
    Rps,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Comparison {
    Below,
    AtMost,
    Above,
    AtLeast,
}

impl Comparison {
    fn holds(self, actual: f64, threshold: f64) -> bool {
        match self {
            Comparison::Below => actual < threshold,
            Comparison::AtMost => actual <= threshold,
            Comparison::Above => actual > threshold,
            Comparison::AtLeast => actual >= threshold,
        }
    }
}

/// One objective. `threshold` is in microseconds for latencies, percent for errors,
/// requests/s for the rate.
#[derive(Debug, Clone, PartialEq)]
pub struct Slo {
    pub text: String,
    pub metric: SloMetric,
    pub comparison: Comparison,
    pub threshold: f64,
}

/// Why an objective's text was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SloError {
    NoComparison(String),
    UnknownMetric {
        slo: String,
        metric: String,
    },
    BadValue {
        slo: String,
        value: String,
        expected: &'static str,
    },
}

const METRICS: &str = "p50, p75, p90, p99, p999, max, mean, errors, rps";

impl fmt::Display for SloError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SloError::NoComparison(s) => write!(
                f,
                "SLO {s:?} has no comparison; expected METRIC<VALUE or METRIC>VALUE, e.g. p99<50ms"
            ),
            SloError::UnknownMetric { slo, metric } => {
                write!(
                    f,
                    "SLO {slo:?}: unknown metric {metric:?}; expected one of {METRICS}"
                )
            }
            SloError::BadValue {
                slo,
                value,
                expected,
            } => {
                write!(f, "SLO {slo:?}: bad value {value:?}; expected {expected}")
            }
        }
    }
}

impl std::error::Error for SloError {}

impl FromStr for Slo {
    type Err = SloError;

    fn from_str(text: &str) -> Result<Slo, SloError> {
        let text = text.trim();
        let at = text
            .find(['<', '>'])
            .ok_or_else(|| SloError::NoComparison(text.to_string()))?;
        let (name, rest) = (text[..at].trim(), &text[at..]);
        let (comparison, value) = if let Some(v) = rest.strip_prefix("<=") {
            (Comparison::AtMost, v)
        } else if let Some(v) = rest.strip_prefix(">=") {
            (Comparison::AtLeast, v)
        } else if let Some(v) = rest.strip_prefix('<') {
            (Comparison::Below, v)
        } else {
            (Comparison::Above, &rest[1..])
        };
        let value = value.trim();
        let metric = match name.to_ascii_lowercase().as_str() {
            "p50" => SloMetric::Latency(LatencyStat::P50),
            "p75" => SloMetric::Latency(LatencyStat::P75),
            "p90" => SloMetric::Latency(LatencyStat::P90),
            "p99" => SloMetric::Latency(LatencyStat::P99),
            "p999" | "p99.9" => SloMetric::Latency(LatencyStat::P999),
            "max" => SloMetric::Latency(LatencyStat::Max),
            "mean" | "avg" => SloMetric::Latency(LatencyStat::Mean),
            "errors" => SloMetric::ErrorPercent,
            "rps" => SloMetric::Rps,
            _ => {
                return Err(SloError::UnknownMetric {
                    slo: text.to_string(),
                    metric: name.to_string(),
                })
            }
        };
        let bad = |expected| SloError::BadValue {
            slo: text.to_string(),
            value: value.to_string(),
            expected,
        };
        let threshold = match metric {
            SloMetric::Latency(_) => latency_us(value)
                .ok_or_else(|| bad("a latency with a unit, e.g. 50ms, 1.5s, 800us"))?,
            SloMetric::ErrorPercent => value
                .strip_suffix('%')
                .and_then(|v| v.trim().parse::<f64>().ok())
                .filter(|v| v.is_finite() && (0.0..=100.0).contains(v))
                .ok_or_else(|| bad("a percentage from 0% to 100%, e.g. 0.1%"))?,
            SloMetric::Rps => value
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| bad("requests per second, e.g. 1000"))?,
        };
        Ok(Slo {
            text: text.to_string(),
            metric,
            comparison,
            threshold,
        })
    }
}

/// `50ms`, `1.5s`, `800us` in microseconds; a unit is required, since "p99<50" could
/// mean anything.
fn latency_us(v: &str) -> Option<f64> {
    drover_units::duration(v)
        .ok()
        .map(|d| d.as_secs_f64() * 1e6)
}

/// The outcome of one objective.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SloVerdict {
    pub slo: String,
    pub met: bool,
    /// The measured value, in the objective's unit (µs, percent, requests/s).
    pub actual: f64,
    #[serde(skip)]
    metric: Option<SloMetric>,
}

impl fmt::Display for SloVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let actual = match self.metric {
            Some(SloMetric::Latency(_)) => fmt_us_f(self.actual),
            Some(SloMetric::ErrorPercent) => format!("{:.3}%", self.actual),
            _ => format!("{:.1} req/s", self.actual),
        };
        let verdict = if self.met { "met" } else { "BREACHED" };
        write!(f, "SLO {:<16} {verdict} (measured {actual})", self.slo)
    }
}

impl Slo {
    /// The outcome for `actual`, this objective's metric as a run measured it
    /// (`Report::measure`).
    pub fn verdict(&self, actual: f64) -> SloVerdict {
        SloVerdict {
            slo: self.text.clone(),
            met: self.comparison.holds(actual, self.threshold),
            actual,
            metric: Some(self.metric),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slo(s: &str) -> Slo {
        s.parse().unwrap()
    }

    #[test]
    fn parses_metrics_comparisons_and_units() {
        let s = slo("p99<50ms");
        assert_eq!(s.metric, SloMetric::Latency(LatencyStat::P99));
        assert_eq!((s.comparison, s.threshold), (Comparison::Below, 50_000.0));
        assert_eq!(slo(" p999 <= 1.5s ").threshold, 1_500_000.0);
        assert_eq!(
            slo("p99.9<800us").metric,
            SloMetric::Latency(LatencyStat::P999)
        );
        assert_eq!(
            slo("mean<2ms").metric,
            SloMetric::Latency(LatencyStat::Mean)
        );
        assert_eq!(slo("max<1s").threshold, 1e6);
        let e = slo("errors<0.1%");
        assert_eq!((e.metric, e.threshold), (SloMetric::ErrorPercent, 0.1));
        let r = slo("rps>=1000");
        assert_eq!(
            (r.metric, r.comparison, r.threshold),
            (SloMetric::Rps, Comparison::AtLeast, 1000.0)
        );
    }

    #[test]
    fn bad_text_says_what_is_wrong() {
        let err = |s: &str| s.parse::<Slo>().unwrap_err().to_string();
        assert!(
            err("p99 50ms").contains("no comparison"),
            "{}",
            err("p99 50ms")
        );
        assert!(err("p98<50ms").contains("unknown metric \"p98\""));
        assert!(err("p99<50").contains("with a unit"));
        assert!(err("p99<50 parsecs").contains("bad value \"50 parsecs\""));
        assert!(err("errors<0.1").contains("percentage"));
        assert!(err("errors<120%").contains("percentage"));
        assert!(err("rps>many").contains("requests per second"));
        assert!(err("<5ms").contains("unknown metric \"\""));
    }

    #[test]
    fn comparisons() {
        assert!(Comparison::Below.holds(1.0, 2.0) && !Comparison::Below.holds(2.0, 2.0));
        assert!(Comparison::AtMost.holds(2.0, 2.0) && !Comparison::AtMost.holds(2.1, 2.0));
        assert!(Comparison::Above.holds(3.0, 2.0) && !Comparison::Above.holds(2.0, 2.0));
        assert!(Comparison::AtLeast.holds(2.0, 2.0) && !Comparison::AtLeast.holds(1.9, 2.0));
    }
}
