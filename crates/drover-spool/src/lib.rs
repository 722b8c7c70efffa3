//! Bytes handed to a writer thread of their own: whoever pushes never waits for the
//! destination. A destination that stalls (a disk; a pipe whose reader stopped reading:
//! a terminal paused with Ctrl-S, journald or a container's log driver falling behind)
//! costs lines, never the thread that logs.
//!
//! A spool keeps at most `cap` bytes waiting; past that a push is dropped, and the
//! pusher counts it. Its writer takes what waits when woken (once `wake_at` bytes wait),
//! or every `flush_every`, and writes it; it reopens the destination when asked (after
//! logrotate renamed it) and writes out the rest when the spool is dropped.
//!
//! Two users: each access log (`drover_proxy::access_log`) and drover's own stderr
//! (`stderr`), which carries its log, its workers' output and its messages, as text or
//! as JSON lines (`json_lines`). Before the stderr spool, a stderr pipe nobody read froze
//! drover: a serving thread that logged blocked in `write(2)`, then the supervisor, the
//! admin API and every request.

mod json_lines;
mod stderr;

pub use json_lines::{json_lines, message_line, push_json_line, use_json_lines, Field};
pub use stderr::{
    flush_stderr, stderr_bytes, stderr_dropped_lines, stderr_line, Stderr, STDERR_CAP,
};

use std::io::{self, BufWriter, Write};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

/// Where a spool writes.
pub type Sink = Box<dyn Write + Send>;

/// Opens the destination anew (`Spool::reopen`).
pub type Reopen = Box<dyn FnMut() -> io::Result<Sink> + Send>;

/// How a spool holds and writes.
#[derive(Debug, Clone)]
pub struct Options {
    /// The writer thread's name.
    pub thread: String,
    /// Most bytes waiting; a push past it is dropped.
    pub cap: usize,
    /// The writer is woken once this many bytes wait (1: at every first push).
    pub wake_at: usize,
    /// The writer writes what waits at least this often.
    pub flush_every: Duration,
    /// What a warning about a failed write calls the destination (a path); `None`:
    /// the writer says nothing (drover's stderr, whose warnings would go to itself).
    pub name: Option<String>,
}

/// How long `flush` waits for the writer.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// A spool; dropping it lets its writer write what waits and end.
pub struct Spool {
    shared: Arc<Shared>,
}

/// A spool that may have been dropped: its writer may still be writing out, and a
/// `flush` waits for that (shutdown after a reload replaced an access log).
#[derive(Clone)]
pub struct WeakSpool(Weak<Shared>);

struct Shared {
    pending: Mutex<Pending>,
    /// Wakes the writer (bytes past `wake_at`, a reopen, a flush, the end).
    wake: Condvar,
    /// Tells `flush` callers that a flush they asked for is done.
    flushed: Condvar,
    cap: usize,
    wake_at: usize,
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    reopen: bool,
    /// Flushes asked for, and done: a flush is done when `done >= its ticket`.
    flush_asked: u64,
    flush_done: u64,
    /// The `Spool` was dropped: write what waits, then end.
    closed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere while holding the lock leaves nothing half-done here worth
    // refusing to log over: every update under it is a single append or flag.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Spool {
    /// Starts the writer thread on `sink`; `reopen` opens the destination anew.
    pub fn start(options: Options, sink: Sink, reopen: Option<Reopen>) -> io::Result<Spool> {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            flushed: Condvar::new(),
            cap: options.cap,
            wake_at: options.wake_at.max(1),
        });
        let writer = Arc::clone(&shared);
        std::thread::Builder::new()
            .name(options.thread.clone())
            .spawn(move || writer.write_until_closed(sink, reopen, &options))?;
        Ok(Spool { shared })
    }

    /// Hands `bytes` (whole lines) to the writer; `false` when they were dropped, the
    /// spool being full. Never waits for the writer.
    pub fn push(&self, bytes: &[u8]) -> bool {
        let mut p = lock(&self.shared.pending);
        if p.bytes.len() + bytes.len() > self.shared.cap {
            return false;
        }
        let before = p.bytes.len();
        p.bytes.extend_from_slice(bytes);
        let wake = before < self.shared.wake_at && p.bytes.len() >= self.shared.wake_at;
        drop(p);
        if wake {
            self.shared.wake.notify_one();
        }
        true
    }

    /// Asks the writer to open its destination anew, after what waits is written to
    /// the old one (as logrotate's `postrotate` expects of SIGUSR1).
    pub fn reopen(&self) {
        self.shared.reopen();
    }

    /// Waits (up to 5 s) until every byte pushed so far is written.
    pub fn flush(&self) {
        self.shared.flush();
    }

    pub fn downgrade(&self) -> WeakSpool {
        WeakSpool(Arc::downgrade(&self.shared))
    }
}

impl Drop for Spool {
    fn drop(&mut self) {
        lock(&self.shared.pending).closed = true;
        self.shared.wake.notify_one();
    }
}

impl WeakSpool {
    /// Whether its writer still runs (the spool is live, or writing out).
    pub fn is_live(&self) -> bool {
        self.0.strong_count() > 0
    }

    pub fn reopen(&self) {
        if let Some(s) = self.0.upgrade() {
            s.reopen();
        }
    }

    pub fn flush(&self) {
        if let Some(s) = self.0.upgrade() {
            s.flush();
        }
    }
}

impl Shared {
    fn reopen(&self) {
        lock(&self.pending).reopen = true;
        self.wake.notify_one();
    }

    fn flush(&self) {
        let mut p = lock(&self.pending);
        p.flush_asked += 1;
        let ticket = p.flush_asked;
        self.wake.notify_one();
        let deadline = Instant::now() + FLUSH_WAIT;
        while p.flush_done < ticket {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            p = self
                .flushed
                .wait_timeout(p, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// The writer thread: every `flush_every`, or sooner when woken, takes what waits
    /// and writes it; reopens when asked; ends once closed and written out.
    fn write_until_closed(
        self: Arc<Self>,
        sink: Sink,
        mut reopen: Option<Reopen>,
        options: &Options,
    ) {
        let warn = |what: &str, e: &io::Error| {
            if let Some(name) = &options.name {
                tracing::warn!(path = %name, "cannot {what} {name}: {e}");
            }
        };
        let mut out = BufWriter::with_capacity(64 << 10, sink);
        // Swapped with the shared buffer, so neither side allocates in steady state.
        let mut batch = Vec::new();
        loop {
            let (reopen_now, flush_ticket, closed) = {
                let mut p = lock(&self.pending);
                if p.bytes.len() < self.wake_at
                    && !p.reopen
                    && !p.closed
                    && p.flush_asked == p.flush_done
                {
                    p = self
                        .wake
                        .wait_timeout(p, options.flush_every)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
                std::mem::swap(&mut p.bytes, &mut batch);
                (std::mem::take(&mut p.reopen), p.flush_asked, p.closed)
            };
            if !batch.is_empty() {
                if let Err(e) = out.write_all(&batch) {
                    warn("write", &e);
                }
                batch.clear();
            }
            if let Err(e) = out.flush() {
                warn("write", &e);
            }
            if let (true, Some(reopen)) = (reopen_now, reopen.as_mut()) {
                match reopen() {
                    Ok(sink) => out = BufWriter::with_capacity(64 << 10, sink),
                    // Keep writing where it did: lines in a renamed file are not lost.
                    Err(e) => warn("reopen (still writing to the old file)", &e),
                }
            }
            {
                let mut p = lock(&self.pending);
                p.flush_done = p.flush_done.max(flush_ticket);
            }
            self.flushed.notify_all();
            if closed {
                // Bytes pushed after the swap above: write them too.
                let rest = std::mem::take(&mut lock(&self.pending).bytes);
                let _ = out.write_all(&rest);
                let _ = out.flush();
                // Every flush, asked now or later, finds nothing left to wait for.
                lock(&self.pending).flush_done = u64::MAX;
                self.flushed.notify_all();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    /// A sink that blocks in its first write until told to go, as a pipe nobody reads.
    pub(crate) struct Stalled {
        pub go: mpsc::Receiver<()>,
        pub started: bool,
        pub written: Arc<Mutex<Vec<u8>>>,
    }

    impl Write for Stalled {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if !self.started {
                self.started = true;
                let _ = self.go.recv();
            }
            lock(&self.written).extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_full_spool_drops_and_never_waits() {
        let (go, rx) = mpsc::channel();
        let written = Arc::new(Mutex::new(Vec::new()));
        let sink = Stalled {
            go: rx,
            started: false,
            written: Arc::clone(&written),
        };
        let options = Options {
            thread: "spool-test".into(),
            cap: 1000,
            wake_at: 1,
            flush_every: Duration::from_millis(100),
            name: None,
        };
        let spool = Spool::start(options, Box::new(sink), None).unwrap();
        let mut line = vec![b'x'; 99];
        line.push(b'\n');
        // The writer takes the first line and blocks in the stalled sink; until then
        // the spool holds 10 lines of 100 bytes, and the rest are dropped.
        assert!(spool.push(&line));
        std::thread::sleep(Duration::from_millis(200));
        let started = Instant::now();
        let kept = (0..100).filter(|_| spool.push(&line)).count();
        assert!(
            started.elapsed() < Duration::from_millis(50),
            "pushing waited"
        );
        assert_eq!(kept, 10);
        go.send(()).unwrap();
        spool.flush();
        assert_eq!(lock(&written).len(), 11 * 100);
        // Dropped, it writes out what was pushed since.
        assert!(spool.push(&line));
        let weak = spool.downgrade();
        drop(spool);
        weak.flush();
        assert_eq!(lock(&written).len(), 12 * 100);
    }
}
