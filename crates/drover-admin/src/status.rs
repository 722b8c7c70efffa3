//! What `GET /v1/status` returns, the table `drover ctl status` prints from it, and the
//! log `drover ctl restarts` prints.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::SystemTime;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub apps: Vec<AppStatus>,
    pub balancers: Vec<BalancerStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppStatus {
    pub name: String,
    /// "auto", "proxy", "handoff", "shared" or "background".
    pub mode: String,
    pub command: Vec<String>,
    pub workers: Vec<WorkerRow>,
    /// Why its worker processes ended, the last few, oldest first.
    #[serde(default)]
    pub restarts: Vec<RestartRow>,
    /// The ports its workers listen on after their first (a metrics or admin server of
    /// the app's own) and its Unix sockets, which they share as under Node's cluster
    /// module.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared_ports: Vec<SharedPortRow>,
}

/// A port an app's workers share (see `AppStatus::shared_ports`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SharedPortRow {
    /// `ADDR:PORT`, `*:PORT` for every address, `unix:PATH` for a Unix socket.
    pub listen: String,
    /// How many of the app's workers listen there now.
    pub workers: usize,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerRow {
    pub id: usize,
    pub pid: Option<u32>,
    pub port: Option<u16>,
    /// starting, ready, busy, unhealthy, hung, stopping, backing-off, crash-looping, errored,
    /// stopped.
    pub state: String,
    pub uptime_secs: Option<f64>,
    pub restarts: u32,
    pub crash_streak: u32,
    pub rss_bytes: Option<u64>,
    pub in_flight: Option<u32>,
    /// Client connections handed to the worker, which it serves directly (`drover
    /// run`'s `auto` and `handoff` modes); their requests are not in `in_flight`.
    #[serde(default)]
    pub clients: Option<usize>,
    pub last_exit: Option<String>,
    /// The reason of the last restart record: exit, signal, health, memory, reload,
    /// scale, start-failed, lost.
    #[serde(default)]
    pub last_restart_reason: Option<String>,
    /// How the previous process ended: its exit code, or the signal that killed it.
    #[serde(default)]
    pub last_exit_code: Option<i32>,
    #[serde(default)]
    pub last_signal: Option<i32>,
    #[serde(default)]
    pub last_signal_name: Option<String>,
    /// Processes of this slot that ended, by reason, every reason present (zeros too).
    #[serde(default)]
    pub restarts_by_reason: BTreeMap<String, u64>,
    /// CPU time (user + system) the current process has used.
    #[serde(default)]
    pub cpu_seconds: Option<f64>,
    /// When the current process was spawned, in seconds since the Unix epoch.
    #[serde(default)]
    pub started_at_unix_secs: Option<f64>,
}

/// One worker process that ended: why, how, and what it last wrote to stderr.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RestartRow {
    /// When it ended, RFC 3339 in UTC.
    pub time: String,
    /// The same instant in seconds since the Unix epoch.
    pub unix_secs: f64,
    pub app: String,
    pub worker: usize,
    /// `None` when it could not be spawned.
    pub pid: Option<u32>,
    /// exit, signal, health, memory, reload, scale, start-failed, lost.
    pub reason: String,
    /// The human side of the reason, e.g. "not ready within 5s".
    #[serde(default)]
    pub detail: Option<String>,
    #[serde(default)]
    pub exit_code: Option<i32>,
    #[serde(default)]
    pub signal: Option<i32>,
    /// e.g. "SIGKILL".
    #[serde(default)]
    pub signal_name: Option<String>,
    /// From spawn to its end.
    #[serde(default)]
    pub uptime_secs: Option<f64>,
    /// Its last sampled RSS.
    #[serde(default)]
    pub rss_bytes: Option<u64>,
    /// Its last sampled CPU time (user + system).
    #[serde(default)]
    pub cpu_seconds: Option<f64>,
    /// Its last stderr lines, oldest first, each cut to a bounded length.
    #[serde(default)]
    pub stderr_tail: Vec<String>,
}

/// `at` as the (RFC 3339, Unix seconds) pair the JSON carries; a time before the epoch
/// (a clock set far back) counts as the epoch.
pub fn wall_clock(at: SystemTime) -> (String, f64) {
    let secs = at
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    let at = at.max(SystemTime::UNIX_EPOCH);
    (humantime::format_rfc3339_millis(at).to_string(), secs)
}

/// `drover ctl restarts --app` named an app that does not run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoSuchApp {
    pub app: String,
    /// The apps that do run.
    pub running: Vec<String>,
}

impl std::fmt::Display for NoSuchApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no app named {:?} runs (apps: {})",
            self.app,
            self.running.join(", ")
        )
    }
}

impl std::error::Error for NoSuchApp {}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BalancerStatus {
    pub name: String,
    pub listen: String,
    /// Further addresses it accepts clients on: the other loopback of an app that
    /// listens at `localhost` (`drover run`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub also_listen: Vec<String>,
    pub strategy: String,
    /// What its clients speak: "http", or "tcp" (connections relayed unread; an
    /// endpoint's in-flight count is then its open connections).
    #[serde(default = "http_mode")]
    pub mode: String,
    /// The supervised app it balances over, if any.
    pub app: Option<String>,
    /// What it speaks to its backends: "http1", "h2c" or "h2" (`backend_protocol`).
    #[serde(default = "http1")]
    pub backend_protocol: String,
    pub endpoints: Vec<EndpointRow>,
    /// Where members come from besides the file: DNS names, an etcd prefix.
    #[serde(default)]
    pub sources: Vec<SourceRow>,
    /// Its routes, in order: what each matches, and the balancer it sends to.
    #[serde(default)]
    pub routes: Vec<RouteRow>,
}

impl BalancerStatus {
    /// Every address it accepts clients on, as status shows them: `A` or `A and B`.
    pub fn shown_listen(&self) -> String {
        std::iter::once(self.listen.as_str())
            .chain(self.also_listen.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" and ")
    }
}

/// One of a listener's routes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteRow {
    /// What it matches, as `drover ctl status` shows it: `sni a.test, *.b.test`, or
    /// `host a.test path /api (stripped)`, `any host path /`.
    pub matches: String,
    /// The balancer it sends to.
    pub balancer: String,
}

/// A status from a drover that did not say (before TCP mode): HTTP.
fn http_mode() -> String {
    "http".into()
}

/// A status from a drover that did not say (before HTTP/2 to backends): HTTP/1.1.
fn http1() -> String {
    "http1".into()
}

/// One DNS name or etcd prefix a balancer follows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceRow {
    /// "dns" or "etcd".
    pub kind: String,
    /// The name or prefix.
    pub target: String,
    /// The last lookup or the watch works.
    pub ok: bool,
    /// Members it gives now (the last good answer while it fails).
    pub members: usize,
    /// What is wrong, or when it is looked at next.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EndpointRow {
    pub addr: String,
    pub healthy: bool,
    /// Healthy and not ejected: the balancer may pick it.
    pub available: bool,
    pub in_flight: u32,
    /// Utilisation reported by the backend or measured for a worker (1.0 = saturated).
    pub load: f64,
    /// The concurrency cap in force now; 0 = none.
    pub limit: u32,
    /// Why `limit` is what it is: "max-conns" (a fixed cap on requests in flight),
    /// "saturated" (the learned limit, in force on pending requests while the backend's
    /// CPU is saturated), "not-saturated" (a limit is learned but not in force),
    /// "mostly-waits" (saturated, but its requests mostly wait on I/O rather than work:
    /// none in force), "serves-clients" (none in force: client connections were handed
    /// to the worker, which serves requests drover does not count), "probation" (one
    /// request at a time: its health checks get no answer, yet it was kept), "off".
    #[serde(default)]
    pub limit_reason: String,
    /// The learned limit, also while it is not in force; 0 when none is learned.
    #[serde(default)]
    pub learned_limit: u32,
    /// Requests sent and not yet answered with a response head: what a learned limit
    /// counts. `in_flight` also counts responses still streaming.
    #[serde(default)]
    pub pending: u32,
    /// Of `pending`, the requests later ones overtook: they wait (a long-poll, a query)
    /// rather than work, and a learned limit does not count them.
    #[serde(default)]
    pub waiting: u32,
    /// Peak-EWMA latency estimate.
    pub rtt_ms: f64,
    pub weight: u32,
    /// The share of its weight slow start gives it now, in (0, 1]; 1 when it is not
    /// ramping (it joined a pool that had served for a while, or came back).
    #[serde(default = "full_share")]
    pub ramp: f64,
    pub ejections: u32,
    /// Why its last active health check failed, while its checks keep failing (a
    /// certificate that does not verify: `TLS handshake failed: unknown-issuer (...)`);
    /// `None` when it passed or none runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_error: Option<String>,
}

fn full_share() -> f64 {
    1.0
}

impl EndpointRow {
    /// The WEIGHT column: the weight, and the share of it slow start gives now.
    fn weight_cell(&self) -> String {
        if self.ramp < 1.0 {
            // Rounded down: a ramp in its last half percent is not yet "100%".
            let percent = (self.ramp * 100.0).floor();
            format!("{} (slow start {percent:.0}%)", self.weight)
        } else {
            self.weight.to_string()
        }
    }

    /// The LIMIT column: the limit in force, and what it counts or why none is, so it
    /// never seems to contradict IN-FLIGHT. A learned limit counts PENDING (requests
    /// awaiting their response head) less those that wait, and holds only while the
    /// backend is saturated.
    fn limit_cell(&self) -> String {
        match (self.limit_reason.as_str(), self.limit) {
            ("saturated", n) if self.waiting > 0 => {
                format!("{n} (saturated, {} waiting)", self.waiting)
            }
            ("saturated", n) => format!("{n} (saturated)"),
            ("not-saturated", _) => format!("- (not saturated, {})", self.learned_limit),
            ("mostly-waits", _) => format!("- (requests wait, {})", self.learned_limit),
            ("serves-clients", _) => "- (handed connections)".to_string(),
            ("probation", n) => format!("{n} (checks get no answer)"),
            (_, 0) => "-".to_string(),
            (_, n) => n.to_string(),
        }
    }
}

impl Status {
    /// The human view: one table of workers per app, one of endpoints per balancer.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        for app in &self.apps {
            let _ = writeln!(
                out,
                "app {} ({} mode, {}): {}",
                app.name,
                app.mode,
                drover_units::count(app.workers.len(), "worker"),
                app.command.join(" ")
            );
            // Only where workers serve handed connections (`auto`, `handoff`): what they
            // serve there is not in IN-FLIGHT, which reads 0 under full load.
            let handed = app.workers.iter().any(|w| w.clients.is_some());
            let rows: Vec<Vec<String>> = app
                .workers
                .iter()
                .map(|w| {
                    let mut row = vec![
                        w.id.to_string(),
                        opt(w.pid),
                        opt(w.port),
                        w.state.clone(),
                        w.uptime_secs.map_or("-".into(), human_secs),
                        w.restarts.to_string(),
                        w.last_restart_reason.clone().unwrap_or_else(|| "-".into()),
                        w.rss_bytes.map_or("-".into(), human_bytes),
                        opt(w.in_flight),
                    ];
                    if handed {
                        row.push(opt(w.clients));
                    }
                    row.push(w.last_exit.clone().unwrap_or_else(|| "-".into()));
                    row
                })
                .collect();
            let mut headers = vec![
                "ID",
                "PID",
                "PORT",
                "STATE",
                "UPTIME",
                "RESTARTS",
                "LAST RESTART",
                "RSS",
                "IN-FLIGHT",
            ];
            if handed {
                headers.push("CLIENTS");
            }
            headers.push("LAST EXIT");
            table(&mut out, &headers, &rows);
            if !app.shared_ports.is_empty() {
                let ports: Vec<String> = app
                    .shared_ports
                    .iter()
                    .map(|p| format!("{} ({} workers)", p.listen, p.workers))
                    .collect();
                let _ = writeln!(
                    out,
                    "its workers share {}: each new connection to the one with the fewest not yet taken up, as under Node's cluster module",
                    ports.join(", ")
                );
            }
            out.push('\n');
        }
        for b in &self.balancers {
            let over = b
                .app
                .as_ref()
                .map_or_else(String::new, |a| format!(" over app {a}"));
            let on = if b.listen == "-" {
                "no listener: what routes send it".to_string()
            } else {
                format!("on {}", b.shown_listen())
            };
            let _ = writeln!(
                out,
                "balancer {} {on} ({}){over}",
                b.name,
                if b.mode == "tcp" {
                    format!("{}, tcp", b.strategy)
                } else if b.backend_protocol != "http1" {
                    format!("{}, {} to backends", b.strategy, b.backend_protocol)
                } else {
                    b.strategy.clone()
                }
            );
            let rows: Vec<Vec<String>> = b
                .endpoints
                .iter()
                .map(|e| {
                    let health = match (e.healthy, e.available) {
                        (true, true) => "up",
                        (true, false) => "ejected",
                        (false, _) => "down",
                    };
                    vec![
                        e.addr.clone(),
                        health.to_string(),
                        e.in_flight.to_string(),
                        e.pending.to_string(),
                        format!("{:.2}", e.load),
                        e.limit_cell(),
                        format!("{:.2}", e.rtt_ms),
                        e.weight_cell(),
                        e.ejections.to_string(),
                    ]
                })
                .collect();
            table(
                &mut out,
                &[
                    "ENDPOINT",
                    "HEALTH",
                    "IN-FLIGHT",
                    "PENDING",
                    "LOAD",
                    "LIMIT",
                    "RTT-MS",
                    "WEIGHT",
                    "EJECTIONS",
                ],
                &rows,
            );
            for e in &b.endpoints {
                if let Some(why) = &e.check_error {
                    let _ = writeln!(out, "  {}: health check failing: {why}", e.addr);
                }
            }
            for r in &b.routes {
                let _ = writeln!(out, "  route {} -> {}", r.matches, r.balancer);
            }
            for src in &b.sources {
                let state = if src.ok { "ok" } else { "failing" };
                let _ = writeln!(
                    out,
                    "  {} {}: {state}, {} members; {}",
                    src.kind, src.target, src.members, src.detail
                );
            }
            out.push('\n');
        }
        if out.is_empty() {
            out.push_str("nothing is running\n");
        }
        out
    }

    /// The restart records of every app (or of `app` only), oldest first across apps.
    pub fn restarts(&self, app: Option<&str>) -> Result<Vec<RestartRow>, NoSuchApp> {
        if let Some(name) = app {
            if !self.apps.iter().any(|a| a.name == name) {
                return Err(NoSuchApp {
                    app: name.to_string(),
                    running: self.apps.iter().map(|a| a.name.clone()).collect(),
                });
            }
        }
        let mut rows: Vec<RestartRow> = self
            .apps
            .iter()
            .filter(|a| app.is_none_or(|name| a.name == name))
            .flat_map(|a| a.restarts.iter().cloned())
            .collect();
        // Stable: records of one app keep their order when their times are equal.
        rows.sort_by(|a, b| a.unix_secs.total_cmp(&b.unix_secs));
        Ok(rows)
    }
}

/// The restart log `drover ctl restarts` prints: per restart a header line (time,
/// app/worker, pid, reason, exit code or signal, uptime, RSS, detail), then its last
/// stderr lines indented.
pub fn restarts_log(rows: &[RestartRow]) -> String {
    if rows.is_empty() {
        return "no restarts recorded\n".to_string();
    }
    let mut out = String::new();
    for r in rows {
        let ended = match (r.exit_code, r.signal) {
            (Some(code), _) => format!("code {code}"),
            (None, Some(sig)) => match &r.signal_name {
                Some(name) => format!("signal {sig} ({name})"),
                None => format!("signal {sig}"),
            },
            (None, None) => "-".to_string(),
        };
        let _ = write!(
            out,
            "{}  {}/{}  pid {}  {}  {ended}  uptime {}  rss {}",
            r.time,
            r.app,
            r.worker,
            opt(r.pid),
            r.reason,
            r.uptime_secs.map_or("-".into(), short_secs),
            r.rss_bytes.map_or("-".into(), human_bytes),
        );
        if let Some(detail) = &r.detail {
            let _ = write!(out, "  ({detail})");
        }
        out.push('\n');
        for line in &r.stderr_tail {
            let _ = writeln!(out, "    {line}");
        }
    }
    out
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_string(), |v| v.to_string())
}

fn human_secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d{}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// Like `human_secs`, with tenths under a minute: crash-looping processes live for
/// fractions of a second.
fn short_secs(s: f64) -> String {
    if s < 60.0 {
        format!("{:.1}s", s.max(0.0))
    } else {
        human_secs(s)
    }
}

fn human_bytes(b: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if b >= 1 << 30 {
        format!("{:.1}G", b as f64 / (MIB * 1024.0))
    } else {
        format!("{:.1}M", b as f64 / MIB)
    }
}

/// Left-aligned columns two spaces apart, sized to the widest cell.
pub(crate) fn table(out: &mut String, header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut text = String::new();
        for (i, (cell, w)) in cells.zip(&widths).enumerate() {
            if i > 0 {
                text.push_str("  ");
            }
            let _ = write!(text, "{cell:<w$}");
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_lines_up_and_marks_missing_values() {
        let status = Status {
            apps: vec![AppStatus {
                name: "pi".into(),
                mode: "proxy".into(),
                command: vec!["node".into(), "pi.js".into()],
                workers: vec![
                    WorkerRow {
                        id: 0,
                        pid: Some(4242),
                        port: Some(40001),
                        state: "ready".into(),
                        uptime_secs: Some(3725.0),
                        restarts: 2,
                        crash_streak: 0,
                        rss_bytes: Some(45 << 20),
                        in_flight: Some(3),
                        last_exit: Some("exit status: 1".into()),
                        last_restart_reason: Some("memory".into()),
                        ..WorkerRow::default()
                    },
                    WorkerRow {
                        id: 1,
                        pid: None,
                        port: None,
                        state: "backing-off".into(),
                        uptime_secs: None,
                        restarts: 7,
                        crash_streak: 7,
                        rss_bytes: None,
                        in_flight: None,
                        last_exit: None,
                        ..WorkerRow::default()
                    },
                ],
                restarts: vec![],
                shared_ports: vec![SharedPortRow {
                    listen: "*:9100".into(),
                    workers: 2,
                }],
            }],
            balancers: vec![BalancerStatus {
                name: "default".into(),
                listen: "127.0.0.1:8000".into(),
                also_listen: vec!["[::1]:8000".into()],
                strategy: "p2c".into(),
                mode: "http".into(),
                app: Some("pi".into()),
                backend_protocol: "http1".into(),
                endpoints: vec![EndpointRow {
                    addr: "127.0.0.1:40001".into(),
                    healthy: true,
                    available: false,
                    in_flight: 3,
                    pending: 1,
                    waiting: 0,
                    load: 0.95,
                    limit: 2,
                    limit_reason: "max-conns".into(),
                    learned_limit: 0,
                    rtt_ms: 1.234,
                    weight: 1,
                    ramp: 0.4,
                    ejections: 1,
                    check_error: None,
                }],
                sources: vec![SourceRow {
                    kind: "dns".into(),
                    target: "api.internal:80".into(),
                    ok: false,
                    members: 2,
                    detail: "timed out".into(),
                }],
                routes: vec![RouteRow {
                    matches: "host api.test path /v1 (stripped)".into(),
                    balancer: "api".into(),
                }],
            }],
        };
        let text = status.to_table();
        assert!(
            text.contains("its workers share *:9100 (2 workers): each new connection to"),
            "{text}"
        );
        assert!(
            text.contains("  dns api.internal:80: failing, 2 members; timed out"),
            "{text}"
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "app pi (proxy mode, 2 workers): node pi.js");
        assert!(lines[1].starts_with("ID  PID   PORT   STATE"), "{text}");
        assert!(
            lines[2].contains("4242") && lines[2].contains("1h2m") && lines[2].contains("45.0M"),
            "{text}"
        );
        assert!(
            lines[3].contains("backing-off") && lines[3].contains(" - "),
            "{text}"
        );
        // Columns line up: STATE starts at the same offset in every row.
        let col = lines[1].find("STATE").unwrap();
        assert_eq!(&lines[2][col..col + 5], "ready");
        let col = lines[1].find("LAST RESTART").unwrap();
        assert_eq!(&lines[2][col..col + 7], "memory ");
        assert_eq!(&lines[3][col..col + 2], "- ");
        assert!(
            text.contains("balancer default on 127.0.0.1:8000 and [::1]:8000 (p2c) over app pi")
        );
        assert!(
            text.contains("  route host api.test path /v1 (stripped) -> api\n"),
            "{text}"
        );
        assert!(text.contains("127.0.0.1:40001  ejected"), "{text}");
        assert!(
            text.contains("LOAD  LIMIT") && text.contains("0.95  2 "),
            "{text}"
        );
        assert!(text.contains("1 (slow start 40%)  1\n"), "{text}");
    }

    #[test]
    fn the_limit_column_says_what_is_in_force_and_why() {
        let waiting_row = |limit, reason: &str, learned, waiting| EndpointRow {
            addr: "127.0.0.1:1".into(),
            healthy: true,
            available: true,
            in_flight: 18,
            pending: 4,
            waiting,
            load: 0.95,
            limit,
            limit_reason: reason.into(),
            learned_limit: learned,
            rtt_ms: 1.0,
            weight: 1,
            ramp: 1.0,
            ejections: 0,
            check_error: None,
        };
        let row = |limit, reason: &str, learned| waiting_row(limit, reason, learned, 0);
        assert_eq!(row(4, "saturated", 4).limit_cell(), "4 (saturated)");
        // The WEIGHT column of the same rows: a ramp not yet over never reads 100%.
        let ramped = |ramp| EndpointRow {
            ramp,
            ..row(4, "saturated", 4)
        };
        assert_eq!(ramped(1.0).weight_cell(), "1");
        assert_eq!(ramped(0.4).weight_cell(), "1 (slow start 40%)");
        assert_eq!(ramped(0.997).weight_cell(), "1 (slow start 99%)");
        // Long-polls above the limit: they wait, and the limit does not count them.
        assert_eq!(
            waiting_row(4, "saturated", 4, 30).limit_cell(),
            "4 (saturated, 30 waiting)"
        );
        assert_eq!(
            row(0, "not-saturated", 4).limit_cell(),
            "- (not saturated, 4)"
        );
        assert_eq!(
            row(0, "mostly-waits", 4).limit_cell(),
            "- (requests wait, 4)"
        );
        assert_eq!(
            row(0, "serves-clients", 4).limit_cell(),
            "- (handed connections)"
        );
        assert_eq!(
            row(1, "probation", 4).limit_cell(),
            "1 (checks get no answer)"
        );
        assert_eq!(row(8, "max-conns", 0).limit_cell(), "8");
        assert_eq!(row(0, "off", 0).limit_cell(), "-");
        // An older drover's JSON, without the reason: the limit as it was shown.
        assert_eq!(row(3, "", 0).limit_cell(), "3");
    }

    fn restart(app: &str, worker: usize, unix_secs: f64, reason: &str) -> RestartRow {
        RestartRow {
            time: wall_clock(
                SystemTime::UNIX_EPOCH + std::time::Duration::from_secs_f64(unix_secs),
            )
            .0,
            unix_secs,
            app: app.into(),
            worker,
            pid: Some(100 + worker as u32),
            reason: reason.into(),
            ..RestartRow::default()
        }
    }

    fn app(name: &str, restarts: Vec<RestartRow>) -> AppStatus {
        AppStatus {
            name: name.into(),
            mode: "proxy".into(),
            command: vec!["x".into()],
            workers: vec![],
            restarts,
            shared_ports: vec![],
        }
    }

    #[test]
    fn restarts_merge_apps_by_time_and_filter_by_app() {
        let status = Status {
            apps: vec![
                app(
                    "a",
                    vec![
                        restart("a", 0, 10.0, "exit"),
                        restart("a", 1, 30.0, "reload"),
                    ],
                ),
                app("b", vec![restart("b", 0, 20.0, "memory")]),
            ],
            balancers: vec![],
        };
        let all = status.restarts(None).unwrap();
        let order: Vec<&str> = all.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(order, ["exit", "memory", "reload"]);
        let b = status.restarts(Some("b")).unwrap();
        assert_eq!(b.len(), 1);
        assert_eq!(b[0].app, "b");
        let err = status.restarts(Some("c")).unwrap_err();
        assert_eq!(err.to_string(), "no app named \"c\" runs (apps: a, b)");
    }

    #[test]
    fn the_restart_log_has_a_header_per_restart_and_its_stderr_indented() {
        let crashed = RestartRow {
            exit_code: Some(3),
            uptime_secs: Some(0.25),
            rss_bytes: Some(45 << 20),
            stderr_tail: vec!["Error: boom".into(), "  at main.js:1".into()],
            ..restart("web", 1, 1_700_000_000.5, "exit")
        };
        let killed = RestartRow {
            signal: Some(9),
            signal_name: Some("SIGKILL".into()),
            detail: Some("over max_memory".into()),
            ..restart("web", 0, 1_700_000_100.0, "signal")
        };
        let log = restarts_log(&[crashed, killed]);
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(
            lines,
            [
                "2023-11-14T22:13:20.500Z  web/1  pid 101  exit  code 3  uptime 0.2s  rss 45.0M",
                "    Error: boom",
                "      at main.js:1",
                "2023-11-14T22:15:00.000Z  web/0  pid 100  signal  signal 9 (SIGKILL)  uptime -  rss -  (over max_memory)",
            ]
        );
        assert_eq!(restarts_log(&[]), "no restarts recorded\n");
    }

    #[test]
    fn status_json_without_the_restart_fields_still_parses() {
        // What a drover from before restart records answered.
        let json = r#"{"apps":[{"name":"a","mode":"proxy","command":["x"],"workers":[{"id":0,
            "pid":1,"port":2,"state":"ready","uptime_secs":1.0,"restarts":0,"crash_streak":0,
            "rss_bytes":null,"in_flight":null,"last_exit":null}]}],"balancers":[]}"#;
        let status: Status = serde_json::from_str(json).unwrap();
        assert!(status.apps[0].restarts.is_empty());
        assert_eq!(status.apps[0].workers[0].last_restart_reason, None);
        assert!(status.apps[0].workers[0].restarts_by_reason.is_empty());
    }

    #[test]
    fn round_trips_through_json() {
        let status = Status {
            apps: vec![],
            balancers: vec![],
        };
        let json = serde_json::to_string(&status).unwrap();
        assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), status);
        assert_eq!(status.to_table(), "nothing is running\n");
        let full = Status {
            apps: vec![app(
                "a",
                vec![RestartRow {
                    stderr_tail: vec!["x".into()],
                    ..restart("a", 0, 1.5, "health")
                }],
            )],
            balancers: vec![],
        };
        let json = serde_json::to_string(&full).unwrap();
        assert_eq!(serde_json::from_str::<Status>(&json).unwrap(), full);
    }
}
