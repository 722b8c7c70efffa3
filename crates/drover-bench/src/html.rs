//! `--html FILE`: the report as one self-contained page. Everything it needs is inline
//! (uPlot from `drover-ui`, the styles, the data as JSON), so it opens from disk, from
//! an e-mail or a CI artefact store, and makes no request of any kind.

use std::fmt::Write as _;

use crate::human::{fmt_bytes, fmt_rate, fmt_us, fmt_us_f};
use crate::stats::Report;

const STYLE: &str = r#"
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #1d2330; background: #fff; }
h1 { font-size: 20px; margin: 0 0 4px; }
h2 { font-size: 16px; margin: 28px 0 6px; }
.sub { color: #5b6478; margin: 0 0 16px; }
table { border-collapse: collapse; margin: 8px 0; }
td, th { padding: 3px 12px 3px 0; text-align: right; font-variant-numeric: tabular-nums; }
th:first-child, td:first-child { text-align: left; }
th { color: #5b6478; font-weight: 600; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; }
.card { border: 1px solid #dde1ea; border-radius: 6px; padding: 8px 14px; min-width: 110px; }
.card b { display: block; font-size: 18px; }
.card span { color: #5b6478; font-size: 12px; }
.bar { height: 14px; background: #4c78a8; border-radius: 2px; }
.bar.q { background: #f58518; display: inline-block; }
.bar.b { background: #4c78a8; display: inline-block; }
.bad { color: #b3261e; }
.good { color: #1e7b34; }
.chart { margin: 4px 0 12px; }
.note { color: #5b6478; font-size: 12px; }
"#;

/// The charts, drawn in the browser from the report's JSON (`R`).
const SCRIPT: &str = r#"
const W = Math.max(480, Math.min(1100, document.body.clientWidth - 48));
const ms = v => v == null ? null : v / 1000;
const palette = ['#4c78a8', '#f58518', '#e45756', '#72b7b2', '#54a24b', '#eeca3b', '#b279a2', '#ff9da6', '#9d755d', '#bab0ac'];
const xs = R.intervals.map(i => i.t + i.duration_s / 2);
function line(el, title, yLabel, labels, data, extra) {
  const series = [{ label: 's' }].concat(labels.map((l, k) => ({ label: l, stroke: palette[k % palette.length], width: 2, points: { show: xs.length < 40 } })));
  const opts = Object.assign({ title, width: W, height: 260, scales: { x: { time: false } },
    axes: [{ label: 'seconds into the run' }, { label: yLabel }], series }, extra || {});
  new uPlot(opts, [xs].concat(data), document.getElementById(el));
}
line('pct', 'Latency percentiles per second', 'ms', ['p50', 'p90', 'p99', 'max'],
  [R.intervals.map(i => ms(i.p50_us)), R.intervals.map(i => ms(i.p90_us)), R.intervals.map(i => ms(i.p99_us)), R.intervals.map(i => ms(i.max_us))]);
{
  // x = 1 / (1 - q) on a log axis: every "nine" (90 %, 99 %, 99.9 %) gets the same width.
  const pts = R.spectrum.filter(p => p.percentile < 100);
  const x = pts.map(p => 1 / (1 - p.percentile / 100));
  const nines = v => { const p = 100 * (1 - 1 / v); return (p >= 99.99 ? p.toFixed(3) : p >= 99 ? p.toFixed(1) : p.toFixed(0)) + '%'; };
  new uPlot({ title: 'Latency by percentile (max ' + R.fmt.max + ')', width: W, height: 280,
    scales: { x: { time: false, distr: 3 } },
    axes: [{ label: 'percentile', values: (u, vals) => vals.map(nines),
      // One tick per nine: 0 %, 90 %, 99 %, 99.9 %, ...
      splits: (u, i, min, max) => { const s = []; for (let v = 1; v <= max * 1.0001; v *= 10) if (v >= min * 0.9999) s.push(v); return s; } },
      { label: 'ms' }],
    series: [{ label: 'percentile', value: (u, v) => v == null ? '-' : nines(v) }, { label: 'latency', stroke: palette[0], width: 2, value: (u, v) => v == null ? '-' : v.toFixed(3) + ' ms' }] },
    [x, pts.map(p => ms(p.latency_us))], document.getElementById('spectrum'));
}
{
  const labels = ['achieved'], data = [R.intervals.map(i => i.rps)];
  if (R.rate != null) { labels.push('target'); data.push(R.intervals.map(i => i.target_rps)); }
  line('rate', 'Requests per second', 'req/s', labels, data);
}
{
  const codes = Array.from(new Set(R.intervals.flatMap(i => Object.keys(i.status)))).sort();
  const kinds = ['connect', 'timeout', 'io', 'unsent'].filter(k => R.intervals.some(i => i.errors[k] > 0));
  const labels = codes.map(c => 'status ' + c).concat(kinds.map(k => k + ' errors'));
  const data = codes.map(c => R.intervals.map(i => (i.status[c] || 0) / i.duration_s))
    .concat(kinds.map(k => R.intervals.map(i => i.errors[k] / i.duration_s)));
  if (labels.length) line('codes', 'Responses by status, and errors, per second', 'per second', labels, data);
}
"#;

/// uPlot's script without its leading `/*! … */` banner, which is the project's web
/// address: the page carries uPlot's licence text instead, so that "no external address
/// anywhere in the page" can be checked strictly.
fn uplot_js_without_banner() -> &'static str {
    let js = drover_ui::UPLOT_JS.trim_start();
    js.strip_prefix("/*!")
        .and_then(|rest| rest.find("*/").map(|end| rest[end + 2..].trim_start()))
        .unwrap_or(js)
}

/// The version named in uPlot's banner, `(v1.6.32)`.
fn uplot_version() -> &'static str {
    let banner = drover_ui::UPLOT_JS.lines().next().unwrap_or("");
    banner
        .split_once("(v")
        .and_then(|(_, rest)| rest.split_once(')'))
        .map_or("", |(version, _)| version)
}

/// Text for inside an inline `<script>` or `<style>` element: the HTML parser ends
/// those at the first `</`, whatever JavaScript or CSS would say. `<\/` means the same
/// inside JS strings, the only place the vendored code could have it (it has none).
fn escape_inline(text: &str) -> String {
    text.replace("</", "<\\/")
}

/// Escapes text for HTML element content and attribute values.
fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A row of horizontal bars, one per (label, count), widths relative to the largest.
fn bars(rows: &[(String, u64)]) -> String {
    let max = rows.iter().map(|r| r.1).max().unwrap_or(0).max(1) as f64;
    let total = rows.iter().map(|r| r.1).sum::<u64>().max(1) as f64;
    let mut s = String::from("<table>");
    for (label, n) in rows {
        let _ = write!(
            s,
            "<tr><td>{}</td><td>{n}</td><td>{:.1}%</td><td style=\"width:420px\"><div class=\"bar\" style=\"width:{:.1}%\"></div></td></tr>",
            esc(label),
            *n as f64 * 100.0 / total,
            *n as f64 * 100.0 / max
        );
    }
    s.push_str("</table>");
    s
}

fn card(s: &mut String, value: &str, label: &str, class: &str) {
    let _ = write!(
        s,
        "<div class=\"card\"><b class=\"{class}\">{}</b><span>{}</span></div>",
        esc(value),
        esc(label)
    );
}

/// The page for `report`.
pub fn render(report: &Report) -> String {
    let mut data = serde_json::to_value(report).expect("report serialises");
    data["fmt"] = serde_json::json!({ "max": fmt_us(report.latency_us.max) });
    // `<` only occurs inside JSON strings, where \u003c means the same; so the data
    // cannot end its <script> element or open a comment.
    let data = data.to_string().replace('<', "\\u003c");

    let mut body = String::new();
    let mode = match report.rate {
        Some(r) => format!(
            "open loop at {} req/s (latency from each request's scheduled send time), up to {} connections",
            fmt_rate(r),
            report.connections
        ),
        None => format!("closed loop, {} connections", report.connections),
    };
    let _ = write!(
        body,
        "<h1>drover bench → {}</h1><p class=\"sub\">{}, {} thread(s), {:.1}s, mix {}</p>",
        esc(&report.target),
        esc(&mode),
        report.threads,
        report.duration_s,
        esc(&report.mix)
    );
    body.push_str("<div class=\"cards\">");
    let l = &report.latency_us;
    card(&mut body, &report.requests.to_string(), "requests", "");
    card(&mut body, &format!("{:.1}", report.rps), "requests/s", "");
    card(&mut body, &fmt_us(l.p50), "p50", "");
    card(&mut body, &fmt_us(l.p99), "p99", "");
    card(&mut body, &fmt_us(l.p99_9), "p99.9", "");
    card(&mut body, &fmt_us(l.max), "max", "");
    let err_class = if report.errors_total > 0 { "bad" } else { "" };
    card(
        &mut body,
        &report.errors_total.to_string(),
        "errors",
        err_class,
    );
    card(
        &mut body,
        &format!("{}/s", fmt_bytes(report.bytes_per_s)),
        "transfer",
        "",
    );
    body.push_str("</div>");
    if !report.slo.is_empty() {
        body.push_str("<h2>Objectives</h2><table>");
        for v in &report.slo {
            let (class, word) = if v.met {
                ("good", "met")
            } else {
                ("bad", "breached")
            };
            let _ = write!(
                body,
                "<tr><td>{}</td><td class=\"{class}\">{word}</td></tr>",
                esc(&v.slo)
            );
        }
        body.push_str("</table>");
    }
    let _ = write!(
        body,
        "<h2>Latency</h2><table><tr><th></th><th>avg</th><th>stdev</th><th>p50</th><th>p75</th><th>p90</th><th>p99</th><th>p99.9</th><th>max</th></tr><tr><td>all</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        fmt_us_f(l.mean),
        fmt_us_f(l.stdev),
        fmt_us(l.p50),
        fmt_us(l.p75),
        fmt_us(l.p90),
        fmt_us(l.p99),
        fmt_us(l.p99_9),
        fmt_us(l.max)
    );
    if report.paths.len() > 1 {
        for (path, p) in &report.paths {
            let pl = &p.latency_us;
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(path),
                fmt_us_f(pl.mean),
                fmt_us_f(pl.stdev),
                fmt_us(pl.p50),
                fmt_us(pl.p75),
                fmt_us(pl.p90),
                fmt_us(pl.p99),
                fmt_us(pl.p99_9),
                fmt_us(pl.max)
            );
        }
    }
    body.push_str("</table>");
    body.push_str(
        "<div class=\"chart\" id=\"pct\"></div><div class=\"chart\" id=\"spectrum\"></div>\
         <h2>Throughput and errors</h2><div class=\"chart\" id=\"rate\"></div><div class=\"chart\" id=\"codes\"></div>",
    );
    if let Some(c) = &report.header_counts {
        let _ = write!(body, "<h2>Responses per {}</h2>", esc(&c.header));
        let mut rows: Vec<(String, u64)> = c
            .sorted()
            .iter()
            .map(|(v, n)| (v.to_string(), *n))
            .collect();
        if c.other > 0 {
            rows.push(("(other values)".into(), c.other));
        }
        if c.missing > 0 {
            rows.push(("(without the header)".into(), c.missing));
        }
        body.push_str(&bars(&rows));
    }
    if let Some(a) = &report.admin {
        let _ = write!(
            body,
            "<h2>Requests per endpoint (drover's /metrics at {})</h2>",
            esc(&a.admin)
        );
        let rows: Vec<(String, u64)> = a
            .endpoints
            .iter()
            .map(|e| (format!("{}/{}", e.balancer, e.endpoint), e.requests))
            .collect();
        body.push_str(&bars(&rows));
        body.push_str(
            "<h2>Where the time went, per endpoint (mean)</h2><p class=\"note\"><span class=\"bar q\" style=\"width:12px\"></span> queued in drover \
             <span class=\"bar b\" style=\"width:12px\"></span> at the backend (until its response head)</p><table>",
        );
        let longest = a
            .endpoints
            .iter()
            .map(|e| e.queue_wait.map_or(0.0, |q| q.mean_us) + e.backend.map_or(0.0, |b| b.mean_us))
            .fold(0.0, f64::max)
            .max(1.0);
        for e in &a.endpoints {
            let q = e.queue_wait.map_or(0.0, |q| q.mean_us);
            let b = e.backend.map_or(0.0, |b| b.mean_us);
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td style=\"width:420px;text-align:left\"><span class=\"bar q\" style=\"width:{:.1}%\"></span><span class=\"bar b\" style=\"width:{:.1}%\"></span></td></tr>",
                esc(&format!("{}/{}", e.balancer, e.endpoint)),
                fmt_us_f(q),
                fmt_us_f(b),
                q * 100.0 / longest,
                b * 100.0 / longest
            );
        }
        body.push_str("</table>");
    }
    let _ = write!(
        body,
        "<p class=\"note\">{} requests in {:.2}s, {} read; errors: connect {}, status {}, timeout {}, io {}, never sent {}. Charts drawn with uPlot {}.</p>",
        report.requests,
        report.elapsed_s,
        fmt_bytes(report.bytes as f64),
        report.errors.connect,
        report.errors.status,
        report.errors.timeout,
        report.errors.io,
        report.errors.unsent,
        uplot_version()
    );

    let mut page =
        String::with_capacity(drover_ui::UPLOT_JS.len() + body.len() + data.len() + 8192);
    let _ = write!(
        page,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width\">\
         <title>drover bench → {}</title><style>{}{}</style></head><body>{body}\n\
         <!-- uPlot {}:\n{}-->\n<script>{}</script>\n<script>const R = {data};\n{}</script>\n</body></html>\n",
        esc(&report.target),
        escape_inline(drover_ui::UPLOT_CSS),
        STYLE,
        uplot_version(),
        drover_ui::UPLOT_LICENSE.replace("--", "- -"),
        escape_inline(uplot_js_without_banner()),
        SCRIPT
    );
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendored_uplot_is_inlined_without_its_address() {
        let js = uplot_js_without_banner();
        assert!(js.starts_with("var uPlot="), "{}", &js[..40]);
        assert!(!js.contains("http://") && !js.contains("https://"));
        assert!(drover_ui::UPLOT_JS.ends_with(js));
        assert!(uplot_version().starts_with("1.6."), "{}", uplot_version());
        assert_eq!(escape_inline("a</script>b"), "a<\\/script>b");
        assert!(!escape_inline(drover_ui::UPLOT_JS).contains("</"));
    }
}
