//! `drover bench compare A.json B.json`: which differences between two `--json` runs
//! are larger than the runs' own second-to-second noise.
//!
//! Each run's per-second samples (p50, p99, achieved rate, error share) are two samples
//! of the same quantity; a two-sided Mann–Whitney U test (normal approximation with tie
//! and continuity corrections) says whether one tends to be larger than the other. It
//! assumes nothing about the distribution, which latency percentiles do not follow
//! nicely, and a single odd second moves it little. A difference is reported when
//! p < 0.01 and the medians differ by at least 5 %: with dozens of seconds, a shift of
//! 1 % can be significant and still not matter.

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::human::fmt_us_f;
use crate::stats::IntervalReport;

/// Significance level of the U test.
pub const ALPHA: f64 = 0.01;
/// Smallest relative change of the medians that is reported.
pub const MIN_CHANGE: f64 = 0.05;
/// Fewer seconds than this per run cannot reach p < 0.01 in the U test (6 against 6,
/// perfectly separated, gives p ≈ 0.005).
pub const MIN_SAMPLES: usize = 6;
/// Intervals shorter than this (a run's first or last, cut short) are left out.
const MIN_INTERVAL_S: f64 = 0.9;

/// The parts of a `--json` report that compare reads.
#[derive(Debug, Clone, Deserialize)]
pub struct RunFile {
    pub target: String,
    pub mode: String,
    pub mix: String,
    pub rate: Option<f64>,
    pub requests: u64,
    pub elapsed_s: f64,
    pub intervals: Vec<IntervalReport>,
}

#[derive(Debug)]
pub enum CompareError {
    Read {
        path: PathBuf,
        error: std::io::Error,
    },
    NotAReport {
        path: PathBuf,
        error: serde_json::Error,
    },
    TooShort {
        path: PathBuf,
        seconds: usize,
    },
    Mismatch(String),
}

impl fmt::Display for CompareError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompareError::Read { path, error } => write!(f, "cannot read {}: {error}", path.display()),
            CompareError::NotAReport { path, error } => write!(
                f,
                "{} is not a `drover bench --json` report: {error}",
                path.display()
            ),
            CompareError::TooShort { path, seconds } => write!(
                f,
                "{} has {seconds} whole second(s) of samples; compare needs at least {MIN_SAMPLES} per run (run with -d {MIN_SAMPLES}s or longer)",
                path.display()
            ),
            CompareError::Mismatch(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for CompareError {}

pub fn load(path: &Path) -> Result<RunFile, CompareError> {
    let text = std::fs::read_to_string(path).map_err(|error| CompareError::Read {
        path: path.to_path_buf(),
        error,
    })?;
    let run: RunFile = serde_json::from_str(&text).map_err(|error| CompareError::NotAReport {
        path: path.to_path_buf(),
        error,
    })?;
    let seconds = whole_intervals(&run).count();
    if seconds < MIN_SAMPLES {
        return Err(CompareError::TooShort {
            path: path.to_path_buf(),
            seconds,
        });
    }
    Ok(run)
}

fn whole_intervals(run: &RunFile) -> impl Iterator<Item = &IntervalReport> {
    run.intervals
        .iter()
        .filter(|i| i.duration_s >= MIN_INTERVAL_S)
}

/// Which way a metric should go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Better {
    Lower,
    Higher,
}

/// One metric of the comparison.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricDiff {
    pub metric: &'static str,
    pub median_a: f64,
    pub median_b: f64,
    /// (B - A) / A; infinite when A is 0 and B is not.
    pub change: f64,
    pub p_value: f64,
    /// Beyond noise: p < [`ALPHA`] and |change| ≥ [`MIN_CHANGE`].
    pub significant: bool,
    /// B is worse than A (slower, fewer requests, more errors).
    pub worse: bool,
    is_latency: bool,
    is_percent: bool,
}

pub struct Comparison {
    pub notes: Vec<String>,
    pub metrics: Vec<MetricDiff>,
    samples: (usize, usize),
}

/// Compares two runs. Runs of different kinds (open against closed loop) measure
/// different things and are refused; other differences are noted.
pub fn compare(a: &RunFile, b: &RunFile) -> Result<Comparison, CompareError> {
    if a.mode != b.mode {
        return Err(CompareError::Mismatch(format!(
            "A is a {}-loop run and B a {}-loop one; their latencies mean different things (open loop counts from the scheduled send time), so compare runs of the same kind",
            a.mode, b.mode
        )));
    }
    let mut notes = Vec::new();
    if a.target != b.target {
        notes.push(format!("targets differ: A {} , B {}", a.target, b.target));
    }
    if a.mix != b.mix {
        notes.push(format!("request mixes differ: A {} , B {}", a.mix, b.mix));
    }
    if a.rate != b.rate {
        notes.push(format!(
            "offered rates differ: A {} , B {} req/s",
            a.rate.unwrap_or(0.0),
            b.rate.unwrap_or(0.0)
        ));
    }
    let ia: Vec<&IntervalReport> = whole_intervals(a).collect();
    let ib: Vec<&IntervalReport> = whole_intervals(b).collect();
    let error_share = |i: &IntervalReport| {
        let attempts = i.requests + i.errors.without_response();
        if attempts == 0 {
            0.0
        } else {
            i.errors.total() as f64 * 100.0 / attempts as f64
        }
    };
    type Pick = fn(&IntervalReport) -> f64;
    let metrics: [(&'static str, Better, bool, Pick); 3] = [
        ("p50", Better::Lower, true, |i| i.p50_us as f64),
        ("p99", Better::Lower, true, |i| i.p99_us as f64),
        ("req/s", Better::Higher, false, |i| i.rps),
    ];
    let mut out: Vec<MetricDiff> = metrics
        .iter()
        .map(|(name, better, is_latency, pick)| {
            let xa: Vec<f64> = ia.iter().map(|i| pick(i)).collect();
            let xb: Vec<f64> = ib.iter().map(|i| pick(i)).collect();
            diff_metric(name, *better, *is_latency, false, &xa, &xb)
        })
        .collect();
    let ea: Vec<f64> = ia.iter().map(|i| error_share(i)).collect();
    let eb: Vec<f64> = ib.iter().map(|i| error_share(i)).collect();
    let mut errors = diff_metric("errors", Better::Lower, false, true, &ea, &eb);
    // Any change from no errors at all matters, however small in relative terms.
    if errors.median_a == 0.0 && errors.median_b == 0.0 {
        errors.significant = false;
    }
    out.push(errors);
    Ok(Comparison {
        notes,
        metrics: out,
        samples: (ia.len(), ib.len()),
    })
}

fn diff_metric(
    metric: &'static str,
    better: Better,
    is_latency: bool,
    is_percent: bool,
    a: &[f64],
    b: &[f64],
) -> MetricDiff {
    let (ma, mb) = (median(a), median(b));
    let change = if ma == 0.0 {
        if mb == 0.0 {
            0.0
        } else {
            f64::INFINITY
        }
    } else {
        (mb - ma) / ma
    };
    let p_value = mann_whitney_p(a, b);
    let worse = match better {
        Better::Lower => mb > ma,
        Better::Higher => mb < ma,
    };
    MetricDiff {
        metric,
        median_a: ma,
        median_b: mb,
        change,
        p_value,
        significant: p_value < ALPHA && change.abs() >= MIN_CHANGE,
        worse,
        is_latency,
        is_percent,
    }
}

pub fn median(x: &[f64]) -> f64 {
    if x.is_empty() {
        return 0.0;
    }
    let mut v = x.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Two-sided p-value of the Mann–Whitney U test of `a` against `b`.
pub fn mann_whitney_p(a: &[f64], b: &[f64]) -> f64 {
    let (n1, n2) = (a.len() as f64, b.len() as f64);
    if a.is_empty() || b.is_empty() {
        return 1.0;
    }
    let mut all: Vec<(f64, bool)> = a
        .iter()
        .map(|&x| (x, true))
        .chain(b.iter().map(|&x| (x, false)))
        .collect();
    all.sort_by(|x, y| x.0.total_cmp(&y.0));
    let n = all.len();
    let (mut rank_sum_a, mut ties) = (0.0, 0.0);
    let mut i = 0;
    while i < n {
        let mut j = i;
        while j + 1 < n && all[j + 1].0 == all[i].0 {
            j += 1;
        }
        // Positions i..=j share the average of ranks i+1..=j+1.
        let rank = (i + j) as f64 / 2.0 + 1.0;
        let t = (j - i + 1) as f64;
        ties += t * t * t - t;
        rank_sum_a += rank * all[i..=j].iter().filter(|x| x.1).count() as f64;
        i = j + 1;
    }
    let u = rank_sum_a - n1 * (n1 + 1.0) / 2.0;
    let nt = n1 + n2;
    let variance = n1 * n2 / 12.0 * ((nt + 1.0) - ties / (nt * (nt - 1.0)));
    if variance <= 0.0 {
        return 1.0;
    }
    let z = ((u - n1 * n2 / 2.0).abs() - 0.5) / variance.sqrt();
    if z <= 0.0 {
        return 1.0;
    }
    (2.0 * normal_upper_tail(z)).min(1.0)
}

/// P(Z > z) for a standard normal Z (Abramowitz & Stegun 7.1.26, error < 1.5e-7).
fn normal_upper_tail(z: f64) -> f64 {
    let x = z / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.327_591_1 * x);
    let poly = t
        * (0.254_829_592
            + t * (-0.284_496_736
                + t * (1.421_413_741 + t * (-1.453_152_027 + t * 1.061_405_429))));
    0.5 * poly * (-x * x).exp()
}

impl Comparison {
    pub fn render_text(&self, a: &Path, b: &Path) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "A: {}", a.display());
        let _ = writeln!(s, "B: {}", b.display());
        for n in &self.notes {
            let _ = writeln!(s, "note: {n}");
        }
        let _ = writeln!(
            s,
            "{:<7} {:>12} {:>12} {:>9} {:>9}",
            "median", "A", "B", "change", "p"
        );
        let value = |m: &MetricDiff, v: f64| {
            if m.is_latency {
                fmt_us_f(v)
            } else if m.is_percent {
                format!("{v:.2}%")
            } else {
                format!("{v:.1}")
            }
        };
        for m in &self.metrics {
            let change = if m.change.is_infinite() {
                "new".to_string()
            } else {
                format!("{:+.1}%", m.change * 100.0)
            };
            let verdict = match (m.significant, m.worse) {
                (false, _) => "within noise",
                (true, true) => "B is worse",
                (true, false) => "B is better",
            };
            let _ = writeln!(
                s,
                "{:<7} {:>12} {:>12} {:>9} {:>9.4}  {verdict}",
                m.metric,
                value(m, m.median_a),
                value(m, m.median_b),
                change,
                m.p_value
            );
        }
        let (na, nb) = self.samples;
        if self.metrics.iter().any(|m| m.significant) {
            let _ = writeln!(
                s,
                "differences beyond noise: {} (Mann–Whitney U on {na} and {nb} per-second samples, p < {ALPHA}, change ≥ {:.0}%)",
                self.metrics
                    .iter()
                    .filter(|m| m.significant)
                    .map(|m| m.metric)
                    .collect::<Vec<_>>()
                    .join(", "),
                MIN_CHANGE * 100.0
            );
        } else {
            let _ = writeln!(
                s,
                "no difference beyond noise (Mann–Whitney U on {na} and {nb} per-second samples, p < {ALPHA}, change ≥ {:.0}%)",
                MIN_CHANGE * 100.0
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u_test_matches_known_values() {
        // Identical samples: nothing to see.
        let a = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        assert_eq!(mann_whitney_p(&a, &a), 1.0);
        // 6 against 6, perfectly separated: z = (18 - 0.5) / sqrt(36 * 13 / 12) = 2.802.
        let b = [7.0, 8.0, 9.0, 10.0, 11.0, 12.0];
        let p = mann_whitney_p(&a, &b);
        assert!((p - 0.00508).abs() < 1e-4, "{p}");
        assert_eq!(p, mann_whitney_p(&b, &a));
        // Interleaved: no evidence.
        let c = [1.5, 2.5, 3.5, 4.5, 5.5, 6.5];
        assert!(mann_whitney_p(&a, &c) > 0.5);
        // All tied: variance 0, p 1.
        assert_eq!(mann_whitney_p(&[3.0; 6], &[3.0; 6]), 1.0);
        assert!((normal_upper_tail(1.959_964) - 0.025).abs() < 1e-6);
    }

    fn run(mode: &str, p50s: &[u64], rps: f64) -> RunFile {
        RunFile {
            target: "127.0.0.1:1".into(),
            mode: mode.into(),
            mix: "/".into(),
            rate: None,
            requests: 1000,
            elapsed_s: p50s.len() as f64,
            intervals: p50s
                .iter()
                .enumerate()
                .map(|(t, &p50)| IntervalReport {
                    t: t as f64,
                    duration_s: 1.0,
                    requests: rps as u64,
                    rps: rps + t as f64 % 3.0,
                    target_rps: None,
                    p50_us: p50,
                    p90_us: p50 * 2,
                    p99_us: p50 * 3,
                    max_us: p50 * 4,
                    status: Default::default(),
                    errors: Default::default(),
                    bytes: 0,
                })
                .collect(),
        }
    }

    #[test]
    fn noise_is_not_a_difference_and_a_shift_is() {
        let a = run("closed", &[100, 104, 98, 101, 97, 103, 99], 1000.0);
        let same = run("closed", &[102, 99, 101, 96, 104, 100, 98], 1000.0);
        let c = compare(&a, &same).unwrap();
        assert!(c.metrics.iter().all(|m| !m.significant));
        let text = c.render_text(Path::new("a.json"), Path::new("b.json"));
        assert!(text.contains("no difference beyond noise"), "{text}");

        let slow = run("closed", &[150, 149, 155, 152, 148, 151, 153], 700.0);
        let c = compare(&a, &slow).unwrap();
        let p50 = &c.metrics[0];
        assert!(p50.significant && p50.worse, "{:?}", p50);
        assert!(c.metrics[2].significant && c.metrics[2].worse);
        let text = c.render_text(Path::new("a.json"), Path::new("b.json"));
        assert!(
            text.contains("differences beyond noise: p50, p99, req/s"),
            "{text}"
        );
        assert!(text.contains("B is worse"), "{text}");
        // The other way round, B is better.
        let c = compare(&slow, &a).unwrap();
        assert!(c.metrics[0].significant && !c.metrics[0].worse);
    }

    #[test]
    fn a_small_but_consistent_shift_is_below_the_floor() {
        let a = run("closed", &[100, 101, 100, 101, 100, 101], 1000.0);
        let b = run("closed", &[102, 103, 102, 103, 102, 103], 1000.0);
        let c = compare(&a, &b).unwrap();
        assert!(c.metrics[0].p_value < ALPHA);
        assert!(!c.metrics[0].significant);
    }

    #[test]
    fn mismatched_and_bad_files_are_refused() {
        let a = run("closed", &[1; 6], 10.0);
        let b = run("open", &[1; 6], 10.0);
        let err = compare(&a, &b).err().unwrap().to_string();
        assert!(err.contains("closed-loop run and B a open-loop"), "{err}");

        let dir = std::env::temp_dir().join(format!("drover-compare-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.json");
        assert!(load(&missing)
            .unwrap_err()
            .to_string()
            .contains("cannot read"));
        let junk = dir.join("junk.json");
        std::fs::write(&junk, "{\"requests\": 3}").unwrap();
        let err = load(&junk).unwrap_err().to_string();
        assert!(
            err.contains("is not a `drover bench --json` report"),
            "{err}"
        );
        let short = dir.join("short.json");
        let mut v = serde_json::to_value(run("closed", &[1; 6], 10.0).intervals).unwrap();
        v.as_array_mut().unwrap().truncate(3);
        let json = serde_json::json!({
            "target": "x", "mode": "closed", "mix": "/", "rate": null,
            "requests": 3, "elapsed_s": 3.0, "intervals": v,
        });
        std::fs::write(&short, json.to_string()).unwrap();
        let err = load(&short).unwrap_err().to_string();
        assert!(err.contains("3 whole second(s)"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
