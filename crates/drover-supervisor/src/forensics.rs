//! Why workers restarted: one `RestartRecord` each time a slot's process ends (and is
//! replaced or retired), with the last lines it wrote to stderr, so a user can tell a
//! crash from an OOM replacement from a reload without digging through logs.
//!
//! Everything here is bounded: `STDERR_TAIL_LINES` lines of at most `STDERR_LINE_MAX`
//! bytes per process, `HISTORY_PER_APP` records per app, however much a crash-looping
//! worker writes.

use nix::sys::signal::Signal;
use std::collections::VecDeque;
use std::fmt;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// How many stderr lines a process keeps for its restart record.
pub const STDERR_TAIL_LINES: usize = 20;

/// A kept stderr line is cut to this many bytes (on a character boundary) and marked
/// with `TRUNCATED_MARK`; the full line was still forwarded to drover's stderr.
pub const STDERR_LINE_MAX: usize = 512;

/// Appended to a kept line that was cut.
pub const TRUNCATED_MARK: &str = " [...]";

/// How many restart records an app keeps; older ones are dropped first.
pub const HISTORY_PER_APP: usize = 20;

/// Why a worker's process ended. The kebab-case names (`as_str`) are what JSON, the
/// CLI and, later, metric labels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RestartReason {
    /// It exited by itself with an exit code.
    Exit,
    /// It was killed by a signal that drover did not send (`kill -9`, the OOM killer,
    /// a segfault).
    Signal,
    /// drover stopped it: it failed its health checks in a row (or hung).
    Health,
    /// drover replaced it: its RSS grew over `max_memory`.
    Memory,
    /// drover replaced it in a rolling reload.
    Reload,
    /// drover retired it: the app was scaled down.
    Scale,
    /// It never became ready: not ready within `ready_timeout`, or it could not be
    /// spawned at all, or (as a reload's replacement) it exited before it was ready.
    StartFailed,
    /// drover lost track of it: waiting for it failed, so how it ended is unknown.
    Lost,
}

impl RestartReason {
    /// Every reason, in the order of `RestartCounts`' slots.
    pub const ALL: [RestartReason; 8] = [
        RestartReason::Exit,
        RestartReason::Signal,
        RestartReason::Health,
        RestartReason::Memory,
        RestartReason::Reload,
        RestartReason::Scale,
        RestartReason::StartFailed,
        RestartReason::Lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RestartReason::Exit => "exit",
            RestartReason::Signal => "signal",
            RestartReason::Health => "health",
            RestartReason::Memory => "memory",
            RestartReason::Reload => "reload",
            RestartReason::Scale => "scale",
            RestartReason::StartFailed => "start-failed",
            RestartReason::Lost => "lost",
        }
    }

    fn index(self) -> usize {
        self as usize
    }

    /// The reason a process that ended by itself with `status` gets.
    pub fn of_exit(status: ExitStatus) -> RestartReason {
        if status.signal().is_some() {
            RestartReason::Signal
        } else {
            RestartReason::Exit
        }
    }
}

impl fmt::Display for RestartReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of `RestartReason::as_str`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownRestartReason(pub String);

impl fmt::Display for UnknownRestartReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown restart reason {:?}", self.0)
    }
}

impl std::error::Error for UnknownRestartReason {}

impl FromStr for RestartReason {
    type Err = UnknownRestartReason;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        RestartReason::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownRestartReason(s.to_string()))
    }
}

/// How many processes of one worker slot ended, by reason (a counter per reason, for
/// metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestartCounts([u64; RestartReason::ALL.len()]);

impl RestartCounts {
    pub fn get(&self, reason: RestartReason) -> u64 {
        self.0[reason.index()]
    }

    pub(crate) fn add(&mut self, reason: RestartReason) {
        let n = &mut self.0[reason.index()];
        *n = n.saturating_add(1);
    }

    /// Every reason with its count, zeros included (a metric that exists from the start
    /// is easier to rate() than one that appears on the first restart).
    pub fn iter(&self) -> impl Iterator<Item = (RestartReason, u64)> + '_ {
        RestartReason::ALL.into_iter().map(|r| (r, self.get(r)))
    }

    pub fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// The name of signal `number` ("SIGKILL"), when Linux has one by that number.
pub fn signal_name(number: i32) -> Option<&'static str> {
    Signal::try_from(number).ok().map(Signal::as_str)
}

/// One process of a worker slot that ended.
#[derive(Debug, Clone, PartialEq)]
pub struct RestartRecord {
    /// Wall-clock time it ended (or was found ended).
    pub at: SystemTime,
    pub app: String,
    pub worker: usize,
    /// `None` when it could not be spawned.
    pub pid: Option<u32>,
    pub reason: RestartReason,
    /// The human side of the reason, e.g. "not ready within 5s (connection refused)",
    /// "uses 300 MiB, over max_memory 256 MiB", "failed to start: No such file".
    pub detail: Option<String>,
    /// Its exit code, when it exited (also after drover's SIGTERM, if it then exited).
    pub exit_code: Option<i32>,
    /// The signal that killed it, whoever sent it; see `reason` for whether drover did.
    pub signal: Option<i32>,
    /// From spawn to its end.
    pub uptime: Option<Duration>,
    /// Its last sampled RSS (sampled every second, and just before drover stops it).
    pub rss_bytes: Option<u64>,
    /// Its last sampled CPU time (user + system), like `rss_bytes`.
    pub cpu_seconds: Option<f64>,
    /// Its last stderr lines, oldest first (see `STDERR_TAIL_LINES`, `STDERR_LINE_MAX`).
    pub stderr_tail: Vec<String>,
}

impl RestartRecord {
    pub fn signal_name(&self) -> Option<&'static str> {
        self.signal.and_then(signal_name)
    }

    /// How it ended, as the status line shows a crash (`exit status: 0`, `signal: 9
    /// (SIGKILL)`, the standard library's words); `None` when neither is known.
    pub fn exit_text(&self) -> Option<String> {
        match (self.exit_code, self.signal) {
            (Some(code), _) => Some(format!("exit status: {code}")),
            (None, Some(signal)) => Some(match signal_name(signal) {
                Some(name) => format!("signal: {signal} ({name})"),
                None => format!("signal: {signal}"),
            }),
            (None, None) => None,
        }
    }

    /// Sets `exit_code` and `signal` from how the process ended.
    pub(crate) fn with_status(mut self, status: Option<ExitStatus>) -> RestartRecord {
        if let Some(status) = status {
            self.exit_code = status.code();
            self.signal = status.signal();
        }
        self
    }
}

/// The last stderr lines of one process, fed by its output forwarding.
#[derive(Debug, Default)]
pub(crate) struct StderrTail {
    lines: Mutex<VecDeque<String>>,
}

impl StderrTail {
    /// Keeps `line`, cut to `STDERR_LINE_MAX` bytes, dropping the oldest beyond
    /// `STDERR_TAIL_LINES`. `cut` says the line was already cut by the forwarding (it
    /// was longer than its buffer); it gets the mark too.
    pub(crate) fn push(&self, line: &str, cut: bool) {
        let kept = cap_line(line, cut);
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() == STDERR_TAIL_LINES {
            lines.pop_front();
        }
        lines.push_back(kept);
    }

    pub(crate) fn lines(&self) -> Vec<String> {
        let lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        lines.iter().cloned().collect()
    }
}

fn cap_line(line: &str, cut: bool) -> String {
    if line.len() <= STDERR_LINE_MAX && !cut {
        return line.to_string();
    }
    let mut end = line.len().min(STDERR_LINE_MAX);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    let mut kept = String::with_capacity(end + TRUNCATED_MARK.len());
    kept.push_str(&line[..end]);
    kept.push_str(TRUNCATED_MARK);
    kept
}

/// An app's last `HISTORY_PER_APP` restart records, oldest first.
#[derive(Debug, Default)]
pub(crate) struct RestartHistory {
    records: Mutex<VecDeque<RestartRecord>>,
}

impl RestartHistory {
    pub(crate) fn push(&self, record: RestartRecord) {
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.len() == HISTORY_PER_APP {
            records.pop_front();
        }
        records.push_back(record);
    }

    pub(crate) fn records(&self) -> Vec<RestartRecord> {
        let records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        records.iter().cloned().collect()
    }
}

#[cfg(test)]
impl RestartRecord {
    /// A record of worker `worker` of app "a" that exited with status 1, having written
    /// `stderr` last.
    pub(crate) fn exited_1(worker: usize, stderr: &[&str]) -> RestartRecord {
        RestartRecord {
            at: SystemTime::UNIX_EPOCH,
            app: "a".into(),
            worker,
            pid: None,
            reason: RestartReason::Exit,
            detail: None,
            exit_code: Some(1),
            signal: None,
            uptime: None,
            rss_bytes: None,
            cpu_seconds: None,
            stderr_tail: stderr.iter().map(|l| l.to_string()).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_round_trip_through_their_names() {
        for reason in RestartReason::ALL {
            assert_eq!(reason.as_str().parse::<RestartReason>(), Ok(reason));
        }
        assert_eq!(RestartReason::StartFailed.to_string(), "start-failed");
        assert_eq!(
            "oom".parse::<RestartReason>(),
            Err(UnknownRestartReason("oom".into()))
        );
        // ALL is in index order, so counts land in their own slot.
        for (i, reason) in RestartReason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), i);
        }
    }

    #[test]
    fn counts_are_per_reason() {
        let mut counts = RestartCounts::default();
        counts.add(RestartReason::Memory);
        counts.add(RestartReason::Memory);
        counts.add(RestartReason::Signal);
        assert_eq!(counts.get(RestartReason::Memory), 2);
        assert_eq!(counts.get(RestartReason::Signal), 1);
        assert_eq!(counts.get(RestartReason::Exit), 0);
        assert_eq!(counts.total(), 3);
        assert_eq!(counts.iter().count(), RestartReason::ALL.len());
    }

    #[test]
    fn exit_statuses_map_to_exit_or_signal() {
        // Raw wait statuses: exit code in the high byte, a terminating signal in the low.
        let exited = ExitStatus::from_raw(3 << 8);
        let killed = ExitStatus::from_raw(9);
        assert_eq!(RestartReason::of_exit(exited), RestartReason::Exit);
        assert_eq!(RestartReason::of_exit(killed), RestartReason::Signal);
        let record = RestartRecord {
            at: SystemTime::UNIX_EPOCH,
            app: "a".into(),
            worker: 0,
            pid: None,
            reason: RestartReason::Signal,
            detail: None,
            exit_code: None,
            signal: None,
            uptime: None,
            rss_bytes: None,
            cpu_seconds: None,
            stderr_tail: vec![],
        }
        .with_status(Some(killed));
        assert_eq!((record.exit_code, record.signal), (None, Some(9)));
        assert_eq!(record.signal_name(), Some("SIGKILL"));
        assert_eq!(signal_name(15), Some("SIGTERM"));
        assert_eq!(signal_name(0), None);
    }

    #[test]
    fn the_tail_keeps_the_last_lines_each_capped() {
        let tail = StderrTail::default();
        for i in 0..(STDERR_TAIL_LINES + 5) {
            tail.push(&format!("line {i}"), false);
        }
        let lines = tail.lines();
        assert_eq!(lines.len(), STDERR_TAIL_LINES);
        assert_eq!(lines[0], "line 5");
        assert_eq!(
            lines[STDERR_TAIL_LINES - 1],
            format!("line {}", STDERR_TAIL_LINES + 4)
        );

        // Multi-byte characters are never split.
        let long = "é".repeat(STDERR_LINE_MAX);
        tail.push(&long, false);
        let kept = tail.lines().pop().unwrap();
        let text = kept.strip_suffix(TRUNCATED_MARK).expect("marked as cut");
        assert!(text.len() <= STDERR_LINE_MAX && text.len() >= STDERR_LINE_MAX - 1);
        assert!(text.chars().all(|c| c == 'é'));

        // A short piece of a line the forwarding already cut is marked too.
        tail.push("short", true);
        assert_eq!(
            tail.lines().pop().unwrap(),
            format!("short{TRUNCATED_MARK}")
        );
    }

    #[test]
    fn history_keeps_the_last_records() {
        let history = RestartHistory::default();
        for worker in 0..(HISTORY_PER_APP + 10) {
            history.push(RestartRecord::exited_1(worker, &[]));
        }
        let records = history.records();
        assert_eq!(records.len(), HISTORY_PER_APP);
        assert_eq!(records[0].worker, 10);
        assert_eq!(records.last().unwrap().worker, HISTORY_PER_APP + 9);
    }
}
