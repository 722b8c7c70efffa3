//! Worker stdout/stderr, forwarded line by line with a `[app/ID] ` prefix so users can
//! tell which worker said what.

use crate::forensics::StderrTail;
use std::fmt;
use std::io::Write;
use std::sync::Arc;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, BufReader};

/// Which of the worker's pipes a line came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One line of worker output, without its newline. `Display` gives `[app/ID] text`.
#[derive(Debug, Clone, Copy)]
pub struct LogLine<'a> {
    pub app: &'a str,
    pub worker: usize,
    pub stream: Stream,
    pub text: &'a str,
}

impl fmt::Display for LogLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}/{}] {}", self.app, self.worker, self.text)
    }
}

/// Where worker output goes. The default writes to drover's stderr; the admin API or a
/// test can collect lines instead.
pub type LineSink = Arc<dyn Fn(LogLine<'_>) + Send + Sync>;

/// Writes every line to drover's stderr, both pipes alike: stdout is drover's own
/// (and may be a report), and a prefix already tells streams apart well enough.
pub fn stderr_sink() -> LineSink {
    Arc::new(|line: LogLine<'_>| {
        // One locked write per line so lines from different workers never interleave.
        // A full stderr pipe blocks this thread briefly; losing output would be worse.
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    })
}

/// A line longer than this is cut into pieces, so a worker that writes megabytes
/// without a newline cannot make drover buffer it all.
const MAX_LINE: usize = 16 * 1024;

/// Forwards `pipe` to `sink` until EOF, keeping a copy of each line in `tail` when
/// given (stderr, for the restart record). Runs as its own task: it ends when every
/// holder of the pipe's write end (the worker and any children it forked) has exited;
/// awaiting the handle tells when the tail holds everything the process wrote.
pub(crate) fn forward(
    pipe: impl AsyncRead + Unpin + Send + 'static,
    app: Arc<str>,
    worker: usize,
    stream: Stream,
    sink: LineSink,
    tail: Option<Arc<StderrTail>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = BufReader::new(pipe);
        let mut buf = Vec::with_capacity(256);
        // The previous piece ended without a newline: this one continues a long line.
        let mut continues = false;
        loop {
            buf.clear();
            // Read at most MAX_LINE bytes; a longer line comes out in several pieces.
            let limit = MAX_LINE as u64;
            let n = match (&mut reader).take(limit).read_until(b'\n', &mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let mut line = &buf[..n];
            let whole = match line.strip_suffix(b"\n") {
                Some(rest) => {
                    line = rest.strip_suffix(b"\r").unwrap_or(rest);
                    true
                }
                None => false,
            };
            // Workers may print anything; show bad UTF-8 rather than drop the line.
            let text = String::from_utf8_lossy(line);
            // The tail keeps only the first piece of a long line (cut and marked), so
            // one huge line cannot push every earlier line out of it.
            if let (Some(tail), false) = (&tail, continues) {
                tail.push(&text, !whole && n as u64 == limit);
            }
            continues = !whole;
            sink(LogLine {
                app: &app,
                worker,
                stream,
                text: &text,
            });
        }
    })
}
