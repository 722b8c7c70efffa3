//! Worker stdout/stderr, forwarded line by line with a `[app/ID] ` prefix so users can
//! tell which worker said what (or, with `--log-format json`, as JSON objects).

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

impl LogLine<'_> {
    /// The line as a JSON object (`--log-format json`): `app`, `worker`, `stream`
    /// (`stdout` or `stderr`: the text form's one prefix does not tell them apart) and
    /// the text as `message`.
    fn push_json(&self, out: &mut Vec<u8>) {
        use drover_spool::Field;
        let stream = match self.stream {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        };
        let fields = [
            ("app", Field::Str(self.app)),
            ("worker", Field::Num(self.worker as u64)),
            ("stream", Field::Str(stream)),
        ];
        drover_spool::push_json_line(out, None, &fields, self.text);
    }
}

/// A worker's pid in a log field: the number, or `-` before it has one (the log read
/// `pid=Some(27446)`).
pub struct ShownPid(pub Option<u32>);

impl fmt::Display for ShownPid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(pid) => write!(f, "{pid}"),
            None => f.write_str("-"),
        }
    }
}

/// Where worker output goes, a batch of lines at a time (what one read of the pipe
/// brought, in order). The default writes to drover's stderr; a test can collect lines
/// instead.
pub type LineSink = Arc<dyn Fn(&[LogLine<'_>]) + Send + Sync>;

/// Writes every line to drover's stderr, both pipes alike: stdout is drover's own
/// (and may be a report), and a prefix already tells streams apart well enough.
pub fn stderr_sink() -> LineSink {
    Arc::new(|lines: &[LogLine<'_>]| {
        // A batch is formatted first and handed over whole: `writeln!` on stderr wrote
        // each formatted piece on its own (seven writes a line, measured with strace),
        // and whole lines never interleave with another worker's. Through drover's
        // stderr spool, never waiting: a stderr nobody reads blocked this thread
        // (a runtime thread) before, then every task of drover behind it.
        let json = drover_spool::json_lines();
        let per_line = if json { 100 } else { 16 };
        let size: usize = lines
            .iter()
            .map(|l| l.app.len() + l.text.len() + per_line)
            .sum();
        let mut whole = Vec::with_capacity(size);
        for line in lines {
            if json {
                line.push_json(&mut whole);
            } else {
                let _ = writeln!(whole, "{line}");
            }
        }
        drover_spool::stderr_bytes(&whole);
    })
}

/// A line longer than this is cut into pieces, so a worker that writes without a
/// newline cannot make drover buffer it all. Large enough that a JSON log line (pino's,
/// with a request body or a stack in it) stays one line, as under PM2: at 16 KiB a
/// 70 KB line came out as five pieces, each with its own prefix, interleaved with the
/// other workers' lines, and no longer parsed as JSON.
const MAX_LINE: usize = 4 * 1024 * 1024;

/// What the forwarder's line buffer keeps between lines: one long line does not hold
/// MAX_LINE per pipe for the worker's life.
const KEPT_BUFFER: usize = 64 * 1024;

/// How long the forwarder lets a worker's next lines gather in the pipe after it has
/// read all there was: one read and one write then carry what an app that logs every
/// request wrote meanwhile, where each line took a wake-up, a read and a write of
/// drover's on the cores the workers need. A line waits this long at most; the pipe
/// (64 KiB) fills only past 30 MiB/s of output.
const GATHER: std::time::Duration = std::time::Duration::from_millis(2);

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
        let mut reader = BufReader::with_capacity(64 * 1024, pipe);
        let mut buf = Vec::with_capacity(256);
        // Lines read and not yet given to the sink.
        let mut batch: Vec<String> = Vec::new();
        // The previous piece ended without a newline: this one continues a long line.
        let mut continues = false;
        loop {
            // Before a read that may wait on the pipe, the lines so far go out.
            if !batch.is_empty() && !reader.buffer().contains(&b'\n') {
                give(&sink, &app, worker, stream, &mut batch);
                if reader.buffer().is_empty() {
                    tokio::time::sleep(GATHER).await;
                }
            }
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
            batch.push(text.into_owned());
            if buf.capacity() > KEPT_BUFFER {
                buf = Vec::with_capacity(256);
            }
        }
        give(&sink, &app, worker, stream, &mut batch);
    })
}

/// Gives the lines of `batch` to `sink` as one batch, and empties it.
fn give(sink: &LineSink, app: &str, worker: usize, stream: Stream, batch: &mut Vec<String>) {
    if batch.is_empty() {
        return;
    }
    let lines: Vec<LogLine<'_>> = batch
        .iter()
        .map(|text| LogLine {
            app,
            worker,
            stream,
            text,
        })
        .collect();
    sink(&lines);
    drop(lines);
    batch.clear();
}
