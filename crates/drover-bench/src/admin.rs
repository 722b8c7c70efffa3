//! `--admin ADDR`: what drover itself measured during a run. `GET /metrics` on drover's
//! admin listener is scraped before and after the run; the difference says, per
//! endpoint, how many requests it served and how their time split into waiting in
//! drover's queue and waiting for the backend.
//!
//! The metrics (Prometheus text format, seconds, labels `balancer` and `endpoint`):
//! histograms `drover_endpoint_queue_wait_seconds` (queued before being bound to the
//! endpoint), `drover_endpoint_response_head_seconds` (sent to the backend until its
//! response head) and `drover_endpoint_request_duration_seconds` (bound until the end of
//! the response), and the counter `drover_endpoint_responses_total{code="2xx"}`.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::human::fmt_us_f;

pub const QUEUE_WAIT: &str = "drover_endpoint_queue_wait_seconds";
pub const RESPONSE_HEAD: &str = "drover_endpoint_response_head_seconds";
pub const REQUEST_DURATION: &str = "drover_endpoint_request_duration_seconds";
pub const RESPONSES: &str = "drover_endpoint_responses_total";

/// One sample line: `name{labels} value`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Parses the Prometheus text exposition format, tolerantly: comments (`# HELP`,
/// `# TYPE`), blank lines and lines that do not parse are skipped, a trailing
/// timestamp is ignored.
pub fn parse_metrics(text: &str) -> Vec<Sample> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Sample> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return None;
    }
    let name_end = line.find(|c: char| c == '{' || c.is_whitespace())?;
    let name = &line[..name_end];
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(after) = rest.strip_prefix('{') {
        let (parsed, end) = parse_labels(after)?;
        labels = parsed;
        rest = &after[end..];
    }
    let value = match rest.split_whitespace().next()? {
        "+Inf" | "Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v.parse().ok()?,
    };
    Some(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses `a="x",b="y"}` (the text after `{`): the labels, and where the `}` ends.
fn parse_labels(s: &str) -> Option<(BTreeMap<String, String>, usize)> {
    let b = s.as_bytes();
    let mut labels = BTreeMap::new();
    let mut i = 0;
    loop {
        while i < b.len() && matches!(b[i], b' ' | b',') {
            i += 1;
        }
        if *b.get(i)? == b'}' {
            return Some((labels, i + 1));
        }
        let eq = i + s[i..].find('=')?;
        let key = s[i..eq].trim().to_string();
        i = eq + 1;
        while b.get(i) == Some(&b' ') {
            i += 1;
        }
        if b.get(i) != Some(&b'"') {
            return None;
        }
        i += 1;
        let mut value = String::new();
        let mut chars = s[i..].char_indices();
        let mut closed = None;
        while let Some((j, c)) = chars.next() {
            match c {
                '\\' => match chars.next()? {
                    (_, 'n') => value.push('\n'),
                    (_, c) => value.push(c),
                },
                '"' => {
                    closed = Some(i + j + 1);
                    break;
                }
                c => value.push(c),
            }
        }
        i = closed?;
        labels.insert(key, value);
    }
}

/// A Prometheus histogram of one series: cumulative bucket counts by upper bound.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PromHistogram {
    /// `(le, cumulative count)`, ascending by `le`, the last one `+Inf`.
    pub buckets: Vec<(f64, f64)>,
    pub sum: f64,
    pub count: f64,
}

impl PromHistogram {
    /// What was observed between `before` (an earlier scrape) and `self`. A counter that
    /// went down means drover restarted in between; then everything since is `self`.
    pub fn since(&self, before: &PromHistogram) -> PromHistogram {
        if self.count < before.count {
            return self.clone();
        }
        let earlier = |le: f64| {
            before
                .buckets
                .iter()
                .find(|(b, _)| *b == le)
                .map_or(0.0, |(_, c)| *c)
        };
        PromHistogram {
            buckets: self
                .buckets
                .iter()
                .map(|(le, c)| (*le, (c - earlier(*le)).max(0.0)))
                .collect(),
            sum: (self.sum - before.sum).max(0.0),
            count: self.count - before.count,
        }
    }

    pub fn mean(&self) -> Option<f64> {
        (self.count > 0.0).then(|| self.sum / self.count)
    }

    /// The `q` quantile the way Prometheus' `histogram_quantile` estimates it: linear
    /// within the bucket it falls in; in the `+Inf` bucket, the highest finite bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.buckets.last()?.1;
        if total <= 0.0 {
            return None;
        }
        // Every observation was 0 (no request queued): interpolating inside the first
        // bucket would report a wait nobody had.
        if self.sum <= 0.0 {
            return Some(0.0);
        }
        let rank = q * total;
        let mut prev = (0.0, 0.0);
        for &(le, c) in &self.buckets {
            if c >= rank {
                if le.is_infinite() {
                    return Some(prev.0);
                }
                let in_bucket = c - prev.1;
                let frac = if in_bucket > 0.0 {
                    (rank - prev.1) / in_bucket
                } else {
                    1.0
                };
                return Some(prev.0 + (le - prev.0) * frac);
            }
            prev = (le, c);
        }
        Some(prev.0)
    }
}

/// An endpoint: `(balancer, endpoint)` labels.
pub type EndpointKey = (String, String);

/// The endpoint series of one scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    /// By metric name (without `_bucket`/`_sum`/`_count`), then endpoint.
    pub histograms: BTreeMap<String, BTreeMap<EndpointKey, PromHistogram>>,
    /// Responses by endpoint and status class (`code`, e.g. `2xx`).
    pub responses: BTreeMap<EndpointKey, BTreeMap<String, f64>>,
}

impl Scrape {
    pub fn parse(text: &str) -> Scrape {
        let mut s = Scrape::default();
        for sample in parse_metrics(text) {
            let (Some(balancer), Some(endpoint)) =
                (sample.labels.get("balancer"), sample.labels.get("endpoint"))
            else {
                continue;
            };
            let key = (balancer.clone(), endpoint.clone());
            if sample.name == RESPONSES {
                let code = sample.labels.get("code").cloned().unwrap_or_default();
                *s.responses.entry(key).or_default().entry(code).or_default() += sample.value;
                continue;
            }
            for metric in [QUEUE_WAIT, RESPONSE_HEAD, REQUEST_DURATION] {
                let Some(suffix) = sample.name.strip_prefix(metric) else {
                    continue;
                };
                let h = s
                    .histograms
                    .entry(metric.to_string())
                    .or_default()
                    .entry(key.clone())
                    .or_default();
                match suffix {
                    "_bucket" => {
                        let le = match sample.labels.get("le").map(String::as_str) {
                            Some("+Inf") | Some("Inf") => f64::INFINITY,
                            Some(v) => match v.parse() {
                                Ok(le) => le,
                                Err(_) => continue,
                            },
                            None => continue,
                        };
                        h.buckets.push((le, sample.value));
                    }
                    "_sum" => h.sum = sample.value,
                    "_count" => h.count = sample.value,
                    _ => {}
                }
            }
        }
        for by_endpoint in s.histograms.values_mut() {
            for h in by_endpoint.values_mut() {
                h.buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
        s
    }

    pub fn endpoints(&self) -> std::collections::BTreeSet<EndpointKey> {
        self.histograms
            .values()
            .flat_map(|m| m.keys().cloned())
            .chain(self.responses.keys().cloned())
            .collect()
    }
}

/// One histogram's change over the run, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimeSplit {
    pub count: u64,
    pub mean_us: f64,
    pub p50_us: f64,
    pub p99_us: f64,
}

impl TimeSplit {
    fn of(h: &PromHistogram) -> Option<TimeSplit> {
        let mean = h.mean()?;
        Some(TimeSplit {
            count: h.count.round() as u64,
            mean_us: (mean * 1e7).round() / 10.0,
            p50_us: (h.quantile(0.5)? * 1e7).round() / 10.0,
            p99_us: (h.quantile(0.99)? * 1e7).round() / 10.0,
        })
    }
}

/// What one endpoint did during the run, as drover counted it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointReport {
    pub balancer: String,
    pub endpoint: String,
    /// Requests bound to this endpoint and finished during the run.
    pub requests: u64,
    /// Responses by status class.
    pub responses: BTreeMap<String, u64>,
    /// Waiting in drover's queue before being bound to this endpoint.
    pub queue_wait: Option<TimeSplit>,
    /// From sending to the backend until its response head.
    pub backend: Option<TimeSplit>,
    /// From binding until the end of the response.
    pub request: Option<TimeSplit>,
}

/// `--admin`'s part of the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdminReport {
    pub admin: String,
    pub endpoints: Vec<EndpointReport>,
}

/// What happened between two scrapes, per endpoint that served anything in between.
pub fn diff(admin: &str, before: &Scrape, after: &Scrape) -> AdminReport {
    let empty = PromHistogram::default();
    let split = |metric: &str, key: &EndpointKey| -> Option<TimeSplit> {
        let now = after.histograms.get(metric)?.get(key)?;
        let then = before
            .histograms
            .get(metric)
            .and_then(|m| m.get(key))
            .unwrap_or(&empty);
        TimeSplit::of(&now.since(then))
    };
    let mut endpoints = Vec::new();
    for key in after.endpoints() {
        let mut responses = BTreeMap::new();
        if let Some(now) = after.responses.get(&key) {
            let then = before.responses.get(&key);
            let reset =
                then.is_some_and(|t| t.iter().any(|(c, v)| now.get(c).is_some_and(|n| n < v)));
            for (code, v) in now {
                let earlier = if reset {
                    0.0
                } else {
                    then.and_then(|t| t.get(code)).copied().unwrap_or(0.0)
                };
                let d = (v - earlier).round() as u64;
                if d > 0 {
                    responses.insert(code.clone(), d);
                }
            }
        }
        let request = split(REQUEST_DURATION, &key);
        let requests = request
            .map(|r| r.count)
            .unwrap_or_else(|| responses.values().sum());
        if requests == 0 {
            continue;
        }
        endpoints.push(EndpointReport {
            balancer: key.0.clone(),
            endpoint: key.1.clone(),
            requests,
            responses,
            queue_wait: split(QUEUE_WAIT, &key),
            backend: split(RESPONSE_HEAD, &key),
            request,
        });
    }
    AdminReport {
        admin: admin.to_string(),
        endpoints,
    }
}

impl AdminReport {
    pub fn render_text(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "drover's view ({}/metrics, during the run)", self.admin);
        if self.endpoints.is_empty() {
            let _ = writeln!(
                s,
                "  no endpoint served a request (no {RESPONSES} or {REQUEST_DURATION} changed)"
            );
            return s;
        }
        let total: u64 = self.endpoints.iter().map(|e| e.requests).sum();
        let _ = writeln!(
            s,
            "  {:<28} {:>9} {:>6}  {:>19}  {:>19}  {:>19}",
            "balancer/endpoint",
            "requests",
            "share",
            "queued avg / p99",
            "backend avg / p99",
            "in drover avg / p99"
        );
        let pair = |t: &Option<TimeSplit>| match t {
            Some(t) => format!("{} / {}", fmt_us_f(t.mean_us), fmt_us_f(t.p99_us)),
            None => "-".to_string(),
        };
        for e in &self.endpoints {
            let _ = writeln!(
                s,
                "  {:<28} {:>9} {:>5.1}%  {:>19}  {:>19}  {:>19}",
                format!("{}/{}", e.balancer, e.endpoint),
                e.requests,
                e.requests as f64 * 100.0 / total.max(1) as f64,
                pair(&e.queue_wait),
                pair(&e.backend),
                pair(&e.request),
            );
            let non_2xx: Vec<String> = e
                .responses
                .iter()
                .filter(|(c, _)| c.as_str() != "2xx")
                .map(|(c, n)| format!("{c}: {n}"))
                .collect();
            if !non_2xx.is_empty() {
                let _ = writeln!(s, "  {:<28} responses {}", "", non_2xx.join(", "));
            }
        }
        s
    }
}

/// Why `/metrics` could not be read.
#[derive(Debug)]
pub enum AdminError {
    BadAddress(String),
    Connect { addr: String, error: std::io::Error },
    Status { addr: String, status: u16 },
    BadResponse { addr: String, why: String },
}

impl fmt::Display for AdminError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AdminError::BadAddress(a) => {
                write!(f, "--admin {a:?}: expected HOST:PORT of drover's admin listener")
            }
            AdminError::Connect { addr, error } => {
                write!(f, "--admin: cannot read http://{addr}/metrics: {error}")
            }
            AdminError::Status { addr, status: 401 | 403 } => write!(
                f,
                "--admin: http://{addr}/metrics refused the request; pass the admin token with --admin-token"
            ),
            AdminError::Status { addr, status } => {
                write!(f, "--admin: http://{addr}/metrics answered {status}")
            }
            AdminError::BadResponse { addr, why } => {
                write!(f, "--admin: bad response from http://{addr}/metrics: {why}")
            }
        }
    }
}

impl std::error::Error for AdminError {}

/// `HOST:PORT` from `--admin`, which may also be written `http://HOST:PORT[/]`.
pub fn admin_authority(arg: &str) -> Result<String, AdminError> {
    let a = arg
        .strip_prefix("http://")
        .unwrap_or(arg)
        .trim_end_matches('/');
    if a.is_empty() || a.contains(['/', ' ']) || !a.contains(':') {
        return Err(AdminError::BadAddress(arg.to_string()));
    }
    Ok(a.to_string())
}

const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// `GET /metrics` from drover's admin listener at `authority` (HOST:PORT).
pub fn scrape(authority: &str, token: Option<&str>) -> Result<Scrape, AdminError> {
    let io = |error| AdminError::Connect {
        addr: authority.to_string(),
        error,
    };
    let bad = |why: String| AdminError::BadResponse {
        addr: authority.to_string(),
        why,
    };
    let addr = authority
        .to_socket_addrs()
        .map_err(io)?
        .next()
        .ok_or_else(|| AdminError::BadAddress(authority.to_string()))?;
    let mut stream = TcpStream::connect_timeout(&addr, SCRAPE_TIMEOUT).map_err(io)?;
    stream.set_read_timeout(Some(SCRAPE_TIMEOUT)).map_err(io)?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let req = format!(
        "GET /metrics HTTP/1.1\r\nHost: {authority}\r\nUser-Agent: drover-bench\r\n{auth}Connection: close\r\n\r\n"
    );
    stream.write_all(req.as_bytes()).map_err(io)?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).map_err(io)?;
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut resp = httparse::Response::new(&mut headers);
    let head_len = match resp.parse(&raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            return Err(bad("the response ended inside its head".into()))
        }
        Err(e) => return Err(bad(e.to_string())),
    };
    let status = resp.code.unwrap_or(0);
    if status != 200 {
        return Err(AdminError::Status {
            addr: authority.to_string(),
            status,
        });
    }
    let chunked = resp.headers.iter().any(|h| {
        h.name.eq_ignore_ascii_case("transfer-encoding")
            && String::from_utf8_lossy(h.value)
                .to_ascii_lowercase()
                .contains("chunked")
    });
    let body = &raw[head_len..];
    let body = if chunked {
        dechunk(body).ok_or_else(|| bad("bad chunked body".into()))?
    } else {
        body.to_vec()
    };
    let text = String::from_utf8(body).map_err(|_| bad("the body is not UTF-8".into()))?;
    Ok(Scrape::parse(&text))
}

fn dechunk(mut body: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = memchr::memmem::find(body, b"\r\n")?;
        let size_text = std::str::from_utf8(&body[..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Some(out);
        }
        out.extend_from_slice(body.get(..size)?);
        body = body.get(size + 2..)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What drover's /metrics looks like for one balancer with two endpoints.
    const BEFORE: &str = r#"# HELP drover_endpoint_queue_wait_seconds Time a request waited in drover's queue before it was bound to this endpoint.
# TYPE drover_endpoint_queue_wait_seconds histogram
drover_endpoint_queue_wait_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.001"} 10
drover_endpoint_queue_wait_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.01"} 10
drover_endpoint_queue_wait_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.1"} 10
drover_endpoint_queue_wait_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="+Inf"} 10
drover_endpoint_queue_wait_seconds_sum{balancer="web",endpoint="127.0.0.1:3001"} 0.002
drover_endpoint_queue_wait_seconds_count{balancer="web",endpoint="127.0.0.1:3001"} 10
# TYPE drover_endpoint_response_head_seconds histogram
drover_endpoint_response_head_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.001"} 0
drover_endpoint_response_head_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.01"} 10
drover_endpoint_response_head_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.1"} 10
drover_endpoint_response_head_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="+Inf"} 10
drover_endpoint_response_head_seconds_sum{balancer="web",endpoint="127.0.0.1:3001"} 0.05
drover_endpoint_response_head_seconds_count{balancer="web",endpoint="127.0.0.1:3001"} 10
drover_endpoint_request_duration_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.01"} 10
drover_endpoint_request_duration_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="+Inf"} 10
drover_endpoint_request_duration_seconds_sum{balancer="web",endpoint="127.0.0.1:3001"} 0.06
drover_endpoint_request_duration_seconds_count{balancer="web",endpoint="127.0.0.1:3001"} 10
# TYPE drover_endpoint_responses_total counter
drover_endpoint_responses_total{balancer="web",endpoint="127.0.0.1:3001",code="2xx"} 10
drover_process_open_fds 12
"#;

    const AFTER: &str = r#"# TYPE drover_endpoint_queue_wait_seconds histogram
drover_endpoint_queue_wait_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.001"} 60
drover_endpoint_queue_wait_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.01"} 100
drover_endpoint_queue_wait_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.1"} 110
drover_endpoint_queue_wait_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="+Inf"} 110
drover_endpoint_queue_wait_seconds_sum{balancer="web",endpoint="127.0.0.1:3001"} 0.502
drover_endpoint_queue_wait_seconds_count{balancer="web",endpoint="127.0.0.1:3001"} 110
drover_endpoint_response_head_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.001"} 0
drover_endpoint_response_head_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.01"} 110
drover_endpoint_response_head_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.1"} 110
drover_endpoint_response_head_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="+Inf"} 110
drover_endpoint_response_head_seconds_sum{balancer="web",endpoint="127.0.0.1:3001"} 0.55
drover_endpoint_response_head_seconds_count{balancer="web",endpoint="127.0.0.1:3001"} 110
drover_endpoint_request_duration_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="0.01"} 110
drover_endpoint_request_duration_seconds_bucket{balancer="web",endpoint="127.0.0.1:3001",le="+Inf"} 110
drover_endpoint_request_duration_seconds_sum{balancer="web",endpoint="127.0.0.1:3001"} 0.66
drover_endpoint_request_duration_seconds_count{balancer="web",endpoint="127.0.0.1:3001"} 110
drover_endpoint_responses_total{balancer="web",endpoint="127.0.0.1:3001",code="2xx"} 105
drover_endpoint_responses_total{balancer="web",endpoint="127.0.0.1:3001",code="5xx"} 5
drover_endpoint_request_duration_seconds_bucket{endpoint="127.0.0.1:3002",balancer="web",le="+Inf"} 50 1712000000000
drover_endpoint_request_duration_seconds_sum{endpoint="127.0.0.1:3002",balancer="web"} 1.0
drover_endpoint_request_duration_seconds_count{endpoint="127.0.0.1:3002",balancer="web"} 50
drover_endpoint_responses_total{balancer="idle",endpoint="127.0.0.1:4000",code="2xx"} 7
"#;

    #[test]
    fn parses_lines_labels_and_special_values() {
        let s = parse_metrics(
            "# HELP x y\n\nup 1\nweird{a=\"q\\\"uote\\\\ \\n\",b=\"é, }\"} 2.5e-3 123\nbroken{a=\"x} 1\nno_value\nh_bucket{le=\"+Inf\"} +Inf\n",
        );
        assert_eq!(s.len(), 3, "{s:?}");
        assert_eq!((s[0].name.as_str(), s[0].value), ("up", 1.0));
        assert!(s[0].labels.is_empty());
        assert_eq!(s[1].labels["a"], "q\"uote\\ \n");
        assert_eq!(s[1].labels["b"], "é, }");
        assert_eq!(s[1].value, 2.5e-3);
        assert_eq!(s[2].labels["le"], "+Inf");
        assert!(s[2].value.is_infinite());
    }

    #[test]
    fn scrape_collects_endpoint_histograms_and_responses() {
        let s = Scrape::parse(AFTER);
        let key = ("web".to_string(), "127.0.0.1:3001".to_string());
        let q = &s.histograms[QUEUE_WAIT][&key];
        assert_eq!(q.buckets.len(), 4);
        assert_eq!((q.sum, q.count), (0.502, 110.0));
        assert_eq!(s.responses[&key]["5xx"], 5.0);
        assert_eq!(s.endpoints().len(), 3);
    }

    #[test]
    fn diff_reports_the_run_only() {
        let r = diff(
            "127.0.0.1:9900",
            &Scrape::parse(BEFORE),
            &Scrape::parse(AFTER),
        );
        // Sorted by balancer, then endpoint; "idle" has only its responses counter.
        assert_eq!(r.endpoints.len(), 3);
        let e = &r.endpoints[1];
        assert_eq!(
            (e.balancer.as_str(), e.endpoint.as_str()),
            ("web", "127.0.0.1:3001")
        );
        assert_eq!(e.requests, 100);
        assert_eq!(e.responses["2xx"], 95);
        assert_eq!(e.responses["5xx"], 5);
        let q = e.queue_wait.unwrap();
        assert_eq!(q.count, 100);
        // 0.5 s over 100 requests.
        assert_eq!(q.mean_us, 5000.0);
        // 50 of 100 in the first bucket (≤ 1 ms): the median is its upper edge.
        assert!((q.p50_us - 1000.0).abs() < 1e-6, "{q:?}");
        // Rank 99 of 100 lies in (10 ms, 100 ms], 9 of the 10 in it: 10 + 90 * 0.9 ms.
        assert!((q.p99_us - 91_000.0).abs() < 1e-3, "{q:?}");
        assert_eq!(e.backend.unwrap().mean_us, 5000.0);
        assert_eq!(e.request.unwrap().mean_us, 6000.0);
        // A new endpoint counts from zero.
        let new = &r.endpoints[2];
        assert_eq!(
            (new.endpoint.as_str(), new.requests),
            ("127.0.0.1:3002", 50)
        );
        assert_eq!(new.request.unwrap().mean_us, 20_000.0);
        assert!(new.queue_wait.is_none());
        let idle = &r.endpoints[0];
        assert_eq!((idle.balancer.as_str(), idle.requests), ("idle", 7));
        let text = r.render_text();
        assert!(text.contains("web/127.0.0.1:3001"), "{text}");
        assert!(text.contains("5.00ms / 91.0ms"), "{text}");
        assert!(text.contains("5xx: 5"), "{text}");
    }

    #[test]
    fn a_restart_between_scrapes_counts_from_zero() {
        let r = diff("a:1", &Scrape::parse(AFTER), &Scrape::parse(BEFORE));
        let e = r
            .endpoints
            .iter()
            .find(|e| e.endpoint == "127.0.0.1:3001")
            .unwrap();
        assert_eq!(e.requests, 10);
        assert_eq!(e.responses["2xx"], 10);
    }

    #[test]
    fn quantiles_in_the_inf_bucket_stop_at_the_last_bound() {
        let h = PromHistogram {
            buckets: vec![(0.1, 0.0), (f64::INFINITY, 4.0)],
            sum: 10.0,
            count: 4.0,
        };
        assert_eq!(h.quantile(0.99), Some(0.1));
        assert_eq!(PromHistogram::default().quantile(0.5), None);
        let zeros = PromHistogram {
            buckets: vec![(0.0001, 5.0), (f64::INFINITY, 5.0)],
            sum: 0.0,
            count: 5.0,
        };
        assert_eq!(zeros.quantile(0.99), Some(0.0));
    }

    #[test]
    fn chunked_bodies_and_addresses() {
        assert_eq!(
            dechunk(b"3\r\nabc\r\n2;x=y\r\nde\r\n0\r\n\r\n").unwrap(),
            b"abcde"
        );
        assert!(dechunk(b"zz\r\n").is_none());
        assert_eq!(
            admin_authority("http://127.0.0.1:9900/").unwrap(),
            "127.0.0.1:9900"
        );
        assert_eq!(admin_authority("localhost:9900").unwrap(), "localhost:9900");
        assert!(admin_authority("127.0.0.1").is_err());
        assert!(admin_authority("http://h:1/v1").is_err());
    }

    /// `scrape` against a one-shot server answering with a chunked body.
    #[test]
    fn scrape_reads_metrics_over_http_with_the_token() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let mut heads = Vec::new();
            for answer in [401, 200] {
                let (mut sock, _) = listener.accept().unwrap();
                let mut buf = [0u8; 4096];
                let n = sock.read(&mut buf).unwrap();
                heads.push(String::from_utf8_lossy(&buf[..n]).into_owned());
                let body = AFTER.as_bytes();
                let reply = if answer == 200 {
                    let mut r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
                    for chunk in body.chunks(500) {
                        r.extend(format!("{:x}\r\n", chunk.len()).as_bytes());
                        r.extend(chunk);
                        r.extend(b"\r\n");
                    }
                    r.extend(b"0\r\n\r\n");
                    r
                } else {
                    b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n".to_vec()
                };
                sock.write_all(&reply).unwrap();
            }
            heads
        });
        let err = scrape(&addr, None).unwrap_err().to_string();
        assert!(err.contains("--admin-token"), "{err}");
        let s = scrape(&addr, Some("s3cret")).unwrap();
        assert_eq!(s, Scrape::parse(AFTER));
        let heads = server.join().unwrap();
        assert!(heads[0].starts_with("GET /metrics HTTP/1.1\r\n"));
        assert!(!heads[0].contains("Authorization"));
        assert!(heads[1].contains("Authorization: Bearer s3cret\r\n"));
    }
}
