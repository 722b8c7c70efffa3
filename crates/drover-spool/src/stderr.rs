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

/// Lines dropped and not yet reported.
static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Lines dropped since drover started (`stderr_dropped_lines`).
static DROPPED_TOTAL: AtomicU64 = AtomicU64::new(0);

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
    let dropped = DROPPED.load(Ordering::Relaxed);
    if dropped > 0 {
        let notice = format!(
            "drover: {dropped} lines of output dropped: nothing read drover's stderr for a while\n"
        );
        if spool.push(notice.as_bytes()) {
            DROPPED.fetch_sub(dropped, Ordering::Relaxed);
        }
    }
    if !spool.push(bytes) {
        let lines = bytes.iter().filter(|&&b| b == b'\n').count().max(1) as u64;
        DROPPED.fetch_add(lines, Ordering::Relaxed);
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
