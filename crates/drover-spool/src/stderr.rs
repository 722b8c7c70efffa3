//! drover's own stderr, as a spool: its log (tracing), its workers' output and its
//! messages all go through one writer thread, in the order they were pushed.

use crate::{Options, Spool};
use std::fmt;
use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// Most bytes waiting for stderr's reader. A reader that pauses (a terminal scrolled
/// back, a log shipper's hiccup) loses nothing at the output of a few workers that log
/// every request; one that stopped for good costs lines, never drover.
pub const STDERR_CAP: usize = 8 << 20;

static SPOOL: OnceLock<Option<Spool>> = OnceLock::new();

/// Lines dropped, and when they were last said.
static DROPS: DropNotices = DropNotices::new();

/// Lines dropped since drover started (`stderr_dropped_lines`).
static DROPPED_TOTAL: AtomicU64 = AtomicU64::new(0);

/// How often at most a line says how many lines were dropped. While a slow reader
/// drains a full buffer, a short line gets through between long ones that do not: a
/// notice before each such line made 240-274 notices in a row after a flood (ops
/// seat), where one a second with the count says the same.
const NOTICE_EVERY: Duration = Duration::from_secs(1);

/// Dropped lines not yet said, and when a notice last went out.
struct DropNotices {
    dropped: AtomicU64,
    /// `clock_ms()` of the last notice, plus one (0: none yet).
    said_at_ms: AtomicU64,
}

impl DropNotices {
    const fn new() -> Self {
        DropNotices {
            dropped: AtomicU64::new(0),
            said_at_ms: AtomicU64::new(0),
        }
    }

    fn count(&self, lines: u64) {
        self.dropped.fetch_add(lines, Ordering::Relaxed);
    }

    /// The notice to write before the next line at `now_ms`, if one is due: lines
    /// were dropped, and none was said within `NOTICE_EVERY`. `said` takes it back
    /// from the count once it is written.
    fn due(&self, now_ms: u64) -> Option<(u64, String)> {
        let dropped = self.dropped.load(Ordering::Relaxed);
        let said = self.said_at_ms.load(Ordering::Relaxed);
        let every = NOTICE_EVERY.as_millis() as u64;
        if dropped == 0 || (said != 0 && now_ms + 1 < said + every) {
            return None;
        }
        Some((
            dropped,
            format!(
                "drover: {dropped} lines of output dropped: nothing read drover's stderr for a while\n"
            ),
        ))
    }

    fn said(&self, dropped: u64, now_ms: u64) {
        self.dropped.fetch_sub(dropped, Ordering::Relaxed);
        self.said_at_ms.store(now_ms + 1, Ordering::Relaxed);
    }
}

/// Milliseconds since the first call: the notices' clock.
fn clock_ms() -> u64 {
    static START: OnceLock<std::time::Instant> = OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_millis() as u64
}

fn spool() -> Option<&'static Spool> {
    SPOOL
        .get_or_init(|| {
            let options = Options {
                thread: "drover-stderr".into(),
                cap: STDERR_CAP,
                wake_at: 1,
                flush_every: Duration::from_millis(100),
                name: None,
            };
            Spool::start(options, Box::new(io::stderr()), None).ok()
        })
        .as_ref()
}

/// Writes `bytes` (whole lines) to drover's stderr, never waiting for its reader. When
/// lines were dropped since the last write that got through, a line says how many
/// first.
pub fn stderr_bytes(bytes: &[u8]) {
    let Some(spool) = spool() else {
        // No writer thread could be started: write as before.
        let _ = io::stderr().write_all(bytes);
        return;
    };
    let now = clock_ms();
    if let Some((dropped, notice)) = DROPS.due(now) {
        let notice = if crate::json_lines() {
            crate::message_line(notice.trim_end())
        } else {
            notice.into_bytes()
        };
        if spool.push(&notice) {
            DROPS.said(dropped, now);
        }
    }
    if !spool.push(bytes) {
        let lines = bytes.iter().filter(|&&b| b == b'\n').count().max(1) as u64;
        DROPS.count(lines);
        DROPPED_TOTAL.fetch_add(lines, Ordering::Relaxed);
    }
}

/// Lines for stderr dropped since drover started, its buffer being full (`/metrics`).
pub fn stderr_dropped_lines() -> u64 {
    DROPPED_TOTAL.load(Ordering::Relaxed)
}

/// `stderr_bytes` of one formatted line (`drover_spool::eprintln!`).
pub fn stderr_line(args: fmt::Arguments<'_>) {
    let mut line = args.to_string();
    if crate::json_lines() {
        stderr_bytes(&crate::message_line(&line));
        return;
    }
    line.push('\n');
    stderr_bytes(line.as_bytes());
}

/// Waits (up to 5 s) until what was written to stderr so far has reached it: before
/// drover exits.
pub fn flush_stderr() {
    if let Some(spool) = SPOOL.get().and_then(Option::as_ref) {
        spool.flush();
    }
}

/// `eprintln!` through drover's stderr spool: never waits for stderr's reader.
#[macro_export]
macro_rules! eprintln {
    ($($arg:tt)*) => {
        $crate::stderr_line(format_args!($($arg)*))
    };
}

/// drover's stderr as an `io::Write`, for tracing's subscriber (which writes each
/// event whole, in one call).
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        stderr_bytes(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dropped_lines_are_said_once_a_second_with_their_count() {
        let drops = DropNotices::new();
        assert!(drops.due(0).is_none(), "nothing dropped");
        drops.count(5);
        let (n, notice) = drops.due(10).unwrap();
        assert_eq!(n, 5);
        assert!(
            notice.starts_with("drover: 5 lines of output dropped"),
            "{notice}"
        );
        drops.said(n, 10);
        // More drops within the second are held back, then said together.
        drops.count(3);
        assert!(drops.due(500).is_none());
        drops.count(4);
        assert!(drops.due(1009).is_none());
        let (n, notice) = drops.due(1010).unwrap();
        assert_eq!(n, 7, "{notice}");
        drops.said(n, 1010);
        assert!(drops.due(5000).is_none(), "all said");
    }
}
