//! What `GET /v1/status` returns, and the table `drover ctl status` prints from it.

use serde::{Deserialize, Serialize};
use std::fmt::Write;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub apps: Vec<AppStatus>,
    pub balancers: Vec<BalancerStatus>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppStatus {
    pub name: String,
    /// "proxy" or "shared".
    pub mode: String,
    pub command: Vec<String>,
    pub workers: Vec<WorkerRow>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkerRow {
    pub id: usize,
    pub pid: Option<u32>,
    pub port: Option<u16>,
    /// starting, ready, unhealthy, stopping, backing-off, crash-looping, stopped.
    pub state: String,
    pub uptime_secs: Option<f64>,
    pub restarts: u32,
    pub crash_streak: u32,
    pub rss_bytes: Option<u64>,
    pub in_flight: Option<u32>,
    pub last_exit: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BalancerStatus {
    pub name: String,
    pub listen: String,
    pub strategy: String,
    /// The supervised app it balances over, if any.
    pub app: Option<String>,
    pub endpoints: Vec<EndpointRow>,
    /// Where members come from besides the file: DNS names, an etcd prefix.
    #[serde(default)]
    pub sources: Vec<SourceRow>,
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
    /// Peak-EWMA latency estimate.
    pub rtt_ms: f64,
    pub weight: u32,
    pub ejections: u32,
}

impl Status {
    /// The human view: one table of workers per app, one of endpoints per balancer.
    pub fn to_table(&self) -> String {
        let mut out = String::new();
        for app in &self.apps {
            let _ = writeln!(
                out,
                "app {} ({} mode, {} workers): {}",
                app.name,
                app.mode,
                app.workers.len(),
                app.command.join(" ")
            );
            let rows: Vec<Vec<String>> = app
                .workers
                .iter()
                .map(|w| {
                    vec![
                        w.id.to_string(),
                        opt(w.pid),
                        opt(w.port),
                        w.state.clone(),
                        w.uptime_secs.map_or("-".into(), human_secs),
                        w.restarts.to_string(),
                        w.rss_bytes.map_or("-".into(), human_bytes),
                        opt(w.in_flight),
                        w.last_exit.clone().unwrap_or_else(|| "-".into()),
                    ]
                })
                .collect();
            table(
                &mut out,
                &[
                    "ID",
                    "PID",
                    "PORT",
                    "STATE",
                    "UPTIME",
                    "RESTARTS",
                    "RSS",
                    "IN-FLIGHT",
                    "LAST EXIT",
                ],
                &rows,
            );
            out.push('\n');
        }
        for b in &self.balancers {
            let over = b
                .app
                .as_ref()
                .map_or_else(String::new, |a| format!(" over app {a}"));
            let _ = writeln!(
                out,
                "balancer {} on {} ({}){over}",
                b.name, b.listen, b.strategy
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
                        format!("{:.2}", e.load),
                        match e.limit {
                            0 => "-".to_string(),
                            n => n.to_string(),
                        },
                        format!("{:.2}", e.rtt_ms),
                        e.weight.to_string(),
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
                    "LOAD",
                    "LIMIT",
                    "RTT-MS",
                    "WEIGHT",
                    "EJECTIONS",
                ],
                &rows,
            );
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
                    },
                ],
            }],
            balancers: vec![BalancerStatus {
                name: "default".into(),
                listen: "127.0.0.1:8000".into(),
                strategy: "p2c".into(),
                app: Some("pi".into()),
                endpoints: vec![EndpointRow {
                    addr: "127.0.0.1:40001".into(),
                    healthy: true,
                    available: false,
                    in_flight: 3,
                    load: 0.95,
                    limit: 2,
                    rtt_ms: 1.234,
                    weight: 1,
                    ejections: 1,
                }],
                sources: vec![SourceRow {
                    kind: "dns".into(),
                    target: "api.internal:80".into(),
                    ok: false,
                    members: 2,
                    detail: "timed out".into(),
                }],
            }],
        };
        let text = status.to_table();
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
        assert!(text.contains("balancer default on 127.0.0.1:8000 (p2c) over app pi"));
        assert!(text.contains("127.0.0.1:40001  ejected"), "{text}");
        assert!(
            text.contains("LOAD  LIMIT") && text.contains("0.95  2 "),
            "{text}"
        );
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
    }
}
